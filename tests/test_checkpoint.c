/* test_checkpoint.c: safetensors headers, config.json variants and whole
 * checkpoint directories (single file and sharded), good and malformed. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "djinn/checkpoint.h"
#include "djinn/engine.h"
#include "testutil.h"

static char base_dir[256];

/* ---- files ---- */

static void write_bytes(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(2);
    }
    if (n && fwrite(buf, 1, n, f) != n) {
        perror(path);
        exit(2);
    }
    fclose(f);
}

static void write_text(const char *dir, const char *file, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    write_bytes(path, text, strlen(text));
}

/* A safetensors file from an explicit header text and data area. */
static void write_raw_st(const char *dir, const char *file, const char *header, const void *data,
                         size_t data_len) {
    size_t hl = strlen(header);
    size_t n = 8 + hl + data_len;
    unsigned char *buf = malloc(n);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (data_len) memcpy(buf + 8 + hl, data, data_len);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    write_bytes(path, buf, n);
    free(buf);
}

typedef struct {
    const char *name;
    const char *dtype; /* safetensors name */
    int ndim;
    int64_t shape[4];
    unsigned char *data; /* malloc'd, random */
    size_t nbytes;
} wtensor;

static size_t st_size(const char *dt) { return !strcmp(dt, "F32") ? 4 : 2; }

static wtensor make_tensor(const char *name, const char *dtype, int ndim, const int64_t *shape) {
    wtensor t = {name, dtype, ndim, {0}, NULL, st_size(dtype)};
    for (int d = 0; d < ndim; d++) {
        t.shape[d] = shape[d];
        t.nbytes *= (size_t)shape[d];
    }
    t.data = malloc(t.nbytes ? t.nbytes : 1);
    for (size_t i = 0; i < t.nbytes; i++) t.data[i] = (unsigned char)dj_test_rand();
    return t;
}

/* The writer: tensors laid out back to back in the given order, header
 * padded with spaces to 8 bytes as the reference writer does. */
static void write_st(const char *dir, const char *file, const wtensor *ts, size_t n) {
    char header[8192];
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        hl += (size_t)snprintf(header + hl, sizeof header - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                               ts[i].name, ts[i].dtype);
        for (int d = 0; d < ts[i].ndim; d++)
            hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s%lld", d ? "," : "",
                                   (long long)ts[i].shape[d]);
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "],\"data_offsets\":[%zu,%zu]}", off,
                               off + ts[i].nbytes);
        off += ts[i].nbytes;
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    while (hl % 8) header[hl++] = ' ';
    header[hl] = '\0';
    unsigned char *data = malloc(off ? off : 1);
    off = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(data + off, ts[i].data, ts[i].nbytes);
        off += ts[i].nbytes;
    }
    write_raw_st(dir, file, header, data, off);
    free(data);
}

static int case_no;

/* A fresh subdirectory of the test's temp dir. */
static const char *new_dir(char *buf, size_t n) {
    snprintf(buf, n, "%s/case%d", base_dir, case_no++);
    if (mkdir(buf, 0700) != 0) {
        perror(buf);
        exit(2);
    }
    return buf;
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char sub[768];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            remove_tree(sub);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* ---- configs ---- */

static const char *LLAMA_CFG =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 8,"
    " \"hidden_size\": 4, \"intermediate_size\": 16, \"num_hidden_layers\": 1,"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"max_position_embeddings\": 128,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"hidden_act\": \"silu\","
    " \"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"torch_dtype\": \"bfloat16\", \"rope_scaling\": null}";

/* Llama 3.1 8B's config.json as published (abridged to what matters). */
static const char *LLAMA31_CFG =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009], \"head_dim\": 128,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 131072, \"mlp_bias\": false,"
    " \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"},"
    " \"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.43.0\", \"use_cache\": true, \"vocab_size\": 128256}\n";

static const char *MISTRAL_CFG =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"head_dim\": null, \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
    " \"max_position_embeddings\": 32768, \"model_type\": \"mistral\", \"num_attention_heads\": 32,"
    " \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05,"
    " \"rope_theta\": 1000000.0, \"sliding_window\": null, \"tie_word_embeddings\": false,"
    " \"dtype\": \"bfloat16\", \"vocab_size\": 32768}";

static const char *QWEN2_CFG =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643,"
    " \"eos_token_id\": 151643, \"hidden_act\": \"silu\", \"hidden_size\": 896,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 4864, \"max_position_embeddings\": 32768,"
    " \"max_window_layers\": 21, \"model_type\": \"qwen2\", \"num_attention_heads\": 14,"
    " \"num_hidden_layers\": 24, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06,"
    " \"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"use_sliding_window\": false,"
    " \"vocab_size\": 151936}";

/* text with the first `from` replaced by `to` (static buffer). */
static const char *subst(const char *text, const char *from, const char *to) {
    static char buf[8192];
    const char *p = strstr(text, from);
    if (!p) {
        fprintf(stderr, "subst: \"%s\" not in text\n", from);
        exit(2);
    }
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(p - text), text, to, p + strlen(from));
    return buf;
}

static dj_status parse_cfg(const char *json, dj_model_config *cfg) {
    return dj_model_config_parse(json, strlen(json), cfg);
}

static bool err_has(const char *needle) {
    bool ok = strstr(dj_last_error(), needle) != NULL;
    if (!ok) fprintf(stderr, "  error \"%s\" lacks \"%s\"\n", dj_last_error(), needle);
    return ok;
}

/* Parse must fail with `want` and an error mentioning `needle`. */
#define CHECK_CFG_FAIL(json, want, needle)              \
    do {                                                \
        dj_model_config c_;                             \
        CHECK_ST(parse_cfg(json, &c_), want);           \
        CHECK(err_has(needle));                         \
    } while (0)

/* e4m3fn both ways: every finite code decodes to 2^(e-7)(1+m/8) (subnormals
 * m 2^-9) and encodes back to itself; halfway values round to the even code;
 * beyond 448 saturates. */
static void test_f8e4m3(void) {
    for (int c = 0; c < 256; c++) {
        const float v = dj_f8e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            CHECK(isnan(v));
            continue;
        }
        const int e = (c >> 3) & 15, m = c & 7;
        const float want = (c & 0x80 ? -1.0f : 1.0f) * (e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : (float)m / 512.0f);
        CHECK_MSG(v == want, "e4m3 code 0x%02x: %g, want %g", c, (double)v, (double)want);
        if (c != 0x80) CHECK_MSG(dj_f32_to_f8e4m3(v) == c, "e4m3 code 0x%02x does not encode back", c);
    }
    CHECK(dj_f32_to_f8e4m3(1.0625f) == 0x38);  /* halfway 1 and 1.125: even code 1.0 */
    CHECK(dj_f32_to_f8e4m3(1.1875f) == 0x3a);  /* halfway 1.125 and 1.25: even 1.25 */
    CHECK(dj_f32_to_f8e4m3(1000.0f) == 0x7e && dj_f32_to_f8e4m3(-1e30f) == 0xfe);
    CHECK(dj_f32_to_f8e4m3(0x1.8p-10f) == 0x01); /* 1.5 * 2^-10 = 0.75 of the smallest subnormal */
}

static void test_configs(void) {
    dj_model_config c;
    CHECK_OK(parse_cfg(LLAMA_CFG, &c));
    CHECK(c.arch == DJ_ARCH_LLAMA && !strcmp(c.arch_name, "LlamaForCausalLM"));
    CHECK(c.vocab_size == 8 && c.hidden_size == 4 && c.intermediate_size == 16 && c.n_layers == 1);
    CHECK(c.n_heads == 2 && c.n_kv_heads == 1 && c.head_dim == 2 && c.max_position_embeddings == 128);
    CHECK(c.rms_norm_eps == 1e-05f && c.rope_theta == 10000.0f && c.rope_type == DJ_ROPE_DEFAULT);
    CHECK(!c.tie_word_embeddings && !c.attention_bias && !c.mlp_bias && c.sliding_window == 0);
    CHECK(c.bos_token_id == 1 && c.eos_token_ids[0] == 2 && c.eos_token_ids[1] == -1);
    CHECK(!strcmp(c.torch_dtype, "bfloat16"));
    CHECK(c.quant == DJ_QUANT_NONE);
    CHECK_OK(parse_cfg(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"quantization_config\": {\"quant_method\": \"fp8\"}"), &c));
    CHECK(c.quant == DJ_QUANT_FP8 && c.quant_block[0] == 128 && c.quant_block[1] == 128);
    CHECK_OK(parse_cfg(subst(LLAMA_CFG, "\"rope_scaling\": null",
                             "\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": "
                             "\"float-quantized\", \"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 8, "
                             "\"type\": \"float\", \"strategy\": \"block\", \"block_structure\": [64, 32]}}}}"),
                       &c));
    CHECK(c.quant == DJ_QUANT_CT_FP8 && c.quant_block[0] == 64 && c.quant_block[1] == 32);
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"quantization_config\": {\"quant_method\": \"gguf\"}"),
                   DJ_EUNSUPPORTED, "quant_method \"gguf\"");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"quantization_config\": {\"quant_method\": \"fp8\", "
                         "\"weight_block_size\": [128]}"),
                   DJ_EFORMAT, "weight_block_size");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"quantization_config\": {\"quant_method\": \"fp8\", "
                         "\"fmt\": \"e5m2\"}"),
                   DJ_EUNSUPPORTED, "e5m2");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"quantization_config\": [1]"), DJ_EFORMAT,
                   "quantization_config");

    /* Defaults: no kv heads, no rope_theta, no token ids, no hidden_act. */
    const char *minimal =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 10, \"hidden_size\": 12,"
        " \"intermediate_size\": 6, \"num_hidden_layers\": 3, \"num_attention_heads\": 3,"
        " \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6, \"num_key_value_heads\": null}";
    CHECK_OK(parse_cfg(minimal, &c));
    CHECK(c.n_kv_heads == 3 && c.head_dim == 4 && c.rope_theta == 10000.0f && c.bos_token_id == -1);
    CHECK(c.eos_token_ids[0] == -1 && c.torch_dtype[0] == '\0' && c.rope_factor == 1.0f);

    CHECK_OK(parse_cfg(LLAMA31_CFG, &c));
    CHECK(c.rope_type == DJ_ROPE_LLAMA3 && c.rope_factor == 8.0f && c.rope_low_freq_factor == 1.0f);
    CHECK(c.rope_high_freq_factor == 4.0f && c.rope_original_max_pos == 8192 && c.rope_theta == 500000.0f);
    CHECK(c.head_dim == 128 && c.n_kv_heads == 8 && c.vocab_size == 128256 && c.bos_token_id == 128000);
    CHECK(c.eos_token_ids[0] == 128001 && c.eos_token_ids[1] == 128008 && c.eos_token_ids[2] == 128009);
    CHECK(c.eos_token_ids[3] == -1);

    /* Linear scaling, spelled with the older "type" key. */
    CHECK_OK(parse_cfg(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}"), &c));
    CHECK(c.rope_type == DJ_ROPE_LINEAR && c.rope_factor == 4.0f);
    /* Newer transformers: rope_theta and the scaling inside rope_parameters. */
    const char *rp = subst(LLAMA_CFG, "\"rope_theta\": 10000.0,",
                           "\"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\": \"llama3\", \"factor\": 32.0,"
                           " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                           " \"original_max_position_embeddings\": 8192},");
    CHECK_OK(parse_cfg(rp, &c));
    CHECK(c.rope_theta == 500000.0f && c.rope_type == DJ_ROPE_LLAMA3 && c.rope_factor == 32.0f);
    CHECK_OK(parse_cfg(subst(LLAMA_CFG, "\"rope_theta\": 10000.0,",
                             "\"rope_parameters\": {\"rope_theta\": 1234.0, \"rope_type\": \"default\"},"), &c));
    CHECK(c.rope_theta == 1234.0f && c.rope_type == DJ_ROPE_DEFAULT);
    /* Llama biases. */
    CHECK_OK(parse_cfg(subst(LLAMA_CFG, "\"tie_word_embeddings\": false",
                             "\"tie_word_embeddings\": true, \"attention_bias\": true, \"mlp_bias\": true"), &c));
    CHECK(c.tie_word_embeddings && c.attention_bias && c.mlp_bias);

    CHECK_OK(parse_cfg(MISTRAL_CFG, &c));
    CHECK(c.arch == DJ_ARCH_MISTRAL && c.head_dim == 128 && c.sliding_window == 0);
    CHECK(!strcmp(c.torch_dtype, "bfloat16") && !c.attention_bias && c.rope_theta == 1000000.0f);
    CHECK_OK(parse_cfg(subst(MISTRAL_CFG, "\"sliding_window\": null", "\"sliding_window\": 4096"), &c));
    CHECK(c.sliding_window == 4096 && c.sliding_window_first_layer == 0);
    CHECK_OK(parse_cfg(subst(MISTRAL_CFG, "\"sliding_window\": null,", ""), &c));
    CHECK(c.sliding_window == 4096); /* transformers' default when absent */
    /* Mistral Nemo: head_dim given and not hidden/heads. */
    CHECK_OK(parse_cfg(subst(MISTRAL_CFG, "\"head_dim\": null", "\"head_dim\": 160"), &c));
    CHECK(c.head_dim == 160);

    CHECK_OK(parse_cfg(QWEN2_CFG, &c));
    CHECK(c.arch == DJ_ARCH_QWEN2 && c.attention_bias && !c.mlp_bias && c.tie_word_embeddings);
    CHECK(c.head_dim == 64 && c.n_kv_heads == 2 && c.sliding_window == 0 && c.rms_norm_eps == 1e-06f);
    CHECK_OK(parse_cfg(subst(QWEN2_CFG, "\"use_sliding_window\": false", "\"use_sliding_window\": true"), &c));
    CHECK(c.sliding_window == 32768 && c.sliding_window_first_layer == 21);
    /* An explicit layer_types list decides which layers slide. */
    {
        char lt[1024] = "\"use_sliding_window\": true, \"layer_types\": [";
        for (int i = 0; i < 24; i++)
            strcat(lt, i < 20 ? "\"full_attention\"," : i < 23 ? "\"sliding_attention\"," : "\"sliding_attention\"]");
        CHECK_OK(parse_cfg(subst(QWEN2_CFG, "\"use_sliding_window\": false", lt), &c));
        CHECK(c.sliding_window == 32768 && c.sliding_window_first_layer == 20);
    }
    CHECK_OK(parse_cfg(subst(QWEN2_CFG, "\"max_window_layers\": 21", "\"max_window_layers\": 24"), &c));
    CHECK(c.sliding_window == 0);

    /* Failures, each naming what is wrong. */
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "LlamaForCausalLM", "GPT2LMHeadModel"), DJ_EUNSUPPORTED, "GPT2LMHeadModel");
    CHECK(err_has("Qwen2ForCausalLM"));
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"hidden_size\": 4", "\"hidden_size\": \"4\""), DJ_EFORMAT, "hidden_size");
    CHECK(err_has("string"));
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": [1]"), DJ_EFORMAT, "rms_norm_eps");
    CHECK(err_has("array"));
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0"), DJ_EFORMAT,
                   "tie_word_embeddings");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"vocab_size\": 8,", ""), DJ_EFORMAT, "vocab_size");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"vocab_size\": 8", "\"vocab_size\": null"), DJ_EFORMAT, "\"vocab_size\" is null");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_theta\": 10000.0,", "\"rope_parameters\": {\"full_attention\": {}},"),
                   DJ_EFORMAT, "rope_parameters: missing key \"rope_theta\"");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e-86"), DJ_ERANGE, "rms_norm_eps");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_theta\": 10000.0", "\"rope_theta\": 1e39"), DJ_ERANGE, "rope_theta");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"vocab_size\": 8", "\"vocab_size\": 8.5"), DJ_ERANGE, "vocab_size");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"num_hidden_layers\": 1", "\"num_hidden_layers\": -1"), DJ_ERANGE,
                   "num_hidden_layers");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"num_hidden_layers\": 1", "\"num_hidden_layers\": 0"), DJ_ERANGE,
                   "num_hidden_layers");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"hidden_size\": 4", "\"hidden_size\": 5"), DJ_EFORMAT, "not divisible");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"num_key_value_heads\": 1", "\"num_key_value_heads\": 3"), DJ_EFORMAT,
                   "num_key_value_heads");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"hidden_size\": 4", "\"hidden_size\": 6"), DJ_EFORMAT, "odd");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""), DJ_EUNSUPPORTED,
                   "gelu");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_scaling\": null",
                         "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}"),
                   DJ_EUNSUPPORTED, "yarn");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}"),
                   DJ_EUNSUPPORTED, "dynamic");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"linear\"}"),
                   DJ_EFORMAT, "factor");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}"),
                   DJ_EFORMAT, "low_freq_factor");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"rope_scaling\": null", "\"rope_scaling\": 3"), DJ_EFORMAT, "rope_scaling");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"eos_token_id\": 2", "\"eos_token_id\": [1, 2, 3, 4, 5]"), DJ_EUNSUPPORTED,
                   "eos_token_id");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"eos_token_id\": 2", "\"eos_token_id\": \"2\""), DJ_EFORMAT, "eos_token_id");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"eos_token_id\": 2", "\"eos_token_id\": 2, \"vocab_size\": 9"), DJ_EFORMAT,
                   "vocab_size");
    CHECK(err_has("twice"));
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"architectures\": [\"LlamaForCausalLM\"]", "\"architectures\": []"),
                   DJ_EFORMAT, "architectures");
    CHECK_CFG_FAIL(subst(LLAMA_CFG, "\"architectures\": [\"LlamaForCausalLM\"]", "\"architectures\": \"LlamaForCausalLM\""),
                   DJ_EFORMAT, "architectures");
    CHECK_CFG_FAIL("{\"architectures\": [\"LlamaForCausalLM\"], ", DJ_EFORMAT, "not valid JSON");
    CHECK_CFG_FAIL("[1, 2]", DJ_EFORMAT, "expected an object");
    CHECK_CFG_FAIL("", DJ_EFORMAT, "not valid JSON");
    CHECK_CFG_FAIL("{} trailing", DJ_EFORMAT, "not valid JSON");
    /* A failed parse leaves nothing half-filled. */
    CHECK(c.vocab_size == 151936);
    CHECK_ST(parse_cfg("{\"architectures\": 1}", &c), DJ_EFORMAT);
    CHECK(c.vocab_size == 0 && c.arch_name[0] == '\0');
}

/* ---- safetensors headers (the parser alone) ---- */

#define CHECK_HDR_FAIL(hdr, data_len, want, needle)                                      \
    do {                                                                                 \
        dj_tensor_info *i_ = (dj_tensor_info *)1;                                        \
        size_t n_ = 99;                                                                  \
        CHECK_ST(dj_safetensors_parse_header(hdr, strlen(hdr), data_len, &i_, &n_), want); \
        CHECK(i_ == NULL && n_ == 0);                                                    \
        CHECK(err_has(needle));                                                          \
    } while (0)

static void test_headers(void) {
    const char *good = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[16,28]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                       "\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[28,30]},"
                       "\"z\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[30,30]},"
                       "\"__metadata__\":{\"format\":\"pt\"}}    ";
    dj_tensor_info *ti;
    size_t n;
    CHECK_OK(dj_safetensors_parse_header(good, strlen(good), 30, &ti, &n));
    CHECK(n == 4);
    if (n == 4) {
        CHECK(!strcmp(ti[0].name, "a") && ti[0].dtype == DJ_DTYPE_F32 && ti[0].ndim == 1 && ti[0].shape[0] == 4);
        CHECK((uintptr_t)ti[0].data == 0 && ti[0].nbytes == 16);
        CHECK(!strcmp(ti[1].name, "b") && ti[1].dtype == DJ_DTYPE_BF16 && ti[1].ndim == 2);
        CHECK(ti[1].shape[0] == 2 && ti[1].shape[1] == 3 && (uintptr_t)ti[1].data == 16 && ti[1].nbytes == 12);
        CHECK(!strcmp(ti[2].name, "s") && ti[2].ndim == 0 && ti[2].nbytes == 2);
        CHECK(!strcmp(ti[3].name, "z") && ti[3].nbytes == 0);
    }
    dj_safetensors_free_infos(ti, n);
    dj_safetensors_free_infos(NULL, 0);
    CHECK_OK(dj_safetensors_parse_header("{}", 2, 0, &ti, &n));
    CHECK(n == 0);
    dj_safetensors_free_infos(ti, n);

    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 15, DJ_EFORMAT,
                   "exceed the data area");
    CHECK(err_has("\"w\""));
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 16, DJ_EFORMAT, "\"w\"");
    CHECK(err_has("12 bytes"));
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", 16, DJ_EFORMAT,
                   "end before");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"v\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[6,10]}}",
                   16, DJ_EFORMAT, "overlap");
    CHECK(err_has("\"w\"") && err_has("\"v\""));
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, DJ_EFORMAT,
                   "unknown dtype \"Q4_K\"");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, DJ_EUNSUPPORTED,
                   "tensor \"w\" has dtype I64, which Djinn does not support");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F8_E5M2\",\"shape\":[2],\"data_offsets\":[0,2]}}", 16, DJ_EUNSUPPORTED,
                   "F8_E5M2");
    CHECK_HDR_FAIL("[{\"dtype\":\"F32\"}]", 16, DJ_EFORMAT, "expected an object");
    CHECK_HDR_FAIL("\"str\"", 16, DJ_EFORMAT, "expected an object");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   16, DJ_EFORMAT, "\"w\" twice");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 16, DJ_EFORMAT,
                   "not valid JSON");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}x", 16, DJ_EFORMAT,
                   "not valid JSON");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 16,
                   DJ_EUNSUPPORTED, "5 dimensions");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 16, DJ_EFORMAT,
                   "shape[0]");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 16, DJ_EFORMAT,
                   "shape[0]");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 16, DJ_EFORMAT,
                   "\"shape\" is a JSON string");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 16, DJ_EFORMAT,
                   "\"dtype\" is a JSON number");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 16, DJ_EFORMAT, "no \"data_offsets\"");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 16, DJ_EFORMAT,
                   "data_offsets");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 16,
                   DJ_EFORMAT, "unexpected key \"extra\"");
    CHECK_HDR_FAIL("{\"w\":[1,2]}", 16, DJ_EFORMAT, "tensor \"w\": entry is a JSON array");
    CHECK_HDR_FAIL("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
                   "\"data_offsets\":[0,4]}}",
                   16, DJ_EFORMAT, "overflows");
    CHECK_HDR_FAIL("{\"__metadata__\":{\"k\":1}}", 16, DJ_EFORMAT, "__metadata__");
}

/* ---- whole checkpoints ---- */

#define CHECK_OPEN_FAIL(dir, want, needle)                      \
    do {                                                        \
        dj_checkpoint_t *k_ = (dj_checkpoint_t *)1;             \
        CHECK_ST(dj_checkpoint_open(dir, &k_), want);           \
        CHECK(k_ == NULL);                                      \
        CHECK(err_has(needle));                                 \
    } while (0)

static bool same_tensor(const dj_tensor_info *t, const wtensor *w, dj_dtype dt) {
    if (!t || strcmp(t->name, w->name) || t->dtype != dt || t->ndim != w->ndim || t->nbytes != w->nbytes)
        return false;
    for (int d = 0; d < w->ndim; d++)
        if (t->shape[d] != w->shape[d]) return false;
    return w->nbytes == 0 || memcmp(t->data, w->data, w->nbytes) == 0;
}

static void test_single_file(void) {
    char d1[300], d2[300];
    new_dir(d1, sizeof d1);
    new_dir(d2, sizeof d2);
    wtensor ts[5] = {
        make_tensor("model.embed_tokens.weight", "BF16", 2, (int64_t[]){8, 4}),
        make_tensor("model.norm.weight", "F32", 1, (int64_t[]){4}),
        make_tensor("lm_head.weight", "F16", 2, (int64_t[]){8, 4}),
        make_tensor("model.layers.0.self_attn.q_proj.weight", "F32", 2, (int64_t[]){4, 4}),
        make_tensor("empty", "F32", 2, (int64_t[]){0, 4}),
    };
    const dj_dtype dts[5] = {DJ_DTYPE_BF16, DJ_DTYPE_F32, DJ_DTYPE_F16, DJ_DTYPE_F32, DJ_DTYPE_F32};
    write_text(d1, "config.json", LLAMA_CFG);
    write_st(d1, "model.safetensors", ts, 5);
    write_text(d2, "config.json", LLAMA_CFG);
    write_st(d2, "model.safetensors", ts, 5);

    dj_checkpoint_t *a = NULL, *b = NULL;
    CHECK_OK(dj_checkpoint_open(d1, &a));
    CHECK_OK(dj_checkpoint_open(d1, &b));
    if (!a || !b) goto out;
    CHECK(dj_checkpoint_tensor_count(a) == 5);
    CHECK(dj_checkpoint_config(a)->hidden_size == 4 && dj_checkpoint_config(a)->arch == DJ_ARCH_LLAMA);
    for (int i = 0; i < 5; i++) CHECK_MSG(same_tensor(dj_checkpoint_find(a, ts[i].name), &ts[i], dts[i]), "%s", ts[i].name);
    for (size_t i = 1; i < dj_checkpoint_tensor_count(a); i++)
        CHECK(strcmp(dj_checkpoint_tensor(a, i - 1)->name, dj_checkpoint_tensor(a, i)->name) < 0);
    CHECK(dj_checkpoint_tensor(a, 5) == NULL);
    CHECK(dj_checkpoint_find(a, "model.norm") == NULL && dj_checkpoint_find(a, "zzz") == NULL);
    CHECK(dj_checkpoint_find(a, "model.norm.weight") == dj_checkpoint_tensor(a, 4));

    uint64_t fa = dj_checkpoint_fingerprint(a);
    CHECK(fa == dj_checkpoint_fingerprint(b));
    CHECK(fa == dj_checkpoint_fingerprint(a));
    dj_checkpoint_close(b);
    b = NULL;

    /* Same directory contents elsewhere: same fingerprint. */
    CHECK_OK(dj_checkpoint_open(d2, &b));
    if (b) CHECK(dj_checkpoint_fingerprint(b) == fa);
    dj_checkpoint_close(b);
    b = NULL;

    /* One flipped bit in one tensor: a different fingerprint. */
    size_t which = dj_test_rand() % 4, at = dj_test_rand() % ts[which].nbytes;
    unsigned char mask = (unsigned char)(1u << (dj_test_rand() % 8));
    ts[which].data[at] ^= mask;
    write_st(d2, "model.safetensors", ts, 5);
    CHECK_OK(dj_checkpoint_open(d2, &b));
    if (b) CHECK(dj_checkpoint_fingerprint(b) != fa);
    dj_checkpoint_close(b);
    b = NULL;
    ts[which].data[at] ^= mask;

    /* Same weights, different architecture fields: different fingerprint. */
    write_st(d2, "model.safetensors", ts, 5);
    write_text(d2, "config.json", subst(LLAMA_CFG, "\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 1e-06"));
    CHECK_OK(dj_checkpoint_open(d2, &b));
    if (b) CHECK(dj_checkpoint_fingerprint(b) != fa);

out:
    dj_checkpoint_close(a);
    dj_checkpoint_close(b);
    dj_checkpoint_close(NULL);
    for (int i = 0; i < 5; i++) free(ts[i].data);
}

static void test_sharded(void) {
    char d[300];
    new_dir(d, sizeof d);
    wtensor s1[2] = {
        make_tensor("model.embed_tokens.weight", "BF16", 2, (int64_t[]){8, 4}),
        make_tensor("model.layers.0.input_layernorm.weight", "BF16", 1, (int64_t[]){4}),
    };
    wtensor s2[2] = {
        make_tensor("model.norm.weight", "BF16", 1, (int64_t[]){4}),
        make_tensor("model.layers.0.mlp.up_proj.weight", "F16", 2, (int64_t[]){16, 4}),
    };
    write_text(d, "config.json", LLAMA_CFG);
    write_st(d, "model-00001-of-00002.safetensors", s1, 2);
    write_st(d, "model-00002-of-00002.safetensors", s2, 2);
    /* The map leaves out the up_proj: it is still loaded. */
    write_text(d, "model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 100}, \"weight_map\": {"
               "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
               "\"model.layers.0.input_layernorm.weight\": \"model-00001-of-00002.safetensors\","
               "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}");
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(d, &ck));
    if (ck) {
        CHECK(dj_checkpoint_tensor_count(ck) == 4);
        for (int i = 0; i < 2; i++) {
            CHECK(same_tensor(dj_checkpoint_find(ck, s1[i].name), &s1[i], DJ_DTYPE_BF16));
            CHECK(same_tensor(dj_checkpoint_find(ck, s2[i].name), &s2[i], i ? DJ_DTYPE_F16 : DJ_DTYPE_BF16));
        }
        CHECK(dj_checkpoint_fingerprint(ck) != 0);
    }
    dj_checkpoint_close(ck);

    /* Index names a shard that does not exist. */
    write_text(d, "model.safetensors.index.json",
               "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
               "\"model.norm.weight\": \"model-00003-of-00002.safetensors\"}}");
    CHECK_OPEN_FAIL(d, DJ_ENOTFOUND, "model-00003-of-00002.safetensors");
    /* Index names a tensor its shard lacks. */
    write_text(d, "model.safetensors.index.json",
               "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
               "\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}");
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "\"model.norm.weight\" is not in shard model-00001-of-00002.safetensors");
    /* A lying index must not reach outside the directory, even where a
     * valid file waits. */
    write_st(base_dir, "evil.safetensors", s2, 2);
    write_text(d, "model.safetensors.index.json",
               "{\"weight_map\": {\"model.norm.weight\": \"../evil.safetensors\"}}");
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "outside the directory");
    write_text(d, "model.safetensors.index.json", "{\"weight_map\": {\"model.norm.weight\": \"..\"}}");
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "outside the directory");
    write_text(d, "model.safetensors.index.json", "{\"weight_map\": {\"model.norm.weight\": \"/etc/passwd\"}}");
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "outside the directory");
    write_text(d, "model.safetensors.index.json", "{\"weight_map\": {\"model.norm.weight\": 3}}");
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "model.norm.weight");
    write_text(d, "model.safetensors.index.json", "{\"weight_map\": [1]}");
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "weight_map");
    write_text(d, "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"x\",");
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "model.safetensors.index.json: not valid JSON");
    /* The same tensor in two shards. */
    wtensor both[2] = {s2[0], s1[0]};
    write_st(d, "model-00002-of-00002.safetensors", both, 2);
    write_text(d, "model.safetensors.index.json",
               "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
               "\"model.norm.weight\": \"model-00002-of-00002.safetensors\"}}");
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "\"model.embed_tokens.weight\" is in both");
    for (int i = 0; i < 2; i++) {
        free(s1[i].data);
        free(s2[i].data);
    }
}

static void test_bad_files(void) {
    char d[300];
    unsigned char zeros[64] = {0};

    /* No config.json. */
    new_dir(d, sizeof d);
    write_raw_st(d, "model.safetensors", "{}", NULL, 0);
    CHECK_OPEN_FAIL(d, DJ_ENOTFOUND, "config.json");
    /* Malformed config.json and an unknown architecture, through open. */
    write_text(d, "config.json", "{\"architectures\": [");
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "config.json: not valid JSON");
    write_text(d, "config.json", subst(LLAMA_CFG, "LlamaForCausalLM", "FalconForCausalLM"));
    CHECK_OPEN_FAIL(d, DJ_EUNSUPPORTED, "FalconForCausalLM");
    CHECK(err_has(d));
    /* No weights at all. */
    new_dir(d, sizeof d);
    write_text(d, "config.json", LLAMA_CFG);
    CHECK_OPEN_FAIL(d, DJ_ENOTFOUND, "model.safetensors");
    CHECK_OPEN_FAIL("/nonexistent/djinn/dir", DJ_ENOTFOUND, "config.json");

    /* Truncated: fewer than the 8 length bytes. */
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    write_bytes(path, "\x10\x00\x00", 3);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "too short");
    write_bytes(path, "", 0);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "too short");
    /* Header length larger than the file. */
    {
        unsigned char buf[100] = {0};
        uint64_t hl = 12345678;
        for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hl >> (8 * i));
        write_bytes(path, buf, sizeof buf);
        CHECK_OPEN_FAIL(d, DJ_EFORMAT, "model.safetensors: header length 12345678 exceeds file size 100");
        hl = 1ull << 62;
        for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hl >> (8 * i));
        write_bytes(path, buf, sizeof buf);
        CHECK_OPEN_FAIL(d, DJ_EFORMAT, "exceeds the limit");
    }
    /* Data cut short: offsets past the end of the file. */
    const char *w16 = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    write_raw_st(d, "model.safetensors", w16, zeros, 12);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "exceed the data area of 12 bytes");
    CHECK(err_has("model.safetensors") && err_has("\"w\""));
    /* Overlapping tensors. */
    write_raw_st(d, "model.safetensors",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                 "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                 zeros, 24);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "overlap");
    /* Byte range does not match shape * dtype size. */
    write_raw_st(d, "model.safetensors", "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                 zeros, 16);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "hold 16 bytes but 4 elements of BF16 need 8");
    /* Unknown and unsupported dtypes. */
    write_raw_st(d, "model.safetensors", "{\"w\":{\"dtype\":\"F31\",\"shape\":[4],\"data_offsets\":[0,16]}}",
                 zeros, 16);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "unknown dtype \"F31\"");
    write_raw_st(d, "model.safetensors", "{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}",
                 zeros, 16);
    CHECK_OPEN_FAIL(d, DJ_EUNSUPPORTED, "tensor \"w\" has dtype U8");
    /* Header that is JSON but not an object, and not JSON at all. */
    write_raw_st(d, "model.safetensors", "[1, 2, 3]", zeros, 0);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "header is a JSON array");
    write_raw_st(d, "model.safetensors", "{\"w\": {", zeros, 0);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "not valid JSON");
    /* Duplicate tensor name. */
    write_raw_st(d, "model.safetensors",
                 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 zeros, 8);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "\"w\" twice");
    /* A directory where a shard should be. */
    remove(path);
    mkdir(path, 0700);
    CHECK_OPEN_FAIL(d, DJ_EFORMAT, "not a regular file");
    rmdir(path);
    /* And a good file in the same place still opens (nothing stale). */
    write_raw_st(d, "model.safetensors", w16, zeros, 16);
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(d, &ck));
    if (ck) CHECK(dj_checkpoint_tensor_count(ck) == 1 && dj_checkpoint_find(ck, "w")->nbytes == 16);
    dj_checkpoint_close(ck);
}

/* Random mutations of a good file must never crash; an accepted one still
 * satisfies every bound. */
static void test_mutations(void) {
    char d[300];
    new_dir(d, sizeof d);
    write_text(d, "config.json", LLAMA_CFG);
    wtensor ts[3] = {
        make_tensor("a", "F32", 2, (int64_t[]){3, 5}),
        make_tensor("b", "BF16", 1, (int64_t[]){7}),
        make_tensor("c", "F16", 3, (int64_t[]){1, 2, 3}),
    };
    write_st(d, "model.safetensors", ts, 3);
    char path[512];
    snprintf(path, sizeof path, "%s/model.safetensors", d);
    size_t len;
    char *orig = dj_test_read_file(path, &len);
    char *buf = malloc(len);
    int accepted = 0;
    for (int it = 0; it < 300; it++) {
        memcpy(buf, orig, len);
        int nflips = 1 + (int)(dj_test_rand() % 3);
        for (int k = 0; k < nflips; k++) buf[dj_test_rand() % len] = (char)dj_test_rand();
        size_t cut = dj_test_rand() % 4 == 0 ? dj_test_rand() % len : len;
        write_bytes(path, buf, cut);
        dj_checkpoint_t *ck = NULL;
        dj_status st = dj_checkpoint_open(d, &ck);
        if (st == DJ_OK) {
            accepted++;
            for (size_t i = 0; i < dj_checkpoint_tensor_count(ck); i++) {
                const dj_tensor_info *t = dj_checkpoint_tensor(ck, i);
                size_t count = 1;
                for (int k = 0; k < t->ndim; k++) count *= (size_t)t->shape[k];
                CHECK(t->nbytes == count * dj_dtype_size(t->dtype) && t->nbytes <= cut);
            }
            dj_checkpoint_fingerprint(ck);
        } else {
            CHECK(ck == NULL && dj_last_error()[0] != '\0');
        }
        dj_checkpoint_close(ck);
    }
    printf("mutations: %d of 300 accepted\n", accepted);
    free(buf);
    free(orig);
    for (int i = 0; i < 3; i++) free(ts[i].data);
}

/* ---- real checkpoints written by transformers (tests/fixtures/models) ---- */

static bool has_shape(const dj_checkpoint_t *ck, const char *name, int64_t d0, int64_t d1, dj_dtype dt) {
    const dj_tensor_info *t = dj_checkpoint_find(ck, name);
    bool ok = t && t->dtype == dt && t->ndim == (d1 ? 2 : 1) && t->shape[0] == d0 && (!d1 || t->shape[1] == d1);
    if (!ok) fprintf(stderr, "  %s: missing or wrong shape/dtype\n", name);
    return ok;
}

/* The parsed config must describe exactly the tensors transformers saved. */
static void check_fixture(const char *name) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    char *ref_text = dj_test_read_file(path, NULL);
    if (!ref_text) {
        printf("fixture %s: absent, skipped\n", name);
        return;
    }
    cJSON *ref = cJSON_Parse(ref_text);
    free(ref_text);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(ref, "architecture");
    const cJSON *sd = cJSON_GetObjectItemCaseSensitive(ref, "stored_dtype");
    CHECK(cJSON_IsString(arch) && cJSON_IsString(sd));
    dj_checkpoint_t *ck = NULL, *ck2 = NULL;
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    CHECK_OK(dj_checkpoint_open(dir, &ck2));
    if (!ck || !ck2 || !cJSON_IsString(arch) || !cJSON_IsString(sd)) goto out;
    const dj_model_config *c = dj_checkpoint_config(ck);
    CHECK_MSG(!strcmp(c->arch_name, arch->valuestring), "%s", name);
    dj_dtype dt = !strcmp(sd->valuestring, "float32")    ? DJ_DTYPE_F32
                  : !strcmp(sd->valuestring, "float16") ? DJ_DTYPE_F16
                                                        : DJ_DTYPE_BF16;
    int64_t h = c->hidden_size, hd = c->head_dim, in = c->intermediate_size;
    size_t want = 2 + (c->tie_word_embeddings ? 0 : 1);
    CHECK(has_shape(ck, "model.embed_tokens.weight", c->vocab_size, h, dt));
    CHECK(has_shape(ck, "model.norm.weight", h, 0, dt));
    CHECK(c->tie_word_embeddings == (dj_checkpoint_find(ck, "lm_head.weight") == NULL));
    if (!c->tie_word_embeddings) CHECK(has_shape(ck, "lm_head.weight", c->vocab_size, h, dt));
    for (uint32_t l = 0; l < c->n_layers; l++) {
        char t[128];
#define LAYER(suffix, d0, d1)                                                      \
    snprintf(t, sizeof t, "model.layers.%u.%s", (unsigned)l, suffix);              \
    CHECK(has_shape(ck, t, d0, d1, dt));                                           \
    want++
        LAYER("input_layernorm.weight", h, 0);
        LAYER("post_attention_layernorm.weight", h, 0);
        LAYER("self_attn.q_proj.weight", c->n_heads * hd, h);
        LAYER("self_attn.k_proj.weight", c->n_kv_heads * hd, h);
        LAYER("self_attn.v_proj.weight", c->n_kv_heads * hd, h);
        LAYER("self_attn.o_proj.weight", h, c->n_heads * hd);
        LAYER("mlp.gate_proj.weight", in, h);
        LAYER("mlp.up_proj.weight", in, h);
        LAYER("mlp.down_proj.weight", h, in);
        if (c->attention_bias) {
            LAYER("self_attn.q_proj.bias", c->n_heads * hd, 0);
            LAYER("self_attn.k_proj.bias", c->n_kv_heads * hd, 0);
            LAYER("self_attn.v_proj.bias", c->n_kv_heads * hd, 0);
            if (c->arch == DJ_ARCH_LLAMA) {
                LAYER("self_attn.o_proj.bias", h, 0);
            }
        }
        if (c->mlp_bias) {
            LAYER("mlp.gate_proj.bias", in, 0);
            LAYER("mlp.up_proj.bias", in, 0);
            LAYER("mlp.down_proj.bias", h, 0);
        }
#undef LAYER
    }
    CHECK_MSG(dj_checkpoint_tensor_count(ck) == want, "%s: %zu tensors, config implies %zu", name,
              dj_checkpoint_tensor_count(ck), want);
    CHECK(dj_checkpoint_fingerprint(ck) == dj_checkpoint_fingerprint(ck2));
    printf("fixture %s: %zu tensors, fingerprint %016llx\n", name, dj_checkpoint_tensor_count(ck),
           (unsigned long long)dj_checkpoint_fingerprint(ck));
out:
    dj_checkpoint_close(ck);
    dj_checkpoint_close(ck2);
    cJSON_Delete(ref);
}

static void test_fixtures(void) {
    const char *names[] = {"llama2", "llama3", "mistral", "qwen2", "tinyllama"};
    uint64_t fps[5] = {0};
    for (int i = 0; i < 5; i++) check_fixture(names[i]);
    /* Different models, different fingerprints. */
    for (int i = 0; i < 5; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, names[i]);
        dj_checkpoint_t *ck = NULL;
        if (dj_checkpoint_open(dir, &ck) == DJ_OK) fps[i] = dj_checkpoint_fingerprint(ck);
        dj_checkpoint_close(ck);
        for (int j = 0; j < i; j++) CHECK(!fps[i] || fps[i] != fps[j]);
    }
}

/* Mappings of files under the test's temp dir still in this process (every
 * open that failed, and every close, must have unmapped its shards). */
static int count_our_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, base_dir)) n++;
    fclose(f);
    return n;
}

static int count_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* ---- fingerprints by file identity: a known file is not hashed again ---- */

static bool copy_file(const char *from, const char *to) {
    size_t len = 0;
    char *b = dj_test_read_file(from, &len);
    FILE *f = b ? fopen(to, "wb") : NULL;
    const bool ok = f && fwrite(b, 1, len, f) == len;
    if (f) fclose(f);
    free(b);
    return ok;
}

/* A fresh copy of the llama3 fixture in base_dir/name (new inodes). */
static bool copy_fixture(const char *name, char *dir, size_t cap) {
    snprintf(dir, cap, "%s/%s", base_dir, name);
    char a[700], b[700];
    bool ok = mkdir(dir, 0700) == 0;
    static const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; ok && i < 2; i++) {
        snprintf(a, sizeof a, "%s/models/llama3/%s", DJ_FIXTURES, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir, files[i]);
        ok = copy_file(a, b);
    }
    return ok;
}

static dj_engine_t *small_engine(void) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    dj_vmu_config_default(&ec.vmu, (size_t)16 << 20);
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    return e;
}

static void test_fingerprint_cache(void) {
    char dir[600], dir2[600], path[700];
    if (!copy_fixture("fp_a", dir, sizeof dir) || !copy_fixture("fp_b", dir2, sizeof dir2)) {
        CHECK_MSG(0, "cannot copy the llama3 fixture under %s", base_dir);
        return;
    }
    const uint64_t p0 = dj_checkpoint_hash_passes();
    /* First open: one pass. Second open of the same files: known, no pass. */
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    uint64_t fp = 0, fp2 = 0;
    CHECK(!dj_checkpoint_fingerprint_known(ck, NULL));
    fp = dj_checkpoint_fingerprint(ck);
    CHECK(dj_checkpoint_hash_passes() == p0 + 1);
    dj_checkpoint_close(ck);
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    CHECK(dj_checkpoint_fingerprint_known(ck, &fp2) && fp2 == fp);
    CHECK(dj_checkpoint_fingerprint(ck) == fp && dj_checkpoint_hash_passes() == p0 + 1);
    dj_checkpoint_close(ck);
    /* Engines: a load of known files and a second session's load in a
     * second engine hash nothing; the weights are the same model. */
    dj_engine_t *e1 = small_engine(), *e2 = small_engine();
    dj_model_t *m1 = NULL, *m1b = NULL, *m2 = NULL;
    if (e1 && e2) {
        CHECK_OK(dj_model_load(e1, dir, &m1));
        CHECK_OK(dj_model_load(e1, dir, &m1b)); /* shared: in the text segment already */
        CHECK_OK(dj_model_load(e2, dir, &m2));
        CHECK(m1 && m1 == m1b && m2 && dj_model_fingerprint(m1) == fp && dj_model_fingerprint(m2) == fp);
        CHECK_MSG(dj_checkpoint_hash_passes() == p0 + 1, "%llu passes for known files (want 1)",
                  (unsigned long long)(dj_checkpoint_hash_passes() - p0));
        /* A first load of unknown files (a copy: new inodes) hashes while it
         * copies - one pass - and finds the same weights already loaded. */
        dj_model_t *mc = NULL;
        CHECK_OK(dj_model_load(e1, dir2, &mc));
        CHECK(mc == m1 && dj_checkpoint_hash_passes() == p0 + 2);
        if (mc) dj_model_release(e1, mc);
        dj_engine_t *e3 = small_engine(); /* into an empty engine: copied and hashed in one pass */
        if (e3) {
            snprintf(path, sizeof path, "%s/model.safetensors", dir2);
            const struct timespec ts[2] = {{.tv_sec = 1000000000, .tv_nsec = 1}, {.tv_sec = 1000000000, .tv_nsec = 1}};
            CHECK(utimensat(AT_FDCWD, path, ts, 0) == 0); /* a changed mtime: unknown again */
            CHECK_OK(dj_model_load(e3, dir2, &mc));
            CHECK(mc && dj_model_fingerprint(mc) == fp && dj_checkpoint_hash_passes() == p0 + 3);
            dj_model_release(e3, mc);
            dj_engine_free(e3);
        }
    }
    if (e1) dj_model_release(e1, m1), dj_model_release(e1, m1b);
    if (e2) dj_model_release(e2, m2);
    dj_engine_free(e1);
    dj_engine_free(e2);
    /* A changed size: hashed again (trailing bytes after the data are allowed). */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "ab");
    if (f) {
        fputs("        ", f);
        fclose(f);
    }
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    CHECK(!dj_checkpoint_fingerprint_known(ck, NULL));
    CHECK(dj_checkpoint_fingerprint(ck) == fp && dj_checkpoint_hash_passes() == p0 + 4);
    dj_checkpoint_close(ck);
}

/* ---- 2 MiB pages: the cached pages dropped and read again, the bytes unchanged ---- */

static void test_huge_pages(void) {
    char dir[300];
    new_dir(dir, sizeof dir);
    const int64_t shape[2] = {1536, 2048}; /* 6 MiB of bf16, written through stdio's small writes */
    wtensor t = make_tensor("w", "BF16", 2, shape);
    write_st(dir, "model.safetensors", &t, 1);
    write_text(dir, "config.json", LLAMA_CFG);
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    if (!ck) {
        free(t.data);
        return;
    }
    CHECK(!dj_checkpoint_huge_pages_done(ck));
    const dj_tensor_info *w = dj_checkpoint_find(ck, "w");
    const size_t pmd = dj_checkpoint_huge_pages(ck);
    CHECK(dj_checkpoint_huge_pages_done(ck));
    CHECK_MSG(pmd % ((size_t)2 << 20) == 0 && pmd <= t.nbytes + 4096, "%zu bytes mapped by PMDs", pmd);
    CHECK_MSG(w && !memcmp(w->data, t.data, t.nbytes), "the weights changed under the re-read");
    CHECK(dj_checkpoint_huge_pages(ck) == pmd); /* once 2 MiB, nothing more to do */
    CHECK(w && !memcmp(w->data, t.data, t.nbytes));
    printf("test_checkpoint: %zu of %zu bytes mapped by 2 MiB pages here\n", pmd, t.nbytes);
    dj_checkpoint_close(ck);
    free(t.data);
}

int main(void) {
    dj_test_seeds();
    const char *tmp = getenv("TMPDIR");
    snprintf(base_dir, sizeof base_dir, "%s/djinn-ckpt-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base_dir)) {
        perror("mkdtemp");
        return 2;
    }
    int fds0 = count_fds();
    test_f8e4m3();
    test_configs();
    test_headers();
    test_single_file();
    test_sharded();
    test_bad_files();
    test_mutations();
    test_fixtures();
    test_fingerprint_cache();
    test_huge_pages();
    CHECK_MSG(count_our_maps() == 0, "%d mappings left", count_our_maps());
    CHECK_MSG(count_fds() == fds0, "%d file descriptors before, %d after", fds0, count_fds());
    remove_tree(base_dir);
    return dj_test_finish("test_checkpoint");
}
