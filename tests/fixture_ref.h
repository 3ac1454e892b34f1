/* fixture_ref.h: the reference outputs tools/make_fixtures.py stored beside
 * each fixture checkpoint (reference.json), read for the CPU and GPU tests. */
#ifndef DJ_FIXTURE_REF_H
#define DJ_FIXTURE_REF_H

#include <stdint.h>

/* The context every fixture check opens its sessions with: it decides
 * longrope's factors (dj_session_rope_long), so phi3_longrope (original 64
 * positions) runs its short factors and phi3_longctx (original 32) its long
 * ones, as transformers did for their references. */
#define DJ_FIXTURE_CTX 64
#define DJ_N_FIXTURES 14
extern const char *const DJ_FIXTURE_NAMES[DJ_N_FIXTURES]; /* tests/fixtures/models/<name> */
/* FP8 weights (issue 16): the llama3 fixture in each stored FP8 layout, with
 * references from the dequantized weights (tools/fp8_fixtures.py). */
#define DJ_N_FP8_FIXTURES 3
extern const char *const DJ_FP8_FIXTURE_NAMES[DJ_N_FP8_FIXTURES];

typedef struct ref {
    int32_t prompt[64];
    int n_prompt;
    int32_t greedy[64];
    int n_greedy;
    float *last, *final; /* [vocab] each, malloc'd: free with ref_free */
    int vocab;
    double min_margin;   /* smallest top-1/top-2 gap while generating */
    char *prompt_text;   /* when the model ships a tokenizer, else NULL */
} ref;

/* 0 on success; -1 if the file cannot be read or parsed. */
int load_ref_file(const char *path, ref *r /* OUT */);
int load_ref(const char *dir, ref *r /* OUT */); /* dir/reference.json */
void ref_free(ref *r);

/* max|a-b| / max|b|; NaN in a gives NaN (never passes a <= check). */
double rel_err(const float *a, const float *b, int n);
/* ||a-b||_2 / ||b||_2, the relative error of the whole vector; NaN likewise. */
double rel_l2(const float *a, const float *b, int n);

#endif
