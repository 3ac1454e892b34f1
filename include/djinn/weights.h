/* weights.h: the weights of captured modules on the server, stored once by content (XXH3-128 of
 * their bytes) and shared by every connection and session (docs/capture.md, "Weights by content").
 *
 * A weight is named by the XXH3-128 of its bytes, in XXH128's canonical form (16 bytes, high half
 * first). The store recomputes that hash from the bytes it receives; a name alone is never access:
 * a connection may use a weight only after it uploaded its bytes or answered a challenge over
 * random byte ranges of them (a proof). Each proof holds one reference, each run using the weight
 * another; at refcount 0 a weight stays cached until room is needed (oldest first). Uploads are
 * counted against their tenant's quota in the bytes they hold (a chunked upload reserves its whole
 * size when it starts; a stored weight stays charged to the tenant that uploaded it until it is
 * evicted). Thread-safe: one mutex inside. */
#ifndef DJINN_WEIGHTS_H
#define DJINN_WEIGHTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"

#define DJ_WHASH_BYTES 16
typedef struct dj_whash {
    uint8_t b[DJ_WHASH_BYTES]; /* XXH128_canonical_t of the bytes */
} dj_whash;

/* h = the canonical XXH3-128 of bytes[0..n). */
void dj_whash_of(const void *bytes, size_t n, dj_whash *h /* OUT */);
/* "0123...ef" (32 hex digits and a NUL) for messages. */
void dj_whash_hex(const dj_whash *h, char out[33] /* OUT */);

typedef struct dj_wstore_config {
    uint64_t capacity_bytes;   /* all weights held and uploads in flight; 0 = 8 GiB */
    uint64_t quota_bytes;      /* per tenant (its uploads in flight + the weights it uploaded); 0 = capacity */
    uint64_t max_tensor_bytes; /* one weight; 0 = the quota */
    uint32_t uploads_per_conn; /* uploads in flight on one connection; 0 = 8 */
} dj_wstore_config;

typedef struct dj_wstore dj_wstore_t;

dj_status dj_wstore_new(const dj_wstore_config *cfg /* NULL: defaults */, dj_wstore_t **out /* OUT */);
void dj_wstore_free(dj_wstore_t *ws); /* NULL does nothing; every reference must be released */

typedef enum {
    DJ_WHAS_ABSENT = 0, /* not stored: upload it */
    DJ_WHAS_HELD = 1,   /* stored, but this connection has not proven it holds the bytes: answer a challenge */
    DJ_WHAS_USABLE = 2, /* stored and proven by this connection */
} dj_whas;
const char *dj_whas_name(dj_whas w); /* "absent", "held", "usable" */

/* Whether the store holds h, and whether conn may use it; *nbytes (may be NULL) its size when held. */
dj_whas dj_wstore_has(dj_wstore_t *ws, uint64_t conn, const dj_whash *h, uint64_t *nbytes /* OUT */);

/* One chunk of an upload of the weight h of `total` bytes by conn (counted for tenant): bytes
 * [offset, offset + len). The first chunk (offset 0) starts the upload: total must be at most
 * max_tensor_bytes (DJ_ERANGE), fit the tenant's quota (DJ_EQUOTA; the tenant's own unreferenced
 * weights are evicted first) and the store's capacity (DJ_ENOSPC; unreferenced weights are evicted
 * first). Chunks come in order (DJ_EINVAL otherwise, naming the offset expected). The chunk that
 * reaches total completes it: the store hashes the bytes, and a hash other than h is refused
 * (DJ_EINVAL, the upload dropped); else the weight is stored (a copy already there is kept and the
 * upload's bytes freed), conn has proven it, and *done is set. Any error ends the upload. */
dj_status dj_wstore_upload(dj_wstore_t *ws, uint64_t conn, uint64_t tenant, const dj_whash *h, uint64_t total,
                           uint64_t offset, const void *bytes, size_t len, bool *done /* OUT */);

/* A challenge for conn over the weight h (stored: DJ_ENOTFOUND else): n (OUT) random ranges of its
 * bytes and a random seed. The answer is the canonical XXH3-128, with that seed, of the bytes of
 * the ranges concatenated in order. One challenge per (conn, weight) is open at a time; a new one
 * replaces it. */
#define DJ_WCHALLENGE_RANGES 8     /* ranges of one challenge (fewer for a weight under 8 bytes) */
#define DJ_WCHALLENGE_RANGE_MAX 64 /* bytes of one range at most */
typedef struct dj_wchallenge {
    uint32_t n;
    uint64_t offset[DJ_WCHALLENGE_RANGES], length[DJ_WCHALLENGE_RANGES];
    uint64_t seed;
} dj_wchallenge;
dj_status dj_wstore_challenge(dj_wstore_t *ws, uint64_t conn, const dj_whash *h, dj_wchallenge *c /* OUT */);
/* conn's answer to its open challenge over h: right, and conn has proven h (one reference held);
 * wrong, DJ_EINVAL and the challenge is closed (a new one has new ranges); none open, DJ_ENOTFOUND. */
dj_status dj_wstore_answer(dj_wstore_t *ws, uint64_t conn, const dj_whash *h, const dj_whash *answer);
/* The answer to c over data (what a client computes; tests). */
void dj_wchallenge_answer(const dj_wchallenge *c, const void *data, dj_whash *out /* OUT */);

/* The weight h for a run of conn: DJ_ENOTFOUND when the store lacks it or conn has not proven it;
 * else one reference is held until dj_wstore_release, and *data (64-byte aligned) / *nbytes stay
 * valid until then. */
typedef struct dj_weight dj_weight;
dj_status dj_wstore_acquire(dj_wstore_t *ws, uint64_t conn, const dj_whash *h, dj_weight **w /* OUT */,
                            const void **data /* OUT */, uint64_t *nbytes /* OUT */);
void dj_wstore_release(dj_wstore_t *ws, dj_weight *w); /* NULL does nothing */

/* conn is gone: its proofs (references), open challenges and uploads in flight go. */
void dj_wstore_conn_closed(dj_wstore_t *ws, uint64_t conn);

typedef struct dj_wstore_stats {
    uint64_t weights, bytes;       /* stored now */
    uint64_t referenced;           /* of those, weights with a reference */
    uint64_t capacity, quota;
    uint64_t inflight_bytes;       /* reserved by uploads in flight */
    uint64_t received_bytes;       /* upload chunk bytes received, all time */
    uint64_t uploads;              /* uploads completed (hash checked), all time */
    uint64_t upload_dups;          /* of those, of a weight already stored */
    uint64_t hash_mismatches;      /* uploads refused: bytes with another hash */
    uint64_t challenges_passed, challenges_failed;
    uint64_t evictions;
} dj_wstore_stats;
void dj_wstore_get_stats(dj_wstore_t *ws, dj_wstore_stats *st /* OUT */);
/* Bytes charged to tenant now (uploads in flight and the weights it uploaded still stored). */
uint64_t dj_wstore_tenant_bytes(dj_wstore_t *ws, uint64_t tenant);

#endif
