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
     * not an element type. A [rows][cols] matrix (cols % 128 == 0) takes rows *
     * rb bytes, rb = dj_dtype_row_bytes(Q4, cols); a row's codes for group gi
     * (columns 128gi..128gi+127) are 64 bytes, 16 little-endian 32-bit words,
     * word w holding columns 128gi+8w..128gi+8w+7: column 8w+2i in nibble i
     * (bits 4i..4i+3) and 8w+2i+1 in nibble i+4 (dj_q4_nibble), so one mask
     * of a word shifted by 4i gives columns 2i and 2i+1 as a pair of 16-bit
     * halves - the order of a pair of bf16 activations; column c's value is
     * (code - zero) * scale with the f16 scale and f16 zero point (an integer
     * 0..16) of its row and group c/128. Where the bytes lie (dj_q4_codes_at,
     * dj_q4_scale_at, dj_q4_zero_at):
     *  - rows % 16 != 0: row by row, each rb bytes: its cols/2 code bytes,
     *    then its cols/128 scales, then its cols/128 zero points;
     *  - rows % 16 == 0: bands of DJ_Q4_BAND rows, band b at 16 * rb * b:
     *    cols/128 blocks of 1 KiB (group gi's codes: 64 chunks of 16 bytes,
     *    chunk 32h + 4r + t = row 8h + r of the band, columns 32t..32t+31 of
     *    the group), then cols/128 blocks of 64 bytes (group gi's scale and
     *    zero point of each of the 16 rows, in row order). So a 16-row tile's
     *    codes for a group are 1 KiB in the order the CUDA GEMV's lanes load
     *    them (cuda_q4.cu), its scales and zeros 64 bytes. */
    DJ_DTYPE_Q4,
    DJ_DTYPE_COUNT
} dj_dtype;

size_t dj_dtype_size(dj_dtype t);      /* bytes per element; 0 for invalid and for Q4 */
const char *dj_dtype_name(dj_dtype t); /* "f32", "f16", "bf16", "i32", "f8_e4m3", "q4" */

#define DJ_Q4_GROUP 128 /* columns sharing one scale and zero point in DJ_DTYPE_Q4 */
/* Bytes of one row of cols elements of t (Q4: cols/2 + 4*cols/128; 0 when
 * cols is not a multiple of 128); 0 for invalid. */
size_t dj_dtype_row_bytes(dj_dtype t, size_t cols);

#define DJ_Q4_BAND 16 /* rows of a band of DJ_DTYPE_Q4 (a matrix of rows % 16 == 0) */

/* Where DJ_DTYPE_Q4's bytes lie in a matrix of m rows and k columns (k % 128
 * == 0), as byte offsets from its start; host and device code (CUDA kernels
 * call them). */
#ifdef __CUDACC__
#define DJ_Q4_HD __host__ __device__
#else
#define DJ_Q4_HD
#endif
static inline DJ_Q4_HD int dj_q4_banded(size_t m) { return m % DJ_Q4_BAND == 0; }
/* The nibble (0..7) of its 32-bit word that holds column c (c % 8 of the word's 8). */
static inline DJ_Q4_HD unsigned dj_q4_nibble(unsigned c) { return c % 8 / 2 + 4 * (c % 2); }
/* Row j's 64 code bytes of group gi (contiguous in both layouts). */
static inline DJ_Q4_HD size_t dj_q4_codes_at(size_t m, size_t k, size_t j, size_t gi) {
    const size_t rb = k / 2 + 4 * (k / DJ_Q4_GROUP), r = j % DJ_Q4_BAND;
    if (!dj_q4_banded(m)) return j * rb + 64 * gi;
    return (j - r) * rb + 1024 * gi + 512 * (r / 8) + 64 * (r % 8);
}
/* Row j's f16 scale of group gi. */
static inline DJ_Q4_HD size_t dj_q4_scale_at(size_t m, size_t k, size_t j, size_t gi) {
    const size_t ng = k / DJ_Q4_GROUP, rb = k / 2 + 4 * ng, r = j % DJ_Q4_BAND;
    if (!dj_q4_banded(m)) return j * rb + k / 2 + 2 * gi;
    return (j - r) * rb + 1024 * ng + 64 * gi + 4 * r;
}
/* Row j's f16 zero point of group gi (banded: the 2 bytes after its scale). */
static inline DJ_Q4_HD size_t dj_q4_zero_at(size_t m, size_t k, size_t j, size_t gi) {
    return dj_q4_scale_at(m, k, j, gi) + (dj_q4_banded(m) ? 2 : 2 * (k / DJ_Q4_GROUP));
}

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
