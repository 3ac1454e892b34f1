/* gemma2.c: Gemma2ForCausalLM - GeGLU (tanh GELU), (1 + w) RMSNorms before and
 * after attention and MLP, embeddings times sqrt(hidden), the softmax scale
 * query_pre_attn_scalar^-0.5, attention and final logit soft-capping, and
 * sliding and global layers alternating (layer_types, else even layers
 * slide, as transformers' Gemma2Config). */
#include "model/arch/gemma_common.h"

static dj_status parse(const void *root_, dj_model_config *c) {
    const cJSON *root = root_;
    dj_status st;
    if ((st = dj__gemma_parse_common(root, c, 50.0f, 30.0f))) return st;
    if ((st = dj__cfg_rope(root, c))) return st;
    bool typed = false;
    if ((st = dj__cfg_layer_types(root, c, &typed))) return st;
    if (!typed) {
        if (c->n_layers > DJ_MAX_TYPED_LAYERS)
            return dj_fail(DJ_EUNSUPPORTED, DJ_CFG "%u layers: at most %u supported", (unsigned)c->n_layers,
                           DJ_MAX_TYPED_LAYERS);
        for (uint32_t l = 0; l < c->n_layers; l += 2) c->layer_sliding[l / 8] |= (uint8_t)(1u << (l % 8));
    }
    return DJ_OK;
}

static const dj_wname layer_names[] = {DJ_WN_GEMMA_LAYER};
static const dj_wname global_names[] = {DJ_WN_LLAMA_GLOBAL};

const dj_arch_desc dj__arch_gemma2 = DJ_ARCH_DESC(parse, layer_names, global_names, dj__layer_sandwich);
