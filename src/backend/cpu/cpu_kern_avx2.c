/* cpu_kern_avx2.c: the matmul kernels for AVX2 + FMA + F16C - the 16 lanes
 * of cpu_kern.h's order in two 8-wide registers. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_kern.h"

#define KTGT "avx2,fma,f16c"
#define V __m256
#define VL 8
#define DNR 4 /* dot: up to 4 rows x one weight row at a time */
#define GNR 2 /* gemm: the same */
#define GNC 3

#define KV static inline __attribute__((always_inline, target(KTGT)))
KV V v_zero(void) { return _mm256_setzero_ps(); }
KV V v_loadf(const float *p) { return _mm256_loadu_ps(p); }
KV V v_load_bf16(const uint16_t *p) {
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
KV V v_load_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p)); }
KV V v_fma(V a, V b, V acc) { return _mm256_fmadd_ps(a, b, acc); }
KV void v_storef(float *p, V v) { _mm256_storeu_ps(p, v); }
/* a[0] = lanes 0..7, a[1] = lanes 8..15 */
KV float v_reduce16(const V *a) {
    const __m256 s = _mm256_add_ps(a[0], a[1]);                                     /* l + (l+8) */
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  /* + (l+4) */
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));                                         /* + (l+2) */
    t = _mm_add_ss(t, _mm_movehdup_ps(t));                                          /* u0 + u1 */
    return _mm_cvtss_f32(t);
}

#include "backend/cpu/cpu_kern_simd.h"

const dj__cpu_kernels dj__cpu_kernels_avx2 = {
    .name = "avx2",
    .dot_rows = DNR,
    .dot = kern_dot,
    .gemm_cols = GNC,
    .gemm_block = kern_gemm_block,
};
#endif
