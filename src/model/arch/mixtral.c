/* mixtral.c: MixtralForCausalLM - Llama's attention with a mixture of
 * experts for the MLP: a router picks num_experts_per_tok of
 * num_local_experts per token, weighted by the softmax over the chosen
 * logits; tensors in the published per-expert layout (w1 gate, w3 up, w2
 * down); a window on every layer when sliding_window is set. */
#include "model/arch/arch.h"

static dj_status parse(const void *root_, dj_model_config *c) {
    const cJSON *root = root_;
    dj_status st;
    if ((st = dj__cfg_act(root, "hidden_act", DJ_ACT_SILU, false, &c->hidden_act))) return st;
    if ((st = dj__cfg_rope(root, c))) return st;
    if ((st = dj__cfg_u32(root, "", "sliding_window", false, 0, 0, &c->sliding_window))) return st;
    if ((st = dj__cfg_u32(root, "", "num_local_experts", false, 8, 1, &c->n_experts))) return st;
    if ((st = dj__cfg_u32(root, "", "num_experts_per_tok", false, 2, 1, &c->n_experts_used))) return st;
    if (c->n_experts > 256)
        return dj_fail(DJ_EUNSUPPORTED, DJ_CFG "num_local_experts %u: at most 256 supported", (unsigned)c->n_experts);
    if (c->n_experts_used > c->n_experts)
        return dj_fail(DJ_ERANGE, DJ_CFG "num_experts_per_tok %u exceeds num_local_experts %u",
                       (unsigned)c->n_experts_used, (unsigned)c->n_experts);
    return DJ_OK;
}

#define EXPERT DJ_LAYER "block_sparse_moe.experts.%d."
static const dj_wname layer_names[] = {
    DJ_WN_LLAMA_NORMS,
    DJ_WN_LLAMA_QKVO,
    DJ_WN(DJ_W_ROUTER, DJ_LAYER "block_sparse_moe.gate.weight", DJ_DIM_E, DJ_DIM_D),
};
static const dj_wname expert_names[] = {
    DJ_WN(DJ_W_EXPERT_GATE, EXPERT "w1.weight", DJ_DIM_F, DJ_DIM_D),
    DJ_WN(DJ_W_EXPERT_UP, EXPERT "w3.weight", DJ_DIM_F, DJ_DIM_D),
    DJ_WN(DJ_W_EXPERT_DOWN, EXPERT "w2.weight", DJ_DIM_D, DJ_DIM_F),
};
static const dj_wname global_names[] = {DJ_WN_LLAMA_GLOBAL};

const dj_arch_desc dj__arch_mixtral = {parse,        layer_names,        DJ_COUNT(layer_names), expert_names,
                                       global_names, DJ_COUNT(global_names), dj__layer_prenorm};
