/* cuda_q4.cu: out[n,m] = x[n,k] @ w[m,k]^T (+ bias) for 4-bit weights
 * (DJ_DTYPE_Q4, djinn/dtype.h: per row k/2 bytes of codes, then k/128 f16
 * scales, then k/128 f16 zero points), bf16 x, f32 accumulation:
 *  - up to 8 rows (decode): a GEMV dequantizing in registers. 4 weight rows
 *    share each load of x; where a warp per 4 rows leaves SMs idle, 2, 4 or
 *    8 warps split each 4 rows' columns (their sums added in shared memory);
 *    a lane takes 16 bytes of codes a row (32 columns, inside one
 *    group) per load, turns two codes at a time into the exact bf16 pair
 *    (128 + code) with one LOP3, sums (128 + code) * x over its 32 columns,
 *    takes (128 + zero) * sum x off and scales the result once. Rows whose
 *    bytes are not 16-byte aligned (k % 512 != 0) take 4-byte loads (each
 *    code as the float 2^23 + code minus 2^23 + zero: exact). Calls on
 *    one x are grouped into one launch as the 16-bit GEMVs are (cuda_plan.cu).
 *  - more rows: weight rows dequantized to bf16 in tiles of at most
 *    Q4_TILE_BYTES (small enough to stay in L2 between the write and
 *    cuBLAS's read), each tile multiplied by cublasGemmEx into its columns of
 *    out; a bias goes through an f32 accumulator and one pass. */
#include <string.h>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/cuda_wdecode.h"

#define Q4_WARPS 8
#define Q4_TILE_BYTES ((size_t)16 << 20) /* bf16 bytes of one dequantized tile (H100 L2: 50 MB) */

struct q4_segs {
    const uint8_t *w[DJ_GEMV_GROUP];
    const void *bias[DJ_GEMV_GROUP];
    void *out[DJ_GEMV_GROUP];
    uint32_t m[DJ_GEMV_GROUP];
    uint32_t first_block[DJ_GEMV_GROUP];
    int bias_dtype[DJ_GEMV_GROUP];
    int count;
};

static __device__ __forceinline__ float q4_bias(const void *p, int t, uint32_t j) {
    switch (t) {
    case DJ_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[j]);
    case DJ_DTYPE_F16: return __half2float(((const __half *)p)[j]);
    default: return ((const float *)p)[j];
    }
}

/* KS warps per RW consecutive weight rows j0.. of its segment (each x load
 * then serves RW rows: one row a warp read 4 bytes of x per byte of codes,
 * and decoded at 3.5x the step floor); warp ks of the KS takes every KS-th
 * run of 32 chunks of the row (chunk: 32 columns, 16 bytes), and the KS
 * partial sums add in ks order through shared memory - so a row's sum
 * depends on m and k only, never on n. x rows r < n (NR >= n). vec: rows of
 * 16-byte aligned bytes and a 16-byte aligned x. */
template <typename TO, int NR, int RW, int KS>
static __global__ void __launch_bounds__(Q4_WARPS * 32)
    gemv_q4_kernel(const __nv_bfloat16 *x, q4_segs sg, uint32_t n, uint32_t k, bool vec) {
    static_assert(Q4_WARPS % KS == 0, "a block holds whole row groups");
    dj_pdl_release();
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = warp % KS;
    int si = 0;
    while (si + 1 < sg.count && blockIdx.x >= sg.first_block[si + 1]) si++;
    const uint32_t m = sg.m[si];
    const uint32_t j0 = ((blockIdx.x - sg.first_block[si]) * (Q4_WARPS / KS) + warp / KS) * RW;
    if (KS == 1 && j0 >= m) return; /* with KS > 1 every warp reaches the block's barrier */
    const uint32_t ng = k / DJ_Q4_GROUP;
    const size_t rb = k / 2 + 4 * (size_t)ng;
    const uint8_t *rows[RW];
#pragma unroll
    for (int w = 0; w < RW; w++) rows[w] = sg.w[si] + (size_t)(j0 + w < m ? j0 + w : m - 1) * rb; /* past m: reread the last */
    dj_pdl_wait();
    float acc[NR][RW];
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int w = 0; w < RW; w++) acc[r][w] = 0.0f;
    if (j0 >= m) {
    } else if (vec) { /* 16 bytes a row: 32 columns of group c / 4 */
#pragma unroll 2
        for (uint32_t c = ks * 32 + lane; c < k / 32; c += 32 * KS) {
            uint4 q[RW];
            float s[RW], z128[RW];
#pragma unroll
            for (int w = 0; w < RW; w++) {
                const __half *sc = (const __half *)(rows[w] + k / 2);
                q[w] = *(const uint4 *)(rows[w] + 16 * (size_t)c);
                s[w] = __half2float(sc[c / 4]);
                z128[w] = 128.0f + __half2float(sc[ng + c / 4]);
            }
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if ((uint32_t)r < n) {
                    /* the 32 x values as floats and their sum: sum (code - zero) x =
                     * sum (128 + code) x - (128 + zero) sum x */
                    const uint4 *xr = (const uint4 *)(x + (size_t)r * k + 32 * (size_t)c);
                    float xf[32], sx = 0.0f;
#pragma unroll
                    for (int h = 0; h < 4; h++) {
                        const uint4 u = xr[h];
                        const uint32_t xv[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            xf[8 * h + 2 * e] = __uint_as_float(xv[e] << 16);
                            xf[8 * h + 2 * e + 1] = __uint_as_float(xv[e] & 0xFFFF0000u);
                            sx += xf[8 * h + 2 * e] + xf[8 * h + 2 * e + 1];
                        }
                    }
#pragma unroll
                    for (int w = 0; w < RW; w++) {
                        const float p = dj_q4_dot32_128(q[w], xf);
                        acc[r][w] = fmaf(s[w], fmaf(-z128[w], sx, p), acc[r][w]);
                    }
                }
            }
        }
    } else { /* 4 bytes: 8 columns of group i / 16 */
        for (uint32_t i = ks * 32 + lane; i < k / 8; i += 32 * KS) {
#pragma unroll
            for (int w = 0; w < RW; w++) {
                const __half *sc = (const __half *)(rows[w] + k / 2);
                const uint32_t q = *(const uint32_t *)(rows[w] + 4 * (size_t)i);
                const float sw = __half2float(sc[i / 16]), mzw = 8388608.0f + __half2float(sc[ng + i / 16]);
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    if ((uint32_t)r < n) {
                        const __nv_bfloat16 *xr = x + (size_t)r * k + 8 * (size_t)i;
                        float p = 0.0f;
#pragma unroll
                        for (int e = 0; e < 8; e++) p = fmaf(dj_q4_code(q, e, mzw), __bfloat162float(xr[e]), p);
                        acc[r][w] = fmaf(sw, p, acc[r][w]);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int w = 0; w < RW; w++)
            for (int o = 16; o > 0; o >>= 1) acc[r][w] += __shfl_xor_sync(0xffffffffu, acc[r][w], o);
    if constexpr (KS > 1) {
        __shared__ float part[Q4_WARPS][NR][RW];
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < NR; r++)
#pragma unroll
                for (int w = 0; w < RW; w++) part[warp][r][w] = acc[r][w];
        __syncthreads();
        if (ks != 0 || j0 >= m) return;
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int w = 0; w < RW; w++) {
                float t = part[warp][r][w];
                for (int p = 1; p < KS; p++) t += part[warp + p][r][w];
                acc[r][w] = t;
            }
    }
    if (lane == 0) {
        TO *out = (TO *)sg.out[si];
#pragma unroll
        for (int w = 0; w < RW; w++) {
            if (j0 + w >= m) break;
            const float b = sg.bias[si] ? q4_bias(sg.bias[si], sg.bias_dtype[si], j0 + w) : 0.0f;
#pragma unroll
            for (int r = 0; r < NR; r++)
                if ((uint32_t)r < n) dj_st(out, (size_t)r * m + j0 + w, acc[r][w] + b);
        }
    }
}

/* Rows [0, rows) of a Q4 matrix to bf16 [rows][k]: a thread per 4-byte word. */
static __global__ void dequant_q4_kernel(const uint8_t *w, uint32_t k, uint32_t rows, __nv_bfloat16 *out) {
    const uint32_t words = k / 8, ng = k / DJ_Q4_GROUP;
    const size_t rb = k / 2 + 4 * (size_t)ng, total = (size_t)rows * words;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const size_t r = t / words;
        const uint32_t i = (uint32_t)(t % words);
        const uint8_t *row = w + r * rb;
        const __half *sc = (const __half *)(row + k / 2);
        const uint32_t q = *(const uint32_t *)(row + 4 * (size_t)i);
        const float s = __half2float(sc[i / 16]), mz = 8388608.0f + __half2float(sc[ng + i / 16]);
        uint32_t o[4];
#pragma unroll
        for (int h = 0; h < 4; h++) {
            const __nv_bfloat16 a = __float2bfloat16(dj_q4_code(q, 2 * h, mz) * s);
            const __nv_bfloat16 b = __float2bfloat16(dj_q4_code(q, 2 * h + 1, mz) * s);
            o[h] = (uint32_t)__bfloat16_as_ushort(a) | (uint32_t)__bfloat16_as_ushort(b) << 16;
        }
        *(uint4 *)(out + r * k + 8 * (size_t)i) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

/* out[r, j] = acc[r, j] + bias[j]. */
template <typename TO>
static __global__ void q4_bias_kernel(const float *acc, const void *bias, int bias_dtype, TO *out, size_t count,
                                      uint32_t m) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dj_st(out, i, acc[i] + q4_bias(bias, bias_dtype, (uint32_t)(i % m)));
}

template <typename TO, int NR, int RW, int KS>
static void launch_nr(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    const dj_op_call *c = &calls[0];
    q4_segs sg;
    memset(&sg, 0, sizeof sg);
    uintptr_t align = (uintptr_t)c->x | (uintptr_t)dj_dtype_row_bytes(DJ_DTYPE_Q4, c->k);
    unsigned blocks = 0;
    for (int i = 0; i < count; i++) {
        sg.w[i] = (const uint8_t *)calls[i].w;
        sg.bias[i] = calls[i].bias;
        sg.bias_dtype[i] = (int)calls[i].bias_dtype;
        sg.out[i] = calls[i].out;
        sg.m[i] = calls[i].m;
        sg.first_block[i] = blocks;
        blocks += (calls[i].m + Q4_WARPS / KS * RW - 1) / (Q4_WARPS / KS * RW);
        align |= (uintptr_t)calls[i].w;
    }
    sg.count = count;
    dj__launch(cb, gemv_q4_kernel<TO, NR, RW, KS>, dim3(blocks), dim3(Q4_WARPS * 32), 0, (const __nv_bfloat16 *)c->x, sg,
               c->n, c->k, align % 16 == 0);
}

/* RW rows a warp group (4; 2 with 8 rows of x, where 4 spilled) and KS warps
 * a group: the fewest that still give every SM two blocks at 4 rows a group
 * - from m alone, so a row's sum (which depends on KS, never on RW) is the
 * same at every n. Against the former choice - 1 row a warp where 4 left SMs
 * idle, each lane then widening 64 bytes of x per 16 bytes of codes - the 8B
 * shape's decode step took 3.28 instead of 3.45 ms on the H100
 * (bench/RESULTS.md, 2026-11-26). */
template <typename TO, int NR>
static void launch_rw(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    constexpr int RW = NR >= 8 ? 2 : 4;
    uint32_t groups = 0; /* of 4 rows */
    for (int i = 0; i < count; i++) groups += (calls[i].m + 3) / 4;
    const uint32_t want = 2u * (uint32_t)cb->n_sm;
    if ((groups + Q4_WARPS - 1) / Q4_WARPS >= want) {
        launch_nr<TO, NR, RW, 1>(cb, calls, count);
    } else if ((groups + Q4_WARPS / 2 - 1) / (Q4_WARPS / 2) >= want) {
        launch_nr<TO, NR, RW, 2>(cb, calls, count);
    } else if ((groups + Q4_WARPS / 4 - 1) / (Q4_WARPS / 4) >= want) {
        launch_nr<TO, NR, RW, 4>(cb, calls, count);
    } else {
        launch_nr<TO, NR, RW, 8>(cb, calls, count);
    }
}

template <typename TO>
static void launch_rows(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    const uint32_t n = calls[0].n;
    if (n == 1)
        launch_rw<TO, 1>(cb, calls, count);
    else if (n == 2)
        launch_rw<TO, 2>(cb, calls, count);
    else if (n <= 4)
        launch_rw<TO, 4>(cb, calls, count);
    else
        launch_rw<TO, 8>(cb, calls, count);
}

dj_status dj__cuda_gemv_q4(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    if (calls[0].out_dtype == DJ_DTYPE_F32)
        launch_rows<float>(cb, calls, count);
    else
        launch_rows<__nv_bfloat16>(cb, calls, count);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

dj_status dj__cuda_gemm_q4(dj_cuda_backend *cb, const dj_op_call *c) {
    const uint32_t n = c->n, k = c->k, m = c->m;
    const bool f32_out = c->out_dtype == DJ_DTYPE_F32;
    uint32_t tile = (uint32_t)(Q4_TILE_BYTES / ((size_t)k * 2));
    tile = tile < 64 ? 64 : tile / 64 * 64;
    if (tile > m) tile = m;
    /* scratch: the f32 accumulator of a bias (n*m floats), then the tile (bf16) */
    const size_t acc_floats = c->bias ? (size_t)n * m : 0, tile_floats = ((size_t)tile * k + 1) / 2;
    float *scratch = NULL;
    dj_status st = dj__cuda_scratch(cb, acc_floats + tile_floats + 4, &scratch);
    if (st != DJ_OK) return st;
    float *acc = c->bias ? scratch : NULL;
    __nv_bfloat16 *wt = (__nv_bfloat16 *)(void *)(scratch + (acc_floats + 3) / 4 * 4); /* 16-byte aligned */
    const size_t rb = dj_dtype_row_bytes(DJ_DTYPE_Q4, k);
    const cudaDataType_t dt = c->bias || f32_out ? CUDA_R_32F : CUDA_R_16BF;
    const size_t es = c->bias || f32_out ? 4 : 2;
    void *dst = c->bias ? (void *)acc : c->out;
    const float alpha = 1.0f, beta = 0.0f;
    for (uint32_t j0 = 0; j0 < m; j0 += tile) {
        const uint32_t rows = m - j0 < tile ? m - j0 : tile;
        const size_t words = (size_t)rows * (k / 8);
        size_t blocks = (words + 255) / 256, cap = (size_t)cb->n_sm * 16;
        if (blocks > cap) blocks = cap;
        dequant_q4_kernel<<<(unsigned)blocks, 256, 0, cb->stream>>>((const uint8_t *)c->w + (size_t)j0 * rb, k, rows,
                                                                    wt);
        DJ_CU_LAUNCHED(cb);
        /* column-major: out^T[j0.., n] (leading dimension m) = wt[k, rows]^T x^T[k, n] */
        DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)k, &alpha, wt,
                                   CUDA_R_16BF, (int)k, c->x, CUDA_R_16BF, (int)k, &beta, (uint8_t *)dst + j0 * es, dt,
                                   (int)m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (c->bias) {
        const size_t count = (size_t)n * m;
        size_t blocks = (count + 255) / 256, cap = (size_t)cb->n_sm * 16;
        if (blocks > cap) blocks = cap;
        if (f32_out)
            q4_bias_kernel<<<(unsigned)blocks, 256, 0, cb->stream>>>(acc, c->bias, (int)c->bias_dtype,
                                                                     (float *)c->out, count, m);
        else
            q4_bias_kernel<<<(unsigned)blocks, 256, 0, cb->stream>>>(acc, c->bias, (int)c->bias_dtype,
                                                                     (__nv_bfloat16 *)c->out, count, m);
        DJ_CU_LAUNCHED(cb);
    }
    return DJ_OK;
}
