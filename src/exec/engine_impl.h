/* engine_impl.h: the engine's private hooks - a step paused at chosen nodes
 * (intervene.c), traced steps' buffers, the KV store for tests. Private to
 * src/exec/. */
#ifndef DJ_ENGINE_IMPL_H
#define DJ_ENGINE_IMPL_H

#include "djinn/engine.h"
#include "exec/kv_impl.h"
#include "model/model_impl.h"

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
