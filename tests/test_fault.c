/* test_fault.c: fault injection (issue 42 item 7) - djinnd in this process, each
 * daemon request run with its n-th allocation failed for n = 1, 2, ... to the end. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djinn/alloc.h"
#include "djinn/tokenizer.h"
#include "proto/proto_impl.h"
#include "server/serve.h"
#include "daemon_util.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HAVE_LSAN 1
#endif
#endif
#ifdef HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

#define RECV_TIMEOUT_S 20 /* a reply that never comes is a hang: fails the check */

static char tmpdir[] = "/tmp/dj_fault_XXXXXX";
static char addr[64];
static unsigned http_port;

/* ---- the daemon on a thread of its own ---- */

static char *daemon_argv[32];
static int daemon_argc, daemon_rc = -1;

static void *daemon_main(void *arg) {
    (void)arg;
    daemon_rc = dj__serve_main(daemon_argc, daemon_argv);
    return NULL;
}

/* A model store in tmpdir: demo, and demo-chat (its files, and a chat template
 * for /v1/chat/completions). */
static bool make_store(char *store, size_t cap) {
    char p[600];
    snprintf(store, cap, "%s/store", tmpdir);
    snprintf(p, sizeof p, "%s/demo", store);
    if (mkdir(store, 0700) || symlink(DJ_SOURCE_DIR "/models/demo", p)) return false;
    return dj_test_make_demo_chat(store);
}

static bool start_daemon(pthread_t *th) {
    static char port_file[300], models[300];
    snprintf(port_file, sizeof port_file, "%s/port", tmpdir);
    if (!make_store(models, sizeof models)) return false;
    const char *args[] = {"djinnd", "--listen", "127.0.0.1:0", "--port-file", port_file, "--models", models,
                          "--vmu-gb", "256m", "--threads", "1", "--http", "127.0.0.1:0", "--http-reuse", "0", NULL};
    for (daemon_argc = 0; args[daemon_argc]; daemon_argc++) daemon_argv[daemon_argc] = (char *)args[daemon_argc];
    if (pthread_create(th, NULL, daemon_main, NULL)) return false;
    for (int i = 0; i < 6000; i++) { /* the port file is written once it listens */
        FILE *f = fopen(port_file, "r");
        unsigned p = 0;
        if (f) {
            const bool ok = fscanf(f, "%u %u", &p, &http_port) == 2;
            fclose(f);
            if (ok) {
                snprintf(addr, sizeof addr, "127.0.0.1:%u", p);
                return true;
            }
        }
        if (daemon_rc != -1) return false;
        dj_test_sleep_ms(10);
    }
    return false;
}

/* ---- the requests ---- */

typedef enum { OUT_OK, OUT_ERROR, OUT_CLOSED, OUT_BAD } outcome;
static const char *outcome_name[] = {"ok", "error", "closed", "bad"};

typedef struct request {
    const char *name;
    /* Sets up what comes before the request unarmed (a connection, a session),
     * then arms the fault with arm(), sends the request and reads its answer. */
    outcome (*run)(void (*arm)(void), char *why, size_t cap);
} request;

static uint64_t armed_n; /* the allocation to fail; 0: count only */
/* What an answered request said (token ids and text): a faulted run that
 * answers ok must say what the unfaulted one did. Set by the run functions. */
static char answer[1024];

static void arm(void) {
    if (armed_n) dj_alloc_fail_nth(armed_n);
    else dj_alloc_count_start();
}

static outcome frame_outcome(const dj_test_frame *f, int want, char *why, size_t cap) {
    if (f->type == want) return OUT_OK;
    if (f->type == DJ_MSG_ERROR) {
        snprintf(why, cap, "%s: %s", dj_status_name((dj_status)f->st), f->msg);
        return f->st == DJ_ENOMEM ? OUT_ERROR : OUT_BAD; /* the failure as it is, not another */
    }
    if (f->type == -1) {
        snprintf(why, cap, "%s", errno == EAGAIN ? "no answer (timed out)" : "connection closed");
        return errno == EAGAIN ? OUT_BAD : OUT_CLOSED;
    }
    snprintf(why, cap, "frame type %d", f->type);
    return OUT_BAD;
}

/* One send for header and metadata: two small sends in a row wait out the
 * peer's delayed ACK (Nagle), 40 ms a request. */
static bool send_frame(int fd, uint16_t type, uint64_t req, const void *meta, size_t mlen) {
    dj_frame_header h = {.magic = DJ_PROTO_MAGIC, .version = DJ_PROTO_VERSION, .type = type,
                         .meta_len = (uint32_t)mlen, .request_id = req};
    uint8_t b[DJ_FRAME_HEADER_BYTES + 512];
    if (mlen > sizeof b - DJ_FRAME_HEADER_BYTES) return false;
    dj_frame_header_encode(&h, b);
    if (mlen) memcpy(b + DJ_FRAME_HEADER_BYTES, meta, mlen);
    const size_t n = DJ_FRAME_HEADER_BYTES + mlen;
    return send(fd, b, n, MSG_NOSIGNAL) == (ssize_t)n;
}

/* errno tells a timeout (EAGAIN) from EOF */
static dj_test_frame read_frame(int fd, const char *key) {
    errno = 0;
    return dj_test_raw_frame(fd, key);
}

/* A frame, with a TOKEN's id in val and its text in text[cap]. */
static dj_test_frame token_frame(int fd, char *text, size_t cap) {
    dj_test_frame f = {.type = -1};
    uint8_t b[DJ_FRAME_HEADER_BYTES], m[4096];
    dj_frame_header h;
    if (dj_test_raw_recv(fd, b, sizeof b) || dj_frame_header_decode(b, DJ_PROTO_MAX_REPLY_PAYLOAD, &h) != DJ_OK ||
        h.meta_len + h.payload_len > sizeof m || dj_test_raw_recv(fd, m, h.meta_len + h.payload_len))
        return f;
    f.type = h.type;
    dj__meta meta;
    if (dj__meta_parse(&meta, m, h.meta_len) != DJ_OK) return f;
    const char *t = NULL;
    size_t n = 0;
    dj__meta_i64(&meta, "status", false, &f.st);
    dj__meta_u64(&meta, "id", false, &f.val);
    if (dj__meta_str(&meta, f.type == DJ_MSG_ERROR ? "message" : "text", false, &t, &n) == DJ_OK && t) {
        char *dst = f.type == DJ_MSG_ERROR ? f.msg : text;
        const size_t c = f.type == DJ_MSG_ERROR ? sizeof f.msg : cap;
        if (n >= c) n = c - 1;
        memcpy(dst, t, n);
        dst[n] = 0;
    }
    dj__meta_destroy(&meta);
    return f;
}

static int connect_hello(void) {
    dj_test_frame f;
    int fd = dj_test_raw_hello(addr, RECV_TIMEOUT_S, NULL, &f);
    if (fd >= 0 && f.type != DJ_MSG_REPLY) {
        close(fd);
        return -1;
    }
    return fd;
}

static uint64_t open_session(int fd) {
    dj__mw w;
    uint8_t m[256];
    dj__mw_init(&w);
    dj__mw_str(&w, "model", "demo");
    dj__mw_u64(&w, "expected_tokens", 32);
    const size_t n = dj_test_meta_of(&w, m);
    if (!send_frame(fd, DJ_MSG_SESSION_OPEN, 2, m, n)) return 0;
    dj_test_frame f = read_frame(fd, "session");
    return f.type == DJ_MSG_REPLY ? f.val : 0;
}

static outcome run_hello(void (*arm_fn)(void), char *why, size_t cap) {
    arm_fn(); /* the connection's acceptance is the request's too */
    dj_test_frame f;
    int fd = dj_test_raw_hello(addr, RECV_TIMEOUT_S, NULL, &f);
    if (fd < 0) {
        snprintf(why, cap, "cannot connect");
        return OUT_BAD;
    }
    outcome o = frame_outcome(&f, DJ_MSG_REPLY, why, cap);
    close(fd);
    return o;
}

static outcome run_stats(void (*arm_fn)(void), char *why, size_t cap) {
    int fd = connect_hello();
    if (fd < 0) return snprintf(why, cap, "setup: HELLO failed"), OUT_BAD;
    arm_fn();
    outcome o = OUT_BAD;
    if (send_frame(fd, DJ_MSG_STATS, 3, NULL, 0)) {
        dj_test_frame f = read_frame(fd, NULL);
        o = frame_outcome(&f, DJ_MSG_REPLY, why, cap);
    }
    close(fd);
    return o;
}

static outcome run_open(void (*arm_fn)(void), char *why, size_t cap) {
    int fd = connect_hello();
    if (fd < 0) return snprintf(why, cap, "setup: HELLO failed"), OUT_BAD;
    dj__mw w;
    uint8_t m[256];
    dj__mw_init(&w);
    dj__mw_str(&w, "model", "demo");
    dj__mw_u64(&w, "expected_tokens", 32);
    const size_t n = dj_test_meta_of(&w, m);
    arm_fn();
    outcome o = OUT_BAD;
    if (send_frame(fd, DJ_MSG_SESSION_OPEN, 2, m, n)) {
        dj_test_frame f = read_frame(fd, "session");
        o = frame_outcome(&f, DJ_MSG_REPLY, why, cap);
    }
    close(fd); /* the session goes with its connection */
    return o;
}

/* A GENERATE of a text prompt on the demo model: TOKEN frames, then DONE. */
static outcome run_generate(void (*arm_fn)(void), char *why, size_t cap) {
    int fd = connect_hello();
    if (fd < 0) return snprintf(why, cap, "setup: HELLO failed"), OUT_BAD;
    const uint64_t sess = open_session(fd);
    if (!sess) {
        close(fd);
        return snprintf(why, cap, "setup: SESSION_OPEN failed"), OUT_BAD;
    }
    dj__mw w;
    uint8_t m[256];
    dj__mw_init(&w);
    dj__mw_u64(&w, "session", sess);
    dj__mw_str(&w, "prompt", "Once upon");
    dj__mw_u64(&w, "max_tokens", 2);
    dj__mw_f64(&w, "temperature", 0);
    const size_t n = dj_test_meta_of(&w, m);
    arm_fn();
    outcome o = OUT_BAD;
    if (send_frame(fd, DJ_MSG_GENERATE, 4, m, n)) {
        dj_test_frame f;
        size_t at = 0;
        for (;;) {
            char text[64] = "";
            errno = 0;
            f = token_frame(fd, text, sizeof text);
            if (f.type != DJ_MSG_TOKEN) break;
            at += (size_t)snprintf(answer + at, at < sizeof answer ? sizeof answer - at : 0, "%llu '%s' ",
                                   (unsigned long long)f.val, text);
        }
        o = frame_outcome(&f, DJ_MSG_DONE, why, cap);
    }
    close(fd);
    return o;
}

/* An OpenAI answer: 200 with mark in its body (its "key": string kept as the
 * answer), or 5xx with a JSON error (4xx blames the client: not this). */
static outcome http_outcome(dj_test_resp *r, const char *mark, const char *key, char *why, size_t cap) {
    outcome o;
    const char *k = r->body ? strstr(r->body, key) : NULL;
    if (r->status == 200 && r->body && strstr(r->body, mark) && k) {
        k += strlen(key);
        const char *e = strchr(k, '"');
        snprintf(answer, sizeof answer, "%.*s", e ? (int)(e - k) : 0, k);
        o = OUT_OK;
    } else if (r->status >= 500 && r->body && strstr(r->body, "\"error\"")) {
        snprintf(why, cap, "HTTP %d %.200s", r->status, r->body);
        o = OUT_ERROR;
    } else if (r->status == 0) {
        snprintf(why, cap, "connection closed with no answer");
        o = OUT_CLOSED;
    } else {
        snprintf(why, cap, "HTTP %d %.200s", r->status, r->body ? r->body : "");
        o = OUT_BAD;
    }
    dj_test_resp_free(r);
    return o;
}

/* POST /v1/completions through the OpenAI front door. */
static outcome run_http(void (*arm_fn)(void), char *why, size_t cap) {
    arm_fn();
    dj_test_resp r = dj_test_http_request(http_port, "POST", "/v1/completions", NULL,
                                          "{\"model\": \"demo\", \"prompt\": \"Once upon\", \"max_tokens\": 2, "
                                          "\"temperature\": 0}");
    return http_outcome(&r, "\"text_completion\"", "\"text\":\"", why, cap);
}

/* POST /v1/chat/completions on demo-chat: its chat template rendered. */
static outcome run_chat(void (*arm_fn)(void), char *why, size_t cap) {
    arm_fn();
    dj_test_resp r = dj_test_http_request(http_port, "POST", "/v1/chat/completions", NULL,
                                          "{\"model\": \"demo-chat\", \"max_completion_tokens\": 2, "
                                          "\"temperature\": 0, \"messages\": [{\"role\": \"user\", "
                                          "\"content\": \" Hi \"}]}");
    return http_outcome(&r, "\"chat.completion\"", "\"content\":\"", why, cap);
}

/* The tokenizer's load itself, on this thread (counted for the call). The
 * daemon reads a model's tokenizer.json at the first text GENERATE after the
 * model was loaded: the demo model is unloaded with its last session, so every
 * GENERATE above reads it again, inside the daemon. */
static outcome run_tokenizer(void (*arm_fn)(void), char *why, size_t cap) {
    char path[300];
    snprintf(path, sizeof path, "%s/models/demo/tokenizer.json", DJ_SOURCE_DIR);
    dj_tokenizer_t *tok = NULL;
    dj_alloc_thread_exempt(false);
    arm_fn();
    dj_status st = dj_tokenizer_load(path, &tok);
    dj_alloc_thread_exempt(true);
    if (st != DJ_OK) {
        snprintf(why, cap, "%s: %s", dj_status_name(st), dj_last_error());
        return st == DJ_ENOMEM && !tok ? OUT_ERROR : OUT_BAD;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    st = dj_tokenizer_encode(tok, "Once upon", 9, true, &ids, &n);
    free(ids);
    dj_tokenizer_free(tok);
    if (st != DJ_OK || n < 2) return snprintf(why, cap, "the tokenizer loaded does not encode"), OUT_BAD;
    return OUT_OK;
}

/* From the HTTP requests on, demo and demo-chat stay loaded (MODEL_LOAD on a
 * connection kept open): the worker reads their tokenizers once, not at every
 * request (a third of an HTTP request's time under ASan). The binary GENERATE
 * before covers the worker's reading of a tokenizer. Returns the connection. */
static int pin_models(void) {
    const int fd = connect_hello();
    static const char *const names[] = {"demo", "demo-chat"};
    for (int i = 0; i < 2; i++) {
        dj__mw w;
        uint8_t m[128];
        dj__mw_init(&w);
        dj__mw_str(&w, "model", names[i]);
        const size_t n = dj_test_meta_of(&w, m);
        CHECK_MSG(fd >= 0 && send_frame(fd, DJ_MSG_MODEL_LOAD, 10 + (uint64_t)i, m, n) &&
                      read_frame(fd, NULL).type == DJ_MSG_REPLY,
                  "MODEL_LOAD %s", names[i]);
    }
    return fd;
}

/* ---- the fault loop ---- */

static void leak_check(const char *name) {
#ifdef HAVE_LSAN
    CHECK_MSG(__lsan_do_recoverable_leak_check() == 0, "%s: memory leaked (see the report above)", name);
#else
    (void)name;
#endif
}

/* Every n from 1 until the request runs with its fault unfired. After each:
 * an answer (its reply, an error, or at worst a closed connection - never a
 * hang or a wrong frame) and the same request served again unfaulted. */
static void fault_all(const request *rq, uint64_t max_n) {
    char why[512], want[sizeof answer];
    const double t0 = dj_test_now_s(); /* printed, never judged */
    armed_n = 0;
    answer[0] = 0;
    outcome o = rq->run(arm, why, sizeof why);
    const uint64_t count = dj_alloc_counted();
    dj_alloc_fail_nth(0);
    memcpy(want, answer, sizeof want);
    CHECK_MSG(o == OUT_OK, "%s: unfaulted run: %s (%s)", rq->name, outcome_name[o], why);
    int seen[4] = {0};
    uint64_t n = 1;
    for (; n <= max_n; n++) {
        why[0] = answer[0] = 0;
        armed_n = n;
        o = rq->run(arm, why, sizeof why);
        const bool fired = dj_alloc_fault_fired();
        dj_alloc_fail_nth(0);
        if (o == OUT_OK && strcmp(answer, want)) { /* absorbed, but not correctly */
            snprintf(why, sizeof why, "answered '%.200s', unfaulted '%.200s'", answer, want);
            o = OUT_BAD;
        }
        if (!fired) {
            CHECK_MSG(o == OUT_OK, "%s: n=%llu, fault unfired: %s (%s)", rq->name, (unsigned long long)n,
                      outcome_name[o], why);
            break;
        }
        seen[o]++;
        CHECK_MSG(o != OUT_BAD, "%s: allocation %llu failed: %s (%s)", rq->name, (unsigned long long)n,
                  outcome_name[o], why);
        if (getenv("DJ_FAULT_VERBOSE"))
            printf("  %s n=%llu: %s %s\n", rq->name, (unsigned long long)n, outcome_name[o], why);
        char why2[512] = "";
        armed_n = 0;
        answer[0] = 0;
        outcome again = rq->run(arm, why2, sizeof why2);
        dj_alloc_fail_nth(0);
        if (again == OUT_OK && strcmp(answer, want)) {
            snprintf(why2, sizeof why2, "answered '%.200s', before '%.200s'", answer, want);
            again = OUT_BAD;
        }
        CHECK_MSG(again == OUT_OK, "%s: after allocation %llu failed, not served again: %s (%s)", rq->name,
                  (unsigned long long)n, outcome_name[again], why2);
        if (again != OUT_OK || o == OUT_BAD) break; /* what follows would only repeat it */
    }
    CHECK_MSG(n <= max_n, "%s: still faulting past %llu allocations", rq->name, (unsigned long long)max_n);
    printf("%-16s %4llu allocations unfaulted; n = 1..%llu failed: %d answered ok, %d errors, %d closed, %d bad "
           "(%.1f s)\n",
           rq->name, (unsigned long long)count, (unsigned long long)(n - 1), seen[OUT_OK], seen[OUT_ERROR],
           seen[OUT_CLOSED], seen[OUT_BAD], dj_test_now_s() - t0);
    fflush(stdout);
    leak_check(rq->name);
}

int main(void) {
    /* nothing random here: one run, no seeds */
    dj_alloc_thread_exempt(true); /* this thread is the client: only the daemon's threads are counted */
    signal(SIGPIPE, SIG_IGN);
    if (!mkdtemp(tmpdir)) return fprintf(stderr, "test_fault: mkdtemp failed\n"), 1;
    pthread_t th;
    const bool up = start_daemon(&th);
    CHECK_MSG(up, "the in-process djinnd did not start (rc %d)", daemon_rc);
    if (up) {
        /* warm-up, unfaulted: the model and the front door's tokenizer load once */
        char why[256];
        armed_n = 0;
        CHECK(run_generate(arm, why, sizeof why) == OUT_OK);
        CHECK(run_http(arm, why, sizeof why) == OUT_OK);
        dj_alloc_fail_nth(0);
        static const request reqs[] = {
            {"HELLO", run_hello},
            {"STATS", run_stats},
            {"SESSION_OPEN", run_open},
            {"GENERATE", run_generate},
            {"HTTP completions", run_http},
            {"HTTP chat", run_chat},
            {"tokenizer load", run_tokenizer},
        };
        const char *only = getenv("DJ_FAULT_ONLY"); /* one request by name, to chase a failure */
        int pin_fd = -1;
        for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++) {
            if (reqs[i].run == run_http && pin_fd < 0) pin_fd = pin_models(); /* see pin_models */
            if (!only || !strcmp(only, reqs[i].name)) fault_all(&reqs[i], 20000);
        }
        if (pin_fd >= 0) close(pin_fd);
    }
    kill(getpid(), SIGTERM); /* the daemon's own signal watcher stops it */
    pthread_join(th, NULL);
    CHECK_MSG(daemon_rc == 0, "djinnd returned %d", daemon_rc);
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_fault");
}
