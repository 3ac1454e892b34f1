/* attn_rows.cuh: what the attention kernels (cuda_attention.cu,
 * cuda_attention_tc.cu, cuda_attention_wg.cu) share about a query row: the
 * first position its sliding window lets it see, the max of the two rows a
 * quad of lanes holds in the mma fragment layout (lanes 4g..4g+3 share rows
 * g and g + 8), the softmax's 2^x and the probabilities packed as bf16 pairs. */
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

/* The first key position the row at position p sees (window 0: every one). */
static __device__ __forceinline__ uint32_t attn_first_pos(uint32_t p, uint32_t window) {
    return window && p + 1 > window ? p + 1 - window : 0u;
}

/* a and b (a row pair's per-lane maxima) := their maxima over the lane's quad. */
static __device__ __forceinline__ void attn_quad_max(float &a, float &b) {
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
    a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
    b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, 1));
    b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, 2));
}

/* 2^x, flushing subnormal results to 0 (MUFU.EX2 alone; exp2f adds a
 * subnormal fix-up around it). 2^-inf = 0. */
static __device__ __forceinline__ float attn_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* lo, hi as one bf16 pair (.x, the low half, = lo). */
static __device__ __forceinline__ uint32_t attn_pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
