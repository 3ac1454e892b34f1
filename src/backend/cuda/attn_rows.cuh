/* attn_rows.cuh: what the attention kernels (cuda_attention.cu,
 * cuda_attention_tc.cu, cuda_attention_wg.cu) share about a query row: the
 * first position its sliding window lets it see, and the max of the two rows
 * a quad of lanes holds in the mma fragment layout (lanes 4g..4g+3 share rows
 * g and g + 8). */
#pragma once

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
