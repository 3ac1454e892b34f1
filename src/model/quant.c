/* quant.c: config.json's "quantization_config" - which quantized weight
 * layouts a checkpoint stores (transformers "fp8", compressed-tensors float8)
 * - and the refusal, naming it, of every other method, format or scheme. */
#include <stdio.h>
#include <string.h>

#include "model/config_impl.h"

#define QC DJ_CFG "quantization_config: "

/* obj[key] as a string, or NULL (absent/null); a non-string is an error. */
static dj_status get_str(const cJSON *obj, const char *where, const char *key, const char **out) {
    *out = NULL;
    const cJSON *it = dj__json_member(obj, key);
    if (!it) return DJ_OK;
    if (!cJSON_IsString(it))
        return dj_fail(DJ_EFORMAT, QC "%s\"%s\" is a JSON %s, expected a string", where, key,
                       dj__json_type_name(it));
    *out = it->valuestring;
    return DJ_OK;
}

/* A block shape [rows, cols] of two integers in [1, 65536]. */
static dj_status get_block(const cJSON *it, const char *what, uint32_t block[2]) {
    if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2)
        return dj_fail(DJ_EFORMAT, QC "%s must be a list of two integers", what);
    for (int i = 0; i < 2; i++) {
        uint64_t v = 0;
        if (!dj__json_get_uint(cJSON_GetArrayItem(it, i), &v) || v < 1 || v > 65536)
            return dj_fail(DJ_EFORMAT, QC "%s[%d] must be an integer in [1, 65536]", what, i);
        block[i] = (uint32_t)v;
    }
    return DJ_OK;
}

/* transformers' FineGrainedFP8Config. Activations are not quantized here
 * (W8A16): activation_scheme is read for its type only. */
static dj_status parse_fp8(const cJSON *q, dj_model_config *cfg) {
    const char *fmt = NULL;
    dj_status st = get_str(q, "", "fmt", &fmt);
    if (st) return st;
    if (fmt && strcmp(fmt, "e4m3"))
        return dj_fail(DJ_EUNSUPPORTED, QC "fp8 fmt \"%.32s\" is not supported (e4m3 only)", fmt);
    const char *act = NULL;
    if ((st = get_str(q, "", "activation_scheme", &act))) return st;
    const cJSON *b = dj__json_member(q, "weight_block_size");
    cfg->quant = DJ_QUANT_FP8;
    cfg->quant_block[0] = cfg->quant_block[1] = 128; /* transformers' default */
    return b ? get_block(b, "weight_block_size", cfg->quant_block) : DJ_OK;
}

/* One config group's "weights": 8-bit float, strategy tensor, channel or block. */
static dj_status parse_ct_weights(const cJSON *g, const char *gname, dj_model_config *cfg) {
    const cJSON *w = dj__json_member(g, "weights");
    if (!w) return dj_fail(DJ_EUNSUPPORTED, QC "config group \"%.64s\" quantizes no weights", gname);
    if (!cJSON_IsObject(w)) return dj_fail(DJ_EFORMAT, QC "config group \"%.64s\": weights is not an object", gname);
    const char *type = NULL, *strategy = NULL;
    dj_status st;
    if ((st = get_str(w, "weights ", "type", &type)) || (st = get_str(w, "weights ", "strategy", &strategy)))
        return st;
    uint64_t bits = 0;
    if (!dj__json_get_uint(dj__json_member(w, "num_bits"), &bits))
        return dj_fail(DJ_EFORMAT, QC "config group \"%.64s\": weights.num_bits is not an integer", gname);
    if (!type || strcmp(type, "float") || bits != 8)
        return dj_fail(DJ_EUNSUPPORTED,
                       QC "compressed-tensors group \"%.64s\": %u-bit %.16s weights are not supported "
                          "(8-bit float only)",
                       gname, (unsigned)bits, type ? type : "(untyped)");
    if (!strategy || (strcmp(strategy, "tensor") && strcmp(strategy, "channel") && strcmp(strategy, "block")))
        return dj_fail(DJ_EUNSUPPORTED,
                       QC "compressed-tensors group \"%.64s\": weight strategy \"%.32s\" is not supported "
                          "(tensor, channel, block)",
                       gname, strategy ? strategy : "(none)");
    if (!strcmp(strategy, "block")) {
        const cJSON *b = dj__json_member(w, "block_structure");
        if (!b) return dj_fail(DJ_EFORMAT, QC "config group \"%.64s\": block strategy without block_structure", gname);
        uint32_t blk[2];
        if ((st = get_block(b, "weights.block_structure", blk))) return st;
        if (cfg->quant_block[0] && (cfg->quant_block[0] != blk[0] || cfg->quant_block[1] != blk[1]))
            return dj_fail(DJ_EUNSUPPORTED, QC "config groups with different block structures");
        cfg->quant_block[0] = blk[0];
        cfg->quant_block[1] = blk[1];
    }
    return DJ_OK;
}

static dj_status parse_ct(const cJSON *q, dj_model_config *cfg) {
    const char *fmt = NULL;
    dj_status st = get_str(q, "", "format", &fmt);
    if (st) return st;
    if (fmt && strcmp(fmt, "float-quantized") && strcmp(fmt, "naive-quantized"))
        return dj_fail(DJ_EUNSUPPORTED,
                       QC "compressed-tensors format \"%.48s\" is not supported (float-quantized only)", fmt);
    const cJSON *sp = dj__json_member(q, "sparsity_config");
    if (sp && !(cJSON_IsObject(sp) && !sp->child))
        return dj_fail(DJ_EUNSUPPORTED, QC "compressed-tensors sparsity_config is not supported");
    const cJSON *groups = dj__json_member(q, "config_groups");
    if (!groups || !cJSON_IsObject(groups) || !groups->child)
        return dj_fail(DJ_EFORMAT, QC "compressed-tensors without config_groups");
    for (const cJSON *g = groups->child; g; g = g->next) {
        if (!cJSON_IsObject(g)) return dj_fail(DJ_EFORMAT, QC "config group \"%.64s\" is not an object", g->string);
        if ((st = parse_ct_weights(g, g->string, cfg))) return st;
        /* input/output activations: not applied (the weights are dequantized; W8A16) */
    }
    cfg->quant = DJ_QUANT_CT_FP8;
    return DJ_OK;
}

dj_status dj__cfg_quant(const cJSON *root, dj_model_config *cfg) {
    cfg->quant = DJ_QUANT_NONE;
    cfg->quant_block[0] = cfg->quant_block[1] = 0;
    const cJSON *q = dj__json_member(root, "quantization_config");
    if (!q) return DJ_OK;
    if (!cJSON_IsObject(q))
        return dj_fail(DJ_EFORMAT, DJ_CFG "quantization_config is a JSON %s, expected an object",
                       dj__json_type_name(q));
    const char *method = NULL;
    dj_status st = get_str(q, "", "quant_method", &method);
    if (st) return st;
    if (!method) return dj_fail(DJ_EFORMAT, QC "no quant_method");
    if (!strcmp(method, "fp8")) return parse_fp8(q, cfg);
    if (!strcmp(method, "compressed-tensors")) return parse_ct(q, cfg);
    if (!strcmp(method, "awq") || !strcmp(method, "gptq")) { /* the rest checked by src/model/quant4.c at open */
        cfg->quant = method[0] == 'a' ? DJ_QUANT_AWQ : DJ_QUANT_GPTQ;
        return DJ_OK;
    }
    return dj_fail(DJ_EUNSUPPORTED,
                   QC "quant_method \"%.48s\" is not supported (supported: fp8, compressed-tensors float8, awq and "
                      "gptq 4-bit)", method);
}
