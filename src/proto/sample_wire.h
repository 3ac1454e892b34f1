/* sample_wire.h: GENERATE's sampling fields to and from msgpack metadata,
 * walking the table of djinn/sample_schema.h (client encoder, daemon decoder). */
#ifndef DJ_SAMPLE_WIRE_H
#define DJ_SAMPLE_WIRE_H

#include "djinn/sample_schema.h"
#include "proto/proto_impl.h"

/* Writes each field of p whose value is neither 0 nor its default (a zeroed
 * p writes nothing and asks for every default): F32 as f64, U32/U64 as u64. */
void dj__sample_encode(dj__mw *w, const dj_sampler_params *p);

/* Reads every sampling field of m into *out (absent: its default) and
 * validates them: DJ_EFORMAT naming a field of the wrong type (a number for
 * F32, a non-negative integer for U32/U64), DJ_EINVAL naming one out of its
 * bounds (dj_sample_schema_check). On failure *out holds what was read. */
dj_status dj__sample_decode(const dj__meta *m, dj_sampler_params *out /* OUT */);

/* GENERATE's `logit_bias`: an array of [token id, bias] pairs (a
 * non-negative integer, a number). Encode writes nothing for n 0. Decode: absent is none
 * (*out NULL, *n 0); DJ_EFORMAT for a value of the wrong shape, DJ_EINVAL
 * naming the entry against dj_logit_bias_check's rules (no vocabulary: the
 * worker checks the ids against the model's); *out malloc'd. */
void dj__logit_bias_encode(dj__mw *w, const dj_logit_bias *bias, size_t n);
dj_status dj__logit_bias_decode(const dj__meta *m, dj_logit_bias **out /* OUT */, size_t *n /* OUT */);

#endif
