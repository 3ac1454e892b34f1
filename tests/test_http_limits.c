/* test_http_limits.c: the HTTP door against hostile clients (issue 43) -
 * slowloris headers and bodies, the per-address and per-token shares, 503 as
 * JSON when the daemon is full, big bodies bounded in RSS, Host and
 * Content-Type checks, request smuggling, and what a tenant's token reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_http_limits_XXXXXX";
static const char *const BODY = "{\"model\": \"demo\", \"prompt\": \"x\", \"max_tokens\": 2}";

/* djinnd --http on the demo model with extra args: its pid, *port the HTTP port. */
static pid_t start(int slot, const char *const *extra, unsigned *port) {
    const char *args[32] = {"--http", "127.0.0.1:0"};
    int n = 2;
    for (int i = 0; extra && extra[i] && n < 31; i++) args[n++] = extra[i];
    args[n] = NULL;
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = DJ_SOURCE_DIR "/models",
                                   .listen = "127.0.0.1:0", .small_asan_quarantine = true, .wait_ms = 20000};
    char addr[128];
    const pid_t pid = dj_test_daemon_start(slot, &o, args, addr, sizeof addr, NULL);
    *port = 0;
    char path[600];
    snprintf(path, sizeof path, "%s/port%d", tmpdir, slot);
    FILE *f = fopen(path, "r");
    if (f) {
        unsigned a = 0, b = 0;
        if (fscanf(f, "%u %u", &a, &b) == 2) *port = b;
        fclose(f);
    }
    return pid;
}

/* A raw request (the caller's bytes) on a fresh connection; the answer. */
static dj_test_resp raw_request(unsigned port, const char *bytes) {
    dj_test_resp r = {0};
    const int fd = dj_test_http_connect(port);
    if (fd < 0) return r;
    if (dj_test_send_all(fd, bytes, strlen(bytes))) r = dj_test_http_read(fd);
    close(fd);
    return r;
}

/* status, and OpenAI's error JSON holding needle */
static void expect_json_error(const dj_test_resp *r, int status, const char *needle, const char *what) {
    cJSON *j = r->body ? cJSON_Parse(r->body) : NULL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
    CHECK_MSG(r->status == status && cJSON_IsString(m) && strstr(m->valuestring, needle),
              "%s: got %d %s, want %d with '%s'", what, r->status, r->body ? r->body : "", status, needle);
    cJSON_Delete(j);
}

/* Whether the server closed fd within wait_ms (EOF or reset on read). */
static bool closed_within(int fd, int wait_ms) {
    const double end = dj_test_now_s() + wait_ms / 1e3;
    while (dj_test_now_s() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) > 0) {
            char b[512];
            const ssize_t k = recv(fd, b, sizeof b, MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
        }
    }
    return false;
}

/* ---- finding 2: slowloris ---- */

/* A connection trickling a header byte now and then stays open only until
 * --http-header-timeout-s (an absolute deadline, not an idle timer). Then 80
 * trickling connections from 127.0.0.2 (reconnecting when closed) do not
 * keep a client of 127.0.0.1 out: --http-max-per-address bounds what one
 * address holds, the waiting pool closes the oldest. */
static void test_slowloris(void) {
    unsigned port;
    const char *extra[] = {"--http-header-timeout-s", "2", "--http-max-connections", "8", "--http-max-unauth", "4",
                           "--http-max-per-address", "8", "--http-timeout-s", "30", NULL};
    const pid_t pid = start(0, extra, &port);
    CHECK_MSG(pid > 0 && port, "djinnd --http did not start");
    if (pid <= 0 || !port) return;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    const char *head = "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
    /* one trickler: a byte each 300 ms (an idle timer of 30 s would never fire) */
    int fd = dj_test_raw_connect(addr, NULL, 0, 0);
    CHECK(fd >= 0 && dj_test_send_all(fd, head, strlen(head)));
    const double t0 = dj_test_now_s();
    bool closed = false;
    while (!closed && dj_test_now_s() - t0 < 8.0) {
        dj_test_sleep_ms(300);
        closed = send(fd, "a", 1, MSG_NOSIGNAL) != 1 || closed_within(fd, 1);
    }
    const double held = dj_test_now_s() - t0;
    CHECK_MSG(closed && held < 6.0, "a trickling connection held %.1f s (deadline 2 s)", held);
    printf("a trickling connection was closed after %.1f s (--http-header-timeout-s 2)\n", held);
    close(fd);
    /* 80 tricklers from 127.0.0.2 */
    enum { N = 80 };
    int t[N];
    for (int i = 0; i < N; i++) {
        t[i] = dj_test_raw_connect(addr, "127.0.0.2", 0, 0);
        if (t[i] >= 0) send(t[i], head, strlen(head), MSG_NOSIGNAL);
    }
    int ok = 0, tries = 0;
    const double end = dj_test_now_s() + 5.0; /* past the 2 s deadline and the 1 s before eviction */
    while (dj_test_now_s() < end) {
        for (int i = 0; i < N; i++) /* trickle, and reconnect the closed ones */
            if (t[i] < 0 || send(t[i], "a", 1, MSG_NOSIGNAL) != 1) {
                if (t[i] >= 0) close(t[i]);
                t[i] = dj_test_raw_connect(addr, "127.0.0.2", 0, 0);
                if (t[i] >= 0) send(t[i], head, strlen(head), MSG_NOSIGNAL);
            }
        dj_test_resp r = dj_test_http_request(port, "GET", "/v1/models", NULL, NULL);
        tries++;
        ok += r.status == 200;
        dj_test_resp_free(&r);
        dj_test_sleep_ms(200);
    }
    CHECK_MSG(ok == tries, "with 80 trickling connections from another address: %d of %d requests answered", ok, tries);
    printf("80 trickling connections from 127.0.0.2: %d of %d requests of 127.0.0.1 answered\n", ok, tries);
    for (int i = 0; i < N; i++)
        if (t[i] >= 0) close(t[i]);
    /* over the address's share: 429 as JSON, not a silent close */
    int mine[8];
    for (int i = 0; i < 8; i++) {
        mine[i] = dj_test_raw_connect(addr, "127.0.0.3", 0, 0);
        if (mine[i] >= 0) send(mine[i], head, strlen(head), MSG_NOSIGNAL);
    }
    dj_test_sleep_ms(300); /* the server has counted them */
    fd = dj_test_raw_connect(addr, "127.0.0.3", 10, 10);
    dj_test_resp r = {0};
    if (fd >= 0 && dj_test_http_send(fd, "GET", "/v1/models", NULL, NULL)) r = dj_test_http_read(fd);
    expect_json_error(&r, 429, "from one address", "a 9th connection of one address");
    dj_test_resp_free(&r);
    if (fd >= 0) close(fd);
    for (int i = 0; i < 8; i++)
        if (mine[i] >= 0) close(mine[i]);
    CHECK(dj_test_daemon_stop(0, 10000) == 0);
}

/* Slow bodies (--http-body-timeout-s) and a token's share of requests
 * (--http-max-per-token): bob's event streams do not keep alice out. */
static void test_tenants(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/tokens", tmpdir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs("alice-token qos=interactive,batch\nbob-token qos=batch\nroot-token admin\n", f);
    fclose(f);
    unsigned port;
    const char *extra[] = {"--token-file", path, "--http-max-connections", "6", "--http-max-per-token", "2",
                           "--http-body-timeout-s", "2", NULL};
    const pid_t pid = start(1, extra, &port);
    CHECK_MSG(pid > 0 && port, "djinnd --http --token-file did not start");
    if (pid <= 0 || !port) return;
    /* a body trickled after its headers: closed at the body's deadline */
    const char *slow = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer bob-token\r\n"
                       "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{";
    int fd = dj_test_http_connect(port);
    CHECK(fd >= 0 && dj_test_send_all(fd, slow, strlen(slow)));
    const double t0 = dj_test_now_s();
    bool closed = false;
    while (!closed && dj_test_now_s() - t0 < 8.0) {
        dj_test_sleep_ms(300);
        closed = send(fd, " ", 1, MSG_NOSIGNAL) != 1 || closed_within(fd, 1);
    }
    const double held = dj_test_now_s() - t0;
    CHECK_MSG(closed && held < 6.0, "a trickled body held its connection %.1f s (deadline 2 s)", held);
    close(fd);
    /* bob holds two event streams: his third request gets 429; alice is served */
    const char *ev = "GET /v1/djinn/events HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer bob-token\r\n\r\n";
    int s[2];
    for (int i = 0; i < 2; i++) {
        s[i] = dj_test_http_connect(port);
        CHECK(s[i] >= 0 && dj_test_send_all(s[i], ev, strlen(ev)));
        char b[256];
        CHECK(s[i] >= 0 && recv(s[i], b, sizeof b, 0) > 0); /* its first event: it holds its slot */
    }
    dj_test_resp r = dj_test_http_request(port, "GET", "/v1/djinn/events?count=1", "Authorization: Bearer bob-token\r\n",
                                          NULL);
    expect_json_error(&r, 429, "--http-max-per-token", "bob's third stream");
    dj_test_resp_free(&r);
    r = dj_test_http_request(port, "POST", "/v1/completions", "Authorization: Bearer alice-token\r\n", BODY);
    CHECK_MSG(r.status == 200, "alice beside bob's streams: %d %s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    for (int i = 0; i < 2; i++) close(s[i]);
    /* a tenant reads its own counters, the admin the daemon's */
    r = dj_test_http_request(port, "GET", "/v1/djinn/stats", "Authorization: Bearer alice-token\r\n", NULL);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *scope = cJSON_GetObjectItemCaseSensitive(j, "scope");
    const cJSON *used = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "segments"), "text"), "used");
    CHECK_MSG(r.status == 200 && cJSON_IsString(scope) && !strcmp(scope->valuestring, "own") && cJSON_IsNumber(used) &&
                  used->valuedouble == 0,
              "alice's stats: %d %.300s", r.status, r.body ? r.body : "");
    cJSON_Delete(j);
    dj_test_resp_free(&r);
    r = dj_test_http_request(port, "GET", "/v1/djinn/stats", "Authorization: Bearer root-token\r\n", NULL);
    j = r.body ? cJSON_Parse(r.body) : NULL;
    used = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "segments"), "text"), "used");
    CHECK_MSG(r.status == 200 && !cJSON_GetObjectItemCaseSensitive(j, "scope") && cJSON_IsNumber(used) &&
                  used->valuedouble > 0,
              "the admin's stats: %d %.300s", r.status, r.body ? r.body : "");
    cJSON_Delete(j);
    dj_test_resp_free(&r);
    r = dj_test_http_request(port, "GET", "/v1/djinn/events?count=1", "Authorization: Bearer alice-token\r\n", NULL);
    CHECK_MSG(r.status == 200 && r.body && strstr(r.body, "\"scope\":\"own\""), "alice's events: %d", r.status);
    dj_test_resp_free(&r);
    /* a foreign Host is fine with tokens (no browser can add them), the scheme in any case */
    r = dj_test_http_request(port, "GET", "/v1/models", "Authorization: BEARER alice-token\r\nX-Pad: 1\r\n", NULL);
    CHECK_MSG(r.status == 200, "'BEARER': %d", r.status);
    dj_test_resp_free(&r);
    CHECK(dj_test_daemon_stop(1, 10000) == 0);
}

/* ---- finding 6: the daemon full ---- */
static void test_full(void) {
    unsigned port;
    const char *extra[] = {"--max-connections", "4", NULL};
    const pid_t pid = start(2, extra, &port);
    CHECK_MSG(pid > 0 && port, "djinnd did not start");
    if (pid <= 0 || !port) return;
    char path[600], daddr[64];
    snprintf(path, sizeof path, "%s/port2", tmpdir);
    unsigned dport = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%u", &dport) != 1) dport = 0;
        fclose(f);
    }
    snprintf(daddr, sizeof daddr, "127.0.0.1:%u", dport);
    int silent[8];
    for (int i = 0; i < 8; i++) silent[i] = dj_test_raw_connect(daddr, NULL, 0, 0);
    dj_test_sleep_ms(300);
    /* silent sockets take no capacity of the HTTP door: it dials the daemon through
     * its own socket, and connections without HELLO are evicted oldest first
     * (--max-pending-connections), so both requests are served */
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", NULL, BODY);
    CHECK_MSG(r.status == 200, "a request while silent binary connections fill the daemon: %d %.200s", r.status,
              r.body ? r.body : "");
    dj_test_resp_free(&r);
    r = dj_test_http_request(port, "GET", "/v1/models", NULL, NULL);
    CHECK_MSG(r.status == 200, "GET /v1/models while silent binary connections fill the daemon: %d", r.status);
    dj_test_resp_free(&r);
    for (int i = 0; i < 8; i++)
        if (silent[i] >= 0) close(silent[i]);
    CHECK(dj_test_daemon_stop(2, 10000) == 0);
    /* the HTTP door full: two requests holding their slots (bodies unsent)
     * and 16 connections that sent nothing - the next request is told 503
     * (libmicrohttpd's own cap was --http-max-connections + 16: closed unanswered) */
    const char *extra2[] = {"--http-max-connections", "2", NULL};
    const pid_t pid2 = start(2, extra2, &port);
    CHECK_MSG(pid2 > 0 && port, "djinnd did not start");
    if (pid2 <= 0 || !port) return;
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                       "Content-Length: 100\r\n\r\n";
    int hold[2], idle[16];
    for (int i = 0; i < 2; i++) {
        hold[i] = dj_test_http_connect(port);
        CHECK(hold[i] >= 0 && dj_test_send_all(hold[i], head, strlen(head)));
    }
    for (int i = 0; i < 16; i++) idle[i] = dj_test_http_connect(port);
    /* the two count once the server has read their headers (a loaded machine: allow it 10 s) */
    const double until = dj_test_now_s() + 10.0;
    do {
        dj_test_sleep_ms(100);
        dj_test_resp_free(&r);
        r = dj_test_http_request(port, "GET", "/v1/models", NULL, NULL);
    } while (r.status == 200 && dj_test_now_s() < until);
    expect_json_error(&r, 503, "requests at once", "a request with the HTTP door full");
    dj_test_resp_free(&r);
    for (int i = 0; i < 2; i++)
        if (hold[i] >= 0) close(hold[i]);
    for (int i = 0; i < 16; i++)
        if (idle[i] >= 0) close(idle[i]);
    CHECK(dj_test_daemon_stop(2, 10000) == 0);
}

/* ---- finding 8: big bodies bounded in real bytes ---- */
static long vm_kb(pid_t pid, const char *key) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) v = strtol(line + strlen(key) + 1, NULL, 10);
    if (f) fclose(f);
    return v;
}

typedef struct big_req {
    unsigned port;
    const char *body;
    dj_test_resp r;
} big_req;
static void *big_main(void *arg) {
    big_req *b = arg;
    b->r = dj_test_http_request(b->port, "POST", "/v1/completions", NULL, b->body);
    return NULL;
}

static void test_big_bodies(void) {
    unsigned port;
    const char *extra[] = {"--http-max-body", "4m", NULL};
    const pid_t pid = start(3, extra, &port);
    CHECK_MSG(pid > 0 && port, "djinnd did not start");
    if (pid <= 0 || !port) return;
    /* token ids: 2 bytes each, 2M of them (cJSON: ~130 MB a body); text: 4 MB of words */
    const size_t n = (4u << 20) - 4096;
    char *ids = malloc(n + 64), *text = malloc(n + 64);
    int k = snprintf(ids, 64, "{\"model\": \"demo\", \"prompt\": [1");
    while ((size_t)k + 4 < n) ids[k++] = ',', ids[k++] = '1';
    strcpy(ids + k, "]}");
    k = snprintf(text, 64, "{\"model\": \"demo\", \"prompt\": \"");
    while ((size_t)k + 8 < n) memcpy(text + k, "word ", 5), k += 5;
    strcpy(text + k, "\"}");
    dj_test_resp r = dj_test_http_request(port, "GET", "/v1/models", NULL, NULL); /* the model known */
    dj_test_resp_free(&r);
    const long before = vm_kb(pid, "VmHWM:");
    enum { M = 4 };
    big_req b[2 * M];
    pthread_t th[2 * M];
    for (int i = 0; i < 2 * M; i++) {
        b[i] = (big_req){.port = port, .body = i < M ? ids : text};
        pthread_create(&th[i], NULL, big_main, &b[i]);
    }
    for (int i = 0; i < 2 * M; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 2 * M; i++) {
        expect_json_error(&b[i].r, i < M ? 413 : 400, i < M ? "JSON values" : "bytes",
                          i < M ? "4 MB of token ids" : "4 MB of text");
        dj_test_resp_free(&b[i].r);
    }
    const long after = vm_kb(pid, "VmHWM:");
    printf("%d bodies of 4 MB at once (%d of token ids, %d of text): peak RSS %ld -> %ld kB\n", 2 * M, M, M, before,
           after);
    /* the bodies themselves (8 x 4 MB) and MHD's buffers: well under one parsed body (~130 MB) */
    CHECK_MSG(before > 0 && after - before < 96 * 1024, "peak RSS grew by %ld kB", after - before);
    r = dj_test_http_request(port, "POST", "/v1/completions", NULL, BODY);
    CHECK_MSG(r.status == 200, "a small request after: %d", r.status);
    dj_test_resp_free(&r);
    free(ids);
    free(text);
    CHECK(dj_test_daemon_stop(3, 10000) == 0);
}

/* ---- finding 10: Host and Content-Type; finding 12: framing ---- */
static void test_headers(void) {
    unsigned port;
    const char *extra[] = {"--http-allowed-hosts", "djinn.internal,other.example", NULL};
    pid_t pid = start(4, NULL, &port);
    CHECK_MSG(pid > 0 && port, "djinnd did not start");
    if (pid <= 0 || !port) return;
    char req[1024];
    /* DNS rebinding: a foreign name refused; localhost, IP literals, fine */
    static const struct {
        const char *host;
        int status;
    } hosts[] = {{"evil.example", 403}, {"evil.example:8080", 403}, {"localhost:1", 200}, {"127.0.0.1", 200},
                 {"[::1]:80", 200},    {"LOCALHOST", 200},         {"djinn.internal", 403}};
    for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++) {
        snprintf(req, sizeof req, "GET /v1/models HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hosts[i].host);
        dj_test_resp r = raw_request(port, req);
        CHECK_MSG(r.status == hosts[i].status, "Host %s: %d, want %d", hosts[i].host, r.status, hosts[i].status);
        if (hosts[i].status == 403) expect_json_error(&r, 403, "Host", hosts[i].host);
        dj_test_resp_free(&r);
    }
    /* a body a browser may send anywhere unasked: text/plain, a form, none */
    static const char *const types[] = {"Content-Type: text/plain\r\n", "Content-Type: application/x-www-form-urlencoded\r\n",
                                        ""};
    for (size_t i = 0; i < 3; i++) {
        snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n%sContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n%s", types[i], strlen(BODY), BODY);
        dj_test_resp r = raw_request(port, req);
        expect_json_error(&r, 415, "application/json", types[i][0] ? types[i] : "no Content-Type");
        dj_test_resp_free(&r);
    }
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: Application/JSON; "
             "charset=utf-8\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s", strlen(BODY), BODY);
    dj_test_resp r = raw_request(port, req);
    CHECK_MSG(r.status == 200, "application/json with a charset: %d %s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    /* NUL in a string: refused, not cut there (an escaped backslash before u0000 is text) */
    static const char *const nuls[] = {"{\"model\": \"demo\", \"prompt\": \"a\\u0000b\"}",
                                       "{\"model\": \"demo\\u0000x\", \"prompt\": \"a\"}"};
    for (int i = 0; i < 2; i++) {
        dj_test_resp n0 = dj_test_http_request(port, "POST", "/v1/completions", NULL, nuls[i]);
        expect_json_error(&n0, 400, "u0000", nuls[i]);
        dj_test_resp_free(&n0);
    }
    r = dj_test_http_request(port, "POST", "/v1/completions", NULL,
                             "{\"model\": \"demo\", \"prompt\": \"a\\\\u0000b\", \"max_tokens\": 2}");
    CHECK_MSG(r.status == 200, "a backslash, then u0000: %d %s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    /* smuggling: two lengths, a length and chunked */
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\nContent-Length: 5\r\nConnection: close\r\n\r\n%s", strlen(BODY), BODY);
    r = raw_request(port, req);
    expect_json_error(&r, 400, "Content-Length", "two Content-Length headers");
    dj_test_resp_free(&r);
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
             "Content-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n",
             strlen(BODY), BODY);
    r = raw_request(port, req);
    expect_json_error(&r, 400, "Transfer-Encoding", "Content-Length and chunked");
    dj_test_resp_free(&r);
    snprintf(req, sizeof req, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
             "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n", strlen(BODY), BODY);
    r = raw_request(port, req);
    CHECK_MSG(r.status == 200, "chunked alone: %d %s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    CHECK(dj_test_daemon_stop(4, 10000) == 0);
    /* --http-allowed-hosts adds names */
    pid = start(4, extra, &port);
    CHECK_MSG(pid > 0 && port, "djinnd --http-allowed-hosts did not start");
    if (pid <= 0 || !port) return;
    static const struct {
        const char *host;
        int status;
    } more[] = {{"djinn.internal", 200}, {"Other.Example:443", 200}, {"evil.example", 403}, {"djinn.internal.evil", 403}};
    for (size_t i = 0; i < sizeof more / sizeof *more; i++) {
        snprintf(req, sizeof req, "GET /v1/models HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", more[i].host);
        r = raw_request(port, req);
        CHECK_MSG(r.status == more[i].status, "Host %s: %d, want %d", more[i].host, r.status, more[i].status);
        dj_test_resp_free(&r);
    }
    CHECK(dj_test_daemon_stop(4, 10000) == 0);
}

int main(void) {
    /* nothing random here: one run, no seeds */
    dj_test_daemon_guard();
    if (!mkdtemp(tmpdir)) return 1;
    test_headers();
    test_full();
    test_big_bodies();
    test_slowloris();
    test_tenants();
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_http_limits");
}
