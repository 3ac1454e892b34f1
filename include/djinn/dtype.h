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
    DJ_DTYPE_COUNT
} dj_dtype;

size_t dj_dtype_size(dj_dtype t);      /* bytes per element; 0 for invalid */
const char *dj_dtype_name(dj_dtype t); /* "f32", "f16", "bf16", "i32", "f8_e4m3" */

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

#endif
