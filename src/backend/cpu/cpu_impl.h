/* cpu_impl.h: private state of the CPU backend and the kernels its compute
 * switch dispatches to (one file per kernel family). */
#ifndef DJ_CPU_IMPL_H
#define DJ_CPU_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_kern.h"
#include "backend/cpu/cpu_pool.h"
#include "djinn/backend.h"
#include "djinn/pick.h"

/* Decode-size matmuls (n <= this) read the weights as stored (one pass,
 * every thread on its own weight rows); larger n convert weight tiles to f32
 * and multiply them k-blocked - the order of cpu_kern.h either way. */
#define DJ_CPU_DOT_MAX_ROWS 4

typedef struct dj_cpu_backend {
    struct dj_backend base; /* must stay first */
    int n_threads;        /* threads of every op: the pool's (moe_ffn: an OpenMP team) */
    dj_cpu_pool *pool;    /* owned */
    uint32_t tile_rows;   /* weight rows per thread tile of a larger matmul; 0 = from k */
    dj_cpu_isa isa;       /* the kernels' instruction set (dj__cpu_isa_best at creation) */
    const dj__cpu_kernels *kern; /* its table */
    float *scratch;       /* [scratch_cap] per-thread f32 tiles of converted weight rows; owned */
    size_t scratch_cap;   /* floats */
    dj_pick_scratch pick; /* the sample hook's, for the largest vocabulary seen; owned */
} dj_cpu_backend;

/* Test hook: weight rows per converted tile of the large-n matmul path
 * (0 restores the automatic choice). */
void dj__cpu_set_tile_rows(dj_backend_t *be, uint32_t rows);
/* Test hook: run the kernels of another instruction set (DJ_EUNSUPPORTED
 * when this build or CPU has none). */
dj_status dj__cpu_set_isa(dj_backend_t *be, dj_cpu_isa isa);

/* cpu_vec.c: sum of a[i]*b[i], 8-wide FMA lanes where AVX2 is there. */
float dj__cpu_dot(const float *a, const float *b, uint32_t len);
/* y[j] = expf(x[j]) for j < n (y may be x): with AVX2 four at a time in
 * double precision - the algorithm of glibc's expf (2.28 on: k = x * 32 / ln 2
 * rounded, a table of 2^(i/32), a cubic in the rest), each operation and FMA
 * fusion as its FMA build has them, so the same bits as glibc 2.36's expf for
 * every x in [-103.28, 88) (all 2.24e9 such floats checked; bench/RESULTS.md),
 * +0 below -103.97 as expf; the rest, and CPUs without AVX2, through expf.
 * Attention's softmax and SiLU use it. */
void dj__cpu_exp_block(const float *x, float *y, uint32_t n);
/* cpu_vec.c: dst[0..count) = src converted to f32; src of dtype f32/f16/bf16. */
void dj__cpu_to_f32(float *dst, const void *src, dj_dtype t, size_t count);

/* Kernels; the call has been validated by the compute switch. */
dj_status dj__cpu_matmul(dj_cpu_backend *cb, const dj_op_call *c);
/* dst[0..k) = weight row `row` of c (f8_e4m3 at src) times its scales, as f32. */
void dj__cpu_fp8_row(float *dst, const uint8_t *src, const dj_op_call *c, uint32_t row);
dj_status dj__cpu_attention(dj_cpu_backend *cb, const dj_op_call *c);
/* cpu_arch_ops.c: the ops of the architectures beyond Llama. */
dj_status dj__cpu_gelu_mul(dj_cpu_backend *cb, const dj_op_call *c);
dj_status dj__cpu_softcap(dj_cpu_backend *cb, const dj_op_call *c);
dj_status dj__cpu_lora(dj_cpu_backend *cb, const dj_op_call *c); /* cpu_lora.c */
dj_status dj__cpu_moe_route(dj_cpu_backend *cb, const dj_op_call *c);
dj_status dj__cpu_moe_ffn(dj_cpu_backend *cb, const dj_op_call *c);

/* cpu_ring.c: weight streaming (the vtable's ring hooks and compute_plan
 * with a stream). */
dj_status dj__cpu_ring_new(dj_backend_t *be, uint32_t n_loads, dj_backend_ring_t **out /* OUT */);
void dj__cpu_ring_free(dj_backend_t *be, dj_backend_ring_t *r);
/* Test hook: the copy threads yield up to max_yields times before each copy
 * (0: never), drawn from seed - late copies in varied orders. */
void dj__cpu_ring_jitter(unsigned max_yields, uint64_t seed);
dj_status dj__cpu_compute_streamed(dj_backend_t *be, const dj_op_call *calls, size_t n, const dj_stream_step *ss);

#endif
