/* test_stream.c: weight streaming on the CPU backend - the skip-end ring's
 * layout under random tensor sizes (offsets, the skip, each load's waits
 * against a byte-level oracle), the placement, a random chain of matmuls
 * streamed through random rings by the copy thread (late copies drawn from the
 * seed) against the same chain resident, and every fixture model streamed
 * through a text budget smaller than itself: logits bit-identical to the
 * resident model, with prefetch and without, alone and batched, two models
 * over one budget, and budgets too small (and traced steps) refused with the
 * sizes (the reason). */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/cpu/cpu_impl.h"
#include "djinn/engine.h"
#include "djinn/intervene.h"
#include "exec/stream_impl.h"
#include "fixture_ref.h"
#include "model/model_impl.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__)
#define LAYOUT_TRIALS 300
#define CHAIN_TRIALS 20
#define N_FRACS 2 /* budgets per fixture */
#else
#define N_FRACS 4
#define LAYOUT_TRIALS 2000
#define CHAIN_TRIALS 60
#endif

static size_t rnd(size_t lo, size_t hi) { return lo + (size_t)(dj_test_rand() % (hi - lo + 1)); }
static size_t up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* ---- the layout against an oracle ---- */

static void check_layout_once(void) {
    const size_t align = (size_t)1 << rnd(0, 6);
    const uint32_t L = (uint32_t)rnd(1, 8);
    size_t n = 0, bytes[64];
    uint32_t load[64];
    for (uint32_t k = 0; k < L; k++)
        for (size_t t = rnd(1, 5); t > 0; t--) {
            bytes[n] = rnd(1, 300);
            load[n++] = k;
        }
    const size_t ring = rnd(1, 1500);
    dj_ring_layout r;
    const dj_status st = dj_ring_layout_make(ring, align, bytes, load, n, L, &r);
    /* the oracle: offsets by the rule, then a byte map of each load */
    size_t off[64], cur = 0;
    bool too_big = false;
    for (size_t i = 0; i < n; i++) {
        const size_t sz = up(bytes[i], align);
        too_big |= sz > ring;
        if (cur + sz > ring) cur = 0;
        off[i] = cur;
        cur += sz;
    }
    if (too_big) {
        CHECK_MSG(st == DJ_ENOSPC, "a tensor larger than the ring: %s", dj_status_name(st));
        return;
    }
    uint8_t *owner = calloc(ring * L, 1); /* owner[k * ring + b]: load k writes byte b */
    bool self = false;
    for (size_t i = 0; i < n; i++)
        for (size_t b = off[i]; b < off[i] + up(bytes[i], align); b++) {
            self |= owner[load[i] * ring + b] != 0;
            owner[load[i] * ring + b] = 1;
        }
    if (self) {
        CHECK_MSG(st == DJ_ENOSPC, "a load overlapping itself: got %s", dj_status_name(st));
    } else if (st != DJ_OK) {
        CHECK_MSG(false, "a valid layout refused: %s", dj_last_error());
    } else {
        for (size_t i = 0; i < n; i++) CHECK(r.off[i] == off[i] && r.off[i] % align == 0);
        for (uint32_t k = 0; k < L; k++) {
            bool want[8] = {false};
            for (uint32_t j = 0; j < L; j++) {
                want[j] = j == k;
                for (size_t b = 0; b < ring && !want[j]; b++) want[j] = owner[k * ring + b] && owner[j * ring + b];
                if (j != k) CHECK(dj_ring_overlap(&r, k, j) == want[j]);
            }
            uint32_t got = 0;
            for (uint32_t a = r.after_at[k]; a < r.after_at[k + 1]; a++) {
                CHECK(want[r.after[a]]);
                got++;
            }
            uint32_t nwant = 0;
            for (uint32_t j = 0; j < L; j++) nwant += want[j];
            CHECK(got == nwant);
        }
        dj_ring_layout_free(&r);
    }
    free(owner);
}

static void check_placement(void) {
    size_t layers[8];
    for (int l = 0; l < 8; l++) layers[l] = 1000;
    dj_placement p;
    CHECK_OK(dj_placement_decide(layers, 8, 400, 500, 8500, &p));
    CHECK(p.n_streamed == 0 && p.ring_bytes == 0 && p.resident_bytes == 8500);
    dj_placement_free(&p);
    uint32_t last = 0;
    for (size_t room = 8499; room >= 500 + 1000 + 400; room -= 100) { /* less room, more streamed */
        CHECK_OK(dj_placement_decide(layers, 8, 400, 500, room, &p));
        CHECK(p.n_streamed >= last && p.n_streamed >= 2 && p.ring_layers < p.n_streamed);
        CHECK(p.resident_bytes + p.ring_bytes <= room);
        CHECK(p.streamed_bytes == 1000u * p.n_streamed);
        uint32_t s = 0;
        for (int l = 0; l < 8; l++) s += p.streamed[l];
        CHECK(s == p.n_streamed);
        last = p.n_streamed;
        dj_placement_free(&p);
    }
    CHECK(last == 8);
    CHECK_ST(dj_placement_decide(layers, 8, 400, 500, 500 + 1000 + 399, &p), DJ_ENOSPC);
    CHECK_MSG(strstr(dj_last_error(), "1899") && strstr(dj_last_error(), "1900"), "%s", dj_last_error());
}

/* ---- the driver's order, against a recording device ---- */

typedef struct rec {
    const dj_stream_step *ss;
    int copied[8], waited[8], done[8]; /* this step: copy issued, waited for, done marked */
    int bad;
} rec;

static dj_status rec_copy(void *u, uint32_t k, bool serial) {
    rec *r = u;
    r->bad += r->copied[k]; /* once a step */
    for (uint32_t i = 0; i < r->ss->loads[k].n_after; i++) {
        const uint32_t j = r->ss->loads[k].after[i];
        if (j < k && r->copied[j] && !r->done[j]) r->bad++; /* overwrites bytes a reader still needs */
    }
    (void)serial;
    r->copied[k] = 1;
    return DJ_OK;
}
static dj_status rec_wait(void *u, uint32_t k) {
    rec *r = u;
    r->bad += !r->copied[k];
    r->waited[k] = 1;
    return DJ_OK;
}
static dj_status rec_done(void *u, uint32_t k) {
    rec *r = u;
    r->bad += !r->waited[k] || r->done[k];
    r->done[k] = 1;
    return DJ_OK;
}

static void check_driver_once(void) {
    const uint32_t L = (uint32_t)rnd(2, 8);
    size_t bytes[8];
    uint32_t load[8];
    for (uint32_t k = 0; k < L; k++) {
        bytes[k] = rnd(1, 100);
        load[k] = k;
    }
    dj_ring_layout lay;
    if (dj_ring_layout_make(rnd(100, 500), 1, bytes, load, L, L, &lay) != DJ_OK) return;
    dj_stream_load loads[8];
    for (uint32_t k = 0; k < L; k++)
        loads[k] = (dj_stream_load){.after = &lay.after[lay.after_at[k]], .n_after = lay.after_at[k + 1] - lay.after_at[k]};
    int32_t call_load[64];
    size_t n = 0;
    for (uint32_t k = 0; k < L; k++)
        for (size_t c = rnd(0, 4); c > 0; c--) call_load[n++] = dj_test_rand() % 3 ? (int32_t)k : -1;
    const dj_stream_step ss = {.ring = (dj_backend_ring_t *)&lay, .loads = loads, .n_loads = L,
                               .call_load = call_load, .prefetch = dj_test_rand() % 2};
    rec r = {.ss = &ss};
    const dj_stream_dev dev = {.copy = rec_copy, .wait_ready = rec_wait, .mark_done = rec_done, .u = &r};
    dj_stream_run run;
    dj_status st = dj__stream_start(&run, &ss, n, dev);
    for (size_t i = 0; i < n && st == DJ_OK; i++) {
        const int32_t idx = (int32_t)i;
        st = dj__stream_before(&run, &idx, 1);
        if (st == DJ_OK) st = dj__stream_after(&run, &idx, 1);
    }
    CHECK_OK(dj__stream_end(&run, st));
    CHECK(r.bad == 0);
    for (uint32_t k = 0; k < L; k++) { /* every load read is copied, waited for and done; no other */
        int reads = 0;
        for (size_t i = 0; i < n; i++) reads += call_load[i] == (int32_t)k;
        CHECK(r.copied[k] == (reads > 0) && r.done[k] == (reads > 0));
    }
    dj_ring_layout_free(&lay);
}

/* ---- a chain of matmuls streamed by the CPU ring ---- */

static void check_chain_once(dj_backend_t *be) {
    const uint32_t L = (uint32_t)rnd(2, 7);
    uint32_t dim[8];
    for (uint32_t k = 0; k <= L; k++) dim[k] = (uint32_t)rnd(1, 24);
    /* load k: W [dim[k+1]][dim[k]] and bias [dim[k+1]], f32 */
    size_t bytes[16], total = 0, maxb = 0;
    uint32_t load[16];
    float *w[16];
    for (uint32_t k = 0; k < L; k++) {
        bytes[2 * k] = (size_t)dim[k + 1] * dim[k] * 4;
        bytes[2 * k + 1] = (size_t)dim[k + 1] * 4;
        load[2 * k] = load[2 * k + 1] = k;
        for (int t = 0; t < 2; t++) {
            w[2 * k + t] = malloc(bytes[2 * k + t]);
            for (size_t i = 0; i < bytes[2 * k + t] / 4; i++) w[2 * k + t][i] = dj_test_randf(-1.0f, 1.0f);
            total += up(bytes[2 * k + t], 64);
            if (up(bytes[2 * k], 64) + up(bytes[2 * k + 1], 64) > maxb) maxb = up(bytes[2 * k], 64) + up(bytes[2 * k + 1], 64);
        }
    }
    dj_ring_layout lay;
    size_t ring = 0;
    dj_status st = DJ_ENOSPC;
    for (int tries = 0; tries < 50 && st != DJ_OK; tries++) { /* a random ring, some holding one load only */
        ring = rnd(maxb, total + 64);
        st = dj_ring_layout_make(ring, 64, bytes, load, 2 * L, L, &lay);
    }
    if (st != DJ_OK) st = dj_ring_layout_make(ring = 2 * total, 64, bytes, load, 2 * L, L, &lay);
    CHECK_OK(st);
    uint8_t *mem = aligned_alloc(64, up(ring, 64));
    dj_copy_span spans[16];
    dj_stream_load loads[8];
    for (uint32_t k = 0; k < L; k++) {
        for (int t = 0; t < 2; t++)
            spans[2 * k + t] = (dj_copy_span){.dev = mem + lay.off[2 * k + t], .host = w[2 * k + t],
                                              .bytes = bytes[2 * k + t]};
        loads[k] = (dj_stream_load){.spans = &spans[2 * k], .n_spans = 2, .after = &lay.after[lay.after_at[k]],
                                    .n_after = lay.after_at[k + 1] - lay.after_at[k]};
    }
    /* activations: x[k] [dim[k]] for each step; calls read the ring (streamed) or w (resident) */
    enum { STEPS = 3 };
    float *x_s[STEPS][8], *x_r[STEPS][8];
    dj_op_call calls[8], rcalls[8];
    int32_t call_load[8];
    dj_backend_ring_t *bring = NULL;
    CHECK_OK(be->vt->ring_new(be, L, &bring));
    for (int s = 0; s < STEPS; s++) {
        for (uint32_t k = 0; k <= L; k++) {
            x_s[s][k] = calloc(dim[k], 4);
            x_r[s][k] = calloc(dim[k], 4);
        }
        for (uint32_t i = 0; i < dim[0]; i++) x_s[s][0][i] = x_r[s][0][i] = dj_test_randf(-1.0f, 1.0f);
        for (uint32_t k = 0; k < L; k++) {
            calls[k] = (dj_op_call){.op = DJ_OP_MATMUL, .n = 1, .out = x_s[s][k + 1], .x = x_s[s][k],
                                    .w = spans[2 * k].dev, .w_dtype = DJ_DTYPE_F32, .bias = spans[2 * k + 1].dev,
                                    .bias_dtype = DJ_DTYPE_F32, .k = dim[k], .m = dim[k + 1]};
            rcalls[k] = calls[k];
            rcalls[k].out = x_r[s][k + 1];
            rcalls[k].x = x_r[s][k];
            rcalls[k].w = w[2 * k];
            rcalls[k].bias = w[2 * k + 1];
            call_load[k] = (int32_t)k;
        }
        const dj_stream_step ss = {.ring = bring, .loads = loads, .n_loads = L, .call_load = call_load,
                                   .prefetch = dj_test_rand() % 4 != 0};
        CHECK_OK(be->vt->compute_plan(be, calls, L, NULL, &ss));
        CHECK_OK(be->vt->compute_plan(be, rcalls, L, NULL, NULL));
        CHECK_MSG(memcmp(x_s[s][L], x_r[s][L], dim[L] * 4) == 0, "step %d of %u loads in a ring of %zu: differs", s, L,
                  ring);
    }
    be->vt->ring_free(be, bring);
    for (int s = 0; s < STEPS; s++)
        for (uint32_t k = 0; k <= L; k++) {
            free(x_s[s][k]);
            free(x_r[s][k]);
        }
    for (uint32_t k = 0; k < 2 * L; k++) free(w[k]);
    free(mem);
    dj_ring_layout_free(&lay);
}

/* The host-compute split: the count minimises the step's longer side (copies
 * left, host work) and is the fewest such; the spread puts exactly that many
 * on streamed layers only, evenly (gaps between them differ by at most 1). */
static void check_host_split_once(void) {
    const uint32_t S = (uint32_t)rnd(0, 40);
    const double L = (double)rnd(1000, 100000), F = L * (double)rnd(10, 95) / 100.0;
    const double cg = (double)rnd(1, 100), hg = (double)rnd(1, 100);
    const uint32_t h = dj_host_count(S, L, F, cg, hg);
    CHECK(h <= S);
    double best = 1e300;
    uint32_t arg = 0;
    for (uint32_t k = 0; k <= S; k++) {
        const double c = (S * L - k * F) / cg, t = k * F / hg, m = c > t ? c : t;
        if (m < best) {
            best = m;
            arg = k;
        }
    }
    CHECK_MSG(h == arg, "dj_host_count(%u, %g, %g, %g, %g) = %u, want %u", S, L, F, cg, hg, h, arg);
    CHECK(dj_host_count(S, L, F, 0.0, hg) == 0 && dj_host_count(S, L, F, cg, 0.0) == 0);
    const uint32_t n_layers = S + (uint32_t)rnd(0, 20);
    uint8_t streamed[64] = {0}, host[64];
    for (uint32_t i = 0; i < S; i++) { /* S of the n_layers stream, at random */
        uint32_t l;
        do l = (uint32_t)rnd(0, n_layers - 1);
        while (streamed[l]);
        streamed[l] = 1;
    }
    const dj_placement pl = {.n_layers = n_layers, .n_streamed = S, .streamed = streamed};
    const uint32_t want = (uint32_t)rnd(0, S + 2);
    dj_host_spread(&pl, want, host);
    uint32_t got = 0, gap_min = UINT32_MAX, gap_max = 0, since = 0, seen = 0;
    for (uint32_t l = 0; l < n_layers; l++) {
        CHECK(!host[l] || streamed[l]);
        if (!streamed[l]) continue;
        if (host[l]) {
            if (seen) {
                gap_min = since < gap_min ? since : gap_min;
                gap_max = since > gap_max ? since : gap_max;
            }
            seen = 1;
            since = 0;
            got++;
        } else {
            since++;
        }
    }
    CHECK_MSG(got == (want < S ? want : S), "spread %u of %u streamed: got %u", want, S, got);
    if (got > 1) CHECK_MSG(gap_max - gap_min <= 1, "spread gaps %u..%u", gap_min, gap_max);
}

/* ---- fixture models: streamed = resident, bit for bit ---- */

static dj_engine_t *engine_share(size_t text, bool prefetch, int host_layers, double host_share) {
    const size_t data = 8u << 20, stack = 8u << 20, total = text + data + stack + 4096;
    dj_engine_config cfg = {.device = "cpu", .n_threads = 2, .no_prefetch = !prefetch, .host_layers = host_layers,
                            .host_share = host_share};
    cfg.vmu = (dj_vmu_config){.total_bytes = total,
                              .text_frac = (double)text / (double)total,
                              .data_frac = (double)data / (double)total,
                              .stack_frac = (double)stack / (double)total,
                              .page_bytes = 4096};
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&cfg, &e));
    return e;
}

static dj_engine_t *engine_host(size_t text, bool prefetch, int host_layers) {
    return engine_share(text, prefetch, host_layers, 0.0);
}

static dj_engine_t *engine_with_text(size_t text, bool prefetch) { return engine_host(text, prefetch, 0); }

/* prompt, then 4 greedy decode steps - each the argmax of pick's previous
 * logits (out itself when pick is NULL); logits of every step into out[5][V] */
static void run_model_picking(dj_engine_t *e, dj_model_t *m, const int32_t *prompt, uint32_t np, const float *pick,
                              float *out) {
    const uint32_t V = dj_model_get_config(m)->vocab_size;
    dj_session_t *s = NULL;
    CHECK_OK(dj_session_new(e, m, 64, 0, &s));
    if (!s) return;
    if (!pick) pick = out;
    CHECK_OK(dj_session_step(e, s, prompt, np, out));
    for (int t = 1; t < 5; t++) {
        int32_t best = 0;
        for (uint32_t v = 1; v < V; v++)
            if (pick[(size_t)(t - 1) * V + v] > pick[(size_t)(t - 1) * V + best]) best = (int32_t)v;
        CHECK_OK(dj_session_step(e, s, &best, 1, out + (size_t)t * V));
    }
    dj_session_free(e, s);
}

static void run_model(dj_engine_t *e, dj_model_t *m, const int32_t *prompt, uint32_t np, float *out) {
    run_model_picking(e, m, prompt, np, NULL, out);
}

/* max |got - want| over 5 steps of V logits, relative to each step's max |want|. */
static double step_err(const float *got, const float *want, uint32_t V) {
    double worst = 0.0;
    for (int t = 0; t < 5; t++) {
        double num = 0.0, den = 1e-30;
        for (uint32_t v = 0; v < V; v++) {
            const size_t i = (size_t)t * V + v;
            const double d = isnan(got[i]) ? INFINITY : fabs((double)got[i] - want[i]);
            if (d > num) num = d;
            if (fabs(want[i]) > den) den = fabs(want[i]);
        }
        if (num / den > worst) worst = num / den;
    }
    return worst;
}

static size_t load_bytes(const dj_stream_load *L) {
    size_t b = 0;
    for (uint32_t i = 0; i < L->n_spans; i++) b += L->spans[i].bytes * (L->spans[i].rows > 1 ? L->spans[i].rows : 1);
    return b;
}

/* Bytes a step with host runs for every host layer does not copy: each
 * one's FFN load, less what a share layer's share load still copies. */
static size_t host_saved(const dj_model_stream *s) {
    size_t b = 0;
    for (uint32_t l = 0; s->host_layer && l < s->pl.n_layers; l++) {
        if (!s->host_layer[l]) continue;
        const int32_t k = s->layer_ffn[l];
        b += load_bytes(&s->loads[k]) - (s->share_layer && s->share_layer[l] ? load_bytes(&s->share_loads[k]) : 0);
    }
    return b;
}

/* Every host layer ran on the host in each of `host` steps (a layer that
 * fell back to streaming would copy its FFN load), `full` steps streamed all. */
static void check_copied(const dj_model_t *m, const char *name, uint64_t host, uint64_t full) {
    dj_model_placement p;
    dj_model_get_placement(m, &p);
    const uint64_t want = host * (p.streamed_bytes - host_saved(m->stream)) + full * p.streamed_bytes;
    CHECK_MSG(p.copied_bytes == want, "%s: %llu bytes copied in %llu host steps and %llu full ones, want %llu", name,
              (unsigned long long)p.copied_bytes, (unsigned long long)host, (unsigned long long)full,
              (unsigned long long)want);
}

/* A share: the host computes the first columns of each streamed layer's FFN
 * width while the device computes the rest, both from one input, the sum
 * of their parts as the residual - the down projection's sum in two pieces,
 * so close to the resident run, not equal (the tokens fed are the resident
 * run's). A 20-row prefill (whole loads) then share decode over one ring.
 * Layers whose FFN cannot be split (a norm after down, 4-bit weights) take
 * the whole FFN instead. */
static void check_share(dj_checkpoint_t *ck, const char *name, size_t text_bytes, const int32_t *prompt,
                        const int32_t *long_prompt, const float *want, const float *want20) {
    const uint32_t V = dj_checkpoint_config(ck)->vocab_size;
    float *got = malloc((size_t)5 * V * 4);
    for (int pf = 0; pf < 2; pf++) {
        dj_engine_t *e = engine_share((size_t)((double)text_bytes * 0.8), pf == 0, 99, 0.5);
        dj_model_t *m = NULL;
        CHECK_OK(dj_model_load_checkpoint(e, ck, name, &m));
        dj_model_placement p;
        if (m) dj_model_get_placement(m, &p);
        const bool shares = m && strchr(p.layers, 'h');
        CHECK_MSG(m && p.n_host > 0 && (!shares || (p.host_share > 0.0 && p.host_share < 1.0)),
                  "%s: %u host layers, share %g (%s)", name, m ? p.n_host : 0, m ? p.host_share : 0.0,
                  m ? p.layers : "");
        const bool must = !strcmp(name, "llama3") || !strcmp(name, "qwen3") || !strcmp(name, "tinyllama");
        CHECK_MSG(!m || shares || !must, "%s: no layer shares its FFN (%s)", name, p.layers);
        if (m) {
            memset(got, 0, (size_t)5 * V * 4);
            run_model_picking(e, m, prompt, 7, want, got);
            const double err = step_err(got, want, V);
            CHECK_MSG(err < 1e-4, "%s: FFN shares (%s prefetch): logits off by %g", name, pf == 0 ? "with" : "without",
                      err);
            check_copied(m, name, 5, 0);
            memset(got, 0, (size_t)5 * V * 4);
            run_model_picking(e, m, long_prompt, 20, want20, got);
            const double err20 = step_err(got, want20, V);
            CHECK_MSG(err20 < 1e-4, "%s: 20-row prefill then share decode: logits off by %g", name, err20);
            check_copied(m, name, 9, 1);
            dj_model_get_placement(m, &p);
            CHECK_MSG(p.host_steps == 9, "%s: %llu of 9 steps ran host runs", name, (unsigned long long)p.host_steps);
            if (shares)
                printf("%s: FFN shares of %.0f%% on the host (%s): logits within %.2g, %.2g\n", name,
                       100.0 * p.host_share, p.layers, err, err20);
        }
        dj_model_release(e, m);
        dj_engine_free(e);
    }
    free(got);
}

/* Host compute: every streamed layer's FFN run by a second CPU backend from
 * the mapped weights through host scratch (steps of up to 16 rows), the
 * rest streamed - logits the same, bit for bit (one CPU kernel set, f32 on
 * both sides). A 20-row prefill streams everything, its decode uses the
 * host again: both orders over one ring. */
static void check_host(dj_checkpoint_t *ck, const char *name, size_t text_bytes, const int32_t *prompt,
                       const float *want) {
    const uint32_t V = dj_checkpoint_config(ck)->vocab_size;
    int32_t long_prompt[20];
    for (int i = 0; i < 20; i++) long_prompt[i] = prompt[i % 7];
    float *got = malloc((size_t)5 * V * 4), *want20 = malloc((size_t)5 * V * 4);
    dj_engine_t *e = engine_with_text(text_bytes + (1u << 20), true);
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load_checkpoint(e, ck, name, &m));
    if (m) run_model(e, m, long_prompt, 20, want20);
    dj_model_release(e, m);
    dj_engine_free(e);
    for (int pf = 0; pf < 2; pf++) {
        e = engine_host((size_t)((double)text_bytes * 0.8), pf == 0, 99);
        m = NULL;
        CHECK_OK(dj_model_load_checkpoint(e, ck, name, &m));
        dj_model_placement p;
        if (m) dj_model_get_placement(m, &p);
        CHECK_MSG(m && m->stream && p.n_host == m->stream->pl.n_streamed && p.n_host > 0 && strchr(p.layers, 'H'),
                  "%s: host layers %u of %u streamed (%s)", name, m ? p.n_host : 0,
                  m && m->stream ? m->stream->pl.n_streamed : 0, m ? p.layers : "");
        if (m) {
            memset(got, 0, (size_t)5 * V * 4);
            run_model(e, m, prompt, 7, got);
            CHECK_MSG(memcmp(got, want, (size_t)5 * V * 4) == 0, "%s: FFNs on the host (%s prefetch) differ", name,
                      pf == 0 ? "with" : "without");
            dj_model_get_placement(m, &p);
            CHECK_MSG(p.host_steps == 5, "%s: %llu of 5 steps ran host runs", name, (unsigned long long)p.host_steps);
            check_copied(m, name, 5, 0);
            memset(got, 0, (size_t)5 * V * 4);
            run_model(e, m, long_prompt, 20, got);
            CHECK_MSG(memcmp(got, want20, (size_t)5 * V * 4) == 0, "%s: 20-row prefill then host decode differs", name);
            check_copied(m, name, 9, 1);
            dj_model_get_placement(m, &p);
            CHECK_MSG(p.host_steps == 9, "%s: %llu of 9 steps ran host runs (the 20-row prefill streams)", name,
                      (unsigned long long)p.host_steps);
        }
        dj_model_release(e, m);
        dj_engine_free(e);
    }
    check_share(ck, name, text_bytes, prompt, long_prompt, want, want20);
    free(got);
    free(want20);
}

static void check_fixture(const char *name) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", DJ_FIXTURES, name);
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    if (!ck) return;
    dj_model_needs needs;
    CHECK_OK(dj_model_estimate(ck, DJ_DTYPE_F32, 64, &needs));
    const dj_model_config *c = dj_checkpoint_config(ck);
    const uint32_t V = c->vocab_size;
    int32_t prompt[7];
    for (int i = 0; i < 7; i++) prompt[i] = (int32_t)(dj_test_rand() % V);
    float *want = malloc((size_t)5 * V * 4), *got = malloc((size_t)5 * V * 4);
    dj_engine_t *e = engine_with_text(needs.text_bytes + (1u << 20), true);
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load_checkpoint(e, ck, name, &m));
    CHECK(m && !m->stream);
    if (m) run_model(e, m, prompt, 7, want);
    dj_model_release(e, m);
    dj_engine_free(e);
    /* budgets from just under the model to the least that streams (globals, one layer, slack) */
    const double fracs[] = {0.9, 0.7, 0.97, 0.8};
    int streamed = 0;
    for (int f = 0; f < N_FRACS; f++)
        for (int pf = 0; pf < 2; pf++) {
            e = engine_with_text((size_t)((double)needs.text_bytes * fracs[f]), pf == 0);
            m = NULL;
            const dj_status st = dj_model_load_checkpoint(e, ck, name, &m);
            if (st == DJ_ENOSPC) { /* only when the globals and a two-layer ring do not fit */
                CHECK_MSG(strstr(dj_last_error(), "cannot run this model even streamed"), "%s: %s", name,
                          dj_last_error());
                dj_engine_free(e);
                continue;
            }
            CHECK_OK(st);
            CHECK_MSG(m && m->stream && m->stream->pl.n_streamed > 0, "%s at %.1f: nothing streams", name, fracs[f]);
            streamed++;
            if (m) {
                memset(got, 0, (size_t)5 * V * 4);
                run_model(e, m, prompt, 7, got);
                CHECK_MSG(memcmp(got, want, (size_t)5 * V * 4) == 0, "%s streamed (%u of %u layers, %s prefetch) differs",
                          name, m->stream ? m->stream->pl.n_streamed : 0, c->n_layers, pf == 0 ? "with" : "without");
            }
            dj_model_release(e, m);
            dj_engine_free(e);
        }
    CHECK_MSG(streamed >= 2, "%s: streamed at %d budgets only", name, streamed); /* each with and without prefetch */
    check_host(ck, name, needs.text_bytes, prompt, want);
    /* a budget below the globals and one layer: refused, naming the sizes */
    e = engine_with_text(4096, true);
    m = NULL;
    CHECK_ST(dj_model_load_checkpoint(e, ck, name, &m), DJ_ENOSPC);
    CHECK_MSG(strstr(dj_last_error(), "text budget") && strstr(dj_last_error(), "bytes"), "%s", dj_last_error());
    dj_engine_free(e);
    free(want);
    free(got);
    dj_checkpoint_close(ck);
}

/* Batched decode of three sessions of a streamed model = resident. */
static void check_batch(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama3", DJ_FIXTURES);
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    if (!ck) return;
    dj_model_needs needs;
    CHECK_OK(dj_model_estimate(ck, DJ_DTYPE_F32, 64, &needs));
    const uint32_t V = dj_checkpoint_config(ck)->vocab_size;
    float *res[2];
    for (int pass = 0; pass < 2; pass++) {
        dj_engine_t *e = engine_with_text(pass ? needs.text_bytes * 9 / 10 : needs.text_bytes + (1u << 20), true);
        dj_model_t *m = NULL;
        CHECK_OK(dj_model_load_checkpoint(e, ck, "llama3", &m));
        CHECK(m && (m->stream != NULL) == (pass == 1));
        res[pass] = calloc((size_t)3 * 3 * V, 4);
        dj_session_t *s[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3 && m; i++) {
            CHECK_OK(dj_session_new(e, m, 64, 0, &s[i]));
            const int32_t p[3] = {1 + i, 7 + i, 3};
            CHECK_OK(dj_session_step(e, s[i], p, 3, NULL));
        }
        if (pass == 1 && s[0]) { /* a traced step cannot split a streamed step: refused, nothing moved */
            const uint32_t H = dj_model_get_config(m)->hidden_size;
            float *saved = malloc((size_t)H * sizeof *saved);
            const dj_intervention iv = {.point = {DJ_POINT_LAYER_OUTPUT, 0}, .op = DJ_IV_SAVE, .out = saved};
            const int32_t one = 4;
            CHECK_ST(dj_session_step_trace(e, s[0], &one, 1, &iv, 1, NULL), DJ_EUNSUPPORTED);
            CHECK_MSG(strstr(dj_last_error(), "weight ring") != NULL, "%s", dj_last_error());
            CHECK(dj_session_pos(s[0]) == 3);
            /* a breakpoint likewise, before anything runs (test_brk: the rest of them) */
            const dj_intervention brk = {.point = {DJ_POINT_LAYER_OUTPUT, 0}, .op = DJ_IV_BREAK, .out = saved};
            dj_step_brk_t *b = NULL;
            CHECK_ST(dj_session_step_break(e, s[0], &one, 1, &brk, 1, NULL, &b), DJ_EUNSUPPORTED);
            CHECK(b == NULL && dj_session_pos(s[0]) == 3);
            free(saved);
        }
        for (int t = 0; t < 3 && m; t++) {
            const int32_t ids[3] = {5 + t, 9, 2 * t};
            CHECK_OK(dj_engine_step_batch(e, s, ids, 3, res[pass] + (size_t)t * 3 * V, NULL, NULL));
        }
        for (int i = 0; i < 3; i++) dj_session_free(e, s[i]);
        dj_model_release(e, m);
        dj_engine_free(e);
    }
    CHECK(memcmp(res[0], res[1], (size_t)9 * V * 4) == 0);
    free(res[0]);
    free(res[1]);
    dj_checkpoint_close(ck);
}

/* Two models whose sum exceeds the text segment: the first resident, the
 * second streams in what is left; both as they are alone. */
static void check_two_models(void) {
    char d1[512], d2[512];
    snprintf(d1, sizeof d1, "%s/models/llama3", DJ_FIXTURES);
    snprintf(d2, sizeof d2, "%s/models/qwen2", DJ_FIXTURES);
    dj_checkpoint_t *c1 = NULL, *c2 = NULL;
    CHECK_OK(dj_checkpoint_open(d1, &c1));
    CHECK_OK(dj_checkpoint_open(d2, &c2));
    if (!c1 || !c2) return;
    dj_model_needs n1, n2;
    CHECK_OK(dj_model_estimate(c1, DJ_DTYPE_F32, 64, &n1));
    CHECK_OK(dj_model_estimate(c2, DJ_DTYPE_F32, 64, &n2));
    const uint32_t V1 = dj_checkpoint_config(c1)->vocab_size, V2 = dj_checkpoint_config(c2)->vocab_size;
    const int32_t p[5] = {3, 1, 4, 1, 5};
    float *a1 = malloc((size_t)5 * V1 * 4), *a2 = malloc((size_t)5 * V2 * 4);
    float *b1 = malloc((size_t)5 * V1 * 4), *b2 = malloc((size_t)5 * V2 * 4);
    dj_engine_t *e = engine_with_text(n1.text_bytes + n2.text_bytes + (1u << 20), true);
    dj_model_t *m1 = NULL, *m2 = NULL;
    CHECK_OK(dj_model_load_checkpoint(e, c1, "llama3", &m1));
    CHECK_OK(dj_model_load_checkpoint(e, c2, "qwen2", &m2));
    if (m1 && m2) {
        run_model(e, m1, p, 5, a1);
        run_model(e, m2, p, 5, a2);
    }
    dj_model_release(e, m1);
    dj_model_release(e, m2);
    dj_engine_free(e);
    e = engine_with_text(n1.text_bytes + n2.text_bytes * 9 / 10, true);
    m1 = m2 = NULL;
    CHECK_OK(dj_model_load_checkpoint(e, c1, "llama3", &m1));
    CHECK_OK(dj_model_load_checkpoint(e, c2, "qwen2", &m2));
    CHECK(m1 && !m1->stream && m2 && m2->stream);
    if (m1 && m2) { /* interleaved, as a daemon serves them */
        dj_session_t *s1 = NULL, *s2 = NULL;
        CHECK_OK(dj_session_new(e, m1, 64, 0, &s1));
        CHECK_OK(dj_session_new(e, m2, 64, 0, &s2));
        CHECK_OK(dj_session_step(e, s1, p, 5, b1));
        CHECK_OK(dj_session_step(e, s2, p, 5, b2));
        for (int t = 1; t < 5; t++) {
            int32_t x1 = 0, x2 = 0;
            for (uint32_t v = 1; v < V1; v++) x1 = b1[(size_t)(t - 1) * V1 + v] > b1[(size_t)(t - 1) * V1 + x1] ? (int32_t)v : x1;
            for (uint32_t v = 1; v < V2; v++) x2 = b2[(size_t)(t - 1) * V2 + v] > b2[(size_t)(t - 1) * V2 + x2] ? (int32_t)v : x2;
            CHECK_OK(dj_session_step(e, s1, &x1, 1, b1 + (size_t)t * V1));
            CHECK_OK(dj_session_step(e, s2, &x2, 1, b2 + (size_t)t * V2));
        }
        dj_session_free(e, s1);
        dj_session_free(e, s2);
        CHECK(memcmp(a1, b1, (size_t)5 * V1 * 4) == 0);
        CHECK(memcmp(a2, b2, (size_t)5 * V2 * 4) == 0);
    }
    dj_model_release(e, m1);
    dj_model_release(e, m2);
    dj_engine_free(e);
    free(a1);
    free(a2);
    free(b1);
    free(b2);
    dj_checkpoint_close(c1);
    dj_checkpoint_close(c2);
}

int main(void) {
    dj_test_seeds();
    setenv("DJINN_WEIGHTS_IN_PLACE", "0", 1); /* weights copied into the text segment: its budget binds */
    dj__cpu_ring_jitter(3, dj_test_rand());
    for (int i = 0; i < LAYOUT_TRIALS; i++) check_layout_once();
    check_placement();
    for (int i = 0; i < LAYOUT_TRIALS; i++) check_driver_once();
    for (int i = 0; i < LAYOUT_TRIALS; i++) check_host_split_once();
    /* a share's columns: whole grains, at least one on each side, else 0 (the whole FFN) */
    CHECK(dj_share_cols(0.5, 160) == 80 && dj_share_cols(0.72, 14336) == 645 * DJ_SHARE_GRAIN);
    CHECK(dj_share_cols(0.001, 160) == DJ_SHARE_GRAIN && dj_share_cols(0.999, 160) == 0);
    CHECK(dj_share_cols(1.0, 160) == 0 && dj_share_cols(0.0, 160) == 0 && dj_share_cols(0.5, 100) == 0 &&
          dj_share_cols(0.5, DJ_SHARE_GRAIN) == 0);
    dj_backend_t *be = NULL;
    CHECK_OK(dj_backend_cpu_new(2, &be));
    for (int i = 0; i < CHAIN_TRIALS && be; i++) check_chain_once(be);
    dj_backend_free(be);
    for (size_t i = 0; i < DJ_N_FIXTURES; i++) check_fixture(DJ_FIXTURE_NAMES[i]);
    check_batch();
    check_two_models();
    return dj_test_finish("test_stream");
}
