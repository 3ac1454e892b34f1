/* bench_brk.c: Experiment 3 (issue 48) - a prefill step stopped at a
 * breakpoint (after layer K), the point's value at the host, another
 * session's generation run to completion meanwhile, the step resumed.
 * Reports the overhead of holding the step (save + restore of the
 * activations the rest of the step reads) against the plain step's
 * compute, the pause's whole cost (a stopped step's two halves against the
 * plain one), the other generation's tok/s while the step is paused against
 * the same generation alone, and whether the resumed logits equal the plain
 * step's bit for bit. Medians over reps. Exit 0 when the overhead is within
 * --bar-overhead (default 0.02), the generation within --bar-gen (0.03) and
 * the logits equal.
 *   bench_brk --model DIR [--device cpu|cuda:N] [--tokens 512] [--gen 256] [--layer 15] [--reps 5] */
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
    uint32_t tokens, gen, reps;
    int layer;
    double bar_overhead, bar_gen;
} opts;

static double now(void) { return bench_now(); }
static void die(const char *what) { bench_die("bench_brk", what); }
static void *xmalloc(size_t n) { return bench_xmalloc("bench_brk", n); }
static double median(double *v, uint32_t n) { return bench_median(v, n); }

/* A greedy generation of o->gen tokens after an 8-token prompt in a fresh
 * session; its decode seconds. */
static double generate(dj_engine_t *e, dj_model_t *m, const opts *o, const int32_t *prompt) {
    dj_session_t *s = NULL;
    if (dj_session_new(e, m, o->gen + 16, 0, &s) != DJ_OK) die("generation session");
    int32_t next = 0;
    if (dj_session_step_sample(e, s, prompt, 8, NULL, &next) != DJ_OK) die("generation prompt");
    const double t0 = now();
    for (uint32_t i = 0; i < o->gen; i++) {
        const int32_t tok = next;
        if (dj_session_step_sample(e, s, &tok, 1, NULL, &next) != DJ_OK) die("generation step");
    }
    const double dt = now() - t0;
    dj_session_free(e, s);
    return dt;
}

int main(int argc, char **argv) {
    opts o = {.device = "cpu", .tokens = 512, .gen = 256, .reps = 5, .layer = 15, .bar_overhead = 0.02,
              .bar_gen = 0.03};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_brk: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--model")) o.model = v;
        else if (!strcmp(a, "--device")) o.device = v;
        else if (!strcmp(a, "--tokens")) o.tokens = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--gen")) o.gen = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--layer")) o.layer = atoi(v);
        else if (!strcmp(a, "--reps")) o.reps = (uint32_t)strtoul(v, NULL, 10);
        else if (!strcmp(a, "--bar-overhead")) o.bar_overhead = strtod(v, NULL);
        else if (!strcmp(a, "--bar-gen")) o.bar_gen = strtod(v, NULL);
        else {
            fprintf(stderr, "bench_brk: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (!o.model || !o.tokens || !o.gen || o.reps < 1) {
        fprintf(stderr, "usage: bench_brk --model DIR [--device cpu|cuda:N] [--tokens N] [--gen N] [--layer K] "
                        "[--reps N] [--bar-overhead F] [--bar-gen F]\n");
        return 2;
    }
    dj_checkpoint_t *ck = NULL;
    if (dj_checkpoint_open(o.model, &ck) != DJ_OK) die("checkpoint");
    dj_model_needs needs;
    if (dj_model_estimate(ck, DJ_DTYPE_BF16, o.tokens, &needs) != DJ_OK) die("estimate");
    const dj_model_config cfg = *dj_checkpoint_config(ck);
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.device = o.device;
    ec.max_step_tokens = o.tokens;
    /* at once: the plain step's session, the paused one's, the generation's */
    dj_engine_config_for(&needs, 2 * (o.tokens + 8) + o.gen + 16, 0, &ec.vmu);
    dj_engine_t *e = NULL;
    if (dj_engine_new(&ec, &e) != DJ_OK) die("engine");
    dj_model_t *m = NULL;
    if (dj_model_load_checkpoint(e, ck, "bench", &m) != DJ_OK) die("load");
    dj_checkpoint_close(ck);
    const uint32_t V = cfg.vocab_size, d = cfg.hidden_size, L = cfg.n_layers;
    const uint32_t K = o.layer >= 0 && (uint32_t)o.layer < L ? (uint32_t)o.layer : L / 2 - 1;
    int32_t *ids = xmalloc((size_t)o.tokens * sizeof *ids);
    uint64_t x = 14;
    for (uint32_t i = 0; i < o.tokens; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)(3 + (x >> 33) % (V - 3));
    }
    float *lp = xmalloc((size_t)V * sizeof(float)), *lb = xmalloc((size_t)V * sizeof(float));
    float *val = xmalloc((size_t)o.tokens * d * sizeof(float));
    dj_intervention iv[1] = {{.point = {DJ_POINT_LAYER_OUTPUT, K}, .op = DJ_IV_BREAK, .out = val}};
    double *t_plain = xmalloc(o.reps * sizeof(double)), *t_pre = xmalloc(o.reps * sizeof(double));
    double *t_post = xmalloc(o.reps * sizeof(double)), *t_hold = xmalloc(o.reps * sizeof(double));
    double *g_alone = xmalloc(o.reps * sizeof(double)), *g_paused = xmalloc(o.reps * sizeof(double));
    uint64_t held = 0;
    uint32_t live = 0;
    bool equal = true;
    printf("bench_brk: %s on %s, %u layers, hidden %u; a %u-token step stopped at layers.%u.output, a %u-token "
           "generation meanwhile\n", o.model, o.device, L, d, o.tokens, K, o.gen);
    for (uint32_t r = 0; r < o.reps + 1; r++) { /* rep 0 warms up (plans, scratch, pages) */
        /* the plain step */
        dj_session_t *s = NULL;
        if (dj_session_new(e, m, o.tokens + 8, 0, &s) != DJ_OK) die("session");
        double t0 = now();
        if (dj_session_step(e, s, ids, o.tokens, lp) != DJ_OK) die("plain step");
        const double tp = now() - t0;
        dj_session_free(e, s);
        /* the generation alone */
        const double ga = generate(e, m, &o, ids);
        /* stopped, the generation meanwhile, resumed */
        if (dj_session_new(e, m, o.tokens + 8, 0, &s) != DJ_OK) die("session");
        dj_step_brk_t *b = NULL;
        t0 = now();
        if (dj_session_step_break(e, s, ids, o.tokens, iv, 1, lb, &b) != DJ_OK || !b) die("step to the breakpoint");
        const double tpre = now() - t0; /* the value is at the host: the client's fetch */
        dj_step_brk_stats bs;
        dj_step_brk_info(b, &bs);
        const double save_s = bs.save_s;
        held = bs.held_bytes;
        live = bs.live;
        const double gp = generate(e, m, &o, ids + 8);
        t0 = now();
        if (dj_step_brk_resume(e, &b, lb, &bs) != DJ_OK || b) die("resume");
        const double tpost = now() - t0;
        const double restore_s = bs.restore_s;
        dj_session_free(e, s);
        equal = equal && memcmp(lb, lp, (size_t)V * sizeof(float)) == 0;
        if (r) {
            t_plain[r - 1] = tp;
            t_pre[r - 1] = tpre;
            t_post[r - 1] = tpost;
            t_hold[r - 1] = save_s + restore_s;
            g_alone[r - 1] = ga;
            g_paused[r - 1] = gp;
        }
    }
    const double mp = median(t_plain, o.reps), mpre = median(t_pre, o.reps), mpost = median(t_post, o.reps);
    const double msave = median(t_hold, o.reps), mga = median(g_alone, o.reps), mgp = median(g_paused, o.reps);
    const double overhead = msave / mp, whole = (mpre + mpost) / mp - 1;
    const double tps_alone = o.gen / mga, tps_paused = o.gen / mgp, gen_loss = 1 - tps_paused / tps_alone;
    printf("plain step %.3f ms; to the breakpoint %.3f ms + resumed %.3f ms (%+.2f%% in all, the value's fetch "
           "and the host path at the point included)\n", mp * 1e3, mpre * 1e3, mpost * 1e3, whole * 100);
    printf("held %llu bytes (%u activations); save + restore %.3f ms = %.3f%% of the plain step (bar %.1f%%)\n",
           (unsigned long long)held, live, msave * 1e3, overhead * 100, o.bar_overhead * 100);
    printf("other generation: %.1f tok/s alone, %.1f tok/s with the step paused (%+.2f%%, bar %.1f%%)\n", tps_alone,
           tps_paused, -gen_loss * 100, o.bar_gen * 100);
    printf("resumed logits %s the plain step's\n", equal ? "bit-identical to" : "DIFFER from");
    const bool ok = overhead <= o.bar_overhead && gen_loss <= o.bar_gen && equal;
    printf("bench_brk: %s\n", ok ? "ok" : "MISSED");
    free(ids);
    free(lp);
    free(lb);
    free(val);
    free(t_plain);
    free(t_pre);
    free(t_post);
    free(t_hold);
    free(g_alone);
    free(g_paused);
    dj_model_release(e, m);
    dj_engine_free(e);
    return ok ? 0 : 1;
}
