/* model_graph.h: the graph builder's face - a loaded model's handle and the
 * SRG of one step of it (src/model/blocks.c), for the engine, planner and tests. */
#ifndef DJ_MODEL_GRAPH_H
#define DJ_MODEL_GRAPH_H

#include <stdint.h>

#include "djinn/checkpoint.h"
#include "djinn/graph.h"
#include "djinn/status.h"

/* A model loaded into the text segment (struct dj_model: model_impl.h);
 * engine.h names it too. */
typedef struct dj_model dj_model_t;

/* Build the SRG of one step of the model for `bucket` token rows (weights
 * bound when m is not NULL). Exposed for the planner, info and tests. */
dj_status dj_model_build_graph(const dj_model_config *cfg, const dj_model_t *m, dj_phase phase,
                               uint32_t bucket, dj_graph_t **out /* OUT */);
/* The same with flags: DJ_GRAPH_ALL_LOGITS makes a prefill graph output the
 * logits of every row ([bucket][vocab] f32) instead of the last row's. */
#define DJ_GRAPH_ALL_LOGITS 1u
dj_status dj_model_build_graph_opts(const dj_model_config *cfg, const dj_model_t *m, dj_phase phase,
                                    uint32_t bucket, unsigned flags, dj_graph_t **out /* OUT */);

#endif
