/* gemma_common.h: what Gemma 2 and Gemma 3 share - the config keys of
 * their attention and MLP, and their tensor names (sandwich norms). */
#ifndef DJ_MODEL_ARCH_GEMMA_COMMON_H
#define DJ_MODEL_ARCH_GEMMA_COMMON_H

#include "model/arch/arch.h"

/* A softcap key: absent gives dflt, null gives 0 (none), else a positive number. */
dj_status dj__gemma_softcap(const cJSON *root, const char *key, float dflt, float *out /* OUT */);
/* hidden_activation, query_pre_attn_scalar, attention_bias, tie_word_embeddings
 * (default true), softcaps, sliding_window, and the traits: (1 + w) norms,
 * sandwich norms, embeddings times sqrt(hidden). */
dj_status dj__gemma_parse_common(const cJSON *root, dj_model_config *c, float attn_softcap_dflt,
                                 float final_softcap_dflt);

#define DJ_WN_GEMMA_LAYER                                                                           \
    DJ_WN(DJ_W_ATTN_NORM, DJ_LAYER "input_layernorm.weight", DJ_DIM_D, DJ_DIM_NONE),                \
    DJ_WN_LLAMA_QKVO,                                                                               \
    DJ_WN_IF(DJ_W_QB, DJ_LAYER "self_attn.q_proj.bias", DJ_DIM_QD, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),  \
    DJ_WN_IF(DJ_W_KB, DJ_LAYER "self_attn.k_proj.bias", DJ_DIM_KVD, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS), \
    DJ_WN_IF(DJ_W_VB, DJ_LAYER "self_attn.v_proj.bias", DJ_DIM_KVD, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS), \
    DJ_WN_IF(DJ_W_OB, DJ_LAYER "self_attn.o_proj.bias", DJ_DIM_D, DJ_DIM_NONE, DJ_BIND_IF_ATTN_BIAS),   \
    DJ_WN(DJ_W_POST_ATTN_NORM, DJ_LAYER "post_attention_layernorm.weight", DJ_DIM_D, DJ_DIM_NONE),  \
    DJ_WN(DJ_W_FFN_NORM, DJ_LAYER "pre_feedforward_layernorm.weight", DJ_DIM_D, DJ_DIM_NONE),       \
    DJ_WN(DJ_W_POST_FFN_NORM, DJ_LAYER "post_feedforward_layernorm.weight", DJ_DIM_D, DJ_DIM_NONE), \
    DJ_WN_LLAMA_MLP

#endif
