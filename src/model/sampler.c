/* sampler.c: greedy / temperature / top-k / top-p token choice with a seeded
 * generator, so that a seed reproduces a generation exactly. */
#include "djinn/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dj_sampler {
    dj_sampler_params p;
    uint32_t vocab;
    uint64_t rng[4];     /* xoshiro256** state */
    float *prob;         /* [vocab] scratch */
    struct cand { float p; uint32_t id; } *order; /* [vocab] scratch: candidates */
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

dj_status dj_sampler_new(const dj_sampler_params *p, uint32_t vocab, dj_sampler_t **out) {
    *out = NULL;
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return dj_fail(DJ_EINVAL, "temperature must be a finite number >= 0 (got %g)", (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return dj_fail(DJ_EINVAL, "top-p must be in (0, 1] (got %g)", (double)p->top_p);
    if (vocab == 0) return dj_fail(DJ_EINVAL, "empty vocabulary");
    dj_sampler_t *s = calloc(1, sizeof *s);
    if (!s) return dj_fail(DJ_ENOMEM, "out of memory");
    s->p = *p;
    s->vocab = vocab;
    s->prob = malloc(vocab * sizeof *s->prob);
    s->order = malloc(vocab * sizeof *s->order);
    if (!s->prob || !s->order) {
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
    free(s->prob);
    free(s->order);
    free(s);
}

int32_t dj_argmax(const float *logits, uint32_t n) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++) /* NaN never wins; a NaN at 0 gives way to any number */
        if (logits[i] > logits[best] || (logits[best] != logits[best] && logits[i] == logits[i]))
            best = i;
    return (int32_t)best;
}

/* Candidates by weight, descending; ties by id ascending. */
static int by_weight_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

double dj_sampler_uniform(dj_sampler_t *s) {
    return (double)(next_u64(s->rng) >> 11) * (1.0 / 9007199254740992.0); /* 53 bits: [0, 1) */
}

/* The rule (the CUDA backend's sample hook follows it too): weights
 * w = expf((logit - max) / T) in f32, masses summed in f64. */
int32_t dj_sampler_pick(dj_sampler_t *s, const float *logits, double u) {
    const uint32_t V = s->vocab;
    if (s->p.temperature == 0.0f) return dj_argmax(logits, V);
    float mx = -INFINITY;
    for (uint32_t i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx; /* NaN never wins */
    if (!(mx > -INFINITY)) return 0; /* nothing to choose from */
    double sum = 0.0;
    for (uint32_t i = 0; i < V; i++) {
        const float w = expf((logits[i] - mx) / s->p.temperature);
        s->prob[i] = w == w ? w : 0.0f; /* a NaN logit weighs nothing */
        sum += s->prob[i];
    }
    if (s->p.top_k == 0 && s->p.top_p >= 1.0f) { /* no truncation: draw in id order, no sort */
        const double target = u * sum;
        double acc = 0.0;
        uint32_t last = 0;
        for (uint32_t i = 0; i < V; i++) {
            if (s->prob[i] <= 0.0f) continue;
            acc += s->prob[i];
            last = i;
            if (target < acc) return (int32_t)i;
        }
        return (int32_t)last; /* rounding left target unreached */
    }
    for (uint32_t i = 0; i < V; i++) {
        s->order[i].p = s->prob[i];
        s->order[i].id = i;
    }
    qsort(s->order, V, sizeof *s->order, by_weight_desc);
    uint32_t keep = V;
    if (s->p.top_k > 0 && s->p.top_k < keep) keep = s->p.top_k;
    if (s->p.top_p < 1.0f) { /* the shortest prefix whose mass reaches top_p of the kept mass */
        double kept = 0.0;
        for (uint32_t i = 0; i < keep; i++) kept += s->order[i].p;
        const double goal = (double)s->p.top_p * kept;
        double acc = 0.0;
        uint32_t k = 0;
        while (k < keep) {
            acc += s->order[k].p;
            k++;
            if (acc >= goal) break;
        }
        keep = k;
    }
    double mass = 0.0;
    for (uint32_t i = 0; i < keep; i++) mass += s->order[i].p;
    const double target = u * mass;
    double acc = 0.0;
    for (uint32_t i = 0; i < keep; i++) {
        acc += s->order[i].p;
        if (target < acc) return (int32_t)s->order[i].id;
    }
    return (int32_t)s->order[keep - 1].id;
}

int32_t dj_sampler_sample(dj_sampler_t *s, const float *logits) {
    if (s->p.temperature == 0.0f) return dj_argmax(logits, s->vocab);
    return dj_sampler_pick(s, logits, dj_sampler_uniform(s));
}

const dj_sampler_params *dj_sampler_params_of(const dj_sampler_t *s) { return &s->p; }

uint32_t dj_sampler_vocab(const dj_sampler_t *s) { return s->vocab; }
