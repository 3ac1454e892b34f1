/* test_server_cache_salt.c: the prefix cache salted per tenant (issue 43, finding 3) - two tokens never map
 * each other's cached blocks, `shared` tokens do, a request's cache_salt separates and joins, on the binary
 * protocol and the HTTP door's cached_tokens; without a token file every client still shares. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djinn/client.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_salt_XXXXXX";
static char store[400];

#define N_IDS 200 /* 3 full blocks of the demo model's 64 tokens, and some */
#define BLOCKS_TOKENS 192
static int32_t prompt[N_IDS];

static pid_t start(int slot, const char *const *extra, char *addr, size_t cap, unsigned *http_port) {
    const char *args[12] = {"--http-reuse", "0"};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 11; i++) args[n++] = extra[i];
    args[n] = NULL;
    return dj_test_http_daemon_start(slot, tmpdir, store, args, addr, cap, http_port);
}

/* The prompt's cached ids for token tok with cache_salt (NULL: none) on a fresh session; -1 on error. */
static int cached_of(const char *addr, const char *tok, const char *salt) {
    dj_client_t *c = NULL;
    if (dj_client_connect(addr, tok, &c) != DJ_OK) return -1;
    uint64_t s = 0;
    const dj_session_opts so = {.model = "demo", .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 256};
    dj_generate_params gp = {.ids = prompt, .n_ids = N_IDS, .max_tokens = 2, .cache_salt = salt};
    dj_generate_result res;
    memset(&res, 0, sizeof res);
    int got = -1;
    if (dj_client_session_open(c, &so, &s) == DJ_OK && dj_client_generate(c, s, &gp, NULL, NULL, &res) == DJ_OK)
        got = (int)res.cached;
    else
        fprintf(stderr, "generate (%s, %s): %s\n", tok ? tok : "no token", salt ? salt : "no salt", dj_last_error());
    dj_client_free(c); /* its session closes: its blocks stay cached, unreferenced */
    return got;
}

/* The HTTP door's usage.prompt_tokens_details.cached_tokens for the prompt; -1 on error. */
static int http_cached(unsigned port, const char *tok, const char *salt_field) {
    char *body = malloc(16 * N_IDS + 512);
    int k = sprintf(body, "{\"model\": \"demo\", \"max_tokens\": 2, \"temperature\": 0, %s\"prompt\": [",
                    salt_field ? salt_field : "");
    for (int i = 0; i < N_IDS; i++) k += sprintf(body + k, "%s%d", i ? ", " : "", prompt[i]);
    sprintf(body + k, "]}");
    char hdr[128];
    snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\n", tok);
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", hdr, body);
    free(body);
    int cached = -1;
    const char *c = r.status == 200 && r.body ? strstr(r.body, "\"cached_tokens\":") : NULL;
    if (c) cached = atoi(c + 16);
    else fprintf(stderr, "HTTP %d: %s\n", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    return cached;
}

static void fresh_prompt(int round) {
    for (int i = 0; i < N_IDS; i++) prompt[i] = 5 + (i * 37 + round * 101) % 4000;
}

#define EXPECT(got, want, what)                                                                                \
    do {                                                                                                       \
        const int g_ = (got);                                                                                  \
        CHECK_MSG(g_ == (want), "%s: %d cached tokens, want %d", what, g_, want);                              \
    } while (0)

static void test_tenants(void) {
    char path[600], addr[128];
    snprintf(path, sizeof path, "%s/tokens", tmpdir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs("alice-secret\nbob-secret\ncarol-secret shared\ndave-secret shared qos=interactive\n", f);
    fclose(f);
    const char *extra[] = {"--token-file", path, NULL};
    unsigned port = 0;
    pid_t pid = start(0, extra, addr, sizeof addr, &port);
    CHECK_MSG(pid > 0 && port > 0, "djinnd with a token file did not start");
    if (pid <= 0 || !port) return;

    /* the same token hits; another token does not see it, whichever comes first */
    fresh_prompt(0);
    EXPECT(cached_of(addr, "alice-secret", NULL), 0, "alice, first");
    EXPECT(cached_of(addr, "alice-secret", NULL), BLOCKS_TOKENS, "alice, again");
    EXPECT(cached_of(addr, "bob-secret", NULL), 0, "bob on alice's prompt");
    EXPECT(cached_of(addr, "bob-secret", NULL), BLOCKS_TOKENS, "bob, again");
    /* shared tokens share with each other, not with alice or bob */
    EXPECT(cached_of(addr, "carol-secret", NULL), 0, "carol (shared) on alice's and bob's prompt");
    EXPECT(cached_of(addr, "dave-secret", NULL), BLOCKS_TOKENS, "dave (shared) on carol's");

    /* cache_salt: a salt of its own within a token; the same salt joins within a
     * token (or among shared ones), never across tokens */
    fresh_prompt(1);
    EXPECT(cached_of(addr, "alice-secret", NULL), 0, "alice, second prompt");
    EXPECT(cached_of(addr, "alice-secret", "x"), 0, "alice with cache_salt x");
    EXPECT(cached_of(addr, "alice-secret", "x"), BLOCKS_TOKENS, "alice with cache_salt x, again");
    EXPECT(cached_of(addr, "alice-secret", "y"), 0, "alice with cache_salt y");
    EXPECT(cached_of(addr, "bob-secret", "x"), 0, "bob with alice's cache_salt x");
    EXPECT(cached_of(addr, "carol-secret", "x"), 0, "carol with cache_salt x");
    EXPECT(cached_of(addr, "dave-secret", "x"), BLOCKS_TOKENS, "dave with cache_salt x (shared, like carol)");
    EXPECT(cached_of(addr, "alice-secret", NULL), BLOCKS_TOKENS, "alice without a salt still hits her own");

    /* a session's salt is set once: a later GENERATE with another is refused, the same one is fine */
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, "alice-secret", &c));
    if (c) {
        uint64_t s = 0;
        const dj_session_opts so = {.model = "demo", .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 256};
        dj_generate_params gp = {.ids = prompt, .n_ids = 8, .max_tokens = 1, .cache_salt = "x"};
        CHECK_OK(dj_client_session_open(c, &so, &s));
        CHECK_OK(dj_client_generate(c, s, &gp, NULL, NULL, NULL));
        CHECK_OK(dj_client_generate(c, s, &gp, NULL, NULL, NULL));
        gp.cache_salt = "y";
        CHECK_ST(dj_client_generate(c, s, &gp, NULL, NULL, NULL), DJ_EINVAL);
        CHECK(strstr(dj_last_error(), "cache_salt") != NULL);
        gp.cache_salt = "";
        CHECK_ST(dj_client_generate(c, s, &gp, NULL, NULL, NULL), DJ_EINVAL);
        dj_client_free(c);
    }

    /* the HTTP door: usage's cached_tokens tells nothing of another token's prompt */
    fresh_prompt(2);
    EXPECT(http_cached(port, "alice-secret", NULL), 0, "HTTP: alice, first");
    EXPECT(http_cached(port, "bob-secret", NULL), 0, "HTTP: bob on alice's prompt");
    EXPECT(http_cached(port, "alice-secret", NULL), BLOCKS_TOKENS, "HTTP: alice, again");
    EXPECT(http_cached(port, "alice-secret", "\"cache_salt\": \"p\", "), 0, "HTTP: alice with cache_salt p");
    EXPECT(http_cached(port, "alice-secret", "\"cache_salt\": \"p\", "), BLOCKS_TOKENS,
           "HTTP: alice with cache_salt p, again");
    EXPECT(http_cached(port, "bob-secret", "\"cache_salt\": \"p\", "), 0, "HTTP: bob with alice's cache_salt");
    EXPECT(http_cached(port, "carol-secret", NULL), 0, "HTTP: carol (shared)");
    EXPECT(http_cached(port, "dave-secret", NULL), BLOCKS_TOKENS, "HTTP: dave (shared) on carol's");
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", "Authorization: Bearer alice-secret\r\n",
                                          "{\"model\": \"demo\", \"prompt\": [5, 6], \"cache_salt\": 7}");
    CHECK_MSG(r.status == 400 && r.body && strstr(r.body, "cache_salt"), "cache_salt 7: %d %s", r.status,
              r.body ? r.body : "");
    dj_test_resp_free(&r);
    CHECK(dj_test_daemon_stop(0, 10000) == 0);
}

/* No token file: one tenant (loopback), sharing as before; a cache_salt still separates. */
static void test_single_tenant(void) {
    char addr[128];
    unsigned port = 0;
    pid_t pid = start(1, NULL, addr, sizeof addr, &port);
    CHECK_MSG(pid > 0, "djinnd without a token file did not start");
    if (pid <= 0) return;
    fresh_prompt(3);
    EXPECT(cached_of(addr, NULL, NULL), 0, "single tenant, first");
    EXPECT(cached_of(addr, NULL, NULL), BLOCKS_TOKENS, "single tenant, another connection");
    EXPECT(http_cached(port, "none", NULL), BLOCKS_TOKENS, "single tenant, the HTTP door");
    EXPECT(cached_of(addr, NULL, "z"), 0, "single tenant with cache_salt z");
    EXPECT(cached_of(addr, NULL, "z"), BLOCKS_TOKENS, "single tenant with cache_salt z, again");
    CHECK(dj_test_daemon_stop(1, 10000) == 0);
}

int main(void) {
    /* no dj_test_seeds(): nothing here is random, one run says it all */
    dj_test_daemon_guard();
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!mkdtemp(tmpdir)) return 1;
    if (!dj_test_demo_store(tmpdir, store, sizeof store)) return 1;
    test_tenants();
    test_single_tenant();
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_server_cache_salt");
}
