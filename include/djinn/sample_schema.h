/* sample_schema.h: GENERATE's sampling fields as one table (wire name = the
 * dj_sampler_params member, type, bounds, default, doc), read by every codec. */
#ifndef DJINN_SAMPLE_SCHEMA_H
#define DJINN_SAMPLE_SCHEMA_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/sample_params.h"
#include "djinn/status.h"

/* How a field is held and sent:
 *  F32: a float member, any msgpack number on the wire (sent as f64); finite.
 *  U32: a uint32_t member, a non-negative integer on the wire; larger values
 *       saturate at 2^32 - 1 (top_k: "more than the vocabulary" is "all").
 *  U64: a uint64_t member, a non-negative integer on the wire. */
typedef enum dj_sample_type { DJ_SAMPLE_F32, DJ_SAMPLE_U32, DJ_SAMPLE_U64 } dj_sample_type;

/* X(name, type, lo, lo_open, hi, default, doc): the field `name` is the wire
 * key and the dj_sampler_params member; its value must lie in [lo, hi] ((lo,
 * hi] with lo_open; hi INFINITY: any finite value; U32/U64 fields take any
 * value: their lo and hi are 0 and unused);
 * absent on the wire it is `default`. A client sends a field only when its
 * value is neither 0 nor the default, so a zeroed dj_sampler_params asks for
 * every default. Keep the order of dj_sampler_params (a static assertion in
 * src/core/sample_schema.c checks each member's offset and the struct's size).
 *
 * To add a sampling parameter: a line here, its member in sample_params.h,
 * and its use in the rule (src/sample/sample_rule.h); the C client, the
 * daemon, docs/protocol.md and python/djinn/_wire.py follow from this table
 * (scripts/gen_wire.py regenerates the last two; wire_schema_test fails until
 * it has). */
#define DJ_SAMPLE_FIELD_MAP(X)                                                                                       \
    X(temperature, DJ_SAMPLE_F32, 0, false, INFINITY, 0, "0 = greedy (the argmax); else the softmax temperature")        \
    X(top_k, DJ_SAMPLE_U32, 0, false, 0, 0, "0 = off; keep the k most likely ids")                                   \
    X(top_p, DJ_SAMPLE_F32, 0, true, 1, 1, "1 = off; keep the most likely ids whose mass reaches top_p")            \
    X(seed, DJ_SAMPLE_U64, 0, false, 0, 0, "the draws' generator seed: a seed repeats a generation")                 \
    X(min_p, DJ_SAMPLE_F32, 0, false, 1, 0, "0 = off; keep weights >= min_p x the largest")                         \
    X(repetition_penalty, DJ_SAMPLE_F32, 0, false, 100, 0,                                                          \
      "0 or 1 = off; over prompt and generated ids, positive logits divided by it, negative multiplied")            \
    X(frequency_penalty, DJ_SAMPLE_F32, -2, false, 2, 0, "0 = off; logit -= count x it, over the generated ids")    \
    X(presence_penalty, DJ_SAMPLE_F32, -2, false, 2, 0, "0 = off; logit -= it for each id generated at least once") \
    X(top_a, DJ_SAMPLE_F32, 0, false, 1, 0, "0 = off; keep ids whose probability >= top_a x (the largest one)^2")

/* One row of the table. */
typedef struct dj_sample_field {
    const char *name;    /* the wire key and the member's name */
    size_t offset;       /* of the member in dj_sampler_params */
    dj_sample_type type;
    double lo, hi;       /* bounds (F32 only) */
    bool lo_open;        /* lo itself is out */
    double def;          /* the value when absent */
    const char *doc;
} dj_sample_field;

extern const dj_sample_field dj_sample_fields[]; /* [dj_sample_n_fields], in table order */
extern const size_t dj_sample_n_fields;

/* p with every field at its default (top_p 1, the rest 0). */
dj_sampler_params dj_sample_schema_default(void);

/* DJ_EINVAL naming the first field out of its bounds, with its value and
 * its range ("min_p 1.5 is out of range: must be in [0, 1]"). */
dj_status dj_sample_schema_check(const dj_sampler_params *p);

/* A field's value as a double (U64 above 2^53 rounds) / as a u64 (F32:
 * truncated toward 0, NaN 0). */
double dj_sample_field_f64(const dj_sampler_params *p, const dj_sample_field *f);
uint64_t dj_sample_field_u64(const dj_sampler_params *p, const dj_sample_field *f);

/* Stores v into the field (F32: as float; U32: saturated; U64 as is). */
void dj_sample_field_set_f64(dj_sampler_params *p, const dj_sample_field *f, double v);
void dj_sample_field_set_u64(dj_sampler_params *p, const dj_sample_field *f, uint64_t v);

/* logit_bias (sample_params.h's dj_logit_bias), a list beside the table's
 * scalars: DJ_EINVAL naming the entry for more than DJ_MAX_LOGIT_BIAS
 * entries, an id outside [0, vocab) (vocab 0: any id >= 0), an id twice, a
 * bias not finite or outside [-100, 100]. The wire decoder, the sampler and
 * the HTTP door all check with it. */
dj_status dj_logit_bias_check(const dj_logit_bias *bias, size_t n, uint32_t vocab);

#endif
