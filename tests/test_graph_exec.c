/* test_graph_exec.c: captured graphs (src/capture) - every typed refusal of the validator
 * (refs, cycles, arity, shapes, overflow, limits, malformed bytes) and the ops against naive loops. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/backend.h"
#include "djinn/capture.h"
#include "testutil.h"

/* ---- a msgpack writer for building graphs ---- */
typedef dj_test_wb wb; /* testutil.h */
static void w_ints(wb *w, int n, const int64_t *v) {
    dj_test_w_arr(w, (uint32_t)n);
    for (int i = 0; i < n; i++) dj_test_w_int(w, v[i]);
}
static void w_node_ref(wb *w, int64_t j, int64_t k) {
    dj_test_w_map(w, 1), dj_test_w_str(w, "n"), dj_test_w_arr(w, 2), dj_test_w_int(w, j), dj_test_w_int(w, k);
}
static void w_in(wb *w, int64_t i) { dj_test_w_map(w, 1), dj_test_w_str(w, "i"), dj_test_w_int(w, i); }
static void w_wt(wb *w, int64_t i) { dj_test_w_map(w, 1), dj_test_w_str(w, "w"), dj_test_w_int(w, i); }
static void w_spec(wb *w, int rank, const int64_t *shape, const char *dtype) {
    dj_test_w_map(w, 2), dj_test_w_str(w, "shape"), w_ints(w, rank, shape), dj_test_w_str(w, "dtype"),
        dj_test_w_str(w, dtype);
}
/* starts a node: the caller writes n_args arguments, then calls w_outs */
static void w_node(wb *w, const char *op, uint32_t n_args) {
    dj_test_w_map(w, 3), dj_test_w_str(w, "op"), dj_test_w_str(w, op), dj_test_w_str(w, "args"),
        dj_test_w_arr(w, n_args);
}
static void w_outs(wb *w, uint32_t n) { dj_test_w_str(w, "out"), dj_test_w_arr(w, n); }

/* ---- single-op graphs: inputs i0..i(ni-1), one node, output (0, 0) ---- */
typedef struct tspec {
    int rank;
    int64_t shape[DJ_CGRAPH_MAX_RANK];
} tspec;

static void w_head(wb *w, int ni, const tspec *ins, uint32_t n_nodes) {
    w->n = 0;
    dj_test_w_map(w, 5), dj_test_w_str(w, "v"), dj_test_w_int(w, 1);
    dj_test_w_str(w, "inputs"), dj_test_w_arr(w, (uint32_t)ni);
    for (int i = 0; i < ni; i++) w_spec(w, ins[i].rank, ins[i].shape, "f32");
    dj_test_w_str(w, "weights"), dj_test_w_arr(w, 0);
    dj_test_w_str(w, "nodes"), dj_test_w_arr(w, n_nodes);
}
static void w_tail_out(wb *w, int64_t node) {
    dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 1), w_node_ref(w, node, 0);
}

/* Decode + run w with inputs; the output copied into out (numel of the declared output). */
static dj_status run_graph(dj_backend_t *cpu, const wb *w, const float *const *in, float *out, uint64_t want_numel) {
    dj_cgraph_t *g = NULL;
    dj_cgraph_error e;
    dj_status st = dj_cgraph_decode(w->b, w->n, NULL, &g, &e);
    if (st != DJ_OK) {
        fprintf(stderr, "decode: %s\n", e.msg);
        return st;
    }
    void *stack = aligned_alloc(64, dj_cgraph_stack_bytes(g) + 64);
    const float *outs[1];
    st = dj_cgraph_run(g, cpu, in, NULL, stack, outs);
    if (st == DJ_OK) {
        CHECK(dj_cgraph_output(g, 0)->numel == want_numel);
        memcpy(out, outs[0], sizeof(float) * want_numel);
    }
    free(stack);
    dj_cgraph_free(g);
    return st;
}

static void fill(float *x, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) x[i] = dj_test_randf(-2.0f, 2.0f);
}

static float max_rel_floor(const float *a, const float *b, uint64_t n, float floor) {
    float worst = 0.0f, scale = floor;
    for (uint64_t i = 0; i < n; i++) scale = fabsf(b[i]) > scale ? fabsf(b[i]) : scale;
    for (uint64_t i = 0; i < n; i++) {
        const float d = fabsf(a[i] - b[i]) / scale;
        worst = d > worst ? d : worst;
    }
    return worst;
}
static float max_rel(const float *a, const float *b, uint64_t n) { return max_rel_floor(a, b, n, 1e-6f); }

/* ---- the validator's refusals ---- */

static dj_cgraph_err decode_kind(const wb *w, const dj_cgraph_limits *lim, dj_status *st_out, dj_cgraph_error *e) {
    dj_cgraph_t *g = NULL;
    *st_out = dj_cgraph_decode(w->b, w->n, lim, &g, e);
    dj_cgraph_free(g);
    return *st_out == DJ_OK ? DJ_CGRAPH_ERR_NONE : e->kind;
}

#define CHECK_REFUSED(w, lim, kind_, st_want, node_want)                                                         \
    do {                                                                                                      \
        dj_status st__;                                                                                       \
        dj_cgraph_error e__;                                                                                  \
        const dj_cgraph_err k__ = decode_kind(w, lim, &st__, &e__);                                           \
        CHECK_MSG(k__ == (kind_) && st__ == (st_want) && (k__ == DJ_CGRAPH_ERR_NONE || e__.node == (node_want)), \
                  "kind %s status %s node %d (%s), want %s node %d", dj_cgraph_err_name(k__), dj_status_name(st__), \
                  k__ ? e__.node : -9, k__ ? e__.msg : "", dj_cgraph_err_name(kind_), (int)(node_want));         \
    } while (0)

static void test_refusals(void) {
    wb *w = malloc(sizeof *w);
    const tspec x = {2, {2, 4}};
    const int64_t s24[] = {2, 4}, s23[] = {2, 3};

    /* a valid two-node graph first: relu(relu(x)) */
    w_head(w, 1, &x, 2);
    w_node(w, "aten.relu.default", 1), w_in(w, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_node(w, "aten.relu.default", 1), w_node_ref(w, 0, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 1);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_NONE, DJ_OK, -1);
    /* every strict prefix of it is refused, as FORMAT */
    {
        const size_t full = w->n;
        int bad = 0;
        for (size_t cut = 0; cut < full; cut++) {
            dj_cgraph_t *g = NULL;
            dj_cgraph_error e;
            if (dj_cgraph_decode(w->b, cut, NULL, &g, &e) == DJ_OK || g) bad++;
            dj_cgraph_free(g);
        }
        CHECK_MSG(bad == 0, "%d prefixes accepted", bad);
        w->n = full;
    }
    /* the node limit */
    dj_cgraph_limits lim = {.max_nodes = 1};
    CHECK_REFUSED(w, &lim, DJ_CGRAPH_ERR_LIMIT, DJ_ERANGE, -1);
    /* the stack limit: 2 values of 32 bytes, each rounded to 64 */
    lim = (dj_cgraph_limits){.max_stack_bytes = 64};
    CHECK_REFUSED(w, &lim, DJ_CGRAPH_ERR_LIMIT, DJ_ERANGE, -1);
    lim = (dj_cgraph_limits){.max_stack_bytes = 128};
    CHECK_REFUSED(w, &lim, DJ_CGRAPH_ERR_NONE, DJ_OK, -1);
    /* the work limit: each relu of 8 elements reads 8 and writes 8 */
    lim = (dj_cgraph_limits){.max_ops = 20};
    CHECK_REFUSED(w, &lim, DJ_CGRAPH_ERR_LIMIT, DJ_ERANGE, 1);
    lim = (dj_cgraph_limits){.max_ops = 32};
    CHECK_REFUSED(w, &lim, DJ_CGRAPH_ERR_NONE, DJ_OK, -1);

    /* unknown op, named */
    w_head(w, 1, &x, 1);
    w_node(w, "aten.roll.default", 3), w_in(w, 0), w_ints(w, 1, (const int64_t[]){1}), w_ints(w, 1, (const int64_t[]){0}),
        w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 0);
    {
        dj_status st;
        dj_cgraph_error e;
        CHECK(decode_kind(w, NULL, &st, &e) == DJ_CGRAPH_ERR_UNKNOWN_OP && st == DJ_EUNSUPPORTED && e.node == 0);
        CHECK(strstr(e.msg, "aten.roll.default") && !strcmp(e.op, "aten.roll.default"));
        CHECK(strstr(dj_last_error(), "aten.roll.default") != NULL);
    }
    /* wrong arity */
    w_head(w, 1, &x, 1);
    w_node(w, "aten.relu.default", 2), w_in(w, 0), w_in(w, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_ARITY, DJ_EFORMAT, 0);
    /* wrong number of outputs */
    w_head(w, 1, &x, 1);
    w_node(w, "aten.relu.default", 1), w_in(w, 0), w_outs(w, 2), w_spec(w, 2, s24, "f32"), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_ARITY, DJ_EFORMAT, 0);
    /* a node reading itself, and a node reading a later one: cycles */
    w_head(w, 1, &x, 1);
    w_node(w, "aten.relu.default", 1), w_node_ref(w, 0, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_CYCLE, DJ_EFORMAT, 0);
    w_head(w, 1, &x, 2);
    w_node(w, "aten.relu.default", 1), w_node_ref(w, 1, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_node(w, "aten.relu.default", 1), w_node_ref(w, 0, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 1);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_CYCLE, DJ_EFORMAT, 0);
    /* out-of-range references: a node past the end, an output a node lacks, an input, a weight,
     * a graph output */
    w_head(w, 1, &x, 2);
    w_node(w, "aten.relu.default", 1), w_in(w, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_node(w, "aten.relu.default", 1), w_node_ref(w, 7, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 1);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_REF, DJ_ERANGE, 1);
    w_head(w, 1, &x, 2);
    w_node(w, "aten.relu.default", 1), w_in(w, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_node(w, "aten.relu.default", 1), w_node_ref(w, 0, 1), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 1);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_REF, DJ_ERANGE, 1);
    w_head(w, 1, &x, 1);
    w_node(w, "aten.relu.default", 1), w_in(w, 1), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_REF, DJ_ERANGE, 0);
    w_head(w, 1, &x, 1);
    w_node(w, "aten.relu.default", 1), w_wt(w, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_REF, DJ_ERANGE, 0);
    w_head(w, 1, &x, 1);
    w_node(w, "aten.relu.default", 1), w_in(w, 0), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 3);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_REF, DJ_ERANGE, -1);
    w_head(w, 1, &x, 1);
    w_node(w, "aten.relu.default", 1), w_in(w, -1), w_outs(w, 1), w_spec(w, 2, s24, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_REF, DJ_ERANGE, 0);
    /* a declared shape or dtype that is not what the op gives */
    w_head(w, 1, &x, 1);
    w_node(w, "aten.relu.default", 1), w_in(w, 0), w_outs(w, 1), w_spec(w, 2, s23, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_SHAPE, DJ_EINVAL, 0);
    w_head(w, 1, &x, 1);
    w_node(w, "aten.relu.default", 1), w_in(w, 0), w_outs(w, 1), w_spec(w, 2, s24, "bool");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_SHAPE, DJ_EINVAL, 0);
    /* matrices that do not multiply */
    {
        const tspec ab[2] = {{2, {2, 4}}, {2, {3, 5}}};
        const int64_t s25[] = {2, 5};
        w_head(w, 2, ab, 1);
        w_node(w, "aten.mm.default", 2), w_in(w, 0), w_in(w, 1), w_outs(w, 1), w_spec(w, 2, s25, "f32");
        w_tail_out(w, 0);
        CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_ARG, DJ_EINVAL, 0);
    }
    /* sizes: a huge input, an overflowing one, a negative dimension, a reshape overflowing */
    {
        const tspec huge = {2, {1 << 20, 1 << 20}};
        w_head(w, 1, &huge, 0);
        dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 0);
        CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_OVERFLOW, DJ_ERANGE, -1);
        const tspec over = {3, {INT64_C(1) << 40, INT64_C(1) << 40, INT64_C(1) << 40}};
        w_head(w, 1, &over, 0);
        dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 0);
        CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_OVERFLOW, DJ_ERANGE, -1);
        const tspec neg = {2, {-2, -4}};
        w_head(w, 1, &neg, 0);
        dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 0);
        CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_OVERFLOW, DJ_ERANGE, -1);
        const int64_t big[] = {INT64_C(1) << 62, INT64_C(1) << 62, 0};
        w_head(w, 1, &x, 1);
        w_node(w, "aten.view.default", 2), w_in(w, 0), w_ints(w, 3, big), w_outs(w, 1), w_spec(w, 2, s24, "f32");
        w_tail_out(w, 0);
        CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_OVERFLOW, DJ_ERANGE, 0);
        /* a convolution whose columns would overflow: a 1 x 2^20 kernel over a 1 x 2^20 image */
        const tspec ci[2] = {{4, {1, 1 << 10, 1, 1 << 20}}, {4, {1, 1 << 10, 1, 1 << 20}}};
        const int64_t o1[] = {1, 1, 1, 1}, one[] = {1, 1}, zero[] = {0, 0};
        w_head(w, 2, ci, 1);
        w_node(w, "aten.convolution.default", 9), w_in(w, 0), w_in(w, 1), dj_test_w_nil(w), w_ints(w, 2, one),
            w_ints(w, 2, zero), w_ints(w, 2, one), dj_test_w_bool(w, 0), w_ints(w, 2, zero), dj_test_w_int(w, 1);
        w_outs(w, 1), w_spec(w, 4, o1, "f32");
        w_tail_out(w, 0);
        dj_cgraph_limits small = {.max_elems = 1 << 24};
        CHECK_REFUSED(w, &small, DJ_CGRAPH_ERR_OVERFLOW, DJ_ERANGE, -1);
    }
    /* a variant not built: batch norm in training mode; transposed convolution */
    {
        const tspec bi[5] = {{4, {2, 3, 4, 4}}, {1, {3}}, {1, {3}}, {1, {3}}, {1, {3}}};
        const int64_t s[] = {2, 3, 4, 4}, c3[] = {3};
        w_head(w, 5, bi, 1);
        w_node(w, "aten.native_batch_norm.default", 8);
        for (int i = 0; i < 5; i++) w_in(w, i);
        dj_test_w_bool(w, 1), dj_test_w_f64(w, 0.1), dj_test_w_f64(w, 1e-5);
        w_outs(w, 3), w_spec(w, 4, s, "f32"), w_spec(w, 1, c3, "f32"), w_spec(w, 1, c3, "f32");
        w_tail_out(w, 0);
        CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_UNSUPPORTED, DJ_EUNSUPPORTED, 0);
    }
    /* malformed: not a map, the wrong version, trailing bytes, an ext type */
    {
        const uint8_t junk[] = {0x91, 0x01};
        dj_cgraph_t *g = NULL;
        dj_cgraph_error e;
        CHECK(dj_cgraph_decode(junk, sizeof junk, NULL, &g, &e) == DJ_EFORMAT && e.kind == DJ_CGRAPH_ERR_FORMAT && !g);
        CHECK(dj_cgraph_decode(NULL, 0, NULL, &g, &e) == DJ_EFORMAT && !g);
        w_head(w, 1, &x, 0);
        dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 0);
        w->b[5 + 6 + 8] = 2; /* "v": 2 - the int64's last byte, after map32 (5 bytes), str "v" (6) and 0xd3 */
        CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_FORMAT, DJ_EFORMAT, -1);
        w_head(w, 1, &x, 0);
        dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 0);
        w->b[w->n++] = 0xc0;
        CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_FORMAT, DJ_EFORMAT, -1);
        /* a count that the bytes cannot hold: array32 of 2^32-1 nodes */
        w->n = 0;
        dj_test_w_map(w, 1), dj_test_w_str(w, "nodes"), dj_test_w_arr(w, 0xffffffffu);
        CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_FORMAT, DJ_EFORMAT, -1);
    }
    free(w);
}

/* ---- ops against naive loops ---- */

static dj_backend_t *cpu;

static void test_addmm(void) {
    wb *w = malloc(sizeof *w);
    enum { N = 7, K = 37, M = 19 };
    float x[N * K], wt[M * K], b[M], out[N * M], ref[N * M];
    fill(x, N * K), fill(wt, M * K), fill(b, M);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < M; j++) {
            double s = b[j];
            for (int k = 0; k < K; k++) s += (double)x[i * K + k] * wt[j * K + k];
            ref[i * M + j] = (float)s;
        }
    /* addmm(b, x, t(w)): the t() node is folded into the GEMM's rows */
    const tspec ins[3] = {{1, {M}}, {2, {N, K}}, {2, {M, K}}};
    const int64_t km[] = {K, M}, nm[] = {N, M};
    w_head(w, 3, ins, 2);
    w_node(w, "aten.t.default", 1), w_in(w, 2), w_outs(w, 1), w_spec(w, 2, km, "f32");
    w_node(w, "aten.addmm.default", 5), w_in(w, 0), w_in(w, 1), w_node_ref(w, 0, 0), dj_test_w_int(w, 1),
        dj_test_w_int(w, 1);
    w_outs(w, 1), w_spec(w, 2, nm, "f32");
    w_tail_out(w, 1);
    const float *in[3] = {b, x, wt};
    CHECK_OK(run_graph(cpu, w, in, out, N * M));
    CHECK_MSG(max_rel(out, ref, N * M) < 1e-5f, "addmm(t) rel %g", max_rel(out, ref, N * M));
    /* mm with a plain [K, M] matrix, scaled: 0.5 * b + 2 * x @ m */
    float km_mat[K * M];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < M; j++) km_mat[k * M + j] = wt[j * K + k];
    const tspec ins2[3] = {{2, {1, M}}, {2, {N, K}}, {2, {K, M}}};
    w_head(w, 3, ins2, 1);
    w_node(w, "aten.addmm.default", 5), w_in(w, 0), w_in(w, 1), w_in(w, 2), dj_test_w_f64(w, 0.5),
        dj_test_w_f64(w, 2.0);
    w_outs(w, 1), w_spec(w, 2, nm, "f32");
    w_tail_out(w, 0);
    const float *in2[3] = {b, x, km_mat};
    CHECK_OK(run_graph(cpu, w, in2, out, N * M));
    for (int i = 0; i < N; i++)
        for (int j = 0; j < M; j++) ref[i * M + j] = 2.0f * (ref[i * M + j] - b[j]) + 0.5f * b[j];
    CHECK_MSG(max_rel(out, ref, N * M) < 1e-5f, "addmm(beta, alpha) rel %g", max_rel(out, ref, N * M));
    free(w);
}

static void test_conv(void) {
    wb *w = malloc(sizeof *w);
    enum { B = 2, C = 4, H = 9, W = 8, OC = 6, G = 2, KH = 3, KW = 2, SH = 2, SW = 1, PH = 1, PW = 1, DH = 2, DW = 1 };
    const int OH = (H + 2 * PH - DH * (KH - 1) - 1) / SH + 1, OW = (W + 2 * PW - DW * (KW - 1) - 1) / SW + 1;
    float x[B * C * H * W], wt[OC * (C / G) * KH * KW], bias[OC];
    fill(x, sizeof x / 4), fill(wt, sizeof wt / 4), fill(bias, OC);
    float *out = malloc(sizeof(float) * B * OC * OH * OW), *ref = malloc(sizeof(float) * B * OC * OH * OW);
    for (int b = 0; b < B; b++)
        for (int oc = 0; oc < OC; oc++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    const int g = oc / (OC / G);
                    double s = bias[oc];
                    for (int c = 0; c < C / G; c++)
                        for (int i = 0; i < KH; i++)
                            for (int j = 0; j < KW; j++) {
                                const int ih = oh * SH - PH + i * DH, iw = ow * SW - PW + j * DW;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                s += (double)x[((b * C + g * (C / G) + c) * H + ih) * W + iw] *
                                     wt[((oc * (C / G) + c) * KH + i) * KW + j];
                            }
                    ref[((b * OC + oc) * OH + oh) * OW + ow] = (float)s;
                }
    const tspec ins[3] = {{4, {B, C, H, W}}, {4, {OC, C / G, KH, KW}}, {1, {OC}}};
    const int64_t os[] = {B, OC, OH, OW}, st[] = {SH, SW}, pd[] = {PH, PW}, dl[] = {DH, DW}, z[] = {0, 0};
    w_head(w, 3, ins, 1);
    w_node(w, "aten.convolution.default", 9), w_in(w, 0), w_in(w, 1), w_in(w, 2), w_ints(w, 2, st), w_ints(w, 2, pd),
        w_ints(w, 2, dl), dj_test_w_bool(w, 0), w_ints(w, 2, z), dj_test_w_int(w, G);
    w_outs(w, 1), w_spec(w, 4, os, "f32");
    w_tail_out(w, 0);
    const float *in[3] = {x, wt, bias};
    const uint64_t n = (uint64_t)B * OC * OH * OW;
    CHECK_OK(run_graph(cpu, w, in, out, n));
    CHECK_MSG(max_rel(out, ref, n) < 1e-5f, "conv rel %g", max_rel(out, ref, n));
    /* a declared output of the wrong spatial size is refused */
    const int64_t bad[] = {B, OC, OH + 1, OW};
    w_head(w, 3, ins, 1);
    w_node(w, "aten.convolution.default", 9), w_in(w, 0), w_in(w, 1), w_in(w, 2), w_ints(w, 2, st), w_ints(w, 2, pd),
        w_ints(w, 2, dl), dj_test_w_bool(w, 0), w_ints(w, 2, z), dj_test_w_int(w, G);
    w_outs(w, 1), w_spec(w, 4, bad, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_SHAPE, DJ_EINVAL, 0);
    free(out), free(ref), free(w);
}

static void test_pool(void) {
    wb *w = malloc(sizeof *w);
    enum { P = 3, H = 7, W = 6 };
    float x[P * H * W], out[P * H * W], ref[P * H * W];
    fill(x, P * H * W);
    const tspec in1 = {3, {P, H, W}};
    const float *in[1] = {x};
    /* max pool 3x2, stride 2, padding 1x1, ceil_mode: OH = ceil((7+2-3)/2)+1 = 4, OW = ceil((6+2-2)/2)+1 = 4 */
    {
        const int64_t k[] = {3, 2}, s[] = {2, 2}, p[] = {1, 1}, d[] = {1, 1}, os[] = {P, 4, 4};
        w_head(w, 1, &in1, 1);
        w_node(w, "aten.max_pool2d_with_indices.default", 6), w_in(w, 0), w_ints(w, 2, k), w_ints(w, 2, s),
            w_ints(w, 2, p), w_ints(w, 2, d), dj_test_w_bool(w, 1);
        w_outs(w, 2), w_spec(w, 3, os, "f32"), w_spec(w, 3, os, "i64");
        w_tail_out(w, 0);
        CHECK_OK(run_graph(cpu, w, in, out, P * 16));
        for (int c = 0; c < P; c++)
            for (int oh = 0; oh < 4; oh++)
                for (int ow = 0; ow < 4; ow++) {
                    float m = -INFINITY;
                    for (int i = 0; i < 3; i++)
                        for (int j = 0; j < 2; j++) {
                            const int ih = oh * 2 - 1 + i, iw = ow * 2 - 1 + j;
                            if (ih >= 0 && ih < H && iw >= 0 && iw < W && x[(c * H + ih) * W + iw] > m) m = x[(c * H + ih) * W + iw];
                        }
                    ref[(c * 4 + oh) * 4 + ow] = m;
                }
        CHECK_MSG(max_rel(out, ref, P * 16) == 0.0f, "max pool rel %g", max_rel(out, ref, P * 16));
    }
    /* avg pool 3x3 stride 2 padding 1, count_include_pad false then true */
    for (int cip = 0; cip < 2; cip++) {
        const int64_t k[] = {3, 3}, s[] = {2, 2}, p[] = {1, 1}, os[] = {P, 4, 3};
        w_head(w, 1, &in1, 1);
        w_node(w, "aten.avg_pool2d.default", 7), w_in(w, 0), w_ints(w, 2, k), w_ints(w, 2, s), w_ints(w, 2, p),
            dj_test_w_bool(w, 0), dj_test_w_bool(w, cip), dj_test_w_nil(w);
        w_outs(w, 1), w_spec(w, 3, os, "f32");
        w_tail_out(w, 0);
        CHECK_OK(run_graph(cpu, w, in, out, P * 12));
        for (int c = 0; c < P; c++)
            for (int oh = 0; oh < 4; oh++)
                for (int ow = 0; ow < 3; ow++) {
                    double sum = 0;
                    int cnt = 0;
                    for (int i = 0; i < 3; i++)
                        for (int j = 0; j < 3; j++) {
                            const int ih = oh * 2 - 1 + i, iw = ow * 2 - 1 + j;
                            if (ih >= 0 && ih < H && iw >= 0 && iw < W) sum += x[(c * H + ih) * W + iw], cnt++;
                        }
                    ref[(c * 4 + oh) * 3 + ow] = (float)(sum / (cip ? 9 : cnt));
                }
        CHECK_MSG(max_rel(out, ref, P * 12) < 1e-6f, "avg pool (cip %d) rel %g", cip, max_rel(out, ref, P * 12));
    }
    /* adaptive average to 3x4 (windows of uneven sizes) */
    {
        const int64_t o[] = {3, 4}, os[] = {P, 3, 4};
        w_head(w, 1, &in1, 1);
        w_node(w, "aten._adaptive_avg_pool2d.default", 2), w_in(w, 0), w_ints(w, 2, o);
        w_outs(w, 1), w_spec(w, 3, os, "f32");
        w_tail_out(w, 0);
        CHECK_OK(run_graph(cpu, w, in, out, P * 12));
        for (int c = 0; c < P; c++)
            for (int oh = 0; oh < 3; oh++)
                for (int ow = 0; ow < 4; ow++) {
                    const int h0 = oh * H / 3, h1 = ((oh + 1) * H + 2) / 3, w0 = ow * W / 4, w1 = ((ow + 1) * W + 3) / 4;
                    double sum = 0;
                    for (int i = h0; i < h1; i++)
                        for (int j = w0; j < w1; j++) sum += x[(c * H + i) * W + j];
                    ref[(c * 3 + oh) * 4 + ow] = (float)(sum / ((h1 - h0) * (w1 - w0)));
                }
        CHECK_MSG(max_rel(out, ref, P * 12) < 1e-6f, "adaptive avg rel %g", max_rel(out, ref, P * 12));
    }
    free(w);
}

static void test_norms_softmax(void) {
    wb *w = malloc(sizeof *w);
    enum { A = 3, B = 5, D = 6 };
    float x[A * B * D], g[D], bb[D], out[A * B * D], ref[A * B * D];
    fill(x, A * B * D), fill(g, D), fill(bb, D);
    const int64_t xs[] = {A, B, D}, ms[] = {A, B, 1}, nd[] = {D};
    /* layer norm over the last dim */
    {
        const tspec ins[3] = {{3, {A, B, D}}, {1, {D}}, {1, {D}}};
        w_head(w, 3, ins, 1);
        w_node(w, "aten.native_layer_norm.default", 5), w_in(w, 0), w_ints(w, 1, nd), w_in(w, 1), w_in(w, 2),
            dj_test_w_f64(w, 1e-5);
        w_outs(w, 3), w_spec(w, 3, xs, "f32"), w_spec(w, 3, ms, "f32"), w_spec(w, 3, ms, "f32");
        w_tail_out(w, 0);
        const float *in[3] = {x, g, bb};
        CHECK_OK(run_graph(cpu, w, in, out, A * B * D));
        for (int r = 0; r < A * B; r++) {
            double mu = 0, var = 0;
            for (int j = 0; j < D; j++) mu += x[r * D + j];
            mu /= D;
            for (int j = 0; j < D; j++) var += (x[r * D + j] - mu) * (x[r * D + j] - mu);
            var /= D;
            for (int j = 0; j < D; j++) ref[r * D + j] = (float)((x[r * D + j] - mu) / sqrt(var + 1e-5) * g[j] + bb[j]);
        }
        CHECK_MSG(max_rel(out, ref, A * B * D) < 1e-5f, "layer norm rel %g", max_rel(out, ref, A * B * D));
    }
    /* batch norm (eval) with channels = B over [A, B, D] */
    {
        float mean[B], var[B], wt[B], bias[B];
        fill(mean, B), fill(wt, B), fill(bias, B);
        for (int c = 0; c < B; c++) var[c] = dj_test_randf(0.5f, 2.0f);
        const tspec ins[5] = {{3, {A, B, D}}, {1, {B}}, {1, {B}}, {1, {B}}, {1, {B}}};
        const int64_t c0[] = {0};
        w_head(w, 5, ins, 1);
        w_node(w, "aten._native_batch_norm_legit_no_training.default", 7);
        for (int i = 0; i < 5; i++) w_in(w, i);
        dj_test_w_f64(w, 0.1), dj_test_w_f64(w, 1e-5);
        w_outs(w, 3), w_spec(w, 3, xs, "f32"), w_spec(w, 1, c0, "f32"), w_spec(w, 1, c0, "f32");
        w_tail_out(w, 0);
        const float *in[5] = {x, wt, bias, mean, var};
        CHECK_OK(run_graph(cpu, w, in, out, A * B * D));
        for (int a = 0; a < A; a++)
            for (int c = 0; c < B; c++)
                for (int j = 0; j < D; j++) {
                    const int i = (a * B + c) * D + j;
                    ref[i] = (float)((x[i] - mean[c]) / sqrt(var[c] + 1e-5) * wt[c] + bias[c]);
                }
        CHECK_MSG(max_rel(out, ref, A * B * D) < 1e-5f, "batch norm rel %g", max_rel(out, ref, A * B * D));
    }
    /* softmax and log_softmax over dim 1 (strided rows) */
    for (int lg = 0; lg < 2; lg++) {
        const tspec ins[1] = {{3, {A, B, D}}};
        w_head(w, 1, ins, 1);
        w_node(w, lg ? "aten._log_softmax.default" : "aten._softmax.default", 3), w_in(w, 0), dj_test_w_int(w, 1),
            dj_test_w_bool(w, 0);
        w_outs(w, 1), w_spec(w, 3, xs, "f32");
        w_tail_out(w, 0);
        const float *in[1] = {x};
        CHECK_OK(run_graph(cpu, w, in, out, A * B * D));
        for (int a = 0; a < A; a++)
            for (int j = 0; j < D; j++) {
                double s = 0;
                for (int b = 0; b < B; b++) s += exp(x[(a * B + b) * D + j]);
                for (int b = 0; b < B; b++) {
                    const double v = x[(a * B + b) * D + j];
                    ref[(a * B + b) * D + j] = (float)(lg ? v - log(s) : exp(v) / s);
                }
            }
        CHECK_MSG(max_rel(out, ref, A * B * D) < 1e-5f, "softmax (log %d) rel %g", lg, max_rel(out, ref, A * B * D));
    }
    free(w);
}

/* add(x [A,1,D], y [B,1]) broadcast, then permute(2,0,1), cat with itself on dim 1, sum over dims 0,2 keepdim,
 * gelu: a chain through the planner, checked element by element. */
static void test_chain(void) {
    wb *w = malloc(sizeof *w);
    enum { A = 2, B = 3, D = 4 };
    float x[A * D], y[B], out[64], ref[64];
    fill(x, A * D), fill(y, B);
    const tspec ins[2] = {{3, {A, 1, D}}, {2, {B, 1}}};
    const int64_t s_add[] = {A, B, D}, s_perm[] = {D, A, B}, s_cat[] = {D, 2 * A, B}, s_sum[] = {1, 2 * A, 1}, perm[] = {2, 0, 1},
                  dims[] = {0, -1};
    w_head(w, 2, ins, 5);
    w_node(w, "aten.add.Tensor", 3), w_in(w, 0), w_in(w, 1), dj_test_w_f64(w, 0.5), w_outs(w, 1),
        w_spec(w, 3, s_add, "f32");
    w_node(w, "aten.permute.default", 2), w_node_ref(w, 0, 0), w_ints(w, 3, perm), w_outs(w, 1), w_spec(w, 3, s_perm, "f32");
    w_node(w, "aten.cat.default", 2), dj_test_w_arr(w, 2), w_node_ref(w, 1, 0), w_node_ref(w, 1, 0),
        dj_test_w_int(w, 1);
    w_outs(w, 1), w_spec(w, 3, s_cat, "f32");
    w_node(w, "aten.sum.dim_IntList", 4), w_node_ref(w, 2, 0), w_ints(w, 2, dims), dj_test_w_bool(w, 1),
        dj_test_w_nil(w);
    w_outs(w, 1), w_spec(w, 3, s_sum, "f32");
    w_node(w, "aten.gelu.default", 2), w_node_ref(w, 3, 0), dj_test_w_str(w, "none"), w_outs(w, 1),
        w_spec(w, 3, s_sum, "f32");
    w_tail_out(w, 4);
    const float *in[2] = {x, y};
    CHECK_OK(run_graph(cpu, w, in, out, 2 * A));
    for (int i = 0; i < 2 * A; i++) {
        const int a = i % A;
        double s = 0;
        for (int b = 0; b < B; b++)
            for (int d = 0; d < D; d++) s += x[a * D + d] + 0.5 * y[b];
        ref[i] = (float)(0.5 * s * (1 + erf(s / sqrt(2.0))));
    }
    /* relative to the size of the summed terms (12 of up to 3): a sum that cancels to near 0 has f32 rounding
     * of the terms' size, not of its own */
    CHECK_MSG(max_rel_floor(out, ref, 2 * A, 10.0f) < 1e-5f, "chain rel %g", max_rel_floor(out, ref, 2 * A, 10.0f));
    free(w);
}

/* The plan reuses memory: a chain of 12 relus over 4 KiB values needs a few of them, not 12. */
static void test_plan_reuse(void) {
    wb *w = malloc(sizeof *w);
    const tspec x = {1, {1024}};
    const int64_t s[] = {1024};
    w_head(w, 1, &x, 12);
    for (int j = 0; j < 12; j++) {
        w_node(w, "aten.relu.default", 1);
        if (j) w_node_ref(w, j - 1, 0);
        else w_in(w, 0);
        w_outs(w, 1), w_spec(w, 1, s, "f32");
    }
    w_tail_out(w, 11);
    dj_cgraph_t *g = NULL;
    dj_cgraph_error e;
    CHECK_OK(dj_cgraph_decode(w->b, w->n, NULL, &g, &e));
    if (g) CHECK_MSG(dj_cgraph_stack_bytes(g) == 2 * 4096, "stack %zu", dj_cgraph_stack_bytes(g));
    dj_cgraph_free(g);
    free(w);
}

/* bmm against a naive loop; slice with a negative start and a step; select with a negative index. */
static void test_bmm_slice_select(void) {
    wb *w = malloc(sizeof *w);
    enum { B = 3, N = 4, K = 21, M = 5 };
    float a[B * N * K], b[B * K * M], out[B * N * K], ref[B * N * M]; /* out: room for the largest result */
    fill(a, sizeof a / 4), fill(b, sizeof b / 4);
    for (int i = 0; i < B; i++)
        for (int r = 0; r < N; r++)
            for (int c = 0; c < M; c++) {
                double s = 0;
                for (int k = 0; k < K; k++) s += (double)a[(i * N + r) * K + k] * b[(i * K + k) * M + c];
                ref[(i * N + r) * M + c] = (float)s;
            }
    const tspec ins[2] = {{3, {B, N, K}}, {3, {B, K, M}}};
    const int64_t os[] = {B, N, M};
    w_head(w, 2, ins, 1);
    w_node(w, "aten.bmm.default", 2), w_in(w, 0), w_in(w, 1), w_outs(w, 1), w_spec(w, 3, os, "f32");
    w_tail_out(w, 0);
    const float *in[2] = {a, b};
    CHECK_OK(run_graph(cpu, w, in, out, B * N * M));
    CHECK_MSG(max_rel(out, ref, B * N * M) < 1e-5f, "bmm rel %g", max_rel(out, ref, B * N * M));
    /* a[:, -3::2, :] -> [B, 2, K] (rows 1 and 3), then select(-1, -2) -> [B, 2] (column K-2) */
    const int64_t s1[] = {B, 2, K}, s2[] = {B, 2};
    w_head(w, 1, ins, 2);
    w_node(w, "aten.slice.Tensor", 5), w_in(w, 0), dj_test_w_int(w, 1), dj_test_w_int(w, -3), dj_test_w_nil(w),
        dj_test_w_int(w, 2);
    w_outs(w, 1), w_spec(w, 3, s1, "f32");
    w_node(w, "aten.select.int", 3), w_node_ref(w, 0, 0), dj_test_w_int(w, -1), dj_test_w_int(w, -2), w_outs(w, 1),
        w_spec(w, 2, s2, "f32");
    w_tail_out(w, 1);
    CHECK_OK(run_graph(cpu, w, in, out, B * 2));
    int bad = 0;
    for (int i = 0; i < B; i++)
        for (int j = 0; j < 2; j++) bad += out[i * 2 + j] != a[(i * N + 1 + 2 * j) * K + K - 2];
    CHECK_MSG(bad == 0, "%d sliced values wrong", bad);
    /* a step of INT64_MAX takes the first element only (no overflow) */
    const int64_t s3[] = {B, 1, K};
    w_head(w, 1, ins, 1);
    w_node(w, "aten.slice.Tensor", 5), w_in(w, 0), dj_test_w_int(w, 1), dj_test_w_int(w, 2), dj_test_w_nil(w),
        dj_test_w_int(w, INT64_MAX);
    w_outs(w, 1), w_spec(w, 3, s3, "f32");
    w_tail_out(w, 0);
    CHECK_OK(run_graph(cpu, w, in, out, B * K));
    CHECK(out[0] == a[2 * K] && out[K] == a[(N + 2) * K]);
        /* an index past the dim is refused */
    w_head(w, 1, ins, 1);
    w_node(w, "aten.select.int", 3), w_in(w, 0), dj_test_w_int(w, 0), dj_test_w_int(w, B), w_outs(w, 1),
        w_spec(w, 2, s2, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_ARG, DJ_EINVAL, 0);
    free(w);
}

/* A cat of 100 values, each made by its own node: every one stays live until the cat reads it. */
static void test_long_cat(void) {
    wb *w = malloc(sizeof *w);
    enum { K = 100 };
    const tspec x = {1, {3}};
    const int64_t s3[] = {3}, sk[] = {3 * K};
    w_head(w, 1, &x, K + 1);
    for (int j = 0; j < K; j++) {
        w_node(w, "aten.mul.Scalar", 2), w_in(w, 0), dj_test_w_int(w, j), w_outs(w, 1), w_spec(w, 1, s3, "f32");
    }
    w_node(w, "aten.cat.default", 2), dj_test_w_arr(w, K);
    for (int j = 0; j < K; j++) w_node_ref(w, j, 0);
    dj_test_w_int(w, 0), w_outs(w, 1), w_spec(w, 1, sk, "f32");
    w_tail_out(w, K);
    float in0[3] = {1.0f, -2.0f, 0.5f}, out[3 * K];
    const float *in[1] = {in0};
    CHECK_OK(run_graph(cpu, w, in, out, 3 * K));
    int bad = 0;
    for (int j = 0; j < K; j++)
        for (int i = 0; i < 3; i++) bad += out[j * 3 + i] != in0[i] * (float)j;
    CHECK_MSG(bad == 0, "%d values of the cat wrong", bad);
    free(w);
}

/* Lists of outputs (unbind, split), bounded by DJ_CGRAPH_MAX_OUTS; indices read at run time are
 * checked (embedding, gather); topk against a naive pick. */
static void test_multi_output_and_indices(void) {
    wb *w = malloc(sizeof *w);
    enum { R = 5, C = 3 };
    float x[R * C], out[600];
    fill(x, R * C);
    const tspec xs = {2, {R, C}};
    const int64_t row[] = {C};
    const float *in[1] = {x};
    /* unbind(x, 0): 5 outputs; the graph returns output 4 (the last row) */
    w_head(w, 1, &xs, 1);
    w_node(w, "aten.unbind.int", 2), w_in(w, 0), dj_test_w_int(w, 0), w_outs(w, R);
    for (int k = 0; k < R; k++) w_spec(w, 1, row, "f32");
    dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 1);
    const size_t ref_at = w->n;
    w_node_ref(w, 0, R - 1);
    CHECK_OK(run_graph(cpu, w, in, out, C));
    CHECK(out[0] == x[(R - 1) * C] && out[2] == x[(R - 1) * C + 2]);
    /* output 5 of a node of 5 outputs is a bad reference */
    w->n = ref_at;
    w_node_ref(w, 0, R);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_REF, DJ_ERANGE, -1);
    /* declaring 4 outputs where the arguments give 5 */
    w_head(w, 1, &xs, 1);
    w_node(w, "aten.unbind.int", 2), w_in(w, 0), dj_test_w_int(w, 0), w_outs(w, R - 1);
    for (int k = 0; k < R - 1; k++) w_spec(w, 1, row, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_ARITY, DJ_EFORMAT, 0);
    /* split of [1, 600] by 2: 300 outputs, above the limit of 256 */
    const tspec wide = {2, {1, 600}};
    const int64_t two[] = {1, 2};
    w_head(w, 1, &wide, 1);
    w_node(w, "aten.split.Tensor", 3), w_in(w, 0), dj_test_w_int(w, 2), dj_test_w_int(w, 1), w_outs(w, 300);
    for (int k = 0; k < 300; k++) w_spec(w, 2, two, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_LIMIT, DJ_ERANGE, 0);
    /* split of [1, 600] by 3 along 1: 200 outputs of [1, 3]; output 199 holds the last three */
    float wv[600];
    fill(wv, 600);
    const int64_t three[] = {1, 3};
    w_head(w, 1, &wide, 1);
    w_node(w, "aten.split.Tensor", 3), w_in(w, 0), dj_test_w_int(w, 3), dj_test_w_int(w, 1), w_outs(w, 200);
    for (int k = 0; k < 200; k++) w_spec(w, 2, three, "f32");
    dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 1), w_node_ref(w, 0, 199);
    const float *inw[1] = {wv};
    CHECK_OK(run_graph(cpu, w, inw, out, 3));
    CHECK(out[0] == wv[597] && out[2] == wv[599]);

    /* embedding of a [R, C] table by i64 indices from an input: a bad index is refused when it runs */
    const int64_t ishape[] = {4}, eshape[] = {4, C};
    w->n = 0;
    dj_test_w_map(w, 5), dj_test_w_str(w, "v"), dj_test_w_int(w, 1);
    dj_test_w_str(w, "inputs"), dj_test_w_arr(w, 2), w_spec(w, 2, xs.shape, "f32"), w_spec(w, 1, ishape, "i64");
    dj_test_w_str(w, "weights"), dj_test_w_arr(w, 0);
    dj_test_w_str(w, "nodes"), dj_test_w_arr(w, 1);
    w_node(w, "aten.embedding.default", 5), w_in(w, 0), w_in(w, 1), dj_test_w_int(w, -1), dj_test_w_bool(w, 0),
        dj_test_w_bool(w, 0);
    w_outs(w, 1), w_spec(w, 2, eshape, "f32");
    w_tail_out(w, 0);
    float idx[4] = {4, 0, 2, 4};
    const float *in2[2] = {x, idx};
    CHECK_OK(run_graph(cpu, w, in2, out, 4 * C));
    CHECK(out[0] == x[4 * C] && out[C] == x[0] && out[2 * C + 1] == x[2 * C + 1]);
    idx[2] = (float)R; /* one past the table */
    CHECK(run_graph(cpu, w, in2, out, 4 * C) == DJ_ERANGE);
    idx[2] = -1.0f;    /* embedding does not wrap */
    CHECK(run_graph(cpu, w, in2, out, 4 * C) == DJ_ERANGE);

    /* gather(x, 1, index [R, 2]): -1 wraps, C is out of range */
    const int64_t gshape[] = {R, 2};
    w->n = 0;
    dj_test_w_map(w, 5), dj_test_w_str(w, "v"), dj_test_w_int(w, 1);
    dj_test_w_str(w, "inputs"), dj_test_w_arr(w, 2), w_spec(w, 2, xs.shape, "f32"), w_spec(w, 2, gshape, "i64");
    dj_test_w_str(w, "weights"), dj_test_w_arr(w, 0);
    dj_test_w_str(w, "nodes"), dj_test_w_arr(w, 1);
    w_node(w, "aten.gather.default", 4), w_in(w, 0), dj_test_w_int(w, 1), w_in(w, 1), dj_test_w_bool(w, 0);
    w_outs(w, 1), w_spec(w, 2, gshape, "f32");
    w_tail_out(w, 0);
    float gi[R * 2];
    for (int i = 0; i < R; i++) gi[i * 2] = (float)(i % C), gi[i * 2 + 1] = -1.0f;
    const float *in3[2] = {x, gi};
    CHECK_OK(run_graph(cpu, w, in3, out, R * 2));
    int bad = 0;
    for (int i = 0; i < R; i++) bad += out[i * 2] != x[i * C + i % C] || out[i * 2 + 1] != x[i * C + C - 1];
    CHECK_MSG(bad == 0, "%d gathered values wrong", bad);
    gi[3] = (float)C;
    CHECK(run_graph(cpu, w, in3, out, R * 2) == DJ_ERANGE);

    /* topk(x, 2, -1) values: the two largest of each row, in order */
    const int64_t tshape[] = {R, 2};
    w_head(w, 1, &xs, 1);
    w_node(w, "aten.topk.default", 5), w_in(w, 0), dj_test_w_int(w, 2), dj_test_w_int(w, -1), dj_test_w_bool(w, 1),
        dj_test_w_bool(w, 1);
    w_outs(w, 2), w_spec(w, 2, tshape, "f32"), w_spec(w, 2, tshape, "i64");
    w_tail_out(w, 0);
    CHECK_OK(run_graph(cpu, w, in, out, R * 2));
    bad = 0;
    for (int i = 0; i < R; i++) {
        float a = -INFINITY, b = -INFINITY;
        for (int j = 0; j < C; j++) {
            const float v = x[i * C + j];
            if (v > a) b = a, a = v;
            else if (v > b) b = v;
        }
        bad += out[i * 2] != a || out[i * 2 + 1] != b;
    }
    CHECK_MSG(bad == 0, "%d topk rows wrong", bad);

    /* an empty tensor whose other dims multiply past the limit: refused, though its numel is 0 */
    const tspec huge_empty = {3, {0, (int64_t)1 << 40, (int64_t)1 << 40}};
    w_head(w, 1, &huge_empty, 1);
    w_node(w, "aten.relu.default", 1), w_in(w, 0), w_outs(w, 1), w_spec(w, 3, huge_empty.shape, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_OVERFLOW, DJ_ERANGE, -1);
    free(w);
}

/* flip, sort (stable, both orders, ties and indices) and transposed convolution against naive loops. */
static void test_flip_sort_conv_transposed(void) {
    wb *w = malloc(sizeof *w);
    /* flip(x, [0, -1]) of [3, 4, 5] */
    enum { A = 3, Bd = 4, Cd = 5 };
    float x[A * Bd * Cd], out[A * Bd * Cd];
    fill(x, A * Bd * Cd);
    const tspec xs = {3, {A, Bd, Cd}};
    w_head(w, 1, &xs, 1);
    w_node(w, "aten.flip.default", 2), w_in(w, 0), w_ints(w, 2, (const int64_t[]){0, -1});
    w_outs(w, 1), w_spec(w, 3, xs.shape, "f32");
    w_tail_out(w, 0);
    const float *in[1] = {x};
    CHECK_OK(run_graph(cpu, w, in, out, A * Bd * Cd));
    int bad = 0;
    for (int i = 0; i < A; i++)
        for (int j = 0; j < Bd; j++)
            for (int k = 0; k < Cd; k++) bad += out[(i * Bd + j) * Cd + k] != x[((A - 1 - i) * Bd + j) * Cd + (Cd - 1 - k)];
    CHECK_MSG(bad == 0, "%d flipped values wrong", bad);
    /* a repeated dim is refused */
    w_head(w, 1, &xs, 1);
    w_node(w, "aten.flip.default", 2), w_in(w, 0), w_ints(w, 2, (const int64_t[]){1, -2});
    w_outs(w, 1), w_spec(w, 3, xs.shape, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_ARG, DJ_EINVAL, 0);

    /* sort of [R, C] with many ties: along dim 1 ascending (sort.default) and along dim 0 descending
     * (sort.stable); values and indices against a stable insertion sort */
    enum { R = 6, C = 9 };
    float y[R * C], vals[R * C], idx[R * C];
    for (int i = 0; i < R * C; i++) y[i] = floorf(dj_test_randf(0.0f, 3.0f));
    y[4] = NAN; /* NaN sorts last ascending, first descending */
    const tspec ys = {2, {R, C}};
    for (int variant = 0; variant < 2; variant++) {
        const bool desc = variant == 1;
        const int dim = variant == 0 ? 1 : 0, len = dim ? C : R, rows = dim ? R : C;
        for (int want_out = 0; want_out < 2; want_out++) {
            w_head(w, 1, &ys, 1);
            if (variant == 0) {
                w_node(w, "aten.sort.default", 3), w_in(w, 0), dj_test_w_int(w, 1), dj_test_w_bool(w, 0);
            } else {
                w_node(w, "aten.sort.stable", 4), w_in(w, 0), dj_test_w_bool(w, 1), dj_test_w_int(w, 0),
                    dj_test_w_bool(w, 1);
            }
            w_outs(w, 2), w_spec(w, 2, ys.shape, "f32"), w_spec(w, 2, ys.shape, "i64");
            dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 1), w_node_ref(w, 0, want_out);
            const float *iny[1] = {y};
            CHECK_OK(run_graph(cpu, w, iny, want_out ? idx : vals, R * C));
        }
        bad = 0;
        for (int r = 0; r < rows; r++) {
            int order[C > R ? C : R];
            for (int k = 0; k < len; k++) order[k] = k;
            for (int k = 1; k < len; k++) /* insertion sort: stable */
                for (int m = k; m > 0; m--) {
                    const float a = y[dim ? r * C + order[m] : order[m] * C + r];
                    const float b = y[dim ? r * C + order[m - 1] : order[m - 1] * C + r];
                    const bool before = desc ? (a > b || (isnan(a) && !isnan(b))) : (a < b || (isnan(b) && !isnan(a)));
                    if (!before) break;
                    const int t = order[m];
                    order[m] = order[m - 1];
                    order[m - 1] = t;
                }
            for (int k = 0; k < len; k++) {
                const int at = dim ? r * C + k : k * C + r;
                const float want = y[dim ? r * C + order[k] : order[k] * C + r];
                bad += idx[at] != (float)order[k] || !(vals[at] == want || (isnan(vals[at]) && isnan(want)));
            }
        }
        CHECK_MSG(bad == 0, "sort variant %d: %d values or indices wrong", variant, bad);
    }

    /* transposed convolution: groups 2, stride (2, 1), padding (1, 0), dilation (1, 2), output_padding (1, 0) */
    enum { N = 2, IC = 4, H = 5, W = 4, G = 2, OCg = 3, OC = OCg * G, KH = 3, KW = 2, SH = 2, SW = 1, PH = 1, PW = 0,
           DH = 1, DW = 2, OPH = 1, OPW = 0 };
    const int OH = (H - 1) * SH - 2 * PH + DH * (KH - 1) + OPH + 1, OW = (W - 1) * SW - 2 * PW + DW * (KW - 1) + OPW + 1;
    float cx[N * IC * H * W], wt[IC * OCg * KH * KW], bias[OC];
    fill(cx, sizeof cx / 4), fill(wt, sizeof wt / 4), fill(bias, OC);
    const uint64_t no = (uint64_t)N * OC * OH * OW;
    float *co = malloc(sizeof(float) * no), *ref = malloc(sizeof(float) * no);
    for (int b = 0; b < N; b++)
        for (int oc = 0; oc < OC; oc++)
            for (int oh = 0; oh < OH; oh++)
                for (int ow = 0; ow < OW; ow++) {
                    const int g = oc / OCg;
                    double sum = bias[oc];
                    for (int c = 0; c < IC / G; c++)
                        for (int i = 0; i < KH; i++)
                            for (int j = 0; j < KW; j++) {
                                const int th = oh + PH - i * DH, tw = ow + PW - j * DW;
                                if (th < 0 || tw < 0 || th % SH || tw % SW || th / SH >= H || tw / SW >= W) continue;
                                const int ci = g * (IC / G) + c;
                                sum += (double)cx[((b * IC + ci) * H + th / SH) * W + tw / SW] *
                                       wt[((ci * OCg + oc % OCg) * KH + i) * KW + j];
                            }
                    ref[((b * OC + oc) * OH + oh) * OW + ow] = (float)sum;
                }
    const tspec cins[3] = {{4, {N, IC, H, W}}, {4, {IC, OCg, KH, KW}}, {1, {OC}}};
    const int64_t os[] = {N, OC, OH, OW}, st[] = {SH, SW}, pd[] = {PH, PW}, dl[] = {DH, DW}, op[] = {OPH, OPW};
    w_head(w, 3, cins, 1);
    w_node(w, "aten.convolution.default", 9), w_in(w, 0), w_in(w, 1), w_in(w, 2), w_ints(w, 2, st), w_ints(w, 2, pd),
        w_ints(w, 2, dl), dj_test_w_bool(w, 1), w_ints(w, 2, op), dj_test_w_int(w, G);
    w_outs(w, 1), w_spec(w, 4, os, "f32");
    w_tail_out(w, 0);
    const float *cin[3] = {cx, wt, bias};
    CHECK_OK(run_graph(cpu, w, cin, co, no));
    CHECK_MSG(max_rel(co, ref, no) < 1e-5f, "transposed conv rel %g", max_rel(co, ref, no));
    /* output_padding not below the stride or the dilation is refused */
    const int64_t op_bad[] = {2, 0};
    w_head(w, 3, cins, 1);
    w_node(w, "aten.convolution.default", 9), w_in(w, 0), w_in(w, 1), w_in(w, 2), w_ints(w, 2, st), w_ints(w, 2, pd),
        w_ints(w, 2, dl), dj_test_w_bool(w, 1), w_ints(w, 2, op_bad), dj_test_w_int(w, G);
    w_outs(w, 1), w_spec(w, 4, os, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_ARG, DJ_EINVAL, 0);
    free(co), free(ref), free(w);
}

/* index.Tensor with integer indices: adjacent (x[:, i, j]: the broadcast dims in place) and apart
 * (x[i, :, j]: first), negative indices, one out of range; None in a cat list refused. */
static void test_index_tensor(void) {
    wb *w = malloc(sizeof *w);
    enum { A = 4, B = 5, C = 6 };
    float x[A * B * C], out[64];
    fill(x, A * B * C);
    const float iv[3] = {3, 0, -1}, jv[6] = {1, 2, 0, 3, 5, -2}; /* i [3] (into B or A), j [2, 3] (into C) */
    const tspec ins[3] = {{3, {A, B, C}}, {1, {3}}, {2, {2, 3}}};
    for (int apart = 0; apart < 2; apart++) {
        w->n = 0;
        dj_test_w_map(w, 5), dj_test_w_str(w, "v"), dj_test_w_int(w, 1);
        dj_test_w_str(w, "inputs"), dj_test_w_arr(w, 3);
        w_spec(w, 3, ins[0].shape, "f32"), w_spec(w, 1, ins[1].shape, "i64"), w_spec(w, 2, ins[2].shape, "i64");
        dj_test_w_str(w, "weights"), dj_test_w_arr(w, 0);
        dj_test_w_str(w, "nodes"), dj_test_w_arr(w, 1);
        w_node(w, "aten.index.Tensor", 2), w_in(w, 0), dj_test_w_arr(w, 3);
        if (apart)
            w_in(w, 1), dj_test_w_nil(w), w_in(w, 2); /* x[i, :, j] -> [2, 3, B] */
        else
            dj_test_w_nil(w), w_in(w, 1), w_in(w, 2); /* x[:, i, j] -> [A, 2, 3] */
        const int64_t os_apart[] = {2, 3, B}, os_adj[] = {A, 2, 3};
        w_outs(w, 1), w_spec(w, 3, apart ? os_apart : os_adj, "f32");
        w_tail_out(w, 0);
        const float *in[3] = {x, iv, jv};
        CHECK_OK(run_graph(cpu, w, in, out, apart ? 2 * 3 * B : A * 6));
        int bad = 0;
        for (int p = 0; p < 2; p++)
            for (int q = 0; q < 3; q++) {
                const int ii = (int)iv[q] < 0 ? (int)iv[q] + (apart ? A : B) : (int)iv[q];
                const int jj = (int)jv[p * 3 + q] < 0 ? (int)jv[p * 3 + q] + C : (int)jv[p * 3 + q];
                if (apart) {
                    for (int b = 0; b < B; b++) bad += out[(p * 3 + q) * B + b] != x[(ii * B + b) * C + jj];
                } else {
                    for (int a = 0; a < A; a++) bad += out[(a * 2 + p) * 3 + q] != x[(a * B + ii) * C + jj];
                }
            }
        CHECK_MSG(bad == 0, "index.Tensor (%s): %d values wrong", apart ? "apart" : "adjacent", bad);
        const float ibad[3] = {3, 0, (float)(apart ? A : B)}; /* past the dim: a run-time DJ_ERANGE */
        const float *in_bad[3] = {x, ibad, jv};
        CHECK(run_graph(cpu, w, in_bad, out, apart ? 2 * 3 * B : A * 6) == DJ_ERANGE);
    }
    /* a wrong declared shape, a bool index, more indices than dims: refused */
    w->n = 0;
    dj_test_w_map(w, 5), dj_test_w_str(w, "v"), dj_test_w_int(w, 1);
    dj_test_w_str(w, "inputs"), dj_test_w_arr(w, 2), w_spec(w, 3, ins[0].shape, "f32"),
        w_spec(w, 1, ins[1].shape, "bool");
    dj_test_w_str(w, "weights"), dj_test_w_arr(w, 0), dj_test_w_str(w, "nodes"), dj_test_w_arr(w, 1);
    w_node(w, "aten.index.Tensor", 2), w_in(w, 0), dj_test_w_arr(w, 1), w_in(w, 1);
    w_outs(w, 1), w_spec(w, 3, (const int64_t[]){3, B, C}, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_UNSUPPORTED, DJ_EUNSUPPORTED, 0);
    w->n = 0;
    dj_test_w_map(w, 5), dj_test_w_str(w, "v"), dj_test_w_int(w, 1);
    dj_test_w_str(w, "inputs"), dj_test_w_arr(w, 2), w_spec(w, 3, ins[0].shape, "f32"),
        w_spec(w, 1, ins[1].shape, "i64");
    dj_test_w_str(w, "weights"), dj_test_w_arr(w, 0), dj_test_w_str(w, "nodes"), dj_test_w_arr(w, 1);
    w_node(w, "aten.index.Tensor", 2), w_in(w, 0), dj_test_w_arr(w, 1), w_in(w, 1);
    w_outs(w, 1), w_spec(w, 3, (const int64_t[]){3, B, C + 1}, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_SHAPE, DJ_EINVAL, 0);
    w->n = 0;
    dj_test_w_map(w, 5), dj_test_w_str(w, "v"), dj_test_w_int(w, 1);
    dj_test_w_str(w, "inputs"), dj_test_w_arr(w, 2), w_spec(w, 3, ins[0].shape, "f32"),
        w_spec(w, 1, ins[1].shape, "i64");
    dj_test_w_str(w, "weights"), dj_test_w_arr(w, 0), dj_test_w_str(w, "nodes"), dj_test_w_arr(w, 1);
    w_node(w, "aten.index.Tensor", 2), w_in(w, 0), dj_test_w_arr(w, 4), w_in(w, 1), dj_test_w_nil(w), dj_test_w_nil(w),
        w_in(w, 1);
    w_outs(w, 1), w_spec(w, 1, (const int64_t[]){3}, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_ARG, DJ_EINVAL, 0);
    /* None in cat's list */
    const tspec two[2] = {{1, {3}}, {1, {3}}};
    w_head(w, 2, two, 1);
    w_node(w, "aten.cat.default", 2), dj_test_w_arr(w, 2), w_in(w, 0), dj_test_w_nil(w), dj_test_w_int(w, 0);
    w_outs(w, 1), w_spec(w, 1, (const int64_t[]){6}, "f32");
    w_tail_out(w, 0);
    CHECK_REFUSED(w, NULL, DJ_CGRAPH_ERR_ARG, DJ_EINVAL, 0);
    free(w);
}

int main(void) {
    dj_test_seeds();
    CHECK_OK(dj_backend_cpu_new(1, &cpu));
    test_refusals();
    test_addmm();
    test_conv();
    test_pool();
    test_norms_softmax();
    test_chain();
    test_plan_reuse();
    test_long_cat();
    test_bmm_slice_select();
    test_multi_output_and_indices();
    test_flip_sort_conv_transposed();
    test_index_tensor();
    dj_backend_free(cpu);
    return dj_test_finish("test_graph_exec");
}
