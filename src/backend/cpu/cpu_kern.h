/* cpu_kern.h: the matmul kernels of the CPU backend, one table per
 * instruction set (portable C, AVX2/FMA, AVX-512), chosen at run time from
 * cpuid - and THE summation order they all share, bit for bit.
 *
 * The order of every matmul output element (the batch-invariance contract:
 * a row's result does not depend on the batch, the thread count, the tiling
 * or the instruction set):
 *   k16 = k rounded down to a multiple of 16;
 *   16 lanes: lane l (0..15) = 0, then fma(w[k], x[k], lane) for
 *     k = l, l + 16, l + 32, ... < k16 in increasing order;
 *   a fixed halving tree: s[l] = lane[l] + lane[l+8] (l < 8),
 *     t[l] = s[l] + s[l+4] (l < 4), u[l] = t[l] + t[l+2] (l < 2), v = u[0] + u[1];
 *   the tail: v = fma(w[k], x[k], v) for k = k16 .. k-1 in order;
 *   the bias, when there is one: out = v + bias.
 * f16/bf16 weights convert to f32 exactly, so a kernel may read them as
 * stored or from a converted f32 copy. AVX2 keeps a lane set in two 8-wide
 * registers, AVX-512 in one 16-wide register, the portable path in an array. */
#ifndef DJ_CPU_KERN_H
#define DJ_CPU_KERN_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/dtype.h"

#define DJ_CPU_LANES 16
/* k per block of the blocked GEMM (a multiple of 16): 8192, the whole k of
 * most layers (no lanes kept between blocks). With f32 tiles 2048 measured
 * 4-11% faster than 512 and 1024 and 2-3% faster than 8192; with f16/bf16
 * read in place 8192 measured 1-3% faster than 2048 on k = 8192 (bench/RESULTS.md). */
#define DJ_CPU_KBLOCK 8192u

/* Bytes ahead of the weights it reads that the decode kernel (dot) asks the
 * caches for (prefetcht1, once a line): the hardware prefetchers stop at 4 KiB
 * pages, and a row of 2048 bf16 weights is one page. Of 2, 4, 8 and 16 KiB
 * (t0 and t1), 8 KiB with t1 measured best on the H100 machine's 16 Intel
 * cores (the GEMV alone 84-85 -> 114-116 GB/s, above that machine's
 * summing-loop read rate; TinyLlama decode 40 -> 48-52 tok/s), and no slower
 * on the 2-core AMD dev machine (bench/RESULTS.md, session 12). */
#define DJ_CPU_DOT_PREFETCH 8192u

typedef enum {
    DJ_CPU_ISA_PORTABLE, /* plain C: the reference */
    DJ_CPU_ISA_AVX2,     /* AVX2 + FMA + F16C */
    DJ_CPU_ISA_AVX512,   /* AVX-512F */
    DJ_CPU_ISA_COUNT
} dj_cpu_isa;

/* Memory a kernel pulls toward the core while it computes (the next weight
 * tile's source, so that converting it later reads the caches, not DRAM): the
 * kernel touches the cache line at next once per k step and moves next on by
 * a line until it reaches end. {NULL, NULL}: nothing to pull. */
typedef struct dj__cpu_pull {
    const char *next, *end;
} dj__cpu_pull;

typedef struct dj__cpu_kernels {
    const char *name;
    uint32_t dot_rows;           /* the largest nr `dot` takes */
    uint32_t gemm_cols;          /* weight rows of gemm_block's register tile (tiles of a multiple run best) */
    /* out[r * ldo + c] = the ordered dot product (no bias) of x row r (rows
     * ldx floats apart) and weight row c (dtype wt: f32/f16/bf16; rows
     * w_row_bytes apart from w), each k long, for r < nr <= dot_rows, c < nc.
     * Weights read as stored, one row after the other (a single sequential
     * stream: measured faster than rows read side by side): the decode kernel. */
    void (*dot)(const float *x, size_t ldx, uint32_t nr, const void *w, size_t w_row_bytes, uint32_t nc,
                dj_dtype wt, uint32_t k, float *out, size_t ldo);
    /* The lanes over one k block: acc[(r * nj + c) * 16 + l] goes on with
     * k in [k0, k1) (k1 - k0 a multiple of 16, k0 too) for x rows r < n (ldx
     * floats apart) and weight rows c < nj of dtype wt (f32, f16 or bf16: read
     * as stored, widened in registers; ldw elements apart) - from zero when
     * k0 is 0 (acc not read); when out is given (the last block) the lanes
     * are not stored: out[r * ldo + c] = their halving tree (v of the order,
     * before the tail). pull (never NULL) moves on as above (the portable
     * table ignores it). */
    void (*gemm_block)(const float *x, size_t ldx, uint32_t n, const void *w, dj_dtype wt, size_t ldw, uint32_t nj,
                       uint32_t k0, uint32_t k1, float *acc, float *out, size_t ldo, dj__cpu_pull *pull);
} dj__cpu_kernels;

extern const dj__cpu_kernels dj__cpu_kernels_portable;
#if defined(__x86_64__)
extern const dj__cpu_kernels dj__cpu_kernels_avx2;
extern const dj__cpu_kernels dj__cpu_kernels_avx512;
#endif

/* True when this CPU (and its OS) runs the instruction set. */
int dj__cpu_isa_supported(dj_cpu_isa isa);
/* The table of an instruction set, NULL when this build or CPU has none. */
const dj__cpu_kernels *dj__cpu_kernels_for(dj_cpu_isa isa);
/* The best supported instruction set, capped by $DJINN_CPU_ISA
 * ("portable", "avx2", "avx512": a kill switch, never a way up). */
dj_cpu_isa dj__cpu_isa_best(void);

/* v of the order above from 16 lanes (the portable tree); then with the tail
 * k in [k16, k) of x and weight row w (dtype wt). */
static inline float dj__cpu_lanes_reduce(const float *lane) {
    float s[8];
    for (int l = 0; l < 8; l++) s[l] = lane[l] + lane[l + 8];
    for (int l = 0; l < 4; l++) s[l] = s[l] + s[l + 4];
    for (int l = 0; l < 2; l++) s[l] = s[l] + s[l + 2];
    return s[0] + s[1];
}

/* The tail k in [k16, k) of x and weight row w (dtype wt) after v. */
static inline float dj__cpu_tail(float v, const float *x, const void *w, dj_dtype wt, uint32_t k16, uint32_t k) {
    for (uint32_t kk = k16; kk < k; kk++) {
        const float wv = wt == DJ_DTYPE_BF16 ? dj_bf16_to_f32(((const uint16_t *)w)[kk])
                         : wt == DJ_DTYPE_F16 ? dj_f16_to_f32(((const uint16_t *)w)[kk])
                                              : ((const float *)w)[kk];
        v = fmaf(wv, x[kk], v);
    }
    return v;
}

static inline float dj__cpu_lanes_finish(const float *lane, const float *x, const void *w, dj_dtype wt,
                                         uint32_t k16, uint32_t k) {
    return dj__cpu_tail(dj__cpu_lanes_reduce(lane), x, w, wt, k16, k);
}

#endif
