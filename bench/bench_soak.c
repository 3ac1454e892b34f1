/* bench_soak.c: honest and hostile clients against one djinnd for a while -
 * every interval, the honest requests' p50/p99 latency and the daemon's RSS;
 * at the end the whole run's (soak.sh compares a hostile run with a quiet one).
 * usage: bench_soak ADDR TOKEN PID SECONDS HONEST HOSTILE [MODEL [HTTP_PORT BATCH_TOKEN]]
 * (soak.sh starts the daemon). With HTTP_PORT and BATCH_TOKEN one more honest
 * client speaks HTTP, and the hostile ones add issue 43's attacks. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "djinn/client.h"
#include "proto/proto_impl.h"
#include "daemon_util.h"

#define MAX_LAT 200000
#define MAX_ALL 4000000 /* latencies of the whole run, per kind */

static const char *addr, *token, *model = "demo", *batch_token;
static unsigned http_port;
static volatile int stop;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* per kind (0: binary protocol, 1: HTTP): the current interval's and the whole run's latencies, seconds */
static double lat[2][MAX_LAT], *all[2];
static size_t n_lat[2], n_all[2], n_err[2], n_err_all[2], n_attacks, n_attacks_all;
/* what each client thread is doing (for a report of those still blocked after the end), and how many ended */
#define MAX_TH 130
static const char *volatile doing[MAX_TH];
static int n_ended, is_done[MAX_TH];
static void ended(int me) {
    __atomic_store_n(&is_done[me], 1, __ATOMIC_RELEASE);
    __atomic_add_fetch(&n_ended, 1, __ATOMIC_RELEASE);
}

static void note_kind(int k, double dt, bool ok) {
    pthread_mutex_lock(&mu);
    if (!ok) {
        n_err[k]++;
        n_err_all[k]++;
    } else {
        if (n_lat[k] < MAX_LAT) lat[k][n_lat[k]++] = dt;
        if (n_all[k] < MAX_ALL) all[k][n_all[k]++] = dt;
    }
    pthread_mutex_unlock(&mu);
}
static void note(double dt, dj_status st) { note_kind(0, dt, st == DJ_OK); }

/* An honest client: a session, GENERATE of 16 tokens, STEP, close - again and again. */
static void *honest(void *arg) {
    const int me = (int)(uintptr_t)arg;
    unsigned seed = (unsigned)me + 1;
    while (!stop) {
        dj_client_t *c = NULL;
        double t = dj_test_now_s();
        doing[me] = "honest: connect";
        dj_status st = dj_client_connect(addr, token, &c);
        note(dj_test_now_s() - t, st);
        for (int round = 0; c && round < 20 && !stop; round++) {
            uint64_t s = 0;
            dj_session_opts o = {model, DJ_QOS_INTERACTIVE, 256};
            t = dj_test_now_s();
            doing[me] = "honest: SESSION_OPEN";
            st = dj_client_session_open(c, &o, &s);
            note(dj_test_now_s() - t, st);
            if (st != DJ_OK) break;
            int32_t ids[8];
            for (int i = 0; i < 8; i++) ids[i] = 2 + (int32_t)(rand_r(&seed) % 1000);
            dj_generate_params p;
            memset(&p, 0, sizeof p);
            p.ids = ids;
            p.n_ids = 8;
            p.sampling.top_p = 1;
            p.max_tokens = 16;
            t = dj_test_now_s();
            doing[me] = "honest: GENERATE";
            st = dj_client_generate(c, s, &p, NULL, NULL, NULL);
            note(dj_test_now_s() - t, st);
            dj_remote_tensor rt;
            t = dj_test_now_s();
            doing[me] = "honest: STEP";
            st = dj_client_step(c, s, ids, 4, false, &rt);
            note(dj_test_now_s() - t, st);
            t = dj_test_now_s();
            doing[me] = "honest: SESSION_CLOSE";
            st = dj_client_session_close(c, s);
            note(dj_test_now_s() - t, st);
        }
        doing[me] = "honest: close";
        dj_client_free(c);
    }
    ended(me);
    return NULL;
}

/* An honest HTTP client: POST /v1/completions of 16 tokens from 8 ids, again and again. */
static void *honest_http(void *arg) {
    const int me = (int)(uintptr_t)arg;
    unsigned seed = (unsigned)me + 1;
    doing[me] = "honest: POST /v1/completions";
    char auth[400], body[512];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", token);
    while (!stop) {
        int n = snprintf(body, sizeof body, "{\"model\": \"%s\", \"max_tokens\": 16, \"temperature\": 0, \"prompt\": [",
                         model);
        for (int i = 0; i < 8; i++) n += snprintf(body + n, sizeof body - (size_t)n, "%s%u", i ? "," : "",
                                                   2 + rand_r(&seed) % 1000);
        snprintf(body + n, sizeof body - (size_t)n, "]}");
        const double t = dj_test_now_s();
        dj_test_resp r = dj_test_http_request(http_port, "POST", "/v1/completions", auth, body);
        note_kind(1, dj_test_now_s() - t, r.status == 200);
        dj_test_resp_free(&r);
    }
    ended(me);
    return NULL;
}

/* Hostile connections come from 127.0.0.2 (another loopback address), so
 * the failed-HELLO slowdown and the per-address shares of their address do
 * not touch the honest ones; a daemon that stops taking bytes shows as a 2 s
 * send timeout. */
static int raw_connect(void) { return dj_test_raw_connect(addr, "127.0.0.2", 2, 2); }
static int http_raw_connect(void) {
    char a[64];
    snprintf(a, sizeof a, "127.0.0.1:%u", http_port);
    return dj_test_raw_connect(a, "127.0.0.2", 5, 5);
}

static void raw_hello(int fd, const char *tok) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "version", 1);
    if (tok) dj__mw_str(&w, "token", tok);
    dj__mw_finish(&w);
    dj_test_raw_send(fd, DJ_MSG_HELLO, 1, w.sb.data, w.sb.size, 0);
    dj__mw_destroy(&w);
    char b[256];
    if (recv(fd, b, sizeof b, 0) < 0) return; /* the REPLY (or ERROR) */
}

static bool raw_meta(int fd, uint16_t type, uint64_t req, dj__mw *w) {
    dj__mw_finish(w);
    const bool ok = dj_test_raw_send(fd, type, req, w->sb.data, w->sb.size, 0);
    dj__mw_destroy(w);
    return ok;
}

/* Reads what is there for up to ms (the answers of a flood), discarding it. */
static void drain(int fd, int ms) {
    char b[4096];
    for (double t = dj_test_now_s(); dj_test_now_s() - t < ms / 1e3 && !stop;)
        if (recv(fd, b, sizeof b, MSG_DONTWAIT) <= 0) dj_test_sleep_ms(20);
}

/* Issue 43: 4 GENERATEs with 1 MB text prompts from a batch-only token
 * (refused or tokenized off the engine worker; the session's context ends
 * each one) on one connection. */
static char text[1000000]; /* filled by main before the threads start */
static void attack_prompts(int fd) {
    raw_hello(fd, batch_token);
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_str(&w, "model", model);
    dj__mw_str(&w, "qos", "batch");
    raw_meta(fd, DJ_MSG_SESSION_OPEN, 2, &w);
    const dj_test_frame f = dj_test_raw_frame(fd, "session");
    if (f.type != DJ_MSG_REPLY) return;
    for (int i = 0; i < 4 && !stop; i++) {
        dj__mw_init(&w);
        dj__mw_u64(&w, "session", f.val);
        dj__mw_strn(&w, "prompt", text, sizeof text);
        dj__mw_u64(&w, "max_tokens", 1);
        if (!raw_meta(fd, DJ_MSG_GENERATE, 10 + (uint64_t)i, &w)) break;
    }
    drain(fd, 2000);
}

/* Issue 43: 8 slowloris connections on the HTTP port, a header byte every 500 ms until closed (or 12 s). */
static void attack_slowloris(void) {
    int fds[8];
    for (int i = 0; i < 8; i++) {
        fds[i] = http_raw_connect();
        if (fds[i] >= 0) dj_test_send_all(fds[i], "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: ", 51);
    }
    for (int tick = 0; tick < 24 && !stop; tick++) {
        dj_test_sleep_ms(500);
        int open = 0;
        for (int i = 0; i < 8; i++)
            if (fds[i] >= 0) {
                if (send(fds[i], "a", 1, MSG_NOSIGNAL) == 1) open++;
                else close(fds[i]), fds[i] = -1;
            }
        if (!open) break;
    }
    for (int i = 0; i < 8; i++)
        if (fds[i] >= 0) close(fds[i]);
}

/* Issue 43: 100 silent binary connections (no HELLO) held 3 s. */
static void attack_silent(void) {
    int fds[100];
    for (int i = 0; i < 100; i++) fds[i] = raw_connect();
    dj_test_sleep_ms(3000);
    for (int i = 0; i < 100; i++)
        if (fds[i] >= 0) close(fds[i]);
}

/* Issue 43: the batch token's connections and sessions until refused
 * (--max-connections-per-token, --max-sessions-per-token), held 2 s. */
static void attack_token_flood(void) {
    enum { N = 300 };
    dj_client_t **cs = calloc(N, sizeof *cs); /* per call: hostile threads run this at once */
    if (!cs) return;
    int n = 0;
    for (; n < N && !stop; n++) {
        if (dj_client_connect(addr, batch_token, &cs[n]) != DJ_OK) break;
        uint64_t s;
        dj_session_opts o = {model, DJ_QOS_BATCH, 32};
        for (int k = 0; k < 2; k++)
            if (dj_client_session_open(cs[n], &o, &s) != DJ_OK) break;
    }
    dj_test_sleep_ms(2000);
    for (int i = 0; i < n; i++) dj_client_free(cs[i]);
    free(cs);
}

/* Issue 43: oversized JSON bodies on the HTTP port - 5 MB (over
 * --http-max-body: 413) and 3.9 MB of small numbers (too many JSON values
 * for the model's context: 413 before it is parsed). */
static void attack_bodies(void) {
    enum { CAP = (5 << 20) + 64 };
    char *big = malloc(CAP); /* per call: hostile threads run this at once */
    if (!big) return;
    const size_t sizes[2] = {5u << 20, 3900000};
    for (int k = 0; k < 2 && !stop; k++) {
        const size_t n = sizes[k];
        int o = snprintf(big, CAP, "{\"model\": \"%s\", \"max_tokens\": 1, \"prompt\": [", model);
        while ((size_t)o < n - 8) o += snprintf(big + o, CAP - (size_t)o, "7,");
        snprintf(big + o, CAP - (size_t)o, "7]}");
        const size_t len = strlen(big);
        int fd = http_raw_connect();
        if (fd < 0) continue;
        char head[512];
        snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                 "Authorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                 batch_token, len);
        if (dj_test_send_all(fd, head, strlen(head))) dj_test_send_all(fd, big, len);
        dj_test_resp r = dj_test_http_read(fd);
        dj_test_resp_free(&r);
        close(fd);
    }
    free(big);
}

/* A hostile client: one attack per round, in turn - issue 9's six, then
 * (with the HTTP port and a batch token) issue 43's five. */
static void *hostile(void *arg) {
    const int me = (int)((uintptr_t)arg >> 8);
    int kind = (int)((uintptr_t)arg & 0xff);
    static const char *const names[11] = {"unread HEARTBEATs", "idle without HELLO", "a wrong token",
                                          "a STEP claiming 1 GiB", "sessions until refused", "unread STATS",
                                          "1 MB prompts", "slowloris HTTP", "silent connections",
                                          "a token's connection flood", "oversized JSON bodies"};
    static uint8_t junk[1 << 16];
    const int n_kinds = http_port && batch_token ? 11 : 6;
    const char *tok = batch_token ? batch_token : token; /* the attacker's own token when there is one */
    while (!stop) {
        const int k = kind++ % n_kinds;
        doing[me] = names[k];
        int fd = k < 7 ? raw_connect() : -1;
        if (k < 7 && fd < 0) {
            dj_test_sleep_ms(50);
            continue;
        }
        switch (k) {
        case 0: /* HEARTBEATs, never read, for 2 s */
            raw_hello(fd, tok);
            for (double t = dj_test_now_s(); dj_test_now_s() - t < 2 && !stop;)
                if (!dj_test_raw_send(fd, DJ_MSG_HEARTBEAT, 1, NULL, 0, 0)) break;
            break;
        case 1: /* idle without HELLO */
            dj_test_sleep_ms(1500);
            break;
        case 2: /* guessed tokens */
            raw_hello(fd, "guess");
            break;
        case 3: { /* a STEP claiming 1 GiB */
            raw_hello(fd, tok);
            dj_test_raw_send(fd, DJ_MSG_STEP, 1, "\x81\xa7session\x01", 10, (uint64_t)1 << 30);
            send(fd, junk, sizeof junk, MSG_NOSIGNAL);
            break;
        }
        case 4: { /* sessions until refused */
            dj_client_t *c = NULL;
            if (dj_client_connect(addr, tok, &c) == DJ_OK) {
                uint64_t s;
                dj_session_opts o = {model, DJ_QOS_BATCH, 32};
                for (int i = 0; i < 100 && dj_client_session_open(c, &o, &s) == DJ_OK; i++) continue;
            }
            dj_client_free(c);
            break;
        }
        case 5: /* STATS, never read */
            raw_hello(fd, tok);
            for (int i = 0; i < 2000 && !stop; i++)
                if (!dj_test_raw_send(fd, DJ_MSG_STATS, 1, NULL, 0, 0)) break;
            dj_test_sleep_ms(500);
            break;
        case 6: attack_prompts(fd); break;
        case 7: attack_slowloris(); break;
        case 8: attack_silent(); break;
        case 9: attack_token_flood(); break;
        default: attack_bodies(); break;
        }
        if (fd >= 0) close(fd);
        pthread_mutex_lock(&mu);
        n_attacks++;
        n_attacks_all++;
        pthread_mutex_unlock(&mu);
    }
    ended(me);
    return NULL;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const double *v, size_t n, double q) { return n ? v[(size_t)((double)n * q)] * 1e3 : 0.0; }

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: bench_soak ADDR TOKEN DJINND_PID SECONDS HONEST HOSTILE [MODEL [HTTP_PORT BATCH_TOKEN]]\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN); /* a write to a socket the daemon closed is an error, not the end of the run */
    addr = argv[1];
    token = argv[2];
    const int secs = atoi(argv[4]), n_honest = atoi(argv[5]), n_hostile = atoi(argv[6]);
    if (argc > 7) model = argv[7];
    if (argc > 9) {
        http_port = (unsigned)atoi(argv[8]);
        batch_token = argv[9];
    }
    if (secs <= 0 || n_honest <= 0 || n_honest > 64 || n_hostile < 0 || n_hostile > 64) {
        fprintf(stderr, "bench_soak: SECONDS > 0, 1..64 honest and 0..64 hostile clients\n");
        return 2;
    }
    for (int k = 0; k < 2; k++)
        if (!(all[k] = malloc(MAX_ALL * sizeof *all[k]))) return 1;
    for (size_t i = 0; i < sizeof text; i++) text[i] = "hello world, "[i % 13];
    pthread_t th[MAX_TH];
    int n_th = 0;
    for (int i = 0; i < n_honest; i++, n_th++) pthread_create(&th[n_th], NULL, honest, (void *)(uintptr_t)n_th);
    if (http_port) pthread_create(&th[n_th], NULL, honest_http, (void *)(uintptr_t)n_th), n_th++;
    for (int i = 0; i < n_hostile; i++, n_th++)
        pthread_create(&th[n_th], NULL, hostile, (void *)((uintptr_t)n_th << 8 | (uintptr_t)i));
    printf("| t (s) | daemon RSS (MiB) | honest requests | errors | p50 (ms) | p99 (ms) | HTTP requests | HTTP errors "
           "| HTTP p99 (ms) | attacks |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    const int interval = secs >= 120 ? 60 : 10;
    static double copy[2][MAX_LAT];
    long rss_max = 0, rss = 0;
    for (int t = 1; t <= secs; t++) {
        sleep(1);
        rss = dj_test_rss_kb((pid_t)atoi(argv[3])); /* PID: soak.sh's daemon; its peak sampled every second */
        if (rss > rss_max) rss_max = rss;
        if (t % interval && t != secs) continue;
        size_t n[2], e[2];
        pthread_mutex_lock(&mu);
        for (int k = 0; k < 2; k++) {
            n[k] = n_lat[k];
            e[k] = n_err[k];
            memcpy(copy[k], lat[k], n[k] * sizeof *copy[k]);
            n_lat[k] = n_err[k] = 0;
        }
        const size_t a = n_attacks;
        n_attacks = 0;
        pthread_mutex_unlock(&mu);
        for (int k = 0; k < 2; k++) qsort(copy[k], n[k], sizeof *copy[k], cmp);
        printf("| %d | %.1f | %zu | %zu | %.2f | %.2f | %zu | %zu | %.2f | %zu |\n", t, rss / 1024.0, n[0], e[0],
               pct(copy[0], n[0], 0.5), pct(copy[0], n[0], 0.99), n[1], e[1], pct(copy[1], n[1], 0.99), a);
        fflush(stdout);
    }
    stop = 1;
    /* every client's last request answered within 60 s of the end (libdjinn waits for its answers forever) */
    for (int i = 0; i < 600 && __atomic_load_n(&n_ended, __ATOMIC_ACQUIRE) < n_th; i++) dj_test_sleep_ms(100);
    const int stuck = n_th - __atomic_load_n(&n_ended, __ATOMIC_ACQUIRE);
    if (stuck) {
        printf("%d client threads still blocked 60 s after the end:", stuck);
        for (int i = 0; i < n_th; i++)
            if (!__atomic_load_n(&is_done[i], __ATOMIC_ACQUIRE)) printf(" [%d] %s;", i, doing[i] ? doing[i] : "?");
        printf("\n");
    } else {
        for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    }
    for (int k = 0; k < 2; k++) qsort(all[k], n_all[k], sizeof *all[k], cmp);
    /* one line soak.sh reads: the whole run */
    printf("summary: honest %zu requests, %zu errors, p50 %.2f ms, p99 %.2f ms; HTTP %zu requests, %zu errors, "
           "p99 %.2f ms; attacks %zu; peak daemon RSS %.1f MiB\n",
           n_all[0], n_err_all[0], pct(all[0], n_all[0], 0.5), pct(all[0], n_all[0], 0.99), n_all[1], n_err_all[1],
           pct(all[1], n_all[1], 0.99), n_attacks_all, rss_max / 1024.0);
    if (stuck) _exit(3); /* blocked threads still use the arrays */
    for (int k = 0; k < 2; k++) free(all[k]);
    return 0;
}
