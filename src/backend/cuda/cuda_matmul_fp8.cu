/* cuda_matmul_fp8.cu: out[n,m] = x[n,k] @ (fp8(w) * scale)^T + bias for
 * f8_e4m3 weights (dj_op_call.w_scale: one f32 per block of w_block_rows x
 * w_block_cols weights; per tensor, per channel and 128x128 blocks are all
 * blocks), bf16 x, f32 accumulation - weights only, the activations stay
 * bf16 (W8A16, as the CPU reference):
 *  - up to 8 rows (decode): a GEMV reading each weight byte once, the scale
 *    folded in per 16 weights (one 16-byte load a lane, a warp per weight
 *    row, like the bf16 GEMV of cuda_matmul.cu: half its bytes; for one row
 *    of x two warps a row, each half of its loads, twice the warps in flight
 *    at 32 registers - f8_split: every GEMV of the 8B shape, decode b=1
 *    3.45-3.49 -> 3.30-3.34 ms on the H100, bench/RESULTS.md 2026-11-28). Measured
 *    within noise of it on the H100 (bench/RESULTS.md, 2026-11-26) and not
 *    kept: a tensor-core GEMV (16 rows a warp, codes to f16 pairs by one
 *    cvt, x as f16, mma.m16n8k16: a third of the instructions), 4 or 16
 *    warps a block, 2 or 8 loads a lane in flight - its time is not its
 *    instructions. From 2 to 32 rows of x (not under --deterministic) whole
 *    16-row bands go to the tensor cores instead (gemv_f8_mma_kernel: the
 *    codes widened to exact bf16 pairs in registers, mma.m16n8k16 with up to
 *    4 tiles of 8 x rows as B, still W8A16): the CUDA-core kernel reads x
 *    once per 16 weight bytes per row, and at 8 rows it streamed weights at
 *    775 GB/s (the mma one 2,000; the 8B FP8 decode at b=8 705 -> 1,530
 *    tok/s, b=4 587 -> 863, bench/RESULTS.md 2026-11-28). It takes 9..16 rows,
 *    and up to 32 where cuBLASLt would not (dj__cuda_f8_gemv_takes): b=12
 *    345 -> 2,280 tok/s, where 9..15 rows went to the dequantized tiles;
 *  - more rows (batched decode, prefill) of 128x128-block, per-channel
 *    or per-tensor weights, where cuBLASLt takes the shape: the FP8 tensor
 *    cores, activations quantized per call (W8A8: cuda_matmul_fp8_lt.cu;
 *    docs/quantization.md says what that costs in accuracy); rows not a
 *    multiple of 4 there, the last 1..3 on the GEMV (its lt_matmul);
 *  - otherwise (other blocks, bias, odd shapes, --deterministic, or
 *    cuBLASLt refusing): weight
 *    rows dequantized tile by tile into bf16 scratch (a tile of ~32 MiB stays
 *    in the H100's L2 for the GEMM that reads it right after) and multiplied
 *    by cuBLAS (cublasGemmEx, tensor cores, f32 compute): W8A16. */
#include <string.h>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/cuda_wdecode.h"

#define F8_WARPS 8
#define F8_MAX_ROWS 8
#define F8_TILE_BYTES (32u << 20) /* bf16 bytes of one dequantized weight tile */
#define F8_LT_MIN_ROWS 16 /* rows from which the automatic path takes the FP8 tensor cores */
/* The one-row GEMV's 16-byte weight loads a lane before the PDL wait and
 * its blocks an SM (gemv_f8_one_kernel says why): F8_PRE at F8_PRE_BLOCKS,
 * or F8_WAVE_PRE at F8_WAVE_BLOCKS for a launch that fits one wave there and
 * not at F8_PRE_BLOCKS. */
#define F8_PRE 8
#define F8_PRE_BLOCKS 4
#define F8_WAVE_PRE 4
#define F8_WAVE_BLOCKS 6
/* A row over two warps (f8_split) unless its launch would hold more than
 * F8_SPLIT_SM_WARPS warps an SM; its one-row kernel takes F8_SPLIT_PRE loads
 * before the wait at F8_SPLIT_BLOCKS blocks an SM */
#define F8_SPLIT_SM_WARPS 512
#define F8_SPLIT_PRE 2
#define F8_SPLIT_BLOCKS 8

static __device__ __forceinline__ float f8_ld_any(const void *p, int t, size_t i) {
    switch (t) {
    case DJ_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case DJ_DTYPE_F16: return __half2float(((const __half *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

struct f8_segs {
    const uint8_t *w[DJ_GEMV_GROUP];
    const float *scale[DJ_GEMV_GROUP];
    const void *bias[DJ_GEMV_GROUP];
    void *out[DJ_GEMV_GROUP];
    uint32_t m[DJ_GEMV_GROUP];
    uint32_t first_block[DJ_GEMV_GROUP];
    uint32_t br[DJ_GEMV_GROUP], bc[DJ_GEMV_GROUP];
    int bias_dtype[DJ_GEMV_GROUP];
    int count;
};

/* S warps per weight row j of its segment (warp h of them takes the row's
 * 512-column chunks h, h + S, ...), rows r < n of x (NR >= n). vec: k % 16 ==
 * 0, 16-byte aligned w rows and x, every bc a multiple of 16 (a lane's 16
 * weights share one scale). Under dj_backend.deterministic S follows m and
 * k alone (f8_split), so a row is summed the same way whatever n: the rows
 * are bit-identical alone and in a batch. */
template <typename TO, int NR, int PRE = 0, int S = 1>
static __device__ __forceinline__ void gemv_f8_body(const __nv_bfloat16 *x, const f8_segs &sg, uint32_t n, uint32_t k,
                                                    bool vec) {
    dj_pdl_release();
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, h = warp % S;
    int si = 0;
    while (si + 1 < sg.count && blockIdx.x >= sg.first_block[si + 1]) si++;
    const uint32_t m = sg.m[si];
    const uint32_t j = (blockIdx.x - sg.first_block[si]) * (F8_WARPS / S) + warp / S;
    if (S == 1 && j >= m) return;
    /* S > 1: the block meets at a barrier below, so a warp past the segment sums its last row and stores nothing */
    const uint32_t jr = j < m ? j : m - 1;
    const uint8_t *wr = sg.w[si] + (size_t)jr * k;
    const uint32_t bc = sg.bc[si], per_row = (k + bc - 1) / bc;
    const float *sr = sg.scale[si] + (size_t)(jr / sg.br[si]) * per_row;
    /* weights and scales are constant: with one row of x (a session's decode) a weight row's
     * first PRE loads go out before the wait (gemv_f8_one_kernel's PRE); with more rows that was
     * slower (bench/RESULTS.md) */
    uint4 pre[PRE > 0 ? PRE : 1];
    float pres[PRE > 0 ? PRE : 1];
#pragma unroll
    for (int p = 0; p < PRE; p++)
        if (vec && lane * 16 + 512u * (h + S * p) < k) {
            pre[p] = *(const uint4 *)(wr + lane * 16 + 512u * (h + S * p));
            pres[p] = sr[(lane * 16 + 512u * (h + S * p)) / bc];
        }
    dj_pdl_wait();
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    if (vec) {
        auto step = [&](uint4 u, float s, uint32_t kk) {
            float wf[16];
            dj_f8x16(u, wf);
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if ((uint32_t)r < n) {
                    const uint4 *xp = (const uint4 *)(x + (size_t)r * k + kk);
                    const uint4 x0 = xp[0], x1 = xp[1];
                    const uint32_t xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                    float part = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        part += wf[2 * i] * __uint_as_float(xv[i] << 16);
                        part += wf[2 * i + 1] * __uint_as_float(xv[i] & 0xffff0000u);
                    }
                    acc[r] += s * part;
                }
            }
        };
#pragma unroll
        for (int p = 0; p < PRE; p++)
            if (lane * 16 + 512u * (h + S * p) < k) step(pre[p], pres[p], lane * 16 + 512u * (h + S * p));
#pragma unroll 4
        for (uint32_t kk = lane * 16 + 512u * (h + S * PRE); kk < k; kk += 512u * S)
            step(*(const uint4 *)(wr + kk), sr[kk / bc], kk);
    } else {
        for (uint32_t kk = lane + 32u * h; kk < k; kk += 32u * S) {
            const float wf = dj_f8_one(wr[kk]) * sr[kk / bc];
#pragma unroll
            for (int r = 0; r < NR; r++)
                if ((uint32_t)r < n) acc[r] += wf * __bfloat162float(x[(size_t)r * k + kk]);
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
        for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
    if constexpr (S > 1) { /* the first of a row's warps adds their sums in warp order */
        __shared__ float part[F8_WARPS][NR];
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < NR; r++) part[warp][r] = acc[r];
        __syncthreads();
        if (h != 0 || j >= m) return;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            float t = part[warp][r];
#pragma unroll
            for (int i = 1; i < S; i++) t += part[warp + i][r];
            acc[r] = t;
        }
    }
    if (lane == 0) {
        const float b = sg.bias[si] ? f8_ld_any(sg.bias[si], sg.bias_dtype[si], j) : 0.0f;
        TO *out = (TO *)sg.out[si];
#pragma unroll
        for (int r = 0; r < NR; r++)
            if ((uint32_t)r < n) dj_st(out, (size_t)r * m + j, acc[r] + b);
    }
}

template <typename TO, int NR, int S>
static __global__ void __launch_bounds__(F8_WARPS * 32)
    gemv_f8_kernel(const __nv_bfloat16 *x, f8_segs sg, uint32_t n, uint32_t k, bool vec) {
    gemv_f8_body<TO, NR, 0, S>(x, sg, n, k, vec);
}
/* One row (a session's decode): PRE of each lane's loads before the PDL
 * wait at MINB blocks an SM. F8_PRE's 8 (a 4,096-column row whole, requested
 * while the kernel before still runs) take 61 registers, no spills, at 4
 * blocks; 4 loads at 6 blocks take 40. H100, FP8 decode b=1 of the 8B shape
 * (bench/RESULTS.md, 2026-11-27): 4 loads at 6 blocks for every launch 3.578
 * / 3.565 / 3.583 ms, 8 at 4 blocks 3.502 / 3.496 / 3.500, 6 at 5 blocks
 * 3.581 / 3.565 / 3.605; in another run 8 at 4 blocks 3.514 / 3.531 / 3.484
 * and with q/k/v's 768 blocks (1.45 waves at 4 blocks an SM, one at 6) at 4
 * loads and 6 blocks 3.470 / 3.473 / 3.482 - launch_gemv_f8's choice. (4
 * loads at 6 blocks against ptxas's own 43 registers, 5 blocks, before: 3.594
 * / 3.570 / 3.612 -> 3.573 / 3.577 / 3.548.) A row over two warps (S 2,
 * f8_split) takes 2 loads at 8 blocks (32 registers, 64 warps an SM): with
 * o and down split decode went 3.456-3.464 -> 3.393-3.405 ms (down alone
 * 25.7 -> 21.1 us; 4 loads at 6 blocks 3.537-3.566, 4 at 8 spilled), with
 * q/k/v too 3.340-3.383, with gate/up too 3.303-3.331 (gate alone 22.9 ->
 * 21.5 us). More rows keep ptxas's choice and no loads before the wait. */
template <typename TO, int PRE, int MINB, int S>
static __global__ void __launch_bounds__(F8_WARPS * 32, MINB)
    gemv_f8_one_kernel(const __nv_bfloat16 *x, f8_segs sg, uint32_t n, uint32_t k, bool vec) {
    gemv_f8_body<TO, 1, PRE, S>(x, sg, n, k, vec);
}

/* Warps a weight row (gemv_f8_body's S) for a launch of nr rows of x: 2
 * where a warp's half row still holds a few of its loads (k >= 2048) and the
 * launch is not so long that its waves hide their tails anyway (an FP8
 * matrix of the lm head's shape, 128,256 rows: 167.5 us a warp a row, 170.0
 * split) - for one row of x, and under dj_backend.deterministic for any (the
 * choice then follows the shape alone, so a row's bits do not depend on its
 * batch); batched rows otherwise keep a warp a row (2 rows split were no
 * faster: bench/RESULTS.md). */
static int f8_split(const dj_cuda_backend *cb, const dj_op_call *calls, int count, int nr) {
    if (nr > 1 && !cb->base.deterministic) return 1;
    uint64_t m = 0;
    for (int i = 0; i < count; i++) m += calls[i].m;
    return calls[0].k >= 2048 && 2 * m <= (uint64_t)cb->n_sm * F8_SPLIT_SM_WARPS ? 2 : 1;
}

/* The segments of a launch of calls on one x, rows_per_block weight rows a
 * block (a block width past k taken as k: the same one block a row); returns
 * the blocks. */
static unsigned f8_segs_of(const dj_op_call *calls, int count, uint32_t rows_per_block, f8_segs *sg) {
    memset(sg, 0, sizeof *sg);
    unsigned blocks = 0;
    for (int i = 0; i < count; i++) {
        const dj_op_call *ci = &calls[i];
        sg->w[i] = (const uint8_t *)ci->w;
        sg->scale[i] = ci->w_scale;
        sg->bias[i] = ci->bias;
        sg->bias_dtype[i] = (int)ci->bias_dtype;
        sg->out[i] = ci->out;
        sg->m[i] = ci->m;
        sg->br[i] = ci->w_block_rows;
        sg->bc[i] = ci->w_block_cols < ci->k ? ci->w_block_cols : ci->k;
        sg->first_block[i] = blocks;
        blocks += (ci->m + rows_per_block - 1) / rows_per_block;
    }
    sg->count = count;
    return blocks;
}

template <typename TO, int NR>
static void launch_gemv_f8(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    const dj_op_call *c = &calls[0];
    const int S = f8_split(cb, calls, count, NR);
    f8_segs sg;
    const unsigned blocks = f8_segs_of(calls, count, F8_WARPS / (uint32_t)S, &sg);
    uintptr_t align = (uintptr_t)c->x;
    bool vec = c->k % 16 == 0;
    for (int i = 0; i < count; i++) {
        align |= (uintptr_t)calls[i].w;
        if (calls[i].w_block_cols % 16 && calls[i].w_block_cols < calls[i].k) vec = false;
    }
    vec = vec && align % 16 == 0;
    if constexpr (NR == 1) {
        const unsigned n_sm = (unsigned)cb->n_sm;
        if (S == 2)
            dj__launch(cb, gemv_f8_one_kernel<TO, F8_SPLIT_PRE, F8_SPLIT_BLOCKS, 2>, dim3(blocks),
                       dim3(F8_WARPS * 32), 0, (const __nv_bfloat16 *)c->x, sg, c->n, c->k, vec);
        else if (blocks > F8_PRE_BLOCKS * n_sm && blocks <= F8_WAVE_BLOCKS * n_sm) /* one wave only at the lighter kernel */
            dj__launch(cb, gemv_f8_one_kernel<TO, F8_WAVE_PRE, F8_WAVE_BLOCKS, 1>, dim3(blocks), dim3(F8_WARPS * 32),
                       0, (const __nv_bfloat16 *)c->x, sg, c->n, c->k, vec);
        else
            dj__launch(cb, gemv_f8_one_kernel<TO, F8_PRE, F8_PRE_BLOCKS, 1>, dim3(blocks), dim3(F8_WARPS * 32), 0,
                       (const __nv_bfloat16 *)c->x, sg, c->n, c->k, vec);
    } else if (S == 2)
        dj__launch(cb, gemv_f8_kernel<TO, NR, 2>, dim3(blocks), dim3(F8_WARPS * 32), 0, (const __nv_bfloat16 *)c->x,
                   sg, c->n, c->k, vec);
    else
        dj__launch(cb, gemv_f8_kernel<TO, NR, 1>, dim3(blocks), dim3(F8_WARPS * 32), 0, (const __nv_bfloat16 *)c->x,
                   sg, c->n, c->k, vec);
}

/* ---- 2..8 rows of x on the tensor cores (W8A16) ---- */

/* e4m3 codes in bytes 0 and 1 (b23: 2 and 3) of w -> a bf16 pair, the lower byte in the low half (exact). */
static __device__ __forceinline__ uint32_t f8m_pair(uint32_t w) {
    const float2 f = dj_f8x2(w);
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    return *(const uint32_t *)&b;
}

/* A block of F8M_WARPS warps takes a band of 16 weight rows of its segment
 * (m % 16 == 0), each warp every F8M_WARPS'th 64-column chunk of k; the sums
 * meet in shared memory and warp 0 adds them in warp order. In a chunk lane
 * (g, t) loads 16 bytes of rows g and g + 8 at column 16t and, for each of
 * the NT 8-row tiles q of x (n <= 8 NT), the 16 x values there of x row
 * 8q + g; MMA step s takes bytes 4s..4s+3 as the fragment's columns 2t,
 * 2t + 1, 2t + 8, 2t + 9 and the x pairs at 4s, 4s + 2 as its k rows - one
 * permutation of the chunk's columns for A and B, so the product is the
 * chunk's; the widened codes serve the NT tiles. The chunk's sums are
 * scaled by their rows' block scales (bc % 64 == 0: a chunk lies in one
 * block) into f32 accumulators. An output is its x row's own sum whatever
 * the other rows (the tensor cores add a column's products apart from the
 * others'). Two bands a block, each tile of x loaded once for both, lost at
 * every row count (bench/RESULTS.md, 2026-11-28: b=12 1,742 against 2,280
 * tok/s). */
#define F8M_WARPS 8
#define F8M_MAX_ROWS 32 /* 4 tiles of x */
template <typename TO, int NT>
static __global__ void __launch_bounds__(F8M_WARPS * 32)
    gemv_f8_mma_kernel(const __nv_bfloat16 *x, f8_segs sg, uint32_t n, uint32_t k) {
    dj_pdl_release();
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int si = 0;
    while (si + 1 < sg.count && blockIdx.x >= sg.first_block[si + 1]) si++;
    const uint32_t m = sg.m[si], j0 = (blockIdx.x - sg.first_block[si]) * 16;
    const uint8_t *wa = sg.w[si] + (size_t)(j0 + g) * k + 16 * t, *wc = wa + (size_t)8 * k;
    const uint32_t bc = sg.bc[si], per_row = (k + bc - 1) / bc;
    const float *sa = sg.scale[si] + (size_t)((j0 + g) / sg.br[si]) * per_row;
    const float *sc = sg.scale[si] + (size_t)((j0 + g + 8) / sg.br[si]) * per_row;
    bool xrow[NT];
    const __nv_bfloat16 *xr[NT];
#pragma unroll
    for (int q = 0; q < NT; q++) {
        xrow[q] = 8 * q + g < n;
        xr[q] = x + (size_t)(xrow[q] ? 8 * q + g : 0) * k + 16 * t;
    }
    const uint32_t chunks = k / 64;
    float acc[NT][4];
#pragma unroll
    for (int q = 0; q < NT; q++) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
    dj_pdl_wait();
#pragma unroll(NT <= 2 ? 2 : 1)
    for (uint32_t ch = warp; ch < chunks; ch += F8M_WARPS) {
        const uint4 qa = *(const uint4 *)(wa + 64 * (size_t)ch), qc = *(const uint4 *)(wc + 64 * (size_t)ch);
        uint32_t xb[NT][8];
#pragma unroll
        for (int q = 0; q < NT; q++) {
            uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
            if (xrow[q]) {
                x0 = *(const uint4 *)(xr[q] + 64 * (size_t)ch);
                x1 = *(const uint4 *)(xr[q] + 64 * (size_t)ch + 8);
            }
            xb[q][0] = x0.x, xb[q][1] = x0.y, xb[q][2] = x0.z, xb[q][3] = x0.w;
            xb[q][4] = x1.x, xb[q][5] = x1.y, xb[q][6] = x1.z, xb[q][7] = x1.w;
        }
        const float s_a = sa[64 * ch / bc], s_c = sc[64 * ch / bc];
        const uint32_t wA[4] = {qa.x, qa.y, qa.z, qa.w}, wC[4] = {qc.x, qc.y, qc.z, qc.w};
        float d[NT][4];
#pragma unroll
        for (int q = 0; q < NT; q++) d[q][0] = d[q][1] = d[q][2] = d[q][3] = 0.0f;
#pragma unroll
        for (int st = 0; st < 4; st++) {
            const uint32_t a[4] = {f8m_pair(wA[st]), f8m_pair(wC[st]), f8m_pair(wA[st] >> 16), f8m_pair(wC[st] >> 16)};
#pragma unroll
            for (int q = 0; q < NT; q++) dj_mma16816(d[q], a, xb[q][2 * st], xb[q][2 * st + 1]);
        }
#pragma unroll
        for (int q = 0; q < NT; q++) {
            acc[q][0] += s_a * d[q][0];
            acc[q][1] += s_a * d[q][1];
            acc[q][2] += s_c * d[q][2];
            acc[q][3] += s_c * d[q][3];
        }
    }
    __shared__ float part[F8M_WARPS][NT * 4][32];
#pragma unroll
    for (int q = 0; q < NT; q++)
#pragma unroll
        for (int i = 0; i < 4; i++) part[warp][q * 4 + i][lane] = acc[q][i];
    __syncthreads();
    if (warp != 0) return;
    TO *out = (TO *)sg.out[si];
#pragma unroll
    for (int q = 0; q < NT; q++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float v = part[0][q * 4 + i][lane];
#pragma unroll
            for (int w = 1; w < F8M_WARPS; w++) v += part[w][q * 4 + i][lane];
            /* d's weight row and its x row */
            const uint32_t j = j0 + g + (i >= 2 ? 8u : 0u), r = 8 * q + 2 * t + (i & 1);
            if (r < n && j < m) {
                const float b = sg.bias[si] ? f8_ld_any(sg.bias[si], sg.bias_dtype[si], j) : 0.0f;
                dj_st(out, (size_t)r * m + j, v + b);
            }
        }
}

/* Whether the tensor-core kernel takes these calls: 2..F8M_MAX_ROWS rows of x outside the deterministic mode
 * (its rows must sum as the one-row kernel does), every segment of whole 16-row bands, k of whole 64-column
 * chunks, 16-byte aligned weights and x, blocks a multiple of 64 columns wide (or the whole row). */
static bool f8_mma_takes(const dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    const dj_op_call *c = &calls[0];
    if (c->n < 2 || c->n > F8M_MAX_ROWS || cb->base.deterministic || c->k % 64 || (uintptr_t)c->x % 16)
        return false;
    for (int i = 0; i < count; i++) {
        const dj_op_call *ci = &calls[i];
        if (ci->m % 16 || (uintptr_t)ci->w % 16 || (ci->w_block_cols % 64 && ci->w_block_cols < ci->k)) return false;
    }
    return true;
}

/* From 9 rows: the tensor-core GEMV up to F8M_PREFER_ROWS rows, and up to F8M_MAX_ROWS where cuBLASLt would not
 * take the call (a bias, f32 out: else dequantized tiles) or would leave rows to a second pass over the weights
 * (rows not a multiple of 4 whose output has no room for them rounded up: dj__cuda_fp8_lt_one_pass). From 20
 * rows cuBLASLt's W8A8 GEMM was the faster one (8B FP8 decode on the H100, b=20 / 24 / 32: 3,223 / 3,769 /
 * 4,550 against the GEMV's 2,885 / 3,347 / 3,838 tok/s; b=16 2,768 / 2,799, bench/RESULTS.md 2026-11-28). */
#define F8M_PREFER_ROWS 16
bool dj__cuda_f8_gemv_takes(const dj_cuda_backend *cb, const dj_op_call *c) {
    return c->w_dtype == DJ_DTYPE_F8_E4M3 && f8_mma_takes(cb, c, 1) &&
           (c->n <= F8M_PREFER_ROWS || !dj__cuda_fp8_lt_one_pass(c) || !dj__cuda_fp8_lt_wanted(cb, c));
}

template <typename TO, int NT>
static void launch_gemv_f8_mma_nt(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    f8_segs sg;
    const unsigned blocks = f8_segs_of(calls, count, 16, &sg);
    dj__launch(cb, gemv_f8_mma_kernel<TO, NT>, dim3(blocks), dim3(F8M_WARPS * 32), 0,
               (const __nv_bfloat16 *)calls[0].x, sg, calls[0].n, calls[0].k);
}

/* One tile of x a MMA's 8 rows: n <= 8, 16, 24 or 32. */
template <typename TO>
static void launch_gemv_f8_mma(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    const uint32_t n = calls[0].n;
    if (n <= 8)
        launch_gemv_f8_mma_nt<TO, 1>(cb, calls, count);
    else if (n <= 16)
        launch_gemv_f8_mma_nt<TO, 2>(cb, calls, count);
    else if (n <= 24)
        launch_gemv_f8_mma_nt<TO, 3>(cb, calls, count);
    else
        launch_gemv_f8_mma_nt<TO, 4>(cb, calls, count);
}

template <typename TO>
static void launch_gemv_f8_rows(dj_cuda_backend *cb, const dj_op_call *calls, int count, bool mma) {
    const uint32_t n = calls[0].n;
    if (mma)
        launch_gemv_f8_mma<TO>(cb, calls, count);
    else if (n == 1)
        launch_gemv_f8<TO, 1>(cb, calls, count);
    else if (n == 2)
        launch_gemv_f8<TO, 2>(cb, calls, count);
    else if (n <= 4)
        launch_gemv_f8<TO, 4>(cb, calls, count);
    else
        launch_gemv_f8<TO, 8>(cb, calls, count);
}

dj_status dj__cuda_gemv_fp8(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    const bool mma = f8_mma_takes(cb, calls, count);
    if (calls[0].n > F8_MAX_ROWS && !mma)
        return dj_fail(DJ_EINTERNAL, "fp8 GEMV of %u rows (at most %d, or %d on the tensor cores)", calls[0].n,
                       F8_MAX_ROWS, F8M_MAX_ROWS);
    if (calls[0].out_dtype == DJ_DTYPE_F32)
        launch_gemv_f8_rows<float>(cb, calls, count, mma);
    else
        launch_gemv_f8_rows<__nv_bfloat16>(cb, calls, count, mma);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

/* ---- more rows: dequantized tiles and cuBLAS ---- */

/* dst[r][i] (bf16, [rows][k]) = weight rows j0 + r of w, scales folded in. */
static __global__ void dequant_f8_kernel(const uint8_t *w, const float *scale, uint32_t br, uint32_t bc, uint32_t k,
                                         uint32_t j0, uint32_t rows, __nv_bfloat16 *dst) {
    const uint32_t per_row = (k + bc - 1) / bc;
    const size_t total = (size_t)rows * k;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const uint32_t r = (uint32_t)(e / k), i = (uint32_t)(e % k), j = j0 + r;
        const float s = scale[(size_t)(j / br) * per_row + i / bc];
        dst[e] = __float2bfloat16(dj_f8_one(w[(size_t)j * k + i]) * s);
    }
}

template <typename TO>
static __global__ void f8_bias_out_kernel(const float *acc, const void *bias, int bias_dtype, TO *out, size_t count,
                                          uint32_t m) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        dj_st(out, i, acc[i] + f8_ld_any(bias, bias_dtype, i % m));
}

/* The tile's weight rows: ~F8_TILE_BYTES of bf16, a multiple of 128 rows, at
 * most m. */
static uint32_t tile_rows(uint32_t k, uint32_t m) {
    size_t t = F8_TILE_BYTES / ((size_t)k * 2);
    t = t / 128 * 128;
    if (t < 128) t = 128;
    return t > m ? m : (uint32_t)t;
}

/* batched decode and prefill: the FP8 tensor cores where cuBLASLt takes the call (W8A8, the
 * activations quantized per 128 channels), else the tiles below - 128x128 blocks, and per-channel
 * / per-tensor weights (their row scales as VEC128 scales; cuda_matmul_fp8_lt.cu). */
bool dj__cuda_fp8_lt_wanted(const dj_cuda_backend *cb, const dj_op_call *c) {
    return (cb->matmul_path == 3 || (cb->matmul_path == 0 && c->n >= F8_LT_MIN_ROWS)) && dj__cuda_fp8_lt_covers(cb, c);
}

dj_status dj__cuda_matmul_fp8(dj_cuda_backend *cb, const dj_op_call *c) {
    if (dj__cuda_fp8_lt_wanted(cb, c)) {
        const dj_status lt = dj__cuda_matmul_fp8_lt(cb, c);
        if (lt != DJ_EUNSUPPORTED) return lt;
    }
    const uint32_t n = c->n, k = c->k, m = c->m, tr = tile_rows(k, m);
    const bool f32_out = c->out_dtype == DJ_DTYPE_F32;
    /* scratch: the bf16 tile, then (with a bias) f32 accumulators [n][m] */
    const size_t tile_floats = ((size_t)tr * k + 1) / 2, acc_floats = c->bias ? (size_t)n * m : 0;
    float *scr = NULL;
    dj_status st = dj__cuda_scratch(cb, tile_floats + 64 + acc_floats, &scr);
    if (st != DJ_OK) return st;
    __nv_bfloat16 *tile = (__nv_bfloat16 *)scr;
    float *acc = c->bias ? scr + (tile_floats + 63) / 64 * 64 : NULL;
    void *dst = c->bias ? (void *)acc : c->out;
    const cudaDataType_t dt = c->bias || f32_out ? CUDA_R_32F : CUDA_R_16BF;
    const size_t osz = c->bias || f32_out ? 4 : 2;
    const float alpha = 1.0f, beta = 0.0f;
    for (uint32_t j0 = 0; j0 < m; j0 += tr) {
        const uint32_t rows = m - j0 < tr ? m - j0 : tr;
        size_t blocks = ((size_t)rows * k + 255) / 256, cap = (size_t)cb->n_sm * 32;
        if (blocks > cap) blocks = cap;
        dequant_f8_kernel<<<(unsigned)blocks, 256, 0, cb->stream>>>((const uint8_t *)c->w, c->w_scale,
                                                                    c->w_block_rows, c->w_block_cols, k, j0, rows,
                                                                    tile);
        DJ_CU_LAUNCHED(cb);
        /* column-major: out^T[j0.., n] (ld m) = tile[k, rows]^T x^T[k, n] */
        DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)k, &alpha, tile,
                                   CUDA_R_16BF, (int)k, c->x, CUDA_R_16BF, (int)k, &beta,
                                   (uint8_t *)dst + (size_t)j0 * osz, dt, (int)m, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    }
    if (c->bias) {
        const size_t count = (size_t)n * m;
        size_t blocks = (count + 255) / 256, cap = (size_t)cb->n_sm * 16;
        if (blocks > cap) blocks = cap;
        if (f32_out)
            f8_bias_out_kernel<<<(unsigned)blocks, 256, 0, cb->stream>>>(acc, c->bias, (int)c->bias_dtype,
                                                                         (float *)c->out, count, m);
        else
            f8_bias_out_kernel<<<(unsigned)blocks, 256, 0, cb->stream>>>(acc, c->bias, (int)c->bias_dtype,
                                                                         (__nv_bfloat16 *)c->out, count, m);
        DJ_CU_LAUNCHED(cb);
    }
    return DJ_OK;
}
