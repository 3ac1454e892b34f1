/* backend_impl.h: what every backend shares behind the vtable - the checks a
 * dj_op_call must pass before any backend runs it. Private to src/backend/. */
#ifndef DJ_BACKEND_IMPL_H
#define DJ_BACKEND_IMPL_H

#ifdef __cplusplus
extern "C" { /* the public C headers carry no linkage markers of their own */
#endif

#include "djinn/backend.h"

/* Validates a call for a backend whose activations are `act` and whose K/V
 * pages hold `kv` elements: NULL pointers, zero or inconsistent sizes, dtypes,
 * overlapping buffers (out may equal x only for ROPE), output dtype (act, or
 * f32 from MATMUL), and the K/V view and the positions it must map
 * (DJ_ERANGE). `backend` names the backend in messages. Backend-specific
 * limits (index ranges, kernel coverage) are the backend's own checks. */
dj_status dj__op_call_check(const dj_op_call *c, dj_dtype act, dj_dtype kv, const char *backend);

/* ---- weight streaming: the order of a streamed step (stream.c), shared by
 * every backend so they issue copies, waits and done marks alike ---- */

/* What a backend does for the driver; u is the backend's own state. */
typedef struct dj_stream_dev {
    /* Enqueue load k's copies on the copy queue: they start once the done
     * events of k's `after` loads are reached (serial: also once all compute
     * enqueued so far has finished), then k's ready event is marked. */
    dj_status (*copy)(void *u, uint32_t k, bool serial);
    dj_status (*wait_ready)(void *u, uint32_t k); /* compute enqueued next waits for k's ready */
    dj_status (*mark_done)(void *u, uint32_t k);  /* k's done follows the compute enqueued so far */
    void *u;
} dj_stream_dev;

/* The driver's state for one step. */
typedef struct dj_stream_run {
    const dj_stream_step *ss;
    dj_stream_dev dev;
    uint32_t next;      /* loads [0, next) have had their copies issued */
    uint32_t *left;     /* [n_loads] calls still to run that read load k; owned */
    uint8_t *waited;    /* [n_loads] compute already waits for k's ready; owned */
} dj_stream_run;

/* Checks ss against the n calls and counts each load's readers; a load no
 * call reads is not copied. Then issues every copy the ring has room for. */
dj_status dj__stream_start(dj_stream_run *r, const dj_stream_step *ss, size_t n_calls, dj_stream_dev dev);
/* Before running calls idx[0..k) (one kernel: a fused group, or one call):
 * their loads' copies are issued (serial mode: now) and waited for. A load
 * whose copy cannot be issued yet - its bytes still wait for a reader in this
 * very group - is DJ_EINTERNAL (the layout guarantees neighbours never
 * overlap, so it does not happen). */
dj_status dj__stream_before(dj_stream_run *r, const int32_t *idx, uint32_t k);
/* After them: each load whose last reader ran gets its done mark, and every
 * copy the freed bytes make room for is issued (prefetch). */
dj_status dj__stream_after(dj_stream_run *r, const int32_t *idx, uint32_t k);
/* Ends the run of a step that returned st; returns st, or DJ_EINTERNAL if a
 * load still had readers. Loads copied but not done (a failed step) get
 * their done mark, so later steps do not wait for them forever. */
dj_status dj__stream_end(dj_stream_run *r, dj_status st);
/* A host run's calls, in order, on the host backend (synchronous). */
dj_status dj__host_run_compute(dj_backend_t *host, const dj_op_call *calls, uint32_t n);

#ifdef __cplusplus
}
#endif

#endif
