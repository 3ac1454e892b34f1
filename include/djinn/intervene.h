/* intervene.h: interventions inside one step - named points of the forward
 * pass saved (copied out as f32) or changed (an f32 vector or tensor added or
 * written in) while the step runs, the plan split into segments there. */
#ifndef DJINN_INTERVENE_H
#define DJINN_INTERVENE_H

#include <stddef.h>
#include <stdint.h>

#include "djinn/engine.h"

/* Points, each [n][hidden_size] for a step of n tokens (the names as the
 * protocol and the Python package spell them):
 *   layers.{i}.input        the residual stream entering decoder layer i
 *                           (the embedding for i = 0) = transformers'
 *                           output_hidden_states[i]
 *   layers.{i}.attn.output  the attention block's output (o_proj, before the
 *                           post-attention norm where the model has one) =
 *                           a forward hook's output on layers[i].self_attn
 *   layers.{i}.mlp.output   the MLP (or MoE) block's output = a hook on
 *                           layers[i].mlp
 *   layers.{i}.output       the residual stream leaving layer i (=
 *                           layers.{i+1}.input)
 *   final_norm.output       after the final norm = output_hidden_states[-1] */
typedef enum {
    DJ_POINT_LAYER_INPUT = 0,
    DJ_POINT_ATTN_OUTPUT,
    DJ_POINT_MLP_OUTPUT,
    DJ_POINT_LAYER_OUTPUT,
    DJ_POINT_FINAL_NORM
} dj_point_kind;

typedef struct dj_point {
    dj_point_kind kind;
    uint32_t layer; /* 0 for final_norm.output */
} dj_point;

/* name[0..len) (not NUL-terminated) -> *out. DJ_EINVAL naming the problem
 * for an unknown name and DJ_ERANGE for a layer >= n_layers. */
dj_status dj_point_parse(const char *name, size_t len, uint32_t n_layers, dj_point *out /* OUT */);
/* The point's name into buf (cut to cap); returns buf. */
const char *dj_point_name(dj_point p, char *buf, size_t cap);

typedef enum {
    DJ_IV_SAVE = 0, /* out[n][hidden] receives the activation */
    DJ_IV_ADD,      /* activation += data (each of its rows, or its one row to every row) */
    DJ_IV_REPLACE,  /* activation = data (likewise) */
    DJ_IV_MUL,      /* activation *= data (likewise): scaling, `x[:, 3] *= 0` */
    DJ_IV_BREAK     /* the step stops here (dj_session_step_break): out[n][hidden] receives the
                     * activation; what the caller leaves there is the point's value on resume */
} dj_iv_op;

/* At most this many interventions in one step. */
#define DJ_IV_MAX 64

typedef struct dj_intervention {
    dj_point point;
    dj_iv_op op;
    const float *data; /* ADD/REPLACE/MUL: [rows][width] f32, host memory, read during the call */
    uint32_t rows;     /* ADD/REPLACE/MUL: 1 (every position of the region) or the region's height */
    /* ADD/REPLACE/MUL: the region edited - positions [r0, r1) (r1 0: all n)
     * and hidden units [c0, c1) (c1 0: all; width = c1 - c0, else hidden).
     * All zero: the whole point, as before regions were. */
    uint32_t r0, r1, c0, c1;
    float *out;        /* SAVE: [n][hidden] f32, host memory */
} dj_intervention;

/* One step of n ids (1 <= n <= dj_engine_max_step_tokens) that runs iv[0..n_iv)
 * where their points are computed: the plan is split after each point's node,
 * the interventions of one point run in the order given (a SAVE listed
 * after an ADD of the same point sees the sum; layers.{i}.output and
 * layers.{i+1}.input are one point), and what they write is what the rest
 * of the step - and the KV cache it fills - reads. A point with only saves
 * costs one device-to-device copy of its activation, in stream order (the
 * step does not wait for it), into the engine's trace area (device memory
 * beside the VMU's, kept and grown to the largest step's need: at most 8
 * points of [max_step_tokens][hidden]; further points, or all of them when
 * the area cannot grow, go through the host as edits do); the copies reach
 * the `out` buffers (widened
 * to f32 on every host core, dj_dtype_widen_f32) by the time the call returns - a prefill chunk's on the device's
 * copy stream while the rest of the step runs. A decode step whose points
 * are all saves replays a recorded graph with the copies in it. A point
 * with an edit goes through the host (the step waits for the device; the
 * activation comes down, the edits apply in f32, it goes back up in the
 * backend's activation dtype), and its step runs without a graph.
 * logits (optional) receives the last position's [vocab]. Validates every
 * intervention before anything runs (DJ_EINVAL / DJ_ERANGE with the index);
 * all or nothing as dj_session_step. n_iv 0 is dj_session_step. */
dj_status dj_session_step_trace(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                const dj_intervention *iv, uint32_t n_iv, float *logits /* OUT, [vocab] or NULL */);

/* ---- breakpoints: a step stopped at points, resumed or cancelled ---- */

/* A paused step (opaque): it holds its session, which takes no other step
 * until it is resumed to its end or cancelled. */
typedef struct dj_step_brk dj_step_brk_t;

/* As dj_session_step_trace, with DJ_IV_BREAK interventions (at most one a
 * point; layers.{i}.output and layers.{i+1}.input are one): the step
 * (always one prefill chunk, 1 <= n <= max_step_tokens) runs to its first
 * BREAK - the interventions of that point listed before it applied - and
 * stops: the BREAK's `out` holds the point's value, the activations the
 * rest of the step reads are copied off the activation stack into host
 * memory the paused step owns, the stack is free for other steps, and the
 * session's position stays. *out is then the paused step; NULL when it ran
 * to its end (no BREAK, or a failure: all or nothing as dj_session_step).
 * Every stop of such a step goes through the host (no device copies, no
 * recorded graph). A model that streams weights is refused
 * (DJ_EUNSUPPORTED) before anything runs. iv (and the tensors it points at)
 * stay the caller's and must stay valid until the step ends. */
dj_status dj_session_step_break(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                const dj_intervention *iv, uint32_t n_iv, float *logits /* OUT, [vocab] or NULL */,
                                dj_step_brk_t **out /* OUT */);
typedef struct dj_step_brk_stats {
    uint64_t held_bytes;    /* activations kept off the stack */
    uint32_t live;          /* of how many plan nodes */
    double save_s;          /* the last pause's copy off the stack (wall) */
    double restore_s;       /* the last resume's copy back (wall; 0 before one) */
} dj_step_brk_stats;
/* The index into iv of the BREAK the step stopped at. */
uint32_t dj_step_brk_at(const dj_step_brk_t *b);
/* Runs on: the BREAK's `out` (changed or not) is the point's value, then
 * the point's interventions after it, and the step to its next BREAK (*b
 * stays, dj_step_brk_at says which) or its end (*b freed and NULL; logits
 * written, the session advanced by n). On failure the step is cancelled
 * (as dj_step_brk_cancel) and *b is NULL. Without changes, the logits and
 * KV are bit-identical to the step run without breakpoints. */
dj_status dj_step_brk_resume(dj_engine_t *e, dj_step_brk_t **b, float *logits /* OUT, [vocab] or NULL */,
                             dj_step_brk_stats *stats /* OUT or NULL: the step's figures after this run */);
/* Drops a paused step: the KV pages it mapped are returned and the session
 * is as it was before the step (its next step's logits equal a session's
 * that never saw it). NULL does nothing. */
void dj_step_brk_cancel(dj_engine_t *e, dj_step_brk_t *b);

void dj_step_brk_info(const dj_step_brk_t *b, dj_step_brk_stats *out /* OUT */);

/* dst[0..k) = src's k elements of type t (f32, f16 or bf16) as f32, exactly;
 * large arrays (1M elements and more) on every core (OpenMP): a saved
 * activation of a 512-token step widened on the critical path (widen.c). */
void dj_dtype_widen_f32(dj_dtype t, const void *src, float *dst, size_t k);

#endif
