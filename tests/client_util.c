/* client_util.c: the scripted agents and reference texts of the tests that drive djinnd
 * through libdjinn (see client_util.h). */
#include "client_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon_util.h"
#include "djinn/tokenizer.h"
#include "testutil.h"

void dj_test_on_ids(int32_t id, const char *text, size_t len, void *user) {
    (void)text;
    (void)len;
    dj_test_ids *c = user;
    if (id < 0) return; /* the text held back, flushed at the end */
    if (c->n < c->cap) c->ids[c->n] = id;
    c->n++;
}

void dj_test_agent_make(dj_test_agent *a, int idx, uint64_t seed, size_t first_len, size_t later_len, uint32_t vocab,
                        int max_pause_ms) {
    memset(a, 0, sizeof *a);
    a->idx = idx;
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + (uint64_t)idx * 0xbf58476d1ce4e5b9ULL + 1;
    for (int r = 0; r < DJ_TEST_AGENT_ROUNDS; r++) {
        a->n_prompt[r] = r == 0 ? first_len : later_len;
        if (a->n_prompt[r] > DJ_TEST_AGENT_PROMPT) a->n_prompt[r] = DJ_TEST_AGENT_PROMPT;
        for (size_t i = 0; i < a->n_prompt[r]; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            a->prompt[r][i] = (int32_t)(2 + x % (vocab - 2));
        }
        a->pause_ms[r] = (int)(x % (uint64_t)max_pause_ms);
    }
}

dj_status dj_test_agent_generate(dj_client_t *c, uint64_t sid, dj_test_agent *a, int r) {
    dj_test_ids col = {a->out[r], 0, DJ_TEST_AGENT_GEN};
    const dj_generate_params gp = {.ids = a->prompt[r], .n_ids = a->n_prompt[r], .max_tokens = DJ_TEST_AGENT_GEN,
                                   .ignore_eos = true};
    const dj_status st = dj_client_generate(c, sid, &gp, dj_test_on_ids, &col, NULL);
    a->n_out[r] = col.n;
    return st;
}

void dj_test_agent_run(dj_test_agent *a, bool pause) {
    dj_client_t *c = NULL;
    a->st = dj_client_connect(a->addr, NULL, &c);
    uint64_t sid = 0;
    const dj_session_opts so = {.model = "demo", .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 256};
    if (a->st == DJ_OK) a->st = dj_client_session_open(c, &so, &sid);
    for (int r = 0; r < DJ_TEST_AGENT_ROUNDS && a->st == DJ_OK; r++) {
        if ((a->st = dj_test_agent_generate(c, sid, a, r)) != DJ_OK || !pause) continue;
        a->st = dj_client_session_pause(c, sid, (uint64_t)a->pause_ms[r] + 5);
        if (a->st == DJ_OK) dj_test_sleep_ms(a->pause_ms[r]);
        if (a->st == DJ_OK) a->st = dj_client_session_resume(c, sid);
    }
    if (a->st != DJ_OK) snprintf(a->err, sizeof a->err, "%s", dj_last_error());
    if (sid && a->st == DJ_OK) a->st = dj_client_session_close(c, sid);
    dj_client_free(c);
}

void *dj_test_agent_thread(void *p) {
    dj_test_agent_run(p, true);
    return NULL;
}

bool dj_test_agent_same(const dj_test_agent *x, const dj_test_agent *y, int rounds, const char *what) {
    enum { GEN = DJ_TEST_AGENT_GEN };
    bool same = true;
    for (int r = 0; r < rounds; r++) {
        const bool d = x->n_out[r] != GEN || y->n_out[r] != GEN || memcmp(x->out[r], y->out[r], sizeof x->out[r]);
        if (d) {
            fprintf(stderr, "agent %d round %d (%s): alone", x->idx, r, what);
            for (uint32_t k = 0; k < x->n_out[r] && k < GEN; k++) fprintf(stderr, " %d", x->out[r][k]);
            fprintf(stderr, "; here");
            for (uint32_t k = 0; k < y->n_out[r] && k < GEN; k++) fprintf(stderr, " %d", y->out[r][k]);
            fputc('\n', stderr);
        }
        same &= !d;
    }
    return same;
}

void dj_test_agents_alone(dj_test_agent *alone, int n, const char *addr) {
    for (int i = 0; i < n; i++) {
        alone[i].addr = addr;
        dj_test_agent_run(&alone[i], false);
        CHECK_MSG(alone[i].st == DJ_OK, "agent %d alone: %s", i, alone[i].err);
    }
}

int dj_test_agents_crowd(dj_test_agent *crowd, const dj_test_agent *alone, int n, const char *addr, const char *what,
                         int *differ) {
    pthread_t *th = calloc((size_t)n, sizeof *th);
    bool *started = calloc((size_t)n, sizeof *started);
    CHECK(th && started);
    for (int i = 0; th && started && i < n; i++) {
        crowd[i].addr = addr;
        started[i] = pthread_create(&th[i], NULL, dj_test_agent_thread, &crowd[i]) == 0;
        CHECK(started[i]);
    }
    for (int i = 0; th && started && i < n; i++)
        if (started[i]) pthread_join(th[i], NULL);
    int failed = 0;
    *differ = 0;
    for (int i = 0; i < n; i++) {
        if (!started || !started[i] || crowd[i].st != DJ_OK) {
            failed++;
            fprintf(stderr, "agent %d (%s): %s: %s\n", i, what, dj_status_name(crowd[i].st), crowd[i].err);
            continue;
        }
        *differ += !dj_test_agent_same(&alone[i], &crowd[i], DJ_TEST_AGENT_ROUNDS, what);
    }
    free(th);
    free(started);
    return failed;
}

static void on_text(int32_t id, const char *text, size_t len, void *user) {
    dj_test_text *c = user;
    if (id >= 0) c->tokens++;
    if (c->n + len < sizeof c->text) {
        memcpy(c->text + c->n, text, len);
        c->n += len;
        c->text[c->n] = '\0';
    }
}

dj_test_text dj_test_reference(const char *addr, const char *model, const char *text, bool add_bos,
                               const dj_sampler_params *sp, uint32_t max_tokens) {
    return dj_test_reference_biased(addr, model, text, add_bos, sp, max_tokens, NULL, 0);
}

/* ids[n_ids] generated on addr's model with sp and bias; failures count as failed checks */
static dj_test_text reference_ids(const char *addr, const char *model, const int32_t *ids, size_t n_ids,
                                  const dj_sampler_params *sp, uint32_t max_tokens, const dj_logit_bias *bias,
                                  size_t n_bias) {
    dj_test_text c = {0};
    dj_client_t *cl = NULL;
    uint64_t sess = 0;
    CHECK_OK(dj_client_connect(addr, NULL, &cl));
    dj_session_opts so = {model, DJ_QOS_INTERACTIVE, 0};
    if (cl) CHECK_OK(dj_client_session_open(cl, &so, &sess));
    dj_generate_params gp = {.ids = ids, .n_ids = n_ids, .max_tokens = max_tokens, .sampling = *sp,
                             .logit_bias = bias, .n_logit_bias = n_bias};
    if (sess) CHECK_OK(dj_client_generate(cl, sess, &gp, on_text, &c, NULL));
    dj_client_free(cl);
    return c;
}

dj_test_text dj_test_reference_ids(const char *addr, const char *model, const int32_t *ids, size_t n_ids,
                                   const dj_sampler_params *sp, uint32_t max_tokens) {
    return reference_ids(addr, model, ids, n_ids, sp, max_tokens, NULL, 0);
}

dj_test_text dj_test_reference_biased(const char *addr, const char *model, const char *text, bool add_bos,
                                      const dj_sampler_params *sp, uint32_t max_tokens, const dj_logit_bias *bias,
                                      size_t n_bias) {
    dj_tokenizer_t *tok = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK_OK(dj_tokenizer_load(DJ_SOURCE_DIR "/models/demo/tokenizer.json", &tok));
    if (tok) CHECK_OK(dj_tokenizer_encode(tok, text, strlen(text), add_bos, &ids, &n_ids));
    dj_test_text c = reference_ids(addr, model, ids, n_ids, sp, max_tokens, bias, n_bias);
    free(ids);
    dj_tokenizer_free(tok);
    return c;
}
