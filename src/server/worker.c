/* worker.c: djinnd's engine thread - the only thread that touches the
 * engine. It hands requests to the scheduler (src/sched/) and carries out its
 * decisions: requests, batched generation steps, KV swaps; sessions with
 * leases, models shared by fingerprint, result handles, stats. */
#define _GNU_SOURCE
#include <dirent.h>
#include "djinn/alloc.h"
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "server/graph_serve.h"
#include "djinn/version.h"
#include "server/access.h"
#include "server/server_impl.h"
#include "proto/sample_wire.h"
#include "server/disk_tier.h"

#define DEFAULT_MAX_TOKENS 64

/* ---- queues and the outbox (mu held) ---- */

/* Most token rows of one mixed step: the engine's max_step_tokens (set so
 * by dj__worker_start). */
#define MIXED_ROWS 512
/* A session idle or paused this long may be swapped out, and the swap pool
 * or data segment default sizes: see dj__worker_start. */

/* --mixed-steps short (auto on a GPU): prompts with at most this many tokens left
 * ride in the decode steps (32 clients' 4-token prompts, each a step of its
 * own, cost the running generations a quarter of their tok/s on the H100:
 * bench/RESULTS.md); longer ones keep steps of their own, where the prefill
 * kernels run. */
#define RIDE_ROWS 64

static void q_push(dj__jobq *q, dj__job *j) {
    j->next = NULL;
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    q->n++;
}

static dj__job *q_pop_head(dj__jobq *q) {
    dj__job *j = q->head;
    if (!j) return NULL;
    q->head = j->next;
    if (!q->head) q->tail = NULL;
    q->n--;
    j->next = NULL;
    return j;
}

static void post_locked(dj__server *s, dj__out *o) {
    if (!o) return;
    o->next = NULL;
    if (s->out_tail) s->out_tail->next = o;
    else s->out_head = o;
    s->out_tail = o;
    if (!s->stopping) uv_async_send(&s->wake); /* when stopping, the loop drains the list itself */
}

/* A frame of j's answer; NULL when it could not be built (no memory): the
 * loop then answers j with an ENOMEM ERROR (on_wake), and j's later frames
 * are dropped, so the client never waits for a frame that will not come. */
static void post_job_locked(dj__server *s, dj__job *j, dj__out *o) {
    if (j->lost) {
        if (o) free(o->meta);
        free(o);
        return;
    }
    if (o) {
        post_locked(s, o);
        return;
    }
    j->lost = true;
    if (s->n_lost < DJ__LOST_MAX) {
        s->lost[s->n_lost].conn = j->conn;
        s->lost[s->n_lost].req = j->req;
        s->n_lost++;
    } else {
        s->lost_overflow = true;
    }
    if (!s->stopping) uv_async_send(&s->wake);
}

static void post_job(dj__server *s, dj__job *j, dj__out *o) {
    pthread_mutex_lock(&s->mu);
    post_job_locked(s, j, o);
    pthread_mutex_unlock(&s->mu);
}

dj_status dj__handle_add(dj__server *s, dj__handle *h) {
    pthread_mutex_lock(&s->mu);
    dj_status st;
    do st = dj__random_id(&h->id);
    while (st == DJ_OK && dj__map_get(&s->handles, h->id));
    if (st == DJ_OK) st = dj__map_put(&s->handles, h->id, h);
    pthread_mutex_unlock(&s->mu);
    return st;
}

void dj__handle_unref(dj__server *s, dj__handle *h) {
    (void)s;
    if (--h->refs > 0) return;
    free(h->bytes);
    free(h);
}

static void gen_free(dj__gen *g) {
    if (!g) return;
    dj_gen_free(g->g);
    free(g->ids);
    free(g);
}

/* ---- jobs the scheduler holds (worker only) ---- */

static uint64_t job_id(const dj__job *j) { return (uint64_t)(uintptr_t)j; }

static void held_add(dj__server *s, dj__job *j) {
    j->hprev = NULL;
    j->hnext = s->held;
    if (s->held) s->held->hprev = j;
    s->held = j;
}

static void held_del(dj__server *s, dj__job *j) {
    if (!j->hprev && s->held != j) return; /* not held */
    if (j->hprev) j->hprev->hnext = j->hnext;
    else s->held = j->hnext;
    if (j->hnext) j->hnext->hprev = j->hprev;
    j->hprev = j->hnext = NULL;
}

void dj__job_free(dj__job *j) {
    if (!j) return;
    dj__meta_destroy(&j->meta);
    free(j->body);
    gen_free(j->gen);
    dj__graph_req_free(j->graph);
    free(j->credit_out);
    free(j);
}

void dj__enqueue(dj__server *s, dj__job *j) {
    uint64_t sid = 0;
    const msgpack_object *o = dj__meta_get(&j->meta, "session");
    if (o) dj__obj_u64(o, &sid);
    pthread_mutex_lock(&s->mu);
    dj__sess *ss = sid ? dj__map_get(&s->sessions, sid) : NULL;
    if (ss && ss->conn == j->conn && !ss->dead) {
        j->qos = ss->qos;
        ss->lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms;
        ss->queued++; /* its lease holds while the request waits (lease_unqueue) */
        j->counted = true;
        j->sess = sid;
    }
    if (j->type == DJ_MSG_SESSION_OPEN) {
        const msgpack_object *q = dj__meta_get(&j->meta, "qos");
        dj_qos qq;
        char name[16];
        if (q && q->type == MSGPACK_OBJECT_STR && q->via.str.size < sizeof name) {
            memcpy(name, q->via.str.ptr, q->via.str.size);
            name[q->via.str.size] = '\0';
            if (dj_qos_parse(name, &qq) == DJ_OK && (j->qos_mask >> qq & 1)) j->qos = qq;
        }
    }
    q_push(&s->newq[j->qos], j);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- replies ---- */

static void reply(dj__server *s, dj__job *j, dj__mw *w) {
    dj__metrics_count(&s->metrics, j->type, DJ_OK);
    post_job(s, j, dj__out_meta(j->conn, DJ_MSG_REPLY, j->req, w));
}

static void reply_error(dj__server *s, dj__job *j, dj_status st, bool close_after) {
    dj__metrics_count(&s->metrics, j->type, st);
    DJ_LOG(INFO, "conn=%llu req=%llu session=%016llx type=%s error=%s: %s", (unsigned long long)j->conn,
           (unsigned long long)j->req, (unsigned long long)j->sess, dj_msg_type_name(j->type), dj_status_name(st),
           dj_last_error());
    if (j->type == DJ_MSG_GENERATE) dj__access_generate(j, NULL, st);
    post_job(s, j, dj__out_error(j->conn, j->req, st, dj_last_error(), close_after));
}

/* ---- models ---- */

static bool valid_model_name(const char *n) {
    if (!n[0] || !strcmp(n, ".") || !strcmp(n, "..")) return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == '-'))
            return false;
    return true;
}

static dj__model_ent *model_find(dj__server *s, const char *name) {
    for (dj__model_ent *m = s->models; m; m = m->next)
        if (!strcmp(m->name, name)) return m;
    return NULL;
}

/* One engine reference on the named model (loading it if needed); the entry
 * exists afterwards (users/pinned are the caller's to raise). */
static dj_status model_ref(dj__server *s, const char *name, dj__model_ent **out, dj_model_t **m) {
    if (!valid_model_name(name))
        return dj_fail(DJ_EINVAL, "model name '%s': use the name of a folder in the model store", name);
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/%s", s->cfg.models, name);
    dj_status st = dj_model_load(s->engine, dir, m);
    if (st != DJ_OK) return st;
    dj__model_ent *e = model_find(s, name);
    if (!e) {
        e = dj_calloc(1, sizeof *e);
        if (!e) {
            dj_model_release(s->engine, *m);
            *m = NULL;
            return dj_fail(DJ_ENOMEM, "out of memory");
        }
        snprintf(e->name, sizeof e->name, "%s", name);
        e->next = s->models;
        s->models = e;
    }
    e->m = *m;
    *out = e;
    return DJ_OK;
}

static void model_ent_maybe_drop(dj__server *s, dj__model_ent *e) {
    if (e->users || e->pinned || e->tok_jobs) return;
    for (dj__model_ent **p = &s->models; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            break;
        }
    dj_tokenizer_free(e->tok);
    free(e);
}

/* The model's tokenizer (NULL: it has none, or, with e->tok_tried still
 * false, there was no memory to read it: tried again at the next use) and
 * its EOS ids, read at first use. */
static const dj_tokenizer_t *model_tokenizer(dj__server *s, dj__model_ent *e) {
    if (!e->tok_tried) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s/tokenizer.json", s->cfg.models, e->name);
        struct stat sb;
        dj_status st = DJ_OK, st_eos;
        if (stat(path, &sb) == 0 && (st = dj_tokenizer_load(path, &e->tok)) != DJ_OK)
            DJ_LOG(WARN, "model %s: tokenizer: %s", e->name, dj_last_error());
        snprintf(path, sizeof path, "%s/%s", s->cfg.models, e->name);
        if ((st_eos = dj_gen_eos_ids(path, dj_model_get_config(e->m), e->eos, sizeof e->eos / sizeof *e->eos,
                                     &e->n_eos)) != DJ_OK)
            DJ_LOG(WARN, "model %s: no EOS ids: %s", e->name, dj_last_error());
        e->tok_tried = st != DJ_ENOMEM && st_eos != DJ_ENOMEM;
        if (!e->tok_tried) {
            dj_tokenizer_free(e->tok);
            e->tok = NULL;
            e->n_eos = 0;
        }
    }
    return e->tok;
}

/* ---- sessions ---- */

static void free_handles_of(dj__server *s, uint64_t sid) { /* mu held */
    for (size_t b = 0; b < s->handles.n_buckets; b++) {
        dj__ment *e = s->handles.b[b];
        while (e) {
            dj__handle *h = e->val;
            e = e->next;
            if (h->sess == sid) {
                dj__map_del(&s->handles, h->id);
                dj__handle_unref(s, h);
            }
        }
    }
}

/* Release everything a session holds: its generation (answered with `why`
 * if the connection is still there), handles, pages, model reference. mu held;
 * the session is already out of the table. */
static void session_destroy(dj__server *s, dj__sess *ss, dj_status why, const char *msg) {
    /* its requests the scheduler holds (the running generation among them) are answered */
    for (dj__job *j = s->held, *nx; j; j = nx) {
        nx = j->hnext;
        if (j->sess != ss->id || (j->type != DJ_MSG_STEP && j->type != DJ_MSG_GENERATE)) continue;
        held_del(s, j);
        if (dj__map_get(&s->live_conns, j->conn)) {
            dj__metrics_count(&s->metrics, j->type, why);
            if (j->type == DJ_MSG_GENERATE) dj__access_generate(j, ss, why);
            post_job_locked(s, j, dj__out_error(j->conn, j->req, why, msg, false));
        }
        dj__job_free(j);
    }
    ss->busy = NULL;
    dj_sched_session_close(s->sched, ss->id);
    free_handles_of(s, ss->id);
    dj_session_free(s->engine, ss->es);
    free(ss->hist);
    if (ss->ment) {
        ss->ment->users--;
        model_ent_maybe_drop(s, ss->ment);
    }
    DJ_LOG(INFO, "session=%016llx conn=%llu released (%s)", (unsigned long long)ss->id, (unsigned long long)ss->conn,
           msg);
    free(ss);
}

/* A session's requests from a connection that is gone are dropped (a
 * running generation stops; what it fed stays in the KV). mu held. */
static void cancel_orphaned(dj__server *s, dj__sess *ss) {
    for (dj__job *j = s->held, *nx; j; j = nx) {
        nx = j->hnext;
        if (j->sess != ss->id || j->conn == ss->conn || (j->type != DJ_MSG_STEP && j->type != DJ_MSG_GENERATE))
            continue;
        if (ss->busy == j) {
            ss->busy = NULL;
            if (j->gen && j->gen->g) ss->pending = dj_gen_pending(j->gen->g);
        }
        if (j->counted && ss->queued) ss->queued--;
        held_del(s, j);
        dj_sched_done(s->sched, job_id(j), dj__now_ms());
        dj__job_free(j);
    }
}

static void reap(dj__server *s) { /* mu held */
    const uint64_t now = dj__clock_ms(s);
    for (size_t b = 0; b < s->sessions.n_buckets; b++) {
        dj__ment *e = s->sessions.b[b];
        while (e) {
            dj__sess *ss = e->val;
            e = e->next;
            if ((ss->orphan || ss->cancel_old) && !ss->dead) cancel_orphaned(s, ss);
            ss->cancel_old = false;
            const bool expired = !ss->dead && !ss->busy && !ss->queued && now > ss->lease_deadline_ms;
            if (!ss->dead && !expired) continue;
            dj__map_del(&s->sessions, ss->id);
            if (expired) s->metrics.lease_expiries++;
            session_destroy(s, ss, DJ_ENOTFOUND, expired ? "session lease expired" : "connection closed");
        }
    }
    s->reap = false;
}

/* A request on the session ended (a STEP, a generation): its lease runs
 * again from now, however long the request took (mu held). */
static void lease_renew(dj__server *s, dj__sess *ss) { ss->lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms; }

/* The session a job names, owned by its connection (mu taken here). */
static dj_status job_session(dj__server *s, dj__job *j, dj__sess **out, bool *foreign) {
    uint64_t sid;
    dj_status st = dj__meta_u64(&j->meta, "session", true, &sid);
    if (st != DJ_OK) return st;
    j->sess = sid;
    pthread_mutex_lock(&s->mu);
    dj__sess *ss = dj__map_get(&s->sessions, sid);
    *foreign = ss && ss->conn != j->conn;
    if (*foreign || (ss && ss->dead)) ss = NULL;
    if (ss) ss->lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms;
    pthread_mutex_unlock(&s->mu);
    if (!ss) return dj_fail(DJ_ENOTFOUND, "no session %016llx on this connection", (unsigned long long)sid);
    *out = ss;
    return DJ_OK;
}

/* The session's position as its client sees it (a dropped session's is its history's). */
static uint32_t sess_pos(const dj__sess *ss) { return ss->dropped ? ss->n_hist : dj_session_pos(ss->es); }

/* After an engine call on the session: its position for stats, its pages for the scheduler. */
static void snapshot(dj__server *s, dj__sess *ss) {
    const uint32_t pos = sess_pos(ss);
    const dj_kv_residency r = dj_session_residency(ss->es);
    const uint32_t held = r == DJ_KV_SWAPPED ? 0 : dj_session_kv_pages(ss->es);
    dj_sched_pages(s->sched, ss->id, held, pos);
    pthread_mutex_lock(&s->mu);
    ss->pos = pos;
    ss->kv_bytes = dj_session_kv_bytes(ss->es);
    pthread_mutex_unlock(&s->mu);
}

/* Pages per block of positions of a session (all layers), from the engine's
 * own count: a fresh session needs block_pages for its first position and
 * block_pages more past block_tokens of them. */
static void block_shape(const dj_session_t *es, uint32_t *tokens, uint32_t *pages) {
    const uint32_t p1 = dj_session_pages_for(es, 1);
    uint32_t lo = 1, hi = dj_session_max_ctx(es);
    while (lo < hi) { /* the first position that needs a second block */
        const uint32_t mid = lo + (hi - lo) / 2;
        if (dj_session_pages_for(es, mid) > p1) hi = mid;
        else lo = mid + 1;
    }
    *tokens = dj_session_pages_for(es, hi) > p1 ? hi - 1 : hi;
    if (!*tokens) *tokens = 1;
    *pages = p1 ? p1 : 1;
}

/* Recompute policy: what the session was fed, to feed again after a drop. */
static dj_status hist_add(dj__server *s, dj__sess *ss, const int32_t *ids, size_t n) {
    if ((s->cfg.swap_policy != DJ_SWAP_RECOMPUTE && !s->cfg.state_dir) || !n) return DJ_OK; /* disk: recovery */
    if (ss->n_hist + n > ss->cap_hist) {
        size_t cap = ss->cap_hist ? ss->cap_hist : 256;
        while (cap < ss->n_hist + n) cap *= 2;
        int32_t *h = dj_realloc(ss->hist, cap * sizeof *h);
        if (!h) return dj_fail(DJ_ENOMEM, "out of memory for the session's history");
        ss->hist = h;
        ss->cap_hist = (uint32_t)cap;
    }
    memcpy(ss->hist + ss->n_hist, ids, n * sizeof *ids);
    ss->n_hist += (uint32_t)n;
    return DJ_OK;
}

/* The prefix-cache salt a request asks for: its token's, mixed with its
 * `cache_salt` string when given (*given). */
static dj_status request_salt(const dj__job *j, uint64_t salt[2] /* OUT */, bool *given /* OUT */) {
    const char *cs = NULL;
    size_t n = 0;
    dj_status st = dj__meta_str(&j->meta, "cache_salt", false, &cs, &n);
    if (st != DJ_OK) return st;
    *given = cs != NULL;
    if (cs && (n == 0 || n > DJ__SALT_BYTES_MAX))
        return dj_fail(DJ_EINVAL, "cache_salt of %zu bytes (1 to %d)", n, DJ__SALT_BYTES_MAX);
    if (cs) dj__cache_salt_of(j->cache_salt, cs, n, salt);
    else memcpy(salt, j->cache_salt, 2 * sizeof *salt);
    return DJ_OK;
}

static dj_status do_open(dj__server *s, dj__job *j, dj__mw *w) {
    char model[128], qos_name[16] = "interactive";
    uint32_t expect = 0;
    pthread_mutex_lock(&s->mu);
    const size_t n_open = dj__conn_sessions(s, j->conn), n_tenant = dj__tenant_sessions(s, j->tenant);
    pthread_mutex_unlock(&s->mu);
    if (n_open >= s->cfg.max_sessions)
        return dj_fail(DJ_EQUOTA, "this connection has %zu sessions open (--max-sessions-per-conn %u)", n_open,
                       s->cfg.max_sessions);
    if (n_tenant >= s->cfg.max_sessions_token)
        return dj_fail(DJ_EQUOTA, "this token has %zu sessions open (--max-sessions-per-token %u)", n_tenant,
                       s->cfg.max_sessions_token);
    bool reattach = false;
    dj_status st = dj__meta_strcpy(&j->meta, "model", true, model, sizeof model);
    if (st == DJ_OK) st = dj__meta_strcpy(&j->meta, "qos", false, qos_name, sizeof qos_name);
    if (st == DJ_OK) st = dj__meta_bool(&j->meta, "reattach", false, &reattach);
    if (st == DJ_OK) st = dj__meta_u32(&j->meta, "expected_tokens", false, &expect);
    uint64_t salt[2];
    bool salted;
    if (st == DJ_OK) st = request_salt(j, salt, &salted);
    if (st != DJ_OK) return st;
    dj_qos qos;
    if ((st = dj_qos_parse(qos_name, &qos)) != DJ_OK) return st;
    dj__model_ent *e = model_find(s, model);
    dj_model_t *m = NULL;
    const bool load = !e || (!e->users && !e->pinned);
    if (load && (st = model_ref(s, model, &e, &m)) != DJ_OK) {
        j->model_error = true; /* the model's files: this request fails, the connection stays */
        return st;
    }
    if (!load) m = e->m; /* held by its other users: the session takes its own reference */
    const dj_model_config *c = dj_model_get_config(m);
    const uint32_t ctx = expect ? expect : dj_model_config_default_ctx(c);
    if (c->max_position_embeddings && ctx > c->max_position_embeddings) {
        if (load) dj_model_release(s->engine, m);
        model_ent_maybe_drop(s, e);
        return dj_fail(DJ_ERANGE, "expected_tokens %u exceeds the model's %u positions", ctx,
                       c->max_position_embeddings);
    }
    dj__sess *ss = dj_calloc(1, sizeof *ss);
    if (!ss) st = dj_fail(DJ_ENOMEM, "out of memory");
    if (st == DJ_OK) st = dj_session_new(s->engine, m, ctx, 0, &ss->es);
    if (st == DJ_OK) st = dj_session_set_cache_salt(ss->es, salt);
    if (load) dj_model_release(s->engine, m); /* the session holds its own reference */
    if (st == DJ_OK) st = dj__random_id(&ss->id);
    if (st != DJ_OK) {
        if (ss) dj_session_free(s->engine, ss->es);
        free(ss);
        model_ent_maybe_drop(s, e);
        return st;
    }
    ss->conn = j->conn;
    ss->tenant = j->tenant;
    ss->qos = qos;
    ss->reattach = reattach;
    ss->max_ctx = ctx;
    ss->hidden = c->hidden_size;
    ss->pending = -1;
    ss->ment = e;
    e->users++;
    snprintf(ss->model, sizeof ss->model, "%s", model);
    pthread_mutex_lock(&s->mu);
    bool alive = dj__map_get(&s->live_conns, j->conn) != NULL;
    if (alive) {
        while (dj__map_get(&s->sessions, ss->id)) dj__random_id(&ss->id);
        ss->lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms;
        st = dj__map_put(&s->sessions, ss->id, ss);
    }
    if (!alive || st != DJ_OK) {
        session_destroy(s, ss, DJ_ENOTFOUND, "connection closed before the session opened");
        pthread_mutex_unlock(&s->mu);
        return alive ? st : dj_fail(DJ_ENOTFOUND, "connection gone");
    }
    dj_sched_session_info si = {.conn = j->tenant, .qos = dj_qos_rank(qos), .max_ctx = ctx}; /* the quota's group */
    block_shape(ss->es, &si.block_tokens, &si.block_pages);
    if (st == DJ_OK) st = dj_sched_session_open(s->sched, ss->id, &si, dj__now_ms());
    if (st == DJ_OK) st = dj__random_id(&ss->secret);
    if (st != DJ_OK) {
        dj__map_del(&s->sessions, ss->id);
        session_destroy(s, ss, DJ_ENOTFOUND, "session could not open");
        pthread_mutex_unlock(&s->mu);
        return st;
    }
    pthread_mutex_unlock(&s->mu);
    DJ_LOG(INFO, "session=%016llx conn=%llu opened model=%s qos=%s ctx=%u", (unsigned long long)ss->id,
           (unsigned long long)ss->conn, model, dj_qos_name(qos), ctx);
    dj__mw_u64(w, "session", ss->id);
    if (reattach) dj__mw_u64(w, "secret", ss->secret);
    dj__mw_u64(w, "max_ctx", ctx);
    dj__mw_u64(w, "vocab", c->vocab_size);
    dj__mw_u64(w, "lease_ms", s->cfg.lease_ms);
    return DJ_OK;
}

static dj_status do_close(dj__server *s, dj__job *j, bool *foreign) {
    dj__sess *ss;
    dj_status st = job_session(s, j, &ss, foreign);
    if (st != DJ_OK) return st;
    pthread_mutex_lock(&s->mu);
    dj__map_del(&s->sessions, ss->id);
    session_destroy(s, ss, DJ_ENOTFOUND, "session closed");
    pthread_mutex_unlock(&s->mu);
    return DJ_OK;
}

/* Ids to feed: a dropped session's history (recompute policy), the
 * session's pending token, then the request's. *n_new: without the history. */
static dj_status feed_ids(dj__sess *ss, const int32_t *ids, size_t n, int32_t **out, size_t *n_out) {
    const size_t h = ss->dropped ? ss->n_hist : 0, extra = ss->pending >= 0 ? 1 : 0;
    int32_t *v = dj_malloc((h + n + extra + 1) * sizeof *v);
    if (!v) return dj_fail(DJ_ENOMEM, "out of memory");
    if (h) memcpy(v, ss->hist, h * sizeof *v);
    if (extra) v[h] = ss->pending;
    if (n) memcpy(v + h + extra, ids, n * sizeof *v);
    *out = v;
    *n_out = h + n + extra;
    return DJ_OK;
}

/* After the history was fed again: the session is whole. */
static void undrop(dj__sess *ss) {
    if (ss->dropped) ss->n_hist = 0; /* re-added by hist_add with what was fed */
    ss->dropped = false;
}

static dj_status do_step(dj__server *s, dj__job *j, dj__mw *w, bool *foreign) {
    dj__sess *ss = NULL;
    dj_status st = job_session(s, j, &ss, foreign);
    if (st != DJ_OK) return st;
    int32_t *ids = NULL, *feed = NULL;
    size_t n = 0, n_feed = 0;
    dj__trace_req *tr = NULL; /* with `points` (step_trace.c): the payload holds their tensors */
    const bool traced = dj__meta_get(&j->meta, "points") != NULL;
    if (j->payload_len && !traced) {
        if (j->payload_len % 4) return dj_fail(DJ_EFORMAT, "STEP payload of %llu bytes is not int32 ids",
                                               (unsigned long long)j->payload_len);
        if (dj__meta_get(&j->meta, "ids")) return dj_fail(DJ_EFORMAT, "STEP has both 'ids' and a payload");
        n = j->payload_len / 4;
        ids = dj_malloc(n * sizeof *ids);
        if (!ids) return dj_fail(DJ_ENOMEM, "out of memory");
        for (size_t i = 0; i < n; i++) {
            const uint8_t *p = j->payload + 4 * i;
            uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            ids[i] = (int32_t)u;
        }
    } else if ((st = dj__meta_ids(&j->meta, "ids", true, &ids, &n)) != DJ_OK) {
        return st;
    }
    bool want_logits = true, all_rows = false;
    const char *lg = NULL;
    size_t lgn = 0;
    if ((st = dj__meta_str(&j->meta, "logits", false, &lg, &lgn)) != DJ_OK) goto done;
    if (lg && lgn == 4 && !memcmp(lg, "none", 4)) want_logits = false;
    else if (lg && lgn == 3 && !memcmp(lg, "all", 3)) all_rows = true;
    else if (lg && !(lgn == 4 && !memcmp(lg, "last", 4))) {
        st = dj_fail(DJ_EUNSUPPORTED, "logits '%.*s': ask for 'last' (default), 'all' or 'none'",
                     (int)(lgn > 32 ? 32 : lgn), lg);
        goto done;
    }
    if (traced && all_rows) {
        st = dj_fail(DJ_EINVAL, "a STEP with points takes logits 'last' or 'none', not 'all'");
        goto done;
    }
    if (ss->busy) {
        st = dj_fail(DJ_EBUSY, "session %016llx is generating", (unsigned long long)ss->id);
        goto done;
    }
    if (ss->paused) {
        st = dj_fail(DJ_EBUSY, "session %016llx is paused", (unsigned long long)ss->id);
        goto done;
    }
    if ((st = feed_ids(ss, ids, n, &feed, &n_feed)) != DJ_OK) goto done;
    if (n_feed == 0) {
        st = dj_fail(DJ_EINVAL, "STEP needs at least one token id");
        goto done;
    }
    const uint32_t vocab = dj_model_get_config(ss->ment->m)->vocab_size;
    const uint64_t rows = all_rows ? n_feed : 1;
    dj__handle *h = NULL;
    if (traced && (st = dj__trace_parse(&j->meta, j->payload, j->payload_len, (uint32_t)n,
                                        dj_model_get_config(ss->ment->m), &tr)) != DJ_OK)
        goto done;
    if (want_logits || dj__trace_saves(tr)) {
        pthread_mutex_lock(&s->mu);
        const size_t n_held = dj__conn_handles(s, j->conn);
        pthread_mutex_unlock(&s->mu);
        const size_t n_new = (want_logits ? 1u : 0u) + dj__trace_saves(tr);
        if (n_held + n_new > s->cfg.max_handles) {
            st = dj_fail(DJ_EQUOTA,
                         "this connection holds %zu handles and the step makes %zu (--max-handles-per-conn %u): "
                         "RELEASE some",
                         n_held, n_new, s->cfg.max_handles);
            goto done;
        }
    }
    if (want_logits) {
        h = dj_calloc(1, sizeof *h);
        if (!h || !(h->bytes = dj_malloc((size_t)rows * vocab * sizeof(float)))) {
            free(h);
            st = dj_fail(DJ_ENOMEM, "out of host memory for a %llu x %u logits handle", (unsigned long long)rows,
                         vocab);
            goto done;
        }
    }
    if (tr) {
        /* a pending token (or a dropped history) first, as a plain step: the
         * trace's rows are the request's ids */
        const size_t pre = n_feed - n;
        st = pre ? dj_session_step(s->engine, ss->es, feed, (uint32_t)pre, NULL) : DJ_OK;
        if (st == DJ_OK && pre) {
            undrop(ss);
            ss->pending = -1;
            st = hist_add(s, ss, feed, pre);
        }
        if (st == DJ_OK)
            st = dj__trace_run(s->engine, ss->es, feed + pre, (uint32_t)n, tr, h ? (float *)h->bytes : NULL);
        if (st == DJ_OK) {
            memmove(feed, feed + pre, n * sizeof *feed);
            n_feed = n;
        }
    } else {
        st = all_rows && h ? dj_session_step_all(s->engine, ss->es, feed, (uint32_t)n_feed,
                                                 (float *)h->bytes) /* "all" wants logits */
                           : dj_session_step(s->engine, ss->es, feed, (uint32_t)n_feed, h ? (float *)h->bytes : NULL);
    }
    pthread_mutex_lock(&s->mu);
    lease_renew(s, ss);
    pthread_mutex_unlock(&s->mu);
    if (st != DJ_OK) {
        if (h) free(h->bytes);
        free(h);
        if (tr) snapshot(s, ss);
        goto done;
    }
    undrop(ss);
    if ((st = hist_add(s, ss, feed, n_feed)) != DJ_OK) goto done;
    ss->pending = -1;
    snapshot(s, ss);
    dj__mw_u64(w, "pos", dj_session_pos(ss->es));
    if (h) {
        h->conn = j->conn;
        h->sess = ss->id;
        h->ndim = all_rows ? 2 : 1;
        h->shape[0] = all_rows ? rows : vocab;
        h->shape[1] = all_rows ? vocab : 0;
        h->nbytes = rows * vocab * sizeof(float);
        h->refs = 1;
        snprintf(h->dtype, sizeof h->dtype, "f32");
        st = dj__handle_add(s, h);
        if (st != DJ_OK) {
            free(h->bytes);
            free(h);
            goto done;
        }
        dj__mw_u64(w, "handle", h->id);
        dj__mw_str(w, "dtype", "f32");
        dj__mw_key(w, "shape");
        msgpack_pack_array(&w->pk, h->ndim);
        for (uint32_t d = 0; d < h->ndim; d++) msgpack_pack_uint64(&w->pk, h->shape[d]);
        dj__mw_u64(w, "nbytes", h->nbytes);
    }
    if (tr) st = dj__trace_publish(s, tr, j->conn, ss->id, w);
done:
    dj__trace_free(tr);
    free(ids);
    free(feed);
    return st;
}

/* ---- generation: the worker's side of the loop in generate.h ---- */

static void gen_done(dj__server *s, dj__job *j, dj__sess *ss) {
    dj__gen *g = j->gen;
    const double now = dj__now();
    const uint32_t n_gen = dj_gen_n_generated(g->g);
    dj__mw w;
    dj__mw_init(&w);
    dj__mw_u64(&w, "n_prompt", g->n_prompt);
    dj__mw_u64(&w, "n_generated", n_gen);
    dj__mw_str(&w, "reason", dj_gen_finish_name(dj_gen_finished(g->g)));
    if (dj_gen_finished(g->g) == DJ_GEN_STOP) dj__mw_i64(&w, "stop_id", dj_gen_pending(g->g)); /* not emitted */
    dj__mw_u64(&w, "pos", dj_session_pos(ss->es));
    dj__mw_u64(&w, "cached", dj_gen_cached(g->g)); /* prompt ids mapped from the prefix cache */
    dj__mw_f64(&w, "queue_ms", (g->t_start - j->t_enqueue) * 1e3);
    dj__mw_f64(&w, "prefill_ms", g->prefill_s * 1e3);
    dj__mw_f64(&w, "ttft_ms", n_gen ? (g->t_first - j->t_enqueue) * 1e3 : 0.0);
    dj__mw_f64(&w, "decode_ms", n_gen ? (now - g->t_first) * 1e3 : 0.0);
    char rest[256];
    size_t n = 0;
    if (dj_gen_text_rest(g->g, rest, sizeof rest, &n) == DJ_OK && n) dj__mw_strn(&w, "text", rest, n);
    dj__metrics_count(&s->metrics, DJ_MSG_GENERATE, DJ_OK);
    dj__access_generate(j, ss, DJ_OK);
    post_job(s, j, dj__out_meta(j->conn, DJ_MSG_DONE, j->req, &w));
}

/* What a step did to one generation: timings, its TOKEN, its DONE. True
 * when the generation ended. */
static bool gen_event(dj__server *s, dj__job *j, dj__sess *ss, const dj_gen_event *ev) {
    dj__gen *g = j->gen;
    ss->pending = dj_gen_pending(g->g);
    snapshot(s, ss);
    const double now = dj__now();
    if (!g->prefill_s && !dj_gen_feeding(g->g)) g->prefill_s = now - g->t_start;
    if (ev->id >= 0) {
        if (dj_gen_n_generated(g->g) == 1) {
            g->t_first = now;
            dj__metrics_observe(&s->metrics, &s->metrics.ttft_s, now - j->t_enqueue);
            pthread_mutex_lock(&s->mu);
            const double resumed = ss->resume_at;
            ss->resume_at = 0;
            pthread_mutex_unlock(&s->mu);
            if (resumed > 0) dj__metrics_observe(&s->metrics, &s->metrics.resume_s, now - resumed);
        } else {
            dj__metrics_observe(&s->metrics, &s->metrics.token_s, now - g->t_last);
        }
        g->t_last = now;
        if (ev->text_st != DJ_OK && !j->lost) { /* a token without its text: the answer ends here, an error */
            post_job(s, j, dj__out_error(j->conn, j->req, ev->text_st, dj_last_error(), false));
            j->lost = true; /* its later frames are dropped */
        }
        dj__mw w;
        dj__mw_init(&w);
        dj__mw_i64(&w, "id", ev->id);
        dj__mw_u64(&w, "index", dj_gen_n_generated(g->g) - 1);
        if (model_tokenizer(s, ss->ment)) dj__mw_strn(&w, "text", ev->text, ev->text_len);
        if (ev->logprobs) {
            const dj_token_logprobs *lp = ev->logprobs;
            dj__mw_f64(&w, "logprob", lp->logprob);
            dj__mw_ids(&w, "top_ids", lp->top_id, lp->n_top);
            dj__mw_key(&w, "top_logprobs");
            msgpack_pack_array(&w.pk, lp->n_top);
            for (uint32_t k = 0; k < lp->n_top; k++) msgpack_pack_double(&w.pk, lp->top_logprob[k]);
        }
        post_job(s, j, dj__out_meta(j->conn, DJ_MSG_TOKEN, j->req, &w));
        pthread_mutex_lock(&s->metrics.mu);
        s->metrics.tokens++;
        pthread_mutex_unlock(&s->metrics.mu);
    }
    if (ev->finish == DJ_GEN_RUNNING) return false;
    gen_done(s, j, ss);
    return true;
}

/* A GENERATE as it arrives: its fields checked; a text prompt goes to the
 * tokenizer thread (*deferred set), which hands the job back to the worker's
 * queue once it is tokenized, so the scheduler learns the positions it will
 * take (prompt + max_tokens) without a tokenization ever running on this
 * thread. The prompt's bytes were bounded by the I/O thread
 * (--max-prompt-bytes). */
static dj_status gen_prepare(dj__server *s, dj__job *j, dj__sess *ss, bool *deferred) {
    const dj__meta *m = &j->meta;
    const char *prompt = NULL;
    size_t plen = 0;
    *deferred = false;
    dj__gen *g = dj_calloc(1, sizeof *g);
    if (!g) return dj_fail(DJ_ENOMEM, "out of memory");
    j->gen = g;
    g->max_tokens = DEFAULT_MAX_TOKENS;
    dj_status st = dj__meta_str(m, "prompt", false, &prompt, &plen);
    if (st == DJ_OK) st = dj__meta_ids(m, "ids", false, &g->ids, &g->n_ids);
    if (st == DJ_OK) st = dj__meta_u32(m, "max_tokens", false, &g->max_tokens);
    if (st != DJ_OK) return st;
    if (!!prompt == !!dj__meta_get(m, "ids")) return dj_fail(DJ_EFORMAT, "GENERATE needs exactly one of 'prompt' or 'ids'");
    if (ss->paused) return dj_fail(DJ_EBUSY, "session %016llx is paused", (unsigned long long)ss->id);
    if (ss->busy) return dj_fail(DJ_EBUSY, "session %016llx is already generating", (unsigned long long)ss->id);
    if (prompt) {
        if (plen > s->cfg.max_prompt_bytes) /* the I/O thread refuses these; a bound for any other path */
            return dj_fail(DJ_ERANGE, "prompt of %zu bytes: more than --max-prompt-bytes %llu", plen,
                           (unsigned long long)s->cfg.max_prompt_bytes);
        const dj_tokenizer_t *tok = model_tokenizer(s, ss->ment);
        if (!tok && !ss->ment->tok_tried)
            return dj_fail(DJ_ENOMEM, "model %s: no memory to read its tokenizer", ss->ment->name);
        if (!tok) return dj_fail(DJ_EUNSUPPORTED, "model %s has no tokenizer.json: send token ids", ss->ment->name);
        g->tok = tok;
        g->tok_ment = ss->ment;
        g->prompt = prompt;
        g->plen = plen;
        g->add_special = sess_pos(ss) == 0 && ss->pending < 0;
        ss->ment->tok_jobs++;
        pthread_mutex_lock(&s->mu);
        q_push(&s->tokq, j);
        pthread_cond_signal(&s->tok_cv);
        pthread_mutex_unlock(&s->mu);
        *deferred = true;
    }
    return DJ_OK;
}

/* A GENERATE's cache_salt: the session's already, or set on a session that
 * holds nothing yet; any other is refused (its chain started under another). */
static dj_status gen_salt(const dj__job *j, dj__sess *ss) {
    uint64_t want[2], have[2];
    bool given;
    dj_status st = request_salt(j, want, &given);
    if (st != DJ_OK || !given) return st;
    dj_session_cache_salt(ss->es, have);
    if (want[0] == have[0] && want[1] == have[1]) return DJ_OK;
    if (sess_pos(ss) == 0 && ss->pending < 0 && !ss->dropped && ss->n_hist == 0)
        return dj_session_set_cache_salt(ss->es, want);
    return dj_fail(DJ_EINVAL, "cache_salt differs from the salt session %016llx started with (give it at "
                   "SESSION_OPEN or the session's first GENERATE)", (unsigned long long)ss->id);
}

/* A job the tokenizer thread handed back: its model entry let go, its
 * tokenization's outcome. Worker only. */
static dj_status gen_tokenized(dj__server *s, dj__job *j) {
    dj__gen *g = j->gen;
    if (g->tok_ment) {
        g->tok_ment->tok_jobs--;
        model_ent_maybe_drop(s, g->tok_ment);
        g->tok_ment = NULL;
        g->tok = NULL;
    }
    if (g->tok_st != DJ_OK) return dj_fail(g->tok_st, "%s", g->tok_err);
    return DJ_OK;
}

/* The connection's prompt bytes this job counted are free again: its
 * connection may be read (server.c, may_read). mu not held. */
static void prompt_credit(dj__server *s, dj__job *j) {
    if (!j->prompt_credit || !j->credit_out) return;
    dj__out *o = j->credit_out;
    j->credit_out = NULL;
    o->conn = j->conn;
    o->credit = j->prompt_credit;
    pthread_mutex_lock(&s->mu);
    post_locked(s, o);
    pthread_mutex_unlock(&s->mu);
    j->prompt_credit = 0;
}

/* ---- the tokenizer thread ----
 * One thread, apart from the engine worker, turns text prompts into ids in
 * the order they arrived: a tokenization (bounded by --max-prompt-bytes, and
 * per connection by --max-prompt-inflight, which stops reading the
 * connection) never delays a running generation's step, which the worker
 * keeps taking meanwhile. It touches only the job (the prompt inside its
 * meta, the ids it writes) and the tokenizer, which stays loaded while
 * tok_jobs counts the job. */
/* The next prompt to tokenize: the oldest of a tenant other than the one
 * served last, if any waits - a token with many connections' prompts queued
 * makes another's wait for one prompt, not for all of them. mu held. */
static dj__job *tokq_take(dj__server *s) {
    dj__jobq *q = &s->tokq;
    dj__job *prev = NULL, *j = q->head;
    for (dj__job *p = NULL, *x = q->head; x; p = x, x = x->next)
        if (x->tenant != s->tok_last_tenant) {
            prev = p;
            j = x;
            break;
        }
    if (!j) return NULL;
    if (prev) prev->next = j->next;
    else q->head = j->next;
    if (q->tail == j) q->tail = prev;
    q->n--;
    j->next = NULL;
    s->tok_last_tenant = j->tenant;
    return j;
}

static void *tokenizer_main(void *arg) {
    dj__server *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop_tok) {
        dj__job *j = tokq_take(s);
        if (!j) {
            pthread_cond_wait(&s->tok_cv, &s->mu);
            continue;
        }
        const bool alive = dj__map_get(&s->live_conns, j->conn) != NULL;
        pthread_mutex_unlock(&s->mu);
        dj__gen *g = j->gen;
        dj_clear_error();
        if (!alive) { /* its connection went: nobody waits for it */
            g->tok_st = DJ_ENOTFOUND;
            snprintf(g->tok_err, sizeof g->tok_err, "connection closed before the prompt was tokenized");
        } else if ((g->tok_st = dj_tokenizer_encode(g->tok, g->prompt, g->plen, g->add_special, &g->ids,
                                                    &g->n_ids)) != DJ_OK) {
            snprintf(g->tok_err, sizeof g->tok_err, "%s", dj_last_error());
        }
        g->tokenized = true;
        prompt_credit(s, j);
        pthread_mutex_lock(&s->mu);
        q_push(&s->newq[j->qos], j); /* back to the worker's intake (its lease still counts it) */
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* A GENERATE's turn to start: its sampling fields, the session's pending
 * token and (recompute policy) history before the prompt, a dj_gen_t. */
static dj_status gen_start(dj__server *s, dj__job *j, dj__sess *ss) {
    const dj__meta *m = &j->meta;
    dj__gen *g = j->gen;
    int32_t *feed = NULL, *stop = NULL;
    size_t n_feed = 0, n_stop = 0;
    dj_sampler_params sampling;
    bool ignore_eos = false, logprobs = false;
    uint32_t top_logprobs = 0;
    dj_status st = dj__sample_decode(m, &sampling);
    if (st == DJ_OK) st = dj__meta_bool(m, "ignore_eos", false, &ignore_eos);
    if (st == DJ_OK) st = dj__meta_ids(m, "stop_ids", false, &stop, &n_stop);
    if (st == DJ_OK) st = dj__meta_bool(m, "logprobs", false, &logprobs);
    if (st == DJ_OK) st = dj__meta_u32(m, "top_logprobs", false, &top_logprobs);
    const char *schema = NULL; /* structured output (grammar.h) */
    size_t n_schema = 0;
    dj_constraint_t *con = NULL;
    if (st == DJ_OK) st = dj__meta_str(m, "json_schema", false, &schema, &n_schema);
    if (st != DJ_OK) goto done;
    if (top_logprobs > DJ_MAX_TOP_LOGPROBS || (top_logprobs && !logprobs)) {
        st = dj_fail(DJ_EINVAL, "top_logprobs %u: it needs logprobs true and must be in [0, %d]", top_logprobs,
                     DJ_MAX_TOP_LOGPROBS);
        goto done;
    }
    if (ss->paused) {
        st = dj_fail(DJ_EBUSY, "session %016llx is paused", (unsigned long long)ss->id);
        goto done;
    }
    if ((st = gen_salt(j, ss)) != DJ_OK) goto done;
    if ((st = feed_ids(ss, g->ids, g->n_ids, &feed, &n_feed)) != DJ_OK) goto done;
    if (n_feed == 0) {
        st = dj_fail(DJ_EINVAL, "GENERATE needs at least one prompt token");
        goto done;
    }
    const dj_tokenizer_t *tok = model_tokenizer(s, ss->ment); /* also reads the model's EOS ids */
    if (!tok && !ss->ment->tok_tried) { /* no text and no EOS ids: not a generation to run */
        st = dj_fail(DJ_ENOMEM, "model %s: no memory to read its tokenizer", ss->ment->name);
        goto done;
    }
    const uint32_t pos0 = dj_session_pos(ss->es), ctx = dj_session_max_ctx(ss->es);
    if (n_feed > ctx - pos0) { /* refused before any chunk runs */
        st = dj_fail(DJ_ERANGE, "prompt of %zu tokens does not fit: the session has %u of its %u positions left",
                     n_feed, ctx - pos0, ctx);
        goto done;
    }
    const uint32_t vocab = dj_model_get_config(dj_session_model(ss->es))->vocab_size;
    if (schema && (st = dj_constraint_from_schema(schema, n_schema, tok, vocab, ss->ment->eos,
                                                  ignore_eos ? 0 : ss->ment->n_eos, &con)) != DJ_OK)
        goto done;
    const dj_gen_params gp = {.sampling = sampling,
                              .max_tokens = g->max_tokens,
                              .stop_ids = stop,
                              .n_stop = n_stop,
                              .eos_ids = ss->ment->eos,
                              .n_eos = ss->ment->n_eos,
                              .ignore_eos = ignore_eos,
                              .prefill_chunk = s->cfg.prefill_chunk,
                              .tok = tok,
                              .logprobs = logprobs,
                              .top_logprobs = top_logprobs,
                              .constraint = con}; /* the generation's from here */
    if ((st = dj_gen_new(s->engine, ss->es, feed, n_feed, &gp, &g->g)) != DJ_OK) goto done;
    undrop(ss);
    st = hist_add(s, ss, feed, n_feed);
    g->pos0 = pos0 + (uint32_t)n_feed;
    g->n_prompt = (uint32_t)g->n_ids;
    g->t_start = dj__now();
    dj__metrics_observe(&s->metrics, &s->metrics.queue_s, g->t_start - j->t_enqueue);
done:
    free(feed);
    free(stop);
    return st;
}
static bool job_rides(const dj__server *s, const dj__job *j);

/* Recompute policy: the generated tokens the session was fed. */
static void gen_hist(dj__server *s, dj__job *j, dj__sess *ss) {
    const dj__gen *g = j->gen;
    if (!g || !g->g || (s->cfg.swap_policy != DJ_SWAP_RECOMPUTE && !s->cfg.state_dir)) return;
    const uint32_t pos = dj_session_pos(ss->es), n_ids = dj_gen_n_generated(g->g);
    uint32_t fed = pos > g->pos0 ? pos - g->pos0 : 0;
    if (fed > n_ids) fed = n_ids;
    if (hist_add(s, ss, dj_gen_ids(g->g), fed) != DJ_OK)
        DJ_LOG(WARN, "session=%016llx: %s", (unsigned long long)ss->id, dj_last_error());
}

/* After a GENERATE started or stepped: on an error or its end it leaves the
 * scheduler (the error replied); else the scheduler learns its next rows. */
static void gen_after(dj__server *s, dj__job *j, dj__sess *ss, dj_status st, bool foreign, bool finished) {
    if (st != DJ_OK || finished) {
        if (st != DJ_OK) reply_error(s, j, st, foreign || st == DJ_EFORMAT);
        if (ss) gen_hist(s, j, ss);
        pthread_mutex_lock(&s->mu);
        if (ss && ss->busy == j) ss->busy = NULL;
        if (ss) lease_renew(s, ss);
        pthread_mutex_unlock(&s->mu);
        held_del(s, j);
        dj_sched_done(s->sched, job_id(j), dj__now_ms());
        dj__job_free(j);
        return;
    }
    pthread_mutex_lock(&s->mu);
    ss->busy = j;
    pthread_mutex_unlock(&s->mu);
    dj_sched_gen_rows(s->sched, job_id(j), dj_gen_rows(j->gen->g), job_rides(s, j));
}

/* Whether a running generation's next rows may share a step with others:
 * a decode row always; a prompt chunk with mixed steps, or when what is left
 * of its prompt is short (s->ride_rows). */
static bool job_rides(const dj__server *s, const dj__job *j) {
    const dj_gen_t *g = j->gen->g;
    return !dj_gen_feeding(g) || s->mixed || dj_gen_prompt_left(g) <= s->ride_rows;
}

/* Continuous batching: one step of the generation loop (dj_gen_step) for
 * one or several running generations of one model (jobs[0..n), as the
 * scheduler assembled them) - a decode row each, or the next chunk of a
 * prompt still going in - every last row picked by its generation's own
 * sampler, on the device where the engine can. If a step of several fails,
 * each job runs alone so that only the culprit sees the error. */
static void run_decode_batch(dj__server *s, dj__job **jobs, size_t n) {
    dj__sess *ss[DJ__MAX_BATCH];
    dj_gen_t *gs[DJ__MAX_BATCH];
    dj_gen_event ev[DJ__MAX_BATCH];
    const double t0 = dj__now();
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++) ss[i] = dj__map_get(&s->sessions, jobs[i]->sess);
    pthread_mutex_unlock(&s->mu);
    size_t rows = 0;
    for (size_t i = 0; i < n; i++) {
        gs[i] = jobs[i]->gen->g;
        rows += dj_gen_rows(gs[i]);
    }
    const double t1 = dj__now();
    const dj_status st = dj_gen_step(s->engine, gs, (uint32_t)n, ev);
    const double t2 = dj__now();
    if (st != DJ_OK) {
        if (n == 1) {
            gen_after(s, jobs[0], ss[0], st, false, false);
            return;
        }
        for (size_t i = 0; i < n; i++) run_decode_batch(s, &jobs[i], 1);
        return;
    }
    if (n > 1) {
        s->batched_steps++;
        s->batched_rows += n;
        s->mixed_steps += rows > n;
    }
    for (size_t i = 0; i < n; i++)
        gen_after(s, jobs[i], ss[i], DJ_OK, false, gen_event(s, jobs[i], ss[i], &ev[i]));
    s->gen_steps++;
    s->gen_engine_s += t2 - t1;
    s->gen_step_s += dj__now() - t0;
}

/* A GENERATE's turn to start (its first rows run in a later step, with
 * whichever generations the scheduler puts beside it). */
static void run_generate(dj__server *s, dj__job *j) {
    dj__sess *ss = NULL;
    bool foreign = false;
    dj_status st = job_session(s, j, &ss, &foreign);
    if (st == DJ_OK && ss->busy)
        st = dj_fail(DJ_EBUSY, "session %016llx is already generating", (unsigned long long)ss->id);
    if (st == DJ_OK) st = gen_start(s, j, ss);
    gen_after(s, j, ss, st, foreign, false);
}

/* ---- stats and model list ---- */

static void pack_kv_u64(msgpack_packer *pk, const char *k, uint64_t v) {
    dj__pack_str(pk, k);
    msgpack_pack_uint64(pk, v);
}

static void pack_kv_bool(msgpack_packer *pk, const char *k, bool v) {
    dj__pack_str(pk, k);
    if (v) msgpack_pack_true(pk);
    else msgpack_pack_false(pk);
}

/* Sessions a STATS reply lists at most (an admin's sees every connection's). */
#define STATS_MAX_SESSIONS 2048

/* STATS' session list: the caller's own sessions, or every one for an admin. */
static dj_status stats_sessions(dj__server *s, const dj__job *j, dj__mw *w) {
    const uint64_t now = dj__now_ms(), clk = dj__clock_ms(s);
    pthread_mutex_lock(&s->mu);
    /* a client sees its token's own sessions; a token with the admin role, all */
    size_t n_shown = 0;
    for (size_t b = 0; b < s->sessions.n_buckets; b++)
        for (dj__ment *e = s->sessions.b[b]; e; e = e->next)
            n_shown += j->admin || ((dj__sess *)e->val)->tenant == j->tenant;
    if (n_shown > STATS_MAX_SESSIONS) n_shown = STATS_MAX_SESSIONS;
    if (j->admin) dj__mw_u64(w, "sessions_total", s->sessions.n);
    dj__mw_key(w, "sessions");
    msgpack_pack_array(&w->pk, n_shown);
    size_t n_packed = 0;
    for (size_t b = 0; b < s->sessions.n_buckets; b++)
        for (dj__ment *e = s->sessions.b[b]; e && n_packed < n_shown; e = e->next) {
            dj__sess *ss = e->val;
            if (!j->admin && ss->tenant != j->tenant) continue;
            n_packed++;
            msgpack_pack_map(&w->pk, 11);
            pack_kv_u64(&w->pk, "id", ss->id);
            dj__pack_str(&w->pk, "state");
            dj__pack_str(&w->pk, dj_sched_state_name(dj_sched_session_state(s->sched, ss->id, now)));
            pack_kv_u64(&w->pk, "kv_bytes", dj_session_kv_bytes(ss->es));
            pack_kv_u64(&w->pk, "pooled_bytes", dj_session_residency(ss->es) == DJ_KV_RESIDENT ? 0
                                                                                                : dj_session_kv_bytes(ss->es));
            pack_kv_u64(&w->pk, "swaps", ss->swaps);
            dj__pack_str(&w->pk, "model");
            dj__pack_str(&w->pk, ss->model);
            dj__pack_str(&w->pk, "qos");
            dj__pack_str(&w->pk, dj_qos_name(ss->qos));
            pack_kv_u64(&w->pk, "pos", ss->pos);
            pack_kv_u64(&w->pk, "lease_left_ms", ss->lease_deadline_ms > clk ? ss->lease_deadline_ms - clk : 0);
            pack_kv_bool(&w->pk, "paused", ss->paused);
            pack_kv_bool(&w->pk, "generating", ss->busy);
        }
    pthread_mutex_unlock(&s->mu);
    return DJ_OK;
}

static dj_status do_stats(dj__server *s, const dj__job *j, dj__mw *w) {
    dj_vmu_t *vmu = dj_engine_vmu(s->engine);
    dj_vmu_stats vs;
    dj_vmu_get_stats(vmu, &vs);
    /* a token without the admin role sees its own sessions and nothing of
     * the daemon's that others' work moves (memory, steps, the prefix cache,
     * queues, swap, models, counts): issue 43 */
    dj__mw_str(w, "scope", j->admin ? "all" : "own");
    dj__mw_str(w, "version", DJ_VERSION_STRING);
    dj__mw_u64(w, "page_bytes", dj_vmu_page_bytes(vmu));
    if (!j->admin) {
        dj__mw_key(w, "models"); /* the field clients expect, empty: which models others load is theirs */
        msgpack_pack_array(&w->pk, 0);
        return stats_sessions(s, j, w);
    }
    const dj_vmu_seg_stats *seg[3] = {&vs.text, &vs.data, &vs.stack};
    static const char *seg_name[3] = {"text", "data", "stack"};
    dj__mw_key(w, "segments");
    msgpack_pack_map(&w->pk, 3);
    for (int i = 0; i < 3; i++) {
        dj__pack_str(&w->pk, seg_name[i]);
        msgpack_pack_map(&w->pk, 3);
        pack_kv_u64(&w->pk, "capacity", seg[i]->capacity);
        pack_kv_u64(&w->pk, "used", seg[i]->used);
        pack_kv_u64(&w->pk, "peak", seg[i]->peak);
    }
    dj__mw_u64(w, "vmu_models", vs.n_models);
    dj__mw_u64(w, "vmu_sessions", vs.n_sessions);
    dj__mw_u64(w, "pages_total", vs.pages_total);
    dj__mw_u64(w, "pages_free", vs.pages_free);
    dj__mw_u64(w, "evictions", vs.evictions);
    dj__mw_u64(w, "text_pinned", vs.text_pinned);
    dj__mw_u64(w, "text_mapped", vs.text_mapped);
    dj__mw_u64(w, "batched_steps", s->batched_steps);
    dj__mw_u64(w, "mixed_steps", s->mixed_steps);
    dj__mw_u64(w, "batched_rows", s->batched_rows);
    dj__mw_u64(w, "gen_steps", s->gen_steps);
    dj__mw_f64(w, "step_ms", s->gen_steps ? s->gen_step_s * 1e3 / (double)s->gen_steps : 0.0);
    dj__mw_f64(w, "step_engine_ms", s->gen_steps ? s->gen_engine_s * 1e3 / (double)s->gen_steps : 0.0);
    size_t caps = 0, replays = 0, fails = 0;
    dj_engine_graph_stats(s->engine, &caps, &replays, &fails);
    dj__mw_u64(w, "graph_captures", caps);
    dj__mw_u64(w, "graph_replays", replays);
    dj__mw_u64(w, "graph_failures", fails);
    dj_prefix_stats ps;
    dj_engine_prefix_stats(s->engine, &ps);
    dj__mw_key(w, "prefix");
    msgpack_pack_map(&w->pk, 8);
    pack_kv_bool(&w->pk, "enabled", ps.enabled);
    pack_kv_u64(&w->pk, "blocks", ps.blocks);
    pack_kv_u64(&w->pk, "blocks_unreferenced", ps.blocks_unreferenced);
    pack_kv_u64(&w->pk, "pages", ps.pages);
    pack_kv_u64(&w->pk, "pages_unreferenced", ps.pages_unreferenced);
    pack_kv_u64(&w->pk, "hits", ps.hits);
    pack_kv_u64(&w->pk, "tokens_mapped", ps.tokens_mapped);
    pack_kv_u64(&w->pk, "evictions", ps.evictions);
    size_t n_models = 0;
    for (dj__model_ent *m = s->models; m; m = m->next) n_models++;
    dj__mw_key(w, "models");
    msgpack_pack_array(&w->pk, n_models);
    for (dj__model_ent *m = s->models; m; m = m->next) {
        dj_model_placement pl;
        dj_model_get_placement(m->m, &pl);
        msgpack_pack_map(&w->pk, 11);
        dj__pack_str(&w->pk, "name");
        dj__pack_str(&w->pk, m->name);
        pack_kv_u64(&w->pk, "refs", m->users + (m->pinned ? 1u : 0u));
        pack_kv_u64(&w->pk, "sessions", m->users);
        pack_kv_bool(&w->pk, "pinned", m->pinned);
        /* the placement: layers streamed through a ring (0: all resident) */
        pack_kv_u64(&w->pk, "layers", pl.n_layers);
        pack_kv_u64(&w->pk, "streamed_layers", pl.n_streamed);
        pack_kv_u64(&w->pk, "resident_bytes", pl.resident_bytes);
        pack_kv_u64(&w->pk, "ring_bytes", pl.ring_bytes);
        pack_kv_u64(&w->pk, "streamed_bytes", pl.streamed_bytes);
        pack_kv_u64(&w->pk, "host_layers", pl.n_host); /* streamed layers whose FFN the host computes */
        pack_kv_u64(&w->pk, "host_share_pct", (uint64_t)(100.0 * pl.host_share + 0.5)); /* of each one's FFN */
    }
    stats_sessions(s, j, w);
    const uint64_t now = dj__now_ms();
    pthread_mutex_lock(&s->mu);
    dj_sched_stats sst;
    dj_sched_get_stats(s->sched, now, &sst);
    dj__mw_key(w, "queues");
    msgpack_pack_map(&w->pk, DJ_QOS_COUNT);
    for (int q = 0; q < DJ_QOS_COUNT; q++) {
        dj__pack_str(&w->pk, dj_qos_name((dj_qos)q));
        msgpack_pack_map(&w->pk, 2);
        pack_kv_u64(&w->pk, "waiting", s->newq[q].n + sst.waiting[dj_qos_rank((dj_qos)q)]);
        pack_kv_u64(&w->pk, "running", sst.running[dj_qos_rank((dj_qos)q)]);
    }
    dj_swap_stats sw;
    dj_engine_swap_stats(s->engine, &sw);
    dj__mw_key(w, "swap");
    msgpack_pack_map(&w->pk, 12);
    dj__pack_str(&w->pk, "policy");
    dj__pack_str(&w->pk, dj_swap_policy_name(s->cfg.swap_policy));
    pack_kv_u64(&w->pk, "pool_bytes", sw.capacity);
    pack_kv_u64(&w->pk, "pool_used", sw.used);
    pack_kv_u64(&w->pk, "pool_peak", sw.peak);
    pack_kv_u64(&w->pk, "swaps_out", sw.swaps_out);
    pack_kv_u64(&w->pk, "swaps_in", sw.swaps_in);
    pack_kv_u64(&w->pk, "bytes_out", sw.bytes_out);
    pack_kv_u64(&w->pk, "bytes_in", sw.bytes_in);
    pack_kv_u64(&w->pk, "pages_reserved", sst.pages_reserved);
    pack_kv_u64(&w->pk, "preemptions", sst.preemptions);
    pack_kv_u64(&w->pk, "prefetches", sst.prefetches);
    pack_kv_u64(&w->pk, "drops", sst.drops);
    dj_disk_stats ds;
    dj_engine_disk_stats(s->engine, &ds);
    dj__tier_pack_stats(w, &ds, &sst);
    dj__mw_u64(w, "handles", s->handles.n);
    dj__mw_u64(w, "connections", s->live_conns.n);
    pthread_mutex_unlock(&s->mu);
    dj__capture_stats(s->capture, w);
    char *map = NULL;
    size_t map_len = 0;
    FILE *f = j->admin ? open_memstream(&map, &map_len) : NULL; /* the map names every session */
    if (f) {
        dj_vmu_print_stats(vmu, f);
        fclose(f);
        char *clean = dj_malloc(map_len + 1);
        if (clean) {
            dj__scrub_message(map, clean, map_len + 1);
            dj__mw_str(w, "map", clean);
        }
        free(clean);
    }
    free(map);
    return DJ_OK;
}

static dj_status do_model_list(dj__server *s, dj__mw *w) {
    DIR *d = opendir(s->cfg.models);
    if (!d) return dj_fail(DJ_EIO, "model store %s: %s", s->cfg.models, strerror(errno));
    char names[256][128];
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 256) {
        if (!valid_model_name(de->d_name) || strlen(de->d_name) >= 128) continue;
        char path[PATH_MAX];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s/config.json", s->cfg.models, de->d_name);
        if (stat(path, &sb) != 0) continue;
        const size_t len = strlen(de->d_name); /* < 128, checked above */
        memcpy(names[n], de->d_name, len + 1);
        n++;
    }
    closedir(d);
    dj__mw_key(w, "models");
    msgpack_pack_array(&w->pk, n);
    for (size_t i = 0; i < n; i++) {
        dj__model_ent *m = model_find(s, names[i]);
        msgpack_pack_map(&w->pk, 3);
        dj__pack_str(&w->pk, "name");
        dj__pack_str(&w->pk, names[i]);
        pack_kv_bool(&w->pk, "loaded", m != NULL);
        pack_kv_u64(&w->pk, "refs", m ? m->users + (m->pinned ? 1u : 0u) : 0);
    }
    return DJ_OK;
}

static dj_status do_model_load(dj__server *s, dj__job *j, dj__mw *w, bool load) {
    char name[128];
    dj_status st = dj__meta_strcpy(&j->meta, "model", true, name, sizeof name);
    if (st != DJ_OK) return st;
    dj__model_ent *e = model_find(s, name);
    if (load) {
        if (!e || !e->pinned) {
            dj_model_t *m = NULL;
            if ((st = model_ref(s, name, &e, &m)) != DJ_OK) {
                j->model_error = true;
                return st;
            }
            e->pinned = true;
            e->pin_conn = j->conn;
        }
        const dj_model_config *c = dj_model_get_config(e->m);
        dj__mw_u64(w, "fingerprint", dj_model_fingerprint(e->m));
        dj__mw_u64(w, "params", dj_model_param_count(e->m));
        dj__mw_u64(w, "vocab", c->vocab_size);
        dj__mw_u64(w, "max_ctx", c->max_position_embeddings);
        DJ_LOG(INFO, "model=%s loaded (pinned)", name);
        return DJ_OK;
    }
    if (!e || !e->pinned || (e->pin_conn != j->conn && !j->admin))
        return dj_fail(DJ_ENOTFOUND, "model %s is not pinned by this connection%s", name,
                       e && e->pinned && !s->have_token ? " (another's pin: " DJ__ADMIN_NEEDED ")" : "");
    e->pinned = false;
    dj_model_release(s->engine, e->m); /* stays cached in the text segment until space is needed */
    dj__mw_u64(w, "sessions", e->users);
    model_ent_maybe_drop(s, e);
    DJ_LOG(INFO, "model=%s unloaded", name);
    return DJ_OK;
}

/* ---- the worker loop ---- */

static void run_job(dj__server *s, dj__job *j) {
    if (j->type == DJ_MSG_GENERATE) {
        run_generate(s, j);
        return;
    }
    if (!j->gen) dj__metrics_observe(&s->metrics, &s->metrics.queue_s, dj__now() - j->t_enqueue);
    dj__mw w;
    dj__mw_init(&w);
    bool foreign = false;
    dj_status st;
    switch (j->type) {
    case DJ_MSG_STATS: st = do_stats(s, j, &w); break;
    case DJ_MSG_MODEL_LIST: st = do_model_list(s, &w); break;
    case DJ_MSG_MODEL_LOAD: st = do_model_load(s, j, &w, true); break;
    case DJ_MSG_MODEL_UNLOAD: st = do_model_load(s, j, &w, false); break;
    case DJ_MSG_SESSION_OPEN: st = do_open(s, j, &w); break;
    case DJ_MSG_SESSION_CLOSE: st = do_close(s, j, &foreign); break;
    case DJ_MSG_STEP: st = do_step(s, j, &w, &foreign); break;
    case DJ_MSG_GRAPH_RUN: st = dj__graph_serve(s, j->graph, j->conn, &w); break;
    default: st = dj_fail(DJ_EINTERNAL, "request %s reached the worker", dj_msg_type_name(j->type)); break;
    }
    if (st == DJ_OK) {
        reply(s, j, &w);
    } else {
        dj__mw_destroy(&w);
        reply_error(s, j, st, foreign || (st == DJ_EFORMAT && !j->model_error));
    }
    dj__job_free(j);
}

/* A request leaves its waiting queue: its session's lease runs from now. */
static dj__job *lease_unqueue(dj__server *s, dj__job *j) {
    dj__sess *ss = j->counted ? dj__map_get(&s->sessions, j->sess) : NULL;
    if (ss && ss->queued) {
        ss->queued--;
        ss->lease_deadline_ms = dj__clock_ms(s) + s->cfg.lease_ms;
    }
    j->counted = false;
    return j;
}

/* A request that arrived: STEP and GENERATE checked against their session
 * (a GENERATE's prompt tokenized: the positions it will take), then handed to
 * the scheduler. Errors are answered at once. mu not held. */
static void arrive(dj__server *s, dj__job *j) {
    dj_sched_kind kind = DJ_REQ_CTRL;
    uint64_t sess = 0, model = 0, tokens = 0;
    bool foreign = false;
    dj_status st = DJ_OK;
    dj_clear_error();
    if (j->gen && j->gen->tokenized) st = gen_tokenized(s, j); /* back from the tokenizer thread */
    if (st == DJ_OK && (j->type == DJ_MSG_STEP || j->type == DJ_MSG_GENERATE)) {
        dj__sess *ss = NULL;
        st = job_session(s, j, &ss, &foreign);
        if (st == DJ_OK && j->type == DJ_MSG_STEP) {
            kind = DJ_REQ_STEP;
            const msgpack_object *o = dj__meta_get(&j->meta, "ids");
            tokens = j->payload_len ? j->payload_len / 4 : o && o->type == MSGPACK_OBJECT_ARRAY ? o->via.array.size : 0;
            tokens += 1; /* a pending token goes first */
            if (ss->busy) st = dj_fail(DJ_EBUSY, "session %016llx is generating", (unsigned long long)ss->id);
            else if (ss->paused) st = dj_fail(DJ_EBUSY, "session %016llx is paused", (unsigned long long)ss->id);
        } else if (st == DJ_OK) {
            kind = DJ_REQ_GEN;
            bool deferred = false;
            st = j->gen && j->gen->tokenized ? DJ_OK : gen_prepare(s, j, ss, &deferred);
            if (deferred) return; /* the tokenizer thread hands it back */
            if (st == DJ_OK) tokens = (uint64_t)j->gen->n_ids + 1 + j->gen->max_tokens;
        }
        if (st == DJ_OK) {
            sess = ss->id;
            model = (uint64_t)(uintptr_t)ss->ment;
        }
    }
    prompt_credit(s, j); /* refused before its tokenization, or no text prompt */
    if (tokens > UINT32_MAX) tokens = UINT32_MAX;
    if (st == DJ_OK)
        st = dj_sched_arrive(s->sched, job_id(j), sess, dj_qos_rank(j->qos), kind, model, (uint32_t)tokens, dj__now_ms());
    if (st != DJ_OK) {
        pthread_mutex_lock(&s->mu);
        lease_unqueue(s, j);
        pthread_mutex_unlock(&s->mu);
        reply_error(s, j, st, foreign || st == DJ_EFORMAT);
        dj__job_free(j);
        return;
    }
    held_add(s, j);
}

/* Everything that arrived goes to the scheduler (mu held on entry and exit). */
static void intake(dj__server *s) {
    dj__jobq in = {0};
    for (int q = 0; q < DJ_QOS_COUNT; q++) {
        dj__job *j;
        while ((j = q_pop_head(&s->newq[q]))) q_push(&in, j);
    }
    if (!in.n) return;
    pthread_mutex_unlock(&s->mu);
    dj__job *j;
    while ((j = q_pop_head(&in))) arrive(s, j);
    pthread_mutex_lock(&s->mu);
}

/* PAUSE and RESUME the I/O thread recorded go to the scheduler (mu held). */
static void pauses(dj__server *s) {
    if (!s->pause_dirty) return;
    s->pause_dirty = false;
    const uint64_t now = dj__now_ms();
    for (size_t b = 0; b < s->sessions.n_buckets; b++)
        for (dj__ment *e = s->sessions.b[b]; e; e = e->next) {
            dj__sess *ss = e->val;
            if (ss->pause_seen == ss->pause_seq) continue;
            ss->pause_seen = ss->pause_seq;
            if (ss->paused) dj_sched_pause(s->sched, ss->id, ss->paused_expect_ms, now);
            else dj_sched_resume(s->sched, ss->id, now);
        }
}

static dj__sess *sess_get(dj__server *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    dj__sess *ss = dj__map_get(&s->sessions, id);
    pthread_mutex_unlock(&s->mu);
    return ss;
}

/* Swaps in flight that completed: the scheduler and the metrics learn it. */
static void poll_swaps(dj__server *s) {
    if (!s->n_xfer) return;
    dj_engine_swap_poll(s->engine);
    pthread_mutex_lock(&s->mu);
    for (size_t b = 0; b < s->sessions.n_buckets && s->n_xfer; b++)
        for (dj__ment *e = s->sessions.b[b]; e; e = e->next) {
            dj__sess *ss = e->val;
            if (!ss->xfer) continue;
            const dj_kv_residency r = dj_session_residency(ss->es);
            const bool out_done = ss->xfer == 1 && r == DJ_KV_SWAPPED, in_done = ss->xfer == 2 && r == DJ_KV_RESIDENT;
            if (!out_done && !in_done) continue;
            const double dt = dj__now() - ss->xfer_t0;
            dj_sched_swapped(s->sched, ss->id, out_done ? 0 : dj_session_kv_pages(ss->es));
            ss->kv_bytes = dj_session_kv_bytes(ss->es);
            ss->pooled_bytes = out_done ? ss->kv_bytes : 0;
            ss->swaps += out_done;
            ss->xfer = 0;
            s->n_xfer--;
            pthread_mutex_lock(&s->metrics.mu);
            dj__metrics_observe_locked(&s->metrics, out_done ? &s->metrics.swap_out_s : &s->metrics.swap_in_s, dt);
            if (out_done) {
                s->metrics.swaps_out++;
                s->metrics.swap_bytes_out += ss->xfer_bytes;
            } else {
                s->metrics.swaps_in++;
                s->metrics.swap_bytes_in += ss->xfer_bytes;
            }
            pthread_mutex_unlock(&s->metrics.mu);
        }
    pthread_mutex_unlock(&s->mu);
    dj_swap_stats sw;
    dj_engine_swap_stats(s->engine, &sw);
    if (sw.bytes_in && sw.in_s > 0) dj_sched_rate(s->sched, sw.in_s * 1e3 * (double)sw.page_bytes / (double)sw.bytes_in);
}

static void drop_kv(dj__server *s, uint64_t sid, bool lost);

/* Start a swap the scheduler decided. */
static void start_swap(dj__server *s, uint64_t sid, bool out) {
    dj__sess *ss = sess_get(s, sid);
    dj_status st = ss ? (out ? dj_session_swap_out(s->engine, ss->es) : dj_session_swap_in(s->engine, ss->es))
                      : dj_fail(DJ_ENOTFOUND, "no session %016llx", (unsigned long long)sid);
    dj_sched_swap_started(s->sched, sid, st == DJ_OK);
    if (st != DJ_OK) {
        DJ_LOG(WARN, "session=%016llx: swap %s did not start: %s", (unsigned long long)sid, out ? "out" : "in",
               dj_last_error());
        if (!out && st == DJ_EIO && ss && dj_session_on_disk(ss->es)) drop_kv(s, sid, true); /* its KV is lost */
        return;
    }
    pthread_mutex_lock(&s->mu);
    ss->xfer = out ? 1 : 2;
    ss->xfer_t0 = dj__now();
    ss->xfer_bytes = dj_session_kv_bytes(ss->es);
    s->n_xfer++;
    pthread_mutex_unlock(&s->mu);
    DJ_LOG(DEBUG, "session=%016llx swap %s started (%llu bytes)", (unsigned long long)sid, out ? "out" : "in",
           (unsigned long long)ss->xfer_bytes);
    poll_swaps(s); /* the CPU engine copies at once */
}

/* Recompute policy: the session's KV is freed (a fresh engine session takes
 * its place); its history is fed again before its next request. lost: its
 * KV on disk cannot be read back - recomputed so, or, without its whole
 * history, the session is closed with the reason. */
static void drop_kv(dj__server *s, uint64_t sid, bool lost) {
    dj__sess *ss = sess_get(s, sid);
    if (!ss) return;
    dj_session_t *fresh = NULL;
    dj_status st = dj_session_new(s->engine, ss->ment->m, dj_session_max_ctx(ss->es), 0, &fresh);
    uint64_t salt[2];
    dj_session_cache_salt(ss->es, salt);
    if (st == DJ_OK) st = dj_session_set_cache_salt(fresh, salt); /* its history keys as before */
    if (st == DJ_OK && (s->cfg.swap_policy == DJ_SWAP_RECOMPUTE || lost) && ss->n_hist == dj_session_pos(ss->es)) {
        dj_session_free(s->engine, ss->es);
        ss->es = fresh;
        ss->dropped = true;
        if (lost) dj_sched_kv_lost(s->sched, sid);
        pthread_mutex_lock(&s->metrics.mu);
        s->metrics.drops++;
        pthread_mutex_unlock(&s->metrics.mu);
    } else {
        dj_session_free(s->engine, fresh);
        if (lost) {
            DJ_LOG(ERROR, "session=%016llx: its KV on disk is lost and its history cannot be replayed: closed",
                   (unsigned long long)sid);
            pthread_mutex_lock(&s->mu);
            dj__map_del(&s->sessions, ss->id);
            session_destroy(s, ss, DJ_EIO, "the session's KV on disk failed its checksum and its history cannot be "
                                           "replayed: the session is closed");
            pthread_mutex_unlock(&s->mu);
            return;
        }
        DJ_LOG(WARN, "session=%016llx: KV not dropped (%s)", (unsigned long long)sid,
               st != DJ_OK ? dj_last_error() : "its history is not complete");
    }
    snapshot(s, ss); /* tells the scheduler what it holds now */
}

/* Carry out one decision of the scheduler (mu not held). */
static void carry_out(dj__server *s, const dj_sched_decision *d) {
    switch (d->op) {
    case DJ_SCHED_RUN: {
        dj__job *j = (dj__job *)(uintptr_t)d->req;
        pthread_mutex_lock(&s->mu);
        lease_unqueue(s, j);
        pthread_mutex_unlock(&s->mu);
        if (j->type == DJ_MSG_GENERATE) {
            run_generate(s, j);
            return;
        }
        held_del(s, j);
        run_job(s, j); /* answers and frees it */
        dj_sched_done(s->sched, d->req, dj__now_ms());
        return;
    }
    case DJ_SCHED_STEP: {
        dj__job *jobs[DJ_SCHED_MAX_BATCH];
        for (uint32_t i = 0; i < d->n; i++) jobs[i] = (dj__job *)(uintptr_t)d->reqs[i];
        run_decode_batch(s, jobs, d->n);
        return;
    }
    case DJ_SCHED_SWAP_OUT:
    case DJ_SCHED_SWAP_IN: start_swap(s, d->sess, d->op == DJ_SCHED_SWAP_OUT); return;
    case DJ_SCHED_DROP: drop_kv(s, d->sess, false); return;
    case DJ_SCHED_SPILL: {
        dj__sess *ss = sess_get(s, d->sess);
        dj__tier_spill(s->engine, s->sched, d->sess, ss ? ss->es : NULL);
        return;
    }
    case DJ_SCHED_REFUSE: {
        dj__job *j = (dj__job *)(uintptr_t)d->req;
        pthread_mutex_lock(&s->mu);
        lease_unqueue(s, j);
        pthread_mutex_unlock(&s->mu);
        held_del(s, j);
        dj_fail(DJ_ENOSPC, "%s", dj_sched_refuse_reason(s->sched));
        reply_error(s, j, DJ_ENOSPC, false);
        dj_sched_done(s->sched, d->req, dj__now_ms());
        dj__job_free(j);
        return;
    }
    case DJ_SCHED_WAIT: return;
    }
}

static void publish_metrics(dj__server *s) {
    dj_vmu_stats vs;
    dj_vmu_get_stats(dj_engine_vmu(s->engine), &vs);
    dj_swap_stats sw;
    dj_engine_swap_stats(s->engine, &sw);
    dj_sched_stats ss;
    dj_sched_get_stats(s->sched, dj__now_ms(), &ss);
    pthread_mutex_lock(&s->mu);
    const size_t n_sess = s->sessions.n;
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.vmu = vs;
    s->metrics.sessions = n_sess;
    s->metrics.pool_bytes = sw.capacity;
    s->metrics.pool_used = sw.used;
    s->metrics.preemptions = ss.preemptions;
    memcpy(s->metrics.sess_states, ss.sessions, sizeof s->metrics.sess_states);
    pthread_mutex_unlock(&s->metrics.mu);
}

static bool work_arrived(const dj__server *s) { /* mu held */
    if (s->stop_worker || s->reap || s->pause_dirty) return true;
    for (int q = 0; q < DJ_QOS_COUNT; q++)
        if (s->newq[q].n) return true;
    return false;
}

static void *worker_main(void *arg) {
    dj__server *s = arg;
    uint64_t last_reap = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->stop_worker) {
        const uint64_t now = dj__now_ms();
        if (s->reap || now - last_reap >= 50) {
            reap(s);
            last_reap = now;
        }
        intake(s);
        pauses(s);
        pthread_mutex_unlock(&s->mu);
        poll_swaps(s);
        dj_sched_decision d;
        dj_sched_next(s->sched, dj__now_ms(), &d);
        if (d.op != DJ_SCHED_WAIT) {
            dj_clear_error();
            carry_out(s, &d);
            publish_metrics(s);
            pthread_mutex_lock(&s->mu);
            continue;
        }
        pthread_mutex_lock(&s->mu);
        if (work_arrived(s)) continue;
        /* sleep until something arrives, the scheduler's next due time, a
         * transfer's likely end (polled every ms), or the reaper's turn */
        uint64_t wait_ms = 50;
        const uint64_t t = dj__now_ms();
        if (d.wake_ms != UINT64_MAX) wait_ms = d.wake_ms > t ? d.wake_ms - t : 0;
        if (wait_ms > 50) wait_ms = 50;
        if (s->n_xfer && wait_ms > 1) wait_ms = 1;
        if (!wait_ms) continue;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)wait_ms * 1000000L;
        while (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    /* shutdown: every session, job and model goes */
    for (size_t b = 0; b < s->sessions.n_buckets; b++)
        for (dj__ment *e = s->sessions.b[b]; e; e = e->next) ((dj__sess *)e->val)->dead = true;
    reap(s);
    for (int q = 0; q < DJ_QOS_COUNT; q++) {
        dj__job *j;
        while ((j = q_pop_head(&s->newq[q]))) dj__job_free(j);
    }
    while (s->held) {
        dj__job *j = s->held;
        held_del(s, j);
        dj__job_free(j);
    }
    pthread_mutex_unlock(&s->mu);
    while (s->models) {
        dj__model_ent *m = s->models;
        if (m->pinned) dj_model_release(s->engine, m->m);
        m->pinned = false;
        m->users = 0;
        m->tok_jobs = 0; /* the tokenizer thread was stopped first (dj__worker_stop) */
        model_ent_maybe_drop(s, m);
    }
    return NULL;
}

/* The engine with the VMU sized from the machine (or --vmu-gb), its data
 * segment --data-gb when given, a host swap pool (--swap-gb, else the
 * engine's default share of host RAM; halved until it can be had). */
static dj_status engine_open(dj__server *s, dj_engine_config *ec) {
    dj_vmu_config_default(&ec->vmu, s->cfg.vmu_bytes); /* 0: the engine sizes it from the device */
    dj_status st = dj_engine_new(ec, &s->engine);
    if (st != DJ_OK || !s->cfg.data_bytes) return st;
    dj_vmu_stats vs;
    dj_vmu_get_stats(dj_engine_vmu(s->engine), &vs);
    const size_t total = vs.text.capacity + vs.data.capacity + vs.stack.capacity;
    if (s->cfg.data_bytes >= total * 9 / 10) {
        dj_engine_free(s->engine);
        s->engine = NULL;
        return dj_fail(DJ_EINVAL, "--data-gb: %zu MiB of a %zu MiB VMU leaves too little for weights and activations",
                       s->cfg.data_bytes >> 20, total >> 20);
    }
    dj_engine_free(s->engine); /* again, with the data segment's share set */
    s->engine = NULL;
    dj_vmu_config_default(&ec->vmu, total);
    ec->vmu.data_frac = (double)s->cfg.data_bytes / (double)total;
    ec->vmu.text_frac = (1.0 - ec->vmu.data_frac) * 0.85;
    ec->vmu.stack_frac = (1.0 - ec->vmu.data_frac) * 0.15 - 1e-6;
    return dj_engine_new(ec, &s->engine);
}

static dj_status sched_open(dj__server *s) {
    dj_vmu_t *vmu = dj_engine_vmu(s->engine);
    dj_vmu_stats vs;
    dj_vmu_get_stats(vmu, &vs);
    const size_t page = dj_vmu_page_bytes(vmu);
    size_t pool = s->cfg.swap_bytes == DJ__SIZE_AUTO ? dj_engine_swap_default_bytes(s->engine) : s->cfg.swap_bytes;
    dj_status st = DJ_ENOMEM;
    while (pool >= page && (st = dj_engine_swap_init(s->engine, pool)) != DJ_OK) {
        DJ_LOG(WARN, "swap pool of %zu MiB: %s; trying half", pool >> 20, dj_last_error());
        pool /= 2;
    }
    if (st != DJ_OK) pool = 0;
    dj_swap_stats sw;
    dj_engine_swap_stats(s->engine, &sw);
    uint64_t disk_pages = 0;
    double disk_page_ms = 0;
    if (s->cfg.state_dir &&
        (st = dj__tier_open(s->engine, s->cfg.state_dir, s->cfg.disk_bytes, &disk_pages, &disk_page_ms)) != DJ_OK)
        return st;
    const bool cpu = !s->cfg.device || strcmp(s->cfg.device, "cpu") == 0;
    const dj_sched_config sc = {
        .max_running = s->cfg.max_running,
        .max_rows = MIXED_ROWS,
        .pages_total = (uint32_t)vs.pages_total,
        .pool_pages = sw.capacity / page,
        .idle_ms = s->cfg.idle_ms,
        .lifo_age_ms = s->cfg.max_wait_ms,
        .quota_pages = s->cfg.quota_bytes ? (s->cfg.quota_bytes + page - 1) / page : 0,
        .pool_quota_pages = ((s->cfg.swap_quota_bytes == DJ__SIZE_AUTO ? s->cfg.quota_bytes : s->cfg.swap_quota_bytes) +
                             page - 1) / page,
        /* until a swap measures it: ~20 GB/s pinned PCIe, ~5 GB/s memcpy */
        .page_in_ms = (double)page / (cpu ? 5e9 : 20e9) * 1e3,
        .policy = s->cfg.swap_policy,
        .disk_pages = disk_pages,
        .disk_page_ms = disk_page_ms,
    };
    DJ_LOG(INFO, "VMU: text %zu MiB, data %zu MiB (%zu pages of %zu KiB), stack %zu MiB; swap pool %zu MiB; "
           "policy %s", vs.text.capacity >> 20, vs.data.capacity >> 20, vs.pages_total, page >> 10,
           vs.stack.capacity >> 20, sw.capacity >> 20, dj_swap_policy_name(s->cfg.swap_policy));
    return dj_sched_new(&sc, &s->sched);
}

/* Stops and joins the tokenizer thread; the prompts it had not reached are
 * dropped (the daemon is stopping). */
static void tokenizer_stop(dj__server *s) {
    if (!s->tok_started) return;
    pthread_mutex_lock(&s->mu);
    s->stop_tok = true;
    pthread_cond_signal(&s->tok_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->tokenizer, NULL);
    s->tok_started = false;
    pthread_cond_destroy(&s->tok_cv);
    dj__job *j;
    while ((j = q_pop_head(&s->tokq))) dj__job_free(j);
}

dj_status dj__worker_start(dj__server *s) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    /* The CPU engine's OpenMP threads spin at their barriers; with one per core
     * the I/O thread (and clients on the same machine) preempt them and every
     * parallel region of a step waits for a time slice. Leave one core free
     * unless --threads says otherwise. */
    ec.n_threads = s->cfg.threads;
    if (ec.n_threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        ec.n_threads = cores > 1 ? (int)cores - 1 : 1;
    }
    ec.device = s->cfg.device;
    ec.max_step_tokens = MIXED_ROWS;
    ec.deterministic = s->cfg.deterministic;
    ec.host_layers = s->cfg.host_layers;
    ec.no_prefix_cache = s->cfg.no_prefix_cache;
    ec.kv_dtype = s->cfg.kv_dtype;
    /* auto: on for the CPU engine (measured, bench/RESULTS.md); a device's
     * mixed rows take the per-row attention kernel instead of the prefill one,
     * not measured yet */
    const bool cpu = !s->cfg.device || strcmp(s->cfg.device, "cpu") == 0;
    s->mixed = s->cfg.mixed_steps == 1 || (s->cfg.mixed_steps < 0 && cpu);
    s->ride_rows = s->cfg.mixed_steps == 2 || (s->cfg.mixed_steps < 0 && !cpu) ? RIDE_ROWS : 0;
    dj_status st = engine_open(s, &ec);
    if (st == DJ_OK) st = sched_open(s);
    if (st == DJ_OK && pthread_cond_init(&s->tok_cv, NULL) != 0)
        st = dj_fail(DJ_EINTERNAL, "cannot create the tokenizer thread's condition");
    if (st == DJ_OK) {
        if (pthread_create(&s->tokenizer, NULL, tokenizer_main, s) != 0) {
            pthread_cond_destroy(&s->tok_cv);
            st = dj_fail(DJ_EINTERNAL, "cannot start the tokenizer thread");
        } else {
            s->tok_started = true;
        }
    }
    if (st == DJ_OK && pthread_create(&s->worker, NULL, worker_main, s) != 0)
        st = dj_fail(DJ_EINTERNAL, "cannot start the engine thread");
    if (st != DJ_OK) {
        tokenizer_stop(s);
        dj_sched_free(s->sched);
        s->sched = NULL;
        dj_engine_free(s->engine);
        s->engine = NULL;
        return st;
    }
    s->worker_started = true;
    return DJ_OK;
}

void dj__worker_stop(dj__server *s) {
    tokenizer_stop(s); /* first: it may be using a model entry's tokenizer */
    if (!s->worker_started) {
        dj_sched_free(s->sched);
        s->sched = NULL;
        dj_engine_free(s->engine);
        s->engine = NULL;
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->stop_worker = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->worker, NULL);
    s->worker_started = false;
    dj_sched_free(s->sched);
    s->sched = NULL;
    dj_engine_free(s->engine);
    s->engine = NULL;
}
