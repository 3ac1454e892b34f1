/* model_impl.h: the engine's view of a loaded model - its weight table
 * (pointers into the text segment), the per-layer slot layout the graph
 * builder and the executor agree on, and the architecture registry with the
 * shared blocks every architecture file (src/model/arch/) builds from.
 * Private to src/. */
#ifndef DJ_MODEL_IMPL_H
#define DJ_MODEL_IMPL_H

#include "djinn/checkpoint.h"
#include "djinn/graph.h"
#include "djinn/vmu.h"
#include "model/model_graph.h"

/* Weight slots of one layer; then 3 per expert (MoE); global slots follow the
 * layers. A slot an architecture does not use stays empty (no name, no bytes). */
enum {
    DJ_W_ATTN_NORM, DJ_W_Q, DJ_W_K, DJ_W_V, DJ_W_O, DJ_W_QB, DJ_W_KB, DJ_W_VB, DJ_W_OB,
    DJ_W_FFN_NORM, DJ_W_GATE, DJ_W_UP, DJ_W_DOWN, DJ_W_GATEB, DJ_W_UPB, DJ_W_DOWNB,
    DJ_W_Q_NORM, DJ_W_K_NORM,          /* per-head q/k RMSNorm [head_dim] */
    DJ_W_POST_ATTN_NORM, DJ_W_POST_FFN_NORM, /* Gemma: norms of the attention and MLP outputs */
    DJ_W_ROUTER,                       /* MoE router [n_experts][hidden] */
    DJ_W_FIXED                         /* then expert e: gate, up, down at DJ_W_EXPERT(e, .) */
};
enum { DJ_W_EXPERT_GATE, DJ_W_EXPERT_UP, DJ_W_EXPERT_DOWN };
#define DJ_W_EXPERT(e, which) (DJ_W_FIXED + 3 * (e) + (which))
/* INV_FREQ_LONG: longrope's long-factor table, no graph node: a session that
 * takes it (dj_session_t.rope_long) has it substituted per row at run time. */
enum { DJ_W_EMBED, DJ_W_NORM, DJ_W_LM_HEAD, DJ_W_INV_FREQ, DJ_W_INV_FREQ_LOCAL, DJ_W_INV_FREQ_LONG, DJ_W_GLOBAL };

static inline int dj__wslot_per_layer(const dj_model_config *c) { return DJ_W_FIXED + 3 * (int)c->n_experts; }
static inline int dj__wslot_layer_c(const dj_model_config *c, int layer, int w) {
    return layer * dj__wslot_per_layer(c) + w;
}
static inline int dj__wslot_global(const dj_model_config *c, int w) {
    return (int)c->n_layers * dj__wslot_per_layer(c) + w;
}
static inline int dj__wslot_count(const dj_model_config *c) {
    return (int)c->n_layers * dj__wslot_per_layer(c) + DJ_W_GLOBAL;
}

/* Weights computed at load instead of read from the checkpoint. */
enum { DJ_COMPUTED_NONE, DJ_COMPUTED_INV_FREQ, DJ_COMPUTED_INV_FREQ_LOCAL, DJ_COMPUTED_INV_FREQ_LONG };

typedef struct dj_weight {
    const void *data;      /* text segment (device) pointer; NULL if absent (no bias) */
    dj_dtype dtype;
    int64_t shape[2];      /* [rows, cols] or [n, 0] for vectors */
    const char *hf_name;   /* owned by the model's name table; NULL if none */
    size_t src_offset;     /* bytes into the checkpoint tensor where this slot's rows start (a
                            * fused tensor such as Phi-3's qkv_proj feeds several slots) */
    int computed;          /* DJ_COMPUTED_*: filled by dj__model_fill_computed, no hf_name */
    /* ---- f8_e4m3 weights (dtype DJ_DTYPE_F8_E4M3) only; zero otherwise ---- */
    const float *scale;    /* text segment: f32 [ceil(rows/block[0])][ceil(cols/block[1])]; the
                            * weight is fp8 * scale[r / block[0]][c / block[1]] */
    uint32_t block[2];     /* weight rows, cols one scale covers (per tensor: rows, cols) */
    const dj_tensor_info *scale_src; /* the checkpoint's scales (any float dtype); valid only while
                                      * the checkpoint is open (binding and loading) */
    size_t scale_row0;     /* the slot's first scale row in scale_src (a fused tensor's part) */
} dj_weight;

/* Whether slot w holds bytes (bound to a checkpoint tensor, or computed at load). */
static inline bool dj__weight_has_bytes(const dj_weight *w) { return w->hf_name || w->computed; }

/* Scale values of an f8_e4m3 slot (0 for others), and their bytes as f32. */
static inline size_t dj__weight_scale_count(const dj_weight *w) {
    if (w->dtype != DJ_DTYPE_F8_E4M3 || !w->block[0] || !w->block[1]) return 0;
    return (size_t)((w->shape[0] + w->block[0] - 1) / w->block[0]) *
           (size_t)((w->shape[1] + w->block[1] - 1) / w->block[1]);
}

struct dj_model {
    dj_model_config cfg;
    char name[256];
    uint64_t fingerprint;
    uint64_t n_params;
    size_t text_bytes;      /* in the text segment */
    size_t mapped_bytes;    /* weights used in place in ck's mapping (host-memory backends) */
    dj_checkpoint_t *ck;    /* one reference held while weights are used in place; NULL if copied */
    dj_vmu_model_t *region; /* owns this struct through its user dtor */
    dj_weight *w;           /* [dj__wslot_count(cfg)] */
    struct dj_model_stream *stream; /* the streamed layers (src/exec/stream_impl.h), NULL when every
                                     * weight is resident; owned */
};

/* dj_model_build_graph_opts with the logits of the last out_rows rows only
 * (0: as the phase and flags say). */
dj_status dj__model_build_graph_out(const dj_model_config *cfg, const dj_model_t *m, dj_phase phase, uint32_t bucket,
                                    unsigned flags, uint32_t out_rows, dj_graph_t **out /* OUT */);

/* Fill w[] with the HF tensor name, dtype and expected shape of every weight
 * the architecture needs (data NULL), checking the checkpoint has each one
 * with that shape, and mark the computed ones. Errors name the tensor. names
 * receives owned strings (slot i: names[i], also w[i].hf_name). */
dj_status dj__model_bind(const dj_model_config *cfg, const dj_checkpoint_t *ck, dj_weight *w /* OUT */,
                         char **names /* OUT [slots] */);

/* The bytes of a computed weight w (w->computed != NONE) into out (host
 * memory, w's shape of f32): the RoPE inverse frequencies. */
void dj__model_fill_computed(const dj_model_config *cfg, const dj_weight *w, float *out /* OUT */);

/* inv_freq[rope_dim/2] of the config's RoPE (default, linear, llama3,
 * longrope) with base theta; longrope divides by ext[rope_dim/2] (its short
 * or long factors; unread for the other types). */
void dj__rope_inv_freq(const dj_model_config *cfg, float theta, const float *ext, float *inv_freq /* OUT */);

/* The sliding window of layer l in positions, 0 = full attention. */
uint32_t dj__layer_window(const dj_model_config *c, uint32_t l);

/* ---- the architecture registry (src/model/arch/) ---- */

/* A tensor's dimension, in terms of the config. */
typedef enum {
    DJ_DIM_NONE, /* a vector's missing second dimension; row offset 0 */
    DJ_DIM_D,    /* hidden_size */
    DJ_DIM_F,    /* intermediate_size */
    DJ_DIM_2F,   /* 2 * intermediate_size (fused gate_up) */
    DJ_DIM_HD,   /* head_dim */
    DJ_DIM_QD,   /* n_heads * head_dim */
    DJ_DIM_KVD,  /* n_kv_heads * head_dim */
    DJ_DIM_QKVD, /* QD + 2 KVD (fused qkv) */
    DJ_DIM_QKD,  /* QD + KVD: row offset of v in a fused qkv */
    DJ_DIM_V,    /* vocab_size */
    DJ_DIM_E     /* n_experts */
} dj_dim;

/* When a tensor is bound. */
typedef enum {
    DJ_BIND_ALWAYS,
    DJ_BIND_IF_ATTN_BIAS, /* cfg->attention_bias */
    DJ_BIND_IF_MLP_BIAS,  /* cfg->mlp_bias */
    DJ_BIND_IF_UNTIED     /* !cfg->tie_word_embeddings */
} dj_bind_when;

/* One checkpoint tensor feeding one slot. fmt takes the layer index (layer
 * tensors), then the expert index (expert tensors); global tensors take none. */
typedef struct dj_wname {
    int slot;          /* DJ_W_* of a layer, DJ_W_EXPERT_* of an expert, or DJ_W_* global */
    const char *fmt;
    dj_dim rows, cols; /* the tensor as stored; cols DJ_DIM_NONE for a vector */
    dj_dim row0, nrows; /* the slot's rows of it: from row0 (DJ_DIM_NONE = 0), nrows of them
                         * (DJ_DIM_NONE = all) */
    dj_bind_when when;
} dj_wname;

/* The graph of a step as the blocks see it. */
typedef struct dj_gb {
    dj_graph_t *g;
    const dj_model_config *c;
    const dj_model_t *m;   /* NULL: planning only (biases left out, no weights) */
    uint32_t n;            /* token rows (bucket) */
    dj_phase phase;
    dj_status st;          /* first failure; every block is a no-op after it */
    int inv_freq, inv_freq_local; /* RoPE tables' nodes (local: -1 without) */
} dj_gb;

/* An architecture: its own config keys, its tensors, and its decoder layer
 * built from the blocks below. */
typedef struct dj_arch_desc {
    /* Reads the architecture's own config keys (the common ones are in cfg
     * already); root is the config's cJSON object. */
    dj_status (*parse)(const void *root, dj_model_config *cfg);
    const dj_wname *layer_names; /* [n_layer_names] layer tensors */
    int n_layer_names;
    const dj_wname *expert_names; /* [3] MoE: gate, up, down per expert; NULL without experts */
    const dj_wname *global_names; /* [n_global_names] */
    int n_global_names;
    /* x (the residual stream) through layer l; returns the new stream's node. */
    int (*layer)(dj_gb *b, int l, int x);
} dj_arch_desc;

/* The architecture's description and its config.json name (djinn/arch_list.h). */
const dj_arch_desc *dj__arch(dj_arch a);
const char *dj__arch_name(dj_arch a);
/* Whether layer l is one of the sliding-window layers (by layer type or from
 * the first sliding layer on), whatever the window. */
bool dj__layer_is_sliding(const dj_model_config *c, uint32_t l);

/* ---- blocks (src/model/blocks.c); each returns its output node, -1 after a failure ---- */
int dj__blk_weight(dj_gb *b, int slot, int layer, const char *what); /* -1 when absent (bias) */
int dj__blk_norm(dj_gb *b, int l, int x, int wslot, const char *what); /* RMSNorm, the config's kind */
int dj__blk_add(dj_gb *b, int l, int x, int y, const char *what);      /* residual add */
/* Self-attention of normed x: q/k/v (biases where bound), per-head q/k norm
 * (cfg->qk_norm), RoPE (the local table on sliding layers where there is
 * one), K/V write, attention (window, scale, softcap), o_proj. */
int dj__blk_attention(dj_gb *b, int l, int x);
int dj__blk_glu(dj_gb *b, int l, int x);  /* gate/up, cfg->hidden_act, down */
int dj__blk_moe(dj_gb *b, int l, int x);  /* router, top-k, the experts' GLUs summed */
/* The pre-norm layer of Llama: x + attn(norm(x)), then + mlp(norm(.)) where
 * mlp is the GLU, or the MoE with cfg->n_experts. */
int dj__layer_prenorm(dj_gb *b, int l, int x);
/* Gemma's sandwich: x + norm(attn(norm(x))), then + norm(mlp(norm(.))). */
int dj__layer_sandwich(dj_gb *b, int l, int x);

#endif
