/* checkpoint.h: a Hugging Face model directory as it is on disk -
 * config.json, model.safetensors or model.safetensors.index.json with its
 * shards (mmapped, never copied here) - and the parsed model configuration. */
#ifndef DJINN_CHECKPOINT_H
#define DJINN_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
 * free with dj_safetensors_free_infos. */
dj_status dj_safetensors_parse_header(const char *json, size_t json_len, size_t data_len,
                                      dj_tensor_info **out /* OUT */, size_t *n_out /* OUT */);
void dj_safetensors_free_infos(dj_tensor_info *infos, size_t n);

/* ---- model configuration (config.json) ---- */

typedef enum {
    DJ_ARCH_LLAMA,   /* LlamaForCausalLM: Llama 2, Llama 3/3.1, TinyLlama */
    DJ_ARCH_MISTRAL, /* MistralForCausalLM */
    DJ_ARCH_QWEN2    /* Qwen2ForCausalLM: q/k/v bias */
} dj_arch;

typedef enum {
    DJ_ROPE_DEFAULT,
    DJ_ROPE_LINEAR, /* positions divided by factor */
    DJ_ROPE_LLAMA3  /* frequency-dependent scaling of Llama 3.1 */
} dj_rope_type;

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
    float rope_factor;            /* linear/llama3 */
    float rope_low_freq_factor;   /* llama3 */
    float rope_high_freq_factor;  /* llama3 */
    uint32_t rope_original_max_pos; /* llama3 */
    bool tie_word_embeddings;
    bool attention_bias;          /* q/k/v (and for Llama o_proj) biases present */
    bool mlp_bias;                /* Llama mlp_bias */
    uint32_t sliding_window;      /* 0 = none (Mistral may set it) */
    int32_t bos_token_id;         /* -1 if absent */
    int32_t eos_token_ids[4];     /* -1 padded */
    char torch_dtype[16];
} dj_model_config;

/* Parse a config.json text. Unknown architecture, unsupported hidden_act or
 * rope_scaling type, missing or non-numeric fields, inconsistent head counts:
 * an error naming the key. */
dj_status dj_model_config_parse(const char *json, size_t len, dj_model_config *cfg /* OUT */);

/* ---- checkpoint directory ---- */

typedef struct dj_checkpoint dj_checkpoint_t;

/* Opens dir: reads config.json and either model.safetensors or
 * model.safetensors.index.json plus every shard it names (mmapped read-only).
 * Validates every header. */
dj_status dj_checkpoint_open(const char *dir, dj_checkpoint_t **out /* OUT */);
void dj_checkpoint_close(dj_checkpoint_t *ck); /* NULL does nothing */

const dj_model_config *dj_checkpoint_config(const dj_checkpoint_t *ck);
size_t dj_checkpoint_tensor_count(const dj_checkpoint_t *ck);
const dj_tensor_info *dj_checkpoint_tensor(const dj_checkpoint_t *ck, size_t i);
/* NULL if absent. */
const dj_tensor_info *dj_checkpoint_find(const dj_checkpoint_t *ck, const char *name);

/* Fingerprint: 64-bit hash over every tensor's name, dtype, shape and bytes
 * (in name order) and the config's architecture fields. Stable across loads,
 * different for different weights. Computed once on first call (reads all
 * weight bytes). */
uint64_t dj_checkpoint_fingerprint(dj_checkpoint_t *ck);

#endif
