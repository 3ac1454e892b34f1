/* kv.h: the public face of the engine's KV store - a session's residency,
 * the swap pool's and the prefix cache's counters, and per-session KV sizes. */
#ifndef DJINN_KV_H
#define DJINN_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dj_session dj_session_t;

/* ---- KV swap: a session's pages to a host pool and back ----
 *
 * The data segment is virtual memory: a session's KV pages can be copied to
 * a host swap pool (page-granular, pinned on CUDA) and their pages returned
 * to the segment, then brought back into any free pages later (the page
 * tables, host and device mirror, are rewritten) - the same bytes, so the
 * logits afterwards are those of a session never swapped, bit for bit.
 *
 * Residency of a session:
 *   RESIDENT     pages in the data segment (a new session).
 *   SWAPPING_OUT D2H copies in flight; the pages are still held. Stepping
 *                it is DJ_EBUSY.
 *   SWAPPED      the bytes are only in the pool; no pages held. Stepping it
 *                is DJ_EBUSY.
 *   RESTORING    pages taken again, H2D copies in flight; it may be stepped
 *                at once (its compute waits for the copies on the device,
 *                the host does not block). Its pool slots are released when
 *                the copies are done.
 * Transfers complete in dj_engine_swap_poll (non-blocking; the caller's loop
 * calls it every turn). On a backend without copy hooks (the CPU) copies are
 * memcpys done inside the call, so swap_out/in leave SWAPPED/RESIDENT at once.
 * Every byte is counted: a session holds n pages in the data segment
 * (dj_vmu_session_pages) or in the pool (dj_swap_stats.used) or, while
 * copies are in flight, in both. */
typedef enum dj_kv_residency {
    DJ_KV_RESIDENT = 0,
    DJ_KV_SWAPPING_OUT,
    DJ_KV_SWAPPED,
    DJ_KV_RESTORING
} dj_kv_residency;
/* "resident", "swapping_out", "swapped", "restoring" ("?" for others). */
const char *dj_kv_residency_name(dj_kv_residency r);

typedef struct dj_swap_stats {
    size_t capacity, used, peak;  /* pool bytes (whole pages); used counts slots held by
                                   * sessions and by cancelled swap-outs still in flight */
    size_t page_bytes;            /* one slot (the data segment's page size) */
    uint64_t swaps_out, swaps_in; /* completed transfers */
    uint64_t bytes_out, bytes_in; /* bytes of the completed transfers */
    double out_s, in_s;           /* summed copy times of the completed transfers: the device's
                                   * time from the copies' start to their end (CUDA events), or
                                   * the memcpy's on the CPU; bytes / time = the link's rate */
    uint64_t cancels;             /* swap-outs cancelled by a swap_in before they completed */
    uint32_t in_flight;           /* transfers not yet completed */
} dj_swap_stats;

/* ---- the disk tier: below the pool, a page file in a state directory ----
 *
 * A SWAPPED session whose bytes sit in the pool can be spilled to disk
 * (dj_session_swap_spill): every page is written to a slot of the page file
 * with an XXH3 checksum (seeded with the model's fingerprint, the spill's
 * serial number and the page's index, so a page of another session, another
 * model or an older spill does not verify), then its pool slots are free. It
 * stays DJ_KV_SWAPPED (dj_session_on_disk tells where); dj_session_swap_in
 * reads it back into data-segment pages (straight into them where device
 * memory is host memory, else through a pinned bounce buffer) and checks
 * every page: a page that fails its checksum or cannot be read is DJ_EIO
 * naming it, and the session stays on disk untouched (its KV is lost: the
 * caller recomputes it from its history or closes it). docs/swap.md has the
 * file's format. */
typedef struct dj_disk_stats {
    bool enabled;
    bool direct;                   /* O_DIRECT is used for aligned pages (else buffered I/O only) */
    uint32_t threads;              /* I/O threads (pread/pwrite) */
    size_t capacity, used, peak;   /* bytes of KV pages (whole pages) */
    size_t page_bytes;
    uint32_t sessions;             /* on disk now */
    uint64_t spills, reads;        /* sessions written to disk, read back (completed) */
    uint64_t bytes_written, bytes_read;
    double write_s, read_s;        /* summed wall time of those writes and reads */
    uint64_t bad_pages;            /* pages that failed their checksum or could not be read */
    uint64_t failed_reads;         /* read-backs refused (DJ_EIO) */
} dj_disk_stats;

/* True while a SWAPPED session's bytes are in the page file (not the pool). */
bool dj_session_on_disk(const dj_session_t *s);

dj_kv_residency dj_session_residency(const dj_session_t *s);
/* KV pages of the session (n_layers x blocks mapped): held in the data
 * segment, or in the pool when SWAPPED (both while copies are in flight). */
uint32_t dj_session_kv_pages(const dj_session_t *s);
size_t dj_session_kv_bytes(const dj_session_t *s); /* the same in bytes */
/* Its pages' holder in the VMU (what dj_vmu_page_holders names), for
 * matching a page map to sessions; compare only, never dereference. */
const struct dj_vmu_session *dj_session_vmu(const dj_session_t *s);

/* Data-segment pages the session needs beyond what it holds now to have
 * `positions` tokens mapped (capped at its context): for admission. For a
 * SWAPPED session that is every page it had (or more, to grow); for a
 * resident one only the growth. */
uint32_t dj_session_pages_for(const dj_session_t *s, uint32_t positions);

/* The prefix cache's counters (dj_engine_prefix_stats; engine.h says what
 * the cache shares). */
typedef struct dj_prefix_stats {
    bool enabled;
    size_t blocks, blocks_unreferenced;  /* cached now; unreferenced: evictable */
    size_t pages, pages_unreferenced;    /* data-segment pages they hold */
    uint64_t published, duplicates;      /* blocks cached; blocks found cached already when filled */
    uint64_t hits, tokens_mapped;        /* blocks mapped into sessions, and their tokens */
    uint64_t evictions;                  /* blocks freed to make room */
} dj_prefix_stats;

#endif
