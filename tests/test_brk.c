/* test_brk.c: breakpoints (dj_session_step_break) on every fixture model - a
 * step stopped, another session run meanwhile, and resumed gives the same
 * logits and KV bit for bit; edits at a breakpoint equal a trace's; a
 * cancelled step leaves the session as it was; bad breakpoints are refused. */
#include <stdlib.h>
#include <string.h>

#include "djinn/engine.h"
#include "djinn/intervene.h"
#include "fixture_ref.h"
#include "testutil.h"

static dj_engine_t *new_engine(uint32_t max_step) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    dj_vmu_config_default(&ec.vmu, (size_t)64 << 20);
    ec.vmu.page_bytes = 4096;
    ec.max_step_tokens = max_step;
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    return e;
}

static bool same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

static void check_model(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    ref r;
    memset(&r, 0, sizeof r);
    CHECK_MSG(load_ref(dir, &r) == 0, "%s: no reference", name);
    dj_engine_t *e = new_engine(64);
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    if (!m || r.n_prompt < 4) {
        dj_model_release(e, m);
        dj_engine_free(e);
        ref_free(&r);
        return;
    }
    const dj_model_config *c = dj_model_get_config(m);
    const uint32_t L = c->n_layers, d = c->hidden_size, V = c->vocab_size, n = (uint32_t)r.n_prompt;
    const size_t nd = (size_t)n * d;
    const int32_t more[3] = {r.prompt[1], r.prompt[0], r.prompt[2]}; /* a second step */
    float *plain = malloc(V * sizeof(float)), *plain2 = malloc(V * sizeof(float)), *lg = malloc(V * sizeof(float));
    float *val = malloc(3 * nd * sizeof(float)), *ref_save = malloc(4 * nd * sizeof(float));
    float *bias = malloc(d * sizeof(float));
    for (uint32_t i = 0; i < d; i++) bias[i] = (float)((int)(i % 7) - 3) * 0.0625f;

    /* the reference: the steps without breakpoints, and a trace's saves */
    dj_session_t *s0 = NULL, *sr = NULL;
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s0));
    CHECK_OK(dj_session_step(e, s0, r.prompt, n, plain));
    CHECK_OK(dj_session_step(e, s0, more, 3, plain2));
    const dj_point mid = {DJ_POINT_LAYER_OUTPUT, L / 2}, att0 = {DJ_POINT_ATTN_OUTPUT, 0};
    const dj_point fin = {DJ_POINT_FINAL_NORM, 0}, attm = {DJ_POINT_ATTN_OUTPUT, L / 2};
    {
        dj_intervention sv[4] = {{.point = mid, .op = DJ_IV_SAVE, .out = ref_save},
                                 {.point = att0, .op = DJ_IV_SAVE, .out = ref_save + nd},
                                 {.point = fin, .op = DJ_IV_SAVE, .out = ref_save + 2 * nd},
                                 {.point = attm, .op = DJ_IV_SAVE, .out = ref_save + 3 * nd}};
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &sr));
        CHECK_OK(dj_session_step_trace(e, sr, r.prompt, n, sv, 4, lg));
        CHECK(same(lg, plain, V));
        dj_session_free(e, sr);
    }

    /* one breakpoint; another session steps while it is paused; resumed
     * untouched: the same logits and the same KV (the next step's logits) */
    {
        dj_session_t *s1 = NULL, *other = NULL;
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s1));
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &other));
        /* mid-layer: the residual stream beside the point is held too */
        dj_intervention iv[1] = {{.point = attm, .op = DJ_IV_BREAK, .out = val}};
        dj_step_brk_t *b = NULL;
        CHECK_OK(dj_session_step_break(e, s1, r.prompt, n, iv, 1, lg, &b));
        CHECK_MSG(b != NULL, "%s: the step did not stop", name);
        CHECK(dj_step_brk_at(b) == 0);
        CHECK(dj_session_pos(s1) == 0);
        CHECK_MSG(same(val, ref_save + 3 * nd, nd), "%s: the breakpoint's value is not the saved point's", name);
        dj_step_brk_stats bs;
        dj_step_brk_info(b, &bs);
        CHECK(bs.held_bytes >= nd * 2 * 2 && bs.live >= 2);
        /* the activation stack goes to another session's steps */
        int32_t *other_ids = malloc(n * sizeof *other_ids); /* the same plan, other values */
        for (uint32_t i = 0; i < n; i++) other_ids[i] = r.prompt[n - 1 - i];
        CHECK_OK(dj_session_step(e, other, other_ids, n, NULL));
        CHECK_OK(dj_session_step(e, other, other_ids, 1, NULL));
        free(other_ids);
        memset(lg, 0, V * sizeof(float));
        CHECK_OK(dj_step_brk_resume(e, &b, lg, NULL));
        CHECK(b == NULL);
        CHECK_MSG(same(lg, plain, V), "%s: the resumed step's logits differ from the plain step's", name);
        CHECK(dj_session_pos(s1) == n);
        CHECK_OK(dj_session_step(e, s1, more, 3, lg));
        CHECK_MSG(same(lg, plain2, V), "%s: the KV after a resumed step differs", name);
        dj_session_free(e, s1);
        dj_session_free(e, other);
    }

    /* two breakpoints, saves after them at the same point and elsewhere */
    {
        dj_session_t *s1 = NULL;
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s1));
        float *sv = malloc(2 * nd * sizeof(float));
        dj_intervention iv[4] = {{.point = fin, .op = DJ_IV_BREAK, .out = val + nd},
                                 {.point = att0, .op = DJ_IV_BREAK, .out = val},
                                 {.point = att0, .op = DJ_IV_SAVE, .out = sv},
                                 {.point = mid, .op = DJ_IV_SAVE, .out = sv + nd}};
        dj_step_brk_t *b = NULL;
        CHECK_OK(dj_session_step_break(e, s1, r.prompt, n, iv, 4, lg, &b));
        CHECK(b && dj_step_brk_at(b) == 1); /* attn.output of layer 0 comes first */
        CHECK(same(val, ref_save + nd, nd));
        CHECK_OK(dj_step_brk_resume(e, &b, lg, NULL));
        CHECK(b && dj_step_brk_at(b) == 0);
        CHECK(same(val + nd, ref_save + 2 * nd, nd));
        CHECK(same(sv, ref_save + nd, nd) && same(sv + nd, ref_save, nd));
        CHECK_OK(dj_step_brk_resume(e, &b, lg, NULL));
        CHECK(b == NULL && same(lg, plain, V));
        dj_session_free(e, s1);
        free(sv);
    }

    /* an edit at a breakpoint (the value changed in place) equals a trace's add */
    {
        dj_session_t *s1 = NULL, *s2 = NULL;
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s1));
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s2));
        float *lg2 = malloc(V * sizeof(float));
        dj_intervention add[1] = {{.point = mid, .op = DJ_IV_ADD, .data = bias, .rows = 1}};
        CHECK_OK(dj_session_step_trace(e, s2, r.prompt, n, add, 1, lg2));
        CHECK(!same(lg2, plain, V));
        dj_intervention iv[1] = {{.point = mid, .op = DJ_IV_BREAK, .out = val}};
        dj_step_brk_t *b = NULL;
        CHECK_OK(dj_session_step_break(e, s1, r.prompt, n, iv, 1, lg, &b));
        CHECK(b != NULL);
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t i = 0; i < d; i++) val[(size_t)t * d + i] += bias[i];
        CHECK_OK(dj_step_brk_resume(e, &b, lg, NULL));
        CHECK_MSG(same(lg, lg2, V), "%s: an edit at a breakpoint differs from the trace's add", name);
        dj_session_free(e, s1);
        dj_session_free(e, s2);
        free(lg2);
    }

    /* cancelled: the session is as it was (position, pages, next logits) */
    {
        dj_session_t *s1 = NULL;
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s1));
        CHECK_OK(dj_session_step(e, s1, r.prompt, n, NULL));
        const uint32_t pages = dj_session_kv_pages(s1);
        const uint32_t k = DJ_FIXTURE_CTX - n - 3 < 32 ? DJ_FIXTURE_CTX - n - 3 : 32; /* room for `more` after */
        int32_t junk[32];
        for (uint32_t i = 0; i < k; i++) junk[i] = r.prompt[i % n];
        dj_intervention iv[1] = {{.point = att0, .op = DJ_IV_BREAK, .out = val}};
        float *big = malloc((size_t)k * d * sizeof(float));
        iv[0].out = big;
        dj_step_brk_t *b = NULL;
        CHECK_OK(dj_session_step_break(e, s1, junk, k, iv, 1, NULL, &b));
        CHECK(b != NULL && dj_session_pos(s1) == n);
        CHECK(dj_session_kv_pages(s1) > pages); /* the paused step's rows are mapped */
        dj_step_brk_cancel(e, b);
        CHECK_MSG(dj_session_pos(s1) == n && dj_session_kv_pages(s1) == pages, "%s: cancel left %u pages (had %u)",
                  name, dj_session_kv_pages(s1), pages);
        CHECK_OK(dj_session_step(e, s1, more, 3, lg));
        CHECK_MSG(same(lg, plain2, V), "%s: a cancelled step changed the session", name);
        dj_session_free(e, s1);
        free(big);
    }

    /* a region edit (scale the last 2 positions' units [2, 6) by 0.5) equals a
     * whole replace of the edited tensor, and regions outside are refused */
    {
        dj_session_t *s1 = NULL, *s2 = NULL;
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s1));
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s2));
        float *x = malloc(nd * sizeof(float)), *lg2 = malloc(V * sizeof(float)), half[4] = {0.5f, 0.5f, 0.5f, 0.5f};
        memcpy(x, ref_save, nd * sizeof(float));
        for (uint32_t t = n - 2; t < n; t++)
            for (uint32_t i = 2; i < 6; i++) x[(size_t)t * d + i] *= 0.5f;
        dj_intervention mul[1] = {{.point = mid, .op = DJ_IV_MUL, .data = half, .rows = 1, .r0 = n - 2, .r1 = n,
                                   .c0 = 2, .c1 = 6}};
        dj_intervention rep[1] = {{.point = mid, .op = DJ_IV_REPLACE, .data = x, .rows = n}};
        CHECK_OK(dj_session_step_trace(e, s1, r.prompt, n, mul, 1, lg));
        CHECK_OK(dj_session_step_trace(e, s2, r.prompt, n, rep, 1, lg2));
        CHECK_MSG(same(lg, lg2, V), "%s: a region edit differs from its whole replace", name);
        CHECK_MSG(!same(lg, plain, V), "%s: a region edit changed nothing", name);
        mul[0].r1 = n + 1;
        CHECK(dj_session_step_trace(e, s1, r.prompt, n, mul, 1, lg) == DJ_ERANGE);
        mul[0].r1 = n;
        mul[0].c0 = 6;
        CHECK(dj_session_step_trace(e, s1, r.prompt, n, mul, 1, lg) == DJ_ERANGE);
        mul[0].c0 = 2;
        mul[0].rows = 3; /* neither 1 nor the region's 2 rows */
        CHECK(dj_session_step_trace(e, s1, r.prompt, n, mul, 1, lg) == DJ_EINVAL);
        CHECK(dj_session_pos(s1) == n);
        dj_session_free(e, s1);
        dj_session_free(e, s2);
        free(x);
        free(lg2);
    }

    /* refused before anything runs */
    {
        dj_session_t *s1 = NULL;
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s1));
        dj_step_brk_t *b = NULL;
        const dj_point alias = {DJ_POINT_LAYER_INPUT, L / 2 + 1};
        dj_intervention two[2] = {{.point = mid, .op = DJ_IV_BREAK, .out = val},
                                  {.point = alias, .op = DJ_IV_BREAK, .out = val + nd}};
        if (L / 2 + 1 < L) {
            CHECK(dj_session_step_break(e, s1, r.prompt, n, two, 2, lg, &b) == DJ_EINVAL && !b);
        }
        dj_intervention nul[1] = {{.point = mid, .op = DJ_IV_BREAK, .out = NULL}};
        CHECK(dj_session_step_break(e, s1, r.prompt, n, nul, 1, lg, &b) == DJ_EINVAL && !b);
        CHECK(dj_session_step_trace(e, s1, r.prompt, n, two, 1, lg) == DJ_EINVAL);
        const dj_point far = {DJ_POINT_LAYER_OUTPUT, L};
        dj_intervention out[1] = {{.point = far, .op = DJ_IV_BREAK, .out = val}};
        CHECK(dj_session_step_break(e, s1, r.prompt, n, out, 1, lg, &b) == DJ_ERANGE && !b);
        CHECK(dj_session_pos(s1) == 0 && dj_session_kv_pages(s1) == 0);
        /* no BREAK at all: it runs to its end */
        dj_intervention sv[1] = {{.point = mid, .op = DJ_IV_SAVE, .out = val}};
        CHECK_OK(dj_session_step_break(e, s1, r.prompt, n, sv, 1, lg, &b));
        CHECK(!b && same(lg, plain, V) && same(val, ref_save, nd) && dj_session_pos(s1) == n);
        dj_session_free(e, s1);
    }

    dj_session_free(e, s0);
    free(plain);
    free(plain2);
    free(lg);
    free(val);
    free(ref_save);
    free(bias);
    dj_model_release(e, m);
    dj_engine_free(e);
    ref_free(&r);
}

int main(void) {
    for (int i = 0; i < DJ_N_FIXTURES; i++) check_model(DJ_FIXTURE_NAMES[i]);
    return dj_test_finish("test_brk");
}
