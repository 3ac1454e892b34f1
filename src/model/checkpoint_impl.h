/* checkpoint_impl.h: helpers shared by the safetensors, config and checkpoint
 * readers (JSON type names, duplicate-key detection, exact integers). */
#ifndef DJ_MODEL_CHECKPOINT_IMPL_H
#define DJ_MODEL_CHECKPOINT_IMPL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "djinn/checkpoint.h"
#include "djinn/status.h"

/* Largest JSON number read as an exact integer: doubles hold every integer
 * below 2^53, nothing above. */
#define DJ__JSON_MAX_EXACT_INT 9007199254740992.0

/* "null", "boolean", "number", "string", "array", "object" or "invalid". */
const char *dj__json_type_name(const cJSON *item);

/* Finds a key that occurs twice among obj's members (cJSON keeps both, Python
 * keeps the last, so such input is ambiguous). *dup is NULL when all keys are
 * distinct, else points at the key inside obj. DJ_ENOMEM only on allocation
 * failure. */
dj_status dj__json_find_duplicate_key(const cJSON *obj, const char **dup /* OUT */);

/* A member of obj, with JSON null treated as absent. */
const cJSON *dj__json_member(const cJSON *obj, const char *key);

/* True when item is a number holding an integer in [0, 2^53). */
bool dj__json_get_uint(const cJSON *item, uint64_t *out /* OUT */);

/* Parses json[0..len) as one JSON value followed only by whitespace. On
 * failure returns NULL and sets *err_pos to the byte offset of the error. */
cJSON *dj__json_parse(const char *json, size_t len, size_t *err_pos /* OUT */);

/* ---- made at open (src/model/quant4.c) ---- */
struct dj_checkpoint;

/* Reads config.json's "quantization_config" (text[0..len)); without one,
 * nothing. AWQ/GPTQ 4-bit: every <p>.qweight with its <p>.qzeros, <p>.scales
 * (and GPTQ's <p>.g_idx) becomes one tensor <p>.weight of DJ_DTYPE_Q4
 * (repacked, owned by ck) and the parts leave the table. Any other
 * quantization config: DJ_EUNSUPPORTED naming it. Errors name dir. */
dj_status dj__quant_open(const char *dir, const char *text, size_t len, struct dj_checkpoint *ck);

#endif
