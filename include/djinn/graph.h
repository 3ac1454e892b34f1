/* graph.h: the SRG (semantic resource graph) - a DAG of ops with shapes,
 * dtypes and semantic tags - plus the planner that gives every activation a
 * stack offset from liveness, and the plan cache keyed by (model fingerprint,
 * shape bucket). Nodes are appended in topological order: a node's sources
 * always have smaller indices, so the DAG property holds by construction. */
#ifndef DJINN_GRAPH_H
#define DJINN_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/backend.h"
#include "djinn/dtype.h"
#include "djinn/status.h"

#define DJ_GRAPH_MAX_SRC 4
#define DJ_GRAPH_MAX_DIMS 4

typedef enum { DJ_PHASE_PREFILL, DJ_PHASE_DECODE } dj_phase;

/* Where a node's bytes live. */
typedef enum {
    DJ_RES_INPUT,      /* supplied per step from the host (token ids) */
    DJ_RES_WEIGHT,     /* text segment; `data` points at it */
    DJ_RES_KV,         /* data segment pages of the session (no stack bytes) */
    DJ_RES_ACTIVATION, /* stack segment; offset assigned by the planner */
    DJ_RES_OUTPUT      /* stack segment too, live until the step ends */
} dj_residency;

/* dj_node.flags */
#define DJ_NODE_LAST_ROW                                                                                               \
    1u /* compute only from the last shape[0] token rows of                                                            \
          src[0] (logits of the last position(s)) */

/* Named points of the forward pass (include/djinn/intervene.h): the node
 * whose output is that point, tagged by the builder; `layer` says whose. */
#define DJ_NODE_PT_EMBED 2u      /* the embedding: layers.0.input */
#define DJ_NODE_PT_ATTN 4u       /* the attention block's output (o_proj): layers.{i}.attn.output */
#define DJ_NODE_PT_MLP 8u        /* the MLP (or MoE) block's output: layers.{i}.mlp.output */
#define DJ_NODE_PT_LAYER 16u     /* the decoder layer's output: layers.{i}.output (= layers.{i+1}.input) */
#define DJ_NODE_PT_FINAL_NORM 32u /* the final norm's output: final_norm.output */

typedef struct dj_node {
    /* what */
    dj_op op;                 /* compute op; weights/inputs use DJ_OP_COUNT */
    dj_dtype dtype;
    int ndim;
    int64_t shape[DJ_GRAPH_MAX_DIMS]; /* shape[0] is the token dimension for activations */
    int src[DJ_GRAPH_MAX_SRC];        /* source node indices, -1 unused */
    /* semantic tags */
    dj_residency res;
    dj_phase phase;
    int layer;                /* -1 outside the layer stack */
    double flops;             /* planned (bucket) cost */
    double bytes;             /* bytes read + written */
    char name[48];
    /* op parameters (copied into dj_op_call by the executor) */
    dj_op_call params;        /* pointers filled at run time; scalars set by the builder */
    const void *data;         /* WEIGHT: optional direct pointer (tests); NULL when bound late */
    int weight_slot;          /* WEIGHT: index in the model's weight table, resolved
                                 at run time, so a cached plan outlives where the
                                 model's weights happen to sit in the text segment */
    unsigned flags;           /* DJ_NODE_* below */
    /* planner output */
    size_t size;              /* bytes of this node's own buffer (ACTIVATION/OUTPUT) */
    size_t offset;            /* stack offset (ACTIVATION/OUTPUT) */
    int last_use;             /* index of the last node reading it (self if none) */
} dj_node;

typedef struct dj_graph dj_graph_t;

dj_status dj_graph_new(dj_phase phase, uint32_t n_tokens, dj_graph_t **out /* OUT */);
void dj_graph_free(dj_graph_t *g);

/* Append a node; *idx receives its index. Validates that sources exist and
 * precede it (DJ_EINVAL otherwise), op, residency, dtype and shape (DJ_ERANGE if
 * its bytes overflow). size is computed from shape and dtype for ACTIVATION and
 * OUTPUT nodes and is 0 for the others. The name is cut to 47 characters. */
dj_status dj_graph_add(dj_graph_t *g, const dj_node *node, int *idx /* OUT */);

int dj_graph_count(const dj_graph_t *g);
dj_node *dj_graph_node(dj_graph_t *g, int i);
const dj_node *dj_graph_node_c(const dj_graph_t *g, int i);
uint32_t dj_graph_tokens(const dj_graph_t *g); /* planned token rows (bucket) */
dj_phase dj_graph_phase(const dj_graph_t *g);

/* Planner: computes last_use and a stack offset for every ACTIVATION/OUTPUT
 * node such that no two buffers whose live ranges overlap share bytes; every
 * offset is a multiple of DJ_VMU_ALIGN (256). OUTPUT nodes stay live to the end.
 * *peak receives the stack bytes the step needs. No allocation at run time. */
dj_status dj_graph_plan(dj_graph_t *g, size_t *peak /* OUT */);
size_t dj_graph_peak(const dj_graph_t *g);       /* after planning */
bool dj_graph_planned(const dj_graph_t *g);      /* planned since the last add */
size_t dj_graph_naive_bytes(const dj_graph_t *g); /* sum of aligned activation sizes */
double dj_graph_flops(const dj_graph_t *g);

/* Plan cache: owns the graphs put into it, bounded to `capacity` entries
 * (least recently used dropped first). */
typedef struct dj_plan_cache dj_plan_cache_t;
dj_status dj_plan_cache_new(size_t capacity, dj_plan_cache_t **out /* OUT */);
void dj_plan_cache_free(dj_plan_cache_t *pc);
/* Planned graph for (fingerprint, bucket) or NULL. */
dj_graph_t *dj_plan_cache_get(dj_plan_cache_t *pc, uint64_t fingerprint, uint32_t bucket);
/* Takes ownership of g (planned). Replaces (and frees) the graph of an entry
 * with the same key; at capacity frees the least recently used entry's graph.
 * Graphs returned by get stay valid until their entry is replaced or dropped. */
dj_status dj_plan_cache_put(dj_plan_cache_t *pc, uint64_t fingerprint, uint32_t bucket, dj_graph_t *g);
void dj_plan_cache_stats(const dj_plan_cache_t *pc, size_t *hits, size_t *misses, size_t *entries);

/* Shape bucket for a step of n tokens: 1 for decode; the next power of two
 * (at least 16) for prefill, capped at max_tokens (0 = no cap; the caller
 * rejects n_tokens > max_tokens). */
uint32_t dj_shape_bucket(dj_phase phase, uint32_t n_tokens, uint32_t max_tokens);

#endif
