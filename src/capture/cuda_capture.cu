/* cuda_capture.cu: the CUDA executor of captured graphs (capture.h, dj_cgraph_run_cuda) - each
 * node of a planned graph on the GPU in f32, at the plan's stack offsets; cuBLAS for GEMMs. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_impl.h"

extern "C" {
#include "capture/capture_impl.h"
#include "capture/capture_binop.h"
}

#define TPB 256

typedef struct shp {
    int rank;
    int64_t d[DJ_CGRAPH_MAX_RANK];
} shp;

/* A strided operand: element (i0..ir) of the iteration shape is at base + sum i_k * st[k]. */
typedef struct sv {
    int64_t st[DJ_CGRAPH_MAX_RANK];
    int64_t base;
} sv;

__device__ __forceinline__ int64_t sv_at(const shp &s, const sv &v, int64_t e) {
    int64_t off = v.base;
    for (int k = s.rank - 1; k >= 0; k--) {
        const int64_t i = e % s.d[k];
        e /= s.d[k];
        off += i * v.st[k];
    }
    return off;
}

static unsigned blocks_for(uint64_t n) {
    const uint64_t b = (n + TPB - 1) / TPB;
    return (unsigned)(b > 1048576 ? 1048576 : b ? b : 1);
}

#define GRID_LOOP(e, n) for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < (int64_t)(n); e += (int64_t)gridDim.x * blockDim.x)

/* ---- host-side views ---- */

static shp shp_of(const dj_ctensor_info *t) {
    shp s;
    memset(&s, 0, sizeof s);
    s.rank = (int)t->rank;
    for (uint32_t k = 0; k < t->rank; k++) s.d[k] = t->shape[k];
    return s;
}
static sv sv_contig(const dj_ctensor_info *t) {
    sv v;
    memset(&v, 0, sizeof v);
    int64_t s = 1;
    for (int k = (int)t->rank - 1; k >= 0; k--) {
        v.st[k] = s;
        s *= t->shape[k];
    }
    return v;
}
/* t read broadcast over a shape of rank r (leading dims added), stride 0 where it broadcasts */
static sv sv_bcast(const dj_ctensor_info *t, const shp &o) {
    sv v;
    memset(&v, 0, sizeof v);
    int64_t s = 1;
    for (int k = o.rank - 1; k >= 0; k--) {
        const int j = k - (o.rank - (int)t->rank);
        if (j < 0) continue;
        v.st[k] = t->shape[j] == 1 && o.d[k] != 1 ? 0 : s;
        s *= t->shape[j];
    }
    return v;
}

/* ---- kernels ---- */

static __global__ void k_copy(float *out, shp s, sv so, const float *in, sv si, int64_t n) {
    GRID_LOOP(e, n) out[sv_at(s, so, e)] = in[sv_at(s, si, e)];
}

/* binop and bin1: capture_binop.h (the CPU executor compiles the same) */

static __global__ void k_binary(float *out, shp s, const float *a, sv sa, const float *b, sv sb, float bs, int op,
                                float alpha, int64_t n) {
    GRID_LOOP(e, n) out[e] = bin1(op, a[sv_at(s, sa, e)], b ? b[sv_at(s, sb, e)] : bs, alpha);
}

static __global__ void k_unary(float *out, const float *x, int op, float p1, float p2, int tanh_gelu, int64_t n) {
    GRID_LOOP(e, n) {
        const float v = x[e];
        float r = 0.0f;
        switch (op) {
        case DJ_COP_RELU: r = v > 0.0f ? v : (v == v ? 0.0f : v); break;
        case DJ_COP_GELU:
            r = tanh_gelu ? 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                          : 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
            break;
        case DJ_COP_SILU: r = v / (1.0f + expf(-v)); break;
        case DJ_COP_SIGMOID: r = 1.0f / (1.0f + expf(-v)); break;
        case DJ_COP_TANH: r = tanhf(v); break;
        case DJ_COP_NEG: r = -v; break;
        case DJ_COP_EXP: r = expf(v); break;
        case DJ_COP_HARDTANH: r = v < p1 ? p1 : v > p2 ? p2 : v; break;
        case DJ_COP_SQRT: r = sqrtf(v); break;
        case DJ_COP_RSQRT: r = 1.0f / sqrtf(v); break;
        case DJ_COP_ABS: r = fabsf(v); break;
        case DJ_COP_LOG: r = logf(v); break;
        case DJ_COP_ERF: r = erff(v); break;
        default: break;
        }
        out[e] = r;
    }
}

/* where(c, a, b) (where = 1) or masked_fill(a, c, b) */
static __global__ void k_select3(float *out, shp s, const float *c, sv sc, const float *a, sv sa, const float *b, sv sb,
                                 float fill, int where, int64_t n) {
    GRID_LOOP(e, n) {
        const float bv = b ? b[sv_at(s, sb, e)] : fill, av = a[sv_at(s, sa, e)];
        const bool t = c[sv_at(s, sc, e)] != 0.0f;
        out[e] = t ? (where ? av : bv) : (where ? bv : av);
    }
}

static __device__ __forceinline__ float as_dtype(double v, int t) {
    return t == DJ_CDTYPE_I64 ? (float)trunc(v) : t == DJ_CDTYPE_BOOL ? (v != 0.0 ? 1.0f : 0.0f) : (float)v;
}

/* mode 0: out = v; 1: arange start + e * step; 2: a cast of x */
static __global__ void k_fill(float *out, const float *x, int mode, double v, double step, int dtype, int64_t n) {
    GRID_LOOP(e, n) out[e] = mode == 0 ? (float)v : mode == 1 ? as_dtype(v + (double)e * step, dtype) : as_dtype(x[e], dtype);
}

/* out = alpha * out + beta * c (broadcast); beta 0 ignores c, NaN too */
static __global__ void k_axpby(float *out, shp s, const float *c, sv sc, float alpha, float beta, int64_t n) {
    GRID_LOOP(e, n) out[e] = alpha * out[e] + (beta == 0.0f ? 0.0f : beta * c[sv_at(s, sc, e)]);
}

/* out[(b * C + c) * P + p] += bias[c] */
static __global__ void k_bias_planes(float *out, const float *bias, int64_t C, int64_t P, int64_t n) {
    GRID_LOOP(e, n) out[e] += bias[(e / P) % C];
}

/* ---- reductions: one block per output, the reduced elements walked by its threads ---- */

enum { R_SUM, R_MEAN, R_AMAX, R_AMIN, R_ARGMAX, R_VAR, R_LSE, R_NORM, R_MAXDIM, R_MINDIM };

/* (v, i) before (w, j) for a max (mx) or min: NaN first, then the larger (smaller), then the first index */
static __device__ __forceinline__ bool pick_before(float v, int64_t i, float w, int64_t j, bool mx) {
    if (j < 0) return i >= 0;
    if (i < 0) return false;
    const bool vn = v != v, wn = w != w;
    if (vn || wn) return vn && wn ? i < j : vn;
    if (v != w) return mx ? v > w : v < w;
    return i < j;
}

static __device__ double block_sum(double v, double *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0) sh[0] = v;
    }
    __syncthreads();
    return sh[0];
}

static __device__ void block_pick(float *v, int64_t *i, bool mx, float *shv, int64_t *shi) {
    for (int o = 16; o > 0; o >>= 1) {
        const float w = __shfl_down_sync(0xffffffffu, *v, o);
        const int64_t j = __shfl_down_sync(0xffffffffu, *i, o);
        if (pick_before(w, j, *v, *i, mx)) *v = w, *i = j;
    }
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) shv[wp] = *v, shi[wp] = *i;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int k = 1; k < (int)(blockDim.x >> 5); k++)
            if (pick_before(shv[k], shi[k], shv[0], shi[0], mx)) shv[0] = shv[k], shi[0] = shi[k];
    }
    __syncthreads();
    *v = shv[0], *i = shi[0];
}

static __global__ void k_reduce(float *out, float *idx_out, const float *x, shp ks, sv kv, shp rs, sv rv, int64_t cnt,
                                int op, double p, double corr) {
    __shared__ double sh[32];
    __shared__ float shv[32];
    __shared__ int64_t shi[32];
    const int64_t e = blockIdx.x;
    const int64_t base = sv_at(ks, kv, e);
    if (op == R_AMAX || op == R_AMIN || op == R_ARGMAX || op == R_MAXDIM || op == R_MINDIM || op == R_LSE) {
        const bool mx = op != R_AMIN && op != R_MINDIM;
        float best = 0.0f;
        int64_t at = -1;
        for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) {
            const float v = x[base + sv_at(rs, rv, j)];
            if (pick_before(v, j, best, at, mx)) best = v, at = j;
        }
        block_pick(&best, &at, mx, shv, shi);
        if (op != R_LSE) {
            if (threadIdx.x == 0) {
                out[e] = op == R_ARGMAX ? (float)at : best;
                if (idx_out) idx_out[e] = (float)at;
            }
            return;
        }
        const double m = isinf(best) ? 0.0 : (double)best;
        double s = 0.0;
        for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) s += exp((double)x[base + sv_at(rs, rv, j)] - m);
        s = block_sum(s, sh);
        if (threadIdx.x == 0) out[e] = cnt ? (float)(log(s) + m) : -INFINITY;
        return;
    }
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) {
        const double v = x[base + sv_at(rs, rv, j)];
        if (op == R_NORM) {
            const double a = fabs(v);
            if (isinf(p)) s = j == (int64_t)threadIdx.x ? a : (p > 0 ? fmax(s, a) : fmin(s, a));
            else s += p == 0.0 ? (a != 0.0) : p == 1.0 ? a : p == 2.0 ? a * a : pow(a, p);
        } else {
            s += v;
        }
    }
    if (op == R_NORM && isinf(p)) { /* max or min over threads: through the pick */
        float v = (float)s;
        int64_t at = (int64_t)threadIdx.x < cnt ? 0 : -1;
        block_pick(&v, &at, p > 0, shv, shi);
        if (threadIdx.x == 0) out[e] = v;
        return;
    }
    s = block_sum(s, sh);
    if (op == R_VAR) {
        const double mu = cnt ? s / (double)cnt : NAN;
        double q = 0.0;
        for (int64_t j = threadIdx.x; j < cnt; j += blockDim.x) {
            const double d = (double)x[base + sv_at(rs, rv, j)] - mu;
            q += d * d;
        }
        q = block_sum(q, sh);
        if (threadIdx.x == 0) out[e] = (float)(q / ((double)cnt - corr > 0 ? (double)cnt - corr : 0.0));
        return;
    }
    if (threadIdx.x != 0) return;
    if (op == R_SUM) out[e] = (float)s;
    else if (op == R_MEAN) out[e] = cnt ? (float)(s / (double)cnt) : NAN;
    else out[e] = (float)(p == 0.0 || p == 1.0 ? s : p == 2.0 ? sqrt(s) : pow(s, 1.0 / p));
}

/* softmax / log_softmax over len elements at stride inner; one block per (outer, inner) row. With
 * attention (att): row r's element j scaled by scale, the mask (ms over the full [.., L, S] shape) added
 * (mbool: dropped where 0), the causal triangle (j > r % L) dropped. */
static __global__ void k_softmax(float *out, const float *x, int64_t len, int64_t inner, int logs, int att, float scale,
                                 const float *mask, shp fs, sv ms, int mbool, int causal, int64_t L) {
    __shared__ double sh[32];
    __shared__ float shv[32];
    __shared__ int64_t shi[32];
    const int64_t row = blockIdx.x, o = row / inner, i = row % inner;
    const float *src = x + o * len * inner + i;
    float *dst = out + o * len * inner + i;
    float mx = -INFINITY; /* NaN ignored, as the CPU's loop does: a NaN row gives NaN through exp anyway */
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        float v = src[j * inner];
        if (att) {
            v *= scale;
            if (causal && j > row % L) v = -INFINITY;
            if (mask) {
                const float m = mask[sv_at(fs, ms, row * len + j)];
                v = mbool ? (m != 0.0f ? v : -INFINITY) : v + m;
            }
            dst[j * inner] = v;
        }
        mx = fmaxf(mx, v);
    }
    float m = mx;
    int64_t ia = 0;
    block_pick(&m, &ia, true, shv, shi);
    const float *rd = att ? dst : src;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) s += exp((double)rd[j * inner] - m);
    s = block_sum(s, sh);
    const double ls = log(s);
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) {
        const double v = rd[j * inner];
        dst[j * inner] = logs ? (float)(v - m - ls) : (float)(exp(v - m) / s);
    }
}

/* layer norm over rows of d (HW = 0: affine per element of the row); group norm over (n, g) rows
 * of Cg * HW (affine per channel g * Cg + j / HW, g = row % G) */
static __global__ void k_norm_rows(float *out, float *mean_out, float *rstd_out, const float *x, const float *w, const float *b,
                                   int64_t d, double eps, int64_t HW, int64_t Cg, int64_t G) {
    __shared__ double sh[32];
    const int64_t row = blockIdx.x;
    const float *src = x + row * d;
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += src[j];
    s = block_sum(s, sh);
    const double mu = d ? s / (double)d : 0.0;
    double q = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) q += ((double)src[j] - mu) * ((double)src[j] - mu);
    q = block_sum(q, sh);
    const float rstd = (float)(1.0 / sqrt((d ? q / (double)d : 0.0) + eps));
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        const int64_t wi = HW ? (row % G) * Cg + j / HW : j;
        out[row * d + j] = ((src[j] - (float)mu) * rstd) * (w ? w[wi] : 1.0f) + (b ? b[wi] : 0.0f);
    }
    if (threadIdx.x == 0) mean_out[row] = (float)mu, rstd_out[row] = rstd;
}

static __global__ void k_batch_norm(float *out, const float *x, const float *w, const float *b, const float *mean,
                                    const float *var, double eps, int64_t C, int64_t inner, int64_t n) {
    GRID_LOOP(e, n) {
        const int64_t c = (e / inner) % C;
        const float invstd = (float)(1.0 / sqrt((double)var[c] + eps));
        out[e] = (x[e] - mean[c]) * (invstd * (w ? w[c] : 1.0f)) + (b ? b[c] : 0.0f);
    }
}

/* columns [OH*OW][Cg*KH*KW] of one image's group */
static __global__ void k_im2col(float *cols, const float *img, int64_t Cg, int64_t H, int64_t W, int64_t KH, int64_t KW,
                                int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t OW, int64_t n) {
    const int64_t kk = Cg * KH * KW;
    GRID_LOOP(e, n) {
        const int64_t p = e / kk, q = e % kk;
        const int64_t c = q / (KH * KW), i = (q / KW) % KH, j = q % KW;
        const int64_t ih = (p / OW) * sh - ph + i * dh, iw = (p % OW) * sw - pw + j * dw;
        cols[e] = ih >= 0 && ih < H && iw >= 0 && iw < W ? img[(c * H + ih) * W + iw] : 0.0f;
    }
}

/* max (mode 0, indices into idx when given) / avg (mode 1) / adaptive avg (mode 2) pooling, one thread per output */
static __global__ void k_pool(float *out, float *idx, const float *x, int mode, int64_t H, int64_t W, int64_t OH, int64_t OW,
                              int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                              int cip, int64_t divisor, int64_t n) {
    GRID_LOOP(e, n) {
        const int64_t p = e / (OH * OW), oh = (e / OW) % OH, ow = e % OW;
        const float *img = x + p * H * W;
        if (mode == 2) {
            const int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH, w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
            float s = 0.0f;
            for (int64_t i = h0; i < h1; i++)
                for (int64_t j = w0; j < w1; j++) s += img[i * W + j];
            out[e] = s / (float)((h1 - h0) * (w1 - w0));
        } else if (mode == 1) {
            int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
            int64_t h1 = h0 + kh < H + ph ? h0 + kh : H + ph, w1 = w0 + kw < W + pw ? w0 + kw : W + pw;
            const int64_t pool_size = (h1 - h0) * (w1 - w0);
            h0 = h0 > 0 ? h0 : 0, w0 = w0 > 0 ? w0 : 0, h1 = h1 < H ? h1 : H, w1 = w1 < W ? w1 : W;
            float s = 0.0f;
            for (int64_t i = h0; i < h1; i++)
                for (int64_t j = w0; j < w1; j++) s += img[i * W + j];
            const int64_t div = divisor ? divisor : cip ? pool_size : (h1 - h0) * (w1 - w0);
            out[e] = div ? s / (float)div : NAN;
        } else {
            float best = -INFINITY;
            int64_t at = -1;
            const int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
            for (int64_t i = 0; i < kh; i++) {
                const int64_t ih = h0 + i * dh;
                if (ih < 0 || ih >= H) continue;
                for (int64_t j = 0; j < kw; j++) {
                    const int64_t iw = w0 + j * dw;
                    if (iw < 0 || iw >= W) continue;
                    const float v = img[ih * W + iw];
                    if (v > best || at < 0 || v != v) {
                        best = v, at = ih * W + iw;
                        if (v != v) goto done;
                    }
                }
            }
        done:
            out[e] = best;
            if (idx) idx[e] = (float)at;
        }
    }
}

/* embedding (mode 0), gather (1), index_select (2): a bad index sets *bad to 1 + the element */
static __global__ void k_index(float *out, shp os, const float *x, sv xs, const float *ix, int mode, int dim, int64_t dsize,
                               int64_t D, int *bad, int64_t n) {
    GRID_LOOP(e, n) {
        if (mode == 0) {
            const float v = ix[e / D];
            if (!(v >= 0.0f && v < (float)dsize)) {
                atomicCAS(bad, 0, 1);
                out[e] = 0.0f;
                continue;
            }
            out[e] = x[(int64_t)v * D + e % D];
            continue;
        }
        int64_t rem = e, off = 0, id[DJ_CGRAPH_MAX_RANK];
        for (int k = os.rank - 1; k >= 0; k--) id[k] = rem % os.d[k], rem /= os.d[k];
        const float v = mode == 1 ? ix[e] : ix[os.rank ? id[dim] : 0];
        int64_t i = (int64_t)v;
        if (i < 0) i += dsize;
        if (!(v == v) || i < 0 || i >= dsize) {
            atomicCAS(bad, 0, 1);
            out[e] = 0.0f;
            continue;
        }
        for (int k = 0; k < os.rank; k++) off += (k == dim ? i : id[k]) * xs.st[k];
        out[e] = x[off];
    }
}

static __global__ void k_tri(float *out, const float *x, int64_t R, int64_t C, int64_t diag, int lower, int64_t n) {
    GRID_LOOP(e, n) {
        const int64_t i = (e / C) % R, j = e % C;
        out[e] = (lower ? j - i <= diag : j - i >= diag) ? x[e] : 0.0f;
    }
}

static __global__ void k_cumsum(float *out, const float *x, int64_t len, int64_t inner, int64_t n) {
    GRID_LOOP(e, n) {
        const int64_t o = e / inner, i = e % inner;
        double s = 0.0;
        for (int64_t j = 0; j < len; j++) {
            s += x[(o * len + j) * inner + i];
            out[(o * len + j) * inner + i] = (float)s;
        }
    }
}

static __global__ void k_upsample(float *out, const float *x, int bilinear, int align, float sh, float sw, int64_t H,
                                  int64_t W, int64_t OH, int64_t OW, int64_t n) {
    GRID_LOOP(e, n) {
        const int64_t p = e / (OH * OW), i = (e / OW) % OH, j = e % OW;
        const float *img = x + p * H * W;
        if (!bilinear) {
            int64_t si = (int64_t)floorf((float)i * sh), sj = (int64_t)floorf((float)j * sw);
            si = si < H - 1 ? si : H - 1, sj = sj < W - 1 ? sj : W - 1;
            out[e] = img[si * W + sj];
            continue;
        }
        float fy = align ? sh * (float)i : sh * ((float)i + 0.5f) - 0.5f, fx = align ? sw * (float)j : sw * ((float)j + 0.5f) - 0.5f;
        fy = fy < 0 ? 0 : fy, fx = fx < 0 ? 0 : fx;
        const int64_t y0 = (int64_t)fy, y1 = y0 + (y0 < H - 1), x0 = (int64_t)fx, x1 = x0 + (x0 < W - 1);
        const float ly = fy - (float)y0, lx = fx - (float)x0;
        out[e] = (1 - ly) * ((1 - lx) * img[y0 * W + x0] + lx * img[y0 * W + x1]) + ly * ((1 - lx) * img[y1 * W + x0] + lx * img[y1 * W + x1]);
    }
}

/* ---- the run ---- */

typedef struct run {
    const dj_cgraph_t *g;
    const float *const *inputs, *const *weights;
    uint8_t *stack;
    dj_cuda_backend *cb;
    int *bad; /* device flag of the index kernels */
} run;

static float *vp(const run *r, uint32_t v) {
    const dj_cgraph_t *g = r->g;
    if (v < g->n_inputs) return (float *)r->inputs[v];
    if (v < g->n_inputs + g->n_weights) return (float *)r->weights[v - g->n_inputs];
    return (float *)(r->stack + g->vals[v].offset);
}
static const dj_ctensor_info *vi(const run *r, uint32_t v) { return &r->g->vals[v].t; }
static float *outp(const run *r, const dj__cnode *n, uint32_t k) { return (float *)(r->stack + r->g->vals[n->out[k]].offset); }
static int64_t wrapd(int64_t d, uint32_t rank) { return d < 0 ? d + (int64_t)(rank ? rank : 1) : d; }
static int64_t arg_pair(const dj__carg *a, int i) { return a->n == 1 ? a->ints[0] : a->ints[i]; }

#define LAUNCH(r, n, kernel, ...)                                                              \
    do {                                                                                       \
        if ((n) > 0) {                                                                         \
            kernel<<<blocks_for((uint64_t)(n)), TPB, 0, (r)->cb->stream>>>(__VA_ARGS__);       \
            DJ_CU_LAUNCHED((r)->cb);                                                           \
        }                                                                                      \
    } while (0)

/* C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, all row-major, batched with strides (elements) */
static dj_status gemm(const run *r, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      int64_t sA, const float *B, int64_t ldb, int64_t sB, float beta, float *C, int64_t ldc, int64_t sC,
                      int64_t batch) {
    if (!M || !N || !batch) return DJ_OK;
    if (!K) { /* an empty sum: beta C (beta is 0 for every caller: zeros) */
        LAUNCH(r, M * N * batch, k_fill, C, (const float *)NULL, 0, 0.0, 0.0, 0, M * N * batch);
        return DJ_OK;
    }
    dj_cuda_backend *cb = r->cb;
    DJ_CUBLAS(cb, cublasSgemmStridedBatched(cb->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, (int)N,
                                            (int)M, (int)K, &alpha, B, (int)ldb, sB, A, (int)lda, sA, &beta, C, (int)ldc, sC,
                                            (int)batch));
    return DJ_OK;
}

static dj_status copy_view(const run *r, float *out, const dj_ctensor_info *o, const float *in, const sv &si) {
    const shp s = shp_of(o);
    const sv so = sv_contig(o);
    LAUNCH(r, (int64_t)o->numel, k_copy, out, s, so, in, si, (int64_t)o->numel);
    return DJ_OK;
}

static dj_status binary(const run *r, const dj__cnode *n, int op, float *out) {
    const dj_ctensor_info *o = vi(r, n->out[0]);
    const shp s = shp_of(o);
    const float alpha = (op == BIN_ADD || op == BIN_SUB || op == BIN_RSUB) ? (float)n->args[2].f : 1.0f;
    const sv sa = sv_bcast(vi(r, n->args[0].v), s);
    sv sb;
    memset(&sb, 0, sizeof sb);
    const float *b = NULL;
    float bs = 0.0f;
    if (n->args[1].kind == DJ_CARG_TENSOR) {
        b = vp(r, n->args[1].v);
        sb = sv_bcast(vi(r, n->args[1].v), s);
    } else {
        bs = (float)n->args[1].f;
    }
    LAUNCH(r, (int64_t)o->numel, k_binary, out, s, vp(r, n->args[0].v), sa, b, sb, bs, op, alpha, (int64_t)o->numel);
    return DJ_OK;
}

/* the dims a reduction takes (red), as kept/reduced shapes and strides of x */
static void red_views(const dj_ctensor_info *x, const bool *red, shp *ks, sv *kv, shp *rs, sv *rv, int64_t *cnt) {
    const sv xs = sv_contig(x);
    memset(ks, 0, sizeof *ks), memset(kv, 0, sizeof *kv), memset(rs, 0, sizeof *rs), memset(rv, 0, sizeof *rv);
    *cnt = 1;
    for (uint32_t k = 0; k < x->rank; k++) {
        if (red[k]) rs->d[rs->rank] = x->shape[k], rv->st[rs->rank++] = xs.st[k], *cnt *= x->shape[k];
        else ks->d[ks->rank] = x->shape[k], kv->st[ks->rank++] = xs.st[k];
    }
}

static dj_status reduce(const run *r, const dj__cnode *n, float *out, float *idx_out) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *o = vi(r, n->out[0]);
    bool red[DJ_CGRAPH_MAX_RANK] = {0};
    int op = R_SUM;
    uint32_t dim_at = 1;
    double p = 2.0, corr = 0.0;
    switch (n->op) {
    case DJ_COP_SUM: case DJ_COP_SUM_DIM: op = R_SUM; break;
    case DJ_COP_MEAN: case DJ_COP_MEAN_DIM: op = R_MEAN; break;
    case DJ_COP_AMAX: op = R_AMAX; break;
    case DJ_COP_AMIN: op = R_AMIN; break;
    case DJ_COP_ARGMAX: op = R_ARGMAX; break;
    case DJ_COP_VAR: op = R_VAR, corr = n->args[2].kind == DJ_CARG_NONE ? 1.0 : n->args[2].f; break;
    case DJ_COP_LOGSUMEXP: op = R_LSE; break;
    case DJ_COP_NORM: case DJ_COP_VNORM:
        op = R_NORM, dim_at = 2, p = n->args[1].kind == DJ_CARG_NONE ? 2.0 : n->args[1].f;
        break;
    case DJ_COP_MAX_DIM: op = R_MAXDIM; break;
    case DJ_COP_MIN_DIM: op = R_MINDIM; break;
    default: return dj_fail(DJ_EINTERNAL, "captured graph: %s is no reduction", dj__cop_names[n->op]);
    }
    const dj__carg *da = &n->args[dim_at];
    if (n->op == DJ_COP_MEAN || n->op == DJ_COP_SUM) {
        for (uint32_t k = 0; k < x->rank; k++) red[k] = true;
    } else if (da->kind == DJ_CARG_INT && (n->op == DJ_COP_ARGMAX || n->op == DJ_COP_MAX_DIM || n->op == DJ_COP_MIN_DIM)) {
        if (x->rank) red[wrapd(da->i, x->rank)] = true;
    } else if (da->kind != DJ_CARG_INTS || da->n == 0) {
        for (uint32_t k = 0; k < x->rank; k++) red[k] = true;
    } else if (x->rank) {
        for (uint32_t k = 0; k < da->n; k++) red[wrapd(da->ints[k], x->rank)] = true;
    }
    shp ks, rs;
    sv kv, rv;
    int64_t cnt;
    red_views(x, red, &ks, &kv, &rs, &rv, &cnt);
    if (!o->numel) return DJ_OK;
    k_reduce<<<(unsigned)o->numel, TPB, 0, r->cb->stream>>>(out, idx_out, vp(r, n->args[0].v), ks, kv, rs, rv, cnt, op, p, corr);
    DJ_CU_LAUNCHED(r->cb);
    return DJ_OK;
}

static dj_status softmax_rows(const run *r, float *out, const float *x, int64_t rows, int64_t len, int64_t inner, bool logs,
                              bool att, float scale, const float *mask, const shp &fs, const sv &ms, bool mbool, bool causal,
                              int64_t L) {
    if (!rows || !len) return DJ_OK;
    k_softmax<<<(unsigned)rows, TPB, 0, r->cb->stream>>>(out, x, len, inner, logs, att, scale, mask, fs, ms, mbool, causal, L);
    DJ_CU_LAUNCHED(r->cb);
    return DJ_OK;
}

static dj_status mm(const run *r, const dj__cnode *n, float *out) {
    const bool add = n->op == DJ_COP_ADDMM;
    const dj_ctensor_info *a = vi(r, n->args[add].v), *o = vi(r, n->out[0]);
    const int64_t rows = a->shape[0], k = a->shape[1], m = o->shape[1];
    const float beta = add ? (float)n->args[3].f : 0.0f, alpha = add ? (float)n->args[4].f : 1.0f;
    /* mat2_t: mat2_src is [m, k] (the t() the graph took of it is not run) */
    dj_status st = gemm(r, false, n->mat2_t, rows, m, k, 1.0f, vp(r, n->args[add].v), k, 0, vp(r, n->mat2_src),
                        n->mat2_t ? k : m, 0, 0.0f, out, m, 0, 1);
    if (st != DJ_OK || !add) return st;
    const shp s = shp_of(o);
    LAUNCH(r, (int64_t)o->numel, k_axpby, out, s, vp(r, n->args[0].v), sv_bcast(vi(r, n->args[0].v), s), alpha, beta,
           (int64_t)o->numel);
    return DJ_OK;
}

static dj_status conv(const run *r, const dj__cnode *n, float *out, float *cols) {
    const dj_ctensor_info *x = vi(r, n->args[0].v), *w = vi(r, n->args[1].v), *o = vi(r, n->out[0]);
    const float *xp = vp(r, n->args[0].v), *wp = vp(r, n->args[1].v);
    const int64_t sh = arg_pair(&n->args[3], 0), sw = arg_pair(&n->args[3], 1), ph = arg_pair(&n->args[4], 0),
                  pw = arg_pair(&n->args[4], 1), dh = arg_pair(&n->args[5], 0), dw = arg_pair(&n->args[5], 1);
    const int64_t groups = n->args[8].i;
    const int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    const int64_t OC = w->shape[0], Cg = w->shape[1], KH = w->shape[2], KW = w->shape[3];
    const int64_t OH = o->shape[2], OW = o->shape[3], OCg = OC / groups, kk = Cg * KH * KW, P = OH * OW;
    for (int64_t b = 0; b < N; b++)
        for (int64_t gi = 0; gi < groups; gi++) {
            LAUNCH(r, P * kk, k_im2col, cols, xp + (b * C + gi * Cg) * H * W, Cg, H, W, KH, KW, sh, sw, ph, pw, dh, dw, OW, P * kk);
            const dj_status st = gemm(r, false, true, OCg, P, kk, 1.0f, wp + gi * OCg * kk, kk, 0, cols, kk, 0, 0.0f,
                                      out + (b * OC + gi * OCg) * P, P, 0, 1);
            if (st != DJ_OK) return st;
        }
    if (n->args[2].kind == DJ_CARG_TENSOR) LAUNCH(r, (int64_t)o->numel, k_bias_planes, out, vp(r, n->args[2].v), OC, P, (int64_t)o->numel);
    return DJ_OK;
}

static dj_status sdpa(const run *r, const dj__cnode *n, float *out, float *w) {
    const dj_ctensor_info *q = vi(r, n->args[0].v), *k = vi(r, n->args[1].v), *v = vi(r, n->args[2].v), *ow = vi(r, n->out[1]);
    const uint32_t rk = q->rank;
    const int64_t L = q->shape[rk - 2], E = q->shape[rk - 1], S = k->shape[rk - 2], Ev = v->shape[rk - 1];
    const int64_t B = (L * E) != 0 ? (int64_t)(q->numel / (uint64_t)(L * E)) : 0;
    dj_status st = gemm(r, false, true, L, S, E, 1.0f, vp(r, n->args[0].v), E, L * E, vp(r, n->args[1].v), E, S * E, 0.0f, w, S,
                        L * S, B);
    if (st != DJ_OK) return st;
    const shp fs = shp_of(ow);
    sv ms;
    memset(&ms, 0, sizeof ms);
    const float *mask = NULL;
    bool mbool = false;
    if (n->args[3].kind == DJ_CARG_TENSOR) {
        mask = vp(r, n->args[3].v);
        mbool = vi(r, n->args[3].v)->dtype == DJ_CDTYPE_BOOL;
        ms = sv_bcast(vi(r, n->args[3].v), fs);
    }
    st = softmax_rows(r, w, w, B * L, S, 1, false, true, 1.0f / sqrtf((float)E), mask, fs, ms, mbool, n->args[6].i != 0, L);
    if (st != DJ_OK) return st;
    return gemm(r, false, false, L, Ev, S, 1.0f, w, S, L * S, vp(r, n->args[2].v), Ev, S * Ev, 0.0f, out, Ev, L * Ev, B);
}

/* The ops with no GPU kernel yet: a run refuses them (dj_cgraph_cuda_check) before any work. */
static bool gpu_has(const dj__cnode *n) {
    switch (n->op) {
    case DJ_COP_SORT: case DJ_COP_SORT_STABLE: case DJ_COP_TOPK: case DJ_COP_INDEX: return false;
    case DJ_COP_CONV: return n->args[6].i == 0; /* transposed convolution: not built on the GPU */
    default: return true;
    }
}

static dj_status exec_node(const run *r, const dj__cnode *n) {
    float *out = outp(r, n, 0);
    float *scratch = (float *)(r->stack + n->scratch_off);
    const dj_ctensor_info *o = vi(r, n->out[0]);
    const int64_t cnt = (int64_t)o->numel;
    switch (n->op) {
    case DJ_COP_ADDMM: case DJ_COP_MM: return mm(r, n, out);
    case DJ_COP_LINEAR: {
        const dj_ctensor_info *w = vi(r, n->args[1].v);
        const int64_t k = w->shape[1], m = w->shape[0], rows = m ? cnt / m : 0; /* k 0: zeros, then the bias */
        const dj_status st = gemm(r, false, true, rows, m, k, 1.0f, vp(r, n->args[0].v), k, 0, vp(r, n->args[1].v), k, 0, 0.0f, out,
                                  m, 0, 1);
        if (st != DJ_OK || n->args[2].kind != DJ_CARG_TENSOR) return st;
        LAUNCH(r, cnt, k_bias_planes, out, vp(r, n->args[2].v), m, (int64_t)1, cnt);
        return DJ_OK;
    }
    case DJ_COP_BMM: {
        const dj_ctensor_info *a = vi(r, n->args[0].v), *b = vi(r, n->args[1].v);
        const int64_t B = a->shape[0], N = a->shape[1], K = a->shape[2], M = b->shape[2];
        return gemm(r, false, false, N, M, K, 1.0f, vp(r, n->args[0].v), K, N * K, vp(r, n->args[1].v), M, K * M, 0.0f, out, M,
                    N * M, B);
    }
    case DJ_COP_BADDBMM: {
        const dj_ctensor_info *a = vi(r, n->args[1].v), *b = vi(r, n->args[2].v);
        const int64_t B = a->shape[0], N = a->shape[1], K = a->shape[2], M = b->shape[2];
        const dj_status st = gemm(r, false, false, N, M, K, 1.0f, vp(r, n->args[1].v), K, N * K, vp(r, n->args[2].v), M, K * M, 0.0f,
                                  out, M, N * M, B);
        if (st != DJ_OK) return st;
        const shp s = shp_of(o);
        LAUNCH(r, cnt, k_axpby, out, s, vp(r, n->args[0].v), sv_bcast(vi(r, n->args[0].v), s), (float)n->args[4].f,
               (float)n->args[3].f, cnt);
        return DJ_OK;
    }
    case DJ_COP_ADD_T: case DJ_COP_ADD_S: return binary(r, n, BIN_ADD, out);
    case DJ_COP_SUB_T: case DJ_COP_SUB_S: return binary(r, n, BIN_SUB, out);
    case DJ_COP_MUL_T: case DJ_COP_MUL_S: return binary(r, n, BIN_MUL, out);
    case DJ_COP_DIV_T: case DJ_COP_DIV_S: return binary(r, n, BIN_DIV, out);
    case DJ_COP_GT_T: case DJ_COP_GT_S: return binary(r, n, BIN_GT, out);
    case DJ_COP_LT_T: case DJ_COP_LT_S: return binary(r, n, BIN_LT, out);
    case DJ_COP_GE_S: case DJ_COP_GE_T: return binary(r, n, BIN_GE, out);
    case DJ_COP_LE_S: case DJ_COP_LE_T: return binary(r, n, BIN_LE, out);
    case DJ_COP_EQ_T: case DJ_COP_EQ_S: return binary(r, n, BIN_EQ, out);
    case DJ_COP_NE_T: case DJ_COP_NE_S: return binary(r, n, BIN_NE, out);
    case DJ_COP_POW_TS: case DJ_COP_POW_TT: return binary(r, n, BIN_POW, out);
    case DJ_COP_RSUB_S: return binary(r, n, BIN_RSUB, out);
    case DJ_COP_RELU: case DJ_COP_GELU: case DJ_COP_SILU: case DJ_COP_SIGMOID: case DJ_COP_TANH: case DJ_COP_NEG:
    case DJ_COP_EXP: case DJ_COP_HARDTANH: case DJ_COP_SQRT: case DJ_COP_RSQRT: case DJ_COP_ABS: case DJ_COP_LOG:
    case DJ_COP_ERF: {
        const bool ht = n->op == DJ_COP_HARDTANH;
        const int tanh_gelu = n->op == DJ_COP_GELU && !strcmp(n->args[1].str, "tanh");
        LAUNCH(r, cnt, k_unary, out, vp(r, n->args[0].v), (int)n->op, ht ? (float)n->args[1].f : 0.0f,
               ht ? (float)n->args[2].f : 0.0f, tanh_gelu, cnt);
        return DJ_OK;
    }
    case DJ_COP_WHERE: case DJ_COP_MASKED_FILL_S: case DJ_COP_MASKED_FILL_T: {
        const shp s = shp_of(o);
        const bool where = n->op == DJ_COP_WHERE;
        const uint32_t cv = n->args[where ? 0 : 1].v, av = n->args[where ? 1 : 0].v;
        const float *b = NULL;
        sv sb;
        memset(&sb, 0, sizeof sb);
        float fill = 0.0f;
        if (n->op != DJ_COP_MASKED_FILL_S) {
            b = vp(r, n->args[2].v);
            sb = sv_bcast(vi(r, n->args[2].v), s);
        } else {
            fill = (float)n->args[2].f;
            if (vi(r, av)->dtype == DJ_CDTYPE_I64) fill = truncf(fill);
            else if (vi(r, av)->dtype == DJ_CDTYPE_BOOL) fill = fill != 0.0f;
        }
        LAUNCH(r, cnt, k_select3, out, s, vp(r, cv), sv_bcast(vi(r, cv), s), vp(r, av), sv_bcast(vi(r, av), s), b, sb, fill,
               (int)where, cnt);
        return DJ_OK;
    }
    case DJ_COP_TO_COPY:
        LAUNCH(r, cnt, k_fill, out, vp(r, n->args[0].v), 2, 0.0, 0.0, (int)o->dtype, cnt);
        return DJ_OK;
    case DJ_COP_ARANGE: case DJ_COP_ARANGE_START: case DJ_COP_ARANGE_STEP: {
        const double start = n->op == DJ_COP_ARANGE ? 0.0 : n->args[0].f, step = n->op == DJ_COP_ARANGE_STEP ? n->args[2].f : 1.0;
        LAUNCH(r, cnt, k_fill, out, (const float *)NULL, 1, start, step, (int)o->dtype, cnt);
        return DJ_OK;
    }
    case DJ_COP_ZEROS_LIKE: case DJ_COP_ONES_LIKE: case DJ_COP_FULL_LIKE: case DJ_COP_ZEROS: case DJ_COP_ONES: case DJ_COP_FULL: {
        double v = 0.0;
        if (n->op == DJ_COP_ONES || n->op == DJ_COP_ONES_LIKE) v = 1.0;
        else if (n->op == DJ_COP_FULL || n->op == DJ_COP_FULL_LIKE) v = n->args[1].f;
        v = o->dtype == DJ_CDTYPE_I64 ? trunc(v) : o->dtype == DJ_CDTYPE_BOOL ? (v != 0.0) : v;
        LAUNCH(r, cnt, k_fill, out, (const float *)NULL, 0, (double)(float)v, 0.0, (int)o->dtype, cnt);
        return DJ_OK;
    }
    case DJ_COP_VIEW: case DJ_COP_RESHAPE: case DJ_COP_UNSAFE_VIEW: case DJ_COP_RESHAPE_ALIAS: case DJ_COP_FLATTEN:
    case DJ_COP_UNSQUEEZE: case DJ_COP_SQUEEZE_DIM: case DJ_COP_CLONE: case DJ_COP_DETACH: case DJ_COP_ALIAS:
        if (cnt) DJ_CU(r->cb, cudaMemcpyAsync(out, vp(r, n->args[0].v), sizeof(float) * (size_t)cnt, cudaMemcpyDeviceToDevice, r->cb->stream));
        return DJ_OK;
    case DJ_COP_PERMUTE: case DJ_COP_TRANSPOSE: case DJ_COP_T: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        const sv xs = sv_contig(x);
        const uint32_t rank = x->rank;
        uint32_t perm[DJ_CGRAPH_MAX_RANK];
        for (uint32_t k = 0; k < rank; k++) perm[k] = k;
        if (n->op == DJ_COP_PERMUTE) {
            for (uint32_t k = 0; k < rank; k++) perm[k] = (uint32_t)wrapd(n->args[1].ints[k], rank);
        } else if (rank >= 2) {
            const int64_t a = wrapd(n->op == DJ_COP_T ? 0 : n->args[1].i, rank), b = wrapd(n->op == DJ_COP_T ? 1 : n->args[2].i, rank);
            perm[a] = (uint32_t)b, perm[b] = (uint32_t)a;
        }
        sv si;
        memset(&si, 0, sizeof si);
        for (uint32_t k = 0; k < rank; k++) si.st[k] = xs.st[perm[k]];
        return copy_view(r, out, o, vp(r, n->args[0].v), si);
    }
    case DJ_COP_EXPAND: {
        const shp s = shp_of(o);
        return copy_view(r, out, o, vp(r, n->args[0].v), sv_bcast(vi(r, n->args[0].v), s));
    }
    case DJ_COP_SLICE: case DJ_COP_SELECT: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        const sv xs = sv_contig(x);
        const int64_t dim = wrapd(n->args[1].i, x->rank);
        sv si;
        memset(&si, 0, sizeof si);
        if (n->op == DJ_COP_SELECT) {
            const int64_t idx = n->args[2].i < 0 ? n->args[2].i + x->shape[dim] : n->args[2].i;
            si.base = idx * xs.st[dim];
            for (uint32_t k = 0, j = 0; k < x->rank; k++)
                if ((int64_t)k != dim) si.st[j++] = xs.st[k];
        } else {
            int64_t first, len;
            dj__slice_bounds(x->shape[dim], n->args[2].kind == DJ_CARG_INT ? n->args[2].i : 0,
                             n->args[3].kind == DJ_CARG_INT ? n->args[3].i : INT64_MAX, n->args[4].i, &first, &len);
            si = xs;
            si.base = first * xs.st[dim];
            si.st[dim] = len > 1 ? xs.st[dim] * n->args[4].i : 0;
        }
        return copy_view(r, out, o, vp(r, n->args[0].v), si);
    }
    case DJ_COP_FLIP: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        sv si = sv_contig(x);
        for (uint32_t k = 0; k < n->args[1].n && x->rank; k++) {
            const int64_t d = wrapd(n->args[1].ints[k], x->rank);
            if (si.st[d] == 0) continue;
            si.base += (x->shape[d] - 1) * si.st[d]; /* flipping a dim twice is not allowed by PyTorch */
            si.st[d] = -si.st[d];
        }
        return copy_view(r, out, o, vp(r, n->args[0].v), si);
    }
    case DJ_COP_CAT: case DJ_COP_STACK: {
        /* each input written into its slab of out: out viewed as the input's shape with out's strides */
        const int64_t dim = wrapd(n->args[1].i, o->rank);
        const sv os = sv_contig(o);
        int64_t at = 0;
        for (uint32_t t = 0; t < n->args[0].n; t++) {
            const dj_ctensor_info *x = vi(r, n->args[0].vals[t]);
            dj_ctensor_info xv = *x;
            if (n->op == DJ_COP_STACK) { /* x with a dim of 1 at dim */
                for (int k = (int)o->rank - 1; k > dim; k--) xv.shape[k] = x->shape[k - 1];
                xv.shape[dim] = 1;
                xv.rank = o->rank;
            } else if (x->rank != o->rank) {
                continue; /* a legacy empty 1-d tensor */
            }
            if (!xv.numel) {
                at += xv.shape[dim];
                continue;
            }
            sv so = os;
            so.base = at * os.st[dim];
            LAUNCH(r, (int64_t)xv.numel, k_copy, out, shp_of(&xv), so, vp(r, n->args[0].vals[t]), sv_contig(&xv), (int64_t)xv.numel);
            at += xv.shape[dim];
        }
        return DJ_OK;
    }
    case DJ_COP_SPLIT: case DJ_COP_SPLIT_SIZES: case DJ_COP_UNBIND: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        const int64_t dim = wrapd(n->args[n->op == DJ_COP_UNBIND ? 1 : 2].i, x->rank);
        const sv xs = sv_contig(x);
        int64_t at = 0;
        for (uint32_t t = 0; t < n->n_out; t++) {
            const dj_ctensor_info *ot = vi(r, n->out[t]);
            sv si;
            memset(&si, 0, sizeof si);
            si.base = at * xs.st[dim];
            if (n->op == DJ_COP_UNBIND) {
                for (uint32_t k = 0, j = 0; k < x->rank; k++)
                    if ((int64_t)k != dim) si.st[j++] = xs.st[k];
                at += 1;
            } else {
                for (uint32_t k = 0; k < x->rank; k++) si.st[k] = xs.st[k];
                at += ot->shape[dim];
            }
            const dj_status st = copy_view(r, outp(r, n, t), ot, vp(r, n->args[0].v), si);
            if (st != DJ_OK) return st;
        }
        return DJ_OK;
    }
    case DJ_COP_MEAN_DIM: case DJ_COP_SUM_DIM: case DJ_COP_MEAN: case DJ_COP_SUM: case DJ_COP_VAR: case DJ_COP_AMAX:
    case DJ_COP_AMIN: case DJ_COP_ARGMAX: case DJ_COP_LOGSUMEXP: case DJ_COP_NORM: case DJ_COP_VNORM:
        return reduce(r, n, out, NULL);
    case DJ_COP_MAX_DIM: case DJ_COP_MIN_DIM: return reduce(r, n, out, outp(r, n, 1));
    case DJ_COP_SOFTMAX: case DJ_COP_LOG_SOFTMAX: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        const int64_t dim = wrapd(n->args[1].i, x->rank);
        int64_t len = x->rank ? x->shape[dim] : 1, inner = 1;
        for (uint32_t k = (uint32_t)dim + 1; k < x->rank; k++) inner *= x->shape[k];
        const int64_t outer = (len * inner) != 0 ? (int64_t)(x->numel / (uint64_t)(len * inner)) : 0;
        shp fs;
        sv ms;
        memset(&fs, 0, sizeof fs), memset(&ms, 0, sizeof ms);
        return softmax_rows(r, out, vp(r, n->args[0].v), outer * inner, len, inner, n->op == DJ_COP_LOG_SOFTMAX, false, 1.0f, NULL,
                            fs, ms, false, false, 1);
    }
    case DJ_COP_SDPA: return sdpa(r, n, out, outp(r, n, 1));
    case DJ_COP_LAYER_NORM: {
        uint64_t d = 1;
        for (uint32_t k = 0; k < n->args[1].n; k++) d *= (uint64_t)n->args[1].ints[k];
        const uint64_t rows = d ? (uint64_t)cnt / d : 0;
        if (!rows) return DJ_OK;
        k_norm_rows<<<(unsigned)rows, TPB, 0, r->cb->stream>>>(
            out, outp(r, n, 1), outp(r, n, 2), vp(r, n->args[0].v), n->args[2].kind == DJ_CARG_TENSOR ? vp(r, n->args[2].v) : NULL,
            n->args[3].kind == DJ_CARG_TENSOR ? vp(r, n->args[3].v) : NULL, (int64_t)d, n->args[4].f, (int64_t)0, (int64_t)0, (int64_t)1);
        DJ_CU_LAUNCHED(r->cb);
        return DJ_OK;
    }
    case DJ_COP_GROUP_NORM: {
        const int64_t N = n->args[3].i, C = n->args[4].i, HW = n->args[5].i, G = n->args[6].i, Cg = C / G;
        if (!N || !G || !HW) return DJ_OK;
        k_norm_rows<<<(unsigned)(N * G), TPB, 0, r->cb->stream>>>(
            out, outp(r, n, 1), outp(r, n, 2), vp(r, n->args[0].v), n->args[1].kind == DJ_CARG_TENSOR ? vp(r, n->args[1].v) : NULL,
            n->args[2].kind == DJ_CARG_TENSOR ? vp(r, n->args[2].v) : NULL, Cg * HW, n->args[7].f, HW, Cg, G);
        DJ_CU_LAUNCHED(r->cb);
        return DJ_OK;
    }
    case DJ_COP_BATCH_NORM: case DJ_COP_BATCH_NORM_EVAL: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        int64_t inner = 1;
        for (uint32_t k = 2; k < x->rank; k++) inner *= x->shape[k];
        LAUNCH(r, cnt, k_batch_norm, out, vp(r, n->args[0].v), n->args[1].kind == DJ_CARG_TENSOR ? vp(r, n->args[1].v) : NULL,
               n->args[2].kind == DJ_CARG_TENSOR ? vp(r, n->args[2].v) : NULL, vp(r, n->args[3].v), vp(r, n->args[4].v),
               n->args[n->op == DJ_COP_BATCH_NORM ? 7 : 6].f, x->shape[1], inner, cnt);
        for (uint32_t k = 1; k < 3; k++) /* save_mean / save_invstd: zeros, as the CPU writes */
            if (r->g->vals[n->out[k]].t.numel)
                DJ_CU(r->cb, cudaMemsetAsync(outp(r, n, k), 0, sizeof(float) * r->g->vals[n->out[k]].t.numel, r->cb->stream));
        return DJ_OK;
    }
    case DJ_COP_CONV: return conv(r, n, out, scratch);
    case DJ_COP_MAXPOOL_IDX: case DJ_COP_MAXPOOL: case DJ_COP_AVGPOOL: case DJ_COP_ADAPTIVE_AVG: case DJ_COP_ADAPTIVE_AVG2: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        const uint32_t h = x->rank - 2;
        const int64_t H = x->shape[h], W = x->shape[h + 1], OH = o->shape[h], OW = o->shape[h + 1];
        if (n->op == DJ_COP_ADAPTIVE_AVG || n->op == DJ_COP_ADAPTIVE_AVG2) {
            LAUNCH(r, cnt, k_pool, out, (float *)NULL, vp(r, n->args[0].v), 2, H, W, OH, OW, (int64_t)0, (int64_t)0, (int64_t)0,
                   (int64_t)0, (int64_t)0, (int64_t)0, (int64_t)0, (int64_t)0, 0, (int64_t)0, cnt);
            return DJ_OK;
        }
        const bool avg = n->op == DJ_COP_AVGPOOL;
        const dj__carg *ka = &n->args[1], *sa = &n->args[2], *pa = &n->args[3];
        const int64_t kh = arg_pair(ka, 0), kw = arg_pair(ka, 1);
        const int64_t sh = sa->n ? arg_pair(sa, 0) : kh, sw = sa->n ? arg_pair(sa, 1) : kw;
        const int64_t dh = avg ? 1 : arg_pair(&n->args[4], 0), dw = avg ? 1 : arg_pair(&n->args[4], 1);
        LAUNCH(r, cnt, k_pool, out, n->op == DJ_COP_MAXPOOL_IDX ? outp(r, n, 1) : (float *)NULL, vp(r, n->args[0].v), avg ? 1 : 0, H,
               W, OH, OW, kh, kw, sh, sw, arg_pair(pa, 0), arg_pair(pa, 1), dh, dw, (int)(avg && n->args[5].i),
               (int64_t)(avg && n->args[6].kind == DJ_CARG_INT ? n->args[6].i : 0), cnt);
        return DJ_OK;
    }
    case DJ_COP_UP_NEAREST: case DJ_COP_UP_BILINEAR: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        const int64_t H = x->shape[2], W = x->shape[3], OH = o->shape[2], OW = o->shape[3];
        const bool bil = n->op == DJ_COP_UP_BILINEAR, align = bil && n->args[2].i != 0;
        const dj__carg *sc = &n->args[bil ? 3 : 2];
        float s2[2];
        const int64_t in[2] = {H, W}, on[2] = {OH, OW};
        for (int k = 0; k < 2; k++) {
            if (align) s2[k] = on[k] > 1 ? (float)((double)(in[k] - 1) / (double)(on[k] - 1)) : 0.0f;
            else if (sc->kind == DJ_CARG_FLOATS && sc->fls[k] > 0) s2[k] = (float)(1.0 / sc->fls[k]);
            else s2[k] = (float)((double)in[k] / (double)on[k]);
        }
        LAUNCH(r, cnt, k_upsample, out, vp(r, n->args[0].v), (int)bil, (int)align, s2[0], s2[1], H, W, OH, OW, cnt);
        return DJ_OK;
    }
    case DJ_COP_EMBEDDING: {
        const dj_ctensor_info *w = vi(r, n->args[0].v);
        sv none;
        memset(&none, 0, sizeof none);
        LAUNCH(r, cnt, k_index, out, shp_of(o), vp(r, n->args[0].v), none, vp(r, n->args[1].v), 0, 0, w->shape[0], w->shape[1],
               r->bad, cnt);
        return DJ_OK;
    }
    case DJ_COP_GATHER: case DJ_COP_INDEX_SELECT: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        const int dim = x->rank ? (int)wrapd(n->args[1].i, x->rank) : 0;
        LAUNCH(r, cnt, k_index, out, shp_of(o), vp(r, n->args[0].v), sv_contig(x), vp(r, n->args[2].v),
               n->op == DJ_COP_GATHER ? 1 : 2, dim, x->rank ? x->shape[dim] : 1, (int64_t)0, r->bad, cnt);
        return DJ_OK;
    }
    case DJ_COP_TRIL: case DJ_COP_TRIU: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        LAUNCH(r, cnt, k_tri, out, vp(r, n->args[0].v), x->shape[x->rank - 2], x->shape[x->rank - 1], n->args[1].i,
               (int)(n->op == DJ_COP_TRIL), cnt);
        return DJ_OK;
    }
    case DJ_COP_CUMSUM: {
        const dj_ctensor_info *x = vi(r, n->args[0].v);
        const int64_t dim = x->rank ? wrapd(n->args[1].i, x->rank) : 0, len = x->rank ? x->shape[dim] : 1;
        int64_t inner = 1;
        for (uint32_t j = (uint32_t)dim + 1; j < x->rank; j++) inner *= x->shape[j];
        const int64_t lines = len ? cnt / len : 0;
        LAUNCH(r, lines, k_cumsum, out, vp(r, n->args[0].v), len, inner, lines);
        return DJ_OK;
    }
    case DJ_COP_SORT: case DJ_COP_SORT_STABLE: case DJ_COP_TOPK: case DJ_COP_INDEX: case DJ_COP_COUNT: break;
    }
    return dj_fail(DJ_EUNSUPPORTED, "captured graph: %s has no GPU kernel", dj__cop_names[n->op]);
}

extern "C" dj_status dj_cgraph_cuda_check(const dj_cgraph_t *g, dj_cgraph_error *err) {
    for (uint32_t j = 0; j < g->n_nodes; j++) {
        const dj__cnode *n = &g->nodes[j];
        if (!n->live || gpu_has(n)) continue;
        const char *what = n->op == DJ_COP_CONV ? "a transposed convolution" : dj__cop_names[n->op];
        if (err) {
            memset(err, 0, sizeof *err);
            err->kind = DJ_CGRAPH_ERR_UNSUPPORTED;
            err->node = (int32_t)j;
            snprintf(err->op, sizeof err->op, "%s", dj__cop_names[n->op]);
            snprintf(err->msg, sizeof err->msg, "captured graph: node %u (%s): %s has no GPU kernel (the CPU executor runs it)", j,
                     dj__cop_names[n->op], what);
        }
        return dj_fail(DJ_EUNSUPPORTED, "captured graph: node %u (%s): %s has no GPU kernel (the CPU executor runs it)", j,
                       dj__cop_names[n->op], what);
    }
    return DJ_OK;
}

extern "C" dj_status dj_cgraph_run_cuda(const dj_cgraph_t *g, dj_backend_t *be, const float *const *inputs,
                                        const float *const *weights, void *stack, const float **outs) {
    if (!be || be->host_memory) return dj_fail(DJ_EINVAL, "dj_cgraph_run_cuda needs a CUDA backend");
    dj_status st = dj_cgraph_cuda_check(g, NULL);
    if (st != DJ_OK) return st;
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    DJ_CU(cb, cudaSetDevice(cb->device));
    int *bad = NULL;
    DJ_CU(cb, cudaMallocAsync((void **)&bad, sizeof(int), cb->stream));
    run r = {g, inputs, weights, (uint8_t *)stack, cb, bad};
    if (cudaMemsetAsync(bad, 0, sizeof(int), cb->stream) != cudaSuccess)
        st = dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, "memset of the index flag");
    for (uint32_t j = 0; st == DJ_OK && j < g->n_nodes; j++) {
        if (!g->nodes[j].live) continue;
        st = exec_node(&r, &g->nodes[j]);
    }
    int h_bad = 0;
    const cudaError_t ce = cudaMemcpyAsync(&h_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, cb->stream);
    const cudaError_t fe = cudaFreeAsync(bad, cb->stream);
    const cudaError_t se = cudaStreamSynchronize(cb->stream);
    if (st != DJ_OK) return st;
    if (ce != cudaSuccess || fe != cudaSuccess || se != cudaSuccess)
        return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__,
                             cudaGetErrorString(se != cudaSuccess ? se : ce != cudaSuccess ? ce : fe));
    if (h_bad) return dj_fail(DJ_ERANGE, "captured graph: an index (embedding, gather or index_select) out of range on the GPU");
    for (uint32_t i = 0; i < g->n_outputs; i++) outs[i] = vp(&r, g->outputs[i]);
    return DJ_OK;
}
