/* bench_fairness.c: what a long prompt does to a running generation in
 * djinnd. Client A generates 300 tokens (greedy); once it has 5, client B
 * sends a PROMPT-token prompt for one token. Prints B's time to first token
 * and A's inter-token gaps while B's prompt goes in (the daemon's
 * --prefill-chunk decides how long A waits at a time).
 * usage: bench_fairness ADDR MODEL PROMPT_TOKENS */
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

typedef struct stamps {
    double t[512];
    int n;
    pthread_mutex_t mu;
} stamps;

static void on_token(int32_t id, const char *text, size_t len, void *user) {
    (void)text;
    (void)len;
    stamps *s = user;
    if (id < 0)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->n < 512)
        s->t[s->n++] = now_s();
    pthread_mutex_unlock(&s->mu);
}

static const char *g_addr, *g_model;

static dj_status generate(const int32_t *ids, size_t n, uint32_t max_tokens, stamps *st) {
    dj_client_t *c = NULL;
    uint64_t sess = 0;
    dj_session_opts o = {g_model, DJ_QOS_INTERACTIVE, (uint32_t)(n + max_tokens + 8)};
    dj_status rc = dj_client_connect(g_addr, NULL, &c);
    if (rc == DJ_OK)
        rc = dj_client_session_open(c, &o, &sess);
    dj_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.ids = ids;
    gp.n_ids = n;
    gp.max_tokens = max_tokens;
    gp.sampling.top_p = 1;
    if (rc == DJ_OK)
        rc = dj_client_generate(c, sess, &gp, on_token, st, NULL);
    if (rc != DJ_OK)
        fprintf(stderr, "bench_fairness: %s\n", dj_last_error());
    dj_client_free(c);
    return rc;
}

static stamps a;
static void *gen_a(void *p) {
    (void)p;
    static const int32_t prompt[4] = {1, 2, 3, 4};
    return (void *)(intptr_t)generate(prompt, 4, 300, &a);
}

static int cmp_double(const void *x, const void *y) {
    const double u = *(const double *)x, v = *(const double *)y;
    return u < v ? -1 : u > v;
}

int main(int argc, char **argv) {
    if (argc != 4 || atoi(argv[3]) <= 0 || atoi(argv[3]) > 100000) {
        fprintf(stderr, "usage: bench_fairness ADDR MODEL PROMPT_TOKENS\n");
        return 2;
    }
    g_addr = argv[1];
    g_model = argv[2];
    const int P = atoi(argv[3]);
    pthread_mutex_init(&a.mu, NULL);
    pthread_t th;
    pthread_create(&th, NULL, gen_a, NULL);
    for (int i = 0; i < 10000; i++) {
        pthread_mutex_lock(&a.mu);
        const int n = a.n;
        pthread_mutex_unlock(&a.mu);
        if (n >= 5)
            break;
        usleep(500);
    }
    int32_t *prompt = malloc((size_t)P * sizeof *prompt);
    for (int i = 0; i < P; i++)
        prompt[i] = 1 + (i * 37) % 1000;
    stamps b;
    memset(&b, 0, sizeof b);
    pthread_mutex_init(&b.mu, NULL);
    const double t_send = now_s();
    const dj_status rb = generate(prompt, (size_t)P, 1, &b);
    void *ra = NULL;
    pthread_join(th, &ra);
    if (rb != DJ_OK || ra || b.n < 1)
        return 1;
    double gaps[512] = {0};
    int ng = 0, during = 0;
    for (int i = 1; i < a.n; i++)
        if (a.t[i] > t_send && a.t[i - 1] < b.t[0])
            gaps[ng++] = a.t[i] - a.t[i - 1];
    for (int i = 0; i < a.n; i++)
        during += a.t[i] > t_send && a.t[i] < b.t[0];
    qsort(gaps, (size_t)ng, sizeof *gaps, cmp_double);
    printf(
        "B: %d-token prompt, first token after %.1f ms; A: %d tokens meanwhile, longest gap %.2f ms, median %.2f ms\n",
        P, (b.t[0] - t_send) * 1e3, during, ng ? gaps[ng - 1] * 1e3 : 0.0, ng ? gaps[ng / 2] * 1e3 : 0.0);
    free(prompt);
    return 0;
}
