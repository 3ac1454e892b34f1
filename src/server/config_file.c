/* config_file.c: djinnd's --config FILE (INI through libinih) read into
 * NAME = VALUE entries that options.c's table interprets, and the check that
 * the model store holds a model before the daemon serves it. */
#define _GNU_SOURCE
#include "server/config_file.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <ini.h>

#include "djinn/alloc.h"

/* A config file bigger than this is not a config file. */
#define CONF_MAX_LINES 100000

typedef struct reader {
    FILE *f;
    int line;       /* lines read so far: the one the handler is called for */
    bool too_long;  /* a line did not fit inih's buffer */
    dj__conf *c;
    dj_status st;   /* the handler's first failure */
    char msg[256];
} reader;

/* fgets that counts lines, for the handler's messages. */
static char *read_line(char *buf, int size, void *stream) {
    reader *r = stream;
    char *p = fgets(buf, size, r->f);
    if (!p) return NULL;
    const size_t n = strlen(p);
    if (n && p[n - 1] == '\n') r->line++;
    else if (!feof(r->f)) r->too_long = true;
    else r->line++;
    return p;
}

static bool name_ok(const char *n) {
    if (!*n) return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-')) return false;
    return true;
}

static int on_entry(void *user, const char *section, const char *name, const char *value) {
    reader *r = user;
    if (r->st != DJ_OK) return 0;
    if (section[0] && strcmp(section, "djinnd")) {
        r->st = DJ_EINVAL;
        snprintf(r->msg, sizeof r->msg, "line %d: section [%.64s] (want [djinnd] or none)", r->line, section);
        return 0;
    }
    if (!name || !name_ok(name)) {
        r->st = DJ_EINVAL;
        snprintf(r->msg, sizeof r->msg, "line %d: '%.64s' is not an option name (djinnd --help lists them, without '--')",
                 r->line, name ? name : "");
        return 0;
    }
    if (!value) value = "";
    dj__conf *c = r->c;
    if (c->n == c->cap) {
        const size_t cap = c->cap ? 2 * c->cap : 16;
        dj__conf_entry *e = dj_realloc(c->e, cap * sizeof *e);
        if (!e) goto oom;
        c->e = e;
        c->cap = cap;
    }
    dj__conf_entry *e = &c->e[c->n];
    e->name = strdup(name);
    e->value = strdup(value);
    e->line = r->line;
    if (!e->name || !e->value) {
        free(e->name);
        free(e->value);
        goto oom;
    }
    c->n++;
    return 1;
oom:
    r->st = DJ_ENOMEM;
    snprintf(r->msg, sizeof r->msg, "out of memory");
    return 0;
}

dj_status dj__conf_read(const char *path, dj__conf *out) {
    memset(out, 0, sizeof *out);
    reader r = {.c = out};
    r.f = fopen(path, "r");
    if (!r.f) return dj_fail(DJ_EIO, "--config %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(r.f), &sb) == 0 && !S_ISREG(sb.st_mode)) {
        fclose(r.f);
        return dj_fail(DJ_EINVAL, "--config %s: not a regular file", path);
    }
    const int bad = ini_parse_stream(read_line, &r, on_entry, &r);
    const bool read_err = ferror(r.f) != 0;
    fclose(r.f);
    dj_status st = DJ_OK;
    if (r.st != DJ_OK)
        st = dj_fail(r.st, "--config %s %s", path, r.msg);
    else if (r.too_long)
        st = dj_fail(DJ_EINVAL, "--config %s line %d: longer than the %d bytes a line may have", path, r.line + 1,
                     INI_MAX_LINE);
    else if (read_err)
        st = dj_fail(DJ_EIO, "--config %s: read error", path);
    else if (bad > 0)
        st = dj_fail(DJ_EINVAL, "--config %s line %d: not NAME = VALUE, a comment or [djinnd]", path, bad);
    else if (bad < 0)
        st = dj_fail(DJ_EIO, "--config %s: cannot be read", path);
    else if (r.line > CONF_MAX_LINES)
        st = dj_fail(DJ_EINVAL, "--config %s: more than %d lines", path, CONF_MAX_LINES);
    if (st != DJ_OK) dj__conf_free(out);
    return st;
}

void dj__conf_free(dj__conf *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->e[i].name);
        free(c->e[i].value);
    }
    free(c->e);
    memset(c, 0, sizeof *c);
}

dj_status dj__models_check(const char *dir, bool allow_empty) {
    DIR *d = opendir(dir);
    if (!d) return dj_fail(DJ_ENOTFOUND, "--models %s: %s (the model store: one folder per model)", dir, strerror(errno));
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[PATH_MAX];
        struct stat sb;
        if (snprintf(path, sizeof path, "%s/%s/config.json", dir, de->d_name) >= (int)sizeof path) continue;
        n += stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
    }
    closedir(d);
    if (n) return DJ_OK;
    if (!allow_empty)
        return dj_fail(DJ_ENOTFOUND, "--models %s holds no model (a folder with config.json); --allow-empty starts anyway", dir);
    DJ_LOG(WARN, "--models %s holds no model (a folder with config.json): serving an empty store (--allow-empty)", dir);
    return DJ_OK;
}
