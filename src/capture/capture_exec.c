/* capture_exec.c: the CPU executor of captured graphs - each ATen op of the table in f32 on
 * contiguous row-major values at their planned stack offsets; GEMMs through the CPU backend. */
#include <math.h>
#include <string.h>

#include "capture/capture_impl.h"
#include "capture/capture_binop.h"

typedef struct run {
    const dj_cgraph_t *g;
    const float *const *inputs, *const *weights;
    uint8_t *stack;
    dj_backend_t *cpu;
} run;

static float *vp(const run *r, uint32_t v) {
    const dj_cgraph_t *g = r->g;
    if (v < g->n_inputs) return (float *)r->inputs[v];
    if (v < g->n_inputs + g->n_weights) return (float *)r->weights[v - g->n_inputs];
    return (float *)(r->stack + g->vals[v].offset);
}
static const dj_ctensor_info *vi(const run *r, uint32_t v) { return &r->g->vals[v].t; }

/* ---- strided iteration: out (contiguous, shape os) from a view of in with strides is ---- */

static void strided_copy(float *out, const float *in, uint32_t rank, const int64_t *os, const int64_t *is, uint64_t numel) {
    int64_t idx[DJ_CGRAPH_MAX_RANK] = {0};
    int64_t off = 0;
    for (uint64_t e = 0; e < numel; e++) {
        out[e] = in[off];
        for (int k = (int)rank - 1; k >= 0; k--) {
            if (++idx[k] < os[k]) {
                off += is[k];
                break;
            }
            off -= is[k] * (os[k] - 1);
            idx[k] = 0;
        }
    }
}

/* Strides of t seen as a tensor of rank r (leading dims added), 0 where t broadcasts. */
static void bcast_strides(const dj_ctensor_info *t, uint32_t r, const int64_t *os, int64_t *st) {
    int64_t s = 1;
    for (int k = (int)r - 1; k >= 0; k--) {
        const int j = k - (int)(r - t->rank);
        if (j < 0) {
            st[k] = 0;
            continue;
        }
        st[k] = t->shape[j] == 1 && os[k] != 1 ? 0 : s;
        s *= t->shape[j];
    }
}

static void contig_strides(const dj_ctensor_info *t, int64_t *st) {
    int64_t s = 1;
    for (int k = (int)t->rank - 1; k >= 0; k--) {
        st[k] = s;
        s *= t->shape[k];
    }
}

/* ---- elementwise ---- */

/* binop and bin1: capture_binop.h (the CUDA executor compiles the same) */

static void binary(const run *r, const dj__cnode *n, binop op, float *out) {
    const dj_ctensor_info *o = vi(r, n->out[0]);
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *a = vp(r, n->args[0].v);
    const float alpha = (op == BIN_ADD || op == BIN_SUB || op == BIN_RSUB) ? (float)n->args[2].f : 1.0f;
    if (n->args[1].kind != DJ_CARG_TENSOR) {
        const float b = (float)n->args[1].f;
        for (uint64_t e = 0; e < o->numel; e++) out[e] = bin1(op, a[e], b, alpha);
        return;
    }
    const dj_ctensor_info *y = vi(r, n->args[1].v);
    const float *b = vp(r, n->args[1].v);
    if (x->numel == o->numel && y->numel == o->numel) {
        for (uint64_t e = 0; e < o->numel; e++) out[e] = bin1(op, a[e], b[e], alpha);
        return;
    }
    if (x->numel == o->numel && y->numel == 1) {
        for (uint64_t e = 0; e < o->numel; e++) out[e] = bin1(op, a[e], b[0], alpha);
        return;
    }
    int64_t sa[DJ_CGRAPH_MAX_RANK], sb[DJ_CGRAPH_MAX_RANK], idx[DJ_CGRAPH_MAX_RANK] = {0};
    bcast_strides(x, o->rank, o->shape, sa);
    bcast_strides(y, o->rank, o->shape, sb);
    int64_t oa = 0, ob = 0;
    for (uint64_t e = 0; e < o->numel; e++) {
        out[e] = bin1(op, a[oa], b[ob], alpha);
        for (int k = (int)o->rank - 1; k >= 0; k--) {
            if (++idx[k] < o->shape[k]) {
                oa += sa[k];
                ob += sb[k];
                break;
            }
            oa -= sa[k] * (o->shape[k] - 1);
            ob -= sb[k] * (o->shape[k] - 1);
            idx[k] = 0;
        }
    }
}

static void unary(const run *r, const dj__cnode *n, float *out) {
    const float *x = vp(r, n->args[0].v);
    const uint64_t cnt = vi(r, n->out[0])->numel;
    switch (n->op) {
    case DJ_COP_RELU:
        for (uint64_t e = 0; e < cnt; e++) out[e] = x[e] > 0.0f ? x[e] : (x[e] == x[e] ? 0.0f : x[e]);
        break;
    case DJ_COP_GELU:
        if (!strcmp(n->args[1].str, "tanh")) {
            const float c = 0.7978845608028654f; /* sqrt(2/pi) */
            for (uint64_t e = 0; e < cnt; e++) {
                const float v = x[e];
                out[e] = 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
            }
        } else {
            for (uint64_t e = 0; e < cnt; e++) out[e] = 0.5f * x[e] * (1.0f + erff(x[e] * 0.70710678118654752f));
        }
        break;
    case DJ_COP_SILU:
        for (uint64_t e = 0; e < cnt; e++) out[e] = x[e] / (1.0f + expf(-x[e]));
        break;
    case DJ_COP_SIGMOID:
        for (uint64_t e = 0; e < cnt; e++) out[e] = 1.0f / (1.0f + expf(-x[e]));
        break;
    case DJ_COP_TANH:
        for (uint64_t e = 0; e < cnt; e++) out[e] = tanhf(x[e]);
        break;
    case DJ_COP_NEG:
        for (uint64_t e = 0; e < cnt; e++) out[e] = -x[e];
        break;
    case DJ_COP_EXP:
        for (uint64_t e = 0; e < cnt; e++) out[e] = expf(x[e]);
        break;
    case DJ_COP_HARDTANH: {
        const float lo = (float)n->args[1].f, hi = (float)n->args[2].f;
        for (uint64_t e = 0; e < cnt; e++) out[e] = x[e] < lo ? lo : x[e] > hi ? hi : x[e]; /* NaN stays NaN */
        break;
    }
    default: break;
    }
}

/* sqrt, rsqrt, abs, log, erf */
static void unary2(const run *r, const dj__cnode *n, float *out) {
    const float *x = vp(r, n->args[0].v);
    const uint64_t cnt = vi(r, n->out[0])->numel;
    for (uint64_t e = 0; e < cnt; e++) {
        const float v = x[e];
        switch (n->op) {
        case DJ_COP_SQRT: out[e] = sqrtf(v); break;
        case DJ_COP_RSQRT: out[e] = 1.0f / sqrtf(v); break;
        case DJ_COP_ABS: out[e] = fabsf(v); break;
        case DJ_COP_LOG: out[e] = logf(v); break;
        case DJ_COP_ERF: out[e] = erff(v); break;
        default: break;
        }
    }
}

/* where(cond, a, b) and masked_fill(a, cond, value): three operands broadcast to out */
static void select3(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *o = vi(r, n->out[0]);
    const bool where = n->op == DJ_COP_WHERE;
    const uint32_t cv = n->args[where ? 0 : 1].v, av = n->args[where ? 1 : 0].v;
    const float *c = vp(r, cv), *a = vp(r, av);
    float fill = 0.0f;
    const float *b = &fill;
    int64_t sc[DJ_CGRAPH_MAX_RANK], sa[DJ_CGRAPH_MAX_RANK], sb[DJ_CGRAPH_MAX_RANK] = {0}, idx[DJ_CGRAPH_MAX_RANK] = {0};
    bcast_strides(vi(r, cv), o->rank, o->shape, sc);
    bcast_strides(vi(r, av), o->rank, o->shape, sa);
    if (where) {
        b = vp(r, n->args[2].v);
        bcast_strides(vi(r, n->args[2].v), o->rank, o->shape, sb);
    } else if (n->op == DJ_COP_MASKED_FILL_T) {
        b = vp(r, n->args[2].v); /* 0-d: strides 0 */
    } else {
        fill = (float)n->args[2].f;
        if (vi(r, av)->dtype == DJ_CDTYPE_I64) fill = truncf(fill);
        else if (vi(r, av)->dtype == DJ_CDTYPE_BOOL) fill = fill != 0.0f;
    }
    int64_t oc = 0, oa = 0, ob = 0;
    for (uint64_t e = 0; e < o->numel; e++) {
        out[e] = c[oc] != 0.0f ? (where ? a[oa] : b[ob]) : (where ? b[ob] : a[oa]);
        for (int k = (int)o->rank - 1; k >= 0; k--) {
            if (++idx[k] < o->shape[k]) {
                oc += sc[k], oa += sa[k], ob += sb[k];
                break;
            }
            oc -= sc[k] * (o->shape[k] - 1), oa -= sa[k] * (o->shape[k] - 1), ob -= sb[k] * (o->shape[k] - 1);
            idx[k] = 0;
        }
    }
}

/* A value converted to dtype t as PyTorch stores it (i64 truncates, bool is != 0). */
static float as_dtype(double v, dj_cdtype t) {
    return t == DJ_CDTYPE_I64 ? (float)trunc(v) : t == DJ_CDTYPE_BOOL ? (v != 0.0 ? 1.0f : 0.0f) : (float)v;
}

static void fill_like(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *o = vi(r, n->out[0]);
    if (n->op == DJ_COP_TO_COPY) {
        const float *x = vp(r, n->args[0].v);
        for (uint64_t e = 0; e < o->numel; e++) out[e] = as_dtype(x[e], o->dtype);
        return;
    }
    if (n->op == DJ_COP_ARANGE || n->op == DJ_COP_ARANGE_START || n->op == DJ_COP_ARANGE_STEP) {
        const double start = n->op == DJ_COP_ARANGE ? 0.0 : n->args[0].f;
        const double step = n->op == DJ_COP_ARANGE_STEP ? n->args[2].f : 1.0;
        for (uint64_t e = 0; e < o->numel; e++) out[e] = as_dtype(start + (double)e * step, o->dtype);
        return;
    }
    double v = 0.0;
    if (n->op == DJ_COP_ONES || n->op == DJ_COP_ONES_LIKE) v = 1.0;
    else if (n->op == DJ_COP_FULL || n->op == DJ_COP_FULL_LIKE) v = n->args[1].f;
    const float f = as_dtype(v, o->dtype);
    for (uint64_t e = 0; e < o->numel; e++) out[e] = f;
}

/* ---- GEMMs: out[n,m] = x[n,k] @ w[m,k]^T (+ bias[m]) on the backend ---- */

static dj_status gemm(const run *r, uint32_t n, uint32_t m, uint32_t k, const float *x, const float *w, const float *bias,
                      float *out) {
    if (!n || !m) return DJ_OK;
    if (!k) {
        for (uint64_t e = 0; e < (uint64_t)n * m; e++) out[e] = bias ? bias[e % m] : 0.0f;
        return DJ_OK;
    }
    dj_op_call c = {.op = DJ_OP_MATMUL, .n = n, .out = out, .x = x, .w = w, .w_dtype = DJ_DTYPE_F32, .k = k, .m = m,
                    .bias = bias, .bias_dtype = DJ_DTYPE_F32, .out_dtype = DJ_DTYPE_F32};
    return dj_backend_compute(r->cpu, &c);
}

static void transpose2(float *out, const float *in, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) out[j * rows + i] = in[i * cols + j];
}

static dj_status mm(const run *r, const dj__cnode *n, float *out, float *scratch) {
    const bool add = n->op == DJ_COP_ADDMM;
    const dj_ctensor_info *a = vi(r, n->args[add].v);
    const dj_ctensor_info *o = vi(r, n->out[0]);
    const uint32_t rows = (uint32_t)a->shape[0], k = (uint32_t)a->shape[1], m = (uint32_t)o->shape[1];
    const float *w = vp(r, n->mat2_src);
    if (!n->mat2_t) {
        transpose2(scratch, w, k, m);
        w = scratch;
    }
    const float beta = add ? (float)n->args[3].f : 0.0f, alpha = add ? (float)n->args[4].f : 1.0f;
    const dj_ctensor_info *bi = add ? vi(r, n->args[0].v) : NULL;
    const bool row_bias = add && beta == 1.0f && alpha == 1.0f && bi->numel == m && (bi->rank == 1 || bi->shape[0] == 1);
    dj_status st = gemm(r, rows, m, k, vp(r, n->args[add].v), w, row_bias ? vp(r, n->args[0].v) : NULL, out);
    if (st != DJ_OK || !add || row_bias) return st;
    int64_t sb[DJ_CGRAPH_MAX_RANK];
    bcast_strides(bi, 2, o->shape, sb);
    const float *b = vp(r, n->args[0].v);
    for (int64_t i = 0; i < o->shape[0]; i++)
        for (int64_t j = 0; j < o->shape[1]; j++) {
            float *p = &out[i * o->shape[1] + j];
            *p = alpha * *p + (beta == 0.0f ? 0.0f : beta * b[i * sb[0] + j * sb[1]]);
        }
    return DJ_OK;
}

static dj_status bmm(const run *r, const dj__cnode *n, float *out, float *scratch) {
    const dj_ctensor_info *a = vi(r, n->args[0].v), *b = vi(r, n->args[1].v);
    const int64_t B = a->shape[0], N = a->shape[1], K = a->shape[2], M = b->shape[2];
    const float *ap = vp(r, n->args[0].v), *bp = vp(r, n->args[1].v);
    for (int64_t i = 0; i < B; i++) {
        transpose2(scratch, bp + i * K * M, K, M); /* [M, K]: GEMM rows */
        const dj_status st = gemm(r, (uint32_t)N, (uint32_t)M, (uint32_t)K, ap + i * N * K, scratch, NULL, out + i * N * M);
        if (st != DJ_OK) return st;
    }
    return DJ_OK;
}

static dj_status baddbmm(const run *r, const dj__cnode *n, float *out, float *scratch) {
    const dj_ctensor_info *a = vi(r, n->args[1].v), *b = vi(r, n->args[2].v), *o = vi(r, n->out[0]);
    const int64_t B = a->shape[0], N = a->shape[1], K = a->shape[2], M = b->shape[2];
    const float *ap = vp(r, n->args[1].v), *bp = vp(r, n->args[2].v);
    for (int64_t i = 0; i < B; i++) {
        transpose2(scratch, bp + i * K * M, K, M);
        const dj_status st = gemm(r, (uint32_t)N, (uint32_t)M, (uint32_t)K, ap + i * N * K, scratch, NULL, out + i * N * M);
        if (st != DJ_OK) return st;
    }
    const float beta = (float)n->args[3].f, alpha = (float)n->args[4].f;
    int64_t sb[DJ_CGRAPH_MAX_RANK], idx[3] = {0}, off = 0;
    bcast_strides(vi(r, n->args[0].v), 3, o->shape, sb);
    const float *c = vp(r, n->args[0].v);
    for (uint64_t e = 0; e < o->numel; e++) {
        out[e] = alpha * out[e] + (beta == 0.0f ? 0.0f : beta * c[off]); /* beta 0: the input is ignored, NaN too */
        for (int k = 2; k >= 0; k--) {
            if (++idx[k] < o->shape[k]) {
                off += sb[k];
                break;
            }
            off -= sb[k] * (o->shape[k] - 1);
            idx[k] = 0;
        }
    }
    return DJ_OK;
}

/* An index read at run time: it comes from the inputs, so it is checked (and wrapped if negative). */
static dj_status index_at(float v, int64_t size, const char *what, int64_t *out) {
    int64_t i = (int64_t)v;
    if (i < 0) i += size;
    if (!(v == v) || i < 0 || i >= size)
        return dj_fail(DJ_ERANGE, "captured graph: %s index %.0f out of range for size %lld", what, (double)v, (long long)size);
    *out = i;
    return DJ_OK;
}

static dj_status embedding(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *w = vi(r, n->args[0].v), *ix = vi(r, n->args[1].v);
    const float *wp = vp(r, n->args[0].v), *ip = vp(r, n->args[1].v);
    const int64_t D = w->shape[1];
    for (uint64_t e = 0; e < ix->numel; e++) {
        int64_t row;
        const float v = ip[e];
        if (v < 0 || v >= (float)w->shape[0] || v != v) /* embedding does not wrap negatives */
            return dj_fail(DJ_ERANGE, "captured graph: embedding index %.0f out of range for %lld rows", (double)v, (long long)w->shape[0]);
        row = (int64_t)v;
        memcpy(out + e * (uint64_t)D, wp + row * D, sizeof(float) * (size_t)D);
    }
    return DJ_OK;
}

/* gather and index_select */
static dj_status gather(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    const float *xp = vp(r, n->args[0].v), *ip = vp(r, n->args[2].v);
    if (!x->rank) { /* a 0-d tensor: index 0 (or -1) only */
        for (uint64_t e = 0; e < o->numel; e++) {
            int64_t i = 0;
            const dj_status st = index_at(ip[e], 1, n->op == DJ_COP_GATHER ? "gather" : "index_select", &i);
            if (st != DJ_OK) return st;
            out[e] = xp[0];
        }
        return DJ_OK;
    }
    const int64_t dim = n->args[1].i < 0 ? n->args[1].i + x->rank : n->args[1].i;
    int64_t xs[DJ_CGRAPH_MAX_RANK], idx[DJ_CGRAPH_MAX_RANK] = {0};
    contig_strides(x, xs);
    for (uint64_t e = 0; e < o->numel; e++) {
        int64_t i = 0;
        const float iv = n->op == DJ_COP_GATHER ? ip[e] : ip[idx[dim]];
        const dj_status st = index_at(iv, x->shape[dim], n->op == DJ_COP_GATHER ? "gather" : "index_select", &i);
        if (st != DJ_OK) return st;
        int64_t off = 0;
        for (uint32_t k = 0; k < o->rank; k++) off += ((int64_t)k == dim ? i : idx[k]) * xs[k];
        out[e] = xp[off];
        for (int k = (int)o->rank - 1; k >= 0; k--) {
            if (++idx[k] < o->shape[k]) break;
            idx[k] = 0;
        }
    }
    return DJ_OK;
}

/* split, split_with_sizes, unbind: each output a slab of x along dim */
static void split(const run *r, const dj__cnode *n) {
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *xp = vp(r, n->args[0].v);
    const int64_t i = n->args[n->op == DJ_COP_UNBIND ? 1 : 2].i, dim = i < 0 ? i + x->rank : i;
    int64_t inner = 1, outer = 1;
    for (uint32_t k = (uint32_t)dim + 1; k < x->rank; k++) inner *= x->shape[k];
    for (uint32_t k = 0; k < (uint32_t)dim; k++) outer *= x->shape[k];
    int64_t at = 0;
    for (uint32_t t = 0; t < n->n_out; t++) {
        float *out = (float *)(r->stack + r->g->vals[n->out[t]].offset);
        const dj_ctensor_info *o = vi(r, n->out[t]);
        const int64_t len = n->op == DJ_COP_UNBIND ? 1 : o->shape[dim];
        const int64_t chunk = len * inner;
        if (chunk)
            for (int64_t b = 0; b < outer; b++) memcpy(out + b * chunk, xp + (b * x->shape[dim] + at) * inner, sizeof(float) * (size_t)chunk);
        at += len;
    }
}

static void stack(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *o = vi(r, n->out[0]);
    const int64_t dim = n->args[1].i < 0 ? n->args[1].i + o->rank : n->args[1].i;
    int64_t chunk = 1, outer = 1;
    for (uint32_t k = (uint32_t)dim + 1; k < o->rank; k++) chunk *= o->shape[k];
    for (uint32_t k = 0; k < (uint32_t)dim; k++) outer *= o->shape[k];
    const uint32_t T = n->args[0].n;
    if (chunk)
        for (int64_t b = 0; b < outer; b++)
            for (uint32_t t = 0; t < T; t++) memcpy(out + (b * T + t) * chunk, vp(r, n->args[0].vals[t]) + b * chunk, sizeof(float) * (size_t)chunk);
}

/* topk by k rounds of selection over a copy of each row's indices in scratch: O(k * len). NaN
 * counts as the largest, as in PyTorch. */
static void topk(const run *r, const dj__cnode *n, float *vals, float *idxs, float *scratch) {
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *xp = vp(r, n->args[0].v);
    const int64_t k = n->args[1].i;
    const int64_t dim = x->rank ? (n->args[2].i < 0 ? n->args[2].i + x->rank : n->args[2].i) : 0;
    const bool largest = n->args[3].i != 0;
    const int64_t len = x->rank ? x->shape[dim] : 1;
    int64_t inner = 1;
    for (uint32_t j = (uint32_t)dim + 1; j < x->rank; j++) inner *= x->shape[j];
    const int64_t outer = (len * inner) != 0 ? (int64_t)(x->numel / (uint64_t)(len * inner)) : 0;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float *src = xp + o * len * inner + i;
            for (int64_t j = 0; j < len; j++) scratch[j] = (float)j;
            for (int64_t t = 0; t < k; t++) {
                int64_t best = t;
                for (int64_t j = t + 1; j < len; j++) {
                    const float v = src[(int64_t)scratch[j] * inner], b = src[(int64_t)scratch[best] * inner];
                    if (largest ? (v > b || (v != v && b == b)) : (v < b || (v != v && b == b))) best = j;
                }
                const float tmp = scratch[t];
                scratch[t] = scratch[best];
                scratch[best] = tmp;
                vals[(o * k + t) * inner + i] = src[(int64_t)scratch[t] * inner];
                idxs[(o * k + t) * inner + i] = scratch[t];
            }
        }
}

/* max.dim / min.dim (values and first index), cumsum (accumulated in double), along one dim */
static void along_dim(const run *r, const dj__cnode *n, float *out, float *idx_out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *xp = vp(r, n->args[0].v);
    const int64_t dim = x->rank ? (n->args[1].i < 0 ? n->args[1].i + x->rank : n->args[1].i) : 0;
    const int64_t len = x->rank ? x->shape[dim] : 1;
    int64_t inner = 1;
    for (uint32_t j = (uint32_t)dim + 1; j < x->rank; j++) inner *= x->shape[j];
    const int64_t outer = (len * inner) != 0 ? (int64_t)(x->numel / (uint64_t)(len * inner)) : 0;
    const bool mx = n->op == DJ_COP_MAX_DIM;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float *src = xp + o * len * inner + i;
            if (n->op == DJ_COP_CUMSUM) {
                double s = 0.0;
                for (int64_t j = 0; j < len; j++) {
                    s += src[j * inner];
                    out[o * len * inner + i + j * inner] = (float)s;
                }
                continue;
            }
            int64_t at = 0;
            for (int64_t j = 1; j < len; j++) {
                const float v = src[j * inner], b = src[at * inner];
                if (b != b) break; /* NaN wins, first one */
                if (v != v || (mx ? v > b : v < b)) at = j;
            }
            out[o * inner + i] = src[at * inner];
            idx_out[o * inner + i] = (float)at;
        }
}

static void tri(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *xp = vp(r, n->args[0].v);
    const int64_t R = x->shape[x->rank - 2], C = x->shape[x->rank - 1], diag = n->args[1].i;
    const int64_t mats = (R * C) != 0 ? (int64_t)(x->numel / (uint64_t)(R * C)) : 0;
    const bool lower = n->op == DJ_COP_TRIL;
    for (int64_t m = 0; m < mats; m++)
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
                const int64_t e = (m * R + i) * C + j;
                const bool keep = lower ? j - i <= diag : j - i >= diag; /* |diag| from the wire: no overflow, i, j < 2^31 */
                out[e] = keep ? xp[e] : 0.0f;
            }
}

/* amax, amin, var, logsumexp, norm, argmax: for each output, its reduced elements walked twice at most */
static void reduce2(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    const float *xp = vp(r, n->args[0].v);
    bool red[DJ_CGRAPH_MAX_RANK] = {0};
    const uint32_t dim_at = (n->op == DJ_COP_NORM || n->op == DJ_COP_VNORM) ? 2 : 1;
    const dj__carg *da = &n->args[dim_at];
    if (n->op == DJ_COP_ARGMAX && da->kind == DJ_CARG_INT) {
        if (x->rank) red[da->i < 0 ? da->i + x->rank : da->i] = true;
    } else if (da->kind != DJ_CARG_INTS || da->n == 0) {
        for (uint32_t k = 0; k < x->rank; k++) red[k] = true;
    } else if (x->rank) {
        for (uint32_t k = 0; k < da->n; k++) red[da->ints[k] < 0 ? da->ints[k] + x->rank : da->ints[k]] = true;
    }
    int64_t xs[DJ_CGRAPH_MAX_RANK], ks[DJ_CGRAPH_MAX_RANK], kd[DJ_CGRAPH_MAX_RANK], rs[DJ_CGRAPH_MAX_RANK], rd[DJ_CGRAPH_MAX_RANK];
    uint32_t nk = 0, nr = 0;
    uint64_t cnt = 1;
    contig_strides(x, xs);
    for (uint32_t k = 0; k < x->rank; k++) {
        if (red[k]) rs[nr] = xs[k], rd[nr++] = x->shape[k], cnt *= (uint64_t)x->shape[k];
        else ks[nk] = xs[k], kd[nk++] = x->shape[k];
    }
    double p = 2.0;
    if (n->op == DJ_COP_NORM || n->op == DJ_COP_VNORM) p = n->args[1].kind == DJ_CARG_NONE ? 2.0 : n->args[1].f;
    const double corr = n->op == DJ_COP_VAR ? (n->args[2].kind == DJ_CARG_NONE ? 1.0 : n->args[2].f) : 0.0;
    int64_t ki[DJ_CGRAPH_MAX_RANK] = {0}, base = 0;
    for (uint64_t e = 0; e < o->numel; e++) {
        double acc = 0.0, acc2 = 0.0;
        float best = 0.0f;
        int64_t at = -1;
        for (int pass = 0; pass < (n->op == DJ_COP_VAR || n->op == DJ_COP_LOGSUMEXP ? 2 : 1); pass++) {
            int64_t ri[DJ_CGRAPH_MAX_RANK] = {0}, off = base;
            for (uint64_t j = 0; j < cnt; j++) {
                const float v = xp[off];
                switch (n->op) {
                case DJ_COP_AMAX: case DJ_COP_ARGMAX:
                    if (at < 0 || v > best || (v != v && best == best)) best = v, at = (int64_t)j;
                    break;
                case DJ_COP_AMIN:
                    if (at < 0 || v < best || (v != v && best == best)) best = v, at = (int64_t)j;
                    break;
                case DJ_COP_VAR:
                    if (pass == 0) acc += v;
                    else acc2 += ((double)v - acc) * ((double)v - acc);
                    break;
                case DJ_COP_LOGSUMEXP:
                    if (pass == 0) {
                        if (at < 0 || v > best) best = v, at = 0;
                    } else {
                        acc += exp((double)v - (isinf(best) ? 0.0 : best));
                    }
                    break;
                default: { /* norms */
                    const double a = fabs((double)v);
                    if (isinf(p)) acc = p > 0 ? (a > acc || j == 0 ? a : acc) : (a < acc || j == 0 ? a : acc);
                    else if (p == 0.0) acc += a != 0.0;
                    else if (p == 1.0) acc += a;
                    else if (p == 2.0) acc += a * a;
                    else acc += pow(a, p);
                }
                }
                for (int k = (int)nr - 1; k >= 0; k--) {
                    if (++ri[k] < rd[k]) {
                        off += rs[k];
                        break;
                    }
                    off -= rs[k] * (rd[k] - 1);
                    ri[k] = 0;
                }
            }
            if (n->op == DJ_COP_VAR && pass == 0) acc = cnt ? acc / (double)cnt : NAN;
        }
        switch (n->op) {
        case DJ_COP_AMAX: case DJ_COP_AMIN: out[e] = best; break;
        case DJ_COP_ARGMAX: out[e] = (float)at; break;
        case DJ_COP_VAR: out[e] = (float)(acc2 / ((double)cnt - corr > 0 ? (double)cnt - corr : 0.0)); break;
        case DJ_COP_LOGSUMEXP: out[e] = cnt ? (float)(log(acc) + (isinf(best) ? 0.0 : best)) : -INFINITY; break;
        default:
            out[e] = (float)(isinf(p) || p == 0.0 || p == 1.0 ? acc : p == 2.0 ? sqrt(acc) : pow(acc, 1.0 / p));
        }
        for (int k = (int)nk - 1; k >= 0; k--) {
            if (++ki[k] < kd[k]) {
                base += ks[k];
                break;
            }
            base -= ks[k] * (kd[k] - 1);
            ki[k] = 0;
        }
    }
}

static void group_norm(const run *r, const dj__cnode *n, float *out, float *mean_out, float *rstd_out) {
    const float *xp = vp(r, n->args[0].v);
    const float *w = n->args[1].kind == DJ_CARG_TENSOR ? vp(r, n->args[1].v) : NULL;
    const float *b = n->args[2].kind == DJ_CARG_TENSOR ? vp(r, n->args[2].v) : NULL;
    const int64_t N = n->args[3].i, C = n->args[4].i, HW = n->args[5].i, G = n->args[6].i, Cg = C / G;
    const double eps = n->args[7].f;
    for (int64_t i = 0; i < N; i++)
        for (int64_t g = 0; g < G; g++) {
            const float *src = xp + (i * C + g * Cg) * HW;
            const int64_t m = Cg * HW;
            double s = 0.0, q = 0.0;
            for (int64_t j = 0; j < m; j++) s += src[j];
            const double mu = m ? s / (double)m : 0.0;
            for (int64_t j = 0; j < m; j++) q += (src[j] - mu) * (src[j] - mu);
            const float rstd = (float)(1.0 / sqrt((m ? q / (double)m : 0.0) + eps));
            for (int64_t c = 0; c < Cg; c++) {
                const int64_t ch = g * Cg + c;
                const float sc = rstd * (w ? w[ch] : 1.0f), sh = b ? b[ch] : 0.0f;
                float *dst = out + (i * C + ch) * HW;
                for (int64_t j = 0; j < HW; j++) dst[j] = (src[c * HW + j] - (float)mu) * sc + sh;
            }
            mean_out[i * G + g] = (float)mu;
            rstd_out[i * G + g] = rstd;
        }
}

/* The source coordinate of output index i (PyTorch's area_pixel_compute_source_index). */
static double up_scale(int64_t in, int64_t out, bool align, const dj__carg *sc, int k) {
    if (align) return out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0;
    if (sc->kind == DJ_CARG_FLOATS && sc->fls[k] > 0) return 1.0 / sc->fls[k];
    return (double)in / (double)out;
}

static void upsample(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    const float *xp = vp(r, n->args[0].v);
    const int64_t H = x->shape[2], W = x->shape[3], OH = o->shape[2], OW = o->shape[3];
    const int64_t planes = x->shape[0] * x->shape[1];
    if (n->op == DJ_COP_UP_NEAREST) {
        const float sh = (float)up_scale(H, OH, false, &n->args[2], 0), sw = (float)up_scale(W, OW, false, &n->args[2], 1);
        for (int64_t p = 0; p < planes; p++)
            for (int64_t i = 0; i < OH; i++) {
                int64_t si = (int64_t)floorf((float)i * sh);
                si = si < H - 1 ? si : H - 1;
                for (int64_t j = 0; j < OW; j++) {
                    int64_t sj = (int64_t)floorf((float)j * sw);
                    sj = sj < W - 1 ? sj : W - 1;
                    out[(p * OH + i) * OW + j] = xp[(p * H + si) * W + sj];
                }
            }
        return;
    }
    const bool align = n->args[2].i != 0;
    const float sh = (float)up_scale(H, OH, align, &n->args[3], 0), sw = (float)up_scale(W, OW, align, &n->args[3], 1);
    for (int64_t i = 0; i < OH; i++) {
        float fy = align ? sh * (float)i : sh * ((float)i + 0.5f) - 0.5f;
        fy = fy < 0 ? 0 : fy;
        const int64_t y0 = (int64_t)fy, y1 = y0 + (y0 < H - 1);
        const float ly = fy - (float)y0;
        for (int64_t j = 0; j < OW; j++) {
            float fx = align ? sw * (float)j : sw * ((float)j + 0.5f) - 0.5f;
            fx = fx < 0 ? 0 : fx;
            const int64_t x0 = (int64_t)fx, x1 = x0 + (x0 < W - 1);
            const float lx = fx - (float)x0;
            for (int64_t p = 0; p < planes; p++) {
                const float *img = xp + p * H * W;
                out[(p * OH + i) * OW + j] = (1 - ly) * ((1 - lx) * img[y0 * W + x0] + lx * img[y0 * W + x1]) +
                                             ly * ((1 - lx) * img[y1 * W + x0] + lx * img[y1 * W + x1]);
            }
        }
    }
}

/* slice (step > 0) and select: a strided view of x copied out */
static void take(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    int64_t xs[DJ_CGRAPH_MAX_RANK], is[DJ_CGRAPH_MAX_RANK];
    contig_strides(x, xs);
    const int64_t dim = n->args[1].i < 0 ? n->args[1].i + x->rank : n->args[1].i;
    const float *src = vp(r, n->args[0].v);
    if (n->op == DJ_COP_SELECT) {
        const int64_t idx = n->args[2].i < 0 ? n->args[2].i + x->shape[dim] : n->args[2].i;
        src += idx * xs[dim];
        for (uint32_t k = 0, j = 0; k < x->rank; k++)
            if ((int64_t)k != dim) is[j++] = xs[k];
    } else {
        int64_t first, len;
        const int64_t start = n->args[2].kind == DJ_CARG_INT ? n->args[2].i : 0;
        const int64_t end = n->args[3].kind == DJ_CARG_INT ? n->args[3].i : INT64_MAX;
        dj__slice_bounds(x->shape[dim], start, end, n->args[4].i, &first, &len);
        src += first * xs[dim];
        for (uint32_t k = 0; k < x->rank; k++) is[k] = xs[k];
        is[dim] = len > 1 ? xs[dim] * n->args[4].i : 0; /* len > 1: step < size, no overflow */
    }
    strided_copy(out, src, o->rank, o->shape, is, o->numel);
}

static dj_status linear(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *w = vi(r, n->args[1].v);
    const uint64_t k = (uint64_t)w->shape[1], rows = k ? x->numel / k : 0;
    return gemm(r, (uint32_t)rows, (uint32_t)w->shape[0], (uint32_t)k, vp(r, n->args[0].v), vp(r, n->args[1].v),
                n->args[2].kind == DJ_CARG_TENSOR ? vp(r, n->args[2].v) : NULL, out);
}

/* ---- convolution: per image and group, columns [OH*OW][C/g*KH*KW], then weight rows x columns ---- */

static int64_t arg_pair(const dj__carg *a, int i) { return a->n == 1 ? a->ints[0] : a->ints[i]; }

/* What convolution and its transpose read of their node: aten.convolution's
 * (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups). */
typedef struct conv_args {
    const dj_ctensor_info *x, *w, *o;
    const float *xp, *wp, *bias; /* bias NULL when None */
    int64_t sh, sw, ph, pw, dh, dw, groups;
} conv_args;

static conv_args conv_args_of(const run *r, const dj__cnode *n) {
    conv_args a;
    a.x = vi(r, n->args[0].v), a.w = vi(r, n->args[1].v), a.o = vi(r, n->out[0]);
    a.xp = vp(r, n->args[0].v), a.wp = vp(r, n->args[1].v);
    a.bias = n->args[2].kind == DJ_CARG_TENSOR ? vp(r, n->args[2].v) : NULL;
    a.sh = arg_pair(&n->args[3], 0), a.sw = arg_pair(&n->args[3], 1);
    a.ph = arg_pair(&n->args[4], 0), a.pw = arg_pair(&n->args[4], 1);
    a.dh = arg_pair(&n->args[5], 0), a.dw = arg_pair(&n->args[5], 1);
    a.groups = n->args[8].i;
    return a;
}

static dj_status conv(const run *r, const dj__cnode *n, float *out, float *cols) {
    const conv_args a = conv_args_of(r, n);
    const dj_ctensor_info *x = a.x, *w = a.w, *o = a.o;
    const float *xp = a.xp, *wp = a.wp, *bias = a.bias;
    const int64_t sh = a.sh, sw = a.sw, ph = a.ph, pw = a.pw, dh = a.dh, dw = a.dw, groups = a.groups;
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    const int64_t OC = w->shape[0], Cg = w->shape[1], KH = w->shape[2], KW = w->shape[3];
    const int64_t OH = o->shape[2], OW = o->shape[3], OCg = OC / groups, kk = Cg * KH * KW, P = OH * OW;
    for (int64_t b = 0; b < N; b++)
        for (int64_t gi = 0; gi < groups; gi++) {
            const float *img = xp + (b * C + gi * Cg) * H * W;
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    float *col = cols + (oh * OW + ow) * kk;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t i = 0; i < KH; i++) {
                            const int64_t ih = oh * sh - ph + i * dh;
                            for (int64_t j = 0; j < KW; j++) {
                                const int64_t iw = ow * sw - pw + j * dw;
                                *col++ = ih >= 0 && ih < H && iw >= 0 && iw < W ? img[(c * H + ih) * W + iw] : 0.0f;
                            }
                        }
                }
            float *dst = out + (b * OC + gi * OCg) * P;
            const dj_status st = gemm(r, (uint32_t)OCg, (uint32_t)P, (uint32_t)kk, wp + gi * OCg * kk, cols, NULL, dst);
            if (st != DJ_OK) return st;
            if (bias)
                for (int64_t c = 0; c < OCg; c++)
                    for (int64_t p = 0; p < P; p++) dst[c * P + p] += bias[gi * OCg + c];
        }
    return DJ_OK;
}

/* ---- pooling ---- */

static void pool(const run *r, const dj__cnode *n, float *out, float *idx_out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    const float *xp = vp(r, n->args[0].v);
    const uint32_t h = x->rank - 2;
    const int64_t H = x->shape[h], W = x->shape[h + 1], OH = o->shape[h], OW = o->shape[h + 1];
    const int64_t planes = (H * W) != 0 ? (int64_t)(x->numel / (uint64_t)(H * W)) : 0;
    const dj__carg *ka = &n->args[1], *sa = &n->args[2], *pa = &n->args[3];
    const int64_t kh = arg_pair(ka, 0), kw = arg_pair(ka, 1);
    const int64_t sh = sa->n ? arg_pair(sa, 0) : kh, sw = sa->n ? arg_pair(sa, 1) : kw;
    const int64_t ph = arg_pair(pa, 0), pw = arg_pair(pa, 1);
    const bool avg = n->op == DJ_COP_AVGPOOL;
    const int64_t dh = avg ? 1 : arg_pair(&n->args[4], 0), dw = avg ? 1 : arg_pair(&n->args[4], 1);
    const bool cip = avg && n->args[5].i;
    const int64_t divisor = avg && n->args[6].kind == DJ_CARG_INT ? n->args[6].i : 0;
    for (int64_t p = 0; p < planes; p++) {
        const float *img = xp + p * H * W;
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                float *dst = out + (p * OH + oh) * OW + ow;
                if (avg) {
                    int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
                    int64_t h1 = h0 + kh < H + ph ? h0 + kh : H + ph, w1 = w0 + kw < W + pw ? w0 + kw : W + pw;
                    const int64_t pool_size = (h1 - h0) * (w1 - w0);
                    h0 = h0 > 0 ? h0 : 0;
                    w0 = w0 > 0 ? w0 : 0;
                    h1 = h1 < H ? h1 : H;
                    w1 = w1 < W ? w1 : W;
                    float s = 0.0f;
                    for (int64_t i = h0; i < h1; i++)
                        for (int64_t j = w0; j < w1; j++) s += img[i * W + j];
                    const int64_t div = divisor ? divisor : cip ? pool_size : (h1 - h0) * (w1 - w0);
                    *dst = div ? s / (float)div : NAN;
                } else {
                    float best = -INFINITY;
                    int64_t at = -1;
                    /* only the window's taps inside the image: a huge padded window costs its overlap */
                    const int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
                    const int64_t i0 = h0 >= 0 ? 0 : (-h0 + dh - 1) / dh, j0 = w0 >= 0 ? 0 : (-w0 + dw - 1) / dw;
                    const int64_t i1 = h0 > H - 1 ? 0 : (H - 1 - h0) / dh + 1, j1 = w0 > W - 1 ? 0 : (W - 1 - w0) / dw + 1;
                    for (int64_t i = i0; i < (i1 < kh ? i1 : kh); i++) {
                        const int64_t ih = h0 + i * dh;
                        for (int64_t j = j0; j < (j1 < kw ? j1 : kw); j++) {
                            const int64_t iw = w0 + j * dw;
                            const float v = img[ih * W + iw];
                            if (v > best || at < 0 || v != v) {
                                best = v;
                                at = ih * W + iw;
                                if (v != v) goto done;
                            }
                        }
                    }
                done:
                    *dst = best;
                    if (idx_out) idx_out[dst - out] = (float)at;
                }
            }
    }
}

static void adaptive_avg(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    const float *xp = vp(r, n->args[0].v);
    const uint32_t h = x->rank - 2;
    const int64_t H = x->shape[h], W = x->shape[h + 1], OH = o->shape[h], OW = o->shape[h + 1];
    const int64_t planes = (H * W) != 0 ? (int64_t)(x->numel / (uint64_t)(H * W)) : 0;
    for (int64_t p = 0; p < planes; p++)
        for (int64_t oh = 0; oh < OH; oh++) {
            const int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
            for (int64_t ow = 0; ow < OW; ow++) {
                const int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
                float s = 0.0f;
                for (int64_t i = h0; i < h1; i++)
                    for (int64_t j = w0; j < w1; j++) s += xp[(p * H + i) * W + j];
                out[(p * OH + oh) * OW + ow] = s / (float)((h1 - h0) * (w1 - w0));
            }
        }
}

/* ---- normalisation and softmax ---- */

static void batch_norm(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *xp = vp(r, n->args[0].v);
    const float *w = n->args[1].kind == DJ_CARG_TENSOR ? vp(r, n->args[1].v) : NULL;
    const float *b = n->args[2].kind == DJ_CARG_TENSOR ? vp(r, n->args[2].v) : NULL;
    const float *mean = vp(r, n->args[3].v), *var = vp(r, n->args[4].v);
    const double eps = n->args[n->op == DJ_COP_BATCH_NORM ? 7 : 6].f;
    const int64_t C = x->shape[1];
    int64_t inner = 1;
    for (uint32_t k = 2; k < x->rank; k++) inner *= x->shape[k];
    const int64_t outer = (C * inner) != 0 ? (int64_t)(x->numel / (uint64_t)(C * inner)) : 0;
    for (int64_t c = 0; c < C; c++) {
        const float invstd = (float)(1.0 / sqrt((double)var[c] + eps));
        const float scale = invstd * (w ? w[c] : 1.0f), shift = b ? b[c] : 0.0f;
        for (int64_t o = 0; o < outer; o++) {
            const float *src = xp + (o * C + c) * inner;
            float *dst = out + (o * C + c) * inner;
            for (int64_t i = 0; i < inner; i++) dst[i] = (src[i] - mean[c]) * scale + shift;
        }
    }
}

static void layer_norm(const run *r, const dj__cnode *n, float *out, float *mean_out, float *rstd_out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *xp = vp(r, n->args[0].v);
    const float *w = n->args[2].kind == DJ_CARG_TENSOR ? vp(r, n->args[2].v) : NULL;
    const float *b = n->args[3].kind == DJ_CARG_TENSOR ? vp(r, n->args[3].v) : NULL;
    uint64_t d = 1;
    for (uint32_t k = 0; k < n->args[1].n; k++) d *= (uint64_t)n->args[1].ints[k];
    const uint64_t rows = d ? x->numel / d : 0;
    for (uint64_t i = 0; i < rows; i++) {
        const float *src = xp + i * d;
        double s = 0.0, q = 0.0;
        for (uint64_t j = 0; j < d; j++) s += src[j];
        const double mu = s / (double)d;
        for (uint64_t j = 0; j < d; j++) q += (src[j] - mu) * (src[j] - mu);
        const float rstd = (float)(1.0 / sqrt(q / (double)d + n->args[4].f));
        for (uint64_t j = 0; j < d; j++) out[i * d + j] = ((src[j] - (float)mu) * rstd) * (w ? w[j] : 1.0f) + (b ? b[j] : 0.0f);
        mean_out[i] = (float)mu;
        rstd_out[i] = rstd;
    }
}

static void softmax(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *xp = vp(r, n->args[0].v);
    const int64_t dim = n->args[1].i < 0 ? n->args[1].i + (int64_t)(x->rank ? x->rank : 1) : n->args[1].i;
    int64_t len = x->rank ? x->shape[dim] : 1, inner = 1;
    for (uint32_t k = (uint32_t)dim + 1; k < x->rank; k++) inner *= x->shape[k];
    const int64_t outer = (len * inner) != 0 ? (int64_t)(x->numel / (uint64_t)(len * inner)) : 0;
    const bool logs = n->op == DJ_COP_LOG_SOFTMAX;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float *src = xp + o * len * inner + i;
            float *dst = out + o * len * inner + i;
            float mx = -INFINITY;
            for (int64_t j = 0; j < len; j++) mx = src[j * inner] > mx ? src[j * inner] : mx;
            double s = 0.0;
            for (int64_t j = 0; j < len; j++) s += exp((double)src[j * inner] - mx);
            const double ls = log(s);
            for (int64_t j = 0; j < len; j++)
                dst[j * inner] = logs ? (float)((double)src[j * inner] - mx - ls) : (float)(exp((double)src[j * inner] - mx) / s);
        }
}

/* ---- layout ---- */

static void permute(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    int64_t xs[DJ_CGRAPH_MAX_RANK], is[DJ_CGRAPH_MAX_RANK];
    contig_strides(x, xs);
    const uint32_t rank = x->rank;
    uint32_t perm[DJ_CGRAPH_MAX_RANK];
    for (uint32_t k = 0; k < rank; k++) perm[k] = k;
    if (n->op == DJ_COP_PERMUTE) {
        for (uint32_t k = 0; k < rank; k++) {
            const int64_t d = n->args[1].ints[k];
            perm[k] = (uint32_t)(d < 0 ? d + rank : d);
        }
    } else if (rank >= 2) {
        int64_t a = n->op == DJ_COP_T ? 0 : n->args[1].i, b = n->op == DJ_COP_T ? 1 : n->args[2].i;
        a = a < 0 ? a + rank : a;
        b = b < 0 ? b + rank : b;
        perm[a] = (uint32_t)b;
        perm[b] = (uint32_t)a;
    }
    for (uint32_t k = 0; k < rank; k++) is[k] = xs[perm[k]];
    strided_copy(out, vp(r, n->args[0].v), rank, o->shape, is, o->numel);
}

static void expand(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *o = vi(r, n->out[0]);
    int64_t is[DJ_CGRAPH_MAX_RANK];
    bcast_strides(vi(r, n->args[0].v), o->rank, o->shape, is);
    strided_copy(out, vp(r, n->args[0].v), o->rank, o->shape, is, o->numel);
}

static void reduce(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    const float *xp = vp(r, n->args[0].v);
    bool red[DJ_CGRAPH_MAX_RANK] = {0};
    const bool all = n->op == DJ_COP_MEAN || n->op == DJ_COP_SUM || n->args[1].kind != DJ_CARG_INTS || n->args[1].n == 0;
    for (uint32_t k = 0; k < x->rank; k++) red[k] = all;
    if (!all)
        for (uint32_t k = 0; k < n->args[1].n; k++) {
            const int64_t d = n->args[1].ints[k];
            if (x->rank) red[d < 0 ? d + x->rank : d] = true;
        }
    /* strides into out of each input dim (0 where reduced) */
    int64_t os[DJ_CGRAPH_MAX_RANK], s = 1, idx[DJ_CGRAPH_MAX_RANK] = {0};
    for (int k = (int)x->rank - 1; k >= 0; k--) {
        os[k] = red[k] ? 0 : s;
        if (!red[k]) s *= x->shape[k];
    }
    for (uint64_t e = 0; e < o->numel; e++) out[e] = 0.0f;
    int64_t off = 0;
    for (uint64_t e = 0; e < x->numel; e++) {
        out[off] += xp[e];
        for (int k = (int)x->rank - 1; k >= 0; k--) {
            if (++idx[k] < x->shape[k]) {
                off += os[k];
                break;
            }
            off -= os[k] * (x->shape[k] - 1);
            idx[k] = 0;
        }
    }
    if (n->op == DJ_COP_MEAN || n->op == DJ_COP_MEAN_DIM) {
        const float cnt = o->numel ? (float)((double)x->numel / (double)o->numel) : 0.0f;
        for (uint64_t e = 0; e < o->numel; e++) out[e] = x->numel ? out[e] / cnt : NAN;
    }
}

static void cat(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *o = vi(r, n->out[0]);
    int64_t dim = n->args[1].i;
    dim = dim < 0 ? dim + o->rank : dim;
    int64_t inner = 1;
    for (uint32_t k = (uint32_t)dim + 1; k < o->rank; k++) inner *= o->shape[k];
    const int64_t outer = (o->shape[dim] * inner) != 0 ? (int64_t)(o->numel / (uint64_t)(o->shape[dim] * inner)) : 0;
    int64_t at = 0;
    for (uint32_t t = 0; t < n->args[0].n; t++) {
        const dj_ctensor_info *x = vi(r, n->args[0].vals[t]);
        if (x->rank != o->rank) continue; /* a legacy empty 1-d tensor */
        const float *xp = vp(r, n->args[0].vals[t]);
        const int64_t chunk = x->shape[dim] * inner;
        for (int64_t i = 0; i < outer; i++) memcpy(out + i * o->shape[dim] * inner + at, xp + i * chunk, sizeof(float) * (size_t)chunk);
        at += chunk;
    }
}

/* flip: every element read from the mirrored position on the flipped dims */
static void flip(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *xp = vp(r, n->args[0].v);
    bool fl[DJ_CGRAPH_MAX_RANK] = {0};
    for (uint32_t k = 0; k < n->args[1].n && x->rank; k++) {
        const int64_t dd = n->args[1].ints[k];
        fl[dd < 0 ? dd + x->rank : dd] = true;
    }
    int64_t xs[DJ_CGRAPH_MAX_RANK], idx[DJ_CGRAPH_MAX_RANK] = {0};
    contig_strides(x, xs);
    for (uint64_t e = 0; e < x->numel; e++) {
        int64_t off = 0;
        for (uint32_t k = 0; k < x->rank; k++) off += (fl[k] ? x->shape[k] - 1 - idx[k] : idx[k]) * xs[k];
        out[e] = xp[off];
        for (int k = (int)x->rank - 1; k >= 0; k--) {
            if (++idx[k] < x->shape[k]) break;
            idx[k] = 0;
        }
    }
}

/* a before b in sort's order: NaN is the largest value, as in PyTorch */
static bool sort_before(float a, float b, bool descending) {
    if (descending) return a > b || (a != a && b == b);
    return a < b || (b != b && a == a);
}

/* sort along a dim: a stable merge sort of each row's indices (equal values keep their order) */
static void sort_rows(const run *r, const dj__cnode *n, float *vals, float *idxs, int64_t *scratch) {
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *xp = vp(r, n->args[0].v);
    const uint32_t a = n->op == DJ_COP_SORT_STABLE;
    const int64_t dim = x->rank ? (n->args[1 + a].i < 0 ? n->args[1 + a].i + x->rank : n->args[1 + a].i) : 0;
    const bool desc = n->args[2 + a].i != 0;
    const int64_t len = x->rank ? x->shape[dim] : 1;
    int64_t inner = 1;
    for (uint32_t j = (uint32_t)dim + 1; j < x->rank; j++) inner *= x->shape[j];
    const int64_t outer = (len * inner) != 0 ? (int64_t)(x->numel / (uint64_t)(len * inner)) : 0;
    int64_t *ix = scratch, *tmp = scratch + len;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float *src = xp + o * len * inner + i;
            for (int64_t j = 0; j < len; j++) ix[j] = j;
            for (int64_t w = 1; w < len; w *= 2) {
                for (int64_t lo = 0; lo < len; lo += 2 * w) {
                    const int64_t mid = lo + w < len ? lo + w : len, hi = lo + 2 * w < len ? lo + 2 * w : len;
                    int64_t p = lo, q = mid, t = lo;
                    while (p < mid && q < hi) /* the right one first only when strictly before: stable */
                        tmp[t++] = sort_before(src[ix[q] * inner], src[ix[p] * inner], desc) ? ix[q++] : ix[p++];
                    while (p < mid) tmp[t++] = ix[p++];
                    while (q < hi) tmp[t++] = ix[q++];
                }
                int64_t *sw = ix;
                ix = tmp;
                tmp = sw;
            }
            for (int64_t j = 0; j < len; j++) {
                vals[(o * len + j) * inner + i] = src[ix[j] * inner];
                idxs[(o * len + j) * inner + i] = (float)ix[j];
            }
            ix = scratch, tmp = scratch + len;
        }
}

/* transposed 2-d convolution: each input element scattered through the kernel (the reference loop) */
static void conv_transposed(const run *r, const dj__cnode *n, float *out) {
    const conv_args a = conv_args_of(r, n);
    const dj_ctensor_info *x = a.x, *w = a.w, *o = a.o;
    const float *xp = a.xp, *wp = a.wp, *bias = a.bias;
    const int64_t sh = a.sh, sw = a.sw, ph = a.ph, pw = a.pw, dh = a.dh, dw = a.dw, groups = a.groups;
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    const int64_t Cg = C / groups, OCg = w->shape[1], KH = w->shape[2], KW = w->shape[3];
    const int64_t OC = o->shape[1], OH = o->shape[2], OW = o->shape[3];
    for (int64_t b = 0; b < N; b++)
        for (int64_t c = 0; c < OC; c++)
            for (int64_t p = 0; p < OH * OW; p++) out[(b * OC + c) * OH * OW + p] = bias ? bias[c] : 0.0f;
    for (int64_t b = 0; b < N; b++)
        for (int64_t gi = 0; gi < groups; gi++)
            for (int64_t ci = 0; ci < Cg; ci++) {
                const float *img = xp + (b * C + gi * Cg + ci) * H * W;
                const float *wk = wp + (gi * Cg + ci) * OCg * KH * KW;
                for (int64_t ih = 0; ih < H; ih++)
                    for (int64_t iw = 0; iw < W; iw++) {
                        const float v = img[ih * W + iw];
                        for (int64_t oc = 0; oc < OCg; oc++) {
                            float *dst = out + (b * OC + gi * OCg + oc) * OH * OW;
                            for (int64_t i = 0; i < KH; i++) {
                                const int64_t oh = ih * sh - ph + i * dh;
                                if (oh < 0 || oh >= OH) continue;
                                for (int64_t j = 0; j < KW; j++) {
                                    const int64_t ow = iw * sw - pw + j * dw;
                                    if (ow >= 0 && ow < OW) dst[oh * OW + ow] += v * wk[(oc * KH + i) * KW + j];
                                }
                            }
                        }
                    }
            }
}

/* index.Tensor with integer indices: out[...b...] = x[i0[b], :, i2[b], ...] (None keeps a dim whole);
 * the broadcast index dims stand where the indices were when they are adjacent, else first */
static dj_status index_tensor(const run *r, const dj__cnode *n, float *out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    const float *xp = vp(r, n->args[0].v);
    const dj__carg *L = &n->args[1];
    int first = -1, last = -1;
    bool gap = false;
    uint32_t indexed = 0;
    for (uint32_t k = 0; k < L->n; k++) {
        if (L->vals[k] == DJ_CARG_HOLE) continue;
        if (last >= 0 && (int)k != last + 1) gap = true;
        if (first < 0) first = (int)k;
        last = (int)k;
        indexed++;
    }
    const uint32_t nb = o->rank - (x->rank - indexed); /* the broadcast dims */
    const uint32_t bpos = gap ? 0 : (uint32_t)first;   /* where they start in the output */
    int64_t xs[DJ_CGRAPH_MAX_RANK], od[DJ_CGRAPH_MAX_RANK]; /* od: the output dim of each whole x dim */
    contig_strides(x, xs);
    for (uint32_t k = 0, at = nb; k < x->rank; k++) {
        if (k < L->n && L->vals[k] != DJ_CARG_HOLE) od[k] = -1;
        else if (gap) od[k] = at++;                        /* [broadcast dims, whole dims in order] */
        else od[k] = (int)k < first ? (int64_t)k : (int64_t)(k - indexed + nb); /* in place */
    }
    /* each index tensor's strides over the broadcast dims (0 where it broadcasts) */
    int64_t is[DJ_CGRAPH_MAX_RANK][DJ_CGRAPH_MAX_RANK] = {{0}};
    for (uint32_t k = 0; k < L->n && k < x->rank; k++) {
        if (L->vals[k] == DJ_CARG_HOLE) continue;
        const dj_ctensor_info *t = vi(r, L->vals[k]);
        int64_t st = 1;
        for (int j = (int)t->rank - 1; j >= 0; j--) {
            const uint32_t bj = nb - t->rank + (uint32_t)j;
            is[k][bj] = t->shape[j] == 1 ? 0 : st;
            st *= t->shape[j];
        }
    }
    int64_t idx[DJ_CGRAPH_MAX_RANK] = {0};
    for (uint64_t e = 0; e < o->numel; e++) {
        int64_t off = 0;
        for (uint32_t k = 0; k < x->rank; k++) {
            if (od[k] >= 0) {
                off += idx[od[k]] * xs[k];
                continue;
            }
            int64_t at = 0;
            for (uint32_t j = 0; j < nb; j++) at += idx[bpos + j] * is[k][j];
            int64_t i = 0;
            const dj_status st = index_at(vp(r, L->vals[k])[at], x->shape[k], "index.Tensor", &i);
            if (st != DJ_OK) return st;
            off += i * xs[k];
        }
        out[e] = xp[off];
        for (int k = (int)o->rank - 1; k >= 0; k--) {
            if (++idx[k] < o->shape[k]) break;
            idx[k] = 0;
        }
    }
    return DJ_OK;
}

/* torch 1.13's _scaled_dot_product_attention_forward: per batch and query row, scores against
 * every key scaled by 1/sqrt(E), the mask added (f32) or applied (bool: true attends) or the
 * causal triangle (key j > query i dropped), a softmax written as the weights (output 1), then
 * the weighted sum of the values (output 0). */
static void sdpa(const run *r, const dj__cnode *n, float *out, float *w) {
    const dj_ctensor_info *q = vi(r, n->args[0].v), *k = vi(r, n->args[1].v), *v = vi(r, n->args[2].v);
    const dj_ctensor_info *ow = vi(r, n->out[1]);
    const uint32_t rk = q->rank;
    const int64_t L = q->shape[rk - 2], E = q->shape[rk - 1], S = k->shape[rk - 2], Ev = v->shape[rk - 1];
    const int64_t B = (L * E) != 0 ? (int64_t)(q->numel / (uint64_t)(L * E)) : 0;
    const float *qp = vp(r, n->args[0].v), *kp = vp(r, n->args[1].v), *vv = vp(r, n->args[2].v);
    const bool causal = n->args[6].i != 0;
    const float *mp = NULL;
    bool mbool = false;
    int64_t ms[DJ_CGRAPH_MAX_RANK] = {0};
    if (n->args[3].kind == DJ_CARG_TENSOR) {
        mp = vp(r, n->args[3].v);
        mbool = vi(r, n->args[3].v)->dtype == DJ_CDTYPE_BOOL;
        bcast_strides(vi(r, n->args[3].v), ow->rank, ow->shape, ms);
    }
    const float scale = 1.0f / sqrtf((float)E);
    for (int64_t b = 0; b < B; b++) {
        int64_t moff = 0; /* the mask's offset of batch b: its batch index unravelled */
        for (int64_t rem = b, kk = (int64_t)rk - 3; kk >= 0; kk--) {
            moff += (rem % ow->shape[kk]) * ms[kk];
            rem /= ow->shape[kk];
        }
        for (int64_t i = 0; i < L; i++) {
            const float *qi = qp + (b * L + i) * E;
            float *wi = w + (b * L + i) * S;
            float mx = -INFINITY;
            for (int64_t j = 0; j < S; j++) {
                const float *kj = kp + (b * S + j) * E;
                float s = 0.0f;
                for (int64_t e = 0; e < E; e++) s += qi[e] * kj[e];
                s *= scale;
                if (causal && j > i) s = -INFINITY;
                if (mp) {
                    const float m = mp[moff + i * ms[rk - 2] + j * ms[rk - 1]];
                    s = mbool ? (m != 0.0f ? s : -INFINITY) : s + m;
                }
                wi[j] = s;
                if (s > mx) mx = s;
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < S; j++) sum += (wi[j] = expf(wi[j] - mx));
            float *oi = out + (b * L + i) * Ev;
            for (int64_t e = 0; e < Ev; e++) oi[e] = 0.0f;
            for (int64_t j = 0; j < S; j++) {
                const float p = (wi[j] /= sum);
                const float *vj = vv + (b * S + j) * Ev;
                for (int64_t e = 0; e < Ev; e++) oi[e] += p * vj[e];
            }
        }
    }
}

static dj_status exec_node(const run *r, const dj__cnode *n) {
    float *out = (float *)(r->stack + r->g->vals[n->out[0]].offset);
    float *scratch = (float *)(r->stack + n->scratch_off);
    switch (n->op) {
    case DJ_COP_ADDMM: case DJ_COP_MM: return mm(r, n, out, scratch);
    case DJ_COP_LINEAR: return linear(r, n, out);
    case DJ_COP_BMM: return bmm(r, n, out, scratch);
    case DJ_COP_SLICE: case DJ_COP_SELECT: take(r, n, out); break;
    case DJ_COP_ADD_T: case DJ_COP_ADD_S: binary(r, n, BIN_ADD, out); break;
    case DJ_COP_SUB_T: case DJ_COP_SUB_S: binary(r, n, BIN_SUB, out); break;
    case DJ_COP_MUL_T: case DJ_COP_MUL_S: binary(r, n, BIN_MUL, out); break;
    case DJ_COP_DIV_T: case DJ_COP_DIV_S: binary(r, n, BIN_DIV, out); break;
    case DJ_COP_GT_T: case DJ_COP_GT_S: binary(r, n, BIN_GT, out); break;
    case DJ_COP_LT_T: case DJ_COP_LT_S: binary(r, n, BIN_LT, out); break;
    case DJ_COP_GE_S: binary(r, n, BIN_GE, out); break;
    case DJ_COP_LE_S: binary(r, n, BIN_LE, out); break;
    case DJ_COP_RELU: case DJ_COP_GELU: case DJ_COP_SILU: case DJ_COP_SIGMOID: case DJ_COP_TANH: case DJ_COP_NEG:
    case DJ_COP_EXP: case DJ_COP_HARDTANH: unary(r, n, out); break;
    case DJ_COP_CONV:
        if (n->args[6].i) {
            conv_transposed(r, n, out);
            break;
        }
        return conv(r, n, out, scratch);
    case DJ_COP_FLIP: flip(r, n, out); break;
    case DJ_COP_INDEX: return index_tensor(r, n, out);
    case DJ_COP_SORT: case DJ_COP_SORT_STABLE:
        sort_rows(r, n, out, (float *)(r->stack + r->g->vals[n->out[1]].offset), (int64_t *)(void *)scratch);
        break;
    case DJ_COP_MAXPOOL_IDX: pool(r, n, out, (float *)(r->stack + r->g->vals[n->out[1]].offset)); break;
    case DJ_COP_MAXPOOL: case DJ_COP_AVGPOOL: pool(r, n, out, NULL); break;
    case DJ_COP_ADAPTIVE_AVG: case DJ_COP_ADAPTIVE_AVG2: adaptive_avg(r, n, out); break;
    case DJ_COP_BATCH_NORM: case DJ_COP_BATCH_NORM_EVAL:
        batch_norm(r, n, out);
        for (int k = 1; k < 3; k++) /* save_mean / save_invstd: eval mode has none; zeros, not garbage */
            memset(r->stack + r->g->vals[n->out[k]].offset, 0, sizeof(float) * r->g->vals[n->out[k]].t.numel);
        break;
    case DJ_COP_LAYER_NORM:
        layer_norm(r, n, out, (float *)(r->stack + r->g->vals[n->out[1]].offset),
                   (float *)(r->stack + r->g->vals[n->out[2]].offset));
        break;
    case DJ_COP_SOFTMAX: case DJ_COP_LOG_SOFTMAX: softmax(r, n, out); break;
    case DJ_COP_VIEW: case DJ_COP_RESHAPE: case DJ_COP_UNSAFE_VIEW: case DJ_COP_RESHAPE_ALIAS: case DJ_COP_FLATTEN:
    case DJ_COP_UNSQUEEZE: case DJ_COP_SQUEEZE_DIM: case DJ_COP_CLONE: case DJ_COP_DETACH: case DJ_COP_ALIAS: {
        const uint64_t cnt = vi(r, n->out[0])->numel;
        if (cnt) memcpy(out, vp(r, n->args[0].v), sizeof(float) * cnt);
        break;
    }
    case DJ_COP_PERMUTE: case DJ_COP_TRANSPOSE: case DJ_COP_T: permute(r, n, out); break;
    case DJ_COP_EXPAND: expand(r, n, out); break;
    case DJ_COP_MEAN_DIM: case DJ_COP_SUM_DIM: case DJ_COP_MEAN: case DJ_COP_SUM: reduce(r, n, out); break;
    case DJ_COP_CAT: cat(r, n, out); break;
    case DJ_COP_EQ_T: case DJ_COP_EQ_S: binary(r, n, BIN_EQ, out); break;
    case DJ_COP_NE_T: case DJ_COP_NE_S: binary(r, n, BIN_NE, out); break;
    case DJ_COP_GE_T: binary(r, n, BIN_GE, out); break;
    case DJ_COP_LE_T: binary(r, n, BIN_LE, out); break;
    case DJ_COP_POW_TS: case DJ_COP_POW_TT: binary(r, n, BIN_POW, out); break;
    case DJ_COP_SQRT: case DJ_COP_RSQRT: case DJ_COP_ABS: case DJ_COP_LOG: case DJ_COP_ERF: unary2(r, n, out); break;
    case DJ_COP_WHERE: case DJ_COP_MASKED_FILL_S: case DJ_COP_MASKED_FILL_T: select3(r, n, out); break;
    case DJ_COP_TO_COPY: case DJ_COP_ZEROS_LIKE: case DJ_COP_ONES_LIKE: case DJ_COP_FULL_LIKE: case DJ_COP_ARANGE:
    case DJ_COP_ARANGE_START: case DJ_COP_ARANGE_STEP: case DJ_COP_ZEROS: case DJ_COP_ONES: case DJ_COP_FULL:
        fill_like(r, n, out);
        break;
    case DJ_COP_EMBEDDING: return embedding(r, n, out);
    case DJ_COP_BADDBMM: return baddbmm(r, n, out, scratch);
    case DJ_COP_GROUP_NORM:
        group_norm(r, n, out, (float *)(r->stack + r->g->vals[n->out[1]].offset), (float *)(r->stack + r->g->vals[n->out[2]].offset));
        break;
    case DJ_COP_UP_NEAREST: case DJ_COP_UP_BILINEAR: upsample(r, n, out); break;
    case DJ_COP_VAR: case DJ_COP_AMAX: case DJ_COP_AMIN: case DJ_COP_ARGMAX: case DJ_COP_LOGSUMEXP: case DJ_COP_NORM:
    case DJ_COP_VNORM: reduce2(r, n, out); break;
    case DJ_COP_STACK: stack(r, n, out); break;
    case DJ_COP_GATHER: case DJ_COP_INDEX_SELECT: return gather(r, n, out);
    case DJ_COP_SPLIT: case DJ_COP_SPLIT_SIZES: case DJ_COP_UNBIND: split(r, n); break;
    case DJ_COP_RSUB_S: binary(r, n, BIN_RSUB, out); break;
    case DJ_COP_MAX_DIM: case DJ_COP_MIN_DIM: along_dim(r, n, out, (float *)(r->stack + r->g->vals[n->out[1]].offset)); break;
    case DJ_COP_CUMSUM: along_dim(r, n, out, NULL); break;
    case DJ_COP_TRIL: case DJ_COP_TRIU: tri(r, n, out); break;
    case DJ_COP_TOPK: topk(r, n, out, (float *)(r->stack + r->g->vals[n->out[1]].offset), scratch); break;
    case DJ_COP_SDPA: sdpa(r, n, out, (float *)(r->stack + r->g->vals[n->out[1]].offset)); break;
    case DJ_COP_COUNT: return dj_fail(DJ_EINTERNAL, "captured graph: no such op");
    }
    return DJ_OK;
}

dj_status dj_cgraph_run(const dj_cgraph_t *g, dj_backend_t *cpu, const float *const *inputs, const float *const *weights,
                        void *stack, const float **outs) {
    if (!cpu || !cpu->host_memory) return dj_fail(DJ_EINVAL, "captured graphs run on a CPU backend");
    const run r = {g, inputs, weights, stack, cpu};
    for (uint32_t j = 0; j < g->n_nodes; j++) {
        if (!g->nodes[j].live) continue;
        const dj_status st = exec_node(&r, &g->nodes[j]);
        if (st != DJ_OK) return st;
    }
    for (uint32_t i = 0; i < g->n_outputs; i++) outs[i] = vp(&r, g->outputs[i]);
    return DJ_OK;
}
