/* cpu_ring.c: weight streaming on the CPU backend - host memory plays the
 * device, a copy thread per ring plays the copy engine, and per-load counters
 * play the ready/done events, so the ring code runs (and is tested) here the
 * way it runs on a GPU. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/cpu/cpu_impl.h"

/* One load's copies, issued: they wait until load after[i] has been consumed
 * need[i] times (every reader of the bytes they overwrite has finished). */
typedef struct ring_job {
    uint32_t k;
    const dj_stream_load *load; /* its spans and after list: the model's, valid until ring_free */
    uint64_t *need;             /* [load->n_after]; owned */
    struct ring_job *next;
} ring_job;

struct dj_backend_ring {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* any counter moved, a job arrived, or stop */
    uint32_t n;
    uint64_t *issued;           /* [n] copies of load k issued */
    uint64_t *copied;           /* [n] copies of load k landed (ready) */
    uint64_t *consumed;         /* [n] done marks of load k */
    ring_job *head, *tail;      /* issued, not yet copied, in order */
    bool stop;
};

static bool job_may_start(const dj_backend_ring_t *r, const ring_job *j) {
    for (uint32_t i = 0; i < j->load->n_after; i++)
        if (r->consumed[j->load->after[i]] < j->need[i]) return false;
    return true;
}

/* Test hook: before each copy the thread yields a pseudo-random 0..max
 * times, so copies land late and in varied interleavings with compute. */
static unsigned jitter_max;
static uint64_t jitter_state;

void dj__cpu_ring_jitter(unsigned max_yields, uint64_t seed) {
    jitter_max = max_yields;
    jitter_state = seed | 1;
}

static void jitter(void) {
    if (!jitter_max) return;
    uint64_t x = __atomic_load_n(&jitter_state, __ATOMIC_RELAXED);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    __atomic_store_n(&jitter_state, x, __ATOMIC_RELAXED);
    for (unsigned i = (unsigned)(x % (jitter_max + 1)); i > 0; i--) sched_yield();
}

static void *copy_thread(void *arg) {
    dj_backend_ring_t *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && !(r->head && job_may_start(r, r->head))) pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop) break;
        ring_job *j = r->head;
        pthread_mutex_unlock(&r->mu);
        jitter();
        for (uint32_t s = 0; s < j->load->n_spans; s++) {
            const dj_copy_span *sp = &j->load->spans[s];
            const uint32_t rows = sp->rows > 1 ? sp->rows : 1;
            for (uint32_t r = 0; r < rows; r++)
                memcpy((char *)sp->dev + (size_t)r * sp->bytes, (const char *)sp->host + (size_t)r * sp->host_pitch,
                       sp->bytes);
        }
        pthread_mutex_lock(&r->mu);
        r->head = j->next;
        if (!r->head) r->tail = NULL;
        r->copied[j->k]++;
        free(j->need);
        free(j);
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void ring_release(dj_backend_ring_t *r) {
    for (ring_job *j = r->head, *nx; j; j = nx) {
        nx = j->next;
        free(j->need);
        free(j);
    }
    free(r->issued);
    free(r->copied);
    free(r->consumed);
    free(r);
}

dj_status dj__cpu_ring_new(dj_backend_t *be, uint32_t n_loads, dj_backend_ring_t **out) {
    (void)be;
    *out = NULL;
    if (n_loads == 0) return dj_fail(DJ_EINVAL, "cpu ring: no loads");
    dj_backend_ring_t *r = calloc(1, sizeof *r);
    if (!r) return dj_fail(DJ_ENOMEM, "cpu ring: out of memory");
    r->n = n_loads;
    r->issued = calloc(n_loads, sizeof *r->issued);
    r->copied = calloc(n_loads, sizeof *r->copied);
    r->consumed = calloc(n_loads, sizeof *r->consumed);
    if (!r->issued || !r->copied || !r->consumed) {
        ring_release(r);
        return dj_fail(DJ_ENOMEM, "cpu ring: out of memory for %u loads", n_loads);
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->thread, NULL, copy_thread, r) != 0) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        ring_release(r);
        return dj_fail(DJ_ENOMEM, "cpu ring: cannot start its copy thread");
    }
    *out = r;
    return DJ_OK;
}

void dj__cpu_ring_free(dj_backend_t *be, dj_backend_ring_t *r) {
    (void)be;
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    /* copies that may still start finish first; one waiting for a reader that never comes is dropped */
    while (r->head && job_may_start(r, r->head)) pthread_cond_wait(&r->cv, &r->mu);
    r->stop = true;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    ring_release(r);
}

typedef struct cpu_stream {
    dj_backend_ring_t *r;
    const dj_stream_step *ss;
} cpu_stream;

static dj_status cpu_copy(void *u, uint32_t k, bool serial) {
    (void)serial; /* compute is synchronous here: all compute issued so far has finished */
    const cpu_stream *cs = u;
    dj_backend_ring_t *r = cs->r;
    const dj_stream_load *L = &cs->ss->loads[k];
    ring_job *j = calloc(1, sizeof *j);
    uint64_t *need = calloc(L->n_after ? L->n_after : 1, sizeof *need);
    if (!j || !need) {
        free(j);
        free(need);
        return dj_fail(DJ_ENOMEM, "cpu ring: out of memory for a copy");
    }
    j->k = k;
    j->load = L;
    j->need = need;
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = 0; i < L->n_after; i++) need[i] = r->issued[L->after[i]];
    r->issued[k]++;
    if (r->tail) r->tail->next = j;
    else r->head = j;
    r->tail = j;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return DJ_OK;
}

static dj_status cpu_wait_ready(void *u, uint32_t k) {
    dj_backend_ring_t *r = ((const cpu_stream *)u)->r;
    pthread_mutex_lock(&r->mu);
    while (r->copied[k] < r->issued[k]) pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return DJ_OK;
}

static dj_status cpu_mark_done(void *u, uint32_t k) {
    dj_backend_ring_t *r = ((const cpu_stream *)u)->r;
    pthread_mutex_lock(&r->mu);
    r->consumed[k]++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return DJ_OK;
}

dj_status dj__cpu_compute_streamed(dj_backend_t *be, const dj_op_call *calls, size_t n, const dj_stream_step *ss) {
    if (ss->ring->n != ss->n_loads)
        return dj_fail(DJ_EINVAL, "cpu ring: a step of %u loads on a ring of %u", ss->n_loads, ss->ring->n);
    cpu_stream cs = {.r = ss->ring, .ss = ss};
    const dj_stream_dev dev = {.copy = cpu_copy, .wait_ready = cpu_wait_ready, .mark_done = cpu_mark_done, .u = &cs};
    dj_stream_run run;
    dj_status st = dj__stream_start(&run, ss, n, dev);
    if (st != DJ_OK) return st;
    uint32_t next_run = 0;
    for (size_t i = 0; i < n && st == DJ_OK; i++) {
        if (next_run < ss->n_runs && ss->runs[next_run].first == i) { /* host compute: through scratch */
            const dj_host_run *h = &ss->runs[next_run++];
            for (uint32_t j = 0; j < h->n_in; j++) memcpy(h->in[j].host, h->in[j].dev, h->in[j].bytes);
            st = dj__host_run_compute(ss->host, h->calls, h->n_calls);
            for (uint32_t j = 0; st == DJ_OK && j < h->n_out; j++) memcpy(h->out[j].dev, h->out[j].host, h->out[j].bytes);
            if (st != DJ_OK) break;
            if (!h->join) { /* it replaced the device's calls; a share runs beside them (here: before) */
                i += h->n_calls - 1;
                continue;
            }
        }
        const int32_t idx = (int32_t)i;
        st = dj__stream_before(&run, &idx, 1);
        if (st == DJ_OK) st = dj_backend_compute(be, &calls[i]);
        if (st == DJ_OK) st = dj__stream_after(&run, &idx, 1);
    }
    return dj__stream_end(&run, st);
}
