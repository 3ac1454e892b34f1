/* cuda_norm.cu: RMSNorm as LlamaRMSNorm in f32 - one block per row, or one
 * warp per d-wide group of a row (per-head q/k norm, d <= NORM_WARP_D: each
 * group is a row of its own), the sum of squares reduced in
 * f32, out = (w + w_offset) * (x * rsqrt(mean(x^2) + eps)) in bf16
 * from x in bf16 or f32 (the residual stream); and the residual ADD fused in
 * front of it (one pass over the row). */
#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/quant_group.cuh"

#define NORM_THREADS 256 /* the per-head (warp a group) kernel */
/* Whole rows: one block of NORM_ROW_THREADS threads a row, whatever the rows
 * (so a row's bits do not depend on its batch); thread t holds the values
 * (c * NORM_ROW_THREADS + t) * NORM_VEC + v, v < NORM_VEC, of chunks c = 0,
 * 1, ... - one 16-byte load of a bf16 row a chunk - and sums their squares in
 * that order. The kernel before took column t + 1024 i a thread, a 2-byte
 * load each, a block of 1024 threads a row - with Gemma's norm in front (39
 * registers) one row in flight an SM. H100, prefill 2048 in the step
 * (bench/RESULTS.md, 2026-11-27): Gemma 2's norm-add-norm 53.3 -> 36.2 us,
 * Llama's ADD+RMSNORM 36.5 -> 34.6 us (both now about their bytes at the
 * copy rate: an f32 stream read and written, a bf16 row read, one or two
 * written); Gemma-2-9B prefill 0.0662 -> 0.0633-0.0649 s; decode unchanged.
 * 512 threads measured the same. */
#define NORM_ROW_THREADS 256
#define NORM_VEC 8

/* NORM_VEC consecutive values of type T as raw bits: one 16-byte word for
 * 16-bit types, two for f32. */
template <typename T> struct raw8 {
    uint4 u[sizeof(T) / 2];
};

static __device__ __forceinline__ uint32_t word_of(const uint4 &u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

/* Value v of r, exactly as dj_ld reads it. */
static __device__ __forceinline__ float raw_get(const raw8<__nv_bfloat16> &r, int v) {
    const uint32_t w = word_of(r.u[0], v >> 1);
    return __uint_as_float(v & 1 ? w & 0xffff0000u : w << 16);
}
static __device__ __forceinline__ float raw_get(const raw8<__half> &r, int v) {
    const uint32_t w = word_of(r.u[0], v >> 1);
    return __half2float(__ushort_as_half((unsigned short)(v & 1 ? w >> 16 : w & 0xffffu)));
}
static __device__ __forceinline__ float raw_get(const raw8<float> &r, int v) {
    return __uint_as_float(word_of(r.u[v >> 2], v & 3));
}

/* Values e .. e + NORM_VEC - 1 of row p (those at or past d are 0): one
 * 16-byte load a word when vec (p 16-byte aligned, d a multiple of
 * NORM_VEC), else a load a value. */
template <typename T>
static __device__ __forceinline__ raw8<T> ld_raw8(const T *p, uint32_t e, uint32_t d, bool vec) {
    constexpr int W = (int)sizeof(T) / 2;
    raw8<T> r;
    if (vec && e + NORM_VEC <= d) {
#pragma unroll
        for (int i = 0; i < W; i++) r.u[i] = ((const uint4 *)(p + e))[i];
        return r;
    }
    uint32_t w[4 * W];
#pragma unroll
    for (int i = 0; i < 4 * W; i++) w[i] = 0;
#pragma unroll
    for (int v = 0; v < NORM_VEC; v++)
        if (e + v < d) {
            if constexpr (sizeof(T) == 4)
                w[v] = ((const uint32_t *)p)[e + v];
            else
                w[v >> 1] |= (uint32_t)((const uint16_t *)p)[e + v] << (16 * (v & 1));
        }
#pragma unroll
    for (int i = 0; i < W; i++) r.u[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
    return r;
}

/* Values e .. of row p from f (rounded as dj_st rounds), those before d. */
static __device__ __forceinline__ void st8(__nv_bfloat16 *p, uint32_t e, uint32_t d, bool vec,
                                           const float (&f)[NORM_VEC]) {
    if (vec && e + NORM_VEC <= d) {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
            w[i] = *(const uint32_t *)&h;
        }
        *(uint4 *)(p + e) = make_uint4(w[0], w[1], w[2], w[3]);
        return;
    }
#pragma unroll
    for (int v = 0; v < NORM_VEC; v++)
        if (e + v < d) dj_st(p, e + v, f[v]);
}
static __device__ __forceinline__ void st8(float *p, uint32_t e, uint32_t d, bool vec, const float (&f)[NORM_VEC]) {
    if (vec && e + NORM_VEC <= d) {
        ((float4 *)(p + e))[0] = make_float4(f[0], f[1], f[2], f[3]);
        ((float4 *)(p + e))[1] = make_float4(f[4], f[5], f[6], f[7]);
        return;
    }
#pragma unroll
    for (int v = 0; v < NORM_VEC; v++)
        if (e + v < d) p[e + v] = f[v];
}

/* The first value of thread t's chunk c. */
static __device__ __forceinline__ uint32_t chunk_at(uint32_t c) {
    return (c * NORM_ROW_THREADS + threadIdx.x) * NORM_VEC;
}

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
static __global__ void __launch_bounds__(NORM_ROW_THREADS)
    rmsnorm_kernel(const TX *x, const TW *w, __nv_bfloat16 *out, uint32_t d, float eps, float w_off, bool vec) {
    dj_pdl_release();
    dj_pdl_wait();
    const TX *xr = x + (size_t)blockIdx.x * d;
    __nv_bfloat16 *orow = out + (size_t)blockIdx.x * d;
    float s = 0.0f;
    for (uint32_t c = 0; chunk_at(c) < d; c++) {
        const raw8<TX> xv = ld_raw8(xr, chunk_at(c), d, vec);
#pragma unroll
        for (int v = 0; v < NORM_VEC; v++)
            if (chunk_at(c) + v < d) {
                const float f = raw_get(xv, v);
                s += f * f;
            }
    }
    const float r = block_inv_rms(s, d, eps);
    for (uint32_t c = 0; chunk_at(c) < d; c++) {
        const uint32_t e = chunk_at(c);
        const raw8<TX> xv = ld_raw8(xr, e, d, vec);
        const raw8<TW> wv = ld_raw8(w, e, d, vec);
        float o[NORM_VEC];
#pragma unroll
        for (int v = 0; v < NORM_VEC; v++) o[v] = (raw_get(wv, v) + w_off) * (raw_get(xv, v) * r);
        st8(orow, e, d, vec, o);
    }
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

/* 16-byte loads and stores (ld_raw8, st8) for rows of d values at these
 * pointers (NULL: unused). */
static bool norm_vec(uint32_t d, const void *p0, const void *p1, const void *p2, const void *p3, const void *p4) {
    const uintptr_t any = (uintptr_t)p0 | (uintptr_t)p1 | (uintptr_t)p2 | (uintptr_t)p3 | (uintptr_t)p4;
    return d % NORM_VEC == 0 && any % 16 == 0;
}

template <typename TX, typename TW>
static void rmsnorm_rows(dj_cuda_backend *cb, const TX *x, const TW *w, __nv_bfloat16 *out, unsigned rows,
                         const dj_op_call *c) {
    if (c->groups > 1 && c->d <= NORM_WARP_D)
        dj__launch(cb, rmsnorm_warp_kernel<TX, TW>, dim3((rows + NORM_THREADS / 32 - 1) / (NORM_THREADS / 32)),
                   dim3(NORM_THREADS), 0, x, w, out, (uint32_t)rows, c->d, c->eps, c->w_offset);
    else
        dj__launch(cb, rmsnorm_kernel<TX, TW>, dim3(rows), dim3(NORM_ROW_THREADS), 0, x, w, out, c->d, c->eps,
                   c->w_offset, norm_vec(c->d, x, w, out, NULL, NULL));
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
 * or f32), b is a bf16 activation. Thread t holds h of its C chunks in
 * registers: every load of a and b is issued before any store (nothing
 * proves the pointers apart, so a store would hold back the loads after it).
 * Each value is read and written by one thread only, reads first, so out and
 * hout may be a or b. */
/* The sum of a value a of the stream and a bf16 value b (as a float), as the ADD rounds it. */
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

template <typename TH, typename TW, int C, bool PRE>
static __global__ void __launch_bounds__(NORM_ROW_THREADS)
    add_rmsnorm_kernel(const TH *a, const __nv_bfloat16 *b, TH *hout, const TW *__restrict__ w, __nv_bfloat16 *out,
                       uint32_t d, float eps, float w_off, pre_norm pre, bool vec, dj_norm_q8 q8) {
    dj_pdl_release();
    raw8<TW> wv[C], pwv[C]; /* the norms' weights: constant, so loaded before the wait */
#pragma unroll
    for (int c = 0; c < C; c++) {
        wv[c] = ld_raw8(w, chunk_at(c), d, vec);
        if constexpr (PRE) pwv[c] = ld_raw8((const TW *)pre.w, chunk_at(c), d, vec);
    }
    dj_pdl_wait();
    const size_t row = (size_t)blockIdx.x * d;
    raw8<TH> av[C];
    raw8<__nv_bfloat16> bv[C];
#pragma unroll
    for (int c = 0; c < C; c++) {
        av[c] = ld_raw8(a + row, chunk_at(c), d, vec);
        bv[c] = ld_raw8(b + row, chunk_at(c), d, vec);
    }
    float h[C][NORM_VEC]; /* already rounded to TH */
    if constexpr (PRE) {
        float sb = 0.0f;
#pragma unroll
        for (int c = 0; c < C; c++)
#pragma unroll
            for (int v = 0; v < NORM_VEC; v++)
                if (chunk_at(c) + v < d) {
                    const float f = raw_get(bv[c], v);
                    sb += f * f;
                }
        const float rb = block_inv_rms(sb, d, pre.eps);
#pragma unroll
        for (int c = 0; c < C; c++) {
            float nb[NORM_VEC];
#pragma unroll
            for (int v = 0; v < NORM_VEC; v++) {
                nb[v] = __bfloat162float(
                    __float2bfloat16((raw_get(pwv[c], v) + pre.w_off) * (raw_get(bv[c], v) * rb)));
                h[c][v] = residual_add<TH>(raw_get(av[c], v), nb[v]);
            }
            st8(pre.out + row, chunk_at(c), d, vec, nb);
        }
    } else {
#pragma unroll
        for (int c = 0; c < C; c++)
#pragma unroll
            for (int v = 0; v < NORM_VEC; v++) h[c][v] = residual_add<TH>(raw_get(av[c], v), raw_get(bv[c], v));
    }
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < C; c++)
#pragma unroll
        for (int v = 0; v < NORM_VEC; v++)
            if (chunk_at(c) + v < d) s += h[c][v] * h[c][v];
    const float r = block_inv_rms(s, d, eps);
#pragma unroll
    for (int c = 0; c < C; c++) {
        float o[NORM_VEC];
#pragma unroll
        for (int v = 0; v < NORM_VEC; v++) o[v] = (raw_get(wv[c], v) + w_off) * (h[c][v] * r);
        st8(hout + row, chunk_at(c), d, vec, h[c]);
        if (!q8.codes_only) st8(out + row, chunk_at(c), d, vec, o);
        if (q8.q) { /* the bf16 output's codes: a half warp holds a group of 128 channels (d % 128 == 0, vec) */
            float f[NORM_VEC];
#pragma unroll
            for (int v = 0; v < NORM_VEC; v++) f[v] = __bfloat162float(__float2bfloat16(o[v]));
            const uint32_t e = chunk_at(c), gi = e / 128;
            const size_t si = q8.tok_major ? (size_t)blockIdx.x * (d / 128) + gi
                                           : (size_t)gi * dj__f8_scale_ld(gridDim.x) + blockIdx.x;
            quant_group(f, e < d, q8.q + row + e, q8.sc + si, threadIdx.x & 15);
        }
    }
}

template <typename TH, int C, bool PRE>
static void launch_add_rmsnorm(dj_cuda_backend *cb, const dj_op_call *add, const dj_op_call *norm, pre_norm pre,
                               bool vec, dj_norm_q8 q8) {
    const TH *a = (const TH *)add->x;
    /* with the norm in front, the bf16 rows it norms (their normed values are add.x2) */
    const __nv_bfloat16 *b = (const __nv_bfloat16 *)(PRE ? pre.x : add->x2);
    TH *h = (TH *)add->out;
    __nv_bfloat16 *out = (__nv_bfloat16 *)norm->out;
    switch (norm->w_dtype) {
    case DJ_DTYPE_BF16:
        dj__launch(cb, add_rmsnorm_kernel<TH, __nv_bfloat16, C, PRE>, dim3(norm->n), dim3(NORM_ROW_THREADS), 0, a,
                   b, h, (const __nv_bfloat16 *)norm->w, out, norm->d, norm->eps, norm->w_offset, pre, vec, q8);
        break;
    case DJ_DTYPE_F16:
        dj__launch(cb, add_rmsnorm_kernel<TH, __half, C, PRE>, dim3(norm->n), dim3(NORM_ROW_THREADS), 0, a, b, h,
                   (const __half *)norm->w, out, norm->d, norm->eps, norm->w_offset, pre, vec, q8);
        break;
    default:
        dj__launch(cb, add_rmsnorm_kernel<TH, float, C, PRE>, dim3(norm->n), dim3(NORM_ROW_THREADS), 0, a, b, h,
                   (const float *)norm->w, out, norm->d, norm->eps, norm->w_offset, pre, vec, q8);
        break;
    }
}

/* C chunks a thread: the fewest that cover d. */
template <typename TH, bool PRE>
static void launch_add_rmsnorm_d(dj_cuda_backend *cb, const dj_op_call *add, const dj_op_call *norm, pre_norm pre,
                                 bool vec, dj_norm_q8 q8) {
    constexpr uint32_t row = NORM_ROW_THREADS * NORM_VEC; /* values of one chunk of every thread */
    static_assert(DJ_FUSE_MAX_D <= 8 * row, "rows fit in 8 chunks");
    const uint32_t d = norm->d;
    if (d <= row)
        launch_add_rmsnorm<TH, 1, PRE>(cb, add, norm, pre, vec, q8);
    else if (d <= 2 * row)
        launch_add_rmsnorm<TH, 2, PRE>(cb, add, norm, pre, vec, q8);
    else if (d <= 4 * row)
        launch_add_rmsnorm<TH, 4, PRE>(cb, add, norm, pre, vec, q8);
    else
        launch_add_rmsnorm<TH, 8, PRE>(cb, add, norm, pre, vec, q8);
}

dj_status dj__cuda_add_rmsnorm(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                               const dj_op_call *norm, const dj_norm_q8 *q8) {
    const pre_norm pre = {prenorm ? prenorm->x : NULL, prenorm ? prenorm->w : NULL,
                          prenorm ? (__nv_bfloat16 *)prenorm->out : NULL,
                          prenorm ? prenorm->eps : 0.0f, prenorm ? prenorm->w_offset : 0.0f};
    const bool vec = norm_vec(norm->d, add->x, prenorm ? pre.x : add->x2, add->out, norm->out, norm->w) &&
                     norm_vec(norm->d, pre.w, pre.out, NULL, NULL, NULL);
    dj_norm_q8 q = {NULL, NULL, false, false};
    if (q8) { /* whole groups a half warp: 16-byte chunks, 128 channels a group */
        if (!vec || norm->d % 128 != 0 || ((uintptr_t)q8->q & 7u) != 0) return DJ_EUNSUPPORTED;
        q = *q8;
    }
    if (add->out_dtype == DJ_DTYPE_F32) {
        if (prenorm)
            launch_add_rmsnorm_d<float, true>(cb, add, norm, pre, vec, q);
        else
            launch_add_rmsnorm_d<float, false>(cb, add, norm, pre, vec, q);
    } else {
        if (prenorm)
            launch_add_rmsnorm_d<__nv_bfloat16, true>(cb, add, norm, pre, vec, q);
        else
            launch_add_rmsnorm_d<__nv_bfloat16, false>(cb, add, norm, pre, vec, q);
    }
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
