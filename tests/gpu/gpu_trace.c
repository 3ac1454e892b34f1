/* gpu_trace.c: interventions on the GPU (bf16 activations: a save is a
 * device copy, widened on the host after the step; an edit goes down,
 * changes in f32 and up again) against the
 * CPU engine's f32 ones, on every fixture model and the demo model: each
 * saved point of a prompt step and of a decode step, and the logits of a
 * steered step (an add at layers.0.output, a replace at the last
 * layer's mlp.output), within 3e-2 relative L2 (bf16 against f32); and a
 * step that only saves within 1e-3 of the plain GPU step (the plan's
 * segments fuse a little less, nothing else changes). Needs a GPU.
 * usage: gpu_trace [REPO_ROOT (default .)] */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/dj_cuda.h"
#include "djinn/engine.h"
#include "djinn/intervene.h"
#include "exec/engine_impl.h"
#include "fixture_ref.h"
#include "testutil.h"

#define TOL 3e-2

typedef struct run {
    float *saved;     /* [n_pts][n][d] */
    float *dec;       /* [d]: the decode step's last layer output */
    float *logits;    /* [V] the saving step's */
    float *steered;   /* [V] the steered step's */
    float *plain;     /* [V] the plain step's */
} run;

/* Decode steps saving 2 points replay a recorded graph with the copies in
 * it (on a device): each step's saves and logits bit-identical to the same
 * traced step run eagerly ($DJINN_NO_GRAPHS), the logits within 1e-3 of a
 * plain step's, and the steps from the third on replays. */
static void graph_saves(dj_engine_t *e, dj_model_t *m, const ref *r, const char *device) {
    const dj_model_config *c = dj_model_get_config(m);
    const uint32_t L = c->n_layers, d = c->hidden_size, V = c->vocab_size, n = (uint32_t)r->n_prompt;
    dj_session_t *g = NULL, *q = NULL, *p = NULL;
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &g));
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &q));
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &p));
    if (!g || !q || !p) return;
    CHECK_OK(dj_session_step(e, g, r->prompt, n, NULL));
    CHECK_OK(dj_session_step(e, q, r->prompt, n, NULL));
    CHECK_OK(dj_session_step(e, p, r->prompt, n, NULL));
    float *sv = calloc((size_t)4 * d, sizeof(float)), *lg = calloc((size_t)3 * V, sizeof(float));
    dj_intervention ig[2] = {{.point = {DJ_POINT_LAYER_OUTPUT, L / 2}, .op = DJ_IV_SAVE, .out = sv},
                             {.point = {DJ_POINT_LAYER_OUTPUT, L - 1}, .op = DJ_IV_SAVE, .out = sv + d}};
    dj_intervention iq[2] = {{.point = {DJ_POINT_LAYER_OUTPUT, L / 2}, .op = DJ_IV_SAVE, .out = sv + 2 * d},
                             {.point = {DJ_POINT_LAYER_OUTPUT, L - 1}, .op = DJ_IV_SAVE, .out = sv + 3 * d}};
    size_t replays = 0, r0 = 0, r1 = 0;
    bool same_saves = true, same_logits = true, nonzero = false;
    double worst = 0;
    for (int k = 0; k < 5; k++) {
        const int32_t tok = r->greedy[k % (r->n_greedy > 0 ? r->n_greedy : 1)];
        dj_engine_graph_stats(e, NULL, &r0, NULL);
        CHECK_OK(dj_session_step_trace(e, g, &tok, 1, ig, 2, lg));
        dj_engine_graph_stats(e, NULL, &r1, NULL);
        replays += r1 - r0;
        dj__engine_set_graphs(e, false); /* as $DJINN_NO_GRAPHS=1, which the engine reads when made */
        CHECK_OK(dj_session_step_trace(e, q, &tok, 1, iq, 2, lg + V));
        dj__engine_set_graphs(e, true);
        CHECK_OK(dj_session_step(e, p, &tok, 1, lg + 2 * V));
        same_saves &= memcmp(sv, sv + 2 * d, (size_t)2 * d * sizeof(float)) == 0;
        same_logits &= memcmp(lg, lg + V, (size_t)V * sizeof(float)) == 0;
        for (uint32_t i = 0; i < 2 * d; i++) nonzero |= sv[i] != 0.0f;
        const double e_plain = rel_l2(lg, lg + 2 * V, (int)V);
        worst = fmax(worst, e_plain);
    }
    const bool gpu = strcmp(device, "cpu") != 0;
    CHECK_MSG(same_saves && nonzero, "%s: decode saves from graph replays differ from eager ones", device);
    CHECK_MSG(same_logits, "%s: traced decode logits from graph replays differ from eager ones", device);
    CHECK_MSG(worst <= 1e-3, "%s: traced decode logits %.3g from the plain step's (rel L2)", device, worst);
    CHECK_MSG(!gpu || replays >= 3, "%s: %zu of 5 traced decode steps replayed a graph (want >= 3)", device, replays);
    printf("  %s: 5 traced decode steps, %zu graph replays, saves = eager, logits vs plain %.2e\n", device, replays,
           worst);
    free(sv);
    free(lg);
    dj_session_free(e, g);
    dj_session_free(e, q);
    dj_session_free(e, p);
}

static void one_engine(const char *device, const char *dir, const ref *r, const float *repl, run *out) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.device = device;
    dj_vmu_config_default(&ec.vmu, (size_t)1 << 30);
    ec.max_step_tokens = 64;
    dj_engine_t *e = NULL;
    dj_model_t *m = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    if (e) CHECK_OK(dj_model_load(e, dir, &m));
    if (!m) {
        dj_engine_free(e);
        return;
    }
    const dj_model_config *c = dj_model_get_config(m);
    const uint32_t L = c->n_layers, d = c->hidden_size, n = (uint32_t)r->n_prompt, np = 4 * L + 1;
    dj_intervention *iv = calloc(np, sizeof *iv);
    for (uint32_t k = 0; k < np; k++) {
        iv[k].point = k == 4 * L ? (dj_point){DJ_POINT_FINAL_NORM, 0} : (dj_point){(dj_point_kind)(k % 4), k / 4};
        iv[k].op = DJ_IV_SAVE;
        iv[k].out = out->saved + (size_t)k * n * d;
    }
    dj_session_t *s = NULL, *p = NULL, *t = NULL;
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s));
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &p));
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &t));
    CHECK_OK(dj_session_step(e, p, r->prompt, n, out->plain));
    CHECK_OK(dj_session_step_trace(e, s, r->prompt, n, iv, np, out->logits));
    dj_intervention last = {.point = {DJ_POINT_LAYER_OUTPUT, L - 1}, .op = DJ_IV_SAVE, .out = out->dec};
    CHECK_OK(dj_session_step_trace(e, s, &r->greedy[0], 1, &last, 1, NULL));
    float *steer = malloc((size_t)d * sizeof(float));
    for (uint32_t i = 0; i < d; i++) steer[i] = (float)((int)(i % 7) - 3) * 0.25f;
    dj_intervention ed[2] = {
        {.point = {DJ_POINT_LAYER_OUTPUT, 0}, .op = DJ_IV_ADD, .data = steer, .rows = 1},
        {.point = {DJ_POINT_MLP_OUTPUT, L - 1}, .op = DJ_IV_REPLACE, .data = repl, .rows = n},
    };
    CHECK_OK(dj_session_step_trace(e, t, r->prompt, n, ed, 2, out->steered));
    free(steer);
    graph_saves(e, m, r, device);
    free(iv);
    dj_session_free(e, s);
    dj_session_free(e, p);
    dj_session_free(e, t);
    dj_model_release(e, m);
    dj_engine_free(e);
}

static void check(const char *name, const char *dir, const char *refp) {
    ref r;
    memset(&r, 0, sizeof r);
    CHECK_MSG(load_ref_file(refp, &r) == 0, "%s: no reference", name);
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    if (!ck || !r.last) {
        dj_checkpoint_close(ck);
        ref_free(&r);
        return;
    }
    const dj_model_config c = *dj_checkpoint_config(ck);
    dj_checkpoint_close(ck);
    const uint32_t L = c.n_layers, d = c.hidden_size, n = (uint32_t)r.n_prompt, np = 4 * L + 1, V = c.vocab_size;
    run cpu, gpu;
    run *rs[2] = {&cpu, &gpu};
    for (int i = 0; i < 2; i++) {
        rs[i]->saved = calloc((size_t)np * n * d, sizeof(float));
        rs[i]->dec = calloc(d, sizeof(float));
        rs[i]->logits = calloc(V, sizeof(float));
        rs[i]->steered = calloc(V, sizeof(float));
        rs[i]->plain = calloc(V, sizeof(float));
    }
    float *repl = malloc((size_t)n * d * sizeof(float));
    for (size_t i = 0; i < (size_t)n * d; i++) repl[i] = (float)((int)(i % 11) - 5) * 0.1f;
    one_engine("cpu", dir, &r, repl, &cpu);
    one_engine("cuda:0", dir, &r, repl, &gpu);
    double worst = 0;
    for (uint32_t k = 0; k < np; k++) {
        const double e = rel_l2(gpu.saved + (size_t)k * n * d, cpu.saved + (size_t)k * n * d, (int)(n * d));
        CHECK_MSG(e <= TOL, "%s: saved point %u: rel L2 %.3g > %g", name, k, e, TOL);
        worst = fmax(worst, e);
    }
    const double e_dec = rel_l2(gpu.dec, cpu.dec, (int)d), e_st = rel_l2(gpu.steered, cpu.steered, (int)V);
    const double e_same = rel_l2(gpu.logits, gpu.plain, (int)V), e_cpu = rel_l2(cpu.logits, cpu.plain, (int)V);
    CHECK_MSG(e_dec <= TOL, "%s: the decode step's saved point: rel L2 %.3g", name, e_dec);
    CHECK_MSG(e_st <= TOL, "%s: steered logits: rel L2 %.3g", name, e_st);
    CHECK_MSG(e_same <= 1e-3, "%s: saving moved the GPU logits by %.3g (rel L2)", name, e_same);
    CHECK_MSG(e_cpu == 0, "%s: saving moved the CPU logits", name);
    CHECK_MSG(rel_l2(gpu.steered, gpu.plain, (int)V) > 1e-2, "%s: the edits changed nothing on the GPU", name);
    printf("%-14s %u points: worst rel L2 %.2e; decode %.2e; steered logits %.2e; saving vs plain (GPU) %.2e\n",
           name, np, worst, e_dec, e_st, e_same);
    for (int i = 0; i < 2; i++) {
        free(rs[i]->saved);
        free(rs[i]->dec);
        free(rs[i]->logits);
        free(rs[i]->steered);
        free(rs[i]->plain);
    }
    free(repl);
    ref_free(&r);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : ".";
    if (dj_cuda_device_count() < 1) {
        fprintf(stderr, "gpu_trace: no GPU\n");
        return 2;
    }
    for (int i = 0; i < DJ_N_FIXTURES; i++) {
        char dir[512], refp[600];
        snprintf(dir, sizeof dir, "%s/tests/fixtures/models/%s", root, DJ_FIXTURE_NAMES[i]);
        snprintf(refp, sizeof refp, "%s/reference.json", dir);
        check(DJ_FIXTURE_NAMES[i], dir, refp);
    }
    char dir[512], refp[600];
    snprintf(dir, sizeof dir, "%s/models/demo", root);
    snprintf(refp, sizeof refp, "%s/tests/fixtures/demo/reference.json", root);
    check("demo", dir, refp);
    return dj_test_finish("gpu_trace");
}
