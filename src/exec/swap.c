/* swap.c: semantic KV swap - a session's data-segment pages copied to a
 * page-granular host pool of the KV store and back (any free pages, tables
 * rewritten), on the backend's copy stream where it has one; and below the
 * pool, sessions spilled to the disk tier's page file (disk.c) and read back. */
#include <inttypes.h>
#include <xxhash.h>
#include "djinn/alloc.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec/kv_impl.h"
#include "vmu/vmu_impl.h"

#define GIB ((size_t)1 << 30)

/* A transfer in flight (or, without backend copy hooks, done at once and
 * never listed). A cancelled swap-out is detached from its session and owns
 * its slots until its copies finish. */
struct dj__swap_op {
    dj_backend_xfer_t *xfer; /* owned */
    bool to_host;
    dj_session_t *s;         /* the session it serves; NULL when detached */
    uint32_t *slots;         /* [n_slots] owned when detached (else the session's) */
    uint32_t n_slots;
    dj__swap_op *next;
};

struct dj_swap_pool {
    uint8_t *base;          /* [n_slots * page_bytes] host memory; owned */
    bool pinned;            /* from the backend's host_alloc (else malloc) */
    size_t page_bytes;
    uint32_t n_slots, n_used, peak;
    uint64_t *bits;         /* [(n_slots + 63) / 64] slot in use; owned */
    uint32_t scan_from;     /* no free slot below this one */
    dj__swap_op *ops;       /* transfers in flight */
    dj_session_t *holders;  /* sessions holding slots (pool_next list) */
    dj_swap_stats st;       /* counters (capacity/used/peak filled on demand) */
    bool poll_failed;       /* a device failure was logged */
    /* the disk tier (kv->disk) */
    dj_session_t *disk_holders; /* sessions on disk (the same pool_next links) */
    dj_disk_stats dst;      /* its counters kept here: sessions, spills, reads, bytes, times, failed_reads */
    uint64_t disk_serial;   /* spills so far (seeds their checksums) */
    uint8_t *bounce;        /* [dj__disk_bounce_pages * page_bytes], aligned: read-backs where device memory
                             * is not host memory; owned */
    bool bounce_pinned;     /* from the backend's host_alloc (else posix_memalign) */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *dj_kv_residency_name(dj_kv_residency r) {
    switch (r) {
    case DJ_KV_RESIDENT: return "resident";
    case DJ_KV_SWAPPING_OUT: return "swapping_out";
    case DJ_KV_SWAPPED: return "swapped";
    case DJ_KV_RESTORING: return "restoring";
    }
    return "?";
}

/* ---- the pool ---- */

static bool slot_used(const dj_swap_pool *p, uint32_t i) { return (p->bits[i / 64] >> (i % 64)) & 1u; }

/* The n lowest free slots, ascending (the caller checked that n are free). */
static void slots_take(dj_swap_pool *p, uint32_t n, uint32_t *out) {
    uint32_t k = 0;
    for (uint32_t w = p->scan_from / 64; k < n; w++) {
        uint64_t free_bits = ~p->bits[w];
        while (free_bits && k < n) {
            const uint32_t i = w * 64 + (uint32_t)__builtin_ctzll(free_bits);
            free_bits &= free_bits - 1;
            if (i >= p->n_slots) break;
            p->bits[w] |= 1ull << (i % 64);
            out[k++] = i;
        }
    }
    p->n_used += n;
    if (p->n_used > p->peak) p->peak = p->n_used;
    if (n) p->scan_from = out[n - 1] + 1; /* every slot below the last taken is in use */
}

static void slots_release(dj_swap_pool *p, const uint32_t *slots, uint32_t n) {
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t i = slots[k];
        p->bits[i / 64] &= ~(1ull << (i % 64));
        if (i < p->scan_from) p->scan_from = i;
    }
    p->n_used -= n;
}

static void holder_add_to(dj_session_t **head, dj_session_t *s) {
    s->pool_prev = NULL;
    s->pool_next = *head;
    if (*head) (*head)->pool_prev = s;
    *head = s;
}

static void holder_remove_from(dj_session_t **head, dj_session_t *s) {
    if (s->pool_prev) s->pool_prev->pool_next = s->pool_next;
    else *head = s->pool_next;
    if (s->pool_next) s->pool_next->pool_prev = s->pool_prev;
    s->pool_prev = s->pool_next = NULL;
}

static void holder_add(dj_swap_pool *p, dj_session_t *s) { holder_add_to(&p->holders, s); }
static void holder_remove(dj_swap_pool *p, dj_session_t *s) { holder_remove_from(&p->holders, s); }

static void op_unlink(dj_swap_pool *p, dj__swap_op *op) {
    dj__swap_op **pp = &p->ops;
    while (*pp && *pp != op) pp = &(*pp)->next;
    if (*pp) *pp = op->next;
    p->st.in_flight--;
}

static void pool_destroy(dj_backend_t *be, dj_swap_pool *p) {
    if (!p) return;
    if (p->base) {
        if (p->pinned) be->vt->host_free(be, p->base);
        else free(p->base);
    }
    free(p->bits);
    if (p->bounce_pinned) be->vt->host_free(be, p->bounce);
    else free(p->bounce);
    free(p);
}

dj_status dj__swap_pool_init(dj__kv *kv, size_t pool_bytes) {
    dj_swap_pool **pp = &kv->swap;
    dj_backend_t *be = kv->be;
    if (*pp && ((*pp)->n_used || (*pp)->ops || (*pp)->holders || (*pp)->disk_holders))
        return dj_fail(DJ_EBUSY, "swap pool: %u of its slots are in use (%u sessions on disk); it can be replaced "
                       "only while empty", (*pp)->n_used, (*pp)->dst.sessions);
    if (*pp && kv->disk)
        return dj_fail(DJ_EBUSY, "swap pool: the disk tier sits below it; close the tier first");
    const size_t page = dj_vmu_page_bytes(kv->vmu);
    const size_t n = pool_bytes / page;
    if (pool_bytes && n == 0)
        return dj_fail(DJ_EINVAL, "swap pool of %zu bytes holds no page of %zu bytes", pool_bytes, page);
    if (n >= UINT32_MAX)
        return dj_fail(DJ_EINVAL, "swap pool of %zu bytes would have %zu pages; at most %u", pool_bytes, n,
                       UINT32_MAX - 1);
    dj_swap_pool *p = NULL;
    if (n) {
        p = dj_calloc(1, sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "swap pool: out of host memory");
        p->page_bytes = page;
        p->n_slots = (uint32_t)n;
        p->bits = dj_calloc((n + 63) / 64, sizeof *p->bits);
        dj_status st = DJ_OK;
        if (!p->bits) st = dj_fail(DJ_ENOMEM, "swap pool: out of host memory for %zu slot bits", n);
        else if (be->vt->host_alloc && be->vt->host_free) {
            void *b = NULL;
            st = be->vt->host_alloc(be, n * page, &b);
            p->base = b;
            p->pinned = st == DJ_OK;
        } else if (!(p->base = dj_malloc(n * page))) {
            st = dj_fail(DJ_ENOMEM, "swap pool: cannot allocate %zu bytes (%.2f GiB) of host memory", n * page,
                         (double)(n * page) / (double)GIB);
        }
        if (st != DJ_OK) {
            pool_destroy(be, p);
            return st;
        }
    }
    if (*pp) {
        dj_swap_stats keep = (*pp)->st; /* counters survive a resize */
        dj_disk_stats dkeep = (*pp)->dst;
        const uint64_t serial = (*pp)->disk_serial;
        pool_destroy(be, *pp); /* its bounce buffer too: the disk tier makes one for the new pool */
        if (p) {
            p->st = keep;
            p->dst = dkeep;
            p->disk_serial = serial;
        }
    }
    *pp = p;
    return DJ_OK;
}

void dj__swap_pool_stats(const dj__kv *kv, dj_swap_stats *st) {
    memset(st, 0, sizeof *st);
    const dj_swap_pool *p = kv->swap;
    st->page_bytes = dj_vmu_page_bytes(kv->vmu);
    if (!p) return;
    *st = p->st;
    st->page_bytes = p->page_bytes;
    st->capacity = (size_t)p->n_slots * p->page_bytes;
    st->used = (size_t)p->n_used * p->page_bytes;
    st->peak = (size_t)p->peak * p->page_bytes;
}

void dj__swap_pool_free(dj__kv *kv) {
    dj_swap_pool **pp = &kv->swap;
    dj_swap_pool *p = *pp;
    if (!p) return;
    dj_backend_t *be = kv->be;
    while (p->ops) { /* only detached ones remain once every session is freed */
        dj__swap_op *op = p->ops;
        p->ops = op->next;
        be->vt->xfer_free(be, op->xfer);
        if (!op->s) free(op->slots);
        else op->s->op = NULL;
        free(op);
    }
    dj__disk_close(kv->disk); /* every session is released: no slot is held */
    kv->disk = NULL;
    pool_destroy(be, p);
    *pp = NULL;
}

/* ---- sessions ---- */

static const char *session_name(const dj_session_t *s) { return s->vs->name; }
static uint32_t n_layers(const dj_session_t *s) { return s->n_layers; }
static uint32_t *table_at(dj_session_t *s, uint32_t i) {
    return &s->block_table[(size_t)(i / s->swap_blocks) * s->max_blocks + i % s->swap_blocks];
}

dj_kv_residency dj_session_residency(const dj_session_t *s) { return s->residency; }

uint32_t dj_session_kv_pages(const dj_session_t *s) { return n_layers(s) * s->n_blocks; }

size_t dj_session_kv_bytes(const dj_session_t *s) {
    return (size_t)dj_session_kv_pages(s) * s->kv[0].page_bytes;
}

uint32_t dj_session_pages_for(const dj_session_t *s, uint32_t positions) {
    if (positions > s->max_ctx) positions = s->max_ctx;
    uint32_t blocks = (uint32_t)(((uint64_t)positions + s->tokens_per_page - 1) / s->tokens_per_page);
    if (blocks < s->n_blocks) blocks = s->n_blocks;
    const uint32_t held = s->residency == DJ_KV_SWAPPED ? 0 : s->n_blocks;
    return n_layers(s) * (blocks - held);
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* order[0..n) = the indices i ordered by key[i] ascending; tmp: [n] scratch. */
static void sort_by(const uint32_t *key, uint32_t n, uint64_t *tmp, uint32_t *order) {
    for (uint32_t i = 0; i < n; i++) tmp[i] = (uint64_t)key[i] << 32 | i;
    qsort(tmp, n, sizeof *tmp, cmp_u64);
    for (uint32_t k = 0; k < n; k++) order[k] = (uint32_t)tmp[k];
}

/* Copy spans of the pairs (page[order[k]], slot[order[k]]), k ascending:
 * runs where both the page and the slot go up by one become one span. */
static size_t make_spans(dj__kv *kv, dj_swap_pool *p, const uint32_t *page, const uint32_t *slot,
                         const uint32_t *order, uint32_t n, dj_copy_span *spans) {
    uint8_t *seg = dj_vmu_data_base(kv->vmu);
    size_t count = 0;
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t i = order[k];
        if (k > 0 && page[i] == page[order[k - 1]] + 1 && slot[i] == slot[order[k - 1]] + 1) {
            spans[count - 1].bytes += p->page_bytes;
            continue;
        }
        spans[count++] = (dj_copy_span){.dev = seg + (size_t)page[i] * p->page_bytes,
                                        .host = p->base + (size_t)slot[i] * p->page_bytes,
                                        .bytes = p->page_bytes};
    }
    return count;
}

/* Starts (or, without copy hooks, does) the copies; *op receives the listed
 * transfer, or NULL when done at once (*seconds then the copy time). */
static dj_status transfer(dj__kv *kv, dj_swap_pool *p, bool to_host, const dj_copy_span *spans, size_t n,
                          dj_session_t *s, dj__swap_op **op, double *seconds) {
    dj_backend_t *be = kv->be;
    *op = NULL;
    *seconds = 0.0;
    if (be->vt->xfer_start && be->vt->xfer_query && be->vt->xfer_order && be->vt->xfer_free) {
        dj__swap_op *o = dj_calloc(1, sizeof *o);
        if (!o) return dj_fail(DJ_ENOMEM, "swap: out of host memory");
        dj_status st = be->vt->xfer_start(be, to_host, spans, n, &o->xfer);
        if (st != DJ_OK) {
            free(o);
            return st;
        }
        o->to_host = to_host;
        o->s = s;
        o->slots = s->slots;
        o->n_slots = s->n_slots;
        o->next = p->ops;
        p->ops = o;
        p->st.in_flight++;
        *op = o;
        return DJ_OK;
    }
    /* Synchronous: the step functions already waited for their compute. */
    dj_status st = be->vt->sync(be);
    const double t0 = now_s();
    for (size_t k = 0; k < n && st == DJ_OK; k++)
        st = to_host ? be->vt->download(be, spans[k].host, spans[k].dev, spans[k].bytes)
                     : be->vt->upload(be, spans[k].dev, spans[k].host, spans[k].bytes);
    *seconds = now_s() - t0;
    return st;
}

/* The copies of a swap-out are done: the pages go back to the segment. */
static void out_done(dj__kv *kv, dj_swap_pool *p, dj_session_t *s, double seconds) {
    dj_vmu_t *vmu = kv->vmu;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        uint32_t *t = table_at(s, i);
        /* a block shared from the prefix cache stays there: s only lets go of it */
        if (!s->pfx[i % s->swap_blocks] && dj_vmu_page_free(vmu, s->vs, *t) != DJ_OK)
            DJ_LOG(ERROR, "swap-out of session %s: %s", session_name(s), dj_last_error());
        *t = DJ__NO_PAGE;
    }
    for (uint32_t b = 0; b < s->swap_blocks; b++) dj__prefix_unshare(kv->prefix, s, b); /* back private */
    s->dev_blocks = 0;
    s->residency = DJ_KV_SWAPPED;
    s->op = NULL;
    p->st.swaps_out++;
    p->st.bytes_out += (uint64_t)s->n_slots * p->page_bytes;
    p->st.out_s += seconds;
}

/* The copies of a restore are done: the pool slots are free again. */
static void in_done(dj_swap_pool *p, dj_session_t *s, double seconds) {
    slots_release(p, s->slots, s->n_slots);
    p->st.swaps_in++;
    p->st.bytes_in += (uint64_t)s->n_slots * p->page_bytes;
    p->st.in_s += seconds;
    holder_remove(p, s);
    free(s->slots);
    s->slots = NULL;
    s->n_slots = s->swap_blocks = 0;
    s->op = NULL;
    s->ordered = false;
    s->residency = DJ_KV_RESIDENT;
}

dj_status dj__swap_out(dj__kv *kv, dj_session_t *s) {
    if (s->residency == DJ_KV_SWAPPED || s->residency == DJ_KV_SWAPPING_OUT) return DJ_OK;
    if (s->residency == DJ_KV_RESTORING)
        return dj_fail(DJ_EBUSY, "session %s is being restored; it can be swapped out once resident "
                                 "(dj_engine_swap_poll)", session_name(s));
    dj_swap_pool *p = kv->swap;
    const uint32_t n = n_layers(s) * s->n_blocks;
    if (n == 0) { /* nothing to copy */
        s->residency = DJ_KV_SWAPPED;
        return DJ_OK;
    }
    const size_t page = dj_vmu_page_bytes(kv->vmu);
    if (!p)
        return dj_fail(DJ_ENOSPC, "session %s: no swap pool to take its %u pages (%zu bytes); "
                                  "dj_engine_swap_init makes one", session_name(s), n, (size_t)n * page);
    if (p->n_slots - p->n_used < n)
        return dj_fail(DJ_ENOSPC, "swap pool full: session %s needs %u pages (%zu bytes); the pool has %u of %u free "
                                  "(%zu of %zu bytes)", session_name(s), n, (size_t)n * page,
                       p->n_slots - p->n_used, p->n_slots, (size_t)(p->n_slots - p->n_used) * page,
                       (size_t)p->n_slots * page);
    uint32_t *slots = dj_malloc((size_t)n * sizeof *slots), *page_of = dj_malloc((size_t)n * sizeof *page_of);
    uint32_t *order = dj_malloc((size_t)n * sizeof *order), *taken = dj_malloc((size_t)n * sizeof *taken);
    dj_copy_span *spans = dj_malloc((size_t)n * sizeof *spans);
    uint64_t *tmp = dj_malloc((size_t)n * sizeof *tmp);
    dj_status st = DJ_OK;
    if (!slots || !page_of || !order || !taken || !spans || !tmp) {
        st = dj_fail(DJ_ENOMEM, "swap out: out of host memory for %u pages", n);
        goto done;
    }
    s->swap_blocks = s->n_blocks;
    for (uint32_t i = 0; i < n; i++) page_of[i] = *table_at(s, i);
    /* Pages in ascending order get ascending slots: runs coalesce into one copy. */
    sort_by(page_of, n, tmp, order);
    slots_take(p, n, taken);
    for (uint32_t k = 0; k < n; k++) slots[order[k]] = taken[k];
    const size_t n_spans = make_spans(kv, p, page_of, slots, order, n, spans);
    s->slots = slots;
    s->n_slots = n;
    double sec = 0.0;
    dj__swap_op *op = NULL;
    st = transfer(kv, p, true, spans, n_spans, s, &op, &sec);
    if (st != DJ_OK) { /* nothing changed */
        slots_release(p, slots, n);
        s->slots = NULL;
        s->n_slots = s->swap_blocks = 0;
        goto done;
    }
    slots = NULL; /* the session's now */
    holder_add(p, s);
    s->op = op;
    s->residency = DJ_KV_SWAPPING_OUT;
    if (!op) out_done(kv, p, s, sec);
done:
    free(slots);
    free(page_of);
    free(order);
    free(taken);
    free(spans);
    free(tmp);
    return st;
}

/* A swap-out in flight is cancelled: its pages never left. The copies finish
 * into slots that the detached transfer frees when poll sees it done. */
static void cancel_out(dj_swap_pool *p, dj_session_t *s) {
    dj__swap_op *op = s->op;
    op->s = NULL;
    op->slots = s->slots;
    op->n_slots = s->n_slots;
    holder_remove(p, s);
    s->slots = NULL;
    s->n_slots = s->swap_blocks = 0;
    s->op = NULL;
    s->residency = DJ_KV_RESIDENT;
    p->st.cancels++;
}

/* Whether n pages can be taken for s now (unreferenced cached blocks are
 * evicted for them): DJ_ENOSPC or DJ_EQUOTA, nothing changed, if not. */
static dj_status room_for(dj__kv *kv, dj_session_t *s, uint32_t n) {
    dj_vmu_t *vmu = kv->vmu;
    dj_vmu_stats vs;
    dj_vmu_get_stats(vmu, &vs);
    dj_prefix_stats ps;
    dj__prefix_stats(kv->prefix, &ps);
    if (vs.pages_free < n && vs.pages_free + ps.pages_unreferenced >= n) /* unreferenced cached blocks go first */
        while (vs.pages_free < n && dj__prefix_evict(kv)) dj_vmu_get_stats(vmu, &vs);
    if (vs.pages_free < n)
        return dj_fail(DJ_ENOSPC, "data segment full: restoring session %s needs %u pages (%zu bytes); %zu of %zu "
                                  "are free", session_name(s), n, (size_t)n * dj_vmu_page_bytes(vmu), vs.pages_free,
                       vs.pages_total);
    if (s->vs->quota_pages && dj_vmu_session_pages(s->vs) + n > s->vs->quota_pages)
        return dj_fail(DJ_EQUOTA, "session %s: restoring %u pages would pass its quota of %zu", session_name(s), n,
                       s->vs->quota_pages);
    return DJ_OK;
}

/* ---- the disk tier ---- */

bool dj_session_on_disk(const dj_session_t *s) { return s && s->dslots != NULL; }

/* Page i's checksum seed: the model, the spill and the page's place in it. */
static uint64_t disk_seed(const dj_session_t *s, uint64_t serial, uint32_t i) {
    const uint64_t v[3] = {s->model_fp, serial, i};
    return XXH3_64bits(v, sizeof v);
}

static void disk_forget(dj__kv *kv, dj_swap_pool *p, dj_session_t *s) {
    dj__disk_release(kv->disk, s->dslots, s->n_slots);
    holder_remove_from(&p->disk_holders, s);
    free(s->dslots);
    free(s->dsums);
    s->dslots = NULL;
    s->dsums = NULL;
    p->dst.sessions--;
}

dj_status dj__swap_disk_init(dj__kv *kv, const char *dir, size_t bytes, uint32_t threads) {
    dj_swap_pool *p = kv->swap;
    if (p && p->disk_holders)
        return dj_fail(DJ_EBUSY, "disk tier: %u sessions are on it; it can be replaced only while empty",
                       p->dst.sessions);
    if (bytes && !p)
        return dj_fail(DJ_EINVAL, "disk tier: it sits below the host swap pool, and there is none "
                                  "(dj_engine_swap_init first)");
    dj__disk *d = NULL;
    if (bytes) {
        dj_status st = dj__disk_open(dir, bytes, dj_vmu_page_bytes(kv->vmu), threads, &d);
        if (st != DJ_OK) return st;
        /* read-backs to a device whose memory is not host memory go through it: pinned where the backend can */
        const size_t bb = dj__disk_bounce_pages(d) * p->page_bytes;
        dj_backend_t *be = kv->be;
        if (!p->bounce && !be->host_memory && be->vt->host_alloc && be->vt->host_free) {
            void *b = NULL;
            if (be->vt->host_alloc(be, bb, &b) == DJ_OK) {
                p->bounce = b;
                p->bounce_pinned = true;
            }
        }
        if (!p->bounce && posix_memalign((void **)&p->bounce, 4096, bb)) {
            p->bounce = NULL;
            dj__disk_close(d);
            return dj_fail(DJ_ENOMEM, "disk tier: out of host memory for its bounce buffer");
        }
    }
    dj__disk_close(kv->disk);
    kv->disk = d;
    return DJ_OK;
}

void dj__swap_disk_stats(const dj__kv *kv, dj_disk_stats *st) {
    memset(st, 0, sizeof *st);
    if (kv->swap) *st = kv->swap->dst;
    st->page_bytes = dj_vmu_page_bytes(kv->vmu);
    if (!kv->disk) {
        st->enabled = false;
        return;
    }
    dj__disk_stats(kv->disk, st);
}

dj_status dj__swap_spill(dj__kv *kv, dj_session_t *s) {
    if (s->dslots) return DJ_OK;
    dj_swap_pool *p = kv->swap;
    if (!kv->disk || !p) return dj_fail(DJ_ENOSPC, "session %s: no disk tier to spill to", session_name(s));
    if (s->residency != DJ_KV_SWAPPED || s->op)
        return dj_fail(DJ_EBUSY, "session %s is %s: only a swapped-out session goes on to disk", session_name(s),
                       dj_kv_residency_name(s->residency));
    const uint32_t n = s->n_slots;
    if (!n) return DJ_OK; /* nothing held anywhere */
    uint32_t *dslots = dj_malloc((size_t)n * sizeof *dslots);
    uint64_t *sums = dj_malloc((size_t)n * sizeof *sums);
    dj__disk_io *io = dj_malloc((size_t)n * sizeof *io);
    dj_status st = DJ_OK;
    if (!dslots || !sums || !io) {
        st = dj_fail(DJ_ENOMEM, "spill: out of host memory for %u pages", n);
        goto done;
    }
    if ((st = dj__disk_take(kv->disk, n, dslots)) != DJ_OK) {
        dj_fail(st, "session %s: %s", session_name(s), dj_last_error());
        goto done;
    }
    const uint64_t serial = ++p->disk_serial;
    for (uint32_t i = 0; i < n; i++)
        io[i] = (dj__disk_io){.buf = p->base + (size_t)s->slots[i] * p->page_bytes, .slot = dslots[i],
                              .seed = disk_seed(s, serial, i)};
    const double t0 = now_s();
    if ((st = dj__disk_write(kv->disk, io, n)) != DJ_OK) {
        dj__disk_release(kv->disk, dslots, n);
        goto done;
    }
    for (uint32_t i = 0; i < n; i++) sums[i] = io[i].sum;
    p->dst.write_s += now_s() - t0;
    p->dst.spills++;
    p->dst.bytes_written += (uint64_t)n * p->page_bytes;
    p->dst.sessions++;
    /* the pool's copy goes; the disk's is the session's */
    slots_release(p, s->slots, n);
    holder_remove(p, s);
    free(s->slots);
    s->slots = NULL;
    s->dslots = dslots;
    s->dsums = sums;
    s->disk_serial = serial;
    holder_add_to(&p->disk_holders, s);
    dslots = NULL;
    sums = NULL;
done:
    free(dslots);
    free(sums);
    free(io);
    return st;
}

/* dj__swap_in of a session on disk (room_for said yes): pages taken, the
 * page file read into them (directly where device memory is host memory,
 * else through the bounce buffer and an upload), every page checked. Any
 * failure gives the pages back and leaves the session on disk. */
static dj_status fill_from_disk(dj__kv *kv, dj_swap_pool *p, dj_session_t *s) {
    dj_backend_t *be = kv->be;
    dj_vmu_t *vmu = kv->vmu;
    const uint32_t n = s->n_slots;
    const size_t pb = p->page_bytes;
    uint8_t *seg = dj_vmu_data_base(vmu);
    const bool direct = be->host_memory && !dj__disk_force_bounce;
    const size_t chunk = direct ? n : dj__disk_bounce_pages(kv->disk);
    uint32_t *pages = dj_malloc((size_t)n * sizeof *pages);
    dj__disk_io *io = dj_malloc((chunk < n ? chunk : n) * sizeof *io);
    dj_status st = DJ_OK;
    uint32_t got = 0;
    if (!pages || !io) {
        st = dj_fail(DJ_ENOMEM, "swap in from disk: out of host memory for %u pages", n);
        goto done;
    }
    for (; got < n; got++)
        if ((st = dj_vmu_page_alloc(vmu, s->vs, &pages[got])) != DJ_OK) goto done;
    if (!direct && (st = be->vt->sync(be)) != DJ_OK) goto done;
    const double t0 = now_s();
    for (uint32_t i0 = 0; i0 < n && st == DJ_OK; i0 += (uint32_t)chunk) {
        const uint32_t k = n - i0 < chunk ? n - i0 : (uint32_t)chunk;
        for (uint32_t j = 0; j < k; j++) {
            const uint32_t i = i0 + j;
            io[j] = (dj__disk_io){.buf = direct ? seg + (size_t)pages[i] * pb : p->bounce + (size_t)j * pb,
                                  .slot = s->dslots[i], .seed = disk_seed(s, s->disk_serial, i), .sum = s->dsums[i]};
        }
        uint32_t bad = 0;
        if ((st = dj__disk_read(kv->disk, io, k, &bad)) != DJ_OK) {
            p->dst.failed_reads++;
            dj_fail(st, "session %s: its KV on disk cannot be used: %s", session_name(s), dj_last_error());
            break;
        }
        for (uint32_t j = 0; j < k && !direct && st == DJ_OK; j++)
            st = be->vt->upload(be, seg + (size_t)pages[i0 + j] * pb, io[j].buf, pb);
    }
    if (st != DJ_OK) goto done;
    p->dst.read_s += now_s() - t0;
    p->dst.reads++;
    p->dst.bytes_read += (uint64_t)n * pb;
    for (uint32_t i = 0; i < n; i++) *table_at(s, i) = pages[i];
    got = 0; /* the session's now */
    disk_forget(kv, p, s);
    s->n_slots = s->swap_blocks = 0;
    s->dev_blocks = 0; /* the whole device table goes up again before the next step */
    s->residency = DJ_KV_RESIDENT;
done:
    for (uint32_t k = 0; k < got; k++) (void)dj_vmu_page_free(vmu, s->vs, pages[k]);
    free(pages);
    free(io);
    return st;
}

dj_status dj__swap_in(dj__kv *kv, dj_session_t *s) {
    if (s->residency == DJ_KV_RESIDENT || s->residency == DJ_KV_RESTORING) return DJ_OK;
    dj_swap_pool *p = kv->swap;
    if (s->residency == DJ_KV_SWAPPING_OUT) {
        cancel_out(p, s);
        return DJ_OK;
    }
    const uint32_t n = s->n_slots;
    if (n == 0) {
        s->residency = DJ_KV_RESIDENT;
        return DJ_OK;
    }
    dj_vmu_t *vmu = kv->vmu;
    dj_status st = room_for(kv, s, n);
    if (st != DJ_OK) return st;
    if (s->dslots) return fill_from_disk(kv, p, s);
    uint32_t *pages = dj_malloc((size_t)n * sizeof *pages), *page_of = dj_malloc((size_t)n * sizeof *page_of);
    uint32_t *order = dj_malloc((size_t)n * sizeof *order);
    dj_copy_span *spans = dj_malloc((size_t)n * sizeof *spans);
    uint64_t *tmp = dj_malloc((size_t)n * sizeof *tmp);
    uint32_t got = 0;
    if (!pages || !page_of || !order || !spans || !tmp) {
        st = dj_fail(DJ_ENOMEM, "swap in: out of host memory for %u pages", n);
        goto done;
    }
    for (; got < n; got++)
        if ((st = dj_vmu_page_alloc(vmu, s->vs, &pages[got])) != DJ_OK) goto done;
    /* Slots in ascending order get ascending pages: runs coalesce. */
    sort_by(pages, n, tmp, order); /* pages ascending, through page_of */
    for (uint32_t k = 0; k < n; k++) page_of[k] = pages[order[k]];
    memcpy(pages, page_of, (size_t)n * sizeof *pages);
    sort_by(s->slots, n, tmp, order);
    for (uint32_t k = 0; k < n; k++) page_of[order[k]] = pages[k];
    const size_t n_spans = make_spans(kv, p, page_of, s->slots, order, n, spans);
    double sec = 0.0;
    dj__swap_op *op = NULL;
    if ((st = transfer(kv, p, false, spans, n_spans, s, &op, &sec)) != DJ_OK) goto done;
    for (uint32_t i = 0; i < n; i++) *table_at(s, i) = page_of[i];
    got = 0; /* the session's now */
    s->dev_blocks = 0; /* the whole device table goes up again before the next step */
    s->op = op;
    s->ordered = false;
    s->residency = DJ_KV_RESTORING;
    if (!op) in_done(p, s, sec);
done:
    for (uint32_t k = 0; k < got; k++) (void)dj_vmu_page_free(vmu, s->vs, pages[k]);
    free(pages);
    free(page_of);
    free(order);
    free(spans);
    free(tmp);
    return st;
}

void dj__swap_poll(dj__kv *kv) {
    dj_swap_pool *p = kv->swap;
    if (!p) return;
    dj_backend_t *be = kv->be;
    for (dj__swap_op *op = p->ops, *next; op; op = next) {
        next = op->next;
        double sec = 0.0;
        const dj_status st = be->vt->xfer_query(be, op->xfer, &sec);
        if (st == DJ_EBUSY) continue;
        if (st != DJ_OK) {
            if (!p->poll_failed) DJ_LOG(ERROR, "swap transfer failed on the device: %s", dj_last_error());
            p->poll_failed = true;
            continue;
        }
        op_unlink(p, op);
        be->vt->xfer_free(be, op->xfer); /* done: no wait */
        if (!op->s) {
            slots_release(p, op->slots, op->n_slots);
            free(op->slots);
        } else if (op->to_host) {
            out_done(kv, p, op->s, sec);
        } else {
            in_done(p, op->s, sec);
        }
        free(op);
    }
}

dj_status dj__swap_before_step(dj__kv *kv, dj_session_t *s) {
    if (s->residency == DJ_KV_SWAPPING_OUT || s->residency == DJ_KV_SWAPPED)
        return dj_fail(DJ_EBUSY, "session %s is swapped out (%s); swap it in before stepping it", session_name(s),
                       dj_kv_residency_name(s->residency));
    if (s->residency == DJ_KV_RESTORING && s->op && !s->ordered) {
        dj_backend_t *be = kv->be;
        dj_status st = be->vt->xfer_order(be, s->op->xfer);
        if (st != DJ_OK) return st;
        s->ordered = true;
    }
    return DJ_OK;
}

void dj__swap_session_release(dj__kv *kv, dj_session_t *s) {
    dj_swap_pool *p = kv->swap;
    if (!p) return;
    if (s->dslots) { /* on disk: its slots are free again (what they hold is garbage now) */
        disk_forget(kv, p, s);
        s->n_slots = 0;
    }
    if (s->op) {
        dj_backend_t *be = kv->be;
        op_unlink(p, s->op);
        be->vt->xfer_free(be, s->op->xfer); /* waits: the pages are about to be freed */
        free(s->op);
        s->op = NULL;
    }
    if (s->slots) {
        slots_release(p, s->slots, s->n_slots);
        holder_remove(p, s);
        free(s->slots);
        s->slots = NULL;
        s->n_slots = 0;
    }
}

/* ---- invariants ---- */

dj_status dj__swap_pool_check(const dj__kv *kv) {
    const dj_swap_pool *p = kv->swap;
    if (!p) return DJ_OK;
    uint8_t *seen = dj_calloc(p->n_slots, 1);
    if (!seen) return dj_fail(DJ_ENOMEM, "swap check: out of host memory");
    dj_status st = DJ_OK;
    uint32_t held = 0, ops = 0;
#define BAD(...)                                   \
    do {                                           \
        st = dj_fail(DJ_EINTERNAL, __VA_ARGS__);   \
        goto done;                                 \
    } while (0)
    const dj_session_t *prev = NULL;
    for (const dj_session_t *s = p->holders; s; prev = s, s = s->pool_next) {
        if (s->pool_prev != prev) BAD("swap: holder %s has a broken back link", session_name(s));
        if (s->residency == DJ_KV_RESIDENT) BAD("swap: resident session %s holds pool slots", session_name(s));
        if (!s->slots || s->n_slots != n_layers(s) * s->swap_blocks || s->swap_blocks > s->n_blocks ||
            (s->residency != DJ_KV_RESTORING && s->swap_blocks != s->n_blocks))
            BAD("swap: session %s holds %u slots for %u blocks of %u layers", session_name(s), s->n_slots,
                s->n_blocks, n_layers(s));
        const size_t pages = dj_vmu_session_pages(s->vs);
        /* blocks mapped from the prefix cache hold no pages of s */
        const size_t shared = (size_t)n_layers(s) * dj__prefix_shared_blocks(s);
        const size_t want_min = s->residency == DJ_KV_SWAPPED || shared > s->n_slots ? 0 : s->n_slots - shared;
        if (s->residency == DJ_KV_SWAPPED ? pages != 0 : pages < want_min)
            BAD("swap: session %s is %s holding %zu data pages for %u KV pages", session_name(s),
                dj_kv_residency_name(s->residency), pages, s->n_slots);
        if ((s->residency == DJ_KV_SWAPPED) != !s->op)
            BAD("swap: session %s is %s %s a transfer in flight", session_name(s), dj_kv_residency_name(s->residency),
                s->op ? "with" : "without");
        for (uint32_t k = 0; k < s->n_slots; k++) {
            const uint32_t i = s->slots[k];
            if (i >= p->n_slots || seen[i]++ || !slot_used(p, i))
                BAD("swap: session %s slot %u (%u of %u) is out of range, held twice or marked free",
                    session_name(s), i, k, s->n_slots);
        }
        held += s->n_slots;
    }
    for (const dj__swap_op *op = p->ops; op; op = op->next, ops++) {
        if (op->s) {
            if (op->s->op != op) BAD("swap: a transfer of session %s is not the session's", session_name(op->s));
            continue;
        }
        for (uint32_t k = 0; k < op->n_slots; k++) {
            const uint32_t i = op->slots[k];
            if (i >= p->n_slots || seen[i]++ || !slot_used(p, i))
                BAD("swap: a cancelled transfer's slot %u is out of range, held twice or marked free", i);
        }
        held += op->n_slots;
    }
    if (ops != p->st.in_flight) BAD("swap: %u transfers listed, %u counted in flight", ops, p->st.in_flight);
    uint32_t marked = 0;
    for (uint32_t i = 0; i < p->n_slots; i++) marked += slot_used(p, i);
    if (marked != p->n_used || held != p->n_used || p->n_used > p->peak)
        BAD("swap: %u slots marked, %u held, %u counted used (peak %u) of %u", marked, held, p->n_used, p->peak,
            p->n_slots);
    for (uint32_t i = 0; i < p->scan_from && i < p->n_slots; i++)
        if (!slot_used(p, i)) BAD("swap: slot %u is free below the scan start %u", i, p->scan_from);
    /* the disk tier: its sessions swapped, holding no pool slot and no page, their disk slots each theirs */
    if (p->disk_holders && !kv->disk) BAD("swap: sessions on disk without a disk tier");
    if (kv->disk) {
        const dj_disk_stats *ds = &p->dst;
        dj_disk_stats now;
        dj__disk_stats(kv->disk, &now);
        const uint32_t d_slots = (uint32_t)(now.capacity / now.page_bytes);
        free(seen);
        if (!(seen = dj_calloc(d_slots ? d_slots : 1, 1))) return dj_fail(DJ_ENOMEM, "swap check: out of memory");
        uint32_t d_held = 0, d_sess = 0;
        prev = NULL;
        for (const dj_session_t *s = p->disk_holders; s; prev = s, s = s->pool_next, d_sess++) {
            if (s->pool_prev != prev) BAD("swap: disk holder %s has a broken back link", session_name(s));
            if (s->residency != DJ_KV_SWAPPED || s->op || s->slots || !s->dslots || !s->dsums ||
                dj_vmu_session_pages(s->vs) || s->n_slots != n_layers(s) * s->swap_blocks)
                BAD("swap: session %s on disk is %s with %u slots, %zu data pages, pool slots %s", session_name(s),
                    dj_kv_residency_name(s->residency), s->n_slots, dj_vmu_session_pages(s->vs),
                    s->slots ? "held" : "none");
            for (uint32_t k = 0; k < s->n_slots; k++) {
                const uint32_t i = s->dslots[k];
                if (i >= d_slots || seen[i]++ || !dj__disk_slot_used(kv->disk, i))
                    BAD("swap: session %s disk slot %u is out of range, held twice or marked free", session_name(s), i);
            }
            d_held += s->n_slots;
        }
        if (d_sess != ds->sessions || (size_t)d_held * now.page_bytes != now.used)
            BAD("swap: %u sessions with %u pages on disk; counted %u sessions, %zu bytes", d_sess, d_held,
                ds->sessions, now.used);
    }
#undef BAD
done:
    free(seen);
    return st;
}
