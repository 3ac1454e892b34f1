/* client.c: libdjinn - a connection to djinnd with a reader thread that
 * routes replies to waiting callers by request id, and a heartbeat thread
 * that keeps the connection's session leases alive. */
#define _GNU_SOURCE
#include "djinn/client.h"
#include "djinn/version.h"
#include "djinn/alloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <time.h>
#include <unistd.h>

#include "proto/proto_impl.h"
#include "proto/sample_wire.h"

typedef struct frame {
    struct frame *next;
    dj_frame_header h;
    uint8_t *body;  /* meta (+ payload unless it went to the sink) */
    bool sunk;      /* payload was read into the caller's buffer */
} frame;

typedef struct pending {
    struct pending *next;
    uint64_t id;
    frame *head, *tail;
    bool final;     /* REPLY, DONE or ERROR arrived */
    bool discard;   /* nobody waits: drop frames (heartbeats) */
    void *sink;     /* payload destination for a REPLY, [sink_cap] */
    size_t sink_cap;
    pthread_cond_t cv;
} pending;

struct dj_client {
    int fd;
    pthread_mutex_t mu;  /* pending list, dead, heartbeat settings */
    pthread_mutex_t wmu; /* one frame at a time on the socket */
    pthread_cond_t hb_cv;
    pthread_t reader, hb;
    bool reader_started, hb_started, stop, dead;
    char dead_msg[256];
    uint64_t next_id;
    pending *pend;
    uint32_t lease_ms, hb_period_ms;
};

/* ---- socket I/O ---- */

static dj_status write_all(dj_client_t *c, struct iovec *iov, int n) {
    pthread_mutex_lock(&c->wmu);
    dj_status st = DJ_OK;
    while (n > 0) {
        struct msghdr mh;
        memset(&mh, 0, sizeof mh);
        mh.msg_iov = iov;
        mh.msg_iovlen = (size_t)n;
        ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            st = dj_fail(DJ_EIO, "send to djinnd: %s", strerror(errno));
            break;
        }
        size_t left = (size_t)k;
        while (n > 0 && left >= iov->iov_len) {
            left -= iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + left;
            iov->iov_len -= left;
        }
    }
    pthread_mutex_unlock(&c->wmu);
    return st;
}

static int read_full(int fd, void *buf, size_t n) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k == 0) return -1;
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int skip_bytes(int fd, uint64_t n) {
    char buf[16384];
    while (n > 0) {
        size_t k = n < sizeof buf ? (size_t)n : sizeof buf;
        if (read_full(fd, buf, k)) return -1;
        n -= k;
    }
    return 0;
}

static void frame_free(frame *f) {
    if (!f) return;
    free(f->body);
    free(f);
}

static void pending_free(pending *p) {
    for (frame *f = p->head, *n; f; f = n) {
        n = f->next;
        frame_free(f);
    }
    pthread_cond_destroy(&p->cv);
    free(p);
}

static pending *find_pending(dj_client_t *c, uint64_t id) {
    for (pending *p = c->pend; p; p = p->next)
        if (p->id == id) return p;
    return NULL;
}

static void unlink_pending(dj_client_t *c, pending *p) {
    for (pending **q = &c->pend; *q; q = &(*q)->next)
        if (*q == p) {
            *q = p->next;
            return;
        }
}

static void mark_dead(dj_client_t *c, const char *why) {
    pthread_mutex_lock(&c->mu);
    if (!c->dead) snprintf(c->dead_msg, sizeof c->dead_msg, "%s", why);
    c->dead = true;
    for (pending *p = c->pend; p; p = p->next) pthread_cond_broadcast(&p->cv);
    pthread_cond_broadcast(&c->hb_cv);
    pthread_mutex_unlock(&c->mu);
}

static void *reader_main(void *arg) {
    dj_client_t *c = arg;
    for (;;) {
        uint8_t hb[DJ_FRAME_HEADER_BYTES];
        if (read_full(c->fd, hb, sizeof hb)) {
            mark_dead(c, "connection closed by djinnd");
            return NULL;
        }
        frame *f = dj_calloc(1, sizeof *f);
        if (!f) {
            mark_dead(c, "out of memory");
            return NULL;
        }
        if (dj_frame_header_decode(hb, DJ_PROTO_MAX_REPLY_PAYLOAD, &f->h) != DJ_OK) {
            char msg[256];
            if (!memcmp(hb, "HTTP/", 5)) /* an HTTP server answered HELLO's line end (its `probe`) */
                snprintf(msg, sizeof msg, "this is an HTTP port (djinnd's --http?), not djinnd's binary protocol: "
                                          "connect to the port of djinnd's --listen");
            else
                snprintf(msg, sizeof msg, "bad frame from djinnd: %s", dj_last_error());
            free(f);
            mark_dead(c, msg);
            return NULL;
        }
        pthread_mutex_lock(&c->mu);
        pending *p = find_pending(c, f->h.request_id);
        const bool to_sink = p && p->sink && f->h.type == DJ_MSG_REPLY && f->h.payload_len <= p->sink_cap;
        void *sink = to_sink ? p->sink : NULL;
        pthread_mutex_unlock(&c->mu);
        /* The waiting caller is blocked until `final`, so its sink stays valid. */
        const uint64_t keep = f->h.meta_len + (to_sink ? 0 : f->h.payload_len);
        f->body = dj_malloc(keep ? (size_t)keep : 1);
        if (!f->body || read_full(c->fd, f->body, (size_t)f->h.meta_len) ||
            (to_sink ? read_full(c->fd, sink, (size_t)f->h.payload_len)
                     : read_full(c->fd, f->body + f->h.meta_len, (size_t)f->h.payload_len))) {
            frame_free(f);
            mark_dead(c, "connection closed by djinnd in the middle of a frame");
            return NULL;
        }
        f->sunk = to_sink;
        const bool final = f->h.type == DJ_MSG_REPLY || f->h.type == DJ_MSG_DONE || f->h.type == DJ_MSG_ERROR;
        pthread_mutex_lock(&c->mu);
        p = find_pending(c, f->h.request_id);
        if (!p) {
            frame_free(f); /* an answer nobody waits for */
        } else if (p->discard) {
            frame_free(f);
            if (final) {
                unlink_pending(c, p);
                pending_free(p);
            }
        } else {
            if (p->tail) p->tail->next = f;
            else p->head = f;
            p->tail = f;
            if (final) p->final = true;
            pthread_cond_broadcast(&p->cv);
        }
        pthread_mutex_unlock(&c->mu);
    }
    (void)skip_bytes;
    return NULL;
}

/* ---- requests ---- */

/* Register a pending entry and send the frame. w (may be NULL) is consumed. */
static dj_status begin(dj_client_t *c, uint16_t type, dj__mw *w, const void *payload, size_t plen, void *sink,
                       size_t sink_cap, bool discard, pending **out) {
    *out = NULL;
    dj__mw empty;
    if (!w) {
        dj__mw_init(&empty);
        w = &empty;
    }
    dj__mw_finish(w);
    if (!w->sb.data) {
        dj__mw_destroy(w);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    pending *p = dj_calloc(1, sizeof *p);
    if (!p) {
        dj__mw_destroy(w);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    pthread_cond_init(&p->cv, NULL);
    p->sink = sink;
    p->sink_cap = sink_cap;
    p->discard = discard;
    pthread_mutex_lock(&c->mu);
    if (c->dead) {
        pthread_mutex_unlock(&c->mu);
        pending_free(p);
        dj__mw_destroy(w);
        return dj_fail(DJ_EIO, "djinnd connection: %s", c->dead_msg);
    }
    p->id = ++c->next_id;
    p->next = c->pend;
    c->pend = p;
    pthread_mutex_unlock(&c->mu);
    dj_frame_header h = {.magic = DJ_PROTO_MAGIC, .version = DJ_PROTO_VERSION, .type = type,
                         .meta_len = (uint32_t)w->sb.size, .request_id = p->id, .payload_len = plen};
    uint8_t hb[DJ_FRAME_HEADER_BYTES];
    dj_frame_header_encode(&h, hb);
    struct iovec iov[3] = {{hb, sizeof hb}, {w->sb.data, w->sb.size}, {(void *)payload, plen}};
    dj_status st = write_all(c, iov, plen ? 3 : 2);
    dj__mw_destroy(w);
    if (st != DJ_OK) {
        pthread_mutex_lock(&c->mu);
        unlink_pending(c, p);
        pthread_mutex_unlock(&c->mu);
        pending_free(p);
        return st;
    }
    *out = p;
    return DJ_OK;
}

/* Next frame for p (blocking); DJ_EIO if the connection died first. */
static dj_status next_frame(dj_client_t *c, pending *p, frame **out) {
    pthread_mutex_lock(&c->mu);
    while (!p->head && !c->dead) pthread_cond_wait(&p->cv, &c->mu);
    frame *f = p->head;
    if (f) {
        p->head = f->next;
        if (!p->head) p->tail = NULL;
    }
    const bool dead = c->dead;
    pthread_mutex_unlock(&c->mu);
    if (!f) return dj_fail(DJ_EIO, "djinnd connection: %s", dead ? c->dead_msg : "?");
    *out = f;
    return DJ_OK;
}

static void end(dj_client_t *c, pending *p) {
    pthread_mutex_lock(&c->mu);
    unlink_pending(c, p);
    pthread_mutex_unlock(&c->mu);
    pending_free(p);
}

/* An ERROR frame's status and message, as dj_fail. */
static dj_status error_of(const frame *f) {
    dj__meta m;
    if (dj__meta_parse(&m, f->body, f->h.meta_len) != DJ_OK) return dj_fail(DJ_EFORMAT, "unreadable ERROR frame");
    int64_t code = DJ_EINTERNAL;
    char msg[512] = "";
    dj__meta_i64(&m, "status", false, &code);
    dj__meta_strcpy(&m, "message", false, msg, sizeof msg);
    dj__meta_destroy(&m);
    if (code >= 0 || code < DJ_EINTERNAL) code = DJ_EINTERNAL;
    return dj_fail((dj_status)code, "%s", msg[0] ? msg : dj_strerror((dj_status)code));
}

/* Simple call: one request, one REPLY whose metadata lands in *m (destroy
 * it) and whose frame lands in *fo if not NULL (free with frame_free). */
static dj_status call_payload(dj_client_t *c, uint16_t type, dj__mw *w, const void *payload, size_t n, dj__meta *m,
                              frame **fo) {
    pending *p;
    dj_status st = begin(c, type, w, payload, n, NULL, 0, false, &p);
    if (st != DJ_OK) return st;
    frame *f = NULL;
    st = next_frame(c, p, &f);
    end(c, p);
    if (st != DJ_OK) return st;
    if (f->h.type == DJ_MSG_ERROR) st = error_of(f);
    else if (f->h.type != DJ_MSG_REPLY) st = dj_fail(DJ_EFORMAT, "unexpected %s frame", dj_msg_type_name(f->h.type));
    if (st == DJ_OK && m) st = dj__meta_parse(m, f->body, f->h.meta_len);
    if (st == DJ_OK && fo) *fo = f;
    else frame_free(f);
    return st;
}

static dj_status call(dj_client_t *c, uint16_t type, dj__mw *w, dj__meta *m, frame **fo) {
    return call_payload(c, type, w, NULL, 0, m, fo);
}

/* ---- heartbeats ---- */

static void *hb_main(void *arg) {
    dj_client_t *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop && !c->dead) {
        const uint32_t period = c->hb_period_ms;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const uint64_t wait_ms = period ? period : 1000;
        ts.tv_sec += (time_t)(wait_ms / 1000);
        ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        int rc = pthread_cond_timedwait(&c->hb_cv, &c->mu, &ts);
        if (c->stop || c->dead) break;
        if (rc != ETIMEDOUT || !c->hb_period_ms) continue;
        pthread_mutex_unlock(&c->mu);
        pending *p;
        if (begin(c, DJ_MSG_HEARTBEAT, NULL, NULL, 0, NULL, 0, true, &p) != DJ_OK)
            DJ_LOG(INFO, "heartbeat: %s", dj_last_error());
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void dj_client_set_heartbeat(dj_client_t *c, uint32_t period_ms) {
    pthread_mutex_lock(&c->mu);
    c->hb_period_ms = period_ms;
    pthread_cond_broadcast(&c->hb_cv);
    pthread_mutex_unlock(&c->mu);
}

uint32_t dj_client_lease_ms(const dj_client_t *c) { return c->lease_ms; }

dj_status dj_client_heartbeat(dj_client_t *c) { return call(c, DJ_MSG_HEARTBEAT, NULL, NULL, NULL); }

/* ---- connect ---- */

dj_status dj_client_connect(const char *addr, const char *token, dj_client_t **out) {
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t len;
    dj_status st = dj__addr_parse(addr, &ss, &len);
    if (st != DJ_OK) return st;
    dj_client_t *c = dj_calloc(1, sizeof *c);
    if (!c) return dj_fail(DJ_ENOMEM, "out of memory");
    c->fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->wmu, NULL);
    pthread_cond_init(&c->hb_cv, NULL);
    c->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&ss, len) != 0) {
        st = dj_fail(DJ_EIO, "connect to %s: %s", addr, strerror(errno));
        goto fail;
    }
    if (ss.ss_family != AF_UNIX) {
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    if (pthread_create(&c->reader, NULL, reader_main, c) != 0) {
        st = dj_fail(DJ_EINTERNAL, "cannot start the reader thread");
        goto fail;
    }
    c->reader_started = true;
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "version", DJ_PROTO_VERSION);
    dj__mw_str(&w, "client", "libdjinn " DJ_VERSION_STRING);
    /* A line end: an HTTP server reading this HELLO sees its request line end
     * and answers at once (400), which the reader names, instead of waiting
     * out its header deadline (docs/protocol.md, HELLO). */
    dj__mw_str(&w, "probe", "\r\n");
    if (token) dj__mw_str(&w, "token", token);
    dj__meta m;
    if ((st = call(c, DJ_MSG_HELLO, &w, &m, NULL)) != DJ_OK) goto fail;
    uint32_t lease = 10000;
    dj__meta_u32(&m, "lease_ms", false, &lease);
    dj__meta_destroy(&m);
    c->lease_ms = lease;
    c->hb_period_ms = lease / 3 ? lease / 3 : 1;
    if (pthread_create(&c->hb, NULL, hb_main, c) != 0) {
        st = dj_fail(DJ_EINTERNAL, "cannot start the heartbeat thread");
        goto fail;
    }
    c->hb_started = true;
    *out = c;
    return DJ_OK;
fail:
    dj_client_free(c);
    return st;
}

void dj_client_free(dj_client_t *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_broadcast(&c->hb_cv);
    pthread_mutex_unlock(&c->mu);
    if (c->hb_started) pthread_join(c->hb, NULL);
    if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
    if (c->reader_started) pthread_join(c->reader, NULL);
    if (c->fd >= 0) close(c->fd);
    while (c->pend) {
        pending *p = c->pend;
        c->pend = p->next;
        pending_free(p);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->wmu);
    pthread_cond_destroy(&c->hb_cv);
    free(c);
}

/* ---- models ---- */

static dj_status name_call(dj_client_t *c, uint16_t type, const char *name, dj__meta *m) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_str(&w, "model", name);
    return call(c, type, &w, m, NULL);
}

static void read_model(const msgpack_object *o, dj_client_model *cm) {
    memset(cm, 0, sizeof *cm);
    const msgpack_object *v = dj__obj_get(o, "name");
    if (v && v->type == MSGPACK_OBJECT_STR)
        snprintf(cm->name, sizeof cm->name, "%.*s", (int)(v->via.str.size < 127 ? v->via.str.size : 127),
                 v->via.str.ptr);
    uint64_t x = 0;
    if ((v = dj__obj_get(o, "refs")) && dj__obj_u64(v, &x)) cm->refs = (uint32_t)x;
    if ((v = dj__obj_get(o, "loaded")) && v->type == MSGPACK_OBJECT_BOOLEAN) cm->loaded = v->via.boolean;
    else cm->loaded = cm->refs > 0;
    if ((v = dj__obj_get(o, "layers")) && dj__obj_u64(v, &x)) cm->layers = (uint32_t)x;
    if ((v = dj__obj_get(o, "streamed_layers")) && dj__obj_u64(v, &x)) cm->streamed_layers = (uint32_t)x;
    if ((v = dj__obj_get(o, "host_layers")) && dj__obj_u64(v, &x)) cm->host_layers = (uint32_t)x;
    if ((v = dj__obj_get(o, "host_share_pct")) && dj__obj_u64(v, &x) && x <= 100) cm->host_share_pct = (uint32_t)x;
    if ((v = dj__obj_get(o, "resident_bytes"))) (void)dj__obj_u64(v, &cm->resident_bytes);
    if ((v = dj__obj_get(o, "ring_bytes"))) (void)dj__obj_u64(v, &cm->ring_bytes);
    if ((v = dj__obj_get(o, "streamed_bytes"))) (void)dj__obj_u64(v, &cm->streamed_bytes);
}

static dj_status read_models(const dj__meta *m, dj_client_model **models, size_t *n) {
    *models = NULL;
    *n = 0;
    const msgpack_object *a = dj__meta_get(m, "models");
    if (!a || a->type != MSGPACK_OBJECT_ARRAY) return dj_fail(DJ_EFORMAT, "reply has no 'models' array");
    if (a->via.array.size == 0) return DJ_OK;
    dj_client_model *v = dj_calloc(a->via.array.size, sizeof *v);
    if (!v) return dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < a->via.array.size; i++) read_model(&a->via.array.ptr[i], &v[i]);
    *models = v;
    *n = a->via.array.size;
    return DJ_OK;
}

dj_status dj_client_model_list(dj_client_t *c, dj_client_model **models, size_t *n) {
    dj__meta m;
    dj_status st = call(c, DJ_MSG_MODEL_LIST, NULL, &m, NULL);
    if (st != DJ_OK) return st;
    st = read_models(&m, models, n);
    dj__meta_destroy(&m);
    return st;
}

dj_status dj_client_model_load(dj_client_t *c, const char *name) {
    return name_call(c, DJ_MSG_MODEL_LOAD, name, NULL);
}

dj_status dj_client_model_unload(dj_client_t *c, const char *name) {
    return name_call(c, DJ_MSG_MODEL_UNLOAD, name, NULL);
}

/* ---- sessions ---- */

dj_status dj_client_session_open(dj_client_t *c, const dj_session_opts *o, uint64_t *session) {
    return dj_client_session_open_secret(c, o, session, NULL);
}

dj_status dj_client_session_attach(dj_client_t *c, uint64_t session, uint64_t secret, uint32_t *pos) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "session", session);
    dj__mw_u64(&w, "secret", secret);
    dj__meta m;
    dj_status st = call(c, DJ_MSG_SESSION_ATTACH, &w, &m, NULL);
    if (st != DJ_OK) return st;
    uint32_t p = 0;
    st = dj__meta_u32(&m, "pos", true, &p);
    if (pos) *pos = p;
    dj__meta_destroy(&m);
    return st;
}

dj_status dj_client_session_open_secret(dj_client_t *c, const dj_session_opts *o, uint64_t *session,
                                        uint64_t *secret) {
    *session = 0;
    if (secret) *secret = 0;
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_str(&w, "model", o->model ? o->model : "");
    dj__mw_str(&w, "qos", dj_qos_name(o->qos));
    if (o->expected_tokens) dj__mw_u64(&w, "expected_tokens", o->expected_tokens);
    if (secret) dj__mw_bool(&w, "reattach", true);
    dj__meta m;
    dj_status st = call(c, DJ_MSG_SESSION_OPEN, &w, &m, NULL);
    if (st != DJ_OK) return st;
    st = dj__meta_u64(&m, "session", true, session);
    if (st == DJ_OK && secret) st = dj__meta_u64(&m, "secret", true, secret);
    dj__meta_destroy(&m);
    return st;
}

dj_status dj_client_session_export(dj_client_t *c, uint64_t session, uint8_t **image, size_t *n) {
    *image = NULL;
    *n = 0;
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "session", session);
    dj__meta m;
    dj_status st = call(c, DJ_MSG_SESSION_EXPORT, &w, &m, NULL);
    if (st != DJ_OK) return st;
    uint64_t handle = 0, bytes = 0;
    st = dj__meta_u64(&m, "handle", true, &handle);
    if (st == DJ_OK) st = dj__meta_u64(&m, "bytes", true, &bytes);
    dj__meta_destroy(&m);
    if (st != DJ_OK) return st;
    uint8_t *buf = bytes <= SIZE_MAX ? dj_malloc(bytes ? (size_t)bytes : 1) : NULL;
    if (!buf) st = dj_fail(DJ_ENOMEM, "out of memory for a session image of %llu bytes", (unsigned long long)bytes);
    size_t got = 0;
    /* in pieces of at most 64 MiB (a FETCH's reply) */
    while (st == DJ_OK && got < bytes) {
        const uint64_t want = bytes - got < (64u << 20) ? bytes - got : (64u << 20);
        size_t g = 0;
        st = dj_client_fetch(c, handle, got, want, buf + got, (size_t)want, &g);
        if (st == DJ_OK && g != want) st = dj_fail(DJ_EIO, "session image: %zu of %llu bytes came", got + g,
                                                   (unsigned long long)bytes);
        got += g;
    }
    const dj_status rs = dj_client_release(c, handle);
    if (st == DJ_OK) st = rs;
    if (st != DJ_OK) {
        free(buf);
        return st;
    }
    *image = buf;
    *n = (size_t)bytes;
    return DJ_OK;
}

dj_status dj_client_session_import(dj_client_t *c, const void *image, size_t n, uint64_t *session,
                                   uint64_t *secret, uint32_t *pos) {
    *session = 0;
    if (secret) *secret = 0;
    if (pos) *pos = 0;
    if (!image || !n) return dj_fail(DJ_EINVAL, "dj_client_session_import: no image");
    dj__mw w;
    dj__mw_init(&w);
    dj__meta m;
    dj_status st = call_payload(c, DJ_MSG_SESSION_IMPORT, &w, image, n, &m, NULL);
    if (st != DJ_OK) return st;
    uint64_t sec = 0;
    uint32_t ps = 0;
    st = dj__meta_u64(&m, "session", true, session);
    if (st == DJ_OK) st = dj__meta_u64(&m, "secret", true, &sec);
    if (st == DJ_OK) st = dj__meta_u32(&m, "pos", true, &ps);
    if (secret) *secret = sec;
    if (pos) *pos = ps;
    dj__meta_destroy(&m);
    return st;
}

dj_status dj_client_session_export_file(dj_client_t *c, uint64_t session, const char *path) {
    uint8_t *img = NULL;
    size_t n = 0;
    dj_status st = dj_client_session_export(c, session, &img, &n);
    if (st != DJ_OK) return st;
    FILE *f = fopen(path, "wb");
    if (!f) st = dj_fail(DJ_EIO, "%s: %s", path, strerror(errno));
    else {
        const bool ok = fwrite(img, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
        if (fclose(f) != 0 || !ok) st = dj_fail(DJ_EIO, "%s: %s", path, strerror(errno ? errno : EIO));
    }
    free(img);
    return st;
}

dj_status dj_client_session_import_file(dj_client_t *c, const char *path, uint64_t *session, uint64_t *secret,
                                        uint32_t *pos) {
    *session = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return dj_fail(errno == ENOENT ? DJ_ENOTFOUND : DJ_EIO, "%s: %s", path, strerror(errno));
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    dj_status st = DJ_OK;
    for (;;) {
        if (n == cap) {
            cap = cap ? cap * 2 : 1 << 20;
            uint8_t *b = cap <= DJ_PROTO_MAX_REQ_PAYLOAD ? dj_realloc(buf, cap) : NULL;
            if (!b) {
                st = dj_fail(cap > DJ_PROTO_MAX_REQ_PAYLOAD ? DJ_ERANGE : DJ_ENOMEM,
                             "%s: larger than a request's payload may be, or out of memory", path);
                break;
            }
            buf = b;
        }
        const size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) st = dj_fail(DJ_EIO, "%s: read failed", path);
            break;
        }
    }
    fclose(f);
    if (st == DJ_OK) st = dj_client_session_import(c, buf, n, session, secret, pos);
    free(buf);
    return st;
}

static dj_status session_call(dj_client_t *c, uint16_t type, uint64_t session, uint64_t expected_ms) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "session", session);
    if (expected_ms) dj__mw_u64(&w, "expected_ms", expected_ms);
    return call(c, type, &w, NULL, NULL);
}

dj_status dj_client_session_close(dj_client_t *c, uint64_t session) {
    return session_call(c, DJ_MSG_SESSION_CLOSE, session, 0);
}
dj_status dj_client_session_pause(dj_client_t *c, uint64_t session, uint64_t expected_ms) {
    return session_call(c, DJ_MSG_PAUSE, session, expected_ms);
}
dj_status dj_client_session_resume(dj_client_t *c, uint64_t session) {
    return session_call(c, DJ_MSG_RESUME, session, 0);
}

/* ---- generate ---- */

struct dj_client_gen {
    dj_client_t *c;
    pending *p;
    frame *last;  /* the frame the last event's text points into */
    dj__meta meta; /* its metadata (parsed) */
    bool have_meta, done, failed;
};

/* Next frame for p, waiting at most timeout_ms (< 0: forever); *out NULL
 * when none came in time. */
static dj_status next_frame_timed(dj_client_t *c, pending *p, int timeout_ms, frame **out) {
    *out = NULL;
    if (timeout_ms < 0) return next_frame(c, p, out);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    while (!p->head && !c->dead)
        if (pthread_cond_timedwait(&p->cv, &c->mu, &ts) == ETIMEDOUT) break;
    frame *f = p->head;
    if (f) {
        p->head = f->next;
        if (!p->head) p->tail = NULL;
    }
    const bool dead = c->dead;
    pthread_mutex_unlock(&c->mu);
    if (!f && dead) return dj_fail(DJ_EIO, "djinnd connection: %s", c->dead_msg);
    *out = f;
    return DJ_OK;
}

dj_status dj_client_generate_start(dj_client_t *c, uint64_t session, const dj_generate_params *p,
                                   dj_client_gen_t **out) {
    *out = NULL;
    if (!!p->prompt == !!p->ids) return dj_fail(DJ_EINVAL, "generate needs exactly one of prompt or ids");
    dj_client_gen_t *g = dj_calloc(1, sizeof *g);
    if (!g) return dj_fail(DJ_ENOMEM, "out of memory");
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "session", session);
    if (p->prompt) dj__mw_str(&w, "prompt", p->prompt);
    else dj__mw_ids(&w, "ids", p->ids, p->n_ids);
    dj__mw_u64(&w, "max_tokens", p->max_tokens);
    dj__sample_encode(&w, &p->sampling);
    if (p->n_stop) dj__mw_ids(&w, "stop_ids", p->stop_ids, p->n_stop);
    dj__logit_bias_encode(&w, p->logit_bias, p->n_logit_bias);
    if (p->cache_salt) dj__mw_str(&w, "cache_salt", p->cache_salt);
    if (p->json_schema) dj__mw_str(&w, "json_schema", p->json_schema);
    if (p->adapter) dj__mw_str(&w, "adapter", p->adapter);
    if (p->ignore_eos) dj__mw_bool(&w, "ignore_eos", true);
    if (p->logprobs) dj__mw_bool(&w, "logprobs", true);
    if (p->top_logprobs) dj__mw_u64(&w, "top_logprobs", p->top_logprobs);
    dj_status st = begin(c, DJ_MSG_GENERATE, &w, NULL, 0, NULL, 0, false, &g->p);
    if (st != DJ_OK) {
        free(g);
        return st;
    }
    g->c = c;
    *out = g;
    return DJ_OK;
}

static void gen_drop_last(dj_client_gen_t *g) {
    if (g->have_meta) dj__meta_destroy(&g->meta);
    g->have_meta = false;
    frame_free(g->last);
    g->last = NULL;
}

/* A TOKEN's logprob, top_ids and top_logprobs (absent: none asked). */
static dj_status token_logprobs(const dj__meta *m, dj_client_event *ev) {
    double lp = 0;
    if (!dj__meta_get(m, "logprob")) return DJ_OK;
    dj_status st = dj__meta_f64(m, "logprob", true, &lp);
    if (st != DJ_OK) return st;
    ev->has_logprobs = true;
    ev->lp.id = ev->id;
    ev->lp.logprob = (float)lp;
    const msgpack_object *ids = dj__meta_get(m, "top_ids"), *lps = dj__meta_get(m, "top_logprobs");
    if (!ids && !lps) return DJ_OK;
    if (!ids || !lps || ids->type != MSGPACK_OBJECT_ARRAY || lps->type != MSGPACK_OBJECT_ARRAY ||
        ids->via.array.size != lps->via.array.size || ids->via.array.size > DJ_MAX_TOP_LOGPROBS)
        return dj_fail(DJ_EFORMAT, "TOKEN: 'top_ids' and 'top_logprobs' must be arrays of one length <= %d",
                       DJ_MAX_TOP_LOGPROBS);
    for (uint32_t k = 0; k < ids->via.array.size; k++) {
        uint64_t id;
        double x;
        if (!dj__obj_u64(&ids->via.array.ptr[k], &id) || id > INT32_MAX || !dj__obj_f64(&lps->via.array.ptr[k], &x))
            return dj_fail(DJ_EFORMAT, "TOKEN: top_ids[%u] or top_logprobs[%u] is not a token id or a number", k, k);
        ev->lp.top_id[k] = (int32_t)id;
        ev->lp.top_logprob[k] = (float)x;
    }
    ev->lp.n_top = ids->via.array.size;
    return DJ_OK;
}

dj_status dj_client_generate_next(dj_client_gen_t *g, int timeout_ms, dj_client_event *ev, dj_generate_result *res) {
    memset(ev, 0, sizeof *ev);
    ev->id = -1;
    ev->text = "";
    gen_drop_last(g);
    if (g->done || g->failed) return dj_fail(DJ_EINVAL, "generate_next after the generation ended");
    frame *f = NULL;
    dj_status st = next_frame_timed(g->c, g->p, timeout_ms, &f);
    if (st != DJ_OK) {
        g->failed = true;
        return st;
    }
    if (!f) {
        ev->kind = DJ_CLIENT_EVENT_NONE;
        return DJ_OK;
    }
    g->last = f;
    if (f->h.type == DJ_MSG_ERROR) {
        g->failed = true;
        return error_of(f);
    }
    if ((st = dj__meta_parse(&g->meta, f->body, f->h.meta_len)) != DJ_OK) {
        g->failed = true;
        return st;
    }
    g->have_meta = true;
    const char *text = NULL;
    size_t tn = 0;
    if (f->h.type == DJ_MSG_TOKEN) {
        int64_t id = -1;
        st = dj__meta_i64(&g->meta, "id", true, &id);
        if (st == DJ_OK) st = dj__meta_str(&g->meta, "text", false, &text, &tn);
        if (st != DJ_OK) {
            g->failed = true;
            return st;
        }
        ev->kind = DJ_CLIENT_EVENT_TOKEN;
        ev->id = (int32_t)id;
        if ((st = token_logprobs(&g->meta, ev)) != DJ_OK) {
            g->failed = true;
            return st;
        }
    } else if (f->h.type == DJ_MSG_DONE) {
        g->done = true;
        ev->kind = DJ_CLIENT_EVENT_DONE;
        if (res) {
            memset(res, 0, sizeof *res);
            dj__meta_u32(&g->meta, "n_prompt", false, &res->n_prompt);
            dj__meta_u32(&g->meta, "n_generated", false, &res->n_generated);
            dj__meta_strcpy(&g->meta, "reason", false, res->reason, sizeof res->reason);
            dj__meta_f64(&g->meta, "queue_ms", false, &res->queue_ms);
            dj__meta_f64(&g->meta, "prefill_ms", false, &res->prefill_ms);
            dj__meta_f64(&g->meta, "ttft_ms", false, &res->ttft_ms);
            dj__meta_f64(&g->meta, "decode_ms", false, &res->decode_ms);
            int64_t stop_id = -1;
            if (dj__meta_i64(&g->meta, "stop_id", false, &stop_id) != DJ_OK || stop_id < 0 || stop_id > INT32_MAX)
                stop_id = -1;
            res->stop_id = (int32_t)stop_id;
            dj__meta_u32(&g->meta, "pos", false, &res->pos);
            dj__meta_u32(&g->meta, "cached", false, &res->cached);
        }
        if (dj__meta_str(&g->meta, "text", false, &text, &tn) != DJ_OK) text = NULL;
    } else {
        g->failed = true;
        return dj_fail(DJ_EFORMAT, "unexpected %s frame", dj_msg_type_name(f->h.type));
    }
    if (text) {
        ev->text = text;
        ev->len = tn;
    }
    return DJ_OK;
}

void dj_client_generate_end(dj_client_gen_t *g) {
    if (!g) return;
    gen_drop_last(g);
    dj_client_t *c = g->c;
    pthread_mutex_lock(&c->mu);
    if (g->p->final || c->dead) {
        unlink_pending(c, g->p);
        pending_free(g->p);
    } else {
        /* still running: the reader drops its frames and frees it at the end */
        g->p->discard = true;
        for (frame *f = g->p->head, *n; f; f = n) {
            n = f->next;
            frame_free(f);
        }
        g->p->head = g->p->tail = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    free(g);
}

dj_status dj_client_generate(dj_client_t *c, uint64_t session, const dj_generate_params *p, dj_token_cb cb,
                             void *user, dj_generate_result *res) {
    if (res) memset(res, 0, sizeof *res);
    dj_client_gen_t *g;
    dj_status st = dj_client_generate_start(c, session, p, &g);
    if (st != DJ_OK) return st;
    for (;;) {
        dj_client_event ev;
        if ((st = dj_client_generate_next(g, -1, &ev, res)) != DJ_OK) break;
        if (ev.kind == DJ_CLIENT_EVENT_TOKEN && cb) cb(ev.id, ev.text, ev.len, user);
        if (ev.kind == DJ_CLIENT_EVENT_DONE) {
            if (cb && ev.len) cb(-1, ev.text, ev.len, user);
            break;
        }
    }
    dj_client_generate_end(g);
    return st;
}

/* ---- steps and handles ---- */

dj_status dj_client_step(dj_client_t *c, uint64_t session, const int32_t *ids, size_t n, bool want_logits,
                         dj_remote_tensor *t) {
    return dj_client_step_ex(c, session, ids, n, want_logits ? DJ_LOGITS_LAST : DJ_LOGITS_NONE, t);
}

dj_status dj_client_step_ex(dj_client_t *c, uint64_t session, const int32_t *ids, size_t n, dj_logits_mode mode,
                            dj_remote_tensor *t) {
    memset(t, 0, sizeof *t);
    if (mode != DJ_LOGITS_NONE && mode != DJ_LOGITS_LAST && mode != DJ_LOGITS_ALL)
        return dj_fail(DJ_EINVAL, "step: logits mode %d is not NONE, LAST or ALL", (int)mode);
    const bool want_logits = mode != DJ_LOGITS_NONE;
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "session", session);
    dj__mw_ids(&w, "ids", ids, n);
    dj__mw_str(&w, "logits", mode == DJ_LOGITS_ALL ? "all" : want_logits ? "last" : "none");
    dj__meta m;
    dj_status st = call(c, DJ_MSG_STEP, &w, &m, NULL);
    if (st != DJ_OK) return st;
    uint64_t x = 0;
    if (dj__meta_u64(&m, "pos", false, &x) == DJ_OK) t->pos = (uint32_t)x;
    if (want_logits) {
        st = dj__meta_u64(&m, "handle", true, &t->handle);
        if (st == DJ_OK) st = dj__meta_u64(&m, "nbytes", true, &t->nbytes);
        if (st == DJ_OK) st = dj__meta_strcpy(&m, "dtype", true, t->dtype, sizeof t->dtype);
        const msgpack_object *sh = dj__meta_get(&m, "shape");
        if (st == DJ_OK && (!sh || sh->type != MSGPACK_OBJECT_ARRAY || sh->via.array.size > 4))
            st = dj_fail(DJ_EFORMAT, "STEP reply: bad 'shape'");
        for (uint32_t i = 0; st == DJ_OK && i < sh->via.array.size; i++) dj__obj_u64(&sh->via.array.ptr[i], &t->shape[i]);
        if (st == DJ_OK) t->ndim = sh->via.array.size;
    }
    dj__meta_destroy(&m);
    return st;
}

dj_status dj_client_fetch(dj_client_t *c, uint64_t handle, uint64_t offset, uint64_t length, void *dst, size_t cap,
                          size_t *got) {
    *got = 0;
    for (;;) {
        uint64_t want = length == UINT64_MAX ? UINT64_MAX : length - *got;
        if (length != UINT64_MAX && want == 0) return DJ_OK;
        if (want > cap - *got) want = cap - *got;
        if (want == 0) return DJ_OK;
        dj__mw w;
        dj__mw_init(&w);
        dj__mw_u64(&w, "handle", handle);
        dj__mw_u64(&w, "offset", offset + *got);
        dj__mw_u64(&w, "length", want);
        pending *p;
        dj_status st = begin(c, DJ_MSG_FETCH, &w, NULL, 0, (uint8_t *)dst + *got, (size_t)want, false, &p);
        if (st != DJ_OK) return st;
        frame *f = NULL;
        st = next_frame(c, p, &f);
        end(c, p);
        if (st != DJ_OK) return st;
        if (f->h.type == DJ_MSG_ERROR) st = error_of(f);
        else if (f->h.type != DJ_MSG_REPLY || !f->sunk)
            st = dj_fail(DJ_EFORMAT, "FETCH reply of %llu bytes for %llu asked", (unsigned long long)f->h.payload_len,
                         (unsigned long long)want);
        const uint64_t n = f->h.payload_len;
        frame_free(f);
        if (st != DJ_OK) return st;
        *got += (size_t)n;
        if (n == 0 || n < want) return DJ_OK; /* the end of the handle */
    }
}

dj_status dj_client_release(dj_client_t *c, uint64_t handle) {
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "handle", handle);
    return call(c, DJ_MSG_RELEASE, &w, NULL, NULL);
}

/* ---- stats ---- */

static uint64_t u64_of(const msgpack_object *map, const char *key) {
    uint64_t x = 0;
    const msgpack_object *v = dj__obj_get(map, key);
    if (v) dj__obj_u64(v, &x);
    return x;
}

static double f64_of(const msgpack_object *map, const char *key) {
    double x = 0;
    const msgpack_object *v = dj__obj_get(map, key);
    if (v) dj__obj_f64(v, &x);
    return x;
}

static void str_of(const msgpack_object *map, const char *key, char *buf, size_t cap) {
    const msgpack_object *v = dj__obj_get(map, key);
    buf[0] = '\0';
    if (v && v->type == MSGPACK_OBJECT_STR)
        snprintf(buf, cap, "%.*s", (int)(v->via.str.size < cap ? v->via.str.size : cap - 1), v->via.str.ptr);
}

static bool bool_of(const msgpack_object *map, const char *key) {
    const msgpack_object *v = dj__obj_get(map, key);
    return v && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean;
}

/* STATS' session count (its "sessions" array), 0 without one. */
static uint32_t ss_count(const dj__meta *m) {
    const msgpack_object *ss = dj__meta_get(m, "sessions");
    return ss && ss->type == MSGPACK_OBJECT_ARRAY ? ss->via.array.size : 0;
}

dj_status dj_client_stats_get(dj_client_t *c, dj_client_stats *out) {
    memset(out, 0, sizeof *out);
    dj__meta m;
    dj_status st = call(c, DJ_MSG_STATS, NULL, &m, NULL);
    if (st != DJ_OK) return st;
    const msgpack_object *root = &m.root, *segs = dj__meta_get(&m, "segments");
    dj_client_seg *dst[3] = {&out->text, &out->data, &out->stack};
    static const char *names[3] = {"text", "data", "stack"};
    for (int i = 0; i < 3; i++) {
        const msgpack_object *sg = dj__obj_get(segs, names[i]);
        dst[i]->capacity = u64_of(sg, "capacity");
        dst[i]->used = u64_of(sg, "used");
        dst[i]->peak = u64_of(sg, "peak");
    }
    str_of(root, "version", out->version, sizeof out->version);
    out->pages_total = u64_of(root, "pages_total");
    out->pages_free = u64_of(root, "pages_free");
    out->page_bytes = u64_of(root, "page_bytes");
    out->evictions = u64_of(root, "evictions");
    out->batched_steps = u64_of(root, "batched_steps");
    out->batched_rows = u64_of(root, "batched_rows");
    out->mixed_steps = u64_of(root, "mixed_steps");
    out->gen_steps = u64_of(root, "gen_steps");
    out->step_ms = f64_of(root, "step_ms");
    out->step_engine_ms = f64_of(root, "step_engine_ms");
    out->graph_captures = u64_of(root, "graph_captures");
    out->graph_replays = u64_of(root, "graph_replays");
    out->graph_failures = u64_of(root, "graph_failures");
    out->vmu_models = u64_of(root, "vmu_models");
    out->vmu_sessions = u64_of(root, "vmu_sessions");
    out->handles = u64_of(root, "handles");
    out->connections = u64_of(root, "connections");
    st = read_models(&m, &out->models, &out->n_models);
    const msgpack_object *ss = dj__meta_get(&m, "sessions");
    if (st == DJ_OK && ss && ss->type == MSGPACK_OBJECT_ARRAY && ss->via.array.size) {
        out->sessions = dj_calloc(ss->via.array.size, sizeof *out->sessions);
        if (!out->sessions) st = dj_fail(DJ_ENOMEM, "out of memory");
        for (uint32_t i = 0; st == DJ_OK && i < ss->via.array.size; i++) {
            const msgpack_object *o = &ss->via.array.ptr[i];
            dj_client_session_info *si = &out->sessions[i];
            si->id = u64_of(o, "id");
            str_of(o, "model", si->model, sizeof si->model);
            str_of(o, "qos", si->qos, sizeof si->qos);
            si->pos = (uint32_t)u64_of(o, "pos");
            si->lease_left_ms = u64_of(o, "lease_left_ms");
            si->paused = bool_of(o, "paused");
            si->generating = bool_of(o, "generating");
            str_of(o, "state", si->state, sizeof si->state);
            si->kv_bytes = u64_of(o, "kv_bytes");
            si->pooled_bytes = u64_of(o, "pooled_bytes");
            si->swaps = u64_of(o, "swaps");
        }
        out->n_sessions = ss->via.array.size;
    }
    const msgpack_object *qs = dj__meta_get(&m, "queues");
    for (int q = 0; q < DJ_QOS_COUNT; q++) {
        const msgpack_object *qq = dj__obj_get(qs, dj_qos_name((dj_qos)q));
        out->waiting[q] = u64_of(qq, "waiting");
        out->running[q] = u64_of(qq, "running");
    }
    const msgpack_object *sw = dj__meta_get(&m, "swap");
    str_of(sw, "policy", out->swap.policy, sizeof out->swap.policy);
    out->swap.pool_bytes = u64_of(sw, "pool_bytes");
    out->swap.pool_used = u64_of(sw, "pool_used");
    out->swap.pool_peak = u64_of(sw, "pool_peak");
    out->swap.swaps_out = u64_of(sw, "swaps_out");
    out->swap.swaps_in = u64_of(sw, "swaps_in");
    out->swap.bytes_out = u64_of(sw, "bytes_out");
    out->swap.bytes_in = u64_of(sw, "bytes_in");
    out->swap.pages_reserved = u64_of(sw, "pages_reserved");
    out->swap.preemptions = u64_of(sw, "preemptions");
    out->swap.prefetches = u64_of(sw, "prefetches");
    out->swap.kv_drops = u64_of(sw, "drops");
    const msgpack_object *dk = dj__meta_get(&m, "disk");
    out->disk.enabled = bool_of(dk, "enabled");
    out->disk.direct = bool_of(dk, "direct");
    out->disk.capacity = u64_of(dk, "capacity");
    out->disk.used = u64_of(dk, "used");
    out->disk.peak = u64_of(dk, "peak");
    out->disk.sessions = u64_of(dk, "sessions");
    out->disk.spills = u64_of(dk, "spills");
    out->disk.reads = u64_of(dk, "reads");
    out->disk.bytes_written = u64_of(dk, "bytes_written");
    out->disk.bytes_read = u64_of(dk, "bytes_read");
    out->disk.bad_pages = u64_of(dk, "bad_pages");
    out->disk.failed_reads = u64_of(dk, "failed_reads");
    out->disk.recoveries = u64_of(dk, "recoveries");
    out->disk.write_s = f64_of(dk, "write_s");
    out->disk.read_s = f64_of(dk, "read_s");
    char busy[16];
    str_of(root, "busy", busy, sizeof busy);
    out->busy_loading = !strcmp(busy, "loading");
    const msgpack_object *ld = dj__meta_get(&m, "loading");
    for (uint32_t i = 0; ld && ld->type == MSGPACK_OBJECT_ARRAY && i < ld->via.array.size && out->n_loading < 8; i++) {
        const msgpack_object *o = &ld->via.array.ptr[i];
        str_of(o, "name", out->loading[out->n_loading].name, sizeof out->loading[0].name);
        out->loading[out->n_loading].bytes_done = u64_of(o, "bytes_done");
        out->loading[out->n_loading].bytes_total = u64_of(o, "bytes_total");
        out->loading[out->n_loading].elapsed_s = f64_of(o, "elapsed_s");
        out->n_loading++;
    }
    out->text_mapped = u64_of(root, "text_mapped");
    out->page_cells = (uint32_t)u64_of(root, "page_cells");
    const msgpack_object *pr = dj__meta_get(&m, "page_runs"); /* (holder, cells) pairs */
    if (st == DJ_OK && pr && pr->type == MSGPACK_OBJECT_ARRAY && pr->via.array.size >= 2) {
        const uint32_t n = pr->via.array.size / 2;
        if (!(out->page_runs = dj_calloc(2 * (size_t)n, sizeof *out->page_runs))) st = dj_fail(DJ_ENOMEM, "out of memory");
        uint64_t cells = 0;
        for (uint32_t i = 0; st == DJ_OK && i < 2 * n; i++) {
            const msgpack_object *v = &pr->via.array.ptr[i];
            const bool num = v->type == MSGPACK_OBJECT_POSITIVE_INTEGER || v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
            const int64_t x = !num ? INT64_MIN : v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int64_t)(v->via.u64 & INT64_MAX) : v->via.i64;
            /* a holder: -2..sessions-1; a count: 1..page_cells, all of them adding up to page_cells */
            const bool ok = i % 2 ? x >= 1 && x <= out->page_cells : x >= -2 && x < (int64_t)ss_count(&m);
            if (!ok) st = dj_fail(DJ_EFORMAT, "STATS: page_runs[%u] is not a %s", i, i % 2 ? "count" : "holder");
            else out->page_runs[i] = (int32_t)x;
            if (i % 2) cells += (uint64_t)x;
        }
        if (st == DJ_OK && cells != out->page_cells)
            st = dj_fail(DJ_EFORMAT, "STATS: page_runs cover %llu parts of %u", (unsigned long long)cells, out->page_cells);
        if (st == DJ_OK) out->n_page_runs = n;
    }
    const msgpack_object *px = dj__meta_get(&m, "prefix");
    out->prefix.enabled = bool_of(px, "enabled");
    out->prefix.blocks = u64_of(px, "blocks");
    out->prefix.blocks_unreferenced = u64_of(px, "blocks_unreferenced");
    out->prefix.pages = u64_of(px, "pages");
    out->prefix.pages_unreferenced = u64_of(px, "pages_unreferenced");
    out->prefix.hits = u64_of(px, "hits");
    out->prefix.tokens_mapped = u64_of(px, "tokens_mapped");
    out->prefix.evictions = u64_of(px, "evictions");
    const char *map = NULL;
    size_t mn = 0;
    if (st == DJ_OK && dj__meta_str(&m, "map", false, &map, &mn) == DJ_OK && map) {
        out->map = dj_malloc(mn + 1);
        if (out->map) {
            memcpy(out->map, map, mn);
            out->map[mn] = '\0';
        }
    }
    dj__meta_destroy(&m);
    if (st != DJ_OK) dj_client_stats_free(out);
    return st;
}

void dj_client_stats_free(dj_client_stats *st) {
    if (!st) return;
    free(st->models);
    free(st->sessions);
    free(st->map);
    free(st->page_runs);
    memset(st, 0, sizeof *st);
}

void dj_client_stats_print(const dj_client_stats *st, FILE *f) {
    const double mib = 1048576.0;
    if (st->version[0]) fprintf(f, "djinnd %s\n", st->version);
    for (size_t i = 0; i < st->n_loading; i++)
        fprintf(f, "loading %s: %.1f of %.1f MiB read in %.1f s\n", st->loading[i].name,
                (double)st->loading[i].bytes_done / mib, (double)st->loading[i].bytes_total / mib, st->loading[i].elapsed_s);
    if (st->busy_loading) {
        fprintf(f, "(the engine thread is loading: nothing else to tell until it is done)\n");
        return;
    }
    fprintf(f, "segments:\n");
    const dj_client_seg *seg[3] = {&st->text, &st->data, &st->stack};
    static const char *names[3] = {"text", "data", "stack"};
    for (int i = 0; i < 3; i++)
        fprintf(f, "  %-6s %10.2f of %10.2f MiB used (peak %.2f MiB)\n", names[i], seg[i]->used / mib,
                seg[i]->capacity / mib, seg[i]->peak / mib);
    fprintf(f, "  data pages: %llu of %llu free (%llu B each); %llu evictions\n", (unsigned long long)st->pages_free,
            (unsigned long long)st->pages_total, (unsigned long long)st->page_bytes,
            (unsigned long long)st->evictions);
    fprintf(f, "  batched decode: %llu steps carried %llu session-steps; %llu also carried a prompt chunk\n",
            (unsigned long long)st->batched_steps, (unsigned long long)st->batched_rows,
            (unsigned long long)st->mixed_steps);
    fprintf(f, "  generation steps: %llu, mean %.3f ms each in the worker, %.3f ms of it in the engine's step\n",
            (unsigned long long)st->gen_steps, st->step_ms, st->step_engine_ms);
    fprintf(f, "  decode graphs: %llu recorded, %llu replays, %llu refused\n", (unsigned long long)st->graph_captures,
            (unsigned long long)st->graph_replays, (unsigned long long)st->graph_failures);
    if (st->prefix.enabled)
        fprintf(f, "  prefix cache: %llu KV blocks (%llu pages; %llu blocks unreferenced), %llu hits saved %llu prompt "
                   "tokens, %llu evicted\n", (unsigned long long)st->prefix.blocks,
                (unsigned long long)st->prefix.pages, (unsigned long long)st->prefix.blocks_unreferenced,
                (unsigned long long)st->prefix.hits, (unsigned long long)st->prefix.tokens_mapped,
                (unsigned long long)st->prefix.evictions);
    else
        fprintf(f, "  prefix cache: off\n");
    if (st->disk.enabled)
        fprintf(f, "  disk tier: %.1f of %.1f MiB (%llu sessions), %llu spills (%.1f MiB in %.3f s), %llu reads back "
                   "(%.1f MiB in %.3f s), %s I/O; %llu bad pages, %llu sessions recomputed\n",
                (double)st->disk.used / 1048576.0, (double)st->disk.capacity / 1048576.0,
                (unsigned long long)st->disk.sessions, (unsigned long long)st->disk.spills,
                (double)st->disk.bytes_written / 1048576.0, st->disk.write_s, (unsigned long long)st->disk.reads,
                (double)st->disk.bytes_read / 1048576.0, st->disk.read_s, st->disk.direct ? "direct" : "buffered",
                (unsigned long long)st->disk.bad_pages, (unsigned long long)st->disk.recoveries);
    fprintf(f, "models (%zu served, %llu in the text segment):\n", st->n_models, (unsigned long long)st->vmu_models);
    for (size_t i = 0; i < st->n_models; i++) {
        const dj_client_model *m = &st->models[i];
        fprintf(f, "  %-24s refs %u", m->name, m->refs);
        if (m->streamed_layers) {
            fprintf(f, "; %u of %u layers streamed through a %.1f MiB ring (%.1f MiB a step), %.1f MiB resident",
                    m->streamed_layers, m->layers, m->ring_bytes / 1048576.0, m->streamed_bytes / 1048576.0,
                    m->resident_bytes / 1048576.0);
            if (m->host_layers)
                fprintf(f, "; %u%% of the FFN of %u of them on the host's cores",
                        m->host_share_pct ? m->host_share_pct : 100, m->host_layers);
        } else if (m->layers)
            fprintf(f, "; all %u layers resident (%.1f MiB)", m->layers, m->resident_bytes / 1048576.0);
        fputc('\n', f);
    }
    fprintf(f, "sessions (%zu):\n", st->n_sessions);
    for (size_t i = 0; i < st->n_sessions; i++) {
        const dj_client_session_info *s = &st->sessions[i];
        fprintf(f, "  %016llx  %-16s %-11s pos %-6u lease %5llu ms  %-9s KV %.2f MiB (%.2f MiB in the pool, "
                   "%llu swaps)%s\n",
                (unsigned long long)s->id, s->model, s->qos, s->pos, (unsigned long long)s->lease_left_ms, s->state,
                s->kv_bytes / mib, s->pooled_bytes / mib, (unsigned long long)s->swaps,
                s->generating ? "  generating" : "");
    }
    fprintf(f, "queues:");
    for (int q = 0; q < DJ_QOS_COUNT; q++)
        fprintf(f, "  %s %llu waiting / %llu running", dj_qos_name((dj_qos)q), (unsigned long long)st->waiting[q],
                (unsigned long long)st->running[q]);
    const dj_client_swap *w = &st->swap;
    fprintf(f, "\nswap (%s): pool %.2f of %.2f MiB used (peak %.2f); %llu out (%.2f MiB), %llu in (%.2f MiB); "
               "%llu prefetched, %llu preemptions, %llu KV drops; %llu pages reserved\n",
            w->policy, w->pool_used / mib, w->pool_bytes / mib, w->pool_peak / mib, (unsigned long long)w->swaps_out,
            w->bytes_out / mib, (unsigned long long)w->swaps_in, w->bytes_in / mib, (unsigned long long)w->prefetches,
            (unsigned long long)w->preemptions, (unsigned long long)w->kv_drops, (unsigned long long)w->pages_reserved);
    fprintf(f, "connections %llu, handles %llu\n", (unsigned long long)st->connections,
            (unsigned long long)st->handles);
    if (st->map) fprintf(f, "VMU map:\n%s", st->map);
}
