/* test_swap.c: KV swap on the CPU engine - random traces of sessions stepping,
 * swapping out and in (restores land in other pages) and fillers taking pages,
 * every logit bit-identical to an unswapped twin in a second engine, the VMU
 * and pool invariants and byte accounting checked after every operation,
 * DJ_ENOSPC paths changing nothing; once with the CPU's synchronous copies and
 * once through fake asynchronous copy hooks (transfers that complete a few
 * polls later, copying only then); and memory sized from the machine. */
#include <stdlib.h>
#include <string.h>

#include "djinn/engine.h"
#include "exec/engine_impl.h"
#include "testutil.h"
#include "vmu/vmu_impl.h"

/* Sanitizer builds run every step some 20x slower: shorter traces, one model. */
#if defined(__SANITIZE_ADDRESS__)
#define TRACE_OPS 100
#define TRACE_MODELS 1
#else
#define TRACE_OPS 300
#define TRACE_MODELS 2
#endif

#define N_SESS 5
#define N_FILL 6
#define CTX 128
#define PAGE 4096

static const char *MODELS[] = {"llama3", "qwen2"};

/* ---- fake asynchronous copy hooks over the CPU backend ----
 * A transfer completes after `polls` queries. D2H copies happen at completion
 * (pages freed early would show); H2D copies at xfer_order or completion,
 * whichever comes first (a step not ordered after its restore would read
 * unrestored pages). */
struct dj_backend_xfer {
    bool to_host, copied;
    int polls;
    dj_copy_span *spans;
    size_t n;
};

static int n_xfers_live;

static void fake_copy(dj_backend_xfer_t *x) {
    if (x->copied) return;
    for (size_t i = 0; i < x->n; i++) {
        if (x->to_host) memcpy(x->spans[i].host, x->spans[i].dev, x->spans[i].bytes);
        else memcpy(x->spans[i].dev, x->spans[i].host, x->spans[i].bytes);
    }
    x->copied = true;
}

static dj_status fake_start(dj_backend_t *be, bool to_host, const dj_copy_span *spans, size_t n,
                            dj_backend_xfer_t **out) {
    (void)be;
    dj_backend_xfer_t *x = calloc(1, sizeof *x);
    x->spans = malloc((n ? n : 1) * sizeof *spans);
    memcpy(x->spans, spans, n * sizeof *spans);
    x->n = n;
    x->to_host = to_host;
    x->polls = (int)(dj_test_rand() % 4);
    n_xfers_live++;
    *out = x;
    return DJ_OK;
}

static dj_status fake_query(dj_backend_t *be, dj_backend_xfer_t *x, double *seconds) {
    (void)be;
    if (x->polls-- > 0) return DJ_EBUSY;
    fake_copy(x);
    if (seconds) *seconds = 1e-6;
    return DJ_OK;
}

static dj_status fake_order(dj_backend_t *be, dj_backend_xfer_t *x) {
    (void)be;
    if (!x->to_host) fake_copy(x);
    return DJ_OK;
}

static void fake_free(dj_backend_t *be, dj_backend_xfer_t *x) {
    (void)be;
    if (!x) return;
    fake_copy(x);
    free(x->spans);
    free(x);
    n_xfers_live--;
}

static dj_backend_vtbl fake_vt;

static void make_async(dj_engine_t *e) {
    dj_backend_t *be = dj_engine_backend(e);
    fake_vt = *be->vt;
    fake_vt.xfer_start = fake_start;
    fake_vt.xfer_query = fake_query;
    fake_vt.xfer_order = fake_order;
    fake_vt.xfer_free = fake_free;
    be->vt = &fake_vt;
}

/* ---- engines ---- */

/* edges() counts free pages exactly: its engine has no prefix cache (the
 * traces run with it, and check its pages too) */
static bool no_prefix_cache;
static const char *kv_dtype; /* NULL: f32 pages; "fp8": the traces again on f8 pages */

static dj_engine_t *new_engine(size_t data_pages) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.no_prefix_cache = no_prefix_cache;
    ec.kv_dtype = kv_dtype;
    ec.n_threads = 2;
    ec.max_step_tokens = 32;
    const size_t total = (size_t)8 << 20;
    dj_vmu_config_default(&ec.vmu, total);
    ec.vmu.page_bytes = PAGE;
    ec.vmu.text_frac = 0.5;
    ec.vmu.stack_frac = 0.3;
    /* f8 K/V: the engine grows a power-of-two page for the exponents */
    const size_t page = PAGE + (kv_dtype && strcmp(kv_dtype, "fp8") == 0 ? DJ_KV_F8_PAGE_EXTRA : 0);
    ec.vmu.data_frac = ((double)data_pages + 0.5) * page / (double)total;
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    CHECK(dj_vmu_page_bytes(dj_engine_vmu(e)) == page);
    return e;
}

static dj_model_t *load(dj_engine_t *e, const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    return m;
}

typedef struct world {
    dj_engine_t *e, *ref;       /* the swapping engine, the twins' engine */
    dj_model_t *m, *mref;
    dj_session_t *s[N_SESS];    /* in e */
    dj_session_t *twin[N_SESS]; /* in ref, never swapped */
    dj_session_t *fill[N_FILL]; /* in e: take pages so restores land elsewhere */
    uint32_t V;
    float *la, *lb;             /* [N_SESS][V] */
    bool async;
    int moved, restores, outs, full_pool, full_data, busy, cancels;
} world;

/* Every page and slot accounted for. */
static void check_world(world *w, const char *what) {
    CHECK_MSG(dj__vmu_check(dj_engine_vmu(w->e)) == DJ_OK, "%s: VMU: %s", what, dj_last_error());
    CHECK_MSG(dj__swap_check(w->e) == DJ_OK, "%s: pool: %s", what, dj_last_error());
    dj_vmu_stats vs;
    dj_vmu_get_stats(dj_engine_vmu(w->e), &vs);
    dj_swap_stats ss;
    dj_engine_swap_stats(w->e, &ss);
    size_t data = 0, pool = 0;
    const size_t page = dj_vmu_page_bytes(dj_engine_vmu(w->e)); /* PAGE, or more for f8 K/V */
    for (int i = 0; i < N_SESS + N_FILL; i++) {
        const dj_session_t *s = i < N_SESS ? w->s[i] : w->fill[i - N_SESS];
        if (!s) continue;
        const dj_kv_residency r = dj_session_residency(s);
        const size_t kv = dj_session_kv_bytes(s);
        CHECK(kv == (size_t)dj_session_kv_pages(s) * page);
        const size_t held = dj_vmu_session_pages(s->vs) * page;
        /* full blocks published to the prefix cache are the cache's pages */
        const size_t shared = (size_t)s->model->cfg.n_layers * dj__prefix_shared_blocks(s) * page;
        CHECK_MSG(r == DJ_KV_SWAPPED ? held == 0 && shared == 0 : held + shared == kv, "%s: session %d is %s with "
                  "%zu bytes of pages and %zu shared for %zu of KV", what, i, dj_kv_residency_name(r), held, shared, kv);
        data += held;
        if (r != DJ_KV_RESIDENT) pool += (size_t)s->n_slots * page;
        if (!w->async) CHECK(r == DJ_KV_RESIDENT || r == DJ_KV_SWAPPED);
    }
    dj_prefix_stats ps;
    dj_engine_prefix_stats(w->e, &ps);
    CHECK_MSG(data + ps.pages * page == vs.data.used, "%s: sessions hold %zu bytes of pages, the prefix cache %zu, "
              "the VMU says %zu", what, data, ps.pages * page, vs.data.used);
    dj_session_t *all[N_SESS + N_FILL];
    size_t n_all = 0;
    for (int i = 0; i < N_SESS + N_FILL; i++) {
        dj_session_t *s = i < N_SESS ? w->s[i] : w->fill[i - N_SESS];
        if (s) all[n_all++] = s;
    }
    CHECK_MSG(dj__prefix_check(dj__engine_prefix(w->e), all, n_all) == DJ_OK, "%s: prefix cache: %s", what,
              dj_last_error());
    CHECK_MSG(pool <= ss.used && (w->async || pool == ss.used), "%s: sessions hold %zu pool bytes, the pool says %zu",
              what, pool, ss.used);
    CHECK(ss.used <= ss.capacity && ss.peak >= ss.used);
    if (!w->async) CHECK(ss.in_flight == 0);
}

static void random_ids(int32_t *ids, uint32_t n, uint32_t V) {
    for (uint32_t t = 0; t < n; t++) ids[t] = (int32_t)(dj_test_rand() % V);
}

/* Session i (and its twin) fed n tokens; logits compared bit for bit. */
static void step_one(world *w, int i, uint32_t n) {
    dj_session_t *s = w->s[i];
    if (dj_session_pos(s) + n > CTX) n = CTX - dj_session_pos(s);
    if (n == 0) return;
    int32_t ids[40];
    random_ids(ids, n, w->V);
    const uint32_t pos = dj_session_pos(s);
    const dj_kv_residency r = dj_session_residency(s);
    const dj_status st = dj_session_step(w->e, s, ids, n, w->la);
    if (r == DJ_KV_SWAPPED || r == DJ_KV_SWAPPING_OUT) {
        CHECK_ST(st, DJ_EBUSY);
        CHECK(strstr(dj_last_error(), "swapped out") != NULL);
        CHECK(dj_session_pos(s) == pos && dj_session_residency(s) == r);
        w->busy++;
        return;
    }
    if (st == DJ_ENOSPC) { /* the data segment is full: nothing moved */
        CHECK(dj_session_pos(s) == pos);
        return;
    }
    CHECK_OK(st);
    CHECK_OK(dj_session_step(w->ref, w->twin[i], ids, n, w->lb));
    CHECK_MSG(!memcmp(w->la, w->lb, w->V * sizeof(float)), "session %d at %u: logits after %u tokens differ from "
              "its unswapped twin", i, pos, n);
}

/* A decode step of the resident sessions among a random subset, batched. */
static void step_batch(world *w) {
    dj_session_t *b[N_SESS], *t[N_SESS];
    int idx[N_SESS];
    uint32_t B = 0;
    for (int i = 0; i < N_SESS; i++) {
        const dj_kv_residency r = dj_session_residency(w->s[i]);
        if ((r == DJ_KV_RESIDENT || r == DJ_KV_RESTORING) && dj_session_pos(w->s[i]) < CTX && dj_test_rand() % 2) {
            idx[B] = i;
            t[B] = w->twin[i];
            b[B++] = w->s[i];
        }
    }
    if (B == 0) return;
    int32_t ids[N_SESS];
    random_ids(ids, B, w->V);
    const dj_status st = dj_engine_step_batch(w->e, b, ids, B, w->la, NULL, NULL);
    if (st == DJ_ENOSPC) return;
    CHECK_OK(st);
    CHECK_OK(dj_engine_step_batch(w->ref, t, ids, B, w->lb, NULL, NULL));
    for (uint32_t r = 0; r < B; r++)
        CHECK_MSG(!memcmp(w->la + (size_t)r * w->V, w->lb + (size_t)r * w->V, w->V * sizeof(float)),
                  "batched session %d: logits differ from its unswapped twin", idx[r]);
}

/* The pages session i holds, in table order (layer, block). */
static void table_of(const dj_session_t *s, uint32_t *out) {
    const uint32_t L = s->model->cfg.n_layers;
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t b = 0; b < s->n_blocks; b++) out[l * s->n_blocks + b] = s->block_table[(size_t)l * s->max_blocks + b];
}

static void swap_out(world *w, int i) {
    dj_session_t *s = w->s[i];
    dj_swap_stats before;
    dj_engine_swap_stats(w->e, &before);
    dj_vmu_stats vb;
    dj_vmu_get_stats(dj_engine_vmu(w->e), &vb);
    const dj_kv_residency r = dj_session_residency(s);
    const dj_status st = dj_session_swap_out(w->e, s);
    if (r == DJ_KV_RESTORING) {
        CHECK_ST(st, DJ_EBUSY);
        return;
    }
    if (st == DJ_ENOSPC) {
        dj_swap_stats after;
        dj_engine_swap_stats(w->e, &after);
        dj_vmu_stats va;
        dj_vmu_get_stats(dj_engine_vmu(w->e), &va);
        CHECK(dj_session_residency(s) == r && after.used == before.used && va.data.used == vb.data.used);
        CHECK(strstr(dj_last_error(), "swap pool full") != NULL);
        w->full_pool++;
        return;
    }
    CHECK_OK(st);
    const dj_kv_residency now = dj_session_residency(s);
    CHECK(now == DJ_KV_SWAPPED || (w->async && now == DJ_KV_SWAPPING_OUT));
    if (r == DJ_KV_RESIDENT) w->outs++;
}

static void swap_in(world *w, int i) {
    dj_session_t *s = w->s[i];
    const dj_kv_residency r = dj_session_residency(s);
    const uint32_t np = dj_session_kv_pages(s);
    dj_vmu_stats vb;
    dj_vmu_get_stats(dj_engine_vmu(w->e), &vb);
    const uint32_t need = dj_session_pages_for(s, dj_session_pos(s));
    CHECK(r == DJ_KV_SWAPPED ? need == np : need == 0);
    const dj_status st = dj_session_swap_in(w->e, s);
    if (st == DJ_ENOSPC) {
        CHECK(r == DJ_KV_SWAPPED && vb.pages_free < need);
        dj_vmu_stats va;
        dj_vmu_get_stats(dj_engine_vmu(w->e), &va);
        CHECK(dj_session_residency(s) == r && va.pages_free == vb.pages_free);
        CHECK(strstr(dj_last_error(), "data segment full") != NULL);
        w->full_data++;
        return;
    }
    CHECK_OK(st);
    if (r == DJ_KV_SWAPPING_OUT) {
        CHECK(dj_session_residency(s) == DJ_KV_RESIDENT);
        w->cancels++;
    }
    if (r == DJ_KV_SWAPPED && np) w->restores++;
}

/* Fillers: a new session stepped a few tokens, or one freed. */
static void filler(world *w) {
    const int k = (int)(dj_test_rand() % N_FILL);
    if (w->fill[k]) {
        dj_session_free(w->e, w->fill[k]);
        w->fill[k] = NULL;
        return;
    }
    CHECK_OK(dj_session_new(w->e, w->m, CTX, 0, &w->fill[k]));
    if (!w->fill[k]) return;
    int32_t ids[20];
    const uint32_t n = 1 + (uint32_t)(dj_test_rand() % 20);
    random_ids(ids, n, w->V);
    const dj_status st = dj_session_step(w->e, w->fill[k], ids, n, NULL);
    CHECK(st == DJ_OK || st == DJ_ENOSPC);
}

static void trace(const char *name, bool async) {
    world w;
    memset(&w, 0, sizeof w);
    w.async = async;
    w.e = new_engine(56); /* 56 pages: fewer than five full sessions (16 each) */
    w.ref = new_engine(200);
    if (!w.e || !w.ref) goto done;
    if (async) make_async(w.e);
    const size_t page = dj_vmu_page_bytes(dj_engine_vmu(w.e)); /* PAGE, or more for f8 K/V */
    CHECK_OK(dj_engine_swap_init(w.e, (size_t)20 * page + 100)); /* room for one full session and a bit */
    w.m = load(w.e, name);
    w.mref = load(w.ref, name);
    if (!w.m || !w.mref) goto done;
    w.V = dj_model_get_config(w.m)->vocab_size;
    w.la = malloc((size_t)N_SESS * w.V * sizeof(float));
    w.lb = malloc((size_t)N_SESS * w.V * sizeof(float));
    for (int i = 0; i < N_SESS; i++) {
        CHECK_OK(dj_session_new(w.e, w.m, CTX, 0, &w.s[i]));
        CHECK_OK(dj_session_new(w.ref, w.mref, CTX, 0, &w.twin[i]));
        if (!w.s[i] || !w.twin[i]) goto done;
    }
    if (page != PAGE) { /* f8: at least the positions of PAGE bytes of codes, the exponents past them */
        const dj_model_config *c = dj_model_get_config(w.m);
        const uint32_t want = PAGE / (2 * c->n_kv_heads * c->head_dim);
        CHECK_MSG(w.s[0]->tokens_per_page >= want, "f8 pages of %zu bytes: %u positions of %u kv heads of %u, not %u",
                  page, w.s[0]->tokens_per_page, c->n_kv_heads, c->head_dim, want);
    }
    /* a page the swapping engine's sessions held before being swapped, to see restores move */
    uint32_t before[N_SESS][16];
    bool have[N_SESS] = {0};
    const int failed0 = dj_test_failed;
    /* TRACE_OPS operations, and on (up to 8 times as many) until every path
     * below has been taken: a short trace of an unlucky seed may miss one */
    for (int op = 0; op < TRACE_OPS || (op < 8 * TRACE_OPS && !(w.outs > 0 && w.restores > 0 && w.moved > 0 &&
                                                                  w.busy > 0 && (!async || w.cancels > 0)));
         op++) {
        const int i = (int)(dj_test_rand() % N_SESS);
        const uint32_t pick = (uint32_t)(dj_test_rand() % 100);
        const char *what = "step";
        if (pick < 30) {
            step_one(&w, i, 1 + (uint32_t)(dj_test_rand() % (dj_test_rand() % 4 ? 3 : 24)));
        } else if (pick < 42) {
            what = "batch";
            step_batch(&w);
        } else if (pick < 60) {
            what = "swap out";
            if (dj_session_residency(w.s[i]) == DJ_KV_RESIDENT && dj_session_kv_pages(w.s[i]) &&
                dj_session_kv_pages(w.s[i]) <= 16) {
                table_of(w.s[i], before[i]);
                have[i] = true;
            }
            swap_out(&w, i);
        } else if (pick < 76) {
            what = "swap in";
            const bool was = dj_session_residency(w.s[i]) == DJ_KV_SWAPPED && have[i];
            swap_in(&w, i);
            if (was && dj_session_residency(w.s[i]) != DJ_KV_SWAPPED) {
                uint32_t now[16];
                table_of(w.s[i], now);
                w.moved += memcmp(now, before[i], dj_session_kv_pages(w.s[i]) * sizeof *now) != 0;
                have[i] = false;
            }
        } else if (pick < 86) {
            what = "filler";
            filler(&w);
        } else {
            what = "poll";
            dj_engine_swap_poll(w.e);
        }
        check_world(&w, what);
        if (dj_test_failed > failed0) break;
    }
    /* Free some sessions with transfers possibly in flight, then everything. */
    dj_session_free(w.e, w.s[0]);
    w.s[0] = NULL;
    check_world(&w, "free");
    printf("%s %s: %d swap-outs, %d restores (%d into other pages), %d cancelled, %d steps refused as swapped, "
           "pool full %d, data full %d\n", name, async ? "async" : "sync", w.outs, w.restores, w.moved, w.cancels,
           w.busy, w.full_pool, w.full_data);
    /* the trace did exercise the paths (a full pool is certain only in edges()) */
    CHECK(w.outs > 0 && w.restores > 0 && w.moved > 0 && w.busy > 0);
    if (async) CHECK(w.cancels > 0);
    dj_swap_stats ss;
    dj_engine_swap_stats(w.e, &ss);
    CHECK(ss.swaps_out > 0 && ss.bytes_out >= ss.swaps_out * page && ss.page_bytes == page);
    CHECK(ss.capacity == (size_t)20 * page);
done:
    for (int i = 0; i < N_SESS; i++) {
        dj_session_free(w.e, w.s[i]);
        dj_session_free(w.ref, w.twin[i]);
    }
    for (int k = 0; k < N_FILL; k++) dj_session_free(w.e, w.fill[k]);
    if (w.e) {
        dj_swap_stats ss;
        dj_engine_swap_stats(w.e, &ss);
        CHECK(ss.used == 0 || async); /* cancelled swap-outs may still hold slots until freed */
    }
    dj_model_release(w.e, w.m);
    dj_model_release(w.ref, w.mref);
    dj_engine_free(w.e);
    dj_engine_free(w.ref);
    CHECK(n_xfers_live == 0);
    free(w.la);
    free(w.lb);
}

/* The edges: no pool, an empty session, pool and segment full, re-init, free in any state. */
static void edges(void) {
    dj_engine_t *e = new_engine(40);
    if (!e) return;
    dj_model_t *m = load(e, "llama3");
    dj_session_t *a = NULL, *b = NULL, *z = NULL;
    CHECK_OK(dj_session_new(e, m, CTX, 0, &a));
    CHECK_OK(dj_session_new(e, m, CTX, 0, &b));
    CHECK_OK(dj_session_new(e, m, CTX, 0, &z));
    if (!a || !b || !z) goto done;
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    int32_t ids[100];
    random_ids(ids, 100, V);
    CHECK(dj_session_pages_for(a, 100) == 2 * 7); /* 16 tokens a page, 2 layers */
    CHECK(dj_session_pages_for(a, 100000) == 2 * (CTX / 16));
    CHECK_OK(dj_session_step(e, a, ids, 100, NULL));
    CHECK(dj_session_kv_pages(a) == 14 && dj_session_pages_for(a, 100) == 0 && dj_session_pages_for(a, 113) == 2);
    /* no pool */
    CHECK_ST(dj_session_swap_out(e, a), DJ_ENOSPC);
    CHECK(dj_session_residency(a) == DJ_KV_RESIDENT);
    CHECK_OK(dj_engine_swap_init(e, 0));
    CHECK_ST(dj_engine_swap_init(e, 100), DJ_EINVAL); /* less than a page */
    /* an empty session swaps without a pool */
    CHECK_OK(dj_session_swap_out(e, z));
    CHECK(dj_session_residency(z) == DJ_KV_SWAPPED && dj_session_kv_pages(z) == 0);
    CHECK_ST(dj_session_step(e, z, ids, 1, NULL), DJ_EBUSY);
    CHECK_OK(dj_session_swap_in(e, z));
    CHECK(dj_session_residency(z) == DJ_KV_RESIDENT);
    /* a pool of 10 pages cannot take 14 */
    CHECK_OK(dj_engine_swap_init(e, (size_t)10 * PAGE));
    CHECK_ST(dj_session_swap_out(e, a), DJ_ENOSPC);
    CHECK_OK(dj_engine_swap_init(e, (size_t)20 * PAGE));
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
    CHECK_OK(dj_session_swap_out(e, a));
    CHECK_OK(dj_session_swap_out(e, a)); /* again: nothing to do */
    CHECK(dj_session_residency(a) == DJ_KV_SWAPPED && dj_session_pages_for(a, 100) == 14);
    { /* a batch with a swapped session: refused, nobody moves */
        dj_session_t *two[2] = {z, a};
        const uint32_t pz = dj_session_pos(z);
        CHECK_ST(dj_engine_step_batch(e, two, ids, 2, NULL, NULL, NULL), DJ_EBUSY);
        CHECK(dj_session_pos(z) == pz && dj_session_pos(a) == 100);
        CHECK_ST(dj_session_step_all(e, a, ids, 2, la), DJ_EBUSY);
    }
    CHECK_ST(dj_engine_swap_init(e, (size_t)30 * PAGE), DJ_EBUSY);
    /* fill the data segment: b takes every free page, so a cannot come back */
    dj_vmu_stats vs;
    dj_vmu_get_stats(dj_engine_vmu(e), &vs);
    CHECK(vs.pages_free == 40);
    CHECK_OK(dj_session_step(e, b, ids, 100, NULL)); /* 14 pages */
    CHECK_OK(dj_session_step(e, b, ids, 28, NULL));  /* 128 tokens: 16 pages */
    dj_session_t *c = NULL;
    CHECK_OK(dj_session_new(e, m, CTX, 0, &c));
    CHECK_OK(dj_session_step(e, c, ids, 100, NULL)); /* 14: 30 of 40 held, 10 free */
    CHECK_ST(dj_session_swap_in(e, a), DJ_ENOSPC);
    CHECK(dj_session_residency(a) == DJ_KV_SWAPPED);
    CHECK(dj__swap_check(e) == DJ_OK && dj__vmu_check(dj_engine_vmu(e)) == DJ_OK);
    dj_session_free(e, c);
    /* pool: b cannot go out while a fills 14 of 20 slots */
    CHECK_ST(dj_session_swap_out(e, b), DJ_ENOSPC);
    CHECK_OK(dj_session_swap_in(e, a));
    CHECK(dj_session_residency(a) == DJ_KV_RESIDENT);
    /* a continues as if never swapped: compare with a fresh twin fed the same tokens */
    dj_session_t *t = NULL;
    CHECK_OK(dj_session_new(e, m, CTX, 0, &t));
    if (t) {
        CHECK_OK(dj_session_swap_out(e, b)); /* room for t */
        CHECK_OK(dj_session_step(e, t, ids, 100, NULL));
        CHECK_OK(dj_session_step(e, a, ids + 3, 5, la));
        CHECK_OK(dj_session_step(e, t, ids + 3, 5, lb));
        CHECK(!memcmp(la, lb, V * sizeof *la));
    }
    dj_swap_stats ss;
    dj_engine_swap_stats(e, &ss);
    CHECK(ss.swaps_out == 2 && ss.swaps_in == 1 && ss.bytes_in == (size_t)14 * PAGE);
    CHECK(ss.used == (size_t)16 * PAGE && ss.peak == (size_t)16 * PAGE && ss.in_flight == 0);
    CHECK(dj__swap_check(e) == DJ_OK && dj__vmu_check(dj_engine_vmu(e)) == DJ_OK);
    dj_session_free(e, t);
    dj_session_free(e, b); /* swapped: its slots go back */
    dj_engine_swap_stats(e, &ss);
    CHECK(ss.used == 0);
    CHECK(strcmp(dj_kv_residency_name(DJ_KV_RESTORING), "restoring") == 0);
    free(la);
    free(lb);
    b = NULL;
done:
    dj_session_free(e, a);
    dj_session_free(e, b);
    dj_session_free(e, z);
    dj_model_release(e, m);
    dj_engine_free(e);
}

/* Memory sized from the machine. */
static void sizing(void) {
    const size_t G = (size_t)1 << 30, M = (size_t)1 << 20;
    CHECK(dj_engine_vmu_auto_bytes(79 * G, 80 * G, 0) == 75 * G);       /* 5% of 80 GiB margin */
    CHECK(dj_engine_vmu_auto_bytes(10 * G, 12 * G, 0) == 9 * G);        /* 1 GiB floor */
    CHECK(dj_engine_vmu_auto_bytes(G / 2, 12 * G, 0) == 0);
    CHECK(dj_engine_vmu_auto_bytes(0, 0, 8 * G + 3) == 4 * G);          /* half the host's */
    CHECK(dj_engine_vmu_auto_bytes(0, 0, 3 * M + 5) == M);              /* whole MiB */
    size_t avail = 0;
    CHECK_OK(dj_host_mem_available(&avail));
    CHECK(avail > 0);
    /* A CPU engine sized from the machine (the memory is reserved, not touched;
     * under ASan its shadow costs seconds per run, so the release build alone
     * takes it). */
#if defined(__SANITIZE_ADDRESS__)
    printf("sizing: %zu MiB available (the auto-sized engine is left to the release build)\n", avail / M);
    return;
#endif
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.n_threads = 1;
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    if (e) {
        /* other processes move MemAvailable between the reads: bounds with room */
        size_t avail2 = 0;
        CHECK_OK(dj_host_mem_available(&avail2));
        const size_t hi = avail > avail2 ? avail : avail2;
        dj_vmu_stats vs;
        dj_vmu_get_stats(dj_engine_vmu(e), &vs);
        const size_t total = vs.text.capacity + vs.data.capacity + vs.stack.capacity;
        CHECK_MSG(total > 0 && total <= hi / 10 * 6, "auto VMU of %zu bytes with %zu available", total, hi);
        CHECK(dj_vmu_page_bytes(dj_engine_vmu(e)) == 64 * 1024);
        const size_t pool = dj_engine_swap_default_bytes(e);
        CHECK(pool > 0 && pool <= hi / 10 * 3 && pool % M == 0);
        printf("sizing: %zu MiB available, auto VMU %zu MiB, default pool %zu MiB\n", avail / M, total / M, pool / M);
        dj_engine_free(e);
    }
}

int main(void) {
    dj_test_seeds();
    sizing();
    no_prefix_cache = true;
    edges();
    no_prefix_cache = false;
    for (size_t k = 0; k < TRACE_MODELS; k++) {
        trace(MODELS[k], false);
        trace(MODELS[k], true);
    }
    kv_dtype = "fp8"; /* pages of codes and exponents swap and restore as bytes: the same logits */
    trace(MODELS[0], true);
    return dj_test_finish("test_swap");
}
