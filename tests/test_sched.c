/* test_sched.c: the scheduler alone on a virtual clock - thousands of random
 * event traces against a model engine (sessions with positions and pages, a
 * swap pool, transfers that take virtual time): no request lost, no KV lost,
 * never more pages than the segment, QoS and LIFO rules, refusals; with a
 * disk tier below the pool, spills (some failing) and read-backs (some
 * finding their pages corrupt: the history is fed again). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/sched.h"
#include "testutil.h"

#define TPP 4       /* tokens per page */
#define MAX_S 16
#define MAX_R 256
#define CTX 96
#if defined(__SANITIZE_ADDRESS__)
#define TRACES 100 /* per policy and seed under ASan (a Debug build) */
#else
#define TRACES 400
#endif

static uint32_t pages_for(uint32_t pos) { return (pos + TPP - 1) / TPP; }

typedef struct fsess {
    bool open, paused;
    uint32_t pos, held, pooled; /* tokens; pages in the segment; pages in the pool */
    int xfer;                   /* 0 none, 1 out, 2 in */
    bool on_disk;               /* pooled pages are on the disk tier */
    uint64_t xfer_done;         /* virtual ms */
    uint32_t dropped_pos;       /* recompute: tokens to re-feed */
    int busy;                   /* requests of it alive */
} fsess;

typedef struct freq {
    bool alive, started;
    uint64_t id;
    int sess;
    dj_sched_kind kind;
    uint32_t prompt, max_new, fed, gen;
    uint32_t qos;
    uint64_t t_arrive, t_start;
} freq;

typedef struct world {
    dj_sched_t *s;
    dj_sched_config cfg;
    fsess ss[MAX_S];
    freq rr[MAX_R];
    uint32_t n_req;
    uint64_t now, next_id;
    uint64_t pool_used, disk_used;
    uint32_t refused, done, lost;
    uint32_t spills, kv_lost;   /* disk tier: spills done, read-backs that found corrupt pages */
} world;

/* A session's pooled pages go (closed, or back in the segment). */
static void unpool(world *w, fsess *f) {
    *(f->on_disk ? &w->disk_used : &w->pool_used) -= f->pooled;
    f->pooled = 0;
    f->on_disk = false;
}

static int rnd(int n);
static bool disk_traces; /* the random traces with a disk tier below a small pool: some spills fail, some
                          * read-backs find corrupt pages */
static uint64_t disk_spills, disk_lost; /* over every trace */

static uint32_t seg_held(const world *w) {
    uint32_t h = 0;
    for (int i = 0; i < MAX_S; i++) h += w->ss[i].held;
    return h;
}

static uint64_t sid(int i) { return 0x1000 + (uint64_t)i; }
static int sidx(uint64_t id) { return (int)(id - 0x1000); }

static freq *req_of(world *w, uint64_t id) {
    for (uint32_t i = 0; i < w->n_req; i++)
        if (w->rr[i].alive && w->rr[i].id == id) return &w->rr[i];
    return NULL;
}

static void finish(world *w, freq *r) {
    dj_sched_done(w->s, r->id, w->now);
    r->alive = false;
    if (r->sess >= 0) w->ss[r->sess].busy--;
    w->done++;
}

/* Grow a session to pos tokens; the page count must stay within the segment. */
static void grow(world *w, int i, uint32_t pos) {
    fsess *f = &w->ss[i];
    f->pos = pos;
    f->held = pages_for(pos);
    CHECK_MSG(seg_held(w) <= w->cfg.pages_total, "segment over: %u of %u pages", seg_held(w), w->cfg.pages_total);
    if (w->cfg.quota_pages) { /* sessions i % 3 == c are connection c's */
        uint64_t conn = 0;
        for (int k = i % 3; k < MAX_S; k += 3) conn += w->ss[k].held;
        CHECK_MSG(conn <= w->cfg.quota_pages, "connection %d holds %llu pages, quota %llu", i % 3,
                  (unsigned long long)conn, (unsigned long long)w->cfg.quota_pages);
    }
    dj_sched_pages(w->s, sid(i), f->held, f->pos);
}

static void open_sess(world *w, int i, uint64_t conn, uint32_t qos) {
    const dj_sched_session_info in = {.conn = conn, .qos = qos, .block_tokens = TPP, .block_pages = 1, .max_ctx = CTX};
    CHECK_OK(dj_sched_session_open(w->s, sid(i), &in, w->now));
}

static void arrive(world *w, int i, dj_sched_kind kind, uint32_t qos, uint32_t prompt, uint32_t max_new) {
    if (w->n_req == MAX_R) return;
    freq *r = &w->rr[w->n_req++];
    memset(r, 0, sizeof *r);
    r->alive = true;
    r->id = ++w->next_id;
    r->sess = i;
    r->kind = kind;
    r->qos = qos;
    r->prompt = prompt;
    r->max_new = max_new;
    r->t_arrive = w->now;
    if (i >= 0) w->ss[i].busy++;
    const uint32_t tokens = prompt + (kind == DJ_REQ_GEN ? max_new : 0);
    CHECK_OK(dj_sched_arrive(w->s, r->id, i >= 0 ? sid(i) : 0, qos, kind, 7, tokens, w->now));
}

/* Carry out one decision; false when the scheduler waits. */
static bool act(world *w, const dj_sched_decision *d) {
    switch (d->op) {
    case DJ_SCHED_WAIT: return false;
    case DJ_SCHED_REFUSE: {
        freq *r = req_of(w, d->req);
        CHECK(r != NULL);
        if (r) {
            CHECK(dj_sched_refuse_reason(w->s)[0] != '\0');
            finish(w, r);
            w->done--;
            w->refused++;
        }
        return true;
    }
    case DJ_SCHED_SWAP_OUT: {
        fsess *f = &w->ss[sidx(d->sess)];
        CHECK(f->open && f->xfer == 0 && f->held > 0);
        for (uint32_t k = 0; k < w->n_req; k++) /* its requests, if any, all wait */
            CHECK(!(w->rr[k].alive && w->rr[k].sess == sidx(d->sess) && w->rr[k].started));
        CHECK(w->pool_used + f->held <= w->cfg.pool_pages);
        w->pool_used += f->held;
        f->pooled = f->held;
        f->xfer = 1;
        f->xfer_done = w->now + 1 + f->held / 8;
        dj_sched_swap_started(w->s, d->sess, true);
        return true;
    }
    case DJ_SCHED_SPILL: {
        fsess *f = &w->ss[sidx(d->sess)];
        CHECK(w->cfg.disk_pages && f->open && f->xfer == 0 && f->held == 0 && f->pooled > 0 && !f->on_disk);
        CHECK(w->disk_used + f->pooled <= w->cfg.disk_pages);
        if (disk_traces && rnd(8) == 0) { /* a write fails: it stays in the pool */
            dj_sched_spilled(w->s, d->sess, false);
            return true;
        }
        w->pool_used -= f->pooled;
        w->disk_used += f->pooled;
        f->on_disk = true;
        w->spills++;
        dj_sched_spilled(w->s, d->sess, true);
        return true;
    }
    case DJ_SCHED_SWAP_IN: {
        fsess *f = &w->ss[sidx(d->sess)];
        CHECK(f->open && f->xfer == 0 && f->held == 0 && f->pooled > 0);
        if (f->on_disk && disk_traces && rnd(8) == 0) { /* a page fails its checksum: KV lost, its history fed again */
            dj_sched_swap_started(w->s, d->sess, false);
            dj_sched_kv_lost(w->s, d->sess);
            unpool(w, f);
            f->dropped_pos += f->pos;
            f->pos = 0;
            dj_sched_pages(w->s, d->sess, 0, f->dropped_pos);
            w->kv_lost++;
            return true;
        }
        f->held = f->pooled; /* pages taken now; bytes arrive later */
        CHECK_MSG(seg_held(w) <= w->cfg.pages_total, "restore over: %u of %u", seg_held(w), w->cfg.pages_total);
        f->xfer = 2;
        f->xfer_done = w->now + 1 + f->held / 8;
        dj_sched_swap_started(w->s, d->sess, true);
        return true;
    }
    case DJ_SCHED_DROP: {
        fsess *f = &w->ss[sidx(d->sess)];
        CHECK(w->cfg.policy == DJ_SWAP_RECOMPUTE && f->xfer == 0);
        for (uint32_t k = 0; k < w->n_req; k++)
            CHECK(!(w->rr[k].alive && w->rr[k].sess == sidx(d->sess) && w->rr[k].started));
        f->dropped_pos += f->pos; /* the history is kept by the caller: re-fed later */
        f->pos = 0;
        f->held = 0;
        dj_sched_pages(w->s, d->sess, 0, f->dropped_pos);
        return true;
    }
    case DJ_SCHED_RUN: {
        freq *r = req_of(w, d->req);
        CHECK(r != NULL);
        if (!r) return true;
        if (r->kind == DJ_REQ_CTRL) {
            finish(w, r);
            return true;
        }
        fsess *f = &w->ss[r->sess];
        CHECK_MSG((f->xfer != 1 && f->pooled == 0) || f->xfer == 2, "run on a session that is out");
        r->t_start = w->now;
        if (f->pos + f->dropped_pos + r->prompt + (r->kind == DJ_REQ_GEN ? r->max_new : 0) > CTX) {
            finish(w, r); /* the worker answers ERANGE: past the session's context */
            return true;
        }
        if (f->dropped_pos) { /* recompute: history first */
            grow(w, r->sess, f->dropped_pos);
            f->dropped_pos = 0;
        }
        if (r->kind == DJ_REQ_STEP) {
            grow(w, r->sess, f->pos + r->prompt);
            finish(w, r);
            return true;
        }
        r->started = true;
        dj_sched_gen_rows(w->s, r->id, r->prompt > 8 ? 8 : r->prompt, r->prompt <= 8 || (r->id & 1));
        return true;
    }
    case DJ_SCHED_STEP: {
        CHECK(d->n >= 1 && d->n <= DJ_SCHED_MAX_BATCH);
        for (uint32_t k = 0; k < d->n; k++) {
            freq *r = req_of(w, d->reqs[k]);
            CHECK(r && r->started);
            if (!r) continue;
            fsess *f = &w->ss[r->sess];
            CHECK(f->xfer != 1 && (f->pooled == 0 || f->xfer == 2));
            uint32_t rows = r->fed < r->prompt ? (r->prompt - r->fed > 8 ? 8 : r->prompt - r->fed) : 1;
            if (r->fed < r->prompt) r->fed += rows;
            else r->gen++;
            grow(w, r->sess, f->pos + rows);
            if (r->gen >= r->max_new) {
                finish(w, r);
                continue;
            }
            const bool feeding = r->fed < r->prompt;
            const uint32_t next = feeding ? (r->prompt - r->fed > 8 ? 8 : r->prompt - r->fed) : 1;
            dj_sched_gen_rows(w->s, r->id, next, !feeding || (r->id & 1));
        }
        return true;
    }
    }
    return false;
}

/* Transfers whose virtual time is up complete. */
static void transfers(world *w) {
    for (int i = 0; i < MAX_S; i++) {
        fsess *f = &w->ss[i];
        if (!f->xfer || w->now < f->xfer_done) continue;
        if (f->xfer == 1) {
            f->held = 0;
            dj_sched_swapped(w->s, sid(i), 0);
        } else {
            unpool(w, f);
            dj_sched_swapped(w->s, sid(i), f->held);
        }
        f->xfer = 0;
    }
}

static void consistent(world *w) {
    dj_status st = dj_sched_check(w->s);
    CHECK_MSG(st == DJ_OK, "%s", dj_last_error());
    dj_sched_stats ss;
    dj_sched_get_stats(w->s, w->now, &ss);
    CHECK_MSG(ss.pages_held == seg_held(w), "sched sees %u pages held, the engine %u", ss.pages_held, seg_held(w));
    CHECK_MSG(ss.pool_used == w->pool_used, "sched sees %llu pooled, the engine %llu",
              (unsigned long long)ss.pool_used, (unsigned long long)w->pool_used);
    CHECK_MSG(ss.disk_used == w->disk_used && w->disk_used <= w->cfg.disk_pages,
              "sched sees %llu pages on disk, the engine %llu (tier %llu)", (unsigned long long)ss.disk_used,
              (unsigned long long)w->disk_used, (unsigned long long)w->cfg.disk_pages);
    /* the queues' counts hold every live request once, each in its class */
    uint32_t alive[DJ_SCHED_CLASSES] = {0};
    for (uint32_t i = 0; i < w->n_req; i++)
        if (w->rr[i].alive) alive[w->rr[i].qos]++;
    for (uint32_t q = 0; q < DJ_SCHED_CLASSES; q++)
        CHECK_MSG(ss.waiting[q] + ss.running[q] == alive[q], "class %u: %u waiting + %u running, %u requests alive", q,
                  ss.waiting[q], ss.running[q], alive[q]);
    if (w->cfg.pool_quota_pages) /* sessions i % 3 == c are group c's (as for quota_pages) */
        for (int c = 0; c < 3; c++) {
            uint64_t pooled = 0;
            for (int k = c; k < MAX_S; k += 3) pooled += w->ss[k].pooled;
            CHECK_MSG(pooled <= w->cfg.pool_quota_pages, "group %d holds %llu pool pages, its share %llu", c,
                      (unsigned long long)pooled, (unsigned long long)w->cfg.pool_quota_pages);
        }
}

static int rnd(int n) { return (int)(dj_test_rand() % (uint64_t)n); }


/* One random trace: sessions open, ask, pause, resume, close; then the
 * arrivals stop and everything must finish. With an ample pool (every
 * session's whole context fits in it) nothing may stall; with a small one,
 * a full pool can hold back the sessions waiting in it while the segment is
 * full of sessions that cannot go out (the request waits, KV is never
 * dropped), so there clients give up (close a session) after a stall - as
 * under the reactive policy, which never moves KV: sessions holding pages
 * while their next requests wait for more can stall each other. */
static void trace(dj_swap_policy pol, int n_events, bool ample) {
    world w;
    memset(&w, 0, sizeof w);
    const uint64_t pool = ample ? (uint64_t)MAX_S * pages_for(CTX) : (uint64_t)rnd(80);
    uint64_t stall_since = 0;
    /* a per-connection quota in one trace of three (sessions belong to 3 connections) */
    const uint64_t quota = rnd(3) == 0 ? 12 + (uint64_t)rnd(20) : 0;
    /* and a share of a small pool per connection in one of those of two (stalls are given up on there) */
    const uint64_t pool_quota = quota && !ample && rnd(2) == 0 ? 4 + (uint64_t)rnd(20) : 0;
    w.cfg = (dj_sched_config){.max_running = 1 + (uint32_t)rnd(4), .max_rows = 16 + (uint32_t)rnd(32),
                              .quota_pages = quota, .pool_quota_pages = pool_quota,
                              .pages_total = 24 + (uint32_t)rnd(40), .pool_pages = pool,
                              .idle_ms = (uint32_t)rnd(20), .lifo_age_ms = 50, .page_in_ms = 0.1, .policy = pol};
    if (disk_traces) {
        w.cfg.pool_pages = (uint64_t)rnd(30);
        w.cfg.disk_pages = 20 + (uint64_t)rnd(200);
        w.cfg.disk_page_ms = 0.4;
    }
    CHECK_OK(dj_sched_new(&w.cfg, &w.s));
    if (!w.s) return;
    uint64_t steps = 0;
    for (int e = 0; e < n_events || w.done + w.refused < w.n_req; e++) {
        const bool arrivals = e < n_events;
        if (arrivals) {
            const int i = rnd(MAX_S);
            fsess *f = &w.ss[i];
            const int what = rnd(10);
            if (!f->open) {
                if (what < 5) {
                    memset(f, 0, sizeof *f);
                    f->open = true;
                    open_sess(&w, i, (uint64_t)(i % 3), (uint32_t)rnd(3));
                }
            } else if (what < 4 && !f->paused && f->busy < 2) {
                const uint32_t room = CTX - f->pos - f->dropped_pos;
                if (room >= 4) {
                    const uint32_t p = 1 + (uint32_t)rnd((int)room / 2);
                    arrive(&w, i, what < 3 ? DJ_REQ_GEN : DJ_REQ_STEP, f->busy ? 2 : (uint32_t)rnd(3), p,
                           1 + (uint32_t)rnd((int)(room - p)));
                }
            } else if (what == 4) {
                arrive(&w, -1, DJ_REQ_CTRL, (uint32_t)rnd(3), 0, 0);
            } else if (what == 5 && !f->busy && !f->paused) {
                f->paused = true;
                dj_sched_pause(w.s, sid(i), (uint64_t)rnd(3) * 20, w.now);
            } else if (what == 6 && f->paused) {
                f->paused = false;
                dj_sched_resume(w.s, sid(i), w.now);
            } else if (what == 7 && rnd(6) == 0 && !f->xfer) {
                /* close: its requests are forgotten (counted as answered) */
                for (uint32_t k = 0; k < w.n_req; k++)
                    if (w.rr[k].alive && w.rr[k].sess == i) {
                        w.rr[k].alive = false;
                        w.done++;
                    }
                dj_sched_session_close(w.s, sid(i));
                unpool(&w, f);
                memset(f, 0, sizeof *f);
            }
        } else {
            /* drain: nothing new; paused clients resume; a session without
             * requests may lapse (its lease), as idle clients' do */
            for (int i = 0; i < MAX_S; i++) {
                fsess *f = &w.ss[i];
                if (f->paused && rnd(4) == 0) {
                    f->paused = false;
                    dj_sched_resume(w.s, sid(i), w.now);
                }
                if (f->open && !f->busy && !f->paused && !f->xfer && rnd(50) == 0) {
                    dj_sched_session_close(w.s, sid(i));
                    unpool(&w, f);
                    memset(f, 0, sizeof *f);
                }
            }
        }
        /* the worker: decisions until it waits, a few at most per event */
        bool progress = false;
        for (int k = 0; k < 6; k++) {
            dj_sched_decision d;
            dj_sched_next(w.s, w.now, &d);
            if (d.op == DJ_SCHED_STEP) steps++;
            const bool did = act(&w, &d);
            consistent(&w);
            progress |= did;
            if (!did) break;
        }
        bool xfer = false;
        for (int i = 0; i < MAX_S; i++) xfer |= w.ss[i].xfer != 0;
        if (progress || xfer || w.done + w.refused == w.n_req) stall_since = w.now;
        if (!arrivals && (!ample || pol == DJ_SWAP_REACTIVE) && w.now > stall_since + 200) { /* a client gives up */
            for (int i = 0; i < MAX_S; i++) {
                fsess *f = &w.ss[i];
                if (!f->open || !f->busy) continue;
                for (uint32_t k = 0; k < w.n_req; k++)
                    if (w.rr[k].alive && w.rr[k].sess == i) {
                        w.rr[k].alive = false;
                        w.done++;
                    }
                dj_sched_session_close(w.s, sid(i));
                unpool(&w, f);
                memset(f, 0, sizeof *f);
                break;
            }
            stall_since = w.now;
        }
        w.now += 1 + (uint64_t)rnd(3);
        transfers(&w);
        if (e > n_events + 20000) {
            CHECK_MSG(false, "trace did not drain: %u requests, %u done, %u refused (policy %s)", w.n_req, w.done,
                      w.refused, dj_swap_policy_name(pol));
            break;
        }
    }
    /* every request answered; every session's KV where it was left */
    CHECK(w.done + w.refused == w.n_req);
    for (int i = 0; i < MAX_S; i++) {
        if (!w.ss[i].open) continue;
        CHECK_MSG(w.ss[i].pos + w.ss[i].dropped_pos <= CTX, "positions past the context");
    }
    (void)steps;
    disk_spills += w.spills;
    disk_lost += w.kv_lost;
    dj_sched_free(w.s);
}

/* A scenario's world: a scheduler of cfg and no sessions. */
static bool world_start(world *w, dj_sched_config cfg) {
    memset(w, 0, sizeof *w);
    w->cfg = cfg;
    CHECK_OK(dj_sched_new(&w->cfg, &w->s));
    return w->s != NULL;
}

/* The end of a scenario: the books agree, then the scheduler goes. */
static void world_end(world *w) {
    consistent(w);
    dj_sched_free(w->s);
}

/* A realtime generation starts within one step while batch ones fill max_running. */
static void realtime_within_a_step(void) {
    world w;
    if (!world_start(&w, (dj_sched_config){.max_running = 2, .max_rows = 64, .pages_total = 1000, .pool_pages = 100,
                              .idle_ms = 10, .lifo_age_ms = 1000, .page_in_ms = 0.1})) return;
    for (int i = 0; i < 3; i++) {
        w.ss[i].open = true;
        open_sess(&w, i, 1, i < 2 ? 2 : 0);
    }
    arrive(&w, 0, DJ_REQ_GEN, 2, 4, 50);
    arrive(&w, 1, DJ_REQ_GEN, 2, 4, 50);
    dj_sched_decision d;
    for (int k = 0; k < 10; k++) { /* both batch generations start and step */
        dj_sched_next(w.s, w.now, &d);
        act(&w, &d);
    }
    arrive(&w, 2, DJ_REQ_GEN, 0, 4, 5);
    int steps_before = 0;
    for (int k = 0; k < 10; k++) {
        dj_sched_next(w.s, w.now, &d);
        if (d.op == DJ_SCHED_RUN && d.req == w.rr[2].id) break;
        steps_before += d.op == DJ_SCHED_STEP;
        act(&w, &d);
    }
    CHECK_MSG(steps_before <= 1, "realtime waited %d steps", steps_before);
    CHECK(d.op == DJ_SCHED_RUN && d.req == w.rr[2].id);
    act(&w, &d);
    dj_sched_stats st;
    dj_sched_get_stats(w.s, w.now, &st);
    CHECK(st.preemptions == 1 && st.preempted == 1);
    /* the realtime one runs to its end, then the batch one comes back */
    int stepped[2] = {0, 0};
    for (int k = 0; k < 40 && w.rr[2].alive; k++) {
        dj_sched_next(w.s, w.now, &d);
        if (d.op == DJ_SCHED_STEP)
            for (uint32_t j = 0; j < d.n; j++)
                for (int b = 0; b < 2; b++) stepped[b] += d.reqs[j] == w.rr[b].id;
        act(&w, &d);
    }
    CHECK(!w.rr[2].alive);
    CHECK_MSG(!stepped[0] != !stepped[1], "batch generations stepped %d and %d times beside the realtime one",
              stepped[0], stepped[1]); /* the preempted one waited, the other ran */
    dj_sched_next(w.s, w.now, &d); /* the preempted one comes back */
    dj_sched_get_stats(w.s, w.now, &st);
    CHECK(st.preempted == 0 && st.running[2] >= 1);
    world_end(&w);
}

/* Admission swaps out the least recently used paused/idle session, refuses
 * only what can never fit, and brings a paused session back ahead of its
 * expected end. */
static void swap_and_prefetch(void) {
    world w;
    if (!world_start(&w, (dj_sched_config){.max_running = 4, .max_rows = 64, .pages_total = 10, .pool_pages = 20,
                              .idle_ms = 5, .lifo_age_ms = 1000, .page_in_ms = 1.0})) return;
    for (int i = 0; i < 3; i++) {
        w.ss[i].open = true;
        open_sess(&w, i, 1, 1);
    }
    dj_sched_decision d;
    /* session 0: 6 pages, then paused for 100 ms */
    arrive(&w, 0, DJ_REQ_STEP, 1, 24, 0);
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_RUN);
    act(&w, &d);
    CHECK(w.ss[0].held == 6);
    w.ss[0].paused = true;
    dj_sched_pause(w.s, sid(0), 100, w.now);
    /* session 1 wants 8 pages: session 0 goes out first */
    arrive(&w, 1, DJ_REQ_STEP, 1, 32, 0);
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_SWAP_OUT && d.sess == sid(0));
    act(&w, &d);
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_WAIT); /* the copy is in flight */
    w.now += 10;
    transfers(&w);
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_RUN && w.rr[1].id == d.req);
    act(&w, &d);
    CHECK(w.ss[0].held == 0 && w.ss[0].pooled == 6 && w.ss[1].held == 8);
    /* too big for the segment: refused with the sizes */
    arrive(&w, 2, DJ_REQ_STEP, 1, 60, 0);
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_REFUSE && d.req == w.rr[2].id);
    CHECK(strstr(dj_sched_refuse_reason(w.s), "whole data segment") != NULL);
    act(&w, &d);
    /* session 1 goes idle and away; session 0's expected end nears: it comes back */
    dj_sched_session_close(w.s, sid(1));
    w.ss[1].held = 0;
    w.ss[1].open = false;
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_WAIT && d.wake_ms < 100 && d.wake_ms > w.now);
    w.now = d.wake_ms;
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_SWAP_IN && d.sess == sid(0));
    act(&w, &d);
    CHECK(dj_sched_session_state(w.s, sid(0), w.now) == DJ_SESS_RESTORING);
    w.now += 2;
    transfers(&w);
    CHECK(dj_sched_session_state(w.s, sid(0), w.now) == DJ_SESS_PAUSED);
    CHECK(w.now < 100); /* home before the expected end */
    world_end(&w);
}

/* The session wanted furthest ahead goes out first; a paused session near
 * its expected end comes back by sending out one wanted later (an exchange). */
static void exchange(void) {
    world w;
    if (!world_start(&w, (dj_sched_config){.max_running = 4, .max_rows = 64, .pages_total = 12, .pool_pages = 40,
                              .idle_ms = 5, .lifo_age_ms = 1000, .page_in_ms = 1.0})) return;
    dj_sched_decision d;
    for (int i = 0; i < 3; i++) { /* three sessions of 4 pages fill the segment */
        w.ss[i].open = true;
        open_sess(&w, i, 1, 1);
        arrive(&w, i, DJ_REQ_STEP, 1, 16, 0);
        dj_sched_next(w.s, w.now, &d);
        CHECK(d.op == DJ_SCHED_RUN);
        act(&w, &d);
    }
    dj_sched_pause(w.s, sid(0), 50, w.now);  /* wanted back at 50 */
    dj_sched_pause(w.s, sid(1), 500, w.now); /* at 500 */
    dj_sched_pause(w.s, sid(2), 200, w.now); /* at 200 */
    w.ss[3].open = true;
    open_sess(&w, 3, 1, 1);
    arrive(&w, 3, DJ_REQ_STEP, 1, 16, 0); /* needs 4 pages: session 1 (wanted last) goes */
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_SWAP_OUT && d.sess == sid(1));
    act(&w, &d);
    w.now += 10;
    transfers(&w);
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_RUN);
    act(&w, &d);
    /* session 0 is pushed out for session 4 before it is wanted; near 50 it
     * comes back, sending out session 2 (wanted at 200) */
    w.ss[4].open = true;
    open_sess(&w, 4, 1, 1);
    arrive(&w, 4, DJ_REQ_STEP, 1, 16, 0);
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_SWAP_OUT && d.sess == sid(2)); /* wanted at 200, after session 0 */
    act(&w, &d);
    w.now += 10;
    transfers(&w);
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_RUN);
    act(&w, &d);
    arrive(&w, 3, DJ_REQ_STEP, 1, 1, 0); /* keeps 3 and 4 busy: not victims of the next one */
    dj_sched_next(w.s, w.now, &d);
    act(&w, &d);
    /* now session 0 is the only victim for session 5 */
    w.ss[5].open = true;
    open_sess(&w, 5, 1, 1);
    arrive(&w, 5, DJ_REQ_STEP, 1, 4, 0);
    for (int k = 0; k < 6 && w.rr[w.n_req - 1].alive; k++) {
        dj_sched_next(w.s, w.now, &d);
        act(&w, &d);
        w.now += 2;
        transfers(&w);
    }
    CHECK(w.ss[0].held == 0 && w.ss[0].pooled == 4);
    dj_sched_session_close(w.s, sid(5)); /* frees its page */
    w.ss[5].held = 0;
    w.ss[5].open = false;
    /* at 50 - lead, session 0 comes back: room made from the session wanted later (1 or 2 are out; 3, 4 idle) */
    int swaps_in = 0;
    int outs = 0;
    for (int k = 0; k < 60 && w.now < 50; k++) {
        dj_sched_next(w.s, w.now, &d);
        swaps_in += d.op == DJ_SCHED_SWAP_IN && d.sess == sid(0);
        outs += d.op == DJ_SCHED_SWAP_OUT;
        bool moving = false;
        for (int i = 0; i < MAX_S; i++) moving |= w.ss[i].xfer != 0;
        if (!act(&w, &d)) /* as the worker: polls while copies are in flight */
            w.now = moving || d.wake_ms == UINT64_MAX || d.wake_ms <= w.now ? w.now + 1 : d.wake_ms;
        transfers(&w);
    }
    CHECK_MSG(outs == 1, "%d sessions sent out to bring one back (one was enough)", outs);
    CHECK_MSG(swaps_in == 1, "session 0 came back %d times before its expected end", swaps_in);
    world_end(&w);
}

/* A session that holds KV (an agent back from a tool) goes before a new
 * one that arrived earlier, until the new one's wait reaches the age limit. */
static void continuing_first(void) {
    world w;
    if (!world_start(&w, (dj_sched_config){.max_running = 4, .max_rows = 64, .pages_total = 8, .pool_pages = 0,
                              .idle_ms = 5, .lifo_age_ms = 100, .page_in_ms = 1.0, .policy = DJ_SWAP_REACTIVE})) return;
    dj_sched_decision d;
    for (int i = 0; i < 3; i++) {
        w.ss[i].open = true;
        open_sess(&w, i, 1, 1);
    }
    for (int i = 0; i < 2; i++) { /* sessions 0 and 1 fill the segment */
        arrive(&w, i, DJ_REQ_STEP, 1, 16, 0);
        dj_sched_next(w.s, w.now, &d);
        act(&w, &d);
    }
    arrive(&w, 2, DJ_REQ_STEP, 1, 16, 0); /* new: waits */
    w.now += 1;
    arrive(&w, 0, DJ_REQ_STEP, 1, 16, 0); /* session 0 grows: waits too */
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_WAIT);
    dj_sched_session_close(w.s, sid(1));
    w.ss[1].held = 0;
    w.ss[1].open = false;
    dj_sched_next(w.s, w.now, &d);
    CHECK_MSG(d.op == DJ_SCHED_RUN && d.req == w.rr[3].id, "op %d req %llu", d.op, (unsigned long long)d.req);
    act(&w, &d);
    world_end(&w);
}

/* Decisions until the scheduler waits with no copy in flight (virtual time
 * moves on while copies are). */
static void settle(world *w) {
    for (int k = 0; k < 400; k++) {
        dj_sched_decision d;
        dj_sched_next(w->s, w->now, &d);
        if (act(w, &d)) {
            consistent(w);
            continue;
        }
        bool xfer = false;
        for (int i = 0; i < MAX_S; i++) xfer |= w->ss[i].xfer != 0;
        if (!xfer) return;
        w->now++;
        transfers(w);
    }
    CHECK_MSG(false, "the scheduler did not settle");
}

/* Tenants share the pool by their quota: group 0 (sessions 0, 3, .. 15)
 * pauses six sessions of 4 pages under a segment quota of 8: four go as far
 * as its pool share of 8 lets them (its fifth and sixth requests wait on its
 * own share), and group 1 - same class, queued behind those - still gets its
 * idle session swapped out and its third request served. Without the share
 * group 0 fills the 16-page pool and group 1 waits for it; without the
 * quota-only rule group 1 waits behind group 0's requests. */
static void pool_share(void) {
    world w;
    if (!world_start(&w, (dj_sched_config){.max_running = 4, .max_rows = 64, .pages_total = 100, .pool_pages = 16,
                              .idle_ms = 5, .lifo_age_ms = 1000, .page_in_ms = 1.0, .quota_pages = 8,
                              .pool_quota_pages = 8})) return;
    for (int i = 0; i < 16; i += 3) {
        w.ss[i].open = true;
        open_sess(&w, i, 0, 2);
    }
    for (int i = 1; i < 8; i += 3) {
        w.ss[i].open = true;
        open_sess(&w, i, 1, 2);
    }
    int served = 0;
    for (int i = 0; i < 16; i += 3) { /* group 0: a 16-token STEP each, then paused */
        arrive(&w, i, DJ_REQ_STEP, 2, 16, 0);
        settle(&w);
        served += !w.rr[w.n_req - 1].alive;
        w.ss[i].paused = true;
        dj_sched_pause(w.s, sid(i), 0, w.now);
        w.now += 10;
    }
    uint64_t pooled0 = 0;
    for (int i = 0; i < 16; i += 3) pooled0 += w.ss[i].pooled;
    CHECK_MSG(served == 4 && pooled0 == 8, "group 0: %d of 6 STEPs served, %llu pool pages (share 8)", served,
              (unsigned long long)pooled0);
    for (int i = 1; i < 8; i += 3) { /* group 1: the same, left idle */
        arrive(&w, i, DJ_REQ_STEP, 2, 16, 0);
        settle(&w);
        CHECK_MSG(!w.rr[w.n_req - 1].alive, "group 1's STEP on session %d waits (group 0 holds %llu pool pages)", i,
                  (unsigned long long)pooled0);
        w.now += 10;
    }
    CHECK(w.ss[1].pooled == 4 && w.ss[4].held == 4 && w.ss[7].held == 4);
    /* group 0's waiting requests are still there: its own share holds them */
    CHECK(w.rr[4].alive && w.rr[5].alive);
    dj_sched_stats st;
    dj_sched_get_stats(w.s, w.now, &st);
    CHECK(st.pool_used == 12 && st.waiting[2] == 2);
    world_end(&w);
}

/* Batch-class overload serves newest first, but not past the age limit. */
static void lifo_with_age(void) {
    world w;
    if (!world_start(&w, (dj_sched_config){.max_running = 1, .max_rows = 64, .pages_total = 100, .idle_ms = 5,
                              .lifo_age_ms = 30, .page_in_ms = 1.0})) return;
    for (int i = 0; i < 6; i++) {
        w.ss[i].open = true;
        open_sess(&w, i, 1, 2);
    }
    dj_sched_decision d;
    arrive(&w, 0, DJ_REQ_GEN, 2, 2, 3); /* takes the one running slot */
    dj_sched_next(w.s, w.now, &d);
    act(&w, &d);
    for (int i = 1; i < 5; i++) arrive(&w, i, DJ_REQ_GEN, 2, 2, 3); /* 4 waiting > 2 x max_running */
    while (w.rr[0].alive) {
        dj_sched_next(w.s, w.now, &d);
        act(&w, &d);
    }
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_RUN && d.req == w.rr[4].id); /* newest */
    act(&w, &d);
    w.now += 31; /* now the oldest is past the age limit */
    while (w.rr[4].alive) {
        dj_sched_next(w.s, w.now, &d);
        act(&w, &d);
    }
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_RUN && d.req == w.rr[1].id); /* oldest */
    dj_sched_free(w.s);
}

/* Session i fed `tokens` in one STEP (run at once), then paused for expect ms. */
static void fill_and_pause(world *w, int i, uint32_t tokens, uint64_t expect) {
    dj_sched_decision d;
    w->ss[i].open = true;
    open_sess(w, i, 1, 1);
    arrive(w, i, DJ_REQ_STEP, 1, tokens, 0);
    dj_sched_next(w->s, w->now, &d);
    CHECK(d.op == DJ_SCHED_RUN);
    act(w, &d);
    w->ss[i].paused = true;
    dj_sched_pause(w->s, sid(i), expect, w->now);
}

/* Decisions until a RUN of session i's request (done at once); every
 * SWAP_OUT/SPILL on the way appended to ops as "o<i>"/"s<i>". */
static void run_through(world *w, int i, char *ops, size_t cap) {
    for (int k = 0; k < 20; k++) {
        dj_sched_decision d;
        dj_sched_next(w->s, w->now, &d);
        if (d.op == DJ_SCHED_WAIT) {
            w->now += 10;
            transfers(w);
            continue;
        }
        if (d.op == DJ_SCHED_SWAP_OUT || d.op == DJ_SCHED_SPILL)
            snprintf(ops + strlen(ops), cap - strlen(ops), "%c%d ", d.op == DJ_SCHED_SPILL ? 's' : 'o', sidx(d.sess));
        act(w, &d);
        if (d.op == DJ_SCHED_RUN && d.sess == sid(i)) return;
    }
    CHECK_MSG(false, "session %d's request did not run: %s", i, ops);
}

/* The disk tier: when the pool is full, the pooled session wanted furthest
 * ahead goes on to disk, then the next victim into the pool; a session on
 * disk is prefetched earlier than one in the pool by the disk's rate. */
static void disk_spill_order(void) {
    world w;
    if (!world_start(&w, (dj_sched_config){.max_running = 4, .max_rows = 64, .pages_total = 12, .pool_pages = 8,
                              .idle_ms = 1000000, .lifo_age_ms = 1000, .page_in_ms = 1.0, .disk_pages = 8,
                              .disk_page_ms = 10.0})) return;
    /* A, B, C: 4 pages each, paused: expected back in 1000, 100000 and 5000 ms */
    fill_and_pause(&w, 0, 16, 1000);
    fill_and_pause(&w, 1, 16, 100000);
    fill_and_pause(&w, 2, 16, 5000);
    char ops[128] = "";
    for (int i = 3; i < 6; i++) { /* D, E, F want 4 pages each (and stay: not idle): B, C, A go out */
        w.ss[i].open = true;
        open_sess(&w, i, 1, 1);
        arrive(&w, i, DJ_REQ_STEP, 1, 16, 0);
        run_through(&w, i, ops, sizeof ops);
    }
    /* B (furthest) and C into the pool; then A's turn finds it full: B, wanted furthest ahead, goes on to disk */
    CHECK_MSG(strcmp(ops, "o1 o2 s1 o0 ") == 0, "the moves: %s", ops);
    consistent(&w);
    CHECK(w.ss[1].on_disk && !w.ss[2].on_disk && w.pool_used == 8 && w.disk_used == 4);
    dj_sched_stats st;
    dj_sched_get_stats(w.s, w.now, &st);
    CHECK(st.spills == 1 && st.on_disk == 1 && st.disk_pages == 8 && st.disk_used == 4);
    /* prefetch lead: A (pool, 4 pages x 1 ms x 1.5 + 1) is due 7 ms before its end; B (disk, 4 x 10 x 1.5 + 1)
     * 61 ms before */
    dj_sched_decision d;
    dj_sched_next(w.s, w.now, &d);
    CHECK(d.op == DJ_SCHED_WAIT);
    const uint64_t a_at = 1000 - 7, b_at = 100000 - 61;
    CHECK_MSG(d.wake_ms == a_at, "next wake %llu, want A's %llu", (unsigned long long)d.wake_ms,
              (unsigned long long)a_at);
    /* the segment frees up (D, E, F close): B comes back from disk ahead of its end, by the disk's lead */
    for (int i = 3; i < 6; i++) {
        dj_sched_session_close(w.s, sid(i));
        w.ss[i].held = 0;
        w.ss[i].open = false;
    }
    w.now = b_at + 1; /* before the pool's lead (7 ms), after the disk's (61 ms) */
    bool b_back = false;
    for (int k = 0; k < 10 && !b_back; k++) {
        dj_sched_next(w.s, w.now, &d);
        if (d.op == DJ_SCHED_WAIT) break;
        b_back = d.op == DJ_SCHED_SWAP_IN && d.sess == sid(1);
        if (d.op == DJ_SCHED_SWAP_IN && w.ss[sidx(d.sess)].on_disk) CHECK(d.sess == sid(1));
        if (d.op == DJ_SCHED_SWAP_IN) {
            fsess *f = &w.ss[sidx(d.sess)];
            f->held = f->pooled;
            f->xfer = 2;
            f->xfer_done = w.now;
            dj_sched_swap_started(w.s, d.sess, true);
            transfers(&w);
        } else {
            act(&w, &d);
        }
    }
    CHECK_MSG(b_back, "B did not come back from disk %llu ms before its expected end", 100000 - (unsigned long long)w.now);
    CHECK(w.disk_used == 0);
    world_end(&w);
}

/* Captured-graph runs admitted by their planned bytes: the bound and the group quota hold at every
 * moment, a run larger than either is refused naming its bytes, one waiting for its own group's
 * quota holds back no other group, a higher class goes first, every run ends (random traces). */
static void graph_runs(void) {
    const dj_sched_config cfg = {.max_running = 4, .max_rows = 64, .pages_total = 64, .graph_bytes = 1000,
                                 .graph_quota_bytes = 600};
    dj_sched_t *s = NULL;
    CHECK_OK(dj_sched_new(&cfg, &s));
    dj_sched_decision d;
    /* refused: over the quota, then over the bound (quota 0 here would name --graph-gb) */
    CHECK_OK(dj_sched_arrive_graph(s, 1, 7, 1, 700, 0));
    dj_sched_next(s, 0, &d);
    CHECK(d.op == DJ_SCHED_REFUSE && d.req == 1);
    CHECK_MSG(strstr(dj_sched_refuse_reason(s), "700 bytes") && strstr(dj_sched_refuse_reason(s), "600 bytes") &&
                  strstr(dj_sched_refuse_reason(s), "--graph-quota-gb"),
              "reason: %s", dj_sched_refuse_reason(s));
    dj_sched_done(s, 1, 0);
    CHECK_ST(dj_sched_arrive_graph(s, 2, 7, 1, 500, 0), DJ_OK);
    CHECK_ST(dj_sched_arrive_graph(s, 2, 7, 1, 500, 0), DJ_EBUSY);
    /* group 7 holds 500 of its 600: its next 200 waits, group 8's 400 goes by it */
    CHECK_OK(dj_sched_arrive_graph(s, 3, 7, 1, 200, 0));
    CHECK_OK(dj_sched_arrive_graph(s, 4, 8, 1, 400, 0));
    uint64_t ran[8];
    int nr = 0;
    for (int k = 0; k < 3; k++) {
        dj_sched_next(s, 1, &d);
        if (d.op != DJ_SCHED_RUN) break;
        ran[nr++] = d.req;
    }
    CHECK_MSG(nr == 2 && ran[0] == 2 && ran[1] == 4, "ran %d: %llu %llu", nr, (unsigned long long)ran[0],
              (unsigned long long)(nr > 1 ? ran[1] : 0));
    dj_sched_stats st;
    dj_sched_get_stats(s, 1, &st);
    CHECK(st.graph_used == 900 && st.graph_bytes == 1000 && st.waiting[1] == 1);
    CHECK_OK(dj_sched_check(s));
    /* the bound: 900 held, a realtime 300 and a batch 50 wait behind it (the batch one too: FIFO by class) */
    CHECK_OK(dj_sched_arrive_graph(s, 5, 9, 2, 50, 2));
    CHECK_OK(dj_sched_arrive_graph(s, 6, 9, 0, 300, 3));
    dj_sched_next(s, 3, &d);
    CHECK_MSG(d.op == DJ_SCHED_WAIT, "op %d req %llu", d.op, (unsigned long long)d.req);
    dj_sched_done(s, 2, 4); /* 400 held */
    nr = 0;
    for (int k = 0; k < 4; k++) {
        dj_sched_next(s, 4, &d);
        if (d.op != DJ_SCHED_RUN) break;
        ran[nr++] = d.req;
    }
    /* realtime 300 first, then group 7's 200 (its quota has room again), then batch 50: 950 */
    CHECK_MSG(nr == 3 && ran[0] == 6 && ran[1] == 3 && ran[2] == 5, "ran %d: %llu %llu %llu", nr,
              (unsigned long long)ran[0], (unsigned long long)ran[1], (unsigned long long)ran[2]);
    CHECK_OK(dj_sched_check(s));
    for (uint64_t r = 3; r <= 6; r++) dj_sched_done(s, r, 5);
    dj_sched_get_stats(s, 5, &st);
    CHECK(st.graph_used == 0);
    dj_sched_free(s);

    /* random traces: bytes, groups and classes drawn; a run takes 1-20 virtual ms */
    for (int t = 0; t < 200; t++) {
        const dj_sched_config c2 = {.max_running = 2, .max_rows = 8, .pages_total = 8,
                                    .graph_bytes = 1 + dj_test_rand() % 2000, .graph_quota_bytes = dj_test_rand() % 1500};
        CHECK_OK(dj_sched_new(&c2, &s));
        enum { N = 60 };
        uint64_t bytes[N + 1] = {0}, group[N + 1] = {0}, end[N + 1] = {0};
        int state[N + 1] = {0}; /* 0 not yet, 1 waiting, 2 running, 3 done, 4 refused */
        uint64_t now = 0;
        int arrived = 0, finished = 0;
        while (finished < N && now < 100000) {
            if (arrived < N && dj_test_rand() % 3 == 0) {
                const int i = ++arrived;
                bytes[i] = dj_test_rand() % 1200, group[i] = 1 + dj_test_rand() % 3;
                CHECK_OK(dj_sched_arrive_graph(s, (uint64_t)i, group[i], (uint32_t)(dj_test_rand() % 3), bytes[i], now));
                state[i] = 1;
            }
            for (;;) {
                dj_sched_next(s, now, &d);
                if (d.op == DJ_SCHED_WAIT) break;
                CHECK(d.op == DJ_SCHED_RUN || d.op == DJ_SCHED_REFUSE);
                if (d.op != DJ_SCHED_RUN && d.op != DJ_SCHED_REFUSE) break;
                const int i = (int)d.req;
                CHECK(state[i] == 1);
                if (d.op == DJ_SCHED_REFUSE) {
                    CHECK(bytes[i] > c2.graph_bytes || (c2.graph_quota_bytes && bytes[i] > c2.graph_quota_bytes));
                    state[i] = 4, finished++;
                    dj_sched_done(s, d.req, now);
                    continue;
                }
                state[i] = 2, end[i] = now + 1 + dj_test_rand() % 20;
            }
            uint64_t held = 0, by_group[4] = {0};
            for (int i = 1; i <= arrived; i++)
                if (state[i] == 2) held += bytes[i], by_group[group[i]] += bytes[i];
            CHECK(held <= c2.graph_bytes);
            for (int g = 1; g < 4; g++) CHECK(!c2.graph_quota_bytes || by_group[g] <= c2.graph_quota_bytes);
            CHECK_OK(dj_sched_check(s));
            now++;
            for (int i = 1; i <= arrived; i++)
                if (state[i] == 2 && end[i] <= now) {
                    dj_sched_done(s, (uint64_t)i, now);
                    state[i] = 3, finished++;
                }
            if (arrived < N) continue;
        }
        CHECK_MSG(finished == N, "trace %d: %d of %d graph runs ended", t, finished, N);
        dj_sched_free(s);
    }
}

int main(void) {
    dj_test_seeds();
    disk_spill_order();
    realtime_within_a_step();
    swap_and_prefetch();
    lifo_with_age();
    exchange();
    continuing_first();
    pool_share();
    graph_runs();
    for (int pol = 0; pol < 3; pol++)
        for (int t = 0; t < TRACES; t++) trace((dj_swap_policy)pol, 200, t % 2 == 0);
    disk_traces = true;
    for (int t = 0; t < TRACES; t++) trace(DJ_SWAP_SEMANTIC, 200, false);
    disk_traces = false;
    CHECK_MSG(disk_spills > (uint64_t)TRACES && disk_lost > 0, "the disk traces spilled %llu times, lost %llu",
              (unsigned long long)disk_spills, (unsigned long long)disk_lost);
    fprintf(stderr, "disk traces: %llu spills, %llu read-backs lost\n", (unsigned long long)disk_spills,
            (unsigned long long)disk_lost);
    dj_sched_config bad = {.max_running = 0, .max_rows = 1, .pages_total = 1};
    dj_sched_t *s = NULL;
    CHECK_ST(dj_sched_new(&bad, &s), DJ_EINVAL);
    dj_swap_policy p;
    CHECK_OK(dj_swap_policy_parse("recompute", &p));
    CHECK(p == DJ_SWAP_RECOMPUTE);
    CHECK_ST(dj_swap_policy_parse("lru", &p), DJ_EINVAL);
    return dj_test_finish("test_sched");
}
