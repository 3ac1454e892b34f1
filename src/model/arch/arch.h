/* arch.h: what an architecture file (src/model/arch/<name>.c) includes - the
 * registry types, the config readers, and name tables of the Llama layout
 * that most architectures share. Private to src/model/. */
#ifndef DJ_MODEL_ARCH_H
#define DJ_MODEL_ARCH_H

#include "model/config_impl.h"
#include "model/model_impl.h"

/* dj_wname entries: {slot, format, rows, cols, row0, nrows, when}. */
#define DJ_WN(slot, fmt, rows, cols) {slot, fmt, rows, cols, DJ_DIM_NONE, DJ_DIM_NONE, DJ_BIND_ALWAYS}
#define DJ_WN_IF(slot, fmt, rows, cols, when) {slot, fmt, rows, cols, DJ_DIM_NONE, DJ_DIM_NONE, when}
/* rows [row0, row0 + nrows) of a fused tensor of `rows` rows */
#define DJ_WN_PART(slot, fmt, rows, cols, row0, nrows) {slot, fmt, rows, cols, row0, nrows, DJ_BIND_ALWAYS}

#define DJ_LAYER "model.layers.%d."
/* Llama's attention and MLP projections, and its global tensors. */
#define DJ_WN_LLAMA_QKVO                                                 \
    DJ_WN(DJ_W_Q, DJ_LAYER "self_attn.q_proj.weight", DJ_DIM_QD, DJ_DIM_D),   \
    DJ_WN(DJ_W_K, DJ_LAYER "self_attn.k_proj.weight", DJ_DIM_KVD, DJ_DIM_D),  \
    DJ_WN(DJ_W_V, DJ_LAYER "self_attn.v_proj.weight", DJ_DIM_KVD, DJ_DIM_D),  \
    DJ_WN(DJ_W_O, DJ_LAYER "self_attn.o_proj.weight", DJ_DIM_D, DJ_DIM_QD)
#define DJ_WN_LLAMA_MLP                                                  \
    DJ_WN(DJ_W_GATE, DJ_LAYER "mlp.gate_proj.weight", DJ_DIM_F, DJ_DIM_D),    \
    DJ_WN(DJ_W_UP, DJ_LAYER "mlp.up_proj.weight", DJ_DIM_F, DJ_DIM_D),        \
    DJ_WN(DJ_W_DOWN, DJ_LAYER "mlp.down_proj.weight", DJ_DIM_D, DJ_DIM_F)
#define DJ_WN_LLAMA_NORMS                                                              \
    DJ_WN(DJ_W_ATTN_NORM, DJ_LAYER "input_layernorm.weight", DJ_DIM_D, DJ_DIM_NONE),   \
    DJ_WN(DJ_W_FFN_NORM, DJ_LAYER "post_attention_layernorm.weight", DJ_DIM_D, DJ_DIM_NONE)
#define DJ_WN_LLAMA_GLOBAL                                                          \
    DJ_WN(DJ_W_EMBED, "model.embed_tokens.weight", DJ_DIM_V, DJ_DIM_D),             \
    DJ_WN(DJ_W_NORM, "model.norm.weight", DJ_DIM_D, DJ_DIM_NONE),                   \
    DJ_WN_IF(DJ_W_LM_HEAD, "lm_head.weight", DJ_DIM_V, DJ_DIM_D, DJ_BIND_IF_UNTIED)

#define DJ_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* A description of an architecture without experts. */
#define DJ_ARCH_DESC(parse_fn, layers, globals, layer_fn) \
    {parse_fn, layers, DJ_COUNT(layers), NULL, globals, DJ_COUNT(globals), layer_fn}

#endif
