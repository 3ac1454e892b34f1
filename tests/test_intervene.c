/* test_intervene.c: steps with interventions (dj_session_step_trace) on every
 * fixture model - saving changes no logit, one point under two names holds
 * the same bytes, neutral edits are neutral and real ones change the step and
 * the KV after it, the decode path agrees with the prefill path - and every
 * bad point, tensor or count is refused with the position unchanged. (The
 * values against a torch forward: python/tests/test_trace.py.) */
#include <math.h>
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

static void check_parse(void) {
    static const struct {
        const char *name;
        dj_status st;
        dj_point_kind kind;
        uint32_t layer;
    } cases[] = {
        {"layers.0.input", DJ_OK, DJ_POINT_LAYER_INPUT, 0},
        {"layers.1.attn.output", DJ_OK, DJ_POINT_ATTN_OUTPUT, 1},
        {"layers.1.mlp.output", DJ_OK, DJ_POINT_MLP_OUTPUT, 1},
        {"layers.1.output", DJ_OK, DJ_POINT_LAYER_OUTPUT, 1},
        {"final_norm.output", DJ_OK, DJ_POINT_FINAL_NORM, 0},
        {"layers.2.output", DJ_ERANGE, 0, 0},
        {"layers.99999999999.output", DJ_EINVAL, 0, 0},
        {"layers.4294967296.output", DJ_ERANGE, 0, 0}, /* a number, too large */
        {"layers.01.output", DJ_EINVAL, 0, 0},
        {"layers.-1.output", DJ_EINVAL, 0, 0},
        {"layers..output", DJ_EINVAL, 0, 0},
        {"layers.1", DJ_EINVAL, 0, 0},
        {"layers.1.output.", DJ_EINVAL, 0, 0},
        {"layers.1.attn", DJ_EINVAL, 0, 0},
        {"final_norm.outputs", DJ_EINVAL, 0, 0},
        {"final_norm", DJ_EINVAL, 0, 0},
        {"", DJ_EINVAL, 0, 0},
        {"embed", DJ_EINVAL, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dj_point p = {DJ_POINT_FINAL_NORM, 77};
        const dj_status st = dj_point_parse(cases[i].name, strlen(cases[i].name), 2, &p);
        CHECK_MSG(st == cases[i].st, "'%s': %s (%s)", cases[i].name, dj_status_name(st), dj_last_error());
        if (st == DJ_OK && cases[i].st == DJ_OK) {
            CHECK(p.kind == cases[i].kind && p.layer == cases[i].layer);
            char buf[48];
            CHECK_MSG(!strcmp(dj_point_name(p, buf, sizeof buf), cases[i].name), "%s -> %s", cases[i].name, buf);
        }
    }
    /* not NUL-terminated: only len bytes are read */
    dj_point p;
    CHECK_OK(dj_point_parse("layers.1.outputXYZ", 15, 2, &p));
    CHECK(p.kind == DJ_POINT_LAYER_OUTPUT && p.layer == 1);
}

static bool same(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof *a) == 0; }

/* Every check on one model. */
static void check_model(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    ref r;
    memset(&r, 0, sizeof r);
    CHECK_MSG(load_ref(dir, &r) == 0, "%s: no reference", name);
    dj_engine_t *e = new_engine(64);
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    if (!m || !r.last) {
        dj_model_release(e, m);
        dj_engine_free(e);
        ref_free(&r);
        return;
    }
    const dj_model_config *c = dj_model_get_config(m);
    const uint32_t L = c->n_layers, d = c->hidden_size, V = c->vocab_size, n = (uint32_t)r.n_prompt;
    const uint32_t n_pts = 4 * L + 1;
    float *plain = malloc(V * sizeof(float)), *lg = malloc(V * sizeof(float)), *lg2 = malloc(V * sizeof(float));
    float *saved = calloc((size_t)n_pts * n * d, sizeof(float));
    dj_intervention *iv = calloc(n_pts + 2, sizeof *iv);

    dj_session_t *s0 = NULL, *s1 = NULL;
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s0));
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s1));
    CHECK_OK(dj_session_step(e, s0, r.prompt, n, plain));

    /* every point saved: the same logits, bit for bit */
    for (uint32_t k = 0; k < n_pts; k++) {
        iv[k].point = k == 4 * L ? (dj_point){DJ_POINT_FINAL_NORM, 0} : (dj_point){(dj_point_kind)(k % 4), k / 4};
        iv[k].op = DJ_IV_SAVE;
        iv[k].out = saved + (size_t)k * n * d;
    }
    CHECK_OK(dj_session_step_trace(e, s1, r.prompt, n, iv, n_pts, lg));
    CHECK_MSG(same(lg, plain, V), "%s: saving changed the logits", name);
    CHECK(dj_session_pos(s1) == n);
    for (uint32_t l = 1; l < L; l++) /* layers.{l}.input is layers.{l-1}.output */
        CHECK(same(saved + (size_t)(4 * l) * n * d, saved + (size_t)(4 * (l - 1) + 3) * n * d, (size_t)n * d));
    for (uint32_t k = 0; k < n_pts; k++) {
        bool finite = true, nonzero = false;
        for (size_t i = 0; i < (size_t)n * d; i++) {
            finite &= isfinite(iv[k].out[i]) != 0;
            nonzero |= iv[k].out[i] != 0.0f;
        }
        char nm[48];
        CHECK_MSG(finite && nonzero, "%s: point %s saved %s", name, dj_point_name(iv[k].point, nm, sizeof nm),
                  finite ? "zeros" : "non-finite values");
    }

    /* a point with only saves goes by a device copy, one with an edit through
     * the host: both give the same bytes, a save listed before the edit the
     * value before it, and two saves of one point the same */
    {
        float *zeros0 = calloc(d, sizeof(float)), *a = malloc((size_t)4 * n * d * sizeof(float));
        float *bias = malloc((size_t)d * sizeof(float));
        for (uint32_t i = 0; i < d; i++) bias[i] = (float)((int)(i % 5) - 2) * 0.125f;
        const dj_point p = {DJ_POINT_ATTN_OUTPUT, L / 2}, q = {DJ_POINT_LAYER_OUTPUT, L - 1};
        const size_t nd = (size_t)n * d;
        dj_intervention mix[6] = {
            {.point = q, .op = DJ_IV_SAVE, .out = a},                     /* a copy */
            {.point = p, .op = DJ_IV_SAVE, .out = a + nd},                /* through the host: */
            {.point = p, .op = DJ_IV_ADD, .data = zeros0, .rows = 1},     /* the edit */
            {.point = q, .op = DJ_IV_SAVE, .out = a + 2 * nd},            /* the copy's second save */
            {.point = p, .op = DJ_IV_SAVE, .out = a + 3 * nd},            /* after the edit */
        };
        dj_session_t *sm = NULL;
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &sm));
        CHECK_OK(dj_session_step_trace(e, sm, r.prompt, n, mix, 5, lg));
        CHECK_MSG(same(lg, plain, V), "%s: saves beside a neutral edit changed the logits", name);
        const size_t kq = 4 * (L - 1) + 3, kp = 4 * (L / 2) + 1; /* their slots in `saved` */
        CHECK_MSG(same(a, saved + kq * nd, nd) && same(a + 2 * nd, a, nd), "%s: a copied save differs", name);
        CHECK_MSG(same(a + nd, saved + kp * nd, nd) && same(a + 3 * nd, a + nd, nd),
                  "%s: a save through the host differs from the copied one", name);
        dj_session_free(e, sm);
        mix[2].data = bias; /* a real edit: the save before it sees the value before */
        CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &sm));
        CHECK_OK(dj_session_step_trace(e, sm, r.prompt, n, mix, 5, lg));
        CHECK(same(a + nd, saved + kp * nd, nd));
        bool added = true;
        for (size_t i = 0; i < nd; i++) added &= a[3 * nd + i] == a[nd + i] + bias[i % d];
        CHECK_MSG(added, "%s: the save after an add does not see the sum", name);
        CHECK_MSG(!same(a, saved + kq * nd, nd), "%s: the edit did not reach the last layer", name);
        dj_session_free(e, sm);
        free(zeros0);
        free(bias);
        free(a);
    }

    /* the decode path: one more token, traced and plain, in both sessions */
    const int32_t next = r.greedy[0];
    float *row = malloc((size_t)d * sizeof(float)), *row_prefill = malloc((size_t)(n + 1) * d * sizeof(float));
    dj_intervention one = {.point = {DJ_POINT_LAYER_OUTPUT, L - 1}, .op = DJ_IV_SAVE, .out = row};
    CHECK_OK(dj_session_step(e, s0, &next, 1, plain));
    CHECK_OK(dj_session_step_trace(e, s1, &next, 1, &one, 1, lg));
    CHECK_MSG(same(lg, plain, V), "%s: a saving decode step changed the logits", name);
    dj_session_t *s2 = NULL;
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s2));
    int32_t ids[65];
    memcpy(ids, r.prompt, n * sizeof *ids);
    ids[n] = next;
    dj_intervention all = {.point = {DJ_POINT_LAYER_OUTPUT, L - 1}, .op = DJ_IV_SAVE, .out = row_prefill};
    CHECK_OK(dj_session_step_trace(e, s2, ids, n + 1, &all, 1, NULL));
    const double err = rel_err(row, row_prefill + (size_t)n * d, (int)d);
    CHECK_MSG(err < 1e-4, "%s: the decode step's last layer output differs from the prefill's by %.3g", name, err);
    dj_session_free(e, s2);

    /* neutral edits are neutral: adding zeros, writing back what was there */
    float *zeros = calloc(d, sizeof(float));
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s2));
    iv[0] = (dj_intervention){.point = {DJ_POINT_LAYER_OUTPUT, 0}, .op = DJ_IV_ADD, .data = zeros, .rows = 1};
    iv[1] = (dj_intervention){.point = {DJ_POINT_MLP_OUTPUT, L - 1},
                              .op = DJ_IV_REPLACE,
                              .data = saved + (size_t)(4 * (L - 1) + 2) * n * d,
                              .rows = n};
    CHECK_OK(dj_session_step_trace(e, s2, r.prompt, n, iv, 2, lg));
    CHECK_MSG(rel_err(lg, r.last, (int)V) <= 1e-4, "%s: neutral edits moved the logits", name);

    /* a real edit changes the step and the KV: the next plain step differs
     * from an unedited session's, and equals a session edited the same way */
    float *steer = malloc((size_t)d * sizeof(float));
    for (uint32_t i = 0; i < d; i++) steer[i] = (float)((int)(i % 7) - 3) * 0.5f;
    dj_session_t *a = NULL, *b = NULL;
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &a));
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &b));
    iv[0] = (dj_intervention){.point = {DJ_POINT_LAYER_INPUT, 0}, .op = DJ_IV_ADD, .data = steer, .rows = 1};
    CHECK_OK(dj_session_step_trace(e, a, r.prompt, n, iv, 1, lg));
    CHECK_MSG(rel_err(lg, r.last, (int)V) > 1e-3, "%s: steering the embedding changed nothing", name);
    CHECK_OK(dj_session_step_trace(e, b, r.prompt, n, iv, 1, lg2));
    CHECK(same(lg, lg2, V));
    CHECK_OK(dj_session_step(e, a, &next, 1, lg));
    CHECK_OK(dj_session_step(e, b, &next, 1, lg2));
    CHECK(same(lg, lg2, V));
    CHECK_MSG(rel_err(lg, r.last, (int)V) > 1e-3 && !same(lg, plain, V), "%s: the KV kept no trace of the edit", name);
    dj_session_free(e, a);
    dj_session_free(e, b);

    /* bad requests: refused before anything runs */
    const uint32_t pos = dj_session_pos(s2);
    dj_intervention bad = {.point = {DJ_POINT_LAYER_OUTPUT, L}, .op = DJ_IV_SAVE, .out = row};
    CHECK_ST(dj_session_step_trace(e, s2, &next, 1, &bad, 1, NULL), DJ_ERANGE);
    bad = (dj_intervention){.point = {(dj_point_kind)9, 0}, .op = DJ_IV_SAVE, .out = row};
    CHECK_ST(dj_session_step_trace(e, s2, &next, 1, &bad, 1, NULL), DJ_EINVAL);
    bad = (dj_intervention){.point = {DJ_POINT_FINAL_NORM, 0}, .op = DJ_IV_SAVE, .out = NULL};
    CHECK_ST(dj_session_step_trace(e, s2, &next, 1, &bad, 1, NULL), DJ_EINVAL);
    bad = (dj_intervention){.point = {DJ_POINT_FINAL_NORM, 0}, .op = DJ_IV_ADD, .data = NULL, .rows = 1};
    CHECK_ST(dj_session_step_trace(e, s2, &next, 1, &bad, 1, NULL), DJ_EINVAL);
    bad = (dj_intervention){.point = {DJ_POINT_FINAL_NORM, 0}, .op = DJ_IV_REPLACE, .data = steer, .rows = 2};
    CHECK_ST(dj_session_step_trace(e, s2, &next, 1, &bad, 1, NULL), DJ_EINVAL);
    bad = (dj_intervention){.point = {DJ_POINT_FINAL_NORM, 0}, .op = (dj_iv_op)7, .out = row};
    CHECK_ST(dj_session_step_trace(e, s2, &next, 1, &bad, 1, NULL), DJ_EINVAL);
    dj_intervention many[DJ_IV_MAX + 1];
    for (int k = 0; k <= DJ_IV_MAX; k++)
        many[k] = (dj_intervention){.point = {DJ_POINT_FINAL_NORM, 0}, .op = DJ_IV_SAVE, .out = row};
    CHECK_ST(dj_session_step_trace(e, s2, &next, 1, many, DJ_IV_MAX + 1, NULL), DJ_EINVAL);
    CHECK_OK(dj_session_step_trace(e, s2, &next, 1, many, DJ_IV_MAX, NULL)); /* 64 at one point: fine */
    CHECK(dj_session_pos(s2) == pos + 1);
    int32_t longer[65] = {0};
    CHECK_ST(dj_session_step_trace(e, s2, longer, 65, many, 1, NULL), DJ_EINVAL); /* past max_step 64 */
    longer[3] = (int32_t)V;
    CHECK_ST(dj_session_step_trace(e, s2, longer, 8, many, 1, NULL), DJ_ERANGE); /* an id outside the vocab */
    CHECK(dj_session_pos(s2) == pos + 1);
    CHECK_ST(dj_session_step_trace(e, s2, NULL, 1, many, 1, NULL), DJ_EINVAL);
    CHECK_ST(dj_session_step_trace(e, s2, &next, 1, NULL, 1, NULL), DJ_EINVAL);
    CHECK_OK(dj_session_step_trace(e, s2, &next, 1, NULL, 0, lg)); /* no interventions: a plain step */

    printf("%s: %u points saved and checked, edits and refusals ok\n", name, n_pts);
    free(steer);
    free(zeros);
    free(row);
    free(row_prefill);
    dj_session_free(e, s0);
    dj_session_free(e, s1);
    dj_session_free(e, s2);
    free(plain);
    free(lg);
    free(lg2);
    free(saved);
    free(iv);
    dj_model_release(e, m);
    dj_engine_free(e);
    ref_free(&r);
}

int main(void) {
    check_parse();
    for (int i = 0; i < DJ_N_FIXTURES; i++) check_model(DJ_FIXTURE_NAMES[i]);
    return dj_test_finish("test_intervene");
}
