/* bench_serve.c: continuous batching through djinnd against the engine's own
 * batched step - N concurrent greedy generations over loopback, per N.
 * usage: bench_serve STORE MODEL [DEVICE] [VMU_GB] [TOKENS] [N,N,...] [MIXED]
 * For each N: the engine's decode step of N sessions (embedded, in a child
 * process, through dj_engine_step_batch_samplers with greedy samplers), then
 * a daemon in this process serving N clients that each GENERATE TOKENS
 * tokens at once (MIXED: the daemon's --mixed-steps, default auto). Prints, per N: the engine's step, the daemon's step
 * (server-side decode time per token, median over the clients), the
 * clients' aggregate tok/s and the ratios the bars are stated in. */
#define _GNU_SOURCE
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/client.h"
#include "djinn/engine.h"
#include "djinn/sampler.h"
#include "support/bench_daemon.h"

#define MAX_N 64

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct step_args {
    uint32_t n;
    int steps;
} step_args;

/* The engine's step of n sessions: a 4-token prompt each, then `steps`
 * batched greedy decode steps; seconds per step into out[0] (the first 3
 * steps, where graphs are recorded, are not timed). */
static int engine_step_run(dj_engine_t *e, dj_model_t *m, void *arg, double *out) {
    const step_args *a = arg;
    const uint32_t n = a->n;
    const int steps = a->steps;
    dj_session_t *ss[MAX_N];
    dj_sampler_t *smp[MAX_N];
    int32_t ids[MAX_N], next[MAX_N];
    const dj_sampler_params greedy = {.temperature = 0, .top_p = 1};
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    for (uint32_t i = 0; i < n; i++) {
        const int32_t prompt[4] = {1 + (int32_t)i, 2, 3, 4};
        int32_t first = 0;
        if (dj_session_new(e, m, (uint32_t)steps + 16, 0, &ss[i]) || dj_sampler_new(&greedy, V, &smp[i]) ||
            dj_session_step_sample(e, ss[i], prompt, 4, NULL, &first)) {
            fprintf(stderr, "bench_serve: engine session: %s\n", dj_last_error());
            return 1;
        }
        ids[i] = first;
    }
    double t0 = 0;
    for (int k = 0; k < steps + 3; k++) {
        if (k == 3) t0 = now_s();
        if (dj_engine_step_batch_samplers(e, ss, NULL, ids, n, smp, next)) {
            fprintf(stderr, "bench_serve: engine step: %s\n", dj_last_error());
            return 1;
        }
        memcpy(ids, next, n * sizeof *ids);
    }
    out[0] = (now_s() - t0) / steps;
    return 0;
}

/* Seconds per engine step of n sessions (engine_step_run, in a child), or -1. */
static double engine_step(const char *dir, const char *device, size_t vmu_bytes, int threads, uint32_t n,
                          int steps) {
    step_args a = {n, steps};
    double per = -1;
    if (dj_bench_embedded("bench_serve", dir, device, vmu_bytes, threads, engine_step_run, &a, &per, 1) != 0)
        return -1;
    return per;
}

typedef struct client_run {
    const char *addr, *model;
    uint32_t tokens, index;
    pthread_barrier_t *go;
    dj_status st;
    dj_generate_result res;
    double wall;
} client_run;

static void *client_main(void *p) {
    client_run *r = p;
    dj_client_t *c = NULL;
    uint64_t sess = 0;
    dj_session_opts so = {r->model, DJ_QOS_INTERACTIVE, r->tokens + 16};
    r->st = dj_client_connect(r->addr, NULL, &c);
    if (r->st == DJ_OK) r->st = dj_client_session_open(c, &so, &sess);
    pthread_barrier_wait(r->go);
    if (r->st != DJ_OK) {
        dj_client_free(c);
        return NULL;
    }
    const int32_t prompt[4] = {1 + (int32_t)r->index, 2, 3, 4};
    dj_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.ids = prompt;
    gp.n_ids = 4;
    gp.max_tokens = r->tokens;
    gp.sampling.top_p = 1;
    const double t0 = now_s();
    r->st = dj_client_generate(c, sess, &gp, NULL, NULL, &r->res);
    r->wall = now_s() - t0;
    dj_client_session_close(c, sess);
    dj_client_free(c);
    return NULL;
}

/* The daemon's generation steps so far, their total worker and engine time
 * (STATS: a mean and a count), and its graph counts. */
typedef struct serve_counts {
    double steps, worker_ms, engine_ms, captures, replays;
} serve_counts;

static int serve_stats(const char *addr, serve_counts *out) {
    dj_client_t *c = NULL;
    dj_client_stats st;
    if (dj_client_connect(addr, NULL, &c) != DJ_OK || dj_client_stats_get(c, &st) != DJ_OK) {
        dj_client_free(c);
        return 1;
    }
    *out = (serve_counts){(double)st.gen_steps, st.step_ms * st.gen_steps, st.step_engine_ms * st.gen_steps,
                          (double)st.graph_captures, (double)st.graph_replays};
    dj_client_stats_free(&st);
    dj_client_free(c);
    return 0;
}

/* n clients at once; returns 0 and fills the median server decode s/token and
 * the aggregate tok/s of the generated tokens over the longest client wall. */
static int serve_round(const char *addr, const char *model, uint32_t n, uint32_t tokens, double *step_s,
                       double *tok_s) {
    client_run runs[MAX_N];
    pthread_t th[MAX_N];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, n);
    for (uint32_t i = 0; i < n; i++) {
        runs[i] = (client_run){.addr = addr, .model = model, .tokens = tokens, .index = i, .go = &go};
        pthread_create(&th[i], NULL, client_main, &runs[i]);
    }
    for (uint32_t i = 0; i < n; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&go);
    double per[MAX_N], wall = 0;
    uint64_t generated = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (runs[i].st != DJ_OK) {
            fprintf(stderr, "bench_serve: client %u: %s\n", i, dj_strerror(runs[i].st));
            return 1;
        }
        const uint32_t g = runs[i].res.n_generated;
        per[i] = runs[i].res.decode_ms / 1e3 / (g > 1 ? g - 1 : 1);
        generated += g;
        if (runs[i].wall > wall) wall = runs[i].wall;
    }
    qsort(per, n, sizeof *per, cmp_double);
    *step_s = per[n / 2];
    *tok_s = generated / wall;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_serve STORE MODEL [DEVICE] [VMU_GB] [TOKENS] [N,N,...] [MIXED]\n");
        return 2;
    }
    const char *store = argv[1], *model = argv[2];
    char *device = argc > 3 ? argv[3] : "cpu";
    char *vmu_gb = argc > 4 ? argv[4] : "1";
    const long tokens = argc > 5 ? strtol(argv[5], NULL, 10) : 64;
    const char *list = argc > 6 ? argv[6] : "1,8,32";
    char *mixed = argc > 7 ? argv[7] : "auto";
    uint32_t ns[16];
    size_t n_ns = 0;
    for (const char *p = list; *p && n_ns < 16;) {
        char *end = NULL;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MAX_N) {
            fprintf(stderr, "bench_serve: bad client count list '%s' (1..%d, comma separated)\n", list, MAX_N);
            return 2;
        }
        ns[n_ns++] = (uint32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    size_t vmu_bytes = 0;
    if (tokens < 8 || tokens > 4096 || dj_vmu_parse_size(vmu_gb, &vmu_bytes) != DJ_OK) {
        fprintf(stderr, "bench_serve: TOKENS must be 8..4096 and VMU_GB a size (%s)\n", dj_last_error());
        return 2;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", store, model);
    const int threads = dj_bench_threads();
    double eng[16];
    for (size_t k = 0; k < n_ns; k++) {
        eng[k] = engine_step(dir, device, vmu_bytes, threads, ns[k], (int)tokens);
        if (eng[k] <= 0) return 1;
    }

    char threads_s[16];
    snprintf(threads_s, sizeof threads_s, "%d", threads);
    const char *args[] = {"--models", store, "--vmu-gb", vmu_gb, "--device", device, "--threads", threads_s,
                          "--max-running", "64", "--mixed-steps", mixed, "--local-admin", NULL}; /* STATS */
    dj_bench_daemon d;
    if (dj_bench_daemon_start(&d, args, 30000) != 0) { /* a large model loads first: up to 30 s */
        fprintf(stderr, "bench_serve: the daemon did not start\n");
        return 1;
    }
    const char *addr = d.addr;
    int rc = 0;
    double warm_step, warm_tok;
    rc |= serve_round(addr, model, 1, 16, &warm_step, &warm_tok); /* the model into the text segment */
    printf("model %s on %s, %ld tokens per generation, greedy, loopback TCP, --mixed-steps %s\n", model, device,
           tokens, mixed);
    printf("| clients | engine step | djinnd step (median) | ratio | engine tok/s | djinnd tok/s | share | "
           "daemon steps | worker / engine ms a step | graphs recorded / replayed |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t k = 0; k < n_ns && !rc; k++) {
        double step = 0, tok = 0;
        serve_counts c0, c1;
        rc |= serve_stats(addr, &c0);
        rc |= serve_round(addr, model, ns[k], (uint32_t)tokens, &step, &tok);
        rc |= serve_stats(addr, &c1);
        if (rc) break;
        const double steps = c1.steps - c0.steps;
        printf("| %u | %.3f ms | %.3f ms | %.3fx | %.0f | %.0f | %.1f%% | %.0f | %.3f / %.3f | %.0f / %.0f |\n", ns[k],
               eng[k] * 1e3, step * 1e3, step / eng[k], ns[k] / eng[k], tok, 100.0 * tok / (ns[k] / eng[k]), steps,
               steps > 0 ? (c1.worker_ms - c0.worker_ms) / steps : 0, steps > 0 ? (c1.engine_ms - c0.engine_ms) / steps : 0,
               c1.captures - c0.captures, c1.replays - c0.replays);
    }
    dj_bench_daemon_stop(&d);
    return rc;
}
