/* gpu_prefix.c: the prefix cache on the GPU - conversations sharing a system
 * prompt, the later ones mapping its cached KV blocks, against an engine
 * without the cache on the same device: greedy tokens equal, last logits
 * within a small relative error (the shared prefix was computed in another
 * chunking: cuBLAS may round differently; the figure is printed), a session
 * with shared blocks swapped out and back through the async copies, and
 * the cache's invariants. Needs a GPU; run by scripts/gpu_check.sh.
 * usage: gpu_prefix [REPO_ROOT (default .)] */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/dj_cuda.h"
#include "djinn/engine.h"
#include "exec/engine_impl.h"
#include "testutil.h"

#define CTX 256
#define N_CONV 4

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static dj_engine_t *engine(bool cache) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.device = "cuda:0";
    ec.deterministic = true;
    ec.max_step_tokens = 64;
    ec.no_prefix_cache = !cache;
    dj_vmu_config_default(&ec.vmu, (size_t)256 << 20);
    ec.vmu.page_bytes = 4096;
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    return e;
}

static double rel_err(const float *a, const float *b, uint32_t n) {
    double num = 0, den = 0;
    for (uint32_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int32_t argmax(const float *l, uint32_t V) {
    uint32_t k = 0;
    for (uint32_t i = 1; i < V; i++)
        if (l[i] > l[k]) k = i;
    return (int32_t)k;
}

static void conversations(const char *root, const char *name) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", root, name);
    dj_engine_t *ea = engine(true), *eb = engine(false);
    dj_model_t *ma = NULL, *mb = NULL;
    if (ea) CHECK_OK(dj_model_load(ea, dir, &ma));
    if (eb) CHECK_OK(dj_model_load(eb, dir, &mb));
    if (!ma || !mb) goto out;
    CHECK_OK(dj_engine_swap_init(ea, (size_t)32 << 20));
    const uint32_t V = dj_model_get_config(ma)->vocab_size;
    float *la = malloc(V * sizeof(float)), *lb = malloc(V * sizeof(float));
    dj_session_t *a[N_CONV] = {0}, *b[N_CONV] = {0};
    int32_t p[CTX];
    CHECK_OK(dj_session_new(ea, ma, CTX, 0, &a[0]));
    if (!a[0]) goto free_all;
    const uint32_t T = a[0]->tokens_per_page, n_sys = 3 * T + T / 2;
    for (uint32_t i = 0; i < n_sys; i++) p[i] = (int32_t)(dj_test_rand() % V);
    double worst = 0;
    int bitwise = 0, same_tokens = 0, steps = 0;
    for (int k = 0; k < N_CONV; k++) {
        if (!a[k]) CHECK_OK(dj_session_new(ea, ma, CTX, 0, &a[k]));
        CHECK_OK(dj_session_new(eb, mb, CTX, 0, &b[k]));
        if (!a[k] || !b[k]) break;
        const uint32_t n = n_sys + 5 + (uint32_t)k;
        for (uint32_t i = n_sys; i < n; i++) p[i] = (int32_t)(dj_test_rand() % V);
        uint32_t mapped = 0;
        CHECK_OK(dj_session_map_prefix(ea, a[k], p, n, &mapped));
        CHECK_MSG(mapped == (k ? 3 * T : 0), "%s conversation %d: %u ids mapped, want %u", name, k, mapped,
                  k ? 3 * T : 0);
        CHECK_OK(dj_session_step(ea, a[k], p + mapped, n - mapped, la));
        CHECK_OK(dj_session_step(eb, b[k], p, n, lb));
        if (k == 2) { /* its shared blocks go to the host with it and come back private */
            CHECK_OK(dj_session_swap_out(ea, a[k]));
            for (double t0 = now(); dj_session_residency(a[k]) != DJ_KV_SWAPPED && now() - t0 < 10;)
                dj_engine_swap_poll(ea);
            CHECK(dj_session_residency(a[k]) == DJ_KV_SWAPPED && dj__prefix_shared_blocks(a[k]) == 0);
            CHECK_OK(dj_session_swap_in(ea, a[k]));
        }
        for (int t = 0; t < 8; t++) {
            const double err = rel_err(la, lb, V);
            if (err > worst) worst = err;
            bitwise += !memcmp(la, lb, V * sizeof(float));
            const int32_t ia = argmax(la, V), ib = argmax(lb, V);
            same_tokens += ia == ib;
            steps++;
            CHECK_MSG(err <= 2e-2, "%s conversation %d step %d: logits rel err %.3g", name, k, t, err);
            CHECK_OK(dj_session_step(ea, a[k], &ib, 1, la)); /* both follow the reference's token */
            CHECK_OK(dj_session_step(eb, b[k], &ib, 1, lb));
        }
        CHECK_OK(dj__prefix_check(dj__engine_prefix(ea), a, (size_t)k + 1));
    }
    dj_engine_swap_poll(ea);
    printf("%s: %d steps after shared prefixes: %d bit-identical, %d same greedy token, worst rel err %.3g\n", name,
           steps, bitwise, same_tokens, worst);
    CHECK(same_tokens >= steps - 1); /* a near-tie may flip one */
free_all:
    for (int k = 0; k < N_CONV; k++) {
        dj_session_free(ea, a[k]);
        dj_session_free(eb, b[k]);
    }
    free(la);
    free(lb);
out:
    dj_model_release(ea, ma);
    dj_model_release(eb, mb);
    dj_engine_free(ea);
    dj_engine_free(eb);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : ".";
    dj_test_seed();
    if (dj_cuda_device_count() == 0) {
        fprintf(stderr, "gpu_prefix: no CUDA device\n");
        return 2;
    }
    conversations(root, "llama3");
    conversations(root, "qwen2");
    conversations(root, "gemma2");
    return dj_test_finish("gpu_prefix");
}
