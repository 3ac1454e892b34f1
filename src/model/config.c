/* config.c: config.json of a Hugging Face model into dj_model_config - the
 * keys every architecture shares, with the defaults and checks transformers
 * applies; the architecture's own keys are read by its file (src/model/arch/). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "djinn/checkpoint.h"
#include "model/config_impl.h"
#include "model/model_impl.h"

#define CFG DJ_CFG
#define member dj__json_member
#define get_u32 dj__cfg_u32
#define get_pos_float dj__cfg_pos_float
#define get_bool dj__cfg_bool

static dj_status missing(const cJSON *obj, const char *where, const char *key) {
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(obj, key)))
        return dj_fail(DJ_EFORMAT, CFG "%skey \"%s\" is null, expected a number", where, key);
    return dj_fail(DJ_EFORMAT, CFG "%smissing key \"%s\"", where, key);
}

/* obj[key] as an integer in [min, UINT32_MAX]; dflt when absent or null
 * unless required. `where` names the enclosing object for messages. */
dj_status dj__cfg_u32(const cJSON *obj, const char *where, const char *key, bool required, uint32_t dflt,
                         uint32_t min, uint32_t *out) {
    const cJSON *it = member(obj, key);
    if (!it) {
        if (required) return missing(obj, where, key);
        *out = dflt;
        return DJ_OK;
    }
    if (!cJSON_IsNumber(it))
        return dj_fail(DJ_EFORMAT, CFG "%skey \"%s\" has type %s, expected an integer", where, key,
                       dj__json_type_name(it));
    uint64_t v;
    if (!dj__json_get_uint(it, &v) || v > UINT32_MAX || v < min)
        return dj_fail(DJ_ERANGE, CFG "%skey \"%s\" is %g, expected an integer in [%u, %u]", where, key,
                       it->valuedouble, (unsigned)min, (unsigned)UINT32_MAX);
    *out = (uint32_t)v;
    return DJ_OK;
}

/* obj[key] as a finite float > 0 (representable as float). */
dj_status dj__cfg_pos_float(const cJSON *obj, const char *where, const char *key, bool required, float dflt,
                               float *out) {
    const cJSON *it = member(obj, key);
    if (!it) {
        if (required) return missing(obj, where, key);
        *out = dflt;
        return DJ_OK;
    }
    if (!cJSON_IsNumber(it))
        return dj_fail(DJ_EFORMAT, CFG "%skey \"%s\" has type %s, expected a number", where, key,
                       dj__json_type_name(it));
    double d = it->valuedouble;
    /* Also rejects what a float cannot hold: 1e-86 would become 0. */
    if (!(d > 0.0 && d <= 3.0e38 && (float)d > 0.0f))
        return dj_fail(DJ_ERANGE, CFG "%skey \"%s\" is %g, expected a positive number a float can hold", where,
                       key, d);
    *out = (float)d;
    return DJ_OK;
}

dj_status dj__cfg_bool(const cJSON *obj, const char *key, bool dflt, bool *out) {
    const cJSON *it = member(obj, key);
    if (!it) {
        *out = dflt;
        return DJ_OK;
    }
    if (!cJSON_IsBool(it))
        return dj_fail(DJ_EFORMAT, CFG "key \"%s\" has type %s, expected a boolean", key,
                       dj__json_type_name(it));
    *out = cJSON_IsTrue(it);
    return DJ_OK;
}

/* A token id: absent/null -> -1, else an integer in [0, INT32_MAX]. */
static dj_status token_id(const cJSON *it, const char *key, int32_t *out) {
    uint64_t v;
    if (!dj__json_get_uint(it, &v) || v > INT32_MAX)
        return dj_fail(DJ_EFORMAT, CFG "key \"%s\" has a %s that is not a token id", key,
                       dj__json_type_name(it));
    *out = (int32_t)v;
    return DJ_OK;
}

static dj_status parse_arch(const cJSON *root, dj_model_config *cfg) {
    const cJSON *a = member(root, "architectures");
    if (!a) return dj_fail(DJ_EFORMAT, CFG "missing key \"architectures\"");
    if (!cJSON_IsArray(a))
        return dj_fail(DJ_EFORMAT, CFG "key \"architectures\" has type %s, expected an array",
                       dj__json_type_name(a));
    if (!a->child) return dj_fail(DJ_EFORMAT, CFG "key \"architectures\" is an empty array");
    if (!cJSON_IsString(a->child))
        return dj_fail(DJ_EFORMAT, CFG "architectures[0] has type %s, expected a string",
                       dj__json_type_name(a->child));
    const char *name = a->child->valuestring;
    for (int i = 0; i < DJ_ARCH_COUNT; i++) {
        if (!strcmp(name, dj__arch_name((dj_arch)i))) {
            cfg->arch = (dj_arch)i;
            snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", name);
            return DJ_OK;
        }
    }
    char list[512] = "";
    size_t o = 0;
    for (int i = 0; i < DJ_ARCH_COUNT && o < sizeof list; i++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", dj__arch_name((dj_arch)i));
    return dj_fail(DJ_EUNSUPPORTED, CFG "architecture \"%.64s\" is not supported (supported: %s)", name, list);
}

dj_status dj__cfg_act(const cJSON *root, const char *key, dj_act dflt, bool gelu_ok, dj_act *out) {
    const cJSON *act = member(root, key);
    *out = dflt;
    if (!act) return DJ_OK;
    if (!cJSON_IsString(act))
        return dj_fail(DJ_EFORMAT, CFG "key \"%s\" has type %s, expected a string", key, dj__json_type_name(act));
    if (!strcmp(act->valuestring, "silu")) {
        *out = DJ_ACT_SILU;
    } else if (gelu_ok && !strcmp(act->valuestring, "gelu_pytorch_tanh")) {
        *out = DJ_ACT_GELU_TANH;
    } else {
        return dj_fail(DJ_EUNSUPPORTED, CFG "%s \"%.64s\" is not supported (only \"silu\"%s)", key,
                       act->valuestring, gelu_ok ? " and \"gelu_pytorch_tanh\"" : "");
    }
    return DJ_OK;
}

/* A list of rope_dim/2 positive factors (longrope). */
static dj_status factor_list(const cJSON *rs, const char *where, const char *key, uint32_t want, float *out) {
    const cJSON *l = member(rs, key);
    if (!l) return dj_fail(DJ_EFORMAT, CFG "%smissing key \"%s\"", where, key);
    if (!cJSON_IsArray(l))
        return dj_fail(DJ_EFORMAT, CFG "%skey \"%s\" has type %s, expected an array", where, key,
                       dj__json_type_name(l));
    if ((uint32_t)cJSON_GetArraySize(l) != want)
        return dj_fail(DJ_EFORMAT, CFG "%skey \"%s\" has %d entries, expected %u (rotated dims / 2)", where, key,
                       cJSON_GetArraySize(l), (unsigned)want);
    uint32_t i = 0;
    for (const cJSON *c = l->child; c; c = c->next, i++) {
        if (!cJSON_IsNumber(c) || !(c->valuedouble > 0.0 && c->valuedouble < 3.0e38))
            return dj_fail(DJ_EFORMAT, CFG "%s%s[%u] is not a positive number", where, key, (unsigned)i);
        if (out) out[i] = (float)c->valuedouble;
    }
    return DJ_OK;
}

/* Phi-3's longrope: the short and the long factors (a session whose context
 * exceeds original_max_position_embeddings rotates with the long ones, see
 * dj_session_new), and the attention factor (given, or sqrt(1 + ln(s)/ln(orig)) with
 * s = max_position_embeddings / orig, as transformers). */
static dj_status parse_longrope(const cJSON *root, const cJSON *rs, const char *where, dj_model_config *cfg) {
    const uint32_t half = cfg->rope_dim / 2;
    if (half > DJ_ROPE_MAX_FACTORS)
        return dj_fail(DJ_EUNSUPPORTED, CFG "%slongrope over %u rotated dims: at most %u supported", where,
                       (unsigned)cfg->rope_dim, 2u * DJ_ROPE_MAX_FACTORS);
    dj_status st;
    if ((st = factor_list(rs, where, "short_factor", half, cfg->rope_ext_factor))) return st;
    if ((st = factor_list(rs, where, "long_factor", half, cfg->rope_long_factor))) return st;
    const char *okey = "original_max_position_embeddings";
    if (member(rs, okey)) st = get_u32(rs, where, okey, true, 0, 1, &cfg->rope_original_max_pos);
    else st = get_u32(root, "", okey, true, 0, 1, &cfg->rope_original_max_pos);
    if (st) return st;
    if (cfg->rope_original_max_pos < 2) /* its logarithm divides */
        return dj_fail(DJ_ERANGE, CFG "%s%s is %u, expected at least 2", where, okey,
                       (unsigned)cfg->rope_original_max_pos);
    if (member(rs, "attention_factor"))
        return get_pos_float(rs, where, "attention_factor", true, 1.0f, &cfg->rope_attn_factor);
    float factor = (float)cfg->max_position_embeddings / (float)cfg->rope_original_max_pos;
    if (member(rs, "factor") && (st = get_pos_float(rs, where, "factor", true, 1.0f, &factor))) return st;
    cfg->rope_factor = factor;
    cfg->rope_attn_factor =
        factor <= 1.0f ? 1.0f
                       : (float)sqrt(1.0 + log((double)factor) / log((double)cfg->rope_original_max_pos));
    return DJ_OK;
}

dj_status dj__cfg_rope_object(const cJSON *root, const cJSON *rs, const char *key, dj_model_config *cfg) {
    char where[64];
    snprintf(where, sizeof where, "%s: ", key);
    if (!cJSON_IsObject(rs))
        return dj_fail(DJ_EFORMAT, CFG "key \"%s\" has type %s, expected an object or null", key,
                       dj__json_type_name(rs));
    dj_status st;
    if (member(rs, "rope_theta") && (st = get_pos_float(rs, where, "rope_theta", true, 10000.0f, &cfg->rope_theta)))
        return st;
    const cJSON *t = member(rs, "rope_type");
    const char *tkey = "rope_type";
    if (!t) {
        t = member(rs, "type");
        tkey = "type";
    }
    if (!t) {
        /* rope_parameters may hold only rope_theta; rope_scaling must say. */
        if (strcmp(key, "rope_scaling")) return DJ_OK;
        return dj_fail(DJ_EFORMAT, CFG "%smissing key \"rope_type\"", where);
    }
    if (!cJSON_IsString(t))
        return dj_fail(DJ_EFORMAT, CFG "%skey \"%s\" has type %s, expected a string", where, tkey,
                       dj__json_type_name(t));
    const char *type = t->valuestring;
    if (!strcmp(type, "default")) {
        cfg->rope_type = DJ_ROPE_DEFAULT;
    } else if (!strcmp(type, "linear")) {
        cfg->rope_type = DJ_ROPE_LINEAR;
        if ((st = get_pos_float(rs, where, "factor", true, 1.0f, &cfg->rope_factor))) return st;
    } else if (!strcmp(type, "llama3")) {
        cfg->rope_type = DJ_ROPE_LLAMA3;
        if ((st = get_pos_float(rs, where, "factor", true, 1.0f, &cfg->rope_factor))) return st;
        if ((st = get_pos_float(rs, where, "low_freq_factor", true, 1.0f, &cfg->rope_low_freq_factor)))
            return st;
        if ((st = get_pos_float(rs, where, "high_freq_factor", true, 1.0f, &cfg->rope_high_freq_factor)))
            return st;
        if ((st = get_u32(rs, where, "original_max_position_embeddings", true, 0, 1,
                          &cfg->rope_original_max_pos)))
            return st;
        /* The smooth band divides by (high - low). */
        if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
            return dj_fail(DJ_ERANGE, CFG "%shigh_freq_factor %g must exceed low_freq_factor %g", where,
                           (double)cfg->rope_high_freq_factor, (double)cfg->rope_low_freq_factor);
    } else if (!strcmp(type, "longrope") || !strcmp(type, "su")) {
        cfg->rope_type = DJ_ROPE_LONGROPE;
        if ((st = parse_longrope(root, rs, where, cfg))) return st;
    } else {
        return dj_fail(DJ_EUNSUPPORTED,
                       CFG "%srope type \"%.64s\" is not supported (supported: default, linear, llama3, longrope)",
                       where, type);
    }
    return DJ_OK;
}

dj_status dj__cfg_rope(const cJSON *root, dj_model_config *cfg) {
    const cJSON *params = member(root, "rope_parameters");
    if (params && !cJSON_IsObject(params))
        return dj_fail(DJ_EFORMAT, CFG "key \"rope_parameters\" has type %s, expected an object or null",
                       dj__json_type_name(params));
    dj_status st;
    if (member(root, "rope_theta") || !params) {
        st = get_pos_float(root, "", "rope_theta", false, 10000.0f, &cfg->rope_theta);
    } else {
        /* Newer transformers always write it here; absent means a layout
         * (e.g. per layer type) this architecture does not have. */
        st = get_pos_float(params, "rope_parameters: ", "rope_theta", true, 10000.0f, &cfg->rope_theta);
    }
    if (st) return st;
    const cJSON *rs = member(root, "rope_scaling");
    if (rs) return dj__cfg_rope_object(root, rs, "rope_scaling", cfg);
    if (params) return dj__cfg_rope_object(root, params, "rope_parameters", cfg);
    return DJ_OK;
}

static dj_status parse_tokens(const cJSON *root, dj_model_config *cfg) {
    cfg->bos_token_id = -1;
    for (int i = 0; i < 4; i++) cfg->eos_token_ids[i] = -1;
    const cJSON *b = member(root, "bos_token_id");
    dj_status st;
    if (b && (st = token_id(b, "bos_token_id", &cfg->bos_token_id))) return st;
    const cJSON *e = member(root, "eos_token_id");
    if (!e) return DJ_OK;
    if (cJSON_IsArray(e)) {
        int n = cJSON_GetArraySize(e);
        if (n > 4)
            return dj_fail(DJ_EUNSUPPORTED, CFG "key \"eos_token_id\" lists %d ids, at most 4 are supported", n);
        int i = 0;
        for (const cJSON *c = e->child; c; c = c->next, i++)
            if ((st = token_id(c, "eos_token_id", &cfg->eos_token_ids[i]))) return st;
        return DJ_OK;
    }
    return token_id(e, "eos_token_id", &cfg->eos_token_ids[0]);
}

/* Qwen2: the window applies to layers from max_window_layers on, and only
 * when use_sliding_window is true (as transformers' Qwen2Config). A
 * "layer_types" list, when written, must agree with that shape. */
dj_status dj__cfg_window_from_layer(const cJSON *root, dj_model_config *cfg) {
    bool use = false;
    dj_status st;
    if ((st = get_bool(root, "use_sliding_window", false, &use))) return st;
    uint32_t window = 0, first = 28;
    if ((st = get_u32(root, "", "sliding_window", false, 0, 0, &window))) return st;
    if ((st = get_u32(root, "", "max_window_layers", false, 28, 0, &first))) return st;
    if (!use) window = 0;
    const cJSON *lt = member(root, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt))
            return dj_fail(DJ_EFORMAT, CFG "key \"layer_types\" has type %s, expected an array",
                           dj__json_type_name(lt));
        if ((uint32_t)cJSON_GetArraySize(lt) != cfg->n_layers)
            return dj_fail(DJ_EFORMAT, CFG "key \"layer_types\" has %d entries for %u layers",
                           cJSON_GetArraySize(lt), (unsigned)cfg->n_layers);
        uint32_t i = 0;
        first = cfg->n_layers;
        for (const cJSON *c = lt->child; c; c = c->next, i++) {
            bool sliding = cJSON_IsString(c) && !strcmp(c->valuestring, "sliding_attention");
            if (!sliding && !(cJSON_IsString(c) && !strcmp(c->valuestring, "full_attention")))
                return dj_fail(DJ_EUNSUPPORTED, CFG "layer_types[%u] is not \"full_attention\" or \"sliding_attention\"",
                               (unsigned)i);
            if (sliding && first == cfg->n_layers) first = i;
            if (!sliding && first != cfg->n_layers)
                return dj_fail(DJ_EUNSUPPORTED,
                               CFG "layer_types: full attention at layer %u after sliding layers is not supported",
                               (unsigned)i);
        }
    }
    if (first >= cfg->n_layers) window = 0;
    cfg->sliding_window = window;
    cfg->sliding_window_first_layer = window ? first : 0;
    return DJ_OK;
}

dj_status dj__cfg_layer_types(const cJSON *root, dj_model_config *cfg, bool *present) {
    *present = false;
    const cJSON *lt = member(root, "layer_types");
    if (!lt) return DJ_OK;
    if (!cJSON_IsArray(lt))
        return dj_fail(DJ_EFORMAT, CFG "key \"layer_types\" has type %s, expected an array", dj__json_type_name(lt));
    if ((uint32_t)cJSON_GetArraySize(lt) != cfg->n_layers)
        return dj_fail(DJ_EFORMAT, CFG "key \"layer_types\" has %d entries for %u layers", cJSON_GetArraySize(lt),
                       (unsigned)cfg->n_layers);
    if (cfg->n_layers > DJ_MAX_TYPED_LAYERS)
        return dj_fail(DJ_EUNSUPPORTED, CFG "layer_types for %u layers: at most %u supported",
                       (unsigned)cfg->n_layers, DJ_MAX_TYPED_LAYERS);
    memset(cfg->layer_sliding, 0, sizeof cfg->layer_sliding);
    uint32_t i = 0;
    for (const cJSON *c = lt->child; c; c = c->next, i++) {
        const bool sliding = cJSON_IsString(c) && !strcmp(c->valuestring, "sliding_attention");
        if (!sliding && !(cJSON_IsString(c) && !strcmp(c->valuestring, "full_attention")))
            return dj_fail(DJ_EUNSUPPORTED, CFG "layer_types[%u] is not \"full_attention\" or \"sliding_attention\"",
                           (unsigned)i);
        if (sliding) cfg->layer_sliding[i / 8] |= (uint8_t)(1u << (i % 8));
    }
    *present = true;
    return DJ_OK;
}

bool dj__layer_is_sliding(const dj_model_config *c, uint32_t l) {
    if (c->sliding_by_layer) return l < DJ_MAX_TYPED_LAYERS && (c->layer_sliding[l / 8] >> (l % 8) & 1u);
    return l >= c->sliding_window_first_layer;
}

uint32_t dj__layer_window(const dj_model_config *c, uint32_t l) {
    return dj__layer_is_sliding(c, l) ? c->sliding_window : 0;
}

dj_status dj_model_config_parse(const char *json, size_t len, dj_model_config *cfg) {
    if (!cfg || (!json && len)) return dj_fail(DJ_EINVAL, "config: NULL argument");
    memset(cfg, 0, sizeof *cfg);
    size_t err_pos;
    cJSON *root = dj__json_parse(json, len, &err_pos);
    if (!root) return dj_fail(DJ_EFORMAT, CFG "not valid JSON (error at byte %zu)", err_pos);
    dj_status st = DJ_OK;
    if (!cJSON_IsObject(root)) {
        st = dj_fail(DJ_EFORMAT, CFG "is a JSON %s, expected an object", dj__json_type_name(root));
        goto done;
    }
    const char *dup;
    if ((st = dj__json_find_duplicate_key(root, &dup))) goto done;
    if (dup) {
        st = dj_fail(DJ_EFORMAT, CFG "key \"%.64s\" appears twice", dup);
        goto done;
    }
    if ((st = parse_arch(root, cfg))) goto done;

#define U32(key, req, dflt, min, field) \
    if ((st = get_u32(root, "", key, req, dflt, min, &cfg->field))) goto done
    U32("vocab_size", true, 0, 1, vocab_size);
    U32("hidden_size", true, 0, 1, hidden_size);
    U32("intermediate_size", true, 0, 1, intermediate_size);
    U32("num_hidden_layers", true, 0, 1, n_layers);
    U32("num_attention_heads", true, 0, 1, n_heads);
    U32("num_key_value_heads", false, cfg->n_heads, 1, n_kv_heads);
    U32("max_position_embeddings", true, 0, 1, max_position_embeddings);
    bool head_dim_given = member(root, "head_dim") != NULL;
    U32("head_dim", false, 0, 1, head_dim);
#undef U32
    if ((st = get_pos_float(root, "", "rms_norm_eps", true, 0.0f, &cfg->rms_norm_eps))) goto done;

    if (!head_dim_given) {
        if (cfg->hidden_size % cfg->n_heads) {
            st = dj_fail(DJ_EFORMAT, CFG "hidden_size %u is not divisible by num_attention_heads %u",
                         (unsigned)cfg->hidden_size, (unsigned)cfg->n_heads);
            goto done;
        }
        cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    }
    if (cfg->n_heads % cfg->n_kv_heads) {
        st = dj_fail(DJ_EFORMAT, CFG "num_attention_heads %u is not divisible by num_key_value_heads %u",
                     (unsigned)cfg->n_heads, (unsigned)cfg->n_kv_heads);
        goto done;
    }
    if (cfg->head_dim % 2) {
        st = dj_fail(DJ_EFORMAT, CFG "head_dim %u is odd; rotary embeddings need it even",
                     (unsigned)cfg->head_dim);
        goto done;
    }

    cfg->rope_type = DJ_ROPE_DEFAULT;
    cfg->rope_factor = 1.0f;
    cfg->rope_low_freq_factor = 1.0f;
    cfg->rope_high_freq_factor = 1.0f;
    cfg->rope_original_max_pos = 0;
    cfg->rope_attn_factor = 1.0f;
    cfg->rope_dim = cfg->head_dim;
    cfg->hidden_act = DJ_ACT_SILU;
    if ((st = get_bool(root, "tie_word_embeddings", false, &cfg->tie_word_embeddings))) goto done;
    /* The architecture's own keys, RoPE included (Gemma 3 has two). */
    if ((st = dj__arch(cfg->arch)->parse(root, cfg))) goto done;
    if (cfg->rope_dim == 0 || cfg->rope_dim % 2 || cfg->rope_dim > cfg->head_dim) {
        st = dj_fail(DJ_EFORMAT, CFG "%u rotated dims of a %u-dim head: need an even number in [2, head_dim]",
                     (unsigned)cfg->rope_dim, (unsigned)cfg->head_dim);
        goto done;
    }

    if ((st = parse_tokens(root, cfg))) goto done;
    if ((st = dj__cfg_quant(root, cfg))) goto done;

    const cJSON *dt = member(root, "torch_dtype");
    const char *dkey = "torch_dtype";
    if (!dt) {
        dt = member(root, "dtype");
        dkey = "dtype";
    }
    if (dt) {
        if (!cJSON_IsString(dt)) {
            st = dj_fail(DJ_EFORMAT, CFG "key \"%s\" has type %s, expected a string", dkey, dj__json_type_name(dt));
            goto done;
        }
        if (strlen(dt->valuestring) >= sizeof cfg->torch_dtype) {
            st = dj_fail(DJ_EFORMAT, CFG "key \"%s\" value \"%.32s\" is too long", dkey, dt->valuestring);
            goto done;
        }
        snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", dt->valuestring);
    }

done:
    cJSON_Delete(root);
    if (st) memset(cfg, 0, sizeof *cfg);
    return st;
}

uint32_t dj_model_config_default_ctx(const dj_model_config *c) {
    uint32_t ctx = c->max_position_embeddings ? c->max_position_embeddings : DJ_DEFAULT_CTX_CAP;
    if (ctx > DJ_DEFAULT_CTX_CAP) ctx = DJ_DEFAULT_CTX_CAP;
    if (c->rope_type == DJ_ROPE_LONGROPE && ctx > c->rope_original_max_pos) ctx = c->rope_original_max_pos;
    return ctx;
}

bool dj_model_config_rope_long(const dj_model_config *c, uint32_t ctx) {
    return c->rope_type == DJ_ROPE_LONGROPE && ctx > c->rope_original_max_pos;
}
