/* checkpoint.h: a Hugging Face model directory as it is on disk -
 * config.json, model.safetensors or model.safetensors.index.json with its
 * shards (mmapped, never copied here) - and the parsed model configuration. */
#ifndef DJINN_CHECKPOINT_H
#define DJINN_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/arch_list.h"
#include "djinn/dtype.h"
#include "djinn/status.h"

#define DJ_TENSOR_MAX_DIMS 4

typedef struct dj_tensor_info {
    const char *name;        /* owned by the checkpoint */
    dj_dtype dtype;
    int ndim;
    int64_t shape[DJ_TENSOR_MAX_DIMS];
    const void *data;        /* inside the mmapped shard; valid until close */
    size_t nbytes;
} dj_tensor_info;

/* ---- safetensors header (pure; fuzzed) ----
 * Parses the JSON header of one safetensors file whose data area holds
 * data_len bytes. Checks: valid JSON object, known dtype, shape product *
 * dtype size == end - begin, offsets within data_len, no two tensors
 * overlapping. "__metadata__" is skipped. On success *out is an array of
 * *n_out entries whose name strings and data offsets (in `data`, as byte
 * offsets cast to pointers: add the data area base) are owned by the caller:
 * free with dj_safetensors_free_infos. The array is sorted by name.
 * Also rejected: duplicate tensor names, dtypes other than F32/F16/BF16/F8_E4M3
 * and I32 (the parts of 4-bit weights) (DJ_EUNSUPPORTED; unknown names are DJ_EFORMAT), more than 4 dimensions,
 * entries with other keys than dtype/shape/data_offsets, non-whitespace
 * after the JSON. Gaps between tensors are allowed. */
dj_status dj_safetensors_parse_header(const char *json, size_t json_len, size_t data_len,
                                      dj_tensor_info **out /* OUT */, size_t *n_out /* OUT */);
void dj_safetensors_free_infos(dj_tensor_info *infos, size_t n);

/* ---- model configuration (config.json) ---- */

/* DJ_ARCH_LLAMA (Llama 2/3/3.1, TinyLlama), DJ_ARCH_MISTRAL, DJ_ARCH_QWEN2,
 * DJ_ARCH_QWEN3, DJ_ARCH_GEMMA2, DJ_ARCH_GEMMA3 (text), DJ_ARCH_PHI3,
 * DJ_ARCH_MIXTRAL: see djinn/arch_list.h and src/model/arch/. */
typedef enum {
#define DJ_ARCH_ENUM_(e, hf, file) DJ_ARCH_##e,
    DJ_ARCH_LIST(DJ_ARCH_ENUM_)
#undef DJ_ARCH_ENUM_
    DJ_ARCH_COUNT
} dj_arch;

typedef enum {
    DJ_ROPE_DEFAULT,
    DJ_ROPE_LINEAR,  /* positions divided by factor */
    DJ_ROPE_LLAMA3,  /* frequency-dependent scaling of Llama 3.1 */
    DJ_ROPE_LONGROPE /* Phi-3 "longrope"/"su": per-frequency divisors, attention factor */
} dj_rope_type;

/* The MLP's gate activation. */
typedef enum {
    DJ_ACT_SILU,     /* "silu" */
    DJ_ACT_GELU_TANH /* "gelu_pytorch_tanh": GELU, tanh approximation */
} dj_act;

/* How the checkpoint's weights are quantized (config "quantization_config",
 * read by src/model/quant.c; docs/quantization.md). */
typedef enum {
    DJ_QUANT_NONE,   /* no quantization_config: f32/f16/bf16 weights */
    /* transformers "fp8" (FineGrainedFP8Config, the Qwen3/DeepSeek FP8 releases):
     * f8_e4m3 "<m>.weight" [rows][cols] with f32 "<m>.weight_scale_inv"
     * [ceil(rows/b0)][ceil(cols/b1)], b = weight_block_size; w = q * scale */
    DJ_QUANT_FP8,
    /* "compressed-tensors" float-quantized 8-bit float weights: "<m>.weight_scale"
     * of 1 value (strategy tensor), [rows][1] (channel) or
     * [ceil(rows/b0)][ceil(cols/b1)] (block, b = block_structure); w = q * scale.
     * input_scale and dynamic activation schemes are not applied (weights only). */
    DJ_QUANT_CT_FP8,
    /* AWQ (gemm) and GPTQ (v1) 4-bit weights: their parts repacked at open into
     * "<m>.weight" of DJ_DTYPE_Q4 (src/model/quant4.c, which checks the rest of
     * the config: bits 4, group_size 128, ...) */
    DJ_QUANT_AWQ,
    DJ_QUANT_GPTQ
} dj_quant_method;

#define DJ_ROPE_MAX_FACTORS 256 /* longrope factors: one per rotated pair, rope_dim/2 */
#define DJ_MAX_TYPED_LAYERS 1024 /* layers a per-layer sliding pattern may describe */

typedef struct dj_model_config {
    dj_arch arch;
    char arch_name[64];           /* as written in config.json */
    uint32_t vocab_size;
    uint32_t hidden_size;
    uint32_t intermediate_size;
    uint32_t n_layers;
    uint32_t n_heads;
    uint32_t n_kv_heads;
    uint32_t head_dim;            /* head_dim if given, else hidden/n_heads */
    uint32_t max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    dj_rope_type rope_type;
    float rope_factor;            /* linear/llama3; 1 otherwise */
    float rope_low_freq_factor;   /* llama3 */
    float rope_high_freq_factor;  /* llama3 */
    uint32_t rope_original_max_pos; /* llama3, longrope (the short factors' range) */
    bool tie_word_embeddings;
    /* Llama: config "attention_bias" (default false), meaning q, k, v AND
     * o_proj biases. Qwen2: always true, meaning q, k, v biases only (its
     * o_proj never has one). Mistral: always false. */
    bool attention_bias;
    bool mlp_bias;                /* Llama mlp_bias: gate/up/down biases */
    /* Window in tokens, 0 = none. Mistral: config "sliding_window" (absent
     * means 4096 as in transformers, null means none), every layer. Qwen2:
     * only when "use_sliding_window" is true, and only for layers
     * >= sliding_window_first_layer ("max_window_layers", or the first
     * "sliding_attention" in "layer_types"). */
    uint32_t sliding_window;
    uint32_t sliding_window_first_layer; /* 0 for Mistral */
    /* Gemma 2/3: the window applies to the layers whose bit is set here
     * ("sliding_attention" in layer_types), not from a first layer on. */
    bool sliding_by_layer;
    uint8_t layer_sliding[DJ_MAX_TYPED_LAYERS / 8]; /* bit l%8 of byte l/8: layer l slides */

    /* ---- variants beyond Llama, set by the architecture's file; zero/one
     * values are the Llama behaviour ---- */
    dj_act hidden_act;            /* MLP gate activation */
    float norm_offset;            /* RMSNorm weight w applied as (w + offset): Gemma 1, else 0 */
    bool qk_norm;                 /* per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3) */
    bool sandwich_norm;           /* Gemma: RMSNorm after attention and after the MLP too */
    float embed_scale;            /* embeddings times this (Gemma: sqrt(hidden_size)); 0 = none */
    float attn_scale;             /* softmax scale (Gemma: query_pre_attn_scalar^-0.5); 0 = head_dim^-0.5 */
    float attn_softcap;           /* scores s -> c*tanh(s/c) (Gemma 2); 0 = none */
    float final_softcap;          /* logits likewise (Gemma 2); 0 = none */
    uint32_t rope_dim;            /* leading dims of each head rotated (partial_rotary_factor); head_dim */
    float rope_attn_factor;       /* cos and sin times this (longrope's attention factor); 1 */
    float rope_local_theta;       /* Gemma 3: base of the sliding layers' default RoPE; 0 = one RoPE */
    float rope_ext_factor[DJ_ROPE_MAX_FACTORS]; /* longrope: the short_factor divisors [rope_dim/2] */
    float rope_long_factor[DJ_ROPE_MAX_FACTORS]; /* longrope: the long_factor divisors [rope_dim/2], for
                                                  * sessions longer than rope_original_max_pos */
    uint32_t n_experts;           /* MoE: experts per layer (num_local_experts); 0 = dense MLP */
    uint32_t n_experts_used;      /* MoE: experts per token (num_experts_per_tok) */
    int32_t bos_token_id;         /* -1 if absent */
    int32_t eos_token_ids[4];     /* -1 padded; config may give an int or a list */
    char torch_dtype[16];         /* "torch_dtype" or newer "dtype"; "" if absent */
    dj_quant_method quant;        /* DJ_QUANT_NONE without a quantization_config */
    uint32_t quant_block[2];      /* FP8 / CT block strategy: rows, cols one scale covers; else 0 */
} dj_model_config;

/* Parse a config.json text. Unknown architecture, unsupported hidden_act or
 * rope_scaling type, missing or non-numeric fields, inconsistent head counts:
 * an error naming the key. Required: architectures, vocab_size, hidden_size,
 * intermediate_size, num_hidden_layers, num_attention_heads,
 * max_position_embeddings, rms_norm_eps. Defaults: num_key_value_heads =
 * num_attention_heads, head_dim = hidden/heads, rope_theta 10000 (top level
 * or inside newer "rope_parameters"). rope_scaling (or rope_parameters with
 * a rope_type): default, linear, llama3, longrope (Phi-3 only);
 * yarn/dynamic/... are DJ_EUNSUPPORTED. The architecture's own keys
 * (hidden_act, biases, windows, Gemma's and MoE's keys) are read by its file
 * in src/model/arch/. quantization_config: transformers "fp8" and
 * "compressed-tensors" 8-bit float weights (dj_quant_method); any other
 * method, format or scheme is DJ_EUNSUPPORTED naming it. On error *cfg is
 * zeroed. */
dj_status dj_model_config_parse(const char *json, size_t len, dj_model_config *cfg /* OUT */);

/* The context a session gets when its client names none (the CLI without
 * --ctx, SESSION_OPEN without expected_tokens): max_position_embeddings
 * capped at DJ_DEFAULT_CTX_CAP and, with longrope, at its
 * original_max_position_embeddings (the short factors' range: a longer
 * session rotates with the long ones, dj_session_rope_long); 4096 when the
 * config gives none. */
#define DJ_DEFAULT_CTX_CAP 4096u
uint32_t dj_model_config_default_ctx(const dj_model_config *cfg);
/* Whether a session of ctx positions rotates with longrope's long factors:
 * the config has them and ctx exceeds original_max_position_embeddings
 * (dj_session_rope_long). */
bool dj_model_config_rope_long(const dj_model_config *cfg, uint32_t ctx);

/* ---- checkpoint directory ---- */

typedef struct dj_checkpoint dj_checkpoint_t;

/* Opens dir: reads config.json and either model.safetensors or (when that
 * is absent, as transformers prefers) model.safetensors.index.json plus
 * every shard its "weight_map" names, each mapped once, read-only.
 * Validates every header; shard names containing "/" or ".." are refused;
 * every tensor the map lists must be in the shard it names; tensors a shard
 * holds beyond the map are included; a name in two shards is an error.
 * Errors name the file: "<dir>/model.safetensors: header length 12345678
 * exceeds file size 100". DJ_ENOTFOUND for missing files, DJ_EFORMAT for
 * malformed ones, DJ_EUNSUPPORTED for valid but unsupported content.
 * A config.json with "quantization_config" of AWQ or GPTQ 4-bit weights (the
 * configs README lists; any other is DJ_EUNSUPPORTED naming it): every
 * <p>.qweight/.qzeros/.scales(/.g_idx) group is repacked into one tensor
 * <p>.weight of DJ_DTYPE_Q4 held by ck (src/model/quant4.c), and the parts
 * are not in the table.
 * Tensor data pointers are only as aligned as the file makes them (writers
 * from the safetensors library align to the element size); the mapping must
 * not be truncated by another process while open (SIGBUS). */
dj_status dj_checkpoint_open(const char *dir, dj_checkpoint_t **out /* OUT */);
/* The same for its metadata only (`djinn info`): config.json and the
 * safetensors headers are read, no weight byte (the files may even be cut
 * short of their data); dj_checkpoint_read then fails (DJ_EINVAL) and
 * dj_checkpoint_fingerprint gives 0 unless the files' fingerprint is known.
 * 4-bit AWQ/GPTQ checkpoints, repacked at open, are opened whole. */
dj_status dj_checkpoint_open_headers(const char *dir, dj_checkpoint_t **out /* OUT */);
/* Drops one reference: the opener's or a dj_checkpoint_retain's; the last
 * one unmaps the files and frees ck. NULL does nothing. */
void dj_checkpoint_close(dj_checkpoint_t *ck);
/* One more reference (a model whose weights are used in place keeps its
 * checkpoint mapped this way); returns ck. Thread-safe. */
dj_checkpoint_t *dj_checkpoint_retain(dj_checkpoint_t *ck);

const dj_model_config *dj_checkpoint_config(const dj_checkpoint_t *ck);
size_t dj_checkpoint_tensor_count(const dj_checkpoint_t *ck);
/* i-th tensor in strcmp order of names; NULL if i >= count. */
const dj_tensor_info *dj_checkpoint_tensor(const dj_checkpoint_t *ck, size_t i);
/* Binary search by exact name; NULL if absent. */
const dj_tensor_info *dj_checkpoint_find(const dj_checkpoint_t *ck, const char *name);

/* Fingerprint: 64-bit hash over every tensor's name, dtype, shape and bytes
 * (in name order) and the config's architecture fields. Stable across loads,
 * different for different weights. Computed once (reads all weight bytes,
 * XXH3-64) unless known: an earlier fingerprint in this process of files
 * with the same identity - each shard's (st_dev, st_ino, size, mtime ns) and
 * the config's fields - is taken without reading a byte. A file rewritten in
 * place within one mtime tick with the same size is not noticed. Config
 * fields hashed: everything that shapes the computation (sizes, heads, eps,
 * rope, biases, tying, window), not token ids or torch_dtype. One thread per
 * checkpoint; the identity cache is shared and locked. */
uint64_t dj_checkpoint_fingerprint(dj_checkpoint_t *ck);

/* True (and *fp) when the fingerprint is known without reading the weights
 * (computed before on ck, or remembered for its files' identity). */
bool dj_checkpoint_fingerprint_known(dj_checkpoint_t *ck, uint64_t *fp /* OUT, may be NULL */);

/* Every tensor's bytes in pieces of at most `chunk` bytes (0: 4 MiB) handed
 * to visit(user, tensor index, offset in the tensor, bytes, n) - while the
 * same pass computes the fingerprint, which is then known (and remembered
 * for the files' identity). Several threads read at once: visit is called
 * concurrently for disjoint ranges, in no particular order, and must be
 * thread-safe. A visitor's error stops the walk and is returned; no
 * fingerprint is recorded then. */
typedef dj_status (*dj_checkpoint_visit_fn)(void *user, size_t tensor, size_t offset, const void *bytes, size_t n);
dj_status dj_checkpoint_read(dj_checkpoint_t *ck, size_t chunk, dj_checkpoint_visit_fn visit, void *user);

/* Progress of a pass over the weight bytes: fn(user, bytes done, bytes of
 * every tensor) after each piece dj_checkpoint_read hands out (and each
 * dj_checkpoint_note_progress), from any of the reading threads at once, so
 * fn must be thread-safe; done only grows (a second pass counts on, capped at
 * the total). NULL fn: none (the default). Set before the pass. */
typedef void (*dj_checkpoint_progress_fn)(void *user, uint64_t done, uint64_t total);
void dj_checkpoint_set_progress(dj_checkpoint_t *ck, dj_checkpoint_progress_fn fn, void *user);
/* A loader that copies weights without dj_checkpoint_read reports its n bytes. */
void dj_checkpoint_note_progress(dj_checkpoint_t *ck, size_t n);
/* Bytes of every tensor's data (what a pass over the weights reads). */
uint64_t dj_checkpoint_data_bytes(const dj_checkpoint_t *ck);

/* The shards' pages as 2 MiB folios mapped by PMDs (one TLB entry per
 * 2 MiB) where the kernel and file system can: for kernels that read the
 * weights in place (the CPU backend; host compute on pinned pages). Touches
 * every 2 MiB of the files (reading what is not cached, as 2 MiB folios);
 * files whose cached pages are 4 KiB folios (written with small writes) are
 * dropped from the page cache and read again once - a one-time cost while
 * the cache keeps them. Returns the bytes mapped by PMDs (0 where the
 * kernel does not say or cannot). One thread per checkpoint; call before
 * registering the pages with a device (a pin keeps them as they are). */
size_t dj_checkpoint_huge_pages(dj_checkpoint_t *ck);
/* True once dj_checkpoint_huge_pages ran on ck. */
bool dj_checkpoint_huge_pages_done(const dj_checkpoint_t *ck);

/* Passes over every weight byte this process made to fingerprint (tests). */
uint64_t dj_checkpoint_hash_passes(void);

#endif
