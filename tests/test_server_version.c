/* test_server_version.c: issue 50 item 9 against a real djinnd - its version in HELLO and STATS and
 * from --version, a zeroed dj_session_opts opening an interactive session, and each port telling a
 * client of the other protocol where to go (HTTP to the binary port, libdjinn to the HTTP port). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djinn/client.h"
#include "djinn/version.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_version_XXXXXX";
static char store[400];

/* Everything the peer sends until it closes (at most cap - 1 bytes), NUL-terminated. */
static size_t read_all(int fd, char *buf, size_t cap) {
    size_t n = 0;
    while (n + 1 < cap) {
        ssize_t k = read(fd, buf + n, cap - 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
    }
    buf[n] = '\0';
    return n;
}

static void test_versions(const char *addr) {
    /* --version of both binaries: the version of python/djinn/_version.py */
    char cmd[700], out[256] = "", want[64];
    snprintf(cmd, sizeof cmd, "%s --version", DJ_DJINND);
    FILE *p = popen(cmd, "r");
    CHECK(p && fgets(out, sizeof out, p));
    CHECK(p && pclose(p) == 0);
    snprintf(want, sizeof want, "djinnd %s (protocol %u)\n", DJ_VERSION_STRING, (unsigned)DJ_PROTO_VERSION);
    CHECK_MSG(!strcmp(out, want), "djinnd --version said '%s'", out);
    snprintf(cmd, sizeof cmd, "%s --version", DJ_CLI);
    p = popen(cmd, "r");
    out[0] = '\0';
    CHECK(p && fgets(out, sizeof out, p));
    CHECK(p && pclose(p) == 0);
    snprintf(want, sizeof want, "djinn %s (protocol %u)\n", DJ_VERSION_STRING, (unsigned)DJ_PROTO_VERSION);
    CHECK_MSG(!strcmp(out, want), "djinn --version said '%s'", out);
    CHECK(!strcmp(DJ_VERSION_STRING, "0.1.0") || strchr(DJ_VERSION_STRING, '.'));

    /* HELLO's `server` names the version */
    dj_test_frame ans;
    int fd = dj_test_raw_connect(addr, NULL, 10, 0);
    CHECK(fd >= 0);
    dj__mw w;
    uint8_t m[512];
    dj__mw_init(&w);
    dj__mw_u64(&w, "version", DJ_PROTO_VERSION);
    const size_t n = dj_test_meta_of(&w, m);
    CHECK(dj_test_raw_send(fd, DJ_MSG_HELLO, 1, m, n, 0));
    uint8_t hb[DJ_FRAME_HEADER_BYTES];
    dj_frame_header h;
    CHECK(dj_test_raw_recv(fd, hb, sizeof hb) == 0);
    CHECK(dj_frame_header_decode(hb, DJ_PROTO_MAX_REPLY_PAYLOAD, &h) == DJ_OK && h.type == DJ_MSG_REPLY);
    char meta[4096];
    CHECK(h.meta_len < sizeof meta && dj_test_raw_recv(fd, meta, h.meta_len) == 0);
    dj__meta mm;
    CHECK_OK(dj__meta_parse(&mm, (const uint8_t *)meta, h.meta_len));
    const char *srv = NULL;
    size_t sn = 0;
    CHECK_OK(dj__meta_str(&mm, "server", true, &srv, &sn));
    snprintf(want, sizeof want, "djinnd %s", DJ_VERSION_STRING);
    CHECK_MSG(srv && sn == strlen(want) && !memcmp(srv, want, sn), "HELLO's server: '%.*s'", (int)sn, srv ? srv : "");
    dj__meta_destroy(&mm);
    close(fd);
    (void)ans;

    /* STATS' version, and a zeroed dj_session_opts (but its model) opens an interactive session */
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (!c) return;
    dj_session_opts so;
    memset(&so, 0, sizeof so);
    so.model = "demo";
    CHECK(so.qos == DJ_QOS_INTERACTIVE);
    uint64_t sess = 0;
    CHECK_OK(dj_client_session_open(c, &so, &sess));
    dj_client_stats st;
    CHECK_OK(dj_client_stats_get(c, &st));
    CHECK_MSG(!strcmp(st.version, DJ_VERSION_STRING), "STATS' version '%s'", st.version);
    CHECK(st.n_sessions == 1);
    if (st.n_sessions == 1) CHECK_MSG(!strcmp(st.sessions[0].qos, "interactive"), "qos '%s'", st.sessions[0].qos);
    dj_client_stats_free(&st);
    /* realtime still ranks first, batch last */
    CHECK(dj_qos_rank(DJ_QOS_REALTIME) < dj_qos_rank(DJ_QOS_INTERACTIVE));
    CHECK(dj_qos_rank(DJ_QOS_INTERACTIVE) < dj_qos_rank(DJ_QOS_BATCH));
    dj_client_free(c);
}

/* An HTTP request at the binary port gets an HTTP answer naming --http; libdjinn at the HTTP port
 * fails at once with a message naming the ports, not after the door's header deadline. */
static void test_wrong_doors(const char *addr, unsigned http_port) {
    int fd = dj_test_raw_connect(addr, NULL, 10, 0);
    CHECK(fd >= 0);
    /* shorter than a frame header: the method alone tells */
    const char req[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    double t0 = dj_test_now_s();
    CHECK(dj_test_send_all(fd, req, sizeof req - 1));
    char buf[2048];
    read_all(fd, buf, sizeof buf);
    close(fd);
    char want[128];
    snprintf(want, sizeof want, "HTTP is on --http (127.0.0.1:0, port %u)", http_port);
    CHECK_MSG(!strncmp(buf, "HTTP/1.1 400 ", 13) && strstr(buf, "this is djinnd's binary port") && strstr(buf, want),
              "answer: '%s'", buf);
    CHECK_MSG(dj_test_now_s() - t0 < 5, "the answer took %.1f s", dj_test_now_s() - t0);

    /* a binary frame whose magic is not "DJN1" is still answered with a frame, not HTTP */
    fd = dj_test_raw_connect(addr, NULL, 10, 0);
    CHECK(fd >= 0);
    uint8_t junk[DJ_FRAME_HEADER_BYTES];
    memset(junk, 'x', sizeof junk);
    CHECK(dj_test_send_all(fd, junk, sizeof junk));
    dj_test_frame f = dj_test_raw_frame(fd, NULL);
    CHECK_MSG(f.type == DJ_MSG_ERROR && strstr(f.msg, "magic"), "type %d '%s'", f.type, f.msg);
    close(fd);

    char haddr[64];
    snprintf(haddr, sizeof haddr, "127.0.0.1:%u", http_port);
    dj_client_t *c = NULL;
    t0 = dj_test_now_s();
    const dj_status st = dj_client_connect(haddr, NULL, &c);
    const double took = dj_test_now_s() - t0;
    CHECK(st != DJ_OK && !c);
    CHECK_MSG(strstr(dj_last_error(), "this is an HTTP port") && strstr(dj_last_error(), "--listen"), "error: '%s'",
              dj_last_error());
    CHECK_MSG(took < 5, "the client took %.1f s to give up", took);
    dj_client_free(c);

    /* the CLI says the same */
    char cmd[700], out[1024] = "";
    snprintf(cmd, sizeof cmd, "%s stat --server %s 2>&1", DJ_CLI, haddr);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (p) {
        read_all(fileno(p), out, sizeof out);
        CHECK(pclose(p) != 0);
    }
    CHECK_MSG(strstr(out, "this is an HTTP port"), "djinn stat said '%s'", out);
}

int main(void) {
    /* nothing here is random */
    dj_test_daemon_guard();
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!mkdtemp(tmpdir)) return 1;
    if (!dj_test_demo_store(tmpdir, store, sizeof store)) return 1;
    char addr[128];
    unsigned http_port = 0;
    const pid_t pid = dj_test_http_daemon_start(0, tmpdir, store, NULL, addr, sizeof addr, &http_port);
    CHECK(pid > 0 && http_port);
    if (pid > 0 && http_port) {
        test_versions(addr);
        test_wrong_doors(addr, http_port);
    }
    CHECK(dj_test_daemon_stop(0, 30000) == 0);
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_server_version");
}
