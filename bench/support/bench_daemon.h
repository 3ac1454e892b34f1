/* bench_daemon.h: what bench_serve and bench_remote share - djinnd on a thread
 * of this process, and the embedded engine in a child process to compare it with. */
#ifndef DJ_BENCH_DAEMON_H
#define DJ_BENCH_DAEMON_H

#include <pthread.h>
#include <stddef.h>

#include "djinn/engine.h"

/* The CPU engine threads djinnd uses: one fewer than the cores, at least 1. */
int dj_bench_threads(void);

/* djinnd's main on a thread: djinnd --listen 127.0.0.1:0 --port-file TMP ARGS... */
typedef struct dj_bench_daemon {
    pthread_t thread;
    char port_file[64];
    char *argv[40]; /* [argc + 1] */
    int argc;
    char addr[64]; /* where it listens, once started */
} dj_bench_daemon;

/* Starts it with args (NULL-terminated, at most 34; they must outlive it) and
 * waits at most wait_ms for its port. Returns 0 with d->addr set, or -1 (the
 * thread, if started, is left running). */
int dj_bench_daemon_start(dj_bench_daemon *d, const char *const *args, int wait_ms);
/* SIGTERM to this process (the daemon's signal watcher stops it), then joins. */
void dj_bench_daemon_stop(dj_bench_daemon *d);

/* The embedded side runs in a child process: its OpenMP thread pool must not
 * outlive it into the daemon's measurement (libgomp throttles spinning once a
 * process holds more threads than cores). fn gets an engine (vmu_bytes on
 * device, threads threads) with the model at dir loaded, and fills out[n_out]
 * (returning 0) or prints why it failed (returning non-zero). */
typedef int (*dj_bench_embedded_fn)(dj_engine_t *e, dj_model_t *m, void *arg, double *out);

/* Runs fn so; out[n_out] (at most 16) gets what it filled. Returns 0, or -1
 * when the child failed. who names the program in error lines. */
int dj_bench_embedded(const char *who, const char *dir, const char *device, size_t vmu_bytes, int threads,
                      dj_bench_embedded_fn fn, void *arg, double *out /* OUT */, size_t n_out);

#endif
