/* bench_remote.c: what going through djinnd costs - per-token time embedded
 * vs over loopback, empty round trips (HEARTBEAT), and FETCH throughput of a
 * logits handle. Starts its own daemon in-process; prints a table.
 * usage: bench_remote [STORE] [MODEL] [TOKENS] [ROUNDTRIPS] [VMU_GB] [DEVICE] [LARGE]
 * LARGE > 0 also times FETCH of a [LARGE, vocab] f32 handle (every position's
 * logits of a LARGE-token prefill) against memcpy of as many bytes. */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "djinn/client.h"
#include "djinn/engine.h"
#include "djinn/sampler.h"
#include "support/bench_daemon.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the loopback's own rate: one TCP stream, 4 MiB writes, no protocol ---- */
typedef struct blast {
    int fd;
    size_t bytes;
} blast;

static void *blast_send(void *p) {
    blast *b = p;
    static char chunk[4 << 20];
    for (size_t sent = 0; sent < b->bytes;) {
        size_t n = b->bytes - sent < sizeof chunk ? b->bytes - sent : sizeof chunk;
        ssize_t w = write(b->fd, chunk, n);
        if (w <= 0) break;
        sent += (size_t)w;
    }
    return NULL;
}

/* Bytes per second of a TCP loopback stream carrying `bytes` into dst. */
static double loopback_rate(uint8_t *dst, size_t bytes) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &al))
        return 0;
    int cs = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(cs, (struct sockaddr *)&a, sizeof a)) return 0;
    int rs = accept(ls, NULL, NULL);
    blast b = {cs, bytes};
    pthread_t th;
    const double t0 = now_s();
    pthread_create(&th, NULL, blast_send, &b);
    size_t got = 0;
    while (got < bytes) {
        ssize_t r = read(rs, dst + got, bytes - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    const double dt = now_s() - t0;
    pthread_join(th, NULL);
    close(cs);
    close(rs);
    close(ls);
    return got / dt;
}

typedef struct embedded_args {
    int n_tok;
    const int32_t *prompt; /* [4] */
} embedded_args;

/* Greedy decode of n_tok tokens after a 4-token prompt, embedded: seconds
 * per token into out[0], the vocabulary size into out[1]. */
static int embedded_run(dj_engine_t *e, dj_model_t *m, void *arg, double *out) {
    const embedded_args *a = arg;
    const int n_tok = a->n_tok;
    dj_session_t *s = NULL;
    if (dj_session_new(e, m, (uint32_t)n_tok + 8, 0, &s)) {
        fprintf(stderr, "bench_remote: embedded: %s\n", dj_last_error());
        return 1;
    }
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    float *lg = malloc((size_t)V * sizeof *lg);
    dj_session_step(e, s, a->prompt, 4, lg);
    int32_t next = dj_argmax(lg, V);
    double t0 = now_s();
    for (int i = 1; i < n_tok; i++) {
        dj_session_step(e, s, &next, 1, lg);
        next = dj_argmax(lg, V);
    }
    out[0] = (now_s() - t0) / (n_tok - 1);
    out[1] = (double)V;
    return 0;
}

int main(int argc, char **argv) {
    const char *store = argc > 1 ? argv[1] : "tests/fixtures/models";
    const char *name = argc > 2 ? argv[2] : "llama2";
    const int n_tok = argc > 3 ? atoi(argv[3]) : 128;
    const int n_rt = argc > 4 ? atoi(argv[4]) : 20000;
    char *vmu_gb = argc > 5 ? argv[5] : "1"; /* budget, both sides */
    char *device = argc > 6 ? argv[6] : "cpu";
    const int n_large = argc > 7 ? atoi(argv[7]) : 0; /* positions of the all-logits handle, 0 = skip */
    size_t vmu_bytes = 0;
    if (dj_vmu_parse_size(vmu_gb, &vmu_bytes) != DJ_OK) {
        fprintf(stderr, "bench_remote: VMU size: %s\n", dj_last_error());
        return 2;
    }
    if (n_tok < 2 || n_rt < 1) {
        fprintf(stderr, "usage: bench_remote [STORE] [MODEL] [TOKENS>=2] [ROUNDTRIPS]\n");
        return 2;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", store, name);
    const int32_t prompt[4] = {1, 2, 3, 4};

    /* ---- embedded, in a child process (see bench_daemon.h) ---- */
    const int threads = dj_bench_threads();
    embedded_args ea = {n_tok, prompt};
    double emb[2] = {0, 0}; /* seconds per token, vocabulary */
    if (dj_bench_embedded("bench_remote", dir, device, vmu_bytes, threads, embedded_run, &ea, emb, 2) != 0) return 1;
    const double emb_tok = emb[0];
    const uint32_t vocab = (uint32_t)emb[1];
    float *logits = malloc((size_t)vocab * sizeof *logits);
    double t0;

    /* ---- daemon in this process ---- */
    if (!logits) return 1;
    char threads_s[16];
    snprintf(threads_s, sizeof threads_s, "%d", threads);
    const char *args[] = {"--models", store, "--vmu-gb", vmu_gb, "--device", device, "--threads", threads_s, NULL};
    dj_bench_daemon d;
    const bool up = dj_bench_daemon_start(&d, args, 5000) == 0;
    const char *addr = d.addr;
    dj_client_t *c = NULL;
    uint64_t sess = 0;
    dj_session_opts so = {name, DJ_QOS_INTERACTIVE, (uint32_t)n_tok + 8};
    if (!up || dj_client_connect(addr, NULL, &c) || dj_client_session_open(c, &so, &sess)) {
        fprintf(stderr, "bench_remote: daemon: %s\n", dj_last_error());
        return 1;
    }
    dj_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.ids = prompt;
    gp.n_ids = 4;
    gp.max_tokens = (uint32_t)n_tok;
    gp.sampling.top_p = 1;
    dj_generate_result res;
    t0 = now_s();
    dj_status st = dj_client_generate(c, sess, &gp, NULL, NULL, &res);
    const double wall = now_s() - t0;
    const double rem_tok = res.decode_ms / 1e3 / (res.n_generated > 1 ? res.n_generated - 1 : 1);
    const double rem_wall_tok = (wall - res.prefill_ms / 1e3) / (res.n_generated ? res.n_generated : 1);
    dj_client_session_close(c, sess);

    /* empty round trips */
    t0 = now_s();
    for (int i = 0; i < n_rt && st == DJ_OK; i++) st = dj_client_heartbeat(c);
    const double rt = (now_s() - t0) / n_rt;

    /* fetch rate of the logits handle */
    dj_client_session_open(c, &so, &sess);
    dj_remote_tensor t;
    if (st == DJ_OK) st = dj_client_step(c, sess, prompt, 4, true, &t);
    const int n_fetch = 2000;
    size_t got = 0, total = 0;
    t0 = now_s();
    for (int i = 0; i < n_fetch && st == DJ_OK; i++) {
        st = dj_client_fetch(c, t.handle, 0, UINT64_MAX, logits, (size_t)vocab * 4, &got);
        total += got;
    }
    const double ft = now_s() - t0;
    if (st != DJ_OK) fprintf(stderr, "bench_remote: %s\n", dj_last_error());
    dj_client_session_close(c, sess);

    /* a large handle: every position's logits of a long prefill */
    double big_rate = 0, copy_rate = 0, loop_rate = 0;
    uint64_t big_bytes = 0;
    if (st == DJ_OK && n_large > 0) {
        dj_session_opts lo = {name, DJ_QOS_INTERACTIVE, (uint32_t)n_large + 8};
        int32_t *ids = malloc((size_t)n_large * sizeof *ids);
        for (int i = 0; i < n_large; i++) ids[i] = 1 + (int32_t)(((uint64_t)i * 7919u) % (vocab - 1));
        dj_remote_tensor tb;
        st = dj_client_session_open(c, &lo, &sess);
        if (st == DJ_OK) st = dj_client_step_ex(c, sess, ids, (size_t)n_large, DJ_LOGITS_ALL, &tb);
        if (st == DJ_OK) {
            big_bytes = tb.nbytes;
            uint8_t *dst = malloc(big_bytes), *dst2 = malloc(big_bytes);
            memset(dst, 1, big_bytes); /* touch every page before timing */
            memset(dst2, 2, big_bytes);
            for (int r = 0; r < 3 && st == DJ_OK; r++) {
                t0 = now_s();
                st = dj_client_fetch(c, tb.handle, 0, UINT64_MAX, dst, big_bytes, &got);
                const double rate = got / (now_s() - t0);
                big_rate = rate > big_rate ? rate : big_rate;
            }
            for (int r = 0; r < 3; r++) {
                t0 = now_s();
                memcpy(dst2, dst, big_bytes);
                const double rate = big_bytes / (now_s() - t0);
                copy_rate = rate > copy_rate ? rate : copy_rate;
                const double lr = loopback_rate(dst2, big_bytes);
                loop_rate = lr > loop_rate ? lr : loop_rate;
            }
            free(dst);
            free(dst2);
        }
        if (st != DJ_OK) fprintf(stderr, "bench_remote: large handle: %s\n", dj_last_error());
        dj_client_session_close(c, sess);
        free(ids);
    }
    dj_client_free(c);
    dj_bench_daemon_stop(&d);
    free(logits);

    printf("model %s (vocab %u), %d tokens, loopback TCP\n", name, vocab, n_tok);
    printf("| measure | value |\n| --- | --- |\n");
    printf("| decode per token, embedded | %.1f us |\n", emb_tok * 1e6);
    printf("| decode per token, in djinnd (server-side) | %.1f us |\n", rem_tok * 1e6);
    printf("| decode per token, client wall clock | %.1f us |\n", rem_wall_tok * 1e6);
    printf("| per-token overhead of the daemon | %.1f us |\n", (rem_wall_tok - emb_tok) * 1e6);
    printf("| empty round trip (HEARTBEAT), mean of %d | %.1f us |\n", n_rt, rt * 1e6);
    printf("| FETCH of a %u-byte handle | %.1f us each, %.1f MB/s |\n", vocab * 4, ft / n_fetch * 1e6,
           total / ft / 1e6);
    if (big_bytes)
        printf("| FETCH of a %llu-byte [%d, %u] handle, best of 3 | %.2f GB/s (one raw TCP loopback stream: %.2f GB/s; "
               "memcpy: %.2f GB/s) |\n",
               (unsigned long long)big_bytes, n_large, vocab, big_rate / 1e9, loop_rate / 1e9, copy_rate / 1e9);
    return st == DJ_OK ? 0 : 1;
}
