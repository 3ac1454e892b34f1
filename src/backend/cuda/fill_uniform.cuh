/* fill_uniform.cuh: bf16 values uniform in [lo, hi) from a splitmix64 hash
 * of their index and a seed, written by a grid-stride kernel: the operands
 * of rate measurements (cuda_measure.cu, bench/gemm_algos.cu), where constant
 * data would run faster than any weights do. Header-only, so a benchmark
 * that does not link the engine can take it too. */
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

static __global__ void dj_fill_uniform_bf16(__nv_bfloat16 *p, size_t n, uint64_t seed, float lo, float hi) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        p[i] = __float2bfloat16(lo + (hi - lo) * ((float)(z >> 40) * (1.0f / 16777216.0f)));
    }
}
