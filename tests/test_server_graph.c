/* test_server_graph.c: captured modules on a real djinnd - WEIGHT_HAS / UPLOAD / CHALLENGE / PROVE,
 * GRAPH_RUN with payload and handle inputs (FETCH reads the outputs), and each hostile input's typed error. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_util.h"
#include "djinn/weights.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_graphXXXXXX";
static const char *djinnd = DJ_DJINND;

/* ---- frames ---- */

typedef struct reply {
    int type;
    int64_t st;
    char msg[512];
    dj__meta meta; /* valid when type >= 0 (dj__meta_destroy) */
    uint8_t *payload;
    uint64_t payload_len;
} reply;

static void send_frame(int fd, uint16_t type, uint64_t req, dj__mw *w, const void *payload, uint64_t plen) {
    static uint8_t m[1 << 16];
    const size_t n = dj_test_meta_of(w, m);
    dj_test_raw_send(fd, type, req, m, n, plen);
    if (plen) dj_test_send_all(fd, payload, plen);
}

static reply recv_reply(int fd) {
    reply r = {.type = -1};
    uint8_t b[DJ_FRAME_HEADER_BYTES];
    dj_frame_header h;
    if (dj_test_raw_recv(fd, b, sizeof b) || dj_frame_header_decode(b, DJ_PROTO_MAX_REPLY_PAYLOAD, &h) != DJ_OK)
        return r;
    uint8_t *body = malloc(h.meta_len + h.payload_len + 1);
    if (!body || dj_test_raw_recv(fd, body, h.meta_len + h.payload_len)) {
        free(body);
        return r;
    }
    if (dj__meta_parse(&r.meta, body, h.meta_len) != DJ_OK) {
        free(body);
        return r;
    }
    r.type = h.type;
    const char *s = NULL;
    size_t n = 0;
    dj__meta_i64(&r.meta, "status", false, &r.st);
    if (dj__meta_str(&r.meta, "message", false, &s, &n) == DJ_OK && s) {
        if (n >= sizeof r.msg) n = sizeof r.msg - 1;
        memcpy(r.msg, s, n);
    }
    r.payload_len = h.payload_len;
    r.payload = malloc(h.payload_len + 1);
    memcpy(r.payload, body + h.meta_len, h.payload_len);
    free(body);
    return r;
}

static void reply_free(reply *r) {
    if (r->type >= 0) dj__meta_destroy(&r->meta);
    free(r->payload);
}

static void pack_hash(dj__mw *w, const char *key, const dj_whash *h) {
    dj__mw_key(w, key);
    msgpack_pack_bin(&w->pk, DJ_WHASH_BYTES);
    msgpack_pack_bin_body(&w->pk, h->b, DJ_WHASH_BYTES);
}

/* A request answered by one frame: its type (REPLY or ERROR) and fields. */
static reply call(int fd, uint16_t type, dj__mw *w, const void *payload, uint64_t plen) {
    static uint64_t req = 100;
    send_frame(fd, type, ++req, w, payload, plen);
    return recv_reply(fd);
}

#define CHECK_ERR(r, want)                                                                                        \
    CHECK_MSG((r).type == DJ_MSG_ERROR && (r).st == (want), "type 0x%x status %lld (%s), want error %d", (r).type, \
              (long long)(r).st, (r).msg, (int)(want))

/* ---- graphs (the msgpack form of docs/protocol.md) ---- */

typedef dj_test_wb wb; /* testutil.h */
static void w_spec(wb *w, int64_t a, int64_t b) {
    dj_test_w_map(w, 2), dj_test_w_str(w, "shape"), dj_test_w_arr(w, 2), dj_test_w_int(w, a), dj_test_w_int(w, b),
        dj_test_w_str(w, "dtype"), dj_test_w_str(w, "f32");
}
static void w_ref(wb *w, const char *k, int64_t i) { dj_test_w_map(w, 1), dj_test_w_str(w, k), dj_test_w_int(w, i); }

/* out = relu(x * wt) (mul broadcasting wt [1, 3] over x [2, 3]); op replaces aten.relu.default when given. */
static void graph_mul_relu(wb *w, const dj_whash *wt, const char *op) {
    w->n = 0;
    dj_test_w_map(w, 5), dj_test_w_str(w, "v"), dj_test_w_int(w, 1);
    dj_test_w_str(w, "inputs"), dj_test_w_arr(w, 1), w_spec(w, 2, 3);
    dj_test_w_str(w, "weights"), dj_test_w_arr(w, 1);
    dj_test_w_map(w, 4), dj_test_w_str(w, "name"), dj_test_w_str(w, "scale"), dj_test_w_str(w, "hash"),
        dj_test_w_bin(w, wt->b, DJ_WHASH_BYTES);
    dj_test_w_str(w, "shape"), dj_test_w_arr(w, 2), dj_test_w_int(w, 1), dj_test_w_int(w, 3), dj_test_w_str(w, "dtype"),
        dj_test_w_str(w, "f32");
    dj_test_w_str(w, "nodes"), dj_test_w_arr(w, 2);
    dj_test_w_map(w, 3), dj_test_w_str(w, "op"), dj_test_w_str(w, "aten.mul.Tensor"), dj_test_w_str(w, "args"),
        dj_test_w_arr(w, 2), w_ref(w, "i", 0), w_ref(w, "w", 0), dj_test_w_str(w, "out"), dj_test_w_arr(w, 1),
        w_spec(w, 2, 3);
    dj_test_w_map(w, 3), dj_test_w_str(w, "op"), dj_test_w_str(w, op ? op : "aten.relu.default"),
        dj_test_w_str(w, "args"), dj_test_w_arr(w, 1);
    dj_test_w_map(w, 1), dj_test_w_str(w, "n"), dj_test_w_arr(w, 2), dj_test_w_int(w, 0), dj_test_w_int(w, 0);
    dj_test_w_str(w, "out"), dj_test_w_arr(w, 1), w_spec(w, 2, 3);
    dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 1), dj_test_w_map(w, 1), dj_test_w_str(w, "n"), dj_test_w_arr(w, 2),
        dj_test_w_int(w, 1), dj_test_w_int(w, 0);
}

/* GRAPH_RUN of g with x in the payload (x NULL: input 0 is handle hin), in class qos (NULL: none sent). */
static reply run_graph_qos(int fd, const wb *g, const float *x, uint64_t hin, const char *qos) {
    uint8_t payload[4096 + 64];
    memcpy(payload, g->b, g->n);
    size_t n = g->n;
    if (x) {
        memcpy(payload + n, x, 6 * sizeof(float));
        n += 6 * sizeof(float);
    }
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "graph_bytes", g->n);
    if (qos) dj__mw_str(&w, "qos", qos);
    dj__mw_key(&w, "inputs");
    msgpack_pack_array(&w.pk, 1);
    if (x) msgpack_pack_nil(&w.pk);
    else msgpack_pack_uint64(&w.pk, hin);
    return call(fd, DJ_MSG_GRAPH_RUN, &w, payload, n);
}
static reply run_graph(int fd, const wb *g, const float *x, uint64_t hin) { return run_graph_qos(fd, g, x, hin, NULL); }

/* GRAPH_RUN naming the graph by id only (no graph bytes), x in the payload. */
static reply run_graph_id(int fd, const uint8_t id[16], const float *x) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "graph_bytes", 0);
    dj__mw_key(&w, "graph_id");
    msgpack_pack_bin(&w.pk, 16);
    msgpack_pack_bin_body(&w.pk, id, 16);
    dj__mw_key(&w, "inputs");
    msgpack_pack_array(&w.pk, 1);
    msgpack_pack_nil(&w.pk);
    return call(fd, DJ_MSG_GRAPH_RUN, &w, x, 6 * sizeof(float));
}

static bool reply_bool(const reply *r, const char *key) {
    const msgpack_object *o = dj__meta_get(&r->meta, key);
    return o && o->type == MSGPACK_OBJECT_BOOLEAN && o->via.boolean;
}

static uint64_t output_handle(const reply *r, uint32_t *rank) {
    const msgpack_object *o = dj__meta_get(&r->meta, "outputs");
    uint64_t h = 0;
    *rank = 0;
    if (!o || o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 1) return 0;
    const msgpack_object *out = &o->via.array.ptr[0];
    dj__obj_u64(dj__obj_get(out, "handle"), &h);
    const msgpack_object *sh = dj__obj_get(out, "shape");
    if (sh && sh->type == MSGPACK_OBJECT_ARRAY) *rank = sh->via.array.size;
    return h;
}

static bool fetch(int fd, uint64_t handle, float *out, size_t n) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "handle", handle);
    reply r = call(fd, DJ_MSG_FETCH, &w, NULL, 0);
    const bool ok = r.type == DJ_MSG_REPLY && r.payload_len == n * sizeof(float);
    if (ok) memcpy(out, r.payload, n * sizeof(float));
    reply_free(&r);
    return ok;
}

static uint64_t stats_u64(int fd, const char *outer, const char *key) {
    dj__mw w;
    dj__mw_init(&w);
    reply r = call(fd, DJ_MSG_STATS, &w, NULL, 0);
    uint64_t v = UINT64_MAX;
    const msgpack_object *o = outer ? dj__meta_get(&r.meta, outer) : NULL;
    if (outer && o) dj__obj_u64(dj__obj_get(o, key), &v);
    else if (!outer) dj__meta_u64(&r.meta, key, false, &v);
    reply_free(&r);
    return v;
}

static reply upload(int fd, const dj_whash *h, uint64_t total, uint64_t off, const void *p, uint64_t n) {
    dj__mw w;
    dj__mw_init(&w);
    pack_hash(&w, "hash", h);
    dj__mw_u64(&w, "total", total);
    dj__mw_u64(&w, "offset", off);
    return call(fd, DJ_MSG_WEIGHT_UPLOAD, &w, p, n);
}

static int has_state(int fd, const dj_whash *h) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_key(&w, "hashes");
    msgpack_pack_array(&w.pk, 1);
    msgpack_pack_bin(&w.pk, DJ_WHASH_BYTES);
    msgpack_pack_bin_body(&w.pk, h->b, DJ_WHASH_BYTES);
    reply r = call(fd, DJ_MSG_WEIGHT_HAS, &w, NULL, 0);
    const msgpack_object *o = r.type == DJ_MSG_REPLY ? dj__meta_get(&r.meta, "state") : NULL;
    uint64_t v = 99;
    if (o && o->type == MSGPACK_OBJECT_ARRAY && o->via.array.size == 1) dj__obj_u64(&o->via.array.ptr[0], &v);
    reply_free(&r);
    return (int)v;
}

static void test_daemon(void) {
    const char *extra[] = {"--weight-quota-gb", "1m", "--allow-empty", "--local-admin", NULL}; /* STATS: the weight store counts */
    char addr[128];
    int code = 0;
    const dj_test_daemon_opts o = {.djinnd = djinnd, .dir = tmpdir, .models = tmpdir, .listen = "127.0.0.1:0",
                                   .save_stderr = true, .wait_ms = 30000};
    CHECK(dj_test_daemon_start(0, &o, extra, addr, sizeof addr, &code) > 0);
    dj_test_frame hello;
    int a = dj_test_raw_hello(addr, 30, NULL, &hello), b = dj_test_raw_hello(addr, 30, NULL, &hello);
    CHECK(a >= 0 && b >= 0 && hello.type == DJ_MSG_REPLY);

    const float scale[3] = {2.0f, -1.0f, 0.5f}, x[6] = {1, 2, 3, -4, -5, 6};
    dj_whash hw;
    dj_whash_of(scale, sizeof scale, &hw);
    CHECK(has_state(a, &hw) == DJ_WHAS_ABSENT);
    wb g;
    graph_mul_relu(&g, &hw, NULL);
    /* a graph naming a weight the server lacks is refused, naming it */
    reply r = run_graph(a, &g, x, 0);
    CHECK_ERR(r, DJ_ENOTFOUND);
    CHECK(strstr(r.msg, "scale") != NULL);
    reply_free(&r);
    /* upload in two chunks; a chunk in the wrong place drops the upload */
    r = upload(a, &hw, sizeof scale, 0, scale, 4);
    CHECK(r.type == DJ_MSG_REPLY);
    reply_free(&r);
    r = upload(a, &hw, sizeof scale, 8, (const uint8_t *)scale + 8, 4);
    CHECK_ERR(r, DJ_EINVAL);
    reply_free(&r);
    r = upload(a, &hw, sizeof scale, 0, scale, 4);
    reply_free(&r);
    r = upload(a, &hw, sizeof scale, 4, (const uint8_t *)scale + 4, 8);
    bool done = false;
    CHECK(r.type == DJ_MSG_REPLY && dj__meta_bool(&r.meta, "done", true, &done) == DJ_OK && done);
    reply_free(&r);
    CHECK(has_state(a, &hw) == DJ_WHAS_USABLE && has_state(b, &hw) == DJ_WHAS_HELD);
    CHECK(stats_u64(a, "weights", "count") == 1 && stats_u64(a, "weights", "bytes") == sizeof scale);

    /* the run: relu(x * scale), read back with FETCH */
    r = run_graph(a, &g, x, 0);
    uint32_t rank = 0;
    const uint64_t h1 = r.type == DJ_MSG_REPLY ? output_handle(&r, &rank) : 0;
    CHECK_MSG(h1 && rank == 2, "type 0x%x %s", r.type, r.msg);
    reply_free(&r);
    float y[6], want[6];
    for (int i = 0; i < 6; i++) want[i] = x[i] * scale[i % 3] > 0 ? x[i] * scale[i % 3] : 0;
    CHECK(fetch(a, h1, y, 6) && !memcmp(y, want, sizeof y));
    /* a handle as the next run's input: relu(relu(x * scale) * scale) */
    r = run_graph(a, &g, NULL, h1);
    const uint64_t h2 = r.type == DJ_MSG_REPLY ? output_handle(&r, &rank) : 0;
    CHECK_MSG(h2, "type 0x%x %s", r.type, r.msg);
    reply_free(&r);
    for (int i = 0; i < 6; i++) want[i] = want[i] * scale[i % 3] > 0 ? want[i] * scale[i % 3] : 0;
    CHECK(fetch(a, h2, y, 6) && !memcmp(y, want, sizeof y));
    CHECK(stats_u64(a, NULL, "graph_runs") == 2);
    /* the caller's class: the scheduler admits it in that line; an unknown class is refused */
    r = run_graph_qos(a, &g, x, 0, "batch");
    CHECK_MSG(r.type == DJ_MSG_REPLY, "%s", r.msg);
    reply_free(&r);
    r = run_graph_qos(a, &g, x, 0, "urgent");
    CHECK(r.type == DJ_MSG_ERROR);
    reply_free(&r);
    CHECK(stats_u64(a, NULL, "graph_runs") == 3);

    /* connection b: knowing the hash is not access */
    r = run_graph(b, &g, x, 0);
    CHECK_ERR(r, DJ_ENOTFOUND);
    CHECK(strstr(r.msg, "not proven") != NULL);
    reply_free(&r);
    r = run_graph(b, &g, NULL, h1); /* nor is another connection's handle */
    CHECK(r.type == DJ_MSG_ERROR);
    reply_free(&r);
    /* a wrong answer to a challenge is refused; the right one proves it */
    dj__mw w;
    dj__mw_init(&w);
    pack_hash(&w, "hash", &hw);
    r = call(b, DJ_MSG_WEIGHT_CHALLENGE, &w, NULL, 0);
    dj_wchallenge ch = {0};
    const msgpack_object *ro = r.type == DJ_MSG_REPLY ? dj__meta_get(&r.meta, "ranges") : NULL;
    CHECK(ro && ro->type == MSGPACK_OBJECT_ARRAY && ro->via.array.size >= 1 &&
          ro->via.array.size <= DJ_WCHALLENGE_RANGES && dj__meta_u64(&r.meta, "seed", true, &ch.seed) == DJ_OK);
    ch.n = ro ? ro->via.array.size : 0;
    for (uint32_t i = 0; i < ch.n; i++) {
        const msgpack_object *p = &ro->via.array.ptr[i];
        CHECK(p->type == MSGPACK_OBJECT_ARRAY && p->via.array.size == 2 &&
              dj__obj_u64(&p->via.array.ptr[0], &ch.offset[i]) && dj__obj_u64(&p->via.array.ptr[1], &ch.length[i]) &&
              ch.offset[i] + ch.length[i] <= sizeof scale);
    }
    reply_free(&r);
    dj__mw_init(&w);
    pack_hash(&w, "hash", &hw);
    pack_hash(&w, "answer", &hw); /* the hash is not an answer */
    r = call(b, DJ_MSG_WEIGHT_PROVE, &w, NULL, 0);
    CHECK_ERR(r, DJ_EINVAL);
    CHECK(strstr(r.msg, "wrong answer") != NULL);
    reply_free(&r);
    CHECK(has_state(b, &hw) == DJ_WHAS_HELD);
    dj__mw_init(&w);
    pack_hash(&w, "hash", &hw);
    r = call(b, DJ_MSG_WEIGHT_CHALLENGE, &w, NULL, 0);
    ro = r.type == DJ_MSG_REPLY ? dj__meta_get(&r.meta, "ranges") : NULL;
    ch.n = ro && ro->type == MSGPACK_OBJECT_ARRAY && ro->via.array.size <= DJ_WCHALLENGE_RANGES ? ro->via.array.size : 0;
    dj__meta_u64(&r.meta, "seed", true, &ch.seed);
    for (uint32_t i = 0; i < ch.n; i++) {
        dj__obj_u64(&ro->via.array.ptr[i].via.array.ptr[0], &ch.offset[i]);
        dj__obj_u64(&ro->via.array.ptr[i].via.array.ptr[1], &ch.length[i]);
        if (ch.offset[i] + ch.length[i] > sizeof scale) ch.n = 0;
    }
    reply_free(&r);
    dj_whash ans;
    dj_wchallenge_answer(&ch, scale, &ans);
    dj__mw_init(&w);
    pack_hash(&w, "hash", &hw);
    pack_hash(&w, "answer", &ans);
    r = call(b, DJ_MSG_WEIGHT_PROVE, &w, NULL, 0);
    CHECK_MSG(r.type == DJ_MSG_REPLY, "%s", r.msg);
    reply_free(&r);
    r = run_graph(b, &g, x, 0);
    CHECK_MSG(r.type == DJ_MSG_REPLY, "%s", r.msg);
    /* the plan cache: a ran these bytes before, so b's run found the plan decoded; the reply names
     * the graph's id (the XXH3-128 of its bytes), and b may now run it by id alone */
    CHECK(reply_bool(&r, "plan_cached"));
    uint8_t gid[16] = {0};
    {
        const msgpack_object *o = dj__meta_get(&r.meta, "graph_id");
        CHECK(o && o->type == MSGPACK_OBJECT_BIN && o->via.bin.size == 16);
        if (o && o->type == MSGPACK_OBJECT_BIN && o->via.bin.size == 16) memcpy(gid, o->via.bin.ptr, 16);
        dj_whash gh;
        dj_whash_of(g.b, g.n, &gh);
        CHECK(!memcmp(gid, gh.b, 16));
    }
    reply_free(&r);
    {
        const uint64_t hits = stats_u64(b, "graph_plans", "hits");
        r = run_graph_id(b, gid, x);
        CHECK_MSG(r.type == DJ_MSG_REPLY, "%s", r.msg);
        CHECK(reply_bool(&r, "plan_cached"));
        uint32_t rank = 0;
        const uint64_t ho = output_handle(&r, &rank);
        float y[6] = {0};
        CHECK(rank == 2 && fetch(b, ho, y, 6));
        for (int i = 0; i < 6; i++) {
            const float v = x[i] * scale[i % 3];
            CHECK(y[i] == (v > 0 ? v : 0));
        }
        reply_free(&r);
        CHECK(stats_u64(b, "graph_plans", "hits") == hits + 1);
        /* a connection that never sent the bytes cannot name them; an id that is not the bytes' hash is
         * refused; neither graph bytes nor an id is malformed */
        int e = dj_test_raw_hello(addr, 30, NULL, &hello);
        r = run_graph_id(e, gid, x);
        CHECK_ERR(r, DJ_ENOTFOUND);
        CHECK(strstr(r.msg, "send the graph's bytes") != NULL);
        reply_free(&r);
        close(e);
        uint8_t p[4096 + 64];
        memcpy(p, g.b, g.n);
        memcpy(p + g.n, x, sizeof x);
        dj__mw_init(&w);
        dj__mw_u64(&w, "graph_bytes", g.n);
        dj__mw_key(&w, "graph_id");
        msgpack_pack_bin(&w.pk, 16);
        msgpack_pack_bin_body(&w.pk, "0123456789abcdef", 16);
        dj__mw_key(&w, "inputs");
        msgpack_pack_array(&w.pk, 1);
        msgpack_pack_nil(&w.pk);
        r = call(b, DJ_MSG_GRAPH_RUN, &w, p, g.n + sizeof x);
        CHECK_ERR(r, DJ_EINVAL);
        CHECK(strstr(r.msg, "graph_id") != NULL);
        reply_free(&r);
        e = dj_test_raw_hello(addr, 30, NULL, &hello);
        dj__mw_init(&w);
        dj__mw_u64(&w, "graph_bytes", 0);
        r = call(e, DJ_MSG_GRAPH_RUN, &w, x, sizeof x);
        CHECK_ERR(r, DJ_EFORMAT);
        reply_free(&r);
        close(e);
    }
    CHECK(stats_u64(b, "weights", "count") == 1 && stats_u64(b, "weights", "challenges_passed") == 1 &&
          stats_u64(b, "weights", "challenges_failed") == 1);

    /* an op the server lacks is refused naming it (the connection stays) */
    graph_mul_relu(&g, &hw, "aten.roll.default");
    r = run_graph(a, &g, x, 0);
    CHECK_ERR(r, DJ_EUNSUPPORTED);
    CHECK(strstr(r.msg, "aten.roll.default") != NULL);
    reply_free(&r);
    /* bytes that hash to another name are refused */
    float other[3] = {1, 2, 3};
    r = upload(a, &hw, sizeof other, 0, other, sizeof other);
    CHECK_ERR(r, DJ_EINVAL);
    CHECK(strstr(r.msg, "hash to") != NULL);
    reply_free(&r);
    /* over the token's quota (1 MiB here): 700 KiB fit, 700 KiB more do not while the first is in use;
     * one weight over the quota is refused as too large */
    static uint8_t big[2][700 << 10];
    big[1][0] = 1;
    dj_whash hb[2];
    for (int i = 0; i < 2; i++) dj_whash_of(big[i], sizeof big[i], &hb[i]);
    r = upload(a, &hb[0], sizeof big[0], 0, big[0], sizeof big[0]);
    CHECK_MSG(r.type == DJ_MSG_REPLY, "%s", r.msg);
    reply_free(&r);
    r = upload(a, &hb[1], sizeof big[1], 0, big[1], 1024);
    CHECK_ERR(r, DJ_EQUOTA);
    CHECK(strstr(r.msg, "quota") != NULL);
    reply_free(&r);
    r = upload(a, &hb[1], (1 << 20) + 1, 0, big[1], 1024);
    CHECK_ERR(r, DJ_ERANGE);
    reply_free(&r);
    /* a payload past its input bytes; the wrong count of inputs */
    graph_mul_relu(&g, &hw, NULL);
    {
        uint8_t p[4096 + 64];
        memcpy(p, g.b, g.n);
        memcpy(p + g.n, x, sizeof x);
        dj__mw_init(&w);
        dj__mw_u64(&w, "graph_bytes", g.n);
        dj__mw_key(&w, "inputs");
        msgpack_pack_array(&w.pk, 1);
        msgpack_pack_nil(&w.pk);
        r = call(a, DJ_MSG_GRAPH_RUN, &w, p, g.n + sizeof x - 4);
        CHECK_ERR(r, DJ_EINVAL);
        reply_free(&r);
        dj__mw_init(&w);
        dj__mw_u64(&w, "graph_bytes", g.n);
        r = call(a, DJ_MSG_GRAPH_RUN, &w, p, g.n + sizeof x);
        CHECK_ERR(r, DJ_EINVAL);
        reply_free(&r);
    }
    /* hostile frames close the connection with a typed error: a chunk over 16 MiB (refused before it is
     * read), graph_bytes past the payload, a malformed graph, a hash of the wrong length */
    int c = dj_test_raw_hello(addr, 30, NULL, &hello);
    dj__mw_init(&w);
    pack_hash(&w, "hash", &hw);
    dj__mw_u64(&w, "total", 1 << 30);
    dj__mw_u64(&w, "offset", 0);
    {
        uint8_t m[256];
        const size_t n = dj_test_meta_of(&w, m);
        dj_test_raw_send(c, DJ_MSG_WEIGHT_UPLOAD, 1, m, n, (17u << 20));
    }
    r = recv_reply(c);
    CHECK_ERR(r, DJ_ERANGE);
    reply_free(&r);
    r = recv_reply(c);
    CHECK(r.type == -1); /* closed */
    close(c);
    c = dj_test_raw_hello(addr, 30, NULL, &hello);
    dj__mw_init(&w);
    dj__mw_u64(&w, "graph_bytes", 100);
    r = call(c, DJ_MSG_GRAPH_RUN, &w, "abcd", 4);
    CHECK_ERR(r, DJ_EFORMAT);
    reply_free(&r);
    close(c);
    c = dj_test_raw_hello(addr, 30, NULL, &hello);
    dj__mw_init(&w);
    dj__mw_u64(&w, "graph_bytes", 4);
    r = call(c, DJ_MSG_GRAPH_RUN, &w, "\x81\xa1v\x07", 4);
    CHECK_ERR(r, DJ_EFORMAT);
    reply_free(&r);
    close(c);
    c = dj_test_raw_hello(addr, 30, NULL, &hello);
    dj__mw_init(&w);
    dj__mw_key(&w, "hashes");
    msgpack_pack_array(&w.pk, 1);
    msgpack_pack_bin(&w.pk, 8);
    msgpack_pack_bin_body(&w.pk, "12345678", 8);
    r = call(c, DJ_MSG_WEIGHT_HAS, &w, NULL, 0);
    CHECK_ERR(r, DJ_EFORMAT);
    reply_free(&r);
    close(c);

    /* a closed connection's proofs and graph outputs go; the weight stays cached */
    close(a);
    close(b);
    int d = dj_test_raw_hello(addr, 30, NULL, &hello);
    for (int i = 0; i < 100 && stats_u64(d, NULL, "handles") != 0; i++) dj_test_sleep_ms(20);
    CHECK(stats_u64(d, NULL, "handles") == 0);
    CHECK(stats_u64(d, "weights", "referenced") == 0 && stats_u64(d, "weights", "count") == 2);
    CHECK(has_state(d, &hw) == DJ_WHAS_HELD);
    close(d);
    CHECK(dj_test_daemon_stop(0, 30000) == 0);
}

/* --graph-quota-gb: a plan larger than what one token's captured runs may hold is refused naming
 * its bytes and the bound; the same graph runs under a bound it fits. */
static void test_graph_budget(void) {
    for (int fits = 0; fits < 2; fits++) {
        /* --graph-device engine on the CPU engine: the CPU executor still (the engine's device is the host) */
        const char *extra[] = {"--graph-quota-gb", fits ? "4k" : "100b", "--graph-gb", "1m", "--allow-empty",
                               "--graph-device", fits ? "engine" : "cpu", NULL};
        char addr[128];
        int code = 0;
        const dj_test_daemon_opts o = {.djinnd = djinnd, .dir = tmpdir, .models = tmpdir, .listen = "127.0.0.1:0",
                                       .save_stderr = true, .wait_ms = 30000};
        CHECK(dj_test_daemon_start(0, &o, extra, addr, sizeof addr, &code) > 0);
        dj_test_frame hello;
        const int a = dj_test_raw_hello(addr, 30, NULL, &hello);
        CHECK(a >= 0);
        const float scale[3] = {2.0f, -1.0f, 0.5f}, x[6] = {1, 2, 3, -4, -5, 6};
        dj_whash hw;
        dj_whash_of(scale, sizeof scale, &hw);
        reply r = upload(a, &hw, sizeof scale, 0, scale, sizeof scale);
        CHECK(r.type == DJ_MSG_REPLY);
        reply_free(&r);
        wb g;
        graph_mul_relu(&g, &hw, NULL);
        r = run_graph(a, &g, x, 0);
        if (fits) {
            CHECK_MSG(r.type == DJ_MSG_REPLY, "%s", r.msg);
        } else {
            CHECK_ERR(r, DJ_ENOSPC);
            CHECK_MSG(strstr(r.msg, "plan needs") && strstr(r.msg, "bytes") && strstr(r.msg, "100 bytes") &&
                          strstr(r.msg, "--graph-quota-gb"),
                      "%s", r.msg);
        }
        reply_free(&r);
        close(a);
        CHECK(dj_test_daemon_stop(0, 30000) == 0);
    }
}

int main(void) {
    dj_test_daemon_guard();
    signal(SIGPIPE, SIG_IGN);
    if (!mkdtemp(tmpdir)) return 1;
    alarm(300);
    test_daemon();
    test_graph_budget();
    alarm(0);
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_server_graph");
}
