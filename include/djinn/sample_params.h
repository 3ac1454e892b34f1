/* sample_params.h: the plain description of a pick - a request's sampling
 * parameters, one observed id's penalty, a pick's log-probabilities - as
 * types only, so the client, the wire and the backend share them without code. */
#ifndef DJINN_SAMPLE_PARAMS_H
#define DJINN_SAMPLE_PARAMS_H

#include <stdint.h>

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
    float top_a;              /* 0 = off; in [0, 1]: keep probabilities >= top_a * (the largest)^2
                               * (after penalties and temperature, over the whole row) */
} dj_sampler_params;

/* One entry of a request's logit_bias (OpenAI's field): bias is added to
 * id's raw logit before the pick's rule (penalties, temperature, ...); -100
 * bans the id in practice, 100 all but forces it. A request holds at most
 * DJ_MAX_LOGIT_BIAS entries, each id once, bias finite in [-100, 100]. */
typedef struct dj_logit_bias {
    int32_t id;
    float bias;
} dj_logit_bias;

#define DJ_MAX_LOGIT_BIAS 1024
#define DJ_LOGIT_BIAS_MAX_ABS 100.0

/* One observed id's penalty (sampler.c keeps one per distinct id): its logit
 * becomes dj__sample_penalize(logit, repetition_penalty, sub)
 * (src/sample/sample_rule.h). */
typedef struct dj_sampler_penalty {
    int32_t id;
    float sub; /* count * frequency + (count > 0) * presence, in f32 */
} dj_sampler_penalty;

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

#endif
