/* cuda_arch_ops.cu: the CUDA kernels of the ops beyond Llama - GeGLU on bf16
 * activations, logit soft-capping (f32), and the mixture of experts: the
 * router's top-k softmax, and one expert's MLP over the rows routed to it,
 * which reads that expert's weights only when some row chose it. */
#include "backend/cuda/cuda_impl.h"

#define AO_THREADS 256
#define MOE_WARPS 8 /* weight rows per block of the expert kernels: one per warp */

static unsigned ao_blocks(const dj_cuda_backend *cb, size_t count) {
    size_t b = (count + AO_THREADS - 1) / AO_THREADS, cap = (size_t)cb->n_sm * 16;
    return (unsigned)(b < cap ? b : cap);
}

/* PyTorch's gelu(approximate="tanh") in f32. */
static __device__ __forceinline__ float gelu_tanh(float x) {
    const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

static __global__ void gelu_mul_kernel(const __nv_bfloat16 *gate, const __nv_bfloat16 *up, __nv_bfloat16 *out,
                                       size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(gelu_tanh(__bfloat162float(gate[i])) * __bfloat162float(up[i]));
}

dj_status dj__cuda_gelu_mul(dj_cuda_backend *cb, const dj_op_call *c) {
    const size_t count = (size_t)c->n * c->d;
    gelu_mul_kernel<<<dim3(ao_blocks(cb, count)), dim3(AO_THREADS), 0, cb->stream>>>(
        (const __nv_bfloat16 *)c->x, (const __nv_bfloat16 *)c->x2, (__nv_bfloat16 *)c->out, count);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

static __global__ void softcap_kernel(const float *x, float *out, size_t count, float cap) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        out[i] = tanhf(x[i] / cap) * cap;
}

dj_status dj__cuda_softcap(dj_cuda_backend *cb, const dj_op_call *c) {
    const size_t count = (size_t)c->n * c->d;
    softcap_kernel<<<dim3(ao_blocks(cb, count)), dim3(AO_THREADS), 0, cb->stream>>>(
        (const float *)c->x, (float *)c->out, count, c->softcap);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

/* One thread per row: softmax over the m router logits in f32, the top_k
 * largest (lowest index first on ties) divided by their sum, 0 elsewhere. */
static __global__ void moe_route_kernel(const __nv_bfloat16 *x, float *out, uint32_t n, uint32_t m, uint32_t k) {
    const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const __nv_bfloat16 *xr = x + (size_t)i * m;
    float *o = out + (size_t)i * m;
    float mx = -INFINITY, z = 0.0f;
    for (uint32_t e = 0; e < m; e++) mx = fmaxf(mx, __bfloat162float(xr[e]));
    for (uint32_t e = 0; e < m; e++) z += expf(__bfloat162float(xr[e]) - mx);
    for (uint32_t e = 0; e < m; e++) o[e] = 0.0f;
    float sum = 0.0f;
    for (uint32_t t = 0; t < k; t++) {
        uint32_t best = m;
        float bp = 0.0f;
        for (uint32_t e = 0; e < m; e++) {
            if (o[e] != 0.0f) continue;
            const float p = expf(__bfloat162float(xr[e]) - mx) / z;
            if (best == m || p > bp) {
                best = e;
                bp = p;
            }
        }
        o[best] = bp > 0.0f ? bp : 1e-38f; /* taken */
        sum += bp;
    }
    for (uint32_t e = 0; e < m; e++)
        if (o[e] != 0.0f) o[e] = (o[e] == 1e-38f ? 0.0f : o[e]) / sum;
}

dj_status dj__cuda_moe_route(dj_cuda_backend *cb, const dj_op_call *c) {
    moe_route_kernel<<<dim3((c->n + 127) / 128), dim3(128), 0, cb->stream>>>((const __nv_bfloat16 *)c->x,
                                                                             (float *)c->out, c->n, c->m, c->top_k);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

/* Whether any of the n rows routes to expert e (the block's threads share the answer). */
static __device__ bool any_routed(const float *route, uint32_t n, uint32_t m, uint32_t e) {
    int hit = 0;
    for (uint32_t i = threadIdx.x; i < n && !hit; i += blockDim.x) hit = route[(size_t)i * m + e] != 0.0f;
    return __syncthreads_or(hit) != 0;
}

static __device__ __forceinline__ float warp_sum(float s) {
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

/* h[i][j] = silu(gate[j] . x_i) * (up[j] . x_i) for the rows routed to e;
 * one warp per j. */
template <typename TW>
static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_up_kernel(const __nv_bfloat16 *x, const float *route, const TW *gate, const TW *up, float *h, uint32_t n,
                  uint32_t k, uint32_t f, uint32_t m, uint32_t e) {
    if (!any_routed(route, n, m, e)) return; /* no row chose this expert: its weights are not read */
    const uint32_t lane = threadIdx.x & 31, j = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (j >= f) return;
    const TW *gr = gate + (size_t)j * k, *ur = up + (size_t)j * k;
    for (uint32_t i = 0; i < n; i++) {
        if (route[(size_t)i * m + e] == 0.0f) continue;
        const __nv_bfloat16 *xr = x + (size_t)i * k;
        float g = 0.0f, u = 0.0f;
        for (uint32_t c = lane; c < k; c += 32) {
            const float xv = __bfloat162float(xr[c]);
            g += dj_ld(gr, c) * xv;
            u += dj_ld(ur, c) * xv;
        }
        g = warp_sum(g);
        u = warp_sum(u);
        if (lane == 0) h[(size_t)i * f + j] = g / (1.0f + expf(-g)) * u;
    }
}

/* out[i][o] = x2[i][o] + route[i][e] * (down[o] . h_i) for routed rows, x2
 * (or 0) for the others; one warp per o. */
template <typename TW>
static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_kernel(const __nv_bfloat16 *x2, const float *route, const TW *down, const float *h, __nv_bfloat16 *out,
                    uint32_t n, uint32_t k, uint32_t f, uint32_t m, uint32_t e) {
    const bool any = any_routed(route, n, m, e);
    const uint32_t lane = threadIdx.x & 31, o = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (o >= k) return;
    const TW *dr = down + (size_t)o * f;
    for (uint32_t i = 0; i < n; i++) {
        const float r = route[(size_t)i * m + e];
        const float base = x2 ? __bfloat162float(x2[(size_t)i * k + o]) : 0.0f;
        if (!any || r == 0.0f) {
            if (lane == 0) out[(size_t)i * k + o] = __float2bfloat16(base);
            continue;
        }
        const float *hr = h + (size_t)i * f;
        float s = 0.0f;
        for (uint32_t c = lane; c < f; c += 32) s += dj_ld(dr, c) * hr[c];
        s = warp_sum(s);
        if (lane == 0) out[(size_t)i * k + o] = __float2bfloat16(base + s * r);
    }
}

template <typename TW>
static void launch_moe(dj_cuda_backend *cb, const dj_op_call *c, float *h) {
    const uint32_t n = c->n, k = c->k, f = c->d, m = c->m, e = c->expert;
    moe_up_kernel<TW><<<dim3((f + MOE_WARPS - 1) / MOE_WARPS), dim3(MOE_WARPS * 32), 0, cb->stream>>>(
        (const __nv_bfloat16 *)c->x, c->route, (const TW *)c->w, (const TW *)c->w_up, h, n, k, f, m, e);
    moe_down_kernel<TW><<<dim3((k + MOE_WARPS - 1) / MOE_WARPS), dim3(MOE_WARPS * 32), 0, cb->stream>>>(
        (const __nv_bfloat16 *)c->x2, c->route, (const TW *)c->w_down, h, (__nv_bfloat16 *)c->out, n, k, f, m, e);
}

dj_status dj__cuda_moe_ffn(dj_cuda_backend *cb, const dj_op_call *c) {
    float *h = NULL;
    dj_status st = dj__cuda_scratch(cb, (size_t)c->n * c->d, &h);
    if (st != DJ_OK) return st;
    switch (c->w_dtype) {
    case DJ_DTYPE_BF16: launch_moe<__nv_bfloat16>(cb, c, h); break;
    case DJ_DTYPE_F16: launch_moe<__half>(cb, c, h); break;
    default: launch_moe<float>(cb, c, h); break;
    }
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
