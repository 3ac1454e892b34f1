/* capture.h: graphs of ATen ops captured from a PyTorch module (python/djinn/capture.py)
 * - decoded from their msgpack form, validated, planned onto one stack, run on the CPU in f32.
 *
 * A captured graph (docs/protocol.md, "Captured graphs") lists its inputs, its weights (by
 * content hash), and its nodes in execution order, each an ATen overload ("aten.addmm.default")
 * with every argument of the schema in order and the shapes and dtypes PyTorch gave its outputs.
 * dj_cgraph_decode checks all of it before anything runs: the op is one we know, its arity,
 * every reference points at an earlier value (a later one would be a cycle), the shapes and
 * dtypes it declares are the ones we infer, no size overflows, and the node count and the
 * planned stack stay under the limits. Every refusal is a dj_status with a dj_cgraph_error
 * naming the kind, the node and its op (also in dj_last_error()).
 *
 * The plan: values are live from the node that makes them to their last reader (graph outputs
 * to the end); each is placed at an offset of one stack buffer by first fit, so a run allocates
 * nothing. All values are stored as f32 (bool as 0/1, i64 as its value: exact below 2^24);
 * the declared dtype is what outputs are converted to by the caller. */
#ifndef DJINN_CAPTURE_H
#define DJINN_CAPTURE_H

#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"

/* backend.h's handle (a CPU backend runs a graph), named without the backend
 * interface itself. */
typedef struct dj_backend dj_backend_t;

#define DJ_CGRAPH_MAX_RANK 8
#define DJ_CGRAPH_MAX_OUTS 256 /* outputs of one node (split, chunk, unbind give a list) */

/* Every kind of refusal: X(NAME, status). */
#define DJ_CGRAPH_ERR_MAP(X)                                                                          \
    X(NONE, DJ_OK)                /* no error */                                                      \
    X(FORMAT, DJ_EFORMAT)         /* not the documented msgpack schema */                             \
    X(UNKNOWN_OP, DJ_EUNSUPPORTED) /* an op name the executor does not have */                        \
    X(ARITY, DJ_EFORMAT)          /* a node with more or fewer arguments than its schema */           \
    X(ARG, DJ_EINVAL)             /* an argument of the wrong kind or value (dim out of range...) */  \
    X(REF, DJ_ERANGE)             /* a reference past the inputs, weights, nodes or outputs */        \
    X(CYCLE, DJ_EFORMAT)          /* a node reading itself or a later node */                         \
    X(SHAPE, DJ_EINVAL)           /* declared shape or dtype differs from the inferred one */        \
    X(OVERFLOW, DJ_ERANGE)        /* a size that overflows, a negative dimension */                   \
    X(LIMIT, DJ_ERANGE)           /* more nodes, rank, stack bytes or work than allowed */        \
    X(UNSUPPORTED, DJ_EUNSUPPORTED) /* a known op in a variant not built (training batch norm...) */

typedef enum {
#define DJ__CGRAPH_ERR_ENUM(name, st) DJ_CGRAPH_ERR_##name,
    DJ_CGRAPH_ERR_MAP(DJ__CGRAPH_ERR_ENUM)
#undef DJ__CGRAPH_ERR_ENUM
} dj_cgraph_err;

const char *dj_cgraph_err_name(dj_cgraph_err kind); /* "cycle"; never NULL */

typedef struct dj_cgraph_error {
    dj_cgraph_err kind;
    int32_t node;   /* the node's index, -1 when the error is not about one node */
    char op[64];    /* its op string as sent (truncated), "" when none */
    char msg[384];  /* the whole message, as dj_last_error() has it */
} dj_cgraph_error;

typedef struct dj_cgraph_limits {
    uint32_t max_nodes;        /* 0 = 65536 */
    uint64_t max_elems;        /* elements of any one value; 0 (and anything larger) = 2^31 */
    uint64_t max_stack_bytes;  /* the planned stack; 0 = 4 GiB */
    uint64_t max_ops;          /* the work of a run, estimated per node (multiply-adds x 2, window taps,
                                * elements touched); 0 = 2^44 */
} dj_cgraph_limits;

typedef enum { DJ_CDTYPE_F32, DJ_CDTYPE_I64, DJ_CDTYPE_BOOL } dj_cdtype;
const char *dj_cdtype_name(dj_cdtype t); /* "f32", "i64", "bool" */

typedef struct dj_ctensor_info {
    uint32_t rank;
    int64_t shape[DJ_CGRAPH_MAX_RANK];
    uint64_t numel;
    dj_cdtype dtype;
} dj_ctensor_info;

typedef struct dj_cgraph dj_cgraph_t;

/* Decodes, validates and plans a graph from bytes (not kept: may be freed after). lim may be
 * NULL (defaults). On failure *out is NULL, err (may be NULL) says why. */
dj_status dj_cgraph_decode(const uint8_t *bytes, size_t len, const dj_cgraph_limits *lim, dj_cgraph_t **out /* OUT */,
                           dj_cgraph_error *err /* OUT, may be NULL */);
void dj_cgraph_free(dj_cgraph_t *g); /* NULL does nothing */

uint32_t dj_cgraph_n_nodes(const dj_cgraph_t *g);
uint32_t dj_cgraph_n_inputs(const dj_cgraph_t *g);
uint32_t dj_cgraph_n_weights(const dj_cgraph_t *g);
uint32_t dj_cgraph_n_outputs(const dj_cgraph_t *g);
const dj_ctensor_info *dj_cgraph_input(const dj_cgraph_t *g, uint32_t i);
const dj_ctensor_info *dj_cgraph_weight(const dj_cgraph_t *g, uint32_t i);
const dj_ctensor_info *dj_cgraph_output(const dj_cgraph_t *g, uint32_t i);
/* A weight's content hash (hash_len bytes, as sent; valid while g lives) and name. */
const uint8_t *dj_cgraph_weight_hash(const dj_cgraph_t *g, uint32_t i, size_t *hash_len /* OUT */);
const char *dj_cgraph_weight_name(const dj_cgraph_t *g, uint32_t i);
/* Bytes of the stack buffer dj_cgraph_run needs (the plan's peak; a multiple of 64). */
size_t dj_cgraph_stack_bytes(const dj_cgraph_t *g);
/* Bytes the decoded graph holds in host memory (what a plan cache counts for it). */
size_t dj_cgraph_mem_bytes(const dj_cgraph_t *g);

/* Runs the graph on a CPU backend (its MATMUL does the GEMMs): inputs[i] and weights[i] are
 * f32 arrays of each one's numel (read only; an i64 or bool tensor as its values in f32), stack
 * has dj_cgraph_stack_bytes (aligned to 64). outs[i] (OUT) then points at output i's f32 values:
 * inside stack, or an input or a weight when the graph returns one as it is; valid until the
 * next run on the stack. A run fails only on a backend error or, with DJ_ERANGE, on an index
 * read from a value (embedding, gather, index_select) outside its dimension. Not reentrant for
 * one stack. */
dj_status dj_cgraph_run(const dj_cgraph_t *g, dj_backend_t *cpu, const float *const *inputs,
                        const float *const *weights, void *stack, const float **outs /* OUT [n_outputs] */);

/* The CUDA executor (src/capture/cuda_capture.cu): the same plan on a CUDA backend
 * (dj_backend_cuda_new), f32 throughout - cuBLAS SGEMMs for mm/addmm/linear/bmm/baddbmm, the
 * attention's two products and convolutions (columns per image and group, then one GEMM), our
 * kernels for the rest. inputs, weights and stack are device memory (stack of
 * dj_cgraph_stack_bytes); outs (OUT) point into them as in dj_cgraph_run. Synchronous: returns
 * when the stream has finished. An op without a GPU kernel (dj_cgraph_cuda_check) is refused
 * with DJ_EUNSUPPORTED naming the node and op before anything runs - never run on the CPU behind
 * the caller's back; an index out of range fails with DJ_ERANGE. In a build without CUDA both
 * return DJ_EUNSUPPORTED. */
dj_status dj_cgraph_cuda_check(const dj_cgraph_t *g, dj_cgraph_error *err /* OUT, may be NULL */);
dj_status dj_cgraph_run_cuda(const dj_cgraph_t *g, dj_backend_t *cuda, const float *const *inputs,
                             const float *const *weights, void *stack, const float **outs /* OUT [n_outputs] */);

#endif
