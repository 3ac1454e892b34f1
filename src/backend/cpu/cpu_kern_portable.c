/* cpu_kern_portable.c: the matmul kernels in plain C - the reference the
 * SIMD tables are tested against bit for bit, and the path of CPUs without
 * them. The order is cpu_kern.h's, written out lane by lane. */
#include <math.h>

#include "backend/cpu/cpu_kern.h"

static inline float w_at(const void *w, dj_dtype t, size_t i) {
    return t == DJ_DTYPE_BF16 ? dj_bf16_to_f32(((const uint16_t *)w)[i])
           : t == DJ_DTYPE_F16 ? dj_f16_to_f32(((const uint16_t *)w)[i])
                               : ((const float *)w)[i];
}

static void dot_portable(const float *x, size_t ldx, uint32_t nr, const void *w, size_t w_row_bytes, uint32_t nc,
                         dj_dtype wt, uint32_t k, float *out, size_t ldo) {
    const uint32_t k16 = k / DJ_CPU_LANES * DJ_CPU_LANES;
    for (uint32_t c = 0; c < nc; c++)
        for (uint32_t r = 0; r < nr; r++) {
            const float *xr = x + (size_t)r * ldx;
            const void *wc = (const uint8_t *)w + (size_t)c * w_row_bytes;
            float lane[DJ_CPU_LANES] = {0};
            for (uint32_t q = 0; q < k16; q += DJ_CPU_LANES)
                for (int l = 0; l < DJ_CPU_LANES; l++) lane[l] = fmaf(w_at(wc, wt, q + (uint32_t)l), xr[q + l], lane[l]);
            out[(size_t)r * ldo + c] = dj__cpu_lanes_finish(lane, xr, wc, wt, k16, k);
        }
}

static void gemm_block_portable(const float *x, size_t ldx, uint32_t n, const void *w, dj_dtype wt, size_t ldw,
                                uint32_t nj, uint32_t k0, uint32_t k1, float *acc, float *out, size_t ldo,
                                dj__cpu_pull *pull) {
    (void)pull;
    for (uint32_t r = 0; r < n; r++)
        for (uint32_t c = 0; c < nj; c++) {
            float *kept = acc + ((size_t)r * nj + c) * DJ_CPU_LANES, lane[DJ_CPU_LANES];
            for (int l = 0; l < DJ_CPU_LANES; l++) lane[l] = k0 == 0 ? 0.0f : kept[l];
            const float *xr = x + (size_t)r * ldx;
            const void *wr = (const char *)w + (size_t)c * ldw * dj_dtype_size(wt);
            for (uint32_t q = k0; q < k1; q += DJ_CPU_LANES)
                for (int l = 0; l < DJ_CPU_LANES; l++) lane[l] = fmaf(w_at(wr, wt, q + (uint32_t)l), xr[q + l], lane[l]);
            if (out)
                out[(size_t)r * ldo + c] = dj__cpu_lanes_reduce(lane);
            else
                for (int l = 0; l < DJ_CPU_LANES; l++) kept[l] = lane[l];
        }
}

const dj__cpu_kernels dj__cpu_kernels_portable = {
    .name = "portable",
    .dot_rows = 4,
    .dot = dot_portable,
    .gemm_cols = 1,
    .gemm_block = gemm_block_portable,
};
