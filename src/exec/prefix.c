/* prefix.c: the prefix cache - full KV blocks shared by content between
 * sessions (a hash chain over token blocks, refcounted, LRU-evicted). */
#include <stdlib.h>
#include "djinn/alloc.h"
#include <string.h>

#include <xxhash.h>

#include "exec/kv_impl.h"
#include "vmu/vmu_impl.h"

/* One cached block: the KV of tokens_per_page positions in every layer of
 * one model, for one token prefix. Its pages belong to the cache's VMU
 * session; sessions that map it hold a reference each. */
struct dj__pblock {
    uint64_t key[2];          /* chain key: H(parent, ids) */
    uint64_t parent[2];       /* the key before it (the session root for block 0) */
    uint32_t refs;            /* sessions mapping it; 0: on the LRU list, evictable */
    uint32_t n_layers, n_ids;
    dj__pblock *hnext;        /* hash bucket chain */
    dj__pblock *lru_prev, *lru_next; /* while refs == 0: oldest at lru_head */
    uint32_t *pages;          /* [n_layers] page of each layer (points into the same allocation) */
    int32_t *ids;             /* [n_ids] its tokens (same allocation) */
};

struct dj__prefix {
    dj_vmu_session_t *vs;     /* holds every cached page */
    dj__pblock **buckets;     /* [n_buckets], a power of two */
    size_t n_buckets, n_blocks, n_unref, pages;
    dj__pblock *lru_head, *lru_tail;
    XXH3_state_t *h;
    dj_prefix_stats st;
};

dj_status dj__prefix_new(dj__kv *kv) {
    dj__prefix *c = dj_calloc(1, sizeof *c);
    if (!c) return dj_fail(DJ_ENOMEM, "prefix cache: out of host memory");
    c->n_buckets = 256;
    c->buckets = dj_calloc(c->n_buckets, sizeof *c->buckets);
    c->h = XXH3_createState();
    dj_status st = DJ_OK;
    if (!c->buckets || !c->h) st = dj_fail(DJ_ENOMEM, "prefix cache: out of host memory");
    if (st == DJ_OK) st = dj_vmu_session_new(kv->vmu, "prefix-cache", 0, &c->vs);
    if (st != DJ_OK) {
        free(c->buckets);
        if (c->h) XXH3_freeState(c->h);
        free(c);
        return st;
    }
    kv->prefix = c;
    return DJ_OK;
}

static size_t bucket_of(const dj__prefix *c, const uint64_t key[2]) { return (size_t)key[0] & (c->n_buckets - 1); }

static void lru_unlink(dj__prefix *c, dj__pblock *b) {
    if (b->lru_prev) b->lru_prev->lru_next = b->lru_next;
    else c->lru_head = b->lru_next;
    if (b->lru_next) b->lru_next->lru_prev = b->lru_prev;
    else c->lru_tail = b->lru_prev;
    b->lru_prev = b->lru_next = NULL;
    c->n_unref--;
}

static void lru_push(dj__prefix *c, dj__pblock *b) {
    b->lru_next = NULL;
    b->lru_prev = c->lru_tail;
    if (c->lru_tail) c->lru_tail->lru_next = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_unref++;
}

static void block_drop(dj__kv *kv, dj__prefix *c, dj__pblock *b) {
    dj__pblock **pp = &c->buckets[bucket_of(c, b->key)];
    while (*pp != b) pp = &(*pp)->hnext;
    *pp = b->hnext;
    for (uint32_t l = 0; l < b->n_layers; l++)
        if (dj_vmu_page_free(kv->vmu, c->vs, b->pages[l]) != DJ_OK)
            DJ_LOG(ERROR, "prefix cache: %s", dj_last_error());
    c->pages -= b->n_layers;
    c->n_blocks--;
    free(b);
}

bool dj__prefix_evict(dj__kv *kv) {
    dj__prefix *c = kv->prefix;
    if (!c || !c->lru_head) return false;
    dj__pblock *b = c->lru_head;
    lru_unlink(c, b);
    block_drop(kv, c, b);
    c->st.evictions++;
    return true;
}

void dj__prefix_free(dj__kv *kv) {
    dj__prefix *c = kv->prefix;
    if (!c) return;
    while (dj__prefix_evict(kv)) {}
    if (c->n_blocks) DJ_LOG(ERROR, "prefix cache freed with %zu blocks still mapped by sessions", c->n_blocks);
    dj_vmu_session_free(kv->vmu, c->vs); /* their pages too */
    for (size_t i = 0; i < c->n_buckets; i++)
        for (dj__pblock *b = c->buckets[i], *nx; b; b = nx) {
            nx = b->hnext;
            free(b);
        }
    free(c->buckets);
    XXH3_freeState(c->h);
    free(c);
    kv->prefix = NULL;
}

/* key = H(parent, ids): equal keys mean equal token prefixes from the root
 * (which names the model and the KV layout). */
static void chain(dj__prefix *c, const uint64_t parent[2], const int32_t *ids, uint32_t n, uint64_t key[2]) {
    XXH3_128bits_reset(c->h);
    XXH3_128bits_update(c->h, parent, 2 * sizeof(uint64_t));
    XXH3_128bits_update(c->h, ids, (size_t)n * sizeof *ids);
    const XXH128_hash_t k = XXH3_128bits_digest(c->h);
    key[0] = k.low64;
    key[1] = k.high64;
}

void dj__prefix_root(const dj_session_t *s, uint64_t key[2]) {
    /* rope_long: keys rotated with longrope's other factors are other keys */
    /* pfx_salt: sessions of other tenants start other chains (no key of one is a key of another) */
    /* lora: KV made with adapters (their order and use scales) is theirs */
    uint64_t v[9 + 2 * DJ_LORA_STACK_MAX] = {s->model_fp,    s->tokens_per_page, s->n_layers,
                                            s->kv[0].kv_dim, (uint64_t)s->kv[0].dtype, (uint64_t)s->rope_long,
                                            s->pfx_salt[0],  s->pfx_salt[1],   s->n_lora};
    for (uint32_t i = 0; i < s->n_lora; i++) {
        uint32_t bits = 0;
        memcpy(&bits, &s->lora_scale[i], sizeof bits);
        v[9 + 2 * i] = dj__lora_key(s->lora[i]);
        v[10 + 2 * i] = bits;
    }
    const XXH128_hash_t k = XXH3_128bits(v, sizeof v);
    key[0] = k.low64;
    key[1] = k.high64;
}

static dj__pblock *find(const dj__prefix *c, const uint64_t parent[2], const uint64_t key[2], const int32_t *ids,
                        uint32_t n) {
    for (dj__pblock *b = c->buckets[bucket_of(c, key)]; b; b = b->hnext)
        if (b->key[0] == key[0] && b->key[1] == key[1] && b->parent[0] == parent[0] && b->parent[1] == parent[1] &&
            b->n_ids == n && memcmp(b->ids, ids, (size_t)n * sizeof *ids) == 0)
            return b;
    return NULL;
}

static void grow(dj__prefix *c) {
    const size_t nb = c->n_buckets * 2;
    dj__pblock **t = dj_calloc(nb, sizeof *t);
    if (!t) return; /* longer chains, still correct */
    for (size_t i = 0; i < c->n_buckets; i++)
        for (dj__pblock *b = c->buckets[i], *nx; b; b = nx) {
            nx = b->hnext;
            const size_t k = (size_t)b->key[0] & (nb - 1);
            b->hnext = t[k];
            t[k] = b;
        }
    free(c->buckets);
    c->buckets = t;
    c->n_buckets = nb;
}

/* Block b of s (full, private, resident) goes into the cache under key;
 * s keeps a reference. A block already cached stays private to s. */
static void publish(dj__kv *kv, dj__prefix *c, dj_session_t *s, uint32_t b, const uint64_t key[2]) {
    const uint32_t L = s->n_layers, T = s->tokens_per_page;
    if (find(c, s->pfx_key, key, s->pfx_ids, T)) {
        c->st.duplicates++;
        return;
    }
    dj__pblock *blk = dj_malloc(sizeof *blk + (size_t)L * sizeof(uint32_t) + (size_t)T * sizeof(int32_t));
    if (!blk) return; /* stays private */
    memset(blk, 0, sizeof *blk);
    blk->pages = (uint32_t *)(void *)(blk + 1);
    blk->ids = (int32_t *)(void *)(blk->pages + L);
    memcpy(blk->key, key, sizeof blk->key);
    memcpy(blk->parent, s->pfx_key, sizeof blk->parent);
    memcpy(blk->ids, s->pfx_ids, (size_t)T * sizeof(int32_t));
    blk->n_layers = L;
    blk->n_ids = T;
    blk->refs = 1;
    dj_vmu_t *vmu = kv->vmu;
    for (uint32_t l = 0; l < L; l++) {
        const uint32_t p = s->block_table[(size_t)l * s->max_blocks + b];
        if (dj_vmu_page_give(vmu, s->vs, c->vs, p) != DJ_OK) { /* cannot happen: give back what moved */
            DJ_LOG(ERROR, "prefix cache: %s", dj_last_error());
            for (uint32_t j = 0; j < l; j++) (void)dj_vmu_page_give(vmu, c->vs, s->vs, blk->pages[j]);
            free(blk);
            return;
        }
        blk->pages[l] = p;
    }
    if (c->n_blocks >= 2 * c->n_buckets) grow(c);
    const size_t k = bucket_of(c, key);
    blk->hnext = c->buckets[k];
    c->buckets[k] = blk;
    c->n_blocks++;
    c->pages += L;
    c->st.published++;
    s->pfx[b] = blk;
}

void dj__prefix_fed(dj__kv *kv, dj_session_t *s, const int32_t *ids, uint32_t n) {
    dj__prefix *c = kv->prefix;
    if (!c || s->pfx_off) return;
    const uint32_t T = s->tokens_per_page;
    for (uint32_t i = 0; i < n; i++) {
        s->pfx_ids[s->pfx_n++] = ids[i];
        if (s->pfx_n < T) continue;
        uint64_t key[2];
        chain(c, s->pfx_key, s->pfx_ids, T, key);
        const uint32_t b = s->pfx_full;
        if (b < s->n_blocks && !s->pfx[b] && s->residency != DJ_KV_SWAPPED && s->residency != DJ_KV_SWAPPING_OUT)
            publish(kv, c, s, b, key);
        memcpy(s->pfx_key, key, sizeof key);
        s->pfx_full++;
        s->pfx_n = 0;
    }
    if ((uint64_t)s->pfx_full * T + s->pfx_n != s->pos) /* the chain lost track: stop for this session */
        s->pfx_off = true;
}

static void unref(dj__prefix *c, dj__pblock *b) {
    if (--b->refs == 0) lru_push(c, b);
}

void dj__prefix_unshare(dj__prefix *c, dj_session_t *s, uint32_t b) {
    if (!c || !s->pfx || !s->pfx[b]) return;
    unref(c, s->pfx[b]);
    s->pfx[b] = NULL;
}

void dj__prefix_session_release(dj__prefix *c, dj_session_t *s) {
    if (c && s->pfx)
        for (uint32_t b = 0; b < s->max_blocks; b++) dj__prefix_unshare(c, s, b);
}

uint32_t dj__prefix_shared_blocks(const dj_session_t *s) {
    uint32_t k = 0;
    if (s->pfx)
        for (uint32_t b = 0; b < s->n_blocks; b++) k += s->pfx[b] != NULL;
    return k;
}

dj_status dj__prefix_map(dj__kv *kv, dj_session_t *s, const int32_t *ids, uint32_t n, uint32_t *mapped) {
    dj__prefix *c = kv->prefix;
    *mapped = 0;
    const uint32_t T = s->tokens_per_page, L = s->n_layers;
    if (!c || s->pfx_off || s->residency != DJ_KV_RESIDENT || s->pfx_n != 0 || s->pos % T != 0 ||
        s->n_blocks != s->pos / T || s->pfx_full != s->n_blocks)
        return DJ_OK;
    uint32_t off = 0;
    /* at least one id is left to feed: its step gives the logits */
    while (n - off > T && (uint64_t)s->pos + T <= s->max_ctx && s->n_blocks < s->max_blocks) {
        if (s->quota_pages && (size_t)(s->n_blocks + 1) * L > s->quota_pages) break;
        uint64_t key[2];
        chain(c, s->pfx_key, ids + off, T, key);
        dj__pblock *blk = find(c, s->pfx_key, key, ids + off, T);
        if (!blk || blk->n_layers != L) break;
        if (blk->refs++ == 0) lru_unlink(c, blk);
        const uint32_t b = s->n_blocks;
        for (uint32_t l = 0; l < L; l++) s->block_table[(size_t)l * s->max_blocks + b] = blk->pages[l];
        s->pfx[b] = blk;
        s->n_blocks++;
        for (uint32_t l = 0; l < L; l++) s->kv[l].n_blocks = s->n_blocks;
        memcpy(s->pfx_key, key, sizeof key);
        s->pfx_full++;
        s->pos += T;
        off += T;
        c->st.hits++;
    }
    c->st.tokens_mapped += off;
    *mapped = off;
    return DJ_OK;
}

void dj__prefix_stats(const dj__prefix *c, dj_prefix_stats *st) {
    memset(st, 0, sizeof *st);
    if (!c) return;
    *st = c->st;
    st->enabled = true;
    st->blocks = c->n_blocks;
    st->blocks_unreferenced = c->n_unref;
    st->pages = c->pages;
    size_t unref_pages = 0;
    for (const dj__pblock *b = c->lru_head; b; b = b->lru_next) unref_pages += b->n_layers;
    st->pages_unreferenced = unref_pages;
}

dj_status dj__prefix_check(const dj__prefix *c, dj_session_t *const *sessions, size_t n_sessions) {
    if (!c) return DJ_OK;
    size_t nb = 0, pages = 0, unref = 0;
    for (size_t i = 0; i < c->n_buckets; i++)
        for (const dj__pblock *b = c->buckets[i]; b; b = b->hnext) {
            nb++;
            pages += b->n_layers;
            if (bucket_of(c, b->key) != i) return dj_fail(DJ_EINTERNAL, "prefix block in the wrong bucket");
            uint32_t refs = 0;
            for (size_t k = 0; k < n_sessions; k++)
                for (uint32_t j = 0; j < sessions[k]->n_blocks; j++) refs += sessions[k]->pfx[j] == b;
            if (refs != b->refs)
                return dj_fail(DJ_EINTERNAL, "prefix block: %u references counted, %u recorded", refs, b->refs);
        }
    for (size_t k = 0; k < n_sessions; k++) {
        const dj_session_t *s = sessions[k];
        if (s->residency == DJ_KV_SWAPPED) continue;
        for (uint32_t j = 0; j < s->n_blocks; j++) {
            const dj__pblock *b = s->pfx[j];
            if (!b) continue;
            if (b->n_layers != s->n_layers)
                return dj_fail(DJ_EINTERNAL, "session maps a prefix block of another layout at %u", j);
            for (uint32_t l = 0; l < b->n_layers; l++)
                if (s->block_table[(size_t)l * s->max_blocks + j] != b->pages[l])
                    return dj_fail(DJ_EINTERNAL, "session's table at layer %u block %u is not its prefix block's page",
                                   l, j);
        }
    }
    for (const dj__pblock *b = c->lru_head; b; b = b->lru_next) {
        if (b->refs) return dj_fail(DJ_EINTERNAL, "prefix block with %u references on the LRU list", b->refs);
        unref++;
    }
    if (nb != c->n_blocks || pages != c->pages || unref != c->n_unref || dj_vmu_session_pages(c->vs) != pages)
        return dj_fail(DJ_EINTERNAL, "prefix cache: %zu blocks / %zu pages / %zu unreferenced counted, %zu / %zu / %zu "
                       "recorded, the VMU holds %zu for it", nb, pages, unref, c->n_blocks, c->pages, c->n_unref,
                       dj_vmu_session_pages(c->vs));
    return DJ_OK;
}
