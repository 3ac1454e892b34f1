/* weights.c: the content-addressed weight store of captured modules (weights.h) - weights keyed by
 * the XXH3-128 the store computes itself, proofs per connection, challenges, quota and eviction. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <xxhash.h>

#include "djinn/alloc.h"
#include "djinn/weights.h"

#define N_BUCKETS 1024

struct dj_weight {
    dj_whash h;
    uint8_t *data;     /* [nbytes], 64-byte aligned, immutable */
    uint64_t nbytes;
    uint64_t tenant;   /* the uploader: charged for nbytes while it is stored */
    uint32_t runs;     /* references held by runs */
    uint64_t *provers; /* [n_provers] connections that proved it: one reference each */
    uint32_t n_provers, cap_provers;
    uint64_t last_use; /* the store's tick when last proven or acquired (eviction: oldest first) */
    dj_weight *next;   /* bucket chain */
};

typedef struct upload {
    uint64_t conn, tenant;
    dj_whash h;
    uint64_t total, got;
    uint8_t *buf; /* [total] */
    struct upload *next;
} upload;

typedef struct chal {
    uint64_t conn;
    dj_whash h;
    dj_wchallenge c;
    struct chal *next;
} chal;

typedef struct tenant_use {
    uint64_t tenant, bytes;
    struct tenant_use *next;
} tenant_use;

struct dj_wstore {
    pthread_mutex_t mu;
    dj_wstore_config cfg;
    dj_weight *b[N_BUCKETS];
    upload *uploads;
    chal *chals;
    tenant_use *tenants;
    uint64_t tick;
    dj_wstore_stats st; /* weights, bytes, inflight_bytes and the counters */
};

void dj_whash_of(const void *bytes, size_t n, dj_whash *h) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(n ? bytes : "", n));
    memcpy(h->b, c.digest, DJ_WHASH_BYTES);
}

void dj_whash_hex(const dj_whash *h, char out[33]) {
    for (int i = 0; i < DJ_WHASH_BYTES; i++) snprintf(out + 2 * i, 3, "%02x", h->b[i]);
}

const char *dj_whas_name(dj_whas w) {
    switch (w) {
    case DJ_WHAS_ABSENT: return "absent";
    case DJ_WHAS_HELD: return "held";
    case DJ_WHAS_USABLE: return "usable";
    }
    return "?";
}

static size_t bucket_of(const dj_whash *h) {
    uint64_t k;
    memcpy(&k, h->b, sizeof k); /* the hash is uniform already */
    return (size_t)(k % N_BUCKETS);
}

static bool hash_eq(const dj_whash *a, const dj_whash *b) { return !memcmp(a->b, b->b, DJ_WHASH_BYTES); }

dj_status dj_wstore_new(const dj_wstore_config *cfg, dj_wstore_t **out) {
    *out = NULL;
    dj_wstore_t *ws = dj_calloc(1, sizeof *ws);
    if (!ws) return dj_fail(DJ_ENOMEM, "out of memory for the weight store");
    if (cfg) ws->cfg = *cfg;
    if (!ws->cfg.capacity_bytes) ws->cfg.capacity_bytes = 8ull << 30;
    if (!ws->cfg.quota_bytes || ws->cfg.quota_bytes > ws->cfg.capacity_bytes) ws->cfg.quota_bytes = ws->cfg.capacity_bytes;
    if (!ws->cfg.max_tensor_bytes || ws->cfg.max_tensor_bytes > ws->cfg.quota_bytes)
        ws->cfg.max_tensor_bytes = ws->cfg.quota_bytes;
    if (!ws->cfg.uploads_per_conn) ws->cfg.uploads_per_conn = 8;
    if (pthread_mutex_init(&ws->mu, NULL)) {
        free(ws);
        return dj_fail(DJ_EINTERNAL, "cannot create the weight store's lock");
    }
    *out = ws;
    return DJ_OK;
}

static void weight_free(dj_weight *w) {
    free(w->data);
    free(w->provers);
    free(w);
}

static void upload_free(upload *u) {
    free(u->buf);
    free(u);
}

void dj_wstore_free(dj_wstore_t *ws) {
    if (!ws) return;
    for (size_t i = 0; i < N_BUCKETS; i++)
        for (dj_weight *w = ws->b[i], *n; w; w = n) {
            n = w->next;
            weight_free(w);
        }
    for (upload *u = ws->uploads, *n; u; u = n) {
        n = u->next;
        upload_free(u);
    }
    for (chal *c = ws->chals, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    for (tenant_use *t = ws->tenants, *n; t; t = n) {
        n = t->next;
        free(t);
    }
    pthread_mutex_destroy(&ws->mu);
    free(ws);
}

/* ---- internals (mu held) ---- */

static dj_weight *find(dj_wstore_t *ws, const dj_whash *h) {
    for (dj_weight *w = ws->b[bucket_of(h)]; w; w = w->next)
        if (hash_eq(&w->h, h)) return w;
    return NULL;
}

static bool proven_by(const dj_weight *w, uint64_t conn) {
    for (uint32_t i = 0; i < w->n_provers; i++)
        if (w->provers[i] == conn) return true;
    return false;
}

static uint32_t refs_of(const dj_weight *w) { return w->runs + w->n_provers; }

/* A tenant's usage record; create: made when absent (NULL without memory). */
static tenant_use *tenant_get(dj_wstore_t *ws, uint64_t tenant, bool create) {
    for (tenant_use *t = ws->tenants; t; t = t->next)
        if (t->tenant == tenant) return t;
    if (!create) return NULL;
    tenant_use *t = dj_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->tenant = tenant;
    t->next = ws->tenants;
    ws->tenants = t;
    return t;
}

static void tenant_charge(dj_wstore_t *ws, uint64_t tenant, int64_t delta) {
    tenant_use *t = tenant_get(ws, tenant, false);
    if (!t) return; /* charged only after tenant_get(create) succeeded */
    t->bytes = delta < 0 && (uint64_t)-delta > t->bytes ? 0 : t->bytes + (uint64_t)delta;
}

static void unlink_weight(dj_wstore_t *ws, dj_weight *w) {
    for (dj_weight **p = &ws->b[bucket_of(&w->h)]; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            break;
        }
    ws->st.weights--;
    ws->st.bytes -= w->nbytes;
    tenant_charge(ws, w->tenant, -(int64_t)w->nbytes);
}

/* Evicts the oldest unreferenced weight (of tenant only, when only_tenant); false when none. */
static bool evict_one(dj_wstore_t *ws, bool only_tenant, uint64_t tenant) {
    dj_weight *old = NULL;
    for (size_t i = 0; i < N_BUCKETS; i++)
        for (dj_weight *w = ws->b[i]; w; w = w->next)
            if (!refs_of(w) && (!only_tenant || w->tenant == tenant) && (!old || w->last_use < old->last_use)) old = w;
    if (!old) return false;
    unlink_weight(ws, old);
    weight_free(old);
    ws->st.evictions++;
    return true;
}

/* Room for n more bytes charged to tenant: its quota first (its own unreferenced weights go),
 * then the store's capacity (anyone's unreferenced weights go, oldest first). */
static dj_status reserve(dj_wstore_t *ws, uint64_t tenant, uint64_t n) {
    tenant_use *t = tenant_get(ws, tenant, true);
    if (!t) return dj_fail(DJ_ENOMEM, "out of memory for the weight store's quota record");
    while (t->bytes + n > ws->cfg.quota_bytes)
        if (!evict_one(ws, true, tenant))
            return dj_fail(DJ_EQUOTA,
                           "upload of %llu bytes: this token holds %llu of its %llu-byte weight upload quota in "
                           "weights still in use and uploads in flight",
                           (unsigned long long)n, (unsigned long long)t->bytes, (unsigned long long)ws->cfg.quota_bytes);
    while (ws->st.bytes + ws->st.inflight_bytes + n > ws->cfg.capacity_bytes)
        if (!evict_one(ws, false, 0))
            return dj_fail(DJ_ENOSPC,
                           "upload of %llu bytes: the weight store holds %llu of its %llu bytes in weights in use "
                           "and uploads in flight",
                           (unsigned long long)n, (unsigned long long)(ws->st.bytes + ws->st.inflight_bytes),
                           (unsigned long long)ws->cfg.capacity_bytes);
    t->bytes += n;
    ws->st.inflight_bytes += n;
    return DJ_OK;
}

/* conn proves w: one reference (once per connection). */
static dj_status add_prover(dj_wstore_t *ws, dj_weight *w, uint64_t conn) {
    w->last_use = ++ws->tick;
    if (proven_by(w, conn)) return DJ_OK;
    if (w->n_provers == w->cap_provers) {
        const uint32_t cap = w->cap_provers ? w->cap_provers * 2 : 4;
        uint64_t *p = dj_realloc(w->provers, cap * sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "out of memory for a weight's proof");
        w->provers = p;
        w->cap_provers = cap;
    }
    w->provers[w->n_provers++] = conn;
    return DJ_OK;
}

static upload **upload_find(dj_wstore_t *ws, uint64_t conn, const dj_whash *h) {
    for (upload **p = &ws->uploads; *p; p = &(*p)->next)
        if ((*p)->conn == conn && hash_eq(&(*p)->h, h)) return p;
    return NULL;
}

/* Ends the upload *p (its reservation given back). */
static void upload_end(dj_wstore_t *ws, upload **p) {
    upload *u = *p;
    *p = u->next;
    ws->st.inflight_bytes -= u->total;
    tenant_charge(ws, u->tenant, -(int64_t)u->total);
    upload_free(u);
}

static chal **chal_find(dj_wstore_t *ws, uint64_t conn, const dj_whash *h) {
    for (chal **p = &ws->chals; *p; p = &(*p)->next)
        if ((*p)->conn == conn && hash_eq(&(*p)->h, h)) return p;
    return NULL;
}

/* ---- the API ---- */

dj_whas dj_wstore_has(dj_wstore_t *ws, uint64_t conn, const dj_whash *h, uint64_t *nbytes) {
    pthread_mutex_lock(&ws->mu);
    const dj_weight *w = find(ws, h);
    const dj_whas r = !w ? DJ_WHAS_ABSENT : proven_by(w, conn) ? DJ_WHAS_USABLE : DJ_WHAS_HELD;
    if (nbytes) *nbytes = w ? w->nbytes : 0;
    pthread_mutex_unlock(&ws->mu);
    return r;
}

static dj_status upload_locked(dj_wstore_t *ws, uint64_t conn, uint64_t tenant, const dj_whash *h, uint64_t total,
                               uint64_t offset, const void *bytes, size_t len, bool *done) {
    char hex[33];
    dj_whash_hex(h, hex);
    upload **p = upload_find(ws, conn, h);
    if (!p) {
        if (offset != 0)
            return dj_fail(DJ_EINVAL, "upload of weight %s: chunk at offset %llu, but no upload of it is under way "
                           "(the first chunk has offset 0)", hex, (unsigned long long)offset);
        if (total > ws->cfg.max_tensor_bytes)
            return dj_fail(DJ_ERANGE, "upload of weight %s: %llu bytes, more than the %llu a weight may have", hex,
                           (unsigned long long)total, (unsigned long long)ws->cfg.max_tensor_bytes);
        uint32_t mine = 0;
        for (const upload *u = ws->uploads; u; u = u->next) mine += u->conn == conn;
        if (mine >= ws->cfg.uploads_per_conn)
            return dj_fail(DJ_ERANGE, "upload of weight %s: this connection has %u uploads under way already", hex,
                           mine);
        dj_status st = reserve(ws, tenant, total);
        if (st != DJ_OK) return st;
        upload *u = dj_calloc(1, sizeof *u);
        const size_t cap = (size_t)((total + 63) & ~(uint64_t)63);
        uint8_t *buf = u ? aligned_alloc(64, cap ? cap : 64) : NULL;
        if (!buf) {
            free(u);
            ws->st.inflight_bytes -= total;
            tenant_charge(ws, tenant, -(int64_t)total);
            return dj_fail(DJ_ENOMEM, "out of memory for an upload of %llu bytes", (unsigned long long)total);
        }
        u->conn = conn;
        u->tenant = tenant;
        u->h = *h;
        u->total = total;
        u->buf = buf;
        u->next = ws->uploads;
        ws->uploads = u;
        p = &ws->uploads;
    }
    upload *u = *p;
    if (total != u->total) {
        const uint64_t began = u->total;
        upload_end(ws, p);
        return dj_fail(DJ_EINVAL, "upload of weight %s: a chunk says %llu bytes in all, the upload began with %llu",
                       hex, (unsigned long long)total, (unsigned long long)began);
    }
    if (offset != u->got || len > u->total - u->got) {
        const uint64_t want = u->got, left = u->total - u->got;
        upload_end(ws, p);
        return dj_fail(DJ_EINVAL, "upload of weight %s: chunk of %zu bytes at offset %llu, expected offset %llu with "
                       "%llu bytes left (the upload is dropped)",
                       hex, len, (unsigned long long)offset, (unsigned long long)want, (unsigned long long)left);
    }
    if (len) memcpy(u->buf + u->got, bytes, len);
    u->got += len;
    ws->st.received_bytes += len;
    if (u->got < u->total) return DJ_OK;
    /* complete: the bytes must be the ones named */
    dj_whash got;
    dj_whash_of(u->buf, u->total, &got);
    if (!hash_eq(&got, h)) {
        char ghex[33];
        dj_whash_hex(&got, ghex);
        ws->st.hash_mismatches++;
        upload_end(ws, p);
        return dj_fail(DJ_EINVAL, "upload of weight %s: the %llu bytes received hash to %s (XXH3-128): refused", hex,
                       (unsigned long long)total, ghex);
    }
    ws->st.uploads++;
    dj_weight *w = find(ws, h);
    if (w) { /* stored meanwhile (or uploaded to prove it): keep that copy */
        ws->st.upload_dups++;
        upload_end(ws, p);
    } else {
        w = dj_calloc(1, sizeof *w);
        if (!w) {
            upload_end(ws, p);
            return dj_fail(DJ_ENOMEM, "out of memory for a weight");
        }
        w->h = *h;
        w->data = u->buf;
        w->nbytes = u->total;
        w->tenant = u->tenant;
        u->buf = NULL;
        *p = u->next;
        ws->st.inflight_bytes -= u->total; /* the tenant's charge moves from the upload to the weight */
        free(u);
        const size_t b = bucket_of(h);
        w->next = ws->b[b];
        ws->b[b] = w;
        ws->st.weights++;
        ws->st.bytes += w->nbytes;
    }
    dj_status st = add_prover(ws, w, conn);
    if (st == DJ_OK) *done = true;
    return st;
}

dj_status dj_wstore_upload(dj_wstore_t *ws, uint64_t conn, uint64_t tenant, const dj_whash *h, uint64_t total,
                           uint64_t offset, const void *bytes, size_t len, bool *done) {
    *done = false;
    pthread_mutex_lock(&ws->mu);
    const dj_status st = upload_locked(ws, conn, tenant, h, total, offset, bytes, len, done);
    pthread_mutex_unlock(&ws->mu);
    return st;
}

static dj_status random_bytes(void *p, size_t n) {
    uint8_t *b = p;
    while (n) {
        const ssize_t k = getrandom(b, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return dj_fail(DJ_EIO, "getrandom: %s", strerror(errno));
        }
        b += k;
        n -= (size_t)k;
    }
    return DJ_OK;
}

dj_status dj_wstore_challenge(dj_wstore_t *ws, uint64_t conn, const dj_whash *h, dj_wchallenge *c) {
    memset(c, 0, sizeof *c);
    uint64_t rnd[1 + 2 * DJ_WCHALLENGE_RANGES];
    dj_status st = random_bytes(rnd, sizeof rnd);
    if (st != DJ_OK) return st;
    pthread_mutex_lock(&ws->mu);
    const dj_weight *w = find(ws, h);
    if (!w) {
        pthread_mutex_unlock(&ws->mu);
        char hex[33];
        dj_whash_hex(h, hex);
        return dj_fail(DJ_ENOTFOUND, "no weight %s is stored: upload it", hex);
    }
    const uint64_t n = w->nbytes;
    c->seed = rnd[0];
    c->n = n < DJ_WCHALLENGE_RANGES ? (uint32_t)n : DJ_WCHALLENGE_RANGES;
    for (uint32_t i = 0; i < c->n; i++) {
        const uint64_t len = 1 + rnd[1 + 2 * i] % (n < DJ_WCHALLENGE_RANGE_MAX ? n : DJ_WCHALLENGE_RANGE_MAX);
        c->length[i] = len;
        c->offset[i] = rnd[2 + 2 * i] % (n - len + 1);
    }
    chal **p = chal_find(ws, conn, h);
    chal *ch = p ? *p : dj_calloc(1, sizeof *ch);
    if (!ch) {
        pthread_mutex_unlock(&ws->mu);
        return dj_fail(DJ_ENOMEM, "out of memory for a challenge");
    }
    if (!p) {
        ch->conn = conn;
        ch->h = *h;
        ch->next = ws->chals;
        ws->chals = ch;
    }
    ch->c = *c;
    pthread_mutex_unlock(&ws->mu);
    return DJ_OK;
}

void dj_wchallenge_answer(const dj_wchallenge *c, const void *data, dj_whash *out) {
    XXH3_state_t *s = XXH3_createState();
    XXH128_canonical_t cn;
    if (!s) { /* no memory: an answer that is never right */
        memset(out, 0, sizeof *out);
        return;
    }
    XXH3_128bits_reset_withSeed(s, c->seed);
    for (uint32_t i = 0; i < c->n; i++) XXH3_128bits_update(s, (const uint8_t *)data + c->offset[i], c->length[i]);
    XXH128_canonicalFromHash(&cn, XXH3_128bits_digest(s));
    XXH3_freeState(s);
    memcpy(out->b, cn.digest, DJ_WHASH_BYTES);
}

dj_status dj_wstore_answer(dj_wstore_t *ws, uint64_t conn, const dj_whash *h, const dj_whash *answer) {
    char hex[33];
    dj_whash_hex(h, hex);
    pthread_mutex_lock(&ws->mu);
    chal **p = chal_find(ws, conn, h);
    dj_weight *w = find(ws, h);
    if (!p || !w) {
        if (p) {
            chal *ch = *p;
            *p = ch->next;
            free(ch);
        }
        pthread_mutex_unlock(&ws->mu);
        return dj_fail(DJ_ENOTFOUND, "no challenge over weight %s is open on this connection%s", hex,
                       w ? "" : " (the weight is no longer stored: upload it)");
    }
    chal *ch = *p;
    *p = ch->next;
    dj_whash want;
    dj_wchallenge_answer(&ch->c, w->data, &want);
    free(ch);
    dj_status st;
    if (!hash_eq(&want, answer)) {
        ws->st.challenges_failed++;
        st = dj_fail(DJ_EINVAL, "wrong answer to the challenge over weight %s: this connection may not use it "
                     "(ask for a new challenge, or upload the bytes)", hex);
    } else {
        ws->st.challenges_passed++;
        st = add_prover(ws, w, conn);
    }
    pthread_mutex_unlock(&ws->mu);
    return st;
}

dj_status dj_wstore_acquire(dj_wstore_t *ws, uint64_t conn, const dj_whash *h, dj_weight **out, const void **data,
                            uint64_t *nbytes) {
    *out = NULL;
    pthread_mutex_lock(&ws->mu);
    dj_weight *w = find(ws, h);
    const bool ok = w && proven_by(w, conn);
    if (ok) {
        w->runs++;
        w->last_use = ++ws->tick;
        *out = w;
        *data = w->data;
        *nbytes = w->nbytes;
    }
    pthread_mutex_unlock(&ws->mu);
    if (ok) return DJ_OK;
    char hex[33];
    dj_whash_hex(h, hex);
    return dj_fail(DJ_ENOTFOUND, "weight %s is %s", hex,
                   w ? "stored but not proven by this connection (answer a WEIGHT_CHALLENGE or upload it)"
                     : "not stored (WEIGHT_UPLOAD it first)");
}

void dj_wstore_release(dj_wstore_t *ws, dj_weight *w) {
    if (!w) return;
    pthread_mutex_lock(&ws->mu);
    if (w->runs) w->runs--;
    pthread_mutex_unlock(&ws->mu);
}

void dj_wstore_conn_closed(dj_wstore_t *ws, uint64_t conn) {
    pthread_mutex_lock(&ws->mu);
    for (size_t i = 0; i < N_BUCKETS; i++)
        for (dj_weight *w = ws->b[i]; w; w = w->next)
            for (uint32_t k = 0; k < w->n_provers; k++)
                if (w->provers[k] == conn) {
                    w->provers[k] = w->provers[--w->n_provers];
                    break;
                }
    for (upload **p = &ws->uploads; *p;)
        if ((*p)->conn == conn) upload_end(ws, p);
        else p = &(*p)->next;
    for (chal **p = &ws->chals; *p;)
        if ((*p)->conn == conn) {
            chal *c = *p;
            *p = c->next;
            free(c);
        } else {
            p = &(*p)->next;
        }
    pthread_mutex_unlock(&ws->mu);
}

void dj_wstore_get_stats(dj_wstore_t *ws, dj_wstore_stats *st) {
    pthread_mutex_lock(&ws->mu);
    *st = ws->st;
    st->capacity = ws->cfg.capacity_bytes;
    st->quota = ws->cfg.quota_bytes;
    st->referenced = 0;
    for (size_t i = 0; i < N_BUCKETS; i++)
        for (const dj_weight *w = ws->b[i]; w; w = w->next) st->referenced += refs_of(w) > 0;
    pthread_mutex_unlock(&ws->mu);
}

uint64_t dj_wstore_tenant_bytes(dj_wstore_t *ws, uint64_t tenant) {
    pthread_mutex_lock(&ws->mu);
    const tenant_use *t = tenant_get(ws, tenant, false);
    const uint64_t n = t ? t->bytes : 0;
    pthread_mutex_unlock(&ws->mu);
    return n;
}
