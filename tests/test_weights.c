/* test_weights.c: the content-addressed weight store (weights.h) - uploads checked by the hash the
 * store computes, proofs per connection, challenges right and wrong, quota, capacity and eviction. */
#include <stdlib.h>
#include <string.h>

#include "djinn/weights.h"
#include "testutil.h"

static void fill(uint8_t *b, size_t n, uint8_t salt) {
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)(dj_test_rand() ^ salt);
}

/* The whole of data uploaded by conn in chunks of `chunk` bytes. */
static dj_status upload_all(dj_wstore_t *ws, uint64_t conn, uint64_t tenant, const uint8_t *data, size_t n,
                            size_t chunk, bool *done) {
    dj_whash h;
    dj_whash_of(data, n, &h);
    size_t off = 0;
    dj_status st = DJ_OK;
    do {
        const size_t k = n - off < chunk ? n - off : chunk;
        st = dj_wstore_upload(ws, conn, tenant, &h, n, off, data + off, k, done);
        off += k;
    } while (st == DJ_OK && off < n);
    return st;
}

static void test_hash(void) {
    /* XXH3-128 of "abc" in canonical form (the value python's ctypes call on libxxhash gives too) */
    dj_whash h;
    char hex[33];
    dj_whash_of("abc", 3, &h);
    dj_whash_hex(&h, hex);
    CHECK_MSG(!strcmp(hex, "06b05ab6733a618578af5f94892f3950"), "%s", hex);
}

static void test_upload_and_proofs(void) {
    dj_wstore_t *ws = NULL;
    CHECK_OK(dj_wstore_new(NULL, &ws));
    uint8_t data[1000];
    fill(data, sizeof data, 1);
    dj_whash h;
    dj_whash_of(data, sizeof data, &h);
    CHECK(dj_wstore_has(ws, 1, &h, NULL) == DJ_WHAS_ABSENT);
    bool done = false;
    CHECK_OK(upload_all(ws, 1, 100, data, sizeof data, 300, &done));
    CHECK(done);
    uint64_t nb = 0;
    CHECK(dj_wstore_has(ws, 1, &h, &nb) == DJ_WHAS_USABLE && nb == sizeof data);
    CHECK(dj_wstore_has(ws, 2, &h, NULL) == DJ_WHAS_HELD); /* another connection: knowing the hash is not access */
    dj_weight *w = NULL;
    const void *p = NULL;
    CHECK_ST(dj_wstore_acquire(ws, 2, &h, &w, &p, &nb), DJ_ENOTFOUND);
    CHECK(!w);
    CHECK_OK(dj_wstore_acquire(ws, 1, &h, &w, &p, &nb));
    CHECK(w && nb == sizeof data && !memcmp(p, data, sizeof data) && ((uintptr_t)p & 63) == 0);
    dj_wstore_release(ws, w);
    /* the second connection uploads the same bytes: one copy stays */
    CHECK_OK(upload_all(ws, 2, 200, data, sizeof data, 1000, &done));
    dj_wstore_stats st;
    dj_wstore_get_stats(ws, &st);
    CHECK(st.weights == 1 && st.bytes == sizeof data && st.uploads == 2 && st.upload_dups == 1);
    CHECK(dj_wstore_tenant_bytes(ws, 100) == sizeof data && dj_wstore_tenant_bytes(ws, 200) == 0);
    CHECK(dj_wstore_has(ws, 2, &h, NULL) == DJ_WHAS_USABLE);
    /* bytes that hash to something else are refused and not stored */
    uint8_t other[64];
    fill(other, sizeof other, 2);
    CHECK_ST(dj_wstore_upload(ws, 3, 300, &h, sizeof other, 0, other, sizeof other, &done), DJ_EINVAL);
    CHECK(!done && strstr(dj_last_error(), "hash to"));
    CHECK(dj_wstore_has(ws, 3, &h, NULL) == DJ_WHAS_HELD);
    dj_wstore_get_stats(ws, &st);
    CHECK(st.hash_mismatches == 1 && st.inflight_bytes == 0 && dj_wstore_tenant_bytes(ws, 300) == 0);
    /* chunks out of order end the upload; a chunk past the end too */
    dj_whash ho;
    dj_whash_of(other, sizeof other, &ho);
    CHECK_OK(dj_wstore_upload(ws, 3, 300, &ho, sizeof other, 0, other, 10, &done));
    CHECK_ST(dj_wstore_upload(ws, 3, 300, &ho, sizeof other, 20, other + 20, 10, &done), DJ_EINVAL);
    CHECK_ST(dj_wstore_upload(ws, 3, 300, &ho, sizeof other, 10, other + 10, 10, &done), DJ_EINVAL); /* it was dropped */
    CHECK_OK(dj_wstore_upload(ws, 3, 300, &ho, sizeof other, 0, other, 10, &done));
    CHECK_ST(dj_wstore_upload(ws, 3, 300, &ho, sizeof other, 10, other + 10, 100, &done), DJ_EINVAL);
    CHECK_ST(dj_wstore_upload(ws, 3, 300, &ho, sizeof other + 1, 0, other, 10, &done), DJ_OK);
    CHECK_ST(dj_wstore_upload(ws, 3, 300, &ho, sizeof other, 10, other + 10, 10, &done), DJ_EINVAL); /* total changed */
    dj_wstore_get_stats(ws, &st);
    CHECK(st.inflight_bytes == 0 && st.weights == 1);
    /* connection 1 leaves: its proof goes, connection 2's stays */
    dj_wstore_conn_closed(ws, 1);
    CHECK(dj_wstore_has(ws, 1, &h, NULL) == DJ_WHAS_HELD && dj_wstore_has(ws, 2, &h, NULL) == DJ_WHAS_USABLE);
    dj_wstore_get_stats(ws, &st);
    CHECK(st.referenced == 1);
    dj_wstore_conn_closed(ws, 2);
    dj_wstore_get_stats(ws, &st);
    CHECK(st.referenced == 0 && st.weights == 1); /* cached at refcount 0 */
    dj_wstore_free(ws);
}

static void test_challenge(void) {
    dj_wstore_t *ws = NULL;
    CHECK_OK(dj_wstore_new(NULL, &ws));
    uint8_t data[4096];
    fill(data, sizeof data, 3);
    dj_whash h;
    dj_whash_of(data, sizeof data, &h);
    bool done;
    CHECK_OK(upload_all(ws, 1, 1, data, sizeof data, 4096, &done));
    dj_wchallenge c;
    dj_whash ans;
    /* no challenge open yet */
    CHECK_ST(dj_wstore_answer(ws, 2, &h, &h), DJ_ENOTFOUND);
    CHECK_OK(dj_wstore_challenge(ws, 2, &h, &c));
    CHECK(c.n == DJ_WCHALLENGE_RANGES);
    for (uint32_t i = 0; i < c.n; i++)
        CHECK(c.length[i] >= 1 && c.length[i] <= DJ_WCHALLENGE_RANGE_MAX && c.offset[i] + c.length[i] <= sizeof data);
    /* the hash itself is not the answer; bytes that differ in one of the ranges are not either */
    CHECK_ST(dj_wstore_answer(ws, 2, &h, &h), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "wrong answer") != NULL);
    CHECK(dj_wstore_has(ws, 2, &h, NULL) == DJ_WHAS_HELD);
    CHECK_ST(dj_wstore_answer(ws, 2, &h, &h), DJ_ENOTFOUND); /* a wrong answer closed the challenge */
    CHECK_OK(dj_wstore_challenge(ws, 2, &h, &c));
    uint8_t forged[4096];
    memcpy(forged, data, sizeof data);
    forged[c.offset[3] + c.length[3] - 1] ^= 1;
    dj_wchallenge_answer(&c, forged, &ans);
    CHECK_ST(dj_wstore_answer(ws, 2, &h, &ans), DJ_EINVAL);
    /* the right bytes */
    CHECK_OK(dj_wstore_challenge(ws, 2, &h, &c));
    dj_wchallenge_answer(&c, data, &ans);
    CHECK_OK(dj_wstore_answer(ws, 2, &h, &ans));
    CHECK(dj_wstore_has(ws, 2, &h, NULL) == DJ_WHAS_USABLE);
    dj_wstore_stats st;
    dj_wstore_get_stats(ws, &st);
    CHECK(st.challenges_passed == 1 && st.challenges_failed == 2 && st.weights == 1);
    /* a weight the store lacks has no challenge */
    dj_whash none;
    dj_whash_of("x", 1, &none);
    CHECK_ST(dj_wstore_challenge(ws, 2, &none, &c), DJ_ENOTFOUND);
    /* tiny weights: as many 1-byte ranges as bytes */
    uint8_t tiny[3] = {7, 8, 9};
    CHECK_OK(upload_all(ws, 1, 1, tiny, 3, 3, &done));
    dj_whash ht;
    dj_whash_of(tiny, 3, &ht);
    CHECK_OK(dj_wstore_challenge(ws, 5, &ht, &c));
    CHECK(c.n == 3);
    dj_wchallenge_answer(&c, tiny, &ans);
    CHECK_OK(dj_wstore_answer(ws, 5, &ht, &ans));
    dj_wstore_free(ws);
}

static void test_quota_capacity(void) {
    dj_wstore_t *ws = NULL;
    const dj_wstore_config cfg = {.capacity_bytes = 10000, .quota_bytes = 4000, .max_tensor_bytes = 3000,
                                  .uploads_per_conn = 2};
    CHECK_OK(dj_wstore_new(&cfg, &ws));
    static uint8_t d[6][3000];
    for (int i = 0; i < 6; i++) fill(d[i], sizeof d[i], (uint8_t)(10 + i));
    bool done;
    dj_whash h[6];
    for (int i = 0; i < 6; i++) dj_whash_of(d[i], 3000, &h[i]);
    /* one weight over max_tensor_bytes */
    CHECK_ST(dj_wstore_upload(ws, 1, 1, &h[0], 3001, 0, d[0], 10, &done), DJ_ERANGE);
    /* tenant 1: 3000 fit its 4000, another 3000 do not while the first is referenced */
    CHECK_OK(upload_all(ws, 1, 1, d[0], 3000, 1000, &done));
    CHECK_ST(dj_wstore_upload(ws, 1, 1, &h[1], 3000, 0, d[1], 1000, &done), DJ_EQUOTA);
    CHECK(strstr(dj_last_error(), "quota") != NULL);
    CHECK(dj_wstore_tenant_bytes(ws, 1) == 3000);
    /* a run's reference holds it too; once nothing references it, the tenant's own weight makes room */
    dj_weight *w;
    const void *p;
    uint64_t nb;
    CHECK_OK(dj_wstore_acquire(ws, 1, &h[0], &w, &p, &nb));
    dj_wstore_conn_closed(ws, 1);
    CHECK_ST(dj_wstore_upload(ws, 2, 1, &h[1], 3000, 0, d[1], 1000, &done), DJ_EQUOTA);
    dj_wstore_release(ws, w);
    CHECK_OK(upload_all(ws, 2, 1, d[1], 3000, 1000, &done));
    CHECK(dj_wstore_has(ws, 2, &h[0], NULL) == DJ_WHAS_ABSENT); /* evicted for its owner's new upload */
    dj_wstore_stats st;
    dj_wstore_get_stats(ws, &st);
    CHECK(st.evictions == 1 && st.weights == 1 && dj_wstore_tenant_bytes(ws, 1) == 3000);
    /* tenants 2 and 3 fill the capacity: 3 x 3000 of 10000 */
    CHECK_OK(upload_all(ws, 3, 2, d[2], 3000, 3000, &done));
    CHECK_OK(upload_all(ws, 4, 3, d[3], 3000, 3000, &done));
    CHECK_ST(dj_wstore_upload(ws, 5, 4, &h[4], 3000, 0, d[4], 3000, &done), DJ_ENOSPC);
    /* tenant 3 leaves: its weight is evicted (the oldest unreferenced) for tenant 4 */
    dj_wstore_conn_closed(ws, 4);
    CHECK_OK(upload_all(ws, 5, 4, d[4], 3000, 3000, &done));
    CHECK(dj_wstore_has(ws, 5, &h[3], NULL) == DJ_WHAS_ABSENT && dj_wstore_tenant_bytes(ws, 3) == 0);
    /* uploads per connection, and a connection leaving mid-upload gives its reservation back */
    dj_whash sm[3];
    for (int i = 0; i < 3; i++) dj_whash_of(d[5] + i, 100, &sm[i]);
    CHECK_OK(dj_wstore_upload(ws, 6, 5, &sm[0], 100, 0, d[5], 10, &done));
    CHECK_OK(dj_wstore_upload(ws, 6, 5, &sm[1], 100, 0, d[5] + 1, 10, &done));
    CHECK_ST(dj_wstore_upload(ws, 6, 5, &sm[2], 100, 0, d[5] + 2, 10, &done), DJ_ERANGE);
    dj_wstore_get_stats(ws, &st);
    CHECK(st.inflight_bytes == 200 && dj_wstore_tenant_bytes(ws, 5) == 200);
    dj_wstore_conn_closed(ws, 6);
    dj_wstore_get_stats(ws, &st);
    CHECK(st.inflight_bytes == 0 && dj_wstore_tenant_bytes(ws, 5) == 0);
    dj_wstore_free(ws);
}

int main(void) {
    dj_test_seeds();
    test_hash();
    test_upload_and_proofs();
    test_challenge();
    test_quota_capacity();
    return dj_test_finish("test_weights");
}
