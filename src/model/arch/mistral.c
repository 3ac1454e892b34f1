/* mistral.c: MistralForCausalLM - Llama's tensors and layer with a sliding
 * window on every layer (config sliding_window: absent means 4096 as in
 * transformers' MistralConfig, null means none). */
#include "model/arch/arch.h"

static dj_status parse(const void *root_, dj_model_config *c) {
    const cJSON *root = root_;
    dj_status st;
    if ((st = dj__cfg_act(root, "hidden_act", DJ_ACT_SILU, false, &c->hidden_act))) return st;
    if ((st = dj__cfg_rope(root, c))) return st;
    if (!cJSON_GetObjectItemCaseSensitive(root, "sliding_window")) {
        c->sliding_window = 4096;
        return DJ_OK;
    }
    return dj__cfg_u32(root, "", "sliding_window", false, 0, 0, &c->sliding_window);
}

static const dj_wname layer_names[] = {DJ_WN_LLAMA_NORMS, DJ_WN_LLAMA_QKVO, DJ_WN_LLAMA_MLP};
static const dj_wname global_names[] = {DJ_WN_LLAMA_GLOBAL};

const dj_arch_desc dj__arch_mistral = DJ_ARCH_DESC(parse, layer_names, global_names, dj__layer_prenorm);
