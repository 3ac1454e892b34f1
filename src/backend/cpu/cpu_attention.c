/* cpu_attention.c: causal (optionally sliding-window, optionally soft-capped)
 * GQA attention over K/V in data-segment pages, with a streaming softmax: no
 * context-length scratch. */
#include <math.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_impl.h"

/* Key positions scored at once, within one page. */
#define SCORE_BLOCK 64

/* acc[i] += v[i] * b */
static inline void axpy(float *acc, const float *v, float b, uint32_t len) {
    uint32_t i = 0;
#ifdef __AVX2__
    const __m256 vb = _mm256_set1_ps(b);
    for (; i + 8 <= len; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(_mm256_loadu_ps(v + i), vb, _mm256_loadu_ps(acc + i)));
#endif
    for (; i < len; i++) acc[i] += v[i] * b;
}

/* One query row q[hd] against key positions [t0, t1] of kv head `kvh`, pages
 * found through `table` (kv's own or the row's); the output row o[hd] doubles
 * as the accumulator. */
static void attend_one(const dj_kv_view *kv, const uint32_t *table, const float *q, float *o, uint32_t kvh,
                       uint32_t hd, uint32_t t0, uint32_t t1, float scale, float softcap) {
    const uint32_t tpp = kv->tokens_per_page, kvd = kv->kv_dim;
    float run_max = -INFINITY, run_sum = 0.0f;
    float s[SCORE_BLOCK];
    for (uint32_t i = 0; i < hd; i++) o[i] = 0.0f;
    for (uint32_t t = t0; t <= t1;) {
        const uint32_t row = t % tpp;
        uint32_t len = tpp - row;
        if (len > t1 - t + 1) len = t1 - t + 1;
        if (len > SCORE_BLOCK) len = SCORE_BLOCK;
        const float *page = (const float *)(const void *)(kv->seg_base +
                                                          (size_t)table[t / tpp] * kv->page_bytes);
        const float *kb = page + (size_t)row * kvd + (size_t)kvh * hd;
        const float *vb = page + ((size_t)tpp + row) * kvd + (size_t)kvh * hd;
        float bmax = -INFINITY;
        for (uint32_t j = 0; j < len; j++) {
            s[j] = dj__cpu_dot(q, kb + (size_t)j * kvd, hd) * scale;
            if (softcap != 0.0f) s[j] = tanhf(s[j] / softcap) * softcap; /* Gemma 2 */
            if (s[j] > bmax) bmax = s[j];
        }
        if (bmax > run_max) {
            const float corr = run_max == -INFINITY ? 0.0f : expf(run_max - bmax);
            run_sum *= corr;
            for (uint32_t i = 0; i < hd; i++) o[i] *= corr;
            run_max = bmax;
        }
        for (uint32_t j = 0; j < len; j++) {
            const float e = expf(s[j] - run_max);
            run_sum += e;
            axpy(o, vb + (size_t)j * kvd, e, hd);
        }
        t += len;
    }
    const float inv = 1.0f / run_sum;
    for (uint32_t i = 0; i < hd; i++) o[i] *= inv;
}

/* One (row, head) pair a task. */
static void attend_task(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const dj_op_call *c = ctx;
    const uint32_t nh = c->n_heads, hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    for (size_t task = lo; task < hi; task++) {
        const uint32_t i = (uint32_t)(task / nh), h = (uint32_t)(task % nh);
        const uint32_t p = c->row_pos ? c->row_pos[i] : c->pos0 + i;
        const uint32_t *table = c->row_tables ? c->row_tables[i] : c->kv->block_table;
        const uint32_t t0 = c->window && p + 1 > c->window ? p + 1 - c->window : 0;
        const size_t off = ((size_t)i * nh + h) * hd;
        attend_one(c->kv, table, (const float *)c->x + off, (float *)c->out + off, h / group, hd, t0, p, c->scale,
                   c->softcap);
    }
}

dj_status dj__cpu_attention(dj_cpu_backend *cb, const dj_op_call *c) {
    /* a short context is not worth a hand-over: key positions per task at least 256 */
    const uint32_t ctx_len = c->row_pos ? 256 : c->pos0 + c->n;
    const size_t grain = ctx_len >= 256 ? 1 : 256 / (ctx_len ? ctx_len : 1);
    dj__cpu_pool_for(cb->pool, (size_t)c->n * c->n_heads, grain, attend_task, (void *)c);
    return DJ_OK;
}
