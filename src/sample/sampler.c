/* sampler.c: greedy / temperature / top-k / top-p / min-p token choice with
 * penalties, a logit bias and a mask, and a seeded generator, so that a seed reproduces a generation. */
#include "djinn/sampler.h"
#include "djinn/alloc.h"
#include "djinn/sample_schema.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dj_sampler {
    dj_sampler_params p;
    uint32_t vocab;
    bool penalised;      /* some penalty is on: observe keeps counts */
    uint64_t rng[4];     /* xoshiro256** state */
    dj_pick_scratch scr; /* for vocab ids */
    uint32_t *slot;      /* [vocab] 1 + the penalty entry of each id, 0 = none; NULL when !penalised */
    uint32_t *count;     /* [pen_cap] generated occurrences of each entry's id */
    dj_sampler_penalty *pen; /* [n_pen] */
    uint32_t n_pen, pen_cap;
    bool lp_on, lp_have; /* logprobs asked for; lp holds a record */
    uint32_t lp_top;
    dj_token_logprobs lp;
    const uint8_t *allowed; /* [vocab] the mask (borrowed), or NULL */
    float *masked;          /* [vocab] the logits under the mask and the bias */
    dj_logit_bias *bias;    /* [n_bias] (owned) */
    size_t n_bias;
};

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(uint64_t *s) {
    const uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

dj_status dj_sampler_params_check(const dj_sampler_params *p) {
    if (!p) return dj_fail(DJ_EINVAL, "sampler: NULL params");
    const dj_status st = dj_pick_rule_check(p);
    if (st != DJ_OK) return st;
    return dj_sample_schema_check(p); /* every field's bounds, from the one table */
}

static bool rep_on(float rep) { return rep != 0.0f && rep != 1.0f; }

dj_status dj_sampler_new(const dj_sampler_params *p, uint32_t vocab, dj_sampler_t **out) {
    *out = NULL;
    dj_status st = dj_sampler_params_check(p);
    if (st != DJ_OK) return st;
    if (vocab == 0) return dj_fail(DJ_EINVAL, "empty vocabulary");
    dj_sampler_t *s = dj_calloc(1, sizeof *s);
    if (!s) return dj_fail(DJ_ENOMEM, "out of memory");
    s->p = *p;
    s->vocab = vocab;
    s->penalised = rep_on(p->repetition_penalty) || p->frequency_penalty != 0.0f || p->presence_penalty != 0.0f;
    const dj_status scr = dj_pick_scratch_reserve(&s->scr, vocab);
    if (s->penalised) s->slot = dj_calloc(vocab, sizeof *s->slot);
    if (scr != DJ_OK || (s->penalised && !s->slot)) {
        dj_sampler_free(s);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix(&x);
    *out = s;
    return DJ_OK;
}

void dj_sampler_free(dj_sampler_t *s) {
    if (!s) return;
    dj_pick_scratch_free(&s->scr);
    free(s->masked);
    free(s->bias);
    free(s->slot);
    free(s->count);
    free(s->pen);
    free(s);
}

void dj_sampler_observe(dj_sampler_t *s, const int32_t *ids, size_t n, bool prompt) {
    if (!s->penalised) return;
    for (size_t k = 0; k < n; k++) {
        if (ids[k] < 0 || (uint32_t)ids[k] >= s->vocab) continue;
        uint32_t e = s->slot[ids[k]];
        if (e == 0) {
            if (s->n_pen == s->pen_cap) { /* at most vocab entries, so this stops growing */
                const uint32_t cap = s->pen_cap ? s->pen_cap * 2 : 64;
                dj_sampler_penalty *pn = dj_realloc(s->pen, cap * sizeof *pn);
                if (pn) s->pen = pn;
                uint32_t *c = pn ? dj_realloc(s->count, cap * sizeof *c) : NULL;
                if (c) s->count = c;
                if (!pn || !c) {
                    DJ_LOG(WARN, "sampler: out of memory; id %d is not penalised", (int)ids[k]);
                    continue;
                }
                s->pen_cap = cap;
            }
            e = ++s->n_pen;
            s->slot[ids[k]] = e;
            s->pen[e - 1] = (dj_sampler_penalty){.id = ids[k], .sub = 0.0f};
            s->count[e - 1] = 0;
        }
        if (prompt) continue;
        const uint32_t c = ++s->count[e - 1];
        const float f = (float)c * s->p.frequency_penalty;
        s->pen[e - 1].sub = f + s->p.presence_penalty;
    }
}

bool dj_sampler_is_greedy(const dj_sampler_t *s) {
    return s->p.temperature == 0.0f && !s->penalised && !s->allowed && !s->n_bias;
}

dj_status dj_sampler_set_allowed(dj_sampler_t *s, const uint8_t *allowed) {
    if (allowed && !s->masked && !(s->masked = dj_malloc((size_t)s->vocab * sizeof *s->masked)))
        return dj_fail(DJ_ENOMEM, "out of memory for a mask of %u ids", s->vocab);
    s->allowed = allowed;
    return DJ_OK;
}

const uint8_t *dj_sampler_allowed(const dj_sampler_t *s) { return s->allowed; }

const dj_logit_bias *dj_sampler_bias(const dj_sampler_t *s, uint32_t *n) {
    *n = (uint32_t)s->n_bias;
    return s->bias;
}

bool dj_sampler_rule_greedy(const dj_sampler_t *s) { return s->p.temperature == 0.0f && !s->penalised; }

bool dj_sampler_masked(const dj_sampler_t *s) { return s->allowed != NULL || s->n_bias; }

dj_status dj_sampler_set_bias(dj_sampler_t *s, const dj_logit_bias *bias, size_t n) {
    dj_status st = dj_logit_bias_check(bias, n, s->vocab);
    if (st != DJ_OK) return st;
    dj_logit_bias *b = NULL;
    if (n && !(b = dj_malloc(n * sizeof *b))) return dj_fail(DJ_ENOMEM, "out of memory for %zu logit biases", n);
    if (n && !s->masked && !(s->masked = dj_malloc((size_t)s->vocab * sizeof *s->masked))) {
        free(b);
        return dj_fail(DJ_ENOMEM, "out of memory for %u biased logits", s->vocab);
    }
    if (n) memcpy(b, bias, n * sizeof *b);
    free(s->bias);
    s->bias = b;
    s->n_bias = n;
    return DJ_OK;
}

uint32_t dj_sampler_penalties(const dj_sampler_t *s, const dj_sampler_penalty **out) {
    *out = s->pen;
    return s->n_pen;
}

double dj_sampler_uniform(dj_sampler_t *s) {
    return (double)(next_u64(s->rng) >> 11) * (1.0 / 9007199254740992.0); /* 53 bits: [0, 1) */
}

int32_t dj_sampler_pick_with(dj_sampler_t *s, const float *logits, double u, const dj_sampler_penalty *pen,
                             uint32_t n_pen) {
    if (s->allowed || s->n_bias) {
        if (s->allowed) {
            for (uint32_t i = 0; i < s->vocab; i++) s->masked[i] = s->allowed[i] ? logits[i] : -INFINITY;
        } else {
            memcpy(s->masked, logits, (size_t)s->vocab * sizeof *logits);
        }
        for (size_t k = 0; k < s->n_bias; k++) s->masked[s->bias[k].id] += s->bias[k].bias; /* -inf stays */
        logits = s->masked;
    }
    return dj_pick(&s->p, logits, s->vocab, u, pen, n_pen, &s->scr);
}

int32_t dj_sampler_pick(dj_sampler_t *s, const float *logits, double u) {
    return dj_sampler_pick_with(s, logits, u, s->pen, s->n_pen);
}

int32_t dj_sampler_sample(dj_sampler_t *s, const float *logits) {
    if (s->p.temperature == 0.0f) return dj_sampler_pick(s, logits, 0.0);
    return dj_sampler_pick(s, logits, dj_sampler_uniform(s));
}

const dj_sampler_params *dj_sampler_params_of(const dj_sampler_t *s) { return &s->p; }

uint32_t dj_sampler_vocab(const dj_sampler_t *s) { return s->vocab; }

dj_status dj_sampler_set_logprobs(dj_sampler_t *s, uint32_t n_top) {
    if (n_top > DJ_MAX_TOP_LOGPROBS)
        return dj_fail(DJ_EINVAL, "top_logprobs %u: at most %d", n_top, DJ_MAX_TOP_LOGPROBS);
    s->lp_on = true;
    s->lp_top = n_top;
    return DJ_OK;
}

bool dj_sampler_wants_logprobs(const dj_sampler_t *s) { return s->lp_on; }

void dj_sampler_note_logprobs(dj_sampler_t *s, const float *logits, int32_t picked) {
    dj_logprobs_of(logits, s->vocab, picked, s->lp_top, &s->lp);
    s->lp_have = true;
}

const dj_token_logprobs *dj_sampler_last_logprobs(const dj_sampler_t *s) { return s->lp_have ? &s->lp : NULL; }
