/* cpu_arch_ops.c: the CPU kernels of the ops beyond Llama - GeGLU, logit
 * soft-capping, and the mixture of experts (routing, one expert's MLP over
 * the rows routed to it: an OpenMP team of its own, the one op off the pool). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_impl.h"

/* PyTorch's gelu(approximate="tanh") in f32. */
static inline float gelu_tanh(float x) {
    const float beta = 0.7978845608028654f; /* sqrt(2/pi) */
    const float inner = beta * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

static void gelu_mul_range(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const dj_op_call *c = ctx;
    const float *gate = c->x, *up = c->x2;
    float *out = c->out;
    for (size_t i = lo; i < hi; i++) out[i] = gelu_tanh(gate[i]) * up[i];
}

dj_status dj__cpu_gelu_mul(dj_cpu_backend *cb, const dj_op_call *c) {
    dj__cpu_pool_for(cb->pool, (size_t)c->n * c->d, 16384, gelu_mul_range, (void *)c);
    return DJ_OK;
}

static void softcap_range(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const dj_op_call *c = ctx;
    const float *x = c->x;
    float *out = c->out;
    const float cap = c->softcap;
    for (size_t i = lo; i < hi; i++) out[i] = tanhf(x[i] / cap) * cap;
}

dj_status dj__cpu_softcap(dj_cpu_backend *cb, const dj_op_call *c) {
    dj__cpu_pool_for(cb->pool, (size_t)c->n * c->d, 65536, softcap_range, (void *)c);
    return DJ_OK;
}

/* As Mixtral in transformers: softmax over all m logits in f32, the top_k
 * largest (lowest index first on ties), divided by their sum. */
dj_status dj__cpu_moe_route(dj_cpu_backend *cb, const dj_op_call *c) {
    (void)cb;
    const uint32_t m = c->m, k = c->top_k;
    float *p = malloc((size_t)m * sizeof *p);
    if (!p) return dj_fail(DJ_ENOMEM, "cpu moe_route: out of memory for %u experts", m);
    for (uint32_t i = 0; i < c->n; i++) {
        const float *x = (const float *)c->x + (size_t)i * m;
        float *o = (float *)c->out + (size_t)i * m;
        float mx = -INFINITY, z = 0.0f;
        for (uint32_t e = 0; e < m; e++) mx = x[e] > mx ? x[e] : mx;
        for (uint32_t e = 0; e < m; e++) z += (p[e] = expf(x[e] - mx));
        for (uint32_t e = 0; e < m; e++) {
            p[e] /= z;
            o[e] = 0.0f;
        }
        float sum = 0.0f;
        for (uint32_t t = 0; t < k; t++) { /* k passes: the largest not yet taken */
            uint32_t best = m;
            for (uint32_t e = 0; e < m; e++)
                if (o[e] == 0.0f && (best == m || p[e] > p[best])) best = e;
            o[best] = p[best] > 0.0f ? p[best] : 1e-38f; /* taken (a 0 probability stays marked) */
            sum += p[best];
        }
        for (uint32_t e = 0; e < m; e++)
            if (o[e] != 0.0f) o[e] = p[e] / sum;
    }
    free(p);
    return DJ_OK;
}

/* Expert e over the rows routed to it: h = silu(gate x) * (up x), then
 * out = x2 + route * (down h); every other row gets x2 (or 0). */
dj_status dj__cpu_moe_ffn(dj_cpu_backend *cb, const dj_op_call *c) {
    const uint32_t n = c->n, k = c->k, f = c->d, m = c->m, e = c->expert;
    const size_t wsz = dj_dtype_size(c->w_dtype);
    float *out = c->out;
    const float *x2 = c->x2;
    if (out != x2) {
        if (x2) memcpy(out, x2, (size_t)n * k * sizeof *out);
        else memset(out, 0, (size_t)n * k * sizeof *out);
    }
    uint32_t *rows = malloc((size_t)n * sizeof *rows);
    float *h = rows ? malloc((size_t)n * f * sizeof *h) : NULL;
    if (!h) {
        free(rows);
        return dj_fail(DJ_ENOMEM, "cpu moe_ffn: out of memory for %u rows of %u", n, f);
    }
    uint32_t nr = 0;
    for (uint32_t i = 0; i < n; i++)
        if (c->route[(size_t)i * m + e] != 0.0f) rows[nr++] = i;
    dj_status st = DJ_OK;
    if (nr) {
        const float *x = c->x;
        int failed = 0;
        /* a team only where the work pays for its barriers (tiny experts run on one thread) */
        const bool team = (double)nr * (double)f * (double)k >= 262144.0;
#pragma omp parallel num_threads(cb->n_threads) if (team)
        {
            float *wg = malloc((size_t)(k > f ? k : f) * 2 * sizeof *wg);
            if (!wg) {
#pragma omp atomic write
                failed = 1;
            }
            float *wu = wg ? wg + (k > f ? k : f) : NULL;
#pragma omp for schedule(static)
            for (uint32_t j = 0; j < f; j++) {
                if (!wg) continue;
                dj__cpu_to_f32(wg, (const uint8_t *)c->w + (size_t)j * k * wsz, c->w_dtype, k);
                dj__cpu_to_f32(wu, (const uint8_t *)c->w_up + (size_t)j * k * wsz, c->w_dtype, k);
                for (uint32_t r = 0; r < nr; r++) {
                    const float *xr = x + (size_t)rows[r] * k;
                    const float g = dj__cpu_dot(wg, xr, k), u = dj__cpu_dot(wu, xr, k);
                    h[(size_t)r * f + j] = g / (1.0f + expf(-g)) * u;
                }
            }
#pragma omp for schedule(static)
            for (uint32_t o = 0; o < k; o++) {
                if (!wg) continue;
                dj__cpu_to_f32(wg, (const uint8_t *)c->w_down + (size_t)o * f * wsz, c->w_dtype, f);
                for (uint32_t r = 0; r < nr; r++) {
                    const float wt = c->route[(size_t)rows[r] * m + e];
                    out[(size_t)rows[r] * k + o] += dj__cpu_dot(wg, h + (size_t)r * f, f) * wt;
                }
            }
            free(wg);
        }
        if (failed) st = dj_fail(DJ_ENOMEM, "cpu moe_ffn: out of memory for weight rows");
    }
    free(h);
    free(rows);
    return st;
}
