/* worker.c: djinnd's engine thread - the only thread that touches the
 * engine. It hands requests to the scheduler (src/sched/) and carries out its
 * decisions: requests, batched generation steps, KV swaps; sessions with
 * the engine sessions, models shared by fingerprint, stats; it answers with typed events (event.h). */
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

#include "djinn/lora.h"
#include "server/adapter.h"
#include "server/graph_serve.h"
#include "server/access.h"
#include "server/load_progress.h"
#include "server/view_stats.h"
#include "server/server_impl.h"
#include "server/disk_tier.h"
#include "server/session_move.h"

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

/* Into the I/O side's mailbox (dj__server.ev_head; out_mu held). */
static void post_locked(dj__server *s, dj__event *e) {
    if (!e) return;
    e->next = NULL;
    if (s->ev_tail) s->ev_tail->next = e;
    else s->ev_head = e;
    s->ev_tail = e;
    if (!s->stopping) uv_async_send(&s->wake); /* when stopping, the loop drains the list itself */
}

/* An event of j's answer; NULL when it could not be made (no memory): the
 * loop then answers j with an ENOMEM ERROR (on_wake), and j's later events
 * are dropped, so the client never waits for a frame that will not come. */
static void post_job_locked(dj__server *s, dj__job *j, dj__event *e) {
    if (j->lost) {
        dj__event_free(e);
        return;
    }
    if (e) {
        e->session = j->sess;
        e->counted = j->counted;
        e->handle_quota = j->handle_quota;
        const dj__sess *ss = j->sess ? dj__map_get(&s->sessions, j->sess) : NULL; /* the worker's own map */
        if (ss) {
            e->has_state = true;
            e->pos = ss->pos;
            e->swapped = ss->pooled_bytes > 0;
        }
        post_locked(s, e);
        return;
    }
    j->lost = true;
    if (s->n_lost < DJ__LOST_MAX) {
        s->lost[s->n_lost].conn = j->conn;
        s->lost[s->n_lost].req = j->req;
        s->lost[s->n_lost].sess = j->sess;
        s->lost[s->n_lost].counted = j->counted;
        s->lost[s->n_lost].type = j->type;
        s->lost[s->n_lost].handle_quota = j->handle_quota;
        s->n_lost++;
    } else {
        s->lost_overflow = true;
    }
    if (!s->stopping) uv_async_send(&s->wake);
}

static void post_job(dj__server *s, dj__job *j, dj__event *e) {
    pthread_mutex_lock(&s->out_mu);
    post_job_locked(s, j, e);
    pthread_mutex_unlock(&s->out_mu);
}

static void gen_free(dj__gen *g) {
    if (!g) return;
    dj_gen_free(g->g);
    dj__trace_free(g->tr); /* after the generation that read it */
    free(g->ids);
    free(g);
}

/* ---- jobs the scheduler holds (worker only) ---- */

static uint64_t job_id(const dj__job *j) { return (uint64_t)(uintptr_t)j; }

static void held_add(dj__server *s, dj__job *j) {
    s->n_held++;
    j->hprev = NULL;
    j->hnext = s->held;
    if (s->held) s->held->hprev = j;
    s->held = j;
}

static void held_del(dj__server *s, dj__job *j) {
    if (!j->hprev && s->held != j) return; /* not held */
    s->n_held--;
    if (j->hprev) j->hprev->hnext = j->hnext;
    else s->held = j->hnext;
    if (j->hnext) j->hnext->hprev = j->hprev;
    j->hprev = j->hnext = NULL;
}

void dj__job_free(dj__job *j) {
    if (!j) return;
    dj__request_free(&j->r);
    gen_free(j->gen);
    dj__event_free(j->credit_ev);
    dj__graph_req_free(j->graph);
    free(j);
}

/* The worker's mailbox: requests (and DJ__CTL_ messages) of the I/O side,
 * each in its class's queue (j->qos: the session's, set by the I/O side). */
void dj__enqueue(dj__server *s, dj__job *j) {
    pthread_mutex_lock(&s->mu);
    q_push(&s->newq[j->qos], j);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* ---- replies ---- */

/* The model an access line names for j: the one it names, else its session's. */
static const char *job_model(dj__server *s, const dj__job *j) {
    if (j->type == DJ_MSG_MODEL_LOAD || j->type == DJ_MSG_MODEL_UNLOAD) return j->r.u.model;
    if (j->type == DJ_MSG_SESSION_OPEN) return j->r.u.open.model;
    const dj__sess *ss = j->sess ? dj__map_get(&s->sessions, j->sess) : NULL;
    return ss ? ss->model : NULL;
}

/* j's REPLY: rep (filled by its do_*) moves into a posted event. */
static bool reply(dj__server *s, dj__job *j, dj__event *rep) {
    dj__metrics_count(&s->metrics, j->type, DJ_OK);
    dj__access_job(j, job_model(s, j), DJ_OK);
    dj__event *e = dj_malloc(sizeof *e);
    if (e) *e = *rep;
    else dj__event_clear(rep);
    post_job(s, j, e);
    return e != NULL;
}

static void reply_error(dj__server *s, dj__job *j, dj_status st, bool close_after) {
    dj__metrics_count(&s->metrics, j->type, st);
    DJ_LOG(INFO, "conn=%llu req=%llu session=%016llx type=%s error=%s: %s", (unsigned long long)j->conn,
           (unsigned long long)j->req, (unsigned long long)j->sess, dj_msg_type_name(j->type), dj_status_name(st),
           dj_last_error());
    if (j->type == DJ_MSG_GENERATE) dj__access_generate(j, NULL, st);
    else dj__access_job(j, job_model(s, j), st);
    if (j->type == DJ_MSG_GENERATE) dj__vllm_generate_end(s, j, dj__map_get(&s->sessions, j->sess), st, DJ__VFIN_ERROR);
    post_job(s, j, dj__event_error(j->conn, j->type, j->req, st, dj_last_error(), close_after));
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
    dj_status st = dj__load_model(s->engine, dir, name, m); /* load_progress.c: its progress shown */
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

/* Release everything a session holds: its requests the scheduler holds
 * (answered with `why`), pages, model reference. The session is
 * already out of the worker's table. */
static void session_destroy(dj__server *s, dj__sess *ss, dj_status why, const char *msg) {
    /* its requests the scheduler holds (the running generation among them) are answered */
    for (dj__job *j = s->held, *nx; j; j = nx) {
        nx = j->hnext;
        if (j->sess != ss->id || (j->type != DJ_MSG_STEP && j->type != DJ_MSG_GENERATE)) continue;
        held_del(s, j);
        dj__metrics_count(&s->metrics, j->type, why);
        if (j->type == DJ_MSG_GENERATE) dj__access_generate(j, ss, why);
        if (j->type == DJ_MSG_GENERATE) dj__vllm_generate_end(s, j, ss, why, DJ__VFIN_ABORT);
        else dj__access_job(j, ss->model, why);
        post_job(s, j, dj__event_error(j->conn, j->type, j->req, why, msg, false)); /* dropped if its connection went */
        dj__job_free(j);
    }
    ss->busy = NULL;
    dj__brk_drop(s->engine, ss); /* a step paused at a breakpoint */
    if (s->cfg.state_dir && s->cfg.persist == DJ__PERSIST_ALWAYS && !s->stop_worker) { /* it is gone for good */
        char dir[4096], path[4200];
        if (dj__persist_dir(s->cfg.state_dir, dir, sizeof dir) == DJ_OK) {
            snprintf(path, sizeof path, "%s/%016llx.djs", dir, (unsigned long long)ss->id);
            (void)unlink(path);
        }
    }
    dj_sched_session_close(s->sched, ss->id); /* its result handles: the I/O side's (lease_drop) */
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

/* DJ__CTL_ORPHAN: the session's connection closed; its requests are dropped
 * (a running generation stops; what it fed stays in the KV) and it waits
 * for a SESSION_ATTACH. */
static void cancel_orphaned(dj__server *s, dj__sess *ss) {
    ss->conn = 0;
    dj__brk_drop(s->engine, ss); /* a step paused at a breakpoint goes with its client */
    for (dj__job *j = s->held, *nx; j; j = nx) {
        nx = j->hnext;
        if (j->sess != ss->id || (j->type != DJ_MSG_STEP && j->type != DJ_MSG_GENERATE)) continue;
        if (ss->busy == j) {
            ss->busy = NULL;
            if (j->gen && j->gen->g) ss->pending = dj_gen_pending(j->gen->g);
        }
        held_del(s, j);
        dj_sched_done(s->sched, job_id(j), dj__now_ms());
        dj__job_free(j);
    }
}

/* The scheduler's limits of the config's values (at start and at a reload). */
static void sched_limits(const dj__server *s, dj_sched_config *sc) {
    const size_t page = dj_vmu_page_bytes(dj_engine_vmu(s->engine));
    sc->idle_ms = s->cfg.idle_ms;
    sc->lifo_age_ms = s->cfg.max_wait_ms;
    sc->quota_pages = s->cfg.quota_bytes ? (s->cfg.quota_bytes + page - 1) / page : 0;
    sc->pool_quota_pages = ((s->cfg.swap_quota_bytes == DJ__SIZE_AUTO ? s->cfg.quota_bytes : s->cfg.swap_quota_bytes) +
                            page - 1) / page;
}

/* DJ__CTL_LIMITS: SIGHUP's values of the options the worker reads. */
static void set_limits(dj__server *s, const dj__job *j) {
    s->cfg.prefill_chunk = j->ctl.limits.prefill_chunk;
    s->cfg.idle_ms = j->ctl.limits.idle_ms;
    s->cfg.max_wait_ms = j->ctl.limits.max_wait_ms;
    s->cfg.quota_bytes = j->ctl.limits.quota_bytes;
    s->cfg.swap_quota_bytes = j->ctl.limits.swap_quota_bytes;
    dj_sched_config sc;
    memset(&sc, 0, sizeof sc);
    sched_limits(s, &sc);
    dj_sched_set_limits(s->sched, &sc);
    DJ_LOG(INFO, "limits reloaded: prefill-chunk %u, idle-ms %u, max-wait-ms %u, quota %zu bytes",
           s->cfg.prefill_chunk, s->cfg.idle_ms, s->cfg.max_wait_ms, s->cfg.quota_bytes);
}

dj_status dj__worker_limits(dj__server *s, const dj__config *nc) {
    dj__job *j = dj_calloc(1, sizeof *j);
    if (!j) return dj_fail(DJ_ENOMEM, "out of memory");
    j->type = DJ__CTL_LIMITS;
    j->qos = DJ_QOS_REALTIME;
    j->ctl.limits.prefill_chunk = nc->prefill_chunk;
    j->ctl.limits.idle_ms = nc->idle_ms;
    j->ctl.limits.max_wait_ms = nc->max_wait_ms;
    j->ctl.limits.quota_bytes = nc->quota_bytes;
    j->ctl.limits.swap_quota_bytes = nc->swap_quota_bytes;
    dj__enqueue(s, j);
    return DJ_OK;
}

/* A message of the I/O side's about a session (DJ__CTL_ types); frees it. */
static void control(dj__server *s, dj__job *j) {
    if (j->type == DJ__CTL_LIMITS) {
        set_limits(s, j);
        dj__job_free(j);
        return;
    }
    dj__sess *ss = dj__map_get(&s->sessions, j->sess);
    if (ss) switch (j->type) {
        case DJ__CTL_PAUSE: {
            const uint64_t now = dj__now_ms();
            ss->paused = j->ctl.paused;
            if (j->ctl.resume_at > 0) ss->resume_at = j->ctl.resume_at;
            if (ss->paused) dj_sched_pause(s->sched, ss->id, j->ctl.expect_ms, now);
            else dj_sched_resume(s->sched, ss->id, now);
            break;
        }
        case DJ__CTL_DROP:
            dj__map_del(&s->sessions, ss->id);
            session_destroy(s, ss, j->ctl.why, j->ctl.why_msg);
            break;
        case DJ__CTL_ORPHAN: cancel_orphaned(s, ss); break;
        case DJ__CTL_ATTACH: ss->conn = j->conn; ss->tenant = j->tenant; break;
        default: break;
        }
    dj__job_free(j);
}

/* The session a job names, held by its connection. */
static dj_status job_session(dj__server *s, dj__job *j, dj__sess **out, bool *foreign) {
    const uint64_t sid = j->r.session;
    j->sess = sid;
    dj__sess *ss = dj__map_get(&s->sessions, sid);
    *foreign = ss && ss->conn != j->conn;
    if (*foreign) ss = NULL;
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
    ss->pos = pos;
    ss->kv_bytes = dj_session_kv_bytes(ss->es);
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

/* What the session was fed, to feed again after a drop (recompute policy,
 * a lost page on disk) or on the daemon a session image goes to (4 bytes a
 * token, kept always). */
static dj_status hist_add(dj__server *s, dj__sess *ss, const int32_t *ids, size_t n) {
    (void)s;
    if (!n) return DJ_OK;
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
 * `cache_salt` string cs[n] when given (cs not NULL; bounded by its decoder). */
static void request_salt(const dj__job *j, const char *cs, size_t n, uint64_t salt[2] /* OUT */) {
    if (cs) dj__cache_salt_of(j->cache_salt, cs, n, salt);
    else memcpy(salt, j->cache_salt, 2 * sizeof *salt);
}

/* --persist always: the session's image to the state directory now (a
 * request that changed it is answered after this; a failure is logged and
 * the answer goes out, the session then as durable as its last image). */
static void persist_now(dj__server *s, dj__sess *ss) {
    if (!s->cfg.state_dir || s->cfg.persist != DJ__PERSIST_ALWAYS || !ss) return;
    char dir[4096];
    dj__job *busy = ss->busy; /* its generation has ended (gen_done) or none runs */
    ss->busy = NULL;
    const dj_status st = dj__persist_dir(s->cfg.state_dir, dir, sizeof dir) == DJ_OK
                             ? dj__persist_save(s->engine, ss, dir) : DJ_EIO;
    ss->busy = busy;
    if (st != DJ_OK)
        DJ_LOG(WARN, "session=%016llx: --persist always: not written: %s", (unsigned long long)ss->id, dj_last_error());
}

static dj_status do_open(dj__server *s, dj__job *j, dj__rep_open *out) {
    /* SESSION_IMPORT opens the session its image describes (session_move.h) */
    const dj__simg *img = j->type == DJ_MSG_SESSION_IMPORT ? &j->r.u.import.img : NULL;
    const dj__req_open *rq = img ? NULL : &j->r.u.open;
    const char *model = img ? img->model : rq->model; /* the I/O side counted it against the session quotas */
    const bool reattach = img || rq->reattach;
    const uint32_t expect = img ? img->max_ctx : rq->expected_tokens;
    const dj_qos qos = img ? img->qos : rq->qos;
    uint64_t salt[2];
    if (img) memcpy(salt, img->salt, sizeof salt);
    else request_salt(j, rq->cache_salt, rq->salt_len, salt);
    dj_status st = DJ_OK;
    dj__model_ent *e = model_find(s, model);
    dj_model_t *m = NULL;
    const bool load = !e || (!e->users && !e->pinned);
    if (load && (st = model_ref(s, model, &e, &m)) != DJ_OK) {
        j->model_error = true; /* the model's files: this request fails, the connection stays */
        return st;
    }
    if (!load) m = e->m; /* held by its other users: the session takes its own reference */
    if (img && (st = dj__session_check_image(img, m, model)) != DJ_OK) {
        if (load) dj_model_release(s->engine, m);
        model_ent_maybe_drop(s, e);
        return st;
    }
    const dj_model_config *c = dj_model_get_config(m);
    const uint32_t ctx = expect ? expect : dj_model_config_default_ctx(c);
    if (c->max_position_embeddings && ctx > c->max_position_embeddings) {
        if (load) dj_model_release(s->engine, m);
        model_ent_maybe_drop(s, e);
        return dj_fail(DJ_ERANGE, "expected_tokens %u exceeds the model's %u positions", ctx,
                       c->max_position_embeddings);
    }
    dj__sess *ss = dj_calloc(1, sizeof *ss);
    /* the messages that will end it (and orphan it), made now so that posting them allocates nothing */
    dj__job *drop = dj_calloc(1, sizeof *drop), *orphan = reattach ? dj_calloc(1, sizeof *orphan) : NULL;
    if (!ss || !drop || (reattach && !orphan)) st = dj_fail(DJ_ENOMEM, "out of memory");
    if (st == DJ_OK) st = dj_session_new(s->engine, m, ctx, 0, &ss->es);
    if (st == DJ_OK) st = dj_session_set_cache_salt(ss->es, salt);
    if (load) dj_model_release(s->engine, m); /* the session holds its own reference */
    if (st == DJ_OK) st = dj__random_id(&ss->id);
    uint64_t secret = 0;
    if (st == DJ_OK && reattach) st = dj__random_id(&secret);
    if (st == DJ_OK && img) st = dj__session_load_image(s->engine, ss, img);
    if (st == DJ_OK && img && !j->conn) { /* a restart's (restore_sessions): its id and secret as before */
        ss->id = img->id;
        if (img->secret) secret = img->secret;
    }
    if (st != DJ_OK) {
        if (ss) dj_session_free(s->engine, ss->es);
        if (ss) free(ss->hist);
        free(ss);
        free(drop);
        free(orphan);
        model_ent_maybe_drop(s, e);
        return st;
    }
    ss->conn = j->conn;
    ss->tenant = j->tenant;
    ss->secret = secret;
    ss->qos = qos;
    if (!img) ss->pending = -1;
    ss->ment = e;
    e->users++;
    snprintf(ss->model, sizeof ss->model, "%s", model);
    while (dj__map_get(&s->sessions, ss->id)) dj__random_id(&ss->id);
    st = dj__map_put(&s->sessions, ss->id, ss);
    if (st != DJ_OK) {
        free(drop);
        free(orphan);
        session_destroy(s, ss, DJ_ENOTFOUND, "session could not open");
        return st;
    }
    dj_sched_session_info si = {.conn = j->tenant, .qos = dj_qos_rank(qos), .max_ctx = ctx}; /* the quota's group */
    block_shape(ss->es, &si.block_tokens, &si.block_pages);
    if ((st = dj_sched_session_open(s->sched, ss->id, &si, dj__now_ms())) != DJ_OK) {
        free(drop);
        free(orphan);
        dj__map_del(&s->sessions, ss->id);
        session_destroy(s, ss, DJ_ENOTFOUND, "session could not open");
        return st;
    }
    if (img) snapshot(s, ss); /* the pages and position it came with */
    DJ_LOG(INFO, "session=%016llx conn=%llu %s model=%s qos=%s ctx=%u pos=%u", (unsigned long long)ss->id,
           (unsigned long long)ss->conn, img ? "imported" : "opened", model, dj_qos_name(qos), ctx, sess_pos(ss));
    drop->type = DJ__CTL_DROP;
    drop->sess = ss->id;
    drop->qos = qos;
    if (orphan) {
        orphan->type = DJ__CTL_ORPHAN;
        orphan->sess = ss->id;
        orphan->qos = qos;
    }
    *out = (dj__rep_open){.session = ss->id, .secret = secret, .has_secret = reattach, .max_ctx = ctx,
                          .vocab = c->vocab_size, .lease_ms = s->cfg.lease_ms, .qos = qos,
                          .hidden = c->hidden_size, .pos = sess_pos(ss), .tenant = j->tenant, .drop_msg = drop,
                          .orphan_msg = orphan};
    snprintf(out->model, sizeof out->model, "%s", model);
    if (!img || j->conn) persist_now(s, ss); /* --persist always: a kill -9 from now on finds it */
    return DJ_OK;
}

/* SESSION_EXPORT: the session's image (session_move.h), which the I/O side
 * files as a result handle; the session stays as it was. */
static dj_status do_export(dj__server *s, dj__job *j, dj__rep_export *out, bool *foreign) {
    dj__sess *ss = NULL;
    dj_status st = job_session(s, j, &ss, foreign);
    if (st != DJ_OK) return st;
    size_t n = 0;
    if ((st = dj__session_image(s->engine, ss, 0, &out->bytes, &n)) != DJ_OK) return st;
    dj__simg img;
    (void)dj__simg_decode(out->bytes, n, &img); /* what it says, for the reply */
    *out = (dj__rep_export){.bytes = out->bytes, .nbytes = n, .pos = img.kv.pos,
                            .pages = img.kv.n_layers * img.kv.n_blocks, .fingerprint = img.fingerprint};
    DJ_LOG(INFO, "session=%016llx exported: pos=%u, %u KV pages, %zu bytes", (unsigned long long)ss->id, out->pos,
           out->pages, n);
    return DJ_OK;
}

static dj_status do_close(dj__server *s, dj__job *j, bool *foreign) {
    dj__sess *ss = NULL;
    dj_status st = job_session(s, j, &ss, foreign);
    if (st != DJ_OK) return st;
    dj__map_del(&s->sessions, ss->id);
    session_destroy(s, ss, DJ_ENOTFOUND, "session closed");
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

static dj_status do_step(dj__server *s, dj__job *j, dj__rep_step *out, bool *foreign) {
    dj__sess *ss = NULL;
    dj_status st = job_session(s, j, &ss, foreign);
    if (st != DJ_OK) return st;
    const dj__req_step *rq = &j->r.u.step;
    const int32_t *ids = rq->ids;
    size_t n = rq->n_ids;
    int32_t *text_ids = NULL; /* a text prompt's (step_trace.c tokenizes it), the reply's once it ran */
    int32_t *feed = NULL;
    size_t n_feed = 0;
    float *lg = NULL; /* the logits: a result handle once the I/O side files the reply */
    dj__trace_req *tr = NULL; /* with `points` (step_trace.c): the payload holds their tensors */
    const bool traced = rq->n_points > 0;
    const bool want_logits = rq->logits != DJ__LOGITS_NONE, all_rows = rq->logits == DJ__LOGITS_ALL;
    if (ss->brk || rq->brk != DJ__BRK_NONE) { /* its step paused at a breakpoint: resume, cancel or busy */
        int32_t *done = NULL;
        uint32_t n_done = 0;
        st = dj__brk_continue(s->engine, ss, rq, out, &done, &n_done);
        if (done && st == DJ_OK) {
            undrop(ss);
            ss->pending = -1;
            st = hist_add(s, ss, done, n_done);
        }
        snapshot(s, ss);
        free(done);
        return st;
    }
    if (ss->busy) {
        st = dj_fail(DJ_EBUSY, "session %016llx is generating", (unsigned long long)ss->id);
        goto done;
    }
    if (ss->paused) {
        st = dj_fail(DJ_EBUSY, "session %016llx is paused", (unsigned long long)ss->id);
        goto done;
    }
    if (rq->prompt) {
        if (rq->plen > s->cfg.max_prompt_bytes) {
            st = dj_fail(DJ_ERANGE, "prompt of %zu bytes: more than --max-prompt-bytes %llu", rq->plen,
                         (unsigned long long)s->cfg.max_prompt_bytes);
            goto done;
        }
        st = dj__step_tokenize(model_tokenizer(s, ss->ment), ss->ment->name, rq->prompt, rq->plen,
                               sess_pos(ss) == 0 && ss->pending < 0, &text_ids, &n);
        if (st != DJ_OK) goto done;
        ids = text_ids;
    }
    if ((st = feed_ids(ss, ids, n, &feed, &n_feed)) != DJ_OK) goto done;
    if (n_feed == 0) {
        st = dj_fail(DJ_EINVAL, "STEP needs at least one token id");
        goto done;
    }
    const uint32_t vocab = dj_model_get_config(ss->ment->m)->vocab_size;
    const uint64_t rows = all_rows ? n_feed : 1;
    if (traced && (st = dj__trace_parse(rq, (uint32_t)n, dj_model_get_config(ss->ment->m), &tr)) != DJ_OK)
        goto done;
    /* the handles it makes were counted against --max-handles-per-conn by the I/O side */
    if (want_logits && !(lg = dj_malloc((size_t)rows * vocab * sizeof(float)))) {
        st = dj_fail(DJ_ENOMEM, "out of host memory for a %llu x %u logits handle", (unsigned long long)rows, vocab);
        goto done;
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
        bool paused = false; /* at a breakpoint (step_break.c): tr and lg are the paused step's */
        if (st == DJ_OK && dj__trace_breaks(tr)) {
            st = dj__brk_begin(s->engine, ss, &tr, feed + pre, (uint32_t)n, &lg, vocab, out, &paused);
            if (paused || st != DJ_OK) {
                snapshot(s, ss);
                goto done;
            }
        } else if (st == DJ_OK) {
            st = dj__trace_run(s->engine, ss->es, feed + pre, (uint32_t)n, tr, lg);
        }
        if (st == DJ_OK) {
            memmove(feed, feed + pre, n * sizeof *feed);
            n_feed = n;
        }
    } else {
        st = all_rows && lg ? dj_session_step_all(s->engine, ss->es, feed, (uint32_t)n_feed, lg) /* "all" wants logits */
                            : dj_session_step(s->engine, ss->es, feed, (uint32_t)n_feed, lg);
    }
    if (st != DJ_OK) {
        if (tr) snapshot(s, ss);
        goto done;
    }
    undrop(ss);
    if ((st = hist_add(s, ss, feed, n_feed)) != DJ_OK) goto done;
    ss->pending = -1;
    snapshot(s, ss);
    out->pos = dj_session_pos(ss->es);
    if (lg) {
        out->logits = lg; /* the reply's now */
        lg = NULL;
        out->ndim = all_rows ? 2 : 1;
        out->shape[0] = all_rows ? rows : vocab;
        out->shape[1] = all_rows ? vocab : 0;
        out->nbytes = rows * vocab * sizeof(float);
    }
    if (tr) st = dj__trace_publish(tr, out);
done:
    if (st == DJ_OK && text_ids) { /* the reply says which ids the text became */
        out->ids = text_ids;
        out->n_ids = (uint32_t)n;
        text_ids = NULL;
    }
    free(text_ids);
    free(lg);
    dj__trace_free(tr);
    free(feed);
    return st;
}

/* ---- generation: the worker's side of the loop in generate.h ---- */

static void gen_hist(dj__server *s, dj__job *j, dj__sess *ss);

static void gen_done(dj__server *s, dj__job *j, dj__sess *ss) {
    if (s->cfg.persist == DJ__PERSIST_ALWAYS && s->cfg.state_dir) { /* durable before its DONE goes out */
        gen_hist(s, j, ss);
        j->gen->hist_added = true;
        persist_now(s, ss);
    }
    dj__gen *g = j->gen;
    const double now = dj__now();
    const uint32_t n_gen = dj_gen_n_generated(g->g);
    dj__event *e = dj__event_new(DJ__EV_DONE, j->conn, j->type, j->req, 0);
    if (e) {
        dj__ev_done *d = &e->u.done;
        d->n_prompt = g->n_prompt;
        d->n_generated = n_gen;
        d->reason = dj_gen_finish_name(dj_gen_finished(g->g));
        d->has_stop_id = dj_gen_finished(g->g) == DJ_GEN_STOP;
        d->stop_id = d->has_stop_id ? dj_gen_pending(g->g) : 0; /* not emitted */
        d->pos = dj_session_pos(ss->es);
        d->cached = dj_gen_cached(g->g); /* prompt ids mapped from the prefix cache */
        d->queue_ms = (g->t_start - j->t_enqueue) * 1e3;
        d->prefill_ms = g->prefill_s * 1e3;
        d->ttft_ms = n_gen ? (g->t_first - j->t_enqueue) * 1e3 : 0.0;
        d->decode_ms = n_gen ? (now - g->t_first) * 1e3 : 0.0;
        size_t n = 0;
        if (dj_gen_text_rest(g->g, d->text, sizeof d->text, &n) == DJ_OK) d->text_len = n;
    }
    dj__metrics_count(&s->metrics, DJ_MSG_GENERATE, DJ_OK);
    dj__access_generate(j, ss, DJ_OK);
    dj__vllm_generate_end(s, j, ss, DJ_OK, DJ__VFIN_STOP); /* metrics_vllm.c: the finish reason decides */
    post_job(s, j, e);
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
            const double resumed = ss->resume_at;
            ss->resume_at = 0;
            if (resumed > 0) dj__metrics_observe(&s->metrics, &s->metrics.resume_s, now - resumed);
        } else {
            dj__metrics_observe(&s->metrics, &s->metrics.token_s, now - g->t_last);
        }
        g->t_last = now;
        if (ev->text_st != DJ_OK && !j->lost) { /* a token without its text: the answer ends here, an error */
            post_job(s, j, dj__event_error(j->conn, j->type, j->req, ev->text_st, dj_last_error(), false));
            j->lost = true; /* its later frames are dropped */
        }
        const bool has_text = model_tokenizer(s, ss->ment) != NULL;
        dj__event *e = dj__event_new(DJ__EV_TOKEN, j->conn, j->type, j->req, has_text ? ev->text_len : 0);
        if (e) {
            dj__ev_token *t = &e->u.token;
            t->id = ev->id;
            t->index = dj_gen_n_generated(g->g) - 1;
            t->has_text = has_text;
            t->text = (char *)(e + 1);
            if (has_text) {
                t->text_len = ev->text_len;
                if (ev->text_len) memcpy(t->text, ev->text, ev->text_len);
            }
            t->has_logprobs = ev->logprobs != NULL;
            if (ev->logprobs) t->lp = *ev->logprobs;
        }
        post_job(s, j, e);
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
    dj__req_generate *rq = &j->r.u.gen;
    const char *prompt = rq->prompt;
    const size_t plen = rq->plen;
    *deferred = false;
    dj__gen *g = dj_calloc(1, sizeof *g);
    if (!g) return dj_fail(DJ_ENOMEM, "out of memory");
    j->gen = g;
    g->max_tokens = rq->max_tokens;
    g->ids = rq->ids; /* the generation's now */
    g->n_ids = rq->n_ids;
    rq->ids = NULL;
    rq->n_ids = 0;
    if (ss->paused) return dj_fail(DJ_EBUSY, "session %016llx is paused", (unsigned long long)ss->id);
    if (ss->busy) return dj_fail(DJ_EBUSY, "session %016llx is already generating", (unsigned long long)ss->id);
    if (ss->brk) return dj_fail(DJ_EBUSY, "session %016llx has a step paused at a breakpoint", (unsigned long long)ss->id);
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
    const dj__req_generate *rq = &j->r.u.gen;
    if (!rq->cache_salt) return DJ_OK;
    request_salt(j, rq->cache_salt, rq->salt_len, want);
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
    if (!j->prompt_credit || !j->credit_ev) return;
    dj__event *e = j->credit_ev;
    j->credit_ev = NULL;
    e->credit = j->prompt_credit;
    pthread_mutex_lock(&s->out_mu);
    post_locked(s, e);
    pthread_mutex_unlock(&s->out_mu);
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
    dj__gen *g = j->gen;
    const dj__gen_sampling *sp = &j->r.u.gen.s;
    int32_t *feed = NULL;
    size_t n_feed = 0;
    dj_status st = DJ_OK;
    dj_constraint_t *con = NULL; /* structured output (grammar.h): the generation's once dj_gen_new takes it */
    if (ss->paused) {
        st = dj_fail(DJ_EBUSY, "session %016llx is paused", (unsigned long long)ss->id);
        goto done;
    }
    if ((st = gen_salt(j, ss)) != DJ_OK) goto done;
    if ((st = dj__adapter_use(s->engine, s->cfg.models, ss->es, j->r.u.gen.adapter,
                              sess_pos(ss) == 0 && ss->pending < 0 && !ss->dropped && ss->n_hist == 0)) != DJ_OK)
        goto done;
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
    if (j->r.u.gen.json_schema &&
        (st = dj_constraint_from_schema(j->r.u.gen.json_schema, j->r.u.gen.schema_len, tok, vocab, ss->ment->eos,
                                        sp->ignore_eos ? 0 : ss->ment->n_eos, &con)) != DJ_OK)
        goto done;
    if (j->r.u.gen.n_points && !g->tr &&
        (st = dj__gen_trace_parse(&j->r.u.gen, dj_model_get_config(dj_session_model(ss->es)), &g->tr)) != DJ_OK) {
        dj_constraint_free(con);
        goto done;
    }
    uint32_t n_iv = 0;
    const dj_intervention *iv = dj__trace_ivs(g->tr, &n_iv);
    const dj_gen_params gp = {.sampling = sp->sampling,
                              .max_tokens = g->max_tokens,
                              .stop_ids = sp->stop_ids,
                              .n_stop = sp->n_stop,
                              .eos_ids = ss->ment->eos,
                              .n_eos = ss->ment->n_eos,
                              .ignore_eos = sp->ignore_eos,
                              .prefill_chunk = s->cfg.prefill_chunk,
                              .tok = tok,
                              .logprobs = sp->logprobs,
                              .top_logprobs = sp->top_logprobs,
                              .logit_bias = sp->logit_bias,
                              .n_logit_bias = sp->n_logit_bias,
                              .constraint = con, /* the generation's from here */
                              .iv = iv,
                              .n_iv = n_iv};
    if ((st = dj_gen_new(s->engine, ss->es, feed, n_feed, &gp, &g->g)) != DJ_OK) goto done;
    undrop(ss);
    st = hist_add(s, ss, feed, n_feed);
    g->pos0 = pos0 + (uint32_t)n_feed;
    g->n_prompt = (uint32_t)g->n_ids;
    g->t_start = dj__now();
    dj__metrics_observe(&s->metrics, &s->metrics.queue_s, g->t_start - j->t_enqueue);
done:
    free(feed);
    return st;
}
static bool job_rides(const dj__server *s, const dj__job *j);

/* Recompute policy: the generated tokens the session was fed. */
static void gen_hist(dj__server *s, dj__job *j, dj__sess *ss) {
    const dj__gen *g = j->gen;
    (void)s;
    if (!g || !g->g || g->hist_added) return;
    const uint32_t pos = dj_session_pos(ss->es), n_ids = dj_gen_n_generated(g->g);
    uint32_t fed = pos > g->pos0 ? pos - g->pos0 : 0;
    if (fed > n_ids) fed = n_ids;
    if (fed > dj_gen_n_ids(g->g)) { /* ids it could not keep (no memory): the history is incomplete from here */
        DJ_LOG(WARN, "session=%016llx: its history lost generated tokens (out of memory)", (unsigned long long)ss->id);
        return;
    }
    if (hist_add(s, ss, dj_gen_ids(g->g), fed) != DJ_OK)
        DJ_LOG(WARN, "session=%016llx: %s", (unsigned long long)ss->id, dj_last_error());
}

/* After a GENERATE started or stepped: on an error or its end it leaves the
 * scheduler (the error replied); else the scheduler learns its next rows. */
static void gen_after(dj__server *s, dj__job *j, dj__sess *ss, dj_status st, bool foreign, bool finished) {
    if (st != DJ_OK || finished) {
        if (st != DJ_OK) reply_error(s, j, st, foreign || st == DJ_EFORMAT);
        if (ss) gen_hist(s, j, ss);
        if (ss && ss->busy == j) ss->busy = NULL;
        held_del(s, j);
        dj_sched_done(s->sched, job_id(j), dj__now_ms());
        dj__job_free(j);
        return;
    }
    ss->busy = j;
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
    for (size_t i = 0; i < n; i++) ss[i] = dj__map_get(&s->sessions, jobs[i]->sess);
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

/* Sessions a STATS reply lists at most (an admin's sees every connection's). */
#define STATS_MAX_SESSIONS 2048

/* STATS' session list: the caller's own sessions, or every one for an admin. */
static dj_status stats_sessions(dj__server *s, const dj__job *j, dj__stats_snap *out) {
    const uint64_t now = dj__now_ms();
    /* a client sees its token's own sessions; a token with the admin role, all */
    size_t n_shown = 0;
    for (size_t b = 0; b < s->sessions.n_buckets; b++)
        for (dj__ment *e = s->sessions.b[b]; e; e = e->next)
            n_shown += j->admin || ((dj__sess *)e->val)->tenant == j->tenant;
    if (n_shown > STATS_MAX_SESSIONS) n_shown = STATS_MAX_SESSIONS;
    out->sessions_total = s->sessions.n;
    if (n_shown && !(out->sessions = dj_calloc(n_shown, sizeof *out->sessions)))
        return dj_fail(DJ_ENOMEM, "out of memory");
    size_t n = 0;
    for (size_t b = 0; b < s->sessions.n_buckets; b++)
        for (dj__ment *e = s->sessions.b[b]; e && n < n_shown; e = e->next) {
            dj__sess *ss = e->val;
            if (!j->admin && ss->tenant != j->tenant) continue;
            dj__stats_sess *o = &out->sessions[n++];
            o->id = ss->id;
            o->state = dj_sched_session_state(s->sched, ss->id, now);
            o->kv_bytes = dj_session_kv_bytes(ss->es);
            o->pooled_bytes = dj_session_residency(ss->es) == DJ_KV_RESIDENT ? 0 : o->kv_bytes;
            o->swaps = ss->swaps;
            snprintf(o->model, sizeof o->model, "%s", ss->model);
            o->qos = ss->qos;
            o->pos = ss->pos;
            o->paused = ss->paused; /* lease_left_ms: the I/O side's to fill (its leases) */
            o->generating = ss->busy != NULL;
            o->break_bytes = dj__brk_bytes(ss);
        }
    out->n_sessions = n;
    return DJ_OK;
}

/* STATS: a snapshot (event.h) the I/O side packs. */
static dj_status do_stats(dj__server *s, const dj__job *j, dj__stats_snap *out) {
    dj_vmu_t *vmu = dj_engine_vmu(s->engine);
    out->admin = j->admin;
    out->page_bytes = dj_vmu_page_bytes(vmu);
    if (!j->admin) return stats_sessions(s, j, out);
    dj_vmu_get_stats(vmu, &out->vs);
    dj__brk_totals(s, &out->brk_paused, &out->brk_bytes);
    out->batched_steps = s->batched_steps;
    out->mixed_steps = s->mixed_steps;
    out->batched_rows = s->batched_rows;
    out->gen_steps = s->gen_steps;
    out->step_ms = s->gen_steps ? s->gen_step_s * 1e3 / (double)s->gen_steps : 0.0;
    out->step_engine_ms = s->gen_steps ? s->gen_engine_s * 1e3 / (double)s->gen_steps : 0.0;
    dj_engine_graph_stats(s->engine, &out->graph_captures, &out->graph_replays, &out->graph_failures);
    dj_engine_prefix_stats(s->engine, &out->prefix);
    size_t n_models = 0;
    for (dj__model_ent *m = s->models; m; m = m->next) n_models++;
    if (n_models && !(out->models = dj_calloc(n_models, sizeof *out->models)))
        return dj_fail(DJ_ENOMEM, "out of memory");
    for (dj__model_ent *m = s->models; m; m = m->next) {
        dj__stats_model *o = &out->models[out->n_models++];
        snprintf(o->name, sizeof o->name, "%s", m->name);
        o->refs = m->users + (m->pinned ? 1u : 0u);
        o->sessions = m->users;
        o->pinned = m->pinned;
        dj_model_get_placement(m->m, &o->pl);
    }
    dj_status st = stats_sessions(s, j, out);
    if (st != DJ_OK) return st;
    if ((st = dj__stats_page_map(s, out)) != DJ_OK) return st; /* view_stats.c: the live view's page map */
    const uint64_t now = dj__now_ms();
    pthread_mutex_lock(&s->mu);
    dj_sched_get_stats(s->sched, now, &out->sched);
    for (int q = 0; q < DJ_QOS_COUNT; q++) {
        out->waiting[q] = s->newq[q].n + out->sched.waiting[dj_qos_rank((dj_qos)q)];
        out->running[q] = out->sched.running[dj_qos_rank((dj_qos)q)];
    }
    dj_engine_swap_stats(s->engine, &out->swap);
    out->policy = s->cfg.swap_policy;
    pthread_mutex_unlock(&s->mu); /* handles, connections: the I/O side's to fill */
    dj_engine_disk_stats(s->engine, &out->disk); /* --state-dir's tier (disk_tier.c packs it) */
    char *map = NULL;
    size_t map_len = 0;
    FILE *f = open_memstream(&map, &map_len); /* the map names every session: admins only */
    if (f) {
        dj_vmu_print_stats(vmu, f);
        fclose(f);
        if ((out->map = dj_malloc(map_len + 1))) dj__scrub_message(map, out->map, map_len + 1);
    }
    free(map);
    return DJ_OK;
}

static dj_status do_model_list(dj__server *s, dj__rep_model_list *out) {
    DIR *d = opendir(s->cfg.models);
    if (!d) return dj_fail(DJ_EIO, "model store %s: %s", s->cfg.models, strerror(errno));
    enum { MAX_LISTED = 256 };
    if (!(out->models = dj_calloc(MAX_LISTED, sizeof *out->models))) {
        closedir(d);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    struct dirent *de;
    while ((de = readdir(d)) && out->n < MAX_LISTED) {
        if (!valid_model_name(de->d_name) || strlen(de->d_name) >= sizeof out->models->name) continue;
        char path[PATH_MAX];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s/config.json", s->cfg.models, de->d_name);
        if (stat(path, &sb) != 0) continue;
        struct dj__rep_listed *o = &out->models[out->n++];
        memcpy(o->name, de->d_name, strlen(de->d_name) + 1); /* < sizeof o->name, checked above */
        const dj__model_ent *m = model_find(s, o->name);
        o->loaded = m != NULL;
        o->refs = m ? m->users + (m->pinned ? 1u : 0u) : 0;
    }
    closedir(d);
    return DJ_OK;
}

static dj_status do_model_load(dj__server *s, dj__job *j, dj__rep_model *out, bool load) {
    const char *name = j->r.u.model;
    dj_status st;
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
        out->fingerprint = dj_model_fingerprint(e->m);
        out->params = dj_model_param_count(e->m);
        out->vocab = c->vocab_size;
        out->max_ctx = c->max_position_embeddings;
        DJ_LOG(INFO, "model=%s loaded (pinned)", name);
        return DJ_OK;
    }
    if (!e || !e->pinned || (e->pin_conn != j->conn && !j->admin))
        return dj_fail(DJ_ENOTFOUND, "model %s is not pinned by this connection%s", name,
                       e && e->pinned && !s->have_token ? " (another's pin: " DJ__ADMIN_NEEDED ")" : "");
    e->pinned = false;
    dj_model_release(s->engine, e->m); /* stays cached in the text segment until space is needed */
    out->unload = true;
    out->sessions = e->users;
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
    dj__event rep;
    memset(&rep, 0, sizeof rep);
    rep.kind = DJ__EV_REPLY;
    rep.req_type = j->type;
    rep.conn = j->conn;
    rep.req = j->req;
    bool foreign = false;
    dj_status st;
    switch (j->type) {
    case DJ_MSG_STATS: st = do_stats(s, j, &rep.u.stats); break;
    case DJ_MSG_MODEL_LIST: st = do_model_list(s, &rep.u.list); break;
    case DJ_MSG_MODEL_LOAD: st = do_model_load(s, j, &rep.u.model, true); break;
    case DJ_MSG_MODEL_UNLOAD: st = do_model_load(s, j, &rep.u.model, false); break;
    case DJ_MSG_SESSION_OPEN:
    case DJ_MSG_SESSION_IMPORT: st = do_open(s, j, &rep.u.open); break;
    case DJ_MSG_SESSION_EXPORT: st = do_export(s, j, &rep.u.exp, &foreign); break;
    case DJ_MSG_SESSION_CLOSE: st = do_close(s, j, &foreign); break;
    case DJ_MSG_STEP: st = do_step(s, j, &rep.u.step, &foreign); break;
    case DJ_MSG_GRAPH_RUN: st = dj__graph_serve(s, j->graph, j->conn, &rep.u.graph); break;
    default: st = dj_fail(DJ_EINTERNAL, "request %s reached the worker", dj_msg_type_name(j->type)); break;
    }
    if (st == DJ_OK && j->type == DJ_MSG_STEP) persist_now(s, dj__map_get(&s->sessions, j->sess));
    if (st == DJ_OK) {
        const uint64_t opened = dj__req_opens(j->type) ? rep.u.open.session : 0;
        dj__sess *ss = opened && !reply(s, j, &rep) ? dj__map_get(&s->sessions, opened) : NULL;
        if (ss) { /* its answer was lost: the I/O side will never hold it */
            dj__map_del(&s->sessions, ss->id);
            session_destroy(s, ss, DJ_ENOMEM, "its SESSION_OPEN's answer was lost");
        }
        if (!opened) reply(s, j, &rep);
    } else {
        dj__event_clear(&rep);
        reply_error(s, j, st, foreign || (st == DJ_EFORMAT && !j->model_error));
    }
    dj__job_free(j);
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
            tokens = (uint64_t)j->r.u.step.n_ids + 1; /* a pending token goes first */
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
    uint64_t graph_bytes = 0; /* GRAPH_RUN: admitted by its plan's bytes (graph_serve.h) */
    if (st == DJ_OK && j->type == DJ_MSG_GRAPH_RUN && (st = dj__graph_plan_bytes(s, j->graph, j->conn, &graph_bytes)) == DJ_OK)
        st = dj_sched_arrive_graph(s->sched, job_id(j), j->tenant, dj_qos_rank(j->qos), graph_bytes, dj__now_ms());
    else if (st == DJ_OK)
        st = dj_sched_arrive(s->sched, job_id(j), sess, dj_qos_rank(j->qos), kind, model, (uint32_t)tokens, dj__now_ms());
    if (st != DJ_OK) {
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
    while ((j = q_pop_head(&in))) {
        if (j->type >= DJ__CTL_PAUSE) control(s, j);
        else arrive(s, j);
    }
    pthread_mutex_lock(&s->mu);
}

static dj__sess *sess_get(dj__server *s, uint64_t id) { return dj__map_get(&s->sessions, id); }

/* A session's state the I/O side keeps (a swap ended: PAUSE answers whether
 * its KV is in the host pool); no memory: it learns at the next event. */
static void post_state(dj__server *s, const dj__sess *ss) {
    dj__event *e = dj__event_new(DJ__EV_STATE, ss->conn, 0, 0, 0);
    if (!e) return;
    e->session = ss->id;
    e->has_state = true;
    e->pos = ss->pos;
    e->swapped = ss->pooled_bytes > 0;
    pthread_mutex_lock(&s->out_mu);
    post_locked(s, e);
    pthread_mutex_unlock(&s->out_mu);
}

/* Swaps in flight that completed: the scheduler and the metrics learn it. */
static void poll_swaps(dj__server *s) {
    if (!s->n_xfer) return;
    dj_engine_swap_poll(s->engine);
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
            post_state(s, ss);
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
    ss->xfer = out ? 1 : 2;
    ss->xfer_t0 = dj__now();
    ss->xfer_bytes = dj_session_kv_bytes(ss->es);
    s->n_xfer++;
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
    dj__brk_drop(s->engine, ss); /* a paused step's KV rows go with the rest */
    dj_session_t *fresh = NULL;
    dj_status st = dj_session_new(s->engine, ss->ment->m, dj_session_max_ctx(ss->es), 0, &fresh);
    uint64_t salt[2];
    dj_session_cache_salt(ss->es, salt);
    if (st == DJ_OK) st = dj_session_set_cache_salt(fresh, salt); /* its history keys as before */
    if (st == DJ_OK) st = dj_session_set_lora_like(s->engine, fresh, ss->es); /* and runs with its adapter */
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
            dj__event *e = dj__event_new(DJ__EV_STATE, ss->conn, 0, 0, 0); /* the I/O side drops its lease */
            if (e) {
                e->session = ss->id;
                e->gone = true;
                pthread_mutex_lock(&s->out_mu);
                post_locked(s, e);
                pthread_mutex_unlock(&s->out_mu);
            }
            dj__map_del(&s->sessions, ss->id);
            session_destroy(s, ss, DJ_EIO, "the session's KV on disk failed its checksum and its history cannot be "
                                           "replayed: the session is closed");
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
    const size_t n_sess = s->sessions.n;
    dj_prefix_stats ps = {0}; /* its unreferenced pages are room too (a walk of them: only for the agent) */
    if (s->cfg.agent_check) dj_engine_prefix_stats(s->engine, &ps);
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.vmu = vs;
    s->metrics.sessions = n_sess;
    s->metrics.pool_bytes = sw.capacity;
    s->metrics.pool_used = sw.used;
    s->metrics.preemptions = ss.preemptions;
    memcpy(s->metrics.sess_states, ss.sessions, sizeof s->metrics.sess_states);
    s->metrics.waiting = 0;
    for (int c = 0; c < DJ_SCHED_CLASSES; c++) s->metrics.waiting += ss.waiting[c];
    s->metrics.pages_reclaimable = ps.pages_unreferenced;
    s->metrics.gen_steps = s->gen_steps;
    s->metrics.gen_step_s = s->gen_step_s;
    pthread_mutex_unlock(&s->metrics.mu);
    dj__vllm_count_queues(s); /* metrics_vllm.c: running and waiting per model */
}

static bool work_arrived(const dj__server *s) { /* mu held */
    if (s->stop_worker) return true;
    for (int q = 0; q < DJ_QOS_COUNT; q++)
        if (s->newq[q].n) return true;
    return false;
}

/* --state-dir: the sessions the last djinnd wrote at its stop come back,
 * orphaned, under their ids and secrets, for their clients to reattach
 * (their leases start now); their files go once they are back. A file that
 * cannot be restored (another model, damaged) is logged and left. */
static void restore_sessions(dj__server *s) {
    char dir[4096];
    DIR *d = NULL;
    if (!s->cfg.state_dir || dj__persist_dir(s->cfg.state_dir, dir, sizeof dir) != DJ_OK || !(d = opendir(dir)))
        return;
    unsigned restored = 0, refused = 0;
    for (struct dirent *de; (de = readdir(d));) {
        const size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 4, ".djs") != 0) continue;
        dj__job *j = NULL;
        dj__event rep;
        memset(&rep, 0, sizeof rep);
        rep.kind = DJ__EV_REPLY;
        rep.req_type = DJ_MSG_SESSION_IMPORT;
        dj_status st = dj__persist_job(dir, de->d_name, &j);
        if (st == DJ_OK) st = do_open(s, j, &rep.u.open);
        dj__event *e = st == DJ_OK ? dj_malloc(sizeof *e) : NULL;
        if (st == DJ_OK && !e) {
            dj__sess *ss = dj__map_del(&s->sessions, rep.u.open.session);
            if (ss) session_destroy(s, ss, DJ_ENOMEM, "out of memory");
            dj__event_clear(&rep);
            st = dj_fail(DJ_ENOMEM, "out of memory");
        }
        if (st != DJ_OK) {
            DJ_LOG(ERROR, "%s/%s: session not restored (the file is left): %s", dir, de->d_name, dj_last_error());
            refused++;
            dj__job_free(j);
            continue;
        }
        *e = rep;
        e->session = rep.u.open.session;
        pthread_mutex_lock(&s->out_mu);
        post_locked(s, e);
        pthread_mutex_unlock(&s->out_mu);
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        /* --persist always keeps it (rewritten as the session changes); on-stop's next image is the stop's */
        if (s->cfg.persist != DJ__PERSIST_ALWAYS && unlink(path) != 0) DJ_LOG(WARN, "%s: %s", path, strerror(errno));
        restored++;
        dj__job_free(j);
    }
    closedir(d);
    if (restored || refused)
        DJ_LOG(WARN, "djinnd: %u sessions restored from %s (%u refused)", restored, dir, refused);
}

/* --state-dir, at the stop: every session written to it (a running
 * generation is cut as its connection's close would: what it fed stays). */
static void save_sessions(dj__server *s) {
    char dir[4096];
    if (dj__persist_dir(s->cfg.state_dir, dir, sizeof dir) != DJ_OK) {
        DJ_LOG(ERROR, "djinnd: sessions not saved: %s", dj_last_error());
        return;
    }
    unsigned saved = 0, failed = 0;
    for (size_t b = 0; b < s->sessions.n_buckets; b++)
        for (dj__ment *e = s->sessions.b[b]; e; e = e->next) {
            dj__sess *ss = e->val;
            if (ss->busy) cancel_orphaned(s, ss);
            dj__brk_drop(s->engine, ss); /* a step paused at a breakpoint is cancelled: the KV as before it */
            if (dj__persist_save(s->engine, ss, dir) == DJ_OK) {
                saved++;
                continue;
            }
            failed++;
            DJ_LOG(ERROR, "session=%016llx: not saved: %s", (unsigned long long)ss->id, dj_last_error());
        }
    DJ_LOG(WARN, "djinnd: %u sessions saved to %s (%u failed)", saved, dir, failed);
}

/* Every model entry goes (the daemon stops, or never started). */
static void drop_models(dj__server *s) {
    while (s->models) {
        dj__model_ent *m = s->models;
        if (m->pinned) dj_model_release(s->engine, m->m);
        m->pinned = false;
        m->users = 0;
        m->tok_jobs = 0; /* the tokenizer thread was stopped first (dj__worker_stop) */
        model_ent_maybe_drop(s, m);
    }
}

static void *worker_main(void *arg) {
    dj__server *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop_worker) {
        intake(s);
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
         * transfer's likely end (polled every ms), or 50 ms */
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
    pthread_mutex_unlock(&s->mu);
    if (s->cfg.state_dir && s->cfg.persist != DJ__PERSIST_OFF) save_sessions(s);
    for (size_t b = 0; b < s->sessions.n_buckets; b++) {
        dj__ment *e = s->sessions.b[b];
        while (e) {
            dj__sess *ss = e->val;
            e = e->next;
            dj__map_del(&s->sessions, ss->id);
            session_destroy(s, ss, DJ_ENOTFOUND, "djinnd is stopping");
        }
    }
    pthread_mutex_lock(&s->mu);
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
    drop_models(s);
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
    dj_sched_config sc = {
        .max_running = s->cfg.max_running,
        .max_rows = MIXED_ROWS,
        .pages_total = (uint32_t)vs.pages_total,
        .pool_pages = sw.capacity / page,
        /* until a swap measures it: ~20 GB/s pinned PCIe, ~5 GB/s memcpy */
        .page_in_ms = (double)page / (cpu ? 5e9 : 20e9) * 1e3,
        .policy = s->cfg.swap_policy,
        .disk_pages = disk_pages,
        .disk_page_ms = disk_page_ms,
        .graph_bytes = s->cfg.graph_bytes,
        .graph_quota_bytes = s->cfg.graph_quota_bytes,
    };
    DJ_LOG(INFO, "VMU: text %zu MiB, data %zu MiB (%zu pages of %zu KiB), stack %zu MiB; swap pool %zu MiB; "
           "policy %s", vs.text.capacity >> 20, vs.data.capacity >> 20, vs.pages_total, page >> 10,
           vs.stack.capacity >> 20, sw.capacity >> 20, dj_swap_policy_name(s->cfg.swap_policy));
    sched_limits(s, &sc); /* idle, max wait, quotas: SIGHUP changes them */
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

/* --preload: each named model loaded and pinned before the worker serves
 * (its pin belongs to no connection: an admin's MODEL_UNLOAD lifts it). */
static dj_status preload(dj__server *s) {
    char name[128];
    dj_status st = s->cfg.preload ? dj__preload_check(s->cfg.models, s->cfg.preload) : DJ_OK;
    if (st != DJ_OK) return st; /* every name is checked before any load */
    for (const char *p = s->cfg.preload; p && dj__preload_next(&p, name, sizeof name, &st);) {
        dj__model_ent *e = NULL;
        dj_model_t *m = NULL;
        if ((st = model_ref(s, name, &e, &m)) != DJ_OK)
            return dj_fail(st, "--preload %s: %s", name, dj_last_error());
        e->pinned = true;
        e->pin_conn = 0;
        dj__log_always(DJ_LOG_INFO, __func__, "model %s: preloaded (pinned)", name);
    }
    return st;
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
    if (st == DJ_OK) st = preload(s); /* before serving */
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
    if (st == DJ_OK) restore_sessions(s); /* before the worker thread: the sessions map is still this thread's */
    if (st == DJ_OK && pthread_create(&s->worker, NULL, worker_main, s) != 0)
        st = dj_fail(DJ_EINTERNAL, "cannot start the engine thread");
    if (st != DJ_OK) {
        tokenizer_stop(s);
        drop_models(s); /* what --preload pinned */
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
