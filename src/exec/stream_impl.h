/* stream_impl.h: weight streaming for models larger than their text budget -
 * the placement (which layers stay resident, which stream), the skip-end ring
 * layout with each load's dependencies, and a streaming model's state.
 * docs/internals.md ("Models larger than the GPU") has the picture.
 * Private to src/exec/ (and the tests). */
#ifndef DJ_STREAM_IMPL_H
#define DJ_STREAM_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/backend.h"
#include "djinn/status.h"

/* ---- the ring layout (ring.c) ---- */

/* Tensors of loads 0..n_loads-1 (a load: one streamed layer's tensors, copied
 * in together) placed in order, one after another, in a ring of ring_bytes,
 * each at an `align` multiple; a tensor that would cross the ring's end starts
 * at offset 0 instead (skip-end: no tensor straddles the wrap). Every step
 * copies the loads in order into the same offsets, so a load's copy may start
 * only once every earlier reader of its bytes has finished: after[] lists, for
 * load k, each load j whose bytes overlap k's - the ones before k in this step
 * and, through the wrap, the ones after k in the previous step - and k itself
 * (its own previous step). */
typedef struct dj_ring_layout {
    size_t ring_bytes;
    uint32_t n_loads;
    size_t n_tensors;
    size_t *off;        /* [n_tensors] offset of each tensor in the ring; owned */
    size_t *lo, *hi;    /* [2 n_loads] each load's bytes: ranges [lo[2k], hi[2k]) and, when it
                         * wrapped, [lo[2k+1], hi[2k+1]) (else empty: lo == hi); owned */
    uint32_t *after;    /* every load's list, concatenated; owned */
    uint32_t *after_at; /* [n_loads + 1] load k's list is after[after_at[k] .. after_at[k + 1]); owned */
} dj_ring_layout;

/* Lays out n tensors of bytes[i] belonging to load[i] (non-decreasing, each of
 * 0..n_loads-1 at least once). Refused with the sizes (DJ_ENOSPC): a tensor
 * larger than the ring, or a load whose bytes overlap themselves. Neighbours
 * may overlap (a ring of one layer: each copy then waits for the layer before
 * to finish), so a backend never runs one kernel over two loads' weights.
 * DJ_EINVAL for inconsistent arguments. */
dj_status dj_ring_layout_make(size_t ring_bytes, size_t align, const size_t *bytes, const uint32_t *load, size_t n,
                              uint32_t n_loads, dj_ring_layout *out /* OUT */);
void dj_ring_layout_free(dj_ring_layout *r); /* zeroes it; a zeroed one does nothing */
/* Whether loads a and b share a byte. */
bool dj_ring_overlap(const dj_ring_layout *r, uint32_t a, uint32_t b);

/* ---- the placement (ring.c) ---- */

/* Which layers stream. Layers are placed whole; the global tensors
 * (embedding, final norm, head, RoPE tables) stay resident. */
typedef struct dj_placement {
    uint32_t n_layers, n_streamed;
    uint8_t *streamed;      /* [n_layers] 1: the layer streams through the ring; owned */
    size_t resident_bytes;  /* text bytes of the globals and the resident layers */
    size_t ring_bytes;      /* text bytes of the ring (0 when nothing streams) */
    size_t streamed_bytes;  /* bytes each step copies into the ring */
    uint32_t ring_layers;   /* layers the ring holds at once (its prefetch depth) */
} dj_placement;

#define DJ_RING_LAYERS 3 /* deepest ring: a layer computing, the next ready, one more arriving */

/* layer_bytes[l]: text bytes of layer l's tensors (each aligned as the text
 * segment aligns); max_tensor: the largest tensor of any layer; global_bytes:
 * the globals'. room: the largest region the text segment can give this
 * model. Everything resident when it fits; else the fewest layers stream
 * (at least 2: a ring that held every streamed layer would save nothing),
 * spread evenly over the depth (so copies overlap the resident layers'
 * compute), through the deepest ring that fits - up to DJ_RING_LAYERS of the
 * largest layer, fewer than the streamed layers - plus one tensor of slack
 * for the skip at the end. DJ_ENOSPC with the sizes when even the globals and
 * a ring of one layer do not fit. */
dj_status dj_placement_decide(const size_t *layer_bytes, uint32_t n_layers, size_t max_tensor, size_t global_bytes,
                              size_t room, dj_placement *out /* OUT */);
void dj_placement_free(dj_placement *p);

/* ---- a streaming model (stream.c) ---- */

struct dj_model;

/* Where the streamed weights are read from by the copies. */
typedef enum {
    DJ_STREAM_SRC_MAPPED,     /* the mapped checkpoint, host memory being the device's (CPU) */
    DJ_STREAM_SRC_REGISTERED, /* the mapped checkpoint, page-locked in place (host_register) */
    DJ_STREAM_SRC_PINNED_COPY /* a copy in page-locked host memory (host_alloc) */
} dj_stream_src;

typedef struct dj_model_stream {
    dj_backend_t *be;          /* borrowed: outlives the model (the VMU frees models first) */
    dj_placement pl;
    dj_ring_layout lay;
    uint8_t *ring;             /* [pl.ring_bytes] in the model's text region */
    /* A streamed layer is two loads: its attention tensors (layer_load), then its FFN tensors
     * (layer_ffn; -1 when it has none), so that a layer whose FFN the host computes copies
     * only the first at small batches. */
    int32_t *layer_load;       /* [n_layers] the first load of a streamed layer, -1: resident */
    int32_t *layer_ffn;        /* [n_layers] its FFN load, or -1 */
    uint32_t n_loads;
    dj_stream_load *loads;     /* [n_loads]; owned */
    dj_copy_span *spans;       /* every load's spans, concatenated; owned */
    dj_backend_ring_t *bring;  /* the backend's events; owned */
    dj_stream_src src;
    void **registered;         /* [n_registered] host ranges host_register'ed; owned */
    size_t n_registered;
    void *pinned;              /* DJ_STREAM_SRC_PINNED_COPY: the copy (host_alloc); owned */
    int32_t *call_load;        /* [call_cap] the step being built; owned */
    int32_t *call_layer;       /* [call_cap] the layer of each call (-1: none); owned */
    size_t call_cap;
    uint64_t steps, bytes;     /* streamed steps run, bytes they copied */
    /* Host compute (host_run.c): layers whose FFN the host runs at small batches. */
    uint8_t *host_layer;       /* [n_layers] 1: a streamed layer whose FFN the host computes; owned */
    uint32_t n_host;           /* such layers */
    uint32_t host_rows;        /* steps of at most this many rows use them; larger ones stream all */
    double copy_gbps, host_gbps; /* the rates measured at load that decided it (0: not measured) */
    dj_backend_t *host;        /* the CPU backend running them; owned */
    /* A share (host_run.c): the host computes the first share_cols columns of a host layer's FFN
     * width (gate and up rows, down columns) while the device computes the rest, copied into the
     * ring by the layer's share load, at the same time; 0: the whole FFN on the host. */
    uint32_t share_cols;
    uint8_t *share_layer;      /* [n_layers] 1: a host layer whose FFN takes the share; owned */
    dj_stream_load *share_loads; /* [n_loads] a share layer's FFN load: the device's columns only
                                  * (down's as a column slice); the other loads as loads[]; owned */
    dj_copy_span *share_spans; /* their spans; owned */
    dj_stream_load *step_loads; /* [n_loads] the step being built: share loads where it has share runs */
    size_t step_saved;         /* bytes the step being built does not copy (its host runs') */
    dj_host_run *runs;         /* [n_runs] the step being built; owned (capacity n_layers) */
    uint32_t n_runs;
    dj_op_call *run_calls;     /* [call_cap] their calls; owned */
    dj_copy_span *run_spans;   /* [2 call_cap] their in and out copies; owned */
    uint8_t *scratch;          /* [scratch_cap] host activations of a run (host_alloc'ed, or malloc'ed
                                * where the backend has no host_alloc); owned */
    size_t scratch_cap;
    uint64_t host_steps;       /* steps that ran host runs */
} dj_model_stream;

/* Decides whether model m (bound, weights not yet placed, not in place) must
 * stream in `room` text bytes: NULL *out and DJ_OK when it fits (then
 * m->text_bytes stays); else *out with the placement and m->text_bytes set to
 * the resident weights plus the ring. DJ_EUNSUPPORTED when the backend cannot
 * stream, DJ_ENOSPC when even streaming does not fit (with the sizes). */
dj_status dj__stream_plan(dj_backend_t *be, struct dj_model *m, size_t room, dj_model_stream **out /* OUT */);
/* True if weight slot `slot` of m streams (its bytes live in the ring). */
bool dj__stream_slot(const struct dj_model *m, int slot);
/* After the region exists: allocates the ring in it, lays the streamed
 * tensors out (their w[i].data now point into the ring, their copies read
 * m->ck, which m holds) and makes the backend's ring. */
dj_status dj__stream_setup(struct dj_model *m);
/* Once the resident weights are in (their uploads read the same mapping, and
 * a copy from a range only partly page-locked is refused): page-locks the
 * streamed tensors' pages in place, or copies them into pinned memory. */
dj_status dj__stream_source(struct dj_model *m);
void dj__stream_free(dj_model_stream *s); /* waits for copies in flight; NULL does nothing */
/* Room for the call map of a step of n calls. */
dj_status dj__stream_reserve(dj_model_stream *s, size_t n);
/* The load call c (of a node of `layer`) reads: a weight pointer of it in the
 * ring belongs to that layer's load; -1 when it reads none. */
int32_t dj__stream_call_load(const dj_model_stream *s, const dj_op_call *c, int layer);
/* The stream argument of a step whose call map s->call_load is filled (and
 * whose host runs dj__stream_host_runs made, if any). */
void dj__stream_step(dj_model_stream *s, bool prefetch, dj_stream_step *out /* OUT */);

/* ---- host compute beside the ring (host_run.c) ---- */

#define DJ_HOST_ROWS_FORCED 16 /* host_rows when the count of host layers is forced */
#define DJ_HOST_ROWS_MAX 64    /* the most rows a step with host runs may have */
/* A share's columns: a multiple of this (16-byte rows for the device), at
 * least this many fewer than the width. */
#define DJ_SHARE_GRAIN 16

/* Of n_streamed layers of layer_bytes each, ffn_bytes of them the FFN: how
 * many layers' FFNs the host reads (at host_gbps) so that the copies left
 * (at copy_gbps) and the host's work take the least time, the larger of the
 * two; the fewest on ties. 0 when a rate is not positive. */
uint32_t dj_host_count(uint32_t n_streamed, double layer_bytes, double ffn_bytes, double copy_gbps, double host_gbps);
/* Which streamed layers (pl->streamed) take the n host slots: spread evenly
 * over them. host[n_layers] receives 1 for each. */
void dj_host_spread(const dj_placement *pl, uint32_t n, uint8_t *host /* OUT */);
/* After dj__stream_setup, before dj__stream_source: decides host compute.
 * host_layers < 0: none; 0: from rates measured now (a streamed layer copied
 * from page-locked staging, its FFN run on the host at 1 and 8 rows) - none
 * on a backend whose device memory is the host's; k > 0: k layers (fewer if
 * fewer stream), host_rows DJ_HOST_ROWS_FORCED. host_share as the engine
 * option: 0 from the rates (a share that makes the host's part and the
 * device's copies take the same time; 1 when k is forced), else that share.
 * (A copy of the host layers' FFN tensors into 2 MiB pages was measured on
 * the H100 machine: no faster than the mapping's pages, so they are read in
 * place.) */
dj_status dj__stream_host_setup(struct dj_model *m, int host_layers, double host_share);
/* Of an FFN width of `width` columns, the host's share: share * width rounded
 * to DJ_SHARE_GRAIN; 0 (the whole FFN) when that leaves the device less than
 * DJ_SHARE_GRAIN, or the width is not a multiple of it; never below the grain. */
uint32_t dj_share_cols(double share, uint32_t width);
/* At the end of dj__stream_source (the spans read their final host source):
 * the share loads of the share layers. */
dj_status dj__stream_share_setup(struct dj_model *m);
/* For a step of n_rows rows whose calls[0..n_calls) and s->call_load /
 * s->call_layer are built: when n_rows <= s->host_rows, each host layer's FFN
 * (its calls reading the FFN load, through the residual ADD after them)
 * becomes a host run - rewritten into s->run_calls. A whole one: its
 * call_load set to -1. A share (a share layer whose FFN is norm, gate, up,
 * GLU, down, ADD): the host's calls take the first share_cols columns, the
 * device's calls in `calls` are narrowed to the rest (read from the share
 * load) and their ADD reads the host's result where it lies, in the host
 * scratch (page-locked: the device reads it over the bus, no copy queued
 * behind the weight copies). A layer whose FFN has neither shape
 * streams instead. Sets s->n_runs, s->step_loads and s->step_saved. */
dj_status dj__stream_host_runs(dj_model_stream *s, dj_op_call *calls, size_t n_calls, uint32_t n_rows);

#endif
