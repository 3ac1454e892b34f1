/* test_server_agents.c: sixteen agents over a data segment that holds three
 * of them (six over two under ASan), through a real djinnd on the CPU engine - generate, pause (a tool
 * call), resume, three rounds each - every output equal to the agent's run
 * alone, no failure; the same under the recompute policy; a session
 * reattached from a new connection keeps its KV; a request larger than the
 * whole data segment is refused with the sizes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_util.h"
#include "daemon_util.h"
#include "djinn/client.h"
#include "testutil.h"

/* Under ASan (a Debug build, several times slower) fewer agents over a
 * segment that holds two of them: the same oversubscription, a quarter of
 * the time. */
#if defined(__SANITIZE_ADDRESS__)
#define N_AGENTS 6
#define DATA_FOR "2m"
#define HOLDS 2
#else
#define N_AGENTS 16
#define DATA_FOR "3m"
#define HOLDS 3
#endif
#define ROUNDS DJ_TEST_AGENT_ROUNDS
#define GEN DJ_TEST_AGENT_GEN
#define VOCAB 4096

static char tmpdir[256];
static uint64_t base_seed;

typedef dj_test_agent agent; /* client_util.h */

/* Deterministic per-agent prompts (from the run's seed, not the clock). */
static void make_agent(agent *a, int idx, uint64_t seed) { dj_test_agent_make(a, idx, seed, 40, 12, VOCAB, 40); }

static pid_t start(int slot, const char *const *extra, char *addr, size_t cap) {
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = DJ_SOURCE_DIR "/models",
                                   .listen = "127.0.0.1:0", .save_stderr = true, .wait_ms = 20000};
    int code = 0;
    pid_t pid = dj_test_daemon_start(slot, &o, extra, addr, cap, &code);
    CHECK_MSG(pid > 0, "djinnd did not start (exit %d)", code);
    return pid;
}

static uint64_t stat_u64(dj_client_t *c, const char *what) {
    dj_client_stats st;
    if (dj_client_stats_get(c, &st) != DJ_OK) return UINT64_MAX;
    uint64_t v = UINT64_MAX;
    if (!strcmp(what, "swaps_out")) v = st.swap.swaps_out;
    else if (!strcmp(what, "drops")) v = st.swap.kv_drops;
    else if (!strcmp(what, "pool_used")) v = st.swap.pool_used;
    dj_client_stats_free(&st);
    return v;
}

/* Every agent alone (one daemon, one after another), then all at once on a
 * daemon whose data segment holds three of them. */
static void agents(const char *policy, int slot) {
    static agent alone[N_AGENTS], crowd[N_AGENTS];
    char addr[64];
    /* 8 layers x 64 positions a page: an agent's ~95 positions take 16 pages (1 MiB); DATA_FOR MiB hold HOLDS */
    const char *roomy[] = {"--vmu-gb", "64m", "--swap-policy", policy, NULL};
    const char *tight[] = {"--vmu-gb", "64m", "--data-gb", DATA_FOR, "--swap-gb", "64m", "--swap-policy", policy,
                           "--idle-ms", "20", "--threads", "1", "--local-admin", NULL}; /* STATS' swap counters */
    if (start(slot, roomy, addr, sizeof addr) <= 0) return;
    for (int i = 0; i < N_AGENTS; i++) make_agent(&alone[i], i, base_seed);
    dj_test_agents_alone(alone, N_AGENTS, addr);
    dj_test_daemon_stop(slot, 10000);
    if (start(slot, tight, addr, sizeof addr) <= 0) return;
    for (int i = 0; i < N_AGENTS; i++) make_agent(&crowd[i], i, base_seed);
    int differ = 0;
    const int failed = dj_test_agents_crowd(crowd, alone, N_AGENTS, addr, policy, &differ);
    printf("%d agents, policy %s, data segment for %d: %d failed, %d differ from the agent alone\n", N_AGENTS,
           policy, HOLDS, failed, differ);
    CHECK(failed == 0);
    CHECK(differ == 0);
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (c) {
        /* the agents' KV cannot have stayed in a segment for HOLDS of them: it moved */
        if (!strcmp(policy, "recompute")) CHECK(stat_u64(c, "drops") > 0);
        else CHECK(stat_u64(c, "swaps_out") > 0);
        CHECK(stat_u64(c, "pool_used") == 0); /* closed sessions left nothing in the pool */
        /* a request larger than the whole data segment: refused at once, with the sizes */
        uint64_t sid = 0;
        const dj_session_opts so = {.model = "demo", .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 512};
        CHECK_OK(dj_client_session_open(c, &so, &sid));
        int32_t one = 5;
        const dj_generate_params big = {.ids = &one, .n_ids = 1, .max_tokens = 500, .ignore_eos = true};
        CHECK_ST(dj_client_generate(c, sid, &big, NULL, NULL, NULL), DJ_ENOSPC);
        CHECK_MSG(strstr(dj_last_error(), "whole data segment") != NULL, "message: %s", dj_last_error());
        dj_client_free(c);
    }
    dj_test_daemon_stop(slot, 10000);
}

/* A session survives its connection: a new one attaches with the secret and
 * goes on where it was, as if never interrupted. */
static void reattach(int slot) {
    char addr[64];
    const char *extra[] = {"--vmu-gb", "64m", "--lease-ms", "60000", NULL};
    if (start(slot, extra, addr, sizeof addr) <= 0) return;
    agent a;
    make_agent(&a, 99, base_seed);
    int32_t whole[2 * GEN], split[2 * GEN];
    dj_test_ids cw = {whole, 0, 2 * GEN}, cs = {split, 0, 2 * GEN};
    dj_client_t *c = NULL;
    uint64_t sid = 0, secret = 0;
    const dj_session_opts so = {.model = "demo", .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 256};
    /* without interruption */
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    CHECK_OK(dj_client_session_open(c, &so, &sid));
    dj_generate_params gp = {.ids = a.prompt[0], .n_ids = a.n_prompt[0], .max_tokens = GEN, .ignore_eos = true};
    CHECK_OK(dj_client_generate(c, sid, &gp, dj_test_on_ids, &cw, NULL));
    gp.ids = a.prompt[1];
    gp.n_ids = a.n_prompt[1];
    CHECK_OK(dj_client_generate(c, sid, &gp, dj_test_on_ids, &cw, NULL));
    dj_client_free(c);
    /* the same with the connection closed in between */
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    CHECK_OK(dj_client_session_open_secret(c, &so, &sid, &secret));
    gp.ids = a.prompt[0];
    gp.n_ids = a.n_prompt[0];
    CHECK_OK(dj_client_generate(c, sid, &gp, dj_test_on_ids, &cs, NULL));
    dj_client_free(c);
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    uint32_t pos = 0;
    CHECK_ST(dj_client_session_attach(c, sid, secret ^ 1, &pos), DJ_ENOTFOUND); /* the secret matters */
    dj_client_free(c); /* (a wrong id closes nothing, but start clean) */
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    /* the old connection's close may still be on its way: the session becomes attachable once it is seen */
    dj_status st = DJ_ENOTFOUND;
    for (int i = 0; i < 3000 && st == DJ_ENOTFOUND; i++) { /* 30 s: a bound for a stuck daemon */
        st = dj_client_session_attach(c, sid, secret, &pos);
        if (st == DJ_ENOTFOUND) dj_test_sleep_ms(10);
    }
    CHECK_OK(st);
    CHECK_MSG(pos == a.n_prompt[0] + GEN - 1, "attached at position %u", pos);
    gp.ids = a.prompt[1];
    gp.n_ids = a.n_prompt[1];
    CHECK_OK(dj_client_generate(c, sid, &gp, dj_test_on_ids, &cs, NULL));
    CHECK(cw.n == 2 * GEN && cs.n == 2 * GEN);
    CHECK_MSG(memcmp(whole, split, sizeof whole) == 0, "a reattached session's tokens differ");
    dj_client_free(c);
    dj_test_daemon_stop(slot, 10000);
}

int main(void) {
    dj_test_seeds();
    base_seed = dj_test_rand();
    dj_test_daemon_guard();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/djinn_agents_%d", (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", tmpdir);
    if (system(cmd) != 0) return 1;
    agents("semantic", 0);
    agents("recompute", 1);
    reattach(2);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return dj_test_finish("test_server_agents");
}
