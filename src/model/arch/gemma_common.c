/* gemma_common.c: the config keys Gemma 2 and Gemma 3 read alike. */
#include <math.h>

#include "model/arch/gemma_common.h"

dj_status dj__gemma_softcap(const cJSON *root, const char *key, float dflt, float *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it) {
        *out = dflt;
        return DJ_OK;
    }
    if (cJSON_IsNull(it)) {
        *out = 0.0f;
        return DJ_OK;
    }
    return dj__cfg_pos_float(root, "", key, true, dflt, out);
}

dj_status dj__gemma_parse_common(const cJSON *root, dj_model_config *c, float attn_softcap_dflt,
                                 float final_softcap_dflt) {
    dj_status st;
    if ((st = dj__cfg_act(root, "hidden_activation", DJ_ACT_GELU_TANH, true, &c->hidden_act))) return st;
    float q_scalar = 256.0f;
    if ((st = dj__cfg_pos_float(root, "", "query_pre_attn_scalar", false, 256.0f, &q_scalar))) return st;
    c->attn_scale = (float)pow((double)q_scalar, -0.5); /* transformers: a Python float times f32 scores */
    if ((st = dj__cfg_bool(root, "attention_bias", false, &c->attention_bias))) return st;
    if ((st = dj__cfg_bool(root, "tie_word_embeddings", true, &c->tie_word_embeddings))) return st;
    if ((st = dj__gemma_softcap(root, "attn_logit_softcapping", attn_softcap_dflt, &c->attn_softcap))) return st;
    if ((st = dj__gemma_softcap(root, "final_logit_softcapping", final_softcap_dflt, &c->final_softcap)))
        return st;
    if (!cJSON_GetObjectItemCaseSensitive(root, "sliding_window")) c->sliding_window = 4096;
    else if ((st = dj__cfg_u32(root, "", "sliding_window", false, 0, 0, &c->sliding_window))) return st;
    c->norm_offset = 1.0f;
    c->sandwich_norm = true;
    c->embed_scale = (float)sqrt((double)c->hidden_size); /* transformers: hidden_size**0.5 as f32 */
    c->sliding_by_layer = true;
    return DJ_OK;
}
