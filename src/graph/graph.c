/* graph.c: building the SRG - appending validated nodes, their buffer sizes,
 * accessors - plus the shape buckets of the plan cache. */
#include <stdlib.h>
#include "djinn/alloc.h"
#include <string.h>

#include "graph/graph_impl.h"
#include "djinn/vmu.h"

uint32_t dj_shape_bucket(dj_phase phase, uint32_t n_tokens, uint32_t max_tokens) {
    if (phase == DJ_PHASE_DECODE) return 1;
    uint32_t b = 16;
    while (b < n_tokens && b <= UINT32_MAX / 2) b *= 2;
    if (b < n_tokens) b = n_tokens; /* past 2^31: no power of two above it fits */
    if (max_tokens > 0 && b > max_tokens) b = max_tokens;
    return b;
}

dj_status dj_graph_new(dj_phase phase, uint32_t n_tokens, dj_graph_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "graph: no output pointer");
    *out = NULL;
    if (phase != DJ_PHASE_PREFILL && phase != DJ_PHASE_DECODE)
        return dj_fail(DJ_EINVAL, "graph: unknown phase %d", (int)phase);
    if (n_tokens == 0) return dj_fail(DJ_EINVAL, "graph: a step needs at least one token row");
    dj_graph_t *g = dj_calloc(1, sizeof *g);
    if (!g) return dj_fail(DJ_ENOMEM, "graph: out of host memory");
    g->phase = phase;
    g->n_tokens = n_tokens;
    *out = g;
    return DJ_OK;
}

void dj_graph_free(dj_graph_t *g) {
    if (!g) return;
    free(g->nodes);
    free(g->bufs);
    free(g->placed);
    free(g);
}

static dj_status graph_grow(dj_graph_t *g) {
    if (g->cap >= (1 << 24)) return dj_fail(DJ_ERANGE, "graph: more than %d nodes", 1 << 24);
    int cap = g->cap ? g->cap * 2 : 64;
    /* each realloc stands on its own: a failure leaves larger arrays and the old cap */
    dj_node *nodes = dj_realloc(g->nodes, (size_t)cap * sizeof *nodes);
    if (!nodes) goto fail;
    g->nodes = nodes;
    dj__plan_buf *bufs = dj_realloc(g->bufs, (size_t)cap * sizeof *bufs);
    if (!bufs) goto fail;
    g->bufs = bufs;
    int *placed = dj_realloc(g->placed, (size_t)cap * sizeof *placed);
    if (!placed) goto fail;
    g->placed = placed;
    g->cap = cap;
    return DJ_OK;
fail:
    return dj_fail(DJ_ENOMEM, "graph: out of host memory for %d nodes", cap);
}

dj_status dj_graph_add(dj_graph_t *g, const dj_node *node, int *idx) {
    if (idx) *idx = -1;
    if (!g || !node) return dj_fail(DJ_EINVAL, "graph add: no graph or node");
    int i = g->n;
    char name[sizeof node->name];
    memcpy(name, node->name, sizeof name);
    name[sizeof name - 1] = '\0';
    if ((int)node->op < 0 || node->op > DJ_OP_COUNT)
        return dj_fail(DJ_EINVAL, "graph node %d (%s): unknown op %d", i, name, (int)node->op);
    if ((int)node->res < (int)DJ_RES_INPUT || (int)node->res > (int)DJ_RES_OUTPUT)
        return dj_fail(DJ_EINVAL, "graph node %d (%s): unknown residency %d", i, name, (int)node->res);
    /* a 4-bit weight (whose rows are not whole elements) counts one byte an element: weights take no stack */
    size_t esize = node->dtype == DJ_DTYPE_Q4 && node->res == DJ_RES_WEIGHT ? 1 : dj_dtype_size(node->dtype);
    if (esize == 0) return dj_fail(DJ_EINVAL, "graph node %d (%s): unknown dtype %d", i, name, (int)node->dtype);
    if (node->ndim < 0 || node->ndim > DJ_GRAPH_MAX_DIMS)
        return dj_fail(DJ_EINVAL, "graph node %d (%s): %d dimensions; at most %d", i, name, node->ndim,
                       DJ_GRAPH_MAX_DIMS);
    size_t elems = 1;
    for (int d = 0; d < node->ndim; d++) {
        int64_t e = node->shape[d];
        if (e < 0) return dj_fail(DJ_EINVAL, "graph node %d (%s): dimension %d is %lld", i, name, d, (long long)e);
        if (e > 0 && elems > SIZE_MAX / (uint64_t)e)
            return dj_fail(DJ_ERANGE, "graph node %d (%s): shape too large", i, name);
        elems *= (size_t)e;
    }
    if (elems > SIZE_MAX / esize) return dj_fail(DJ_ERANGE, "graph node %d (%s): shape too large", i, name);
    for (int k = 0; k < DJ_GRAPH_MAX_SRC; k++) {
        int s = node->src[k];
        if (s != -1 && (s < 0 || s >= i))
            return dj_fail(DJ_EINVAL, "graph node %d (%s): source %d is %d; must be -1 (unused) or an earlier node "
                           "(0..%d)", i, name, k, s, i - 1);
    }
    if (g->n == g->cap) {
        dj_status st = graph_grow(g);
        if (st != DJ_OK) return st;
    }
    dj_node *n = &g->nodes[i];
    *n = *node;
    memcpy(n->name, name, sizeof name);
    bool buffered = node->res == DJ_RES_ACTIVATION || node->res == DJ_RES_OUTPUT;
    n->size = buffered ? elems * esize : 0;
    n->offset = 0;
    n->last_use = i;
    g->n++;
    g->planned = false;
    if (idx) *idx = i;
    return DJ_OK;
}

int dj_graph_count(const dj_graph_t *g) { return g->n; }
dj_node *dj_graph_node(dj_graph_t *g, int i) { return i >= 0 && i < g->n ? &g->nodes[i] : NULL; }
const dj_node *dj_graph_node_c(const dj_graph_t *g, int i) { return i >= 0 && i < g->n ? &g->nodes[i] : NULL; }
uint32_t dj_graph_tokens(const dj_graph_t *g) { return g->n_tokens; }
dj_phase dj_graph_phase(const dj_graph_t *g) { return g->phase; }
size_t dj_graph_peak(const dj_graph_t *g) { return g->peak; }
bool dj_graph_planned(const dj_graph_t *g) { return g->planned; }

size_t dj_graph_naive_bytes(const dj_graph_t *g) {
    size_t sum = 0;
    for (int i = 0; i < g->n; i++) {
        size_t a = dj_vmu_aligned(g->nodes[i].size);
        sum = a > SIZE_MAX - sum ? SIZE_MAX : sum + a;
    }
    return sum;
}

double dj_graph_flops(const dj_graph_t *g) {
    double f = 0.0;
    for (int i = 0; i < g->n; i++) f += g->nodes[i].flops;
    return f;
}
