/* test_server_reload.c: djinnd's --config FILE (bad lines refused naming the line, the command line
 * overriding the file), the model store checked at start (--allow-empty), and SIGHUP: a changed token
 * file is taken (a new token accepted, a removed one refused) while an open session keeps generating. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "djinn/client.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_reload_XXXXXX";
static char store[400], empty[400];

static void write_file(const char *name, const char *text, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", tmpdir, name);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
    CHECK(rename(tmp, path) == 0); /* whole or not at all, as an operator's editor may not */
}

/* djinnd ARGS... run to its exit; its exit code, its stderr in err[cap]. */
static int run_djinnd(const char *args, char *err, size_t cap) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1 >/dev/null", DJ_DJINND, args);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(err, 1, cap - 1, p) : 0;
    err[n] = '\0';
    const int st = p ? pclose(p) : -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_bad_configs(void) {
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"# a comment\nlisten = 127.0.0.1:0\n\nlease-ms = soon\n", "line 4: --lease-ms 'soon' is not a valid count"},
        {"[djinnd]\nmodles = /srv/models\n", "line 2: unknown option 'modles'"},
        {"listen = 127.0.0.1:0\nthreads 4\n", "line 2: not NAME = VALUE"},
        {"[server]\nthreads = 4\n", "line 2: section [server]"},
        {"Threads = 4\n", "line 1: 'Threads' is not an option name"},
        {"config = other.conf\n", "line 1: unknown option 'config'"},
        {"mixed-steps = sometimes\n", "line 1: --mixed-steps 'sometimes': want on, off, short or auto"},
        {"log-level = loud\n", "line 1: --log-level 'loud'"},
        {"allow-empty = perhaps\n", "line 1: --allow-empty 'perhaps': want on or off"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char path[600], args[1400], err[4096];
        write_file("bad.conf", bad[i].text, path, sizeof path);
        snprintf(args, sizeof args, "--config %s --models %s", path, store);
        const int rc = run_djinnd(args, err, sizeof err);
        char want[1400];
        snprintf(want, sizeof want, "djinnd: --config %s %s", path, bad[i].want);
        CHECK_MSG(rc == 2 && strstr(err, want), "config %zu: exit %d, '%s' (want '%s')", i, rc, err, want);
    }
    char err[4096], args[1400];
    snprintf(args, sizeof args, "--config %s/no-such.conf", tmpdir);
    CHECK(run_djinnd(args, err, sizeof err) == 2 && strstr(err, "no-such.conf: No such file"));
    /* --version answers whatever the file */
    char path[600];
    write_file("bad.conf", "junk\n", path, sizeof path);
    snprintf(args, sizeof args, "--config %s --version", path);
    CHECK(run_djinnd(args, err, sizeof err) == 0);
    /* the store: missing, empty (refused), empty with --allow-empty (a warning, then it serves) */
    snprintf(args, sizeof args, "--models %s/no-store --listen 127.0.0.1:0", tmpdir);
    CHECK_MSG(run_djinnd(args, err, sizeof err) == 1 && strstr(err, "no-store: No such file"), "'%s'", err);
    snprintf(args, sizeof args, "--models %s --listen 127.0.0.1:0", empty);
    CHECK_MSG(run_djinnd(args, err, sizeof err) == 1 && strstr(err, "holds no model") && strstr(err, "--allow-empty"),
              "'%s'", err);
}

/* HELLO's lease_ms with djinnd on config text and extra flags; 0 when it did not start. */
static uint64_t lease_of(const char *conf_text, const char *const *extra) {
    char path[600];
    write_file("lease.conf", conf_text, path, sizeof path);
    const char *args[12] = {"--config", path};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 11; i++) args[n++] = extra[i];
    args[n] = NULL;
    dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = store, .listen = "127.0.0.1:0",
                             .wait_ms = 60000};
    char addr[128];
    if (dj_test_daemon_start(1, &o, args, addr, sizeof addr, NULL) < 0) return 0;
    dj_test_frame ans;
    const int fd = dj_test_raw_hello(addr, 10, NULL, &ans);
    uint64_t lease = 0;
    if (fd >= 0) {
        close(fd);
        /* dj_test_raw_hello does not read fields: again, asking for lease_ms */
        int fd2 = dj_test_raw_connect(addr, NULL, 10, 0);
        dj__mw w;
        uint8_t m[256];
        dj__mw_init(&w);
        dj__mw_u64(&w, "version", DJ_PROTO_VERSION);
        const size_t mn = dj_test_meta_of(&w, m);
        if (fd2 >= 0 && dj_test_raw_send(fd2, DJ_MSG_HELLO, 1, m, mn, 0)) lease = dj_test_raw_frame(fd2, "lease_ms").val;
        if (fd2 >= 0) close(fd2);
    }
    CHECK(dj_test_daemon_stop(1, 30000) == 0);
    return lease;
}

static void test_file_and_flags(void) {
    CHECK_MSG(lease_of("lease-ms = 4321\n", NULL) == 4321, "the file's lease");
    const char *flag[] = {"--lease-ms", "7654", NULL};
    CHECK_MSG(lease_of("lease-ms = 4321\n", flag) == 7654, "the command line overrides the file");
    /* an empty store serves with allow-empty from the file */
    char path[600];
    write_file("empty.conf", "allow-empty = on\n", path, sizeof path);
    const char *args[] = {"--config", path, NULL};
    dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = empty, .listen = "127.0.0.1:0",
                             .wait_ms = 60000};
    char addr[128];
    CHECK(dj_test_daemon_start(1, &o, args, addr, sizeof addr, NULL) > 0);
    CHECK(dj_test_daemon_stop(1, 30000) == 0);
}

/* A fresh connection with tok: whether HELLO took it. */
static bool accepted(const char *addr, const char *tok) {
    dj_client_t *c = NULL;
    const dj_status st = dj_client_connect(addr, tok, &c);
    dj_client_free(c);
    return st == DJ_OK;
}

/* GET /v1/models at the HTTP door with tok: the status. */
static int http_status(unsigned port, const char *tok) {
    char hdr[128];
    snprintf(hdr, sizeof hdr, "Authorization: Bearer %s\r\n", tok);
    dj_test_resp r = dj_test_http_request(port, "GET", "/v1/models", hdr, NULL);
    const int st = r.status;
    dj_test_resp_free(&r);
    return st;
}

static bool generate(dj_client_t *c, uint64_t sess, int32_t first) {
    const int32_t ids[2] = {first, first + 1};
    dj_generate_params gp = {.ids = ids, .n_ids = 2, .max_tokens = 3, .ignore_eos = true};
    dj_generate_result res;
    memset(&res, 0, sizeof res);
    const dj_status st = dj_client_generate(c, sess, &gp, NULL, NULL, &res);
    if (st != DJ_OK) fprintf(stderr, "generate: %s\n", dj_last_error());
    return st == DJ_OK && res.n_generated == 3;
}

static void test_sighup(void) {
    char toks[600], conf[600], text[1200];
    write_file("tokens", "alice-secret-1 name=alice\n", toks, sizeof toks);
    snprintf(text, sizeof text, "[djinnd]\ntoken-file = %s\nmax-inflight = 64\n", toks);
    write_file("djinnd.conf", text, conf, sizeof conf);
    const char *args[] = {"--config", conf, "--http", "127.0.0.1:0", NULL};
    dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = store, .listen = "127.0.0.1:0",
                             .wait_ms = 60000, .save_stderr = true};
    char addr[128];
    const pid_t pid = dj_test_daemon_start(2, &o, args, addr, sizeof addr, NULL);
    CHECK(pid > 0);
    if (pid <= 0) return;
    const unsigned http = dj_test_http_port(tmpdir, 2);
    CHECK(http != 0);
    CHECK(accepted(addr, "alice-secret-1"));
    CHECK(!accepted(addr, "bob-secret-2"));
    CHECK(http_status(http, "bob-secret-2") == 401);
    CHECK(http_status(http, "alice-secret-1") == 200);
    /* alice's open session, before and after each reload */
    dj_client_t *a = NULL;
    uint64_t sess = 0;
    const dj_session_opts so = {.model = "demo", .expected_tokens = 64};
    CHECK_OK(dj_client_connect(addr, "alice-secret-1", &a));
    if (!a) goto out;
    CHECK_OK(dj_client_session_open(a, &so, &sess));
    CHECK(generate(a, sess, 10));

    /* bob is added */
    write_file("tokens", "alice-secret-1 name=alice\nbob-secret-2 name=bob qos=batch\n", toks, sizeof toks);
    CHECK(kill(pid, SIGHUP) == 0);
    bool bob = false;
    for (int i = 0; i < 200 && !(bob = accepted(addr, "bob-secret-2")); i++) dj_test_sleep_ms(50);
    CHECK_MSG(bob, "the new token was not accepted after SIGHUP");
    CHECK(accepted(addr, "alice-secret-1"));
    CHECK_MSG(http_status(http, "bob-secret-2") == 200, "the HTTP door refused the new token");
    CHECK_MSG(generate(a, sess, 20), "alice's session after the first reload");

    /* a token file that does not parse: the running tokens stay, the daemon too */
    write_file("tokens", "bad token\x01here\n", toks, sizeof toks);
    CHECK(kill(pid, SIGHUP) == 0);
    dj_test_sleep_ms(300);
    CHECK(accepted(addr, "bob-secret-2"));
    CHECK(kill(pid, 0) == 0);

    /* alice is removed: her open connection and session stay, a new connection is refused */
    write_file("tokens", "bob-secret-2 name=bob\n", toks, sizeof toks);
    CHECK(kill(pid, SIGHUP) == 0);
    bool gone = false;
    for (int i = 0; i < 200 && !(gone = !accepted(addr, "alice-secret-1")); i++) dj_test_sleep_ms(50);
    CHECK_MSG(gone, "the removed token was still accepted");
    CHECK_MSG(http_status(http, "alice-secret-1") == 401, "the HTTP door took the removed token");
    CHECK(http_status(http, "bob-secret-2") == 200);
    CHECK_MSG(generate(a, sess, 30), "alice's session after her token was removed");
    CHECK(accepted(addr, "bob-secret-2"));
    dj_client_free(a);
out:
    CHECK(dj_test_daemon_stop(2, 30000) == 0);
    char errf[600], buf[8192] = "";
    snprintf(errf, sizeof errf, "%s/err2", tmpdir);
    FILE *f = fopen(errf, "r");
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
        fclose(f);
    }
    CHECK_MSG(strstr(buf, "SIGHUP: reloaded (2 tokens from") && strstr(buf, "SIGHUP: reloaded (1 tokens from"),
              "stderr: %s", buf);
    CHECK_MSG(strstr(buf, "tokens kept (--token-file"), "the bad file's reload said: %s", buf);
}

/* A GENERATE of a 300-token prompt (40 KV pages of the demo model) on a fresh connection (its own
 * tenant, without a token file) and session: its status. */
static dj_status long_prompt(const char *addr) {
    dj_client_t *c = NULL;
    dj_status st = dj_client_connect(addr, NULL, &c);
    uint64_t sess = 0;
    const dj_session_opts so = {.model = "demo", .expected_tokens = 400};
    if (st == DJ_OK) st = dj_client_session_open(c, &so, &sess);
    int32_t ids[300];
    for (int i = 0; i < 300; i++) ids[i] = 5 + i;
    dj_generate_params gp = {.ids = ids, .n_ids = 300, .max_tokens = 1, .ignore_eos = true};
    if (st == DJ_OK) st = dj_client_generate(c, sess, &gp, NULL, NULL, NULL);
    dj_client_free(c);
    return st;
}

/* The lines of slot's stderr that hold needle. */
static int lines_with(int slot, const char *needle) {
    char errf[600];
    snprintf(errf, sizeof errf, "%s/err%d", tmpdir, slot);
    char *log = dj_test_read_file(errf, NULL);
    int n = 0;
    for (const char *p = log; p && (p = strstr(p, needle)); p++) n++;
    free(log);
    return n;
}

/* SIGHUP's limits: one the I/O loop reads (sessions per connection), one of the engine thread's
 * (the KV quota) and one of the HTTP door's (its body limit) - each lowered in the file takes hold
 * after the reload, and the open sessions keep generating. */
static void test_sighup_limits(void) {
    char conf[600];
    write_file("limits.conf", "max-sessions-per-conn = 4\nhttp-max-body = 1m\n", conf, sizeof conf);
    const char *args[] = {"--config", conf, "--http", "127.0.0.1:0", NULL};
    dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = store, .listen = "127.0.0.1:0",
                             .wait_ms = 60000, .save_stderr = true};
    char addr[128];
    const pid_t pid = dj_test_daemon_start(3, &o, args, addr, sizeof addr, NULL);
    CHECK(pid > 0);
    if (pid <= 0) return;
    const unsigned http = dj_test_http_port(tmpdir, 3);
    CHECK(http != 0);
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (!c) goto out;
    const dj_session_opts so = {.model = "demo", .expected_tokens = 64};
    uint64_t s1 = 0, s2 = 0, s3 = 0;
    CHECK_OK(dj_client_session_open(c, &so, &s1));
    CHECK_OK(dj_client_session_open(c, &so, &s2));
    CHECK(generate(c, s1, 10) && generate(c, s2, 11));
    CHECK_OK(long_prompt(addr)); /* no quota yet */
    /* a 3000-byte body: not refused for its size (1m) */
    char body[3100];
    snprintf(body, sizeof body, "{\"model\": \"demo\", \"prompt\": \"%2900d\", \"max_tokens\": 1}", 7);
    char out[2048];
    const int before = dj_test_http_text(http, "POST", "/v1/completions", body, out, sizeof out);
    CHECK_MSG(before != 413, "%d %s", before, out);

    write_file("limits.conf", "max-sessions-per-conn = 2\nhttp-max-body = 2k\nquota-gb = 0.001\n", conf, sizeof conf);
    CHECK(kill(pid, SIGHUP) == 0);
    bool reloaded = false;
    for (int i = 0; i < 400 && !(reloaded = lines_with(3, "SIGHUP: reloaded") == 1); i++) dj_test_sleep_ms(25);
    CHECK_MSG(reloaded, "no reload line");
    /* the loop's limit: a third session of this connection is refused, the two open ones generate */
    CHECK_ST(dj_client_session_open(c, &so, &s3), DJ_EQUOTA);
    CHECK_MSG(generate(c, s1, 20) && generate(c, s2, 21), "the open sessions after the reload");
    /* the HTTP door's: the same body is now too big */
    const int after = dj_test_http_text(http, "POST", "/v1/completions", body, out, sizeof out);
    CHECK_MSG(after == 413, "%d %s", after, out);
    /* the engine thread's: 1 MB of KV (16 pages) per tenant refuses the 40-page prompt (the worker
     * takes the limits at its next intake, before any request sent after the reload) */
    const dj_status q = long_prompt(addr);
    CHECK_MSG(q != DJ_OK, "the 300-token prompt under a 1 MB quota: %s", dj_status_name(q));
    CHECK(generate(c, s1, 30));
    dj_client_free(c);
out:
    CHECK(dj_test_daemon_stop(3, 30000) == 0);
}

int main(void) {
    /* nothing here is random */
    dj_test_daemon_guard();
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!mkdtemp(tmpdir)) return 1;
    snprintf(store, sizeof store, "%s/store", tmpdir);
    snprintf(empty, sizeof empty, "%s/empty", tmpdir);
    char p[600];
    if (mkdir(store, 0700) || mkdir(empty, 0700)) return 1;
    snprintf(p, sizeof p, "%s/demo", store);
    if (symlink(DJ_SOURCE_DIR "/models/demo", p)) return 1;
    test_bad_configs();
    test_file_and_flags();
    test_sighup();
    test_sighup_limits();
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_server_reload");
}
