/* http.c: djinnd's OpenAI-compatible HTTP front door - libmicrohttpd, one
 * thread per connection, each request a portal into the daemon (submit.h:
 * typed requests through the same dj__submit, scheduler, QoS classes, limits
 * and tokens as the binary protocol; closing it frees the generation),
 * answers as OpenAI's JSON or server-sent events; and the live view's page,
 * stats and stats events (http_view.c draws them). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include "djinn/alloc.h"
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "core/file.h"
#include "djinn/checkpoint.h"
#include "server/access.h"
#include "server/adapter.h"
#include "server/http_impl.h"

/* How often the watchdog looks at the connections' deadlines. */
#define POLL_MS 100
/* GET /v1/djinn/events: one event this often. */
#define EVENTS_MS 500
/* ... and at most this many when the client asks for a count. */
#define EVENTS_MAX_COUNT 1000000
/* An idle session kept for reuse goes after this long unused. */
#define IDLE_TTL_S 600.0
/* A connection over --http-max-per-address has this long to send its
 * headers (and be answered 429) before it is closed. */
#define OVER_ADDR_GRACE_S 2.0
/* A connection waiting for its headers this long is closed when a new one
 * finds --http-max-unauth waiting. */
#define EVICT_AFTER_S 1.0
/* Bodies being received at once hold at most this many times --http-max-body
 * in all; a body past that gets 503. */
#define BODIES_IN_FLIGHT 8
/* A request body's JSON may hold the model's positions plus this many values
 * (each a parsed node of ~100 bytes); more get 413 before it is parsed. */
#define JSON_VALUES_SPARE 65536

/* Where a connection is (hconn.state). */
typedef enum hconn_state {
    HCONN_HEADERS, /* waiting for a request's headers: --http-header-timeout-s from when it began waiting */
    HCONN_BODY,    /* its headers came: --http-body-timeout-s for the body */
    HCONN_SERVING  /* answering: no deadline (a token's share of requests bounds these) */
} hconn_state;

/* One HTTP connection, on dj__http.conns from MHD's NOTIFY_STARTED to its
 * NOTIFY_CLOSED (MHD's socket_context; under dj__http.cmu): the watchdog
 * shuts its socket down when it passes its deadline (MHD, seeing the end,
 * closes it: MHD closes the fd only after NOTIFY_CLOSED, so fd stays valid
 * while it is listed). */
typedef struct hconn {
    struct hconn *prev, *next;
    int fd;
    uint64_t peer;       /* peer_key */
    hconn_state state;
    double since;        /* when the state began (monotonic s): the oldest waiting one goes first */
    double deadline;     /* monotonic s; 0: none */
    bool over_addr;      /* its address had --http-max-per-address already: answered 429 */
    bool cut;            /* shut down by the watchdog or the pool */
    bool tenant;         /* a request of token[] is running on it (--http-max-per-token counts these) */
    char token[DJ__TOKEN_MAX + 1];
} hconn;

/* A finished generation's session, kept with its connection so that a later
 * request whose prompt starts with its tokens feeds only the rest
 * (docs/prefix-cache.md). Owned by the pool (dj__http.idle) while idle. */
typedef struct idle_sess {
    dj__portal *p;           /* owned: closing it frees the session in the daemon */
    uint64_t session;
    char model[128];
    dj_qos qos;
    char token[DJ__TOKEN_MAX + 1]; /* only a request with the same bearer token takes it */
    char salt[DJ__SALT_BYTES_MAX + 1]; /* and the same cache_salt ("": none) */
    int32_t *ids;            /* [n] the tokens the session holds: its KV, then its pending token; owned */
    size_t n;
    uint32_t ctx;            /* its context (positions) */
    double at;               /* when it went idle (monotonic s) */
    struct idle_sess *next;
} idle_sess;

struct dj__http {
    dj__http_cfg cfg;
    struct MHD_Daemon *mhd;
    pthread_mutex_t mu; /* models, peers, idle */
    pthread_mutex_t cmu; /* active, conns, body_bytes (never held for I/O: the accept thread and the
                            watchdog take it) */
    dj__http_model *models;
    dj__map peers;      /* failed bearer tokens per peer (guard.c's rule) */
    uint32_t active;    /* requests being served */
    hconn *conns;       /* every open connection, newest first */
    uint64_t body_bytes; /* request body bytes buffered now (all requests) */
    pthread_t watchdog; /* the deadlines (watchdog_main) */
    bool watchdog_on;
    idle_sess *idle;    /* [n_idle] newest first, at most cfg.reuse */
    uint32_t n_idle;
    int stopping;       /* set by dj__http_stop (__atomic): event streams end */
};

/* Per request (MHD's *req_cls). */
typedef struct hreq {
    dj__http *h;
    hconn *hc;      /* its connection (NULL: MHD gave none) */
    dj__buf body;
    bool too_big, busy, responded, counted;
    size_t held;    /* body bytes counted in dj__http.body_bytes */
    char token[DJ__TOKEN_MAX + 1]; /* the bearer token ("" without --token-file) */
    const dj__token *tk;           /* its entry of the token file (NULL without one) */
    char access[160];              /* "METHOD URL", its start and answer's status: its access line */
    double access_t0;
    unsigned status;
} hreq;

/* A server-sent event stream (text/event-stream), both kinds: MHD's reader
 * (stream_read, in the connection's own thread) hands out the bytes fill
 * appended to out, and calls fill again when they are gone. fill blocks
 * until it has something (looking at the client every POLL_MS) and returns
 * 0 (more to come), 1 (what it appended ends the stream) or -1 (the client
 * left, or out of memory: the connection closes). done frees the owner
 * (once, when MHD is through with the response). */
typedef struct hstream {
    dj__buf out;      /* event bytes not yet handed to MHD */
    size_t out_off;
    bool last;        /* fill said the end is in out */
    int (*fill)(struct hstream *s);
    void (*done)(struct hstream *s);
} hstream;

/* A generation being answered (both modes). */
typedef struct hgen {
    hstream s;        /* stream: first, so that an hstream * is its hgen * */
    dj__http *h;
    struct MHD_Connection *conn;
    int fd;              /* its client's socket: a hang-up ends the wait for the next event */
    dj__portal *p;       /* owned: closing it frees the session (and stops a generation still running) */
    uint64_t gen_req;    /* the GENERATE's request id (0: not posted) */
    dj__oai o;
    bool ended;
    /* for reuse: the session, its context, the ids it was fed and emitted */
    uint64_t session;
    uint32_t ctx;
    char token[DJ__TOKEN_MAX + 1];
    int32_t *gen_ids;    /* [n_gen] emitted ids (malloc'd) */
    size_t n_gen, cap_gen;
    bool done;           /* DONE came: res below holds it */
    struct {
        uint32_t n_generated, pos;
        int64_t stop_id; /* -1: none */
        const char *reason;
    } res;
} hgen;

/* ---- answers ---- */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *body, size_t len, const char *ctype) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body ? body : "", body ? MHD_RESPMEM_MUST_FREE
                                                                                        : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"djinnd\"");
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply_error(hreq *q, struct MHD_Connection *c, unsigned status, const char *fmt, ...) {
    char raw[768], msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    dj__scrub_message(raw, msg, sizeof msg); /* no heap addresses or store paths leave */
    size_t len;
    char *body = dj__oai_error((int)status, msg, &len);
    if (q) q->responded = true, q->status = status;
    return reply(c, status, body, len, "application/json");
}

/* The HTTP status of a daemon error. */
static unsigned status_of(dj_status st) {
    switch (st) {
    case DJ_EINVAL:
    case DJ_EFORMAT:
    case DJ_ERANGE:
    case DJ_EUNSUPPORTED: return 400;
    case DJ_ENOTFOUND: return 404;
    case DJ_EQUOTA: return 429;
    case DJ_EBUSY:
    case DJ_ENOSPC:
    case DJ_ENOMEM:
    case DJ_EIO: return 503;
    default: return 500;
    }
}

/* ---- peers and tokens ---- */
static uint64_t peer_key(struct MHD_Connection *c, bool *local) {
    *local = false;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!ci || !ci->client_addr) return 0;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET) {
        const uint32_t a = ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr);
        *local = (a >> 24) == 127;
        return (uint64_t)0xffff << 32 | a;
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
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

/* 0 when the request may go on (q->token set), else the status answered.
 * query: the token may come as ?access_token=TOKEN (RFC 6750 2.3) when
 * there is no Authorization header - for GET /v1/djinn/events, since a
 * browser's EventSource cannot send headers. */
static unsigned authorize(hreq *q, struct MHD_Connection *c, bool query) {
    dj__http *h = q->h;
    bool local;
    const uint64_t key = peer_key(c, &local);
    if (!h->cfg.n_auth) return local ? 0 : 403;
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *tok = dj__bearer_of(v);
    if (!v && query) tok = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "access_token");
    /* a peer's wrong tokens slow its next ones down, as HELLO's do */
    pthread_mutex_lock(&h->mu);
    uint64_t now = dj__now_ms(), at = dj__peer_hello_at(&h->peers, key, now);
    pthread_mutex_unlock(&h->mu);
    if (at > now + 10000) return 503;
    if (at > now) {
        struct timespec ts = {(time_t)((at - now) / 1000), (long)((at - now) % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    const dj__token *tk = tok && strlen(tok) <= DJ__TOKEN_MAX /* the last SIGHUP's tokens (reload.c) */
                              ? dj__token_find_live(h->cfg.auth, h->cfg.n_auth, tok, strlen(tok))
                              : NULL;
    const bool ok = tk != NULL;
    pthread_mutex_lock(&h->mu);
    dj__peer_hello_result(&h->peers, key, dj__now_ms(), ok);
    pthread_mutex_unlock(&h->mu);
    if (!ok) return 401;
    snprintf(q->token, sizeof q->token, "%s", tok);
    q->tk = tk;
    return 0;
}

/* ---- models of the store ---- */
static bool name_ok(const char *name) {
    if (!name[0] || name[0] == '.') return false;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == '-'))
            return false;
    return true;
}

/* The model's entry, loaded on first use (NULL: not in the store). */
static const dj__http_model *model_get(dj__http *h, const char *name) {
    if (!name_ok(name)) return NULL;
    pthread_mutex_lock(&h->mu);
    dj__http_model *m = h->models;
    while (m && strcmp(m->name, name)) m = m->next;
    if (m) {
        pthread_mutex_unlock(&h->mu);
        return m;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/config.json", h->cfg.models, name);
    size_t len = 0;
    char *cfg_text = NULL;
    FILE *f = NULL;
    (void)dj__file_fopen(path, &f); /* never blocks on a FIFO; regular files only (else: no such model) */
    if (f) {
        dj__buf b = {0};
        char chunk[8192];
        size_t k;
        while ((k = fread(chunk, 1, sizeof chunk, f)) > 0 && b.n < (1u << 20)) dj__buf_put(&b, chunk, k);
        fclose(f);
        cfg_text = b.p;
        len = b.n;
    }
    dj_model_config mc;
    if (!cfg_text || dj_model_config_parse(cfg_text, len, &mc) != DJ_OK || !(m = dj_calloc(1, sizeof *m))) {
        free(cfg_text);
        pthread_mutex_unlock(&h->mu);
        return NULL;
    }
    free(cfg_text);
    snprintf(m->name, sizeof m->name, "%s", name);
    m->max_pos = mc.max_position_embeddings;
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", h->cfg.models, name);
    if (dj_tokenizer_load(path, &m->tok) != DJ_OK) {
        DJ_LOG(INFO, "http: model %s: no tokenizer: %s", name, dj_last_error());
        m->tok = NULL;
    }
    m->max_tok_bytes = dj__oai_max_token_bytes(m->tok);
    snprintf(path, sizeof path, "%s/%s", h->cfg.models, name);
    if (dj_chat_template_load(path, &m->tpl) != DJ_OK) {
        snprintf(m->tpl_why, sizeof m->tpl_why, "%s", dj_last_error());
        m->tpl = NULL;
    }
    m->next = h->models;
    h->models = m;
    pthread_mutex_unlock(&h->mu);
    return m;
}

/* ---- the daemon, through portals ---- */
/* The client's socket (-1: none known): waits on a portal end when it hangs up. */
static int client_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Whether the daemon still holds session sid for portal p (a HEARTBEAT naming it renews it). */
static bool session_alive(dj__portal *p, uint64_t sid) {
    dj__event *rep = NULL;
    const bool ok = dj__portal_call(p, &(dj__request){.type = DJ_MSG_HEARTBEAT, .session = sid}, &rep) == DJ_OK &&
                    rep->renewed == 1;
    dj__event_free(rep);
    return ok;
}

/* ---- idle sessions: the prefix-reuse pool ---- */
static void idle_free(idle_sess *e) {
    if (!e) return;
    dj__portal_close(e->p);
    free(e->ids);
    free(e);
}

/* The kept session whose tokens are the longest proper prefix of ids[n]
 * (same model, class and token; context >= need), out of the pool; NULL if
 * none. Entries past IDLE_TTL_S go on the way. */
static idle_sess *idle_take(dj__http *h, const dj__oai *o, const char *token, uint32_t need) {
    idle_sess *best = NULL, **best_at = NULL, *dead = NULL;
    const double now = dj__now();
    pthread_mutex_lock(&h->mu);
    for (idle_sess **p = &h->idle; *p;) {
        idle_sess *e = *p;
        if (now - e->at > IDLE_TTL_S) {
            *p = e->next;
            e->next = dead;
            dead = e;
            h->n_idle--;
            continue;
        }
        if (!strcmp(e->model, o->model) && e->qos == o->qos && !strcmp(e->token, token) &&
            !strcmp(e->salt, o->cache_salt ? o->cache_salt : "") && e->n < o->n_ids &&
            e->ctx >= need && (!best || e->n > best->n) && !memcmp(e->ids, o->ids, e->n * sizeof *e->ids)) {
            best = e;
            best_at = p;
        }
        p = &e->next;
    }
    if (best) {
        *best_at = best->next;
        h->n_idle--;
    }
    pthread_mutex_unlock(&h->mu);
    while (dead) {
        idle_sess *n = dead->next;
        idle_free(dead);
        dead = n;
    }
    return best;
}

/* Into the pool (owned by it from now on); the least recently used one goes
 * when it is full. */
static void idle_put(dj__http *h, idle_sess *e) {
    idle_sess *victim = NULL;
    e->at = dj__now();
    pthread_mutex_lock(&h->mu);
    e->next = h->idle;
    h->idle = e;
    if (++h->n_idle > h->cfg.reuse) { /* the last one is the oldest */
        idle_sess **p = &h->idle;
        while ((*p)->next) p = &(*p)->next;
        victim = *p;
        *p = NULL;
        h->n_idle--;
    }
    pthread_mutex_unlock(&h->mu);
    idle_free(victim);
}

/* After the generation: its session into the pool when it ended cleanly
 * (DONE with "length" or "stop", not cut by a stop string or a client that
 * left) and the daemon's position agrees with the tokens we know; else the
 * connection closes, which frees the session (and stops a generation still
 * running). */
static void gen_close(hgen *g) {
    if (!g->p) return;
    const dj__oai *o = &g->o;
    const size_t n = o->n_ids + g->n_gen + (g->res.stop_id >= 0 ? 1 : 0);
    idle_sess *e = NULL;
    if (g->h->cfg.reuse && g->done && strcmp(g->res.reason, "context") && g->n_gen == g->res.n_generated &&
        (size_t)g->res.pos + 1 == n && (e = dj_calloc(1, sizeof *e)) && (e->ids = dj_malloc(n * sizeof *e->ids))) {
        memcpy(e->ids, o->ids, o->n_ids * sizeof *e->ids);
        if (g->n_gen) memcpy(e->ids + o->n_ids, g->gen_ids, g->n_gen * sizeof *e->ids);
        if (g->res.stop_id >= 0) e->ids[n - 1] = g->res.stop_id;
        e->n = n;
        e->p = g->p;
        e->session = g->session;
        e->ctx = g->ctx;
        e->qos = o->qos;
        snprintf(e->model, sizeof e->model, "%s", o->model);
        snprintf(e->token, sizeof e->token, "%s", g->token);
        snprintf(e->salt, sizeof e->salt, "%s", o->cache_salt ? o->cache_salt : "");
        g->p = NULL;
        idle_put(g->h, e);
        return;
    }
    if (e) free(e);
    dj__portal_close(g->p); /* the daemon frees a generation still running */
    g->p = NULL;
}

static void gen_free(hgen *g) {
    if (!g) return;
    gen_close(g);
    dj__oai_free(&g->o);
    dj__buf_free(&g->s.out);
    free(g->gen_ids);
    free(g);
}

/* Connect, open a session and start the generation; 0 or an HTTP status
 * with err. */
static unsigned gen_start(hgen *g, const hreq *q, const dj__http_model *m, char *err, size_t cap) {
    dj__oai *o = &g->o;
    /* the context a fresh session gets: prompt + max_tokens, or the daemon's
     * default (the model's, capped at 4096) with room for 256 more */
    const uint32_t dflt = m->max_pos < 4096 ? m->max_pos : 4096;
    uint32_t ctx = dflt;
    if (o->max_given) {
        uint64_t want = (uint64_t)o->n_ids + o->max_tokens;
        ctx = want < m->max_pos ? (uint32_t)want : m->max_pos;
    } else if (o->n_ids + 256 > 4096) {
        uint64_t want = (uint64_t)o->n_ids + 256;
        ctx = want < m->max_pos ? (uint32_t)want : m->max_pos;
    }
    snprintf(g->token, sizeof g->token, "%s", q->token);
    /* a kept session whose tokens start the prompt: the same end as a fresh
     * one (its context holds the whole request; without max_tokens, where
     * the context is the end, exactly the fresh one's) */
    idle_sess *e = g->h->cfg.reuse ? idle_take(g->h, o, q->token, ctx) : NULL;
    if (e && !o->max_given && e->ctx != ctx) {
        idle_put(g->h, e);
        e = NULL;
    }
    if (e && !session_alive(e->p, e->session)) { /* gone meanwhile (the daemon dropped it) */
        idle_free(e);
        e = NULL;
    }
    dj_status st;
    if (e) {
        g->p = e->p;
        g->session = e->session;
        g->ctx = e->ctx;
        o->cached = e->n;
        e->p = NULL;
        idle_free(e);
    } else {
        if ((st = dj__portal_open(g->h->cfg.srv, q->tk, &g->p)) != DJ_OK) {
            snprintf(err, cap, "djinnd: %s", dj_last_error());
            return st == DJ_EINVAL ? 401 : status_of(st);
        }
        /* with reuse on, a session opens with at least the default context
         * (it costs nothing until used: admission reserves prompt + max_tokens) */
        g->ctx = g->h->cfg.reuse && o->max_given && ctx < dflt ? dflt : ctx;
        char base[128], lora[128]; /* "base:adapter" (docs/lora.md): checked where the model was looked up */
        if (dj__adapter_split(o->model, base, sizeof base, lora, sizeof lora) != DJ_OK)
            return snprintf(err, cap, "%s", dj_last_error()), 400;
        dj__request r = {.type = DJ_MSG_SESSION_OPEN};
        snprintf(r.u.open.model, sizeof r.u.open.model, "%s", base);
        r.u.open.qos = o->qos;
        r.u.open.expected_tokens = g->ctx;
        dj__event *rep = NULL;
        if ((st = dj__portal_call(g->p, &r, &rep)) != DJ_OK) {
            snprintf(err, cap, "djinnd: %s", dj_last_error());
            return status_of(st);
        }
        g->session = rep->u.open.session;
        dj__event_free(rep);
    }
    dj__request r = {.type = DJ_MSG_GENERATE, .session = g->session};
    dj__req_generate *gr = &r.u.gen;
    const size_t n = o->n_ids - o->cached;
    gr->max_tokens = o->max_given ? o->max_tokens : (1u << 30);
    gr->s.sampling = o->sampling;
    gr->s.logprobs = o->logprobs;
    gr->s.top_logprobs = o->top_logprobs;
    bool oom = !(gr->ids = dj_malloc((n ? n : 1) * sizeof *gr->ids));
    if (!oom) memcpy(gr->ids, o->ids + o->cached, n * sizeof *gr->ids);
    gr->n_ids = n;
    if (!oom && o->cache_salt) {
        gr->salt_len = strlen(o->cache_salt);
        oom = !(gr->cache_salt = dj_strdup(o->cache_salt));
    }
    char base[128], lora[128];
    if (dj__adapter_split(o->model, base, sizeof base, lora, sizeof lora) == DJ_OK && lora[0])
        snprintf(gr->adapter, sizeof gr->adapter, "%s", lora);
    if (!oom && o->n_logit_bias) {
        oom = !(gr->s.logit_bias = dj_malloc(o->n_logit_bias * sizeof *gr->s.logit_bias));
        if (!oom) {
            memcpy(gr->s.logit_bias, o->logit_bias, o->n_logit_bias * sizeof *gr->s.logit_bias);
            gr->s.n_logit_bias = o->n_logit_bias;
        }
    }
    if (!oom && o->json_schema) {
        gr->schema_len = strlen(o->json_schema);
        oom = !(gr->json_schema = dj_strdup(o->json_schema));
    }
    if (oom) {
        dj__request_free(&r);
        snprintf(err, cap, "out of memory");
        return 503;
    }
    if ((st = dj__portal_post(g->p, &r, &g->gen_req)) != DJ_OK) {
        snprintf(err, cap, "djinnd: %s", dj_last_error());
        return status_of(st);
    }
    return 0;
}

/* One event of the generation: waits until the daemon sends one or the HTTP
 * client hangs up. 0 on progress, -1 when the HTTP client left, else the
 * status of the daemon's error (err set). */
static int gen_step(hgen *g, char *err, size_t cap) {
    dj__event *e = NULL;
    dj_status st = dj__portal_next(g->p, g->fd, -1, &e);
    if (st != DJ_OK) {
        snprintf(err, cap, "djinnd: %s", dj_last_error());
        g->ended = true;
        return (int)status_of(st);
    }
    if (!e) return -1; /* the client hung up */
    if (e->req != g->gen_req) { /* nothing else of this portal's is in flight: not ours */
        dj__event_free(e);
        return 0;
    }
    if (e->kind == DJ__EV_ERROR) {
        st = e->u.error.st;
        char msg[sizeof e->u.error.msg];
        dj__scrub_message(e->u.error.msg, msg, sizeof msg);
        snprintf(err, cap, "djinnd: %.480s", msg[0] ? msg : dj_strerror(st));
        dj__event_free(e);
        g->ended = true;
        return (int)status_of(st);
    }
    if (e->kind == DJ__EV_TOKEN) {
        const dj__ev_token *t = &e->u.token;
        g->o.n_generated++;
        if (g->n_gen == g->cap_gen) { /* for reuse; a failed growth only spoils that (gen_close checks) */
            const size_t c = g->cap_gen ? 2 * g->cap_gen : 64;
            int32_t *v = dj_realloc(g->gen_ids, c * sizeof *v);
            if (v) g->gen_ids = v, g->cap_gen = c;
        }
        if (g->n_gen < g->cap_gen) g->gen_ids[g->n_gen++] = t->id;
        if (t->has_logprobs) dj__oai_logprobs(&g->o, &t->lp); /* before its text */
        dj__oai_text(&g->o, t->has_text ? t->text : "", t->has_text ? t->text_len : 0);
    } else if (e->kind == DJ__EV_DONE) {
        const dj__ev_done *d = &e->u.done;
        g->done = true;
        g->res.n_generated = d->n_generated;
        g->res.pos = d->pos;
        g->res.stop_id = d->has_stop_id && d->stop_id >= 0 && d->stop_id <= INT32_MAX ? d->stop_id : -1;
        g->res.reason = d->reason; /* a static string */
        g->o.cached += d->cached;  /* the daemon's prefix cache, beside a kept session's ids */
        dj__oai_text(&g->o, d->text, d->text_len);
        dj__oai_done(&g->o, d->reason);
    }
    dj__event_free(e);
    if (g->o.finished) g->ended = true;
    if (g->ended) gen_close(g); /* a stop string: the daemon stops when the portal closes */
    return 0;
}

/* The stream's reader: blocks (a thread per connection) until it has bytes. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    hstream *s = cls;
    while (s->out_off == s->out.n) {
        s->out.n = s->out_off = 0;
        if (s->last) return MHD_CONTENT_READER_END_OF_STREAM;
        const int rc = s->fill(s);
        if (rc < 0 || s->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR; /* done frees what it held */
        if (rc > 0) s->last = true;
    }
    size_t n = s->out.n - s->out_off;
    if (n > max) n = max;
    memcpy(buf, s->out.p + s->out_off, n);
    s->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    hstream *s = cls;
    s->done(s);
}

/* Answers 200 with the stream; MHD owns s from here (s->done frees it, also
 * when this fails). */
static enum MHD_Result stream_respond(struct MHD_Connection *c, hstream *s) {
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, s, stream_free);
    if (!r) {
        s->done(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* An error mid-stream: OpenAI's error object as an event's data. */
static void stream_error(dj__buf *out, int status, const char *err) {
    size_t len;
    char *e = dj__oai_error(status, err, &len);
    if (e) dj__sse_put(out, NULL, e, len);
    else out->oom = true;
    free(e);
}

/* A generation's events: OpenAI's chunks, [DONE] at the end. */
static int gen_fill(hstream *s) {
    hgen *g = (hgen *)s;
    if (g->ended) {
        dj__oai_events(&g->o, true, &s->out);
        return 1;
    }
    char err[512];
    const int rc = gen_step(g, err, sizeof err);
    if (rc < 0) return -1; /* the client left: gen_free closes */
    if (rc > 0) {
        stream_error(&s->out, rc, err);
        dj__sse_put(&s->out, NULL, "[DONE]", 6);
        return 1;
    }
    dj__oai_events(&g->o, false, &s->out);
    return 0;
}

static void gen_done(hstream *s) { gen_free((hgen *)s); }

static enum MHD_Result serve_generate(hreq *q, struct MHD_Connection *c, bool chat) {
    dj__http *h = q->h;
    hgen *g = dj_calloc(1, sizeof *g);
    if (!g) return reply_error(q, c, 503, "out of memory");
    g->h = h;
    g->conn = c;
    g->fd = client_fd(c);
    char err[768];
    const char *qos = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Djinn-QoS");
    /* the parse is bounded before it runs: no more JSON values (nodes) than
     * the model's context could use, and room for the rest of a request */
    char name[128];
    bool nul = false;
    const size_t values = dj__oai_json_values(q->body.p ? q->body.p : "", q->body.n, name, sizeof name, &nul);
    if (nul) {
        gen_free(g);
        return reply_error(q, c, 400, "a string of the body holds \\u0000 (NUL): djinnd takes text without it");
    }
    char vbase[128], vlora[128]; /* "base:adapter" counts as its base */
    const dj__http_model *m =
        name[0] && dj__adapter_split(name, vbase, sizeof vbase, vlora, sizeof vlora) == DJ_OK ? model_get(h, vbase) : NULL;
    const size_t most = (m ? m->max_pos : 0) + (size_t)JSON_VALUES_SPARE;
    if (values > most) {
        gen_free(g);
        return reply_error(q, c, 413, "the body holds up to %zu JSON values: at most %zu here (model '%s' has %u "
                                      "positions)", values, most, name, m ? m->max_pos : 0);
    }
    int rc = dj__oai_parse(&g->o, q->body.p ? q->body.p : "", q->body.n, chat, qos, err, sizeof err);
    /* a token that may not use the default class gets the first it may */
    if (!rc && !g->o.qos_given && q->tk && !(q->tk->qos_mask & 1u << g->o.qos))
        for (int k = 0; k < DJ_QOS_COUNT; k++) {
            static const dj_qos order[] = {DJ_QOS_INTERACTIVE, DJ_QOS_BATCH, DJ_QOS_REALTIME};
            if (k < (int)(sizeof order / sizeof *order) && q->tk->qos_mask & 1u << order[k]) {
                g->o.qos = order[k];
                break;
            }
        }
    m = NULL;
    char base[128], lora[128]; /* "base:adapter": a LoRA adapter of base (adapter.h) */
    if (!rc && dj__adapter_split(g->o.model, base, sizeof base, lora, sizeof lora) != DJ_OK) {
        snprintf(err, sizeof err, "%s", dj_last_error());
        rc = 400;
    }
    if (!rc && !(m = model_get(h, base))) {
        snprintf(err, sizeof err, "model '%s' is not in djinnd's model store", base);
        rc = 404;
    }
    if (!rc) rc = dj__oai_prompt(&g->o, m, err, sizeof err);
    if (!rc) g->o.tok = m->tok; /* the front end keeps its models until it stops */
    if (!rc && g->o.max_given && g->o.max_tokens == 0) {
        snprintf(err, sizeof err, "'max_tokens' must be at least 1");
        rc = 400;
    }
    if (!rc && g->o.n_ids >= m->max_pos) {
        snprintf(err, sizeof err, "the prompt has %zu tokens: model '%s' has %u positions", g->o.n_ids, m->name,
                 m->max_pos);
        rc = 400;
    }
    if (!rc) rc = (int)gen_start(g, q, m, err, sizeof err);
    if (rc) {
        gen_free(g);
        return reply_error(q, c, (unsigned)rc, "%s", err);
    }
    q->responded = true;
    if (g->o.stream) {
        g->s.fill = gen_fill;
        g->s.done = gen_done;
        return stream_respond(c, &g->s);
    }
    while (!g->ended) {
        rc = gen_step(g, err, sizeof err);
        if (rc < 0) {
            gen_free(g);
            return MHD_NO; /* the client left: nothing to answer */
        }
        if (rc > 0) {
            gen_free(g);
            return reply_error(q, c, (unsigned)rc, "%s", err);
        }
    }
    size_t len;
    char *body = dj__oai_response(&g->o, &len);
    gen_free(g);
    if (!body) return reply_error(q, c, 503, "out of memory");
    return reply(c, 200, body, len, "application/json");
}

/* An answer of http_routes.c: 200 with body, else err (body: /health's 503). */
static enum MHD_Result serve_route(hreq *q, struct MHD_Connection *c, int status, char *body, size_t len,
                                   const char *err) {
    if (status != 200 && !body) return reply_error(q, c, (unsigned)status, "%s", err);
    q->responded = true;
    return reply(c, (unsigned)status, body, len, "application/json");
}

static const dj__http_model *model_of(void *h, const char *name) { return model_get(h, name); }

/* GET /v1/models (id NULL) and /v1/models/{id}. */
/* One request answered by one reply, on a portal of its own: its REPLY
 * event (the caller frees it), or NULL with the error answered into *ret. */
static dj__event *daemon_call(hreq *q, struct MHD_Connection *c, uint16_t type, enum MHD_Result *ret) {
    dj__portal *p = NULL;
    dj__event *rep = NULL;
    dj_status st = dj__portal_open(q->h->cfg.srv, q->tk, &p);
    if (st == DJ_OK) st = dj__portal_call(p, &(dj__request){.type = type}, &rep);
    dj__portal_close(p);
    if (st != DJ_OK) *ret = reply_error(q, c, status_of(st), "djinnd: %s", dj_last_error());
    return rep;
}

static enum MHD_Result serve_models(hreq *q, struct MHD_Connection *c, const char *id) {
    enum MHD_Result ret = MHD_NO;
    dj__event *rep = daemon_call(q, c, DJ_MSG_MODEL_LIST, &ret);
    if (!rep) return ret;
    char err[512], *body = NULL;
    size_t len = 0;
    const int rc = dj__http_models(&rep->u.list, id, model_of, q->h, &body, &len, err, sizeof err);
    dj__event_free(rep);
    return serve_route(q, c, rc, body, len, err);
}

static enum MHD_Result serve_stats(hreq *q, struct MHD_Connection *c) {
    if (!q->h->cfg.n_auth && !q->h->cfg.local_admin) return reply_error(q, c, 403, "%s", DJ__ADMIN_NEEDED);
    enum MHD_Result ret = MHD_NO;
    dj__event *rep = daemon_call(q, c, DJ_MSG_STATS, &ret);
    if (!rep) return ret;
    size_t len = 0;
    char *body = dj__http_stats_json(&rep->u.stats, dj__now(), &len); /* its token's scope: the daemon's choice */
    dj__event_free(rep);
    if (!body) return reply_error(q, c, 503, "out of memory");
    q->responded = true;
    return reply(c, 200, body, len, "application/json");
}

/* GET /v1/djinn/events: the stats every EVENTS_MS, over one portal held
 * while the client is. */
typedef struct hevents {
    hstream s;        /* first: an hstream * is its hevents * */
    dj__http *h;
    struct MHD_Connection *conn;
    int fd;           /* the client's socket: its hang-up ends the wait */
    dj__portal *p;
    uint64_t count;   /* the events to send (0: until the client goes) */
    uint64_t sent;
    double next_at;   /* when the next one is due (monotonic s) */
} hevents;

/* Whether the client hung up (or the front end stops) within ms (waits that long otherwise). */
static bool events_gone(hevents *e, int ms) {
    if (__atomic_load_n(&e->h->stopping, __ATOMIC_ACQUIRE)) return true;
    struct pollfd f = {.fd = e->fd, .events = POLLRDHUP};
    if (e->fd < 0) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        if (ms > 0) nanosleep(&ts, NULL);
        return false;
    }
    return poll(&f, 1, ms) > 0 && (f.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static int events_fill(hstream *s) {
    hevents *e = (hevents *)s;
    /* wait for the next one, looking at the client (and at a stopping front end) at least every POLL_MS */
    for (double now = dj__now(); e->sent && now < e->next_at; now = dj__now()) {
        double ms = (e->next_at - now) * 1e3;
        if (ms > POLL_MS) ms = POLL_MS; /* a stopping front end is seen within this */
        if (events_gone(e, (int)ms + 1)) return -1;
    }
    if (events_gone(e, 0)) return -1;
    const double now = dj__now();
    e->next_at = (e->sent ? e->next_at : now) + EVENTS_MS / 1e3;
    if (e->next_at < now) e->next_at = now + EVENTS_MS / 1e3; /* late (a slow STATS): no burst to catch up */
    dj__event *rep = NULL;
    const dj_status rc = dj__portal_call(e->p, &(dj__request){.type = DJ_MSG_STATS}, &rep);
    if (rc != DJ_OK) { /* the daemon went (or refused): the error, and the end */
        char err[512];
        snprintf(err, sizeof err, "djinnd: %s", dj_last_error());
        stream_error(&s->out, (int)status_of(rc), err);
        return 1;
    }
    size_t len = 0;
    char *body = dj__http_stats_json(&rep->u.stats, now, &len);
    dj__event_free(rep);
    if (!body) return -1;
    dj__sse_put(&s->out, NULL, body, len);
    free(body);
    return ++e->sent == e->count ? 1 : 0;
}

static void events_done(hstream *s) {
    hevents *e = (hevents *)s;
    dj__portal_close(e->p);
    dj__buf_free(&s->out);
    free(e);
}

static enum MHD_Result serve_events(hreq *q, struct MHD_Connection *c) {
    const char *cs = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "count");
    uint64_t count = 0;
    if (cs) {
        char *end = NULL;
        errno = 0;
        const unsigned long long v = strtoull(cs, &end, 10);
        if (!(cs[0] >= '0' && cs[0] <= '9') || *end || errno || v < 1 || v > EVENTS_MAX_COUNT)
            return reply_error(q, c, 400, "count=%.40s: want a number of events from 1 to %u", cs, EVENTS_MAX_COUNT);
        count = v;
    }
    if (!q->h->cfg.n_auth && !q->h->cfg.local_admin) return reply_error(q, c, 403, "%s", DJ__ADMIN_NEEDED);
    hevents *e = dj_calloc(1, sizeof *e);
    if (!e) return reply_error(q, c, 503, "out of memory");
    e->h = q->h;
    e->conn = c;
    e->count = count;
    e->fd = client_fd(c);
    e->s.fill = events_fill;
    e->s.done = events_done;
    const dj_status st = dj__portal_open(q->h->cfg.srv, q->tk, &e->p);
    if (st != DJ_OK) {
        events_done(&e->s);
        return reply_error(q, c, status_of(st), "djinnd: %s", dj_last_error());
    }
    q->responded = true;
    return stream_respond(c, &e->s);
}

/* The request's body bytes leave the count of those in flight. */
static void body_release(hreq *q) {
    pthread_mutex_lock(&q->h->cmu);
    q->h->body_bytes -= q->held;
    pthread_mutex_unlock(&q->h->cmu);
    q->held = 0;
    dj__buf_free(&q->body);
}

/* ---- connections: deadlines, addresses, the waiting pool ---- */
static void conn_cut_locked(hconn *k) {
    if (k->cut) return;
    k->cut = true;
    k->deadline = 0;
    shutdown(k->fd, SHUT_RDWR); /* MHD's thread sees the end and closes */
}

/* MHD's NOTIFY_CONNECTION: a connection opens (listed, its address counted,
 * the oldest waiting one closed when too many wait) or closes. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    dj__http *h = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        hconn *k = *socket_context;
        if (!k) return;
        pthread_mutex_lock(&h->cmu);
        if (k->prev) k->prev->next = k->next;
        else h->conns = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&h->cmu);
        free(k);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    hconn *k = ci ? dj_calloc(1, sizeof *k) : NULL;
    *socket_context = k;
    if (!k) return; /* untracked: MHD's own limits still hold it */
    bool local;
    k->fd = ci->connect_fd;
    k->peer = peer_key(c, &local);
    k->state = HCONN_HEADERS;
    k->since = dj__now();
    k->deadline = k->since + h->cfg.header_s;
    pthread_mutex_lock(&h->cmu);
    uint32_t same = 0, waiting = 0;
    hconn *oldest = NULL;
    for (hconn *o = h->conns; o; o = o->next) {
        if (o->cut) continue;
        same += o->peer == k->peer;
        if (o->state == HCONN_HEADERS) {
            waiting++;
            if (!oldest || o->since < oldest->since) oldest = o;
        }
    }
    if (same >= h->cfg.per_addr) { /* answered 429 when its headers come, closed if they do not soon */
        k->over_addr = true;
        if (k->deadline > k->since + OVER_ADDR_GRACE_S) k->deadline = k->since + OVER_ADDR_GRACE_S;
    }
    /* a burst of honest clients waits milliseconds: only one that has
     * waited EVICT_AFTER_S goes (past MHD's own cap, new ones are refused) */
    if (waiting >= h->cfg.unauth && oldest && k->since - oldest->since >= EVICT_AFTER_S) conn_cut_locked(oldest);
    k->next = h->conns;
    if (h->conns) h->conns->prev = k;
    h->conns = k;
    pthread_mutex_unlock(&h->cmu);
}

/* The deadlines: every POLL_MS, connections past theirs are shut down. */
static void *watchdog_main(void *arg) {
    dj__http *h = arg;
    uint64_t swept_ms = dj__now_ms();
    while (!__atomic_load_n(&h->stopping, __ATOMIC_ACQUIRE)) {
        if (dj__now_ms() - swept_ms >= DJ__HTTP_SWEEP_MS) dj__http_sweep(h, swept_ms = dj__now_ms()); /* issue 43 */
        struct timespec ts = {0, POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
        const double now = dj__now();
        uint32_t waiting = 0;
        pthread_mutex_lock(&h->cmu);
        for (hconn *k = h->conns; k; k = k->next) {
            if (k->deadline > 0 && now >= k->deadline) {
                DJ_LOG(INFO, "http: a connection passed its %s deadline: closed",
                       k->state == HCONN_HEADERS ? "headers'" : "body's");
                conn_cut_locked(k);
            }
            waiting += !k->cut && k->state == HCONN_HEADERS;
        }
        /* more waiting than the pool holds: those waiting longest go */
        for (; waiting > h->cfg.unauth; waiting--) {
            hconn *oldest = NULL;
            for (hconn *k = h->conns; k; k = k->next)
                if (!k->cut && k->state == HCONN_HEADERS && (!oldest || k->since < oldest->since)) oldest = k;
            if (!oldest || now - oldest->since < EVICT_AFTER_S) break;
            conn_cut_locked(oldest);
        }
        pthread_mutex_unlock(&h->cmu);
    }
    return NULL;
}

static void conn_state(dj__http *h, hconn *k, hconn_state st) {
    if (!k) return;
    pthread_mutex_lock(&h->cmu);
    k->state = st;
    k->since = dj__now();
    if (!k->cut)
        k->deadline = st == HCONN_SERVING ? 0 : k->since + (st == HCONN_HEADERS ? h->cfg.header_s : h->cfg.body_s);
    pthread_mutex_unlock(&h->cmu);
}

/* Header fields named name. */
typedef struct hcount {
    const char *name;
    int n;
} hcount;
static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    (void)value;
    hcount *hc = cls;
    if (key && !strcasecmp(key, hc->name)) hc->n++;
    return MHD_YES;
}
static int header_count(struct MHD_Connection *c, const char *name) {
    hcount hc = {name, 0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, &hc);
    return hc.n;
}

/* The Host header names this server: localhost, an IP literal (no DNS name
 * a page could rebind), --http's own host or one of --http-allowed-hosts. */
static bool host_ok(const dj__http *h, const char *host) {
    if (!host) return true; /* HTTP/1.0 without one: no browser sends that */
    char name[256];
    size_t n = 0;
    if (host[0] == '[') { /* [v6]:port */
        const char *e = strchr(host, ']');
        if (!e || (e[1] && e[1] != ':')) return false;
        n = (size_t)(e - host - 1);
        if (n >= sizeof name) return false;
        memcpy(name, host + 1, n);
        name[n] = '\0';
        struct in6_addr a6;
        return inet_pton(AF_INET6, name, &a6) == 1;
    }
    const char *colon = strchr(host, ':');
    n = colon ? (size_t)(colon - host) : strlen(host);
    if (n == 0 || n >= sizeof name) return false;
    memcpy(name, host, n);
    name[n] = '\0';
    if (n && name[n - 1] == '.') name[--n] = '\0'; /* "localhost." */
    struct in_addr a4;
    if (!strcasecmp(name, "localhost") || inet_pton(AF_INET, name, &a4) == 1) return true;
    const char *lc = strrchr(h->cfg.addr, ':');
    if (lc && (size_t)(lc - h->cfg.addr) == n && !strncasecmp(h->cfg.addr, name, n)) return true;
    for (const char *p = h->cfg.hosts; p && *p;) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncasecmp(p, name, n)) return true;
        p = e ? e + 1 : p + len;
    }
    return false;
}

/* A POST's body is JSON: "application/json", parameters allowed (what the
 * OpenAI SDKs send; a browser's form or text/plain, which it may send to any
 * site without asking, is refused). */
static bool json_type(const char *ct) {
    if (!ct) return false;
    while (*ct == ' ') ct++;
    if (strncasecmp(ct, "application/json", 16)) return false;
    ct += 16;
    while (*ct == ' ') ct++;
    return !*ct || *ct == ';';
}

/* The first call of a request (its headers are in): 0 to go on, else the
 * answer queued (or MHD_NO). */
static int request_begin(hreq *q, struct MHD_Connection *c, const char *url, const char *method,
                         enum MHD_Result *ret) {
    dj__http *h = q->h;
    const bool post = !strcmp(method, "POST");
    conn_state(h, q->hc, post ? HCONN_BODY : HCONN_SERVING);
    pthread_mutex_lock(&h->cmu);
    const bool over_addr = q->hc && q->hc->over_addr;
    const bool full = h->active >= h->cfg.max_conns;
    if (!full && !over_addr) h->active++;
    pthread_mutex_unlock(&h->cmu);
    q->counted = !full && !over_addr;
    if (over_addr) {
        *ret = reply_error(q, c, 429, "djinnd's HTTP front end takes %u connections at once from one address: "
                                      "retry later", h->cfg.per_addr);
        return 1;
    }
    if (full) {
        *ret = reply_error(q, c, 503, "djinnd's HTTP front end serves %u requests at once: retry later",
                           h->cfg.max_conns);
        return 1;
    }
    /* request smuggling behind a proxy: one length, or one framing, only */
    const int n_cl = header_count(c, "Content-Length"), n_te = header_count(c, "Transfer-Encoding");
    if (n_cl > 1 || (n_cl && n_te)) {
        *ret = reply_error(q, c, 400, "%s", n_cl > 1 ? "more than one Content-Length header"
                                                      : "both Content-Length and Transfer-Encoding");
        return 1;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > h->cfg.max_body) {
        *ret = reply_error(q, c, 413, "the body has %s bytes: at most %llu", cl, (unsigned long long)h->cfg.max_body);
        return 1;
    }
    /* DNS rebinding: a page of another site whose name now points here */
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if ((!h->cfg.n_auth || h->cfg.hosts) && !host_ok(h, host)) {
        *ret = reply_error(q, c, 403, "Host '%.100s' is not a name of this server (localhost, an IP address, "
                                      "or one of --http-allowed-hosts)", host);
        return 1;
    }
    if (post && !json_type(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"))) {
        *ret = reply_error(q, c, 415, "send the body as 'Content-Type: application/json'");
        return 1;
    }
    /* the page holds no data (its script asks for the stats with the token of its #token=...):
     * with --token-file it is served without one */
    const bool page = !strcmp(url, "/") && !strcmp(method, "GET");
    const unsigned st = page && h->cfg.n_auth ? 0 : authorize(q, c, !strcmp(url, "/v1/djinn/events"));
    if (st == 401) {
        *ret = reply_error(q, c, 401, "send 'Authorization: Bearer TOKEN' with a token of djinnd's --token-file%s",
                           strcmp(url, "/v1/djinn/events") ? "" : " (or ?access_token=TOKEN)");
        return 1;
    }
    if (st == 403) {
        *ret = reply_error(q, c, 403, "djinnd has no --token-file: only loopback clients are served");
        return 1;
    }
    if (st) {
        *ret = reply_error(q, c, st, "too many wrong tokens from this address: retry later");
        return 1;
    }
    /* a token's share: its requests (event streams, bodies on their way) at once */
    if (q->tk && q->hc) {
        const uint32_t most = h->cfg.per_token ? h->cfg.per_token : (h->cfg.max_conns + 1) / 2;
        uint32_t n = 0;
        pthread_mutex_lock(&h->cmu);
        for (hconn *k = h->conns; k; k = k->next) n += k->tenant && !strcmp(k->token, q->token);
        if (n < most) {
            q->hc->tenant = true;
            snprintf(q->hc->token, sizeof q->hc->token, "%s", q->token);
        }
        pthread_mutex_unlock(&h->cmu);
        if (n >= most) {
            *ret = reply_error(q, c, 429, "this token has %u requests at once (--http-max-per-token): retry later",
                               most);
            return 1;
        }
    }
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **ctx) {
    (void)version;
    dj__http *h = cls;
    hreq *q = *ctx;
    if (!q) {
        if (!(q = dj_calloc(1, sizeof *q))) return MHD_NO;
        q->h = h;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        q->hc = ci ? ci->socket_context : NULL;
        *ctx = q;
        dj__access_http_begin(q->access, sizeof q->access, &q->access_t0, method, url);
        enum MHD_Result ret = MHD_YES;
        return request_begin(q, c, url, method, &ret) ? ret : MHD_YES;
    }
    if (*upload_size) {
        if (!q->responded && !q->too_big && !q->busy) {
            const size_t k = *upload_size;
            pthread_mutex_lock(&h->cmu);
            const bool busy = h->body_bytes + k > BODIES_IN_FLIGHT * h->cfg.max_body;
            if (!busy) h->body_bytes += k, q->held += k;
            pthread_mutex_unlock(&h->cmu);
            if (q->body.n + k > h->cfg.max_body || busy) {
                q->too_big = !busy;
                q->busy = busy;
                body_release(q);
            } else {
                dj__buf_put(&q->body, upload, k);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    conn_state(h, q->hc, HCONN_SERVING);
    if (q->responded) return MHD_YES;
    if (q->too_big) return reply_error(q, c, 413, "the body is over %llu bytes", (unsigned long long)h->cfg.max_body);
    if (q->busy)
        return reply_error(q, c, 503, "djinnd's HTTP front end holds %u bodies' worth of bytes at once: retry later",
                           BODIES_IN_FLIGHT);
    if (q->body.oom) return reply_error(q, c, 503, "out of memory");
    const bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    char err[512], *body = NULL; /* http_routes.c's answers */
    size_t len = 0;
    if (!strcmp(url, "/v1/models")) {
        if (get) return serve_models(q, c, NULL);
    } else if (!strncmp(url, "/v1/models/", 11)) {
        if (get) return serve_models(q, c, url + 11);
    } else if (!strcmp(url, "/health")) {
        const int rc = get ? dj__http_health(h->cfg.srv, q->tk, &body, &len, err, sizeof err) : 0;
        if (get) return serve_route(q, c, rc, body, len, err);
    } else if (!strcmp(url, "/tokenize") || !strcmp(url, "/detokenize")) {
        const int rc = post ? (url[1] == 't' ? dj__http_tokenize : dj__http_detokenize)(
                                  q->body.p ? q->body.p : "", q->body.n, model_of, h, &body, &len, err, sizeof err)
                            : 0;
        if (post) return serve_route(q, c, rc, body, len, err);
    } else if (!strcmp(url, "/v1/djinn/stats")) {
        if (get) return serve_stats(q, c);
    } else if (!strcmp(url, "/v1/djinn/events")) {
        if (get) return serve_events(q, c);
    } else if (!strcmp(url, "/")) {
        if (get) {
            q->responded = true;
            struct MHD_Response *r = MHD_create_response_from_buffer(strlen(dj__http_view_html),
                                                                     (void *)dj__http_view_html,
                                                                     MHD_RESPMEM_PERSISTENT);
            if (!r) return MHD_NO;
            MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
            MHD_add_response_header(r, "Cache-Control", "no-store");
            const enum MHD_Result ret = MHD_queue_response(c, 200, r);
            MHD_destroy_response(r);
            return ret;
        }
    } else if (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions")) {
        if (post) return serve_generate(q, c, url[4] == 'c' && url[5] == 'h');
    } else {
        return reply_error(q, c, 404, "no such endpoint: %s %.200s (djinnd serves GET /, GET /health, GET /v1/models, GET "
                                      "/v1/models/{id}, GET /v1/djinn/stats, GET /v1/djinn/events, POST /v1/completions, "
                                      "POST /v1/chat/completions, POST /tokenize and POST /detokenize)", method, url);
    }
    return reply_error(q, c, 405, "%s %.200s: method not allowed", method, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_RequestTerminationCode why) {
    (void)c;
    (void)why;
    dj__http *h = cls;
    hreq *q = *ctx;
    if (!q) return;
    dj__access_http_done(c, q->access, q->access_t0, q->tk ? q->tk->name : NULL,
                         q->status ? q->status : q->responded ? 200u : 0u, (int)why);
    pthread_mutex_lock(&h->cmu);
    if (q->counted) h->active--;
    if (q->hc) q->hc->tenant = false;
    pthread_mutex_unlock(&h->cmu);
    conn_state(h, q->hc, HCONN_HEADERS); /* kept alive: the next request's headers are due */
    body_release(q);
    free(q);
    *ctx = NULL;
}

dj_status dj__http_start(const dj__http_cfg *cfg, dj__http **out) {
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t len;
    dj_status st = dj__addr_parse(cfg->addr, &ss, &len);
    if (st != DJ_OK) return st;
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return dj_fail(DJ_EINVAL, "--http %s: want HOST:PORT", cfg->addr);
    dj__http *h = dj_calloc(1, sizeof *h);
    if (!h) return dj_fail(DJ_ENOMEM, "out of memory");
    h->cfg = *cfg;
    pthread_mutex_init(&h->mu, NULL);
    pthread_mutex_init(&h->cmu, NULL);
    if ((st = dj__map_init(&h->peers, 64)) != DJ_OK) {
        dj__http_stop(h);
        return st;
    }
    const unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                           (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    if (pthread_create(&h->watchdog, NULL, watchdog_main, h)) {
        dj__http_stop(h);
        return dj_fail(DJ_EIO, "--http %s: cannot start the deadline thread", cfg->addr);
    }
    h->watchdog_on = true;
    /* MHD's own cap sits above ours (requests, and the connections waiting
     * for their headers, which go oldest first past theirs) so that those
     * over ours get an answer: 503, or 429 over an address's share */
    h->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)(cfg->max_conns + cfg->unauth + 16),
                              /* twice an address's share: past it, closed unanswered at once */
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)(2 * cfg->per_addr),
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
                              MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024), MHD_OPTION_NOTIFY_COMPLETED,
                              on_completed, h, MHD_OPTION_NOTIFY_CONNECTION, on_connection, h, MHD_OPTION_END);
    if (!h->mhd) {
        dj__http_stop(h);
        return dj_fail(DJ_EIO, "--http %s: cannot start the HTTP listener: %s", cfg->addr, strerror(errno));
    }
    *out = h;
    return DJ_OK;
}

uint16_t dj__http_port(const dj__http *h) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : 0;
}

void dj__http_stop(dj__http *h) {
    if (!h) return;
    __atomic_store_n(&h->stopping, 1, __ATOMIC_RELEASE); /* event streams end within POLL_MS */
    if (h->watchdog_on) pthread_join(h->watchdog, NULL);
    if (h->mhd) MHD_stop_daemon(h->mhd);
    for (idle_sess *e = h->idle, *n; e; e = n) {
        n = e->next;
        idle_free(e);
    }
    for (dj__http_model *m = h->models, *n; m; m = n) {
        n = m->next;
        dj_tokenizer_free(m->tok);
        dj_chat_template_free(m->tpl);
        free(m);
    }
    for (size_t b = 0; h->peers.b && b < h->peers.n_buckets; b++)
        for (dj__ment *e = h->peers.b[b]; e; e = e->next) free(e->val);
    dj__map_destroy(&h->peers);
    pthread_mutex_destroy(&h->mu);
    pthread_mutex_destroy(&h->cmu);
    free(h);
}

/* ---- the door's own records, swept (issue 43) ---- */

size_t dj__http_sweep(dj__http *h, uint64_t now_ms) {
    pthread_mutex_lock(&h->mu);
    if (now_ms) dj__peers_sweep(&h->peers, now_ms);
    const size_t n = h->peers.n;
    pthread_mutex_unlock(&h->mu);
    return n;
}
