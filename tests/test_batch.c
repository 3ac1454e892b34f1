/* test_batch.c: batched decode on the CPU engine - a step of several sessions
 * at different positions gives bit-identical logits to the same single steps,
 * device-side picks (step_sample, batch `next`) match argmax of the logits,
 * seeded sampling is per session, bad batches change nothing, and decode
 * steps carry the short-context class exactly when every row is within it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/engine.h"
#include "djinn/graph.h" /* dj_shape_bucket */
#include "djinn/sampler.h"
#include "fixture_ref.h" /* rel_err */
#include "testutil.h"

#define N_SESS 3

static const char *MODELS[] = {"llama3", "qwen2", "mistral"};

static dj_engine_t *new_engine(void) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    dj_vmu_config_default(&ec.vmu, (size_t)16 << 20);
    ec.vmu.page_bytes = 4096; /* small pages: steps cross page boundaries */
    ec.max_step_tokens = 64;
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    return e;
}

static int32_t rand_id(uint32_t vocab) { return (int32_t)(dj_test_rand() % vocab); }

/* A new engine with the fixture model `name` (a directory under models/)
 * loaded into *m; NULL (a failed check) when either fails. */
static dj_engine_t *engine_with(const char *name, dj_model_t **m) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    dj_engine_t *e = new_engine();
    *m = NULL;
    if (!e || dj_model_load(e, dir, m) != DJ_OK) {
        CHECK_MSG(0, "engine/model for %s: %s", dir, dj_last_error());
        dj_engine_free(e);
        return NULL;
    }
    return e;
}

static void check_model(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    dj_engine_t *e = new_engine();
    if (!e) return;
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    if (!m) {
        dj_engine_free(e);
        return;
    }
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    /* Twin sessions: `b` steps batched, `s` the same tokens one at a time. */
    dj_session_t *b[N_SESS] = {0}, *s[N_SESS] = {0};
    for (int i = 0; i < N_SESS; i++) {
        CHECK_OK(dj_session_new(e, m, 96, 0, &b[i]));
        CHECK_OK(dj_session_new(e, m, 96, 0, &s[i]));
        if (!b[i] || !s[i]) goto done;
        /* Different prompt lengths: the rows sit at different positions. */
        int32_t prompt[40];
        const uint32_t len = 1 + (uint32_t)(dj_test_rand() % 40);
        for (uint32_t t = 0; t < len; t++) prompt[t] = rand_id(V);
        CHECK_OK(dj_session_step(e, b[i], prompt, len, NULL));
        CHECK_OK(dj_session_step(e, s[i], prompt, len, NULL));
    }
    float *lb = malloc((size_t)N_SESS * V * sizeof *lb), *ls = malloc((size_t)V * sizeof *ls);
    double worst = 0;
    for (int step = 0; step < 6; step++) {
        int32_t ids[N_SESS], next[N_SESS];
        for (int i = 0; i < N_SESS; i++) ids[i] = rand_id(V);
        for (size_t i = 0; i < (size_t)N_SESS * V; i++) lb[i] = NAN; /* poisoned */
        CHECK_OK(dj_engine_step_batch(e, b, ids, N_SESS, lb, NULL, next));
        for (int i = 0; i < N_SESS; i++) {
            CHECK_OK(dj_session_step(e, s[i], &ids[i], 1, ls));
            const double err = rel_err(lb + (size_t)i * V, ls, (int)V);
            if (err > worst || err != err) worst = err;
            /* batch-invariant CPU matmul: the same bits, not merely close */
            CHECK_MSG(!memcmp(lb + (size_t)i * V, ls, (size_t)V * sizeof *ls),
                      "%s step %d session %d: batched logits are not bit-identical to single (rel err %.3g)", name,
                      step, i, err);
            CHECK(next[i] == dj_argmax(lb + (size_t)i * V, V));
            CHECK(dj_session_pos(b[i]) == dj_session_pos(s[i]));
        }
    }
    printf("%s: %d sessions, 6 batched steps, worst rel err vs single steps %.2e\n", name, N_SESS, worst);

    /* Greedy pick through step_sample = argmax of the same step's logits. */
    {
        int32_t tok = rand_id(V), picked = -1;
        dj_session_t *one[1] = {b[0]};
        CHECK_OK(dj_session_step(e, s[0], &tok, 1, ls));
        CHECK_OK(dj_session_step_sample(e, b[0], &tok, 1, NULL, &picked));
        CHECK(picked == dj_argmax(ls, V));
        /* a batch of one with logits only */
        tok = picked;
        CHECK_OK(dj_session_step(e, s[0], &tok, 1, ls));
        CHECK_OK(dj_engine_step_batch(e, one, &tok, 1, lb, NULL, NULL));
        CHECK(!memcmp(lb, ls, (size_t)V * sizeof *ls));
    }

    /* Seeded sampling is per session: two sessions with the same history and
     * seed draw the same tokens, whatever else is in the batch. */
    {
        dj_sampler_params sp = {.temperature = 1.5f, .top_k = 0, .top_p = 1.0f, .seed = dj_test_rand()};
        int32_t t1[8], t2[8], ids[N_SESS], next[N_SESS];
        dj_session_t *x = NULL, *y = NULL;
        CHECK_OK(dj_session_new(e, m, 32, 0, &x));
        CHECK_OK(dj_session_new(e, m, 32, 0, &y));
        if (x && y) {
            int32_t tok = rand_id(V);
            for (int k = 0; k < 8; k++) {
                CHECK_OK(dj_session_step_sample(e, x, k ? &t1[k - 1] : &tok, 1, &sp, &t1[k]));
                dj_session_t *pair[2] = {y, b[1]};
                ids[0] = k ? t2[k - 1] : tok;
                ids[1] = rand_id(V);
                CHECK_OK(dj_engine_step_batch(e, pair, ids, 2, NULL, &sp, next));
                t2[k] = next[0];
            }
            CHECK(memcmp(t1, t2, sizeof t1) == 0);
        }
        dj_session_free(e, x);
        dj_session_free(e, y);
        dj_sampler_params bad = sp;
        bad.top_p = 0.0f;
        int32_t tok = 0, out = 0;
        CHECK_ST(dj_session_step_sample(e, b[0], &tok, 1, &bad, &out), DJ_EINVAL);
    }

    /* Bad batches: nothing moves. */
    {
        uint32_t pos[N_SESS];
        for (int i = 0; i < N_SESS; i++) pos[i] = dj_session_pos(b[i]);
        int32_t ids[N_SESS] = {0, 0, 0};
        dj_session_t *dup[N_SESS] = {b[0], b[1], b[0]};
        CHECK_ST(dj_engine_step_batch(e, dup, ids, N_SESS, NULL, NULL, NULL), DJ_EINVAL);
        ids[1] = (int32_t)V;
        CHECK_ST(dj_engine_step_batch(e, b, ids, N_SESS, NULL, NULL, NULL), DJ_ERANGE);
        ids[1] = -1;
        CHECK_ST(dj_engine_step_batch(e, b, ids, N_SESS, NULL, NULL, NULL), DJ_ERANGE);
        CHECK_ST(dj_engine_step_batch(e, b, ids, 0, NULL, NULL, NULL), DJ_EINVAL);
        dj_session_t *full = NULL;
        CHECK_OK(dj_session_new(e, m, 1, 0, &full));
        if (full) {
            int32_t z = 0;
            CHECK_OK(dj_session_step(e, full, &z, 1, NULL));
            dj_session_t *mix[2] = {b[0], full};
            int32_t two[2] = {0, 0};
            CHECK_ST(dj_engine_step_batch(e, mix, two, 2, NULL, NULL, NULL), DJ_ERANGE);
        }
        dj_session_free(e, full);
        for (int i = 0; i < N_SESS; i++) CHECK(dj_session_pos(b[i]) == pos[i]);
    }
    free(lb);
    free(ls);
done:
    for (int i = 0; i < N_SESS; i++) {
        dj_session_free(e, b[i]);
        dj_session_free(e, s[i]);
    }
    dj_model_release(e, m);
    dj_engine_free(e);
}

/* Sessions of two models cannot share a step. */
static void check_two_models(void) {
    char d1[512], d2[512];
    snprintf(d1, sizeof d1, "%s/models/llama3", DJ_FIXTURES);
    snprintf(d2, sizeof d2, "%s/models/tinyllama", DJ_FIXTURES);
    dj_engine_t *e = new_engine();
    if (!e) return;
    dj_model_t *m1 = NULL, *m2 = NULL;
    CHECK_OK(dj_model_load(e, d1, &m1));
    CHECK_OK(dj_model_load(e, d2, &m2));
    dj_session_t *s1 = NULL, *s2 = NULL;
    if (m1 && m2) {
        CHECK_OK(dj_session_new(e, m1, 16, 0, &s1));
        CHECK_OK(dj_session_new(e, m2, 16, 0, &s2));
        dj_session_t *both[2] = {s1, s2};
        int32_t ids[2] = {1, 1};
        CHECK_ST(dj_engine_step_batch(e, both, ids, 2, NULL, NULL, NULL), DJ_EINVAL);
        CHECK(dj_session_pos(s1) == 0 && dj_session_pos(s2) == 0);
    }
    dj_session_free(e, s1);
    dj_session_free(e, s2);
    dj_model_release(e, m1);
    dj_model_release(e, m2);
    dj_engine_free(e);
}

/* Seeded sampling through the backend's sample hook ($DJINN_DEVICE_SAMPLING=on;
 * on the CPU the hook is the host rule itself) picks exactly what the host
 * samplers pick: the same draws, single steps and batched steps alike. */
static void generate(const char *dir, int device_sampling, int32_t out[N_SESS][12]) {
    setenv("DJINN_DEVICE_SAMPLING", device_sampling ? "on" : "off", 1); /* unset is the default, on */
    dj_engine_t *e = new_engine();
    dj_model_t *m = NULL;
    if (!e || dj_model_load(e, dir, &m) != DJ_OK) {
        CHECK_MSG(0, "engine/model for %s: %s", dir, dj_last_error());
        dj_engine_free(e);
        return;
    }
    dj_session_t *ss[N_SESS] = {0};
    int32_t ids[N_SESS];
    for (int i = 0; i < N_SESS; i++) {
        const dj_sampler_params sp = {.temperature = 0.9f, .top_k = (uint32_t)(i == 1 ? 0 : 20),
                                      .top_p = i == 2 ? 1.f : 0.9f, .seed = 100u + (uint64_t)i};
        const int32_t prompt[3] = {1 + i, 2, 3};
        CHECK_OK(dj_session_new(e, m, 64, 0, &ss[i]));
        if (!ss[i]) goto done;
        CHECK_OK(dj_session_step_sample(e, ss[i], prompt, 3, &sp, &ids[i]));
        out[i][0] = ids[i];
        for (int t = 1; t < 6; t++) { /* single steps, each with its own params */
            CHECK_OK(dj_session_step_sample(e, ss[i], &ids[i], 1, &sp, &ids[i]));
            out[i][t] = ids[i];
        }
    }
    const dj_sampler_params shared = {.temperature = 1.3f, .top_k = 7, .top_p = 0.95f, .seed = 5};
    for (int t = 6; t < 12; t++) { /* batched steps: one params for the batch, each session's own draws */
        int32_t next[N_SESS];
        CHECK_OK(dj_engine_step_batch(e, ss, ids, N_SESS, NULL, &shared, next));
        for (int i = 0; i < N_SESS; i++) out[i][t] = ids[i] = next[i];
    }
done:
    for (int i = 0; i < N_SESS; i++) dj_session_free(e, ss[i]);
    dj_engine_free(e);
}

static void check_sample_hook(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, "llama3");
    int32_t host[N_SESS][12], hook[N_SESS][12];
    memset(host, 0xff, sizeof host);
    memset(hook, 0xfe, sizeof hook);
    generate(dir, 0, host);
    generate(dir, 1, hook);
    unsetenv("DJINN_DEVICE_SAMPLING");
    CHECK_MSG(memcmp(host, hook, sizeof host) == 0, "sample hook picks differ from the host samplers'");
    int varied = 0; /* the draws are not all the argmax's */
    for (int i = 0; i < N_SESS; i++)
        for (int t = 1; t < 12; t++) varied |= host[i][t] != host[i][0];
    CHECK(varied);
}

/* A rule with a field a dj_sample_row has no place for (top_a) is picked on
 * the host even with the sample hook on (dj_sample_row_carries): the same
 * tokens as without the hook, which would drop top_a; and top_a changes them. */
static void gen_rule(const char *dir, int device_sampling, const dj_sampler_params *sp, int32_t out[12]) {
    setenv("DJINN_DEVICE_SAMPLING", device_sampling ? "on" : "off", 1); /* unset is the default, on */
    dj_engine_t *e = new_engine();
    dj_model_t *m = NULL;
    dj_session_t *s = NULL;
    if (!e || dj_model_load(e, dir, &m) != DJ_OK || dj_session_new(e, m, 64, 0, &s) != DJ_OK) {
        CHECK_MSG(0, "engine/model/session for %s: %s", dir, dj_last_error());
    } else {
        const int32_t prompt[3] = {4, 2, 3};
        int32_t id = -1;
        CHECK_OK(dj_session_step_sample(e, s, prompt, 3, sp, &id));
        out[0] = id;
        for (int t = 1; t < 12; t++) {
            CHECK_OK(dj_session_step_sample(e, s, &id, 1, sp, &id));
            out[t] = id;
        }
    }
    dj_session_free(e, s);
    dj_engine_free(e);
    unsetenv("DJINN_DEVICE_SAMPLING");
}

static void check_hook_gate(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, "llama3");
    const dj_sampler_params plain = {.temperature = 1.0f, .top_p = 1.f, .seed = 9};
    dj_sampler_params with_a = plain;
    with_a.top_a = 1.0f;
    int32_t host[12], hook[12], none[12];
    memset(host, 0xff, sizeof host);
    memset(hook, 0xfe, sizeof hook);
    memset(none, 0xfd, sizeof none);
    gen_rule(dir, 0, &with_a, host);
    gen_rule(dir, 1, &with_a, hook);
    gen_rule(dir, 0, &plain, none);
    CHECK_MSG(memcmp(host, hook, sizeof host) == 0, "top_a with the sample hook on picks differently from the host");
    CHECK_MSG(memcmp(host, none, sizeof host) != 0, "top_a 1 changed no pick of 12: the check above proves nothing");
}

/* Masked and biased rows (structured output's mask, logit_bias): through
 * the backend's mask hook with the sample hook on, on the host with it off -
 * either way what twin samplers pick on the host from the raw logits. */
static void check_masked_rows(int device_sampling) {
    setenv("DJINN_DEVICE_SAMPLING", device_sampling ? "on" : "off", 1);
    dj_model_t *m = NULL;
    dj_engine_t *e = engine_with("qwen2", &m);
    if (!e) return;
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    const dj_sampler_params ps[N_SESS] = {{.temperature = 0.f, .top_p = 1.f},
                                          {.temperature = 0.7f, .top_k = 10, .top_p = 1.f, .seed = 3},
                                          {.temperature = 1.2f, .top_k = 0, .top_p = 0.8f, .seed = 4}};
    const dj_logit_bias b0[] = {{11, 5.f}, {12, -100.f}}, b1[] = {{4, -100.f}, {20, 3.f}, {21, 2.5f}};
    const dj_logit_bias *bias[N_SESS] = {b0, b1, NULL};
    const size_t n_bias[N_SESS] = {2, 3, 0};
    uint8_t *allowed = malloc(V);
    for (uint32_t i = 0; allowed && i < V; i++) allowed[i] = i % 3 != 0;
    dj_session_t *a[N_SESS] = {0}, *b[N_SESS] = {0};
    dj_sampler_t *sa[N_SESS] = {0}, *sb[N_SESS] = {0};
    int32_t ids[N_SESS];
    float *lg = malloc((size_t)N_SESS * V * sizeof *lg);
    for (int i = 0; i < N_SESS && allowed && lg; i++) {
        CHECK_OK(dj_session_new(e, m, 64, 0, &a[i]));
        CHECK_OK(dj_session_new(e, m, 64, 0, &b[i]));
        CHECK_OK(dj_sampler_new(&ps[i], V, &sa[i]));
        CHECK_OK(dj_sampler_new(&ps[i], V, &sb[i]));
        if (!a[i] || !b[i] || !sa[i] || !sb[i]) goto done;
        for (dj_sampler_t *s2 = sa[i];; s2 = sb[i]) { /* rows 0 and 2 masked, rows 0 and 1 biased */
            if (i != 1) CHECK_OK(dj_sampler_set_allowed(s2, allowed));
            CHECK_OK(dj_sampler_set_bias(s2, bias[i], n_bias[i]));
            if (s2 == sb[i]) break;
        }
        const int32_t prompt[2] = {5 + i, 9};
        CHECK_OK(dj_session_step(e, a[i], prompt, 2, NULL));
        CHECK_OK(dj_session_step(e, b[i], prompt, 2, NULL));
        ids[i] = 7 * i + 1;
    }
    int same = 1, in_mask = 1;
    for (int t = 0; t < 10 && allowed && lg && a[N_SESS - 1]; t++) {
        int32_t next[N_SESS];
        CHECK_OK(dj_engine_step_batch_samplers(e, a, NULL, ids, N_SESS, sa, next));
        CHECK_OK(dj_engine_step_batch(e, b, ids, N_SESS, lg, NULL, NULL));
        for (int i = 0; i < N_SESS; i++) {
            same &= next[i] == dj_sampler_sample(sb[i], lg + (size_t)i * V);
            in_mask &= i == 1 || (next[i] >= 0 && allowed[next[i]]);
            in_mask &= next[i] != 12 && next[i] != 4; /* banned by -100 */
            ids[i] = next[i];
        }
    }
    CHECK_MSG(same, "masked rows (sample hook %s) pick differently from the host samplers",
              device_sampling ? "on" : "off");
    CHECK_MSG(in_mask, "a masked row picked outside its mask, or a banned id (sample hook %s)",
              device_sampling ? "on" : "off");
done:
    for (int i = 0; i < N_SESS; i++) {
        dj_sampler_free(sa[i]);
        dj_sampler_free(sb[i]);
        dj_session_free(e, a[i]);
        dj_session_free(e, b[i]);
    }
    free(lg);
    free(allowed);
    dj_engine_free(e);
    unsetenv("DJINN_DEVICE_SAMPLING");
}

/* dj_engine_step_batch_samplers: each row by the caller's own sampler (here
 * one greedy, two seeded with different params), with and without the
 * sample hook - against twin sessions stepped with logits and twin samplers
 * picking on the host. Bad samplers are refused and change nothing. */
static void check_row_samplers(int device_sampling) {
    setenv("DJINN_DEVICE_SAMPLING", device_sampling ? "on" : "off", 1); /* unset is the default, on */
    dj_model_t *m = NULL;
    dj_engine_t *e = engine_with("qwen2", &m);
    if (!e) return;
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    const dj_sampler_params ps[N_SESS] = {{.temperature = 0.f, .top_p = 1.f},
                                          {.temperature = 0.7f, .top_k = 10, .top_p = 1.f, .seed = 3},
                                          {.temperature = 1.2f, .top_k = 0, .top_p = 0.8f, .seed = 4}};
    dj_session_t *a[N_SESS] = {0}, *b[N_SESS] = {0};
    dj_sampler_t *sa[N_SESS] = {0}, *sb[N_SESS] = {0};
    int32_t ids[N_SESS];
    for (int i = 0; i < N_SESS; i++) {
        CHECK_OK(dj_session_new(e, m, 64, 0, &a[i]));
        CHECK_OK(dj_session_new(e, m, 64, 0, &b[i]));
        CHECK_OK(dj_sampler_new(&ps[i], V, &sa[i]));
        CHECK_OK(dj_sampler_new(&ps[i], V, &sb[i]));
        if (!a[i] || !b[i] || !sa[i] || !sb[i])
            goto done;
        const int32_t prompt[2] = {5 + i, 9};
        CHECK_OK(dj_session_step(e, a[i], prompt, 2, NULL));
        CHECK_OK(dj_session_step(e, b[i], prompt, 2, NULL));
        ids[i] = 7 * i + 1;
    }
    float *lg = malloc((size_t)N_SESS * V * sizeof *lg);
    int same = 1, varied = 0;
    int32_t first[N_SESS];
    for (int t = 0; t < 10 && lg; t++) {
        int32_t next[N_SESS], want[N_SESS];
        CHECK_OK(dj_engine_step_batch_samplers(e, a, NULL, ids, N_SESS, sa, next));
        CHECK_OK(dj_engine_step_batch(e, b, ids, N_SESS, lg, NULL, NULL));
        for (int i = 0; i < N_SESS; i++) {
            want[i] = dj_sampler_sample(sb[i], lg + (size_t)i * V);
            same &= next[i] == want[i];
            if (t == 0)
                first[i] = next[i];
            varied |= i > 0 && next[i] != first[i];
            ids[i] = next[i];
        }
    }
    CHECK_MSG(same, "row samplers (sample hook %s) pick differently from the host samplers",
              device_sampling ? "on" : "off");
    CHECK(varied);
    /* refused: a sampler of another vocabulary, a zero-token row; positions stay */
    const uint32_t pos = dj_session_pos(a[0]);
    dj_sampler_t *other = NULL;
    CHECK_OK(dj_sampler_new(&ps[1], V + 1, &other));
    dj_sampler_t *bad[N_SESS] = {sa[0], other, sa[2]};
    CHECK_ST(dj_engine_step_batch_samplers(e, a, NULL, ids, N_SESS, bad, ids), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "vocabulary") != NULL);
    const uint32_t zero[N_SESS] = {1, 0, 1};
    CHECK_ST(dj_engine_step_batch_samplers(e, a, zero, ids, N_SESS, sa, ids), DJ_EINVAL);
    const uint32_t huge[N_SESS] = {1, 60, 1}; /* 60 more tokens would pass session 1's 64-position context */
    CHECK_ST(dj_engine_step_batch_samplers(e, a, huge, ids, N_SESS, sa, ids), DJ_ERANGE);
    CHECK(strstr(dj_last_error(), "context") != NULL);
    const uint32_t wide[N_SESS] = {40, 30, 1}; /* 71 tokens in one step: more than max_step_tokens (64) */
    CHECK_ST(dj_engine_step_batch_samplers(e, a, wide, ids, N_SESS, sa, ids), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "max_step_tokens") != NULL);
    CHECK(dj_session_pos(a[0]) == pos);
    /* a NULL sampler picks nothing (-1) and draws nothing; the row still steps */
    int32_t nx[N_SESS];
    dj_sampler_t *some[N_SESS] = {sa[0], NULL, sa[2]};
    CHECK_OK(dj_engine_step_batch_samplers(e, a, NULL, ids, N_SESS, some, nx));
    CHECK(nx[1] == -1 && nx[0] >= 0 && nx[2] >= 0 && dj_session_pos(a[1]) == pos + 1);
    dj_sampler_free(other);
    free(lg);
done:
    for (int i = 0; i < N_SESS; i++) {
        dj_session_free(e, a[i]);
        dj_session_free(e, b[i]);
        dj_sampler_free(sa[i]);
        dj_sampler_free(sb[i]);
    }
    dj_engine_free(e);
    unsetenv("DJINN_DEVICE_SAMPLING");
}

/* Mixed steps: prompt chunks and decode rows of four sessions in one step
 * (n_tokens {1, 5, 4, 1}, then a chunk that picks nothing beside decode rows)
 * give the greedy tokens of the same sessions stepped one at a time, and the
 * decode steps after them agree too (the chunks' K/V landed at the right
 * positions). */
static void check_mixed(const char *name) {
    dj_model_t *m = NULL;
    dj_engine_t *e = engine_with(name, &m);
    if (!e) return;
    enum { S = 4 };
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    dj_session_t *mx[S] = {0}, *one[S] = {0};
    dj_sampler_t *greedy[S] = {0};
    const dj_sampler_params gp = {.temperature = 0.f, .top_p = 1.f};
    for (int i = 0; i < S; i++) {
        CHECK_OK(dj_session_new(e, m, 64, 0, &mx[i]));
        CHECK_OK(dj_session_new(e, m, 64, 0, &one[i]));
        CHECK_OK(dj_sampler_new(&gp, V, &greedy[i]));
        if (!mx[i] || !one[i] || !greedy[i])
            goto done;
    }
    /* sessions 0, 2, 3 have a context already; session 1 starts empty */
    const uint32_t pre[S] = {3, 0, 2, 6};
    for (int i = 0; i < S; i++)
        if (pre[i]) {
            int32_t p[8];
            for (uint32_t t = 0; t < pre[i]; t++)
                p[t] = rand_id(V);
            CHECK_OK(dj_session_step(e, mx[i], p, pre[i], NULL));
            CHECK_OK(dj_session_step(e, one[i], p, pre[i], NULL));
        }
    const uint32_t n1[S] = {1, 5, 4, 1};
    int32_t ids[16], got[S], want[S];
    uint32_t k = 0;
    for (int i = 0; i < S; i++)
        for (uint32_t t = 0; t < n1[i]; t++)
            ids[k++] = rand_id(V);
    CHECK_OK(dj_engine_step_batch_samplers(e, mx, n1, ids, S, greedy, got));
    k = 0;
    for (int i = 0; i < S; i++) {
        CHECK_OK(dj_session_step_sample(e, one[i], ids + k, n1[i], NULL, &want[i]));
        k += n1[i];
    }
    int same = 1;
    for (int i = 0; i < S; i++)
        same &= got[i] == want[i] && dj_session_pos(mx[i]) == dj_session_pos(one[i]);
    CHECK_MSG(same, "%s: a mixed step (chunks of 5 and 4 beside decode rows) differs from single steps", name);
    /* a chunk that picks nothing (session 1, 3 more prompt tokens) beside decode rows */
    const uint32_t n2[S] = {1, 3, 1, 1};
    dj_sampler_t *pick[S] = {greedy[0], NULL, greedy[2], greedy[3]};
    int32_t ids2[8] = {got[0], rand_id(V), rand_id(V), rand_id(V), got[2], got[3]};
    CHECK_OK(dj_engine_step_batch_samplers(e, mx, n2, ids2, S, pick, got));
    CHECK(got[1] == -1);
    int32_t w1 = 0;
    CHECK_OK(dj_session_step_sample(e, one[0], &ids2[0], 1, NULL, &want[0]));
    CHECK_OK(dj_session_step_sample(e, one[1], &ids2[1], 3, NULL, &w1));
    CHECK_OK(dj_session_step_sample(e, one[2], &ids2[4], 1, NULL, &want[2]));
    CHECK_OK(dj_session_step_sample(e, one[3], &ids2[5], 1, NULL, &want[3]));
    same = got[0] == want[0] && got[2] == want[2] && got[3] == want[3];
    /* then decode steps of all four, batched against single */
    int32_t cur[S] = {got[0], w1, got[2], got[3]}, cur1[S] = {want[0], w1, want[2], want[3]};
    for (int step = 0; step < 6; step++) {
        CHECK_OK(dj_engine_step_batch_samplers(e, mx, NULL, cur, S, greedy, got));
        for (int i = 0; i < S; i++) {
            CHECK_OK(dj_session_step_sample(e, one[i], &cur1[i], 1, NULL, &want[i]));
            same &= got[i] == want[i];
            cur[i] = got[i];
            cur1[i] = want[i];
        }
    }
    CHECK_MSG(same, "%s: after mixed steps, decode differs from the sessions stepped alone", name);
    printf("%s: mixed prompt-chunk/decode steps equal single steps\n", name);
done:
    for (int i = 0; i < S; i++) {
        dj_session_free(e, mx[i]);
        dj_session_free(e, one[i]);
        dj_sampler_free(greedy[i]);
    }
    dj_engine_free(e);
}

/* ---- the short-context class (dj_backend.short_pos) ---- */

/* A backend's short_pos set by hand on the CPU backend (which has none and
 * ignores the hint): every ATTENTION call the engine makes is seen here,
 * and each step's decode rows must carry pos_bound = short_pos exactly when
 * all of them lie below it. */
static dj_backend_vtbl spy_vt;
static const dj_backend_vtbl *spy_real;
static uint32_t spy_calls, spy_min_bound, spy_max_bound, spy_decode_only;

static void spy_note(const dj_op_call *c) {
    if (c->op != DJ_OP_ATTENTION) return;
    spy_calls++;
    spy_decode_only += c->decode_only;
    if (c->pos_bound < spy_min_bound) spy_min_bound = c->pos_bound;
    if (c->pos_bound > spy_max_bound) spy_max_bound = c->pos_bound;
}
static dj_status spy_compute(dj_backend_t *be, const dj_op_call *c) {
    spy_note(c);
    return spy_real->compute(be, c);
}
static dj_status spy_compute_plan(dj_backend_t *be, const dj_op_call *calls, size_t n, const void *key,
                                  const dj_stream_step *ss) {
    for (size_t i = 0; i < n; i++) spy_note(&calls[i]);
    return spy_real->compute_plan(be, calls, n, key, ss);
}
/* compute and compute_plan put in front of e's backend's (spy_real: its own; the caller puts it back). */
typedef dj_status (*spy_plan_fn)(dj_backend_t *, const dj_op_call *, size_t, const void *, const dj_stream_step *);
static dj_backend_t *spy_install(dj_engine_t *e, dj_status (*compute)(dj_backend_t *, const dj_op_call *),
                                 spy_plan_fn plan) {
    dj_backend_t *be = dj_engine_backend(e);
    spy_real = be->vt;
    spy_vt = *be->vt;
    spy_vt.compute = compute;
    if (spy_vt.compute_plan) spy_vt.compute_plan = plan;
    be->vt = &spy_vt;
    return be;
}
static void spy_reset(void) {
    spy_calls = 0;
    spy_decode_only = 0;
    spy_min_bound = UINT32_MAX;
    spy_max_bound = 0;
}

/* The last spied step: L ATTENTION calls, every pos_bound `bound`, and
 * decode_only on `decode_only` of them (-1: not checked). */
static void spy_expect(const char *what, uint32_t L, uint32_t bound, int decode_only) {
    CHECK_MSG(spy_calls == L && spy_min_bound == bound && spy_max_bound == bound &&
                  (decode_only < 0 || spy_decode_only == (uint32_t)decode_only),
              "%s: %u ATTENTION calls, pos_bound %u..%u, %u decode_only; expected %u calls, pos_bound %u", what,
              spy_calls, spy_min_bound, spy_max_bound, spy_decode_only, L, bound);
}

static void check_short_class(void) {
    dj_model_t *m = NULL;
    dj_engine_t *e = engine_with("llama3", &m);
    if (!e) return;
    dj_backend_t *be = spy_install(e, spy_compute, spy_compute_plan);
    enum { SHORT = 24, N = 5 };
    be->short_pos = SHORT;
    be->short_rows = 2;
    const uint32_t V = dj_model_get_config(m)->vocab_size, L = dj_model_get_config(m)->n_layers;
    /* prompts of 20 (a), 30 (b, past the class), 3 (c), 5 (y) and 2 (d) tokens */
    const uint32_t len[N] = {20, 30, 3, 5, 2};
    dj_session_t *ss[N] = {0};
    int32_t prompt[30], ids[3], next[3];
    for (int t = 0; t < 30; t++) prompt[t] = rand_id(V);
    for (int i = 0; i < N; i++) {
        CHECK_OK(dj_session_new(e, m, 64, 0, &ss[i]));
        if (!ss[i]) goto done;
        spy_reset();
        CHECK_OK(dj_session_step(e, ss[i], prompt, len[i], NULL));
        spy_expect("a prompt", L, 0, 0);
    }
    dj_session_t *a = ss[0], *b = ss[1], *c = ss[2], *y = ss[3], *d = ss[4];
    for (int i = 0; i < 3; i++) ids[i] = rand_id(V);
    /* a alone at positions 20..23: the short class; its step at 24 is past it */
    for (uint32_t p = 20; p <= 24; p++) {
        spy_reset();
        CHECK_OK(dj_engine_step_batch(e, &a, ids, 1, NULL, NULL, next));
        spy_expect(p < SHORT ? "decode within the class" : "decode past the class", L, p < SHORT ? SHORT : 0,
                   (int)L);
    }
    /* a row past the class takes the whole step out of it */
    dj_session_t *cb[2] = {c, b}, *cy[2] = {c, y}, *cyd[3] = {c, y, d};
    spy_reset();
    CHECK_OK(dj_engine_step_batch(e, cb, ids, 2, NULL, NULL, next));
    spy_expect("a row past the class", L, 0, -1);
    /* two rows within it (positions 4 and 5): the class again */
    spy_reset();
    CHECK_OK(dj_engine_step_batch(e, cy, ids, 2, NULL, NULL, next));
    spy_expect("two rows within the class", L, SHORT, (int)L);
    /* three rows within it, more than short_rows: no class, still decode rows */
    spy_reset();
    CHECK_OK(dj_engine_step_batch(e, cyd, ids, 3, NULL, NULL, next));
    spy_expect("three rows", L, 0, (int)L);
    /* a prompt chunk beside a decode row: neither hint */
    const uint32_t n_tok[2] = {3, 1};
    int32_t mixed[4] = {rand_id(V), rand_id(V), rand_id(V), rand_id(V)};
    dj_sampler_t *none[2] = {NULL, NULL};
    spy_reset();
    CHECK_OK(dj_engine_step_batch_samplers(e, cy, n_tok, mixed, 2, none, next));
    spy_expect("a mixed step", L, 0, 0);
    printf("short-context class: pos_bound %u below it, 0 past it and for prompts; decode_only on decode steps\n",
           (unsigned)SHORT);
done:
    for (int i = 0; i < N; i++) dj_session_free(e, ss[i]);
    be->vt = spy_real;
    dj_engine_free(e);
}

/* Prefill chunks' host times: a prompt of 150 tokens at max_step_tokens 64
 * is three chunks; each phase's time is non-negative and together they lie
 * inside the wall time around the call (one monotonic clock); decode steps
 * add no chunk. */
static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void check_chunk_times(void) {
    dj_model_t *m = NULL;
    dj_engine_t *e = engine_with("llama3", &m);
    if (!e) return;
    const uint32_t V = dj_model_get_config(m)->vocab_size, n = 150;
    int32_t prompt[150];
    for (uint32_t i = 0; i < n; i++) prompt[i] = rand_id(V);
    dj_session_t *s = NULL;
    CHECK_OK(dj_session_new(e, m, 256, 0, &s));
    if (!s) {
        dj_engine_free(e);
        return;
    }
    const dj_chunk_times t0 = dj_engine_chunk_times(e);
    const double w0 = mono_now();
    CHECK_OK(dj_session_step(e, s, prompt, n, NULL));
    const double wall = mono_now() - w0;
    const dj_chunk_times t1 = dj_engine_chunk_times(e);
    CHECK_MSG(t1.chunks - t0.chunks == 3, "a 150-token prompt at 64 a step: %llu chunks, want 3",
              (unsigned long long)(t1.chunks - t0.chunks));
    const double prep = t1.prepare_s - t0.prepare_s, enq = t1.enqueue_s - t0.enqueue_s,
                 fin = t1.finish_s - t0.finish_s;
    CHECK(prep >= 0.0 && enq >= 0.0 && fin >= 0.0);
    CHECK_MSG(prep + enq + fin <= wall, "chunk phases %.6f + %.6f + %.6f s past the call's %.6f s", prep, enq, fin,
              wall);
    /* a decode step counts in the step times, not the chunk times; the prompt's chunks did not */
    CHECK(dj_engine_step_times(e).chunks == 0);
    int32_t next[1] = {0}, id[1] = {rand_id(V)};
    const dj_chunk_times d0 = dj_engine_step_times(e);
    const double dw0 = mono_now();
    CHECK_OK(dj_engine_step_batch(e, &s, id, 1, NULL, NULL, next));
    const double dwall = mono_now() - dw0;
    const dj_chunk_times d1 = dj_engine_step_times(e);
    CHECK(dj_engine_chunk_times(e).chunks == t1.chunks);
    CHECK_MSG(d1.chunks - d0.chunks == 1, "one decode step: %llu counted", (unsigned long long)(d1.chunks - d0.chunks));
    const double dp = d1.prepare_s - d0.prepare_s, de = d1.enqueue_s - d0.enqueue_s, df = d1.finish_s - d0.finish_s;
    CHECK(dp >= 0.0 && de >= 0.0 && df >= 0.0);
    CHECK_MSG(dp + de + df <= dwall, "step phases %.6f + %.6f + %.6f s past the call's %.6f s", dp, de, df, dwall);
    printf("chunk times: 3 chunks of a 150-token prompt, prepare %.3f + enqueue %.3f + finish %.3f of %.3f ms\n",
           prep * 1e3, enq * 1e3, fin * 1e3, wall * 1e3);
    dj_session_free(e, s);
    dj_engine_free(e);
}

/* The rows past n a MATMUL's call says its output has room for
 * (dj_op_call.out_rows; CUDA's FP8 GEMMs write them as scratch) are the
 * call's own: on the CPU (f32 activations, as the graph sizes them) exactly
 * the prompt's bucket rows, none at decode; and a backend that fills them
 * with NaN after every MATMUL gives bit for bit the logits of one that leaves
 * them, over prompts of several lengths and decode steps after them. */
static uint32_t scrawl_on, scrawl_calls, scrawl_rows, scrawl_bad, scrawl_want;
static dj_status scrawl_one(dj_backend_t *be, const dj_op_call *c) {
    dj_status st = spy_real->compute(be, c);
    if (st != DJ_OK || c->op != DJ_OP_MATMUL || !c->out_rows) return st;
    scrawl_bad += c->out_rows != scrawl_want || c->out_rows <= c->n;
    scrawl_calls++;
    scrawl_rows += c->out_rows - c->n;
    if (scrawl_on && c->out_dtype == DJ_DTYPE_F32) /* the CPU backend's activations */
        for (size_t i = (size_t)c->n * c->m; i < (size_t)c->out_rows * c->m; i++) ((float *)c->out)[i] = NAN;
    return st;
}
static dj_status scrawl_plan(dj_backend_t *be, const dj_op_call *calls, size_t n, const void *key,
                             const dj_stream_step *ss) {
    (void)key;
    (void)ss;
    dj_status st = DJ_OK;
    for (size_t i = 0; i < n && st == DJ_OK; i++) st = scrawl_one(be, &calls[i]);
    return st;
}

static void check_out_rows(void) {
    dj_model_t *m = NULL;
    dj_engine_t *e = engine_with("llama3", &m);
    if (!e) return;
    dj_backend_t *be = spy_install(e, scrawl_one, scrawl_plan);
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    const uint32_t lens[4] = {5, 17, 30, 3}; /* buckets 16, 32, 32, 16 */
    float *want = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V);
    int32_t prompt[30];
    for (int t = 0; t < 30; t++) prompt[t] = rand_id(V);
    uint32_t differ = 0;
    for (int li = 0; li < 4 && want && got; li++) {
        dj_session_t *s[2] = {NULL, NULL};
        for (int pass = 0; pass < 2; pass++) {
            scrawl_on = (uint32_t)pass;
            CHECK_OK(dj_session_new(e, m, 64, 0, &s[pass]));
            if (!s[pass]) break;
            float *l = pass ? got : want;
            scrawl_want = dj_shape_bucket(DJ_PHASE_PREFILL, lens[li], 64); /* new_engine: max_step_tokens 64 */
            CHECK_OK(dj_session_step(e, s[pass], prompt, lens[li], l));
            int32_t tok = (int32_t)(lens[li] % V);
            scrawl_want = 0;
            for (int step = 0; step < 3; step++) CHECK_OK(dj_session_step(e, s[pass], &tok, 1, l));
        }
        differ += memcmp(want, got, sizeof(float) * V) != 0;
        for (int pass = 0; pass < 2; pass++) dj_session_free(e, s[pass]);
    }
    CHECK_MSG(differ == 0, "%u of 4 prompts gave other logits with their MATMULs' spare rows filled", differ);
    CHECK_MSG(scrawl_calls > 0 && scrawl_bad == 0,
              "%u MATMUL calls claimed spare rows, %u of them other than their step's bucket", scrawl_calls,
              scrawl_bad);
    printf("MATMUL spare rows: %u calls claimed %u rows past their own (%u not the bucket's), filled with NaN: "
           "logits %s\n", scrawl_calls, scrawl_rows, scrawl_bad, differ ? "CHANGED" : "unchanged");
    be->vt = spy_real;
    free(want);
    free(got);
    dj_engine_free(e);
}

int main(void) {
    dj_test_seeds();
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++)
        check_mixed(MODELS[i]);
    check_row_samplers(0);
    check_row_samplers(1);
    check_masked_rows(0);
    check_masked_rows(1);
    for (size_t i = 0; i < sizeof MODELS / sizeof *MODELS; i++) check_model(MODELS[i]);
    check_two_models();
    check_sample_hook();
    check_hook_gate();
    check_short_class();
    check_chunk_times();
    check_out_rows();
    return dj_test_finish("test_batch");
}
