/* cpu_matmul.c: out[n,m] = x[n,k] @ w[m,k]^T + bias, batch-invariant: every
 * output element is one dot product summed in a fixed order (16 lanes over k,
 * a fixed lane reduction, the tail, then the bias) whatever n is, so a row's
 * result is bit-identical alone and in any batch. f16/bf16 weights convert on
 * the fly for decode-size n and into per-thread f32 tiles for larger n (never
 * a full f32 copy of the weights); register tiles of rows x weight rows. OpenMP
 * splits the weight rows. */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <string.h>
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

/* Each thread's converted f32 tile aims at this many bytes: big enough to
 * amortise the conversion, small enough to stay in a core's L2. */
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

/* Weight loads: f32 as is, or f16/bf16 converted (the same f32 values). */
#define W_F32 0
#define W_BF16 1
#define W_F16 2

static inline float w_at(const void *w, int wt, size_t i) {
    return wt == W_BF16 ? dj_bf16_to_f32(((const uint16_t *)w)[i])
           : wt == W_F16 ? dj_f16_to_f32(((const uint16_t *)w)[i])
                         : ((const float *)w)[i];
}

#ifdef __AVX2__
DJ_INLINE __m256 load8_w(const void *w, int wt, size_t i) {
    if (wt == W_F32) return _mm256_loadu_ps((const float *)w + i);
    return load8_half((const uint16_t *)w + i, wt == W_BF16);
}
#endif

/* sums[r][c] = dot(x row r, weight row c) for r < NR, c < NC: THE order of
 * every output element (the batch-invariance contract) - lane l in 0..7
 * accumulates k = 8q + l by fused multiply-add in q order, the lanes are
 * reduced by hsum8, then the tail k's are fused in one by one. x rows are
 * ldx apart; w[c] points at weight row c (type wt). One accumulator per
 * element keeps a 4 x 3 tile (12) and its operands in the 16 AVX registers. */
DJ_INLINE void dot_tile(const float *x, size_t ldx, const void *const *w, int wt, uint32_t k, int NR, int NC,
                        float sums[DJ_CPU_DOT_MAX_ROWS][3]) {
    uint32_t kk = 0;
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) sums[r][c] = 0.0f;
#ifdef __AVX2__
    __m256 a[DJ_CPU_DOT_MAX_ROWS][3];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) a[r][c] = _mm256_setzero_ps();
    for (; kk + 8 <= k; kk += 8) {
        __m256 wv[3];
        for (int c = 0; c < NC; c++) wv[c] = load8_w(w[c], wt, kk);
        for (int r = 0; r < NR; r++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)r * ldx + kk);
            for (int c = 0; c < NC; c++) a[r][c] = _mm256_fmadd_ps(wv[c], xv, a[r][c]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) sums[r][c] = hsum8(a[r][c]);
#endif
    for (; kk < k; kk++)
        for (int c = 0; c < NC; c++) {
            const float wv = w_at(w[c], wt, kk);
            for (int r = 0; r < NR; r++) sums[r][c] = fmaf(wv, x[(size_t)r * ldx + kk], sums[r][c]);
        }
}

/* Rows [0, n) of out for weight rows [j0, j0 + nc), nc <= 3; w[c] = weight
 * row j0 + c. Rows in register tiles of up to DJ_CPU_DOT_MAX_ROWS (the same
 * per-element order for every tile shape). */
DJ_INLINE void cols_block(const dj_op_call *c, const void *const *w, int wt, uint32_t j0, int nc) {
    const uint32_t n = c->n, k = c->k, m = c->m;
    const float *x = c->x;
    float *out = c->out;
    float sums[DJ_CPU_DOT_MAX_ROWS][3];
    for (uint32_t r = 0; r < n;) {
        const uint32_t left = n - r;
        const int nr = left >= DJ_CPU_DOT_MAX_ROWS ? DJ_CPU_DOT_MAX_ROWS : (int)left;
        const float *xr = x + (size_t)r * k;
#define DJ_TILE(NR, NC) dot_tile(xr, k, w, wt, k, NR, NC, sums)
        if (nc == 3) {
            if (nr == 4) DJ_TILE(4, 3); else if (nr == 3) DJ_TILE(3, 3); else if (nr == 2) DJ_TILE(2, 3); else DJ_TILE(1, 3);
        } else if (nc == 2) {
            if (nr == 4) DJ_TILE(4, 2); else if (nr == 3) DJ_TILE(3, 2); else if (nr == 2) DJ_TILE(2, 2); else DJ_TILE(1, 2);
        } else {
            if (nr == 4) DJ_TILE(4, 1); else if (nr == 3) DJ_TILE(3, 1); else if (nr == 2) DJ_TILE(2, 1); else DJ_TILE(1, 1);
        }
#undef DJ_TILE
        for (int i = 0; i < nr; i++)
            for (int cc = 0; cc < nc; cc++) {
                const float b = c->bias ? scalar_at(c->bias, c->bias_dtype, j0 + (uint32_t)cc) : 0.0f;
                out[(size_t)(r + (uint32_t)i) * m + j0 + (uint32_t)cc] = sums[i][cc] + b;
            }
        r += (uint32_t)nr;
    }
}

/* Weight rows [j0, j1) from w (type wt, row stride row_elems), 3 at a time. */
static void cols_range(const dj_op_call *c, const void *w, int wt, size_t row_elems, uint32_t j0, uint32_t j1) {
    const size_t esz = wt == W_F32 ? 4 : 2;
    for (uint32_t j = j0; j < j1; j += 3) {
        const int nc = j1 - j >= 3 ? 3 : (int)(j1 - j);
        const void *rows[3];
        for (int cc = 0; cc < 3; cc++)
            rows[cc] = (const uint8_t *)w + (size_t)(j - j0 + (uint32_t)(cc < nc ? cc : 0)) * row_elems * esz;
        if (wt == W_F32) cols_block(c, rows, W_F32, j, nc);
        else if (wt == W_BF16) cols_block(c, rows, W_BF16, j, nc);
        else cols_block(c, rows, W_F16, j, nc);
    }
}

static int wtype(dj_dtype t) { return t == DJ_DTYPE_BF16 ? W_BF16 : t == DJ_DTYPE_F16 ? W_F16 : W_F32; }

/* Direct: weights read as stored (f32, or converted on the fly: decode-size n). */
static void matmul_direct(dj_cpu_backend *cb, const dj_op_call *c) {
    const uint32_t m = c->m, nt = (uint32_t)cb->n_threads;
    uint32_t block = (m + nt - 1) / nt;
    block = (block + 47) / 48 * 48;
    const int wt = wtype(c->w_dtype);
    const size_t esz = dj_dtype_size(c->w_dtype);
#pragma omp parallel for num_threads(cb->n_threads) schedule(static)
    for (uint32_t j0 = 0; j0 < m; j0 += block) {
        const uint32_t j1 = m - j0 < block ? m : j0 + block;
        cols_range(c, (const uint8_t *)c->w + (size_t)j0 * c->k * esz, wt, c->k, j0, j1);
    }
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

#ifdef __AVX2__
/* The k-blocked form of dot_tile for f32 weight rows: lanes accumulate over
 * [k0, k1) into acc (vectors kept between blocks, so each lane still sums
 * its k's in order: the same bits as dot_tile over [0, k1)). */
DJ_INLINE void tile_acc(const float *x, size_t ldx, const float *const *w, uint32_t k0, uint32_t k1, int NR, int NC,
                        float *acc, size_t acc_ld /* floats between rows of acc */) {
    __m256 a[DJ_CPU_DOT_MAX_ROWS][3];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) a[r][c] = _mm256_loadu_ps(acc + (size_t)r * acc_ld + (size_t)c * 8);
    for (uint32_t kk = k0; kk < k1; kk += 8) {
        __m256 wv[3];
        for (int c = 0; c < NC; c++) wv[c] = _mm256_loadu_ps(w[c] + kk);
        for (int r = 0; r < NR; r++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)r * ldx + kk);
            for (int c = 0; c < NC; c++) a[r][c] = _mm256_fmadd_ps(wv[c], xv, a[r][c]);
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) _mm256_storeu_ps(acc + (size_t)r * acc_ld + (size_t)c * 8, a[r][c]);
}
#endif

#define K_BLOCK 512u /* k per block: a 4-row x slice and 3 weight rows stay in a 32 KiB L1 */

/* out[:, j0..j0+nj) from f32 weight rows w[nj][k], k-blocked, acc scratch of
 * n * nj * 8 floats: the same per-element order as the direct kernel. */
static void gemm_rows(const dj_op_call *c, const float *w, uint32_t j0, uint32_t nj, float *acc) {
#ifdef __AVX2__
    const uint32_t n = c->n, k = c->k, k8 = k / 8 * 8;
    const float *x = c->x;
    const size_t acc_ld = (size_t)nj * 8; /* floats per row of x in acc */
    memset(acc, 0, (size_t)n * acc_ld * sizeof *acc);
    for (uint32_t k0 = 0; k0 < k8; k0 += K_BLOCK) {
        const uint32_t k1 = k8 - k0 < K_BLOCK ? k8 : k0 + K_BLOCK;
        for (uint32_t r = 0; r < n; r += DJ_CPU_DOT_MAX_ROWS) {
            const int nr = n - r >= DJ_CPU_DOT_MAX_ROWS ? DJ_CPU_DOT_MAX_ROWS : (int)(n - r);
            for (uint32_t j = 0; j < nj; j += 3) {
                const int nc = nj - j >= 3 ? 3 : (int)(nj - j);
                const float *wr[3] = {w + (size_t)j * k, w + (size_t)(j + (nc > 1)) * k,
                                      w + (size_t)(j + (nc > 2 ? 2 : 0)) * k};
                float *ap = acc + (size_t)r * acc_ld + (size_t)j * 8;
                const float *xr = x + (size_t)r * k;
#define DJ_ACC(NR, NC) tile_acc(xr, k, wr, k0, k1, NR, NC, ap, acc_ld)
                if (nc == 3) {
                    if (nr == 4) DJ_ACC(4, 3); else if (nr == 3) DJ_ACC(3, 3); else if (nr == 2) DJ_ACC(2, 3); else DJ_ACC(1, 3);
                } else if (nc == 2) {
                    if (nr == 4) DJ_ACC(4, 2); else if (nr == 3) DJ_ACC(3, 2); else if (nr == 2) DJ_ACC(2, 2); else DJ_ACC(1, 2);
                } else {
                    if (nr == 4) DJ_ACC(4, 1); else if (nr == 3) DJ_ACC(3, 1); else if (nr == 2) DJ_ACC(2, 1); else DJ_ACC(1, 1);
                }
#undef DJ_ACC
            }
        }
    }
    float *out = c->out;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t j = 0; j < nj; j++) {
            float sum = hsum8(_mm256_loadu_ps(acc + (size_t)r * acc_ld + (size_t)j * 8));
            for (uint32_t kk = k8; kk < k; kk++) sum = fmaf(w[(size_t)j * k + kk], x[(size_t)r * k + kk], sum);
            const float b = c->bias ? scalar_at(c->bias, c->bias_dtype, j0 + j) : 0.0f;
            out[(size_t)r * c->m + j0 + j] = sum + b;
        }
#else
    (void)acc;
    cols_range(c, w, W_F32, c->k, j0, j0 + nj);
#endif
}

/* Larger n: each thread takes a tile of weight rows - converted into its
 * slice of the scratch when f16/bf16 (never a full f32 copy), read in place
 * when f32 - and multiplies every row of x by it, k-blocked. */
static dj_status matmul_tiled(dj_cpu_backend *cb, const dj_op_call *c) {
    const uint32_t k = c->k, m = c->m;
    uint32_t tile = cb->tile_rows;
    if (tile == 0) {
        size_t t = TILE_TARGET_BYTES / ((size_t)k * sizeof(float));
        tile = t < 16 ? 16 : t > m ? m : (uint32_t)t;
    }
    if (tile > m) tile = m;
    const bool f32 = c->w_dtype == DJ_DTYPE_F32;
    const size_t per_thread = (f32 ? 0 : (size_t)tile * k) + (size_t)c->n * tile * 8;
    dj_status st = grow_scratch(cb, per_thread * (size_t)cb->n_threads);
    if (st != DJ_OK) return st;
    const size_t row_bytes = (size_t)k * dj_dtype_size(c->w_dtype);
    const uint32_t n_tiles = (m + tile - 1) / tile;
#pragma omp parallel num_threads(cb->n_threads)
    {
        float *mine = cb->scratch + (size_t)omp_get_thread_num() * per_thread;
        float *acc = f32 ? mine : mine + (size_t)tile * k;
#pragma omp for schedule(dynamic, 1)
        for (uint32_t ti = 0; ti < n_tiles; ti++) {
            const uint32_t j0 = ti * tile, rows = m - j0 < tile ? m - j0 : tile;
            const uint8_t *src = (const uint8_t *)c->w + (size_t)j0 * row_bytes;
            if (f32) {
                gemm_rows(c, (const float *)(const void *)src, j0, rows, acc);
                continue;
            }
            for (uint32_t r = 0; r < rows; r++)
                dj__cpu_to_f32(mine + (size_t)r * k, src + (size_t)r * row_bytes, c->w_dtype, k);
            gemm_rows(c, mine, j0, rows, acc);
        }
    }
    return DJ_OK;
}

dj_status dj__cpu_matmul(dj_cpu_backend *cb, const dj_op_call *c) {
    if (c->n <= DJ_CPU_DOT_MAX_ROWS) {
        matmul_direct(cb, c);
        return DJ_OK;
    }
    return matmul_tiled(cb, c);
}
