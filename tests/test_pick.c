/* test_pick.c: the pick rule below the backend - the CPU backend's sample hook
 * (one scratch, grown and reused across vocabularies) picks what the host sampler picks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/backend.h"
#include "djinn/pick.h"
#include "djinn/sampler.h"
#include "testutil.h"

/* Rows of several vocabularies in turn (grow, shrink, grow past the first)
 * through the hook, each against dj_sampler_pick_with with the same draw,
 * the same penalty entries and the same params. */
static void check_hook_matches_sampler(void) {
    dj_backend_t *be = NULL;
    CHECK_OK(dj_backend_cpu_new(1, &be));
    const uint32_t vocabs[] = {50, 3000, 17, 3000, 7000, 1};
    enum { ROWS = 4 };
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++) {
        const uint32_t V = vocabs[vi];
        float *logits = malloc((size_t)ROWS * V * sizeof *logits);
        CHECK(logits != NULL);
        dj_sample_row rows[ROWS];
        dj_sampler_penalty pen[ROWS][3];
        int32_t got[ROWS];
        for (uint32_t r = 0; r < ROWS; r++) {
            dj_test_grid_logits(logits + (size_t)r * V, V);
            const uint32_t n_pen = V >= 3 ? (uint32_t)(dj_test_rand() % 4) : 0;
            for (uint32_t k = 0; k < n_pen; k++) /* distinct ids */
                pen[r][k] = (dj_sampler_penalty){.id = (int32_t)(k * (V / 3)), .sub = dj_test_randf(-1.f, 1.f)};
            rows[r] = (dj_sample_row){.temperature = r == 0 ? 0.0f : dj_test_randf(0.2f, 2.0f),
                                      .top_k = r == 2 ? 1 + (uint32_t)(dj_test_rand() % V) : 0,
                                      .top_p = r == 3 ? dj_test_randf(0.1f, 1.0f) : 1.0f,
                                      .min_p = r == 1 ? dj_test_randf(0.0f, 0.5f) : 0.0f,
                                      .repetition_penalty = n_pen ? dj_test_randf(0.5f, 2.0f) : 0.0f,
                                      .n_pen = n_pen, .pen = pen[r], .u = (double)dj_test_randf(0.0f, 0.999f)};
        }
        CHECK_OK(be->vt->sample(be, logits, ROWS, V, rows, got));
        for (uint32_t r = 0; r < ROWS; r++) {
            const dj_sampler_params p = {.temperature = rows[r].temperature, .top_k = rows[r].top_k,
                                         .top_p = rows[r].top_p, .min_p = rows[r].min_p,
                                         .repetition_penalty = rows[r].repetition_penalty};
            dj_sampler_t *s = NULL;
            CHECK_OK(dj_sampler_new(&p, V, &s));
            const int32_t want =
                dj_sampler_pick_with(s, logits + (size_t)r * V, rows[r].u, rows[r].pen, rows[r].n_pen);
            CHECK_MSG(got[r] == want, "vocab %u row %u: the hook picked %d, the sampler %d", V, r, got[r], want);
            dj_sampler_free(s);
        }
        free(logits);
    }
    dj_backend_free(be);
}

/* Bad rules are refused with the sampler's own messages, by the hook too. */
static void check_rule_errors(void) {
    const dj_pick_rule bad[] = {
        {.temperature = -1.0f, .top_p = 1.0f}, {.temperature = NAN, .top_p = 1.0f},
        {.top_p = 0.0f},                        {.top_p = 1.5f},
        {.top_p = 1.0f, .min_p = 2.0f},         {.top_p = 1.0f, .repetition_penalty = INFINITY},
    };
    const char *field[] = {"temperature", "temperature", "top-p", "top-p", "min-p", "repetition penalty"};
    dj_backend_t *be = NULL;
    CHECK_OK(dj_backend_cpu_new(1, &be));
    float logits[4] = {0.f, 1.f, 2.f, 3.f};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_ST(dj_pick_rule_check(&bad[i]), DJ_EINVAL);
        CHECK_MSG(strstr(dj_last_error(), field[i]) != NULL, "rule %zu: '%s' does not name %s", i, dj_last_error(),
                  field[i]);
        const dj_sampler_params p = {.temperature = bad[i].temperature, .top_p = bad[i].top_p,
                                     .min_p = bad[i].min_p, .repetition_penalty = bad[i].repetition_penalty};
        CHECK_ST(dj_sampler_params_check(&p), DJ_EINVAL);
        const dj_sample_row row = {.temperature = bad[i].temperature, .top_p = bad[i].top_p, .min_p = bad[i].min_p,
                                   .repetition_penalty = bad[i].repetition_penalty, .u = 0.5};
        int32_t out = -1;
        CHECK_ST(be->vt->sample(be, logits, 1, 4, &row, &out), DJ_EINVAL);
    }
    const dj_pick_rule ok = {.temperature = 0.7f, .top_k = 3, .top_p = 0.9f, .min_p = 0.1f, .repetition_penalty = 1.1f};
    CHECK_OK(dj_pick_rule_check(&ok));
    dj_backend_free(be);
}

/* Scratch: reserve keeps what is big enough, grows what is not, free empties. */
static void check_scratch(void) {
    dj_pick_scratch s = {0};
    CHECK_OK(dj_pick_scratch_reserve(&s, 100));
    CHECK(s.vocab == 100 && s.pl && s.w && s.order);
    float *pl = s.pl;
    CHECK_OK(dj_pick_scratch_reserve(&s, 10));
    CHECK(s.vocab == 100 && s.pl == pl);
    CHECK_OK(dj_pick_scratch_reserve(&s, 1000));
    CHECK(s.vocab == 1000);
    const float l[5] = {1.f, 5.f, NAN, 5.f, -INFINITY};
    const dj_pick_rule greedy = {.top_p = 1.0f};
    CHECK(dj_pick(&greedy, l, 5, 0.3, NULL, 0, &s) == 1); /* argmax, lowest id of the tie */
    CHECK(dj_argmax(l, 5) == 1);
    dj_pick_scratch_free(&s);
    CHECK(s.vocab == 0 && !s.pl && !s.w && !s.order);
    dj_pick_scratch_free(&s); /* twice is fine */
}

/* A rule of today's fields fits a dj_sample_row (the engine then may pick
 * it through the backend's sample hook). */
static void check_carries(void) {
    const dj_sampler_params p = {.temperature = 0.7f, .top_k = 3, .top_p = 0.9f, .seed = 5, .min_p = 0.1f,
                                 .repetition_penalty = 1.1f, .frequency_penalty = 0.5f, .presence_penalty = -0.5f};
    CHECK(dj_sample_row_carries(&p));
    const dj_sampler_params greedy = {.top_p = 1.0f};
    CHECK(dj_sample_row_carries(&greedy));
}

/* top_a on hand-made logits: weights 1, 0.5, 0.2, 0.05 at T 1 (probabilities
 * 0.571, 0.286, 0.114, 0.029). top_a 0.5 keeps p >= 0.5 * 0.571^2 = 0.163:
 * ids 0 and 1; top_a 1 keeps id 0 alone; 0 keeps all four. Over a grid of
 * draws, through dj_pick and through a dj_sampler (whose check takes the
 * schema's bounds); a rule with top_a is not one a dj_sample_row carries. */
static void check_top_a(void) {
    const float l[4] = {0.0f, logf(0.5f), logf(0.2f), logf(0.05f)};
    const float top_as[] = {0.0f, 0.5f, 1.0f};
    const int want_kinds[] = {4, 2, 1}; /* distinct ids drawn */
    dj_pick_scratch s = {0};
    CHECK_OK(dj_pick_scratch_reserve(&s, 4));
    for (size_t k = 0; k < sizeof top_as / sizeof *top_as; k++) {
        const dj_sampler_params p = {.temperature = 1.0f, .top_p = 1.0f, .top_a = top_as[k]};
        dj_sampler_t *smp = NULL;
        CHECK_OK(dj_sampler_new(&p, 4, &smp));
        int seen[4] = {0};
        for (int i = 0; i < 1000; i++) {
            const double u = (i + 0.5) / 1000.0;
            const int32_t id = dj_pick(&p, l, 4, u, NULL, 0, &s);
            CHECK(id >= 0 && id < 4);
            if (id >= 0 && id < 4) seen[id]++;
            if (smp) CHECK(dj_sampler_pick_with(smp, l, u, NULL, 0) == id);
        }
        int kinds = 0;
        for (int i = 0; i < 4; i++) kinds += seen[i] > 0;
        CHECK_MSG(kinds == want_kinds[k] && seen[0] > 0, "top_a %g: drew %d distinct ids (%d %d %d %d), want %d",
                  (double)top_as[k], kinds, seen[0], seen[1], seen[2], seen[3], want_kinds[k]);
        if (k == 1) /* ids 0, 1 renormalised: 1 / 1.5 of the draws */
            CHECK_MSG(abs(seen[0] - 667) <= 2, "top_a 0.5: id 0 drawn %d times of 1000, want ~667", seen[0]);
        CHECK(dj_sample_row_carries(&p) == (top_as[k] == 0.0f));
        dj_sampler_free(smp);
    }
    /* min_p and top_a together: the higher floor wins (min_p 0.3 drops 0.2; top_a's 0.29 floor too) */
    const dj_sampler_params both = {.temperature = 1.0f, .top_p = 1.0f, .min_p = 0.6f, .top_a = 0.5f};
    for (int i = 0; i < 100; i++) CHECK(dj_pick(&both, l, 4, (i + 0.5) / 100.0, NULL, 0, &s) == 0);
    /* out of its bounds: refused by the sampler's check, naming it */
    const dj_sampler_params bad = {.temperature = 1.0f, .top_p = 1.0f, .top_a = 1.5f};
    CHECK_ST(dj_sampler_params_check(&bad), DJ_EINVAL);
    CHECK_MSG(strstr(dj_last_error(), "top_a") != NULL, "'%s' does not name top_a", dj_last_error());
    dj_pick_scratch_free(&s);
}

int main(void) {
    dj_test_seeds();
    check_hook_matches_sampler();
    check_rule_errors();
    check_scratch();
    check_carries();
    check_top_a();
    return dj_test_finish("test_pick");
}
