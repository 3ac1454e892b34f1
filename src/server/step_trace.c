/* step_trace.c: a STEP's `points` (docs/protocol.md) - parsed and bounded
 * into engine interventions, run, and the saved activations published as
 * result handles (by the I/O side, from the STEP's reply). Worker thread only. */
#include <stdio.h>
#include "djinn/alloc.h"
#include <stdlib.h>
#include <string.h>

#include "djinn/intervene.h"
#include "server/server_impl.h"

struct dj__trace_req {
    dj_intervention iv[DJ_IV_MAX];
    char name[DJ_IV_MAX][48]; /* each point's name as parsed */
    bool keep[DJ_IV_MAX];     /* a save's handle outlives the session */
    uint32_t n_iv, n_saves, n_breaks;
    uint32_t n, d;            /* the traced rows, hidden size */
    float *data;              /* the payload's tensors as f32 (owned) */
};

void dj__trace_free(dj__trace_req *t) {
    if (!t) return;
    for (uint32_t k = 0; k < t->n_iv; k++) free(t->iv[k].out);
    free(t->data);
    free(t);
}

uint32_t dj__trace_saves(const dj__trace_req *t) { return t ? t->n_saves : 0; }

dj_status dj__trace_parse(const dj__req_step *rq, uint32_t n, const dj_model_config *c, dj__trace_req **out) {
    *out = NULL;
    const uint32_t np = rq->n_points;
    if (np == 0 || np > DJ_IV_MAX) return dj_fail(DJ_EINTERNAL, "a STEP of %u points reached the trace", np);
    if (n == 0) return dj_fail(DJ_EINVAL, "a STEP with points needs at least one token id");
    dj__trace_req *t = dj_calloc(1, sizeof *t);
    if (!t) return dj_fail(DJ_ENOMEM, "out of memory");
    t->n = n;
    t->d = c->hidden_size;
    dj_status st = DJ_OK;
    uint64_t floats = 0; /* payload floats the edits take */
    uint32_t rows[DJ_IV_MAX];
    for (uint32_t k = 0; k < np && st == DJ_OK; k++) {
        const dj__req_point *p = &rq->points[k];
        dj_intervention *v = &t->iv[k];
        if ((st = dj_point_parse(p->point, p->point_len, c->n_layers, &v->point)) != DJ_OK) break;
        dj_point_name(v->point, t->name[k], sizeof t->name[k]);
        t->n_iv = k + 1;
        v->op = p->op;
        t->keep[k] = p->keep;
        if (p->op == DJ_IV_SAVE || p->op == DJ_IV_BREAK) {
            t->n_saves += p->op == DJ_IV_SAVE;
            t->n_breaks += p->op == DJ_IV_BREAK;
            continue;
        }
        const uint32_t nd = p->nd;
        const uint64_t r = nd == 1 ? 1 : p->dims[0], w = nd == 1 ? p->dims[0] : p->dims[1];
        /* the region: [r0, r1) x [c0, c1), the whole point without rows/cols */
        const uint64_t r0 = p->has_rows ? p->rows[0] : 0, r1 = p->has_rows ? p->rows[1] : n;
        const uint64_t c0 = p->has_cols ? p->cols[0] : 0, c1 = p->has_cols ? p->cols[1] : t->d;
        if (r0 >= r1 || r1 > n || c0 >= c1 || c1 > t->d) {
            st = dj_fail(DJ_ERANGE, "STEP points[%u] (%s): region rows [%llu, %llu) cols [%llu, %llu) is empty or "
                         "outside the point's [%u, %u]", k, t->name[k], (unsigned long long)r0,
                         (unsigned long long)r1, (unsigned long long)c0, (unsigned long long)c1, n, t->d);
            break;
        }
        const uint64_t h = r1 - r0, wr = c1 - c0;
        if (w != wr || (nd == 2 && r != h && r != 1)) {
            char got[48];
            if (nd == 1) snprintf(got, sizeof got, "[%llu]", (unsigned long long)w);
            else snprintf(got, sizeof got, "[%llu, %llu]", (unsigned long long)r, (unsigned long long)w);
            st = dj_fail(DJ_EINVAL,
                         "STEP points[%u] (%s): a tensor of shape %s does not fit the region's [%llu, %llu]; give "
                         "[%llu] (every position) or [%llu, %llu]",
                         k, t->name[k], got, (unsigned long long)h, (unsigned long long)wr, (unsigned long long)wr,
                         (unsigned long long)h, (unsigned long long)wr);
            break;
        }
        if (p->has_rows) {
            v->r0 = (uint32_t)r0;
            v->r1 = (uint32_t)r1;
        }
        if (p->has_cols) {
            v->c0 = (uint32_t)c0;
            v->c1 = (uint32_t)c1;
        }
        rows[k] = (uint32_t)r;
        floats += r * w;
    }
    const uint8_t *payload = rq->payload;
    const uint64_t payload_len = rq->payload_len;
    if (st == DJ_OK && payload_len != floats * 4)
        st = dj_fail(DJ_EINVAL, "STEP payload holds %llu bytes; its points' tensors take %llu (f32)",
                     (unsigned long long)payload_len, (unsigned long long)(floats * 4));
    if (st == DJ_OK && floats && !(t->data = dj_malloc((size_t)floats * sizeof(float))))
        st = dj_fail(DJ_ENOMEM, "out of memory for %llu bytes of intervention tensors",
                     (unsigned long long)payload_len);
    if (st == DJ_OK && floats) {
        size_t at = 0;
        for (size_t i = 0; i < floats; i++) { /* little-endian f32 on the wire */
            const uint8_t *p = payload + 4 * i;
            const uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            memcpy(&t->data[i], &u, 4);
        }
        for (uint32_t k = 0; k < t->n_iv; k++) {
                if (t->iv[k].op == DJ_IV_SAVE || t->iv[k].op == DJ_IV_BREAK) continue;
            t->iv[k].data = t->data + at;
            t->iv[k].rows = rows[k];
            at += (size_t)rows[k] * (t->iv[k].c1 ? t->iv[k].c1 - t->iv[k].c0 : t->d);
        }
    }
    for (uint32_t k = 0; st == DJ_OK && k < t->n_iv; k++) {
        if (t->iv[k].op != DJ_IV_SAVE && t->iv[k].op != DJ_IV_BREAK) continue;
        if (!(t->iv[k].out = dj_malloc((size_t)n * t->d * sizeof(float))))
            st = dj_fail(DJ_ENOMEM, "out of host memory for a saved [%u, %u] activation", n, t->d);
    }
    if (st != DJ_OK) {
        dj__trace_free(t);
        return st;
    }
    *out = t;
    return DJ_OK;
}

dj_status dj__trace_run(dj_engine_t *e, dj_session_t *es, const int32_t *ids, uint32_t n, dj__trace_req *t,
                        float *logits) {
    if (n != t->n) return dj_fail(DJ_EINTERNAL, "a trace parsed for %u rows runs %u", t->n, n);
    return dj_session_step_trace(e, es, ids, n, t->iv, t->n_iv, logits);
}

dj_status dj__trace_publish(dj__trace_req *t, dj__rep_step *out) {
    out->traced = true;
    if (t->n_saves && !(out->saved = dj_calloc(t->n_saves, sizeof *out->saved)))
        return dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t k = 0; k < t->n_iv; k++) {
        dj_intervention *v = &t->iv[k];
        if (v->op != DJ_IV_SAVE) continue;
        dj__rep_saved *o = &out->saved[out->n_saved++];
        snprintf(o->point, sizeof o->point, "%s", t->name[k]);
        o->keep = t->keep[k];
        o->bytes = v->out; /* the event's now */
        v->out = NULL;
        o->n = t->n;
        o->d = t->d;
    }
    return DJ_OK;
}

/* ---- breakpoints (step_break.c runs the paused step) ---- */

uint32_t dj__trace_breaks(const dj__trace_req *t) { return t ? t->n_breaks : 0; }

dj_status dj__trace_run_break(dj_engine_t *e, dj_session_t *es, const int32_t *ids, uint32_t n, dj__trace_req *t,
                              float *logits, dj_step_brk_t **out) {
    if (n != t->n) return dj_fail(DJ_EINTERNAL, "a trace parsed for %u rows runs %u", t->n, n);
    return dj_session_step_break(e, es, ids, n, t->iv, t->n_iv, logits, out);
}

const char *dj__trace_point_name(const dj__trace_req *t, uint32_t k) { return k < t->n_iv ? t->name[k] : "?"; }

dj_status dj__trace_publish_break(dj__trace_req *t, uint32_t k, dj__rep_step *out) {
    const size_t bytes = (size_t)t->n * t->d * sizeof(float);
    out->traced = true;
    out->paused = true;
    snprintf(out->brk_point, sizeof out->brk_point, "%s", t->name[k]);
    if (!(out->saved = dj_calloc(1, sizeof *out->saved))) return dj_fail(DJ_ENOMEM, "out of memory");
    dj__rep_saved *o = &out->saved[out->n_saved++];
    snprintf(o->point, sizeof o->point, "%s", t->name[k]);
    o->brk = true;
    o->n = t->n;
    o->d = t->d;
    if ((o->bytes = dj_malloc(bytes))) memcpy(o->bytes, t->iv[k].out, bytes); /* NULL: listed without a handle */
    return DJ_OK;
}

/* p and q one place (layers.{i+1}.input is layers.{i}.output). */
static bool same_place(dj_point p, dj_point q) {
    if (p.kind == DJ_POINT_LAYER_INPUT && p.layer > 0) p = (dj_point){DJ_POINT_LAYER_OUTPUT, p.layer - 1};
    if (q.kind == DJ_POINT_LAYER_INPUT && q.layer > 0) q = (dj_point){DJ_POINT_LAYER_OUTPUT, q.layer - 1};
    return p.kind == q.kind && p.layer == q.layer;
}

dj_status dj__trace_edit(dj__trace_req *t, uint32_t k, const dj__req_step *rq, const dj_model_config *c) {
    float *val = t->iv[k].out;
    uint64_t floats = 0;
    for (uint32_t j = 0; j < rq->n_points; j++) { /* everything checked before anything changes */
        const dj__req_point *p = &rq->points[j];
        dj_point pt;
        dj_status st = dj_point_parse(p->point, p->point_len, c->n_layers, &pt);
        if (st != DJ_OK) return st;
        if (!same_place(pt, t->iv[k].point))
            return dj_fail(DJ_EINVAL, "a resume edits the point the step is paused at (%s), not %s", t->name[k],
                           p->point);
        if (p->has_rows || p->has_cols)
            return dj_fail(DJ_EINVAL, "a resume's points[%u]: edits at a breakpoint take the whole point (change a "
                           "slice of the value and send it whole)", j);
        const uint64_t r = p->nd == 1 ? 1 : p->dims[0], w = p->nd == 1 ? p->dims[0] : p->dims[1];
        if (w != t->d || (p->nd == 2 && r != t->n && r != 1))
            return dj_fail(DJ_EINVAL, "a resume's points[%u]: a tensor that does not fit the point's [%u, %u]; give "
                           "[%u] (every position) or [%u, %u]", j, t->n, t->d, t->d, t->n, t->d);
        floats += r * w;
    }
    if (rq->payload_len != floats * 4)
        return dj_fail(DJ_EINVAL, "a resume's payload holds %llu bytes; its points' tensors take %llu (f32)",
                       (unsigned long long)rq->payload_len, (unsigned long long)(floats * 4));
    const uint8_t *at = rq->payload;
    for (uint32_t j = 0; j < rq->n_points; j++) {
        const dj__req_point *p = &rq->points[j];
        const uint32_t rows = p->nd == 1 ? 1 : (uint32_t)p->dims[0];
        for (uint32_t r = 0; r < t->n; r++) {
            float *row = val + (size_t)r * t->d;
            const uint8_t *src = at + (size_t)(rows == 1 ? 0 : r) * t->d * 4;
            for (uint32_t i = 0; i < t->d; i++) { /* little-endian f32 on the wire */
                const uint8_t *q = src + 4 * (size_t)i;
                const uint32_t u = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
                float x;
                memcpy(&x, &u, 4);
                row[i] = p->op == DJ_IV_ADD ? row[i] + x : x;
            }
        }
        at += (size_t)rows * t->d * 4;
    }
    return DJ_OK;
}

dj_status dj__step_tokenize(const dj_tokenizer_t *tok, const char *model, const char *text, size_t len,
                            bool add_special, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    if (!tok) return dj_fail(DJ_EUNSUPPORTED, "model %s has no tokenizer.json: send token ids", model);
    dj_status st = dj_tokenizer_encode(tok, text, len, add_special, ids, n);
    if (st == DJ_OK && *n == 0) {
        free(*ids);
        *ids = NULL;
        st = dj_fail(DJ_EINVAL, "the prompt became no tokens");
    }
    return st;
}

/* ---- a GENERATE's points: edits at every step ---- */

dj_status dj__gen_trace_parse(const dj__req_generate *rq, const dj_model_config *c, dj__trace_req **out) {
    const dj__req_step as_step = {.points = rq->points, .n_points = rq->n_points, .payload = rq->iv_bytes,
                                  .payload_len = rq->iv_len};
    return dj__trace_parse(&as_step, 1, c, out); /* one row: [width] to every position of every step */
}

const dj_intervention *dj__trace_ivs(const dj__trace_req *t, uint32_t *n) {
    *n = t ? t->n_iv : 0;
    return t ? t->iv : NULL;
}
