/* cuda_q4.cu: out[n,m] = x[n,k] @ w[m,k]^T (+ bias) for 4-bit weights
 * (DJ_DTYPE_Q4, djinn/dtype.h: 16-row bands where m % 16 == 0, else rows),
 * bf16 x, f32 accumulation:
 *  - up to Q4_MMA_ROWS rows (decode, batched decode): a GEMV on the tensor
 *    cores (mma.m16n8k16, bf16 -> f32), the codes turned into the exact bf16
 *    pairs (128 + code) in registers, two a LOP3; 16-byte loads where x and
 *    the rows allow, else 4-byte ones. Calls on one x are grouped into one
 *    launch as the 16-bit GEMVs are (cuda_plan.cu). Banded, a warp's load of
 *    a group's codes is 512 contiguous bytes and its tile's scales and zeros
 *    64 (rows: 64 bytes of each of 8 rows, a row apart, and 2-byte loads from
 *    8 rows' ends), the pattern that loads alone measured faster
 *    (bench_q4_loads, bench/RESULTS.md).
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
    __nv_bfloat16 *glu_out; /* GLU kernels: act(gate) * up, [n][m] */
};

static __device__ uint4 q4_zero[4]; /* 64 bytes of zeros: the x of rows past n */

static __device__ __forceinline__ float q4_bias(const void *p, int t, uint32_t j) {
    switch (t) {
    case DJ_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[j]);
    case DJ_DTYPE_F16: return __half2float(((const __half *)p)[j]);
    default: return ((const float *)p)[j];
    }
}

/* 16 bytes at p: one load (V16: p 16-byte aligned) or four (p 4-byte aligned). */
template <bool V16>
static __device__ __forceinline__ uint4 q4_load16(const uint8_t *p) {
    if constexpr (V16) {
        return *(const uint4 *)p;
    } else {
        const uint32_t *q = (const uint32_t *)p;
        return make_uint4(q[0], q[1], q[2], q[3]);
    }
}

static __device__ __forceinline__ uint32_t q4_bf16x2(float v) {
    const uint32_t b = __bfloat16_as_ushort(__float2bfloat16(v));
    return b | b << 16;
}
/* a - b on bf16 pairs (exact here: (128 + code) - (128 + zero), integers -16..15) */
static __device__ __forceinline__ uint32_t q4_sub2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

/* Group gi of the lane's two A rows: their 16 bytes of codes at wa and wc
 * (BAND: 1 KiB a group, else 64 bytes) and their scales and zeros from ma and
 * mc (BAND: 4 bytes a row, scale then zero, 64 bytes a group; else the row's
 * f16 scales, its ng zero points after them). */
template <bool V16, bool BAND>
static __device__ __forceinline__ void q4_load_group(const uint8_t *wa, const uint8_t *wc, const uint8_t *ma,
                                                     const uint8_t *mc, uint32_t gi, uint32_t ng, uint4 &qa,
                                                     uint4 &qc, __half (&qs)[4]) {
    qa = q4_load16<V16>(wa + (BAND ? 1024 : 64) * (size_t)gi);
    qc = q4_load16<V16>(wc + (BAND ? 1024 : 64) * (size_t)gi);
    if constexpr (BAND) {
        const uint32_t a = *(const uint32_t *)(ma + 64 * (size_t)gi), c = *(const uint32_t *)(mc + 64 * (size_t)gi);
        qs[0] = __ushort_as_half((unsigned short)(a & 0xffffu)), qs[1] = __ushort_as_half((unsigned short)(a >> 16));
        qs[2] = __ushort_as_half((unsigned short)(c & 0xffffu)), qs[3] = __ushort_as_half((unsigned short)(c >> 16));
    } else {
        const __half *sa = (const __half *)ma, *sc = (const __half *)mc;
        qs[0] = sa[gi], qs[1] = sa[ng + gi], qs[2] = sc[gi], qs[3] = sc[ng + gi];
    }
}

/* The tensor-core GEMV (aligned rows, up to 8 * NT rows of x): a warp takes
 * 16 weight rows (A of mma.m16n8k16) against NT tiles of 8 x rows (B), one
 * group of 128 columns a step. Lane (g = lane / 4, t = lane % 4) loads 16
 * bytes of rows g and g + 8: the group's columns 32t..32t+31, word w holding
 * 32t+8w..32t+8w+7. The MMA's k order is a permutation of the columns that
 * depends on t alone (A and B use the same one, so the dot products are
 * unchanged): step (w, h) gives the lane the columns 8w + {4h, 4h+1} (its
 * k 2t, 2t+1) and 8w + {4h+2, 4h+3} (k 2t+8, 2t+9) - exactly the bf16 pairs
 * (128 + code) one LOP3 makes of word w ((w >> 4i) & 0x000F000F |
 * 0x43004300: nibbles i and i + 4, columns 2i and 2i + 1 in djinn/dtype.h's
 * order), and B's pairs two of the lane's x words as loaded (the nibbles in
 * column order took a PRMT for each B register: AWQ decode b=1 on the H100
 * 2.63-2.64 -> 2.55-2.57 ms, bench/RESULTS.md 2026-11-27). One bf16x2 subtraction of (128 + zero) pairs
 * makes them code - zero (exact: integers -16..15), so a group adds
 * s * sum (code - zero) x to its rows (a second MMA against ones, for sum x
 * and s * (sum (128 + code) x - (128 + zero) sum x), before 2026-11-27: the
 * GLU kernel 31.1 -> 29.3 us, AWQ decode b=1 2.63-2.65 -> 2.61-2.64 ms, b=32
 * 3,313 -> 3,517 tok/s; bench/RESULTS.md). Every x row is its own MMA column, and KS comes from m alone
 * (q4_ks): a row's sum depends on m and k only. The loads of the next U groups
 * - codes, scales and zero points - are issued before the MMAs of these U
 * (the scales and zeros loaded where they were used put a memory round trip
 * in every step: AWQ decode b=1 on the H100 2.97 -> 2.89 ms, b=2 618 -> 636
 * tok/s with them prefetched; bench/RESULTS.md, 2026-11-26). U, the groups a
 * step: 1 for one tile of x rows without the GLU, else 2 (H100, 2026-11-27:
 * U = 1 there took the 8B shape's q/k/v 10.5 -> 9.6 us, o 6.2 -> 5.3, down
 * 15.2 -> 14.3 but gate/up+GLU 31.7 -> 32.4; decode with U = 1 or 2 for every
 * one-tile kernel 2.70-2.75 ms against 2.64-2.66; 3 slower). V16: x and every row 16-byte
 * aligned (k a multiple of 512), else the same bytes in 4-byte loads. BAND (every
 * segment's m % 16 == 0, djinn/dtype.h): lane l's 16 bytes of a group are chunk l of
 * the band's 1 KiB block (rows g of the tile; chunk l + 32 for rows g + 8, and for a
 * GLU tile at the odd 8 rows of a band), the scale and zero of a row one 4-byte
 * load; V16 then needs x and the base 16-byte aligned only (a band is 16 * rb
 * bytes, a multiple of 16); m % 16 == 0 leaves no partial tile. Measured against
 * the CUDA-core GEMV it replaced (4 rows a warp, each lane widening x to
 * floats and summing (128 + code) x with FMAs) on the 8B shape's AWQ
 * checkpoint (H200, 2026-11-26, bench/RESULTS.md): decode b=1 the same
 * within noise, b=2 360 -> 636 tok/s, b=32 2,027 -> 3,191 (those took the
 * dequantized tiles).
 * GLU (1 SiLU, 2 GELU-tanh): segments 0 and 1 are gate and up of one m; a
 * tile is rows j0..j0+7 of gate (A rows g) and the same rows of up (A rows
 * g + 8), so a lane holds gate and up of row j0 + g: it stores both (bf16, as
 * the GEMV would) and act(gate) * up as the GLU kernel would - every value
 * bit-equal to the launches apart (each row's sum is the same chain of MMAs,
 * and KS comes from m); with one tile of x rows its launch bounds ask for
 * 3 blocks an SM (80 registers, no spills, where it takes 95 - q4_ks says
 * what that gained). Else a minimum of 1 block an SM in the launch bounds
 * changes what ptxas makes of one tile of x rows without the GLU: 80
 * registers where left alone it takes 66 (84 and 76 with the second MMA),
 * and left alone ran slower - AWQ decode b=1 on the H100 2.62-2.64 against
 * 2.65-2.72 ms, b=32 3,449 against 3,096 tok/s (bench/RESULTS.md,
 * 2026-11-27). */
template <typename TO, int NT, int KS, bool V16, bool BAND, int GLU>
static __global__ void __launch_bounds__(Q4_WARPS * 32, NT == 1 && GLU ? 3 : 1)
    gemv_q4_mma_kernel(const __nv_bfloat16 *x, q4_segs sg, uint32_t n, uint32_t k) {
    static_assert(Q4_WARPS % KS == 0, "a block holds whole row tiles");
    constexpr int U = NT == 1 && GLU == 0 ? 1 : 2; /* groups a step (above) */
    dj_pdl_release();
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = warp % KS;
    const uint32_t g = lane >> 2, t = lane & 3;
    int si = 0;
    while (!GLU && si + 1 < sg.count && blockIdx.x >= sg.first_block[si + 1]) si++;
    const uint32_t m = sg.m[si];
    const uint32_t j0 = ((blockIdx.x - sg.first_block[si]) * (Q4_WARPS / KS) + warp / KS) * (GLU ? 8 : 16);
    if (KS == 1 && j0 >= m) return; /* with KS > 1 every warp reaches the block's barrier */
    const uint32_t ng = k / DJ_Q4_GROUP;
    const uint32_t ra = j0 + g < m ? j0 + g : m - 1; /* past m: reread */
    const uint32_t rc = GLU ? ra : j0 + g + 8 < m ? j0 + g + 8 : m - 1;
    const uint8_t *wlo = sg.w[si], *whi = sg.w[GLU ? 1 : si];
    /* group 0's bytes of rows ra and rc (BAND: ra's chunk is the lane's, rc's 32 on or at the lane's) */
    const uint8_t *wa = wlo + dj_q4_codes_at(m, k, ra, 0) + 16 * t, *wc = whi + dj_q4_codes_at(m, k, rc, 0) + 16 * t;
    const uint8_t *ma = wlo + dj_q4_scale_at(m, k, ra, 0), *mc = whi + dj_q4_scale_at(m, k, rc, 0);
    /* weights are constant: the first U groups' loads go out before the wait, and each
     * step's loads of the next U groups before its MMAs */
    uint4 qa[U], qc[U];
    __half qs[U][4]; /* the groups' scale and zero of rows ra and rc */
#pragma unroll
    for (int u = 0; u < U; u++) {
        const uint32_t gi = ks + u * KS;
        if (j0 < m && gi < ng) q4_load_group<V16, BAND>(wa, wc, ma, mc, gi, ng, qa[u], qc[u], qs[u]);
    }
    /* the lane's x row of each tile (its 64 bytes of a group, 256 bytes a group on), or past n the
     * zeros of q4_zero (no step): every lane loads, none branches (a branch and 16 zeroed registers
     * a group and tile before: AWQ decode b=1 2.85 -> 2.72 ms, b=32 2,830 -> 3,210 tok/s) */
    const uint8_t *xb[NT];
    uint32_t xs[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const uint32_t xr = 8 * nt + g;
        xb[nt] = xr < n ? (const uint8_t *)(x + (size_t)xr * k) + 64 * t : (const uint8_t *)q4_zero;
        xs[nt] = xr < n ? 256u : 0u;
    }
    dj_pdl_wait();
    float tot[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) tot[nt][i] = 0.0f;
    for (uint32_t gb = ks; j0 < m && gb < ng; gb += KS * U) {
        uint4 na[U], nc[U];
        __half ns[U][4];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint32_t gi = gb + (U + u) * KS;
            if (gi < ng) q4_load_group<V16, BAND>(wa, wc, ma, mc, gi, ng, na[u], nc[u], ns[u]);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint32_t gi = gb + u * KS;
            if (gi >= ng) break;
            const uint32_t a4[4] = {qa[u].x, qa[u].y, qa[u].z, qa[u].w}, c4[4] = {qc[u].x, qc[u].y, qc[u].z, qc[u].w};
            const float s0 = __half2float(qs[u][0]);
            const float z0 = 128.0f + __half2float(qs[u][1]);
            const float s1 = __half2float(qs[u][2]);
            const float z1 = 128.0f + __half2float(qs[u][3]);
            /* 128 + zero of rows ra and rc as bf16 pairs (exact: integers to 144) */
            const uint32_t za = q4_bf16x2(z0), zc = q4_bf16x2(z1);
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint32_t xw[16];
                const uint8_t *xp = xb[nt] + xs[nt] * gi;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const uint4 v = q4_load16<V16>(xp + 16 * i);
                    xw[4 * i] = v.x, xw[4 * i + 1] = v.y, xw[4 * i + 2] = v.z, xw[4 * i + 3] = v.w;
                }
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int w = 0; w < 4; w++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint32_t a[4] = {((a4[w] >> (8 * h)) & 0x000F000Fu) | 0x43004300u,
                                               ((c4[w] >> (8 * h)) & 0x000F000Fu) | 0x43004300u,
                                               ((a4[w] >> (8 * h + 4)) & 0x000F000Fu) | 0x43004300u,
                                               ((c4[w] >> (8 * h + 4)) & 0x000F000Fu) | 0x43004300u};
                        const uint32_t b0 = xw[4 * w + 2 * h], b1 = xw[4 * w + 2 * h + 1];
                        const uint32_t d[4] = {q4_sub2(a[0], za), q4_sub2(a[1], zc), q4_sub2(a[2], za),
                                               q4_sub2(a[3], zc)};
                        dj_mma16816(c, d, b0, b1);
                    }
                tot[nt][0] = fmaf(s0, c[0], tot[nt][0]);
                tot[nt][1] = fmaf(s0, c[1], tot[nt][1]);
                tot[nt][2] = fmaf(s1, c[2], tot[nt][2]);
                tot[nt][3] = fmaf(s1, c[3], tot[nt][3]);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            qa[u] = na[u], qc[u] = nc[u];
#pragma unroll
            for (int i = 0; i < 4; i++) qs[u][i] = ns[u][i];
        }
    }
    if constexpr (KS > 1) {
        __shared__ float part[Q4_WARPS][NT][4][32];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) part[warp][nt][i][lane] = tot[nt][i];
        __syncthreads();
        if (ks != 0 || j0 >= m) return;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float v = part[warp][nt][i][lane];
                for (int p = 1; p < KS; p++) v += part[warp + p][nt][i][lane];
                tot[nt][i] = v;
            }
    }
    if constexpr (GLU != 0) {
        const uint32_t j = j0 + g;
        if (j >= m) return;
        const float bg = sg.bias[0] ? q4_bias(sg.bias[0], sg.bias_dtype[0], j) : 0.0f;
        const float bu = sg.bias[1] ? q4_bias(sg.bias[1], sg.bias_dtype[1], j) : 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const uint32_t r = 8 * nt + 2 * t + i;
                if (r >= n) continue;
                const size_t o = (size_t)r * m + j;
                const __nv_bfloat16 gv = __float2bfloat16(tot[nt][i] + bg), uv = __float2bfloat16(tot[nt][i + 2] + bu);
                ((__nv_bfloat16 *)sg.out[0])[o] = gv;
                ((__nv_bfloat16 *)sg.out[1])[o] = uv;
                const float a = GLU == 1 ? dj_silu_fn()(__bfloat162float(gv)) : dj_gelu_fn()(__bfloat162float(gv));
                sg.glu_out[o] = __float2bfloat16(a * __bfloat162float(uv));
            }
        return;
    }
    TO *out = (TO *)sg.out[si];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t j = j0 + g + (i >= 2 ? 8 : 0);
        if (j >= m) continue;
        const float b = sg.bias[si] ? q4_bias(sg.bias[si], sg.bias_dtype[si], j) : 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint32_t r = 8 * nt + 2 * t + (i & 1);
            if (r < n) dj_st(out, (size_t)r * m + j, tot[nt][i] + b);
        }
    }
}

/* Rows [j0, j0 + rows) of a Q4 matrix w of m rows (rows or bands) to bf16
 * [rows][k]: a thread per 4-byte word (word i of a row: word i % 16 of group
 * i / 16's 64 bytes). */
static __global__ void dequant_q4_kernel(const uint8_t *w, uint32_t m, uint32_t k, uint32_t j0, uint32_t rows,
                                         __nv_bfloat16 *out) {
    const uint32_t words = k / 8;
    const size_t total = (size_t)rows * words;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < total; t += (size_t)gridDim.x * blockDim.x) {
        const size_t r = t / words, j = j0 + r;
        const uint32_t i = (uint32_t)(t % words), gi = i / 16;
        const uint32_t q = *(const uint32_t *)(w + dj_q4_codes_at(m, k, j, gi) + 4 * (size_t)(i % 16));
        const float s = __half2float(*(const __half *)(w + dj_q4_scale_at(m, k, j, gi)));
        const float mz = 8388608.0f + __half2float(*(const __half *)(w + dj_q4_zero_at(m, k, j, gi)));
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

/* calls of one KS (q4_ks) and one layout as one launch; GLU: gate and up of one m. */
template <typename TO, int NT, int KS, bool V16, bool BAND, int GLU>
static void launch_mma_ks(dj_cuda_backend *cb, const dj_op_call *calls, int count, __nv_bfloat16 *glu_out) {
    q4_segs sg;
    memset(&sg, 0, sizeof sg);
    unsigned blocks = 0;
    const uint32_t rows = GLU ? 8 : 16; /* of each segment, a warp */
    for (int i = 0; i < count; i++) {
        sg.w[i] = (const uint8_t *)calls[i].w;
        sg.bias[i] = calls[i].bias;
        sg.bias_dtype[i] = (int)calls[i].bias_dtype;
        sg.out[i] = calls[i].out;
        sg.m[i] = calls[i].m;
        sg.first_block[i] = blocks;
        if (!GLU || i == 0) blocks += (calls[i].m + Q4_WARPS / KS * rows - 1) / (Q4_WARPS / KS * rows);
    }
    sg.count = count;
    sg.glu_out = glu_out;
    dj__launch(cb, gemv_q4_mma_kernel<TO, NT, KS, V16, BAND, GLU>, dim3(blocks), dim3(Q4_WARPS * 32), 0,
               (const __nv_bfloat16 *)calls[0].x, sg, calls[0].n, calls[0].k);
}

/* V16 where x, the weights and (rows) rb are 16-byte aligned: a band's 16 * rb always is. */
template <typename TO, int NT, int KS, int GLU>
static void launch_mma_v(dj_cuda_backend *cb, const dj_op_call *calls, int count, __nv_bfloat16 *glu_out, bool band) {
    uintptr_t align = (uintptr_t)calls[0].x | (band ? 0 : (uintptr_t)dj_dtype_row_bytes(DJ_DTYPE_Q4, calls[0].k));
    for (int i = 0; i < count; i++) align |= (uintptr_t)calls[i].w;
    if (align % 16 == 0) {
        if (band) launch_mma_ks<TO, NT, KS, true, true, GLU>(cb, calls, count, glu_out);
        else launch_mma_ks<TO, NT, KS, true, false, GLU>(cb, calls, count, glu_out);
    } else {
        if (band) launch_mma_ks<TO, NT, KS, false, true, GLU>(cb, calls, count, glu_out);
        else launch_mma_ks<TO, NT, KS, false, false, GLU>(cb, calls, count, glu_out);
    }
}

/* KS for m weight rows: the fewest warps a 16-row tile that still give
 * every SM two blocks for these rows alone - so a row's sum depends on m and
 * k only: the same alone, in a GEMV group, fused with its GLU, and at every
 * n (the deterministic mode's 8-row pieces of a large batch run alone).
 * The 8B shape's gate/up+GLU thus splits k over 4 warps (896 blocks) at 80
 * registers, 3 blocks an SM (its launch bounds' minimum for one tile of x
 * rows): AWQ decode b=1 on the H100 2.63-2.64 -> 2.57-2.58 ms, where either
 * change alone was slower (2.66-2.67: 448 blocks over 396 places, or 896 at
 * 95 registers, 2 an SM; bench/RESULTS.md, 2026-11-27). One block an SM
 * took 2 warps a tile there while its GLU kernel held 95 registers (2.80 ->
 * 2.74 ms against two, 2026-11-27); at most 4 warps a tile (4,096 rows then
 * take 128 blocks) left the SMs too few warps: 3.2 ms. */
static int q4_ks(const dj_cuda_backend *cb, uint32_t m) {
    const uint32_t tiles = (m + 15) / 16, want = 2u * (uint32_t)cb->n_sm;
    if ((tiles + Q4_WARPS - 1) / Q4_WARPS >= want) return 1;
    if ((tiles + Q4_WARPS / 2 - 1) / (Q4_WARPS / 2) >= want) return 2;
    if ((tiles + Q4_WARPS / 4 - 1) / (Q4_WARPS / 4) >= want) return 4;
    return 8;
}

/* One launch for calls of one KS and one layout (banded or rows), else a launch a call. */
template <typename TO, int NT, int GLU>
static void launch_mma(dj_cuda_backend *cb, const dj_op_call *calls, int count, __nv_bfloat16 *glu_out) {
    const int ks = q4_ks(cb, calls[0].m);
    const bool band = dj_q4_banded(calls[0].m);
    for (int i = 1; i < count; i++)
        if (q4_ks(cb, calls[i].m) != ks || (bool)dj_q4_banded(calls[i].m) != band) {
            for (int j = 0; j < count; j++) launch_mma<TO, NT, GLU>(cb, &calls[j], 1, glu_out);
            return;
        }
    switch (ks) {
    case 1: launch_mma_v<TO, NT, 1, GLU>(cb, calls, count, glu_out, band); break;
    case 2: launch_mma_v<TO, NT, 2, GLU>(cb, calls, count, glu_out, band); break;
    case 4: launch_mma_v<TO, NT, 4, GLU>(cb, calls, count, glu_out, band); break;
    default: launch_mma_v<TO, NT, 8, GLU>(cb, calls, count, glu_out, band); break;
    }
}

bool dj__cuda_q4_mma_takes(const dj_op_call *c) {
    return c->w_dtype == DJ_DTYPE_Q4 && ((uintptr_t)c->x | (uintptr_t)c->w) % 4 == 0 && c->n <= Q4_MMA_ROWS;
}

template <typename TO, int GLU>
static void launch_q4(dj_cuda_backend *cb, const dj_op_call *calls, int count, __nv_bfloat16 *glu_out) {
    const uint32_t n = calls[0].n;
    if (n <= 8)
        launch_mma<TO, 1, GLU>(cb, calls, count, glu_out);
    else if (n <= 16)
        launch_mma<TO, 2, GLU>(cb, calls, count, glu_out);
    else
        launch_mma<TO, 4, GLU>(cb, calls, count, glu_out);
}

bool dj__cuda_q4_glu_takes(const dj_op_call *gate, const dj_op_call *up, const dj_op_call *glu) {
    return (glu->op == DJ_OP_SILU_MUL || glu->op == DJ_OP_GELU_MUL) && dj__cuda_q4_mma_takes(gate) &&
           dj__cuda_q4_mma_takes(up) && up->x == gate->x && up->n == gate->n && up->k == gate->k &&
           up->m == gate->m && gate->out_dtype == DJ_DTYPE_BF16 && up->out_dtype == DJ_DTYPE_BF16 &&
           glu->x == gate->out && glu->x2 == up->out && (uint64_t)glu->n * glu->d == (uint64_t)gate->n * gate->m;
}

dj_status dj__cuda_gemv_q4_glu(dj_cuda_backend *cb, const dj_op_call *gate_up, const dj_op_call *glu) {
    if (glu->op == DJ_OP_SILU_MUL)
        launch_q4<__nv_bfloat16, 1>(cb, gate_up, 2, (__nv_bfloat16 *)glu->out);
    else
        launch_q4<__nv_bfloat16, 2>(cb, gate_up, 2, (__nv_bfloat16 *)glu->out);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

dj_status dj__cuda_gemv_q4(dj_cuda_backend *cb, const dj_op_call *calls, int count) {
    for (int i = 0; i < count; i++) /* reached only by the deterministic 8-row pieces of unaligned x */
        if (!dj__cuda_q4_mma_takes(&calls[i])) {
            for (int j = 0; j < count; j++) {
                const dj_status st = dj__cuda_gemm_q4(cb, &calls[j]);
                if (st != DJ_OK) return st;
            }
            return DJ_OK;
        }
    if (calls[0].out_dtype == DJ_DTYPE_F32)
        launch_q4<float, 0>(cb, calls, count, NULL);
    else
        launch_q4<__nv_bfloat16, 0>(cb, calls, count, NULL);
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
    const cudaDataType_t dt = c->bias || f32_out ? CUDA_R_32F : CUDA_R_16BF;
    const size_t es = c->bias || f32_out ? 4 : 2;
    void *dst = c->bias ? (void *)acc : c->out;
    const float alpha = 1.0f, beta = 0.0f;
    for (uint32_t j0 = 0; j0 < m; j0 += tile) {
        const uint32_t rows = m - j0 < tile ? m - j0 : tile;
        const size_t words = (size_t)rows * (k / 8);
        size_t blocks = (words + 255) / 256, cap = (size_t)cb->n_sm * 16;
        if (blocks > cap) blocks = cap;
        dequant_q4_kernel<<<(unsigned)blocks, 256, 0, cb->stream>>>((const uint8_t *)c->w, m, k, j0, rows, wt);
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
