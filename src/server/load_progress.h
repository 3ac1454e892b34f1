/* load_progress.h: model loads made visible - progress log lines, the loads
 * in flight for STATS and /health, and --preload's list of names. */
#ifndef DJ_SERVER_LOAD_PROGRESS_H
#define DJ_SERVER_LOAD_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/engine.h"
#include "djinn/status.h"

struct dj__mw;

/* Loads that may be in flight at once (the worker loads one at a time;
 * the rest is room for --preload's and tests' own engines). */
#define DJ__LOADS_MAX 8

/* One load in flight, as any thread sees it. */
typedef struct dj__load_view {
    char name[128];
    uint64_t done, total; /* weight bytes read (hashed, copied) of the checkpoint's */
    double elapsed_s;     /* since the load began */
} dj__load_view;

/* dj_model_load(e, dir) with its progress shown: while it reads weight bytes
 * it is listed by dj__load_snapshot and logs "model NAME: loading ..." (at
 * most every 0.5 s) and a last line with the bytes, the time and GB/s. A
 * model already resident (no byte read) logs nothing and is never listed.
 * name: what the lines and the list call it (the store's folder name). */
dj_status dj__load_model(dj_engine_t *e, const char *dir, const char *name, dj_model_t **out /* OUT */);

/* The loads in flight now (any thread): at most cap into out; returns how
 * many there are (which may exceed cap). */
size_t dj__load_snapshot(dj__load_view *out, size_t cap);

/* STATS' "loading" value: an array of {name, bytes_done, bytes_total,
 * elapsed_s} maps (w's next value after a key). */
void dj__load_pack(struct dj__mw *w);

/* STATS answered by the I/O thread while the worker loads a model (it can
 * answer nothing then): scope and version, "busy": "loading", the loads, and
 * the I/O side's counts. Only an admin sees the loads' names. */
void dj__load_pack_stats(struct dj__mw *w, bool admin, uint64_t page_bytes, uint64_t handles, uint64_t connections);

/* --preload's value NAME[,NAME...]: the next name into out[cap] from *p,
 * advancing *p; false at the end. A name longer than cap-1, or empty
 * between commas, is an error (DJ_EINVAL) reported through *st. */
bool dj__preload_next(const char **p, char *out, size_t cap, dj_status *st /* OUT */);

/* Every --preload name is a model folder of the store (DJ_ENOTFOUND naming
 * the first that is not; DJ_EINVAL for a malformed list). */
dj_status dj__preload_check(const char *models_dir, const char *list);

#endif
