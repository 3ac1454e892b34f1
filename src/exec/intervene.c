/* intervene.c: a step with interventions - named points of the forward pass
 * resolved to the plan's tagged nodes, saved or edited between the plan's
 * segments through the executor's step hook (engine_impl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/intervene.h"
#include "exec/engine_impl.h"

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

typedef struct trace {
    const dj_intervention *iv;
    uint32_t n_iv;
    uint32_t n;              /* token rows */
    uint32_t d;              /* hidden size */
    int node[DJ_IV_MAX];     /* the plan node of iv[k] */
    float *f32;              /* [n][d] scratch */
    uint8_t *raw;            /* [n][d] scratch in the backend's element type */
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

static dj_status prepare(void *user, const dj_graph_t *g, int *stops, int cap, int *n_stops) {
    trace *t = user;
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
    *n_stops = n;
    return DJ_OK;
}

static void to_f32(dj_dtype t, const uint8_t *src, float *dst, size_t k) {
    if (t == DJ_DTYPE_F32) {
        memcpy(dst, src, k * sizeof *dst);
        return;
    }
    for (size_t i = 0; i < k; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = t == DJ_DTYPE_BF16 ? dj_bf16_to_f32(h) : dj_f16_to_f32(h);
    }
}

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

static dj_status at(void *user, dj_engine_t *e, const dj_graph_t *g, int node, void *buf, dj_dtype dtype,
                    uint32_t n) {
    (void)g;
    trace *t = user;
    dj_backend_t *be = dj_engine_backend(e);
    if (n != t->n) return dj_fail(DJ_EINTERNAL, "a traced step of %u rows ran %u", t->n, n);
    if (dtype != DJ_DTYPE_F32 && dtype != DJ_DTYPE_BF16 && dtype != DJ_DTYPE_F16)
        return dj_fail(DJ_EINTERNAL, "an activation of dtype %s", dj_dtype_name(dtype));
    const size_t k = (size_t)n * t->d, bytes = k * dj_dtype_size(dtype);
    dj_status st = be->vt->sync(be);
    if (st == DJ_OK) st = be->vt->download(be, t->raw, buf, bytes);
    if (st != DJ_OK) return st;
    to_f32(dtype, t->raw, t->f32, k);
    bool changed = false;
    for (uint32_t j = 0; j < t->n_iv; j++) {
        if (t->node[j] != node) continue;
        const dj_intervention *v = &t->iv[j];
        if (v->op == DJ_IV_SAVE) {
            memcpy(v->out, t->f32, k * sizeof(float));
            continue;
        }
        for (uint32_t r = 0; r < n; r++) {
            const float *src = v->data + (size_t)(v->rows == 1 ? 0 : r) * t->d;
            float *row = t->f32 + (size_t)r * t->d;
            if (v->op == DJ_IV_ADD)
                for (uint32_t c = 0; c < t->d; c++) row[c] += src[c];
            else
                memcpy(row, src, (size_t)t->d * sizeof *row);
        }
        changed = true;
    }
    if (!changed) return DJ_OK;
    from_f32(dtype, t->f32, t->raw, k);
    return be->vt->upload(be, buf, t->raw, bytes);
}

dj_status dj_session_step_trace(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                const dj_intervention *iv, uint32_t n_iv, float *logits) {
    if (!e || !s || !ids) return dj_fail(DJ_EINVAL, "dj_session_step_trace: NULL engine, session or ids");
    if (n_iv == 0) return dj_session_step(e, s, ids, n, logits);
    if (!iv) return dj_fail(DJ_EINVAL, "dj_session_step_trace: %u interventions at NULL", n_iv);
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
        case DJ_IV_ADD:
        case DJ_IV_REPLACE:
            if (!v->data) return dj_fail(DJ_EINVAL, "intervention %u (%s): NULL data", k, nm);
            if (v->rows != 1 && v->rows != n)
                return dj_fail(DJ_EINVAL,
                               "intervention %u (%s): a tensor of %u rows for a step of %u positions; give "
                               "[hidden] or [%u, hidden]",
                               k, nm, v->rows, n, n);
            break;
        default: return dj_fail(DJ_EINVAL, "intervention %u (%s): unknown op %d", k, nm, (int)v->op);
        }
    }
    trace t = {.iv = iv, .n_iv = n_iv, .n = n, .d = c->hidden_size};
    const size_t k = (size_t)n * c->hidden_size;
    t.f32 = malloc(k * sizeof(float));
    t.raw = malloc(k * sizeof(float)); /* the widest element type */
    dj_status st;
    if (!t.f32 || !t.raw) {
        st = dj_fail(DJ_ENOMEM, "out of host memory for a traced step of %u x %u", n, c->hidden_size);
    } else {
        dj__step_hook hook = {.prepare = prepare, .at = at, .user = &t};
        st = dj__session_step_hooked(e, s, ids, n, logits, &hook);
    }
    free(t.f32);
    free(t.raw);
    return st;
}
