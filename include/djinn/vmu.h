/* vmu.h: the virtual memory unit. One backend allocation, split into three
 * segments by what tensors mean:
 *   text  - model weights: append-only per model, 256-byte aligned, models
 *           refcounted and shared by fingerprint, cached at refcount 0 and
 *           evicted least-recently-used only when space is needed;
 *   data  - per-session state (KV cache) in fixed-size pages; any freed page
 *           serves any session; per-session quota; exact accounting;
 *   stack - activations: bump pointer, 256-byte aligned, reset to a watermark
 *           after every step; overflow is an error, never a crash.
 * Not thread-safe: one engine thread owns a VMU. */
#ifndef DJINN_VMU_H
#define DJINN_VMU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "djinn/backend.h"
#include "djinn/status.h"

#define DJ_VMU_ALIGN 256
#define DJ_VMU_PAGE_ALIGN 64 /* data pages: a multiple of it (an f8 K/V page is 64 KiB + 64) */

typedef struct dj_vmu dj_vmu_t;
typedef struct dj_vmu_model dj_vmu_model_t;     /* a model's text region */
typedef struct dj_vmu_session dj_vmu_session_t; /* a session's data pages */

typedef struct dj_vmu_config {
    size_t total_bytes;   /* whole budget, taken from the backend at once */
    double text_frac;     /* fractions of total_bytes; must sum to <= 1 */
    double data_frac;     /* (the rest, if any, is left unused) */
    double stack_frac;
    size_t page_bytes;    /* data segment page size (a multiple of DJ_VMU_PAGE_ALIGN) */
} dj_vmu_config;

/* Defaults: 60% text, 30% data, 10% stack, 64 KiB pages. */
void dj_vmu_config_default(dj_vmu_config *cfg /* OUT */, size_t total_bytes);

/* Parse "2", "0.5" (GiB), "512m" (MiB), "64k" (KiB), "1.5g" (GiB) or
 * "123456b" (bytes) into bytes; units are case-insensitive. DJ_EINVAL for
 * anything else (signs, spaces, exponents), DJ_ERANGE past SIZE_MAX. */
dj_status dj_vmu_parse_size(const char *s, size_t *bytes /* OUT */);

/* Allocates total_bytes from be (once). The VMU borrows be: it must outlive it.
 * Segments start at 256-byte aligned addresses (if the backend aligns less,
 * up to 255 bytes are lost); each must hold at least 256 bytes / one page. */
dj_status dj_vmu_new(dj_backend_t *be, const dj_vmu_config *cfg, dj_vmu_t **out /* OUT */);
void dj_vmu_free(dj_vmu_t *vmu); /* NULL does nothing; evicts every model */

/* ---- text segment ---- */

/* Find a cached model by fingerprint; on success its refcount is raised by one
 * and it becomes most recently used. DJ_ENOTFOUND if absent (not an error to log). */
dj_status dj_vmu_model_lookup(dj_vmu_t *vmu, uint64_t fingerprint, dj_vmu_model_t **out /* OUT */);

/* Reserve a region of `bytes` (the sum of the model's aligned tensor sizes) for
 * a new model with refcount 1. Evicts refcount-0 models, least recently used
 * first, until a gap fits; DJ_ENOSPC (with what was needed and what was free)
 * if nothing can make room, in which case nothing is evicted. DJ_EBUSY if the
 * fingerprint is already held (look it up instead). `name` is copied (for stats). */
dj_status dj_vmu_model_create(dj_vmu_t *vmu, uint64_t fingerprint, const char *name, size_t bytes,
                              dj_vmu_model_t **out /* OUT */);

/* The largest region dj_vmu_model_create could reserve now: the widest gap
 * of the text segment once every model no session uses (refcount 0) is
 * evicted. Weight streaming sizes a model that does not fit by it. */
size_t dj_vmu_text_room(const dj_vmu_t *vmu);

/* Append `bytes` inside the model's region, 256-byte aligned. DJ_ENOSPC past
 * the reserved size. The pointer stays valid until the model is evicted. */
dj_status dj_vmu_model_alloc(dj_vmu_model_t *m, size_t bytes, void **out /* OUT */);

/* Drop one reference. At zero the model stays cached (evictable). Create,
 * lookup and release each make the model most recently used. A release past
 * zero, or of a model this VMU does not hold, is logged and ignored. */
void dj_vmu_model_release(dj_vmu_t *vmu, dj_vmu_model_t *m);

/* Evict a model whose refcount is 0 now (its dtor runs, its bytes become
 * free). Used when a load fails half-way. DJ_EBUSY if it is still in use. */
dj_status dj_vmu_model_evict(dj_vmu_t *vmu, dj_vmu_model_t *m);

/* Host-side object attached to the region (the engine's model); dtor is called
 * with it when the region is evicted or the VMU freed. The dtor must not call
 * back into the VMU. */
void dj_vmu_model_set_user(dj_vmu_model_t *m, void *user, void (*dtor)(void *user));
void *dj_vmu_model_user(const dj_vmu_model_t *m);

uint64_t dj_vmu_model_fingerprint(const dj_vmu_model_t *m);
/* Re-key a region (a model whose fingerprint is known only once its bytes are
 * in): DJ_EBUSY if another region holds fingerprint. */
dj_status dj_vmu_model_set_fingerprint(dj_vmu_t *vmu, dj_vmu_model_t *m, uint64_t fingerprint);
uint32_t dj_vmu_model_refcount(const dj_vmu_model_t *m);
size_t dj_vmu_model_bytes(const dj_vmu_model_t *m); /* reserved (aligned) region size */
size_t dj_vmu_model_used(const dj_vmu_model_t *m);  /* bytes appended so far */
uint8_t *dj_vmu_model_base(const dj_vmu_model_t *m); /* region start (device memory) */

/* Weights a host-memory backend reads in place from the mapped checkpoint
 * (no copy): counted with the model (its stats and the text segment's
 * `mapped`) without taking segment capacity. */
void dj_vmu_model_set_mapped(dj_vmu_model_t *m, size_t bytes);
size_t dj_vmu_model_mapped(const dj_vmu_model_t *m);

/* Aligned size a tensor of `bytes` takes in the text segment. */
size_t dj_vmu_aligned(size_t bytes);

/* ---- data segment ---- */

/* A new session owning no pages, allowed at most quota_pages (0 = no limit). */
dj_status dj_vmu_session_new(dj_vmu_t *vmu, const char *name, size_t quota_pages,
                             dj_vmu_session_t **out /* OUT */);
/* Frees every page the session holds, then the session. NULL does nothing;
 * a session of another VMU is logged and ignored. */
void dj_vmu_session_free(dj_vmu_t *vmu, dj_vmu_session_t *s);

/* Take one free page for the session. DJ_EQUOTA past its quota, DJ_ENOSPC if
 * the segment has none free. */
dj_status dj_vmu_page_alloc(dj_vmu_t *vmu, dj_vmu_session_t *s, uint32_t *page /* OUT */);
/* Return a page the session holds (DJ_EINVAL if it does not hold it). */
dj_status dj_vmu_page_free(dj_vmu_t *vmu, dj_vmu_session_t *s, uint32_t page);
/* Hand a page `from` holds to `to` (the engine's prefix cache takes the full
 * KV blocks a session publishes): the bytes stay where they are. DJ_EINVAL if
 * `from` does not hold it; `to`'s quota is not checked. */
dj_status dj_vmu_page_give(dj_vmu_t *vmu, dj_vmu_session_t *from, dj_vmu_session_t *to, uint32_t page);
/* The data segment's page map in `cells` equal parts (1..pages_total; a part
 * of pages_total / cells pages, the last takes the rest): out[i] = the holder
 * of part i's first page, NULL when it is free (the live view draws it). */
void dj_vmu_page_holders(const dj_vmu_t *vmu, uint32_t cells, const dj_vmu_session_t **out /* [cells] */);

uint8_t *dj_vmu_data_base(const dj_vmu_t *vmu);
size_t dj_vmu_page_bytes(const dj_vmu_t *vmu);
size_t dj_vmu_session_pages(const dj_vmu_session_t *s);

/* ---- stack segment ---- */

/* Bump-allocate `bytes` (256-aligned). DJ_ENOSPC with sizes on overflow. */
dj_status dj_vmu_stack_push(dj_vmu_t *vmu, size_t bytes, void **out /* OUT */);
size_t dj_vmu_stack_mark(const dj_vmu_t *vmu);         /* current watermark */
void dj_vmu_stack_reset(dj_vmu_t *vmu, size_t mark);   /* back to a watermark */
size_t dj_vmu_stack_capacity(const dj_vmu_t *vmu);
uint8_t *dj_vmu_stack_base(const dj_vmu_t *vmu);      /* offset 0 of the stack (plans give offsets) */

/* ---- accounting ---- */

typedef struct dj_vmu_seg_stats {
    size_t capacity, used, peak; /* bytes */
} dj_vmu_seg_stats;

typedef struct dj_vmu_stats {
    dj_vmu_seg_stats text, data, stack;
    size_t n_models, n_sessions;
    size_t pages_total, pages_free;
    size_t evictions;
    size_t text_pinned; /* bytes of models with refcount > 0 */
    size_t text_mapped; /* weight bytes of cached models used in place (dj_vmu_model_set_mapped) */
} dj_vmu_stats;

void dj_vmu_get_stats(const dj_vmu_t *vmu, dj_vmu_stats *st /* OUT */);
/* Readable map: segments, models with refcounts, sessions with their pages. */
void dj_vmu_print_stats(const dj_vmu_t *vmu, FILE *f);

#endif
