/* test_prefix.c: the prefix cache on the CPU engine - sessions sharing full KV
 * blocks by content give logits bit-identical to an engine without the cache
 * (several fixtures, prompts with a shared system prefix, greedy decoding and
 * whole generations); random traces of sessions opening on shared prefixes,
 * stepping, swapping and closing under memory pressure, with references,
 * evictions and every page accounted for after each operation; quotas count
 * shared blocks; the kill switch. */
#include <stdlib.h>
#include <string.h>

#include "djinn/engine.h"
#include "djinn/generate.h"
#include "exec/engine_impl.h"
#include "testutil.h"
#include "vmu/vmu_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#define TRACE_OPS 150
#else
#define TRACE_OPS 400
#endif

#define PAGE 4096
#define CTX 160
#define N_SESS 6
#define N_BASE 3

static dj_engine_t *new_engine(size_t data_pages, bool cache) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.n_threads = 2;
    ec.max_step_tokens = 32;
    ec.no_prefix_cache = !cache;
    /* 4 MiB of text and 2.4 MiB of stack (as 0.5 and 0.3 of 8 MiB), then the pages */
    const size_t text = (size_t)4 << 20, stack = (size_t)2516582, total = text + stack + (data_pages + 1) * PAGE;
    dj_vmu_config_default(&ec.vmu, total);
    ec.vmu.page_bytes = PAGE;
    ec.vmu.text_frac = (double)text / (double)total;
    ec.vmu.stack_frac = (double)stack / (double)total;
    ec.vmu.data_frac = ((double)data_pages + 0.5) * PAGE / (double)total;
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    return e;
}

static dj_model_t *load(dj_engine_t *e, const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, dir, &m));
    return m;
}

static void random_ids(int32_t *ids, uint32_t n, uint32_t V) {
    for (uint32_t t = 0; t < n; t++) ids[t] = (int32_t)(dj_test_rand() % V);
}

static int32_t argmax(const float *l, uint32_t V) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    return (int32_t)best;
}

/* Feeds prompt[n] to a (engine with the cache: mapped first) and b (without),
 * compares the last logits bit for bit; *mapped: ids a took from the cache. */
static dj_status feed_both(dj_engine_t *ea, dj_session_t *a, dj_engine_t *eb, dj_session_t *b, const int32_t *prompt,
                           uint32_t n, float *la, float *lb, uint32_t *mapped, const char *what) {
    const uint32_t pos0 = dj_session_pos(a);
    CHECK_OK(dj_session_map_prefix(ea, a, prompt, n, mapped));
    CHECK(*mapped < n && dj_session_pos(a) == pos0 + *mapped);
    dj_status st = dj_session_step(ea, a, prompt + *mapped, n - *mapped, la);
    if (st != DJ_OK) return st;
    CHECK_OK(dj_session_step(eb, b, prompt, n, lb));
    const uint32_t V = dj_model_get_config(dj_session_model(a))->vocab_size;
    CHECK_MSG(!memcmp(la, lb, V * sizeof(float)), "%s: logits after %u ids (%u from the cache) differ from the engine "
              "without the cache", what, n, *mapped);
    CHECK(dj_session_pos(a) == dj_session_pos(b));
    return DJ_OK;
}

/* ---- exactness on one fixture ---- */

static void exact(const char *name) {
    dj_engine_t *ea = new_engine(600, true), *eb = new_engine(600, false);
    dj_model_t *ma = ea ? load(ea, name) : NULL, *mb = eb ? load(eb, name) : NULL;
    if (!ma || !mb) goto out;
    const uint32_t V = dj_model_get_config(ma)->vocab_size;
    float *la = malloc(V * sizeof(float)), *lb = malloc(V * sizeof(float));
    dj_session_t *a[5] = {0}, *b[5] = {0};
    CHECK_OK(dj_session_new(ea, ma, CTX, 0, &a[0]));
    const uint32_t T = a[0]->tokens_per_page;
    /* a system prompt of 3.5 blocks, then each conversation's own turn */
    int32_t prompt[CTX];
    const uint32_t n_sys = 3 * T + T / 2;
    CHECK(n_sys + 30 < CTX);
    random_ids(prompt, n_sys, V);
    for (int k = 0; k < 5; k++) {
        if (!a[k]) CHECK_OK(dj_session_new(ea, ma, CTX, 0, &a[k]));
        CHECK_OK(dj_session_new(eb, mb, CTX, 0, &b[k]));
        int32_t p[CTX];
        memcpy(p, prompt, n_sys * sizeof *p);
        /* k == 3: the prompt is exactly the first two blocks (one id is always left to feed) */
        const uint32_t n = k == 3 ? 2 * T : n_sys + 1 + (uint32_t)(dj_test_rand() % 20);
        random_ids(p + n_sys, n > n_sys ? n - n_sys : 0, V);
        uint32_t mapped = 0;
        char what[96];
        snprintf(what, sizeof what, "%s conversation %d", name, k);
        CHECK_OK(feed_both(ea, a[k], eb, b[k], p, n, la, lb, &mapped, what));
        const uint32_t want = k == 0 ? 0 : k == 3 ? T : 3 * T;
        CHECK_MSG(mapped == want, "%s: %u ids mapped, want %u (T %u)", what, mapped, want, T);
        /* greedy decoding on top, both engines, alone and batched */
        for (int t = 0; t < 6; t++) {
            const int32_t id = argmax(la, V);
            CHECK_OK(dj_session_step(ea, a[k], &id, 1, la));
            CHECK_OK(dj_session_step(eb, b[k], &id, 1, lb));
            CHECK_MSG(!memcmp(la, lb, V * sizeof(float)), "%s: decode step %d differs", what, t);
        }
    }
    /* a batched decode over every conversation */
    {
        int32_t ids[5];
        random_ids(ids, 5, V);
        float *ba = malloc(5 * (size_t)V * sizeof(float)), *bb = malloc(5 * (size_t)V * sizeof(float));
        CHECK_OK(dj_engine_step_batch(ea, a, ids, 5, ba, NULL, NULL));
        CHECK_OK(dj_engine_step_batch(eb, b, ids, 5, bb, NULL, NULL));
        CHECK_MSG(!memcmp(ba, bb, 5 * (size_t)V * sizeof(float)), "%s: batched decode differs", name);
        free(ba);
        free(bb);
    }
    CHECK_OK(dj__prefix_check(dj__engine_prefix(ea), a, 5));
    dj_prefix_stats ps;
    dj_engine_prefix_stats(ea, &ps);
    CHECK(ps.enabled && ps.hits == 3 + 1 + 3 + 3 && ps.tokens_mapped == ps.hits * T && ps.blocks >= 3);
    dj_prefix_stats off;
    dj_engine_prefix_stats(eb, &off);
    CHECK(!off.enabled && off.blocks == 0);
    /* whole generations (dj_gen, greedy and seeded sampling) on the shared prefix */
    for (int g = 0; g < 2; g++) {
        dj_session_t *sa = NULL, *sb = NULL;
        CHECK_OK(dj_session_new(ea, ma, CTX, 0, &sa));
        CHECK_OK(dj_session_new(eb, mb, CTX, 0, &sb));
        int32_t p[CTX];
        memcpy(p, prompt, n_sys * sizeof *p);
        random_ids(p + n_sys, 7, V);
        dj_gen_params gp;
        memset(&gp, 0, sizeof gp);
        gp.sampling.temperature = g ? 0.8f : 0.0f;
        gp.sampling.top_p = 1.0f;
        gp.sampling.seed = 42;
        gp.max_tokens = 12;
        gp.ignore_eos = true;
        dj_gen_t *ga = NULL, *gb = NULL;
        CHECK_OK(dj_gen_new(ea, sa, p, n_sys + 7, &gp, &ga));
        CHECK_OK(dj_gen_new(eb, sb, p, n_sys + 7, &gp, &gb));
        if (!ga || !gb) break;
        CHECK(dj_gen_cached(ga) == 3 * T && dj_gen_cached(gb) == 0);
        for (int guard = 0; guard < 100 && dj_gen_finished(ga) == DJ_GEN_RUNNING; guard++) {
            dj_gen_event va, vb;
            CHECK_OK(dj_gen_step(ea, &ga, 1, &va));
            if (dj_gen_finished(gb) == DJ_GEN_RUNNING) CHECK_OK(dj_gen_step(eb, &gb, 1, &vb));
        }
        while (dj_gen_finished(gb) == DJ_GEN_RUNNING) {
            dj_gen_event vb;
            if (dj_gen_step(eb, &gb, 1, &vb) != DJ_OK) break;
        }
        CHECK(dj_gen_n_generated(ga) == 12 && dj_gen_n_generated(gb) == 12);
        CHECK_MSG(!memcmp(dj_gen_ids(ga), dj_gen_ids(gb), 12 * sizeof(int32_t)), "%s: generation %d (%s) differs",
                  name, g, g ? "sampled" : "greedy");
        dj_gen_free(ga);
        dj_gen_free(gb);
        dj_session_free(ea, sa);
        dj_session_free(eb, sb);
    }
    for (int k = 0; k < 5; k++) {
        dj_session_free(ea, a[k]);
        dj_session_free(eb, b[k]);
    }
    dj_engine_prefix_stats(ea, &ps);
    CHECK(ps.blocks == ps.blocks_unreferenced && ps.pages == ps.pages_unreferenced); /* all cached, none mapped */
    CHECK_OK(dj__vmu_check(dj_engine_vmu(ea)));
    free(la);
    free(lb);
out:
    dj_model_release(ea, ma);
    dj_model_release(eb, mb);
    dj_engine_free(ea);
    dj_engine_free(eb);
}

/* ---- random traces under memory pressure ---- */

typedef struct world {
    dj_engine_t *e, *ref;
    dj_model_t *m, *mref;
    dj_session_t *s[N_SESS], *twin[N_SESS];
    int32_t base[N_BASE][CTX];
    uint32_t V, T, L;
    float *la, *lb;
    int opened, mapped_opens, full, swaps_shared, restores;
} world;

static void check_world(world *w, const char *what) {
    CHECK_MSG(dj__vmu_check(dj_engine_vmu(w->e)) == DJ_OK, "%s: VMU: %s", what, dj_last_error());
    CHECK_MSG(dj__swap_check(w->e) == DJ_OK, "%s: pool: %s", what, dj_last_error());
    dj_session_t *all[N_SESS];
    size_t n = 0, priv = 0;
    for (int i = 0; i < N_SESS; i++) {
        if (!w->s[i]) continue;
        all[n++] = w->s[i];
        const size_t held = dj_vmu_session_pages(w->s[i]->vs);
        priv += held;
        const uint32_t shared = dj__prefix_shared_blocks(w->s[i]);
        if (dj_session_residency(w->s[i]) == DJ_KV_SWAPPED) CHECK(held == 0 && shared == 0);
        else CHECK_MSG(held + (size_t)shared * w->L == dj_session_kv_pages(w->s[i]), "%s: session %d holds %zu pages "
                       "and %u shared blocks for %u KV pages", what, i, held, shared, dj_session_kv_pages(w->s[i]));
    }
    CHECK_MSG(dj__prefix_check(dj__engine_prefix(w->e), all, n) == DJ_OK, "%s: prefix cache: %s", what,
              dj_last_error());
    dj_prefix_stats ps;
    dj_engine_prefix_stats(w->e, &ps);
    dj_vmu_stats vs;
    dj_vmu_get_stats(dj_engine_vmu(w->e), &vs);
    CHECK_MSG((priv + ps.pages) * PAGE == vs.data.used, "%s: %zu private + %zu cached pages, the VMU uses %zu", what,
              priv, ps.pages, vs.data.used / PAGE);
    CHECK(ps.pages_unreferenced <= ps.pages && ps.blocks_unreferenced <= ps.blocks);
}

static void close_pair(world *w, int i) {
    dj_session_free(w->e, w->s[i]);
    dj_session_free(w->ref, w->twin[i]);
    w->s[i] = w->twin[i] = NULL;
}

static void open_one(world *w, int i) {
    if (w->s[i]) close_pair(w, i);
    CHECK_OK(dj_session_new(w->e, w->m, CTX, 0, &w->s[i]));
    CHECK_OK(dj_session_new(w->ref, w->mref, CTX, 0, &w->twin[i]));
    if (!w->s[i] || !w->twin[i]) return;
    int32_t p[CTX];
    const int j = (int)(dj_test_rand() % N_BASE);
    const uint32_t from_base = (uint32_t)(dj_test_rand() % (4 * w->T + 1));
    const uint32_t tail = 1 + (uint32_t)(dj_test_rand() % 12);
    memcpy(p, w->base[j], from_base * sizeof *p);
    random_ids(p + from_base, tail, w->V);
    uint32_t mapped = 0;
    const dj_status st = feed_both(w->e, w->s[i], w->ref, w->twin[i], p, from_base + tail, w->la, w->lb, &mapped,
                                   "open");
    if (st == DJ_ENOSPC) { /* every page mapped or private: this one goes again */
        w->full++;
        close_pair(w, i);
        return;
    }
    CHECK_OK(st);
    w->opened++;
    w->mapped_opens += mapped > 0;
}

static void step_one(world *w, int i) {
    if (!w->s[i]) return;
    uint32_t n = 1 + (uint32_t)(dj_test_rand() % 3);
    if (dj_session_pos(w->s[i]) + n > CTX) return;
    int32_t ids[3];
    random_ids(ids, n, w->V);
    const uint32_t pos = dj_session_pos(w->s[i]);
    const dj_status st = dj_session_step(w->e, w->s[i], ids, n, w->la);
    if (dj_session_residency(w->s[i]) == DJ_KV_SWAPPED) {
        CHECK_ST(st, DJ_EBUSY);
        return;
    }
    if (st == DJ_ENOSPC) {
        CHECK(dj_session_pos(w->s[i]) == pos);
        w->full++;
        return;
    }
    CHECK_OK(st);
    CHECK_OK(dj_session_step(w->ref, w->twin[i], ids, n, w->lb));
    CHECK_MSG(!memcmp(w->la, w->lb, w->V * sizeof(float)), "session %d at %u: logits differ", i, pos);
}

static void swap_one(world *w, int i) {
    dj_session_t *s = w->s[i];
    if (!s) return;
    if (dj_session_residency(s) == DJ_KV_RESIDENT) {
        const bool shared = dj__prefix_shared_blocks(s) > 0;
        const dj_status st = dj_session_swap_out(w->e, s);
        CHECK(st == DJ_OK || st == DJ_ENOSPC);
        if (st == DJ_OK) {
            CHECK(dj__prefix_shared_blocks(s) == 0);
            w->swaps_shared += shared;
        }
    } else {
        const dj_status st = dj_session_swap_in(w->e, s);
        CHECK(st == DJ_OK || st == DJ_ENOSPC);
        w->restores += st == DJ_OK;
    }
}

static void trace(const char *name) {
    world w;
    memset(&w, 0, sizeof w);
    w.e = new_engine(48, true);
    w.ref = new_engine(400, false);
    if (!w.e || !w.ref) goto done;
    CHECK_OK(dj_engine_swap_init(w.e, (size_t)64 * PAGE));
    w.m = load(w.e, name);
    w.mref = load(w.ref, name);
    if (!w.m || !w.mref) goto done;
    w.V = dj_model_get_config(w.m)->vocab_size;
    w.L = dj_model_get_config(w.m)->n_layers;
    w.la = malloc(w.V * sizeof(float));
    w.lb = malloc(w.V * sizeof(float));
    {
        dj_session_t *probe = NULL;
        CHECK_OK(dj_session_new(w.e, w.m, CTX, 0, &probe));
        if (!probe) goto done;
        w.T = probe->tokens_per_page;
        dj_session_free(w.e, probe);
    }
    CHECK(4 * w.T + 12 <= CTX);
    for (int j = 0; j < N_BASE; j++) random_ids(w.base[j], CTX, w.V);
    const int failed0 = dj_test_failed;
    dj_prefix_stats ps;
    for (int op = 0;; op++) {
        dj_engine_prefix_stats(w.e, &ps);
        if (op >= TRACE_OPS &&
            (op >= 8 * TRACE_OPS || (ps.evictions > 0 && w.mapped_opens > 0 && w.swaps_shared > 0 && w.restores > 0)))
            break;
        const int i = (int)(dj_test_rand() % N_SESS);
        const uint32_t pick = (uint32_t)(dj_test_rand() % 100);
        const char *what;
        if (pick < 35) {
            what = "open";
            open_one(&w, i);
        } else if (pick < 65) {
            what = "step";
            step_one(&w, i);
        } else if (pick < 80) {
            what = "swap";
            swap_one(&w, i);
        } else {
            what = "close";
            if (w.s[i]) close_pair(&w, i);
        }
        check_world(&w, what);
        if (dj_test_failed > failed0) break;
    }
    dj_engine_prefix_stats(w.e, &ps);
    printf("%s: %d opened (%d on cached blocks), %d out of pages; cache: %zu blocks (%zu unreferenced), %llu published, "
           "%llu duplicates, %llu hits, %llu evictions; %d swap-outs dropped shared blocks, %d restores\n",
           name, w.opened, w.mapped_opens, w.full, ps.blocks, ps.blocks_unreferenced,
           (unsigned long long)ps.published, (unsigned long long)ps.duplicates, (unsigned long long)ps.hits,
           (unsigned long long)ps.evictions, w.swaps_shared, w.restores);
    CHECK(ps.evictions > 0 && w.mapped_opens > 0 && w.swaps_shared > 0 && w.restores > 0);
done:
    for (int i = 0; i < N_SESS; i++)
        if (w.s[i] || w.twin[i]) close_pair(&w, i);
    if (w.e) {
        dj_engine_prefix_stats(w.e, &ps);
        CHECK(ps.blocks == ps.blocks_unreferenced);
        CHECK_OK(dj__vmu_check(dj_engine_vmu(w.e)));
    }
    dj_model_release(w.e, w.m);
    dj_model_release(w.ref, w.mref);
    dj_engine_free(w.e);
    dj_engine_free(w.ref);
    free(w.la);
    free(w.lb);
}

/* ---- quota: shared blocks count ---- */

static void quota(void) {
    dj_engine_t *e = new_engine(200, true);
    dj_model_t *m = e ? load(e, "llama3") : NULL;
    if (!m) goto out;
    const uint32_t V = dj_model_get_config(m)->vocab_size, L = dj_model_get_config(m)->n_layers;
    dj_session_t *a = NULL, *b = NULL;
    CHECK_OK(dj_session_new(e, m, CTX, 0, &a));
    const uint32_t T = a->tokens_per_page;
    int32_t p[CTX];
    random_ids(p, CTX, V);
    CHECK_OK(dj_session_step(e, a, p, 3 * T + 1, NULL)); /* three blocks published */
    /* b may map two blocks: mapping stops at its quota, and filling does not pass it */
    CHECK_OK(dj_session_new(e, m, CTX, (size_t)2 * L, &b));
    uint32_t mapped = 0;
    CHECK_OK(dj_session_map_prefix(e, b, p, 3 * T + 1, &mapped));
    CHECK(mapped == 2 * T && dj_session_kv_pages(b) == 2 * L && dj_vmu_session_pages(b->vs) == 0);
    CHECK_ST(dj_session_step(e, b, p + mapped, T + 1, NULL), DJ_EQUOTA);
    CHECK(dj_session_pos(b) == 2 * T);
    /* a session filling its own blocks publishes them, and still stops at its quota */
    dj_session_t *c = NULL;
    CHECK_OK(dj_session_new(e, m, CTX, (size_t)2 * L, &c));
    int32_t q[CTX];
    random_ids(q, CTX, V);
    CHECK_OK(dj_session_step(e, c, q, 2 * T, NULL));
    CHECK(dj__prefix_shared_blocks(c) == 2 && dj_vmu_session_pages(c->vs) == 0);
    CHECK_ST(dj_session_step(e, c, q + 2 * T, 1, NULL), DJ_EQUOTA);
    CHECK(strstr(dj_last_error(), "quota") != NULL);
    dj_session_t *all[3] = {a, b, c};
    CHECK_OK(dj__prefix_check(dj__engine_prefix(e), all, 3));
    dj_session_free(e, a);
    dj_session_free(e, b);
    dj_session_free(e, c);
out:
    dj_model_release(e, m);
    dj_engine_free(e);
}

int main(void) {
    dj_test_seeds();
    quota();
    static const char *fixtures[] = {"llama3", "qwen2", "gemma2", "phi3", "mistral"};
    for (size_t k = 0; k < sizeof fixtures / sizeof *fixtures; k++) exact(fixtures[k]);
    trace("llama3");
    trace("qwen2");
    return dj_test_finish("test_prefix");
}
