/* cuda_elementwise.cu: EMBED (table rows gathered to bf16), SILU_MUL and ADD
 * on bf16 activations, computed in f32. */
#include "backend/cuda/cuda_impl.h"

#define EW_THREADS 256

static unsigned ew_blocks(const dj_cuda_backend *cb, size_t count) {
    size_t b = (count + EW_THREADS - 1) / EW_THREADS, cap = (size_t)cb->n_sm * 16;
    return (unsigned)(b < cap ? b : cap);
}

template <typename TW>
static __global__ void embed_kernel(const int32_t *ids, const TW *table, __nv_bfloat16 *out, uint32_t n,
                                    uint32_t d) {
    const size_t count = (size_t)n * d;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / d, col = i % d;
        dj_st(out, i, dj_ld(table, (size_t)ids[row] * d + col));
    }
}

static __global__ void silu_mul_kernel(const __nv_bfloat16 *gate, const __nv_bfloat16 *up, __nv_bfloat16 *out,
                                       size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        const float g = __bfloat162float(gate[i]);
        out[i] = __float2bfloat16(g / (1.0f + expf(-g)) * __bfloat162float(up[i]));
    }
}

static __global__ void add_kernel(const __nv_bfloat16 *a, const __nv_bfloat16 *b, __nv_bfloat16 *out,
                                  size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

dj_status dj__cuda_embed(dj_cuda_backend *cb, const dj_op_call *c, const int32_t *ids_dev) {
    __nv_bfloat16 *out = (__nv_bfloat16 *)c->out;
    const unsigned blocks = ew_blocks(cb, (size_t)c->n * c->d);
    switch (c->w_dtype) {
    case DJ_DTYPE_BF16:
        embed_kernel<<<blocks, EW_THREADS, 0, cb->stream>>>(ids_dev, (const __nv_bfloat16 *)c->w, out, c->n, c->d);
        break;
    case DJ_DTYPE_F16:
        embed_kernel<<<blocks, EW_THREADS, 0, cb->stream>>>(ids_dev, (const __half *)c->w, out, c->n, c->d);
        break;
    default:
        embed_kernel<<<blocks, EW_THREADS, 0, cb->stream>>>(ids_dev, (const float *)c->w, out, c->n, c->d);
        break;
    }
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

dj_status dj__cuda_silu_mul(dj_cuda_backend *cb, const dj_op_call *c) {
    const size_t count = (size_t)c->n * c->d;
    silu_mul_kernel<<<ew_blocks(cb, count), EW_THREADS, 0, cb->stream>>>(
        (const __nv_bfloat16 *)c->x, (const __nv_bfloat16 *)c->x2, (__nv_bfloat16 *)c->out, count);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

dj_status dj__cuda_add(dj_cuda_backend *cb, const dj_op_call *c) {
    const size_t count = (size_t)c->n * c->d;
    add_kernel<<<ew_blocks(cb, count), EW_THREADS, 0, cb->stream>>>(
        (const __nv_bfloat16 *)c->x, (const __nv_bfloat16 *)c->x2, (__nv_bfloat16 *)c->out, count);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
