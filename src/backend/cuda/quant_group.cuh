/* quant_group.cuh: one group of 128 activation channels to e4m3 codes and
 * its scale (amax / 448), held by half a warp, 8 consecutive channels a
 * lane - the FP8 block mode's activation quantization, shared by its
 * kernel (cuda_matmul_fp8_lt.cu) and the norm that quantizes its own output
 * for the GEMMs after it (cuda_norm.cu), so both give the same codes. */
#pragma once

#include <cuda_fp8.h>
#include <stdint.h>

/* A half warp's group of 128 channels from a lane's 8 values f: the codes
 * (8 bytes at dst) and, from the group's first lane, its scale (*scale).
 * valid: the group exists (every lane takes part in the shuffles). */
static __device__ __forceinline__ void quant_group(const float (&f)[8], bool valid, uint8_t *dst, float *scale,
                                                   uint32_t sub) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(f[i]));
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o)); /* within the half */
    if (!valid) return;
    const float sc = fmaxf(amax, 1e-12f) / 448.0f, inv = 1.0f / sc;
    uint32_t c[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        c[i] = __nv_cvt_float2_to_fp8x2(make_float2(f[2 * i] * inv, f[2 * i + 1] * inv), __NV_SATFINITE, __NV_E4M3);
    *(uint2 *)dst = make_uint2(c[0] | c[1] << 16, c[2] | c[3] << 16);
    if (sub == 0) *scale = sc;
}
