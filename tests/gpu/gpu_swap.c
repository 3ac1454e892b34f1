/* gpu_swap.c: KV swap on the GPU - sessions swapped out and restored into
 * other pages (restores stepped before their copies are known done, swap-outs
 * cancelled) give logits bit-identical to an unswapped twin stepped in the
 * same batches, through recorded decode graphs; the VMU sized from the
 * device; and the copy rates: 1 GiB of 64 KiB pages device <-> pinned host in
 * one span and in 16384 scattered spans, and with --model DIR a session of
 * that model's shape with a 2048-token prompt swapped out and back.
 * Needs a GPU; run by scripts/gpu_check.sh.
 * usage: gpu_swap [REPO_ROOT (default .)] [--model DIR] */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/dj_cuda.h"
#include "djinn/engine.h"
#include "testutil.h"

#define GIB ((size_t)1 << 30)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Polls until s leaves `from` (or 10 s pass). */
static void wait_leave(dj_engine_t *e, dj_session_t *s, dj_kv_residency from) {
    const double t0 = now();
    while (dj_session_residency(s) == from && now() - t0 < 10.0) dj_engine_swap_poll(e);
    CHECK_MSG(dj_session_residency(s) != from, "session still %s after 10 s of polling", dj_kv_residency_name(from));
}

/* Decode steps of [x, twin] as one batch: the rows must be the same bits. */
static void step_pair(dj_engine_t *e, dj_session_t *x, dj_session_t *t, uint32_t V, float *lg, const char *when) {
    dj_session_t *b[2] = {x, t};
    int32_t ids[2];
    ids[0] = ids[1] = (int32_t)(dj_test_rand() % V);
    CHECK_OK(dj_engine_step_batch(e, b, ids, 2, lg, NULL, NULL));
    CHECK_MSG(!memcmp(lg, lg + V, V * sizeof *lg), "%s: swapped session's logits differ from its twin's", when);
}

static void exactness(const char *root, const char *name) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", root, name);
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.device = "cuda:0";
    ec.deterministic = true; /* a row's bits independent of the batch */
    dj_vmu_config_default(&ec.vmu, (size_t)256 << 20);
    ec.vmu.page_bytes = 4096; /* many pages per session */
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    if (!e) return;
    CHECK_OK(dj_engine_swap_init(e, (size_t)64 << 20));
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    dj_session_t *x = NULL, *t = NULL, *fill[8] = {0};
    CHECK_OK(dj_session_new(e, m, 256, 0, &x));
    CHECK_OK(dj_session_new(e, m, 256, 0, &t));
    if (!m || !x || !t) goto done;
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    float *lg = malloc(2 * (size_t)V * sizeof *lg);
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = (int32_t)(dj_test_rand() % V);
    CHECK_OK(dj_session_step(e, x, prompt, 100, lg));
    CHECK_OK(dj_session_step(e, t, prompt, 100, lg + V));
    CHECK(!memcmp(lg, lg + V, V * sizeof *lg));
    for (int i = 0; i < 3; i++) step_pair(e, x, t, V, lg, "before any swap"); /* eager, recorded, replayed */
    size_t cap0 = 0, rep0 = 0, fail0 = 0;
    dj_engine_graph_stats(e, &cap0, &rep0, &fail0);
    int restores = 0, cancels = 0;
    for (int round = 0; round < 12; round++) {
        CHECK_OK(dj_session_swap_out(e, x));
        if (round % 4 == 3) { /* cancelled while the copies may still run */
            CHECK_OK(dj_session_swap_in(e, x));
            CHECK(dj_session_residency(x) == DJ_KV_RESIDENT);
            cancels++;
        } else {
            wait_leave(e, x, DJ_KV_SWAPPING_OUT);
            CHECK(dj_session_residency(x) == DJ_KV_SWAPPED);
            int32_t one = 1;
            CHECK_ST(dj_session_step(e, x, &one, 1, lg), DJ_EBUSY);
            /* a filler takes the pages x gave back, so the restore lands elsewhere */
            dj_session_t **f = &fill[round % 8];
            if (*f) {
                dj_session_free(e, *f);
                *f = NULL;
            }
            CHECK_OK(dj_session_new(e, m, 256, 0, f));
            if (*f) CHECK_OK(dj_session_step(e, *f, prompt, 20 + (uint32_t)round * 7, NULL));
            CHECK_OK(dj_session_swap_in(e, x));
            restores++;
            /* stepped at once, while restoring where the copies are still running */
        }
        step_pair(e, x, t, V, lg, round % 4 == 3 ? "after a cancelled swap-out" : "right after a restore");
        dj_engine_swap_poll(e);
        if (dj_session_residency(x) == DJ_KV_RESTORING) wait_leave(e, x, DJ_KV_RESTORING);
        CHECK(dj_session_residency(x) == DJ_KV_RESIDENT);
        step_pair(e, x, t, V, lg, "after the restore completed");
        /* a prompt chunk after a restore (the prefill path) */
        int32_t chunk[9];
        for (int i = 0; i < 9; i++) chunk[i] = (int32_t)(dj_test_rand() % V);
        if (dj_session_pos(x) + 9 < 250) {
            CHECK_OK(dj_session_step(e, x, chunk, 9, lg));
            CHECK_OK(dj_session_step(e, t, chunk, 9, lg + V));
            CHECK_MSG(!memcmp(lg, lg + V, V * sizeof *lg), "%s round %d: prompt chunk logits differ", name, round);
        }
    }
    size_t cap = 0, rep = 0, fail = 0;
    dj_engine_graph_stats(e, &cap, &rep, &fail);
    CHECK_MSG(rep > rep0 + 12, "decode graphs replayed %zu times after the swaps began", rep - rep0);
    dj_engine_swap_poll(e);
    dj_swap_stats ss;
    dj_engine_swap_stats(e, &ss);
    printf("%s: %d restores into other pages, %d cancelled swap-outs, bit-identical to the twin; graphs: %zu "
           "recorded, %zu replayed since the first swap; pool %zu swaps out, %zu in, %u in flight\n",
           name, restores, cancels, cap, rep - rep0, (size_t)ss.swaps_out, (size_t)ss.swaps_in, ss.in_flight);
    CHECK(ss.swaps_in == (uint64_t)restores && ss.cancels == (uint64_t)cancels);
    free(lg);
done:
    for (int i = 0; i < 8; i++) dj_session_free(e, fill[i]);
    dj_session_free(e, x);
    dj_session_free(e, t);
    dj_model_release(e, m);
    dj_engine_free(e);
}

/* The VMU sized from the device's free memory. */
static void auto_size(void) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.device = "cuda:0";
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    if (!e) return;
    dj_vmu_stats vs;
    dj_vmu_get_stats(dj_engine_vmu(e), &vs);
    const size_t total = vs.text.capacity + vs.data.capacity + vs.stack.capacity;
    printf("auto VMU on cuda:0: %.2f GiB (text %.2f, data %.2f, stack %.2f); default swap pool %.2f GiB\n",
           (double)total / (double)GIB, (double)vs.text.capacity / (double)GIB, (double)vs.data.capacity / (double)GIB,
           (double)vs.stack.capacity / (double)GIB, (double)dj_engine_swap_default_bytes(e) / (double)GIB);
    CHECK(total > GIB);
    dj_engine_free(e);
}

/* One transfer of spans, timed by the device (events) and the host. */
static void time_xfer(dj_backend_t *be, bool to_host, const dj_copy_span *sp, size_t n, size_t bytes,
                      const char *what) {
    double best = 1e9, wall_best = 1e9;
    for (int it = 0; it < 4; it++) {
        dj_backend_xfer_t *x = NULL;
        const double t0 = now();
        if (be->vt->xfer_start(be, to_host, sp, n, &x) != DJ_OK) {
            CHECK_MSG(0, "xfer_start: %s", dj_last_error());
            return;
        }
        double sec = 0;
        dj_status st;
        while ((st = be->vt->xfer_query(be, x, &sec)) == DJ_EBUSY) {}
        const double wall = now() - t0;
        CHECK_OK(st);
        be->vt->xfer_free(be, x);
        if (it > 0 && sec < best) best = sec; /* the first one warms up */
        if (it > 0 && wall < wall_best) wall_best = wall;
    }
    printf("bench swap %s %s, %zu spans: %7.2f GB/s device time (%.2f ms), %7.2f GB/s host wall\n",
           to_host ? "D2H" : "H2D", what, n, (double)bytes / best / 1e9, best * 1e3, (double)bytes / wall_best / 1e9);
}

static void bench_copies(void) {
    dj_backend_t *be = NULL;
    CHECK_OK(dj_backend_cuda_new(0, &be));
    if (!be) return;
    const size_t page = 64 * 1024, bytes = GIB, n = bytes / page;
    void *dev = NULL, *host = NULL;
    CHECK_OK(be->vt->alloc(be, bytes, &dev));
    CHECK_OK(be->vt->host_alloc(be, bytes, &host));
    dj_copy_span *sp = malloc(n * sizeof *sp);
    uint32_t *perm = malloc(n * sizeof *perm);
    if (!dev || !host || !sp || !perm) goto done;
    memset(host, 0x5a, bytes);
    dj_copy_span one = {.dev = dev, .host = host, .bytes = bytes};
    time_xfer(be, true, &one, 1, bytes, "1 GiB contiguous");
    time_xfer(be, false, &one, 1, bytes, "1 GiB contiguous");
    for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) { /* device pages scattered */
        const size_t j = (size_t)(dj_test_rand() % (i + 1));
        const uint32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (size_t i = 0; i < n; i++)
        sp[i] = (dj_copy_span){.dev = (uint8_t *)dev + (size_t)perm[i] * page, .host = (uint8_t *)host + i * page,
                               .bytes = page};
    time_xfer(be, true, sp, n, bytes, "1 GiB in scattered 64 KiB pages");
    time_xfer(be, false, sp, n, bytes, "1 GiB in scattered 64 KiB pages");
    /* the bytes make the round trip: a pattern out through the scattered
     * pages and back (the timed copies above moved whatever was there) */
    memset(host, 0x5a, bytes);
    dj_backend_xfer_t *x = NULL;
    CHECK_OK(be->vt->xfer_start(be, false, sp, n, &x));
    be->vt->xfer_free(be, x);
    memset(host, 0, bytes);
    x = NULL;
    CHECK_OK(be->vt->xfer_start(be, true, sp, n, &x));
    be->vt->xfer_free(be, x);
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++) bad += ((const uint8_t *)host)[i] != 0x5a;
    CHECK_MSG(bad == 0, "%zu bytes differ after a round trip through scattered pages", bad);
done:
    free(sp);
    free(perm);
    if (host) be->vt->host_free(be, host);
    if (dev) be->vt->free(be, dev);
    dj_backend_free(be);
}

/* A session of a real model's shape: 2048 prompt tokens swapped out and back. */
static void bench_model(const char *dir) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.device = "cuda:0";
    dj_vmu_config_default(&ec.vmu, 40 * GIB);
    ec.max_step_tokens = 512;
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    if (!e) return;
    CHECK_OK(dj_engine_swap_init(e, 4 * GIB));
    dj_model_t *m = NULL;
    dj_session_t *s = NULL, *f = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    if (m) CHECK_OK(dj_session_new(e, m, 4096, 0, &s));
    if (m) CHECK_OK(dj_session_new(e, m, 4096, 0, &f));
    if (!s || !f) goto done;
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    int32_t *ids = malloc(2048 * sizeof *ids);
    float *a = malloc(V * sizeof *a), *b = malloc(V * sizeof *b);
    for (int i = 0; i < 2048; i++) ids[i] = (int32_t)(dj_test_rand() % V);
    CHECK_OK(dj_session_step(e, s, ids, 2048, NULL));
    CHECK_OK(dj_session_step(e, f, ids, 64, NULL));
    for (int round = 0; round < 3; round++) {
        const double t0 = now();
        CHECK_OK(dj_session_swap_out(e, s));
        wait_leave(e, s, DJ_KV_SWAPPING_OUT);
        const double t_out = now() - t0;
        CHECK_OK(dj_session_step(e, f, ids + 100 + round, 1, NULL)); /* takes pages that s gave back */
        const double t1 = now();
        CHECK_OK(dj_session_swap_in(e, s));
        wait_leave(e, s, DJ_KV_RESTORING);
        const double t_in = now() - t1;
        printf("bench swap session %s 2048 tokens %.1f MiB: out %.2f ms, in %.2f ms (host wall, poll loop)\n",
               dj_model_get_config(m)->arch_name,
               (double)dj_session_kv_bytes(s) / (1 << 20), t_out * 1e3, t_in * 1e3);
    }
    /* the restored session continues as one that was never swapped */
    dj_session_t *t = NULL;
    CHECK_OK(dj_session_new(e, m, 4096, 0, &t));
    if (t) {
        CHECK_OK(dj_session_step(e, t, ids, 2048, NULL));
        CHECK_OK(dj_session_step(e, s, ids + 7, 1, a));
        CHECK_OK(dj_session_step(e, t, ids + 7, 1, b));
        CHECK_MSG(!memcmp(a, b, V * sizeof *a), "8B-shape session: logits after 3 swaps differ from a fresh twin");
        dj_session_free(e, t);
    }
    dj_swap_stats ss;
    dj_engine_swap_stats(e, &ss);
    printf("bench swap session totals: out %.2f GB/s (%zu swaps, %.1f MiB), in %.2f GB/s (device time)\n",
           (double)ss.bytes_out / ss.out_s / 1e9, (size_t)ss.swaps_out, (double)ss.bytes_out / (1 << 20),
           (double)ss.bytes_in / ss.in_s / 1e9);
    free(ids);
    free(a);
    free(b);
done:
    dj_session_free(e, s);
    dj_session_free(e, f);
    dj_model_release(e, m);
    dj_engine_free(e);
}

int main(int argc, char **argv) {
    const char *root = ".", *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) model = argv[++i];
        else root = argv[i];
    }
    dj_test_seed();
    if (dj_cuda_device_count() == 0) {
        fprintf(stderr, "gpu_swap: no CUDA device\n");
        return 2;
    }
    exactness(root, "llama3");
    exactness(root, "qwen2");
    auto_size();
    bench_copies();
    if (model) bench_model(model);
    return dj_test_finish("gpu_swap");
}
