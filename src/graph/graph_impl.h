/* graph_impl.h: the SRG's private structure, shared by the graph builder
 * (graph.c) and the planner (planner.c). */
#ifndef DJINN_GRAPH_IMPL_H
#define DJINN_GRAPH_IMPL_H

#include "djinn/graph.h"

/* One stack buffer as the planner sees it. */
typedef struct dj__plan_buf {
    size_t size;   /* aligned bytes */
    size_t offset; /* assigned */
    int def;       /* node index that writes it */
    int last;      /* last node index that reads it */
} dj__plan_buf;

struct dj_graph {
    dj_phase phase;
    uint32_t n_tokens;
    int n, cap;
    dj_node *nodes;          /* [cap], n in use, topological order */
    /* planner scratch, [cap] each, grown with nodes so planning allocates nothing */
    dj__plan_buf *bufs;      /* buffers, sorted for placement */
    int *placed;             /* indices into bufs of placed buffers, by offset */
    size_t peak;
    bool planned;
};

#endif
