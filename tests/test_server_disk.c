/* test_server_disk.c: djinnd's KV disk tier on the CPU engine - 32 agents with
 * pauses over a data segment that holds 3 and a swap pool that holds 1, the
 * rest on disk: every token equal to the agent's run alone; a page file
 * corrupted under a session on disk: it is recomputed from its history, the
 * same tokens; bad --state-dir arguments refused at start. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client_util.h"
#include "daemon_util.h"
#include "djinn/client.h"
#include "testutil.h"

/* Under ASan (a Debug build, several times slower) fewer agents: the same
 * oversubscription of the segment and the pool. */
#if defined(__SANITIZE_ADDRESS__)
#define N_AGENTS 6
#else
#define N_AGENTS 32
#endif
#define ROUNDS DJ_TEST_AGENT_ROUNDS
#define PROMPT0 100 /* + GEN: 110 positions, 2 pages of 64 positions in each of 8 layers: 1 MiB */
#define GEN DJ_TEST_AGENT_GEN
#define VOCAB 4096

static char tmpdir[256];
static uint64_t base_seed;

typedef dj_test_agent agent; /* client_util.h */

/* Deterministic per-agent prompts and pauses (from the run's seed). */
static void make_agent(agent *a, int idx, uint64_t seed) { dj_test_agent_make(a, idx, seed, PROMPT0, 6, VOCAB, 60); }

static pid_t start(int slot, const char *const *extra, char *addr, size_t cap, int *code) {
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = DJ_SOURCE_DIR "/models",
                                   .listen = "127.0.0.1:0", .save_stderr = true, .wait_ms = 20000};
    *code = 0;
    return dj_test_daemon_start(slot, &o, extra, addr, cap, code);
}

/* The daemon's stderr of slot (its start error), into buf. */
static const char *daemon_err(int slot, char *buf, size_t cap) {
    char path[320];
    snprintf(path, sizeof path, "%s/err%d", tmpdir, slot);
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return buf;
    const size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static bool stats(const char *addr, dj_client_stats *st) {
    dj_client_t *c = NULL;
    if (dj_client_connect(addr, NULL, &c) != DJ_OK) return false;
    const bool ok = dj_client_stats_get(c, st) == DJ_OK;
    dj_client_free(c);
    return ok;
}

static agent alone[N_AGENTS];

/* Every agent alone on a roomy daemon: the tokens to match. */
static void references(int slot) {
    char addr[64];
    int code;
    const char *roomy[] = {"--vmu-gb", "64m", NULL};
    if (start(slot, roomy, addr, sizeof addr, &code) <= 0) {
        CHECK_MSG(false, "djinnd did not start (exit %d)", code);
        return;
    }
    for (int i = 0; i < N_AGENTS; i++) make_agent(&alone[i], i, base_seed);
    dj_test_agents_alone(alone, N_AGENTS, addr);
    dj_test_daemon_stop(slot, 10000);
}

/* The crowd on a segment for 3, a pool for 1, the disk for the rest. */
static void crowd(int slot) {
    static agent crowd[N_AGENTS];
    char addr[64], dir[320];
    snprintf(dir, sizeof dir, "%s/state", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    const char *tight[] = {"--vmu-gb", "64m", "--data-gb", "3m", "--swap-gb", "1m", "--state-dir", dir,
                           "--disk-swap-gb", "64m", "--idle-ms", "20", "--threads", "1", "--local-admin", NULL};
    int code;
    if (start(slot, tight, addr, sizeof addr, &code) <= 0) {
        char e[2048];
        CHECK_MSG(false, "djinnd did not start (exit %d): %s", code, daemon_err(slot, e, sizeof e));
        return;
    }
    for (int i = 0; i < N_AGENTS; i++) make_agent(&crowd[i], i, base_seed);
    int differ = 0;
    const int failed = dj_test_agents_crowd(crowd, alone, N_AGENTS, addr, "crowd", &differ);
    dj_client_stats st;
    memset(&st, 0, sizeof st);
    CHECK(stats(addr, &st));
    printf("%d agents over a segment for 3 and a pool for 1: %d failed, %d differ; disk: %llu spills (%.1f MiB, "
           "%.3f s), %llu reads (%.1f MiB, %.3f s), %s I/O, peak %.1f MiB; pool peak %.1f MiB\n",
           N_AGENTS, failed, differ, (unsigned long long)st.disk.spills, st.disk.bytes_written / 1048576.0,
           st.disk.write_s, (unsigned long long)st.disk.reads, st.disk.bytes_read / 1048576.0, st.disk.read_s,
           st.disk.direct ? "direct" : "buffered", st.disk.peak / 1048576.0, st.swap.pool_peak / 1048576.0);
    CHECK(failed == 0);
    CHECK(differ == 0);
    /* the pool could not hold them: sessions went on to disk and came back, whole */
    CHECK(st.disk.enabled && st.disk.spills > 0 && st.disk.reads > 0);
    CHECK(st.disk.bad_pages == 0 && st.disk.recoveries == 0);
    CHECK(st.disk.used == 0 && st.disk.sessions == 0 && st.swap.pool_used == 0); /* all closed: nothing left */
    dj_client_stats_free(&st);
    dj_test_daemon_stop(slot, 10000);
}

/* Two sessions paused, three more push them out: one into the pool, one on
 * to disk. The page file's pages are then overwritten: the one on disk fails
 * its checksums on resume and is recomputed from its history - its next
 * round's tokens are those of the agent alone. */
static void corrupted(int slot) {
    char addr[64], dir[320], path[360];
    snprintf(dir, sizeof dir, "%s/state2", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/kv-pages.djinn", dir);
    const char *tight[] = {"--vmu-gb", "64m", "--data-gb", "3m", "--swap-gb", "1m", "--state-dir", dir,
                           "--disk-swap-gb", "16m", "--idle-ms", "600000", "--threads", "1", "--local-admin", NULL};
    int code;
    if (start(slot, tight, addr, sizeof addr, &code) <= 0) {
        char e[2048];
        CHECK_MSG(false, "djinnd did not start (exit %d): %s", code, daemon_err(slot, e, sizeof e));
        return;
    }
    agent a[5];
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (!c) return;
    const dj_session_opts so = {.model = "demo", .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 256};
    uint64_t sid[5] = {0};
    for (int i = 0; i < 5; i++) {
        make_agent(&a[i], i, base_seed); /* agents 0-4: their references are alone[0-4] */
        CHECK_OK(dj_client_session_open(c, &so, &sid[i]));
        CHECK_OK(dj_test_agent_generate(c, sid[i], &a[i], 0));
        if (i < 2) CHECK_OK(dj_client_session_pause(c, sid[i], 0)); /* a tool call of unknown length */
    }
    dj_client_stats st;
    CHECK(stats(addr, &st));
    CHECK_MSG(st.disk.sessions == 1 && st.disk.spills == 1, "%llu sessions on disk after %llu spills",
              (unsigned long long)st.disk.sessions, (unsigned long long)st.disk.spills);
    dj_client_stats_free(&st);
    /* every page of the file but its header overwritten */
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    struct stat sb;
    CHECK(fd >= 0 && fstat(fd, &sb) == 0);
    static uint8_t junk[1 << 16];
    memset(junk, 0x5a, sizeof junk);
    for (off_t off = 4096; fd >= 0 && off < sb.st_size; off += (off_t)sizeof junk)
        CHECK(pwrite(fd, junk, sizeof junk, off) > 0);
    if (fd >= 0) close(fd);
    /* the three others go; the two come back and go on */
    for (int i = 2; i < 5; i++) CHECK_OK(dj_client_session_close(c, sid[i]));
    for (int i = 0; i < 2; i++) {
        CHECK_OK(dj_client_session_resume(c, sid[i]));
        for (int r = 1; r < ROUNDS; r++) CHECK_OK(dj_test_agent_generate(c, sid[i], &a[i], r));
        CHECK_MSG(dj_test_agent_same(&alone[i], &a[i], ROUNDS, "after corruption"), "agent %d: tokens differ", i);
    }
    CHECK(stats(addr, &st));
    printf("a corrupted page file: %llu bad pages, %llu failed reads, %llu sessions recomputed from history\n",
           (unsigned long long)st.disk.bad_pages, (unsigned long long)st.disk.failed_reads,
           (unsigned long long)st.disk.recoveries);
    CHECK(st.disk.bad_pages > 0 && st.disk.failed_reads == 1 && st.disk.recoveries == 1);
    CHECK(st.disk.sessions == 0 && st.disk.used == 0);
    dj_client_stats_free(&st);
    dj_client_free(c);
    dj_test_daemon_stop(slot, 10000);
}

/* Bad arguments: the daemon does not start, and says why. */
static void bad_args(int slot) {
    char addr[64], dir[320], err[4096], path[360];
    struct {
        const char *why;
        const char *args[12];
        const char *want;
    } cases[] = {
        {"missing dir", {"--state-dir", "/nonexistent/djinn-state", "--disk-swap-gb", "1m", NULL},
         "make the directory first"},
        {"no size", {"--state-dir", "/tmp", NULL}, "go together"},
        {"no pool", {"--state-dir", tmpdir, "--disk-swap-gb", "1m", "--swap-gb", "0", NULL}, "no"},
        {"recompute policy", {"--state-dir", tmpdir, "--disk-swap-gb", "1m", "--swap-policy", "recompute", NULL},
         "needs --swap-policy semantic"},
        {"too big", {"--state-dir", tmpdir, "--disk-swap-gb", "8192g", NULL}, "cannot reserve"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int code = 0;
        const pid_t pid = start(slot, cases[k].args, addr, sizeof addr, &code);
        CHECK_MSG(pid < 0 && code != 0, "%s: djinnd started", cases[k].why);
        if (pid > 0) dj_test_daemon_stop(slot, 10000);
        CHECK_MSG(strstr(daemon_err(slot, err, sizeof err), cases[k].want) != NULL, "%s: its error: %s", cases[k].why,
                  err);
    }
    /* a file of another program's in the state dir: refused, left as it was */
    snprintf(dir, sizeof dir, "%s/foreign", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/kv-pages.djinn", dir);
    FILE *f = fopen(path, "w");
    fputs("not yours\n", f);
    fclose(f);
    const char *args[] = {"--state-dir", dir, "--disk-swap-gb", "1m", NULL};
    int code = 0;
    const pid_t pid = start(slot, args, addr, sizeof addr, &code);
    CHECK(pid < 0 && code != 0);
    if (pid > 0) dj_test_daemon_stop(slot, 10000);
    CHECK_MSG(strstr(daemon_err(slot, err, sizeof err), "not a Djinn page file") != NULL, "its error: %s", err);
    struct stat sb;
    CHECK(stat(path, &sb) == 0 && sb.st_size == 10);
}

int main(void) {
    dj_test_seeds();
    base_seed = dj_test_rand();
    dj_test_daemon_guard();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/djinn_disk_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s; mkdir -p %s", tmpdir, tmpdir);
    if (system(cmd) != 0) return 1;
    bad_args(0);
    references(1);
    crowd(2);
    corrupted(3);
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return dj_test_finish("test_server_disk");
}
