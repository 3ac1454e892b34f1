/* planner.c: liveness and stack offsets for a graph's activations - greedy by
 * size: the largest buffers first, each at the lowest offset free of every
 * already placed buffer whose live range meets its own. */
#include <stdlib.h>
#include "djinn/alloc.h"
#include <string.h>

#include "djinn/vmu.h"
#include "graph/graph_impl.h"

/* Larger first; among equal sizes, earlier definitions first (a total order,
 * so the plan does not depend on qsort's stability). */
static int buf_cmp(const void *pa, const void *pb) {
    const dj__plan_buf *a = pa, *b = pb;
    if (a->size != b->size) return a->size > b->size ? -1 : 1;
    return (a->def > b->def) - (a->def < b->def);
}

/* Position in placed[0..np) after every buffer with offset <= off. */
static int placed_upper(const dj_graph_t *g, int np, size_t off) {
    int lo = 0, hi = np;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (g->bufs[g->placed[mid]].offset <= off) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

dj_status dj_graph_plan(dj_graph_t *g, size_t *peak) {
    if (peak) *peak = 0;
    if (!g) return dj_fail(DJ_EINVAL, "plan: no graph");
    int n = g->n;
    dj_node *nodes = g->nodes;
    /* A buffer stays live FUSE_SLACK nodes past its last reader: a backend
     * that runs a few consecutive nodes as one kernel (CUDA: ADD + RMSNORM +
     * up to three GEMVs of a decode step - 4 nodes on; SiLU-mul + its GEMV;
     * RoPE of q + RoPE of k + KV_WRITE) reads the first node's inputs while
     * the later nodes' outputs are written, so those must not take the
     * inputs' memory. Prefill buffers are large: only the RoPE pair's 1. */
    const int slack = g->phase == DJ_PHASE_DECODE ? 4 : 1;
    for (int i = 0; i < n; i++) nodes[i].last_use = i;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < DJ_GRAPH_MAX_SRC; k++)
            if (nodes[i].src[k] >= 0) nodes[nodes[i].src[k]].last_use = i; /* i grows: the last reader wins */
    /* ext[j]: the node `slack` compute nodes after node j (weights and inputs
     * between them do not count), or the last node */
    int *ext = dj_malloc((n > 0 ? (size_t)n : 1) * sizeof *ext);
    if (!ext) return dj_fail(DJ_ENOMEM, "plan: out of memory");
    int near[8] = {0}, seen = 0; /* the compute nodes after j, nearest last (a ring: slack <= 8) */
    for (int j = n - 1; j >= 0; j--) {
        ext[j] = seen >= slack ? near[(seen - slack) % 8] : n - 1;
        if (nodes[j].op < DJ_OP_COUNT) near[seen++ % 8] = j;
    }
    for (int i = 0; i < n; i++)
        if (nodes[i].last_use > i) nodes[i].last_use = ext[nodes[i].last_use];
    free(ext);
    int nb = 0;
    for (int i = 0; i < n; i++) {
        dj_node *nd = &nodes[i];
        if (nd->res == DJ_RES_OUTPUT) nd->last_use = n - 1;
        nd->offset = 0;
        if ((nd->res != DJ_RES_ACTIVATION && nd->res != DJ_RES_OUTPUT) || nd->size == 0) continue;
        if (nd->size > SIZE_MAX - (DJ_VMU_ALIGN - 1))
            return dj_fail(DJ_ERANGE, "plan: node %d (%s) needs %zu bytes", i, nd->name, nd->size);
        g->bufs[nb++] = (dj__plan_buf){dj_vmu_aligned(nd->size), 0, i, nd->last_use};
    }
    if (nb > 1) qsort(g->bufs, (size_t)nb, sizeof *g->bufs, buf_cmp);

    size_t top = 0;
    int np = 0;
    for (int k = 0; k < nb; k++) {
        dj__plan_buf *b = &g->bufs[k];
        size_t cur = 0; /* lowest offset above every conflicting buffer seen so far */
        for (int j = 0; j < np; j++) {
            const dj__plan_buf *p = &g->bufs[g->placed[j]];
            if (p->last < b->def || p->def > b->last) continue; /* never live together */
            if (p->offset >= cur && p->offset - cur >= b->size) break;
            size_t end = p->offset + p->size;
            if (end > cur) cur = end;
        }
        if (b->size > SIZE_MAX - cur)
            return dj_fail(DJ_ERANGE, "plan: node %d (%s) does not fit in the address space", b->def,
                           nodes[b->def].name);
        b->offset = cur;
        int at = placed_upper(g, np, cur);
        memmove(&g->placed[at + 1], &g->placed[at], (size_t)(np - at) * sizeof *g->placed);
        g->placed[at] = k;
        np++;
        if (cur + b->size > top) top = cur + b->size;
    }
    for (int k = 0; k < nb; k++) nodes[g->bufs[k].def].offset = g->bufs[k].offset;
    g->peak = top;
    g->planned = true;
    if (peak) *peak = top;
    return DJ_OK;
}
