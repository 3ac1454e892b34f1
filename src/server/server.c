/* server.c: djinnd's I/O thread - the libuv loop that accepts connections,
 * frames requests, answers the cheap ones and queues the rest for the engine
 * worker, writes replies with scatter-gather writes, and shuts down cleanly. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include "djinn/alloc.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server/http_impl.h"
#include "djinn/intervene.h"
#include "server/graph_serve.h"
#include "djinn/version.h"
#include "server/agent_check.h"
#include "server/server_impl.h"
#include "server/serve.h"
#include "server/access.h"
#include "server/sd_notify.h"
#include "server/wrong_door.h"
#include "server/submit.h"

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
    bool pending;          /* counted in srv->n_pending: accepted, no HELLO completed yet */
    uint8_t hdr[DJ_FRAME_HEADER_BYTES];
    size_t hdr_got;
    dj_frame_header h;
    uint8_t *body;         /* [meta_len + payload_len] as it arrives */
    uint64_t body_len, body_cap, body_got;
    bool payload_checked;  /* this frame's STEP payload was bounded by its session */
    char rbuf[READ_CHUNK];
    int writes;            /* in flight */
    uint64_t t_open_ms, t_active_ms; /* the daemon's clock: accepted, last byte either way */
    uint64_t peer;         /* failed-HELLO key (dj__peer_hello_at) */
    bool admin;            /* set by HELLO: the token's roles */
    uint64_t tenant;       /* set by HELLO: whose quotas its requests count against (DJ__TENANT_CONN) */
    uint32_t qos_mask;
    uint64_t cache_salt[2]; /* set by HELLO: the token's prefix-cache salt ({0, 0}: shared, or no token file) */
    uint32_t inflight;     /* requests handed to the worker, not answered yet */
    uint32_t opening;      /* of those, SESSION_OPENs: they count against the session quotas */
    uint32_t handles_due;  /* result handles the STEPs in flight will make (--max-handles-per-conn) */
    uint64_t prompt_bytes; /* text prompt bytes handed to the worker, not tokenized yet (--max-prompt-inflight) */
    uint64_t out_bytes;    /* what unsent replies hold (reply_owned) plus their payload bytes */
    uint64_t out_owned;    /* of those, memory held for this connection alone (reply_owned) */
    bool over_soft;        /* out_bytes passed --max-reply-buffer's soft limit, not yet under half of it */
    bool reading;          /* uv_read_start in effect */
    /* a HELLO held back by the peer's failed-HELLO schedule, and the bytes
     * that came after it (or after any frame once reading had to stop) */
    bool deferred;
    bool waiting;          /* counted in its peer record's `waiting` (dj__peer_wait) */
    bool unix_sock;        /* accepted on a unix socket (u.pipe), else TCP (u.tcp) */
    bool door;             /* a portal's (the HTTP door's, in-process): not a peer of its own */
    dj__portal *portal;    /* a portal's connection: no socket; answers go to its mailbox as typed events */
    uint64_t renewed;      /* a portal's last HEARTBEAT: the leases it renewed (its reply's only field) */
    uint64_t defer_until;
    dj_frame_header defer_h;
    uint8_t *defer_body;
    uint8_t *rest;         /* [rest_len] */
    size_t rest_len;
} dj__conn;

typedef struct wreq {
    uv_write_t w;
    dj__conn *c;
    uint8_t hdr[DJ_FRAME_HEADER_BYTES];
    char *meta;            /* owned */
    dj__handle *handle;    /* payload source (one reference), or NULL */
    uint64_t bytes, owned; /* what it added to c->out_bytes and c->out_owned */
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

uint64_t dj__clock_ms(dj__server *s) { return atomic_load(&s->clock_ms); }

/* uv_check: once a turn's poll callbacks ran (every byte that had arrived
 * before the poll read), the daemon's clock catches up with the monotonic
 * one by at most DJ__CLOCK_STEP_MS. */
static void on_clock(uv_check_t *h) {
    dj__server *s = h->data;
    const uint64_t now = dj__now_ms();
    uint64_t step = now - s->clock_seen_ms;
    if (step > DJ__CLOCK_STEP_MS) {
        const char *fmt = "djinnd did not run for %llu ms: leases and timeouts count %u ms of it";
        if (step >= 1000) DJ_LOG(WARN, fmt, (unsigned long long)step, DJ__CLOCK_STEP_MS);
        else DJ_LOG(INFO, fmt, (unsigned long long)step, DJ__CLOCK_STEP_MS); /* a loaded machine */
        step = DJ__CLOCK_STEP_MS;
    }
    s->clock_seen_ms = now;
    atomic_fetch_add(&s->clock_ms, step);
}

dj_status dj__map_init(dj__map *m, size_t n_buckets) {
    m->b = dj_calloc(n_buckets, sizeof *m->b);
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
    dj__ment *e = dj_malloc(sizeof *e);
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

/* ---- the I/O side's session records (dj__lease; loop only) ---- */

static void handles_drop_session(dj__server *s, uint64_t sid);

/* Sessions a connection holds, with the SESSION_OPENs it has in flight. */
static size_t conn_sessions(dj__server *s, const dj__conn *c) {
    size_t n = c->opening;
    for (size_t b = 0; b < s->leases.n_buckets; b++)
        for (dj__ment *e = s->leases.b[b]; e; e = e->next) n += ((dj__lease *)e->val)->conn == c->id;
    return n;
}

/* ... and a token's, over all its connections (orphans included). */
static size_t tenant_sessions(dj__server *s, uint64_t tenant) {
    size_t n = 0;
    for (size_t b = 0; b < s->leases.n_buckets; b++)
        for (dj__ment *e = s->leases.b[b]; e; e = e->next) n += ((dj__lease *)e->val)->tenant == tenant;
    for (size_t b = 0; b < s->conns.n_buckets; b++)
        for (dj__ment *e = s->conns.b[b]; e; e = e->next) {
            const dj__conn *o = e->val;
            if (o->tenant == tenant) n += o->opening;
        }
    return n;
}

/* The lease goes (its connection closed, its lease ended): the worker is
 * told to release the session (the message made at open: nothing to
 * allocate). */
static void lease_drop(dj__server *s, dj__lease *l, dj_status why, const char *msg) {
    dj__map_del(&s->leases, l->id);
    handles_drop_session(s, l->id);
    dj__job *m = l->drop_msg;
    m->ctl.why = why;
    m->ctl.why_msg = msg;
    dj__enqueue(s, m);
    dj__job_free(l->orphan_msg);
    free(l);
}

static void lease_free(dj__lease *l) {
    dj__job_free(l->drop_msg);
    dj__job_free(l->orphan_msg);
    free(l);
}

void dj__handle_unref(dj__server *s, dj__handle *h) {
    (void)s;
    if (--h->refs > 0) return;
    free(h->bytes);
    free(h);
}

/* A session's result handles go (it closed, its lease ended, its connection went). */
static void handles_drop_session(dj__server *s, uint64_t sid) {
    for (size_t b = 0; b < s->handles.n_buckets; b++) {
        dj__ment *e = s->handles.b[b];
        while (e) {
            dj__handle *h = e->val;
            e = e->next;
            if (h->sess == sid) {
                dj__gone_note(s, h->id, h->conn, sid); /* a FETCH of it says where it went */
                dj__map_del(&s->handles, h->id);
                dj__handle_unref(s, h);
            }
        }
    }
}

/* bytes[nbytes] (f32, shape[0..ndim)) filed as a result handle of (conn,
 * sess) under a fresh random id (*id); bytes are the handle's once filed. */
static dj_status handle_file(dj__server *s, uint64_t conn, uint64_t sess, float *bytes, uint32_t ndim,
                             const uint64_t *shape, uint64_t nbytes, uint64_t *id) {
    dj__handle *h = dj_calloc(1, sizeof *h);
    if (!h) return dj_fail(DJ_ENOMEM, "out of memory");
    dj_status st;
    do st = dj__random_id(&h->id);
    while (st == DJ_OK && dj__map_get(&s->handles, h->id));
    if (st == DJ_OK) st = dj__map_put(&s->handles, h->id, h);
    if (st != DJ_OK) {
        free(h);
        return st;
    }
    h->conn = conn;
    h->sess = sess;
    h->ndim = ndim;
    for (uint32_t d = 0; d < ndim && d < 8; d++) h->shape[d] = shape[d];
    h->nbytes = nbytes;
    h->refs = 1;
    h->bytes = (uint8_t *)bytes;
    snprintf(h->dtype, sizeof h->dtype, "f32");
    *id = h->id;
    return DJ_OK;
}

/* A STEP's reply: its logits and saved activations become result handles
 * (their ids written into the reply); a failure answers the STEP with it. */
static dj_status step_file(dj__server *s, dj__event *e) {
    dj__rep_step *r = &e->u.step;
    dj_status st = DJ_OK;
    if (r->logits) {
        st = handle_file(s, e->conn, e->session, r->logits, r->ndim, r->shape, r->nbytes, &r->handle);
        if (st == DJ_OK) r->logits = NULL;
    }
    for (uint32_t k = 0; k < r->n_saved; k++) { /* every save is listed, a failed one without a handle */
        dj__rep_saved *v = &r->saved[k];
        const uint64_t shape[2] = {v->n, v->d};
        if (st == DJ_OK && v->bytes &&
            (st = handle_file(s, e->conn, v->keep ? 0 : e->session, v->bytes, 2, shape,
                              (uint64_t)v->n * v->d * sizeof(float), &v->handle)) == DJ_OK)
            v->bytes = NULL;
    }
    return st;
}

/* A SESSION_EXPORT's reply: the image becomes a result handle of the
 * session (u8, FETCHed in pieces), counted in --max-handles-per-conn. */
static dj_status export_file(dj__server *s, dj__event *e) {
    dj__rep_export *r = &e->u.exp;
    if (dj__conn_handles(s, e->conn) >= s->cfg.max_handles)
        return dj_fail(DJ_EQUOTA, "this connection holds %u handles (--max-handles-per-conn): release some",
                       s->cfg.max_handles);
    const uint64_t shape[1] = {r->nbytes};
    dj_status st = handle_file(s, e->conn, e->session, (float *)(void *)r->bytes, 1, shape, r->nbytes, &r->handle);
    if (st != DJ_OK) return st;
    r->bytes = NULL;
    dj__handle *h = dj__map_get(&s->handles, r->handle);
    snprintf(h->dtype, sizeof h->dtype, "u8");
    return DJ_OK;
}

/* A GRAPH_RUN's reply: its outputs become result handles of its connection
 * (no session: they go when it closes), all or none, within
 * --max-handles-per-conn; a failure answers the GRAPH_RUN with it. */
static dj_status graph_file(dj__server *s, dj__event *e) {
    dj__rep_graph *r = &e->u.graph;
    const size_t held = dj__conn_handles(s, e->conn);
    if (held + r->n_outs > s->cfg.max_handles)
        return dj_fail(DJ_EQUOTA, "this connection holds %zu handles and the graph has %u outputs "
                       "(--max-handles-per-conn %u): release some", held, r->n_outs, s->cfg.max_handles);
    dj_status st = DJ_OK;
    uint32_t filed = 0;
    for (; filed < r->n_outs; filed++) {
        dj__graph_out *o = &r->outs[filed];
        uint64_t shape[8];
        for (uint32_t d = 0; d < o->rank && d < 8; d++) shape[d] = (uint64_t)o->shape[d];
        if ((st = handle_file(s, e->conn, 0, o->bytes, o->rank, shape, o->nbytes, &o->handle)) != DJ_OK) break;
        o->bytes = NULL;
    }
    if (st != DJ_OK)
        for (uint32_t i = 0; i < filed; i++) {
            dj__handle *h = dj__map_get(&s->handles, r->outs[i].handle);
            dj__map_del(&s->handles, r->outs[i].handle);
            if (h) dj__handle_unref(s, h);
        }
    return st;
}

size_t dj__conn_handles(dj__server *s, uint64_t conn) {
    size_t n = 0;
    for (size_t b = 0; b < s->handles.n_buckets; b++)
        for (dj__ment *e = s->handles.b[b]; e; e = e->next) n += ((dj__handle *)e->val)->conn == conn;
    return n;
}

dj__out *dj__out_meta(uint64_t conn, uint16_t type, uint64_t req, dj__mw *w) {
    dj__mw_finish(w);
    dj__out *o = w->sb.data ? dj_calloc(1, sizeof *o) : NULL; /* no data: the writer found no memory */
    if (!o) {
        dj__mw_destroy(w);
        return NULL;
    }
    o->conn = conn;
    o->h.magic = DJ_PROTO_MAGIC;
    o->h.version = DJ_PROTO_VERSION;
    o->h.type = type;
    o->h.request_id = req;
    o->h.meta_len = (uint32_t)w->sb.size;
    o->meta = msgpack_sbuffer_release(&w->sb);
    dj__mw_destroy(w);
    /* the buffer grew by doubling from 8 KiB: a queued reply keeps only its bytes */
    char *fit = o->meta ? dj_realloc(o->meta, o->h.meta_len ? o->h.meta_len : 1) : NULL;
    if (fit) o->meta = fit;
    return o;
}

dj__out *dj__out_error(uint64_t conn, uint64_t req, dj_status st, const char *msg, bool close_after) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_i64(&w, "status", st);
    dj__mw_str(&w, "name", dj_status_name(st));
    char clean[1024];
    dj__scrub_message(msg && msg[0] ? msg : dj_strerror(st), clean, sizeof clean);
    dj__mw_str(&w, "message", clean);
    dj__out *o = dj__out_meta(conn, DJ_MSG_ERROR, req, &w);
    if (o) o->close_after = close_after;
    return o;
}

/* ---- writing ---- */

static void conn_close(dj__conn *c);
static void conn_pump(dj__conn *c);
static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* Whether the connection may be read now: not closing, no HELLO held back,
 * replies under the soft limit, requests in flight under the cap. */
static bool may_read(dj__conn *c) {
    const dj__config *cfg = &c->srv->cfg;
    if (c->out_bytes > cfg->out_soft) c->over_soft = true;
    else if (c->out_bytes <= cfg->out_soft / 2) c->over_soft = false;
    return !c->closing && !uv_is_closing(&c->u.handle) && !c->deferred && !c->over_soft &&
           c->inflight < cfg->max_inflight && c->prompt_bytes < cfg->prompt_inflight;
}

static void on_write(uv_write_t *w, int status) {
    wreq *r = (wreq *)w;
    dj__conn *c = r->c;
    dj__server *s = c->srv;
    free(r->meta);
    if (r->handle) dj__handle_unref(s, r->handle);
    c->out_bytes -= r->bytes;
    c->out_owned -= r->owned;
    free(r);
    c->writes--;
    c->t_active_ms = dj__clock_ms(s);
    if (status < 0 && !c->closing) {
        DJ_LOG(INFO, "conn=%llu write failed: %s", (unsigned long long)c->id, uv_strerror(status));
        conn_close(c);
    } else if (c->closing && c->writes == 0 && !uv_is_closing(&c->u.handle)) {
        conn_close(c);
    } else {
        conn_pump(c);
    }
}

/* What a queued reply holds in memory for its connection alone: the write
 * request (header inside) and the metadata's allocation, each with malloc's
 * own overhead - not just the bytes it will send. */
#define ALLOC_OVERHEAD 16
static uint64_t reply_owned(const char *meta) {
    return sizeof(wreq) + ALLOC_OVERHEAD + (meta ? malloc_usable_size((void *)meta) + ALLOC_OVERHEAD : 0);
}

/* Send header + meta (owned, freed after the write) + optional payload taken
 * from a handle (one reference held until the write completes). Past the
 * hard limit on what unsent replies hold the connection is dropped instead. */
static void conn_send(dj__conn *c, const dj_frame_header *h, char *meta, dj__handle *hd, const uint8_t *payload) {
    const uint64_t owned = reply_owned(meta);
    const bool over = c->out_owned + owned > c->srv->cfg.out_hard;
    if (uv_is_closing(&c->u.handle) || over) {
        if (over && !uv_is_closing(&c->u.handle))
            DJ_LOG(WARN, "conn=%llu dropped: %llu reply bytes unsent (hard limit %llu)", (unsigned long long)c->id,
                   (unsigned long long)c->out_owned, (unsigned long long)c->srv->cfg.out_hard);
        free(meta);
        if (hd) dj__handle_unref(c->srv, hd);
        if (over) conn_close(c);
        return;
    }
    wreq *r = dj_calloc(1, sizeof *r);
    if (!r) {
        free(meta);
        conn_close(c);
        return;
    }
    r->c = c;
    r->meta = meta;
    r->handle = hd;
    r->owned = owned;
    r->bytes = owned + h->payload_len;
    dj_frame_header_encode(h, r->hdr);
    uv_buf_t bufs[3];
    unsigned n = 0;
    bufs[n++] = uv_buf_init((char *)r->hdr, DJ_FRAME_HEADER_BYTES);
    if (h->meta_len) bufs[n++] = uv_buf_init(meta, h->meta_len);
    if (h->payload_len) bufs[n++] = uv_buf_init((char *)payload, (unsigned)h->payload_len);
    c->writes++;
    c->out_bytes += r->bytes;
    c->out_owned += r->owned;
    int rc = uv_write(&r->w, &c->u.stream, bufs, n, on_write);
    if (rc < 0) {
        c->writes--;
        c->out_bytes -= r->bytes;
        c->out_owned -= r->owned;
        free(meta);
        if (hd) dj__handle_unref(c->srv, hd);
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
        c->reading = false;
        if (c->writes == 0) conn_close(c);
    }
    free(o);
}

static void send_error(dj__conn *c, uint64_t req, uint16_t type, dj_status st, bool close_after) {
    dj__metrics_count(&c->srv->metrics, type, st);
    DJ_LOG(INFO, "conn=%llu req=%llu type=%s error=%s: %s%s", (unsigned long long)c->id, (unsigned long long)req,
           dj_msg_type_name(type), dj_status_name(st), dj_last_error(), close_after && !c->portal ? " (closing)" : "");
    if (c->portal) { /* typed, and the portal stays: its user decides */
        dj__event *e = dj__event_error(c->id, type, req, st, dj_last_error(), false);
        if (e) dj__portal_deliver(c->portal, e);
        else conn_close(c);
        return;
    }
    dj__out *o = dj__out_error(c->id, req, st, dj_last_error(), close_after);
    if (!o) {
        conn_close(c);
        return;
    }
    send_out(c, o);
}

static void send_reply(dj__conn *c, uint16_t type, uint64_t req, dj__mw *w) {
    dj__metrics_count(&c->srv->metrics, type, DJ_OK);
    if (c->portal) { /* an I/O-side answer to a portal: HEARTBEAT's count is its one field */
        dj__mw_destroy(w);
        dj__event *e = dj__event_new(DJ__EV_REPLY, c->id, type, req, 0);
        if (e) e->renewed = c->renewed;
        if (e) dj__portal_deliver(c->portal, e);
        else conn_close(c);
        return;
    }
    dj__out *o = dj__out_meta(c->id, DJ_MSG_REPLY, req, w);
    if (!o) {
        conn_close(c);
        return;
    }
    send_out(c, o);
}

/* ---- connection lifetime ---- */

/* A connection is gone (its socket closed, or its portal's user closed it). */
static void conn_gone(dj__conn *c) {
    dj__server *s = c->srv;
    dj__map_del(&s->conns, c->id);
    /* Its sessions die, except those opened with `reattach`: they wait out
     * their leases for a SESSION_ATTACH (an agent process that restarts keeps
     * its KV); the worker cancels their requests. Past DJ__MAX_ORPHANS
     * orphans, they die at once too. */
    size_t orphans = 0;
    for (size_t b = 0; b < s->leases.n_buckets; b++)
        for (dj__ment *e = s->leases.b[b]; e; e = e->next) orphans += ((dj__lease *)e->val)->orphan;
    for (size_t b = 0; b < s->leases.n_buckets; b++) {
        dj__ment *e = s->leases.b[b];
        while (e) {
            dj__lease *l = e->val;
            e = e->next;
            if (l->conn != c->id) continue;
            if (!l->orphan_msg || orphans >= DJ__MAX_ORPHANS) {
                lease_drop(s, l, DJ_ENOTFOUND, "connection closed");
                continue;
            }
            l->orphan = true;
            l->conn = 0;
            l->inflight = 0; /* the worker drops its requests: their answers will not come */
            orphans++;
            dj__enqueue(s, l->orphan_msg);
            l->orphan_msg = NULL;
            handles_drop_session(s, l->id); /* its result handles were this connection's: they go now */
        }
    }
    pthread_mutex_lock(&s->mu);
    dj__map_del(&s->live_conns, c->id);
    if (s->metrics.connections) s->metrics.connections--;
    pthread_mutex_unlock(&s->mu);
    DJ_LOG(INFO, "conn=%llu closed", (unsigned long long)c->id);
    dj__capture_conn_closed(s, c->id);
    if (c->portal) dj__portal_release(c->portal);
    else s->n_conns--;
    if (c->pending) s->n_pending--;
    if (c->waiting) dj__peer_unwait(&s->peers, c->peer);
    free(c->body);
    free(c->defer_body);
    free(c->rest);
    free(c);
}

static void on_closed(uv_handle_t *h) { conn_gone(h->data); }

/* A portal's connection stays until its user closes it (dj__conn_portal_close):
 * here its user is only told that it cannot answer any more. */
static void conn_close(dj__conn *c) {
    if (c->portal) {
        if (!c->closing) dj__portal_fail(c->portal);
        c->closing = true;
        return;
    }
    c->closing = true;
    if (!uv_is_closing(&c->u.handle)) uv_close(&c->u.handle, on_closed);
}

/* ---- inline requests (never touch the engine) ---- */

/* *wrong_token is set when the failure is the token (the peer is slowed). */
static dj_status do_hello(dj__conn *c, const dj__req_hello *m, dj__mw *w, bool *wrong_token) {
    dj__server *s = c->srv;
    const uint32_t ver = m->version;
    const char *tok = m->token;
    const size_t tn = m->token_len;
    if (ver != DJ_PROTO_VERSION)
        return dj_fail(DJ_EUNSUPPORTED, "client speaks protocol %u, server %u", ver, DJ_PROTO_VERSION);
    if (s->have_token) {
        const dj__token *t = tok ? dj__token_find(s->tokens, s->n_tokens, tok, tn) : NULL;
        if (!t) {
            *wrong_token = true;
            return dj_fail(DJ_EINVAL, "HELLO: missing or wrong token");
        }
        const uint64_t tenant = t->tenant; /* kept across SIGHUP reloads (reload.c) */
        uint32_t n_same = 0;
        for (size_t b = 0; b < s->conns.n_buckets; b++)
            for (dj__ment *e = s->conns.b[b]; e; e = e->next) {
                const dj__conn *o = e->val;
                n_same += o->hello && !o->closing && o->tenant == tenant;
            }
        if (n_same >= s->cfg.max_conns_token)
            return dj_fail(DJ_EQUOTA, "this token has %u connections open (--max-connections-per-token %u)", n_same,
                           s->cfg.max_conns_token);
        c->tenant = tenant;
        c->admin = t->admin;
        c->qos_mask = t->qos_mask;
        memcpy(c->cache_salt, t->cache_salt, sizeof c->cache_salt);
    } else {
        c->tenant = DJ__TENANT_CONN(c->id);
        c->admin = s->cfg.local_admin; /* loopback or unix-socket peers only (on_connection) */
        c->qos_mask = (1u << DJ_QOS_COUNT) - 1;
    }
    c->hello = true;
    if (c->pending) {
        c->pending = false;
        s->n_pending--;
    }
    dj__mw_u64(w, "version", DJ_PROTO_VERSION);
    dj__mw_str(w, "server", "djinnd " DJ_VERSION_STRING);
    dj__mw_u64(w, "lease_ms", s->cfg.lease_ms);
    dj__mw_u64(w, "max_meta", DJ_PROTO_MAX_META);
    dj__mw_u64(w, "max_payload", DJ_PROTO_MAX_REQ_PAYLOAD);
    dj__mw_u64(w, "conn", c->id);
    dj__mw_bool(w, "admin", c->admin);
    size_t n_qos = 0;
    for (int q = 0; q < DJ_QOS_COUNT; q++) n_qos += c->qos_mask >> q & 1;
    dj__mw_key(w, "qos");
    msgpack_pack_array(&w->pk, n_qos);
    for (int q = 0; q < DJ_QOS_COUNT; q++)
        if (c->qos_mask >> q & 1) dj__pack_str(&w->pk, dj_qos_name((dj_qos)q));
    dj__mw_u64(w, "max_sessions", s->cfg.max_sessions);
    dj__mw_u64(w, "max_handles", s->cfg.max_handles);
    static const char *caps[] = {"generate", "step", "fetch", "handles", "pause-state", "stats", "qos", "models",
                                 "graph-run"}; /* graph-run: WEIGHT_* and GRAPH_RUN (graph_serve.c) */
    dj__mw_key(w, "capabilities");
    msgpack_pack_array(&w->pk, sizeof caps / sizeof *caps);
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++) dj__pack_str(&w->pk, caps[i]);
    return DJ_OK;
}

/* The lease of session id if this connection holds it; *foreign is set
 * when it exists but another connection holds it. */
static dj__lease *own_lease(dj__server *s, uint64_t conn, uint64_t id, bool *foreign) {
    dj__lease *l = dj__map_get(&s->leases, id);
    *foreign = l && l->conn != conn;
    return l && !*foreign ? l : NULL;
}

/* A message for the worker about session l (a DJ__CTL_ type); NULL when out of memory. */
static dj__job *ctl_new(const dj__lease *l, uint16_t type, uint64_t conn) {
    dj__job *j = dj_calloc(1, sizeof *j);
    if (!j) return NULL;
    j->type = type;
    j->sess = l->id;
    j->conn = conn;
    j->qos = l->qos; /* the session's queue: after the requests on it that came before */
    return j;
}

/* SESSION_ATTACH: an orphaned session (its connection closed, its lease not
 * over) moves to this connection, given the secret SESSION_OPEN answered. */
static dj_status do_attach(dj__conn *c, const dj__request *r, dj__mw *w) {
    dj__server *s = c->srv;
    const uint64_t sid = r->session, secret = r->u.attach.secret;
    dj__lease *l = dj__map_get(&s->leases, sid);
    /* the same answer for a wrong id, a wrong secret, a session still attached and one whose lease is over
     * (whether or not the tick has come round to it yet: the lease decides, not the tick) */
    if (!l || !l->orphan || (l->secret ^ secret) || dj__clock_ms(s) >= l->lease_deadline_ms ||
        (s->have_token && l->tenant != c->tenant)) /* only its own token reattaches it */
        return dj_fail(DJ_ENOTFOUND, "no session %016llx to attach (wrong id or secret, or its lease is over)",
                       (unsigned long long)sid);
    if (!(c->qos_mask >> l->qos & 1))
        return dj_fail(DJ_EINVAL, "session %016llx is of class %s, which this token does not grant",
                       (unsigned long long)sid, dj_qos_name(l->qos));
    const size_t n_open = conn_sessions(s, c);
    if (n_open >= s->cfg.max_sessions)
        return dj_fail(DJ_EQUOTA, "this connection has %zu sessions open (--max-sessions-per-conn %u)", n_open,
                       s->cfg.max_sessions);
    dj__job *attach = ctl_new(l, DJ__CTL_ATTACH, c->id), *orphan = ctl_new(l, DJ__CTL_ORPHAN, 0);
    if (!attach || !orphan) {
        free(attach);
        free(orphan);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    attach->tenant = c->tenant; /* without --token-file each connection is its own tenant (with one: the same) */
    dj__enqueue(s, attach);
    l->tenant = c->tenant;
    l->orphan_msg = orphan;
    l->conn = c->id;
    l->orphan = false;
    l->lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms;
    DJ_LOG(INFO, "session=%016llx attached to conn=%llu", (unsigned long long)sid, (unsigned long long)c->id);
    dj__mw_u64(w, "session", sid);
    dj__mw_str(w, "model", l->model);
    dj__mw_str(w, "qos", dj_qos_name(l->qos));
    dj__mw_u64(w, "pos", l->pos);
    dj__mw_u64(w, "max_ctx", l->max_ctx);
    dj__mw_u64(w, "lease_ms", s->cfg.lease_ms);
    dj__mw_bool(w, "paused", l->paused);
    return DJ_OK;
}

/* HEARTBEAT, PAUSE, RESUME, RELEASE, SESSION_ATTACH. close_conn set for
 * requests naming another connection's objects. */
static dj_status do_inline(dj__conn *c, const dj__request *r, dj__mw *w, bool *close_conn) {
    dj__server *s = c->srv;
    const uint16_t type = r->type;
    const uint64_t sid = r->session, hid = type == DJ_MSG_RELEASE ? r->u.handle : 0;
    const uint64_t expect = type == DJ_MSG_PAUSE ? r->u.expected_ms : 0;
    const uint64_t now = dj__clock_ms(s);
    bool foreign = false;
    if (type == DJ_MSG_SESSION_ATTACH) return do_attach(c, r, w);
    if (type == DJ_MSG_HEARTBEAT) {
        size_t renewed = 0;
        for (size_t b = 0; b < s->leases.n_buckets; b++)
            for (dj__ment *e = s->leases.b[b]; e; e = e->next) {
                dj__lease *l = e->val;
                if (l->conn == c->id && (!sid || l->id == sid)) {
                    l->lease_deadline_ms = now + s->cfg.lease_ms;
                    renewed++;
                }
            }
        c->renewed = renewed;
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
        if (!h) {
            *close_conn = foreign;
            return dj_fail(DJ_ENOTFOUND, "no handle %016llx on this connection", (unsigned long long)hid);
        }
        return DJ_OK;
    }
    dj__lease *l = own_lease(s, c->id, sid, &foreign);
    if (!l) {
        *close_conn = foreign;
        return dj__no_session(s, c->id, sid);
    }
    /* the worker tells the scheduler, which may swap it out and back */
    dj__job *m = ctl_new(l, DJ__CTL_PAUSE, c->id);
    if (!m) return dj_fail(DJ_ENOMEM, "out of memory");
    m->ctl.paused = type == DJ_MSG_PAUSE;
    m->ctl.expect_ms = expect;
    m->ctl.resume_at = type == DJ_MSG_RESUME ? dj__now() : 0;
    dj__enqueue(s, m);
    l->lease_deadline_ms = now + s->cfg.lease_ms;
    l->paused = type == DJ_MSG_PAUSE;
    DJ_LOG(INFO, "session=%016llx %s (expected %llu ms)", (unsigned long long)sid,
           type == DJ_MSG_PAUSE ? "paused" : "resumed", (unsigned long long)expect);
    dj__mw_bool(w, "paused", type == DJ_MSG_PAUSE);
    dj__mw_bool(w, "swapped", l->swapped); /* whether its KV is in the host pool now */
    return DJ_OK;
}

static dj_status do_fetch(dj__conn *c, uint64_t req, const dj__req_fetch *f, bool *close_conn) {
    dj__server *s = c->srv;
    const uint64_t hid = f->handle;
    uint64_t off = f->offset, len = f->length, count = f->count;
    const uint64_t start = f->start;
    const bool by_elem = f->by_elem;
    dj__handle *h = dj__map_get(&s->handles, hid);
    if (h && h->conn != c->id) {
        *close_conn = true;
        h = NULL;
    }
    if (!h) return *close_conn ? dj_fail(DJ_ENOTFOUND, "no handle %016llx on this connection", (unsigned long long)hid)
                               : dj__gone_why(s, c->id, hid);
    const uint64_t esz = strcmp(h->dtype, "u8") ? 4 : 1; /* f32, or a session image's bytes (SESSION_EXPORT) */
    if (by_elem) {
        const uint64_t n_el = h->nbytes / esz;
        if (start > n_el) {
            return dj_fail(DJ_ERANGE, "start %llu past the %llu elements of the handle", (unsigned long long)start,
                           (unsigned long long)n_el);
        }
        if (count > n_el - start) count = n_el - start;
        off = start * esz;
        len = count * esz;
    } else {
        if (off > h->nbytes) {
            return dj_fail(DJ_ERANGE, "offset %llu past the %llu bytes of the handle", (unsigned long long)off,
                           (unsigned long long)h->nbytes);
        }
        if (len > h->nbytes - off) len = h->nbytes - off;
    }
    if (len > UINT32_MAX) len = UINT32_MAX & ~(uint64_t)3; /* one uv_buf_t; clients page larger fetches */
    h->refs++;
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "offset", off);
    dj__mw_u64(&w, "length", len);
    dj__mw_u64(&w, "total", h->nbytes);
    dj__mw_str(&w, "dtype", h->dtype);
    dj__out *o = dj__out_meta(c->id, DJ_MSG_REPLY, req, &w);
    if (!o) {
        dj__handle_unref(s, h);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    o->h.payload_len = len;
    dj__metrics_count(&s->metrics, DJ_MSG_FETCH, DJ_OK);
    conn_send(c, &o->h, o->meta, h, h->bytes + off);
    free(o);
    return DJ_OK;
}

/* ---- one complete request frame ---- */

/* The one way a request frame is refused on the I/O side: counted, logged,
 * answered with an ERROR (closing the connection when close_after), and
 * what it holds freed (r may be NULL: nothing decoded yet). */
static void refuse(dj__conn *c, dj__request *r, uint64_t req, uint16_t type, dj_status st, bool close_after) {
    dj__request_free(r);
    send_error(c, req, type, st, close_after);
}

/* The I/O side's limits of a decoded request (the message table's limits
 * column): SESSION_OPEN asks only for a class its token grants; a
 * GENERATE's text prompt is at most --max-prompt-bytes and holds no U+0000
 * (refused rather than cut anywhere), and *credit gets its bytes, which
 * count against the connection's --max-prompt-inflight until the tokenizer
 * thread is done with them. */
static dj_status request_limits(dj__conn *c, const dj__request *r, uint64_t *credit) {
    *credit = 0;
    if (r->type == DJ_MSG_SESSION_OPEN && !(c->qos_mask >> r->u.open.qos & 1))
        return dj_fail(DJ_EINVAL, "qos %s is not granted to this connection's token (see --token-file)",
                       dj_qos_name(r->u.open.qos));
    if (r->type == DJ_MSG_SESSION_IMPORT && !(c->qos_mask >> r->u.import.img.qos & 1))
        return dj_fail(DJ_EINVAL, "the imported session's qos %s is not granted to this connection's token",
                       dj_qos_name(r->u.import.img.qos));
    if (r->type != DJ_MSG_GENERATE || !r->u.gen.prompt) return DJ_OK;
    const char *p = r->u.gen.prompt;
    const size_t n = r->u.gen.plen;
    const uint64_t max = c->srv->cfg.max_prompt_bytes;
    if (n > max)
        return dj_fail(DJ_ERANGE, "prompt of %zu bytes: more than --max-prompt-bytes %llu (send fewer bytes or "
                       "token ids)", n, (unsigned long long)max);
    if (memchr(p, 0, n))
        return dj_fail(DJ_EINVAL, "prompt holds U+0000 at byte %zu: refused (a NUL would cut it)",
                       (size_t)((const char *)memchr(p, 0, n) - p));
    *credit = n ? n : 1;
    return DJ_OK;
}

/* A STEP's payload, once its metadata is in: at most one int32 per position
 * its session has left - or, with `points`, at most one f32 [n, hidden]
 * tensor per point (at most DJ_IV_MAX of them) for its n ids (in the
 * metadata) - or the connection is answered and closed before the payload
 * is buffered. */
static bool step_payload_ok(dj__conn *c) {
    dj__server *s = c->srv;
    const dj_frame_header *h = &c->h;
    if (!c->hello) {
        refuse(c, NULL, h->request_id, h->type, dj_fail(DJ_EINVAL, "the first request must be HELLO"), true);
        return false;
    }
    if (h->type == DJ_MSG_SESSION_IMPORT) return true; /* a session image: at most a request's payload, checked whole */
    if (h->type != DJ_MSG_STEP) { /* WEIGHT_UPLOAD, GRAPH_RUN (graph_serve.c) */
        const dj_status cst = dj__capture_payload_check(h->type, c->body, h->meta_len, h->payload_len);
        if (cst != DJ_OK) send_error(c, h->request_id, h->type, cst, true);
        return cst == DJ_OK;
    }
    dj__meta m;
    uint64_t sid = 0, n_points = 0, n_ids = 0;
    dj_status st = dj__meta_parse(&m, c->body, h->meta_len);
    if (st == DJ_OK) {
        st = dj__meta_u64(&m, "session", true, &sid);
        const msgpack_object *pts = dj__meta_get(&m, "points"), *ids = dj__meta_get(&m, "ids");
        if (pts) n_points = pts->type == MSGPACK_OBJECT_ARRAY ? pts->via.array.size : 0;
        if (ids) n_ids = ids->type == MSGPACK_OBJECT_ARRAY ? ids->via.array.size : 0;
        if (dj__meta_get(&m, "resume") || dj__meta_get(&m, "prompt"))
            n_ids = UINT64_MAX; /* a paused step's edits, or a text prompt's: their rows, at most `room` */
        dj__meta_destroy(&m);
    }
    if (st != DJ_OK) {
        refuse(c, NULL, h->request_id, h->type, st, true);
        return false;
    }
    bool foreign;
    const dj__lease *ss = own_lease(s, c->id, sid, &foreign);
    const uint64_t room = ss && ss->max_ctx > ss->pos ? ss->max_ctx - ss->pos : 0;
    const uint64_t hidden = ss ? ss->hidden : 0;
    if (!ss) {
        refuse(c, NULL, h->request_id, h->type,
                   dj__no_session(s, c->id, sid), true);
        return false;
    }
    if (n_points) {
        const uint64_t rows = n_ids < room ? n_ids : room;
        const uint64_t cap = (n_points < DJ_IV_MAX ? n_points : DJ_IV_MAX) * rows * hidden * 4;
        if (h->payload_len > cap) {
            refuse(c, NULL, h->request_id, h->type,
                       dj_fail(DJ_ERANGE,
                               "STEP payload of %llu bytes: %llu points of [%llu, %llu] f32 take at most %llu",
                               (unsigned long long)h->payload_len, (unsigned long long)n_points,
                               (unsigned long long)rows, (unsigned long long)hidden, (unsigned long long)cap),
                       true);
            return false;
        }
        return true;
    }
    if (h->payload_len > 4 * room) {
        refuse(c, NULL, h->request_id, h->type,
                   dj_fail(DJ_ERANGE, "STEP payload of %llu bytes: session %016llx has room for %llu more ids",
                           (unsigned long long)h->payload_len, (unsigned long long)sid, (unsigned long long)room),
                   true);
        return false;
    }
    return true;
}

/* A request the I/O thread answers itself (the table's DJ__AT_IO rows);
 * the metadata is there for MODEL_INFO (model_info.c reads its own field). */
static void answer_inline(dj__conn *c, dj__request *r, const dj__meta *m) {
    dj__server *s = c->srv;
    const uint16_t type = r->type;
    const uint64_t req = r->id;
    bool close_conn = false, wrong = false;
    dj_status st;
    dj__mw w;
    dj__mw_init(&w);
    switch (type) {
    case DJ_MSG_HELLO:
        st = c->hello ? dj_fail(DJ_EINVAL, "HELLO was already sent") : do_hello(c, &r->u.hello, &w, &wrong);
        if (s->have_token && !c->door && (st == DJ_OK || wrong))
            dj__peer_hello_result(&s->peers, c->peer, dj__now_ms(), st == DJ_OK);
        close_conn = true; /* a failed HELLO closes */
        break;
    case DJ_MSG_MODEL_INFO: { /* small JSON files only: no weights, no engine */
        char probe[256]; /* a malformed request closes the connection; a model folder's malformed file does not */
        const dj_status req_st = dj__meta_strcpy(m, "model", true, probe, sizeof probe);
        st = dj__model_info(s->cfg.models, m, &w);
        close_conn = req_st == DJ_EFORMAT;
        break;
    }
    case DJ_MSG_FETCH:
        dj__mw_destroy(&w);
        st = do_fetch(c, req, &r->u.fetch, &close_conn);
        if (st == DJ_OK) {
            dj__request_free(r);
            return;
        }
        refuse(c, r, req, type, st, close_conn || st == DJ_EFORMAT);
        return;
    case DJ_MSG_WEIGHT_HAS: /* graph_serve.c: the weight store has its own lock */
    case DJ_MSG_WEIGHT_UPLOAD:
    case DJ_MSG_WEIGHT_CHALLENGE:
    case DJ_MSG_WEIGHT_PROVE:
        st = dj__capture_inline(s->capture, c->id, c->tenant, type, m, r->body + c->h.meta_len, c->h.payload_len, &w);
        close_conn = st == DJ_EFORMAT;
        break;
    default: /* HEARTBEAT, PAUSE, RESUME, RELEASE, SESSION_ATTACH */
        st = do_inline(c, r, &w, &close_conn);
        close_conn = close_conn || st == DJ_EFORMAT;
        break;
    }
    if (st == DJ_OK) {
        dj__request_free(r);
        send_reply(c, type, req, &w);
        return;
    }
    dj__mw_destroy(&w);
    refuse(c, r, req, type, st, close_conn);
}

/* One complete request frame: checked against the message table, decoded
 * into a typed request (request.h), its limits checked, then answered here
 * (the table's DJ__AT_IO rows) or posted to the worker. Every refusal goes
 * through refuse(). */
static void handle_frame(dj__conn *c) {
    dj__server *s = c->srv;
    const dj_frame_header *h = &c->h;
    dj__request r = {.type = h->type, .id = h->request_id, .body = c->body};
    c->body = NULL;
    c->body_cap = c->body_got = c->body_len = 0;
    const dj__msg_row *row = dj__msg_row_of(h->type);
    if (!row) {
        dj_fail(DJ_EFORMAT, "message type %s is not a request", dj_msg_type_name(h->type));
        r.type = 0;
        refuse(c, &r, h->request_id, 0, DJ_EFORMAT, true);
        return;
    }
    dj__meta m;
    dj_status st = dj__meta_parse(&m, r.body, h->meta_len);
    if (st != DJ_OK) {
        refuse(c, &r, h->request_id, h->type, st, true);
        return;
    }
    if (!c->hello && h->type != DJ_MSG_HELLO) st = dj_fail(DJ_EINVAL, "the first request must be HELLO");
    else if (h->payload_len && !row->payload)
        st = dj_fail(DJ_EFORMAT, "%s takes no payload (got %llu bytes)", dj_msg_type_name(h->type),
                     (unsigned long long)h->payload_len);
    if (st != DJ_OK) {
        dj__meta_destroy(&m);
        refuse(c, &r, h->request_id, h->type, st, true);
        return;
    }
    if (h->type == DJ_MSG_HELLO && s->have_token && !c->hello && !c->door) {
        /* a peer that failed HELLOs has its next one checked only after a
         * pause since its last checked one; a few wait their turn, more are
         * refused unchecked (and uncharged) */
        const uint64_t now = dj__now_ms(), at = dj__peer_check_at(&s->peers, c->peer, now);
        if (at > now) {
            dj__meta_destroy(&m);
            if (!c->waiting && !dj__peer_wait(&s->peers, c->peer)) {
                refuse(c, &r, h->request_id, h->type,
                       dj_fail(DJ_EBUSY, "%d HELLOs from this address already wait their turn after failed ones: "
                               "retry later", DJ__PEER_WAITING),
                       true);
                return;
            }
            c->waiting = true;
            c->deferred = true;
            c->defer_until = at;
            c->defer_h = *h;
            c->defer_body = r.body;
            return;
        }
        if (c->waiting) {
            dj__peer_unwait(&s->peers, c->peer);
            c->waiting = false;
        }
    }
    if (h->type == DJ_MSG_STEP) {
        r.u.step.payload = r.body + h->meta_len;
        r.u.step.payload_len = h->payload_len;
    }
    if (h->type == DJ_MSG_SESSION_IMPORT) {
        r.u.import.payload = r.body + h->meta_len;
        r.u.import.payload_len = h->payload_len;
    }
    st = dj__request_decode(&m, &r);
    if (st != DJ_OK) {
        dj__meta_destroy(&m);
        refuse(c, &r, h->request_id, h->type, st, st == DJ_EFORMAT || h->type == DJ_MSG_HELLO);
        return;
    }
    struct dj__graph_req *graph = NULL; /* GRAPH_RUN: typed here, its handle inputs copied (graph_serve.c) */
    if (h->type == DJ_MSG_GRAPH_RUN) {
        st = dj__graph_req_parse(&m, r.body + h->meta_len, h->payload_len, &graph);
        if (st == DJ_OK) st = dj__graph_req_bind(s, graph, c->id);
        if (st == DJ_OK && graph->has_qos && !(c->qos_mask >> graph->qos & 1))
            st = dj_fail(DJ_EINVAL, "GRAPH_RUN of class %s, which this token does not grant", dj_qos_name(graph->qos));
        if (st != DJ_OK) {
            dj__graph_req_free(graph);
            dj__meta_destroy(&m);
            refuse(c, &r, h->request_id, h->type, st, st == DJ_EFORMAT);
            return;
        }
    }
    dj__submit(c, &r, graph, &m);
    dj__meta_destroy(&m);
}

/* The one entry of a typed request, from either door (submit.h): its
 * limits, answered here (the table's DJ__AT_IO rows) or posted to the
 * worker with its lease held. Every refusal goes through refuse(). */
/* The requests a portal may not send: those whose handling reads their
 * metadata itself (a portal has none) and FETCH (its answer is a payload frame). */
static bool frame_only(uint16_t type) {
    return type == DJ_MSG_MODEL_INFO || type == DJ_MSG_WEIGHT_HAS || type == DJ_MSG_WEIGHT_UPLOAD ||
           type == DJ_MSG_WEIGHT_CHALLENGE || type == DJ_MSG_WEIGHT_PROVE || type == DJ_MSG_GRAPH_RUN ||
           type == DJ_MSG_FETCH;
}

void dj__submit(dj__conn *c, dj__request *rq, struct dj__graph_req *graph, const dj__meta *m) {
    dj__server *s = c->srv;
    dj__request r = *rq;
    memset(rq, 0, sizeof *rq);
    const dj__msg_row *row = dj__msg_row_of(r.type);
    uint64_t credit = 0;
    dj_status st = !row ? dj_fail(DJ_EFORMAT, "message type %s is not a request", dj_msg_type_name(r.type))
                   : c->portal && frame_only(r.type)
                       ? dj_fail(DJ_EUNSUPPORTED, "%s is not taken in-process", dj_msg_type_name(r.type))
                       : request_limits(c, &r, &credit);
    if (st != DJ_OK) {
        dj__graph_req_free(graph);
        refuse(c, &r, r.id, r.type, st, st == DJ_EFORMAT || r.type == DJ_MSG_HELLO);
        return;
    }
    if (s->draining && row->at == DJ__AT_WORKER) { /* SIGTERM with --state-dir: nothing new starts */
        dj__graph_req_free(graph);
        refuse(c, &r, r.id, r.type,
               dj_fail(DJ_EBUSY, "djinnd is restarting: reconnect and reattach the session (SESSION_ATTACH) once it "
                       "is back"), false);
        return;
    }
    if (row->at == DJ__AT_IO) {
        answer_inline(c, &r, m);
        return;
    }
    /* what the connection holds: the session a request names, the session quotas */
    bool foreign = false;
    dj__lease *l = NULL;
    if (row->session == DJ__SESS_REQUIRED && !(l = own_lease(s, c->id, r.session, &foreign))) {
        dj__graph_req_free(graph);
        refuse(c, &r, r.id, r.type,
               dj__no_session(s, c->id, r.session),
               foreign);
        return;
    }
    uint32_t handle_quota = 0;
    if (r.type == DJ_MSG_STEP) { /* the result handles it will make: counted now, against what it holds */
        handle_quota = r.u.step.logits != DJ__LOGITS_NONE;
        for (uint32_t k = 0; k < r.u.step.n_points; k++)
            handle_quota += r.u.step.points[k].op == DJ_IV_SAVE || r.u.step.points[k].op == DJ_IV_BREAK;
        const size_t n_held = dj__conn_handles(s, c->id) + c->handles_due;
        if (handle_quota && n_held + handle_quota > s->cfg.max_handles) {
            refuse(c, &r, r.id, r.type,
                   dj_fail(DJ_EQUOTA, "this connection holds %zu handles and the step makes %u "
                           "(--max-handles-per-conn %u): RELEASE some", n_held, handle_quota, s->cfg.max_handles),
                   false);
            return;
        }
    }
    if (dj__req_opens(r.type)) {
        const size_t n_open = conn_sessions(s, c), n_tenant = tenant_sessions(s, c->tenant);
        if (n_open >= s->cfg.max_sessions)
            st = dj_fail(DJ_EQUOTA, "this connection has %zu sessions open (--max-sessions-per-conn %u)", n_open,
                         s->cfg.max_sessions);
        else if (n_tenant >= s->cfg.max_sessions_token)
            st = dj_fail(DJ_EQUOTA, "this token has %zu sessions open (--max-sessions-per-token %u)", n_tenant,
                         s->cfg.max_sessions_token);
        if (st != DJ_OK) {
            refuse(c, &r, r.id, r.type, st, false);
            return;
        }
    }
    dj__job *j = dj_calloc(1, sizeof *j);
    if (!j || (credit && !(j->credit_ev = dj__event_new(DJ__EV_CREDIT, c->id, r.type, r.id, 0)))) {
        free(j);
        dj__graph_req_free(graph);
        refuse(c, &r, r.id, r.type, dj_fail(DJ_ENOMEM, "out of memory"), !credit);
        return;
    }
    if (l) { /* its lease holds while the request is in flight (on_wake: its answer's end) */
        j->qos = l->qos;
        j->sess = l->id;
        j->counted = true;
        l->inflight++;
        l->lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms;
    } else {
        j->qos = r.type == DJ_MSG_SESSION_OPEN     ? r.u.open.qos
                 : r.type == DJ_MSG_SESSION_IMPORT ? r.u.import.img.qos
                 : graph && graph->has_qos         ? graph->qos /* GRAPH_RUN's own class (graph_serve.h) */
                                                   : DJ_QOS_INTERACTIVE;
    }
    c->opening += dj__req_opens(r.type);
    c->handles_due += handle_quota;
    j->handle_quota = handle_quota;
    j->type = r.type;
    j->req = r.id;
    j->conn = c->id;
    j->r = r;
    j->graph = graph;
    j->qos_mask = c->qos_mask;
    j->admin = c->admin;
    memcpy(j->cache_salt, c->cache_salt, sizeof j->cache_salt);
    j->tenant = c->tenant;
    dj__access_who(s, &c->u.stream, c->unix_sock, c->door, c->tenant, j->peer, j->token_name);
    j->t_enqueue = dj__now();
    j->prompt_credit = credit;
    c->prompt_bytes += credit;
    c->inflight++;
    dj__enqueue(s, j);
}

/* ---- reading ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    dj__conn *c = h->data;
    *buf = uv_buf_init(c->rbuf, sizeof c->rbuf);
}

/* Frame the bytes p[0..n); when reading has to stop after a frame (a limit,
 * a HELLO held back) the rest waits in c->rest for conn_pump. */
static void feed_bytes(dj__conn *c, const uint8_t *p, size_t n) {
    while (n > 0 && !c->closing) {
        if (c->hdr_got < DJ_FRAME_HEADER_BYTES) {
            size_t k = DJ_FRAME_HEADER_BYTES - c->hdr_got;
            if (k > n) k = n;
            memcpy(c->hdr + c->hdr_got, p, k);
            c->hdr_got += k;
            p += k;
            n -= k;
            if (!c->hello && dj__wrong_door_http(c->hdr, c->hdr_got)) { /* HTTP at this port: say where it is */
                char text[512];
                const unsigned hp = c->srv->http ? dj__http_port(c->srv->http) : 0;
                uv_buf_t b = uv_buf_init(text, (unsigned)dj__wrong_door_answer(c->srv->cfg.http, hp, text, sizeof text));
                uv_try_write(&c->u.stream, &b, 1);
                conn_close(c);
                return;
            }
            if (c->hdr_got < DJ_FRAME_HEADER_BYTES) break;
            dj_status hs = dj_frame_header_decode(c->hdr, DJ_PROTO_MAX_REQ_PAYLOAD, &c->h);
            if (hs == DJ_OK && c->h.payload_len && c->h.type != DJ_MSG_STEP && c->h.type != DJ_MSG_SESSION_IMPORT &&
                !dj__capture_takes_payload(c->h.type))
                hs = dj_fail(DJ_EFORMAT, "%s takes no payload (got %llu bytes)", dj_msg_type_name(c->h.type),
                             (unsigned long long)c->h.payload_len);
            if (hs != DJ_OK) {
                send_error(c, c->h.request_id, dj_msg_type_is_request(c->h.type) ? c->h.type : 0, hs, true);
                return;
            }
            c->body_len = (uint64_t)c->h.meta_len + c->h.payload_len;
            c->body_got = 0;
            c->payload_checked = false;
            /* Grow with what arrives, not with what the header claims. */
            c->body_cap = c->body_len < READ_CHUNK ? c->body_len : READ_CHUNK;
            c->body = dj_malloc(c->body_cap ? c->body_cap : 1);
            if (!c->body) {
                send_error(c, c->h.request_id, 0, dj_fail(DJ_ENOMEM, "out of memory"), true);
                return;
            }
        }
        uint64_t want = c->body_len - c->body_got;
        if (c->h.payload_len && !c->payload_checked && c->body_got < c->h.meta_len)
            want = c->h.meta_len - c->body_got; /* the metadata first: it bounds the payload */
        size_t k = want < n ? (size_t)want : n;
        if (c->body_got + k > c->body_cap) {
            uint64_t cap = c->body_cap * 2;
            if (cap < c->body_got + k) cap = c->body_got + k;
            if (cap > c->body_len) cap = c->body_len;
            uint8_t *nb = dj_realloc(c->body, cap);
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
        if (c->h.payload_len && !c->payload_checked && c->body_got == c->h.meta_len) {
            if (!step_payload_ok(c)) return;
            c->payload_checked = true;
        }
        if (c->body_got == c->body_len) {
            c->hdr_got = 0;
            handle_frame(c);
            if (n && !c->closing && !may_read(c)) {
                uint8_t *r = dj_malloc(n);
                if (!r) {
                    conn_close(c);
                    return;
                }
                memcpy(r, p, n);
                free(c->rest);
                c->rest = r;
                c->rest_len = n;
                return;
            }
        }
    }
}

/* Read when the limits allow (bytes held back first), stop when they do not. */
static void conn_pump(dj__conn *c) {
    if (c->portal || c->closing || uv_is_closing(&c->u.handle)) return;
    while (c->rest && may_read(c)) {
        uint8_t *r = c->rest;
        size_t n = c->rest_len;
        c->rest = NULL;
        c->rest_len = 0;
        feed_bytes(c, r, n);
        free(r);
    }
    const bool want = !c->rest && may_read(c);
    if (want && !c->reading) {
        if (uv_read_start(&c->u.stream, on_alloc, on_read) == 0) c->reading = true;
    } else if (!want && c->reading) {
        uv_read_stop(&c->u.stream);
        c->reading = false;
    }
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    dj__conn *c = st->data;
    (void)buf;
    if (nread < 0) {
        if (nread != UV_EOF) DJ_LOG(INFO, "conn=%llu read: %s", (unsigned long long)c->id, uv_strerror((int)nread));
        conn_close(c);
        return;
    }
    if (nread > 0) c->t_active_ms = dj__clock_ms(c->srv);
    feed_bytes(c, (const uint8_t *)c->rbuf, (size_t)nread);
    conn_pump(c);
}

static void free_on_close(uv_handle_t *h) { free(h->data); }

/* The failed-HELLO key of a peer: its IPv4 address, its IPv6 /64, 1 for a
 * unix socket; *local says whether it is a loopback (or unix) peer. */
static uint64_t peer_key(dj__conn *c, bool *local) {
    *local = c->unix_sock;
    if (c->unix_sock) return 1;
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(&c->u.tcp, (struct sockaddr *)&ss, &len) != 0) return 0;
    if (ss.ss_family == AF_INET) {
        const uint32_t a = ntohl(((const struct sockaddr_in *)&ss)->sin_addr.s_addr);
        *local = (a >> 24) == 127;
        return (uint64_t)0xffff << 32 | a;
    }
    if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&ss;
        const uint8_t *b = in6->sin6_addr.s6_addr;
        static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        if (!memcmp(b, v4mapped, 12)) {
            *local = b[12] == 127;
            return (uint64_t)0xffff << 32 | (uint32_t)b[12] << 24 | (uint32_t)b[13] << 16 | (uint32_t)b[14] << 8 | b[15];
        }
        *local = IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
        uint64_t k = 0;
        for (int i = 0; i < 8; i++) k = k << 8 | b[i];
        return k | (uint64_t)1 << 63;
    }
    return 0;
}

static void on_connection(uv_stream_t *server, int status);

static void on_refuse_closed(uv_handle_t *h) {
    dj__server *s = h->data;
    s->refuse_busy = false;
    if (s->accept_stalled && !s->stopping) {
        s->accept_stalled = false;
        on_connection((uv_stream_t *)&s->listener, 0);
    }
}

/* The pending connection accepted and closed at once, with no memory of its
 * own (see dj__server.refuse); while refuse is still closing, once it closed. */
static void refuse_pending(dj__server *s, uv_stream_t *server) {
    DJ_LOG(WARN, "a connection refused: out of memory");
    if (s->refuse_busy) {
        s->accept_stalled = true;
        return;
    }
    int rc = s->is_unix ? uv_pipe_init(&s->loop, &s->refuse.pipe, 0) : uv_tcp_init(&s->loop, &s->refuse.tcp);
    if (rc < 0) return; /* no handle to accept into: libuv keeps the connection pending */
    s->refuse.handle.data = s;
    s->refuse_busy = true;
    uv_accept(server, (uv_stream_t *)&s->refuse);
    uv_close(&s->refuse.handle, on_refuse_closed);
}

/* Closes the connection that has waited longest for its HELLO, with an
 * EBUSY error. */
static void evict_pending(dj__server *s) {
    dj__conn *old = NULL;
    for (size_t b = 0; b < s->conns.n_buckets; b++)
        for (dj__ment *e = s->conns.b[b]; e; e = e->next) {
            dj__conn *c = e->val;
            if (c->pending && !c->closing && !uv_is_closing(&c->u.handle) && (!old || c->id < old->id)) old = c;
        }
    if (!old) return;
    DJ_LOG(INFO, "conn=%llu closed: %u connections without HELLO (--max-pending-connections)",
           (unsigned long long)old->id, s->n_pending);
    old->pending = false; /* its slot is the new one's now */
    s->n_pending--;
    send_error(old, 0, 0,
               dj_fail(DJ_EBUSY, "closed without HELLO to make room (--max-pending-connections %u)",
                       s->cfg.max_pending),
               true);
}

static void on_connection(uv_stream_t *server, int status) {
    dj__server *s = server->data;
    if (status < 0 || s->stopping) return;
    dj__conn *c = dj_calloc(1, sizeof *c);
    if (!c) {
        refuse_pending(s, server);
        return;
    }
    c->srv = s;
    c->id = ++s->next_conn;
    c->unix_sock = s->is_unix;
    int rc = c->unix_sock ? uv_pipe_init(&s->loop, &c->u.pipe, 0) : uv_tcp_init(&s->loop, &c->u.tcp);
    if (rc < 0) {
        free(c);
        refuse_pending(s, server);
        return;
    }
    c->u.handle.data = c;
    if (dj__map_put(&s->conns, c->id, c) != DJ_OK) {
        uv_close(&c->u.handle, free_on_close);
        refuse_pending(s, server);
        return;
    }
    s->n_conns++;
    pthread_mutex_lock(&s->mu);
    dj_status st = dj__map_put(&s->live_conns, c->id, (void *)1);
    if (st == DJ_OK) s->metrics.connections++;
    pthread_mutex_unlock(&s->mu);
    if (st != DJ_OK) {
        conn_close(c);
        refuse_pending(s, server);
        return;
    }
    if (uv_accept(server, &c->u.stream) < 0) {
        conn_close(c);
        return;
    }
    c->t_open_ms = c->t_active_ms = dj__clock_ms(s);
    bool local = false;
    c->peer = peer_key(c, &local);
    if (!c->unix_sock) uv_tcp_nodelay(&c->u.tcp, 1);
    if (!s->have_token && !local) {
        DJ_LOG(WARN, "conn=%llu refused: not a loopback peer and no --token-file", (unsigned long long)c->id);
        conn_close(c);
        return;
    }
    if (s->n_conns > s->cfg.max_conns && s->n_conns <= s->cfg.max_conns + DJ__REFUSE_SLACK && s->n_pending > 0) {
        evict_pending(s); /* a silent socket makes room: it holds no authenticated client's slot */
    } else if (s->n_conns > s->cfg.max_conns) {
        /* over the cap: a typed answer while a few fds of slack last, else just closed */
        DJ_LOG(WARN, "conn=%llu refused: %u connections open (--max-connections %u)", (unsigned long long)c->id,
               s->n_conns - 1, s->cfg.max_conns);
        if (s->n_conns > s->cfg.max_conns + DJ__REFUSE_SLACK) {
            conn_close(c);
            return;
        }
        send_error(c, 0, 0, dj_fail(DJ_EBUSY, "too many connections (limit %u): retry later", s->cfg.max_conns),
                   true);
        return;
    }
    /* Connections that have not said HELLO take at most max_pending of the
     * slots, so silent sockets never hold the ones of authenticated clients;
     * past it the oldest silent one makes room (a client that says HELLO at
     * once gets in however many silent sockets arrive). */
    if (!c->door) { /* the door says HELLO at once */
        if (s->n_pending >= s->cfg.max_pending) evict_pending(s);
        c->pending = true; /* not yet counted by the over-the-cap eviction above */
        s->n_pending++;
    }
    DJ_LOG(INFO, "conn=%llu accepted", (unsigned long long)c->id);
    conn_pump(c);
}

/* A portal's connection (submit.h): HELLO done for tk as do_hello does it
 * (the per-token connection cap included); no socket, no peer record. */
dj__conn *dj__conn_portal(dj__server *s, dj__portal *p, const dj__token *tk, dj_status *st) {
    *st = DJ_OK;
    if (s->stopping) {
        *st = dj_fail(DJ_EIO, "djinnd is stopping");
        return NULL;
    }
    if (s->have_token) {
        uint32_t n_same = 0;
        for (size_t b = 0; tk && b < s->conns.n_buckets; b++)
            for (dj__ment *e = s->conns.b[b]; e; e = e->next) {
                const dj__conn *o = e->val;
                n_same += o->hello && !o->closing && o->tenant == tk->tenant;
            }
        if (!tk || n_same >= s->cfg.max_conns_token) {
            *st = !tk ? dj_fail(DJ_EINVAL, "a portal needs a token (--token-file is set)")
                      : dj_fail(DJ_EQUOTA, "this token has %u connections open (--max-connections-per-token %u)",
                                n_same, s->cfg.max_conns_token);
            return NULL;
        }
    }
    dj__conn *c = dj_calloc(1, sizeof *c);
    if (!c) {
        *st = dj_fail(DJ_ENOMEM, "out of memory");
        return NULL;
    }
    c->srv = s;
    c->id = ++s->next_conn;
    c->portal = p;
    c->door = c->unix_sock = true;
    c->hello = true;
    if (s->have_token) {
        c->tenant = tk->tenant;
        c->admin = tk->admin;
        c->qos_mask = tk->qos_mask;
        memcpy(c->cache_salt, tk->cache_salt, sizeof c->cache_salt);
    } else {
        c->tenant = DJ__TENANT_CONN(c->id);
        c->admin = s->cfg.local_admin; /* the door serves loopback peers only without a token file */
        c->qos_mask = (1u << DJ_QOS_COUNT) - 1;
    }
    c->t_open_ms = c->t_active_ms = dj__clock_ms(s);
    pthread_mutex_lock(&s->mu);
    *st = dj__map_put(&s->live_conns, c->id, (void *)1);
    if (*st == DJ_OK) s->metrics.connections++;
    pthread_mutex_unlock(&s->mu);
    if (*st == DJ_OK && (*st = dj__map_put(&s->conns, c->id, c)) != DJ_OK) {
        pthread_mutex_lock(&s->mu);
        dj__map_del(&s->live_conns, c->id);
        s->metrics.connections--;
        pthread_mutex_unlock(&s->mu);
    }
    if (*st != DJ_OK) {
        free(c);
        return NULL;
    }
    DJ_LOG(INFO, "conn=%llu opened in-process (the HTTP door)", (unsigned long long)c->id);
    return c;
}

void dj__conn_portal_close(dj__conn *c) { conn_gone(c); }

void dj__portals_close_conns(dj__server *s) {
    for (size_t b = 0; b < s->conns.n_buckets; b++) {
        dj__ment *e = s->conns.b[b];
        while (e) {
            dj__conn *c = e->val;
            e = e->next;
            if (c->portal) conn_gone(c);
        }
    }
}

/* Whether the peer of a connection that is not being read (a held-back
 * HELLO) has closed it. */
static bool peer_gone(dj__conn *c) {
    uv_os_fd_t fd;
    if (uv_fileno(&c->u.handle, &fd) != 0) return false;
    char b;
    const ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Every 100 ms: HELLO and idle timeouts, HELLOs whose turn came, and old
 * failed-HELLO records forgotten. */
static void on_tick(uv_timer_t *t) {
    dj__server *s = t->data;
    const uint64_t now = dj__now_ms(), clk = dj__clock_ms(s); /* the timeouts judge silence by the daemon's clock */
    const dj__config *cfg = &s->cfg;
    for (size_t b = 0; b < s->conns.n_buckets; b++)
        for (dj__ment *e = s->conns.b[b]; e; e = e->next) {
            dj__conn *c = e->val;
            if (c->portal || c->closing || uv_is_closing(&c->u.handle)) continue;
            if (c->deferred && peer_gone(c)) { /* it holds a waiting turn of its address: give it back */
                conn_close(c);
            } else if (c->deferred && now >= c->defer_until) {
                c->deferred = false;
                c->h = c->defer_h;
                c->body = c->defer_body;
                c->defer_body = NULL;
                handle_frame(c);
                conn_pump(c);
            } else if (!c->hello && !c->deferred && clk - c->t_open_ms > cfg->hello_timeout_ms) {
                send_error(c, 0, 0, dj_fail(DJ_EINVAL, "no HELLO within %u ms", cfg->hello_timeout_ms), true);
            } else if (c->hello && cfg->idle_timeout_ms && !c->inflight && !c->writes &&
                       clk - c->t_active_ms > cfg->idle_timeout_ms) {
                send_error(c, 0, 0, dj_fail(DJ_EINVAL, "idle for %u ms: closing", cfg->idle_timeout_ms), true);
            }
        }
    /* leases over: sessions with no request in flight and no word from
     * their client for --lease-ms (orphans included) go */
    for (size_t b = 0; b < s->leases.n_buckets; b++) {
        dj__ment *e = s->leases.b[b];
        while (e) {
            dj__lease *l = e->val;
            e = e->next;
            if (l->inflight || clk <= l->lease_deadline_ms) continue;
            const dj__conn *lc = l->conn ? dj__map_get(&s->conns, l->conn) : NULL;
            if (lc && lc->portal) { /* a portal's: its holder is in this process, the lease holds while it is open */
                l->lease_deadline_ms = clk + s->cfg.lease_ms;
                continue;
            }
            pthread_mutex_lock(&s->metrics.mu);
            s->metrics.lease_expiries++;
            pthread_mutex_unlock(&s->metrics.mu);
            dj__gone_lease(s, l->conn, l->id); /* a later request naming it says so */
            lease_drop(s, l, DJ_ENOTFOUND, "session lease expired");
        }
    }
    static uint64_t last_sweep;
    if (now - last_sweep > 10000) {
        dj__peers_sweep(&s->peers, now);
        last_sweep = now;
    }
}

/* ---- worker -> loop ---- */

/* A request on a session was answered (its last frame): its lease runs
 * again from now, however long the request took. */
static void lease_answered(dj__server *s, uint64_t conn, uint64_t sess, bool counted) {
    dj__lease *l = counted ? dj__map_get(&s->leases, sess) : NULL;
    if (!l || l->conn != conn) return; /* gone, or orphaned since (its count was reset) */
    if (l->inflight) l->inflight--;
    l->lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms;
}

/* A SESSION_OPEN's reply: the I/O side's record of the session. False when
 * there is none (the connection went, or no memory): the worker was told to
 * release the session again. */
static bool session_opened(dj__server *s, dj__conn *c, dj__event *e) {
    dj__rep_open *o = &e->u.open;
    dj__lease *l = c ? dj_calloc(1, sizeof *l) : NULL;
    if (l) {
        l->id = o->session;
        l->conn = c->id;
        l->tenant = c->tenant;
        l->qos = o->qos;
        l->lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms;
        l->reattach = o->has_secret;
        l->secret = o->secret;
        snprintf(l->model, sizeof l->model, "%s", o->model);
        l->max_ctx = o->max_ctx;
        l->hidden = o->hidden;
        l->drop_msg = o->drop_msg;
        l->orphan_msg = o->orphan_msg;
        if (dj__map_put(&s->leases, l->id, l) == DJ_OK) {
            o->drop_msg = o->orphan_msg = NULL; /* the lease's now */
            return true;
        }
        free(l);
    }
    dj__job *m = o->drop_msg;
    o->drop_msg = NULL;
    m->ctl.why = DJ_ENOTFOUND;
    m->ctl.why_msg = c ? "out of memory for the session's record" : "connection closed before the session opened";
    dj__enqueue(s, m);
    return false;
}

/* A session a restart restored (the worker's SESSION_IMPORT of conn 0,
 * worker.c restore_sessions): its lease, orphaned, waiting for its client's
 * SESSION_ATTACH until the lease ends. */
static void session_restored(dj__server *s, dj__event *e) {
    dj__rep_open *o = &e->u.open;
    dj__lease *l = dj_calloc(1, sizeof *l);
    if (l) {
        *l = (dj__lease){.id = o->session, .tenant = o->tenant, .qos = o->qos, .reattach = true, .orphan = true,
                         .secret = o->secret, .max_ctx = o->max_ctx, .hidden = o->hidden, .pos = o->pos,
                         .lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms, .drop_msg = o->drop_msg};
        snprintf(l->model, sizeof l->model, "%s", o->model);
        if (dj__map_put(&s->leases, l->id, l) == DJ_OK) {
            o->drop_msg = NULL; /* the lease's now; the orphan message is not needed (an attach makes one) */
            return;
        }
        free(l);
    }
    dj__job *m = o->drop_msg;
    o->drop_msg = NULL;
    m->ctl.why = DJ_ENOMEM;
    m->ctl.why_msg = "out of memory for the restored session's record";
    dj__enqueue(s, m);
}

/* STATS: what of the snapshot the I/O side keeps (leases, handles, connections). */
static void stats_fill(dj__server *s, dj__stats_snap *st) {
    const uint64_t clk = dj__clock_ms(s);
    for (size_t i = 0; i < st->n_sessions; i++) {
        dj__stats_sess *ss = &st->sessions[i];
        const dj__lease *l = dj__map_get(&s->leases, ss->id);
        ss->lease_left_ms = l && l->lease_deadline_ms > clk ? l->lease_deadline_ms - clk : 0;
        if (l) ss->paused = l->paused;
    }
    st->handles = s->handles.n;
    if (st->admin) st->capture = s->capture;
    pthread_mutex_lock(&s->mu);
    st->connections = s->live_conns.n;
    pthread_mutex_unlock(&s->mu);
}

/* The answers the worker lost for want of memory (dj__server.lost), after
 * the frames it posted before them. */
static void answer_lost(dj__server *s) {
    pthread_mutex_lock(&s->out_mu);
    const uint32_t n = s->n_lost;
    const bool overflow = s->lost_overflow;
    uint64_t conn[DJ__LOST_MAX], req[DJ__LOST_MAX], sess[DJ__LOST_MAX];
    bool counted[DJ__LOST_MAX], opening[DJ__LOST_MAX];
    uint32_t quota[DJ__LOST_MAX];
    uint16_t type[DJ__LOST_MAX];
    for (uint32_t i = 0; i < n; i++) {
        type[i] = s->lost[i].type;
        conn[i] = s->lost[i].conn;
        req[i] = s->lost[i].req;
        sess[i] = s->lost[i].sess;
        counted[i] = s->lost[i].counted;
        opening[i] = s->lost[i].type == DJ_MSG_SESSION_OPEN;
        quota[i] = s->lost[i].handle_quota;
    }
    s->n_lost = 0;
    s->lost_overflow = false;
    pthread_mutex_unlock(&s->out_mu);
    for (uint32_t i = 0; i < n; i++) {
        dj__conn *c = dj__map_get(&s->conns, conn[i]);
        lease_answered(s, conn[i], sess[i], counted[i]);
        if (c && opening[i] && c->opening) c->opening--;
        if (c) c->handles_due -= quota[i] < c->handles_due ? quota[i] : c->handles_due;
        if (!c || c->closing || uv_is_closing(&c->u.handle)) continue;
        if (c->inflight) c->inflight--;
        if (c->portal) { /* typed: its user waits for this answer */
            dj__event *e = dj__event_error(c->id, type[i], req[i], DJ_ENOMEM, "out of memory building the answer", false);
            if (e) dj__portal_deliver(c->portal, e);
            else conn_close(c);
            continue;
        }
        dj__out *o = dj__out_error(c->id, req[i], DJ_ENOMEM, "out of memory building the answer", false);
        if (!o) {
            conn_close(c);
            continue;
        }
        send_out(c, o);
        conn_pump(c);
    }
    if (overflow)
        for (size_t b = 0; b < s->conns.n_buckets; b++)
            for (dj__ment *e = s->conns.b[b]; e; e = e->next) {
                dj__conn *c = e->val;
                if (c->inflight && !c->closing && !uv_is_closing(&c->u.handle)) conn_close(c);
            }
}

/* The worker's mailbox to the I/O side: its typed events, encoded into
 * frames here (encode.c) and sent. */
static void on_wake(uv_async_t *a) {
    dj__server *s = a->data;
    pthread_mutex_lock(&s->out_mu);
    dj__event *e = s->ev_head;
    s->ev_head = s->ev_tail = NULL;
    pthread_mutex_unlock(&s->out_mu);
    while (e) {
        dj__event *next = e->next;
        dj__conn *c = dj__map_get(&s->conns, e->conn);
        dj__lease *l = e->session ? dj__map_get(&s->leases, e->session) : NULL;
        if (l && e->has_state) {
            l->pos = e->pos;
            l->swapped = e->swapped;
        }
        if (e->kind == DJ__EV_REPLY && e->req_type == DJ_MSG_SESSION_IMPORT && !e->conn) { /* a restart's */
            session_restored(s, e);
            dj__event_free(e);
            e = next;
            continue;
        }
        const bool last = e->kind == DJ__EV_REPLY || e->kind == DJ__EV_ERROR || e->kind == DJ__EV_DONE;
        if (last) lease_answered(s, e->conn, e->session, e->counted);
        if (last && dj__req_opens(e->req_type) && c && c->opening) c->opening--;
        if (last && c) c->handles_due -= e->handle_quota < c->handles_due ? e->handle_quota : c->handles_due;
        if (e->kind == DJ__EV_REPLY && (e->req_type == DJ_MSG_STEP || e->req_type == DJ_MSG_GRAPH_RUN ||
                                        e->req_type == DJ_MSG_SESSION_EXPORT) && c) {
            const dj_status st = e->req_type == DJ_MSG_STEP         ? step_file(s, e)
                                 : e->req_type == DJ_MSG_GRAPH_RUN ? graph_file(s, e)
                                                                   : export_file(s, e);
            if (st != DJ_OK) { /* the step ran; its handles could not be kept */
                dj__event *err = dj__event_error(e->conn, e->req_type, e->req, st, dj_last_error(), false);
                if (!err) {
                    if (c->inflight) c->inflight--;
                    conn_close(c);
                    dj__event_free(e);
                    e = next;
                    continue;
                }
                dj__event_free(e);
                e = err;
            }
        }
        if (e->kind == DJ__EV_REPLY && dj__req_opens(e->req_type) && !session_opened(s, c, e) && c) {
            dj__event *err = dj__event_error(e->conn, e->req_type, e->req, DJ_ENOMEM,
                                             "out of memory for the session's record", false);
            if (err) err->next = e->next;
            dj__event_free(e);
            e = err;
            if (!e) { /* not even that: the client would wait for ever */
                if (c->inflight) c->inflight--;
                conn_close(c);
                e = next;
                continue;
            }
        }
        if (e->kind == DJ__EV_REPLY && e->req_type == DJ_MSG_SESSION_CLOSE && l && l->conn == e->conn) {
            dj__map_del(&s->leases, l->id); /* the worker released it */
            handles_drop_session(s, l->id);
            lease_free(l);
        }
        if (e->kind == DJ__EV_REPLY && e->req_type == DJ_MSG_STATS) stats_fill(s, &e->u.stats);
        if (e->kind == DJ__EV_STATE) {
            /* no frame: the session's state only, or its end (the worker closed it) */
            if (e->gone && l) lease_drop(s, l, DJ_EIO, "the session's KV on disk was lost");
        } else if (e->kind == DJ__EV_CREDIT) { /* no frame: prompt bytes tokenized */
            if (c) {
                c->prompt_bytes -= e->credit < c->prompt_bytes ? e->credit : c->prompt_bytes;
                conn_pump(c);
            }
        } else if (c && c->portal) { /* typed, into the portal's mailbox: no frame */
            if (e->kind != DJ__EV_TOKEN && c->inflight) c->inflight--;
            dj__portal_deliver(c->portal, e);
            e = next;
            continue;
        } else if (c && !uv_is_closing(&c->u.handle)) {
            if (e->kind != DJ__EV_TOKEN && c->inflight) c->inflight--;
            dj__out *o = dj__event_encode(e);
            if (!o) o = dj__out_error(c->id, e->req, DJ_ENOMEM, "out of memory building the answer", false);
            if (o) send_out(c, o);
            else conn_close(c);
            conn_pump(c);
        }
        dj__event_free(e);
        e = next;
    }
    answer_lost(s);
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

static void stop_now(dj__server *s);

/* Draining (SIGTERM with --state-dir): the stop comes once the worker holds
 * no request (every generation taken has ended) or --drain-s passed. */
static void on_drain_tick(uv_timer_t *t) {
    dj__server *s = t->data;
    pthread_mutex_lock(&s->mu);
    size_t queued = s->tokq.n;
    for (int q = 0; q < DJ_QOS_COUNT; q++) queued += s->newq[q].n;
    pthread_mutex_unlock(&s->mu);
    const uint32_t held = s->n_held;
    if (held + queued && dj__now_ms() < s->drain_until_ms) return;
    if (held + queued) DJ_LOG(WARN, "djinnd: --drain-s passed with %u requests not done: they are cut", held);
    stop_now(s);
}

static void on_signal(uv_signal_t *sig, int signum) {
    dj__server *s = sig->data;
    if (signum == SIGTERM && s->cfg.state_dir && s->cfg.drain_s && !s->draining) {
        /* new work is refused (server.c's dispatch), the taken ends, then the sessions are written */
        DJ_LOG(WARN, "djinnd: SIGTERM: draining (at most %u s), then the sessions go to %s", s->cfg.drain_s,
               s->cfg.state_dir);
        s->draining = true;
        s->drain_until_ms = dj__now_ms() + (uint64_t)s->cfg.drain_s * 1000;
        if (!uv_is_closing((uv_handle_t *)&s->listener)) uv_close((uv_handle_t *)&s->listener, NULL);
        uv_timer_init(&s->loop, &s->drain_timer);
        s->drain_timer.data = s;
        uv_timer_start(&s->drain_timer, on_drain_tick, 0, 20);
        return;
    }
    DJ_LOG(WARN, "djinnd: signal %d, shutting down", signum);
    stop_now(s);
}

static void stop_now(dj__server *s) {
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&s->out_mu); /* the worker reads it when it posts */
    s->stopping = true;
    pthread_mutex_unlock(&s->out_mu);
    pthread_mutex_unlock(&s->mu);
    dj__agent_set_stopping(s->agent);
    dj__worker_stop(s); /* joins: no uv_async_send after this */
    on_wake(&s->wake);  /* flush what the worker produced */
    dj__portals_stop(s); /* the HTTP door's waits end; its connections close */
    uv_walk(&s->loop, close_walk, s);
}

/* ---- setup ---- */

/* Raise the soft fd limit to the hard one and keep --max-connections
 * under it, with DJ__FD_RESERVE fds and /metrics' connections spare. */
static dj_status fit_fd_limit(dj__config *cfg) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return DJ_OK;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = rl;
        want.rlim_cur = rl.rlim_max == RLIM_INFINITY ? 1048576 : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
    }
    /* an HTTP request (and a kept session) holds its own socket and its
     * portal's eventfd (submit.c); portals are none of the connections */
    const uint64_t spare = DJ__FD_RESERVE + DJ__REFUSE_SLACK + (cfg->metrics ? cfg->metrics_conns : 0) +
                           (cfg->http ? 2 * ((uint64_t)cfg->http_conns + 16 + cfg->http_reuse) + cfg->http_unauth : 0);
    const uint64_t avail = rl.rlim_cur > spare ? rl.rlim_cur - spare : 0;
    if (avail < 1)
        return dj_fail(DJ_EINVAL, "the fd limit (%llu) leaves no room for connections (%llu kept spare)",
                       (unsigned long long)rl.rlim_cur, (unsigned long long)spare);
    if (cfg->max_conns > avail) {
        DJ_LOG(WARN, "--max-connections %u lowered to %llu (fd limit %llu)", cfg->max_conns, (unsigned long long)avail,
               (unsigned long long)rl.rlim_cur);
        fprintf(stderr, "djinnd: --max-connections %u lowered to %llu by the fd limit %llu\n", cfg->max_conns,
                (unsigned long long)avail, (unsigned long long)rl.rlim_cur);
        cfg->max_conns = (uint32_t)avail;
    }
    if (cfg->max_pending > cfg->max_conns / 4) {
        const uint32_t p = cfg->max_conns / 4 ? cfg->max_conns / 4 : 1;
        DJ_LOG(INFO, "--max-pending-connections %u lowered to %u (a quarter of --max-connections %u)",
               cfg->max_pending, p, cfg->max_conns);
        cfg->max_pending = p;
    }
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
    unsigned bound_port = 0;
    if (!s->is_unix) {
        struct sockaddr_storage b;
        int bl = sizeof b;
        uv_tcp_getsockname(&s->listener.tcp, (struct sockaddr *)&b, &bl);
        unsigned port = ntohs(b.ss_family == AF_INET ? ((struct sockaddr_in *)&b)->sin_port
                                                     : ((struct sockaddr_in6 *)&b)->sin6_port);
        DJ_LOG(INFO, "djinnd listening on %s (port %u)", s->cfg.listen, port);
        bound_port = port;
    }
    unsigned http_port = 0;
    if (s->cfg.http) { /* its requests enter in-process, through portals (submit.h) */
        dj__http_cfg hc = {.addr = s->cfg.http, .models = s->cfg.models, .auth = s->tokens, .n_auth = s->n_tokens,
                           .max_conns = s->cfg.http_conns, .max_body = s->cfg.http_max_body,
                           .timeout_s = s->cfg.http_timeout_s, .reuse = s->cfg.http_reuse,
                           .header_s = s->cfg.http_header_s, .body_s = s->cfg.http_body_s,
                           .per_addr = s->cfg.http_per_addr, .unauth = s->cfg.http_unauth,
                           .per_token = s->cfg.http_per_token, .hosts = s->cfg.http_hosts,
                           .local_admin = s->cfg.local_admin, .srv = s};
        if ((st = dj__http_start(&hc, &s->http)) != DJ_OK) return st;
        http_port = dj__http_port(s->http);
        DJ_LOG(INFO, "djinnd serving the OpenAI API on %s (port %u)", s->cfg.http, http_port);
    }
    /* the port file: the listener's port (0 for a unix socket), then the HTTP port if any */
    if (s->cfg.port_file) {
        char tmp[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s.tmp", s->cfg.port_file);
        FILE *f = fopen(tmp, "w");
        if (!f) return dj_fail(DJ_EIO, "--port-file %s: %s", s->cfg.port_file, strerror(errno));
        if (!s->is_unix || s->cfg.http) fprintf(f, "%u\n", bound_port);
        if (s->cfg.http) fprintf(f, "%u\n", http_port);
        fclose(f);
        rename(tmp, s->cfg.port_file);
    }
    return DJ_OK;
}

/* libuv's own allocations (its handles' queues, uv_write's buffer lists,
 * its thread pool) through alloc.h, so the fault hook reaches them too. */
static void *uv_malloc_fn(size_t n) { return dj_malloc(n); }
static void *uv_realloc_fn(void *p, size_t n) { return dj_realloc(p, n); }
static void *uv_calloc_fn(size_t n, size_t size) { return dj_calloc(n, size); }
static void uv_free_fn(void *p) { dj_free(p); }

int dj__serve_main(int argc, char **argv) {
    uv_replace_allocator(uv_malloc_fn, uv_realloc_fn, uv_calloc_fn, uv_free_fn); /* before any other uv call */
    dj__server *s = dj_calloc(1, sizeof *s);
    if (!s) return 1;
    int r = dj__parse_args(argc, argv, &s->cfg);
    if (r) {
        free(s);
        return r == 3 ? 0 : r;
    }
    int rc = 1;
    bool loop_ok = false, mu_ok = false;
    dj_status st;
    signal(SIGPIPE, SIG_IGN);
    if (pthread_mutex_init(&s->mu, NULL) || pthread_mutex_init(&s->out_mu, NULL) || pthread_cond_init(&s->cv, NULL) ||
        pthread_mutex_init(&s->metrics.mu, NULL)) {
        fprintf(stderr, "djinnd: cannot create locks\n");
        free(s);
        return 1;
    }
    mu_ok = true;
    if ((st = dj__map_init(&s->conns, 256)) != DJ_OK || (st = dj__map_init(&s->sessions, 1024)) != DJ_OK ||
        (st = dj__map_init(&s->leases, 1024)) != DJ_OK ||
        (st = dj__map_init(&s->handles, 1024)) != DJ_OK || (st = dj__map_init(&s->live_conns, 256)) != DJ_OK ||
        (st = dj__map_init(&s->peers, 256)) != DJ_OK)
        goto fail;
    if (s->cfg.token_file) {
        if ((st = dj__tokens_load(s->cfg.token_file, &s->tokens, &s->n_tokens)) != DJ_OK) goto fail;
        s->have_token = true;
        s->metrics.auth = s->tokens;
        s->metrics.n_auth = s->n_tokens;
    }
    s->metrics.local_admin = s->cfg.local_admin;
    if ((st = fit_fd_limit(&s->cfg)) != DJ_OK) goto fail;
    if ((st = dj__capture_open(s->cfg.weights_bytes, s->cfg.weight_quota_bytes, s->cfg.threads, &s->capture)) != DJ_OK)
        goto fail;
    dj__scrub_set_models(s->cfg.models);
    if (uv_loop_init(&s->loop) < 0) {
        st = dj_fail(DJ_EIO, "uv_loop_init failed");
        goto fail;
    }
    loop_ok = true;
    uv_async_init(&s->loop, &s->wake, on_wake);
    s->wake.data = s;
    if ((st = dj__portals_init(s)) != DJ_OK) goto fail_loop;
    uv_signal_init(&s->loop, &s->sigint);
    uv_signal_init(&s->loop, &s->sigterm);
    s->sigint.data = s->sigterm.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    if ((st = dj__reload_init(s, argc, argv)) != DJ_OK) goto fail_loop; /* SIGHUP; the store and log level */
    s->clock_seen_ms = dj__now_ms();
    atomic_init(&s->clock_ms, s->clock_seen_ms);
    uv_check_init(&s->loop, &s->clock_check);
    s->clock_check.data = s;
    uv_check_start(&s->clock_check, on_clock);
    uv_timer_init(&s->loop, &s->tick);
    s->tick.data = s;
    uv_timer_start(&s->tick, on_tick, 100, 100);
    if ((st = dj__worker_start(s)) != DJ_OK) goto fail_loop;
    on_wake(&s->wake); /* the leases of sessions a restart restored, before any client is read */
    if (s->cfg.metrics && (st = dj__metrics_start(&s->metrics, s->cfg.metrics, s->cfg.metrics_conns)) != DJ_OK) goto fail_loop;
    if (s->cfg.agent_check && (st = dj__agent_start(s->cfg.agent_check, &s->metrics, &s->agent)) != DJ_OK) goto fail_loop;
    if ((st = listen_on(s)) != DJ_OK) goto fail_loop;
    dj__log_always(DJ_LOG_INFO, __func__, "djinnd: serving models from %s on %s (lease %u ms)", s->cfg.models,
                   s->cfg.listen, s->cfg.lease_ms);
    s->clock_seen_ms = dj__now_ms(); /* the start-up was no stall */
    dj__sd_notify("READY=1\nSTATUS=serving"); /* systemd's Type=notify */
    uv_run(&s->loop, UV_RUN_DEFAULT);
    dj__sd_notify("STOPPING=1");
    rc = 0;
    goto done;
fail_loop:
    dj__log_always(DJ_LOG_ERROR, __func__, "djinnd: %s: %s", dj_strerror(st), dj_last_error());
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&s->out_mu); /* the worker reads it when it posts */
    s->stopping = true;
    pthread_mutex_unlock(&s->out_mu);
    pthread_mutex_unlock(&s->mu);
    uv_walk(&s->loop, close_walk, s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    goto done;
fail:
    dj__log_always(DJ_LOG_ERROR, __func__, "djinnd: %s: %s", dj_strerror(st), dj_last_error());
done:
    pthread_mutex_lock(&s->mu);
    pthread_mutex_lock(&s->out_mu); /* the worker reads it when it posts */
    s->stopping = true;
    pthread_mutex_unlock(&s->out_mu);
    pthread_mutex_unlock(&s->mu);
    dj__metrics_stop(&s->metrics);
    dj__agent_stop(s->agent); /* after the loop: it answered "maint" while the daemon stopped */
    s->agent = NULL;
    if (loop_ok) dj__portals_stop(s); /* (done already when a signal stopped the loop) */
    dj__http_stop(s->http); /* its requests' portals are closed: their waits end */
    s->http = NULL;
    dj__worker_stop(s);
    if (loop_ok) {
        uv_walk(&s->loop, close_walk, s);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
    }
    dj__reload_fini(s);
    dj__config_free(&s->cfg);
    if (s->is_unix) unlink(s->cfg.listen + 5);
    dj__portals_fini(s);
    for (int q = 0; q < DJ_QOS_COUNT; q++) /* messages posted after the worker stopped (connections' closes) */
        for (dj__job *j = s->newq[q].head, *n; j; j = n) {
            n = j->next;
            dj__job_free(j);
        }
    for (dj__event *e = s->ev_head, *n; e; e = n) {
        n = e->next;
        dj__event_free(e);
    }
    dj__map_destroy(&s->conns);
    dj__map_destroy(&s->sessions);
    for (size_t b = 0; s->leases.b && b < s->leases.n_buckets; b++)
        for (dj__ment *e = s->leases.b[b]; e; e = e->next) lease_free(e->val);
    dj__map_destroy(&s->leases);
    for (size_t b = 0; s->handles.b && b < s->handles.n_buckets; b++)
        for (dj__ment *e = s->handles.b[b]; e; e = e->next) dj__handle_unref(s, e->val);
    dj__map_destroy(&s->handles);
    dj__map_destroy(&s->live_conns);
    for (size_t b = 0; s->peers.b && b < s->peers.n_buckets; b++)
        for (dj__ment *e = s->peers.b[b]; e; e = e->next) free(e->val);
    dj__map_destroy(&s->peers);
    free(s->tokens);
    dj__capture_close(s->capture);
    if (mu_ok) {
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->out_mu);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->metrics.mu);
    }
    free(s);
    return rc;
}
