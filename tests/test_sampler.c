/* test_sampler.c: greedy, temperature, top-k and top-p choices - support,
 * frequencies against the softmax they should follow, reproducibility by
 * seed, the pick rule on a hand-made row, the CUDA sample kernel's algorithm
 * emulated on the host against that rule, the logit bias, and the parameter
 * checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/sample_schema.h"
#include "djinn/sampler.h"
#include "testutil.h"

#define V 50

static void softmax(const float *l, float t, double *p) {
    double mx = -1e30, s = 0;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < V; i++) s += p[i] = exp((l[i] - mx) / t);
    for (int i = 0; i < V; i++) p[i] /= s;
}

/* ---- an independent implementation of sampler.h's rule: the whole row
 * sorted, the penalties applied by a scan of the observed ids, the cuts by
 * their definitions. dj_sampler_pick must agree with it exactly (masses are
 * integers, so there is no rounding to forgive). ---- */

#include "sample/sample_rule.h"

typedef struct ref_c {
    float w;
    uint32_t id;
} ref_c;

static int ref_cmp(const void *a, const void *b) {
    const ref_c *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

/* gen[n_gen] generated ids, prompt[n_prompt] prompt ids */
static int32_t ref_pick(const dj_sampler_params *p, const float *logits, uint32_t n, double u, const int32_t *prompt,
                        uint32_t n_prompt, const int32_t *gen, uint32_t n_gen) {
    float *l = malloc(n * sizeof *l);
    ref_c *c = malloc(n * sizeof *c);
    char *in = calloc(n, 1);
    memcpy(l, logits, n * sizeof *l);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t cnt = 0, seen = 0;
        for (uint32_t k = 0; k < n_prompt; k++) seen |= prompt[k] == (int32_t)i;
        for (uint32_t k = 0; k < n_gen; k++) cnt += gen[k] == (int32_t)i;
        if (!seen && !cnt) continue;
        const float rep = p->repetition_penalty;
        if (rep != 0.f && rep != 1.f) l[i] = l[i] > 0.f ? l[i] / rep : l[i] * rep;
        if (cnt) {
            const float f = (float)cnt * p->frequency_penalty;
            l[i] -= f + p->presence_penalty;
        }
    }
    int32_t pick = 0;
    float mx = -INFINITY;
    for (uint32_t i = 0; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    if (p->temperature == 0.f) {
        for (uint32_t i = 0; i < n; i++)
            if (l[i] == mx) { pick = (int32_t)i; break; }
        goto out;
    }
    if (!(mx > -INFINITY)) goto out;
    for (uint32_t i = 0; i < n; i++) c[i] = (ref_c){dj__sample_weight(l[i], mx, p->temperature), i};
    qsort(c, n, sizeof *c, ref_cmp);
    uint32_t keep = p->top_k > 0 && p->top_k < n ? p->top_k : n;
    uint64_t kept = 0;
    for (uint32_t i = 0; i < keep; i++) kept += dj__sample_q(c[i].w);
    if (p->top_p < 1.f) {
        uint64_t acc = 0;
        uint32_t k = 0;
        while (k < keep && !((double)acc >= (double)p->top_p * (double)kept)) acc += dj__sample_q(c[k++].w);
        keep = k;
    }
    uint64_t mass = 0;
    for (uint32_t i = 0; i < keep; i++)
        if (c[i].w >= p->min_p) {
            in[c[i].id] = 1;
            mass += dj__sample_q(c[i].w);
        }
    const uint64_t t = (uint64_t)(u * (double)mass) < mass ? (uint64_t)(u * (double)mass) : mass - 1;
    uint64_t acc = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!in[i]) continue;
        acc += dj__sample_q(dj__sample_weight(l[i], mx, p->temperature));
        if (acc > t) { pick = (int32_t)i; break; }
    }
out:
    free(l);
    free(c);
    free(in);
    return pick;
}

/* Random rows (grid logits with many ties, or continuous), random params and
 * observed ids: dj_sampler_pick against ref_pick. */
static void check_against_reference(void) {
    enum { N = 3000 };
    static float l[N];
    static int32_t prompt[64], gen[64];
    static const float temps[] = {0.f, 0.5f, 1.0f, 1.7f};
    static const uint32_t topks[] = {0, 1, 3, 40, 5000};
    static const float topps[] = {1.0f, 0.9137f, 0.5371f, 0.05f};
    static const float minps[] = {0.f, 0.f, 0.05f, 0.5f};
    static const float reps[] = {0.f, 1.f, 1.3f, 0.7f};
    static const float pens[] = {0.f, 0.f, 0.4f, -0.75f};
    int wrong = 0;
    for (int trial = 0; trial < 600; trial++) {
        const int grid = trial % 2 == 0;
        const uint32_t n = trial % 5 == 0 ? 7 : 1 + (uint32_t)(dj_test_rand() % N);
        if (grid)
            dj_test_grid_logits(l, n);
        for (uint32_t i = 0; !grid && i < n; i++)
            l[i] = dj_test_randf(-6.f, 6.f);
        const dj_sampler_params p = {.temperature = temps[dj_test_rand() % 4],
                                     .top_k = topks[dj_test_rand() % 5],
                                     .top_p = topps[dj_test_rand() % 4],
                                     .min_p = minps[dj_test_rand() % 4],
                                     .repetition_penalty = reps[dj_test_rand() % 4],
                                     .frequency_penalty = pens[dj_test_rand() % 4],
                                     .presence_penalty = pens[dj_test_rand() % 4]};
        const uint32_t n_prompt = dj_test_rand() % 64, n_gen = dj_test_rand() % 64;
        for (uint32_t k = 0; k < n_prompt; k++) prompt[k] = (int32_t)(dj_test_rand() % n);
        for (uint32_t k = 0; k < n_gen; k++) gen[k] = (int32_t)(dj_test_rand() % (n < 20 ? n : 20)); /* repeats */
        const double u = (double)dj_test_randf(0.f, 1.f);
        dj_sampler_t *s = NULL;
        CHECK_OK(dj_sampler_new(&p, n, &s));
        if (!s) return;
        dj_sampler_observe(s, prompt, n_prompt, true);
        for (uint32_t k = 0; k < n_gen; k++) dj_sampler_observe(s, &gen[k], 1, false); /* as a generation does */
        const int32_t got = dj_sampler_pick(s, l, u), want = ref_pick(&p, l, n, u, prompt, n_prompt, gen, n_gen);
        dj_sampler_free(s);
        if (got != want && wrong++ == 0)
            printf("reference: n %u grid %d T %g top_k %u top_p %g min_p %g rep %g freq %g pres %g u %.9f: got %d want "
                   "%d\n",
                   n, grid, (double)p.temperature, p.top_k, (double)p.top_p, (double)p.min_p,
                   (double)p.repetition_penalty, (double)p.frequency_penalty, (double)p.presence_penalty, u, got, want);
    }
    CHECK_MSG(wrong == 0, "%d of 600 picks differ from the reference implementation", wrong);
}

/* The weight function against libm's expf: within a few ulp. */
static void check_weight(void) {
    float worst = 0.f;
    for (int i = 0; i <= 32000; i++) {
        const float d = -(float)i / 1000.f, w = dj__sample_weight(d, 0.f, 1.f), e = expf(d);
        const float rel = fabsf(w - e) / e;
        worst = rel > worst ? rel : worst;
    }
    CHECK_MSG(worst < 4e-7f, "the rule's exp is %g (relative) from expf", (double)worst);
    CHECK(dj__sample_weight(3.f, 3.f, 0.7f) == 1.f);
    CHECK(dj__sample_weight(NAN, 0.f, 1.f) == 0.f && dj__sample_weight(-INFINITY, 0.f, 1.f) == 0.f);
}

/* dj_logprobs_of against a long-double log_softmax and a full sort, on grid
 * rows (ties, -inf, NaN) and on edge rows; the sampler's record. */
static int lp_cmp(const void *a, const void *b) {
    const ref_c *x = a, *y = b; /* w holds the logit, NaN as -inf */
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

static void check_logprobs(void) {
    enum { N = 300 };
    float l[N];
    ref_c order[N];
    for (int trial = 0; trial < 40; trial++) {
        dj_test_grid_logits(l, N);
        if (trial % 2) /* wider values on odd trials */
            for (int i = 0; i < N; i++)
                if (isfinite(l[i])) l[i] *= 30.f;
        long double mx = -INFINITY, sum = 0;
        for (int i = 0; i < N; i++)
            if (l[i] > mx) mx = l[i];
        for (int i = 0; i < N; i++)
            if (l[i] > -INFINITY) sum += expl((long double)l[i] - mx);
        const long double lse = mx + logl(sum);
        for (int i = 0; i < N; i++) order[i] = (ref_c){isnan(l[i]) ? -INFINITY : l[i], (uint32_t)i};
        qsort(order, N, sizeof *order, lp_cmp);
        const int32_t picked = (int32_t)(dj_test_rand() % N);
        const uint32_t k = (uint32_t)(trial % (DJ_MAX_TOP_LOGPROBS + 1));
        dj_token_logprobs r;
        dj_logprobs_of(l, N, picked, k, &r);
        const float want = isnan(l[picked]) ? -INFINITY : (float)((long double)l[picked] - lse);
        CHECK_MSG(r.id == picked && (r.logprob == want || fabsf(r.logprob - want) < 1e-5f),
                  "trial %d: logprob of %d is %g, want %g", trial, picked, (double)r.logprob, (double)want);
        CHECK_MSG(r.n_top == k, "trial %d: %u alternatives, want %u", trial, r.n_top, k);
        for (uint32_t j = 0; j < r.n_top; j++) {
            const float wj = (float)((long double)order[j].w - lse);
            CHECK_MSG(r.top_id[j] == (int32_t)order[j].id && fabsf(r.top_logprob[j] - wj) < 1e-5f,
                      "trial %d: alternative %u is %d (%g), want %u (%g)", trial, j, r.top_id[j],
                      (double)r.top_logprob[j], order[j].id, (double)wj);
        }
        double total = 0; /* the probabilities sum to 1 */
        for (int i = 0; i < N; i++) {
            dj_token_logprobs one;
            dj_logprobs_of(l, N, i, 0, &one);
            total += exp((double)one.logprob);
        }
        CHECK_MSG(fabs(total - 1.0) < 1e-5, "trial %d: probabilities sum to %.9f", trial, total);
    }
    /* edges: more alternatives than the vocabulary, +inf, all -inf/NaN */
    const float three[3] = {0.f, 0.f, -INFINITY};
    dj_token_logprobs r;
    dj_logprobs_of(three, 3, 2, DJ_MAX_TOP_LOGPROBS, &r);
    CHECK(r.n_top == 3 && r.top_id[0] == 0 && r.top_id[1] == 1 && r.top_id[2] == 2);
    CHECK(fabsf(r.top_logprob[0] - logf(0.5f)) < 1e-6f && r.logprob == -INFINITY);
    const float inf[3] = {1.f, INFINITY, NAN};
    dj_logprobs_of(inf, 3, 1, 2, &r);
    CHECK(r.logprob == 0.f && r.top_id[0] == 1 && r.top_logprob[1] == -INFINITY);
    const float none[2] = {-INFINITY, NAN};
    dj_logprobs_of(none, 2, 0, 1, &r);
    CHECK(r.logprob == -INFINITY && r.n_top == 1 && r.top_id[0] == 0);
    /* the sampler keeps what the engine records; bounds */
    dj_sampler_t *s = NULL;
    const dj_sampler_params p = {.top_p = 1.f};
    CHECK_OK(dj_sampler_new(&p, 3, &s));
    CHECK(!dj_sampler_wants_logprobs(s) && dj_sampler_last_logprobs(s) == NULL);
    CHECK_ST(dj_sampler_set_logprobs(s, DJ_MAX_TOP_LOGPROBS + 1), DJ_EINVAL);
    CHECK_OK(dj_sampler_set_logprobs(s, 2));
    CHECK(dj_sampler_wants_logprobs(s));
    dj_sampler_note_logprobs(s, three, 1);
    const dj_token_logprobs *got = dj_sampler_last_logprobs(s);
    CHECK(got && got->id == 1 && got->n_top == 2 && fabsf(got->logprob - logf(0.5f)) < 1e-6f);
    dj_sampler_free(s);
}

/* logit_bias: added before the rule, so +100 on a weak id forces it (greedy
 * and sampled), -100 on the argmax removes it; the pick moves to the host
 * (masked); bad entries are refused naming them and leave the sampler as it was. */
static void check_bias(void) {
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = (float)(i % 7) * 0.5f; /* argmax 6 (first of the 3.0s) */
    dj_sampler_t *s = NULL;
    dj_sampler_params p = {.top_p = 1.f, .seed = 5};
    CHECK_OK(dj_sampler_new(&p, V, &s));
    CHECK(dj_sampler_sample(s, logits) == 6 && dj_sampler_is_greedy(s) && !dj_sampler_masked(s));
    const dj_logit_bias up[] = {{.id = 7, .bias = 100.f}};
    CHECK_OK(dj_sampler_set_bias(s, up, 1));
    CHECK(dj_sampler_sample(s, logits) == 7 && !dj_sampler_is_greedy(s) && dj_sampler_masked(s));
    CHECK(logits[7] == 0.f); /* the caller's row is not modified */
    const dj_logit_bias down[] = {{.id = 6, .bias = -100.f}, {.id = 13, .bias = -100.f}};
    CHECK_OK(dj_sampler_set_bias(s, down, 2));
    CHECK(dj_sampler_sample(s, logits) == 20); /* the next 3.0 */
    /* refused: the sampler keeps the two entries above */
    const dj_logit_bias far[] = {{.id = V, .bias = 1.f}};
    CHECK_ST(dj_sampler_set_bias(s, far, 1), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "token id 50") != NULL);
    const dj_logit_bias twice[] = {{.id = 3, .bias = 1.f}, {.id = 3, .bias = 2.f}};
    CHECK_ST(dj_sampler_set_bias(s, twice, 2), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "twice") != NULL);
    const dj_logit_bias big[] = {{.id = 3, .bias = 100.5f}}, nan[] = {{.id = 3, .bias = NAN}};
    CHECK_ST(dj_sampler_set_bias(s, big, 1), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "[-100, 100]") != NULL);
    CHECK_ST(dj_sampler_set_bias(s, nan, 1), DJ_EINVAL);
    CHECK_ST(dj_logit_bias_check(up, DJ_MAX_LOGIT_BIAS + 1, 0), DJ_EINVAL);
    CHECK(dj_sampler_sample(s, logits) == 20);
    dj_sampler_free(s);
    /* sampled at temperature 1: +100 is (all but) certain */
    p = (dj_sampler_params){.temperature = 1.f, .top_p = 1.f, .seed = 9};
    CHECK_OK(dj_sampler_new(&p, V, &s));
    CHECK_OK(dj_sampler_set_bias(s, up, 1));
    int forced = 0;
    for (int k = 0; k < 200; k++) forced += dj_sampler_sample(s, logits) == 7;
    CHECK_MSG(forced == 200, "+100 on id 7 picked it %d times in 200", forced);
    CHECK_OK(dj_sampler_set_bias(s, NULL, 0)); /* cleared */
    forced = 0;
    for (int k = 0; k < 200; k++) forced += dj_sampler_sample(s, logits) == 7;
    CHECK_MSG(forced < 50, "without the bias id 7 came %d times in 200", forced);
    dj_sampler_free(s);
}

int main(void) {
    dj_test_seeds();
    check_bias();
    check_weight();
    check_logprobs();
    check_against_reference();
    float logits[V];
    for (int i = 0; i < V; i++) logits[i] = dj_test_randf(-3.f, 3.f);
    int best = 0;
    for (int i = 1; i < V; i++) best = logits[i] > logits[best] ? i : best;

    /* greedy and its equivalents */
    dj_sampler_t *s = NULL;
    dj_sampler_params p = {.temperature = 0.f, .top_k = 0, .top_p = 1.f, .seed = 1};
    CHECK_OK(dj_sampler_new(&p, V, &s));
    CHECK(dj_sampler_sample(s, logits) == best);
    dj_sampler_free(s);
    p.temperature = 1.f;
    p.top_k = 1;
    CHECK_OK(dj_sampler_new(&p, V, &s));
    int all_best = 1;
    for (int i = 0; i < 200; i++) all_best &= dj_sampler_sample(s, logits) == best;
    CHECK_MSG(all_best, "top-k 1 must always give the argmax");
    dj_sampler_free(s);
    float tie[4] = {1.f, 5.f, 5.f, 0.f};
    CHECK(dj_argmax(tie, 4) == 1);

    /* frequencies follow softmax(logits / T) */
    const float temps[] = {1.0f, 0.5f, 2.0f};
    for (int ti = 0; ti < 3; ti++) {
        p = (dj_sampler_params){.temperature = temps[ti], .top_k = 0, .top_p = 1.f, .seed = dj_test_rand()};
        CHECK_OK(dj_sampler_new(&p, V, &s));
        double want[V];
        int count[V] = {0};
        const int N = 40000;
        softmax(logits, temps[ti], want);
        for (int i = 0; i < N; i++) count[dj_sampler_sample(s, logits)]++;
        /* z-score per token expected at least 20 times; the rare ones pooled */
        double worst = 0, rare_want = 0, rare_got = 0;
        for (int i = 0; i < V; i++) {
            if (want[i] * N < 20) {
                rare_want += want[i];
                rare_got += count[i];
                continue;
            }
            double sd = sqrt(want[i] * (1 - want[i]) / N);
            double z = fabs(count[i] / (double)N - want[i]) / sd;
            worst = z > worst ? z : worst;
        }
        if (rare_want * N >= 20) {
            double z = fabs(rare_got / N - rare_want) / sqrt(rare_want * (1 - rare_want) / N);
            worst = z > worst ? z : worst;
        } else {
            CHECK_MSG(rare_got <= 20 + 10 * sqrt(20.0), "rare tokens drawn %g times, expected < 20", rare_got);
        }
        CHECK_MSG(worst < 5.0, "temperature %.1f: a frequency is %.1f sigma from softmax", temps[ti], worst);
        dj_sampler_free(s);
    }

    /* top-k keeps the k most likely; top-p keeps the smallest prefix reaching p */
    p = (dj_sampler_params){.temperature = 1.f, .top_k = 5, .top_p = 1.f, .seed = 3};
    CHECK_OK(dj_sampler_new(&p, V, &s));
    float sorted[V];
    memcpy(sorted, logits, sizeof sorted);
    for (int i = 0; i < V; i++) /* selection sort, descending */
        for (int j = i + 1; j < V; j++)
            if (sorted[j] > sorted[i]) {
                float t = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = t;
            }
    int outside = 0;
    for (int i = 0; i < 2000; i++) outside += logits[dj_sampler_sample(s, logits)] < sorted[4];
    CHECK_MSG(outside == 0, "top-k 5 sampled %d tokens outside the top 5", outside);
    dj_sampler_free(s);

    double pr[V];
    softmax(logits, 1.f, pr);
    double sp[V];
    memcpy(sp, pr, sizeof sp);
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (sp[j] > sp[i]) {
                double t = sp[i];
                sp[i] = sp[j];
                sp[j] = t;
            }
    double acc = 0;
    int k = 0;
    while (k < V && acc < 0.6) acc += sp[k++];
    p = (dj_sampler_params){.temperature = 1.f, .top_k = 0, .top_p = 0.6f, .seed = 4};
    CHECK_OK(dj_sampler_new(&p, V, &s));
    outside = 0;
    for (int i = 0; i < 2000; i++) outside += pr[dj_sampler_sample(s, logits)] < sp[k - 1] - 1e-12;
    CHECK_MSG(outside == 0, "top-p 0.6 sampled %d tokens outside the nucleus of %d", outside, k);
    dj_sampler_free(s);

    /* the same seed gives the same sequence; another seed (almost surely) not */
    int seq[2][64];
    for (int r = 0; r < 2; r++) {
        p = (dj_sampler_params){.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 1234};
        CHECK_OK(dj_sampler_new(&p, V, &s));
        for (int i = 0; i < 64; i++) seq[r][i] = dj_sampler_sample(s, logits);
        dj_sampler_free(s);
    }
    CHECK(memcmp(seq[0], seq[1], sizeof seq[0]) == 0);
    p.seed = 99;
    CHECK_OK(dj_sampler_new(&p, V, &s));
    int differ = 0;
    for (int i = 0; i < 64; i++) differ |= dj_sampler_sample(s, logits) != seq[0][i];
    CHECK(differ);
    dj_sampler_free(s);

    /* dj_sampler_pick's rule on a hand-made row: weights e^-2, 1, 1, e^-1, 1, 0
     * (three tied at 1, a -inf and a NaN weighing nothing); descending order
     * 1, 2, 4, 3, 0 (ties by id); total 3 + e^-1 + e^-2 = 3.5032; the draw
     * walks the kept ids in id order */
    {
        const float row[7] = {0.f, 2.f, 2.f, 1.f, 2.f, -INFINITY, NAN};
        static const struct {
            uint32_t top_k;
            float top_p;
            double u;
            int32_t want;
        } cases[] = {
            {0, 1.f, 0.50, 2},   /* id order: cumulative 0.135, 1.135, 2.135 > 1.7516 */
            {0, 1.f, 0.03, 0},   /* 0.105 < 0.135 */
            {0, 1.f, 0.9999, 4}, /* 3.5029: past id 3 (3.368), inside id 4 */
            {2, 1.f, 0.40, 1},   /* top-2 = ids 1, 2 (ties cut by id): 0.8 < 1 */
            {2, 1.f, 0.60, 2},   /* 1.2: the second */
            {4, 1.f, 0.99, 4},   /* kept 1, 2, 3, 4, drawn in id order: 3.33 > 2.368 */
            {0, 0.5371f, 0.99, 2}, /* goal 1.8816: prefix ids 1, 2 (mass 2); 1.98 in id 2 */
            {0, 0.2f, 0.99, 1},  /* goal 0.70: id 1 alone */
            {3, 0.999f, 0.99, 4}, /* top-3 mass 3, goal 2.997: all three; 2.97 in id 4 */
        };
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            p = (dj_sampler_params){.temperature = 1.f, .top_k = cases[i].top_k, .top_p = cases[i].top_p};
            CHECK_OK(dj_sampler_new(&p, 7, &s));
            const int32_t got = dj_sampler_pick(s, row, cases[i].u);
            CHECK_MSG(got == cases[i].want, "case %zu (top_k %u top_p %g u %g): picked %d, want %d", i,
                      cases[i].top_k, (double)cases[i].top_p, cases[i].u, got, cases[i].want);
            dj_sampler_free(s);
        }
        /* min-p: 0.5 keeps 1, 2, 4; 0.3 adds 3 (0.368); 0.1 adds 0 (0.135) */
        static const struct {
            float min_p;
            double u;
            int32_t want;
        } mp[] = {{0.5f, 0.5, 2}, {0.5f, 0.99, 4}, {0.3f, 0.7, 3}, {0.1f, 0.01, 0}, {1.f, 0.99, 4}};
        for (size_t i = 0; i < sizeof mp / sizeof *mp; i++) {
            p = (dj_sampler_params){.temperature = 1.f, .top_p = 1.f, .min_p = mp[i].min_p};
            CHECK_OK(dj_sampler_new(&p, 7, &s));
            CHECK_MSG(dj_sampler_pick(s, row, mp[i].u) == mp[i].want, "min-p case %zu", i);
            dj_sampler_free(s);
        }
        /* penalties, greedy: rep 2 halves a prompt id's positive logit, doubles
         * a negative one; frequency/presence subtract per generated count */
        const int32_t two[3] = {2, 4, 2};
        {
            const float r3[7] = {2.f, 1.5f, -1.f, 1.9f, 1.1f, 0.f, 0.f};
            p = (dj_sampler_params){.temperature = 0.f, .top_p = 1.f, .repetition_penalty = 2.f};
            CHECK_OK(dj_sampler_new(&p, 7, &s));
            const int32_t z = 0, neg = 2;
            dj_sampler_observe(s, &z, 1, true); /* 2 -> 1: argmax 3 (1.9) */
            CHECK(dj_sampler_sample(s, r3) == 3);
            dj_sampler_observe(s, &neg, 1, false); /* -1 -> -2 */
            const dj_sampler_penalty *pe = NULL;
            CHECK(dj_sampler_penalties(s, &pe) == 2 && pe[1].id == 2 && pe[1].sub == 0.f);
            dj_sampler_free(s);
            p = (dj_sampler_params){.temperature = 0.f, .top_p = 1.f, .frequency_penalty = 0.5f,
                                    .presence_penalty = 0.25f};
            CHECK_OK(dj_sampler_new(&p, 7, &s));
            dj_sampler_observe(s, two, 3, false); /* id 2: 2*0.5+0.25, id 4: 0.5+0.25 */
            CHECK(dj_sampler_penalties(s, &pe) == 2 && pe[0].id == 2 && pe[0].sub == 1.25f && pe[1].sub == 0.75f);
            const int32_t gen0 = 0;
            dj_sampler_observe(s, &gen0, 1, false); /* id 0: 2 - 0.75 = 1.25: argmax 3 (1.9) */
            CHECK(!dj_sampler_is_greedy(s) && dj_sampler_sample(s, r3) == 3);
            dj_sampler_free(s);
        }
        const float nan_first[3] = {NAN, -1.f, 2.f};
        CHECK(dj_argmax(nan_first, 3) == 2);
        const float dead[3] = {-INFINITY, NAN, -INFINITY};
        p = (dj_sampler_params){.temperature = 1.f, .top_p = 0.9f};
        CHECK_OK(dj_sampler_new(&p, 3, &s));
        CHECK(dj_sampler_pick(s, dead, 0.5) == 0);
        /* sample = pick with the next uniform draw */
        dj_sampler_t *twin = NULL;
        CHECK_OK(dj_sampler_new(&p, 3, &twin));
        const float live[3] = {0.5f, 0.1f, 0.9f};
        int same = 1;
        for (int i = 0; i < 100; i++)
            same &= dj_sampler_sample(s, live) == dj_sampler_pick(twin, live, dj_sampler_uniform(twin));
        CHECK(same);
        dj_sampler_free(twin);
        dj_sampler_free(s);
    }

    /* bad parameters are refused with a message */
    p = (dj_sampler_params){.temperature = -1.f, .top_p = 1.f};
    CHECK_ST(dj_sampler_new(&p, V, &s), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "temperature") != NULL);
    p = (dj_sampler_params){.temperature = NAN, .top_p = 1.f};
    CHECK_ST(dj_sampler_new(&p, V, &s), DJ_EINVAL);
    p = (dj_sampler_params){.temperature = 1.f, .top_p = 0.f};
    CHECK_ST(dj_sampler_new(&p, V, &s), DJ_EINVAL);
    p = (dj_sampler_params){.temperature = 1.f, .top_p = 1.5f};
    CHECK_ST(dj_sampler_new(&p, V, &s), DJ_EINVAL);
    p = (dj_sampler_params){.temperature = 1.f, .top_p = 1.f};
    CHECK_ST(dj_sampler_new(&p, 0, &s), DJ_EINVAL);
    p = (dj_sampler_params){.temperature = 1.f, .top_p = 1.f, .min_p = 1.5f};
    CHECK_ST(dj_sampler_new(&p, V, &s), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "min-p") != NULL);
    p = (dj_sampler_params){.temperature = 1.f, .top_p = 1.f, .repetition_penalty = -1.f};
    CHECK_ST(dj_sampler_new(&p, V, &s), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "repetition") != NULL);
    p = (dj_sampler_params){.temperature = 1.f, .top_p = 1.f, .frequency_penalty = 3.f};
    CHECK_ST(dj_sampler_new(&p, V, &s), DJ_EINVAL);
    p = (dj_sampler_params){.temperature = 1.f, .top_p = 1.f, .presence_penalty = NAN};
    CHECK_ST(dj_sampler_new(&p, V, &s), DJ_EINVAL);
    dj_sampler_free(NULL);
    return dj_test_finish("test_sampler");
}
