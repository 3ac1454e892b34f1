/* kv_image.c: a resident session's KV pages read out as bytes and written into
 * a fresh session - what session export, import and restart carry (docs/swap.md). */
#include "djinn/alloc.h"

#include <string.h>

#include "exec/engine_impl.h"
#include "vmu/vmu_impl.h"

void dj_session_kv_layout(const dj_session_t *s, dj_kv_layout *out) {
    memset(out, 0, sizeof *out);
    out->n_layers = s->n_layers;
    out->n_kv_heads = s->kv[0].n_kv_heads;
    out->kv_dim = s->kv[0].kv_dim;
    out->kv_dtype = (uint32_t)s->kv[0].dtype;
    out->tokens_per_page = s->tokens_per_page;
    out->page_bytes = s->kv[0].page_bytes;
    out->n_blocks = s->residency == DJ_KV_RESIDENT ? s->n_blocks : 0;
    out->pos = s->pos;
}

static size_t page_of(const dj_session_t *s, uint32_t page) {
    return s->block_table[(size_t)(page / s->n_blocks) * s->max_blocks + page % s->n_blocks];
}

dj_status dj_session_kv_read(dj_engine_t *e, dj_session_t *s, uint32_t page, void *buf) {
    if (!e || !s || !buf) return dj_fail(DJ_EINVAL, "dj_session_kv_read: NULL engine, session or buffer");
    if (s->residency != DJ_KV_RESIDENT)
        return dj_fail(DJ_EBUSY, "session %s is %s: its KV is read out only while resident", s->vs->name,
                       dj_kv_residency_name(s->residency));
    if (page >= s->n_layers * s->n_blocks)
        return dj_fail(DJ_ERANGE, "KV page %u of a session with %u", page, s->n_layers * s->n_blocks);
    dj_backend_t *be = e->kv->be;
    const size_t pb = s->kv[0].page_bytes;
    const uint8_t *src = dj_vmu_data_base(e->kv->vmu) + page_of(s, page) * pb;
    if (be->host_memory) {
        memcpy(buf, src, pb);
        return DJ_OK;
    }
    dj_status st = be->vt->sync(be); /* the steps that wrote it are done */
    return st != DJ_OK ? st : be->vt->download(be, buf, src, pb);
}

dj_status dj_session_kv_load(dj_engine_t *e, dj_session_t *s, const dj_kv_layout *lay, dj_kv_page_fn read,
                             void *ctx) {
    if (!e || !s || !lay || !read) return dj_fail(DJ_EINVAL, "dj_session_kv_load: NULL argument");
    dj_kv_layout mine;
    dj_session_kv_layout(s, &mine);
    if (s->pos || s->n_blocks || s->residency != DJ_KV_RESIDENT)
        return dj_fail(DJ_EBUSY, "KV is loaded only into a fresh session (this one is at position %u)", s->pos);
    if (lay->n_layers != mine.n_layers || lay->kv_dim != mine.kv_dim || lay->n_kv_heads != mine.n_kv_heads ||
        lay->kv_dtype != mine.kv_dtype || lay->tokens_per_page != mine.tokens_per_page ||
        lay->page_bytes != mine.page_bytes)
        return dj_fail(DJ_EFORMAT, "KV of another layout: %u layers x %u (%u heads), dtype %u, %u tokens a page of "
                       "%llu bytes; this engine's session has %u x %u (%u), dtype %u, %u of %llu",
                       lay->n_layers, lay->kv_dim, lay->n_kv_heads, lay->kv_dtype, lay->tokens_per_page,
                       (unsigned long long)lay->page_bytes, mine.n_layers, mine.kv_dim, mine.n_kv_heads,
                       mine.kv_dtype, mine.tokens_per_page, (unsigned long long)mine.page_bytes);
    const uint64_t need = ((uint64_t)lay->pos + lay->tokens_per_page - 1) / lay->tokens_per_page;
    if (lay->pos > s->max_ctx || lay->n_blocks < need || (uint64_t)lay->n_blocks * lay->tokens_per_page >
                                                             (uint64_t)s->max_blocks * s->tokens_per_page)
        return dj_fail(DJ_ERANGE, "KV of %u positions in %u blocks does not fit a session of %u positions", lay->pos,
                       lay->n_blocks, s->max_ctx);
    dj_status st = dj__kv_map_pages(e->kv, s, lay->n_blocks * lay->tokens_per_page);
    dj_backend_t *be = e->kv->be;
    const size_t pb = lay->page_bytes;
    uint8_t *seg = dj_vmu_data_base(e->kv->vmu);
    uint8_t *bounce = be->host_memory ? NULL : dj_malloc(pb);
    if (st == DJ_OK && !be->host_memory && !bounce) st = dj_fail(DJ_ENOMEM, "out of memory for a KV page");
    if (st == DJ_OK && !be->host_memory) st = be->vt->sync(be);
    for (uint32_t i = 0; st == DJ_OK && i < lay->n_layers * lay->n_blocks; i++) {
        uint8_t *dst = seg + page_of(s, i) * pb;
        st = read(ctx, i, be->host_memory ? dst : bounce);
        if (st == DJ_OK && !be->host_memory) st = be->vt->upload(be, dst, bounce, pb);
    }
    dj_free(bounce);
    if (st != DJ_OK) return st; /* the caller frees the session: its pages go with it */
    s->pos = lay->pos;
    s->dev_blocks = 0; /* the whole device table goes up before the next step */
    /* Its blocks are private and not in the prefix chain: it publishes nothing
     * (the tokens behind them are the caller's, not checked here). */
    s->pfx_off = true;
    return DJ_OK;
}
