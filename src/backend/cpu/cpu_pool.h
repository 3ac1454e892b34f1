/* cpu_pool.h: the CPU backend's threads - one persistent pool, tasks handed
 * out one at a time from a counter, so an op ends when its last task is done,
 * not when every thread has passed a barrier: a worker the OS has not
 * scheduled yet (a shared machine) finds the tasks taken and holds nobody up.
 *
 * Ownership: dj__cpu_pool_new makes n_threads - 1 worker threads (the caller
 * of dj__cpu_pool_run is thread 0); dj__cpu_pool_free joins them. One caller
 * at a time runs work on a pool (the backend's compute thread). Workers spin
 * briefly for the next op, then sleep on a futex. */
#ifndef DJ_CPU_POOL_H
#define DJ_CPU_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"

typedef struct dj_cpu_pool dj_cpu_pool;

/* fn(ctx, task, thread): thread in [0, n_threads) is unique among the
 * threads running tasks of this call (an index for per-thread scratch). */
typedef void (*dj_cpu_task_fn)(void *ctx, uint32_t task, int thread);

/* n_threads >= 1 (1: no workers, every task on the caller). */
dj_status dj__cpu_pool_new(int n_threads, dj_cpu_pool **out /* OUT, owned */);
void dj__cpu_pool_free(dj_cpu_pool *p);
int dj__cpu_pool_threads(const dj_cpu_pool *p);
/* Tasks 0 .. n_tasks - 1, each exactly once, on the caller and whichever
 * workers come; returns when all are done (their writes visible). */
void dj__cpu_pool_run(dj_cpu_pool *p, uint32_t n_tasks, dj_cpu_task_fn fn, void *ctx);

/* body(ctx, lo, hi, thread) over [0, n) in pieces of grain (>= 1) items: a
 * loop no longer than grain runs on the caller alone. */
typedef void (*dj_cpu_range_fn)(void *ctx, size_t lo, size_t hi, int thread);
void dj__cpu_pool_for(dj_cpu_pool *p, size_t n, size_t grain, dj_cpu_range_fn body, void *ctx);

#endif
