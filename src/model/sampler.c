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

static int before(const struct cand *x, const struct cand *y) {
    return x->p > y->p || (x->p == y->p && x->id < y->id);
}

/* Rearrange c[0, n) so that c[0, m) holds the first m of the weight order
 * (in any order): quickselect with a median-of-three pivot. */
static void select_head(struct cand *c, uint32_t n, uint32_t m) {
    uint32_t lo = 0, hi = n; /* the m-th boundary lies in [lo, hi) */
    while (hi - lo > 1 && m > lo && m < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        struct cand a = c[lo], b = c[mid], d = c[hi - 1], piv;
        if (before(&a, &b)) /* median of a, b, d */
            piv = before(&b, &d) ? b : before(&a, &d) ? d : a;
        else
            piv = before(&a, &d) ? a : before(&b, &d) ? d : b;
        uint32_t i = lo, j = hi; /* c[lo, i) before piv, c[j, hi) not before piv */
        for (uint32_t k = lo; k < j;) {
            if (before(&c[k], &piv)) {
                const struct cand t = c[k];
                c[k++] = c[i];
                c[i++] = t;
            } else if (before(&piv, &c[k])) {
                const struct cand t = c[k];
                c[k] = c[--j];
                c[j] = t;
            } else {
                k++; /* the pivot itself (keys are unique) */
            }
        }
        /* c[lo, i) < piv, c[i, j) == piv (one element), c[j, hi) > piv */
        if (m <= i)
            hi = i;
        else if (m >= j)
            lo = j;
        else
            return; /* unreachable: keys are unique, so j = i + 1 */
    }
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
    /* Only the head of the weight order is ever read: select it, sort that. */
    const uint32_t K = s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V;
    double kept = sum;
    if (K < V) { /* the top K, sorted, and their mass */
        select_head(s->order, V, K);
        qsort(s->order, K, sizeof *s->order, by_weight_desc);
        kept = 0.0;
        for (uint32_t i = 0; i < K; i++) kept += s->order[i].p;
    }
    uint32_t keep = K, sorted = K < V ? K : 0; /* order[0, sorted) is in weight order */
    if (s->p.top_p < 1.0f) { /* the shortest prefix whose mass reaches top_p of the kept mass */
        const double goal = (double)s->p.top_p * kept;
        for (uint32_t m = K < 256 ? K : 256;; m = m > K / 4 ? K : m * 4) {
            if (m > sorted) { /* widen the sorted head to m */
                select_head(s->order, K, m);
                qsort(s->order, m, sizeof *s->order, by_weight_desc);
                sorted = m;
            }
            double acc = 0.0;
            uint32_t k = 0;
            while (k < m && acc < goal) acc += s->order[k++].p;
            if (acc >= goal || m == K) {
                keep = k;
                break;
            }
        }
    } else if (sorted < K) { /* top_k >= vocab and no top-p: every id, drawn in weight order */
        qsort(s->order, K, sizeof *s->order, by_weight_desc);
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

void dj_sampler_observe(dj_sampler_t *s, const int32_t *ids, size_t n, bool prompt) {
    (void)s; /* the penalties that count these tokens come with the device sampler's work */
    (void)ids;
    (void)n;
    (void)prompt;
}
