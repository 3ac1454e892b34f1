/* fastdiv.h: division by a divisor fixed before a kernel launch (the KV
 * page's token count) without a divide instruction - a multiply-high, an
 * add and a shift (Granlund and Montgomery's method for unsigned 32-bit
 * operands). Host code builds the divider; CUDA kernels and the CPU test
 * divide with it. Exact for every 32-bit t and every divisor 1..2^31. */
#ifndef DJ_FASTDIV_H
#define DJ_FASTDIV_H

#include <stdint.h>

#ifdef __CUDACC__
#define DJ_FD_HD __host__ __device__
#else
#define DJ_FD_HD
#endif

typedef struct dj_fastdiv {
    uint32_t d; /* the divisor */
    uint32_t m; /* 2^32 (2^s - d) / d + 1 */
    uint32_t s; /* ceil(log2 d) */
} dj_fastdiv;

static inline dj_fastdiv dj_fastdiv_make(uint32_t d) {
    dj_fastdiv f = {d, 0u, 0u};
    while ((1ull << f.s) < d) f.s++;
    f.m = (uint32_t)(((1ull << 32) * ((1ull << f.s) - d)) / d + 1u);
    return f;
}

/* t / f.d; the sum is taken in 64 bits, so t may be any 32-bit value. */
static inline DJ_FD_HD uint32_t dj_fastdiv_q(uint32_t t, dj_fastdiv f) {
#ifdef __CUDA_ARCH__
    const uint64_t hi = __umulhi(t, f.m);
#else
    const uint64_t hi = ((uint64_t)t * f.m) >> 32;
#endif
    return (uint32_t)((hi + t) >> f.s);
}

#endif
