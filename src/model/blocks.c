/* blocks.c: what every architecture builds from - binding its tensor names
 * to weight slots, the computed RoPE tables, the step's graph around its
 * layers (embedding, final norm, logits, soft-cap) and the shared blocks
 * (norm, attention with its variants, GLU MLP, mixture of experts). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

/* ---- weights ---- */

static int64_t dim(const dj_model_config *c, dj_dim d) {
    const int64_t hd = c->head_dim, qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd;
    switch (d) {
    case DJ_DIM_NONE: return 0;
    case DJ_DIM_D: return c->hidden_size;
    case DJ_DIM_F: return c->intermediate_size;
    case DJ_DIM_2F: return 2 * (int64_t)c->intermediate_size;
    case DJ_DIM_HD: return hd;
    case DJ_DIM_QD: return qd;
    case DJ_DIM_KVD: return kvd;
    case DJ_DIM_QKVD: return qd + 2 * kvd;
    case DJ_DIM_QKD: return qd + kvd;
    case DJ_DIM_V: return c->vocab_size;
    case DJ_DIM_E: return c->n_experts;
    }
    return 0;
}

static bool bound_when(const dj_model_config *c, dj_bind_when when) {
    switch (when) {
    case DJ_BIND_ALWAYS: return true;
    case DJ_BIND_IF_ATTN_BIAS: return c->attention_bias;
    case DJ_BIND_IF_MLP_BIAS: return c->mlp_bias;
    case DJ_BIND_IF_UNTIED: return !c->tie_word_embeddings;
    }
    return false;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* The scales of f8_e4m3 tensor t (the slot: rows [row0, row0 + nrows)), as
 * the config's method stores them: "<name>_scale_inv" (transformers fp8) or
 * "<name>_scale" (compressed-tensors "<module>.weight_scale"). */
static dj_status bind_scales(const dj_model_config *c, const dj_checkpoint_t *ck, dj_weight *w, const char *name,
                             const dj_tensor_info *t, int64_t row0, int64_t nrows) {
    if (c->quant == DJ_QUANT_NONE)
        return dj_fail(DJ_EUNSUPPORTED,
                       "tensor '%s' is f8_e4m3 but config.json has no quantization_config saying how it is scaled",
                       name);
    char sn[224];
    snprintf(sn, sizeof sn, "%s%s", name, c->quant == DJ_QUANT_FP8 ? "_scale_inv" : "_scale");
    const dj_tensor_info *s = dj_checkpoint_find(ck, sn);
    if (!s) return dj_fail(DJ_ENOTFOUND, "f8_e4m3 tensor '%s' has no scales '%s'", name, sn);
    if (s->dtype != DJ_DTYPE_F32 && s->dtype != DJ_DTYPE_BF16 && s->dtype != DJ_DTYPE_F16)
        return dj_fail(DJ_EUNSUPPORTED, "scales '%s' have dtype %s; f32, f16 or bf16 expected", sn,
                       dj_dtype_name(s->dtype));
    const int64_t R = t->shape[0], C = t->shape[1];
    int64_t count = 1;
    for (int i = 0; i < s->ndim; i++) count *= s->shape[i];
    const int64_t b0 = c->quant_block[0], b1 = c->quant_block[1];
    int64_t br, bc;
    if (b0 && s->ndim == 2 && s->shape[0] == ceil_div(R, b0) && s->shape[1] == ceil_div(C, b1) &&
        (c->quant == DJ_QUANT_FP8 || b0 > 1 || b1 > 1)) { /* blocks */
        br = b0;
        bc = b1;
    } else if (c->quant == DJ_QUANT_CT_FP8 && count == 1 && s->ndim <= 2) { /* per tensor */
        br = nrows;
        bc = C;
    } else if (c->quant == DJ_QUANT_CT_FP8 && s->shape[0] == R && (s->ndim == 1 || (s->ndim == 2 && s->shape[1] == 1))) {
        br = 1; /* per channel (output row) */
        bc = C;
    } else {
        char got[96] = "";
        size_t o = 0;
        for (int i = 0; i < s->ndim && o < sizeof got - 24; i++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%lld", i ? "," : "", (long long)s->shape[i]);
        return dj_fail(DJ_EFORMAT, "scales '%s' have shape [%s], which fits no scaling of the %lldx%lld weight "
                                   "(quantization_config block %ux%u)",
                       sn, got, (long long)R, (long long)C, (unsigned)b0, (unsigned)b1);
    }
    if (br > 1 && br != nrows && row0 % br)
        return dj_fail(DJ_EUNSUPPORTED, "tensor '%s': a part from row %lld does not start on a %lld-row scale block",
                       name, (long long)row0, (long long)br);
    w->block[0] = (uint32_t)br;
    w->block[1] = (uint32_t)bc;
    w->scale_src = s;
    w->scale_row0 = br == nrows ? 0 : (size_t)(row0 / br);
    return DJ_OK;
}

/* The tensor `name` must have the shape [rows(, cols)]; the slot takes rows
 * [row0, row0 + nrows) of it. q_ok: a matmul weight, which may be f8_e4m3
 * with scales. */
static dj_status want(const dj_model_config *c, const dj_checkpoint_t *ck, dj_weight *w, char **name_slot,
                      const char *name, int64_t rows, int64_t cols, int64_t row0, int64_t nrows, bool q_ok) {
    const dj_tensor_info *t = dj_checkpoint_find(ck, name);
    if (!t) return dj_fail(DJ_ENOTFOUND, "checkpoint has no tensor '%s', which the architecture needs", name);
    int ndim = cols ? 2 : 1;
    bool ok = t->ndim == ndim && t->shape[0] == rows && (ndim == 1 || t->shape[1] == cols);
    if (!ok) {
        char got[96] = "";
        size_t o = 0;
        for (int i = 0; i < t->ndim && o < sizeof got - 24; i++)
            o += (size_t)snprintf(got + o, sizeof got - o, "%s%lld", i ? "," : "", (long long)t->shape[i]);
        if (ndim == 1)
            return dj_fail(DJ_EFORMAT, "tensor '%s' has shape [%s], expected [%lld]", name, got, (long long)rows);
        return dj_fail(DJ_EFORMAT, "tensor '%s' has shape [%s], expected [%lld,%lld]", name, got, (long long)rows,
                       (long long)cols);
    }
    memset(w, 0, sizeof *w);
    if (t->dtype == DJ_DTYPE_F8_E4M3) {
        if (!q_ok || !cols)
            return dj_fail(DJ_EUNSUPPORTED, "tensor '%s' is f8_e4m3, which only dense linear layers may be here", name);
        dj_status st = bind_scales(c, ck, w, name, t, row0, nrows);
        if (st != DJ_OK) return st;
    } else if (t->dtype == DJ_DTYPE_Q4) { /* repacked AWQ/GPTQ (src/model/quant4.c) */
        if (!q_ok || !cols)
            return dj_fail(DJ_EUNSUPPORTED, "tensor '%s' is 4-bit, which only dense linear layers may be here", name);
        /* a part of a fused tensor must be whole bands of it (djinn/dtype.h): as a
         * matrix of its own it is then banded as well */
        if (nrows != rows && (rows % DJ_Q4_BAND || row0 % DJ_Q4_BAND || nrows % DJ_Q4_BAND))
            return dj_fail(DJ_EUNSUPPORTED,
                           "tensor '%s' is 4-bit with %lld rows: its part of rows %lld..%lld is not whole %d-row "
                           "bands of it, which a part of a 4-bit tensor must be",
                           name, (long long)rows, (long long)row0, (long long)(row0 + nrows - 1), DJ_Q4_BAND);
    } else if (t->dtype != DJ_DTYPE_F32 && t->dtype != DJ_DTYPE_F16 && t->dtype != DJ_DTYPE_BF16) {
        return dj_fail(DJ_EUNSUPPORTED, "tensor '%s' has dtype %s; weights must be f32, f16 or bf16", name,
                       dj_dtype_name(t->dtype));
    }
    char *copy = strdup(name);
    if (!copy) return dj_fail(DJ_ENOMEM, "out of memory");
    *name_slot = copy;
    w->hf_name = copy;
    w->dtype = t->dtype;
    w->shape[0] = nrows;
    w->shape[1] = cols;
    w->src_offset = (size_t)row0 * dj_dtype_row_bytes(t->dtype, (size_t)(cols ? cols : 1));
    w->computed = DJ_COMPUTED_NONE;
    w->data = NULL;
    return DJ_OK;
}

static dj_status bind_one(const dj_model_config *c, const dj_checkpoint_t *ck, const dj_wname *e, int slot,
                          dj_weight *w, char **names, int layer, int expert) {
    if (!bound_when(c, e->when)) return DJ_OK;
    char nm[192];
    if (layer < 0) snprintf(nm, sizeof nm, "%s", e->fmt);
    else if (expert < 0) snprintf(nm, sizeof nm, e->fmt, layer);
    else snprintf(nm, sizeof nm, e->fmt, layer, expert);
    const int64_t rows = dim(c, e->rows);
    /* f8_e4m3 or 4-bit where the slot is a dense layer's matmul weight (MoE experts and
     * embeddings read their weights otherwise) */
    const bool q_ok = expert < 0 && (layer >= 0 ? e->slot == DJ_W_Q || e->slot == DJ_W_K || e->slot == DJ_W_V ||
                                                      e->slot == DJ_W_O || e->slot == DJ_W_GATE ||
                                                      e->slot == DJ_W_UP || e->slot == DJ_W_DOWN
                                                : e->slot == DJ_W_LM_HEAD);
    return want(c, ck, &w[slot], &names[slot], nm, rows, dim(c, e->cols), dim(c, e->row0),
                e->nrows == DJ_DIM_NONE ? rows : dim(c, e->nrows), q_ok);
}

static void computed(dj_weight *w, int kind, int64_t floats) {
    w->computed = kind;
    w->dtype = DJ_DTYPE_F32;
    w->shape[0] = floats;
    w->shape[1] = 0;
    w->hf_name = NULL;
}

dj_status dj__model_bind(const dj_model_config *c, const dj_checkpoint_t *ck, dj_weight *w, char **names) {
    const dj_arch_desc *a = dj__arch(c->arch);
    if (!a) return dj_fail(DJ_EINTERNAL, "architecture %d has no description", (int)c->arch);
    dj_status st;
    for (int l = 0; l < (int)c->n_layers; l++) {
        for (int i = 0; i < a->n_layer_names; i++) {
            const dj_wname *e = &a->layer_names[i];
            if ((st = bind_one(c, ck, e, dj__wslot_layer_c(c, l, e->slot), w, names, l, -1))) return st;
        }
        for (int x = 0; a->expert_names && x < (int)c->n_experts; x++)
            for (int i = 0; i < 3; i++) {
                const dj_wname *e = &a->expert_names[i];
                if ((st = bind_one(c, ck, e, dj__wslot_layer_c(c, l, DJ_W_EXPERT(x, e->slot)), w, names, l, x)))
                    return st;
            }
    }
    for (int i = 0; i < a->n_global_names; i++) {
        const dj_wname *e = &a->global_names[i];
        if ((st = bind_one(c, ck, e, dj__wslot_global(c, e->slot), w, names, -1, -1))) return st;
    }
    /* RoPE frequencies are computed, stored as f32 in the text segment. */
    computed(&w[dj__wslot_global(c, DJ_W_INV_FREQ)], DJ_COMPUTED_INV_FREQ, c->rope_dim / 2);
    if (c->rope_local_theta > 0.0f)
        computed(&w[dj__wslot_global(c, DJ_W_INV_FREQ_LOCAL)], DJ_COMPUTED_INV_FREQ_LOCAL, c->rope_dim / 2);
    if (c->rope_type == DJ_ROPE_LONGROPE)
        computed(&w[dj__wslot_global(c, DJ_W_INV_FREQ_LONG)], DJ_COMPUTED_INV_FREQ_LONG, c->rope_dim / 2);
    return DJ_OK;
}

/* ---- RoPE ---- */

void dj__rope_inv_freq(const dj_model_config *c, float theta, const float *ext, float *inv_freq) {
    const uint32_t half = c->rope_dim / 2;
    for (uint32_t j = 0; j < half; j++) {
        /* As transformers: exponent 2j/dim in f32, then base ** exponent. */
        float expo = (float)(2 * j) / (float)c->rope_dim;
        float base_pow = powf(theta, expo);
        float f = 1.0f / base_pow;
        if (c->rope_type == DJ_ROPE_LINEAR) {
            f = f / c->rope_factor;
        } else if (c->rope_type == DJ_ROPE_LLAMA3) {
            const float old_ctx = (float)c->rope_original_max_pos;
            const float low_wl = old_ctx / c->rope_low_freq_factor;
            const float high_wl = old_ctx / c->rope_high_freq_factor;
            const float wl = 2.0f * 3.14159265358979323846f / f;
            if (wl > low_wl) {
                f = f / c->rope_factor;
            } else if (!(wl < high_wl)) { /* medium: interpolate */
                float smooth = (old_ctx / wl - c->rope_low_freq_factor) /
                               (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0f - smooth) * f / c->rope_factor + smooth * f;
            }
        } else if (c->rope_type == DJ_ROPE_LONGROPE) {
            f = 1.0f / (ext[j] * base_pow); /* transformers: 1 / (ext * base ** expo) */
        }
        inv_freq[j] = f;
    }
}

void dj__model_fill_computed(const dj_model_config *c, const dj_weight *w, float *out) {
    if (w->computed == DJ_COMPUTED_INV_FREQ) {
        dj__rope_inv_freq(c, c->rope_theta, c->rope_ext_factor, out);
    } else if (w->computed == DJ_COMPUTED_INV_FREQ_LONG) {
        dj__rope_inv_freq(c, c->rope_theta, c->rope_long_factor, out);
    } else if (w->computed == DJ_COMPUTED_INV_FREQ_LOCAL) { /* the sliding layers' plain RoPE */
        dj_model_config local = *c;
        local.rope_type = DJ_ROPE_DEFAULT;
        dj__rope_inv_freq(&local, c->rope_local_theta, NULL, out);
    }
}

/* ---- graph nodes ---- */

static int add(dj_gb *b, dj_node *nd) {
    if (b->st != DJ_OK) return -1;
    nd->phase = b->phase;
    int idx = -1;
    b->st = dj_graph_add(b->g, nd, &idx);
    return idx;
}

static dj_node *node(dj_gb *b, int idx) { return idx >= 0 ? dj_graph_node(b->g, idx) : NULL; }

int dj__blk_weight(dj_gb *b, int slot, int layer, const char *what) {
    if (b->st != DJ_OK) return -1;
    const dj_weight *w = b->m ? &b->m->w[slot] : NULL;
    if (b->m && !w->data) return -1; /* optional weight absent (bias) */
    dj_node nd;
    memset(&nd, 0, sizeof nd);
    nd.op = DJ_OP_COUNT;
    nd.res = DJ_RES_WEIGHT;
    nd.layer = layer;
    nd.dtype = w ? w->dtype : DJ_DTYPE_F32;
    nd.ndim = w && w->shape[1] ? 2 : 1;
    nd.shape[0] = w ? w->shape[0] : 0;
    nd.shape[1] = w ? w->shape[1] : 0;
    nd.src[0] = nd.src[1] = nd.src[2] = nd.src[3] = -1;
    nd.weight_slot = slot;
    nd.bytes = w ? (double)w->shape[0] * (double)dj_dtype_row_bytes(w->dtype, (size_t)(w->shape[1] ? w->shape[1] : 1))
                 : 0;
    snprintf(nd.name, sizeof nd.name, "%s", what);
    return add(b, &nd);
}

static int act(dj_gb *b, dj_op op, int layer, int64_t rows, int64_t cols, int s0, int s1, int s2,
               const char *what) {
    dj_node nd;
    memset(&nd, 0, sizeof nd);
    nd.op = op;
    /* KV_WRITE stores into the session's pages: it owns no stack bytes. */
    nd.res = op == DJ_OP_KV_WRITE ? DJ_RES_KV : DJ_RES_ACTIVATION;
    nd.layer = layer;
    nd.dtype = DJ_DTYPE_F32;
    nd.ndim = 2;
    nd.shape[0] = rows;
    nd.shape[1] = cols;
    nd.src[0] = s0;
    nd.src[1] = s1;
    nd.src[2] = s2;
    nd.src[3] = -1;
    nd.weight_slot = -1;
    nd.params.op = op;
    nd.bytes = (double)(rows * cols) * 4.0;
    if (layer >= 0)
        snprintf(nd.name, sizeof nd.name, "l%d.%s", layer, what);
    else
        snprintf(nd.name, sizeof nd.name, "%s", what);
    return add(b, &nd);
}

/* Tags node idx as a named point (DJ_NODE_PT_*). */
static void point(dj_gb *b, int idx, unsigned tag) {
    dj_node *nd = node(b, idx);
    if (nd) nd->flags |= tag;
}

static int ls(const dj_gb *b, int l, int w) { return dj__wslot_layer_c(b->c, l, w); }

static int matmul(dj_gb *b, int layer, int x, int wslot, int bslot, int64_t k, int64_t m, const char *what) {
    int w = dj__blk_weight(b, wslot, layer, what);
    /* Without a model (planning only) biases are left out: they change no plan. */
    int bias = bslot >= 0 && b->m ? dj__blk_weight(b, bslot, layer, what) : -1;
    int idx = act(b, DJ_OP_MATMUL, layer, b->n, m, x, w, bias, what);
    dj_node *nd = node(b, idx);
    if (nd) {
        nd->params.k = (uint32_t)k;
        nd->params.m = (uint32_t)m;
        nd->flops = 2.0 * (double)b->n * (double)k * (double)m;
        nd->bytes += dj_graph_node(b->g, w)->bytes + (double)b->n * (double)k * 4.0;
    }
    return idx;
}

/* RMSNorm of x's rows in `groups` groups of d (the config's eps and offset). */
static int norm_groups(dj_gb *b, int l, int x, int wslot, uint32_t d, uint32_t groups, const char *what) {
    int w = dj__blk_weight(b, wslot, l, what);
    int idx = act(b, DJ_OP_RMSNORM, l, b->n, (int64_t)d * groups, x, w, -1, what);
    dj_node *nd = node(b, idx);
    if (nd) {
        nd->params.d = d;
        nd->params.eps = b->c->rms_norm_eps;
        nd->params.w_offset = b->c->norm_offset;
        nd->params.groups = groups > 1 ? groups : 0;
    }
    return idx;
}

int dj__blk_norm(dj_gb *b, int l, int x, int wslot, const char *what) {
    return norm_groups(b, l, x, wslot, b->c->hidden_size, 1, what);
}

int dj__blk_add(dj_gb *b, int l, int x, int y, const char *what) {
    int idx = act(b, DJ_OP_ADD, l, b->n, b->c->hidden_size, x, y, -1, what);
    if (node(b, idx)) node(b, idx)->params.d = b->c->hidden_size;
    return idx;
}

static int rope(dj_gb *b, int l, int x, int table, uint32_t heads, const char *what) {
    const dj_model_config *c = b->c;
    int idx = act(b, DJ_OP_ROPE, l, b->n, (int64_t)heads * c->head_dim, x, table, -1, what);
    dj_node *nd = node(b, idx);
    if (nd) {
        nd->params.n_heads = heads;
        nd->params.head_dim = c->head_dim;
        nd->params.scale = c->rope_attn_factor;
        nd->params.rot_dim = c->rope_dim == c->head_dim ? 0 : c->rope_dim;
    }
    return idx;
}

int dj__blk_attention(dj_gb *b, int l, int x) {
    const dj_model_config *c = b->c;
    const int64_t d = c->hidden_size, hd = c->head_dim;
    const int64_t qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd;
    int q = matmul(b, l, x, ls(b, l, DJ_W_Q), ls(b, l, DJ_W_QB), d, qd, "q_proj");
    int k = matmul(b, l, x, ls(b, l, DJ_W_K), ls(b, l, DJ_W_KB), d, kvd, "k_proj");
    int v = matmul(b, l, x, ls(b, l, DJ_W_V), ls(b, l, DJ_W_VB), d, kvd, "v_proj");
    if (c->qk_norm) {
        q = norm_groups(b, l, q, ls(b, l, DJ_W_Q_NORM), (uint32_t)hd, c->n_heads, "q_norm");
        k = norm_groups(b, l, k, ls(b, l, DJ_W_K_NORM), (uint32_t)hd, c->n_kv_heads, "k_norm");
    }
    const bool local = b->inv_freq_local >= 0 && dj__layer_is_sliding(c, (uint32_t)l);
    const int table = local ? b->inv_freq_local : b->inv_freq;
    int qr = rope(b, l, q, table, c->n_heads, "q_rope");
    int kr = rope(b, l, k, table, c->n_kv_heads, "k_rope");
    int kvw = act(b, DJ_OP_KV_WRITE, l, b->n, kvd, kr, v, -1, "kv_write");
    dj_node *kn = node(b, kvw);
    if (kn) {
        kn->params.n_kv_heads = c->n_kv_heads;
        kn->params.head_dim = (uint32_t)hd;
    }
    int att = act(b, DJ_OP_ATTENTION, l, b->n, qd, qr, kvw, -1, "attention");
    dj_node *an = node(b, att);
    if (an) {
        an->params.n_heads = c->n_heads;
        an->params.n_kv_heads = c->n_kv_heads;
        an->params.head_dim = (uint32_t)hd;
        an->params.window = dj__layer_window(c, (uint32_t)l);
        an->params.scale = c->attn_scale > 0.0f ? c->attn_scale : 1.0f / sqrtf((float)hd);
        an->params.softcap = c->attn_softcap;
    }
    return matmul(b, l, att, ls(b, l, DJ_W_O), ls(b, l, DJ_W_OB), qd, d, "o_proj");
}

int dj__blk_glu(dj_gb *b, int l, int x) {
    const dj_model_config *c = b->c;
    const int64_t d = c->hidden_size, f = c->intermediate_size;
    int gt = matmul(b, l, x, ls(b, l, DJ_W_GATE), ls(b, l, DJ_W_GATEB), d, f, "gate_proj");
    int up = matmul(b, l, x, ls(b, l, DJ_W_UP), ls(b, l, DJ_W_UPB), d, f, "up_proj");
    const bool gelu = c->hidden_act == DJ_ACT_GELU_TANH;
    int h = act(b, gelu ? DJ_OP_GELU_MUL : DJ_OP_SILU_MUL, l, b->n, f, gt, up, -1, gelu ? "gelu_mul" : "silu_mul");
    if (node(b, h)) node(b, h)->params.d = (uint32_t)f;
    return matmul(b, l, h, ls(b, l, DJ_W_DOWN), ls(b, l, DJ_W_DOWNB), f, d, "down_proj");
}

int dj__blk_moe(dj_gb *b, int l, int x) {
    const dj_model_config *c = b->c;
    const int64_t d = c->hidden_size, f = c->intermediate_size, E = c->n_experts;
    int logits = matmul(b, l, x, ls(b, l, DJ_W_ROUTER), -1, d, E, "router");
    int route = act(b, DJ_OP_MOE_ROUTE, l, b->n, E, logits, -1, -1, "moe_route");
    if (node(b, route)) {
        node(b, route)->params.m = (uint32_t)E;
        node(b, route)->params.top_k = c->n_experts_used;
    }
    int sum = -1;
    for (int e = 0; e < (int)E && b->st == DJ_OK; e++) {
        char what[32];
        snprintf(what, sizeof what, "expert%d", e);
        const int slot = ls(b, l, DJ_W_EXPERT(e, DJ_W_EXPERT_GATE));
        int gate = dj__blk_weight(b, slot, l, what);
        int y = act(b, DJ_OP_MOE_FFN, l, b->n, d, x, sum, route, what);
        dj_node *nd = node(b, y);
        if (!nd) break;
        nd->src[3] = gate; /* up and down: the two slots after the gate's */
        nd->weight_slot = slot;
        nd->params.k = (uint32_t)d;
        nd->params.m = (uint32_t)E;
        nd->params.d = (uint32_t)f;
        nd->params.expert = (uint32_t)e;
        /* planned as if every row used every expert; at decode only the routed ones run */
        nd->flops = 6.0 * (double)b->n * (double)d * (double)f * (double)c->n_experts_used / (double)E;
        sum = y;
    }
    return sum;
}

int dj__layer_prenorm(dj_gb *b, int l, int x) {
    int h = dj__blk_norm(b, l, x, ls(b, l, DJ_W_ATTN_NORM), "attn_norm");
    int a = dj__blk_attention(b, l, h);
    point(b, a, DJ_NODE_PT_ATTN);
    int x2 = dj__blk_add(b, l, x, a, "attn_residual");
    h = dj__blk_norm(b, l, x2, ls(b, l, DJ_W_FFN_NORM), "ffn_norm");
    int f = b->c->n_experts ? dj__blk_moe(b, l, h) : dj__blk_glu(b, l, h);
    point(b, f, DJ_NODE_PT_MLP);
    return dj__blk_add(b, l, x2, f, "ffn_residual");
}

int dj__layer_sandwich(dj_gb *b, int l, int x) {
    int h = dj__blk_norm(b, l, x, ls(b, l, DJ_W_ATTN_NORM), "attn_norm");
    int a = dj__blk_attention(b, l, h);
    point(b, a, DJ_NODE_PT_ATTN); /* before its norm, as transformers' self_attn output */
    a = dj__blk_norm(b, l, a, ls(b, l, DJ_W_POST_ATTN_NORM), "post_attn_norm");
    int x2 = dj__blk_add(b, l, x, a, "attn_residual");
    h = dj__blk_norm(b, l, x2, ls(b, l, DJ_W_FFN_NORM), "pre_ffn_norm");
    int f = dj__blk_glu(b, l, h);
    point(b, f, DJ_NODE_PT_MLP);
    f = dj__blk_norm(b, l, f, ls(b, l, DJ_W_POST_FFN_NORM), "post_ffn_norm");
    return dj__blk_add(b, l, x2, f, "ffn_residual");
}

/* ---- the graph of one step ---- */

dj_status dj_model_build_graph(const dj_model_config *c, const dj_model_t *m, dj_phase phase, uint32_t bucket,
                               dj_graph_t **out) {
    return dj_model_build_graph_opts(c, m, phase, bucket, 0, out);
}

dj_status dj_model_build_graph_opts(const dj_model_config *c, const dj_model_t *m, dj_phase phase, uint32_t bucket,
                                    unsigned flags, dj_graph_t **out) {
    return dj__model_build_graph_out(c, m, phase, bucket, flags, 0, out);
}

dj_status dj__model_build_graph_out(const dj_model_config *c, const dj_model_t *m, dj_phase phase, uint32_t bucket,
                                    unsigned flags, uint32_t out_rows, dj_graph_t **out) {
    *out = NULL;
    if (out_rows > bucket)
        return dj_fail(DJ_EINVAL, "%u output rows of a %u-row step", out_rows, bucket);
    if (bucket == 0) return dj_fail(DJ_EINVAL, "a step needs at least one token");
    const dj_arch_desc *arch = dj__arch(c->arch);
    if (!arch) return dj_fail(DJ_EINVAL, "architecture %d is not known", (int)c->arch);
    dj_gb b = {.c = c, .m = m, .n = bucket, .phase = phase, .st = DJ_OK, .inv_freq = -1, .inv_freq_local = -1};
    dj_status st = dj_graph_new(phase, bucket, &b.g);
    if (st != DJ_OK) return st;

    const int64_t d = c->hidden_size;
    const int g = dj__wslot_global(c, 0);

    dj_node in;
    memset(&in, 0, sizeof in);
    in.op = DJ_OP_COUNT;
    in.res = DJ_RES_INPUT;
    in.dtype = DJ_DTYPE_I32;
    in.ndim = 1;
    in.shape[0] = bucket;
    in.layer = -1;
    in.src[0] = in.src[1] = in.src[2] = in.src[3] = -1;
    in.weight_slot = -1;
    snprintf(in.name, sizeof in.name, "token_ids");
    int ids = add(&b, &in);

    int table = dj__blk_weight(&b, g + DJ_W_EMBED, -1, "embed_tokens");
    int x = act(&b, DJ_OP_EMBED, -1, bucket, d, ids, table, -1, "embed");
    dj_node *en = node(&b, x);
    if (en) {
        en->params.d = (uint32_t)d;
        en->params.m = c->vocab_size;
        en->params.scale = c->embed_scale;
    }
    point(&b, x, DJ_NODE_PT_EMBED);
    b.inv_freq = dj__blk_weight(&b, g + DJ_W_INV_FREQ, -1, "rope_inv_freq");
    if (c->rope_local_theta > 0.0f) b.inv_freq_local = dj__blk_weight(&b, g + DJ_W_INV_FREQ_LOCAL, -1, "rope_local");

    for (int l = 0; l < (int)c->n_layers && b.st == DJ_OK; l++) {
        x = arch->layer(&b, l, x);
        point(&b, x, DJ_NODE_PT_LAYER);
    }

    int xf = dj__blk_norm(&b, -1, x, g + DJ_W_NORM, "final_norm");
    point(&b, xf, DJ_NODE_PT_FINAL_NORM);
    const int head_slot = c->tie_word_embeddings ? g + DJ_W_EMBED : g + DJ_W_LM_HEAD;
    int lw = dj__blk_weight(&b, head_slot, -1, "lm_head");
    /* Prefill: the logits of the last position (of every position with
     * DJ_GRAPH_ALL_LOGITS). Decode: every row is the last token of its own
     * sequence (a batch of sessions): logits of each - or, with out_rows, of
     * the last out_rows rows only (a step mixing prompt chunks with decode
     * rows puts each session's last token there). */
    const bool all_rows = (phase == DJ_PHASE_DECODE && !out_rows) || (flags & DJ_GRAPH_ALL_LOGITS);
    const int64_t rows_out = out_rows ? (int64_t)out_rows : all_rows ? (int64_t)bucket : 1;
    int logits = act(&b, DJ_OP_MATMUL, -1, rows_out, c->vocab_size, xf, lw, -1, "logits");
    dj_node *ln = node(&b, logits);
    if (ln) {
        ln->res = DJ_RES_OUTPUT;
        ln->flags = all_rows ? 0u : DJ_NODE_LAST_ROW;
        ln->params.k = (uint32_t)d;
        ln->params.m = c->vocab_size;
        ln->flops = 2.0 * (double)rows_out * (double)d * (double)c->vocab_size;
    }
    if (c->final_softcap > 0.0f) { /* the capped logits in a second buffer: the step's output */
        int cap = act(&b, DJ_OP_SOFTCAP, -1, rows_out, c->vocab_size, logits, -1, -1, "final_softcap");
        dj_node *cn = node(&b, cap);
        if (cn) {
            cn->res = DJ_RES_OUTPUT;
            cn->flags = all_rows ? 0u : DJ_NODE_LAST_ROW;
            cn->params.d = c->vocab_size;
            cn->params.softcap = c->final_softcap;
        }
    }
    if (b.st != DJ_OK) {
        dj_graph_free(b.g);
        return b.st;
    }
    *out = b.g;
    return DJ_OK;
}
