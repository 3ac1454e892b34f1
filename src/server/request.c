/* request.c: the message table and the decoders that turn a request frame's
 * msgpack metadata into a typed dj__request (the I/O thread; the worker reads only the structs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/alloc.h"
#include "proto/proto_impl.h"
#include "proto/sample_wire.h"
#include "server/request.h"

#define DEFAULT_MAX_TOKENS 64
#define SALT_BYTES_MAX 256 /* DJ__SALT_BYTES_MAX (server_impl.h) */

/* An optional string field, copied (NUL-terminated) into *out. */
static dj_status str_dup(const dj__meta *m, const char *key, char **out, size_t *n) {
    const char *p = NULL;
    *out = NULL;
    *n = 0;
    dj_status st = dj__meta_str(m, key, false, &p, n);
    if (st != DJ_OK || !p) return st;
    char *c = dj_malloc(*n + 1);
    if (!c) return dj_fail(DJ_ENOMEM, "out of memory");
    memcpy(c, p, *n);
    c[*n] = '\0';
    *out = c;
    return DJ_OK;
}

/* A request's `cache_salt`: 1 to SALT_BYTES_MAX bytes when given. */
static dj_status salt_dup(const dj__meta *m, char **out, size_t *n) {
    dj_status st = str_dup(m, "cache_salt", out, n);
    if (st == DJ_OK && *out && (*n == 0 || *n > SALT_BYTES_MAX)) {
        st = dj_fail(DJ_EINVAL, "cache_salt of %zu bytes (1 to %d)", *n, SALT_BYTES_MAX);
        free(*out);
        *out = NULL;
    }
    return st;
}

static dj_status dec_nothing(const dj__meta *m, dj__request *r) {
    (void)m;
    (void)r;
    return DJ_OK;
}

static dj_status dec_session_only(const dj__meta *m, dj__request *r) { return dec_nothing(m, r); }

static dj_status dec_hello(const dj__meta *m, dj__request *r) {
    dj__req_hello *h = &r->u.hello;
    h->version = DJ_PROTO_VERSION;
    dj_status st = dj__meta_u32(m, "version", false, &h->version);
    if (st == DJ_OK) st = str_dup(m, "token", &h->token, &h->token_len);
    return st;
}

static dj_status dec_model(const dj__meta *m, dj__request *r) {
    return dj__meta_strcpy(m, "model", true, r->u.model, sizeof r->u.model);
}

static dj_status dec_open(const dj__meta *m, dj__request *r) {
    dj__req_open *o = &r->u.open;
    char qos[16] = "interactive";
    dj_status st = dj__meta_strcpy(m, "model", true, o->model, sizeof o->model);
    if (st == DJ_OK) st = dj__meta_strcpy(m, "qos", false, qos, sizeof qos);
    if (st == DJ_OK) st = dj_qos_parse(qos, &o->qos);
    if (st == DJ_OK) st = dj__meta_bool(m, "reattach", false, &o->reattach);
    if (st == DJ_OK) st = dj__meta_u32(m, "expected_tokens", false, &o->expected_tokens);
    if (st == DJ_OK) st = salt_dup(m, &o->cache_salt, &o->salt_len);
    return st;
}

dj_status dj__generate_sampling_decode(const dj__meta *m, dj__gen_sampling *out) {
    memset(out, 0, sizeof *out);
    dj_status st = dj__sample_decode(m, &out->sampling); /* the table's fields, bounded (sample_schema.h) */
    if (st == DJ_OK) st = dj__meta_bool(m, "ignore_eos", false, &out->ignore_eos);
    if (st == DJ_OK) st = dj__meta_ids(m, "stop_ids", false, &out->stop_ids, &out->n_stop);
    if (st == DJ_OK) st = dj__logit_bias_decode(m, &out->logit_bias, &out->n_logit_bias);
    if (st == DJ_OK) st = dj__meta_bool(m, "logprobs", false, &out->logprobs);
    if (st == DJ_OK) st = dj__meta_u32(m, "top_logprobs", false, &out->top_logprobs);
    if (st == DJ_OK && (out->top_logprobs > DJ_MAX_TOP_LOGPROBS || (out->top_logprobs && !out->logprobs)))
        st = dj_fail(DJ_EINVAL, "top_logprobs %u: it needs logprobs true and must be in [0, %d]", out->top_logprobs,
                     DJ_MAX_TOP_LOGPROBS);
    if (st != DJ_OK) {
        free(out->stop_ids);
        out->stop_ids = NULL;
        out->n_stop = 0;
        free(out->logit_bias);
        out->logit_bias = NULL;
        out->n_logit_bias = 0;
    }
    return st;
}

static dj_status dec_points(const msgpack_object *pts, dj__req_step *s);

/* A GENERATE's `points`: edits at every step, as a STEP's, each tensor in
 * its entry's `data` (bin, f32 LE) - a GENERATE has no payload. */
static dj_status dec_gen_points(const msgpack_object *pts, dj__req_generate *g) {
    dj__req_step tmp = {0};
    dj_status st = dec_points(pts, &tmp);
    g->points = tmp.points;
    g->n_points = tmp.n_points;
    if (st != DJ_OK) return st;
    size_t total = 0;
    for (uint32_t k = 0; k < g->n_points; k++) {
        const dj__req_point *p = &g->points[k];
        const msgpack_object *d = dj__obj_get(&pts->via.array.ptr[k], "data");
        if (p->op != DJ_IV_ADD && p->op != DJ_IV_REPLACE && p->op != DJ_IV_MUL)
            return dj_fail(DJ_EINVAL, "GENERATE points[%u] (%s): only edits (add, replace, mul) at every step", k,
                           p->point);
        if (!d || d->type != MSGPACK_OBJECT_BIN || d->via.bin.size % 4)
            return dj_fail(DJ_EFORMAT, "GENERATE points[%u] (%s): 'data' must be bin of f32 LE", k, p->point);
        total += d->via.bin.size;
    }
    if (total && !(g->iv_bytes = dj_malloc(total))) return dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t k = 0; k < g->n_points; k++) {
        const msgpack_object *d = dj__obj_get(&pts->via.array.ptr[k], "data");
        memcpy(g->iv_bytes + g->iv_len, d->via.bin.ptr, d->via.bin.size);
        g->iv_len += d->via.bin.size;
    }
    return DJ_OK;
}

static dj_status dec_generate(const dj__meta *m, dj__request *r) {
    dj__req_generate *g = &r->u.gen;
    g->max_tokens = DEFAULT_MAX_TOKENS;
    dj_status st = str_dup(m, "prompt", &g->prompt, &g->plen);
    if (st == DJ_OK) st = dj__meta_ids(m, "ids", false, &g->ids, &g->n_ids);
    if (st == DJ_OK) st = dj__meta_u32(m, "max_tokens", false, &g->max_tokens);
    if (st == DJ_OK && !!g->prompt == !!dj__meta_get(m, "ids"))
        st = dj_fail(DJ_EFORMAT, "GENERATE needs exactly one of 'prompt' or 'ids'");
    if (st == DJ_OK) st = dj__generate_sampling_decode(m, &g->s);
    if (st == DJ_OK) st = salt_dup(m, &g->cache_salt, &g->salt_len);
    if (st == DJ_OK) st = str_dup(m, "json_schema", &g->json_schema, &g->schema_len);
    const msgpack_object *pts = st == DJ_OK ? dj__meta_get(m, "points") : NULL;
    if (pts) st = dec_gen_points(pts, g);
    if (st == DJ_OK) st = dj__meta_strcpy(m, "adapter", false, g->adapter, sizeof g->adapter);
    return st;
}

static bool str_is(const msgpack_object *o, const char *s) {
    const size_t k = strlen(s);
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == k && !memcmp(o->via.str.ptr, s, k);
}

/* A STEP's `points` as sent: their structure (the worker checks them
 * against the model: dj__trace_parse). */
static dj_status dec_points(const msgpack_object *pts, dj__req_step *s) {
    if (pts->type != MSGPACK_OBJECT_ARRAY)
        return dj_fail(DJ_EFORMAT, "STEP field 'points' must be an array of {point, op[, shape]} maps");
    const uint32_t np = pts->via.array.size;
    if (np == 0) return dj_fail(DJ_EINVAL, "STEP 'points' is empty");
    if (np > DJ_IV_MAX)
        return dj_fail(DJ_EINVAL, "STEP names %u points; at most %u in one step", np, (unsigned)DJ_IV_MAX);
    if (!(s->points = dj_calloc(np, sizeof *s->points))) return dj_fail(DJ_ENOMEM, "out of memory");
    s->n_points = np;
    for (uint32_t k = 0; k < np; k++) {
        const msgpack_object *e = &pts->via.array.ptr[k];
        const msgpack_object *po = dj__obj_get(e, "point"), *op = dj__obj_get(e, "op");
        if (!po || po->type != MSGPACK_OBJECT_STR || !op || op->type != MSGPACK_OBJECT_STR)
            return dj_fail(DJ_EFORMAT, "STEP points[%u] must be a map with string 'point' and 'op'", k);
        dj__req_point *p = &s->points[k];
        p->point_len = po->via.str.size;
        if (p->point_len >= sizeof p->point)
            return dj_fail(DJ_EINVAL, "STEP points[%u]: a point's name has at most %zu bytes", k, sizeof p->point - 1);
        memcpy(p->point, po->via.str.ptr, p->point_len);
        p->point[p->point_len] = '\0';
        if (str_is(op, "save") || str_is(op, "break")) {
            p->op = str_is(op, "save") ? DJ_IV_SAVE : DJ_IV_BREAK;
            const msgpack_object *kp = dj__obj_get(e, "keep");
            if (kp && kp->type != MSGPACK_OBJECT_BOOLEAN)
                return dj_fail(DJ_EFORMAT, "STEP points[%u] (%s): 'keep' must be a bool", k, p->point);
            if (kp && p->op != DJ_IV_SAVE)
                return dj_fail(DJ_EINVAL, "STEP points[%u] (%s): 'keep' is a save's", k, p->point);
            p->keep = kp && kp->via.boolean;
            continue;
        }
        if (str_is(op, "add")) p->op = DJ_IV_ADD;
        else if (str_is(op, "replace")) p->op = DJ_IV_REPLACE;
        else if (str_is(op, "mul")) p->op = DJ_IV_MUL;
        else return dj_fail(DJ_EINVAL, "STEP points[%u] (%s): op must be 'save', 'add', 'replace', 'mul' or 'break'",
                            k, p->point);
        const char *const rk[2] = {"rows", "cols"};
        for (int a = 0; a < 2; a++) { /* an edit's region: [from, to) of positions / hidden units */
            const msgpack_object *ro = dj__obj_get(e, rk[a]);
            if (!ro) continue;
            uint64_t *v = a ? p->cols : p->rows;
            if (ro->type != MSGPACK_OBJECT_ARRAY || ro->via.array.size != 2 || !dj__obj_u64(&ro->via.array.ptr[0], &v[0]) ||
                !dj__obj_u64(&ro->via.array.ptr[1], &v[1]))
                return dj_fail(DJ_EFORMAT, "STEP points[%u] (%s): '%s' must be [from, to]", k, p->point, rk[a]);
            if (a) p->has_cols = true;
            else p->has_rows = true;
        }
        const msgpack_object *dt = dj__obj_get(e, "dtype");
        if (dt && !str_is(dt, "f32"))
            return dj_fail(DJ_EUNSUPPORTED, "STEP points[%u] (%s): tensors travel as dtype 'f32'", k, p->point);
        const msgpack_object *sh = dj__obj_get(e, "shape");
        p->nd = sh && sh->type == MSGPACK_OBJECT_ARRAY ? sh->via.array.size : 0;
        bool ok = p->nd == 1 || p->nd == 2;
        for (uint32_t i = 0; ok && i < p->nd; i++) ok = dj__obj_u64(&sh->via.array.ptr[i], &p->dims[i]);
        if (!ok) return dj_fail(DJ_EFORMAT, "STEP points[%u] (%s): 'shape' must be [hidden] or [n, hidden]", k, p->point);
    }
    return DJ_OK;
}

static dj_status dec_step(const dj__meta *m, dj__request *r) {
    dj__req_step *s = &r->u.step;
    const msgpack_object *pts = dj__meta_get(m, "points");
    bool resume = false, cancel = false;
    dj_status st = dj__meta_bool(m, "resume", false, &resume);
    if (st == DJ_OK) st = dj__meta_bool(m, "cancel", false, &cancel);
    if (st != DJ_OK) return st;
    if (resume || cancel) { /* the session's paused step (step_break.c): no ids, a resume's edits in points */
        if (resume && cancel) return dj_fail(DJ_EINVAL, "a STEP either resumes or cancels a paused step, not both");
        if (dj__meta_get(m, "ids") || (s->payload_len && !pts))
            return dj_fail(DJ_EINVAL, "a STEP that %s a paused step takes no ids", resume ? "resumes" : "cancels");
        if (cancel && pts) return dj_fail(DJ_EINVAL, "a STEP that cancels a paused step takes no points");
        s->brk = resume ? DJ__BRK_RESUME : DJ__BRK_CANCEL;
        if (!pts) return DJ_OK;
        if ((st = dec_points(pts, s)) != DJ_OK) return st;
        for (uint32_t k = 0; k < s->n_points; k++)
            if (s->points[k].op != DJ_IV_ADD && s->points[k].op != DJ_IV_REPLACE)
                return dj_fail(DJ_EINVAL, "a resume's points[%u] (%s): only 'add' or 'replace' of the paused point", k,
                               s->points[k].point);
        return DJ_OK;
    }
    if ((st = str_dup(m, "prompt", &s->prompt, &s->plen)) != DJ_OK) return st;
    if (s->prompt) { /* text: the worker tokenizes it (the ids come back in the reply) */
        if (dj__meta_get(m, "ids") || (s->payload_len && !pts))
            return dj_fail(DJ_EFORMAT, "STEP needs exactly one of 'prompt' or 'ids'");
        if (s->plen == 0) return dj_fail(DJ_EINVAL, "STEP 'prompt' is empty");
        if (memchr(s->prompt, 0, s->plen)) return dj_fail(DJ_EINVAL, "STEP 'prompt' holds U+0000");
    } else if (s->payload_len && !pts) {
        if (s->payload_len % 4)
            return dj_fail(DJ_EFORMAT, "STEP payload of %llu bytes is not int32 ids", (unsigned long long)s->payload_len);
        if (dj__meta_get(m, "ids")) return dj_fail(DJ_EFORMAT, "STEP has both 'ids' and a payload");
        s->n_ids = s->payload_len / 4;
        if (!(s->ids = dj_malloc((s->n_ids ? s->n_ids : 1) * sizeof *s->ids)))
            return dj_fail(DJ_ENOMEM, "out of memory");
        for (size_t i = 0; i < s->n_ids; i++) {
            const uint8_t *p = s->payload + 4 * i;
            s->ids[i] = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        }
        s->payload = NULL;
        s->payload_len = 0;
    } else if ((st = dj__meta_ids(m, "ids", true, &s->ids, &s->n_ids)) != DJ_OK) {
        return st;
    }
    const char *lg = NULL;
    size_t lgn = 0;
    if ((st = dj__meta_str(m, "logits", false, &lg, &lgn)) != DJ_OK) return st;
    if (lg && lgn == 4 && !memcmp(lg, "none", 4)) s->logits = DJ__LOGITS_NONE;
    else if (lg && lgn == 3 && !memcmp(lg, "all", 3)) s->logits = DJ__LOGITS_ALL;
    else if (lg && !(lgn == 4 && !memcmp(lg, "last", 4)))
        return dj_fail(DJ_EUNSUPPORTED, "logits '%.*s': ask for 'last' (default), 'all' or 'none'",
                       (int)(lgn > 32 ? 32 : lgn), lg);
    if (!pts) return DJ_OK;
    if (s->logits == DJ__LOGITS_ALL) return dj_fail(DJ_EINVAL, "a STEP with points takes logits 'last' or 'none', not 'all'");
    if ((st = dec_points(pts, s)) != DJ_OK) return st;
    if (s->n_ids == 0 && !s->prompt) return dj_fail(DJ_EINVAL, "a STEP with points needs at least one token id");
    return DJ_OK;
}

static dj_status dec_fetch(const dj__meta *m, dj__request *r) {
    dj__req_fetch *f = &r->u.fetch;
    f->length = f->count = UINT64_MAX;
    dj_status st = dj__meta_u64(m, "handle", true, &f->handle);
    if (st == DJ_OK) st = dj__meta_u64(m, "offset", false, &f->offset);
    if (st == DJ_OK) st = dj__meta_u64(m, "length", false, &f->length);
    if (st == DJ_OK) st = dj__meta_u64(m, "start", false, &f->start);
    if (st == DJ_OK) st = dj__meta_u64(m, "count", false, &f->count);
    f->by_elem = dj__meta_get(m, "start") || dj__meta_get(m, "count");
    return st;
}

static dj_status dec_handle(const dj__meta *m, dj__request *r) { return dj__meta_u64(m, "handle", true, &r->u.handle); }

static dj_status dec_pause(const dj__meta *m, dj__request *r) {
    return dj__meta_u64(m, "expected_ms", false, &r->u.expected_ms);
}

static dj_status dec_attach(const dj__meta *m, dj__request *r) {
    return dj__meta_u64(m, "secret", true, &r->u.attach.secret);
}

static dj_status dec_import(const dj__meta *m, dj__request *r) {
    (void)m;
    dj__req_import *im = &r->u.import;
    if (!im->payload_len) return dj_fail(DJ_EINVAL, "SESSION_IMPORT: the session image is its payload, and there is none");
    const dj_status st = dj__simg_decode(im->payload, (size_t)im->payload_len, &im->img);
    /* a damaged image is the request's fault, not the frame's: answered, the connection stays */
    if (st != DJ_EFORMAT) return st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dj_last_error()); /* dj_fail writes where dj_last_error reads */
    return dj_fail(DJ_EINVAL, "%s", msg);
}

#define ROW(NAME, PAYLOAD, SESS, AT, DEC) \
    [DJ_MSG_##NAME] = {#NAME, DJ_MSG_##NAME, PAYLOAD, SESS, AT, dec_##DEC},
static const dj__msg_row rows[DJ_MSG_REQUEST_LAST + 1] = {DJ__REQUEST_TABLE(ROW)};
#undef ROW

const dj__msg_row *dj__msg_row_of(uint16_t type) {
    return type <= DJ_MSG_REQUEST_LAST && rows[type].name ? &rows[type] : NULL;
}

void dj__request_free(dj__request *r) {
    if (!r) return;
    switch (r->type) {
    case DJ_MSG_HELLO: free(r->u.hello.token); break;
    case DJ_MSG_SESSION_OPEN: free(r->u.open.cache_salt); break;
    case DJ_MSG_GENERATE:
        free(r->u.gen.prompt);
        free(r->u.gen.ids);
        free(r->u.gen.cache_salt);
        free(r->u.gen.json_schema);
        free(r->u.gen.s.stop_ids);
        free(r->u.gen.points);
        free(r->u.gen.iv_bytes);
        free(r->u.gen.s.logit_bias);
        break;
    case DJ_MSG_STEP:
        free(r->u.step.ids);
        free(r->u.step.prompt);
        free(r->u.step.points);
        break;
    default: break;
    }
    memset(&r->u, 0, sizeof r->u);
    free(r->body);
    r->body = NULL;
}

dj_status dj__request_decode(const dj__meta *m, dj__request *r) {
    const dj__msg_row *row = dj__msg_row_of(r->type);
    if (!row) return dj_fail(DJ_EFORMAT, "message type %s is not a request", dj_msg_type_name(r->type));
    dj_status st = DJ_OK;
    r->session = 0;
    if (row->session != DJ__SESS_NONE)
        st = dj__meta_u64(m, "session", row->session == DJ__SESS_REQUIRED, &r->session);
    if (st == DJ_OK) st = row->decode(m, r);
    if (st != DJ_OK) { /* what the decoder allocated goes; the body stays the caller's to free */
        uint8_t *body = r->body;
        r->body = NULL;
        dj__request_free(r);
        r->body = body;
    }
    return st;
}
