/* daemon_util.c: starting, stopping and talking raw frames to a real djinnd,
 * for test_server, test_hostile and bench_soak (see daemon_util.h). */
#define _GNU_SOURCE
#include "daemon_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double dj_test_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void dj_test_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- daemons ---- */

static pid_t daemons[DJ_TEST_DAEMON_SLOTS];

static void kill_all(void) {
    for (int i = 0; i < DJ_TEST_DAEMON_SLOTS; i++)
        if (daemons[i] > 0) {
            kill(daemons[i], SIGKILL);
            waitpid(daemons[i], NULL, 0);
            daemons[i] = 0;
        }
}

static void on_fatal(int sig) {
    kill_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

void dj_test_daemon_guard(void) {
    signal(SIGSEGV, on_fatal);
    signal(SIGABRT, on_fatal);
    signal(SIGTERM, on_fatal);
    signal(SIGINT, on_fatal);
    atexit(kill_all);
}

int dj_test_daemon_stop(int slot, int wait_ms) {
    pid_t pid = daemons[slot];
    if (pid <= 0) return -1;
    kill(pid, SIGTERM);
    int status = 0;
    for (int i = 0; i < wait_ms / 10; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            daemons[slot] = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        dj_test_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    daemons[slot] = 0;
    return -1;
}

int dj_test_free_port(void) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        a.sin_port = 0;
    close(fd);
    return ntohs(a.sin_port);
}

pid_t dj_test_daemon_start(int slot, const dj_test_daemon_opts *o, const char *const *extra, char *addr,
                           size_t cap, int *exit_code) {
    char port_file[300], err_file[300];
    snprintf(port_file, sizeof port_file, "%s/port%d", o->dir, slot);
    snprintf(err_file, sizeof err_file, "%s/err%d", o->dir, slot);
    unlink(port_file);
    const bool unix_socket = !strncmp(o->listen, "unix:", 5);
    const char *argv[48];
    int n = 0;
    argv[n++] = o->djinnd;
    argv[n++] = "--listen";
    argv[n++] = o->listen;
    argv[n++] = "--port-file";
    argv[n++] = port_file;
    argv[n++] = "--models";
    argv[n++] = o->models;
    argv[n++] = "--vmu-gb";
    argv[n++] = "256m";
    argv[n++] = "--threads";
    argv[n++] = "1";
    for (int i = 0; extra && extra[i] && n < 47; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        if (o->save_stderr) {
            int fd = open(err_file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd >= 0) dup2(fd, 2);
        }
        if (o->small_asan_quarantine) {
            char asan[512];
            const char *prev = getenv("ASAN_OPTIONS");
            snprintf(asan, sizeof asan, "%s%squarantine_size_mb=8", prev ? prev : "", prev && prev[0] ? ":" : "");
            setenv("ASAN_OPTIONS", asan, 1);
        }
        if (o->nofile) {
            struct rlimit rl = {o->nofile, o->nofile};
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        execv(o->djinnd, (char *const *)argv);
        _exit(127);
    }
    daemons[slot] = pid;
    if (exit_code) *exit_code = 0;
    for (int i = 0; i < o->wait_ms / 10; i++) {
        FILE *f = fopen(port_file, "r");
        if (f) {
            unsigned port = 0;
            const int ok = fscanf(f, "%u", &port);
            fclose(f);
            if (unix_socket) snprintf(addr, cap, "%s", o->listen);
            else snprintf(addr, cap, "127.0.0.1:%u", port);
            if (ok == 1 || unix_socket) return pid;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            daemons[slot] = 0;
            if (exit_code) *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            return -1;
        }
        dj_test_sleep_ms(10);
    }
    return -1;
}

/* ---- raw frames ---- */

int dj_test_raw_connect(const char *addr, const char *from, int recv_timeout_s, int send_timeout_s) {
    struct sockaddr_storage ss;
    socklen_t len;
    if (dj__addr_parse(addr, &ss, &len) != DJ_OK) return -1;
    int fd = socket(ss.ss_family, SOCK_STREAM, 0);
    if (fd >= 0 && from && ss.ss_family == AF_INET) {
        struct sockaddr_in src = {.sin_family = AF_INET};
        if (inet_pton(AF_INET, from, &src.sin_addr) != 1 || bind(fd, (struct sockaddr *)&src, sizeof src) != 0)
            fprintf(stderr, "%s: bind %s: %s\n", __func__, from, strerror(errno));
    }
    if (recv_timeout_s > 0) {
        struct timeval tv = {recv_timeout_s, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    if (send_timeout_s > 0) {
        struct timeval tv = {send_timeout_s, 0};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    if (fd < 0 || connect(fd, (struct sockaddr *)&ss, len) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

bool dj_test_raw_send(int fd, uint16_t type, uint64_t req, const void *meta, size_t mlen, uint64_t plen) {
    dj_frame_header h = {.magic = DJ_PROTO_MAGIC, .version = DJ_PROTO_VERSION, .type = type,
                         .meta_len = (uint32_t)mlen, .request_id = req, .payload_len = plen};
    uint8_t b[DJ_FRAME_HEADER_BYTES];
    dj_frame_header_encode(&h, b);
    return send(fd, b, sizeof b, MSG_NOSIGNAL) == (ssize_t)sizeof b &&
           (!mlen || send(fd, meta, mlen, MSG_NOSIGNAL) == (ssize_t)mlen);
}

int dj_test_raw_recv(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = recv(fd, (char *)buf + got, n - got, 0);
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

dj_test_frame dj_test_raw_frame(int fd, const char *key) {
    dj_test_frame f = {.type = -1};
    uint8_t b[DJ_FRAME_HEADER_BYTES];
    dj_frame_header h;
    if (dj_test_raw_recv(fd, b, sizeof b) || dj_frame_header_decode(b, DJ_PROTO_MAX_REPLY_PAYLOAD, &h) != DJ_OK ||
        h.meta_len > DJ_PROTO_MAX_META || h.payload_len > (1u << 30))
        return f;
    uint8_t *m = malloc(h.meta_len + h.payload_len + 1);
    if (!m || dj_test_raw_recv(fd, m, h.meta_len + h.payload_len)) {
        free(m);
        return f;
    }
    f.type = h.type;
    dj__meta meta;
    if (dj__meta_parse(&meta, m, h.meta_len) == DJ_OK) {
        const char *s = NULL;
        size_t n = 0;
        dj__meta_i64(&meta, "status", false, &f.st);
        if (dj__meta_str(&meta, "message", false, &s, &n) == DJ_OK && s) {
            if (n >= sizeof f.msg) n = sizeof f.msg - 1;
            memcpy(f.msg, s, n);
            f.msg[n] = '\0';
        }
        if (key) dj__meta_u64(&meta, key, false, &f.val);
        dj__meta_destroy(&meta);
    }
    free(m);
    return f;
}

size_t dj_test_meta_of(dj__mw *w, uint8_t *out) {
    dj__mw_finish(w);
    memcpy(out, w->sb.data, w->sb.size);
    const size_t n = w->sb.size;
    dj__mw_destroy(w);
    return n;
}

int dj_test_raw_hello(const char *addr, int recv_timeout_s, const char *token, dj_test_frame *ans) {
    int fd = dj_test_raw_connect(addr, NULL, recv_timeout_s, 0);
    if (fd < 0) return -1;
    dj__mw w;
    uint8_t m[512];
    dj__mw_init(&w);
    dj__mw_u64(&w, "version", 1);
    if (token) dj__mw_str(&w, "token", token);
    const size_t n = dj_test_meta_of(&w, m);
    dj_test_raw_send(fd, DJ_MSG_HELLO, 1, m, n, 0);
    *ans = dj_test_raw_frame(fd, NULL);
    return fd;
}

/* ---- a small HTTP/1.1 client ---- */

int dj_test_http_connect(unsigned port) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    return dj_test_raw_connect(addr, NULL, 30, 10);
}

bool dj_test_send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k <= 0) return false;
        c += k;
        n -= (size_t)k;
    }
    return true;
}

bool dj_test_http_send(int fd, const char *method, const char *path, const char *headers, const char *body) {
    char head[2048];
    snprintf(head, sizeof head,
             "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n%sContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n",
             method, path, headers ? headers : "", body ? strlen(body) : 0);
    return dj_test_send_all(fd, head, strlen(head)) && (!body || dj_test_send_all(fd, body, strlen(body)));
}

dj_test_resp dj_test_http_read(int fd) {
    dj_test_resp r = {0};
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while (buf && (k = recv(fd, buf + n, cap - n - 1, 0)) > 0) {
        n += (size_t)k;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) break;
            buf = nb;
        }
    }
    if (!buf) return r;
    buf[n] = '\0';
    if (sscanf(buf, "HTTP/1.%*d %d", &r.status) != 1) r.status = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (!body || !(r.body = malloc(n + 1))) {
        free(buf);
        return r;
    }
    *body = '\0';
    body += 4;
    if (!strcasestr(buf, "Transfer-Encoding: chunked")) {
        r.len = n - (size_t)(body - buf);
        memcpy(r.body, body, r.len);
    } else {
        const char *p = body, *end = buf + n;
        for (;;) {
            char *e;
            unsigned long sz = strtoul(p, &e, 16);
            if (e == p || sz == 0) break;
            const char *data = strstr(e, "\r\n");
            if (!data || (size_t)(end - data - 2) < sz) break;
            memcpy(r.body + r.len, data + 2, sz);
            r.len += sz;
            p = data + 2 + sz + 2;
            if (p >= end) break;
        }
    }
    r.body[r.len] = '\0';
    free(buf);
    return r;
}

dj_test_resp dj_test_http_request(unsigned port, const char *method, const char *path, const char *headers,
                                  const char *body) {
    dj_test_resp r = {0};
    int fd = dj_test_http_connect(port);
    if (fd < 0) return r;
    if (dj_test_http_send(fd, method, path, headers, body)) r = dj_test_http_read(fd);
    close(fd);
    return r;
}

void dj_test_resp_free(dj_test_resp *r) {
    free(r->body);
    r->body = NULL;
}

int dj_test_http_text(unsigned port, const char *method, const char *path, const char *body, char *out, size_t cap) {
    dj_test_resp r = dj_test_http_request(port, method, path, NULL, body);
    const int st = r.status;
    snprintf(out, cap, "%s", r.body ? r.body : "");
    dj_test_resp_free(&r);
    return st;
}

unsigned dj_test_http_port(const char *dir, int slot) {
    char path[600];
    snprintf(path, sizeof path, "%s/port%d", dir, slot);
    unsigned a = 0, b = 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    if (fscanf(f, "%u %u", &a, &b) != 2) b = 0;
    fclose(f);
    return b;
}

#ifdef DJ_DJINND /* the server tests' build of djinnd */
pid_t dj_test_http_daemon_start(int slot, const char *dir, const char *store, const char *const *extra, char *addr,
                                size_t cap, unsigned *http_port) {
    const char *args[16] = {"--models", store, "--http", "127.0.0.1:0"};
    int n = 4;
    for (int i = 0; extra && extra[i] && n < 15; i++) args[n++] = extra[i];
    args[n] = NULL;
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = dir, .models = store, .listen = "127.0.0.1:0",
                                   .wait_ms = 10000};
    const pid_t pid = dj_test_daemon_start(slot, &o, args, addr, cap, NULL);
    *http_port = dj_test_http_port(dir, slot);
    return pid;
}
#endif

/* ---- model stores and probes ---- */

#ifdef DJ_SOURCE_DIR /* the tests' source tree */
bool dj_test_link_demo_files(const char *dir) {
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"};
    char p[700], q[600];
    if (mkdir(dir, 0700)) return false;
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        snprintf(q, sizeof q, DJ_SOURCE_DIR "/models/demo/%s", files[i]);
        if (symlink(q, p)) return false;
    }
    return true;
}

bool dj_test_demo_store(const char *dir, char *store, size_t cap) {
    char p[700];
    snprintf(store, cap, "%s/store", dir);
    if (mkdir(store, 0700)) return false;
    snprintf(p, sizeof p, "%s/demo", store);
    return symlink(DJ_SOURCE_DIR "/models/demo", p) == 0;
}

bool dj_test_make_demo_chat(const char *store) {
    char p[600];
    snprintf(p, sizeof p, "%s/demo-chat", store);
    if (!dj_test_link_demo_files(p)) return false;
    snprintf(p, sizeof p, "%s/demo-chat/tokenizer_config.json", store);
    FILE *f = fopen(p, "w");
    if (!f) return false;
    fprintf(f, "{\"bos_token\": \"<|bos|>\", \"eos_token\": \"<|eos|>\", \"chat_template\": \"%s\"}\n",
            DJ_TEST_CHAT_TEMPLATE);
    return fclose(f) == 0;
}
#endif

long dj_test_rss_kb(pid_t pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kb;
}

size_t dj_test_flood(int fd, const uint8_t *frame, size_t len, size_t total) {
    static uint8_t buf[64 * 1024];
    const size_t per = sizeof buf / len, blen = per * len;
    for (size_t i = 0; i < per; i++) memcpy(buf + i * len, frame, len);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    size_t sent = 0, off = 0;
    while (sent < total) {
        struct pollfd p = {fd, POLLOUT, 0};
        if (poll(&p, 1, 1000) <= 0 || (p.revents & (POLLERR | POLLHUP))) break;
        const ssize_t k = send(fd, buf + off, blen - off, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EAGAIN) continue;
            break;
        }
        sent += (size_t)k;
        off = (off + (size_t)k) % blen;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return sent;
}
