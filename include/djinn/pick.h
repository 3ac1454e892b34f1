/* pick.h: the sampling rule on one row of logits - penalties, temperature,
 * top-k, top-p, min-p, then a draw - with caller-owned scratch and no state,
 * below the backend: the host sampler and the CPU backend's sample hook both run it. */
#ifndef DJINN_PICK_H
#define DJINN_PICK_H

#include <stdint.h>

#include "djinn/sample_params.h"
#include "djinn/status.h"

/* The rule's parameters: a request's dj_sampler_params whole, so a field
 * added there reaches the rule with no copy to extend (the rule reads neither
 * the seed nor the frequency/presence weights: the draw u and the penalty
 * entries carry them). */
typedef dj_sampler_params dj_pick_rule;

/* A candidate of the top-k/top-p order: its weight and id. */
typedef struct dj_pick_cand {
    float p;
    uint32_t id;
} dj_pick_cand;

/* Scratch for picks over rows of up to `vocab` ids. Zeroed is empty; grown by
 * dj_pick_scratch_reserve, released by dj_pick_scratch_free. */
typedef struct dj_pick_scratch {
    float *pl;           /* [vocab] penalised logits */
    float *w;            /* [vocab] weights */
    dj_pick_cand *order; /* [vocab] candidates */
    uint32_t vocab;      /* ids the buffers hold */
} dj_pick_scratch;

/* Makes room for rows of vocab ids (keeps what is there when it is enough);
 * DJ_ENOMEM leaves s as it was. */
dj_status dj_pick_scratch_reserve(dj_pick_scratch *s, uint32_t vocab);
void dj_pick_scratch_free(dj_pick_scratch *s); /* back to empty */

/* DJ_EINVAL with a message naming the bad field (temperature, top-p, min-p,
 * repetition penalty, in that order). */
dj_status dj_pick_rule_check(const dj_pick_rule *r);

/* The id the rule picks from logits[vocab] (not modified) with the uniform
 * draw u in [0, 1) and the penalty entries pen[n_pen] (ids outside [0, vocab)
 * are skipped). r must pass dj_pick_rule_check, s must hold vocab ids. The
 * rule (src/sample/sample_rule.h holds its arithmetic, which the CUDA kernel
 * shares):
 *  - logits penalised (dj_sampler_penalty); mx = their max (NaN skipped);
 *  - weights w = dj__sample_weight(l, mx, T) in f32 (the max weighs 1);
 *    masses q = floor(w * 2^36), summed exactly in 64-bit integers;
 *  - the candidate order: descending w, ties by ascending id; top-k keeps
 *    its first top_k; top-p the shortest prefix of those whose mass, as a
 *    double, reaches top_p * (their mass); then the weights below the
 *    rule's floor go (dj__sample_floor: min_p, and any rule of that kind);
 *  - the draw, in id order over the kept ids: the first whose cumulative
 *    mass exceeds floor(u * kept mass).
 * Temperature 0 is the argmax of the penalised logits; logits all -inf or
 * NaN give id 0. */
int32_t dj_pick(const dj_pick_rule *r, const float *logits, uint32_t vocab, double u, const dj_sampler_penalty *pen,
                uint32_t n_pen, dj_pick_scratch *s);

/* argmax with lowest-id tie break; NaNs are skipped (all NaN: 0). */
int32_t dj_argmax(const float *logits, uint32_t n);

#endif
