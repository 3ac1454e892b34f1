/* config_file.h: djinnd's --config FILE, an INI file read through libinih
 * into NAME = VALUE entries for the option table (options.c), and the model
 * store's check at start (a missing or empty store is an error). */
#ifndef DJ_CONFIG_FILE_H
#define DJ_CONFIG_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include "djinn/status.h"

typedef struct dj__conf_entry {
    char *name;  /* the option's name without "--" (owned) */
    char *value; /* (owned) */
    int line;    /* 1-based line in the file */
} dj__conf_entry;

typedef struct dj__conf {
    dj__conf_entry *e; /* [n] in the file's order */
    size_t n, cap;
} dj__conf;

/* Reads path: blank lines, comments ('#' or ';' first), an optional
 * [djinnd] section header and NAME = VALUE lines (NAME: lower-case letters,
 * digits and '-'). Any other line, or another section, fails with
 * DJ_EINVAL naming the file and the line. *out is zeroed first and holds
 * nothing on failure; dj__conf_free frees it. */
dj_status dj__conf_read(const char *path, dj__conf *out /* OUT */);
void dj__conf_free(dj__conf *c);

/* The model store at start: a missing directory is an error; one without a
 * model folder (one holding config.json) is an error unless allow_empty,
 * which logs a warning instead. */
dj_status dj__models_check(const char *dir, bool allow_empty);

#endif
