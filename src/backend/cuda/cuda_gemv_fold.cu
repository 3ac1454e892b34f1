/* cuda_gemv_fold.cu: a decode GEMV group (one row; bf16, FP8 or 4-bit weights) that computes its own input -
 * SiLU(gate)*up, RMSNorm, or residual ADD + RMSNorm - into shared memory first, saving that op's launch and
 * round trip. Each row is summed as the format's own GEMV sums it (cuda_matmul.cu, cuda_matmul_fp8.cu,
 * cuda_q4.cu), so a folded row equals the unfolded launches' bit for bit. */
#include <string.h>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/cuda_wdecode.h"

#define FOLD_THREADS 512
#define FOLD_WARPS (FOLD_THREADS / 32)
#define NORM_PART 256 /* threads that sum squares: rmsnorm_kernel's partition, so the norm is bit-equal */
#define FOLD_MAX_K 16384 /* x in shared memory: bf16 32 KB, or f32 64 KB (+ 2 KB of 4-bit chunk sums, opted in) */

/* Weight formats of the group (its w_dtype). FP8 and 4-bit rows read x as f32 from shared memory (the
 * bf16 value widened once by the prologue); 4-bit ones also the sum of each 32 columns of x. */
enum { WF_BF16, WF_F8, WF_Q4 };

/* The group's segments: segment i owns rows [first_row[i], first_row[i+1]). */
struct fold_segs {
    const void *w[DJ_GEMV_GROUP];
    const float *scale[DJ_GEMV_GROUP];   /* WF_F8: w_scale */
    uint32_t br[DJ_GEMV_GROUP], bc[DJ_GEMV_GROUP]; /* WF_F8: w_block_rows, w_block_cols */
    const void *bias[DJ_GEMV_GROUP];
    void *out[DJ_GEMV_GROUP];
    uint32_t first_row[DJ_GEMV_GROUP + 1];
    int bias_dtype[DJ_GEMV_GROUP];
    int count;
};

/* The folded op's inputs and outputs (see dj_gemv_fold). */
struct fold_in {
    const void *a;           /* SILU: gate; NORM: x; ADD_NORM: add's x (residual stream) */
    const __nv_bfloat16 *b;  /* SILU: up; ADD_NORM: add's x2 */
    const __nv_bfloat16 *nw; /* norm weight [k] */
    void *hout;              /* ADD_NORM: the sum (add's out), written by block 0 */
    __nv_bfloat16 *xout;     /* the folded op's own output (silu's or the norm's), written by block 0 */
    float eps;
};

static __device__ __forceinline__ float fold_bias(const void *p, int t, uint32_t j) {
    if (!p) return 0.0f;
    switch (t) {
    case DJ_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)p)[j]);
    case DJ_DTYPE_F16: return __half2float(((const __half *)p)[j]);
    default: return ((const float *)p)[j];
    }
}

static __device__ __forceinline__ void widen8_bf16(uint4 u, float f[8]) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

/* Element j of the norm's input: x, or the residual sum rounded as the ADD stores it. */
template <int MODE, typename TX>
static __device__ __forceinline__ float norm_in(const fold_in &in, uint32_t j) {
    if constexpr (MODE == DJ_FOLD_ADD_NORM) {
        const float s = dj_ld((const TX *)in.a, j) + __bfloat162float(in.b[j]);
        if constexpr (sizeof(TX) == 2) return __bfloat162float(__float2bfloat16(s));
        return s;
    } else {
        return dj_ld((const TX *)in.a, j);
    }
}

/* Prologue: x[k] into shared memory (as the unfused op stores it: bf16,
 * widened to f32 for FP8 and 4-bit rows); then warps stride over the group's
 * rows, each row as its format's GEMV sums it (lane-strided 16-byte loads,
 * xor-shuffle reduction), so the outputs equal the unfused launches'. TX: the
 * norm's input type. */
template <int MODE, typename TX, typename TO, int WF>
static __global__ void __launch_bounds__(FOLD_THREADS, 2)
    gemv_fold_kernel(fold_segs sg, fold_in in, uint32_t k) {
    dj_pdl_release();
    extern __shared__ uint4 xs_raw[];
    __nv_bfloat16 *xs = (__nv_bfloat16 *)xs_raw; /* WF_BF16: [k] */
    float *xf = (float *)xs_raw;                 /* else: [k], then (WF_Q4) [k / 32] chunk sums */
    __shared__ float part[NORM_PART / 32];
    __shared__ float inv_rms;
    const uint32_t t = threadIdx.x;
    const bool first = blockIdx.x == 0;
    dj_pdl_wait();
    if constexpr (MODE == DJ_FOLD_SILU) {
        const __nv_bfloat16 *gate = (const __nv_bfloat16 *)in.a;
        for (uint32_t j = t; j < k; j += FOLD_THREADS) {
            const float g = __bfloat162float(gate[j]);
            const __nv_bfloat16 v = __float2bfloat16(g / (1.0f + expf(-g)) * __bfloat162float(in.b[j]));
            if constexpr (WF == WF_BF16) xs[j] = v;
            else xf[j] = __bfloat162float(v);
            if (first) in.xout[j] = v;
        }
    } else {
        float s = 0.0f;
        if (t < NORM_PART)
            for (uint32_t j = t; j < k; j += NORM_PART) {
                const float v = norm_in<MODE, TX>(in, j);
                s += v * v;
            }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (t < NORM_PART && (t & 31) == 0) part[t >> 5] = s;
        __syncthreads();
        if (t == 0) {
            float tot = 0.0f;
            for (int i = 0; i < NORM_PART / 32; i++) tot += part[i];
            inv_rms = 1.0f / sqrtf(tot / (float)k + in.eps);
        }
        __syncthreads();
        const float r = inv_rms;
        for (uint32_t j = t; j < k; j += FOLD_THREADS) {
            const float h = norm_in<MODE, TX>(in, j);
            const __nv_bfloat16 v = __float2bfloat16(__bfloat162float(in.nw[j]) * (h * r));
            if constexpr (WF == WF_BF16) xs[j] = v;
            else xf[j] = __bfloat162float(v);
            if (first) {
                in.xout[j] = v;
                if constexpr (MODE == DJ_FOLD_ADD_NORM) dj_st((TX *)in.hout, j, h);
            }
        }
    }
    __syncthreads();
    if constexpr (WF == WF_Q4) { /* each 32 columns' sum of x, added as gemv_q4_kernel adds it */
        float *sx = xf + k;
        for (uint32_t c = t; c < k / 32; c += FOLD_THREADS) {
            const float *x32 = xf + 32 * (size_t)c;
            float v = 0.0f;
#pragma unroll
            for (int h = 0; h < 4; h++)
#pragma unroll
                for (int e = 0; e < 4; e++) v += x32[8 * h + 2 * e] + x32[8 * h + 2 * e + 1];
            sx[c] = v;
        }
        __syncthreads();
    }
    const uint32_t lane = t & 31, total = sg.first_row[sg.count];
    for (uint32_t row = blockIdx.x * FOLD_WARPS + (t >> 5); row < total; row += gridDim.x * FOLD_WARPS) {
        int si = 0;
        while (si + 1 < sg.count && row >= sg.first_row[si + 1]) si++;
        const uint32_t j = row - sg.first_row[si];
        float acc = 0.0f;
        if constexpr (WF == WF_BF16) { /* gemv_kernel's vec loop */
            const __nv_bfloat16 *wr = (const __nv_bfloat16 *)sg.w[si] + (size_t)j * k;
#pragma unroll 4
            for (uint32_t kk = lane * 8; kk < k; kk += 256) {
                float wf[8], xv[8];
                widen8_bf16(*(const uint4 *)(wr + kk), wf);
                widen8_bf16(*(const uint4 *)(xs + kk), xv);
#pragma unroll
                for (int e = 0; e < 8; e++) acc += wf[e] * xv[e];
            }
        } else if constexpr (WF == WF_F8) { /* gemv_f8_kernel's vec loop */
            const uint8_t *wr = (const uint8_t *)sg.w[si] + (size_t)j * k;
            const uint32_t bc = sg.bc[si], per_row = (k + bc - 1) / bc;
            const float *sr = sg.scale[si] + (size_t)(j / sg.br[si]) * per_row;
#pragma unroll 4
            for (uint32_t kk = lane * 16; kk < k; kk += 512) {
                const float s = sr[kk / bc];
                float wf[16];
                dj_f8x16(*(const uint4 *)(wr + kk), wf);
                const float *xv = xf + kk;
                float p = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    p += wf[2 * i] * xv[2 * i];
                    p += wf[2 * i + 1] * xv[2 * i + 1];
                }
                acc += s * p;
            }
        } else { /* gemv_q4_kernel's vec loop: 32 columns (16 bytes) a lane */
            const uint32_t ng = k / DJ_Q4_GROUP;
            const uint8_t *wr = (const uint8_t *)sg.w[si] + (size_t)j * (k / 2 + 4 * (size_t)ng);
            const __half *sc = (const __half *)(wr + k / 2);
            const float *sx = xf + k;
#pragma unroll 2
            for (uint32_t c = lane; c < k / 32; c += 32) {
                const uint4 q = *(const uint4 *)(wr + 16 * (size_t)c);
                const float s = __half2float(sc[c / 4]), z128 = 128.0f + __half2float(sc[ng + c / 4]);
                const float p = dj_q4_dot32_128(q, xf + 32 * (size_t)c);
                acc = fmaf(s, fmaf(-z128, sx[c], p), acc);
            }
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) dj_st((TO *)sg.out[si], j, acc + fold_bias(sg.bias[si], sg.bias_dtype[si], j));
    }
}

/* Dynamic shared memory of a launch: x, and the 4-bit chunk sums. */
static size_t fold_smem(dj_dtype w_dtype, uint32_t k) {
    if (w_dtype == DJ_DTYPE_BF16) return (size_t)k * 2;
    return (size_t)k * 4 + (w_dtype == DJ_DTYPE_Q4 ? (size_t)k / 32 * 4 : 0);
}

/* The format's GEMV takes its 16-byte-load loop for these rows (what the
 * fold reproduces): bf16 k % 8, FP8 k % 16 with 16-column scale blocks,
 * 4-bit k % 512 (16-byte aligned rows); every w 16-byte aligned. */
static bool fold_vec(const dj_op_call *calls, int count) {
    const dj_op_call *g = &calls[0];
    const uint32_t k = g->k;
    if (g->w_dtype == DJ_DTYPE_BF16 ? k % 8 != 0 : g->w_dtype == DJ_DTYPE_F8_E4M3 ? k % 16 != 0
                                                 : g->w_dtype == DJ_DTYPE_Q4 ? k % 512 != 0 : true)
        return false;
    for (int i = 0; i < count; i++) {
        const dj_op_call *c = &calls[i];
        if ((uintptr_t)c->w % 16 != 0) return false;
        if (c->w_dtype == DJ_DTYPE_F8_E4M3 &&
            (!c->w_scale || !c->w_block_rows || !c->w_block_cols || (c->w_block_cols % 16 && c->w_block_cols < k)))
            return false;
    }
    return true;
}

bool dj__cuda_gemv_fold_fits(const dj_cuda_backend *cb, const dj_op_call *calls, int count, const dj_gemv_fold *f) {
    const dj_op_call *g = &calls[0], *src = f->norm ? f->norm : f->silu;
    if (!src || g->n != 1 || g->k > FOLD_MAX_K || !fold_vec(calls, count) || (uintptr_t)g->x % 16 != 0 ||
        g->x != src->out || src->n != 1 || src->d != g->k || fold_smem(g->w_dtype, g->k) + 1024 > cb->smem_optin)
        return false;
    const size_t k = g->k;
    /* what the prologue reads and writes, as [ptr, bytes) */
    const void *rd[3] = {NULL, NULL, NULL}, *wr[2] = {src->out, NULL};
    size_t rn[3] = {0, 0, 0}, wn[2] = {k * 2, 0};
    if (f->silu) {
        if (f->norm || f->add || f->silu->op != DJ_OP_SILU_MUL) return false;
        rd[0] = f->silu->x, rn[0] = k * 2;
        rd[1] = f->silu->x2, rn[1] = k * 2;
    } else {
        const dj_op_call *nm = f->norm;
        if (nm->op != DJ_OP_RMSNORM || nm->w_dtype != DJ_DTYPE_BF16 || nm->w_offset != 0.0f || nm->groups > 1)
            return false; /* the prologue is the plain Llama norm of one whole row */
        rd[2] = nm->w, rn[2] = k * 2;
        if (f->add) {
            const dj_op_call *ad = f->add;
            if (ad->op != DJ_OP_ADD || ad->n != 1 || ad->d != k || nm->x != ad->out ||
                ad->x_dtype != ad->out_dtype || nm->x_dtype != ad->out_dtype)
                return false;
            rd[0] = ad->x, rn[0] = k * dj_dtype_size(ad->x_dtype);
            rd[1] = ad->x2, rn[1] = k * 2;
            wr[1] = ad->out, wn[1] = k * dj_dtype_size(ad->out_dtype);
        } else {
            rd[0] = nm->x, rn[0] = k * dj_dtype_size(nm->x_dtype);
        }
    }
    /* Block 0 writes the prologue's outputs while other blocks read its
     * inputs, and every block writes the GEMV outputs: none may touch
     * another's buffers. */
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 3; b++)
            if (wr[a] && rd[b] && dj__bytes_overlap(wr[a], wn[a], rd[b], rn[b])) return false;
    if (wr[1] && dj__bytes_overlap(wr[0], wn[0], wr[1], wn[1])) return false;
    const size_t es = dj_dtype_size(g->out_dtype);
    for (int i = 0; i < count; i++) {
        const size_t ob = (size_t)calls[i].m * es;
        for (int b = 0; b < 3; b++)
            if (rd[b] && dj__bytes_overlap(calls[i].out, ob, rd[b], rn[b])) return false;
        for (int a = 0; a < 2; a++)
            if (wr[a] && dj__bytes_overlap(calls[i].out, ob, wr[a], wn[a])) return false;
    }
    return true;
}

template <int MODE, typename TX, typename TO, int WF>
static cudaError_t launch_fold(dj_cuda_backend *cb, const fold_segs &sg, const fold_in &in, uint32_t k, size_t smem) {
    const uint32_t total = sg.first_row[sg.count];
    uint32_t blocks = (total + FOLD_WARPS - 1) / FOLD_WARPS, cap = (uint32_t)cb->n_sm * 2;
    if (blocks > cap) blocks = cap;
    if (smem > 48 * 1024) { /* past the default: opted in (fits checked smem_optin) */
        const cudaError_t e = cudaFuncSetAttribute(gemv_fold_kernel<MODE, TX, TO, WF>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
    }
    return dj__launch(cb, gemv_fold_kernel<MODE, TX, TO, WF>, dim3(blocks), dim3(FOLD_THREADS), smem, sg, in, k);
}

template <int MODE, typename TX, typename TO>
static cudaError_t launch_fold_wf(dj_cuda_backend *cb, const dj_op_call *g, const fold_segs &sg, const fold_in &in) {
    const size_t smem = fold_smem(g->w_dtype, g->k);
    if (g->w_dtype == DJ_DTYPE_F8_E4M3) return launch_fold<MODE, TX, TO, WF_F8>(cb, sg, in, g->k, smem);
    if (g->w_dtype == DJ_DTYPE_Q4) return launch_fold<MODE, TX, TO, WF_Q4>(cb, sg, in, g->k, smem);
    return launch_fold<MODE, TX, TO, WF_BF16>(cb, sg, in, g->k, smem);
}

template <int MODE, typename TX>
static cudaError_t launch_fold_out(dj_cuda_backend *cb, const dj_op_call *g, const fold_segs &sg,
                                   const fold_in &in) {
    if (g->out_dtype == DJ_DTYPE_F32) return launch_fold_wf<MODE, TX, float>(cb, g, sg, in);
    return launch_fold_wf<MODE, TX, __nv_bfloat16>(cb, g, sg, in);
}

dj_status dj__cuda_gemv_fold(dj_cuda_backend *cb, const dj_op_call *calls, int count, const dj_gemv_fold *f) {
    fold_segs sg;
    memset(&sg, 0, sizeof sg);
    uint32_t rows = 0;
    for (int i = 0; i < count; i++) {
        sg.w[i] = calls[i].w;
        sg.scale[i] = calls[i].w_scale;
        sg.br[i] = calls[i].w_block_rows;
        sg.bc[i] = calls[i].w_block_cols;
        sg.bias[i] = calls[i].bias;
        sg.bias_dtype[i] = (int)calls[i].bias_dtype;
        sg.out[i] = calls[i].out;
        sg.first_row[i] = rows;
        rows += calls[i].m;
    }
    sg.first_row[count] = rows;
    sg.count = count;
    fold_in in;
    memset(&in, 0, sizeof in);
    const dj_op_call *g = &calls[0];
    cudaError_t e = cudaSuccess;
    if (f->silu) {
        in.a = f->silu->x;
        in.b = (const __nv_bfloat16 *)f->silu->x2;
        in.xout = (__nv_bfloat16 *)f->silu->out;
        e = launch_fold_out<DJ_FOLD_SILU, __nv_bfloat16>(cb, g, sg, in);
    } else {
        in.nw = (const __nv_bfloat16 *)f->norm->w;
        in.xout = (__nv_bfloat16 *)f->norm->out;
        in.eps = f->norm->eps;
        const dj_op_call *src = f->add ? f->add : f->norm;
        in.a = src->x;
        const bool f32 = src->x_dtype == DJ_DTYPE_F32;
        if (f->add) {
            in.b = (const __nv_bfloat16 *)f->add->x2;
            in.hout = f->add->out;
            e = f32 ? launch_fold_out<DJ_FOLD_ADD_NORM, float>(cb, g, sg, in)
                    : launch_fold_out<DJ_FOLD_ADD_NORM, __nv_bfloat16>(cb, g, sg, in);
        } else {
            e = f32 ? launch_fold_out<DJ_FOLD_NORM, float>(cb, g, sg, in)
                    : launch_fold_out<DJ_FOLD_NORM, __nv_bfloat16>(cb, g, sg, in);
        }
    }
    DJ_CU(cb, e);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
