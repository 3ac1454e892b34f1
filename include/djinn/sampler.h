/* sampler.h: choosing the next token from logits - greedy, temperature,
 * top-k, top-p, min-p and repetition/frequency/presence penalties - seeded
 * and reproducible (same seed, same logits, same observed ids, same ids). */
#ifndef DJINN_SAMPLER_H
#define DJINN_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/pick.h"
#include "djinn/sample_params.h"
#include "djinn/status.h"

typedef struct dj_sampler dj_sampler_t;

/* Checks params (the pick rule's check, then every field's bounds in
 * djinn/sample_schema.h); DJ_EINVAL with a message naming the bad field. */
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
 * given u, which uses no generator: dj_pick (pick.h, which states the rule)
 * with the params and the penalty entries observed so far. */
double dj_sampler_uniform(dj_sampler_t *s);
int32_t dj_sampler_pick(dj_sampler_t *s, const float *logits, double u);
/* Whether picks need no draw and no penalty: T 0 and every penalty off (and no mask, no logit bias). */
bool dj_sampler_is_greedy(const dj_sampler_t *s);
/* A mask for the next picks (structured output, grammar.h): an id with
 * allowed[id] == 0 is never picked (its logit is -inf before the rule);
 * allowed ([vocab]) is borrowed until the next call, NULL lifts the mask.
 * The engine picks a masked sampler's rows on the host (no device mask yet). */
dj_status dj_sampler_set_allowed(dj_sampler_t *s, const uint8_t *allowed);
/* Whether the pick needs the host: a mask or a logit bias is set (no device
 * path for either yet). */
bool dj_sampler_masked(const dj_sampler_t *s);
/* Sets the logit bias (sample_params.h) for every later pick, replacing any
 * before (n 0 clears it); bias[n] is copied. DJ_EINVAL naming the entry: more
 * than DJ_MAX_LOGIT_BIAS, an id outside [0, vocab), an id twice, a bias not
 * finite or outside [-100, 100]; the sampler is unchanged then. */
dj_status dj_sampler_set_bias(dj_sampler_t *s, const dj_logit_bias *bias, size_t n);
/* The mask (NULL: none) and the bias (*n entries) now, borrowed until the
 * next set_allowed / set_bias; for a backend's mask hook. */
const uint8_t *dj_sampler_allowed(const dj_sampler_t *s);
const dj_logit_bias *dj_sampler_bias(const dj_sampler_t *s, uint32_t *n /* OUT */);
/* Whether the rule alone is greedy (T 0, no penalty), mask and bias apart. */
bool dj_sampler_rule_greedy(const dj_sampler_t *s);
/* The penalty entries now (one per distinct observed id; none when every
 * penalty is off); *out valid until the next observe or free. */
uint32_t dj_sampler_penalties(const dj_sampler_t *s, const dj_sampler_penalty **out /* OUT */);
/* The params it was made with, and its vocabulary size. */
const dj_sampler_params *dj_sampler_params_of(const dj_sampler_t *s);
uint32_t dj_sampler_vocab(const dj_sampler_t *s);

/* The rule for one row, with the penalties given: s supplies params
 * (temperature, top-k, top-p, min-p, repetition) and scratch only; its own
 * observed ids are not used. */
int32_t dj_sampler_pick_with(dj_sampler_t *s, const float *logits, double u, const dj_sampler_penalty *pen,
                             uint32_t n_pen);

/* ---- log-probabilities (the HTTP front end's `logprobs`) ---- */
/* dj_token_logprobs (sample_params.h): one pick's log-probabilities. */

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
