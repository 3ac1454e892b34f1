/* lora_fixture.h: PEFT LoRA adapters written for a test (random A and B for
 * every projection of a model on disk) and the safetensors writer they use. */
#ifndef DJ_LORA_FIXTURE_H
#define DJ_LORA_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "djinn/checkpoint.h"
#include "djinn/dtype.h"
#include "testutil.h"

/* ---- writing safetensors files ---- */

typedef struct wt {
    char name[300];
    int64_t rows, cols; /* cols 0: a vector */
    float *v;           /* [rows * max(cols, 1)] owned */
    bool bf16;          /* stored as bf16 (else f32) */
} wt;

static int wt_cmp(const void *a, const void *b) { return strcmp(((const wt *)a)->name, ((const wt *)b)->name); }

static size_t wt_count(const wt *t) { return (size_t)t->rows * (size_t)(t->cols ? t->cols : 1); }

static void write_safetensors(const char *path, wt *t, size_t n) {
    qsort(t, n, sizeof *t, wt_cmp);
    char *hdr = malloc(65536 + n * 256);
    size_t o = 0, off = 0;
    o += (size_t)sprintf(hdr + o, "{");
    for (size_t i = 0; i < n; i++) {
        const size_t bytes = wt_count(&t[i]) * (t[i].bf16 ? 2 : 4);
        if (t[i].cols)
            o += (size_t)sprintf(hdr + o, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                                 i ? "," : "", t[i].name, t[i].bf16 ? "BF16" : "F32", (long long)t[i].rows,
                                 (long long)t[i].cols, off, off + bytes);
        else
            o += (size_t)sprintf(hdr + o, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                                 i ? "," : "", t[i].name, t[i].bf16 ? "BF16" : "F32", (long long)t[i].rows, off,
                                 off + bytes);
        off += bytes;
    }
    o += (size_t)sprintf(hdr + o, "}");
    while (o % 8) hdr[o++] = ' ';
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    uint64_t hl = o;
    uint8_t le[8];
    for (int i = 0; i < 8; i++) le[i] = (uint8_t)(hl >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(hdr, 1, o, f);
    for (size_t i = 0; i < n; i++) {
        const size_t c = wt_count(&t[i]);
        if (!t[i].bf16) {
            fwrite(t[i].v, 4, c, f);
            continue;
        }
        for (size_t k = 0; k < c; k++) {
            const uint16_t h = dj_f32_to_bf16(t[i].v[k]);
            fwrite(&h, 2, 1, f);
        }
    }
    fclose(f);
    free(hdr);
}

static void write_text(const char *dir, const char *file, const char *text) {
    char p[1100];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static float randn(void) { return dj_test_randf(-1.0f, 1.0f); }

/* ---- adapters for a fixture ---- */

static const char *const LEAVES[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                     "qkv_proj", "gate_up_proj"};

/* The leaf of a base tensor "<module>.<leaf>.weight" we adapt, or NULL. */
static const char *leaf_of(const char *name, char *module /* OUT [200] */) {
    const size_t n = strlen(name);
    if (n < 8 || strcmp(name + n - 7, ".weight") != 0) return NULL;
    snprintf(module, 200, "%.*s", (int)(n - 7), name);
    const char *dot = strrchr(module, '.');
    const char *leaf = dot ? dot + 1 : module;
    for (size_t i = 0; i < sizeof LEAVES / sizeof *LEAVES; i++)
        if (strcmp(leaf, LEAVES[i]) == 0) return LEAVES[i];
    return NULL;
}

typedef struct adapter_spec {
    uint32_t r;
    float alpha;
    bool rslora;
    bool bf16;
    const char *base;  /* base_model_name_or_path; NULL: the fixture's name */
    const char *extra; /* more config fields (",\"k\":v"), or "" */
    const char *targets; /* target_modules JSON list, NULL: every projection the base has */
    const char *skip;  /* a tensor name not to write, or NULL */
    const char *nan_in; /* a tensor name to put a NaN into, or NULL */
    int64_t bad_rows;  /* != 0: lora_B's rows of the first module this many more */
    const char *extra_tensor; /* a 2x2 tensor of this name beside the others, or NULL */
} adapter_spec;

/* Writes a PEFT adapter (random A, B) of the model in base_dir, whose
 * name is `model`, into the directory dir (made here). */
static void lora_fixture_write(const char *base_dir, const char *model, const char *dir, const adapter_spec *sp) {
    mkdir(dir, 0700);
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(base_dir, &ck));
    if (!ck) return;
    wt *t = calloc(2 * dj_checkpoint_tensor_count(ck) + 1, sizeof *t);
    size_t n = 0;
    char leaves[256] = "";
    bool first = true;
    for (size_t i = 0; i < dj_checkpoint_tensor_count(ck); i++) {
        const dj_tensor_info *ti = dj_checkpoint_tensor(ck, i);
        char module[200];
        const char *leaf = leaf_of(ti->name, module);
        if (!leaf || ti->ndim != 2) continue;
        if (!strstr(leaves, leaf)) {
            snprintf(leaves + strlen(leaves), sizeof leaves - strlen(leaves), "%s\"%s\"", leaves[0] ? "," : "", leaf);
        }
        if (sp->targets && !strstr(sp->targets, leaf)) continue;
        wt *a = &t[n++], *b = &t[n++];
        snprintf(a->name, sizeof a->name, "base_model.model.%s.lora_A.weight", module);
        snprintf(b->name, sizeof b->name, "base_model.model.%s.lora_B.weight", module);
        a->rows = sp->r;
        a->cols = ti->shape[1];
        b->rows = ti->shape[0] + (first ? sp->bad_rows : 0);
        b->cols = sp->r;
        first = false;
        a->bf16 = b->bf16 = sp->bf16;
        a->v = malloc(wt_count(a) * sizeof(float));
        b->v = malloc(wt_count(b) * sizeof(float));
        for (size_t k = 0; k < wt_count(a); k++) a->v[k] = 0.2f * randn();
        for (size_t k = 0; k < wt_count(b); k++) b->v[k] = 0.2f * randn();
        if (sp->nan_in && strcmp(sp->nan_in, a->name) == 0) a->v[1] = NAN;
        if (sp->skip && strcmp(sp->skip, b->name) == 0) {
            free(b->v);
            n--;
        }
    }
    if (sp->extra_tensor) {
        wt *x = &t[n++];
        snprintf(x->name, sizeof x->name, "%s", sp->extra_tensor);
        x->rows = x->cols = 2;
        x->v = calloc(4, sizeof(float));
    }
    char p[1100];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    write_safetensors(p, t, n);
    for (size_t i = 0; i < n; i++) free(t[i].v);
    free(t);
    dj_checkpoint_close(ck);
    char cfg[2048];
    char tl[300];
    snprintf(tl, sizeof tl, "[%s]", leaves);
    snprintf(cfg, sizeof cfg,
             "{\"peft_type\":\"LORA\",\"task_type\":\"CAUSAL_LM\",\"r\":%u,\"lora_alpha\":%g,\"use_rslora\":%s,"
             "\"lora_dropout\":0.05,\"bias\":\"none\",\"fan_in_fan_out\":false,\"modules_to_save\":null,"
             "\"base_model_name_or_path\":\"%s\",\"target_modules\":%s%s}",
             sp->r, (double)sp->alpha, sp->rslora ? "true" : "false", sp->base ? sp->base : model,
             sp->targets ? sp->targets : tl, sp->extra ? sp->extra : "");
    write_text(dir, "adapter_config.json", cfg);
}

#endif
