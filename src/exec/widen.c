/* widen.c: a dtype array widened to f32 on every host core (OpenMP) - the
 * saved points' bytes on their way out of a step (intervene.c). */
#include "djinn/intervene.h"

#include <stdint.h>
#include <string.h>

/* A shift each: a plain loop gcc vectorises with AVX2 (blocks of 16 through
 * arrays it did not: 12x slower at -mavx2). */
static void widen_bf16(const uint8_t *src, float *dst, size_t k) {
    if ((uintptr_t)src % 2) { /* never for our buffers; the byte-wise road */
        for (size_t i = 0; i < k; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = dj_bf16_to_f32(h);
        }
        return;
    }
    const uint16_t *h = (const uint16_t *)(const void *)src;
    uint32_t *u = (uint32_t *)(void *)dst;
    for (size_t i = 0; i < k; i++) u[i] = (uint32_t)h[i] << 16;
}

static void widen_part(dj_dtype t, const uint8_t *src, float *dst, size_t k) {
    if (t == DJ_DTYPE_F32) {
        memcpy(dst, src, k * sizeof *dst);
    } else if (t == DJ_DTYPE_BF16) {
        widen_bf16(src, dst, k);
    } else {
        for (size_t i = 0; i < k; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = dj_f16_to_f32(h);
        }
    }
}

#define WIDEN_CHUNK ((size_t)1 << 16) /* elements a task; parallel from 16 chunks */

void dj_dtype_widen_f32(dj_dtype t, const void *src, float *dst, size_t k) {
    const size_t es = dj_dtype_size(t), chunks = (k + WIDEN_CHUNK - 1) / WIDEN_CHUNK;
    if (chunks < 16) { /* a decode step's points: no thread team */
        widen_part(t, src, dst, k);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        const size_t at = c * WIDEN_CHUNK, len = k - at < WIDEN_CHUNK ? k - at : WIDEN_CHUNK;
        widen_part(t, (const uint8_t *)src + at * es, dst + at, len);
    }
}
