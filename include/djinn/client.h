/* client.h: libdjinn, the client of djinnd - one connection, blocking calls
 * safe to make from several threads (requests are matched by id), leases
 * kept alive by a heartbeat thread. Errors are dj_status + dj_last_error(). */
#ifndef DJINN_CLIENT_H
#define DJINN_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "djinn/protocol.h"
#include "djinn/sample_params.h"
#include "djinn/status.h"

typedef struct dj_client dj_client_t;

/* Connect to "HOST:PORT" or "unix:/path" and say HELLO with `token` (NULL
 * when the server has none). Heartbeats start at a third of the lease. */
dj_status dj_client_connect(const char *addr, const char *token, dj_client_t **out /* OUT */);
void dj_client_free(dj_client_t *c); /* closes the connection; NULL does nothing */

/* What HELLO answered. */
uint32_t dj_client_lease_ms(const dj_client_t *c);
/* Heartbeat period in ms; 0 stops heartbeats (tests use it to let leases lapse). */
void dj_client_set_heartbeat(dj_client_t *c, uint32_t period_ms);
/* One HEARTBEAT round trip (renews every session of this connection). */
dj_status dj_client_heartbeat(dj_client_t *c);

/* ---- models ---- */
typedef struct dj_client_model {
    char name[128];
    bool loaded;   /* the server holds it (pinned or in use) */
    uint32_t refs; /* sessions + pin */
    /* STATS only: the placement (docs/internals.md, the weight ring) */
    uint32_t layers, streamed_layers;     /* streamed_layers 0: every layer resident */
    uint32_t host_layers;                 /* streamed layers whose FFN the host computes at small batches */
    uint32_t host_share_pct;              /* ... this percentage of each one's FFN width (100: all of it) */
    uint64_t resident_bytes, ring_bytes, streamed_bytes; /* streamed_bytes: copied per step */
} dj_client_model;
/* *models malloc'd (free()), *n entries. */
dj_status dj_client_model_list(dj_client_t *c, dj_client_model **models /* OUT */, size_t *n /* OUT */);
dj_status dj_client_model_load(dj_client_t *c, const char *name);
dj_status dj_client_model_unload(dj_client_t *c, const char *name);

/* ---- sessions ---- */
typedef struct dj_session_opts {
    const char *model;        /* a folder name in the server's model store */
    dj_qos qos;               /* DJ_QOS_INTERACTIVE (0, the default), DJ_QOS_REALTIME or DJ_QOS_BATCH */
    uint32_t expected_tokens; /* context to reserve; 0 = the model's (capped at 4096) */
} dj_session_opts;
dj_status dj_client_session_open(dj_client_t *c, const dj_session_opts *o, uint64_t *session /* OUT */);
/* The same, opened with `reattach` and giving the session's secret (secret
 * NULL: a plain open): when this connection closes the session waits out its
 * lease, and a later connection takes it over with dj_client_session_attach,
 * its KV intact. */
dj_status dj_client_session_open_secret(dj_client_t *c, const dj_session_opts *o, uint64_t *session /* OUT */,
                                        uint64_t *secret /* OUT */);
/* Reattach a session whose connection closed; *pos (optional): its position. */
dj_status dj_client_session_attach(dj_client_t *c, uint64_t session, uint64_t secret, uint32_t *pos /* OUT */);
dj_status dj_client_session_close(dj_client_t *c, uint64_t session);
/* A session moved between daemons serving the same model (docs/swap.md has
 * the image, docs/protocol.md SESSION_EXPORT / SESSION_IMPORT). Export: the
 * session's image (its KV pages, or its history when they are swapped out;
 * its pending token, QoS, cache salt) into *image (malloc'd, free() it); the
 * session stays open here (close it once imported elsewhere). DJ_EBUSY while
 * it generates. Import: opens a session on this connection from an image -
 * the model's fingerprint checked (another checkpoint: DJ_EINVAL naming
 * both), every page's checksum checked (DJ_EIO naming a damaged one) - with
 * a new id and reattach secret (*secret, as dj_client_session_open_secret)
 * and *pos its position; generation on it continues with the tokens the
 * exported one would have given. The _file forms write or read the image
 * as a file. */
dj_status dj_client_session_export(dj_client_t *c, uint64_t session, uint8_t **image /* OUT, malloc'd */,
                                   size_t *n /* OUT */);
dj_status dj_client_session_import(dj_client_t *c, const void *image, size_t n, uint64_t *session /* OUT */,
                                   uint64_t *secret /* OUT or NULL */, uint32_t *pos /* OUT or NULL */);
dj_status dj_client_session_export_file(dj_client_t *c, uint64_t session, const char *path);
dj_status dj_client_session_import_file(dj_client_t *c, const char *path, uint64_t *session /* OUT */,
                                        uint64_t *secret /* OUT or NULL */, uint32_t *pos /* OUT or NULL */);
/* State only for now: the KV cache stays resident (swap is a later issue). */
dj_status dj_client_session_pause(dj_client_t *c, uint64_t session, uint64_t expected_ms);
dj_status dj_client_session_resume(dj_client_t *c, uint64_t session);

/* ---- generation ---- */
typedef struct dj_generate_params {
    const char *prompt;      /* text (the model needs a tokenizer.json), or */
    const int32_t *ids;      /* token ids [n_ids] */
    size_t n_ids;
    dj_sampler_params sampling; /* temperature 0 = greedy */
    uint32_t max_tokens;
    const int32_t *stop_ids; /* [n_stop]; sampling one ends the generation (it is not emitted) */
    size_t n_stop;
    const dj_logit_bias *logit_bias; /* [n_logit_bias] added to those ids' logits before each pick
                                      * (sample_params.h: at most DJ_MAX_LOGIT_BIAS, bias in [-100, 100]) */
    size_t n_logit_bias;
    bool ignore_eos;         /* the server stops at the model's EOS ids unless this is set */
    bool logprobs;           /* each TOKEN carries its logprob (sample_params.h's dj_token_logprobs) */
    uint32_t top_logprobs;   /* with logprobs: alternatives per token, 0..DJ_MAX_TOP_LOGPROBS */
    const char *cache_salt;  /* NULL, or 1-256 bytes: the session shares prefix-cache blocks only with sessions
                              * of the same token (or of `shared` tokens) and the same cache_salt; set by the
                              * session's first GENERATE, later ones repeat it (docs/prefix-cache.md) */
    const char *json_schema; /* NULL, or structured output: the generated text is a JSON value of this JSON schema
                              * (the subset of grammar.h; "{\"type\": \"object\"}": any object) */
    const char *adapter;     /* NULL, or a LoRA adapter's folder in the daemon's model store, of the session's
                              * model: set by the session's first GENERATE, later ones repeat it or give none */
} dj_generate_params;

typedef struct dj_generate_result {
    uint32_t n_prompt, n_generated;
    char reason[16];         /* "length", "stop", "context" */
    double queue_ms, prefill_ms, ttft_ms, decode_ms;
    int32_t stop_id;         /* reason "stop": the EOS or stop id that ended it (not emitted; the session's pending token); else -1 */
    uint32_t pos;            /* the session's position after it (tokens in its KV; the pending token comes next) */
    uint32_t cached;         /* prompt ids mapped from the daemon's prefix cache (not computed) */
} dj_generate_result;

/* Called on the calling thread for every token, with its text piece (may be
 * empty; only complete UTF-8). */
typedef void (*dj_token_cb)(int32_t id, const char *text, size_t len, void *user);

dj_status dj_client_generate(dj_client_t *c, uint64_t session, const dj_generate_params *p, dj_token_cb cb,
                             void *user, dj_generate_result *res /* OUT, may be NULL */);

/* The same generation as a stream of events, pulled by the caller (the HTTP
 * front end's form: it waits with a timeout and checks its own client in
 * between). start sends GENERATE; next waits at most timeout_ms (< 0:
 * forever) for the next event - NONE when nothing came in time, TOKEN, or
 * DONE (the last: *res filled if not NULL, text = the flushed rest). An
 * event's text is valid until the next call on g. An error (the server's
 * ERROR, a dead connection) ends the stream. end frees g at any point; a
 * generation still running goes on in the server (its frames are dropped)
 * until it ends or the connection closes - close it to stop the generation. */
typedef struct dj_client_gen dj_client_gen_t;
typedef enum { DJ_CLIENT_EVENT_NONE, DJ_CLIENT_EVENT_TOKEN, DJ_CLIENT_EVENT_DONE } dj_client_event_kind;
typedef struct dj_client_event {
    dj_client_event_kind kind;
    int32_t id;       /* TOKEN: the token id; else -1 */
    const char *text; /* complete UTF-8, len bytes (not NUL-terminated) */
    size_t len;
    bool has_logprobs;   /* TOKEN of a generation with logprobs: lp filled */
    dj_token_logprobs lp;
} dj_client_event;
dj_status dj_client_generate_start(dj_client_t *c, uint64_t session, const dj_generate_params *p,
                                   dj_client_gen_t **out /* OUT */);
dj_status dj_client_generate_next(dj_client_gen_t *g, int timeout_ms, dj_client_event *ev /* OUT */,
                                  dj_generate_result *res /* OUT, may be NULL */);
void dj_client_generate_end(dj_client_gen_t *g); /* NULL does nothing */

/* ---- steps and handles ---- */
typedef struct dj_remote_tensor {
    uint64_t handle;  /* 0 when logits were not asked for */
    char dtype[8];    /* "f32" */
    uint32_t ndim;
    uint64_t shape[4];
    uint64_t nbytes;
    uint32_t pos;     /* session position after the step */
} dj_remote_tensor;

/* Feed ids (prefill if n > 1, decode if 1); the last position's logits stay
 * on the server behind t->handle when want_logits. */
dj_status dj_client_step(dj_client_t *c, uint64_t session, const int32_t *ids, size_t n, bool want_logits,
                         dj_remote_tensor *t /* OUT */);
/* Which logits a step leaves behind its handle: none, the last position's
 * ([vocab] f32) or every fed position's ([n][vocab] f32 - the large handle:
 * 2048 positions of a 128k vocabulary are 1 GiB). */
typedef enum { DJ_LOGITS_NONE, DJ_LOGITS_LAST, DJ_LOGITS_ALL } dj_logits_mode;
dj_status dj_client_step_ex(dj_client_t *c, uint64_t session, const int32_t *ids, size_t n, dj_logits_mode mode,
                            dj_remote_tensor *t /* OUT */);
/* Bytes [offset, offset + length) of a handle into dst (cap bytes); length
 * UINT64_MAX = to the end. *got = bytes written. Large ranges are fetched in
 * several requests. */
dj_status dj_client_fetch(dj_client_t *c, uint64_t handle, uint64_t offset, uint64_t length, void *dst,
                          size_t cap, size_t *got /* OUT */);
dj_status dj_client_release(dj_client_t *c, uint64_t handle);

/* ---- stats ---- */
typedef struct dj_client_seg {
    uint64_t capacity, used, peak;
} dj_client_seg;
typedef struct dj_client_session_info {
    uint64_t id;
    char model[128];
    char qos[16];
    uint32_t pos;
    uint64_t lease_left_ms;
    bool paused, generating;
    char state[16];            /* the scheduler's: running, idle, paused, swapping, swapped, restoring, dropped */
    uint64_t kv_bytes;         /* its KV pages, wherever they are */
    uint64_t pooled_bytes;     /* of those, in the host swap pool */
    uint64_t swaps;            /* times it was swapped out */
} dj_client_session_info;
/* The host swap pool and the scheduler's KV moves (STATS `swap`). */
typedef struct dj_client_swap {
    char policy[16];
    uint64_t pool_bytes, pool_used, pool_peak;
    uint64_t swaps_out, swaps_in, bytes_out, bytes_in;
    uint64_t pages_reserved, preemptions, prefetches, kv_drops;
} dj_client_swap;
typedef struct dj_client_stats {
    char version[32];                     /* the daemon's version ("0.1.0"; "" from one older than 0.1.0) */
    dj_client_seg text, data, stack;
    uint64_t pages_total, pages_free, page_bytes, evictions, vmu_models, vmu_sessions, handles, connections;
    uint64_t batched_steps, batched_rows; /* decode steps that carried several sessions, and their rows */
    uint64_t mixed_steps;                 /* of those, steps that also carried a prompt chunk */
    uint64_t gen_steps;                   /* generation steps of any size (prompt chunks too) */
    double step_ms, step_engine_ms;       /* their mean worker time, and the part inside the engine's step */
    uint64_t graph_captures, graph_replays, graph_failures; /* the engine's decode graphs (dj_engine_graph_stats) */
    dj_client_model *models;            /* [n_models] */
    size_t n_models;
    dj_client_session_info *sessions;   /* [n_sessions] */
    size_t n_sessions;
    uint64_t waiting[DJ_QOS_COUNT], running[DJ_QOS_COUNT];
    dj_client_swap swap;
    char *map;                          /* the VMU map as dj_vmu_print_stats writes it */
    struct {                            /* the engine's prefix cache (KV blocks shared by content) */
        bool enabled;
        uint64_t blocks, blocks_unreferenced, pages, pages_unreferenced, hits, tokens_mapped, evictions;
    } prefix;
    struct {                            /* the KV disk tier below the swap pool (STATS `disk`) */
        bool enabled, direct;
        uint64_t capacity, used, peak, sessions, spills, reads, bytes_written, bytes_read;
        uint64_t bad_pages, failed_reads, recoveries; /* pages failing their checksum; read-backs refused;
                                                       * sessions recomputed from their history after one */
        double write_s, read_s;
    } disk;
} dj_client_stats;
dj_status dj_client_stats_get(dj_client_t *c, dj_client_stats *st /* OUT */);
void dj_client_stats_free(dj_client_stats *st);
/* Readable report (segments, models with refcounts, sessions, queues). */
void dj_client_stats_print(const dj_client_stats *st, FILE *f);

#endif
