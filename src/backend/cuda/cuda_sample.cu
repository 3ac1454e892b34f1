/* cuda_sample.cu: the sample hook on the device - penalties, temperature,
 * top-k, top-p, min-p and the draw of dj_sampler_pick's rule (sampler.h), so
 * that only the picked ids cross PCIe. The caller's seeded host generator
 * supplies one uniform u in [0, 1) per row, and the kernel picks the same id
 * as the host: the weight and mass arithmetic is shared (model/sample_rule.h)
 * and every mass is an exact 64-bit integer, so no sum depends on its order.
 *
 * One block of 1024 threads per row, no sort: the weights' bits (which order
 * as the weights do) are written to scratch; each cut (the k-th weight for
 * top-k, the weight where the mass reaches top-p) is a radix select over
 * those bits in three 10-bit levels, each a shared-memory histogram of count
 * and mass; min-p is a threshold on the bits. The kept set is then {bits >
 * bc} plus the first tc ids (in id order) whose bits equal bc, and the draw
 * walks it in id order: 1024 segment sums, a block scan, then one warp walks
 * the segment where the cumulative mass crosses the target. */
#include <math.h>

#include "backend/cuda/cuda_impl.h"
#include "model/sample_rule.h"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define BINS 1024 /* one radix level: 10 bits */

typedef unsigned long long u64;

struct sample_smem {
    uint32_t h1cnt[BINS]; /* level 1 (bits >> 20), kept for both cuts */
    u64 h1mass[BINS];
    uint32_t hcnt[BINS];  /* levels 2 and 3; hmass also holds the segment sums of the draw */
    u64 hmass[BINS];
    uint32_t wcnt[SAMPLE_WARPS];
    u64 wsum[SAMPLE_WARPS];
    float wmax[SAMPLE_WARPS];
    uint32_t wmin[SAMPLE_WARPS];
    float b_max;
    uint32_t b_min;
    u64 b_sum;
    uint32_t b_sel[3];
    u64 b_mass;
    u64 stage[SAMPLE_WARPS][32]; /* hist_add: each warp's masses */
};

static __device__ __forceinline__ u64 q_of(uint32_t b) { return (u64)dj__sample_q(__uint_as_float(b)); }

static __device__ float block_max(float v, sample_smem *sm) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o)); /* fmaxf drops NaN */
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* the last readers of the slots are done */
    if (lane == 0) sm->wmax[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float x = sm->wmax[lane];
        for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
        if (lane == 0) sm->b_max = x;
    }
    __syncthreads();
    return sm->b_max;
}

static __device__ uint32_t block_min(uint32_t v, sample_smem *sm) {
    v = __reduce_min_sync(0xffffffffu, v);
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sm->wmin[warp] = v;
    __syncthreads();
    if (warp == 0) {
        const uint32_t x = __reduce_min_sync(0xffffffffu, sm->wmin[lane]);
        if (lane == 0) sm->b_min = x;
    }
    __syncthreads();
    return sm->b_min;
}

static __device__ u64 warp_sum(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Inclusive scan of (c, m) over thread index; *tc, *tm get the block's totals. */
static __device__ void block_scan(uint32_t *c, u64 *m, uint32_t *tc, u64 *tm, sample_smem *sm) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const uint32_t nc = __shfl_up_sync(0xffffffffu, *c, o);
        const u64 nm = __shfl_up_sync(0xffffffffu, *m, o);
        if ((int)lane >= o) *c += nc, *m += nm;
    }
    __syncthreads();
    if (lane == 31) sm->wcnt[warp] = *c, sm->wsum[warp] = *m;
    __syncthreads();
    if (warp == 0) {
        uint32_t x = sm->wcnt[lane];
        u64 y = sm->wsum[lane];
        for (int o = 1; o < 32; o <<= 1) {
            const uint32_t nx = __shfl_up_sync(0xffffffffu, x, o);
            const u64 ny = __shfl_up_sync(0xffffffffu, y, o);
            if ((int)lane >= o) x += nx, y += ny;
        }
        sm->wcnt[lane] = x;
        sm->wsum[lane] = y;
    }
    __syncthreads();
    if (warp > 0) *c += sm->wcnt[warp - 1], *m += sm->wsum[warp - 1];
    *tc = sm->wcnt[SAMPLE_WARPS - 1];
    *tm = sm->wsum[SAMPLE_WARPS - 1];
}

/* One warp's step of a histogram: lanes with equal keys add through their
 * lowest lane, one atomic pair per distinct key (flat logits put most
 * weights in a few bins, where per-element atomics would serialise). Every
 * lane of the warp calls it. */
static __device__ void hist_add(uint32_t *cnt, u64 *mass, bool valid, uint32_t key, u64 q, u64 *stage) {
    const uint32_t lane = threadIdx.x & 31;
    if (!__ballot_sync(0xffffffffu, valid)) return; /* warp-uniform */
    const uint32_t peers = __match_any_sync(0xffffffffu, valid ? key : 0xffffffffu); /* keys are < BINS */
    stage[lane] = q;
    __syncwarp();
    if (valid && (peers & ((1u << lane) - 1u)) == 0) {
        u64 sum = 0;
        for (uint32_t m = peers; m; m &= m - 1) sum += stage[__ffs(m) - 1];
        atomicAdd(&cnt[key], (uint32_t)__popc(peers));
        if (sum) atomicAdd(&mass[key], sum);
    }
    __syncwarp(); /* stage is free for the next step */
}

/* Histogram of the bits b with (b >> (shift + 10)) == prefix, keyed by
 * (b >> shift) & 1023, into cnt/mass (shift 10 or 0). */
static __device__ void histogram(const uint32_t *wb, uint32_t V, int shift, uint32_t prefix, uint32_t *cnt, u64 *mass,
                                 sample_smem *sm) {
    __syncthreads(); /* earlier readers of cnt/mass are done */
    for (uint32_t i = threadIdx.x; i < BINS; i += SAMPLE_THREADS) cnt[i] = 0, mass[i] = 0;
    __syncthreads();
    u64 *stage = sm->stage[threadIdx.x >> 5];
    for (uint32_t i0 = 0; i0 < V; i0 += SAMPLE_THREADS) { /* uniform trip count: hist_add wants whole warps */
        const uint32_t i = i0 + threadIdx.x;
        const uint32_t b = i < V ? wb[i] : 0u;
        const bool in = i < V && (b >> (shift + 10)) == prefix;
        hist_add(cnt, mass, in, (b >> shift) & (BINS - 1), in ? q_of(b) : 0u, stage);
    }
    __syncthreads();
}

/* On a histogram below base (the count and mass of everything above its
 * range): the largest bin h with base + (count or mass of bins >= h) reaching
 * k (by_count) or goal (a double, by mass). sel: h, and the count and mass
 * of everything above bin h (into *above_c, *above_m). */
static __device__ uint32_t select_bin(const uint32_t *cnt, const u64 *mass, bool by_count, uint32_t k, double goal,
                                      uint32_t base_c, u64 base_m, uint32_t *above_c, u64 *above_m, sample_smem *sm) {
    const uint32_t t = threadIdx.x, bin = BINS - 1 - t;
    const uint32_t c0 = cnt[bin];
    const u64 m0 = mass[bin];
    uint32_t c = c0, tc;
    u64 m = m0, tm;
    block_scan(&c, &m, &tc, &tm, sm); /* bins >= bin */
    const bool ok = by_count ? base_c + c >= k : (double)(base_m + m) >= goal;
    uint32_t tmin = block_min(ok ? t : SAMPLE_THREADS, sm);
    if (tmin == SAMPLE_THREADS) tmin = SAMPLE_THREADS - 1; /* unreachable: the whole range reaches it */
    if (t == tmin) {
        sm->b_sel[0] = bin;
        sm->b_sel[1] = base_c + c - c0;
        sm->b_mass = base_m + m - m0;
    }
    __syncthreads();
    const uint32_t h = sm->b_sel[0];
    *above_c = sm->b_sel[1];
    *above_m = sm->b_mass;
    __syncthreads(); /* the slots are read */
    return h;
}

/* The weight bits b where the k-th weight (by_count) or the mass goal falls,
 * in descending order: *above_c, *above_m = the count and mass of bits > b,
 * *eq = how many weights have bits b. Level 1 comes from the kept histogram. */
static __device__ uint32_t radix_select(const uint32_t *wb, uint32_t V, bool by_count, uint32_t k, double goal,
                                        uint32_t *above_c, u64 *above_m, uint32_t *eq, sample_smem *sm) {
    uint32_t ac;
    u64 am;
    const uint32_t h1 = select_bin(sm->h1cnt, sm->h1mass, by_count, k, goal, 0, 0, &ac, &am, sm);
    histogram(wb, V, 10, h1, sm->hcnt, sm->hmass, sm);
    const uint32_t h2 = select_bin(sm->hcnt, sm->hmass, by_count, k, goal, ac, am, &ac, &am, sm);
    histogram(wb, V, 0, (h1 << 10) | h2, sm->hcnt, sm->hmass, sm);
    const uint32_t h3 = select_bin(sm->hcnt, sm->hmass, by_count, k, goal, ac, am, &ac, &am, sm);
    *eq = sm->hcnt[h3];
    *above_c = ac;
    *above_m = am;
    __syncthreads(); /* hcnt is read */
    return (h1 << 20) | (h2 << 10) | h3;
}

/* The kept set: every id (all), or {bits > bc} plus, of the ids with bits
 * bc, none (tie 0), all (tie 1) or those up to id last (tie 2). */
struct kept_set {
    bool all;
    int tie;
    uint32_t bc, last;
    __device__ bool has(uint32_t b, uint32_t i) const {
        return all || b > bc || (b == bc && (tie == 1 || (tie == 2 && i <= last)));
    }
};

/* The first id whose cumulative val exceeds the target (in id order), where
 * the target is target_of(total of val): segment sums, a block scan, then
 * warp 0 walks the crossing segment. V if the total is 0. */
template <typename Val, typename Target>
static __device__ uint32_t first_over(const uint32_t *wb, uint32_t V, Val val, Target target_of, sample_smem *sm) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint32_t seg = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    __syncthreads(); /* hmass's last readers are done */
    for (uint32_t s = warp; s < SAMPLE_THREADS; s += SAMPLE_WARPS) {
        const uint32_t lo = s * seg, hi = lo + seg < V ? lo + seg : V;
        u64 acc = 0;
        for (uint32_t i = lo + lane; i < hi; i += 32) acc += val(wb[i], i);
        acc = warp_sum(acc);
        if (lane == 0) sm->hmass[s] = acc;
    }
    __syncthreads();
    const u64 x = sm->hmass[threadIdx.x];
    u64 m = x, total;
    uint32_t c = 0, tc;
    block_scan(&c, &m, &tc, &total, sm);
    if (total == 0) return V;
    const u64 target = target_of(total);
    const uint32_t s = block_min(m - x <= target && target < m ? threadIdx.x : SAMPLE_THREADS, sm);
    if (s == SAMPLE_THREADS) return V; /* unreachable: target < total */
    if (threadIdx.x == s) sm->b_mass = m - x;
    __syncthreads();
    if (warp == 0) {
        u64 base = sm->b_mass;
        const uint32_t lo = s * seg, hi = lo + seg < V ? lo + seg : V;
        for (uint32_t i0 = lo; i0 < hi; i0 += 32) {
            const uint32_t i = i0 + lane;
            const u64 v = i < hi ? val(wb[i], i) : 0;
            u64 incl = v;
            for (int o = 1; o < 32; o <<= 1) {
                const u64 n = __shfl_up_sync(0xffffffffu, incl, o);
                if ((int)lane >= o) incl += n;
            }
            const uint32_t over = __ballot_sync(0xffffffffu, v > 0 && base + incl > target);
            if (over) {
                if (lane == 0) sm->b_sel[2] = i0 + (uint32_t)(__ffs(over) - 1);
                break;
            }
            base += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    __syncthreads();
    const uint32_t id = sm->b_sel[2];
    __syncthreads();
    return id;
}

/* The device copy of a dj_sample_row: penalties as an offset into one array. */
struct sample_row_dev {
    float temperature;
    uint32_t top_k;
    float top_p;
    float min_p;
    float rep;
    uint32_t pen_off, n_pen, pad;
    double u;
};

static __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float *logits, uint32_t V, const sample_row_dev *rows, const dj_sampler_penalty *pens,
                  uint32_t *wbits, int32_t *out) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    sample_smem *sm = (sample_smem *)smem_raw;
    const uint32_t r = blockIdx.x;
    uint32_t *wb = wbits + (size_t)r * V;
    const sample_row_dev p = rows[r];
    const float *src = logits + (size_t)r * V;
    if (p.n_pen) { /* penalised logits, in the scratch row */
        for (uint32_t i = threadIdx.x; i < V; i += SAMPLE_THREADS) wb[i] = __float_as_uint(src[i]);
        __syncthreads();
        for (uint32_t k = threadIdx.x; k < p.n_pen; k += SAMPLE_THREADS) { /* ids distinct, checked by the launcher */
            const dj_sampler_penalty e = pens[p.pen_off + k];
            wb[e.id] = __float_as_uint(dj__sample_penalize(__uint_as_float(wb[e.id]), p.rep, e.sub));
        }
        __syncthreads();
        src = (const float *)wb;
    }
    float mx = -INFINITY;
    for (uint32_t i = threadIdx.x; i < V; i += SAMPLE_THREADS) mx = src[i] > mx ? src[i] : mx; /* NaN never wins */
    mx = block_max(mx, sm);
    if (!(mx > -INFINITY)) { /* nothing to choose from */
        if (threadIdx.x == 0) out[r] = 0;
        return;
    }
    if (p.temperature == 0.0f) { /* greedy: the lowest id holding the max */
        uint32_t best = V;
        for (uint32_t i = threadIdx.x; i < V; i += SAMPLE_THREADS)
            if (src[i] == mx && i < best) best = i;
        best = block_min(best, sm);
        if (threadIdx.x == 0) out[r] = (int32_t)best;
        return;
    }
    const bool topk = p.top_k > 0 && p.top_k < V, topp = p.top_p < 1.0f, cut = topk || topp || p.min_p > 0.0f;
    if (cut) {
        for (uint32_t i = threadIdx.x; i < BINS; i += SAMPLE_THREADS) sm->h1cnt[i] = 0, sm->h1mass[i] = 0;
        __syncthreads();
    }
    u64 *stage = sm->stage[threadIdx.x >> 5];
    for (uint32_t i0 = 0; i0 < V; i0 += SAMPLE_THREADS) { /* uniform trip count: hist_add wants whole warps */
        const uint32_t i = i0 + threadIdx.x;
        uint32_t b = 0;
        if (i < V) {
            b = __float_as_uint(dj__sample_weight(src[i], mx, p.temperature)); /* reads src[i] first */
            wb[i] = b;
        }
        if (cut) hist_add(sm->h1cnt, sm->h1mass, i < V, b >> 20, q_of(b), stage); /* level 1: bits >> 20 */
    }
    __syncthreads();

    kept_set ks = {true, 0, 0u, 0u};
    if (cut) {
        uint32_t bp = 0, tp = 0, eqp = 0; /* the cut so far: bits > bp, tp of the eqp tied at bp */
        bool any = false;                  /* some top-k/top-p cut is made */
        u64 kept = 0;
        uint32_t ak_c = 0, eqk = 0;
        u64 ak_m = 0;
        if (topk) {
            const uint32_t bk = radix_select(wb, V, true, p.top_k, 0.0, &ak_c, &ak_m, &eqk, sm);
            const uint32_t ties = p.top_k - ak_c;
            kept = ak_m + (u64)ties * q_of(bk);
            bp = bk, tp = ties, eqp = eqk, any = true;
        } else if (topp) { /* the whole row's mass */
            u64 m = sm->h1mass[threadIdx.x];
            uint32_t c = 0, tc;
            block_scan(&c, &m, &tc, &kept, sm);
        }
        if (topp) {
            const double goal = (double)p.top_p * (double)kept;
            if (topk && !((double)ak_m >= goal)) { /* the cut stays among the top-k's ties */
                tp = dj__sample_ties_for(ak_m, q_of(bp), tp, goal);
            } else {
                uint32_t ac, eq;
                u64 am;
                bp = radix_select(wb, V, false, 0, goal, &ac, &am, &eq, sm);
                tp = dj__sample_ties_for(am, q_of(bp), eq, goal);
                eqp = eq;
            }
            any = true;
        }
        if (any) ks = kept_set{false, tp == eqp ? 1 : 2, bp, 0u};
        if (p.min_p > 0.0f) {
            const uint32_t bm = __float_as_uint(p.min_p); /* w >= min_p <=> bits >= bm */
            if (!any || bm > bp) ks = kept_set{false, 0, bm - 1, 0u};
        }
        if (ks.tie == 2) { /* the tp-th id tied at bc */
            const uint32_t bc = ks.bc, nth = tp;
            ks.last = first_over(
                wb, V, [bc](uint32_t b, uint32_t) { return (u64)(b == bc); }, [nth](u64) { return (u64)(nth - 1); },
                sm);
        }
    }
    const double u = p.u;
    const uint32_t id = first_over(
        wb, V, [ks](uint32_t b, uint32_t i) { return ks.has(b, i) ? q_of(b) : (u64)0; },
        [u](u64 total) { return (u64)dj__sample_target(u, total); }, sm);
    if (threadIdx.x == 0) out[r] = (int32_t)(id < V ? id : 0u);
}

dj_status dj__cuda_sample(dj_cuda_backend *cb, const float *logits, uint32_t n, uint32_t vocab,
                          const dj_sample_row *rows, int32_t *out) {
    size_t n_pen = 0;
    for (uint32_t r = 0; r < n; r++) n_pen += rows[r].n_pen;
    sample_row_dev *hr = (sample_row_dev *)calloc(n, sizeof *hr);
    dj_sampler_penalty *hp = (dj_sampler_penalty *)malloc((n_pen ? n_pen : 1) * sizeof *hp);
    if (!hr || !hp) {
        free(hr);
        free(hp);
        return dj_fail(DJ_ENOMEM, "cuda sample: out of host memory for %u rows", n);
    }
    size_t off = 0;
    for (uint32_t r = 0; r < n; r++) {
        hr[r] = sample_row_dev{rows[r].temperature, rows[r].top_k,    rows[r].top_p, rows[r].min_p,
                               rows[r].repetition_penalty, (uint32_t)off, rows[r].n_pen, 0u, rows[r].u};
        if (rows[r].n_pen) memcpy(hp + off, rows[r].pen, rows[r].n_pen * sizeof *hp);
        off += rows[r].n_pen;
    }
    const void *rows_dev = NULL, *pens_dev = NULL;
    float *scratch = NULL;
    dj_status st = dj__cuda_stage(cb, hr, n * sizeof *hr, &rows_dev);
    if (st == DJ_OK) st = dj__cuda_stage(cb, hp, (n_pen ? n_pen : 1) * sizeof *hp, &pens_dev);
    free(hr);
    free(hp);
    if (st == DJ_OK) st = dj__cuda_scratch(cb, (size_t)n * vocab, &scratch);
    if (st != DJ_OK) return st;
    const size_t smem = sizeof(sample_smem);
    DJ_CU(cb, cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    sample_kernel<<<n, SAMPLE_THREADS, smem, cb->stream>>>(logits, vocab, (const sample_row_dev *)rows_dev,
                                                           (const dj_sampler_penalty *)pens_dev, (uint32_t *)scratch,
                                                           out);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
