/* cuda_gemv_fold.cu: a decode GEMV group (one row, bf16 weights) that computes its own input - SiLU(gate)*up,
 * RMSNorm, or residual ADD + RMSNorm - into shared memory first, saving that op's launch and round trip. */
#include <string.h>

#include "backend/cuda/cuda_impl.h"

#define FOLD_THREADS 512
#define FOLD_WARPS (FOLD_THREADS / 32)
#define NORM_PART 256 /* threads that sum squares: rmsnorm_kernel's partition, so the norm is bit-equal */
#define FOLD_MAX_K 16384 /* x as bf16 (32 KB) beside the static shared memory, inside the 48 KB without opt-in */

/* The group's segments: segment i owns rows [first_row[i], first_row[i+1]). */
struct fold_segs {
    const __nv_bfloat16 *w[DJ_GEMV_GROUP];
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

/* Prologue: x[k] into shared memory (bf16, as the unfused op stores it);
 * then warps stride over the group's rows, each row as gemv_kernel sums it
 * (lane-strided 16-byte loads, 4 in flight, xor-shuffle reduction), so the
 * outputs equal the unfused launches'. TX: the norm's input type. */
template <int MODE, typename TX, typename TO>
static __global__ void __launch_bounds__(FOLD_THREADS, 2)
    gemv_fold_kernel(fold_segs sg, fold_in in, uint32_t k, uint32_t pf) {
    dj_pdl_release();
    extern __shared__ uint4 xs_raw[];
    __nv_bfloat16 *xs = (__nv_bfloat16 *)xs_raw;
    __shared__ float part[NORM_PART / 32];
    __shared__ float inv_rms;
    const uint32_t t = threadIdx.x;
    const bool first = blockIdx.x == 0;
    if (pf) { /* the warp's first row */
        const uint32_t row = blockIdx.x * FOLD_WARPS + (t >> 5);
        if (row < sg.first_row[sg.count]) {
            int si = 0;
            while (si + 1 < sg.count && row >= sg.first_row[si + 1]) si++;
            dj_prefetch_l2(sg.w[si] + (size_t)(row - sg.first_row[si]) * k, pf);
        }
    }
    dj_pdl_wait();
    if constexpr (MODE == DJ_FOLD_SILU) {
        const __nv_bfloat16 *gate = (const __nv_bfloat16 *)in.a;
        for (uint32_t j = t; j < k; j += FOLD_THREADS) {
            const float g = __bfloat162float(gate[j]);
            const __nv_bfloat16 v = __float2bfloat16(g / (1.0f + expf(-g)) * __bfloat162float(in.b[j]));
            xs[j] = v;
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
            xs[j] = v;
            if (first) {
                in.xout[j] = v;
                if constexpr (MODE == DJ_FOLD_ADD_NORM) dj_st((TX *)in.hout, j, h);
            }
        }
    }
    __syncthreads();
    const uint32_t lane = t & 31, total = sg.first_row[sg.count];
    for (uint32_t row = blockIdx.x * FOLD_WARPS + (t >> 5); row < total; row += gridDim.x * FOLD_WARPS) {
        int si = 0;
        while (si + 1 < sg.count && row >= sg.first_row[si + 1]) si++;
        const uint32_t j = row - sg.first_row[si];
        const __nv_bfloat16 *wr = sg.w[si] + (size_t)j * k;
        float acc = 0.0f;
#pragma unroll 4
        for (uint32_t kk = lane * 8; kk < k; kk += 256) {
            float wf[8], xf[8];
            widen8_bf16(*(const uint4 *)(wr + kk), wf);
            widen8_bf16(*(const uint4 *)(xs + kk), xf);
#pragma unroll
            for (int e = 0; e < 8; e++) acc += wf[e] * xf[e];
        }
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) dj_st((TO *)sg.out[si], j, acc + fold_bias(sg.bias[si], sg.bias_dtype[si], j));
    }
}

bool dj__cuda_gemv_fold_fits(const dj_cuda_backend *cb, const dj_op_call *calls, int count, const dj_gemv_fold *f) {
    (void)cb;
    const dj_op_call *g = &calls[0], *src = f->norm ? f->norm : f->silu;
    if (!src || g->n != 1 || g->w_dtype != DJ_DTYPE_BF16 || g->k % 8 != 0 || g->k > FOLD_MAX_K ||
        (uintptr_t)g->x % 16 != 0 || g->x != src->out || src->n != 1 || src->d != g->k)
        return false;
    for (int i = 0; i < count; i++)
        if ((uintptr_t)calls[i].w % 16 != 0) return false;
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

template <int MODE, typename TX, typename TO>
static void launch_fold(dj_cuda_backend *cb, const fold_segs &sg, const fold_in &in, uint32_t k) {
    const uint32_t total = sg.first_row[sg.count];
    uint32_t blocks = (total + FOLD_WARPS - 1) / FOLD_WARPS, cap = (uint32_t)cb->n_sm * 2;
    if (blocks > cap) blocks = cap;
    dj__launch(cb, gemv_fold_kernel<MODE, TX, TO>, dim3(blocks), dim3(FOLD_THREADS), (size_t)k * 2, sg, in, k,
               dj__pdl_prefetch(cb));
}

template <int MODE, typename TX>
static void launch_fold_out(dj_cuda_backend *cb, const dj_op_call *g, const fold_segs &sg, const fold_in &in) {
    if (g->out_dtype == DJ_DTYPE_F32)
        launch_fold<MODE, TX, float>(cb, sg, in, g->k);
    else
        launch_fold<MODE, TX, __nv_bfloat16>(cb, sg, in, g->k);
}

dj_status dj__cuda_gemv_fold(dj_cuda_backend *cb, const dj_op_call *calls, int count, const dj_gemv_fold *f) {
    fold_segs sg;
    memset(&sg, 0, sizeof sg);
    uint32_t rows = 0;
    for (int i = 0; i < count; i++) {
        sg.w[i] = (const __nv_bfloat16 *)calls[i].w;
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
    if (f->silu) {
        in.a = f->silu->x;
        in.b = (const __nv_bfloat16 *)f->silu->x2;
        in.xout = (__nv_bfloat16 *)f->silu->out;
        launch_fold_out<DJ_FOLD_SILU, __nv_bfloat16>(cb, g, sg, in);
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
            if (f32)
                launch_fold_out<DJ_FOLD_ADD_NORM, float>(cb, g, sg, in);
            else
                launch_fold_out<DJ_FOLD_ADD_NORM, __nv_bfloat16>(cb, g, sg, in);
        } else if (f32) {
            launch_fold_out<DJ_FOLD_NORM, float>(cb, g, sg, in);
        } else {
            launch_fold_out<DJ_FOLD_NORM, __nv_bfloat16>(cb, g, sg, in);
        }
    }
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
