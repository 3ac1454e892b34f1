/* test_server_lora.c: LoRA adapters through djinnd - a GENERATE's `adapter` (a folder of the model store)
 * gives the tokens the engine gives with that adapter, a session keeps the adapter its KV was made with,
 * unknown and malformed names are refused, and the HTTP door's "model": "base:adapter". */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon_util.h"
#include "djinn/client.h"
#include "djinn/engine.h"
#include "djinn/lora.h"
#include "lora_fixture.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_lora_XXXXXX";
static char store[400];

#define N_PROMPT 12
#define N_GEN 8
static int32_t prompt[N_PROMPT];

/* Greedy tokens of the demo model in the store, with the adapter in folder ad (NULL: none), in-process. */
static void local_tokens(const char *ad, int32_t *out) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.n_threads = 1;
    dj_vmu_config_default(&ec.vmu, (size_t)128 << 20);
    dj_engine_t *e = NULL;
    dj_model_t *m = NULL;
    dj_lora_t *a = NULL;
    dj_session_t *s = NULL;
    char p[600];
    snprintf(p, sizeof p, "%s/demo", store);
    CHECK_OK(dj_engine_new(&ec, &e));
    CHECK_OK(dj_model_load(e, p, &m));
    CHECK_OK(dj_session_new(e, m, 64, 0, &s));
    if (ad) {
        snprintf(p, sizeof p, "%s/%s", store, ad);
        CHECK_OK(dj_lora_load(e, m, p, &a));
        CHECK_OK(dj_session_set_lora(e, s, a, 1.0f));
    }
    int32_t next = 0;
    CHECK_OK(dj_session_step_sample(e, s, prompt, N_PROMPT, NULL, &next));
    for (int i = 0; i < N_GEN; i++) {
        out[i] = next;
        if (i + 1 < N_GEN) CHECK_OK(dj_session_step_sample(e, s, &out[i], 1, NULL, &next));
    }
    dj_session_free(e, s);
    dj_lora_release(e, a);
    dj_model_release(e, m);
    dj_engine_free(e);
}

typedef struct got {
    int32_t ids[64];
    int n;
    char text[1024];
    size_t len;
    size_t at[64]; /* text bytes before token i */
} got;

static void on_token(int32_t id, const char *text, size_t len, void *user) {
    got *g = user;
    if (g->n < 64) {
        g->at[g->n] = g->len;
        g->ids[g->n++] = id;
    }
    if (g->len + len < sizeof g->text) {
        memcpy(g->text + g->len, text, len);
        g->len += len;
    }
}

static dj_status gen(dj_client_t *c, uint64_t s, const char *adapter, const int32_t *ids, size_t n, got *g) {
    memset(g, 0, sizeof *g);
    dj_generate_params gp = {.ids = ids, .n_ids = n, .max_tokens = N_GEN, .ignore_eos = true, .adapter = adapter};
    gp.sampling.top_p = 1.0f;
    return dj_client_generate(c, s, &gp, on_token, g, NULL);
}

int main(void) {
    dj_test_daemon_guard();
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!mkdtemp(tmpdir)) return 1;
    if (!dj_test_demo_store(tmpdir, store, sizeof store)) return 1;
    char base_dir[600], ad_dir[600];
    snprintf(base_dir, sizeof base_dir, "%s/demo", store);
    snprintf(ad_dir, sizeof ad_dir, "%s/demo-ad", store);
    setenv("DJ_TEST_SEED", "7", 0); /* one adapter, the same every run (its text is compared as JSON) */
    dj_test_seed();
    const adapter_spec sp = {.r = 4, .alpha = 16, .bf16 = true};
    lora_fixture_write(base_dir, "demo", ad_dir, &sp);
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = 5 + (i * 37) % 4000;
    int32_t want_ad[N_GEN], want_base[N_GEN];
    local_tokens("demo-ad", want_ad);
    local_tokens(NULL, want_base);
    CHECK(memcmp(want_ad, want_base, sizeof want_ad) != 0); /* the adapter changes what is generated */

    char addr[128];
    unsigned http = 0;
    const pid_t pid = dj_test_http_daemon_start(0, tmpdir, store, NULL, addr, sizeof addr, &http);
    CHECK(pid > 0 && http > 0);
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    const dj_session_opts so = {.model = "demo", .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 128};
    uint64_t s1 = 0, s2 = 0, s3 = 0;
    got g;
    if (c) {
        /* an adapted session: the engine's tokens; its next GENERATE keeps the adapter, another is refused */
        CHECK_OK(dj_client_session_open(c, &so, &s1));
        CHECK_OK(gen(c, s1, "demo-ad", prompt, N_PROMPT, &g));
        CHECK_MSG(g.n == N_GEN && memcmp(g.ids, want_ad, sizeof want_ad) == 0, "adapted tokens differ (%d)", g.n);
        got ad_text = g;
        CHECK_OK(gen(c, s1, "demo-ad", &g.ids[N_GEN - 1], 1, &g));
        CHECK_OK(gen(c, s1, NULL, &g.ids[N_GEN - 1], 1, &g));
        CHECK_ST(gen(c, s1, "other-ad", &g.ids[N_GEN - 1], 1, &g), DJ_EINVAL);
        /* the bare model */
        CHECK_OK(dj_client_session_open(c, &so, &s2));
        CHECK_OK(gen(c, s2, NULL, prompt, N_PROMPT, &g));
        CHECK(g.n == N_GEN && memcmp(g.ids, want_base, sizeof want_base) == 0);
        CHECK_ST(gen(c, s2, "demo-ad", &g.ids[N_GEN - 1], 1, &g), DJ_EINVAL); /* its KV is the bare model's */
        /* unknown and malformed names */
        CHECK_OK(dj_client_session_open(c, &so, &s3));
        CHECK_ST(gen(c, s3, "no-such-adapter", prompt, N_PROMPT, &g), DJ_ENOTFOUND);
        CHECK_ST(gen(c, s3, "../demo-ad", prompt, N_PROMPT, &g), DJ_EINVAL);
        CHECK_ST(gen(c, s3, "demo", prompt, N_PROMPT, &g), DJ_ENOTFOUND); /* a model, not an adapter */
        CHECK_OK(gen(c, s3, "demo-ad", prompt, N_PROMPT, &g)); /* still fresh: takes it */
        CHECK(memcmp(g.ids, want_ad, sizeof want_ad) == 0);

        /* HTTP: "model": "base:adapter" */
        char body[1024];
        int k = sprintf(body, "{\"model\": \"demo:demo-ad\", \"max_tokens\": %d, \"temperature\": 0, "
                              "\"prompt\": [", N_GEN);
        for (int i = 0; i < N_PROMPT; i++) k += sprintf(body + k, "%s%d", i ? ", " : "", prompt[i]);
        sprintf(body + k, "]}");
        dj_test_resp r = dj_test_http_request(http, "POST", "/v1/completions", "", body);
        char want[1100];
        size_t upto = ad_text.len; /* the door stops at the demo model's EOS (id 1) */
        for (int i = 0; i < ad_text.n; i++)
            if (ad_text.ids[i] == 1) {
                upto = ad_text.at[i];
                break;
            }
        snprintf(want, sizeof want, "\"text\":\"%.*s\"", (int)upto, ad_text.text);
        CHECK_MSG(r.status == 200 && r.body && strstr(r.body, want), "HTTP %d: %s (want %s)", r.status,
                  r.body ? r.body : "", want);
        dj_test_resp_free(&r);
        const char *bad[] = {"demo:nope", "demo:", "demo:a:b"};
        const int code[] = {404, 400, 400};
        for (int i = 0; i < 3; i++) {
            snprintf(body, sizeof body, "{\"model\": \"%s\", \"max_tokens\": 2, \"prompt\": [5, 6]}", bad[i]);
            r = dj_test_http_request(http, "POST", "/v1/completions", "", body);
            CHECK_MSG(r.status == code[i], "%s: HTTP %d (%s), want %d", bad[i], r.status, r.body ? r.body : "",
                      code[i]);
            dj_test_resp_free(&r);
        }
        dj_client_free(c);
    }
    CHECK(dj_test_daemon_stop(0, 10000) == 0);
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_server_lora");
}
