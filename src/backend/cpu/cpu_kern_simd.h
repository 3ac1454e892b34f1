/* cpu_kern_simd.h: the body of a SIMD kernel table, included once by each
 * instruction set's file (cpu_kern_avx2.c, cpu_kern_avx512.c) after it has
 * defined:
 *   KTGT                 the target attribute string ("avx2,fma,f16c");
 *   V, VL                the f32 vector type and its width (VN = 16 / VL of
 *                        them hold the 16 lanes of cpu_kern.h's order);
 *   v_zero, v_loadf, v_load_bf16, v_load_f16, v_fma(a, b, acc), v_storef;
 *   v_reduce16(const V *a)   cpu_kern.h's halving tree over a[0..VN);
 *   DNR / GNR, GNC       the register tiles of dot (rows of x; one weight row)
 *                        and gemm_block.
 * Every function carries the target attribute: the file is compiled for the
 * build's baseline and runs only where dj__cpu_isa_supported said so. */
#ifndef KTGT
#error "define the instruction set before including cpu_kern_simd.h"
#endif

#define VN (DJ_CPU_LANES / VL)
/* One line of a dj__cpu_pull, toward L2 (a read, moderate locality). */
#define PULL(p) __builtin_prefetch((p), 0, PULL_LOCALITY)
#ifndef PULL_LOCALITY
#define PULL_LOCALITY 1
#endif
#define KI static inline __attribute__((always_inline, target(KTGT)))
#define KF static __attribute__((target(KTGT)))

KI V v_load_w(const void *w, dj_dtype wt, size_t i) {
    if (wt == DJ_DTYPE_BF16) return v_load_bf16((const uint16_t *)w + i);
    if (wt == DJ_DTYPE_F16) return v_load_f16((const uint16_t *)w + i);
    return v_loadf((const float *)w + i);
}

/* out[r][c] for an NR x NC tile, weights read as stored. */
#define DNC 1
KI void dot_tile(const float *x, size_t ldx, const void *const *w, dj_dtype wt, uint32_t k, const int NR,
                 const int NC, float *out, size_t ldo) {
    V a[DNR][DNC][VN];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            for (int v = 0; v < VN; v++) a[r][c][v] = v_zero();
    const uint32_t k16 = k / DJ_CPU_LANES * DJ_CPU_LANES;
    const size_t es = wt == DJ_DTYPE_F32 ? 4u : 2u;
    for (uint32_t kk = 0; kk < k16; kk += DJ_CPU_LANES) {
        if ((kk & 31u) == 0) /* once a cache line (16 bf16 lanes are half of one) */
            for (int c = 0; c < NC; c++)
                _mm_prefetch((const char *)w[c] + (size_t)kk * es + DJ_CPU_DOT_PREFETCH, _MM_HINT_T1);
        for (int v = 0; v < VN; v++) {
            V wv[DNC];
            for (int c = 0; c < NC; c++) wv[c] = v_load_w(w[c], wt, kk + (uint32_t)(v * VL));
            for (int r = 0; r < NR; r++) {
                const V xv = v_loadf(x + (size_t)r * ldx + kk + v * VL);
                for (int c = 0; c < NC; c++) a[r][c][v] = v_fma(wv[c], xv, a[r][c][v]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) {
            float v = v_reduce16(a[r][c]);
            const float *xr = x + (size_t)r * ldx;
            for (uint32_t kk = k16; kk < k; kk++) {
                const float wk = wt == DJ_DTYPE_BF16 ? dj_bf16_to_f32(((const uint16_t *)w[c])[kk])
                                 : wt == DJ_DTYPE_F16 ? dj_f16_to_f32(((const uint16_t *)w[c])[kk])
                                                      : ((const float *)w[c])[kk];
                v = fmaf(wk, xr[kk], v);
            }
            out[(size_t)r * ldo + c] = v;
        }
}

/* Weight rows one after the other; one inlined copy per row count and type,
 * so each has constant loops. */
#define DOT_ROWS(WT, R)                                                                     \
    for (uint32_t c = 0; c < nc; c++) {                                                     \
        const void *wc = (const uint8_t *)w + (size_t)c * w_row_bytes;                      \
        dot_tile(x, ldx, &wc, WT, k, R, 1, out + c, ldo);                                   \
    }
#define DOT_TYPE(WT)                               \
    switch (nr) {                                  \
    case 1: DOT_ROWS(WT, 1) break;                 \
    case 2: DOT_ROWS(WT, 2) break;                 \
    case 3: DOT_ROWS(WT, 3) break;                 \
    default: DOT_ROWS(WT, 4) break;                \
    }

KF void kern_dot(const float *x, size_t ldx, uint32_t nr, const void *w, size_t w_row_bytes, uint32_t nc,
                 dj_dtype wt, uint32_t k, float *out, size_t ldo) {
    if (wt == DJ_DTYPE_BF16) {
        DOT_TYPE(DJ_DTYPE_BF16)
    } else if (wt == DJ_DTYPE_F16) {
        DOT_TYPE(DJ_DTYPE_F16)
    } else {
        DOT_TYPE(DJ_DTYPE_F32)
    }
}

/* out[r * ldo + c] = the halving tree of an NR x NC tile's lanes. */
KI void reduce_tile(V a[GNR][GNC][VN], const int NR, const int NC, float *out, size_t ldo) {
#ifdef HAVE_V_REDUCE16X4
    /* four lane sets at a time, row-major over the tile */
    float res[GNR * GNC + 3];
    for (int g = 0; g < NR * NC; g += 4) {
        V q[4];
        for (int i = 0; i < 4; i++) q[i] = g + i < NR * NC ? a[(g + i) / NC][(g + i) % NC][0] : v_zero();
        v_reduce16x4(q, res + g);
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) out[(size_t)r * ldo + c] = res[r * NC + c];
#else
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) out[(size_t)r * ldo + c] = v_reduce16(a[r][c]);
#endif
}

/* The lanes of an NR x NC tile over [k0, k1): from zero when k0 is 0, else
 * from acc; then into acc, or (out given: the last block) their halving tree
 * into out. Weight rows of type WT (f32, bf16, f16) ldw elements apart,
 * widened in registers as they are loaded. */
KI void gemm_tile(const float *x, size_t ldx, const void *w, const dj_dtype WT, size_t ldw, uint32_t k0, uint32_t k1,
                  const int NR, const int NC, float *acc, size_t acc_ld, float *out, size_t ldo, const char **pull,
                  const char *pull_end) {
    const char *p = *pull;
    V a[GNR][GNC][VN];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            for (int v = 0; v < VN; v++)
                a[r][c][v] = k0 == 0 ? v_zero() : v_loadf(acc + (size_t)r * acc_ld + (size_t)c * DJ_CPU_LANES + v * VL);
    for (uint32_t kk = k0; kk < k1; kk += DJ_CPU_LANES) {
        PULL(p);
        p = p < pull_end ? p + 64 : p;
        for (int v = 0; v < VN; v++) {
            V wv[GNC];
            for (int c = 0; c < NC; c++) wv[c] = v_load_w(w, WT, (size_t)c * ldw + kk + v * VL);
            for (int r = 0; r < NR; r++) {
                const V xv = v_loadf(x + (size_t)r * ldx + kk + v * VL);
                for (int c = 0; c < NC; c++) a[r][c][v] = v_fma(wv[c], xv, a[r][c][v]);
            }
        }
    }
    *pull = p;
    if (out) {
        reduce_tile(a, NR, NC, out, ldo);
        return;
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++)
            for (int v = 0; v < VN; v++) v_storef(acc + (size_t)r * acc_ld + (size_t)c * DJ_CPU_LANES + v * VL, a[r][c][v]);
}

#define GEMM_SHAPE(WT, R, C)                                                                               \
    case (R) * 8 + (C):                                                                                    \
        if ((R) <= GNR && (C) <= GNC)                                                                      \
            gemm_tile(xr, ldx, wc, WT, ldw, k0, k1, R, C, ap, acc_ld, op, ldo, &p, pend);                  \
        break
#define GEMM_SHAPES(WT)                                                                                    \
    switch (nr * 8 + nc) {                                                                                 \
        GEMM_SHAPE(WT, 1, 1); GEMM_SHAPE(WT, 1, 2); GEMM_SHAPE(WT, 1, 3);                                  \
        GEMM_SHAPE(WT, 1, 4); GEMM_SHAPE(WT, 1, 5); GEMM_SHAPE(WT, 1, 6);                                  \
        GEMM_SHAPE(WT, 2, 1); GEMM_SHAPE(WT, 2, 2); GEMM_SHAPE(WT, 2, 3);                                  \
        GEMM_SHAPE(WT, 2, 4); GEMM_SHAPE(WT, 2, 5); GEMM_SHAPE(WT, 2, 6);                                  \
        GEMM_SHAPE(WT, 3, 1); GEMM_SHAPE(WT, 3, 2); GEMM_SHAPE(WT, 3, 3);                                  \
        GEMM_SHAPE(WT, 3, 4); GEMM_SHAPE(WT, 3, 5); GEMM_SHAPE(WT, 3, 6);                                  \
        GEMM_SHAPE(WT, 4, 1); GEMM_SHAPE(WT, 4, 2); GEMM_SHAPE(WT, 4, 3);                                  \
        GEMM_SHAPE(WT, 4, 4); GEMM_SHAPE(WT, 4, 5); GEMM_SHAPE(WT, 4, 6);                                  \
    default: break;                                                                                        \
    }

KF void kern_gemm_block(const float *x, size_t ldx, uint32_t n, const void *w, dj_dtype wt, size_t ldw, uint32_t nj,
                        uint32_t k0, uint32_t k1, float *acc, float *out, size_t ldo, dj__cpu_pull *pull) {
    const size_t acc_ld = (size_t)nj * DJ_CPU_LANES, wsize = dj_dtype_size(wt);
    static const char none = 0;
    const char *p = pull->next ? pull->next : &none;
    const char *pend = pull->next && pull->end - pull->next >= 64 ? pull->end - 64 : p;
    for (uint32_t r = 0; r < n; r += GNR) {
        const uint32_t nr = n - r < GNR ? n - r : GNR;
        const float *xr = x + (size_t)r * ldx;
        for (uint32_t c = 0; c < nj; c += GNC) {
            const uint32_t nc = nj - c < GNC ? nj - c : GNC;
            const void *wc = (const char *)w + (size_t)c * ldw * wsize;
            float *ap = acc + (size_t)r * acc_ld + (size_t)c * DJ_CPU_LANES;
            float *op = out ? out + (size_t)r * ldo + c : NULL;
            if (wt == DJ_DTYPE_BF16) {
                GEMM_SHAPES(DJ_DTYPE_BF16)
            } else if (wt == DJ_DTYPE_F16) {
                GEMM_SHAPES(DJ_DTYPE_F16)
            } else {
                GEMM_SHAPES(DJ_DTYPE_F32)
            }
        }
    }
    if (pull->next) pull->next = p;
}

