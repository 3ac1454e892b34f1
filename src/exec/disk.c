/* disk.c: the KV store's disk tier - the page file in the state directory
 * (a header, then page slots), its slot map, and a few pread/pwrite threads. */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "djinn/alloc.h"
#include "exec/kv_impl.h"

#define DISK_FILE "kv-pages.djinn"
#define DISK_MAGIC "DJINNKV\n"
#define DISK_VERSION 1u
#define DISK_ALIGN 4096u          /* O_DIRECT's alignment (offsets, lengths, buffers) */
#define DISK_HEADER DISK_ALIGN    /* the header's bytes; slot 0 starts after it */
#define BOUNCE_BYTES ((size_t)16 << 20)

bool dj__disk_force_bounce;
bool dj__disk_no_direct;

/* The page file's header (little-endian, at offset 0; docs/swap.md). */
typedef struct disk_header {
    char magic[8];          /* DISK_MAGIC */
    uint32_t version;       /* DISK_VERSION */
    uint32_t header_bytes;  /* DISK_HEADER */
    uint64_t page_bytes;    /* one KV page */
    uint64_t slot_bytes;    /* page_bytes rounded up to DISK_ALIGN: slot i at header_bytes + i * slot_bytes */
    uint64_t n_slots;
    uint64_t sum;           /* XXH3-64 of the fields above */
} disk_header;

/* One batch of transfers the threads share; the caller waits for it. */
typedef struct disk_batch {
    dj__disk_io *io;
    uint32_t n, next, done;
    bool write;
    uint32_t bad;           /* pages that failed */
    uint32_t first_bad;     /* index of the first (lowest) failure */
    int first_errno;        /* its errno (0: a checksum mismatch or a short read) */
    bool first_short;
} disk_batch;

struct dj__disk {
    char path[4096];
    int fd;                 /* buffered */
    int fd_direct;          /* O_DIRECT, or -1: the filesystem refused it */
    size_t page_bytes, slot_bytes;
    uint32_t n_slots, n_used, peak;
    uint64_t *bits;         /* [(n_slots + 63) / 64] slot in use */
    uint32_t scan_from;     /* no free slot below this one */
    uint64_t bad_pages;
    /* the I/O threads */
    pthread_t *thr;         /* [n_thr] */
    uint32_t n_thr;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    disk_batch *cur;        /* the batch being done, or NULL */
    bool stop;
};

static uint64_t header_sum(const disk_header *h) { return XXH3_64bits(h, offsetof(disk_header, sum)); }

/* ---- one page ---- */

static int full_io(int fd, bool write, uint8_t *buf, size_t len, off_t off, bool *short_io) {
    size_t done = 0;
    while (done < len) {
        const ssize_t r = write ? pwrite(fd, buf + done, len - done, off + (off_t)done)
                                : pread(fd, buf + done, len - done, off + (off_t)done);
        if (r < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (r == 0) {
            *short_io = true;
            return 0;
        }
        done += (size_t)r;
    }
    return 0;
}

/* Item i of b: 0 ok; else its errno (0 with *short_io or *mismatch). */
static int do_item(dj__disk *d, disk_batch *b, uint32_t i, bool *short_io, bool *mismatch) {
    dj__disk_io *io = &b->io[i];
    const off_t off = (off_t)DISK_HEADER + (off_t)io->slot * (off_t)d->slot_bytes;
    const bool direct = d->fd_direct >= 0 && (uintptr_t)io->buf % DISK_ALIGN == 0 && d->page_bytes % DISK_ALIGN == 0;
    const int fd = direct ? d->fd_direct : d->fd;
    *short_io = *mismatch = false;
    if (b->write) io->sum = XXH3_64bits_withSeed(io->buf, d->page_bytes, io->seed);
    int e = full_io(fd, b->write, io->buf, d->page_bytes, off, short_io);
    if (e == EINVAL && direct) e = full_io(d->fd, b->write, io->buf, d->page_bytes, off, short_io);
    if (e || *short_io) return e;
    if (!b->write && XXH3_64bits_withSeed(io->buf, d->page_bytes, io->seed) != io->sum) *mismatch = true;
    return 0;
}

/* Runs item i and records its outcome (mu held on entry and exit). */
static void run_item(dj__disk *d, disk_batch *b, uint32_t i) {
    pthread_mutex_unlock(&d->mu);
    bool short_io, mismatch;
    const int e = do_item(d, b, i, &short_io, &mismatch);
    pthread_mutex_lock(&d->mu);
    if (e || short_io || mismatch) {
        if (!b->bad || i < b->first_bad) {
            b->first_bad = i;
            b->first_errno = e;
            b->first_short = short_io;
        }
        b->bad++;
    }
    if (++b->done == b->n) pthread_cond_signal(&d->cv_done);
}

static void *io_thread(void *arg) {
    dj__disk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && !(d->cur && d->cur->next < d->cur->n)) pthread_cond_wait(&d->cv_work, &d->mu);
        if (d->stop) break;
        disk_batch *b = d->cur;
        run_item(d, b, b->next++);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* The threads and the caller do b's items; returns when all are done. */
static void run_batch(dj__disk *d, disk_batch *b) {
    pthread_mutex_lock(&d->mu);
    d->cur = b;
    pthread_cond_broadcast(&d->cv_work);
    while (b->done < b->n) {
        if (b->next < b->n) run_item(d, b, b->next++);
        else pthread_cond_wait(&d->cv_done, &d->mu);
    }
    d->cur = NULL;
    pthread_mutex_unlock(&d->mu);
}

static dj_status batch(dj__disk *d, dj__disk_io *io, uint32_t n, bool write, uint32_t *bad) {
    if (bad) *bad = 0;
    if (!n) return DJ_OK;
    disk_batch b = {.io = io, .n = n, .write = write};
    run_batch(d, &b);
    if (!b.bad) return DJ_OK;
    d->bad_pages += b.bad;
    if (bad) *bad = b.bad;
    const dj__disk_io *f = &io[b.first_bad];
    const char *why = b.first_errno ? strerror(b.first_errno)
                      : b.first_short ? "the file ends before it (truncated)"
                                      : "its checksum does not match (a torn or corrupted page)";
    return dj_fail(DJ_EIO, "disk tier %s: %u of %u pages failed to %s; the first, page %u in slot %u: %s", d->path,
                   b.bad, n, write ? "write" : "read back", b.first_bad, f->slot, why);
}

dj_status dj__disk_write(dj__disk *d, dj__disk_io *io, uint32_t n) { return batch(d, io, n, true, NULL); }
dj_status dj__disk_read(dj__disk *d, dj__disk_io *io, uint32_t n, uint32_t *bad) { return batch(d, io, n, false, bad); }

/* ---- slots ---- */

dj_status dj__disk_take(dj__disk *d, uint32_t n, uint32_t *slots) {
    if (d->n_slots - d->n_used < n)
        return dj_fail(DJ_ENOSPC, "disk tier full: %u pages wanted, %u of %u free", n, d->n_slots - d->n_used,
                       d->n_slots);
    uint32_t k = 0;
    for (uint32_t w = d->scan_from / 64; k < n; w++) {
        uint64_t free_bits = ~d->bits[w];
        while (free_bits && k < n) {
            const uint32_t i = w * 64 + (uint32_t)__builtin_ctzll(free_bits);
            free_bits &= free_bits - 1;
            if (i >= d->n_slots) break;
            d->bits[w] |= 1ull << (i % 64);
            slots[k++] = i;
        }
    }
    d->n_used += n;
    if (d->n_used > d->peak) d->peak = d->n_used;
    if (n) d->scan_from = slots[n - 1] + 1;
    return DJ_OK;
}

void dj__disk_release(dj__disk *d, const uint32_t *slots, uint32_t n) {
    for (uint32_t k = 0; k < n; k++) {
        const uint32_t i = slots[k];
        d->bits[i / 64] &= ~(1ull << (i % 64));
        if (i < d->scan_from) d->scan_from = i;
    }
    d->n_used -= n;
}

uint32_t dj__disk_free_slots(const dj__disk *d) { return d->n_slots - d->n_used; }

bool dj__disk_slot_used(const dj__disk *d, uint32_t i) {
    return i < d->n_slots && ((d->bits[i / 64] >> (i % 64)) & 1u);
}

void dj__disk_stats(const dj__disk *d, dj_disk_stats *st) {
    st->enabled = true;
    st->direct = d->fd_direct >= 0 && d->page_bytes % DISK_ALIGN == 0;
    st->threads = d->n_thr + 1; /* the caller does items too */
    st->page_bytes = d->page_bytes;
    st->capacity = (size_t)d->n_slots * d->page_bytes;
    st->used = (size_t)d->n_used * d->page_bytes;
    st->peak = (size_t)d->peak * d->page_bytes;
    st->bad_pages = d->bad_pages;
}

size_t dj__disk_bounce_pages(const dj__disk *d) {
    const size_t n = BOUNCE_BYTES / d->page_bytes;
    return n ? n : 1;
}

/* ---- the file ---- */

static dj_status fail_errno(dj_status code, const char *dir, const char *what, int e) {
    return dj_fail(code, "--state-dir %s: %s: %s", dir, what, strerror(e));
}

/* An existing page file: its header must be ours, of this version and page size. */
static dj_status check_header(dj__disk *d, const char *dir, off_t size) {
    disk_header h;
    memset(&h, 0, sizeof h);
    bool short_io = false;
    const int e = size >= (off_t)sizeof h ? full_io(d->fd, false, (uint8_t *)&h, sizeof h, 0, &short_io) : 0;
    if (e) return fail_errno(DJ_EIO, dir, "reading " DISK_FILE "'s header", e);
    if (size < (off_t)sizeof h || short_io || memcmp(h.magic, DISK_MAGIC, 8) || h.sum != header_sum(&h))
        return dj_fail(DJ_EFORMAT, "--state-dir %s: %s exists and is not a Djinn page file (or its header is "
                                   "damaged); it is left as it is: remove it or choose another directory",
                       dir, d->path);
    if (h.version != DISK_VERSION || h.header_bytes != DISK_HEADER)
        return dj_fail(DJ_EFORMAT, "--state-dir %s: %s is a page file of format version %u; this djinnd writes "
                                   "version %u; it is left as it is: remove it or choose another directory",
                       dir, d->path, h.version, DISK_VERSION);
    if (h.page_bytes != d->page_bytes)
        return dj_fail(DJ_EFORMAT, "--state-dir %s: %s holds KV pages of %" PRIu64 " bytes (another model or KV "
                                   "layout); this daemon's are %zu bytes; it is left as it is: remove it or choose "
                                   "another directory", dir, d->path, h.page_bytes, d->page_bytes);
    return DJ_OK;
}

dj_status dj__disk_open(const char *dir, size_t bytes, size_t page_bytes, uint32_t threads, dj__disk **out) {
    *out = NULL;
    struct stat sb;
    if (!dir || !*dir) return dj_fail(DJ_EINVAL, "--state-dir: empty path");
    if (stat(dir, &sb) != 0)
        return dj_fail(DJ_ENOTFOUND, "--state-dir %s: %s (make the directory first)", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return dj_fail(DJ_ENOTFOUND, "--state-dir %s: not a directory", dir);
    if (access(dir, W_OK | X_OK) != 0) return fail_errno(DJ_EIO, dir, "not writable", errno);
    if (!page_bytes || bytes / page_bytes == 0)
        return dj_fail(DJ_EINVAL, "disk tier of %zu bytes holds no KV page of %zu bytes", bytes, page_bytes);
    const size_t slot_bytes = (page_bytes + DISK_ALIGN - 1) / DISK_ALIGN * DISK_ALIGN;
    const size_t n = bytes / page_bytes;
    if (n >= UINT32_MAX) return dj_fail(DJ_EINVAL, "disk tier of %zu bytes: too many pages (%zu)", bytes, n);
    dj__disk *d = dj_calloc(1, sizeof *d);
    if (!d) return dj_fail(DJ_ENOMEM, "disk tier: out of host memory");
    d->fd = d->fd_direct = -1;
    d->page_bytes = page_bytes;
    d->slot_bytes = slot_bytes;
    d->n_slots = (uint32_t)n;
    dj_status st = DJ_OK;
    bool created = false;
    if ((size_t)snprintf(d->path, sizeof d->path, "%s/%s", dir, DISK_FILE) >= sizeof d->path) {
        st = dj_fail(DJ_EINVAL, "--state-dir %s: path too long", dir);
        goto fail;
    }
    d->fd = open(d->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (d->fd >= 0) created = true;
    else if (errno == EEXIST) d->fd = open(d->path, O_RDWR | O_CLOEXEC);
    if (d->fd < 0) {
        st = fail_errno(DJ_EIO, dir, "opening " DISK_FILE, errno);
        goto fail;
    }
    if (flock(d->fd, LOCK_EX | LOCK_NB) != 0) {
        st = errno == EWOULDBLOCK
                 ? dj_fail(DJ_EBUSY, "--state-dir %s: %s is held by another djinnd (one state directory per daemon)",
                           dir, d->path)
                 : fail_errno(DJ_EIO, dir, "locking " DISK_FILE, errno);
        goto fail;
    }
    if (fstat(d->fd, &sb) != 0) {
        st = fail_errno(DJ_EIO, dir, "stat " DISK_FILE, errno);
        goto fail;
    }
    if (!created && sb.st_size > 0 && (st = check_header(d, dir, sb.st_size)) != DJ_OK) goto fail;
    const off_t want = (off_t)DISK_HEADER + (off_t)n * (off_t)slot_bytes;
    /* Free space is checked first: a filesystem's fallocate may take every free block before it
     * fails, and until the file is gone every other writer on that disk would fail too. */
    struct statvfs vs;
    const bool have_vs = fstatvfs(d->fd, &vs) == 0;
    const double free_b = have_vs ? (double)vs.f_bavail * (double)vs.f_frsize : -1;
    const double held_b = (double)sb.st_blocks * 512.0; /* what the file already holds counts as room */
    const int fe = have_vs && (double)want > free_b + held_b ? ENOSPC : posix_fallocate(d->fd, 0, want);
    if (fe) {
        if (!created && ftruncate(d->fd, sb.st_size) != 0) /* give back what a failed fallocate took */
            DJ_LOG(WARN, "disk tier: %s: could not truncate back to %lld bytes: %s", d->path, (long long)sb.st_size,
                   strerror(errno));
        st = dj_fail(DJ_EIO, "--state-dir %s: cannot reserve %.3f GiB for the disk tier: %s (%.3f GiB free there)",
                     dir, (double)want / (1u << 30), strerror(fe), free_b / (1u << 30));
        goto fail;
    }
    if (sb.st_size > want && ftruncate(d->fd, want) != 0) {
        st = fail_errno(DJ_EIO, dir, "truncating " DISK_FILE, errno);
        goto fail;
    }
    /* the header: one aligned block */
    uint8_t *hb = NULL;
    if (posix_memalign((void **)&hb, DISK_ALIGN, DISK_HEADER) != 0) {
        st = dj_fail(DJ_ENOMEM, "disk tier: out of host memory");
        goto fail;
    }
    memset(hb, 0, DISK_HEADER);
    disk_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, DISK_MAGIC, 8);
    h.version = DISK_VERSION;
    h.header_bytes = DISK_HEADER;
    h.page_bytes = page_bytes;
    h.slot_bytes = slot_bytes;
    h.n_slots = n;
    h.sum = header_sum(&h);
    memcpy(hb, &h, sizeof h);
    bool short_io = false;
    int e = full_io(d->fd, true, hb, DISK_HEADER, 0, &short_io);
    if (!e && fdatasync(d->fd) != 0) e = errno;
    if (e) {
        free(hb);
        st = fail_errno(DJ_EIO, dir, "writing " DISK_FILE "'s header", e);
        goto fail;
    }
    /* O_DIRECT where the filesystem takes it (tmpfs does not): tried on the header */
    d->fd_direct = dj__disk_no_direct ? -1 : open(d->path, O_RDWR | O_DIRECT | O_CLOEXEC);
    const int de = dj__disk_no_direct ? EINVAL : d->fd_direct < 0 ? errno : full_io(d->fd_direct, false, hb, DISK_HEADER, 0, &short_io);
    free(hb);
    if (de) {
        DJ_LOG(INFO, "disk tier: %s does not take O_DIRECT (%s): buffered I/O (the page cache holds its pages too)",
               d->path, strerror(de));
        if (d->fd_direct >= 0) close(d->fd_direct);
        d->fd_direct = -1;
    } else if (page_bytes % DISK_ALIGN) {
        DJ_LOG(INFO, "disk tier: KV pages of %zu bytes are not a multiple of %u: buffered I/O", page_bytes,
               DISK_ALIGN);
    }
    d->bits = dj_calloc((n + 63) / 64, sizeof *d->bits);
    d->n_thr = threads ? threads - 1 : 3; /* the caller is one more */
    d->thr = d->n_thr ? dj_calloc(d->n_thr, sizeof *d->thr) : NULL;
    if (!d->bits || (d->n_thr && !d->thr)) {
        st = dj_fail(DJ_ENOMEM, "disk tier: out of host memory");
        goto fail;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_cond_init(&d->cv_done, NULL);
    for (uint32_t i = 0; i < d->n_thr; i++)
        if (pthread_create(&d->thr[i], NULL, io_thread, d) != 0) {
            d->n_thr = i;
            dj__disk_close(d);
            return dj_fail(DJ_ENOMEM, "disk tier: cannot start I/O thread %u", i);
        }
    DJ_LOG(INFO, "disk tier: %s, %u pages of %zu bytes (%.2f GiB), %s I/O, %u threads", d->path, d->n_slots,
           page_bytes, (double)n * (double)page_bytes / (1u << 30), d->fd_direct >= 0 ? "direct" : "buffered",
           d->n_thr + 1);
    *out = d;
    return DJ_OK;
fail:
    if (created) unlink(d->path); /* ours, empty: nothing of anyone else's */
    if (d->fd_direct >= 0) close(d->fd_direct);
    if (d->fd >= 0) close(d->fd); /* drops the lock */
    free(d->bits);
    free(d->thr);
    free(d);
    return st;
}

void dj__disk_close(dj__disk *d) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_broadcast(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    for (uint32_t i = 0; i < d->n_thr; i++) pthread_join(d->thr[i], NULL);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_work);
    pthread_cond_destroy(&d->cv_done);
    if (d->fd_direct >= 0) close(d->fd_direct);
    if (d->fd >= 0) close(d->fd);
    free(d->bits);
    free(d->thr);
    free(d);
}
