/* qwen3.c: Qwen3ForCausalLM - Llama's layer with a per-head RMSNorm of q and k
 * before RoPE, an explicit head_dim (q is wider than the model), no q/k/v
 * bias unless attention_bias (then o too), Qwen's window rule. */
#include "model/arch/arch.h"

static dj_status parse(const void *root_, dj_model_config *c) {
    const cJSON *root = root_;
    dj_status st;
    if ((st = dj__cfg_act(root, "hidden_act", DJ_ACT_SILU, false, &c->hidden_act))) return st;
    if ((st = dj__cfg_rope(root, c))) return st;
    if ((st = dj__cfg_bool(root, "attention_bias", false, &c->attention_bias))) return st;
    c->qk_norm = true;
    return dj__cfg_window_from_layer(root, c);
}

static const dj_wname layer_names[] = {
    DJ_WN_LLAMA_NORMS,
    DJ_WN_LLAMA_QKVO,
    DJ_WN(DJ_W_Q_NORM, DJ_LAYER "self_attn.q_norm.weight", DJ_DIM_HD, DJ_DIM_NONE),
    DJ_WN(DJ_W_K_NORM, DJ_LAYER "self_attn.k_norm.weight", DJ_DIM_HD, DJ_DIM_NONE),
    DJ_WN_IF(DJ_W_QB, DJ_LAYER "self_attn.q_proj.bias", DJ_DIM_QD, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),
    DJ_WN_IF(DJ_W_KB, DJ_LAYER "self_attn.k_proj.bias", DJ_DIM_KVD, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),
    DJ_WN_IF(DJ_W_VB, DJ_LAYER "self_attn.v_proj.bias", DJ_DIM_KVD, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),
    DJ_WN_IF(DJ_W_OB, DJ_LAYER "self_attn.o_proj.bias", DJ_DIM_D, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),
    DJ_WN_LLAMA_MLP,
};
static const dj_wname global_names[] = {DJ_WN_LLAMA_GLOBAL};

const dj_arch_desc dj__arch_qwen3 = DJ_ARCH_DESC(parse, layer_names, global_names, dj__layer_prenorm);
