/* engine_impl.h: the engine's private session structure and the hooks
 * between the executor (engine.c) and the KV swap (swap.c). Private to
 * src/exec/. */
#ifndef DJ_ENGINE_IMPL_H
#define DJ_ENGINE_IMPL_H

#include "djinn/engine.h"
#include "model/model_impl.h"

typedef struct dj_swap_pool dj_swap_pool;
typedef struct dj__swap_op dj__swap_op;
typedef struct dj__prefix dj__prefix;
typedef struct dj__pblock dj__pblock;

struct dj_session {
    dj_model_t *model;        /* holds one model reference */
    dj_vmu_session_t *vs;
    uint32_t pos;             /* tokens in the cache */
    uint32_t max_ctx;
    bool rope_long;           /* rotates with longrope's long factors (max_ctx > the model's
                               * rope_original_max_pos), from its first position on */
    uint32_t tokens_per_page;
    uint32_t max_blocks;      /* per layer */
    uint32_t n_blocks;        /* blocks mapped in every layer (kept while swapped) */
    uint32_t *block_table;    /* [n_layers][max_blocks] page ids (DJ__NO_PAGE while swapped) */
    dj_kv_view *kv;           /* [n_layers] */
    uint32_t *table_dev;      /* [n_layers][max_blocks] device mirror of block_table (owned), or
                               * block_table itself where device memory is host memory */
    uint32_t dev_blocks;      /* blocks of every layer copied to table_dev (0 after a restore:
                               * the whole table goes up again before the next step) */
    dj_sampler_t *sampler;    /* host sampler for non-greedy picks, made for `sp`; owned */
    dj_sampler_params sp;
    /* KV swap (swap.c) */
    dj_kv_residency residency;
    uint32_t *slots;          /* [n_slots] pool slot of KV page i = l * swap_blocks + b; owned;
                               * set while SWAPPING_OUT, SWAPPED and RESTORING */
    uint32_t n_slots;         /* n_layers * swap_blocks */
    uint32_t swap_blocks;     /* n_blocks when it was swapped out */
    dj__swap_op *op;          /* its transfer in flight, or NULL */
    bool ordered;             /* RESTORING: later compute already waits for the copies */
    dj_session_t *pool_prev, *pool_next; /* sessions holding pool slots */
    size_t quota_pages;       /* 0 = none: KV pages mapped, private and shared (the VMU counts private ones) */
    /* prefix cache (prefix.c): full blocks of known tokens are published and
     * shared; the block being filled is private, so no shared page is written */
    dj__pblock **pfx;         /* [max_blocks] the cached block mapped at b (one reference), or NULL: private */
    int32_t *pfx_ids;         /* [tokens_per_page] ids of the block being filled */
    uint32_t pfx_n;           /* of them */
    uint32_t pfx_full;        /* full blocks the chain covers: pfx_full * tokens_per_page + pfx_n == pos */
    uint64_t pfx_key[2];      /* chain key after pfx_full blocks (the root: model, KV layout and pfx_salt) */
    uint64_t pfx_salt[2];     /* the tenant's cache salt (dj_session_set_cache_salt; {0, 0}: none) */
    bool pfx_off;             /* not tracked: no cache, or a traced step made KV that is not the ids' alone */
};

/* engine.c: the engine's swap pool pointer (NULL: none). */
dj_swap_pool **dj__engine_swap_pool(dj_engine_t *e);

/* swap.c, for engine.c: */
/* Before a step of s: DJ_EBUSY while SWAPPING_OUT or SWAPPED; a RESTORING
 * session's later compute is made to wait for its copies. */
dj_status dj__swap_before_step(dj_engine_t *e, dj_session_t *s);
/* dj_session_free's first part: waits for s's transfer and releases its
 * pool slots (its pages are the VMU's to free). */
void dj__swap_session_release(dj_engine_t *e, dj_session_t *s);
/* dj_engine_free's: waits for every transfer, frees the pool. */
void dj__swap_pool_free(dj_engine_t *e);
/* Checks the pool's invariants: every slot free xor held by exactly one
 * holder (a session on the holder list or a cancelled transfer), counts
 * consistent, each holder's residency and VMU pages matching. DJ_EINTERNAL
 * with the first broken one. For tests. */
dj_status dj__swap_check(const dj_engine_t *e);

/* ---- prefix cache (prefix.c) ---- */

/* engine.c: the engine's cache, NULL when off. */
dj__prefix *dj__engine_prefix(dj_engine_t *e);
dj_status dj__prefix_new(dj_engine_t *e, dj__prefix **out /* OUT */);
/* Frees every block (sessions must have released theirs) and its pages. */
void dj__prefix_free(dj_engine_t *e, dj__prefix *c);
/* The chain's root key of s: model fingerprint and KV layout. */
void dj__prefix_root(const dj_session_t *s, uint64_t key[2] /* OUT */);
/* After s's position went up by n (ids fed, a step done): blocks filled are
 * published (s keeps a reference) unless cached already. c may be NULL. */
void dj__prefix_fed(dj_engine_t *e, dj__prefix *c, dj_session_t *s, const int32_t *ids, uint32_t n);
/* Maps the cached full blocks that ids[0..n) (to be fed at s's position,
 * a block boundary) start with, leaving at least one id; *mapped: ids
 * skipped (s's position went up by as many). */
dj_status dj__prefix_map(dj_engine_t *e, dj__prefix *c, dj_session_t *s, const int32_t *ids, uint32_t n,
                         uint32_t *mapped /* OUT */);
/* s stops mapping block b (its page entries are the caller's to reset). */
void dj__prefix_unshare(dj__prefix *c, dj_session_t *s, uint32_t b);
/* Drops every reference of s. */
void dj__prefix_session_release(dj__prefix *c, dj_session_t *s);
/* Blocks of s mapped from the cache (their pages are not in s->vs). */
uint32_t dj__prefix_shared_blocks(const dj_session_t *s);
/* Frees the least recently used unreferenced block: false if there is none. */
bool dj__prefix_evict(dj_engine_t *e, dj__prefix *c);
void dj__prefix_stats(const dj__prefix *c, dj_prefix_stats *st /* OUT */);
/* Invariants against the live sessions given (all of them): references
 * counted = recorded, LRU = unreferenced blocks, pages held = the VMU's,
 * sessions' tables pointing at their blocks' pages. For tests. */
dj_status dj__prefix_check(const dj__prefix *c, dj_session_t *const *sessions, size_t n_sessions);

/* ---- a step paused at chosen nodes (intervene.c) ---- */

/* The executor runs the plan in segments that end at stops[0..n_stops)
 * (node indices, ascending, distinct): after the calls up to stops[k] are
 * enqueued, `at` runs with that node's buffer (device memory, n rows of
 * shape[1] elements of `dtype`; the rows past n are the bucket's padding).
 * What `at` writes there is what later nodes read. */
#define DJ__HOOK_STOPS 128 /* distinct stops of one step (intervene.c has at most DJ_IV_MAX points) */
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
} dj__step_hook;

/* engine.c: one step of n <= max_step_tokens ids (a decode step for n == 1,
 * replaying a recorded graph only under the hook's graph_key; else one
 * prefill chunk) with the hook; logits (optional) receives the last
 * position's [vocab]. All or nothing as dj_session_step. */
dj_status dj__session_step_hooked(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                  float *logits /* OUT, [vocab] or NULL */, dj__step_hook *hook);

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
