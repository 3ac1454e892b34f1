/* cuda_sample.cu: the sample hook on the device - penalties, temperature,
 * top-k, top-p, min-p and the draw of dj_pick's rule (pick.h), so
 * that only the picked ids cross PCIe. The caller's seeded host generator
 * supplies one uniform u in [0, 1) per row, and the kernels pick the same id
 * as the host: the weight and mass arithmetic is shared (sample/sample_rule.h)
 * and every mass is an exact 64-bit integer, so no sum depends on its order.
 *
 * Each row is split over B blocks of 1024 threads (B ~ 264 / rows, at most
 * 32, so one row and 32 rows both fill the SMs), one launch per stage, no
 * sort and no host sync: (1) penalties and per-block maxima; (2) the weights'
 * bits (which order as the weights do) into scratch, and the level-1 radix
 * histogram (bits >> 20) of count and mass, per block in shared memory, then
 * added into the row's global histogram; (3-6) each cut (the k-th weight for
 * top-k, then the weight where the mass reaches top-p) is a radix select in
 * 10-bit levels: every block redoes the select on the last merged histogram
 * (identical in every block) and adds its chunk to the next level's; min-p is
 * a threshold on the bits. The kept set is {bits > bc} plus the first tp ids
 * (in id order) whose bits equal bc, all of the same mass. (7) per block, the
 * mass of {bits > bc} and the count at bc; (8) a scan over those block sums
 * finds the block where the cumulative kept mass crosses the target, and
 * that block walks its chunk in id order.
 *
 * A row with a small top-k (SMALL_K or fewer, with a cut) stops after the
 * top-k select: stage 7 instead gathers the kept candidates - every id with
 * bits > bk (fewer than top_k, appended to a row list) and, per block, its
 * first tk ties at bk in id order (over its own chunk of the weight bits,
 * which nothing reads after) - and in stage 8 one block per row loads the
 * at most top_k candidates, sorts them in candidate order (weight down, id
 * up), cuts top-p and min-p on that order as the host does, sorts the kept
 * ones by id and draws. 6 launches instead of 8. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_impl.h"
#include "sample/sample_rule.h"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define BINS 1024 /* one radix level: 10 bits */
#define SMALL_K 1024 /* top_k up to this: the compact path (at most one candidate a thread) */

typedef unsigned long long u64;

struct sample_smem {
    uint32_t hcnt[BINS]; /* a block's histogram, or a merged one loaded to select on */
    u64 hmass[BINS];
    uint32_t wcnt[SAMPLE_WARPS];
    u64 wsum[SAMPLE_WARPS];
    float wmax[SAMPLE_WARPS];
    uint32_t wmin[SAMPLE_WARPS];
    float b_max;
    uint32_t b_min;
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

/* A radix select after one or two levels: the prefix of the selected bits
 * so far, and the count and mass of everything above it. */
struct sel_state {
    uint32_t h, above_c;
    u64 above_m;
};

enum { ROW_SAMPLE = 0, ROW_EMPTY = 1, ROW_GREEDY = 2 };

/* One row's control block in scratch, zeroed by the first stage. Select a is
 * top-k (or top-p without top-k), select b is top-p after top-k. */
struct row_ctl {
    sel_state a[2], b[2]; /* after level 1, after level 2 */
    double goal_a, goal_b;
    uint32_t kind;  /* ROW_*, set by the weights stage */
    uint32_t nbest; /* greedy: ~(lowest id holding the max); 0 = none */
    uint32_t need_b, bc, tp;
    uint32_t n_gt; /* small top-k: ids with bits > bc appended to the row list so far */
};

/* One block's partial results: its maximum (stage 1), the mass of its ids
 * with bits > bc and how many have bits == bc (stage 7). Not zeroed. */
struct block_part {
    u64 m;
    uint32_t ties;
    float mx;
};

#define CTL_WORDS 16   /* u64 words of a row_ctl */
#define HIST_WORDS 1536 /* u64 words of a global histogram: 1024 masses, 1024 u32 counts */
#define N_HIST 5        /* level 1; levels 2, 3 of select a; levels 2, 3 of select b */
#define MAX_SPLIT 64    /* blocks per row, at most */
static_assert(sizeof(row_ctl) <= CTL_WORDS * 8, "row_ctl outgrew its slot");
static_assert(sizeof(block_part) == 16, "block_part is two words");

/* Scratch, per row: [ctl | 5 histograms | B parts] in u64 words (hdr of
 * them), all rows' headers first, then the rows' weight bits (V u32 each). */
struct sample_args {
    const float *logits; /* (n, V) */
    uint32_t V, B, chunk, hdr;
    const sample_row_dev *rows;     /* [n] */
    const dj_sampler_penalty *pens; /* the rows' penalty lists, end to end */
    u64 *head;                      /* [n * hdr] */
    uint32_t *wbits;                /* (n, V) */
    int32_t *out;                   /* [n] */
};

static __device__ row_ctl *ctl_of(const sample_args &a, uint32_t r) { return (row_ctl *)(a.head + (size_t)r * a.hdr); }
static __device__ u64 *hmass_of(const sample_args &a, uint32_t r, int h) {
    return a.head + (size_t)r * a.hdr + CTL_WORDS + (size_t)h * HIST_WORDS;
}
static __device__ uint32_t *hcnt_of(const sample_args &a, uint32_t r, int h) {
    return (uint32_t *)(hmass_of(a, r, h) + BINS);
}
static __device__ block_part *parts_of(const sample_args &a, uint32_t r) {
    return (block_part *)(a.head + (size_t)r * a.hdr + CTL_WORDS + N_HIST * HIST_WORDS);
}

/* This block's ids [lo, hi) of its row (empty when the split exceeds V). */
static __device__ void chunk_of(const sample_args &a, uint32_t *lo, uint32_t *hi) {
    const size_t l = (size_t)blockIdx.x * a.chunk, h = l + a.chunk;
    *lo = l < a.V ? (uint32_t)l : a.V;
    *hi = h < a.V ? (uint32_t)h : a.V;
}

static __device__ bool row_cuts(const sample_row_dev &p, uint32_t V, bool *topk, bool *topp) {
    *topk = p.top_k > 0 && p.top_k < V;
    *topp = p.top_p < 1.0f;
    return *topk || *topp || p.min_p > 0.0f;
}

/* The compact path: a top-k cut of at most SMALL_K ids (sampling rows only). */
static __host__ __device__ bool row_small(uint32_t top_k, float temperature, uint32_t V) {
    return temperature != 0.0f && top_k > 0 && top_k < V && top_k <= SMALL_K;
}

/* The row list of the compact path: (bits << 32 | ~id) of the ids above the
 * cut, in the (unused) histogram 3 of the row. */
static __device__ u64 *list_of(const sample_args &a, uint32_t r) { return hmass_of(a, r, 3); }
static_assert(SMALL_K <= HIST_WORDS, "the row list outgrew histogram 3");

static __device__ void hist_zero(sample_smem *sm) {
    __syncthreads(); /* earlier readers of hcnt/hmass are done */
    for (uint32_t i = threadIdx.x; i < BINS; i += SAMPLE_THREADS) sm->hcnt[i] = 0, sm->hmass[i] = 0;
    __syncthreads();
}

/* The block's histogram into the row's global one h: one atomic pair per
 * non-empty bin. */
static __device__ void hist_flush(const sample_args &a, uint32_t r, int h, sample_smem *sm) {
    __syncthreads();
    uint32_t *gc = hcnt_of(a, r, h);
    u64 *gm = hmass_of(a, r, h);
    for (uint32_t i = threadIdx.x; i < BINS; i += SAMPLE_THREADS)
        if (sm->hcnt[i]) {
            atomicAdd(&gc[i], sm->hcnt[i]);
            if (sm->hmass[i]) atomicAdd(&gm[i], sm->hmass[i]);
        }
}

/* The row's merged histogram h into shared memory (to select on). */
static __device__ void hist_load(const sample_args &a, uint32_t r, int h, sample_smem *sm) {
    __syncthreads();
    const uint32_t *gc = hcnt_of(a, r, h);
    const u64 *gm = hmass_of(a, r, h);
    for (uint32_t i = threadIdx.x; i < BINS; i += SAMPLE_THREADS) sm->hcnt[i] = gc[i], sm->hmass[i] = gm[i];
    __syncthreads();
}

/* Stage 1: penalised logits (into the row's weight bits, when it has
 * penalties) and this block's maximum; zeroes its share of the row header. */
static __global__ void __launch_bounds__(SAMPLE_THREADS) sample_max_kernel(sample_args a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    sample_smem *sm = (sample_smem *)smem_raw;
    const uint32_t r = blockIdx.y;
    const uint32_t zw = CTL_WORDS + N_HIST * HIST_WORDS, zlo = blockIdx.x * zw / a.B, zhi = (blockIdx.x + 1) * zw / a.B;
    u64 *hd = a.head + (size_t)r * a.hdr;
    for (uint32_t i = zlo + threadIdx.x; i < zhi; i += SAMPLE_THREADS) hd[i] = 0;
    uint32_t lo, hi;
    chunk_of(a, &lo, &hi);
    const sample_row_dev p = a.rows[r];
    const float *src = a.logits + (size_t)r * a.V;
    uint32_t *wb = a.wbits + (size_t)r * a.V;
    if (p.n_pen) {
        for (uint32_t i = lo + threadIdx.x; i < hi; i += SAMPLE_THREADS) wb[i] = __float_as_uint(src[i]);
        __syncthreads();
        for (uint32_t k = threadIdx.x; k < p.n_pen; k += SAMPLE_THREADS) {
            const dj_sampler_penalty e = a.pens[p.pen_off + k];
            if ((uint32_t)e.id >= lo && (uint32_t)e.id < hi) /* the launcher checked 0 <= id < V */
                wb[e.id] = __float_as_uint(dj__sample_penalize(__uint_as_float(wb[e.id]), p.rep, e.sub));
        }
        __syncthreads();
        src = (const float *)wb;
    }
    float mx = -INFINITY;
    for (uint32_t i = lo + threadIdx.x; i < hi; i += SAMPLE_THREADS) mx = src[i] > mx ? src[i] : mx; /* NaN never wins */
    mx = block_max(mx, sm);
    if (threadIdx.x == 0) parts_of(a, r)[blockIdx.x].mx = mx;
}

/* Stage 2: the row's max from the block maxima; greedy rows take the lowest
 * id holding it, the others write their weights' bits and the level-1
 * histogram (bits >> 20) when the row has a cut. */
static __global__ void __launch_bounds__(SAMPLE_THREADS) sample_weights_kernel(sample_args a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    sample_smem *sm = (sample_smem *)smem_raw;
    const uint32_t r = blockIdx.y;
    const block_part *parts = parts_of(a, r);
    const float mx = block_max(threadIdx.x < a.B ? parts[threadIdx.x].mx : -INFINITY, sm);
    const sample_row_dev p = a.rows[r];
    row_ctl *ctl = ctl_of(a, r);
    const uint32_t kind = !(mx > -INFINITY) ? ROW_EMPTY : p.temperature == 0.0f ? ROW_GREEDY : ROW_SAMPLE;
    if (blockIdx.x == 0 && threadIdx.x == 0) ctl->kind = kind;
    if (kind == ROW_EMPTY) return;
    uint32_t lo, hi;
    chunk_of(a, &lo, &hi);
    uint32_t *wb = a.wbits + (size_t)r * a.V;
    const float *src = p.n_pen ? (const float *)wb : a.logits + (size_t)r * a.V;
    if (kind == ROW_GREEDY) {
        uint32_t best = a.V;
        for (uint32_t i = lo + threadIdx.x; i < hi; i += SAMPLE_THREADS)
            if (src[i] == mx && i < best) best = i;
        best = block_min(best, sm);
        if (threadIdx.x == 0 && best < a.V) atomicMax(&ctl->nbest, ~best);
        return;
    }
    bool topk, topp;
    const bool cut = row_cuts(p, a.V, &topk, &topp);
    if (cut) hist_zero(sm);
    u64 *stage = sm->stage[threadIdx.x >> 5];
    for (uint32_t i0 = lo; i0 < hi; i0 += SAMPLE_THREADS) { /* uniform trip count: hist_add wants whole warps */
        const uint32_t i = i0 + threadIdx.x;
        uint32_t b = 0;
        if (i < hi) {
            b = __float_as_uint(dj__sample_weight(src[i], mx, p.temperature)); /* reads src[i] first */
            wb[i] = b;
        }
        if (cut) hist_add(sm->hcnt, sm->hmass, i < hi, b >> 20, q_of(b), stage);
    }
    if (cut) hist_flush(a, r, 0, sm);
}

/* The whole row's mass: the sum of the level-1 histogram (loaded in sm). */
static __device__ u64 loaded_total(sample_smem *sm) {
    uint32_t c = 0, tc;
    u64 m = sm->hmass[threadIdx.x], tm;
    block_scan(&c, &m, &tc, &tm, sm);
    return tm;
}

/* The last level of a select whose levels 1 and 2 are in s2 (histogram h3):
 * the selected bits, *above_c, *above_m (count and mass above them) and *eq
 * (how many weights have those bits). */
static __device__ uint32_t select_last(const sample_args &a, uint32_t r, int h3, const sel_state &s2, bool by_count,
                                       uint32_t k, double goal, uint32_t *above_c, u64 *above_m, uint32_t *eq,
                                       sample_smem *sm) {
    hist_load(a, r, h3, sm);
    const uint32_t h = select_bin(sm->hcnt, sm->hmass, by_count, k, goal, s2.above_c, s2.above_m, above_c, above_m, sm);
    *eq = sm->hcnt[h];
    __syncthreads(); /* hcnt is read */
    return (s2.h << 10) | h;
}

/* Stages 3-6, a radix level of select a (sel 0) or b (sel 1), level 2 or 3:
 * select on the row's last merged histogram, then add this block's ids under
 * the selected prefix to the next level's histogram. Stage 5 (select b, level
 * 2) first finishes select a (the top-k cut) and decides whether top-p needs
 * a select of its own. */
static __global__ void __launch_bounds__(SAMPLE_THREADS) sample_level_kernel(sample_args a, int sel, int level) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    sample_smem *sm = (sample_smem *)smem_raw;
    const uint32_t r = blockIdx.y;
    row_ctl *ctl = ctl_of(a, r);
    const sample_row_dev p = a.rows[r];
    bool topk, topp;
    row_cuts(p, a.V, &topk, &topp);
    if (ctl->kind != ROW_SAMPLE || !(topk || topp) ||
        (sel == 1 && (!(topk && topp) || row_small(p.top_k, p.temperature, a.V))))
        return;
    const bool lead = blockIdx.x == 0 && threadIdx.x == 0;
    const bool by_count = sel == 0 && topk;
    uint32_t ac, h;
    u64 am;
    double goal;
    if (level == 2) {
        if (sel == 0) {
            hist_load(a, r, 0, sm);
            goal = topk ? 0.0 : (double)p.top_p * (double)loaded_total(sm);
        } else {
            uint32_t akc, eqk;
            u64 akm;
            const uint32_t bk = select_last(a, r, 2, ctl->a[1], true, p.top_k, 0.0, &akc, &akm, &eqk, sm);
            const u64 kept = akm + (u64)(p.top_k - akc) * q_of(bk);
            goal = (double)p.top_p * (double)kept;
            if (!((double)akm >= goal)) return; /* the cut stays among the top-k's ties: need_b stays 0 */
            if (lead) ctl->need_b = 1, ctl->goal_b = goal;
            hist_load(a, r, 0, sm);
        }
        if (lead && sel == 0) ctl->goal_a = goal;
        h = select_bin(sm->hcnt, sm->hmass, by_count, p.top_k, goal, 0, 0, &ac, &am, sm);
    } else {
        if (sel == 1 && !ctl->need_b) return;
        goal = sel == 0 ? ctl->goal_a : ctl->goal_b;
        const sel_state s1 = sel == 0 ? ctl->a[0] : ctl->b[0];
        hist_load(a, r, sel == 0 ? 1 : 3, sm);
        h = (s1.h << 10) | select_bin(sm->hcnt, sm->hmass, by_count, p.top_k, goal, s1.above_c, s1.above_m, &ac, &am, sm);
    }
    if (lead) (sel == 0 ? ctl->a : ctl->b)[level - 2] = sel_state{h, ac, am};
    const int shift = level == 2 ? 10 : 0;
    const int hout = sel == 0 ? level - 1 : level + 1; /* a: 1, 2; b: 3, 4 */
    uint32_t lo, hi;
    chunk_of(a, &lo, &hi);
    const uint32_t *wb = a.wbits + (size_t)r * a.V;
    hist_zero(sm);
    u64 *stage = sm->stage[threadIdx.x >> 5];
    for (uint32_t i0 = lo; i0 < hi; i0 += SAMPLE_THREADS) { /* uniform trip count */
        const uint32_t i = i0 + threadIdx.x;
        const uint32_t b = i < hi ? wb[i] : 0u;
        const bool in = i < hi && (b >> (shift + 10)) == h;
        hist_add(sm->hcnt, sm->hmass, in, (b >> shift) & (BINS - 1), in ? q_of(b) : 0u, stage);
    }
    hist_flush(a, r, hout, sm);
}

/* Stage 7 of a compact row: finish the top-k select (the cut bk, and tk:
 * how many of the ties at bk are kept, the first in id order), append this
 * block's ids with bits > bk to the row list, and write its first tk ties'
 * ids (in id order) over the start of its own chunk of the weight bits; its
 * tie count goes to its block_part. */
static __device__ void sample_gather(const sample_args &a, uint32_t r, const sample_row_dev &p, row_ctl *ctl,
                                     sample_smem *sm) {
    uint32_t akc, eq;
    u64 akm;
    const uint32_t bk = select_last(a, r, 2, ctl->a[1], true, p.top_k, 0.0, &akc, &akm, &eq, sm);
    const uint32_t tk = p.top_k - akc; /* 1 <= tk <= eq */
    if (blockIdx.x == 0 && threadIdx.x == 0) ctl->bc = bk, ctl->tp = tk;
    uint32_t lo, hi;
    chunk_of(a, &lo, &hi);
    uint32_t *wb = a.wbits + (size_t)r * a.V;
    u64 *list = list_of(a, r);
    uint32_t T = 0; /* ties at bk in this chunk before i0 */
    for (uint32_t i0 = lo; i0 < hi; i0 += SAMPLE_THREADS) {
        const uint32_t i = i0 + threadIdx.x;
        const uint32_t b = i < hi ? wb[i] : 0u;
        if (i < hi && b > bk) list[atomicAdd(&ctl->n_gt, 1u)] = (u64)b << 32 | (uint32_t)~i; /* fewer than top_k */
        const bool tie = i < hi && b == bk;
        const uint32_t nt = __syncthreads_count(tie); /* also: every read of this step is done */
        if (nt && T < tk) {
            uint32_t c = tie, tc;
            u64 m = 0, tm;
            block_scan(&c, &m, &tc, &tm, sm);
            const uint32_t rank = T + c - 1;
            if (tie && rank < tk) wb[lo + rank] = i; /* lo + rank <= i: already read, and ours */
        }
        T += nt;
    }
    if (threadIdx.x == 0) parts_of(a, r)[blockIdx.x].ties = T;
}

/* Sort key[0, P) (P a power of two, at most the block) up or down: bitonic,
 * one pair a thread a step. */
static __device__ void bitonic_sort(u64 *key, uint32_t P, bool desc) {
    const uint32_t t = threadIdx.x;
    __syncthreads();
    for (uint32_t k = 2; k <= P; k <<= 1)
        for (uint32_t j = k >> 1; j > 0; j >>= 1) {
            const uint32_t o = t ^ j;
            if (t < P && o > t) {
                const u64 x = key[t], y = key[o];
                const bool up = ((t & k) == 0) != desc; /* the direction of this pair's run */
                if (up ? x > y : x < y) key[t] = y, key[o] = x;
            }
            __syncthreads();
        }
}

/* Stage 8 of a compact row, one block: the top_k candidates (the row list
 * and the first tk ties, taken from the blocks' tie lists in block order)
 * sorted in candidate order; top-p keeps the shortest prefix whose mass
 * reaches top_p of theirs, min-p drops weights below min_p; the kept ones
 * sorted by id and the draw walks them. */
static __device__ void sample_compact_draw(const sample_args &a, uint32_t r, const sample_row_dev &p,
                                           const row_ctl *ctl, sample_smem *sm) {
    const uint32_t t = threadIdx.x, ngt = ctl->n_gt, bk = ctl->bc, tk = ctl->tp;
    uint32_t M = ngt + tk; /* = top_k */
    M = M < SAMPLE_THREADS ? M : SAMPLE_THREADS;
    uint32_t P = 1;
    while (P < M) P <<= 1;
    u64 *key = sm->hmass;
    uint32_t *ties = sm->hcnt;
    if (t < a.B) ties[t] = parts_of(a, r)[t].ties;
    __syncthreads();
    u64 k = 0; /* padding sorts last, down */
    if (t < ngt) {
        k = list_of(a, r)[t];
    } else if (t < M) {
        uint32_t j = t - ngt, b = 0; /* the tie of rank j: in block b, its j-th */
        while (b + 1 < a.B && j >= ties[b]) j -= ties[b++];
        k = (u64)bk << 32 | (uint32_t)~a.wbits[(size_t)r * a.V + (size_t)b * a.chunk + j];
    }
    if (t < P) key[t] = k;
    bitonic_sort(key, P, true); /* weight down, then id up */
    k = t < M ? key[t] : 0u;
    const uint32_t wb = (uint32_t)(k >> 32), id = ~(uint32_t)k;
    uint32_t c = 0, tc;
    u64 m = t < M ? q_of(wb) : 0u, tm;
    block_scan(&c, &m, &tc, &tm, sm); /* m: the mass of candidates [0, t]; tm: of all */
    uint32_t keep = M;
    if (p.top_p < 1.0f) {
        const double goal = (double)p.top_p * (double)tm;
        const uint32_t first = block_min(t < M && (double)m >= goal ? t : SAMPLE_THREADS, sm);
        keep = first < M ? first + 1 : M;
    }
    const bool kept = t < keep && __uint_as_float(wb) >= p.min_p;
    __syncthreads(); /* every read of key is done */
    if (t < P) key[t] = kept ? (u64)id << 32 | wb : ~0ull; /* dropped ones sort last, up */
    bitonic_sort(key, P, false);
    const u64 e = t < P ? key[t] : ~0ull;
    c = 0;
    m = e != ~0ull ? q_of((uint32_t)e) : 0u;
    block_scan(&c, &m, &tc, &tm, sm);
    if (tm == 0) { /* unreachable: the max weighs 2^36 and is kept */
        if (t == 0) a.out[r] = 0;
        return;
    }
    const u64 target = dj__sample_target(p.u, tm);
    const uint32_t first = block_min(m > target ? t : SAMPLE_THREADS, sm);
    if (t == first) a.out[r] = (int32_t)(e >> 32);
}

/* Stage 7: the kept set {bits > bc} plus the first tp ids at bc (every block
 * derives it from the merged histograms, as sample_rule.h's rule says), and
 * this block's mass above bc and count at bc. */
static __global__ void __launch_bounds__(SAMPLE_THREADS) sample_sums_kernel(sample_args a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    sample_smem *sm = (sample_smem *)smem_raw;
    const uint32_t r = blockIdx.y;
    row_ctl *ctl = ctl_of(a, r);
    if (ctl->kind != ROW_SAMPLE) return;
    const sample_row_dev p = a.rows[r];
    if (row_small(p.top_k, p.temperature, a.V)) {
        sample_gather(a, r, p, ctl, sm);
        return;
    }
    bool topk, topp;
    uint32_t bc = 0, tp = 0xffffffffu; /* no cut: every id */
    if (row_cuts(p, a.V, &topk, &topp)) {
        uint32_t bp = 0, tk = 0, eqp = 0, akc = 0;
        u64 akm = 0, kept = 0;
        bool any = false;
        if (topk) {
            const uint32_t bk = select_last(a, r, 2, ctl->a[1], true, p.top_k, 0.0, &akc, &akm, &eqp, sm);
            tk = p.top_k - akc;
            kept = akm + (u64)tk * q_of(bk);
            bp = bk, any = true;
        } else if (topp) {
            hist_load(a, r, 0, sm);
            kept = loaded_total(sm);
        }
        if (topp) {
            const double goal = (double)p.top_p * (double)kept;
            if (topk && !((double)akm >= goal)) {
                tk = dj__sample_ties_for(akm, q_of(bp), tk, goal);
            } else {
                uint32_t ac, eq;
                u64 am;
                bp = topk ? select_last(a, r, 4, ctl->b[1], false, 0, goal, &ac, &am, &eq, sm)
                          : select_last(a, r, 2, ctl->a[1], false, 0, goal, &ac, &am, &eq, sm);
                tk = dj__sample_ties_for(am, q_of(bp), eq, goal);
                eqp = eq;
            }
            any = true;
        }
        if (any) bc = bp, tp = tk;
        (void)eqp;
        if (p.min_p > 0.0f) {
            const uint32_t bm = __float_as_uint(p.min_p); /* w >= min_p <=> bits >= bm */
            if (!any || bm > bp) bc = bm - 1, tp = 0;
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) ctl->bc = bc, ctl->tp = tp;
    uint32_t lo, hi;
    chunk_of(a, &lo, &hi);
    const uint32_t *wb = a.wbits + (size_t)r * a.V;
    u64 m = 0;
    uint32_t c = 0;
    for (uint32_t i = lo + threadIdx.x; i < hi; i += SAMPLE_THREADS) {
        const uint32_t b = wb[i];
        if (b > bc) m += q_of(b);
        c += b == bc;
    }
    uint32_t tc;
    u64 tm;
    block_scan(&c, &m, &tc, &tm, sm);
    if (threadIdx.x == 0) parts_of(a, r)[blockIdx.x].m = tm, parts_of(a, r)[blockIdx.x].ties = tc;
}

/* Stage 8: the draw. The kept mass up to a point in id order is (mass above
 * bc so far) + q(bc) * min(ties so far, tp); a scan over the block sums
 * finds the block where it crosses the target, and that block walks its
 * chunk 1024 ids at a time. */
static __global__ void __launch_bounds__(SAMPLE_THREADS) sample_draw_kernel(sample_args a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    sample_smem *sm = (sample_smem *)smem_raw;
    const uint32_t r = blockIdx.y;
    const row_ctl *ctl = ctl_of(a, r);
    const uint32_t kind = ctl->kind;
    if (kind != ROW_SAMPLE) {
        if (blockIdx.x == 0 && threadIdx.x == 0) a.out[r] = kind == ROW_GREEDY && ctl->nbest ? (int32_t)~ctl->nbest : 0;
        return;
    }
    if (row_small(a.rows[r].top_k, a.rows[r].temperature, a.V)) {
        if (blockIdx.x == 0) sample_compact_draw(a, r, a.rows[r], ctl, sm);
        return;
    }
    const uint32_t bc = ctl->bc, tp = ctl->tp;
    const u64 qc = q_of(bc);
    const block_part *parts = parts_of(a, r);
    const uint32_t t = threadIdx.x;
    const uint32_t c0 = t < a.B ? parts[t].ties : 0u;
    const u64 m0 = t < a.B ? parts[t].m : 0u;
    uint32_t c = c0, tc;
    u64 m = m0, tm;
    block_scan(&c, &m, &tc, &tm, sm);
    const u64 total = tm + qc * (tc < tp ? tc : tp);
    if (total == 0) { /* unreachable: the max weighs 2^36 and is kept */
        if (blockIdx.x == 0 && t == 0) a.out[r] = 0;
        return;
    }
    const u64 target = dj__sample_target(a.rows[r].u, total);
    if (t == blockIdx.x) { /* this block's start and end in kept mass */
        const uint32_t cb = c - c0;
        sm->b_sel[0] = cb;
        sm->b_mass = m - m0;
        const u64 start = (m - m0) + qc * (cb < tp ? cb : tp), end = m + qc * (c < tp ? c : tp);
        sm->b_sel[1] = start <= target && target < end;
    }
    __syncthreads();
    if (!sm->b_sel[1]) return; /* block-uniform: the target is in another block */
    uint32_t T = sm->b_sel[0];
    u64 S = sm->b_mass;
    __syncthreads();
    uint32_t lo, hi;
    chunk_of(a, &lo, &hi);
    const uint32_t *wb = a.wbits + (size_t)r * a.V;
    for (uint32_t i0 = lo; i0 < hi; i0 += SAMPLE_THREADS) {
        const uint32_t i = i0 + t;
        const uint32_t b = i < hi ? wb[i] : 0u;
        uint32_t ci = i < hi && b == bc;
        u64 mi = i < hi && b > bc ? q_of(b) : 0u;
        block_scan(&ci, &mi, &tc, &tm, sm);
        const uint32_t ties = T + ci;
        const u64 cum = S + mi + qc * (ties < tp ? ties : tp);
        const uint32_t first = block_min(i < hi && cum > target ? i : a.V, sm);
        if (first < a.V) {
            if (t == 0) a.out[r] = (int32_t)first;
            return;
        }
        T += tc, S += tm;
    }
    if (t == 0) a.out[r] = 0; /* unreachable: the block holds the crossing */
}

/* Blocks per row: about two waves of 132 SMs over all rows, at most 32 per
 * row, and none without ids - unless a test forced the split (1..MAX_SPLIT,
 * dj__cuda_set_sample_split) to cover splits small vocabularies would not get. */
static uint32_t sample_split(const dj_cuda_backend *cb, uint32_t n, uint32_t V) {
    if (cb->sample_split >= 1 && cb->sample_split <= MAX_SPLIT) return cb->sample_split;
    uint32_t B = 264 / n;
    B = B < 1 ? 1 : B > 32 ? 32 : B;
    const uint32_t by_v = (V + 1023) / 1024;
    return B < by_v ? B : by_v;
}

dj_status dj__cuda_sample(dj_cuda_backend *cb, const float *logits, uint32_t n, uint32_t vocab,
                          const dj_sample_row *rows, int32_t *out) {
    size_t n_pen = 0;
    bool any_sel = false, any_b = false;
    for (uint32_t r = 0; r < n; r++) {
        n_pen += rows[r].n_pen;
        const bool topk = rows[r].top_k > 0 && rows[r].top_k < vocab, topp = rows[r].top_p < 1.0f;
        any_sel |= rows[r].temperature != 0.0f && (topk || topp);
        any_b |= rows[r].temperature != 0.0f && topk && topp && !row_small(rows[r].top_k, rows[r].temperature, vocab);
    }
    if (n > 65535) return dj_fail(DJ_EINVAL, "cuda sample: %u rows exceed the grid's 65535", n);
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
    const uint32_t B = sample_split(cb, n, vocab);
    const uint32_t hdr = CTL_WORDS + N_HIST * HIST_WORDS + 2 * B; /* u64 words */
    if (st == DJ_OK) st = dj__cuda_scratch(cb, (size_t)n * hdr * 2 + (size_t)n * vocab, &scratch);
    if (st != DJ_OK) return st;
    sample_args a;
    a.logits = logits;
    a.V = vocab;
    a.B = B;
    a.chunk = (uint32_t)(((size_t)vocab + B - 1) / B);
    a.hdr = hdr;
    a.rows = (const sample_row_dev *)rows_dev;
    a.pens = (const dj_sampler_penalty *)pens_dev;
    a.head = (u64 *)scratch;
    a.wbits = (uint32_t *)(a.head + (size_t)n * hdr);
    a.out = out;
    const size_t smem = sizeof(sample_smem);
    const dim3 grid(B, n);
    sample_max_kernel<<<grid, SAMPLE_THREADS, smem, cb->stream>>>(a);
    DJ_CU_LAUNCHED(cb);
    sample_weights_kernel<<<grid, SAMPLE_THREADS, smem, cb->stream>>>(a);
    DJ_CU_LAUNCHED(cb);
    for (int sel = 0; sel < 2; sel++) {
        if (!(sel == 0 ? any_sel : any_b)) continue;
        for (int level = 2; level <= 3; level++) {
            sample_level_kernel<<<grid, SAMPLE_THREADS, smem, cb->stream>>>(a, sel, level);
            DJ_CU_LAUNCHED(cb);
        }
    }
    sample_sums_kernel<<<grid, SAMPLE_THREADS, smem, cb->stream>>>(a);
    DJ_CU_LAUNCHED(cb);
    sample_draw_kernel<<<grid, SAMPLE_THREADS, smem, cb->stream>>>(a);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

/* ---- the mask hook: structured output's masks and logit_bias on the device ---- */

typedef struct mask_row_dev {
    unsigned long long off; /* the row's bytes in the staged masks */
    uint32_t has;           /* 0: no mask for this row */
    uint32_t pad;
} mask_row_dev;

typedef struct bias_dev {
    uint32_t row;
    int32_t id;
    float bias;
} bias_dev;

static __global__ void mask_kernel(float *logits, uint32_t V, const uint8_t *masks, const mask_row_dev *rows) {
    const mask_row_dev m = rows[blockIdx.y];
    if (!m.has) return;
    float *row = logits + (size_t)blockIdx.y * V;
    for (uint32_t j = blockIdx.x * blockDim.x + threadIdx.x; j < V; j += gridDim.x * blockDim.x)
        if (!masks[m.off + j]) row[j] = -INFINITY;
}

/* One thread per entry: a row's ids are distinct, so no two threads add to one logit. */
static __global__ void bias_kernel(float *logits, uint32_t V, const bias_dev *b, uint32_t nb) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nb) logits[(size_t)b[i].row * V + b[i].id] += b[i].bias;
}

dj_status dj__cuda_mask(dj_cuda_backend *cb, float *logits, uint32_t n, uint32_t vocab, const dj_mask_row *rows) {
    if (n > 65535) return dj_fail(DJ_EINVAL, "cuda mask: %u rows exceed the grid's 65535", n);
    size_t n_masked = 0, nb = 0;
    for (uint32_t r = 0; r < n; r++) {
        n_masked += rows[r].allowed != NULL;
        nb += rows[r].n_bias;
    }
    if (nb > UINT32_MAX) return dj_fail(DJ_EINVAL, "cuda mask: %zu biases", nb);
    mask_row_dev *hr = (mask_row_dev *)calloc(n, sizeof *hr);
    uint8_t *hm = (uint8_t *)malloc(n_masked ? n_masked * vocab : 1);
    bias_dev *hb = (bias_dev *)malloc((nb ? nb : 1) * sizeof *hb);
    if (!hr || !hm || !hb) {
        free(hr);
        free(hm);
        free(hb);
        return dj_fail(DJ_ENOMEM, "cuda mask: out of host memory for %u rows", n);
    }
    size_t mo = 0, bo = 0;
    for (uint32_t r = 0; r < n; r++) {
        if (rows[r].allowed) {
            hr[r] = mask_row_dev{(unsigned long long)mo, 1u, 0u};
            memcpy(hm + mo, rows[r].allowed, vocab);
            mo += vocab;
        }
        for (uint32_t k = 0; k < rows[r].n_bias; k++) hb[bo++] = bias_dev{r, rows[r].bias[k].id, rows[r].bias[k].bias};
    }
    const void *rows_dev = NULL, *masks_dev = NULL, *bias_dev_p = NULL;
    dj_status st = n_masked ? dj__cuda_stage(cb, hr, n * sizeof *hr, &rows_dev) : DJ_OK;
    if (st == DJ_OK && n_masked) st = dj__cuda_stage(cb, hm, n_masked * vocab, &masks_dev);
    if (st == DJ_OK && nb) st = dj__cuda_stage(cb, hb, nb * sizeof *hb, &bias_dev_p);
    free(hr);
    free(hm);
    free(hb);
    if (st != DJ_OK) return st;
    if (n_masked) {
        const uint32_t per = 256, bx = (vocab + per - 1) / per < 64 ? (vocab + per - 1) / per : 64;
        mask_kernel<<<dim3(bx, n), per, 0, cb->stream>>>(logits, vocab, (const uint8_t *)masks_dev,
                                                         (const mask_row_dev *)rows_dev);
        DJ_CU_LAUNCHED(cb);
    }
    if (nb) {
        bias_kernel<<<(unsigned)((nb + 255) / 256), 256, 0, cb->stream>>>(logits, vocab, (const bias_dev *)bias_dev_p,
                                                                         (uint32_t)nb);
        DJ_CU_LAUNCHED(cb);
    }
    return DJ_OK;
}
