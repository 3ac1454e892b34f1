/* sampler.h: choosing the next token from logits - greedy, temperature,
 * top-k, top-p, min-p and repetition/frequency/presence penalties - seeded
 * and reproducible (same seed, same logits, same observed ids, same ids). */
#ifndef DJINN_SAMPLER_H
#define DJINN_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"

/* Zero (or the value named) leaves a feature off. */
typedef struct dj_sampler_params {
    float temperature;        /* 0 = greedy; finite, >= 0 */
    uint32_t top_k;           /* 0 = off */
    float top_p;              /* 1 = off; in (0, 1] */
    uint64_t seed;
    float min_p;              /* 0 = off; in [0, 1]: keep weights >= min_p * the largest */
    float repetition_penalty; /* 0 or 1 = off; else > 0 and finite. HF rule: over the
                               * prompt's and the generated ids, positive logits are
                               * divided by it, negative ones multiplied */
    float frequency_penalty;  /* 0 = off; in [-2, 2]. OpenAI rule, over the generated */
    float presence_penalty;   /* ids: logit -= count * frequency + (count > 0) * presence */
} dj_sampler_params;

typedef struct dj_sampler dj_sampler_t;

/* One observed id's penalty (sampler.c keeps one per distinct id): its logit
 * becomes dj__sample_penalize(logit, repetition_penalty, sub). */
typedef struct dj_sampler_penalty {
    int32_t id;
    float sub; /* count * frequency + (count > 0) * presence, in f32 */
} dj_sampler_penalty;

/* Checks params; DJ_EINVAL with a message naming the bad field. */
dj_status dj_sampler_params_check(const dj_sampler_params *p);
/* Validates params (dj_sampler_params_check) and vocab > 0. */
dj_status dj_sampler_new(const dj_sampler_params *p, uint32_t vocab, dj_sampler_t **out /* OUT */);
void dj_sampler_free(dj_sampler_t *s);

/* Records ids[n] for the penalties: prompt ids count for the repetition
 * penalty only, generated ones (prompt false) for all three. Ids outside
 * [0, vocab) are ignored. Cheap when every penalty is off (nothing kept). */
void dj_sampler_observe(dj_sampler_t *s, const int32_t *ids, size_t n, bool prompt);

/* Pick a token from logits[vocab] (not modified). Order as in transformers:
 * penalties, temperature, top-k, top-p, min-p, then a draw. Greedy (T 0)
 * takes the argmax of the penalised logits, ties by the lowest id. */
int32_t dj_sampler_sample(dj_sampler_t *s, const float *logits);

/* The two halves of dj_sampler_sample: the next uniform draw u in [0, 1)
 * (advancing the generator as one non-greedy pick does), and the pick for a
 * given u, which uses no generator. The rule (src/model/sample_rule.h holds
 * its arithmetic, which the CUDA kernel shares):
 *  - logits penalised (dj_sampler_penalty); mx = their max (NaN skipped);
 *  - weights w = dj__sample_weight(l, mx, T) in f32 (the max weighs 1);
 *    masses q = floor(w * 2^36), summed exactly in 64-bit integers;
 *  - the candidate order: descending w, ties by ascending id; top-k keeps
 *    its first top_k; top-p the shortest prefix of those whose mass, as a
 *    double, reaches top_p * (their mass); min-p then drops w < min_p;
 *  - the draw, in id order over the kept ids: the first whose cumulative
 *    mass exceeds floor(u * kept mass).
 * Logits all -inf or NaN give id 0. */
double dj_sampler_uniform(dj_sampler_t *s);
int32_t dj_sampler_pick(dj_sampler_t *s, const float *logits, double u);
/* Whether picks need no draw and no penalty: T 0 and every penalty off. */
bool dj_sampler_is_greedy(const dj_sampler_t *s);
/* The penalty entries now (one per distinct observed id; none when every
 * penalty is off); *out valid until the next observe or free. */
uint32_t dj_sampler_penalties(const dj_sampler_t *s, const dj_sampler_penalty **out /* OUT */);
/* The params it was made with, and its vocabulary size. */
const dj_sampler_params *dj_sampler_params_of(const dj_sampler_t *s);
uint32_t dj_sampler_vocab(const dj_sampler_t *s);

/* argmax with lowest-id tie break; NaNs are skipped (all NaN: 0). */
int32_t dj_argmax(const float *logits, uint32_t n);

/* The rule for one row, with the penalties given (the CPU backend's sample
 * hook): s supplies params (temperature, top-k, top-p, min-p, repetition)
 * and scratch only; its own observed ids are not used. */
int32_t dj_sampler_pick_with(dj_sampler_t *s, const float *logits, double u, const dj_sampler_penalty *pen,
                             uint32_t n_pen);

/* ---- log-probabilities (the HTTP front end's `logprobs`) ---- */
#define DJ_MAX_TOP_LOGPROBS 20

/* One picked token's log-probability and the most likely alternatives, all
 * from log_softmax of the model's raw logits: before penalties, temperature,
 * top-k/top-p/min-p (what OpenAI and vLLM report: the model's distribution,
 * not the sampler's). In f32 from a double log-sum-exp; NaN logits count as
 * -inf; a -inf logit gives -inf. */
typedef struct dj_token_logprobs {
    int32_t id;      /* the picked token */
    float logprob;
    uint32_t n_top;  /* <= DJ_MAX_TOP_LOGPROBS */
    int32_t top_id[DJ_MAX_TOP_LOGPROBS];     /* most likely first, ties by the lower id */
    float top_logprob[DJ_MAX_TOP_LOGPROBS];
} dj_token_logprobs;

/* logprobs of logits[vocab] for `picked` and its n_top (<= DJ_MAX_TOP_LOGPROBS) best. */
void dj_logprobs_of(const float *logits, uint32_t vocab, int32_t picked, uint32_t n_top,
                    dj_token_logprobs *out /* OUT */);
/* Ask the sampler's user (the engine's step) to record each pick's logprobs
 * with n_top alternatives (0..DJ_MAX_TOP_LOGPROBS; DJ_EINVAL beyond). This
 * brings the picked row's logits to the host after a device pick: only
 * generations that ask pay for it. */
dj_status dj_sampler_set_logprobs(dj_sampler_t *s, uint32_t n_top);
bool dj_sampler_wants_logprobs(const dj_sampler_t *s);
/* Records dj_logprobs_of(logits, vocab, picked, n_top) (the engine calls it). */
void dj_sampler_note_logprobs(dj_sampler_t *s, const float *logits, int32_t picked);
/* The last record, NULL before the first; valid until the next note or free. */
const dj_token_logprobs *dj_sampler_last_logprobs(const dj_sampler_t *s);

#endif
