/* dtype.c: element sizes, names and IEEE half-precision conversion. */
#include "djinn/dtype.h"

#include <string.h>

size_t dj_dtype_size(dj_dtype t) {
    switch (t) {
    case DJ_DTYPE_F32: return 4;
    case DJ_DTYPE_F16: return 2;
    case DJ_DTYPE_BF16: return 2;
    case DJ_DTYPE_I32: return 4;
    case DJ_DTYPE_F8_E4M3: return 1;
    default: return 0;
    }
}

size_t dj_dtype_row_bytes(dj_dtype t, size_t cols) {
    if (t == DJ_DTYPE_Q4) return cols % DJ_Q4_GROUP ? 0 : cols / 2 + 4 * (cols / DJ_Q4_GROUP);
    return cols * dj_dtype_size(t);
}

const char *dj_dtype_name(dj_dtype t) {
    switch (t) {
    case DJ_DTYPE_F32: return "f32";
    case DJ_DTYPE_F16: return "f16";
    case DJ_DTYPE_BF16: return "bf16";
    case DJ_DTYPE_I32: return "i32";
    case DJ_DTYPE_F8_E4M3: return "f8_e4m3";
    case DJ_DTYPE_Q4: return "q4";
    default: return "invalid";
    }
}

float dj_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t dj_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (abs < 0x38800000u) {                                  /* subnormal or zero */
        if (abs < 0x33000000u) return (uint16_t)sign;
        uint32_t e = abs >> 23;
        uint32_t man = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = abs + 0x0fffu + ((abs >> 13) & 1u); /* round to nearest even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

uint8_t dj_f32_to_f8e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
    if (abs >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* >= 448: saturate */
    if (abs < 0x3c800000u) {                                /* below 2^-6: subnormal steps of 2^-9 */
        float a;
        memcpy(&a, &abs, 4);
        const float q = a * 512.0f; /* exact: a power-of-two scale */
        uint32_t m = (uint32_t)q;
        const float rem = q - (float)m;
        if (rem > 0.5f || (rem == 0.5f && (m & 1u))) m++;
        return (uint8_t)(sign | m); /* m == 8 is the smallest normal, 0x08 */
    }
    /* normal: keep 3 mantissa bits, round to nearest even on the 20 dropped */
    uint32_t r = abs + 0x7ffffu + ((abs >> 20) & 1u);
    r >>= 20;                      /* exponent (bias 127) and 3 mantissa bits */
    const uint32_t e = (r >> 3) - 120u;
    if (e > 15u || (e == 15u && (r & 7u) == 7u)) return (uint8_t)(sign | 0x7eu);
    return (uint8_t)(sign | (e << 3) | (r & 7u));
}
