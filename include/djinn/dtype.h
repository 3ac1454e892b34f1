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
const char *dj_dtype_name(dj_dtype t); /* "f32", "f16", "bf16", "i32", "q4" */

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

float dj_f16_to_f32(uint16_t h);
uint16_t dj_f32_to_f16(float f);

#endif
