/* cpu_backend.c: the CPU backend - host memory as device memory, the compute
 * switch with its argument checks, and the elementwise/row ops (on the pool). */
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend/backend_impl.h"
#include "djinn/pick.h"
#include "backend/cpu/cpu_impl.h"

#define CPU_ALIGN 4096
#define CPU_HUGE ((size_t)2 << 20)

/* ---- memory ---- */

static dj_status cpu_alloc(dj_backend_t *be, size_t bytes, void **out) {
    (void)be;
    if (!out) return dj_fail(DJ_EINVAL, "cpu alloc: NULL output pointer");
    *out = NULL;
    if (bytes == 0) return dj_fail(DJ_EINVAL, "cpu alloc: zero bytes requested");
    void *p = NULL;
    /* Large areas (the VMU) start on a 2 MiB boundary and ask for huge pages:
     * decode streams every weight byte per token, and 4 KiB pages make that a
     * TLB walk every 4 KiB. Without transparent huge pages it is a no-op. */
    const size_t align = bytes >= CPU_HUGE ? CPU_HUGE : CPU_ALIGN;
    if (posix_memalign(&p, align, bytes) != 0 || !p)
        return dj_fail(DJ_ENOMEM, "cpu alloc: cannot allocate %zu bytes (%.2f GiB)", bytes,
                       (double)bytes / (1024.0 * 1024.0 * 1024.0));
#ifdef MADV_HUGEPAGE
    if (bytes >= CPU_HUGE) madvise(p, bytes - bytes % CPU_HUGE, MADV_HUGEPAGE);
#endif
    *out = p;
    return DJ_OK;
}

static void cpu_free(dj_backend_t *be, void *ptr) {
    (void)be;
    free(ptr);
}

static dj_status cpu_copy(void *dst, const void *src, size_t bytes, const char *what) {
    if (bytes == 0) return DJ_OK;
    if (!dst || !src) return dj_fail(DJ_EINVAL, "cpu %s: NULL pointer for %zu bytes", what, bytes);
    memmove(dst, src, bytes);
    return DJ_OK;
}

static dj_status cpu_upload(dj_backend_t *be, void *dst_dev, const void *src_host, size_t bytes) {
    (void)be;
    return cpu_copy(dst_dev, src_host, bytes, "upload");
}

static dj_status cpu_download(dj_backend_t *be, void *dst_host, const void *src_dev, size_t bytes) {
    (void)be;
    return cpu_copy(dst_host, src_dev, bytes, "download");
}

static dj_status cpu_copy_dev(dj_backend_t *be, void *dst_dev, const void *src_dev, size_t bytes) {
    (void)be;
    return cpu_copy(dst_dev, src_dev, bytes, "copy");
}

static dj_status cpu_sync(dj_backend_t *be) {
    (void)be;
    return DJ_OK;
}

/* ---- row and elementwise ops ---- */

static void embed_rows(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const dj_op_call *c = ctx;
    const uint32_t d = c->d;
    const int32_t *ids = c->ids ? c->ids : c->ids_dev;
    const size_t row_bytes = (size_t)d * dj_dtype_size(c->w_dtype);
    for (size_t i = lo; i < hi; i++) {
        float *o = (float *)c->out + i * d;
        dj__cpu_to_f32(o, (const uint8_t *)c->w + (size_t)ids[i] * row_bytes, c->w_dtype, d);
        if (c->scale != 0.0f) /* Gemma: times sqrt(hidden) */
            for (uint32_t j = 0; j < d; j++) o[j] *= c->scale;
    }
}

static dj_status op_embed(dj_cpu_backend *cb, const dj_op_call *c) {
    const uint32_t n = c->n, vocab = c->m;
    const int32_t *ids = c->ids ? c->ids : c->ids_dev;
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab)
            return dj_fail(DJ_ERANGE, "embed: token id %d at row %u is outside the vocabulary [0, %u)",
                           (int)ids[i], i, vocab);
    dj__cpu_pool_for(cb->pool, n, 1, embed_rows, (void *)c);
    return DJ_OK;
}

/* As LlamaRMSNorm in f32: x * rsqrt(mean(x^2) + eps), then times the weight
 * (plus w_offset: Gemma's 1 + w); each d-wide group of a row alone (groups:
 * per-head q/k norm). */
static void rmsnorm_rows(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const dj_op_call *c = ctx;
    const uint32_t d = c->d;
    enum { CHUNK = 256 };
    for (size_t i = lo; i < hi; i++) {
        const float *x = (const float *)c->x + (size_t)i * d;
        float *o = (float *)c->out + (size_t)i * d;
        const float r = 1.0f / sqrtf(dj__cpu_dot(x, x, d) / (float)d + c->eps);
        float wbuf[CHUNK];
        for (uint32_t j0 = 0; j0 < d; j0 += CHUNK) {
            uint32_t len = d - j0 < CHUNK ? d - j0 : CHUNK;
            dj__cpu_to_f32(wbuf, (const uint8_t *)c->w + (size_t)j0 * dj_dtype_size(c->w_dtype), c->w_dtype,
                           len);
            if (c->w_offset != 0.0f)
                for (uint32_t j = 0; j < len; j++) wbuf[j] += c->w_offset;
            for (uint32_t j = 0; j < len; j++) o[j0 + j] = wbuf[j] * (x[j0 + j] * r);
        }
    }
}

static dj_status op_rmsnorm(dj_cpu_backend *cb, const dj_op_call *c) {
    const size_t n = (size_t)c->n * (c->groups > 1 ? c->groups : 1);
    /* rows a task: about 16K elements (per-head groups are short) */
    dj__cpu_pool_for(cb->pool, n, c->d >= 16384 ? 1 : 16384 / c->d, rmsnorm_rows, (void *)c);
    return DJ_OK;
}

/* HF rotate_half: angle = inv_freq[j] * p in f32 (the row's row_freq table
 * where given), cos/sin in f32, both times attention_scaling; pairs (j, j +
 * rot/2) of the first rot dims of each head (rot_dim, or all of it), the rest
 * passed through. In place allowed. */
static void rope_rows(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const dj_op_call *c = ctx;
    const uint32_t nh = c->n_heads, hd = c->head_dim;
    const uint32_t rot = c->rot_dim ? c->rot_dim : hd, half = rot / 2;
    const size_t row = (size_t)nh * hd;
    for (size_t i = lo; i < hi; i++) {
        const float p = (float)(c->row_pos ? c->row_pos[i] : c->pos0 + (uint32_t)i);
        const float *x = (const float *)c->x + i * row;
        float *o = (float *)c->out + i * row;
        const float *freq = c->row_freq ? c->row_freq[i] : c->inv_freq;
        for (uint32_t j = 0; j < half; j++) {
            const float theta = freq[j] * p;
            const float cs = cosf(theta) * c->scale, sn = sinf(theta) * c->scale;
            for (uint32_t h = 0; h < nh; h++) {
                const float x1 = x[(size_t)h * hd + j], x2 = x[(size_t)h * hd + j + half];
                o[(size_t)h * hd + j] = x1 * cs - x2 * sn;
                o[(size_t)h * hd + j + half] = x2 * cs + x1 * sn;
            }
        }
        if (rot < hd && o != x)
            for (uint32_t h = 0; h < nh; h++)
                memcpy(o + (size_t)h * hd + rot, x + (size_t)h * hd + rot, (size_t)(hd - rot) * sizeof *o);
    }
}

static dj_status op_rope(dj_cpu_backend *cb, const dj_op_call *c) {
    dj__cpu_pool_for(cb->pool, c->n, 1, rope_rows, (void *)c);
    return DJ_OK;
}

/* A KV_WRITE row's position and block table. */
static uint32_t kvw_pos(const dj_op_call *c, uint32_t i) { return c->row_pos ? c->row_pos[i] : c->pos0 + i; }
static const uint32_t *kvw_table(const dj_op_call *c, uint32_t i) {
    return c->row_tables ? c->row_tables[i] : c->kv->block_table;
}

/* The end of the group of rows from i (backend.h: the rows of one page in
 * one call - same table, same block, consecutive positions). */
static uint32_t kvw_group_end(const dj_op_call *c, uint32_t tpp, uint32_t i) {
    const uint32_t p = kvw_pos(c, i);
    const uint32_t *t = kvw_table(c, i);
    uint32_t j = i + 1;
    while (j < c->n && kvw_table(c, j) == t && kvw_pos(c, j) == p + (j - i) && kvw_pos(c, j) / tpp == p / tpp) j++;
    return j;
}

/* Rows [i, end) of one page into its f8 codes, K (is_v 0) or V: per head,
 * the page's exponent raised to what the rows need, the rows it held before
 * (r0 of them) re-encoded at a raised one (backend.h: the f8 K/V layout). */
static void f8_group(const float *x, uint32_t rows, uint32_t r0, uint32_t nkv, uint32_t hd, size_t tpp, int is_v,
                     uint8_t *page) {
    const size_t kvd = (size_t)nkv * hd;
    uint8_t *codes = page + (is_v ? tpp : 0) * kvd;
    int8_t *exps = (int8_t *)(page + dj_kv_f8_exps_at((uint32_t)tpp, (uint32_t)kvd)) + (is_v ? nkv : 0);
    for (uint32_t h = 0; h < nkv; h++) {
        float amax = 0.0f;
        for (uint32_t i = 0; i < rows; i++)
            for (uint32_t e = 0; e < hd; e++) amax = fmaxf(amax, fabsf(x[i * kvd + (size_t)h * hd + e]));
        int s = dj_kv_f8_exp(amax);
        if (r0 > 0) {
            const int old = exps[h];
            if (old >= s) s = old;
            else
                for (uint32_t r = 0; r < r0; r++)
                    for (uint32_t e = 0; e < hd; e++) {
                        uint8_t *cd = codes + r * kvd + (size_t)h * hd + e;
                        *cd = dj_f32_to_f8e4m3(ldexpf(dj_f8e4m3_to_f32(*cd), old - s));
                    }
        }
        for (uint32_t i = 0; i < rows; i++)
            for (uint32_t e = 0; e < hd; e++)
                codes[(r0 + i) * kvd + (size_t)h * hd + e] = dj_f32_to_f8e4m3(ldexpf(x[i * kvd + (size_t)h * hd + e], -s));
        exps[h] = (int8_t)s;
    }
}

static dj_status op_kv_write(dj_cpu_backend *cb, const dj_op_call *c) {
    (void)cb;
    const dj_kv_view *kv = c->kv;
    const size_t tpp = kv->tokens_per_page, kvd = kv->kv_dim;
    const bool f8 = kv->dtype == DJ_DTYPE_F8_E4M3;
    const size_t row_bytes = kvd * (f8 ? 1 : sizeof(float));
    for (uint32_t i = 0; i < c->n;) {
        const uint32_t p = kvw_pos(c, i), end = f8 ? kvw_group_end(c, (uint32_t)tpp, i) : i + 1;
        uint8_t *page = kv->seg_base + (size_t)kvw_table(c, i)[p / tpp] * kv->page_bytes;
        const size_t r = p % tpp;
        const float *k = (const float *)c->x + (size_t)i * kvd, *v = (const float *)c->x2 + (size_t)i * kvd;
        if (f8) {
            const uint32_t nkv = kv->n_kv_heads, hd = (uint32_t)(kvd / nkv);
            f8_group(k, end - i, (uint32_t)r, nkv, hd, tpp, 0, page);
            f8_group(v, end - i, (uint32_t)r, nkv, hd, tpp, 1, page);
        } else {
            memcpy(page + r * row_bytes, k, row_bytes);
            memcpy(page + (tpp + r) * row_bytes, v, row_bytes);
        }
        i = end;
    }
    return DJ_OK;
}

static void silu_mul_range(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const dj_op_call *c = ctx;
    const float *gate = c->x, *up = c->x2;
    float *out = c->out;
    float e[256];
    for (size_t i0 = lo; i0 < hi; i0 += 256) {
        const uint32_t cnt = hi - i0 < 256 ? (uint32_t)(hi - i0) : 256;
        for (uint32_t i = 0; i < cnt; i++) e[i] = -gate[i0 + i];
        dj__cpu_exp_block(e, e, cnt); /* expf(-g), four at a time */
        for (uint32_t i = 0; i < cnt; i++) out[i0 + i] = gate[i0 + i] / (1.0f + e[i]) * up[i0 + i];
    }
}

static dj_status op_silu_mul(dj_cpu_backend *cb, const dj_op_call *c) {
    dj__cpu_pool_for(cb->pool, (size_t)c->n * c->d, 16384, silu_mul_range, (void *)c);
    return DJ_OK;
}

static void add_range(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const dj_op_call *c = ctx;
    const float *a = c->x, *b = c->x2;
    float *out = c->out;
    for (size_t i = lo; i < hi; i++) out[i] = a[i] + b[i];
}

static dj_status op_add(dj_cpu_backend *cb, const dj_op_call *c) {
    dj__cpu_pool_for(cb->pool, (size_t)c->n * c->d, 65536, add_range, (void *)c);
    return DJ_OK;
}

static dj_status cpu_compute(dj_backend_t *be, const dj_op_call *c) {
    dj_cpu_backend *cb = (dj_cpu_backend *)be;
    if (!c) return dj_fail(DJ_EINVAL, "cpu compute: NULL call");
    dj_status st = dj__op_call_check(c, DJ_DTYPE_F32, cb->base.kv_dtype, "cpu");
    if (st != DJ_OK) return st;
    switch (c->op) {
    case DJ_OP_EMBED: return op_embed(cb, c);
    case DJ_OP_RMSNORM: return op_rmsnorm(cb, c);
    case DJ_OP_MATMUL: return dj__cpu_matmul(cb, c);
    case DJ_OP_ROPE: return op_rope(cb, c);
    case DJ_OP_KV_WRITE: return op_kv_write(cb, c);
    case DJ_OP_ATTENTION: return dj__cpu_attention(cb, c);
    case DJ_OP_SILU_MUL: return op_silu_mul(cb, c);
    case DJ_OP_ADD: return op_add(cb, c);
    case DJ_OP_GELU_MUL: return dj__cpu_gelu_mul(cb, c);
    case DJ_OP_SOFTCAP: return dj__cpu_softcap(cb, c);
    case DJ_OP_MOE_ROUTE: return dj__cpu_moe_route(cb, c);
    case DJ_OP_MOE_FFN: return dj__cpu_moe_ffn(cb, c);
    case DJ_OP_LORA: return dj__cpu_lora(cb, c);
    case DJ_OP_COUNT: break;
    }
    return dj_fail(DJ_EUNSUPPORTED, "cpu backend: unknown op %d", (int)c->op);
}

/* ---- lifetime ---- */

/* out[i] = argmax of row i, lowest id on ties (as dj_argmax). */
static dj_status cpu_argmax(dj_backend_t *be, const float *logits, uint32_t n, uint32_t vocab, int32_t *out) {
    (void)be;
    if (!logits || !out || vocab == 0) return dj_fail(DJ_EINVAL, "cpu argmax: NULL pointer or empty rows");
    for (uint32_t i = 0; i < n; i++) {
        const float *row = logits + (size_t)i * vocab;
        uint32_t best = 0;
        for (uint32_t j = 1; j < vocab; j++)
            if (row[j] > row[best]) best = j;
        out[i] = (int32_t)best;
    }
    return DJ_OK;
}

static void cpu_destroy(dj_backend_t *be) {
    dj_cpu_backend *cb = (dj_cpu_backend *)be;
    dj__cpu_pool_free(cb->pool);
    free(cb->scratch);
    dj_pick_scratch_free(&cb->pick);
    free(cb);
}

/* out[i] = dj_pick of row i with rows[i]'s rule, penalties and draw: the host
 * rule itself, so an engine picking through this hook chooses exactly what
 * its host samplers would. The scratch is the backend's, grown to the
 * largest vocabulary seen. */
static dj_status cpu_sample(dj_backend_t *be, const float *logits, uint32_t n, uint32_t vocab,
                            const dj_sample_row *rows, int32_t *out) {
    dj_cpu_backend *cb = (dj_cpu_backend *)be;
    if (!logits || !rows || !out || vocab == 0) return dj_fail(DJ_EINVAL, "cpu sample: NULL pointer or empty rows");
    for (uint32_t i = 0; i < n; i++) {
        if (!(rows[i].u >= 0.0 && rows[i].u < 1.0))
            return dj_fail(DJ_EINVAL, "cpu sample: row %u has u %g outside [0, 1)", i, rows[i].u);
        for (uint32_t k = 0; k < rows[i].n_pen; k++)
            if (!rows[i].pen || rows[i].pen[k].id < 0 || (uint32_t)rows[i].pen[k].id >= vocab)
                return dj_fail(DJ_EINVAL, "cpu sample: row %u penalises an id outside [0, %u)", i, vocab);
        const dj_pick_rule r = {.temperature = rows[i].temperature, .top_k = rows[i].top_k,
                                .top_p = rows[i].top_p, .min_p = rows[i].min_p,
                                .repetition_penalty = rows[i].repetition_penalty};
        dj_status st = dj_pick_rule_check(&r);
        if (st == DJ_OK) st = dj_pick_scratch_reserve(&cb->pick, vocab);
        if (st != DJ_OK) return st;
        out[i] = dj_pick(&r, logits + (size_t)i * vocab, vocab, rows[i].u, rows[i].pen, rows[i].n_pen, &cb->pick);
    }
    return DJ_OK;
}

/* The mask hook on host memory: the reference the CUDA kernel is checked
 * against (gpu_check) and what a CPU engine's masked rows go through. */
static dj_status cpu_mask(dj_backend_t *be, float *logits, uint32_t n, uint32_t vocab, const dj_mask_row *rows) {
    (void)be;
    if (!logits || !rows || vocab == 0) return dj_fail(DJ_EINVAL, "cpu mask: NULL pointer or empty rows");
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < rows[i].n_bias; k++)
            if (!rows[i].bias || rows[i].bias[k].id < 0 || (uint32_t)rows[i].bias[k].id >= vocab)
                return dj_fail(DJ_EINVAL, "cpu mask: row %u biases an id outside [0, %u)", i, vocab);
    for (uint32_t i = 0; i < n; i++) {
        float *row = logits + (size_t)i * vocab;
        if (rows[i].allowed)
            for (uint32_t j = 0; j < vocab; j++)
                if (!rows[i].allowed[j]) row[j] = -INFINITY;
        for (uint32_t k = 0; k < rows[i].n_bias; k++) row[rows[i].bias[k].id] += rows[i].bias[k].bias;
    }
    return DJ_OK;
}

/* The step in order, op by op (the reference does not fuse). */
static dj_status cpu_compute_plan(dj_backend_t *be, const dj_op_call *calls, size_t n, const void *plan_key,
                                  const dj_stream_step *stream) {
    (void)plan_key;
    if (n && !calls) return dj_fail(DJ_EINVAL, "cpu compute_plan: NULL calls");
    if (stream) return dj__cpu_compute_streamed(be, calls, n, stream);
    for (size_t i = 0; i < n; i++) {
        const dj_status st = cpu_compute(be, &calls[i]);
        if (st != DJ_OK) return st;
    }
    return DJ_OK;
}

static const dj_backend_vtbl cpu_vtbl = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .compute = cpu_compute,
    .sync = cpu_sync,
    .destroy = cpu_destroy,
    .upload_async = cpu_upload,
    .argmax = cpu_argmax,
    .sample = cpu_sample,
    .mask = cpu_mask,
    .compute_plan = cpu_compute_plan,
    .upload_weights = cpu_upload, /* a memcpy: any thread */
    .ring_new = dj__cpu_ring_new,
    .ring_free = dj__cpu_ring_free,
    .copy = cpu_copy_dev,
};

dj_status dj_backend_cpu_new(int n_threads, dj_backend_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "cpu backend: NULL output pointer");
    *out = NULL;
    if (n_threads < 0) return dj_fail(DJ_EINVAL, "cpu backend: n_threads %d is negative", n_threads);
    dj_cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return dj_fail(DJ_ENOMEM, "cpu backend: cannot allocate %zu bytes", sizeof *cb);
    cb->base.vt = &cpu_vtbl;
    cb->base.kv_dtype = DJ_DTYPE_F32;
    cb->base.act_dtype = DJ_DTYPE_F32;
    cb->base.res_dtype = DJ_DTYPE_F32;
    cb->base.host_memory = true;
    cb->n_threads = n_threads > 0 ? n_threads : omp_get_max_threads();
    cb->isa = dj__cpu_isa_best();
    cb->kern = dj__cpu_kernels_for(cb->isa);
    const dj_status st = dj__cpu_pool_new(cb->n_threads, &cb->pool);
    if (st != DJ_OK) {
        free(cb);
        return st;
    }
    *out = &cb->base;
    return DJ_OK;
}

void dj__cpu_set_tile_rows(dj_backend_t *be, uint32_t rows) {
    ((dj_cpu_backend *)be)->tile_rows = rows;
}

dj_status dj__cpu_set_isa(dj_backend_t *be, dj_cpu_isa isa) {
    const dj__cpu_kernels *k = (unsigned)isa < DJ_CPU_ISA_COUNT ? dj__cpu_kernels_for(isa) : NULL;
    if (!k) return dj_fail(DJ_EUNSUPPORTED, "cpu backend: instruction set %d is not available here", (int)isa);
    dj_cpu_backend *cb = (dj_cpu_backend *)be;
    cb->isa = isa;
    cb->kern = k;
    return DJ_OK;
}
