/* cpu_attention.c: causal (optionally sliding-window, optionally soft-capped)
 * GQA attention over f32 or f8 K/V in data-segment pages, with a streaming
 * softmax: no context-length scratch. */
#include <math.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_impl.h"

/* Key positions scored at once, within one page. */
#define SCORE_BLOCK 64

/* d[j] = dj__cpu_dot(q, k + j * ldk, hd) for j < n: for hd a multiple of 16,
 * four keys at a time with q's loads shared and the four horizontal sums done
 * side by side - each of dj__cpu_dot's adds on the same operands, so the
 * same bits. */
static void dot_keys(const float *q, const float *k, size_t ldk, uint32_t n, uint32_t hd, float *d) {
    uint32_t j = 0;
#ifdef __AVX2__
    if (hd % 16 == 0)
        for (; j + 4 <= n; j += 4) {
            const float *k0 = k + (size_t)j * ldk;
            __m256 a0[4], a1[4];
            for (int u = 0; u < 4; u++) a0[u] = a1[u] = _mm256_setzero_ps();
            for (uint32_t i = 0; i < hd; i += 16) {
                const __m256 qa = _mm256_loadu_ps(q + i), qb = _mm256_loadu_ps(q + i + 8);
                for (int u = 0; u < 4; u++) {
                    a0[u] = _mm256_fmadd_ps(qa, _mm256_loadu_ps(k0 + (size_t)u * ldk + i), a0[u]);
                    a1[u] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(k0 + (size_t)u * ldk + i + 8), a1[u]);
                }
            }
            for (int u = 0; u < 4; u++) a0[u] = _mm256_add_ps(a0[u], a1[u]);
            /* lanes l + (l+4): [key 0 | key 1], [key 2 | key 3] */
            const __m256 h01 = _mm256_add_ps(_mm256_permute2f128_ps(a0[0], a0[1], 0x20),
                                             _mm256_permute2f128_ps(a0[0], a0[1], 0x31));
            const __m256 h23 = _mm256_add_ps(_mm256_permute2f128_ps(a0[2], a0[3], 0x20),
                                             _mm256_permute2f128_ps(a0[2], a0[3], 0x31));
            /* + (l+2): [k0 0,1, k2 0,1 | k1 0,1, k3 0,1] */
            const __m256 z = _mm256_add_ps(_mm256_shuffle_ps(h01, h23, _MM_SHUFFLE(1, 0, 1, 0)),
                                           _mm256_shuffle_ps(h01, h23, _MM_SHUFFLE(3, 2, 3, 2)));
            /* u0 + u1 in lanes 0 (key 0), 2 (key 2), 4 (key 1), 6 (key 3) */
            const __m256 v = _mm256_add_ps(z, _mm256_shuffle_ps(z, z, _MM_SHUFFLE(2, 3, 0, 1)));
            float r[8];
            _mm256_storeu_ps(r, v);
            d[j] = r[0];
            d[j + 1] = r[4];
            d[j + 2] = r[2];
            d[j + 3] = r[6];
        }
#endif
    for (; j < n; j++) d[j] = dj__cpu_dot(q, k + (size_t)j * ldk, hd);
}

/* o[i] += v_j[i] * w[j] for keys j < n in order: for each element the same
 * chain of fused multiply-adds as axpy key after key, but o held in
 * registers 64 floats at a time (one load and store of o a block of keys,
 * not one a key). v_j = v + j * ldv. */
static void axpy_keys(float *o, const float *v, size_t ldv, const float *w, uint32_t n, uint32_t hd) {
    uint32_t i = 0;
#ifdef __AVX2__
    for (; i + 64 <= hd; i += 64) {
        __m256 a[8];
        for (int r = 0; r < 8; r++) a[r] = _mm256_loadu_ps(o + i + 8 * r);
        for (uint32_t j = 0; j < n; j++) {
            const __m256 b = _mm256_set1_ps(w[j]);
            const float *vj = v + (size_t)j * ldv + i;
            for (int r = 0; r < 8; r++) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(vj + 8 * r), b, a[r]);
        }
        for (int r = 0; r < 8; r++) _mm256_storeu_ps(o + i + 8 * r, a[r]);
    }
    for (; i + 8 <= hd; i += 8) {
        __m256 a = _mm256_loadu_ps(o + i);
        for (uint32_t j = 0; j < n; j++)
            a = _mm256_fmadd_ps(_mm256_loadu_ps(v + (size_t)j * ldv + i), _mm256_set1_ps(w[j]), a);
        _mm256_storeu_ps(o + i, a);
    }
#endif
    for (; i < hd; i++)
        for (uint32_t j = 0; j < n; j++) o[i] += v[(size_t)j * ldv + i] * w[j];
}

/* f8 K/V (backend.h): sum q[i] * f8(code[i]), and acc[i] += f8(code[i]) * b;
 * the caller applies the head's power of two. Eight codes at a time as f16
 * (an e4m3 code's bits shifted into f16's places are its value * 2^-8,
 * subnormals included: the biases differ by 8), the rest through lut, the
 * 256 codes' values. */
#if defined(__AVX2__) && defined(__F16C__)
static inline __m256 f8x8(const uint8_t *code) {
    const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(const void *)code));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x80)), 8),
                                   _mm_slli_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7f)), 7));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}
#endif

static float dot_f8(const float *q, const uint8_t *code, uint32_t len, const float *lut) {
    uint32_t i = 0;
    float sum = 0.0f;
#if defined(__AVX2__) && defined(__F16C__)
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= len; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), f8x8(code + i), acc);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    sum = _mm_cvtss_f32(h);
#endif
    for (; i < len; i++) sum += q[i] * lut[code[i]];
    return sum;
}

static void axpy_f8(float *acc, const uint8_t *code, float b, uint32_t len, const float *lut) {
    uint32_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
    const __m256 vb = _mm256_set1_ps(b);
    for (; i + 8 <= len; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(f8x8(code + i), vb, _mm256_loadu_ps(acc + i)));
#endif
    for (; i < len; i++) acc[i] += lut[code[i]] * b;
}

/* One query row q[hd] against key positions [t0, t1] of kv head `kvh`, pages
 * found through `table` (kv's own or the row's); the output row o[hd] doubles
 * as the accumulator. With f8 pages lut holds the 256 codes' values and the
 * page's exponents of the head scale its scores and V weights (exact powers
 * of two). */
static void attend_one(const dj_kv_view *kv, const uint32_t *table, const float *q, float *o, uint32_t kvh,
                       uint32_t hd, uint32_t t0, uint32_t t1, float scale, float softcap, const float *lut) {
    const uint32_t tpp = kv->tokens_per_page, kvd = kv->kv_dim, nkv = kv->n_kv_heads;
    int kexp = 0, vexp = 0;
    float run_max = -INFINITY, run_sum = 0.0f;
    float s[SCORE_BLOCK], vw[SCORE_BLOCK];
    for (uint32_t i = 0; i < hd; i++) o[i] = 0.0f;
    for (uint32_t t = t0; t <= t1;) {
        const uint32_t row = t % tpp;
        uint32_t len = tpp - row;
        if (len > t1 - t + 1) len = t1 - t + 1;
        if (len > SCORE_BLOCK) len = SCORE_BLOCK;
        const uint8_t *page = kv->seg_base + (size_t)table[t / tpp] * kv->page_bytes;
        const float *kb = NULL, *vb = NULL;
        const uint8_t *kc = NULL, *vc = NULL;
        if (lut) {
            kc = page + (size_t)row * kvd + (size_t)kvh * hd;
            vc = kc + (size_t)tpp * kvd;
            const int8_t *ex = (const int8_t *)(page + dj_kv_f8_exps_at(tpp, kvd));
            kexp = ex[kvh];
            vexp = ex[nkv + kvh];
        } else {
            kb = (const float *)(const void *)page + (size_t)row * kvd + (size_t)kvh * hd;
            vb = (const float *)(const void *)page + ((size_t)tpp + row) * kvd + (size_t)kvh * hd;
        }
        float bmax = -INFINITY;
        if (!lut) dot_keys(q, kb, kvd, len, hd, s);
        for (uint32_t j = 0; j < len; j++) {
            s[j] = lut ? ldexpf(dot_f8(q, kc + (size_t)j * kvd, hd, lut), kexp) * scale : s[j] * scale;
            if (softcap != 0.0f) s[j] = tanhf(s[j] / softcap) * softcap; /* Gemma 2 */
            if (s[j] > bmax) bmax = s[j];
        }
        if (bmax > run_max) {
            const float corr = run_max == -INFINITY ? 0.0f : expf(run_max - bmax);
            run_sum *= corr;
            for (uint32_t i = 0; i < hd; i++) o[i] *= corr;
            run_max = bmax;
        }
        for (uint32_t j = 0; j < len; j++) vw[j] = s[j] - run_max;
        dj__cpu_exp_block(vw, vw, len);
        for (uint32_t j = 0; j < len; j++) run_sum += vw[j];
        if (lut)
            for (uint32_t j = 0; j < len; j++)
                axpy_f8(o, vc + (size_t)j * kvd, ldexpf(vw[j], vexp), hd, lut);
        else
            axpy_keys(o, vb, kvd, vw, len, hd);
        t += len;
    }
    const float inv = 1.0f / run_sum;
    for (uint32_t i = 0; i < hd; i++) o[i] *= inv;
}

typedef struct attend_ctx {
    const dj_op_call *c;
    const float *lut; /* f8 pages: the 256 codes' values; NULL for f32 pages */
} attend_ctx;

/* One (row, head) pair a task. */
static void attend_task(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const attend_ctx *ac = ctx;
    const dj_op_call *c = ac->c;
    const uint32_t nh = c->n_heads, hd = c->head_dim, group = c->n_heads / c->n_kv_heads;
    for (size_t task = lo; task < hi; task++) {
        const uint32_t i = (uint32_t)(task / nh), h = (uint32_t)(task % nh);
        const uint32_t p = c->row_pos ? c->row_pos[i] : c->pos0 + i;
        const uint32_t *table = c->row_tables ? c->row_tables[i] : c->kv->block_table;
        const uint32_t t0 = c->window && p + 1 > c->window ? p + 1 - c->window : 0;
        const size_t off = ((size_t)i * nh + h) * hd;
        attend_one(c->kv, table, (const float *)c->x + off, (float *)c->out + off, h / group, hd, t0, p, c->scale,
                   c->softcap, ac->lut);
    }
}

dj_status dj__cpu_attention(dj_cpu_backend *cb, const dj_op_call *c) {
    /* a short context is not worth a hand-over: key positions per task at least 256 */
    const uint32_t ctx_len = c->row_pos ? 256 : c->pos0 + c->n;
    const size_t grain = ctx_len >= 256 ? 1 : 256 / (ctx_len ? ctx_len : 1);
    float lut[256];
    attend_ctx ac = {.c = c, .lut = NULL};
    if (c->kv->dtype == DJ_DTYPE_F8_E4M3) {
        for (int v = 0; v < 256; v++) lut[v] = dj_f8e4m3_to_f32((uint8_t)v);
        ac.lut = lut;
    }
    dj__cpu_pool_for(cb->pool, (size_t)c->n * c->n_heads, grain, attend_task, &ac);
    return DJ_OK;
}
