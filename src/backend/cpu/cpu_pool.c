/* cpu_pool.c: the CPU backend's persistent thread pool (cpu_pool.h) - a
 * ticket of (generation << 32 | next task) claimed by compare-and-swap, a
 * done counter the caller waits on, a futex for idle workers. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#include "backend/cpu/cpu_pool.h"

/* Pauses a worker spins for the next op before it sleeps (some hundred
 * microseconds: the gaps between a step's ops are far shorter). */
#define IDLE_SPINS (1u << 14)
/* Pauses the caller spins on the last tasks before it yields its core. */
#define WAIT_SPINS (1u << 12)

struct dj_cpu_pool {
    int n_threads;
    pthread_t *workers;            /* [n_threads - 1] */
    _Atomic(dj_cpu_task_fn) fn;    /* the current op (valid for a claimed task of its generation) */
    _Atomic(void *) ctx;
    _Atomic uint32_t n_tasks;
    _Atomic uint64_t ticket;       /* generation << 32 | the next unclaimed task */
    _Atomic uint32_t done;         /* tasks of this generation finished */
    _Atomic uint32_t seq;          /* the generation, as the futex word */
    _Atomic uint32_t sleepers;     /* workers in (or entering) futex wait */
    _Atomic int stop;
};

static void futex_wait(_Atomic uint32_t *w, uint32_t val) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w) {
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Claims and runs tasks of generation gen until none is left. */
static void work(dj_cpu_pool *p, uint32_t gen, int thread) {
    for (;;) {
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        if ((uint32_t)(t >> 32) != gen) return;
        if ((uint32_t)t >= atomic_load_explicit(&p->n_tasks, memory_order_acquire)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_relaxed))
            continue;
        /* a claimed task keeps its generation current: fn and ctx are its own */
        atomic_load_explicit(&p->fn, memory_order_relaxed)(atomic_load_explicit(&p->ctx, memory_order_relaxed),
                                                           (uint32_t)t, thread);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

typedef struct worker_arg {
    dj_cpu_pool *p;
    int thread;
} worker_arg;

static void *worker_main(void *arg) {
    dj_cpu_pool *p = ((worker_arg *)arg)->p;
    const int thread = ((worker_arg *)arg)->thread;
    free(arg);
    uint32_t seen = 0;
    for (;;) {
        uint32_t s = atomic_load_explicit(&p->seq, memory_order_acquire);
        for (uint32_t i = 0; s == seen && i < IDLE_SPINS; i++) {
            cpu_relax();
            s = atomic_load_explicit(&p->seq, memory_order_acquire);
        }
        while (s == seen && !atomic_load(&p->stop)) {
            atomic_fetch_add(&p->sleepers, 1);
            if (atomic_load(&p->seq) == seen && !atomic_load(&p->stop)) futex_wait(&p->seq, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            s = atomic_load(&p->seq);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = s;
        work(p, s, thread);
    }
}

dj_status dj__cpu_pool_new(int n_threads, dj_cpu_pool **out) {
    *out = NULL;
    if (n_threads < 1 || n_threads > 4096)
        return dj_fail(DJ_EINVAL, "cpu pool: %d threads (1 to 4096)", n_threads);
    dj_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return dj_fail(DJ_ENOMEM, "cpu pool: out of memory");
    p->n_threads = n_threads;
    if (n_threads > 1 && !(p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers))) {
        free(p);
        return dj_fail(DJ_ENOMEM, "cpu pool: out of memory for %d threads", n_threads);
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        int rc = a ? 0 : ENOMEM;
        if (a) {
            *a = (worker_arg){p, i};
            rc = pthread_create(&p->workers[i - 1], NULL, worker_main, a);
            if (rc) free(a);
        }
        if (rc) {
            p->n_threads = i; /* the ones started */
            dj__cpu_pool_free(p);
            return dj_fail(DJ_ENOMEM, "cpu pool: cannot start thread %d of %d (error %d)", i, n_threads, rc);
        }
    }
    *out = p;
    return DJ_OK;
}

void dj__cpu_pool_free(dj_cpu_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->seq, 1);
    futex_wake_all(&p->seq);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->workers[i - 1], NULL);
    free(p->workers);
    free(p);
}

int dj__cpu_pool_threads(const dj_cpu_pool *p) { return p->n_threads; }

void dj__cpu_pool_run(dj_cpu_pool *p, uint32_t n_tasks, dj_cpu_task_fn fn, void *ctx) {
    if (n_tasks == 0) return;
    if (p->n_threads == 1 || n_tasks == 1) { /* no hand-over pays for one task */
        for (uint32_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        return;
    }
    /* The previous generation is done (every claimed task finished), but a
     * worker may still be in work()'s claim loop holding an old ticket. The
     * ticket moves to the new generation first, with no task claimable: a
     * worker that then reads the new n_tasks (release/acquire below) fails
     * its compare-and-swap of the old ticket, so it can neither run a task
     * index the old op never had (with this op's fn, or the old one's dead
     * ctx) nor count one in this op's done. */
    const uint32_t gen = atomic_load_explicit(&p->seq, memory_order_relaxed) + 1;
    atomic_store_explicit(&p->ticket, (uint64_t)gen << 32 | UINT32_MAX, memory_order_seq_cst);
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->n_tasks, n_tasks, memory_order_release);
    atomic_store_explicit(&p->ticket, (uint64_t)gen << 32, memory_order_release);
    atomic_store(&p->seq, gen);
    if (atomic_load(&p->sleepers)) futex_wake_all(&p->seq);
    work(p, gen, 0);
    for (uint32_t i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
        if (i < WAIT_SPINS) cpu_relax();
        else sched_yield();
    }
}

typedef struct range_job {
    dj_cpu_range_fn body;
    void *ctx;
    size_t n, grain;
} range_job;

static void range_task(void *ctx, uint32_t task, int thread) {
    const range_job *j = ctx;
    const size_t lo = (size_t)task * j->grain, hi = j->n - lo < j->grain ? j->n : lo + j->grain;
    j->body(j->ctx, lo, hi, thread);
}

void dj__cpu_pool_for(dj_cpu_pool *p, size_t n, size_t grain, dj_cpu_range_fn body, void *ctx) {
    if (n == 0) return;
    if (grain < 1) grain = 1;
    if (n <= grain) {
        body(ctx, 0, n, 0);
        return;
    }
    if ((n + grain - 1) / grain > UINT32_MAX) grain = (n + UINT32_MAX - 1) / UINT32_MAX;
    range_job j = {body, ctx, n, grain};
    dj__cpu_pool_run(p, (uint32_t)((n + grain - 1) / grain), range_task, &j);
}
