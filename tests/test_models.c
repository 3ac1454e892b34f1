/* test_models.c: every fixture checkpoint end to end on the CPU engine -
 * logits against transformers' fp32 reference (1e-4 relative), 24 greedy
 * tokens identical, chunked prefill equal to one-shot, weights shared between
 * loads, and the VMU back to its baseline after sessions close; the FP8
 * fixtures (each stored FP8 layout) likewise, and FP8 configs that do not
 * describe their tensors refused with the reason. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "djinn/engine.h"
#include "djinn/sampler.h"
#include "djinn/tokenizer.h"
#include "fixture_ref.h"
#include "testutil.h"

static dj_engine_t *new_engine_kv(size_t kib, uint32_t max_step, const char *kv_dtype) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.kv_dtype = kv_dtype;
    dj_vmu_config_default(&ec.vmu, kib << 10);
    ec.vmu.page_bytes = 4096; /* small pages: contexts span many pages */
    ec.max_step_tokens = max_step;
    dj_engine_t *e = NULL;
    dj_status st = dj_engine_new(&ec, &e);
    CHECK_OK(st);
    return e;
}

static dj_engine_t *new_engine(size_t kib, uint32_t max_step) { return new_engine_kv(kib, max_step, NULL); }

/* f8 K/V pages (--kv-dtype fp8) against f32 pages: a step's logits within
 * KV_F8_TOL relative L2 (measured on 2026-11-26: 0.006-0.25 over the tiny
 * random-weight fixtures' steps, whose logits move ~16x their bf16 yardstick's
 * 0.01-0.04 - four mantissa bits fewer -, the trained demo model 0.026;
 * docs/internals.md, "FP8 K/V"). A wrong exponent or a misplaced row gives
 * ~1 or NaN. A MoE's routing is discrete: a step whose expert choice flips
 * departs by O(1) (mixtral: 0.67 once), so for MoE models only the prompt
 * step is bounded and the rest printed. */
#define KV_F8_TOL 0.35

/* The fixture on two engines, f32 and f8 K/V, fed the prompt and then the
 * reference's greedy tokens: every step's logits within KV_F8_TOL of the f32
 * engine's (which check_model holds to transformers' within 1e-4); prints the
 * largest error and how many greedy tokens the f8 engine would pick otherwise. */
static void check_kv_f8(const char *name, const char *dir, const char *ref_path) {
    ref r;
    memset(&r, 0, sizeof r);
    CHECK_MSG(load_ref_file(ref_path, &r) == 0, "%s: cannot read %s", name, ref_path);
    if (!r.last) return;
    dj_engine_t *e[2] = {new_engine_kv(64 << 10, 512, NULL), new_engine_kv(64 << 10, 512, "fp8")};
    dj_model_t *m[2] = {NULL, NULL};
    dj_session_t *s[2] = {NULL, NULL};
    float *logits[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        CHECK_OK(dj_model_load(e[k], dir, &m[k]));
        if (!m[k]) goto done;
        logits[k] = malloc(r.vocab * sizeof(float));
        CHECK_OK(dj_session_new(e[k], m[k], DJ_FIXTURE_CTX, 0, &s[k]));
        if (!s[k]) goto done;
    }
    double worst = 0.0;
    int differ = 0, bad = 0;
    for (int i = -1; i < r.n_greedy; i++) {
        for (int k = 0; k < 2; k++) {
            const int32_t *ids = i < 0 ? r.prompt : &r.greedy[i];
            CHECK_OK(dj_session_step(e[k], s[k], ids, i < 0 ? (uint32_t)r.n_prompt : 1, logits[k]));
        }
        const double err = rel_l2(logits[1], logits[0], r.vocab);
        if (i < 0 || dj_model_get_config(m[0])->n_experts == 0) bad += !(err <= KV_F8_TOL);
        if (err > worst) worst = err;
        differ += dj_argmax(logits[1], r.vocab) != dj_argmax(logits[0], r.vocab);
    }
    CHECK_MSG(bad == 0, "%s, f8 K/V: %d of %d steps' logits beyond %.2g of f32 K/V's (worst %.3g)",
              name, bad, r.n_greedy + 1, KV_F8_TOL, worst);
    printf("%s, f8 K/V: logits within %.2e (relative L2) of f32 K/V's over %d steps; %d of %d greedy tokens differ\n", name, worst,
           r.n_greedy + 1, differ, r.n_greedy + 1);
done:
    for (int k = 0; k < 2; k++) {
        if (s[k]) dj_session_free(e[k], s[k]);
        if (m[k]) dj_model_release(e[k], m[k]);
        dj_engine_free(e[k]);
        free(logits[k]);
    }
    ref_free(&r);
}

static void check_model(const char *name, const char *dir, const char *ref_path) {
    ref r;
    memset(&r, 0, sizeof r);
    CHECK_MSG(load_ref_file(ref_path, &r) == 0, "%s: cannot read %s", name, ref_path);
    if (!r.last) return;
    if (r.prompt_text) { /* our tokenizer gives the prompt ids transformers used */
        char tpath[600];
        snprintf(tpath, sizeof tpath, "%s/tokenizer.json", dir);
        dj_tokenizer_t *tok = NULL;
        CHECK_OK(dj_tokenizer_load(tpath, &tok));
        int32_t *ids = NULL;
        size_t n = 0;
        if (tok) CHECK_OK(dj_tokenizer_encode(tok, r.prompt_text, strlen(r.prompt_text), true, &ids, &n));
        CHECK_MSG(n == (size_t)r.n_prompt && ids && !memcmp(ids, r.prompt, n * sizeof *ids),
                  "%s: prompt text encodes to other ids than transformers used", name);
        free(ids);
        dj_tokenizer_free(tok);
    }

    dj_engine_t *e = new_engine(64 << 10, 512);
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    if (!m) {
        dj_engine_free(e);
        return;
    }
    const dj_model_config *c = dj_model_get_config(m);
    CHECK((int)c->vocab_size == r.vocab);
    dj_vmu_stats base;
    dj_vmu_get_stats(dj_engine_vmu(e), &base);

    /* one-shot prefill, then greedy decode */
    float *logits = malloc(c->vocab_size * sizeof *logits);
    for (uint32_t i = 0; i < c->vocab_size; i++) logits[i] = NAN; /* poisoned */
    dj_session_t *s = NULL;
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s));
    CHECK_OK(dj_session_step(e, s, r.prompt, (uint32_t)r.n_prompt, logits));
    double err = rel_err(logits, r.last, r.vocab);
    CHECK_MSG(err <= 1e-4, "%s: prompt logits relative error %.3g > 1e-4", name, err);
    printf("%s: last-position logits rel err %.2e\n", name, err);
    int32_t got[64];
    int same = 1;
    for (int i = 0; i < r.n_greedy; i++) {
        got[i] = dj_argmax(logits, c->vocab_size);
        if (got[i] != r.greedy[i]) same = 0;
        CHECK_OK(dj_session_step(e, s, &got[i], 1, logits));
    }
    CHECK_MSG(same, "%s: greedy tokens differ from transformers", name);
    err = rel_err(logits, r.final, r.vocab);
    CHECK_MSG(err <= 1e-4, "%s: logits after %d decode steps: relative error %.3g > 1e-4", name, r.n_greedy, err);
    printf("%s: after %d greedy steps rel err %.2e, tokens %s\n", name, r.n_greedy, err, same ? "identical" : "DIFFER");
    CHECK(dj_session_pos(s) == (uint32_t)(r.n_prompt + r.n_greedy));

    /* A second session fed prompt+greedy in chunks of 5 (max_step 8 engine
     * would plan buckets; here: several steps) reaches the same logits. */
    dj_session_t *s2 = NULL;
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s2));
    int32_t all[128];
    memcpy(all, r.prompt, (size_t)r.n_prompt * sizeof *all);
    memcpy(all + r.n_prompt, r.greedy, (size_t)r.n_greedy * sizeof *all);
    const int total = r.n_prompt + r.n_greedy;
    for (int off = 0; off < total; off += 5) {
        int k = total - off < 5 ? total - off : 5;
        CHECK_OK(dj_session_step(e, s2, all + off, (uint32_t)k, logits));
    }
    err = rel_err(logits, r.final, r.vocab);
    CHECK_MSG(err <= 1e-4, "%s: chunked prefill rel err %.3g", name, err);

    /* every position's logits in one call: the prompt's last row and the
     * sequence's last row are transformers' two references */
    dj_session_t *s3 = NULL;
    float *every = malloc((size_t)total * c->vocab_size * sizeof *every);
    for (size_t i = 0; i < (size_t)total * c->vocab_size; i++) every[i] = NAN; /* poisoned */
    CHECK_OK(dj_session_new(e, m, DJ_FIXTURE_CTX, 0, &s3));
    CHECK_OK(dj_session_step_all(e, s3, all, (uint32_t)total, every));
    err = rel_err(every + (size_t)(r.n_prompt - 1) * c->vocab_size, r.last, r.vocab);
    CHECK_MSG(err <= 1e-4, "%s: all-positions logits, prompt row: rel err %.3g", name, err);
    err = rel_err(every + (size_t)(total - 1) * c->vocab_size, r.final, r.vocab);
    CHECK_MSG(err <= 1e-4, "%s: all-positions logits, last row: rel err %.3g", name, err);
    dj_session_free(e, s3);
    free(every);

    /* weights are shared: a second load costs no bytes and raises the refcount */
    dj_vmu_stats before, after;
    dj_vmu_get_stats(dj_engine_vmu(e), &before);
    dj_model_t *m2 = NULL;
    CHECK_OK(dj_model_load(e, dir, &m2));
    dj_vmu_get_stats(dj_engine_vmu(e), &after);
    CHECK(m2 == m);
    CHECK(after.text.used == before.text.used);
    dj_model_release(e, m2);

    /* bad ids and context overflow are errors that change nothing */
    int32_t bad = (int32_t)c->vocab_size;
    uint32_t pos = dj_session_pos(s);
    CHECK_ST(dj_session_step(e, s, &bad, 1, logits), DJ_ERANGE);
    CHECK(dj_session_pos(s) == pos);
    int32_t many[128] = {0};
    CHECK_ST(dj_session_step(e, s, many, 128, logits), DJ_ERANGE);

    dj_session_free(e, s);
    dj_session_free(e, s2);
    dj_vmu_get_stats(dj_engine_vmu(e), &after);
    /* what stays is the prefix cache's full blocks, none mapped */
    dj_prefix_stats ps;
    dj_engine_prefix_stats(e, &ps);
    const size_t cached = ps.pages * dj_vmu_page_bytes(dj_engine_vmu(e));
    CHECK_MSG(after.data.used == base.data.used + cached && ps.pages == ps.pages_unreferenced &&
              after.n_sessions == base.n_sessions,
              "%s: data segment %zu bytes after closing sessions, %zu before, %zu in the prefix cache", name,
              after.data.used, base.data.used, cached);
    CHECK(after.stack.used == base.stack.used);
    dj_model_release(e, m);
    dj_engine_free(e);
    free(logits);
    ref_free(&r);
}

static void check_fixture(const char *name) {
    char dir[512], refp[600];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    snprintf(refp, sizeof refp, "%s/reference.json", dir);
    check_model(name, dir, refp);
    check_kv_f8(name, dir, refp);
}

/* A prefill larger than the largest step is split into chunks: same logits. */
static void check_small_steps(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama3", DJ_FIXTURES);
    ref r;
    memset(&r, 0, sizeof r);
    if (load_ref(dir, &r) != 0) return;
    dj_engine_t *e = new_engine(64 << 10, 4); /* max 4 tokens per step */
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    if (m) {
        dj_session_t *s = NULL;
        float *logits = malloc((size_t)r.vocab * sizeof *logits);
        CHECK_OK(dj_session_new(e, m, 64, 0, &s));
        CHECK_OK(dj_session_step(e, s, r.prompt, (uint32_t)r.n_prompt, logits));
        double err = rel_err(logits, r.last, r.vocab);
        CHECK_MSG(err <= 1e-4, "chunked (4) prefill rel err %.3g", err);
        dj_session_free(e, s);
        /* every position's logits, in chunks of 4: the last row is the reference */
        float *every = malloc((size_t)r.n_prompt * r.vocab * sizeof *every);
        s = NULL;
        CHECK_OK(dj_session_new(e, m, 64, 0, &s));
        CHECK_OK(dj_session_step_all(e, s, r.prompt, (uint32_t)r.n_prompt, every));
        err = rel_err(every + (size_t)(r.n_prompt - 1) * r.vocab, r.last, r.vocab);
        CHECK_MSG(err <= 1e-4, "chunked (4) all-positions logits rel err %.3g", err);
        free(every);
        dj_session_free(e, s);
        dj_model_release(e, m);
        free(logits);
    }
    dj_engine_free(e);
    ref_free(&r);
}

/* longrope's factors by session (dj_session_rope_long): phi3_longctx
 * (original_max_position_embeddings 32) in a session of 64 positions takes the
 * long ones (its reference, check_fixture), in one of 32 - its default
 * context - the short ones; the two give other logits; a batched decode step
 * mixing both (a table per row) gives each session what it gets alone; and
 * the prefix cache maps a cached block only into a session of the same
 * factors (keys rotated otherwise are other keys). */
static void check_longrope_sessions(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/phi3_longctx", DJ_FIXTURES);
    ref r;
    memset(&r, 0, sizeof r);
    CHECK_MSG(load_ref(dir, &r) == 0, "phi3_longctx: no reference");
    dj_engine_t *e = new_engine(64 << 10, 512);
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    enum { P = 20, STEPS = 4 };
    dj_session_t *s[4] = {NULL, NULL, NULL, NULL}; /* long, short; then each again, stepped alone */
    const size_t vr = r.vocab > 0 ? (size_t)r.vocab : 1;
    float *lg = malloc(4 * vr * sizeof *lg), *batch = malloc(2 * vr * sizeof *batch);
    if (!m || r.n_prompt < P) goto done;
    const dj_model_config *c = dj_model_get_config(m);
    const size_t V = c->vocab_size;
    CHECK(dj_model_config_default_ctx(c) == 32);
    for (int k = 0; k < 4; k++) CHECK_OK(dj_session_new(e, m, k % 2 ? 32 : 64, 0, &s[k]));
    if (!s[0] || !s[1] || !s[2] || !s[3]) goto done;
    CHECK(dj_session_rope_long(s[0]) && !dj_session_rope_long(s[1]));
    for (int k = 0; k < 4; k++) {
        uint32_t mapped = 0;
        CHECK_OK(dj_session_map_prefix(e, s[k], r.prompt, P, &mapped));
        /* the first of each kind finds nothing of its own factors cached */
        CHECK_MSG(k < 2 ? mapped == 0 : mapped > 0, "session %d (%s factors): %u prompt tokens mapped", k,
                  k % 2 ? "short" : "long", mapped);
        CHECK_OK(dj_session_step(e, s[k], r.prompt + mapped, P - mapped, lg + (size_t)k * V));
    }
    double d = rel_l2(lg, lg + V, (int)V);
    CHECK_MSG(d > 1e-2, "long and short factors: logits %.3g apart", d);
    for (int k = 2; k < 4; k++) {
        d = rel_err(lg + (size_t)k * V, lg + (size_t)(k - 2) * V, (int)V);
        CHECK_MSG(d <= 1e-5, "session %d from the prefix cache: %.3g from its twin", k, d);
    }
    for (int t = 0; t < STEPS; t++) {
        int32_t ids[2];
        for (int k = 0; k < 2; k++) ids[k] = dj_argmax(lg + (size_t)k * V, (uint32_t)V);
        CHECK_OK(dj_engine_step_batch(e, s, ids, 2, batch, NULL, NULL));
        for (int k = 2; k < 4; k++) CHECK_OK(dj_session_step(e, s[k], &ids[k - 2], 1, lg + (size_t)k * V));
        for (int k = 0; k < 2; k++) {
            d = rel_err(batch + (size_t)k * V, lg + (size_t)(k + 2) * V, (int)V);
            CHECK_MSG(d <= 1e-5, "batched step %d, %s factors: %.3g from the session stepped alone", t,
                      k ? "short" : "long", d);
        }
        memcpy(lg, batch, 2 * V * sizeof *lg);
    }
    printf("phi3_longctx: long and short factors by session, batched together as alone\n");
done:
    for (int k = 0; k < 4; k++) dj_session_free(e, s[k]);
    if (m) dj_model_release(e, m);
    dj_engine_free(e);
    free(lg);
    free(batch);
    ref_free(&r);
}

/* A checkpoint whose fingerprint this process knows (check_fixture loaded it
 * in an engine since freed) is read in place (the CPU's default), or copied
 * in without a hashing pass: Phi-3's fused qkv_proj and gate_up_proj feed
 * their slots from row offsets of the stored tensors on both paths
 * (dropping the offset there fails this). */
static void check_known_copy(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    ref r;
    memset(&r, 0, sizeof r);
    if (load_ref(dir, &r) != 0) return;
    float *logits = malloc((size_t)r.vocab * sizeof *logits);
    for (int round = 0; round < 2; round++) { /* twice, a fresh engine each time: in place, then copied */
        if (round == 1) setenv("DJINN_WEIGHTS_IN_PLACE", "0", 1);
        dj_engine_t *e = new_engine(64 << 10, 512);
        dj_model_t *m = NULL;
        dj_session_t *s = NULL;
        CHECK_OK(dj_model_load(e, dir, &m));
        if (m) CHECK_OK(dj_session_new(e, m, 64, 0, &s));
        if (s) {
            CHECK_OK(dj_session_step(e, s, r.prompt, (uint32_t)r.n_prompt, logits));
            const double err = rel_err(logits, r.last, r.vocab);
            CHECK_MSG(err <= 1e-4, "%s, load %d: prompt logits rel err %.3g", name, round + 1, err);
            dj_session_free(e, s);
        }
        if (m) dj_model_release(e, m);
        dj_engine_free(e);
    }
    unsetenv("DJINN_WEIGHTS_IN_PLACE");
    free(logits);
    ref_free(&r);
}

/* Prefill logits of a fixed prompt with the model loaded into a fresh
 * engine of `kib` KiB; NULL (and the status in *st) when the load fails. */
static float *prompt_logits(const char *dir, size_t kib, dj_status *st, size_t *mapped) {
    dj_engine_t *e = new_engine(kib, 512);
    dj_model_t *m = NULL;
    float *logits = NULL;
    *st = dj_model_load(e, dir, &m);
    if (*st == DJ_OK) {
        dj_vmu_stats vs;
        dj_vmu_get_stats(dj_engine_vmu(e), &vs);
        *mapped = vs.text_mapped;
        const int32_t ids[] = {1, 5, 9, 23, 7, 2};
        dj_session_t *s = NULL;
        logits = malloc(dj_model_get_config(m)->vocab_size * sizeof *logits);
        CHECK_OK(dj_session_new(e, m, 64, 0, &s));
        if (s) CHECK_OK(dj_session_step(e, s, ids, 6, logits));
        dj_session_free(e, s);
        dj_model_release(e, m);
    }
    dj_engine_free(e);
    return logits;
}

/* On the CPU the weights are read in place from the mapped checkpoint: a
 * VMU with no room for them loads the model (their bytes counted as mapped)
 * and gives the bits of a copied load; copied ($DJINN_WEIGHTS_IN_PLACE=0),
 * a VMU too small for the weights fails at load with a message, no crash. */

static void check_too_small(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama2", DJ_FIXTURES);
    dj_status st;
    size_t mapped = 0, mapped_copy = 0;
    float *in_place = prompt_logits(dir, 512, &st, &mapped); /* 512 KiB: 586 KB of f32 weights exceed 60% */
    CHECK_OK(st);
    CHECK_MSG(mapped > 512 << 10, "weights in place: %zu bytes mapped", mapped);
    setenv("DJINN_WEIGHTS_IN_PLACE", "0", 1);
    float *none = prompt_logits(dir, 512, &st, &mapped_copy);
    CHECK(st == DJ_ENOSPC && !none && strstr(dj_last_error(), "needs") != NULL);
    float *copied = prompt_logits(dir, 64 << 10, &st, &mapped_copy);
    unsetenv("DJINN_WEIGHTS_IN_PLACE");
    CHECK_OK(st);
    CHECK(mapped_copy == 0);
    CHECK_MSG(in_place && copied && !memcmp(in_place, copied, 384 * sizeof *copied),
              "logits of weights in place differ from copied weights");
    free(in_place);
    free(copied);
    free(none);
}

/* dir/<file> := text */
static void write_text(const char *dir, const char *file, const char *text) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "w");
    CHECK_MSG(f != NULL, "cannot write %s", p);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* The llama3_fp8 fixture's weights under config texts that do not describe
 * them: refused at load, naming what is wrong. */
static void check_fp8_refusals(void) {
    char src[512], tmp[] = "/tmp/dj_fp8_XXXXXX", path[600];
    snprintf(src, sizeof src, "%s/models/llama3_fp8", DJ_FIXTURES);
    if (!mkdtemp(tmp)) {
        CHECK_MSG(0, "mkdtemp failed");
        return;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    char st_path[600];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", src);
    CHECK(symlink(st_path, path) == 0);
    char cfgp[600];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", src);
    FILE *f = fopen(cfgp, "r");
    char cfg[8192] = "";
    size_t n = f ? fread(cfg, 1, sizeof cfg - 1, f) : 0;
    if (f) fclose(f);
    cfg[n] = 0;
    char *q = strstr(cfg, "\"quantization_config\"");
    CHECK(q != NULL);
    if (!q) return;
    static const struct {
        const char *qc, *needle;
        dj_status want;
    } cases[] = {
        {"\"quantization_config\": {\"quant_method\": \"quanto\"}}", "quant_method \"quanto\" is not supported",
         DJ_EUNSUPPORTED},
        {"\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
         "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 4, \"type\": \"int\"}}}}}",
         "format \"pack-quantized\"", DJ_EUNSUPPORTED},
        {"\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "
         "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 4, \"type\": \"float\", \"strategy\": \"tensor\"}}}}}",
         "4-bit float weights", DJ_EUNSUPPORTED},
        /* the right method, scales of another name */
        {"\"quantization_config\": {\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "
         "\"config_groups\": {\"g\": {\"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\"}}}}}",
         "has no scales", DJ_ENOTFOUND},
        /* block size that does not fit the stored scales */
        {"\"quantization_config\": {\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128]}}", "fits no scaling",
         DJ_EFORMAT},
        {"\"no_quantization\": 1}", "no quantization_config", DJ_EUNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[8192];
        snprintf(text, sizeof text, "%.*s%s\n", (int)(q - cfg), cfg, cases[i].qc);
        write_text(tmp, "config.json", text);
        dj_engine_t *e = new_engine(4 << 10, 64);
        dj_model_t *m = NULL;
        const dj_status st = dj_model_load(e, tmp, &m);
        CHECK_MSG(st == cases[i].want && strstr(dj_last_error(), cases[i].needle),
                  "fp8 refusal %zu: status %d, error \"%s\" (wanted \"%s\")", i, (int)st, dj_last_error(),
                  cases[i].needle);
        if (m) dj_model_release(e, m);
        dj_engine_free(e);
    }
    snprintf(path, sizeof path, "%s/config.json", tmp);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    unlink(path);
    rmdir(tmp);
}

int main(void) {
    dj_test_seeds();
    for (size_t i = 0; i < DJ_N_FIXTURES; i++) check_fixture(DJ_FIXTURE_NAMES[i]);
    for (size_t i = 0; i < DJ_N_FP8_FIXTURES; i++) check_fixture(DJ_FP8_FIXTURE_NAMES[i]);
    check_known_copy("llama3_fp8"); /* in place and copied: the scales go to the text segment both ways */
    check_fp8_refusals();
    /* the trained demo model that ships in models/demo (bf16 weights) */
    check_model("demo", DJ_SOURCE_DIR "/models/demo", DJ_FIXTURES "/demo/reference.json");
    check_kv_f8("demo", DJ_SOURCE_DIR "/models/demo", DJ_FIXTURES "/demo/reference.json");
    check_small_steps();
    check_known_copy("phi3");
    check_longrope_sessions();
    check_too_small();
    return dj_test_finish("test_models");
}
