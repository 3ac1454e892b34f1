/* sched.h: djinnd's scheduling policy as a module - queues per QoS class,
 * admission against the data segment's pages, batch assembly, preemption,
 * and the decisions that move a session's KV between the data segment and
 * the host swap pool. It takes events and returns decisions; it owns no
 * engine, takes no lock and reads no clock (every call is given `now`), so it
 * is tested alone on a virtual clock (tests/test_sched.c). One thread uses it.
 *
 * Objects are named by the caller's ids: sessions by a nonzero u64, requests
 * by a nonzero u64 (djinnd uses the job's address). Page counts are the
 * caller's truth, reported after every engine operation (dj_sched_pages).
 *
 * Memory rule: every admitted request holds a reservation - the pages its
 * session needs to finish it (prompt + max new tokens, capped by the
 * context). A request is admitted only if every resident session's
 * max(held, reserved) still fits the data segment, so a running generation
 * never runs out of pages. When one does not fit, paused and idle sessions
 * are swapped out (least recently stepped first) while the pool has room;
 * else the request waits in its queue. Only a request larger than the whole
 * data segment is refused.
 *
 * Groups (a session's `conn`: djinnd's token) have quotas: quota_pages of
 * the data segment and pool_quota_pages of the pool. A request that waits
 * only for its own group's quota holds back no other group's requests.
 *
 * Disk tier (disk_pages > 0, semantic policy): when the pool has no room for
 * a session to swap out, the swapped session in the pool wanted furthest
 * ahead (a paused one's expected end; none expected counts as never) is
 * spilled to disk first (DJ_SCHED_SPILL); a session on disk comes back with a
 * plain SWAP_IN (the caller reads it back), prefetched ahead of its expected
 * end by its pages times disk_page_ms. */
#ifndef DJINN_SCHED_H
#define DJINN_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"

#define DJ_SCHED_CLASSES 3     /* 0 realtime, 1 interactive, 2 batch (dj_qos_rank of a dj_qos) */
#define DJ_SCHED_MAX_BATCH 64  /* generations in one step */

typedef enum dj_swap_policy {
    DJ_SWAP_SEMANTIC = 0, /* paused/idle sessions swapped out when memory is needed; a PAUSE with
                           * expected_ms is brought back ahead of its expected end */
    DJ_SWAP_REACTIVE,     /* KV stays resident; new work waits for memory */
    DJ_SWAP_RECOMPUTE     /* KV dropped at PAUSE; the caller re-prefills the session's history */
} dj_swap_policy;
const char *dj_swap_policy_name(dj_swap_policy p);
dj_status dj_swap_policy_parse(const char *s, dj_swap_policy *p /* OUT */);

typedef struct dj_sched_config {
    uint32_t max_running;  /* generations stepping at once (all classes); >= 1 */
    uint32_t max_rows;     /* token rows of one step; >= 1 */
    uint32_t pages_total;  /* data segment pages */
    uint64_t pool_pages;   /* host swap pool in pages (0: nothing is swapped) */
    uint32_t idle_ms;      /* no request for this long: idle (a swap candidate) */
    uint32_t lifo_age_ms;  /* batch-class overload serves newest first unless the oldest waited this long */
    uint64_t quota_pages;  /* pages one connection's sessions may hold or reserve (0: none) */
    double page_in_ms;     /* estimated ms to bring one page back (prefetch lead); updated by dj_sched_rate */
    dj_swap_policy policy;
    uint64_t pool_quota_pages; /* host swap pool pages one connection group's (token's) sessions may hold
                                * (0: none): past it its sessions are not swapped out, so its own work
                                * waits (or its KV is dropped, recompute) and other groups keep the rest */
    uint64_t disk_pages;   /* the disk tier below the pool, in pages (0: none) */
    double disk_page_ms;   /* estimated ms to read one page back from disk (0: 4 x page_in_ms); dj_sched_disk_rate */
    uint64_t graph_bytes;       /* captured-graph runs (DJ_REQ_GRAPH): planned bytes admitted at once (0: no bound) */
    uint64_t graph_quota_bytes; /* ... of them one group (token) may hold at once (0: none) */
} dj_sched_config;

typedef struct dj_sched dj_sched_t;

/* What a request is to the policy. */
typedef enum dj_sched_kind {
    DJ_REQ_CTRL = 0, /* no KV needed (open, close, stats, models): never waits for memory */
    DJ_REQ_STEP,     /* one engine call on a session: needs it resident and `need` pages */
    DJ_REQ_GEN,      /* a generation: admitted once, then stepped until it ends */
    DJ_REQ_GRAPH     /* a captured graph's run (dj_sched_arrive_graph): no KV; admitted by its planned bytes */
} dj_sched_kind;

/* Where a session's KV is, and what it is doing. */
typedef enum dj_sched_state {
    DJ_SESS_RUNNING = 0, /* resident, with a request queued or admitted, or one within idle_ms */
    DJ_SESS_IDLE,        /* resident, no request for idle_ms */
    DJ_SESS_PAUSED,      /* resident, paused by its client */
    DJ_SESS_SWAPPING,    /* copies to the pool in flight (pages still held) */
    DJ_SESS_SWAPPED,     /* in the pool only */
    DJ_SESS_RESTORING,   /* pages taken again, copies back in flight (may be stepped) */
    DJ_SESS_DROPPED      /* recompute policy: KV gone, the history is re-fed on its next request */
} dj_sched_state;
const char *dj_sched_state_name(dj_sched_state s);

typedef enum dj_sched_op {
    DJ_SCHED_WAIT = 0, /* nothing to do before wake_ms (or the next event) */
    DJ_SCHED_RUN,      /* run request `req` (a CTRL or STEP, or start a GEN: then report dj_sched_gen_rows or done) */
    DJ_SCHED_STEP,     /* one engine step of the admitted generations reqs[0..n) (one model) */
    DJ_SCHED_SWAP_OUT, /* start copying session `sess` to the pool (report dj_sched_swapped) */
    DJ_SCHED_SWAP_IN,  /* bring session `sess` back (report dj_sched_swapped) */
    DJ_SCHED_DROP,     /* recompute policy: free session `sess`'s KV (report dj_sched_pages 0) */
    DJ_SCHED_REFUSE,   /* request `req` can never fit: answer it with dj_sched_refuse_reason, then forget it */
    DJ_SCHED_SPILL     /* move swapped session `sess` from the pool to the disk tier (report dj_sched_spilled) */
} dj_sched_op;

typedef struct dj_sched_decision {
    dj_sched_op op;
    uint64_t req, sess;
    uint64_t reqs[DJ_SCHED_MAX_BATCH];
    uint32_t n;
    uint64_t wake_ms; /* WAIT: the next time something is due (UINT64_MAX: only an event) */
} dj_sched_decision;

dj_status dj_sched_new(const dj_sched_config *cfg, dj_sched_t **out /* OUT */);
void dj_sched_free(dj_sched_t *s);
const dj_sched_config *dj_sched_get_config(const dj_sched_t *s);

/* ---- events ---- */

/* A session exists (resident, no pages). `conn` groups sessions for the
 * quota; its KV takes `block_pages` pages per `block_tokens` positions, up to
 * max_ctx positions. */
typedef struct dj_sched_session_info {
    uint64_t conn;
    uint32_t qos;
    uint32_t block_tokens, block_pages, max_ctx;
} dj_sched_session_info;
dj_status dj_sched_session_open(dj_sched_t *s, uint64_t sess, const dj_sched_session_info *info, uint64_t now);
/* A session is gone: its queued requests are forgotten (the caller answers them). */
void dj_sched_session_close(dj_sched_t *s, uint64_t sess);
/* Pages the session holds now and its position (after a step, a swap, a
 * drop: a dropped session keeps its position, the history to re-feed). */
void dj_sched_pages(dj_sched_t *s, uint64_t sess, uint32_t held, uint32_t pos);
/* A request arrives. sess 0 for connection-level CTRL requests; `model` groups
 * generations into steps; `tokens`: positions it adds to its session (STEP:
 * its ids; GEN: prompt + max new tokens), capped by the context - its page
 * need is computed when it is admitted, from the position then. One STEP/GEN
 * per session is admitted at a time; the next waits behind it. DJ_EBUSY if
 * the id is known. */
dj_status dj_sched_arrive(dj_sched_t *s, uint64_t req, uint64_t sess, uint32_t qos, dj_sched_kind kind,
                          uint64_t model, uint32_t tokens, uint64_t now);
/* A captured graph's run arrives (GRAPH_RUN): `bytes` its plan's stack and outputs, `group` whose
 * quota it counts against (djinnd: the caller's token). In its class's line it is admitted (then
 * RUN) while the admitted runs' bytes stay within graph_bytes and its group's within
 * graph_quota_bytes; one that waits for graph_bytes holds back the graph runs behind it (its
 * class's and lower ones), one that waits for its group's quota no other group's. One larger than
 * either bound is refused (REFUSE; the reason names the bytes). Its bytes are held until
 * dj_sched_done. DJ_EBUSY if the id is known. */
dj_status dj_sched_arrive_graph(dj_sched_t *s, uint64_t req, uint64_t group, uint32_t qos, uint64_t bytes, uint64_t now);
/* A RUN or STEP ended request `req` (answered, failed or finished): its reservation goes. */
void dj_sched_done(dj_sched_t *s, uint64_t req, uint64_t now);
/* A started GEN goes on: its next step feeds `rows` token rows; `rides`:
 * those rows may share a step with other generations. */
void dj_sched_gen_rows(dj_sched_t *s, uint64_t req, uint32_t rows, bool rides);
/* The client paused (expected_ms 0: unknown) or resumed a session. */
void dj_sched_pause(dj_sched_t *s, uint64_t sess, uint64_t expected_ms, uint64_t now);
void dj_sched_resume(dj_sched_t *s, uint64_t sess, uint64_t now);
/* A swap the scheduler asked for: started (ok false: it could not start,
 * the session stays as it was) or completed (`held` pages now). */
void dj_sched_swap_started(dj_sched_t *s, uint64_t sess, bool ok);
void dj_sched_swapped(dj_sched_t *s, uint64_t sess, uint32_t held);
/* A measured host->device rate: ms per page (for prefetch timing). */
void dj_sched_rate(dj_sched_t *s, double page_in_ms);
/* A SPILL the scheduler asked for is done (ok) or failed (the session stays
 * in the pool and is not picked to spill again). */
void dj_sched_spilled(dj_sched_t *s, uint64_t sess, bool ok);
/* A swapped session's KV could not be brought back (its pages on disk are
 * corrupt): it is DROPPED - its next request is admitted and the caller
 * feeds its history again first (the recompute policy's path). */
void dj_sched_kv_lost(dj_sched_t *s, uint64_t sess);
/* A measured disk read rate: ms per page. */
void dj_sched_disk_rate(dj_sched_t *s, double page_ms);

/* ---- decisions ---- */

/* The next thing to do. Call again after carrying it out (and reporting). */
void dj_sched_next(dj_sched_t *s, uint64_t now, dj_sched_decision *d /* OUT */);
/* Why REFUSE refused (valid until the next call). */
const char *dj_sched_refuse_reason(const dj_sched_t *s);

/* ---- reading ---- */

typedef struct dj_sched_stats {
    uint32_t pages_total, pages_held, pages_reserved; /* reserved: beyond held, for admitted requests */
    uint64_t pool_pages, pool_used;
    uint32_t sessions[DJ_SESS_DROPPED + 1];           /* by state */
    /* per class: running = generations stepping; waiting = every other request held (queued,
     * admitted while its session is restored, or preempted - preempted counts those of all classes) */
    uint32_t waiting[DJ_SCHED_CLASSES], running[DJ_SCHED_CLASSES], preempted;
    uint64_t swaps_out, swaps_in, drops, prefetches, preemptions, refused;
    uint64_t disk_pages, disk_used;                   /* the disk tier's pages, and those sessions hold */
    uint32_t on_disk;                                 /* swapped sessions whose KV is on disk (of sessions[SWAPPED]) */
    uint64_t spills, recoveries;                      /* sessions moved pool -> disk; KV lost and recomputed */
    uint64_t graph_bytes, graph_used;                 /* the bound on captured runs' planned bytes, and admitted ones' */
} dj_sched_stats;
void dj_sched_get_stats(const dj_sched_t *s, uint64_t now, dj_sched_stats *st /* OUT */);
dj_sched_state dj_sched_session_state(const dj_sched_t *s, uint64_t sess, uint64_t now);
/* DJ_EINTERNAL naming the first broken invariant (page sums, pool bounds, queue membership). */
dj_status dj_sched_check(const dj_sched_t *s);

#endif
