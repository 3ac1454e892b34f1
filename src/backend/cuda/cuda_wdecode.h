/* cuda_wdecode.h: device helpers that turn quantized weight words into
 * floats, shared by the GEMVs that read them (cuda_matmul_fp8.cu, cuda_q4.cu)
 * and their dequantizing kernels, so every path decodes the same
 * values in the same order. */
#ifndef DJ_CUDA_WDECODE_H
#define DJ_CUDA_WDECODE_H

#include <cuda_fp8.h>

#include "backend/cuda/cuda_impl.h"

/* Two e4m3 bytes (the low 16 bits of v) as two floats. */
static __device__ __forceinline__ float2 dj_f8x2(uint32_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    return __half22float2(*(const __half2 *)&h);
}

static __device__ __forceinline__ float dj_f8_one(uint8_t v) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    return __half2float(*(const __half *)&h);
}

/* The 16 weights of one 16-byte word of e4m3 codes, in column order. */
static __device__ __forceinline__ void dj_f8x16(uint4 u, float wf[16]) {
    const uint32_t wv[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 a = dj_f8x2(wv[i]), b = dj_f8x2(wv[i] >> 16);
        wf[4 * i] = a.x;
        wf[4 * i + 1] = a.y;
        wf[4 * i + 2] = b.x;
        wf[4 * i + 3] = b.y;
    }
}

/* The code of column c (0..7) of word w (djinn/dtype.h's nibble order) minus the zero, as float: exact.
 * mz = 2^23 + zero. */
static __device__ __forceinline__ float dj_q4_code(uint32_t w, unsigned c, float mz) {
    return __uint_as_float(0x4B000000u | ((w >> (4 * dj_q4_nibble(c))) & 15u)) - mz;
}

#endif
