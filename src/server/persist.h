/* persist.h: a djinnd session as a self-contained image (format v1,
 * docs/swap.md) - encoded for export and restart, decoded and checked on import. */
#ifndef DJ_SERVER_PERSIST_H
#define DJ_SERVER_PERSIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/engine.h"
#include "djinn/protocol.h"

#define DJ__SIMG_MAGIC "DJINNSS\n"
#define DJ__SIMG_VERSION 1u
#define DJ__SIMG_HEADER_BYTES 288u /* the fixed part, its checksum included */

/* What a session is, beside its KV pages. */
typedef struct dj__simg {
    uint32_t version;
    uint64_t fingerprint;     /* the model's (dj_model_fingerprint) */
    char model[128];          /* its name in the model store (NUL-terminated) */
    dj_kv_layout kv;          /* kv.n_blocks: 0 when no pages are carried (then the history is re-fed) */
    uint64_t id, secret;      /* the session's id and reattach secret (0: none) on the daemon it left */
    uint64_t tenant;          /* its quotas' key there (informational on another daemon) */
    dj_qos qos;
    uint32_t max_ctx;
    int32_t pending;          /* a sampled token not yet fed (-1: none) */
    bool paused;
    uint64_t salt[2];         /* its prefix-cache salt */
    uint32_t n_hist;          /* tokens in hist: every id fed, in order (0: not kept) */
    const int32_t *hist;      /* decode: points into the buffer (little-endian int32, aligned or not) */
    const uint8_t *pages;     /* decode: the first page's bytes inside the buffer; each page is followed by its sum */
} dj__simg;

/* Bytes an image with n_hist tokens and n_pages pages of page_bytes takes
 * (0 on overflow). */
size_t dj__simg_size(uint32_t n_hist, uint64_t n_pages, uint64_t page_bytes);
/* Writes img (hist[n_hist] from img->hist) into buf[size] (dj__simg_size);
 * its pages come from page(ctx, i, dst) and are checksummed here. */
dj_status dj__simg_encode(const dj__simg *img, dj_kv_page_fn page, void *ctx, uint8_t *buf, size_t size);
/* Checks and decodes buf[n]: the header's magic, version and checksum, the
 * history's checksum and the sizes. Pages are checked one at a time as they
 * are loaded (dj__simg_page). Any damage is DJ_EFORMAT saying what (never an
 * assert); out's pointers point into buf. */
dj_status dj__simg_decode(const uint8_t *buf, size_t n, dj__simg *out /* OUT */);
/* Page i of a decoded image into dst[page_bytes], its checksum checked
 * (DJ_EIO naming the page when it fails). */
dj_status dj__simg_page(const dj__simg *img, uint32_t i, void *dst /* OUT */);
/* The history token i of a decoded image. */
int32_t dj__simg_hist(const dj__simg *img, uint32_t i);

/* Files: written to DIR/NAME.tmp, fsynced, renamed to DIR/NAME (the
 * directory fsynced); read whole into a malloc'd buffer (at most max bytes). */
dj_status dj__simg_write_file(const char *dir, const char *name, const uint8_t *buf, size_t n);
dj_status dj__simg_read_file(const char *path, size_t max, uint8_t **buf /* OUT, malloc'd */, size_t *n /* OUT */);

#endif
