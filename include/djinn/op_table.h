/* op_table.h: the op descriptor table - for each op of DJ_OP_LIST (backend.h)
 * what its node sources become in a dj_op_call, the element types it reads and
 * writes and its row widths. The executor (engine.c's run_nodes), host runs
 * (host_run.c) and the backends' argument checks (backend.c) read it instead
 * of repeating per-op knowledge; what an op computes stays code (the kernel
 * dispatch switches, each checked at build time by -Werror=switch).
 *
 * Adding an op: its X entry and contract line in DJ_OP_LIST (backend.h, with
 * any dj_op_call field it needs) and a DJ_OP_DESC_<NAME> row below; the build
 * then fails (op_table.c is generated from DJ_OP_LIST, the switches are built
 * with -Werror=switch) until it has its case in dj__op_call_check
 * (src/backend/backend.c), cpu_compute (src/backend/cpu/cpu_backend.c, with
 * its kernel), dj__cuda_compute_one (src/backend/cuda/cuda_backend.cu, with a
 * kernel .cu) and in_bytes / out_bytes (src/backend/cuda/cuda_plan.cu). The
 * graph builder (src/model/blocks.c) emits it; engine.c's resolve_call needs
 * a line only for what no column here says. */
#ifndef DJINN_OP_TABLE_H
#define DJINN_OP_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "djinn/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What node source k (dj_node.src[k]) of an op becomes in its call. */
typedef enum {
    DJ_OPD_SRC_NONE = 0, /* unused (-1) */
    DJ_OPD_SRC_IDS,      /* the token ids input: the call takes the step's ids (ids / ids_dev) */
    DJ_OPD_SRC_X,        /* x */
    DJ_OPD_SRC_X2,       /* x2 (always the backend's act_dtype) */
    DJ_OPD_SRC_W,        /* w and w_dtype (an f8_e4m3 weight also brings its slot's scales) */
    DJ_OPD_SRC_BIAS,     /* bias and bias_dtype (NULL where the source is -1) */
    DJ_OPD_SRC_INV_FREQ, /* inv_freq */
    DJ_OPD_SRC_ROUTE,    /* route (f32) */
    DJ_OPD_SRC_AFTER     /* nothing read: an ordering edge (ATTENTION after its KV_WRITE) */
} dj_opd_src;

/* The element type of x (and of nothing else: x2 is act_dtype). */
typedef enum {
    DJ_OPD_X_NONE = 0, /* no x (EMBED reads ids) */
    DJ_OPD_X_ACT,      /* act_dtype */
    DJ_OPD_X_RES,      /* act_dtype or f32 (the residual stream), as the call's x_dtype says */
    DJ_OPD_X_F32       /* f32 (the logits) */
} dj_opd_x;

/* The element type of out. The executor writes: f32 for the plan's output
 * node and F32 ops, res_dtype for RES ops, act_dtype for the rest. */
typedef enum {
    DJ_OPD_OUT_NONE = 0,   /* no activation output (KV_WRITE writes pages) */
    DJ_OPD_OUT_ACT,        /* act_dtype only */
    DJ_OPD_OUT_ACT_OR_F32, /* act_dtype, or f32 where it is the logits */
    DJ_OPD_OUT_RES,        /* act_dtype or f32: the residual stream (res_dtype) */
    DJ_OPD_OUT_F32         /* f32 only */
} dj_opd_out;

/* Elements per token row of an output or input (dj_op_width). */
typedef enum {
    DJ_OPD_WIDTH_NONE = 0, /* none: 0 */
    DJ_OPD_WIDTH_D,        /* d */
    DJ_OPD_WIDTH_GROUPS_D, /* groups * d (groups 0 = 1) */
    DJ_OPD_WIDTH_M,        /* m */
    DJ_OPD_WIDTH_K,        /* k */
    DJ_OPD_WIDTH_HEADS,    /* n_heads * head_dim */
    DJ_OPD_WIDTH_KV_DIM    /* kv->kv_dim (0 without a view) */
} dj_opd_width;

/* dj_op_desc.flags */
#define DJ_OPD_ROW_POS 1u  /* reads the step's per-row positions (row_pos) */
#define DJ_OPD_KV 2u       /* reads or writes the session's K/V (kv, per-row row_tables) */
#define DJ_OPD_LAST_ROW 4u /* DJ_NODE_LAST_ROW cuts its call to the node's shape[0] rows */
#define DJ_OPD_HOST 8u     /* a host run (host_run.c) may take it */

#define DJ_OPD_MAX_SRC 4 /* = DJ_GRAPH_MAX_SRC */

typedef struct dj_op_desc {
    const char *name;                  /* as dj_op_name */
    uint8_t n_src;                     /* arity: the node sources the builder gives */
    uint8_t src[DJ_OPD_MAX_SRC];       /* dj_opd_src of node source k */
    uint8_t x;                         /* dj_opd_x */
    uint8_t out;                       /* dj_opd_out */
    uint8_t out_width;                 /* dj_opd_width of out */
    uint8_t x_width;                   /* dj_opd_width of x and x2 */
    unsigned flags;                    /* DJ_OPD_* above */
} dj_op_desc;

/* One row per op, named DJ_OP_DESC_<op>:
 * {name, arity, {sources}, x, out, out width, x width, flags}. */
#define DJ_OP_DESC_EMBED                                                                                   \
    {"embed", 2, {DJ_OPD_SRC_IDS, DJ_OPD_SRC_W}, DJ_OPD_X_NONE, DJ_OPD_OUT_RES, DJ_OPD_WIDTH_D,           \
     DJ_OPD_WIDTH_NONE, 0}
#define DJ_OP_DESC_RMSNORM                                                                                 \
    {"rmsnorm", 2, {DJ_OPD_SRC_X, DJ_OPD_SRC_W}, DJ_OPD_X_RES, DJ_OPD_OUT_ACT, DJ_OPD_WIDTH_GROUPS_D,     \
     DJ_OPD_WIDTH_GROUPS_D, DJ_OPD_HOST}
#define DJ_OP_DESC_MATMUL                                                                                  \
    {"matmul", 3, {DJ_OPD_SRC_X, DJ_OPD_SRC_W, DJ_OPD_SRC_BIAS}, DJ_OPD_X_ACT, DJ_OPD_OUT_ACT_OR_F32,     \
     DJ_OPD_WIDTH_M, DJ_OPD_WIDTH_K, DJ_OPD_LAST_ROW | DJ_OPD_HOST}
#define DJ_OP_DESC_ROPE                                                                                    \
    {"rope", 2, {DJ_OPD_SRC_X, DJ_OPD_SRC_INV_FREQ}, DJ_OPD_X_ACT, DJ_OPD_OUT_ACT, DJ_OPD_WIDTH_HEADS,    \
     DJ_OPD_WIDTH_HEADS, DJ_OPD_ROW_POS}
#define DJ_OP_DESC_KV_WRITE                                                                                \
    {"kv_write", 2, {DJ_OPD_SRC_X, DJ_OPD_SRC_X2}, DJ_OPD_X_ACT, DJ_OPD_OUT_NONE, DJ_OPD_WIDTH_NONE,      \
     DJ_OPD_WIDTH_KV_DIM, DJ_OPD_ROW_POS | DJ_OPD_KV}
#define DJ_OP_DESC_ATTENTION                                                                               \
    {"attention", 2, {DJ_OPD_SRC_X, DJ_OPD_SRC_AFTER}, DJ_OPD_X_ACT, DJ_OPD_OUT_ACT, DJ_OPD_WIDTH_HEADS,  \
     DJ_OPD_WIDTH_HEADS, DJ_OPD_ROW_POS | DJ_OPD_KV}
#define DJ_OP_DESC_SILU_MUL                                                                                \
    {"silu_mul", 2, {DJ_OPD_SRC_X, DJ_OPD_SRC_X2}, DJ_OPD_X_ACT, DJ_OPD_OUT_ACT, DJ_OPD_WIDTH_D,          \
     DJ_OPD_WIDTH_D, DJ_OPD_HOST}
#define DJ_OP_DESC_ADD                                                                                     \
    {"add", 2, {DJ_OPD_SRC_X, DJ_OPD_SRC_X2}, DJ_OPD_X_RES, DJ_OPD_OUT_RES, DJ_OPD_WIDTH_D, DJ_OPD_WIDTH_D, \
     DJ_OPD_HOST}
#define DJ_OP_DESC_GELU_MUL                                                                                \
    {"gelu_mul", 2, {DJ_OPD_SRC_X, DJ_OPD_SRC_X2}, DJ_OPD_X_ACT, DJ_OPD_OUT_ACT, DJ_OPD_WIDTH_D,          \
     DJ_OPD_WIDTH_D, DJ_OPD_HOST}
#define DJ_OP_DESC_SOFTCAP                                                                                 \
    {"softcap", 1, {DJ_OPD_SRC_X}, DJ_OPD_X_F32, DJ_OPD_OUT_F32, DJ_OPD_WIDTH_D, DJ_OPD_WIDTH_D,          \
     DJ_OPD_LAST_ROW}
#define DJ_OP_DESC_MOE_ROUTE                                                                               \
    {"moe_route", 1, {DJ_OPD_SRC_X}, DJ_OPD_X_ACT, DJ_OPD_OUT_F32, DJ_OPD_WIDTH_M, DJ_OPD_WIDTH_M,        \
     DJ_OPD_HOST}
#define DJ_OP_DESC_MOE_FFN                                                                                 \
    {"moe_ffn", 4, {DJ_OPD_SRC_X, DJ_OPD_SRC_X2, DJ_OPD_SRC_ROUTE, DJ_OPD_SRC_W}, DJ_OPD_X_ACT,           \
     DJ_OPD_OUT_ACT, DJ_OPD_WIDTH_K, DJ_OPD_WIDTH_K, DJ_OPD_HOST}
/* LORA is no graph node (arity 0): the executor adds its calls after the
 * MATMULs an adapter of the step targets (src/exec/lora.c). */
#define DJ_OP_DESC_LORA                                                                                    \
    {"lora", 0, {DJ_OPD_SRC_NONE}, DJ_OPD_X_ACT, DJ_OPD_OUT_ACT, DJ_OPD_WIDTH_M, DJ_OPD_WIDTH_K, 0}

/* [DJ_OP_COUNT], in dj_op order (src/backend/op_table.c). */
extern const dj_op_desc dj_op_descs[DJ_OP_COUNT];

/* The row of op; NULL for DJ_OP_COUNT (inputs and weights) or anything past it. */
static inline const dj_op_desc *dj_op_desc_of(dj_op op) {
    return (unsigned)op < (unsigned)DJ_OP_COUNT ? &dj_op_descs[op] : (const dj_op_desc *)0;
}

/* Elements per token row that width w names for call c. */
size_t dj_op_width(const dj_op_call *c, dj_opd_width w);

/* The element type of c's x on a backend of act_dtype act (dj_opd_x; act
 * where there is no x). */
dj_dtype dj_op_x_dtype(const dj_op_call *c, dj_dtype act);

#ifdef __cplusplus
}
#endif

#endif
