/* graph_serve.c: captured modules on djinnd - the weight messages against the content-addressed
 * store (src/capture/weights.c), and GRAPH_RUN: decoded, validated, run by src/capture, outputs as handles. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/alloc.h"
#include "djinn/backend.h"
#include "djinn/engine.h"
#include "capture/gplan_cache.h"
#include "djinn/capture.h"
#include "server/graph_serve.h"
#include "server/server_impl.h"

struct dj__capture {
    dj_wstore_t *store;
    dj_gplan_cache *plans; /* decoded, validated, planned graphs by the hash of their bytes */
    int threads;
    dj_backend_t *cpu; /* worker only: made by the first run */
    _Atomic uint64_t runs, run_errors;
};

dj_status dj__capture_open(uint64_t store_bytes, uint64_t quota_bytes, int threads, dj__capture **out) {
    *out = NULL;
    dj__capture *c = dj_calloc(1, sizeof *c);
    if (!c) return dj_fail(DJ_ENOMEM, "out of memory");
    const dj_wstore_config cfg = {.capacity_bytes = store_bytes, .quota_bytes = quota_bytes};
    dj_status st = dj_wstore_new(&cfg, &c->store);
    if (st != DJ_OK) {
        free(c);
        return st;
    }
    if ((st = dj_gplan_cache_new(0, &c->plans)) != DJ_OK) {
        dj_wstore_free(c->store);
        free(c);
        return st;
    }
    c->threads = threads > 0 ? threads : 1;
    *out = c;
    return DJ_OK;
}

void dj__capture_close(dj__capture *c) {
    if (!c) return;
    dj_backend_free(c->cpu);
    dj_gplan_cache_free(c->plans);
    dj_wstore_free(c->store);
    free(c);
}

bool dj__capture_takes_payload(uint32_t type) { return type == DJ_MSG_WEIGHT_UPLOAD || type == DJ_MSG_GRAPH_RUN; }

dj_status dj__capture_payload_check(uint32_t type, const uint8_t *meta, uint32_t meta_len, uint64_t payload_len) {
    if (type == DJ_MSG_WEIGHT_UPLOAD) {
        if (payload_len > DJ__WEIGHT_CHUNK_MAX)
            return dj_fail(DJ_ERANGE, "WEIGHT_UPLOAD chunk of %llu bytes: at most %llu a chunk",
                           (unsigned long long)payload_len, (unsigned long long)DJ__WEIGHT_CHUNK_MAX);
        return DJ_OK;
    }
    dj__meta m;
    dj_status st = dj__meta_parse(&m, meta, meta_len);
    if (st != DJ_OK) return st;
    uint64_t gb = 0;
    st = dj__meta_u64(&m, "graph_bytes", true, &gb);
    dj__meta_destroy(&m);
    if (st != DJ_OK) return st;
    if (gb > DJ__GRAPH_MAX_BYTES)
        return dj_fail(DJ_ERANGE, "GRAPH_RUN graph of %llu bytes: at most %llu", (unsigned long long)gb,
                       (unsigned long long)DJ__GRAPH_MAX_BYTES);
    if (gb > payload_len)
        return dj_fail(DJ_EFORMAT, "GRAPH_RUN: graph_bytes %llu but a payload of %llu bytes", (unsigned long long)gb,
                       (unsigned long long)payload_len);
    return DJ_OK;
}

/* ---- the weight messages ---- */

static bool obj_hash(const msgpack_object *o, dj_whash *h) {
    if (!o || o->type != MSGPACK_OBJECT_BIN || o->via.bin.size != DJ_WHASH_BYTES) return false;
    memcpy(h->b, o->via.bin.ptr, DJ_WHASH_BYTES);
    return true;
}

static dj_status meta_hash(const dj__meta *m, const char *key, dj_whash *h) {
    if (!obj_hash(dj__meta_get(m, key), h))
        return dj_fail(DJ_EFORMAT, "`%s` must be bin of %d bytes (XXH3-128, canonical)", key, DJ_WHASH_BYTES);
    return DJ_OK;
}

static dj_status weight_has(dj__capture *c, uint64_t conn, const dj__meta *m, dj__mw *w) {
    const msgpack_object *a = dj__meta_get(m, "hashes");
    if (!a || a->type != MSGPACK_OBJECT_ARRAY) return dj_fail(DJ_EFORMAT, "WEIGHT_HAS needs `hashes`, an array");
    const uint32_t n = a->via.array.size;
    if (n > DJ__WEIGHT_HAS_MAX)
        return dj_fail(DJ_ERANGE, "WEIGHT_HAS of %u hashes: at most %d", n, DJ__WEIGHT_HAS_MAX);
    dj_whash h;
    for (uint32_t i = 0; i < n; i++)
        if (!obj_hash(&a->via.array.ptr[i], &h))
            return dj_fail(DJ_EFORMAT, "hashes[%u] must be bin of %d bytes", i, DJ_WHASH_BYTES);
    dj__mw_key(w, "state"); /* 0 absent (upload it), 1 held (prove it: WEIGHT_CHALLENGE), 2 usable */
    msgpack_pack_array(&w->pk, n);
    uint64_t *sizes = n ? dj_calloc(n, sizeof *sizes) : NULL;
    if (n && !sizes) return dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        obj_hash(&a->via.array.ptr[i], &h);
        msgpack_pack_int(&w->pk, (int)dj_wstore_has(c->store, conn, &h, &sizes[i]));
    }
    dj__mw_key(w, "bytes");
    msgpack_pack_array(&w->pk, n);
    for (uint32_t i = 0; i < n; i++) msgpack_pack_uint64(&w->pk, sizes[i]);
    free(sizes);
    return DJ_OK;
}

static dj_status weight_upload(dj__capture *c, uint64_t conn, uint64_t tenant, const dj__meta *m,
                               const uint8_t *payload, uint64_t len, dj__mw *w) {
    dj_whash h;
    uint64_t total = 0, off = 0;
    dj_status st = meta_hash(m, "hash", &h);
    if (st == DJ_OK) st = dj__meta_u64(m, "total", true, &total);
    if (st == DJ_OK) st = dj__meta_u64(m, "offset", true, &off);
    if (st != DJ_OK) return st;
    bool done = false;
    st = dj_wstore_upload(c->store, conn, tenant, &h, total, off, payload, (size_t)len, &done);
    if (st != DJ_OK) return st;
    dj__mw_u64(w, "received", off + len);
    dj__mw_bool(w, "done", done);
    return DJ_OK;
}

static dj_status weight_challenge(dj__capture *c, uint64_t conn, const dj__meta *m, dj__mw *w) {
    dj_whash h;
    dj_wchallenge ch;
    dj_status st = meta_hash(m, "hash", &h);
    if (st == DJ_OK) st = dj_wstore_challenge(c->store, conn, &h, &ch);
    if (st != DJ_OK) return st;
    dj__mw_u64(w, "seed", ch.seed);
    dj__mw_key(w, "ranges");
    msgpack_pack_array(&w->pk, ch.n);
    for (uint32_t i = 0; i < ch.n; i++) {
        msgpack_pack_array(&w->pk, 2);
        msgpack_pack_uint64(&w->pk, ch.offset[i]);
        msgpack_pack_uint64(&w->pk, ch.length[i]);
    }
    return DJ_OK;
}

static dj_status weight_prove(dj__capture *c, uint64_t conn, const dj__meta *m, dj__mw *w) {
    dj_whash h, ans;
    dj_status st = meta_hash(m, "hash", &h);
    if (st == DJ_OK) st = meta_hash(m, "answer", &ans);
    if (st == DJ_OK) st = dj_wstore_answer(c->store, conn, &h, &ans);
    if (st != DJ_OK) return st;
    dj__mw_bool(w, "proven", true);
    return DJ_OK;
}

dj_status dj__capture_inline(dj__capture *c, uint64_t conn, uint64_t tenant, uint32_t type, const dj__meta *m,
                             const uint8_t *payload, uint64_t payload_len, dj__mw *w) {
    switch (type) {
    case DJ_MSG_WEIGHT_HAS: return weight_has(c, conn, m, w);
    case DJ_MSG_WEIGHT_UPLOAD: return weight_upload(c, conn, tenant, m, payload, payload_len, w);
    case DJ_MSG_WEIGHT_CHALLENGE: return weight_challenge(c, conn, m, w);
    case DJ_MSG_WEIGHT_PROVE: return weight_prove(c, conn, m, w);
    default: return dj_fail(DJ_EINTERNAL, "%s is not a weight message", dj_msg_type_name(type));
    }
}

/* ---- GRAPH_RUN ---- */

dj_status dj__graph_req_parse(const dj__meta *m, const uint8_t *payload, uint64_t payload_len, dj__graph_req **out) {
    *out = NULL;
    uint64_t gb = 0;
    dj_status st = dj__meta_u64(m, "graph_bytes", true, &gb);
    if (st != DJ_OK) return st;
    if (gb > DJ__GRAPH_MAX_BYTES || gb > payload_len) /* dj__capture_payload_check said so already */
        return dj_fail(DJ_EFORMAT, "GRAPH_RUN: graph_bytes %llu out of its payload of %llu", (unsigned long long)gb,
                       (unsigned long long)payload_len);
    const msgpack_object *a = dj__meta_get(m, "inputs");
    if (a && a->type != MSGPACK_OBJECT_ARRAY) return dj_fail(DJ_EFORMAT, "GRAPH_RUN `inputs` must be an array");
    const uint32_t n = a ? a->via.array.size : 0;
    if (n > DJ__GRAPH_MAX_INPUTS) return dj_fail(DJ_ERANGE, "GRAPH_RUN of %u inputs: at most %d", n, DJ__GRAPH_MAX_INPUTS);
    const msgpack_object *id = dj__meta_get(m, "graph_id");
    if (id && (id->type != MSGPACK_OBJECT_BIN || id->via.bin.size != 16))
        return dj_fail(DJ_EFORMAT, "GRAPH_RUN `graph_id` must be bin of 16 bytes (the XXH3-128 of the graph's bytes)");
    if (!id && !gb) return dj_fail(DJ_EFORMAT, "GRAPH_RUN needs the graph's bytes (graph_bytes > 0) or its graph_id");
    dj__graph_req *r = dj_calloc(1, sizeof *r);
    if (!r || (n && !(r->handles = dj_calloc(n, sizeof *r->handles)))) {
        free(r);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    if (id) {
        r->has_id = true;
        memcpy(r->graph_id, id->via.bin.ptr, 16);
    }
    char qos[16] = "";
    if ((st = dj__meta_strcpy(m, "qos", false, qos, sizeof qos)) != DJ_OK || (qos[0] && (st = dj_qos_parse(qos, &r->qos)) != DJ_OK)) {
        dj__graph_req_free(r);
        return st;
    }
    r->has_qos = qos[0] != 0;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *o = &a->via.array.ptr[i];
        if (o->type == MSGPACK_OBJECT_NIL) continue;
        if (!dj__obj_u64(o, &r->handles[i]) || !r->handles[i]) {
            dj__graph_req_free(r);
            return dj_fail(DJ_EFORMAT, "GRAPH_RUN inputs[%u]: nil (bytes in the payload) or a handle id", i);
        }
    }
    r->n_inputs = n;
    r->graph = payload;
    r->graph_len = gb;
    r->data = payload + gb;
    r->data_len = payload_len - gb;
    *out = r;
    return DJ_OK;
}

void dj__graph_req_free(dj__graph_req *r) {
    if (!r) return;
    if (r->plan) dj_gplan_cache_release(r->plans, r->plan);
    for (uint32_t i = 0; r->hin && i < r->n_inputs; i++) free(r->hin[i]);
    free(r->hin);
    free(r->hin_bytes);
    free(r->handles);
    free(r);
}

dj_status dj__graph_req_bind(dj__server *s, dj__graph_req *r, uint64_t conn) {
    bool any = false;
    for (uint32_t i = 0; i < r->n_inputs; i++) any |= r->handles[i] != 0;
    if (!any) return DJ_OK;
    if (!(r->hin = dj_calloc(r->n_inputs, sizeof *r->hin)) ||
        !(r->hin_bytes = dj_calloc(r->n_inputs, sizeof *r->hin_bytes)))
        return dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < r->n_inputs; i++) {
        if (!r->handles[i]) continue;
        const dj__handle *h = dj__map_get(&s->handles, r->handles[i]);
        if (!h || h->conn != conn)
            return dj_fail(DJ_ENOTFOUND, "GRAPH_RUN input %u: no handle %016llx on this connection", i,
                           (unsigned long long)r->handles[i]);
        if (strcmp(h->dtype, "f32"))
            return dj_fail(DJ_EINVAL, "GRAPH_RUN input %u: handle %016llx holds %s, a graph's input from a handle "
                           "is f32", i, (unsigned long long)r->handles[i], h->dtype);
        if (!(r->hin[i] = dj_malloc(h->nbytes ? h->nbytes : 1)))
            return dj_fail(DJ_ENOMEM, "out of memory copying input %u (%llu bytes)", i, (unsigned long long)h->nbytes);
        memcpy(r->hin[i], h->bytes, h->nbytes);
        r->hin_bytes[i] = h->nbytes;
    }
    return DJ_OK;
}

static uint64_t dtype_size(dj_cdtype t) { return t == DJ_CDTYPE_F32 ? 4 : t == DJ_CDTYPE_I64 ? 8 : 1; }

/* raw bytes (little-endian, of dtype t) -> n f32 values (out is n floats) */
static void to_f32(dj_cdtype t, const uint8_t *raw, uint64_t n, float *out) {
    for (uint64_t i = 0; i < n; i++) {
        if (t == DJ_CDTYPE_F32) {
            memcpy(&out[i], raw + 4 * i, 4);
        } else if (t == DJ_CDTYPE_I64) {
            int64_t v;
            memcpy(&v, raw + 8 * i, 8);
            out[i] = (float)v;
        } else {
            out[i] = raw[i] ? 1.0f : 0.0f;
        }
    }
}

typedef struct run_ctx {
    const dj_cgraph_t *g;
    dj_gplan *plan;         /* the plan cache's reference on g */
    dj_weight **wref;      /* [n_weights] */
    const float **weights; /* [n_weights] */
    float **wconv;         /* [n_weights]: converted copies (non-f32 weights), else NULL */
    const float **inputs;  /* [n_inputs] */
    float **iconv;         /* [n_inputs]: payload inputs as f32 */
    const float **outs;
    void *stack;
} run_ctx;

static void ctx_free(dj__server *s, run_ctx *x) {
    const uint32_t nw = x->g ? dj_cgraph_n_weights(x->g) : 0, ni = x->g ? dj_cgraph_n_inputs(x->g) : 0;
    for (uint32_t i = 0; x->wref && i < nw; i++) dj_wstore_release(s->capture->store, x->wref[i]);
    for (uint32_t i = 0; x->wconv && i < nw; i++) free(x->wconv[i]);
    for (uint32_t i = 0; x->iconv && i < ni; i++) free(x->iconv[i]);
    free(x->wref), free(x->weights), free(x->wconv), free(x->inputs), free(x->iconv), free(x->outs);
    free(x->stack);
    dj_gplan_cache_release(s->capture->plans, x->plan);
}

/* The run on a device backend (--graph-device engine): inputs, weights and the stack copied to
 * device memory for this run, the CUDA executor, the outputs back into host buffers hout[i]
 * (x->outs then points at them). The weights' device copies are not kept between runs yet. */
static dj_status run_on_device(dj_backend_t *be, run_ctx *x, size_t sb, float **hout) {
    const uint32_t ni = dj_cgraph_n_inputs(x->g), nw = dj_cgraph_n_weights(x->g), no = dj_cgraph_n_outputs(x->g);
    void **dev = dj_calloc((size_t)ni + nw + 1, sizeof *dev);
    const float **douts = dj_calloc((size_t)no + 1, sizeof *douts);
    void *dstack = NULL;
    dj_status st = dev && douts ? DJ_OK : dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t i = 0; st == DJ_OK && i < ni + nw; i++) {
        const dj_ctensor_info *t = i < ni ? dj_cgraph_input(x->g, i) : dj_cgraph_weight(x->g, i - ni);
        const size_t b = t->numel * 4;
        st = be->vt->alloc(be, b ? b : 4, &dev[i]);
        if (st == DJ_OK && b) st = be->vt->upload(be, dev[i], i < ni ? (const void *)x->inputs[i] : (const void *)x->weights[i - ni], b);
    }
    if (st == DJ_OK) st = be->vt->alloc(be, sb ? sb : 64, &dstack);
    if (st == DJ_OK) st = be->vt->sync(be);
    if (st == DJ_OK)
        st = dj_cgraph_run_cuda(x->g, be, (const float *const *)dev, (const float *const *)(dev + ni), dstack, douts);
    for (uint32_t i = 0; st == DJ_OK && i < no; i++) {
        const size_t b = dj_cgraph_output(x->g, i)->numel * 4;
        if (!(hout[i] = dj_malloc(b ? b : 4))) st = dj_fail(DJ_ENOMEM, "out of memory for output %u", i);
        if (st == DJ_OK && b) st = be->vt->download(be, hout[i], douts[i], b);
        x->outs[i] = hout[i];
    }
    if (st == DJ_OK) st = be->vt->sync(be);
    for (uint32_t i = 0; dev && i < ni + nw; i++)
        if (dev[i]) be->vt->free(be, dev[i]);
    if (dstack) be->vt->free(be, dstack);
    free(dev), free((void *)douts);
    return st;
}

static dj_status gather_weights(dj__server *s, run_ctx *x, uint64_t conn) {
    const uint32_t nw = dj_cgraph_n_weights(x->g);
    for (uint32_t i = 0; i < nw; i++) {
        size_t hl = 0;
        const uint8_t *hb = dj_cgraph_weight_hash(x->g, i, &hl);
        if (hl != DJ_WHASH_BYTES)
            return dj_fail(DJ_EFORMAT, "weight %u (%s): its hash has %zu bytes, a weight is named by the %d of its "
                           "XXH3-128", i, dj_cgraph_weight_name(x->g, i), hl, DJ_WHASH_BYTES);
        dj_whash h;
        memcpy(h.b, hb, DJ_WHASH_BYTES);
        const void *data = NULL;
        uint64_t nbytes = 0;
        dj_status st = dj_wstore_acquire(s->capture->store, conn, &h, &x->wref[i], &data, &nbytes);
        if (st != DJ_OK)
            return dj_fail(st, "weight %u (%s): %s", i, dj_cgraph_weight_name(x->g, i), dj_last_error());
        const dj_ctensor_info *t = dj_cgraph_weight(x->g, i);
        if (nbytes != t->numel * dtype_size(t->dtype))
            return dj_fail(DJ_EINVAL, "weight %u (%s): the graph says %llu values of %s, the stored weight has %llu "
                           "bytes", i, dj_cgraph_weight_name(x->g, i), (unsigned long long)t->numel,
                           dj_cdtype_name(t->dtype), (unsigned long long)nbytes);
        if (t->dtype == DJ_CDTYPE_F32) {
            x->weights[i] = data;
        } else {
            if (!(x->wconv[i] = dj_malloc((t->numel ? t->numel : 1) * sizeof(float))))
                return dj_fail(DJ_ENOMEM, "out of memory converting weight %u", i);
            to_f32(t->dtype, data, t->numel, x->wconv[i]);
            x->weights[i] = x->wconv[i];
        }
    }
    return DJ_OK;
}

static dj_status gather_inputs(run_ctx *x, const dj__graph_req *r) {
    const uint32_t ni = dj_cgraph_n_inputs(x->g);
    if (r->n_inputs != ni)
        return dj_fail(DJ_EINVAL, "GRAPH_RUN names %u inputs, the graph has %u", r->n_inputs, ni);
    uint64_t at = 0;
    for (uint32_t i = 0; i < ni; i++) {
        const dj_ctensor_info *t = dj_cgraph_input(x->g, i);
        if (r->handles[i]) { /* copied from the handle by the I/O side (dj__graph_req_bind) */
            const uint64_t have = r->hin_bytes[i];
            if (have != t->numel * 4)
                return dj_fail(DJ_EINVAL, "GRAPH_RUN input %u: handle %016llx holds %llu bytes, the graph's input is "
                               "%llu f32 values", i, (unsigned long long)r->handles[i], (unsigned long long)have,
                               (unsigned long long)t->numel);
            x->inputs[i] = r->hin[i];
            continue;
        }
        const uint64_t need = t->numel * dtype_size(t->dtype);
        if (need > r->data_len - at)
            return dj_fail(DJ_EINVAL, "GRAPH_RUN input %u: %llu bytes of %s, the payload has %llu left", i,
                           (unsigned long long)need, dj_cdtype_name(t->dtype), (unsigned long long)(r->data_len - at));
        if (!(x->iconv[i] = dj_malloc((t->numel ? t->numel : 1) * sizeof(float))))
            return dj_fail(DJ_ENOMEM, "out of memory for input %u", i);
        to_f32(t->dtype, r->data + at, t->numel, x->iconv[i]);
        x->inputs[i] = x->iconv[i];
        at += need;
    }
    if (at != r->data_len)
        return dj_fail(DJ_EINVAL, "GRAPH_RUN: %llu payload bytes after the inputs the graph takes",
                       (unsigned long long)(r->data_len - at));
    return DJ_OK;
}

/* The outputs into out (the I/O side files them as handles of the connection, all or none). */
static dj_status publish(run_ctx *x, dj__rep_graph *out) {
    const uint32_t no = dj_cgraph_n_outputs(x->g);
    if (!(out->outs = dj_calloc(no + 1, sizeof *out->outs))) return dj_fail(DJ_ENOMEM, "out of memory");
    out->n_outs = no;
    for (uint32_t i = 0; i < no; i++) {
        const dj_ctensor_info *t = dj_cgraph_output(x->g, i);
        dj__graph_out *o = &out->outs[i];
        if (!(o->bytes = dj_malloc(t->numel ? t->numel * 4 : 1)))
            return dj_fail(DJ_ENOMEM, "out of memory for output %u (%llu values)", i, (unsigned long long)t->numel);
        memcpy(o->bytes, x->outs[i], t->numel * 4); /* every value is stored as f32; the declared dtype is in the reply */
        o->nbytes = t->numel * 4;
        o->rank = t->rank;
        for (uint32_t d = 0; d < t->rank && d < 8; d++) o->shape[d] = t->shape[d];
        o->dtype = dj_cdtype_name(t->dtype);
    }
    return DJ_OK;
}

/* r's plan from the cache (put when its bytes came): a reference to release, and its id */
static dj_status plan_of(dj__capture *c, const dj__graph_req *r, uint64_t conn, const dj_cgraph_t **g, dj_gplan **plan,
                         uint8_t id[DJ_GPLAN_ID_BYTES], bool *hit) {
    dj_cgraph_error err;
    dj_status st;
    *hit = true;
    if (r->graph_len) {
        st = dj_gplan_cache_put(c->plans, conn, r->graph, (size_t)r->graph_len, NULL, g, plan, id, hit, &err);
        if (st != DJ_OK) return dj_fail(st, "%s (%s)", err.msg, dj_cgraph_err_name(err.kind));
        if (r->has_id && memcmp(id, r->graph_id, DJ_GPLAN_ID_BYTES)) {
            dj_gplan_cache_release(c->plans, *plan);
            *plan = NULL;
            return dj_fail(DJ_EINVAL, "GRAPH_RUN: graph_id is not the XXH3-128 of the graph's bytes");
        }
        return DJ_OK;
    }
    memcpy(id, r->graph_id, DJ_GPLAN_ID_BYTES);
    return dj_gplan_cache_get(c->plans, conn, id, g, plan);
}

dj_status dj__graph_plan_bytes(dj__server *s, dj__graph_req *r, uint64_t conn, uint64_t *bytes) {
    dj__capture *c = s->capture;
    *bytes = 0;
    if (r->plan) dj_gplan_cache_release(r->plans, r->plan);
    r->plan = NULL;
    const double t0 = dj__now();
    const dj_status st = plan_of(c, r, conn, &r->g, &r->plan, r->plan_id, &r->plan_hit);
    r->plan_s = dj__now() - t0;
    if (st != DJ_OK) {
        r->plan = NULL;
        atomic_fetch_add(&c->run_errors, 1);
        return st;
    }
    r->plans = c->plans;
    uint64_t n = dj_cgraph_stack_bytes(r->g);
    for (uint32_t i = 0; i < dj_cgraph_n_outputs(r->g); i++) n += dj_cgraph_output(r->g, i)->numel * 4;
    *bytes = n;
    return DJ_OK;
}

dj_status dj__graph_serve(dj__server *s, const dj__graph_req *r, uint64_t conn, dj__rep_graph *out) {
    dj__capture *c = s->capture;
    run_ctx x = {0};
    const double t0 = dj__now();
    uint8_t id[DJ_GPLAN_ID_BYTES];
    bool hit = true;
    dj_status st = DJ_OK;
    double t_plan;
    if (r->plan) { /* taken as it arrived (the plan stays r's: released with it) */
        x.g = r->g;
        memcpy(id, r->plan_id, DJ_GPLAN_ID_BYTES);
        hit = r->plan_hit;
        t_plan = r->plan_s;
    } else {
        if ((st = plan_of(c, r, conn, &x.g, &x.plan, id, &hit)) != DJ_OK) {
            atomic_fetch_add(&c->run_errors, 1);
            return st;
        }
        t_plan = dj__now() - t0;
    }
    const uint32_t nw = dj_cgraph_n_weights(x.g), ni = dj_cgraph_n_inputs(x.g), no = dj_cgraph_n_outputs(x.g);
    x.wref = dj_calloc(nw + 1, sizeof *x.wref);
    x.weights = dj_calloc(nw + 1, sizeof *x.weights);
    x.wconv = dj_calloc(nw + 1, sizeof *x.wconv);
    x.inputs = dj_calloc(ni + 1, sizeof *x.inputs);
    x.iconv = dj_calloc(ni + 1, sizeof *x.iconv);
    x.outs = dj_calloc(no + 1, sizeof *x.outs);
    if (!x.wref || !x.weights || !x.wconv || !x.inputs || !x.iconv || !x.outs)
        st = dj_fail(DJ_ENOMEM, "out of memory");
    if (st == DJ_OK) st = gather_weights(s, &x, conn);
    if (st == DJ_OK) st = gather_inputs(&x, r);
    const size_t sb = dj_cgraph_stack_bytes(x.g);
    dj_backend_t *dev = s->cfg.graph_on_engine && s->engine ? dj_engine_backend(s->engine) : NULL;
    float **hout = NULL;
    if (dev && !dev->host_memory) {
        if (st == DJ_OK && !(hout = dj_calloc(no + 1, sizeof *hout))) st = dj_fail(DJ_ENOMEM, "out of memory");
        if (st == DJ_OK) st = run_on_device(dev, &x, sb, hout);
    } else {
        if (st == DJ_OK && !(x.stack = aligned_alloc(64, sb ? sb : 64)))
            st = dj_fail(DJ_ENOMEM, "no memory for the graph's stack of %zu bytes", sb);
        if (st == DJ_OK && !c->cpu) st = dj_backend_cpu_new(c->threads, &c->cpu);
        if (st == DJ_OK) st = dj_cgraph_run(x.g, c->cpu, x.inputs, x.weights, x.stack, x.outs);
    }
    if (st == DJ_OK) st = publish(&x, out);
    for (uint32_t i = 0; hout && i < no; i++) free(hout[i]);
    free(hout);
    if (st == DJ_OK) {
        out->nodes = dj_cgraph_n_nodes(x.g);
        out->stack_bytes = sb;
        out->run_s = dj__now() - t0;
        out->plan_s = t_plan;
        out->plan_cached = hit;
        memcpy(out->graph_id, id, sizeof out->graph_id);
        atomic_fetch_add(&c->runs, 1);
    } else {
        atomic_fetch_add(&c->run_errors, 1);
    }
    ctx_free(s, &x);
    return st;
}

void dj__capture_conn_closed(dj__server *s, uint64_t conn) {
    if (!s->capture) return;
    dj_wstore_conn_closed(s->capture->store, conn);
    dj_gplan_cache_conn_closed(s->capture->plans, conn);
    for (size_t b = 0; b < s->handles.n_buckets; b++) {
        dj__ment *e = s->handles.b[b];
        while (e) {
            dj__handle *h = e->val;
            e = e->next;
            if (h->conn == conn && h->sess == 0) { /* a graph's outputs: no session frees them */
                dj__map_del(&s->handles, h->id);
                dj__handle_unref(s, h);
            }
        }
    }
}

void dj__capture_stats(dj__capture *c, dj__mw *w) {
    if (!c) return;
    dj_wstore_stats st;
    dj_wstore_get_stats(c->store, &st);
    dj__mw_key(w, "weights");
    msgpack_pack_map(&w->pk, 13);
#define KV(k, v) (dj__pack_str(&w->pk, k), msgpack_pack_uint64(&w->pk, v))
    KV("count", st.weights);
    KV("bytes", st.bytes);
    KV("referenced", st.referenced);
    KV("capacity", st.capacity);
    KV("quota", st.quota);
    KV("inflight_bytes", st.inflight_bytes);
    KV("received_bytes", st.received_bytes);
    KV("uploads", st.uploads);
    KV("upload_dups", st.upload_dups);
    KV("hash_mismatches", st.hash_mismatches);
    KV("challenges_passed", st.challenges_passed);
    KV("challenges_failed", st.challenges_failed);
    KV("evictions", st.evictions);
    dj_gplan_cache_stats ps;
    dj_gplan_cache_get_stats(c->plans, &ps);
    dj__mw_key(w, "graph_plans");
    msgpack_pack_map(&w->pk, 7);
    KV("entries", ps.entries);
    KV("bytes", ps.bytes);
    KV("capacity", ps.capacity);
    KV("hits", ps.hits);
    KV("misses", ps.misses);
    KV("evictions", ps.evictions);
    KV("refused_id", ps.refused_id);
#undef KV
    dj__mw_u64(w, "graph_runs", atomic_load(&c->runs));
    dj__mw_u64(w, "graph_run_errors", atomic_load(&c->run_errors));
}
