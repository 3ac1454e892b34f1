/* gplan_cache.h: decoded, validated, planned captured graphs kept by the XXH3-128 of their bytes
 * (bounded in bytes, evicted LRU), usable by id only on a connection that has sent the bytes. */
#ifndef DJ_GPLAN_CACHE_H
#define DJ_GPLAN_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/capture.h"

#define DJ_GPLAN_ID_BYTES 16 /* the canonical XXH3-128 (seed 0) of the graph's bytes */
#define DJ_GPLAN_CACHE_DEFAULT_BYTES ((uint64_t)64 << 20)

typedef struct dj_gplan_cache dj_gplan_cache;
typedef struct dj_gplan dj_gplan; /* one cached graph; a reference keeps it from eviction */

typedef struct dj_gplan_cache_stats {
    uint64_t entries, bytes, capacity; /* bytes: the graphs' bytes plus their decoded form */
    uint64_t hits, misses, evictions, refused_id; /* refused_id: an id not cached or not sent on that connection */
} dj_gplan_cache_stats;

/* capacity_bytes 0: DJ_GPLAN_CACHE_DEFAULT_BYTES. */
dj_status dj_gplan_cache_new(uint64_t capacity_bytes, dj_gplan_cache **out /* OUT */);
void dj_gplan_cache_free(dj_gplan_cache *c); /* NULL does nothing; no reference may be held */

/* The plan of these graph bytes, sent by conn: the cached one when the same bytes were decoded
 * before (compared byte for byte, not by hash alone: *hit true), else decoded, validated and
 * planned now (err says why not) and cached when it fits. conn has then proven the bytes: it may
 * name the plan by id. *g is valid until dj_gplan_cache_release(*ref). id (OUT, may be NULL). */
dj_status dj_gplan_cache_put(dj_gplan_cache *c, uint64_t conn, const uint8_t *bytes, size_t len,
                            const dj_cgraph_limits *lim, const dj_cgraph_t **g /* OUT */, dj_gplan **ref /* OUT */,
                            uint8_t id[DJ_GPLAN_ID_BYTES] /* OUT, may be NULL */, bool *hit /* OUT */,
                            dj_cgraph_error *err /* OUT, may be NULL */);

/* The plan named by id, if it is cached and conn has sent its bytes; else DJ_ENOTFOUND (send the
 * bytes). Costs one table lookup. */
dj_status dj_gplan_cache_get(dj_gplan_cache *c, uint64_t conn, const uint8_t id[DJ_GPLAN_ID_BYTES],
                            const dj_cgraph_t **g /* OUT */, dj_gplan **ref /* OUT */);

void dj_gplan_cache_release(dj_gplan_cache *c, dj_gplan *ref); /* NULL does nothing */

/* conn closed: its proofs go (the plans stay cached for others who sent them). */
void dj_gplan_cache_conn_closed(dj_gplan_cache *c, uint64_t conn);

void dj_gplan_cache_get_stats(dj_gplan_cache *c, dj_gplan_cache_stats *out /* OUT */);

#endif
