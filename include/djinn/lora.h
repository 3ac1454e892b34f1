/* lora.h: LoRA adapters - PEFT's adapter_config.json + adapter_model.safetensors
 * loaded beside their base model as text (refcounted, shared) and chosen per session. */
#ifndef DJINN_LORA_H
#define DJINN_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/engine.h"
#include "djinn/status.h"

/* A loaded adapter: f32 copies of its A and B matrices in the text segment,
 * one VMU region of its own (found by fingerprint: a second load of the same
 * adapter for the same base is a reference; at refcount 0 it stays cached
 * until the text segment needs the room). Opaque. */
typedef struct dj_lora dj_lora_t;

/* Projections an adapter may target (target_modules' names, PEFT's leaves). */
enum {
    DJ_LORA_Q = 1u << 0,       /* q_proj */
    DJ_LORA_K = 1u << 1,       /* k_proj */
    DJ_LORA_V = 1u << 2,       /* v_proj */
    DJ_LORA_O = 1u << 3,       /* o_proj */
    DJ_LORA_GATE = 1u << 4,    /* gate_proj */
    DJ_LORA_UP = 1u << 5,      /* up_proj */
    DJ_LORA_DOWN = 1u << 6,    /* down_proj */
    DJ_LORA_QKV = 1u << 7,     /* qkv_proj (Phi-3's fused q, k, v) */
    DJ_LORA_GATE_UP = 1u << 8  /* gate_up_proj (Phi-3's fused gate, up) */
};

/* adapter_config.json as we take it. */
typedef struct dj_lora_config {
    uint32_t r;          /* rank, 1..DJ_LORA_MAX_RANK */
    float alpha;         /* lora_alpha (> 0 and finite) */
    bool rslora;         /* use_rslora: scale alpha / sqrt(r) instead of alpha / r */
    float scale;         /* the resulting scale */
    unsigned targets;    /* DJ_LORA_* of target_modules */
    char base[512];      /* base_model_name_or_path ("" when absent or null) */
} dj_lora_config;

/* Parses adapter_config.json (pure; len bytes, no terminator needed). Refused,
 * naming the field: peft_type other than LORA; r 0 or above DJ_LORA_MAX_RANK;
 * lora_alpha not positive; target_modules not a list of names we adapt
 * (q/k/v/o, gate/up/down, qkv_proj, gate_up_proj - the last component of a
 * dotted name counts) or empty; fan_in_fan_out true; use_dora true; a
 * modules_to_save, layers_to_transform, layers_pattern, rank_pattern or
 * alpha_pattern that is not null or empty; bias other than "none". */
dj_status dj_lora_config_parse(const char *json, size_t len, dj_lora_config *out /* OUT */);

/* Loads the adapter in directory dir for base (a model of e): parses its
 * config, checks base_model_name_or_path against the base's name (equal, or
 * the same last path component; absent accepts), every targeted projection
 * of every layer against the base's shapes (lora_A [r][in], lora_B [out][r],
 * f32/f16/bf16, finite values), every tensor of the file consumed. Errors
 * name the field, the tensor or both names. DJ_EUNSUPPORTED for a quantized
 * or streamed base (not yet). *out holds one reference. */
dj_status dj_lora_load(dj_engine_t *e, const dj_model_t *base, const char *dir, dj_lora_t **out /* OUT */);
/* Drops one reference (NULL does nothing). */
void dj_lora_release(dj_engine_t *e, dj_lora_t *a);

const char *dj_lora_name(const dj_lora_t *a);    /* the directory's last component */
const dj_lora_config *dj_lora_get_config(const dj_lora_t *a);
uint64_t dj_lora_fingerprint(const dj_lora_t *a); /* content (config + tensors) and the base's */
uint64_t dj_lora_base_fingerprint(const dj_lora_t *a);
uint32_t dj_lora_refcount(const dj_lora_t *a);

/* Adapters one session may stack (each row's updates applied in order). */
#define DJ_LORA_STACK_MAX 4

/* The adapter s's steps run with (NULL: the bare base), at use_scale times
 * its own scale (1 = as trained; finite). Taken before s holds tokens (its
 * KV and its prefix-cache chain are the adapter's: a block cached under one
 * adapter never serves another); s holds one reference until it is freed or
 * set again. DJ_EBUSY once s holds tokens, DJ_EINVAL for an adapter of
 * another base. */
dj_status dj_session_set_lora(dj_engine_t *e, dj_session_t *s, dj_lora_t *a, float use_scale);
const dj_lora_t *dj_session_lora(const dj_session_t *s); /* the first, NULL: none */
/* As dj_session_set_lora with n (0..DJ_LORA_STACK_MAX) adapters stacked:
 * each projection gets every adapter's update, a[0]'s first (scales[i]
 * times a[i]'s own; scales NULL: 1 each). The same adapter twice is fine. */
dj_status dj_session_set_loras(dj_engine_t *e, dj_session_t *s, dj_lora_t *const *a, const float *scales,
                               uint32_t n);
uint32_t dj_session_lora_count(const dj_session_t *s);
/* s (holding nothing yet) takes like's adapter and use scale: a session made
 * anew to recompute another's history. */
dj_status dj_session_set_lora_like(dj_engine_t *e, dj_session_t *s, const dj_session_t *like);

#endif
