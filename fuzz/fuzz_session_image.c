/* fuzz_session_image.c: libFuzzer target - session images (persist.c) as
 * SESSION_IMPORT and a restart read them: raw bytes, and valid images with one byte changed. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/persist.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Every page of a decoded image read and checked; what decode promised holds. */
static void check_decoded(const uint8_t *buf, size_t n, const dj__simg *img) {
    const uint64_t n_pages = (uint64_t)img->kv.n_layers * img->kv.n_blocks;
    if (dj__simg_size(img->n_hist, n_pages, img->kv.page_bytes) != n) abort();
    if (img->kv.pos > img->max_ctx || img->n_hist > img->max_ctx || img->qos >= DJ_QOS_COUNT) abort();
    if ((const uint8_t *)(const void *)img->hist < buf || img->pages > buf + n) abort();
    for (uint32_t i = 0; i < img->n_hist; i++) (void)dj__simg_hist(img, i);
    if (!n_pages) return;
    uint8_t *page = malloc((size_t)img->kv.page_bytes);
    if (!page) return;
    for (uint64_t i = 0; i < n_pages; i++) (void)dj__simg_page(img, (uint32_t)i, page);
    (void)dj__simg_page(img, (uint32_t)n_pages, page); /* one past the end: an error, not a read */
    free(page);
}

static void decode(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1); /* its own allocation: ASan sees a read past its end */
    if (!buf) return;
    if (size) memcpy(buf, data, size);
    dj__simg img;
    if (dj__simg_decode(buf, size, &img) == DJ_OK) check_decoded(buf, size, &img);
    free(buf);
}

typedef struct {
    const uint8_t *src;
    size_t n;
} filler;

static dj_status fill(void *ctx, uint32_t i, void *dst) {
    const filler *f = ctx;
    uint8_t *d = dst;
    for (size_t k = 0; k < 64; k++) d[k] = f->n ? f->src[(i * 64 + k) % f->n] : (uint8_t)k;
    return DJ_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 12 || data[0] % 2 == 0) { /* raw bytes */
        decode(data, size);
        return 0;
    }
    /* a valid image shaped by the input, then one byte of it changed */
    dj__simg img;
    memset(&img, 0, sizeof img);
    img.version = DJ__SIMG_VERSION;
    img.fingerprint = (uint64_t)data[1] << 8 | data[2];
    memcpy(img.model, "demo", 5);
    img.kv = (dj_kv_layout){.n_layers = 1u + data[3] % 4, .n_kv_heads = 1, .kv_dim = 8, .kv_dtype = 0,
                            .tokens_per_page = 4, .n_blocks = data[4] % 4, .page_bytes = 64};
    img.kv.pos = img.kv.n_blocks ? img.kv.n_blocks * 4 - data[5] % 4 : 0;
    const bool hist = data[6] % 2 || !img.kv.n_blocks;
    img.n_hist = hist ? img.kv.pos : 0;
    img.max_ctx = img.kv.pos + data[7];
    if (!img.max_ctx) img.max_ctx = 1;
    img.qos = (dj_qos)(data[8] % DJ_QOS_COUNT);
    img.pending = (int32_t)data[9] - 1;
    img.id = data[10];
    int32_t ids[16];
    for (uint32_t i = 0; i < img.n_hist && i < 16; i++) ids[i] = (int32_t)(data[(11 + i) % size]);
    img.hist = ids;
    const size_t n = dj__simg_size(img.n_hist, (uint64_t)img.kv.n_layers * img.kv.n_blocks, img.kv.page_bytes);
    uint8_t *buf = n ? malloc(n) : NULL;
    if (!buf) return 0;
    filler f = {data + 11, size - 11};
    if (dj__simg_encode(&img, fill, &f, buf, n) != DJ_OK) abort();
    dj__simg back;
    if (dj__simg_decode(buf, n, &back) != DJ_OK) abort(); /* what was written reads back */
    if (back.kv.pos != img.kv.pos || back.n_hist != img.n_hist || back.pending != img.pending) abort();
    check_decoded(buf, n, &back);
    const size_t at = ((size_t)data[size - 1] << 8 | data[size - 2]) % n;
    buf[at] ^= (uint8_t)(data[size - 3] | 1);
    decode(buf, n);                           /* one byte changed */
    decode(buf, at);                          /* cut there */
    free(buf);
    return 0;
}
