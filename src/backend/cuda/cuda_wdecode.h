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

/* 4-bit code e (0..7) of word w minus the zero, as float: exact. mz = 2^23 + zero. */
static __device__ __forceinline__ float dj_q4_code(uint32_t w, int e, float mz) {
    return __uint_as_float(0x4B000000u | ((w >> (4 * e)) & 15u)) - mz;
}

/* sum over the 8 columns of word w of (128 + code) * x, x the 8 floats at xf:
 * two codes a LOP3 - (w >> 4i) & 0x000F000F | 0x43004300 is the bf16 pair
 * (128 + code i, 128 + code i+4), each widened by a shift or a mask - so a
 * code costs 3 instructions where dj_q4_code's float took 4 and its subtract. */
static __device__ __forceinline__ float dj_q4_dot8_128(uint32_t w, const float *xf) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t pair = ((w >> (4 * i)) & 0x000F000Fu) | 0x43004300u;
        s = fmaf(__uint_as_float(pair << 16), xf[i], s);
        s = fmaf(__uint_as_float(pair & 0xFFFF0000u), xf[i + 4], s);
    }
    return s;
}

/* The 32 columns of a 16-byte word q of 4-bit codes against xf[32]:
 * sum (128 + code) * x, word by word (the q4 GEMVs' order). */
static __device__ __forceinline__ float dj_q4_dot32_128(uint4 q, const float *xf) {
    float p = dj_q4_dot8_128(q.x, xf);
    p += dj_q4_dot8_128(q.y, xf + 8);
    p += dj_q4_dot8_128(q.z, xf + 16);
    p += dj_q4_dot8_128(q.w, xf + 24);
    return p;
}

#endif
