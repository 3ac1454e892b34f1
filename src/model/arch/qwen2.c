/* qwen2.c: Qwen2ForCausalLM - Llama's layer with q, k and v biases (always;
 * o_proj never has one) and Qwen's window from max_window_layers on. */
#include "model/arch/arch.h"

static dj_status parse(const void *root_, dj_model_config *c) {
    const cJSON *root = root_;
    dj_status st;
    if ((st = dj__cfg_act(root, "hidden_act", DJ_ACT_SILU, false, &c->hidden_act))) return st;
    if ((st = dj__cfg_rope(root, c))) return st;
    c->attention_bias = true;
    return dj__cfg_window_from_layer(root, c);
}

static const dj_wname layer_names[] = {
    DJ_WN_LLAMA_NORMS,
    DJ_WN_LLAMA_QKVO,
    DJ_WN(DJ_W_QB, DJ_LAYER "self_attn.q_proj.bias", DJ_DIM_QD, DJ_DIM_NONE),
    DJ_WN(DJ_W_KB, DJ_LAYER "self_attn.k_proj.bias", DJ_DIM_KVD, DJ_DIM_NONE),
    DJ_WN(DJ_W_VB, DJ_LAYER "self_attn.v_proj.bias", DJ_DIM_KVD, DJ_DIM_NONE),
    DJ_WN_LLAMA_MLP,
};
static const dj_wname global_names[] = {DJ_WN_LLAMA_GLOBAL};

const dj_arch_desc dj__arch_qwen2 = DJ_ARCH_DESC(parse, layer_names, global_names, dj__layer_prenorm);
