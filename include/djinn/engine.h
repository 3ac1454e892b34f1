/* engine.h: the embedded engine - a backend, the VMU on it and the plan
 * cache - with models loaded into the text segment (shared by fingerprint)
 * and sessions whose KV cache lives in data-segment pages. One thread drives
 * an engine. */
#ifndef DJINN_ENGINE_H
#define DJINN_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "djinn/backend.h"
#include "djinn/checkpoint.h"
#include "djinn/graph.h"
#include "djinn/sampler.h"
#include "djinn/status.h"
#include "djinn/vmu.h"

typedef struct dj_engine dj_engine_t;
typedef struct dj_model dj_model_t;
typedef struct dj_session dj_session_t;

typedef struct dj_engine_config {
    const char *device;       /* "cpu" (default when NULL) */
    int n_threads;            /* CPU threads, 0 = every core */
    dj_vmu_config vmu;        /* budget and segment ratios */
    uint32_t max_step_tokens; /* largest prefill chunk (shape bucket cap); 0 = 512 */
    bool deterministic;       /* a row's logits bit-identical alone and in any decode batch
                               * (steps of up to DJ_DETERMINISTIC_MAX_ROWS rows). The CPU is
                               * so always; CUDA then takes its GEMV for every such matmul
                               * instead of cuBLAS above 8 rows (slower at large batches) */
} dj_engine_config;

dj_status dj_engine_new(const dj_engine_config *cfg, dj_engine_t **out /* OUT */);
void dj_engine_free(dj_engine_t *e); /* NULL does nothing; sessions/models must be released first */

dj_vmu_t *dj_engine_vmu(dj_engine_t *e);
dj_backend_t *dj_engine_backend(dj_engine_t *e);
dj_plan_cache_t *dj_engine_plans(dj_engine_t *e);

/* What a model needs, from its checkpoint alone (no weights copied):
 * text bytes (weights as stored, aligned), KV bytes per token (all layers,
 * K and V, in the backend's KV dtype) and the stack peak of a prefill step of
 * `step_tokens` (planned). */
typedef struct dj_model_needs {
    size_t text_bytes;
    size_t kv_bytes_per_token;
    size_t stack_peak;
    uint64_t n_params;
} dj_model_needs;
dj_status dj_model_estimate(const dj_checkpoint_t *ck, dj_dtype kv_dtype, uint32_t step_tokens,
                            dj_model_needs *needs /* OUT */);

/* A VMU config that fits `needs` for `ctx` tokens of one session, with 25%
 * headroom on data and stack. */
void dj_engine_config_for(const dj_model_needs *needs, uint32_t ctx, size_t page_bytes,
                          dj_vmu_config *cfg /* OUT */);

/* Load the checkpoint directory (or find it already in the text segment by
 * fingerprint, costing no bytes). The returned model holds one reference:
 * release it with dj_model_release. The second form takes an open checkpoint
 * (borrowed; weights are copied out of it). */
dj_status dj_model_load(dj_engine_t *e, const char *dir, dj_model_t **out /* OUT */);
dj_status dj_model_load_checkpoint(dj_engine_t *e, dj_checkpoint_t *ck, const char *name,
                                   dj_model_t **out /* OUT */);
void dj_model_release(dj_engine_t *e, dj_model_t *m);
const dj_model_config *dj_model_get_config(const dj_model_t *m);
uint64_t dj_model_fingerprint(const dj_model_t *m);
uint64_t dj_model_param_count(const dj_model_t *m);

/* A session: private KV pages for up to max_ctx positions (0 = the model's
 * max_position_embeddings), quota_pages as in the VMU (0 = none). Holds a
 * model reference until freed. */
dj_status dj_session_new(dj_engine_t *e, dj_model_t *m, uint32_t max_ctx, size_t quota_pages,
                         dj_session_t **out /* OUT */);
void dj_session_free(dj_engine_t *e, dj_session_t *s); /* returns every page; NULL does nothing */
uint32_t dj_session_pos(const dj_session_t *s);         /* tokens in the KV cache */
uint32_t dj_session_max_ctx(const dj_session_t *s);
const dj_model_t *dj_session_model(const dj_session_t *s); /* valid while the session is */

/* Feed n token ids at the session's position (prefill when n > 1, decode when
 * n == 1; long inputs are split into chunks of max_step_tokens). If logits is
 * not NULL it receives the [vocab] logits of the last position. On error the
 * session's position is unchanged. Ids are validated against the vocabulary;
 * going past max_ctx is DJ_ERANGE. */
dj_status dj_session_step(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                          float *logits /* OUT, [vocab] or NULL */);

/* As dj_session_step, then pick the next token from the last position's
 * logits into *next. Greedy (sp NULL or temperature 0) runs on the device
 * where the backend can (only the id crosses to the host); other params
 * download the logits and use the session's own host sampler, seeded from
 * sp->seed when first used with these params (changed params start a new
 * one). Params are validated as dj_sampler_new does. */
dj_status dj_session_step_sample(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                 const dj_sampler_params *sp /* NULL = greedy */, int32_t *next /* OUT */);

/* One decode step for n_sessions distinct sessions of one model, each fed
 * ids[i] at its own position and writing its own pages, through one plan
 * (and, on a device, one recorded graph per (model, n_sessions)). logits
 * (optional) receives [n_sessions][vocab]; next (optional) one picked token
 * per session, as dj_session_step_sample. The same logits as n_sessions
 * single steps. All or nothing: on error no session's position moves. At most
 * 1024 sessions. */
dj_status dj_engine_step_batch(dj_engine_t *e, dj_session_t *const *sessions, const int32_t *ids,
                               uint32_t n_sessions, float *logits /* OUT, [n_sessions][vocab] or NULL */,
                               const dj_sampler_params *sp /* NULL = greedy */,
                               int32_t *next /* OUT, [n_sessions] or NULL */);

/* One step of n_sessions sessions of one model, session i fed n_tokens[i]
 * >= 1 tokens (n_tokens NULL: one each) - a decode token, or a chunk of its
 * prompt - at its own position, ids holding them one session after another;
 * every row shares the step's matmuls. The last token of session i is picked
 * by samplers[i] - the caller's, with its own params, seed and state (a
 * server's generations) - as dj_sampler_sample(samplers[i], its logits)
 * would; a NULL samplers[i] picks nothing (next[i] = -1, no draw: a prompt
 * chunk that is not the last). Picks run on the device where the backend can
 * (all greedy: argmax; any mix with $DJINN_DEVICE_SAMPLING=on, each sampler
 * supplying its next uniform draw), so no logits cross; else the logits come
 * to the host. At most max_step_tokens tokens when any session has more than
 * one; all or nothing as dj_engine_step_batch. Each sampler's vocabulary must
 * be the model's. */
/* (A single session fed a prompt chunk of n_tokens[0] > 1 runs on the
 * prefill plan, as dj_session_step would.) */
dj_status dj_engine_step_batch_samplers(dj_engine_t *e, dj_session_t *const *sessions,
                                        const uint32_t *n_tokens /* [n_sessions] or NULL */, const int32_t *ids,
                                        uint32_t n_sessions, dj_sampler_t *const *samplers,
                                        int32_t *next /* OUT, [n_sessions] */);

/* The largest number of tokens one step takes (dj_engine_config.max_step_tokens). */
uint32_t dj_engine_max_step_tokens(const dj_engine_t *e);

/* Decode steps on a backend with graphs (CUDA): a decode shape runs eagerly
 * the first time, is recorded the second and replayed from then on. Counts
 * since the engine started: graphs recorded, replays, shapes that could not
 * be recorded (they run eagerly). DJINN_NO_GRAPHS=1 in the environment turns
 * recording off (every step eager, as on the CPU). */
void dj_engine_graph_stats(const dj_engine_t *e, size_t *captures /* OUT */, size_t *replays /* OUT */,
                           size_t *failures /* OUT */);

/* Build the SRG of one step of the model for `bucket` token rows (weights
 * bound when m is not NULL). Exposed for the planner, info and tests. */
dj_status dj_model_build_graph(const dj_model_config *cfg, const dj_model_t *m, dj_phase phase,
                               uint32_t bucket, dj_graph_t **out /* OUT */);
/* The same with flags: DJ_GRAPH_ALL_LOGITS makes a prefill graph output the
 * logits of every row ([bucket][vocab] f32) instead of the last row's. */
#define DJ_GRAPH_ALL_LOGITS 1u
dj_status dj_model_build_graph_opts(const dj_model_config *cfg, const dj_model_t *m, dj_phase phase,
                                    uint32_t bucket, unsigned flags, dj_graph_t **out /* OUT */);

/* Like dj_session_step, but logits receives the logits of every one of the n
 * positions, [n][vocab] f32 (row i = the prediction after ids[i]). The stack
 * must hold a chunk's [max_step_tokens][vocab] logits. */
dj_status dj_session_step_all(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                              float *logits /* OUT, [n][vocab] */);

#endif
