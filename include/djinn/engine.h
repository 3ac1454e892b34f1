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
#include "djinn/kv.h"
#include "djinn/sampler.h"
#include "djinn/status.h"
#include "djinn/vmu.h"

typedef struct dj_engine dj_engine_t;
typedef struct dj_model dj_model_t;

typedef struct dj_engine_config {
    const char *device;       /* "cpu" (default when NULL) */
    int n_threads;            /* CPU threads, 0 = every core */
    dj_vmu_config vmu;        /* budget and segment ratios. total_bytes 0: sized from the
                               * machine (dj_engine_vmu_auto_bytes); fractions all 0 then
                               * take dj_vmu_config_default's (page_bytes 0: 64 KiB). With
                               * f8 K/V a power-of-two page_bytes grows by
                               * DJ_KV_F8_PAGE_EXTRA (backend.h) for the pages' exponents */
    uint32_t max_step_tokens; /* largest prefill chunk (shape bucket cap); 0 = 512 */
    bool deterministic;       /* a row's logits bit-identical alone and in any decode batch
                               * (steps of up to DJ_DETERMINISTIC_MAX_ROWS rows). The CPU is
                               * so always; CUDA then takes its GEMV for every such matmul
                               * instead of cuBLAS above 8 rows (slower at large batches) */
    bool no_prefetch;         /* streamed weights (a model larger than the text segment's room)
                               * are copied only when compute reaches them, not ahead: the
                               * ablation of prefetch; results are the same */
    int host_layers;          /* host compute beside the stream (steps of few rows): streamed
                               * layers whose FFN the host's cores run from the mapped weights.
                               * 0: as many as rates measured at load say pay (none where the
                               * device's memory is the host's); -1: none, everything streams;
                               * k > 0: k of them, at steps of up to 16 rows (ablations, tests) */
    double host_share;        /* of each such layer's FFN width, the share the host computes while
                               * the device computes the rest from the ring, at the same time.
                               * 0: from the rates measured at load (the whole FFN when k is
                               * forced); in (0, 1]: that share, rounded to 16 columns (1: the
                               * whole FFN on the host, the device waiting for it) */
    bool no_prefix_cache;     /* full KV blocks are not shared between sessions by content
                               * (the kill switch of the prefix cache; results are the same) */
    const char *kv_dtype;     /* K/V pages: NULL or "auto" the backend's activation dtype (f32 on
                               * the CPU, bf16 on CUDA); "fp8" f8_e4m3 with a power-of-two scale
                               * per page and head (backend.h): twice the tokens of bf16 */
} dj_engine_config;

/* The K/V dtype an engine_config's kv_dtype names on a GPU (gpu) or the CPU;
 * DJ_EINVAL with the accepted names otherwise. */
dj_status dj_kv_dtype_parse(const char *name, bool gpu, dj_dtype *out /* OUT */);

dj_status dj_engine_new(const dj_engine_config *cfg, dj_engine_t **out /* OUT */);
void dj_engine_free(dj_engine_t *e); /* NULL does nothing; sessions/models must be released first */

/* ---- memory sized from the machine ---- */

/* Host memory the system could give now without swapping: MemAvailable of
 * /proc/meminfo, else sysconf's available pages. DJ_EUNSUPPORTED if neither
 * says. */
dj_status dj_host_mem_available(size_t *bytes /* OUT */);

/* The VMU size dj_engine_new takes when cfg.vmu.total_bytes is 0, for a
 * backend whose device memory reports `dev_free` of `dev_total` bytes (a GPU:
 * cudaMemGetInfo after the context exists), or, with dev_total 0, for a
 * host-memory backend given `host_avail` bytes of available RAM:
 *  - device: dev_free less a margin of max(1 GiB, 5% of dev_total), for what
 *    the backend allocates beside the VMU (cuBLAS workspace, staging, attention
 *    scratch, recorded graphs, per-session tables: tens to hundreds of MiB)
 *    and for other processes' growth on a shared GPU; 0 if nothing is left;
 *  - host: half of host_avail: the other half stays for the swap pool, the
 *    page cache a model's first load reads through, and the rest of the
 *    system.
 * Rounded down to 1 MiB. */
size_t dj_engine_vmu_auto_bytes(size_t dev_free, size_t dev_total, size_t host_avail);

/* The default swap pool size for this engine: a share of the host memory
 * available now - half on a device backend (the pool is pinned, so it cannot
 * be paged out: the other half stays for the page cache, which model loading
 * reads through, and the system), a quarter on a host-memory backend (its VMU
 * took its share of the same RAM). 0 when the machine does not say. Rounded
 * down to 1 MiB. */
size_t dj_engine_swap_default_bytes(const dj_engine_t *e);

dj_vmu_t *dj_engine_vmu(dj_engine_t *e);
dj_backend_t *dj_engine_backend(dj_engine_t *e);

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

/* Where a model's weights live (docs/internals.md, "Models larger than
 * the GPU"): all resident in the text segment, or some layers streamed
 * through a ring there from host memory on every step. */
typedef struct dj_model_placement {
    uint32_t n_layers, n_streamed;
    uint32_t ring_layers;     /* layers the ring holds at once (0: nothing streams) */
    size_t resident_bytes;    /* text bytes of the resident weights */
    size_t ring_bytes;        /* text bytes of the ring */
    size_t streamed_bytes;    /* bytes each step copies */
    const char *source;       /* where copies read: "registered" (the mapped checkpoint, page-locked),
                               * "pinned copy", "mapped" (host memory is the device's); "" if none */
    uint64_t steps;           /* streamed steps run so far */
    uint32_t n_host;          /* streamed layers whose FFN the host computes at small batches */
    uint32_t host_rows;       /* ... at steps of at most this many rows */
    double host_share;        /* of each such FFN's width, the host's share (1: all of it) */
    double copy_gbps, host_gbps; /* the rates that decided it, measured at load (0: not measured) */
    uint64_t host_steps;      /* steps that ran FFNs on the host */
    uint64_t copied_bytes;    /* bytes the streamed steps copied into the ring so far */
    char layers[1024];        /* one letter per layer: R resident, S streamed, H streamed with its FFN
                               * on the host at small batches, h with a share of it there and the
                               * rest on the device (truncated past 1023) */
} dj_model_placement;
void dj_model_get_placement(const dj_model_t *m, dj_model_placement *out /* OUT */);
/* The placement a load into `text_room` free text bytes would give the
 * checkpoint (nothing is loaded): DJ_ENOSPC with the sizes when it cannot
 * run even streamed. */
dj_status dj_model_plan_placement(const dj_checkpoint_t *ck, size_t text_room, dj_model_placement *out /* OUT */);

/* A session: private KV pages for up to max_ctx positions (0 = the model's
 * max_position_embeddings), quota_pages as in the VMU (0 = none). Holds a
 * model reference until freed. */
dj_status dj_session_new(dj_engine_t *e, dj_model_t *m, uint32_t max_ctx, size_t quota_pages,
                         dj_session_t **out /* OUT */);
/* Returns every page and pool slot, in any residency (waiting on the host
 * for copies in flight first); NULL does nothing. */
void dj_session_free(dj_engine_t *e, dj_session_t *s);
uint32_t dj_session_pos(const dj_session_t *s);         /* tokens in the KV cache */

/* ---- prefix cache: full KV blocks shared by content ----
 * Every full block of a session's KV (tokens_per_page positions, all layers)
 * whose tokens are known from position 0 is published under a hash chain of
 * its tokens (rooted in the model's fingerprint and KV layout); a session
 * about to feed ids at a block boundary maps the cached blocks those ids
 * start with (read-only, refcounted) instead of computing them. Only full
 * blocks are shared: the block a session writes is always its own. Blocks
 * no session maps stay cached and are the first pages taken back when a
 * session needs pages. A swapped-out session drops its references (its copy
 * comes back private). A traced step (intervene.h) stops publishing for that
 * session. */
/* Maps the cached blocks ids[0..n) start with (ids to be fed next at s's
 * position; at least one id is always left to feed); *mapped: how many ids
 * are now in the cache (the session's position went up by as many; feed only
 * ids + *mapped). 0 when the cache is off, the position is not at a block
 * boundary, or nothing is cached. */
dj_status dj_session_map_prefix(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                uint32_t *mapped /* OUT */);
/* The session's cache salt: its chain of block keys starts from the model's
 * root mixed with salt, so only sessions of equal salts share blocks
 * ({0, 0}, a new session's: every session of the engine shares). The server
 * salts per tenant (docs/prefix-cache.md). Set before anything is fed:
 * DJ_EBUSY once the session has a position. */
dj_status dj_session_set_cache_salt(dj_session_t *s, const uint64_t salt[2]);
void dj_session_cache_salt(const dj_session_t *s, uint64_t salt[2] /* OUT */);
void dj_engine_prefix_stats(const dj_engine_t *e, dj_prefix_stats *st /* OUT */);
uint32_t dj_session_max_ctx(const dj_session_t *s);
/* Whether s rotates with longrope's long factors: its model has them and
 * max_ctx exceeds its original_max_position_embeddings (then from position 0
 * on, so its cached keys never change rotation; as llama.cpp decides by the
 * context per sequence). A session within that range uses the short ones, as
 * transformers does for a sequence that fits it. */
bool dj_session_rope_long(const dj_session_t *s);
const dj_model_t *dj_session_model(const dj_session_t *s); /* valid while the session is */

/* Feed n token ids at the session's position (prefill when n > 1, decode when
 * n == 1; long inputs are split into chunks of max_step_tokens). If logits is
 * not NULL it receives the [vocab] logits of the last position. On error the
 * session's position is unchanged. Ids are validated against the vocabulary;
 * going past max_ctx is DJ_ERANGE; a session SWAPPING_OUT or SWAPPED is
 * DJ_EBUSY (every step function below says the same). */
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

/* ---- KV swap: a session's pages to a host pool and back (residency and
 * the pool's counters: kv.h) ---- */

/* A host swap pool of pool_bytes (rounded down to whole data-segment pages):
 * pinned through the backend's host_alloc where it has one (CUDA:
 * cudaHostAlloc), else plain memory. 0 = no pool (swap_out then fails
 * DJ_ENOSPC). May be called again only while the pool holds nothing and no
 * disk tier sits below it (DJ_EBUSY otherwise); DJ_ENOMEM (nothing changed)
 * if the memory cannot be had. */
dj_status dj_engine_swap_init(dj_engine_t *e, size_t pool_bytes);
void dj_engine_swap_stats(const dj_engine_t *e, dj_swap_stats *st /* OUT */);

/* Start copying every page of a RESIDENT session to pool slots, ordered
 * after all compute issued so far (CUDA: on the copy stream, overlapping
 * later compute; the CPU: a memcpy, done at once). The pages return to the
 * data segment when the copies have completed (dj_engine_swap_poll sees it;
 * on the CPU at once). A session with no pages becomes SWAPPED at once. A
 * SWAPPING_OUT or SWAPPED session: DJ_OK, nothing to do. A RESTORING one:
 * DJ_EBUSY (poll until it is resident). DJ_ENOSPC if the pool cannot hold
 * the pages (or there is no pool): nothing changes, it stays resident. */
dj_status dj_session_swap_out(dj_engine_t *e, dj_session_t *s);

/* Bring a SWAPPED session back: take free pages (any: the page tables are
 * rewritten) and start the H2D copies; the session may be stepped at once
 * (its compute waits for the copies on the device). DJ_ENOSPC if the data
 * segment has too few free pages, DJ_EQUOTA past the session's quota
 * (nothing changes either way). A SWAPPING_OUT session is cancelled instead:
 * its pages never left, so it is RESIDENT at once with no copy; the copies in
 * flight finish into pool slots that are released when poll sees them done
 * (counted in used until then). RESIDENT or RESTORING: DJ_OK, nothing to
 * do. A session on the disk tier is read back here, blocking, every page
 * checked: RESIDENT at once, or DJ_EIO (a page failed its checksum or could
 * not be read; it stays on disk, its KV lost - kv.h). */
dj_status dj_session_swap_in(dj_engine_t *e, dj_session_t *s);

/* Non-blocking: completes the transfers that have finished - frees the pages
 * of finished swap-outs (SWAPPING_OUT -> SWAPPED) and the pool slots of
 * finished swap-ins (RESTORING -> RESIDENT) and of cancelled swap-outs. A
 * device failure is logged and the transfer left in flight. Nothing to do
 * without a pool. */
void dj_engine_swap_poll(dj_engine_t *e);

/* The disk tier (kv.h says what it is): a page file of `bytes` (rounded
 * down to whole pages) in the directory `dir`, written and read by `threads`
 * I/O threads (0: 4). The file is kv-pages.djinn; made (and its space
 * reserved) if absent, taken over if it is a page file of this version and
 * page size that no other process holds (flock). Clear errors, nothing
 * written: DJ_ENOTFOUND `dir` missing or not a directory, DJ_EIO not
 * writable or the file not reservable (a full disk says how much is free),
 * DJ_EFORMAT the file is not a Djinn page file or of another version or page
 * size, DJ_EBUSY another daemon holds it or sessions are on disk now. 0 bytes
 * closes the tier (only while no session is on disk). */
dj_status dj_engine_disk_init(dj_engine_t *e, const char *dir, size_t bytes, uint32_t threads);
void dj_engine_disk_stats(const dj_engine_t *e, dj_disk_stats *st /* OUT */);

/* Moves a SWAPPED session's pool copy to the disk tier (blocking: the I/O
 * threads write it and the calling thread waits), then frees its pool
 * slots. A session already on disk: DJ_OK. Not SWAPPED (or still in
 * flight): DJ_EBUSY. No tier or too few free disk slots: DJ_ENOSPC; a write
 * that fails: DJ_EIO. Nothing changes on failure (it stays in the pool). */
dj_status dj_session_swap_spill(dj_engine_t *e, dj_session_t *s);

/* ---- a session's KV as bytes: export, import, restart (kv_image.c;
 * docs/swap.md has the files that carry it) ---- */

/* The KV layout of a session and what it holds: page i is layer
 * i / n_blocks, block i % n_blocks; positions [0, pos) are valid. A page
 * is the data segment's (K and V of tokens_per_page positions of one layer;
 * for FP8 K/V the codes and the per-head exponents). */
typedef struct dj_kv_layout {
    uint32_t n_layers, n_kv_heads, kv_dim; /* kv_dim: n_kv_heads x head_dim */
    uint32_t kv_dtype;                     /* dj_dtype of K/V */
    uint32_t tokens_per_page;
    uint64_t page_bytes;
    uint32_t n_blocks;                     /* blocks mapped per layer (0 unless RESIDENT) */
    uint32_t pos;                          /* positions in the cache */
} dj_kv_layout;
void dj_session_kv_layout(const dj_session_t *s, dj_kv_layout *out /* OUT */);
/* Page `page` (< n_layers x n_blocks) of a RESIDENT session into
 * buf[page_bytes] (on a device: after the compute issued so far). DJ_EBUSY
 * while it is not resident (swap it in first), DJ_ERANGE past its pages. */
dj_status dj_session_kv_read(dj_engine_t *e, dj_session_t *s, uint32_t page, void *buf /* OUT, [page_bytes] */);
/* Fills page `page` of a load into buf[page_bytes]; an error stops the load. */
typedef dj_status (*dj_kv_page_fn)(void *ctx, uint32_t page, void *buf /* OUT */);
/* Makes the fresh session s (position 0, from dj_session_new of the same
 * model) hold lay->pos positions: maps lay->n_blocks blocks per layer and
 * fills every page by read(ctx, i, buf). The layout must be s's own
 * (DJ_EFORMAT naming both), the positions must fit its context (DJ_ERANGE);
 * DJ_ENOSPC / DJ_EQUOTA as a step that needs the pages. On error free the
 * session (its pages go with it). The loaded blocks are never published to
 * the prefix cache. */
dj_status dj_session_kv_load(dj_engine_t *e, dj_session_t *s, const dj_kv_layout *lay, dj_kv_page_fn read,
                             void *ctx);

/* The largest number of tokens one step takes (dj_engine_config.max_step_tokens). */
uint32_t dj_engine_max_step_tokens(const dj_engine_t *e);

/* Decode steps on a backend with graphs (CUDA): a decode shape runs eagerly
 * the first time, is recorded the second and replayed from then on. Counts
 * since the engine started: graphs recorded, replays, shapes that could not
 * be recorded (they run eagerly). DJINN_NO_GRAPHS=1 in the environment turns
 * recording off (every step eager, as on the CPU). */
void dj_engine_graph_stats(const dj_engine_t *e, size_t *captures /* OUT */, size_t *replays /* OUT */,
                           size_t *failures /* OUT */);

/* Host time of the prefill chunks (dj_session_step and its kin; decode
 * steps are not counted) since the engine started, in seconds: preparing
 * them (swap-in, plan, pages, block tables, the activation stack),
 * enqueueing their ops (on a GPU this returns before the device is done; on
 * the CPU it is the compute), and finishing them (the wait for the device,
 * the logits, the next token). For telling where a step's time goes beside
 * its kernels (bench_gpu prints it for its prefills). */
typedef struct dj_chunk_times {
    uint64_t chunks;
    double prepare_s, enqueue_s, finish_s;
} dj_chunk_times;
dj_chunk_times dj_engine_chunk_times(const dj_engine_t *e);
/* The same for decode steps (dj_engine_step_batch, the generation loop's
 * steps; chunks counts them): enqueueing is a recorded graph's launch where
 * the step replays one. bench_gpu prints it for its batch-1 decode. */
dj_chunk_times dj_engine_step_times(const dj_engine_t *e);

/* Like dj_session_step, but logits receives the logits of every one of the n
 * positions, [n][vocab] f32 (row i = the prediction after ids[i]). The stack
 * must hold a chunk's [max_step_tokens][vocab] logits. */
dj_status dj_session_step_all(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                              float *logits /* OUT, [n][vocab] */);

#endif
