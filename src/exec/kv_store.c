/* kv_store.c: the engine's KV store - its prefix cache and swap pool made
 * and freed, sessions' KV set up and let go, pages mapped, tables synced. */
#include "exec/kv_impl.h"
#include "djinn/alloc.h"

#include <stdlib.h>

#include "vmu/vmu_impl.h"

/* ---- the store ---- */

dj_status dj__kv_new(dj_backend_t *be, dj_vmu_t *vmu, bool no_prefix_cache, dj__kv **out) {
    *out = NULL;
    dj__kv *kv = dj_calloc(1, sizeof *kv);
    if (!kv) return dj_fail(DJ_ENOMEM, "KV store: out of host memory");
    kv->be = be;
    kv->vmu = vmu;
    if (!no_prefix_cache) {
        const dj_status st = dj__prefix_new(kv);
        if (st != DJ_OK) {
            free(kv);
            return st;
        }
    }
    *out = kv;
    return DJ_OK;
}

void dj__kv_free(dj__kv *kv) {
    if (!kv) return;
    dj__swap_pool_free(kv); /* waits for transfers still in flight */
    dj__prefix_free(kv);
    free(kv);
}

/* ---- a session's KV ---- */

dj_status dj__kv_session_init(dj__kv *kv, dj_session_t *s, const char *name, uint32_t n_layers,
                              uint32_t n_kv_heads, uint32_t head_dim, size_t quota_pages) {
    dj_backend_t *be = kv->be;
    const size_t kv_dim = (size_t)n_kv_heads * head_dim;
    const size_t page = dj_vmu_page_bytes(kv->vmu);
    const uint32_t tpp = dj_kv_page_tokens(be->kv_dtype, n_kv_heads, head_dim, page);
    if (tpp == 0)
        return dj_fail(DJ_EINVAL, "KV page of %zu bytes cannot hold one position of K and V (%zu bytes)", page,
                       dj_kv_page_need(be->kv_dtype, n_kv_heads, head_dim, 1));
    s->n_layers = n_layers;
    s->tokens_per_page = tpp;
    s->max_blocks = (s->max_ctx + s->tokens_per_page - 1) / s->tokens_per_page;
    s->block_table = dj_calloc((size_t)n_layers * s->max_blocks, sizeof *s->block_table);
    s->kv = dj_calloc(n_layers, sizeof *s->kv);
    s->pfx = dj_calloc(s->max_blocks, sizeof *s->pfx);
    s->pfx_ids = dj_calloc(s->tokens_per_page, sizeof *s->pfx_ids);
    s->quota_pages = quota_pages;
    if (!s->block_table || !s->kv || !s->pfx || !s->pfx_ids) return dj_fail(DJ_ENOMEM, "out of memory");
    dj_status st = dj_vmu_session_new(kv->vmu, name, quota_pages, &s->vs);
    if (st != DJ_OK) return st;
    if (be->host_memory) {
        s->table_dev = s->block_table;
    } else {
        void *td = NULL;
        st = be->vt->alloc(be, (size_t)n_layers * s->max_blocks * sizeof(uint32_t), &td);
        if (st != DJ_OK) return st;
        s->table_dev = td;
    }
    for (uint32_t l = 0; l < n_layers; l++) {
        dj_kv_view *v = &s->kv[l];
        v->seg_base = dj_vmu_data_base(kv->vmu);
        v->page_bytes = page;
        v->block_table = s->block_table + (size_t)l * s->max_blocks;
        v->block_table_dev = be->host_memory ? NULL : s->table_dev + (size_t)l * s->max_blocks;
        v->n_blocks = 0;
        v->tokens_per_page = s->tokens_per_page;
        v->kv_dim = (uint32_t)kv_dim;
        v->dtype = be->kv_dtype;
        v->n_kv_heads = n_kv_heads;
    }
    dj__prefix_root(s, s->pfx_key);
    s->pfx_off = !kv->prefix;
    return DJ_OK;
}

void dj__kv_session_release(dj__kv *kv, dj_session_t *s) {
    dj__swap_session_release(kv, s); /* waits for its copies, frees its pool slots */
    dj__prefix_session_release(kv->prefix, s);
    dj_vmu_session_free(kv->vmu, s->vs);
    s->vs = NULL;
    if (s->table_dev && s->table_dev != s->block_table) kv->be->vt->free(kv->be, s->table_dev);
    s->table_dev = NULL;
    free(s->block_table);
    free(s->kv);
    free(s->pfx);
    free(s->pfx_ids);
    s->block_table = NULL;
    s->kv = NULL;
    s->pfx = NULL;
    s->pfx_ids = NULL;
}

/* ---- pages and block tables ---- */

dj_status dj__kv_map_pages(dj__kv *kv, dj_session_t *s, uint32_t upto) {
    const uint32_t need = (upto + s->tokens_per_page - 1) / s->tokens_per_page;
    const uint32_t L = s->n_layers;
    while (s->n_blocks < need) {
        const uint32_t b = s->n_blocks;
        if (s->quota_pages && (size_t)(b + 1) * L > s->quota_pages)
            return dj_fail(DJ_EQUOTA, "session %s maps %zu KV pages (%zu bytes), its quota", s->vs->name,
                           (size_t)b * L, (size_t)b * L * dj_vmu_page_bytes(kv->vmu));
        for (uint32_t l = 0; l < L; l++) {
            uint32_t page;
            dj_status st = dj_vmu_page_alloc(kv->vmu, s->vs, &page);
            while (st == DJ_ENOSPC && dj__prefix_evict(kv)) /* unreferenced cached blocks go first */
                st = dj_vmu_page_alloc(kv->vmu, s->vs, &page);
            if (st != DJ_OK) {
                for (uint32_t j = 0; j < l; j++) /* undo this block's partial mapping */
                    dj_vmu_page_free(kv->vmu, s->vs, s->block_table[(size_t)j * s->max_blocks + b]);
                return st;
            }
            s->block_table[(size_t)l * s->max_blocks + b] = page;
        }
        s->n_blocks++;
        for (uint32_t l = 0; l < L; l++) s->kv[l].n_blocks = s->n_blocks;
    }
    return DJ_OK;
}

void dj__kv_unmap_from(dj__kv *kv, dj_session_t *s, uint32_t n_blocks) {
    const uint32_t L = s->n_layers;
    while (s->n_blocks > n_blocks && !s->pfx[s->n_blocks - 1]) { /* a step's new blocks are never shared */
        const uint32_t b = --s->n_blocks;
        for (uint32_t l = 0; l < L; l++) {
            uint32_t *slot = &s->block_table[(size_t)l * s->max_blocks + b];
            dj_vmu_page_free(kv->vmu, s->vs, *slot);
            *slot = 0;
        }
    }
    for (uint32_t l = 0; l < L; l++) s->kv[l].n_blocks = s->n_blocks;
    if (s->dev_blocks > s->n_blocks) s->dev_blocks = s->n_blocks;
}

/* Host bytes to device memory, ordered with compute (no wait where the
 * backend can stage them). */
static dj_status upload_now(dj_backend_t *be, void *dst, const void *src, size_t bytes) {
    if (be->vt->upload_async) return be->vt->upload_async(be, dst, src, bytes);
    return be->vt->upload(be, dst, src, bytes);
}

/* The most bytes of block table dj__kv_sync_tables sends as one copy (a 2,048-token
 * prefill of an 8B shape: 32 layers x 129 blocks = 16.5 KiB). */
#define TABLE_SPAN_MAX ((size_t)64 << 10)

/* Sessions' device block tables: the blocks mapped since the last call are
 * copied into the session's device mirror, so steps never copy a whole
 * table. Every layer's new entries go up as one ordered copy of the span
 * from layer 0's first to the last layer's last where that span is at most
 * TABLE_SPAN_MAX - the entries between them are ones the mirror already
 * holds (the host table is the source: below dev_blocks they are equal) or
 * ones no kernel reads (past n_blocks) - else as one copy a layer. An 8B
 * prefill 2048 on the H100: one 16.5 KiB copy instead of 32 of 512 bytes
 * (the device idled before most of them, waiting for the next), the step's
 * host prepare 0.15-0.25 -> 0.04-0.08 ms (bench/RESULTS.md, 2026-11-27). */
dj_status dj__kv_sync_tables(dj__kv *kv, dj_session_t *s) {
    if (kv->be->host_memory || s->dev_blocks == s->n_blocks) {
        s->dev_blocks = s->n_blocks;
        return DJ_OK;
    }
    const uint32_t from = s->dev_blocks, count = s->n_blocks - s->dev_blocks, L = s->n_layers;
    const size_t span = ((size_t)(L - 1) * s->max_blocks + count) * sizeof(uint32_t);
    if (span <= TABLE_SPAN_MAX) {
        dj_status st = upload_now(kv->be, s->table_dev + from, s->block_table + from, span);
        if (st != DJ_OK) return st;
    } else {
        for (uint32_t l = 0; l < L; l++) {
            const size_t off = (size_t)l * s->max_blocks + from;
            dj_status st = upload_now(kv->be, s->table_dev + off, s->block_table + off, count * sizeof(uint32_t));
            if (st != DJ_OK) return st;
        }
    }
    s->dev_blocks = s->n_blocks;
    return DJ_OK;
}
