/* cpu_matmul.c: out[n,m] = x[n,k] @ w[m,k]^T + bias - OpenBLAS for f32 weights,
 * a fused convert-and-dot kernel for decode-size f16/bf16 calls, and tiled
 * convert-then-sgemm for larger ones (never a full f32 copy of the weights).
 * OpenMP splits the weight rows; OpenBLAS runs single-threaded inside. */
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "backend/cpu/cpu_impl.h"

#if defined(__GNUC__)
#define DJ_INLINE static inline __attribute__((always_inline))
#else
#define DJ_INLINE static inline
#endif

/* Each thread's converted f32 tile aims at this many bytes: big enough for
 * sgemm to run at speed, small enough to stay in a core's L2. */
#define TILE_TARGET_BYTES (512u << 10)

static inline float scalar_at(const void *p, dj_dtype t, size_t i) {
    switch (t) {
    case DJ_DTYPE_BF16: return dj_bf16_to_f32(((const uint16_t *)p)[i]);
    case DJ_DTYPE_F16: return dj_f16_to_f32(((const uint16_t *)p)[i]);
    default: return ((const float *)p)[i];
    }
}

#ifdef __AVX2__
DJ_INLINE __m256 load8_half(const uint16_t *p, int bf16) {
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#ifdef __F16C__
    return _mm256_cvtph_ps(h);
#else
    float f[8];
    for (int i = 0; i < 8; i++) f[i] = dj_f16_to_f32(p[i]);
    return _mm256_loadu_ps(f);
#endif
}

DJ_INLINE float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

/* sums[r] = dot(x row r, w row) for r < NR, weight row converted on the fly. */
DJ_INLINE void dot_row(const uint16_t *wr, const float *x, uint32_t k, int bf16, int NR, float *sums) {
    uint32_t kk = 0;
    for (int r = 0; r < NR; r++) sums[r] = 0.0f;
#ifdef __AVX2__
    __m256 acc0[DJ_CPU_DOT_MAX_ROWS], acc1[DJ_CPU_DOT_MAX_ROWS];
    for (int r = 0; r < NR; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    for (; kk + 16 <= k; kk += 16) {
        const __m256 w0 = load8_half(wr + kk, bf16), w1 = load8_half(wr + kk + 8, bf16);
        for (int r = 0; r < NR; r++) {
            acc0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (size_t)r * k + kk), acc0[r]);
            acc1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + (size_t)r * k + kk + 8), acc1[r]);
        }
    }
    for (int r = 0; r < NR; r++) sums[r] = hsum8(_mm256_add_ps(acc0[r], acc1[r]));
#endif
    for (; kk < k; kk++) {
        const float w = bf16 ? dj_bf16_to_f32(wr[kk]) : dj_f16_to_f32(wr[kk]);
        for (int r = 0; r < NR; r++) sums[r] += w * x[(size_t)r * k + kk];
    }
}

DJ_INLINE void dot_kernel(dj_cpu_backend *cb, const dj_op_call *c, int bf16, int NR) {
    const uint32_t k = c->k, m = c->m;
    const uint16_t *w = c->w;
#pragma omp parallel for num_threads(cb->n_threads) schedule(static)
    for (uint32_t j = 0; j < m; j++) {
        float sums[DJ_CPU_DOT_MAX_ROWS];
        dot_row(w + (size_t)j * k, (const float *)c->x, k, bf16, NR, sums);
        const float b = c->bias ? scalar_at(c->bias, c->bias_dtype, j) : 0.0f;
        for (int r = 0; r < NR; r++) ((float *)c->out)[(size_t)r * m + j] = sums[r] + b;
    }
}

static void matmul_dot(dj_cpu_backend *cb, const dj_op_call *c) {
    const int bf16 = c->w_dtype == DJ_DTYPE_BF16;
    switch (c->n) { /* constant row counts let the accumulators live in registers */
    case 1: bf16 ? dot_kernel(cb, c, 1, 1) : dot_kernel(cb, c, 0, 1); break;
    case 2: bf16 ? dot_kernel(cb, c, 1, 2) : dot_kernel(cb, c, 0, 2); break;
    case 3: bf16 ? dot_kernel(cb, c, 1, 3) : dot_kernel(cb, c, 0, 3); break;
    default: bf16 ? dot_kernel(cb, c, 1, 4) : dot_kernel(cb, c, 0, 4); break;
    }
}

static void add_bias(dj_cpu_backend *cb, const dj_op_call *c) {
    const uint32_t n = c->n, m = c->m;
#pragma omp parallel for num_threads(cb->n_threads) schedule(static) if (n > 1)
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t j = 0; j < m; j++) ((float *)c->out)[(size_t)r * m + j] += scalar_at(c->bias, c->bias_dtype, j);
}

static dj_status grow_scratch(dj_cpu_backend *cb, size_t floats) {
    if (cb->scratch_cap >= floats) return DJ_OK;
    free(cb->scratch);
    cb->scratch_cap = 0;
    cb->scratch = malloc(floats * sizeof(float));
    if (!cb->scratch)
        return dj_fail(DJ_ENOMEM, "matmul: cannot allocate %zu bytes of weight-tile scratch", floats * sizeof(float));
    cb->scratch_cap = floats;
    return DJ_OK;
}

/* out[:, j0..j0+rows) from f32 weight rows wr[rows][k], on the calling thread. */
static void gemm_cols(const dj_op_call *c, const float *wr, uint32_t j0, uint32_t rows) {
    const int n = (int)c->n, k = (int)c->k, m = (int)c->m;
    const float *x = c->x;
    float *out = (float *)c->out + j0;
    if (n == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)rows, k, 1.0f, wr, k, x, 1, 0.0f, out, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, (int)rows, k, 1.0f, x, k, wr, k, 0.0f, out, m);
}

/* f32 weights: each thread multiplies its own block of weight rows. */
static void matmul_f32(dj_cpu_backend *cb, const dj_op_call *c) {
    const uint32_t m = c->m, nt = (uint32_t)cb->n_threads;
    uint32_t block = (m + nt - 1) / nt;
    block = (block + 15) / 16 * 16;
#pragma omp parallel for num_threads(cb->n_threads) schedule(static)
    for (uint32_t j0 = 0; j0 < m; j0 += block)
        gemm_cols(c, (const float *)c->w + (size_t)j0 * c->k, j0, m - j0 < block ? m - j0 : block);
}

/* f16/bf16 weights, larger n: each thread converts a tile of weight rows into
 * its slice of the scratch and multiplies it. */
static dj_status matmul_tiled(dj_cpu_backend *cb, const dj_op_call *c) {
    const uint32_t k = c->k, m = c->m;
    uint32_t tile = cb->tile_rows;
    if (tile == 0) {
        size_t t = TILE_TARGET_BYTES / ((size_t)k * sizeof(float));
        tile = t < 16 ? 16 : t > m ? m : (uint32_t)t;
    }
    if (tile > m) tile = m;
    const size_t per_thread = (size_t)tile * k;
    dj_status st = grow_scratch(cb, per_thread * (size_t)cb->n_threads);
    if (st != DJ_OK) return st;
    const size_t row_bytes = (size_t)k * dj_dtype_size(c->w_dtype);
    const uint32_t n_tiles = (m + tile - 1) / tile;
#pragma omp parallel num_threads(cb->n_threads)
    {
        float *mine = cb->scratch + (size_t)omp_get_thread_num() * per_thread;
#pragma omp for schedule(dynamic, 1)
        for (uint32_t ti = 0; ti < n_tiles; ti++) {
            const uint32_t j0 = ti * tile, rows = m - j0 < tile ? m - j0 : tile;
            const uint8_t *src = (const uint8_t *)c->w + (size_t)j0 * row_bytes;
            for (uint32_t r = 0; r < rows; r++)
                dj__cpu_to_f32(mine + (size_t)r * k, src + (size_t)r * row_bytes, c->w_dtype, k);
            gemm_cols(c, mine, j0, rows);
        }
    }
    return DJ_OK;
}

dj_status dj__cpu_matmul(dj_cpu_backend *cb, const dj_op_call *c) {
    if (c->n > INT32_MAX || c->k > INT32_MAX || c->m > INT32_MAX)
        return dj_fail(DJ_EUNSUPPORTED, "matmul: n=%u k=%u m=%u exceeds the BLAS index range", c->n, c->k, c->m);
    if (c->w_dtype == DJ_DTYPE_F32) {
        matmul_f32(cb, c);
    } else if (c->n <= DJ_CPU_DOT_MAX_ROWS) {
        matmul_dot(cb, c);
        return DJ_OK; /* bias added in the kernel */
    } else {
        dj_status st = matmul_tiled(cb, c);
        if (st != DJ_OK) return st;
    }
    if (c->bias) add_bias(cb, c);
    return DJ_OK;
}
