/* persist.c: djinnd's session image (format v1, docs/swap.md) - encoding,
 * decoding with every field and checksum checked, and its files. */
#include "server/persist.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "djinn/alloc.h"
#include "djinn/status.h"

/* Offsets of the fixed header (little-endian). */
enum {
    H_MAGIC = 0, H_VERSION = 8, H_HEADER_BYTES = 12, H_FP = 16, H_MODEL = 24, H_LAYERS = 152, H_HEADS = 156,
    H_KV_DIM = 160, H_DTYPE = 164, H_TPP = 168, H_BLOCKS = 172, H_PAGE_BYTES = 176, H_POS = 184, H_N_HIST = 188,
    H_ID = 192, H_SECRET = 200, H_TENANT = 208, H_QOS = 216, H_MAX_CTX = 220, H_PENDING = 224, H_FLAGS = 228,
    H_SALT = 232, H_HIST_SUM = 272, H_SUM = 280
};
#define FLAG_PAUSED 1u

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* A page's checksum seed: the model, the session and the page's index, so a
 * page of another image or another place in this one does not verify. */
static uint64_t page_seed(const dj__simg *img, uint32_t i) {
    const uint64_t v[3] = {img->fingerprint, img->id, i};
    return XXH3_64bits(v, sizeof v);
}

size_t dj__simg_size(uint32_t n_hist, uint64_t n_pages, uint64_t page_bytes) {
    const uint64_t slot = page_bytes + 8;
    if (page_bytes > (1ull << 40) || (n_pages && slot > (UINT64_MAX - DJ__SIMG_HEADER_BYTES) / n_pages)) return 0;
    const uint64_t total = DJ__SIMG_HEADER_BYTES + (uint64_t)n_hist * 4 + n_pages * slot;
    return total > SIZE_MAX ? 0 : (size_t)total;
}

dj_status dj__simg_encode(const dj__simg *img, dj_kv_page_fn page, void *ctx, uint8_t *buf, size_t size) {
    const uint64_t n_pages = (uint64_t)img->kv.n_layers * img->kv.n_blocks;
    const size_t need = dj__simg_size(img->n_hist, n_pages, img->kv.page_bytes);
    if (!need || size < need) return dj_fail(DJ_EINVAL, "session image: %zu bytes given, %zu needed", size, need);
    memset(buf, 0, DJ__SIMG_HEADER_BYTES);
    memcpy(buf + H_MAGIC, DJ__SIMG_MAGIC, 8);
    put32(buf + H_VERSION, DJ__SIMG_VERSION);
    put32(buf + H_HEADER_BYTES, DJ__SIMG_HEADER_BYTES);
    put64(buf + H_FP, img->fingerprint);
    snprintf((char *)buf + H_MODEL, 128, "%s", img->model);
    put32(buf + H_LAYERS, img->kv.n_layers);
    put32(buf + H_HEADS, img->kv.n_kv_heads);
    put32(buf + H_KV_DIM, img->kv.kv_dim);
    put32(buf + H_DTYPE, img->kv.kv_dtype);
    put32(buf + H_TPP, img->kv.tokens_per_page);
    put32(buf + H_BLOCKS, img->kv.n_blocks);
    put64(buf + H_PAGE_BYTES, img->kv.page_bytes);
    put32(buf + H_POS, img->kv.pos);
    put32(buf + H_N_HIST, img->n_hist);
    put64(buf + H_ID, img->id);
    put64(buf + H_SECRET, img->secret);
    put64(buf + H_TENANT, img->tenant);
    put32(buf + H_QOS, (uint32_t)img->qos);
    put32(buf + H_MAX_CTX, img->max_ctx);
    put32(buf + H_PENDING, (uint32_t)img->pending);
    put32(buf + H_FLAGS, img->paused ? FLAG_PAUSED : 0);
    put64(buf + H_SALT, img->salt[0]);
    put64(buf + H_SALT + 8, img->salt[1]);
    uint8_t *h = buf + DJ__SIMG_HEADER_BYTES;
    for (uint32_t i = 0; i < img->n_hist; i++) put32(h + 4 * (size_t)i, (uint32_t)img->hist[i]);
    put64(buf + H_HIST_SUM, XXH3_64bits(h, (size_t)img->n_hist * 4));
    put64(buf + H_SUM, XXH3_64bits(buf, H_SUM));
    uint8_t *p = h + (size_t)img->n_hist * 4;
    const size_t pb = (size_t)img->kv.page_bytes;
    for (uint64_t i = 0; i < n_pages; i++, p += pb + 8) {
        const dj_status st = page(ctx, (uint32_t)i, p);
        if (st != DJ_OK) return st;
        put64(p + pb, XXH3_64bits_withSeed(p, pb, page_seed(img, (uint32_t)i)));
    }
    return DJ_OK;
}

dj_status dj__simg_decode(const uint8_t *buf, size_t n, dj__simg *out) {
    memset(out, 0, sizeof *out);
    if (n < DJ__SIMG_HEADER_BYTES || memcmp(buf, DJ__SIMG_MAGIC, 8) != 0)
        return dj_fail(DJ_EFORMAT, "not a Djinn session image (%zu bytes, no \"DJINNSS\" header)", n);
    const uint32_t version = get32(buf + H_VERSION);
    if (version != DJ__SIMG_VERSION)
        return dj_fail(DJ_EFORMAT, "session image of format version %u; this djinnd reads version %u", version,
                       DJ__SIMG_VERSION);
    if (get32(buf + H_HEADER_BYTES) != DJ__SIMG_HEADER_BYTES || get64(buf + H_SUM) != XXH3_64bits(buf, H_SUM))
        return dj_fail(DJ_EFORMAT, "session image: its header is damaged (checksum)");
    out->version = version;
    out->fingerprint = get64(buf + H_FP);
    memcpy(out->model, buf + H_MODEL, 128);
    if (!memchr(out->model, 0, 128) || !out->model[0])
        return dj_fail(DJ_EFORMAT, "session image: no model name");
    out->kv = (dj_kv_layout){.n_layers = get32(buf + H_LAYERS), .n_kv_heads = get32(buf + H_HEADS),
                             .kv_dim = get32(buf + H_KV_DIM), .kv_dtype = get32(buf + H_DTYPE),
                             .tokens_per_page = get32(buf + H_TPP), .n_blocks = get32(buf + H_BLOCKS),
                             .page_bytes = get64(buf + H_PAGE_BYTES), .pos = get32(buf + H_POS)};
    out->n_hist = get32(buf + H_N_HIST);
    out->id = get64(buf + H_ID);
    out->secret = get64(buf + H_SECRET);
    out->tenant = get64(buf + H_TENANT);
    const uint32_t qos = get32(buf + H_QOS);
    out->max_ctx = get32(buf + H_MAX_CTX);
    out->pending = (int32_t)get32(buf + H_PENDING);
    const uint32_t flags = get32(buf + H_FLAGS);
    out->paused = flags & FLAG_PAUSED;
    out->salt[0] = get64(buf + H_SALT);
    out->salt[1] = get64(buf + H_SALT + 8);
    if (qos >= DJ_QOS_COUNT) return dj_fail(DJ_EFORMAT, "session image: QoS class %u", qos);
    out->qos = (dj_qos)qos;
    if (flags & ~FLAG_PAUSED) return dj_fail(DJ_EFORMAT, "session image: unknown flags %#x", flags);
    if (out->pending < -1) return dj_fail(DJ_EFORMAT, "session image: pending token %d", out->pending);
    if (!out->max_ctx || out->kv.pos > out->max_ctx || out->n_hist > out->max_ctx)
        return dj_fail(DJ_EFORMAT, "session image: position %u and %u history tokens in a context of %u", out->kv.pos,
                       out->n_hist, out->max_ctx);
    if (out->n_hist && out->n_hist != out->kv.pos)
        return dj_fail(DJ_EFORMAT, "session image: %u history tokens for position %u", out->n_hist, out->kv.pos);
    const uint64_t n_pages = (uint64_t)out->kv.n_layers * out->kv.n_blocks;
    if (n_pages && (!out->kv.page_bytes || !out->kv.tokens_per_page ||
                    (uint64_t)out->kv.n_blocks * out->kv.tokens_per_page < out->kv.pos))
        return dj_fail(DJ_EFORMAT, "session image: %u blocks of %u tokens for position %u", out->kv.n_blocks,
                       out->kv.tokens_per_page, out->kv.pos);
    if (!n_pages && out->kv.pos && out->n_hist != out->kv.pos)
        return dj_fail(DJ_EFORMAT, "session image: neither KV pages nor the history of its %u positions", out->kv.pos);
    const size_t need = dj__simg_size(out->n_hist, n_pages, out->kv.page_bytes);
    if (!need || need != n)
        return dj_fail(DJ_EFORMAT, "session image of %zu bytes; its header says %zu (%u history tokens, %llu pages "
                       "of %llu bytes): cut short or padded", n, need, out->n_hist, (unsigned long long)n_pages,
                       (unsigned long long)out->kv.page_bytes);
    const uint8_t *h = buf + DJ__SIMG_HEADER_BYTES;
    if (get64(buf + H_HIST_SUM) != XXH3_64bits(h, (size_t)out->n_hist * 4))
        return dj_fail(DJ_EFORMAT, "session image: its history is damaged (checksum)");
    out->hist = (const int32_t *)(const void *)h;
    out->pages = h + (size_t)out->n_hist * 4;
    return DJ_OK;
}

int32_t dj__simg_hist(const dj__simg *img, uint32_t i) {
    return (int32_t)get32((const uint8_t *)(const void *)img->hist + 4 * (size_t)i);
}

dj_status dj__simg_page(const dj__simg *img, uint32_t i, void *dst) {
    const size_t pb = (size_t)img->kv.page_bytes;
    if ((uint64_t)i >= (uint64_t)img->kv.n_layers * img->kv.n_blocks)
        return dj_fail(DJ_ERANGE, "session image: page %u of %llu", i,
                       (unsigned long long)img->kv.n_layers * img->kv.n_blocks);
    const uint8_t *p = img->pages + (size_t)i * (pb + 8);
    if (get64(p + pb) != XXH3_64bits_withSeed(p, pb, page_seed(img, i)))
        return dj_fail(DJ_EIO, "session image: KV page %u (layer %u, block %u) failed its checksum", i,
                       i / img->kv.n_blocks, i % img->kv.n_blocks);
    memcpy(dst, p, pb);
    return DJ_OK;
}

/* ---- files ---- */

dj_status dj__simg_write_file(const char *dir, const char *name, const uint8_t *buf, size_t n) {
    char tmp[4096], path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path ||
        (size_t)snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name) >= sizeof tmp)
        return dj_fail(DJ_EINVAL, "session file: path too long");
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return dj_fail(DJ_EIO, "session file %s: %s", tmp, strerror(errno));
    size_t done = 0;
    while (done < n) {
        const ssize_t w = write(fd, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        done += (size_t)w;
    }
    const int err = done < n ? errno : fsync(fd) != 0 ? errno : 0;
    close(fd);
    if (done < n || err) {
        unlink(tmp);
        return dj_fail(DJ_EIO, "session file %s: %s", tmp, strerror(err ? err : EIO));
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        unlink(tmp);
        return dj_fail(DJ_EIO, "session file %s: %s", path, strerror(e));
    }
    const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return DJ_OK;
}

dj_status dj__simg_read_file(const char *path, size_t max, uint8_t **buf, size_t *n) {
    *buf = NULL;
    *n = 0;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dj_fail(errno == ENOENT ? DJ_ENOTFOUND : DJ_EIO, "session file %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
        close(fd);
        return dj_fail(DJ_EFORMAT, "session file %s: not a regular file of at most %zu bytes", path, max);
    }
    const size_t len = (size_t)sb.st_size;
    uint8_t *b = dj_malloc(len ? len : 1);
    if (!b) {
        close(fd);
        return dj_fail(DJ_ENOMEM, "session file %s: out of memory for %zu bytes", path, len);
    }
    size_t got = 0;
    while (got < len) {
        const ssize_t r = read(fd, b + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got < len) {
        free(b);
        return dj_fail(DJ_EIO, "session file %s: read %zu of %zu bytes", path, got, len);
    }
    *buf = b;
    *n = len;
    return DJ_OK;
}
