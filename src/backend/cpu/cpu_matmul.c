/* cpu_matmul.c: out[n,m] = x[n,k] @ w[m,k]^T + bias, batch-invariant: every
 * output element is one dot product in cpu_kern.h's order whatever n, the
 * threads or the tiling are, so a row's result is bit-identical alone and in
 * any batch. Decode-size n reads the weights as stored, every thread its own
 * contiguous weight rows (one pass over them); larger n splits the weight
 * rows into tiles, each multiplied by every row of x k-blocked through the
 * GEMM register tiles - f32/f16/bf16 rows read where they lie (widened in
 * registers), tiles claimed one ahead so the kernel pulls the next tile
 * toward L2 while it computes. f8_e4m3 weights always take the tiled path,
 * each tile dequantized into per-thread scratch (fp8 times its scale, one f32
 * product: exactly the dense weight a reference dequantizer makes). 4-bit
 * weights (DJ_DTYPE_Q4) likewise. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

/* A tile of weight rows aims at this many bytes as f32 (the dequantized f8 and
 * 4-bit tiles: small enough to stay in a core's L2; f16/bf16 tiles, read in
 * place, take the same rows: 128 and 512 KiB measured the same). */
#define TILE_TARGET_BYTES (256u << 10)
/* x rows per pass over a weight tile: bounds the lane accumulators. */
#define ROW_CHUNK 32u

static inline float bias_at(const dj_op_call *c, uint32_t j) {
    if (!c->bias) return 0.0f;
    switch (c->bias_dtype) {
    case DJ_DTYPE_BF16: return dj_bf16_to_f32(((const uint16_t *)c->bias)[j]);
    case DJ_DTYPE_F16: return dj_f16_to_f32(((const uint16_t *)c->bias)[j]);
    default: return ((const float *)c->bias)[j];
    }
}

/* Weight rows [j0, j1) for every row of x, read as stored. */
/* Elements from one weight row to the next (f32/f16/bf16). */
static inline size_t wld(const dj_op_call *c) { return c->ldw ? c->ldw : c->k; }

static void direct_rows(const dj__cpu_kernels *K, const dj_op_call *c, uint32_t j0, uint32_t j1) {
    const uint32_t n = c->n, k = c->k, m = c->m;
    const size_t row_bytes = wld(c) * dj_dtype_size(c->w_dtype);
    const float *x = c->x;
    float *out = c->out;
    for (uint32_t r = 0; r < n; r += K->dot_rows) {
        const uint32_t nr = n - r < K->dot_rows ? n - r : K->dot_rows;
        K->dot(x + (size_t)r * k, k, nr, (const uint8_t *)c->w + (size_t)j0 * row_bytes, row_bytes, j1 - j0,
               c->w_dtype, k, out + (size_t)r * m + j0, m);
    }
    if (c->bias)
        for (uint32_t r = 0; r < n; r++)
            for (uint32_t j = j0; j < j1; j++) out[(size_t)r * m + j] += bias_at(c, j);
}

typedef struct direct_job {
    const dj__cpu_kernels *K;
    const dj_op_call *c;
} direct_job;

static void direct_task(void *ctx, size_t j0, size_t j1, int thread) {
    (void)thread;
    const direct_job *j = ctx;
    direct_rows(j->K, j->c, (uint32_t)j0, (uint32_t)j1);
}

/* Weight rows in runs of at least DIRECT_MIN_BYTES (each a sequential stream
 * long enough for the prefetchers), about DIRECT_TASKS runs a thread so that
 * a thread the OS runs late leaves its share to the others. */
#define DIRECT_MIN_BYTES (64u << 10)
#define DIRECT_TASKS 4u

static void matmul_direct(dj_cpu_backend *cb, const dj_op_call *c) {
    const uint32_t m = c->m, nt = (uint32_t)cb->n_threads;
    const size_t row_bytes = wld(c) * dj_dtype_size(c->w_dtype);
    size_t block = (m + DIRECT_TASKS * nt - 1) / (DIRECT_TASKS * nt);
    const size_t min_rows = (DIRECT_MIN_BYTES + row_bytes - 1) / row_bytes;
    if (block < min_rows) block = min_rows;
    block = (block + 15) / 16 * 16;
    direct_job j = {cb->kern, c};
    dj__cpu_pool_for(cb->pool, m, block, direct_task, &j);
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

/* out[:, j0 .. j0+nj) from weight rows w[nj] (dtype wt: f32, f16, bf16; ldw
 * elements apart), x rows in chunks, k in blocks; acc holds ROW_CHUNK * nj
 * lane sets between blocks (the last block writes the halving tree into out). */
static void gemm_tile_rows(const dj__cpu_kernels *K, const dj_op_call *c, const float *x, size_t ldx, const void *w,
                           dj_dtype wt, size_t ldw, uint32_t j0, uint32_t nj, float *acc, dj__cpu_pull *pull) {
    const uint32_t n = c->n, k = c->k, k16 = k / DJ_CPU_LANES * DJ_CPU_LANES;
    const size_t w_row_bytes = ldw * dj_dtype_size(wt);
    float *out = c->out;
    for (uint32_t r0 = 0; r0 < n; r0 += ROW_CHUNK) {
        const uint32_t rn = n - r0 < ROW_CHUNK ? n - r0 : ROW_CHUNK;
        float *o0 = out + (size_t)r0 * c->m + j0;
        if (k16 == 0)
            for (uint32_t r = 0; r < rn; r++) memset(o0 + (size_t)r * c->m, 0, (size_t)nj * sizeof *o0);
        for (uint32_t k0 = 0; k0 < k16; k0 += DJ_CPU_KBLOCK) {
            const uint32_t k1 = k16 - k0 < DJ_CPU_KBLOCK ? k16 : k0 + DJ_CPU_KBLOCK;
            K->gemm_block(x + (size_t)r0 * ldx, ldx, rn, w, wt, ldw, nj, k0, k1, acc, k1 == k16 ? o0 : NULL, c->m,
                          pull);
        }
        for (uint32_t r = 0; r < rn; r++) {
            float *o = o0 + (size_t)r * c->m;
            if (k16 < k)
                for (uint32_t j = 0; j < nj; j++)
                    o[j] = dj__cpu_tail(o[j], x + (size_t)(r0 + r) * ldx, (const char *)w + (size_t)j * w_row_bytes,
                                        wt, k16, k);
            if (c->bias)
                for (uint32_t j = 0; j < nj; j++) o[j] += bias_at(c, j0 + j);
        }
    }
}

/* Floats between a converted tile's rows: k and one cache line more, so the
 * weight rows a register tile reads side by side do not all fall in the same
 * L1 sets (k a multiple of 1024 floats put them 4 KiB apart: measured a third
 * slower; padding x's rows as well measured no better). */
static inline size_t tile_ld(uint32_t k) { return ((size_t)k + 15) / 16 * 16 + 16; }

/* Row j of k values of the DJ_DTYPE_Q4 matrix w of m rows (djinn/dtype.h: rows
 * or bands) as f32: (code - zero) * scale. */
static void q4_row_to_f32(float *out, const uint8_t *w, uint32_t m, uint32_t k, uint32_t j) {
    for (uint32_t g = 0; g < k / DJ_Q4_GROUP; g++) {
        uint16_t sh, zh;
        memcpy(&sh, w + dj_q4_scale_at(m, k, j, g), 2);
        memcpy(&zh, w + dj_q4_zero_at(m, k, j, g), 2);
        const float s = dj_f16_to_f32(sh), z = dj_f16_to_f32(zh);
        const uint8_t *q = w + dj_q4_codes_at(m, k, j, g);
        float *o = out + g * DJ_Q4_GROUP;
        for (uint32_t i = 0; i < DJ_Q4_GROUP / 8; i++) {
            uint32_t v;
            memcpy(&v, q + 4 * i, 4);
            for (unsigned c = 0; c < 8; c++) o[8 * i + c] = ((float)((v >> (4 * dj_q4_nibble(c))) & 15u) - z) * s;
        }
    }
}

typedef struct tiled_job {
    const dj__cpu_kernels *K;
    const dj_op_call *c;
    float *scratch;    /* per_thread floats a thread */
    size_t per_thread;
    const float *x;    /* c->x: rows ldx floats apart */
    size_t ldx;
    uint32_t tile, n_tiles;
    bool in_place;     /* f32, f16, bf16: read as stored; f8 and 4-bit tiles are dequantized into scratch */
    _Atomic uint32_t next_tile; /* the next unclaimed tile */
} tiled_job;

static inline uint32_t claim_tile(tiled_job *j) {
    return atomic_fetch_add_explicit(&j->next_tile, 1, memory_order_relaxed);
}

/* Tile ti: dequantized into this thread's scratch (f8, 4-bit) and multiplied
 * by every row of x, pulling the source of the tile this thread does next. */
static void tiled_one(const tiled_job *j, uint32_t ti, uint32_t next, int thread) {
    const dj_op_call *c = j->c;
    const uint32_t k = c->k, j0 = ti * j->tile, rows = c->m - j0 < j->tile ? c->m - j0 : j->tile;
    const size_t row_bytes = j->in_place ? wld(c) * dj_dtype_size(c->w_dtype) : dj_dtype_row_bytes(c->w_dtype, k);
    const uint8_t *src = (const uint8_t *)c->w + (size_t)j0 * row_bytes;
    dj__cpu_pull pull = {NULL, NULL};
    if (next < j->n_tiles) { /* 4-bit bands (djinn/dtype.h): the tile's bytes within a band each end */
        const uint32_t n0 = next * j->tile, nrows = c->m - n0 < j->tile ? c->m - n0 : j->tile;
        pull.next = (const char *)c->w + (size_t)n0 * row_bytes;
        pull.end = pull.next + (size_t)nrows * row_bytes;
    }
    float *mine = j->scratch + (size_t)thread * j->per_thread;
    float *acc = j->in_place ? mine : mine + (size_t)j->tile * tile_ld(k);
    if (j->in_place) {
        gemm_tile_rows(j->K, c, j->x, j->ldx, src, c->w_dtype, wld(c), j0, rows, acc, &pull);
        return;
    }
    const size_t ldw = tile_ld(k);
    if (c->w_dtype == DJ_DTYPE_F8_E4M3)
        for (uint32_t r = 0; r < rows; r++) dj__cpu_fp8_row(mine + r * ldw, src + r * row_bytes, c, j0 + r);
    else
        for (uint32_t r = 0; r < rows; r++) q4_row_to_f32(mine + r * ldw, c->w, c->m, k, j0 + r);
    gemm_tile_rows(j->K, c, j->x, j->ldx, mine, DJ_DTYPE_F32, ldw, j0, rows, acc, &pull);
}

/* One task a thread: tiles claimed one ahead, so that the tile a thread does
 * next is known while it computes this one. A thread the OS runs late finds
 * the tiles taken (its task then claims none). */
static void tiled_task(void *ctx, uint32_t task, int thread) {
    (void)task;
    tiled_job *j = ctx;
    uint32_t ti = claim_tile(j);
    while (ti < j->n_tiles) {
        const uint32_t next = claim_tile(j);
        tiled_one(j, ti, next, thread);
        ti = next;
    }
}

/* Larger n: each thread takes tiles of weight rows - read in place when
 * f32/f16/bf16, dequantized into its slice of the scratch when f8 or 4-bit -
 * and multiplies every row of x by each. */
static dj_status matmul_tiled(dj_cpu_backend *cb, const dj_op_call *c) {
    const uint32_t k = c->k, m = c->m, nt = (uint32_t)cb->n_threads;
    const dj__cpu_kernels *K = cb->kern;
    uint32_t tile = cb->tile_rows;
    if (tile == 0) {
        size_t t = TILE_TARGET_BYTES / ((size_t)k * sizeof(float));
        const uint32_t fair = (m + 2 * nt - 1) / (2 * nt); /* at least two tiles a thread */
        if (t > fair) t = fair;
        tile = t < 8 ? 8 : (uint32_t)t;
        if (tile > K->gemm_cols) tile = tile / K->gemm_cols * K->gemm_cols; /* whole register tiles */
    }
    if (tile > m) tile = m;
    const bool in_place = c->w_dtype == DJ_DTYPE_F32 || c->w_dtype == DJ_DTYPE_F16 || c->w_dtype == DJ_DTYPE_BF16;
    const size_t per_thread = (in_place ? 0 : (size_t)tile * tile_ld(k)) + (size_t)ROW_CHUNK * tile * DJ_CPU_LANES;
    dj_status st = grow_scratch(cb, per_thread * (size_t)cb->n_threads);
    if (st != DJ_OK) return st;
    tiled_job j = {K, c, cb->scratch, per_thread, c->x, k, tile, (m + tile - 1) / tile, in_place, 0};
    dj__cpu_pool_run(cb->pool, j.n_tiles < nt ? j.n_tiles : nt, tiled_task, &j);
    return DJ_OK;
}

void dj__cpu_fp8_row(float *dst, const uint8_t *src, const dj_op_call *c, uint32_t row) {
    const uint32_t bc = c->w_block_cols, per_row = (c->k + bc - 1) / bc;
    const float *sc = c->w_scale + (size_t)(row / c->w_block_rows) * per_row;
    for (uint32_t i = 0; i < c->k; i++) dst[i] = dj_f8e4m3_to_f32(src[i]) * sc[i / bc];
}

dj_status dj__cpu_matmul(dj_cpu_backend *cb, const dj_op_call *c) {
    if (c->w_dtype == DJ_DTYPE_F8_E4M3) { /* dequantized tile by tile, whatever n */
        if (!c->w_scale || !c->w_block_rows || !c->w_block_cols)
            return dj_fail(DJ_EINVAL, "matmul: f8_e4m3 weights without scales");
        return matmul_tiled(cb, c);
    }
    if (c->w_dtype == DJ_DTYPE_Q4) return matmul_tiled(cb, c); /* dequantized tile by tile, whatever n */
    if (c->n <= DJ_CPU_DOT_MAX_ROWS) {
        matmul_direct(cb, c);
        return DJ_OK;
    }
    return matmul_tiled(cb, c);
}
