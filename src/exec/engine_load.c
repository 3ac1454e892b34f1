/* engine_load.c: models into the engine's text segment - what a checkpoint
 * needs, loading (hashing threads, resident or streamed placement), release. */
#include <pthread.h>
#include "djinn/alloc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/engine_impl.h"
#include "exec/stream_impl.h"

/* ---- sizing ---- */

static size_t weight_bytes(const dj_weight *w) {
    return (size_t)w->shape[0] * dj_dtype_row_bytes(w->dtype, (size_t)(w->shape[1] ? w->shape[1] : 1));
}

/* Text-segment bytes of a slot: its weight (unless used in place) and the
 * f32 scales of an f8_e4m3 weight, always copied (converted) there. */
static size_t scale_bytes(const dj_weight *w) { return dj__weight_scale_count(w) * sizeof(float); }

static void free_names(char **names, int n) {
    if (!names) return;
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

dj_status dj_model_estimate(const dj_checkpoint_t *ck, dj_dtype kv_dtype, uint32_t step_tokens,
                            dj_model_needs *needs) {
    memset(needs, 0, sizeof *needs);
    const dj_model_config *c = dj_checkpoint_config(ck);
    const int n = dj__wslot_count(c);
    dj_weight *w = dj_calloc((size_t)n, sizeof *w);
    char **names = dj_calloc((size_t)n, sizeof *names);
    dj_graph_t *g = NULL;
    dj_status st = DJ_OK;
    if (!w || !names) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto done;
    }
    st = dj__model_bind(c, ck, w, names);
    if (st != DJ_OK) goto done;
    for (int i = 0; i < n; i++) {
        if (!names[i] && !w[i].computed) continue;
        needs->text_bytes += dj_vmu_aligned(weight_bytes(&w[i]));
        if (scale_bytes(&w[i])) needs->text_bytes += dj_vmu_aligned(scale_bytes(&w[i]));
        if (names[i]) needs->n_params += (uint64_t)w[i].shape[0] * (uint64_t)(w[i].shape[1] ? w[i].shape[1] : 1);
    }
    needs->kv_bytes_per_token = (size_t)c->n_layers * dj_kv_token_bytes(kv_dtype, c->n_kv_heads, c->head_dim);
    st = dj_model_build_graph(c, NULL, DJ_PHASE_PREFILL, dj_shape_bucket(DJ_PHASE_PREFILL, step_tokens, step_tokens),
                              &g);
    if (st != DJ_OK) goto done;
    st = dj_graph_plan(g, &needs->stack_peak);
done:
    dj_graph_free(g);
    free_names(names, n);
    free(w);
    return st;
}

void dj_engine_config_for(const dj_model_needs *needs, uint32_t ctx, size_t page_bytes, dj_vmu_config *cfg) {
    const size_t page = page_bytes ? page_bytes : 64 * 1024;
    /* KV pages: whole pages per layer, so round each layer's share up. */
    size_t kv = needs->kv_bytes_per_token * (size_t)ctx;
    size_t data = kv + kv / 4 + 64 * page;
    size_t stack = needs->stack_peak + needs->stack_peak / 4 + 4096;
    size_t text = needs->text_bytes + 4096;
    size_t total = text + data + stack + 3 * DJ_VMU_ALIGN;
    cfg->total_bytes = total;
    cfg->text_frac = (double)text / (double)total;
    cfg->data_frac = (double)data / (double)total;
    cfg->stack_frac = (double)stack / (double)total;
    cfg->page_bytes = page;
}

/* ---- models ---- */

static void model_dtor(void *p) {
    dj_model_t *m = p;
    if (!m) return;
    dj__stream_free(m->stream); /* waits for its copies before the ring's bytes go */
    int n = dj__wslot_count(&m->cfg);
    for (int i = 0; i < n; i++) free((char *)m->w[i].hf_name);
    free(m->w);
    dj_checkpoint_close(m->ck);
    free(m);
}

dj_status dj_model_load(dj_engine_t *e, const char *dir, dj_model_t **out) {
    *out = NULL;
    dj_checkpoint_t *ck = NULL;
    dj_status st = dj_checkpoint_open(dir, &ck);
    if (st != DJ_OK) return st;
    const char *base = strrchr(dir, '/');
    base = base && base[1] ? base + 1 : dir;
    st = dj_model_load_checkpoint(e, ck, base, out);
    dj_checkpoint_close(ck);
    return st;
}

/* A first load: weight bytes go from the checkpoint to the slots that use
 * them, in the same pass that fingerprints them (dj_checkpoint_read). */
typedef struct load_ctx {
    dj_engine_t *e;
    const dj_checkpoint_t *ck;
    dj_weight *w;                /* [n] slots, data already placed */
    const dj_tensor_info **src;  /* [n] the tensor each slot copies; NULL: none */
    int n;
    pthread_mutex_t *mu;         /* serialises upload where the backend has no upload_weights */
} load_ctx;

static dj_status load_visit(void *user, size_t tensor, size_t off, const void *bytes, size_t n) {
    const load_ctx *L = user;
    const dj_tensor_info *t = dj_checkpoint_tensor(L->ck, tensor);
    for (int i = 0; i < L->n; i++) {
        if (L->src[i] != t) continue;
        /* the slot holds bytes [lo, lo + want) of the tensor (a part of a fused one) */
        const size_t lo = L->w[i].src_offset, want = weight_bytes(&L->w[i]);
        if (off >= lo + want || off + n <= lo) continue;
        const size_t a = off > lo ? off : lo, z = off + n < lo + want ? off + n : lo + want;
        const size_t k = z - a;
        dj_backend_t *be = L->e->be;
        void *dst = (uint8_t *)L->w[i].data + (a - lo);
        const uint8_t *from = (const uint8_t *)bytes + (a - off);
        dj_status st;
        if (be->vt->upload_weights) {
            st = be->vt->upload_weights(be, dst, from, k);
        } else { /* the visitor runs on several threads at once */
            pthread_mutex_lock(L->mu);
            st = be->vt->upload(be, dst, from, k);
            pthread_mutex_unlock(L->mu);
        }
        if (st != DJ_OK) return st;
    }
    return DJ_OK;
}

/* Where device memory is host memory, weights are read where they lie in
 * the mapped checkpoint (no copy; the page cache holds them once for every
 * process); $DJINN_WEIGHTS_IN_PLACE=0 copies them into the text segment. */
static bool weights_in_place(const dj_engine_t *e) {
    return e->be->host_memory && e->weights_in_place;
}

/* The f32 scales of every f8_e4m3 slot into the text segment, converted
 * from the checkpoint's dtype (the slot's rows of a fused tensor). */
static dj_status load_scales(dj_engine_t *e, dj_model_t *m, int n) {
    float *buf = NULL;
    size_t cap = 0;
    dj_status st = DJ_OK;
    for (int i = 0; i < n && st == DJ_OK; i++) {
        dj_weight *w = &m->w[i];
        const size_t count = dj__weight_scale_count(w);
        if (!count) continue;
        const dj_tensor_info *s = w->scale_src;
        const size_t per_row = (size_t)((w->shape[1] + w->block[1] - 1) / w->block[1]);
        const size_t first = w->scale_row0 * per_row, esz = dj_dtype_size(s->dtype);
        if ((first + count) * esz > s->nbytes) {
            st = dj_fail(DJ_EFORMAT, "scales of '%s': %zu values from %zu exceed the tensor", w->hf_name, count, first);
            break;
        }
        if (count > cap) {
            free(buf);
            cap = count;
            if (!(buf = dj_malloc(cap * sizeof *buf))) {
                st = dj_fail(DJ_ENOMEM, "out of memory for %zu scales", count);
                break;
            }
        }
        const uint8_t *src = (const uint8_t *)s->data + first * esz;
        for (size_t j = 0; j < count; j++) {
            uint16_t h;
            switch (s->dtype) {
            case DJ_DTYPE_BF16: memcpy(&h, src + 2 * j, 2); buf[j] = dj_bf16_to_f32(h); break;
            case DJ_DTYPE_F16: memcpy(&h, src + 2 * j, 2); buf[j] = dj_f16_to_f32(h); break;
            default: memcpy(&buf[j], src + 4 * j, 4); break;
            }
        }
        void *dst = NULL;
        if ((st = dj_vmu_model_alloc(m->region, count * sizeof *buf, &dst)) != DJ_OK) break;
        if ((st = e->be->vt->upload(e->be, dst, buf, count * sizeof *buf)) != DJ_OK) break;
        w->scale = dst;
    }
    free(buf);
    return st;
}

dj_status dj_model_load_checkpoint(dj_engine_t *e, dj_checkpoint_t *ck, const char *name, dj_model_t **out) {
    *out = NULL;
    uint64_t fp = 0;
    const bool in_place = weights_in_place(e);
    /* In place, decode reads every weight byte a token from the mapped files:
     * 2 MiB pages first (one TLB entry each; 4 KiB ones cost decode a third
     * of its rate here), before the fingerprint pass reads them. */
    if (in_place && !dj_checkpoint_huge_pages_done(ck)) dj_checkpoint_huge_pages(ck);
    /* No byte read when the files are known; in place, a hash-only pass. */
    const bool known = dj_checkpoint_fingerprint_known(ck, &fp) || (in_place && (fp = dj_checkpoint_fingerprint(ck), 1));
    dj_vmu_model_t *region = NULL;
    dj_status st = known ? dj_vmu_model_lookup(e->vmu, fp, &region) : DJ_ENOTFOUND;
    if (st == DJ_OK) { /* shared: already in the text segment */
        *out = dj_vmu_model_user(region);
        return DJ_OK;
    }
    if (st != DJ_ENOTFOUND) return st;

    const dj_model_config *c = dj_checkpoint_config(ck);
    if (c->head_dim % 2 != 0 || c->head_dim == 0)
        return dj_fail(DJ_EUNSUPPORTED, "head_dim %u: RoPE needs an even head dimension", c->head_dim);
    const int n = dj__wslot_count(c);
    dj_model_t *m = dj_calloc(1, sizeof *m);
    char **names = dj_calloc((size_t)n, sizeof *names);
    const dj_tensor_info **src = dj_calloc((size_t)n, sizeof *src);
    float *inv_freq = NULL;
    if (!m || !names || !src || !(m->w = dj_calloc((size_t)n, sizeof *m->w))) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto fail;
    }
    m->cfg = *c;
    int n_scaled = 0; /* f8_e4m3 slots */
    snprintf(m->name, sizeof m->name, "%s", name ? name : "model");
    st = dj__model_bind(c, ck, m->w, names);
    if (st != DJ_OK) goto fail;
    for (int i = 0; i < n; i++) {
        if (!names[i] && !m->w[i].computed) continue;
        if (in_place && names[i]) m->mapped_bytes += weight_bytes(&m->w[i]);
        else m->text_bytes += dj_vmu_aligned(weight_bytes(&m->w[i]));
        if (scale_bytes(&m->w[i])) {
            m->text_bytes += dj_vmu_aligned(scale_bytes(&m->w[i]));
            n_scaled++;
        }
        if (names[i]) m->n_params += (uint64_t)m->w[i].shape[0] * (uint64_t)(m->w[i].shape[1] ? m->w[i].shape[1] : 1);
    }
    /* Too large for the text segment's room: some layers stream (stream.c). */
    if (!in_place && (st = dj__stream_plan(e->be, m, dj_vmu_text_room(e->vmu), &m->stream)) != DJ_OK) goto fail;
    if (m->stream && n_scaled) {
        st = dj_fail(DJ_EUNSUPPORTED, "model %s: f8_e4m3 weights do not stream yet, and %zu bytes exceed the text "
                     "segment's room", m->name, m->text_bytes);
        goto fail;
    }
    /* Files not seen before: the region gets a provisional key until its bytes are hashed. */
    m->fingerprint = known ? fp : (uint64_t)(uintptr_t)m | 1ull << 63;
    st = dj_vmu_model_create(e->vmu, m->fingerprint, m->name, m->text_bytes, &region);
    if (st != DJ_OK) goto fail;
    /* The region owns m from here: on any later failure it is released and
     * evicted, which frees m through model_dtor. */
    m->region = region;
    dj_vmu_model_set_user(region, m, model_dtor);
    if (in_place) {
        m->ck = dj_checkpoint_retain(ck);
        dj_vmu_model_set_mapped(region, m->mapped_bytes);
    }
    free(names); /* the strings now belong to m->w[i].hf_name */
    names = NULL;
    if (m->stream) { /* the ring, and the streamed weights' host source (read from ck each step) */
        m->ck = dj_checkpoint_retain(ck);
        if ((st = dj__stream_setup(m)) != DJ_OK) goto fail_region;
    }
    if ((st = load_scales(e, m, n)) != DJ_OK) goto fail_region;
    for (int i = 0; i < n; i++) {
        dj_weight *w = &m->w[i];
        if (!dj__weight_has_bytes(w)) continue;
        if (dj__stream_slot(m, i)) continue; /* in the ring, copied there by every step */
        void *dst = NULL;
        const size_t bytes = weight_bytes(w);
        if (in_place && !w->computed) { /* bound with the tensor's dtype and shape: its bytes as they lie
                                          * (a fused tensor's slot: its rows of the tensor) */
            w->data = (void *)((uintptr_t)dj_checkpoint_find(ck, w->hf_name)->data + w->src_offset);
            continue;
        }
        st = dj_vmu_model_alloc(region, bytes, &dst);
        if (st != DJ_OK) goto fail_region;
        w->data = dst;
        if (w->computed) {
            free(inv_freq);
            inv_freq = dj_malloc(bytes);
            if (!inv_freq) {
                st = dj_fail(DJ_ENOMEM, "out of memory");
                goto fail_region;
            }
            dj__model_fill_computed(c, w, inv_freq);
            if ((st = e->be->vt->upload(e->be, dst, inv_freq, bytes)) != DJ_OK) goto fail_region;
        } else if (known) { /* the fingerprint needs no pass: copy (from the slot's rows of the tensor) */
            const dj_tensor_info *t = dj_checkpoint_find(ck, w->hf_name);
            if ((st = e->be->vt->upload(e->be, dst, (const uint8_t *)t->data + w->src_offset, bytes)) != DJ_OK)
                goto fail_region;
            dj_checkpoint_note_progress(ck, bytes);
        } else {
            src[i] = dj_checkpoint_find(ck, w->hf_name);
        }
    }
    if (!known) { /* one pass over the bytes: hash and copy */
        pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
        const load_ctx L = {.e = e, .ck = ck, .w = m->w, .src = src, .n = n, .mu = &mu};
        if ((st = dj_checkpoint_read(ck, 0, load_visit, (void *)&L)) != DJ_OK) goto fail_region;
        fp = dj_checkpoint_fingerprint(ck); /* known now */
        dj_vmu_model_t *twin = NULL;
        if (dj_vmu_model_lookup(e->vmu, fp, &twin) == DJ_OK) { /* the same weights under another path */
            dj_vmu_model_release(e->vmu, region);
            dj_vmu_model_evict(e->vmu, region);
            free(inv_freq);
            free(src);
            *out = dj_vmu_model_user(twin);
            return DJ_OK;
        }
        if ((st = dj_vmu_model_set_fingerprint(e->vmu, region, fp)) != DJ_OK) goto fail_region;
        m->fingerprint = fp;
    }
    if (m->stream && (st = dj__stream_host_setup(m, e->host_layers, e->host_share)) != DJ_OK) goto fail_region;
    if (m->stream && (st = dj__stream_source(m)) != DJ_OK) goto fail_region;
    free(inv_freq);
    free(src);
    *out = m;
    return DJ_OK;
fail_region:
    free(inv_freq);
    free(src);
    dj_vmu_model_release(e->vmu, region); /* cached with half its weights: make it unfindable */
    dj_vmu_model_evict(e->vmu, region);
    return st;
fail:
    free_names(names, n);
    free(src);
    if (m) {
        free(m->w);
        free(m);
    }
    return st;
}

void dj_model_release(dj_engine_t *e, dj_model_t *m) {
    if (m) dj_vmu_model_release(e->vmu, m->region);
}

const dj_model_config *dj_model_get_config(const dj_model_t *m) { return &m->cfg; }
uint64_t dj_model_fingerprint(const dj_model_t *m) { return m->fingerprint; }
uint64_t dj_model_param_count(const dj_model_t *m) { return m->n_params; }
