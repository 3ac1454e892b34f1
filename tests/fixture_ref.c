/* fixture_ref.c: reading reference.json files of the fixture models. */
#include "fixture_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "testutil.h"

const char *const DJ_FIXTURE_NAMES[DJ_N_FIXTURES] = {"llama2", "llama3", "tinyllama", "mistral", "qwen2", "qwen3",
                                                     "gemma2", "gemma3", "phi3", "phi3_longrope", "mixtral",
                                                     /* 4-bit (issue 16): tools/quant_fixtures.py */
                                                     "llama_awq", "llama_gptq",
                                                     /* longrope's long factors (issue 12) */
                                                     "phi3_longctx"};
const char *const DJ_FP8_FIXTURE_NAMES[DJ_N_FP8_FIXTURES] = {"llama3_fp8", "llama3_ct_tensor", "llama3_ct_channel"};

static int read_floats(const cJSON *a, float **out) {
    int n = cJSON_GetArraySize(a);
    *out = malloc((size_t)(n > 0 ? n : 1) * sizeof **out);
    for (int i = 0; i < n; i++) (*out)[i] = (float)cJSON_GetArrayItem(a, i)->valuedouble;
    return n;
}

static int read_ints(const cJSON *a, int32_t *out, int cap) {
    int n = cJSON_GetArraySize(a);
    if (n > cap) n = cap;
    for (int i = 0; i < n; i++) out[i] = (int32_t)cJSON_GetArrayItem(a, i)->valueint;
    return n;
}

int load_ref_file(const char *path, ref *r) {
    memset(r, 0, sizeof *r);
    char *txt = dj_test_read_file(path, NULL);
    if (!txt) return -1;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) return -1;
    r->n_prompt = read_ints(cJSON_GetObjectItem(j, "prompt_ids"), r->prompt, 64);
    r->n_greedy = read_ints(cJSON_GetObjectItem(j, "greedy"), r->greedy, 64);
    r->vocab = read_floats(cJSON_GetObjectItem(j, "last_logits"), &r->last);
    read_floats(cJSON_GetObjectItem(j, "final_logits"), &r->final);
    const cJSON *mm = cJSON_GetObjectItem(j, "min_margin");
    r->min_margin = cJSON_IsNumber(mm) ? mm->valuedouble : 0.0;
    const cJSON *pt = cJSON_GetObjectItem(j, "prompt_text");
    if (cJSON_IsString(pt)) r->prompt_text = strdup(pt->valuestring);
    cJSON_Delete(j);
    return 0;
}

int load_ref(const char *dir, ref *r) {
    char path[600];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    return load_ref_file(path, r);
}

void ref_free(ref *r) {
    free(r->last);
    free(r->final);
    free(r->prompt_text);
    memset(r, 0, sizeof *r);
}

double rel_err(const float *a, const float *b, int n) {
    double md = 0, mr = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= md)) md = d; /* NaN propagates as failure */
        if (fabs((double)b[i]) > mr) mr = fabs((double)b[i]);
    }
    return md / (mr > 0 ? mr : 1);
}

double rel_l2(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        const double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    return sqrt(num) / (den > 0 ? sqrt(den) : 1);
}
