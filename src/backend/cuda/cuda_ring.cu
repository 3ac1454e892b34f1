/* cuda_ring.cu: weight streaming on the CUDA backend - a ring's ready/done
 * events, the weight copy stream, page-locking the mapped checkpoint, and the
 * event calls the shared step driver (backend/stream.c) makes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/cuda/cuda_impl.h"

struct dj_backend_ring {
    uint32_t n;
    cudaEvent_t *ready; /* [n] recorded on the weight stream after load k's copies */
    cudaEvent_t *done;  /* [n] recorded on the compute stream after load k's last reader */
};

static dj_status weight_stream(dj_cuda_backend *cb) {
    if (!cb->weight_stream) DJ_CU(cb, cudaStreamCreateWithFlags(&cb->weight_stream, cudaStreamNonBlocking));
    if (!cb->weight_mark) DJ_CU(cb, cudaEventCreateWithFlags(&cb->weight_mark, cudaEventDisableTiming));
    return DJ_OK;
}

static void ring_release(dj_backend_ring_t *r) {
    for (uint32_t k = 0; k < r->n; k++) {
        if (r->ready && r->ready[k]) (void)cudaEventDestroy(r->ready[k]);
        if (r->done && r->done[k]) (void)cudaEventDestroy(r->done[k]);
    }
    free(r->ready);
    free(r->done);
    free(r);
}

dj_status dj__cuda_ring_new(dj_backend_t *be, uint32_t n_loads, dj_backend_ring_t **out) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    *out = NULL;
    if (n_loads == 0) return dj_fail(DJ_EINVAL, "cuda ring: no loads");
    DJ_CU(cb, cudaSetDevice(cb->device));
    dj_status st = weight_stream(cb);
    if (st != DJ_OK) return st;
    dj_backend_ring_t *r = (dj_backend_ring_t *)calloc(1, sizeof *r);
    if (!r) return dj_fail(DJ_ENOMEM, "cuda ring: out of host memory");
    r->ready = (cudaEvent_t *)calloc(n_loads, sizeof *r->ready);
    r->done = (cudaEvent_t *)calloc(n_loads, sizeof *r->done);
    r->n = n_loads;
    if (!r->ready || !r->done) {
        ring_release(r);
        return dj_fail(DJ_ENOMEM, "cuda ring: out of host memory for %u loads", n_loads);
    }
    for (uint32_t k = 0; k < n_loads; k++) {
        cudaError_t e = cudaEventCreateWithFlags(&r->ready[k], cudaEventDisableTiming);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&r->done[k], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            ring_release(r);
            return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
        }
    }
    *out = r;
    return DJ_OK;
}

void dj__cuda_ring_free(dj_backend_t *be, dj_backend_ring_t *r) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!r) return;
    if (cudaSetDevice(cb->device) == cudaSuccess) {
        /* copies in flight read the host source and write the ring: both go after this */
        if (cb->weight_stream) (void)cudaStreamSynchronize(cb->weight_stream);
        if (cb->stream) (void)cudaStreamSynchronize(cb->stream);
    }
    ring_release(r);
    (void)cudaGetLastError();
}

dj_status dj__cuda_host_register(dj_backend_t *be, void *p, size_t bytes) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    DJ_CU(cb, cudaSetDevice(cb->device));
    /* a read-only mapping (the checkpoint) needs the read-only flag where the device has it */
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return dj_fail(DJ_EUNSUPPORTED, "cuda:%d cannot page-lock %zu bytes of the mapped checkpoint: %s", cb->device,
                       bytes, cudaGetErrorString(e));
    }
    return DJ_OK;
}

void dj__cuda_host_unregister(dj_backend_t *be, void *p) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (cudaSetDevice(cb->device) == cudaSuccess) (void)cudaHostUnregister(p);
    (void)cudaGetLastError();
}

/* ---- the driver's device calls ---- */

typedef struct cuda_stream {
    dj_cuda_backend *cb;
    const dj_stream_step *ss;
} cuda_stream;

static dj_status ring_copy(void *u, uint32_t k, bool serial) {
    const cuda_stream *cs = (const cuda_stream *)u;
    dj_cuda_backend *cb = cs->cb;
    dj_backend_ring_t *r = cs->ss->ring;
    const dj_stream_load *L = &cs->ss->loads[k];
    if (serial) { /* after every kernel enqueued so far */
        DJ_CU(cb, cudaEventRecord(cb->weight_mark, cb->stream));
        DJ_CU(cb, cudaStreamWaitEvent(cb->weight_stream, cb->weight_mark, 0));
    }
    for (uint32_t i = 0; i < L->n_after; i++) DJ_CU(cb, cudaStreamWaitEvent(cb->weight_stream, r->done[L->after[i]], 0));
    for (uint32_t s = 0; s < L->n_spans; s++) {
        const dj_copy_span *sp = &L->spans[s];
        if (sp->rows > 1) /* a column slice: rows host_pitch apart, packed in the ring */
            DJ_CU(cb, cudaMemcpy2DAsync(sp->dev, sp->bytes, sp->host, sp->host_pitch, sp->bytes, sp->rows,
                                        cudaMemcpyHostToDevice, cb->weight_stream));
        else
            DJ_CU(cb, cudaMemcpyAsync(sp->dev, sp->host, sp->bytes, cudaMemcpyHostToDevice, cb->weight_stream));
    }
    DJ_CU(cb, cudaEventRecord(r->ready[k], cb->weight_stream));
    return DJ_OK;
}

static dj_status ring_wait(void *u, uint32_t k) {
    const cuda_stream *cs = (const cuda_stream *)u;
    DJ_CU(cs->cb, cudaStreamWaitEvent(cs->cb->stream, cs->ss->ring->ready[k], 0));
    return DJ_OK;
}

static dj_status ring_done(void *u, uint32_t k) {
    const cuda_stream *cs = (const cuda_stream *)u;
    DJ_CU(cs->cb, cudaEventRecord(cs->ss->ring->done[k], cs->cb->stream));
    return DJ_OK;
}

dj_status dj__cuda_stream_begin(dj_cuda_backend *cb, const dj_stream_step *ss, size_t n_calls,
                                           dj_stream_run *run) {
    if (cb->capturing) return dj_fail(DJ_EUNSUPPORTED, "cuda: a streamed step cannot be captured");
    if (!ss->ring || ss->ring->n != ss->n_loads)
        return dj_fail(DJ_EINVAL, "cuda ring: a step of %u loads on a ring of %u", ss->n_loads,
                       ss->ring ? ss->ring->n : 0);
    dj_status st = weight_stream(cb);
    if (st != DJ_OK) return st;
    cuda_stream *cs = (cuda_stream *)malloc(sizeof *cs);
    if (!cs) return dj_fail(DJ_ENOMEM, "cuda ring: out of host memory");
    cs->cb = cb;
    cs->ss = ss;
    dj_stream_dev dev;
    dev.copy = ring_copy;
    dev.wait_ready = ring_wait;
    dev.mark_done = ring_done;
    dev.u = cs;
    st = dj__stream_start(run, ss, n_calls, dev);
    if (st != DJ_OK) free(cs);
    return st;
}

dj_status dj__cuda_stream_end(dj_stream_run *run, dj_status st) {
    void *cs = run->dev.u;
    st = dj__stream_end(run, st);
    free(cs);
    return st;
}

void dj__cuda_ring_destroy(dj_cuda_backend *cb) {
    if (cb->weight_stream) {
        (void)cudaStreamSynchronize(cb->weight_stream);
        (void)cudaStreamDestroy(cb->weight_stream);
        cb->weight_stream = NULL;
    }
    if (cb->weight_mark) (void)cudaEventDestroy(cb->weight_mark);
    cb->weight_mark = NULL;
}

/* ---- host compute: a host run as a host function in stream order ---- */

typedef struct host_job {
    dj_cuda_backend *cb;
    dj_backend_t *host;
    uint32_t n;
    dj_op_call calls[]; /* [n] */
} host_job;

static void CUDART_CB host_job_run(void *p) {
    host_job *j = (host_job *)p;
    const dj_status st = dj__host_run_compute(j->host, j->calls, j->n);
    if (st != DJ_OK && !__atomic_load_n(&j->cb->host_failed, __ATOMIC_ACQUIRE)) {
        snprintf(j->cb->host_err, sizeof j->cb->host_err, "%s", dj_last_error());
        __atomic_store_n(&j->cb->host_failed, 1, __ATOMIC_RELEASE);
    }
    free(j);
}

dj_status dj__cuda_host_status(dj_cuda_backend *cb) {
    if (!__atomic_load_n(&cb->host_failed, __ATOMIC_ACQUIRE)) return DJ_OK;
    const dj_status st = dj_fail(DJ_EDEVICE, "cuda: host compute of a streamed step failed: %s", cb->host_err);
    __atomic_store_n(&cb->host_failed, 0, __ATOMIC_RELEASE);
    return st;
}

/* The host stream, its start mark and n done events (a share's host work runs there). */
static dj_status host_events(dj_cuda_backend *cb, uint32_t n) {
    if (!cb->host_stream) DJ_CU(cb, cudaStreamCreateWithFlags(&cb->host_stream, cudaStreamNonBlocking));
    if (!cb->host_mark) DJ_CU(cb, cudaEventCreateWithFlags(&cb->host_mark, cudaEventDisableTiming));
    if (n <= cb->n_host_done) return DJ_OK;
    cudaEvent_t *e = (cudaEvent_t *)realloc(cb->host_done, n * sizeof *e);
    if (!e) return dj_fail(DJ_ENOMEM, "cuda: out of host memory for %u host-run events", n);
    cb->host_done = e;
    for (; cb->n_host_done < n; cb->n_host_done++)
        DJ_CU(cb, cudaEventCreateWithFlags(&cb->host_done[cb->n_host_done], cudaEventDisableTiming));
    return DJ_OK;
}

dj_status dj__cuda_host_run(dj_cuda_backend *cb, dj_backend_t *host, const dj_host_run *h, uint32_t slot) {
    cudaStream_t s = cb->stream;
    if (h->join) { /* beside the device: on the host stream, after the compute enqueued so far */
        const dj_status st = host_events(cb, slot + 1);
        if (st != DJ_OK) return st;
        DJ_CU(cb, cudaEventRecord(cb->host_mark, cb->stream));
        DJ_CU(cb, cudaStreamWaitEvent(cb->host_stream, cb->host_mark, 0));
        s = cb->host_stream;
    }
    for (uint32_t i = 0; i < h->n_in; i++)
        DJ_CU(cb, cudaMemcpyAsync(h->in[i].host, h->in[i].dev, h->in[i].bytes, cudaMemcpyDeviceToHost, s));
    host_job *j = (host_job *)malloc(sizeof *j + (size_t)h->n_calls * sizeof(dj_op_call));
    if (!j) return dj_fail(DJ_ENOMEM, "cuda: out of host memory for a host run of %u calls", h->n_calls);
    j->cb = cb;
    j->host = host;
    j->n = h->n_calls;
    memcpy(j->calls, h->calls, (size_t)h->n_calls * sizeof(dj_op_call));
    const cudaError_t e = cudaLaunchHostFunc(s, host_job_run, j);
    if (e != cudaSuccess) {
        free(j);
        return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    }
    for (uint32_t i = 0; i < h->n_out; i++)
        DJ_CU(cb, cudaMemcpyAsync(h->out[i].dev, h->out[i].host, h->out[i].bytes, cudaMemcpyHostToDevice, s));
    if (h->join) DJ_CU(cb, cudaEventRecord(cb->host_done[slot], cb->host_stream));
    return DJ_OK;
}

dj_status dj__cuda_host_join(dj_cuda_backend *cb, uint32_t slot) {
    if (slot >= cb->n_host_done) return dj_fail(DJ_EINTERNAL, "cuda: a join with host run %u not started", slot);
    DJ_CU(cb, cudaStreamWaitEvent(cb->stream, cb->host_done[slot], 0));
    return DJ_OK;
}

void dj__cuda_host_destroy(dj_cuda_backend *cb) {
    if (cb->host_stream) {
        (void)cudaStreamSynchronize(cb->host_stream);
        (void)cudaStreamDestroy(cb->host_stream);
        cb->host_stream = NULL;
    }
    if (cb->host_mark) (void)cudaEventDestroy(cb->host_mark);
    cb->host_mark = NULL;
    for (uint32_t i = 0; i < cb->n_host_done; i++) (void)cudaEventDestroy(cb->host_done[i]);
    free(cb->host_done);
    cb->host_done = NULL;
    cb->n_host_done = 0;
}
