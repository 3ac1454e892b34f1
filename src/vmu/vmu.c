/* vmu.c: the virtual memory unit - one backend allocation carved into the text
 * (model regions), data (session pages) and stack (activation bump) segments. */
#include <assert.h>
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vmu/vmu_impl.h"

#define MIB (1024.0 * 1024.0)

size_t dj_vmu_aligned(size_t bytes) {
    if (bytes > SIZE_MAX - (DJ_VMU_ALIGN - 1)) return SIZE_MAX; /* callers compare against capacity */
    return (bytes + (DJ_VMU_ALIGN - 1)) & ~(size_t)(DJ_VMU_ALIGN - 1);
}

static size_t align_down(size_t bytes) { return bytes & ~(size_t)(DJ_VMU_ALIGN - 1); }

static char *copy_name(const char *name, const char *fallback) {
    const char *s = name && name[0] ? name : fallback;
    size_t n = strlen(s);
    char *c = malloc(n + 1);
    if (c) memcpy(c, s, n + 1);
    return c;
}

/* ---- configuration ---- */

void dj_vmu_config_default(dj_vmu_config *cfg, size_t total_bytes) {
    cfg->total_bytes = total_bytes;
    cfg->text_frac = 0.6;
    cfg->data_frac = 0.3;
    cfg->stack_frac = 0.1;
    cfg->page_bytes = 64 * 1024;
}

dj_status dj_vmu_parse_size(const char *s, size_t *bytes) {
    if (!s || !bytes) return dj_fail(DJ_EINVAL, "size: no string given");
    *bytes = 0;
    const char *p = s;
    if (!isdigit((unsigned char)*p))
        return dj_fail(DJ_EINVAL, "size \"%s\": expected a number such as 2 (GiB), 0.5 (GiB), 512m, 64k or 123456b", s);
    size_t whole = 0;
    for (; isdigit((unsigned char)*p); p++) {
        size_t d = (size_t)(*p - '0');
        if (whole > (SIZE_MAX - d) / 10) return dj_fail(DJ_ERANGE, "size \"%s\": number too large", s);
        whole = whole * 10 + d;
    }
    /* fraction as num / den with at most 9 digits kept: num * unit < 2^60, and
     * later digits are worth under 2 bytes even for GiB */
    uint64_t num = 0, den = 1;
    bool has_frac = false;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return dj_fail(DJ_EINVAL, "size \"%s\": expected digits after the decimal point", s);
        for (; isdigit((unsigned char)*p); p++) {
            if (den < 1000000000u) {
                num = num * 10 + (uint64_t)(*p - '0');
                den *= 10;
            }
        }
        has_frac = true;
    }
    size_t unit;
    switch (tolower((unsigned char)*p)) {
    case '\0': unit = (size_t)1 << 30; break;
    case 'g': unit = (size_t)1 << 30; p++; break;
    case 'm': unit = (size_t)1 << 20; p++; break;
    case 'k': unit = (size_t)1 << 10; p++; break;
    case 'b': unit = 1; p++; break;
    default:
        return dj_fail(DJ_EINVAL, "size \"%s\": unknown unit '%c' (use b, k, m, g or none for GiB)", s, *p);
    }
    if (*p != '\0') return dj_fail(DJ_EINVAL, "size \"%s\": unexpected text after the unit", s);
    if (unit == 1 && has_frac) return dj_fail(DJ_EINVAL, "size \"%s\": a byte count must be whole", s);
    if (whole > SIZE_MAX / unit) return dj_fail(DJ_ERANGE, "size \"%s\": too large for this machine", s);
    size_t v = whole * unit;
    size_t f = (size_t)(num * unit / den); /* rounded down to whole bytes, < unit */
    if (f > SIZE_MAX - v) return dj_fail(DJ_ERANGE, "size \"%s\": too large for this machine", s);
    *bytes = v + f;
    return DJ_OK;
}

typedef struct vmu_layout {
    size_t text_cap, data_cap, stack_cap; /* text at 0, data after it, stack after data */
    size_t n_pages;
} vmu_layout;

static size_t frac_of(size_t total, double f) {
    double v = (double)total * f;
    if (v >= (double)SIZE_MAX) return total;
    size_t b = (size_t)v;
    return b < total ? b : total;
}

static bool frac_ok(double f) { return f >= 0.0 && f <= 1.0; } /* false for NaN */

/* Splits cfg->total_bytes by cfg into segments that fit in `usable` bytes
 * from a 256-aligned base (usable < total when the backend's pointer needed
 * aligning: the stack gives up the difference); says what is wrong. */
static dj_status vmu_layout_compute(const dj_vmu_config *cfg, size_t usable, vmu_layout *L) {
    if (cfg->total_bytes == 0) return dj_fail(DJ_EINVAL, "VMU: total size is 0; need at least a few pages");
    if (!frac_ok(cfg->text_frac) || !frac_ok(cfg->data_frac) || !frac_ok(cfg->stack_frac))
        return dj_fail(DJ_EINVAL, "VMU: segment fractions must lie in [0, 1]; got text %g, data %g, stack %g",
                       cfg->text_frac, cfg->data_frac, cfg->stack_frac);
    double sum = cfg->text_frac + cfg->data_frac + cfg->stack_frac;
    if (sum > 1.0 + 1e-9)
        return dj_fail(DJ_EINVAL, "VMU: segment fractions sum to %.9g (text %g + data %g + stack %g); must be <= 1",
                       sum, cfg->text_frac, cfg->data_frac, cfg->stack_frac);
    if (cfg->page_bytes == 0 || cfg->page_bytes % DJ_VMU_PAGE_ALIGN != 0)
        return dj_fail(DJ_EINVAL, "VMU: page size %zu bytes must be a positive multiple of %d", cfg->page_bytes,
                       DJ_VMU_PAGE_ALIGN);
    size_t total = cfg->total_bytes;
    L->text_cap = align_down(frac_of(total, cfg->text_frac));
    L->n_pages = frac_of(total, cfg->data_frac) / cfg->page_bytes;
    L->data_cap = dj_vmu_aligned(L->n_pages * cfg->page_bytes); /* the stack starts aligned after it */
    L->stack_cap = align_down(frac_of(total, cfg->stack_frac));
    /* the 1e-9 slack or the alignment loss may push the three past usable: the stack gives way */
    size_t sum_caps = L->text_cap + L->data_cap; /* <= total (1 + 1e-9): no overflow */
    if (sum_caps > usable)
        return dj_fail(DJ_EINVAL, "VMU: text and data segments (%zu bytes) do not fit in %zu aligned bytes", sum_caps,
                       usable);
    if (L->stack_cap > usable - sum_caps) L->stack_cap = align_down(usable - sum_caps);
    if (L->text_cap < DJ_VMU_ALIGN)
        return dj_fail(DJ_EINVAL, "VMU: text segment would be %zu bytes (%g of %zu); needs at least %d", L->text_cap,
                       cfg->text_frac, total, DJ_VMU_ALIGN);
    if (L->n_pages == 0)
        return dj_fail(DJ_EINVAL, "VMU: data segment would be %zu bytes (%g of %zu); needs at least one %zu-byte page",
                       frac_of(total, cfg->data_frac), cfg->data_frac, total, cfg->page_bytes);
    if (L->n_pages >= DJ__NO_PAGE)
        return dj_fail(DJ_EINVAL, "VMU: data segment would have %zu pages; at most %u (use larger pages)", L->n_pages,
                       DJ__NO_PAGE - 1);
    if (L->stack_cap < DJ_VMU_ALIGN)
        return dj_fail(DJ_EINVAL, "VMU: stack segment would be %zu bytes (%g of %zu); needs at least %d",
                       L->stack_cap, cfg->stack_frac, total, DJ_VMU_ALIGN);
    return DJ_OK;
}

/* ---- lifetime ---- */

static void model_evict(dj_vmu_t *vmu, dj_vmu_model_t *m);

dj_status dj_vmu_new(dj_backend_t *be, const dj_vmu_config *cfg, dj_vmu_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "VMU: no output pointer");
    *out = NULL;
    if (!be || !be->vt || !be->vt->alloc || !be->vt->free || !cfg)
        return dj_fail(DJ_EINVAL, "VMU: need a backend and a configuration");
    vmu_layout L;
    dj_status st = vmu_layout_compute(cfg, cfg->total_bytes, &L);
    if (st != DJ_OK) return st;

    dj_vmu_t *vmu = calloc(1, sizeof *vmu);
    if (!vmu) return dj_fail(DJ_ENOMEM, "VMU: out of host memory");
    vmu->be = be;
    void *ptr = NULL;
    st = be->vt->alloc(be, cfg->total_bytes, &ptr);
    if (st != DJ_OK || !ptr) {
        char why[256];
        snprintf(why, sizeof why, "%s", st != DJ_OK ? dj_last_error() : "it returned no memory");
        st = dj_fail(st != DJ_OK ? st : DJ_EDEVICE, "VMU: backend %s could not allocate %zu bytes (%.1f MiB): %s",
                     be->vt->name ? be->vt->name : "?", cfg->total_bytes, (double)cfg->total_bytes / MIB, why);
        goto fail;
    }
    vmu->alloc = ptr;
    vmu->total = cfg->total_bytes;
    size_t skew = (DJ_VMU_ALIGN - (size_t)((uintptr_t)ptr % DJ_VMU_ALIGN)) % DJ_VMU_ALIGN;
    if (skew > 0) { /* the backend aligned less than we want: lose up to 255 bytes */
        if (skew >= cfg->total_bytes) {
            st = dj_fail(DJ_EINVAL, "VMU: %zu bytes leave nothing after %d-byte alignment", cfg->total_bytes,
                         DJ_VMU_ALIGN);
            goto fail;
        }
        if ((st = vmu_layout_compute(cfg, cfg->total_bytes - skew, &L)) != DJ_OK) goto fail;
    }
    vmu->base = (uint8_t *)ptr + skew;

    vmu->text_base = vmu->base;
    vmu->text_cap = L.text_cap;

    vmu->data_base = vmu->base + L.text_cap;
    vmu->page_bytes = cfg->page_bytes;
    vmu->n_pages = (uint32_t)L.n_pages;
    vmu->free_pages = malloc(L.n_pages * sizeof *vmu->free_pages);
    vmu->owner = calloc(L.n_pages, sizeof *vmu->owner);
    vmu->page_next = malloc(L.n_pages * sizeof *vmu->page_next);
    vmu->page_prev = malloc(L.n_pages * sizeof *vmu->page_prev);
    if (!vmu->free_pages || !vmu->owner || !vmu->page_next || !vmu->page_prev) {
        st = dj_fail(DJ_ENOMEM, "VMU: out of host memory for the tables of %zu pages", L.n_pages);
        goto fail;
    }
    for (uint32_t i = 0; i < vmu->n_pages; i++) { /* page 0 on top: handed out first */
        vmu->free_pages[i] = vmu->n_pages - 1 - i;
        vmu->page_next[i] = vmu->page_prev[i] = DJ__NO_PAGE;
    }
    vmu->n_free = vmu->n_pages;

    vmu->stack_base = vmu->data_base + L.data_cap;
    vmu->stack_cap = L.stack_cap;
    *out = vmu;
    return DJ_OK;
fail:
    dj_vmu_free(vmu);
    return st;
}

void dj_vmu_free(dj_vmu_t *vmu) {
    if (!vmu) return;
    while (vmu->models) model_evict(vmu, vmu->models);
    while (vmu->sessions) dj_vmu_session_free(vmu, vmu->sessions);
    free(vmu->free_pages);
    free(vmu->owner);
    free(vmu->page_next);
    free(vmu->page_prev);
    if (vmu->alloc) vmu->be->vt->free(vmu->be, vmu->alloc);
    free(vmu);
}

/* ---- text segment ---- */

/* Lowest offset of a gap of `need` bytes between regions; with pinned_only,
 * as if every refcount-0 region were gone. */
static bool text_find_gap(const dj_vmu_t *vmu, size_t need, bool pinned_only, size_t *off) {
    size_t end = 0;
    for (const dj_vmu_model_t *m = vmu->models; m; m = m->next) {
        if (pinned_only && m->refcount == 0) continue;
        if (m->offset - end >= need) {
            *off = end;
            return true;
        }
        end = m->offset + m->bytes;
    }
    if (vmu->text_cap - end >= need) {
        *off = end;
        return true;
    }
    return false;
}

size_t dj_vmu_text_room(const dj_vmu_t *vmu) {
    size_t end = 0, best = 0;
    for (const dj_vmu_model_t *m = vmu->models; m; m = m->next) {
        if (m->refcount == 0) continue;
        if (m->offset - end > best) best = m->offset - end;
        end = m->offset + m->bytes;
    }
    if (vmu->text_cap - end > best) best = vmu->text_cap - end;
    return best;
}

static size_t text_pinned(const dj_vmu_t *vmu) {
    size_t p = 0;
    for (const dj_vmu_model_t *m = vmu->models; m; m = m->next)
        if (m->refcount > 0) p += m->bytes;
    return p;
}

static void model_evict(dj_vmu_t *vmu, dj_vmu_model_t *m) {
    if (m->prev) m->prev->next = m->next;
    else vmu->models = m->next;
    if (m->next) m->next->prev = m->prev;
    vmu->n_models--;
    vmu->text_used -= m->bytes;
    DJ_LOG(DEBUG, "evicting model %s (%zu bytes, fingerprint %016" PRIx64 ")", m->name, m->bytes, m->fingerprint);
    if (m->dtor) m->dtor(m->user);
    free(m->name);
    free(m);
}

static dj_vmu_model_t *text_lru_unpinned(const dj_vmu_t *vmu) {
    dj_vmu_model_t *best = NULL;
    for (dj_vmu_model_t *m = vmu->models; m; m = m->next)
        if (m->refcount == 0 && (!best || m->stamp < best->stamp)) best = m;
    return best;
}

static dj_vmu_model_t *text_find(const dj_vmu_t *vmu, uint64_t fingerprint) {
    for (dj_vmu_model_t *m = vmu->models; m; m = m->next)
        if (m->fingerprint == fingerprint) return m;
    return NULL;
}

dj_status dj_vmu_model_lookup(dj_vmu_t *vmu, uint64_t fingerprint, dj_vmu_model_t **out) {
    if (!vmu || !out) return dj_fail(DJ_EINVAL, "model lookup: no VMU or output pointer");
    *out = text_find(vmu, fingerprint);
    if (!*out) return DJ_ENOTFOUND;
    (*out)->refcount++;
    (*out)->stamp = ++vmu->clock;
    return DJ_OK;
}

dj_status dj_vmu_model_create(dj_vmu_t *vmu, uint64_t fingerprint, const char *name, size_t bytes,
                              dj_vmu_model_t **out) {
    if (!vmu || !out) return dj_fail(DJ_EINVAL, "model create: no VMU or output pointer");
    *out = NULL;
    const char *shown = name && name[0] ? name : "(unnamed)";
    if (bytes == 0) return dj_fail(DJ_EINVAL, "model %s: needs 0 bytes; a model has at least one tensor", shown);
    if (text_find(vmu, fingerprint))
        return dj_fail(DJ_EBUSY, "model %s: fingerprint %016" PRIx64 " is already in the text segment (look it up)",
                       shown, fingerprint);
    size_t need = dj_vmu_aligned(bytes);
    size_t off = 0;
    if (need > vmu->text_cap || !text_find_gap(vmu, need, true, &off)) {
        size_t pinned = text_pinned(vmu);
        return dj_fail(DJ_ENOSPC,
                       "model %s needs %zu bytes (%.1f MiB); text segment has %zu capacity (%.1f MiB), %zu free "
                       "(%.1f MiB), %zu pinned by models in use (%.1f MiB)",
                       shown, need, (double)need / MIB, vmu->text_cap, (double)vmu->text_cap / MIB,
                       vmu->text_cap - vmu->text_used, (double)(vmu->text_cap - vmu->text_used) / MIB, pinned,
                       (double)pinned / MIB);
    }
    dj_vmu_model_t *m = calloc(1, sizeof *m);
    char *nm = copy_name(name, "(unnamed)");
    if (!m || !nm) {
        free(m);
        free(nm);
        return dj_fail(DJ_ENOMEM, "model %s: out of host memory", shown);
    }
    /* Evicting every unpinned region makes room (checked above), so this ends. */
    while (!text_find_gap(vmu, need, false, &off)) {
        dj_vmu_model_t *victim = text_lru_unpinned(vmu);
        assert(victim);
        vmu->evictions++;
        model_evict(vmu, victim);
    }
    m->vmu = vmu;
    m->fingerprint = fingerprint;
    m->name = nm;
    m->offset = off;
    m->base = vmu->text_base + off;
    m->bytes = need;
    m->refcount = 1;
    m->stamp = ++vmu->clock;
    dj_vmu_model_t *prev = NULL;
    for (dj_vmu_model_t *it = vmu->models; it && it->offset < off; it = it->next) prev = it;
    m->prev = prev;
    m->next = prev ? prev->next : vmu->models;
    if (m->next) m->next->prev = m;
    if (prev) prev->next = m;
    else vmu->models = m;
    vmu->n_models++;
    vmu->text_used += need;
    if (vmu->text_used > vmu->text_peak) vmu->text_peak = vmu->text_used;
    *out = m;
    return DJ_OK;
}

dj_status dj_vmu_model_alloc(dj_vmu_model_t *m, size_t bytes, void **out) {
    if (!m || !out) return dj_fail(DJ_EINVAL, "model alloc: no model or output pointer");
    *out = NULL;
    size_t need = dj_vmu_aligned(bytes);
    if (need > m->bytes - m->used)
        return dj_fail(DJ_ENOSPC, "model %s: tensor needs %zu bytes; its %zu-byte region has %zu left", m->name,
                       need, m->bytes, m->bytes - m->used);
    *out = m->base + m->used;
    m->used += need;
    return DJ_OK;
}

void dj_vmu_model_release(dj_vmu_t *vmu, dj_vmu_model_t *m) {
    if (!vmu || !m) return;
    dj_vmu_model_t *it = vmu->models;
    while (it && it != m) it = it->next;
    if (!it) {
        DJ_LOG(ERROR, "release of a model that this VMU does not hold; ignored");
        return;
    }
    if (m->refcount == 0) {
        DJ_LOG(ERROR, "model %s released more often than looked up; ignored", m->name);
        return;
    }
    m->refcount--;
    m->stamp = ++vmu->clock;
}

dj_status dj_vmu_model_evict(dj_vmu_t *vmu, dj_vmu_model_t *m) {
    if (!vmu || !m) return dj_fail(DJ_EINVAL, "model evict: no VMU or model");
    dj_vmu_model_t *it = vmu->models;
    while (it && it != m) it = it->next;
    if (!it) return dj_fail(DJ_EINVAL, "model evict: this VMU does not hold that model");
    if (m->refcount > 0)
        return dj_fail(DJ_EBUSY, "model %s is in use (%u references); it cannot be evicted", m->name, m->refcount);
    vmu->evictions++;
    model_evict(vmu, m);
    return DJ_OK;
}

void dj_vmu_model_set_user(dj_vmu_model_t *m, void *user, void (*dtor)(void *user)) {
    m->user = user;
    m->dtor = dtor;
}

void *dj_vmu_model_user(const dj_vmu_model_t *m) { return m->user; }
uint64_t dj_vmu_model_fingerprint(const dj_vmu_model_t *m) { return m->fingerprint; }
void dj_vmu_model_set_mapped(dj_vmu_model_t *m, size_t bytes) { m->mapped = bytes; }
size_t dj_vmu_model_mapped(const dj_vmu_model_t *m) { return m->mapped; }

dj_status dj_vmu_model_set_fingerprint(dj_vmu_t *vmu, dj_vmu_model_t *m, uint64_t fingerprint) {
    const dj_vmu_model_t *other = text_find(vmu, fingerprint);
    if (other && other != m)
        return dj_fail(DJ_EBUSY, "fingerprint %016" PRIx64 " is already in the text segment", fingerprint);
    m->fingerprint = fingerprint;
    return DJ_OK;
}
uint32_t dj_vmu_model_refcount(const dj_vmu_model_t *m) { return m->refcount; }
size_t dj_vmu_model_bytes(const dj_vmu_model_t *m) { return m->bytes; }
size_t dj_vmu_model_used(const dj_vmu_model_t *m) { return m->used; }
uint8_t *dj_vmu_model_base(const dj_vmu_model_t *m) { return m->base; }

/* ---- data segment ---- */

dj_status dj_vmu_session_new(dj_vmu_t *vmu, const char *name, size_t quota_pages, dj_vmu_session_t **out) {
    if (!vmu || !out) return dj_fail(DJ_EINVAL, "session new: no VMU or output pointer");
    *out = NULL;
    dj_vmu_session_t *s = calloc(1, sizeof *s);
    if (!s || !(s->name = copy_name(name, "(unnamed)"))) {
        free(s);
        return dj_fail(DJ_ENOMEM, "session: out of host memory");
    }
    s->quota_pages = quota_pages;
    s->head = DJ__NO_PAGE;
    s->next = vmu->sessions;
    if (s->next) s->next->prev = s;
    vmu->sessions = s;
    vmu->n_sessions++;
    *out = s;
    return DJ_OK;
}

static void page_unlink(dj_vmu_t *vmu, dj_vmu_session_t *s, uint32_t p) {
    uint32_t nx = vmu->page_next[p], pv = vmu->page_prev[p];
    if (pv != DJ__NO_PAGE) vmu->page_next[pv] = nx;
    else s->head = nx;
    if (nx != DJ__NO_PAGE) vmu->page_prev[nx] = pv;
    vmu->page_next[p] = vmu->page_prev[p] = DJ__NO_PAGE;
    vmu->owner[p] = NULL;
    s->n_pages--;
    vmu->free_pages[vmu->n_free++] = p;
}

void dj_vmu_session_free(dj_vmu_t *vmu, dj_vmu_session_t *s) {
    if (!vmu || !s) return;
    const dj_vmu_session_t *it = vmu->sessions;
    while (it && it != s) it = it->next;
    if (!it) {
        DJ_LOG(ERROR, "free of a session that this VMU does not hold; ignored");
        return;
    }
    while (s->head != DJ__NO_PAGE) page_unlink(vmu, s, s->head);
    if (s->prev) s->prev->next = s->next;
    else vmu->sessions = s->next;
    if (s->next) s->next->prev = s->prev;
    vmu->n_sessions--;
    free(s->name);
    free(s);
}

dj_status dj_vmu_page_alloc(dj_vmu_t *vmu, dj_vmu_session_t *s, uint32_t *page) {
    if (!vmu || !s || !page) return dj_fail(DJ_EINVAL, "page alloc: no VMU, session or output pointer");
    *page = DJ__NO_PAGE;
    if (s->quota_pages && s->n_pages >= s->quota_pages)
        return dj_fail(DJ_EQUOTA, "session %s holds %zu pages (%zu bytes), its quota", s->name, s->n_pages,
                       s->n_pages * vmu->page_bytes);
    if (vmu->n_free == 0)
        return dj_fail(DJ_ENOSPC, "data segment full: session %s needs a page; all %u pages of %zu bytes are held by "
                       "%zu sessions", s->name, vmu->n_pages, vmu->page_bytes, vmu->n_sessions);
    uint32_t p = vmu->free_pages[--vmu->n_free];
    assert(vmu->owner[p] == NULL);
    vmu->owner[p] = s;
    vmu->page_prev[p] = DJ__NO_PAGE;
    vmu->page_next[p] = s->head;
    if (s->head != DJ__NO_PAGE) vmu->page_prev[s->head] = p;
    s->head = p;
    s->n_pages++;
    if (vmu->n_pages - vmu->n_free > vmu->peak_pages) vmu->peak_pages = vmu->n_pages - vmu->n_free;
    *page = p;
    return DJ_OK;
}

dj_status dj_vmu_page_free(dj_vmu_t *vmu, dj_vmu_session_t *s, uint32_t page) {
    if (!vmu || !s) return dj_fail(DJ_EINVAL, "page free: no VMU or session");
    if (page >= vmu->n_pages)
        return dj_fail(DJ_EINVAL, "session %s frees page %u; the data segment has pages 0..%u", s->name, page,
                       vmu->n_pages - 1);
    if (vmu->owner[page] != s)
        return dj_fail(DJ_EINVAL, "session %s frees page %u, which it does not hold (%s%s)", s->name, page,
                       vmu->owner[page] ? "held by session " : "it is free",
                       vmu->owner[page] ? vmu->owner[page]->name : "");
    page_unlink(vmu, s, page);
    return DJ_OK;
}

dj_status dj_vmu_page_give(dj_vmu_t *vmu, dj_vmu_session_t *from, dj_vmu_session_t *to, uint32_t page) {
    if (!vmu || !from || !to) return dj_fail(DJ_EINVAL, "page give: no VMU or session");
    if (page >= vmu->n_pages || vmu->owner[page] != from)
        return dj_fail(DJ_EINVAL, "session %s gives page %u, which it does not hold", from->name, page);
    page_unlink(vmu, from, page);
    /* page_unlink put it on the free list last: take it back for `to` */
    assert(vmu->n_free > 0 && vmu->free_pages[vmu->n_free - 1] == page);
    vmu->n_free--;
    vmu->owner[page] = to;
    vmu->page_prev[page] = DJ__NO_PAGE;
    vmu->page_next[page] = to->head;
    if (to->head != DJ__NO_PAGE) vmu->page_prev[to->head] = page;
    to->head = page;
    to->n_pages++;
    return DJ_OK;
}

uint8_t *dj_vmu_data_base(const dj_vmu_t *vmu) { return vmu->data_base; }
size_t dj_vmu_page_bytes(const dj_vmu_t *vmu) { return vmu->page_bytes; }
size_t dj_vmu_session_pages(const dj_vmu_session_t *s) { return s->n_pages; }

/* ---- stack segment ---- */

dj_status dj_vmu_stack_push(dj_vmu_t *vmu, size_t bytes, void **out) {
    if (!vmu || !out) return dj_fail(DJ_EINVAL, "stack push: no VMU or output pointer");
    *out = NULL;
    size_t need = dj_vmu_aligned(bytes);
    if (need > vmu->stack_cap - vmu->stack_top)
        return dj_fail(DJ_ENOSPC, "stack segment overflow: need %zu bytes at offset %zu, capacity %zu", need,
                       vmu->stack_top, vmu->stack_cap);
    *out = vmu->stack_base + vmu->stack_top;
    vmu->stack_top += need;
    if (vmu->stack_top > vmu->stack_peak) vmu->stack_peak = vmu->stack_top;
    return DJ_OK;
}

size_t dj_vmu_stack_mark(const dj_vmu_t *vmu) { return vmu->stack_top; }

void dj_vmu_stack_reset(dj_vmu_t *vmu, size_t mark) {
    assert(mark <= vmu->stack_top && mark % DJ_VMU_ALIGN == 0); /* marks come from dj_vmu_stack_mark */
    if (mark <= vmu->stack_top) vmu->stack_top = mark;
}

size_t dj_vmu_stack_capacity(const dj_vmu_t *vmu) { return vmu->stack_cap; }
uint8_t *dj_vmu_stack_base(const dj_vmu_t *vmu) { return vmu->stack_base; }

/* ---- accounting ---- */

void dj_vmu_get_stats(const dj_vmu_t *vmu, dj_vmu_stats *st) {
    memset(st, 0, sizeof *st);
    st->text.capacity = vmu->text_cap;
    st->text.used = vmu->text_used;
    st->text.peak = vmu->text_peak;
    st->text_pinned = text_pinned(vmu);
    for (const dj_vmu_model_t *m = vmu->models; m; m = m->next) st->text_mapped += m->mapped;
    st->data.capacity = (size_t)vmu->n_pages * vmu->page_bytes;
    st->data.used = (size_t)(vmu->n_pages - vmu->n_free) * vmu->page_bytes;
    st->data.peak = (size_t)vmu->peak_pages * vmu->page_bytes;
    st->stack.capacity = vmu->stack_cap;
    st->stack.used = vmu->stack_top;
    st->stack.peak = vmu->stack_peak;
    st->n_models = vmu->n_models;
    st->n_sessions = vmu->n_sessions;
    st->pages_total = vmu->n_pages;
    st->pages_free = vmu->n_free;
    st->evictions = vmu->evictions;
}

static void print_seg(FILE *f, const char *name, const dj_vmu_seg_stats *s) {
    fprintf(f, "  %-5s capacity %10.2f MiB (%zu B)  used %10.2f MiB (%zu B)  free %10.2f MiB (%zu B)  "
               "peak %10.2f MiB (%zu B)\n",
            name, (double)s->capacity / MIB, s->capacity, (double)s->used / MIB, s->used,
            (double)(s->capacity - s->used) / MIB, s->capacity - s->used, (double)s->peak / MIB, s->peak);
}

void dj_vmu_page_holders(const dj_vmu_t *vmu, uint32_t cells, const dj_vmu_session_t **out) {
    if (!cells || !vmu->n_pages) return;
    if (cells > vmu->n_pages) cells = vmu->n_pages;
    for (uint32_t i = 0; i < cells; i++) out[i] = vmu->owner[(uint64_t)i * vmu->n_pages / cells];
}

void dj_vmu_print_stats(const dj_vmu_t *vmu, FILE *f) {
    dj_vmu_stats st;
    dj_vmu_get_stats(vmu, &st);
    fprintf(f, "VMU: %.2f MiB (%zu B) from backend %s\n", (double)vmu->total / MIB, vmu->total,
            vmu->be->vt->name ? vmu->be->vt->name : "?");
    print_seg(f, "text", &st.text);
    print_seg(f, "data", &st.data);
    print_seg(f, "stack", &st.stack);
    fprintf(f, "  data pages: %zu of %zu free, %zu bytes each; text: %zu B pinned, %zu B mapped in place, %zu evictions\n",
            st.pages_free, st.pages_total, vmu->page_bytes, st.text_pinned, st.text_mapped, st.evictions);
    fprintf(f, "models (%zu):\n", st.n_models);
    for (const dj_vmu_model_t *m = vmu->models; m; m = m->next)
        fprintf(f, "  %-24s fp %016" PRIx64 "  at %zu  %10.2f MiB (%zu B, %zu B filled, %zu B mapped)  refs %u  %s\n",
                m->name, m->fingerprint, m->offset, (double)m->bytes / MIB, m->bytes, m->used, m->mapped, m->refcount,
                m->refcount ? "in use" : "cached");
    fprintf(f, "sessions (%zu):\n", st.n_sessions);
    for (const dj_vmu_session_t *s = vmu->sessions; s; s = s->next) {
        fprintf(f, "  %-24s pages %zu", s->name, s->n_pages);
        if (s->quota_pages) fprintf(f, " of %zu", s->quota_pages);
        fprintf(f, "  %10.2f MiB (%zu B)\n", (double)(s->n_pages * vmu->page_bytes) / MIB,
                s->n_pages * vmu->page_bytes);
    }
}

/* ---- invariants ---- */

dj_status dj__vmu_check(const dj_vmu_t *vmu) {
    size_t used = 0, n = 0, end = 0;
    const dj_vmu_model_t *prev = NULL;
    for (const dj_vmu_model_t *m = vmu->models; m; prev = m, m = m->next, n++) {
        if (m->prev != prev) return dj_fail(DJ_EINTERNAL, "model %s: broken back link", m->name);
        if (m->offset < end || m->offset % DJ_VMU_ALIGN || m->bytes % DJ_VMU_ALIGN || m->bytes == 0 ||
            m->offset + m->bytes > vmu->text_cap || m->used > m->bytes || m->base != vmu->text_base + m->offset)
            return dj_fail(DJ_EINTERNAL, "model %s: region [%zu, +%zu) misplaced", m->name, m->offset, m->bytes);
        end = m->offset + m->bytes;
        used += m->bytes;
    }
    if (n != vmu->n_models || used != vmu->text_used)
        return dj_fail(DJ_EINTERNAL, "text: %zu models / %zu bytes counted, %zu / %zu recorded", n, used,
                       vmu->n_models, vmu->text_used);

    size_t held = 0, ns = 0;
    const dj_vmu_session_t *sprev = NULL;
    for (const dj_vmu_session_t *s = vmu->sessions; s; sprev = s, s = s->next, ns++) {
        if (s->prev != sprev) return dj_fail(DJ_EINTERNAL, "session %s: broken back link", s->name);
        size_t k = 0;
        uint32_t pp = DJ__NO_PAGE;
        for (uint32_t p = s->head; p != DJ__NO_PAGE; pp = p, p = vmu->page_next[p], k++) {
            if (p >= vmu->n_pages || vmu->owner[p] != s || vmu->page_prev[p] != pp || k > vmu->n_pages)
                return dj_fail(DJ_EINTERNAL, "session %s: page list broken at page %u", s->name, p);
        }
        if (k != s->n_pages)
            return dj_fail(DJ_EINTERNAL, "session %s: %zu pages listed, %zu counted", s->name, k, s->n_pages);
        if (s->quota_pages && k > s->quota_pages)
            return dj_fail(DJ_EINTERNAL, "session %s: %zu pages over quota %zu", s->name, k, s->quota_pages);
        held += k;
    }
    if (ns != vmu->n_sessions) return dj_fail(DJ_EINTERNAL, "%zu sessions listed, %zu counted", ns, vmu->n_sessions);
    size_t owned = 0;
    for (uint32_t p = 0; p < vmu->n_pages; p++) owned += vmu->owner[p] != NULL;
    if (owned != held || held + vmu->n_free != vmu->n_pages)
        return dj_fail(DJ_EINTERNAL, "pages: %zu owned, %zu in session lists, %u free of %u", owned, held,
                       vmu->n_free, vmu->n_pages);
    for (uint32_t i = 0; i < vmu->n_free; i++) {
        uint32_t p = vmu->free_pages[i];
        if (p >= vmu->n_pages || vmu->owner[p] != NULL)
            return dj_fail(DJ_EINTERNAL, "free list entry %u is page %u, which is held or out of range", i, p);
    }
    uint8_t *seen = calloc(vmu->n_pages, 1);
    if (!seen) return dj_fail(DJ_ENOMEM, "check: out of host memory");
    for (uint32_t i = 0; i < vmu->n_free; i++) {
        if (seen[vmu->free_pages[i]]++) {
            free(seen);
            return dj_fail(DJ_EINTERNAL, "page %u is on the free list twice", vmu->free_pages[i]);
        }
    }
    free(seen);
    if (vmu->stack_top > vmu->stack_cap || vmu->stack_top > vmu->stack_peak)
        return dj_fail(DJ_EINTERNAL, "stack top %zu past capacity %zu or peak %zu", vmu->stack_top, vmu->stack_cap,
                       vmu->stack_peak);
    return DJ_OK;
}
