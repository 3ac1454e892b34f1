/* test_disk.c: the KV store's disk tier on the CPU engine and the demo model -
 * sessions spilled from the pool to the page file and read back decode the
 * same logits bit for bit as twins never moved (straight into the pages and
 * through the bounce buffer), a flipped byte or a truncated file is refused
 * with DJ_EIO and the session stays whole on disk, and bad state dirs. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djinn/engine.h"
#include "exec/engine_impl.h"
#include "testutil.h"
#include "vmu/vmu_impl.h"

#define PAGE 16384
#define CTX 256
#define HEADER 4096 /* disk.c's header: slot i at HEADER + i * PAGE (PAGE is a multiple of 4096) */

static char root[256]; /* the test's scratch directory */

static dj_engine_t *new_engine(void) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.n_threads = 2;
    ec.max_step_tokens = 64;
    const size_t total = (size_t)64 << 20;
    dj_vmu_config_default(&ec.vmu, total);
    ec.vmu.page_bytes = PAGE;
    ec.vmu.text_frac = 0.5;
    ec.vmu.stack_frac = 0.2;
    ec.vmu.data_frac = 0.25;
    dj_engine_t *e = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    return e;
}

static dj_model_t *load_demo(dj_engine_t *e) {
    dj_model_t *m = NULL;
    CHECK_OK(dj_model_load(e, DJ_SOURCE_DIR "/models/demo", &m));
    return m;
}

static void check_store(dj_engine_t *e, const char *what) {
    CHECK_MSG(dj__vmu_check(dj_engine_vmu(e)) == DJ_OK, "%s: VMU: %s", what, dj_last_error());
    CHECK_MSG(dj__swap_check(e) == DJ_OK, "%s: pool/disk: %s", what, dj_last_error());
}

/* An engine with a pool of `pool_pages` and a disk tier in `dir`. */
static dj_engine_t *tiered_engine(const char *dir, size_t pool_pages, size_t disk_pages) {
    dj_engine_t *e = new_engine();
    CHECK_OK(dj_engine_swap_init(e, pool_pages * PAGE));
    CHECK_OK(dj_engine_disk_init(e, dir, disk_pages * PAGE, 3));
    return e;
}

/* Feeds the same prompt to a and its twin b; returns the vocabulary. */
static uint32_t feed_both(dj_engine_t *e, dj_session_t *a, dj_engine_t *er, dj_session_t *b, uint32_t n,
                          uint32_t salt) {
    int32_t ids[200];
    for (uint32_t t = 0; t < n; t++) ids[t] = (int32_t)((t * 37u + salt * 101u) % 4096u);
    CHECK_OK(dj_session_step(e, a, ids, n, NULL));
    CHECK_OK(dj_session_step(er, b, ids, n, NULL));
    return 4096;
}

/* Greedy decode of n tokens in both; every logit compared bit for bit. */
static void decode_equal(dj_engine_t *e, dj_session_t *a, dj_engine_t *er, dj_session_t *b, uint32_t n,
                         const char *what) {
    const uint32_t V = 4096;
    float *la = malloc(V * sizeof *la), *lb = malloc(V * sizeof *lb);
    int32_t tok = 5;
    for (uint32_t k = 0; k < n; k++) {
        CHECK_OK(dj_session_step(e, a, &tok, 1, la));
        CHECK_OK(dj_session_step(er, b, &tok, 1, lb));
        if (memcmp(la, lb, V * sizeof *la)) {
            CHECK_MSG(false, "%s: decode step %u: logits differ from the twin never moved", what, k);
            break;
        }
        int32_t best = 0;
        for (uint32_t v = 1; v < V; v++)
            if (la[v] > la[best]) best = (int32_t)v;
        tok = best;
    }
    free(la);
    free(lb);
}

/* Out to the pool, on to disk, back: the same tokens as the twin. */
static void round_trip(bool bounce) {
    char dir[300];
    snprintf(dir, sizeof dir, "%s/rt%d", root, bounce);
    CHECK(mkdir(dir, 0700) == 0);
    dj__disk_force_bounce = bounce;
    dj_engine_t *e = tiered_engine(dir, 80, 200), *er = new_engine();
    dj_model_t *m = load_demo(e), *mr = load_demo(er);
    dj_session_t *s[3] = {NULL}, *t[3] = {NULL};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(dj_session_new(e, m, CTX, 0, &s[i]));
        CHECK_OK(dj_session_new(er, mr, CTX, 0, &t[i]));
        feed_both(e, s[i], er, t[i], 40 + 30 * (uint32_t)i, (uint32_t)i);
    }
    const uint32_t np = dj_session_kv_pages(s[0]);
    /* 0 and 1 out: the pool (80 pages) holds one of them, so 0 goes on to disk */
    CHECK_OK(dj_session_swap_out(e, s[0]));
    CHECK_OK(dj_session_swap_spill(e, s[0]));
    CHECK(dj_session_on_disk(s[0]) && dj_session_residency(s[0]) == DJ_KV_SWAPPED);
    CHECK_OK(dj_session_swap_out(e, s[1]));
    check_store(e, "two out, one on disk");
    dj_swap_stats ps;
    dj_engine_swap_stats(e, &ps);
    dj_disk_stats ds;
    dj_engine_disk_stats(e, &ds);
    CHECK(ps.used == (size_t)dj_session_kv_pages(s[1]) * PAGE);
    CHECK(ds.enabled && ds.sessions == 1 && ds.used == (size_t)np * PAGE && ds.spills == 1);
    CHECK(ds.bytes_written == (uint64_t)np * PAGE && ds.capacity == 200 * (size_t)PAGE);
    CHECK_ST(dj_session_swap_spill(e, s[2]), DJ_EBUSY); /* resident: only a swapped-out one goes */
    CHECK_OK(dj_session_swap_spill(e, s[0]));           /* already there: nothing to do */
    /* a step of a session on disk is refused as one in the pool is */
    int32_t one = 3;
    CHECK_ST(dj_session_step(e, s[0], &one, 1, NULL), DJ_EBUSY);
    /* s[2] decodes on meanwhile, then everything comes back and decodes as the twins */
    decode_equal(e, s[2], er, t[2], 4, "resident");
    CHECK_OK(dj_session_swap_in(e, s[0]));
    CHECK(!dj_session_on_disk(s[0]) && dj_session_residency(s[0]) == DJ_KV_RESIDENT);
    CHECK_OK(dj_session_swap_in(e, s[1]));
    check_store(e, "back");
    dj_engine_disk_stats(e, &ds);
    CHECK(ds.sessions == 0 && ds.used == 0 && ds.reads == 1 && ds.bytes_read == (uint64_t)np * PAGE);
    CHECK(ds.bad_pages == 0 && ds.failed_reads == 0);
    for (int i = 0; i < 3; i++) decode_equal(e, s[i], er, t[i], 12, bounce ? "read back through the bounce" : "read back");
    /* twice more through the disk, growing in between: still the twin's tokens */
    for (int k = 0; k < 2; k++) {
        CHECK_OK(dj_session_swap_out(e, s[0]));
        CHECK_OK(dj_session_swap_spill(e, s[0]));
        check_store(e, "again on disk");
        CHECK_OK(dj_session_swap_in(e, s[0]));
        decode_equal(e, s[0], er, t[0], 5, "again");
    }
    /* a session freed while on disk gives its slots back */
    CHECK_OK(dj_session_swap_out(e, s[1]));
    CHECK_OK(dj_session_swap_spill(e, s[1]));
    dj_session_free(e, s[1]);
    s[1] = NULL;
    check_store(e, "freed on disk");
    dj_engine_disk_stats(e, &ds);
    CHECK(ds.sessions == 0 && ds.used == 0);
    /* the pool cannot be swapped from under the tier */
    CHECK_ST(dj_engine_swap_init(e, 90 * PAGE), DJ_EBUSY);
    CHECK(strstr(dj_last_error(), "disk tier") != NULL);
    for (int i = 0; i < 3; i++) {
        dj_session_free(e, s[i]);
        dj_session_free(er, t[i]);
    }
    dj_model_release(e, m);
    dj_model_release(er, mr);
    dj_engine_free(e);
    dj_engine_free(er);
    dj__disk_force_bounce = false;
}

/* A page of the file changed under a session on disk (a byte flipped, or the
 * file cut short): DJ_EIO naming it, the session whole on disk, and once the
 * page is mended it reads back as the twin. */
static void corruption(void) {
    char dir[300], path[340];
    snprintf(dir, sizeof dir, "%s/bad", root);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/kv-pages.djinn", dir);
    dj_engine_t *e = tiered_engine(dir, 80, 100), *er = new_engine();
    dj_model_t *m = load_demo(e), *mr = load_demo(er);
    dj_session_t *s = NULL, *t = NULL;
    CHECK_OK(dj_session_new(e, m, CTX, 0, &s));
    CHECK_OK(dj_session_new(er, mr, CTX, 0, &t));
    feed_both(e, s, er, t, 50, 7);
    CHECK_OK(dj_session_swap_out(e, s));
    CHECK_OK(dj_session_swap_spill(e, s));
    const uint32_t victim = s->n_slots / 2;
    const off_t off = (off_t)HEADER + (off_t)s->dslots[victim] * PAGE + 1234;
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    uint8_t b = 0, flipped;
    CHECK(pread(fd, &b, 1, off) == 1);
    flipped = b ^ 0x10;
    CHECK(pwrite(fd, &flipped, 1, off) == 1);
    fsync(fd);
    dj_vmu_stats vb, va;
    dj_vmu_get_stats(dj_engine_vmu(e), &vb);
    CHECK_ST(dj_session_swap_in(e, s), DJ_EIO);
    CHECK_MSG(strstr(dj_last_error(), "checksum") && strstr(dj_last_error(), "cannot be used"), "the error: %s",
              dj_last_error());
    char want[32];
    snprintf(want, sizeof want, "page %u ", victim);
    CHECK_MSG(strstr(dj_last_error(), want) != NULL, "the error names page %u: %s", victim, dj_last_error());
    dj_vmu_get_stats(dj_engine_vmu(e), &va);
    CHECK(dj_session_on_disk(s) && dj_session_residency(s) == DJ_KV_SWAPPED && va.pages_free == vb.pages_free);
    check_store(e, "refused read-back");
    dj_disk_stats ds;
    dj_engine_disk_stats(e, &ds);
    CHECK(ds.bad_pages == 1 && ds.failed_reads == 1 && ds.reads == 0);
    /* the bounce path sees it as well */
    dj__disk_force_bounce = true;
    CHECK_ST(dj_session_swap_in(e, s), DJ_EIO);
    dj__disk_force_bounce = false;
    /* the page mended: it reads back, the twin's tokens */
    CHECK(pwrite(fd, &b, 1, off) == 1);
    CHECK_OK(dj_session_swap_in(e, s));
    decode_equal(e, s, er, t, 8, "mended");
    /* a file cut short under a session on disk */
    CHECK_OK(dj_session_swap_out(e, s));
    CHECK_OK(dj_session_swap_spill(e, s));
    struct stat sb;
    CHECK(fstat(fd, &sb) == 0);
    CHECK(ftruncate(fd, (off_t)HEADER + (off_t)s->dslots[0] * PAGE + PAGE / 2) == 0);
    CHECK_ST(dj_session_swap_in(e, s), DJ_EIO);
    CHECK_MSG(strstr(dj_last_error(), "truncated") != NULL, "the error: %s", dj_last_error());
    CHECK(dj_session_on_disk(s));
    check_store(e, "truncated");
    close(fd);
    dj_session_free(e, s);
    dj_session_free(er, t);
    check_store(e, "freed");
    dj_model_release(e, m);
    dj_model_release(er, mr);
    dj_engine_free(e);
    dj_engine_free(er);
}

static size_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (size_t)sb.st_size : (size_t)-1;
}

/* State directories that must be refused at start, with nothing written. */
static void bad_dirs(void) {
    dj_engine_t *e = new_engine();
    CHECK_OK(dj_engine_swap_init(e, 10 * PAGE));
    char dir[300], path[340];
    snprintf(dir, sizeof dir, "%s/missing", root);
    CHECK_ST(dj_engine_disk_init(e, dir, 10 * PAGE, 2), DJ_ENOTFOUND);
    CHECK(strstr(dj_last_error(), "make the directory first") != NULL);
    snprintf(dir, sizeof dir, "%s/plain", root);
    FILE *f = fopen(dir, "w");
    fclose(f);
    CHECK_ST(dj_engine_disk_init(e, dir, 10 * PAGE, 2), DJ_ENOTFOUND);
    CHECK(strstr(dj_last_error(), "not a directory") != NULL);
    /* a file of that name that is not ours: left byte for byte */
    snprintf(dir, sizeof dir, "%s/foreign", root);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/kv-pages.djinn", dir);
    f = fopen(path, "w");
    fputs("somebody else's data\n", f);
    fclose(f);
    CHECK_ST(dj_engine_disk_init(e, dir, 10 * PAGE, 2), DJ_EFORMAT);
    CHECK(strstr(dj_last_error(), "not a Djinn page file") != NULL);
    CHECK(file_size(path) == 21);
    /* more than the disk can hold: refused at once, and the file it made is gone */
    snprintf(dir, sizeof dir, "%s/huge", root);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(path, sizeof path, "%s/kv-pages.djinn", dir);
    CHECK_ST(dj_engine_disk_init(e, dir, (size_t)1 << 43, 2), DJ_EIO);
    CHECK_MSG(strstr(dj_last_error(), "cannot reserve") && strstr(dj_last_error(), "free there"), "the error: %s",
              dj_last_error());
    CHECK(access(path, F_OK) != 0);
    /* one page file, one daemon: a second engine on the same directory is refused */
    snprintf(dir, sizeof dir, "%s/shared", root);
    CHECK(mkdir(dir, 0700) == 0);
    CHECK_OK(dj_engine_disk_init(e, dir, 10 * PAGE, 2));
    dj_engine_t *e2 = new_engine();
    CHECK_OK(dj_engine_swap_init(e2, 10 * PAGE));
    CHECK_ST(dj_engine_disk_init(e2, dir, 10 * PAGE, 2), DJ_EBUSY);
    CHECK(strstr(dj_last_error(), "another djinnd") != NULL);
    /* the first lets go; a daemon whose KV pages are of another size must not take the file over */
    CHECK_OK(dj_engine_disk_init(e, NULL, 0, 0));
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.n_threads = 1;
    dj_vmu_config_default(&ec.vmu, (size_t)64 << 20);
    ec.vmu.page_bytes = PAGE * 2;
    dj_engine_t *e3 = NULL;
    CHECK_OK(dj_engine_new(&ec, &e3));
    CHECK_OK(dj_engine_swap_init(e3, 10 * 2 * PAGE));
    snprintf(path, sizeof path, "%s/kv-pages.djinn", dir);
    const size_t before = file_size(path);
    CHECK_ST(dj_engine_disk_init(e3, dir, 10 * 2 * PAGE, 2), DJ_EFORMAT);
    CHECK(strstr(dj_last_error(), "another model or KV layout") != NULL);
    CHECK(file_size(path) == before);
    /* the same layout takes it over */
    CHECK_OK(dj_engine_disk_init(e2, dir, 20 * PAGE, 2));
    dj_disk_stats ds;
    dj_engine_disk_stats(e2, &ds);
    CHECK(ds.enabled && ds.capacity == 20 * (size_t)PAGE);
    if (geteuid() != 0) { /* root writes anywhere */
        snprintf(dir, sizeof dir, "%s/ro", root);
        CHECK(mkdir(dir, 0500) == 0);
        CHECK_ST(dj_engine_disk_init(e, dir, 10 * PAGE, 2), DJ_EIO);
        CHECK(strstr(dj_last_error(), "not writable") != NULL);
    }
    /* no pool, no tier */
    dj_engine_t *e4 = new_engine();
    snprintf(dir, sizeof dir, "%s/nopool", root);
    CHECK(mkdir(dir, 0700) == 0);
    CHECK_ST(dj_engine_disk_init(e4, dir, 10 * PAGE, 2), DJ_EINVAL);
    dj_engine_free(e4);
    dj_engine_free(e3);
    dj_engine_free(e2);
    dj_engine_free(e);
}

/* O_DIRECT where the filesystem takes it (older tmpfs does not), else
 * buffered I/O, which reads back the same; the tier says which it uses. */
static void buffered_fallback(void) {
    char dir[] = "/dev/shm/djinn-disk-XXXXXX";
    if (!mkdtemp(dir)) return; /* no /dev/shm here */
    dj__disk_no_direct = true;
    dj_engine_t *e = tiered_engine(dir, 80, 100), *er = new_engine();
    dj__disk_no_direct = false;
    dj_disk_stats ds;
    dj_engine_disk_stats(e, &ds);
    CHECK(!ds.direct);
    dj_model_t *m = load_demo(e), *mr = load_demo(er);
    dj_session_t *s = NULL, *t = NULL;
    CHECK_OK(dj_session_new(e, m, CTX, 0, &s));
    CHECK_OK(dj_session_new(er, mr, CTX, 0, &t));
    feed_both(e, s, er, t, 33, 3);
    CHECK_OK(dj_session_swap_out(e, s));
    CHECK_OK(dj_session_swap_spill(e, s));
    CHECK_OK(dj_session_swap_in(e, s));
    decode_equal(e, s, er, t, 6, "buffered");
    dj_session_free(e, s);
    dj_session_free(er, t);
    dj_model_release(e, m);
    dj_model_release(er, mr);
    dj_engine_free(e);
    dj_engine_free(er);
    char path[64];
    snprintf(path, sizeof path, "%s/kv-pages.djinn", dir);
    unlink(path);
    rmdir(dir);
}

int main(void) {
    snprintf(root, sizeof root, "%s", "/tmp/djinn-test-disk-XXXXXX");
    CHECK(mkdtemp(root) != NULL);
    round_trip(false);
    round_trip(true);
    corruption();
    bad_dirs();
    buffered_fallback();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "test_disk: could not remove %s\n", root);
    return dj_test_finish("test_disk");
}
