/* llama.c: the Llama family (Llama 2/3, TinyLlama, Mistral, Qwen2) - which
 * tensors a checkpoint must hold, RoPE frequencies, and the SRG of one step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

/* ---- weights ---- */

static dj_status want(const dj_checkpoint_t *ck, dj_weight *w, char **name_slot, const char *name,
                      int64_t rows, int64_t cols, bool optional) {
    const dj_tensor_info *t = dj_checkpoint_find(ck, name);
    if (!t) {
        if (optional) return DJ_OK;
        return dj_fail(DJ_ENOTFOUND, "checkpoint has no tensor '%s', which the architecture needs", name);
    }
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
    if (t->dtype != DJ_DTYPE_F32 && t->dtype != DJ_DTYPE_F16 && t->dtype != DJ_DTYPE_BF16)
        return dj_fail(DJ_EUNSUPPORTED, "tensor '%s' has dtype %s; weights must be f32, f16 or bf16", name,
                       dj_dtype_name(t->dtype));
    char *copy = strdup(name);
    if (!copy) return dj_fail(DJ_ENOMEM, "out of memory");
    *name_slot = copy;
    w->hf_name = copy;
    w->dtype = t->dtype;
    w->shape[0] = rows;
    w->shape[1] = cols;
    w->data = NULL;
    return DJ_OK;
}

dj_status dj__model_bind(const dj_model_config *c, const dj_checkpoint_t *ck, dj_weight *w, char **names) {
    const int64_t d = c->hidden_size, f = c->intermediate_size, hd = c->head_dim;
    const int64_t qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd;
    /* Llama's attention_bias covers q,k,v,o; Qwen2 always has q,k,v biases and no o bias. */
    const bool qkv_bias = c->attention_bias || c->arch == DJ_ARCH_QWEN2;
    const bool o_bias = c->attention_bias && c->arch == DJ_ARCH_LLAMA;
    const bool mlp_bias = c->mlp_bias;
    char nm[160];
    dj_status st;
#define WANT(slot, fmt, rows, cols, opt)                                           \
    do {                                                                           \
        snprintf(nm, sizeof nm, fmt, l);                                           \
        if ((st = want(ck, &w[slot], &names[slot], nm, rows, cols, opt)) != DJ_OK) \
            return st;                                                             \
    } while (0)
    for (int l = 0; l < (int)c->n_layers; l++) {
        const int b = dj__wslot_layer(l, 0);
        WANT(b + DJ_W_ATTN_NORM, "model.layers.%d.input_layernorm.weight", d, 0, false);
        WANT(b + DJ_W_Q, "model.layers.%d.self_attn.q_proj.weight", qd, d, false);
        WANT(b + DJ_W_K, "model.layers.%d.self_attn.k_proj.weight", kvd, d, false);
        WANT(b + DJ_W_V, "model.layers.%d.self_attn.v_proj.weight", kvd, d, false);
        WANT(b + DJ_W_O, "model.layers.%d.self_attn.o_proj.weight", d, qd, false);
        if (qkv_bias) {
            WANT(b + DJ_W_QB, "model.layers.%d.self_attn.q_proj.bias", qd, 0, false);
            WANT(b + DJ_W_KB, "model.layers.%d.self_attn.k_proj.bias", kvd, 0, false);
            WANT(b + DJ_W_VB, "model.layers.%d.self_attn.v_proj.bias", kvd, 0, false);
        }
        if (o_bias) WANT(b + DJ_W_OB, "model.layers.%d.self_attn.o_proj.bias", d, 0, false);
        WANT(b + DJ_W_FFN_NORM, "model.layers.%d.post_attention_layernorm.weight", d, 0, false);
        WANT(b + DJ_W_GATE, "model.layers.%d.mlp.gate_proj.weight", f, d, false);
        WANT(b + DJ_W_UP, "model.layers.%d.mlp.up_proj.weight", f, d, false);
        WANT(b + DJ_W_DOWN, "model.layers.%d.mlp.down_proj.weight", d, f, false);
        if (mlp_bias) {
            WANT(b + DJ_W_GATEB, "model.layers.%d.mlp.gate_proj.bias", f, 0, false);
            WANT(b + DJ_W_UPB, "model.layers.%d.mlp.up_proj.bias", f, 0, false);
            WANT(b + DJ_W_DOWNB, "model.layers.%d.mlp.down_proj.bias", d, 0, false);
        }
    }
    const int l = 0; /* unused by the global formats below */
    const int g = dj__wslot_global(c, 0);
    WANT(g + DJ_W_EMBED, "model.embed_tokens.weight%.0d", (int64_t)c->vocab_size, d, false);
    WANT(g + DJ_W_NORM, "model.norm.weight%.0d", d, 0, false);
    if (!c->tie_word_embeddings) WANT(g + DJ_W_LM_HEAD, "lm_head.weight%.0d", (int64_t)c->vocab_size, d, false);
#undef WANT
    /* RoPE frequencies are computed, stored as f32 in the text segment. */
    w[g + DJ_W_INV_FREQ].dtype = DJ_DTYPE_F32;
    w[g + DJ_W_INV_FREQ].shape[0] = hd / 2;
    w[g + DJ_W_INV_FREQ].shape[1] = 0;
    w[g + DJ_W_INV_FREQ].hf_name = NULL;
    return DJ_OK;
}

/* ---- RoPE ---- */

void dj__rope_inv_freq(const dj_model_config *c, float *inv_freq) {
    const uint32_t half = c->head_dim / 2;
    for (uint32_t j = 0; j < half; j++) {
        /* As transformers: exponent 2j/dim in f32, then base ** exponent. */
        float expo = (float)(2 * j) / (float)c->head_dim;
        float base_pow = powf(c->rope_theta, expo);
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
        }
        inv_freq[j] = f;
    }
}

/* ---- the graph of one step ---- */

typedef struct builder {
    dj_graph_t *g;
    const dj_model_config *c;
    const dj_model_t *m;
    uint32_t n; /* token rows (bucket) */
    dj_phase phase;
    dj_status st;
} builder;

static int add(builder *b, dj_node *nd) {
    if (b->st != DJ_OK) return -1;
    nd->phase = b->phase;
    int idx = -1;
    b->st = dj_graph_add(b->g, nd, &idx);
    return idx;
}

static int weight(builder *b, int slot, int layer, const char *what) {
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
    nd.bytes = w ? (double)(w->shape[0] * (w->shape[1] ? w->shape[1] : 1)) * (double)dj_dtype_size(w->dtype) : 0;
    snprintf(nd.name, sizeof nd.name, "%s", what);
    return add(b, &nd);
}

static int act(builder *b, dj_op op, int layer, int64_t rows, int64_t cols, int s0, int s1, int s2,
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

static int matmul(builder *b, int layer, int x, int wslot, int bslot, int64_t k, int64_t m, const char *what) {
    int w = weight(b, wslot, layer, what);
    /* Without a model (planning only) biases are left out: they change no plan. */
    int bias = bslot >= 0 && b->m ? weight(b, bslot, layer, what) : -1;
    int idx = act(b, DJ_OP_MATMUL, layer, b->n, m, x, w, bias, what);
    if (idx >= 0) {
        dj_node *nd = dj_graph_node(b->g, idx);
        nd->params.k = (uint32_t)k;
        nd->params.m = (uint32_t)m;
        nd->flops = 2.0 * (double)b->n * (double)k * (double)m;
        nd->bytes += dj_graph_node(b->g, w)->bytes + (double)b->n * (double)k * 4.0;
    }
    return idx;
}

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
    builder b = {.c = c, .m = m, .n = bucket, .phase = phase, .st = DJ_OK};
    dj_status st = dj_graph_new(phase, bucket, &b.g);
    if (st != DJ_OK) return st;

    const int64_t d = c->hidden_size, f = c->intermediate_size, hd = c->head_dim;
    const int64_t qd = (int64_t)c->n_heads * hd, kvd = (int64_t)c->n_kv_heads * hd;
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

    int table = weight(&b, g + DJ_W_EMBED, -1, "embed_tokens");
    int x = act(&b, DJ_OP_EMBED, -1, bucket, d, ids, table, -1, "embed");
    if (x >= 0) {
        dj_node *nd = dj_graph_node(b.g, x);
        nd->params.d = (uint32_t)d;
        nd->params.m = c->vocab_size;
    }
    int inv_freq = weight(&b, g + DJ_W_INV_FREQ, -1, "rope_inv_freq");

    for (int l = 0; l < (int)c->n_layers && b.st == DJ_OK; l++) {
        const int s = dj__wslot_layer(l, 0);
        int nw = weight(&b, s + DJ_W_ATTN_NORM, l, "input_layernorm");
        int xn = act(&b, DJ_OP_RMSNORM, l, bucket, d, x, nw, -1, "attn_norm");
        if (xn >= 0) {
            dj_graph_node(b.g, xn)->params.d = (uint32_t)d;
            dj_graph_node(b.g, xn)->params.eps = c->rms_norm_eps;
        }
        int q = matmul(&b, l, xn, s + DJ_W_Q, s + DJ_W_QB, d, qd, "q_proj");
        int k = matmul(&b, l, xn, s + DJ_W_K, s + DJ_W_KB, d, kvd, "k_proj");
        int v = matmul(&b, l, xn, s + DJ_W_V, s + DJ_W_VB, d, kvd, "v_proj");
        int qr = act(&b, DJ_OP_ROPE, l, bucket, qd, q, inv_freq, -1, "q_rope");
        int kr = act(&b, DJ_OP_ROPE, l, bucket, kvd, k, inv_freq, -1, "k_rope");
        if (b.st != DJ_OK) break;
        dj_graph_node(b.g, qr)->params.n_heads = c->n_heads;
        dj_graph_node(b.g, kr)->params.n_heads = c->n_kv_heads;
        dj_graph_node(b.g, qr)->params.head_dim = dj_graph_node(b.g, kr)->params.head_dim = (uint32_t)hd;
        dj_graph_node(b.g, qr)->params.scale = dj_graph_node(b.g, kr)->params.scale = 1.0f;

        int kvw = act(&b, DJ_OP_KV_WRITE, l, bucket, kvd, kr, v, -1, "kv_write");
        if (b.st != DJ_OK) break;
        dj_node *kn = dj_graph_node(b.g, kvw);
        kn->params.n_kv_heads = c->n_kv_heads;
        kn->params.head_dim = (uint32_t)hd;

        int att = act(&b, DJ_OP_ATTENTION, l, bucket, qd, qr, kvw, -1, "attention");
        if (b.st != DJ_OK) break;
        dj_node *an = dj_graph_node(b.g, att);
        an->params.n_heads = c->n_heads;
        an->params.n_kv_heads = c->n_kv_heads;
        an->params.head_dim = (uint32_t)hd;
        an->params.window = (uint32_t)l >= c->sliding_window_first_layer ? c->sliding_window : 0;
        an->params.scale = 1.0f / sqrtf((float)hd);

        int o = matmul(&b, l, att, s + DJ_W_O, s + DJ_W_OB, qd, d, "o_proj");
        int x2 = act(&b, DJ_OP_ADD, l, bucket, d, x, o, -1, "attn_residual");
        int fw = weight(&b, s + DJ_W_FFN_NORM, l, "post_attention_layernorm");
        int xn2 = act(&b, DJ_OP_RMSNORM, l, bucket, d, x2, fw, -1, "ffn_norm");
        if (b.st != DJ_OK) break;
        dj_graph_node(b.g, x2)->params.d = (uint32_t)d;
        dj_graph_node(b.g, xn2)->params.d = (uint32_t)d;
        dj_graph_node(b.g, xn2)->params.eps = c->rms_norm_eps;
        int gt = matmul(&b, l, xn2, s + DJ_W_GATE, s + DJ_W_GATEB, d, f, "gate_proj");
        int up = matmul(&b, l, xn2, s + DJ_W_UP, s + DJ_W_UPB, d, f, "up_proj");
        int h = act(&b, DJ_OP_SILU_MUL, l, bucket, f, gt, up, -1, "silu_mul");
        int dn = matmul(&b, l, h, s + DJ_W_DOWN, s + DJ_W_DOWNB, f, d, "down_proj");
        x = act(&b, DJ_OP_ADD, l, bucket, d, x2, dn, -1, "ffn_residual");
        if (b.st != DJ_OK) break;
        dj_graph_node(b.g, h)->params.d = (uint32_t)f;
        dj_graph_node(b.g, x)->params.d = (uint32_t)d;
    }

    int nw = weight(&b, g + DJ_W_NORM, -1, "norm");
    int xf = act(&b, DJ_OP_RMSNORM, -1, bucket, d, x, nw, -1, "final_norm");
    if (xf >= 0) {
        dj_graph_node(b.g, xf)->params.d = (uint32_t)d;
        dj_graph_node(b.g, xf)->params.eps = c->rms_norm_eps;
    }
    const int head_slot = c->tie_word_embeddings ? g + DJ_W_EMBED : g + DJ_W_LM_HEAD;
    int lw = weight(&b, head_slot, -1, "lm_head");
    /* Prefill: the logits of the last position (of every position with
     * DJ_GRAPH_ALL_LOGITS). Decode: every row is the last token of its own
     * sequence (a batch of sessions): logits of each - or, with out_rows, of
     * the last out_rows rows only (a step mixing prompt chunks with decode
     * rows puts each session's last token there). */
    const bool all_rows = (phase == DJ_PHASE_DECODE && !out_rows) || (flags & DJ_GRAPH_ALL_LOGITS);
    const int64_t rows_out = out_rows ? (int64_t)out_rows : all_rows ? (int64_t)bucket : 1;
    int logits = act(&b, DJ_OP_MATMUL, -1, rows_out, c->vocab_size, xf, lw, -1, "logits");
    if (logits >= 0) {
        dj_node *nd = dj_graph_node(b.g, logits);
        nd->res = DJ_RES_OUTPUT;
        nd->flags = all_rows ? 0u : DJ_NODE_LAST_ROW;
        nd->params.k = (uint32_t)d;
        nd->params.m = c->vocab_size;
        nd->flops = 2.0 * (double)rows_out * (double)d * (double)c->vocab_size;
    }
    if (b.st != DJ_OK) {
        dj_graph_free(b.g);
        return b.st;
    }
    *out = b.g;
    return DJ_OK;
}
