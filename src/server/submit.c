/* submit.c: portals - djinnd's in-process connections (the HTTP door's): a
 * mailbox of ops to the loop thread, which hands their typed requests to dj__submit, and typed events back. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "djinn/alloc.h"
#include "server/server_impl.h"
#include "server/submit.h"

typedef enum op_kind { OP_OPEN, OP_POST, OP_CLOSE } op_kind;

/* One thing a portal asks of the loop. */
typedef struct portal_op {
    struct portal_op *next;
    op_kind kind;
    dj__portal *p;
    dj__request r; /* OP_POST */
} portal_op;

struct dj__portal {
    dj__server *s;
    atomic_int refs;          /* its user's and (once open) the loop's connection's */
    int efd;                  /* eventfd: written when an event (or the open's answer, or the end) arrives */
    pthread_mutex_t mu;       /* the fields below */
    dj__event *head, *tail;   /* answers not yet taken */
    bool opened;              /* the loop answered the open: open_st */
    dj_status open_st;
    char open_err[256];
    bool dead;                /* its connection is gone (the daemon stopped, or its answers could not be kept) */
    /* the user's side only */
    uint64_t next_req;
    /* the loop's side only */
    struct dj__conn *conn;    /* NULL until open, and after its close */
    bool has_tk;
    dj__token tk;             /* the token it was opened for (copied: a SIGHUP may replace the table) */
    portal_op close_op;       /* posting the close allocates nothing */
};

/* The loop's mailbox of portal ops (dj__server.portals). */
typedef struct dj__portals {
    pthread_mutex_t mu;
    uv_async_t wake;
    portal_op *head, *tail;
    bool stopped;             /* the loop stops: no op is taken any more */
} dj__portals;

static void wake_fd(int fd) {
    const uint64_t one = 1;
    ssize_t k;
    do k = write(fd, &one, sizeof one);
    while (k < 0 && errno == EINTR);
}

static void portal_unref(dj__portal *p) {
    if (!p || atomic_fetch_sub(&p->refs, 1) != 1) return;
    for (dj__event *e = p->head, *n; e; e = n) {
        n = e->next;
        dj__event_free(e);
    }
    close(p->efd);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* Marks p dead and wakes its user (any thread). */
static void portal_end(dj__portal *p) {
    pthread_mutex_lock(&p->mu);
    p->dead = true;
    pthread_mutex_unlock(&p->mu);
    wake_fd(p->efd);
}

static void open_answer(dj__portal *p, dj_status st, const char *msg) {
    pthread_mutex_lock(&p->mu);
    p->opened = true;
    p->open_st = st;
    snprintf(p->open_err, sizeof p->open_err, "%s", msg ? msg : "");
    pthread_mutex_unlock(&p->mu);
    wake_fd(p->efd);
}

/* Loop thread: one op. */
static void op_run(dj__server *s, portal_op *o, bool stopped) {
    dj__portal *p = o->p;
    switch (o->kind) {
    case OP_OPEN: {
        dj_status st = DJ_EIO;
        struct dj__conn *c = stopped ? NULL : dj__conn_portal(s, p, p->has_tk ? &p->tk : NULL, &st);
        if (stopped) dj_fail(DJ_EIO, "djinnd is stopping");
        if (c) {
            p->conn = c;
            open_answer(p, DJ_OK, NULL);
        } else {
            open_answer(p, st, dj_last_error());
            portal_unref(p); /* the loop's reference: no connection holds it */
        }
        free(o);
        return;
    }
    case OP_POST:
        if (p->conn && !stopped) {
            dj__submit(p->conn, &o->r, NULL, NULL);
        } else {
            dj__event *e = dj__event_error(0, o->r.type, o->r.id, DJ_EIO, "djinnd is stopping", false);
            dj__request_free(&o->r);
            if (e) dj__portal_deliver(p, e);
            else portal_end(p);
        }
        free(o);
        return;
    case OP_CLOSE: /* the op is the portal's own (close_op) */
        if (p->conn) dj__conn_portal_close(p->conn); /* releases the loop's reference */
        portal_unref(p);                             /* the user's */
        return;
    }
}

static void on_portal_ops(uv_async_t *a) {
    dj__server *s = a->data;
    dj__portals *ps = s->portals;
    pthread_mutex_lock(&ps->mu);
    portal_op *o = ps->head;
    ps->head = ps->tail = NULL;
    const bool stopped = ps->stopped;
    pthread_mutex_unlock(&ps->mu);
    while (o) {
        portal_op *n = o->next;
        op_run(s, o, stopped);
        o = n;
    }
}

/* false: the loop stops (the op is not taken). */
static bool op_push(dj__portals *ps, portal_op *o) {
    pthread_mutex_lock(&ps->mu);
    const bool ok = !ps->stopped;
    if (ok) {
        o->next = NULL;
        if (ps->tail) ps->tail->next = o;
        else ps->head = o;
        ps->tail = o;
        uv_async_send(&ps->wake); /* under mu: the handle is not closed meanwhile (dj__portals_stop) */
    }
    pthread_mutex_unlock(&ps->mu);
    return ok;
}

dj_status dj__portals_init(dj__server *s) {
    dj__portals *ps = dj_calloc(1, sizeof *ps);
    if (!ps) return dj_fail(DJ_ENOMEM, "out of memory");
    if (pthread_mutex_init(&ps->mu, NULL)) {
        free(ps);
        return dj_fail(DJ_EINTERNAL, "cannot create a lock");
    }
    if (uv_async_init(&s->loop, &ps->wake, on_portal_ops) < 0) {
        pthread_mutex_destroy(&ps->mu);
        free(ps);
        return dj_fail(DJ_EIO, "uv_async_init failed");
    }
    ps->wake.data = s;
    s->portals = ps;
    return DJ_OK;
}

void dj__portals_stop(dj__server *s) {
    dj__portals *ps = s->portals;
    if (!ps) return;
    pthread_mutex_lock(&ps->mu);
    const bool was = ps->stopped;
    ps->stopped = true;
    pthread_mutex_unlock(&ps->mu);
    if (was) return;
    on_portal_ops(&ps->wake); /* what was posted before: opens refused, requests answered EIO, closes done */
    dj__portals_close_conns(s);
}

void dj__portals_fini(dj__server *s) {
    dj__portals *ps = s->portals;
    if (!ps) return;
    pthread_mutex_destroy(&ps->mu);
    free(ps);
    s->portals = NULL;
}

void dj__portal_deliver(dj__portal *p, dj__event *e) {
    e->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->tail) p->tail->next = e;
    else p->head = e;
    p->tail = e;
    pthread_mutex_unlock(&p->mu);
    wake_fd(p->efd);
}

void dj__portal_release(dj__portal *p) {
    p->conn = NULL;
    portal_end(p);
    portal_unref(p);
}

void dj__portal_fail(dj__portal *p) { portal_end(p); }

/* Waits for the eventfd (or watch_fd's hang-up, or the timeout): 1 woken, 0 timeout, -1 hung up. */
static int wait_fd(int efd, int watch_fd, int timeout_ms) {
    struct pollfd f[2] = {{.fd = efd, .events = POLLIN}, {.fd = watch_fd, .events = POLLRDHUP}};
    int rc;
    do rc = poll(f, watch_fd >= 0 ? 2 : 1, timeout_ms);
    while (rc < 0 && errno == EINTR);
    if (rc <= 0) return 0;
    if (watch_fd >= 0 && f[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return -1;
    if (f[0].revents & POLLIN) {
        uint64_t v;
        ssize_t k;
        do k = read(efd, &v, sizeof v);
        while (k < 0 && errno == EINTR);
    }
    return 1;
}

dj_status dj__portal_open(dj__server *s, const dj__token *tk, dj__portal **out) {
    *out = NULL;
    if (!s || !s->portals) return dj_fail(DJ_EIO, "no daemon behind this door");
    dj__portal *p = dj_calloc(1, sizeof *p);
    portal_op *o = dj_calloc(1, sizeof *o);
    if (!p || !o) {
        free(p);
        free(o);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->efd < 0 || pthread_mutex_init(&p->mu, NULL)) {
        if (p->efd >= 0) close(p->efd);
        free(p);
        free(o);
        return dj_fail(DJ_EIO, "an eventfd for a portal: %s", strerror(errno));
    }
    p->s = s;
    atomic_init(&p->refs, 2);
    if (tk) {
        p->tk = *tk;
        p->has_tk = true;
    }
    p->close_op.kind = OP_CLOSE;
    p->close_op.p = p;
    o->kind = OP_OPEN;
    o->p = p;
    if (!op_push(s->portals, o)) {
        free(o);
        atomic_store(&p->refs, 1);
        portal_unref(p);
        return dj_fail(DJ_EIO, "djinnd is stopping");
    }
    for (;;) {
        pthread_mutex_lock(&p->mu);
        const bool done = p->opened;
        pthread_mutex_unlock(&p->mu);
        if (done) break;
        wait_fd(p->efd, -1, -1);
    }
    if (p->open_st != DJ_OK) {
        const dj_status st = dj_fail(p->open_st, "%s", p->open_err);
        portal_unref(p);
        return st;
    }
    *out = p;
    return DJ_OK;
}

dj_status dj__portal_post(dj__portal *p, dj__request *r, uint64_t *req) {
    portal_op *o = dj_calloc(1, sizeof *o);
    if (!o) {
        dj__request_free(r);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    o->kind = OP_POST;
    o->p = p;
    o->r = *r;
    o->r.id = ++p->next_req;
    o->r.body = NULL;
    memset(r, 0, sizeof *r);
    *req = o->r.id;
    if (!op_push(p->s->portals, o)) {
        dj__request_free(&o->r);
        free(o);
        return dj_fail(DJ_EIO, "djinnd is stopping");
    }
    return DJ_OK;
}

dj_status dj__portal_next(dj__portal *p, int watch_fd, int timeout_ms, dj__event **out) {
    *out = NULL;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        dj__event *e = p->head;
        if (e && !(p->head = e->next)) p->tail = NULL;
        const bool dead = p->dead;
        pthread_mutex_unlock(&p->mu);
        if (e) {
            e->next = NULL;
            *out = e;
            return DJ_OK;
        }
        if (dead) return dj_fail(DJ_EIO, "djinnd closed this request's connection (stopping, or out of memory)");
        const int w = wait_fd(p->efd, watch_fd, timeout_ms);
        if (w <= 0) return DJ_OK; /* the client hung up, or the time passed */
    }
}

dj_status dj__portal_call(dj__portal *p, dj__request *r, dj__event **reply) {
    if (reply) *reply = NULL;
    uint64_t id;
    dj_status st = dj__portal_post(p, r, &id);
    while (st == DJ_OK) {
        dj__event *e = NULL;
        if ((st = dj__portal_next(p, -1, -1, &e)) != DJ_OK) break;
        if (!e || e->req != id || (e->kind != DJ__EV_REPLY && e->kind != DJ__EV_ERROR)) {
            dj__event_free(e); /* a late event of an earlier request */
            continue;
        }
        if (e->kind == DJ__EV_ERROR) {
            st = dj_fail(e->u.error.st, "%s", e->u.error.msg[0] ? e->u.error.msg : dj_strerror(e->u.error.st));
            dj__event_free(e);
            break;
        }
        if (reply) *reply = e;
        else dj__event_free(e);
        return DJ_OK;
    }
    return st;
}

void dj__portal_close(dj__portal *p) {
    if (!p) return;
    if (!op_push(p->s->portals, &p->close_op)) portal_unref(p); /* stopping: the loop closed its connection */
}
