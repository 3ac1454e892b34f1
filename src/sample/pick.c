/* pick.c: the sampling rule on one row of logits (pick.h), the one code that
 * the host sampler and the CPU backend's sample hook run. */
#include "djinn/pick.h"
#include "djinn/alloc.h"

#include "sample/sample_rule.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

dj_status dj_pick_scratch_reserve(dj_pick_scratch *s, uint32_t vocab) {
    if (vocab <= s->vocab && s->pl) return DJ_OK;
    float *pl = dj_malloc(vocab * sizeof *pl), *w = dj_malloc(vocab * sizeof *w);
    dj_pick_cand *order = dj_malloc(vocab * sizeof *order);
    if (!pl || !w || !order) {
        free(pl);
        free(w);
        free(order);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    dj_pick_scratch_free(s);
    *s = (dj_pick_scratch){.pl = pl, .w = w, .order = order, .vocab = vocab};
    return DJ_OK;
}

void dj_pick_scratch_free(dj_pick_scratch *s) {
    free(s->pl);
    free(s->w);
    free(s->order);
    *s = (dj_pick_scratch){0};
}

dj_status dj_pick_rule_check(const dj_pick_rule *r) {
    if (!(r->temperature >= 0.0f) || !isfinite(r->temperature))
        return dj_fail(DJ_EINVAL, "temperature must be a finite number >= 0 (got %g)", (double)r->temperature);
    if (!(r->top_p > 0.0f && r->top_p <= 1.0f))
        return dj_fail(DJ_EINVAL, "top-p must be in (0, 1] (got %g)", (double)r->top_p);
    if (!(r->min_p >= 0.0f && r->min_p <= 1.0f))
        return dj_fail(DJ_EINVAL, "min-p must be in [0, 1] (got %g)", (double)r->min_p);
    if (!(r->repetition_penalty >= 0.0f) || !isfinite(r->repetition_penalty))
        return dj_fail(DJ_EINVAL, "repetition penalty must be finite and > 0 (0 or 1: off; got %g)",
                       (double)r->repetition_penalty);
    return DJ_OK;
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
    const dj_pick_cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

static int before(const dj_pick_cand *x, const dj_pick_cand *y) {
    return x->p > y->p || (x->p == y->p && x->id < y->id);
}

/* Rearrange c[0, n) so that c[0, m) holds the first m of the weight order
 * (in any order): quickselect with a median-of-three pivot. */
static void select_head(dj_pick_cand *c, uint32_t n, uint32_t m) {
    uint32_t lo = 0, hi = n; /* the m-th boundary lies in [lo, hi) */
    while (hi - lo > 1 && m > lo && m < hi) {
        const uint32_t mid = lo + (hi - lo) / 2;
        dj_pick_cand a = c[lo], b = c[mid], d = c[hi - 1], piv;
        if (before(&a, &b)) /* median of a, b, d */
            piv = before(&b, &d) ? b : before(&a, &d) ? d : a;
        else
            piv = before(&a, &d) ? a : before(&b, &d) ? d : b;
        uint32_t i = lo, j = hi; /* c[lo, i) before piv, c[j, hi) not before piv */
        for (uint32_t k = lo; k < j;) {
            if (before(&c[k], &piv)) {
                const dj_pick_cand t = c[k];
                c[k++] = c[i];
                c[i++] = t;
            } else if (before(&piv, &c[k])) {
                const dj_pick_cand t = c[k];
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

/* The rule of pick.h (the CUDA sample kernel follows it too). */
int32_t dj_pick(const dj_pick_rule *r, const float *logits, uint32_t vocab, double u, const dj_sampler_penalty *pen,
                uint32_t n_pen, dj_pick_scratch *s) {
    const uint32_t V = vocab;
    const float *l = logits;
    if (n_pen) {
        memcpy(s->pl, logits, V * sizeof *s->pl);
        for (uint32_t k = 0; k < n_pen; k++)
            if (pen[k].id >= 0 && (uint32_t)pen[k].id < V)
                s->pl[pen[k].id] = dj__sample_penalize(s->pl[pen[k].id], r->repetition_penalty, pen[k].sub);
        l = s->pl;
    }
    if (r->temperature == 0.0f) return dj_argmax(l, V);
    float mx = -INFINITY;
    for (uint32_t i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx; /* NaN never wins */
    if (!(mx > -INFINITY)) return 0; /* nothing to choose from */
    uint64_t total = 0;
    for (uint32_t i = 0; i < V; i++) {
        s->w[i] = dj__sample_weight(l[i], mx, r->temperature);
        total += dj__sample_q(s->w[i]);
    }
    /* The kept set: every id (no truncation), or the first `keep` of the
     * candidate order order[0, keep). */
    const uint32_t K = r->top_k > 0 && r->top_k < V ? r->top_k : V;
    const float floor_w = dj__sample_floor(r, total);
    const bool cut = K < V || r->top_p < 1.0f || floor_w > 0.0f;
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
        if (r->top_p < 1.0f) { /* the shortest prefix reaching top_p of the kept mass */
            const double goal = (double)r->top_p * (double)kept;
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
            if (s->order[i].p >= floor_w) s->w[s->order[i].id] = s->order[i].p; /* the floor: a prefix too */
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
