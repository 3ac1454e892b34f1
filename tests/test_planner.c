/* test_planner.c: the stack planner - properties on random DAGs (no two live
 * buffers share bytes, alignment, lower and upper bounds), reuse on a chain,
 * and the time to plan a 32-layer Llama-shaped graph. */
#include <string.h>
#include <time.h>

#include "djinn/graph.h"
#include "djinn/vmu.h"
#include "testutil.h"

static dj_node node_of(dj_op op, dj_residency res, int64_t rows, int64_t cols, int s0, int s1, int s2) {
    dj_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.dtype = DJ_DTYPE_F32;
    n.ndim = 2;
    n.shape[0] = rows;
    n.shape[1] = cols;
    n.src[0] = s0;
    n.src[1] = s1;
    n.src[2] = s2;
    n.src[3] = -1;
    n.res = res;
    n.layer = -1;
    return n;
}

static bool buffered(const dj_node *n) {
    return (n->res == DJ_RES_ACTIVATION || n->res == DJ_RES_OUTPUT) && n->size > 0;
}

/* Checks a planned graph against liveness recomputed here. Returns failures. */
static int verify_plan(const dj_graph_t *g, size_t peak, size_t *lower_out) {
    int n = dj_graph_count(g), bad = 0;
    int last[2048];
    if (n > 2048) return 1;
    for (int i = 0; i < n; i++) last[i] = i;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < DJ_GRAPH_MAX_SRC; k++) {
            int s = dj_graph_node_c(g, i)->src[k];
            if (s >= 0 && last[s] < i) last[s] = i;
        }
    /* a read buffer lives on to the slack-th compute node after its last
     * reader (fused kernels: planner.c), counted forward here */
    const int slack = dj_graph_phase(g) == DJ_PHASE_DECODE ? 4 : 1;
    for (int i = 0; i < n; i++) {
        if (last[i] == i) continue;
        int t = last[i], k = 0;
        while (k < slack && t < n - 1) k += dj_graph_node_c(g, ++t)->op < DJ_OP_COUNT;
        last[i] = k == slack ? t : n - 1;
    }
    for (int i = 0; i < n; i++)
        if (dj_graph_node_c(g, i)->res == DJ_RES_OUTPUT) last[i] = n - 1;
    size_t top = 0;
    for (int i = 0; i < n; i++) {
        const dj_node *a = dj_graph_node_c(g, i);
        bad += a->last_use != last[i];
        if (!buffered(a)) continue;
        size_t sa = dj_vmu_aligned(a->size);
        bad += a->offset % DJ_VMU_ALIGN != 0;
        if (a->offset + sa > top) top = a->offset + sa;
        for (int j = 0; j < i; j++) {
            const dj_node *b = dj_graph_node_c(g, j);
            if (!buffered(b) || last[j] < i) continue; /* b dead before a is written */
            size_t sb = dj_vmu_aligned(b->size);
            if (a->offset < b->offset + sb && b->offset < a->offset + sa) {
                if (bad < 5)
                    fprintf(stderr, "overlap: node %d [%zu,+%zu) life [%d,%d] and node %d [%zu,+%zu) life [%d,%d]\n",
                            i, a->offset, sa, i, last[i], j, b->offset, sb, j, last[j]);
                bad++;
            }
        }
    }
    bad += top != peak || peak != dj_graph_peak(g);
    bad += peak > dj_graph_naive_bytes(g);
    size_t lower = 0; /* bytes live at the busiest step: no plan does better */
    for (int t = 0; t < n; t++) {
        size_t live = 0;
        for (int i = 0; i <= t; i++)
            if (buffered(dj_graph_node_c(g, i)) && last[i] >= t) live += dj_vmu_aligned(dj_graph_node_c(g, i)->size);
        if (live > lower) lower = live;
    }
    bad += peak < lower;
    *lower_out = lower;
    return bad;
}

static void test_random_dags(void) {
    int graphs = 400, bad = 0, reused = 0, with_buffers = 0;
    double ratio_sum = 0.0, ratio_max = 1.0;
    for (int gi = 0; gi < graphs; gi++) {
        dj_graph_t *g = NULL;
        CHECK_OK(dj_graph_new(DJ_PHASE_PREFILL, 16, &g));
        if (!g) return;
        int n = 1 + (int)(dj_test_rand() % 300);
        int locality = 1 + (int)(dj_test_rand() % 40); /* sources mostly among the last few nodes */
        for (int i = 0; i < n; i++) {
            dj_node nd = node_of(DJ_OP_ADD, DJ_RES_ACTIVATION, 0, 0, -1, -1, -1);
            uint64_t r = dj_test_rand() % 100;
            nd.res = r < 10 ? DJ_RES_WEIGHT : r < 13 ? DJ_RES_INPUT : r < 16 ? DJ_RES_KV
                   : r < 22 ? DJ_RES_OUTPUT : DJ_RES_ACTIVATION;
            do /* element types only (DJ_DTYPE_Q4's rows are not whole elements) */
                nd.dtype = (dj_dtype)(dj_test_rand() % DJ_DTYPE_COUNT);
            while (dj_dtype_size(nd.dtype) == 0);
            nd.ndim = (int)(dj_test_rand() % 4) + 1;
            for (int d = 0; d < nd.ndim; d++)
                nd.shape[d] = dj_test_rand() % 8 == 0 ? 1 + (int64_t)(dj_test_rand() % 300)
                                                      : 1 + (int64_t)(dj_test_rand() % 12);
            int fan = i == 0 ? 0 : (int)(dj_test_rand() % (DJ_GRAPH_MAX_SRC + 1));
            for (int k = 0; k < fan; k++) {
                int back = dj_test_rand() % 5 == 0 ? (int)(dj_test_rand() % (uint64_t)i)
                                                   : (int)(dj_test_rand() % (uint64_t)(locality < i ? locality : i));
                nd.src[k] = i - 1 - back;
            }
            int idx;
            CHECK_OK(dj_graph_add(g, &nd, &idx));
        }
        size_t peak = 0, lower = 0;
        CHECK_OK(dj_graph_plan(g, &peak));
        int b = verify_plan(g, peak, &lower);
        bad += b;
        if (lower > 0) {
            double ratio = (double)peak / (double)lower;
            ratio_sum += ratio;
            with_buffers++;
            if (ratio > ratio_max) ratio_max = ratio;
        }
        reused += peak < dj_graph_naive_bytes(g);
        /* planning again gives the same plan */
        size_t peak2 = 0;
        CHECK_OK(dj_graph_plan(g, &peak2));
        CHECK(peak2 == peak);
        dj_graph_free(g);
    }
    CHECK_MSG(bad == 0, "%d planner property violations", bad);
    CHECK(reused > graphs / 2);
    printf("random DAGs: %d graphs, peak/lower-bound mean %.3f, max %.3f; %d reuse memory\n", graphs,
           with_buffers ? ratio_sum / with_buffers : 0.0, ratio_max, reused);
}

static void test_chain(void) {
    /* x0 -> x1 -> ... -> x9, each read only by the next and kept one node
     * longer (a prefill graph's slack: planner.c): three buffers suffice */
    dj_graph_t *g = NULL;
    CHECK_OK(dj_graph_new(DJ_PHASE_PREFILL, 1, &g));
    if (!g) return;
    int64_t cols = 1 + (int64_t)(dj_test_rand() % 5000);
    int idx = -1;
    for (int i = 0; i < 10; i++) {
        dj_node nd = node_of(DJ_OP_ADD, DJ_RES_ACTIVATION, 3, cols, i - 1, -1, -1);
        CHECK_OK(dj_graph_add(g, &nd, &idx));
    }
    size_t peak = 0, lower = 0, s = dj_vmu_aligned((size_t)(3 * cols * 4));
    CHECK_OK(dj_graph_plan(g, &peak));
    CHECK(verify_plan(g, peak, &lower) == 0);
    CHECK(dj_graph_naive_bytes(g) == 10 * s);
    CHECK_MSG(peak == 3 * s && peak < dj_graph_naive_bytes(g), "peak %zu, buffer %zu", peak, s);
    CHECK(dj_graph_node(g, 9)->last_use == 9 && dj_graph_node(g, 3)->last_use == 5);
    /* an OUTPUT x10 tapped from x4 stays live to the end, and x11 -> x12 ->
     * x13 follow it: at x13, x10, x11 (read by x12, kept to x13), x12 and
     * x13 are live - a fourth buffer */
    dj_node out = node_of(DJ_OP_ADD, DJ_RES_OUTPUT, 3, cols, 4, -1, -1);
    CHECK_OK(dj_graph_add(g, &out, &idx));
    CHECK(!dj_graph_planned(g));
    for (int i = 0; i < 3; i++) {
        dj_node nd = node_of(DJ_OP_ADD, DJ_RES_ACTIVATION, 3, cols, idx + i, -1, -1);
        CHECK_OK(dj_graph_add(g, &nd, NULL));
    }
    CHECK_OK(dj_graph_plan(g, &peak));
    CHECK(verify_plan(g, peak, &lower) == 0);
    CHECK(peak == 4 * s && dj_graph_node(g, idx)->last_use == dj_graph_count(g) - 1);
    dj_graph_free(g);

    /* empty graph and a graph without activations plan to 0 bytes */
    CHECK_OK(dj_graph_new(DJ_PHASE_DECODE, 1, &g));
    if (!g) return;
    peak = 1;
    CHECK_OK(dj_graph_plan(g, &peak));
    CHECK(peak == 0);
    dj_node w = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, 100, 100, -1, -1, -1);
    CHECK_OK(dj_graph_add(g, &w, NULL));
    CHECK_OK(dj_graph_plan(g, &peak));
    CHECK(peak == 0 && dj_graph_naive_bytes(g) == 0);
    dj_graph_free(g);
}

/* A Llama-shaped prefill graph: per layer norm, q/k/v, rope, kv write,
 * attention, o-proj, residual, norm, gate/up, silu*up, down, residual. */
static dj_graph_t *llama_graph(int layers, uint32_t tokens, int64_t dim, int64_t kv_dim, int64_t ffn, int64_t vocab) {
    dj_graph_t *g = NULL;
    if (dj_graph_new(DJ_PHASE_PREFILL, tokens, &g) != DJ_OK) return NULL;
    int64_t t = tokens;
    int ids, table, x, i;
#define ADD(nd, out) \
    if (dj_graph_add(g, &(nd), &(out)) != DJ_OK) goto fail
    dj_node nd = node_of(DJ_OP_COUNT, DJ_RES_INPUT, t, 1, -1, -1, -1);
    nd.dtype = DJ_DTYPE_I32;
    ADD(nd, ids);
    nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, vocab, dim, -1, -1, -1);
    ADD(nd, table);
    nd = node_of(DJ_OP_EMBED, DJ_RES_ACTIVATION, t, dim, ids, table, -1);
    ADD(nd, x);
    for (int l = 0; l < layers; l++) {
        int wn, h, wq, wk, wv, q, k, v, qr, kr, kvw, att, wo, o, x2, wn2, h2, wg, wu, gt, up, sm, wd, dn;
        nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, dim, 1, -1, -1, -1); ADD(nd, wn);
        nd = node_of(DJ_OP_RMSNORM, DJ_RES_ACTIVATION, t, dim, x, wn, -1); ADD(nd, h);
        nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, dim, dim, -1, -1, -1); ADD(nd, wq);
        nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, kv_dim, dim, -1, -1, -1); ADD(nd, wk);
        nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, kv_dim, dim, -1, -1, -1); ADD(nd, wv);
        nd = node_of(DJ_OP_MATMUL, DJ_RES_ACTIVATION, t, dim, h, wq, -1); ADD(nd, q);
        nd = node_of(DJ_OP_MATMUL, DJ_RES_ACTIVATION, t, kv_dim, h, wk, -1); ADD(nd, k);
        nd = node_of(DJ_OP_MATMUL, DJ_RES_ACTIVATION, t, kv_dim, h, wv, -1); ADD(nd, v);
        nd = node_of(DJ_OP_ROPE, DJ_RES_ACTIVATION, t, dim, q, -1, -1); ADD(nd, qr);
        nd = node_of(DJ_OP_ROPE, DJ_RES_ACTIVATION, t, kv_dim, k, -1, -1); ADD(nd, kr);
        nd = node_of(DJ_OP_KV_WRITE, DJ_RES_KV, t, kv_dim, kr, v, -1); ADD(nd, kvw);
        nd = node_of(DJ_OP_ATTENTION, DJ_RES_ACTIVATION, t, dim, qr, kvw, -1); ADD(nd, att);
        nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, dim, dim, -1, -1, -1); ADD(nd, wo);
        nd = node_of(DJ_OP_MATMUL, DJ_RES_ACTIVATION, t, dim, att, wo, -1); ADD(nd, o);
        nd = node_of(DJ_OP_ADD, DJ_RES_ACTIVATION, t, dim, x, o, -1); ADD(nd, x2);
        nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, dim, 1, -1, -1, -1); ADD(nd, wn2);
        nd = node_of(DJ_OP_RMSNORM, DJ_RES_ACTIVATION, t, dim, x2, wn2, -1); ADD(nd, h2);
        nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, ffn, dim, -1, -1, -1); ADD(nd, wg);
        nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, ffn, dim, -1, -1, -1); ADD(nd, wu);
        nd = node_of(DJ_OP_MATMUL, DJ_RES_ACTIVATION, t, ffn, h2, wg, -1); ADD(nd, gt);
        nd = node_of(DJ_OP_MATMUL, DJ_RES_ACTIVATION, t, ffn, h2, wu, -1); ADD(nd, up);
        nd = node_of(DJ_OP_SILU_MUL, DJ_RES_ACTIVATION, t, ffn, gt, up, -1); ADD(nd, sm);
        nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, dim, ffn, -1, -1, -1); ADD(nd, wd);
        nd = node_of(DJ_OP_MATMUL, DJ_RES_ACTIVATION, t, dim, sm, wd, -1); ADD(nd, dn);
        nd = node_of(DJ_OP_ADD, DJ_RES_ACTIVATION, t, dim, x2, dn, -1); ADD(nd, x);
    }
    int wn, h, head;
    nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, dim, 1, -1, -1, -1); ADD(nd, wn);
    nd = node_of(DJ_OP_RMSNORM, DJ_RES_ACTIVATION, t, dim, x, wn, -1); ADD(nd, h);
    nd = node_of(DJ_OP_COUNT, DJ_RES_WEIGHT, vocab, dim, -1, -1, -1); ADD(nd, head);
    nd = node_of(DJ_OP_MATMUL, DJ_RES_OUTPUT, t, vocab, h, head, -1); ADD(nd, i);
#undef ADD
    return g;
fail:
    dj_graph_free(g);
    return NULL;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_llama_timing(void) {
    dj_graph_t *g = llama_graph(32, 512, 4096, 1024, 14336, 128256);
    CHECK(g != NULL);
    if (!g) return;
    size_t peak = 0, lower = 0;
    double best = 1e9, sum = 0;
    int reps = 50;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        dj_status st = dj_graph_plan(g, &peak);
        double dt = now_s() - t0;
        CHECK_OK(st);
        sum += dt;
        if (dt < best) best = dt;
    }
    CHECK(verify_plan(g, peak, &lower) == 0);
    /* the busiest step here is the FFN: gate + up + residual, or silu + up + residual, ... */
    CHECK(peak < dj_graph_naive_bytes(g) / 20);
    printf("llama-like 32 layers, %d nodes, 512 tokens: plan %.1f us best, %.1f us mean; peak %.1f MiB "
           "(lower bound %.1f MiB), naive %.1f MiB\n",
           dj_graph_count(g), best * 1e6, sum / reps * 1e6, (double)peak / 1048576.0, (double)lower / 1048576.0,
           (double)dj_graph_naive_bytes(g) / 1048576.0);
    dj_graph_free(g);
}

int main(void) {
    dj_test_seeds();
    test_random_dags();
    test_chain();
    test_llama_timing();
    return dj_test_finish("test_planner");
}
