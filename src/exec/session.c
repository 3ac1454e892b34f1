/* session.c: the engine's sessions - made and freed over its KV store
 * (kv_store.c), prefix-cache mapping, and the public swap calls. */
#include <stdio.h>
#include "djinn/alloc.h"
#include <stdlib.h>

#include "djinn/lora.h"
#include "exec/engine_impl.h"

dj_status dj_session_new(dj_engine_t *e, dj_model_t *m, uint32_t max_ctx, size_t quota_pages,
                         dj_session_t **out) {
    *out = NULL;
    const dj_model_config *c = &m->cfg;
    if (max_ctx == 0) max_ctx = c->max_position_embeddings;
    if (max_ctx == 0) return dj_fail(DJ_EINVAL, "session context length is 0");
    dj_session_t *s = dj_calloc(1, sizeof *s);
    if (!s) return dj_fail(DJ_ENOMEM, "out of memory");
    s->model = m;
    s->model_fp = m->fingerprint;
    s->max_ctx = max_ctx;
    s->rope_long = dj_model_config_rope_long(c, max_ctx);
    char name[300];
    snprintf(name, sizeof name, "%s#%p", m->name, (void *)s);
    dj_status st = dj__kv_session_init(e->kv, s, name, c->n_layers, c->n_kv_heads, c->head_dim, quota_pages);
    if (st != DJ_OK) goto fail;
    /* The session holds its own model reference. */
    dj_vmu_model_t *again = NULL;
    st = dj_vmu_model_lookup(e->vmu, m->fingerprint, &again);
    if (st != DJ_OK) goto fail;
    *out = s;
    return DJ_OK;
fail:
    dj__kv_session_release(e->kv, s);
    free(s);
    return st;
}

void dj_session_free(dj_engine_t *e, dj_session_t *s) {
    if (!s) return;
    dj__kv_session_release(e->kv, s); /* waits for its copies; its pool slots, pages and tables */
    dj_vmu_model_release(e->vmu, s->model->region);
    for (uint32_t i = 0; i < s->n_lora; i++) dj_lora_release(e, s->lora[i]);
    dj_sampler_free(s->sampler);
    free(s);
}

uint32_t dj_session_pos(const dj_session_t *s) { return s->pos; }

dj__prefix *dj__engine_prefix(dj_engine_t *e) { return e->kv->prefix; }

void dj_engine_prefix_stats(const dj_engine_t *e, dj_prefix_stats *st) { dj__prefix_stats(e->kv->prefix, st); }

dj_status dj_session_map_prefix(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n, uint32_t *mapped) {
    if (!mapped) return dj_fail(DJ_EINVAL, "dj_session_map_prefix: NULL output");
    *mapped = 0;
    if (!e || !s || (!ids && n)) return dj_fail(DJ_EINVAL, "dj_session_map_prefix: NULL engine, session or ids");
    return dj__prefix_map(e->kv, s, ids, n, mapped);
}

/* ---- KV swap (swap.c, on the engine's store) ---- */

dj_status dj_engine_swap_init(dj_engine_t *e, size_t pool_bytes) { return dj__swap_pool_init(e->kv, pool_bytes); }
void dj_engine_swap_stats(const dj_engine_t *e, dj_swap_stats *st) { dj__swap_pool_stats(e->kv, st); }
void dj_engine_swap_poll(dj_engine_t *e) { dj__swap_poll(e->kv); }
dj_status dj__swap_check(const dj_engine_t *e) { return dj__swap_pool_check(e->kv); }

dj_status dj_session_swap_out(dj_engine_t *e, dj_session_t *s) {
    if (!e || !s) return dj_fail(DJ_EINVAL, "swap out: NULL engine or session");
    return dj__swap_out(e->kv, s);
}

dj_status dj_session_swap_in(dj_engine_t *e, dj_session_t *s) {
    if (!e || !s) return dj_fail(DJ_EINVAL, "swap in: NULL engine or session");
    return dj__swap_in(e->kv, s);
}

dj_status dj_engine_disk_init(dj_engine_t *e, const char *dir, size_t bytes, uint32_t threads) {
    if (!e || (bytes && !dir)) return dj_fail(DJ_EINVAL, "dj_engine_disk_init: NULL engine or directory");
    return dj__swap_disk_init(e->kv, dir, bytes, threads);
}

void dj_engine_disk_stats(const dj_engine_t *e, dj_disk_stats *st) { dj__swap_disk_stats(e->kv, st); }

dj_status dj_session_swap_spill(dj_engine_t *e, dj_session_t *s) {
    if (!e || !s) return dj_fail(DJ_EINVAL, "spill: NULL engine or session");
    return dj__swap_spill(e->kv, s);
}

dj_status dj_session_set_cache_salt(dj_session_t *s, const uint64_t salt[2]) {
    if (!s || !salt) return dj_fail(DJ_EINVAL, "dj_session_set_cache_salt: NULL session or salt");
    if (s->pos || s->pfx_full || s->pfx_n)
        return dj_fail(DJ_EBUSY, "a session's cache salt is set before it holds tokens (it is at position %u)", s->pos);
    memcpy(s->pfx_salt, salt, sizeof s->pfx_salt);
    dj__prefix_root(s, s->pfx_key);
    return DJ_OK;
}

void dj_session_cache_salt(const dj_session_t *s, uint64_t salt[2]) { memcpy(salt, s->pfx_salt, sizeof s->pfx_salt); }

uint32_t dj_session_max_ctx(const dj_session_t *s) { return s->max_ctx; }
bool dj_session_rope_long(const dj_session_t *s) { return s->rope_long; }

const dj_model_t *dj_session_model(const dj_session_t *s) { return s->model; }
