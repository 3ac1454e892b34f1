/* gpu_check.c: every CUDA backend op against the CPU backend on fresh random
 * inputs (bf16 for the GPU, the same bf16-rounded values as f32 for the CPU),
 * by normalised error max|gpu-cpu|/max|cpu|, including per-row (batched)
 * calls, device argmax and recorded graphs; --bench times the hot kernels
 * (--bench-only: the timings without the checks, for a profiler).
 * Needs a GPU: built with -DDJ_CUDA=ON, run by scripts/gpu_check.sh, not ctest. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/backend.h"
#include "djinn/dj_cuda.h"
#include "djinn/dtype.h"
#include "djinn/sampler.h"
#include "testutil.h"

#define TOL 1e-2 /* bf16 activations: 2^-8 relative rounding, f32 accumulation */
/* e4m3 activations (the FP8 tensor-core GEMM): 2^-4 relative rounding each */
#define TOL_W8A8 8e-2
static double tol_now = TOL;

static dj_backend_t *cpu, *gpu;
static int device, n_rows, n_fail;

/* ---- helpers ---- */

static void die(const char *what) {
    fprintf(stderr, "gpu_check: %s: %s\n", what, dj_last_error());
    exit(2);
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "gpu_check: out of host memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

static void *dalloc(size_t bytes) {
    void *p = NULL;
    if (gpu->vt->alloc(gpu, bytes, &p) != DJ_OK) die("device alloc");
    return p;
}

static void dfree(void *p) { gpu->vt->free(gpu, p); }

static void up(void *dev, const void *host, size_t bytes) {
    if (gpu->vt->upload(gpu, dev, host, bytes) != DJ_OK) die("upload");
}

static void down(void *host, const void *dev, size_t bytes) {
    if (gpu->vt->download(gpu, host, dev, bytes) != DJ_OK) die("download");
}

/* Device copy of a host buffer. */
static void *dcopy(const void *host, size_t bytes) {
    void *d = dalloc(bytes);
    up(d, host, bytes);
    return d;
}

/* All bits set: NaN in f32 and in bf16. */
static void poison(void *dev, size_t bytes) {
    void *h = xmalloc(bytes);
    memset(h, 0xff, bytes);
    up(dev, h, bytes);
    free(h);
}

/* count random values in [lo, hi) rounded to bf16: bits in bf, values in f. */
static void rand_bf16(uint16_t *bf, float *f, size_t count, float lo, float hi) {
    for (size_t i = 0; i < count; i++) {
        bf[i] = dj_f32_to_bf16(dj_test_randf(lo, hi));
        f[i] = dj_bf16_to_f32(bf[i]);
    }
}

/* A weight of dtype t: bytes in w (host, the CPU reads them as they are). */
static void *rand_weight(dj_dtype t, size_t count, float lo, float hi) {
    void *w = xmalloc(count * dj_dtype_size(t));
    for (size_t i = 0; i < count; i++) {
        const float v = dj_test_randf(lo, hi);
        if (t == DJ_DTYPE_F32) ((float *)w)[i] = v;
        else if (t == DJ_DTYPE_F16) ((uint16_t *)w)[i] = dj_f32_to_f16(v);
        else ((uint16_t *)w)[i] = dj_f32_to_bf16(v);
    }
    return w;
}

static float *falloc(size_t count) { return xmalloc(count * sizeof(float)); }
static uint16_t *halloc(size_t count) { return xmalloc(count * sizeof(uint16_t)); }

/* count random activations in [lo, hi) as the device holds them: bf16, or
 * f32 (the residual stream, full f32 values); f receives their exact values.
 * Returns a host buffer (free). */
static void *rand_act(dj_dtype t, float *f, size_t count, float lo, float hi) {
    if (t == DJ_DTYPE_BF16) {
        uint16_t *b = halloc(count);
        rand_bf16(b, f, count, lo, hi);
        return b;
    }
    float *x = falloc(count);
    for (size_t i = 0; i < count; i++) f[i] = x[i] = dj_test_randf(lo, hi);
    return x;
}

/* GPU result (dtype t, count elements) against the CPU's; prints one row. */
static void compare(const char *op, const char *shape, const void *gpu_out, dj_dtype t, const float *ref,
                    size_t count) {
    float *g = falloc(count);
    if (t == DJ_DTYPE_F32) {
        down(g, gpu_out, count * sizeof(float));
    } else {
        uint16_t *h = halloc(count);
        down(h, gpu_out, count * sizeof(uint16_t));
        for (size_t i = 0; i < count; i++) g[i] = dj_bf16_to_f32(h[i]);
        free(h);
    }
    double maxd = 0.0, maxr = 0.0;
    for (size_t i = 0; i < count; i++) {
        const double d = fabs((double)g[i] - (double)ref[i]);
        if (!(d <= maxd)) maxd = d; /* NaN sticks */
        if (fabs((double)ref[i]) > maxr) maxr = fabs((double)ref[i]);
    }
    const double err = maxr > 0.0 ? maxd / maxr : maxd;
    const int ok = err <= tol_now; /* false for NaN */
    n_rows++;
    n_fail += !ok;
    printf("%-10s %-52s %10.3e  %s\n", op, shape, err, ok ? "pass" : "FAIL");
    free(g);
}

/* A status check that is a table row of its own. */
static void expect(const char *op, const char *what, dj_status got, dj_status want) {
    const int ok = got == want;
    n_rows++;
    n_fail += !ok;
    printf("%-10s %-52s %10s  %s\n", op, what, dj_status_name(got), ok ? "pass" : "FAIL");
    if (!ok) printf("           want %s; detail: %s\n", dj_status_name(want), dj_last_error());
}

static void run_both(const dj_op_call *cc, const dj_op_call *gc, const char *op) {
    if (dj_backend_compute(cpu, cc) != DJ_OK) die(op);
    if (dj_backend_compute(gpu, gc) != DJ_OK) die(op);
    if (gpu->vt->sync(gpu) != DJ_OK) die(op);
}

/* ---- ops ---- */

/* ot: the output's dtype, bf16 or f32 (the residual stream). */
/* scale: Gemma's embedding scale (0 = none). */
static void check_embed_scaled(uint32_t n, uint32_t d, uint32_t vocab, dj_dtype t, dj_dtype ot, float scale) {
    void *tab = rand_weight(t, (size_t)vocab * d, -1.0f, 1.0f);
    int32_t *ids = xmalloc(n * sizeof *ids);
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(dj_test_rand() % vocab);
    ids[0] = (int32_t)vocab - 1;
    float *ref = falloc((size_t)n * d);
    const size_t ob = (size_t)n * d * dj_dtype_size(ot);
    void *dtab = dcopy(tab, (size_t)vocab * d * dj_dtype_size(t)), *dout = dalloc(ob);
    poison(dout, ob);
    dj_op_call cc = {.op = DJ_OP_EMBED, .n = n, .out = ref, .w = tab, .w_dtype = t, .ids = ids, .d = d, .m = vocab,
                     .scale = scale};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.w = dtab;
    gc.out_dtype = ot;
    run_both(&cc, &gc, "embed");
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u d=%u vocab=%u table=%s out=%s%s", n, d, vocab, dj_dtype_name(t),
             dj_dtype_name(ot), scale != 0.0f ? " scaled" : "");
    compare("EMBED", shape, dout, ot, ref, (size_t)n * d);
    ids[n - 1] = (int32_t)vocab;
    expect("EMBED", "id == vocab", dj_backend_compute(gpu, &gc), DJ_ERANGE);
    dfree(dtab);
    dfree(dout);
    free(tab);
    free(ids);
    free(ref);
}

static void check_embed(uint32_t n, uint32_t d, uint32_t vocab, dj_dtype t, dj_dtype ot) {
    check_embed_scaled(n, d, vocab, t, ot, 0.0f);
}

/* xt: x's dtype, bf16 or f32 (the residual stream); groups d-wide groups per
 * row (per-head q/k norm, 0 = 1); the weight applied as (w + off) (Gemma). */
static void check_rmsnorm_v(uint32_t n, uint32_t d, dj_dtype t, dj_dtype xt, uint32_t groups, float off) {
    const size_t count = (size_t)n * d * (groups ? groups : 1);
    float *xf = falloc(count), *ref = falloc(count);
    void *xb = rand_act(xt, xf, count, -2.0f, 2.0f);
    void *w = rand_weight(t, d, 0.5f, 1.5f);
    void *dx = dcopy(xb, count * dj_dtype_size(xt)), *dw = dcopy(w, d * dj_dtype_size(t)), *dout = dalloc(count * 2);
    poison(dout, count * 2);
    dj_op_call cc = {.op = DJ_OP_RMSNORM, .n = n, .out = ref, .x = xf, .w = w, .w_dtype = t, .d = d, .eps = 1e-5f,
                     .w_offset = off, .groups = groups};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = dx;
    gc.x_dtype = xt;
    gc.w = dw;
    gc.out_dtype = DJ_DTYPE_BF16;
    run_both(&cc, &gc, "rmsnorm");
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u d=%u w=%s x=%s groups=%u w+%g", n, d, dj_dtype_name(t), dj_dtype_name(xt),
             groups, (double)off);
    compare("RMSNORM", shape, dout, DJ_DTYPE_BF16, ref, count);
    dfree(dx);
    dfree(dw);
    dfree(dout);
    free(xb);
    free(xf);
    free(ref);
    free(w);
}

static void check_rmsnorm(uint32_t n, uint32_t d, dj_dtype t, dj_dtype xt) { check_rmsnorm_v(n, d, t, xt, 0, 0.0f); }

/* ADD then the RMSNORM of its sum, as the decoder issues them: the CUDA
 * backend runs the pair as one kernel. mode 0: norm output apart; 1: the
 * norm writes over the add's first input; 2: the norm reads another buffer
 * (no fusion; the held ADD must still land); 3: fusion switched off. Rows
 * wider than 16384 (DJ_FUSE_MAX_D) are never fused. Both
 * outputs against the CPU, the fused ones bit-equal to the GPU's unfused
 * launches, and the fusion counter must move exactly when it should. */
static void check_add_rmsnorm(uint32_t n, uint32_t d, dj_dtype wt, int mode, dj_dtype rt) {
    const size_t count = (size_t)n * d, rb = count * dj_dtype_size(rt); /* rt: the residual stream's dtype */
    uint16_t *bb = halloc(count);
    float *af = falloc(count), *bf = falloc(count), *href = falloc(count), *nref = falloc(count);
    void *ab = rand_act(rt, af, count, -2.0f, 2.0f);
    rand_bf16(bb, bf, count, -2.0f, 2.0f);
    void *w = rand_weight(wt, d, 0.5f, 1.5f);
    dj_op_call cadd = {.op = DJ_OP_ADD, .n = n, .out = href, .x = af, .x2 = bf, .d = d};
    dj_op_call cnorm = {.op = DJ_OP_RMSNORM, .n = n, .out = nref, .x = mode == 2 ? af : href, .w = w, .w_dtype = wt,
                        .d = d, .eps = 1e-5f};
    if (dj_backend_compute(cpu, &cadd) != DJ_OK || dj_backend_compute(cpu, &cnorm) != DJ_OK) die("add+rmsnorm (cpu)");
    void *dw = dcopy(w, d * dj_dtype_size(wt));
    void *outs[2][2]; /* [fused, unfused][h, norm] */
    for (int pass = 0; pass < 2; pass++) {
        /* mode 1 writes the bf16 norm over a bf16 input: a, or b when a is f32 */
        void *da = dcopy(ab, rb), *db = dcopy(bb, count * 2), *dh = dalloc(rb);
        void *over = rt == DJ_DTYPE_BF16 ? da : db;
        void *dn = mode == 1 ? over : dalloc(count * 2);
        poison(dh, rb);
        if (mode != 1) poison(dn, count * 2);
        dj_op_call gadd = cadd, gnorm = cnorm;
        gadd.out = dh;
        gadd.x = da;
        gadd.x2 = db;
        gadd.x_dtype = gadd.out_dtype = rt;
        gnorm.out = dn;
        gnorm.x = mode == 2 ? da : dh;
        gnorm.x_dtype = rt;
        gnorm.w = dw;
        gnorm.out_dtype = DJ_DTYPE_BF16;
        dj__cuda_set_fuse(gpu, pass == 0 && mode != 3);
        const uint64_t before = dj__cuda_fusions(gpu);
        const dj_op_call plan[2] = {gadd, gnorm};
        if (dj_backend_compute_plan(gpu, plan, 2, NULL) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK)
            die("add+rmsnorm (gpu)");
        const uint64_t fused = dj__cuda_fusions(gpu) - before, want = pass == 0 && mode < 2 && d <= 16384;
        if (fused != want) {
            n_rows++;
            n_fail++;
            printf("%-10s %-52s %10s  FAIL (%llu fused, expected %llu)\n", "ADD+NORM", "fusion count", "-",
                   (unsigned long long)fused, (unsigned long long)want);
        }
        outs[pass][0] = dh;
        outs[pass][1] = dn;
        if (mode != 1 || over != da) dfree(da);
        if (mode != 1 || over != db) dfree(db);
    }
    dj__cuda_set_fuse(gpu, 1);
    static const char *modes[] = {"apart", "over input", "unrelated norm", "fusion off"};
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u d=%u w=%s res=%s %s: sum", n, d, dj_dtype_name(wt), dj_dtype_name(rt),
             modes[mode]);
    compare("ADD+NORM", shape, outs[0][0], rt, href, count);
    snprintf(shape, sizeof shape, "n=%u d=%u w=%s res=%s %s: norm", n, d, dj_dtype_name(wt), dj_dtype_name(rt),
             modes[mode]);
    compare("ADD+NORM", shape, outs[0][1], DJ_DTYPE_BF16, nref, count);
    /* fused against unfused launches: the same bytes (the sum in rt, the norm in bf16) */
    uint8_t *x0 = xmalloc(rb), *x1 = xmalloc(rb);
    size_t differ = 0;
    for (int k = 0; k < 2; k++) {
        const size_t bytes = k == 0 ? rb : count * 2;
        down(x0, outs[0][k], bytes);
        down(x1, outs[1][k], bytes);
        differ += memcmp(x0, x1, bytes) != 0;
    }
    n_rows++;
    n_fail += differ != 0;
    snprintf(shape, sizeof shape, "n=%u d=%u res=%s %s: fused = unfused", n, d, dj_dtype_name(rt), modes[mode]);
    printf("%-10s %-52s %10zu  %s\n", "ADD+NORM", shape, differ, differ ? "FAIL" : "pass");
    for (int pass = 0; pass < 2; pass++) {
        dfree(outs[pass][0]);
        dfree(outs[pass][1]);
    }
    dfree(dw);
    free(x0);
    free(x1);
    free(ab);
    free(bb);
    free(af);
    free(bf);
    free(href);
    free(nref);
    free(w);
}

/* path: 0 automatic, 1 GEMV, 2 GEMM (cuBLAS or tiled). skew: the GPU's
 * weights start that many elements into their buffer (misaligned for the
 * vector loads when odd). */
static void check_matmul_skew(uint32_t n, uint32_t k, uint32_t m, dj_dtype wt, int bias, dj_dtype out_t, int path,
                              uint32_t skew) {
    uint16_t *xb = halloc((size_t)n * k);
    float *xf = falloc((size_t)n * k), *ref = falloc((size_t)n * m);
    rand_bf16(xb, xf, (size_t)n * k, -1.0f, 1.0f);
    const float ws = 1.0f / sqrtf((float)k);
    void *w = rand_weight(wt, (size_t)m * k, -ws, ws);
    void *b = bias ? rand_weight(wt, m, -0.5f, 0.5f) : NULL;
    const size_t osz = (size_t)n * m * dj_dtype_size(out_t);
    const size_t wsz = (size_t)m * k * dj_dtype_size(wt), wskew = (size_t)skew * dj_dtype_size(wt);
    void *dx = dcopy(xb, (size_t)n * k * 2), *dw = dalloc(wsz + wskew), *dout = dalloc(osz);
    up((char *)dw + wskew, w, wsz);
    void *db = b ? dcopy(b, m * dj_dtype_size(wt)) : NULL;
    poison(dout, osz);
    dj_op_call cc = {.op = DJ_OP_MATMUL, .n = n, .out = ref, .x = xf, .w = w, .w_dtype = wt, .bias = b,
                     .bias_dtype = wt, .k = k, .m = m};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = dx;
    gc.w = (char *)dw + wskew;
    gc.bias = db;
    gc.out_dtype = out_t;
    dj__cuda_set_paths(gpu, 0, path);
    run_both(&cc, &gc, "matmul");
    dj__cuda_set_paths(gpu, 0, 0);
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u k=%u m=%u w=%s%s out=%s%s%s", n, k, m, dj_dtype_name(wt),
             bias ? "+bias" : "", dj_dtype_name(out_t), skew ? " skewed" : "",
             path == 1 ? " [gemv]" : path == 2 ? " [gemm]" : "");
    compare("MATMUL", shape, dout, out_t, ref, (size_t)n * m);
    dfree(dx);
    dfree(dw);
    dfree(dout);
    dfree(db);
    free(xb);
    free(xf);
    free(ref);
    free(w);
    free(b);
}

static void check_matmul(uint32_t n, uint32_t k, uint32_t m, dj_dtype wt, int bias, dj_dtype out_t, int path) {
    check_matmul_skew(n, k, m, wt, bias, out_t, path, 0);
}

/* rot: dims rotated (partial rotary; 0 = all of the head). */
/* Per-row RoPE tables (a batch of sessions with longrope's short and long
 * factors): row i takes a second table (inv over larger divisors) when
 * (7i + 3) % 5 < 2, else inv; crow: the CPU's [n] pointers, grow: a device
 * array of the device tables (dinv, dlong). */
typedef struct row_tabs {
    float *lng;
    const float **crow;
    void *dlong, *grow;
} row_tabs;

static void row_tabs_init(row_tabs *t, uint32_t n, uint32_t half, const float *inv, void *dinv) {
    t->lng = falloc(half);
    for (uint32_t j = 0; j < half; j++) t->lng[j] = inv[j] / (1.0f + 0.75f * (float)j);
    t->dlong = dcopy(t->lng, half * sizeof(float));
    t->crow = xmalloc(n * sizeof *t->crow);
    const void **g = xmalloc(n * sizeof *g);
    for (uint32_t i = 0; i < n; i++) {
        const int two = (7 * i + 3) % 5 < 2;
        t->crow[i] = two ? t->lng : inv;
        g[i] = two ? t->dlong : dinv;
    }
    t->grow = dcopy(g, n * sizeof *g);
    free(g);
}

static void row_tabs_free(row_tabs *t) {
    if (!t->lng) return;
    dfree(t->dlong);
    dfree(t->grow);
    free(t->lng);
    free(t->crow);
}

/* tabs: per-row tables (row_tabs) instead of inv_freq alone. */
static void check_rope_rot(uint32_t n, uint32_t nh, uint32_t hd, uint32_t pos0, float theta, float scale, int inplace,
                           uint32_t rot, int tabs) {
    const size_t count = (size_t)n * nh * hd;
    const uint32_t half = (rot ? rot : hd) / 2;
    uint16_t *xb = halloc(count);
    float *xf = falloc(count), *ref = falloc(count), *inv = falloc(half);
    rand_bf16(xb, xf, count, -2.0f, 2.0f);
    for (uint32_t j = 0; j < half; j++) inv[j] = (float)pow(theta, -1.0 * j / half);
    void *dx = dcopy(xb, count * 2), *dinv = dcopy(inv, half * sizeof(float));
    void *dout = inplace ? dx : dalloc(count * 2);
    if (!inplace) poison(dout, count * 2);
    row_tabs t = {0};
    if (tabs) row_tabs_init(&t, n, half, inv, dinv);
    dj_op_call cc = {.op = DJ_OP_ROPE, .n = n, .out = ref, .x = xf, .inv_freq = inv, .pos0 = pos0, .n_heads = nh,
                     .head_dim = hd, .scale = scale, .rot_dim = rot, .row_freq = t.crow};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = dx;
    gc.inv_freq = dinv;
    gc.row_freq = t.grow;
    gc.out_dtype = DJ_DTYPE_BF16;
    run_both(&cc, &gc, "rope");
    char shape[128];
    snprintf(shape, sizeof shape, "n=%u heads=%u hd=%u rot=%u pos0=%u theta=%g scale=%g%s%s", n, nh, hd, rot, pos0,
             (double)theta, (double)scale, inplace ? " in-place" : "", tabs ? " row tables" : "");
    compare("ROPE", shape, dout, DJ_DTYPE_BF16, ref, count);
    row_tabs_free(&t);
    dfree(dx);
    if (!inplace) dfree(dout);
    dfree(dinv);
    free(xb);
    free(xf);
    free(ref);
    free(inv);
}

static void check_rope(uint32_t n, uint32_t nh, uint32_t hd, uint32_t pos0, float theta, float scale, int inplace) {
    check_rope_rot(n, nh, hd, pos0, theta, scale, inplace, 0, 0);
}

/* xt, ot: dtypes of x and out (ADD may take and give the f32 residual
 * stream); x2 is bf16. */
static void check_elementwise(dj_op op, uint32_t n, uint32_t d, dj_dtype xt, dj_dtype ot) {
    const size_t count = (size_t)n * d, ob = count * dj_dtype_size(ot);
    uint16_t *bb = halloc(count);
    float *af = falloc(count), *bf = falloc(count), *ref = falloc(count);
    void *ab = rand_act(xt, af, count, -4.0f, 4.0f);
    rand_bf16(bb, bf, count, -4.0f, 4.0f);
    void *da = dcopy(ab, count * dj_dtype_size(xt)), *db = dcopy(bb, count * 2), *dout = dalloc(ob);
    poison(dout, ob);
    dj_op_call cc = {.op = op, .n = n, .out = ref, .x = af, .x2 = bf, .d = d};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = da;
    gc.x_dtype = xt;
    gc.x2 = db;
    gc.out_dtype = ot;
    run_both(&cc, &gc, dj_op_name(op));
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u d=%u x=%s out=%s", n, d, dj_dtype_name(xt), dj_dtype_name(ot));
    compare(op == DJ_OP_ADD ? "ADD" : op == DJ_OP_GELU_MUL ? "GELU_MUL" : "SILU_MUL", shape, dout, ot, ref, count);
    dfree(da);
    dfree(db);
    dfree(dout);
    free(ab);
    free(bb);
    free(af);
    free(bf);
    free(ref);
}

/* K/V for positions [0, ctx) in pages of both backends, the same shuffled
 * block table (plus two spare pages the table never names). */
typedef struct kv_pair {
    dj_kv_view cv, gv;      /* CPU (f32) and GPU (bf16) views */
    uint32_t *table;        /* [n_blocks] */
    uint32_t n_pages;
    void *gseg;             /* device */
} kv_pair;

static void kv_pair_init(kv_pair *p, uint32_t ctx, uint32_t tpp, uint32_t kv_dim) {
    const uint32_t n_blocks = (ctx + tpp - 1) / tpp;
    p->n_pages = n_blocks + 2;
    p->table = xmalloc(p->n_pages * sizeof(uint32_t));
    for (uint32_t i = 0; i < p->n_pages; i++) p->table[i] = i;
    for (uint32_t i = p->n_pages - 1; i > 0; i--) { /* Fisher-Yates */
        const uint32_t j = (uint32_t)(dj_test_rand() % (i + 1)), t = p->table[i];
        p->table[i] = p->table[j];
        p->table[j] = t;
    }
    const size_t cpage = 2u * tpp * kv_dim * sizeof(float) + 64, gpage = 2u * tpp * kv_dim * 2 + 64;
    uint8_t *cseg = xmalloc(cpage * p->n_pages);
    memset(cseg, 0xff, cpage * p->n_pages);
    p->gseg = dalloc(gpage * p->n_pages);
    poison(p->gseg, gpage * p->n_pages);
    p->cv = (dj_kv_view){.seg_base = cseg, .page_bytes = cpage, .block_table = p->table, .n_blocks = n_blocks,
                         .tokens_per_page = tpp, .kv_dim = kv_dim, .dtype = DJ_DTYPE_F32};
    p->gv = p->cv;
    p->gv.seg_base = p->gseg;
    p->gv.page_bytes = gpage;
    p->gv.dtype = DJ_DTYPE_BF16;
}

static void kv_pair_free(kv_pair *p) {
    free(p->cv.seg_base);
    dfree(p->gseg);
    free(p->table);
}

/* KV_WRITE rows [from, to) on both backends. */
static void kv_fill(kv_pair *p, uint32_t from, uint32_t to) {
    const size_t count = (size_t)(to - from) * p->cv.kv_dim;
    uint16_t *kb = halloc(count), *vb = halloc(count);
    float *kf = falloc(count), *vf = falloc(count);
    rand_bf16(kb, kf, count, -1.0f, 1.0f);
    rand_bf16(vb, vf, count, -1.0f, 1.0f);
    void *dk = dcopy(kb, count * 2), *dv = dcopy(vb, count * 2);
    dj_op_call cc = {.op = DJ_OP_KV_WRITE, .n = to - from, .x = kf, .x2 = vf, .kv = &p->cv, .pos0 = from};
    dj_op_call gc = cc;
    gc.x = dk;
    gc.x2 = dv;
    gc.kv = &p->gv;
    run_both(&cc, &gc, "kv_write");
    dfree(dk);
    dfree(dv);
    free(kb);
    free(vb);
    free(kf);
    free(vf);
}

/* Every written K/V row of the GPU pages against the CPU's; the spare pages
 * must still hold the poison. */
static void check_kv_pages(const kv_pair *p, uint32_t ctx, const char *shape, double tol) {
    const uint32_t tpp = p->cv.tokens_per_page, kvd = p->cv.kv_dim;
    uint16_t *g = halloc(p->gv.page_bytes / 2 * p->n_pages);
    down(g, p->gseg, p->gv.page_bytes * p->n_pages);
    float *gf = falloc((size_t)ctx * kvd * 2), *cf = falloc((size_t)ctx * kvd * 2);
    for (uint32_t t = 0; t < ctx; t++)
        for (int kv = 0; kv < 2; kv++) {
            const size_t row = (size_t)(kv ? tpp + t % tpp : t % tpp) * kvd;
            const uint16_t *gs = g + p->table[t / tpp] * (p->gv.page_bytes / 2) + row;
            const float *cs = (const float *)(const void *)(p->cv.seg_base + p->table[t / tpp] * p->cv.page_bytes) + row;
            for (uint32_t e = 0; e < kvd; e++) {
                gf[((size_t)t * 2 + kv) * kvd + e] = dj_bf16_to_f32(gs[e]);
                cf[((size_t)t * 2 + kv) * kvd + e] = cs[e];
            }
        }
    double maxd = 0.0, maxr = 0.0;
    for (size_t i = 0; i < (size_t)ctx * kvd * 2; i++) {
        const double d = fabs((double)gf[i] - (double)cf[i]);
        if (!(d <= maxd)) maxd = d;
        if (fabs((double)cf[i]) > maxr) maxr = fabs((double)cf[i]);
    }
    size_t stray = 0;
    for (uint32_t pg = p->cv.n_blocks; pg < p->n_pages; pg++)
        for (size_t e = 0; e < p->gv.page_bytes / 2; e++) stray += g[p->table[pg] * (p->gv.page_bytes / 2) + e] != 0xffff;
    const double err = maxd / maxr;
    const int ok = err <= tol && stray == 0; /* a copy: tol 0, exact */
    n_rows++;
    n_fail += !ok;
    printf("%-10s %-52s %10.3e  %s%s\n", "KV_WRITE", shape, err, ok ? "pass" : "FAIL",
           stray ? " (writes outside the mapped pages)" : "");
    free(g);
    free(gf);
    free(cf);
}

/* ROPE of k, then KV_WRITE of the rotated k (and v) at pos0.., as the
 * decoder issues them; with nq > 0 a ROPE of q (nq heads, same positions)
 * comes first. The CUDA backend runs them as one kernel when fusing. The
 * rotated k (and q) and every page row against the CPU, and the fusion
 * counter must move exactly when fusing. */
static void check_rope_kv_write(uint32_t n, uint32_t pos0, uint32_t nkv, uint32_t hd, uint32_t tpp, int inplace,
                                int fuse, uint32_t nq, int tabs) {
    const uint32_t ctx = pos0 + n, kvd = nkv * hd;
    kv_pair p;
    kv_pair_init(&p, ctx, tpp, kvd);
    if (pos0) kv_fill(&p, 0, pos0);
    const size_t count = (size_t)n * kvd;
    uint16_t *kb = halloc(count), *vb = halloc(count);
    float *kf = falloc(count), *vf = falloc(count), *kref = falloc(count), *inv = falloc(hd / 2);
    rand_bf16(kb, kf, count, -2.0f, 2.0f);
    rand_bf16(vb, vf, count, -2.0f, 2.0f);
    for (uint32_t j = 0; j < hd / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    void *dk = dcopy(kb, count * 2), *dv = dcopy(vb, count * 2), *dinv = dcopy(inv, hd / 2 * sizeof(float));
    void *dkr = inplace ? dk : dalloc(count * 2);
    if (!inplace) poison(dkr, count * 2);
    row_tabs t = {0};
    if (tabs) row_tabs_init(&t, n, hd / 2, inv, dinv);
    dj_op_call cr = {.op = DJ_OP_ROPE, .n = n, .out = kref, .x = kf, .inv_freq = inv, .pos0 = pos0, .n_heads = nkv,
                     .head_dim = hd, .scale = 1.0f, .row_freq = t.crow};
    dj_op_call cw = {.op = DJ_OP_KV_WRITE, .n = n, .x = kref, .x2 = vf, .kv = &p.cv, .pos0 = pos0};
    if (dj_backend_compute(cpu, &cr) != DJ_OK || dj_backend_compute(cpu, &cw) != DJ_OK) die("rope+kv_write (cpu)");
    dj_op_call gr = cr, gw = cw;
    gr.out = dkr;
    gr.x = dk;
    gr.inv_freq = dinv;
    gr.row_freq = t.grow;
    gr.out_dtype = DJ_DTYPE_BF16;
    gw.x = dkr;
    gw.x2 = dv;
    gw.kv = &p.gv;
    /* q: its own buffers, rotated in place when k is */
    const size_t qcount = (size_t)n * nq * hd;
    uint16_t *qb = halloc(qcount ? qcount : 1);
    float *qf = falloc(qcount ? qcount : 1), *qref = falloc(qcount ? qcount : 1);
    rand_bf16(qb, qf, qcount, -2.0f, 2.0f);
    void *dq = dcopy(qb, (qcount ? qcount : 1) * 2);
    void *dqr = inplace ? dq : dalloc((qcount ? qcount : 1) * 2);
    if (!inplace) poison(dqr, qcount * 2);
    dj_op_call cq = cr, gq = gr;
    cq.out = qref, cq.x = qf, cq.n_heads = nq;
    gq.out = dqr, gq.x = dq, gq.n_heads = nq;
    if (nq && dj_backend_compute(cpu, &cq) != DJ_OK) die("rope q (cpu)");
    dj__cuda_set_fuse(gpu, fuse);
    const uint64_t before = dj__cuda_fusions(gpu);
    const dj_op_call plan[3] = {gq, gr, gw};
    if (dj_backend_compute_plan(gpu, nq ? plan : plan + 1, nq ? 3 : 2, NULL) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK)
        die("rope+kv_write (gpu)");
    const uint64_t fused = dj__cuda_fusions(gpu) - before, want = fuse ? (nq ? 2u : 1u) : 0u;
    dj__cuda_set_fuse(gpu, 1);
    char shape[128];
    snprintf(shape, sizeof shape, "n=%u pos0=%u kv heads=%u q heads=%u hd=%u tpp=%u%s%s%s", n, pos0, nkv, nq, hd, tpp,
             inplace ? " in-place" : "", fuse ? "" : " unfused", tabs ? " row tables" : "");
    compare("ROPE+KV", shape, dkr, DJ_DTYPE_BF16, kref, count);
    if (nq) compare("ROPE+KV", "  the q heads of the same launch", dqr, DJ_DTYPE_BF16, qref, qcount);
    check_kv_pages(&p, ctx, shape, TOL);
    if (fused != want) {
        n_rows++;
        n_fail++;
        printf("%-10s %-52s %10s  FAIL (%llu fused, expected %llu)\n", "ROPE+KV", shape, "-",
               (unsigned long long)fused, (unsigned long long)want);
    }
    row_tabs_free(&t);
    if (!inplace) dfree(dqr);
    dfree(dq);
    free(qb);
    free(qf);
    free(qref);
    if (!inplace) dfree(dkr);
    dfree(dk);
    dfree(dv);
    dfree(dinv);
    free(kb);
    free(vb);
    free(kf);
    free(vf);
    free(kref);
    free(inv);
    kv_pair_free(&p);
}

/* Per-head RMSNORMs of q and k (Qwen3, Gemma 3: weights of dtype wt, applied
 * as w + off), the ROPEs of their outputs and k's KV_WRITE at pos0.., as the
 * decoder issues them: the CUDA backend runs the five as one kernel. Rotated
 * q and k and every page row against the CPU; the fused launch against the
 * unfused ones bit for bit (the rotated q and k, the norms' outputs); the
 * fusion counter moves by 4. inplace: each side in one buffer (norm and
 * rope in place); tabs: per-row RoPE tables. */
static void check_norm_rope_kv_write(uint32_t n, uint32_t pos0, uint32_t nkv, uint32_t nq, uint32_t hd, uint32_t tpp,
                                     dj_dtype wt, float off, int inplace, int tabs) {
    const uint32_t ctx = pos0 + n, kvd = nkv * hd;
    kv_pair p;
    kv_pair_init(&p, ctx, tpp, kvd);
    if (pos0) kv_fill(&p, 0, pos0);
    const size_t kc = (size_t)n * kvd, qc = (size_t)n * nq * hd;
    uint16_t *kb = halloc(kc), *vb = halloc(kc), *qb = halloc(qc);
    float *kf = falloc(kc), *vf = falloc(kc), *qf = falloc(qc), *kn = falloc(kc), *qn = falloc(qc), *kref = falloc(kc),
          *qref = falloc(qc), *inv = falloc(hd / 2);
    rand_bf16(kb, kf, kc, -3.0f, 3.0f);
    rand_bf16(vb, vf, kc, -2.0f, 2.0f);
    rand_bf16(qb, qf, qc, -3.0f, 3.0f);
    void *qw = rand_weight(wt, hd, off ? -0.5f : 0.5f, off ? 0.5f : 1.5f), *kw = rand_weight(wt, hd, 0.5f, 1.5f);
    for (uint32_t j = 0; j < hd / 2; j++) inv[j] = (float)pow(1000000.0, -2.0 * j / hd);
    void *dinv = dcopy(inv, hd / 2 * sizeof(float)), *dv = dcopy(vb, kc * 2);
    void *dqw = dcopy(qw, hd * dj_dtype_size(wt)), *dkw = dcopy(kw, hd * dj_dtype_size(wt));
    /* device buffers: raw q, k; the norms' outputs; the ROPEs' outputs (all one per side when in place) */
    void *dq = dalloc(qc * 2), *dk = dalloc(kc * 2);
    void *dqn = inplace ? dq : dalloc(qc * 2), *dkn = inplace ? dk : dalloc(kc * 2);
    void *dqr = inplace ? dq : dalloc(qc * 2), *dkr = inplace ? dk : dalloc(kc * 2);
    row_tabs t = {0};
    if (tabs) row_tabs_init(&t, n, hd / 2, inv, dinv);
    const float eps = 1e-6f;
    dj_op_call c[5] = {
        {.op = DJ_OP_RMSNORM, .n = n, .out = qn, .x = qf, .w = qw, .w_dtype = wt, .d = hd, .eps = eps, .w_offset = off,
         .groups = nq},
        {.op = DJ_OP_RMSNORM, .n = n, .out = kn, .x = kf, .w = kw, .w_dtype = wt, .d = hd, .eps = eps, .w_offset = off,
         .groups = nkv},
        {.op = DJ_OP_ROPE, .n = n, .out = qref, .x = qn, .inv_freq = inv, .row_freq = t.crow, .pos0 = pos0,
         .n_heads = nq, .head_dim = hd, .scale = 1.0f},
        {.op = DJ_OP_ROPE, .n = n, .out = kref, .x = kn, .inv_freq = inv, .row_freq = t.crow, .pos0 = pos0,
         .n_heads = nkv, .head_dim = hd, .scale = 1.0f},
        {.op = DJ_OP_KV_WRITE, .n = n, .x = kref, .x2 = vf, .kv = &p.cv, .pos0 = pos0}};
    for (int i = 0; i < 5; i++)
        if (dj_backend_compute(cpu, &c[i]) != DJ_OK) die("norm+rope+kv_write (cpu)");
    dj_op_call g[5];
    memcpy(g, c, sizeof g);
    g[0].x = dq, g[0].out = dqn, g[0].w = dqw;
    g[1].x = dk, g[1].out = dkn, g[1].w = dkw;
    g[2].x = dqn, g[2].out = dqr, g[2].inv_freq = dinv, g[2].row_freq = t.grow;
    g[3].x = dkn, g[3].out = dkr, g[3].inv_freq = dinv, g[3].row_freq = t.grow;
    g[4].x = dkr, g[4].x2 = dv, g[4].kv = &p.gv;
    for (int i = 0; i < 4; i++) g[i].x_dtype = g[i].out_dtype = DJ_DTYPE_BF16;
    /* unfused, then fused, each from fresh inputs; outputs poisoned before each */
    uint16_t *got[2][4]; /* [unfused, fused][q rotated, k rotated, q normed, k normed] */
    uint64_t fused = 0;
    for (int f = 0; f < 2; f++) {
        up(dq, qb, qc * 2);
        up(dk, kb, kc * 2);
        if (!inplace) {
            poison(dqn, qc * 2), poison(dkn, kc * 2), poison(dqr, qc * 2), poison(dkr, kc * 2);
        }
        dj__cuda_set_fuse(gpu, f);
        const uint64_t before = dj__cuda_fusions(gpu);
        if (dj_backend_compute_plan(gpu, g, 5, NULL) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK)
            die("norm+rope+kv_write (gpu)");
        if (f) fused = dj__cuda_fusions(gpu) - before;
        const void *src[4] = {dqr, dkr, dqn, dkn};
        const size_t cnt[4] = {qc, kc, qc, kc};
        for (int b = 0; b < 4; b++) {
            got[f][b] = halloc(cnt[b]);
            down(got[f][b], src[b], cnt[b] * 2);
        }
    }
    dj__cuda_set_fuse(gpu, 1);
    char shape[128];
    snprintf(shape, sizeof shape, "n=%u pos0=%u heads=%u:%u hd=%u w=%s+%g tpp=%u%s%s", n, pos0, nq, nkv, hd,
             dj_dtype_name(wt), (double)off, tpp, inplace ? " in-place" : "", tabs ? " row tables" : "");
    compare("NORM+ROPE", shape, dqr, DJ_DTYPE_BF16, qref, qc);
    compare("NORM+ROPE", "  the k heads", dkr, DJ_DTYPE_BF16, kref, kc);
    check_kv_pages(&p, ctx, shape, TOL);
    int differ = 0;
    for (int b = 0; b < (inplace ? 2 : 4); b++) differ += memcmp(got[0][b], got[1][b], (b % 2 ? kc : qc) * 2) != 0;
    n_rows++;
    n_fail += differ != 0 || fused != 4;
    printf("%-10s %-52s %10s  %s (%llu fused)\n", "NORM+ROPE", "  one launch against five: the same bits", "-",
           differ == 0 && fused == 4 ? "pass" : "FAIL", (unsigned long long)fused);
    for (int f = 0; f < 2; f++)
        for (int b = 0; b < 4; b++) free(got[f][b]);
    row_tabs_free(&t);
    if (!inplace) {
        dfree(dqn), dfree(dkn), dfree(dqr), dfree(dkr);
    }
    dfree(dq), dfree(dk), dfree(dv), dfree(dinv), dfree(dqw), dfree(dkw);
    free(kb), free(vb), free(qb), free(kf), free(vf), free(qf), free(kn), free(qn), free(kref), free(qref), free(inv);
    free(qw), free(kw);
    kv_pair_free(&p);
}

/* Every attention path in turn over one context's pages (cv: the CPU's
 * view, gv: the GPU's), n query rows at pos0.., each against the CPU's
 * output; tag ("" or "f8 ") starts the rows' names. The kernel each path
 * must have run: auto takes the wgmma kernel where it covers the call, else
 * tensor cores (mma.sync) for head_dim 64/128/256 from 8 rows on (every call
 * here is aligned); "tc" falls back to the f32 prefill elsewhere, "wg" to
 * what auto takes. */
static void check_attention_paths(const char *tag, const dj_kv_view *cv, const dj_kv_view *gv, uint32_t n,
                                  uint32_t pos0, uint32_t nh, uint32_t nkv, uint32_t hd, uint32_t tpp,
                                  uint32_t window, float softcap) {
    const size_t count = (size_t)n * nh * hd;
    uint16_t *qb = halloc(count);
    float *qf = falloc(count), *ref = falloc(count);
    rand_bf16(qb, qf, count, -2.0f, 2.0f);
    void *dq = dcopy(qb, count * 2), *dout = dalloc(count * 2);
    dj_op_call cc = {.op = DJ_OP_ATTENTION, .n = n, .out = ref, .x = qf, .kv = cv, .pos0 = pos0, .n_heads = nh,
                     .n_kv_heads = nkv, .head_dim = hd, .window = window, .scale = 1.0f / sqrtf((float)hd),
                     .softcap = softcap};
    if (dj_backend_compute(cpu, &cc) != DJ_OK) die("attention (cpu)");
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = dq;
    gc.kv = gv;
    gc.out_dtype = DJ_DTYPE_BF16;
    static const char *paths[] = {"auto", "decode", "prefill", "tc", "wg"};
    static const char *kernels[] = {"none", "decode", "prefill", "tc", "wg"};
    const int tc_covers = hd == 64 || hd == 128 || hd == 256;
    /* the wgmma kernel: bf16 pages, head_dim 128, no cap, pages of a power of two from 8 positions */
    const int wg_covers = gv->dtype == DJ_DTYPE_BF16 && hd == 128 && softcap == 0.0f && tpp >= 8 && !(tpp & (tpp - 1));
    const int pf = wg_covers ? 4 : tc_covers ? 3 : 2;
    const int expect_kernel[] = {n < 8 ? 1 : pf, 1, 2, tc_covers ? 3 : 2, pf};
    char shape[112];
    for (int path = 0; path < 5; path++) {
        poison(dout, count * 2);
        dj__cuda_set_paths(gpu, path, 0);
        if (dj_backend_compute(gpu, &gc) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) die("attention (gpu)");
        const int ran = dj__cuda_last_attention(gpu);
        snprintf(shape, sizeof shape, "%sn=%u pos0=%u heads=%u:%u hd=%u tpp=%u win=%u cap=%g [%s:%s]", tag, n, pos0,
                 nh, nkv, hd, tpp, window, (double)softcap, paths[path], kernels[ran >= 0 && ran <= 4 ? ran : 0]);
        compare("ATTENTION", shape, dout, DJ_DTYPE_BF16, ref, count);
        if (ran != expect_kernel[path]) {
            n_rows++;
            n_fail++;
            printf("%-10s %-52s %10s  FAIL (ran %s, expected %s)\n", "ATTENTION", shape, "-",
                   kernels[ran >= 0 && ran <= 4 ? ran : 0], kernels[expect_kernel[path]]);
        }
    }
    dj__cuda_set_paths(gpu, 0, 0);
    dfree(dq);
    dfree(dout);
    free(qb);
    free(qf);
    free(ref);
}

/* n query rows at positions pos0.. over a context written in two KV_WRITE
 * calls ([0, pos0) and [pos0, pos0+n)); each attention path in turn.
 * softcap: Gemma 2's score cap (0 = none). */
static void check_attention_cap(uint32_t n, uint32_t pos0, uint32_t nh, uint32_t nkv, uint32_t hd, uint32_t tpp,
                                uint32_t window, float softcap) {
    const uint32_t ctx = pos0 + n, kvd = nkv * hd;
    kv_pair p;
    kv_pair_init(&p, ctx, tpp, kvd);
    if (pos0) kv_fill(&p, 0, pos0);
    kv_fill(&p, pos0, ctx);
    char shape[96];
    snprintf(shape, sizeof shape, "ctx=%u pos0=%u n=%u kv_dim=%u tpp=%u pages=%u", ctx, pos0, n, kvd, tpp,
             p.n_pages);
    check_kv_pages(&p, ctx, shape, 0.0);
    check_attention_paths("", &p.cv, &p.gv, n, pos0, nh, nkv, hd, tpp, window, softcap);
    kv_pair_free(&p);
}

static void check_attention(uint32_t n, uint32_t pos0, uint32_t nh, uint32_t nkv, uint32_t hd, uint32_t tpp,
                            uint32_t window) {
    check_attention_cap(n, pos0, nh, nkv, hd, tpp, window, 0.0f);
}

/* ---- the ops beyond Llama: logit soft-cap, mixture of experts, Gemma's add+norm ---- */

static void check_softcap(uint32_t n, uint32_t d, float cap, int inplace) {
    const size_t count = (size_t)n * d;
    float *x = falloc(count), *ref = falloc(count);
    for (size_t i = 0; i < count; i++) x[i] = dj_test_randf(-4.0f * cap, 4.0f * cap);
    void *dx = dcopy(x, count * 4), *dout = inplace ? dx : dalloc(count * 4);
    if (!inplace) poison(dout, count * 4);
    dj_op_call cc = {.op = DJ_OP_SOFTCAP, .n = n, .out = ref, .x = x, .d = d, .softcap = cap};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = dx;
    gc.x_dtype = DJ_DTYPE_F32;
    run_both(&cc, &gc, "softcap");
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u d=%u cap=%g%s", n, d, (double)cap, inplace ? " in-place" : "");
    compare("SOFTCAP", shape, dout, DJ_DTYPE_F32, ref, count);
    dfree(dx);
    if (!inplace) dfree(dout);
    free(x);
    free(ref);
}

/* The router's top-k of m experts for n rows, then expert e's MLP over the
 * rows routed to it (k model width, f expert width), both against the CPU;
 * the GPU expert reads the CPU's routing so both pick the same rows. sum: an
 * earlier expert's output to add to (else none). An expert no row chose
 * (unrouted: its route column is zeroed) gives the sum unchanged: under 32
 * rows its NaN weights are never read, from 32 (the grouped GEMMs over the
 * routed rows) neither; with `captured` (32 rows and more) the call runs a
 * second time in a recorded graph, where the dense GEMMs over every row run
 * instead and read them and weight them out. */
static void check_moe_v(uint32_t n, uint32_t k, uint32_t f, uint32_t m, uint32_t top_k, dj_dtype wt, int sum,
                        int unrouted, int captured) {
    uint16_t *lb = halloc((size_t)n * m), *xb = halloc((size_t)n * k), *sb = halloc((size_t)n * k);
    float *lf = falloc((size_t)n * m), *xf = falloc((size_t)n * k), *sf = falloc((size_t)n * k);
    float *route = falloc((size_t)n * m), *ref = falloc((size_t)n * k);
    rand_bf16(lb, lf, (size_t)n * m, -3.0f, 3.0f);
    rand_bf16(xb, xf, (size_t)n * k, -1.0f, 1.0f);
    rand_bf16(sb, sf, (size_t)n * k, -1.0f, 1.0f);
    void *dl = dcopy(lb, (size_t)n * m * 2), *droute = dalloc((size_t)n * m * 4);
    dj_op_call cr = {.op = DJ_OP_MOE_ROUTE, .n = n, .out = route, .x = lf, .m = m, .top_k = top_k};
    dj_op_call gr = cr;
    gr.out = droute;
    gr.x = dl;
    gr.out_dtype = DJ_DTYPE_F32;
    run_both(&cr, &gr, "moe_route");
    char shape[112];
    snprintf(shape, sizeof shape, "n=%u experts=%u top_k=%u", n, m, top_k);
    compare("MOE_ROUTE", shape, droute, DJ_DTYPE_F32, route, (size_t)n * m);

    const uint32_t e = m - 1;
    if (unrouted)
        for (uint32_t i = 0; i < n; i++) route[(size_t)i * m + e] = 0.0f;
    up(droute, route, (size_t)n * m * 4);
    const size_t ws = dj_dtype_size(wt);
    void *wg = rand_weight(wt, (size_t)f * k, -0.1f, 0.1f), *wu = rand_weight(wt, (size_t)f * k, -0.1f, 0.1f);
    void *wd = rand_weight(wt, (size_t)k * f, -0.1f, 0.1f);
    void *dwg = dcopy(wg, (size_t)f * k * ws), *dwu = dcopy(wu, (size_t)f * k * ws), *dwd = dcopy(wd, (size_t)k * f * ws);
    if (unrouted) { /* never read: NaN would show in every routed row */
        poison(dwg, (size_t)f * k * ws);
        poison(dwu, (size_t)f * k * ws);
        poison(dwd, (size_t)k * f * ws);
    }
    void *dx = dcopy(xb, (size_t)n * k * 2), *ds = dcopy(sb, (size_t)n * k * 2), *dout = dalloc((size_t)n * k * 2);
    poison(dout, (size_t)n * k * 2);
    dj_op_call cc = {.op = DJ_OP_MOE_FFN, .n = n, .out = ref, .x = xf, .x2 = sum ? sf : NULL, .w = wg, .w_dtype = wt,
                     .w_up = wu, .w_down = wd, .route = route, .k = k, .d = f, .m = m, .expert = e};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = dx;
    gc.x2 = sum ? ds : NULL;
    gc.w = dwg;
    gc.w_up = dwu;
    gc.w_down = dwd;
    gc.route = droute;
    gc.out_dtype = DJ_DTYPE_BF16;
    run_both(&cc, &gc, "moe_ffn");
    snprintf(shape, sizeof shape, "n=%u k=%u f=%u expert %u of %u w=%s%s%s", n, k, f, e, m, dj_dtype_name(wt),
             sum ? " +sum" : "", unrouted ? " unrouted" : "");
    compare("MOE_FFN", shape, dout, DJ_DTYPE_BF16, ref, (size_t)n * k);
    if (captured) { /* recorded: the dense GEMMs (the eager run above sized the scratch) */
        dj_backend_graph_t *graph = NULL;
        poison(dout, (size_t)n * k * 2);
        if (gpu->vt->capture_begin(gpu) != DJ_OK || dj_backend_compute(gpu, &gc) != DJ_OK ||
            gpu->vt->capture_end(gpu, &graph) != DJ_OK || gpu->vt->graph_launch(gpu, graph) != DJ_OK ||
            gpu->vt->sync(gpu) != DJ_OK)
            die("moe_ffn recorded");
        gpu->vt->graph_free(gpu, graph);
        char rshape[128];
        snprintf(rshape, sizeof rshape, "%s recorded", shape);
        compare("MOE_FFN", rshape, dout, DJ_DTYPE_BF16, ref, (size_t)n * k);
    }
    dfree(dl);
    dfree(droute);
    dfree(dwg);
    dfree(dwu);
    dfree(dwd);
    dfree(dx);
    dfree(ds);
    dfree(dout);
    free(lb);
    free(xb);
    free(sb);
    free(lf);
    free(xf);
    free(sf);
    free(route);
    free(ref);
    free(wg);
    free(wu);
    free(wd);
}

static void check_moe(uint32_t n, uint32_t k, uint32_t f, uint32_t m, uint32_t top_k, dj_dtype wt, int sum,
                      int unrouted) {
    check_moe_v(n, k, f, m, top_k, wt, sum, unrouted, 0);
}

/* Gemma's sandwich: RMSNORM of a layer's output (1 + w), the ADD of it to the
 * residual stream, the RMSNORM of the sum, through compute_plan: the CUDA
 * backend runs the three as one kernel. The three outputs against the CPU,
 * fused bit-equal to the launches apart (DJINN_FUSE off), the fusion counter
 * up by 2 exactly when fused. */
static void check_norm_add_norm(uint32_t n, uint32_t d, dj_dtype rt) {
    const size_t count = (size_t)n * d, rb = count * dj_dtype_size(rt);
    float *af = falloc(count), *bf = falloc(count), *pref = falloc(count), *href = falloc(count);
    float *nref = falloc(count);
    uint16_t *bb = halloc(count);
    void *ab = rand_act(rt, af, count, -2.0f, 2.0f);
    rand_bf16(bb, bf, count, -3.0f, 3.0f);
    void *pw = rand_weight(DJ_DTYPE_BF16, d, -0.5f, 0.5f), *w = rand_weight(DJ_DTYPE_BF16, d, -0.5f, 0.5f);
    dj_op_call cc[3] = {{.op = DJ_OP_RMSNORM, .n = n, .out = pref, .x = bf, .w = pw, .w_dtype = DJ_DTYPE_BF16,
                         .d = d, .eps = 1e-6f, .w_offset = 1.0f},
                        {.op = DJ_OP_ADD, .n = n, .out = href, .x = af, .x2 = pref, .d = d},
                        {.op = DJ_OP_RMSNORM, .n = n, .out = nref, .x = href, .w = w, .w_dtype = DJ_DTYPE_BF16,
                         .d = d, .eps = 1e-6f, .w_offset = 1.0f}};
    if (dj_backend_compute_plan(cpu, cc, 3, NULL) != DJ_OK) die("norm + add + norm (cpu)");
    void *dpw = dcopy(pw, d * 2), *dw = dcopy(w, d * 2);
    void *outs[2][3]; /* [fused, apart][pre norm, sum, norm] */
    for (int pass = 0; pass < 2; pass++) {
        void *da = dcopy(ab, rb), *db = dcopy(bb, count * 2), *dp = dalloc(count * 2), *dh = dalloc(rb);
        void *dn = dalloc(count * 2);
        poison(dp, count * 2);
        poison(dh, rb);
        poison(dn, count * 2);
        dj_op_call gc[3] = {cc[0], cc[1], cc[2]};
        gc[0].x = db, gc[0].out = dp, gc[0].w = dpw, gc[0].x_dtype = gc[0].out_dtype = DJ_DTYPE_BF16;
        gc[1].x = da, gc[1].x2 = dp, gc[1].out = dh, gc[1].x_dtype = gc[1].out_dtype = rt;
        gc[2].x = dh, gc[2].out = dn, gc[2].w = dw, gc[2].x_dtype = rt, gc[2].out_dtype = DJ_DTYPE_BF16;
        dj__cuda_set_fuse(gpu, pass == 0);
        const uint64_t before = dj__cuda_fusions(gpu);
        if (dj_backend_compute_plan(gpu, gc, 3, NULL) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK)
            die("norm + add + norm (gpu)");
        const uint64_t fused = dj__cuda_fusions(gpu) - before, want = pass == 0 ? 2 : 0;
        if (fused != want) {
            n_rows++;
            n_fail++;
            printf("%-10s %-52s %10s  FAIL (%llu fused, expected %llu)\n", "NORM+ADD", "fusion count", "-",
                   (unsigned long long)fused, (unsigned long long)want);
        }
        outs[pass][0] = dp, outs[pass][1] = dh, outs[pass][2] = dn;
        dfree(da);
        dfree(db);
    }
    dj__cuda_set_fuse(gpu, 1);
    char shape[96];
    static const char *what[3] = {"pre norm", "sum", "norm"};
    const float *refs[3] = {pref, href, nref};
    const dj_dtype ts[3] = {DJ_DTYPE_BF16, rt, DJ_DTYPE_BF16};
    size_t differ = 0;
    uint8_t *x0 = xmalloc(rb > count * 2 ? rb : count * 2), *x1 = xmalloc(rb > count * 2 ? rb : count * 2);
    for (int k = 0; k < 3; k++) {
        snprintf(shape, sizeof shape, "n=%u d=%u res=%s w+1: %s", n, d, dj_dtype_name(rt), what[k]);
        compare("NORM+ADD", shape, outs[0][k], ts[k], refs[k], count);
        const size_t bytes = count * dj_dtype_size(ts[k]);
        down(x0, outs[0][k], bytes);
        down(x1, outs[1][k], bytes);
        differ += memcmp(x0, x1, bytes) != 0;
    }
    n_rows++;
    n_fail += differ != 0;
    snprintf(shape, sizeof shape, "n=%u d=%u res=%s: fused = apart", n, d, dj_dtype_name(rt));
    printf("%-10s %-52s %10zu  %s\n", "NORM+ADD", shape, differ, differ ? "FAIL" : "pass");
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < 3; k++) dfree(outs[pass][k]);
    dfree(dpw);
    dfree(dw);
    free(x0);
    free(x1);
    free(af);
    free(bf);
    free(pref);
    free(href);
    free(nref);
    free(bb);
    free(ab);
    free(pw);
    free(w);
}

/* Gemma's residual ADD then its (1 + w) RMSNORM through compute_plan (the
 * CUDA backend fuses the pair, offset included), against the CPU. */
static void check_add_norm_offset(uint32_t n, uint32_t d) {
    const size_t count = (size_t)n * d;
    float *af = falloc(count), *bf = falloc(count), *sum = falloc(count), *ref = falloc(count);
    uint16_t *bb = halloc(count);
    for (size_t i = 0; i < count; i++) af[i] = dj_test_randf(-2.0f, 2.0f);
    rand_bf16(bb, bf, count, -2.0f, 2.0f);
    void *w = rand_weight(DJ_DTYPE_BF16, d, -0.5f, 0.5f);
    void *da = dcopy(af, count * 4), *db = dcopy(bb, count * 2), *dsum = dalloc(count * 4);
    void *dw = dcopy(w, d * 2), *dout = dalloc(count * 2);
    poison(dout, count * 2);
    dj_op_call cc[2] = {{.op = DJ_OP_ADD, .n = n, .out = sum, .x = af, .x2 = bf, .d = d},
                        {.op = DJ_OP_RMSNORM, .n = n, .out = ref, .x = sum, .w = w, .w_dtype = DJ_DTYPE_BF16, .d = d,
                         .eps = 1e-6f, .w_offset = 1.0f}};
    dj_op_call gc[2] = {cc[0], cc[1]};
    gc[0].out = dsum, gc[0].x = da, gc[0].x2 = db, gc[0].x_dtype = DJ_DTYPE_F32, gc[0].out_dtype = DJ_DTYPE_F32;
    gc[1].out = dout, gc[1].x = dsum, gc[1].w = dw, gc[1].x_dtype = DJ_DTYPE_F32, gc[1].out_dtype = DJ_DTYPE_BF16;
    if (dj_backend_compute_plan(cpu, cc, 2, NULL) != DJ_OK || dj_backend_compute_plan(gpu, gc, 2, NULL) != DJ_OK ||
        gpu->vt->sync(gpu) != DJ_OK)
        die("add + rmsnorm (w + 1)");
    char shape[96];
    snprintf(shape, sizeof shape, "ADD+RMSNORM n=%u d=%u w+1 (plan)", n, d);
    compare("RMSNORM", shape, dout, DJ_DTYPE_BF16, ref, count);
    dfree(da);
    dfree(db);
    dfree(dsum);
    dfree(dw);
    dfree(dout);
    free(af);
    free(bf);
    free(sum);
    free(ref);
    free(bb);
    free(w);
}

/* LORA: n rows over n_ad adapters of ranks rank[a] (the last adapter adapts
 * nothing here: a NULL A), rows cycling through the adapters and -1 (the bare
 * base); out holds a MATMUL's result before. Against the CPU, and each row of
 * the device's batch bit-identical to the row computed alone. */
static void check_lora(uint32_t n, uint32_t k, uint32_t m, uint32_t n_ad, const uint32_t *rank) {
    const size_t xc = (size_t)n * k, oc = (size_t)n * m;
    float *xf = falloc(xc), *of = falloc(oc), *ref = falloc(oc);
    uint16_t *xb = halloc(xc), *ob = halloc(oc);
    rand_bf16(xb, xf, xc, -2.0f, 2.0f);
    rand_bf16(ob, of, oc, -4.0f, 4.0f);
    memcpy(ref, of, oc * sizeof(float));
    dj_lora_mat cm[8], gm[8];
    void *dev[16] = {0};
    float *host[16] = {0};
    for (uint32_t a = 0; a < n_ad && a < 8; a++) {
        memset(&cm[a], 0, sizeof cm[a]);
        if (a + 1 == n_ad) continue; /* adapts nothing here */
        const size_t ac = (size_t)rank[a] * k, bc = (size_t)m * rank[a];
        host[2 * a] = falloc(ac);
        host[2 * a + 1] = falloc(bc);
        for (size_t i = 0; i < ac; i++) host[2 * a][i] = dj_test_randf(-0.1f, 0.1f);
        for (size_t i = 0; i < bc; i++) host[2 * a + 1][i] = dj_test_randf(-0.1f, 0.1f);
        dev[2 * a] = dcopy(host[2 * a], ac * sizeof(float));
        dev[2 * a + 1] = dcopy(host[2 * a + 1], bc * sizeof(float));
        cm[a] = (dj_lora_mat){.a = host[2 * a], .b = host[2 * a + 1], .rank = rank[a], .ldb = rank[a],
                              .scale = 0.5f + (float)a};
    }
    for (uint32_t a = 0; a < n_ad && a < 8; a++) {
        gm[a] = cm[a];
        gm[a].a = dev[2 * a];
        gm[a].b = dev[2 * a + 1];
    }
    int32_t *rows = xmalloc(n * sizeof *rows);
    for (uint32_t i = 0; i < n; i++) rows[i] = (int32_t)(i % (n_ad + 1)) - 1;
    void *dx = dcopy(xb, xc * 2), *dout = dcopy(ob, oc * 2), *dalone = dcopy(ob, oc * 2);
    dj_op_call cc = {.op = DJ_OP_LORA, .n = n, .out = ref, .x = xf, .k = k, .m = m, .lora = cm, .n_lora = n_ad,
                     .lora_row = rows};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = dx;
    gc.out_dtype = gc.x_dtype = DJ_DTYPE_BF16;
    gc.lora = gm;
    run_both(&cc, &gc, "lora");
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u k=%u m=%u adapters=%u", n, k, m, n_ad);
    compare("LORA", shape, dout, DJ_DTYPE_BF16, ref, oc);
    for (uint32_t i = 0; i < n; i++) { /* each row alone */
        dj_op_call one = gc;
        one.n = 1;
        one.x = (const uint16_t *)dx + (size_t)i * k;
        one.out = (uint16_t *)dalone + (size_t)i * m;
        one.lora_row = &rows[i];
        if (dj_backend_compute(gpu, &one) != DJ_OK) die("lora alone");
    }
    if (gpu->vt->sync(gpu) != DJ_OK) die("lora alone");
    uint16_t *h1 = halloc(oc), *h2 = halloc(oc);
    down(h1, dout, oc * 2);
    down(h2, dalone, oc * 2);
    const int same = memcmp(h1, h2, oc * 2) == 0;
    n_rows++;
    n_fail += !same;
    printf("%-10s %-52s %10s  %s\n", "LORA", "each row as alone (bit-exact)", same ? "equal" : "differ",
           same ? "pass" : "FAIL");
    free(h1);
    free(h2);
    for (int i = 0; i < 16; i++) {
        if (dev[i]) dfree(dev[i]);
        free(host[i]);
    }
    dfree(dx);
    dfree(dout);
    dfree(dalone);
    free(rows);
    free(xf);
    free(of);
    free(ref);
    free(xb);
    free(ob);
}

static void check_arch_ops(void) {
    check_embed_scaled(37, 333, 1001, DJ_DTYPE_BF16, DJ_DTYPE_F32, 59.866f);
    check_embed_scaled(1, 3584, 4096, DJ_DTYPE_BF16, DJ_DTYPE_BF16, 59.866f);
    check_rmsnorm_v(37, 3584, DJ_DTYPE_BF16, DJ_DTYPE_F32, 0, 1.0f); /* Gemma: (1 + w) */
    check_rmsnorm_v(37, 128, DJ_DTYPE_BF16, DJ_DTYPE_BF16, 32, 0.0f); /* Qwen3 q_norm: 32 heads */
    check_rmsnorm_v(1, 256, DJ_DTYPE_BF16, DJ_DTYPE_BF16, 8, 1.0f);   /* Gemma 3 k_norm */
    check_rmsnorm_v(300, 128, DJ_DTYPE_BF16, DJ_DTYPE_BF16, 32, 0.0f); /* prefill rows, a warp a head */
    check_rmsnorm_v(3, 600, DJ_DTYPE_BF16, DJ_DTYPE_BF16, 2, 0.0f);    /* groups wider than a warp's limit */
    check_add_norm_offset(1, 3584);
    check_add_norm_offset(37, 2304);
    check_norm_add_norm(1, 3584, DJ_DTYPE_F32);  /* Gemma-2-9B decode */
    check_norm_add_norm(37, 2304, DJ_DTYPE_F32);
    check_norm_add_norm(3, 1000, DJ_DTYPE_BF16);
    check_norm_add_norm(300, 3584, DJ_DTYPE_F32); /* past 256 rows: blocks of 256 threads */
    check_rope_rot(37, 8, 128, 3, 10000.0f, 1.0f, 0, 64, 0);    /* partial rotary 0.5 */
    check_rope_rot(1, 24, 96, 4000, 10000.0f, 1.19f, 1, 96, 0); /* Phi-3 longrope shape: attention factor */
    check_rope_rot(5, 4, 128, 100, 10000.0f, 1.0f, 1, 32, 0);
    check_rope_rot(9, 32, 96, 5000, 10000.0f, 1.19f, 0, 0, 1);  /* longrope, a batch with both tables */
    check_rope_rot(13, 24, 128, 70, 10000.0f, 1.3f, 1, 96, 1);  /* Phi-4-mini's partial rotary, both tables */
    check_elementwise(DJ_OP_GELU_MUL, 1, 14336, DJ_DTYPE_BF16, DJ_DTYPE_BF16);
    check_elementwise(DJ_OP_GELU_MUL, 37, 333, DJ_DTYPE_BF16, DJ_DTYPE_BF16);
    check_elementwise(DJ_OP_GELU_MUL, 64, 14336, DJ_DTYPE_BF16, DJ_DTYPE_BF16); /* prefill rows, 8 a thread */
    check_softcap(1, 256000, 30.0f, 0);
    check_softcap(7, 1001, 8.0f, 1);
    { /* LoRA: decode batches over 3 adapters and the bare base, a prefill chunk, an 8B shape */
        const uint32_t r3[4] = {16, 8, 64, 0}, r1[2] = {16, 0};
        check_lora(7, 4096, 4096, 4, r3);
        check_lora(33, 333, 1001, 4, r3);
        check_lora(1, 4096, 14336, 2, r1);
    }
    /* Gemma 2: attention soft-cap 50 (decode, prefill, tensor cores at head_dim 256), windows */
    check_attention_cap(1, 3000, 16, 8, 256, 16, 4096, 50.0f);
    check_attention_cap(37, 10, 16, 8, 256, 16, 0, 50.0f);
    check_attention_cap(300, 200, 16, 8, 256, 16, 37, 50.0f); /* window inside a tile */
    check_attention_cap(512, 0, 16, 8, 256, 16, 0, 50.0f);    /* Gemma-2-9B heads */
    check_attention_cap(129, 0, 8, 4, 256, 7, 0, 0.0f);       /* Gemma 3: head_dim 256, no cap; odd pages */
    check_attention_cap(65, 3, 4, 1, 256, 32, 0, 30.0f);      /* MQA */
    check_attention_cap(64, 100, 8, 4, 128, 16, 30, 5.0f);
    check_attention_cap(3, 40, 8, 2, 64, 7, 0, 5.0f);
    /* Mixtral: 8 experts, top 2; decode and prefill rows; every weight dtype */
    check_moe(1, 4096, 14336, 8, 2, DJ_DTYPE_BF16, 0, 0);
    check_moe(1, 4096, 14336, 8, 2, DJ_DTYPE_BF16, 1, 1);
    check_moe(37, 512, 320, 8, 2, DJ_DTYPE_BF16, 1, 0);
    check_moe(37, 512, 320, 8, 2, DJ_DTYPE_F16, 0, 0);
    check_moe(5, 256, 96, 16, 4, DJ_DTYPE_F32, 1, 0);
    check_moe_v(64, 1024, 512, 8, 2, DJ_DTYPE_BF16, 1, 1, 1); /* recorded: GEMMs over every row, weighted out */
    check_moe_v(37, 512, 320, 8, 2, DJ_DTYPE_BF16, 0, 0, 1);
    check_moe(9, 1024, 512, 8, 2, DJ_DTYPE_BF16, 1, 0);  /* GEMV path: tiles of 4 routed rows */
    check_moe(31, 4096, 1024, 8, 2, DJ_DTYPE_BF16, 0, 0);
    /* grouped: the routed rows gathered (a scan over more rows than one block's 1024), GEMMs over them, scattered */
    check_moe(128, 1024, 512, 8, 2, DJ_DTYPE_BF16, 1, 0);
    check_moe(1500, 2048, 768, 8, 2, DJ_DTYPE_BF16, 1, 0);
    check_moe(1500, 2048, 768, 8, 2, DJ_DTYPE_BF16, 0, 1); /* no row chose it: weights never read */
    check_moe(300, 512, 320, 16, 4, DJ_DTYPE_BF16, 0, 0);
}

/* ---- per-row arguments, device ids, argmax, graph capture ---- */

/* Row-mode ATTENTION g_at again as the short-context class (the engine's
 * pos_bound hint: every row below the backend's short_pos), its own launch,
 * against the same CPU result; nothing when a row lies past the class. */
static void check_rows_short(const dj_op_call *g_at, const uint32_t *pos, uint32_t B, const char *shape0, void *dout,
                             const float *ref, size_t nq) {
    uint32_t pmax = 0;
    for (uint32_t r = 0; r < B; r++) pmax = pos[r] > pmax ? pos[r] : pmax;
    if (!gpu->short_pos || pmax >= gpu->short_pos) return;
    dj_op_call h_at = *g_at;
    h_at.pos_bound = gpu->short_pos;
    poison(dout, nq * 2);
    if (dj_backend_compute(gpu, &h_at) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) die("short-context attention");
    char shape[128];
    snprintf(shape, sizeof shape, "%s pos_bound %u", shape0, gpu->short_pos);
    compare("ATTN/rows", shape, dout, DJ_DTYPE_BF16, ref, nq);
}

/* B independent sequences in one segment (their own shuffled pages), each at
 * a random position: ROPE, KV_WRITE and ATTENTION with row_pos/row_tables
 * against the CPU. With `captured`, the GPU calls are recorded once and the
 * graph is launched twice, the second time at positions one further (new
 * inputs in the same buffers): one recording serves every position. */
static void check_rows(uint32_t B, uint32_t nh, uint32_t nkv, uint32_t hd, uint32_t tpp, uint32_t window,
                       int captured) {
    const uint32_t kvd = nkv * hd, qd = nh * hd, rounds = captured ? 2 : 1;
    uint32_t *pos = xmalloc(B * sizeof *pos), *nblk = xmalloc(B * sizeof *nblk), total = 0;
    for (uint32_t r = 0; r < B; r++) {
        pos[r] = (uint32_t)(dj_test_rand() % 600);
        nblk[r] = (pos[r] + rounds + tpp - 1) / tpp;
        total += nblk[r];
    }
    const uint32_t n_pages = total + 2;
    uint32_t *perm = xmalloc(n_pages * sizeof *perm);
    for (uint32_t i = 0; i < n_pages; i++) perm[i] = i;
    for (uint32_t i = n_pages - 1; i > 0; i--) {
        const uint32_t j = (uint32_t)(dj_test_rand() % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const size_t cpage = 2u * tpp * kvd * sizeof(float), gpage = 2u * tpp * kvd * 2;
    uint8_t *cseg = xmalloc(cpage * n_pages);
    memset(cseg, 0xff, cpage * n_pages);
    void *gseg = dalloc(gpage * n_pages);
    poison(gseg, gpage * n_pages);
    const uint32_t **ctab = xmalloc(B * sizeof *ctab);
    uint32_t **gtab_each = xmalloc(B * sizeof *gtab_each);
    uint32_t off = 0;
    dj_kv_view cv = {.seg_base = cseg, .page_bytes = cpage, .tokens_per_page = tpp, .kv_dim = kvd,
                     .dtype = DJ_DTYPE_F32};
    dj_kv_view gv = cv;
    gv.seg_base = gseg;
    gv.page_bytes = gpage;
    gv.dtype = DJ_DTYPE_BF16;
    for (uint32_t r = 0; r < B; r++) {
        ctab[r] = perm + off;
        gtab_each[r] = dcopy(perm + off, nblk[r] * sizeof(uint32_t));
        off += nblk[r];
        if (pos[r] == 0) continue;
        /* history [0, pos) through the plain path */
        const size_t count = (size_t)pos[r] * kvd;
        uint16_t *kb = halloc(count), *vb = halloc(count);
        float *kf = falloc(count), *vf = falloc(count);
        rand_bf16(kb, kf, count, -1.0f, 1.0f);
        rand_bf16(vb, vf, count, -1.0f, 1.0f);
        void *dk = dcopy(kb, count * 2), *dv = dcopy(vb, count * 2);
        dj_kv_view c1 = cv, g1 = gv;
        c1.block_table = g1.block_table = ctab[r];
        c1.n_blocks = g1.n_blocks = nblk[r];
        dj_op_call cc = {.op = DJ_OP_KV_WRITE, .n = pos[r], .x = kf, .x2 = vf, .kv = &c1};
        dj_op_call gc = cc;
        gc.x = dk;
        gc.x2 = dv;
        gc.kv = &g1;
        run_both(&cc, &gc, "kv_write history");
        dfree(dk);
        dfree(dv);
        free(kb);
        free(vb);
        free(kf);
        free(vf);
    }
    cv.block_table = gv.block_table = ctab[0]; /* layout only: rows bring their own tables */
    cv.n_blocks = gv.n_blocks = nblk[0];
    void *gtabs = dcopy(gtab_each, B * sizeof(void *));
    void *gpos = dalloc(B * sizeof(uint32_t));
    float *inv = falloc(hd / 2);
    for (uint32_t j = 0; j < hd / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    void *dinv = dcopy(inv, hd / 2 * sizeof(float));
    const size_t nq = (size_t)B * qd, nk = (size_t)B * kvd;
    uint16_t *qb = halloc(nq), *kb = halloc(nk), *vb = halloc(nk);
    float *qf = falloc(nq), *kf = falloc(nk), *vf = falloc(nk), *qr = falloc(nq), *kr = falloc(nk),
          *ref = falloc(nq);
    void *dq = dalloc(nq * 2), *dk = dalloc(nk * 2), *dv = dalloc(nk * 2), *dqr = dalloc(nq * 2),
         *dkr = dalloc(nk * 2), *dout = dalloc(nq * 2);
    dj_op_call c_rq = {.op = DJ_OP_ROPE, .n = B, .out = qr, .x = qf, .inv_freq = inv, .row_pos = pos,
                       .n_heads = nh, .head_dim = hd, .scale = 1.0f};
    dj_op_call c_rk = c_rq;
    c_rk.out = kr;
    c_rk.x = kf;
    c_rk.n_heads = nkv;
    dj_op_call c_kw = {.op = DJ_OP_KV_WRITE, .n = B, .x = kr, .x2 = vf, .kv = &cv, .row_pos = pos,
                       .row_tables = ctab};
    dj_op_call c_at = {.op = DJ_OP_ATTENTION, .n = B, .out = ref, .x = qr, .kv = &cv, .row_pos = pos,
                       .row_tables = ctab, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd, .window = window,
                       .scale = 1.0f / sqrtf((float)hd)};
    dj_op_call g_rq = c_rq, g_rk = c_rk, g_kw = c_kw, g_at = c_at;
    g_rq.out = dqr, g_rq.x = dq, g_rq.inv_freq = dinv, g_rq.row_pos = gpos, g_rq.out_dtype = DJ_DTYPE_BF16;
    g_rk.out = dkr, g_rk.x = dk, g_rk.inv_freq = dinv, g_rk.row_pos = gpos, g_rk.out_dtype = DJ_DTYPE_BF16;
    g_kw.x = dkr, g_kw.x2 = dv, g_kw.kv = &gv, g_kw.row_pos = gpos;
    g_kw.row_tables = (const uint32_t *const *)gtabs;
    g_at.out = dout, g_at.x = dqr, g_at.kv = &gv, g_at.row_pos = gpos, g_at.out_dtype = DJ_DTYPE_BF16;
    g_at.row_tables = (const uint32_t *const *)gtabs;
    g_at.decode_only = true; /* each row's position is this plan's KV_WRITE; the K/V before it are older */
    const dj_op_call gcalls[4] = {g_rq, g_rk, g_kw, g_at}; /* one plan: the ROPEs fuse with the KV_WRITE */
    dj_backend_graph_t *graph = NULL;
    if (captured) {
        if (gpu->vt->capture_begin(gpu) != DJ_OK) die("capture_begin");
        if (dj_backend_compute_plan(gpu, gcalls, 4, NULL) != DJ_OK) die("recorded compute");
        if (gpu->vt->capture_end(gpu, &graph) != DJ_OK) die("capture_end");
    }
    for (uint32_t round = 0; round < rounds; round++) {
        if (round)
            for (uint32_t r = 0; r < B; r++) pos[r]++;
        rand_bf16(qb, qf, nq, -2.0f, 2.0f);
        rand_bf16(kb, kf, nk, -1.0f, 1.0f);
        rand_bf16(vb, vf, nk, -1.0f, 1.0f);
        up(dq, qb, nq * 2);
        up(dk, kb, nk * 2);
        up(dv, vb, nk * 2);
        up(gpos, pos, B * sizeof(uint32_t));
        poison(dout, nq * 2);
        if (dj_backend_compute(cpu, &c_rq) != DJ_OK || dj_backend_compute(cpu, &c_rk) != DJ_OK ||
            dj_backend_compute(cpu, &c_kw) != DJ_OK || dj_backend_compute(cpu, &c_at) != DJ_OK)
            die("row-mode ops (cpu)");
        if (captured) {
            if (gpu->vt->graph_launch(gpu, graph) != DJ_OK) die("graph_launch");
        } else {
            if (dj_backend_compute_plan(gpu, gcalls, 4, NULL) != DJ_OK) die("row-mode ops (gpu)");
        }
        if (gpu->vt->sync(gpu) != DJ_OK) die("row-mode sync");
        char shape[96];
        snprintf(shape, sizeof shape, "rows=%u heads=%u:%u hd=%u tpp=%u win=%u%s", B, nh, nkv, hd, tpp, window,
                 captured ? (round ? " graph, pos+1" : " graph") : "");
        compare("ROPE/rows", shape, dqr, DJ_DTYPE_BF16, qr, nq);
        compare("ROPE k/rows", shape, dkr, DJ_DTYPE_BF16, kr, nk); /* fused with KV_WRITE */
        compare("ATTN/rows", shape, dout, DJ_DTYPE_BF16, ref, nq);
        if (!captured) check_rows_short(&g_at, pos, B, shape, dout, ref, nq);
    }
    gpu->vt->graph_free(gpu, graph);
    for (uint32_t r = 0; r < B; r++) dfree(gtab_each[r]);
    dfree(gtabs);
    dfree(gpos);
    dfree(dinv);
    dfree(dq);
    dfree(dk);
    dfree(dv);
    dfree(dqr);
    dfree(dkr);
    dfree(dout);
    dfree(gseg);
    free(cseg);
    free(gtab_each);
    free(ctab);
    free(perm);
    free(pos);
    free(nblk);
    free(inv);
    free(qb);
    free(kb);
    free(vb);
    free(qf);
    free(kf);
    free(vf);
    free(qr);
    free(kr);
    free(ref);
}

/* Decode matmuls of one plan launched as one: three on one x (k/v-sized
 * and with a bias among them), then one whose x is the first's output (must
 * see it complete), one sync at the end. */
static void check_matmul_group(uint32_t n, uint32_t k, dj_dtype wt) {
    const uint32_t ms[4] = {4 * k / 2, k / 4, k / 4, 300};
    const uint32_t ks[4] = {k, k, k, ms[0]};
    uint16_t *xb = halloc((size_t)n * k);
    float *xf = falloc((size_t)n * k);
    rand_bf16(xb, xf, (size_t)n * k, -1.0f, 1.0f);
    void *dx = dcopy(xb, (size_t)n * k * 2);
    void *w[4], *dw[4], *dout[4], *bias = rand_weight(DJ_DTYPE_BF16, ms[1], -1.0f, 1.0f);
    void *dbias = dcopy(bias, ms[1] * 2);
    float *ref[4];
    dj_op_call cc[4], gc[4];
    for (int i = 0; i < 4; i++) {
        w[i] = rand_weight(wt, (size_t)ms[i] * ks[i], -0.05f, 0.05f);
        dw[i] = dcopy(w[i], (size_t)ms[i] * ks[i] * dj_dtype_size(wt));
        dout[i] = dalloc((size_t)n * ms[i] * 2);
        poison(dout[i], (size_t)n * ms[i] * 2);
        ref[i] = falloc((size_t)n * ms[i]);
        cc[i] = (dj_op_call){.op = DJ_OP_MATMUL, .n = n, .out = ref[i], .x = xf, .w = w[i], .w_dtype = wt,
                             .k = ks[i], .m = ms[i]};
        gc[i] = cc[i];
        gc[i].out = dout[i];
        gc[i].x = dx;
        gc[i].w = dw[i];
        gc[i].out_dtype = DJ_DTYPE_BF16;
    }
    cc[1].bias = bias, cc[1].bias_dtype = DJ_DTYPE_BF16;
    gc[1].bias = dbias, gc[1].bias_dtype = DJ_DTYPE_BF16;
    cc[3].x = ref[0];
    gc[3].x = dout[0];
    for (int i = 0; i < 3; i++)
        if (dj_backend_compute(cpu, &cc[i]) != DJ_OK) die("matmul group (cpu)");
    /* the CPU's input of the dependent call is the GPU's (bf16-rounded) output */
    uint16_t *ob = halloc((size_t)n * ms[0]);
    if (dj_backend_compute_plan(gpu, gc, 4, NULL) != DJ_OK) die("matmul group (gpu)"); /* one plan: grouped */
    if (gpu->vt->sync(gpu) != DJ_OK) die("matmul group sync");
    down(ob, dout[0], (size_t)n * ms[0] * 2);
    float *x3 = falloc((size_t)n * ms[0]);
    for (size_t i = 0; i < (size_t)n * ms[0]; i++) x3[i] = dj_bf16_to_f32(ob[i]);
    cc[3].x = x3;
    if (dj_backend_compute(cpu, &cc[3]) != DJ_OK) die("matmul group (cpu)");
    for (int i = 0; i < 4; i++) {
        char shape[96];
        snprintf(shape, sizeof shape, "grouped %d/4: n=%u k=%u m=%u %s%s%s", i + 1, n, ks[i], ms[i],
                 dj_dtype_name(wt), i == 1 ? " +bias" : "", i == 3 ? " (x = output 1)" : "");
        compare("MATMUL", shape, dout[i], DJ_DTYPE_BF16, ref[i], (size_t)n * ms[i]);
        dfree(dw[i]);
        dfree(dout[i]);
        free(w[i]);
        free(ref[i]);
    }
    dfree(dx);
    dfree(dbias);
    free(bias);
    free(xb);
    free(xf);
    free(ob);
    free(x3);
}

/* The decode GEMV (forced, path 1): every
 * row count 1..8, k past the last full step of 16 chunks per lane (4104:
 * only lane 0 has a tail), long rows, k % 8 != 0 and skewed weights (the
 * scalar fallback), rows per block not dividing m, f16/f32 weights, bias,
 * f32 logits, and grouped calls. */
static void check_gemv(void) {
    for (uint32_t n = 1; n <= 8; n++)
        check_matmul(n, 512, 37 + 8 * n, DJ_DTYPE_BF16, n % 3 == 0, DJ_DTYPE_BF16, 1);
    check_matmul(1, 4104, 1001, DJ_DTYPE_BF16, 1, DJ_DTYPE_BF16, 1);
    check_matmul(1, 14336, 257, DJ_DTYPE_BF16, 0, DJ_DTYPE_BF16, 1);
    check_matmul(6, 14336, 63, DJ_DTYPE_BF16, 0, DJ_DTYPE_BF16, 1);
    check_matmul(2, 4100, 333, DJ_DTYPE_BF16, 1, DJ_DTYPE_BF16, 1);
    check_matmul(3, 37, 65, DJ_DTYPE_BF16, 0, DJ_DTYPE_BF16, 1);
    check_matmul_skew(1, 1024, 129, DJ_DTYPE_BF16, 0, DJ_DTYPE_BF16, 1, 1);
    check_matmul_skew(4, 1024, 129, DJ_DTYPE_F16, 1, DJ_DTYPE_BF16, 1, 4);
    check_matmul(1, 1, 9, DJ_DTYPE_BF16, 0, DJ_DTYPE_BF16, 1);
    check_matmul(1, 8, 1, DJ_DTYPE_BF16, 1, DJ_DTYPE_BF16, 1);
    check_matmul(5, 2048, 1000, DJ_DTYPE_F16, 1, DJ_DTYPE_BF16, 1);
    check_matmul(7, 2048, 999, DJ_DTYPE_F32, 1, DJ_DTYPE_BF16, 1);
    check_matmul(1, 4096, 5003, DJ_DTYPE_BF16, 0, DJ_DTYPE_F32, 1);
    check_matmul(8, 4096, 1000, DJ_DTYPE_F16, 1, DJ_DTYPE_F32, 1);
    check_matmul_group(1, 4096, DJ_DTYPE_BF16);
    check_matmul_group(8, 1024, DJ_DTYPE_BF16);
    check_matmul_group(3, 512, DJ_DTYPE_F16);
    check_matmul_group(2, 260, DJ_DTYPE_BF16); /* k % 8 != 0 */
}

/* f8_e4m3 weights with scales of br x bc weights each (per tensor: br = m,
 * bc = k; per channel: br = 1, bc = k; HF fp8: 128 x 128), against the CPU's
 * dequantize-then-multiply. path as check_matmul_skew (1: the fp8 GEMV, 2:
 * dequantized tiles + cuBLAS); skew: weight bytes into the buffer (odd: the
 * GEMV's scalar fallback). Codes span the whole e4m3 range but NaN; scales
 * vary per block, so a block indexed wrongly shows. */
static bool fp8_subnormal; /* the next check_matmul_fp8: subnormal codes only (reset by it) */
/* the next check_matmul_fp8: out has room for n rounded up to 4 (out_rows, as the engine gives it), and 4
 * rows more that must keep their poison - rows not a multiple of 4 then take cuBLASLt whole (reset by it) */
static bool fp8_room;

/* Random e4m3 codes over the format's whole range, and block scales near
 * 1 / (448 sqrt(k)) (outputs of order 1), drawn in order from the test RNG. */
static void rand_f8_codes(uint8_t *w, size_t count) {
    for (size_t i = 0; i < count; i++) w[i] = dj_f32_to_f8e4m3(dj_test_randf(-448.0f, 448.0f));
}
static void rand_f8_scales(float *s, size_t count, uint32_t k) {
    for (size_t i = 0; i < count; i++) s[i] = dj_test_randf(0.5f, 1.5f) / (448.0f * sqrtf((float)k));
}

static void check_matmul_fp8(uint32_t n, uint32_t k, uint32_t m, uint32_t br, uint32_t bc, int bias, dj_dtype out_t,
                             int path, uint32_t skew) {
    /* path 3 (FP8 tensor cores) quantizes the activations too: W8A8 against the W8A16 reference */
    /* F8_LT_MIN_ROWS; per channel / per tensor from k % 128 == 0 (VEC128 row scales); the tensor-core GEMV
     * (W8A16) where it takes the shape (f8_mma_takes) up to 16 rows, and up to 32 where cuBLASLt would not */
    const bool lt_auto = (br == 128 && bc == 128) || ((br == 1 || br == m) && bc >= k && k % 128 == 0);
    const uint32_t n4 = (n + 3) / 4 * 4, room = fp8_room ? n4 : n; /* rows out holds (past them: 4 poisoned) */
    const bool lt_takes = lt_auto && (n % 4 == 0 || fp8_room) && !bias && out_t == DJ_DTYPE_BF16;
    const bool mma = n >= 2 && n <= 32 && k % 64 == 0 && m % 16 == 0 && (bc % 64 == 0 || bc >= k) && !skew &&
                     (n <= 16 || !lt_takes);
    tol_now = path == 3 || (path == 0 && n >= 16 && lt_auto && !mma) ? TOL_W8A8 : TOL;
    uint16_t *xb = halloc((size_t)n * k);
    float *xf = falloc((size_t)n * k), *ref = falloc((size_t)n * m);
    rand_bf16(xb, xf, (size_t)n * k, -1.0f, 1.0f);
    uint8_t *w = xmalloc((size_t)m * k);
    rand_f8_codes(w, (size_t)m * k);
    if (fp8_subnormal) /* every code subnormal (exponent field 0, 2^-9 .. 7 * 2^-9), either sign: a flush to 0 shows */
        for (size_t i = 0; i < (size_t)m * k; i++) {
            const uint32_t r = (uint32_t)dj_test_rand();
            w[i] = (uint8_t)((r & 8 ? 0x80 : 0) | (1 + r % 7));
        }
    const uint32_t sr = (m + br - 1) / br, sc = (k + bc - 1) / bc;
    float *scale = falloc((size_t)sr * sc);
    rand_f8_scales(scale, (size_t)sr * sc, k);
    void *b = bias ? rand_weight(DJ_DTYPE_BF16, m, -0.5f, 0.5f) : NULL;
    const size_t rsz = (size_t)room * m * dj_dtype_size(out_t);
    const size_t tail = fp8_room ? (size_t)4 * m * dj_dtype_size(out_t) : 0;
    void *dx = dcopy(xb, (size_t)n * k * 2), *dw = dalloc((size_t)m * k + skew), *dout = dalloc(rsz + tail);
    up((char *)dw + skew, w, (size_t)m * k);
    void *ds = dcopy(scale, (size_t)sr * sc * sizeof(float));
    void *db = b ? dcopy(b, m * 2) : NULL;
    poison(dout, rsz + tail);
    dj_op_call cc = {.op = DJ_OP_MATMUL, .n = n, .out = ref, .x = xf, .w = w, .w_dtype = DJ_DTYPE_F8_E4M3,
                     .w_scale = scale, .w_block_rows = br, .w_block_cols = bc, .bias = b,
                     .bias_dtype = DJ_DTYPE_BF16, .k = k, .m = m};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = dx;
    gc.w = (char *)dw + skew;
    gc.w_scale = ds;
    gc.bias = db;
    gc.out_dtype = out_t;
    gc.out_rows = fp8_room ? room : 0;
    dj__cuda_set_paths(gpu, 0, path);
    run_both(&cc, &gc, "matmul fp8");
    dj__cuda_set_paths(gpu, 0, 0);
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u k=%u m=%u f8 %ux%u%s out=%s%s%s%s%s", n, k, m, br, bc, bias ? "+bias" : "",
             dj_dtype_name(out_t), skew ? " skewed" : "", fp8_subnormal ? " subnormal" : "",
             fp8_room ? " room" : "",
             path == 1 ? " [gemv]" : path == 2 ? " [tiles]" : path == 3 ? " [fp8 tc, W8A8]" : "");
    fp8_subnormal = false;
    compare("MATMUL", shape, dout, out_t, ref, (size_t)n * m);
    if (fp8_room) { /* the 4 rows past the room keep their poison: no write past out_rows */
        uint8_t *h = xmalloc(tail);
        down(h, (uint8_t *)dout + rsz, tail);
        size_t kept = 0;
        for (size_t i = 0; i < tail; i++) kept += h[i] == 0xff;
        n_rows++;
        n_fail += kept != tail;
        printf("%-10s %-52s %10zu  %s\n", "MATMUL", shape, tail - kept,
               kept == tail ? "pass (nothing written past out_rows)" : "FAIL (bytes written past out_rows)");
        free(h);
        fp8_room = false;
    }
    tol_now = TOL;
    dfree(dx);
    dfree(dw);
    dfree(dout);
    dfree(ds);
    dfree(db);
    free(xb);
    free(xf);
    free(ref);
    free(w);
    free(scale);
    free(b);
}

/* FP8 GEMMs of one input through compute_plan (q, k, v; gate, up): the
 * plan quantizes the activations once for the group (the fusion counter
 * moves by count - 1) and each output is bit for bit the call run alone,
 * and within the W8A8 bound of the CPU's W8A16 product. */
static void check_fp8_shared(uint32_t n, uint32_t k, int count, const uint32_t *ms) {
    tol_now = TOL_W8A8;
    uint16_t *xb = halloc((size_t)n * k);
    float *xf = falloc((size_t)n * k);
    rand_bf16(xb, xf, (size_t)n * k, -1.0f, 1.0f);
    void *dx = dcopy(xb, (size_t)n * k * 2);
    dj_op_call cc[4], gc[4];
    uint8_t *w[4];
    float *scale[4], *ref[4];
    void *dw[4], *ds[4], *dout[4], *dalone[4];
    for (int i = 0; i < count; i++) {
        const uint32_t m = ms[i], sr = m / 128, sc = k / 128;
        w[i] = xmalloc((size_t)m * k);
        rand_f8_codes(w[i], (size_t)m * k);
        scale[i] = falloc((size_t)sr * sc);
        rand_f8_scales(scale[i], (size_t)sr * sc, k);
        ref[i] = falloc((size_t)n * m);
        dw[i] = dcopy(w[i], (size_t)m * k);
        ds[i] = dcopy(scale[i], (size_t)sr * sc * sizeof(float));
        dout[i] = dalloc((size_t)n * m * 2);
        dalone[i] = dalloc((size_t)n * m * 2);
        poison(dout[i], (size_t)n * m * 2);
        poison(dalone[i], (size_t)n * m * 2);
        cc[i] = (dj_op_call){.op = DJ_OP_MATMUL, .n = n, .out = ref[i], .x = xf, .w = w[i],
                             .w_dtype = DJ_DTYPE_F8_E4M3, .w_scale = scale[i], .w_block_rows = 128,
                             .w_block_cols = 128, .k = k, .m = m};
        if (dj_backend_compute(cpu, &cc[i]) != DJ_OK) die("fp8 shared (cpu)");
        gc[i] = cc[i];
        gc[i].x = dx;
        gc[i].w = dw[i];
        gc[i].w_scale = ds[i];
        gc[i].out = dalone[i];
        gc[i].out_dtype = DJ_DTYPE_BF16;
        if (dj_backend_compute(gpu, &gc[i]) != DJ_OK) die("fp8 shared (gpu, alone)");
        gc[i].out = dout[i];
    }
    const uint64_t before = dj__cuda_fusions(gpu);
    if (dj_backend_compute_plan(gpu, gc, (size_t)count, NULL) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK)
        die("fp8 shared (gpu, plan)");
    const uint64_t saved = dj__cuda_fusions(gpu) - before;
    for (int i = 0; i < count; i++) {
        char shape[96];
        snprintf(shape, sizeof shape, "shared input %d/%d: n=%u k=%u m=%u f8 128x128 [fp8 tc, W8A8]", i + 1, count, n,
                 k, ms[i]);
        compare("MATMUL", shape, dout[i], DJ_DTYPE_BF16, ref[i], (size_t)n * ms[i]);
        const size_t bytes = (size_t)n * ms[i] * 2;
        uint8_t *a = xmalloc(bytes), *b = xmalloc(bytes);
        down(a, dout[i], bytes);
        down(b, dalone[i], bytes);
        n_rows++;
        if (memcmp(a, b, bytes) != 0) {
            n_fail++;
            printf("%-10s %-52s %10s  FAIL (differs from the call alone)\n", "MATMUL", shape, "-");
        } else {
            printf("%-10s %-52s %10s  pass (= the call alone)\n", "MATMUL", shape, "-");
        }
        free(a);
        free(b);
        dfree(dw[i]);
        dfree(ds[i]);
        dfree(dout[i]);
        dfree(dalone[i]);
        free(w[i]);
        free(scale[i]);
        free(ref[i]);
    }
    n_rows++;
    if (saved != (uint64_t)(count - 1)) {
        n_fail++;
        printf("%-10s %-52s %10s  FAIL (%llu quantizations saved, expected %d)\n", "MATMUL", "shared input group",
               "-", (unsigned long long)saved, count - 1);
    } else {
        printf("%-10s %-52s %10s  pass (%d quantizations saved)\n", "MATMUL", "shared input group", "-", count - 1);
    }
    tol_now = TOL;
    dfree(dx);
    free(xb);
    free(xf);
}

/* A SILU_MUL / GELU_MUL and the FP8 tensor-core GEMM of its output through
 * compute_plan: one step whose GLU kernel also quantizes (the fusion counter
 * moves by 1), both outputs bit for bit the calls run alone, the GEMM within
 * the W8A8 bound of the CPU's W8A16 product of the GLU's bf16 output. */
static void check_glu_fp8(dj_op op, uint32_t n, uint32_t d, uint32_t m) {
    tol_now = TOL_W8A8;
    const size_t nd = (size_t)n * d;
    uint16_t *gb = halloc(nd), *ub = halloc(nd), *hb = halloc(nd);
    float *gf = falloc(nd), *uf = falloc(nd), *hf = falloc(nd), *ref = falloc((size_t)n * m);
    rand_bf16(gb, gf, nd, -3.0f, 3.0f);
    rand_bf16(ub, uf, nd, -2.0f, 2.0f);
    uint8_t *w = xmalloc((size_t)m * d);
    rand_f8_codes(w, (size_t)m * d);
    const size_t ns = (size_t)(m / 128) * (d / 128);
    float *scale = falloc(ns);
    rand_f8_scales(scale, ns, d);
    void *dg = dcopy(gb, nd * 2), *du = dcopy(ub, nd * 2), *dw = dcopy(w, (size_t)m * d);
    void *ds = dcopy(scale, ns * sizeof(float));
    void *h_alone = dalloc(nd * 2), *h_plan = dalloc(nd * 2), *o_alone = dalloc((size_t)n * m * 2),
         *o_plan = dalloc((size_t)n * m * 2);
    poison(h_plan, nd * 2);
    poison(o_plan, (size_t)n * m * 2);
    dj_op_call gc[2] = {{.op = op, .n = n, .d = d, .x = dg, .x2 = du, .out = h_alone, .out_dtype = DJ_DTYPE_BF16},
                        {.op = DJ_OP_MATMUL, .n = n, .x = h_alone, .w = dw, .w_dtype = DJ_DTYPE_F8_E4M3,
                         .w_scale = ds, .w_block_rows = 128, .w_block_cols = 128, .k = d, .m = m,
                         .out = o_alone, .out_dtype = DJ_DTYPE_BF16}};
    for (int i = 0; i < 2; i++)
        if (dj_backend_compute(gpu, &gc[i]) != DJ_OK) die("glu fp8 (gpu, alone)");
    gc[0].out = h_plan;
    gc[1].x = h_plan;
    gc[1].out = o_plan;
    const uint64_t before = dj__cuda_fusions(gpu);
    if (dj_backend_compute_plan(gpu, gc, 2, NULL) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) die("glu fp8 (gpu, plan)");
    const uint64_t fused = dj__cuda_fusions(gpu) - before;
    down(hb, h_plan, nd * 2);
    for (size_t e = 0; e < nd; e++) hf[e] = dj_bf16_to_f32(hb[e]);
    dj_op_call cc = {.op = DJ_OP_MATMUL, .n = n, .x = hf, .w = w, .w_dtype = DJ_DTYPE_F8_E4M3, .w_scale = scale,
                     .w_block_rows = 128, .w_block_cols = 128, .k = d, .m = m, .out = ref};
    if (dj_backend_compute(cpu, &cc) != DJ_OK) die("glu fp8 (cpu)");
    char shape[96];
    snprintf(shape, sizeof shape, "%s then f8 GEMM: n=%u d=%u m=%u [fp8 tc, W8A8]",
             op == DJ_OP_SILU_MUL ? "SILU_MUL" : "GELU_MUL", n, d, m);
    compare("MATMUL", shape, o_plan, DJ_DTYPE_BF16, ref, (size_t)n * m);
    const void *pairs[2][2] = {{h_plan, h_alone}, {o_plan, o_alone}};
    const size_t sizes[2] = {nd * 2, (size_t)n * m * 2};
    for (int i = 0; i < 2; i++) {
        uint8_t *a = xmalloc(sizes[i]), *b = xmalloc(sizes[i]);
        down(a, pairs[i][0], sizes[i]);
        down(b, pairs[i][1], sizes[i]);
        n_rows++;
        const int same = memcmp(a, b, sizes[i]) == 0;
        n_fail += !same;
        printf("%-10s %-52s %10s  %s\n", i ? "MATMUL" : "GLU", shape, "-",
               same ? "pass (= the calls alone)" : "FAIL (differs from the calls alone)");
        free(a);
        free(b);
    }
    n_rows++;
    n_fail += fused != 1;
    printf("%-10s %-52s %10s  %s (%llu fused)\n", "MATMUL", shape, "-", fused == 1 ? "pass" : "FAIL",
           (unsigned long long)fused);
    tol_now = TOL;
    dfree(dg);
    dfree(du);
    dfree(dw);
    dfree(ds);
    dfree(h_alone);
    dfree(h_plan);
    dfree(o_alone);
    dfree(o_plan);
    free(gb);
    free(ub);
    free(hb);
    free(gf);
    free(uf);
    free(hf);
    free(ref);
    free(w);
    free(scale);
}

/* An ADD+RMSNORM (pre: with Gemma's RMSNORM in front) and the FP8
 * tensor-core GEMMs of its output (q, k, v; gate, up) through compute_plan:
 * the norm kernel quantizes its output for them (the fusion counter moves by
 * the norm's fusions + count), every output - sum, norm, GEMMs - bit for bit
 * the calls launched apart (fusion off: each GEMM quantizing the norm's bf16
 * output itself), the GEMMs within the W8A8 bound of the CPU's W8A16 product
 * of that output. */
static void check_norm_fp8(uint32_t n, uint32_t d, dj_dtype rt, int pre, int count, const uint32_t *ms) {
    const size_t nd = (size_t)n * d, rb = nd * dj_dtype_size(rt);
    const int nn = pre ? 3 : 2, nc = nn + count;
    float *af = falloc(nd), *bf = falloc(nd), *hf = falloc(nd);
    uint16_t *bb = halloc(nd), *hb = halloc(nd);
    void *ab = rand_act(rt, af, nd, -2.0f, 2.0f);
    rand_bf16(bb, bf, nd, -3.0f, 3.0f);
    void *pw = rand_weight(DJ_DTYPE_BF16, d, 0.5f, 1.5f), *w = rand_weight(DJ_DTYPE_BF16, d, 0.5f, 1.5f);
    void *dpw = dcopy(pw, d * 2), *dw = dcopy(w, d * 2);
    uint8_t *fw[4];
    float *scale[4];
    void *dfw[4], *ds[4];
    for (int i = 0; i < count; i++) {
        const size_t ns = (size_t)(ms[i] / 128) * (d / 128);
        fw[i] = xmalloc((size_t)ms[i] * d);
        rand_f8_codes(fw[i], (size_t)ms[i] * d);
        scale[i] = falloc(ns);
        rand_f8_scales(scale[i], ns, d);
        dfw[i] = dcopy(fw[i], (size_t)ms[i] * d);
        ds[i] = dcopy(scale[i], ns * sizeof(float));
    }
    void *outs[2][3 + 4]; /* [fused, apart][pre norm, sum, norm, GEMMs] */
    uint64_t fused = 0;
    for (int pass = 1; pass >= 0; pass--) { /* apart first: the GEMMs alone probe cuBLASLt */
        void *da = dcopy(ab, rb), *db = dcopy(bb, nd * 2), *dp = dalloc(nd * 2), *dh = dalloc(rb), *dn = dalloc(nd * 2);
        poison(dp, nd * 2);
        poison(dh, rb);
        poison(dn, nd * 2);
        dj_op_call gc[7];
        int k = 0;
        if (pre)
            gc[k++] = (dj_op_call){.op = DJ_OP_RMSNORM, .n = n, .out = dp, .x = db, .w = dpw, .w_dtype = DJ_DTYPE_BF16,
                                   .d = d, .eps = 1e-6f, .w_offset = 1.0f, .x_dtype = DJ_DTYPE_BF16,
                                   .out_dtype = DJ_DTYPE_BF16};
        gc[k++] = (dj_op_call){.op = DJ_OP_ADD, .n = n, .out = dh, .x = da, .x2 = pre ? dp : db, .d = d,
                               .x_dtype = rt, .out_dtype = rt};
        gc[k++] = (dj_op_call){.op = DJ_OP_RMSNORM, .n = n, .out = dn, .x = dh, .w = dw, .w_dtype = DJ_DTYPE_BF16,
                               .d = d, .eps = 1e-5f, .x_dtype = rt, .out_dtype = DJ_DTYPE_BF16};
        for (int i = 0; i < count; i++) {
            outs[pass][3 + i] = dalloc((size_t)n * ms[i] * 2);
            poison(outs[pass][3 + i], (size_t)n * ms[i] * 2);
            gc[k++] = (dj_op_call){.op = DJ_OP_MATMUL, .n = n, .x = dn, .w = dfw[i], .w_dtype = DJ_DTYPE_F8_E4M3,
                                   .w_scale = ds[i], .w_block_rows = 128, .w_block_cols = 128, .k = d, .m = ms[i],
                                   .out = outs[pass][3 + i], .out_dtype = DJ_DTYPE_BF16};
        }
        const uint64_t before = dj__cuda_fusions(gpu);
        if (pass == 1) {
            for (int i = 0; i < nc; i++)
                if (dj_backend_compute(gpu, &gc[i]) != DJ_OK) die("norm fp8 (gpu, apart)");
        } else if (dj_backend_compute_plan(gpu, gc, (size_t)nc, NULL) != DJ_OK) {
            die("norm fp8 (gpu, plan)");
        }
        if (gpu->vt->sync(gpu) != DJ_OK) die("norm fp8 (gpu)");
        if (pass == 0) fused = dj__cuda_fusions(gpu) - before;
        outs[pass][0] = dp, outs[pass][1] = dh, outs[pass][2] = dn;
        dfree(da);
        dfree(db);
    }
    char shape[112];
    snprintf(shape, sizeof shape, "%sADD+NORM then %d f8 GEMMs: n=%u d=%u res=%s", pre ? "NORM+" : "", count, n, d,
             dj_dtype_name(rt));
    /* the GEMMs against the CPU's W8A16 product of the GPU's bf16 norm output */
    down(hb, outs[0][2], nd * 2);
    for (size_t e = 0; e < nd; e++) hf[e] = dj_bf16_to_f32(hb[e]);
    tol_now = TOL_W8A8;
    for (int i = 0; i < count; i++) {
        float *ref = falloc((size_t)n * ms[i]);
        dj_op_call cc = {.op = DJ_OP_MATMUL, .n = n, .x = hf, .w = fw[i], .w_dtype = DJ_DTYPE_F8_E4M3,
                         .w_scale = scale[i], .w_block_rows = 128, .w_block_cols = 128, .k = d, .m = ms[i], .out = ref};
        if (dj_backend_compute(cpu, &cc) != DJ_OK) die("norm fp8 (cpu)");
        char g[160];
        snprintf(g, sizeof g, "%s: GEMM %d m=%u [fp8 tc, W8A8]", shape, i + 1, ms[i]);
        compare("MATMUL", g, outs[0][3 + i], DJ_DTYPE_BF16, ref, (size_t)n * ms[i]);
        free(ref);
    }
    tol_now = TOL;
    size_t differ = 0;
    for (int k = pre ? 0 : 1; k < 3 + count; k++) {
        const size_t bytes = k == 1 ? rb : k < 3 ? nd * 2 : (size_t)n * ms[k - 3] * 2;
        uint8_t *x0 = xmalloc(bytes), *x1 = xmalloc(bytes);
        down(x0, outs[0][k], bytes);
        down(x1, outs[1][k], bytes);
        differ += memcmp(x0, x1, bytes) != 0;
        free(x0);
        free(x1);
    }
    n_rows++;
    n_fail += differ != 0;
    printf("%-10s %-52s %10zu  %s\n", "NORM+F8", shape, differ,
           differ ? "FAIL (outputs differ from apart)" : "pass (= apart)");
    const uint64_t want = (uint64_t)(nn - 1 + count);
    n_rows++;
    n_fail += fused != want;
    printf("%-10s %-52s %10s  %s (%llu fused, expected %llu)\n", "NORM+F8", shape, "-", fused == want ? "pass" : "FAIL",
           (unsigned long long)fused, (unsigned long long)want);
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < 3 + count; k++) dfree(outs[pass][k]);
    for (int i = 0; i < count; i++) {
        dfree(dfw[i]);
        dfree(ds[i]);
        free(fw[i]);
        free(scale[i]);
    }
    dfree(dpw);
    dfree(dw);
    free(pw);
    free(w);
    free(ab);
    free(af);
    free(bf);
    free(hf);
    free(bb);
    free(hb);
}

/* How many of the device buffers a[i], b[i] (bytes[i] each, i < count) differ. */
static size_t buffers_differ(void *const *a, void *const *b, const size_t *bytes, int count) {
    size_t differ = 0;
    for (int i = 0; i < count; i++) {
        uint8_t *x0 = xmalloc(bytes[i]), *x1 = xmalloc(bytes[i]);
        down(x0, a[i], bytes[i]);
        down(x1, b[i], bytes[i]);
        differ += memcmp(x0, x1, bytes[i]) != 0;
        free(x0);
        free(x1);
    }
    return differ;
}

/* A row saying whether a plan's buffers came out as the calls launched apart left them. */
static void report_apart(const char *op, const char *shape, size_t differ) {
    n_rows++;
    n_fail += differ != 0;
    printf("%-10s %-52s %10zu  %s\n", op, shape, differ, differ ? "FAIL (buffers differ from apart)" : "pass (= apart)");
}

/* FP8 weights (issue 16): the GEMV for 1..8 rows (every scaling, k % 16 != 0
 * and a skewed buffer for the scalar path, bias, f32 logits), then the tiled
 * path (several tiles with a partial last one: k = 14336 makes 1152-row
 * tiles), automatic choice at 1 and 32 rows. */
/* Two MLP layers of FP8 128x128-block weights through compute_plan, as a
 * prefill step lays them out: ADD, RMSNORM, gate, up, the GLU, down, the
 * second layer writing the first's gate, up and GLU buffers again. With
 * gate's and up's weights (and scales) back to back (pair) the first layer
 * runs as STEP_F8_MLP - gate and up as one GEMM into scratch, their own
 * buffers left unwritten since the next layer writes them over - and the
 * last layer, whose gate and up outputs are still there at the plan's end,
 * as the norm and GLU steps; apart, no layer does. Every buffer at the end
 * bit for bit the calls launched one by one, the fusion counter moving by
 * the steps' counts, the last down against the CPU's W8A16 product of the
 * GPU's GLU output. */
/* The next check_f8_mlp / check_f8_qkv: per-channel weights (a scale a row,
 * compressed-tensors) instead of 128x128 blocks (reset by them). */
static bool f8_chan;

static void check_f8_mlp(uint32_t n, uint32_t d, uint32_t f, dj_dtype rt, dj_op glu, int pair) {
    const bool chan = f8_chan;
    f8_chan = false;
    const size_t nd = (size_t)n * d, nf = (size_t)n * f, rb = nd * dj_dtype_size(rt);
    const size_t sg = chan ? f : (size_t)(f / 128) * (d / 128), sd = chan ? d : (size_t)(d / 128) * (f / 128);
    const uint32_t br = chan ? 1 : 128, bcg = chan ? d : 128, bcd = chan ? f : 128; /* gate/up, down */
    float *af = falloc(nd), *tf = falloc(nd);
    uint16_t *tb = halloc(nd);
    void *ab = rand_act(rt, af, nd, -2.0f, 2.0f);
    rand_bf16(tb, tf, nd, -2.0f, 2.0f);
    void *g = rand_weight(DJ_DTYPE_BF16, d, 0.5f, 1.5f), *dg = dcopy(g, (size_t)d * 2);
    /* per layer: gate and up [2][f][d] (one allocation when pair) and their scales, down [d][f] */
    uint8_t *wgu[2], *wd[2];
    float *sgu[2], *sdn[2];
    void *dgu[2][2], *dsgu[2][2], *ddn[2], *dsdn[2];
    for (int l = 0; l < 2; l++) {
        wgu[l] = xmalloc(2 * (size_t)f * d);
        wd[l] = xmalloc((size_t)d * f);
        sgu[l] = falloc(2 * sg);
        sdn[l] = falloc(sd);
        rand_f8_codes(wgu[l], 2 * (size_t)f * d);
        rand_f8_codes(wd[l], (size_t)d * f);
        rand_f8_scales(sgu[l], 2 * sg, d);
        rand_f8_scales(sdn[l], sd, f);
        if (pair) {
            uint8_t *w = dcopy(wgu[l], 2 * (size_t)f * d);
            float *s = dcopy(sgu[l], 2 * sg * sizeof(float));
            dgu[l][0] = w, dgu[l][1] = w + (size_t)f * d, dsgu[l][0] = s, dsgu[l][1] = s + sg;
        } else { /* apart: 256 bytes between gate's and up's weights and scales (buffers of their own
                  * may happen to lie back to back, and then they are a pair) */
            uint8_t *w = dalloc(2 * (size_t)f * d + 256);
            float *s = dalloc((2 * sg + 64) * sizeof(float));
            for (int i = 0; i < 2; i++) {
                dgu[l][i] = w + (size_t)i * (f * (size_t)d + 256);
                dsgu[l][i] = s + (size_t)i * (sg + 64);
                up(dgu[l][i], wgu[l] + (size_t)i * f * d, (size_t)f * d);
                up(dsgu[l][i], sgu[l] + (size_t)i * sg, sg * sizeof(float));
            }
        }
        ddn[l] = dcopy(wd[l], (size_t)d * f);
        dsdn[l] = dcopy(sdn[l], sd * sizeof(float));
    }
    const size_t bytes[6] = {rb, nd * 2, nf * 2, nf * 2, nf * 2, nd * 2}; /* h, xn, G, U, H, T */
    /* the GEMMs' outputs (G, U, T) have room for n rounded up to 4, as the engine's buffers (out_rows) */
    const uint32_t n4 = (n + 3) / 4 * 4;
    const size_t room[6] = {rb, nd * 2, (size_t)n4 * f * 2, (size_t)n4 * f * 2, nf * 2, (size_t)n4 * d * 2};
    void *bufs[2][6];
    uint64_t fused = 0, unstored = 0;
    for (int pass = 0; pass < 2; pass++) { /* apart first: the GEMMs alone probe cuBLASLt */
        void **B = bufs[pass];
        B[0] = dcopy(ab, rb);
        for (int b = 1; b < 6; b++) {
            B[b] = dalloc(room[b]);
            poison(B[b], room[b]);
        }
        void *t0 = dcopy(tb, nd * 2);
        dj_op_call gc[12];
        int k = 0;
        for (int l = 0; l < 2; l++) {
            gc[k++] = (dj_op_call){.op = DJ_OP_ADD, .n = n, .out = B[0], .x = B[0], .x2 = l ? B[5] : t0, .d = d,
                                   .x_dtype = rt, .out_dtype = rt};
            gc[k++] = (dj_op_call){.op = DJ_OP_RMSNORM, .n = n, .out = B[1], .x = B[0], .w = dg,
                                   .w_dtype = DJ_DTYPE_BF16, .d = d, .eps = 1e-5f, .x_dtype = rt,
                                   .out_dtype = DJ_DTYPE_BF16};
            for (int i = 0; i < 2; i++)
                gc[k++] = (dj_op_call){.op = DJ_OP_MATMUL, .n = n, .x = B[1], .w = dgu[l][i],
                                       .w_dtype = DJ_DTYPE_F8_E4M3, .w_scale = dsgu[l][i], .w_block_rows = br,
                                       .w_block_cols = bcg, .k = d, .m = f, .out = B[2 + i], .out_rows = n4,
                                       .out_dtype = DJ_DTYPE_BF16};
            gc[k++] = (dj_op_call){.op = glu, .n = n, .out = B[4], .x = B[2], .x2 = B[3], .d = f,
                                   .out_dtype = DJ_DTYPE_BF16};
            gc[k++] = (dj_op_call){.op = DJ_OP_MATMUL, .n = n, .x = B[4], .w = ddn[l], .w_dtype = DJ_DTYPE_F8_E4M3,
                                   .w_scale = dsdn[l], .w_block_rows = br, .w_block_cols = bcd, .k = f, .m = d,
                                   .out = B[5], .out_rows = n4, .out_dtype = DJ_DTYPE_BF16};
        }
        const uint64_t before = dj__cuda_fusions(gpu), before_u = dj__cuda_unstored(gpu);
        if (pass == 0) {
            for (int i = 0; i < k; i++)
                if (dj_backend_compute(gpu, &gc[i]) != DJ_OK) die("f8 mlp (gpu, apart)");
        } else if (dj_backend_compute_plan(gpu, gc, (size_t)k, NULL) != DJ_OK) {
            die("f8 mlp (gpu, plan)");
        }
        if (gpu->vt->sync(gpu) != DJ_OK) die("f8 mlp (gpu)");
        if (pass == 1) fused = dj__cuda_fusions(gpu) - before, unstored = dj__cuda_unstored(gpu) - before_u;
        dfree(t0);
    }
    char shape[112];
    snprintf(shape, sizeof shape, "2 layers n=%u d=%u f=%u res=%s %s%s%s", n, d, f, dj_dtype_name(rt),
             glu == DJ_OP_SILU_MUL ? "silu" : "gelu", pair ? " pair" : " apart", chan ? " per channel" : "");
    /* the last down against the CPU's W8A16 product of the GPU's GLU output */
    uint16_t *hb = halloc(nf);
    float *hf = falloc(nf), *ref = falloc(nd);
    down(hb, bufs[1][4], nf * 2);
    for (size_t e = 0; e < nf; e++) hf[e] = dj_bf16_to_f32(hb[e]);
    dj_op_call cc = {.op = DJ_OP_MATMUL, .n = n, .x = hf, .w = wd[1], .w_dtype = DJ_DTYPE_F8_E4M3, .w_scale = sdn[1],
                     .w_block_rows = br, .w_block_cols = bcd, .k = f, .m = d, .out = ref};
    if (dj_backend_compute(cpu, &cc) != DJ_OK) die("f8 mlp (cpu)");
    tol_now = TOL_W8A8;
    compare("F8 MLP", shape, bufs[1][5], DJ_DTYPE_BF16, ref, nd);
    tol_now = TOL;
    report_apart("F8 MLP", shape, buffers_differ(bufs[0], bufs[1], bytes, 6));
    /* the norm steps (1 each) quantizing for gate and up (2) and the GLUs for down (1); the pair 1 more;
     * the first layer's norm and GLU outputs unstored (the second layer writes them over before any read),
     * the second's stored (the plan ends there) - rows not a multiple of 4 too, their GEMMs' outputs having
     * room for them rounded up (check_norm_fp8, check_glu_fp8: without it) */
    const uint64_t want = 2 * 4 + (pair ? 1 : 0), want_u = 2;
    n_rows++;
    n_fail += fused != want || unstored != want_u;
    printf("%-10s %-52s %10s  %s (%llu fused, expected %llu; %llu unstored, expected %llu)\n", "F8 MLP", shape, "-",
           fused == want && unstored == want_u ? "pass" : "FAIL", (unsigned long long)fused,
           (unsigned long long)want, (unsigned long long)unstored, (unsigned long long)want_u);
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 6; b++) dfree(bufs[pass][b]);
    for (int l = 0; l < 2; l++) {
        dfree(dgu[l][0]);
        dfree(dsgu[l][0]);
        dfree(ddn[l]);
        dfree(dsdn[l]);
        free(wgu[l]);
        free(wd[l]);
        free(sgu[l]);
        free(sdn[l]);
    }
    dfree(dg);
    free(g);
    free(ab);
    free(af);
    free(tb);
    free(tf);
    free(hb);
    free(hf);
    free(ref);
}

/* Two layers' ATTENTION (the wgmma kernel: bf16 pages, head_dim 128) each
 * followed by the FP8 128x128-block GEMM of its output (o's projection),
 * through compute_plan as STEP_ATTN_F8: the attention's epilogue writes the
 * GEMM's codes and scales. The second layer's attention writes the first's
 * output buffer over, so the first's bf16 output goes unstored. Every
 * buffer at the end bit for bit the calls launched one by one (whose
 * quantization kernel reads the bf16 output back), the counters moving by
 * 2 fused and 1 unstored, the last GEMM against the CPU's W8A16 product of
 * the GPU's attention output. */
static void check_attn_f8(uint32_t n, uint32_t pos0, uint32_t nh, uint32_t nkv, uint32_t tpp, uint32_t m) {
    const uint32_t hd = 128, k = nh * hd, ctx = pos0 + n;
    const size_t qc = (size_t)n * k, oc = (size_t)n * m, sw = (size_t)(m / 128) * (k / 128);
    kv_pair p;
    kv_pair_init(&p, ctx, tpp, nkv * hd);
    if (pos0) kv_fill(&p, 0, pos0);
    kv_fill(&p, pos0, ctx);
    uint16_t *qb[2];
    float *qf = falloc(qc);
    void *dq[2], *dw[2], *dsw[2];
    uint8_t *w[2];
    float *sc[2];
    for (int l = 0; l < 2; l++) {
        qb[l] = halloc(qc);
        rand_bf16(qb[l], qf, qc, -2.0f, 2.0f);
        dq[l] = dcopy(qb[l], qc * 2);
        w[l] = xmalloc((size_t)m * k);
        sc[l] = falloc(sw);
        rand_f8_codes(w[l], (size_t)m * k);
        rand_f8_scales(sc[l], sw, k);
        dw[l] = dcopy(w[l], (size_t)m * k);
        dsw[l] = dcopy(sc[l], sw * sizeof(float));
    }
    void *bufs[2][3]; /* [apart, plan][the attention's output, o of layer 1, o of layer 2] */
    const size_t bytes[3] = {qc * 2, oc * 2, oc * 2};
    uint64_t fused = 0, unstored = 0;
    int ran = 0;
    for (int pass = 0; pass < 2; pass++) { /* apart first: the GEMMs alone probe cuBLASLt */
        void **B = bufs[pass];
        for (int b = 0; b < 3; b++) {
            B[b] = dalloc(bytes[b]);
            poison(B[b], bytes[b]);
        }
        dj_op_call gc[4];
        for (int l = 0; l < 2; l++) {
            gc[2 * l] = (dj_op_call){.op = DJ_OP_ATTENTION, .n = n, .out = B[0], .x = dq[l], .kv = &p.gv,
                                     .pos0 = pos0, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd,
                                     .scale = 1.0f / sqrtf((float)hd), .out_dtype = DJ_DTYPE_BF16};
            gc[2 * l + 1] = (dj_op_call){.op = DJ_OP_MATMUL, .n = n, .x = B[0], .w = dw[l],
                                         .w_dtype = DJ_DTYPE_F8_E4M3, .w_scale = dsw[l], .w_block_rows = 128,
                                         .w_block_cols = 128, .k = k, .m = m, .out = B[1 + l],
                                         .out_dtype = DJ_DTYPE_BF16};
        }
        const uint64_t before = dj__cuda_fusions(gpu), before_u = dj__cuda_unstored(gpu);
        if (pass == 0) {
            for (int i = 0; i < 4; i++)
                if (dj_backend_compute(gpu, &gc[i]) != DJ_OK) die("attention + f8 gemm (gpu, apart)");
        } else if (dj_backend_compute_plan(gpu, gc, 4, NULL) != DJ_OK) {
            die("attention + f8 gemm (gpu, plan)");
        }
        if (gpu->vt->sync(gpu) != DJ_OK) die("attention + f8 gemm (gpu)");
        if (pass == 1) {
            fused = dj__cuda_fusions(gpu) - before, unstored = dj__cuda_unstored(gpu) - before_u;
            ran = dj__cuda_last_attention(gpu);
        }
    }
    char shape[112];
    snprintf(shape, sizeof shape, "2 layers n=%u pos0=%u heads=%u:%u tpp=%u m=%u", n, pos0, nh, nkv, tpp, m);
    /* the last GEMM against the CPU's W8A16 product of the GPU's attention output */
    uint16_t *hb = halloc(qc);
    float *hf = falloc(qc), *ref = falloc(oc);
    down(hb, bufs[1][0], qc * 2);
    for (size_t e = 0; e < qc; e++) hf[e] = dj_bf16_to_f32(hb[e]);
    dj_op_call cc = {.op = DJ_OP_MATMUL, .n = n, .x = hf, .w = w[1], .w_dtype = DJ_DTYPE_F8_E4M3, .w_scale = sc[1],
                     .w_block_rows = 128, .w_block_cols = 128, .k = k, .m = m, .out = ref};
    if (dj_backend_compute(cpu, &cc) != DJ_OK) die("attention + f8 gemm (cpu)");
    tol_now = TOL_W8A8;
    compare("ATTN+F8", shape, bufs[1][2], DJ_DTYPE_BF16, ref, oc);
    tol_now = TOL;
    report_apart("ATTN+F8", shape, buffers_differ(bufs[0], bufs[1], bytes, 3));
    const uint64_t want_u = n % 4 ? 0 : 1; /* rows not a multiple of 4 keep the bf16 output (lt_matmul's GEMV) */
    const int ok = fused == 2 && unstored == want_u && ran == 4;
    n_rows++;
    n_fail += !ok;
    printf("%-10s %-52s %10s  %s (%llu fused, expected 2; %llu unstored, expected %llu; kernel %d, expected 4 wg)\n",
           "ATTN+F8", shape, "-", ok ? "pass" : "FAIL", (unsigned long long)fused, (unsigned long long)unstored,
           (unsigned long long)want_u, ran);
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 3; b++) dfree(bufs[pass][b]);
    for (int l = 0; l < 2; l++) {
        dfree(dq[l]), dfree(dw[l]), dfree(dsw[l]);
        free(qb[l]), free(w[l]), free(sc[l]);
    }
    free(qf), free(hb), free(hf), free(ref);
    kv_pair_free(&p);
}

/* Two attention inputs of FP8 128x128-block weights through compute_plan,
 * as a prefill step lays them out: ADD, RMSNORM, q, k, v, the ROPEs of q
 * and k (in place or into buffers of their own) and the KV_WRITE into bf16
 * pages (a view a layer). With q's, k's and v's weights and scales back to
 * back (as the loader puts a layer's) the first layer runs as STEP_F8_QKV -
 * one GEMM into scratch, the ROPE step reading its rows, q's, k's and v's
 * own buffers left for the second layer to write - and the second, whose
 * outputs are still there at the plan's end, as the norm and ROPE steps;
 * with the same weights in buffers of their own both layers run as those
 * steps. Every buffer and page of the two plans bit for bit alike (the
 * ROPE step's kernel runs in both; against the calls launched one by one
 * the 2,048-row case differed, in q, k and the pages of both layers - not
 * pinned down, the 4-pairs-a-thread RoPE kernel against the standalone
 * ROPE the suspect); the fusion and unstored counters of each. */
static void check_f8_qkv(uint32_t n, uint32_t d, uint32_t nh, uint32_t nkv, uint32_t tpp, dj_dtype rt, int inplace) {
    const bool chan = f8_chan;
    f8_chan = false;
    const uint32_t hd = 128, qd = nh * hd, kvd = nkv * hd, mt = qd + 2 * kvd;
    const size_t nd = (size_t)n * d, rb = nd * dj_dtype_size(rt), ns = chan ? mt : (size_t)(mt / 128) * (d / 128);
    float *af = falloc(nd), *tf = falloc(nd), *inv = falloc(hd / 2);
    uint16_t *tb = halloc(nd);
    void *ab = rand_act(rt, af, nd, -2.0f, 2.0f);
    rand_bf16(tb, tf, nd, -2.0f, 2.0f);
    for (uint32_t j = 0; j < hd / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    void *g = rand_weight(DJ_DTYPE_BF16, d, 0.5f, 1.5f), *dg = dcopy(g, (size_t)d * 2);
    void *dinv = dcopy(inv, hd / 2 * sizeof(float)), *dt = dcopy(tb, nd * 2);
    uint8_t *w[2], *dw[2], *dws[2][3];
    float *sc[2], *dsc[2], *dss[2][3];
    for (int l = 0; l < 2; l++) {
        w[l] = xmalloc((size_t)mt * d);
        sc[l] = falloc(ns);
        rand_f8_codes(w[l], (size_t)mt * d);
        rand_f8_scales(sc[l], ns, d);
        dw[l] = dcopy(w[l], (size_t)mt * d);
        dsc[l] = dcopy(sc[l], ns * sizeof(float));
    }
    const uint32_t ms[3] = {qd, kvd, kvd};
    for (int l = 0; l < 2; l++) /* the same weights, each matrix in a buffer of its own */
        for (int i = 0, row0 = 0; i < 3; row0 += (int)ms[i], i++) {
            dws[l][i] = dcopy(w[l] + (size_t)row0 * d, (size_t)ms[i] * d);
            dss[l][i] = chan ? dcopy(sc[l] + row0, (size_t)ms[i] * sizeof(float))
                             : dcopy(sc[l] + (size_t)row0 / 128 * (d / 128),
                                     (size_t)(ms[i] / 128) * (d / 128) * sizeof(float));
        }
    const size_t bytes[7] = {rb, nd * 2, (size_t)n * qd * 2, (size_t)n * kvd * 2, (size_t)n * kvd * 2,
                             (size_t)n * qd * 2, (size_t)n * kvd * 2}; /* h, xn, Q, K, V, QR, KR */
    /* Q, K, V (the GEMMs' outputs) with room for n rounded up to 4, as the engine's buffers (out_rows) */
    const uint32_t n4 = (n + 3) / 4 * 4;
    const size_t room[7] = {rb, nd * 2, (size_t)n4 * qd * 2, (size_t)n4 * kvd * 2, (size_t)n4 * kvd * 2,
                            (size_t)n * qd * 2, (size_t)n * kvd * 2};
    void *bufs[2][7];
    kv_pair kv[2][2]; /* [pass][layer] */
    uint64_t fused[2] = {0, 0}, unstored[2] = {0, 0};
    for (int pass = 0; pass < 2; pass++) { /* weights apart, then back to back */
        void **B = bufs[pass];
        B[0] = dcopy(ab, rb);
        for (int b = 1; b < 7; b++) {
            B[b] = b >= 5 && inplace ? B[b - 3] : dalloc(room[b]);
            if (!(b >= 5 && inplace)) poison(B[b], room[b]);
        }
        dj_op_call gc[16];
        int k = 0;
        for (int l = 0; l < 2; l++) {
            kv_pair_init(&kv[pass][l], n, tpp, kvd);
            if (pass) /* the apart pass's page order, so the pages compare byte for byte */
                memcpy(kv[1][l].table, kv[0][l].table, kv[0][l].n_pages * sizeof(uint32_t));
            gc[k++] = (dj_op_call){.op = DJ_OP_ADD, .n = n, .out = B[0], .x = B[0], .x2 = dt, .d = d, .x_dtype = rt,
                                   .out_dtype = rt};
            gc[k++] = (dj_op_call){.op = DJ_OP_RMSNORM, .n = n, .out = B[1], .x = B[0], .w = dg,
                                   .w_dtype = DJ_DTYPE_BF16, .d = d, .eps = 1e-5f, .x_dtype = rt,
                                   .out_dtype = DJ_DTYPE_BF16};
            size_t row0 = 0;
            for (int i = 0; i < 3; i++) {
                gc[k++] = (dj_op_call){.op = DJ_OP_MATMUL, .n = n, .x = B[1],
                                       .w = pass ? (void *)(dw[l] + row0 * d) : (void *)dws[l][i],
                                       .w_dtype = DJ_DTYPE_F8_E4M3,
                                       .w_scale = pass ? dsc[l] + (chan ? row0 : row0 / 128 * (d / 128)) : dss[l][i],
                                       .w_block_rows = chan ? 1 : 128, .w_block_cols = chan ? d : 128, .k = d,
                                       .m = ms[i], .out = B[2 + i], .out_rows = n4, .out_dtype = DJ_DTYPE_BF16};
                row0 += ms[i];
            }
            for (int i = 0; i < 2; i++)
                gc[k++] = (dj_op_call){.op = DJ_OP_ROPE, .n = n, .out = B[5 + i], .x = B[2 + i], .inv_freq = dinv,
                                       .n_heads = i ? nkv : nh, .head_dim = hd, .scale = 1.0f,
                                       .out_dtype = DJ_DTYPE_BF16};
            gc[k++] = (dj_op_call){.op = DJ_OP_KV_WRITE, .n = n, .x = B[6], .x2 = B[4], .kv = &kv[pass][l].gv};
        }
        const uint64_t before = dj__cuda_fusions(gpu), before_u = dj__cuda_unstored(gpu);
        if (dj_backend_compute_plan(gpu, gc, (size_t)k, NULL) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK)
            die("f8 qkv (gpu, plan)");
        fused[pass] = dj__cuda_fusions(gpu) - before, unstored[pass] = dj__cuda_unstored(gpu) - before_u;
    }
    char shape[112];
    snprintf(shape, sizeof shape, "2 layers n=%u d=%u heads=%u:%u res=%s%s%s", n, d, nh, nkv, dj_dtype_name(rt),
             inplace ? " rope in place" : "", chan ? " per channel" : "");
    size_t differ = 0;
    for (int b = 0; b < 7 + 2; b++) {
        const size_t pb = kv[0][0].gv.page_bytes * kv[0][0].n_pages;
        const size_t nb = b < 7 ? bytes[b] : pb;
        uint8_t *x0 = xmalloc(nb), *x1 = xmalloc(nb);
        down(x0, b < 7 ? bufs[0][b] : kv[0][b - 7].gseg, nb);
        down(x1, b < 7 ? bufs[1][b] : kv[1][b - 7].gseg, nb);
        differ += memcmp(x0, x1, nb) != 0;
        free(x0);
        free(x1);
    }
    n_rows++;
    n_fail += differ != 0;
    printf("%-10s %-52s %10zu  %s\n", "F8 QKV", shape, differ,
           differ ? "FAIL (buffers or pages differ between the plans)" : "pass (= weights apart)");
    /* a layer: the norm (1) quantizing for q, k, v (3), the ROPEs with the KV_WRITE (2); back to back the first
     * layer's three GEMMs as one (2 more); the first norm's output unstored in both - rows not a multiple of
     * 4 too, the GEMMs' outputs having room for them rounded up (check_norm_fp8: without it) */
    const uint64_t want_u = 1;
    const int ok = fused[0] == 12 && fused[1] == 14 && unstored[0] == want_u && unstored[1] == want_u;
    n_rows++;
    n_fail += !ok;
    printf("%-10s %-52s %10s  %s (%llu / %llu fused, expected 12 / 14; %llu / %llu unstored, expected %llu)\n",
           "F8 QKV", shape, "-", ok ? "pass" : "FAIL", (unsigned long long)fused[0], (unsigned long long)fused[1],
           (unsigned long long)unstored[0], (unsigned long long)unstored[1], (unsigned long long)want_u);
    for (int pass = 0; pass < 2; pass++) {
        for (int b = 0; b < 7; b++)
            if (!(b >= 5 && inplace)) dfree(bufs[pass][b]);
        for (int l = 0; l < 2; l++) kv_pair_free(&kv[pass][l]);
    }
    for (int l = 0; l < 2; l++) {
        dfree(dw[l]);
        dfree(dsc[l]);
        for (int i = 0; i < 3; i++) {
            dfree(dws[l][i]);
            dfree(dss[l][i]);
        }
        free(w[l]);
        free(sc[l]);
    }
    dfree(dg);
    dfree(dinv);
    dfree(dt);
    free(g);
    free(ab);
    free(af);
    free(tf);
    free(tb);
    free(inv);
}

static void check_fp8(void) {
    for (uint32_t n = 1; n <= 8; n++)
        check_matmul_fp8(n, 4096, 1000 + n, 128, 128, n % 3 == 0, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(1, 4096, 1024, 1, 4096, 0, DJ_DTYPE_BF16, 1, 0);    /* per channel */
    check_matmul_fp8(2, 4096, 1024, 1024, 4096, 1, DJ_DTYPE_BF16, 1, 0); /* per tensor */
    check_matmul_fp8(1, 14336, 300, 128, 128, 0, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(3, 512, 333, 32, 32, 0, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(1, 1000, 77, 1, 1000, 1, DJ_DTYPE_BF16, 1, 0); /* k % 16 != 0: scalar */
    check_matmul_fp8(4, 1024, 129, 128, 128, 0, DJ_DTYPE_BF16, 1, 1); /* misaligned: scalar */
    check_matmul_fp8(2, 1024, 300, 128, 24, 0, DJ_DTYPE_BF16, 1, 0);  /* bc % 16 != 0: scalar */
    check_matmul_fp8(1, 4096, 5003, 128, 128, 0, DJ_DTYPE_F32, 1, 0); /* logits */
    /* subnormal codes (exponent field 0) on every path: the GEMV, its scalar fallback, the tiles, the tensor cores */
    fp8_subnormal = true;
    check_matmul_fp8(2, 4096, 1000, 128, 128, 0, DJ_DTYPE_BF16, 1, 0);
    fp8_subnormal = true;
    check_matmul_fp8(2, 1000, 300, 1, 1000, 0, DJ_DTYPE_BF16, 1, 0);
    fp8_subnormal = true;
    check_matmul_fp8(33, 4096, 1000, 128, 128, 0, DJ_DTYPE_BF16, 2, 0);
    fp8_subnormal = true;
    check_matmul_fp8(64, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 3, 0);
    /* many rows (4 rows a warp was tried here and lost: bench/RESULTS.md), a partial last block */
    check_matmul_fp8(1, 4096, 14336, 128, 128, 0, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(1, 4096, 6144, 128, 128, 0, DJ_DTYPE_BF16, 1, 0); /* 768 blocks: the 4-load kernel on 132 SMs */
    /* a row over two warps for one row of x (f8_split: every GEMV of the 8B shape), and rows of x that keep a warp a
     * row, a partial last block */
    check_matmul_fp8(1, 14336, 4096, 128, 128, 0, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(5, 14336, 4096, 128, 128, 0, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(1, 4096, 4096, 128, 128, 1, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(2, 4096, 1001, 1, 4096, 0, DJ_DTYPE_F32, 1, 0);
    check_matmul_fp8(1, 2048, 771, 1, 2048, 0, DJ_DTYPE_BF16, 1, 1); /* misaligned: the scalar loop, split */
    /* 2..8 rows of x on the tensor cores (gemv_f8_mma_kernel: 16-row bands, 64-column chunks): blocks, per channel
     * with a bias, per tensor into f32, logits, long rows, subnormal codes */
    check_matmul_fp8(2, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(3, 4096, 1024, 1, 4096, 1, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(4, 4096, 512, 512, 4096, 0, DJ_DTYPE_F32, 1, 0);
    check_matmul_fp8(7, 4096, 5008, 128, 128, 0, DJ_DTYPE_F32, 1, 0);
    check_matmul_fp8(8, 4096, 14336, 128, 128, 1, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(6, 14336, 4096, 128, 128, 0, DJ_DTYPE_BF16, 1, 0);
    fp8_subnormal = true;
    check_matmul_fp8(2, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(3, 4096, 9001, 128, 128, 1, DJ_DTYPE_BF16, 1, 0);
    check_matmul_fp8(8, 1024, 9001, 9001, 1024, 0, DJ_DTYPE_F32, 1, 0); /* per tensor */
    check_matmul_fp8(2, 1000, 9001, 1, 1000, 1, DJ_DTYPE_BF16, 1, 0);   /* per channel, k % 16 != 0: scalar */
    /* 9..16 rows, and up to 32 that cuBLASLt would not take, on the tensor-core GEMV (2, 3 and 4 tiles of x; the
     * rows of a tile past n): blocks, a bias, long rows, logits into f32, per channel, per tensor, subnormal codes */
    check_matmul_fp8(9, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 0, 0);
    check_matmul_fp8(12, 4096, 14336, 128, 128, 1, DJ_DTYPE_BF16, 0, 0);
    check_matmul_fp8(16, 14336, 4096, 128, 128, 0, DJ_DTYPE_BF16, 0, 0);
    check_matmul_fp8(17, 4096, 5008, 128, 128, 0, DJ_DTYPE_F32, 0, 0);
    check_matmul_fp8(24, 4096, 1024, 1, 4096, 1, DJ_DTYPE_BF16, 0, 0);
    check_matmul_fp8(31, 4096, 512, 512, 4096, 0, DJ_DTYPE_F32, 0, 0);
    check_matmul_fp8(13, 1024, 1008, 1, 1024, 0, DJ_DTYPE_BF16, 0, 0);
    fp8_subnormal = true;
    check_matmul_fp8(14, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 0, 0);
    {
        const uint32_t qkv[3] = {1024, 256, 256}, gate_up[2] = {1536, 1536};
        check_fp8_shared(64, 512, 3, qkv);
        check_fp8_shared(36, 1024, 2, gate_up);
        check_glu_fp8(DJ_OP_SILU_MUL, 64, 1536, 512);
        check_glu_fp8(DJ_OP_GELU_MUL, 40, 1024, 384);
        check_glu_fp8(DJ_OP_SILU_MUL, 20, 512, 256); /* 80 groups: the second block's warps partly idle */
        const uint32_t qkv4[3] = {512, 128, 128}, gu4[2] = {1536, 1536}, one[1] = {256};
        check_norm_fp8(64, 512, DJ_DTYPE_F32, 0, 3, qkv4);   /* q, k, v off an f32 residual stream */
        check_norm_fp8(36, 1024, DJ_DTYPE_BF16, 0, 2, gu4); /* gate, up */
        check_norm_fp8(20, 2560, DJ_DTYPE_F32, 1, 1, one);  /* Gemma's norm in front; 2 chunks a thread, one partial */
        check_f8_mlp(64, 512, 1024, DJ_DTYPE_F32, DJ_OP_SILU_MUL, 1); /* gate and up one GEMM in layer 1 */
        check_f8_mlp(36, 1024, 2048, DJ_DTYPE_BF16, DJ_OP_GELU_MUL, 1);
        check_f8_mlp(64, 512, 1024, DJ_DTYPE_F32, DJ_OP_SILU_MUL, 0); /* weights apart: no pair */
        check_f8_qkv(256, 512, 8, 2, 16, DJ_DTYPE_F32, 0);  /* a few rows: RoPE a pair a thread */
        check_f8_qkv(2048, 512, 8, 2, 64, DJ_DTYPE_BF16, 1); /* prefill rows: 4 pairs a thread, in place */
        check_attn_f8(300, 200, 8, 2, 16, 512);   /* after a prefix: partial tiles, rows past n in the last block */
        check_attn_f8(2048, 0, 32, 8, 16, 512);   /* the 8B prefill's heads */
        /* rows not a multiple of 4 through every fused step (the rows of 4 on cuBLASLt, the rest the GEMV's;
         * F8 MLP and F8 QKV give their GEMMs' outputs room for the rows rounded up: cuBLASLt on all) */
        check_fp8_shared(63, 512, 3, qkv);
        check_glu_fp8(DJ_OP_SILU_MUL, 38, 512, 256);
        check_norm_fp8(41, 512, DJ_DTYPE_F32, 0, 3, qkv4);
        check_f8_mlp(61, 512, 1024, DJ_DTYPE_F32, DJ_OP_SILU_MUL, 1);
        check_f8_qkv(255, 512, 8, 2, 16, DJ_DTYPE_F32, 0);
        check_attn_f8(301, 0, 8, 2, 16, 512);
        /* per-channel weights (compressed-tensors) take the same steps */
        f8_chan = true;
        check_f8_mlp(64, 512, 1024, DJ_DTYPE_F32, DJ_OP_SILU_MUL, 1);
        f8_chan = true;
        check_f8_mlp(36, 1024, 2048, DJ_DTYPE_BF16, DJ_OP_GELU_MUL, 0);
        f8_chan = true;
        check_f8_qkv(256, 512, 8, 2, 16, DJ_DTYPE_F32, 0);
    }
    check_matmul_fp8(17, 4096, 1000, 128, 128, 0, DJ_DTYPE_BF16, 2, 0);
    check_matmul_fp8(64, 1024, 3000, 1, 1024, 1, DJ_DTYPE_BF16, 2, 0);
    check_matmul_fp8(33, 14336, 2500, 128, 128, 0, DJ_DTYPE_BF16, 2, 0); /* 3 tiles, the last partial */
    check_matmul_fp8(9, 1000, 300, 300, 1000, 1, DJ_DTYPE_F32, 2, 0);
    check_matmul_fp8(1, 4096, 4096, 128, 128, 0, DJ_DTYPE_BF16, 0, 0);
    check_matmul_fp8(32, 4096, 4096, 128, 128, 1, DJ_DTYPE_BF16, 0, 0);
    /* FP8 tensor cores (W8A8; where cuBLASLt refuses, the tiles answer and pass the tighter bound) */
    check_matmul_fp8(64, 4096, 4096, 128, 128, 0, DJ_DTYPE_BF16, 3, 0);
    check_matmul_fp8(200, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 3, 0);
    check_matmul_fp8(96, 14336, 512, 128, 128, 0, DJ_DTYPE_BF16, 3, 0);
    check_matmul_fp8(77, 1024, 512, 1, 1024, 0, DJ_DTYPE_BF16, 3, 0);   /* per channel, 77 rows: 76 + the GEMV's 1 */
    check_matmul_fp8(2047, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 0, 0); /* a prompt of 2,047: 2,044 + 3 */
    check_matmul_fp8(128, 1024, 768, 768, 1024, 0, DJ_DTYPE_BF16, 3, 0); /* per tensor */
    check_matmul_fp8(256, 4096, 1024, 1, 4096, 0, DJ_DTYPE_BF16, 3, 0);  /* per channel */
    check_matmul_fp8(256, 4096, 4096, 128, 128, 0, DJ_DTYPE_BF16, 0, 0); /* automatic: tensor cores */
    check_matmul_fp8(32, 4096, 4096, 128, 128, 0, DJ_DTYPE_BF16, 0, 0);  /* automatic, a decode batch of 32 */
    check_matmul_fp8(20, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 0, 0);  /* automatic, 20 rows */
    check_matmul_fp8(38, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 0, 0);  /* 38 rows: 36 on cuBLASLt, 2 the GEMV's */
    check_matmul_fp8(33, 14336, 4096, 1, 14336, 0, DJ_DTYPE_BF16, 0, 0); /* per channel: 32 + 1 */
    check_matmul_fp8(30, 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 0, 0);  /* 30: the tensor-core GEMV */
    /* rows not a multiple of 4 whose output has room for them rounded up: cuBLASLt on the whole 4s */
    const uint32_t room_rows[5] = {2047, 38, 30, 17, 77};
    for (int i = 0; i < 5; i++) {
        fp8_room = true;
        if (room_rows[i] == 77) /* per channel, forced onto the tensor cores */
            check_matmul_fp8(77, 1024, 512, 1, 1024, 0, DJ_DTYPE_BF16, 3, 0);
        else
            check_matmul_fp8(room_rows[i], 4096, 1024, 128, 128, 0, DJ_DTYPE_BF16, 0, 0);
    }
    /* automatic, per channel / per tensor: tensor cores (their row scales as VEC128 scales) */
    check_matmul_fp8(64, 1024, 512, 1, 1024, 0, DJ_DTYPE_BF16, 0, 0);
    check_matmul_fp8(512, 4096, 4096, 1, 4096, 0, DJ_DTYPE_BF16, 0, 0);
    check_matmul_fp8(32, 14336, 4096, 4096, 14336, 0, DJ_DTYPE_BF16, 0, 0);
}

/* Decode attention: GQA groups of 1, 2,
 * 3, 4 and 8 (heads per block 1, 2 and 4), head_dim 6..256 (partial lanes,
 * each pair count), windows, one position, long contexts (many steps per
 * warp, a partial last step), several rows, and per-row positions and
 * tables, eager and recorded. */
static void check_decode(void) {
    /* n, pos0, heads, kv heads, head_dim, tokens per page, window */
    check_attention(1, 4095, 32, 8, 128, 16, 0);
    check_attention(1, 1000, 8, 1, 64, 7, 0);
    check_attention(3, 37, 8, 2, 64, 16, 0);
    check_attention(1, 2000, 8, 2, 128, 16, 256);
    check_attention(1, 300, 4, 2, 256, 8, 0);
    check_attention(5, 40, 4, 4, 80, 16, 0);
    check_attention(2, 500, 6, 3, 6, 5, 0);
    check_attention(1, 77, 12, 4, 96, 16, 0);
    check_attention(4, 4000, 16, 2, 128, 16, 1000);
    check_attention(1, 0, 8, 2, 128, 16, 0);
    check_attention(7, 9, 8, 8, 192, 3, 5);
    check_attention(1, 20000, 32, 8, 128, 16, 0);
    /* rows, heads, kv heads, head_dim, tokens per page, window, recorded */
    check_rows(1, 32, 8, 128, 16, 0, 0);
    check_rows(5, 8, 2, 64, 7, 0, 0);
    check_rows(8, 12, 4, 96, 16, 0, 0);
    check_rows(3, 8, 2, 128, 16, 100, 0);
    check_rows(1, 32, 8, 128, 16, 0, 1);
    check_rows(32, 32, 8, 128, 16, 0, 1);
}

/* ---- f8_e4m3 K/V pages (--kv-dtype fp8; backend.h's layout) ----
 * Both backends store f8 K/V here (dj_backend_set_kv_dtype). The GPU writes
 * f8 pages from bf16 K/V; the CPU's KV_WRITE (the reference) writes the same
 * values (bf16-representable f32) into pages of the same layout, so codes and
 * exponents must match byte for byte (a fused RoPE+KV_WRITE quantizes the
 * bf16 k it wrote to kout: the CPU writes those bits; against the CPU's f32
 * rotation the values are bounded by TOL_F8 instead). ATTENTION: the CPU reads
 * a copy of the GPU's pages, so both read identical K/V: TOL as for bf16. K/V
 * heads get magnitudes 2^-4..2^4 apart (and now and then all zeros), so the
 * pages' exponents differ by head, and a page a second KV_WRITE continues
 * often has its exponent raised and its earlier rows re-encoded. */

/* e4m3 rounding: half a step is at most 1/16 of the head's largest value
 * (scaled into (224, 448], steps of 32 above 256), plus bf16's 2^-9 */
#define TOL_F8 7e-2

/* rows x nkv heads of hd random values in [-1, 1) times 2^m, m in [lo, hi]
 * per (row, head), 1 head in 32 all zeros; rounded to bf16 (bits in bf,
 * values in f). */
static void rand_heads(uint16_t *bf, float *f, size_t rows, uint32_t nkv, uint32_t hd, int lo, int hi) {
    for (size_t rh = 0; rh < rows * nkv; rh++) {
        const int zero = dj_test_rand() % 32 == 0;
        const float mag = ldexpf(1.0f, lo + (int)(dj_test_rand() % (uint64_t)(hi - lo + 1)));
        for (uint32_t e = 0; e < hd; e++) {
            const size_t i = rh * hd + e;
            bf[i] = dj_f32_to_bf16(zero ? 0.0f : dj_test_randf(-1.0f, 1.0f) * mag);
            f[i] = dj_bf16_to_f32(bf[i]);
        }
    }
}

/* The GPU's f8 segment against the CPU's, byte for byte (codes, exponents,
 * and the 0xff poison of rows and pages nothing wrote). */
static void check_f8_bytes(const char *op, const char *shape, const uint8_t *want, const void *gseg, size_t bytes) {
    uint8_t *g = xmalloc(bytes);
    down(g, gseg, bytes);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < bytes; i++)
        if (g[i] != want[i] && !bad++) first = i;
    n_rows++;
    n_fail += bad != 0;
    printf("%-10s %-52s %10zu  %s\n", op, shape, bad, bad ? "FAIL" : "pass");
    if (bad) printf("           bytes differing; first at %zu: got 0x%02x, want 0x%02x\n", first, g[first], want[first]);
    free(g);
}

/* f8 pages for positions [0, ctx) on the GPU (a shuffled block table plus
 * two spare pages) and two host segments of the same layout for the CPU. */
typedef struct kv8 {
    dj_kv_view gv;      /* GPU pages */
    dj_kv_view wv;      /* CPU: its own KV_WRITEs (what the GPU pages must hold) */
    dj_kv_view cv;      /* CPU: a copy of the GPU's pages (kv8_to_cpu), for ATTENTION */
    uint32_t *table;    /* [n_pages], the first n_blocks mapped */
    uint32_t n_pages, nkv, hd;
    void *gseg;         /* device */
} kv8;

/* Bytes of an f8 page of tpp positions, kept a multiple of 16 (the tensor-core kernel's loads). */
static size_t f8_page_bytes(uint32_t tpp, uint32_t nkv, uint32_t hd) {
    return (dj_kv_page_need(DJ_DTYPE_F8_E4M3, nkv, hd, tpp) + 15) / 16 * 16 + 16;
}

static void kv8_init(kv8 *p, uint32_t ctx, uint32_t tpp, uint32_t nkv, uint32_t hd) {
    const uint32_t n_blocks = (ctx + tpp - 1) / tpp, kvd = nkv * hd;
    p->n_pages = n_blocks + 2;
    p->nkv = nkv;
    p->hd = hd;
    p->table = xmalloc(p->n_pages * sizeof(uint32_t));
    for (uint32_t i = 0; i < p->n_pages; i++) p->table[i] = i;
    for (uint32_t i = p->n_pages - 1; i > 0; i--) {
        const uint32_t j = (uint32_t)(dj_test_rand() % (i + 1)), t = p->table[i];
        p->table[i] = p->table[j];
        p->table[j] = t;
    }
    const size_t page = f8_page_bytes(tpp, nkv, hd), bytes = page * p->n_pages;
    uint8_t *cseg = xmalloc(bytes), *want = xmalloc(bytes);
    memset(cseg, 0xff, bytes);
    memset(want, 0xff, bytes);
    p->gseg = dalloc(bytes);
    poison(p->gseg, bytes);
    p->gv = (dj_kv_view){.seg_base = p->gseg, .page_bytes = page, .block_table = p->table, .n_blocks = n_blocks,
                         .tokens_per_page = tpp, .kv_dim = kvd, .dtype = DJ_DTYPE_F8_E4M3, .n_kv_heads = nkv};
    p->wv = p->gv;
    p->wv.seg_base = want;
    p->cv = p->gv;
    p->cv.seg_base = cseg;
}

static size_t kv8_bytes(const kv8 *p) { return p->gv.page_bytes * p->n_pages; }

static void kv8_free(kv8 *p) {
    free(p->cv.seg_base);
    free(p->wv.seg_base);
    dfree(p->gseg);
    free(p->table);
}

/* The CPU's attention pages := the GPU's bytes. */
static void kv8_to_cpu(kv8 *p) { down(p->cv.seg_base, p->gseg, kv8_bytes(p)); }

/* Element e of the K row of position pos in host f8 pages, as a value. */
static float f8_k_value(const dj_kv_view *v, uint32_t pos, uint32_t e) {
    const size_t tpp = v->tokens_per_page, kvd = v->kv_dim, r = pos % tpp;
    const uint8_t *page = v->seg_base + (size_t)v->block_table[pos / tpp] * v->page_bytes;
    const int8_t *ex = (const int8_t *)(page + 2 * tpp * kvd);
    return ldexpf(dj_f8e4m3_to_f32(page[r * kvd + e]), ex[e / (kvd / v->n_kv_heads)]);
}

/* KV_WRITE of random K/V rows [from, to) (K heads 2^-3..2^2, V heads
 * 2^-4..2^4) on the GPU and, the same values, on the CPU. */
static void kv8_fill(kv8 *p, uint32_t from, uint32_t to) {
    const size_t kvd = p->gv.kv_dim, count = (size_t)(to - from) * kvd;
    uint16_t *kb = halloc(count), *vb = halloc(count);
    float *kf = falloc(count), *vf = falloc(count);
    rand_heads(kb, kf, to - from, p->nkv, p->hd, -3, 2);
    rand_heads(vb, vf, to - from, p->nkv, p->hd, -4, 4);
    void *dk = dcopy(kb, count * 2), *dv = dcopy(vb, count * 2);
    const dj_op_call cc = {.op = DJ_OP_KV_WRITE, .n = to - from, .x = kf, .x2 = vf, .kv = &p->wv, .pos0 = from};
    dj_op_call gc = cc;
    gc.x = dk;
    gc.x2 = dv;
    gc.kv = &p->gv;
    run_both(&cc, &gc, "kv_write f8");
    dfree(dk);
    dfree(dv);
    free(kb);
    free(vb);
    free(kf);
    free(vf);
}

/* ATTENTION over f8 pages written in two KV_WRITE calls, each path in turn
 * (as check_attention_cap), against the CPU reading a copy of the pages. */
static void check_attention_f8(uint32_t n, uint32_t pos0, uint32_t nh, uint32_t nkv, uint32_t hd, uint32_t tpp,
                               uint32_t window, float softcap) {
    const uint32_t ctx = pos0 + n;
    kv8 p;
    kv8_init(&p, ctx, tpp, nkv, hd);
    if (pos0) kv8_fill(&p, 0, pos0);
    kv8_fill(&p, pos0, ctx);
    char shape[96];
    snprintf(shape, sizeof shape, "f8 ctx=%u pos0=%u n=%u heads=%u hd=%u tpp=%u", ctx, pos0, n, nkv, hd, tpp);
    check_f8_bytes("KV_WRITE", shape, p.wv.seg_base, p.gseg, kv8_bytes(&p));
    kv8_to_cpu(&p);
    check_attention_paths("f8 ", &p.cv, &p.gv, n, pos0, nh, nkv, hd, tpp, window, softcap);
    kv8_free(&p);
}

/* ROPE of k (and of q with nq > 0) then its KV_WRITE into f8 pages, as
 * check_rope_kv_write: kout and qout against the CPU's rotation (TOL); the
 * pages byte for byte against the CPU's KV_WRITE of the bf16 k the GPU wrote
 * (and v), and their K values against the CPU's f32 rotation within TOL_F8. */
static void check_rope_kv_write_f8(uint32_t n, uint32_t pos0, uint32_t nkv, uint32_t hd, uint32_t tpp, int inplace,
                                   int fuse, uint32_t nq, int tabs) {
    const uint32_t ctx = pos0 + n, kvd = nkv * hd;
    kv8 p;
    kv8_init(&p, ctx, tpp, nkv, hd);
    if (pos0) kv8_fill(&p, 0, pos0);
    const size_t count = (size_t)n * kvd, qcount = (size_t)n * nq * hd, qalloc = qcount ? qcount : 1;
    uint16_t *kb = halloc(count), *vb = halloc(count), *kout = halloc(count), *qb = halloc(qalloc);
    float *kf = falloc(count), *vf = falloc(count), *kref = falloc(count), *kgot = falloc(count),
          *inv = falloc(hd / 2), *qf = falloc(qalloc), *qref = falloc(qalloc);
    rand_heads(kb, kf, n, nkv, hd, -3, 3);
    rand_heads(vb, vf, n, nkv, hd, -4, 4);
    rand_bf16(qb, qf, qcount, -2.0f, 2.0f);
    for (uint32_t j = 0; j < hd / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    void *dk = dcopy(kb, count * 2), *dv = dcopy(vb, count * 2), *dinv = dcopy(inv, hd / 2 * sizeof(float));
    void *dkr = inplace ? dk : dalloc(count * 2);
    if (!inplace) poison(dkr, count * 2);
    void *dq = dcopy(qb, qalloc * 2), *dqr = inplace ? dq : dalloc(qalloc * 2);
    if (!inplace) poison(dqr, qalloc * 2);
    row_tabs t = {0};
    if (tabs) row_tabs_init(&t, n, hd / 2, inv, dinv);
    dj_op_call cr = {.op = DJ_OP_ROPE, .n = n, .out = kref, .x = kf, .inv_freq = inv, .pos0 = pos0, .n_heads = nkv,
                     .head_dim = hd, .scale = 1.0f, .row_freq = t.crow};
    if (dj_backend_compute(cpu, &cr) != DJ_OK) die("rope k (cpu)");
    dj_op_call cq = cr;
    cq.out = qref, cq.x = qf, cq.n_heads = nq;
    if (nq && dj_backend_compute(cpu, &cq) != DJ_OK) die("rope q (cpu)");
    dj_op_call gr = cr, gq = cr;
    gr.out = dkr, gr.x = dk, gr.inv_freq = dinv, gr.row_freq = t.grow, gr.out_dtype = DJ_DTYPE_BF16;
    gq.out = dqr, gq.x = dq, gq.inv_freq = dinv, gq.row_freq = t.grow, gq.out_dtype = DJ_DTYPE_BF16, gq.n_heads = nq;
    const dj_op_call gw = {.op = DJ_OP_KV_WRITE, .n = n, .x = dkr, .x2 = dv, .kv = &p.gv, .pos0 = pos0};
    dj__cuda_set_fuse(gpu, fuse);
    const uint64_t before = dj__cuda_fusions(gpu);
    const dj_op_call plan[3] = {gq, gr, gw};
    if (dj_backend_compute_plan(gpu, nq ? plan : plan + 1, nq ? 3 : 2, NULL) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK)
        die("rope+kv_write f8 (gpu)");
    const uint64_t fused = dj__cuda_fusions(gpu) - before, want = fuse ? (nq ? 2u : 1u) : 0u;
    dj__cuda_set_fuse(gpu, 1);
    char shape[128];
    snprintf(shape, sizeof shape, "f8 n=%u pos0=%u kv heads=%u q heads=%u hd=%u tpp=%u%s%s%s", n, pos0, nkv, nq, hd,
             tpp, inplace ? " in-place" : "", fuse ? "" : " unfused", tabs ? " row tables" : "");
    compare("ROPE+KV", shape, dkr, DJ_DTYPE_BF16, kref, count);
    if (nq) compare("ROPE+KV", "  the q heads of the same launch", dqr, DJ_DTYPE_BF16, qref, qcount);
    /* exact: the CPU's KV_WRITE of the bf16 k the GPU wrote */
    down(kout, dkr, count * 2);
    for (size_t i = 0; i < count; i++) kgot[i] = dj_bf16_to_f32(kout[i]);
    const dj_op_call cw = {.op = DJ_OP_KV_WRITE, .n = n, .x = kgot, .x2 = vf, .kv = &p.wv, .pos0 = pos0};
    if (dj_backend_compute(cpu, &cw) != DJ_OK) die("kv_write f8 (cpu)");
    check_f8_bytes("ROPE+KV", "  f8 pages against the CPU's KV_WRITE of that k", p.wv.seg_base, p.gseg,
                   kv8_bytes(&p));
    /* bounded: the pages' K values against the CPU's f32 rotation */
    kv8_to_cpu(&p);
    double maxd = 0.0, maxr = 0.0;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t e = 0; e < kvd; e++) {
            const double r = kref[(size_t)i * kvd + e], d = fabs((double)f8_k_value(&p.cv, pos0 + i, e) - r);
            if (!(d <= maxd)) maxd = d;
            if (fabs(r) > maxr) maxr = fabs(r);
        }
    const double err = maxr > 0.0 ? maxd / maxr : maxd;
    n_rows++;
    n_fail += !(err <= TOL_F8);
    printf("%-10s %-52s %10.3e  %s\n", "ROPE+KV", "  f8 K values against the CPU's f32 rotation", err,
           err <= TOL_F8 ? "pass" : "FAIL");
    if (fused != want) {
        n_rows++;
        n_fail++;
        printf("%-10s %-52s %10s  FAIL (%llu fused, expected %llu)\n", "ROPE+KV", shape, "-",
               (unsigned long long)fused, (unsigned long long)want);
    }
    if (!inplace) {
        dfree(dkr);
        dfree(dqr);
    }
    dfree(dk);
    dfree(dq);
    dfree(dv);
    dfree(dinv);
    free(kb);
    free(vb);
    free(kout);
    free(qb);
    free(kf);
    free(vf);
    free(kref);
    free(kgot);
    free(inv);
    free(qf);
    free(qref);
    kv8_free(&p);
}

/* check_rows over f8 pages: B sequences at random positions, ROPE q/k +
 * KV_WRITE + ATTENTION with row_pos/row_tables in one plan (fused), eager or
 * recorded and launched twice (positions one further the second time). The
 * pages byte for byte against the CPU's KV_WRITEs (of the GPU's kout and v);
 * ATTENTION against the CPU reading a copy of the GPU's pages. */
static void check_rows_f8(uint32_t B, uint32_t nh, uint32_t nkv, uint32_t hd, uint32_t tpp, uint32_t window,
                          int captured, int grow) {
    const uint32_t kvd = nkv * hd, qd = nh * hd, rounds = captured ? 2 : 1;
    uint32_t *pos = xmalloc(B * sizeof *pos), *nblk = xmalloc(B * sizeof *nblk), total = 0;
    for (uint32_t r = 0; r < B; r++) {
        pos[r] = (uint32_t)(dj_test_rand() % 600);
        nblk[r] = (pos[r] + rounds + tpp - 1) / tpp;
        total += nblk[r];
    }
    const uint32_t n_pages = total + 2;
    uint32_t *perm = xmalloc(n_pages * sizeof *perm);
    for (uint32_t i = 0; i < n_pages; i++) perm[i] = i;
    for (uint32_t i = n_pages - 1; i > 0; i--) {
        const uint32_t j = (uint32_t)(dj_test_rand() % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const size_t page = f8_page_bytes(tpp, nkv, hd), bytes = page * n_pages;
    uint8_t *cseg = xmalloc(bytes), *want = xmalloc(bytes);
    memset(cseg, 0xff, bytes);
    memset(want, 0xff, bytes);
    void *gseg = dalloc(bytes);
    poison(gseg, bytes);
    const uint32_t **ctab = xmalloc(B * sizeof *ctab);
    uint32_t **gtab_each = xmalloc(B * sizeof *gtab_each);
    uint32_t off = 0;
    /* gv: the GPU's pages; wv: the CPU's KV_WRITEs; cv: a copy of the GPU's pages */
    dj_kv_view gv = {.seg_base = gseg, .page_bytes = page, .tokens_per_page = tpp, .kv_dim = kvd,
                     .dtype = DJ_DTYPE_F8_E4M3, .n_kv_heads = nkv};
    dj_kv_view wv = gv, cv = gv;
    wv.seg_base = want;
    cv.seg_base = cseg;
    for (uint32_t r = 0; r < B; r++) {
        ctab[r] = perm + off;
        gtab_each[r] = dcopy(perm + off, nblk[r] * sizeof(uint32_t));
        off += nblk[r];
        if (pos[r] == 0) continue;
        /* history [0, pos) through the plain KV_WRITE */
        const size_t count = (size_t)pos[r] * kvd;
        uint16_t *kb = halloc(count), *vb = halloc(count);
        float *kf = falloc(count), *vf = falloc(count);
        rand_heads(kb, kf, pos[r], nkv, hd, grow ? -9 : -3, grow ? -6 : 2);
        rand_heads(vb, vf, pos[r], nkv, hd, grow ? -10 : -4, grow ? -6 : 4);
        void *dk = dcopy(kb, count * 2), *dv = dcopy(vb, count * 2);
        dj_kv_view w1 = wv, g1 = gv;
        w1.block_table = g1.block_table = ctab[r];
        w1.n_blocks = g1.n_blocks = nblk[r];
        const dj_op_call cc = {.op = DJ_OP_KV_WRITE, .n = pos[r], .x = kf, .x2 = vf, .kv = &w1};
        dj_op_call gc = cc;
        gc.x = dk;
        gc.x2 = dv;
        gc.kv = &g1;
        run_both(&cc, &gc, "kv_write f8 history");
        dfree(dk);
        dfree(dv);
        free(kb);
        free(vb);
        free(kf);
        free(vf);
    }
    /* layout only: rows bring their own tables */
    wv.block_table = cv.block_table = gv.block_table = ctab[0];
    wv.n_blocks = cv.n_blocks = gv.n_blocks = nblk[0];
    void *gtabs = dcopy(gtab_each, B * sizeof(void *));
    void *gpos = dalloc(B * sizeof(uint32_t));
    float *inv = falloc(hd / 2);
    for (uint32_t j = 0; j < hd / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    void *dinv = dcopy(inv, hd / 2 * sizeof(float));
    const size_t nq = (size_t)B * qd, nk = (size_t)B * kvd;
    uint16_t *qb = halloc(nq), *kb = halloc(nk), *vb = halloc(nk), *kout = halloc(nk);
    float *qf = falloc(nq), *kf = falloc(nk), *vf = falloc(nk), *qr = falloc(nq), *kr = falloc(nk),
          *kgot = falloc(nk), *ref = falloc(nq);
    void *dq = dalloc(nq * 2), *dk = dalloc(nk * 2), *dv = dalloc(nk * 2), *dqr = dalloc(nq * 2),
         *dkr = dalloc(nk * 2), *dout = dalloc(nq * 2);
    dj_op_call c_rq = {.op = DJ_OP_ROPE, .n = B, .out = qr, .x = qf, .inv_freq = inv, .row_pos = pos,
                       .n_heads = nh, .head_dim = hd, .scale = 1.0f};
    dj_op_call c_rk = c_rq;
    c_rk.out = kr;
    c_rk.x = kf;
    c_rk.n_heads = nkv;
    const dj_op_call c_kw = {.op = DJ_OP_KV_WRITE, .n = B, .x = kgot, .x2 = vf, .kv = &wv, .row_pos = pos,
                             .row_tables = ctab};
    dj_op_call c_at = {.op = DJ_OP_ATTENTION, .n = B, .out = ref, .x = qr, .kv = &cv, .row_pos = pos,
                       .row_tables = ctab, .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd, .window = window,
                       .scale = 1.0f / sqrtf((float)hd)};
    dj_op_call g_rq = c_rq, g_rk = c_rk, g_at = c_at;
    g_rq.out = dqr, g_rq.x = dq, g_rq.inv_freq = dinv, g_rq.row_pos = gpos, g_rq.out_dtype = DJ_DTYPE_BF16;
    g_rk.out = dkr, g_rk.x = dk, g_rk.inv_freq = dinv, g_rk.row_pos = gpos, g_rk.out_dtype = DJ_DTYPE_BF16;
    const dj_op_call g_kw = {.op = DJ_OP_KV_WRITE, .n = B, .x = dkr, .x2 = dv, .kv = &gv, .row_pos = gpos,
                             .row_tables = (const uint32_t *const *)gtabs};
    g_at.out = dout, g_at.x = dqr, g_at.kv = &gv, g_at.row_pos = gpos, g_at.out_dtype = DJ_DTYPE_BF16;
    g_at.row_tables = (const uint32_t *const *)gtabs;
    g_at.decode_only = true; /* each row's position is this plan's KV_WRITE; the K/V before it are older */
    const dj_op_call gcalls[4] = {g_rq, g_rk, g_kw, g_at}; /* one plan: the ROPEs fuse with the KV_WRITE */
    dj_backend_graph_t *graph = NULL;
    if (captured) {
        if (gpu->vt->capture_begin(gpu) != DJ_OK) die("capture_begin");
        if (dj_backend_compute_plan(gpu, gcalls, 4, NULL) != DJ_OK) die("recorded compute f8");
        if (gpu->vt->capture_end(gpu, &graph) != DJ_OK) die("capture_end");
    }
    for (uint32_t round = 0; round < rounds; round++) {
        if (round)
            for (uint32_t r = 0; r < B; r++) pos[r]++;
        rand_bf16(qb, qf, nq, -2.0f, 2.0f);
        /* grow: the new rows larger than any before (the history 2^-10..2^-6), so each raises its
         * page's exponents (and the attention's loads before the PDL wait must not keep the page's
         * re-encoded rows); moderate, so the scores stay too */
        rand_heads(kb, kf, B, nkv, hd, grow ? -3 + 2 * (int)round : -3, grow ? -1 + 2 * (int)round : 2);
        rand_heads(vb, vf, B, nkv, hd, grow ? -4 + 2 * (int)round : -4, grow ? -2 + 2 * (int)round : 4);
        up(dq, qb, nq * 2);
        up(dk, kb, nk * 2);
        up(dv, vb, nk * 2);
        up(gpos, pos, B * sizeof(uint32_t));
        poison(dout, nq * 2);
        if (captured) {
            if (gpu->vt->graph_launch(gpu, graph) != DJ_OK) die("graph_launch");
        } else {
            if (dj_backend_compute_plan(gpu, gcalls, 4, NULL) != DJ_OK) die("row-mode ops f8 (gpu)");
        }
        if (gpu->vt->sync(gpu) != DJ_OK) die("row-mode sync");
        /* the CPU writes the k the GPU rotated (bf16) and v; it attends over a copy of the GPU's pages */
        down(kout, dkr, nk * 2);
        for (size_t i = 0; i < nk; i++) kgot[i] = dj_bf16_to_f32(kout[i]);
        down(cseg, gseg, bytes);
        if (dj_backend_compute(cpu, &c_rq) != DJ_OK || dj_backend_compute(cpu, &c_rk) != DJ_OK ||
            dj_backend_compute(cpu, &c_kw) != DJ_OK || dj_backend_compute(cpu, &c_at) != DJ_OK)
            die("row-mode ops f8 (cpu)");
        char shape[96];
        snprintf(shape, sizeof shape, "f8 rows=%u heads=%u:%u hd=%u tpp=%u win=%u%s%s", B, nh, nkv, hd, tpp, window,
                 captured ? (round ? " graph, pos+1" : " graph") : "", grow ? " growing" : "");
        compare("ROPE/rows", shape, dqr, DJ_DTYPE_BF16, qr, nq);
        compare("ROPE k/rows", shape, dkr, DJ_DTYPE_BF16, kr, nk); /* fused with KV_WRITE */
        check_f8_bytes("KV8/rows", shape, want, gseg, bytes);
        compare("ATTN/rows", shape, dout, DJ_DTYPE_BF16, ref, nq);
        if (!captured) check_rows_short(&g_at, pos, B, shape, dout, ref, nq);
    }
    gpu->vt->graph_free(gpu, graph);
    for (uint32_t r = 0; r < B; r++) dfree(gtab_each[r]);
    dfree(gtabs);
    dfree(gpos);
    dfree(dinv);
    dfree(dq);
    dfree(dk);
    dfree(dv);
    dfree(dqr);
    dfree(dkr);
    dfree(dout);
    dfree(gseg);
    free(cseg);
    free(want);
    free(gtab_each);
    free(ctab);
    free(perm);
    free(pos);
    free(nblk);
    free(inv);
    free(qb);
    free(kb);
    free(vb);
    free(kout);
    free(qf);
    free(kf);
    free(vf);
    free(qr);
    free(kr);
    free(kgot);
    free(ref);
}

/* What an f8 backend refuses: bf16 pages, and an f8 view whose heads are not
 * the call's (its scales are per view head); a bf16 backend refuses f8 pages. */
static void check_f8_errors(void) {
    kv8 p;
    kv8_init(&p, 16, 16, 2, 64);
    uint16_t *qb = halloc(4 * 64);
    memset(qb, 0, 4 * 64 * 2);
    void *dq = dcopy(qb, 4 * 64 * 2), *dout = dalloc(4 * 64 * 2);
    dj_op_call gc = {.op = DJ_OP_ATTENTION, .n = 1, .out = dout, .x = dq, .kv = &p.gv, .pos0 = 0, .n_heads = 4,
                     .n_kv_heads = 2, .head_dim = 64, .scale = 0.125f, .out_dtype = DJ_DTYPE_BF16};
    dj_kv_view bad = p.gv;
    bad.n_kv_heads = 1;
    gc.kv = &bad;
    expect("ATTENTION", "f8 view of 1 head read as 2 kv heads", dj_backend_compute(gpu, &gc), DJ_EINVAL);
    bad = p.gv;
    bad.dtype = DJ_DTYPE_BF16;
    bad.page_bytes = 16u * 2 * 128 * 2;
    gc.kv = &bad;
    expect("ATTENTION", "bf16 pages on an f8 backend", dj_backend_compute(gpu, &gc), DJ_EINVAL);
    if (dj_backend_set_kv_dtype(gpu, DJ_DTYPE_BF16) != DJ_OK) die("kv dtype bf16");
    gc.kv = &p.gv;
    expect("ATTENTION", "f8 pages on a bf16 backend", dj_backend_compute(gpu, &gc), DJ_EINVAL);
    if (dj_backend_set_kv_dtype(gpu, DJ_DTYPE_F8_E4M3) != DJ_OK) die("kv dtype f8");
    if (gpu->vt->sync(gpu) != DJ_OK) die("sync");
    dfree(dq);
    dfree(dout);
    free(qb);
    kv8_free(&p);
}

/* Every K/V path over f8 pages (issue 16 item 3): KV_WRITE, the fused
 * RoPE+KV_WRITE with q, decode (b=1 and batched per-row, eager and
 * recorded), the f32 tiled prefill and the tensor-core prefill; head_dim
 * 64/128/256 and odd ones, GQA/MQA, windows, softcap. Both backends store
 * f8 K/V for these checks only. */
static void check_kv_f8(void) {
    if (dj_backend_set_kv_dtype(gpu, DJ_DTYPE_F8_E4M3) != DJ_OK || dj_backend_set_kv_dtype(cpu, DJ_DTYPE_F8_E4M3) != DJ_OK)
        die("kv dtype f8");
    /* rows, pos0, kv heads, head_dim, tokens per page, in place, fused, q heads, row tables */
    check_rope_kv_write_f8(1, 700, 8, 128, 16, 0, 1, 0, 0);
    check_rope_kv_write_f8(37, 5, 2, 64, 7, 1, 1, 0, 0);
    check_rope_kv_write_f8(300, 0, 8, 128, 16, 0, 1, 32, 0);
    check_rope_kv_write_f8(3, 40, 4, 80, 5, 0, 0, 12, 0);
    check_rope_kv_write_f8(5, 9, 2, 256, 16, 1, 1, 8, 0);
    check_rope_kv_write_f8(4, 3, 2, 256, 16, 0, 0, 4, 0);
    check_rope_kv_write_f8(9, 4090, 8, 96, 16, 0, 1, 32, 1); /* longrope: both tables in one batch */
    check_rope_kv_write_f8(6, 3, 2, 128, 16, 1, 0, 8, 1);
    /* n, pos0, heads, kv heads, head_dim, tokens per page, window, softcap */
    check_attention_f8(1, 4095, 32, 8, 128, 16, 0, 0.0f);  /* decode, GQA 4:1 (4 heads a block) */
    check_attention_f8(1, 1000, 8, 1, 64, 7, 0, 0.0f);     /* MQA, odd page size */
    check_attention_f8(3, 37, 8, 2, 64, 16, 0, 0.0f);
    check_attention_f8(1, 2000, 8, 2, 128, 16, 256, 0.0f); /* window */
    check_attention_f8(1, 300, 4, 2, 256, 8, 0, 0.0f);     /* head_dim 256 */
    check_attention_f8(2, 500, 6, 3, 6, 5, 0, 0.0f);       /* head_dim 6: partial lanes */
    check_attention_f8(5, 40, 4, 4, 80, 16, 0, 30.0f);     /* softcap */
    check_attention_f8(7, 9, 8, 8, 192, 3, 5, 0.0f);
    check_attention_f8(37, 0, 8, 2, 128, 16, 0, 0.0f);     /* prefill */
    check_attention_f8(37, 100, 8, 2, 64, 5, 50, 0.0f);    /* prefill after context, window */
    check_attention_f8(37, 10, 4, 2, 256, 8, 0, 0.0f);     /* prefill head_dim 256 */
    check_attention_f8(1100, 30, 32, 8, 128, 16, 0, 0.0f); /* two strips a warp */
    check_attention_f8(40, 20, 8, 4, 128, 16, 0, 50.0f);   /* prefill with softcap */
    check_attention_f8(300, 200, 16, 8, 256, 16, 37, 50.0f); /* tensor cores, Gemma 2 shape, window */
    check_attention_f8(512, 0, 32, 8, 128, 16, 0, 0.0f);   /* tensor cores, Llama-3 shape */
    check_attention_f8(129, 71, 8, 2, 64, 7, 0, 0.0f);     /* tensor cores, odd pages */
    check_attention_f8(300, 200, 8, 2, 128, 16, 37, 0.0f); /* tensor cores, window inside a tile */
    check_attention_f8(65, 3, 4, 1, 64, 32, 0, 0.0f);      /* MQA */
    /* rows, heads, kv heads, head_dim, tokens per page, window, recorded */
    check_rows_f8(1, 32, 8, 128, 16, 0, 0, 0);
    check_rows_f8(5, 8, 2, 64, 7, 0, 0, 0);
    check_rows_f8(8, 12, 4, 96, 16, 0, 0, 0);
    check_rows_f8(3, 8, 2, 256, 16, 100, 0, 0);
    check_rows_f8(32, 32, 8, 128, 16, 0, 1, 0);
    check_rows_f8(1, 32, 8, 128, 32, 0, 0, 1);
    check_rows_f8(4, 32, 8, 128, 32, 0, 1, 1);
    check_f8_errors();
    if (dj_backend_set_kv_dtype(gpu, DJ_DTYPE_BF16) != DJ_OK || dj_backend_set_kv_dtype(cpu, DJ_DTYPE_F32) != DJ_OK)
        die("kv dtype back");
}

/* EMBED with ids in device memory (an out-of-range id gives a zero row). */
static void check_embed_dev(uint32_t n, uint32_t d, uint32_t vocab) {
    void *tab = rand_weight(DJ_DTYPE_BF16, (size_t)vocab * d, -1.0f, 1.0f);
    int32_t *ids = xmalloc(n * sizeof *ids);
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(dj_test_rand() % vocab);
    float *ref = falloc((size_t)n * d);
    void *dtab = dcopy(tab, (size_t)vocab * d * 2), *dids = dcopy(ids, n * sizeof *ids);
    void *dout = dalloc((size_t)n * d * 2);
    poison(dout, (size_t)n * d * 2);
    dj_op_call cc = {.op = DJ_OP_EMBED, .n = n, .out = ref, .ids = ids, .w = tab, .w_dtype = DJ_DTYPE_BF16,
                     .d = d, .m = vocab};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.ids = NULL;
    gc.ids_dev = dids;
    gc.w = dtab;
    gc.out_dtype = DJ_DTYPE_BF16;
    run_both(&cc, &gc, "embed ids_dev");
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u d=%u vocab=%u ids in device memory", n, d, vocab);
    compare("EMBED", shape, dout, DJ_DTYPE_BF16, ref, (size_t)n * d);
    ids[0] = (int32_t)vocab; /* out of range: zero row, no fault */
    up(dids, ids, sizeof *ids);
    if (dj_backend_compute(gpu, &gc) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) die("embed bad id");
    memset(ref, 0, (size_t)d * sizeof(float));
    snprintf(shape, sizeof shape, "n=%u id %u out of range -> zero row", n, vocab);
    compare("EMBED", shape, dout, DJ_DTYPE_BF16, ref, (size_t)n * d);
    dfree(dtab);
    dfree(dids);
    dfree(dout);
    free(tab);
    free(ids);
    free(ref);
}

/* Device argmax against dj_argmax, with planted ties (lowest id wins). */
static void check_argmax(uint32_t n, uint32_t vocab) {
    float *lg = falloc((size_t)n * vocab);
    for (size_t i = 0; i < (size_t)n * vocab; i++) lg[i] = dj_test_randf(-10.0f, 10.0f);
    for (uint32_t r = 0; r < n; r++) { /* a tie for the maximum in every row */
        const uint32_t a = (uint32_t)(dj_test_rand() % vocab), b = (uint32_t)(dj_test_rand() % vocab);
        lg[(size_t)r * vocab + a] = lg[(size_t)r * vocab + b] = 20.0f;
    }
    void *dlg = dcopy(lg, (size_t)n * vocab * sizeof(float)), *dout = dalloc(n * sizeof(int32_t));
    int32_t *got = xmalloc(n * sizeof *got);
    if (gpu->vt->argmax(gpu, dlg, n, vocab, dout) != DJ_OK) die("argmax");
    down(got, dout, n * sizeof *got);
    int wrong = 0;
    for (uint32_t r = 0; r < n; r++) wrong += got[r] != dj_argmax(lg + (size_t)r * vocab, vocab);
    n_rows++;
    n_fail += wrong != 0;
    char shape[96];
    snprintf(shape, sizeof shape, "rows=%u vocab=%u, tied maxima (mismatched rows)", n, vocab);
    printf("%-10s %-52s %10d  %s\n", "ARGMAX", shape, wrong, wrong ? "FAIL" : "pass");
    dfree(dlg);
    dfree(dout);
    free(lg);
    free(got);
}

/* ---- sampling on the device (the backend's sample hook) ---- */

/* What the host rule picks for one row of the sample hook (its params, u
 * and penalties). */
static int32_t host_pick(const dj_sample_row *row, const float *lg, uint32_t V) {
    const dj_sampler_params p = {.temperature = row->temperature, .top_k = row->top_k, .top_p = row->top_p,
                                 .min_p = row->min_p, .repetition_penalty = row->repetition_penalty};
    dj_sampler_t *hs = NULL;
    if (dj_sampler_new(&p, V, &hs) != DJ_OK)
        die("host sampler");
    const int32_t want = dj_sampler_pick_with(hs, lg, row->u, row->pen, row->n_pen);
    dj_sampler_free(hs);
    return want;
}

/* n rows of V logits (kind 0: a grid of k/8 with many ties, -inf and NaN;
 * 1: continuous N(0, 3)-like values), each row with its own params (min-p
 * and penalty entries too) and u: the device's pick against
 * dj_sampler_pick_with with the same u, exactly (the rule's arithmetic is
 * shared and its masses are integers). */
static void check_sample(uint32_t n, uint32_t V, int kind) {
    float *lg = falloc((size_t)n * V);
    dj_sample_row *rows = xmalloc(n * sizeof *rows);
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const uint32_t topks[] = {0, 1, 3, 40, 1000};
    static const float topps[] = {1.0f, 0.9137f, 0.5371f, 0.05f};
    static const float minps[] = {0.0f, 0.0f, 0.02f, 0.3f};
    static const float reps[] = {0.0f, 1.0f, 1.3f, 0.8f};
    const uint32_t max_pen = V < 64 ? V : 64;
    dj_sampler_penalty *pens = xmalloc((size_t)n * max_pen * sizeof *pens);
    for (uint32_t r = 0; r < n; r++) {
        float *l = lg + (size_t)r * V;
        if (kind == 0)
            dj_test_grid_logits(l, V);
        for (uint32_t i = 0; kind != 0 && i < V; i++) {
            float a = 0.0f;
            for (int k = 0; k < 4; k++)
                a += dj_test_randf(-1.5f, 1.5f);
            l[i] = a;
        }
        const uint32_t n_pen = r % 3 == 2 ? dj_test_rand() % (max_pen + 1) : 0;
        dj_sampler_penalty *pe = pens + (size_t)r * max_pen;
        const uint32_t stride = V / max_pen; /* distinct ids */
        for (uint32_t k = 0; k < n_pen; k++)
            pe[k] = (dj_sampler_penalty){.id = (int32_t)(k * stride + dj_test_rand() % stride),
                                         .sub = 0.25f * (float)(dj_test_rand() % 5) - 0.5f};
        rows[r] = (dj_sample_row){.temperature = temps[dj_test_rand() % 4],
                                  .top_k = topks[dj_test_rand() % 5],
                                  .top_p = topps[dj_test_rand() % 4],
                                  .min_p = minps[dj_test_rand() % 4],
                                  .repetition_penalty = n_pen ? reps[dj_test_rand() % 4] : 0.0f,
                                  .n_pen = n_pen,
                                  .pen = pe,
                                  .u = dj_test_randf(0.0f, 1.0f)};
        if (r == 0)
            rows[r].temperature = 1.0f, rows[r].top_k = 0, rows[r].top_p = 1.0f, rows[r].min_p = 0.0f; /* no cut */
        if (r == 1 && n > 1)
            rows[r].temperature = 0.8f, rows[r].top_k = 0, rows[r].top_p = 0.9137f, rows[r].min_p = 0.0f;
    }
    void *dlg = dcopy(lg, (size_t)n * V * sizeof(float)), *dout = dalloc(n * sizeof(int32_t));
    int32_t *got = xmalloc(n * sizeof *got), *again = xmalloc(n * sizeof *again);
    if (gpu->vt->sample(gpu, dlg, n, V, rows, dout) != DJ_OK)
        die("sample");
    down(got, dout, n * sizeof *got);
    if (gpu->vt->sample(gpu, dlg, n, V, rows, dout) != DJ_OK)
        die("sample");
    down(again, dout, n * sizeof *again);
    int wrong = 0;
    for (uint32_t r = 0; r < n; r++) {
        const int32_t want = host_pick(&rows[r], lg + (size_t)r * V, V);
        if (got[r] == want && again[r] == want)
            continue;
        wrong++;
        printf(
            "           row %u: T %g top_k %u top_p %g min_p %g rep %g pens %u u %.9f: device %d (again %d), host %d\n",
            r, (double)rows[r].temperature, rows[r].top_k, (double)rows[r].top_p, (double)rows[r].min_p,
            (double)rows[r].repetition_penalty, rows[r].n_pen, rows[r].u, got[r], again[r], want);
    }
    n_rows++;
    n_fail += wrong != 0;
    char shape[96];
    snprintf(shape, sizeof shape, "rows=%u vocab=%u %s", n, V,
             kind == 0 ? "grid logits, ties, -inf, NaN" : "continuous logits");
    printf("%-10s %-52s %10d  %s\n", "SAMPLE", shape, wrong, wrong ? "FAIL" : "pass");
    dfree(dlg);
    dfree(dout);
    free(lg);
    free(rows);
    free(pens);
    free(got);
    free(again);
}

/* The mask hook: n rows of V logits, each row masked (allowed about half,
 * or none), biased (up to 64 distinct ids, -100..100) or both, or neither;
 * the device's rows against the CPU backend's hook, bit for bit (-inf and
 * one float add per entry), then the device's argmax of the masked rows
 * against dj_sampler's own masked greedy pick. */
static void check_mask(uint32_t n, uint32_t V) {
    float *lg = falloc((size_t)n * V), *want = falloc((size_t)n * V), *got = falloc((size_t)n * V);
    uint8_t *allowed = xmalloc((size_t)n * V);
    dj_logit_bias *bias = xmalloc((size_t)n * 64 * sizeof *bias);
    dj_mask_row *rows = xmalloc(n * sizeof *rows);
    for (uint32_t r = 0; r < n; r++) {
        for (uint32_t i = 0; i < V; i++) lg[(size_t)r * V + i] = dj_test_randf(-4.f, 4.f);
        uint8_t *a = allowed + (size_t)r * V;
        for (uint32_t i = 0; i < V; i++) a[i] = (uint8_t)(dj_test_rand() % 2);
        a[dj_test_rand() % V] = 1; /* at least one */
        dj_logit_bias *b = bias + (size_t)r * 64;
        const uint32_t nb = r % 4 >= 2 ? 1 + dj_test_rand() % 64 : 0, stride = V / 64;
        for (uint32_t k = 0; k < nb; k++)
            b[k] = (dj_logit_bias){.id = (int32_t)(k * stride + dj_test_rand() % stride),
                                   .bias = dj_test_randf(-100.f, 100.f)};
        rows[r] = (dj_mask_row){.allowed = r % 2 ? a : NULL, .bias = b, .n_bias = nb};
    }
    memcpy(want, lg, (size_t)n * V * sizeof *lg);
    if (cpu->vt->mask(cpu, want, n, V, rows) != DJ_OK)
        die("cpu mask");
    void *dlg = dcopy(lg, (size_t)n * V * sizeof(float)), *dout = dalloc(n * sizeof(int32_t));
    if (gpu->vt->mask(gpu, dlg, n, V, rows) != DJ_OK)
        die("mask");
    down(got, dlg, (size_t)n * V * sizeof *got);
    int wrong = 0;
    for (uint32_t r = 0; r < n; r++)
        if (memcmp(got + (size_t)r * V, want + (size_t)r * V, V * sizeof *got)) {
            wrong++;
            printf("           row %u (mask %d, %u biases): the device's logits differ\n", r, rows[r].allowed != NULL,
                   rows[r].n_bias);
        }
    /* the pick after it: the host sampler's masked greedy pick of the raw row */
    int32_t *picks = xmalloc(n * sizeof *picks);
    if (gpu->vt->argmax(gpu, dlg, n, V, dout) != DJ_OK)
        die("argmax");
    down(picks, dout, n * sizeof *picks);
    const dj_sampler_params gp = {.top_p = 1.0f};
    for (uint32_t r = 0; r < n; r++) {
        dj_sampler_t *hs = NULL;
        if (dj_sampler_new(&gp, V, &hs) != DJ_OK || dj_sampler_set_allowed(hs, rows[r].allowed) != DJ_OK ||
            dj_sampler_set_bias(hs, rows[r].bias, rows[r].n_bias) != DJ_OK)
            die("host sampler");
        const int32_t w = dj_sampler_sample(hs, lg + (size_t)r * V);
        dj_sampler_free(hs);
        if (w != picks[r]) {
            wrong++;
            printf("           row %u: the device's masked argmax %d, the host sampler's %d\n", r, picks[r], w);
        }
    }
    n_rows++;
    n_fail += wrong != 0;
    char shape[96];
    snprintf(shape, sizeof shape, "rows=%u vocab=%u masks and logit_bias", n, V);
    printf("%-10s %-52s %10d  %s\n", "MASK", shape, wrong, wrong ? "FAIL" : "pass");
    dfree(dlg);
    dfree(dout);
    free(lg);
    free(want);
    free(got);
    free(allowed);
    free(bias);
    free(rows);
    free(picks);
}

/* The hand-made row of test_sampler.c, each case on the device. */
static void check_sample_cases(void) {
    const float row[7] = {0.f, 2.f, 2.f, 1.f, 2.f, -INFINITY, NAN};
    static const struct {
        uint32_t top_k;
        float top_p;
        double u;
        int32_t want;
    } cases[] = {{0, 1.f, 0.50, 2}, {0, 1.f, 0.03, 0},     {0, 1.f, 0.9999, 4}, {2, 1.f, 0.40, 1},   {2, 1.f, 0.60, 2},
                 {4, 1.f, 0.99, 4}, {0, 0.5371f, 0.99, 2}, {0, 0.2f, 0.99, 1},  {3, 0.999f, 0.99, 4}};
    const uint32_t n = sizeof cases / sizeof *cases;
    float lg[sizeof cases / sizeof *cases][7];
    dj_sample_row rows[sizeof cases / sizeof *cases];
    for (uint32_t i = 0; i < n; i++) {
        memcpy(lg[i], row, sizeof row);
        rows[i] =
            (dj_sample_row){.temperature = 1.f, .top_k = cases[i].top_k, .top_p = cases[i].top_p, .u = cases[i].u};
    }
    void *dlg = dcopy(lg, sizeof lg), *dout = dalloc(sizeof(int32_t) * n);
    int32_t got[sizeof cases / sizeof *cases];
    if (gpu->vt->sample(gpu, dlg, n, 7, rows, dout) != DJ_OK)
        die("sample");
    down(got, dout, sizeof got);
    int wrong = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (got[i] == cases[i].want)
            continue;
        wrong++;
        printf("           case %u: device %d, want %d\n", i, got[i], cases[i].want);
    }
    n_rows++;
    n_fail += wrong != 0;
    printf("%-10s %-52s %10d  %s\n", "SAMPLE", "hand row: ties, -inf, NaN, top-k/top-p cuts", wrong,
           wrong ? "FAIL" : "pass");
    rows[0].u = 1.0;
    expect("SAMPLE", "u = 1 (outside [0, 1))", gpu->vt->sample(gpu, dlg, n, 7, rows, dout), DJ_EINVAL);
    rows[0].u = 0.5;
    rows[0].top_p = 0.0f;
    expect("SAMPLE", "top_p 0", gpu->vt->sample(gpu, dlg, n, 7, rows, dout), DJ_EINVAL);
    dfree(dlg);
    dfree(dout);
}

/* The sample kernels split each row over blocks (dj__cuda_set_sample_split forces
 * the split): V = 64 over 4 blocks of 16 ids, all logits equal, so top-k 16
 * or top-p 0.25 cut exactly at the first block's end and top-k 17 one past
 * it; a greedy row whose max is tied at ids 16 and 48 (block starts); an
 * all -inf row. Each against dj_sampler_pick_with with the same u. */
static void check_sample_boundaries(void) {
    enum { V = 64, N = 9 };
    static const struct {
        float temperature;
        uint32_t top_k;
        float top_p;
        float min_p;
        double u;
        int lg; /* 0: all 0, 1: -1 but 2 at ids 16 and 48, 2: all -inf */
    } cases[N] = {{1.f, 0, 0.25f, 0.f, 0.999, 0}, {1.f, 16, 1.f, 0.f, 0.999, 0}, {1.f, 17, 1.f, 0.f, 0.999, 0},
                  {1.f, 0, 0.25f, 0.f, 0.0, 0},   {1.f, 40, 0.4f, 0.f, 0.999, 0}, {0.f, 0, 1.f, 0.f, 0.5, 1},
                  {1.f, 0, 0.5f, 0.f, 0.999, 1},   {1.f, 0, 1.f, 0.f, 0.5, 2},     {1.f, 0, 1.f, 0.5f, 0.999, 1}};
    float lg[N][V];
    dj_sample_row rows[N];
    for (uint32_t c = 0; c < N; c++) {
        for (uint32_t i = 0; i < V; i++)
            lg[c][i] = cases[c].lg == 0 ? 0.f : cases[c].lg == 2 ? -INFINITY : (i == 16 || i == 48) ? 2.f : -1.f;
        rows[c] = (dj_sample_row){.temperature = cases[c].temperature, .top_k = cases[c].top_k,
                                  .top_p = cases[c].top_p, .min_p = cases[c].min_p, .u = cases[c].u};
    }
    void *dlg = dcopy(lg, sizeof lg), *dout = dalloc(sizeof(int32_t) * N);
    int32_t got[N];
    if (gpu->vt->sample(gpu, dlg, N, V, rows, dout) != DJ_OK)
        die("sample");
    down(got, dout, sizeof got);
    int wrong = 0;
    for (uint32_t c = 0; c < N; c++) {
        const dj_sampler_params p = {.temperature = rows[c].temperature, .top_k = rows[c].top_k,
                                     .top_p = rows[c].top_p, .min_p = rows[c].min_p};
        dj_sampler_t *hs = NULL;
        if (dj_sampler_new(&p, V, &hs) != DJ_OK)
            die("host sampler");
        const int32_t want = dj_sampler_pick_with(hs, lg[c], rows[c].u, NULL, 0);
        dj_sampler_free(hs);
        if (got[c] == want)
            continue;
        wrong++;
        printf("           case %u: device %d, host %d\n", c, got[c], want);
    }
    n_rows++;
    n_fail += wrong != 0;
    printf("%-10s %-52s %10d  %s\n", "SAMPLE", "split 4x16: cuts and ties at block edges, -inf row", wrong,
           wrong ? "FAIL" : "pass");
    dfree(dlg);
    dfree(dout);
}

/* The compact path of a small top-k (at most 1024; 1025 and up take the
 * radix path): per row a pattern - 0: four levels (ties of ~V/4 straddle
 * every small cut), 1: all equal, 2: 37 finite logits and the rest -inf or
 * NaN (top_k above the finite count), 3: continuous, 4: four levels with
 * penalties (ties move) - and top_k from 1 to 1025 with top-p cuts inside
 * and above the tie at the cut, min-p after the top-k, u from 0 to just
 * below 1. Each against dj_sampler_pick_with with the same u. */
static void check_sample_small_k(uint32_t n, uint32_t V) {
    static const uint32_t topks[] = {1, 2, 5, 40, 333, 1024, 1025};
    static const float topps[] = {1.0f, 0.9137f, 0.5f, 0.05f};
    static const float minps[] = {0.0f, 0.0f, 0.05f, 0.5f};
    static const float temps[] = {0.5f, 1.0f, 1.7f};
    static const double us[] = {0.0, 0.25, 0.5, 0.999999};
    float *lg = falloc((size_t)n * V);
    dj_sample_row *rows = xmalloc(n * sizeof *rows);
    dj_sampler_penalty *pens = xmalloc((size_t)n * 64 * sizeof *pens);
    for (uint32_t r = 0; r < n; r++) {
        float *l = lg + (size_t)r * V;
        const uint32_t pat = r % 5;
        for (uint32_t i = 0; i < V; i++) {
            if (pat == 0 || pat == 4)
                l[i] = (float)(dj_test_rand() % 4) * 0.5f;
            else if (pat == 1)
                l[i] = 1.0f;
            else if (pat == 2)
                l[i] = dj_test_rand() % 2 ? -INFINITY : NAN;
            else
                l[i] = dj_test_randf(-4.0f, 4.0f);
        }
        for (uint32_t k = 0; pat == 2 && k < 37; k++)
            l[dj_test_rand() % V] = (float)(dj_test_rand() % 5);
        const uint32_t n_pen = pat == 4 ? 64 : 0;
        dj_sampler_penalty *pe = pens + (size_t)r * 64;
        for (uint32_t k = 0; k < n_pen; k++) /* distinct ids: one in each 64th of the row */
            pe[k] = (dj_sampler_penalty){.id = (int32_t)(k * (V / 64) + dj_test_rand() % (V / 64)),
                                         .sub = 0.5f * (float)(dj_test_rand() % 3) - 0.5f};
        rows[r] = (dj_sample_row){.temperature = temps[dj_test_rand() % 3],
                                  .top_k = topks[(r / 5 + r) % 7],
                                  .top_p = topps[dj_test_rand() % 4],
                                  .min_p = minps[dj_test_rand() % 4],
                                  .repetition_penalty = n_pen ? 1.3f : 0.0f,
                                  .n_pen = n_pen,
                                  .pen = pe,
                                  .u = r % 3 ? dj_test_randf(0.0f, 1.0f) : us[(r / 3) % 4]};
    }
    void *dlg = dcopy(lg, (size_t)n * V * sizeof(float)), *dout = dalloc(n * sizeof(int32_t));
    int32_t *got = xmalloc(n * sizeof *got);
    if (gpu->vt->sample(gpu, dlg, n, V, rows, dout) != DJ_OK)
        die("sample");
    down(got, dout, n * sizeof *got);
    int wrong = 0;
    for (uint32_t r = 0; r < n; r++) {
        const int32_t want = host_pick(&rows[r], lg + (size_t)r * V, V);
        if (got[r] == want)
            continue;
        wrong++;
        printf("           row %u (pattern %u): T %g top_k %u top_p %g min_p %g pens %u u %.9f: device %d, host %d\n",
               r, r % 5, (double)rows[r].temperature, rows[r].top_k, (double)rows[r].top_p, (double)rows[r].min_p,
               rows[r].n_pen, rows[r].u, got[r], want);
    }
    n_rows++;
    n_fail += wrong != 0;
    char shape[96];
    snprintf(shape, sizeof shape, "rows=%u vocab=%u small top-k: ties at the cut", n, V);
    printf("%-10s %-52s %10d  %s\n", "SAMPLE", shape, wrong, wrong ? "FAIL" : "pass");
    dfree(dlg);
    dfree(dout);
    free(lg);
    free(rows);
    free(pens);
    free(got);
}

/* The random SAMPLE checks again under forced splits: vocab not a multiple
 * of the split (1000 over 7), smaller than it (7 over 16: empty blocks),
 * 128K over 64 (the most the kernels take). */
static void check_sample_splits(void) {
    dj__cuda_set_sample_split(gpu, 4);
    check_sample_boundaries();
    dj__cuda_set_sample_split(gpu, 7);
    check_sample(40, 1000, 0);
    check_sample(40, 1000, 1);
    dj__cuda_set_sample_split(gpu, 16);
    check_sample(40, 7, 0);
    check_sample_cases();
    dj__cuda_set_sample_split(gpu, 64);
    check_sample(8, 128256, 0);
    check_sample(3, 128256, 1);
    check_sample_small_k(35, 128256);
    dj__cuda_set_sample_split(gpu, 7);
    check_sample_small_k(70, 4099);
    dj__cuda_set_sample_split(gpu, 0);
}

/* What capture refuses: host inputs (staged copies) and synchronous copies. */
static void check_capture_errors(void) {
    uint16_t h[64] = {0};
    int32_t ids[2] = {0, 1};
    void *tab = dcopy(h, sizeof h), *out = dalloc(sizeof h);
    dj_op_call c = {.op = DJ_OP_EMBED, .n = 2, .out = out, .ids = ids, .w = tab, .w_dtype = DJ_DTYPE_BF16, .d = 8,
                    .m = 4, .out_dtype = DJ_DTYPE_BF16};
    dj_backend_graph_t *g = NULL;
    if (gpu->vt->capture_begin(gpu) != DJ_OK) die("capture_begin");
    expect("CAPTURE", "host token ids while recording", dj_backend_compute(gpu, &c), DJ_EINVAL);
    expect("CAPTURE", "upload while recording", gpu->vt->upload(gpu, out, h, 16), DJ_EINVAL);
    expect("CAPTURE", "capture_end after a failed call", gpu->vt->capture_end(gpu, &g), DJ_EINVAL);
    expect("CAPTURE", "stream usable after an abandoned capture", gpu->vt->sync(gpu), DJ_OK);
    dfree(tab);
    dfree(out);
}

static void check_errors(void) {
    uint16_t h[64] = {0};
    void *d = dcopy(h, sizeof h), *w = dcopy(h, sizeof h);
    dj_op_call c = {.op = DJ_OP_RMSNORM, .n = 1, .out = d, .x = w, .w = w, .w_dtype = DJ_DTYPE_BF16, .d = 8,
                    .out_dtype = DJ_DTYPE_F32};
    expect("RMSNORM", "out_dtype f32 (MATMUL, EMBED, ADD only)", dj_backend_compute(gpu, &c), DJ_EINVAL);
    c.out_dtype = DJ_DTYPE_BF16;
    c.x_dtype = DJ_DTYPE_F16;
    expect("RMSNORM", "x_dtype f16 (bf16 or the f32 residual only)", dj_backend_compute(gpu, &c), DJ_EINVAL);
    uint32_t table[1] = {0};
    dj_kv_view kv = {.seg_base = d, .page_bytes = 128, .block_table = table, .n_blocks = 1, .tokens_per_page = 4,
                     .kv_dim = 8, .dtype = DJ_DTYPE_F32};
    dj_op_call kw = {.op = DJ_OP_KV_WRITE, .n = 1, .x = w, .x2 = w, .kv = &kv};
    expect("KV_WRITE", "f32 K/V view", dj_backend_compute(gpu, &kw), DJ_EINVAL);
    kv.dtype = DJ_DTYPE_BF16;
    kw.pos0 = 4;
    expect("KV_WRITE", "position past the mapped blocks", dj_backend_compute(gpu, &kw), DJ_ERANGE);
    expect("SYNC", "after rejected calls", gpu->vt->sync(gpu), DJ_OK);
    dfree(d);
    dfree(w);
}

/* ---- timings ---- */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of c on the GPU (warm-up, then iters calls, one sync). */
static double time_call(const dj_op_call *c, int iters) {
    for (int i = 0; i < 3; i++)
        if (dj_backend_compute(gpu, c) != DJ_OK) die("bench");
    if (gpu->vt->sync(gpu) != DJ_OK) die("bench sync");
    const double t0 = now();
    for (int i = 0; i < iters; i++)
        if (dj_backend_compute(gpu, c) != DJ_OK) die("bench");
    if (gpu->vt->sync(gpu) != DJ_OK) die("bench sync");
    return (now() - t0) / iters;
}

static void *dev_random_bf16(size_t count, float scale) {
    uint16_t *h = halloc(count);
    for (size_t i = 0; i < count; i++) h[i] = dj_f32_to_bf16(dj_test_randf(-scale, scale));
    void *d = dcopy(h, count * 2);
    free(h);
    return d;
}

/* K/V dtype of the attention benches: bf16, or f8_e4m3 for their f8 rows
 * (the backend's kv dtype is switched with it). */
static dj_dtype bench_kvt = DJ_DTYPE_BF16;

/* n_pages pages of bench_kvt K/V for 64 KiB pages of tpp positions: random
 * bf16 in [-1, 1), or random finite f8 codes with exponents -6 (values below 7). */
static void *dev_random_kv(uint32_t n_pages, uint32_t tpp, uint32_t nkv, uint32_t hd) {
    if (bench_kvt != DJ_DTYPE_F8_E4M3) return dev_random_bf16((size_t)32768 * n_pages, 1.0f);
    uint8_t *h = xmalloc((size_t)65536 * n_pages);
    const size_t kvd = (size_t)nkv * hd;
    for (uint32_t pg = 0; pg < n_pages; pg++) {
        uint8_t *page = h + (size_t)pg * 65536;
        for (size_t i = 0; i < 2 * tpp * kvd; i++) page[i] = (uint8_t)(dj_test_rand() % 0x7e) | (uint8_t)(dj_test_rand() & 0x80);
        memset(page + 2 * tpp * kvd, 0xfa, 2 * (size_t)tpp * nkv); /* (int8)0xfa = -6 */
    }
    void *d = dcopy(h, (size_t)65536 * n_pages);
    free(h);
    return d;
}

static void bench_matmul(uint32_t n, uint32_t k, uint32_t m, int iters) {
    void *x = dev_random_bf16((size_t)n * k, 1.0f), *w = dev_random_bf16((size_t)m * k, 0.02f);
    void *out = dalloc((size_t)n * m * 2);
    dj_op_call c = {.op = DJ_OP_MATMUL, .n = n, .out = out, .x = x, .w = w, .w_dtype = DJ_DTYPE_BF16, .k = k, .m = m,
                    .out_dtype = DJ_DTYPE_BF16};
    const double s = time_call(&c, iters);
    const double wbytes = (double)m * k * 2, flops = 2.0 * n * k * m;
    printf("bench matmul bf16 %ux%ux%u: %9.1f us  %7.1f GB/s of weights  %7.2f TFLOP/s\n", n, k, m, s * 1e6,
           wbytes / s / 1e9, flops / s / 1e12);
    dfree(x);
    dfree(w);
    dfree(out);
}

/* --deterministic (be->deterministic): every row of a MATMUL of up to
 * DJ_DETERMINISTIC_MAX_ROWS rows equals, bit for bit, the same row computed
 * alone and in batches of 7 and 32 (bf16 and f32 out: activations and
 * logits; bf16 or FP8 weights of 128x128 blocks - w_t). Also reports whether
 * the default path differs (it may). */
static void check_deterministic(uint32_t k, uint32_t m, dj_dtype out_t, dj_dtype w_t) {
    const uint32_t N = 32, sizes[3] = {1, 7, 32};
    const size_t os = dj_dtype_size(out_t);
    const bool f8 = w_t == DJ_DTYPE_F8_E4M3;
    void *x = dev_random_bf16((size_t)N * k, 1.0f), *w = NULL, *ws = NULL;
    if (f8) {
        uint8_t *hw = xmalloc((size_t)m * k);
        rand_f8_codes(hw, (size_t)m * k);
        const size_t nsc = (size_t)((m + 127) / 128) * ((k + 127) / 128);
        float *hs = falloc(nsc);
        rand_f8_scales(hs, nsc, k);
        w = dcopy(hw, (size_t)m * k);
        ws = dcopy(hs, nsc * sizeof(float));
        free(hw);
        free(hs);
    } else
        w = dev_random_bf16((size_t)m * k, 0.02f);
    void *out = dalloc((size_t)N * m * os);
    uint8_t *rows[3], *plain = xmalloc((size_t)N * m * os);
    gpu->deterministic = true;
    for (int i = 0; i < 3; i++) {
        dj_op_call c = {.op = DJ_OP_MATMUL, .n = sizes[i], .out = out, .x = x, .w = w, .w_dtype = w_t,
                        .w_scale = ws, .w_block_rows = f8 ? 128 : 0, .w_block_cols = f8 ? 128 : 0,
                        .k = k, .m = m, .out_dtype = out_t};
        if (dj_backend_compute(gpu, &c) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) die("deterministic matmul");
        rows[i] = xmalloc((size_t)sizes[i] * m * os);
        down(rows[i], out, (size_t)sizes[i] * m * os);
    }
    gpu->deterministic = false;
    dj_op_call c = {.op = DJ_OP_MATMUL, .n = N, .out = out, .x = x, .w = w, .w_dtype = w_t,
                    .w_scale = ws, .w_block_rows = f8 ? 128 : 0, .w_block_cols = f8 ? 128 : 0,
                    .k = k, .m = m, .out_dtype = out_t};
    if (dj_backend_compute(gpu, &c) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) die("matmul");
    down(plain, out, (size_t)N * m * os);
    const size_t row = (size_t)m * os;
    int wrong = memcmp(rows[0], rows[1], row) != 0;          /* row 0: alone vs in 7 */
    wrong += memcmp(rows[0], rows[2], row) != 0;             /* alone vs in 32 */
    wrong += memcmp(rows[1], rows[2], 7 * row) != 0;         /* rows 0..6: in 7 vs in 32 */
    const int plain_differs = memcmp(plain, rows[2], N * row) != 0;
    n_rows++;
    n_fail += wrong != 0;
    char shape[96];
    snprintf(shape, sizeof shape, "deterministic %ux%u%s %s: rows of 1/7/32 (default %s)", k, m, f8 ? " f8" : "",
             out_t == DJ_DTYPE_F32 ? "f32" : "bf16", plain_differs ? "differs" : "equal");
    printf("%-10s %-52s %10d  %s\n", "MATMUL", shape, wrong, wrong ? "FAIL" : "pass");
    for (int i = 0; i < 3; i++) free(rows[i]);
    free(plain);
    dfree(x);
    dfree(w);
    if (ws) dfree(ws);
    dfree(out);
}

/* The cost of --deterministic: a b=32 matmul by GEMVs against cuBLAS. */
static void bench_deterministic(uint32_t k, uint32_t m) {
    void *x = dev_random_bf16((size_t)32 * k, 1.0f), *w = dev_random_bf16((size_t)m * k, 0.02f);
    void *out = dalloc((size_t)32 * m * 2);
    dj_op_call c = {.op = DJ_OP_MATMUL, .n = 32, .out = out, .x = x, .w = w, .w_dtype = DJ_DTYPE_BF16, .k = k, .m = m,
                    .out_dtype = DJ_DTYPE_BF16};
    const double plain = time_call(&c, 100);
    gpu->deterministic = true;
    const double det = time_call(&c, 100);
    gpu->deterministic = false;
    printf("bench deterministic matmul 32x%ux%u: %9.1f us (default %9.1f us, %.2fx)\n", k, m, det * 1e6, plain * 1e6,
           det / plain);
    dfree(x);
    dfree(w);
    dfree(out);
}

/* Seconds per round of `count` calls, recorded `rounds` times in one graph
 * (no host launch cost in the figure) that runs `iters` times. */
static double time_graph(const dj_op_call *calls, int count, int rounds, int iters) {
    dj_backend_graph_t *g = NULL;
    if (gpu->vt->capture_begin(gpu) != DJ_OK) die("bench capture");
    for (int r = 0; r < rounds; r++) /* each round one plan (fused as the engine's steps are) */
        if (dj_backend_compute_plan(gpu, &calls[(size_t)r * count], (size_t)count, NULL) != DJ_OK) die("bench");
    if (gpu->vt->capture_end(gpu, &g) != DJ_OK) die("bench capture_end");
    if (gpu->vt->graph_launch(gpu, g) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) die("bench warm-up");
    const double t0 = now();
    for (int it = 0; it < iters; it++)
        if (gpu->vt->graph_launch(gpu, g) != DJ_OK) die("bench graph");
    if (gpu->vt->sync(gpu) != DJ_OK) die("bench sync");
    const double s = (now() - t0) / ((double)iters * rounds);
    gpu->vt->graph_free(gpu, g);
    return s;
}

static uint8_t *rand_q4(uint32_t m, uint32_t k);

/* A decode GEMV shape: n rows of x against `count` bf16 weights [ms[i], k]
 * that share x (q/k/v: one grouped launch). */
typedef struct gemv_shape {
    uint32_t n, k, ms[3];
    int count;
    const char *what;
} gemv_shape;

#define GEMV_BENCH_ROUNDS 16
#define GEMV_BENCH_SPAN ((size_t)256 << 20) /* bytes of weight copies a graph cycles through: past the 50 MB L2 */

/* Each shape through the GEMV with weights of dtype wt (bf16; f8_e4m3 with
 * 128x128 block scales; Q4), timed in graphs. Round r reads weight copy
 * r % copies, with copies enough to span GEMV_BENCH_SPAN (at most
 * GEMV_BENCH_ROUNDS: 128 MB for the 8 MB k weights), so no round finds its
 * weights in L2, as in a decode step. A "gate/up+glu" shape is the two
 * matmuls and their SILU_MUL as one plan (fused where the backend fuses it).
 * One line per shape:
 *   bench gemv <dtype> n=<n> k=<k> m=<m>[+<m>..]: <us> us <GB/s> GB/s of weights */
static void bench_gemv(dj_dtype wt) {
    static const gemv_shape shapes[] = {
        {1, 4096, {4096, 1024, 1024}, 3, "q/k/v"}, {1, 4096, {4096}, 1, "o"},
        {1, 4096, {1024}, 1, "k alone"},          {1, 4096, {14336}, 1, "gate"},
        {1, 4096, {14336, 14336}, 2, "gate/up+glu"}, {1, 14336, {4096}, 1, "down"},
        {1, 4096, {128256}, 1, "lm head"},       {8, 4096, {14336}, 1, "gate, 8 rows"},
        {16, 4096, {14336}, 1, "gate, 16 rows"},  {32, 4096, {14336}, 1, "gate, 32 rows"},
    };
    const size_t n_shapes = sizeof shapes / sizeof *shapes;
    const bool q4 = wt == DJ_DTYPE_Q4, f8 = wt == DJ_DTYPE_F8_E4M3;
    /* one host pattern for every upload: 1 MiB repeated of bf16 values in
     * +-0.02 or e4m3 codes; Q4: rand_q4's 64 rows repeated, per shape (every m
     * here a multiple of 64: whole bands, so a valid banded matrix) */
    size_t max_bytes = 0;
    for (size_t i = 0; i < n_shapes; i++)
        for (int j = 0; j < shapes[i].count; j++) {
            const size_t b = (size_t)shapes[i].ms[j] * dj_dtype_row_bytes(wt, shapes[i].k);
            if (b > max_bytes) max_bytes = b;
        }
    uint8_t *pat = xmalloc(max_bytes);
    const size_t period = (size_t)1 << 20;
    for (size_t i = 0; i + 2 <= max_bytes && i < period; i += 2) {
        const uint16_t v = dj_f32_to_bf16(dj_test_randf(-0.02f, 0.02f));
        memcpy(pat + i, &v, 2);
    }
    if (f8)
        for (size_t i = 0; i < max_bytes && i < period; i++) pat[i] = dj_f32_to_f8e4m3(dj_test_randf(-448.0f, 448.0f));
    for (size_t i = period; i < max_bytes; i++) pat[i] = pat[i % period];
    for (size_t si = 0; si < n_shapes; si++) {
        const gemv_shape *sh = &shapes[si];
        const bool glu = strcmp(sh->what, "gate/up+glu") == 0;
        const size_t rb = dj_dtype_row_bytes(wt, sh->k);
        if (q4) { /* the bytes of rand_q4's 64 rows (4 bands), repeated, as many rows as the largest m has */
            enum { QROWS = 64 };
            uint32_t most = 0;
            for (int j = 0; j < sh->count; j++) most = sh->ms[j] > most ? sh->ms[j] : most;
            uint8_t *rows = rand_q4(QROWS, sh->k);
            for (size_t r = 0; r < most; r++) memcpy(pat + r * rb, rows + (r % QROWS) * rb, rb);
            free(rows);
        }
        size_t round_bytes = 0;
        for (int j = 0; j < sh->count; j++) round_bytes += (size_t)sh->ms[j] * rb;
        int copies = (int)((GEMV_BENCH_SPAN + round_bytes - 1) / round_bytes);
        if (copies > GEMV_BENCH_ROUNDS) copies = GEMV_BENCH_ROUNDS;
        void *x = dev_random_bf16((size_t)sh->n * sh->k, 1.0f);
        void *w[GEMV_BENCH_ROUNDS][3], *out[3], *act = NULL, *scale[3] = {NULL, NULL, NULL};
        const int per = sh->count + (glu ? 1 : 0);
        dj_op_call calls[GEMV_BENCH_ROUNDS * 4];
        for (int j = 0; j < sh->count; j++) out[j] = dalloc((size_t)sh->n * sh->ms[j] * 2);
        if (glu) act = dalloc((size_t)sh->n * sh->ms[0] * 2);
        for (int c = 0; c < copies; c++)
            for (int j = 0; j < sh->count; j++) w[c][j] = dcopy(pat, (size_t)sh->ms[j] * rb);
        if (f8)
            for (int j = 0; j < sh->count; j++) {
                const size_t ns = (size_t)((sh->ms[j] + 127) / 128) * ((sh->k + 127) / 128);
                float *hs = falloc(ns);
                rand_f8_scales(hs, ns, sh->k);
                scale[j] = dcopy(hs, ns * sizeof(float));
                free(hs);
            }
        for (int r = 0; r < GEMV_BENCH_ROUNDS; r++) {
            for (int j = 0; j < sh->count; j++)
                calls[r * per + j] = (dj_op_call){.op = DJ_OP_MATMUL, .n = sh->n, .out = out[j], .x = x,
                                                   .w = w[r % copies][j], .w_dtype = wt, .w_scale = scale[j],
                                                   .w_block_rows = f8 ? 128 : 0, .w_block_cols = f8 ? 128 : 0,
                                                   .k = sh->k, .m = sh->ms[j], .out_dtype = DJ_DTYPE_BF16};
            if (glu)
                calls[r * per + 2] = (dj_op_call){.op = DJ_OP_SILU_MUL, .n = sh->n, .out = act, .x = out[0],
                                                   .x2 = out[1], .d = sh->ms[0], .out_dtype = DJ_DTYPE_BF16};
        }
        char ms[64];
        int len = snprintf(ms, sizeof ms, "%u", sh->ms[0]);
        for (int j = 1; j < sh->count; j++) len += snprintf(ms + len, sizeof ms - (size_t)len, "+%u", sh->ms[j]);
        const int iters = round_bytes > ((size_t)64 << 20) ? 20 : 100;
        const double t = time_graph(calls, per, GEMV_BENCH_ROUNDS, iters);
        printf("bench gemv %s n=%u k=%u m=%s: %8.2f us %7.1f GB/s of weights  (%s, %d copies)\n", dj_dtype_name(wt),
               sh->n, sh->k, ms, t * 1e6, (double)round_bytes / t / 1e9, sh->what, copies);
        for (int c = 0; c < copies; c++)
            for (int j = 0; j < sh->count; j++) dfree(w[c][j]);
        for (int j = 0; j < sh->count; j++) {
            dfree(out[j]);
            if (scale[j]) dfree(scale[j]);
        }
        if (act) dfree(act);
        dfree(x);
    }
    free(pat);
}

static void bench_attention(uint32_t n, uint32_t ctx, uint32_t nh, uint32_t nkv, uint32_t hd, int iters, float cap) {
    const size_t token = dj_kv_token_bytes(bench_kvt, nkv, hd);
    const uint32_t kvd = nkv * hd, tpp = (uint32_t)(65536 / token); /* 64 KiB pages */
    const uint32_t n_blocks = (ctx + tpp - 1) / tpp;
    const size_t page = 65536;
    uint32_t *table = xmalloc(n_blocks * sizeof *table);
    for (uint32_t i = 0; i < n_blocks; i++) table[i] = n_blocks - 1 - i;
    void *seg = dev_random_kv(n_blocks, tpp, nkv, hd);
    void *q = dev_random_bf16((size_t)n * nh * hd, 1.0f), *out = dalloc((size_t)n * nh * hd * 2);
    dj_kv_view kv = {.seg_base = seg, .page_bytes = page, .block_table = table, .n_blocks = n_blocks,
                     .tokens_per_page = tpp, .kv_dim = kvd, .dtype = bench_kvt, .n_kv_heads = nkv};
    dj_op_call c = {.op = DJ_OP_ATTENTION, .n = n, .out = out, .x = q, .kv = &kv, .pos0 = ctx - n, .n_heads = nh,
                    .n_kv_heads = nkv, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .softcap = cap,
                    .out_dtype = DJ_DTYPE_BF16};
    const double s = time_call(&c, iters);
    static const char *kernels[] = {"-", "decode", "f32 prefill", "tensor cores", "wgmma"};
    const int ran = dj__cuda_last_attention(gpu);
    /* causal: row i sees ctx - n + i + 1 keys; 4 hd FLOPs a key (two GEMMs) */
    const double flops = 4.0 * hd * nh * ((double)n * (ctx - n) + (double)n * (n + 1) / 2);
    printf("bench attention%s n=%u ctx=%u heads=%u:%u hd=%u cap=%g: %9.1f us  %7.1f GB/s of K/V  %6.1f TFLOP/s  (%s)\n",
           bench_kvt == DJ_DTYPE_F8_E4M3 ? " f8" : "", n, ctx, nh, nkv, hd, (double)cap, s * 1e6,
           (double)ctx * token / s / 1e9, flops / s / 1e12, kernels[ran >= 0 && ran <= 4 ? ran : 0]);
    dfree(seg);
    dfree(q);
    dfree(out);
    free(table);
}

/* The sample hook on n rows of V logits, flat (uniform in [-6, 6]) or
 * peaked (N(0, 1)-like plus 8 ids 12 higher), T 0.8, top_p 0.9 and top_k:
 * wall time per call including the staged rows and a sync. Bar (issue 8):
 * 60 us for one row, 150 us for 32, at a 128K vocabulary. pen: 256
 * repetition/frequency penalty entries per row. */
static void bench_sample(uint32_t n, uint32_t V, uint32_t top_k, int peaked, int pen) {
    float *lg = falloc((size_t)n * V);
    for (size_t i = 0; i < (size_t)n * V; i++)
        lg[i] = peaked ? dj_test_randf(-1.f, 1.f) + dj_test_randf(-1.f, 1.f) + dj_test_randf(-1.f, 1.f)
                       : dj_test_randf(-6.0f, 6.0f);
    for (uint32_t r = 0; peaked && r < n; r++)
        for (int k = 0; k < 8; k++) lg[(size_t)r * V + dj_test_rand() % V] += 12.f;
    dj_sample_row *rows = xmalloc(n * sizeof *rows);
    dj_sampler_penalty *pe = xmalloc(256 * sizeof *pe);
    for (uint32_t k = 0; k < 256; k++)
        pe[k] = (dj_sampler_penalty){.id = (int32_t)(k * 37), .sub = 0.1f * (float)(k % 3)};
    for (uint32_t r = 0; r < n; r++)
        rows[r] = (dj_sample_row){.temperature = 0.8f, .top_k = top_k, .top_p = 0.9f,
                                  .repetition_penalty = pen ? 1.1f : 0.f, .n_pen = pen ? 256u : 0u,
                                  .pen = pen ? pe : NULL, .u = dj_test_randf(0.f, 1.f)};
    void *dlg = dcopy(lg, (size_t)n * V * sizeof(float)), *dout = dalloc(n * sizeof(int32_t));
    const int iters = 50;
    double t0 = 0.0;
    for (int i = 0; i <= iters; i++) {
        if (i == 1) t0 = now(); /* the first call warms up */
        if (gpu->vt->sample(gpu, dlg, n, V, rows, dout) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) die("sample");
    }
    const double s = (now() - t0) / iters;
    const double bar = n == 1 ? 60.0 : 150.0;
    printf("bench sample rows=%u vocab=%u %s T=0.8 top_k=%u top_p=0.9%s: %9.1f us per call (bar %.0f us: %s)\n", n, V,
           peaked ? "peaked" : "flat", top_k, pen ? " +256 penalties" : "", s * 1e6, bar,
           s * 1e6 <= bar ? "met" : "MISSED");
    free(pe);
    dfree(dlg);
    dfree(dout);
    free(lg);
    free(rows);
}

/* Decode attention, timed in a graph of
 * 20 calls: n rows at positions ctx-1, ctx-2, .. over one context in 64 KiB
 * pages, either as one sequence (pos0, the block table in device memory)
 * or with per-row positions and tables (row_pos, as the engine's decode
 * step). One line:
 *   bench decode n=<n> ctx=<ctx> heads=<q>:<kv> hd=<hd> <pos0|row_pos>: <us> us <GB/s> GB/s of K/V */
static void bench_decode(uint32_t n, uint32_t ctx, uint32_t nh, uint32_t nkv, uint32_t hd, int rows) {
    enum { ROUNDS = 20 };
    const size_t token = dj_kv_token_bytes(bench_kvt, nkv, hd);
    const uint32_t kvd = nkv * hd, tpp = (uint32_t)(65536 / token);
    const uint32_t n_blocks = (ctx + tpp - 1) / tpp;
    uint32_t *table = xmalloc(n_blocks * sizeof *table), *pos = xmalloc(n * sizeof *pos);
    for (uint32_t i = 0; i < n_blocks; i++) table[i] = n_blocks - 1 - i;
    for (uint32_t r = 0; r < n; r++) pos[r] = ctx - 1 - r;
    void *seg = dev_random_kv(n_blocks, tpp, nkv, hd), *dtable = dcopy(table, n_blocks * sizeof *table);
    void *q = dev_random_bf16((size_t)n * nh * hd, 1.0f), *out = dalloc((size_t)n * nh * hd * 2);
    void *dpos = dcopy(pos, n * sizeof *pos);
    const void **tabs = xmalloc(n * sizeof *tabs);
    for (uint32_t r = 0; r < n; r++) tabs[r] = dtable;
    void *dtabs = dcopy(tabs, n * sizeof *tabs);
    dj_kv_view kv = {.seg_base = seg, .page_bytes = 65536, .block_table = table, .block_table_dev = dtable,
                     .n_blocks = n_blocks, .tokens_per_page = tpp, .kv_dim = kvd, .dtype = bench_kvt,
                     .n_kv_heads = nkv};
    dj_op_call c = {.op = DJ_OP_ATTENTION, .n = n, .out = out, .x = q, .kv = &kv, .pos0 = ctx - n, .n_heads = nh,
                    .n_kv_heads = nkv, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .out_dtype = DJ_DTYPE_BF16};
    if (rows) {
        c.row_pos = dpos;
        c.row_tables = dtabs;
    }
    dj_op_call calls[ROUNDS];
    for (int i = 0; i < ROUNDS; i++) calls[i] = c;
    const double s = time_graph(calls, 1, ROUNDS, 50);
    printf("bench decode%s n=%u ctx=%u heads=%u:%u hd=%u %s: %8.2f us %7.1f GB/s of K/V\n",
           bench_kvt == DJ_DTYPE_F8_E4M3 ? " f8" : "", n, ctx, nh, nkv, hd, rows ? "row_pos" : "pos0", s * 1e6,
           (double)ctx * token / s / 1e9);
    dfree(seg);
    dfree(dtable);
    dfree(q);
    dfree(out);
    dfree(dpos);
    dfree(dtabs);
    free(tabs);
    free(table);
    free(pos);
}

/* A prefill's RoPE of q and k with k's KV_WRITE (one fused launch) over n
 * rows at positions 0..n-1, timed in a graph. One line:
 *   bench rope+kv n=<n> heads=<q>+<kv> hd=<hd>: <us> us <GB/s> GB/s moved */
static void bench_rope_kv(uint32_t n, uint32_t nq, uint32_t nkv, uint32_t hd) {
    enum { ROUNDS = 8 };
    const uint32_t kvd = nkv * hd, tpp = 65536 / (2u * kvd * 2), n_blocks = (n + tpp - 1) / tpp;
    uint32_t *table = xmalloc(n_blocks * sizeof *table);
    for (uint32_t i = 0; i < n_blocks; i++) table[i] = n_blocks - 1 - i;
    void *seg = dalloc((size_t)65536 * n_blocks), *dtable = dcopy(table, n_blocks * sizeof *table);
    float *inv = falloc(hd / 2);
    for (uint32_t j = 0; j < hd / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / hd);
    void *dinv = dcopy(inv, hd / 2 * sizeof(float));
    void *q = dev_random_bf16((size_t)n * nq * hd, 1.0f), *k = dev_random_bf16((size_t)n * kvd, 1.0f);
    void *v = dev_random_bf16((size_t)n * kvd, 1.0f);
    void *qr = dalloc((size_t)n * nq * hd * 2), *kr = dalloc((size_t)n * kvd * 2);
    dj_kv_view kv = {.seg_base = seg, .page_bytes = 65536, .block_table = table, .block_table_dev = dtable,
                     .n_blocks = n_blocks, .tokens_per_page = tpp, .kv_dim = kvd, .dtype = DJ_DTYPE_BF16};
    const dj_op_call step[3] = {
        {.op = DJ_OP_ROPE, .n = n, .out = qr, .x = q, .inv_freq = dinv, .n_heads = nq, .head_dim = hd,
         .scale = 1.0f, .out_dtype = DJ_DTYPE_BF16},
        {.op = DJ_OP_ROPE, .n = n, .out = kr, .x = k, .inv_freq = dinv, .n_heads = nkv, .head_dim = hd,
         .scale = 1.0f, .out_dtype = DJ_DTYPE_BF16},
        {.op = DJ_OP_KV_WRITE, .n = n, .x = kr, .x2 = v, .kv = &kv, .out_dtype = DJ_DTYPE_BF16},
    };
    dj_op_call calls[ROUNDS * 3];
    for (int r = 0; r < ROUNDS; r++) memcpy(&calls[r * 3], step, sizeof step);
    const double s = time_graph(calls, 3, ROUNDS, 20);
    /* q read and written; k read, written and paged; v read and paged */
    const double bytes = (double)n * hd * 2.0 * (2.0 * nq + 5.0 * nkv);
    printf("bench rope+kv n=%u heads=%u+%u hd=%u: %8.2f us %7.1f GB/s moved\n", n, nq, nkv, hd, s * 1e6,
           bytes / s / 1e9);
    dfree(seg), dfree(dtable), dfree(dinv), dfree(q), dfree(k), dfree(v), dfree(qr), dfree(kr);
    free(table), free(inv);
}

/* One decoder layer of the Llama-3-8B shape at one row (context 512, per-row
 * positions and tables as the recorded decode step has them), as one plan
 * per round in a graph: with fusion (the backend's choice) and with it off
 * (every op its own launch, as DJINN_FUSE=off). One line:
 *   bench layer decode b=1 ...: fused <us> us, DJINN_FUSE=off <us> us, ... */
static void bench_layer(void) {
    enum { ROUNDS = 4, D = 4096, F = 14336, NH = 32, NKV = 8, HD = 128, CTX = 512 };
    const uint32_t kvd = NKV * HD, tpp = 65536 / (2u * kvd * 2), n_blocks = (CTX + tpp - 1) / tpp;
    uint32_t *table = xmalloc(n_blocks * sizeof *table), pos = CTX - 1;
    for (uint32_t i = 0; i < n_blocks; i++) table[i] = n_blocks - 1 - i;
    void *seg = dev_random_bf16((size_t)32768 * n_blocks, 1.0f), *dtable = dcopy(table, n_blocks * sizeof *table);
    void *dpos = dcopy(&pos, sizeof pos), *dtabs = dcopy(&dtable, sizeof dtable);
    float inv[HD / 2];
    for (int j = 0; j < HD / 2; j++) inv[j] = (float)pow(500000.0, -2.0 * j / HD);
    void *dinv = dcopy(inv, sizeof inv);
    dj_kv_view kv = {.seg_base = seg, .page_bytes = 65536, .block_table = table, .block_table_dev = dtable,
                     .n_blocks = n_blocks, .tokens_per_page = tpp, .kv_dim = kvd, .dtype = DJ_DTYPE_BF16};
    float *res_h = falloc(D);
    for (int i = 0; i < D; i++) res_h[i] = dj_test_randf(-1.0f, 1.0f);
    void *res = dcopy(res_h, D * sizeof(float)), *h1 = dalloc(D * sizeof(float)), *h2 = dalloc(D * sizeof(float));
    void *prev = dev_random_bf16(D, 1.0f), *nw1 = dev_random_bf16(D, 1.0f), *nw2 = dev_random_bf16(D, 1.0f);
    void *xn = dalloc(D * 2), *q = dalloc(D * 2), *k = dalloc(kvd * 2), *v = dalloc(kvd * 2), *qr = dalloc(D * 2);
    void *kr = dalloc(kvd * 2), *att = dalloc(D * 2), *o = dalloc(D * 2), *xn2 = dalloc(D * 2), *dn = dalloc(D * 2);
    void *gt = dalloc(F * 2), *upo = dalloc(F * 2), *act = dalloc(F * 2);
    void *wq = dev_random_bf16((size_t)D * D, 0.02f), *wk = dev_random_bf16((size_t)kvd * D, 0.02f);
    void *wv = dev_random_bf16((size_t)kvd * D, 0.02f), *wo = dev_random_bf16((size_t)D * D, 0.02f);
    void *wg = dev_random_bf16((size_t)F * D, 0.02f), *wu = dev_random_bf16((size_t)F * D, 0.02f);
    void *wd = dev_random_bf16((size_t)D * F, 0.02f);
    const dj_dtype B = DJ_DTYPE_BF16, R = DJ_DTYPE_F32;
#define MM(O, X, W, K, M) \
    {.op = DJ_OP_MATMUL, .n = 1, .out = O, .x = X, .w = W, .w_dtype = B, .k = K, .m = M, .out_dtype = B}
    const dj_op_call layer[] = {
        {.op = DJ_OP_ADD, .n = 1, .out = h1, .x = res, .x2 = prev, .d = D, .out_dtype = R, .x_dtype = R},
        {.op = DJ_OP_RMSNORM, .n = 1, .out = xn, .x = h1, .w = nw1, .w_dtype = B, .d = D, .eps = 1e-5f,
         .out_dtype = B, .x_dtype = R},
        MM(q, xn, wq, D, D), MM(k, xn, wk, D, kvd), MM(v, xn, wv, D, kvd),
        {.op = DJ_OP_ROPE, .n = 1, .out = qr, .x = q, .inv_freq = dinv, .row_pos = dpos, .n_heads = NH,
         .head_dim = HD, .scale = 1.0f, .out_dtype = B},
        {.op = DJ_OP_ROPE, .n = 1, .out = kr, .x = k, .inv_freq = dinv, .row_pos = dpos, .n_heads = NKV,
         .head_dim = HD, .scale = 1.0f, .out_dtype = B},
        {.op = DJ_OP_KV_WRITE, .n = 1, .x = kr, .x2 = v, .kv = &kv, .row_pos = dpos,
         .row_tables = (const uint32_t *const *)dtabs, .out_dtype = B},
        {.op = DJ_OP_ATTENTION, .n = 1, .out = att, .x = qr, .kv = &kv, .row_pos = dpos,
         .row_tables = (const uint32_t *const *)dtabs, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD,
         .scale = 1.0f / sqrtf((float)HD), .out_dtype = B},
        MM(o, att, wo, D, D),
        {.op = DJ_OP_ADD, .n = 1, .out = h2, .x = h1, .x2 = o, .d = D, .out_dtype = R, .x_dtype = R},
        {.op = DJ_OP_RMSNORM, .n = 1, .out = xn2, .x = h2, .w = nw2, .w_dtype = B, .d = D, .eps = 1e-5f,
         .out_dtype = B, .x_dtype = R},
        MM(gt, xn2, wg, D, F), MM(upo, xn2, wu, D, F),
        {.op = DJ_OP_SILU_MUL, .n = 1, .out = act, .x = gt, .x2 = upo, .d = F, .out_dtype = B},
        MM(dn, act, wd, F, D),
    };
#undef MM
    enum { N_OPS = sizeof layer / sizeof *layer };
    dj_op_call calls[ROUNDS * N_OPS];
    for (int r = 0; r < ROUNDS; r++) memcpy(&calls[r * N_OPS], layer, sizeof layer);
    const uint64_t before = dj__cuda_fusions(gpu);
    const double fused = time_graph(calls, N_OPS, ROUNDS, 50);
    const uint64_t per_round = (dj__cuda_fusions(gpu) - before) / ROUNDS;
    dj__cuda_set_fuse(gpu, 0);
    const double apart = time_graph(calls, N_OPS, ROUNDS, 50);
    dj__cuda_set_fuse(gpu, 1);
    printf("bench layer decode b=1 d=%d f=%d ctx=%d (%d ops, %llu run inside others): fused %7.2f us, "
           "DJINN_FUSE=off %7.2f us, saved %6.2f us a layer (%.3f ms over 32 layers)\n",
           D, F, CTX, (int)N_OPS, (unsigned long long)per_round, fused * 1e6, apart * 1e6, (apart - fused) * 1e6,
           (apart - fused) * 32e3);
    void *bufs[] = {seg, dtable, dpos, dtabs, dinv, res, h1, h2, prev, nw1, nw2, xn, q, k, v, qr, kr, att, o, xn2,
                    dn, gt, upo, act, wq, wk, wv, wo, wg, wu, wd};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dfree(bufs[i]);
    free(res_h);
    free(table);
}

static void bench(void) {
    double copy = 0.0;
    if (dj_cuda_measure_copy(gpu, (size_t)1 << 30, 20, &copy) != DJ_OK) die("measure copy");
    printf("bench copy 1 GiB: %7.1f GB/s (read + written)\n", copy);
    bench_layer();
    bench_gemv(DJ_DTYPE_BF16);
    bench_gemv(DJ_DTYPE_F8_E4M3);
    bench_gemv(DJ_DTYPE_Q4);
    bench_deterministic(4096, 14336);
    bench_deterministic(14336, 4096);
    bench_matmul(1, 4096, 14336, 200);  /* decode: weight bandwidth */
    /* where the GEMV stops paying: the same shape through each path by rows */
    static const uint32_t cross_rows[] = {2, 3, 4, 6, 8, 16};
    for (size_t i = 0; i < sizeof cross_rows / sizeof *cross_rows; i++)
        for (int path = 1; path <= 2; path++) {
            if (path == 1 && cross_rows[i] > 8) continue;
            printf("bench crossover path=%s ", path == 1 ? "gemv" : "cublas");
            dj__cuda_set_paths(gpu, 0, path);
            bench_matmul(cross_rows[i], 4096, 14336, 100);
        }
    dj__cuda_set_paths(gpu, 0, 0);
    bench_matmul(2048, 4096, 4096, 20); /* prefill GEMM */
    bench_rope_kv(2048, 32, 8, 128);
    bench_rope_kv(2048, 16, 8, 256);
    bench_attention(1, 512, 32, 8, 128, 200, 0.0f);
    bench_attention(1, 4096, 32, 8, 128, 200, 0.0f);
    bench_decode(1, 512, 32, 8, 128, 0);
    bench_decode(1, 4096, 32, 8, 128, 0);
    bench_decode(1, 512, 32, 8, 128, 1);
    bench_decode(1, 4096, 32, 8, 128, 1);
    bench_decode(8, 512, 32, 8, 128, 1);
    bench_decode(1, 32768, 32, 8, 128, 1);
    for (int peaked = 0; peaked < 2; peaked++) {
        bench_sample(1, 128256, 0, peaked, 0);
        bench_sample(1, 128256, 40, peaked, 0);
        bench_sample(32, 128256, 0, peaked, 0);
        bench_sample(32, 128256, 40, peaked, 0);
    }
    bench_sample(1, 128256, 40, 0, 1);
    bench_sample(32, 128256, 40, 0, 1);
    bench_attention(512, 512, 32, 8, 128, 10, 0.0f);
    bench_attention(2048, 2048, 32, 8, 128, 10, 0.0f);
    bench_attention(2048, 2048, 32, 8, 64, 10, 0.0f);   /* Llama-3.2-1B: head_dim 64 */
    bench_attention(2048, 2048, 16, 8, 256, 10, 50.0f); /* Gemma-2-9B: head_dim 256, soft-cap */
    bench_attention(2048, 2048, 16, 8, 256, 10, 0.0f);
    dj__cuda_set_paths(gpu, 2, 0); /* the f32 prefill kernel, for comparison */
    bench_attention(512, 512, 32, 8, 128, 10, 0.0f);
    bench_attention(2048, 2048, 32, 8, 128, 3, 0.0f);
    bench_attention(2048, 2048, 16, 8, 256, 3, 50.0f);
    dj__cuda_set_paths(gpu, 0, 0);
    /* the same kernels over f8 K/V pages (--kv-dtype fp8): half the bytes */
    bench_kvt = DJ_DTYPE_F8_E4M3;
    if (dj_backend_set_kv_dtype(gpu, bench_kvt) != DJ_OK) die("kv dtype f8");
    bench_decode(1, 512, 32, 8, 128, 1);
    bench_decode(1, 4096, 32, 8, 128, 1);
    bench_decode(8, 512, 32, 8, 128, 1);
    bench_decode(1, 32768, 32, 8, 128, 1);
    bench_attention(2048, 2048, 32, 8, 128, 10, 0.0f);
    dj__cuda_set_paths(gpu, 2, 0);
    bench_attention(2048, 2048, 32, 8, 128, 3, 0.0f);
    dj__cuda_set_paths(gpu, 0, 0);
    bench_kvt = DJ_DTYPE_BF16;
    if (dj_backend_set_kv_dtype(gpu, bench_kvt) != DJ_OK) die("kv dtype bf16");
}

/* The prefill attention kernels side by side at Llama-3-8B's heads (32:8 of
 * 128, pages of 16): the mma.sync kernel and the wgmma one (--bench-attn). */
static void bench_attention_kernels(void) {
    static const uint32_t shapes[][2] = {{2048, 2048}, {512, 512}, {300, 500}}; /* n, ctx: pos0 = ctx - n */
    static const int paths[] = {3, 4};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        for (size_t p = 0; p < sizeof paths / sizeof *paths; p++) {
            dj__cuda_set_paths(gpu, paths[p], 0);
            printf("path %d: ", paths[p]);
            bench_attention(shapes[i][0], shapes[i][1], 32, 8, 128, 50, 0.0f);
        }
    dj__cuda_set_paths(gpu, 0, 0);
}

/* ---- main ---- */

/* ---- 4-bit weights (DJ_DTYPE_Q4, cuda_q4.cu) ---- */

/* A random Q4 matrix [m][k] in host memory (rows or bands as m gives,
 * djinn/dtype.h): codes and zero points uniform in 0..15, scales in
 * [0.5, 1.5] / (8 sqrt k) (as f16). */
static uint8_t *rand_q4(uint32_t m, uint32_t k) {
    const size_t ng = k / DJ_Q4_GROUP;
    uint8_t *w = xmalloc((size_t)m * dj_dtype_row_bytes(DJ_DTYPE_Q4, k));
    for (uint32_t r = 0; r < m; r++)
        for (size_t g = 0; g < ng; g++) {
            uint8_t *q = w + dj_q4_codes_at(m, k, r, g);
            for (size_t j = 0; j < DJ_Q4_GROUP / 2; j++) q[j] = (uint8_t)(dj_test_rand() & 0xffu);
            const uint16_t s = dj_f32_to_f16(dj_test_randf(0.5f, 1.5f) / (8.0f * sqrtf((float)k)));
            const uint16_t z = dj_f32_to_f16((float)(dj_test_rand() % 16u));
            memcpy(w + dj_q4_scale_at(m, k, r, g), &s, 2);
            memcpy(w + dj_q4_zero_at(m, k, r, g), &z, 2);
        }
    return w;
}

/* path: 0 automatic, 1 GEMV, 2 GEMM (bf16 tiles + cuBLAS); skew: bytes the
 * GPU's weights start into their buffer (a multiple of 4; not 16 takes the
 * 4-byte loads). */
static void check_q4_matmul(uint32_t n, uint32_t k, uint32_t m, int bias, dj_dtype out_t, int path, uint32_t skew) {
    uint16_t *xb = halloc((size_t)n * k);
    float *xf = falloc((size_t)n * k), *ref = falloc((size_t)n * m);
    rand_bf16(xb, xf, (size_t)n * k, -1.0f, 1.0f);
    uint8_t *w = rand_q4(m, k);
    void *b = bias ? rand_weight(DJ_DTYPE_BF16, m, -0.5f, 0.5f) : NULL;
    const size_t osz = (size_t)n * m * dj_dtype_size(out_t), wsz = (size_t)m * dj_dtype_row_bytes(DJ_DTYPE_Q4, k);
    void *dx = dcopy(xb, (size_t)n * k * 2), *dw = dalloc(wsz + skew), *dout = dalloc(osz);
    up((char *)dw + skew, w, wsz);
    void *db = b ? dcopy(b, (size_t)m * 2) : NULL;
    poison(dout, osz);
    dj_op_call cc = {.op = DJ_OP_MATMUL, .n = n, .out = ref, .x = xf, .w = w, .w_dtype = DJ_DTYPE_Q4, .bias = b,
                     .bias_dtype = DJ_DTYPE_BF16, .k = k, .m = m};
    dj_op_call gc = cc;
    gc.out = dout;
    gc.x = dx;
    gc.w = (char *)dw + skew;
    gc.bias = db;
    gc.out_dtype = out_t;
    dj__cuda_set_paths(gpu, 0, path);
    run_both(&cc, &gc, "matmul q4");
    dj__cuda_set_paths(gpu, 0, 0);
    char shape[96];
    snprintf(shape, sizeof shape, "n=%u k=%u m=%u w=q4%s out=%s%s%s", n, k, m, bias ? "+bias" : "",
             dj_dtype_name(out_t), skew ? " skewed" : "", path == 1 ? " [gemv]" : path == 2 ? " [gemm]" : "");
    compare("MATMUL", shape, dout, out_t, ref, (size_t)n * m);
    dfree(dx);
    dfree(dw);
    dfree(dout);
    dfree(db);
    free(xb);
    free(xf);
    free(ref);
    free(w);
    free(b);
}

/* The same weights and x rows at n rows (up to 8: one 8-row tile of x a
 * warp) and at n + 8 (two tiles), both through the automatic path (the
 * tensor-core GEMV up to Q4_MMA_ROWS; a forced GEMV path stops at 8 rows):
 * the first n rows of both bit-equal - each x row is its own MMA column and
 * the k split comes from m alone. */
static void check_q4_rows_agree(uint32_t n, uint32_t k, uint32_t m) {
    const uint32_t nb = n + 8;
    uint16_t *xb = halloc((size_t)nb * k);
    float *xf = falloc((size_t)nb * k);
    rand_bf16(xb, xf, (size_t)nb * k, -1.0f, 1.0f);
    uint8_t *w = rand_q4(m, k);
    void *dx = dcopy(xb, (size_t)nb * k * 2), *dw = dcopy(w, (size_t)m * dj_dtype_row_bytes(DJ_DTYPE_Q4, k));
    void *o1 = dalloc((size_t)n * m * 2), *o2 = dalloc((size_t)nb * m * 2);
    poison(o1, (size_t)n * m * 2);
    poison(o2, (size_t)nb * m * 2);
    dj_op_call c = {.op = DJ_OP_MATMUL, .n = n, .out = o1, .x = dx, .w = dw, .w_dtype = DJ_DTYPE_Q4, .k = k,
                    .m = m, .out_dtype = DJ_DTYPE_BF16};
    if (dj_backend_compute(gpu, &c) != DJ_OK) die("q4 rows (n)");
    c.n = nb;
    c.out = o2;
    if (dj_backend_compute(gpu, &c) != DJ_OK) die("q4 rows (n + 8)");
    if (gpu->vt->sync(gpu) != DJ_OK) die("q4 rows sync");
    uint16_t *h1 = halloc((size_t)n * m), *h2 = halloc((size_t)nb * m);
    down(h1, o1, (size_t)n * m * 2);
    down(h2, o2, (size_t)nb * m * 2);
    size_t nan = 0, differ = 0;
    for (size_t i = 0; i < (size_t)n * m; i++) {
        nan += h1[i] == 0xffffu;
        differ += h1[i] != h2[i];
    }
    const int same = differ == 0 && nan == 0;
    n_rows++;
    n_fail += !same;
    char shape[96];
    snprintf(shape, sizeof shape, "  n=%u and %u k=%u m=%u q4: the same bits", n, nb, k, m);
    printf("%-10s %-52s %10s  %s\n", "MATMUL", shape, "-", same ? "pass" : "FAIL");
    if (!same) printf("           %zu of %zu outputs differ, %zu NaN\n", differ, (size_t)n * m, nan);
    dfree(dx), dfree(dw), dfree(o1), dfree(o2);
    free(xb), free(xf), free(w), free(h1), free(h2);
}

/* q, k, v-shaped 4-bit matmuls of m0, m1, m2 rows on one x in one plan (one
 * grouped GEMV launch where all three are banded or none is, else a launch a
 * call). */
static void check_q4_group(uint32_t n, uint32_t k, uint32_t m0, uint32_t m1, uint32_t m2) {
    const uint32_t ms[3] = {m0, m1, m2};
    uint16_t *xb = halloc((size_t)n * k);
    float *xf = falloc((size_t)n * k);
    rand_bf16(xb, xf, (size_t)n * k, -1.0f, 1.0f);
    void *dx = dcopy(xb, (size_t)n * k * 2);
    uint8_t *w[3];
    void *dw[3], *dout[3];
    float *ref[3];
    dj_op_call cc[3], gc[3];
    for (int i = 0; i < 3; i++) {
        const size_t wsz = (size_t)ms[i] * dj_dtype_row_bytes(DJ_DTYPE_Q4, k);
        w[i] = rand_q4(ms[i], k);
        dw[i] = dcopy(w[i], wsz);
        dout[i] = dalloc((size_t)n * ms[i] * 2);
        poison(dout[i], (size_t)n * ms[i] * 2);
        ref[i] = falloc((size_t)n * ms[i]);
        cc[i] = (dj_op_call){.op = DJ_OP_MATMUL, .n = n, .out = ref[i], .x = xf, .w = w[i],
                             .w_dtype = DJ_DTYPE_Q4, .k = k, .m = ms[i]};
        gc[i] = cc[i];
        gc[i].out = dout[i];
        gc[i].x = dx;
        gc[i].w = dw[i];
        gc[i].out_dtype = DJ_DTYPE_BF16;
        if (dj_backend_compute(cpu, &cc[i]) != DJ_OK) die("q4 group (cpu)");
    }
    if (dj_backend_compute_plan(gpu, gc, 3, NULL) != DJ_OK) die("q4 group (gpu)");
    if (gpu->vt->sync(gpu) != DJ_OK) die("q4 group sync");
    for (int i = 0; i < 3; i++) {
        char shape[96];
        snprintf(shape, sizeof shape, "grouped %d/3: n=%u k=%u m=%u q4", i + 1, n, k, ms[i]);
        compare("MATMUL", shape, dout[i], DJ_DTYPE_BF16, ref[i], (size_t)n * ms[i]);
        dfree(dw[i]);
        dfree(dout[i]);
        free(w[i]);
        free(ref[i]);
    }
    dfree(dx);
    free(xb);
    free(xf);
}

/* The 4-bit GEMV (rows 1..8; 16-byte rows at k % 512 == 0, 4-byte loads
 * otherwise and when skewed), the tiled GEMM (several tiles, a partial last
 * one, bias, f32 logits), the automatic choice, and grouped calls. */
/* gate and up (GEMVs of one x: bf16, FP8 128x128 blocks or 4-bit weights)
 * and their SILU_MUL or GELU_MUL through compute_plan: the CUDA backend runs
 * the three as one kernel where the 4-bit GEMV takes the rows. Every output
 * against the CPU, the fused ones bit-equal to the unfused launches (the
 * GEMV group, then the GLU), the fusion counter up by 1 exactly when fused. */
static void check_gemv_glu(uint32_t n, uint32_t k, uint32_t m, dj_dtype wt, dj_op op, int bias, int fused_want) {
    uint16_t *xb = halloc((size_t)n * k);
    float *xf = falloc((size_t)n * k), *ref[3];
    for (int i = 0; i < 3; i++) ref[i] = falloc((size_t)n * m);
    rand_bf16(xb, xf, (size_t)n * k, -1.0f, 1.0f);
    void *w[2];
    size_t wsz = 0;
    float *scale[2] = {NULL, NULL};
    const uint32_t sr = (m + 127) / 128, sc = (k + 127) / 128;
    for (int i = 0; i < 2; i++) {
        if (wt == DJ_DTYPE_Q4) {
            w[i] = rand_q4(m, k);
            wsz = (size_t)m * dj_dtype_row_bytes(DJ_DTYPE_Q4, k);
        } else if (wt == DJ_DTYPE_F8_E4M3) {
            uint8_t *c = xmalloc((size_t)m * k);
            rand_f8_codes(c, (size_t)m * k);
            w[i] = c;
            wsz = (size_t)m * k;
            scale[i] = falloc((size_t)sr * sc);
            rand_f8_scales(scale[i], (size_t)sr * sc, k);
        } else {
            w[i] = rand_weight(wt, (size_t)m * k, -1.0f / sqrtf((float)k), 1.0f / sqrtf((float)k));
            wsz = (size_t)m * k * dj_dtype_size(wt);
        }
    }
    void *b = bias ? rand_weight(DJ_DTYPE_BF16, m, -0.5f, 0.5f) : NULL;
    const size_t ob = (size_t)n * m * 2;
    dj_op_call cc[3] = {{.op = DJ_OP_MATMUL, .n = n, .out = ref[0], .x = xf, .w = w[0], .w_dtype = wt,
                         .w_scale = scale[0], .w_block_rows = 128, .w_block_cols = 128, .bias = b,
                         .bias_dtype = DJ_DTYPE_BF16, .k = k, .m = m},
                        {.op = DJ_OP_MATMUL, .n = n, .out = ref[1], .x = xf, .w = w[1], .w_dtype = wt,
                         .w_scale = scale[1], .w_block_rows = 128, .w_block_cols = 128, .k = k, .m = m},
                        {.op = op, .n = n, .out = ref[2], .x = ref[0], .x2 = ref[1], .d = m}};
    if (wt != DJ_DTYPE_F8_E4M3)
        for (int i = 0; i < 2; i++) cc[i].w_block_rows = cc[i].w_block_cols = 0;
    if (dj_backend_compute_plan(cpu, cc, 3, NULL) != DJ_OK) die("gemv glu (cpu)");
    void *dx = dcopy(xb, (size_t)n * k * 2), *dw[2] = {dalloc(wsz), dalloc(wsz)};
    void *ds[2] = {scale[0] ? dcopy(scale[0], (size_t)sr * sc * 4) : NULL,
                   scale[1] ? dcopy(scale[1], (size_t)sr * sc * 4) : NULL};
    void *db = b ? dcopy(b, (size_t)m * 2) : NULL;
    up(dw[0], w[0], wsz);
    up(dw[1], w[1], wsz);
    void *outs[2][3];
    for (int pass = 0; pass < 2; pass++) {
        dj_op_call gc[3] = {cc[0], cc[1], cc[2]};
        for (int i = 0; i < 3; i++) {
            outs[pass][i] = dalloc(ob);
            poison(outs[pass][i], ob);
            gc[i].out = outs[pass][i];
            gc[i].out_dtype = DJ_DTYPE_BF16;
        }
        for (int i = 0; i < 2; i++) gc[i].x = dx, gc[i].w = dw[i], gc[i].w_scale = ds[i];
        gc[0].bias = db;
        gc[2].x = outs[pass][0], gc[2].x2 = outs[pass][1];
        /* pass 1 as the backend runs them unfused: gate and up as one GEMV group (the 4-bit
         * GEMV's split of the columns depends on the group's rows), then the GLU alone */
        const uint64_t before = dj__cuda_fusions(gpu);
        if ((pass == 0 ? dj_backend_compute_plan(gpu, gc, 3, NULL)
                       : (dj_backend_compute_plan(gpu, gc, 2, NULL) != DJ_OK
                              ? DJ_EINTERNAL
                              : dj_backend_compute_plan(gpu, &gc[2], 1, NULL))) != DJ_OK ||
            gpu->vt->sync(gpu) != DJ_OK)
            die("gemv glu (gpu)");
        const uint64_t fused = dj__cuda_fusions(gpu) - before, want = pass == 0 && fused_want;
        if (fused != want) {
            n_rows++;
            n_fail++;
            printf("%-10s %-52s %10s  FAIL (%llu fused, expected %llu)\n", "GEMV+GLU", "fusion count", "-",
                   (unsigned long long)fused, (unsigned long long)want);
        }
    }
    static const char *what[3] = {"gate", "up", "glu"};
    uint8_t *h0 = xmalloc(ob), *h1 = xmalloc(ob);
    size_t differ = 0;
    char shape[96];
    for (int i = 0; i < 3; i++) {
        snprintf(shape, sizeof shape, "n=%u k=%u m=%u w=%s %s%s: %s", n, k, m, dj_dtype_name(wt),
                 op == DJ_OP_SILU_MUL ? "silu" : "gelu", bias ? " +bias" : "", what[i]);
        compare("GEMV+GLU", shape, outs[0][i], DJ_DTYPE_BF16, ref[i], (size_t)n * m);
        down(h0, outs[0][i], ob);
        down(h1, outs[1][i], ob);
        differ += memcmp(h0, h1, ob) != 0;
    }
    n_rows++;
    n_fail += differ != 0;
    snprintf(shape, sizeof shape, "n=%u k=%u m=%u w=%s: fused = apart", n, k, m, dj_dtype_name(wt));
    printf("%-10s %-52s %10zu  %s\n", "GEMV+GLU", shape, differ, differ ? "FAIL" : "pass");
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < 3; i++) dfree(outs[pass][i]);
    dfree(dx);
    for (int i = 0; i < 2; i++) {
        dfree(dw[i]);
        dfree(ds[i]);
        free(w[i]);
        free(scale[i]);
    }
    dfree(db);
    free(h0);
    free(h1);
    free(xb);
    free(xf);
    for (int i = 0; i < 3; i++) free(ref[i]);
    free(b);
}

/* m % 16 == 0 takes the banded layout (djinn/dtype.h), other m the rows: both
 * through the GEMV (16-byte and 4-byte loads, 1, 2 and 4 x tiles, every KS),
 * the GLU-fused GEMV, the tiled GEMM's dequantization and grouped calls. */
static void check_q4(void) {
    for (uint32_t n = 1; n <= 8; n++) check_q4_matmul(n, 512, 37 + 8 * n, n % 3 == 0, DJ_DTYPE_BF16, 1, 0);
    for (uint32_t n = 1; n <= 8; n += 3) check_q4_matmul(n, 512, 32 + 16 * n, n % 2, DJ_DTYPE_BF16, 1, 0); /* bands */
    check_q4_matmul(1, 384, 96, 1, DJ_DTYPE_BF16, 1, 0);      /* bands of 204-byte rows: 16-byte loads */
    check_q4_matmul(3, 4096, 336, 1, DJ_DTYPE_BF16, 1, 4);    /* bands, skewed: 4-byte loads */
    check_q4_matmul(2, 384, 160, 0, DJ_DTYPE_F32, 1, 12);     /* bands, skewed */
    check_q4_matmul(1, 4096, 5008, 0, DJ_DTYPE_F32, 1, 0);    /* banded logits */
    check_q4_matmul(12, 1024, 1024, 1, DJ_DTYPE_BF16, 0, 0);  /* bands, 2 x tiles */
    check_q4_matmul(33, 384, 80, 1, DJ_DTYPE_F32, 2, 4);      /* bands through the GEMM, skewed */
    check_q4_matmul(1, 4096, 1000, 0, DJ_DTYPE_BF16, 1, 0);
    check_q4_matmul(1, 14336, 257, 1, DJ_DTYPE_BF16, 1, 0);
    check_q4_matmul(1, 384, 100, 0, DJ_DTYPE_BF16, 1, 0);     /* rows of 204 bytes: 4-byte loads */
    check_q4_matmul(3, 4096, 333, 1, DJ_DTYPE_BF16, 1, 4);    /* skewed: 4-byte loads */
    check_q4_matmul(1, 4096, 5003, 0, DJ_DTYPE_F32, 1, 0);    /* logits */
    check_q4_matmul(8, 1024, 1000, 1, DJ_DTYPE_F32, 1, 0);
    /* enough rows for 4 rows a warp (cuda_q4.cu launch_rw); 9001: a last warp with one row */
    check_q4_matmul(1, 4096, 14336, 0, DJ_DTYPE_BF16, 1, 0);
    check_q4_matmul(3, 1024, 9001, 1, DJ_DTYPE_BF16, 1, 0);
    check_q4_matmul(8, 512, 9001, 0, DJ_DTYPE_F32, 1, 0);
    check_q4_matmul(2, 384, 9001, 1, DJ_DTYPE_BF16, 1, 0); /* 4-byte loads, 4 rows a warp */
    check_q4_matmul(9, 4096, 1000, 0, DJ_DTYPE_BF16, 2, 0);   /* one tile */
    check_q4_matmul(37, 4096, 5000, 1, DJ_DTYPE_BF16, 2, 0);  /* tiles of 2048 rows, a partial one */
    check_q4_matmul(64, 14336, 1200, 0, DJ_DTYPE_BF16, 2, 0); /* tiles of 576 rows */
    check_q4_matmul(33, 384, 77, 1, DJ_DTYPE_F32, 2, 4);      /* skewed, f32 out */
    check_q4_matmul(300, 2048, 512, 0, DJ_DTYPE_BF16, 0, 0);  /* automatic: GEMM */
    check_q4_matmul(2, 2048, 512, 1, DJ_DTYPE_BF16, 0, 0);    /* automatic: GEMV */
    /* automatic, 9..32 rows: the tensor-core GEMV's 2 and 4 column tiles */
    check_q4_matmul(9, 4096, 1000, 1, DJ_DTYPE_BF16, 0, 0);
    check_q4_matmul(16, 512, 77, 0, DJ_DTYPE_F32, 0, 0);
    check_q4_matmul(23, 14336, 300, 1, DJ_DTYPE_BF16, 0, 0);
    check_q4_matmul(32, 4096, 14336, 0, DJ_DTYPE_BF16, 0, 0);
    check_q4_matmul(32, 384, 100, 0, DJ_DTYPE_BF16, 0, 0); /* 4-byte rows: tiles */
    /* rows, k, m, weights, GLU, bias, fused */
    check_gemv_glu(1, 4096, 14336, DJ_DTYPE_Q4, DJ_OP_SILU_MUL, 0, 1); /* the 8B shape's gate/up at decode */
    check_gemv_glu(3, 512, 1000, DJ_DTYPE_Q4, DJ_OP_GELU_MUL, 1, 1);   /* rows past the last full tile, a bias */
    check_gemv_glu(20, 384, 77, DJ_DTYPE_Q4, DJ_OP_SILU_MUL, 0, 1);    /* 4-byte loads, 4 column tiles */
    check_gemv_glu(40, 512, 256, DJ_DTYPE_Q4, DJ_OP_SILU_MUL, 0, 0);   /* past 32 rows: launched apart */
    check_gemv_glu(3, 512, 1008, DJ_DTYPE_Q4, DJ_OP_GELU_MUL, 1, 1);   /* bands: tiles at both halves of one */
    check_gemv_glu(12, 1024, 512, DJ_DTYPE_Q4, DJ_OP_SILU_MUL, 1, 1);  /* bands, 2 x tiles */
    check_gemv_glu(20, 384, 80, DJ_DTYPE_Q4, DJ_OP_SILU_MUL, 0, 1);    /* bands of 204-byte rows: 16-byte loads */
    /* bf16 and FP8 GEMVs (a warp a row) are not fused with their GLU: taking gate and up rows in
     * one warp measured no faster for bf16 and slower for FP8 (bench/RESULTS.md, 2026-11-26; FP8 again
     * 2026-11-27, a warp taking gate's row and then up's) */
    check_gemv_glu(1, 4096, 14336, DJ_DTYPE_BF16, DJ_OP_SILU_MUL, 0, 0);
    check_gemv_glu(5, 1024, 1000, DJ_DTYPE_F8_E4M3, DJ_OP_GELU_MUL, 1, 0);
    check_q4_group(1, 4096, 4096, 1024, 1024); /* bands: one launch */
    check_q4_group(5, 512, 520, 136, 168);     /* rows: one launch */
    check_q4_group(1, 4096, 4096, 1024, 1032); /* bands and rows: a launch a call */
    check_q4_group(5, 512, 512, 128, 136);
    /* k split over 2 and 1 warps a tile (q4_ks on the H100's 132 SMs: m of 10,000 and 40,000 rows;
     * 4 warps: the 5,008 rows above), bands and rows */
    check_q4_matmul(2, 512, 10000, 1, DJ_DTYPE_BF16, 1, 0);
    check_q4_matmul(1, 1024, 40000, 0, DJ_DTYPE_F32, 1, 0);
    check_q4_matmul(2, 512, 10008, 1, DJ_DTYPE_BF16, 1, 0);
    check_q4_matmul(1, 1024, 40008, 0, DJ_DTYPE_F32, 1, 0);
    check_q4_rows_agree(1, 4096, 4096);
    check_q4_rows_agree(8, 14336, 4096);
    check_q4_rows_agree(3, 512, 14336);
    check_q4_rows_agree(9, 4096, 1000); /* two x tiles against four */
}

int main(int argc, char **argv) {
    int do_bench = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bench") == 0) {
            do_bench = 1;
        } else if (strcmp(argv[i], "--bench-only") == 0) { /* the timings alone (a profiler's run) */
            do_bench = 2;
        } else if (strcmp(argv[i], "--bench-attn") == 0) { /* the prefill attention kernels alone */
            do_bench = 3;
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            device = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: gpu_check [--device N] [--bench | --bench-only | --bench-attn]\n");
            return 2;
        }
    }
    const int count = dj_cuda_device_count();
    if (count == 0) {
        fprintf(stderr, "gpu_check: no CUDA device\n");
        return 2;
    }
    char name[256];
    if (dj_cuda_device_name(device, name, sizeof name) != DJ_OK) die("device name");
    printf("device %d of %d: %s\n", device, count, name);
    dj_test_seed();
    if (dj_backend_cpu_new(0, &cpu) != DJ_OK) die("cpu backend");
    if (dj_backend_cuda_new(device, &gpu) != DJ_OK) die("cuda backend");

    if (do_bench == 3) {
        bench_attention_kernels();
        dj_backend_free(gpu);
        dj_backend_free(cpu);
        return 0;
    }
    if (do_bench == 2) {
        bench();
        dj_backend_free(gpu);
        dj_backend_free(cpu);
        return 0;
    }
    printf("%-10s %-52s %10s  %s\n", "op", "shape", "error", "result");
    static const dj_dtype fts[] = {DJ_DTYPE_BF16, DJ_DTYPE_F16, DJ_DTYPE_F32};
    /* residual-stream ops in both of its dtypes (f32 is what the engine uses) */
    for (int t = 0; t < 3; t++) check_embed(37, 333, 1001, fts[t], DJ_DTYPE_BF16);
    for (int t = 0; t < 3; t++) check_embed(37, 333, 1001, fts[t], DJ_DTYPE_F32);
    check_embed(1, 4096, 32000, DJ_DTYPE_BF16, DJ_DTYPE_F32);
    for (int t = 0; t < 3; t++) check_rmsnorm(37, 4096, fts[t], DJ_DTYPE_BF16);
    for (int t = 0; t < 3; t++) check_rmsnorm(37, 4096, fts[t], DJ_DTYPE_F32);
    check_rmsnorm(1, 37, DJ_DTYPE_BF16, DJ_DTYPE_BF16);
    check_rmsnorm(5, 5120, DJ_DTYPE_F32, DJ_DTYPE_F32);

    check_matmul(1, 4096, 1000, DJ_DTYPE_BF16, 0, DJ_DTYPE_BF16, 0);
    check_matmul(1, 37, 65, DJ_DTYPE_BF16, 0, DJ_DTYPE_BF16, 0);
    check_matmul(3, 200, 129, DJ_DTYPE_F16, 0, DJ_DTYPE_BF16, 0);
    check_matmul(8, 256, 77, DJ_DTYPE_F32, 1, DJ_DTYPE_BF16, 0);
    check_matmul(5, 512, 300, DJ_DTYPE_BF16, 1, DJ_DTYPE_BF16, 0);
    check_matmul(37, 1000, 333, DJ_DTYPE_BF16, 0, DJ_DTYPE_BF16, 0);
    check_matmul(37, 256, 130, DJ_DTYPE_F16, 0, DJ_DTYPE_BF16, 0);
    check_matmul(37, 96, 77, DJ_DTYPE_F32, 1, DJ_DTYPE_BF16, 0);
    check_matmul(64, 2048, 512, DJ_DTYPE_BF16, 1, DJ_DTYPE_BF16, 0);
    check_matmul(1, 1024, 5003, DJ_DTYPE_BF16, 0, DJ_DTYPE_F32, 0);
    check_matmul(1, 1024, 5003, DJ_DTYPE_F16, 0, DJ_DTYPE_F32, 0);
    check_matmul(37, 512, 300, DJ_DTYPE_BF16, 1, DJ_DTYPE_F32, 0);
    check_matmul(37, 512, 300, DJ_DTYPE_F32, 0, DJ_DTYPE_F32, 0);
    check_matmul(1, 4096, 1000, DJ_DTYPE_BF16, 0, DJ_DTYPE_BF16, 2);
    check_matmul(3, 4096, 1000, DJ_DTYPE_F16, 1, DJ_DTYPE_BF16, 2);
    check_matmul(8, 4096, 1000, DJ_DTYPE_BF16, 1, DJ_DTYPE_F32, 1);

    check_rope(1, 32, 128, 4095, 10000.0f, 1.0f, 0);
    check_rope(37, 8, 64, 0, 10000.0f, 1.0f, 1);
    check_rope(37, 2, 128, 100000, 500000.0f, 1.3f, 0);
    check_rope(3, 5, 80, 7, 10000.0f, 1.0f, 1);

    check_elementwise(DJ_OP_SILU_MUL, 1, 14336, DJ_DTYPE_BF16, DJ_DTYPE_BF16);
    check_elementwise(DJ_OP_SILU_MUL, 37, 333, DJ_DTYPE_BF16, DJ_DTYPE_BF16); /* odd count: one a thread */
    check_elementwise(DJ_OP_SILU_MUL, 64, 14336, DJ_DTYPE_BF16, DJ_DTYPE_BF16);
    check_elementwise(DJ_OP_ADD, 1, 4096, DJ_DTYPE_BF16, DJ_DTYPE_BF16);
    check_elementwise(DJ_OP_ADD, 37, 1001, DJ_DTYPE_BF16, DJ_DTYPE_BF16);
    check_elementwise(DJ_OP_ADD, 1, 4096, DJ_DTYPE_F32, DJ_DTYPE_F32);
    check_elementwise(DJ_OP_ADD, 37, 1001, DJ_DTYPE_F32, DJ_DTYPE_F32);
    check_elementwise(DJ_OP_ADD, 3, 999, DJ_DTYPE_BF16, DJ_DTYPE_F32);
    check_elementwise(DJ_OP_ADD, 3, 999, DJ_DTYPE_F32, DJ_DTYPE_BF16);
    /* rows, width, norm weight dtype, mode (see check_add_rmsnorm), residual dtype */
    for (int r = 0; r < 2; r++) {
        const dj_dtype rt = r == 0 ? DJ_DTYPE_BF16 : DJ_DTYPE_F32;
        check_add_rmsnorm(1, 4096, DJ_DTYPE_BF16, 0, rt);
        check_add_rmsnorm(37, 1001, DJ_DTYPE_F32, 0, rt);
        check_add_rmsnorm(5, 4096, DJ_DTYPE_F16, 1, rt);
        check_add_rmsnorm(3, 333, DJ_DTYPE_BF16, 2, rt);
        check_add_rmsnorm(2048, 4096, DJ_DTYPE_BF16, 3, rt);
        check_add_rmsnorm(4, 5120, DJ_DTYPE_BF16, 1, rt);
        check_add_rmsnorm(3, 12000, DJ_DTYPE_F32, 0, rt);
        check_add_rmsnorm(2, 20000, DJ_DTYPE_BF16, 0, rt); /* wider than the fused kernel takes: launched apart */
    }

    /* rows, pos0, kv heads, head_dim, tokens per page, in place, fused, q heads, row tables */
    check_rope_kv_write(1, 700, 8, 128, 16, 0, 1, 0, 0);
    check_rope_kv_write(37, 5, 2, 64, 7, 1, 1, 0, 0);
    check_rope_kv_write(300, 0, 8, 128, 16, 0, 1, 0, 0);
    check_rope_kv_write(3, 40, 4, 80, 5, 0, 0, 0, 0);
    check_rope_kv_write(1, 700, 8, 128, 16, 0, 1, 32, 0);
    check_rope_kv_write(37, 5, 2, 64, 7, 1, 1, 8, 0);
    check_rope_kv_write(300, 0, 8, 128, 16, 1, 1, 32, 0);
    check_rope_kv_write(3, 40, 4, 80, 5, 0, 0, 12, 0);
    check_rope_kv_write(700, 9, 8, 128, 16, 0, 1, 33, 0); /* >= 2^20 pairs: 8 heads a thread, the last group short */
    check_rope_kv_write(500, 0, 8, 256, 7, 1, 1, 17, 0);
    check_rope_kv_write(9, 4090, 8, 96, 16, 0, 1, 32, 1); /* longrope: a batch with both tables, fused with q */
    check_rope_kv_write(700, 9, 8, 128, 16, 1, 1, 33, 1); /* 8 heads a thread */
    check_rope_kv_write(5, 7, 4, 96, 5, 0, 0, 12, 1);     /* unfused */
    /* Qwen3's per-head q/k norms with the RoPEs and the KV_WRITE: decode rows, a prefill's, Gemma 3's (1 + w) */
    check_norm_rope_kv_write(1, 700, 8, 32, 128, 16, DJ_DTYPE_BF16, 0.0f, 0, 0);
    check_norm_rope_kv_write(4, 33, 8, 32, 128, 16, DJ_DTYPE_BF16, 0.0f, 1, 1);
    check_norm_rope_kv_write(420, 0, 8, 32, 128, 16, DJ_DTYPE_F32, 0.0f, 0, 0); /* 8 heads a warp */
    check_norm_rope_kv_write(37, 5, 4, 8, 256, 7, DJ_DTYPE_BF16, 1.0f, 0, 0);
    check_norm_rope_kv_write(9, 60, 2, 6, 64, 5, DJ_DTYPE_F16, 1.0f, 1, 1);
    /* n, pos0, heads, kv heads, head_dim, tokens per page, window */
    check_attention(1, 4095, 32, 8, 128, 16, 0);   /* decode, long context, GQA 4:1 */
    check_attention(1, 1000, 8, 1, 64, 7, 0);      /* MQA, odd page size */
    check_attention(3, 37, 8, 2, 64, 16, 0);       /* GQA 8:2, a few rows */
    check_attention(1, 2000, 8, 2, 128, 16, 256);  /* sliding window */
    check_attention(37, 0, 8, 2, 128, 16, 0);      /* prefill from empty */
    check_attention(37, 100, 8, 2, 64, 5, 50);     /* prefill after context, window */
    check_attention(64, 5, 4, 1, 128, 32, 0);      /* MQA prefill */
    check_attention(37, 10, 4, 2, 256, 8, 0);      /* head_dim 256 */
    check_attention(1, 300, 4, 2, 256, 8, 0);
    check_attention(5, 40, 4, 4, 80, 16, 0);       /* head_dim 80: partial lanes */
    check_attention(200, 300, 8, 2, 128, 16, 0);   /* longer prefill chunk */
    /* tensor-core prefill: tiles of 64 rows and 64 positions against odd
     * lengths, pages of any size in shuffled order, windows inside a tile */
    check_attention(512, 0, 32, 8, 128, 16, 0);    /* Llama-3 shape, whole tiles */
    check_attention(333, 0, 32, 8, 128, 16, 0);    /* GQA 32:8, odd length */
    check_attention(129, 71, 8, 2, 64, 7, 0);      /* GQA 8:2, odd pages, after context */
    check_attention(8, 1000, 8, 2, 128, 16, 0);    /* fewest rows on the prefill side, long context */
    check_attention(65, 3, 4, 1, 64, 32, 0);       /* MQA */
    check_attention(1100, 30, 32, 8, 128, 16, 0);  /* enough row blocks for two strips a warp */
    check_attention(1100, 0, 32, 8, 128, 16, 300); /* ... with a window */
    check_attention(1100, 7, 32, 8, 64, 16, 0);    /* ... head_dim 64 */
    check_attention(300, 200, 8, 2, 128, 16, 37);  /* sliding window shorter than a tile */
    check_attention(257, 0, 8, 2, 64, 5, 100);     /* window from empty */
    check_attention(100, 60, 4, 4, 128, 64, 1);    /* window 1: each row sees itself */
    /* the wgmma kernel (head_dim 128, bf16 pages of a power of two from 8) */
    check_attention(2048, 0, 32, 8, 128, 16, 0);   /* Llama-3-8B prefill */
    check_attention(1000, 0, 32, 8, 128, 16, 0);   /* a partial last block */
    check_attention(77, 0, 8, 2, 128, 16, 0);      /* one block, its second warpgroup past n */
    check_attention(129, 0, 8, 2, 128, 16, 0);     /* one row in the last block */
    check_attention(300, 200, 32, 8, 128, 16, 0);  /* after a prefix not a multiple of the tile */
    check_attention(1000, 1500, 8, 2, 128, 16, 0); /* a long prefix */
    check_attention(500, 700, 8, 2, 128, 16, 200); /* window, tiles before it skipped */
    check_attention(200, 77, 8, 2, 128, 8, 0);     /* pages of 8: 16 boxes a tile */
    check_attention(150, 300, 8, 1, 128, 256, 0);  /* pages of 256: a box is part of a page; MQA */
    check_attention(130, 70, 8, 4, 128, 32, 0);    /* pages of 32 */
    check_attention(129, 71, 8, 2, 128, 7, 0);     /* pages of 7: the mma.sync kernel */
    check_errors();
    check_arch_ops();

    /* rows, heads, kv heads, head_dim, tokens per page, window, recorded */
    check_rows(1, 32, 8, 128, 16, 0, 0);
    check_rows(5, 8, 2, 64, 7, 0, 0);
    check_rows(32, 32, 8, 128, 16, 0, 0);
    check_rows(3, 8, 2, 128, 16, 100, 0);
    check_rows(1, 32, 8, 128, 16, 0, 1);
    check_rows(32, 32, 8, 128, 16, 0, 1);
    check_matmul_group(1, 1024, DJ_DTYPE_BF16);
    check_matmul_group(5, 512, DJ_DTYPE_F16);
    check_gemv();
    check_fp8();
    check_q4();
    check_decode();
    check_kv_f8();
    check_embed_dev(7, 4096, 1000);
    check_argmax(1, 128256);
    check_argmax(33, 32000);
    check_argmax(3, 20);     /* fewer entries than the first pass's parts: empty parts */
    check_argmax(2, 100003); /* a last part shorter than the others */
    check_sample_cases();
    check_deterministic(4096, 14336, DJ_DTYPE_BF16, DJ_DTYPE_BF16);
    check_deterministic(4096, 128256, DJ_DTYPE_F32, DJ_DTYPE_BF16);
    /* FP8 rows, a row over one warp (k under 2,048) and over two (f8_split) */
    check_deterministic(1024, 6144, DJ_DTYPE_BF16, DJ_DTYPE_F8_E4M3);
    check_deterministic(14336, 4096, DJ_DTYPE_BF16, DJ_DTYPE_F8_E4M3);
    check_sample(40, 7, 0);
    check_sample(40, 1000, 0);
    check_sample(8, 128256, 0);
    check_sample(40, 1000, 1);
    check_sample(8, 128256, 1);
    check_sample(33, 128256, 1);
    check_mask(8, 1000);
    check_mask(33, 128256);
    check_sample_small_k(70, 4096);
    check_sample_small_k(35, 128256);
    check_sample_splits();
    check_capture_errors();

    printf("%d checks, %d failed\n", n_rows, n_fail);
    if (do_bench) bench();
    dj_backend_free(gpu);
    dj_backend_free(cpu);
    return n_fail ? 1 : 0;
}
