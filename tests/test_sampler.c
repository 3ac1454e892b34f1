/* test_sampler.c: greedy, temperature, top-k and top-p choices - support,
 * frequencies against the softmax they should follow, reproducibility by
 * seed, the pick rule on a hand-made row, the CUDA sample kernel's algorithm
 * emulated on the host against that rule, and the parameter checks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/sampler.h"
#include "testutil.h"

#define V 50

static void softmax(const float *l, float t, double *p) {
    double mx = -1e30, s = 0;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < V; i++) s += p[i] = exp((l[i] - mx) / t);
    for (int i = 0; i < V; i++) p[i] /= s;
}

/* ---- the CUDA sample kernel's algorithm (src/backend/cuda/cuda_sample.cu),
 * step for step on the host: cuts found by bisection over the bits of the
 * weights, tied weights counted, never sorted. Its picks must be
 * dj_sampler_pick's - exactly for logits on a grid (many ties), and up to a
 * swap with a neighbour in weight order for continuous ones (f64 sums in
 * another order can move a boundary by an ulp). ---- */

#define ONE_BITS 0x3f800000u

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static double mass_ge(const uint32_t *wb, uint32_t n, uint32_t b) {
    double s = 0;
    for (uint32_t i = 0; i < n; i++)
        if (wb[i] >= b)
            s += bitsf(wb[i]);
    return s;
}
static uint32_t count_ge(const uint32_t *wb, uint32_t n, uint32_t b) {
    uint32_t c = 0;
    for (uint32_t i = 0; i < n; i++)
        c += wb[i] >= b;
    return c;
}

typedef struct emu {
    const uint32_t *wb;
    uint32_t n, bk, ties_k, bp, ties_p;
    double goal, target;
} emu;

static double kept_ge(const emu *e, uint32_t b) {
    return b > e->bk ? mass_ge(e->wb, e->n, b) : mass_ge(e->wb, e->n, e->bk + 1) + (double)e->ties_k * bitsf(e->bk);
}
static double prefix_ge(const emu *e, uint32_t b) {
    return b > e->bp ? mass_ge(e->wb, e->n, b) : mass_ge(e->wb, e->n, e->bp + 1) + (double)e->ties_p * bitsf(e->bp);
}

static int32_t kernel_pick(const dj_sampler_params *p, const float *l, uint32_t n, double u, uint32_t *wb) {
    float mx = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        mx = l[i] > mx ? l[i] : mx;
    if (!(mx > -INFINITY))
        return 0;
    for (uint32_t i = 0; i < n; i++) {
        const float w = expf((l[i] - mx) / p->temperature);
        wb[i] = fbits(w == w ? w : 0.0f);
    }
    const double total = mass_ge(wb, n, 0);
    if (p->top_k == 0 && !(p->top_p < 1.0f)) {
        double acc = 0;
        uint32_t last = 0;
        for (uint32_t i = 0; i < n; i++) {
            const double w = bitsf(wb[i]);
            if (w <= 0)
                continue;
            last = i;
            if (acc + w > u * total)
                return (int32_t)i;
            acc += w;
        }
        return (int32_t)last;
    }
    emu e = {.wb = wb, .n = n, .bk = 0};
    uint32_t need_k = n;
    if (p->top_k > 0 && p->top_k < n) {
        uint32_t lo = 0, hi = ONE_BITS;
        while (lo < hi) {
            const uint32_t mid = lo + (hi - lo + 1) / 2;
            if (count_ge(wb, n, mid) >= p->top_k)
                lo = mid;
            else
                hi = mid - 1;
        }
        e.bk = lo;
        need_k = p->top_k - count_ge(wb, n, e.bk + 1);
    }
    const uint32_t eq_k = count_ge(wb, n, e.bk) - count_ge(wb, n, e.bk + 1);
    e.ties_k = need_k < eq_k ? need_k : eq_k;
    const double kept = kept_ge(&e, e.bk);
    e.bp = e.bk;
    e.ties_p = e.ties_k;
    double prefix = kept;
    if (p->top_p < 1.0f) {
        e.goal = (double)p->top_p * kept;
        uint32_t lo = e.bk, hi = ONE_BITS;
        while (lo < hi) {
            const uint32_t mid = lo + (hi - lo + 1) / 2;
            if (kept_ge(&e, mid) >= e.goal)
                lo = mid;
            else
                hi = mid - 1;
        }
        e.bp = lo;
        const double above = kept_ge(&e, e.bp + 1);
        const uint32_t avail = e.bp == e.bk ? e.ties_k : count_ge(wb, n, e.bp) - count_ge(wb, n, e.bp + 1);
        const double wp = bitsf(e.bp);
        double need = wp > 0 ? ceil((e.goal - above) / wp) : (double)avail;
        if (need < 1)
            need = 1;
        e.ties_p = need > avail ? avail : (uint32_t)need;
        prefix = above + (double)e.ties_p * wp;
    }
    e.target = u * prefix;
    uint32_t lo = e.bp, hi = ONE_BITS;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo + 1) / 2;
        if (prefix_ge(&e, mid) > e.target)
            lo = mid;
        else
            hi = mid - 1;
    }
    const uint32_t bs = lo;
    const double before = mass_ge(wb, n, bs + 1);
    const uint32_t tied = bs == e.bp ? e.ties_p : count_ge(wb, n, bs) - count_ge(wb, n, bs + 1);
    const double ws = bitsf(bs);
    double j = ws > 0 ? floor((e.target - before) / ws) : 0;
    if (j < 0)
        j = 0;
    const uint32_t t = j >= tied ? (tied ? tied - 1 : 0) : (uint32_t)j;
    for (uint32_t i = 0, k = 0; i < n; i++)
        if (wb[i] == bs && k++ == t)
            return (int32_t)i;
    return 0;
}

static void check_kernel_algorithm(void) {
    enum { N = 3000 };
    static float l[N];
    static uint32_t wb[N], order[N], rank[N];
    static const float temps[] = {0.5f, 1.0f, 1.7f};
    static const uint32_t topks[] = {0, 1, 3, 40, 5000};
    static const float topps[] = {1.0f, 0.9137f, 0.5371f, 0.05f};
    int exact = 0, swaps = 0, wrong = 0;
    for (int trial = 0; trial < 400; trial++) {
        const int grid = trial % 2 == 0;
        const uint32_t n = trial % 5 == 0 ? 7 : 1 + (uint32_t)(dj_test_rand() % N);
        if (grid)
            dj_test_grid_logits(l, n);
        for (uint32_t i = 0; !grid && i < n; i++)
            l[i] = dj_test_randf(-6.f, 6.f);
        const dj_sampler_params p = {.temperature = temps[dj_test_rand() % 3],
                                     .top_k = topks[dj_test_rand() % 5],
                                     .top_p = topps[dj_test_rand() % 4]};
        const double u = (double)dj_test_randf(0.f, 1.f);
        dj_sampler_t *s = NULL;
        CHECK_OK(dj_sampler_new(&p, n, &s));
        if (!s)
            return;
        const int32_t want = dj_sampler_pick(s, l, u), got = kernel_pick(&p, l, n, u, wb);
        dj_sampler_free(s);
        if (got == want) {
            exact++;
            continue;
        }
        dj_test_weight_ranks(l, n, p.temperature, order, rank);
        const long d = (long)rank[got] - (long)rank[want];
        if (!grid && (d == 1 || d == -1))
            swaps++;
        else
            wrong++;
        if (wrong == 1 && !(!grid && (d == 1 || d == -1)))
            printf("kernel algorithm: n %u grid %d T %g top_k %u top_p %g u %.9f: got %d want %d\n", n, grid,
                   (double)p.temperature, p.top_k, (double)p.top_p, u, got, want);
    }
    printf("kernel algorithm: %d exact, %d adjacent swaps, %d wrong of 400\n", exact, swaps, wrong);
    CHECK(wrong == 0 && swaps <= 4);
}

int main(void) {
    dj_test_seeds();
    check_kernel_algorithm();
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
     * 1, 2, 4, 3, 0 (ties by id); total 3 + e^-1 + e^-2 = 3.5032 */
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
            {4, 1.f, 0.99, 3},   /* ids 1, 2, 4, 3: 3.33 > 3.0 */
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
    dj_sampler_free(NULL);
    return dj_test_finish("test_sampler");
}
