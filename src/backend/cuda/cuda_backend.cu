/* cuda_backend.cu: the CUDA backend - device memory (cudaMalloc), copies on
 * the backend's stream, host-input staging, argument checks and the compute
 * switch that launches one call (plans and their fusions: cuda_plan.cu). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/cuda/cuda_impl.h"
#include "core/switches.h"

/* Initial staging capacity (ids and block tables of many calls between syncs). */
#define STAGE_INITIAL (1u << 20)
#define STAGE_ALIGN 256
#define BLAS_WORKSPACE ((size_t)32 << 20) /* cuBLAS' recommendation for Hopper */

dj_status dj__cuda_fail(dj_status st, int device, const char *file, int line, const char *msg) {
    const char *base = strrchr(file, '/');
    (void)cudaGetLastError(); /* the error is reported here; later checks must not see it again */
    return dj_fail(st, "cuda:%d %s:%d: %s", device, base ? base + 1 : file, line, msg);
}

/* ---- probe ---- */

extern "C" int dj_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" dj_status dj_cuda_device_name(int device, char *buf, size_t len) {
    if (!buf || len == 0) return dj_fail(DJ_EINVAL, "cuda device name: NULL or empty buffer");
    buf[0] = '\0';
    cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return dj__cuda_fail(DJ_EDEVICE, device, __FILE__, __LINE__, cudaGetErrorString(e));
    snprintf(buf, len, "%s", prop.name);
    return DJ_OK;
}

/* ---- memory and copies ---- */

static dj_status cuda_alloc(dj_backend_t *be, size_t bytes, void **out) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!out) return dj_fail(DJ_EINVAL, "cuda alloc: NULL output pointer");
    *out = NULL;
    if (bytes == 0) return dj_fail(DJ_EINVAL, "cuda alloc: zero bytes requested");
    DJ_CU(cb, cudaSetDevice(cb->device));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return dj_fail(DJ_ENOMEM, "cuda:%d alloc: cannot allocate %zu bytes (%.2f GiB) of device memory: %s",
                       cb->device, bytes, (double)bytes / (1024.0 * 1024.0 * 1024.0), cudaGetErrorString(e));
    }
    if (e != cudaSuccess) return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    *out = p;
    return DJ_OK;
}

static void cuda_free(dj_backend_t *be, void *ptr) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!ptr) return;
    if (cudaSetDevice(cb->device) != cudaSuccess || cudaFree(ptr) != cudaSuccess) {
        DJ_LOG(WARN, "cuda:%d free of %p failed: %s", cb->device, ptr, cudaGetErrorString(cudaGetLastError()));
    }
}

static dj_status not_capturing(const dj_cuda_backend *cb, const char *what) {
    if (cb->capturing)
        return dj_fail(DJ_EINVAL, "cuda:%d %s during a graph capture (only compute is recorded)", cb->device, what);
    return DJ_OK;
}

static dj_status cuda_copy(dj_cuda_backend *cb, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                           const char *what) {
    dj_status st = not_capturing(cb, what);
    if (st != DJ_OK) return st;
    if (bytes == 0) return DJ_OK;
    if (!dst || !src) return dj_fail(DJ_EINVAL, "cuda %s: NULL pointer for %zu bytes", what, bytes);
    DJ_CU(cb, cudaSetDevice(cb->device));
    DJ_CU(cb, cudaMemcpyAsync(dst, src, bytes, kind, cb->stream));
    DJ_CU(cb, cudaStreamSynchronize(cb->stream));
    cb->stage_off = 0;
    return dj__cuda_host_status(cb);
}

static dj_status cuda_upload(dj_backend_t *be, void *dst_dev, const void *src_host, size_t bytes) {
    return cuda_copy((dj_cuda_backend *)be, dst_dev, src_host, bytes, cudaMemcpyHostToDevice, "upload");
}

/* The calling thread's own stream (cudaStreamPerThread): loader threads copy
 * side by side and touch no backend state. */
static dj_status cuda_upload_weights(dj_backend_t *be, void *dst_dev, const void *src_host, size_t bytes) {
    const dj_cuda_backend *cb = (const dj_cuda_backend *)be;
    if (bytes == 0) return DJ_OK;
    if (!dst_dev || !src_host) return dj_fail(DJ_EINVAL, "cuda upload_weights: NULL pointer for %zu bytes", bytes);
    DJ_CU(cb, cudaSetDevice(cb->device));
    DJ_CU(cb, cudaMemcpyAsync(dst_dev, src_host, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread));
    DJ_CU(cb, cudaStreamSynchronize(cudaStreamPerThread));
    return DJ_OK;
}

static dj_status cuda_download(dj_backend_t *be, void *dst_host, const void *src_dev, size_t bytes) {
    return cuda_copy((dj_cuda_backend *)be, dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, "download");
}

/* Device to device on the compute stream; recorded during a capture. */
static dj_status cuda_copy_dev(dj_backend_t *be, void *dst_dev, const void *src_dev, size_t bytes) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    dj_status st = DJ_OK;
    if (bytes && (!dst_dev || !src_dev)) st = dj_fail(DJ_EINVAL, "cuda copy: NULL pointer for %zu bytes", bytes);
    else if (bytes) {
        cudaError_t e = cudaSetDevice(cb->device);
        if (e == cudaSuccess) e = cudaMemcpyAsync(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice, cb->stream);
        if (e != cudaSuccess) st = dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    }
    if (st != DJ_OK && cb->capturing && cb->capture_st == DJ_OK) cb->capture_st = st;
    return st;
}

static dj_status cuda_sync(dj_backend_t *be) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    dj_status st = not_capturing(cb, "sync");
    if (st != DJ_OK) return st;
    DJ_CU(cb, cudaSetDevice(cb->device));
    DJ_CU(cb, cudaStreamSynchronize(cb->stream));
    cb->stage_off = 0;
    return dj__cuda_host_status(cb);
}

/* Room for `bytes` in the staging buffers at *off (syncs and grows them when
 * full). */
static dj_status stage_room(dj_cuda_backend *cb, size_t bytes, size_t *off) {
    const size_t need = (bytes + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
    if (cb->stage_off + need > cb->stage_cap) {
        /* Everything staged so far has been consumed once the stream drains. */
        DJ_CU(cb, cudaStreamSynchronize(cb->stream));
        cb->stage_off = 0;
        if (need > cb->stage_cap) {
            size_t cap = cb->stage_cap * 2 > need ? cb->stage_cap * 2 : need;
            DJ_CU(cb, cudaFreeHost(cb->stage_host));
            cb->stage_host = NULL;
            DJ_CU(cb, cudaFree(cb->stage_dev));
            cb->stage_dev = NULL;
            cb->stage_cap = 0;
            DJ_CU(cb, cudaMallocHost((void **)&cb->stage_host, cap));
            DJ_CU(cb, cudaMalloc((void **)&cb->stage_dev, cap));
            cb->stage_cap = cap;
        }
    }
    *off = cb->stage_off;
    cb->stage_off += need;
    return DJ_OK;
}

dj_status dj__cuda_stage(dj_cuda_backend *cb, const void *host, size_t bytes, const void **dev) {
    *dev = NULL;
    /* A recorded copy would read the pinned buffer at launch time, long after
     * these bytes are gone. */
    if (cb->capturing)
        return dj_fail(DJ_EINVAL,
                       "cuda:%d a host input (token ids or a block table) in a graph capture: pass ids_dev and "
                       "device block tables",
                       cb->device);
    size_t off = 0;
    dj_status st = stage_room(cb, bytes, &off);
    if (st != DJ_OK) return st;
    memcpy(cb->stage_host + off, host, bytes);
    DJ_CU(cb, cudaMemcpyAsync(cb->stage_dev + off, cb->stage_host + off, bytes, cudaMemcpyHostToDevice,
                              cb->stream));
    *dev = cb->stage_dev + off;
    return DJ_OK;
}

static dj_status cuda_upload_async(dj_backend_t *be, void *dst_dev, const void *src_host, size_t bytes) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    dj_status st = not_capturing(cb, "upload_async");
    if (st != DJ_OK) return st;
    if (bytes == 0) return DJ_OK;
    if (!dst_dev || !src_host) return dj_fail(DJ_EINVAL, "cuda upload_async: NULL pointer for %zu bytes", bytes);
    DJ_CU(cb, cudaSetDevice(cb->device));
    size_t off = 0;
    st = stage_room(cb, bytes, &off);
    if (st != DJ_OK) return st;
    memcpy(cb->stage_host + off, src_host, bytes);
    DJ_CU(cb, cudaMemcpyAsync(dst_dev, cb->stage_host + off, bytes, cudaMemcpyHostToDevice, cb->stream));
    return DJ_OK;
}

dj_status dj__cuda_scratch(dj_cuda_backend *cb, size_t floats, float **out) {
    *out = NULL;
    if (floats > cb->scratch_cap) {
        size_t cap = cb->scratch_cap * 2 > floats ? cb->scratch_cap * 2 : floats;
        if (cb->scratch) { /* kernels in flight, or a captured graph, may still use it: retire it */
            if (cb->n_retired == cb->retired_cap) {
                size_t rc = cb->retired_cap ? cb->retired_cap * 2 : 8;
                void **r = (void **)realloc(cb->retired, rc * sizeof *r);
                if (!r) return dj_fail(DJ_ENOMEM, "cuda scratch: out of host memory");
                cb->retired = r;
                cb->retired_cap = rc;
            }
            cb->retired[cb->n_retired++] = cb->scratch;
        }
        cb->scratch = NULL;
        cb->scratch_cap = 0;
        cudaError_t e = cudaMalloc((void **)&cb->scratch, cap * sizeof(float));
        if (e != cudaSuccess) return dj__cuda_fail(DJ_ENOMEM, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
        cb->scratch_cap = cap;
    }
    *out = cb->scratch;
    return DJ_OK;
}

/* ---- argument checks: the shared ones, then what these kernels cover ---- */

dj_status dj__cuda_check_call(const dj_cuda_backend *cb, const dj_op_call *c) {
    /* K/V pages: bf16, or f8_e4m3 after dj_backend_set_kv_dtype (the kernels read and write both) */
    dj_status st = dj__op_call_check(c, DJ_DTYPE_BF16, cb->base.kv_dtype, "cuda");
    if (st != DJ_OK) return st;
    const char *op = dj_op_name(c->op);
    if (c->op == DJ_OP_MATMUL && (c->n > INT32_MAX || c->k > INT32_MAX || c->m > INT32_MAX))
        return dj_fail(DJ_EUNSUPPORTED, "%s: n=%u k=%u m=%u exceeds the cuBLAS index range", op, c->n, c->k, c->m);
    if (c->op == DJ_OP_MATMUL && c->ldw && c->ldw != c->k)
        return dj_fail(DJ_EUNSUPPORTED,
                       "%s: weight rows %u elements apart for k=%u (the CUDA kernels read packed rows)", op, c->ldw,
                       c->k);
    if (c->op == DJ_OP_ATTENTION) {
        if (c->head_dim % 2 != 0 || c->head_dim > 256)
            return dj_fail(DJ_EUNSUPPORTED, "%s: head_dim %u (the CUDA kernels take even head_dim <= 256)", op,
                           c->head_dim);
        if ((uintptr_t)c->x % 4 != 0) return dj_fail(DJ_EINVAL, "%s: q is not 4-byte aligned", op);
        if (c->kv->dtype == DJ_DTYPE_F8_E4M3 && c->kv->n_kv_heads != c->n_kv_heads)
            return dj_fail(DJ_EINVAL, "%s: f8 kv view of %u heads read as %u kv heads (its scales are per view head)",
                           op, c->kv->n_kv_heads, c->n_kv_heads);
    }
    return DJ_OK;
}

/* The view's block table on the device: the caller's mirror, or a staged copy
 * of the blocks the call touches. */
dj_status dj__cuda_device_table(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t **out) {
    const dj_kv_view *kv = c->kv;
    if (c->row_tables) { /* the kernels read each row's own table */
        *out = NULL;
        return DJ_OK;
    }
    if (kv->block_table_dev) {
        *out = kv->block_table_dev;
        return DJ_OK;
    }
    const uint64_t end = (uint64_t)c->pos0 + c->n;
    const size_t blocks = (size_t)((end + kv->tokens_per_page - 1) / kv->tokens_per_page);
    const void *dev = NULL;
    dj_status st = dj__cuda_stage(cb, kv->block_table, blocks * sizeof(uint32_t), &dev);
    *out = (const uint32_t *)dev;
    return st;
}

dj_status dj__cuda_compute_one(dj_cuda_backend *cb, const dj_op_call *c) {
    dj_status st = dj__cuda_check_call(cb, c);
    if (st != DJ_OK) return st;
    DJ_CU(cb, cudaSetDevice(cb->device));
    const uint32_t *table = NULL;
    switch (c->op) {
    case DJ_OP_EMBED: {
        if (!c->ids) return dj__cuda_embed(cb, c, c->ids_dev);
        for (uint32_t i = 0; i < c->n; i++)
            if (c->ids[i] < 0 || (uint32_t)c->ids[i] >= c->m)
                return dj_fail(DJ_ERANGE, "embed: token id %d at row %u is outside the vocabulary [0, %u)",
                               (int)c->ids[i], i, c->m);
        const void *ids = NULL;
        st = dj__cuda_stage(cb, c->ids, (size_t)c->n * sizeof(int32_t), &ids);
        return st != DJ_OK ? st : dj__cuda_embed(cb, c, (const int32_t *)ids);
    }
    case DJ_OP_RMSNORM: return dj__cuda_rmsnorm(cb, c);
    case DJ_OP_MATMUL: return dj__cuda_matmul(cb, c);
    case DJ_OP_ROPE: return dj__cuda_rope(cb, c);
    case DJ_OP_KV_WRITE:
        st = dj__cuda_device_table(cb, c, &table);
        return st != DJ_OK ? st : dj__cuda_kv_write(cb, c, table);
    case DJ_OP_ATTENTION:
        st = dj__cuda_device_table(cb, c, &table);
        return st != DJ_OK ? st : dj__cuda_attention(cb, c, table);
    case DJ_OP_SILU_MUL: return dj__cuda_silu_mul(cb, c);
    case DJ_OP_ADD: return dj__cuda_add(cb, c);
    case DJ_OP_GELU_MUL: return dj__cuda_gelu_mul(cb, c);
    case DJ_OP_SOFTCAP: return dj__cuda_softcap(cb, c);
    case DJ_OP_MOE_ROUTE: return dj__cuda_moe_route(cb, c);
    case DJ_OP_MOE_FFN: return dj__cuda_moe_ffn(cb, c);
    case DJ_OP_LORA: return dj__cuda_lora(cb, c);
    case DJ_OP_COUNT: break;
    }
    return dj_fail(DJ_EUNSUPPORTED, "cuda backend: unknown op %d", (int)c->op);
}

static dj_status cuda_compute(dj_backend_t *be, const dj_op_call *c) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!c) return dj_fail(DJ_EINVAL, "cuda compute: NULL call");
    dj_status st = dj__cuda_compute_one(cb, c);
    if (st != DJ_OK && cb->capturing && cb->capture_st == DJ_OK) cb->capture_st = st;
    return st;
}

static dj_status cuda_argmax(dj_backend_t *be, const float *logits, uint32_t n, uint32_t vocab, int32_t *out) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!logits || !out || n == 0 || vocab == 0)
        return dj_fail(DJ_EINVAL, "cuda argmax: NULL pointer, no rows or an empty vocabulary");
    DJ_CU(cb, cudaSetDevice(cb->device));
    dj_status st = dj__cuda_argmax(cb, logits, n, vocab, out);
    if (st != DJ_OK && cb->capturing && cb->capture_st == DJ_OK) cb->capture_st = st;
    return st;
}

static dj_status cuda_sample(dj_backend_t *be, const float *logits, uint32_t n, uint32_t vocab,
                             const dj_sample_row *rows, int32_t *out) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!logits || !rows || !out || n == 0 || vocab == 0)
        return dj_fail(DJ_EINVAL, "cuda sample: NULL pointer, no rows or an empty vocabulary");
    for (uint32_t i = 0; i < n; i++) {
        const dj_sample_row *r = &rows[i];
        if (!(r->temperature >= 0.0f) || !isfinite(r->temperature) || !(r->top_p > 0.0f && r->top_p <= 1.0f) ||
            !(r->min_p >= 0.0f && r->min_p <= 1.0f) || !(r->repetition_penalty >= 0.0f) ||
            !isfinite(r->repetition_penalty) || !(r->u >= 0.0 && r->u < 1.0) || r->n_pen > vocab ||
            (r->n_pen && !r->pen))
            return dj_fail(DJ_EINVAL, "cuda sample: row %u has temperature %g, top_p %g, min_p %g, repetition %g, "
                                      "u %g, %u penalties (want T >= 0 finite, top_p in (0, 1], min_p in [0, 1], "
                                      "repetition >= 0 finite, u in [0, 1), at most vocab penalties)",
                           i, (double)r->temperature, (double)r->top_p, (double)r->min_p,
                           (double)r->repetition_penalty, r->u, r->n_pen);
        for (uint32_t k = 0; k < r->n_pen; k++)
            if (r->pen[k].id < 0 || (uint32_t)r->pen[k].id >= vocab || !isfinite(r->pen[k].sub))
                return dj_fail(DJ_EINVAL, "cuda sample: row %u penalty %u: id %d outside [0, %u) or a sub of %g", i, k,
                               (int)r->pen[k].id, vocab, (double)r->pen[k].sub);
    }
    DJ_CU(cb, cudaSetDevice(cb->device));
    dj_status st = not_capturing(cb, "sample"); /* the rows are staged host bytes */
    if (st == DJ_OK) st = dj__cuda_sample(cb, logits, n, vocab, rows, out);
    return st;
}

static dj_status cuda_mask(dj_backend_t *be, float *logits, uint32_t n, uint32_t vocab, const dj_mask_row *rows) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!logits || !rows || n == 0 || vocab == 0)
        return dj_fail(DJ_EINVAL, "cuda mask: NULL pointer, no rows or an empty vocabulary");
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < rows[i].n_bias; k++)
            if (!rows[i].bias || rows[i].bias[k].id < 0 || (uint32_t)rows[i].bias[k].id >= vocab ||
                !isfinite(rows[i].bias[k].bias))
                return dj_fail(DJ_EINVAL, "cuda mask: row %u bias %u: an id outside [0, %u) or a bias not finite", i,
                               k, vocab);
    DJ_CU(cb, cudaSetDevice(cb->device));
    dj_status st = not_capturing(cb, "mask"); /* the masks are staged host bytes */
    if (st == DJ_OK) st = dj__cuda_mask(cb, logits, n, vocab, rows);
    return st;
}

/* ---- graphs ---- */

struct dj_backend_graph {
    cudaGraphExec_t exec;
};

static dj_status cuda_capture_begin(dj_backend_t *be) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    dj_status st = not_capturing(cb, "capture_begin");
    if (st != DJ_OK) return st;
    DJ_CU(cb, cudaSetDevice(cb->device));
    /* Relaxed: a scratch buffer that must grow may be cudaMalloc'd while recording. */
    DJ_CU(cb, cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeRelaxed));
    cb->capturing = true;
    cb->capture_st = DJ_OK;
    return DJ_OK;
}

static dj_status cuda_capture_end(dj_backend_t *be, dj_backend_graph_t **out) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    *out = NULL;
    if (!cb->capturing) return dj_fail(DJ_EINVAL, "cuda:%d capture_end without capture_begin", cb->device);
    cb->capturing = false;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cb->stream, &graph);
    const dj_status failed = cb->capture_st;
    if (failed != DJ_OK || e != cudaSuccess || !graph) {
        if (graph) (void)cudaGraphDestroy(graph);
        if (failed != DJ_OK) { /* the failed call's message stands */
            (void)cudaGetLastError();
            return failed;
        }
        return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__,
                             e != cudaSuccess ? cudaGetErrorString(e) : "capture produced no graph");
    }
    dj_backend_graph_t *g = (dj_backend_graph_t *)calloc(1, sizeof *g);
    if (!g) {
        (void)cudaGraphDestroy(graph);
        return dj_fail(DJ_ENOMEM, "cuda graph: out of host memory");
    }
    e = cudaGraphInstantiate(&g->exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        free(g);
        return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    }
    *out = g;
    return DJ_OK;
}

static dj_status cuda_graph_launch(dj_backend_t *be, dj_backend_graph_t *g) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    dj_status st = not_capturing(cb, "graph_launch");
    if (st != DJ_OK) return st;
    if (!g) return dj_fail(DJ_EINVAL, "cuda graph_launch: NULL graph");
    DJ_CU(cb, cudaSetDevice(cb->device));
    DJ_CU(cb, cudaGraphLaunch(g->exec, cb->stream));
    return DJ_OK;
}

static void cuda_graph_free(dj_backend_t *be, dj_backend_graph_t *g) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (!g) return;
    if (cudaSetDevice(cb->device) == cudaSuccess) {
        (void)cudaStreamSynchronize(cb->stream); /* a launch in flight still uses it */
        (void)cudaGraphExecDestroy(g->exec);
    }
    (void)cudaGetLastError();
    free(g);
}

/* ---- lifetime ---- */

static void cuda_destroy(dj_backend_t *be) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (cudaSetDevice(cb->device) == cudaSuccess) {
        if (cb->stream) (void)cudaStreamSynchronize(cb->stream);
        dj__cuda_swap_destroy(cb);
        dj__cuda_ring_destroy(cb);
        dj__cuda_host_destroy(cb);
        dj__cuda_fp8_lt_destroy(cb);
        if (cb->blas) (void)cublasDestroy(cb->blas);
        if (cb->stage_host) (void)cudaFreeHost(cb->stage_host);
        if (cb->stage_dev) (void)cudaFree(cb->stage_dev);
        if (cb->scratch) (void)cudaFree(cb->scratch);
        for (size_t i = 0; i < cb->n_retired; i++) (void)cudaFree(cb->retired[i]);
        if (cb->blas_ws) (void)cudaFree(cb->blas_ws);
        if (cb->stream) (void)cudaStreamDestroy(cb->stream);
    }
    (void)cudaGetLastError();
    dj__cuda_plans_free(cb);
    free(cb->retired);
    free(cb);
}

static const dj_backend_vtbl cuda_vtbl = {
    /* .name = */ "cuda",
    /* .alloc = */ cuda_alloc,
    /* .free = */ cuda_free,
    /* .upload = */ cuda_upload,
    /* .download = */ cuda_download,
    /* .compute = */ cuda_compute,
    /* .sync = */ cuda_sync,
    /* .destroy = */ cuda_destroy,
    /* .upload_async = */ cuda_upload_async,
    /* .argmax = */ cuda_argmax,
    /* .capture_begin = */ cuda_capture_begin,
    /* .capture_end = */ cuda_capture_end,
    /* .graph_launch = */ cuda_graph_launch,
    /* .graph_free = */ cuda_graph_free,
    /* .sample = */ cuda_sample,
    /* .compute_plan = */ dj__cuda_compute_plan,
    /* .upload_weights = */ cuda_upload_weights,
    /* .host_alloc = */ dj__cuda_host_alloc,
    /* .host_free = */ dj__cuda_host_free,
    /* .xfer_start = */ dj__cuda_xfer_start,
    /* .xfer_query = */ dj__cuda_xfer_query,
    /* .xfer_order = */ dj__cuda_xfer_order,
    /* .xfer_free = */ dj__cuda_xfer_free,
    /* .mem_info = */ dj__cuda_mem_info,
    /* .ring_new = */ dj__cuda_ring_new,
    /* .ring_free = */ dj__cuda_ring_free,
    /* .host_register = */ dj__cuda_host_register,
    /* .host_unregister = */ dj__cuda_host_unregister,
    /* .copy = */ cuda_copy_dev,
    /* .mask = */ cuda_mask,
};

static dj_status cuda_init(dj_cuda_backend *cb) {
    DJ_CU(cb, cudaSetDevice(cb->device));
    cudaDeviceProp prop;
    DJ_CU(cb, cudaGetDeviceProperties(&prop, cb->device));
    cb->n_sm = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    cb->smem_optin = prop.sharedMemPerBlockOptin;
    DJ_CU(cb, cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
    DJ_CUBLAS(cb, cublasCreate(&cb->blas));
    DJ_CUBLAS(cb, cublasSetStream(cb->blas, cb->stream));
    /* A workspace of our own, so that recorded GEMMs allocate nothing. */
    DJ_CU(cb, cudaMalloc(&cb->blas_ws, BLAS_WORKSPACE));
    DJ_CUBLAS(cb, cublasSetWorkspace(cb->blas, cb->blas_ws, BLAS_WORKSPACE));
    DJ_CU(cb, cudaMallocHost((void **)&cb->stage_host, STAGE_INITIAL));
    DJ_CU(cb, cudaMalloc((void **)&cb->stage_dev, STAGE_INITIAL));
    cb->stage_cap = STAGE_INITIAL;
    const dj_status st = dj__cuda_attention_tc_init(cb);
    return st != DJ_OK ? st : dj__cuda_attention_wg_init(cb);
}

extern "C" dj_status dj_backend_cuda_new(int device, dj_backend_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "cuda backend: NULL output pointer");
    *out = NULL;
    const int count = dj_cuda_device_count();
    if (count == 0) return dj_fail(DJ_EDEVICE, "cuda:%d no CUDA device (no GPU or no driver)", device);
    if (device < 0 || device >= count)
        return dj_fail(DJ_EINVAL, "cuda backend: device %d outside [0, %d)", device, count);
    dj_cuda_backend *cb = (dj_cuda_backend *)calloc(1, sizeof *cb);
    if (!cb) return dj_fail(DJ_ENOMEM, "cuda backend: cannot allocate %zu bytes", sizeof *cb);
    cb->base.vt = &cuda_vtbl;
    cb->base.kv_dtype = DJ_DTYPE_BF16;
    cb->base.act_dtype = DJ_DTYPE_BF16;
    cb->base.short_pos = DJ_CUDA_SHORT_POS;
    cb->base.short_rows = DJ_CUDA_SHORT_ROWS;
    cb->device = device;
    {
        cb->base.res_dtype = DJ_DTYPE_F32; /* the residual stream (the bf16 one was within noise; deleted) */
        /* kill switches (src/core/switches.h): wg (default) | tc (the mma.sync prefill) | simple */
        const int attn = dj_switch_read(DJ_SW_ATTN);
        cb->attn_tc = attn != 2;
        cb->attn_wg = attn == 0;
        cb->fuse = dj_switch_read(DJ_SW_FUSE) == 1;
        cb->pdl = dj_switch_read(DJ_SW_PDL) == 1;
    }
    dj_status st = cuda_init(cb);
    if (st != DJ_OK) goto fail;
    *out = &cb->base;
    return DJ_OK;
fail:
    cuda_destroy(&cb->base);
    return st;
}

extern "C" void dj__cuda_set_sample_split(dj_backend_t *be, uint32_t blocks) {
    ((dj_cuda_backend *)be)->sample_split = blocks;
}

extern "C" void dj__cuda_set_paths(dj_backend_t *be, int attention, int matmul) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    cb->attention_path = attention;
    cb->matmul_path = matmul;
}

extern "C" int dj__cuda_last_attention(dj_backend_t *be) { return ((dj_cuda_backend *)be)->last_attention; }

extern "C" void dj__cuda_set_fuse(dj_backend_t *be, int on) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    cb->fuse = on != 0;
}

extern "C" uint64_t dj__cuda_fusions(dj_backend_t *be) { return ((dj_cuda_backend *)be)->fusions; }
extern "C" uint64_t dj__cuda_unstored(dj_backend_t *be) { return ((dj_cuda_backend *)be)->unstored; }
