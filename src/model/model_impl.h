/* model_impl.h: the engine's view of a loaded Llama-family model - its weight
 * table (pointers into the text segment) and the per-layer slot layout the
 * graph builder and the executor agree on. Private to src/. */
#ifndef DJ_MODEL_IMPL_H
#define DJ_MODEL_IMPL_H

#include "djinn/checkpoint.h"
#include "djinn/engine.h"
#include "djinn/vmu.h"

/* Weight slots of one layer; global slots follow the layers. */
enum {
    DJ_W_ATTN_NORM, DJ_W_Q, DJ_W_K, DJ_W_V, DJ_W_O, DJ_W_QB, DJ_W_KB, DJ_W_VB, DJ_W_OB,
    DJ_W_FFN_NORM, DJ_W_GATE, DJ_W_UP, DJ_W_DOWN, DJ_W_GATEB, DJ_W_UPB, DJ_W_DOWNB,
    DJ_W_PER_LAYER
};
enum { DJ_W_EMBED, DJ_W_NORM, DJ_W_LM_HEAD, DJ_W_INV_FREQ, DJ_W_GLOBAL };

static inline int dj__wslot_layer(int layer, int w) { return layer * DJ_W_PER_LAYER + w; }
static inline int dj__wslot_global(const dj_model_config *c, int w) {
    return (int)c->n_layers * DJ_W_PER_LAYER + w;
}
static inline int dj__wslot_count(const dj_model_config *c) {
    return (int)c->n_layers * DJ_W_PER_LAYER + DJ_W_GLOBAL;
}

typedef struct dj_weight {
    const void *data;      /* text segment (device) pointer; NULL if absent (no bias) */
    dj_dtype dtype;
    int64_t shape[2];      /* [rows, cols] or [n, 0] for vectors */
    const char *hf_name;   /* static or owned by the model's name table; NULL if none */
} dj_weight;

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
};

/* Fill w[] with the HF tensor name, dtype and expected shape of every weight
 * the architecture needs (data NULL), checking the checkpoint has each one
 * with that shape. Errors name the tensor. names receives owned strings. */
/* dj_model_build_graph_opts with the logits of the last out_rows rows only
 * (0: as the phase and flags say). */
dj_status dj__model_build_graph_out(const dj_model_config *cfg, const dj_model_t *m, dj_phase phase, uint32_t bucket,
                                    unsigned flags, uint32_t out_rows, dj_graph_t **out /* OUT */);

dj_status dj__model_bind(const dj_model_config *cfg, const dj_checkpoint_t *ck, dj_weight *w /* OUT */,
                         char **names /* OUT [slots] */);

/* inv_freq[head_dim/2] for the config's RoPE (default, linear, llama3). */
void dj__rope_inv_freq(const dj_model_config *cfg, float *inv_freq /* OUT */);

#endif
