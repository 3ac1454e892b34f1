/* cpu_exp.c: expf of a block of floats, four at a time where the CPU has
 * AVX2, bit-equal to glibc's expf (cpu_impl.h, dj__cpu_exp_block): the
 * softmax of attention and SiLU share it. */
#include <math.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_impl.h"

#ifdef __AVX2__
/* 2^(i/32) as doubles less i << 47 (adding k << 47 then gives 2^(k/32)). */
static const uint64_t exp_tab[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

/* expf of four floats with |x| < 88 */
static inline __m128 exp4(__m128 x) {
    const __m256d xd = _mm256_cvtps_pd(x);
    const __m256d inv = _mm256_set1_pd(0x1.71547652b82fep+5), shift = _mm256_set1_pd(0x1.8p+52); /* 32 / ln 2 */
    const __m256d kds = _mm256_fmadd_pd(xd, inv, shift); /* k + 1.5 * 2^52: k = round(x * 32 / ln 2) */
    const __m256d kd = _mm256_sub_pd(kds, shift);
    const __m256d r = _mm256_fmsub_pd(inv, xd, kd);
    const __m256i ki = _mm256_castpd_si256(kds);
    const __m256i idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    const __m256i t = _mm256_add_epi64(_mm256_i64gather_epi64((const long long *)(const void *)exp_tab, idx, 8),
                                       _mm256_slli_epi64(ki, 47)); /* 2^(k/32) */
    const __m256d c0 = _mm256_set1_pd(0x1.c6af84b912394p-20), c1 = _mm256_set1_pd(0x1.ebfce50fac4f3p-13);
    const __m256d z = _mm256_fmadd_pd(r, c0, c1);
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(0x1.62e42ff0c52d6p-6), _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, _mm256_castsi256_pd(t)));
}
#endif

void dj__cpu_exp_block(const float *x, float *y, uint32_t n) {
    uint32_t j = 0;
#ifdef __AVX2__
    /* expf's own ranges: its main path for -0x1.9d1d9ep6 <= x <= 88.72 (here
     * to 88), +0 below -0x1.9fe368p6; in between, NaN, and from 88 up: expf */
    const __m128 lo = _mm_set1_ps(-0x1.9d1d9ep6f), hi = _mm_set1_ps(88.0f), zero_below = _mm_set1_ps(-0x1.9fe368p6f);
    for (; j + 4 <= n; j += 4) {
        const __m128 v = _mm_loadu_ps(x + j);
        const __m128 on_path = _mm_and_ps(_mm_cmp_ps(v, lo, _CMP_GE_OQ), _mm_cmp_ps(v, hi, _CMP_LT_OQ));
        const __m128 zero = _mm_cmp_ps(v, zero_below, _CMP_LT_OQ);
        if (_mm_movemask_ps(_mm_or_ps(on_path, zero)) != 15) {
            for (int u = 0; u < 4; u++) y[j + (uint32_t)u] = expf(x[j + (uint32_t)u]);
            continue;
        }
        _mm_storeu_ps(y + j, _mm_andnot_ps(zero, exp4(v)));
    }
#endif
    for (; j < n; j++) y[j] = expf(x[j]);
}
