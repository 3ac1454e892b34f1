/* cuda_elementwise.cu: EMBED (table rows gathered to bf16 or to the f32
 * residual stream), SILU_MUL on bf16 activations, ADD of a bf16 activation to
 * the residual stream (bf16 or f32), computed in f32, and the row argmax of
 * f32 logits (greedy sampling on the device). */
#include "backend/cuda/cuda_impl.h"

#define EW_THREADS 256

static unsigned ew_blocks(const dj_cuda_backend *cb, size_t count) {
    size_t b = (count + EW_THREADS - 1) / EW_THREADS, cap = (size_t)cb->n_sm * 16;
    return (unsigned)(b < cap ? b : cap);
}

template <typename TW, typename TO>
static __global__ void embed_kernel(const int32_t *ids, const TW *table, TO *out, uint32_t n, uint32_t d,
                                    uint32_t vocab, float scale) {
    const size_t count = (size_t)n * d;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        const size_t row = i / d, col = i % d;
        const int32_t id = ids[row];
        /* Ids in device memory were validated by the caller; never read outside the table. */
        const float v = id >= 0 && (uint32_t)id < vocab ? dj_ld(table, (size_t)id * d + col) : 0.0f;
        dj_st(out, i, scale != 0.0f ? v * scale : v); /* Gemma: times sqrt(hidden) */
    }
}

static __global__ void silu_mul_kernel(const __nv_bfloat16 *gate, const __nv_bfloat16 *up, __nv_bfloat16 *out,
                                       size_t count, bool vec) {
    dj_pdl_release();
    dj_pdl_wait();
    dj_glu(gate, up, out, count, vec, dj_silu_fn());
}

/* out[i] = a[i] + b[i]: a and out the residual stream (bf16 or f32), b bf16. */
template <typename TA, typename TO>
static __global__ void add_kernel(const TA *a, const __nv_bfloat16 *b, TO *out, size_t count) {
    dj_pdl_release();
    dj_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dj_st(out, i, dj_ld(a, i) + __bfloat162float(b[i]));
}

template <typename TO>
static void launch_embed(dj_cuda_backend *cb, const dj_op_call *c, const int32_t *ids_dev) {
    TO *out = (TO *)c->out;
    const unsigned blocks = ew_blocks(cb, (size_t)c->n * c->d);
    switch (c->w_dtype) {
    case DJ_DTYPE_BF16:
        embed_kernel<<<blocks, EW_THREADS, 0, cb->stream>>>(ids_dev, (const __nv_bfloat16 *)c->w, out, c->n, c->d,
                                                            c->m, c->scale);
        break;
    case DJ_DTYPE_F16:
        embed_kernel<<<blocks, EW_THREADS, 0, cb->stream>>>(ids_dev, (const __half *)c->w, out, c->n, c->d, c->m,
                                                            c->scale);
        break;
    default:
        embed_kernel<<<blocks, EW_THREADS, 0, cb->stream>>>(ids_dev, (const float *)c->w, out, c->n, c->d, c->m,
                                                            c->scale);
        break;
    }
}

dj_status dj__cuda_embed(dj_cuda_backend *cb, const dj_op_call *c, const int32_t *ids_dev) {
    if (c->out_dtype == DJ_DTYPE_F32)
        launch_embed<float>(cb, c, ids_dev);
    else
        launch_embed<__nv_bfloat16>(cb, c, ids_dev);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

#define ARGMAX_PARTS 32    /* blocks per row of the first pass: one per lane of the second */
#define ARGMAX_THREADS 256

/* a beats b: larger value, or equal value and lower id (torch.argmax). NaNs
 * are skipped (a row of NaNs gives 0). A total order, so any split of a row
 * picks what one scan of it picks. */
static __device__ __forceinline__ bool better(float va, uint32_t ia, float vb, uint32_t ib) {
    return va > vb || (va == vb && ia < ib) || (vb != vb && va == va);
}

/* (v, i) := the better of (v, i) and (ov, oi); UINT32_MAX marks none. */
static __device__ __forceinline__ void take_better(float &v, uint32_t &i, float ov, uint32_t oi) {
    if (oi != UINT32_MAX && (i == UINT32_MAX || better(ov, oi, v, i))) {
        v = ov;
        i = oi;
    }
}

static __device__ __forceinline__ void warp_best(float &v, uint32_t &i) {
    for (int o = 16; o > 0; o >>= 1) take_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

/* Block (p, row): the best of part p of the row (ARGMAX_PARTS parts) into
 * part[row][p] as (value, id bits). One block a row took 64 us for a
 * 128,256-entry vocabulary on the H100 (ncu, 2026-11-26): a sixtieth of a
 * decode step. */
static __global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_part_kernel(const float *logits, uint32_t vocab, float2 *part) {
    dj_pdl_release();
    dj_pdl_wait();
    __shared__ float s_v[ARGMAX_THREADS / 32];
    __shared__ uint32_t s_i[ARGMAX_THREADS / 32];
    const float *row = logits + (size_t)blockIdx.y * vocab;
    const uint32_t chunk = (vocab + ARGMAX_PARTS - 1) / ARGMAX_PARTS, lo = blockIdx.x * chunk;
    const uint32_t hi = lo + chunk < vocab ? lo + chunk : vocab;
    float bv = -INFINITY;
    uint32_t bi = UINT32_MAX;
    for (uint32_t j = lo + threadIdx.x; j < hi; j += blockDim.x) take_better(bv, bi, row[j], j);
    warp_best(bv, bi);
    if ((threadIdx.x & 31) == 0) {
        s_v[threadIdx.x >> 5] = bv;
        s_i[threadIdx.x >> 5] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (unsigned w = 1; w < blockDim.x / 32; w++) take_better(bv, bi, s_v[w], s_i[w]);
        part[(size_t)blockIdx.y * ARGMAX_PARTS + blockIdx.x] = make_float2(bv, __uint_as_float(bi));
    }
}

/* Warp per row: the best of its parts. */
static __global__ void argmax_final_kernel(const float2 *part, int32_t *out) {
    dj_pdl_release();
    dj_pdl_wait();
    const float2 p = part[(size_t)blockIdx.x * ARGMAX_PARTS + threadIdx.x];
    float bv = p.x;
    uint32_t bi = __float_as_uint(p.y);
    warp_best(bv, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bi == UINT32_MAX || !(bv == bv) ? 0 : (int32_t)bi;
}

static_assert(ARGMAX_PARTS == 32, "the final pass reads one part a lane");

dj_status dj__cuda_argmax(dj_cuda_backend *cb, const float *logits, uint32_t n, uint32_t vocab, int32_t *out) {
    float *scratch = NULL;
    dj_status st = dj__cuda_scratch(cb, (size_t)n * ARGMAX_PARTS * 2, &scratch);
    if (st != DJ_OK) return st;
    float2 *part = (float2 *)scratch;
    DJ_CU(cb, dj__launch(cb, argmax_part_kernel, dim3(ARGMAX_PARTS, n), dim3(ARGMAX_THREADS), 0, logits, vocab, part));
    DJ_CU(cb, dj__launch(cb, argmax_final_kernel, dim3(n), dim3(32), 0, (const float2 *)part, out));
    return DJ_OK;
}

dj_status dj__cuda_silu_mul(dj_cuda_backend *cb, const dj_op_call *c) {
    const size_t count = (size_t)c->n * c->d;
    const bool vec = dj_glu_vec(c->x, c->x2, c->out, count);
    dj__launch(cb, silu_mul_kernel, dim3(ew_blocks(cb, vec ? count / 8 : count)), dim3(EW_THREADS), 0,
               (const __nv_bfloat16 *)c->x, (const __nv_bfloat16 *)c->x2, (__nv_bfloat16 *)c->out, count, vec);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

template <typename TA>
static void launch_add(dj_cuda_backend *cb, const dj_op_call *c) {
    const size_t count = (size_t)c->n * c->d;
    const unsigned blocks = ew_blocks(cb, count);
    const TA *a = (const TA *)c->x;
    const __nv_bfloat16 *b = (const __nv_bfloat16 *)c->x2;
    if (c->out_dtype == DJ_DTYPE_F32)
        dj__launch(cb, add_kernel<TA, float>, dim3(blocks), dim3(EW_THREADS), 0, a, b, (float *)c->out, count);
    else
        dj__launch(cb, add_kernel<TA, __nv_bfloat16>, dim3(blocks), dim3(EW_THREADS), 0, a, b,
                   (__nv_bfloat16 *)c->out, count);
}

dj_status dj__cuda_add(dj_cuda_backend *cb, const dj_op_call *c) {
    if (c->x_dtype == DJ_DTYPE_F32)
        launch_add<float>(cb, c);
    else
        launch_add<__nv_bfloat16>(cb, c);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
