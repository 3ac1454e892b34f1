/* test_graph.c: building SRG graphs (validation, buffer sizes, accessors), op
 * names, shape buckets and the plan cache (hits, misses, LRU eviction, replace). */
#include <string.h>

#include "djinn/graph.h"
#include "djinn/op_table.h"
#include "djinn/vmu.h"
#include "testutil.h"

static dj_node node_make(dj_residency res, dj_dtype dt, int ndim, const int64_t *shape, int s0, int s1) {
    dj_node n;
    memset(&n, 0, sizeof n);
    n.op = res == DJ_RES_ACTIVATION || res == DJ_RES_OUTPUT ? DJ_OP_ADD : DJ_OP_COUNT;
    n.dtype = dt;
    n.ndim = ndim;
    for (int d = 0; d < ndim && d < DJ_GRAPH_MAX_DIMS; d++) n.shape[d] = shape[d];
    n.src[0] = s0;
    n.src[1] = s1;
    n.src[2] = n.src[3] = -1;
    n.res = res;
    n.layer = -1;
    snprintf(n.name, sizeof n.name, "n");
    return n;
}

static void test_build(void) {
    dj_graph_t *g = NULL;
    CHECK_ST(dj_graph_new(DJ_PHASE_PREFILL, 0, &g), DJ_EINVAL);
    CHECK_ST(dj_graph_new((dj_phase)7, 4, &g), DJ_EINVAL);
    CHECK(g == NULL);
    dj_graph_free(NULL);
    CHECK_OK(dj_graph_new(DJ_PHASE_PREFILL, 64, &g));
    if (!g) return;
    CHECK(dj_graph_tokens(g) == 64 && dj_graph_phase(g) == DJ_PHASE_PREFILL && dj_graph_count(g) == 0);

    int64_t d0 = (int64_t)(1 + dj_test_rand() % 100), d1 = (int64_t)(1 + dj_test_rand() % 5000);
    int64_t sh[4] = {d0, d1, 3, 1};
    int idx = -5;
    dj_node in = node_make(DJ_RES_INPUT, DJ_DTYPE_I32, 1, sh, -1, -1);
    CHECK_OK(dj_graph_add(g, &in, &idx));
    CHECK(idx == 0 && dj_graph_node(g, 0)->size == 0);
    dj_node w = node_make(DJ_RES_WEIGHT, DJ_DTYPE_BF16, 2, sh, -1, -1);
    CHECK_OK(dj_graph_add(g, &w, &idx));
    CHECK(idx == 1 && dj_graph_node(g, 1)->size == 0);
    dj_node a = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 2, sh, 0, 1);
    a.flops = 1.5;
    CHECK_OK(dj_graph_add(g, &a, &idx));
    CHECK(idx == 2 && dj_graph_node(g, 2)->size == (size_t)(d0 * d1 * 4));
    dj_node o = node_make(DJ_RES_OUTPUT, DJ_DTYPE_BF16, 3, sh, 2, -1);
    o.flops = 2.0;
    memset(o.name, 'x', sizeof o.name); /* not terminated: cut */
    CHECK_OK(dj_graph_add(g, &o, &idx));
    CHECK(idx == 3 && dj_graph_node(g, 3)->size == (size_t)(d0 * d1 * 3 * 2));
    CHECK(strlen(dj_graph_node_c(g, 3)->name) == sizeof o.name - 1);
    dj_node kv = node_make(DJ_RES_KV, DJ_DTYPE_F32, 2, sh, 2, 3);
    kv.op = DJ_OP_KV_WRITE;
    CHECK_OK(dj_graph_add(g, &kv, &idx));
    CHECK(dj_graph_node(g, 4)->size == 0);
    dj_node scalar = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F16, 0, sh, -1, -1);
    CHECK_OK(dj_graph_add(g, &scalar, &idx));
    CHECK(dj_graph_node(g, 5)->size == 2);
    CHECK(dj_graph_flops(g) == 3.5);
    CHECK(dj_graph_naive_bytes(g) ==
          dj_vmu_aligned((size_t)(d0 * d1 * 4)) + dj_vmu_aligned((size_t)(d0 * d1 * 6)) + 256);
    CHECK(dj_graph_node(g, 6) == NULL && dj_graph_node(g, -1) == NULL && dj_graph_node_c(g, 99) == NULL);

    /* rejected nodes leave the graph as it was */
    int n_before = dj_graph_count(g);
    dj_node bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 2, sh, n_before, -1); /* itself */
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_EINVAL);
    CHECK(idx == -1 && strstr(dj_last_error(), "source 0") != NULL);
    bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 2, sh, 0, n_before + 10); /* later */
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_EINVAL);
    bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 2, sh, -2, -1);
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_EINVAL);
    bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 2, sh, 0, -1);
    bad.src[3] = 1000;
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_EINVAL);
    bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 5, sh, 0, -1);
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_EINVAL);
    bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 2, sh, 0, -1);
    bad.shape[1] = -3;
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_EINVAL);
    bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_COUNT, 2, sh, 0, -1);
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_EINVAL);
    bad = node_make((dj_residency)9, DJ_DTYPE_F32, 2, sh, 0, -1);
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_EINVAL);
    bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 2, sh, 0, -1);
    bad.op = (dj_op)(DJ_OP_COUNT + 1);
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_EINVAL);
    int64_t huge[4] = {INT64_MAX, INT64_MAX, 1, 1};
    bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 2, huge, 0, -1);
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_ERANGE);
    int64_t big[4] = {(int64_t)1 << 62, 1, 1, 1};
    bad = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 1, big, 0, -1); /* elements fit, bytes do not */
    CHECK_ST(dj_graph_add(g, &bad, &idx), DJ_ERANGE);
    CHECK_ST(dj_graph_add(g, NULL, &idx), DJ_EINVAL);
    CHECK(dj_graph_count(g) == n_before);

    /* many nodes: growth keeps earlier ones intact */
    for (int i = 0; i < 1000; i++) {
        dj_node c = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 1, sh, dj_graph_count(g) - 1, 0);
        CHECK_OK(dj_graph_add(g, &c, &idx));
    }
    CHECK(dj_graph_count(g) == n_before + 1000 && dj_graph_node(g, 2)->size == (size_t)(d0 * d1 * 4));
    CHECK(dj_graph_node(g, 500)->src[0] == 499);
    CHECK(!dj_graph_planned(g));
    size_t peak = 0;
    CHECK_OK(dj_graph_plan(g, &peak));
    CHECK(dj_graph_planned(g) && peak == dj_graph_peak(g) && peak > 0);
    dj_graph_free(g);
}

static void test_names_buckets(void) {
    for (int i = 0; i <= DJ_OP_COUNT; i++) {
        CHECK(dj_op_name((dj_op)i) != NULL);
        for (int j = 0; j < i; j++) CHECK(strcmp(dj_op_name((dj_op)i), dj_op_name((dj_op)j)) != 0);
    }
    CHECK(strcmp(dj_op_name(DJ_OP_MATMUL), "matmul") == 0);
    for (int i = 0; i < DJ_OP_COUNT; i++) /* the op table's rows in dj_op order */
        CHECK_MSG(strcmp(dj_op_descs[i].name, dj_op_name((dj_op)i)) == 0, "op %d: table row %s", i,
                  dj_op_descs[i].name);
    CHECK(dj_op_desc_of(DJ_OP_COUNT) == NULL && dj_op_desc_of(DJ_OP_ATTENTION) == &dj_op_descs[DJ_OP_ATTENTION]);
    CHECK(strcmp(dj_op_name(DJ_OP_ATTENTION), "attention") == 0);

    CHECK(dj_shape_bucket(DJ_PHASE_DECODE, 1, 4096) == 1);
    CHECK(dj_shape_bucket(DJ_PHASE_DECODE, 7, 4096) == 1);
    CHECK(dj_shape_bucket(DJ_PHASE_PREFILL, 1, 4096) == 16);
    CHECK(dj_shape_bucket(DJ_PHASE_PREFILL, 16, 4096) == 16);
    CHECK(dj_shape_bucket(DJ_PHASE_PREFILL, 17, 4096) == 32);
    CHECK(dj_shape_bucket(DJ_PHASE_PREFILL, 100, 4096) == 128);
    CHECK(dj_shape_bucket(DJ_PHASE_PREFILL, 100, 64) == 64);
    CHECK(dj_shape_bucket(DJ_PHASE_PREFILL, 3000, 3000) == 3000);
    CHECK(dj_shape_bucket(DJ_PHASE_PREFILL, UINT32_MAX, 0) == UINT32_MAX);
    int bad = 0;
    for (int i = 0; i < 10000; i++) {
        uint32_t n = 1 + (uint32_t)(dj_test_rand() % 100000);
        uint32_t b = dj_shape_bucket(DJ_PHASE_PREFILL, n, 0);
        bad += (b & (b - 1)) != 0 || b < n || b < 16 || (b > 16 && b / 2 >= n);
        uint32_t cap = 1 + (uint32_t)(dj_test_rand() % 100000);
        uint32_t bc = dj_shape_bucket(DJ_PHASE_PREFILL, n, cap);
        bad += bc != (b < cap ? b : cap);
    }
    CHECK_MSG(bad == 0, "%d wrong buckets", bad);
}

static dj_graph_t *tagged_graph(uint32_t tag) {
    dj_graph_t *g = NULL;
    if (dj_graph_new(DJ_PHASE_PREFILL, tag, &g) != DJ_OK) return NULL;
    int64_t sh[1] = {tag};
    dj_node a = node_make(DJ_RES_ACTIVATION, DJ_DTYPE_F32, 1, sh, -1, -1);
    int idx;
    if (dj_graph_add(g, &a, &idx) != DJ_OK || dj_graph_plan(g, NULL) != DJ_OK) {
        dj_graph_free(g);
        return NULL;
    }
    return g;
}

static void test_plan_cache(void) {
    dj_plan_cache_t *pc = NULL;
    CHECK_ST(dj_plan_cache_new(0, &pc), DJ_EINVAL);
    CHECK(pc == NULL);
    dj_plan_cache_free(NULL);
    CHECK_OK(dj_plan_cache_new(2, &pc));
    if (!pc) return;
    uint64_t fp = dj_test_rand();
    size_t hits, misses, entries;
    CHECK(dj_plan_cache_get(pc, fp, 16) == NULL);
    dj_graph_t *g16 = tagged_graph(16), *g32 = tagged_graph(32), *g1 = tagged_graph(1);
    CHECK_OK(dj_plan_cache_put(pc, fp, 16, g16));
    CHECK_OK(dj_plan_cache_put(pc, fp, 32, g32));
    CHECK(dj_plan_cache_get(pc, fp, 16) == g16); /* 16 newest now */
    CHECK(dj_plan_cache_get(pc, fp + 1, 16) == NULL);
    CHECK_OK(dj_plan_cache_put(pc, fp, 1, g1)); /* evicts 32 (and frees it) */
    CHECK(dj_plan_cache_get(pc, fp, 32) == NULL);
    CHECK(dj_plan_cache_get(pc, fp, 16) == g16 && dj_plan_cache_get(pc, fp, 1) == g1);
    dj_plan_cache_stats(pc, &hits, &misses, &entries);
    CHECK(hits == 3 && misses == 3 && entries == 2);
    /* replace: the old graph is freed, the new one served */
    dj_graph_t *g16b = tagged_graph(16);
    CHECK_OK(dj_plan_cache_put(pc, fp, 16, g16b));
    CHECK(dj_plan_cache_get(pc, fp, 16) == g16b);
    CHECK_OK(dj_plan_cache_put(pc, fp, 16, g16b)); /* same graph again: kept, not freed */
    CHECK(dj_plan_cache_get(pc, fp, 16) == g16b && dj_graph_tokens(g16b) == 16);
    dj_plan_cache_stats(pc, NULL, NULL, &entries);
    CHECK(entries == 2);
    CHECK_ST(dj_plan_cache_put(pc, fp, 2, NULL), DJ_EINVAL);
    dj_plan_cache_free(pc);

    /* random use against a shadow LRU list; graphs carry their key as the token count */
    enum { CAP = 8, KEYS = 20 };
    CHECK_OK(dj_plan_cache_new(CAP, &pc));
    if (!pc) return;
    int lru[CAP], n_lru = 0; /* keys, oldest first */
    size_t want_hits = 0, want_misses = 0;
    int bad = 0;
    for (int op = 0; op < 5000; op++) {
        int key = (int)(dj_test_rand() % KEYS);
        uint64_t kfp = (uint64_t)(key % 5) * 0x9e3779b97f4a7c15ull; /* keys share fingerprints and buckets */
        uint32_t kb = 1 + (uint32_t)(key / 5);
        int pos = -1;
        for (int i = 0; i < n_lru; i++)
            if (lru[i] == key) pos = i;
        if (dj_test_rand() % 2) {
            dj_graph_t *got = dj_plan_cache_get(pc, kfp, kb);
            if (pos < 0) {
                want_misses++;
                bad += got != NULL;
                continue;
            }
            want_hits++;
            bad += !got || dj_graph_tokens(got) != (uint32_t)(1000 + key);
        } else {
            dj_graph_t *g = tagged_graph((uint32_t)(1000 + key));
            if (!g || dj_plan_cache_put(pc, kfp, kb, g) != DJ_OK) {
                bad++;
                continue;
            }
            if (pos < 0 && n_lru == CAP) { /* oldest goes */
                memmove(lru, lru + 1, (CAP - 1) * sizeof *lru);
                n_lru--;
            }
        }
        if (pos >= 0) { /* move to newest */
            memmove(lru + pos, lru + pos + 1, (size_t)(n_lru - pos - 1) * sizeof *lru);
            n_lru--;
        }
        lru[n_lru++] = key;
    }
    dj_plan_cache_stats(pc, &hits, &misses, &entries);
    CHECK_MSG(bad == 0, "%d wrong answers from the plan cache", bad);
    CHECK(hits == want_hits && misses == want_misses && entries == (size_t)n_lru);
    dj_plan_cache_free(pc);
}

int main(void) {
    dj_test_seeds();
    test_build();
    test_names_buckets();
    test_plan_cache();
    return dj_test_finish("test_graph");
}
