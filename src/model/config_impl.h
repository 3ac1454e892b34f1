/* config_impl.h: the config.json readers that config.c and the architecture
 * files (src/model/arch/) share - typed members with defaults and ranges, the
 * RoPE block, layer_types. Every error names the key. Private to src/model/. */
#ifndef DJ_MODEL_CONFIG_IMPL_H
#define DJ_MODEL_CONFIG_IMPL_H

#include "djinn/checkpoint.h"
#include "model/checkpoint_impl.h"

#define DJ_CFG "config.json: "

/* (A member of obj with JSON null treated as absent: dj__json_member,
 * checkpoint_impl.h.) */
/* obj[key] as an integer in [min, UINT32_MAX]; dflt when absent or null
 * unless required. `where` prefixes messages ("" at the top level). */
dj_status dj__cfg_u32(const cJSON *obj, const char *where, const char *key, bool required, uint32_t dflt,
                      uint32_t min, uint32_t *out /* OUT */);
/* obj[key] as a finite float > 0; dflt when absent unless required. */
dj_status dj__cfg_pos_float(const cJSON *obj, const char *where, const char *key, bool required, float dflt,
                            float *out /* OUT */);
dj_status dj__cfg_bool(const cJSON *obj, const char *key, bool dflt, bool *out /* OUT */);
/* The activation named by root[key] (dflt when absent): "silu", or
 * "gelu_pytorch_tanh" when gelu_ok; anything else is DJ_EUNSUPPORTED naming it. */
dj_status dj__cfg_act(const cJSON *root, const char *key, dj_act dflt, bool gelu_ok, dj_act *out /* OUT */);
/* rope_theta and rope_scaling / rope_parameters at the top level of root
 * (default, linear, llama3, longrope). Needs head_dim and rope_dim set. */
dj_status dj__cfg_rope(const cJSON *root, dj_model_config *cfg);
/* One RoPE object (rope_scaling, rope_parameters or one of its per-layer-type
 * entries) into cfg's rope fields, rope_theta included where it holds one;
 * `key` names it in messages. */
dj_status dj__cfg_rope_object(const cJSON *root, const cJSON *rs, const char *key, dj_model_config *cfg);
/* "layer_types" (n_layers entries of "full_attention"/"sliding_attention")
 * into cfg->layer_sliding; *present false (and nothing set) when absent. */
dj_status dj__cfg_layer_types(const cJSON *root, dj_model_config *cfg, bool *present /* OUT */);
/* Qwen2/Qwen3: use_sliding_window, sliding_window, max_window_layers (or the
 * first "sliding_attention" of layer_types, which must not return to full). */
dj_status dj__cfg_window_from_layer(const cJSON *root, dj_model_config *cfg);

/* root's "quantization_config" into cfg->quant and quant_block (quant.c);
 * absent or null: DJ_QUANT_NONE. Unsupported methods are refused naming them. */
dj_status dj__cfg_quant(const cJSON *root, dj_model_config *cfg);

#endif
