/* server.c: djinnd's I/O thread - the libuv loop that accepts connections,
 * frames requests, answers the cheap ones and queues the rest for the engine
 * worker, writes replies with scatter-gather writes, and shuts down cleanly. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server/server_impl.h"
#include "server/serve.h"

#define READ_CHUNK (64 * 1024)

typedef struct dj__conn {
    union {
        uv_tcp_t tcp;
        uv_pipe_t pipe;
        uv_stream_t stream;
        uv_handle_t handle;
    } u;
    dj__server *srv;
    uint64_t id;
    bool hello, closing;
    uint8_t hdr[DJ_FRAME_HEADER_BYTES];
    size_t hdr_got;
    dj_frame_header h;
    uint8_t *body;         /* [meta_len + payload_len] as it arrives */
    uint64_t body_len, body_cap, body_got;
    char rbuf[READ_CHUNK];
    int writes;            /* in flight */
} dj__conn;

typedef struct wreq {
    uv_write_t w;
    dj__conn *c;
    uint8_t hdr[DJ_FRAME_HEADER_BYTES];
    char *meta;            /* owned */
    dj__handle *handle;    /* payload source (one reference), or NULL */
} wreq;

/* ---- small utilities ---- */

double dj__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t dj__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

dj_status dj__map_init(dj__map *m, size_t n_buckets) {
    m->b = calloc(n_buckets, sizeof *m->b);
    m->n_buckets = n_buckets;
    m->n = 0;
    return m->b ? DJ_OK : dj_fail(DJ_ENOMEM, "out of memory");
}

void dj__map_destroy(dj__map *m) {
    if (!m->b) return;
    for (size_t i = 0; i < m->n_buckets; i++)
        for (dj__ment *e = m->b[i], *n; e; e = n) {
            n = e->next;
            free(e);
        }
    free(m->b);
    m->b = NULL;
}

static size_t bucket(const dj__map *m, uint64_t key) {
    return (size_t)((key ^ (key >> 29)) * 0x9e3779b97f4a7c15ull >> 32) % m->n_buckets;
}

void *dj__map_get(const dj__map *m, uint64_t key) {
    for (dj__ment *e = m->b[bucket(m, key)]; e; e = e->next)
        if (e->key == key) return e->val;
    return NULL;
}

dj_status dj__map_put(dj__map *m, uint64_t key, void *val) {
    dj__ment *e = malloc(sizeof *e);
    if (!e) return dj_fail(DJ_ENOMEM, "out of memory");
    size_t b = bucket(m, key);
    e->key = key;
    e->val = val;
    e->next = m->b[b];
    m->b[b] = e;
    m->n++;
    return DJ_OK;
}

void *dj__map_del(dj__map *m, uint64_t key) {
    for (dj__ment **p = &m->b[bucket(m, key)]; *p; p = &(*p)->next)
        if ((*p)->key == key) {
            dj__ment *e = *p;
            void *v = e->val;
            *p = e->next;
            free(e);
            m->n--;
            return v;
        }
    return NULL;
}

dj__out *dj__out_meta(uint64_t conn, uint16_t type, uint64_t req, dj__mw *w) {
    dj__out *o = calloc(1, sizeof *o);
    if (!o) {
        dj__mw_destroy(w);
        return NULL;
    }
    dj__mw_finish(w);
    o->conn = conn;
    o->h.magic = DJ_PROTO_MAGIC;
    o->h.version = DJ_PROTO_VERSION;
    o->h.type = type;
    o->h.request_id = req;
    o->h.meta_len = (uint32_t)w->sb.size;
    o->meta = msgpack_sbuffer_release(&w->sb);
    dj__mw_destroy(w);
    return o;
}

dj__out *dj__out_error(uint64_t conn, uint64_t req, dj_status st, const char *msg, bool close_after) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_i64(&w, "status", st);
    dj__mw_str(&w, "name", dj_status_name(st));
    dj__mw_str(&w, "message", msg && msg[0] ? msg : dj_strerror(st));
    dj__out *o = dj__out_meta(conn, DJ_MSG_ERROR, req, &w);
    if (o) o->close_after = close_after;
    return o;
}

/* ---- writing ---- */

static void conn_close(dj__conn *c);

static void on_write(uv_write_t *w, int status) {
    wreq *r = (wreq *)w;
    dj__conn *c = r->c;
    dj__server *s = c->srv;
    free(r->meta);
    if (r->handle) {
        pthread_mutex_lock(&s->mu);
        dj__handle_unref(s, r->handle);
        pthread_mutex_unlock(&s->mu);
    }
    free(r);
    c->writes--;
    if (status < 0 && !c->closing) {
        DJ_LOG(INFO, "conn=%llu write failed: %s", (unsigned long long)c->id, uv_strerror(status));
        conn_close(c);
    } else if (c->closing && c->writes == 0 && !uv_is_closing(&c->u.handle)) {
        conn_close(c);
    }
}

/* Send header + meta (owned, freed after the write) + optional payload taken
 * from a handle (one reference held until the write completes). */
static void conn_send(dj__conn *c, const dj_frame_header *h, char *meta, dj__handle *hd, const uint8_t *payload) {
    if (uv_is_closing(&c->u.handle)) {
        free(meta);
        if (hd) {
            pthread_mutex_lock(&c->srv->mu);
            dj__handle_unref(c->srv, hd);
            pthread_mutex_unlock(&c->srv->mu);
        }
        return;
    }
    wreq *r = calloc(1, sizeof *r);
    if (!r) {
        free(meta);
        conn_close(c);
        return;
    }
    r->c = c;
    r->meta = meta;
    r->handle = hd;
    dj_frame_header_encode(h, r->hdr);
    uv_buf_t bufs[3];
    unsigned n = 0;
    bufs[n++] = uv_buf_init((char *)r->hdr, DJ_FRAME_HEADER_BYTES);
    if (h->meta_len) bufs[n++] = uv_buf_init(meta, h->meta_len);
    if (h->payload_len) bufs[n++] = uv_buf_init((char *)payload, (unsigned)h->payload_len);
    c->writes++;
    int rc = uv_write(&r->w, &c->u.stream, bufs, n, on_write);
    if (rc < 0) {
        c->writes--;
        free(meta);
        if (hd) {
            pthread_mutex_lock(&c->srv->mu);
            dj__handle_unref(c->srv, hd);
            pthread_mutex_unlock(&c->srv->mu);
        }
        free(r);
        conn_close(c);
    }
}

static void send_out(dj__conn *c, dj__out *o) {
    conn_send(c, &o->h, o->meta, NULL, NULL);
    o->meta = NULL;
    if (o->close_after) {
        c->closing = true;
        uv_read_stop(&c->u.stream);
        if (c->writes == 0) conn_close(c);
    }
    free(o);
}

static void send_error(dj__conn *c, uint64_t req, uint16_t type, dj_status st, bool close_after) {
    dj__metrics_count(&c->srv->metrics, type, st);
    DJ_LOG(INFO, "conn=%llu req=%llu type=%s error=%s: %s%s", (unsigned long long)c->id, (unsigned long long)req,
           dj_msg_type_name(type), dj_status_name(st), dj_last_error(), close_after ? " (closing)" : "");
    dj__out *o = dj__out_error(c->id, req, st, dj_last_error(), close_after);
    if (!o) {
        conn_close(c);
        return;
    }
    send_out(c, o);
}

static void send_reply(dj__conn *c, uint16_t type, uint64_t req, dj__mw *w) {
    dj__metrics_count(&c->srv->metrics, type, DJ_OK);
    dj__out *o = dj__out_meta(c->id, DJ_MSG_REPLY, req, w);
    if (!o) {
        conn_close(c);
        return;
    }
    send_out(c, o);
}

/* ---- connection lifetime ---- */

static void on_closed(uv_handle_t *h) {
    dj__conn *c = h->data;
    dj__server *s = c->srv;
    dj__map_del(&s->conns, c->id);
    pthread_mutex_lock(&s->mu);
    dj__map_del(&s->live_conns, c->id);
    /* Every session of this connection dies; the worker reaps them. */
    for (size_t b = 0; b < s->sessions.n_buckets; b++)
        for (dj__ment *e = s->sessions.b[b]; e; e = e->next) {
            dj__sess *ss = e->val;
            if (ss->conn == c->id && !ss->dead) {
                ss->dead = true;
                s->reap = true;
            }
        }
    if (s->metrics.connections) s->metrics.connections--;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    DJ_LOG(INFO, "conn=%llu closed", (unsigned long long)c->id);
    free(c->body);
    free(c);
}

static void conn_close(dj__conn *c) {
    c->closing = true;
    if (!uv_is_closing(&c->u.handle)) uv_close(&c->u.handle, on_closed);
}

/* ---- inline requests (never touch the engine) ---- */

static bool constant_time_eq(const char *a, size_t an, const char *b, size_t bn) {
    unsigned char d = (unsigned char)(an != bn);
    size_t n = an < bn ? an : bn;
    for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

static dj_status do_hello(dj__conn *c, const dj__meta *m, dj__mw *w) {
    dj__server *s = c->srv;
    uint32_t ver = DJ_PROTO_VERSION;
    dj_status st = dj__meta_u32(m, "version", false, &ver);
    if (st != DJ_OK) return st;
    const char *tok = NULL;
    size_t tn = 0;
    if ((st = dj__meta_str(m, "token", false, &tok, &tn)) != DJ_OK) return st;
    if (ver != DJ_PROTO_VERSION)
        return dj_fail(DJ_EUNSUPPORTED, "client speaks protocol %u, server %u", ver, DJ_PROTO_VERSION);
    if (s->have_token && (!tok || !constant_time_eq(tok, tn, s->token, strlen(s->token))))
        return dj_fail(DJ_EINVAL, "HELLO: missing or wrong token");
    c->hello = true;
    dj__mw_u64(w, "version", DJ_PROTO_VERSION);
    dj__mw_str(w, "server", "djinnd 0.1");
    dj__mw_u64(w, "lease_ms", s->cfg.lease_ms);
    dj__mw_u64(w, "max_meta", DJ_PROTO_MAX_META);
    dj__mw_u64(w, "max_payload", DJ_PROTO_MAX_REQ_PAYLOAD);
    dj__mw_u64(w, "conn", c->id);
    static const char *caps[] = {"generate", "step", "fetch", "handles", "pause-state", "stats", "qos", "models"};
    dj__mw_key(w, "capabilities");
    msgpack_pack_array(&w->pk, sizeof caps / sizeof *caps);
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) dj__pack_str(&w->pk, caps[i]);
    return DJ_OK;
}

/* Session lookup for this connection; mu held. *foreign is set when the id
 * exists but belongs to another connection. */
static dj__sess *own_session(dj__server *s, uint64_t conn, uint64_t id, bool *foreign) {
    dj__sess *ss = dj__map_get(&s->sessions, id);
    *foreign = false;
    if (ss && ss->conn != conn) {
        *foreign = true;
        return NULL;
    }
    return ss && !ss->dead ? ss : NULL;
}

/* HEARTBEAT, PAUSE, RESUME, RELEASE: mu taken here. close_conn set for
 * requests naming another connection's objects. */
static dj_status do_inline(dj__conn *c, uint16_t type, const dj__meta *m, dj__mw *w, bool *close_conn) {
    dj__server *s = c->srv;
    uint64_t sid = 0, hid = 0, expect = 0;
    dj_status st = DJ_OK;
    if (type == DJ_MSG_RELEASE) st = dj__meta_u64(m, "handle", true, &hid);
    else if (type != DJ_MSG_HEARTBEAT) st = dj__meta_u64(m, "session", true, &sid);
    else st = dj__meta_u64(m, "session", false, &sid);
    if (st == DJ_OK && type == DJ_MSG_PAUSE) st = dj__meta_u64(m, "expected_ms", false, &expect);
    if (st != DJ_OK) return st;
    const uint64_t now = dj__now_ms();
    bool foreign = false;
    pthread_mutex_lock(&s->mu);
    if (type == DJ_MSG_HEARTBEAT) {
        size_t renewed = 0;
        for (size_t b = 0; b < s->sessions.n_buckets; b++)
            for (dj__ment *e = s->sessions.b[b]; e; e = e->next) {
                dj__sess *ss = e->val;
                if (ss->conn == c->id && !ss->dead && (!sid || ss->id == sid)) {
                    ss->lease_deadline_ms = now + s->cfg.lease_ms;
                    renewed++;
                }
            }
        pthread_mutex_unlock(&s->mu);
        dj__mw_u64(w, "lease_ms", s->cfg.lease_ms);
        dj__mw_u64(w, "renewed", renewed);
        return DJ_OK;
    }
    if (type == DJ_MSG_RELEASE) {
        dj__handle *h = dj__map_get(&s->handles, hid);
        if (h && h->conn != c->id) {
            foreign = true;
            h = NULL;
        }
        if (h) {
            dj__map_del(&s->handles, hid);
            dj__handle_unref(s, h);
        }
        pthread_mutex_unlock(&s->mu);
        if (!h) {
            *close_conn = foreign;
            return dj_fail(DJ_ENOTFOUND, "no handle %016llx on this connection", (unsigned long long)hid);
        }
        return DJ_OK;
    }
    dj__sess *ss = own_session(s, c->id, sid, &foreign);
    if (ss) {
        ss->lease_deadline_ms = now + s->cfg.lease_ms;
        ss->paused = type == DJ_MSG_PAUSE;
        ss->paused_expect_ms = type == DJ_MSG_PAUSE ? expect : 0;
        DJ_LOG(INFO, "session=%016llx %s%s", (unsigned long long)sid, type == DJ_MSG_PAUSE ? "paused" : "resumed",
               " (state only: KV stays resident)");
    }
    pthread_mutex_unlock(&s->mu);
    if (!ss) {
        *close_conn = foreign;
        return dj_fail(DJ_ENOTFOUND, "no session %016llx on this connection", (unsigned long long)sid);
    }
    dj__mw_bool(w, "paused", type == DJ_MSG_PAUSE);
    dj__mw_bool(w, "swapped", false);
    return DJ_OK;
}

static dj_status do_fetch(dj__conn *c, uint64_t req, const dj__meta *m, bool *close_conn) {
    dj__server *s = c->srv;
    uint64_t hid = 0, off = 0, len = UINT64_MAX, start = 0, count = UINT64_MAX;
    dj_status st = dj__meta_u64(m, "handle", true, &hid);
    if (st == DJ_OK) st = dj__meta_u64(m, "offset", false, &off);
    if (st == DJ_OK) st = dj__meta_u64(m, "length", false, &len);
    if (st == DJ_OK) st = dj__meta_u64(m, "start", false, &start);
    if (st == DJ_OK) st = dj__meta_u64(m, "count", false, &count);
    if (st != DJ_OK) return st;
    const bool by_elem = dj__meta_get(m, "start") || dj__meta_get(m, "count");
    pthread_mutex_lock(&s->mu);
    dj__handle *h = dj__map_get(&s->handles, hid);
    if (h && h->conn != c->id) {
        *close_conn = true;
        h = NULL;
    }
    if (!h) {
        pthread_mutex_unlock(&s->mu);
        return dj_fail(DJ_ENOTFOUND, "no handle %016llx on this connection", (unsigned long long)hid);
    }
    const uint64_t esz = 4; /* every handle is f32 for now */
    if (by_elem) {
        const uint64_t n_el = h->nbytes / esz;
        if (start > n_el) {
            pthread_mutex_unlock(&s->mu);
            return dj_fail(DJ_ERANGE, "start %llu past the %llu elements of the handle", (unsigned long long)start,
                           (unsigned long long)n_el);
        }
        if (count > n_el - start) count = n_el - start;
        off = start * esz;
        len = count * esz;
    } else {
        if (off > h->nbytes) {
            pthread_mutex_unlock(&s->mu);
            return dj_fail(DJ_ERANGE, "offset %llu past the %llu bytes of the handle", (unsigned long long)off,
                           (unsigned long long)h->nbytes);
        }
        if (len > h->nbytes - off) len = h->nbytes - off;
    }
    if (len > UINT32_MAX) len = UINT32_MAX & ~(uint64_t)3; /* one uv_buf_t; clients page larger fetches */
    h->refs++;
    pthread_mutex_unlock(&s->mu);
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "offset", off);
    dj__mw_u64(&w, "length", len);
    dj__mw_u64(&w, "total", h->nbytes);
    dj__mw_str(&w, "dtype", h->dtype);
    dj__out *o = dj__out_meta(c->id, DJ_MSG_REPLY, req, &w);
    if (!o) {
        pthread_mutex_lock(&s->mu);
        dj__handle_unref(s, h);
        pthread_mutex_unlock(&s->mu);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    o->h.payload_len = len;
    dj__metrics_count(&s->metrics, DJ_MSG_FETCH, DJ_OK);
    conn_send(c, &o->h, o->meta, h, h->bytes + off);
    free(o);
    return DJ_OK;
}

/* ---- one complete request frame ---- */

static void handle_frame(dj__conn *c) {
    dj__server *s = c->srv;
    const dj_frame_header *h = &c->h;
    uint8_t *body = c->body;
    c->body = NULL;
    c->body_cap = c->body_got = c->body_len = 0;
    if (!dj_msg_type_is_request(h->type)) {
        free(body);
        dj_fail(DJ_EFORMAT, "message type %s is not a request", dj_msg_type_name(h->type));
        send_error(c, h->request_id, 0, DJ_EFORMAT, true);
        return;
    }
    dj__meta m;
    dj_status st = dj__meta_parse(&m, body, h->meta_len);
    if (st != DJ_OK) {
        free(body);
        send_error(c, h->request_id, h->type, st, true);
        return;
    }
    if (!c->hello && h->type != DJ_MSG_HELLO) {
        dj__meta_destroy(&m);
        free(body);
        dj_fail(DJ_EINVAL, "the first request must be HELLO");
        send_error(c, h->request_id, h->type, DJ_EINVAL, true);
        return;
    }
    if (h->payload_len && h->type != DJ_MSG_STEP) {
        dj__meta_destroy(&m);
        free(body);
        dj_fail(DJ_EFORMAT, "%s takes no payload (got %llu bytes)", dj_msg_type_name(h->type),
                (unsigned long long)h->payload_len);
        send_error(c, h->request_id, h->type, DJ_EFORMAT, true);
        return;
    }
    bool close_conn = false;
    dj__mw w;
    switch (h->type) {
    case DJ_MSG_HELLO:
    case DJ_MSG_HEARTBEAT:
    case DJ_MSG_PAUSE:
    case DJ_MSG_RESUME:
    case DJ_MSG_RELEASE:
        dj__mw_init(&w);
        st = h->type == DJ_MSG_HELLO ? do_hello(c, &m, &w) : do_inline(c, h->type, &m, &w, &close_conn);
        dj__meta_destroy(&m);
        free(body);
        if (st == DJ_OK) {
            send_reply(c, h->type, h->request_id, &w);
        } else {
            dj__mw_destroy(&w);
            send_error(c, h->request_id, h->type, st,
                       close_conn || st == DJ_EFORMAT || (h->type == DJ_MSG_HELLO && !c->hello));
        }
        return;
    case DJ_MSG_FETCH:
        st = do_fetch(c, h->request_id, &m, &close_conn);
        dj__meta_destroy(&m);
        free(body);
        if (st != DJ_OK) send_error(c, h->request_id, h->type, st, close_conn || st == DJ_EFORMAT);
        return;
    default:
        break;
    }
    dj__job *j = calloc(1, sizeof *j);
    if (!j) {
        dj__meta_destroy(&m);
        free(body);
        send_error(c, h->request_id, h->type, dj_fail(DJ_ENOMEM, "out of memory"), true);
        return;
    }
    j->type = h->type;
    j->req = h->request_id;
    j->conn = c->id;
    j->body = body;
    j->meta = m;
    j->payload = body + h->meta_len;
    j->payload_len = h->payload_len;
    j->qos = DJ_QOS_INTERACTIVE;
    j->t_enqueue = dj__now();
    dj__enqueue(s, j);
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    dj__conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    dj__conn *c = st->data;
    (void)buf;
    if (nread < 0) {
        if (nread != UV_EOF) DJ_LOG(INFO, "conn=%llu read: %s", (unsigned long long)c->id, uv_strerror((int)nread));
        conn_close(c);
        return;
    }
    const uint8_t *p = (const uint8_t *)c->rbuf;
    size_t n = (size_t)nread;
    while (n > 0 && !c->closing) {
        if (c->hdr_got < DJ_FRAME_HEADER_BYTES) {
            size_t k = DJ_FRAME_HEADER_BYTES - c->hdr_got;
            if (k > n) k = n;
            memcpy(c->hdr + c->hdr_got, p, k);
            c->hdr_got += k;
            p += k;
            n -= k;
            if (c->hdr_got < DJ_FRAME_HEADER_BYTES) break;
            dj_status hs = dj_frame_header_decode(c->hdr, DJ_PROTO_MAX_REQ_PAYLOAD, &c->h);
            if (hs != DJ_OK) {
                send_error(c, c->h.request_id, dj_msg_type_is_request(c->h.type) ? c->h.type : 0, hs, true);
                return;
            }
            c->body_len = (uint64_t)c->h.meta_len + c->h.payload_len;
            c->body_got = 0;
            /* Grow with what arrives, not with what the header claims. */
            c->body_cap = c->body_len < READ_CHUNK ? c->body_len : READ_CHUNK;
            c->body = malloc(c->body_cap ? c->body_cap : 1);
            if (!c->body) {
                send_error(c, c->h.request_id, 0, dj_fail(DJ_ENOMEM, "out of memory"), true);
                return;
            }
        }
        uint64_t want = c->body_len - c->body_got;
        size_t k = want < n ? (size_t)want : n;
        if (c->body_got + k > c->body_cap) {
            uint64_t cap = c->body_cap * 2;
            if (cap < c->body_got + k) cap = c->body_got + k;
            if (cap > c->body_len) cap = c->body_len;
            uint8_t *nb = realloc(c->body, cap);
            if (!nb) {
                send_error(c, c->h.request_id, 0, dj_fail(DJ_ENOMEM, "out of memory"), true);
                return;
            }
            c->body = nb;
            c->body_cap = cap;
        }
        memcpy(c->body + c->body_got, p, k);
        c->body_got += k;
        p += k;
        n -= k;
        if (c->body_got == c->body_len) {
            c->hdr_got = 0;
            handle_frame(c);
        }
    }
}

static void free_on_close(uv_handle_t *h) { free(h->data); }

static bool peer_is_local(dj__conn *c) {
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(&c->u.tcp, (struct sockaddr *)&ss, &len) != 0) return false;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&ss;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!memcmp(in6->sin6_addr.s6_addr, v4mapped, 12)) return in6->sin6_addr.s6_addr[12] == 127;
        return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    }
    return false;
}

static void on_connection(uv_stream_t *server, int status) {
    dj__server *s = server->data;
    if (status < 0 || s->stopping) return;
    dj__conn *c = calloc(1, sizeof *c);
    if (!c) return;
    c->srv = s;
    c->id = ++s->next_conn;
    int rc = s->is_unix ? uv_pipe_init(&s->loop, &c->u.pipe, 0) : uv_tcp_init(&s->loop, &c->u.tcp);
    if (rc < 0) {
        free(c);
        return;
    }
    c->u.handle.data = c;
    if (dj__map_put(&s->conns, c->id, c) != DJ_OK) {
        uv_close(&c->u.handle, free_on_close);
        return;
    }
    pthread_mutex_lock(&s->mu);
    dj_status st = dj__map_put(&s->live_conns, c->id, (void *)1);
    if (st == DJ_OK) s->metrics.connections++;
    pthread_mutex_unlock(&s->mu);
    if (st != DJ_OK || uv_accept(server, &c->u.stream) < 0) {
        conn_close(c);
        return;
    }
    if (!s->is_unix) {
        uv_tcp_nodelay(&c->u.tcp, 1);
        if (!s->have_token && !peer_is_local(c)) {
            DJ_LOG(WARN, "conn=%llu refused: not a loopback peer and no --token-file", (unsigned long long)c->id);
            conn_close(c);
            return;
        }
    }
    DJ_LOG(INFO, "conn=%llu accepted", (unsigned long long)c->id);
    uv_read_start(&c->u.stream, on_alloc, on_read);
}

/* ---- worker -> loop ---- */

static void on_wake(uv_async_t *a) {
    dj__server *s = a->data;
    pthread_mutex_lock(&s->mu);
    dj__out *o = s->out_head;
    s->out_head = s->out_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (o) {
        dj__out *next = o->next;
        dj__conn *c = dj__map_get(&s->conns, o->conn);
        if (c && !uv_is_closing(&c->u.handle)) {
            send_out(c, o);
        } else {
            free(o->meta);
            free(o);
        }
        o = next;
    }
}

static void close_walk(uv_handle_t *h, void *arg) {
    dj__server *s = arg;
    if (uv_is_closing(h)) return;
    if ((h->type == UV_TCP || h->type == UV_NAMED_PIPE) && (void *)h != (void *)&s->listener) {
        conn_close(h->data);
        return;
    }
    uv_close(h, NULL);
}

static void on_signal(uv_signal_t *sig, int signum) {
    dj__server *s = sig->data;
    DJ_LOG(WARN, "djinnd: signal %d, shutting down", signum);
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    dj__worker_stop(s); /* joins: no uv_async_send after this */
    on_wake(&s->wake);  /* flush what the worker produced */
    uv_walk(&s->loop, close_walk, s);
}

/* ---- setup ---- */

static dj_status read_token(dj__server *s, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return dj_fail(DJ_EIO, "--token-file %s: %s", path, strerror(errno));
    size_t n = fread(s->token, 1, sizeof s->token - 1, f);
    fclose(f);
    while (n && (s->token[n - 1] == '\n' || s->token[n - 1] == '\r' || s->token[n - 1] == ' ')) n--;
    s->token[n] = '\0';
    if (n == 0) return dj_fail(DJ_EINVAL, "--token-file %s is empty", path);
    s->have_token = true;
    return DJ_OK;
}

static dj_status listen_on(dj__server *s) {
    struct sockaddr_storage ss;
    socklen_t len;
    dj_status st = dj__addr_parse(s->cfg.listen, &ss, &len);
    if (st != DJ_OK) return st;
    int rc;
    if (ss.ss_family == AF_UNIX) {
        const char *path = s->cfg.listen + 5;
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode)) unlink(path); /* a stale socket of an old run */
        s->is_unix = true;
        rc = uv_pipe_init(&s->loop, &s->listener.pipe, 0);
        if (rc == 0) rc = uv_pipe_bind(&s->listener.pipe, path);
        if (rc == 0) chmod(path, 0600);
    } else {
        rc = uv_tcp_init(&s->loop, &s->listener.tcp);
        if (rc == 0) rc = uv_tcp_bind(&s->listener.tcp, (const struct sockaddr *)&ss, 0);
    }
    s->listener.tcp.data = s;
    if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection);
    if (rc < 0) return dj_fail(DJ_EIO, "listen on %s: %s", s->cfg.listen, uv_strerror(rc));
    if (!s->is_unix) {
        struct sockaddr_storage b;
        int bl = sizeof b;
        uv_tcp_getsockname(&s->listener.tcp, (struct sockaddr *)&b, &bl);
        unsigned port = ntohs(b.ss_family == AF_INET ? ((struct sockaddr_in *)&b)->sin_port
                                                     : ((struct sockaddr_in6 *)&b)->sin6_port);
        DJ_LOG(INFO, "djinnd listening on %s (port %u)", s->cfg.listen, port);
        if (s->cfg.port_file) {
            char tmp[PATH_MAX];
            snprintf(tmp, sizeof tmp, "%s.tmp", s->cfg.port_file);
            FILE *f = fopen(tmp, "w");
            if (!f) return dj_fail(DJ_EIO, "--port-file %s: %s", s->cfg.port_file, strerror(errno));
            fprintf(f, "%u\n", port);
            fclose(f);
            rename(tmp, s->cfg.port_file);
        }
    } else if (s->cfg.port_file) {
        FILE *f = fopen(s->cfg.port_file, "w");
        if (f) fclose(f);
    }
    return DJ_OK;
}

static int usage(FILE *f) {
    fputs("usage: djinnd [--listen ADDR:PORT | --listen unix:/path] [--models DIR] [--vmu-gb G] [--device D]\n"
          "              [--token-file FILE] [--metrics ADDR:PORT] [--threads N] [--lease-ms MS]\n"
          "              [--max-running N] [--prefill-chunk N] [--mixed-steps on|off|auto] [--port-file FILE]\n"
          "Defaults: --listen 127.0.0.1:7070, --models ., --vmu-gb 1, --device cpu, --lease-ms 10000,\n"
          "--max-running 64, --prefill-chunk 256 (prompt tokens per scheduler turn; 0 = the whole prompt),\n"
          "--mixed-steps auto (prompt chunks share the decode steps: on for the CPU engine, off on a GPU).\n"
          "Without --token-file only loopback (and unix socket) peers are accepted.\n",
          f);
    return 2;
}

static int parse_args(int argc, char **argv, dj__config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->listen = "127.0.0.1:7070";
    cfg->models = ".";
    cfg->vmu_bytes = (size_t)1 << 30;
    cfg->lease_ms = 10000;
    cfg->max_running = 64;
    cfg->prefill_chunk = 256;
    cfg->mixed_steps = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 3;
        if (!strcmp(a, "serve") && i == 1) continue; /* `djinn serve ...` passes its argv through */
        if (!v) {
            fprintf(stderr, "djinnd: unknown option or missing value: '%s'\n", a);
            return usage(stderr);
        }
        i++;
        char *end;
        long x;
        if (!strcmp(a, "--listen")) cfg->listen = v;
        else if (!strcmp(a, "--models")) cfg->models = v;
        else if (!strcmp(a, "--device")) cfg->device = v;
        else if (!strcmp(a, "--metrics")) cfg->metrics = v;
        else if (!strcmp(a, "--token-file")) cfg->token_file = v;
        else if (!strcmp(a, "--port-file")) cfg->port_file = v;
        else if (!strcmp(a, "--mixed-steps")) {
            if (!strcmp(v, "on"))
                cfg->mixed_steps = 1;
            else if (!strcmp(v, "off"))
                cfg->mixed_steps = 0;
            else if (!strcmp(v, "auto"))
                cfg->mixed_steps = -1;
            else {
                fprintf(stderr, "djinnd: --mixed-steps '%s': want on, off or auto\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--vmu-gb")) {
            if (dj_vmu_parse_size(v, &cfg->vmu_bytes) != DJ_OK) {
                fprintf(stderr, "djinnd: --vmu-gb '%s': %s\n", v, dj_last_error());
                return 2;
            }
        } else if (!strcmp(a, "--threads") || !strcmp(a, "--lease-ms") || !strcmp(a, "--max-running") ||
                   !strcmp(a, "--prefill-chunk")) {
            errno = 0;
            x = strtol(v, &end, 10);
            if (errno || *end || x < 0 || x > INT32_MAX ||
                (x == 0 && strcmp(a, "--threads") && strcmp(a, "--prefill-chunk"))) {
                fprintf(stderr, "djinnd: %s '%s' is not a valid count\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--threads")) cfg->threads = (int)x;
            else if (!strcmp(a, "--lease-ms")) cfg->lease_ms = (uint32_t)x;
            else if (!strcmp(a, "--prefill-chunk")) cfg->prefill_chunk = (uint32_t)x;
            else cfg->max_running = (uint32_t)x;
        } else {
            fprintf(stderr, "djinnd: unknown option '%s'\n", a);
            return usage(stderr);
        }
    }
    return 0;
}

int dj__serve_main(int argc, char **argv) {
    dj__server *s = calloc(1, sizeof *s);
    if (!s) return 1;
    int r = parse_args(argc, argv, &s->cfg);
    if (r) {
        free(s);
        return r == 3 ? 0 : r;
    }
    int rc = 1;
    bool loop_ok = false, mu_ok = false;
    dj_status st;
    signal(SIGPIPE, SIG_IGN);
    if (pthread_mutex_init(&s->mu, NULL) || pthread_cond_init(&s->cv, NULL) ||
        pthread_mutex_init(&s->metrics.mu, NULL)) {
        fprintf(stderr, "djinnd: cannot create locks\n");
        free(s);
        return 1;
    }
    mu_ok = true;
    if ((st = dj__map_init(&s->conns, 256)) != DJ_OK || (st = dj__map_init(&s->sessions, 1024)) != DJ_OK ||
        (st = dj__map_init(&s->handles, 1024)) != DJ_OK || (st = dj__map_init(&s->live_conns, 256)) != DJ_OK)
        goto fail;
    if (s->cfg.token_file && (st = read_token(s, s->cfg.token_file)) != DJ_OK) goto fail;
    if (uv_loop_init(&s->loop) < 0) {
        st = dj_fail(DJ_EIO, "uv_loop_init failed");
        goto fail;
    }
    loop_ok = true;
    uv_async_init(&s->loop, &s->wake, on_wake);
    s->wake.data = s;
    uv_signal_init(&s->loop, &s->sigint);
    uv_signal_init(&s->loop, &s->sigterm);
    s->sigint.data = s->sigterm.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    if ((st = dj__worker_start(s)) != DJ_OK) goto fail_loop;
    if (s->cfg.metrics && (st = dj__metrics_start(&s->metrics, s->cfg.metrics)) != DJ_OK) goto fail_loop;
    if ((st = listen_on(s)) != DJ_OK) goto fail_loop;
    fprintf(stderr, "djinnd: serving models from %s on %s (lease %u ms)\n", s->cfg.models, s->cfg.listen,
            s->cfg.lease_ms);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    rc = 0;
    goto done;
fail_loop:
    fprintf(stderr, "djinnd: %s: %s\n", dj_strerror(st), dj_last_error());
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    uv_walk(&s->loop, close_walk, s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    goto done;
fail:
    fprintf(stderr, "djinnd: %s: %s\n", dj_strerror(st), dj_last_error());
done:
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_mutex_unlock(&s->mu);
    dj__metrics_stop(&s->metrics);
    dj__worker_stop(s);
    if (loop_ok) {
        uv_walk(&s->loop, close_walk, s);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
    }
    if (s->is_unix) unlink(s->cfg.listen + 5);
    for (dj__out *o = s->out_head, *n; o; o = n) {
        n = o->next;
        free(o->meta);
        free(o);
    }
    dj__map_destroy(&s->conns);
    dj__map_destroy(&s->sessions);
    dj__map_destroy(&s->handles);
    dj__map_destroy(&s->live_conns);
    if (mu_ok) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->metrics.mu);
    }
    free(s);
    return rc;
}
