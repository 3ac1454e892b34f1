/* cpu_vec.c: the f32 row helpers every CPU kernel file shares - a dot
 * product and the conversion of stored rows to f32 - below the kernels. */
#include <string.h>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_impl.h"

/* ---- conversions ---- */

void dj__cpu_to_f32(float *dst, const void *src, dj_dtype t, size_t count) {
    size_t i = 0;
    if (t == DJ_DTYPE_F32) {
        memcpy(dst, src, count * sizeof(float));
    } else if (t == DJ_DTYPE_BF16) {
        const uint16_t *s = src;
#ifdef __AVX2__
        for (; i + 8 <= count; i += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
            __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(u));
        }
#endif
        for (; i < count; i++) dst[i] = dj_bf16_to_f32(s[i]);
    } else if (t == DJ_DTYPE_F16) {
        const uint16_t *s = src;
#ifdef __F16C__
        for (; i + 8 <= count; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + i))));
#endif
        for (; i < count; i++) dst[i] = dj_f16_to_f32(s[i]);
    }
}

/* sum of a[i]*b[i], 8-wide FMA lanes where AVX2 is there */
float dj__cpu_dot(const float *a, const float *b, uint32_t len) {
    uint32_t i = 0;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (; i + 16 <= len; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    }
    for (; i + 8 <= len; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    a0 = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#endif
    for (; i < len; i++) s += a[i] * b[i];
    return s;
}
