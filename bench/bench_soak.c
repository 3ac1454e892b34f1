/* bench_soak.c: honest and hostile clients against one djinnd for a while -
 * every interval, the honest requests' p50/p99 latency and the daemon's RSS.
 * usage: bench_soak ADDR TOKEN PID SECONDS HONEST HOSTILE [MODEL] (soak.sh starts the daemon). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "djinn/client.h"
#include "proto/proto_impl.h"
#include "daemon_util.h"

#define MAX_LAT 200000

static const char *addr, *token, *model = "demo";
static volatile int stop;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double lat[MAX_LAT]; /* honest request latencies of the current interval, seconds */
static size_t n_lat, n_err, n_attacks;

static void note(double dt, dj_status st) {
    pthread_mutex_lock(&mu);
    if (st != DJ_OK) n_err++;
    else if (n_lat < MAX_LAT) lat[n_lat++] = dt;
    pthread_mutex_unlock(&mu);
}

/* An honest client: a session, GENERATE of 16 tokens, STEP, close - again and again. */
static void *honest(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    while (!stop) {
        dj_client_t *c = NULL;
        double t = dj_test_now_s();
        dj_status st = dj_client_connect(addr, token, &c);
        note(dj_test_now_s() - t, st);
        for (int round = 0; c && round < 20 && !stop; round++) {
            uint64_t s = 0;
            dj_session_opts o = {model, DJ_QOS_INTERACTIVE, 256};
            t = dj_test_now_s();
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
            st = dj_client_generate(c, s, &p, NULL, NULL, NULL);
            note(dj_test_now_s() - t, st);
            dj_remote_tensor rt;
            t = dj_test_now_s();
            st = dj_client_step(c, s, ids, 4, false, &rt);
            note(dj_test_now_s() - t, st);
            t = dj_test_now_s();
            st = dj_client_session_close(c, s);
            note(dj_test_now_s() - t, st);
        }
        dj_client_free(c);
    }
    return NULL;
}

/* Hostile connections come from 127.0.0.2 (another loopback address), so
 * the failed-HELLO slowdown of their address does not touch the honest ones;
 * a daemon that stops taking bytes shows as a 2 s send timeout. */
static int raw_connect(void) { return dj_test_raw_connect(addr, "127.0.0.2", 2, 2); }

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

/* A hostile client: one of the attacks of issue 9 per round, in turn. */
static void *hostile(void *arg) {
    int kind = (int)(uintptr_t)arg;
    static uint8_t junk[1 << 16];
    while (!stop) {
        int fd = raw_connect();
        if (fd < 0) {
            dj_test_sleep_ms(50);
            continue;
        }
        switch (kind++ % 6) {
        case 0: /* HEARTBEATs, never read, for 2 s */
            raw_hello(fd, token);
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
            raw_hello(fd, token);
            dj_test_raw_send(fd, DJ_MSG_STEP, 1, "\x81\xa7session\x01", 10, (uint64_t)1 << 30);
            send(fd, junk, sizeof junk, MSG_NOSIGNAL);
            break;
        }
        case 4: { /* sessions until refused */
            dj_client_t *c = NULL;
            if (dj_client_connect(addr, token, &c) == DJ_OK) {
                uint64_t s;
                dj_session_opts o = {model, DJ_QOS_BATCH, 32};
                for (int i = 0; i < 100 && dj_client_session_open(c, &o, &s) == DJ_OK; i++) continue;
            }
            dj_client_free(c);
            break;
        }
        default: /* STATS, never read */
            raw_hello(fd, token);
            for (int i = 0; i < 2000 && !stop; i++)
                if (!dj_test_raw_send(fd, DJ_MSG_STATS, 1, NULL, 0, 0)) break;
            dj_test_sleep_ms(500);
            break;
        }
        close(fd);
        pthread_mutex_lock(&mu);
        n_attacks++;
        pthread_mutex_unlock(&mu);
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: bench_soak ADDR TOKEN DJINND_PID SECONDS HONEST HOSTILE [MODEL]\n");
        return 2;
    }
    addr = argv[1];
    token = argv[2];
    const int secs = atoi(argv[4]), n_honest = atoi(argv[5]), n_hostile = atoi(argv[6]);
    if (argc > 7) model = argv[7];
    if (secs <= 0 || n_honest <= 0 || n_honest > 64 || n_hostile < 0 || n_hostile > 64) {
        fprintf(stderr, "bench_soak: SECONDS > 0, 1..64 honest and 0..64 hostile clients\n");
        return 2;
    }
    pthread_t th[128];
    for (int i = 0; i < n_honest; i++) pthread_create(&th[i], NULL, honest, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < n_hostile; i++) pthread_create(&th[n_honest + i], NULL, hostile, (void *)(uintptr_t)i);
    printf("| t (s) | daemon RSS (MiB) | honest requests | errors | p50 (ms) | p99 (ms) | attacks |\n"
           "| --- | --- | --- | --- | --- | --- | --- |\n");
    const int interval = secs >= 120 ? 60 : 10;
    static double copy[MAX_LAT];
    long rss_max = 0;
    for (int t = interval; t <= secs; t += interval) {
        sleep(interval);
        pthread_mutex_lock(&mu);
        size_t n = n_lat, e = n_err, a = n_attacks;
        memcpy(copy, lat, n * sizeof *copy);
        n_lat = n_err = n_attacks = 0;
        pthread_mutex_unlock(&mu);
        qsort(copy, n, sizeof *copy, cmp);
        const long rss = dj_test_rss_kb((pid_t)atoi(argv[3])); /* PID: soak.sh's daemon */
        if (rss > rss_max) rss_max = rss;
        printf("| %d | %.1f | %zu | %zu | %.2f | %.2f | %zu |\n", t, rss / 1024.0, n, e,
               n ? copy[n / 2] * 1e3 : 0.0, n ? copy[(size_t)(n * 0.99)] * 1e3 : 0.0, a);
        fflush(stdout);
    }
    stop = 1;
    for (int i = 0; i < n_honest + n_hostile; i++) pthread_join(th[i], NULL);
    printf("peak daemon RSS %.1f MiB\n", rss_max / 1024.0);
    return 0;
}
