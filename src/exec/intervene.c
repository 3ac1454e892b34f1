/* intervene.c: a step with interventions - named points of the forward pass
 * resolved to the plan's tagged nodes, saved or edited between the plan's
 * segments through the executor's step hook (engine_impl.h). */
#include <stdio.h>
#include "djinn/alloc.h"
#include <stdlib.h>
#include <string.h>

#include "djinn/intervene.h"
#include "exec/engine_impl.h"
#include "exec/stream_impl.h"

/* ---- names ---- */

static bool is(const char *p, const char *end, const char *word) {
    const size_t k = strlen(word);
    return (size_t)(end - p) == k && memcmp(p, word, k) == 0;
}

dj_status dj_point_parse(const char *name, size_t len, uint32_t n_layers, dj_point *out) {
    const int show = len > 64 ? 64 : (int)len;
    if (!name) return dj_fail(DJ_EINVAL, "a point needs a name");
    const char *end = name + len;
    if (is(name, end, "final_norm.output")) {
        out->kind = DJ_POINT_FINAL_NORM;
        out->layer = 0;
        return DJ_OK;
    }
    static const char prefix[] = "layers.";
    const size_t pl = sizeof prefix - 1;
    if (len <= pl || memcmp(name, prefix, pl) != 0) goto unknown;
    const char *digits = name + pl, *p = digits;
    uint64_t layer = 0;
    while (p < end && *p >= '0' && *p <= '9' && p - digits < 10) layer = layer * 10 + (uint64_t)(*p++ - '0');
    if (p == digits || (p - digits > 1 && *digits == '0') || (p < end && *p >= '0' && *p <= '9')) goto unknown;
    dj_point_kind kind;
    if (is(p, end, ".input")) kind = DJ_POINT_LAYER_INPUT;
    else if (is(p, end, ".attn.output")) kind = DJ_POINT_ATTN_OUTPUT;
    else if (is(p, end, ".mlp.output")) kind = DJ_POINT_MLP_OUTPUT;
    else if (is(p, end, ".output")) kind = DJ_POINT_LAYER_OUTPUT;
    else goto unknown;
    if (layer >= n_layers)
        return dj_fail(DJ_ERANGE, "point '%.*s': layer %llu is out of range; the model has %u layers (0..%u)", show,
                       name, (unsigned long long)layer, n_layers, n_layers ? n_layers - 1 : 0);
    out->kind = kind;
    out->layer = (uint32_t)layer;
    return DJ_OK;
unknown:
    return dj_fail(DJ_EINVAL,
                   "unknown point '%.*s': want layers.{i}.input, layers.{i}.attn.output, layers.{i}.mlp.output, "
                   "layers.{i}.output or final_norm.output",
                   show, name);
}

const char *dj_point_name(dj_point p, char *buf, size_t cap) {
    static const char *const suffix[] = {"input", "attn.output", "mlp.output", "output"};
    if (p.kind == DJ_POINT_FINAL_NORM) snprintf(buf, cap, "final_norm.output");
    else if ((unsigned)p.kind < 4) snprintf(buf, cap, "layers.%u.%s", p.layer, suffix[p.kind]);
    else snprintf(buf, cap, "?");
    return buf;
}

/* ---- the traced step ---- */

/* Distinct points of one step whose saves are device copies; the rest go
 * through the host. Bounds the engine's trace area at this many
 * [max_step_tokens][hidden] activations. */
#define TRACE_COPY_POINTS 8
#define TRACE_ALIGN 256

/* A point where the step stops (the plan splits after its node). A point
 * with only saves is a copy: its activation goes by one device-to-device
 * copy into its slot of the engine's trace area, in stream order, and comes
 * to the callers' buffers after the step (prefill on a device: on the copy
 * stream while the rest of the step runs). A point with an edit goes
 * through the host: the step waits for the device, the activation comes
 * down, the edits apply in f32 and it goes back up. */
typedef struct trace_stop {
    int node;
    bool copy;
    dj_dtype dtype;            /* copy: the activation's element type */
    size_t off;                /* copy: its slot in the trace area */
    dj_backend_xfer_t *x;      /* copy: its slot's transfer to host memory, in flight */
    bool delivered;            /* copy: the callers' buffers hold it */
} trace_stop;

typedef struct trace {
    const dj_intervention *iv;
    uint32_t n_iv;
    uint32_t n;              /* token rows */
    uint32_t d;              /* hidden size */
    int node[DJ_IV_MAX];     /* the plan node of iv[k] */
    trace_stop stop[DJ_IV_MAX];
    int n_stops;
    uint8_t *area_dev, *area_host; /* the engine's trace area */
    bool pinned;             /* area_host reachable by the backend's transfers */
    float *f32;              /* [n][d] scratch of host points (made at the first) */
    uint8_t *raw;            /* [n][d] scratch in the backend's element type (likewise) */
    bool brk;                /* the step has breakpoints: every stop goes through the host */
    dj__step_hook *hook;     /* brk: the step's hook (its pause flag) */
    uint32_t brk_iv;         /* brk: the BREAK the step stopped at */
} trace;

/* The node tagged for p in g, or -1. */
static int find_node(const dj_graph_t *g, dj_point p) {
    unsigned tag;
    int layer;
    switch (p.kind) {
    case DJ_POINT_LAYER_INPUT:
        tag = p.layer == 0 ? DJ_NODE_PT_EMBED : DJ_NODE_PT_LAYER;
        layer = p.layer == 0 ? -1 : (int)p.layer - 1;
        break;
    case DJ_POINT_ATTN_OUTPUT: tag = DJ_NODE_PT_ATTN, layer = (int)p.layer; break;
    case DJ_POINT_MLP_OUTPUT: tag = DJ_NODE_PT_MLP, layer = (int)p.layer; break;
    case DJ_POINT_LAYER_OUTPUT: tag = DJ_NODE_PT_LAYER, layer = (int)p.layer; break;
    case DJ_POINT_FINAL_NORM: tag = DJ_NODE_PT_FINAL_NORM, layer = -1; break;
    default: return -1;
    }
    const int count = dj_graph_count(g);
    for (int i = 0; i < count; i++) {
        const dj_node *nd = dj_graph_node_c(g, i);
        if ((nd->flags & tag) && nd->layer == layer) return i;
    }
    return -1;
}

static int cmp_int(const void *a, const void *b) {
    const int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static uint64_t fnv(uint64_t h, uint64_t v) {
    return (h ^ v) * 1099511628211ull;
}

static dj_status prepare(dj__step_hook *h, dj_engine_t *e, const dj_graph_t *g) {
    trace *t = h->user;
    int *stops = h->stops;
    const int cap = DJ__HOOK_STOPS;
    const dj_backend_t *be = dj_engine_backend(e);
    int n = 0;
    for (uint32_t k = 0; k < t->n_iv; k++) {
        const int i = find_node(g, t->iv[k].point);
        char nm[48];
        if (i < 0)
            return dj_fail(DJ_EINTERNAL, "the plan has no node for point %s",
                           dj_point_name(t->iv[k].point, nm, sizeof nm));
        const dj_node *nd = dj_graph_node_c(g, i);
        if (nd->shape[1] != (int64_t)t->d || nd->res != DJ_RES_ACTIVATION)
            return dj_fail(DJ_EINTERNAL, "point %s: node %s is not a [rows][%u] activation",
                           dj_point_name(t->iv[k].point, nm, sizeof nm), nd->name, t->d);
        t->node[k] = i;
        bool seen = false;
        for (int j = 0; j < n; j++) seen |= stops[j] == i;
        if (!seen && n == cap) return dj_fail(DJ_EINTERNAL, "more than %d distinct points in one step", cap);
        if (!seen) stops[n++] = i;
    }
    qsort(stops, (size_t)n, sizeof *stops, cmp_int);
    h->n_stops = n;
    /* which stops copy, their slots */
    t->n_stops = n;
    size_t bytes = 0;
    int copies = 0;
    for (int j = 0; j < n; j++) {
        trace_stop *sp = &t->stop[j];
        *sp = (trace_stop){.node = stops[j], .dtype = dj__engine_node_dtype(e, g, stops[j])};
        bool edited = false;
        for (uint32_t k = 0; k < t->n_iv; k++) edited |= t->node[k] == sp->node && t->iv[k].op != DJ_IV_SAVE;
        sp->copy = be->vt->copy && !edited && !t->brk && copies < TRACE_COPY_POINTS;
        if (!sp->copy) continue;
        copies++;
        sp->off = bytes;
        const size_t slot = (size_t)t->n * t->d * dj_dtype_size(sp->dtype);
        bytes += (slot + TRACE_ALIGN - 1) / TRACE_ALIGN * TRACE_ALIGN;
    }
    if (copies && dj__engine_trace_area(e, bytes, &t->area_dev, &t->area_host, &t->pinned) != DJ_OK) {
        DJ_LOG(WARN, "traced step: no room for %zu bytes of saved points (%s); they go through the host", bytes,
               dj_last_error());
        for (int j = 0; j < n; j++) t->stop[j].copy = false;
        copies = 0;
    }
    /* A decode step may replay a graph when every stop is a copy: the key
     * names the copies (sources, slots, types, the area). */
    uint64_t key = 0;
    if (copies == n) {
        key = fnv(1469598103934665603ull, t->n);
        key = fnv(key, (uintptr_t)t->area_dev);
        for (int j = 0; j < n; j++) {
            key = fnv(key, (uint64_t)t->stop[j].node);
            key = fnv(key, t->stop[j].off);
            key = fnv(key, (uint64_t)t->stop[j].dtype);
        }
        key |= 1; /* never 0: that is "no graph" */
    }
    h->graph_key = key;
    return DJ_OK;
}

static void to_f32(dj_dtype t, const uint8_t *src, float *dst, size_t k) { dj_dtype_widen_f32(t, src, dst, k); }

static void from_f32(dj_dtype t, const float *src, uint8_t *dst, size_t k) {
    if (t == DJ_DTYPE_F32) {
        memcpy(dst, src, k * sizeof *src);
        return;
    }
    for (size_t i = 0; i < k; i++) {
        const uint16_t h = t == DJ_DTYPE_BF16 ? dj_f32_to_bf16(src[i]) : dj_f32_to_f16(src[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

static trace_stop *stop_of(trace *t, int node) {
    for (int j = 0; j < t->n_stops; j++)
        if (t->stop[j].node == node) return &t->stop[j];
    return NULL;
}

/* A copy stop's activation (src: its slot in host memory) into the buffers
 * of every save at its node. */
static void deliver(trace *t, trace_stop *sp, const uint8_t *src) {
    const size_t k = (size_t)t->n * t->d;
    const float *first = NULL;
    for (uint32_t j = 0; j < t->n_iv; j++) {
        if (t->node[j] != sp->node) continue;
        if (first) {
            memcpy(t->iv[j].out, first, k * sizeof(float));
        } else {
            to_f32(sp->dtype, src, t->iv[j].out, k);
            first = t->iv[j].out;
        }
    }
    sp->delivered = true;
}

/* A point with edits (or any point of a step with breakpoints): through
 * the host, its interventions from iv[from] on. resumed: t->f32 holds the
 * value already (a breakpoint's, as the caller left it) and goes back up. A
 * BREAK stops there: its `out` receives the value and the hook pauses. */
static dj_status at_host(trace *t, dj_backend_t *be, int node, void *buf, dj_dtype dtype, uint32_t n, uint32_t from,
                         bool resumed) {
    const size_t k = (size_t)n * t->d, bytes = k * dj_dtype_size(dtype);
    if (!t->f32) t->f32 = dj_malloc(k * sizeof(float));
    if (!t->raw) t->raw = dj_malloc(k * sizeof(float)); /* the widest element type */
    if (!t->f32 || !t->raw)
        return dj_fail(DJ_ENOMEM, "out of host memory for a traced step of %u x %u", n, t->d);
    dj_status st = DJ_OK;
    if (!resumed) {
        st = be->vt->sync(be);
        if (st == DJ_OK) st = be->vt->download(be, t->raw, buf, bytes);
        if (st != DJ_OK) return st;
        to_f32(dtype, t->raw, t->f32, k);
    }
    bool changed = resumed;
    for (uint32_t j = from; j < t->n_iv; j++) {
        if (t->node[j] != node) continue;
        const dj_intervention *v = &t->iv[j];
        if (v->op == DJ_IV_SAVE) {
            memcpy(v->out, t->f32, k * sizeof(float));
            continue;
        }
        if (v->op == DJ_IV_BREAK) { /* the rest of this point's list runs on resume (restore) */
            memcpy(v->out, t->f32, k * sizeof(float));
            t->brk_iv = j;
            t->hook->pause = true;
            return DJ_OK;
        }
        const uint32_t r0 = v->r1 ? v->r0 : 0, r1 = v->r1 ? v->r1 : n;
        const uint32_t c0 = v->c1 ? v->c0 : 0, w = (v->c1 ? v->c1 : t->d) - c0;
        for (uint32_t r = r0; r < r1; r++) {
            const float *src = v->data + (size_t)(v->rows == 1 ? 0 : r - r0) * w;
            float *row = t->f32 + (size_t)r * t->d + c0;
            if (v->op == DJ_IV_ADD)
                for (uint32_t c = 0; c < w; c++) row[c] += src[c];
            else if (v->op == DJ_IV_MUL)
                for (uint32_t c = 0; c < w; c++) row[c] *= src[c];
            else
                memcpy(row, src, (size_t)w * sizeof *row);
        }
        changed = true;
    }
    if (!changed) return DJ_OK;
    from_f32(dtype, t->f32, t->raw, k);
    return be->vt->upload(be, buf, t->raw, bytes);
}

static dj_status at(void *user, dj_engine_t *e, const dj_graph_t *g, int node, void *buf, dj_dtype dtype,
                    uint32_t n) {
    (void)g;
    trace *t = user;
    dj_backend_t *be = dj_engine_backend(e);
    if (n != t->n) return dj_fail(DJ_EINTERNAL, "a traced step of %u rows ran %u", t->n, n);
    if (dtype != DJ_DTYPE_F32 && dtype != DJ_DTYPE_BF16 && dtype != DJ_DTYPE_F16)
        return dj_fail(DJ_EINTERNAL, "an activation of dtype %s", dj_dtype_name(dtype));
    trace_stop *sp = stop_of(t, node);
    if (!sp) return dj_fail(DJ_EINTERNAL, "a traced step stopped at node %d it did not ask for", node);
    if (!sp->copy) return at_host(t, be, node, buf, dtype, n, 0, false);
    if (dtype != sp->dtype) return dj_fail(DJ_EINTERNAL, "point node %d: dtype %s, planned %s", node,
                                           dj_dtype_name(dtype), dj_dtype_name(sp->dtype));
    const size_t bytes = (size_t)n * t->d * dj_dtype_size(dtype);
    dj_status st = be->vt->copy(be, t->area_dev + sp->off, buf, bytes);
    /* A prefill chunk's slot starts down to host memory at once, beside the
     * rest of the step (a decode step's is small, and may be recorded). */
    if (st == DJ_OK && n > 1 && t->pinned && be->vt->xfer_start && be->vt->xfer_free) {
        const dj_copy_span span = {.dev = t->area_dev + sp->off, .host = t->area_host + sp->off, .bytes = bytes};
        st = be->vt->xfer_start(be, true, &span, 1, &sp->x);
    }
    return st;
}

/* A resumed breakpoint: its value (the BREAK's `out`, as the caller left
 * it) is the point's, and the point's interventions after it run. */
static dj_status restore(void *user, dj_engine_t *e, const dj_graph_t *g, int node, void *buf, dj_dtype dtype,
                         uint32_t n) {
    (void)g;
    trace *t = user;
    if (n != t->n || t->brk_iv >= t->n_iv || t->node[t->brk_iv] != node)
        return dj_fail(DJ_EINTERNAL, "a breakpoint resumed at node %d it did not stop at", node);
    const size_t k = (size_t)n * t->d;
    if (!t->f32 && !(t->f32 = dj_malloc(k * sizeof(float))))
        return dj_fail(DJ_ENOMEM, "out of host memory for a traced step of %u x %u", n, t->d);
    memcpy(t->f32, t->iv[t->brk_iv].out, k * sizeof(float));
    return at_host(t, dj_engine_backend(e), node, buf, dtype, n, t->brk_iv + 1, true);
}

/* Once the step is enqueued: the slots already on their way arrive (in
 * point order, the first ones while the device still computes the rest). */
static dj_status enqueued(void *user, dj_engine_t *e) {
    trace *t = user;
    dj_backend_t *be = dj_engine_backend(e);
    for (int j = 0; j < t->n_stops; j++) {
        trace_stop *sp = &t->stop[j];
        if (!sp->x) continue;
        be->vt->xfer_free(be, sp->x); /* waits for its copy */
        sp->x = NULL;
        deliver(t, sp, t->area_host + sp->off);
    }
    return DJ_OK;
}

/* After the step: the copy stops not delivered yet, in one download. */
static dj_status deliver_rest(trace *t, dj_backend_t *be) {
    size_t lo = SIZE_MAX, hi = 0;
    for (int j = 0; j < t->n_stops; j++) {
        const trace_stop *sp = &t->stop[j];
        if (!sp->copy || sp->delivered) continue;
        const size_t end = sp->off + (size_t)t->n * t->d * dj_dtype_size(sp->dtype);
        if (sp->off < lo) lo = sp->off;
        if (end > hi) hi = end;
    }
    if (hi == 0) return DJ_OK;
    const uint8_t *src = t->area_dev; /* read in place where device memory is host memory */
    if (!be->host_memory) {
        dj_status st = be->vt->download(be, t->area_host + lo, t->area_dev + lo, hi - lo);
        if (st != DJ_OK) return st;
        src = t->area_host;
    }
    for (int j = 0; j < t->n_stops; j++)
        if (t->stop[j].copy && !t->stop[j].delivered) deliver(t, &t->stop[j], src + t->stop[j].off);
    return DJ_OK;
}

/* A point as one place: layers.{i+1}.input is layers.{i}.output. */
static dj_point canon(dj_point p) {
    if (p.kind == DJ_POINT_LAYER_INPUT && p.layer > 0) return (dj_point){DJ_POINT_LAYER_OUTPUT, p.layer - 1};
    return p;
}

/* Every intervention checked before anything runs; *n_brk counts BREAKs (at
 * most one a point). */
static dj_status check_ivs(dj_engine_t *e, dj_session_t *s, uint32_t n, const dj_intervention *iv, uint32_t n_iv,
                           uint32_t *n_brk) {
    *n_brk = 0;
    if (!iv) return dj_fail(DJ_EINVAL, "a traced step: %u interventions at NULL", n_iv);
    if (n_iv > DJ_IV_MAX)
        return dj_fail(DJ_EINVAL, "%u interventions in one step; at most %u", n_iv, (unsigned)DJ_IV_MAX);
    if (n == 0) return dj_fail(DJ_EINVAL, "a step needs at least one token");
    if (n > dj_engine_max_step_tokens(e))
        return dj_fail(DJ_EINVAL, "a traced step takes at most %u tokens (the engine's max_step_tokens), got %u",
                       dj_engine_max_step_tokens(e), n);
    const dj_model_config *c = dj_model_get_config(dj_session_model(s));
    for (uint32_t k = 0; k < n_iv; k++) {
        const dj_intervention *v = &iv[k];
        char nm[48];
        if ((unsigned)v->point.kind > DJ_POINT_FINAL_NORM)
            return dj_fail(DJ_EINVAL, "intervention %u: unknown point kind %d", k, (int)v->point.kind);
        if (v->point.kind != DJ_POINT_FINAL_NORM && v->point.layer >= c->n_layers)
            return dj_fail(DJ_ERANGE, "intervention %u: layer %u is out of range; the model has %u layers", k,
                           v->point.layer, c->n_layers);
        dj_point_name(v->point, nm, sizeof nm);
        switch (v->op) {
        case DJ_IV_SAVE:
            if (!v->out) return dj_fail(DJ_EINVAL, "intervention %u (save %s): NULL output", k, nm);
            break;
        case DJ_IV_BREAK:
            if (!v->out) return dj_fail(DJ_EINVAL, "intervention %u (breakpoint %s): NULL output", k, nm);
            for (uint32_t j = 0; j < k; j++) {
                const dj_point a = canon(iv[j].point), b = canon(v->point);
                if (iv[j].op == DJ_IV_BREAK && a.kind == b.kind && a.layer == b.layer)
                    return dj_fail(DJ_EINVAL, "intervention %u: a second breakpoint at %s (one a point)", k, nm);
            }
            (*n_brk)++;
            break;
        case DJ_IV_ADD:
        case DJ_IV_REPLACE:
        case DJ_IV_MUL: {
            if (!v->data) return dj_fail(DJ_EINVAL, "intervention %u (%s): NULL data", k, nm);
            if ((v->r1 && (v->r0 >= v->r1 || v->r1 > n)) || (!v->r1 && v->r0) ||
                (v->c1 && (v->c0 >= v->c1 || v->c1 > c->hidden_size)) || (!v->c1 && v->c0))
                return dj_fail(DJ_ERANGE, "intervention %u (%s): region rows [%u, %u) cols [%u, %u) outside the "
                               "point's [%u, %u]", k, nm, v->r0, v->r1, v->c0, v->c1, n, c->hidden_size);
            const uint32_t h = v->r1 ? v->r1 - v->r0 : n;
            if (v->rows != 1 && v->rows != h)
                return dj_fail(DJ_EINVAL,
                               "intervention %u (%s): a tensor of %u rows for a region of %u positions; give "
                               "[width] or [%u, width]",
                               k, nm, v->rows, h, h);
            break;
        }
        default: return dj_fail(DJ_EINVAL, "intervention %u (%s): unknown op %d", k, nm, (int)v->op);
        }
    }
    return DJ_OK;
}

dj_status dj_session_step_trace(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                const dj_intervention *iv, uint32_t n_iv, float *logits) {
    if (!e || !s || !ids) return dj_fail(DJ_EINVAL, "dj_session_step_trace: NULL engine, session or ids");
    if (n_iv == 0) return dj_session_step(e, s, ids, n, logits);
    uint32_t n_brk = 0;
    dj_status st = check_ivs(e, s, n, iv, n_iv, &n_brk);
    if (st != DJ_OK) return st;
    if (n_brk) return dj_fail(DJ_EINVAL, "a step with breakpoints runs through dj_session_step_break");
    trace t = {.iv = iv, .n_iv = n_iv, .n = n, .d = dj_model_get_config(dj_session_model(s))->hidden_size};
    dj_backend_t *be = dj_engine_backend(e);
    dj__step_hook hook = {.prepare = prepare, .at = at, .enqueued = enqueued, .user = &t};
    st = dj__session_step_hooked(e, s, ids, n, logits, &hook);
    for (int j = 0; j < t.n_stops; j++) /* a failed step's transfers still in flight */
        if (t.stop[j].x) be->vt->xfer_free(be, t.stop[j].x);
    if (st == DJ_OK) st = deliver_rest(&t, be);
    free(t.f32);
    free(t.raw);
    return st;
}

/* ---- breakpoints: a step that stops at points, resumed or cancelled ---- */

struct dj_step_brk {
    dj_session_t *s;
    int32_t *ids;        /* [n] the step's ids (owned) */
    uint32_t n;
    trace t;
    dj__step_hook hook;
    dj__step_held held;
};

static void brk_free(dj_engine_t *e, dj_step_brk_t *b, bool cancel) {
    if (!b) return;
    dj__session_step_drop(e, cancel ? b->s : NULL, &b->held);
    free(b->t.f32);
    free(b->t.raw);
    free(b->ids);
    free(b);
}

/* One run of b's step, from its start or its breakpoint: paused again
 * (b kept) or done (b freed, *bp NULL); a failure cancels it. */
static dj_status brk_run(dj_engine_t *e, dj_step_brk_t **bp, float *logits, dj_step_brk_stats *stats) {
    dj_step_brk_t *b = *bp;
    dj_status st = dj__session_step_held(e, b->s, b->ids, b->n, logits, &b->hook);
    dj_step_brk_info(b, stats);
    if (st == DJ_OK && b->held.paused) return DJ_OK;
    brk_free(e, b, st != DJ_OK);
    *bp = NULL;
    return st;
}

dj_status dj_session_step_break(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                const dj_intervention *iv, uint32_t n_iv, float *logits, dj_step_brk_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "dj_session_step_break: NULL output");
    *out = NULL;
    if (!e || !s || !ids) return dj_fail(DJ_EINVAL, "dj_session_step_break: NULL engine, session or ids");
    uint32_t n_brk = 0;
    dj_status st = check_ivs(e, s, n, iv, n_iv, &n_brk);
    if (st != DJ_OK) return st;
    if (dj_session_model(s)->stream)
        return dj_fail(DJ_EUNSUPPORTED, "model %s streams %u of its layers through the weight ring: a step there "
                       "cannot stop at a breakpoint", dj_session_model(s)->name,
                       dj_session_model(s)->stream->pl.n_streamed);
    dj_step_brk_t *b = dj_calloc(1, sizeof *b);
    if (!b || !(b->ids = dj_malloc((size_t)n * sizeof *ids))) {
        free(b);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    memcpy(b->ids, ids, (size_t)n * sizeof *ids);
    b->s = s;
    b->n = n;
    b->held.n_blocks0 = s->n_blocks; /* what a cancel unmaps down to, even if the step fails early */
    b->t = (trace){.iv = iv, .n_iv = n_iv, .n = n, .d = dj_model_get_config(dj_session_model(s))->hidden_size,
                   .brk = true, .hook = &b->hook};
    b->hook = (dj__step_hook){.prepare = prepare, .at = at, .restore = restore, .user = &b->t, .held = &b->held};
    st = brk_run(e, &b, logits, NULL);
    *out = b;
    return st;
}

uint32_t dj_step_brk_at(const dj_step_brk_t *b) { return b ? b->t.brk_iv : 0; }

dj_status dj_step_brk_resume(dj_engine_t *e, dj_step_brk_t **b, float *logits, dj_step_brk_stats *stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (!e || !b || !*b) return dj_fail(DJ_EINVAL, "dj_step_brk_resume: NULL engine or step");
    if (!(*b)->held.paused) return dj_fail(DJ_EINTERNAL, "a step resumed that is not paused");
    return brk_run(e, b, logits, stats);
}

void dj_step_brk_cancel(dj_engine_t *e, dj_step_brk_t *b) { brk_free(e, b, true); }

void dj_step_brk_info(const dj_step_brk_t *b, dj_step_brk_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!b) return;
    out->held_bytes = b->held.used;
    out->live = (uint32_t)b->held.n_live;
    out->save_s = b->held.save_s;
    out->restore_s = b->held.restore_s;
}
