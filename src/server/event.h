/* event.h: what djinnd's worker answers, as typed structs (replies, TOKEN,
 * DONE, ERROR, prompt credit) posted to the I/O side, which encodes them (encode.c). */
#ifndef DJ_SERVER_EVENT_H
#define DJ_SERVER_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/engine.h"
#include "djinn/kv.h"
#include "djinn/protocol.h"
#include "djinn/sample_params.h"
#include "sched/sched.h"

/* ---- replies, one struct per request type that answers more than {} ---- */
struct dj__job;

/* SESSION_OPEN: what the client is told, and what the I/O side's record of
 * the session (dj__lease) is made of. */
typedef struct dj__rep_open {
    uint64_t session, secret; /* secret: sent only with reattach (has_secret) */
    bool has_secret;
    uint32_t max_ctx, vocab, lease_ms;
    dj_qos qos;
    char model[128];
    uint32_t hidden;
    uint32_t pos;             /* SESSION_IMPORT: the position it was imported at */
    uint64_t tenant;          /* a restart's SESSION_IMPORT (conn 0): the tenant it had */
    struct dj__job *drop_msg, *orphan_msg; /* the session's DJ__CTL_DROP and (reattach) DJ__CTL_ORPHAN
                                            * messages, made by the worker; owned until the lease takes them */
} dj__rep_open;

/* One saved activation of a STEP with points, [n, d] f32: bytes (malloc'd;
 * NULL: none could be made, only the point is written) become a result
 * handle on the I/O side, which sets handle. */
typedef struct dj__rep_saved {
    char point[48];
    float *bytes;
    uint64_t handle;
    uint32_t n, d;
    bool brk;                 /* the value of the breakpoint the step is paused at (op "break") */
    bool keep;                /* filed as the connection's (no session): it outlives the session */
} dj__rep_saved;

typedef struct dj__rep_step {
    uint32_t pos;
    float *logits;            /* [nbytes / 4] (malloc'd) or NULL: none asked; the I/O side files it */
    uint64_t handle;          /* the logits' handle (the I/O side's id) */
    uint32_t ndim;
    uint64_t shape[2];
    uint64_t nbytes;
    bool traced;              /* points were given: `saved` is written */
    bool paused;              /* stopped at a breakpoint: brk_point, and `saved` holds its value */
    int32_t *ids;             /* [n_ids] (malloc'd) the ids a text prompt became, or NULL */
    uint32_t n_ids;
    char brk_point[48];
    uint32_t n_saved;
    dj__rep_saved *saved;     /* [n_saved] (malloc'd) */
} dj__rep_step;

/* SESSION_EXPORT: the session's image (persist.h), which the I/O side
 * files as a result handle (handle) that the client FETCHes. */
typedef struct dj__rep_export {
    uint8_t *bytes;           /* [nbytes] (malloc'd) until filed */
    uint64_t nbytes, handle;
    uint32_t pos, pages;      /* its position; KV pages carried (0: its history is re-fed on import) */
    uint64_t fingerprint;
} dj__rep_export;

typedef struct dj__rep_model {
    bool unload;              /* MODEL_UNLOAD: only `sessions` */
    uint64_t fingerprint, params;
    uint32_t vocab, max_ctx;
    uint32_t sessions;
} dj__rep_model;

typedef struct dj__rep_model_list {
    size_t n;
    struct dj__rep_listed {
        char name[128];
        bool loaded;
        uint32_t refs;
    } *models;                /* [n] (malloc'd) */
} dj__rep_model_list;

/* STATS: a snapshot the worker takes and the I/O side packs. */
typedef struct dj__stats_sess {
    uint64_t id;
    dj_sched_state state;
    uint64_t kv_bytes, pooled_bytes, swaps, lease_left_ms;
    char model[128];
    dj_qos qos;
    uint32_t pos;
    bool paused, generating;
    uint64_t break_bytes;     /* its step paused at a breakpoint holds these (0: none) */
} dj__stats_sess;

typedef struct dj__stats_model {
    char name[128];
    uint32_t refs, sessions;
    bool pinned;
    dj_model_placement pl;
} dj__stats_model;

typedef struct dj__stats_snap {
    bool admin;               /* scope "all"; else "own": page_bytes, an empty model list and its sessions */
    uint64_t page_bytes;
    dj__stats_sess *sessions; /* [n_sessions] (malloc'd) */
    size_t n_sessions;
    uint64_t sessions_total;
    /* admin only */
    dj_vmu_stats vs;
    uint64_t batched_steps, mixed_steps, batched_rows, gen_steps;
    double step_ms, step_engine_ms;
    size_t graph_captures, graph_replays, graph_failures;
    dj_prefix_stats prefix;
    dj__stats_model *models;  /* [n_models] (malloc'd) */
    size_t n_models;
    uint64_t waiting[DJ_QOS_COUNT], running[DJ_QOS_COUNT];
    dj_swap_policy policy;
    dj_swap_stats swap;
    dj_sched_stats sched;
    dj_disk_stats disk;       /* --state-dir's tier (all zero without one) */
    uint64_t handles, connections;
    uint64_t brk_paused, brk_bytes; /* steps paused at breakpoints, the bytes they hold */
    struct dj__capture *capture; /* the weight store and graph runs: the I/O side packs their counts */
    char *map;                /* the VMU's map, scrubbed (malloc'd) or NULL */
} dj__stats_snap;

/* GRAPH_RUN: its outputs, each [nbytes] of f32 (malloc'd) that the I/O
 * side files as a result handle (its id into handle), and how it ran. */
typedef struct dj__graph_out {
    float *bytes;
    uint64_t nbytes, handle;
    uint32_t rank;
    int64_t shape[8];
    const char *dtype;        /* the graph's declared dtype (a static string); stored as f32 */
} dj__graph_out;

typedef struct dj__rep_graph {
    dj__graph_out *outs;      /* [n_outs] (malloc'd) */
    uint32_t n_outs;
    uint64_t nodes, stack_bytes;
    double run_s, plan_s;
    bool plan_cached;
    uint8_t graph_id[16];
} dj__rep_graph;

/* ---- streamed events ---- */
typedef struct dj__ev_token {
    int32_t id;
    uint32_t index;
    bool has_text, has_logprobs;
    dj_token_logprobs lp;
    size_t text_len;
    char *text;               /* [text_len] (inside the event's allocation) */
} dj__ev_token;

typedef struct dj__ev_done {
    uint32_t n_prompt, n_generated, pos;
    const char *reason;       /* a static string (dj_gen_finish_name) */
    bool has_stop_id;
    int64_t stop_id;
    uint64_t cached;
    double queue_ms, prefill_ms, ttft_ms, decode_ms;
    size_t text_len;
    char text[256];           /* the text held back at the end (text_len 0: none) */
} dj__ev_done;

typedef struct dj__ev_error {
    dj_status st;
    bool close_after;
    char msg[1024];           /* raw: scrubbed when encoded */
} dj__ev_error;

typedef enum dj__ev_kind {
    DJ__EV_REPLY,  /* a REPLY frame: u by req_type */
    DJ__EV_TOKEN,
    DJ__EV_DONE,
    DJ__EV_ERROR,
    DJ__EV_CREDIT, /* no frame: prompt bytes of the connection tokenized (or refused) */
    DJ__EV_STATE   /* no frame: the session's state (a swap ended) */
} dj__ev_kind;

/* One message of the worker's to the I/O side (its mailbox: dj__server.events). */
typedef struct dj__event {
    struct dj__event *next;
    dj__ev_kind kind;
    uint16_t req_type;        /* the request it answers */
    uint64_t conn, req;
    uint64_t credit;          /* DJ__EV_CREDIT */
    uint64_t session;         /* the session its request named (0: none) */
    bool counted;             /* its request was counted in the session's lease (REPLY, ERROR, DONE end it) */
    uint32_t handle_quota;    /* STEP: result handles its connection reserved for it (its end gives them back) */
    bool has_state;           /* pos and swapped are the session's as the event was made */
    uint32_t pos;
    bool swapped;
    bool gone;                /* DJ__EV_STATE: the worker closed the session itself (its KV on disk was lost) */
    uint64_t renewed;         /* a portal's HEARTBEAT reply: the leases it renewed (submit.h) */
    union {
        dj__rep_open open;
        dj__rep_export exp;
        dj__rep_step step;
        dj__rep_model model;
        dj__rep_model_list list;
        dj__stats_snap stats;
        dj__rep_graph graph;
        dj__ev_token token;
        dj__ev_done done;
        dj__ev_error error;
    } u;
} dj__event;

/* A zeroed event (extra bytes after it, for a token's text); NULL when out of memory. */
dj__event *dj__event_new(dj__ev_kind kind, uint64_t conn, uint16_t req_type, uint64_t req, size_t extra);
/* An ERROR event: msg (NULL or "": dj_strerror(st)) copied. */
dj__event *dj__event_error(uint64_t conn, uint16_t req_type, uint64_t req, dj_status st, const char *msg,
                           bool close_after);
void dj__event_clear(dj__event *e); /* frees what its members hold (the struct stays) */
void dj__event_free(dj__event *e);  /* NULL does nothing */

#endif
