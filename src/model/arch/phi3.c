/* phi3.c: Phi3ForCausalLM - q, k and v in one stored qkv_proj and gate and up
 * in one gate_up_proj (each slot reads its rows of the stored tensor), a
 * partial rotary factor (top level, or in transformers 5's rope_parameters),
 * longrope scaling of the 128K variants, a window on every layer when
 * sliding_window is set. */
#include "model/arch/arch.h"

static dj_status parse(const void *root_, dj_model_config *c) {
    const cJSON *root = root_;
    dj_status st;
    if ((st = dj__cfg_act(root, "hidden_act", DJ_ACT_SILU, false, &c->hidden_act))) return st;
    const cJSON *params = dj__json_member(root, "rope_parameters");
    const cJSON *where = dj__json_member(root, "partial_rotary_factor") || !cJSON_IsObject(params) ? root : params;
    float prf = 1.0f;
    if ((st = dj__cfg_pos_float(where, where == root ? "" : "rope_parameters: ", "partial_rotary_factor", false,
                                1.0f, &prf)))
        return st;
    if (prf > 1.0f)
        return dj_fail(DJ_ERANGE, DJ_CFG "partial_rotary_factor %g is above 1", (double)prf);
    c->rope_dim = (uint32_t)((float)c->head_dim * prf); /* transformers: int(head_dim * factor) */
    if ((st = dj__cfg_rope(root, c))) return st;
    return dj__cfg_u32(root, "", "sliding_window", false, 0, 0, &c->sliding_window);
}

#define QKV DJ_LAYER "self_attn.qkv_proj.weight"
#define GATE_UP DJ_LAYER "mlp.gate_up_proj.weight"
static const dj_wname layer_names[] = {
    DJ_WN_LLAMA_NORMS,
    DJ_WN_PART(DJ_W_Q, QKV, DJ_DIM_QKVD, DJ_DIM_D, DJ_DIM_NONE, DJ_DIM_QD),
    DJ_WN_PART(DJ_W_K, QKV, DJ_DIM_QKVD, DJ_DIM_D, DJ_DIM_QD, DJ_DIM_KVD),
    DJ_WN_PART(DJ_W_V, QKV, DJ_DIM_QKVD, DJ_DIM_D, DJ_DIM_QKD, DJ_DIM_KVD),
    DJ_WN(DJ_W_O, DJ_LAYER "self_attn.o_proj.weight", DJ_DIM_D, DJ_DIM_QD),
    DJ_WN_PART(DJ_W_GATE, GATE_UP, DJ_DIM_2F, DJ_DIM_D, DJ_DIM_NONE, DJ_DIM_F),
    DJ_WN_PART(DJ_W_UP, GATE_UP, DJ_DIM_2F, DJ_DIM_D, DJ_DIM_F, DJ_DIM_F),
    DJ_WN(DJ_W_DOWN, DJ_LAYER "mlp.down_proj.weight", DJ_DIM_D, DJ_DIM_F),
};
static const dj_wname global_names[] = {DJ_WN_LLAMA_GLOBAL};

const dj_arch_desc dj__arch_phi3 = DJ_ARCH_DESC(parse, layer_names, global_names, dj__layer_prenorm);
