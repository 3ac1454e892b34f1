/* engine_impl.h: the engine's private structure (engine.c, engine_load.c,
 * session.c) and hooks - a step paused at chosen nodes (intervene.c), traced
 * steps' buffers, the KV store for tests. Private to src/exec/. */
#ifndef DJ_ENGINE_IMPL_H
#define DJ_ENGINE_IMPL_H

#include "djinn/engine.h"
#include "exec/kv_impl.h"
#include "model/model_impl.h"

/* ---- the engine (engine.c; loading in engine_load.c, sessions in session.c) ---- */

#define DJ_STEP_GRAPHS 16  /* recorded decode steps kept (least recently used replaced) */
#define DJ_TRACE_GRAPHS 4  /* of them, traced steps' (a new one replaces the least recently used of
                            * these, so clients' sets of points never push out the plain steps) */

/* A decode shape's recorded graph: new -> run eagerly once -> recorded (or
 * failed: always eager). */
enum { SG_EMPTY, SG_NEW, SG_SEEN_ONCE, SG_RECORDED, SG_FAILED };

typedef struct step_graph {
    int state;                 /* SG_* */
    uint64_t fingerprint;      /* model */
    uint32_t rows;             /* sessions per step */
    const uint8_t *text;       /* what the recording baked in: the model's text region, */
    const uint8_t *stack;      /* the step's stack base, */
    const dj_graph_t *plan;    /* the plan and */
    const uint8_t *args;       /* the step-args buffer */
    dj_backend_graph_t *graph; /* owned (SG_RECORDED) */
    int out_idx;               /* the plan's output node */
    uint64_t key;              /* a traced step's dj__step_hook.graph_key, 0 for plain steps */
    uint32_t pos_bound;        /* the step's context class (step_io.pos_bound) */
    uint64_t used;             /* LRU clock */
} step_graph;

/* $DJINN_PROFILE: per op name (the node's name without its layer), the
 * calls and wall time of eagerly run steps, each op followed by a sync - so
 * the backend's fusions (held ADD/ROPE, grouped GEMVs) do not happen and each
 * figure is the op alone. Printed to stderr when the engine is freed. */
#define DJ_PROF_NAMES 48
typedef struct prof_entry {
    char name[64]; /* phase and a node name */
    uint64_t calls;
    double sec;
} prof_entry;

/* The engine: it owns the backend, the VMU, the plan cache and the KV store
 * (which borrows the first two), and every buffer below. */
struct dj_engine {
    dj_backend_t *be;
    bool profile;              /* $DJINN_PROFILE=1 */
    bool device_sampling;      /* non-greedy picks by the backend's sample hook ($DJINN_DEVICE_SAMPLING=off: on the host) */
    bool weights_in_place;     /* $DJINN_WEIGHTS_IN_PLACE not 0 (weights_in_place) */
    bool no_graphs;            /* $DJINN_NO_GRAPHS=1: decode steps run eagerly (dj__engine_set_graphs) */
    dj_sample_row *sample_rows; /* [sample_rows_cap] host rows for the sample hook; owned */
    uint32_t sample_rows_cap;
    prof_entry prof[DJ_PROF_NAMES];
    int n_prof;
    dj_vmu_t *vmu;
    dj_plan_cache_t *plans;
    uint32_t max_step;
    /* Step args of decode steps (device memory): ids [B] int32 at 0,
     * positions [B] at off_pos, picked ids [B] at off_next, RoPE tables [B]
     * device pointers at off_freq (models with longrope's two), block tables
     * [n_layers][B] device pointers at off_tables; one copy per step from
     * args_host. Offsets depend only on B. */
    uint8_t *args_dev;         /* [args_cap] backend memory; owned */
    uint8_t *args_host;        /* [args_cap]; owned */
    size_t args_cap, off_pos, off_next, off_freq, off_tables;
    int32_t *args_next;        /* args_dev + off_next */
    step_graph graphs[DJ_STEP_GRAPHS];
    uint64_t graph_clock;
    size_t graph_captures, graph_replays, graph_failures;
    dj_chunk_times chunk_times; /* prefill chunks' host time (dj_engine_chunk_times) */
    dj_chunk_times step_times;  /* decode steps' host time (dj_engine_step_times) */
    float *host_logits;        /* [host_logits_cap] for host-side sampling; owned */
    size_t host_logits_cap;
    dj_op_call *calls;         /* [calls_cap] the step's resolved calls for compute_plan; owned */
    size_t calls_cap;
    bool prefetch;             /* streamed weights copied ahead as the ring allows (!cfg.no_prefetch) */
    int host_layers;           /* cfg.host_layers: host compute beside the stream */
    double host_share;         /* cfg.host_share */
    /* traced steps' saved points (dj__engine_trace_area) */
    uint8_t *trace_dev;        /* [trace_cap] backend memory; owned */
    uint8_t *trace_host;       /* [trace_cap] host_alloc'd (trace_pinned) or malloc'd; owned */
    bool trace_pinned;
    size_t trace_cap;
    dj__kv *kv;                /* the KV store: pages, block tables, prefix cache, swap pool (kv_impl.h); owned */
    struct dj__lora_step *lora; /* the adapters of the step being run (lora_impl.h); owned, made at first use */
};

/* The engine's KV store (kv_impl.h), for tests: its prefix cache, NULL
 * when off. */
dj__prefix *dj__engine_prefix(dj_engine_t *e);
/* The swap pool's invariants (dj__swap_pool_check) on the engine's store.
 * For tests. */
dj_status dj__swap_check(const dj_engine_t *e);

/* ---- a step paused at chosen nodes (intervene.c) ---- */

/* The executor runs the plan in segments that end at stops[0..n_stops)
 * (node indices, ascending, distinct): after the calls up to stops[k] are
 * enqueued, `at` runs with that node's buffer (device memory, n rows of
 * shape[1] elements of `dtype`; the rows past n are the bucket's padding).
 * What `at` writes there is what later nodes read. */
#define DJ__HOOK_STOPS 128 /* distinct stops of one step (intervene.c has at most DJ_IV_MAX points) */

/* A breakpoint step's held state (brk.c owns it, engine.c fills it): when
 * the hook's `at` sets pause, the executor stops after that stop, copies
 * the activations the rest of the step reads (every activation at or before
 * the stop that a later node reads) off the activation stack into `bytes`
 * (host memory), lets the stack go and returns; the session's position
 * stays. A step run again with paused set puts them back on the stack,
 * calls the hook's restore for the stop's buffer and runs the nodes after
 * it. The KV rows the layers before the stop wrote stay in the session's
 * pages (mapped past its position) until then. */
typedef struct dj__step_held {
    bool paused;
    int stop;            /* the index into the hook's stops where it stopped */
    int node;            /* that stop's plan node */
    uint32_t n;          /* the step's rows */
    uint32_t n_blocks0;  /* KV blocks the session had mapped before the step (cancel unmaps the rest) */
    int plan_count;      /* the plan it ran (checked again on resume) */
    size_t plan_peak;
    int n_live;
    int *live;           /* [n_live] plan nodes kept; owned */
    size_t *off;         /* [n_live] their offsets into bytes; owned */
    uint8_t *bytes;      /* [cap] host memory; owned */
    size_t cap, used;
    double save_s, restore_s; /* the last pause's save and the last resume's restore, wall time */
} dj__step_held;

typedef struct dj__step_hook {
    /* Called once the step's plan is known, before anything runs: sets
     * stops and n_stops (at most DJ__HOOK_STOPS) from the plan, and
     * graph_key. */
    dj_status (*prepare)(struct dj__step_hook *h, dj_engine_t *e, const dj_graph_t *g);
    dj_status (*at)(void *user, dj_engine_t *e, const dj_graph_t *g, int node, void *buf, dj_dtype dtype,
                    uint32_t n);
    /* Optional: once every call of the step is enqueued, before the engine
     * waits for the step's end (the host's work here overlaps the device's). */
    dj_status (*enqueued)(void *user, dj_engine_t *e);
    void *user;
    int stops[DJ__HOOK_STOPS];
    int n_stops;
    /* Set by prepare: 0, or a key naming what `at` does when it only
     * enqueues device work a recorded graph can hold (copies between fixed
     * device addresses, no host access). A decode step then records and
     * replays a graph under (shape, key); `at` runs while it is recorded
     * and not when it is replayed. */
    uint64_t graph_key;
    /* Breakpoints (brk.c; NULL/false on other steps): `at` sets pause to
     * stop the step after its stop (see dj__step_held); on resume, restore
     * runs with the stop's buffer back on the stack, before the nodes after
     * it, and writes the point's value there. */
    dj__step_held *held;
    bool pause;
    dj_status (*restore)(void *user, dj_engine_t *e, const dj_graph_t *g, int node, void *buf, dj_dtype dtype,
                         uint32_t n);
} dj__step_hook;

/* engine.c: one step of n <= max_step_tokens ids (a decode step for n == 1,
 * replaying a recorded graph only under the hook's graph_key; else one
 * prefill chunk) with the hook; logits (optional) receives the last
 * position's [vocab]. All or nothing as dj_session_step. */
dj_status dj__session_step_hooked(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                  float *logits /* OUT, [vocab] or NULL */, dj__step_hook *hook);

/* engine.c: a breakpoint step (hook->held set) of 1 <= n <= max_step_tokens
 * ids, always one prefill chunk: runs to its end (held->paused false
 * after, the session advanced) or to a stop whose `at` sets pause
 * (held->paused true, the session where it was). With held->paused set on
 * entry it resumes: ids must be the same. */
dj_status dj__session_step_held(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                float *logits /* OUT, [vocab] or NULL */, dj__step_hook *hook);
/* engine.c: frees held's buffers; with s (a cancelled step: s is the
 * session it paused on) the KV blocks mapped since the step began are
 * unmapped too (where the session is resident; swapped, they stay mapped
 * and are overwritten later), so the session is as before the step. */
void dj__session_step_drop(dj_engine_t *e, dj_session_t *s, dj__step_held *held);

/* engine.c: decode steps recorded as graphs where the backend can (on, the
 * default unless $DJINN_NO_GRAPHS=1 when the engine was made) or run eagerly
 * (off): tests compare the two on one engine. */
void dj__engine_set_graphs(dj_engine_t *e, bool on);

/* engine.c: the element type node i of g has on the engine's backend (what
 * `at` receives as dtype). */
dj_dtype dj__engine_node_dtype(const dj_engine_t *e, const dj_graph_t *g, int i);

/* engine.c: the engine's buffers for traced steps' saved points, at least
 * `bytes` each: *dev in device memory, *host in host memory, from the
 * backend's host_alloc (*pinned true: its transfers may reach it) or
 * malloc. Kept by the engine and grown on demand (growing drops the
 * recorded graphs, which may hold the old address); valid until the next
 * call or dj_engine_free. */
dj_status dj__engine_trace_area(dj_engine_t *e, size_t bytes, uint8_t **dev /* OUT */, uint8_t **host /* OUT */,
                                bool *pinned /* OUT */);

#endif
