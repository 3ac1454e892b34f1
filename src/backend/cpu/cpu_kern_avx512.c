/* cpu_kern_avx512.c: the matmul kernels for AVX-512F - the 16 lanes of
 * cpu_kern.h's order in one register, 32 registers for larger tiles. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

#include "backend/cpu/cpu_kern.h"

#define KTGT "avx512f,avx2,fma,f16c"
#define V __m512
#define VL 16
#define DNR 4 /* dot: up to 4 rows x one weight row at a time */
#define GNR 4 /* gemm: 4 rows x 6 weight rows = 24 accumulators of the 32 registers */
#define GNC 6

#define KV static inline __attribute__((always_inline, target(KTGT)))
KV V v_zero(void) { return _mm512_setzero_ps(); }
KV V v_loadf(const float *p) { return _mm512_loadu_ps(p); }
KV V v_load_bf16(const uint16_t *p) {
    const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
KV V v_load_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p)); }
KV V v_fma(V a, V b, V acc) { return _mm512_fmadd_ps(a, b, acc); }
KV void v_storef(float *p, V v) { _mm512_storeu_ps(p, v); }
KV float v_reduce16(const V *a) {
    const __m256 s = _mm256_add_ps(_mm512_castps512_ps256(a[0]),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[0]), 1))); /* l + (l+8) */
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));                     /* + (l+4) */
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));                                                            /* + (l+2) */
    t = _mm_add_ss(t, _mm_movehdup_ps(t));                                                             /* u0 + u1 */
    return _mm_cvtss_f32(t);
}
/* r[i] = v_reduce16(&a[i]) for i < 4, the same tree done for four lane sets
 * side by side (each add is one of the tree's, lane for lane). */
#define HAVE_V_REDUCE16X4 1
KV void v_reduce16x4(const V *a, float *r) {
    const V s01 = _mm512_add_ps(_mm512_shuffle_f32x4(a[0], a[1], 0x44), _mm512_shuffle_f32x4(a[0], a[1], 0xEE));
    const V s23 = _mm512_add_ps(_mm512_shuffle_f32x4(a[2], a[3], 0x44), _mm512_shuffle_f32x4(a[2], a[3], 0xEE));
    /* s01: l + (l+8) of a[0] in lanes 0..7, of a[1] in 8..15 */
    const V t = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xDD));
    /* t: + (l+4), four lanes of each a[i] in its 128-bit block */
    const V u = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, _MM_SHUFFLE(1, 0, 3, 2))); /* + (l+2) */
    const V v = _mm512_add_ps(u, _mm512_shuffle_ps(u, u, _MM_SHUFFLE(2, 3, 0, 1))); /* u0 + u1 */
    const __m512i first = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm_storeu_ps(r, _mm512_castps512_ps128(_mm512_permutexvar_ps(first, v)));
}

#include "backend/cpu/cpu_kern_simd.h"

const dj__cpu_kernels dj__cpu_kernels_avx512 = {
    .name = "avx512",
    .dot_rows = DNR,
    .dot = kern_dot,
    .gemm_cols = GNC,
    .gemm_block = kern_gemm_block,
};
#endif
