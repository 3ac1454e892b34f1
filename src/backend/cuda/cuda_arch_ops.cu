/* cuda_arch_ops.cu: the CUDA kernels of the ops beyond Llama - GeGLU on bf16
 * activations, logit soft-capping (f32), and the mixture of experts: the
 * router's top-k softmax, and one expert's MLP. Up to 31 rows: GEMV kernels
 * over the rows routed to the expert (16-byte loads of bf16 weights, up to 4
 * rows per pass over a weight row) that read the expert's weights only when
 * some row chose it; from 32 rows: the routed rows gathered, cuBLAS GEMMs
 * over them alone, the result scattered back onto the sum (a grouped GEMM,
 * one group per expert call; the row count comes back to the host: one
 * sync), except in a graph capture, which cannot record that sync: there
 * cuBLAS GEMMs over every row, weighted by the route (0 for rows that did
 * not choose it). */
#include "backend/cuda/cuda_impl.h"

#define AO_THREADS 256
#define MOE_WARPS 8 /* weight rows per block of the expert kernels: one per warp */

static unsigned ao_blocks(const dj_cuda_backend *cb, size_t count) {
    size_t b = (count + AO_THREADS - 1) / AO_THREADS, cap = (size_t)cb->n_sm * 16;
    return (unsigned)(b < cap ? b : cap);
}

static __global__ void gelu_mul_kernel(const __nv_bfloat16 *gate, const __nv_bfloat16 *up, __nv_bfloat16 *out,
                                       size_t count, bool vec) {
    dj_pdl_release();
    dj_pdl_wait();
    dj_glu(gate, up, out, count, vec, dj_gelu_fn());
}

dj_status dj__cuda_gelu_mul(dj_cuda_backend *cb, const dj_op_call *c) {
    const size_t count = (size_t)c->n * c->d;
    const bool vec = dj_glu_vec(c->x, c->x2, c->out, count);
    dj__launch(cb, gelu_mul_kernel, dim3(ao_blocks(cb, vec ? count / 8 : count)), dim3(AO_THREADS), 0,
               (const __nv_bfloat16 *)c->x, (const __nv_bfloat16 *)c->x2, (__nv_bfloat16 *)c->out, count, vec);
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

/* ---- bf16 weights: 16-byte loads, up to MOE_TILE routed rows per pass over a weight row ---- */

#define MOE_TILE 4

/* acc[r] += w[0..8) . x_r[0..8), w and x_r 8 bf16 each. */
static __device__ __forceinline__ float dot8(uint4 w, uint4 x) {
    const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&w, *xp = (const __nv_bfloat162 *)&x;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 a = __bfloat1622float2(wp[i]), b = __bfloat1622float2(xp[i]);
        s += a.x * b.x + a.y * b.y;
    }
    return s;
}

static __device__ __forceinline__ float dot8f(uint4 w, const float *h) {
    const __nv_bfloat162 *wp = (const __nv_bfloat162 *)&w;
    const float4 h0 = *(const float4 *)h, h1 = *(const float4 *)(h + 4);
    const float2 a = __bfloat1622float2(wp[0]), b = __bfloat1622float2(wp[1]), c = __bfloat1622float2(wp[2]),
                 d = __bfloat1622float2(wp[3]);
    return a.x * h0.x + a.y * h0.y + b.x * h0.z + b.y * h0.w + c.x * h1.x + c.y * h1.y + d.x * h1.z + d.y * h1.w;
}

/* The next up to MOE_TILE rows from *i on routed to e, into rows[]; returns how many. */
static __device__ __forceinline__ int next_rows(const float *route, uint32_t n, uint32_t m, uint32_t e, uint32_t *i,
                                                uint32_t rows[MOE_TILE]) {
    int got = 0;
    for (; *i < n && got < MOE_TILE; (*i)++)
        if (route[(size_t)*i * m + e] != 0.0f) rows[got++] = *i;
    return got;
}

static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_up_bf16_kernel(const __nv_bfloat16 *x, const float *route, const __nv_bfloat16 *gate,
                       const __nv_bfloat16 *up, float *h, uint32_t n, uint32_t k, uint32_t f, uint32_t m, uint32_t e) {
    if (!any_routed(route, n, m, e)) return; /* no row chose this expert: its weights are not read */
    const uint32_t lane = threadIdx.x & 31, j = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (j >= f) return;
    const uint4 *g4 = (const uint4 *)(gate + (size_t)j * k), *u4 = (const uint4 *)(up + (size_t)j * k);
    const uint32_t k8 = k / 8;
    uint32_t i = 0, rows[MOE_TILE];
    for (int nr; (nr = next_rows(route, n, m, e, &i, rows)) > 0;) {
        float g[MOE_TILE] = {0.0f}, u[MOE_TILE] = {0.0f};
        for (uint32_t c = lane; c < k8; c += 32) {
            const uint4 gw = g4[c], uw = u4[c];
#pragma unroll
            for (int r = 0; r < MOE_TILE; r++) {
                if (r >= nr) break;
                const uint4 xv = ((const uint4 *)(x + (size_t)rows[r] * k))[c];
                g[r] += dot8(gw, xv);
                u[r] += dot8(uw, xv);
            }
        }
#pragma unroll
        for (int r = 0; r < MOE_TILE; r++) {
            if (r >= nr) break;
            const float gs = warp_sum(g[r]), us = warp_sum(u[r]);
            if (lane == 0) h[(size_t)rows[r] * f + j] = gs / (1.0f + expf(-gs)) * us;
        }
    }
}

static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_bf16_kernel(const __nv_bfloat16 *x2, const float *route, const __nv_bfloat16 *down, const float *h,
                         __nv_bfloat16 *out, uint32_t n, uint32_t k, uint32_t f, uint32_t m, uint32_t e) {
    const bool any = any_routed(route, n, m, e);
    const uint32_t lane = threadIdx.x & 31, o = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (o >= k) return;
    for (uint32_t i = lane; i < n; i += 32) /* the rows no token of which chose e: the sum as it was */
        if (!any || route[(size_t)i * m + e] == 0.0f)
            out[(size_t)i * k + o] = __float2bfloat16(x2 ? __bfloat162float(x2[(size_t)i * k + o]) : 0.0f);
    if (!any) return;
    const uint4 *d4 = (const uint4 *)(down + (size_t)o * f);
    const uint32_t f8 = f / 8;
    uint32_t i = 0, rows[MOE_TILE];
    for (int nr; (nr = next_rows(route, n, m, e, &i, rows)) > 0;) {
        float s[MOE_TILE] = {0.0f};
        for (uint32_t c = lane; c < f8; c += 32) {
            const uint4 dw = d4[c];
#pragma unroll
            for (int r = 0; r < MOE_TILE; r++) {
                if (r >= nr) break;
                s[r] += dot8f(dw, h + (size_t)rows[r] * f + (size_t)c * 8);
            }
        }
#pragma unroll
        for (int r = 0; r < MOE_TILE; r++) {
            if (r >= nr) break;
            const float t = warp_sum(s[r]);
            const size_t at = (size_t)rows[r] * k + o;
            if (lane == 0)
                out[at] = __float2bfloat16((x2 ? __bfloat162float(x2[at]) : 0.0f) + t * route[(size_t)rows[r] * m + e]);
        }
    }
}

/* ---- many rows in a graph capture: dense GEMMs over every row (tensor cores), weighted by
 * route (0 for the rows that did not choose e) - four times the work of the routed rows alone
 * at top-2 of 8, but at tensor-core rate and without a sync (recorded batched decode) ---- */

#define MOE_DENSE_ROWS 32
/* From this many rows the routed rows alone go through the GEMMs, except in a graph capture
 * (the sync that brings their count to the host cannot be recorded), where the dense GEMMs
 * run. Measured (H100, Mixtral-8x7B shape with 16 layers, bench_gpu --prefill P, 2026-11-26,
 * bench/RESULTS.md): grouped against dense at P = 32 0.0192 / 0.0202 s, 64 0.0199 / 0.0207,
 * 128 0.0214 / 0.0224, 512 0.0274 / 0.0430 - grouped from the dense path's first row. */
#define MOE_GROUPED_ROWS MOE_DENSE_ROWS

static __global__ void silu_mul_inplace_kernel(__nv_bfloat16 *g, const __nv_bfloat16 *u, size_t count) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x) {
        const float a = __bfloat162float(g[i]);
        g[i] = __float2bfloat16(a / (1.0f + expf(-a)) * __bfloat162float(u[i]));
    }
}

static __global__ void moe_combine_kernel(const __nv_bfloat16 *x2, const __nv_bfloat16 *y, const float *route,
                                          __nv_bfloat16 *out, uint32_t n, uint32_t k, uint32_t m, uint32_t e) {
    const size_t count = (size_t)n * k;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < count; t += (size_t)gridDim.x * blockDim.x) {
        const float r = route[(t / k) * m + e], base = x2 ? __bfloat162float(x2[t]) : 0.0f;
        out[t] = __float2bfloat16(r != 0.0f ? base + __bfloat162float(y[t]) * r : base);
    }
}

static dj_status moe_dense(dj_cuda_backend *cb, const dj_op_call *c) {
    const int n = (int)c->n, k = (int)c->k, f = (int)c->d;
    const size_t gu = (size_t)c->n * c->d, y = (size_t)c->n * c->k; /* bf16 elements */
    float *buf = NULL;
    dj_status st = dj__cuda_scratch(cb, (2 * gu + y + 1) / 2, &buf);
    if (st != DJ_OK) return st;
    __nv_bfloat16 *G = (__nv_bfloat16 *)buf, *U = G + gu, *Y = U + gu;
    const float alpha = 1.0f, beta = 0.0f;
    /* column-major: G^T[f,n] = Wg[k,f]^T X^T[k,n], as the matmul's cuBLAS path */
    DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, f, n, k, &alpha, c->w, CUDA_R_16BF, k, c->x,
                               CUDA_R_16BF, k, &beta, G, CUDA_R_16BF, f, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, f, n, k, &alpha, c->w_up, CUDA_R_16BF, k, c->x,
                               CUDA_R_16BF, k, &beta, U, CUDA_R_16BF, f, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    silu_mul_inplace_kernel<<<dim3(ao_blocks(cb, gu)), dim3(AO_THREADS), 0, cb->stream>>>(G, U, gu);
    DJ_CU_LAUNCHED(cb);
    DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, k, n, f, &alpha, c->w_down, CUDA_R_16BF, f, G,
                               CUDA_R_16BF, f, &beta, Y, CUDA_R_16BF, k, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    moe_combine_kernel<<<dim3(ao_blocks(cb, y)), dim3(AO_THREADS), 0, cb->stream>>>(
        (const __nv_bfloat16 *)c->x2, Y, c->route, (__nv_bfloat16 *)c->out, c->n, c->k, c->m, c->expert);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

/* ---- many rows, grouped: gather the rows routed to e, GEMMs over them alone, scatter ---- */

#define MOE_SCAN_THREADS 1024

/* One block: idx[0..*cnt) the rows routed to e in order, pos[i] the place of
 * row i among them (-1: not routed). */
static __global__ void __launch_bounds__(MOE_SCAN_THREADS)
    moe_rows_kernel(const float *route, uint32_t n, uint32_t m, uint32_t e, int32_t *idx, int32_t *pos,
                    uint32_t *cnt) {
    __shared__ uint32_t warp_tot[MOE_SCAN_THREADS / 32];
    __shared__ uint32_t base;
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    if (threadIdx.x == 0) base = 0;
    __syncthreads();
    for (uint32_t i0 = 0; i0 < n; i0 += blockDim.x) {
        const uint32_t i = i0 + threadIdx.x;
        const bool hit = i < n && route[(size_t)i * m + e] != 0.0f;
        const unsigned ballot = __ballot_sync(0xffffffffu, hit);
        if (lane == 0) warp_tot[warp] = __popc(ballot);
        __syncthreads();
        uint32_t before = base; /* rows routed before this warp's, this round included */
        for (uint32_t w = 0; w < warp; w++) before += warp_tot[w];
        before += __popc(ballot & ((1u << lane) - 1u));
        if (i < n) {
            pos[i] = hit ? (int32_t)before : -1;
            if (hit) idx[before] = (int32_t)i;
        }
        __syncthreads(); /* every thread read base and warp_tot */
        if (threadIdx.x == 0)
            for (uint32_t w = 0; w < n_warps; w++) base += warp_tot[w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *cnt = base;
}

/* xe[r] = x[idx[r]] for the ne gathered rows (k bf16 each). */
static __global__ void moe_gather_kernel(const __nv_bfloat16 *x, const int32_t *idx, __nv_bfloat16 *xe, uint32_t ne,
                                         uint32_t k) {
    const size_t count = (size_t)ne * k;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < count; t += (size_t)gridDim.x * blockDim.x)
        xe[t] = x[(size_t)idx[t / k] * k + t % k];
}

/* out[i] = x2[i] (or 0) + route[i][e] * ye[pos[i]] for the routed rows, x2 (or 0) for the others. */
static __global__ void moe_scatter_kernel(const __nv_bfloat16 *x2, const __nv_bfloat16 *ye, const int32_t *pos,
                                          const float *route, __nv_bfloat16 *out, uint32_t n, uint32_t k, uint32_t m,
                                          uint32_t e) {
    const size_t count = (size_t)n * k;
    for (size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; t < count; t += (size_t)gridDim.x * blockDim.x) {
        const size_t i = t / k;
        const int32_t p = pos[i];
        const float base = x2 ? __bfloat162float(x2[t]) : 0.0f;
        out[t] = __float2bfloat16(p >= 0 ? base + __bfloat162float(ye[(size_t)p * k + t % k]) * route[i * m + e]
                                         : base);
    }
}

/* Floats of scratch, rounded up to 32 bytes (cuBLAS wants aligned operands). */
static size_t moe_floats(size_t bytes) { return (bytes + 31) / 32 * 8; }

static dj_status moe_grouped(dj_cuda_backend *cb, const dj_op_call *c) {
    const uint32_t n = c->n, k = c->k, f = c->d, m = c->m, e = c->expert;
    /* scratch for n routed rows at most: idx, pos, the count, x gathered, gate and up, their product's down */
    const size_t o_pos = moe_floats((size_t)n * 4), o_cnt = o_pos + moe_floats((size_t)n * 4),
                 o_x = o_cnt + moe_floats(4), o_g = o_x + moe_floats((size_t)n * k * 2),
                 o_u = o_g + moe_floats((size_t)n * f * 2), o_y = o_u + moe_floats((size_t)n * f * 2),
                 total = o_y + moe_floats((size_t)n * k * 2);
    float *buf = NULL;
    dj_status st = dj__cuda_scratch(cb, total, &buf);
    if (st != DJ_OK) return st;
    int32_t *idx = (int32_t *)buf, *pos = (int32_t *)(buf + o_pos);
    uint32_t *cnt = (uint32_t *)(buf + o_cnt);
    __nv_bfloat16 *X = (__nv_bfloat16 *)(buf + o_x), *G = (__nv_bfloat16 *)(buf + o_g),
                  *U = (__nv_bfloat16 *)(buf + o_u), *Y = (__nv_bfloat16 *)(buf + o_y);
    moe_rows_kernel<<<dim3(1), dim3(MOE_SCAN_THREADS), 0, cb->stream>>>(c->route, n, m, e, idx, pos, cnt);
    DJ_CU_LAUNCHED(cb);
    uint32_t ne = 0;
    DJ_CU(cb, cudaMemcpyAsync(&ne, cnt, sizeof ne, cudaMemcpyDeviceToHost, cb->stream));
    DJ_CU(cb, cudaStreamSynchronize(cb->stream));
    if (ne > n) return dj_fail(DJ_EINTERNAL, "cuda:%d moe: %u of %u rows routed", cb->device, ne, n);
    if (ne) {
        const size_t gu = (size_t)ne * f;
        moe_gather_kernel<<<dim3(ao_blocks(cb, (size_t)ne * k)), dim3(AO_THREADS), 0, cb->stream>>>(
            (const __nv_bfloat16 *)c->x, idx, X, ne, k);
        DJ_CU_LAUNCHED(cb);
        const float alpha = 1.0f, beta = 0.0f;
        const int ni = (int)ne, ki = (int)k, fi = (int)f;
        /* column-major, as moe_dense: G^T[f,ne] = Wg[k,f]^T Xe^T[k,ne] */
        DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, fi, ni, ki, &alpha, c->w, CUDA_R_16BF, ki, X,
                                   CUDA_R_16BF, ki, &beta, G, CUDA_R_16BF, fi, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
        DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, fi, ni, ki, &alpha, c->w_up, CUDA_R_16BF, ki,
                                   X, CUDA_R_16BF, ki, &beta, U, CUDA_R_16BF, fi, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
        silu_mul_inplace_kernel<<<dim3(ao_blocks(cb, gu)), dim3(AO_THREADS), 0, cb->stream>>>(G, U, gu);
        DJ_CU_LAUNCHED(cb);
        DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, ki, ni, fi, &alpha, c->w_down, CUDA_R_16BF, fi,
                                   G, CUDA_R_16BF, fi, &beta, Y, CUDA_R_16BF, ki, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    }
    moe_scatter_kernel<<<dim3(ao_blocks(cb, (size_t)n * k)), dim3(AO_THREADS), 0, cb->stream>>>(
        (const __nv_bfloat16 *)c->x2, Y, pos, c->route, (__nv_bfloat16 *)c->out, n, k, m, e);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

template <typename TW>
static void launch_moe(dj_cuda_backend *cb, const dj_op_call *c, float *h) {
    const uint32_t n = c->n, k = c->k, f = c->d, m = c->m, e = c->expert;
    moe_up_kernel<TW><<<dim3((f + MOE_WARPS - 1) / MOE_WARPS), dim3(MOE_WARPS * 32), 0, cb->stream>>>(
        (const __nv_bfloat16 *)c->x, c->route, (const TW *)c->w, (const TW *)c->w_up, h, n, k, f, m, e);
    moe_down_kernel<TW><<<dim3((k + MOE_WARPS - 1) / MOE_WARPS), dim3(MOE_WARPS * 32), 0, cb->stream>>>(
        (const __nv_bfloat16 *)c->x2, c->route, (const TW *)c->w_down, h, (__nv_bfloat16 *)c->out, n, k, f, m, e);
}

dj_status dj__cuda_moe_ffn(dj_cuda_backend *cb, const dj_op_call *c) {
    const bool bf16 = c->w_dtype == DJ_DTYPE_BF16;
    if (bf16 && c->n >= MOE_GROUPED_ROWS && !cb->capturing && c->n <= INT32_MAX && c->k <= INT32_MAX &&
        c->d <= INT32_MAX)
        return moe_grouped(cb, c);
    if (bf16 && c->n >= MOE_DENSE_ROWS && c->n <= INT32_MAX && c->k <= INT32_MAX && c->d <= INT32_MAX)
        return moe_dense(cb, c);
    float *h = NULL;
    dj_status st = dj__cuda_scratch(cb, (size_t)c->n * c->d, &h);
    if (st != DJ_OK) return st;
    if (bf16 && c->k % 8 == 0 && c->d % 8 == 0 && aligned16(c->x) && aligned16(c->w) && aligned16(c->w_up) &&
        aligned16(c->w_down) && aligned16(h)) {
        const uint32_t n = c->n, k = c->k, f = c->d, m = c->m, e = c->expert;
        moe_up_bf16_kernel<<<dim3((f + MOE_WARPS - 1) / MOE_WARPS), dim3(MOE_WARPS * 32), 0, cb->stream>>>(
            (const __nv_bfloat16 *)c->x, c->route, (const __nv_bfloat16 *)c->w, (const __nv_bfloat16 *)c->w_up, h, n,
            k, f, m, e);
        moe_down_bf16_kernel<<<dim3((k + MOE_WARPS - 1) / MOE_WARPS), dim3(MOE_WARPS * 32), 0, cb->stream>>>(
            (const __nv_bfloat16 *)c->x2, c->route, (const __nv_bfloat16 *)c->w_down, h, (__nv_bfloat16 *)c->out, n,
            k, f, m, e);
        DJ_CU_LAUNCHED(cb);
        return DJ_OK;
    }
    switch (c->w_dtype) {
    case DJ_DTYPE_BF16: launch_moe<__nv_bfloat16>(cb, c, h); break;
    case DJ_DTYPE_F16: launch_moe<__half>(cb, c, h); break;
    default: launch_moe<float>(cb, c, h); break;
    }
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
