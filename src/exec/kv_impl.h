/* kv_impl.h: the engine's KV store - data-segment pages, sessions' block
 * tables, the prefix cache and the host swap pool - one object passed down. */
#ifndef DJ_KV_IMPL_H
#define DJ_KV_IMPL_H

#include "djinn/kv.h"
#include "djinn/lora.h"
#include "djinn/sampler.h"
#include "djinn/vmu.h"

typedef struct dj_swap_pool dj_swap_pool;
typedef struct dj__swap_op dj__swap_op;
typedef struct dj__prefix dj__prefix;
typedef struct dj__pblock dj__pblock;
typedef struct dj__disk dj__disk;

/* The KV store. The engine makes one (dj__kv_new) and owns it; swap.c and
 * prefix.c take it, never the engine. Its sessions' KV (block tables, pool
 * slots, prefix references) is set up and let go here (dj__kv_session_*). */
typedef struct dj__kv {
    dj_backend_t *be;         /* borrowed: the engine's; device table mirrors and swap copies */
    dj_vmu_t *vmu;            /* borrowed: the engine's; KV pages are its data segment's */
    dj__prefix *prefix;       /* full KV blocks shared by content (prefix.c), or NULL: off; owned */
    dj_swap_pool *swap;       /* host swap pool (swap.c), or NULL: none; owned */
    dj__disk *disk;           /* the disk tier below the pool (disk.c), or NULL: none; owned */
} dj__kv;

/* A session: its KV (pages, block tables, residency, prefix chain) and what
 * the engine keeps beside it (model, sampler). */
struct dj_session {
    struct dj_model *model;   /* holds one model reference */
    uint64_t model_fp;        /* model->fingerprint (the prefix chain's root) */
    uint32_t n_layers;        /* model->cfg.n_layers */
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
    dj_session_t *pool_prev, *pool_next; /* sessions holding pool slots, or (on disk) disk slots */
    uint32_t *dslots;         /* [n_slots] page file slot of KV page i while on disk (slots NULL); owned */
    uint64_t *dsums;          /* [n_slots] their XXH3 checksums; owned */
    uint64_t disk_serial;     /* the spill's serial number (seeds the checksums) */
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
    struct dj_lora *lora[DJ_LORA_STACK_MAX]; /* [n_lora] the adapters its steps run with, applied in
                                              * this order (one reference each; lora.c) */
    float lora_scale[DJ_LORA_STACK_MAX];     /* [n_lora] their use scales (1: as trained) */
    uint32_t n_lora;
};

/* ---- the store (kv_store.c) ---- */

/* A store over the engine's backend and VMU (both borrowed: they outlive
 * it), with a prefix cache unless no_prefix_cache, and no swap pool. */
dj_status dj__kv_new(dj_backend_t *be, dj_vmu_t *vmu, bool no_prefix_cache, dj__kv **out /* OUT */);
/* Waits for transfers still in flight, frees the pool and the cache (every
 * session must be released first). NULL does nothing. */
void dj__kv_free(dj__kv *kv);

/* s's KV for s->max_ctx positions of n_layers layers of n_kv_heads x
 * head_dim (s->model, model_fp, max_ctx and rope_long set by the caller):
 * page geometry, block tables (and their device mirror), the VMU session
 * `name` with quota_pages, the prefix chain's root. On failure s keeps what
 * was made: dj__kv_session_release lets it go. */
dj_status dj__kv_session_init(dj__kv *kv, dj_session_t *s, const char *name, uint32_t n_layers,
                              uint32_t n_kv_heads, uint32_t head_dim, size_t quota_pages);
/* Lets go of everything dj__kv_session_init made (in any residency, waiting
 * for s's copies in flight first): pool slots, prefix references, pages,
 * tables. */
void dj__kv_session_release(dj__kv *kv, dj_session_t *s);
/* Maps pages so that positions [0, upto) are backed in every layer
 * (unreferenced cached blocks are evicted when the segment is full);
 * DJ_EQUOTA past the session's quota. */
dj_status dj__kv_map_pages(dj__kv *kv, dj_session_t *s, uint32_t upto);
/* Copies the blocks mapped since the last call into s's device table. */
/* Unmaps s's blocks from n_blocks on (private pages mapped for a step that
 * was dropped: dj__session_step_drop); s resident. */
void dj__kv_unmap_from(dj__kv *kv, dj_session_t *s, uint32_t n_blocks);
dj_status dj__kv_sync_tables(dj__kv *kv, dj_session_t *s);

/* ---- KV swap (swap.c) ---- */

/* The public swap calls (engine.h), on the store. */
dj_status dj__swap_pool_init(dj__kv *kv, size_t pool_bytes);
void dj__swap_pool_stats(const dj__kv *kv, dj_swap_stats *st /* OUT */);
dj_status dj__swap_out(dj__kv *kv, dj_session_t *s);
dj_status dj__swap_in(dj__kv *kv, dj_session_t *s);
void dj__swap_poll(dj__kv *kv);
/* Before a step of s: DJ_EBUSY while SWAPPING_OUT or SWAPPED; a RESTORING
 * session's later compute is made to wait for its copies. */
dj_status dj__swap_before_step(dj__kv *kv, dj_session_t *s);
/* dj__kv_session_release's first part: waits for s's transfer and releases
 * its pool slots (its pages are the VMU's to free). */
void dj__swap_session_release(dj__kv *kv, dj_session_t *s);
/* dj__kv_free's: waits for every transfer, frees the pool. */
void dj__swap_pool_free(dj__kv *kv);
/* Checks the pool's invariants: every slot free xor held by exactly one
 * holder (a session on the holder list or a cancelled transfer), counts
 * consistent, each holder's residency and VMU pages matching. DJ_EINTERNAL
 * with the first broken one. For tests. */
dj_status dj__swap_pool_check(const dj__kv *kv);

/* ---- the disk tier (disk.c: the page file and its I/O threads; swap.c
 * moves sessions through it) ---- */

/* One page's transfer: buf[0..page_bytes) <-> the page file's slot. */
typedef struct dj__disk_io {
    uint8_t *buf;
    uint32_t slot;
    uint64_t seed;            /* the checksum's seed */
    uint64_t sum;             /* write: OUT, the page's checksum; read: the one it must have */
} dj__disk_io;

dj_status dj__disk_open(const char *dir, size_t bytes, size_t page_bytes, uint32_t threads, dj__disk **out /* OUT */);
/* Joins the I/O threads and closes the file (every slot must be free). NULL does nothing. */
void dj__disk_close(dj__disk *d);
/* n free slots (ascending), or DJ_ENOSPC with nothing taken. */
dj_status dj__disk_take(dj__disk *d, uint32_t n, uint32_t *slots /* OUT, [n] */);
void dj__disk_release(dj__disk *d, const uint32_t *slots, uint32_t n);
/* Writes (checksumming each page first) or reads (checking each page after)
 * the n pages through the I/O threads; the caller waits. A read whose page
 * fails its checksum or cannot be read: DJ_EIO naming the first such page
 * (*bad: how many failed); a failed write: DJ_EIO. */
dj_status dj__disk_write(dj__disk *d, dj__disk_io *io, uint32_t n);
dj_status dj__disk_read(dj__disk *d, dj__disk_io *io, uint32_t n, uint32_t *bad /* OUT */);
/* The counters (st->sessions, spills, reads: the caller's). */
void dj__disk_stats(const dj__disk *d, dj_disk_stats *st /* OUT */);
uint32_t dj__disk_free_slots(const dj__disk *d);
bool dj__disk_slot_used(const dj__disk *d, uint32_t i);
/* Pages the bounce buffer of a read-back holds (16 MiB of them, at least one). */
size_t dj__disk_bounce_pages(const dj__disk *d);
/* Test hook: a backend whose device memory is host memory still reads
 * through the bounce buffer (the GPU's path). */
extern bool dj__disk_force_bounce;
/* Test hook: the tier opened from now on uses buffered I/O only, as where
 * the filesystem refuses O_DIRECT. */
extern bool dj__disk_no_direct;

/* The engine's calls (engine.h), on the store (swap.c). */
dj_status dj__swap_disk_init(dj__kv *kv, const char *dir, size_t bytes, uint32_t threads);
void dj__swap_disk_stats(const dj__kv *kv, dj_disk_stats *st /* OUT */);
dj_status dj__swap_spill(dj__kv *kv, dj_session_t *s);

/* ---- prefix cache (prefix.c) ---- */

/* Makes kv->prefix. */
dj_status dj__prefix_new(dj__kv *kv);
/* Frees every block of kv->prefix (sessions must have released theirs) and
 * its pages; kv->prefix is NULL after. */
void dj__prefix_free(dj__kv *kv);
/* The chain's root key of s: model fingerprint and KV layout. */
void dj__prefix_root(const dj_session_t *s, uint64_t key[2] /* OUT */);
/* An adapter's fingerprint, for the prefix chain's root (lora.c). */
uint64_t dj__lora_key(const struct dj_lora *a);
/* After s's position went up by n (ids fed, a step done): blocks filled are
 * published (s keeps a reference) unless cached already. Nothing without a
 * cache. */
void dj__prefix_fed(dj__kv *kv, dj_session_t *s, const int32_t *ids, uint32_t n);
/* Maps the cached full blocks that ids[0..n) (to be fed at s's position,
 * a block boundary) start with, leaving at least one id; *mapped: ids
 * skipped (s's position went up by as many). */
dj_status dj__prefix_map(dj__kv *kv, dj_session_t *s, const int32_t *ids, uint32_t n, uint32_t *mapped /* OUT */);
/* s stops mapping block b (its page entries are the caller's to reset). */
void dj__prefix_unshare(dj__prefix *c, dj_session_t *s, uint32_t b);
/* Drops every reference of s. */
void dj__prefix_session_release(dj__prefix *c, dj_session_t *s);
/* Blocks of s mapped from the cache (their pages are not in s->vs). */
uint32_t dj__prefix_shared_blocks(const dj_session_t *s);
/* Frees the least recently used unreferenced block of kv->prefix: false if
 * there is none (or no cache). */
bool dj__prefix_evict(dj__kv *kv);
void dj__prefix_stats(const dj__prefix *c, dj_prefix_stats *st /* OUT */);
/* Invariants against the live sessions given (all of them): references
 * counted = recorded, LRU = unreferenced blocks, pages held = the VMU's,
 * sessions' tables pointing at their blocks' pages. For tests. */
dj_status dj__prefix_check(const dj__prefix *c, dj_session_t *const *sessions, size_t n_sessions);

#endif
