/* stream.c: a model that streams - its placement at load, the ring in its
 * text region, the host source of the streamed weights (page-locked), and the
 * per-step stream argument the executor hands the backend. */
#include <stdint.h>
#include "djinn/alloc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "djinn/engine.h"
#include "exec/stream_impl.h"
#include "model/model_impl.h"

static size_t wbytes(const dj_weight *w) {
    return (size_t)(w->shape[0] > 0 ? w->shape[0] : 1) *
           dj_dtype_row_bytes(w->dtype, (size_t)(w->shape[1] > 0 ? w->shape[1] : 1));
}

/* The placement of m (bound) in room text bytes; nothing streams when it fits. */
static dj_status decide(const dj_model_t *m, size_t room, dj_placement *pl) {
    const dj_model_config *c = &m->cfg;
    const int per = dj__wslot_per_layer(c);
    size_t *layer = dj_calloc(c->n_layers, sizeof *layer);
    if (!layer) return dj_fail(DJ_ENOMEM, "out of memory");
    size_t global = 0, max_tensor = 0;
    for (uint32_t l = 0; l < c->n_layers; l++)
        for (int i = 0; i < per; i++) {
            const dj_weight *w = &m->w[dj__wslot_layer_c(c, (int)l, i)];
            if (!dj__weight_has_bytes(w)) continue;
            layer[l] += dj_vmu_aligned(wbytes(w));
            if (dj_vmu_aligned(wbytes(w)) > max_tensor) max_tensor = dj_vmu_aligned(wbytes(w));
        }
    for (int i = 0; i < DJ_W_GLOBAL; i++)
        if (dj__weight_has_bytes(&m->w[dj__wslot_global(c, i)]))
            global += dj_vmu_aligned(wbytes(&m->w[dj__wslot_global(c, i)]));
    const dj_status st = dj_placement_decide(layer, c->n_layers, max_tensor, global, room, pl);
    free(layer);
    if (st != DJ_OK) {
        char why[768];
        snprintf(why, sizeof why, "%s", dj_last_error());
        return dj_fail(st, "model %s: %s", m->name, why);
    }
    return DJ_OK;
}

dj_status dj__stream_plan(dj_backend_t *be, dj_model_t *m, size_t room, dj_model_stream **out) {
    *out = NULL;
    if (m->text_bytes <= room) return DJ_OK;
    if (!be->vt->ring_new || !be->vt->ring_free || !be->vt->compute_plan)
        return dj_fail(DJ_EUNSUPPORTED, "model %s needs %zu text bytes, %zu are free, and the %s backend cannot stream",
                       m->name, m->text_bytes, room, be->vt->name);
    dj_model_stream *s = dj_calloc(1, sizeof *s);
    if (!s) return dj_fail(DJ_ENOMEM, "out of memory");
    const dj_status st = decide(m, room, &s->pl);
    if (st != DJ_OK) {
        free(s);
        return st;
    }
    s->be = be;
    m->text_bytes = s->pl.resident_bytes + dj_vmu_aligned(s->pl.ring_bytes);
    *out = s;
    return DJ_OK;
}

bool dj__stream_slot(const dj_model_t *m, int slot) {
    const int per = dj__wslot_per_layer(&m->cfg);
    const int l = slot / per;
    return m->stream && l < (int)m->cfg.n_layers && m->stream->pl.streamed[l];
}

/* Page-locks the host ranges the copies read: the streamed tensors' pages,
 * merged where they touch. */
typedef struct range {
    uintptr_t a, z;
} range;

static int range_cmp(const void *x, const void *y) {
    const range *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

static void unregister_all(dj_model_stream *s) {
    for (size_t i = 0; i < s->n_registered; i++) s->be->vt->host_unregister(s->be, s->registered[i]);
    free(s->registered);
    s->registered = NULL;
    s->n_registered = 0;
}

static dj_status register_source(dj_model_stream *s, size_t n_spans) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    range *r = dj_malloc(n_spans * sizeof *r);
    s->registered = dj_calloc(n_spans, sizeof *s->registered);
    if (!r || !s->registered) {
        free(r);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n_spans; i++) {
        r[i].a = (uintptr_t)s->spans[i].host / page * page;
        r[i].z = ((uintptr_t)s->spans[i].host + s->spans[i].bytes + page - 1) / page * page;
    }
    qsort(r, n_spans, sizeof *r, range_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n_spans; i++) {
        if (m && r[i].a <= r[m - 1].z) {
            if (r[i].z > r[m - 1].z) r[m - 1].z = r[i].z;
        } else {
            r[m++] = r[i];
        }
    }
    dj_status st = DJ_OK;
    for (size_t i = 0; i < m && st == DJ_OK; i++) {
        st = s->be->vt->host_register(s->be, (void *)r[i].a, r[i].z - r[i].a);
        if (st == DJ_OK) s->registered[s->n_registered++] = (void *)r[i].a;
    }
    free(r);
    if (st != DJ_OK) unregister_all(s);
    return st;
}

/* A page-locked copy of the streamed tensors; the spans then read it. */
static dj_status pinned_copy(dj_model_stream *s, size_t n_spans) {
    size_t total = 0;
    for (size_t i = 0; i < n_spans; i++) total += dj_vmu_aligned(s->spans[i].bytes);
    dj_status st = s->be->vt->host_alloc(s->be, total, &s->pinned);
    if (st != DJ_OK) return st;
    uint8_t *p = s->pinned;
    for (size_t i = 0; i < n_spans; i++) {
        memcpy(p, s->spans[i].host, s->spans[i].bytes);
        s->spans[i].host = p;
        p += dj_vmu_aligned(s->spans[i].bytes);
    }
    return DJ_OK;
}

/* A layer's FFN tensors (norms around it, the MLP or the MoE router and experts). */
static bool ffn_slot(int i) {
    switch (i) {
    case DJ_W_FFN_NORM: case DJ_W_GATE: case DJ_W_UP: case DJ_W_DOWN: case DJ_W_GATEB: case DJ_W_UPB:
    case DJ_W_DOWNB: case DJ_W_POST_FFN_NORM: case DJ_W_ROUTER: return true;
    default: return i >= DJ_W_FIXED;
    }
}

dj_status dj__stream_setup(dj_model_t *m) {
    dj_model_stream *s = m->stream;
    const dj_model_config *c = &m->cfg;
    const int per = dj__wslot_per_layer(c);
    size_t n = 0;
    uint32_t S = 0; /* loads: each streamed layer's attention part, then its FFN part */
    for (uint32_t l = 0; l < c->n_layers; l++) {
        bool part[2] = {false, false};
        for (int i = 0; s->pl.streamed[l] && i < per; i++)
            if (dj__weight_has_bytes(&m->w[dj__wslot_layer_c(c, (int)l, i)])) {
                n++;
                part[ffn_slot(i)] = true;
            }
        S += part[0] + part[1];
    }
    size_t *bytes = dj_malloc((n ? n : 1) * sizeof *bytes);
    uint32_t *load = dj_malloc((n ? n : 1) * sizeof *load);
    int *slot = dj_malloc((n ? n : 1) * sizeof *slot);
    s->layer_load = dj_malloc(c->n_layers * sizeof *s->layer_load);
    s->layer_ffn = dj_malloc(c->n_layers * sizeof *s->layer_ffn);
    s->loads = dj_calloc(S ? S : 1, sizeof *s->loads);
    s->spans = dj_calloc(n ? n : 1, sizeof *s->spans);
    s->n_loads = S;
    dj_status st = DJ_OK;
    if (!bytes || !load || !slot || !s->layer_load || !s->layer_ffn || !s->loads || !s->spans) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto done;
    }
    size_t t = 0;
    uint32_t k = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        s->layer_load[l] = s->layer_ffn[l] = -1;
        for (int ffn = 0; s->pl.streamed[l] && ffn < 2; ffn++) {
            const size_t t0 = t;
            for (int i = 0; i < per; i++) {
                const int sl = dj__wslot_layer_c(c, (int)l, i);
                if (!dj__weight_has_bytes(&m->w[sl]) || ffn_slot(i) != (bool)ffn) continue;
                bytes[t] = wbytes(&m->w[sl]);
                load[t] = k;
                slot[t++] = sl;
            }
            if (t == t0) continue;
            if (ffn) s->layer_ffn[l] = (int32_t)k;
            else s->layer_load[l] = (int32_t)k;
            k++;
        }
    }
    if ((st = dj_ring_layout_make(s->pl.ring_bytes, DJ_VMU_ALIGN, bytes, load, n, S, &s->lay)) != DJ_OK) goto done;
    void *ring = NULL;
    if ((st = dj_vmu_model_alloc(m->region, s->pl.ring_bytes, &ring)) != DJ_OK) goto done;
    s->ring = ring;
    for (size_t i = 0; i < n; i++) {
        dj_weight *w = &m->w[slot[i]];
        const dj_tensor_info *ti = dj_checkpoint_find(m->ck, w->hf_name);
        w->data = s->ring + s->lay.off[i];
        s->spans[i] = (dj_copy_span){.dev = (void *)w->data,
                                     .host = (uint8_t *)ti->data + w->src_offset,
                                     .bytes = bytes[i]};
    }
    for (size_t i = 0, j = 0; j < S; j++) { /* each load's spans and waits */
        s->loads[j].spans = &s->spans[i];
        while (i < n && load[i] == j) {
            s->loads[j].n_spans++;
            i++;
        }
        s->loads[j].after = &s->lay.after[s->lay.after_at[j]];
        s->loads[j].n_after = s->lay.after_at[j + 1] - s->lay.after_at[j];
    }
    st = s->be->vt->ring_new(s->be, S, &s->bring);
done:
    free(bytes);
    free(load);
    free(slot);
    return st;
}

dj_status dj__stream_source(dj_model_t *m) {
    dj_model_stream *s = m->stream;
    dj_backend_t *be = s->be;
    const size_t n = s->lay.n_tensors;
    dj_status st = DJ_OK;
    if (be->host_memory) {
        s->src = DJ_STREAM_SRC_MAPPED;
    } else if (be->vt->host_register && be->vt->host_unregister && register_source(s, n) == DJ_OK) {
        s->src = DJ_STREAM_SRC_REGISTERED;
    } else if (be->vt->host_alloc && be->vt->host_free) {
        if ((st = pinned_copy(s, n)) != DJ_OK) return st;
        s->src = DJ_STREAM_SRC_PINNED_COPY;
    } else {
        s->src = DJ_STREAM_SRC_MAPPED; /* pageable: slower copies, still correct */
    }
    DJ_LOG(INFO, "model %s streams %u of %u layers (%.1f MiB a step) through a ring of %.1f MiB (%u layers deep)",
           m->name, s->pl.n_streamed, m->cfg.n_layers, (double)s->pl.streamed_bytes / 1048576.0,
           (double)s->pl.ring_bytes / 1048576.0, s->pl.ring_layers);
    return s->share_cols ? dj__stream_share_setup(m) : DJ_OK;
}

void dj__stream_free(dj_model_stream *s) {
    if (!s) return;
    if (s->scratch || s->host) (void)s->be->vt->sync(s->be); /* host runs read their scratch until done */
    if (s->scratch) {
        if (s->be->vt->host_alloc && s->be->vt->host_free) s->be->vt->host_free(s->be, s->scratch);
        else free(s->scratch);
    }
    dj_backend_free(s->host);
    free(s->host_layer);
    free(s->share_layer);
    free(s->share_loads);
    free(s->share_spans);
    free(s->step_loads);
    free(s->runs);
    free(s->run_calls);
    free(s->run_spans);
    free(s->call_layer);
    free(s->layer_ffn);
    if (s->bring) s->be->vt->ring_free(s->be, s->bring);
    unregister_all(s);
    if (s->pinned) s->be->vt->host_free(s->be, s->pinned);
    dj_ring_layout_free(&s->lay);
    dj_placement_free(&s->pl);
    free(s->layer_load);
    free(s->loads);
    free(s->spans);
    free(s->call_load);
    free(s);
}

dj_status dj__stream_reserve(dj_model_stream *s, size_t n) {
    if (n <= s->call_cap) return DJ_OK;
    int32_t *p = dj_realloc(s->call_load, n * sizeof *p);
    if (p) s->call_load = p;
    int32_t *q = p ? dj_realloc(s->call_layer, n * sizeof *q) : NULL;
    if (q) s->call_layer = q;
    dj_op_call *c = q && s->n_host ? dj_realloc(s->run_calls, n * sizeof *c) : NULL;
    if (c) s->run_calls = c;
    dj_copy_span *sp = c ? dj_realloc(s->run_spans, 2 * n * sizeof *sp) : NULL;
    if (sp) s->run_spans = sp;
    if (!p || !q || (s->n_host && (!c || !sp)))
        return dj_fail(DJ_ENOMEM, "out of memory for a streamed step of %zu calls", n);
    s->call_cap = n;
    return DJ_OK;
}

static bool in_ring(const dj_model_stream *s, const void *p) {
    return p && (const uint8_t *)p >= s->ring && (const uint8_t *)p < s->ring + s->pl.ring_bytes;
}

/* Whether load k has a tensor starting at p. */
static bool load_has(const dj_model_stream *s, int32_t k, const void *p) {
    for (uint32_t i = 0; k >= 0 && p && i < s->loads[k].n_spans; i++)
        if (s->loads[k].spans[i].dev == p) return true;
    return false;
}

int32_t dj__stream_call_load(const dj_model_stream *s, const dj_op_call *c, int layer) {
    if (!in_ring(s, c->w) && !in_ring(s, c->bias) && !in_ring(s, c->w_up) && !in_ring(s, c->w_down)) return -1;
    if (layer < 0 || (uint32_t)layer >= s->pl.n_layers) return -1;
    const int32_t f = s->layer_ffn[layer];
    const bool ffn = load_has(s, f, c->w) || load_has(s, f, c->bias) || load_has(s, f, c->w_up) ||
                     load_has(s, f, c->w_down);
    return ffn ? f : s->layer_load[layer];
}

void dj__stream_step(dj_model_stream *s, bool prefetch, dj_stream_step *out) {
    *out = (dj_stream_step){.ring = s->bring,
                            .loads = s->n_runs ? s->step_loads : s->loads,
                            .n_loads = s->n_loads,
                            .call_load = s->call_load,
                            .prefetch = prefetch,
                            .runs = s->n_runs ? s->runs : NULL,
                            .n_runs = s->n_runs,
                            .host = s->host};
    s->steps++;
    s->host_steps += s->n_runs > 0;
    s->bytes += s->pl.streamed_bytes - (s->n_runs ? s->step_saved : 0);
}

static void fill_placement(const dj_placement *pl, size_t resident_all, dj_model_placement *out) {
    memset(out, 0, sizeof *out);
    out->n_layers = pl->n_layers;
    out->n_streamed = pl->n_streamed;
    out->ring_layers = pl->ring_layers;
    out->resident_bytes = pl->n_streamed ? pl->resident_bytes : resident_all;
    out->ring_bytes = pl->ring_bytes;
    out->streamed_bytes = pl->streamed_bytes;
    out->source = "";
    const uint32_t n = pl->n_layers < sizeof out->layers - 1 ? pl->n_layers : (uint32_t)sizeof out->layers - 1;
    for (uint32_t l = 0; l < n; l++) out->layers[l] = pl->streamed && pl->streamed[l] ? 'S' : 'R';
    out->layers[n] = '\0';
}

void dj_model_get_placement(const dj_model_t *m, dj_model_placement *out) {
    static const char *const src[] = {"mapped", "registered", "pinned copy"};
    if (!m->stream) {
        const dj_placement none = {.n_layers = m->cfg.n_layers};
        fill_placement(&none, m->text_bytes + m->mapped_bytes, out);
        return;
    }
    const dj_model_stream *s = m->stream;
    fill_placement(&s->pl, 0, out);
    out->source = src[s->src];
    out->steps = s->steps;
    out->n_host = s->n_host;
    out->host_rows = s->host_rows;
    out->host_share = s->n_host ? (s->share_cols ? (double)s->share_cols / m->cfg.intermediate_size : 1.0) : 0.0;
    out->copy_gbps = s->copy_gbps;
    out->host_gbps = s->host_gbps;
    out->host_steps = s->host_steps;
    out->copied_bytes = s->bytes;
    for (uint32_t l = 0; s->host_layer && l < s->pl.n_layers && out->layers[l]; l++)
        if (s->host_layer[l]) out->layers[l] = s->share_layer && s->share_layer[l] ? 'h' : 'H';
}

dj_status dj_model_plan_placement(const dj_checkpoint_t *ck, size_t text_room, dj_model_placement *out) {
    const dj_model_config *c = dj_checkpoint_config(ck);
    const int n = dj__wslot_count(c);
    dj_model_t m = {.cfg = *c};
    snprintf(m.name, sizeof m.name, "%s", "model");
    char **names = dj_calloc((size_t)n, sizeof *names);
    m.w = dj_calloc((size_t)n, sizeof *m.w);
    dj_status st = !names || !m.w ? dj_fail(DJ_ENOMEM, "out of memory") : dj__model_bind(c, ck, m.w, names);
    if (st == DJ_OK) {
        for (int i = 0; i < n; i++)
            if (dj__weight_has_bytes(&m.w[i])) m.text_bytes += dj_vmu_aligned(wbytes(&m.w[i]));
        dj_placement pl;
        if (m.text_bytes <= text_room) {
            fill_placement(&(dj_placement){.n_layers = c->n_layers}, m.text_bytes, out);
        } else if ((st = decide(&m, text_room, &pl)) == DJ_OK) {
            fill_placement(&pl, 0, out);
            dj_placement_free(&pl);
        }
    }
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(m.w);
    return st;
}
