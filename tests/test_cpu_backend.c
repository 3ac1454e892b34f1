/* test_cpu_backend.c: every CPU op against a naive double-precision reference
 * on fresh random inputs (NaN-poisoned outputs), plus error returns and timing. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_impl.h"
#include "djinn/backend.h"
#include "testutil.h"

/* Huge allocation requests must come back as NULL under ASan, as in glibc. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static dj_backend_t *be;

static float *falloc(size_t count) {
    float *p = malloc(count * sizeof(float) + 1);
    if (!p) abort();
    return p;
}

static void fill(float *x, size_t count, float lo, float hi) {
    for (size_t i = 0; i < count; i++) x[i] = dj_test_randf(lo, hi);
}

static void poison(float *x, size_t count) {
    for (size_t i = 0; i < count; i++) x[i] = NAN;
}

/* max |a - ref| (NaN: infinite). */
static double max_err(const float *a, const double *ref, size_t count) {
    double e = 0.0;
    for (size_t i = 0; i < count; i++) {
        if (isnan(a[i])) return INFINITY;
        if (fabs((double)a[i] - ref[i]) > e) e = fabs((double)a[i] - ref[i]);
    }
    return e;
}

/* max|a-b| / max|ref|; a NaN in a is an infinite error. */
static double norm_err(const float *a, const double *ref, size_t count) {
    double den = 0.0;
    for (size_t i = 0; i < count; i++)
        if (fabs(ref[i]) > den) den = fabs(ref[i]);
    return max_err(a, ref, count) / (den > 0.0 ? den : 1.0);
}

/* Weights stored in dtype t, plus the exact f32 values they hold. */
typedef struct {
    void *data;    /* [count] of t */
    double *value; /* [count] */
} weights;

static weights make_weights(size_t count, dj_dtype t, float lo, float hi) {
    weights w = {malloc(count * dj_dtype_size(t) + 1), malloc(count * sizeof(double) + 1)};
    if (!w.data || !w.value) abort();
    for (size_t i = 0; i < count; i++) {
        float f = dj_test_randf(lo, hi);
        if (t == DJ_DTYPE_BF16) {
            ((uint16_t *)w.data)[i] = dj_f32_to_bf16(f);
            f = dj_bf16_to_f32(((uint16_t *)w.data)[i]);
        } else if (t == DJ_DTYPE_F16) {
            ((uint16_t *)w.data)[i] = dj_f32_to_f16(f);
            f = dj_f16_to_f32(((uint16_t *)w.data)[i]);
        } else {
            ((float *)w.data)[i] = f;
        }
        w.value[i] = f;
    }
    return w;
}

static void free_weights(weights *w) {
    free(w->data);
    free(w->value);
}

static const dj_dtype float_types[] = {DJ_DTYPE_F32, DJ_DTYPE_F16, DJ_DTYPE_BF16};

/* ---- EMBED ---- */

static void test_embed(void) {
    const uint32_t vocab = 50, d = 67;
    for (int ti = 0; ti < 3; ti++) {
        weights tab = make_weights((size_t)vocab * d, float_types[ti], -2.0f, 2.0f);
        for (uint32_t n = 1; n <= 37; n += 36) {
            int32_t ids[37];
            for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(dj_test_rand() % vocab);
            ids[0] = (int32_t)vocab - 1;
            float *out = falloc((size_t)n * d);
            poison(out, (size_t)n * d);
            dj_op_call c = {.op = DJ_OP_EMBED, .n = n, .out = out, .w = tab.data, .w_dtype = float_types[ti],
                            .ids = ids, .d = d, .m = vocab};
            CHECK_OK(dj_backend_compute(be, &c));
            int bad = 0;
            for (uint32_t i = 0; i < n; i++)
                for (uint32_t j = 0; j < d; j++)
                    bad += out[(size_t)i * d + j] != (float)tab.value[(size_t)ids[i] * d + j];
            CHECK_MSG(bad == 0, "embed %s n=%u: %d elements differ", dj_dtype_name(float_types[ti]), n, bad);

            /* an id is user input: out of range is an error, and nothing is written */
            poison(out, (size_t)n * d);
            ids[n - 1] = (int32_t)vocab;
            CHECK_ST(dj_backend_compute(be, &c), DJ_ERANGE);
            ids[n - 1] = -1;
            CHECK_ST(dj_backend_compute(be, &c), DJ_ERANGE);
            CHECK(isnan(out[0]));
            free(out);
        }
        free_weights(&tab);
    }
}

/* ---- RMSNORM ---- */

static void test_rmsnorm(void) {
    const uint32_t dims[] = {67, 2048};
    for (int di = 0; di < 2; di++)
        for (int ti = 0; ti < 3; ti++)
            for (uint32_t n = 1; n <= 37; n += 36) {
                const uint32_t d = dims[di];
                const float eps = 1e-5f;
                weights w = make_weights(d, float_types[ti], 0.5f, 1.5f);
                float *x = falloc((size_t)n * d), *out = falloc((size_t)n * d);
                double *ref = malloc((size_t)n * d * sizeof(double));
                fill(x, (size_t)n * d, -3.0f, 3.0f);
                poison(out, (size_t)n * d);
                for (uint32_t i = 0; i < n; i++) {
                    double ss = 0.0;
                    for (uint32_t j = 0; j < d; j++) ss += (double)x[i * d + j] * x[i * d + j];
                    double r = 1.0 / sqrt(ss / d + eps);
                    for (uint32_t j = 0; j < d; j++) ref[i * d + j] = x[i * d + j] * r * w.value[j];
                }
                dj_op_call c = {.op = DJ_OP_RMSNORM, .n = n, .out = out, .x = x, .w = w.data,
                                .w_dtype = float_types[ti], .d = d, .eps = eps};
                CHECK_OK(dj_backend_compute(be, &c));
                double e = norm_err(out, ref, (size_t)n * d);
                CHECK_MSG(e < 1e-5, "rmsnorm d=%u n=%u %s: err %g", d, n, dj_dtype_name(float_types[ti]), e);
                free(x);
                free(out);
                free(ref);
                free_weights(&w);
            }
}

/* ---- MATMUL ---- */

static void check_matmul(dj_backend_t *b, uint32_t n, uint32_t k, uint32_t m, dj_dtype wt, int bias_kind) {
    weights w = make_weights((size_t)m * k, wt, -1.0f, 1.0f);
    const dj_dtype bt = bias_kind == 2 ? DJ_DTYPE_BF16 : DJ_DTYPE_F32;
    weights bias = make_weights(m, bt, -1.0f, 1.0f);
    float *x = falloc((size_t)n * k), *out = falloc((size_t)n * m);
    double *ref = malloc((size_t)n * m * sizeof(double)), scale = 0.0;
    fill(x, (size_t)n * k, -1.0f, 1.0f);
    poison(out, (size_t)n * m);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < m; j++) {
            double s = bias_kind ? bias.value[j] : 0.0, mag = fabs(s); /* mag: the terms' size, rounding's scale */
            for (uint32_t kk = 0; kk < k; kk++) {
                const double t = (double)x[(size_t)i * k + kk] * w.value[(size_t)j * k + kk];
                s += t;
                mag += fabs(t);
            }
            ref[(size_t)i * m + j] = s;
            if (mag > scale) scale = mag;
        }
    dj_op_call c = {.op = DJ_OP_MATMUL, .n = n, .out = out, .x = x, .w = w.data, .w_dtype = wt,
                    .bias = bias_kind ? bias.data : NULL, .bias_dtype = bt, .k = k, .m = m};
    CHECK_OK(dj_backend_compute(b, &c));
    /* relative to the largest sum of |terms|, not to |ref|: a sum that cancels to near 0 (k = 1 with a
     * bias: x w = -b) has f32 rounding of its terms' size (err 3.9e-5 of |ref| at one seed before) */
    double e = max_err(out, ref, (size_t)n * m) / (scale > 0.0 ? scale : 1.0);
    CHECK_MSG(e < 1e-5, "matmul n=%u k=%u m=%u w=%s bias=%d: err %g", n, k, m, dj_dtype_name(wt), bias_kind, e);
    free(x);
    free(out);
    free(ref);
    free_weights(&w);
    free_weights(&bias);
}

static void test_matmul(void) {
    static const uint32_t shapes[][3] = {{1, 67, 129}, {2, 64, 33},  {3, 16, 7},     {4, 130, 17},
                                         {5, 67, 129}, {37, 67, 129}, {37, 256, 300}, {1, 1, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ti = 0; ti < 3; ti++)
            for (int bk = 0; bk < 3; bk++) check_matmul(be, shapes[s][0], shapes[s][1], shapes[s][2], float_types[ti], bk);
    /* several converted tiles, the last one partial */
    dj__cpu_set_tile_rows(be, 48);
    check_matmul(be, 37, 67, 129, DJ_DTYPE_BF16, 1);
    check_matmul(be, 9, 67, 129, DJ_DTYPE_F16, 0);
    dj__cpu_set_tile_rows(be, 0);
    /* one thread */
    dj_backend_t *one = NULL;
    CHECK_OK(dj_backend_cpu_new(1, &one));
    check_matmul(one, 1, 67, 129, DJ_DTYPE_BF16, 2);
    check_matmul(one, 37, 67, 129, DJ_DTYPE_F16, 1);
    /* batch invariance: each row of a 37-row call (tiled, k-blocked) has the
     * bits of the same row multiplied alone (direct), with 1 or 2 threads and
     * any tile size, for every weight type and a k past one block */
    static const uint32_t ks[] = {67, 1037};
    for (int ti = 0; ti < 3; ti++)
        for (int ki = 0; ki < 2; ki++) {
            const uint32_t n = 37, k = ks[ki], m = 131;
            weights w = make_weights((size_t)m * k, float_types[ti], -1.0f, 1.0f);
            weights bias = make_weights(m, DJ_DTYPE_F32, -1.0f, 1.0f);
            float *x = falloc((size_t)n * k), *all = falloc((size_t)n * m), *row = falloc(m);
            fill(x, (size_t)n * k, -1.0f, 1.0f);
            dj_op_call c = {.op = DJ_OP_MATMUL, .n = n, .out = all, .x = x, .w = w.data, .w_dtype = float_types[ti],
                            .bias = bias.data, .bias_dtype = DJ_DTYPE_F32, .k = k, .m = m};
            dj__cpu_set_tile_rows(be, ki ? 0 : 20);
            CHECK_OK(dj_backend_compute(be, &c));
            int same = 1;
            for (uint32_t i = 0; i < n; i++) {
                dj_op_call c1 = c;
                c1.n = 1;
                c1.x = x + (size_t)i * k;
                c1.out = row;
                CHECK_OK(dj_backend_compute(i % 2 ? one : be, &c1));
                same &= !memcmp(row, all + (size_t)i * m, m * sizeof *row);
            }
            CHECK_MSG(same, "matmul w=%s k=%u: a row alone differs from the same row in a batch of %u",
                      dj_dtype_name(float_types[ti]), k, n);
            dj__cpu_set_tile_rows(be, 0);
            free(x);
            free(all);
            free(row);
            free_weights(&w);
            free_weights(&bias);
        }
    dj_backend_free(one);
}

/* A column slice read in place (ldw > k): the bits of the same columns
 * packed, for decode (direct) and prefill (tiled) row counts and every float
 * weight type; ldw below k, or with f8 weights, refused. */
static void test_matmul_ldw(void) {
    static const uint32_t rows[] = {1, 3, 37};
    const uint32_t k = 67, ldw = 131, m = 45;
    for (int ti = 0; ti < 3; ti++)
        for (int ri = 0; ri < 3; ri++) {
            const dj_dtype wt = float_types[ti];
            const size_t es = dj_dtype_size(wt);
            const uint32_t n = rows[ri];
            weights w = make_weights((size_t)m * ldw, wt, -1.0f, 1.0f);
            uint8_t *packed = malloc((size_t)m * k * es);
            for (uint32_t j = 0; j < m; j++)
                memcpy(packed + (size_t)j * k * es, (uint8_t *)w.data + (size_t)j * ldw * es, k * es);
            float *x = falloc((size_t)n * k), *got = falloc((size_t)n * m), *want = falloc((size_t)n * m);
            fill(x, (size_t)n * k, -1.0f, 1.0f);
            poison(got, (size_t)n * m);
            dj_op_call c = {.op = DJ_OP_MATMUL, .n = n, .out = want, .x = x, .w = packed, .w_dtype = wt,
                            .k = k, .m = m};
            CHECK_OK(dj_backend_compute(be, &c));
            c.out = got;
            c.w = w.data;
            c.ldw = ldw;
            CHECK_OK(dj_backend_compute(be, &c));
            CHECK_MSG(!memcmp(got, want, (size_t)n * m * sizeof *got),
                      "matmul n=%u w=%s: a slice at ldw %u differs from it packed", n, dj_dtype_name(wt), ldw);
            c.ldw = k - 1;
            CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
            CHECK_MSG(strstr(dj_last_error(), "elements apart"), "%s", dj_last_error());
            c.ldw = 0;
            c.out_rows = n - 1; /* room for fewer rows than its own */
            CHECK_ST(dj_backend_compute(be, &c), n > 1 ? DJ_EINVAL : DJ_OK);
            if (n > 1) CHECK_MSG(strstr(dj_last_error(), "has room for"), "%s", dj_last_error());
            free(x);
            free(got);
            free(want);
            free(packed);
            free_weights(&w);
        }
    uint8_t f8[64] = {0};
    float scale = 1.0f, x[4] = {0}, out[1];
    const dj_op_call c = {.op = DJ_OP_MATMUL, .n = 1, .out = out, .x = x, .w = f8, .w_dtype = DJ_DTYPE_F8_E4M3,
                          .w_scale = &scale, .w_block_rows = 128, .w_block_cols = 128, .k = 4, .m = 1, .ldw = 8};
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
}

/* Every instruction set this CPU runs gives the portable kernels' bits, for
 * decode (direct) and prefill (tiled, k-blocked) shapes, every weight type,
 * k with and without a tail past the 16 lanes, and bias. */
/* The pool: every task of every op exactly once, thread indices in range,
 * ops back to back (a late worker must not run a finished op's tasks). */
typedef struct pool_probe {
    _Atomic uint32_t *hits;
    int n_threads;
    _Atomic int bad_thread;
} pool_probe;

static void probe_task(void *ctx, uint32_t task, int thread) {
    pool_probe *p = ctx;
    if (thread < 0 || thread >= p->n_threads) atomic_store(&p->bad_thread, 1);
    atomic_fetch_add(&p->hits[task], 1);
}

static void probe_range(void *ctx, size_t lo, size_t hi, int thread) {
    for (size_t i = lo; i < hi; i++) probe_task(ctx, (uint32_t)i, thread);
}

/* Small ops after large ones and back, on more threads than cores: a worker
 * preempted between reading a ticket and claiming it must claim nothing of
 * a later op (it would run a task the op does not have, or count one that
 * did not run, letting the caller return while a task still runs). Each op
 * has its own context, kept, so a late task is seen rather than undefined. */
typedef struct stale_op {
    _Atomic int finished;    /* its pool_run returned */
    _Atomic int late, outside;
    _Atomic uint32_t hits[256];
    uint32_t n;
} stale_op;

static void stale_task(void *ctx, uint32_t task, int thread) {
    (void)thread;
    stale_op *o = ctx;
    if (atomic_load(&o->finished)) atomic_fetch_add(&o->late, 1);
    if (task >= o->n) {
        atomic_fetch_add(&o->outside, 1);
        return;
    }
    atomic_fetch_add(&o->hits[task], 1);
}

static void test_pool_stale(void) {
#if defined(__SANITIZE_ADDRESS__)
    enum { OPS = 3000 };
#else
    enum { OPS = 30000 };
#endif
    stale_op *ops = calloc(OPS, sizeof *ops);
    dj_cpu_pool *pool = NULL;
    CHECK_OK(dj__cpu_pool_new(8, &pool));
    int wrong = 0;
    for (uint32_t op = 0; pool && op < OPS; op++) {
        ops[op].n = op % 3 == 0 ? 2 + (uint32_t)(dj_test_rand() % 3) : 64 + (uint32_t)(dj_test_rand() % 192);
        dj__cpu_pool_run(pool, ops[op].n, stale_task, &ops[op]);
        atomic_store(&ops[op].finished, 1);
        for (uint32_t i = 0; i < ops[op].n; i++) wrong += atomic_load(&ops[op].hits[i]) != 1;
    }
    dj__cpu_pool_free(pool); /* every worker has stopped: late tasks are all counted */
    int late = 0, outside = 0;
    for (uint32_t op = 0; op < OPS; op++) {
        late += atomic_load(&ops[op].late);
        outside += atomic_load(&ops[op].outside);
    }
    CHECK_MSG(wrong == 0 && late == 0 && outside == 0,
              "pool of 8 threads, %d ops: %d tasks not run once when the op returned, %d ran after it, %d beyond it",
              OPS, wrong, late, outside);
    free(ops);
}

static void test_pool(void) {
    enum { MAX_TASKS = 997 };
    static const int threads[] = {1, 2, 3, 5};
    _Atomic uint32_t *hits = calloc(MAX_TASKS, sizeof *hits);
    for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
        dj_cpu_pool *pool = NULL;
        CHECK_OK(dj__cpu_pool_new(threads[ti], &pool));
        if (!pool) continue;
        CHECK(dj__cpu_pool_threads(pool) == threads[ti]);
        pool_probe pr = {hits, threads[ti], 0};
        int wrong = 0;
        for (uint32_t op = 0; op < 400; op++) {
            const uint32_t n = (op * 37u) % MAX_TASKS;
            for (uint32_t i = 0; i < MAX_TASKS; i++) atomic_store(&hits[i], 0);
            if (op % 2) dj__cpu_pool_run(pool, n, probe_task, &pr);
            else dj__cpu_pool_for(pool, n, 1 + op % 13, probe_range, &pr);
            for (uint32_t i = 0; i < MAX_TASKS; i++) wrong += atomic_load(&hits[i]) != (i < n ? 1u : 0u);
        }
        CHECK_MSG(wrong == 0, "pool of %d threads: %d tasks not run exactly once", threads[ti], wrong);
        CHECK_MSG(!atomic_load(&pr.bad_thread), "pool of %d threads: a thread index out of range", threads[ti]);
        dj__cpu_pool_free(pool);
    }
    dj_cpu_pool *pool = NULL;
    CHECK(dj__cpu_pool_new(0, &pool) == DJ_EINVAL && !pool);
    free(hits);
}

static void test_matmul_isas(void) {
    static const uint32_t shapes[][3] = {{1, 1037, 67}, {2, 100, 11}, {3, 32, 9}, {4, 15, 5}, {37, 1037, 131}, {9, 530, 20},
                                          {6, 13, 7}, {40, 2064, 25}, {6, 8250, 7}};
    dj_backend_t *ref = NULL, *simd = NULL;
    CHECK_OK(dj_backend_cpu_new(2, &ref));
    CHECK_OK(dj_backend_cpu_new(1, &simd));
    CHECK_OK(dj__cpu_set_isa(ref, DJ_CPU_ISA_PORTABLE));
    int tried = 0;
    for (int isa = DJ_CPU_ISA_AVX2; isa < DJ_CPU_ISA_COUNT; isa++) {
        if (dj__cpu_set_isa(simd, (dj_cpu_isa)isa) != DJ_OK) {
            printf("instruction set %d: not on this CPU, skipped\n", isa);
            continue;
        }
        tried++;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int ti = 0; ti < 3; ti++) {
                const uint32_t n = shapes[s][0], k = shapes[s][1], m = shapes[s][2];
                weights w = make_weights((size_t)m * k, float_types[ti], -1.0f, 1.0f);
                weights bias = make_weights(m, DJ_DTYPE_BF16, -1.0f, 1.0f);
                float *x = falloc((size_t)n * k), *a = falloc((size_t)n * m), *b = falloc((size_t)n * m);
                fill(x, (size_t)n * k, -1.0f, 1.0f);
                dj_op_call c = {.op = DJ_OP_MATMUL, .n = n, .out = a, .x = x, .w = w.data, .w_dtype = float_types[ti],
                                .bias = s % 2 ? bias.data : NULL, .bias_dtype = DJ_DTYPE_BF16, .k = k, .m = m};
                CHECK_OK(dj_backend_compute(ref, &c));
                c.out = b;
                CHECK_OK(dj_backend_compute(simd, &c));
                CHECK_MSG(!memcmp(a, b, (size_t)n * m * sizeof *a),
                          "matmul isa %d n=%u k=%u m=%u w=%s: not the portable kernels' bits", isa, n, k, m,
                          dj_dtype_name(float_types[ti]));
                free(x);
                free(a);
                free(b);
                free_weights(&w);
                free_weights(&bias);
            }
    }
    printf("matmul: %d SIMD instruction set(s) bit-identical to the portable kernels\n", tried);
    CHECK(dj__cpu_set_isa(simd, DJ_CPU_ISA_COUNT) == DJ_EUNSUPPORTED);
    dj_backend_free(ref);
    dj_backend_free(simd);
}

/* ---- ROPE ---- */

static void check_rope(uint32_t n, uint32_t nh, uint32_t hd, uint32_t pos0, double base, float scale, int in_place) {
    const uint32_t half = hd / 2;
    const size_t count = (size_t)n * nh * hd;
    float inv_freq[512];
    for (uint32_t j = 0; j < half; j++) inv_freq[j] = (float)(1.0 / pow(base, (double)(2 * j) / hd));
    float *x = falloc(count), *out = in_place ? x : falloc(count);
    double *ref = malloc(count * sizeof(double));
    fill(x, count, -2.0f, 2.0f);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t h = 0; h < nh; h++)
            for (uint32_t j = 0; j < half; j++) {
                const float theta = inv_freq[j] * (float)(pos0 + i); /* f32 product, as HF */
                const double cs = cos((double)theta) * scale, sn = sin((double)theta) * scale;
                const size_t o = ((size_t)i * nh + h) * hd;
                ref[o + j] = x[o + j] * cs - (double)x[o + j + half] * sn;
                ref[o + j + half] = x[o + j + half] * cs + (double)x[o + j] * sn;
            }
    if (!in_place) poison(out, count);
    dj_op_call c = {.op = DJ_OP_ROPE, .n = n, .out = out, .x = x, .inv_freq = inv_freq, .pos0 = pos0,
                    .n_heads = nh, .head_dim = hd, .scale = scale};
    CHECK_OK(dj_backend_compute(be, &c));
    double e = norm_err(out, ref, count);
    CHECK_MSG(e < 1e-5, "rope n=%u heads=%u hd=%u pos0=%u scale=%g in_place=%d: err %g", n, nh, hd, pos0,
              (double)scale, in_place, e);
    free(x);
    if (!in_place) free(out);
    free(ref);
}

static void test_rope(void) {
    check_rope(1, 4, 64, 0, 10000.0, 1.0f, 0);
    check_rope(37, 4, 64, 5, 10000.0, 1.0f, 0);
    check_rope(37, 3, 16, 40000, 500000.0, 1.0f, 1);
    check_rope(1, 8, 128, 131000, 500000.0, 1.25f, 1);
    check_rope(7, 2, 16, 3, 10000.0, 0.8f, 0);
}

/* ---- paged K/V ---- */

typedef struct {
    dj_kv_view view;
    uint32_t *table;   /* [n_blocks] shuffled page indices */
    uint32_t n_pages;  /* pages in the data area (more than mapped) */
} kv_area;

/* Pages of the backend's K/V dtype (f32, or f8 with nkv heads' scales). */
static void kv_area_init_heads(kv_area *a, uint32_t n_blocks, uint32_t tpp, uint32_t kv_dim, uint32_t nkv) {
    a->n_pages = n_blocks + 3;
    /* slack past the rows; a multiple of 16 bytes (the backends' loads) */
    const size_t page_bytes = (dj_kv_page_need(be->kv_dtype, nkv, kv_dim / nkv, tpp) + 15) / 16 * 16 + 64;
    void *seg = NULL;
    CHECK_OK(be->vt->alloc(be, page_bytes * a->n_pages, &seg));
    if (!seg) abort();
    poison(seg, page_bytes * a->n_pages / sizeof(float));
    uint32_t *perm = malloc(a->n_pages * sizeof(uint32_t));
    for (uint32_t i = 0; i < a->n_pages; i++) perm[i] = i;
    for (uint32_t i = a->n_pages - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(dj_test_rand() % (i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    a->table = perm;
    a->view = (dj_kv_view){.seg_base = seg, .page_bytes = page_bytes, .block_table = perm, .n_blocks = n_blocks,
                           .tokens_per_page = tpp, .kv_dim = kv_dim, .dtype = be->kv_dtype, .n_kv_heads = nkv};
}

static void kv_area_init(kv_area *a, uint32_t n_blocks, uint32_t tpp, uint32_t kv_dim) {
    kv_area_init_heads(a, n_blocks, tpp, kv_dim, 1);
}

/* f8 pages: the value of head h's element e at position p (code times the
 * page's power of two of the head), read back independently of the kernels. */
static double f8_value(const kv_area *a, uint32_t p, uint32_t h, uint32_t e, int is_v, uint8_t *code, int *exp) {
    const dj_kv_view *kv = &a->view;
    const uint32_t tpp = kv->tokens_per_page, hd = kv->kv_dim / kv->n_kv_heads, r = p % tpp;
    const uint8_t *page = kv->seg_base + (size_t)a->table[p / tpp] * kv->page_bytes;
    const uint8_t c = page[((size_t)(is_v ? tpp : 0) + r) * kv->kv_dim + (size_t)h * hd + e];
    const int8_t x = (int8_t)page[2 * (size_t)tpp * kv->kv_dim + (is_v ? kv->n_kv_heads : 0) + h];
    if (code) *code = c;
    if (exp) *exp = x;
    return ldexp((double)dj_f8e4m3_to_f32(c), x);
}

static void kv_area_free(kv_area *a) {
    be->vt->free(be, a->view.seg_base);
    free(a->table);
}

static size_t count_written(const kv_area *a) {
    const float *f = (const float *)(const void *)a->view.seg_base;
    size_t total = a->view.page_bytes * a->n_pages / sizeof(float), written = 0;
    for (size_t i = 0; i < total; i++) written += !isnan(f[i]);
    return written;
}

static void test_kv_write(void) {
    const uint32_t tpp = 16, kv_dim = 24, n_blocks = 4;
    kv_area a;
    kv_area_init(&a, n_blocks, tpp, kv_dim);
    const uint32_t pos0 = 13, n = 37; /* positions 13..49 over all four blocks */
    float *k = falloc((size_t)n * kv_dim), *v = falloc((size_t)n * kv_dim);
    fill(k, (size_t)n * kv_dim, -1.0f, 1.0f);
    fill(v, (size_t)n * kv_dim, -1.0f, 1.0f);
    dj_op_call c = {.op = DJ_OP_KV_WRITE, .n = n, .x = k, .x2 = v, .kv = &a.view, .pos0 = pos0};
    CHECK_OK(dj_backend_compute(be, &c));
    int bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t p = pos0 + i;
        const float *page = (const float *)(const void *)(a.view.seg_base + (size_t)a.table[p / tpp] * a.view.page_bytes);
        bad += memcmp(page + (size_t)(p % tpp) * kv_dim, k + (size_t)i * kv_dim, kv_dim * sizeof(float)) != 0;
        bad += memcmp(page + (size_t)(tpp + p % tpp) * kv_dim, v + (size_t)i * kv_dim, kv_dim * sizeof(float)) != 0;
    }
    CHECK_MSG(bad == 0, "kv_write: %d rows misplaced", bad);
    CHECK(count_written(&a) == 2u * n * kv_dim);

    /* past the mapped blocks: an error, nothing written */
    c.pos0 = n_blocks * tpp - 2;
    c.n = 3;
    CHECK_ST(dj_backend_compute(be, &c), DJ_ERANGE);
    c.pos0 = UINT32_MAX - 1;
    CHECK_ST(dj_backend_compute(be, &c), DJ_ERANGE);
    CHECK(count_written(&a) == 2u * n * kv_dim);
    c.pos0 = 0;
    c.n = 1;
    a.view.page_bytes = 2u * tpp * kv_dim * sizeof(float) - 4;
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
    free(k);
    free(v);
    kv_area_free(&a);
}

/* The least s with amax <= 448 * 2^s, found by search (not by
 * dj_kv_f8_exp's frexp); DJ_KV_F8_EXP_MIN for amax 0. */
static int f8_least_exp(double amax) {
    if (!(amax > 0.0)) return DJ_KV_F8_EXP_MIN;
    int s = -140;
    while (amax > ldexp(448.0, s)) s++;
    return s < DJ_KV_F8_EXP_MIN ? DJ_KV_F8_EXP_MIN : s;
}

/* Counts the codes of f8 pages at positions [from, to) that are not the
 * nearest f8 value of x[p - from] (rows of kv_dim, K or V) at their page's
 * exponent (its neighbours in magnitude are not closer). */
static int f8_not_nearest(const kv_area *a, const float *x, uint32_t from, uint32_t to, int is_v) {
    const uint32_t kvd = a->view.kv_dim, hd = kvd / a->view.n_kv_heads;
    int bad = 0;
    for (uint32_t p = from; p < to; p++)
        for (uint32_t e = 0; e < kvd; e++) {
            uint8_t code;
            int exp;
            const double want = x[(size_t)(p - from) * kvd + e];
            const double err = fabs(f8_value(a, p, e / hd, e % hd, is_v, &code, &exp) - want);
            for (int d = -1; d <= 1; d += 2) {
                const int nb = (int)(code & 0x7f) + d; /* the neighbour in magnitude, same sign */
                if (nb < 0 || nb > 0x7e) continue;
                bad += fabs(ldexp(dj_f8e4m3_to_f32((uint8_t)((code & 0x80) | nb)), exp) - want) < err;
            }
        }
    return bad;
}

/* f8 K/V pages (backend.h's layout): a page's exponent of a head is the
 * least s with amax <= 448 * 2^s over every row written to the page, and
 * each code the nearest f8 value of x * 2^-s; a page whose exponent a later
 * call raises has its earlier rows' codes re-encoded (exactly
 * dj_f32_to_f8e4m3(f8(code) * 2^(old - new))). Heads of very different
 * scales: large (exponent > 0), tiny, all zero; the second call's rows 16x
 * the first's, so the page both calls write grows. */
static void test_kv_write_f8(void) {
    CHECK_OK(dj_backend_set_kv_dtype(be, DJ_DTYPE_F8_E4M3));
    const uint32_t tpp = 8, nkv = 4, hd = 16, kv_dim = nkv * hd, n_blocks = 3, pos0 = 3, n = 17;
    static const float span[4] = {1.0f, 2000.0f, 1e-3f, 0.0f};
    kv_area a;
    kv_area_init_heads(&a, n_blocks, tpp, kv_dim, nkv);
    float *kv[2] = {falloc((size_t)(pos0 + n) * kv_dim), falloc((size_t)(pos0 + n) * kv_dim)};
    for (int w = 0; w < 2; w++)
        for (uint32_t i = 0; i < pos0 + n; i++)
            for (uint32_t h = 0; h < nkv; h++)
                for (uint32_t e = 0; e < hd; e++)
                    kv[w][((size_t)i * nkv + h) * hd + e] = dj_test_randf(-span[h], span[h]) / (i < pos0 ? 16.0f : 1.0f);
    /* rows [0, pos0) first: what the page held before */
    dj_op_call c = {.op = DJ_OP_KV_WRITE, .n = pos0, .x = kv[0], .x2 = kv[1], .kv = &a.view, .pos0 = 0};
    CHECK_OK(dj_backend_compute(be, &c));
    int bad_code = f8_not_nearest(&a, kv[0], 0, pos0, 0) + f8_not_nearest(&a, kv[1], 0, pos0, 1);
    uint8_t before[2][3 * 64];
    int before_exp[2][4];
    for (int w = 0; w < 2; w++)
        for (uint32_t e = 0; e < pos0 * kv_dim; e++) {
            before[w][e] = 0;
            int x;
            f8_value(&a, e / kv_dim, (e % kv_dim) / hd, e % hd, w, &before[w][e], &x);
            before_exp[w][(e % kv_dim) / hd] = x;
        }
    c.n = n;
    c.pos0 = pos0;
    c.x = kv[0] + (size_t)pos0 * kv_dim;
    c.x2 = kv[1] + (size_t)pos0 * kv_dim;
    CHECK_OK(dj_backend_compute(be, &c));
    int bad_exp = 0, bad_rescaled = 0, raised = 0;
    for (int w = 0; w < 2; w++) {
        for (uint32_t b = 0; b < n_blocks; b++)
            for (uint32_t h = 0; h < nkv; h++) {
                double amax = 0.0;
                for (uint32_t p = b * tpp; p < (b + 1) * tpp && p < pos0 + n; p++)
                    for (uint32_t e = 0; e < hd; e++) amax = fmax(amax, fabs(kv[w][((size_t)p * nkv + h) * hd + e]));
                int exp;
                f8_value(&a, b * tpp, h, 0, w, NULL, &exp);
                bad_exp += exp != f8_least_exp(amax);
            }
        bad_code += f8_not_nearest(&a, kv[w] + (size_t)pos0 * kv_dim, pos0, pos0 + n, w);
        for (uint32_t e = 0; e < pos0 * kv_dim; e++) {
            uint8_t code;
            int exp;
            f8_value(&a, e / kv_dim, (e % kv_dim) / hd, e % hd, w, &code, &exp);
            const int old = before_exp[w][(e % kv_dim) / hd];
            raised += exp > old;
            bad_rescaled += code != dj_f32_to_f8e4m3(ldexpf(dj_f8e4m3_to_f32(before[w][e]), old - exp));
        }
    }
    CHECK_MSG(bad_exp == 0, "kv_write f8: %d page exponents differ from the least s with amax <= 448*2^s", bad_exp);
    CHECK_MSG(bad_code == 0, "kv_write f8: %d codes are not the nearest f8 value", bad_code);
    CHECK_MSG(raised > 0 && bad_rescaled == 0, "kv_write f8: %d codes of a raised page (%d) not re-encoded",
              bad_rescaled, raised);
    /* a page short of the exponents: refused */
    a.view.page_bytes = dj_kv_page_need(DJ_DTYPE_F8_E4M3, nkv, hd, tpp) - 4; /* a multiple of 4, too short */
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
    a.view.page_bytes = (dj_kv_page_need(DJ_DTYPE_F8_E4M3, nkv, hd, tpp) + 15) / 16 * 16 + 64;
    a.view.n_kv_heads = 0; /* f8 needs the head count */
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
    a.view.n_kv_heads = nkv;
    a.view.dtype = DJ_DTYPE_F32; /* not the backend's K/V dtype */
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
    free(kv[0]);
    free(kv[1]);
    kv_area_free(&a);
    CHECK_OK(dj_backend_set_kv_dtype(be, DJ_DTYPE_F32));
    CHECK_ST(dj_backend_set_kv_dtype(be, DJ_DTYPE_BF16), DJ_EUNSUPPORTED);
    CHECK(be->kv_dtype == DJ_DTYPE_F32);
}

/* ---- ATTENTION ---- */

static void check_attention(uint32_t nh, uint32_t nkv, uint32_t hd, uint32_t pos0, uint32_t n, uint32_t window,
                            uint32_t tpp) {
    const uint32_t kv_dim = nkv * hd, total = pos0 + n;
    const uint32_t n_blocks = (total + tpp - 1) / tpp + 1;
    const bool f8 = be->kv_dtype == DJ_DTYPE_F8_E4M3;
    kv_area a;
    kv_area_init_heads(&a, n_blocks, tpp, kv_dim, nkv);
    float *k = falloc((size_t)total * kv_dim), *v = falloc((size_t)total * kv_dim);
    fill(k, (size_t)total * kv_dim, -1.5f, 1.5f);
    fill(v, (size_t)total * kv_dim, -1.0f, 1.0f);
    dj_op_call w = {.op = DJ_OP_KV_WRITE, .n = total, .x = k, .x2 = v, .kv = &a.view, .pos0 = 0};
    CHECK_OK(dj_backend_compute(be, &w));
    if (f8) /* the reference attends to the values the pages hold */
        for (uint32_t t = 0; t < total; t++)
            for (uint32_t h = 0; h < nkv; h++)
                for (uint32_t j = 0; j < hd; j++) {
                    k[(size_t)t * kv_dim + h * hd + j] = (float)f8_value(&a, t, h, j, 0, NULL, NULL);
                    v[(size_t)t * kv_dim + h * hd + j] = (float)f8_value(&a, t, h, j, 1, NULL, NULL);
                }

    const size_t qcount = (size_t)n * nh * hd;
    float *q = falloc(qcount), *out = falloc(qcount);
    double *ref = malloc(qcount * sizeof(double)), *sc = malloc(total * sizeof(double));
    fill(q, qcount, -1.5f, 1.5f);
    poison(out, qcount);
    const float scale = 1.0f / sqrtf((float)hd);
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t h = 0; h < nh; h++) {
            const uint32_t p = pos0 + i, kvh = h / (nh / nkv);
            const uint32_t t0 = window && p + 1 > window ? p + 1 - window : 0;
            const float *qr = q + ((size_t)i * nh + h) * hd;
            double mx = -INFINITY, sum = 0.0;
            for (uint32_t t = t0; t <= p; t++) {
                double s = 0.0;
                for (uint32_t j = 0; j < hd; j++) s += (double)qr[j] * k[(size_t)t * kv_dim + kvh * hd + j];
                sc[t] = s * scale;
                if (sc[t] > mx) mx = sc[t];
            }
            for (uint32_t t = t0; t <= p; t++) sum += (sc[t] = exp(sc[t] - mx));
            double *o = ref + ((size_t)i * nh + h) * hd;
            for (uint32_t j = 0; j < hd; j++) {
                double acc = 0.0;
                for (uint32_t t = t0; t <= p; t++) acc += sc[t] * v[(size_t)t * kv_dim + kvh * hd + j];
                o[j] = acc / sum;
            }
        }
    dj_op_call c = {.op = DJ_OP_ATTENTION, .n = n, .out = out, .x = q, .kv = &a.view, .pos0 = pos0,
                    .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd, .window = window, .scale = scale};
    CHECK_OK(dj_backend_compute(be, &c));
    double e = norm_err(out, ref, qcount);
    CHECK_MSG(e < 1e-5, "attention (%s K/V) heads %u:%u hd=%u pos0=%u n=%u window=%u tpp=%u: err %g",
              dj_dtype_name(be->kv_dtype), nh, nkv, hd, pos0, n, window, tpp, e);

    /* positions past the mapped blocks */
    c.pos0 = n_blocks * tpp - n + 1;
    CHECK_ST(dj_backend_compute(be, &c), DJ_ERANGE);
    c.pos0 = pos0;
    c.n_kv_heads = nkv + 1;
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
    free(k);
    free(v);
    free(q);
    free(out);
    free(ref);
    free(sc);
    kv_area_free(&a);
}

/* Every shape with f32 pages, then again with f8 pages (the reference then
 * reads the values the f8 pages hold). */
static void test_attention(void) {
    static const uint32_t heads[][3] = {{8, 2, 64}, {4, 1, 16}, {4, 4, 16}};
    static const uint32_t spans[][2] = {{0, 1}, {0, 37}, {45, 7}, {100, 1}, {130, 3}};
    for (int f8 = 0; f8 <= 1; f8++) {
        CHECK_OK(dj_backend_set_kv_dtype(be, f8 ? DJ_DTYPE_F8_E4M3 : DJ_DTYPE_F32));
        for (int h = 0; h < 3; h++)
            for (int s = 0; s < 5; s++)
                for (uint32_t window = 0; window <= 20; window += 20)
                    check_attention(heads[h][0], heads[h][1], heads[h][2], spans[s][0], spans[s][1], window, 16);
        check_attention(4, 2, 16, 0, 9, 1, 16); /* a window of one attends to itself only */
        check_attention(4, 2, 16, 190, 5, 0, 80); /* pages longer than one block of scores */
        check_attention(4, 2, 16, 150, 3, 100, 80);
    }
    CHECK_OK(dj_backend_set_kv_dtype(be, DJ_DTYPE_F32));
}

/* The attention's exponentials (dj__cpu_exp_block): glibc's expf bit for bit
 * where the C library is glibc 2.28 or later (the algorithm it follows), else
 * within an ulp of exp in double (subnormal results: one subnormal step);
 * every 4099th float of either sign (four at a time and the odd tails), and
 * the inputs expf itself takes. */
static void test_exp_block(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 28))
    const int exact = 1;
#else
    const int exact = 0;
#endif
    enum { N = 1031 };
    float x[N], y[N];
    uint32_t bits = 0, bad = 0, total = 0;
    while (bits < 0x7f800000u) {
        for (uint32_t i = 0; i < N; i++, bits += 4099) {
            const uint32_t u = (bits < 0x7f800000u ? bits : 0x42b00000u) | (i % 2 ? 0x80000000u : 0);
            memcpy(&x[i], &u, sizeof u);
        }
        dj__cpu_exp_block(x, y, N);
        for (uint32_t i = 0; i < N; i++, total++) {
            const float e = expf(x[i]);
            const double ref = exp((double)x[i]);
            if (exact ? memcmp(&e, &y[i], sizeof e) != 0 : fabs((double)y[i] - ref) > 1.2e-7 * ref + 1.5e-45) bad++;
        }
    }
    CHECK_MSG(bad == 0, "exp block: %u of %u differ from %s", bad, total, exact ? "expf" : "exp");
    const float special[] = {-INFINITY, INFINITY, NAN, -88.0f, 88.0f, -87.99f, 88.72f, -104.0f, 0.0f, -0.0f, -1e-30f};
    float out[11];
    dj__cpu_exp_block(special, out, 11);
    for (int i = 0; i < 11; i++) {
        const float e = expf(special[i]);
        CHECK_MSG(isnan(e) ? isnan(out[i]) : memcmp(&e, &out[i], sizeof e) == 0, "exp block of %g: %g, expf %g",
                  (double)special[i], (double)out[i], (double)e);
    }
}

/* ---- SILU_MUL, ADD ---- */

static void test_elementwise(void) {
    const uint32_t n = 37, d = 67;
    const size_t count = (size_t)n * d;
    float *a = falloc(count), *b = falloc(count), *out = falloc(count);
    double *ref = malloc(count * sizeof(double));
    for (int in_place = 0; in_place < 2; in_place++) {
        fill(a, count, -8.0f, 8.0f);
        fill(b, count, -2.0f, 2.0f);
        for (size_t i = 0; i < count; i++) ref[i] = a[i] / (1.0 + exp(-(double)a[i])) * b[i];
        float *o = in_place ? a : out;
        if (!in_place) poison(out, count);
        dj_op_call c = {.op = DJ_OP_SILU_MUL, .n = n, .out = o, .x = a, .x2 = b, .d = d};
        CHECK_OK(dj_backend_compute(be, &c));
        double e = norm_err(o, ref, count);
        CHECK_MSG(e < 1e-6, "silu_mul in_place=%d: err %g", in_place, e);

        fill(a, count, -8.0f, 8.0f);
        for (size_t i = 0; i < count; i++) ref[i] = (double)a[i] + b[i];
        if (!in_place) poison(out, count);
        c.op = DJ_OP_ADD;
        CHECK_OK(dj_backend_compute(be, &c));
        e = norm_err(o, ref, count);
        CHECK_MSG(e < 1e-6, "add in_place=%d: err %g", in_place, e);
    }
    free(a);
    free(b);
    free(out);
    free(ref);
}

/* ---- errors and memory ---- */

static void test_errors(void) {
    float x[8] = {0}, out[8];
    dj_op_call c = {.op = DJ_OP_ADD, .n = 1, .out = out, .x = x, .x2 = NULL, .d = 8};
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
    c.x2 = x;
    c.n = 0;
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
    c.n = 1;
    c.op = DJ_OP_COUNT;
    CHECK_ST(dj_backend_compute(be, &c), DJ_EUNSUPPORTED);
    CHECK_ST(dj_backend_compute(be, NULL), DJ_EINVAL);
    c.op = DJ_OP_ADD;
    CHECK_OK(dj_backend_compute(be, &c));
    c.out_dtype = DJ_DTYPE_BF16; /* the CPU writes f32 activations only */
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
    c.out_dtype = DJ_DTYPE_F32;
    c.x_dtype = DJ_DTYPE_BF16; /* and reads an f32 residual stream */
    CHECK_ST(dj_backend_compute(be, &c), DJ_EINVAL);
    c.x_dtype = DJ_DTYPE_F32;

    float inv_freq[2] = {1.0f, 0.5f};
    dj_op_call r = {.op = DJ_OP_ROPE, .n = 1, .out = out, .x = x, .inv_freq = inv_freq, .n_heads = 2,
                    .head_dim = 4, .scale = 0.0f};
    CHECK_ST(dj_backend_compute(be, &r), DJ_EINVAL); /* scale 0 is a builder bug, not "no scaling" */
    r.scale = 1.0f;
    r.head_dim = 3;
    CHECK_ST(dj_backend_compute(be, &r), DJ_EINVAL);

    dj_op_call m = {.op = DJ_OP_MATMUL, .n = 1, .out = out, .x = x, .w = x, .w_dtype = DJ_DTYPE_I32, .k = 2, .m = 2};
    CHECK_ST(dj_backend_compute(be, &m), DJ_EINVAL);
    m.w_dtype = DJ_DTYPE_F32;
    m.out = x + 1; /* overlaps x */
    CHECK_ST(dj_backend_compute(be, &m), DJ_EINVAL);

    int32_t id = 0;
    dj_op_call em = {.op = DJ_OP_EMBED, .n = 1, .out = out, .w = x, .w_dtype = DJ_DTYPE_F32, .ids = &id, .d = 8};
    CHECK_ST(dj_backend_compute(be, &em), DJ_EINVAL); /* vocab (m) not given */
    dj_op_call rn = {.op = DJ_OP_RMSNORM, .n = 1, .out = out, .x = x, .w = NULL, .d = 8};
    CHECK_ST(dj_backend_compute(be, &rn), DJ_EINVAL);

    void *p = NULL;
    CHECK_ST(be->vt->alloc(be, 0, &p), DJ_EINVAL);
    CHECK_ST(be->vt->alloc(be, SIZE_MAX - 8192, &p), DJ_ENOMEM);
    CHECK(p == NULL);
    CHECK_OK(be->vt->alloc(be, 12345, &p));
    CHECK(p && ((uintptr_t)p & 4095) == 0);
    const char msg[] = "device bytes";
    char back[sizeof msg];
    CHECK_OK(be->vt->upload(be, p, msg, sizeof msg));
    CHECK_OK(be->vt->download(be, back, p, sizeof msg));
    CHECK(memcmp(back, msg, sizeof msg) == 0);
    CHECK_OK(be->vt->sync(be));
    be->vt->free(be, p);

    dj_backend_t *b2 = NULL;
    CHECK_ST(dj_backend_cpu_new(-1, &b2), DJ_EINVAL);
    CHECK(b2 == NULL);
    dj_backend_free(NULL);
    CHECK(be->kv_dtype == DJ_DTYPE_F32 && be->act_dtype == DJ_DTYPE_F32);
    CHECK(strcmp(be->vt->name, "cpu") == 0);
}

/* ---- timing (printed, not asserted) ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void time_matmul(uint32_t n, uint32_t k, uint32_t m, int iters) {
    weights w = make_weights((size_t)m * k, DJ_DTYPE_BF16, -1.0f, 1.0f);
    float *x = falloc((size_t)n * k), *out = falloc((size_t)n * m);
    fill(x, (size_t)n * k, -1.0f, 1.0f);
    dj_op_call c = {.op = DJ_OP_MATMUL, .n = n, .out = out, .x = x, .w = w.data, .w_dtype = DJ_DTYPE_BF16,
                    .k = k, .m = m};
    CHECK_OK(dj_backend_compute(be, &c));
    double t = now_s();
    for (int i = 0; i < iters; i++) CHECK_OK(dj_backend_compute(be, &c));
    t = (now_s() - t) / iters;
    /* spot-check a few output rows against the reference */
    double worst = 0.0, big = 0.0;
    for (uint32_t j = 0; j < m; j += m / 7) {
        double s = 0.0;
        for (uint32_t kk = 0; kk < k; kk++) s += (double)x[(size_t)(n - 1) * k + kk] * w.value[(size_t)j * k + kk];
        double e = fabs(s - out[(size_t)(n - 1) * m + j]);
        worst = e > worst ? e : worst;
        big = fabs(s) > big ? fabs(s) : big;
    }
    CHECK_MSG(worst / big < 1e-5, "timed matmul: err %g", worst / big);
    printf("matmul bf16 n=%u k=%u m=%u: %.3f ms, %.1f GB/s of weights, %.1f GFLOP/s\n", n, k, m, t * 1e3,
           (double)m * k * 2 / t / 1e9, 2.0 * n * m * k / t / 1e9);
    free(x);
    free(out);
    free_weights(&w);
}

static void time_attention(uint32_t ctx) {
    const uint32_t nh = 32, nkv = 4, hd = 64, tpp = 16, kv_dim = nkv * hd;
    kv_area a;
    kv_area_init_heads(&a, (ctx + tpp - 1) / tpp, tpp, kv_dim, nkv);
    float *k = falloc((size_t)ctx * kv_dim), *v = falloc((size_t)ctx * kv_dim);
    float *q = falloc((size_t)nh * hd), *out = falloc((size_t)nh * hd);
    fill(k, (size_t)ctx * kv_dim, -1.0f, 1.0f);
    fill(v, (size_t)ctx * kv_dim, -1.0f, 1.0f);
    fill(q, (size_t)nh * hd, -1.0f, 1.0f);
    dj_op_call w = {.op = DJ_OP_KV_WRITE, .n = ctx, .x = k, .x2 = v, .kv = &a.view};
    CHECK_OK(dj_backend_compute(be, &w));
    dj_op_call c = {.op = DJ_OP_ATTENTION, .n = 1, .out = out, .x = q, .kv = &a.view, .pos0 = ctx - 1,
                    .n_heads = nh, .n_kv_heads = nkv, .head_dim = hd, .scale = 0.125f};
    const int iters = 5;
    double t = now_s();
    for (int i = 0; i < iters; i++) CHECK_OK(dj_backend_compute(be, &c));
    t = (now_s() - t) / iters;
    printf("attention decode heads %u:%u hd=%u ctx=%u, %s K/V: %.3f ms\n", nh, nkv, hd, ctx,
           dj_dtype_name(be->kv_dtype), t * 1e3);
    free(k);
    free(v);
    free(q);
    free(out);
    kv_area_free(&a);
}

int main(void) {
    dj_test_seeds();
    CHECK_OK(dj_backend_cpu_new(0, &be));
    if (!be) return dj_test_finish("test_cpu_backend");
    test_pool();
    test_pool_stale();
    test_embed();
    test_rmsnorm();
    test_matmul();
    test_matmul_isas();
    test_matmul_ldw();
    test_rope();
    test_kv_write();
    test_kv_write_f8();
    test_attention();
    test_exp_block();
    test_elementwise();
    test_errors();
    time_matmul(1, 2048, 5632, 10);
    time_matmul(64, 2048, 5632, 2);
    time_attention(2048);
    CHECK_OK(dj_backend_set_kv_dtype(be, DJ_DTYPE_F8_E4M3));
    time_attention(2048);
    dj_backend_free(be);
    return dj_test_finish("test_cpu_backend");
}
