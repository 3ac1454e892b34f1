/* test_gplan_cache.c: the server's plan cache (src/capture/gplan_cache.h) - hits by bytes and by id,
 * ids usable only by a connection that sent the bytes, LRU eviction by bytes, references pin plans. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capture/gplan_cache.h"
#include "testutil.h"

typedef dj_test_wb wb; /* testutil.h */
static void w_spec(wb *w, int64_t len) {
    dj_test_w_map(w, 2), dj_test_w_str(w, "shape"), dj_test_w_arr(w, 1), dj_test_w_int(w, len),
        dj_test_w_str(w, "dtype"), dj_test_w_str(w, "f32");
}

/* relu applied `depth` times to an input of len values */
static void relu_chain(wb *w, int64_t len, int depth) {
    w->n = 0;
    dj_test_w_map(w, 5), dj_test_w_str(w, "v"), dj_test_w_int(w, 1);
    dj_test_w_str(w, "inputs"), dj_test_w_arr(w, 1), w_spec(w, len);
    dj_test_w_str(w, "weights"), dj_test_w_arr(w, 0);
    dj_test_w_str(w, "nodes"), dj_test_w_arr(w, (uint32_t)depth);
    for (int j = 0; j < depth; j++) {
        dj_test_w_map(w, 3), dj_test_w_str(w, "op"), dj_test_w_str(w, "aten.relu.default"), dj_test_w_str(w, "args"),
            dj_test_w_arr(w, 1);
        if (j == 0)
            dj_test_w_map(w, 1), dj_test_w_str(w, "i"), dj_test_w_int(w, 0);
        else
            dj_test_w_map(w, 1), dj_test_w_str(w, "n"), dj_test_w_arr(w, 2), dj_test_w_int(w, j - 1),
                dj_test_w_int(w, 0);
        dj_test_w_str(w, "out"), dj_test_w_arr(w, 1), w_spec(w, len);
    }
    dj_test_w_str(w, "outputs"), dj_test_w_arr(w, 1);
    dj_test_w_map(w, 1), dj_test_w_str(w, "n"), dj_test_w_arr(w, 2), dj_test_w_int(w, depth - 1), dj_test_w_int(w, 0);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void test_hits_and_proofs(void) {
    dj_gplan_cache *c = NULL;
    CHECK(dj_gplan_cache_new(0, &c) == DJ_OK);
    wb a, b;
    relu_chain(&a, 16, 3);
    relu_chain(&b, 32, 3);
    const dj_cgraph_t *g1 = NULL, *g2 = NULL;
    dj_gplan *r1 = NULL, *r2 = NULL;
    uint8_t id[DJ_GPLAN_ID_BYTES], id2[DJ_GPLAN_ID_BYTES];
    bool hit = true;
    CHECK(dj_gplan_cache_put(c, 1, a.b, a.n, NULL, &g1, &r1, id, &hit, NULL) == DJ_OK);
    CHECK(!hit && g1 && dj_cgraph_n_nodes(g1) == 3);
    /* the same bytes again (another connection): the same plan, not decoded again */
    CHECK(dj_gplan_cache_put(c, 2, a.b, a.n, NULL, &g2, &r2, id2, &hit, NULL) == DJ_OK);
    CHECK(hit && g2 == g1 && !memcmp(id, id2, sizeof id));
    dj_gplan_cache_release(c, r2);
    /* by id: connection 1 and 2 sent the bytes, 3 did not */
    CHECK(dj_gplan_cache_get(c, 1, id, &g2, &r2) == DJ_OK && g2 == g1);
    dj_gplan_cache_release(c, r2);
    CHECK(dj_gplan_cache_get(c, 3, id, &g2, &r2) == DJ_ENOTFOUND && !g2 && !r2);
    /* a closed connection's proofs go */
    dj_gplan_cache_conn_closed(c, 2);
    CHECK(dj_gplan_cache_get(c, 2, id, &g2, &r2) == DJ_ENOTFOUND);
    /* an unknown id */
    uint8_t other[DJ_GPLAN_ID_BYTES] = {1};
    CHECK(dj_gplan_cache_get(c, 1, other, &g2, &r2) == DJ_ENOTFOUND);
    /* other bytes: another plan */
    CHECK(dj_gplan_cache_put(c, 1, b.b, b.n, NULL, &g2, &r2, id2, &hit, NULL) == DJ_OK);
    CHECK(!hit && g2 != g1 && memcmp(id, id2, sizeof id));
    dj_gplan_cache_release(c, r2);
    /* a graph the validator refuses is an error and not cached */
    wb bad = a;
    bad.b[bad.n - 1] = 7; /* the output names node 7 of 3 */
    dj_cgraph_error err;
    CHECK(dj_gplan_cache_put(c, 1, bad.b, bad.n, NULL, &g2, &r2, NULL, &hit, &err) == DJ_ERANGE);
    CHECK(err.kind == DJ_CGRAPH_ERR_REF && !r2);
    dj_gplan_cache_stats st;
    dj_gplan_cache_get_stats(c, &st);
    CHECK(st.entries == 2 && st.hits == 2 && st.misses == 3 && st.refused_id == 3);

    /* the cost of a hit by id against a decode (printed; not asserted: the clock is not a test) */
    wb big;
    relu_chain(&big, 64, 100);
    CHECK(dj_gplan_cache_put(c, 1, big.b, big.n, NULL, &g2, &r2, id2, &hit, NULL) == DJ_OK);
    dj_gplan_cache_release(c, r2);
    const int n = 2000;
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        CHECK(dj_gplan_cache_get(c, 1, id2, &g2, &r2) == DJ_OK);
        dj_gplan_cache_release(c, r2);
    }
    const double get_us = (now_s() - t0) / n * 1e6;
    t0 = now_s();
    for (int i = 0; i < n / 10; i++) {
        dj_cgraph_t *dg = NULL;
        CHECK(dj_cgraph_decode(big.b, big.n, NULL, &dg, NULL) == DJ_OK);
        dj_cgraph_free(dg);
    }
    const double dec_us = (now_s() - t0) / (n / 10) * 1e6;
    printf("plan cache: a hit by id %.3f us, decode+validate+plan of the same 100-node graph (%zu bytes) %.1f us\n",
           get_us, big.n, dec_us);
    dj_gplan_cache_release(c, r1);
    dj_gplan_cache_free(c);
}

static void test_eviction(void) {
    wb a;
    relu_chain(&a, 16, 3);
    const dj_cgraph_t *g = NULL;
    dj_gplan *r = NULL;
    bool hit;
    /* measure one entry's cost, then make a cache that holds two */
    dj_gplan_cache *c = NULL;
    CHECK(dj_gplan_cache_new(0, &c) == DJ_OK);
    CHECK(dj_gplan_cache_put(c, 1, a.b, a.n, NULL, &g, &r, NULL, &hit, NULL) == DJ_OK);
    dj_gplan_cache_release(c, r);
    dj_gplan_cache_stats st;
    dj_gplan_cache_get_stats(c, &st);
    const uint64_t one = st.bytes;
    CHECK(one > a.n);
    dj_gplan_cache_free(c);

    CHECK(dj_gplan_cache_new(2 * one + one / 2, &c) == DJ_OK);
    wb gs[3];
    uint8_t ids[3][DJ_GPLAN_ID_BYTES];
    for (int i = 0; i < 3; i++) { /* three graphs of one size (the input length differs only in value) */
        relu_chain(&gs[i], 16 + i, 3);
        CHECK(dj_gplan_cache_put(c, 1, gs[i].b, gs[i].n, NULL, &g, &r, ids[i], &hit, NULL) == DJ_OK && !hit);
        dj_gplan_cache_release(c, r);
        if (i == 1) { /* touch 0: 1 is now the oldest */
            CHECK(dj_gplan_cache_get(c, 1, ids[0], &g, &r) == DJ_OK);
            dj_gplan_cache_release(c, r);
        }
    }
    dj_gplan_cache_get_stats(c, &st);
    CHECK(st.entries == 2 && st.evictions == 1 && st.bytes <= st.capacity);
    CHECK(dj_gplan_cache_get(c, 1, ids[1], &g, &r) == DJ_ENOTFOUND);
    CHECK(dj_gplan_cache_get(c, 1, ids[0], &g, &r) == DJ_OK);
    /* a referenced plan is not evicted: hold 0, add 1 again -> 2 goes, 0 stays */
    dj_gplan *held = r;
    const dj_cgraph_t *g0 = g;
    CHECK(dj_gplan_cache_put(c, 1, gs[1].b, gs[1].n, NULL, &g, &r, NULL, &hit, NULL) == DJ_OK && !hit);
    dj_gplan_cache_release(c, r);
    CHECK(dj_gplan_cache_get(c, 1, ids[2], &g, &r) == DJ_ENOTFOUND);
    CHECK(dj_cgraph_n_nodes(g0) == 3); /* still valid (ASan would see a use after free) */
    dj_gplan_cache_release(c, held);
    /* a graph larger than the whole cache runs once and is not kept */
    wb big;
    relu_chain(&big, 16, 60);
    CHECK(dj_gplan_cache_put(c, 1, big.b, big.n, NULL, &g, &r, ids[2], &hit, NULL) == DJ_OK && g);
    dj_gplan_cache_release(c, r);
    CHECK(dj_gplan_cache_get(c, 1, ids[2], &g, &r) == DJ_ENOTFOUND);
    dj_gplan_cache_get_stats(c, &st);
    CHECK(st.bytes <= st.capacity);
    dj_gplan_cache_free(c);
}

int main(void) {
    test_hits_and_proofs();
    test_eviction();
    return dj_test_finish("test_gplan_cache");
}
