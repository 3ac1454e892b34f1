/* make_random_checkpoint.c: writes a Hugging Face checkpoint of a named
 * full-size shape (config.json + model.safetensors) with random bf16 weights,
 * for benchmarks: speed does not depend on what the weights mean.
 *   make_random_checkpoint PRESET OUT_DIR [--seed S] [--dtype bf16|f16|f32|fp8|fp8-channel] [--layers N] [--gguf FILE]
 *                          [--quant awq|gptq]
 * Presets: tinyllama-1.1b, llama3.2-1b (tied), llama3-8b, llama2-13b, llama3-70b (Llama layout),
 * qwen3-8b, gemma2-9b, mixtral-8x7b (their own layouts and configs). --layers
 * keeps the first N layers (Mixtral 8x7B's 32 layers do not fit 80 GB:
 * --layers 16). --gguf (Llama-layout presets) also writes the same values
 * (rounded to f16, norms f32) as an F16 GGUF for llama.cpp, the CPU
 * benchmark's side-by-side (bench/cpu_bench.sh). --dtype fp8 writes the
 * dense layers' linear weights as the official Qwen3/DeepSeek FP8 releases
 * store them (transformers "fp8": F8_E4M3 with f32 weight_scale_inv per
 * 128x128 block, quantization_config fp8), everything else bf16 - the FP8
 * benchmark (issue 16); --dtype fp8-channel as the RedHat/neuralmagic FP8
 * releases (compressed-tensors float-quantized: F8_E4M3 with an f32
 * weight_scale per output channel, dynamic per-token activations). --quant awq|gptq writes the dense layers' linear
 * weights as 4-bit AWQ (gemm) or GPTQ (v1) parts - qweight, qzeros, scales
 * (GPTQ also g_idx): random codes, AWQ's zero points 7 or 8 at random, GPTQ's 8 (sym),
 * scales that give about the bf16 weights' spread - with their
 * quantization_config (bits 4, group_size 128), the rest in --dtype. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "djinn/dtype.h"
#include "gguf_writer.h"

typedef enum { ARCH_LLAMA, ARCH_QWEN3, ARCH_GEMMA2, ARCH_MIXTRAL } arch_kind;

typedef struct preset {
    const char *name;
    int hidden, ffn, layers, heads, kv_heads, vocab, max_pos;
    double theta;
    int tie;
    arch_kind arch;
    int head_dim; /* 0: hidden / heads */
    int experts;  /* Mixtral: experts per layer (2 per token) */
} preset;

static const preset PRESETS[] = {
    {"tinyllama-1.1b", 2048, 5632, 22, 32, 4, 32000, 2048, 10000.0, 0, ARCH_LLAMA, 0, 0},
    {"llama3.2-1b", 2048, 8192, 16, 32, 8, 128256, 131072, 500000.0, 1, ARCH_LLAMA, 0, 0},
    {"llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0, 0, ARCH_LLAMA, 0, 0},
    {"llama2-13b", 5120, 13824, 40, 40, 40, 32000, 4096, 10000.0, 0, ARCH_LLAMA, 0, 0},
    {"llama3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, 500000.0, 0, ARCH_LLAMA, 0, 0},
    {"qwen3-8b", 4096, 12288, 36, 32, 8, 151936, 40960, 1000000.0, 0, ARCH_QWEN3, 128, 0},
    {"gemma2-9b", 3584, 14336, 42, 16, 8, 256000, 8192, 10000.0, 1, ARCH_GEMMA2, 256, 0},
    {"mixtral-8x7b", 4096, 14336, 32, 32, 8, 32000, 32768, 1000000.0, 0, ARCH_MIXTRAL, 0, 8},
};

typedef struct tensor {
    char name[160];
    int64_t rows, cols; /* cols 0: vector */
    int is_norm;
    int kind; /* 0: the --dtype of dense tensors; 1: F8_E4M3 (its scales follow); 2: f32 scales;
               * 4-bit parts (--quant): 3 qweight, 4 qzeros (i32), 5 scales (f16), 6 g_idx (i32) */
    int64_t fan_in; /* 4-bit parts and per-channel FP8 scales: the in features of the matrix */
} tensor;

/* GGUF names and dims (ne0 = columns first) of tensor i. */
typedef struct gguf_map {
    const struct tensor *t;
} gguf_map;

static void gguf_info(void *user, int i, char *name, uint64_t dims[2], uint32_t *ndim, uint32_t *type) {
    const struct tensor *t = &((const gguf_map *)user)->t[i];
    int layer = -1;
    char what[64] = "";
    static const char *const map[][2] = {
        {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
        {"mlp.gate_proj", "ffn_gate"},    {"mlp.up_proj", "ffn_up"},   {"mlp.down_proj", "ffn_down"}};
    if (sscanf(t->name, "model.layers.%d.%63s", &layer, what) == 2) {
        for (size_t m = 0; m < sizeof map / sizeof *map; m++)
            if (!strncmp(what, map[m][0], strlen(map[m][0]))) snprintf(name, 96, "blk.%d.%s.weight", layer, map[m][1]);
    } else if (!strcmp(t->name, "model.embed_tokens.weight")) {
        snprintf(name, 96, "token_embd.weight");
    } else if (!strcmp(t->name, "model.norm.weight")) {
        snprintf(name, 96, "output_norm.weight");
    } else {
        snprintf(name, 96, "output.weight");
    }
    dims[0] = (uint64_t)(t->cols ? t->cols : t->rows);
    dims[1] = (uint64_t)t->rows;
    *ndim = t->cols ? 2 : 1;
    *type = t->is_norm ? 0 : 1; /* F32 norms, F16 matrices */
}

static uint64_t rng = 0x1234567887654321ull;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s PRESET OUT_DIR [--seed S] [--dtype bf16|f16|f32|fp8|fp8-channel] [--quant awq|gptq]\n", argv[0]);
        return 2;
    }
    const preset *p = NULL;
    for (size_t i = 0; i < sizeof PRESETS / sizeof *PRESETS; i++)
        if (!strcmp(PRESETS[i].name, argv[1])) p = &PRESETS[i];
    if (!p) {
        fprintf(stderr, "unknown preset '%s' (tinyllama-1.1b, llama3.2-1b, llama3-8b, llama2-13b, llama3-70b, qwen3-8b, gemma2-9b, mixtral-8x7b)\n",
                argv[1]);
        return 2;
    }
    const char *dir = argv[2];
    dj_dtype dt = DJ_DTYPE_BF16;
    int layers = p->layers;
    const char *gguf_path = NULL;
    bool fp8 = false; /* --dtype fp8: linear weights F8_E4M3 + block scales, the rest bf16 */
    bool fp8_channel = false; /* --dtype fp8-channel: F8_E4M3 + a scale per output channel (compressed-tensors) */
    const char *quant = NULL; /* --quant awq|gptq */
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--quant")) quant = argv[i + 1];
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--gguf")) gguf_path = argv[i + 1];
        else if (!strcmp(argv[i], "--seed")) rng = strtoull(argv[i + 1], NULL, 10) * 2654435761u + 1;
        else if (!strcmp(argv[i], "--dtype")) {
            fp8_channel = !strcmp(argv[i + 1], "fp8-channel");
            fp8 = fp8_channel || !strcmp(argv[i + 1], "fp8");
            dt = !strcmp(argv[i + 1], "f32") ? DJ_DTYPE_F32 : !strcmp(argv[i + 1], "f16") ? DJ_DTYPE_F16 : DJ_DTYPE_BF16;
        }
    }
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    for (char *p = parent + 1; *p; p++) { /* mkdir -p */
        if (*p != '/') continue;
        *p = '\0';
        mkdir(parent, 0755);
        *p = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        perror(dir);
        return 1;
    }
    const int q_awq = quant && !strcmp(quant, "awq"), q_gptq = quant && !strcmp(quant, "gptq");
    if (quant && (!(q_awq || q_gptq) || fp8 || gguf_path || p->experts)) {
        fprintf(stderr, "--quant awq|gptq: dense presets only, without --gguf or --dtype fp8\n");
        return 2;
    }
    if (fp8 && (gguf_path || p->experts)) {
        fprintf(stderr, "--dtype fp8 (or fp8-channel): dense presets only, without --gguf\n");
        return 2;
    }
    if (gguf_path && p->arch != ARCH_LLAMA) {
        fprintf(stderr, "--gguf: only the Llama-layout presets\n");
        return 2;
    }
    if (layers < 1 || layers > p->layers) {
        fprintf(stderr, "--layers %d: %s has 1..%d\n", layers, p->name, p->layers);
        return 2;
    }
    const int hd = p->head_dim ? p->head_dim : p->hidden / p->heads;
    const int n_t = layers * (13 + 7 + 3 * p->experts) * (quant ? 4 : 1) + 3;
    tensor *t = calloc((size_t)n_t, sizeof *t);
    int k = 0;
#define T(r, c, norm, ...)                                           \
    do {                                                             \
        snprintf(t[k].name, sizeof t[k].name, __VA_ARGS__);          \
        t[k].rows = (r);                                             \
        t[k].cols = (c);                                             \
        t[k].is_norm = (norm);                                       \
        t[k].kind = 0;                                               \
        k++;                                                         \
    } while (0)
    /* a linear weight; with fp8 its 128x128-block scales follow it */
#define TL(r, c, ...)                                                                                        \
    do {                                                                                                     \
        T(r, c, 0, __VA_ARGS__);                                                                             \
        if (fp8) {                                                                                           \
            char base_[104];                                                                                 \
            t[k - 1].kind = 1;                                                                               \
            snprintf(base_, sizeof base_, "%.100s", t[k - 1].name);                                             \
            if (fp8_channel) {                                                                               \
                T(r, 1, 0, "%s_scale", base_);                                                               \
                t[k - 1].fan_in = (c);                                                                       \
            } else                                                                                           \
                T(((r) + 127) / 128, ((c) + 127) / 128, 0, "%s_scale_inv", base_);                           \
            t[k - 1].kind = 2;                                                                               \
        }                                                                                                    \
    } while (0)
    T(p->vocab, p->hidden, 0, "model.embed_tokens.weight");
    /* Gemma's norm weights apply as (1 + w): near 0 there is near 1 elsewhere */
    const int norm = p->arch == ARCH_GEMMA2 ? 2 : 1;
    for (int l = 0; l < layers; l++) {
        T(p->hidden, 0, norm, "model.layers.%d.input_layernorm.weight", l);
        TL((int64_t)p->heads * hd, p->hidden, "model.layers.%d.self_attn.q_proj.weight", l);
        TL((int64_t)p->kv_heads * hd, p->hidden, "model.layers.%d.self_attn.k_proj.weight", l);
        TL((int64_t)p->kv_heads * hd, p->hidden, "model.layers.%d.self_attn.v_proj.weight", l);
        TL(p->hidden, (int64_t)p->heads * hd, "model.layers.%d.self_attn.o_proj.weight", l);
        T(p->hidden, 0, norm, "model.layers.%d.post_attention_layernorm.weight", l);
        if (p->arch == ARCH_QWEN3) {
            T(hd, 0, 1, "model.layers.%d.self_attn.q_norm.weight", l);
            T(hd, 0, 1, "model.layers.%d.self_attn.k_norm.weight", l);
        }
        if (p->arch == ARCH_GEMMA2) {
            T(p->hidden, 0, norm, "model.layers.%d.pre_feedforward_layernorm.weight", l);
            T(p->hidden, 0, norm, "model.layers.%d.post_feedforward_layernorm.weight", l);
        }
        if (p->arch == ARCH_MIXTRAL) {
            T(p->experts, p->hidden, 0, "model.layers.%d.block_sparse_moe.gate.weight", l);
            for (int e = 0; e < p->experts; e++) {
                T(p->ffn, p->hidden, 0, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e);
                T(p->hidden, p->ffn, 0, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e);
                T(p->ffn, p->hidden, 0, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e);
            }
            continue;
        }
        TL(p->ffn, p->hidden, "model.layers.%d.mlp.gate_proj.weight", l);
        TL(p->ffn, p->hidden, "model.layers.%d.mlp.up_proj.weight", l);
        TL(p->hidden, p->ffn, "model.layers.%d.mlp.down_proj.weight", l);
    }
    T(p->hidden, 0, norm, "model.norm.weight");
    if (!p->tie) T(p->vocab, p->hidden, 0, "lm_head.weight");
#undef TL
#undef T
    if (quant) { /* each layer matrix becomes its 4-bit parts (N out, K in features) */
        const int n = k;
        for (int i = 0; i < n; i++) {
            if (strncmp(t[i].name, "model.layers.", 13) || !t[i].cols || t[i].cols % 128 || t[i].rows % 8) continue;
            const int64_t N = t[i].rows, K = t[i].cols;
            char base[96];
            snprintf(base, sizeof base, "%.*s", (int)(strlen(t[i].name) - strlen(".weight")), t[i].name);
            const struct { const char *suffix; int kind; int64_t rows, cols; } parts[4] = {
                {"qweight", 3, q_gptq ? K / 8 : K, q_gptq ? N : N / 8},
                {"qzeros", 4, K / 128, N / 8},
                {"scales", 5, K / 128, N},
                {"g_idx", 6, K, 0}};
            for (int j = 0; j < (q_gptq ? 4 : 3); j++) {
                tensor *d = j == 0 ? &t[i] : &t[k++];
                snprintf(d->name, sizeof d->name, "%.80s.%s", base, parts[j].suffix);
                d->rows = parts[j].rows;
                d->cols = parts[j].cols;
                d->is_norm = 0;
                d->kind = parts[j].kind;
                d->fan_in = K;
            }
        }
    }
    const size_t dense_esz = dj_dtype_size(dt);
    const char *dense_name = dt == DJ_DTYPE_F32 ? "F32" : dt == DJ_DTYPE_F16 ? "F16" : "BF16";
#define ESZ(i) (t[i].kind == 1 ? (size_t)1 : t[i].kind == 5 ? (size_t)2 : t[i].kind >= 2 ? (size_t)4 : dense_esz)
#define DNAME(i) (t[i].kind == 1 ? "F8_E4M3" : t[i].kind == 2 ? "F32" : t[i].kind == 5 ? "F16" : t[i].kind >= 3 ? "I32" \
                                                                                                   : dense_name)
    /* header */
    size_t cap = (size_t)k * 200 + 64, len = 0, off = 0;
    char *hdr = malloc(cap);
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (int i = 0; i < k; i++) {
        size_t bytes = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1) * ESZ(i);
        if (t[i].cols)
            len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                                    i ? "," : "", t[i].name, DNAME(i), (long long)t[i].rows, (long long)t[i].cols, off, off + bytes);
        else
            len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                    i ? "," : "", t[i].name, DNAME(i), (long long)t[i].rows, off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    uint64_t hl = len;
    fwrite(&hl, 8, 1, f);
    fwrite(hdr, 1, len, f);
    FILE *gf = gguf_path ? fopen(gguf_path, "wb") : NULL;
    if (gguf_path && !gf) {
        perror(gguf_path);
        return 1;
    }
    gguf_map gm = {t};
    if (gf) gguf_write_header(gf, p->hidden, p->ffn, layers, p->heads, p->kv_heads, p->vocab, p->max_pos, p->theta, k,
                              gguf_info, &gm);
    const size_t chunk = 1 << 20;
    uint8_t *buf = malloc(chunk * 4), *gbuf = malloc(chunk * 4);
    for (int i = 0; i < k; i++) {
        size_t n = (size_t)t[i].rows * (size_t)(t[i].cols ? t[i].cols : 1);
        /* matrices ~ U(-a, a) with a = sqrt(3/fan_in) (unit-variance outputs); norms near 1 */
        double a = t[i].cols ? sqrt(3.0 / (double)t[i].cols) : 0.0;
        /* fp8: codes of v / (a / 448) (the block's largest magnitude is about a); scales a / 448 of the
         * weight before them (its cols are the scales' cols * 128, near enough for the bound) */
        const double qa = t[i].kind == 2 && t[i].fan_in ? sqrt(3.0 / (double)t[i].fan_in) / 448.0
                          : t[i].kind == 2                ? sqrt(3.0 / (double)(t[i].cols * 128)) / 448.0
                                                          : a / 448.0;
        for (size_t done = 0; done < n;) {
            size_t m = n - done < chunk ? n - done : chunk;
            if (t[i].kind >= 3) { /* 4-bit parts: codes uniform, scales ~ a / 7.5 */
                for (size_t j = 0; j < m; j++) {
                    uint32_t v = (uint32_t)next();
                    if (t[i].kind == 6) v = (uint32_t)((done + j) / 128);
                    if (t[i].kind == 4 && q_gptq) v = 0x77777777u; /* sym: zero 8, stored minus 1 */
                    /* AWQ's zeros 7 or 8 at random: centered weights as a real checkpoint's (uniform
                     * zeros gave every group a mean of up to 7.5 steps, a model whose bf16 rounding
                     * differences grew to 5% of the logits), still varied per column */
                    else if (t[i].kind == 4) v = 0x77777777u + (v & 0x11111111u);
                    if (t[i].kind == 5) {
                        const double u = (double)(next() >> 11) * (1.0 / 9007199254740992.0);
                        const uint16_t h = dj_f32_to_f16((float)(sqrt(3.0 / (double)t[i].fan_in) / 7.5 * (0.75 + 0.5 * u)));
                        memcpy(buf + 2 * j, &h, 2);
                    } else {
                        memcpy(buf + 4 * j, &v, 4);
                    }
                }
                if (fwrite(buf, ESZ(i), m, f) != m) {
                    perror(path);
                    return 1;
                }
                done += m;
                continue;
            }
            for (size_t j = 0; j < m; j++) {
                double u = (double)(next() >> 11) * (1.0 / 9007199254740992.0);
                float v = t[i].is_norm == 2   ? (float)(-0.2 + 0.4 * u)
                          : t[i].is_norm ? (float)(0.8 + 0.4 * u)
                                         : (float)((2.0 * u - 1.0) * a);
                if (gf && t[i].is_norm) memcpy(gbuf + 4 * j, &v, 4);
                else if (gf) {
                    const uint16_t g = dj_f32_to_f16(v);
                    memcpy(gbuf + 2 * j, &g, 2);
                }
                if (t[i].kind == 1) {
                    buf[j] = dj_f32_to_f8e4m3((float)((2.0 * u - 1.0) * 448.0));
                } else if (t[i].kind == 2) {
                    const float sv = (float)(qa * (0.9 + 0.2 * u));
                    memcpy(buf + 4 * j, &sv, 4);
                } else if (dt == DJ_DTYPE_F32) memcpy(buf + 4 * j, &v, 4);
                else {
                    uint16_t h = dt == DJ_DTYPE_F16 ? dj_f32_to_f16(v) : dj_f32_to_bf16(v);
                    memcpy(buf + 2 * j, &h, 2);
                }
            }
            if (fwrite(buf, ESZ(i), m, f) != m || (gf && fwrite(gbuf, t[i].is_norm ? 4 : 2, m, gf) != m)) {
                perror(path);
                return 1;
            }
            done += m;
        }
        if (gf) gguf_pad(gf, (uint64_t)n * (t[i].is_norm ? 4 : 2));
    }
    if (gf && fclose(gf) != 0) {
        perror(gguf_path);
        return 1;
    }
    free(gbuf);
    if (fclose(f) != 0) {
        perror(path);
        return 1;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "w");
    static const char *const archs[] = {"LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma2ForCausalLM",
                                        "MixtralForCausalLM"};
    static const char *const types[] = {"llama", "qwen3", "gemma2", "mixtral"}; /* transformers' AutoConfig needs it */
    fprintf(f,
            "{\"architectures\":[\"%s\"],\"model_type\":\"%s\",\"hidden_size\":%d,"
            "\"intermediate_size\":%d,\"num_hidden_layers\":%d,\"num_attention_heads\":%d,"
            "\"num_key_value_heads\":%d,\"head_dim\":%d,\"vocab_size\":%d,\"max_position_embeddings\":%d,"
            "\"rms_norm_eps\":1e-05,\"rope_theta\":%.1f,\"tie_word_embeddings\":%s,"
            "\"bos_token_id\":1,\"eos_token_id\":2,\"torch_dtype\":\"%s\"%s",
            archs[p->arch], types[p->arch], p->hidden, p->ffn, layers, p->heads, p->kv_heads, hd, p->vocab, p->max_pos, p->theta,
            p->tie ? "true" : "false", dt == DJ_DTYPE_F32 ? "float32" : dt == DJ_DTYPE_F16 ? "float16" : "bfloat16",
            fp8_channel
                ? ",\"quantization_config\":{\"quant_method\":\"compressed-tensors\",\"format\":\"float-quantized\","
                  "\"config_groups\":{\"group_0\":{\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":8,\"type\":"
                  "\"float\",\"strategy\":\"channel\",\"symmetric\":true,\"dynamic\":false},"
                  "\"input_activations\":{\"num_bits\":8,\"type\":\"float\",\"strategy\":\"token\",\"symmetric\":"
                  "true,\"dynamic\":true}}},\"ignore\":[\"lm_head\"]}"
            : fp8 ? ",\"quantization_config\":{\"quant_method\":\"fp8\",\"activation_scheme\":\"dynamic\","
                    "\"fmt\":\"e4m3\",\"weight_block_size\":[128,128]}"
                  : "");
    if (p->arch == ARCH_GEMMA2) /* gemma-2-9b's own settings */
        fprintf(f, ",\"hidden_activation\":\"gelu_pytorch_tanh\",\"query_pre_attn_scalar\":256,"
                   "\"sliding_window\":4096,\"attn_logit_softcapping\":50.0,\"final_logit_softcapping\":30.0");
    else
        fprintf(f, ",\"hidden_act\":\"silu\"");
    if (p->arch == ARCH_MIXTRAL) fprintf(f, ",\"num_local_experts\":%d,\"num_experts_per_tok\":2", p->experts);
    if (q_awq)
        fprintf(f, ",\"quantization_config\":{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":128,"
                   "\"zero_point\":true,\"version\":\"gemm\"}");
    if (q_gptq)
        fprintf(f, ",\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128,"
                   "\"desc_act\":false,\"sym\":true,\"checkpoint_format\":\"gptq\"}");
    fprintf(f, "}\n");
    fclose(f);
    printf("%s: %d tensors, %.2f GB of %s weights in %s\n", p->name, k, (double)off / 1e9,
           fp8_channel ? "fp8 per channel (+bf16)" : fp8 ? "fp8 (+bf16)" : q_awq ? "awq 4-bit (+bf16)" : q_gptq ? "gptq 4-bit (+bf16)" : dense_name, dir);
    free(buf);
    free(hdr);
    free(t);
    return 0;
}
