/* host_run.c: host compute beside the weight ring - which streamed layers'
 * FFNs the host's cores run at small batches, and what share of each (from
 * rates measured at load), the share loads the ring then copies, and each
 * step's host runs: those FFN calls rewritten onto host memory. */
#include <pthread.h>
#include "djinn/alloc.h"
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "djinn/op_table.h"
#include "exec/stream_impl.h"
#include "model/model_impl.h"

uint32_t dj_host_count(uint32_t n_streamed, double layer_bytes, double ffn_bytes, double copy_gbps, double host_gbps) {
    if (!(copy_gbps > 0.0) || !(host_gbps > 0.0) || !(ffn_bytes > 0.0)) return 0;
    uint32_t best = 0;
    double best_t = (double)n_streamed * layer_bytes / copy_gbps;
    for (uint32_t h = 1; h <= n_streamed; h++) {
        const double copy = ((double)n_streamed * layer_bytes - h * ffn_bytes) / copy_gbps;
        const double host = h * ffn_bytes / host_gbps;
        const double t = copy > host ? copy : host;
        if (t < best_t) {
            best_t = t;
            best = h;
        }
    }
    return best;
}

void dj_host_spread(const dj_placement *pl, uint32_t n, uint8_t *host) {
    memset(host, 0, pl->n_layers);
    if (n > pl->n_streamed) n = pl->n_streamed;
    uint32_t i = 0; /* index among the streamed layers */
    for (uint32_t l = 0; l < pl->n_layers && n; l++) {
        if (!pl->streamed[l]) continue;
        /* slot i is a host one when floor((i+1) n / S) steps past floor(i n / S) */
        host[l] = (uint8_t)(((uint64_t)(i + 1) * n) / pl->n_streamed != ((uint64_t)i * n) / pl->n_streamed);
        i++;
    }
}

uint32_t dj_share_cols(double share, uint32_t width) {
    if (!(share > 0.0) || share >= 1.0 || width % DJ_SHARE_GRAIN || width < 2 * DJ_SHARE_GRAIN) return 0;
    double c = share * width / DJ_SHARE_GRAIN + 0.5;
    uint32_t g = c < 1.0 ? 1 : (uint32_t)c;
    if (g > width / DJ_SHARE_GRAIN - 1) return 0; /* the device would be left less than a grain */
    return g * DJ_SHARE_GRAIN;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t span_bytes(const dj_stream_load *L) {
    size_t b = 0;
    for (uint32_t i = 0; i < L->n_spans; i++) b += L->spans[i].bytes * (L->spans[i].rows > 1 ? L->spans[i].rows : 1);
    return b;
}

/* The host address of a ring tensor starting at p (a span of load k), or NULL. */
static const void *host_of(const dj_model_stream *s, int32_t k, const void *p) {
    for (uint32_t i = 0; k >= 0 && p && i < s->loads[k].n_spans; i++)
        if (s->loads[k].spans[i].dev == p) return s->loads[k].spans[i].host;
    return NULL;
}

/* The seconds of layer's FFN matmuls on the host at `rows` rows, best of
 * reps (x, y: scratch of 32 rows of the widest side); *mm_bytes gets their
 * weight bytes when given. */
static dj_status ffn_time(dj_model_t *m, uint32_t layer, int rows, int reps, const float *x, float *y,
                          double *secs, size_t *mm_bytes) {
    dj_model_stream *s = m->stream;
    const dj_model_config *c = &m->cfg;
    const int slots[3] = {DJ_W_GATE, DJ_W_UP, DJ_W_DOWN};
    dj_status st = DJ_OK;
    double best = 1e30;
    for (int r = 0; r < reps && st == DJ_OK; r++) {
        const double t0 = now();
        for (int j = 0; j < 3 && st == DJ_OK; j++) {
            const dj_weight *w = &m->w[dj__wslot_layer_c(c, (int)layer, slots[j])];
            const void *hw = host_of(s, s->layer_ffn[layer], w->data);
            if (!hw) continue;
            if (mm_bytes && r == 0) *mm_bytes += dj_dtype_size(w->dtype) * (size_t)w->shape[0] * (size_t)w->shape[1];
            const dj_op_call call = {.op = DJ_OP_MATMUL, .n = (uint32_t)rows, .out = y, .x = x, .w = hw,
                                     .w_dtype = w->dtype, .k = (uint32_t)w->shape[1], .m = (uint32_t)w->shape[0]};
            st = dj_backend_compute(s->host, &call);
        }
        const double t = now() - t0;
        if (t < best) best = t;
    }
    *secs = best;
    return st;
}

/* A thread copying a staged layer into the ring over and over (upload_weights),
 * counting the bytes landed, until stop. */
typedef struct copier {
    dj_backend_t *be;
    const dj_stream_load *loads[2];
    const uint8_t *stage;
    _Atomic int stop;
    _Atomic size_t bytes;
    dj_status st;
} copier;

static void *copy_loop(void *arg) {
    copier *cp = arg;
    while (!atomic_load(&cp->stop) && cp->st == DJ_OK) {
        size_t off = 0;
        for (int part = 0; part < 2 && cp->st == DJ_OK; part++)
            for (uint32_t i = 0; cp->loads[part] && i < cp->loads[part]->n_spans && cp->st == DJ_OK; i++) {
                const dj_copy_span *sp = &cp->loads[part]->spans[i];
                cp->st = cp->be->vt->upload_weights(cp->be, sp->dev, cp->stage + off, sp->bytes);
                off += sp->bytes;
                atomic_fetch_add(&cp->bytes, sp->bytes);
            }
    }
    return NULL;
}

/* The rates, measured on one streamed layer: its copy into the ring from
 * page-locked staging (best of a few), its FFN's matmuls on the host at 1, 8
 * and 32 rows (best of a few), and - what a step with host runs meets - both at
 * once: the host's 1-row FFN while a thread copies the layer again and again
 * (the two share the host's memory; where the backend has no thread-safe
 * upload, the rates alone). */
typedef struct rates {
    double copy_gbps, t1, t8, t32; /* alone */
    double copy_busy, t1_busy;  /* at the same time */
    size_t mm_bytes;            /* the FFN matmuls' weight bytes */
} rates;

static dj_status measure(dj_model_t *m, uint32_t layer, rates *out) {
    dj_model_stream *s = m->stream;
    const dj_model_config *c = &m->cfg;
    dj_status st = DJ_OK;
    const int32_t ka = s->layer_load[layer], kf = s->layer_ffn[layer];
    const dj_stream_load *loads[2] = {ka >= 0 ? &s->loads[ka] : NULL, kf >= 0 ? &s->loads[kf] : NULL};
    /* the copy rate from page-locked memory (what the streamed weights will be read from once
     * dj__stream_source has locked them): the layer staged in host_alloc memory, copied into
     * the ring */
    size_t bytes = 0;
    for (int part = 0; part < 2; part++)
        for (uint32_t i = 0; loads[part] && i < loads[part]->n_spans; i++) bytes += loads[part]->spans[i].bytes;
    uint8_t *stage = NULL;
    if (!s->be->vt->host_alloc || !s->be->vt->host_free)
        return dj_fail(DJ_EUNSUPPORTED, "the %s backend has no page-locked memory to measure copies from",
                       s->be->vt->name);
    if ((st = s->be->vt->host_alloc(s->be, bytes, (void **)&stage)) != DJ_OK) return st;
    double best = 1e30;
    for (int r = 0; r < 4 && st == DJ_OK; r++) {
        size_t off = 0;
        if (r == 0) /* staged once: the first pass also faults the pages in */
            for (int part = 0; part < 2; part++)
                for (uint32_t i = 0; loads[part] && i < loads[part]->n_spans; i++) {
                    memcpy(stage + off, loads[part]->spans[i].host, loads[part]->spans[i].bytes);
                    off += loads[part]->spans[i].bytes;
                }
        off = 0;
        const double t0 = now();
        for (int part = 0; part < 2 && st == DJ_OK; part++)
            for (uint32_t i = 0; loads[part] && i < loads[part]->n_spans && st == DJ_OK; i++) {
                st = s->be->vt->upload(s->be, loads[part]->spans[i].dev, stage + off, loads[part]->spans[i].bytes);
                off += loads[part]->spans[i].bytes;
            }
        if (st == DJ_OK) st = s->be->vt->sync(s->be);
        const double t = now() - t0;
        if (r > 0 && t < best) best = t;
    }
    out->copy_gbps = st == DJ_OK ? (double)bytes / best * 1e-9 : 0.0;
    /* the FFN's matmuls on the host: gate and up read the width, down the FFN width */
    const size_t widest = c->hidden_size > c->intermediate_size ? c->hidden_size : c->intermediate_size;
    float *x = dj_calloc(32 * widest, sizeof *x), *y = dj_calloc(32 * widest, sizeof *y);
    if (st == DJ_OK && (!x || !y)) st = dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < 32 * widest && x; i++) x[i] = (float)((i * 37u) % 17u) * 0.01f;
    out->mm_bytes = 0;
    if (st == DJ_OK) st = ffn_time(m, layer, 1, 3, x, y, &out->t1, &out->mm_bytes);
    if (st == DJ_OK) st = ffn_time(m, layer, 8, 3, x, y, &out->t8, NULL);
    if (st == DJ_OK) st = ffn_time(m, layer, 32, 2, x, y, &out->t32, NULL);
    out->copy_busy = out->copy_gbps;
    out->t1_busy = out->t1;
    copier cp = {.be = s->be, .loads = {loads[0], loads[1]}, .stage = stage, .st = DJ_OK};
    pthread_t th;
    if (st == DJ_OK && s->be->vt->upload_weights && pthread_create(&th, NULL, copy_loop, &cp) == 0) {
        while (atomic_load(&cp.bytes) == 0 && cp.st == DJ_OK) sched_yield(); /* the copies under way */
        const size_t b0 = atomic_load(&cp.bytes);
        const double t0 = now();
        double one = 0.0, sum = 0.0;
        for (int r = 0; r < 6 && st == DJ_OK; r++) {
            st = ffn_time(m, layer, 1, 1, x, y, &one, NULL);
            sum += one;
        }
        const double t = now() - t0;
        const size_t b1 = atomic_load(&cp.bytes);
        atomic_store(&cp.stop, 1);
        pthread_join(th, NULL);
        if (st == DJ_OK) st = cp.st;
        if (st == DJ_OK && b1 > b0 && t > 0.0) {
            out->copy_busy = (double)(b1 - b0) / t * 1e-9;
            out->t1_busy = sum / 6.0 > out->t1 ? sum / 6.0 : out->t1; /* the copies never make it faster */
        }
    }
    s->be->vt->host_free(s->be, stage);
    free(x);
    free(y);
    return st;
}

/* f32, f16 and bf16: the weights a share reads in place through ldw. */
static bool dense_dtype(dj_dtype t) { return t == DJ_DTYPE_F32 || t == DJ_DTYPE_F16 || t == DJ_DTYPE_BF16; }

static bool no_bytes(const dj_model_t *m, uint32_t l, int slot) {
    return !dj__weight_has_bytes(&m->w[dj__wslot_layer_c(&m->cfg, (int)l, slot)]);
}

/* Whether layer l's FFN can be shared: gate [I][H], up [I][H], down [H][I]
 * of f32/f16/bf16, no biases, nothing after down but the residual ADD (a
 * norm there would not split), no experts. */
static bool shareable(const dj_model_t *m, uint32_t l, uint32_t width) {
    const dj_model_config *c = &m->cfg;
    const dj_weight *g = &m->w[dj__wslot_layer_c(c, (int)l, DJ_W_GATE)],
                    *u = &m->w[dj__wslot_layer_c(c, (int)l, DJ_W_UP)],
                    *d = &m->w[dj__wslot_layer_c(c, (int)l, DJ_W_DOWN)];
    const dj_weight *mats[3] = {g, u, d};
    for (int i = 0; i < 3; i++)
        if (!dj__weight_has_bytes(mats[i]) || !dense_dtype(mats[i]->dtype)) return false;
    const int none[] = {DJ_W_GATEB, DJ_W_UPB, DJ_W_DOWNB, DJ_W_POST_FFN_NORM, DJ_W_ROUTER};
    for (size_t i = 0; i < sizeof none / sizeof *none; i++)
        if (!no_bytes(m, l, none[i])) return false;
    for (int i = DJ_W_FIXED; i < dj__wslot_per_layer(c); i++)
        if (!no_bytes(m, l, i)) return false;
    const int64_t H = c->hidden_size, W = width;
    return g->shape[0] == W && u->shape[0] == W && g->shape[1] == H && u->shape[1] == H && d->shape[0] == H &&
           d->shape[1] == W;
}

dj_status dj__stream_host_setup(dj_model_t *m, int host_layers, double host_share) {
    dj_model_stream *s = m->stream;
    const dj_placement *pl = &s->pl;
    if (host_layers < 0 || (host_layers == 0 && s->be->host_memory)) return DJ_OK;
    uint32_t first = pl->n_layers; /* a streamed layer with an FFN load, for measuring */
    for (uint32_t l = 0; l < pl->n_layers && first == pl->n_layers; l++)
        if (pl->streamed[l] && s->layer_ffn[l] >= 0) first = l;
    if (first == pl->n_layers) return DJ_OK; /* nothing to compute on the host */
    s->host_layer = dj_calloc(pl->n_layers, 1);
    if (!s->host_layer) return dj_fail(DJ_ENOMEM, "out of memory");
    /* every core but one: the thread that enqueues the device's work (and waits on it, spinning)
     * keeps its own, so no pool worker is descheduled mid-op */
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    dj_status st = dj_backend_cpu_new(s->be->host_memory || cores < 3 ? 0 : (int)cores - 1, &s->host);
    if (st != DJ_OK) return st;
    uint32_t n = (uint32_t)host_layers;
    double share = host_share > 0.0 ? host_share : 1.0;
    const uint32_t width = m->w[dj__wslot_layer_c(&m->cfg, (int)first, DJ_W_GATE)].shape[0];
    s->host_rows = DJ_HOST_ROWS_FORCED;
    if (host_layers == 0) { /* from measured rates */
        rates rt;
        if ((st = measure(m, first, &rt)) != DJ_OK) return st;
        const double f = (double)span_bytes(&s->loads[s->layer_ffn[first]]);
        const double a = s->layer_load[first] >= 0 ? (double)span_bytes(&s->loads[s->layer_load[first]]) : 0.0;
        /* the rates at the same time decide: a step with host runs copies and computes at once */
        s->copy_gbps = rt.copy_busy;
        s->host_gbps = rt.mm_bytes && rt.t1_busy > 0 ? (double)rt.mm_bytes / rt.t1_busy * 1e-9 : 0.0; /* 0: MoE */
        DJ_LOG(INFO, "model %s: copies %.1f GB/s alone, %.1f beside the host; host FFN %.1f GB/s alone, %.1f beside "
                     "the copies", m->name, rt.copy_gbps, rt.copy_busy,
               rt.t1 > 0 ? (double)rt.mm_bytes / rt.t1 * 1e-9 : 0.0, s->host_gbps);
        const double busy = rt.t1 > 0 ? rt.t1_busy / rt.t1 : 1.0;
        if (host_share == 0.0 && s->host_gbps > 0.0) /* the host's share and the device's copies take as long */
            share = s->host_gbps * (a + f) / (f * (s->host_gbps + s->copy_gbps));
        if (dj_share_cols(share, width) && shareable(m, first, width)) {
            n = pl->n_streamed; /* every streamed layer shares its FFN */
        } else {
            share = 1.0;
            const double layer = (double)pl->streamed_bytes / pl->n_streamed;
            n = dj_host_count(pl->n_streamed, layer, f, s->copy_gbps, s->host_gbps);
        }
        /* the largest batch whose FFN share the host still runs no slower than the FFN copies:
         * the time in lines through the measured rows (1, 8, 32; on past 32), slowed as beside
         * the copies */
        const double copy_t = f / (s->copy_gbps * 1e9);
        s->host_rows = 0;
        for (uint32_t r = 1; r <= DJ_HOST_ROWS_MAX; r++) {
            const double t = r <= 8 ? rt.t1 + (rt.t8 - rt.t1) * (r - 1) / 7.0
                                    : rt.t8 + (rt.t32 - rt.t8) * (r - 8) / 24.0;
            if (share * t * busy > copy_t) break;
            s->host_rows = r;
        }
        if (!s->host_rows) n = 0;
    }
    dj_host_spread(pl, n, s->host_layer);
    for (uint32_t l = 0; l < pl->n_layers; l++)
        if (s->host_layer[l] && s->layer_ffn[l] < 0) s->host_layer[l] = 0;
    for (uint32_t l = 0; l < pl->n_layers; l++) s->n_host += s->host_layer[l];
    if (!s->n_host) {
        dj_backend_free(s->host);
        s->host = NULL;
        return DJ_OK;
    }
    s->runs = dj_calloc(pl->n_layers, sizeof *s->runs);
    s->step_loads = dj_calloc(s->n_loads, sizeof *s->step_loads);
    if (!s->runs || !s->step_loads) return dj_fail(DJ_ENOMEM, "out of memory");
    s->share_cols = dj_share_cols(share, width);
    if (s->share_cols) {
        if (!(s->share_layer = dj_calloc(pl->n_layers, 1))) return dj_fail(DJ_ENOMEM, "out of memory");
        uint32_t k = 0;
        for (uint32_t l = 0; l < pl->n_layers; l++)
            k += s->share_layer[l] = s->host_layer[l] && shareable(m, l, width);
        if (!k) s->share_cols = 0;
    }
    DJ_LOG(INFO, "model %s: the host computes %s of the FFN of %u of its %u streamed layers at up to %u rows "
                 "(copies %.1f GB/s, host %.1f GB/s)", m->name, s->share_cols ? "a share" : "all", s->n_host,
           pl->n_streamed, s->host_rows, s->copy_gbps, s->host_gbps);
    if (s->share_cols)
        DJ_LOG(INFO, "model %s: the host's share is %u of %u FFN columns", m->name, s->share_cols, width);
    return DJ_OK;
}

dj_status dj__stream_share_setup(dj_model_t *m) {
    dj_model_stream *s = m->stream;
    const dj_model_config *c = &m->cfg;
    size_t n_spans = 0;
    for (uint32_t l = 0; l < s->pl.n_layers; l++)
        if (s->share_layer[l]) n_spans += s->loads[s->layer_ffn[l]].n_spans;
    s->share_loads = dj_malloc(s->n_loads * sizeof *s->share_loads);
    s->share_spans = dj_malloc((n_spans ? n_spans : 1) * sizeof *s->share_spans);
    if (!s->share_loads || !s->share_spans) return dj_fail(DJ_ENOMEM, "out of memory");
    memcpy(s->share_loads, s->loads, s->n_loads * sizeof *s->loads);
    const size_t h = s->share_cols;
    size_t at = 0;
    for (uint32_t l = 0; l < s->pl.n_layers; l++) {
        if (!s->share_layer[l]) continue;
        dj_stream_load *L = &s->share_loads[s->layer_ffn[l]];
        const dj_weight *g = &m->w[dj__wslot_layer_c(c, (int)l, DJ_W_GATE)],
                        *u = &m->w[dj__wslot_layer_c(c, (int)l, DJ_W_UP)],
                        *d = &m->w[dj__wslot_layer_c(c, (int)l, DJ_W_DOWN)];
        dj_copy_span *sp = &s->share_spans[at];
        for (uint32_t i = 0; i < L->n_spans; i++) {
            sp[i] = L->spans[i];
            if (sp[i].dev == g->data || sp[i].dev == u->data) { /* rows [h, I): the device's */
                const dj_weight *w = sp[i].dev == g->data ? g : u;
                const size_t row = (size_t)w->shape[1] * dj_dtype_size(w->dtype);
                sp[i].host = (uint8_t *)sp[i].host + h * row;
                sp[i].bytes -= h * row;
            } else if (sp[i].dev == d->data) { /* columns [h, I) of every row, packed */
                const size_t es = dj_dtype_size(d->dtype), I = (size_t)d->shape[1];
                sp[i].host = (uint8_t *)sp[i].host + h * es;
                sp[i].bytes = (I - h) * es;
                sp[i].rows = (uint32_t)d->shape[0];
                sp[i].host_pitch = I * es;
            }
        }
        L->spans = sp;
        at += L->n_spans;
    }
    return DJ_OK;
}

/* ---- a step's host runs ---- */

/* Elements of a call's output, and of its inputs x / x2 / route (which 0, 1,
 * 2), from the op table's widths (every op: a write missed here would hide a
 * later read of a run's bytes). KV_WRITE writes pages, not activations;
 * EMBED reads ids. */
static size_t out_elems(const dj_op_call *c) {
    const dj_op_desc *d = dj_op_desc_of(c->op);
    return d ? c->n * dj_op_width(c, (dj_opd_width)d->out_width) : 0;
}

static size_t in_elems(const dj_op_call *c, int which) {
    const dj_op_desc *d = dj_op_desc_of(c->op);
    if (!d) return 0;
    return c->n * dj_op_width(c, which == 2 ? DJ_OPD_WIDTH_M : (dj_opd_width)d->x_width); /* route: [n][m] */
}

/* The activations of one run: device ranges and their host copies (f32). */
typedef struct region {
    const uint8_t *dev;
    size_t bytes;   /* on the device */
    size_t esize;   /* device element size */
    size_t off;     /* in the scratch */
    bool made;      /* written by the run (else an input copied in) */
} region;

typedef struct run_build {
    region *r;
    size_t n, cap;
    size_t scratch;  /* bytes used */
    bool ok;
} run_build;

static region *find(run_build *b, const void *p) {
    for (size_t i = b->n; i-- > 0;) /* the newest write first */
        if ((const uint8_t *)p >= b->r[i].dev && (const uint8_t *)p < b->r[i].dev + b->r[i].bytes) return &b->r[i];
    return NULL;
}

static region *add(run_build *b, const void *p, size_t elems, dj_dtype dev_dtype, bool made) {
    if (b->n == b->cap) {
        const size_t cap = b->cap ? 2 * b->cap : 16;
        region *r = dj_realloc(b->r, cap * sizeof *r);
        if (!r) {
            b->ok = false;
            return NULL;
        }
        b->r = r;
        b->cap = cap;
    }
    region *g = &b->r[b->n++];
    const size_t es = dj_dtype_size(dev_dtype);
    *g = (region){.dev = p, .bytes = elems * es, .esize = es, .off = b->scratch, .made = made};
    b->scratch += (elems * sizeof(float) + 63) / 64 * 64;
    return g;
}

/* An input p read by the run (as elems of dev_dtype): one it made, or a new
 * f32 input (the residual stream) - anything else the host cannot take as it
 * is. Returns its scratch offset + 1 as a pointer (NULL with b->ok false). */
static const void *input(run_build *b, const void *p, size_t elems, dj_dtype dev_dtype) {
    const region *g = find(b, p);
    if (!g) {
        if (dev_dtype != DJ_DTYPE_F32 || !(g = add(b, p, elems, dev_dtype, false))) {
            b->ok = false;
            return NULL;
        }
    }
    const size_t at = (size_t)((const uint8_t *)p - g->dev);
    if (at % g->esize) {
        b->ok = false;
        return NULL;
    }
    return (const void *)(uintptr_t)(g->off + at / g->esize * sizeof(float) + 1);
}

/* Whether any byte of [p, p + bytes) outside the run's result [rp, rp +
 * rbytes) (copied back to the device) is read by calls[from..n) before a
 * call overwrites it: such bytes the device never got. The bytes still live
 * are kept as up to LIVE_MAX ranges, each write cutting them; past that many,
 * it answers yes (the run is refused). */
#define LIVE_MAX 32
static bool read_later(const dj_op_call *calls, size_t from, size_t n, const uint8_t *p, size_t bytes,
                       const uint8_t *rp, size_t rbytes, dj_dtype act) {
    const uint8_t *lo[LIVE_MAX], *hi[LIVE_MAX];
    int nl = 0;
    if (p < rp) {
        lo[nl] = p;
        hi[nl++] = p + bytes < rp ? p + bytes : rp;
    }
    if (p + bytes > rp + rbytes) {
        lo[nl] = p > rp + rbytes ? p : rp + rbytes;
        hi[nl++] = p + bytes;
    }
    for (size_t j = from; j < n && nl > 0; j++) {
        const dj_op_call *c = &calls[j];
        const void *in[3] = {c->x, c->x2, c->route};
        const dj_dtype xd = dj_op_x_dtype(c, act);
        const dj_dtype dt[3] = {xd, act, DJ_DTYPE_F32};
        for (int t = 0; t < 3; t++) {
            const uint8_t *q = in[t];
            if (!q) continue;
            const uint8_t *qe = q + in_elems(c, t) * dj_dtype_size(dt[t]);
            for (int r = 0; r < nl; r++)
                if (q < hi[r] && qe > lo[r]) return true;
        }
        const uint8_t *o = c->out;
        if (!o) continue;
        const uint8_t *oe = o + out_elems(c) * dj_dtype_size(c->out_dtype);
        int m = 0;
        const uint8_t *nlo[LIVE_MAX], *nhi[LIVE_MAX];
        for (int r = 0; r < nl; r++) { /* each live range minus [o, oe): up to two pieces */
            const uint8_t *piece[2][2] = {{lo[r], hi[r] < o ? hi[r] : o}, {lo[r] > oe ? lo[r] : oe, hi[r]}};
            for (int k = 0; k < 2; k++)
                if (piece[k][0] < piece[k][1]) {
                    if (m == LIVE_MAX) return true;
                    nlo[m] = piece[k][0];
                    nhi[m++] = piece[k][1];
                }
        }
        memcpy(lo, nlo, (size_t)m * sizeof *lo);
        memcpy(hi, nhi, (size_t)m * sizeof *hi);
        nl = m;
    }
    return false;
}

static bool host_op(dj_op op) {
    const dj_op_desc *d = dj_op_desc_of(op);
    return d && (d->flags & DJ_OPD_HOST);
}

/* A layer's run: the device calls run[0, count) (call_load load[]) rewritten
 * into s->run_calls at *nc and s->run_spans at *ns, its regions laid out from
 * scratch offset 0; rest[0, n_rest) are the step's calls after them. False
 * when the range does not have the shape a host run needs. */
static bool build_run(dj_model_stream *s, const dj_op_call *run, const int32_t *load, size_t count,
                      const dj_op_call *rest, size_t n_rest, int32_t kf, run_build *b, size_t *nc, size_t *ns,
                      dj_host_run *h) {
    b->n = 0;
    b->scratch = 0;
    b->ok = true;
    const size_t c0 = *nc;
    for (size_t i = 0; i < count && b->ok; i++) {
        const dj_op_call *c = &run[i];
        dj_op_call hc = *c;
        if (!host_op(c->op) || (load[i] >= 0 && load[i] != kf)) return false;
        /* device-side dtypes of the inputs: x as the op table says (RMSNORM's and ADD's x_dtype), the rest act */
        const dj_dtype act = s->be->act_dtype;
        const dj_dtype xd = dj_op_x_dtype(c, act);
        /* pointers into the scratch are fixed once it exists: scratch offset + 1 until then. A
         * device element becomes an f32 one on the host: offsets scale with the element size. */
        hc.x = c->x ? (const void *)input(b, c->x, in_elems(c, 0), xd) : NULL;
        hc.x2 = c->x2 ? (const void *)input(b, c->x2, in_elems(c, 1), act) : NULL;
        hc.route = c->route ? (const float *)input(b, c->route, in_elems(c, 2), DJ_DTYPE_F32) : NULL;
        if (!b->ok) return false;
        if (!add(b, c->out, out_elems(c), c->out_dtype, true)) return false;
        hc.out = (void *)(uintptr_t)(b->r[b->n - 1].off + 1);
        hc.out_rows = 0; /* the scratch holds the call's own rows */
        hc.out_dtype = DJ_DTYPE_F32;
        hc.x_dtype = DJ_DTYPE_F32;
        /* weights: at their host addresses (a resident tensor is not in this layer's loads) */
        const void **wp[4] = {&hc.w, &hc.bias, &hc.w_up, &hc.w_down};
        for (int t = 0; t < 4; t++)
            if (*wp[t]) {
                const void *hw = host_of(s, kf, *wp[t]);
                if (!hw) return false;
                *wp[t] = hw;
            }
        s->run_calls[(*nc)++] = hc;
    }
    if (!b->ok || count == 0) return false;
    /* the run's result: the last call's output, the residual stream (f32 on the device) */
    const dj_op_call *last = &run[count - 1];
    if (last->op != DJ_OP_ADD || last->out_dtype != DJ_DTYPE_F32) return false;
    const region *res = &b->r[b->n - 1];
    for (size_t i = 0; i + 1 < b->n; i++) /* nothing else the run makes may be read after it */
        if (b->r[i].made &&
            read_later(rest, 0, n_rest, b->r[i].dev, b->r[i].bytes, res->dev, res->bytes, s->be->act_dtype))
            return false;
    h->join = 0;
    h->n_calls = (uint32_t)count;
    h->calls = &s->run_calls[c0];
    h->in = &s->run_spans[*ns];
    h->n_in = 0;
    for (size_t i = 0; i < b->n; i++)
        if (!b->r[i].made) {
            s->run_spans[(*ns)++] = (dj_copy_span){.dev = (void *)b->r[i].dev, .host = (void *)(uintptr_t)(b->r[i].off + 1),
                                                   .bytes = b->r[i].bytes};
            h->n_in++;
        }
    h->out = &s->run_spans[*ns];
    s->run_spans[(*ns)++] = (dj_copy_span){.dev = (void *)res->dev, .host = (void *)(uintptr_t)(res->off + 1),
                                           .bytes = res->bytes};
    h->n_out = 1;
    return true;
}

/* A share run of layer l's FFN calls[i, i + 6): norm, gate, up, GLU, down,
 * residual ADD. The host's calls take the first share_cols columns (down
 * reading its weight's rows in place, ldw the width); on success the
 * device's calls are narrowed to the other columns and their ADD reads the
 * host's result (the residual plus its share) in the scratch - as scratch
 * offset + 1 until the scratch exists - with no out copy. */
static bool share_run(dj_model_stream *s, dj_op_call *calls, size_t n_calls, size_t i, int32_t kf, uint32_t n_rows,
                      run_build *b, size_t *nc, size_t *ns, dj_host_run *h) {
    if (i + 6 > n_calls) return false;
    dj_op_call *c = calls + i;
    const uint32_t I = c[1].m, hc = s->share_cols;
    const bool glu = c[3].op == DJ_OP_SILU_MUL || c[3].op == DJ_OP_GELU_MUL;
    if (c[0].op != DJ_OP_RMSNORM || c[0].groups > 1 || c[1].op != DJ_OP_MATMUL || c[2].op != DJ_OP_MATMUL || !glu ||
        c[4].op != DJ_OP_MATMUL || c[5].op != DJ_OP_ADD)
        return false;
    for (int t = 1; t <= 4; t += 1 + (t == 2)) /* the three matmuls */
        if (c[t].bias || c[t].ldw || !dense_dtype(c[t].w_dtype) || s->call_load[i + t] != kf) return false;
    if (c[1].x != c[0].out || c[2].x != c[0].out || c[2].m != I || c[2].k != c[1].k || c[3].x != c[1].out ||
        c[3].x2 != c[2].out || c[3].d != I || c[4].x != c[3].out || c[4].k != I || c[5].x2 != c[4].out ||
        c[5].out_dtype != DJ_DTYPE_F32 || c[5].x_dtype != DJ_DTYPE_F32 || c[5].d != c[4].m || hc >= I ||
        n_rows > DJ_HOST_ROWS_MAX)
        return false;
    dj_op_call t[6];
    memcpy(t, c, sizeof t);
    t[1].m = t[2].m = hc;
    t[3].d = hc;
    t[4].k = hc;
    t[4].ldw = I;
    if (!build_run(s, t, s->call_load + i, 6, calls + i + 6, n_calls - i - 6, kf, b, nc, ns, h)) return false;
    h->first = (uint32_t)i + 1; /* after the device's norm: an ADD before it still fuses with it */
    h->join = (uint32_t)i + 5;
    c[1].m = c[2].m = I - hc;
    c[3].d = I - hc;
    c[4].k = I - hc;
    c[5].x = h->out[0].host;
    h->n_out = 0;
    (*ns)--; /* the out span is not copied */
    return true;
}

/* Scratch of at least bytes (the old one is released once the device is done with it). */
static dj_status scratch_room(dj_model_stream *s, size_t bytes) {
    if (bytes <= s->scratch_cap) return DJ_OK;
    dj_backend_t *be = s->be;
    const bool pinned = be->vt->host_alloc && be->vt->host_free;
    if (s->scratch) {
        const dj_status st = be->vt->sync(be);
        if (st != DJ_OK) return st;
        if (pinned) be->vt->host_free(be, s->scratch);
        else free(s->scratch);
        s->scratch = NULL;
        s->scratch_cap = 0;
    }
    void *p = NULL;
    if (pinned) {
        const dj_status st = be->vt->host_alloc(be, bytes, &p);
        if (st != DJ_OK) return st;
    } else if (posix_memalign(&p, 64, bytes) != 0) {
        return dj_fail(DJ_ENOMEM, "out of memory for %zu bytes of host-run scratch", bytes);
    }
    s->scratch = p;
    s->scratch_cap = bytes;
    return DJ_OK;
}

/* An offset + 1 made by build_run into a scratch address. */
static void *fix(dj_model_stream *s, const void *p) {
    return p ? s->scratch + ((uintptr_t)p - 1) : NULL;
}

dj_status dj__stream_host_runs(dj_model_stream *s, dj_op_call *calls, size_t n_calls, uint32_t n_rows) {
    s->n_runs = 0;
    s->step_saved = 0;
    if (!s->n_host || n_rows > s->host_rows) return DJ_OK;
    memcpy(s->step_loads, s->loads, s->n_loads * sizeof *s->loads);
    run_build b = {0};
    size_t nc = 0, ns = 0, scratch = 0;
    for (size_t i = 0; i < n_calls;) {
        const int32_t l = s->call_layer[i];
        const int32_t kf = l >= 0 && (uint32_t)l < s->pl.n_layers && s->host_layer[l] ? s->layer_ffn[l] : -1;
        if (kf < 0 || s->call_load[i] != kf) {
            i++;
            continue;
        }
        /* from the first call reading the FFN load through the last, then on through the
         * calls reading what the run made, up to and including the residual ADD */
        size_t z = i, last = i;
        while (z < n_calls && s->call_layer[z] == l) {
            if (s->call_load[z] == kf) last = z;
            z++;
        }
        size_t e = last + 1;
        bool closed = calls[last].op == DJ_OP_ADD;
        while (!closed && e < n_calls && host_op(calls[e].op) && s->call_load[e] < 0) {
            closed = calls[e].op == DJ_OP_ADD;
            e++;
        }
        dj_host_run *h = &s->runs[s->n_runs];
        const size_t nc0 = nc, ns0 = ns;
        if (closed && e == i + 6 && s->share_layer && s->share_layer[l] &&
            share_run(s, calls, n_calls, i, kf, n_rows, &b, &nc, &ns, h)) {
            s->step_loads[kf] = s->share_loads[kf]; /* the device's columns only */
            s->step_saved += span_bytes(&s->loads[kf]) - span_bytes(&s->share_loads[kf]);
        } else if ((nc = nc0, ns = ns0, closed) &&
                   build_run(s, calls + i, s->call_load + i, e - i, calls + e, n_calls - e, kf, &b, &nc, &ns, h)) {
            h->first = (uint32_t)i;
            for (size_t j = i; j < e; j++) s->call_load[j] = -1;
            s->step_saved += span_bytes(&s->loads[kf]);
        } else { /* this layer's FFN streams in this step */
            nc = nc0;
            ns = ns0;
            i = last + 1;
            continue;
        }
        if (b.scratch > scratch) scratch = b.scratch;
        s->n_runs++;
        i = e;
    }
    free(b.r);
    dj_status st = scratch_room(s, scratch);
    if (st != DJ_OK) {
        s->n_runs = 0;
        return st;
    }
    for (uint32_t j = 0; j < s->n_runs; j++) {
        dj_host_run *h = &s->runs[j];
        for (uint32_t t = 0; t < h->n_calls; t++) {
            dj_op_call *c = &s->run_calls[(h->calls - s->run_calls) + t];
            c->x = fix(s, c->x);
            c->x2 = fix(s, c->x2);
            c->route = fix(s, c->route);
            c->out = fix(s, c->out);
        }
        for (uint32_t t = 0; t < h->n_in; t++) s->run_spans[(h->in - s->run_spans) + t].host = fix(s, h->in[t].host);
        if (h->join) calls[h->join].x = fix(s, calls[h->join].x); /* the device's ADD reads the host's result */
        for (uint32_t t = 0; t < h->n_out; t++)
            s->run_spans[(h->out - s->run_spans) + t].host = fix(s, h->out[t].host);
    }
    return DJ_OK;
}
