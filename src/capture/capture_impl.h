/* capture_impl.h: the private structs of captured graphs (capture.h) - the op table, values,
 * nodes and their plan - and the bounds-checked msgpack reader the decoder uses. */
#ifndef DJ_CAPTURE_IMPL_H
#define DJ_CAPTURE_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/backend.h"
#include "djinn/capture.h"

/* Every op: X(ENUM, "aten overload", number of schema arguments, number of outputs; 0 = a list
 * whose length the op's arguments give, at most DJ_CGRAPH_MAX_OUTS). The arguments are the
 * schema's, in order, defaults filled in by the client (docs/protocol.md). */
#define DJ_COP_LIST(X)                                                        \
    X(ADDMM, "aten.addmm.default", 5, 1)                                      \
    X(MM, "aten.mm.default", 2, 1)                                            \
    X(BMM, "aten.bmm.default", 2, 1)                                          \
    X(LINEAR, "aten.linear.default", 3, 1)                                    \
    X(ADD_T, "aten.add.Tensor", 3, 1)                                         \
    X(ADD_S, "aten.add.Scalar", 3, 1)                                         \
    X(SUB_T, "aten.sub.Tensor", 3, 1)                                         \
    X(SUB_S, "aten.sub.Scalar", 3, 1)                                         \
    X(MUL_T, "aten.mul.Tensor", 2, 1)                                         \
    X(MUL_S, "aten.mul.Scalar", 2, 1)                                         \
    X(DIV_T, "aten.div.Tensor", 2, 1)                                         \
    X(DIV_S, "aten.div.Scalar", 2, 1)                                         \
    X(GT_T, "aten.gt.Tensor", 2, 1)                                           \
    X(GT_S, "aten.gt.Scalar", 2, 1)                                           \
    X(LT_T, "aten.lt.Tensor", 2, 1)                                           \
    X(LT_S, "aten.lt.Scalar", 2, 1)                                           \
    X(GE_S, "aten.ge.Scalar", 2, 1)                                           \
    X(LE_S, "aten.le.Scalar", 2, 1)                                           \
    X(RELU, "aten.relu.default", 1, 1)                                        \
    X(GELU, "aten.gelu.default", 2, 1)                                        \
    X(SILU, "aten.silu.default", 1, 1)                                        \
    X(SIGMOID, "aten.sigmoid.default", 1, 1)                                  \
    X(TANH, "aten.tanh.default", 1, 1)                                        \
    X(NEG, "aten.neg.default", 1, 1)                                          \
    X(EXP, "aten.exp.default", 1, 1)                                          \
    X(HARDTANH, "aten.hardtanh.default", 3, 1)                                \
    X(CONV, "aten.convolution.default", 9, 1)                                 \
    X(MAXPOOL_IDX, "aten.max_pool2d_with_indices.default", 6, 2)              \
    X(MAXPOOL, "aten.max_pool2d.default", 6, 1)                               \
    X(AVGPOOL, "aten.avg_pool2d.default", 7, 1)                               \
    X(ADAPTIVE_AVG, "aten._adaptive_avg_pool2d.default", 2, 1)                \
    X(ADAPTIVE_AVG2, "aten.adaptive_avg_pool2d.default", 2, 1)                \
    X(BATCH_NORM, "aten.native_batch_norm.default", 8, 3)                     \
    X(BATCH_NORM_EVAL, "aten._native_batch_norm_legit_no_training.default", 7, 3) \
    X(LAYER_NORM, "aten.native_layer_norm.default", 5, 3)                     \
    X(SOFTMAX, "aten._softmax.default", 3, 1)                                 \
    X(LOG_SOFTMAX, "aten._log_softmax.default", 3, 1)                         \
    X(VIEW, "aten.view.default", 2, 1)                                        \
    X(RESHAPE, "aten.reshape.default", 2, 1)                                  \
    X(UNSAFE_VIEW, "aten._unsafe_view.default", 2, 1)                         \
    X(RESHAPE_ALIAS, "aten._reshape_alias.default", 3, 1)                     \
    X(FLATTEN, "aten.flatten.using_ints", 3, 1)                               \
    X(UNSQUEEZE, "aten.unsqueeze.default", 2, 1)                              \
    X(SQUEEZE_DIM, "aten.squeeze.dim", 2, 1)                                  \
    X(PERMUTE, "aten.permute.default", 2, 1)                                  \
    X(TRANSPOSE, "aten.transpose.int", 3, 1)                                  \
    X(T, "aten.t.default", 1, 1)                                              \
    X(SLICE, "aten.slice.Tensor", 5, 1)                                       \
    X(SELECT, "aten.select.int", 3, 1)                                        \
    X(EXPAND, "aten.expand.default", 3, 1)                                    \
    X(CLONE, "aten.clone.default", 2, 1)                                      \
    X(DETACH, "aten.detach.default", 1, 1)                                    \
    X(ALIAS, "aten.alias.default", 1, 1)                                      \
    X(MEAN_DIM, "aten.mean.dim", 4, 1)                                        \
    X(SUM_DIM, "aten.sum.dim_IntList", 4, 1)                                  \
    X(MEAN, "aten.mean.default", 2, 1)                                        \
    X(SUM, "aten.sum.default", 2, 1)                                          \
    X(CAT, "aten.cat.default", 2, 1)                                          \
    X(EQ_T, "aten.eq.Tensor", 2, 1)                                           \
    X(EQ_S, "aten.eq.Scalar", 2, 1)                                           \
    X(NE_T, "aten.ne.Tensor", 2, 1)                                           \
    X(NE_S, "aten.ne.Scalar", 2, 1)                                           \
    X(GE_T, "aten.ge.Tensor", 2, 1)                                           \
    X(LE_T, "aten.le.Tensor", 2, 1)                                           \
    X(POW_TS, "aten.pow.Tensor_Scalar", 2, 1)                                 \
    X(POW_TT, "aten.pow.Tensor_Tensor", 2, 1)                                 \
    X(SQRT, "aten.sqrt.default", 1, 1)                                        \
    X(RSQRT, "aten.rsqrt.default", 1, 1)                                      \
    X(ABS, "aten.abs.default", 1, 1)                                          \
    X(LOG, "aten.log.default", 1, 1)                                          \
    X(ERF, "aten.erf.default", 1, 1)                                          \
    X(WHERE, "aten.where.self", 3, 1)                                         \
    X(MASKED_FILL_S, "aten.masked_fill.Scalar", 3, 1)                         \
    X(MASKED_FILL_T, "aten.masked_fill.Tensor", 3, 1)                         \
    X(TO_COPY, "aten._to_copy.default", 7, 1)                                 \
    X(ZEROS_LIKE, "aten.zeros_like.default", 6, 1)                            \
    X(ONES_LIKE, "aten.ones_like.default", 6, 1)                              \
    X(FULL_LIKE, "aten.full_like.default", 7, 1)                              \
    X(ARANGE, "aten.arange.default", 5, 1)                                    \
    X(ARANGE_START, "aten.arange.start", 6, 1)                                \
    X(ARANGE_STEP, "aten.arange.start_step", 7, 1)                            \
    X(ZEROS, "aten.zeros.default", 5, 1)                                      \
    X(ONES, "aten.ones.default", 5, 1)                                        \
    X(FULL, "aten.full.default", 6, 1)                                        \
    X(EMBEDDING, "aten.embedding.default", 5, 1)                              \
    X(BADDBMM, "aten.baddbmm.default", 5, 1)                                  \
    X(GROUP_NORM, "aten.native_group_norm.default", 8, 3)                     \
    X(UP_NEAREST, "aten.upsample_nearest2d.vec", 3, 1)                        \
    X(UP_BILINEAR, "aten.upsample_bilinear2d.vec", 4, 1)                      \
    X(VAR, "aten.var.correction", 4, 1)                                       \
    X(AMAX, "aten.amax.default", 3, 1)                                        \
    X(AMIN, "aten.amin.default", 3, 1)                                        \
    X(ARGMAX, "aten.argmax.default", 3, 1)                                    \
    X(LOGSUMEXP, "aten.logsumexp.default", 3, 1)                              \
    X(NORM, "aten.norm.ScalarOpt_dim", 4, 1)                                  \
    X(VNORM, "aten.linalg_vector_norm.default", 5, 1)                         \
    X(STACK, "aten.stack.default", 2, 1)                                      \
    X(GATHER, "aten.gather.default", 4, 1)                                    \
    X(INDEX_SELECT, "aten.index_select.default", 3, 1)                        \
    X(SPLIT, "aten.split.Tensor", 3, 0)                                       \
    X(SPLIT_SIZES, "aten.split_with_sizes.default", 3, 0)                     \
    X(UNBIND, "aten.unbind.int", 2, 0)                                        \
    X(TOPK, "aten.topk.default", 5, 2)                                        \
    X(RSUB_S, "aten.rsub.Scalar", 3, 1)                                       \
    X(MAX_DIM, "aten.max.dim", 3, 2)                                          \
    X(MIN_DIM, "aten.min.dim", 3, 2)                                          \
    X(CUMSUM, "aten.cumsum.default", 3, 1)                                    \
    X(TRIL, "aten.tril.default", 2, 1)                                        \
    X(TRIU, "aten.triu.default", 2, 1)                                        \
    X(FLIP, "aten.flip.default", 2, 1)                                        \
    X(SORT, "aten.sort.default", 3, 2)                                        \
    X(SORT_STABLE, "aten.sort.stable", 4, 2)                                  \
    X(INDEX, "aten.index.Tensor", 2, 1)                                       \
    X(SDPA, "aten._scaled_dot_product_attention_forward.default", 7, 2)

typedef enum {
#define DJ__COP_ENUM(e, name, na, no) DJ_COP_##e,
    DJ_COP_LIST(DJ__COP_ENUM)
#undef DJ__COP_ENUM
    DJ_COP_COUNT
} dj__cop;

#define DJ_CG_MAX_ARGS 9

/* A value: an input, a weight or one output of a node. */
typedef struct dj__cval {
    dj_ctensor_info t;
    uint64_t offset;  /* bytes into the stack (node outputs only) */
    int32_t last_use; /* the last node reading it; INT32_MAX for graph outputs */
} dj__cval;

typedef enum { DJ_CARG_NONE, DJ_CARG_BOOL, DJ_CARG_INT, DJ_CARG_FLOAT, DJ_CARG_STR, DJ_CARG_INTS,
               DJ_CARG_TENSOR, DJ_CARG_TENSORS, DJ_CARG_FLOATS } dj__carg_kind;

#define DJ_CARG_HOLE UINT32_MAX

typedef struct dj__carg {
    dj__carg_kind kind;
    int64_t i;        /* INT, BOOL (0/1) */
    double f;         /* FLOAT (INT too, converted) */
    uint32_t v;       /* TENSOR: the value id */
    uint32_t n;       /* INTS, TENSORS: count */
    int64_t *ints;    /* [n] INTS */
    uint32_t *vals;   /* [n] TENSORS: value ids; DJ_CARG_HOLE for a None (index.Tensor's Tensor?[]) */
    bool holes;       /* TENSORS: some entry is DJ_CARG_HOLE (only index.Tensor takes such a list) */
    double *fls;      /* [n] FLOATS (upsample's scale factors) */
    char str[24];     /* STR (truncated; only short enums are read: gelu's "tanh"/"none", dtype names) */
} dj__carg;

typedef struct dj__cnode {
    dj__cop op;
    uint32_t n_args;
    dj__carg args[DJ_CG_MAX_ARGS];
    uint32_t *out;                /* [n_out] value ids of the outputs (consecutive) */
    uint32_t n_out;
    bool live;                    /* some graph output depends on it */
    uint64_t scratch_off;         /* bytes into the stack of its scratch (conv columns) */
    uint64_t scratch_bytes;
    bool mat2_t;                  /* addmm/mm: the second matrix is t() of mat2_src ([m,k]: GEMM rows) */
    uint32_t mat2_src;            /* addmm/mm: the value read as the second matrix */
} dj__cnode;

struct dj_cgraph {
    uint32_t n_inputs, n_weights, n_nodes, n_outputs;
    uint32_t n_vals;              /* inputs, then weights, then node outputs */
    uint32_t cap_vals;            /* vals allocated (grows while nodes are read) */
    dj__cval *vals;               /* [n_vals] */
    dj__cnode *nodes;             /* [n_nodes] */
    uint32_t *outputs;            /* [n_outputs] value ids */
    uint8_t (*hashes)[32];        /* [n_weights] */
    uint8_t *hash_len;            /* [n_weights] */
    char (*names)[96];            /* [n_weights] */
    size_t stack_bytes;
};

extern const char *const dj__cop_names[DJ_COP_COUNT];

/* aten.slice's bounds on a dim of `size`: start and end (INT64_MAX when none) wrapped when
 * negative and clamped to [0, size]; *len the elements taken with step (> 0). */
static inline void dj__slice_bounds(int64_t size, int64_t start, int64_t end, int64_t step, int64_t *first,
                                    int64_t *len) {
    if (start < 0) start += size;
    if (end < 0) end += size;
    start = start < 0 ? 0 : start > size ? size : start;
    end = end < start ? start : end > size ? size : end;
    *first = start;
    *len = end > start ? (end - start - 1) / step + 1 : 0; /* no overflow for any step from the wire */
}

/* ---- the msgpack reader: never reads past end, never trusts a count ---- */
typedef struct dj__mp {
    const uint8_t *p, *end;
} dj__mp;

typedef enum { DJ_MP_NIL, DJ_MP_BOOL, DJ_MP_INT, DJ_MP_FLOAT, DJ_MP_STR, DJ_MP_BIN, DJ_MP_ARRAY, DJ_MP_MAP,
               DJ_MP_BAD } dj__mp_type;

dj__mp_type dj__mp_peek(const dj__mp *m);
bool dj__mp_nil(dj__mp *m);
bool dj__mp_bool(dj__mp *m, bool *v);
bool dj__mp_int(dj__mp *m, int64_t *v);  /* uint64 above INT64_MAX: false */
bool dj__mp_float(dj__mp *m, double *v); /* float32/64 */
bool dj__mp_str(dj__mp *m, const char **s, uint32_t *n);
bool dj__mp_bin(dj__mp *m, const uint8_t **s, uint32_t *n);
/* Counts are checked against the bytes left (each element takes one byte at least). */
bool dj__mp_array(dj__mp *m, uint32_t *n);
bool dj__mp_map(dj__mp *m, uint32_t *n);
bool dj__mp_skip(dj__mp *m, int depth); /* one whole value, nesting at most depth */

#endif
