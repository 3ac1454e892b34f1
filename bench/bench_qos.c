/* bench_qos.c: how long a realtime request waits behind running batch
 * generations in djinnd. Two batch-class clients generate LONG tokens each;
 * once both stream, a realtime client asks for 8 tokens. Prints the realtime
 * request's queue time and time to first token (the daemon's own DONE
 * figures) and its wall time to first token, REPS times.
 * usage: bench_qos ADDR MODEL [LONG] [REPS]   (start djinnd with --max-running 2
 * to see preemption) */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "djinn/client.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct bg {
    const char *addr, *model;
    int tokens, idx;
    volatile int seen;
    dj_status st;
} bg;

static void on_bg(int32_t id, const char *text, size_t len, void *user) {
    (void)text;
    (void)len;
    if (id >= 0) ((bg *)user)->seen++;
}

static void *bg_main(void *p) {
    bg *b = p;
    dj_client_t *c = NULL;
    uint64_t sid = 0;
    b->st = dj_client_connect(b->addr, NULL, &c);
    const dj_session_opts so = {.model = b->model, .qos = DJ_QOS_BATCH, .expected_tokens = (uint32_t)b->tokens + 64};
    if (b->st == DJ_OK) b->st = dj_client_session_open(c, &so, &sid);
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = 100 + 7 * i + b->idx;
    const dj_generate_params gp = {.ids = ids, .n_ids = 16, .max_tokens = (uint32_t)b->tokens, .ignore_eos = true};
    if (b->st == DJ_OK) b->st = dj_client_generate(c, sid, &gp, on_bg, b, NULL);
    dj_client_free(c);
    return NULL;
}

typedef struct first {
    double t;
} first;

static void on_rt(int32_t id, const char *text, size_t len, void *user) {
    (void)text;
    (void)len;
    first *f = user;
    if (id >= 0 && f->t == 0) f->t = now_s();
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_qos ADDR MODEL [LONG] [REPS]\n");
        return 2;
    }
    const char *addr = argv[1], *model = argv[2];
    const int longn = argc > 3 ? atoi(argv[3]) : 300, reps = argc > 4 ? atoi(argv[4]) : 5;
    for (int r = 0; r < reps; r++) {
        bg b[2] = {{addr, model, longn, 1, 0, DJ_OK}, {addr, model, longn, 2, 0, DJ_OK}};
        pthread_t th[2];
        for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, bg_main, &b[i]);
        while ((b[0].seen < 5 || b[1].seen < 5) && b[0].st == DJ_OK && b[1].st == DJ_OK) usleep(1000);
        dj_client_t *c = NULL;
        uint64_t sid = 0;
        dj_status st = dj_client_connect(addr, NULL, &c);
        const dj_session_opts so = {.model = model, .qos = DJ_QOS_REALTIME, .expected_tokens = 64};
        if (st == DJ_OK) st = dj_client_session_open(c, &so, &sid);
        int32_t ids[4] = {11, 12, 13, 14};
        const dj_generate_params gp = {.ids = ids, .n_ids = 4, .max_tokens = 8, .ignore_eos = true};
        dj_generate_result res;
        first f = {0};
        const double t0 = now_s();
        if (st == DJ_OK) st = dj_client_generate(c, sid, &gp, on_rt, &f, &res);
        if (st == DJ_OK)
            printf("realtime behind 2 batch generations: queue %.2f ms, ttft %.2f ms (server), %.2f ms (client); "
                   "batch clients had %d and %d tokens\n",
                   res.queue_ms, res.ttft_ms, (f.t - t0) * 1e3, b[0].seen, b[1].seen);
        else
            printf("realtime request failed: %s: %s\n", dj_status_name(st), dj_last_error());
        dj_client_free(c);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    }
    return 0;
}
