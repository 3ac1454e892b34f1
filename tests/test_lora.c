/* test_lora.c: LoRA adapters on the CPU engine - made here as PEFT files for
 * the tiny fixtures, checked against the base with W + s B A merged by hand
 * (every architecture), a batch mixing adapters bit-exact per row, the prefix
 * cache keyed by adapter, references and eviction, and every refusal. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djinn/checkpoint.h"
#include "djinn/engine.h"
#include "djinn/lora.h"
#include "djinn/vmu.h"
#include "exec/lora_impl.h"
#include "lora_fixture.h"
#include "testutil.h"

#define PAGE 4096

static char g_tmp[256]; /* this run's scratch directory */

static dj_engine_t *new_engine(bool cache) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.n_threads = 2;
    ec.max_step_tokens = 32;
    ec.no_prefix_cache = !cache;
    dj_vmu_config_default(&ec.vmu, (size_t)48 << 20);
    ec.vmu.page_bytes = PAGE;
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    return e;
}

/* Writes a PEFT adapter of fixture `model` into g_tmp/<name>; returns the
 * directory (static storage: copy it). */
static const char *make_adapter(const char *model, const char *name, const adapter_spec *sp) {
    static char dir[512];
    char base_dir[512];
    snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
    snprintf(base_dir, sizeof base_dir, "%s/models/%s", DJ_FIXTURES, model);
    lora_fixture_write(base_dir, model, dir, sp);
    return dir;
}

/* g_tmp/<name>: the model in base_dir with every adapted weight W + scale B A (f32),
 * from the adapter in adir. */
/* Element i of an f32 or bf16 tensor. */
static float tensor_at(const dj_tensor_info *t, size_t i) {
    if (t->dtype == DJ_DTYPE_F32) {
        float f;
        memcpy(&f, (const uint8_t *)t->data + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const uint8_t *)t->data + 2 * i, 2);
    return dj_bf16_to_f32(h);
}

static const char *make_merged_from(const char *base_dir, const char *adir, float scale, const char *name) {
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", g_tmp, name);
    mkdir(dir, 0700);
    char p[2600];
    dj_checkpoint_t *ck = NULL, *ad = NULL;
    CHECK_OK(dj_checkpoint_open(base_dir, &ck));
    /* the adapter's tensors, read through a checkpoint of their own: a config.json beside a copy */
    char adck[512];
    snprintf(adck, sizeof adck, "%s/%s-ad", g_tmp, name);
    mkdir(adck, 0700);
    snprintf(p, sizeof p, "cp %s/config.json %s/config.json && cp %s/adapter_model.safetensors %s/model.safetensors",
             base_dir, adck, adir, adck);
    CHECK(system(p) == 0);
    CHECK_OK(dj_checkpoint_open(adck, &ad));
    if (!ck || !ad) return dir;
    const size_t n = dj_checkpoint_tensor_count(ck);
    wt *t = calloc(n, sizeof *t);
    for (size_t i = 0; i < n; i++) {
        const dj_tensor_info *ti = dj_checkpoint_tensor(ck, i);
        snprintf(t[i].name, sizeof t[i].name, "%s", ti->name);
        t[i].rows = ti->shape[0];
        t[i].cols = ti->ndim > 1 ? ti->shape[1] : 0;
        const size_t c = wt_count(&t[i]);
        t[i].v = malloc(c * sizeof(float));
        for (size_t k = 0; k < c; k++) {
            if (ti->dtype == DJ_DTYPE_F32) memcpy(&t[i].v[k], (const uint8_t *)ti->data + 4 * k, 4);
            else {
                uint16_t h;
                memcpy(&h, (const uint8_t *)ti->data + 2 * k, 2);
                t[i].v[k] = ti->dtype == DJ_DTYPE_BF16 ? dj_bf16_to_f32(h) : dj_f16_to_f32(h);
            }
        }
        char module[200], na[300], nb[300];
        if (!leaf_of(ti->name, module)) continue;
        snprintf(na, sizeof na, "base_model.model.%s.lora_A.weight", module);
        snprintf(nb, sizeof nb, "base_model.model.%s.lora_B.weight", module);
        const dj_tensor_info *A = dj_checkpoint_find(ad, na), *B = dj_checkpoint_find(ad, nb);
        if (!A || !B) continue;
        const int64_t r = A->shape[0], rows = t[i].rows, cols = t[i].cols;
        for (int64_t j = 0; j < rows; j++)
            for (int64_t k = 0; k < cols; k++) {
                double s = 0;
                for (int64_t q = 0; q < r; q++) {
                    s += (double)tensor_at(B, (size_t)(j * r + q)) * tensor_at(A, (size_t)(q * cols + k));
                }
                t[i].v[j * cols + k] = (float)((double)t[i].v[j * cols + k] + scale * s);
            }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_safetensors(p, t, n);
    for (size_t i = 0; i < n; i++) free(t[i].v);
    free(t);
    snprintf(p, sizeof p, "cp %s/config.json %s/config.json", base_dir, dir);
    CHECK(system(p) == 0);
    dj_checkpoint_close(ck);
    dj_checkpoint_close(ad);
    return dir;
}

static dj_model_t *load_fixture(dj_engine_t *e, const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    return m;
}

static uint32_t argmax(const float *l, uint32_t V) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < V; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

static const char *make_merged(const char *model, const char *adir, float scale, const char *name) {
    char base_dir[512];
    snprintf(base_dir, sizeof base_dir, "%s/models/%s", DJ_FIXTURES, model);
    return make_merged_from(base_dir, adir, scale, name);
}

/* ---- base + adapter == merged weights, every architecture ---- */

static void test_merged(const char *model, bool rslora) {
    char name[64], mname[64];
    snprintf(name, sizeof name, "ad-%s%s", model, rslora ? "-rs" : "");
    snprintf(mname, sizeof mname, "merged-%s%s", model, rslora ? "-rs" : "");
    const adapter_spec sp = {.r = 4, .alpha = 8, .rslora = rslora};
    char adir[512];
    snprintf(adir, sizeof adir, "%s", make_adapter(model, name, &sp));
    const float scale = rslora ? 8.0f / 2.0f : 8.0f / 4.0f;
    char mdir[512];
    snprintf(mdir, sizeof mdir, "%s", make_merged(model, adir, scale, mname));

    dj_engine_t *e = new_engine(false);
    dj_model_t *base = load_fixture(e, model), *merged = NULL;
    CHECK_OK(dj_model_load(e, mdir, &merged));
    dj_lora_t *ad = NULL;
    CHECK_OK(dj_lora_load(e, base, adir, &ad));
    if (!base || !merged || !ad) {
        dj_lora_release(e, ad);
        dj_model_release(e, base);
        dj_model_release(e, merged);
        dj_engine_free(e);
        return;
    }
    const uint32_t V = dj_model_get_config(base)->vocab_size;
    dj_session_t *sa = NULL, *sm = NULL, *sb = NULL;
    CHECK_OK(dj_session_new(e, base, 64, 0, &sa));
    CHECK_OK(dj_session_new(e, merged, 64, 0, &sm));
    CHECK_OK(dj_session_new(e, base, 64, 0, &sb));
    CHECK_OK(dj_session_set_lora(e, sa, ad, 1.0f));
    int32_t ids[12];
    for (int i = 0; i < 12; i++) ids[i] = (int32_t)(dj_test_rand() % V);
    float *la = malloc((size_t)12 * V * sizeof(float)), *lm = malloc((size_t)12 * V * sizeof(float)),
          *lb = malloc((size_t)12 * V * sizeof(float));
    /* prefill of 8 (every row's logits), then 4 decode steps */
    CHECK_OK(dj_session_step_all(e, sa, ids, 8, la));
    CHECK_OK(dj_session_step_all(e, sm, ids, 8, lm));
    CHECK_OK(dj_session_step_all(e, sb, ids, 8, lb));
    for (int t = 8; t < 12; t++) {
        CHECK_OK(dj_session_step(e, sa, &ids[t], 1, la + (size_t)t * V));
        CHECK_OK(dj_session_step(e, sm, &ids[t], 1, lm + (size_t)t * V));
        CHECK_OK(dj_session_step(e, sb, &ids[t], 1, lb + (size_t)t * V));
    }
    double worst = 0, moved = 0, amax = 0;
    int agree = 0;
    for (int t = 0; t < 12; t++) {
        const float *a = la + (size_t)t * V, *m = lm + (size_t)t * V, *b = lb + (size_t)t * V;
        for (uint32_t j = 0; j < V; j++) {
            const double d = fabs((double)a[j] - m[j]);
            worst = d > worst ? d : worst;
            moved = fabs((double)a[j] - b[j]) > moved ? fabs((double)a[j] - b[j]) : moved;
            amax = fabs((double)m[j]) > amax ? fabs((double)m[j]) : amax;
        }
        agree += argmax(a, V) == argmax(m, V);
    }
    CHECK_MSG(worst <= 1e-4 * (amax > 1 ? amax : 1), "%s%s: adapter vs merged differ by %g (logits up to %g)", model,
              rslora ? " rslora" : "", worst, amax);
    CHECK_MSG(agree == 12, "%s: greedy picks agree at %d of 12 positions", model, agree);
    CHECK_MSG(moved > 100 * worst && moved > 1e-3, "%s: the adapter moves the logits by only %g", model, moved);
    printf("  %-10s%s adapter vs merged %.3g, vs base %.3g\n", model, rslora ? " rslora" : "       ", worst, moved);
    free(la);
    free(lm);
    free(lb);
    dj_session_free(e, sa);
    dj_session_free(e, sm);
    dj_session_free(e, sb);
    dj_lora_release(e, ad);
    dj_model_release(e, base);
    dj_model_release(e, merged);
    dj_engine_free(e);
}

/* ---- two adapters stacked on one session == both merged ---- */

static void test_stacked(const char *model) {
    char n1[64], n2[64], m1[64], m2[64], d1[512], d2[512], md[512];
    snprintf(n1, sizeof n1, "st1-%s", model);
    snprintf(n2, sizeof n2, "st2-%s", model);
    snprintf(m1, sizeof m1, "stm1-%s", model);
    snprintf(m2, sizeof m2, "stm2-%s", model);
    const adapter_spec s1 = {.r = 4, .alpha = 8}, s2 = {.r = 2, .alpha = 4, .rslora = true, .bf16 = true};
    snprintf(d1, sizeof d1, "%s", make_adapter(model, n1, &s1));
    snprintf(d2, sizeof d2, "%s", make_adapter(model, n2, &s2));
    /* W + 1.0 * (8/4) B1 A1 + 0.5 * (4/sqrt 2) B2 A2 */
    snprintf(md, sizeof md, "%s", make_merged(model, d1, 2.0f, m1));
    snprintf(md, sizeof md, "%s", make_merged_from(md, d2, 0.5f * 4.0f / sqrtf(2.0f), m2));
    dj_engine_t *e = new_engine(false);
    dj_model_t *base = load_fixture(e, model), *merged = NULL;
    CHECK_OK(dj_model_load(e, md, &merged));
    dj_lora_t *a[2] = {NULL, NULL};
    if (base) {
        CHECK_OK(dj_lora_load(e, base, d1, &a[0]));
        CHECK_OK(dj_lora_load(e, base, d2, &a[1]));
    }
    if (base && merged && a[0] && a[1]) {
        const uint32_t V = dj_model_get_config(base)->vocab_size;
        dj_session_t *sa = NULL, *sm = NULL;
        CHECK_OK(dj_session_new(e, base, 64, 0, &sa));
        CHECK_OK(dj_session_new(e, merged, 64, 0, &sm));
        const float sc[2] = {1.0f, 0.5f};
        CHECK_OK(dj_session_set_loras(e, sa, a, sc, 2));
        int32_t ids[9];
        for (int i = 0; i < 9; i++) ids[i] = (int32_t)(dj_test_rand() % V);
        float *la = malloc((size_t)9 * V * sizeof(float)), *lm = malloc((size_t)9 * V * sizeof(float));
        CHECK_OK(dj_session_step_all(e, sa, ids, 8, la));
        CHECK_OK(dj_session_step_all(e, sm, ids, 8, lm));
        CHECK_OK(dj_session_step(e, sa, &ids[8], 1, la + (size_t)8 * V));
        CHECK_OK(dj_session_step(e, sm, &ids[8], 1, lm + (size_t)8 * V));
        double worst = 0, amax = 0;
        for (size_t j = 0; j < (size_t)9 * V; j++) {
            worst = fabs((double)la[j] - lm[j]) > worst ? fabs((double)la[j] - lm[j]) : worst;
            amax = fabs((double)lm[j]) > amax ? fabs((double)lm[j]) : amax;
        }
        CHECK_MSG(worst <= 1e-4 * (amax > 1 ? amax : 1), "%s stacked: %g from the merged model", model, worst);
        printf("  %-10s stacked adapter vs merged %.3g\n", model, worst);
        free(la);
        free(lm);
        dj_session_free(e, sa);
        dj_session_free(e, sm);
    }
    dj_lora_release(e, a[0]);
    dj_lora_release(e, a[1]);
    dj_model_release(e, base);
    dj_model_release(e, merged);
    dj_engine_free(e);
}

/* ---- a batch mixing adapters: each row what it gives alone ---- */

#define NB 5

static void test_batch(void) {
    dj_engine_t *e = new_engine(false);
    dj_model_t *m = load_fixture(e, "llama3");
    const adapter_spec s1 = {.r = 4, .alpha = 8}, s2 = {.r = 8, .alpha = 16, .rslora = true, .bf16 = true},
                       s3 = {.r = 2, .alpha = 4, .targets = "[\"q_proj\",\"v_proj\",\"down_proj\"]"};
    char d1[512], d2[512], d3[512];
    snprintf(d1, sizeof d1, "%s", make_adapter("llama3", "b1", &s1));
    snprintf(d2, sizeof d2, "%s", make_adapter("llama3", "b2", &s2));
    snprintf(d3, sizeof d3, "%s", make_adapter("llama3", "b3", &s3));
    dj_lora_t *a[3] = {NULL, NULL, NULL};
    CHECK_OK(dj_lora_load(e, m, d1, &a[0]));
    CHECK_OK(dj_lora_load(e, m, d2, &a[1]));
    CHECK_OK(dj_lora_load(e, m, d3, &a[2]));
    if (!m || !a[0] || !a[1] || !a[2]) goto out;
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    /* the rows: adapter 1, the bare base, adapter 2, adapter 3 at half scale, adapters 1 and 3 stacked */
    dj_lora_t *const use[NB] = {a[0], NULL, a[1], a[2], a[0]};
    const float sc[NB] = {1.0f, 1.0f, 1.0f, 0.5f, 1.0f};
    dj_lora_t *stack2[2] = {a[0], a[2]};
    dj_session_t *bs[NB], *as[NB];
    int32_t prompt[NB][6];
    for (int i = 0; i < NB; i++) {
        CHECK_OK(dj_session_new(e, m, 64, 0, &bs[i]));
        CHECK_OK(dj_session_new(e, m, 64, 0, &as[i]));
        if (i == NB - 1) {
            CHECK_OK(dj_session_set_loras(e, bs[i], stack2, NULL, 2));
            CHECK_OK(dj_session_set_loras(e, as[i], stack2, NULL, 2));
        } else if (use[i]) {
            CHECK_OK(dj_session_set_lora(e, bs[i], use[i], sc[i]));
            CHECK_OK(dj_session_set_lora(e, as[i], use[i], sc[i]));
        }
        for (int t = 0; t < 6; t++) prompt[i][t] = (int32_t)(dj_test_rand() % V);
        CHECK_OK(dj_session_step(e, bs[i], prompt[i], 6, NULL));
        CHECK_OK(dj_session_step(e, as[i], prompt[i], 6, NULL));
    }
    CHECK(dj_lora_refcount(a[0]) == 5 && dj_lora_refcount(a[2]) == 5);
    float *lb = malloc((size_t)NB * V * sizeof(float)), *la = malloc((size_t)V * sizeof(float));
    int32_t ids[NB];
    for (int i = 0; i < NB; i++) ids[i] = prompt[i][5];
    int same = 0, rows = 0, differ = 0;
    for (int step = 0; step < 4; step++) {
        CHECK_OK(dj_engine_step_batch(e, bs, ids, NB, lb, NULL, NULL));
        for (int i = 0; i < NB; i++) {
            CHECK_OK(dj_session_step(e, as[i], &ids[i], 1, la));
            same += memcmp(la, lb + (size_t)i * V, (size_t)V * sizeof(float)) == 0;
            rows++;
        }
        differ += memcmp(lb, lb + (size_t)1 * V, (size_t)V * sizeof(float)) != 0;
        for (int i = 0; i < NB; i++) ids[i] = (int32_t)argmax(lb + (size_t)i * V, V);
    }
    CHECK_MSG(same == rows, "%d of %d batch rows bit-identical to the session alone", same, rows);
    CHECK(differ == 4);
    /* a mixed step: prompt chunks of adapted sessions beside decode rows */
    {
        dj_session_t *mx[3], *al[3];
        dj_lora_t *const mu[3] = {a[1], NULL, a[2]};
        const uint32_t nt[3] = {3, 1, 4};
        int32_t mid[8];
        for (int t = 0; t < 8; t++) mid[t] = (int32_t)(dj_test_rand() % V);
        dj_sampler_params gp;
        memset(&gp, 0, sizeof gp);
        gp.top_p = 1.0f;
        dj_sampler_t *smp[3];
        int32_t next[3], alone[3];
        for (int i = 0; i < 3; i++) {
            CHECK_OK(dj_session_new(e, m, 64, 0, &mx[i]));
            CHECK_OK(dj_session_new(e, m, 64, 0, &al[i]));
            if (mu[i]) {
                CHECK_OK(dj_session_set_lora(e, mx[i], mu[i], 1.0f));
                CHECK_OK(dj_session_set_lora(e, al[i], mu[i], 1.0f));
            }
            CHECK_OK(dj_session_step(e, mx[i], prompt[i], 6, NULL));
            CHECK_OK(dj_session_step(e, al[i], prompt[i], 6, NULL));
            CHECK_OK(dj_sampler_new(&gp, V, &smp[i]));
        }
        CHECK_OK(dj_engine_step_batch_samplers(e, mx, nt, mid, 3, smp, next));
        uint32_t off = 0;
        float *ll = malloc((size_t)4 * V * sizeof(float));
        for (int i = 0; i < 3; i++) {
            CHECK_OK(dj_session_step_all(e, al[i], mid + off, nt[i], ll));
            alone[i] = (int32_t)argmax(ll + (size_t)(nt[i] - 1) * V, V);
            off += nt[i];
            CHECK_MSG(next[i] == alone[i], "mixed step row %d picked %d, alone %d", i, next[i], alone[i]);
        }
        free(ll);
        for (int i = 0; i < 3; i++) {
            dj_sampler_free(smp[i]);
            dj_session_free(e, mx[i]);
            dj_session_free(e, al[i]);
        }
    }
    free(lb);
    free(la);
    for (int i = 0; i < NB; i++) {
        dj_session_free(e, bs[i]);
        dj_session_free(e, as[i]);
    }
    CHECK(dj_lora_refcount(a[0]) == 1 && dj_lora_refcount(a[1]) == 1 && dj_lora_refcount(a[2]) == 1);
out:
    for (int i = 0; i < 3; i++) dj_lora_release(e, a[i]);
    dj_model_release(e, m);
    dj_engine_free(e);
}

/* ---- the prefix cache keyed by adapter ---- */

static void test_prefix(void) {
    dj_engine_t *e = new_engine(true);
    dj_model_t *m = load_fixture(e, "llama3");
    const adapter_spec s1 = {.r = 4, .alpha = 8}, s2 = {.r = 4, .alpha = 8};
    char d1[512], d2[512];
    snprintf(d1, sizeof d1, "%s", make_adapter("llama3", "p1", &s1));
    snprintf(d2, sizeof d2, "%s", make_adapter("llama3", "p2", &s2));
    dj_lora_t *a1 = NULL, *a2 = NULL;
    CHECK_OK(dj_lora_load(e, m, d1, &a1));
    CHECK_OK(dj_lora_load(e, m, d2, &a2));
    if (!m || !a1 || !a2) goto out;
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    int32_t ids[60];
    for (int t = 0; t < 60; t++) ids[t] = (int32_t)(dj_test_rand() % V);
    float *first = malloc((size_t)V * sizeof(float)), *again = malloc((size_t)V * sizeof(float));
    dj_session_t *s0 = NULL;
    CHECK_OK(dj_session_new(e, m, 128, 0, &s0));
    CHECK_OK(dj_session_set_lora(e, s0, a1, 1.0f));
    CHECK_OK(dj_session_step(e, s0, ids, 60, first));
    CHECK_ST(dj_session_set_lora(e, s0, a2, 1.0f), DJ_EBUSY); /* it holds a1's KV */
    /* who may reuse s0's blocks: only a1 at scale 1 */
    dj_lora_t *const who[5] = {a2, NULL, a1, a1, a1};
    const float sc[5] = {1.0f, 1.0f, 0.5f, 1.0f, 1.0f};
    for (int k = 0; k < 5; k++) {
        dj_session_t *s = NULL;
        CHECK_OK(dj_session_new(e, m, 128, 0, &s));
        if (who[k]) CHECK_OK(dj_session_set_lora(e, s, who[k], sc[k]));
        uint32_t mapped = 99;
        CHECK_OK(dj_session_map_prefix(e, s, ids, 60, &mapped));
        if (k < 3) {
            CHECK_MSG(mapped == 0, "case %d: %u ids of another adapter's KV mapped", k, mapped);
        } else {
            CHECK_MSG(mapped >= 16, "case %d: only %u ids mapped", k, mapped);
            CHECK_OK(dj_session_step(e, s, ids + mapped, 60 - mapped, again));
            CHECK_MSG(memcmp(first, again, (size_t)V * sizeof(float)) == 0, "case %d: logits after %u cached ids differ",
                      k, mapped);
        }
        dj_session_free(e, s);
    }
    dj_session_free(e, s0);
    free(first);
    free(again);
out:
    dj_lora_release(e, a1);
    dj_lora_release(e, a2);
    dj_model_release(e, m);
    dj_engine_free(e);
}

/* ---- references, the cache of loaded adapters, eviction ---- */

static void test_refs(void) {
    dj_engine_t *e = new_engine(false);
    dj_model_t *m = load_fixture(e, "llama3");
    const adapter_spec sp = {.r = 4, .alpha = 8};
    char d[512];
    snprintf(d, sizeof d, "%s", make_adapter("llama3", "r1", &sp));
    dj_lora_t *a = NULL, *b = NULL;
    CHECK_OK(dj_lora_load(e, m, d, &a));
    CHECK_OK(dj_lora_load(e, m, d, &b));
    CHECK(a && a == b && dj_lora_refcount(a) == 2); /* one copy, shared */
    if (!a || !m) goto out;
    CHECK(strcmp(dj_lora_name(a), "r1") == 0 && dj_lora_get_config(a)->r == 4);
    CHECK(dj_lora_base_fingerprint(a) == dj_model_fingerprint(m));
    dj_session_t *s = NULL;
    CHECK_OK(dj_session_new(e, m, 64, 0, &s));
    CHECK_ST(dj_session_set_lora(e, s, a, NAN), DJ_EINVAL);
    CHECK(dj_lora_refcount(a) == 2);
    CHECK_OK(dj_session_set_lora(e, s, a, 1.0f));
    CHECK(dj_session_lora(s) == a && dj_lora_refcount(a) == 3);
    dj_lora_t *two[2] = {a, a}; /* the same adapter stacked twice: two references */
    CHECK_OK(dj_session_set_loras(e, s, two, NULL, 2));
    CHECK(dj_session_lora_count(s) == 2 && dj_lora_refcount(a) == 4);
    CHECK_OK(dj_session_set_lora(e, s, a, 1.0f));
    CHECK(dj_session_lora_count(s) == 1 && dj_lora_refcount(a) == 3);
    CHECK_OK(dj_session_set_lora(e, s, NULL, 1.0f)); /* back to the bare base: its reference dropped */
    CHECK(dj_session_lora(s) == NULL && dj_lora_refcount(a) == 2);
    CHECK_OK(dj_session_set_lora(e, s, a, 1.0f));
    dj_session_free(e, s);
    CHECK(dj_lora_refcount(a) == 2);
    dj_vmu_stats vs;
    dj_vmu_get_stats(dj_engine_vmu(e), &vs);
    const size_t models = vs.n_models, pinned = vs.text_pinned;
    CHECK_ST(dj_vmu_model_evict(dj_engine_vmu(e), a->region), DJ_EBUSY); /* in use */
    dj_lora_release(e, b);
    dj_lora_release(e, a);
    dj_vmu_get_stats(dj_engine_vmu(e), &vs);
    CHECK(vs.n_models == models && vs.text_pinned < pinned); /* cached at refcount 0, not pinned */
    CHECK_OK(dj_lora_load(e, m, d, &b));                      /* from the cache */
    CHECK(b == a && dj_lora_refcount(b) == 1);
    dj_lora_release(e, b);
    CHECK_OK(dj_vmu_model_evict(dj_engine_vmu(e), a->region)); /* evictable at 0 */
    dj_vmu_get_stats(dj_engine_vmu(e), &vs);
    CHECK(vs.n_models == models - 1);
    a = NULL;
    CHECK_OK(dj_lora_load(e, m, d, &a)); /* loads again */
    /* known by its files' identity: while it is in the text segment, a load reads no tensor (the file's
     * bytes are overwritten here, its size and mtime kept); evicted, the files are read again */
    char tf[600];
    snprintf(tf, sizeof tf, "%s/adapter_model.safetensors", d);
    struct stat sb;
    CHECK(stat(tf, &sb) == 0);
    FILE *f = fopen(tf, "r+b");
    CHECK(f != NULL);
    if (f) {
        for (off_t i = 0; i < sb.st_size; i++) fputc('x', f);
        fclose(f);
    }
    const struct timespec times[2] = {sb.st_atim, sb.st_mtim};
    CHECK(utimensat(AT_FDCWD, tf, times, 0) == 0);
    dj_lora_t *again = NULL;
    CHECK_OK(dj_lora_load(e, m, d, &again));
    CHECK(again == a && dj_lora_refcount(a) == 2);
    dj_lora_release(e, again);
    dj_lora_release(e, a);
    CHECK_OK(dj_vmu_model_evict(dj_engine_vmu(e), a->region));
    again = NULL;
    CHECK_ST(dj_lora_load(e, m, d, &again), DJ_EFORMAT); /* read: the garbage is seen */
    CHECK(again == NULL);
out:
    dj_model_release(e, m);
    dj_engine_free(e);
}

/* ---- refusals ---- */

static void expect_load(dj_engine_t *e, dj_model_t *m, const char *model, const char *name, const adapter_spec *sp,
                        dj_status want, const char *says, const char *says2) {
    char d[512];
    snprintf(d, sizeof d, "%s", make_adapter(model, name, sp));
    dj_lora_t *a = NULL;
    const dj_status st = dj_lora_load(e, m, d, &a);
    CHECK_MSG(st == want, "%s: got %s (%s), want %s", name, dj_status_name(st), dj_last_error(), dj_status_name(want));
    if (st != DJ_OK) {
        CHECK_MSG(strstr(dj_last_error(), says) != NULL, "%s: '%s' does not say '%s'", name, dj_last_error(), says);
        if (says2) CHECK_MSG(strstr(dj_last_error(), says2) != NULL, "%s: '%s' does not say '%s'", name, dj_last_error(), says2);
    }
    CHECK(st == DJ_OK ? a != NULL : a == NULL);
    dj_lora_release(e, a);
}

static void expect_config(const char *json, dj_status want, const char *says) {
    dj_lora_config c;
    const dj_status st = dj_lora_config_parse(json, strlen(json), &c);
    CHECK_MSG(st == want, "%s: got %s (%s)", json, dj_status_name(st), dj_last_error());
    if (st != DJ_OK && says) CHECK_MSG(strstr(dj_last_error(), says) != NULL, "'%s' does not say '%s'", dj_last_error(), says);
}

static void test_refusals(void) {
    /* the config alone */
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":16,\"target_modules\":[\"q_proj\"]}", DJ_OK, NULL);
    dj_lora_config c;
    const char *ok = "{\"peft_type\":\"LORA\",\"r\":16,\"lora_alpha\":32,\"use_rslora\":true,"
                     "\"target_modules\":[\"model.layers.0.self_attn.q_proj\",\"gate_up_proj\"],"
                     "\"base_model_name_or_path\":null,\"rank_pattern\":{},\"layers_to_transform\":null}";
    CHECK_OK(dj_lora_config_parse(ok, strlen(ok), &c));
    CHECK(c.r == 16 && c.rslora && fabsf(c.scale - 8.0f) < 1e-6f && c.targets == (DJ_LORA_Q | DJ_LORA_GATE_UP) &&
          c.base[0] == '\0');
    expect_config("{\"peft_type\":\"PREFIX_TUNING\",\"r\":8}", DJ_EUNSUPPORTED, "PREFIX_TUNING");
    expect_config("{\"r\":8,\"target_modules\":[\"q_proj\"]}", DJ_EFORMAT, "peft_type");
    expect_config("{\"peft_type\":\"LORA\",\"r\":0,\"target_modules\":[\"q_proj\"]}", DJ_ERANGE, "r must");
    expect_config("{\"peft_type\":\"LORA\",\"r\":100000,\"target_modules\":[\"q_proj\"]}", DJ_ERANGE, "100000");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8.5,\"target_modules\":[\"q_proj\"]}", DJ_ERANGE, "r must");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"lora_alpha\":-1,\"target_modules\":[\"q_proj\"]}", DJ_ERANGE,
                  "lora_alpha");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[\"q_proj\"],\"modules_to_save\":[\"lm_head\"]}",
                  DJ_EUNSUPPORTED, "modules_to_save");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[\"q_proj\"],\"use_dora\":true}", DJ_EUNSUPPORTED,
                  "use_dora");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[\"q_proj\"],\"fan_in_fan_out\":true}",
                  DJ_EUNSUPPORTED, "fan_in_fan_out");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[\"q_proj\"],\"rank_pattern\":{\"q_proj\":4}}",
                  DJ_EUNSUPPORTED, "rank_pattern");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[\"q_proj\"],\"layers_to_transform\":[0]}",
                  DJ_EUNSUPPORTED, "layers_to_transform");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[\"q_proj\"],\"bias\":\"all\"}", DJ_EUNSUPPORTED,
                  "bias");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":\"all-linear\"}", DJ_EUNSUPPORTED, "all-linear");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[]}", DJ_EFORMAT, "target_modules");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[\"lm_head\"]}", DJ_EUNSUPPORTED, "lm_head");
    expect_config("{\"peft_type\":\"LORA\",\"r\":8,\"target_modules\":[\"q_proj\"],\"use_rslora\":\"yes\"}", DJ_EFORMAT,
                  "use_rslora");
    expect_config("[1,2]", DJ_EFORMAT, "object");
    expect_config("{\"peft_type\":", DJ_EFORMAT, "object");

    /* against a base */
    dj_engine_t *e = new_engine(false);
    dj_model_t *m = load_fixture(e, "llama3"), *q = load_fixture(e, "qwen2");
    if (!m || !q) goto out;
    adapter_spec sp = {.r = 4, .alpha = 8};
    expect_load(e, m, "llama3", "fine", &sp, DJ_OK, "", NULL);
    sp.base = "org/llama3";
    expect_load(e, m, "llama3", "fine-org", &sp, DJ_OK, "", NULL);
    sp.base = "meta-llama/Llama-3.1-8B";
    expect_load(e, m, "llama3", "other-base", &sp, DJ_EINVAL, "meta-llama/Llama-3.1-8B", "\"llama3\"");
    sp.base = NULL;
    expect_load(e, m, "qwen2", "qwen-shapes", &sp, DJ_EINVAL, "\"qwen2\"", "llama3"); /* its config names qwen2 */
    sp.base = "llama3";
    expect_load(e, m, "llama2", "llama2-shapes", &sp, DJ_EFORMAT, "k_proj.lora_", "llama3"); /* renamed: shapes */
    sp.base = NULL;
    sp.r = 100;
    expect_load(e, m, "llama3", "rank-100", &sp, DJ_ERANGE, "rank 100", NULL);
    sp.r = 4;
    sp.nan_in = "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight";
    expect_load(e, m, "llama3", "nan", &sp, DJ_EINVAL, "layers.1.self_attn.v_proj.lora_A", "finite");
    sp.nan_in = NULL;
    sp.targets = "[\"q_proj\",\"qkv_proj\"]";
    expect_load(e, m, "llama3", "no-qkv", &sp, DJ_ENOTFOUND, "qkv_proj", "llama3");
    sp.targets = "[\"q_proj\",\"embed_tokens\"]";
    expect_load(e, m, "llama3", "embed", &sp, DJ_EUNSUPPORTED, "embed_tokens", NULL);
    sp.targets = NULL;
    sp.skip = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight";
    expect_load(e, m, "llama3", "missing", &sp, DJ_ENOTFOUND, "layers.1.mlp.down_proj.lora_B", NULL);
    sp.skip = NULL;
    sp.bad_rows = 1;
    expect_load(e, m, "llama3", "rows", &sp, DJ_EFORMAT, "lora_B", NULL);
    sp.bad_rows = 0;
    sp.extra_tensor = "base_model.model.lm_head.lora_A.weight";
    expect_load(e, m, "llama3", "extra", &sp, DJ_EUNSUPPORTED, "lm_head.lora_A", NULL);
    sp.extra_tensor = NULL;
    sp.extra = ",\"use_dora\":true";
    expect_load(e, m, "llama3", "dora", &sp, DJ_EUNSUPPORTED, "use_dora", NULL);
    sp.extra = NULL;
    {
        dj_lora_t *a = NULL;
        CHECK_ST(dj_lora_load(e, m, "/nonexistent/adapter", &a), DJ_ENOTFOUND);
        char d[512];
        snprintf(d, sizeof d, "%s/fine", g_tmp);
        char p[600];
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", d);
        FILE *f = fopen(p, "wb");
        if (f) {
            fputs("short", f);
            fclose(f);
        }
        CHECK_ST(dj_lora_load(e, m, d, &a), DJ_EFORMAT);
        CHECK(a == NULL);
    }
    {   /* an adapter of qwen2 on a session of llama3 */
        dj_lora_t *qa = NULL;
        char d[512];
        adapter_spec qs = {.r = 2, .alpha = 2};
        snprintf(d, sizeof d, "%s", make_adapter("qwen2", "qa", &qs));
        CHECK_OK(dj_lora_load(e, q, d, &qa));
        dj_session_t *s = NULL;
        CHECK_OK(dj_session_new(e, m, 32, 0, &s));
        CHECK_ST(dj_session_set_lora(e, s, qa, 1.0f), DJ_EINVAL);
        dj_lora_t *five[5] = {qa, qa, qa, qa, qa};
        CHECK_ST(dj_session_set_loras(e, s, five, NULL, 5), DJ_EINVAL); /* past DJ_LORA_STACK_MAX */
        dj_session_free(e, s);
        dj_lora_release(e, qa);
    }
out:
    dj_model_release(e, m);
    dj_model_release(e, q);
    dj_engine_free(e);
    /* a quantized base: not yet */
    e = new_engine(false);
    m = load_fixture(e, "llama3_fp8");
    if (m) {
        adapter_spec fs = {.r = 2, .alpha = 2};
        expect_load(e, m, "llama3_fp8", "fp8", &fs, DJ_EUNSUPPORTED, "quantized", NULL);
    }
    dj_model_release(e, m);
    dj_engine_free(e);
}

int main(void) {
    dj_test_seeds();
    snprintf(g_tmp, sizeof g_tmp, "/tmp/djinn-lora-XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    static const char *const models[] = {"llama3", "tinyllama", "llama2", "mistral", "qwen2", "qwen3", "gemma2",
                                         "gemma3", "phi3",   "mixtral"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) test_merged(models[i], false);
    test_merged("llama3", true);
    test_stacked("llama3");
    test_stacked("phi3");
    test_batch();
    test_prefix();
    test_refs();
    test_refusals();
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", g_tmp);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    return dj_test_finish("test_lora");
}
