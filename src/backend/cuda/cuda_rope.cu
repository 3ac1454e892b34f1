/* cuda_rope.cu: HF rotate_half RoPE on bf16 rows (in place allowed),
 * KV_WRITE of bf16 K/V rows into data-segment pages, and the two fused (RoPE
 * of k written to its output and to the pages in one pass, v beside it, and
 * optionally the RoPE of q at the same positions in the same launch).
 * f8_e4m3 pages (backend.h's layout: codes, then an int8 exponent per page and
 * head) take a kernel of their own with a block per (page, head) of the rows
 * written: the exponent needs the largest magnitude of all the page's new
 * values before any code is stored (and may re-encode the rows already
 * there), then each warp stores the codes of its rows (round to nearest
 * even, saturating: __nv_cvt_float_to_fp8). The bf16 kernels are untouched. */
#include <cuda_fp8.h>

#include "backend/cuda/cuda_impl.h"

#define ROPE_THREADS 256
#define ROPE_WARPS (ROPE_THREADS / 32)
#define ROPE_HEADS_MANY 8 /* heads a thread of rope_kv_write_kernel takes when the rows are many */

/* cos and sin of the angle times attention_scaling, in f32 (accurate, not
 * the fast intrinsics: angles reach 1e5 rad); every RoPE kernel takes them
 * from here, so fused and separate launches give the same bits. */
static __device__ __forceinline__ void rope_cs(float theta, float scale, float *cs, float *sn) {
    float s, c;
    sincosf(theta, &s, &c);
    *cs = c * scale;
    *sn = s * scale;
}

/* Row i's inverse frequencies: its own table where the call gives one a row
 * (row_freq: longrope's short or long factors by session), else the call's. */
static __device__ __forceinline__ const float *row_inv_freq(const float *inv_freq, const float *const *row_freq,
                                                            uint32_t i) {
    return row_freq ? row_freq[i] : inv_freq;
}

/* One thread per (row, head, pair j): angle inv_freq[j] * p in f32 (the row's
 * table: row_inv_freq), cos/sin in f32 (accurate, not the fast intrinsics:
 * angles reach 1e5 rad), times
 * attention_scaling; pairs (j, j + rot/2) of the first rot dims (all of the
 * head but with a partial rotary factor); the thread of pair j also copies
 * dims rot + j, rot + j + rot/2, ... when out is not x. */
static __global__ void rope_kernel(const __nv_bfloat16 *x, __nv_bfloat16 *out, const float *inv_freq,
                                   const float *const *row_freq, uint32_t n, uint32_t nh, uint32_t hd, uint32_t rot,
                                   uint32_t pos0, const uint32_t *row_pos, float scale) {
    dj_pdl_release();
    dj_pdl_wait();
    const uint32_t half = rot / 2;
    const size_t count = (size_t)n * nh * half;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < count; t += (size_t)gridDim.x * blockDim.x) {
        const uint32_t j = (uint32_t)(t % half);
        const size_t rh = t / half; /* row * nh + head */
        const uint32_t i = (uint32_t)(rh / nh);
        const float theta = row_inv_freq(inv_freq, row_freq, i)[j] * (float)(row_pos ? row_pos[i] : pos0 + i);
        float cs, sn;
        rope_cs(theta, scale, &cs, &sn);
        const size_t base = rh * hd;
        const float x1 = __bfloat162float(x[base + j]), x2 = __bfloat162float(x[base + j + half]);
        out[base + j] = __float2bfloat16(x1 * cs - x2 * sn);
        out[base + j + half] = __float2bfloat16(x2 * cs + x1 * sn);
        if (out != x) /* the dims past rot (partial rotary) pass through */
            for (uint32_t e = rot + j; e < hd; e += half) out[base + e] = x[base + e];
    }
}

/* The K row of position p in bf16 pages (its V row follows tpp * kv_dim
 * elements later): row i's own table with row_tables, else table. */
static __device__ __forceinline__ __nv_bfloat16 *kv_row(uint8_t *seg, size_t page_bytes, const uint32_t *table,
                                                        const uint32_t *const *row_tables, uint32_t i, uint32_t p,
                                                        uint32_t tpp, uint32_t kv_dim) {
    const uint32_t *tb = row_tables ? row_tables[i] : table;
    return (__nv_bfloat16 *)(seg + (size_t)tb[p / tpp] * page_bytes) + (size_t)(p % tpp) * kv_dim;
}

/* One thread per (row, element) of k and v; with row_tables each row has its
 * own position and table. */
static __global__ void kv_write_kernel(const __nv_bfloat16 *k, const __nv_bfloat16 *v, uint8_t *seg,
                                       size_t page_bytes, const uint32_t *table, uint32_t tpp, uint32_t kv_dim,
                                       uint32_t n, uint32_t pos0, const uint32_t *row_pos,
                                       const uint32_t *const *row_tables) {
    dj_pdl_release();
    dj_pdl_wait();
    const size_t count = (size_t)n * kv_dim;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < count; t += (size_t)gridDim.x * blockDim.x) {
        const uint32_t i = (uint32_t)(t / kv_dim), e = (uint32_t)(t % kv_dim);
        const uint32_t p = row_pos ? row_pos[i] : pos0 + i;
        __nv_bfloat16 *krow = kv_row(seg, page_bytes, table, row_tables, i, p, tpp, kv_dim);
        krow[e] = k[t];
        krow[(size_t)tpp * kv_dim + e] = v[t];
    }
}

/* VP consecutive bf16 values (VP 1 or 4: 2 or 8 bytes, aligned) as one access. */
template <int VP> struct bf16_vec;
template <> struct bf16_vec<1> { typedef __nv_bfloat16 t; };
template <> struct bf16_vec<4> { typedef uint2 t; };

template <int VP>
static __device__ __forceinline__ void ld_vec(const __nv_bfloat16 *p, __nv_bfloat16 (&v)[VP]) {
    const typename bf16_vec<VP>::t u = *(const typename bf16_vec<VP>::t *)p;
    memcpy(v, &u, sizeof u);
}

template <int VP>
static __device__ __forceinline__ void st_vec(__nv_bfloat16 *p, const __nv_bfloat16 (&v)[VP]) {
    typename bf16_vec<VP>::t u;
    memcpy(&u, v, sizeof u);
    *(typename bf16_vec<VP>::t *)p = u;
}

/* One thread per (row, VP consecutive pairs j.., group of hpt heads) over
 * nkv heads of k then nq heads of q (nq = 0: k only): rope_kernel's
 * arithmetic (so the same bits), the angles' cos/sin once for the thread's
 * heads (hpt 1 and VP 1 for a few rows, as decode: one element a thread
 * keeps every lane busy; more for prefill rows, where a sincos per element
 * was most of the kernel's time, and VP 4 there: 8-byte accesses - H100,
 * 2048 rows of 32 + 8 heads of 128, 32.8 -> 22.2 us, bench/RESULTS.md,
 * 2026-11-27). k's rotated pairs go to
 * kout and to K rows of the pages, v's elements j and j + hd/2 of that head
 * to V rows; q's to qout only. Each element is read before it is stored, by
 * one thread, so kout may be k and qout q. VP > 1: hd / 2 a multiple of VP,
 * every buffer and page row aligned to VP elements. The inputs' rows lie ldq
 * (q) and ldk (k, v) elements apart - nq * hd and nkv * hd, or the row of
 * one GEMM of q, k and v together (dj__cuda_f8_qkv_lt); the outputs' are
 * packed. */
template <int VP>
static __global__ void rope_kv_write_kernel(const __nv_bfloat16 *k, __nv_bfloat16 *kout, const __nv_bfloat16 *v,
                                            const __nv_bfloat16 *q, __nv_bfloat16 *qout, uint32_t nq,
                                            const float *inv_freq, const float *const *row_freq, uint32_t n,
                                            uint32_t nkv, uint32_t hd, uint32_t pos0, const uint32_t *row_pos,
                                            float scale, uint8_t *seg, size_t page_bytes, const uint32_t *table,
                                            uint32_t tpp, const uint32_t *const *row_tables, uint32_t hpt,
                                            uint32_t ldq, uint32_t ldk) {
    dj_pdl_release();
    const uint32_t half = hd / 2, kv_dim = nkv * hd, heads = nkv + nq, groups = (heads + hpt - 1) / hpt;
    const uint32_t slots = half / VP; /* a thread's VP pairs of a head */
    const size_t count = (size_t)n * groups * slots;
    bool waited = false;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < count; t += (size_t)gridDim.x * blockDim.x) {
        const uint32_t j = (uint32_t)(t % slots) * VP;
        const size_t rg = t / slots; /* row * groups + group */
        const uint32_t i = (uint32_t)(rg / groups), h0 = (uint32_t)(rg % groups) * hpt;
        const uint32_t h1 = h0 + hpt < heads ? h0 + hpt : heads;
        /* positions, tables and frequencies are the step's arguments (copied before any
         * kernel) or constant: the angles and the page come before the wait */
        const uint32_t p = row_pos ? row_pos[i] : pos0 + i;
        const float *freq = row_inv_freq(inv_freq, row_freq, i);
        float cs[VP], sn[VP];
#pragma unroll
        for (int e = 0; e < VP; e++) rope_cs(freq[j + e] * (float)p, scale, &cs[e], &sn[e]);
        __nv_bfloat16 *krow = kv_row(seg, page_bytes, table, row_tables, i, p, tpp, kv_dim);
        if (!waited) {
            dj_pdl_wait();
            waited = true;
        }
        for (uint32_t h = h0; h < h1; h++) {
            const bool is_k = h < nkv;
            const size_t base = is_k ? ((size_t)i * nkv + h) * hd : ((size_t)i * nq + (h - nkv)) * hd;
            const size_t in = is_k ? (size_t)i * ldk + (size_t)h * hd : (size_t)i * ldq + (size_t)(h - nkv) * hd;
            const __nv_bfloat16 *x = is_k ? k : q;
            __nv_bfloat16 a[VP], b[VP], o1[VP], o2[VP];
            ld_vec<VP>(x + in + j, a);
            ld_vec<VP>(x + in + j + half, b);
#pragma unroll
            for (int e = 0; e < VP; e++) {
                const float x1 = __bfloat162float(a[e]), x2 = __bfloat162float(b[e]);
                o1[e] = __float2bfloat16(x1 * cs[e] - x2 * sn[e]);
                o2[e] = __float2bfloat16(x2 * cs[e] + x1 * sn[e]);
            }
            if (!is_k) {
                st_vec<VP>(qout + base + j, o1);
                st_vec<VP>(qout + base + j + half, o2);
                continue;
            }
            __nv_bfloat16 v1[VP], v2[VP];
            ld_vec<VP>(v + in + j, v1);
            ld_vec<VP>(v + in + j + half, v2);
            st_vec<VP>(kout + base + j, o1);
            st_vec<VP>(kout + base + j + half, o2);
            const size_t kr = (size_t)h * hd + j, vr = kr + (size_t)tpp * kv_dim;
            st_vec<VP>(krow + kr, o1);
            st_vec<VP>(krow + kr + half, o2);
            st_vec<VP>(krow + vr, v1);
            st_vec<VP>(krow + vr + half, v2);
        }
    }
}

/* Per-head RMSNorm of k and q (Qwen3, Gemma 3) fused with their RoPE and
 * k's KV_WRITE into bf16 pages: one warp per (row, group of hpw heads) over
 * nkv heads of k then nq of q, HD / 32 values a lane (element lane + 32 t;
 * pairs t and t + HD / 64). The sum of squares in rmsnorm_warp_kernel's
 * order and the normed value rounded as it rounds it, then
 * rope_kv_write_kernel's rotation of those bf16 values (the angle's cos/sin
 * once per warp for its heads): the bits of the launches it replaces. The
 * normed values also go to kn/qn (the norms' outputs) where given, so every
 * buffer ends as those launches leave it. A lane reads and writes only its
 * own elements of a head, so any output may be its input: a warp issues
 * every load of its heads (x, and v for a k head) before its first store, and
 * the weights before the PDL wait - at decode (one head a warp) the chain of
 * weight, x and v loads after each other was most of the kernel's time
 * (tools/ktrace.c, Qwen3-8B shape: 4.2 us a layer against 1.1 for RoPE
 * alone); hpw <= ROPE_HEADS_MANY. */
template <typename TW, int HD>
static __global__ void __launch_bounds__(ROPE_THREADS)
    norm_rope_kv_write_kernel(const __nv_bfloat16 *k, __nv_bfloat16 *kn, __nv_bfloat16 *kout, const TW *kw,
                              const __nv_bfloat16 *q, __nv_bfloat16 *qn, __nv_bfloat16 *qout, const TW *qw,
                              uint32_t nq, const __nv_bfloat16 *v, float eps, float w_off, const float *inv_freq,
                              const float *const *row_freq, uint32_t n, uint32_t nkv, uint32_t pos0,
                              const uint32_t *row_pos, float scale, uint8_t *seg, size_t page_bytes,
                              const uint32_t *table, uint32_t tpp, const uint32_t *const *row_tables, uint32_t hpw) {
    constexpr int T = HD / 32, PAIRS = T / 2;
    dj_pdl_release();
    const uint32_t lane = threadIdx.x & 31, heads = nkv + nq, groups = (heads + hpw - 1) / hpw, kv_dim = nkv * HD;
    /* the norms' weights (w + w_off) at this lane's elements: constant, so loaded before the wait */
    float kwv[T], qwv[T];
#pragma unroll
    for (int t = 0; t < T; t++) {
        kwv[t] = dj_ld(kw, lane + 32 * t) + w_off;
        qwv[t] = dj_ld(qw, lane + 32 * t) + w_off;
    }
    const size_t count = (size_t)n * groups, warps = (size_t)gridDim.x * ROPE_WARPS;
    bool waited = false;
    for (size_t w = (size_t)blockIdx.x * ROPE_WARPS + (threadIdx.x >> 5); w < count; w += warps) { /* warp-uniform */
        const uint32_t i = (uint32_t)(w / groups), h0 = (uint32_t)(w % groups) * hpw;
        const uint32_t h1 = h0 + hpw < heads ? h0 + hpw : heads;
        /* positions, tables and frequencies are the step's arguments or constant: before the wait */
        const uint32_t p = row_pos ? row_pos[i] : pos0 + i;
        const float *freq = row_inv_freq(inv_freq, row_freq, i);
        float cs[PAIRS], sn[PAIRS];
#pragma unroll
        for (int t = 0; t < PAIRS; t++) rope_cs(freq[lane + 32 * t] * (float)p, scale, &cs[t], &sn[t]);
        __nv_bfloat16 *krow = kv_row(seg, page_bytes, table, row_tables, i, p, tpp, kv_dim);
        if (!waited) {
            dj_pdl_wait();
            waited = true;
        }
        /* Every head's loads (x, and v for a k head) before any store: a lane's
         * stores may alias its own loads only, and issuing a head's loads after
         * the one before it is stored left a DRAM latency per head in a row. */
        float y[ROPE_HEADS_MANY][T];
        __nv_bfloat16 vv[ROPE_HEADS_MANY][T];
        /* head h: k's heads first, then q's; its first element in k or q */
        auto head_base = [&](uint32_t h) -> size_t {
            return h < nkv ? ((size_t)i * nkv + h) * HD : ((size_t)i * nq + (h - nkv)) * HD;
        };
#pragma unroll
        for (uint32_t u = 0; u < ROPE_HEADS_MANY && h0 + u < h1; u++) {
            const size_t base = head_base(h0 + u);
#pragma unroll
            for (int t = 0; t < T; t++) {
                y[u][t] = __bfloat162float((h0 + u < nkv ? k : q)[base + lane + 32 * t]);
                if (h0 + u < nkv) vv[u][t] = v[base + lane + 32 * t];
            }
        }
#pragma unroll
        for (uint32_t u = 0; u < ROPE_HEADS_MANY; u++) {
            const uint32_t h = h0 + u;
            if (h >= h1) break;
            const bool is_k = h < nkv;
            const size_t base = head_base(h);
            float s = 0.0f;
#pragma unroll
            for (int t = 0; t < T; t++) s += y[u][t] * y[u][t];
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            const float r = 1.0f / sqrtf(s / (float)HD + eps);
            __nv_bfloat16 *nout = is_k ? kn : qn;
#pragma unroll
            for (int t = 0; t < T; t++) {
                const uint32_t e = lane + 32 * t;
                const __nv_bfloat16 b = __float2bfloat16((is_k ? kwv[t] : qwv[t]) * (y[u][t] * r));
                if (nout) nout[base + e] = b;
                y[u][t] = __bfloat162float(b);
            }
            __nv_bfloat16 *o = (is_k ? kout : qout) + base;
#pragma unroll
            for (int t = 0; t < PAIRS; t++) {
                const uint32_t e = lane + 32 * t;
                const float x1 = y[u][t], x2 = y[u][t + PAIRS];
                const __nv_bfloat16 o1 = __float2bfloat16(x1 * cs[t] - x2 * sn[t]);
                const __nv_bfloat16 o2 = __float2bfloat16(x2 * cs[t] + x1 * sn[t]);
                o[e] = o1;
                o[e + HD / 2] = o2;
                if (is_k) {
                    const size_t kr = (size_t)h * HD + e, vr = kr + (size_t)tpp * kv_dim;
                    krow[kr] = o1;
                    krow[kr + HD / 2] = o2;
                    krow[vr] = vv[u][t];
                    krow[vr + HD / 2] = vv[u][t + PAIRS];
                }
            }
        }
    }
}

/* ---- f8_e4m3 pages ---- */

static __device__ __forceinline__ float rope_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The RoPE of one head of hd values at x + base (position p, inverse
 * frequencies freq) into o + base by the whole warp, with
 * rope_kv_write_kernel's arithmetic (so the bits are the bf16 kernel's):
 * lane L takes the pairs (j, j + hd/2), j = L, L + 32, ...; returns the
 * lane's largest magnitude of the bf16 values it stored. */
static __device__ __forceinline__ float rope_head_warp(const __nv_bfloat16 *x, __nv_bfloat16 *o, size_t base,
                                                       const float *freq, uint32_t p, uint32_t hd, float scale,
                                                       uint32_t lane) {
    const uint32_t half = hd / 2;
    float m = 0.0f;
    for (uint32_t j = lane; j < half; j += 32) {
        const float theta = freq[j] * (float)p;
        float cs, sn;
        rope_cs(theta, scale, &cs, &sn);
        const float x1 = __bfloat162float(x[base + j]), x2 = __bfloat162float(x[base + j + half]);
        const __nv_bfloat16 o1 = __float2bfloat16(x1 * cs - x2 * sn), o2 = __float2bfloat16(x2 * cs + x1 * sn);
        o[base + j] = o1;
        o[base + j + half] = o2;
        m = fmaxf(m, fmaxf(fabsf(__bfloat162float(o1)), fabsf(__bfloat162float(o2))));
    }
    return m;
}

/* A KV_WRITE into f8 pages, and with rope the RoPE of k (and of nq q heads)
 * before it. */
struct f8w_args {
    const __nv_bfloat16 *k;   /* [n][nkv * hd]: K rows (with rope: before the rotation) */
    __nv_bfloat16 *kout;      /* rope: the rotated k (may be k) */
    const __nv_bfloat16 *v;   /* [n][nkv * hd] */
    const __nv_bfloat16 *q;   /* rope: [n][nq * hd] (nq 0: none) */
    __nv_bfloat16 *qout;      /* rope: the rotated q (may be q) */
    uint32_t nq;
    const float *inv_freq;    /* rope */
    const float *const *row_freq;
    float scale;
    uint32_t n, nkv, hd, pos0;
    const uint32_t *row_pos;  /* NULL: rows at pos0 + i, one table */
    uint8_t *seg;
    size_t page_bytes;
    const uint32_t *table;
    uint32_t tpp;
    const uint32_t *const *row_tables;
    uint32_t kv_blocks;       /* blocks [0, kv_blocks): a (group, head) each; the rest take q */
};

static __device__ __forceinline__ uint32_t f8w_pos(const f8w_args &a, uint32_t i) {
    return a.row_pos ? a.row_pos[i] : a.pos0 + i;
}
static __device__ __forceinline__ const uint32_t *f8w_table(const f8w_args &a, uint32_t i) {
    return a.row_tables ? a.row_tables[i] : a.table;
}
/* Row j continues row j - 1's group: the same table and block, the next position. */
static __device__ __forceinline__ bool f8w_continues(const f8w_args &a, uint32_t j) {
    const uint32_t p = f8w_pos(a, j - 1), q = f8w_pos(a, j);
    return f8w_table(a, j) == f8w_table(a, j - 1) && q == p + 1 && q / a.tpp == p / a.tpp;
}

/* The rows [i0, i1) of one page (backend.h's group) and one kv head, by one
 * block, as the CPU's KV_WRITE: their largest magnitudes (K after its
 * rotation, as stored to kout) give the head's exponents with the page's
 * old ones (read by thread 0 before anything is written), the rows held
 * before them are re-encoded where an exponent rises, then each warp stores
 * the codes of the rows it rotated (re-reading the kout elements each lane
 * stored itself) and thread 0 the exponents. Blocks past kv_blocks rotate q:
 * a warp per (row, q head). */
template <bool ROPE>
static __global__ void __launch_bounds__(ROPE_THREADS) kv_write_f8_kernel(const f8w_args a) {
    dj_pdl_release();
    dj_pdl_wait();
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, hd = a.hd;
    const uint32_t kvd = a.nkv * hd;
    if (blockIdx.x >= a.kv_blocks) { /* q heads (ROPE only) */
        const size_t count = (size_t)a.n * a.nq, warps = (size_t)(gridDim.x - a.kv_blocks) * nw;
        for (size_t w = (size_t)(blockIdx.x - a.kv_blocks) * nw + warp; w < count; w += warps) {
            const uint32_t i = (uint32_t)(w / a.nq);
            rope_head_warp(a.q, a.qout, w * hd, row_inv_freq(a.inv_freq, a.row_freq, i), f8w_pos(a, i), hd, a.scale,
                           lane);
        }
        return;
    }
    const uint32_t gi = blockIdx.x / a.nkv, h = blockIdx.x % a.nkv;
    uint32_t i0, i1;
    if (!a.row_pos) { /* consecutive positions: group gi is page (pos0 / tpp) + gi */
        const uint32_t off = a.pos0 % a.tpp;
        i0 = gi == 0 ? 0u : gi * a.tpp - off;
        i1 = min(a.n, (gi + 1) * a.tpp - off);
    } else { /* a block per row: the group's first row takes it, the others leave */
        i0 = gi;
        if (i0 > 0 && f8w_continues(a, i0)) return; /* block-uniform */
        i1 = i0 + 1;
        while (i1 < a.n && f8w_continues(a, i1)) i1++;
    }
    const uint32_t p0 = f8w_pos(a, i0), r0 = p0 % a.tpp;
    uint8_t *page = a.seg + (size_t)f8w_table(a, i0)[p0 / a.tpp] * a.page_bytes;
    int8_t *ex = (int8_t *)(page + dj_kv_f8_exps_at(a.tpp, kvd));
    __shared__ unsigned kbits, vbits; /* the rows' largest magnitudes (>= 0: ordered as their bits) */
    __shared__ int kold, vold;
    /* the page's exponents, requested now and published after the rows' maxima (their load overlaps) */
    const int ko = threadIdx.x == 0 && r0 ? ex[h] : DJ_KV_F8_EXP_MIN;
    const int vo = threadIdx.x == 0 && r0 ? ex[a.nkv + h] : DJ_KV_F8_EXP_MIN;
    if (threadIdx.x == 0) kbits = vbits = 0u;
    __syncthreads();
    for (uint32_t i = i0 + warp; i < i1; i += nw) {
        const size_t base = ((size_t)i * a.nkv + h) * hd;
        float km = 0.0f, vm = 0.0f;
        if constexpr (ROPE) {
            km = rope_head_warp(a.k, a.kout, base, row_inv_freq(a.inv_freq, a.row_freq, i), f8w_pos(a, i), hd, a.scale,
                                lane);
        } else {
            for (uint32_t e = lane; e < hd; e += 32) km = fmaxf(km, fabsf(__bfloat162float(a.k[base + e])));
        }
        for (uint32_t e = lane; e < hd; e += 32) vm = fmaxf(vm, fabsf(__bfloat162float(a.v[base + e])));
        km = rope_warp_max(km);
        vm = rope_warp_max(vm);
        if (lane == 0) {
            atomicMax(&kbits, __float_as_uint(km));
            atomicMax(&vbits, __float_as_uint(vm));
        }
    }
    if (threadIdx.x == 0) {
        kold = ko;
        vold = vo;
    }
    __syncthreads();
    const int ks = max(kold, dj_kv_f8_exp(__uint_as_float(kbits)));
    const int vs = max(vold, dj_kv_f8_exp(__uint_as_float(vbits)));
    /* rows [0, r0) re-encoded at a raised exponent (never when r0 is 0: old is then the least) */
    for (int w = 0; w < 2; w++) {
        const int old = w ? vold : kold, now = w ? vs : ks;
        if (now == old) continue; /* block-uniform */
        uint8_t *codes = page + (w ? (size_t)a.tpp * kvd : 0) + (size_t)h * hd;
        for (uint32_t t = threadIdx.x; t < r0 * hd; t += blockDim.x) {
            uint8_t *c = codes + (size_t)(t / hd) * kvd + t % hd;
            const float x = __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)*c, __NV_E4M3)));
            *c = (uint8_t)__nv_cvt_float_to_fp8(ldexpf(x, old - now), __NV_SATFINITE, __NV_E4M3);
        }
    }
    for (uint32_t i = i0 + warp; i < i1; i += nw) {
        const size_t base = ((size_t)i * a.nkv + h) * hd;
        uint8_t *kc = page + (size_t)(r0 + i - i0) * kvd + (size_t)h * hd, *vc = kc + (size_t)a.tpp * kvd;
        if constexpr (ROPE) { /* lane L re-reads the elements j, j + hd/2 it stored */
            const uint32_t half = hd / 2;
            for (uint32_t j = lane; j < half; j += 32) {
                kc[j] = (uint8_t)__nv_cvt_float_to_fp8(ldexpf(__bfloat162float(a.kout[base + j]), -ks),
                                                       __NV_SATFINITE, __NV_E4M3);
                kc[j + half] = (uint8_t)__nv_cvt_float_to_fp8(ldexpf(__bfloat162float(a.kout[base + j + half]), -ks),
                                                              __NV_SATFINITE, __NV_E4M3);
            }
        } else {
            for (uint32_t e = lane; e < hd; e += 32)
                kc[e] = (uint8_t)__nv_cvt_float_to_fp8(ldexpf(__bfloat162float(a.k[base + e]), -ks), __NV_SATFINITE,
                                                       __NV_E4M3);
        }
        for (uint32_t e = lane; e < hd; e += 32)
            vc[e] = (uint8_t)__nv_cvt_float_to_fp8(ldexpf(__bfloat162float(a.v[base + e]), -vs), __NV_SATFINITE,
                                                   __NV_E4M3);
    }
    if (threadIdx.x == 0) {
        ex[h] = (int8_t)ks;
        ex[a.nkv + h] = (int8_t)vs;
    }
}

/* Launches kv_write_f8_kernel: a block per (group, kv head) - per page the
 * rows span with consecutive positions, else per row - and with q heads
 * blocks for them after. Decode rows (per-row positions, few rows: a row a
 * group) take blocks of one warp, the rest of ROPE_WARPS warps (a page's
 * rows spread over them). */
template <bool ROPE>
static void launch_kv_write_f8(dj_cuda_backend *cb, f8w_args a) {
    const uint32_t groups = a.row_pos ? a.n : (a.pos0 % a.tpp + a.n + a.tpp - 1) / a.tpp;
    const uint32_t threads = a.row_pos && a.n <= 256 ? 32u : ROPE_THREADS, nw = threads / 32;
    a.kv_blocks = groups * a.nkv;
    const size_t qwarps = (size_t)a.n * a.nq, qb = (qwarps + nw - 1) / nw, cap = (size_t)cb->n_sm * 16 * (ROPE_WARPS / nw);
    const unsigned blocks = a.kv_blocks + (unsigned)(qb < cap ? qb : cap);
    dj__launch(cb, kv_write_f8_kernel<ROPE>, dim3(blocks), dim3(threads), 0, a);
}

static unsigned grid_for(const dj_cuda_backend *cb, size_t count) {
    size_t b = (count + ROPE_THREADS - 1) / ROPE_THREADS, cap = (size_t)cb->n_sm * 16;
    return (unsigned)(b < cap ? b : cap);
}

dj_status dj__cuda_rope(dj_cuda_backend *cb, const dj_op_call *c) {
    const uint32_t rot = c->rot_dim ? c->rot_dim : c->head_dim;
    const size_t count = (size_t)c->n * c->n_heads * (rot / 2);
    dj__launch(cb, rope_kernel, dim3(grid_for(cb, count)), dim3(ROPE_THREADS), 0,
        (const __nv_bfloat16 *)c->x, (__nv_bfloat16 *)c->out, c->inv_freq, c->row_freq, c->n, c->n_heads,
        c->head_dim, rot, c->pos0, c->row_pos, c->scale);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

dj_status dj__cuda_kv_write(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t *table_dev) {
    const dj_kv_view *kv = c->kv;
    if (kv->dtype == DJ_DTYPE_F8_E4M3) {
        const uint32_t nkv = kv->n_kv_heads; /* checked: set, and divides kv_dim */
        f8w_args a = {};
        a.k = (const __nv_bfloat16 *)c->x;
        a.v = (const __nv_bfloat16 *)c->x2;
        a.n = c->n, a.nkv = nkv, a.hd = kv->kv_dim / nkv, a.pos0 = c->pos0, a.row_pos = c->row_pos;
        a.seg = kv->seg_base, a.page_bytes = kv->page_bytes, a.table = table_dev, a.tpp = kv->tokens_per_page;
        a.row_tables = c->row_tables;
        launch_kv_write_f8<false>(cb, a);
        DJ_CU_LAUNCHED(cb);
        return DJ_OK;
    }
    const size_t count = (size_t)c->n * kv->kv_dim;
    dj__launch(cb, kv_write_kernel, dim3(grid_for(cb, count)), dim3(ROPE_THREADS), 0,
        (const __nv_bfloat16 *)c->x, (const __nv_bfloat16 *)c->x2, kv->seg_base, kv->page_bytes, table_dev,
        kv->tokens_per_page, kv->kv_dim, c->n, c->pos0, c->row_pos, c->row_tables);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

dj_status dj__cuda_rope_kv_write(dj_cuda_backend *cb, const dj_op_call *rope_q, const dj_op_call *rope,
                                 const dj_op_call *kvw, const uint32_t *table_dev) {
    return dj__cuda_rope_kv_write_from(cb, rope_q, rope, kvw, table_dev, NULL, 0);
}

dj_status dj__cuda_rope_kv_write_from(dj_cuda_backend *cb, const dj_op_call *rope_q, const dj_op_call *rope,
                                      const dj_op_call *kvw, const uint32_t *table_dev, const __nv_bfloat16 *qkv,
                                      uint32_t ld) {
    const dj_kv_view *kv = kvw->kv;
    const uint32_t nq = rope_q ? rope_q->n_heads : 0u;
    if (qkv && (kv->dtype != DJ_DTYPE_BF16 || !rope_q))
        return dj_fail(DJ_EINTERNAL, "rope+kv_write from one q/k/v row: bf16 pages and q's ROPE only");
    if (kv->dtype == DJ_DTYPE_F8_E4M3) { /* the plan fuses it only where k's heads are the view's */
        f8w_args a = {};
        a.k = (const __nv_bfloat16 *)rope->x;
        a.kout = (__nv_bfloat16 *)rope->out;
        a.v = (const __nv_bfloat16 *)kvw->x2;
        a.q = rope_q ? (const __nv_bfloat16 *)rope_q->x : NULL;
        a.qout = rope_q ? (__nv_bfloat16 *)rope_q->out : NULL;
        a.nq = nq, a.inv_freq = rope->inv_freq, a.row_freq = rope->row_freq, a.scale = rope->scale;
        a.n = rope->n, a.nkv = rope->n_heads, a.hd = rope->head_dim, a.pos0 = rope->pos0, a.row_pos = rope->row_pos;
        a.seg = kv->seg_base, a.page_bytes = kv->page_bytes, a.table = table_dev, a.tpp = kv->tokens_per_page;
        a.row_tables = kvw->row_tables;
        launch_kv_write_f8<true>(cb, a);
        DJ_CU_LAUNCHED(cb);
        return DJ_OK;
    }
    const uint32_t heads = rope->n_heads + nq, hd = rope->head_dim;
    const size_t elems = (size_t)rope->n * heads * (hd / 2);
    const bool many = elems >= ((size_t)1 << 20);
    const uint32_t hpt = many ? ROPE_HEADS_MANY : 1u;
    /* the inputs: the calls' own, or q, k and v side by side in rows of ld */
    const uint32_t qd = nq * hd, kd = rope->n_heads * hd;
    const __nv_bfloat16 *kin = qkv ? qkv + qd : (const __nv_bfloat16 *)rope->x;
    const __nv_bfloat16 *vin = qkv ? qkv + qd + kd : (const __nv_bfloat16 *)kvw->x2;
    const __nv_bfloat16 *qin = qkv ? qkv : rope_q ? (const __nv_bfloat16 *)rope_q->x : NULL;
    /* prefill rows: 4 pairs a thread where every access is 8-byte aligned */
    const uintptr_t align = (uintptr_t)kin | (uintptr_t)rope->out | (uintptr_t)vin | (uintptr_t)qin |
                            (uintptr_t)(rope_q ? rope_q->out : NULL) | (uintptr_t)kv->seg_base |
                            (uintptr_t)kv->page_bytes | (uintptr_t)(qkv ? ld * 2u : 0u);
    const uint32_t vp = many && (hd / 2) % 4 == 0 && align % 8 == 0 ? 4u : 1u;
    const size_t count = (size_t)rope->n * ((heads + hpt - 1) / hpt) * (hd / 2 / vp);
    auto kernel = vp == 4 ? rope_kv_write_kernel<4> : rope_kv_write_kernel<1>;
    dj__launch(cb, kernel, dim3(grid_for(cb, count)), dim3(ROPE_THREADS), 0, kin, (__nv_bfloat16 *)rope->out, vin,
               qin, rope_q ? (__nv_bfloat16 *)rope_q->out : NULL, nq, rope->inv_freq, rope->row_freq, rope->n,
               rope->n_heads, hd, rope->pos0, rope->row_pos, rope->scale, kv->seg_base, kv->page_bytes, table_dev,
               kv->tokens_per_page, kvw->row_tables, hpt, qkv ? ld : qd, qkv ? ld : kd);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

template <typename TW, int HD>
static void launch_norm_rope(dj_cuda_backend *cb, const dj_op_call *qn, const dj_op_call *kn, const dj_op_call *rq,
                             const dj_op_call *rk, const dj_op_call *kvw, const uint32_t *table_dev) {
    const dj_kv_view *kv = kvw->kv;
    const uint32_t heads = rk->n_heads + rq->n_heads;
    const uint32_t hpw = (size_t)rk->n * heads * (HD / 2) >= ((size_t)1 << 20) ? ROPE_HEADS_MANY : 1u;
    const size_t warps = (size_t)rk->n * ((heads + hpw - 1) / hpw);
    dj__launch(cb, norm_rope_kv_write_kernel<TW, HD>, dim3(grid_for(cb, warps * 32)), dim3(ROPE_THREADS), 0,
        (const __nv_bfloat16 *)kn->x, kn->out == rk->out ? NULL : (__nv_bfloat16 *)kn->out, (__nv_bfloat16 *)rk->out,
        (const TW *)kn->w, (const __nv_bfloat16 *)qn->x, qn->out == rq->out ? NULL : (__nv_bfloat16 *)qn->out,
        (__nv_bfloat16 *)rq->out, (const TW *)qn->w, rq->n_heads, (const __nv_bfloat16 *)kvw->x2, qn->eps,
        qn->w_offset, rk->inv_freq, rk->row_freq, rk->n, rk->n_heads, rk->pos0, rk->row_pos, rk->scale, kv->seg_base,
        kv->page_bytes, table_dev, kv->tokens_per_page, kvw->row_tables, hpw);
}

template <typename TW>
static void norm_rope_hd(dj_cuda_backend *cb, const dj_op_call *qn, const dj_op_call *kn, const dj_op_call *rq,
                         const dj_op_call *rk, const dj_op_call *kvw, const uint32_t *table_dev) {
    switch (rk->head_dim) {
    case 64: launch_norm_rope<TW, 64>(cb, qn, kn, rq, rk, kvw, table_dev); break;
    case 128: launch_norm_rope<TW, 128>(cb, qn, kn, rq, rk, kvw, table_dev); break;
    default: launch_norm_rope<TW, 256>(cb, qn, kn, rq, rk, kvw, table_dev); break;
    }
}

bool dj__cuda_norm_rope_takes(const dj_op_call *qn, const dj_op_call *kn, const dj_op_call *rq, const dj_op_call *rk,
                              const dj_op_call *kvw) {
    const uint32_t hd = rk->head_dim;
    if (qn->op != DJ_OP_RMSNORM || kn->op != DJ_OP_RMSNORM || kvw->kv->dtype != DJ_DTYPE_BF16 ||
        !(hd == 64 || hd == 128 || hd == 256) || qn->eps != kn->eps || qn->w_offset != kn->w_offset ||
        qn->w_dtype != kn->w_dtype ||
        !(qn->w_dtype == DJ_DTYPE_BF16 || qn->w_dtype == DJ_DTYPE_F16 || qn->w_dtype == DJ_DTYPE_F32))
        return false;
    const dj_op_call *nm[2] = {qn, kn}, *r[2] = {rq, rk};
    for (int j = 0; j < 2; j++)
        if (nm[j]->x_dtype != DJ_DTYPE_BF16 || nm[j]->d != hd || nm[j]->groups != r[j]->n_heads ||
            nm[j]->n != r[j]->n || nm[j]->out != r[j]->x)
            return false;
    return true;
}

dj_status dj__cuda_norm_rope_kv_write(dj_cuda_backend *cb, const dj_op_call *qn, const dj_op_call *kn,
                                      const dj_op_call *rq, const dj_op_call *rk, const dj_op_call *kvw,
                                      const uint32_t *table_dev) {
    switch (qn->w_dtype) {
    case DJ_DTYPE_BF16: norm_rope_hd<__nv_bfloat16>(cb, qn, kn, rq, rk, kvw, table_dev); break;
    case DJ_DTYPE_F16: norm_rope_hd<__half>(cb, qn, kn, rq, rk, kvw, table_dev); break;
    default: norm_rope_hd<float>(cb, qn, kn, rq, rk, kvw, table_dev); break;
    }
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
