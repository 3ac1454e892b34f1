/* llama.c: LlamaForCausalLM (Llama 2, Llama 3/3.1, TinyLlama) - config keys
 * attention_bias (q, k, v AND o biases) and mlp_bias, the Llama tensor
 * names, the pre-norm layer. */
#include "model/arch/arch.h"

static dj_status parse(const void *root_, dj_model_config *c) {
    const cJSON *root = root_;
    dj_status st;
    if ((st = dj__cfg_act(root, "hidden_act", DJ_ACT_SILU, false, &c->hidden_act))) return st;
    if ((st = dj__cfg_rope(root, c))) return st;
    if ((st = dj__cfg_bool(root, "attention_bias", false, &c->attention_bias))) return st;
    return dj__cfg_bool(root, "mlp_bias", false, &c->mlp_bias);
}

static const dj_wname layer_names[] = {
    DJ_WN_LLAMA_NORMS,
    DJ_WN_LLAMA_QKVO,
    DJ_WN_IF(DJ_W_QB, DJ_LAYER "self_attn.q_proj.bias", DJ_DIM_QD, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),
    DJ_WN_IF(DJ_W_KB, DJ_LAYER "self_attn.k_proj.bias", DJ_DIM_KVD, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),
    DJ_WN_IF(DJ_W_VB, DJ_LAYER "self_attn.v_proj.bias", DJ_DIM_KVD, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),
    DJ_WN_IF(DJ_W_OB, DJ_LAYER "self_attn.o_proj.bias", DJ_DIM_D, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),
    DJ_WN_LLAMA_MLP,
    DJ_WN_IF(DJ_W_GATEB, DJ_LAYER "mlp.gate_proj.bias", DJ_DIM_F, DJ_DIM_NONE, DJ_BIND_IF_MLP_BIAS),
    DJ_WN_IF(DJ_W_UPB, DJ_LAYER "mlp.up_proj.bias", DJ_DIM_F, DJ_DIM_NONE, DJ_BIND_IF_MLP_BIAS),
    DJ_WN_IF(DJ_W_DOWNB, DJ_LAYER "mlp.down_proj.bias", DJ_DIM_D, DJ_DIM_NONE, DJ_BIND_IF_MLP_BIAS),
};
static const dj_wname global_names[] = {DJ_WN_LLAMA_GLOBAL};

const dj_arch_desc dj__arch_llama = DJ_ARCH_DESC(parse, layer_names, global_names, dj__layer_prenorm);
