/* host_run.c: host compute beside the weight ring - which streamed layers'
 * FFNs the host's cores run at small batches (from rates measured at load),
 * and each step's host runs: those FFN calls rewritten onto host memory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t span_bytes(const dj_stream_load *L) {
    size_t b = 0;
    for (uint32_t i = 0; i < L->n_spans; i++) b += L->spans[i].bytes;
    return b;
}

/* The host address of a ring tensor starting at p (a span of load k), or NULL. */
static const void *host_of(const dj_model_stream *s, int32_t k, const void *p) {
    for (uint32_t i = 0; k >= 0 && p && i < s->loads[k].n_spans; i++)
        if (s->loads[k].spans[i].dev == p) return s->loads[k].spans[i].host;
    return NULL;
}

/* Rates, best of a few tries: the copy of one streamed layer into the ring,
 * and the host running that layer's FFN matmuls at 1 and 8 rows. */
static dj_status measure(dj_model_t *m, uint32_t layer, double *copy_gbps, double *t1, double *t8,
                         size_t *mm_bytes) {
    dj_model_stream *s = m->stream;
    const dj_model_config *c = &m->cfg;
    dj_status st = DJ_OK;
    const int32_t ka = s->layer_load[layer], kf = s->layer_ffn[layer];
    /* the copy rate from page-locked memory (what the streamed weights will be read from once
     * dj__stream_source has locked them): the layer staged in host_alloc memory, copied into
     * the ring */
    size_t bytes = 0;
    for (int part = 0; part < 2; part++) {
        const int32_t k = part ? kf : ka;
        for (uint32_t i = 0; k >= 0 && i < s->loads[k].n_spans; i++) bytes += s->loads[k].spans[i].bytes;
    }
    uint8_t *stage = NULL;
    if (!s->be->vt->host_alloc || !s->be->vt->host_free)
        return dj_fail(DJ_EUNSUPPORTED, "the %s backend has no page-locked memory to measure copies from",
                       s->be->vt->name);
    if ((st = s->be->vt->host_alloc(s->be, bytes, (void **)&stage)) != DJ_OK) return st;
    double best = 1e30;
    for (int r = 0; r < 4 && st == DJ_OK; r++) {
        size_t off = 0;
        if (r == 0) /* staged once: the first pass also faults the pages in */
            for (int part = 0; part < 2; part++) {
                const int32_t k = part ? kf : ka;
                for (uint32_t i = 0; k >= 0 && i < s->loads[k].n_spans; i++) {
                    memcpy(stage + off, s->loads[k].spans[i].host, s->loads[k].spans[i].bytes);
                    off += s->loads[k].spans[i].bytes;
                }
            }
        off = 0;
        const double t0 = now();
        for (int part = 0; part < 2 && st == DJ_OK; part++) {
            const int32_t k = part ? kf : ka;
            for (uint32_t i = 0; k >= 0 && i < s->loads[k].n_spans && st == DJ_OK; i++) {
                st = s->be->vt->upload(s->be, s->loads[k].spans[i].dev, stage + off, s->loads[k].spans[i].bytes);
                off += s->loads[k].spans[i].bytes;
            }
        }
        if (st == DJ_OK) st = s->be->vt->sync(s->be);
        const double t = now() - t0;
        if (r > 0 && t < best) best = t;
    }
    s->be->vt->host_free(s->be, stage);
    if (st != DJ_OK) return st;
    *copy_gbps = (double)bytes / best * 1e-9;
    /* the FFN's matmuls on the host: gate and up read the width, down the FFN width */
    const int slots[3] = {DJ_W_GATE, DJ_W_UP, DJ_W_DOWN};
    size_t widest = c->hidden_size > c->intermediate_size ? c->hidden_size : c->intermediate_size;
    float *x = calloc(8 * widest, sizeof *x), *y = calloc(8 * widest, sizeof *y);
    if (!x || !y) st = dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < 8 * widest && x; i++) x[i] = (float)((i * 37u) % 17u) * 0.01f;
    for (int rows = 1; rows <= 8 && st == DJ_OK; rows += 7) {
        double tb = 1e30;
        for (int r = 0; r < 3 && st == DJ_OK; r++) {
            const double t0 = now();
            for (int j = 0; j < 3 && st == DJ_OK; j++) {
                const dj_weight *w = &m->w[dj__wslot_layer_c(c, (int)layer, slots[j])];
                const void *hw = host_of(s, kf, w->data);
                if (!hw) continue;
                if (rows == 1 && r == 0) *mm_bytes += dj_dtype_size(w->dtype) * (size_t)w->shape[0] * (size_t)w->shape[1];
                const dj_op_call call = {.op = DJ_OP_MATMUL, .n = (uint32_t)rows, .out = y, .x = x,
                                         .w = hw, .w_dtype = w->dtype, .k = (uint32_t)w->shape[1],
                                         .m = (uint32_t)w->shape[0]};
                st = dj_backend_compute(s->host, &call);
            }
            const double t = now() - t0;
            if (t < tb) tb = t;
        }
        if (rows == 1) *t1 = tb;
        else *t8 = tb;
    }
    free(x);
    free(y);
    return st;
}

dj_status dj__stream_host_setup(dj_model_t *m, int host_layers) {
    dj_model_stream *s = m->stream;
    const dj_placement *pl = &s->pl;
    if (host_layers < 0 || (host_layers == 0 && s->be->host_memory)) return DJ_OK;
    uint32_t first = pl->n_layers; /* a streamed layer with an FFN load, for measuring */
    for (uint32_t l = 0; l < pl->n_layers && first == pl->n_layers; l++)
        if (pl->streamed[l] && s->layer_ffn[l] >= 0) first = l;
    if (first == pl->n_layers) return DJ_OK; /* nothing to compute on the host */
    s->host_layer = calloc(pl->n_layers, 1);
    if (!s->host_layer) return dj_fail(DJ_ENOMEM, "out of memory");
    /* every core but one: the thread that enqueues the device's work (and waits on it, spinning)
     * keeps its own, so no pool worker is descheduled mid-op */
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    dj_status st = dj_backend_cpu_new(s->be->host_memory || cores < 3 ? 0 : (int)cores - 1, &s->host);
    if (st != DJ_OK) return st;
    uint32_t n = (uint32_t)host_layers;
    s->host_rows = DJ_HOST_ROWS_FORCED;
    if (host_layers == 0) { /* from measured rates */
        double t1 = 0, t8 = 0;
        size_t mm = 0;
        if ((st = measure(m, first, &s->copy_gbps, &t1, &t8, &mm)) != DJ_OK) return st;
        const double f = (double)span_bytes(&s->loads[s->layer_ffn[first]]);
        s->host_gbps = mm && t1 > 0 ? (double)mm / t1 * 1e-9 : 0.0; /* no dense MLP (MoE): not measured */
        const double layer = (double)pl->streamed_bytes / pl->n_streamed;
        n = dj_host_count(pl->n_streamed, layer, f, s->copy_gbps, s->host_gbps);
        /* the largest batch whose FFN the host still runs faster than it copies: the time
         * grows with rows from t1 (1 row) through t8 (8 rows), in a line */
        const double copy_t = f / (s->copy_gbps * 1e9), slope = (t8 - t1) / 7.0;
        s->host_rows = 0;
        for (uint32_t r = 1; r <= 256 && t1 + slope * (r - 1) <= copy_t; r++) s->host_rows = r;
        if (!s->host_rows) n = 0;
    }
    dj_host_spread(pl, n, s->host_layer);
    for (uint32_t l = 0; l < pl->n_layers; l++)
        if (s->host_layer[l] && s->layer_ffn[l] < 0) s->host_layer[l] = 0;
    for (uint32_t l = 0; l < pl->n_layers; l++)
        if (s->host_layer[l]) {
            s->n_host++;
            s->host_ffn_bytes += span_bytes(&s->loads[s->layer_ffn[l]]);
        }
    if (!s->n_host) {
        dj_backend_free(s->host);
        s->host = NULL;
        return DJ_OK;
    }
    s->runs = calloc(pl->n_layers, sizeof *s->runs);
    if (!s->runs) return dj_fail(DJ_ENOMEM, "out of memory");
    DJ_LOG(INFO, "model %s: the host computes the FFN of %u of its %u streamed layers at up to %u rows "
                 "(copies %.1f GB/s, host %.1f GB/s)", m->name, s->n_host, pl->n_streamed, s->host_rows,
           s->copy_gbps, s->host_gbps);
    return DJ_OK;
}

/* ---- a step's host runs ---- */

/* Elements of a call's output, and of its inputs x / x2 / route. */
static size_t out_elems(const dj_op_call *c) {
    const size_t n = c->n;
    switch (c->op) {
    case DJ_OP_RMSNORM: return n * (c->groups ? c->groups : 1) * c->d;
    case DJ_OP_MATMUL: case DJ_OP_MOE_ROUTE: return n * c->m;
    case DJ_OP_SILU_MUL: case DJ_OP_GELU_MUL: case DJ_OP_ADD: return n * c->d;
    case DJ_OP_MOE_FFN: return n * c->k;
    default: return 0;
    }
}

static size_t in_elems(const dj_op_call *c, int which) {
    const size_t n = c->n;
    switch (c->op) {
    case DJ_OP_MATMUL: return n * c->k;
    case DJ_OP_MOE_FFN: return which == 2 ? n * c->m : n * c->k;
    default: return out_elems(c); /* RMSNORM, SILU_MUL, GELU_MUL, ADD, MOE_ROUTE: as wide as out */
    }
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
        region *r = realloc(b->r, cap * sizeof *r);
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
        const dj_dtype xd = c->op == DJ_OP_RMSNORM || c->op == DJ_OP_ADD ? c->x_dtype
                            : c->op == DJ_OP_SOFTCAP                   ? DJ_DTYPE_F32
                                                                       : act;
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
    return op == DJ_OP_RMSNORM || op == DJ_OP_MATMUL || op == DJ_OP_SILU_MUL || op == DJ_OP_GELU_MUL ||
           op == DJ_OP_ADD || op == DJ_OP_MOE_ROUTE || op == DJ_OP_MOE_FFN;
}

/* Layer l's run over calls[a, z): rewritten into s->run_calls at *nc and
 * s->run_spans at *ns, its regions laid out from scratch offset 0. False when
 * the range does not have the shape a host run needs. */
static bool build_run(dj_model_stream *s, const dj_op_call *calls, size_t n_calls, size_t a, size_t z, int32_t kf,
                      run_build *b, size_t *nc, size_t *ns, dj_host_run *h) {
    b->n = 0;
    b->scratch = 0;
    b->ok = true;
    const size_t c0 = *nc;
    for (size_t i = a; i < z && b->ok; i++) {
        const dj_op_call *c = &calls[i];
        dj_op_call hc = *c;
        if (!host_op(c->op) || (s->call_load[i] >= 0 && s->call_load[i] != kf)) return false;
        /* device-side dtypes of the inputs: RMSNORM's and ADD's x are x_dtype, the rest act */
        const dj_dtype act = s->be->act_dtype;
        const dj_dtype xd = c->op == DJ_OP_RMSNORM || c->op == DJ_OP_ADD ? c->x_dtype : act;
        /* pointers into the scratch are fixed once it exists: scratch offset + 1 until then. A
         * device element becomes an f32 one on the host: offsets scale with the element size. */
        hc.x = c->x ? (const void *)input(b, c->x, in_elems(c, 0), xd) : NULL;
        hc.x2 = c->x2 ? (const void *)input(b, c->x2, in_elems(c, 1), act) : NULL;
        hc.route = c->route ? (const float *)input(b, c->route, in_elems(c, 2), DJ_DTYPE_F32) : NULL;
        if (!b->ok) return false;
        if (!add(b, c->out, out_elems(c), c->out_dtype, true)) return false;
        hc.out = (void *)(uintptr_t)(b->r[b->n - 1].off + 1);
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
    if (!b->ok || z == a) return false;
    /* the run's result: the last call's output, the residual stream (f32 on the device) */
    const dj_op_call *last = &calls[z - 1];
    if (last->op != DJ_OP_ADD || last->out_dtype != DJ_DTYPE_F32) return false;
    const region *res = &b->r[b->n - 1];
    for (size_t i = 0; i + 1 < b->n; i++) /* nothing else the run makes may be read after it */
        if (b->r[i].made &&
            read_later(calls, z, n_calls, b->r[i].dev, b->r[i].bytes, res->dev, res->bytes, s->be->act_dtype))
            return false;
    h->first = (uint32_t)a;
    h->n_calls = (uint32_t)(z - a);
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

dj_status dj__stream_host_runs(dj_model_stream *s, const dj_op_call *calls, size_t n_calls, uint32_t n_rows) {
    s->n_runs = 0;
    if (!s->n_host || n_rows > s->host_rows) return DJ_OK;
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
        if (closed && build_run(s, calls, n_calls, i, e, kf, &b, &nc, &ns, h)) {
            for (size_t j = i; j < e; j++) s->call_load[j] = -1;
            if (b.scratch > scratch) scratch = b.scratch;
            s->n_runs++;
            i = e;
        } else { /* this layer's FFN streams in this step */
            nc = nc0;
            ns = ns0;
            i = last + 1;
        }
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
        for (uint32_t t = 0; t < h->n_out; t++)
            s->run_spans[(h->out - s->run_spans) + t].host = fix(s, h->out[t].host);
    }
    return DJ_OK;
}
