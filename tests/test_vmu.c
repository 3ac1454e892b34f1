/* test_vmu.c: the VMU on a test backend - config validation, allocation
 * failure, model sharing and LRU eviction, data pages under random use, quota,
 * the stack segment, the stats map and size parsing. */
#include <stdlib.h>
#include <string.h>

#include "djinn/vmu.h"
#include "testutil.h"
#include "vmu/vmu_impl.h"

/* ---- a test-only backend: posix_memalign memory, can refuse or misalign ---- */

typedef struct test_backend {
    dj_backend_t base;
    bool fail;          /* refuse the next alloc */
    size_t skew;        /* hand out pointers this many bytes past a 256 boundary */
    int live;           /* allocations not yet freed */
} test_backend;

static dj_status tb_alloc(dj_backend_t *be, size_t bytes, void **out) {
    test_backend *tb = (test_backend *)be;
    *out = NULL;
    if (tb->fail) return dj_fail(DJ_ENOMEM, "test backend refuses %zu bytes", bytes);
    void *p = NULL;
    if (posix_memalign(&p, 256, bytes + tb->skew) != 0) return dj_fail(DJ_ENOMEM, "posix_memalign failed");
    tb->live++;
    *out = (uint8_t *)p + tb->skew;
    return DJ_OK;
}

static void tb_free(dj_backend_t *be, void *ptr) {
    test_backend *tb = (test_backend *)be;
    tb->live--;
    free((uint8_t *)ptr - tb->skew);
}

static const dj_backend_vtbl tb_vtbl = {.name = "test", .alloc = tb_alloc, .free = tb_free};

static test_backend tb_make(void) {
    test_backend tb;
    memset(&tb, 0, sizeof tb);
    tb.base.vt = &tb_vtbl;
    return tb;
}

static bool msg_has(const char *needle) { return strstr(dj_last_error(), needle) != NULL; }

#define PAGE 4096

/* text = 8 pages of 4 KiB exactly, data = 64 pages, stack = 16 KiB. */
static dj_vmu_config small_cfg(void) {
    dj_vmu_config c;
    size_t total = 8 * PAGE + 64 * PAGE + 4 * PAGE; /* 76 pages */
    dj_vmu_config_default(&c, total);
    c.page_bytes = PAGE;
    c.text_frac = 8.0 / 76;
    c.data_frac = 64.0 / 76;
    c.stack_frac = 4.0 / 76;
    return c;
}

/* ---- config, backend failure, alignment ---- */

static void test_config(void) {
    test_backend tb = tb_make();
    dj_vmu_t *vmu = NULL;
    dj_vmu_config c;
    dj_vmu_config_default(&c, 1 << 20);
    CHECK(c.page_bytes == 65536 && c.text_frac + c.data_frac + c.stack_frac <= 1.0 + 1e-12);
    CHECK_OK(dj_vmu_new(&tb.base, &c, &vmu));
    CHECK(vmu != NULL && tb.live == 1);
    dj_vmu_free(vmu);
    CHECK(tb.live == 0);
    dj_vmu_free(NULL);

    dj_vmu_config b;
    b = c; b.total_bytes = 0;
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    CHECK(vmu == NULL && msg_has("total"));
    b = c; b.text_frac = -0.1;
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    CHECK(msg_has("[0, 1]") && msg_has("-0.1"));
    b = c; b.data_frac = 1.5;
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    b = c; b.stack_frac = 0.0 / 0.0;
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    b = c; b.text_frac = 0.7; b.data_frac = 0.3; b.stack_frac = 0.1;
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    CHECK(msg_has("sum to 1.1"));
    b = c; b.text_frac = 0.7; b.data_frac = 0.2; b.stack_frac = 0.1 + 5e-10; /* within the slack */
    CHECK_OK(dj_vmu_new(&tb.base, &b, &vmu));
    if (vmu) {
        dj_vmu_stats st;
        dj_vmu_get_stats(vmu, &st);
        CHECK(st.text.capacity + st.data.capacity + st.stack.capacity <= b.total_bytes);
        dj_vmu_free(vmu);
        vmu = NULL;
    }
    b = c; b.page_bytes = 0;
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    b = c; b.page_bytes = 1000;
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    CHECK(msg_has("1000") && msg_has("64"));
    b = c; b.page_bytes = 4096 + DJ_VMU_PAGE_ALIGN; /* not a multiple of 256: the stack still starts aligned */
    CHECK_OK(dj_vmu_new(&tb.base, &b, &vmu));
    if (vmu) {
        dj_vmu_stats st;
        dj_vmu_get_stats(vmu, &st);
        CHECK(st.pages_total > 1 && st.data.capacity == st.pages_total * b.page_bytes);
        CHECK(dj_vmu_data_base(vmu) + st.data.capacity <= dj_vmu_stack_base(vmu) &&
              (uintptr_t)dj_vmu_stack_base(vmu) % DJ_VMU_ALIGN == 0);
        CHECK(st.text.capacity + st.data.capacity + st.stack.capacity <= b.total_bytes);
        dj_vmu_free(vmu);
        vmu = NULL;
    }
    b = c; b.page_bytes = 1 << 20; /* 30% of 1 MiB holds no page */
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    CHECK(msg_has("page") && msg_has("1048576"));
    b = c; b.stack_frac = 0.0;
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    CHECK(msg_has("stack"));
    b = c; b.total_bytes = 600; b.page_bytes = 256; /* text 360 -> 256 ok, data 180 < page */
    CHECK_ST(dj_vmu_new(&tb.base, &b, &vmu), DJ_EINVAL);
    CHECK_ST(dj_vmu_new(NULL, &c, &vmu), DJ_EINVAL);
    CHECK_ST(dj_vmu_new(&tb.base, NULL, &vmu), DJ_EINVAL);
    CHECK(tb.live == 0 && vmu == NULL);
}

static void test_backend_failure(void) {
    test_backend tb = tb_make();
    tb.fail = true;
    dj_vmu_config c;
    dj_vmu_config_default(&c, 1 << 20);
    dj_vmu_t *vmu = (dj_vmu_t *)&tb; /* must be overwritten with NULL */
    CHECK_ST(dj_vmu_new(&tb.base, &c, &vmu), DJ_ENOMEM);
    CHECK(vmu == NULL && tb.live == 0);
    CHECK(msg_has("backend test") && msg_has("1048576") && msg_has("refuses"));
}

static bool aligned_ptr(const void *p) { return (uintptr_t)p % DJ_VMU_ALIGN == 0; }

static void test_alignment(void) {
    for (size_t skew = 0; skew < 256; skew += 64 + dj_test_rand() % 32) {
        test_backend tb = tb_make();
        tb.skew = skew;
        dj_vmu_config c = small_cfg();
        dj_vmu_t *vmu = NULL;
        /* losing the skew takes it from the last segment: still valid */
        CHECK_OK(dj_vmu_new(&tb.base, &c, &vmu));
        if (!vmu) continue;
        dj_vmu_stats st;
        dj_vmu_get_stats(vmu, &st);
        CHECK(aligned_ptr(dj_vmu_data_base(vmu)) && aligned_ptr(dj_vmu_stack_base(vmu)));
        CHECK(st.text.capacity % 256 == 0 && st.stack.capacity % 256 == 0 && st.pages_total == 64);
        CHECK(st.text.capacity + st.data.capacity + st.stack.capacity <= c.total_bytes - skew);
        dj_vmu_model_t *m = NULL;
        void *p1 = NULL, *p2 = NULL;
        CHECK_OK(dj_vmu_model_create(vmu, 1, "a", 1000, &m));
        CHECK_OK(dj_vmu_model_alloc(m, 3, &p1));
        CHECK_OK(dj_vmu_model_alloc(m, 5, &p2));
        CHECK(aligned_ptr(p1) && aligned_ptr(p2) && (uint8_t *)p2 - (uint8_t *)p1 == 256);
        CHECK(dj_vmu_model_used(m) == 512 && dj_vmu_model_bytes(m) == 1024);
        void *s1 = NULL, *s2 = NULL;
        CHECK_OK(dj_vmu_stack_push(vmu, 1, &s1));
        CHECK_OK(dj_vmu_stack_push(vmu, 300, &s2));
        CHECK(aligned_ptr(s1) && aligned_ptr(s2) && (uint8_t *)s2 - (uint8_t *)s1 == 256);
        /* the segments do not overlap: text end <= data base <= stack base */
        CHECK(dj_vmu_model_base(m) + st.text.capacity <= dj_vmu_data_base(vmu));
        CHECK(dj_vmu_data_base(vmu) + st.data.capacity <= dj_vmu_stack_base(vmu));
        dj_vmu_free(vmu);
        CHECK(tb.live == 0);
    }
}

/* ---- text segment ---- */

typedef struct tracked {
    int id;
    int *log;   /* dtor appends id */
    int *n_log;
} tracked;

static void tracked_dtor(void *u) {
    tracked *t = u;
    t->log[(*t->n_log)++] = t->id;
}

static void test_sharing(void) {
    test_backend tb = tb_make();
    dj_vmu_config c = small_cfg();
    dj_vmu_t *vmu = NULL;
    CHECK_OK(dj_vmu_new(&tb.base, &c, &vmu));
    if (!vmu) return;
    uint64_t fp = dj_test_rand();
    dj_vmu_model_t *m = NULL, *m2 = NULL, *m3 = NULL;
    CHECK_ST(dj_vmu_model_lookup(vmu, fp, &m), DJ_ENOTFOUND);
    CHECK(m == NULL);
    CHECK_OK(dj_vmu_model_create(vmu, fp, "llama", 3 * PAGE, &m));
    CHECK_ST(dj_vmu_model_create(vmu, fp, "llama again", PAGE, &m2), DJ_EBUSY);
    uint8_t *w = NULL;
    CHECK_OK(dj_vmu_model_alloc(m, 2 * PAGE, (void **)&w));
    uint8_t pattern[64];
    for (int i = 0; i < 64; i++) pattern[i] = (uint8_t)dj_test_rand();
    memcpy(w, pattern, sizeof pattern);
    void *tail = NULL;
    CHECK_ST(dj_vmu_model_alloc(m, PAGE + 1, &tail), DJ_ENOSPC);
    CHECK(msg_has("llama") && msg_has("left"));
    CHECK_OK(dj_vmu_model_alloc(m, PAGE, &tail));
    dj_vmu_stats st;
    dj_vmu_get_stats(vmu, &st);
    size_t used_once = st.text.used;
    CHECK(used_once == 3 * PAGE && st.n_models == 1 && st.text_pinned == 3 * PAGE);
    dj_vmu_model_release(vmu, m);
    CHECK(dj_vmu_model_refcount(m) == 0);
    dj_vmu_get_stats(vmu, &st);
    CHECK(st.text.used == used_once && st.text_pinned == 0); /* cached at refcount 0 */

    CHECK_OK(dj_vmu_model_lookup(vmu, fp, &m2));
    CHECK_OK(dj_vmu_model_lookup(vmu, fp, &m3));
    CHECK(m2 == m && m3 == m && dj_vmu_model_refcount(m) == 2);
    dj_vmu_get_stats(vmu, &st);
    CHECK(st.text.used == used_once && st.n_models == 1 && st.evictions == 0);
    CHECK(memcmp(w, pattern, sizeof pattern) == 0);
    dj_vmu_model_release(vmu, m2);
    dj_vmu_model_release(vmu, m3);

    /* over-release and a foreign model: logged and ignored, nothing corrupted */
    dj_vmu_model_release(vmu, m);
    CHECK(dj_vmu_model_refcount(m) == 0);
    test_backend tb2 = tb_make();
    dj_vmu_t *other = NULL;
    CHECK_OK(dj_vmu_new(&tb2.base, &c, &other));
    if (other) {
        dj_vmu_model_t *foreign = NULL;
        CHECK_OK(dj_vmu_model_create(other, fp, "foreign", PAGE, &foreign));
        dj_vmu_model_release(vmu, foreign);
        CHECK(dj_vmu_model_refcount(foreign) == 1);
        CHECK_OK(dj__vmu_check(other));
        dj_vmu_free(other);
    }
    CHECK_OK(dj__vmu_check(vmu));
    /* still evictable after all that */
    dj_vmu_model_t *big = NULL;
    CHECK_OK(dj_vmu_model_create(vmu, fp + 1, "big", 8 * PAGE, &big));
    dj_vmu_get_stats(vmu, &st);
    CHECK(st.evictions == 1 && st.n_models == 1 && st.text.used == 8 * PAGE && st.text.peak == 8 * PAGE);
    CHECK_ST(dj_vmu_model_lookup(vmu, fp, &m2), DJ_ENOTFOUND);
    CHECK_OK(dj__vmu_check(vmu));
    dj_vmu_free(vmu);
    CHECK(tb.live == 0 && tb2.live == 0);
}

static void test_lru_hand(void) {
    test_backend tb = tb_make();
    dj_vmu_config c = small_cfg(); /* text: 8 units of PAGE */
    dj_vmu_t *vmu = NULL;
    CHECK_OK(dj_vmu_new(&tb.base, &c, &vmu));
    if (!vmu) return;
    int log[16], n_log = 0;
    tracked t[6];
    dj_vmu_model_t *m[6] = {0};
    /* A 2, B 2, C 2, D 2 fill the segment */
    for (int i = 0; i < 4; i++) {
        char name[8] = {(char)('A' + i), 0};
        t[i] = (tracked){i, log, &n_log};
        CHECK_OK(dj_vmu_model_create(vmu, 100 + (uint64_t)i, name, 2 * PAGE - 17, &m[i]));
        if (m[i]) dj_vmu_model_set_user(m[i], &t[i], tracked_dtor);
    }
    if (!m[0] || !m[1] || !m[2] || !m[3]) goto out;
    CHECK(dj_vmu_model_user(m[2]) == &t[2]);
    /* release order C, A, B; D stays pinned; then touch C again (lookup + release) */
    dj_vmu_model_release(vmu, m[2]);
    dj_vmu_model_release(vmu, m[0]);
    dj_vmu_model_release(vmu, m[1]);
    dj_vmu_model_t *x = NULL;
    CHECK_OK(dj_vmu_model_lookup(vmu, 102, &x));
    dj_vmu_model_release(vmu, x);
    /* LRU order is now A, B, C. E (2 units) evicts A only. */
    t[4] = (tracked){4, log, &n_log};
    CHECK_OK(dj_vmu_model_create(vmu, 104, "E", 2 * PAGE, &m[4]));
    CHECK(n_log == 1 && log[0] == 0);
    /* F needs 4 contiguous units: B is next LRU but its gap (2) does not fit, so C goes too */
    CHECK_OK(dj_vmu_model_create(vmu, 105, "F", 4 * PAGE, &m[5]));
    CHECK(n_log == 3 && log[1] == 1 && log[2] == 2);
    CHECK_ST(dj_vmu_model_lookup(vmu, 103, &x), DJ_OK); /* D survived (pinned) */
    if (x) dj_vmu_model_release(vmu, x);
    /* everything pinned: ENOSPC, nothing evicted, numbers in the message */
    dj_vmu_model_t *g = NULL;
    CHECK_ST(dj_vmu_model_create(vmu, 106, "G", 1, &g), DJ_ENOSPC);
    CHECK(g == NULL && n_log == 3);
    CHECK(msg_has("model G needs 256 bytes") && msg_has("32768 capacity") && msg_has("0 free") &&
          msg_has("32768 pinned"));
    /* bigger than the whole segment */
    CHECK_ST(dj_vmu_model_create(vmu, 107, "huge", 9 * PAGE, &g), DJ_ENOSPC);
    CHECK(msg_has("36864") && msg_has("32768 capacity"));
    CHECK_ST(dj_vmu_model_create(vmu, 107, "huger", SIZE_MAX, &g), DJ_ENOSPC);
    /* D released: 2 units free-able, but H needs 3 with E, F pinned: no eviction */
    dj_vmu_model_release(vmu, m[3]);
    CHECK_ST(dj_vmu_model_create(vmu, 108, "H", 3 * PAGE, &g), DJ_ENOSPC);
    CHECK(n_log == 3 && msg_has("24576 pinned") && msg_has(", 0 free"));
    CHECK_OK(dj__vmu_check(vmu));
out:
    dj_vmu_free(vmu); /* calls the remaining dtors: D, E(no user), F(no user) */
    CHECK(n_log == 4 && log[3] == 3);
    CHECK(tb.live == 0);
}

/* Random create/lookup/release against a shadow: every eviction must hit a
 * model with no references, the least recently used of those present. */
#define RM 24
typedef struct shadow_model {
    bool present;
    uint32_t refs;
    uint64_t last; /* shadow clock at create/lookup/release */
    dj_vmu_model_t *m;
} shadow_model;

static shadow_model shadow[RM];
static uint64_t shadow_clock;
static int shadow_bad, shadow_evicted;

static void shadow_dtor(void *u) {
    int id = (int)(intptr_t)u;
    shadow_evicted++;
    if (!shadow[id].present || shadow[id].refs != 0) shadow_bad++;
    for (int j = 0; j < RM; j++)
        if (j != id && shadow[j].present && shadow[j].refs == 0 && shadow[j].last < shadow[id].last) shadow_bad++;
    shadow[id].present = false;
}

static void test_lru_random(void) {
    test_backend tb = tb_make();
    dj_vmu_config c = small_cfg();
    c.text_frac = 0.5;
    c.data_frac = 0.25;
    dj_vmu_t *vmu = NULL;
    CHECK_OK(dj_vmu_new(&tb.base, &c, &vmu));
    if (!vmu) return;
    memset(shadow, 0, sizeof shadow);
    shadow_clock = 0;
    shadow_bad = shadow_evicted = 0;
    dj_vmu_stats st;
    dj_vmu_get_stats(vmu, &st);
    int enospc = 0, created = 0, check_fail = 0;
    for (int op = 0; op < 4000; op++) {
        int id = (int)(dj_test_rand() % RM);
        shadow_model *s = &shadow[id];
        int kind = (int)(dj_test_rand() % 3);
        if (kind == 0) {
            dj_vmu_model_t *m = NULL;
            if (s->present) {
                CHECK_OK(dj_vmu_model_lookup(vmu, (uint64_t)id, &m));
                CHECK(m == s->m);
                s->refs++;
                s->last = ++shadow_clock;
                continue;
            }
            size_t bytes = 1 + dj_test_rand() % (st.text.capacity / 3);
            int evicted_before = shadow_evicted;
            dj_status r = dj_vmu_model_create(vmu, (uint64_t)id, "r", bytes, &m);
            if (r == DJ_OK) {
                *s = (shadow_model){true, 1, ++shadow_clock, m};
                dj_vmu_model_set_user(m, (void *)(intptr_t)id, shadow_dtor);
                created++;
            } else {
                CHECK_ST(r, DJ_ENOSPC);
                enospc++;
                if (shadow_evicted != evicted_before) check_fail++; /* a failed create evicts nothing */
                /* and no gap between pinned regions could have held it */
                size_t need = dj_vmu_aligned(bytes), largest = 0, end = 0;
                for (const dj_vmu_model_t *q = vmu->models; q; q = q->next) {
                    if (q->refcount == 0) continue;
                    size_t off = (size_t)(dj_vmu_model_base(q) - vmu->text_base);
                    if (off - end > largest) largest = off - end;
                    end = off + dj_vmu_model_bytes(q);
                }
                if (st.text.capacity - end > largest) largest = st.text.capacity - end;
                CHECK_MSG(largest < need, "ENOSPC for %zu bytes with a %zu-byte pinned-free gap", need, largest);
            }
        } else if (s->present && s->refs > 0) {
            dj_vmu_model_release(vmu, s->m);
            s->refs--;
            s->last = ++shadow_clock;
        }
        if (dj__vmu_check(vmu) != DJ_OK) check_fail++;
        for (int j = 0; j < RM; j++)
            if (shadow[j].present && dj_vmu_model_refcount(shadow[j].m) != shadow[j].refs) check_fail++;
    }
    CHECK_MSG(shadow_bad == 0, "%d evictions out of LRU order or of pinned models", shadow_bad);
    CHECK_MSG(check_fail == 0, "%d invariant failures (%s)", check_fail, dj_last_error());
    dj_vmu_get_stats(vmu, &st);
    CHECK((int)st.evictions == shadow_evicted);
    printf("lru random: %d created, %d evicted, %d ENOSPC\n", created, shadow_evicted, enospc);
    CHECK(created > 10 && shadow_evicted > 0);
    dj_vmu_free(vmu);
    CHECK(tb.live == 0);
}

/* ---- data segment ---- */

#define NS 5

static void test_pages_random(void) {
    test_backend tb = tb_make();
    dj_vmu_config c = small_cfg();
    dj_vmu_t *vmu = NULL;
    CHECK_OK(dj_vmu_new(&tb.base, &c, &vmu));
    if (!vmu) return;
    dj_vmu_stats st;
    dj_vmu_get_stats(vmu, &st);
    uint32_t np = (uint32_t)st.pages_total;
    size_t pb = dj_vmu_page_bytes(vmu);
    uint8_t *base = dj_vmu_data_base(vmu);
    CHECK(np == 64 && pb == PAGE);
    int *who = malloc(np * sizeof *who); /* shadow owner per page, -1 free */
    dj_vmu_session_t *s[NS];
    uint32_t held[NS][64];
    size_t nheld[NS] = {0};
    for (uint32_t p = 0; p < np; p++) who[p] = -1;
    for (int i = 0; i < NS; i++) {
        char name[16];
        snprintf(name, sizeof name, "sess%d", i);
        CHECK_OK(dj_vmu_session_new(vmu, name, 0, &s[i]));
    }
    size_t peak = 0, in_use = 0;
    int bad = 0, full = 0;
    for (int op = 0; op < 20000; op++) {
        int i = (int)(dj_test_rand() % NS);
        uint64_t r = dj_test_rand() % 100;
        if (r < 55) {
            uint32_t p = 0;
            dj_status rs = dj_vmu_page_alloc(vmu, s[i], &p);
            if (in_use == np) {
                bad += rs != DJ_ENOSPC;
                full++;
                continue;
            }
            if (rs != DJ_OK || p >= np || who[p] != -1) {
                bad++;
                continue;
            }
            who[p] = i;
            held[i][nheld[i]++] = p;
            memset(base + (size_t)p * pb, 'a' + i, pb); /* the page's bytes are the session's */
            if (++in_use > peak) peak = in_use;
        } else if (r < 62) { /* a page handed to another session (the prefix cache takes full KV blocks so) */
            if (nheld[i] == 0) continue;
            size_t k = dj_test_rand() % nheld[i];
            uint32_t p = held[i][k];
            int other = (i + 1) % NS;
            bad += dj_vmu_page_give(vmu, s[other], s[i], p) != DJ_EINVAL; /* not other's to give */
            if (dj_vmu_page_give(vmu, s[i], s[other], p) != DJ_OK) {
                bad++;
                continue;
            }
            const uint8_t *pg = base + (size_t)p * pb;
            bad += pg[0] != 'a' + i || pg[pb - 1] != 'a' + i; /* the bytes stay */
            memset(base + (size_t)p * pb, 'a' + other, pb);
            who[p] = other;
            held[i][k] = held[i][--nheld[i]];
            held[other][nheld[other]++] = p;
        } else if (r < 97) {
            if (nheld[i] == 0) continue;
            size_t k = dj_test_rand() % nheld[i];
            uint32_t p = held[i][k];
            const uint8_t *pg = base + (size_t)p * pb;
            bad += pg[0] != 'a' + i || pg[pb - 1] != 'a' + i || pg[pb / 2] != 'a' + i;
            int other = (i + 1) % NS;
            bad += dj_vmu_page_free(vmu, s[other], p) != DJ_EINVAL; /* not other's page */
            if (dj_vmu_page_free(vmu, s[i], p) != DJ_OK) bad++;
            bad += dj_vmu_page_free(vmu, s[i], p) != DJ_EINVAL; /* already free */
            who[p] = -1;
            held[i][k] = held[i][--nheld[i]];
            in_use--;
        } else { /* the whole session goes; a new one takes its slot */
            dj_vmu_session_free(vmu, s[i]);
            for (size_t k = 0; k < nheld[i]; k++) who[held[i][k]] = -1;
            in_use -= nheld[i];
            nheld[i] = 0;
            CHECK_OK(dj_vmu_session_new(vmu, "again", 0, &s[i]));
        }
        dj_vmu_get_stats(vmu, &st);
        bad += st.data.used != in_use * pb || st.pages_free != np - in_use || st.data.peak != peak * pb;
        for (int j = 0; j < NS; j++) bad += dj_vmu_session_pages(s[j]) != nheld[j];
        if (op % 97 == 0) bad += dj__vmu_check(vmu) != DJ_OK;
    }
    /* the walk may not have reached a full segment on this seed: fill it now,
     * round-robin over the sessions, so the ENOSPC path is always exercised */
    for (int i = 0; in_use < np; i = (i + 1) % NS) {
        uint32_t p = 0;
        if (dj_vmu_page_alloc(vmu, s[i], &p) != DJ_OK || p >= np || who[p] != -1) {
            bad++;
            break;
        }
        who[p] = i;
        held[i][nheld[i]++] = p;
        memset(base + (size_t)p * pb, 'a' + i, pb);
        if (++in_use > peak) peak = in_use;
    }
    {
        uint32_t p = 0;
        bad += dj_vmu_page_alloc(vmu, s[0], &p) != DJ_ENOSPC;
        full++;
    }
    CHECK_MSG(bad == 0, "%d accounting/ownership errors (%s)", bad, dj_last_error());
    CHECK(full > 0 && peak == np);
    /* every page is reusable by any one session */
    for (int i = 0; i < NS; i++) {
        dj_vmu_session_free(vmu, s[i]);
        for (size_t k = 0; k < nheld[i]; k++) who[held[i][k]] = -1;
    }
    dj_vmu_get_stats(vmu, &st);
    CHECK(st.data.used == 0 && st.pages_free == np && st.n_sessions == 0);
    for (int round = 0; round < 2; round++) {
        dj_vmu_session_t *one = NULL;
        CHECK_OK(dj_vmu_session_new(vmu, "one", 0, &one));
        uint8_t *seen = calloc(np, 1);
        uint32_t p = 0;
        int dup = 0;
        for (uint32_t k = 0; k < np; k++) {
            CHECK_OK(dj_vmu_page_alloc(vmu, one, &p));
            if (p < np) dup += seen[p]++;
        }
        CHECK(dup == 0);
        CHECK_ST(dj_vmu_page_alloc(vmu, one, &p), DJ_ENOSPC);
        CHECK(msg_has("data segment full") && msg_has("one"));
        CHECK(dj_vmu_session_pages(one) == np);
        CHECK_ST(dj_vmu_page_free(vmu, one, np), DJ_EINVAL);
        CHECK(msg_has("pages 0..63"));
        CHECK_OK(dj__vmu_check(vmu));
        if (round == 1) dj_vmu_session_free(vmu, one); /* round 0: dj_vmu_free frees it */
        free(seen);
        if (round == 0) {
            /* a session freed while holding everything returns everything */
            dj_vmu_session_free(vmu, one);
            dj_vmu_get_stats(vmu, &st);
            CHECK(st.pages_free == np);
        }
    }
    dj_vmu_session_t *leak = NULL;
    CHECK_OK(dj_vmu_session_new(vmu, "left for dj_vmu_free", 0, &leak));
    uint32_t p;
    CHECK_OK(dj_vmu_page_alloc(vmu, leak, &p));
    dj_vmu_session_free(vmu, NULL);
    free(who);
    dj_vmu_free(vmu); /* frees the session too: ASan would see a leak otherwise */
    CHECK(tb.live == 0);
}

static void test_quota(void) {
    test_backend tb = tb_make();
    dj_vmu_config c = small_cfg();
    dj_vmu_t *vmu = NULL;
    CHECK_OK(dj_vmu_new(&tb.base, &c, &vmu));
    if (!vmu) return;
    dj_vmu_session_t *s = NULL, *t = NULL;
    CHECK_OK(dj_vmu_session_new(vmu, "capped", 3, &s));
    CHECK_OK(dj_vmu_session_new(vmu, NULL, 0, &t));
    uint32_t p[4];
    for (int i = 0; i < 3; i++) CHECK_OK(dj_vmu_page_alloc(vmu, s, &p[i]));
    CHECK_ST(dj_vmu_page_alloc(vmu, s, &p[3]), DJ_EQUOTA);
    CHECK(msg_has("capped") && msg_has("3 pages"));
    CHECK_OK(dj_vmu_page_alloc(vmu, t, &p[3])); /* others are not limited by it */
    CHECK_ST(dj_vmu_page_free(vmu, s, p[3]), DJ_EINVAL);
    CHECK(msg_has("held by session (unnamed)"));
    CHECK_OK(dj_vmu_page_free(vmu, s, p[1]));
    CHECK_OK(dj_vmu_page_alloc(vmu, s, &p[1]));
    /* a session of another VMU is neither freed nor given pages here */
    test_backend tb2 = tb_make();
    dj_vmu_t *other = NULL;
    dj_vmu_session_t *foreign = NULL;
    CHECK_OK(dj_vmu_new(&tb2.base, &c, &other));
    CHECK_OK(dj_vmu_session_new(other, "foreign", 0, &foreign));
    CHECK_ST(dj_vmu_page_free(vmu, foreign, p[0]), DJ_EINVAL);
    dj_vmu_session_free(vmu, foreign);
    CHECK_OK(dj__vmu_check(other));
    dj_vmu_free(other);
    CHECK(dj_vmu_session_pages(s) == 3);
    CHECK_OK(dj__vmu_check(vmu));
    dj_vmu_free(vmu);
}

/* ---- stack ---- */

static void test_stack(void) {
    test_backend tb = tb_make();
    dj_vmu_config c = small_cfg();
    dj_vmu_t *vmu = NULL;
    CHECK_OK(dj_vmu_new(&tb.base, &c, &vmu));
    if (!vmu) return;
    size_t cap = dj_vmu_stack_capacity(vmu);
    CHECK(cap == 4 * PAGE);
    CHECK(dj_vmu_stack_mark(vmu) == 0);
    void *a = NULL, *b = NULL, *x = NULL;
    CHECK_OK(dj_vmu_stack_push(vmu, 100, &a));
    size_t mark = dj_vmu_stack_mark(vmu);
    CHECK(mark == 256 && a == dj_vmu_stack_base(vmu));
    size_t pushed = mark;
    for (;;) {
        size_t want = 1 + dj_test_rand() % 3000;
        dj_status r = dj_vmu_stack_push(vmu, want, &b);
        if (r != DJ_OK) {
            CHECK_ST(r, DJ_ENOSPC);
            CHECK(b == NULL && dj_vmu_aligned(want) > cap - pushed);
            char expect[128];
            snprintf(expect, sizeof expect, "stack segment overflow: need %zu bytes at offset %zu, capacity %zu",
                     dj_vmu_aligned(want), pushed, cap);
            CHECK_MSG(strcmp(dj_last_error(), expect) == 0, "%s", dj_last_error());
            break;
        }
        CHECK((uint8_t *)b == dj_vmu_stack_base(vmu) + pushed);
        memset(b, 0x5a, want);
        pushed += dj_vmu_aligned(want);
    }
    CHECK(dj_vmu_stack_mark(vmu) == pushed);
    CHECK_ST(dj_vmu_stack_push(vmu, SIZE_MAX, &x), DJ_ENOSPC);
    CHECK_ST(dj_vmu_stack_push(vmu, SIZE_MAX - 100, &x), DJ_ENOSPC);
    dj_vmu_stats st;
    dj_vmu_get_stats(vmu, &st);
    CHECK(st.stack.used == pushed && st.stack.peak == pushed);
    dj_vmu_stack_reset(vmu, mark);
    CHECK(dj_vmu_stack_mark(vmu) == mark);
    CHECK_OK(dj_vmu_stack_push(vmu, cap - mark, &x)); /* exactly the rest fits */
    CHECK(x == (uint8_t *)a + 256);
    CHECK_ST(dj_vmu_stack_push(vmu, 1, &x), DJ_ENOSPC);
    dj_vmu_stack_reset(vmu, 0);
    dj_vmu_get_stats(vmu, &st);
    CHECK(st.stack.used == 0 && st.stack.peak == cap);
    CHECK_OK(dj__vmu_check(vmu));
    dj_vmu_free(vmu);
}

/* ---- stats map ---- */

static void test_print(void) {
    test_backend tb = tb_make();
    dj_vmu_config c = small_cfg();
    dj_vmu_t *vmu = NULL;
    CHECK_OK(dj_vmu_new(&tb.base, &c, &vmu));
    if (!vmu) return;
    dj_vmu_model_t *m = NULL, *m2 = NULL;
    CHECK_OK(dj_vmu_model_create(vmu, 0x0123456789abcdefull, "tiny-llama", 5000, &m));
    CHECK_OK(dj_vmu_model_create(vmu, 42, "cached-one", 300, &m2));
    dj_vmu_model_release(vmu, m2);
    dj_vmu_session_t *s = NULL;
    CHECK_OK(dj_vmu_session_new(vmu, "chat-7", 10, &s));
    uint32_t p;
    for (int i = 0; i < 3; i++) CHECK_OK(dj_vmu_page_alloc(vmu, s, &p));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    if (!f) goto out;
    dj_vmu_print_stats(vmu, f);
    fclose(f);
    CHECK(strstr(buf, "tiny-llama") && strstr(buf, "0123456789abcdef") && strstr(buf, "5120 B"));
    CHECK(strstr(buf, "refs 1  in use") && strstr(buf, "refs 0  cached"));
    CHECK(strstr(buf, "chat-7") && strstr(buf, "pages 3 of 10") && strstr(buf, "12288 B"));
    CHECK(strstr(buf, "text") && strstr(buf, "data") && strstr(buf, "stack") && strstr(buf, "MiB"));
    CHECK(strstr(buf, "capacity       0.03 MiB (32768 B)"));
    if (dj_test_failed) fputs(buf, stdout);
    free(buf);
out:
    dj_vmu_free(vmu);
}

/* ---- size parsing ---- */

static void test_parse_size(void) {
    struct {
        const char *s;
        size_t want;
    } good[] = {
        {"2", (size_t)2 << 30},        {"0.5", (size_t)1 << 29}, {"123b", 123},
        {"123B", 123},                 {"4k", 4096},             {"3m", (size_t)3 << 20},
        {"1g", (size_t)1 << 30},       {"1.5m", (size_t)3 << 19}, {"0.25K", 256},
        {"0", 0}, {"0.75k", 768}, {"0.1k", 102}, {"1.0000000001g", (size_t)1 << 30},                      {"16G", (size_t)16 << 30}, {"18446744073709551615b", SIZE_MAX},
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        size_t v = 1;
        CHECK_OK(dj_vmu_parse_size(good[i].s, &v));
        CHECK_MSG(v == good[i].want, "%s -> %zu, want %zu", good[i].s, v, good[i].want);
    }
    /* exact binary fractions written in decimal: a + b/256 of a unit */
    const size_t units[3] = {(size_t)1 << 10, (size_t)1 << 20, (size_t)1 << 30};
    const char sfx[3] = {'k', 'm', 'g'};
    int wrong = 0;
    for (int i = 0; i < 300; i++) {
        unsigned a = (unsigned)(dj_test_rand() % 100), b = (unsigned)(dj_test_rand() % 256);
        int u = (int)(dj_test_rand() % 3);
        char str[64];
        snprintf(str, sizeof str, "%u.%08u%c", a, b * 390625u, sfx[u]);
        size_t v = 0;
        wrong += dj_vmu_parse_size(str, &v) != DJ_OK || v != a * units[u] + b * (units[u] / 256);
    }
    CHECK_MSG(wrong == 0, "%d fractional sizes parsed wrong", wrong);
    const char *bad[] = {"", "abc", "1x", "-1", "+1", " 1", "1 ", "1.", ".5", "1.5b", "1e3", "2gb", "1..2", "k"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t v = 7;
        CHECK_ST(dj_vmu_parse_size(bad[i], &v), DJ_EINVAL);
        CHECK(strstr(dj_last_error(), bad[i]) != NULL && v == 0);
    }
    size_t v;
    CHECK_ST(dj_vmu_parse_size("18446744073709551616b", &v), DJ_ERANGE);
    CHECK_ST(dj_vmu_parse_size("17179869184", &v), DJ_ERANGE); /* 2^34 GiB */
    CHECK_ST(dj_vmu_parse_size("99999999999999999999999", &v), DJ_ERANGE);
    CHECK(msg_has("too large"));
    CHECK_ST(dj_vmu_parse_size(NULL, &v), DJ_EINVAL);
}

int main(void) {
    dj_test_seeds();
    test_config();
    test_backend_failure();
    test_alignment();
    test_sharing();
    test_lru_hand();
    test_lru_random();
    test_pages_random();
    test_quota();
    test_stack();
    test_print();
    test_parse_size();
    return dj_test_finish("test_vmu");
}
