/* cuda_matmul_fp8_lt.cu: f8_e4m3 weights at prefill sizes on the FP8 tensor
 * cores (cuBLASLt) - W8A8: each call quantizes its bf16 activations to e4m3
 * per token and 128 channels (as DeepSeek's and Qwen3's FP8 inference does),
 * and cuBLASLt applies both operands' scales: BLK128x128 weight scales for
 * 128x128-block weights, and for per-channel / per-tensor weights VEC128 ones
 * holding each row's scale once per 128-column group (OUTER_VEC on both sides,
 * the activations quantized a row whole, missed the compressed-tensors
 * fixtures' accuracy by 2-4x: bench/RESULTS.md). This departs from the W8A16 reference by
 * the activations' e4m3 rounding (gpu_check prints it). Where cuBLASLt
 * refuses a shape or scaling, or the once-per-backend probe of the scale
 * layouts finds none that computes the right product, the caller
 * dequantizes tiles instead (cuda_matmul_fp8.cu): this path only ever
 * speeds up what it verified. */
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_impl.h"
#include "core/switches.h"
#include "backend/cuda/quant_group.cuh"
#include "backend/fastdiv.h"

#define LT_CACHE 16
#define LT_GROUP 128 /* activation channels per scale (both modes) */

/* MODE_BLOCK: 128x128-block weights (BLK128x128 scales); MODE_CHAN: per-channel or
 * per-tensor weights, each row's scale repeated over its 128-column groups (VEC128
 * scales). The activations take VEC128 scales in both. */
enum { MODE_BLOCK, MODE_CHAN, MODE_COUNT };

/* One cached shape: descriptors and the heuristic's algorithm. */
typedef struct lt_entry {
    uint32_t n, k, m;
    int mode, used;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} lt_entry;

struct dj_fp8_lt {
    cublasLtHandle_t h;
    int state[MODE_COUNT];  /* 0 untried, 1 verified, -1 off */
    int layout[MODE_COUNT]; /* block mode: bit 0 weight scales transposed, bit 1 activation scales token-major */
    lt_entry cache[LT_CACHE];
    unsigned next;
    /* what the last probe saw, for its warning: cuBLASLt's statuses, the
     * algorithms its heuristic found, the best layout's relative error (-1: none ran) */
    int heur_status, heur_found, mm_status;
    double probe_err;
};

static __device__ __forceinline__ float lt_f8(uint8_t v) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    return __half2float(*(const __half *)&h);
}

/* x [n][k] bf16 -> q [n][k] e4m3 and one scale per (row, group of g
 * channels): s = amax / 448, q = x / s. Scale of (r, gi) at
 * sc[tok_major ? r * groups + gi : gi * dj__f8_scale_ld(n) + r]. One warp per (row, group),
 * QA_WARPS a block; VEC (g and k multiples of 4, x 8-byte aligned): 4
 * channels a lane per load and store. A block of 128 threads per group
 * with a shared-memory reduction ran at 0.3-0.4 TB/s (ncu: 15 us for
 * 512 x 4096, 45 us for 512 x 14336). */
#define QA_WARPS 8
template <bool VEC>
static __global__ void __launch_bounds__(QA_WARPS * 32)
    quant_act_kernel(const __nv_bfloat16 *x, uint32_t n, uint32_t k, uint32_t g, bool tok_major, uint8_t *q,
                     float *sc) {
    const uint32_t groups = (k + g - 1) / g, lane = threadIdx.x & 31;
    const size_t item = (size_t)blockIdx.x * QA_WARPS + threadIdx.x / 32;
    if (item >= (size_t)n * groups) return;
    const uint32_t r = (uint32_t)(item / groups), gi = (uint32_t)(item % groups);
    const size_t base = (size_t)r * k + (size_t)gi * g;
    const uint32_t len = k - gi * g < g ? k - gi * g : g;
    float amax = 0.0f;
    if constexpr (VEC) {
        for (uint32_t i = lane * 4; i < len; i += 128) {
            const uint2 v = *(const uint2 *)(x + base + i);
            const float2 lo = __bfloat1622float2(*(const __nv_bfloat162 *)&v.x);
            const float2 hi = __bfloat1622float2(*(const __nv_bfloat162 *)&v.y);
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(lo.x), fabsf(lo.y)), fmaxf(fabsf(hi.x), fabsf(hi.y))));
        }
    } else {
        for (uint32_t i = lane; i < len; i += 32) amax = fmaxf(amax, fabsf(__bfloat162float(x[base + i])));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float scale = fmaxf(amax, 1e-12f) / 448.0f, inv = 1.0f / scale;
    if constexpr (VEC) {
        for (uint32_t i = lane * 4; i < len; i += 128) {
            const uint2 v = *(const uint2 *)(x + base + i);
            const float2 lo = __bfloat1622float2(*(const __nv_bfloat162 *)&v.x);
            const float2 hi = __bfloat1622float2(*(const __nv_bfloat162 *)&v.y);
            const uint32_t c01 = __nv_cvt_float2_to_fp8x2(make_float2(lo.x * inv, lo.y * inv), __NV_SATFINITE, __NV_E4M3);
            const uint32_t c23 = __nv_cvt_float2_to_fp8x2(make_float2(hi.x * inv, hi.y * inv), __NV_SATFINITE, __NV_E4M3);
            *(uint32_t *)(q + base + i) = c01 | c23 << 16;
        }
    } else {
        for (uint32_t i = lane; i < len; i += 32)
            q[base + i] = __nv_cvt_float_to_fp8(__bfloat162float(x[base + i]) * inv, __NV_SATFINITE, __NV_E4M3);
    }
    if (lane == 0) sc[tok_major ? (size_t)r * groups + gi : (size_t)gi * dj__f8_scale_ld(n) + r] = scale;
}

/* The same for groups of 128 channels (block mode; k a multiple of 128, x
 * 16-byte aligned, fewer than 2^31 groups): half a warp a group, a lane's 8
 * channels one 16-byte load kept in registers (read once), the group's amax
 * over the 16 lanes, 8 codes one 8-byte store; each warp takes QA_U pairs of
 * groups, all loads first, a group's row by a multiply (dj_fastdiv: a 64-bit
 * divide there cost a third of the kernel). The same values as
 * quant_act_kernel, which read x twice with a warp a group. H100, Llama-3-8B
 * shape FP8, prefill 2048 (bench/RESULTS.md, 2026-11-26): ncu 4.31 ms over
 * the 130 quantizations -> 1.04 ms over the 98 left apart (the down GEMM's
 * inside the SwiGLU, below), prefill 0.0391 -> 0.0378 s with both. Two
 * pairs a warp rather than four (69 -> 48 registers, more warps an SM):
 * the SwiGLU's quantization of an 8B FP8 prefill 2048 61.8-63.2 -> 54.4-56.1
 * us a call (one pair 58.7-59.2; two with 4 warps a block 53.5-55.1) - H100,
 * 2026-11-27, session 24 (bench/RESULTS.md). */
#define QA_U 2

/* Where group item of a [n][k] activation lies (items = n * k / 128 < 2^31: qa_g128_fits); its
 * inputs' rows lie in_ld values apart (k, or gate and up as one GEMM's halves: 2k). */
struct qa_geom {
    uint32_t n, k, groups, items, in_ld, sc_ld; /* sc_ld: dj__f8_scale_ld(n) */
    dj_fastdiv gdiv; /* / groups */
    bool tok_major;
};
static __device__ __forceinline__ void qa_at(const qa_geom &g, uint32_t item, size_t *elem, size_t *in, size_t *scale) {
    const uint32_t r = dj_fastdiv_q(item, g.gdiv), gi = item - r * g.groups;
    *elem = (size_t)r * g.k + (size_t)gi * LT_GROUP;
    *in = (size_t)r * g.in_ld + (size_t)gi * LT_GROUP;
    *scale = g.tok_major ? (size_t)item : (size_t)gi * g.sc_ld + r;
}

/* No GLU: the values are x's own. */
struct qa_plain {
    __device__ float operator()(float g) const { return g; }
};

/* Groups of 128 channels of an activation [n][k] to codes and scales. With
 * GLU the values are act(x) * up rounded to bf16 - what the GLU kernel
 * writes - and are written to out too, so the GEMM after the GLU needs no
 * second pass over them: bit for bit the two launches. */
template <bool GLU, typename Act>
static __global__ void __launch_bounds__(QA_WARPS * 32)
    quant_g128_kernel(const __nv_bfloat16 *x, const __nv_bfloat16 *up, __nv_bfloat16 *out, qa_geom g, uint8_t *q,
                      float *sc) {
    const uint32_t lane = threadIdx.x & 31, sub = lane & 15;
    const uint32_t first = (blockIdx.x * QA_WARPS + threadIdx.x / 32) * QA_U * 2 + (lane >> 4);
    const Act act;
    uint4 xv[QA_U], uv[QA_U];
    size_t e[QA_U], s[QA_U];
#pragma unroll
    for (int u = 0; u < QA_U; u++) {
        const uint32_t item = first + 2 * u;
        xv[u] = uv[u] = make_uint4(0u, 0u, 0u, 0u);
        e[u] = s[u] = 0;
        if (item < g.items) {
            size_t in = 0;
            qa_at(g, item, &e[u], &in, &s[u]);
            xv[u] = *(const uint4 *)(x + in + sub * 8);
            if (GLU) uv[u] = *(const uint4 *)(up + in + sub * 8);
        }
    }
#pragma unroll
    for (int u = 0; u < QA_U; u++) {
        const bool valid = first + 2 * u < g.items;
        const __nv_bfloat162 *x2 = (const __nv_bfloat162 *)&xv[u], *u2 = (const __nv_bfloat162 *)&uv[u];
        uint4 o;
        __nv_bfloat162 *o2 = (__nv_bfloat162 *)&o;
        float f[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 xf = __bfloat1622float2(x2[i]), uf = __bfloat1622float2(u2[i]);
            o2[i] = GLU ? __floats2bfloat162_rn(act(xf.x) * uf.x, act(xf.y) * uf.y) : x2[i];
            const float2 of = __bfloat1622float2(o2[i]);
            f[2 * i] = of.x;
            f[2 * i + 1] = of.y;
        }
        if (GLU && valid && out) *(uint4 *)(out + e[u] + sub * 8) = o;
        quant_group(f, valid, q + e[u] + sub * 8, sc + s[u], sub);
    }
}

/* Whether quant_g128_kernel takes an [n][k] activation (its group count fits its 32-bit indices). */
static bool qa_g128_fits(uint32_t n, uint32_t k) {
    return k % LT_GROUP == 0 && (uint64_t)n * (k / LT_GROUP) < ((uint64_t)1 << 31);
}

/* quant_g128_kernel over x [n][k] (op: 0 plain, DJ_OP_SILU_MUL or DJ_OP_GELU_MUL with up and out -
 * NULL: the codes only; x's and up's rows in_ld values apart). */
static void launch_g128(dj_cuda_backend *cb, int op, const __nv_bfloat16 *x, const __nv_bfloat16 *up,
                        __nv_bfloat16 *out, uint32_t n, uint32_t k, uint32_t in_ld, bool tok_major, uint8_t *q,
                        float *sc) {
    qa_geom g;
    g.n = n, g.k = k, g.groups = k / LT_GROUP, g.items = n * g.groups, g.gdiv = dj_fastdiv_make(g.groups);
    g.in_ld = in_ld;
    g.sc_ld = dj__f8_scale_ld(n);
    g.tok_major = tok_major;
    const unsigned per_block = QA_WARPS * QA_U * 2, blocks = (g.items + per_block - 1) / per_block;
    if (op == DJ_OP_SILU_MUL)
        quant_g128_kernel<true, dj_silu_fn><<<blocks, QA_WARPS * 32, 0, cb->stream>>>(x, up, out, g, q, sc);
    else if (op == DJ_OP_GELU_MUL)
        quant_g128_kernel<true, dj_gelu_fn><<<blocks, QA_WARPS * 32, 0, cb->stream>>>(x, up, out, g, q, sc);
    else
        quant_g128_kernel<false, qa_plain><<<blocks, QA_WARPS * 32, 0, cb->stream>>>(x, NULL, NULL, g, q, sc);
}

static void quant_act(dj_cuda_backend *cb, const __nv_bfloat16 *x, uint32_t n, uint32_t k, uint32_t g, bool tok_major,
                      uint8_t *q, float *sc) {
    const size_t items = (size_t)n * ((k + g - 1) / g);
    if (g == LT_GROUP && qa_g128_fits(n, k) && ((uintptr_t)x & 15) == 0 && ((uintptr_t)q & 7) == 0) {
        launch_g128(cb, 0, x, NULL, NULL, n, k, k, tok_major, q, sc);
        return;
    }
    const unsigned blocks = (unsigned)((items + QA_WARPS - 1) / QA_WARPS);
    if (g % 4 == 0 && k % 4 == 0 && ((uintptr_t)x & 7) == 0)
        quant_act_kernel<true><<<blocks, QA_WARPS * 32, 0, cb->stream>>>(x, n, k, g, tok_major, q, sc);
    else
        quant_act_kernel<false><<<blocks, QA_WARPS * 32, 0, cb->stream>>>(x, n, k, g, tok_major, q, sc);
}

/* dst[c][r] = src[r][c] of a rows x cols f32 matrix. */
static __global__ void transpose_kernel(const float *src, uint32_t rows, uint32_t cols, float *dst) {
    const size_t total = (size_t)rows * cols;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const uint32_t r = (uint32_t)(e / cols), c = (uint32_t)(e % cols);
        dst[(size_t)c * rows + r] = src[e];
    }
}

/* Each of m weight rows' scale (per channel: its own; per tensor, br = m: the
 * one) over its `groups` 128-column groups: dst[j][g], or dst[g][j] (cols_major). */
static __global__ void chan_scales_kernel(const float *ws, uint32_t br, uint32_t m, uint32_t groups, bool cols_major,
                                          float *dst) {
    const size_t total = (size_t)m * groups;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const uint32_t j = (uint32_t)(e / groups), g = (uint32_t)(e % groups);
        dst[cols_major ? (size_t)g * m + j : e] = ws[j / br];
    }
}

/* ---- the probe's reference and data ---- */

static __device__ __forceinline__ uint32_t lt_hash(uint32_t v) {
    v ^= v >> 16;
    v *= 0x7feb352du;
    v ^= v >> 15;
    v *= 0x846ca68bu;
    return v ^ (v >> 16);
}

/* w codes (no NaN), w scales in [0.5, 2), x in [-1, 1). */
static __global__ void probe_fill_kernel(uint8_t *w, size_t nw, float *ws, size_t nws, __nv_bfloat16 *x, size_t nx) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nw; i += (size_t)gridDim.x * blockDim.x) {
        uint8_t c = (uint8_t)lt_hash((uint32_t)i * 3u + 1u);
        w[i] = (c & 0x7f) >= 0x70 ? (uint8_t)(c & 0xb7) : c; /* keep magnitudes below 2^7 */
        if (i < nws) ws[i] = 0.5f + 1.5f * (float)(lt_hash((uint32_t)i * 7u + 5u) & 0xffff) / 65536.0f;
        if (i < nx) x[i] = __float2bfloat16((float)(lt_hash((uint32_t)i * 11u + 9u) & 0xffff) / 32768.0f - 1.0f);
    }
}

/* ref[r][j] = sum_i fp8(w[j][i]) ws(j, i) * fp8(q[r][i]) xs(r, i): the W8A8
 * product in f32, scales read the way this path stores them (row-major
 * weight blocks [m/br][k/bc], token-major activation groups [n][k/g]). */
static __global__ void probe_ref_kernel(const uint8_t *w, const float *ws, uint32_t br, uint32_t bc, const uint8_t *q,
                                        const float *xs, uint32_t g, uint32_t n, uint32_t k, uint32_t m, float *ref) {
    const uint32_t j = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (j >= m) return;
    const uint32_t kb = (k + bc - 1) / bc, kg = (k + g - 1) / g;
    float acc = 0.0f;
    for (uint32_t i = 0; i < k; i++)
        acc += lt_f8(w[(size_t)j * k + i]) * ws[(size_t)(j / br) * kb + i / bc] * lt_f8(q[(size_t)r * k + i]) *
               xs[(size_t)r * kg + i / g];
    ref[(size_t)r * m + j] = acc;
}

/* ---- cuBLASLt ---- */

static void entry_free(lt_entry *e) {
    if (!e->used) return;
    cublasLtMatmulDescDestroy(e->op);
    cublasLtMatrixLayoutDestroy(e->a);
    cublasLtMatrixLayoutDestroy(e->b);
    cublasLtMatrixLayoutDestroy(e->d);
    memset(e, 0, sizeof *e);
}

void dj__cuda_fp8_lt_destroy(dj_cuda_backend *cb) {
    struct dj_fp8_lt *L = cb->fp8_lt;
    if (!L) return;
    for (int i = 0; i < LT_CACHE; i++) entry_free(&L->cache[i]);
    if (L->h) cublasLtDestroy(L->h);
    free(L);
    cb->fp8_lt = NULL;
}

/* The cached descriptors and algorithm of (n, k, m, mode), made when absent
 * (the heuristic sees this call's scale pointers: with vector or block
 * scales and none set it answers CUBLAS_STATUS_INVALID_VALUE); NULL when
 * cuBLASLt has no algorithm for it. */
static lt_entry *entry_for(dj_cuda_backend *cb, uint32_t n, uint32_t k, uint32_t m, int mode, const float *ws,
                           const float *xs) {
    struct dj_fp8_lt *L = cb->fp8_lt;
    for (int i = 0; i < LT_CACHE; i++) {
        lt_entry *e = &L->cache[i];
        if (e->used && e->n == n && e->k == k && e->m == m && e->mode == mode) return e;
    }
    lt_entry *e = &L->cache[L->next++ % LT_CACHE];
    entry_free(e);
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    const int32_t smode = mode == MODE_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                             : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const int32_t bmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    bool ok = cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
    if (!ok) return NULL;
    e->used = 1; /* entry_free releases whatever was made below */
    ok = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &smode, sizeof smode) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof bmode) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof ws) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs) ==
             CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(&e->a, CUDA_R_8F_E4M3, k, m, k) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(&e->b, CUDA_R_8F_E4M3, k, n, k) == CUBLAS_STATUS_SUCCESS &&
         cublasLtMatrixLayoutCreate(&e->d, CUDA_R_16BF, m, n, m) == CUBLAS_STATUS_SUCCESS;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    const size_t wsb = (size_t)32 << 20;
    if (ok) ok = cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    if (ok)
        ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb) ==
             CUBLAS_STATUS_SUCCESS;
    if (ok) {
        L->heur_status = (int)cublasLtMatmulAlgoGetHeuristic(L->h, e->op, e->a, e->b, e->d, e->d, pref, 1, &res, &found);
        L->heur_found = found;
        ok = L->heur_status == (int)CUBLAS_STATUS_SUCCESS && found > 0;
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (!ok) {
        entry_free(e);
        return NULL;
    }
    e->algo = res.algo;
    e->n = n, e->k = k, e->m = m, e->mode = mode;
    return e;
}

/* c's activations -> e4m3 codes q and their scales xs, in the probed layout. */
static dj_status lt_quantize(dj_cuda_backend *cb, const dj_op_call *c, int layout, uint8_t *q, float *xs) {
    quant_act(cb, (const __nv_bfloat16 *)c->x, c->n, c->k, LT_GROUP, (layout & 2) != 0, q, xs);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

/* Scratch: q [n4][k] e4m3 (n4: n rounded up to 4, dj__f8_scale_ld), then
 * the activation scales of n4 rows, then (rows not a multiple of 4) the first
 * rows-of-4's scales apart (head_scales), then the weight scales in
 * cuBLASLt's order (block mode transposed, or an m-vector). Codes and scales
 * of rows n..n4 are whatever the scratch held: only a GEMM's rows past n,
 * which nothing reads, come of them. */
static size_t scale_floats(uint32_t rows, uint32_t k) { /* activation scales of rows x k, 256-byte aligned */
    return ((size_t)rows * ((k + LT_GROUP - 1) / LT_GROUP) + 63) / 64 * 64;
}
static size_t head_floats(const dj_op_call *c) { return c->n % 4 ? scale_floats(c->n / 4 * 4, c->k) : 0; }
static size_t carve_floats(const dj_op_call *c, int mode, size_t *qf, size_t *xsf) {
    const uint32_t n4 = dj__f8_scale_ld(c->n);
    *qf = ((size_t)n4 * c->k + 255) / 256 * 64; /* floats holding q, 256-byte aligned */
    *xsf = scale_floats(n4, c->k);
    const size_t wsf = mode == MODE_BLOCK ? (size_t)(c->m / 128) * (c->k / 128) : (size_t)c->m * (c->k / 128);
    return *qf + *xsf + head_floats(c) + wsf + 64;
}
/* out = W8A8 product of c (bf16 out, no bias) from its quantized
 * activations (q, xs), given the weight scales in cuBLASLt's order; n a
 * multiple of 4 (lt_matmul). */
static dj_status lt_gemm(dj_cuda_backend *cb, const dj_op_call *c, int mode, const float *ws_lt, uint8_t *q,
                         float *xs) {
    const uint32_t n = c->n, k = c->k, m = c->m;
    lt_entry *e = entry_for(cb, n, k, m, mode, ws_lt, xs);
    if (!e) return DJ_EUNSUPPORTED;
    if (cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws_lt, sizeof ws_lt) ||
        cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof xs))
        return DJ_EUNSUPPORTED;
    const float alpha = 1.0f, beta = 0.0f;
    const cublasStatus_t s = cublasLtMatmul(cb->fp8_lt->h, e->op, &alpha, c->w, e->a, q, e->b, &beta, c->out, e->d,
                                            c->out, e->d, &e->algo, cb->blas_ws, (size_t)32 << 20, cb->stream);
    cb->fp8_lt->mm_status = (int)s;
    return s == CUBLAS_STATUS_SUCCESS ? DJ_OK : DJ_EUNSUPPORTED;
}

/* dst[g][r] = xs[g][r] for the first n4 of n rows: group-major activation scales of the rows of 4. */
static __global__ void head_scales_kernel(const float *xs, uint32_t n, uint32_t n4, uint32_t groups, float *dst) {
    const size_t total = (size_t)n4 * groups, ld = dj__f8_scale_ld(n);
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x)
        dst[e] = xs[(e / n4) * ld + e % n4];
}

/* Whether c's GEMM runs on its n rows rounded up to 4 (not a multiple of 4, and out has room for
 * the rows past n: dj_op_call.out_rows) - one pass over the weights, the extra rows scratch. */
static bool lt_rounds_up(const dj_op_call *c) { return c->n % 4 && c->out_rows >= dj__f8_scale_ld(c->n); }
bool dj__cuda_fp8_lt_one_pass(const dj_op_call *c) { return c->n % 4 == 0 || lt_rounds_up(c); }
/* The rows cuBLASLt's GEMM of an unstored producer's codes runs on (f8_keeps_input false). */
static uint32_t lt_rows(const dj_op_call *c) { return lt_rounds_up(c) ? dj__f8_scale_ld(c->n) : c->n; }

/* lt_gemm for any rows: cuBLASLt's block-scale tensors come in rows of 4
 * (a GEMM of n rows with scales laid out for n rounded up gave a wrong
 * product, bench/RESULTS.md 2026-11-28). Where out has room (lt_rounds_up)
 * the GEMM runs on n rounded up to 4 - its last rows' codes and scales, and
 * so its output rows past n, are scratch. Else the rows of 4 take it - their
 * group-major scales copied apart first (the space carve leaves after xs) -
 * and the last 1..3 the GEMV from c's bf16 input, which the caller keeps
 * stored for them (f8_keeps_input): it reads the weights once more. */
static dj_status lt_matmul(dj_cuda_backend *cb, const dj_op_call *c, int mode, const float *ws_lt, uint8_t *q,
                           float *xs) {
    const uint32_t n4 = c->n / 4 * 4;
    if (n4 == c->n) return lt_gemm(cb, c, mode, ws_lt, q, xs);
    if (lt_rounds_up(c)) {
        dj_op_call whole = *c;
        whole.n = dj__f8_scale_ld(c->n);
        return lt_gemm(cb, &whole, mode, ws_lt, q, xs);
    }
    if (!n4) return DJ_EUNSUPPORTED;
    dj_op_call head = *c, tail = *c;
    head.n = n4;
    tail.n = c->n - n4;
    float *hs = xs;
    if (!(cb->fp8_lt->layout[mode] & 2)) { /* group-major: the rows of 4 apart (token-major: a prefix already) */
        hs = xs + scale_floats(c->n, c->k); /* carve's room after xs */
        const uint32_t groups = (c->k + LT_GROUP - 1) / LT_GROUP;
        const size_t total = (size_t)n4 * groups;
        head_scales_kernel<<<(unsigned)((total + 255) / 256 < 1024 ? (total + 255) / 256 : 1024), 256, 0,
                             cb->stream>>>(xs, c->n, n4, groups, hs);
        DJ_CU_LAUNCHED(cb);
    }
    const dj_status st = lt_gemm(cb, &head, mode, ws_lt, q, hs);
    if (st != DJ_OK) return st;
    tail.x = (const uint8_t *)c->x + (size_t)n4 * c->k * sizeof(__nv_bfloat16);
    tail.out = (uint8_t *)c->out + (size_t)n4 * c->m * sizeof(__nv_bfloat16);
    tail.out_rows = 0;
    return dj__cuda_gemv_fp8(cb, &tail, 1);
}

/* Whether a producer of c's codes must keep its bf16 output: rows not a multiple of 4 that out has no room
 * to round up (lt_matmul's last rows take the GEMV from it). */
static bool f8_keeps_input(const dj_op_call *c) { return c->n % 4 != 0 && !lt_rounds_up(c); }

static dj_status lt_run(dj_cuda_backend *cb, const dj_op_call *c, int mode, int layout, const float *ws_lt,
                        uint8_t *q, float *xs) {
    const dj_status st = lt_quantize(cb, c, layout, q, xs);
    return st != DJ_OK ? st : lt_matmul(cb, c, mode, ws_lt, q, xs);
}

static int mode_of(const dj_op_call *c) {
    if (c->w_block_rows == 128 && c->w_block_cols == 128 && c->k % 128 == 0 && c->m % 128 == 0) return MODE_BLOCK;
    if ((c->w_block_rows == 1 || c->w_block_rows == c->m) && c->w_block_cols >= c->k && c->k % 128 == 0)
        return MODE_CHAN;
    return -1;
}

static dj_status carve(dj_cuda_backend *cb, const dj_op_call *c, int mode, uint8_t **q, float **xs, float **wsx) {
    size_t qf, xsf;
    const size_t total = carve_floats(c, mode, &qf, &xsf);
    float *base = NULL;
    dj_status st = dj__cuda_scratch(cb, total, &base);
    if (st != DJ_OK) return st;
    *q = (uint8_t *)base;
    *xs = base + qf;
    *wsx = base + qf + xsf + head_floats(c);
    return DJ_OK;
}

/* The weight scales in cuBLASLt's order for this mode and layout: the
 * stored ones, or a transposed / expanded copy in wsx. */
static const float *weight_scales(dj_cuda_backend *cb, const dj_op_call *c, int mode, int layout, float *wsx) {
    if (mode == MODE_BLOCK) {
        if (!(layout & 1)) return c->w_scale;
        transpose_kernel<<<64, 256, 0, cb->stream>>>(c->w_scale, c->m / 128, c->k / 128, wsx);
        return wsx;
    }
    const uint32_t groups = c->k / LT_GROUP;
    const size_t total = (size_t)c->m * groups;
    const unsigned blocks = (unsigned)((total + 255) / 256 < 1024 ? (total + 255) / 256 : 1024);
    chan_scales_kernel<<<blocks, 256, 0, cb->stream>>>(c->w_scale, c->w_block_rows, c->m, groups, (layout & 1) != 0,
                                                       wsx);
    return wsx;
}

/* Which scale layout computes the product (checked against probe_ref on a
 * 256 x 256 x 64 case with varied scales); -1: none. Synchronous. */
static int probe(dj_cuda_backend *cb, int mode) {
    const uint32_t n = 64, k = 512, m = 256; /* k: 4 blocks of 128 (block_shape_ok) */
    const uint32_t br = mode == MODE_BLOCK ? 128 : 1, bc = mode == MODE_BLOCK ? 128 : k; /* CHAN: per channel */
    const size_t nws = (size_t)(m / br) * (k / bc);
    uint8_t *w = NULL, *q = NULL;
    float *ws = NULL, *xs = NULL, *ref = NULL, *wsx = NULL;
    __nv_bfloat16 *x = NULL, *out = NULL;
    int found = -1;
    float *h_ref = (float *)malloc(sizeof(float) * n * m);
    uint16_t *h_out = (uint16_t *)malloc(sizeof(uint16_t) * n * m);
    if (!h_ref || !h_out || cudaMalloc(&w, (size_t)m * k) || cudaMalloc(&q, (size_t)n * k) ||
        cudaMalloc(&ws, nws * 4 + 64) || cudaMalloc(&xs, (size_t)n * k * 4) || cudaMalloc(&ref, (size_t)n * m * 4) ||
        cudaMalloc(&wsx, (size_t)m * (k / 128) * 4 + 64) || cudaMalloc(&x, (size_t)n * k * 2) || cudaMalloc(&out, (size_t)n * m * 2))
        goto done;
    probe_fill_kernel<<<64, 256, 0, cb->stream>>>(w, (size_t)m * k, ws, nws, x, (size_t)n * k);
    cb->fp8_lt->probe_err = -1.0;
    for (int layout = 0; layout < 4 && found < 0; layout++) {
        dj_op_call c;
        memset(&c, 0, sizeof c);
        c.op = DJ_OP_MATMUL, c.n = n, c.k = k, c.m = m, c.x = x, c.w = w, c.out = out;
        c.w_dtype = DJ_DTYPE_F8_E4M3, c.out_dtype = DJ_DTYPE_BF16;
        c.w_scale = ws, c.w_block_rows = br, c.w_block_cols = bc;
        if (lt_run(cb, &c, mode, layout, weight_scales(cb, &c, mode, layout, wsx), q, xs) != DJ_OK) break;
        /* the reference reads token-major activation scales: quantize again that way */
        const uint32_t g = LT_GROUP;
        quant_act(cb, x, n, k, g, true, q, xs);
        probe_ref_kernel<<<dim3((m + 127) / 128, n), 128, 0, cb->stream>>>(w, ws, br, bc, q, xs, g, n, k, m, ref);
        if (cudaStreamSynchronize(cb->stream) != cudaSuccess ||
            cudaMemcpy(h_ref, ref, sizeof(float) * n * m, cudaMemcpyDeviceToHost) != cudaSuccess ||
            cudaMemcpy(h_out, out, sizeof(uint16_t) * n * m, cudaMemcpyDeviceToHost) != cudaSuccess)
            break;
        double maxd = 0.0, maxr = 0.0;
        for (size_t i = 0; i < (size_t)n * m; i++) {
            const double d = fabs((double)dj_bf16_to_f32(h_out[i]) - (double)h_ref[i]);
            if (!(d <= maxd)) maxd = d;
            if (fabs((double)h_ref[i]) > maxr) maxr = fabs((double)h_ref[i]);
        }
        const double err = maxr > 0.0 ? maxd / maxr : INFINITY;
        if (cb->fp8_lt->probe_err < 0.0 || err < cb->fp8_lt->probe_err) cb->fp8_lt->probe_err = err;
        if (err <= 1e-2) found = layout;
    }
done:
    (void)cudaStreamSynchronize(cb->stream);
    (void)cudaGetLastError();
    cudaFree(w), cudaFree(q), cudaFree(ws), cudaFree(xs), cudaFree(ref), cudaFree(wsx), cudaFree(x), cudaFree(out);
    free(h_ref);
    free(h_out);
    return found;
}

/* Block scales: Transformer Engine pads cuBLASLt's block-scale tensors to
 * multiples of 4 (k blocks of the weight's, tokens of the activations'); the
 * unpadded shapes this path can pass are those where padding is a no-op
 * (k = 256, two blocks, gave a product 0.92 off on the H200 in every layout),
 * rows past the last 4 aside (lt_matmul). */
static bool block_shape_ok(const dj_op_call *c) { /* VEC128 weight scales (MODE_CHAN) likewise */
    return (c->k / 128) % 4 == 0 && c->n >= 4;
}

bool dj__cuda_fp8_lt_covers(const dj_cuda_backend *cb, const dj_op_call *c) {
    const struct dj_fp8_lt *L = cb->fp8_lt;
    const int mode = mode_of(c);
    return mode >= 0 && block_shape_ok(c) && !c->bias && c->out_dtype == DJ_DTYPE_BF16 && c->k % 16 == 0 && c->m % 16 == 0 &&
           ((uintptr_t)c->w | (uintptr_t)c->x | (uintptr_t)c->out) % 16 == 0 && (!L || L->state[mode] >= 0) &&
           (!cb->capturing || (L && L->state[mode] == 1));
}

dj_status dj__cuda_matmul_fp8_lt(dj_cuda_backend *cb, const dj_op_call *c) {
    const int mode = mode_of(c);
    if (mode < 0) return DJ_EUNSUPPORTED;
    if (!cb->fp8_lt) {
        struct dj_fp8_lt *L = (struct dj_fp8_lt *)calloc(1, sizeof *L);
        if (!L) return dj_fail(DJ_ENOMEM, "out of host memory");
        if (cublasLtCreate(&L->h) != CUBLAS_STATUS_SUCCESS) {
            free(L);
            return DJ_EUNSUPPORTED;
        }
        /* kill switch, read once a backend (here, as its FP8 state is made): W8A16 tiles for every size */
        if (dj_switch_read(DJ_SW_FP8_TC) == 0) L->state[MODE_BLOCK] = L->state[MODE_CHAN] = -1;
        cb->fp8_lt = L;
    }
    struct dj_fp8_lt *L = cb->fp8_lt;
    if (L->state[mode] == 0) {
        if (cb->capturing) return DJ_EUNSUPPORTED; /* the probe syncs: decided outside a capture */
        const int layout = probe(cb, mode);
        L->state[mode] = layout >= 0 ? 1 : -1;
        L->layout[mode] = layout;
        /* warn: a missed speed-up is worth a line (the bench's prefill shows which way it went) */
        const char *what = mode == MODE_BLOCK ? "128x128 block" : "per-channel or per-tensor";
        if (layout < 0 && L->probe_err < 0.0)
            DJ_LOG(WARN,
                   "cuda:%d: FP8 tensor-core GEMM (%s scales) refused by cuBLASLt (heuristic status %d, %d "
                   "algorithms; matmul status %d): f8 prefill dequantizes tiles",
                   cb->device, what, L->heur_status, L->heur_found, L->mm_status);
        else if (layout < 0)
            DJ_LOG(WARN,
                   "cuda:%d: FP8 tensor-core GEMM (%s scales) wrong in every scale layout (best: %.3g of the "
                   "largest value off): f8 prefill dequantizes tiles",
                   cb->device, what, L->probe_err);
        else
            DJ_LOG(INFO, "cuda:%d: FP8 tensor-core GEMM (%s scales) verified, scale layout %d", cb->device, what,
                   layout);
    }
    if (L->state[mode] < 0) return DJ_EUNSUPPORTED;
    uint8_t *q;
    float *xs, *wsx;
    dj_status st = carve(cb, c, mode, &q, &xs, &wsx);
    if (st != DJ_OK) return st;
    const float *ws = weight_scales(cb, c, mode, L->layout[mode], wsx);
    DJ_CU_LAUNCHED(cb);
    st = lt_run(cb, c, mode, L->layout[mode], ws, q, xs);
    if (st == DJ_EUNSUPPORTED) L->state[mode] = -1; /* refused once: the tiles from now on */
    return st;
}

dj_status dj__cuda_matmul_fp8_lt_shared(dj_cuda_backend *cb, const dj_op_call *calls, int count, int *done) {
    *done = 0;
    const int mode = mode_of(&calls[0]);
    if (mode < 0) return DJ_OK;
    /* q and xs sit at the same place for every call of the group (they depend on n and k only); the
     * scratch is grown for the largest call first, so no later carve moves them */
    size_t need = 0, qf, xsf;
    for (int i = 0; i < count; i++) {
        if (mode_of(&calls[i]) != mode) return DJ_OK;
        const size_t f = carve_floats(&calls[i], mode, &qf, &xsf);
        need = f > need ? f : need;
    }
    float *base = NULL;
    dj_status st = dj__cuda_scratch(cb, need, &base);
    if (st != DJ_OK) return st;
    st = dj__cuda_matmul_fp8_lt(cb, &calls[0]); /* probes once, quantizes x, runs the first */
    if (st == DJ_EUNSUPPORTED) return DJ_OK;
    if (st != DJ_OK) return st;
    *done = 1;
    const int layout = cb->fp8_lt->layout[mode];
    for (int i = 1; i < count; i++) {
        uint8_t *q;
        float *xs, *wsx;
        if ((st = carve(cb, &calls[i], mode, &q, &xs, &wsx)) != DJ_OK) return st;
        const float *ws = weight_scales(cb, &calls[i], mode, layout, wsx);
        DJ_CU_LAUNCHED(cb);
        st = lt_matmul(cb, &calls[i], mode, ws, q, xs);
        if (st == DJ_EUNSUPPORTED) {
            cb->fp8_lt->state[mode] = -1; /* as dj__cuda_matmul_fp8_lt: the tiles from now on */
            return DJ_OK;
        }
        if (st != DJ_OK) return st;
        *done = i + 1;
    }
    return DJ_OK;
}

bool dj__cuda_glu_fp8_takes(const dj_cuda_backend *cb, const dj_op_call *glu, const dj_op_call *mm) {
    return (glu->op == DJ_OP_SILU_MUL || glu->op == DJ_OP_GELU_MUL) && dj__cuda_fp8_shared_takes(cb, mm) &&
           mode_of(mm) >= 0 && mm->x == glu->out && mm->n == glu->n && mm->k == glu->d &&
           qa_g128_fits(mm->n, mm->k) &&
           (((uintptr_t)glu->x | (uintptr_t)glu->x2 | (uintptr_t)glu->out) & 15u) == 0;
}

/* A GEMM refused after the bf16 copy of its input went unstored: nothing to fall back on. */
static dj_status refused_unstored(dj_cuda_backend *cb, const dj_op_call *mm) {
    return dj_fail(DJ_EDEVICE, "cuda:%d: FP8 GEMM (%u x %u x %u) refused by cuBLASLt after its input was quantized "
                   "without a bf16 copy (cublasLtMatmul status %d)", cb->device, mm->n, mm->k, mm->m,
                   cb->fp8_lt->mm_status);
}

/* Whether cuBLASLt's FP8 path of this mode is verified: not yet where no GEMM has probed it (the
 * first GEMM does), never after a refusal. The fused steps run only then. */
static bool lt_verified(const dj_cuda_backend *cb, int mode) {
    return cb->fp8_lt && mode >= 0 && cb->fp8_lt->state[mode] == 1;
}

/* Where a step's first kernel writes mm's activations: codes q and scales xs carved from scratch
 * (wsx: room for reordered weight scales), in the probed layout; unstored: the producer's bf16
 * output may go unstored (asked for, and mm has its algorithm). */
typedef struct codes_dst {
    int mode, layout;
    uint8_t *q;
    float *xs, *wsx;
    bool unstored;
} codes_dst;

static dj_status codes_for(dj_cuda_backend *cb, const dj_op_call *mm, bool unstored, codes_dst *d) {
    d->mode = mode_of(mm);
    const dj_status st = carve(cb, mm, d->mode, &d->q, &d->xs, &d->wsx);
    if (st != DJ_OK) return st;
    d->unstored = unstored && !f8_keeps_input(mm) &&
                  entry_for(cb, lt_rows(mm), mm->k, mm->m, d->mode, mm->w_scale, d->xs);
    d->layout = cb->fp8_lt->layout[d->mode];
    return DJ_OK;
}

/* mm from the codes its producer - the step's first kernel - just wrote at d: *ran 1, then 2
 * once the GEMM ran. Refused with the producer's bf16 output unstored: an error; else the caller
 * runs mm from that output. */
static dj_status gemm_of_codes(dj_cuda_backend *cb, const dj_op_call *mm, const codes_dst *d, int *ran) {
    cb->unstored += d->unstored;
    *ran = 1;
    const float *ws = weight_scales(cb, mm, d->mode, d->layout, d->wsx);
    DJ_CU_LAUNCHED(cb);
    const dj_status st = lt_matmul(cb, mm, d->mode, ws, d->q, d->xs);
    if (st == DJ_EUNSUPPORTED) {
        cb->fp8_lt->state[d->mode] = -1; /* as dj__cuda_matmul_fp8_lt: the tiles from now on (the caller runs mm) */
        return d->unstored ? refused_unstored(cb, mm) : DJ_OK;
    }
    if (st == DJ_OK) *ran = 2;
    return st;
}

/* The GLU of x and up (rows in_ld values apart) quantized for mm, its FP8
 * GEMM, then the GEMM; its bf16 output stored to out unless unstored is
 * asked and mm has its algorithm. *ran: 1 the GLU, 2 both (after a refusal
 * the caller runs mm from out, which an unstored GLU makes an error). */
static dj_status glu_gemm(dj_cuda_backend *cb, int op, const __nv_bfloat16 *x, const __nv_bfloat16 *up,
                          uint32_t in_ld, __nv_bfloat16 *out, const dj_op_call *mm, bool unstored, int *ran) {
    codes_dst d; /* mode >= 0: dj__cuda_glu_fp8_takes */
    *ran = 0;
    const dj_status st = codes_for(cb, mm, unstored, &d);
    if (st != DJ_OK) return st;
    launch_g128(cb, op, x, up, d.unstored ? NULL : out, mm->n, mm->k, in_ld, (d.layout & 2) != 0, d.q, d.xs);
    DJ_CU_LAUNCHED(cb);
    return gemm_of_codes(cb, mm, &d, ran);
}

dj_status dj__cuda_glu_fp8_lt(dj_cuda_backend *cb, const dj_op_call *glu, const dj_op_call *mm, unsigned dead,
                              int *done) {
    *done = 0;
    const int mode = mode_of(mm);
    if (!lt_verified(cb, mode)) return DJ_OK;
    return glu_gemm(cb, (int)glu->op, (const __nv_bfloat16 *)glu->x, (const __nv_bfloat16 *)glu->x2, mm->k,
                    (__nv_bfloat16 *)glu->out, mm, (dead & DJ_F8_DEAD_GLU) != 0, done);
}

bool dj__cuda_attn_fp8_takes(const dj_cuda_backend *cb, const dj_op_call *attn, const dj_op_call *mm) {
    return attn->op == DJ_OP_ATTENTION && attn->head_dim == LT_GROUP && dj__cuda_attention_takes_wg(cb, attn) &&
           dj__cuda_fp8_shared_takes(cb, mm) && mode_of(mm) >= 0 && mm->x == attn->out && mm->n == attn->n &&
           mm->k == attn->n_heads * LT_GROUP && qa_g128_fits(mm->n, mm->k);
}

dj_status dj__cuda_attn_fp8_lt(dj_cuda_backend *cb, const dj_op_call *attn, const dj_op_call *mm,
                               const uint32_t *table_dev, bool unstored, int *done) {
    *done = 0;
    const int mode = mode_of(mm);
    if (!lt_verified(cb, mode)) return DJ_OK;
    codes_dst d;
    dj_status st = codes_for(cb, mm, unstored, &d);
    if (st == DJ_OK) st = dj__cuda_attention_wg(cb, attn, table_dev, d.q, d.xs, (d.layout & 2) != 0, !d.unstored);
    if (st != DJ_OK) return st;
    cb->last_attention = 4;
    return gemm_of_codes(cb, mm, &d, done);
}

bool dj__cuda_norm_fp8_takes(const dj_cuda_backend *cb, const dj_op_call *norm, const dj_op_call *mm) {
    return norm->op == DJ_OP_RMSNORM && dj__cuda_fp8_shared_takes(cb, mm) && mode_of(mm) >= 0 &&
           mm->x == norm->out && mm->n == norm->n && mm->k == norm->d && qa_g128_fits(mm->n, mm->k);
}

/* The norm step with its output's codes and scales at q, xs for the FP8 GEMMs after it (its bf16
 * output too unless unstored). *ran: 1 it ran, 0 these rows take no codes (nothing ran). */
static dj_status norm_codes(dj_cuda_backend *cb, int mode, const dj_op_call *prenorm, const dj_op_call *add,
                            const dj_op_call *norm, uint8_t *q, float *xs, bool unstored, int *ran) {
    const dj_norm_q8 q8 = {q, xs, (cb->fp8_lt->layout[mode] & 2) != 0, unstored};
    *ran = 0;
    const dj_status st = dj__cuda_add_rmsnorm(cb, prenorm, add, norm, &q8);
    if (st == DJ_EUNSUPPORTED) return DJ_OK;
    if (st == DJ_OK) {
        *ran = 1;
        cb->unstored += unstored;
    }
    return st;
}

dj_status dj__cuda_norm_fp8_lt(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                               const dj_op_call *norm, const dj_op_call *mms, int count, unsigned dead, int *done) {
    *done = 0;
    struct dj_fp8_lt *L = cb->fp8_lt;
    const int mode = mode_of(&mms[0]); /* the group's: joins_f8_shared keeps one weight layout */
    if (!lt_verified(cb, mode)) return DJ_OK;
    /* q and xs lie where every GEMM of the group finds them (they depend on n and k only): the
     * scratch is grown for the largest first, as dj__cuda_matmul_fp8_lt_shared does */
    size_t need = 0, qf, xsf;
    for (int i = 0; i < count; i++) {
        const size_t f = carve_floats(&mms[i], mode, &qf, &xsf);
        need = f > need ? f : need;
    }
    float *base = NULL, *xs, *wsx;
    uint8_t *q;
    dj_status st = dj__cuda_scratch(cb, need, &base);
    if (st == DJ_OK) st = carve(cb, &mms[0], mode, &q, &xs, &wsx);
    if (st != DJ_OK) return st;
    bool unstored = (dead & DJ_F8_DEAD_NORM) != 0; /* only where every GEMM has its algorithm and all its rows */
    for (int i = 0; unstored && i < count; i++)
        unstored = !f8_keeps_input(&mms[i]) &&
                   entry_for(cb, lt_rows(&mms[i]), mms[i].k, mms[i].m, mode, mms[i].w_scale, xs) != NULL;
    if ((st = norm_codes(cb, mode, prenorm, add, norm, q, xs, unstored, done)) != DJ_OK || !*done) return st;
    const int layout = L->layout[mode];
    for (int i = 0; i < count; i++) {
        if ((st = carve(cb, &mms[i], mode, &q, &xs, &wsx)) != DJ_OK) return st;
        const float *ws = weight_scales(cb, &mms[i], mode, layout, wsx);
        DJ_CU_LAUNCHED(cb);
        st = lt_matmul(cb, &mms[i], mode, ws, q, xs);
        if (st == DJ_EUNSUPPORTED) {
            L->state[mode] = -1; /* as dj__cuda_matmul_fp8_lt: the tiles from now on */
            return unstored ? refused_unstored(cb, &mms[i]) : DJ_OK;
        }
        if (st != DJ_OK) return st;
        *done = i + 2;
    }
    return DJ_OK;
}

/* Whether c's weights can open a matrix that the next call's weights continue
 * (one GEMM of their rows): 128x128 blocks or per channel (a per-tensor
 * scale would not hold for the rows after) - and where the next weight and
 * its scales would then lie. */
static bool joinable(const dj_op_call *c) {
    return mode_of(c) >= 0 && (c->w_block_rows == 128 || c->w_block_rows == 1);
}
static bool continues(const dj_op_call *c, const dj_op_call *next) {
    const size_t scales = c->w_block_rows == 1 ? c->m : (size_t)(c->m / 128) * (c->k / 128);
    return joinable(next) && next->w_block_rows == c->w_block_rows && next->w_block_cols == c->w_block_cols &&
           (const uint8_t *)c->w + (size_t)c->m * c->k == (const uint8_t *)next->w && c->w_scale + scales == next->w_scale;
}

bool dj__cuda_f8_pair_takes(const dj_op_call *gate, const dj_op_call *up) {
    return joinable(gate) && continues(gate, up) && gate->x == up->x && gate->n == up->n && gate->k == up->k &&
           gate->m == up->m && (uint64_t)gate->m * 2 <= INT32_MAX;
}

/* The norm step quantizing its output for `all` - weights back to back, one
 * GEMM - then that GEMM into scratch after the first `keep` floats (clear of
 * every carve of the step), all->out set there; the norm's bf16 output
 * unstored where dead says so. *ran: 0 nothing ran (no algorithm for the
 * shape, or rows the norm cannot quantize), 1 the norm (cuBLASLt refused the
 * GEMM: the caller runs the GEMMs apart from the norm's output), 2 both. */
static dj_status norm_then_gemm(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                                const dj_op_call *norm, dj_op_call *all, size_t keep, unsigned dead, int *ran) {
    struct dj_fp8_lt *L = cb->fp8_lt;
    *ran = 0;
    const uint32_t n4 = dj__f8_scale_ld(all->n); /* the output's room: the GEMM runs on whole 4s (lt_rounds_up) */
    const size_t off = (keep + 63) / 64 * 64, out_f = ((size_t)n4 * all->m + 1) / 2;
    float *base = NULL, *xs, *wsx;
    uint8_t *q;
    const int mode = mode_of(all); /* the parts': pair_takes, triple_takes */
    dj_status st = dj__cuda_scratch(cb, off + out_f, &base);
    if (st == DJ_OK) st = carve(cb, all, mode, &q, &xs, &wsx);
    if (st != DJ_OK) return st;
    all->out = base + off;
    all->out_rows = n4;
    if (!entry_for(cb, n4, all->k, all->m, mode, all->w_scale, xs)) return DJ_OK; /* no algorithm */
    const bool unstored = (dead & DJ_F8_DEAD_NORM) != 0 && !f8_keeps_input(all);
    if ((st = norm_codes(cb, mode, prenorm, add, norm, q, xs, unstored, ran)) != DJ_OK || !*ran) return st;
    const int layout = L->layout[mode];
    const float *ws = weight_scales(cb, all, mode, layout, wsx);
    DJ_CU_LAUNCHED(cb);
    st = lt_matmul(cb, all, mode, ws, q, xs);
    if (st == DJ_EUNSUPPORTED) return unstored ? refused_unstored(cb, all) : DJ_OK;
    if (st == DJ_OK) *ran = 2;
    return st;
}

dj_status dj__cuda_f8_mlp_lt(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                             const dj_op_call *norm, const dj_op_call *g, unsigned dead, int *done) {
    *done = 0;
    const int mode = mode_of(&g[0]);
    if (!lt_verified(cb, mode)) return DJ_OK;
    const int dmode = mode_of(&g[3]); /* >= 0: dj__cuda_glu_fp8_takes */
    const dj_op_call *glu = &g[2], *down = &g[3];
    const uint32_t f = g[0].m;
    dj_op_call pair = g[0]; /* gate and up: one matrix of 2f rows */
    pair.m = 2 * f;
    /* the pair's output after the larger GEMM input's carve (the pair's or down's: codes, scales) */
    size_t qf, xsf;
    const size_t c1 = carve_floats(&pair, mode, &qf, &xsf), c2 = carve_floats(down, dmode, &qf, &xsf);
    int ran = 0;
    dj_status st = norm_then_gemm(cb, prenorm, add, norm, &pair, c1 > c2 ? c1 : c2, dead, &ran);
    *done = ran == 2 ? 3 : ran;
    if (st != DJ_OK || ran < 2) return st;
    /* the GLU of the pair's halves, quantized for down (its codes and scales where down's carve puts
     * them, clear of the pair's output), then down */
    const __nv_bfloat16 *po = (const __nv_bfloat16 *)pair.out;
    st = glu_gemm(cb, (int)glu->op, po, po + f, 2 * f, (__nv_bfloat16 *)glu->out, down, (dead & DJ_F8_DEAD_GLU) != 0,
                  &ran);
    *done = 3 + ran;
    return st;
}

bool dj__cuda_f8_triple_takes(const dj_op_call *g) {
    uint64_t m = 0;
    for (int i = 0; i < 3; i++) {
        if (!joinable(&g[i]) || g[i].x != g[0].x || g[i].n != g[0].n || g[i].k != g[0].k) return false;
        m += g[i].m;
    }
    for (int i = 0; i < 2; i++)
        if (!continues(&g[i], &g[i + 1])) return false;
    return m <= INT32_MAX;
}

dj_status dj__cuda_f8_qkv_lt(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                             const dj_op_call *norm, const dj_op_call *g, const uint32_t *table_dev, unsigned dead,
                             int *done) {
    *done = 0;
    const int mode = mode_of(&g[0]);
    if (!lt_verified(cb, mode)) return DJ_OK;
    dj_op_call all = g[0]; /* q, k and v: one matrix */
    all.m = g[0].m + g[1].m + g[2].m;
    size_t qf, xsf;
    int ran = 0;
    dj_status st = norm_then_gemm(cb, prenorm, add, norm, &all, carve_floats(&all, mode, &qf, &xsf), dead, &ran);
    *done = ran == 2 ? 4 : ran;
    if (st != DJ_OK || ran < 2) return st;
    st = dj__cuda_rope_kv_write_from(cb, &g[3], &g[4], &g[5], table_dev, (const __nv_bfloat16 *)all.out, all.m);
    if (st == DJ_OK) *done = 7;
    return st;
}
