/* metrics_vllm.h: /metrics series a dashboard built for vLLM reads - per model
 * request counts by finish reason, tokens, latency histograms to 60 s, queues. */
#ifndef DJ_SERVER_METRICS_VLLM_H
#define DJ_SERVER_METRICS_VLLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "djinn/status.h"

/* Bucket bounds of every histogram below (seconds, or tokens for the token
 * counts); the last bucket is +Inf. */
#define DJ__VLLM_BUCKETS 16
/* Models with series of their own; the rest share model="_other". */
#define DJ__VLLM_MODELS 32

typedef enum dj__vh {
    DJ__VH_E2E,       /* arrival to the last token */
    DJ__VH_TTFT,      /* arrival to the first token */
    DJ__VH_TPOT,      /* (last - first token) / (generated - 1), per request */
    DJ__VH_QUEUE,     /* arrival to the engine starting it */
    DJ__VH_PREFILL,   /* the engine's prompt time */
    DJ__VH_DECODE,    /* first to last token */
    DJ__VH_INFERENCE, /* start to last token */
    DJ__VH_PROMPT_TOK,/* prompt tokens of a request */
    DJ__VH_GEN_TOK,   /* generated tokens of a request */
    DJ__VH_COUNT
} dj__vh;

/* Why a request ended, as vLLM's finished_reason label says it (and ours: error). */
typedef enum dj__vfin { DJ__VFIN_STOP, DJ__VFIN_LENGTH, DJ__VFIN_ABORT, DJ__VFIN_ERROR, DJ__VFIN_COUNT } dj__vfin;

typedef struct dj__vhist {
    uint64_t count[DJ__VLLM_BUCKETS + 1];
    double sum;
} dj__vhist;

typedef struct dj__vllm_model {
    char name[128];
    uint64_t prompt_tokens, gen_tokens;         /* of ended requests */
    uint64_t prefix_queries, prefix_hits;       /* prompt tokens looked up / found in the prefix cache */
    uint64_t finished[DJ__VFIN_COUNT];
    uint32_t running, waiting;                  /* GENERATEs now (the worker's last count) */
    dj__vhist h[DJ__VH_COUNT];
} dj__vllm_model;

/* Lives in dj__metrics, under its mu (zeroed: empty). */
typedef struct dj__vllm {
    dj__vllm_model m[DJ__VLLM_MODELS + 1]; /* the last: "_other" */
    size_t n;
    double kv_usage;                       /* data-segment pages in use / all (0..1) */
} dj__vllm;

/* One GENERATE that ended, as plain values (negative times: unknown). */
typedef struct dj__vllm_outcome {
    const char *model;    /* NULL or "": "_unknown" */
    dj__vfin fin;
    uint32_t n_prompt, n_generated;
    uint64_t cached;      /* prompt tokens the prefix cache held */
    double queue_s, ttft_s, e2e_s, prefill_s, decode_s, inference_s;
} dj__vllm_outcome;

/* Callers hold the lock the struct lives under (dj__metrics.mu). */
void dj__vllm_observe(dj__vllm *v, const dj__vllm_outcome *o);
/* The queues now: running[i] and waiting[i] GENERATEs of models[i]; every
 * other model's gauges go to 0. */
void dj__vllm_set_queues(dj__vllm *v, const char *const *models, const uint32_t *running, const uint32_t *waiting,
                         size_t n);
/* The series in Prometheus' text format (docs/operations.md maps them to vLLM's). */
void dj__vllm_render(const dj__vllm *v, FILE *f);

/* The daemon's side (metrics_vllm.c knows its structs): a GENERATE ended -
 * st DJ_OK with its finish reason, else fin says why (abort: its session
 * went; error: refused or failed). Worker thread. */
struct dj__server;
struct dj__job;
struct dj__sess;
void dj__vllm_generate_end(struct dj__server *s, const struct dj__job *j, const struct dj__sess *ss, dj_status st,
                           dj__vfin fin_if_failed);
/* The worker's count of running and waiting GENERATEs per model into the gauges. */
void dj__vllm_count_queues(struct dj__server *s);

#endif
