/* bench_soak.c: honest and hostile clients against one djinnd for a while -
 * every interval, the honest requests' p50/p99 latency and the daemon's RSS.
 * usage: bench_soak ADDR TOKEN PID SECONDS HONEST HOSTILE [MODEL] (soak.sh starts the daemon). */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "djinn/client.h"
#include "server/proto_impl.h"

#define MAX_LAT 200000

static const char *addr, *token, *model = "demo";
static volatile int stop;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static double lat[MAX_LAT]; /* honest request latencies of the current interval, seconds */
static size_t n_lat, n_err, n_attacks;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

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
        double t = now_s();
        dj_status st = dj_client_connect(addr, token, &c);
        note(now_s() - t, st);
        for (int round = 0; c && round < 20 && !stop; round++) {
            uint64_t s = 0;
            dj_session_opts o = {model, DJ_QOS_INTERACTIVE, 256};
            t = now_s();
            st = dj_client_session_open(c, &o, &s);
            note(now_s() - t, st);
            if (st != DJ_OK) break;
            int32_t ids[8];
            for (int i = 0; i < 8; i++) ids[i] = 2 + (int32_t)(rand_r(&seed) % 1000);
            dj_generate_params p;
            memset(&p, 0, sizeof p);
            p.ids = ids;
            p.n_ids = 8;
            p.sampling.top_p = 1;
            p.max_tokens = 16;
            t = now_s();
            st = dj_client_generate(c, s, &p, NULL, NULL, NULL);
            note(now_s() - t, st);
            dj_remote_tensor rt;
            t = now_s();
            st = dj_client_step(c, s, ids, 4, false, &rt);
            note(now_s() - t, st);
            t = now_s();
            st = dj_client_session_close(c, s);
            note(now_s() - t, st);
        }
        dj_client_free(c);
    }
    return NULL;
}

/* Hostile connections come from 127.0.0.2 (another loopback address), so
 * the failed-HELLO slowdown of their address does not touch the honest ones. */
static int raw_connect(void) {
    struct sockaddr_storage ss;
    socklen_t len;
    if (dj__addr_parse(addr, &ss, &len) != DJ_OK) return -1;
    int fd = socket(ss.ss_family, SOCK_STREAM, 0);
    if (fd >= 0 && ss.ss_family == AF_INET) {
        struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002)};
        if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0) perror("bench_soak: bind 127.0.0.2");
    }
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (fd < 0 || connect(fd, (struct sockaddr *)&ss, len) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* False once the daemon stops taking bytes (2 s send timeout) or the connection is gone. */
static bool raw_send(int fd, uint16_t type, const void *meta, size_t mlen, uint64_t plen) {
    dj_frame_header h = {.magic = DJ_PROTO_MAGIC, .version = DJ_PROTO_VERSION, .type = type,
                         .meta_len = (uint32_t)mlen, .request_id = 1, .payload_len = plen};
    uint8_t b[DJ_FRAME_HEADER_BYTES];
    dj_frame_header_encode(&h, b);
    return send(fd, b, sizeof b, MSG_NOSIGNAL) == (ssize_t)sizeof b &&
           (!mlen || send(fd, meta, mlen, MSG_NOSIGNAL) == (ssize_t)mlen);
}

static void raw_hello(int fd, const char *tok) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "version", 1);
    if (tok) dj__mw_str(&w, "token", tok);
    dj__mw_finish(&w);
    raw_send(fd, DJ_MSG_HELLO, w.sb.data, w.sb.size, 0);
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
            sleep_ms(50);
            continue;
        }
        switch (kind++ % 6) {
        case 0: /* HEARTBEATs, never read, for 2 s */
            raw_hello(fd, token);
            for (double t = now_s(); now_s() - t < 2 && !stop;)
                if (!raw_send(fd, DJ_MSG_HEARTBEAT, NULL, 0, 0)) break;
            break;
        case 1: /* idle without HELLO */
            sleep_ms(1500);
            break;
        case 2: /* guessed tokens */
            raw_hello(fd, "guess");
            break;
        case 3: { /* a STEP claiming 1 GiB */
            raw_hello(fd, token);
            raw_send(fd, DJ_MSG_STEP, "\x81\xa7session\x01", 10, (uint64_t)1 << 30);
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
                if (!raw_send(fd, DJ_MSG_STATS, NULL, 0, 0)) break;
            sleep_ms(500);
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

static long rss_kb(const char *pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%s/status", pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) kb = strtol(line + 6, NULL, 10);
    if (f) fclose(f);
    return kb;
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
        const long rss = rss_kb(argv[3]);
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
