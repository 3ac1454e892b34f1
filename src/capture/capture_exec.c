/* capture_exec.c: the CPU executor of captured graphs - each ATen op of the table in f32 on
 * contiguous row-major values at their planned stack offsets; GEMMs through the CPU backend. */
#include <math.h>
#include <string.h>

#include "capture/capture_impl.h"

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

typedef enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_GT, BIN_LT, BIN_GE, BIN_LE } binop;

static inline float bin1(binop op, float a, float b, float alpha) {
    switch (op) {
    case BIN_ADD: return a + alpha * b;
    case BIN_SUB: return a - alpha * b;
    case BIN_MUL: return a * b;
    case BIN_DIV: return a / b;
    case BIN_GT: return a > b ? 1.0f : 0.0f;
    case BIN_LT: return a < b ? 1.0f : 0.0f;
    case BIN_GE: return a >= b ? 1.0f : 0.0f;
    case BIN_LE: return a <= b ? 1.0f : 0.0f;
    }
    return 0.0f;
}

static void binary(const run *r, const dj__cnode *n, binop op, float *out) {
    const dj_ctensor_info *o = vi(r, n->out[0]);
    const dj_ctensor_info *x = vi(r, n->args[0].v);
    const float *a = vp(r, n->args[0].v);
    const float alpha = (op == BIN_ADD || op == BIN_SUB) ? (float)n->args[2].f : 1.0f;
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

static dj_status conv(const run *r, const dj__cnode *n, float *out, float *cols) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *w = vi(r, n->args[1].v), *o = vi(r, n->out[0]);
    const float *xp = vp(r, n->args[0].v), *wp = vp(r, n->args[1].v);
    const float *bias = n->args[2].kind == DJ_CARG_TENSOR ? vp(r, n->args[2].v) : NULL;
    const int64_t sh = arg_pair(&n->args[3], 0), sw = arg_pair(&n->args[3], 1);
    const int64_t ph = arg_pair(&n->args[4], 0), pw = arg_pair(&n->args[4], 1);
    const int64_t dh = arg_pair(&n->args[5], 0), dw = arg_pair(&n->args[5], 1);
    const int64_t groups = n->args[8].i;
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
    case DJ_COP_CONV: return conv(r, n, out, scratch);
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
