/* load_progress.c: model loads made visible - progress lines while the
 * weights are read, the loads in flight for STATS and /health, --preload. */
#define _GNU_SOURCE
#include "server/load_progress.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/switches.h"
#include "djinn/checkpoint.h"
#include "djinn/version.h"
#include "proto/proto_impl.h"

/* Seconds between two progress lines of one load. */
#define LINE_EVERY_S 0.5

typedef struct slot {
    bool used;
    bool shown;          /* a first byte was read: listed, and a last line logged */
    char name[128];
    uint64_t done, total; /* done: atomic (the reading threads) */
    double t0, last_line; /* monotonic seconds; last_line under L.mu */
    const char *hold;     /* $DJINN_TEST_LOAD_HOLD (tests), read when the load began */
} slot;

static struct {
    pthread_mutex_t mu;
    slot s[DJ__LOADS_MAX];
} L = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double gb(uint64_t b) { return (double)b / 1e9; }

static void on_progress(void *user, uint64_t done, uint64_t total) {
    slot *sl = user;
    const double t = now_s();
    bool line = false;
    pthread_mutex_lock(&L.mu);
    if (done > sl->done) sl->done = done;
    sl->total = total;
    sl->shown = true;
    if (t - sl->last_line >= LINE_EVERY_S && done < total) {
        sl->last_line = t;
        line = true;
    }
    pthread_mutex_unlock(&L.mu);
    if (line) {
        const double el = t - sl->t0;
        dj__log_always(DJ_LOG_INFO, __func__, "model %s: loading %.2f of %.2f GB (%.0f%%), %.2f GB/s", sl->name,
                       gb(done), gb(total), total ? 100.0 * (double)done / (double)total : 0.0,
                       el > 0 ? gb(done) / el : 0.0);
    }
    /* tests: the load stays in flight (listed, its first bytes read) until the file exists */
    struct stat sb;
    while (sl->hold && stat(sl->hold, &sb) != 0) usleep(10000);
}

static slot *claim(const char *name, const char *hold) {
    slot *sl = NULL;
    pthread_mutex_lock(&L.mu);
    for (int i = 0; i < DJ__LOADS_MAX && !sl; i++)
        if (!L.s[i].used) sl = &L.s[i];
    if (sl) {
        memset(sl, 0, sizeof *sl);
        sl->used = true;
        snprintf(sl->name, sizeof sl->name, "%s", name);
        sl->t0 = sl->last_line = now_s();
        sl->hold = hold;
    }
    pthread_mutex_unlock(&L.mu);
    return sl;
}

static void unclaim(slot *sl) {
    pthread_mutex_lock(&L.mu);
    sl->used = sl->shown = false;
    pthread_mutex_unlock(&L.mu);
}

dj_status dj__load_model(dj_engine_t *e, const char *dir, const char *name, dj_model_t **out) {
    *out = NULL;
    dj_checkpoint_t *ck = NULL;
    dj_status st = dj_checkpoint_open(dir, &ck);
    if (st != DJ_OK) return st;
    slot *sl = claim(name, dj_switch_read_str(DJ_SW_TEST_LOAD_HOLD));
    if (sl) dj_checkpoint_set_progress(ck, on_progress, sl); /* no free slot: loaded unseen, as before */
    st = dj_model_load_checkpoint(e, ck, name, out);
    dj_checkpoint_set_progress(ck, NULL, NULL); /* the model may keep ck (in place, streamed): the slot is not its */
    dj_checkpoint_close(ck);
    if (!sl) return st;
    pthread_mutex_lock(&L.mu);
    const bool shown = sl->shown;
    const uint64_t done = sl->done;
    const double el = now_s() - sl->t0;
    pthread_mutex_unlock(&L.mu);
    if (shown && st == DJ_OK)
        dj__log_always(DJ_LOG_INFO, __func__, "model %s: loaded, %.2f GB read in %.2f s (%.2f GB/s)", name, gb(done),
                       el, el > 0 ? gb(done) / el : 0.0);
    else if (shown)
        dj__log_always(DJ_LOG_WARN, __func__, "model %s: load failed after %.2f GB in %.2f s: %s", name, gb(done), el,
                       dj_last_error());
    unclaim(sl);
    return st;
}

size_t dj__load_snapshot(dj__load_view *out, size_t cap) {
    size_t n = 0;
    const double t = now_s();
    pthread_mutex_lock(&L.mu);
    for (int i = 0; i < DJ__LOADS_MAX; i++) {
        const slot *sl = &L.s[i];
        if (!sl->used || !sl->shown) continue;
        if (n < cap) {
            dj__load_view *v = &out[n];
            snprintf(v->name, sizeof v->name, "%s", sl->name);
            v->done = sl->done;
            v->total = sl->total;
            v->elapsed_s = t - sl->t0;
        }
        n++;
    }
    pthread_mutex_unlock(&L.mu);
    return n;
}

void dj__load_pack(dj__mw *w) {
    dj__load_view v[DJ__LOADS_MAX];
    size_t n = dj__load_snapshot(v, DJ__LOADS_MAX);
    if (n > DJ__LOADS_MAX) n = DJ__LOADS_MAX;
    msgpack_pack_array(&w->pk, (uint32_t)n);
    for (size_t i = 0; i < n; i++) {
        msgpack_pack_map(&w->pk, 4);
        dj__pack_str(&w->pk, "name");
        dj__pack_str(&w->pk, v[i].name);
        dj__pack_str(&w->pk, "bytes_done");
        msgpack_pack_uint64(&w->pk, v[i].done);
        dj__pack_str(&w->pk, "bytes_total");
        msgpack_pack_uint64(&w->pk, v[i].total);
        dj__pack_str(&w->pk, "elapsed_s");
        msgpack_pack_double(&w->pk, v[i].elapsed_s);
    }
}

void dj__load_pack_stats(dj__mw *w, bool admin, uint64_t page_bytes, uint64_t handles, uint64_t connections) {
    dj__mw_str(w, "scope", admin ? "all" : "own");
    dj__mw_str(w, "version", DJ_VERSION_STRING);
    dj__mw_str(w, "busy", "loading");
    dj__mw_u64(w, "page_bytes", page_bytes);
    dj__mw_key(w, "models"); /* the fields every reply has, empty: clients read them */
    msgpack_pack_array(&w->pk, 0);
    dj__mw_key(w, "sessions");
    msgpack_pack_array(&w->pk, 0);
    if (admin) {
        dj__mw_key(w, "loading");
        dj__load_pack(w);
        dj__mw_u64(w, "handles", handles);
        dj__mw_u64(w, "connections", connections);
    } else {
        dj__mw_u64(w, "loading_models", dj__load_snapshot(NULL, 0));
    }
}

bool dj__preload_next(const char **p, char *out, size_t cap, dj_status *st) {
    *st = DJ_OK;
    if (!*p || !**p) return false;
    const char *comma = strchr(*p, ',');
    const size_t n = comma ? (size_t)(comma - *p) : strlen(*p);
    if (n == 0 || n >= cap) {
        *st = dj_fail(DJ_EINVAL, "--preload '%s': %s", *p, n ? "a name too long" : "an empty name");
        return false;
    }
    memcpy(out, *p, n);
    out[n] = '\0';
    *p += n + (comma != NULL);
    if (comma && !**p) {
        *st = dj_fail(DJ_EINVAL, "--preload: an empty name after the last ','");
        return false;
    }
    return true;
}

dj_status dj__preload_check(const char *models_dir, const char *list) {
    char name[128];
    dj_status st = DJ_OK;
    for (const char *p = list; dj__preload_next(&p, name, sizeof name, &st);) {
        char path[PATH_MAX];
        struct stat sb;
        const bool bad = strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..");
        snprintf(path, sizeof path, "%s/%s/config.json", models_dir ? models_dir : ".", name);
        if (bad || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            return dj_fail(DJ_ENOTFOUND, "--preload %s: no model '%s' in the store %s (no %s)", list, name,
                           models_dir ? models_dir : "(none)", bad ? "such folder name" : "config.json there");
    }
    return st;
}
