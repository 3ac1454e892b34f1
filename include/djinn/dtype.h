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
    DJ_DTYPE_COUNT
} dj_dtype;

size_t dj_dtype_size(dj_dtype t);      /* bytes per element; 0 for invalid */
const char *dj_dtype_name(dj_dtype t); /* "f32", "f16", "bf16", "i32" */

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
