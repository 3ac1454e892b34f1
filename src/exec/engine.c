/* engine.c: the embedded engine - loading models into the text segment,
 * sessions with paged KV in the data segment, and executing planned steps
 * with every activation on the stack segment. */
#include "djinn/engine.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_impl.h"

#ifdef DJ_HAVE_CUDA
#include "djinn/dj_cuda.h"
#endif

#define DJ_PLAN_CACHE_ENTRIES 64

struct dj_engine {
    dj_backend_t *be;
    dj_vmu_t *vmu;
    dj_plan_cache_t *plans;
    uint32_t max_step;
};

struct dj_session {
    dj_model_t *model;        /* holds one model reference */
    dj_vmu_session_t *vs;
    uint32_t pos;             /* tokens in the cache */
    uint32_t max_ctx;
    uint32_t tokens_per_page;
    uint32_t max_blocks;      /* per layer */
    uint32_t n_blocks;        /* blocks mapped in every layer */
    uint32_t *block_table;    /* [n_layers][max_blocks] page ids */
    dj_kv_view *kv;           /* [n_layers] */
};

/* ---- engine ---- */

dj_status dj_engine_new(const dj_engine_config *cfg, dj_engine_t **out) {
    *out = NULL;
    const bool cpu = !cfg->device || strcmp(cfg->device, "cpu") == 0;
    int gpu = -1; /* "cuda" or "cuda:N" */
#ifdef DJ_HAVE_CUDA
    if (!cpu && strncmp(cfg->device, "cuda", 4) == 0) {
        char *end = NULL;
        const char *d = cfg->device + 4;
        long v = *d == ':' ? strtol(d + 1, &end, 10) : 0;
        if ((*d == '\0' || (end && end != d + 1 && *end == '\0')) && v >= 0 && v <= INT_MAX) gpu = (int)v;
    }
#endif
    if (!cpu && gpu < 0)
        return dj_fail(DJ_EUNSUPPORTED, "device '%s' is not available in this build (%s)", cfg->device,
#ifdef DJ_HAVE_CUDA
                       "'cpu', 'cuda' or 'cuda:N'"
#else
                       "only 'cpu'"
#endif
        );
    dj_engine_t *e = calloc(1, sizeof *e);
    if (!e) return dj_fail(DJ_ENOMEM, "out of memory");
    dj_status st = DJ_OK;
#ifdef DJ_HAVE_CUDA
    if (gpu >= 0) st = dj_backend_cuda_new(gpu, &e->be);
    else
#endif
        st = dj_backend_cpu_new(cfg->n_threads, &e->be);
    if (st != DJ_OK) goto fail;
    st = dj_vmu_new(e->be, &cfg->vmu, &e->vmu);
    if (st != DJ_OK) goto fail;
    st = dj_plan_cache_new(DJ_PLAN_CACHE_ENTRIES, &e->plans);
    if (st != DJ_OK) goto fail;
    e->max_step = cfg->max_step_tokens ? cfg->max_step_tokens : 512;
    *out = e;
    return DJ_OK;
fail:
    dj_engine_free(e);
    return st;
}

void dj_engine_free(dj_engine_t *e) {
    if (!e) return;
    dj_plan_cache_free(e->plans);
    dj_vmu_free(e->vmu); /* evicts cached models: their dtors free the host structs */
    dj_backend_free(e->be);
    free(e);
}

dj_vmu_t *dj_engine_vmu(dj_engine_t *e) { return e->vmu; }
dj_backend_t *dj_engine_backend(dj_engine_t *e) { return e->be; }
dj_plan_cache_t *dj_engine_plans(dj_engine_t *e) { return e->plans; }

/* ---- sizing ---- */

static size_t weight_bytes(const dj_weight *w) {
    size_t n = (size_t)w->shape[0] * (size_t)(w->shape[1] ? w->shape[1] : 1);
    return n * dj_dtype_size(w->dtype);
}

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
    dj_weight *w = calloc((size_t)n, sizeof *w);
    char **names = calloc((size_t)n, sizeof *names);
    dj_graph_t *g = NULL;
    dj_status st = DJ_OK;
    if (!w || !names) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto done;
    }
    st = dj__model_bind(c, ck, w, names);
    if (st != DJ_OK) goto done;
    for (int i = 0; i < n; i++) {
        if (!names[i] && i != dj__wslot_global(c, DJ_W_INV_FREQ)) continue;
        needs->text_bytes += dj_vmu_aligned(weight_bytes(&w[i]));
        if (names[i]) needs->n_params += (uint64_t)(weight_bytes(&w[i]) / dj_dtype_size(w[i].dtype));
    }
    needs->kv_bytes_per_token = (size_t)2 * c->n_layers * c->n_kv_heads * c->head_dim * dj_dtype_size(kv_dtype);
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
    int n = dj__wslot_count(&m->cfg);
    for (int i = 0; i < n; i++) free((char *)m->w[i].hf_name);
    free(m->w);
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

dj_status dj_model_load_checkpoint(dj_engine_t *e, dj_checkpoint_t *ck, const char *name, dj_model_t **out) {
    *out = NULL;
    const uint64_t fp = dj_checkpoint_fingerprint(ck);
    dj_vmu_model_t *region = NULL;
    dj_status st = dj_vmu_model_lookup(e->vmu, fp, &region);
    if (st == DJ_OK) { /* shared: already in the text segment */
        *out = dj_vmu_model_user(region);
        return DJ_OK;
    }
    if (st != DJ_ENOTFOUND) return st;

    const dj_model_config *c = dj_checkpoint_config(ck);
    if (c->head_dim % 2 != 0 || c->head_dim == 0)
        return dj_fail(DJ_EUNSUPPORTED, "head_dim %u: RoPE needs an even head dimension", c->head_dim);
    const int n = dj__wslot_count(c);
    dj_model_t *m = calloc(1, sizeof *m);
    char **names = calloc((size_t)n, sizeof *names);
    float *inv_freq = NULL;
    if (!m || !names || !(m->w = calloc((size_t)n, sizeof *m->w))) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto fail;
    }
    m->cfg = *c;
    m->fingerprint = fp;
    snprintf(m->name, sizeof m->name, "%s", name ? name : "model");
    st = dj__model_bind(c, ck, m->w, names);
    if (st != DJ_OK) goto fail;
    const int inv_slot = dj__wslot_global(c, DJ_W_INV_FREQ);
    for (int i = 0; i < n; i++) {
        if (!names[i] && i != inv_slot) continue;
        m->text_bytes += dj_vmu_aligned(weight_bytes(&m->w[i]));
        if (names[i]) m->n_params += (uint64_t)(weight_bytes(&m->w[i]) / dj_dtype_size(m->w[i].dtype));
    }
    st = dj_vmu_model_create(e->vmu, fp, m->name, m->text_bytes, &region);
    if (st != DJ_OK) goto fail;
    /* The region owns m from here: on any later failure it is released and
     * evicted, which frees m through model_dtor. */
    m->region = region;
    dj_vmu_model_set_user(region, m, model_dtor);
    free(names); /* the strings now belong to m->w[i].hf_name */
    names = NULL;
    for (int i = 0; i < n; i++) {
        dj_weight *w = &m->w[i];
        if (!w->hf_name && i != inv_slot) continue;
        void *dst = NULL;
        size_t bytes = weight_bytes(w);
        st = dj_vmu_model_alloc(region, bytes, &dst);
        if (st != DJ_OK) goto fail_region;
        if (i == inv_slot) {
            inv_freq = malloc(bytes);
            if (!inv_freq) {
                st = dj_fail(DJ_ENOMEM, "out of memory");
                goto fail_region;
            }
            dj__rope_inv_freq(c, inv_freq);
            st = e->be->vt->upload(e->be, dst, inv_freq, bytes);
        } else {
            const dj_tensor_info *t = dj_checkpoint_find(ck, w->hf_name);
            st = e->be->vt->upload(e->be, dst, t->data, bytes);
        }
        if (st != DJ_OK) goto fail_region;
        w->data = dst;
    }
    free(inv_freq);
    *out = m;
    return DJ_OK;
fail_region:
    free(inv_freq);
    dj_vmu_model_release(e->vmu, region); /* cached with half its weights: make it unfindable */
    dj_vmu_model_evict(e->vmu, region);
    return st;
fail:
    free_names(names, n);
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

/* ---- sessions ---- */

dj_status dj_session_new(dj_engine_t *e, dj_model_t *m, uint32_t max_ctx, size_t quota_pages,
                         dj_session_t **out) {
    *out = NULL;
    const dj_model_config *c = &m->cfg;
    if (max_ctx == 0) max_ctx = c->max_position_embeddings;
    if (max_ctx == 0) return dj_fail(DJ_EINVAL, "session context length is 0");
    const size_t kv_dim = (size_t)c->n_kv_heads * c->head_dim;
    const size_t row = kv_dim * dj_dtype_size(e->be->kv_dtype);
    const size_t page = dj_vmu_page_bytes(e->vmu);
    if (page < 2 * row)
        return dj_fail(DJ_EINVAL, "KV page of %zu bytes cannot hold one position of K and V (%zu bytes)", page,
                       2 * row);
    dj_session_t *s = calloc(1, sizeof *s);
    if (!s) return dj_fail(DJ_ENOMEM, "out of memory");
    s->model = m;
    s->max_ctx = max_ctx;
    s->tokens_per_page = (uint32_t)(page / (2 * row));
    s->max_blocks = (max_ctx + s->tokens_per_page - 1) / s->tokens_per_page;
    s->block_table = calloc((size_t)c->n_layers * s->max_blocks, sizeof *s->block_table);
    s->kv = calloc(c->n_layers, sizeof *s->kv);
    dj_status st = DJ_OK;
    if (!s->block_table || !s->kv) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto fail;
    }
    char name[300];
    snprintf(name, sizeof name, "%s#%p", m->name, (void *)s);
    st = dj_vmu_session_new(e->vmu, name, quota_pages, &s->vs);
    if (st != DJ_OK) goto fail;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        dj_kv_view *v = &s->kv[l];
        v->seg_base = dj_vmu_data_base(e->vmu);
        v->page_bytes = page;
        v->block_table = s->block_table + (size_t)l * s->max_blocks;
        v->n_blocks = 0;
        v->tokens_per_page = s->tokens_per_page;
        v->kv_dim = (uint32_t)kv_dim;
        v->dtype = e->be->kv_dtype;
    }
    /* The session holds its own model reference. */
    dj_vmu_model_t *again = NULL;
    st = dj_vmu_model_lookup(e->vmu, m->fingerprint, &again);
    if (st != DJ_OK) goto fail;
    *out = s;
    return DJ_OK;
fail:
    dj_vmu_session_free(e->vmu, s->vs);
    free(s->block_table);
    free(s->kv);
    free(s);
    return st;
}

void dj_session_free(dj_engine_t *e, dj_session_t *s) {
    if (!s) return;
    dj_vmu_session_free(e->vmu, s->vs);
    dj_vmu_model_release(e->vmu, s->model->region);
    free(s->block_table);
    free(s->kv);
    free(s);
}

uint32_t dj_session_pos(const dj_session_t *s) { return s->pos; }
uint32_t dj_session_max_ctx(const dj_session_t *s) { return s->max_ctx; }

/* Map pages so that positions [0, upto) are backed in every layer. */
static dj_status ensure_pages(dj_engine_t *e, dj_session_t *s, uint32_t upto) {
    const uint32_t need = (upto + s->tokens_per_page - 1) / s->tokens_per_page;
    const dj_model_config *c = &s->model->cfg;
    while (s->n_blocks < need) {
        const uint32_t b = s->n_blocks;
        for (uint32_t l = 0; l < c->n_layers; l++) {
            uint32_t page;
            dj_status st = dj_vmu_page_alloc(e->vmu, s->vs, &page);
            if (st != DJ_OK) {
                for (uint32_t j = 0; j < l; j++) /* undo this block's partial mapping */
                    dj_vmu_page_free(e->vmu, s->vs, s->block_table[(size_t)j * s->max_blocks + b]);
                return st;
            }
            s->block_table[(size_t)l * s->max_blocks + b] = page;
        }
        s->n_blocks++;
        for (uint32_t l = 0; l < c->n_layers; l++) s->kv[l].n_blocks = s->n_blocks;
    }
    return DJ_OK;
}

/* ---- execution ---- */

static dj_status get_plan(dj_engine_t *e, const dj_model_t *m, uint32_t n, dj_graph_t **out) {
    const dj_phase phase = n == 1 ? DJ_PHASE_DECODE : DJ_PHASE_PREFILL;
    const uint32_t bucket = dj_shape_bucket(phase, n, e->max_step);
    dj_graph_t *g = dj_plan_cache_get(e->plans, m->fingerprint, bucket);
    if (g) {
        *out = g;
        return DJ_OK;
    }
    dj_status st = dj_model_build_graph(&m->cfg, m, phase, bucket, &g);
    if (st != DJ_OK) return st;
    size_t peak = 0;
    st = dj_graph_plan(g, &peak);
    if (st == DJ_OK) st = dj_plan_cache_put(e->plans, m->fingerprint, bucket, g);
    if (st != DJ_OK) {
        dj_graph_free(g);
        return st;
    }
    *out = g;
    return DJ_OK;
}

static const void *node_ptr(const dj_model_t *m, const dj_graph_t *g, int idx, uint8_t *stack) {
    if (idx < 0) return NULL;
    const dj_node *nd = dj_graph_node_c(g, idx);
    switch (nd->res) {
    case DJ_RES_WEIGHT: return nd->data ? nd->data : m->w[nd->weight_slot].data;
    case DJ_RES_ACTIVATION:
    case DJ_RES_OUTPUT: return stack + nd->offset;
    default: return NULL;
    }
}

static dj_dtype node_dtype(const dj_graph_t *g, int idx) {
    return idx < 0 ? DJ_DTYPE_F32 : dj_graph_node_c(g, idx)->dtype;
}

/* One chunk of n <= max_step tokens at the session's position. */
static dj_status run_chunk(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n, float *logits) {
    const dj_model_t *m = s->model;
    dj_graph_t *g = NULL;
    dj_status st = get_plan(e, m, n, &g);
    if (st != DJ_OK) return st;
    st = ensure_pages(e, s, s->pos + n);
    if (st != DJ_OK) return st;
    const size_t mark = dj_vmu_stack_mark(e->vmu);
    void *stack_v = NULL;
    st = dj_vmu_stack_push(e->vmu, dj_graph_peak(g), &stack_v);
    if (st != DJ_OK) return st;
    uint8_t *stack = stack_v;
    int out_idx = -1;
    const int count = dj_graph_count(g);
    for (int i = 0; i < count && st == DJ_OK; i++) {
        const dj_node *nd = dj_graph_node_c(g, i);
        if (nd->op >= DJ_OP_COUNT) continue; /* inputs and weights */
        dj_op_call call = nd->params;
        call.op = nd->op;
        call.n = n;
        call.pos0 = s->pos;
        call.out = nd->res == DJ_RES_KV ? NULL : stack + nd->offset;
        call.out_dtype = nd->res == DJ_RES_OUTPUT ? DJ_DTYPE_F32 : e->be->act_dtype; /* logits: f32 */
        const void *x = node_ptr(m, g, nd->src[0], stack);
        const void *x1 = node_ptr(m, g, nd->src[1], stack);
        switch (nd->op) {
        case DJ_OP_EMBED:
            call.ids = ids;
            call.w = x1;
            call.w_dtype = node_dtype(g, nd->src[1]);
            break;
        case DJ_OP_RMSNORM:
        case DJ_OP_MATMUL:
            call.x = x;
            call.w = x1;
            call.w_dtype = node_dtype(g, nd->src[1]);
            call.bias = node_ptr(m, g, nd->src[2], stack);
            call.bias_dtype = node_dtype(g, nd->src[2]);
            if (nd->flags & DJ_NODE_LAST_ROW) {
                call.x = (const uint8_t *)x + (size_t)(n - 1) * call.k * dj_dtype_size(e->be->act_dtype);
                call.n = 1;
            }
            break;
        case DJ_OP_ROPE:
            call.x = x;
            call.inv_freq = x1;
            break;
        case DJ_OP_KV_WRITE:
            call.x = x;
            call.x2 = x1;
            call.kv = &s->kv[nd->layer];
            break;
        case DJ_OP_ATTENTION:
            call.x = x;
            call.kv = &s->kv[nd->layer];
            break;
        case DJ_OP_SILU_MUL:
        case DJ_OP_ADD:
            call.x = x;
            call.x2 = x1;
            break;
        default:
            st = dj_fail(DJ_EINTERNAL, "node %d has op %d the executor does not know", i, (int)nd->op);
            continue;
        }
        st = dj_backend_compute(e->be, &call);
        if (nd->res == DJ_RES_OUTPUT) out_idx = i;
    }
    if (st == DJ_OK) st = e->be->vt->sync(e->be);
    if (st == DJ_OK && logits && out_idx >= 0)
        st = e->be->vt->download(e->be, logits, stack + dj_graph_node_c(g, out_idx)->offset,
                                 (size_t)m->cfg.vocab_size * sizeof(float));
    dj_vmu_stack_reset(e->vmu, mark);
    if (st == DJ_OK) s->pos += n;
    return st;
}

dj_status dj_session_step(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n, float *logits) {
    const dj_model_config *c = &s->model->cfg;
    if (n == 0) return dj_fail(DJ_EINVAL, "a step needs at least one token");
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= c->vocab_size)
            return dj_fail(DJ_ERANGE, "token id %d at index %u is outside the vocabulary [0, %u)", ids[i], i,
                           c->vocab_size);
    if ((uint64_t)s->pos + n > s->max_ctx)
        return dj_fail(DJ_ERANGE, "%u more tokens would exceed the session's context of %u (%u used)", n,
                       s->max_ctx, s->pos);
    const uint32_t start = s->pos;
    for (uint32_t off = 0; off < n;) {
        uint32_t chunk = n - off < e->max_step ? n - off : e->max_step;
        dj_status st = run_chunk(e, s, ids + off, chunk, off + chunk == n ? logits : NULL);
        if (st != DJ_OK) {
            s->pos = start; /* the KV rows written are simply overwritten next time */
            return st;
        }
        off += chunk;
    }
    return DJ_OK;
}
