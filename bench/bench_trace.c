/* bench_trace.c: what interventions cost - a step saving 2 points (the
 * middle layer's output and the last layer's) against the plain step of the
 * same shape, prefill and decode, on one checkpoint and device. Plain and
 * traced runs alternate; medians; a traced step's time includes its saves
 * arriving in host memory as f32. Decode also runs plain without graphs
 * (the figure a traced decode step has when it cannot replay one), and
 * counts the graph replays of the traced steps. Exit 0 when each
 * traced/plain ratio is within --bar (default 1.05: issue 14's bar) and the
 * traced logits equal the plain ones.
 *   bench_trace --model DIR [--device cpu|cuda:N] [--prefill N] [--ctx N] [--reps N] [--bar R] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/engine.h"
#include "djinn/intervene.h"
#include "bench_util.h"

typedef struct opts {
    const char *model, *device;
    uint32_t prefill, ctx, reps;
    double bar;
} opts;

static double now(void) { return bench_now(); }
static void die(const char *what) { bench_die("bench_trace", what); }
static void *xmalloc(size_t n) { return bench_xmalloc("bench_trace", n); }
static double median(double *v, uint32_t n) { return bench_median(v, n); }

static double max_rel(const float *a, const float *b, uint32_t n) {
    double d = 0, m = 0;
    for (uint32_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / (m > 0 ? m : 1);
}

static void graphs(bool on) {
    if (on) unsetenv("DJINN_NO_GRAPHS");
    else setenv("DJINN_NO_GRAPHS", "1", 1);
}

int main(int argc, char **argv) {
    opts o = {.device = "cpu", .prefill = 128, .ctx = 512, .reps = 20, .bar = 1.05};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_trace: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) o.model = v;
        else if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "--prefill")) o.prefill = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--ctx")) o.ctx = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--reps")) o.reps = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--bar")) o.bar = strtod(v, NULL);
        else {
            fprintf(stderr, "bench_trace: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!o.model || !o.prefill || !o.ctx || o.reps < 3) {
        fprintf(stderr, "usage: bench_trace --model DIR [--device cpu|cuda:N] [--prefill N] [--ctx N] [--reps N>=3] "
                        "[--bar R]\n");
        return 2;
    }
    dj_checkpoint_t *ck = NULL;
    if (dj_checkpoint_open(o.model, &ck) != DJ_OK) die("checkpoint");
    dj_model_needs needs;
    if (dj_model_estimate(ck, DJ_DTYPE_BF16, o.prefill, &needs) != DJ_OK) die("estimate");
    const dj_model_config cfg = *dj_checkpoint_config(ck);
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.device = o.device;
    ec.max_step_tokens = o.prefill;
    /* sessions at once: 2 prefill ones, 2 decode ones */
    dj_engine_config_for(&needs, 2 * (o.prefill + 8) + 2 * (o.ctx + o.reps * 3 + 8), 0, &ec.vmu);
    dj_engine_t *e = NULL;
    if (dj_engine_new(&ec, &e) != DJ_OK) die("engine");
    dj_model_t *m = NULL;
    if (dj_model_load_checkpoint(e, ck, "bench", &m) != DJ_OK) die("load");
    dj_checkpoint_close(ck);
    const uint32_t V = cfg.vocab_size, d = cfg.hidden_size, L = cfg.n_layers;
    const uint32_t np = o.prefill > o.ctx ? o.prefill : o.ctx;
    int32_t *ids = xmalloc((size_t)np * sizeof *ids);
    uint64_t x = 14;
    for (uint32_t i = 0; i < np; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)(3 + (x >> 33) % (V - 3));
    }
    float *lp = xmalloc((size_t)V * sizeof(float)), *lt = xmalloc((size_t)V * sizeof(float));
    float *s1 = xmalloc((size_t)np * d * sizeof(float)), *s2 = xmalloc((size_t)np * d * sizeof(float));
    dj_intervention iv[2] = {{.point = {DJ_POINT_LAYER_OUTPUT, L / 2}, .op = DJ_IV_SAVE, .out = s1},
                             {.point = {DJ_POINT_LAYER_OUTPUT, L - 1}, .op = DJ_IV_SAVE, .out = s2}};
    double *tp = xmalloc(o.reps * sizeof(double)), *tt = xmalloc(o.reps * sizeof(double));
    double *te = xmalloc(o.reps * sizeof(double));
    int failed = 0;
    printf("bench_trace: %s on %s, %u layers, hidden %u; saving layers.%u.output and layers.%u.output\n", o.model,
           o.device, L, d, L / 2, L - 1);

    /* ---- prefill: a fresh session each rep (its step from position 0) ---- */
    double err = 0;
    for (uint32_t r = 0; r < o.reps + 1; r++) { /* rep 0 warms up (plans, scratch) */
        for (int traced = 0; traced < 2; traced++) {
            dj_session_t *s = NULL;
            if (dj_session_new(e, m, o.prefill + 8, 0, &s) != DJ_OK) die("session");
            const double t0 = now();
            const dj_status st = traced ? dj_session_step_trace(e, s, ids, o.prefill, iv, 2, lt)
                                        : dj_session_step(e, s, ids, o.prefill, lp);
            const double dt = now() - t0; /* both end with the logits on the host: synced */
            if (st != DJ_OK) die(traced ? "traced prefill" : "prefill");
            dj_session_free(e, s);
            if (r) (traced ? tt : tp)[r - 1] = dt;
        }
        err = fmax(err, max_rel(lt, lp, V));
    }
    const double pp = median(tp, o.reps), pt = median(tt, o.reps);
    const bool p_ok = pt <= o.bar * pp && err == 0;
    printf("prefill %u tokens: plain %.3f ms, 2 saves %.3f ms, ratio %.4f (bar %.2f), logits max rel diff %.2g: %s\n",
           o.prefill, pp * 1e3, pt * 1e3, pt / pp, o.bar, err, p_ok ? "ok" : "MISSED");
    failed += !p_ok;

    /* ---- decode at ctx: two sessions prefilled alike, then one token a step ---- */
    dj_session_t *sp = NULL, *st_ = NULL;
    if (dj_session_new(e, m, o.ctx + o.reps * 3 + 8, 0, &sp) != DJ_OK) die("session");
    if (dj_session_new(e, m, o.ctx + o.reps * 3 + 8, 0, &st_) != DJ_OK) die("session");
    for (uint32_t off = 0; off < o.ctx; off += o.prefill) {
        const uint32_t k = o.ctx - off < o.prefill ? o.ctx - off : o.prefill;
        if (dj_session_step(e, sp, ids + off, k, NULL) != DJ_OK) die("decode prefill");
        if (dj_session_step(e, st_, ids + off, k, NULL) != DJ_OK) die("decode prefill");
    }
    err = 0;
    double err_eager = 0;
    size_t replays_traced = 0;
    for (uint32_t r = 0; r < o.reps + 2; r++) { /* reps 0, 1: eager once, then recorded (CUDA graphs) */
        const int32_t tok = ids[r % np];
        graphs(true);
        double t0 = now();
        if (dj_session_step(e, sp, &tok, 1, lp) != DJ_OK) die("decode");
        const double d_plain = now() - t0;
        size_t rp0 = 0, rp1 = 0;
        dj_engine_graph_stats(e, NULL, &rp0, NULL);
        t0 = now();
        if (dj_session_step_trace(e, st_, &tok, 1, iv, 2, lt) != DJ_OK) die("traced decode");
        const double d_trace = now() - t0;
        dj_engine_graph_stats(e, NULL, &rp1, NULL);
        if (r >= 2) replays_traced += rp1 - rp0;
        err = fmax(err, max_rel(lt, lp, V));
        /* the plain step without a graph, both sessions fed alike */
        graphs(false);
        float *le = xmalloc((size_t)V * sizeof(float));
        t0 = now();
        if (dj_session_step(e, sp, &tok, 1, le) != DJ_OK) die("eager decode");
        const double d_eager = now() - t0;
        if (dj_session_step_trace(e, st_, &tok, 1, iv, 2, lt) != DJ_OK) die("traced decode");
        err_eager = fmax(err_eager, max_rel(lt, le, V));
        free(le);
        graphs(true);
        if (r >= 2) {
            tp[r - 2] = d_plain;
            tt[r - 2] = d_trace;
            te[r - 2] = d_eager;
        }
    }
    const double dp = median(tp, o.reps), dt = median(tt, o.reps), de = median(te, o.reps);
    const bool d_ok = dt <= o.bar * dp;
    printf("decode at ctx %u: plain %.3f ms (eager, no graph: %.3f ms), 2 saves %.3f ms (%zu of %u replayed a "
           "graph); ratio %.4f to plain (bar %.2f), %.4f to eager; logits max rel diff %.2g (to eager %.2g): %s\n",
           o.ctx, dp * 1e3, de * 1e3, dt * 1e3, replays_traced, o.reps, dt / dp, o.bar, dt / de, err, err_eager,
           d_ok ? "ok" : "MISSED");
    failed += !d_ok;
    dj_session_free(e, sp);
    dj_session_free(e, st_);
    free(ids);
    free(lp);
    free(lt);
    free(s1);
    free(s2);
    free(tp);
    free(tt);
    free(te);
    dj_model_release(e, m);
    dj_engine_free(e);
    return failed ? 1 : 0;
}
