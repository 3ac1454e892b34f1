/* daemon_util.h: what the programs that drive a real djinnd share - start and
 * stop it as a child process, and talk raw frames to it (tests and bench_soak). */
#ifndef DJ_DAEMON_UTIL_H
#define DJ_DAEMON_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "proto/proto_impl.h"

double dj_test_now_s(void); /* CLOCK_MONOTONIC, seconds */
void dj_test_sleep_ms(int ms);

/* ---- a djinnd child per slot ---- */

#define DJ_TEST_DAEMON_SLOTS 8

/* It runs DJINND --listen LISTEN --port-file DIR/portSLOT --models MODELS
 * --vmu-gb 256m --threads 1, then the caller's extra args. */
typedef struct dj_test_daemon_opts {
    const char *djinnd; /* the executable */
    const char *dir;    /* where portN (and errN) are written */
    const char *models; /* --models */
    const char *listen; /* --listen; a "unix:PATH" is also the address handed back */
    bool save_stderr;   /* the daemon's stderr into DIR/errSLOT */
    bool small_asan_quarantine; /* ASan's freed-block quarantine at 8 MiB, so
                                   RSS bounds count the daemon's own memory */
    rlim_t nofile;      /* the daemon's RLIMIT_NOFILE; 0 leaves it */
    int wait_ms;        /* how long to wait for its port file */
} dj_test_daemon_opts;

/* Starts djinnd into slot (0..DJ_TEST_DAEMON_SLOTS-1); addr[cap] gets where it
 * listens. Returns its pid, or -1: with *exit_code (may be NULL) set when it
 * exited, left 0 when it did not write its port in time (it stays in the slot). */
pid_t dj_test_daemon_start(int slot, const dj_test_daemon_opts *o, const char *const *extra, char *addr,
                           size_t cap, int *exit_code /* OUT */);
/* A loopback TCP port nobody listens on now, or 0. Another process (a test
 * running beside this one) may bind it before the daemon it is meant for
 * does: callers try a fresh one when that daemon exits at start. */
int dj_test_free_port(void);
/* SIGTERM, then wait at most wait_ms (SIGKILL after); empties the slot.
 * Returns the exit status, or -1 (killed, or an empty slot). */
int dj_test_daemon_stop(int slot, int wait_ms);
/* Kills every started daemon at exit and on SIGSEGV, SIGABRT, SIGTERM, SIGINT. */
void dj_test_daemon_guard(void);

/* ---- raw frames ---- */

/* A socket connected to addr ("host:port" or "unix:PATH"), or -1. from: an
 * IPv4 address to bind first (NULL: any). A timeout of 0 seconds leaves it unset. */
int dj_test_raw_connect(const char *addr, const char *from, int recv_timeout_s, int send_timeout_s);
/* Sends a header claiming plen payload bytes, and meta[mlen]; false once the
 * socket takes no more. */
bool dj_test_raw_send(int fd, uint16_t type, uint64_t req, const void *meta, size_t mlen, uint64_t plen);
/* Reads exactly n bytes; -1 on EOF, error or timeout. */
int dj_test_raw_recv(int fd, void *buf, size_t n);

/* One answer frame: its type (-1 on EOF or error), the ERROR status in st,
 * the ERROR message in msg, and a u64 field `key` of a REPLY in val. */
typedef struct dj_test_frame {
    int type;
    int64_t st;
    char msg[1024];
    uint64_t val;
} dj_test_frame;

dj_test_frame dj_test_raw_frame(int fd, const char *key /* may be NULL */);
/* Finishes w into out (room for its bytes) and frees it; returns the length. */
size_t dj_test_meta_of(dj__mw *w, uint8_t *out);
/* Connects (recv timeout in seconds) and says HELLO (token may be NULL); the
 * answer in *ans. Returns the socket, or -1. */
int dj_test_raw_hello(const char *addr, int recv_timeout_s, const char *token, dj_test_frame *ans /* OUT */);

/* ---- a small HTTP/1.1 client (djinnd --http) ---- */

/* A socket connected to 127.0.0.1:port (30 s receive timeout), or -1. */
int dj_test_http_connect(unsigned port);
bool dj_test_send_all(int fd, const void *p, size_t n);
/* METHOD PATH with "Connection: close", extra header lines (each ending in
 * \r\n; may be NULL) and a JSON body (may be NULL). */
bool dj_test_http_send(int fd, const char *method, const char *path, const char *headers, const char *body);
typedef struct dj_test_resp {
    int status;  /* 0 when nothing readable came */
    char *body;  /* malloc'd, NUL-terminated, chunked encoding undone */
    size_t len;
} dj_test_resp;
/* Reads to EOF. */
dj_test_resp dj_test_http_read(int fd);
/* connect + send + read + close. */
dj_test_resp dj_test_http_request(unsigned port, const char *method, const char *path, const char *headers,
                                  const char *body);
void dj_test_resp_free(dj_test_resp *r);
/* dj_test_http_request with no extra headers: the status, the body copied into
 * out[cap] ("" when none). */
int dj_test_http_text(unsigned port, const char *method, const char *path, const char *body, char *out, size_t cap);
/* The HTTP port djinnd wrote into DIR/portSLOT (its second number), or 0. */
unsigned dj_test_http_port(const char *dir, int slot);
/* djinnd on the model store in slot with --models STORE --http 127.0.0.1:0 and
 * extra (may be NULL; 11 at most), its port files in dir, a 10 s start: *addr
 * its listener, *http_port the API's port (0 if none). Returns its pid, or -1. */
pid_t dj_test_http_daemon_start(int slot, const char *dir, const char *store, const char *const *extra, char *addr,
                                size_t cap, unsigned *http_port);

/* ---- model stores and probes ---- */

/* The chat template demo-chat carries (in JSON string form). */
#define DJ_TEST_CHAT_TEMPLATE                                                                                  \
    "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\\n{% endfor %}"              \
    "{% if add_generation_prompt %}assistant:{% endif %}"
/* Makes the directory dir holding links to the demo model's weights, config,
 * tokenizer and generation config. */
bool dj_test_link_demo_files(const char *dir);
/* STORE/demo-chat: the demo model's files and a tokenizer_config.json with
 * DJ_TEST_CHAT_TEMPLATE (STORE must exist). */
bool dj_test_make_demo_chat(const char *store);
/* DIR/store (written into store[cap]) made, holding a link "demo" to the
 * demo model. */
bool dj_test_demo_store(const char *dir, char *store, size_t cap);
/* The VmRSS of pid in KiB, or -1. */
long dj_test_rss_kb(pid_t pid);
/* Sends copies of frame[len] without reading until total bytes went or the
 * peer took none for 1 s. Returns the bytes sent. */
size_t dj_test_flood(int fd, const uint8_t *frame, size_t len, size_t total);

#endif
