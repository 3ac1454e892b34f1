/* test_request.c: djinnd's message table and typed requests (request.c) and
 * the I/O side's encoder of the worker's typed events (encode.c), without a daemon. */
#include <stdlib.h>
#include <string.h>

#include "proto/sample_wire.h"
#include "server/server_impl.h"
#include "testutil.h"

/* A request of type t from a msgpack map written by fill (and a payload). */
static dj_status decode(uint16_t t, void (*fill)(dj__mw *w), const uint8_t *payload, size_t plen, dj__request *r) {
    dj__mw w;
    dj__mw_init(&w);
    if (fill) fill(&w);
    dj__mw_finish(&w);
    dj__meta m;
    dj_status st = dj__meta_parse(&m, (const uint8_t *)w.sb.data, w.sb.size);
    dj__mw_destroy(&w);
    if (st != DJ_OK) return st;
    memset(r, 0, sizeof *r);
    r->type = t;
    r->body = malloc(plen + 1); /* the frame's body: the request owns it */
    if (plen) memcpy(r->body, payload, plen);
    if (t == DJ_MSG_STEP) {
        r->u.step.payload = r->body;
        r->u.step.payload_len = plen;
    }
    st = dj__request_decode(&m, r);
    dj__meta_destroy(&m);
    return st;
}

static void gen_neither(dj__mw *w) { dj__mw_u64(w, "session", 7); }
static void gen_ok(dj__mw *w) {
    dj__mw_u64(w, "session", 7);
    dj__mw_str(w, "prompt", "Once");
    dj__mw_u64(w, "max_tokens", 9);
    dj__mw_f64(w, "temperature", 0.5);
    dj__mw_u64(w, "top_k", 5);
    const int32_t stop[2] = {1, 2};
    dj__mw_ids(w, "stop_ids", stop, 2);
    dj__mw_bool(w, "logprobs", true);
    dj__mw_u64(w, "top_logprobs", 3);
    dj__mw_str(w, "cache_salt", "tenant-a");
    const dj_logit_bias b[2] = {{.id = 4, .bias = -100.f}, {.id = 9, .bias = 2.5f}};
    dj__logit_bias_encode(w, b, 2);
}
/* logit_bias entries that are refused: a map, a lone id, a string bias, 101, an id twice */
static int bias_case;
static void gen_bias_bad(dj__mw *w) {
    gen_neither(w);
    dj__mw_str(w, "prompt", "x");
    dj__mw_key(w, "logit_bias");
    msgpack_packer *pk = &w->pk;
    if (bias_case == 0) {
        msgpack_pack_map(pk, 0);
        return;
    }
    msgpack_pack_array(pk, bias_case == 4 ? 2 : 1);
    for (int k = 0; k < (bias_case == 4 ? 2 : 1); k++) {
        if (bias_case == 1) {
            msgpack_pack_uint32(pk, 3);
            continue;
        }
        msgpack_pack_array(pk, 2);
        msgpack_pack_uint32(pk, 3);
        if (bias_case == 2) dj__pack_str(pk, "up");
        else msgpack_pack_double(pk, bias_case == 3 ? 101.0 : 1.0);
    }
}
static void gen_both(dj__mw *w) {
    dj__mw_u64(w, "session", 7);
    dj__mw_str(w, "prompt", "x");
    const int32_t ids[1] = {3};
    dj__mw_ids(w, "ids", ids, 1);
}
static void gen_no_session(dj__mw *w) { dj__mw_str(w, "prompt", "x"); }
static void gen_top_lp_alone(dj__mw *w) {
    gen_neither(w);
    dj__mw_str(w, "prompt", "x");
    dj__mw_u64(w, "top_logprobs", 2);
}
static void gen_min_p(dj__mw *w) {
    gen_neither(w);
    dj__mw_str(w, "prompt", "x");
    dj__mw_f64(w, "min_p", 2.0);
}
static void gen_temp_str(dj__mw *w) {
    gen_neither(w);
    dj__mw_str(w, "prompt", "x");
    dj__mw_str(w, "temperature", "hot");
}
static void gen_salt_empty(dj__mw *w) {
    gen_neither(w);
    dj__mw_str(w, "prompt", "x");
    dj__mw_str(w, "cache_salt", "");
}

static void gen_salt_ok(dj__mw *w) {
    gen_neither(w);
    dj__mw_str(w, "prompt", "x");
}

static void step_plain(dj__mw *w) { dj__mw_u64(w, "session", 7); }
static void step_ids_too(dj__mw *w) {
    dj__mw_u64(w, "session", 7);
    const int32_t ids[1] = {3};
    dj__mw_ids(w, "ids", ids, 1);
}
static void step_logits_bad(dj__mw *w) {
    step_ids_too(w);
    dj__mw_str(w, "logits", "most");
}
static void point(dj__mw *w, const char *name, const char *op, int nd) {
    msgpack_pack_map(&w->pk, nd ? 3 : 2);
    dj__pack_str(&w->pk, "point");
    dj__pack_str(&w->pk, name);
    dj__pack_str(&w->pk, "op");
    dj__pack_str(&w->pk, op);
    if (!nd) return;
    dj__pack_str(&w->pk, "shape");
    msgpack_pack_array(&w->pk, nd);
    for (int i = 0; i < nd; i++) msgpack_pack_uint64(&w->pk, i == nd - 1 ? 16 : 2);
}
static void step_points(dj__mw *w) {
    step_ids_too(w);
    dj__mw_str(w, "logits", "none");
    dj__mw_key(w, "points");
    msgpack_pack_array(&w->pk, 2);
    point(w, "layers.0.out", "save", 0);
    point(w, "layers.1.out", "add", 2);
}
static void step_points_bad_op(dj__mw *w) {
    step_ids_too(w);
    dj__mw_key(w, "points");
    msgpack_pack_array(&w->pk, 1);
    point(w, "layers.0.out", "scale", 0); /* "mul" is the op's name */
}
static void step_resume_with_ids(dj__mw *w) { /* a resume takes no ids */
    step_ids_too(w);
    dj__mw_bool(w, "resume", true);
}
static void step_resume_cancel(dj__mw *w) {
    dj__mw_u64(w, "session", 5);
    dj__mw_bool(w, "resume", true);
    dj__mw_bool(w, "cancel", true);
}
static void step_cancel(dj__mw *w) {
    dj__mw_u64(w, "session", 5);
    dj__mw_bool(w, "cancel", true);
}
static void step_prompt_and_ids(dj__mw *w) {
    step_ids_too(w);
    dj__mw_str(w, "prompt", "hello");
}
static void step_points_long_name(dj__mw *w) {
    step_ids_too(w);
    dj__mw_key(w, "points");
    msgpack_pack_array(&w->pk, 1);
    char name[200];
    memset(name, 'a', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    point(w, name, "save", 0);
}
static void step_points_all(dj__mw *w) {
    step_ids_too(w);
    dj__mw_str(w, "logits", "all");
    dj__mw_key(w, "points");
    msgpack_pack_array(&w->pk, 1);
    point(w, "layers.0.out", "save", 0);
}

static void open_batch(dj__mw *w) {
    dj__mw_str(w, "model", "demo");
    dj__mw_str(w, "qos", "batch");
    dj__mw_bool(w, "reattach", true);
}
static void open_bad_qos(dj__mw *w) {
    dj__mw_str(w, "model", "demo");
    dj__mw_str(w, "qos", "vip");
}
static void fetch_elems(dj__mw *w) {
    dj__mw_u64(w, "handle", 11);
    dj__mw_u64(w, "count", 4);
}

static void test_table(void) {
    for (uint16_t t = 1; t <= DJ_MSG_REQUEST_LAST; t++) {
        const dj__msg_row *row = dj__msg_row_of(t);
        CHECK_MSG(row && row->type == t && row->decode, "type 0x%02x", t);
        if (row) CHECK(!strcmp(row->name, dj_msg_type_name(t)));
        /* STEP, WEIGHT_UPLOAD, GRAPH_RUN and SESSION_IMPORT carry one */
        if (row) CHECK(row->payload == (t == DJ_MSG_STEP || t == DJ_MSG_WEIGHT_UPLOAD || t == DJ_MSG_GRAPH_RUN ||
                                  t == DJ_MSG_SESSION_IMPORT));
    }
    CHECK(dj__msg_row_of(0) == NULL);
    CHECK(dj__msg_row_of(DJ_MSG_REPLY) == NULL);
    CHECK(dj__msg_row_of(DJ_MSG_TOKEN) == NULL);
    CHECK(dj__msg_row_of(0xffff) == NULL);
    CHECK(dj__msg_row_of(DJ_MSG_GENERATE)->session == DJ__SESS_REQUIRED);
    CHECK(dj__msg_row_of(DJ_MSG_HEARTBEAT)->session == DJ__SESS_OPTIONAL);
    CHECK(dj__msg_row_of(DJ_MSG_STATS)->session == DJ__SESS_NONE);
    CHECK(dj__msg_row_of(DJ_MSG_GENERATE)->at == DJ__AT_WORKER);
    CHECK(dj__msg_row_of(DJ_MSG_FETCH)->at == DJ__AT_IO);
    CHECK(dj__msg_row_of(DJ_MSG_HELLO)->at == DJ__AT_IO);
    CHECK(dj__msg_row_of(DJ_MSG_WEIGHT_HAS)->at == DJ__AT_IO); /* the weight store has its own lock */
    CHECK(dj__msg_row_of(DJ_MSG_GRAPH_RUN)->at == DJ__AT_WORKER);
}

static void test_generate(void) {
    dj__request r;
    CHECK_ST(decode(DJ_MSG_GENERATE, gen_ok, NULL, 0, &r), DJ_OK);
    const dj__req_generate *g = &r.u.gen;
    CHECK(r.session == 7);
    CHECK(g->prompt && g->plen == 4 && !memcmp(g->prompt, "Once", 4) && !g->ids);
    CHECK(g->max_tokens == 9);
    CHECK(g->s.sampling.temperature == 0.5f && g->s.sampling.top_k == 5 && g->s.sampling.top_p == 1.0f);
    CHECK(g->s.n_stop == 2 && g->s.stop_ids[0] == 1 && g->s.stop_ids[1] == 2);
    CHECK(g->s.logprobs && g->s.top_logprobs == 3);
    CHECK(g->cache_salt && g->salt_len == 8);
    CHECK(g->s.n_logit_bias == 2 && g->s.logit_bias[0].id == 4 && g->s.logit_bias[0].bias == -100.f &&
          g->s.logit_bias[1].id == 9 && g->s.logit_bias[1].bias == 2.5f);
    dj__request_free(&r);
    static const dj_status bias_want[] = {DJ_EFORMAT, DJ_EFORMAT, DJ_EFORMAT, DJ_EINVAL, DJ_EINVAL};
    for (bias_case = 0; bias_case < 5; bias_case++) {
        CHECK_ST(decode(DJ_MSG_GENERATE, gen_bias_bad, NULL, 0, &r), bias_want[bias_case]);
        CHECK(strstr(dj_last_error(), "logit_bias") != NULL);
        dj__request_free(&r);
    }
    CHECK_ST(decode(DJ_MSG_GENERATE, gen_both, NULL, 0, &r), DJ_EFORMAT);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_GENERATE, gen_neither, NULL, 0, &r), DJ_EFORMAT);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_GENERATE, gen_no_session, NULL, 0, &r), DJ_EFORMAT);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_GENERATE, gen_top_lp_alone, NULL, 0, &r), DJ_EINVAL);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_GENERATE, gen_min_p, NULL, 0, &r), DJ_EINVAL);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_GENERATE, gen_temp_str, NULL, 0, &r), DJ_EFORMAT);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_GENERATE, gen_salt_empty, NULL, 0, &r), DJ_EINVAL);
    dj__request_free(&r);
    /* the defaults: greedy, top_p off, 64 tokens */
    CHECK_ST(decode(DJ_MSG_GENERATE, gen_salt_ok, NULL, 0, &r), DJ_OK);
    CHECK(r.u.gen.max_tokens == 64 && r.u.gen.s.sampling.temperature == 0.0f && r.u.gen.s.sampling.top_p == 1.0f);
    CHECK(!r.u.gen.s.logprobs && !r.u.gen.s.stop_ids && !r.u.gen.s.logit_bias);
    dj__request_free(&r);
}

static void test_step(void) {
    dj__request r;
    const uint8_t le[8] = {5, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f}; /* 5, INT32_MAX */
    CHECK_ST(decode(DJ_MSG_STEP, step_plain, le, sizeof le, &r), DJ_OK);
    CHECK(r.u.step.n_ids == 2 && r.u.step.ids[0] == 5 && r.u.step.ids[1] == INT32_MAX);
    CHECK(r.u.step.logits == DJ__LOGITS_LAST && r.u.step.n_points == 0);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_plain, le, 5, &r), DJ_EFORMAT);   /* not int32s */
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_ids_too, le, 4, &r), DJ_EFORMAT); /* ids and a payload */
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_plain, NULL, 0, &r), DJ_EFORMAT); /* no ids at all */
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_logits_bad, NULL, 0, &r), DJ_EUNSUPPORTED);
    dj__request_free(&r);
    float t[32] = {0};
    CHECK_ST(decode(DJ_MSG_STEP, step_points, (const uint8_t *)t, sizeof t, &r), DJ_OK);
    CHECK(r.u.step.n_points == 2 && r.u.step.logits == DJ__LOGITS_NONE);
    CHECK(r.u.step.points[0].op == DJ_IV_SAVE && !strcmp(r.u.step.points[0].point, "layers.0.out"));
    CHECK(r.u.step.points[1].op == DJ_IV_ADD && r.u.step.points[1].nd == 2 && r.u.step.points[1].dims[1] == 16);
    CHECK(r.u.step.payload_len == sizeof t); /* with points the payload stays: the tensors */
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_points_bad_op, NULL, 0, &r), DJ_EINVAL);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_resume_with_ids, NULL, 0, &r), DJ_EINVAL);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_resume_cancel, NULL, 0, &r), DJ_EINVAL);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_cancel, NULL, 0, &r), DJ_OK);
    CHECK(r.u.step.brk == DJ__BRK_CANCEL && r.u.step.n_ids == 0);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_prompt_and_ids, NULL, 0, &r), DJ_EFORMAT);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_points_long_name, NULL, 0, &r), DJ_EINVAL);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_STEP, step_points_all, NULL, 0, &r), DJ_EINVAL);
    dj__request_free(&r);
}

static void test_others(void) {
    dj__request r;
    CHECK_ST(decode(DJ_MSG_SESSION_OPEN, open_batch, NULL, 0, &r), DJ_OK);
    CHECK(!strcmp(r.u.open.model, "demo") && r.u.open.qos == DJ_QOS_BATCH && r.u.open.reattach);
    dj__request_free(&r);
    CHECK(decode(DJ_MSG_SESSION_OPEN, open_bad_qos, NULL, 0, &r) != DJ_OK);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_SESSION_OPEN, NULL, NULL, 0, &r), DJ_EFORMAT); /* no model */
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_FETCH, fetch_elems, NULL, 0, &r), DJ_OK);
    CHECK(r.u.fetch.handle == 11 && r.u.fetch.by_elem && r.u.fetch.count == 4 && r.u.fetch.length == UINT64_MAX);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_HEARTBEAT, NULL, NULL, 0, &r), DJ_OK); /* its session is optional */
    CHECK(r.session == 0);
    dj__request_free(&r);
    CHECK_ST(decode(DJ_MSG_RESUME, NULL, NULL, 0, &r), DJ_EFORMAT); /* RESUME's is not */
    dj__request_free(&r);
}

/* The frame an event becomes, its metadata parsed back. */
static bool encoded(const dj__event *e, uint16_t type, dj__meta *m) {
    dj__out *o = dj__event_encode(e);
    if (!o) return false;
    const bool ok = o->h.type == type && o->h.request_id == e->req &&
                    dj__meta_parse(m, (const uint8_t *)o->meta, o->h.meta_len) == DJ_OK;
    free(o->meta);
    free(o);
    return ok;
}

static void test_encode(void) {
    dj__meta m;
    dj__event *e = dj__event_new(DJ__EV_TOKEN, 1, DJ_MSG_GENERATE, 42, 3);
    e->u.token.id = 17;
    e->u.token.index = 2;
    e->u.token.has_text = true;
    e->u.token.text = (char *)(e + 1);
    memcpy(e->u.token.text, "abc", 3);
    e->u.token.text_len = 3;
    if (encoded(e, DJ_MSG_TOKEN, &m)) {
        int64_t id = 0;
        const char *txt = NULL;
        size_t n = 0;
        CHECK(dj__meta_i64(&m, "id", true, &id) == DJ_OK && id == 17);
        CHECK(dj__meta_str(&m, "text", true, &txt, &n) == DJ_OK && n == 3 && !memcmp(txt, "abc", 3));
        CHECK(!dj__meta_get(&m, "logprob"));
        dj__meta_destroy(&m);
    } else {
        CHECK(!"TOKEN encoded");
    }
    dj__event_free(e);

    e = dj__event_new(DJ__EV_DONE, 1, DJ_MSG_GENERATE, 43, 0);
    e->u.done.reason = "length";
    e->u.done.n_generated = 4;
    if (encoded(e, DJ_MSG_DONE, &m)) {
        char reason[16];
        uint64_t n = 0;
        CHECK(dj__meta_strcpy(&m, "reason", true, reason, sizeof reason) == DJ_OK && !strcmp(reason, "length"));
        CHECK(dj__meta_u64(&m, "n_generated", true, &n) == DJ_OK && n == 4);
        CHECK(!dj__meta_get(&m, "stop_id") && !dj__meta_get(&m, "text"));
        dj__meta_destroy(&m);
    } else {
        CHECK(!"DONE encoded");
    }
    dj__event_free(e);

    e = dj__event_error(1, DJ_MSG_STEP, 44, DJ_EBUSY, "session 1 is paused", false);
    if (encoded(e, DJ_MSG_ERROR, &m)) {
        int64_t st = 0;
        CHECK(dj__meta_i64(&m, "status", true, &st) == DJ_OK && st == DJ_EBUSY);
        dj__meta_destroy(&m);
    } else {
        CHECK(!"ERROR encoded");
    }
    dj__event_free(e);

    e = dj__event_new(DJ__EV_REPLY, 1, DJ_MSG_STEP, 45, 0);
    e->u.step.pos = 9;
    e->u.step.handle = 77;
    e->u.step.ndim = 1;
    e->u.step.shape[0] = 32;
    e->u.step.nbytes = 128;
    if (encoded(e, DJ_MSG_REPLY, &m)) {
        uint64_t pos = 0, h = 0;
        CHECK(dj__meta_u64(&m, "pos", true, &pos) == DJ_OK && pos == 9);
        CHECK(dj__meta_u64(&m, "handle", true, &h) == DJ_OK && h == 77);
        CHECK(!dj__meta_get(&m, "saved")); /* no points: no list */
        dj__meta_destroy(&m);
    } else {
        CHECK(!"STEP reply encoded");
    }
    dj__event_free(e);

    e = dj__event_new(DJ__EV_CREDIT, 1, DJ_MSG_GENERATE, 46, 0);
    CHECK(dj__event_encode(e) == NULL); /* a credit has no frame */
    dj__event_free(e);
}

int main(void) {
    test_table();
    test_generate();
    test_step();
    test_others();
    test_encode();
    return dj_test_finish("test_request");
}
