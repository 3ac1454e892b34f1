/* cuda_attention_tc.cu: prefill attention on tensor cores (flash-attention
 * style): bf16 Q/K/V from the paged KV layout, mma.sync m16n8k16 with f32
 * accumulation, online softmax in registers, causal/sliding-window masking
 * with whole tiles skipped, Gemma 2's score soft-cap (the CAP instantiations),
 * one or two 16-row strips a warp (ST: two share each K/V fragment).
 * head_dim 64, 128 or 256, consecutive rows only; the dispatcher
 * (cuda_attention.cu) sends every other shape to the f32 kernels. head_dim
 * 256 keeps the Q tile in shared memory (QS) and reads each k-step's A
 * fragment from there: in registers it would take 64 of them beside the
 * 128 of the output accumulators.
 * f8_e4m3 pages (the F8 instantiation): each thread loads 8 codes (8 bytes)
 * and their page's exponent of the head and stores the 8 dequantized values (code *
 * 2^exp, exact in bf16) into the same bf16 tile, so the mma part is the
 * same; cp.async cannot convert, so these tile loads are plain loads (their
 * commit groups are empty) and only the bf16 path overlaps loads and math.
 * Each tile's K/V row addresses (page lookup, row in page) are computed once
 * per key into shared memory, not once per loaded 16-byte chunk: address
 * arithmetic was most of the kernel's integer and FMA-pipe instructions
 * (ncu, session 10; H100 2048 x 2048 rows, 32:8 heads of 128: 216 -> 192 us). */
#include <math.h>

#include "backend/cuda/attn_rows.cuh"
#include "backend/cuda/cuda_impl.h"
#include "backend/fastdiv.h"

/* Query rows per block: 64, 16 per warp (the kernel's BM parameter). */
#define TC_BN 64      /* key positions per K/V tile */
#define TC_WARPS 4    /* warps per block, each 16 query rows a strip */
#define TC_THREADS (TC_WARPS * 32)
#define TC_PAD 8      /* bf16 elements of padding per smem row: rows 16 B apart mod 128 B, so ldmatrix is conflict-free */

struct tc_args {
    const __nv_bfloat16 *q; /* [n][nh][hd] */
    __nv_bfloat16 *out;     /* [n][nh][hd] */
    const uint8_t *seg;     /* data segment base */
    size_t page_bytes;
    const uint32_t *table;  /* device block table */
    uint32_t tpp, kv_dim, n, nh, group, pos0, window;
    dj_fastdiv tpp_div;     /* t / tpp: a K/V row's page (a divide per loaded chunk was most of the kernel's
                             * ALU work - ncu: ALU the busiest pipe, issue-bound at 3 warps a scheduler) */
    uint32_t nkv;           /* kv heads (f8 pages: the exponents' row length) */
    float scale_log2;       /* scale * log2(e): p = 2^(dot * scale_log2 - max) */
    float scale_cap;        /* CAP: scale / softcap */
    float cap_log2;         /* CAP: softcap * log2(e); score = cap_log2 * tanh(dot * scale_cap) */
};

static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; bytes = 0 stores zeros. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, uint32_t bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* ldmatrix .x4: lanes 8j..8j+7 give the row addresses of 8x8 matrix j (16 B
 * each); afterwards r[j] of lane l holds row l/4, columns 2(l%4), 2(l%4)+1 of
 * matrix j (lower half = lower column). With .trans, r[j] holds rows
 * 2(l%4), 2(l%4)+1 of column l/4 instead. */
static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* tanh for the soft-cap: MUFU.TANH (tanh.approx.f32, relative error about
 * 2^-11, below the bf16 rounding of the probabilities it feeds). H100,
 * Gemma-2-9B prefill 2048 (tools/ktrace.c, 2026-11-27): 222 -> 205 us a
 * layer against tanhf. */
static __device__ __forceinline__ float cap_tanh(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Block (head, row tile); heavy (late) row tiles are launched first. Warp w
 * owns ST strips of 16 query rows, 16 ST w .. 16 ST w + 16 ST - 1 of the tile;
 * lane l holds rows g = l/4 and g+8 of each strip in every C fragment, and
 * each K and V fragment it loads serves all its strips. Shared memory: K and V
 * tiles [64][HD+8] bf16 (Q passes through them once, into registers, or stays
 * in a tile of its own: QS). */
/* Two f8 codes (lower byte first) times 2^e as a packed bf16x2 (exact). */
static __device__ __forceinline__ uint32_t f8x2_bf16x2(uint32_t codes, float sc) {
    const float2 f = dj_f8x2_to_float2((uint16_t)codes);
    return attn_pack_bf16(f.x * sc, f.y * sc);
}

/* Shared memory of a block of bm query rows: K and V tiles, and the Q tile
 * where it stays there (QS); otherwise Q passes through the K and V buffers
 * once. */
static constexpr __host__ __device__ size_t tc_tiles_bytes(int hd, bool qs, int bm) {
    return (size_t)(2 * TC_BN + (qs ? bm : 0)) * (hd + TC_PAD) * 2;
}
/* ... then the K/V rows' addresses of two tiles (tc_rows). */
static constexpr size_t tc_smem_bytes(int hd, bool qs, int bm) {
    return tc_tiles_bytes(hd, qs, bm) + 2 * 2 * TC_BN * sizeof(uint64_t);
}

template <int HD, int ST, bool F8, bool CAP, bool QS, int MINB>
static __global__ void __launch_bounds__(TC_THREADS, MINB) attn_tc_kernel(tc_args a) {
    constexpr uint32_t TC_BM = 16 * TC_WARPS * ST; /* query rows of the block */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int SK = HD + TC_PAD; /* smem row stride, elements */
    constexpr int CH = HD / 8;      /* 16-byte chunks per row */
    constexpr int KS = HD / 16;     /* k-steps over head_dim */
    constexpr int NB = TC_BN / 8;   /* 8-key n-blocks of a score tile */
    constexpr int DB = HD / 8;      /* 8-dim n-blocks of the output */
    static_assert(QS || TC_BM <= 2 * TC_BN, "Q passes through the K and V buffers");
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)smem_raw;
    __nv_bfloat16 *Vs = Ks + TC_BN * SK;
    __nv_bfloat16 *Qs = QS ? Vs + TC_BN * SK : Ks;
    /* Per key of a tile, computed once per tile by TC_BN threads (the page
     * lookup and its divide once per row, not once per loaded chunk): the
     * byte offset from seg of its K row's kv head (~0: past the context),
     * and for f8 pages of its K exponent; V's follow at fixed distances.
     * Two tiles' worth, [parity][key]: the next tile's are written while
     * this one's are read. */
    uint64_t *rowoff = (uint64_t *)(smem_raw + tc_tiles_bytes(HD, QS, TC_BM));
    uint64_t *expoff = rowoff + 2 * TC_BN;
    constexpr size_t ES = F8 ? 1 : sizeof(__nv_bfloat16);
    const size_t v_rows = (size_t)a.tpp * a.kv_dim * ES; /* bytes from a K row to its V row */

    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
    const uint32_t h = blockIdx.x, r0 = (gridDim.y - 1 - blockIdx.y) * TC_BM, kvh = h / a.group;
    const uint32_t rows_end = min(r0 + TC_BM, a.n); /* exclusive */
    const uint32_t hi = a.pos0 + rows_end - 1;      /* last position any row of the block sees */
    const uint32_t lo = attn_first_pos(a.pos0 + r0, a.window);

    auto tc_rows = [&](uint32_t parity, uint64_t tile) {
        if (threadIdx.x < TC_BN) {
            const uint64_t t = tile + threadIdx.x;
            uint64_t ro = ~0ull, eo = 0;
            if (t <= hi) {
                const uint32_t tt = (uint32_t)t, pi = dj_fastdiv_q(tt, a.tpp_div), r = tt - pi * a.tpp;
                const size_t pg = (size_t)a.table[pi] * a.page_bytes;
                ro = pg + ((size_t)r * a.kv_dim + (size_t)kvh * HD) * ES;
                eo = pg + dj_kv_f8_exps_at(a.tpp, a.kv_dim) + kvh; /* f8 only: the page's K exponent of the head */
            }
            rowoff[parity * TC_BN + threadIdx.x] = ro;
            expoff[parity * TC_BN + threadIdx.x] = eo;
        }
    };
    tc_rows(0, lo); /* published by the barrier below */

    /* Q tile -> its buffer (rows beyond n are zeros) -> A fragments, here or per k-step (QS). */
    for (uint32_t e = threadIdx.x; e < TC_BM * CH; e += TC_THREADS) {
        const uint32_t r = e / CH, ch = e % CH;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (r0 + r < a.n) v = *(const uint4 *)(a.q + ((size_t)(r0 + r) * a.nh + h) * HD + ch * 8);
        *(uint4 *)(Qs + r * SK + ch * 8) = v;
    }
    __syncthreads();
    /* Warp w owns query rows 16 ST w .. 16 ST w + 16 ST - 1 of the block, ST strips of 16.
     * matrices: (rows 0-7, k lo), (rows 8-15, k lo), (rows 0-7, k hi), (rows 8-15, k hi) */
    const __nv_bfloat16 *qrow = Qs + (warp * 16 * ST + (lane & 15)) * SK + (lane >> 4) * 8;
    uint32_t qf[QS ? 1 : ST][QS ? 1 : KS][4];
    if constexpr (!QS) {
#pragma unroll
        for (int st = 0; st < ST; st++)
#pragma unroll
            for (int k = 0; k < KS; k++) ldsm_x4(qf[st][k], qrow + st * 16 * SK + k * 16);
        __syncthreads(); /* the K buffer is free again */
    }

    /* This lane's two rows of each strip and what they may see. */
    uint32_t pa[ST], pb[ST], fa[ST], fb[ST];
#pragma unroll
    for (int st = 0; st < ST; st++) {
        pa[st] = a.pos0 + r0 + warp * 16 * ST + st * 16 + g;
        pb[st] = pa[st] + 8;
        fa[st] = attn_first_pos(pa[st], a.window);
        fb[st] = attn_first_pos(pb[st], a.window);
    }
    /* The warp's rows: tiles outside [wlo, whi] are fully masked for them. */
    const uint32_t w0 = a.pos0 + r0 + warp * 16 * ST; /* its first row's position */
    const uint32_t whi = min(w0 + 16 * ST - 1, hi);
    const uint32_t wlo = attn_first_pos(w0, a.window);
    /* Keys up to wmin and from wfirst are visible to every row of the warp
     * (its first row's position, within the context, and its last row's
     * window start): tiles inside need no mask. */
    const uint32_t wmin = min(w0, hi);
    const uint32_t wfirst = attn_first_pos(w0 + 16 * ST - 1, a.window);

    float m_a[ST], m_b[ST], l_a[ST], l_b[ST]; /* l: this lane's columns only */
    float o[ST][DB][4];
#pragma unroll
    for (int st = 0; st < ST; st++) {
        m_a[st] = m_b[st] = -INFINITY;
        l_a[st] = l_b[st] = 0.0f;
#pragma unroll
        for (int d = 0; d < DB; d++) o[st][d][0] = o[st][d][1] = o[st][d][2] = o[st][d][3] = 0.0f;
    }

    /* One K or V tile into its buffer as a commit group, from the row
     * addresses of its parity; positions past hi load zeros. The pipeline
     * per tile t: V(t) lands while S = Q K(t)^T is computed, K(t+1) while
     * O += P V(t) is. */
    auto load_tile = [&](__nv_bfloat16 *dst, uint32_t parity, uint32_t kv) {
        const uint64_t *ro = rowoff + parity * TC_BN;
        /* A thread keeps one column ch (16 bytes of the tile row) of rows j0, j0 + RPI, ...:
         * its source and destination step by constants, one row offset read a chunk (the
         * index arithmetic of a chunk at a time was most of these loops' instructions:
         * H100, 2048 x 2048 rows, 32:8 heads of 128, 190.9 -> 176.4 us). */
        constexpr uint32_t RPI = TC_THREADS / CH;
        static_assert(TC_THREADS % CH == 0 && TC_BN % RPI == 0, "whole rows per pass");
        const uint32_t ch = threadIdx.x % CH, j0 = threadIdx.x / CH;
        __nv_bfloat16 *d = dst + j0 * SK + ch * 8;
        if constexpr (F8) { /* plain loads: 8 codes and their page's exponent per thread and step */
            const uint64_t *eo = expoff + parity * TC_BN;
            const uint8_t *src = a.seg + (kv ? v_rows : 0) + ch * 8, *esrc = a.seg + (kv ? a.nkv : 0);
#pragma unroll
            for (uint32_t it = 0; it < TC_BN / RPI; it++) {
                const uint32_t j = j0 + it * RPI;
                const uint64_t off = ro[j];
                uint4 v = make_uint4(0u, 0u, 0u, 0u);
                if (off != ~0ull) {
                    const uint2 c8 = *(const uint2 *)(src + off);
                    const float sc = dj_pow2f(*(const int8_t *)(esrc + eo[j]));
                    v.x = f8x2_bf16x2(c8.x & 0xffffu, sc);
                    v.y = f8x2_bf16x2(c8.x >> 16, sc);
                    v.z = f8x2_bf16x2(c8.y & 0xffffu, sc);
                    v.w = f8x2_bf16x2(c8.y >> 16, sc);
                }
                *(uint4 *)(d + it * RPI * SK) = v;
            }
        } else {
            const uint8_t *src = a.seg + (kv ? v_rows : 0) + ch * 16;
#pragma unroll
            for (uint32_t it = 0; it < TC_BN / RPI; it++) {
                const uint64_t off = ro[j0 + it * RPI];
                const bool in = off != ~0ull;
                cp_async16(d + it * RPI * SK, in ? src + off : a.seg, in ? 16u : 0u);
            }
        }
        cp_async_commit(); /* f8: an empty group, so the waits below stay as they are */
    };
    load_tile(Ks, 0, 0);
    uint32_t par = 0; /* this tile's parity */
    for (uint64_t tile = lo; tile <= hi; tile += TC_BN, par ^= 1u) {
        load_tile(Vs, par, 1);
        /* the next tile's rows: its parity's were last read by the V load of the tile before,
         * and the barrier below publishes them before the K load that reads them */
        if (tile + TC_BN <= hi) tc_rows(par ^ 1u, tile + TC_BN);
        const bool active = tile <= whi && tile + TC_BN - 1 >= wlo; /* warp-uniform */
        /* Every key of the tile visible to every row of the warp: no mask (warp-uniform). */
        const bool whole = tile + TC_BN - 1 <= wmin && tile >= wfirst;
        uint32_t pf[ST][TC_BN / 16][4]; /* P as A fragments */
        cp_async_wait<1>();
        __syncthreads(); /* K landed */
        if (active) {
            float s[ST][NB][4];
#pragma unroll
            for (int st = 0; st < ST; st++)
#pragma unroll
                for (int nb = 0; nb < NB; nb++) s[st][nb][0] = s[st][nb][1] = s[st][nb][2] = s[st][nb][3] = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; k++) {
                uint32_t qa[ST][4];
#pragma unroll
                for (int st = 0; st < ST; st++) {
                    if constexpr (QS) ldsm_x4(qa[st], qrow + st * 16 * SK + k * 16);
                    else
#pragma unroll
                        for (int r = 0; r < 4; r++) qa[st][r] = qf[st][k][r];
                }
#pragma unroll
                for (int n2 = 0; n2 < NB / 2; n2++) {
                    /* matrices: (keys 0-7, dims lo), (keys 0-7, dims hi), (keys 8-15, dims lo),
                     * (keys 8-15, dims hi): K rows are B columns, so no transpose. One K fragment
                     * serves every strip. */
                    uint32_t b[4];
                    ldsm_x4(b, Ks + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * SK + k * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int st = 0; st < ST; st++) {
                        dj_mma16816(s[st][2 * n2], qa[st], b[0], b[1]);
                        dj_mma16816(s[st][2 * n2 + 1], qa[st], b[2], b[3]);
                    }
                }
            }
#pragma unroll
            for (int st = 0; st < ST; st++) {
                /* Scale (and cap), then mask; element e of n-block nb is key 8nb + 2c + (e&1) of
                 * the tile, row g (e<2) or g+8 of the strip. Row a sees the tile's keys [fra, lra],
                 * row b [frb, lrb]. */
                float mx_a = -INFINITY, mx_b = -INFINITY;
                /* CAP: the capped score in the exp2 domain; else the raw dot (scaled below). A
                 * whole tile (most of them) takes a loop without the mask's compares and selects. */
                if (whole) {
#pragma unroll
                    for (int nb = 0; nb < NB; nb++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float v = CAP ? a.cap_log2 * cap_tanh(s[st][nb][e] * a.scale_cap) : s[st][nb][e];
                            s[st][nb][e] = v;
                            if (e >= 2)
                                mx_b = fmaxf(mx_b, v);
                            else
                                mx_a = fmaxf(mx_a, v);
                        }
                } else {
                    const int64_t t0 = (int64_t)tile;
                    const int lra = (int)max(min((int64_t)min(pa[st], hi) - t0, (int64_t)TC_BN), (int64_t)-1);
                    const int lrb = (int)max(min((int64_t)min(pb[st], hi) - t0, (int64_t)TC_BN), (int64_t)-1);
                    const int fra = (int)max(min((int64_t)fa[st] - t0, (int64_t)TC_BN), (int64_t)0);
                    const int frb = (int)max(min((int64_t)fb[st] - t0, (int64_t)TC_BN), (int64_t)0);
#pragma unroll
                    for (int nb = 0; nb < NB; nb++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int kk = nb * 8 + (int)c4 * 2 + (e & 1);
                            const bool rb = e >= 2;
                            const bool ok = kk <= (rb ? lrb : lra) && kk >= (rb ? frb : fra);
                            const float sv = CAP ? a.cap_log2 * cap_tanh(s[st][nb][e] * a.scale_cap) : s[st][nb][e];
                            const float v = ok ? sv : -INFINITY;
                            s[st][nb][e] = v;
                            if (rb)
                                mx_b = fmaxf(mx_b, v);
                            else
                                mx_a = fmaxf(mx_a, v);
                        }
                }
                /* The four lanes of a quad share the rows. */
                attn_quad_max(mx_a, mx_b);
                const float mn_a = fmaxf(m_a[st], mx_a), mn_b = fmaxf(m_b[st], mx_b);
                /* The running max stays in the scores' domain (k > 0 keeps the order); a row with
                 * nothing visible yet keeps base 0: 2^(-inf - 0) = 0, never NaN. p = 2^(s k - base
                 * k), one FFMA and one EX2. */
                const float k2 = CAP ? 1.0f : a.scale_log2;
                const float nb_a = -(mn_a == -INFINITY ? 0.0f : mn_a) * k2;
                const float nb_b = -(mn_b == -INFINITY ? 0.0f : mn_b) * k2;
                /* A row whose max held keeps its sums as they are (corr exactly 1; the FFMA below
                 * would leave the product's rounding error in the exponent); at head_dim <= 128 a
                 * warp none of whose rows' max moved skips the output's rescale (H100, 2048 x 2048:
                 * 32:8 heads of 128 175.7 -> 172.1 us; at 256 the vote cost more than it saved,
                 * 189.3 -> 191.1 us, so those kernels rescale every tile). */
                const bool held_a = mn_a == m_a[st], held_b = mn_b == m_b[st];
                const float corr_a = held_a ? 1.0f : attn_ex2(fmaf(m_a[st], k2, nb_a));
                const float corr_b = held_b ? 1.0f : attn_ex2(fmaf(m_b[st], k2, nb_b));
                const bool rescale = HD > 128 || __any_sync(0xffffffffu, !(held_a && held_b));
                m_a[st] = mn_a;
                m_b[st] = mn_b;
                l_a[st] *= corr_a;
                l_b[st] *= corr_b;
#pragma unroll
                for (int nb = 0; nb < NB; nb++) {
                    s[st][nb][0] = attn_ex2(fmaf(s[st][nb][0], k2, nb_a));
                    s[st][nb][1] = attn_ex2(fmaf(s[st][nb][1], k2, nb_a));
                    s[st][nb][2] = attn_ex2(fmaf(s[st][nb][2], k2, nb_b));
                    s[st][nb][3] = attn_ex2(fmaf(s[st][nb][3], k2, nb_b));
                    l_a[st] += s[st][nb][0] + s[st][nb][1];
                    l_b[st] += s[st][nb][2] + s[st][nb][3];
                }
                if (rescale)
#pragma unroll
                    for (int d = 0; d < DB; d++) {
                        o[st][d][0] *= corr_a;
                        o[st][d][1] *= corr_a;
                        o[st][d][2] *= corr_b;
                        o[st][d][3] *= corr_b;
                    }
                /* C fragments of n-blocks 2kk, 2kk+1 are exactly the A fragment of keys 16kk..16kk+15. */
#pragma unroll
                for (int kk = 0; kk < TC_BN / 16; kk++) {
                    pf[st][kk][0] = attn_pack_bf16(s[st][2 * kk][0], s[st][2 * kk][1]);
                    pf[st][kk][1] = attn_pack_bf16(s[st][2 * kk][2], s[st][2 * kk][3]);
                    pf[st][kk][2] = attn_pack_bf16(s[st][2 * kk + 1][0], s[st][2 * kk + 1][1]);
                    pf[st][kk][3] = attn_pack_bf16(s[st][2 * kk + 1][2], s[st][2 * kk + 1][3]);
                }
            }
        }
        __syncthreads(); /* every warp is done with K(t) */
        const bool more = tile + TC_BN <= hi;
        if (more) load_tile(Ks, par ^ 1u, 0);
        if (more)
            cp_async_wait<1>();
        else
            cp_async_wait<0>();
        __syncthreads(); /* V landed */
        if (active) {
#pragma unroll
            for (int kk = 0; kk < TC_BN / 16; kk++) {
#pragma unroll
                for (int d2 = 0; d2 < DB / 2; d2++) {
                    /* matrices (transposed): (keys 0-7, dims lo), (keys 8-15, dims lo),
                     * (keys 0-7, dims hi), (keys 8-15, dims hi) -> b0, b1 of dim block 2d2, then
                     * 2d2+1. One V fragment serves every strip. */
                    uint32_t b[4];
                    ldsm_x4_t(b, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SK + d2 * 16 + (lane >> 4) * 8);
#pragma unroll
                    for (int st = 0; st < ST; st++) {
                        dj_mma16816(o[st][2 * d2], pf[st][kk], b[0], b[1]);
                        dj_mma16816(o[st][2 * d2 + 1], pf[st][kk], b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads(); /* V(t) is consumed before V(t+1) lands */
    }

#pragma unroll
    for (int st = 0; st < ST; st++) {
        float la = l_a[st], lb = l_b[st];
        la += __shfl_xor_sync(0xffffffffu, la, 1);
        la += __shfl_xor_sync(0xffffffffu, la, 2);
        lb += __shfl_xor_sync(0xffffffffu, lb, 1);
        lb += __shfl_xor_sync(0xffffffffu, lb, 2);
        /* Every real row sees at least its own position, so l > 0 there. */
        const float inv_a = 1.0f / la, inv_b = 1.0f / lb;
        const uint32_t ia = pa[st] - a.pos0, ib = ia + 8;
#pragma unroll
        for (int d = 0; d < DB; d++) {
            const uint32_t col = d * 8 + c4 * 2;
            if (ia < a.n)
                *(__nv_bfloat162 *)(a.out + ((size_t)ia * a.nh + h) * HD + col) =
                    __floats2bfloat162_rn(o[st][d][0] * inv_a, o[st][d][1] * inv_a);
            if (ib < a.n)
                *(__nv_bfloat162 *)(a.out + ((size_t)ib * a.nh + h) * HD + col) =
                    __floats2bfloat162_rn(o[st][d][2] * inv_b, o[st][d][3] * inv_b);
        }
    }
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

bool dj__cuda_attention_tc_covers(const dj_op_call *c) {
    const dj_kv_view *kv = c->kv;
    return (c->head_dim == 64 || c->head_dim == 128 || c->head_dim == 256) && !c->row_pos && !c->row_tables &&
           c->n >= 1 && (c->n + 63) / 64 <= 65535u && (kv->dtype == DJ_DTYPE_BF16 || kv->dtype == DJ_DTYPE_F8_E4M3) &&
           aligned16(kv->seg_base) && kv->page_bytes % 16 == 0 && kv->kv_dim % 8 == 0 && aligned16(c->x) &&
           aligned16(c->out) && (uint64_t)c->pos0 + c->n <= UINT32_MAX;
}

/* Every instantiation, in one table so launch and init agree: head_dim x
 * strips a warp x K/V dtype x soft-cap, the Q tile in shared memory (QS) and
 * the blocks an SM the registers must allow (MINB: 3 at head_dim 128 with one
 * strip = 168 registers; without it ptxas took 199 and 2 blocks). Two strips
 * a warp (head_dim 128, blocks of 128 rows, Q kept in shared memory, 254
 * registers, 2 blocks an SM) read each K and V fragment once for 32 rows:
 * H100, 2048 x 2048, 32:8 heads: 173.5 -> 147.5 us, f8 pages 316 -> 284 us,
 * but 512 x 512 28.9 -> 34.6 us (128 blocks for 132 SMs), so the launch takes
 * them where the grid gives at least 2 blocks an SM. At head_dim 64 two strips
 * (254 registers; at 168 they spill) ran 88.8 -> 90.9 us at 2048 x 2048, 32:8
 * heads: not kept. head_dim 128 with Q in shared
 * memory at 128 registers and 4 blocks an SM (H100, session 10) was 4%
 * faster at 2048 rows (216 -> 208 us; f8 pages 362 -> 308 us) but 10% slower
 * at 512 (33 -> 36 us, the step `djinn run` takes) and no faster end to end
 * (prefill 2048 0.0511 / 0.0524 against 0.0532 / 0.0527 s): not kept. */
typedef void (*tc_kernel_fn)(tc_args);
#define TC128(X, F, C) X(128, 1, F, C, false, 3) X(128, 2, F, C, true, 2)
/* X(head_dim, strips a warp, f8 pages, soft-cap, QS, MINB) */
#define TC_KERNELS(X)                                                                                                  \
    X(64, 1, false, false, false, 4) X(64, 1, false, true, false, 4) X(64, 1, true, false, false, 4)                  \
    X(64, 1, true, true, false, 4) TC128(X, false, false) TC128(X, false, true) TC128(X, true, false)                 \
    TC128(X, true, true)                                                                                               \
    X(256, 1, false, false, true, 2) X(256, 1, false, true, true, 2) X(256, 1, true, false, true, 2)                   \
    X(256, 1, true, true, true, 2)

/* The kernel of a call and its block's query rows and shared memory. */
static tc_kernel_fn tc_kernel(uint32_t hd, uint32_t st, bool f8, bool cap, unsigned *bm, size_t *smem) {
#define TC_PICK(H, S, F, C, Q, M)                                                                                      \
    if (hd == H && st == S && f8 == F && cap == C) {                                                                   \
        *bm = 16 * TC_WARPS * S;                                                                                       \
        *smem = tc_smem_bytes(H, Q, 16 * TC_WARPS * S);                                                                \
        return attn_tc_kernel<H, S, F, C, Q, M>;                                                                       \
    }
    TC_KERNELS(TC_PICK)
#undef TC_PICK
    return NULL;
}

dj_status dj__cuda_attention_tc_init(dj_cuda_backend *cb) {
    /* tiles past the default 48 KiB of dynamic shared memory (head_dim 256, Q kept) */
#define TC_ATTR(H, S, F, C, Q, M)                                                                                      \
    if (tc_smem_bytes(H, Q, 16 * TC_WARPS * S) > 48 * 1024)                                                            \
        DJ_CU(cb, cudaFuncSetAttribute(attn_tc_kernel<H, S, F, C, Q, M>,                                               \
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,                                    \
                                       (int)tc_smem_bytes(H, Q, 16 * TC_WARPS * S)));
    TC_KERNELS(TC_ATTR)
#undef TC_ATTR
    return DJ_OK;
}

dj_status dj__cuda_attention_tc(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t *table_dev) {
    const dj_kv_view *kv = c->kv;
    tc_args a;
    a.q = (const __nv_bfloat16 *)c->x;
    a.out = (__nv_bfloat16 *)c->out;
    a.seg = kv->seg_base;
    a.page_bytes = kv->page_bytes;
    a.table = table_dev;
    a.tpp = kv->tokens_per_page;
    a.tpp_div = dj_fastdiv_make(a.tpp);
    a.kv_dim = kv->kv_dim;
    a.n = c->n;
    a.nh = c->n_heads;
    a.group = c->n_heads / c->n_kv_heads;
    a.nkv = c->n_kv_heads;
    a.pos0 = c->pos0;
    a.window = c->window;
    a.scale_log2 = c->scale * 1.4426950408889634f;
    const bool cap = c->softcap != 0.0f;
    a.scale_cap = cap ? c->scale / c->softcap : 0.0f;
    a.cap_log2 = c->softcap * 1.4426950408889634f;
    unsigned bm = 0;
    size_t smem = 0;
    /* two strips a warp where blocks of 128 rows still give every SM two (the table's note) */
    const bool two = c->head_dim == 128 && (uint64_t)c->n_heads * ((c->n + 127) / 128) >= 2u * (uint64_t)cb->n_sm;
    const uint32_t st = two ? 2 : 1;
    const tc_kernel_fn k = tc_kernel(c->head_dim, st, kv->dtype == DJ_DTYPE_F8_E4M3, cap, &bm, &smem);
    if (!k) return dj_fail(DJ_EINVAL, "cuda: no tensor-core attention for head_dim %u", c->head_dim);
    const dim3 grid(c->n_heads, (c->n + bm - 1) / bm);
    k<<<grid, TC_THREADS, smem, cb->stream>>>(a);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
