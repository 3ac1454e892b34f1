/* gplan_cache.c: the server's cache of decoded, validated, planned captured graphs (gplan_cache.h):
 * keyed by the XXH3-128 of the graph bytes, checked byte for byte, bounded in bytes, evicted LRU. */
#include "capture/gplan_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "djinn/alloc.h"

#define N_BUCKETS 1024

struct dj_gplan {
    uint8_t id[DJ_GPLAN_ID_BYTES];
    uint8_t *bytes; /* [len]: what the graph was decoded from (a hit compares them) */
    size_t len;
    dj_cgraph_t *g;
    uint64_t cost;  /* len + the decoded graph + this entry */
    uint32_t refs;
    bool cached;    /* in the table (else freed by its last release) */
    uint64_t *conns; /* [n_conns]: connections that have sent the bytes */
    uint32_t n_conns, cap_conns;
    dj_gplan *bnext;       /* bucket chain */
    dj_gplan *prev, *next; /* LRU: head most recent */
};

struct dj_gplan_cache {
    pthread_mutex_t mu;
    dj_gplan *b[N_BUCKETS];
    dj_gplan *head, *tail;
    dj_gplan_cache_stats st;
};

dj_status dj_gplan_cache_new(uint64_t capacity_bytes, dj_gplan_cache **out) {
    *out = NULL;
    dj_gplan_cache *c = dj_calloc(1, sizeof *c);
    if (!c) return dj_fail(DJ_ENOMEM, "out of memory");
    pthread_mutex_init(&c->mu, NULL);
    c->st.capacity = capacity_bytes ? capacity_bytes : DJ_GPLAN_CACHE_DEFAULT_BYTES;
    *out = c;
    return DJ_OK;
}

static void plan_free(dj_gplan *p) {
    dj_cgraph_free(p->g);
    free(p->bytes);
    free(p->conns);
    free(p);
}

void dj_gplan_cache_free(dj_gplan_cache *c) {
    if (!c) return;
    for (dj_gplan *p = c->head, *n; p; p = n) {
        n = p->next;
        plan_free(p);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static size_t bucket_of(const uint8_t id[DJ_GPLAN_ID_BYTES]) {
    uint32_t v;
    memcpy(&v, id + DJ_GPLAN_ID_BYTES - 4, 4);
    return v % N_BUCKETS;
}

static dj_gplan *find(dj_gplan_cache *c, const uint8_t id[DJ_GPLAN_ID_BYTES]) {
    for (dj_gplan *p = c->b[bucket_of(id)]; p; p = p->bnext)
        if (!memcmp(p->id, id, DJ_GPLAN_ID_BYTES)) return p;
    return NULL;
}

static void lru_unlink(dj_gplan_cache *c, dj_gplan *p) {
    if (p->prev) p->prev->next = p->next;
    else c->head = p->next;
    if (p->next) p->next->prev = p->prev;
    else c->tail = p->prev;
    p->prev = p->next = NULL;
}

static void lru_front(dj_gplan_cache *c, dj_gplan *p) {
    p->next = c->head;
    if (c->head) c->head->prev = p;
    c->head = p;
    if (!c->tail) c->tail = p;
}

static void unlink_entry(dj_gplan_cache *c, dj_gplan *p) {
    for (dj_gplan **q = &c->b[bucket_of(p->id)]; *q; q = &(*q)->bnext)
        if (*q == p) {
            *q = p->bnext;
            break;
        }
    lru_unlink(c, p);
    p->cached = false;
    c->st.entries--;
    c->st.bytes -= p->cost;
}

/* Oldest unreferenced entries out until the bytes fit (mu held). */
static void evict(dj_gplan_cache *c) {
    for (dj_gplan *p = c->tail, *prev; p && c->st.bytes > c->st.capacity; p = prev) {
        prev = p->prev;
        if (p->refs) continue;
        unlink_entry(c, p);
        plan_free(p);
        c->st.evictions++;
    }
}

static bool proven(const dj_gplan *p, uint64_t conn) {
    for (uint32_t i = 0; i < p->n_conns; i++)
        if (p->conns[i] == conn) return true;
    return false;
}

/* mu held; false: out of memory (the plan is still usable this once) */
static bool add_conn(dj_gplan *p, uint64_t conn) {
    if (proven(p, conn)) return true;
    if (p->n_conns == p->cap_conns) {
        const uint32_t cap = p->cap_conns ? 2 * p->cap_conns : 4;
        uint64_t *n = realloc(p->conns, sizeof *n * cap);
        if (!n) return false;
        p->conns = n;
        p->cap_conns = cap;
    }
    p->conns[p->n_conns++] = conn;
    return true;
}

static void hash_of(const uint8_t *bytes, size_t len, uint8_t id[DJ_GPLAN_ID_BYTES]) {
    XXH128_canonical_t cn;
    XXH128_canonicalFromHash(&cn, XXH3_128bits(len ? (const void *)bytes : "", len));
    memcpy(id, cn.digest, DJ_GPLAN_ID_BYTES);
}

static bool same_bytes(const dj_gplan *p, const uint8_t *bytes, size_t len) {
    return p->len == len && (!len || !memcmp(p->bytes, bytes, len));
}

dj_status dj_gplan_cache_put(dj_gplan_cache *c, uint64_t conn, const uint8_t *bytes, size_t len,
                            const dj_cgraph_limits *lim, const dj_cgraph_t **g, dj_gplan **ref,
                            uint8_t id_out[DJ_GPLAN_ID_BYTES], bool *hit, dj_cgraph_error *err) {
    *g = NULL;
    *ref = NULL;
    *hit = false;
    if (err) memset(err, 0, sizeof *err);
    uint8_t id[DJ_GPLAN_ID_BYTES];
    hash_of(bytes, len, id);
    if (id_out) memcpy(id_out, id, DJ_GPLAN_ID_BYTES);
    pthread_mutex_lock(&c->mu);
    dj_gplan *p = find(c, id);
    if (p && same_bytes(p, bytes, len)) {
        p->refs++;
        add_conn(p, conn);
        lru_unlink(c, p);
        lru_front(c, p);
        c->st.hits++;
        pthread_mutex_unlock(&c->mu);
        *g = p->g;
        *ref = p;
        *hit = true;
        return DJ_OK;
    }
    c->st.misses++;
    pthread_mutex_unlock(&c->mu);

    dj_cgraph_t *dg = NULL;
    dj_status st = dj_cgraph_decode(bytes, len, lim, &dg, err);
    if (st != DJ_OK) return st;
    dj_gplan *n = dj_calloc(1, sizeof *n);
    if (!n || (len && !(n->bytes = dj_malloc(len)))) {
        free(n);
        dj_cgraph_free(dg);
        return dj_fail(DJ_ENOMEM, "out of memory caching a graph plan");
    }
    memcpy(n->id, id, DJ_GPLAN_ID_BYTES);
    if (len) memcpy(n->bytes, bytes, len);
    n->len = len;
    n->g = dg;
    n->cost = len + dj_cgraph_mem_bytes(dg) + sizeof *n;
    n->refs = 1;
    pthread_mutex_lock(&c->mu);
    p = find(c, id);
    if (p && same_bytes(p, bytes, len)) { /* decoded meanwhile by another run: use that one */
        p->refs++;
        add_conn(p, conn);
        pthread_mutex_unlock(&c->mu);
        plan_free(n);
        *g = p->g;
        *ref = p;
        return DJ_OK;
    }
    /* cached unless it is larger than the whole cache or its id is taken by other bytes (a hash
     * collision: the cached plan stays, this one runs once) */
    if (!p && n->cost <= c->st.capacity) {
        n->cached = true;
        const size_t bk = bucket_of(id);
        n->bnext = c->b[bk];
        c->b[bk] = n;
        lru_front(c, n);
        c->st.entries++;
        c->st.bytes += n->cost;
        add_conn(n, conn);
        evict(c);
    }
    pthread_mutex_unlock(&c->mu);
    *g = n->g;
    *ref = n;
    return DJ_OK;
}

dj_status dj_gplan_cache_get(dj_gplan_cache *c, uint64_t conn, const uint8_t id[DJ_GPLAN_ID_BYTES], const dj_cgraph_t **g,
                            dj_gplan **ref) {
    *g = NULL;
    *ref = NULL;
    pthread_mutex_lock(&c->mu);
    dj_gplan *p = find(c, id);
    if (!p || !proven(p, conn)) {
        c->st.refused_id++;
        pthread_mutex_unlock(&c->mu);
        return dj_fail(DJ_ENOTFOUND, "graph_id %02x%02x%02x%02x...: no plan of it that this connection sent is cached "
                       "(send the graph's bytes)", id[0], id[1], id[2], id[3]);
    }
    p->refs++;
    lru_unlink(c, p);
    lru_front(c, p);
    c->st.hits++;
    pthread_mutex_unlock(&c->mu);
    *g = p->g;
    *ref = p;
    return DJ_OK;
}

void dj_gplan_cache_release(dj_gplan_cache *c, dj_gplan *p) {
    if (!p) return;
    pthread_mutex_lock(&c->mu);
    const bool gone = --p->refs == 0 && !p->cached;
    if (p->cached && !p->refs) evict(c);
    pthread_mutex_unlock(&c->mu);
    if (gone) plan_free(p);
}

void dj_gplan_cache_conn_closed(dj_gplan_cache *c, uint64_t conn) {
    pthread_mutex_lock(&c->mu);
    for (dj_gplan *p = c->head; p; p = p->next)
        for (uint32_t i = 0; i < p->n_conns; i++)
            if (p->conns[i] == conn) {
                p->conns[i] = p->conns[--p->n_conns];
                break;
            }
    pthread_mutex_unlock(&c->mu);
}

void dj_gplan_cache_get_stats(dj_gplan_cache *c, dj_gplan_cache_stats *out) {
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}
