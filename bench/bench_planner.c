/* bench_planner.c: BENCHMARKS.md item 7 - a cold plan of a real 32-layer
 * graph (the Llama-3-8B shape's prefill step, built by the model builder) and
 * a plan-cache hit, each timed over many repetitions.
 * usage: bench_planner [TOKENS (512)] [REPS (200)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/engine.h"
#include "djinn/graph.h"
#include "model/model_graph.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const uint32_t tokens = argc > 1 ? (uint32_t)atoi(argv[1]) : 512;
    const int reps = argc > 2 ? atoi(argv[2]) : 200;
    if (tokens == 0 || reps <= 0) {
        fprintf(stderr, "usage: bench_planner [TOKENS] [REPS]\n");
        return 2;
    }
    /* Llama-3-8B: the shape the GPU benchmarks use */
    dj_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DJ_ARCH_LLAMA;
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.n_layers = 32;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 8192;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 500000.0f;
    double build_best = 1e9, plan_best = 1e9, build_sum = 0, plan_sum = 0;
    size_t peak = 0, nodes = 0;
    dj_plan_cache_t *pc = NULL;
    if (dj_plan_cache_new(64, &pc) != DJ_OK) return 1;
    for (int r = 0; r < reps; r++) {
        dj_graph_t *g = NULL;
        double t0 = now_s();
        if (dj_model_build_graph(&c, NULL, DJ_PHASE_PREFILL, tokens, &g) != DJ_OK) {
            fprintf(stderr, "bench_planner: %s\n", dj_last_error());
            return 1;
        }
        double t1 = now_s();
        if (dj_graph_plan(g, &peak) != DJ_OK) return 1;
        double t2 = now_s();
        build_best = t1 - t0 < build_best ? t1 - t0 : build_best;
        plan_best = t2 - t1 < plan_best ? t2 - t1 : plan_best;
        build_sum += t1 - t0;
        plan_sum += t2 - t1;
        nodes = (size_t)dj_graph_count(g);
        if (dj_plan_cache_put(pc, 0x1234u + (uint64_t)r % 32, tokens, g) != DJ_OK) return 1;
    }
    /* hits: 32 keys present, looked up round robin */
    const int hits = 1000000;
    size_t found = 0;
    double t0 = now_s();
    for (int i = 0; i < hits; i++) found += dj_plan_cache_get(pc, 0x1234u + (uint64_t)i % 32, tokens) != NULL;
    const double hit = (now_s() - t0) / hits;
    dj_plan_cache_free(pc);
    printf("graph: Llama-3-8B shape, prefill bucket %u, %zu nodes, stack peak %.1f MiB\n", tokens, nodes,
           peak / 1048576.0);
    printf("| measure | best | mean | bar |\n| --- | --- | --- | --- |\n");
    printf("| build the SRG | %.1f us | %.1f us | |\n", build_best * 1e6, build_sum / reps * 1e6);
    printf("| plan it (liveness + offsets) | %.1f us | %.1f us | |\n", plan_best * 1e6, plan_sum / reps * 1e6);
    printf("| cold plan = build + plan | %.1f us | %.1f us | 2 ms |\n", (build_best + plan_best) * 1e6,
           (build_sum + plan_sum) / reps * 1e6);
    printf("| plan-cache hit (%d lookups, %zu found) | | %.3f us | 5 us |\n", hits, found, hit * 1e6);
    return found == (size_t)hits ? 0 : 1;
}
