/* cuda_sample.cu: temperature / top-k / top-p sampling of f32 logit rows on
 * the device, so that only the picked ids cross PCIe. The caller's seeded
 * host generator supplies one uniform u in [0, 1) per row (the session's
 * sampler draws it exactly as a host-side pick would), and the kernel makes
 * the same choice as dj_sampler_sample's definition, with every weight
 * w = exp((logit - max) / T) in f32 and every mass summed in f64:
 *  - no truncation (top_k 0, top_p 1): the first id, in id order, whose
 *    cumulative weight exceeds u * sum(w);
 *  - otherwise the candidates in descending weight, ties by ascending id;
 *    keep the first top_k, then the shortest prefix whose mass reaches
 *    top_p of the kept mass, and pick the first candidate whose cumulative
 *    weight exceeds u * (mass of the prefix).
 * No sort: one block per row finds each cut by bisection over the bits of w
 * (non-negative floats order as their bit patterns), and weights tied at a
 * cut share one value, so the mass of the first j of them is j * w. Only the
 * final pick among tied weights walks the row in id order. Greedy rows
 * (temperature 0) take the argmax. Rows whose logits are all -inf or NaN
 * give id 0. */
#include <math.h>

#include "backend/cuda/cuda_impl.h"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define ONE_BITS 0x3f800000u /* bits of 1.0f: the largest weight (the max's) */

struct sample_smem {
    double d[SAMPLE_WARPS];
    float f[SAMPLE_WARPS];
    uint32_t u[SAMPLE_WARPS];
    double d_out;
    float f_out;
    uint32_t u_out;
    int found;
};

static __device__ double block_sum_d(double v, sample_smem *sm) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); /* the previous reduction's readers are done */
    if (lane == 0) sm->d[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < SAMPLE_WARPS; w++) t += sm->d[w];
        sm->d_out = t;
    }
    __syncthreads();
    return sm->d_out;
}

static __device__ uint32_t block_sum_u(uint32_t v, sample_smem *sm) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sm->u[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t t = 0;
        for (int w = 0; w < SAMPLE_WARPS; w++) t += sm->u[w];
        sm->u_out = t;
    }
    __syncthreads();
    return sm->u_out;
}

static __device__ float block_max_f(float v, sample_smem *sm) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sm->f[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = -INFINITY;
        for (int w = 0; w < SAMPLE_WARPS; w++) t = fmaxf(t, sm->f[w]);
        sm->f_out = t;
    }
    __syncthreads();
    return sm->f_out;
}

/* Mass (sum of w) and count of the weights whose bits are >= b. */
static __device__ double mass_ge(const uint32_t *wb, uint32_t V, uint32_t b, sample_smem *sm) {
    double s = 0.0;
    for (uint32_t i = threadIdx.x; i < V; i += SAMPLE_THREADS)
        if (wb[i] >= b) s += (double)__uint_as_float(wb[i]);
    return block_sum_d(s, sm);
}

static __device__ uint32_t count_ge(const uint32_t *wb, uint32_t V, uint32_t b, sample_smem *sm) {
    uint32_t c = 0;
    for (uint32_t i = threadIdx.x; i < V; i += SAMPLE_THREADS) c += wb[i] >= b;
    return block_sum_u(c, sm);
}

static __device__ uint32_t block_min_u(uint32_t v, sample_smem *sm) {
    v = __reduce_min_sync(0xffffffffu, v);
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0)
        sm->u[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t t = UINT32_MAX;
        for (int w = 0; w < SAMPLE_WARPS; w++)
            t = min(t, sm->u[w]);
        sm->u_out = t;
    }
    __syncthreads();
    return sm->u_out;
}

/* The k-th (0-based) id, in id order, whose weight bits equal b; V if none. */
static __device__ uint32_t nth_equal(const uint32_t *wb, uint32_t V, uint32_t b, uint32_t k, sample_smem *sm) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t before = 0; /* equal weights in earlier tiles */
    __syncthreads();     /* every thread has read the last reduction's result */
    if (threadIdx.x == 0) {
        sm->found = 0;
        sm->u_out = V;
    }
    __syncthreads();
    for (uint32_t t0 = 0; t0 < V; t0 += SAMPLE_THREADS) {
        const uint32_t i = t0 + threadIdx.x;
        const bool eq = i < V && wb[i] == b;
        const uint32_t ballot = __ballot_sync(0xffffffffu, eq);
        __syncthreads(); /* sm->u of the last tile is read */
        if (lane == 0) sm->u[warp] = __popc(ballot);
        __syncthreads();
        uint32_t rank = before + __popc(ballot & ((1u << lane) - 1u)), tile = 0;
        for (uint32_t w = 0; w < SAMPLE_WARPS; w++) {
            if (w < warp) rank += sm->u[w];
            tile += sm->u[w];
        }
        if (eq && rank == k) {
            sm->u_out = i;
            sm->found = 1;
        }
        __syncthreads();
        if (sm->found) break;
        before += tile;
    }
    return sm->u_out;
}

/* The first id, in id order, whose cumulative weight exceeds target (ids of
 * weight 0 never chosen); the last id of positive weight when rounding
 * leaves target unreached. The row is walked in tiles of SAMPLE_THREADS ids;
 * the tile that takes the running sum past target is scanned. */
static __device__ uint32_t first_over(const uint32_t *wb, uint32_t V, double target, sample_smem *sm) {
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    double before = 0.0; /* weight of the earlier tiles, the same in every thread */
    uint32_t last = 0;   /* 1 + the last id of positive weight so far (0: none) */
    for (uint32_t t0 = 0; t0 < V; t0 += SAMPLE_THREADS) {
        const uint32_t i = t0 + threadIdx.x;
        const double w = i < V ? (double)__uint_as_float(wb[i]) : 0.0;
        double incl = w; /* inclusive scan in the warp */
        for (int o = 1; o < 32; o <<= 1) {
            const double n = __shfl_up_sync(0xffffffffu, incl, o);
            if ((int)lane >= o) incl += n;
        }
        __syncthreads(); /* the last tile's sm->d is read */
        if (lane == 31) sm->d[warp] = incl;
        __syncthreads();
        double tile = 0.0;
        for (uint32_t ww = 0; ww < SAMPLE_WARPS; ww++) {
            if (ww < warp) incl += sm->d[ww];
            tile += sm->d[ww];
        }
        const uint32_t last_here = V - block_min_u(w > 0.0 ? V - (i + 1) : V, sm); /* 1 + last positive id, or 0 */
        if (before + tile > target) { /* block-uniform: the crossing is in this tile */
            const uint32_t id = block_min_u(w > 0.0 && before + incl > target ? i : UINT32_MAX, sm);
            return id != UINT32_MAX ? id : last_here - 1; /* the tile holds positive weight */
        }
        if (last_here)
            last = last_here;
        before += tile;
    }
    return last ? last - 1 : 0u;
}

/* The largest b in [lo, hi] with pred(b), given pred(lo) (pred falls as b rises). */
template <typename Pred>
static __device__ uint32_t bisect_last_true(uint32_t lo, uint32_t hi, Pred pred) {
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        if (pred(mid))
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(const float *logits, uint32_t V, const dj_sample_row *rows, uint32_t *wbits, int32_t *out) {
    __shared__ sample_smem sm;
    const uint32_t r = blockIdx.x;
    const float *l = logits + (size_t)r * V;
    uint32_t *wb = wbits + (size_t)r * V;
    const dj_sample_row p = rows[r];

    float mx = -INFINITY;
    for (uint32_t i = threadIdx.x; i < V; i += SAMPLE_THREADS) mx = l[i] > mx ? l[i] : mx; /* NaN never wins */
    mx = block_max_f(mx, &sm);
    if (!(mx > -INFINITY)) { /* nothing to choose from */
        if (threadIdx.x == 0) out[r] = 0;
        return;
    }
    if (p.temperature == 0.0f) { /* greedy: the lowest id holding the max */
        uint32_t best = V;
        for (uint32_t i = threadIdx.x; i < V; i += SAMPLE_THREADS)
            if (l[i] == mx && i < best) best = i;
        for (int o = 16; o > 0; o >>= 1) best = min(best, __shfl_xor_sync(0xffffffffu, best, o));
        __syncthreads();
        if ((threadIdx.x & 31) == 0) sm.u[threadIdx.x >> 5] = best;
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t b = V;
            for (int w = 0; w < SAMPLE_WARPS; w++) b = min(b, sm.u[w]);
            out[r] = (int32_t)b;
        }
        return;
    }
    for (uint32_t i = threadIdx.x; i < V; i += SAMPLE_THREADS) {
        const float w = expf((l[i] - mx) / p.temperature); /* NaN logits: weight 0 */
        wb[i] = __float_as_uint(w == w ? w : 0.0f);
    }
    __syncthreads(); /* the block's own global writes are visible to it from here */
    const double total = mass_ge(wb, V, 0u, &sm);

    if (p.top_k == 0 && !(p.top_p < 1.0f)) { /* no truncation: id order */
        const uint32_t id = first_over(wb, V, p.u * total, &sm);
        if (threadIdx.x == 0) out[r] = (int32_t)id;
        return;
    }

    /* top-k: bits bk of the k-th largest weight; `need_k` of the weights tied
     * at bk (the lowest ids) are kept. */
    uint32_t bk = 0, need_k = V;
    if (p.top_k > 0 && p.top_k < V) {
        const uint32_t k = p.top_k;
        bk = bisect_last_true(0u, ONE_BITS, [&](uint32_t b) { return count_ge(wb, V, b, &sm) >= k; });
        need_k = k - count_ge(wb, V, bk + 1, &sm);
    }
    const uint32_t eq_k = count_ge(wb, V, bk, &sm) - count_ge(wb, V, bk + 1, &sm);
    const uint32_t ties_k = need_k < eq_k ? need_k : eq_k;
    const float wk = __uint_as_float(bk);
    /* mass of the kept weights with bits >= b (b >= bk) */
    auto kept_ge = [&](uint32_t b) {
        return b > bk ? mass_ge(wb, V, b, &sm) : mass_ge(wb, V, bk + 1, &sm) + (double)ties_k * (double)wk;
    };
    const double kept = kept_ge(bk);

    /* top-p: the shortest prefix reaching top_p of the kept mass - all
     * weights above bp and `ties_p` of those tied at bp. */
    uint32_t bp = bk, ties_p = ties_k;
    double prefix = kept;
    if (p.top_p < 1.0f) {
        const double goal = (double)p.top_p * kept;
        bp = bisect_last_true(bk, ONE_BITS, [&](uint32_t b) { return kept_ge(b) >= goal; });
        const double above_p = kept_ge(bp + 1); /* no weight exceeds 1.0f: 0 for bp = ONE_BITS */
        const uint32_t avail = bp == bk ? ties_k : count_ge(wb, V, bp, &sm) - count_ge(wb, V, bp + 1, &sm);
        const double wp = (double)__uint_as_float(bp);
        double need = wp > 0.0 ? ceil((goal - above_p) / wp) : (double)avail;
        if (need < 1.0) need = 1.0;
        ties_p = need > (double)avail ? avail : (uint32_t)need;
        prefix = above_p + (double)ties_p * wp;
    }

    /* the draw, in descending weight */
    const double target = p.u * prefix;
    auto prefix_ge = [&](uint32_t b) { /* b >= bp */
        return b > bp ? mass_ge(wb, V, b, &sm)
                      : mass_ge(wb, V, bp + 1, &sm) + (double)ties_p * (double)__uint_as_float(bp);
    };
    const uint32_t bs = bisect_last_true(bp, ONE_BITS, [&](uint32_t b) { return prefix_ge(b) > target; });
    const double before = mass_ge(wb, V, bs + 1, &sm);
    const uint32_t tied = bs == bp ? ties_p : count_ge(wb, V, bs, &sm) - count_ge(wb, V, bs + 1, &sm);
    const double ws = (double)__uint_as_float(bs);
    double j = ws > 0.0 ? floor((target - before) / ws) : 0.0;
    if (j < 0.0) j = 0.0;
    const uint32_t t = j >= (double)tied ? (tied ? tied - 1 : 0u) : (uint32_t)j;
    const uint32_t id = nth_equal(wb, V, bs, t, &sm);
    if (threadIdx.x == 0) out[r] = (int32_t)(id < V ? id : 0u);
}

dj_status dj__cuda_sample(dj_cuda_backend *cb, const float *logits, uint32_t n, uint32_t vocab,
                          const dj_sample_row *rows_dev, int32_t *out) {
    float *scratch = NULL;
    dj_status st = dj__cuda_scratch(cb, (size_t)n * vocab, &scratch);
    if (st != DJ_OK) return st;
    sample_kernel<<<n, SAMPLE_THREADS, 0, cb->stream>>>(logits, vocab, rows_dev, (uint32_t *)scratch, out);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
