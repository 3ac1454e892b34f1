/* cuda_lora.cu: LORA on the device - each row's low-rank update out[i] +=
 * scale * B (A x[i]) of its own adapter (bf16 activations, f32 A and B). */
#include "backend/cuda/cuda_impl.h"

#define LORA_THREADS 256
#define LORA_COLS 1024 /* output columns per block (grid.y splits m) */

/* Block (i, y): row i's t = A x (f32, in shared memory; a warp per rank row,
 * a fixed order of partial sums), then columns [y * LORA_COLS, ...) of out.
 * A row without an adapter here returns at once. Each row alone: its result
 * does not depend on the other rows of the call. */
static __global__ void lora_kernel(const __nv_bfloat16 *x, __nv_bfloat16 *out, uint32_t k, uint32_t m,
                                   const dj_lora_mat *mats, const int32_t *rows) {
    __shared__ float t[DJ_LORA_MAX_RANK];
    const uint32_t i = blockIdx.x;
    const int32_t a = rows[i];
    if (a < 0) return;
    const dj_lora_mat l = mats[a];
    if (!l.a) return;
    const __nv_bfloat16 *xr = x + (size_t)i * k;
    const uint32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    for (uint32_t r = warp; r < l.rank; r += n_warps) {
        const float *ar = l.a + (size_t)r * k;
        float s = 0.0f;
        for (uint32_t j = lane; j < k; j += 32) s += ar[j] * __bfloat162float(xr[j]);
        for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) t[r] = s;
    }
    __syncthreads();
    __nv_bfloat16 *orow = out + (size_t)i * m;
    const uint32_t end = min(m, (blockIdx.y + 1) * LORA_COLS);
    for (uint32_t j = blockIdx.y * LORA_COLS + threadIdx.x; j < end; j += blockDim.x) {
        const float *br = l.b + (size_t)j * l.ldb;
        float s = 0.0f;
        for (uint32_t r = 0; r < l.rank; r++) s += br[r] * t[r];
        orow[j] = __float2bfloat16(__bfloat162float(orow[j]) + l.scale * s);
    }
}

dj_status dj__cuda_lora(dj_cuda_backend *cb, const dj_op_call *c) {
    if (c->n == 0 || c->n_lora == 0) return DJ_OK;
    const void *mats = NULL, *rows = NULL;
    dj_status st = dj__cuda_stage(cb, c->lora, (size_t)c->n_lora * sizeof *c->lora, &mats);
    if (st == DJ_OK) st = dj__cuda_stage(cb, c->lora_row, (size_t)c->n * sizeof *c->lora_row, &rows);
    if (st != DJ_OK) return st;
    const dim3 grid(c->n, (c->m + LORA_COLS - 1) / LORA_COLS);
    lora_kernel<<<grid, dim3(LORA_THREADS), 0, cb->stream>>>((const __nv_bfloat16 *)c->x, (__nv_bfloat16 *)c->out,
                                                            c->k, c->m, (const dj_lora_mat *)mats,
                                                            (const int32_t *)rows);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
