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
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}

/* Candidates by probability, descending; ties by id ascending. */
static int by_prob_desc(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

int32_t dj_sampler_sample(dj_sampler_t *s, const float *logits) {
    const uint32_t V = s->vocab;
    if (s->p.temperature == 0.0f) return dj_argmax(logits, V);
    /* softmax(logits / T) over all ids */
    float mx = -INFINITY;
    for (uint32_t i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0.0;
    for (uint32_t i = 0; i < V; i++) {
        s->prob[i] = expf((logits[i] - mx) / s->p.temperature);
        sum += s->prob[i];
    }
    for (uint32_t i = 0; i < V; i++) {
        s->order[i].p = (float)(s->prob[i] / sum);
        s->order[i].id = i;
    }
    if (s->p.top_k == 0 && s->p.top_p >= 1.0f) { /* no truncation: draw in id order, no sort */
        const double u0 = (double)(next_u64(s->rng) >> 11) * (1.0 / 9007199254740992.0);
        double acc0 = 0.0;
        for (uint32_t i = 0; i < V; i++) {
            acc0 += s->order[i].p;
            if (u0 < acc0) return (int32_t)i;
        }
        return (int32_t)(V - 1);
    }
    qsort(s->order, V, sizeof *s->order, by_prob_desc);
    uint32_t keep = V;
    if (s->p.top_k > 0 && s->p.top_k < keep) keep = s->p.top_k;
    if (s->p.top_p < 1.0f) { /* smallest prefix whose mass reaches top_p (at least one) */
        double kept_mass = 0.0;
        for (uint32_t i = 0; i < keep; i++) kept_mass += s->order[i].p;
        double acc = 0.0;
        uint32_t k = 0;
        while (k < keep) {
            acc += s->order[k].p / kept_mass;
            k++;
            if (acc >= s->p.top_p) break;
        }
        keep = k;
    }
    double mass = 0.0;
    for (uint32_t i = 0; i < keep; i++) mass += s->order[i].p;
    const double u = (double)(next_u64(s->rng) >> 11) * (1.0 / 9007199254740992.0) * mass;
    double acc = 0.0;
    for (uint32_t i = 0; i < keep; i++) {
        acc += s->order[i].p;
        if (u < acc) return (int32_t)s->order[i].id;
    }
    return (int32_t)s->order[keep - 1].id;
}
