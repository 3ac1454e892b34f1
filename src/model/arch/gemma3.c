/* gemma3.c: Gemma3ForCausalLM (text) - Gemma 2's layer without attention
 * soft-capping by default, with a per-head (1 + w) RMSNorm of q and k, and two
 * RoPEs: the sliding layers' (default, base rope_local_base_freq) and the
 * global layers' (rope_theta, with its scaling). transformers 5 writes both in
 * rope_parameters per layer type. The sliding layers come from layer_types,
 * else every layer but each sliding_window_pattern-th. */
#include "model/arch/gemma_common.h"

/* v5: rope_parameters = {"full_attention": {...}, "sliding_attention": {...}}. */
static dj_status parse_rope_by_type(const cJSON *root, const cJSON *params, dj_model_config *c) {
    const cJSON *full = dj__json_member(params, "full_attention");
    const cJSON *slide = dj__json_member(params, "sliding_attention");
    if (!full || !slide)
        return dj_fail(DJ_EFORMAT, DJ_CFG "rope_parameters: needs both \"full_attention\" and \"sliding_attention\"");
    dj_status st;
    if (!dj__json_member(full, "rope_theta") || !dj__json_member(slide, "rope_theta"))
        return dj_fail(DJ_EFORMAT, DJ_CFG "rope_parameters: missing key \"rope_theta\" of a layer type");
    if ((st = dj__cfg_rope_object(root, full, "rope_parameters.full_attention", c))) return st;
    dj_model_config local = *c;
    local.rope_type = DJ_ROPE_DEFAULT;
    if ((st = dj__cfg_rope_object(root, slide, "rope_parameters.sliding_attention", &local))) return st;
    if (local.rope_type != DJ_ROPE_DEFAULT)
        return dj_fail(DJ_EUNSUPPORTED, DJ_CFG "rope_parameters.sliding_attention: only the default rope type is "
                                              "supported for the sliding layers");
    c->rope_local_theta = local.rope_theta;
    return DJ_OK;
}

static dj_status parse(const void *root_, dj_model_config *c) {
    const cJSON *root = root_;
    dj_status st;
    if ((st = dj__gemma_parse_common(root, c, 0.0f, 0.0f))) return st;
    c->qk_norm = true;
    const cJSON *params = dj__json_member(root, "rope_parameters");
    if (params && cJSON_IsObject(params) &&
        (dj__json_member(params, "full_attention") || dj__json_member(params, "sliding_attention"))) {
        if ((st = parse_rope_by_type(root, params, c))) return st;
    } else {
        /* transformers 4: rope_theta (default 1e6) and rope_scaling for the global
         * layers, rope_local_base_freq for the sliding ones. */
        const cJSON *rs = dj__json_member(root, "rope_scaling");
        c->rope_theta = 1000000.0f;
        if (dj__json_member(root, "rope_theta") || params) st = dj__cfg_rope(root, c);
        else if (rs) st = dj__cfg_rope_object(root, rs, "rope_scaling", c);
        if (st) return st;
        if ((st = dj__cfg_pos_float(root, "", "rope_local_base_freq", false, 10000.0f, &c->rope_local_theta)))
            return st;
    }
    bool typed = false;
    if ((st = dj__cfg_layer_types(root, c, &typed))) return st;
    if (!typed) {
        uint32_t pattern = 6;
        if ((st = dj__cfg_u32(root, "", "sliding_window_pattern", false, 6, 1, &pattern))) return st;
        if (c->n_layers > DJ_MAX_TYPED_LAYERS)
            return dj_fail(DJ_EUNSUPPORTED, DJ_CFG "%u layers: at most %u supported", (unsigned)c->n_layers,
                           DJ_MAX_TYPED_LAYERS);
        for (uint32_t l = 0; l < c->n_layers; l++)
            if ((l + 1) % pattern) c->layer_sliding[l / 8] |= (uint8_t)(1u << (l % 8));
    }
    return DJ_OK;
}

static const dj_wname layer_names[] = {
    DJ_WN_GEMMA_LAYER,
    DJ_WN(DJ_W_Q_NORM, DJ_LAYER "self_attn.q_norm.weight", DJ_DIM_HD, DJ_DIM_NONE),
    DJ_WN(DJ_W_K_NORM, DJ_LAYER "self_attn.k_norm.weight", DJ_DIM_HD, DJ_DIM_NONE),
};
static const dj_wname global_names[] = {DJ_WN_LLAMA_GLOBAL};

const dj_arch_desc dj__arch_gemma3 = DJ_ARCH_DESC(parse, layer_names, global_names, dj__layer_sandwich);
