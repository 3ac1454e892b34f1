/* cuda_swap.cu: the CUDA backend's KV swap hooks - pinned host memory, batches
 * of page copies on a copy stream ordered after compute by events, and the
 * device's free memory for sizing the VMU. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/cuda/cuda_impl.h"

/* A transfer: events on the copy stream around its copies. */
struct dj_backend_xfer {
    cudaEvent_t start; /* after the wait for earlier compute */
    cudaEvent_t done;  /* after the last copy */
};

dj_status dj__cuda_host_alloc(dj_backend_t *be, size_t bytes, void **out) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!out) return dj_fail(DJ_EINVAL, "cuda host_alloc: NULL output pointer");
    *out = NULL;
    if (bytes == 0) return dj_fail(DJ_EINVAL, "cuda host_alloc: zero bytes requested");
    DJ_CU(cb, cudaSetDevice(cb->device));
    void *p = NULL;
    /* Portable: pinned for every context, so copies run by DMA at the link's rate. */
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return dj_fail(DJ_ENOMEM, "cuda:%d cannot pin %zu bytes (%.2f GiB) of host memory: %s", cb->device, bytes,
                       (double)bytes / (1024.0 * 1024.0 * 1024.0), cudaGetErrorString(e));
    }
    *out = p;
    return DJ_OK;
}

void dj__cuda_host_free(dj_backend_t *be, void *ptr) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!ptr) return;
    if (cudaFreeHost(ptr) != cudaSuccess)
        DJ_LOG(WARN, "cuda:%d cudaFreeHost(%p) failed: %s", cb->device, ptr, cudaGetErrorString(cudaGetLastError()));
}

/* The copy stream and the compute-side event, made once. */
static dj_status copy_stream(dj_cuda_backend *cb) {
    if (!cb->copy_stream) DJ_CU(cb, cudaStreamCreateWithFlags(&cb->copy_stream, cudaStreamNonBlocking));
    if (!cb->compute_mark) DJ_CU(cb, cudaEventCreateWithFlags(&cb->compute_mark, cudaEventDisableTiming));
    return DJ_OK;
}

/* Enqueues the copies on the copy stream: one cudaMemcpyBatchAsync (one
 * driver call for any number of pages), or span by span where the driver
 * refuses the batch call. */
static dj_status enqueue_copies(dj_cuda_backend *cb, bool to_host, const dj_copy_span *spans, size_t n) {
    if (n == 0) return DJ_OK;
    if (!cb->batch_refused) {
        void **dsts = (void **)malloc(n * sizeof *dsts);
        const void **srcs = (const void **)malloc(n * sizeof *srcs);
        size_t *sizes = (size_t *)malloc(n * sizeof *sizes);
        if (!dsts || !srcs || !sizes) {
            free(dsts);
            free((void *)srcs);
            free(sizes);
            return dj_fail(DJ_ENOMEM, "cuda transfer: out of host memory for %zu copies", n);
        }
        for (size_t i = 0; i < n; i++) {
            dsts[i] = to_host ? spans[i].host : spans[i].dev;
            srcs[i] = to_host ? spans[i].dev : spans[i].host;
            sizes[i] = spans[i].bytes;
        }
        cudaMemcpyAttributes attr;
        memset(&attr, 0, sizeof attr);
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream; /* after the wait on earlier compute */
        attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t first = 0;
        cudaError_t e = cudaMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &first, 1, cb->copy_stream);
        free(dsts);
        free((void *)srcs);
        free(sizes);
        if (e == cudaSuccess) return DJ_OK;
        if (e != cudaErrorNotSupported && e != cudaErrorInvalidValue)
            return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
        (void)cudaGetLastError();
        DJ_LOG(WARN, "cuda:%d cudaMemcpyBatchAsync refused (%s): swap copies go span by span", cb->device,
               cudaGetErrorString(e));
        cb->batch_refused = true;
    }
    for (size_t i = 0; i < n; i++) {
        void *dst = to_host ? spans[i].host : spans[i].dev;
        const void *src = to_host ? spans[i].dev : spans[i].host;
        DJ_CU(cb, cudaMemcpyAsync(dst, src, spans[i].bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                  cb->copy_stream));
    }
    return DJ_OK;
}

static void xfer_destroy(dj_backend_xfer_t *x) {
    if (x->start) (void)cudaEventDestroy(x->start);
    if (x->done) (void)cudaEventDestroy(x->done);
    free(x);
}

dj_status dj__cuda_xfer_start(dj_backend_t *be, bool to_host, const dj_copy_span *spans, size_t n,
                                         dj_backend_xfer_t **out) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!out) return dj_fail(DJ_EINVAL, "cuda xfer_start: NULL output pointer");
    *out = NULL;
    if (n && !spans) return dj_fail(DJ_EINVAL, "cuda xfer_start: NULL spans for %zu copies", n);
    if (cb->capturing) return dj_fail(DJ_EINVAL, "cuda:%d a swap transfer during a graph capture", cb->device);
    for (size_t i = 0; i < n; i++)
        if (!spans[i].dev || !spans[i].host)
            return dj_fail(DJ_EINVAL, "cuda xfer_start: span %zu has a NULL pointer (%zu bytes)", i, spans[i].bytes);
    DJ_CU(cb, cudaSetDevice(cb->device));
    dj_status st = copy_stream(cb);
    if (st != DJ_OK) return st;
    dj_backend_xfer_t *x = (dj_backend_xfer_t *)calloc(1, sizeof *x);
    if (!x) return dj_fail(DJ_ENOMEM, "cuda transfer: out of host memory");
    cudaError_t e = cudaEventCreate(&x->start);
    if (e == cudaSuccess) e = cudaEventCreate(&x->done);
    /* The copies wait for every compute enqueued so far. */
    if (e == cudaSuccess) e = cudaEventRecord(cb->compute_mark, cb->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(cb->copy_stream, cb->compute_mark, 0);
    if (e == cudaSuccess) e = cudaEventRecord(x->start, cb->copy_stream);
    if (e != cudaSuccess) {
        xfer_destroy(x);
        return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    }
    st = enqueue_copies(cb, to_host, spans, n);
    /* Recorded even after a failure, so that freeing waits for whatever was enqueued. */
    e = cudaEventRecord(x->done, cb->copy_stream);
    if (st == DJ_OK && e != cudaSuccess) st = dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    if (st != DJ_OK) {
        if (e == cudaSuccess) (void)cudaEventSynchronize(x->done);
        (void)cudaGetLastError();
        xfer_destroy(x);
        return st;
    }
    *out = x;
    return DJ_OK;
}

dj_status dj__cuda_xfer_query(dj_backend_t *be, dj_backend_xfer_t *x, double *seconds) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!x) return dj_fail(DJ_EINVAL, "cuda xfer_query: NULL transfer");
    cudaError_t e = cudaEventQuery(x->done);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return DJ_EBUSY;
    }
    if (e != cudaSuccess) return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    if (seconds) {
        float ms = 0.0f;
        DJ_CU(cb, cudaEventElapsedTime(&ms, x->start, x->done));
        *seconds = (double)ms * 1e-3;
    }
    return DJ_OK;
}

dj_status dj__cuda_xfer_order(dj_backend_t *be, dj_backend_xfer_t *x) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!x) return dj_fail(DJ_EINVAL, "cuda xfer_order: NULL transfer");
    if (cb->capturing) return dj_fail(DJ_EINVAL, "cuda:%d xfer_order during a graph capture", cb->device);
    DJ_CU(cb, cudaSetDevice(cb->device));
    DJ_CU(cb, cudaStreamWaitEvent(cb->stream, x->done, 0));
    return DJ_OK;
}

void dj__cuda_xfer_free(dj_backend_t *be, dj_backend_xfer_t *x) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!x) return;
    if (cudaSetDevice(cb->device) != cudaSuccess || cudaEventSynchronize(x->done) != cudaSuccess)
        DJ_LOG(WARN, "cuda:%d waiting for a swap transfer failed: %s", cb->device,
               cudaGetErrorString(cudaGetLastError()));
    xfer_destroy(x);
}

dj_status dj__cuda_mem_info(dj_backend_t *be, size_t *free_bytes, size_t *total_bytes) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!free_bytes || !total_bytes) return dj_fail(DJ_EINVAL, "cuda mem_info: NULL output pointer");
    *free_bytes = *total_bytes = 0;
    DJ_CU(cb, cudaSetDevice(cb->device));
    DJ_CU(cb, cudaMemGetInfo(free_bytes, total_bytes));
    return DJ_OK;
}

void dj__cuda_swap_destroy(dj_cuda_backend *cb) {
    if (cb->copy_stream) {
        (void)cudaStreamSynchronize(cb->copy_stream);
        (void)cudaStreamDestroy(cb->copy_stream);
        cb->copy_stream = NULL;
    }
    if (cb->compute_mark) (void)cudaEventDestroy(cb->compute_mark);
    cb->compute_mark = NULL;
}
