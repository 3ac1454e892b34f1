/* test_status.c: status names/messages, the dtype conversions, and the
 * page divider of the CUDA attention kernels (backend/fastdiv.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/fastdiv.h"
#include "djinn/dtype.h"
#include "djinn/intervene.h"
#include "djinn/status.h"
#include "testutil.h"

/* dj_fastdiv_q against the divide: every divisor up to 300 (page token
 * counts), large and power-of-two ones, on every t below 70,000, the edges
 * of each quotient, and t across the whole 32-bit range. */
static void test_fastdiv(void) {
    uint32_t ds[300 + 8];
    int nd = 0;
    for (uint32_t d = 1; d <= 300; d++) ds[nd++] = d;
    const uint32_t big[] = {4096, 65535, 65536, 1000003, 1u << 24, 0x7fffffffu, 0x80000000u, 3000000019u / 2};
    for (int i = 0; i < 8; i++) ds[nd++] = big[i];
    long bad = 0;
    for (int i = 0; i < nd; i++) {
        const uint32_t d = ds[i];
        if (d > 0x80000000u) continue; /* the documented range */
        const dj_fastdiv f = dj_fastdiv_make(d);
        for (uint32_t t = 0; t < 70000; t++) bad += dj_fastdiv_q(t, f) != t / d;
        for (uint64_t t = 70000; t <= 0xffffffffull; t += 0x10001ull + d) bad += dj_fastdiv_q((uint32_t)t, f) != (uint32_t)t / d;
        for (uint64_t q = 1; q * d <= 0xffffffffull; q = q * 3 + 1) { /* quotient edges */
            const uint32_t t = (uint32_t)(q * d);
            bad += dj_fastdiv_q(t, f) != t / d;
            bad += dj_fastdiv_q(t - 1, f) != (t - 1) / d;
        }
        bad += dj_fastdiv_q(0xffffffffu, f) != 0xffffffffu / d;
    }
    CHECK_MSG(bad == 0, "%ld fast divisions differ from the divide", bad);
}

int main(void) {
    dj_test_seeds();
    test_fastdiv();
    CHECK(strcmp(dj_status_name(DJ_ENOSPC), "DJ_ENOSPC") == 0);
    CHECK(strcmp(dj_strerror(DJ_OK), "ok") == 0);
    CHECK(dj_fail(DJ_EFORMAT, "bad %d", 7) == DJ_EFORMAT);
    CHECK(strcmp(dj_last_error(), "bad 7") == 0);
    CHECK(dj_dtype_size(DJ_DTYPE_BF16) == 2 && dj_dtype_size(DJ_DTYPE_F32) == 4);

    /* f16 round trip on every half value that is finite. */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        if (((h >> 10) & 0x1f) == 0x1f) continue;
        float f = dj_f16_to_f32((uint16_t)h);
        if (dj_f32_to_f16(f) != h && !(f == 0.0f && (h & 0x7fff) == 0)) bad++;
    }
    CHECK_MSG(bad == 0, "%d f16 values do not round-trip", bad);
    CHECK(dj_f16_to_f32(0x3c00) == 1.0f && dj_f16_to_f32(0xc000) == -2.0f);
    CHECK(dj_f32_to_f16(65520.0f) == 0x7c00);
    /* bf16: exact values and round-to-nearest-even. */
    CHECK(dj_bf16_to_f32(dj_f32_to_bf16(1.5f)) == 1.5f);
    CHECK(dj_f32_to_bf16(1.00390625f) == 0x3f80); /* tie -> even */
    CHECK(dj_f32_to_bf16(1.01171875f) == 0x3f82); /* tie -> even, upward */
    for (int i = 0; i < 1000; i++) {
        float x = dj_test_randf(-100.f, 100.f);
        float y = dj_bf16_to_f32(dj_f32_to_bf16(x));
        CHECK(fabsf(x - y) <= fabsf(x) * (1.0f / 256.0f));
    }
    /* dj_dtype_widen_f32: every type, each element as the scalar conversion
     * gives it - short arrays, the threaded length (>= 1M elements, a partial
     * last chunk), and bf16 at an odd address (the byte-wise road). */
    {
        const size_t big = ((size_t)1 << 20) + 77;
        uint8_t *src = malloc(4 * big + 2);
        float *dst = malloc(4 * big);
        CHECK(src && dst);
        for (size_t i = 0; i < 4 * big + 2; i++) src[i] = (uint8_t)(dj_test_rand() >> 29);
        const size_t lens[] = {0, 1, 17, 4096, big};
        const dj_dtype types[] = {DJ_DTYPE_BF16, DJ_DTYPE_F16, DJ_DTYPE_F32};
        for (int ti = 0; ti < 3; ti++)
            for (int li = 0; li < 5; li++)
                for (int off = 0; off < (types[ti] == DJ_DTYPE_BF16 ? 2 : 1); off++) {
                    const uint8_t *p = src + off;
                    const size_t k = lens[li];
                    dj_dtype_widen_f32(types[ti], p, dst, k);
                    size_t wrong = 0;
                    for (size_t i = 0; i < k; i++) {
                        uint16_t h;
                        float want;
                        if (types[ti] == DJ_DTYPE_F32) {
                            memcpy(&want, p + 4 * i, 4);
                        } else {
                            memcpy(&h, p + 2 * i, 2);
                            want = types[ti] == DJ_DTYPE_BF16 ? dj_bf16_to_f32(h) : dj_f16_to_f32(h);
                        }
                        wrong += memcmp(&want, &dst[i], 4) != 0;
                    }
                    CHECK_MSG(wrong == 0, "widen %s k=%zu offset %d: %zu elements differ", dj_dtype_name(types[ti]),
                              k, off, wrong);
                }
        free(src);
        free(dst);
    }
    return dj_test_finish("test_status");
}
