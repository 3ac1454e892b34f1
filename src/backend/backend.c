/* backend.c: what every backend shares - the op names, releasing a backend
 * through its vtable and the argument checks of a call (element types from
 * the op table, op_table.c). */
#include "backend/backend_impl.h"
#include "djinn/op_table.h"
#include "djinn/sample_schema.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

const char *dj_op_name(dj_op op) {
    switch (op) {
#define DJ_OP_NAME_(e, name) \
    case DJ_OP_##e: return name;
        DJ_OP_LIST(DJ_OP_NAME_)
#undef DJ_OP_NAME_
    case DJ_OP_COUNT: return "none";
    }
    return "unknown";
}

bool dj_sample_row_carries(const dj_sampler_params *p) {
    /* the fields with a place in dj_sample_row: seed through the draw u, the
     * frequency and presence weights through the penalty entries */
#define DJ__AT(m) offsetof(dj_sampler_params, m)
    static const size_t carried[] = {DJ__AT(temperature),       DJ__AT(top_k),
                                     DJ__AT(top_p),             DJ__AT(seed),
                                     DJ__AT(min_p),             DJ__AT(repetition_penalty),
                                     DJ__AT(frequency_penalty), DJ__AT(presence_penalty)};
#undef DJ__AT
    for (size_t i = 0; i < dj_sample_n_fields; i++) {
        const dj_sample_field *f = &dj_sample_fields[i];
        bool known = false;
        for (size_t k = 0; k < sizeof carried / sizeof *carried && !known; k++) known = f->offset == carried[k];
        if (!known && dj_sample_field_f64(p, f) != f->def) return false;
    }
    return true;
}

void dj_backend_free(dj_backend_t *be) {
    if (be) be->vt->destroy(be);
}

size_t dj_kv_token_bytes(dj_dtype t, uint32_t n_kv_heads, uint32_t head_dim) {
    const size_t kv_dim = (size_t)n_kv_heads * head_dim;
    switch (t) {
    case DJ_DTYPE_F32:
    case DJ_DTYPE_BF16:
    case DJ_DTYPE_F16: return 2 * kv_dim * dj_dtype_size(t);
    case DJ_DTYPE_F8_E4M3: return 2 * kv_dim;
    default: return 0;
    }
}

size_t dj_kv_page_need(dj_dtype t, uint32_t n_kv_heads, uint32_t head_dim, uint32_t tokens) {
    return (size_t)tokens * dj_kv_token_bytes(t, n_kv_heads, head_dim) +
           (t == DJ_DTYPE_F8_E4M3 ? 2 * (size_t)n_kv_heads : 0);
}

uint32_t dj_kv_page_tokens(dj_dtype t, uint32_t n_kv_heads, uint32_t head_dim, size_t page_bytes) {
    const size_t token = dj_kv_token_bytes(t, n_kv_heads, head_dim), fixed = dj_kv_page_need(t, n_kv_heads, head_dim, 0);
    if (token == 0 || page_bytes < fixed + token) return 0;
    const size_t n = (page_bytes - fixed) / token;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

dj_status dj_backend_set_kv_dtype(dj_backend_t *be, dj_dtype t) {
    if (!be) return dj_fail(DJ_EINVAL, "dj_backend_set_kv_dtype: NULL backend");
    if (t != be->act_dtype && t != DJ_DTYPE_F8_E4M3)
        return dj_fail(DJ_EUNSUPPORTED, "the %s backend stores K/V as %s or f8_e4m3, not %s", be->vt->name,
                       dj_dtype_name(be->act_dtype), dj_dtype_name(t));
    be->kv_dtype = t;
    return DJ_OK;
}

#define REQUIRE(cond, ...)                                   \
    do {                                                     \
        if (!(cond)) return dj_fail(DJ_EINVAL, __VA_ARGS__); \
    } while (0)

static bool is_float_dtype(dj_dtype t) {
    return t == DJ_DTYPE_F32 || t == DJ_DTYPE_F16 || t == DJ_DTYPE_BF16;
}

/* True when [a, a+na) and [b, b+nb) (bytes) share memory. */
static bool overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + nb && pb < pa + na;
}

/* The K/V view and the positions [pos0, pos0+n) it must hold. */
static dj_status check_kv(const dj_op_call *c, const char *op, dj_dtype kvt, const char *backend) {
    const dj_kv_view *kv = c->kv;
    REQUIRE(kv, "%s: NULL kv view", op);
    REQUIRE(kv->seg_base && kv->block_table, "%s: kv view has a NULL segment base or block table", op);
    REQUIRE(kv->dtype == kvt, "%s: kv dtype %s, the %s backend stores %s", op, dj_dtype_name(kv->dtype), backend,
            dj_dtype_name(kvt));
    REQUIRE(kv->tokens_per_page > 0 && kv->kv_dim > 0, "%s: kv view has tokens_per_page=%u kv_dim=%u", op,
            kv->tokens_per_page, kv->kv_dim);
    const uint32_t heads = kv->n_kv_heads ? kv->n_kv_heads : 1;
    REQUIRE(kv->kv_dim % heads == 0 && (kvt != DJ_DTYPE_F8_E4M3 || kv->n_kv_heads),
            "%s: kv view of %u dims has %u heads (f8 K/V needs their count for its scales)", op, kv->kv_dim,
            kv->n_kv_heads);
    const uint64_t need = dj_kv_page_need(kvt, heads, kv->kv_dim / heads, kv->tokens_per_page);
    REQUIRE(kv->page_bytes >= need, "%s: page of %zu bytes cannot hold %u K and V rows of %u %s%s", op,
            kv->page_bytes, kv->tokens_per_page, kv->kv_dim, dj_dtype_name(kvt),
            kvt == DJ_DTYPE_F8_E4M3 ? " and their exponents" : "");
    REQUIRE(kv->page_bytes % 4 == 0 && (uintptr_t)kv->seg_base % 4 == 0,
            "%s: page size %zu and segment base must be multiples of 4 bytes", op, kv->page_bytes);
    REQUIRE(!c->row_tables || c->row_pos, "%s: per-row block tables need per-row positions", op);
    if (c->row_pos) return DJ_OK; /* the caller guarantees each row's position is mapped */
    const uint64_t end = (uint64_t)c->pos0 + c->n, cap = (uint64_t)kv->n_blocks * kv->tokens_per_page;
    if (end > cap || end > UINT32_MAX)
        return dj_fail(DJ_ERANGE, "%s: positions up to %llu need block %llu but only %u blocks are mapped", op,
                       (unsigned long long)(end - 1), (unsigned long long)((end - 1) / kv->tokens_per_page),
                       kv->n_blocks);
    return DJ_OK;
}

dj_status dj__op_call_check(const dj_op_call *c, dj_dtype act_t, dj_dtype kvt, const char *backend) {
    const char *op = dj_op_name(c->op);
    const size_t n = c->n, act = dj_dtype_size(act_t);
    REQUIRE(n > 0, "%s: zero token rows", op);
    const dj_op_desc *d = dj_op_desc_of(c->op);
    if (!d) return dj_fail(DJ_EUNSUPPORTED, "%s backend: unknown op %d", backend, (int)c->op);
    /* element types, as the op table says */
    switch ((dj_opd_out)d->out) {
    case DJ_OPD_OUT_NONE: break;
    case DJ_OPD_OUT_ACT:
        REQUIRE(c->out_dtype == act_t, "%s: out dtype %s, the %s backend writes %s activations", op,
                dj_dtype_name(c->out_dtype), backend, dj_dtype_name(act_t));
        break;
    case DJ_OPD_OUT_ACT_OR_F32:
    case DJ_OPD_OUT_RES:
        REQUIRE(c->out_dtype == act_t || c->out_dtype == DJ_DTYPE_F32,
                "%s: out dtype %s, the %s backend writes %s activations (or f32 from this op)", op,
                dj_dtype_name(c->out_dtype), backend, dj_dtype_name(act_t));
        break;
    case DJ_OPD_OUT_F32:
        REQUIRE(c->out_dtype == DJ_DTYPE_F32, "%s: out dtype %s, this op writes f32", op,
                dj_dtype_name(c->out_dtype));
        break;
    }
    if (d->x == DJ_OPD_X_RES)
        REQUIRE(c->x_dtype == act_t || c->x_dtype == DJ_DTYPE_F32,
                "%s: x dtype %s, the %s backend reads %s activations or an f32 residual stream", op,
                dj_dtype_name(c->x_dtype), backend, dj_dtype_name(act_t));
    /* what each op's shapes and pointers must satisfy (code: one case an op) */
    switch (c->op) {
    case DJ_OP_EMBED:
        REQUIRE(c->out && c->w && (c->ids || c->ids_dev), "%s: NULL out, table or ids", op);
        REQUIRE(c->d > 0 && c->m > 0, "%s: d=%u vocab(m)=%u must be positive", op, c->d, c->m);
        REQUIRE(is_float_dtype(c->w_dtype), "%s: table dtype %s is not a float type", op,
                dj_dtype_name(c->w_dtype));
        return DJ_OK;
    case DJ_OP_RMSNORM:
        REQUIRE(c->out && c->x && c->w, "%s: NULL out, x or weight", op);
        REQUIRE(c->d > 0, "%s: zero row width", op);
        REQUIRE(is_float_dtype(c->w_dtype), "%s: weight dtype %s is not a float type", op,
                dj_dtype_name(c->w_dtype));
        REQUIRE(c->eps >= 0.0f, "%s: eps %g is negative", op, (double)c->eps);
        REQUIRE(isfinite(c->w_offset), "%s: weight offset is not finite", op);
        REQUIRE(c->groups <= 1 || (uint64_t)c->d * c->groups <= UINT32_MAX, "%s: %u groups of %u overflow", op,
                c->groups, c->d);
        return DJ_OK;
    case DJ_OP_MATMUL:
        REQUIRE(c->out && c->x && c->w, "%s: NULL out, x or weight", op);
        REQUIRE(c->k > 0 && c->m > 0, "%s: k=%u m=%u must be positive", op, c->k, c->m);
        REQUIRE(!c->out_rows || c->out_rows >= c->n, "%s: out has room for %u rows, fewer than its n=%u", op,
                c->out_rows, c->n);
        REQUIRE(is_float_dtype(c->w_dtype) || c->w_dtype == DJ_DTYPE_F8_E4M3 ||
                    (c->w_dtype == DJ_DTYPE_Q4 && c->k % DJ_Q4_GROUP == 0),
                "%s: weight dtype %s is not a float type (or q4 with k=%u a multiple of %d)", op,
                dj_dtype_name(c->w_dtype), c->k, DJ_Q4_GROUP);
        REQUIRE(c->w_dtype != DJ_DTYPE_F8_E4M3 || (c->w_scale && c->w_block_rows && c->w_block_cols),
                "%s: f8_e4m3 weights without scales", op);
        REQUIRE(!c->ldw || (c->ldw >= c->k && is_float_dtype(c->w_dtype)),
                "%s: weight rows %u elements apart for k=%u of %s (want 0, or >= k with f32/f16/bf16)", op, c->ldw,
                c->k, dj_dtype_name(c->w_dtype));
        REQUIRE(!c->bias || is_float_dtype(c->bias_dtype), "%s: bias dtype %s is not a float type", op,
                dj_dtype_name(c->bias_dtype));
        REQUIRE(!overlaps(c->out, n * c->m * dj_dtype_size(c->out_dtype), c->x, n * c->k * act),
                "%s: out overlaps x", op);
        return DJ_OK;
    case DJ_OP_ROPE: {
        REQUIRE(c->out && c->x && (c->inv_freq || c->row_freq), "%s: NULL out, x or inv_freq", op);
        REQUIRE(c->n_heads > 0 && c->head_dim > 0 && c->head_dim % 2 == 0,
                "%s: n_heads=%u head_dim=%u (need heads > 0, even head_dim)", op, c->n_heads, c->head_dim);
        REQUIRE(c->scale > 0.0f && isfinite(c->scale), "%s: scale %g must be positive (1 = no scaling)", op,
                (double)c->scale);
        REQUIRE(c->rot_dim % 2 == 0 && c->rot_dim <= c->head_dim, "%s: rot_dim %u must be even and <= head_dim %u",
                op, c->rot_dim, c->head_dim);
        const size_t bytes = n * c->n_heads * c->head_dim * act;
        REQUIRE(c->out == c->x || !overlaps(c->out, bytes, c->x, bytes), "%s: out partly overlaps x", op);
        return DJ_OK;
    }
    case DJ_OP_KV_WRITE:
        REQUIRE(c->x && c->x2, "%s: NULL k or v", op);
        return check_kv(c, op, kvt, backend);
    case DJ_OP_ATTENTION: {
        REQUIRE(c->out && c->x, "%s: NULL out or q", op);
        REQUIRE(c->n_heads > 0 && c->n_kv_heads > 0 && c->head_dim > 0, "%s: n_heads=%u n_kv_heads=%u head_dim=%u",
                op, c->n_heads, c->n_kv_heads, c->head_dim);
        REQUIRE(c->n_heads % c->n_kv_heads == 0, "%s: %u query heads do not divide into %u kv heads", op,
                c->n_heads, c->n_kv_heads);
        REQUIRE(isfinite(c->scale), "%s: scale is not finite", op);
        REQUIRE(c->softcap >= 0.0f && isfinite(c->softcap), "%s: softcap %g must be 0 (none) or positive", op,
                (double)c->softcap);
        dj_status st = check_kv(c, op, kvt, backend);
        if (st != DJ_OK) return st;
        REQUIRE(c->kv->kv_dim == c->n_kv_heads * c->head_dim, "%s: kv_dim %u != n_kv_heads %u * head_dim %u", op,
                c->kv->kv_dim, c->n_kv_heads, c->head_dim);
        const size_t bytes = n * c->n_heads * c->head_dim * act;
        REQUIRE(!overlaps(c->out, bytes, c->x, bytes), "%s: out overlaps q", op);
        return DJ_OK;
    }
    case DJ_OP_SILU_MUL:
    case DJ_OP_GELU_MUL:
    case DJ_OP_ADD:
        REQUIRE(c->out && c->x && c->x2, "%s: NULL out or input", op);
        REQUIRE(c->d > 0, "%s: zero row width", op);
        return DJ_OK;
    case DJ_OP_SOFTCAP:
        REQUIRE(c->out && c->x, "%s: NULL out or input", op);
        REQUIRE(c->d > 0, "%s: zero row width", op);
        REQUIRE(c->softcap > 0.0f && isfinite(c->softcap), "%s: softcap %g must be positive", op,
                (double)c->softcap);
        REQUIRE(c->out == c->x || !overlaps(c->out, n * c->d * 4, c->x, n * c->d * 4), "%s: out partly overlaps x",
                op);
        return DJ_OK;
    case DJ_OP_MOE_ROUTE:
        REQUIRE(c->out && c->x, "%s: NULL out or router logits", op);
        REQUIRE(c->m > 0 && c->top_k > 0 && c->top_k <= c->m, "%s: top_k %u of %u experts", op, c->top_k, c->m);
        REQUIRE(!overlaps(c->out, n * c->m * 4, c->x, n * c->m * act), "%s: out overlaps x", op);
        return DJ_OK;
    case DJ_OP_MOE_FFN:
        REQUIRE(c->out && c->x && c->route && c->w && c->w_up && c->w_down, "%s: NULL out, x, route or weight", op);
        REQUIRE(c->k > 0 && c->d > 0 && c->m > 0 && c->expert < c->m, "%s: k=%u d=%u expert %u of m=%u", op, c->k,
                c->d, c->expert, c->m);
        REQUIRE(is_float_dtype(c->w_dtype), "%s: weight dtype %s is not a float type", op,
                dj_dtype_name(c->w_dtype));
        REQUIRE(!overlaps(c->out, n * c->k * act, c->x, n * c->k * act), "%s: out overlaps x", op);
        REQUIRE(!c->x2 || c->x2 == c->out || !overlaps(c->out, n * c->k * act, c->x2, n * c->k * act),
                "%s: out partly overlaps the sum so far", op);
        return DJ_OK;
    case DJ_OP_LORA:
        REQUIRE(c->out && c->x && c->lora_row && (c->lora || !c->n_lora), "%s: NULL out, x, rows or adapters", op);
        REQUIRE(c->k > 0 && c->m > 0, "%s: k=%u m=%u must be positive", op, c->k, c->m);
        for (uint32_t a = 0; a < c->n_lora; a++) {
            const dj_lora_mat *l = &c->lora[a];
            if (!l->a) continue;
            REQUIRE(l->b && l->rank > 0 && l->rank <= DJ_LORA_MAX_RANK && l->ldb >= l->rank && isfinite(l->scale),
                    "%s: adapter %u: rank %u (1..%d), ldb %u, scale %g", op, a, l->rank, DJ_LORA_MAX_RANK, l->ldb,
                    (double)l->scale);
        }
        for (uint32_t i = 0; i < c->n; i++)
            REQUIRE(c->lora_row[i] >= -1 && c->lora_row[i] < (int32_t)c->n_lora, "%s: row %u names adapter %d of %u",
                    op, i, c->lora_row[i], c->n_lora);
        REQUIRE(!overlaps(c->out, n * c->m * act, c->x, n * c->k * act), "%s: out overlaps x", op);
        return DJ_OK;
    case DJ_OP_COUNT: break; /* refused above */
    }
    return dj_fail(DJ_EUNSUPPORTED, "%s backend: unknown op %d", backend, (int)c->op);
}
