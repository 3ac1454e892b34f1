/* cuda_attention.cu: causal (optionally sliding-window) GQA attention over
 * bf16 K/V in data-segment pages, f32 softmax and accumulation.
 *  - decode (few query rows): split-K / flash-decoding - each block scores
 *    one chunk of the context for up to 4 query heads of one kv head (GQA:
 *    K/V read once per kv head); a warp loads K and V of dec_pos positions
 *    at once, scores them together and folds them in one online-softmax
 *    update; a second pass merges the non-empty chunks, so one session's
 *    single token still fills the GPU; a few rows of a short context take
 *    one head a block (decode() says why). (The A/B of 2026-11-23 measured
 *    an earlier one-position-at-a-time, one-head-per-block kernel: no faster
 *    at b=1, 7% slower at b=32; deleted. The merge done by the last block of a
 *    head group to finish - fence, atomic ticket, barrier in every block -
 *    made the 8B decode step 2-3% slower than the merge launch on the H100,
 *    2026-11-26; deleted.)
 *  - prefill: 16 query rows per block, K/V tiles of 32 positions in shared
 *    memory, online softmax; the score matrix is never materialised.
 * Both take even head_dim <= 256. Prefill of head_dim 64/128/256 normally runs on
 * tensor cores instead (cuda_attention_tc.cu); this kernel is its fallback.
 * f8_e4m3 pages (backend.h: codes, then an int8 exponent per page and kv
 * head) are read directly, each kernel instantiated for them (F8): decode
 * loads 2 codes per lane and pair (one uint16) where bf16 loads a bf16x2,
 * converts them exactly (dj_f8x2_to_float2) and folds the scales rather than
 * scaling every element - score = (q . kcodes) * 2^kexp and V weight
 * e * 2^vexp, the exponents of position t's page looked up by the lane that
 * looks up that page; prefill dequantizes K/V tiles into its bf16 shared-memory
 * tiles (code * 2^exp is exact in bf16), so its compute is unchanged. The
 * bf16 instantiations do exactly what they did before. */
#include <math.h>

#include "backend/cuda/attn_rows.cuh"
#include "backend/cuda/cuda_impl.h"
#include "backend/fastdiv.h"

#define DEC_WARPS 4       /* warps per decode block, each its own keys */
#define DEC_MAX_SPLITS 64
#define DEC_BLOCKS_PER_SM 8 /* splits aim at this many blocks per SM: each warp walks its
                             * positions one dependent load after another, so fewer per warp is faster */
#define DEC_BATCH_MIN_BLOCKS 4 /* per SM, for the batched kernel: caps its registers at 128 (no spills) */
#define DEC_PREFILL_ROWS 8 /* from this many query rows on, the prefill kernel runs */
#define PF_ROWS 16         /* query rows per prefill block (4 per warp) */
#define PF_KEYS 32         /* positions per K/V tile (one per lane) */

static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* K row (V row with is_v) of kv head kvh at position t (bf16 pages). */
static __device__ __forceinline__ const __nv_bfloat16 *kv_row(const uint8_t *seg, size_t page_bytes,
                                                              const uint32_t *table, dj_fastdiv tpp, uint32_t kv_dim,
                                                              uint32_t kvh, uint32_t hd, uint32_t t, bool is_v) {
    const uint32_t pi = dj_fastdiv_q(t, tpp);
    const __nv_bfloat16 *page = (const __nv_bfloat16 *)(seg + (size_t)table[pi] * page_bytes);
    const uint32_t r = t - pi * tpp.d + (is_v ? tpp.d : 0u);
    return page + (size_t)r * kv_dim + (size_t)kvh * hd;
}

struct attn_args {
    const __nv_bfloat16 *q; /* [n][nh][hd] */
    const uint8_t *seg;
    size_t page_bytes;
    const uint32_t *table;
    const uint32_t *row_pos;             /* [n] or NULL: pos0 + i */
    const uint32_t *const *row_tables;   /* [n] or NULL: table */
    uint32_t tpp, kv_dim, n, nh, group, hd, pos0, window;
    dj_fastdiv tpp_div; /* t / tpp: a position's page (no divide in the kernels) */
    uint32_t nkv;  /* kv heads (f8 pages: the exponents' row length) */
    bool prewait;  /* decode rows (dj_op_call.decode_only): history loads before the PDL wait */
    float scale;
    float softcap; /* scores s -> softcap * tanh(s / softcap); 0 = none (Gemma 2) */
};

static __device__ __forceinline__ float capped(float s, float softcap) {
    return softcap != 0.0f ? tanhf(s / softcap) * softcap : s;
}

/* ---- decode: split-K ---- */

/* Positions per warp and step of the decode kernel: 8, and 4 past head_dim
 * 128 (the K/V registers of 8 positions of 256 dims held its blocks to 4 an
 * SM: 128 registers; with 4, 96). H100, decode b=1 at ctx 512
 * (bench/RESULTS.md, 2026-11-27): Gemma-2-9B 7.148 / 7.086 -> 6.975 / 7.015
 * ms, at ctx 2,000 7.68 -> 7.63; Llama-3-8B 5.54 -> 5.67 with 4, so 8 stay
 * there. A split holds at least one step of every warp (dec_min_chunk). */
static __host__ __device__ constexpr uint32_t dec_pos(uint32_t hd) { return hd > 128 ? 4u : 8u; }
static __host__ __device__ constexpr uint32_t dec_min_chunk(uint32_t hd) { return DEC_WARPS * dec_pos(hd); }
/* Splits whose partials a merge thread loads before their weights: the most a 512-token context uses. */
static __host__ __device__ constexpr uint32_t merge_pre(uint32_t hd) { return 512 / dec_min_chunk(hd); }
static_assert(DEC_MAX_SPLITS <= 64, "the batched merge holds two splits per lane of one warp");

/* Row i's position p, its first visible position t0 and the chunk of each
 * of the `splits` splits (at least dec_min_chunk; trailing splits may be
 * empty), from the row's own position: a recorded launch serves every
 * position. */
struct dec_range {
    uint32_t p, t0;
    uint64_t chunk;
};

static __device__ __forceinline__ dec_range dec_range_of(const attn_args &a, uint32_t i, uint32_t splits) {
    dec_range r;
    r.p = a.row_pos ? a.row_pos[i] : a.pos0 + i;
    r.t0 = attn_first_pos(r.p, a.window);
    const uint64_t len = (uint64_t)r.p - r.t0 + 1;
    r.chunk = (len + splits - 1) / splits;
    if (r.chunk < dec_min_chunk(a.hd)) r.chunk = dec_min_chunk(a.hd);
    return r;
}

/* The first of the two head dims of pair k of a lane in the decode kernel:
 * bf16 rows interleave the lanes (2l + 64k: a warp's load of pair k is 128
 * contiguous bytes); an f8 lane takes 2 * PAIRS consecutive codes (2 PAIRS l
 * + 2k), so one 4- or 8-byte load brings all its pairs of a row (the f8
 * kernel issued as many 2-byte loads as bf16's 4-byte ones and ran 1.4x
 * longer than bf16's at ctx 16384 on the H100: ncu, 2026-11-26). */
template <int PAIRS, bool F8>
static __device__ __forceinline__ uint32_t dec_dim(uint32_t lane, int k) {
    return F8 ? 2u * PAIRS * lane + 2u * (uint32_t)k : 2u * lane + 64u * (uint32_t)k;
}

/* Folds the DEC_WARPS warps' online-softmax states of one head (every
 * thread of the block calls it; lane l holds the pairs dec_dim(l, k) of acc)
 * into dst[hd + 2]: o (unnormalised), then max, then sum. */
template <int PAIRS, bool F8>
static __device__ __forceinline__ void dec_store_partial(float m, float l, const float2 (&acc)[PAIRS], uint32_t hd,
                                                         float *dst) {
    __shared__ float s_m[DEC_WARPS], s_l[DEC_WARPS];
    __shared__ float s_o[DEC_WARPS][256];
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int k = 0; k < PAIRS; k++) {
        const uint32_t d = dec_dim<PAIRS, F8>(lane, k);
        if (d < hd) {
            s_o[warp][d] = acc[k].x;
            s_o[warp][d + 1] = acc[k].y;
        }
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, s_m[w]);
    float f[DEC_WARPS];
    for (int w = 0; w < DEC_WARPS; w++) f[w] = M == -INFINITY ? 0.0f : expf(s_m[w] - M);
    for (uint32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++) o += f[w] * s_o[w][d];
        dst[d] = o;
    }
    if (threadIdx.x == 0) {
        float L = 0.0f;
        for (int w = 0; w < DEC_WARPS; w++) L += f[w] * s_l[w];
        dst[hd] = M;
        dst[hd + 1] = L;
    }
    __syncthreads(); /* the shared arrays are free for the next head */
}

/* A lane's K (or V) pairs of one position in registers: PAIRS bf16x2, or
 * with F8 two pairs of codes (4 bytes) per 32-bit register - pair k in the
 * low (k even) or high half of word k/2 - so f8 holds half the registers. */
template <bool F8, int PAIRS> struct kv_lane {
    __nv_bfloat162 w[PAIRS];
    __device__ __forceinline__ float2 pair(int k) const { return __bfloat1622float2(w[k]); }
};
template <int PAIRS> struct kv_lane<true, PAIRS> {
    uint32_t w[(PAIRS + 1) / 2];
    __device__ __forceinline__ float2 pair(int k) const {
        return dj_f8x2_to_float2((uint16_t)(w[k >> 1] >> (16 * (k & 1))));
    }
};

/* F8 pages: the K (V with is_v) scale 2^exp of kv head kvh in a page (every row's). */
static __device__ __forceinline__ float f8_scale(const uint8_t *page, uint32_t tpp, uint32_t kv_dim, uint32_t nkv,
                                                 uint32_t kvh, bool is_v) {
    const int8_t *ex = (const int8_t *)(page + dj_kv_f8_exps_at(tpp, kv_dim));
    return dj_pow2f(ex[(is_v ? nkv : 0u) + kvh]);
}

/* Block (split, head group, row): the G query heads h0 = G*blockIdx.y ..
 * h0+G-1 share kv head h0 / group (G divides group). Warp w takes the
 * positions [b, b + POS) of its split, b = s0 + POS*(w + DEC_WARPS*j), POS =
 * dec_pos(head_dim): lane l < POS looks up the page of position b + l, then every lane
 * loads its pairs 2l + 64k of the POS K and V rows (all loads in flight
 * together), scores them for the G heads (G*POS warp sums, interleaved)
 * and folds them into each head's online softmax in one update.
 * Row i's positions [t0, p] are cut into `splits` chunks of at least
 * dec_min_chunk, computed here from the row's own position, so a recorded
 * launch serves every position.
 * part: [n][nh][splits][hd + 2]: o (unnormalised), then max, then sum;
 * splits past the row's context are not written (attn_merge_used_kernel
 * does not read them).
 * F8: K/V as f8 codes (two pairs a register: kv_lane) with their exponents
 * (the lanes that look up the pages also load the scales of their positions
 * and hand them round); no spills where bf16 has none (ptxas -v, sm_90). */
template <int PAIRS, int G, bool F8>
static __global__ void __launch_bounds__(DEC_WARPS * 32, DEC_BATCH_MIN_BLOCKS)
    attn_decode_batch_kernel(attn_args a, uint32_t splits, float *part) {
    constexpr int POS = (int)dec_pos(64 * PAIRS);
    dj_pdl_release();
    const uint32_t split = blockIdx.x, h0 = blockIdx.y * G, i = blockIdx.z;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const dec_range rg = dec_range_of(a, i, splits); /* row_pos: the step's arguments, copied before any kernel */
    const uint64_t s0 = (uint64_t)rg.t0 + (uint64_t)split * rg.chunk;
    if (s0 > rg.p) return; /* block-uniform: an empty split */
    const uint64_t s1 = s0 + rg.chunk - 1 < rg.p ? s0 + rg.chunk - 1 : rg.p; /* inclusive */
    const uint32_t kvh = h0 / a.group, hd = a.hd;
    const uint32_t *table = a.row_tables ? a.row_tables[i] : a.table;
    const size_t v_off = (size_t)a.tpp * a.kv_dim; /* elements: V rows follow the page's K rows */
    /* F8: a lane's 2 * PAIRS codes of a row in one aligned load (else a load a pair) */
    const bool wide = F8 && hd % (2u * PAIRS) == 0 && a.kv_dim % (2u * PAIRS) == 0 && a.page_bytes % 8 == 0 &&
                      ((uintptr_t)a.seg & 7u) == 0;

    /* The K/V of positions [b, b + POS) of the split (all of them, or with
     * only >= 0 position b + only alone) into kb/vb, each lane j < POS
     * holding position b + j's page (and with F8 its scales). */
    uint32_t page = 0;
    float ksc = 1.0f, vsc = 1.0f;
    kv_lane<F8, PAIRS> kb[POS], vb[POS];
    auto load_kv = [&](uint64_t b, int only) {
        page = 0; /* lane j < POS: position b + j's page */
        ksc = 1.0f, vsc = 1.0f; /* F8: this lane's position's scales */
        if (lane < POS && b + lane <= s1) {
            const uint32_t t = (uint32_t)(b + lane), pi = dj_fastdiv_q(t, a.tpp_div);
            page = table[pi];
            if constexpr (F8) {
                const uint8_t *pg = a.seg + (size_t)page * a.page_bytes;
                ksc = f8_scale(pg, a.tpp, a.kv_dim, a.nkv, kvh, false);
                vsc = f8_scale(pg, a.tpp, a.kv_dim, a.nkv, kvh, true);
            }
        }
#pragma unroll
        for (int j = 0; j < POS; j++) {
            const uint32_t pj = __shfl_sync(0xffffffffu, page, j), t = (uint32_t)(b + j);
            if (only != -1 && j != only) continue; /* warp-uniform; -2: pages and scales only */
            const uint32_t rj = t - dj_fastdiv_q(t, a.tpp_div) * a.tpp; /* its row in the page */
            const bool valid = b + j <= s1; /* warp-uniform */
            if constexpr (F8) {
                const uint8_t *kr = a.seg + (size_t)pj * a.page_bytes + (size_t)rj * a.kv_dim +
                                    (size_t)kvh * hd + 2u * PAIRS * lane; /* this lane's codes */
                const uint32_t d0 = 2u * PAIRS * lane;
                if ((PAIRS == 2 || PAIRS == 4) && wide && valid && d0 + 2 * PAIRS <= hd) { /* one load a row */
                    if constexpr (PAIRS == 2) {
                        kb[j].w[0] = *(const uint32_t *)kr;
                        vb[j].w[0] = *(const uint32_t *)(kr + v_off);
                    } else if constexpr (PAIRS == 4) {
                        const uint2 kw = *(const uint2 *)kr, vw = *(const uint2 *)(kr + v_off);
                        kb[j].w[0] = kw.x;
                        kb[j].w[1] = kw.y;
                        vb[j].w[0] = vw.x;
                        vb[j].w[1] = vw.y;
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < PAIRS; k++) {
                        const uint32_t sh = 16 * (k & 1);
                        const bool ok = valid && d0 + 2 * k < hd;
                        /* two codes each; code 0 is +0 */
                        const uint32_t kw = ok ? *(const uint16_t *)(kr + 2 * k) : 0u;
                        const uint32_t vw = ok ? *(const uint16_t *)(kr + v_off + 2 * k) : 0u;
                        kb[j].w[k >> 1] = (k & 1) ? kb[j].w[k >> 1] | kw << sh : kw;
                        vb[j].w[k >> 1] = (k & 1) ? vb[j].w[k >> 1] | vw << sh : vw;
                    }
                }
            } else {
                const __nv_bfloat16 *kr = (const __nv_bfloat16 *)(a.seg + (size_t)pj * a.page_bytes) +
                                          (size_t)rj * a.kv_dim + (size_t)kvh * hd;
#pragma unroll
                for (int k = 0; k < PAIRS; k++) {
                    const uint32_t d = 2 * lane + 64 * k;
                    const bool ok = valid && d < hd;
                    kb[j].w[k] = ok ? *(const __nv_bfloat162 *)(kr + d) : __floats2bfloat162_rn(0.0f, 0.0f);
                    vb[j].w[k] = ok ? *(const __nv_bfloat162 *)(kr + v_off + d) : __floats2bfloat162_rn(0.0f, 0.0f);
                }
            }
        }
    };
    /* Decode rows (a.prewait) of one head a block (the short-context launch;
     * more heads would spill): every position before a row's own was written
     * by earlier steps, so the warp's first K/V loads go out before the PDL
     * wait, and the row's own position - this step's KV_WRITE - again after it.
     * With F8 this step's KV_WRITE may raise the exponents of the row's page
     * and re-encode the page's earlier rows (backend.h): a warp whose
     * positions reach into the row's page reads their exponents again after
     * the wait (beside the row's own position) and, where any differs from
     * the one it loaded before (only then were codes re-encoded), loads all
     * its positions again.
     * H100, 8B shape, decode b=1 at ctx 512 (bench/RESULTS.md, 2026-11-26):
     * bf16 5.70 -> 5.65 ms, FP8 3.64 -> 3.58, 4-bit 2.99 -> 2.95, Gemma-2-9B
     * shape 7.42 -> 7.23. */
    const bool pre = G == 1 && a.prewait;
    const uint64_t b0 = s0 + (uint64_t)warp * POS;
    if (pre && b0 <= s1) load_kv(b0, -1);
    dj_pdl_wait();
    if constexpr (F8) {
        const uint64_t page0 = (uint64_t)dj_fastdiv_q(rg.p, a.tpp_div) * a.tpp; /* the row's page's first position */
        if (pre && b0 <= s1 && page0 < b0 + POS) {
            const float k0 = ksc, v0 = vsc;
            load_kv(b0, rg.p < b0 + POS ? (int)(rg.p - b0) : -2);
            if (__any_sync(0xffffffffu, ksc != k0 || vsc != v0)) load_kv(b0, -1);
        }
    } else {
        if (pre && b0 <= s1 && rg.p < b0 + POS) load_kv(b0, (int)(rg.p - b0));
    }
    float2 qv[G][PAIRS], acc[G][PAIRS];
    float m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        const __nv_bfloat16 *q = a.q + ((size_t)i * a.nh + h0 + g) * hd;
#pragma unroll
        for (int k = 0; k < PAIRS; k++) {
            const uint32_t d = dec_dim<PAIRS, F8>(lane, k);
            qv[g][k] = d < hd ? __bfloat1622float2(*(const __nv_bfloat162 *)(q + d)) : make_float2(0.0f, 0.0f);
            acc[g][k] = make_float2(0.0f, 0.0f);
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    for (uint64_t b = b0; b <= s1; b += DEC_WARPS * POS) {
        if (!pre || b != b0) load_kv(b, -1);
        float s[G][POS];
#pragma unroll
        for (int g = 0; g < G; g++)
#pragma unroll
            for (int j = 0; j < POS; j++) {
                float dot = 0.0f;
#pragma unroll
                for (int k = 0; k < PAIRS; k++) {
                    const float2 kf = kb[j].pair(k);
                    dot += qv[g][k].x * kf.x + qv[g][k].y * kf.y;
                }
                s[g][j] = dot;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
                for (int j = 0; j < POS; j++) s[g][j] += __shfl_xor_sync(0xffffffffu, s[g][j], o);
        float vs[POS]; /* F8: the V scales (1 for bf16: never read) */
        if constexpr (F8) {
#pragma unroll
            for (int j = 0; j < POS; j++) {
                const float kj = __shfl_sync(0xffffffffu, ksc, j);
                vs[j] = __shfl_sync(0xffffffffu, vsc, j);
#pragma unroll
                for (int g = 0; g < G; g++) s[g][j] *= kj; /* q . k = (q . codes) * 2^kexp */
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mn = m[g];
#pragma unroll
            for (int j = 0; j < POS; j++) {
                s[g][j] = b + j <= s1 ? capped(s[g][j] * a.scale, a.softcap) : -INFINITY;
                mn = fmaxf(mn, s[g][j]);
            }
            /* position b is valid: mn is finite */
            const float corr = expf(m[g] - mn);
            l[g] *= corr;
#pragma unroll
            for (int k = 0; k < PAIRS; k++) {
                acc[g][k].x *= corr;
                acc[g][k].y *= corr;
            }
#pragma unroll
            for (int j = 0; j < POS; j++) {
                const float e = expf(s[g][j] - mn);
                l[g] += e;
                float ew = e; /* the weight of V's stored values: e * 2^vexp for f8 codes */
                if constexpr (F8) ew *= vs[j];
#pragma unroll
                for (int k = 0; k < PAIRS; k++) {
                    const float2 vf = vb[j].pair(k);
                    acc[g][k].x += ew * vf.x;
                    acc[g][k].y += ew * vf.y;
                }
            }
            m[g] = mn;
        }
    }
#pragma unroll
    for (int g = 0; g < G; g++)
        dec_store_partial<PAIRS, F8>(m[g], l[g], acc[g], hd,
                                 part + (((size_t)i * a.nh + h0 + g) * splits + split) * (hd + 2));
}

/* Block (head, row): merges the splits attn_decode_batch_kernel wrote -
 * those holding some of the row's positions, split 0 first (it holds t0, so
 * the overall max is finite). Every warp weighs the splits itself (two per
 * lane: the same values in each warp, no barrier between), and each thread
 * sums its dims d = t + 128 j over them, its first MERGE_PRE (merge_pre) splits' values
 * loaded before the weights are known: the kernel is a chain of dependent
 * loads, and it was three round trips long (weights, barrier, values).
 * The sums are those of the one-warp weighing it replaced, bit for bit. */
template <int MERGE_PRE>
static __global__ void __launch_bounds__(128)
    attn_merge_used_kernel(attn_args a, const float *part, __nv_bfloat16 *out, uint32_t splits) {
    dj_pdl_release();
    const uint32_t h = blockIdx.x, i = blockIdx.y, hd = a.hd, lane = threadIdx.x & 31;
    const dec_range rg = dec_range_of(a, i, splits);
    dj_pdl_wait();
    const uint64_t len = (uint64_t)rg.p - rg.t0 + 1;
    const uint32_t used = (uint32_t)((len + rg.chunk - 1) / rg.chunk); /* <= splits */
    const float *src = part + ((size_t)i * a.nh + h) * splits * (hd + 2);
    constexpr uint32_t DIMS = 256 / 128; /* a thread's dims: head_dim <= 256 (the decode kernel's PAIRS <= 4) */
    float pre[DIMS][MERGE_PRE];
#pragma unroll
    for (uint32_t j = 0; j < DIMS; j++)
#pragma unroll
        for (uint32_t sp = 0; sp < MERGE_PRE; sp++) {
            const uint32_t d = threadIdx.x + 128 * j;
            pre[j][sp] = d < hd && sp < used ? src[(size_t)sp * (hd + 2) + d] : 0.0f;
        }
    float M[2], L[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const uint32_t sp = lane + 32 * u;
        M[u] = sp < used ? src[(size_t)sp * (hd + 2) + hd] : -INFINITY;
        L[u] = sp < used ? src[(size_t)sp * (hd + 2) + hd + 1] : 0.0f;
    }
    const float G = warp_max(fmaxf(M[0], M[1]));
    __shared__ float s_w[128 / 32][DEC_MAX_SPLITS]; /* each warp's own copy of the weights (128 threads) */
    const uint32_t warp = threadIdx.x >> 5;
    float wl = 0.0f;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const float w = M[u] == -INFINITY ? 0.0f : expf(M[u] - G);
        if (lane + 32 * u < DEC_MAX_SPLITS) s_w[warp][lane + 32 * u] = w;
        wl += w * L[u];
    }
    const float inv = 1.0f / warp_sum(wl);
    __syncwarp();
    __nv_bfloat16 *o = out + ((size_t)i * a.nh + h) * hd;
#pragma unroll
    for (uint32_t j = 0; j < DIMS; j++) {
        const uint32_t d = threadIdx.x + 128 * j;
        if (d >= hd) break;
        float v = 0.0f;
#pragma unroll
        for (uint32_t sp = 0; sp < MERGE_PRE; sp++)
            if (sp < used) v += pre[j][sp] * s_w[warp][sp];
        for (uint32_t sp = MERGE_PRE; sp < used; sp++) v += src[(size_t)sp * (hd + 2) + d] * s_w[warp][sp];
        o[d] = __float2bfloat16(v * inv);
    }
}

/* ---- prefill: tiled, online softmax ---- */

/* Block (row tile, head); warp w owns query rows 4w..4w+3 of the tile, lane l
 * scores position tile+l and accumulates output dims l + 32j. Shared memory:
 * Q [16][hd] bf16, K and V [32][hd+2] bf16 (the pad spreads rows over banks).
 * F8: the tiles are dequantized from f8 pages (code * 2^exp, exact in bf16). */
template <int DPL, bool F8>
static __global__ void __launch_bounds__(128) attn_prefill_kernel(attn_args a, __nv_bfloat16 *out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const uint32_t hd = a.hd, ks = hd + 2;
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)smem_raw;
    __nv_bfloat16 *Ks = Qs + PF_ROWS * hd;
    __nv_bfloat16 *Vs = Ks + PF_KEYS * ks;
    const uint32_t h = blockIdx.y, r0 = blockIdx.x * PF_ROWS, kvh = h / a.group;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t last = min(r0 + PF_ROWS, a.n) - 1;
    const uint32_t lo = attn_first_pos(a.pos0 + r0, a.window), hi = a.pos0 + last;

    for (uint32_t e = threadIdx.x; e < PF_ROWS * hd; e += blockDim.x) {
        const uint32_t rr = e / hd, d = e % hd;
        Qs[e] = r0 + rr < a.n ? a.q[((size_t)(r0 + rr) * a.nh + h) * hd + d] : __float2bfloat16(0.0f);
    }
    float m[4], l[4], acc[4][DPL];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        m[k] = -INFINITY;
        l[k] = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++) acc[k][j] = 0.0f;
    }
    const uint32_t pairs = hd / 2;
    for (uint64_t tile = lo; tile <= hi; tile += PF_KEYS) {
        __syncthreads(); /* the previous tile is consumed (and Q is stored) */
        for (uint32_t e = threadIdx.x; e < PF_KEYS * pairs; e += blockDim.x) {
            const uint32_t j = e / pairs, d = 2 * (e % pairs);
            const uint64_t t = tile + j;
            __nv_bfloat162 kv2 = __floats2bfloat162_rn(0.0f, 0.0f), vv2 = kv2;
            if (t <= hi) {
                if constexpr (F8) {
                    const uint32_t tt = (uint32_t)t, pi = dj_fastdiv_q(tt, a.tpp_div), r = tt - pi * a.tpp;
                    const uint8_t *pg = a.seg + (size_t)a.table[pi] * a.page_bytes;
                    const uint8_t *kr = pg + (size_t)r * a.kv_dim + (size_t)kvh * hd;
                    const float ksc = f8_scale(pg, a.tpp, a.kv_dim, a.nkv, kvh, false);
                    const float vsc = f8_scale(pg, a.tpp, a.kv_dim, a.nkv, kvh, true);
                    const float2 kf = dj_f8x2_to_float2(*(const uint16_t *)(kr + d));
                    const float2 vf = dj_f8x2_to_float2(*(const uint16_t *)(kr + (size_t)a.tpp * a.kv_dim + d));
                    kv2 = __floats2bfloat162_rn(kf.x * ksc, kf.y * ksc); /* exact */
                    vv2 = __floats2bfloat162_rn(vf.x * vsc, vf.y * vsc);
                } else {
                    kv2 = *(const __nv_bfloat162 *)(kv_row(a.seg, a.page_bytes, a.table, a.tpp_div, a.kv_dim, kvh, hd,
                                                           (uint32_t)t, false) + d);
                    vv2 = *(const __nv_bfloat162 *)(kv_row(a.seg, a.page_bytes, a.table, a.tpp_div, a.kv_dim, kvh, hd,
                                                           (uint32_t)t, true) + d);
                }
            }
            *(__nv_bfloat162 *)(Ks + j * ks + d) = kv2;
            *(__nv_bfloat162 *)(Vs + j * ks + d) = vv2;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t rr = warp * 4 + k, i = r0 + rr;
            if (i >= a.n) continue; /* warp-uniform */
            const uint32_t p = a.pos0 + i, t0 = attn_first_pos(p, a.window);
            const uint64_t t = tile + lane;
            const bool valid = t >= t0 && t <= p;
            float s = -INFINITY;
            if (valid) {
                float dot = 0.0f;
                const __nv_bfloat16 *qr = Qs + rr * hd, *kr = Ks + lane * ks;
                for (uint32_t d = 0; d < hd; d += 2) {
                    const float2 qf = __bfloat1622float2(*(const __nv_bfloat162 *)(qr + d));
                    const float2 kf = __bfloat1622float2(*(const __nv_bfloat162 *)(kr + d));
                    dot += qf.x * kf.x + qf.y * kf.y;
                }
                s = capped(dot * a.scale, a.softcap);
            }
            const float tmax = warp_max(s);
            if (tmax == -INFINITY) continue; /* no position of this tile is visible to row i */
            const float mn = fmaxf(m[k], tmax);
            const float corr = expf(m[k] - mn);
            const float e = valid ? expf(s - mn) : 0.0f;
            l[k] = l[k] * corr + warp_sum(e);
#pragma unroll
            for (int j = 0; j < DPL; j++) acc[k][j] *= corr;
            for (uint32_t jj = 0; jj < PF_KEYS; jj++) {
                const float ej = __shfl_sync(0xffffffffu, e, jj);
                if (ej == 0.0f) continue; /* warp-uniform */
                const __nv_bfloat16 *vr = Vs + jj * ks;
#pragma unroll
                for (int j = 0; j < DPL; j++) {
                    const uint32_t d = lane + 32 * j;
                    if (d < hd) acc[k][j] += ej * __bfloat162float(vr[d]);
                }
            }
            m[k] = mn;
        }
    }
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const uint32_t i = r0 + warp * 4 + k;
        if (i >= a.n) continue;
        const float inv = 1.0f / l[k];
        __nv_bfloat16 *o = out + ((size_t)i * a.nh + h) * hd;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            const uint32_t d = lane + 32 * j;
            if (d < hd) o[d] = __float2bfloat16(acc[k][j] * inv);
        }
    }
}

/* ---- launchers ---- */

template <int PAIRS, bool F8>
static void launch_decode_batch(const dj_cuda_backend *cb, dim3 grid, uint32_t heads_per_block, const attn_args &a,
                                uint32_t splits, float *part) {
    const unsigned threads = DEC_WARPS * 32;
    if constexpr (PAIRS <= 2) { /* 4 heads of head_dim > 128 would not fit the registers */
        if (heads_per_block == 4) {
            dj__launch(cb, attn_decode_batch_kernel<PAIRS, 4, F8>, grid, dim3(threads), 0, a, splits, part);
            return;
        }
    }
    if (heads_per_block == 2)
        dj__launch(cb, attn_decode_batch_kernel<PAIRS, 2, F8>, grid, dim3(threads), 0, a, splits, part);
    else
        dj__launch(cb, attn_decode_batch_kernel<PAIRS, 1, F8>, grid, dim3(threads), 0, a, splits, part);
}

template <bool F8>
static void launch_decode(const dj_cuda_backend *cb, uint32_t hd, dim3 grid, uint32_t hpb, const attn_args &a,
                          uint32_t splits, float *part) {
    if (hd <= 64)
        launch_decode_batch<1, F8>(cb, grid, hpb, a, splits, part);
    else if (hd <= 128)
        launch_decode_batch<2, F8>(cb, grid, hpb, a, splits, part);
    else if (hd <= 192)
        launch_decode_batch<3, F8>(cb, grid, hpb, a, splits, part);
    else
        launch_decode_batch<4, F8>(cb, grid, hpb, a, splits, part);
}

static dj_status decode(dj_cuda_backend *cb, const dj_op_call *c, const attn_args &a) {
    const uint32_t hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    /* Up to 4 query heads of one kv head per block (2 for head_dim > 128): K/V
     * read once for them. But a few rows of a short context (every position
     * below DJ_CUDA_SHORT_POS: the engine's pos_bound in a graph, else pos0 + n)
     * take a block a head: there a warp makes one or two steps, the kernel's
     * time is its warps' dependent instructions, and four times the warps
     * with a quarter of the work each finish sooner. H100, Llama-3-8B shape,
     * decode b=1 bf16 (bench/RESULTS.md, 2026-11-26): a block a head against
     * four, 512-token context 5.82 against 5.93 ms, 2,048: 6.11 / 6.21; 4,096:
     * 6.45 / 6.37 and 8,192: 7.06 / 6.78 (K/V read four times); b=32 3,340
     * against 3,386 tok/s; as kept (below 2,048 positions, up to 4 rows), 512
     * tokens: bf16 5.92 -> 5.83 ms, FP8 3.78 -> 3.70, AWQ 3.13 -> 3.01,
     * Gemma-2-9B 7.86 -> 7.64. A head's arithmetic is the same either way; the
     * split count below follows the blocks, so the chunks may differ (not
     * with deterministic: 64 splits always). */
    const uint64_t end = c->row_pos ? c->pos_bound : (uint64_t)c->pos0 + c->n;
    const bool short_ctx = end != 0 && end <= DJ_CUDA_SHORT_POS && c->n <= DJ_CUDA_SHORT_ROWS;
    const uint32_t hpb = short_ctx ? 1 : group % 4 == 0 && hd <= 128 ? 4 : group % 2 == 0 ? 2 : 1;
    /* Enough splits for ~DEC_BLOCKS_PER_SM blocks per SM; without per-row positions, no more
     * than the longest context fills (with them, the kernel leaves the
     * surplus empty: the count must not depend on positions). */
    const uint64_t rows_heads = (uint64_t)c->n * (c->n_heads / hpb);
    uint64_t splits = ((uint64_t)cb->n_sm * DEC_BLOCKS_PER_SM + rows_heads - 1) / rows_heads;
    /* deterministic: the split count - and so each row's summation order -
     * must not depend on how many rows share the launch */
    if (cb->base.deterministic) splits = DEC_MAX_SPLITS;
    else if (!c->row_pos) {
        const uint64_t end = (uint64_t)c->pos0 + c->n;
        const uint64_t longest = c->window && c->window < end ? c->window : end;
        const uint64_t by_len = (longest + dec_min_chunk(hd) - 1) / dec_min_chunk(hd);
        if (splits > by_len) splits = by_len;
    }
    if (splits > DEC_MAX_SPLITS) splits = DEC_MAX_SPLITS;
    if (splits < 1) splits = 1;
    float *part = NULL;
    dj_status st = dj__cuda_scratch(cb, (size_t)c->n * c->n_heads * splits * (hd + 2), &part);
    if (st != DJ_OK) return st;
    const dim3 grid((unsigned)splits, c->n_heads / hpb, c->n);
    __nv_bfloat16 *out = (__nv_bfloat16 *)c->out;
    if (c->kv->dtype == DJ_DTYPE_F8_E4M3)
        launch_decode<true>(cb, hd, grid, hpb, a, (uint32_t)splits, part);
    else
        launch_decode<false>(cb, hd, grid, hpb, a, (uint32_t)splits, part);
    DJ_CU_LAUNCHED(cb);
    if (merge_pre(hd) > 16)
        dj__launch(cb, attn_merge_used_kernel<(int)merge_pre(256)>, dim3(c->n_heads, c->n), dim3(128), 0, a,
                   (const float *)part, out, (uint32_t)splits);
    else
        dj__launch(cb, attn_merge_used_kernel<(int)merge_pre(128)>, dim3(c->n_heads, c->n), dim3(128), 0, a,
                   (const float *)part, out, (uint32_t)splits);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

template <bool F8>
static void launch_prefill(uint32_t hd, dim3 grid, size_t smem, cudaStream_t stream, const attn_args &a,
                           __nv_bfloat16 *out) {
    if (hd <= 64)
        attn_prefill_kernel<2, F8><<<grid, 128, smem, stream>>>(a, out);
    else if (hd <= 128)
        attn_prefill_kernel<4, F8><<<grid, 128, smem, stream>>>(a, out);
    else
        attn_prefill_kernel<8, F8><<<grid, 128, smem, stream>>>(a, out);
}

static dj_status prefill(dj_cuda_backend *cb, const dj_op_call *c, const attn_args &a) {
    const uint32_t hd = c->head_dim;
    const size_t smem = ((size_t)PF_ROWS * hd + 2u * PF_KEYS * (hd + 2)) * sizeof(__nv_bfloat16);
    const dim3 grid((c->n + PF_ROWS - 1) / PF_ROWS, c->n_heads);
    __nv_bfloat16 *out = (__nv_bfloat16 *)c->out;
    if (c->kv->dtype == DJ_DTYPE_F8_E4M3)
        launch_prefill<true>(hd, grid, smem, cb->stream, a, out);
    else
        launch_prefill<false>(hd, grid, smem, cb->stream, a, out);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

static bool uses_decode(const dj_cuda_backend *cb, const dj_op_call *c) {
    return c->row_pos || cb->attention_path == 1 || (cb->attention_path == 0 && c->n < DEC_PREFILL_ROWS);
}

bool dj__cuda_attention_takes_wg(const dj_cuda_backend *cb, const dj_op_call *c) {
    return !uses_decode(cb, c) && (cb->attention_path >= 4 || (cb->attention_path == 0 && cb->attn_wg)) &&
           dj__cuda_attention_wg_covers(cb, c);
}

dj_status dj__cuda_attention(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t *table_dev) {
    const dj_kv_view *kv = c->kv;
    attn_args a;
    a.q = (const __nv_bfloat16 *)c->x;
    a.seg = kv->seg_base;
    a.page_bytes = kv->page_bytes;
    a.table = table_dev;
    a.tpp = kv->tokens_per_page;
    a.tpp_div = dj_fastdiv_make(a.tpp);
    a.kv_dim = kv->kv_dim;
    a.n = c->n;
    a.nh = c->n_heads;
    a.group = c->n_heads / c->n_kv_heads;
    a.hd = c->head_dim;
    a.nkv = c->n_kv_heads; /* f8: == kv->n_kv_heads (dj__cuda_check_call) */
    a.prewait = c->row_pos && c->decode_only;
    a.row_pos = c->row_pos;
    a.row_tables = c->row_tables;
    a.pos0 = c->pos0;
    a.window = c->window;
    a.scale = c->scale;
    a.softcap = c->softcap;
    /* The prefill kernels tile consecutive positions of one sequence: rows
     * with their own positions always take the decode kernel. The wgmma
     * kernel takes what dj__cuda_attention_wg_covers says (Hopper, bf16 pages,
     * head_dim 128, no soft-cap), the mma.sync tensor-core kernel head_dim
     * 64/128/256 (dj__cuda_attention_tc_covers); any other shape, or
     * DJINN_ATTN=simple, takes the f32 tiled kernel. */
    if (uses_decode(cb, c)) {
        cb->last_attention = 1;
        return decode(cb, c, a);
    }
    if (dj__cuda_attention_takes_wg(cb, c)) {
        cb->last_attention = 4;
        return dj__cuda_attention_wg(cb, c, table_dev, NULL, NULL, false, true);
    }
    const bool want_tc = cb->attention_path >= 3 || (cb->attention_path == 0 && cb->attn_tc);
    if (want_tc && dj__cuda_attention_tc_covers(c)) {
        cb->last_attention = 3;
        return dj__cuda_attention_tc(cb, c, table_dev);
    }
    cb->last_attention = 2;
    return prefill(cb, c, a);
}
