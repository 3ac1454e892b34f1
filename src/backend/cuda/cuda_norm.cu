/* cuda_norm.cu: RMSNorm as LlamaRMSNorm in f32 - one block per row, or one
 * warp per d-wide group of a row (per-head q/k norm, d <= NORM_WARP_D: each
 * group is a row of its own), the sum of squares reduced in
 * f32, out = (w + w_offset) * (x * rsqrt(mean(x^2) + eps)) in bf16
 * from x in bf16 or f32 (the residual stream); and the residual ADD fused in
 * front of it (one pass over the row). */
#include "backend/cuda/cuda_impl.h"

#define NORM_THREADS 256 /* the per-head (warp a group) kernel */
/* Whole rows: one block of 1024 threads a row, whatever the rows (so a row's
 * bits do not depend on its batch). H100: decode 0.8-1.5% faster than with
 * 256 (2026-11-26); prefill 2048 rows, in the step (tools/ktrace.c,
 * 2026-11-27): ADD+RMSNORM 39.5 -> 36.5 us at d 4096, Gemma 2's norm-add-norm
 * 76.6 -> 53.3 us at d 3584 (512 threads: 39.7 and 49.3; 256 ran before). */
#define NORM_ROW_THREADS 1024

/* The block's sum of each thread's s (warp shuffles, then thread 0 over the
 * warps in order) and 1 / rms: every whole-row norm reduces through here,
 * so fused and separate launches give the same bits. */
static __device__ __forceinline__ float block_inv_rms(float s, uint32_t d, float eps) {
    __shared__ float part[NORM_ROW_THREADS / 32];
    __shared__ float inv_rms;
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        float t = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        if (threadIdx.x == 0) inv_rms = 1.0f / sqrtf(t / (float)d + eps);
    }
    __syncthreads();
    const float r = inv_rms;
    __syncthreads(); /* part and inv_rms may be used again */
    return r;
}

template <typename TX, typename TW>
static __global__ void rmsnorm_kernel(const TX *x, const TW *w, __nv_bfloat16 *out, uint32_t d, float eps,
                                      float w_off) {
    dj_pdl_release();
    dj_pdl_wait();
    const TX *xr = x + (size_t)blockIdx.x * d;
    __nv_bfloat16 *orow = out + (size_t)blockIdx.x * d;
    float s = 0.0f;
    for (uint32_t j = threadIdx.x; j < d; j += blockDim.x) {
        const float v = dj_ld(xr, j);
        s += v * v;
    }
    const float r = block_inv_rms(s, d, eps);
    for (uint32_t j = threadIdx.x; j < d; j += blockDim.x)
        orow[j] = __float2bfloat16((dj_ld(w, j) + w_off) * (dj_ld(xr, j) * r));
}

/* Per-head groups of at most NORM_WARP_D values, one warp each,
 * NORM_THREADS / 32 a block: a block per 128-wide head left most of its
 * threads idle behind two barriers (Qwen3's q_norm over 2048 x 32 heads took
 * longer than the attention norm of the same rows). Whole rows keep
 * rmsnorm_kernel, whose order of summation the fused ADD+RMSNORM repeats. */
#define NORM_WARP_D 512
template <typename TX, typename TW>
static __global__ void rmsnorm_warp_kernel(const TX *x, const TW *w, __nv_bfloat16 *out, uint32_t rows, uint32_t d,
                                           float eps, float w_off) {
    dj_pdl_release();
    dj_pdl_wait();
    const uint32_t row = blockIdx.x * (NORM_THREADS / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows) return;
    const TX *xr = x + (size_t)row * d;
    __nv_bfloat16 *orow = out + (size_t)row * d;
    float s = 0.0f;
    for (uint32_t j = lane; j < d; j += 32) {
        const float v = dj_ld(xr, j);
        s += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float r = 1.0f / sqrtf(s / (float)d + eps);
    for (uint32_t j = lane; j < d; j += 32) orow[j] = __float2bfloat16((dj_ld(w, j) + w_off) * (dj_ld(xr, j) * r));
}

template <typename TX, typename TW>
static void rmsnorm_rows(dj_cuda_backend *cb, const TX *x, const TW *w, __nv_bfloat16 *out, unsigned rows,
                         const dj_op_call *c) {
    if (c->groups > 1 && c->d <= NORM_WARP_D)
        dj__launch(cb, rmsnorm_warp_kernel<TX, TW>, dim3((rows + NORM_THREADS / 32 - 1) / (NORM_THREADS / 32)),
                   dim3(NORM_THREADS), 0, x, w, out, (uint32_t)rows, c->d, c->eps, c->w_offset);
    else
        dj__launch(cb, rmsnorm_kernel<TX, TW>, dim3(rows),
                   dim3(NORM_ROW_THREADS), 0, x, w, out, c->d, c->eps,
                   c->w_offset);
}

template <typename TX>
static void launch_rmsnorm(dj_cuda_backend *cb, const dj_op_call *c) {
    const TX *x = (const TX *)c->x;
    __nv_bfloat16 *out = (__nv_bfloat16 *)c->out;
    /* groups (per-head q/k norm): each d-wide piece of a row is a row of its own */
    const unsigned rows = c->n * (c->groups > 1 ? c->groups : 1u);
    switch (c->w_dtype) {
    case DJ_DTYPE_BF16:
        rmsnorm_rows(cb, x, (const __nv_bfloat16 *)c->w, out, rows, c);
        break;
    case DJ_DTYPE_F16:
        rmsnorm_rows(cb, x, (const __half *)c->w, out, rows, c);
        break;
    default:
        rmsnorm_rows(cb, x, (const float *)c->w, out, rows, c);
        break;
    }
}

dj_status dj__cuda_rmsnorm(dj_cuda_backend *cb, const dj_op_call *c) {
    if (c->x_dtype == DJ_DTYPE_F32)
        launch_rmsnorm<float>(cb, c);
    else
        launch_rmsnorm<__nv_bfloat16>(cb, c);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

/* As rmsnorm_kernel on h = TH(a + b), which is also stored to hout; the
 * same threads, order of summation and roundings, so the results equal the
 * ADD and RMSNORM launched apart. a and h are the residual stream (TH: bf16
 * or f32), b is a bf16 activation. Thread t holds h of columns t + 1024i,
 * i < PER, in registers: every load of a and b is issued before any store
 * (nothing proves the pointers apart, so a store would hold back the loads
 * after it). Each element is read and written by one thread only, reads
 * first, so out and hout may be a or b. */
template <typename TH>
static __device__ __forceinline__ float residual_sum(const TH *a, const __nv_bfloat16 *b, size_t i);
template <>
__device__ __forceinline__ float residual_sum(const __nv_bfloat16 *a, const __nv_bfloat16 *b, size_t i) {
    return __bfloat162float(__float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i])));
}
template <>
__device__ __forceinline__ float residual_sum(const float *a, const __nv_bfloat16 *b, size_t i) {
    return a[i] + __bfloat162float(b[i]);
}
/* The same sum of a value a of the stream and a bf16 value b (as a float). */
template <typename TH>
static __device__ __forceinline__ float residual_add(float a, float b);
template <>
__device__ __forceinline__ float residual_add<__nv_bfloat16>(float a, float b) {
    return __bfloat162float(__float2bfloat16(a + b));
}
template <>
__device__ __forceinline__ float residual_add<float>(float a, float b) {
    return a + b;
}

/* A norm in front (Gemma's sandwich: the attention's or MLP's output b is
 * normed before it joins the residual): b' = RMSNORM(b) with the weights pw,
 * stored to pre.out and added in its place; b is then pre.x. PRE false:
 * pre unused. */
struct pre_norm {
    const void *x; /* bf16 rows */
    const void *w;
    __nv_bfloat16 *out;
    float eps, w_off;
};

template <typename TH, typename TW, int PER, bool PRE, int T>
static __global__ void __launch_bounds__(T)
    add_rmsnorm_kernel(const TH *a, const __nv_bfloat16 *b, TH *hout, const TW *__restrict__ w, __nv_bfloat16 *out,
                       uint32_t d, float eps, float w_off, pre_norm pre) {
    dj_pdl_release();
    float wv[PER], pwv[PER]; /* the norms' weights: constant, so loaded before the wait */
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const uint32_t j = threadIdx.x + i * T;
        wv[i] = j < d ? dj_ld(w, j) + w_off : 0.0f;
        if constexpr (PRE) pwv[i] = j < d ? dj_ld((const TW *)pre.w, j) + pre.w_off : 0.0f;
    }
    dj_pdl_wait();
    const size_t row = (size_t)blockIdx.x * d;
    float h[PER]; /* already rounded to TH */
    float s = 0.0f;
    if constexpr (PRE) {
        float av[PER], bv[PER];
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const uint32_t j = threadIdx.x + i * T;
            av[i] = j < d ? dj_ld(a, row + j) : 0.0f;
            bv[i] = j < d ? __bfloat162float(b[row + j]) : 0.0f;
        }
        float sb = 0.0f;
#pragma unroll
        for (int i = 0; i < PER; i++)
            if (threadIdx.x + i * T < d) sb += bv[i] * bv[i];
        const float rb = block_inv_rms(sb, d, pre.eps);
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const uint32_t j = threadIdx.x + i * T;
            const __nv_bfloat16 nb = __float2bfloat16(pwv[i] * (bv[i] * rb));
            if (j < d) pre.out[row + j] = nb;
            h[i] = j < d ? residual_add<TH>(av[i], __bfloat162float(nb)) : 0.0f;
        }
    } else {
#pragma unroll
        for (int i = 0; i < PER; i++) {
            const uint32_t j = threadIdx.x + i * T;
            h[i] = j < d ? residual_sum(a, b, row + j) : 0.0f;
        }
    }
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const float v = h[i];
        if (threadIdx.x + i * T < d) s += v * v;
    }
    const float r = block_inv_rms(s, d, eps);
#pragma unroll
    for (int i = 0; i < PER; i++) {
        const uint32_t j = threadIdx.x + i * T;
        if (j < d) {
            dj_st(hout, row + j, h[i]);
            out[row + j] = __float2bfloat16(wv[i] * (h[i] * r));
        }
    }
}

template <typename TH, int PER, bool PRE, int T>
static void launch_add_rmsnorm(dj_cuda_backend *cb, const dj_op_call *add, const dj_op_call *norm, pre_norm pre) {
    const TH *a = (const TH *)add->x;
    /* with the norm in front, the bf16 rows it norms (their normed values are add.x2) */
    const __nv_bfloat16 *b = (const __nv_bfloat16 *)(PRE ? pre.x : add->x2);
    TH *h = (TH *)add->out;
    __nv_bfloat16 *out = (__nv_bfloat16 *)norm->out;
    switch (norm->w_dtype) {
    case DJ_DTYPE_BF16:
        dj__launch(cb, add_rmsnorm_kernel<TH, __nv_bfloat16, PER, PRE, T>, dim3(norm->n), dim3(T), 0, a, b,
                   h, (const __nv_bfloat16 *)norm->w, out, norm->d, norm->eps, norm->w_offset, pre);
        break;
    case DJ_DTYPE_F16:
        dj__launch(cb, add_rmsnorm_kernel<TH, __half, PER, PRE, T>, dim3(norm->n), dim3(T), 0, a, b, h,
                   (const __half *)norm->w, out, norm->d, norm->eps, norm->w_offset, pre);
        break;
    default:
        dj__launch(cb, add_rmsnorm_kernel<TH, float, PER, PRE, T>, dim3(norm->n), dim3(T), 0, a, b, h,
                   (const float *)norm->w, out, norm->d, norm->eps, norm->w_offset, pre);
        break;
    }
}

/* NORM_ROW_THREADS threads a row, PER values each (the smallest PER that
 * covers d). */
template <typename TH, bool PRE>
static void launch_add_rmsnorm_d(dj_cuda_backend *cb, const dj_op_call *add, const dj_op_call *norm, pre_norm pre) {
    static_assert(DJ_FUSE_MAX_D <= 16 * NORM_ROW_THREADS, "rows fit");
    const uint32_t d = norm->d;
    if (d <= 4 * NORM_ROW_THREADS)
        launch_add_rmsnorm<TH, 4, PRE, NORM_ROW_THREADS>(cb, add, norm, pre);
    else if (d <= 8 * NORM_ROW_THREADS)
        launch_add_rmsnorm<TH, 8, PRE, NORM_ROW_THREADS>(cb, add, norm, pre);
    else
        launch_add_rmsnorm<TH, 16, PRE, NORM_ROW_THREADS>(cb, add, norm, pre);
}

dj_status dj__cuda_add_rmsnorm(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                               const dj_op_call *norm) {
    const pre_norm pre = {prenorm ? prenorm->x : NULL, prenorm ? prenorm->w : NULL,
                          prenorm ? (__nv_bfloat16 *)prenorm->out : NULL,
                          prenorm ? prenorm->eps : 0.0f, prenorm ? prenorm->w_offset : 0.0f};
    if (add->out_dtype == DJ_DTYPE_F32) {
        if (prenorm)
            launch_add_rmsnorm_d<float, true>(cb, add, norm, pre);
        else
            launch_add_rmsnorm_d<float, false>(cb, add, norm, pre);
    } else {
        if (prenorm)
            launch_add_rmsnorm_d<__nv_bfloat16, true>(cb, add, norm, pre);
        else
            launch_add_rmsnorm_d<__nv_bfloat16, false>(cb, add, norm, pre);
    }
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
