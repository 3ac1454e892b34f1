/* dtype.h: element types shared by checkpoints, graphs and backends, with the
 * scalar conversions every layer uses (bf16/f16 <-> f32). */
#ifndef DJINN_DTYPE_H
#define DJINN_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum {
    DJ_DTYPE_F32 = 0,
    DJ_DTYPE_F16,
    DJ_DTYPE_BF16,
    DJ_DTYPE_I32,
    DJ_DTYPE_F8_E4M3, /* float8_e4m3fn (OCP): weights only, with scales beside them (checkpoint.h) */
    /* 4-bit weights with groups of 128 (AWQ and GPTQ as loaded, src/model/quant4.c):
     * not an element type. A [rows][cols] matrix (cols % 128 == 0) is rows of
     * dj_dtype_row_bytes(Q4, cols) bytes each: cols/2 bytes of 4-bit codes
     * (byte j: column 2j in the low nibble, 2j+1 in the high), then cols/128 f16
     * scales, then cols/128 f16 zero points (integers 0..15); column c's value
     * is (code - zero[c/128]) * scale[c/128]. */
    DJ_DTYPE_Q4,
    DJ_DTYPE_COUNT
} dj_dtype;

size_t dj_dtype_size(dj_dtype t);      /* bytes per element; 0 for invalid and for Q4 */
const char *dj_dtype_name(dj_dtype t); /* "f32", "f16", "bf16", "i32", "f8_e4m3", "q4" */

#define DJ_Q4_GROUP 128 /* columns sharing one scale and zero point in DJ_DTYPE_Q4 */
/* Bytes of one row of cols elements of t (Q4: cols/2 + 4*cols/128; 0 when
 * cols is not a multiple of 128); 0 for invalid. */
size_t dj_dtype_row_bytes(dj_dtype t, size_t cols);

static inline float dj_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch does; NaN stays NaN. */
static inline uint16_t dj_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* float8_e4m3fn: bias 7, no infinities, 0x7f/0xff NaN, largest finite 448. */
static inline float dj_f8e4m3_to_f32(uint8_t v) {
    const uint32_t sign = (uint32_t)(v & 0x80u) << 24, e = (v >> 3) & 0xfu, man = v & 7u;
    uint32_t u;
    if (e == 0) { /* subnormal: man * 2^-9 */
        float f = (float)man * (1.0f / 512.0f);
        return sign ? -f : f;
    }
    if (e == 0xfu && man == 7u) u = sign | 0x7fc00000u;
    else u = sign | ((e + 120u) << 23) | (man << 20);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Round to nearest even, saturating to +-448 (as torch's cast of a finite value
 * within range; larger magnitudes saturate here, NaN stays NaN). */
uint8_t dj_f32_to_f8e4m3(float f);

float dj_f16_to_f32(uint16_t h);
uint16_t dj_f32_to_f16(float f);

/* dst[0..k) = src's k elements of type t (f32, f16 or bf16) as f32, exactly;
 * large arrays (1M elements and more) on every core (OpenMP): a saved
 * activation of a 512-token step widened on the critical path. */
void dj_dtype_widen_f32(dj_dtype t, const void *src, float *dst, size_t k);

#endif
