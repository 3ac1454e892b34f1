/* cuda_matmul.cu: out[n,m] = x[n,k] @ w[m,k]^T + bias with bf16 x, weights in
 * HF layout (no copies) and f32 accumulation:
 *  - one row (decode of one session; with f16/f32 weights up to 8 rows): a
 *    GEMV kernel - bound by reading the weights once;
 *    consecutive calls on the same x (q/k/v, gate/up) in a plan are
 *    launched as one (cuda_plan.cu), which also fills the GPU for the
 *    small k/v weights. One warp per weight row (two, each taking every
 *    other 256 columns, where one would leave the SMs half empty:
 *    gemv_split), 16-byte loads, 4 in flight per lane, any weight dtype.
 *    (Two streaming variants - all of a
 *    lane's loads issued before any FMA, L1 bypassed, two rows per warp -
 *    were within noise of it on the H100, 6.54 and 6.53 against 6.44
 *    ms/token, and were deleted for it: simpler, and no PTX cache hints.)
 *    With dj_backend.deterministic, calls of up to 256 rows run as GEMVs
 *    of 8 rows too, each row summed as if alone;
 *  - bf16 weights, more rows: cublasGemmEx (tensor cores, CUBLAS_COMPUTE_32F).
 *    The GEMV reads x once per 16 bytes of weights for every row, so its
 *    rows cost x traffic: on the H100 (bench/RESULTS.md, bench_serve) an
 *    8B model's step of 2 rows took 7.42 ms, 4 rows 10.55, 8 rows 19.07,
 *    where cuBLAS stepped 16 rows in 7.14 ms - hence one row only;
 *  - f16/f32 weights, larger n: a tiled f32 kernel (cuBLAS wants A and B of
 *    one type, and the activations are bf16).
 * out is bf16 (activations) or f32 (logits); bias of any float dtype.
 * f8_e4m3 weights go to cuda_matmul_fp8.cu (GEMV up to 8 rows, else tiles).
 * 4-bit weights (DJ_DTYPE_Q4): cuda_q4.cu, the tensor-core GEMV up to 32 rows. */
#include <limits.h>
#include <string.h>

#include "backend/cuda/cuda_impl.h"

#define GEMV_PRE 4 /* 16-byte weight loads a lane of the 16-bit GEMV issues before the PDL wait */
#define GEMV_MAX_ROWS 8  /* the kernel's capacity (the f16/f32-weight and deterministic paths) */
#define GEMV_BF16_ROWS 1 /* bf16 weights: rows the GEMV takes by default (more go to cuBLAS) */
#define GEMV_WARPS 8

/* Any float dtype at run time (bias). */
static __device__ __forceinline__ float ld_any(const void *p, int t, size_t i) {
    switch (t) {
    case DJ_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case DJ_DTYPE_F16: return __half2float(((const __half *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

/* 8 consecutive 16-bit values (one 16-byte load) widened to f32. */
static __device__ __forceinline__ void widen8(uint4 u, const __nv_bfloat16 *, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

static __device__ __forceinline__ void widen8(uint4 u, const __half *, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
        f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
    }
}

/* Up to DJ_GEMV_GROUP matmuls of one x in one launch: segment i owns blocks
 * [first_block[i], first_block[i+1]). */
struct gemv_segs {
    const void *w[DJ_GEMV_GROUP];
    const void *bias[DJ_GEMV_GROUP];
    void *out[DJ_GEMV_GROUP];
    uint32_t m[DJ_GEMV_GROUP];
    uint32_t first_block[DJ_GEMV_GROUP];
    uint32_t split[DJ_GEMV_GROUP]; /* warps a weight row (1 or 2: gemv_split) */
    int bias_dtype[DJ_GEMV_GROUP];
    int count;
};

/* Warps a weight row (16-bit weights, 16-byte loads) for a matmul of m rows
 * of k: two where one a row would leave the SMs under half the warps they
 * hold (GEMV_SM_WARPS), so twice the loads are in flight - each warp takes
 * every other 256 columns of the row and the pair's sums add in a fixed
 * order. From m, k and the device alone, so a row sums the same alone, in a
 * group and at every n. H100, Llama-3-8B shape (bench/RESULTS.md,
 * 2026-11-27): q/k/v 19.6 -> 18.0 us, o 14.1 -> 12.6, down 44.7 -> 41.1
 * (2.63 -> 2.86 TB/s), a decode layer 173.1 -> 167.0 us, decode b=1 5.76 ->
 * 5.60 ms. The FP8 GEMV split the same way gained 3 us a layer alone but
 * nothing end to end (3.63 against 3.63 ms, b=2 448 -> 437 tok/s): not
 * kept. */
#define GEMV_SM_WARPS 64
static uint32_t gemv_split(const dj_cuda_backend *cb, uint32_t m, uint32_t k) {
    return k >= 2048 && 2ull * m <= (unsigned long long)cb->n_sm * GEMV_SM_WARPS ? 2u : 1u;
}

/* Warps per weight row j of its segment (sg.split: 1, or 2 taking alternate
 * 256-column chunks of the row); rows r < n of x (NR >= n, a compile-time
 * bound). vec: 16-bit weights, k % 8 == 0 and 16-byte aligned x and every w
 * (split 1 otherwise). */
template <typename TW, typename TO, int NR>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kernel(const __nv_bfloat16 *x, gemv_segs sg, uint32_t n, uint32_t k, bool vec) {
    dj_pdl_release();
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int si = 0;
    while (si + 1 < sg.count && blockIdx.x >= sg.first_block[si + 1]) si++;
    const uint32_t m = sg.m[si], S = sg.split[si], part = warp % S; /* S: block-uniform */
    const uint32_t j = (blockIdx.x - sg.first_block[si]) * (GEMV_WARPS / S) + warp / S;
    if (S == 1 && j >= m) return;
    const bool live = j < m; /* S 2: every warp reaches the pair's barrier */
    const TW *wr = (const TW *)sg.w[si] + (size_t)(live ? j : 0) * k;
    /* the warp's 256-column chunks: part, part + S, ... (column lane*8 of each) */
    const uint32_t k0 = lane * 8 + 256u * part, step_k = 256u * S;
    /* weights are constant: a 16-bit row's first GEMV_PRE loads go out before the wait */
    uint4 pre[GEMV_PRE];
    if constexpr (sizeof(TW) == 2) {
#pragma unroll
        for (int p = 0; p < GEMV_PRE; p++)
            if (live && vec && k0 + step_k * p < k) pre[p] = *(const uint4 *)(wr + k0 + step_k * p);
    }
    dj_pdl_wait();
    const void *bias = sg.bias[si];
    const int bias_dtype = sg.bias_dtype[si];
    TO *out = (TO *)sg.out[si];
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    bool done = !live;
    if constexpr (sizeof(TW) == 2) {
        if (vec && live) {
            auto step = [&](uint4 u, uint32_t kk) {
                float wf[8];
                widen8(u, wr, wf);
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    if ((uint32_t)r < n) {
                        float xf[8];
                        widen8(*(const uint4 *)(x + (size_t)r * k + kk), x, xf);
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[r] += wf[e] * xf[e];
                    }
                }
            };
#pragma unroll
            for (int p = 0; p < GEMV_PRE; p++)
                if (k0 + step_k * p < k) step(pre[p], k0 + step_k * p);
#pragma unroll 4
            for (uint32_t kk = k0 + step_k * GEMV_PRE; kk < k; kk += step_k) step(*(const uint4 *)(wr + kk), kk);
            done = true;
        }
    }
    for (uint32_t kk = lane; !done && kk < k; kk += 32) { /* split 1 here */
        const float wf = dj_ld(wr, kk);
#pragma unroll
        for (int r = 0; r < NR; r++)
            if ((uint32_t)r < n) acc[r] += wf * __bfloat162float(x[(size_t)r * k + kk]);
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if (S == 2) { /* the pair's sums: part 0's, then part 1's */
        __shared__ float pair_sum[GEMV_WARPS][NR];
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < NR; r++) pair_sum[warp][r] = acc[r];
        __syncthreads();
        if (part != 0 || !live) return;
#pragma unroll
        for (int r = 0; r < NR; r++) acc[r] = pair_sum[warp][r] + pair_sum[warp + 1][r];
    }
    if (lane == 0) {
        const float b = bias ? ld_any(bias, bias_dtype, j) : 0.0f;
#pragma unroll
        for (int r = 0; r < NR; r++)
            if ((uint32_t)r < n) dj_st(out, (size_t)r * m + j, acc[r] + b);
    }
}

/* Tiled GEMM for weights cuBLAS cannot pair with bf16 x: a 64x64 output tile
 * per block, 4x4 per thread, k in steps of 16 through shared memory. */
#define TG 64
#define TK 16
template <typename TW, typename TO>
static __global__ void __launch_bounds__(256)
    gemm_tiled_kernel(const __nv_bfloat16 *x, const TW *w, const void *bias, int bias_dtype, TO *out, uint32_t n,
                      uint32_t k, uint32_t m) {
    __shared__ float xs[TG][TK + 1], ws[TG][TK + 1];
    const uint32_t tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const uint32_t row0 = blockIdx.y * TG, col0 = blockIdx.x * TG;
    float acc[4][4] = {};
    for (uint32_t k0 = 0; k0 < k; k0 += TK) {
        for (uint32_t e = threadIdx.x; e < TG * TK; e += blockDim.x) {
            const uint32_t r = e / TK, c = e % TK, kk = k0 + c;
            xs[r][c] = row0 + r < n && kk < k ? __bfloat162float(x[(size_t)(row0 + r) * k + kk]) : 0.0f;
            ws[r][c] = col0 + r < m && kk < k ? dj_ld(w, (size_t)(col0 + r) * k + kk) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TK; kk++) {
            float xv[4], wv[4];
#pragma unroll
            for (int a = 0; a < 4; a++) xv[a] = xs[ty + 16 * a][kk];
#pragma unroll
            for (int b = 0; b < 4; b++) wv[b] = ws[tx + 16 * b][kk];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) acc[a][b] += xv[a] * wv[b];
        }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const uint32_t r = row0 + ty + 16 * a;
        if (r >= n) continue;
#pragma unroll
        for (int b = 0; b < 4; b++) {
            const uint32_t cidx = col0 + tx + 16 * b;
            if (cidx < m) dj_st(out, (size_t)r * m + cidx, acc[a][b] + (bias ? ld_any(bias, bias_dtype, cidx) : 0.0f));
        }
    }
}

/* out[r, j] = acc[r, j] + bias[j], f32 accumulators to the output type. */
template <typename TO>
static __global__ void bias_out_kernel(const float *acc, const void *bias, int bias_dtype, TO *out, size_t count,
                                       uint32_t m) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dj_st(out, i, acc[i] + ld_any(bias, bias_dtype, i % m));
}

/* ---- launchers ---- */

/* The group's segments (vec: each its gemv_split warps a row, so a block
 * holds GEMV_WARPS / split rows; else one warp a row); returns the blocks of
 * the launch. */
static unsigned fill_segs(const dj_cuda_backend *cb, const dj_op_call *calls, int count, bool vec,
                          gemv_segs *sg /* OUT */) {
    memset(sg, 0, sizeof *sg);
    unsigned blocks = 0;
    for (int i = 0; i < count; i++) {
        sg->w[i] = calls[i].w;
        sg->bias[i] = calls[i].bias;
        sg->bias_dtype[i] = (int)calls[i].bias_dtype;
        sg->out[i] = calls[i].out;
        sg->m[i] = calls[i].m;
        sg->split[i] = vec ? gemv_split(cb, calls[i].m, calls[i].k) : 1u;
        sg->first_block[i] = blocks;
        const uint32_t rows = GEMV_WARPS / sg->split[i];
        blocks += (calls[i].m + rows - 1) / rows;
    }
    sg->count = count;
    return blocks;
}

/* The pending group (same x, n, k, weight and output dtypes) as one launch. */
template <typename TW, typename TO, int NR>
static void launch_gemv_nr(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    const dj_op_call *c = &calls[0];
    const __nv_bfloat16 *x = (const __nv_bfloat16 *)c->x;
    uintptr_t align = (uintptr_t)x;
    for (int i = 0; i < count; i++) align |= (uintptr_t)calls[i].w;
    const bool vec = sizeof(TW) == 2 && c->k % 8 == 0 && align % 16 == 0;
    gemv_segs sg;
    const unsigned blocks = fill_segs(cb, calls, count, vec, &sg);
    dj__launch(cb, gemv_kernel<TW, TO, NR>, dim3(blocks), dim3(GEMV_WARPS * 32), 0, x, sg, c->n, c->k, vec);
}

template <typename TW, typename TO>
static void launch_gemv(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    const uint32_t n = calls[0].n;
    if (n == 1)
        launch_gemv_nr<TW, TO, 1>(cb, calls, count);
    else if (n == 2)
        launch_gemv_nr<TW, TO, 2>(cb, calls, count);
    else if (n <= 4)
        launch_gemv_nr<TW, TO, 4>(cb, calls, count);
    else
        launch_gemv_nr<TW, TO, 8>(cb, calls, count);
}

template <typename TO>
static void launch_gemv_any(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    switch (calls[0].w_dtype) {
    case DJ_DTYPE_BF16: launch_gemv<__nv_bfloat16, TO>(cb, calls, count); break;
    case DJ_DTYPE_F16: launch_gemv<__half, TO>(cb, calls, count); break;
    default: launch_gemv<float, TO>(cb, calls, count); break;
    }
}

dj_status dj__cuda_gemv(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    if (calls[0].w_dtype == DJ_DTYPE_F8_E4M3) return dj__cuda_gemv_fp8(cb, calls, count);
    if (calls[0].w_dtype == DJ_DTYPE_Q4) return dj__cuda_gemv_q4(cb, calls, count);
    if (calls[0].out_dtype == DJ_DTYPE_F32)
        launch_gemv_any<float>(cb, calls, count);
    else
        launch_gemv_any<__nv_bfloat16>(cb, calls, count);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

template <typename TO>
static void launch_tiled(dj_cuda_backend *cb, const dj_op_call *c) {
    const dim3 grid((c->m + TG - 1) / TG, (c->n + TG - 1) / TG);
    const __nv_bfloat16 *x = (const __nv_bfloat16 *)c->x;
    TO *out = (TO *)c->out;
    const int bt = (int)c->bias_dtype;
    switch (c->w_dtype) {
    case DJ_DTYPE_BF16:
        gemm_tiled_kernel<<<grid, 256, 0, cb->stream>>>(x, (const __nv_bfloat16 *)c->w, c->bias, bt, out, c->n,
                                                        c->k, c->m);
        break;
    case DJ_DTYPE_F16:
        gemm_tiled_kernel<<<grid, 256, 0, cb->stream>>>(x, (const __half *)c->w, c->bias, bt, out, c->n, c->k,
                                                        c->m);
        break;
    default:
        gemm_tiled_kernel<<<grid, 256, 0, cb->stream>>>(x, (const float *)c->w, c->bias, bt, out, c->n, c->k, c->m);
        break;
    }
}

/* bf16 weights through cuBLAS. Column-major view: out^T[m,n] = w[k,m]^T x^T[k,n].
 * With a bias, cuBLAS writes f32 to scratch and one pass adds the bias and
 * rounds once. */
static dj_status gemm_cublas(dj_cuda_backend *cb, const dj_op_call *c) {
    const float alpha = 1.0f, beta = 0.0f;
    const int n = (int)c->n, k = (int)c->k, m = (int)c->m;
    const bool f32_out = c->out_dtype == DJ_DTYPE_F32;
    void *dst = c->out;
    if (c->bias) {
        float *acc = NULL;
        dj_status st = dj__cuda_scratch(cb, (size_t)c->n * c->m, &acc);
        if (st != DJ_OK) return st;
        dst = acc;
    }
    const cudaDataType_t dt = c->bias || f32_out ? CUDA_R_32F : CUDA_R_16BF;
    DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, c->w, CUDA_R_16BF, k, c->x,
                               CUDA_R_16BF, k, &beta, dst, dt, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (c->bias) {
        const size_t count = (size_t)c->n * c->m;
        size_t blocks = (count + 255) / 256, cap = (size_t)cb->n_sm * 16;
        if (blocks > cap) blocks = cap;
        if (f32_out)
            bias_out_kernel<<<(unsigned)blocks, 256, 0, cb->stream>>>((const float *)dst, c->bias,
                                                                      (int)c->bias_dtype, (float *)c->out, count, c->m);
        else
            bias_out_kernel<<<(unsigned)blocks, 256, 0, cb->stream>>>(
                (const float *)dst, c->bias, (int)c->bias_dtype, (__nv_bfloat16 *)c->out, count, c->m);
        DJ_CU_LAUNCHED(cb);
    }
    return DJ_OK;
}

/* The GEMV for one row (bf16 weights) or up to 8 (f16/f32), unless a path is forced. */
static bool gemv_path(const dj_cuda_backend *cb, const dj_op_call *c) {
    if (c->w_dtype == DJ_DTYPE_Q4) /* the tensor-core GEMV up to Q4_MMA_ROWS, on 4-byte aligned x and rows */
        return dj__cuda_q4_mma_takes(c) && (cb->matmul_path == 1 ? c->n <= GEMV_MAX_ROWS : cb->matmul_path != 2);
    const uint32_t gemv_rows = c->w_dtype == DJ_DTYPE_BF16 ? GEMV_BF16_ROWS : GEMV_MAX_ROWS;
    if (cb->matmul_path == 0 && c->n > gemv_rows && dj__cuda_f8_gemv_takes(cb, c))
        return true; /* FP8: the tensor-core GEMV where it is the faster (dj__cuda_f8_gemv_takes) */
    return cb->matmul_path == 1 ? c->n <= GEMV_MAX_ROWS : cb->matmul_path != 2 && c->n <= gemv_rows;
}

bool dj__cuda_gemv_takes(const dj_cuda_backend *cb, const dj_op_call *c) {
    return c->op == DJ_OP_MATMUL && gemv_path(cb, c);
}

bool dj__cuda_fp8_shared_takes(const dj_cuda_backend *cb, const dj_op_call *c) {
    /* exactly the calls dj__cuda_matmul below sends to dj__cuda_matmul_fp8's tensor-core path */
    return c->op == DJ_OP_MATMUL && c->w_dtype == DJ_DTYPE_F8_E4M3 && !gemv_path(cb, c) &&
           !(cb->base.deterministic && c->n <= DJ_DETERMINISTIC_MAX_ROWS && cb->matmul_path != 2) &&
           dj__cuda_fp8_lt_wanted(cb, c);
}

dj_status dj__cuda_matmul(dj_cuda_backend *cb, const dj_op_call *c) {
    if (c->w_dtype == DJ_DTYPE_Q4 && (uintptr_t)c->w % 4 != 0)
        return dj_fail(DJ_EINVAL, "matmul: 4-bit weights at %p are not 4-byte aligned", c->w);
    const bool f32_out = c->out_dtype == DJ_DTYPE_F32;
    const bool gemv = gemv_path(cb, c);
    if (!gemv && cb->base.deterministic && c->n <= DJ_DETERMINISTIC_MAX_ROWS && cb->matmul_path != 2) {
        /* batch-invariant: GEMVs of 8 rows at a time, each row summed as alone */
        dj_status st = DJ_OK;
        for (uint32_t r0 = 0; st == DJ_OK && r0 < c->n; r0 += GEMV_MAX_ROWS) {
            dj_op_call part = *c;
            const size_t xs = dj_dtype_size(DJ_DTYPE_BF16), os = dj_dtype_size(c->out_dtype);
            part.n = c->n - r0 < GEMV_MAX_ROWS ? c->n - r0 : GEMV_MAX_ROWS;
            part.x = (const uint8_t *)c->x + (size_t)r0 * c->k * xs;
            part.out = (uint8_t *)c->out + (size_t)r0 * c->m * os;
            part.out_rows = 0;
            st = dj__cuda_gemv(cb, &part, 1);
        }
        return st;
    }
    if (gemv) return dj__cuda_gemv(cb, c, 1); /* grouped with its neighbours by compute_plan */
    if (c->w_dtype == DJ_DTYPE_F8_E4M3) return dj__cuda_matmul_fp8(cb, c);
    if (c->w_dtype == DJ_DTYPE_Q4) return dj__cuda_gemm_q4(cb, c);
    if (c->w_dtype == DJ_DTYPE_BF16) return gemm_cublas(cb, c);
    if (f32_out)
        launch_tiled<float>(cb, c);
    else
        launch_tiled<__nv_bfloat16>(cb, c);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
