/* sampler.c: greedy / temperature / top-k / top-p / min-p token choice with
 * penalties and a seeded generator, so that a seed reproduces a generation. */
#include "djinn/sampler.h"
#include "djinn/alloc.h"

#include "model/sample_rule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dj_sampler {
    dj_sampler_params p;
    uint32_t vocab;
    bool penalised;      /* some penalty is on: observe keeps counts */
    uint64_t rng[4];     /* xoshiro256** state */
    float *pl;           /* [vocab] scratch: penalised logits */
    float *w;            /* [vocab] scratch: weights */
    struct cand { float p; uint32_t id; } *order; /* [vocab] scratch: candidates */
    uint32_t *slot;      /* [vocab] 1 + the penalty entry of each id, 0 = none; NULL when !penalised */
    uint32_t *count;     /* [pen_cap] generated occurrences of each entry's id */
    dj_sampler_penalty *pen; /* [n_pen] */
    uint32_t n_pen, pen_cap;
    bool lp_on, lp_have; /* logprobs asked for; lp holds a record */
    uint32_t lp_top;
    dj_token_logprobs lp;
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
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return dj_fail(DJ_EINVAL, "temperature must be a finite number >= 0 (got %g)", (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return dj_fail(DJ_EINVAL, "top-p must be in (0, 1] (got %g)", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return dj_fail(DJ_EINVAL, "min-p must be in [0, 1] (got %g)", (double)p->min_p);
    if (!(p->repetition_penalty >= 0.0f) || !isfinite(p->repetition_penalty))
        return dj_fail(DJ_EINVAL, "repetition penalty must be finite and > 0 (0 or 1: off; got %g)",
                       (double)p->repetition_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return dj_fail(DJ_EINVAL, "frequency penalty must be in [-2, 2] (got %g)", (double)p->frequency_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return dj_fail(DJ_EINVAL, "presence penalty must be in [-2, 2] (got %g)", (double)p->presence_penalty);
    return DJ_OK;
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
    s->pl = dj_malloc(vocab * sizeof *s->pl);
    s->w = dj_malloc(vocab * sizeof *s->w);
    s->order = dj_malloc(vocab * sizeof *s->order);
    if (s->penalised) s->slot = dj_calloc(vocab, sizeof *s->slot);
    if (!s->pl || !s->w || !s->order || (s->penalised && !s->slot)) {
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
    free(s->pl);
    free(s->w);
    free(s->order);
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

bool dj_sampler_is_greedy(const dj_sampler_t *s) { return s->p.temperature == 0.0f && !s->penalised; }

uint32_t dj_sampler_penalties(const dj_sampler_t *s, const dj_sampler_penalty **out) {
    *out = s->pen;
    return s->n_pen;
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

/* The rule of sampler.h (the CUDA sample kernel follows it too). */
int32_t dj_sampler_pick_with(dj_sampler_t *s, const float *logits, double u, const dj_sampler_penalty *pen,
                             uint32_t n_pen) {
    const uint32_t V = s->vocab;
    const float *l = logits;
    if (n_pen) {
        memcpy(s->pl, logits, V * sizeof *s->pl);
        for (uint32_t k = 0; k < n_pen; k++)
            if (pen[k].id >= 0 && (uint32_t)pen[k].id < V)
                s->pl[pen[k].id] = dj__sample_penalize(s->pl[pen[k].id], s->p.repetition_penalty, pen[k].sub);
        l = s->pl;
    }
    if (s->p.temperature == 0.0f) return dj_argmax(l, V);
    float mx = -INFINITY;
    for (uint32_t i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx; /* NaN never wins */
    if (!(mx > -INFINITY)) return 0; /* nothing to choose from */
    uint64_t total = 0;
    for (uint32_t i = 0; i < V; i++) {
        s->w[i] = dj__sample_weight(l[i], mx, s->p.temperature);
        total += dj__sample_q(s->w[i]);
    }
    /* The kept set: every id (no truncation), or the first `keep` of the
     * candidate order order[0, keep). */
    const uint32_t K = s->p.top_k > 0 && s->p.top_k < V ? s->p.top_k : V;
    const bool cut = K < V || s->p.top_p < 1.0f || s->p.min_p > 0.0f;
    uint32_t keep = V;
    if (cut) {
        for (uint32_t i = 0; i < V; i++) {
            s->order[i].p = s->w[i];
            s->order[i].id = i;
        }
        uint32_t sorted = 0; /* order[0, sorted) is in candidate order */
        uint64_t kept = total;
        if (K < V) {
            select_head(s->order, V, K);
            qsort(s->order, K, sizeof *s->order, by_weight_desc);
            sorted = K;
            kept = 0;
            for (uint32_t i = 0; i < K; i++) kept += dj__sample_q(s->order[i].p);
        }
        keep = K;
        if (s->p.top_p < 1.0f) { /* the shortest prefix reaching top_p of the kept mass */
            const double goal = (double)s->p.top_p * (double)kept;
            for (uint32_t m = K < 256 ? K : 256;; m = m > K / 4 ? K : m * 4) {
                if (m > sorted) { /* widen the sorted head to m */
                    select_head(s->order, K, m);
                    qsort(s->order, m, sizeof *s->order, by_weight_desc);
                    sorted = m;
                }
                uint64_t acc = 0;
                uint32_t k = 0;
                while (k < m && !((double)acc >= goal)) acc += dj__sample_q(s->order[k++].p);
                if ((double)acc >= goal || m == K) {
                    keep = k;
                    break;
                }
            }
        }
        for (uint32_t i = 0; i < V; i++) s->w[i] = -1.0f; /* -1 marks ids outside the kept set */
        for (uint32_t i = 0; i < keep; i++) /* order[0, keep): the right set, in any order */
            if (s->order[i].p >= s->p.min_p) s->w[s->order[i].id] = s->order[i].p; /* min-p: a prefix too */
    }
    uint64_t mass = 0;
    for (uint32_t i = 0; i < V; i++)
        if (s->w[i] > 0.0f) mass += dj__sample_q(s->w[i]);
    const uint64_t target = dj__sample_target(u, mass);
    uint64_t acc = 0;
    for (uint32_t i = 0; i < V; i++) {
        if (!(s->w[i] > 0.0f)) continue;
        acc += dj__sample_q(s->w[i]);
        if (acc > target) return (int32_t)i;
    }
    return 0; /* unreachable: the max weighs 2^36 and is kept */
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
