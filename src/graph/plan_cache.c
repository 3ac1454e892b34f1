/* plan_cache.c: planned graphs kept by (model fingerprint, shape bucket) in a
 * fixed table of `capacity` entries, hashed with xxHash, least recently used
 * dropped first. */
#include <stdlib.h>
#include "djinn/alloc.h"
#include <string.h>
#include <xxhash.h>

#include "djinn/graph.h"

#define NONE (-1)

typedef struct pc_entry {
    uint64_t fingerprint;
    uint32_t bucket;
    dj_graph_t *g;       /* owned; NULL for an unused entry */
    int chain;           /* next entry in the same hash slot */
    int newer, older;    /* LRU list */
} pc_entry;

struct dj_plan_cache {
    size_t capacity;
    pc_entry *entries;   /* [capacity] */
    int *slots;          /* [n_slots] first entry of each hash chain */
    size_t n_slots;      /* power of two >= 2 * capacity */
    int newest, oldest;  /* LRU ends */
    size_t count;        /* entries in use: entries[0..count) */
    size_t hits, misses;
};

static size_t pc_slot(const dj_plan_cache_t *pc, uint64_t fingerprint, uint32_t bucket) {
    unsigned char key[12];
    memcpy(key, &fingerprint, 8);
    memcpy(key + 8, &bucket, 4);
    return (size_t)XXH3_64bits(key, sizeof key) & (pc->n_slots - 1);
}

dj_status dj_plan_cache_new(size_t capacity, dj_plan_cache_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "plan cache: no output pointer");
    *out = NULL;
    if (capacity == 0 || capacity > (1u << 20))
        return dj_fail(DJ_EINVAL, "plan cache: capacity %zu; must be 1..%u", capacity, 1u << 20);
    dj_plan_cache_t *pc = dj_calloc(1, sizeof *pc);
    if (!pc) goto fail;
    pc->capacity = capacity;
    pc->n_slots = 2;
    while (pc->n_slots < 2 * capacity) pc->n_slots *= 2;
    pc->entries = dj_calloc(capacity, sizeof *pc->entries);
    pc->slots = dj_malloc(pc->n_slots * sizeof *pc->slots);
    if (!pc->entries || !pc->slots) goto fail;
    for (size_t i = 0; i < pc->n_slots; i++) pc->slots[i] = NONE;
    pc->newest = pc->oldest = NONE;
    *out = pc;
    return DJ_OK;
fail:
    dj_plan_cache_free(pc);
    return dj_fail(DJ_ENOMEM, "plan cache: out of host memory for %zu entries", capacity);
}

void dj_plan_cache_free(dj_plan_cache_t *pc) {
    if (!pc) return;
    if (pc->entries)
        for (size_t i = 0; i < pc->count; i++) dj_graph_free(pc->entries[i].g);
    free(pc->entries);
    free(pc->slots);
    free(pc);
}

static int pc_find(const dj_plan_cache_t *pc, uint64_t fingerprint, uint32_t bucket) {
    for (int e = pc->slots[pc_slot(pc, fingerprint, bucket)]; e != NONE; e = pc->entries[e].chain)
        if (pc->entries[e].fingerprint == fingerprint && pc->entries[e].bucket == bucket) return e;
    return NONE;
}

static void lru_unlink(dj_plan_cache_t *pc, int e) {
    pc_entry *x = &pc->entries[e];
    if (x->newer != NONE) pc->entries[x->newer].older = x->older;
    else pc->newest = x->older;
    if (x->older != NONE) pc->entries[x->older].newer = x->newer;
    else pc->oldest = x->newer;
}

static void lru_push_newest(dj_plan_cache_t *pc, int e) {
    pc_entry *x = &pc->entries[e];
    x->newer = NONE;
    x->older = pc->newest;
    if (pc->newest != NONE) pc->entries[pc->newest].newer = e;
    pc->newest = e;
    if (pc->oldest == NONE) pc->oldest = e;
}

static void chain_unlink(dj_plan_cache_t *pc, int e) {
    pc_entry *x = &pc->entries[e];
    int *link = &pc->slots[pc_slot(pc, x->fingerprint, x->bucket)];
    while (*link != e) link = &pc->entries[*link].chain;
    *link = x->chain;
}

dj_graph_t *dj_plan_cache_get(dj_plan_cache_t *pc, uint64_t fingerprint, uint32_t bucket) {
    if (!pc) return NULL;
    int e = pc_find(pc, fingerprint, bucket);
    if (e == NONE) {
        pc->misses++;
        return NULL;
    }
    pc->hits++;
    lru_unlink(pc, e);
    lru_push_newest(pc, e);
    return pc->entries[e].g;
}

dj_status dj_plan_cache_put(dj_plan_cache_t *pc, uint64_t fingerprint, uint32_t bucket, dj_graph_t *g) {
    if (!pc || !g) return dj_fail(DJ_EINVAL, "plan cache put: no cache or graph");
    int e = pc_find(pc, fingerprint, bucket);
    if (e != NONE) { /* replace */
        if (pc->entries[e].g != g) dj_graph_free(pc->entries[e].g);
        pc->entries[e].g = g;
        lru_unlink(pc, e);
        lru_push_newest(pc, e);
        return DJ_OK;
    }
    if (pc->count < pc->capacity) {
        e = (int)pc->count++;
    } else { /* full: reuse the oldest entry */
        e = pc->oldest;
        lru_unlink(pc, e);
        chain_unlink(pc, e);
        dj_graph_free(pc->entries[e].g);
    }
    pc_entry *x = &pc->entries[e];
    x->fingerprint = fingerprint;
    x->bucket = bucket;
    x->g = g;
    size_t slot = pc_slot(pc, fingerprint, bucket);
    x->chain = pc->slots[slot];
    pc->slots[slot] = e;
    lru_push_newest(pc, e);
    return DJ_OK;
}

void dj_plan_cache_stats(const dj_plan_cache_t *pc, size_t *hits, size_t *misses, size_t *entries) {
    if (hits) *hits = pc->hits;
    if (misses) *misses = pc->misses;
    if (entries) *entries = pc->count;
}
