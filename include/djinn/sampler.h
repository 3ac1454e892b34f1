/* sampler.h: choosing the next token from logits - greedy, temperature,
 * top-k, top-p - seeded and reproducible (same seed, same logits, same ids). */
#ifndef DJINN_SAMPLER_H
#define DJINN_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"

typedef struct dj_sampler_params {
    float temperature; /* 0 = greedy */
    uint32_t top_k;    /* 0 = off */
    float top_p;       /* 1 = off; in (0, 1] */
    uint64_t seed;
    float min_p; /* 0 = off */
    float repetition_penalty; /* 1 (or 0) = off, HF rule over prompt+generated ids */
    float frequency_penalty;
    float presence_penalty; /* 0 = off, OpenAI rule over generated ids */
} dj_sampler_params;

typedef struct dj_sampler dj_sampler_t;

/* Validates params (temperature >= 0 and finite, top_p in (0,1]). */
dj_status dj_sampler_new(const dj_sampler_params *p, uint32_t vocab, dj_sampler_t **out /* OUT */);
void dj_sampler_free(dj_sampler_t *s);

/* Pick a token from logits[vocab] (not modified). Order as in transformers:
 * temperature, then top-k, then top-p, then a draw from the softmax. Greedy
 * breaks ties by the lowest id (as torch.argmax). */
int32_t dj_sampler_sample(dj_sampler_t *s, const float *logits);

/* The two halves of dj_sampler_sample: the next uniform draw u in [0, 1)
 * (advancing the generator as one non-greedy pick does), and the pick for a
 * given u, which uses no generator: weights w = expf((logit - max) / T);
 * without truncation (top_k 0, top_p 1) the first id whose cumulative
 * weight, in id order, exceeds u * sum(w); otherwise candidates by
 * descending weight (ties: lower id first), the first top_k kept, then the
 * shortest prefix whose weight reaches top_p of the kept weight, and the
 * first candidate whose cumulative weight exceeds u * (prefix weight).
 * Masses in f64. A device can make the same pick from the same u (the
 * backend's sample hook). Logits all -inf or NaN give id 0. */
double dj_sampler_uniform(dj_sampler_t *s);
int32_t dj_sampler_pick(dj_sampler_t *s, const float *logits, double u);
/* The params it was made with, and its vocabulary size. */
const dj_sampler_params *dj_sampler_params_of(const dj_sampler_t *s);
uint32_t dj_sampler_vocab(const dj_sampler_t *s);

/* Record tokens the penalties count: the prompt's (prompt true) and each
 * generated token (prompt false), in order. */
void dj_sampler_observe(dj_sampler_t *s, const int32_t *ids, size_t n, bool prompt);

/* argmax with lowest-id tie break; NaNs are skipped (all NaN: 0). */
int32_t dj_argmax(const float *logits, uint32_t n);

#endif
