/* sched.c: the scheduling policy (sched.h) - requests and sessions in hash
 * tables and intrusive lists, decisions recomputed from them on every call. */
#include "sched/sched.h"
#include "djinn/alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a u64 -> pointer table (chained, grown at load 1) ---- */

typedef struct ment {
    uint64_t key;
    void *val;
    struct ment *next;
} ment;
typedef struct umap {
    ment **b;
    size_t nb, n;
} umap;

static size_t slot(const umap *m, uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)(k & (m->nb - 1));
}

static void *map_get(const umap *m, uint64_t k) {
    if (!m->nb) return NULL;
    for (ment *e = m->b[slot(m, k)]; e; e = e->next)
        if (e->key == k) return e->val;
    return NULL;
}

static dj_status map_put(umap *m, uint64_t k, void *v) {
    if (m->n >= m->nb) {
        const size_t nb = m->nb ? m->nb * 2 : 64;
        ment **b = dj_calloc(nb, sizeof *b);
        if (!b) return dj_fail(DJ_ENOMEM, "scheduler: out of memory");
        umap g = {b, nb, m->n};
        for (size_t i = 0; i < m->nb; i++)
            for (ment *e = m->b[i], *nx; e; e = nx) {
                nx = e->next;
                const size_t j = slot(&g, e->key);
                e->next = b[j];
                b[j] = e;
            }
        free(m->b);
        *m = g;
    }
    ment *e = dj_malloc(sizeof *e);
    if (!e) return dj_fail(DJ_ENOMEM, "scheduler: out of memory");
    e->key = k;
    e->val = v;
    const size_t j = slot(m, k);
    e->next = m->b[j];
    m->b[j] = e;
    m->n++;
    return DJ_OK;
}

static void map_del(umap *m, uint64_t k) {
    if (!m->nb) return;
    for (ment **p = &m->b[slot(m, k)]; *p; p = &(*p)->next)
        if ((*p)->key == k) {
            ment *e = *p;
            *p = e->next;
            free(e);
            m->n--;
            return;
        }
}

static void map_destroy(umap *m) {
    for (size_t i = 0; i < m->nb; i++)
        for (ment *e = m->b[i], *nx; e; e = nx) {
            nx = e->next;
            free(e);
        }
    free(m->b);
    memset(m, 0, sizeof *m);
}

/* ---- objects ---- */

typedef enum { RES_RESIDENT, RES_SWAPPING, RES_SWAPPED, RES_RESTORING, RES_DROPPED } residency;
typedef enum { R_WAITING, R_ADMITTED, R_GEN } rstate; /* R_ADMITTED: to run; R_GEN: a started generation */

typedef struct sreq sreq;
typedef struct list {
    sreq *head, *tail;
    uint32_t n;
} list;

struct sreq {
    uint64_t id, sess, model;
    uint64_t group, bytes;            /* DJ_REQ_GRAPH: its group and planned bytes */
    uint32_t qos, tokens, need, rows; /* need: pages, set at admission */
    dj_sched_kind kind;
    rstate st;
    bool rides, preempted;
    uint64_t t_arrive;
    list *on;
    sreq *prev, *next;
};

typedef struct ssess {
    uint64_t id, conn;
    uint32_t qos, pos, block_tokens, block_pages, max_ctx;
    bool admitted;    /* a STEP/GEN of it is admitted or running */
    uint32_t held;    /* pages in the data segment */
    uint32_t pooled;  /* pages in the pool (swapping, swapped, restoring) */
    uint32_t reserve; /* most pages an admitted request of it needs */
    residency res;
    bool paused, prefetched, swap_pending; /* swap_pending: decided, not yet reported started */
    bool want_back;   /* resumed while out: brought back when it fits */
    bool on_disk;     /* SWAPPED (or RESTORING) from the disk tier: `pooled` counts against disk_used */
    bool no_spill;    /* a spill of it failed: not picked again */
    uint64_t pause_at, expect_ms;
    uint64_t last_ms; /* last request arrival or end */
    uint32_t n_req;   /* its requests the scheduler holds (waiting, admitted or running) */
    struct ssess *prev, *next;
} ssess;

struct dj_sched {
    dj_sched_config cfg;
    umap reqs, sessions;
    list waiting[DJ_SCHED_CLASSES];
    list admitted; /* decided to run, not yet run (session maybe being restored) */
    list gens;     /* started generations, round-robin order */
    list graphs;   /* captured-graph runs decided (RUN), not yet done: their bytes are held */
    uint64_t graph_used; /* planned bytes of the graph runs admitted or running */
    ssess *all;    /* every session */
    uint32_t held, n_running;
    uint64_t pool_used;
    uint64_t disk_used;
    bool turn, burst;
    sreq *refuse;
    char reason[256];
    dj_sched_stats counts; /* only the counters are used */
};

static const char *policy_names[] = {"semantic", "reactive", "recompute"};
const char *dj_swap_policy_name(dj_swap_policy p) { return (unsigned)p < 3 ? policy_names[p] : "?"; }
dj_status dj_swap_policy_parse(const char *s, dj_swap_policy *p) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, policy_names[i])) {
            *p = (dj_swap_policy)i;
            return DJ_OK;
        }
    return dj_fail(DJ_EINVAL, "swap policy '%s': use semantic, reactive or recompute", s);
}

static const char *state_names[] = {"running", "idle", "paused", "swapping", "swapped", "restoring", "dropped"};
const char *dj_sched_state_name(dj_sched_state s) { return (unsigned)s <= DJ_SESS_DROPPED ? state_names[s] : "?"; }

static void l_push(list *l, sreq *r) {
    r->on = l;
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail) l->tail->next = r;
    else l->head = r;
    l->tail = r;
    l->n++;
}

static void l_del(sreq *r) {
    list *l = r->on;
    if (!l) return;
    if (r->prev) r->prev->next = r->next;
    else l->head = r->next;
    if (r->next) r->next->prev = r->prev;
    else l->tail = r->prev;
    l->n--;
    r->on = NULL;
    r->prev = r->next = NULL;
}

dj_status dj_sched_new(const dj_sched_config *cfg, dj_sched_t **out) {
    *out = NULL;
    if (!cfg->max_running || !cfg->max_rows || !cfg->pages_total)
        return dj_fail(DJ_EINVAL, "scheduler: max_running %u, max_rows %u and pages_total %u must be >= 1",
                       cfg->max_running, cfg->max_rows, cfg->pages_total);
    if ((unsigned)cfg->policy > DJ_SWAP_RECOMPUTE) return dj_fail(DJ_EINVAL, "scheduler: unknown swap policy");
    dj_sched_t *s = dj_calloc(1, sizeof *s);
    if (!s) return dj_fail(DJ_ENOMEM, "scheduler: out of memory");
    s->cfg = *cfg;
    if (s->cfg.page_in_ms <= 0) s->cfg.page_in_ms = 0.01;
    if (s->cfg.disk_page_ms <= 0) s->cfg.disk_page_ms = 4 * s->cfg.page_in_ms;
    *out = s;
    return DJ_OK;
}

static void req_forget(dj_sched_t *s, sreq *r) {
    l_del(r);
    map_del(&s->reqs, r->id);
    free(r);
}

void dj_sched_free(dj_sched_t *s) {
    if (!s) return;
    for (size_t i = 0; i < s->reqs.nb; i++)
        for (ment *e = s->reqs.b[i]; e; e = e->next) free(e->val);
    for (ssess *x = s->all, *nx; x; x = nx) {
        nx = x->next;
        free(x);
    }
    map_destroy(&s->reqs);
    map_destroy(&s->sessions);
    free(s);
}

const dj_sched_config *dj_sched_get_config(const dj_sched_t *s) { return &s->cfg; }

/* ---- accounting ---- */

/* Pages the session counts against the data segment: what it holds, or
 * what its admitted requests will need, whichever is more. */
static uint32_t eff(const ssess *x) {
    if (x->res == RES_SWAPPED || x->res == RES_DROPPED) return 0;
    return x->held > x->reserve ? x->held : x->reserve;
}

/* Pages of sessions whose copies to the pool are in flight: free soon. */
static uint64_t outgoing_pages(const dj_sched_t *s, uint64_t conn, bool by_conn) {
    uint64_t u = 0;
    for (const ssess *x = s->all; x; x = x->next)
        if (x->res == RES_SWAPPING && (!by_conn || x->conn == conn)) u += x->held;
    return u;
}

static uint64_t used_pages(const dj_sched_t *s, uint64_t conn, bool by_conn) {
    uint64_t u = 0;
    for (const ssess *x = s->all; x; x = x->next)
        if (!by_conn || x->conn == conn) u += eff(x);
    return u;
}

/* Pool pages a group's sessions hold (swapping, swapped or restoring). */
static uint64_t pooled_pages(const dj_sched_t *s, uint64_t conn) {
    uint64_t u = 0;
    for (const ssess *x = s->all; x; x = x->next)
        if (x->conn == conn) u += x->pooled;
    return u;
}

static void set_reserve(dj_sched_t *s, ssess *x) {
    uint32_t r = 0;
    list *ls[2] = {&s->admitted, &s->gens};
    for (int i = 0; i < 2; i++)
        for (sreq *q = ls[i]->head; q; q = q->next)
            if (q->sess == x->id && q->need > r) r = q->need;
    x->reserve = r;
}

static void set_held(dj_sched_t *s, ssess *x, uint32_t held) {
    s->held = s->held - x->held + held;
    x->held = held;
}

static void set_pooled(dj_sched_t *s, ssess *x, uint32_t pooled) {
    uint64_t *used = x->on_disk ? &s->disk_used : &s->pool_used;
    *used = *used - x->pooled + pooled;
    x->pooled = pooled;
    if (!pooled) x->on_disk = false;
}

/* ---- events ---- */

dj_status dj_sched_session_open(dj_sched_t *s, uint64_t sess, const dj_sched_session_info *info, uint64_t now) {
    if (!sess || map_get(&s->sessions, sess)) return dj_fail(DJ_EBUSY, "scheduler: session %016llx is known",
                                                             (unsigned long long)sess);
    if (!info->block_tokens || !info->block_pages || !info->max_ctx)
        return dj_fail(DJ_EINVAL, "scheduler: session with block_tokens %u, block_pages %u, max_ctx %u",
                       info->block_tokens, info->block_pages, info->max_ctx);
    ssess *x = dj_calloc(1, sizeof *x);
    if (!x) return dj_fail(DJ_ENOMEM, "scheduler: out of memory");
    x->id = sess;
    x->conn = info->conn;
    x->qos = info->qos < DJ_SCHED_CLASSES ? info->qos : DJ_SCHED_CLASSES - 1;
    x->block_tokens = info->block_tokens;
    x->block_pages = info->block_pages;
    x->max_ctx = info->max_ctx;
    x->last_ms = now;
    dj_status st = map_put(&s->sessions, sess, x);
    if (st != DJ_OK) {
        free(x);
        return st;
    }
    x->next = s->all;
    if (s->all) s->all->prev = x;
    s->all = x;
    return DJ_OK;
}

static void drop_reqs_of(dj_sched_t *s, uint64_t sess) {
    list *ls[DJ_SCHED_CLASSES + 2] = {&s->waiting[0], &s->waiting[1], &s->waiting[2], &s->admitted, &s->gens};
    for (int i = 0; i < DJ_SCHED_CLASSES + 2; i++)
        for (sreq *r = ls[i]->head, *nx; r; r = nx) {
            nx = r->next;
            if (r->sess != sess) continue;
            if (r->st == R_GEN && !r->preempted) s->n_running--;
            if (r->st == R_ADMITTED && r->kind == DJ_REQ_GEN) s->n_running--;
            if (s->refuse == r) s->refuse = NULL;
            req_forget(s, r);
        }
}

void dj_sched_session_close(dj_sched_t *s, uint64_t sess) {
    ssess *x = map_get(&s->sessions, sess);
    if (!x) return;
    drop_reqs_of(s, sess);
    set_held(s, x, 0);
    set_pooled(s, x, 0);
    if (x->prev) x->prev->next = x->next;
    else s->all = x->next;
    if (x->next) x->next->prev = x->prev;
    map_del(&s->sessions, sess);
    free(x);
}

void dj_sched_pages(dj_sched_t *s, uint64_t sess, uint32_t held, uint32_t pos) {
    ssess *x = map_get(&s->sessions, sess);
    if (!x) return;
    set_held(s, x, held);
    x->pos = pos;
    if (x->res == RES_DROPPED && held) x->res = RES_RESIDENT; /* re-fed */
}

dj_status dj_sched_arrive(dj_sched_t *s, uint64_t req, uint64_t sess, uint32_t qos, dj_sched_kind kind,
                          uint64_t model, uint32_t tokens, uint64_t now) {
    if (!req || map_get(&s->reqs, req))
        return dj_fail(DJ_EBUSY, "scheduler: request %016llx is known", (unsigned long long)req);
    ssess *x = sess ? map_get(&s->sessions, sess) : NULL;
    if (kind != DJ_REQ_CTRL && !x)
        return dj_fail(DJ_ENOTFOUND, "scheduler: no session %016llx", (unsigned long long)sess);
    sreq *r = dj_calloc(1, sizeof *r);
    if (!r) return dj_fail(DJ_ENOMEM, "scheduler: out of memory");
    r->id = req;
    r->sess = x ? sess : 0;
    r->qos = qos < DJ_SCHED_CLASSES ? qos : DJ_SCHED_CLASSES - 1;
    r->kind = kind;
    r->model = model;
    r->tokens = kind == DJ_REQ_CTRL ? 0 : tokens;
    r->t_arrive = now;
    dj_status st = map_put(&s->reqs, req, r);
    if (st != DJ_OK) {
        free(r);
        return st;
    }
    l_push(&s->waiting[r->qos], r);
    if (x) {
        x->n_req++;
        x->last_ms = now;
    }
    return DJ_OK;
}

dj_status dj_sched_arrive_graph(dj_sched_t *s, uint64_t req, uint64_t group, uint32_t qos, uint64_t bytes, uint64_t now) {
    const dj_status st = dj_sched_arrive(s, req, 0, qos, DJ_REQ_CTRL, 0, 0, now);
    if (st != DJ_OK) return st;
    sreq *r = map_get(&s->reqs, req);
    r->kind = DJ_REQ_GRAPH;
    r->group = group;
    r->bytes = bytes;
    return DJ_OK;
}

/* Planned bytes of group's graph runs admitted or running (group 0: all of them). */
static uint64_t graph_bytes_of(const dj_sched_t *s, uint64_t group) {
    uint64_t n = 0;
    for (const sreq *r = s->admitted.head; r; r = r->next)
        if (r->kind == DJ_REQ_GRAPH && (!group || r->group == group)) n += r->bytes;
    for (const sreq *r = s->graphs.head; r; r = r->next)
        if (!group || r->group == group) n += r->bytes;
    return n;
}

void dj_sched_done(dj_sched_t *s, uint64_t req, uint64_t now) {
    sreq *r = map_get(&s->reqs, req);
    if (!r) return;
    if (r->kind == DJ_REQ_GRAPH && r->st != R_WAITING) s->graph_used -= r->bytes;
    if ((r->st == R_GEN && !r->preempted) || (r->st == R_ADMITTED && r->kind == DJ_REQ_GEN)) s->n_running--;
    if (s->refuse == r) s->refuse = NULL;
    ssess *x = r->sess ? map_get(&s->sessions, r->sess) : NULL;
    const bool admitted = r->st != R_WAITING && r->kind != DJ_REQ_CTRL;
    req_forget(s, r);
    if (x) {
        x->n_req--;
        x->last_ms = now;
        if (admitted) x->admitted = false;
        set_reserve(s, x);
    }
}

void dj_sched_gen_rows(dj_sched_t *s, uint64_t req, uint32_t rows, bool rides) {
    sreq *r = map_get(&s->reqs, req);
    if (!r || r->kind != DJ_REQ_GEN) return;
    if (r->st == R_ADMITTED) { /* just started */
        l_del(r);
        r->st = R_GEN;
        l_push(&s->gens, r);
        s->burst = rides;
    }
    r->rows = rows;
    r->rides = rides;
}

void dj_sched_pause(dj_sched_t *s, uint64_t sess, uint64_t expected_ms, uint64_t now) {
    ssess *x = map_get(&s->sessions, sess);
    if (!x) return;
    x->paused = true;
    x->prefetched = false;
    x->pause_at = now;
    x->expect_ms = expected_ms;
    x->last_ms = now;
}

void dj_sched_resume(dj_sched_t *s, uint64_t sess, uint64_t now) {
    ssess *x = map_get(&s->sessions, sess);
    if (!x) return;
    x->paused = false;
    x->prefetched = false;
    x->want_back = x->res == RES_SWAPPED;
    x->last_ms = now;
}

void dj_sched_swap_started(dj_sched_t *s, uint64_t sess, bool ok) {
    ssess *x = map_get(&s->sessions, sess);
    if (!x || !x->swap_pending) return;
    x->swap_pending = false;
    if (ok) return;
    /* undo the optimistic state */
    if (x->res == RES_SWAPPING) {
        x->res = RES_RESIDENT;
        set_pooled(s, x, 0);
    } else if (x->res == RES_RESTORING) {
        x->res = RES_SWAPPED;
        set_held(s, x, 0);
        /* requests admitted for it wait again */
        for (sreq *r = s->admitted.head, *nx; r; r = nx) {
            nx = r->next;
            if (r->sess != sess) continue;
            l_del(r);
            if (r->kind == DJ_REQ_GEN) s->n_running--;
            r->st = R_WAITING;
            r->need = 0;
            l_push(&s->waiting[r->qos], r);
            x->admitted = false;
        }
        set_reserve(s, x);
    }
}

void dj_sched_swapped(dj_sched_t *s, uint64_t sess, uint32_t held) {
    ssess *x = map_get(&s->sessions, sess);
    if (!x) return;
    if (x->res == RES_SWAPPING) {
        x->res = RES_SWAPPED;
        set_held(s, x, 0);
        s->counts.swaps_out++;
    } else if (x->res == RES_RESTORING) {
        x->res = RES_RESIDENT;
        set_held(s, x, held);
        set_pooled(s, x, 0);
        s->counts.swaps_in++;
    }
}

void dj_sched_rate(dj_sched_t *s, double page_in_ms) {
    if (page_in_ms > 0) s->cfg.page_in_ms = page_in_ms;
}

void dj_sched_disk_rate(dj_sched_t *s, double page_ms) {
    if (page_ms > 0) s->cfg.disk_page_ms = page_ms;
}

void dj_sched_spilled(dj_sched_t *s, uint64_t sess, bool ok) {
    ssess *x = map_get(&s->sessions, sess);
    if (!x || !x->swap_pending) return;
    x->swap_pending = false;
    if (!ok) {
        x->no_spill = true;
        return;
    }
    if (x->res != RES_SWAPPED || x->on_disk) return;
    s->pool_used -= x->pooled;
    s->disk_used += x->pooled;
    x->on_disk = true;
    s->counts.spills++;
}

void dj_sched_kv_lost(dj_sched_t *s, uint64_t sess) {
    ssess *x = map_get(&s->sessions, sess);
    if (!x) return;
    set_held(s, x, 0);
    set_pooled(s, x, 0);
    x->res = RES_DROPPED;
    x->swap_pending = false;
    x->want_back = false;
    s->counts.recoveries++;
}

/* ---- decisions ---- */

static bool idle(const dj_sched_t *s, const ssess *x, uint64_t now) {
    return !x->n_req && now >= x->last_ms + s->cfg.idle_ms;
}

/* When a paused, swapped session should start coming back. */
static uint64_t prefetch_at(const dj_sched_t *s, const ssess *x) {
    const double per_page = x->on_disk ? s->cfg.disk_page_ms : s->cfg.page_in_ms;
    const uint64_t lead = (uint64_t)(x->pooled * per_page * 1.5) + 1;
    const uint64_t end = x->pause_at + x->expect_ms;
    return end > lead ? end - lead : 0;
}

/* How willing we are to move a resident session out: 0 not at all; 2 paused
 * (not brought back ahead of its resume) or idle; 1 its requests all wait
 * (for memory, like the one being admitted: it comes back with them). */
static int victim_rank(const dj_sched_t *s, const ssess *x, const ssess *self, uint64_t now) {
    if (x == self || x->res != RES_RESIDENT || x->swap_pending || x->admitted || !x->held) return 0;
    if (x->n_req) return 1;
    if (x->paused) return !x->prefetched || now > x->pause_at + 2 * x->expect_ms + s->cfg.idle_ms ? 2 : 0;
    return idle(s, x, now) ? 2 : 0;
}

/* When a session is expected to be wanted again: a paused one at the end of
 * its expected wait; one with no expectation, never (UINT64_MAX). */
static uint64_t next_use(const ssess *x) {
    return x->paused && x->expect_ms ? x->pause_at + x->expect_ms : UINT64_MAX;
}

/* A swapped session in the pool that may go on to disk. */
static bool spillable(const dj_sched_t *s, const ssess *x) {
    return x->res == RES_SWAPPED && !x->on_disk && !x->swap_pending && !x->no_spill && x->pooled &&
           s->disk_used + x->pooled <= s->cfg.disk_pages;
}

/* Whether n pages can go out to the pool: into its free slots, or (disk
 * tier) into slots that spilling pooled sessions to disk frees. */
static bool out_room(const dj_sched_t *s, uint64_t n) {
    if (s->pool_used + n <= s->cfg.pool_pages) return true;
    if (!s->cfg.disk_pages || n > s->cfg.pool_pages) return false;
    const uint64_t need = s->pool_used + n - s->cfg.pool_pages;
    uint64_t can = 0;
    for (const ssess *x = s->all; x && can < need; x = x->next)
        if (spillable(s, x)) can += x->pooled;
    return can >= need && s->disk_used + need <= s->cfg.disk_pages;
}

/* The pooled session to spill: the one wanted furthest ahead (nothing
 * waiting for it first; then the latest expected end; ties: the lowest
 * class, then the least recently used). */
static ssess *pick_spill(const dj_sched_t *s) {
    ssess *best = NULL;
    for (ssess *x = s->all; x; x = x->next) {
        if (!spillable(s, x)) continue;
        bool better = !best;
        if (!better) {
            const bool xw = x->n_req || x->want_back, bw = best->n_req || best->want_back;
            if (xw != bw) better = bw;
            else if (next_use(x) != next_use(best)) better = next_use(x) > next_use(best);
            else if (x->qos != best->qos) better = x->qos > best->qos;
            else better = x->last_ms < best->last_ms;
        }
        if (better) best = x;
    }
    return best;
}

/* The session to move out: of the paused and idle ones, the one wanted
 * furthest ahead (no expectation first, then the latest expected end; ties:
 * least recently used), then those whose requests wait (lowest class, least
 * recently used). `before`: only sessions wanted after it (a prefetch makes
 * room only from those). */
static ssess *pick_victim(const dj_sched_t *s, uint64_t now, const ssess *self, bool by_conn, uint64_t before) {
    ssess *best = NULL;
    int best_rank = 0;
    for (ssess *x = s->all; x; x = x->next) {
        if (by_conn && x->conn != self->conn) continue;
        const int rank = victim_rank(s, x, self, now);
        if (!rank || (before && (rank != 2 || next_use(x) <= before))) continue;
        if (s->cfg.policy == DJ_SWAP_SEMANTIC && !out_room(s, x->held)) continue;
        /* a group at its share of the pool sends no more there: it waits on itself, not on others */
        if (s->cfg.policy == DJ_SWAP_SEMANTIC && s->cfg.pool_quota_pages &&
            pooled_pages(s, x->conn) + x->held > s->cfg.pool_quota_pages)
            continue;
        bool better = !best || rank > best_rank;
        if (!better && rank == best_rank) {
            if (rank == 2 && next_use(x) != next_use(best)) better = next_use(x) > next_use(best);
            else if (x->qos != best->qos) better = x->qos > best->qos;
            else better = x->last_ms < best->last_ms;
        }
        if (better) {
            best = x;
            best_rank = rank;
        }
    }
    return best;
}

static void swap_out(dj_sched_t *s, ssess *v, dj_sched_decision *d) {
    v->res = RES_SWAPPING;
    v->swap_pending = true;
    set_pooled(s, v, v->held);
    d->op = DJ_SCHED_SWAP_OUT;
    d->sess = v->id;
}

/* v out to the pool, or first (the pool full) a pooled session on to disk
 * to make room: false if neither can be done now. */
static bool swap_out_or_spill(dj_sched_t *s, ssess *v, dj_sched_decision *d) {
    if (s->pool_used + v->held <= s->cfg.pool_pages) {
        swap_out(s, v, d);
        return true;
    }
    ssess *c = s->cfg.disk_pages ? pick_spill(s) : NULL;
    if (!c) return false;
    c->swap_pending = true;
    d->op = DJ_SCHED_SPILL;
    d->sess = c->id;
    return true;
}

/* Pages admitting r would add, and whether they fit (segment and quota). */
static bool fits(const dj_sched_t *s, const sreq *r, const ssess *x, uint64_t *extra) {
    const uint32_t before = eff(x);
    uint32_t after;
    if (x->res == RES_SWAPPED || x->res == RES_DROPPED) {
        const uint32_t back = x->res == RES_SWAPPED ? x->pooled : 0;
        after = r->need > back ? r->need : back;
        if (x->reserve > after) after = x->reserve;
    } else {
        after = before > r->need ? before : r->need;
    }
    *extra = after - before;
    if (used_pages(s, 0, false) + *extra > s->cfg.pages_total) return false;
    if (s->cfg.quota_pages && used_pages(s, x->conn, true) + *extra > s->cfg.quota_pages) return false;
    return true;
}

static sreq *lowest_running_gen(const dj_sched_t *s) {
    sreq *lo = NULL;
    for (sreq *r = s->gens.head; r; r = r->next)
        if (!r->preempted && (!lo || r->qos > lo->qos)) lo = r;
    return lo;
}

static void admit(dj_sched_t *s, sreq *r, ssess *x) {
    l_del(r);
    r->st = R_ADMITTED;
    l_push(&s->admitted, r);
    if (r->kind == DJ_REQ_GEN) s->n_running++;
    if (x) {
        x->admitted = true;
        set_reserve(s, x);
    }
}

/* Pages a session holds at `pos` positions. */
static uint32_t pages_at(const ssess *x, uint64_t pos) {
    if (pos > x->max_ctx) pos = x->max_ctx;
    const uint64_t p = (pos + x->block_tokens - 1) / x->block_tokens * x->block_pages;
    return p > UINT32_MAX ? UINT32_MAX : (uint32_t)p;
}

static void restore(dj_sched_t *s, ssess *x, dj_sched_decision *d) {
    x->res = RES_RESTORING;
    x->want_back = false;
    x->swap_pending = true;
    set_held(s, x, x->pooled);
    d->op = DJ_SCHED_SWAP_IN;
    d->sess = x->id;
}

/* Admit what can be admitted. Returns true with *d set when a decision came
 * out of it (a swap-in for an admitted request, a refusal, a swap-out or drop
 * to make room). *blocked: a memory request waits. */
static bool admissions(dj_sched_t *s, uint64_t now, dj_sched_decision *d) {
    bool mem_blocked = false; /* a higher class waits for memory: lower classes take none */
    bool graph_blocked = false; /* a graph run waits for graph_bytes: the graph runs behind it wait too */
    for (uint32_t q = 0; q < DJ_SCHED_CLASSES; q++) {
        list *w = &s->waiting[q];
        /* preempted generations of this class come back first */
        for (sreq *g = s->gens.head; g && s->n_running < s->cfg.max_running; g = g->next)
            if (g->preempted && g->qos == q) {
                g->preempted = false;
                s->n_running++;
            }
        const bool young = w->head && now < w->head->t_arrive + s->cfg.lifo_age_ms;
        const bool lifo = q == DJ_SCHED_CLASSES - 1 && w->n > 2 * (uint64_t)s->cfg.max_running && young;
        bool mem_stop = mem_blocked;
        /* Sessions that already hold KV (here or in the pool: an agent back
         * from a tool) go before new ones, unless the oldest request waited
         * lifo_age_ms: their pages are spoken for anyway, and finishing them
         * is what frees memory. Two passes: those, then the rest. */
        for (int pass = young ? 0 : 1; pass < 2; pass++)
        for (sreq *r = lifo ? w->tail : w->head, *nx; r; r = nx) {
            nx = lifo ? r->prev : r->next;
            ssess *x = r->sess ? map_get(&s->sessions, r->sess) : NULL;
            if (young && (pass == 0) != (x && r->kind != DJ_REQ_CTRL && x->pos > 0)) continue;
            if (r->kind == DJ_REQ_GRAPH) {
                const uint64_t lim = s->cfg.graph_bytes, quota = s->cfg.graph_quota_bytes;
                if ((lim && r->bytes > lim) || (quota && r->bytes > quota)) {
                    const bool by_quota = quota && r->bytes > quota && (!lim || quota < lim);
                    snprintf(s->reason, sizeof s->reason,
                             "the captured graph's plan needs %llu bytes (stack and outputs), more than %s (%llu bytes)",
                             (unsigned long long)r->bytes,
                             by_quota ? "one token's captured runs may hold (--graph-quota-gb)"
                                      : "captured runs may hold at once (--graph-gb)",
                             (unsigned long long)(by_quota ? quota : lim));
                    s->counts.refused++;
                    d->op = DJ_SCHED_REFUSE;
                    d->req = r->id;
                    d->sess = 0;
                    return true;
                }
                if (graph_blocked) continue;
                if (lim && s->graph_used + r->bytes > lim) {
                    graph_blocked = true;
                    continue;
                }
                if (quota && graph_bytes_of(s, r->group) + r->bytes > quota) continue; /* its own group's quota */
                s->graph_used += r->bytes;
                admit(s, r, NULL);
                continue;
            }
            if (r->kind == DJ_REQ_CTRL || !x) {
                admit(s, r, NULL);
                continue;
            }
            if (x->admitted) continue; /* one at a time per session */
            r->need = pages_at(x, (uint64_t)x->pos + r->tokens);
            if (r->need > s->cfg.pages_total || (s->cfg.quota_pages && r->need > s->cfg.quota_pages)) {
                const bool quota = r->need <= s->cfg.pages_total;
                snprintf(s->reason, sizeof s->reason,
                         "the request needs %u KV pages, more than the %s (%llu pages)", r->need,
                         quota ? "connection's quota (--quota-gb)" : "whole data segment",
                         (unsigned long long)(quota ? s->cfg.quota_pages : s->cfg.pages_total));
                s->counts.refused++;
                d->op = DJ_SCHED_REFUSE;
                d->req = r->id;
                d->sess = r->sess;
                return true;
            }
            if (x->res == RES_SWAPPING || x->swap_pending) { /* wait for the copy out, then come back */
                mem_stop = true;
                continue;
            }
            sreq *lo = NULL;
            if (r->kind == DJ_REQ_GEN && s->n_running >= s->cfg.max_running) {
                lo = lowest_running_gen(s);
                if (!lo || lo->qos <= r->qos) {
                    mem_stop = true; /* keeps its place in line */
                    continue;
                }
            }
            uint64_t extra;
            const bool fit = fits(s, r, x, &extra);
            if (mem_stop) {
                /* behind a request that waits for memory, only what takes none
                 * goes ahead (a session growing within the pages it holds) */
                if (fit && !extra && !lo && x->res == RES_RESIDENT) admit(s, r, x);
                continue;
            }
            if (!fit) {
                const bool quota = s->cfg.quota_pages && used_pages(s, x->conn, true) + extra > s->cfg.quota_pages;
                /* one that waits only for its own group's quota holds back no other group's requests */
                if (!quota || used_pages(s, 0, false) + extra > s->cfg.pages_total) mem_blocked = mem_stop = true;
                /* make room: paused/idle sessions out, least recently used first */
                if (s->cfg.policy == DJ_SWAP_REACTIVE) continue;
                /* enough already on its way out: wait for those copies */
                if (quota ? used_pages(s, x->conn, true) - outgoing_pages(s, x->conn, true) + extra <= s->cfg.quota_pages
                          : used_pages(s, 0, false) - outgoing_pages(s, 0, false) + extra <= s->cfg.pages_total)
                    continue;
                ssess *v = pick_victim(s, now, x, quota, 0);
                if (!v) continue;
                if (s->cfg.policy == DJ_SWAP_RECOMPUTE) {
                    v->res = RES_DROPPED;
                    set_held(s, v, 0);
                    s->counts.drops++;
                    d->op = DJ_SCHED_DROP;
                    d->sess = v->id;
                } else if (!swap_out_or_spill(s, v, d)) {
                    continue;
                }
                return true;
            }
            if (lo) { /* a lower class's generation waits between steps; its memory stays reserved */
                lo->preempted = true;
                s->n_running--;
                s->counts.preemptions++;
            }
            admit(s, r, x);
            if (x->res == RES_SWAPPED) {
                restore(s, x, d);
                return true;
            }
            if (x->res == RES_DROPPED) x->res = RES_RESIDENT; /* the caller re-feeds it */
        }
    }
    return false;
}

static bool runnable(const dj_sched_t *s, const sreq *r) {
    const ssess *x = r->sess ? map_get(&s->sessions, r->sess) : NULL;
    return !x || r->kind == DJ_REQ_CTRL || x->res == RES_RESIDENT || x->res == RES_RESTORING ||
           x->res == RES_DROPPED;
}

static sreq *best_run(const dj_sched_t *s) {
    sreq *b = NULL;
    for (sreq *r = s->admitted.head; r; r = r->next)
        if (runnable(s, r) && (!b || r->qos < b->qos)) b = r;
    return b;
}

static bool gen_ready(const dj_sched_t *s, const sreq *r) {
    return !r->preempted && r->rows && runnable(s, r);
}

static sreq *best_gen(const dj_sched_t *s) {
    sreq *b = NULL;
    for (sreq *r = s->gens.head; r; r = r->next)
        if (gen_ready(s, r) && (!b || r->qos < b->qos)) b = r;
    return b;
}

static void make_step(dj_sched_t *s, sreq *first, dj_sched_decision *d) {
    d->op = DJ_SCHED_STEP;
    d->n = 0;
    d->reqs[d->n++] = first->id;
    uint32_t rows = first->rows;
    sreq *chosen[DJ_SCHED_MAX_BATCH];
    chosen[0] = first;
    if (first->rides)
        for (uint32_t q = 0; q < DJ_SCHED_CLASSES; q++) /* higher classes first, round robin within */
            for (sreq *r = s->gens.head; r && d->n < DJ_SCHED_MAX_BATCH; r = r->next) {
                if (r == first || r->qos != q || r->model != first->model || !r->rides || !gen_ready(s, r)) continue;
                if (rows + r->rows > s->cfg.max_rows) continue;
                rows += r->rows;
                chosen[d->n] = r;
                d->reqs[d->n++] = r->id;
            }
    for (uint32_t i = 0; i < d->n; i++) { /* to the back of the round robin */
        l_del(chosen[i]);
        l_push(&s->gens, chosen[i]);
    }
}

/* Semantic policy: bring back what will be needed soon - a resumed session
 * that is out, a paused one near the end of its expected wait. */
static bool prefetch(dj_sched_t *s, uint64_t now, dj_sched_decision *d, uint64_t *wake) {
    if (s->cfg.policy != DJ_SWAP_SEMANTIC) return false;
    for (ssess *x = s->all; x; x = x->next) {
        if (x->res != RES_SWAPPED || x->swap_pending) continue;
        if (x->paused) {
            if (!x->expect_ms) continue;
            const uint64_t at = prefetch_at(s, x);
            if (now < at) {
                if (at < *wake) *wake = at;
                continue;
            }
        } else if (x->n_req || !x->want_back) {
            continue; /* admission brings it back with its request */
        }
        if (s->cfg.quota_pages && used_pages(s, x->conn, true) + x->pooled > s->cfg.quota_pages) continue;
        if (used_pages(s, 0, false) + x->pooled > s->cfg.pages_total) {
            /* room from a session wanted later than this one (an exchange: its copies out first) */
            if (used_pages(s, 0, false) - outgoing_pages(s, 0, false) + x->pooled <= s->cfg.pages_total) continue;
            ssess *v = x->paused ? pick_victim(s, now, x, false, next_use(x)) : NULL;
            if (v && swap_out_or_spill(s, v, d)) return true;
            continue;
        }
        x->prefetched = x->paused;
        s->counts.prefetches++;
        restore(s, x, d);
        return true;
    }
    return false;
}

void dj_sched_next(dj_sched_t *s, uint64_t now, dj_sched_decision *d) {
    memset(d, 0, sizeof *d);
    d->wake_ms = UINT64_MAX;
    /* recompute policy: a paused session's KV goes at once */
    if (s->cfg.policy == DJ_SWAP_RECOMPUTE)
        for (ssess *x = s->all; x; x = x->next)
            if (x->paused && x->res == RES_RESIDENT && !x->n_req && x->held) {
                x->res = RES_DROPPED;
                set_held(s, x, 0);
                s->counts.drops++;
                d->op = DJ_SCHED_DROP;
                d->sess = x->id;
                return;
            }
    if (admissions(s, now, d)) return;
    uint64_t wake = UINT64_MAX;
    if (prefetch(s, now, d, &wake)) return; /* copies overlap the steps: decided before them */
    sreq *run = best_run(s), *gen = best_gen(s);
    if (run || gen) {
        bool take_run = run && (!gen || run->qos < gen->qos);
        if (run && gen && run->qos == gen->qos)
            take_run = s->turn || (s->burst && run->kind == DJ_REQ_GEN);
        if (run && gen && run->qos == gen->qos && !(s->burst && run->kind == DJ_REQ_GEN)) s->turn = !s->turn;
        s->burst = false;
        if (take_run) {
            d->op = DJ_SCHED_RUN;
            d->req = run->id;
            d->sess = run->sess;
            if (run->kind != DJ_REQ_GEN) { /* runs once: leaves the lists, answered by dj_sched_done */
                l_del(run);
                run->st = R_ADMITTED;
                if (run->kind == DJ_REQ_GRAPH) l_push(&s->graphs, run); /* its bytes held until done */
            }
            return;
        }
        make_step(s, gen, d);
        return;
    }
    /* a request waiting for memory may be unblocked by a session turning idle */
    bool waiting = false;
    for (uint32_t q = 0; q < DJ_SCHED_CLASSES; q++) waiting |= s->waiting[q].n > 0;
    if (waiting)
        for (ssess *x = s->all; x; x = x->next)
            if (x->res == RES_RESIDENT && !x->n_req && !x->paused && x->held && now < x->last_ms + s->cfg.idle_ms &&
                x->last_ms + s->cfg.idle_ms < wake)
                wake = x->last_ms + s->cfg.idle_ms;
    d->op = DJ_SCHED_WAIT;
    d->wake_ms = wake;
}

const char *dj_sched_refuse_reason(const dj_sched_t *s) { return s->reason; }

/* ---- reading ---- */

dj_sched_state dj_sched_session_state(const dj_sched_t *s, uint64_t sess, uint64_t now) {
    const ssess *x = map_get(&s->sessions, sess);
    if (!x) return DJ_SESS_IDLE;
    switch (x->res) {
    case RES_SWAPPING: return DJ_SESS_SWAPPING;
    case RES_SWAPPED: return DJ_SESS_SWAPPED;
    case RES_RESTORING: return DJ_SESS_RESTORING;
    case RES_DROPPED: return DJ_SESS_DROPPED;
    default: break;
    }
    if (x->paused) return DJ_SESS_PAUSED;
    return idle(s, x, now) ? DJ_SESS_IDLE : DJ_SESS_RUNNING;
}

void dj_sched_get_stats(const dj_sched_t *s, uint64_t now, dj_sched_stats *st) {
    *st = s->counts;
    st->pages_total = s->cfg.pages_total;
    st->pages_held = s->held;
    const uint64_t used = used_pages(s, 0, false);
    st->pages_reserved = (uint32_t)(used > s->held ? used - s->held : 0);
    st->pool_pages = s->cfg.pool_pages;
    st->pool_used = s->pool_used;
    st->disk_pages = s->cfg.disk_pages;
    st->disk_used = s->disk_used;
    st->on_disk = 0;
    for (const ssess *x = s->all; x; x = x->next) st->on_disk += x->on_disk && x->res == RES_SWAPPED;
    memset(st->sessions, 0, sizeof st->sessions);
    for (const ssess *x = s->all; x; x = x->next) st->sessions[dj_sched_session_state(s, x->id, now)]++;
    /* every request held counts once: running (a generation stepping) or
     * waiting (queued, admitted while its session comes back, or preempted) */
    for (uint32_t q = 0; q < DJ_SCHED_CLASSES; q++) {
        st->waiting[q] = s->waiting[q].n;
        st->running[q] = 0;
    }
    for (const sreq *r = s->admitted.head; r; r = r->next) st->waiting[r->qos]++;
    st->graph_bytes = s->cfg.graph_bytes;
    st->graph_used = s->graph_used;
    st->preempted = 0;
    for (const sreq *r = s->gens.head; r; r = r->next) {
        if (r->preempted) st->preempted++, st->waiting[r->qos]++;
        else st->running[r->qos]++;
    }
}

dj_status dj_sched_check(const dj_sched_t *s) {
    uint64_t held = 0, pooled = 0, on_disk = 0, nreq = 0, n_sess = 0;
    for (const ssess *x = s->all; x; x = x->next) {
        n_sess++;
        held += x->held;
        *(x->on_disk ? &on_disk : &pooled) += x->pooled;
        if (x->on_disk && x->res != RES_SWAPPED && x->res != RES_RESTORING)
            return dj_fail(DJ_EINTERNAL, "sched: session %llx is on disk but %s", (unsigned long long)x->id,
                           x->res == RES_RESIDENT ? "resident" : "not swapped");
        if ((x->res == RES_SWAPPED || x->res == RES_DROPPED) && x->held)
            return dj_fail(DJ_EINTERNAL, "sched: session %llx is out but holds %u pages", (unsigned long long)x->id,
                           x->held);
        if (x->res == RES_RESIDENT && x->pooled)
            return dj_fail(DJ_EINTERNAL, "sched: resident session %llx has %u pooled pages",
                           (unsigned long long)x->id, x->pooled);
        nreq += x->n_req;
    }
    if (n_sess != s->sessions.n) return dj_fail(DJ_EINTERNAL, "sched: session list and table differ");
    if (held != s->held || pooled != s->pool_used)
        return dj_fail(DJ_EINTERNAL, "sched: page sums %llu/%llu, counters %u/%llu", (unsigned long long)held,
                       (unsigned long long)pooled, s->held, (unsigned long long)s->pool_used);
    if (on_disk != s->disk_used || s->disk_used > s->cfg.disk_pages)
        return dj_fail(DJ_EINTERNAL, "sched: disk pages %llu, counter %llu, tier %llu", (unsigned long long)on_disk,
                       (unsigned long long)s->disk_used, (unsigned long long)s->cfg.disk_pages);
    if (s->cfg.pool_pages && s->pool_used > s->cfg.pool_pages)
        return dj_fail(DJ_EINTERNAL, "sched: pool holds %llu of %llu pages", (unsigned long long)s->pool_used,
                       (unsigned long long)s->cfg.pool_pages);
    uint64_t listed = 0, running = 0, with_sess = 0;
    if (graph_bytes_of(s, 0) != s->graph_used)
        return dj_fail(DJ_EINTERNAL, "sched: graph runs hold %llu bytes, counter %llu", (unsigned long long)graph_bytes_of(s, 0),
                       (unsigned long long)s->graph_used);
    if (s->cfg.graph_bytes && s->graph_used > s->cfg.graph_bytes)
        return dj_fail(DJ_EINTERNAL, "sched: graph runs hold %llu bytes of %llu", (unsigned long long)s->graph_used,
                       (unsigned long long)s->cfg.graph_bytes);
    const list *ls[DJ_SCHED_CLASSES + 3] = {&s->waiting[0], &s->waiting[1], &s->waiting[2], &s->admitted, &s->gens,
                                            &s->graphs};
    for (int i = 0; i < DJ_SCHED_CLASSES + 3; i++) {
        uint32_t n = 0;
        for (const sreq *r = ls[i]->head; r; r = r->next) {
            n++;
            if (r->on != ls[i]) return dj_fail(DJ_EINTERNAL, "sched: request on the wrong list");
            if ((r->st == R_GEN && !r->preempted) || (r->st == R_ADMITTED && r->kind == DJ_REQ_GEN)) running++;
            with_sess += r->sess != 0;
        }
        if (n != ls[i]->n) return dj_fail(DJ_EINTERNAL, "sched: list count %u, walked %u", ls[i]->n, n);
        listed += n;
    }
    (void)listed;
    if (running != s->n_running)
        return dj_fail(DJ_EINTERNAL, "sched: %llu running generations, counter %u", (unsigned long long)running,
                       s->n_running);
    if (s->n_running > s->cfg.max_running)
        return dj_fail(DJ_EINTERNAL, "sched: %u running, cap %u", s->n_running, s->cfg.max_running);
    if (with_sess > nreq) return dj_fail(DJ_EINTERNAL, "sched: more listed requests than sessions count");
    /* what resident sessions count must fit, unless pages were taken outside an admission */
    return DJ_OK;
}
