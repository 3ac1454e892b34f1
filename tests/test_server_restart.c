/* test_server_restart.c: sessions that leave a djinnd (CPU engine, demo model) -
 * exported and imported on another daemon, greedy and seeded: every token equal to a run that never moved. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_util.h"
#include "daemon_util.h"
#include "djinn/client.h"
#include "server/persist.h"
#include "testutil.h"

#define ROUNDS DJ_TEST_AGENT_ROUNDS
#define GEN DJ_TEST_AGENT_GEN
#define VOCAB 4096

static char tmpdir[256];
static uint64_t base_seed;

static pid_t start(int slot, const char *const *extra, char *addr, size_t cap) {
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = DJ_SOURCE_DIR "/models",
                                   .listen = "127.0.0.1:0", .save_stderr = true, .wait_ms = 20000};
    int code = 0;
    const pid_t pid = dj_test_daemon_start(slot, &o, extra, addr, cap, &code);
    CHECK_MSG(pid > 0, "djinnd in slot %d did not start (exit %d)", slot, code);
    return pid;
}

/* One round of agent a on session sid: its prompt of round r, GEN tokens
 * sampled with sp (greedy when temperature is 0), into out[GEN]. */
static dj_status round_of(dj_client_t *c, uint64_t sid, const dj_test_agent *a, int r, const dj_sampler_params *sp,
                          int32_t *out) {
    dj_test_ids col = {out, 0, GEN};
    dj_generate_params gp = {.ids = a->prompt[r], .n_ids = a->n_prompt[r], .max_tokens = GEN, .ignore_eos = true};
    if (sp) gp.sampling = *sp;
    const dj_status st = dj_client_generate(c, sid, &gp, dj_test_on_ids, &col, NULL);
    if (st == DJ_OK && col.n != GEN) return dj_fail(DJ_EINTERNAL, "%u tokens, %d wanted", col.n, GEN);
    return st;
}

static bool same_round(const int32_t *x, const int32_t *y, const char *what, int r) {
    if (!memcmp(x, y, GEN * sizeof *x)) return true;
    fprintf(stderr, "%s round %d: never moved", what, r);
    for (int k = 0; k < GEN; k++) fprintf(stderr, " %d", x[k]);
    fprintf(stderr, "; moved");
    for (int k = 0; k < GEN; k++) fprintf(stderr, " %d", y[k]);
    fputc('\n', stderr);
    return false;
}

static const dj_session_opts so = {.model = "demo", .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 256};

/* A session run ROUNDS rounds on daemon A; another run round 0 on A,
 * exported, imported on B, round 1 there, exported again, imported on A,
 * round 2: every round's tokens equal. sp NULL: greedy. */
static void move_between(const char *a_addr, const char *b_addr, int idx, const dj_sampler_params *sp,
                         const char *what) {
    dj_test_agent ag;
    dj_test_agent_make(&ag, idx, base_seed, 60, 8, VOCAB, 1);
    int32_t ref[ROUNDS][GEN], moved[ROUNDS][GEN];
    dj_client_t *a = NULL, *b = NULL;
    CHECK_OK(dj_client_connect(a_addr, NULL, &a));
    CHECK_OK(dj_client_connect(b_addr, NULL, &b));
    if (!a || !b) goto out;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, secret = 0;
    CHECK_OK(dj_client_session_open(a, &so, &s0));
    for (int r = 0; r < ROUNDS; r++) CHECK_OK(round_of(a, s0, &ag, r, sp, ref[r]));
    CHECK_OK(dj_client_session_close(a, s0));

    CHECK_OK(dj_client_session_open(a, &so, &s1));
    CHECK_OK(round_of(a, s1, &ag, 0, sp, moved[0]));
    uint8_t *img = NULL;
    size_t n = 0;
    CHECK_OK(dj_client_session_export(a, s1, &img, &n));
    CHECK_OK(dj_client_session_close(a, s1));
    dj__simg si;
    CHECK_OK(dj__simg_decode(img, n, &si));
    CHECK_MSG(si.kv.n_blocks > 0 && si.n_hist == si.kv.pos && si.kv.pos == ag.n_prompt[0] + GEN - 1,
              "%s: an image of %u blocks, %u history tokens, position %u", what, si.kv.n_blocks, si.n_hist, si.kv.pos);
    uint32_t pos = 0;
    CHECK_OK(dj_client_session_import(b, img, n, &s2, &secret, &pos));
    CHECK(secret != 0 && pos == si.kv.pos);
    free(img);
    img = NULL;
    CHECK_OK(round_of(b, s2, &ag, 1, sp, moved[1]));
    char path[400];
    snprintf(path, sizeof path, "%s/moved-%d.djs", tmpdir, idx);
    CHECK_OK(dj_client_session_export_file(b, s2, path));
    CHECK_OK(dj_client_session_close(b, s2));
    CHECK_OK(dj_client_session_import_file(a, path, &s3, NULL, NULL));
    CHECK_OK(round_of(a, s3, &ag, 2, sp, moved[2]));
    CHECK_OK(dj_client_session_close(a, s3));
    for (int r = 0; r < ROUNDS; r++) CHECK_MSG(same_round(ref[r], moved[r], what, r), "%s: round %d differs", what, r);
    printf("%s: moved A -> B -> A, %d rounds of %d tokens equal\n", what, ROUNDS, GEN);
out:
    dj_client_free(a);
    dj_client_free(b);
}

/* A session whose KV is swapped out (paused, then pushed out of a data
 * segment for 3 by three more) is exported as its history, which the
 * importer feeds again: the same tokens. */
static void move_swapped(const char *a_addr, const char *b_addr) {
    dj_test_agent ag;
    dj_test_agent_make(&ag, 7, base_seed, 60, 8, VOCAB, 1);
    int32_t ref[ROUNDS][GEN], moved[ROUNDS][GEN];
    dj_client_t *a = NULL, *b = NULL;
    CHECK_OK(dj_client_connect(a_addr, NULL, &a));
    CHECK_OK(dj_client_connect(b_addr, NULL, &b));
    if (!a || !b) goto out;
    uint64_t s0 = 0, s1 = 0, s2 = 0;
    CHECK_OK(dj_client_session_open(a, &so, &s0));
    for (int r = 0; r < 2; r++) CHECK_OK(round_of(a, s0, &ag, r, NULL, ref[r]));
    CHECK_OK(dj_client_session_close(a, s0));
    CHECK_OK(dj_client_session_open(a, &so, &s1));
    CHECK_OK(round_of(a, s1, &ag, 0, NULL, moved[0]));
    CHECK_OK(dj_client_session_pause(a, s1, 0));
    uint64_t others[3] = {0};
    for (int i = 0; i < 3; i++) {
        dj_test_agent o;
        dj_test_agent_make(&o, 20 + i, base_seed, 100, 8, VOCAB, 1);
        int32_t tmp[GEN];
        CHECK_OK(dj_client_session_open(a, &so, &others[i]));
        CHECK_OK(round_of(a, others[i], &o, 0, NULL, tmp));
    }
    uint8_t *img = NULL;
    size_t n = 0;
    dj__simg si;
    memset(&si, 0, sizeof si);
    si.kv.n_blocks = 1;
    /* the scheduler swaps an idle paused session out after --idle-ms: wait for it (at most 10 s) */
    for (int k = 0; k < 200 && si.kv.n_blocks; k++) {
        free(img);
        img = NULL;
        CHECK_OK(dj_client_session_export(a, s1, &img, &n));
        if (!img || dj__simg_decode(img, n, &si) != DJ_OK) break;
        if (si.kv.n_blocks) dj_test_sleep_ms(50);
    }
    CHECK_MSG(img && si.kv.n_blocks == 0 && si.n_hist == si.kv.pos && si.kv.pos > 0,
              "swapped: an image of %u blocks and %u history tokens", si.kv.n_blocks, si.n_hist);
    CHECK_OK(dj_client_session_close(a, s1));
    for (int i = 0; i < 3; i++) CHECK_OK(dj_client_session_close(a, others[i]));
    if (img) CHECK_OK(dj_client_session_import(b, img, n, &s2, NULL, NULL));
    free(img);
    CHECK_OK(round_of(b, s2, &ag, 1, NULL, moved[1]));
    CHECK_OK(dj_client_session_close(b, s2));
    for (int r = 0; r < 2; r++) CHECK_MSG(same_round(ref[r], moved[r], "swapped", r), "swapped: round %d differs", r);
    printf("a swapped-out session moved as its history: equal tokens\n");
out:
    dj_client_free(a);
    dj_client_free(b);
}

typedef struct {
    const dj__simg *img;
} page_src;
static dj_status page_of(void *ctx, uint32_t i, void *buf) { return dj__simg_page(((page_src *)ctx)->img, i, buf); }

/* Damaged and foreign images: refused with the reason, the connection
 * stays, nothing opened. */
static void bad_images(const char *addr) {
    dj_test_agent ag;
    dj_test_agent_make(&ag, 9, base_seed, 40, 8, VOCAB, 1);
    int32_t out[GEN];
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (!c) return;
    uint64_t sid = 0, s2 = 0;
    CHECK_OK(dj_client_session_open(c, &so, &sid));
    CHECK_OK(round_of(c, sid, &ag, 0, NULL, out));
    uint8_t *img = NULL;
    size_t n = 0;
    CHECK_OK(dj_client_session_export(c, sid, &img, &n));
    if (!img) goto out;
    dj__simg si;
    CHECK_OK(dj__simg_decode(img, n, &si));
    uint8_t *bad = malloc(n);
    struct {
        const char *why;
        size_t off;   /* byte flipped (SIZE_MAX: none) */
        size_t len;   /* bytes sent */
        dj_status st;
        const char *want;
    } cases[] = {
        {"a page's byte", n - 8 - 100, n, DJ_EIO, "failed its checksum"},
        {"the header", 30, n, DJ_EINVAL, "header is damaged"},
        {"the history", DJ__SIMG_HEADER_BYTES + 4, n, DJ_EINVAL, "history is damaged"},
        {"cut short", SIZE_MAX, n - 1, DJ_EINVAL, "cut short"},
        {"not an image", 0, n, DJ_EINVAL, "not a Djinn session image"},
    };
    for (size_t k = 0; bad && k < sizeof cases / sizeof *cases; k++) {
        memcpy(bad, img, n);
        if (cases[k].off != SIZE_MAX) bad[cases[k].off] ^= 0x40;
        const dj_status st = dj_client_session_import(c, bad, cases[k].len, &s2, NULL, NULL);
        CHECK_MSG(st == cases[k].st && strstr(dj_last_error(), cases[k].want), "%s: %s (%s)", cases[k].why,
                  dj_status_name(st), dj_last_error());
    }
    /* another checkpoint's session: the fingerprint differs, named */
    dj__simg other = si;
    other.fingerprint ^= 0x1234;
    page_src ps = {&si};
    if (bad && dj__simg_encode(&other, page_of, &ps, bad, n) == DJ_OK) {
        const dj_status st = dj_client_session_import(c, bad, n, &s2, NULL, NULL);
        CHECK_MSG(st == DJ_EINVAL && strstr(dj_last_error(), "fingerprint"), "foreign model: %s (%s)",
                  dj_status_name(st), dj_last_error());
    }
    free(bad);
    /* the connection is still good: the real image imports */
    CHECK_OK(dj_client_session_import(c, img, n, &s2, NULL, NULL));
    CHECK_OK(dj_client_session_close(c, s2));
    free(img);
    printf("damaged, cut and foreign images refused with the reason\n");
out:
    CHECK_OK(dj_client_session_close(c, sid));
    dj_client_free(c);
}

/* Sessions across a SIGTERM: a daemon with --state-dir writes them at its
 * stop; the next one on the same directory restores them (ids, secrets,
 * KV); their clients reattach and go on with the tokens of a run never
 * stopped - greedy and seeded, the daemon stopped twice. */
static void restart(const char *ref_addr, int slot) {
    char dir[320], addr[64];
    snprintf(dir, sizeof dir, "%s/state", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    const char *args[] = {"--vmu-gb", "64m", "--state-dir", dir, "--disk-swap-gb", "16m", NULL};
    enum { N = 2 };
    const dj_sampler_params seeded = {.temperature = 0.9f, .top_p = 0.95f, .seed = 77 + base_seed % 1000};
    const dj_sampler_params *sp[N] = {NULL, &seeded};
    dj_test_agent ag[N];
    int32_t ref[N][ROUNDS][GEN], got[N][ROUNDS][GEN];
    uint64_t sid[N] = {0}, secret[N] = {0};
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(ref_addr, NULL, &c));
    for (int i = 0; c && i < N; i++) {
        dj_test_agent_make(&ag[i], 30 + i, base_seed, 70, 8, VOCAB, 1);
        uint64_t s0 = 0;
        CHECK_OK(dj_client_session_open(c, &so, &s0));
        for (int r = 0; r < ROUNDS; r++) CHECK_OK(round_of(c, s0, &ag[i], r, sp[i], ref[i][r]));
        CHECK_OK(dj_client_session_close(c, s0));
    }
    dj_client_free(c);
    c = NULL;
    for (int r = 0; r < ROUNDS; r++) {
        if (start(slot, args, addr, sizeof addr) <= 0) return;
        CHECK_OK(dj_client_connect(addr, NULL, &c));
        for (int i = 0; c && i < N; i++) {
            if (r == 0) CHECK_OK(dj_client_session_open_secret(c, &so, &sid[i], &secret[i]));
            else {
                uint32_t pos = 0;
                CHECK_OK(dj_client_session_attach(c, sid[i], secret[i], &pos));
                CHECK_MSG(pos == ag[i].n_prompt[0] + (uint32_t)(r - 1) * ag[i].n_prompt[1] + (uint32_t)r * GEN - 1,
                          "session %d after restart %d: position %u", i, r, pos);
            }
            CHECK_OK(round_of(c, sid[i], &ag[i], r, sp[i], got[i][r]));
        }
        dj_client_free(c); /* the sessions stay, orphaned, for their lease */
        c = NULL;
        CHECK_MSG(dj_test_daemon_stop(slot, 20000) == 0, "djinnd did not exit 0 at SIGTERM (restart %d)", r);
        if (getenv("DJ_TEST_VERBOSE")) {
            char cmd[800];
            snprintf(cmd, sizeof cmd, "grep -E 'restor|saved|released|session=' %s/err%d", tmpdir, slot);
            if (system(cmd) != 0) fprintf(stderr, "(no lines)\n");
        }
    }
    for (int i = 0; i < N; i++)
        for (int r = 0; r < ROUNDS; r++)
            CHECK_MSG(same_round(ref[i][r], got[i][r], sp[i] ? "restart, seeded" : "restart, greedy", r),
                      "session %d round %d differs across a restart", i, r);
    printf("%d sessions (greedy, seeded) across %d SIGTERM restarts: every token equal\n", N, ROUNDS - 1);
}

/* ---- the bar: 16 agents with pauses while djinnd is restarted twice ---- */

/* Under ASan (a Debug build, several times slower) fewer agents: the test
 * runs four times (seeds) within ctest's timeout. */
#if defined(__SANITIZE_ADDRESS__)
#define N_AGENTS 6
#else
#define N_AGENTS 16
#endif

typedef struct {
    dj_test_agent a;
    const char *addr;
    int reattaches, lost_rounds; /* lost_rounds: ran, their answers lost (a kill -9), read back from the image */
} restart_agent;

/* A round that ran but whose answer was lost (the daemon killed between
 * writing the session and sending DONE): its GEN tokens are the session's
 * last GEN - 1 fed ones and its pending one, read from its image. */
static dj_status round_from_image(dj_client_t *c, uint64_t sid, int32_t *out) {
    uint8_t *img = NULL;
    size_t n = 0;
    dj_status st = dj_client_session_export(c, sid, &img, &n);
    dj__simg si;
    if (st == DJ_OK) st = dj__simg_decode(img, n, &si);
    if (st == DJ_OK && (si.n_hist < GEN - 1 || si.pending < 0))
        st = dj_fail(DJ_EINTERNAL, "the image holds %u history tokens, pending %d", si.n_hist, si.pending);
    for (uint32_t k = 0; st == DJ_OK && k < GEN - 1; k++) out[k] = dj__simg_hist(&si, si.n_hist - (GEN - 1) + k);
    if (st == DJ_OK) out[GEN - 1] = si.pending;
    free(img);
    return st;
}

/* Connects (retrying while the daemon is away, at most 60 s) and takes the
 * session back (*sid 0: opens it). */
static dj_status agent_connect(restart_agent *ra, dj_client_t **c, uint64_t *sid, uint64_t *secret, uint32_t *pos) {
    dj_status st = DJ_EIO;
    for (int k = 0; k < 1200; k++) {
        if ((st = dj_client_connect(ra->addr, NULL, c)) == DJ_OK) {
            st = *sid ? dj_client_session_attach(*c, *sid, *secret, pos) : dj_client_session_open_secret(*c, &so, sid, secret);
            if (st == DJ_OK) return DJ_OK;
            dj_client_free(*c);
            *c = NULL;
        }
        dj_test_sleep_ms(50);
    }
    return st;
}

/* The agent's rounds, each retried after a restart from where the session
 * is: a round the daemon refused or cut is sent again once reattached, if
 * the session's position says it did not run (else its tokens were lost:
 * counted). */
static void *restart_agent_main(void *p) {
    restart_agent *ra = p;
    dj_test_agent *a = &ra->a;
    dj_client_t *c = NULL;
    uint64_t sid = 0, secret = 0;
    uint32_t pos = 0, want_pos = 0;
    a->st = agent_connect(ra, &c, &sid, &secret, &pos);
    for (int r = 0; r < ROUNDS && a->st == DJ_OK; r++) {
        for (int attempt = 0;; attempt++) {
            dj_test_ids col = {a->out[r], 0, GEN};
            const dj_generate_params gp = {.ids = a->prompt[r], .n_ids = a->n_prompt[r], .max_tokens = GEN,
                                           .ignore_eos = true};
            a->st = dj_client_generate(c, sid, &gp, dj_test_on_ids, &col, NULL);
            a->n_out[r] = col.n;
            if (a->st == DJ_OK) break;
            if (attempt > 40) break;
            dj_client_free(c); /* the daemon is restarting (refused, or the connection closed) */
            c = NULL;
            if ((a->st = agent_connect(ra, &c, &sid, &secret, &pos)) != DJ_OK) break;
            ra->reattaches++;
            const uint32_t ran = want_pos + (uint32_t)a->n_prompt[r] + (r ? 1 : 0) + GEN - 1;
            if (pos == ran) { /* it ran, its answer lost: its tokens are in the session */
                ra->lost_rounds++;
                a->st = round_from_image(c, sid, a->out[r]);
                a->n_out[r] = GEN;
                break;
            }
            if (pos != want_pos) {
                snprintf(a->err, sizeof a->err, "round %d: the session is at %u, not %u", r, pos, want_pos);
                a->st = DJ_EINTERNAL;
                break;
            }
        }
        if (a->st != DJ_OK) break;
        want_pos += (uint32_t)a->n_prompt[r] + (r ? 1 : 0) + GEN - 1;
        if (dj_client_session_pause(c, sid, (uint64_t)a->pause_ms[r] + 5) == DJ_OK) {
            dj_test_sleep_ms(a->pause_ms[r]);
            (void)dj_client_session_resume(c, sid); /* a restart in the pause: the next round reattaches */
        }
    }
    if (a->st != DJ_OK && !a->err[0]) snprintf(a->err, sizeof a->err, "%s", dj_last_error());
    if (c && sid) (void)dj_client_session_close(c, sid);
    dj_client_free(c);
    return NULL;
}

/* kill9: --persist always, and the daemon killed (SIGKILL) instead of SIGTERMed. */
static void agents_across_restarts(const char *ref_addr, int slot, bool kill9) {
    static dj_test_agent alone[N_AGENTS];
    static bool have_alone;
    static restart_agent ra[N_AGENTS];
    if (!have_alone) {
        for (int i = 0; i < N_AGENTS; i++) dj_test_agent_make(&alone[i], 40 + i, base_seed, 60, 8, VOCAB, 150);
        dj_test_agents_alone(alone, N_AGENTS, ref_addr);
        have_alone = true;
    }
    const char *what = kill9 ? "kill -9, --persist always" : "SIGTERM";
    char dir[320], listen[64], addr[64], port[16];
    snprintf(dir, sizeof dir, "%s/state16%s", tmpdir, kill9 ? "k" : "");
    CHECK(mkdir(dir, 0700) == 0);
    const int p = dj_test_free_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", p);
    snprintf(port, sizeof port, "%d", p);
    const char *args[] = {"--vmu-gb", "64m", "--state-dir", dir, "--disk-swap-gb", "16m", "--lease-ms", "30000",
                          "--persist", kill9 ? "always" : "on-stop", NULL};
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = DJ_SOURCE_DIR "/models",
                                   .listen = listen, .save_stderr = true, .wait_ms = 20000};
    int code = 0;
    pid_t pid = dj_test_daemon_start(slot, &o, args, addr, sizeof addr, &code);
    if (pid <= 0) {
        CHECK_MSG(false, "djinnd did not start (exit %d)", code);
        return;
    }
    pthread_t th[N_AGENTS];
    for (int i = 0; i < N_AGENTS; i++) {
        ra[i] = (restart_agent){.a = alone[i], .addr = addr};
        memset(ra[i].a.out, 0, sizeof ra[i].a.out);
        pthread_create(&th[i], NULL, restart_agent_main, &ra[i]);
    }
    for (int k = 0; k < 2; k++) { /* twice: SIGTERM mid-run, the same state dir again */
        dj_test_sleep_ms(150 + 200 * k);
        if (kill9) {
            kill(pid, SIGKILL);
            (void)dj_test_daemon_stop(slot, 10000); /* reaps it */
        } else {
            CHECK_MSG(dj_test_daemon_stop(slot, 60000) == 0, "restart %d: djinnd did not exit 0 at SIGTERM", k);
        }
        if ((pid = dj_test_daemon_start(slot, &o, args, addr, sizeof addr, &code)) <= 0) {
            CHECK_MSG(false, "restart %d: djinnd did not start again (exit %d)", k, code);
            break;
        }
    }
    int failed = 0, differ = 0, reattaches = 0, lost = 0;
    for (int i = 0; i < N_AGENTS; i++) {
        pthread_join(th[i], NULL);
        reattaches += ra[i].reattaches;
        lost += ra[i].lost_rounds;
        if (ra[i].a.st != DJ_OK) {
            failed++;
            fprintf(stderr, "agent %d failed: %s\n", i, ra[i].a.err);
        } else if (!dj_test_agent_same(&alone[i], &ra[i].a, ROUNDS, "across restarts")) {
            differ++;
        }
    }
    printf("%d agents with pauses, djinnd restarted twice (%s): %d failed, %d differ, %d reattaches, %d answers "
           "lost and read back from the session\n", N_AGENTS, what, failed, differ, reattaches, lost);
    if (!kill9) CHECK(lost == 0); /* a drain answers what it took */
    CHECK(failed == 0 && differ == 0);
    CHECK_MSG(reattaches > 0, "no agent saw a restart (the restarts came too late)");
    dj_test_daemon_stop(slot, 20000);
}

int main(void) {
    dj_test_seeds();
    base_seed = dj_test_rand();
    dj_test_daemon_guard();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/djinn_restart_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s; mkdir -p %s", tmpdir, tmpdir);
    if (system(cmd) != 0) return 1;
    char a_addr[64], b_addr[64];
    const char *roomy[] = {"--vmu-gb", "64m", NULL};
    const char *tight[] = {"--vmu-gb", "64m", "--data-gb", "3m", "--swap-gb", "4m", "--idle-ms", "20", NULL};
    char t_addr[64];
    if (start(0, roomy, a_addr, sizeof a_addr) > 0 && start(1, roomy, b_addr, sizeof b_addr) > 0 &&
        start(2, tight, t_addr, sizeof t_addr) > 0) {
        move_between(a_addr, b_addr, 0, NULL, "greedy");
        const dj_sampler_params sp = {.temperature = 0.9f, .top_p = 0.95f, .seed = 1234 + base_seed % 1000};
        move_between(a_addr, b_addr, 1, &sp, "seeded");
        move_swapped(t_addr, a_addr);
        bad_images(a_addr);
        restart(a_addr, 3);
        agents_across_restarts(a_addr, 4, false);
        agents_across_restarts(a_addr, 5, true);
    }
    for (int k = 0; k < 6; k++) dj_test_daemon_stop(k, 10000);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return dj_test_finish("test_server_restart");
}
