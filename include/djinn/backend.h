/* backend.h: the device interface. A backend owns device memory (the VMU takes
 * one allocation from it) and computes ops on pointers inside that memory.
 * The CPU backend is the reference; a CUDA backend slots in behind the same
 * vtable (pointers are then device pointers, and no layer above changes). */
#ifndef DJINN_BACKEND_H
#define DJINN_BACKEND_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/dtype.h"
#include "djinn/sample_params.h"
#include "djinn/status.h"

typedef struct dj_backend dj_backend_t;
/* A recorded sequence of compute calls that a backend can replay (CUDA Graphs);
 * opaque, made by capture_end, freed by graph_free. */
typedef struct dj_backend_graph dj_backend_graph_t;
/* A batch of host<->device copies in flight (xfer_start); opaque, freed by xfer_free. */
typedef struct dj_backend_xfer dj_backend_xfer_t;

/* One copy of a transfer: `bytes` between device memory at dev and host
 * memory at host (the direction is the transfer's). rows > 1 (a weight ring
 * load's copies only; 0 and 1 mean one piece): `rows` pieces of `bytes`, the
 * host's host_pitch bytes apart, the device's packed (bytes apart) - a column
 * slice of a row-major matrix. */
typedef struct dj_copy_span {
    void *dev;
    void *host;
    size_t bytes;
    uint32_t rows;
    size_t host_pitch;
} dj_copy_span;

/* A view of one layer's K/V for one session, as stored in data-segment pages.
 * Page layout (page_bytes each, pages anywhere in the segment):
 *   K rows: [tokens_per_page][kv_dim] of dtype, then
 *   V rows: [tokens_per_page][kv_dim] of dtype,
 * and with dtype f8_e4m3 (either backend, `--kv-dtype fp8`: one byte an
 * element) one power of two per page and head after them:
 *   K exponents: [n_kv_heads] int8, then V exponents: [n_kv_heads] int8;
 * element e of head h at row r is f8(code) * 2^exp[h]. A page's exponent of
 * a head is the largest that any row written to the page since its row 0
 * needs (dj_kv_f8_exp of the row's largest magnitude in that head); codes
 * are value * 2^-exp rounded to nearest even, saturating at +-448
 * (dj_f32_to_f8e4m3), and the dequantized values are exact in bf16 and f32.
 * KV_WRITE takes the rows of one page in one call as a group (consecutive
 * rows of the call with the same block table, the same block and consecutive
 * positions; rows of one page must not appear in two groups of a call):
 *   old = the page's exponent if rows [0, r0) are held (r0 = the group's
 *         first row in the page > 0), else none;
 *   exp = max(old, dj_kv_f8_exp(largest magnitude of the group's rows));
 *   if exp > old, every code of rows [0, r0) becomes
 *         dj_f32_to_f8e4m3(f8(code) * 2^(old - exp)) (exact unless it falls
 *         into the subnormals), then the group's rows are written at exp.
 * So an f8 position costs 2 * kv_dim bytes and a page 2 * n_kv_heads more:
 * dj_kv_page_tokens gives a page's positions, dj_kv_page_need the bytes.
 * Token position p lives in page block_table[p / tokens_per_page], row
 * p % tokens_per_page.
 * Block tables: block_table (host memory) is always set and authoritative.
 * block_table_dev is optional: NULL, or the same entries [0, n_blocks) in
 * device memory, valid until the op has run on the device (the owner updates
 * it through the backend's upload, which is ordered with compute). A device
 * backend given NULL copies block_table to the device itself for each call
 * (the host table may change as soon as compute returns); the CPU backend
 * ignores block_table_dev. */
typedef struct dj_kv_view {
    uint8_t *seg_base;            /* data segment base (device memory) */
    size_t page_bytes;            /* bytes per page */
    const uint32_t *block_table;  /* [n_blocks] page index of each block; host memory */
    const uint32_t *block_table_dev; /* [n_blocks] the same in device memory, or NULL */
    uint32_t n_blocks;            /* blocks mapped (capacity = n_blocks*tokens_per_page) */
    uint32_t tokens_per_page;     /* positions per page */
    uint32_t kv_dim;              /* n_kv_heads * head_dim */
    dj_dtype dtype;               /* element type of K/V (the backend's kv_dtype) */
    uint32_t n_kv_heads;          /* heads of kv_dim: the f8 layout's scales (0 = 1 elsewhere) */
} dj_kv_view;

/* Bytes of one position of one layer in a page: K and V rows of n_kv_heads *
 * head_dim elements of t (f8_e4m3's exponents are the page's: dj_kv_page_need);
 * 0 for a dtype no backend stores K/V in. */
size_t dj_kv_token_bytes(dj_dtype t, uint32_t n_kv_heads, uint32_t head_dim);
/* Bytes a page of `tokens` positions needs: their rows, and with f8_e4m3 the
 * page's 2 * n_kv_heads exponents. */
size_t dj_kv_page_need(dj_dtype t, uint32_t n_kv_heads, uint32_t head_dim, uint32_t tokens);
/* Positions a page of page_bytes holds (0: not even one, or a dtype no
 * backend stores K/V in). */
uint32_t dj_kv_page_tokens(dj_dtype t, uint32_t n_kv_heads, uint32_t head_dim, size_t page_bytes);

/* An f8 engine's page of a power-of-two size grows by this much, so that it
 * holds every position the power of two of codes holds (twice bf16's) and
 * the exponents of up to 32 kv heads beside them (dj_engine_new; a multiple
 * of DJ_VMU_PAGE_ALIGN; where a position is smaller, the rest holds more). */
#define DJ_KV_F8_PAGE_EXTRA 64

/* f8 K/V exponents lie in [DJ_KV_F8_EXP_MIN, 127]: the least one is what a
 * head of zeros takes (any later row raises it), and 2^-120 keeps every
 * code's value a normal or subnormal bf16. */
#define DJ_KV_F8_EXP_MIN (-120)

/* The f8 K/V exponent of values whose largest magnitude is amax: the least s
 * with amax <= 448 * 2^s (so no element saturates), DJ_KV_F8_EXP_MIN at
 * least; DJ_KV_F8_EXP_MIN for amax 0 or not finite (such a row does not
 * raise a page's exponent; infinities saturate). amax = m * 2^E with m in
 * [0.5, 1) (frexpf): s = E - 9, or E - 8 when m > 0.875 (448 = 0.875 * 2^9).
 * Host and device code (CUDA kernels call it). */
#ifdef __CUDACC__
#define DJ_KV_HD __host__ __device__
#else
#define DJ_KV_HD
#endif
static inline DJ_KV_HD int dj_kv_f8_exp(float amax) {
    if (!(amax > 0.0f) || amax == INFINITY) return DJ_KV_F8_EXP_MIN;
    int E = 0;
    const float m = frexpf(amax, &E);
    const int s = E - 9 + (m > 0.875f ? 1 : 0);
    return s > DJ_KV_F8_EXP_MIN ? s : DJ_KV_F8_EXP_MIN;
}

/* Bytes from an f8 page's start to its exponents (K's [n_kv_heads], then
 * V's): past its tokens_per_page K and V rows of kv_dim codes. Host and
 * device code. */
static inline DJ_KV_HD size_t dj_kv_f8_exps_at(uint32_t tokens_per_page, uint32_t kv_dim) {
    return 2 * (size_t)tokens_per_page * kv_dim;
}

/* Every op once: X(NAME, "name"). Generates dj_op and dj_op_name(). The
 * comment of each op is its contract:
 *  EMBED      out[n,d] f32 = table[ids[i], :] (* scale when scale != 0)
 *  RMSNORM    out[n,g*d] = x * rsqrt(mean(x^2) + eps) * (w[d] + w_offset), per d-wide group
 *  MATMUL     out[n,m] = x[n,k] @ w[m,k]^T (+ bias[m]); w in HF layout
 *  ROPE       out[n,h,hd] = rotate_half rope of x's first rot_dim dims at positions pos0+i;
 *             out may == x
 *  KV_WRITE   store k[n,kv_dim], v[n,kv_dim] at positions pos0.. in pages
 *  ATTENTION  out[n,h*hd] = causal softmax(cap(q k^T * scale)) v, GQA
 *  SILU_MUL   out[n,f] = silu(gate[n,f]) * up[n,f]
 *  ADD        out[count] = a[count] + b[count]
 *  GELU_MUL   out[n,f] = gelu_tanh(gate[n,f]) * up[n,f] (GeGLU, Gemma)
 *  SOFTCAP    out[n,d] f32 = softcap * tanh(x[n,d] / softcap), x f32 (logits; out may == x)
 *  MOE_ROUTE  out[n,m] f32 = router logits x[n,m] -> softmax over each row's top_k, 0 elsewhere
 *             (Mixtral: top_k of m experts)
 *  MOE_FFN    out[n,k] = x2[n,k] + route[i,e] * down @ (silu(gate @ x_i) * (up @ x_i)) for rows
 *             with route[i,e] != 0, out = x2 elsewhere: expert e of a MoE layer; x [n,k] the
 *             normed input, x2 the sum so far (act dtype) or NULL (zero), route [n,m] f32
 *  LORA       out[i,:] += s_a * B_a (A_a x[i,:]) for each row i whose adapter a = lora_row[i] >= 0
 *             has matrices here (lora[a].a != NULL): the low-rank update of a MATMUL's output
 *             (x[n,k] its input, out[n,m] its output), each row alone (batch-invariant) */
#define DJ_OP_LIST(X)                                                                                 \
    X(EMBED, "embed") X(RMSNORM, "rmsnorm") X(MATMUL, "matmul") X(ROPE, "rope") X(KV_WRITE, "kv_write") \
    X(ATTENTION, "attention") X(SILU_MUL, "silu_mul") X(ADD, "add") X(GELU_MUL, "gelu_mul")          \
    X(SOFTCAP, "softcap") X(MOE_ROUTE, "moe_route") X(MOE_FFN, "moe_ffn") X(LORA, "lora")

typedef enum {
#define DJ_OP_ENUM_(e, name) DJ_OP_##e,
    DJ_OP_LIST(DJ_OP_ENUM_)
#undef DJ_OP_ENUM_
    DJ_OP_COUNT
} dj_op;

const char *dj_op_name(dj_op op);

/* One adapter's matrices for one projection (a LORA call's lora[a]), f32 in
 * device memory: the update is scale * B (A x). Adapters are docs/lora.md. */
typedef struct dj_lora_mat {
    const float *a;  /* [rank][k], or NULL: this adapter leaves the projection alone */
    const float *b;  /* [m][ldb]: row j's first rank values are B[j][0..rank) */
    uint32_t rank;   /* 1..DJ_LORA_MAX_RANK */
    uint32_t ldb;    /* elements from one row of b to the next (>= rank) */
    float scale;     /* lora_alpha / rank (or / sqrt(rank) with rsLoRA) times the use's own */
} dj_lora_mat;

#define DJ_LORA_MAX_RANK 512

/* One op invocation with every pointer resolved. Activations (out, x, x2)
 * have the backend's act_dtype (f32 on the CPU, bf16 on CUDA), except where
 * out_dtype and x_dtype below say f32: the logits, and the residual stream
 * (EMBED and ADD outputs, RMSNORM and ADD inputs x), which the executor
 * keeps in the backend's res_dtype. Weights (w, bias, table, norm weight) carry
 * their own dtype. n is the number of token rows of this call (the runtime
 * count, <= the planned one). All pointers except ids and kv->block_table
 * are device memory.
 *
 * Per-row arguments (batched decode, position-independent replays): row_pos
 * and row_tables are device memory (host memory on the CPU), NULL when
 * unused, read by ROPE, KV_WRITE and ATTENTION only:
 *  - row_pos[n]: the position of each row, replacing pos0 + i;
 *  - row_tables[n]: each row's block table (a device pointer to
 *    [n_blocks] page ids), replacing kv's table; kv still gives the layout
 *    (seg_base, page_bytes, tokens_per_page, kv_dim, dtype). It needs row_pos.
 *    ATTENTION row i then attends to positions [.., row_pos[i]] of its own
 *    table: every row is its own sequence.
 * A device backend cannot read these at call time, so it checks no position
 * against n_blocks: the caller guarantees that every row's position is mapped
 * in its table. */
typedef struct dj_op_call {
    dj_op op;
    uint32_t n;            /* token rows */
    void *out;             /* activation output, [n][width] of out_dtype; NULL for KV_WRITE */
    uint32_t out_rows;     /* MATMUL: rows of m values that out has room for (>= n); 0 = n. A
                            * backend may write rows [n, out_rows) as scratch: CUDA's FP8 GEMMs
                            * run n rows not a multiple of 4 as n rounded up to 4 (the engine
                            * gives each MATMUL its node's whole buffer) */
    const void *x;         /* main activation input (q for ATTENTION/ROPE, k for KV_WRITE) */
    const void *x2;        /* second input: b for ADD, up for SILU_MUL, v for KV_WRITE */
    dj_dtype out_dtype;    /* element type of out: always the real one. Must equal the
                            * backend's act_dtype, except that MATMUL (the logits), EMBED
                            * and ADD (the residual stream) may also write f32. The
                            * executor sets it for every op; a zero-initialised call
                            * means f32 (the CPU's act_dtype). */
    dj_dtype x_dtype;      /* RMSNORM and ADD: element type of x, act_dtype or f32 (the
                            * residual stream); ADD's x2 is always act_dtype. Other ops
                            * ignore it (x is act_dtype). Zero-initialised: f32. */
    const void *w;         /* weight: EMBED table, RMSNORM weight, MATMUL weight */
    dj_dtype w_dtype;
    /* MATMUL with w_dtype f8_e4m3 (weights only): w[j][i] = fp8(w[j][i]) *
     * w_scale[j / w_block_rows][i / w_block_cols], w_scale f32 [ceil(m/w_block_rows)]
     * [ceil(k/w_block_cols)] in device memory. NULL / 0 with other dtypes. */
    const float *w_scale;
    uint32_t w_block_rows, w_block_cols;
    const void *bias;      /* MATMUL bias [m] or NULL */
    dj_dtype bias_dtype;
    const int32_t *ids;    /* EMBED token ids [n] (host memory), or NULL to use ids_dev */
    const int32_t *ids_dev; /* EMBED token ids [n] in device memory, read when ids is NULL. The
                             * caller validates them: a device backend gives a zero row for
                             * an id outside [0, m), the CPU backend DJ_ERANGE */
    const uint32_t *row_pos;              /* [n] per-row positions (see above) or NULL */
    const uint32_t *const *row_tables;    /* [n] per-row block tables (see above) or NULL */
    const float *inv_freq; /* ROPE: [head_dim/2] inverse frequencies (after scaling) */
    const float *const *row_freq; /* ROPE: [n] each row's inverse frequencies (device pointers, each
                                   * [rot_dim/2]) replacing inv_freq, or NULL: sessions of one batch
                                   * with their own tables (longrope's short and long factors) */
    const dj_kv_view *kv;  /* KV_WRITE / ATTENTION */
    uint32_t pos0;         /* position of row 0 (ROPE, KV_WRITE, ATTENTION) */
    uint32_t d;            /* EMBED/RMSNORM/SILU_MUL: row width; ADD: elements per row */
    uint32_t k, m;         /* MATMUL: in features, out features; EMBED: m = vocab rows of
                            * the table (an id outside [0, m) is DJ_ERANGE) */
    uint32_t ldw;          /* MATMUL: elements from one weight row to the next (>= k; f32, f16
                            * and bf16 weights on the CPU backend only: a column slice that
                            * host compute reads in place); 0 = k */
    uint32_t n_heads;      /* ROPE/ATTENTION: query heads (ROPE: heads of x) */
    uint32_t n_kv_heads;   /* ATTENTION */
    uint32_t head_dim;     /* ROPE/ATTENTION */
    uint32_t window;       /* ATTENTION: sliding window in positions, 0 = none */
    uint32_t pos_bound;    /* ATTENTION with row_pos: every row's position is below this (the
                            * backend's short_pos), 0 = unknown. A hint for the launch: the
                            * result differs at most in the order of its partial sums (not
                            * at all with deterministic) */
    bool decode_only;      /* ATTENTION with row_pos: every row is its sequence's one new
                            * position of the step, so the K/V before it were written by
                            * earlier steps (a device backend may read them before the
                            * step's KV_WRITE has run) */
    float eps;             /* RMSNORM */
    float scale;           /* ATTENTION: softmax scale; ROPE: attention_scaling (1 = none);
                            * EMBED: rows times this (0 = 1: no scaling) */
    /* ---- architecture variants; zero keeps the Llama behaviour ---- */
    float w_offset;        /* RMSNORM: the weight applies as (w + w_offset) (Gemma: 1) */
    uint32_t groups;       /* RMSNORM: d-wide groups per row, each normed alone (per-head q/k
                            * norm: n_heads); 0 = 1 */
    uint32_t rot_dim;      /* ROPE: leading dims of each head rotated, even, <= head_dim (partial
                            * rotary; the rest pass through); 0 = head_dim */
    float softcap;         /* ATTENTION: scores s -> softcap*tanh(s/softcap) after scale; SOFTCAP:
                            * the cap (> 0); 0 = none */
    uint32_t top_k;        /* MOE_ROUTE: experts kept per row (1..m) */
    uint32_t expert;       /* MOE_FFN: e, the column of route this expert reads (< m) */
    const float *route;    /* MOE_FFN: [n][m] f32 routing weights (device memory) */
    const void *w_up;      /* MOE_FFN: up [d][k], of w_dtype (w is the gate [d][k]) */
    const void *w_down;    /* MOE_FFN: down [k][d], of w_dtype. MOE_FFN's k is the model width,
                            * d the expert width, m the experts (route's row width) */
    const dj_lora_mat *lora; /* LORA: [n_lora] each adapter of the step, host memory read
                              * before compute returns (k, m: the projection's) */
    uint32_t n_lora;
    const int32_t *lora_row; /* LORA: [n] host memory: row i's adapter in lora, -1 = none */
} dj_op_call;

/* ---- weight streaming (docs/internals.md, "Models larger than the GPU") ----
 * A model whose layers do not all fit its text budget streams some of them
 * through a ring in the text segment: each step copies every streamed layer
 * (a "load") from host memory into the ring's fixed offsets, in order, while
 * compute reads the loads copied before. The backend keeps, per load, a
 * "ready" event (its copy has landed) and a "done" event (every call reading
 * it has finished); the ring's owner says which loads' bytes each load
 * overwrites. */
typedef struct dj_backend_ring dj_backend_ring_t; /* the events of one ring; opaque */

typedef struct dj_stream_load {
    const dj_copy_span *spans; /* [n_spans] host -> device: dev in the ring, host in memory the
                                * copies read at full rate (host_register'ed or host_alloc'ed) */
    uint32_t n_spans;
    const uint32_t *after;     /* [n_after] loads whose bytes these copies overwrite (itself
                                * included): each copy starts once their latest readers finished */
    uint32_t n_after;
} dj_stream_load;

/* Host compute beside the ring, one layer's FFN (or a share of it) whose
 * weights stay in host memory, in stream order: the `in` copies (device ->
 * host) once the compute before call `first` has finished, then `calls` on
 * the step's host backend, then the `out` copies (host -> device). Two kinds:
 *  - join == 0 (the whole FFN): the device calls [first, first + n_calls)
 *    are not run (they read no load: call_load -1); the out copies land
 *    before the compute after them.
 *  - join > first (a share: the host takes the first columns of the FFN's
 *    width, the device the rest): the device runs calls [first, join) itself
 *    at the same time as the host, and call `join` - its residual ADD, whose
 *    x is the host's result - waits for the out copies.
 * `calls` are rewritten for the host backend: weights at their host addresses
 * (the mapped checkpoint), activations in host scratch that the in/out spans
 * fill and drain (page-locked on a device backend). Every pointer stays
 * valid, and the scratch untouched by anyone else, until the step's compute
 * has finished; the backend copies `calls` themselves before compute_plan
 * returns. */
typedef struct dj_host_run {
    uint32_t first, n_calls;
    uint32_t join;                    /* 0, or the device call that waits for the out copies */
    const dj_op_call *calls;          /* [n_calls] for the host backend */
    const dj_copy_span *in, *out;     /* [n_in], [n_out] */
    uint32_t n_in, n_out;
} dj_host_run;

/* What compute_plan needs to stream a step's weights. */
typedef struct dj_stream_step {
    dj_backend_ring_t *ring;     /* made by ring_new with n_loads events */
    const dj_stream_load *loads; /* [n_loads] in the order the step reads them */
    uint32_t n_loads;
    const int32_t *call_load;    /* [n calls] the load whose ring bytes call i reads, -1: none */
    bool prefetch;               /* copies start as soon as the ring has room; false: each only when
                                  * compute reaches it, after all compute before (the ablation) */
    const dj_host_run *runs;     /* [n_runs] host runs, ascending: each starts (first) after the
                                  * previous one's calls (join == 0) or join; or NULL */
    uint32_t n_runs;
    dj_backend_t *host;          /* runs them (a CPU backend); needed when n_runs > 0 */
} dj_stream_step;

/* One row's pick description for the sample hook: the rule's parameters (as
 * pick.h's dj_pick_rule), its penalty entries and the uniform draw u in
 * [0, 1) its pick uses. */
typedef struct dj_sample_row {
    float temperature;        /* 0 = greedy (the argmax of the penalised logits) */
    uint32_t top_k;           /* 0 = off */
    float top_p;              /* 1 = off; in (0, 1] */
    float min_p;              /* 0 = off; in [0, 1] */
    float repetition_penalty; /* 0 or 1 = off; else > 0 */
    uint32_t n_pen;           /* entries in pen */
    const dj_sampler_penalty *pen; /* [n_pen] host memory, distinct ids in [0, vocab); read
                                    * before the hook returns */
    double u;                 /* in [0, 1) */
} dj_sample_row;

/* Whether a dj_sample_row carries all of p: every sampling field (the table
 * of djinn/sample_schema.h) that the row has no place for is at its default.
 * The engine picks a row through the sample hook only then, else on the host
 * (dj_pick), so a field added to the table works on every backend before the
 * row and the CUDA kernel learn it. */
bool dj_sample_row_carries(const dj_sampler_params *p);

/* One row's mask and logit bias for the mask hook (structured output's
 * mask, a request's logit_bias: djinn/sampler.h). */
typedef struct dj_mask_row {
    const uint8_t *allowed;        /* [vocab] host memory: 0 = never picked (its logit becomes -inf); NULL: no mask */
    const dj_logit_bias *bias;     /* [n_bias] host memory: distinct ids in [0, vocab), bias finite, added after
                                    * the mask (-inf stays -inf) */
    uint32_t n_bias;
} dj_mask_row;

typedef struct dj_backend_vtbl {
    const char *name; /* "cpu", "cuda" */
    /* Device memory. alloc returns DJ_ENOMEM with a message on failure. */
    dj_status (*alloc)(dj_backend_t *be, size_t bytes, void **out /* OUT */);
    void (*free)(dj_backend_t *be, void *ptr);
    /* Copies between host memory and device memory (same-space on the CPU). */
    dj_status (*upload)(dj_backend_t *be, void *dst_dev, const void *src_host, size_t bytes);
    dj_status (*download)(dj_backend_t *be, void *dst_host, const void *src_dev, size_t bytes);
    /* Run one op. May be asynchronous on a device; sync waits for all. */
    dj_status (*compute)(dj_backend_t *be, const dj_op_call *call);
    dj_status (*sync)(dj_backend_t *be);
    void (*destroy)(dj_backend_t *be);

    /* ---- optional hooks: NULL where a backend lacks them (the engine then
     * falls back to upload, downloading logits, and running ops one by one) ---- */

    /* As upload, but ordered with compute and without waiting: the bytes are
     * staged before it returns, so src_host may change at once. */
    dj_status (*upload_async)(dj_backend_t *be, void *dst_dev, const void *src_host, size_t bytes);
    /* out_dev[i] = argmax_j logits[i][j] for i < n (f32 logits, int32 out, both
     * device memory), lowest j on ties as torch.argmax; ordered with compute. */
    dj_status (*argmax)(dj_backend_t *be, const float *logits, uint32_t n, uint32_t vocab, int32_t *out_dev);
    /* Graph capture. After capture_begin, compute calls are recorded instead
     * of run (so every pointer they read must stay valid, and hold the right
     * bytes, whenever the graph is launched: ids_dev, row_pos, row_tables and
     * block_table_dev, never host memory); upload, download, sync and
     * upload_async fail until capture_end. capture_end always ends the
     * capture; it returns the graph, or an error when any call failed or the
     * device refused the capture (nothing recorded ran: run the calls
     * uncaptured). graph_launch runs a graph, ordered with compute;
     * graph_free releases it (NULL does nothing). Scratch memory a recorded
     * call uses is kept alive as long as the graph. */
    dj_status (*capture_begin)(dj_backend_t *be);
    dj_status (*capture_end)(dj_backend_t *be, dj_backend_graph_t **out /* OUT */);
    dj_status (*graph_launch)(dj_backend_t *be, dj_backend_graph_t *g);
    void (*graph_free)(dj_backend_t *be, dj_backend_graph_t *g);
    /* out_dev[i] = the token dj_pick's rule (pick.h) picks from logits row i
     * (device memory, [n][vocab] f32) with rows[i]'s parameters and penalty
     * entries, drawing with rows[i].u (rows: host memory, read before it
     * returns); temperature 0 is the argmax of the penalised logits. Ordered
     * with compute; refused during a capture. */
    dj_status (*sample)(dj_backend_t *be, const float *logits, uint32_t n, uint32_t vocab,
                        const struct dj_sample_row *rows, int32_t *out_dev);
    /* Runs a planned step: calls[0..n) (host memory, read before it returns)
     * with the effect of calling compute on each in order, but the backend may
     * run several as one kernel (fusion: the CUDA backend's list is in
     * docs/internals.md). Every call is enqueued when it returns: nothing
     * is held back for a later call. plan_key names the plan (the engine
     * passes its dj_graph_t): the backend may keep its decisions under it,
     * checked against the calls, so a changed plan under an old key is
     * decided again; NULL keeps nothing. Recorded like compute during a
     * capture. stream (NULL: none) streams the step's weights (above): the
     * loads' copies are issued as the ring allows, each call waits for the
     * load it reads, and each load's done event follows its last reader; the
     * host never waits for the device. A stream is refused during a capture. */
    dj_status (*compute_plan)(dj_backend_t *be, const dj_op_call *calls, size_t n, const void *plan_key,
                              const dj_stream_step *stream);
    /* As upload (done when it returns), but callable from several threads at
     * once for disjoint destinations that no compute uses yet (loading a
     * model's weights); not ordered with compute. NULL: the loader calls
     * upload from one thread. */
    dj_status (*upload_weights)(dj_backend_t *be, void *dst_dev, const void *src_host, size_t bytes);

    /* ---- KV swap to host memory (optional: NULL where a backend lacks them;
     * the engine then takes its swap pool from malloc and copies with sync +
     * download / upload, done when the call returns) ---- */

    /* Host memory the copies below reach at full rate (CUDA: pinned through
     * cudaHostAlloc), and its release. */
    dj_status (*host_alloc)(dj_backend_t *be, size_t bytes, void **out /* OUT */);
    void (*host_free)(dj_backend_t *be, void *ptr);
    /* Starts the copies spans[0..n) (host memory, read before it returns):
     * device -> host when to_host, else host -> device; the host sides lie in
     * host_alloc memory and must stay until the transfer is done. The copies
     * run on a copy stream of the backend's own: they begin once every
     * compute enqueued before this call has finished (a swap-out reads what
     * the last step wrote; a restore does not overwrite pages that earlier
     * compute still reads) and overlap compute enqueued later. *out: the
     * transfer, for the calls below. Refused during a capture. */
    dj_status (*xfer_start)(dj_backend_t *be, bool to_host, const dj_copy_span *spans, size_t n,
                            dj_backend_xfer_t **out /* OUT */);
    /* Never blocks: DJ_OK when every copy of x has completed (*seconds, when
     * not NULL: the device time from the copies' start to their end, without
     * the wait for earlier compute), DJ_EBUSY while in flight, DJ_EDEVICE on
     * a device failure. */
    dj_status (*xfer_query)(dj_backend_t *be, dj_backend_xfer_t *x, double *seconds /* OUT */);
    /* Compute enqueued from now on starts after x's copies (a wait on the
     * device: the host does not block). */
    dj_status (*xfer_order)(dj_backend_t *be, dj_backend_xfer_t *x);
    /* Waits on the host until x's copies are done, then frees x (NULL does nothing). */
    void (*xfer_free)(dj_backend_t *be, dj_backend_xfer_t *x);
    /* Free and total device memory in bytes (CUDA: cudaMemGetInfo); NULL on
     * backends whose device memory is host memory. */
    dj_status (*mem_info)(dj_backend_t *be, size_t *free_bytes /* OUT */, size_t *total_bytes /* OUT */);

    /* ---- weight streaming (required for compute_plan's stream; NULL where a
     * backend cannot stream: such a backend runs only models that fit) ---- */

    /* The ready/done events of a ring of n_loads loads (and, on the CPU, the
     * copy thread that carries its copies out). ring_free waits for the
     * ring's copies in flight, then frees it (NULL does nothing). */
    dj_status (*ring_new)(dj_backend_t *be, uint32_t n_loads, dj_backend_ring_t **out /* OUT */);
    void (*ring_free)(dj_backend_t *be, dj_backend_ring_t *r);
    /* Makes host memory [p, p + bytes) (read-only to us, e.g. a mapped
     * checkpoint) copyable at the full rate (CUDA: cudaHostRegister); undone
     * by host_unregister(p). NULL, or an error, where it cannot: the caller
     * copies the bytes into host_alloc memory instead. */
    dj_status (*host_register)(dj_backend_t *be, void *p, size_t bytes);
    void (*host_unregister)(dj_backend_t *be, void *p);

    /* ---- optional: NULL where a backend lacks it (a traced step then saves
     * through the host: sync, download) ---- */

    /* bytes from src_dev to dst_dev (device memory both, not overlapping),
     * ordered with compute and without waiting; recorded like compute during
     * a capture (a traced step's saved points). */
    dj_status (*copy)(dj_backend_t *be, void *dst_dev, const void *src_dev, size_t bytes);

    /* ---- optional: NULL where a backend lacks it (the engine then picks
     * masked or biased rows on the host, bringing their logits over) ---- */

    /* logits (device memory, [n][vocab] f32) rewritten in place by rows[i]
     * (host memory, read - staged - before it returns): each id with
     * allowed[id] == 0 becomes -inf, then each bias is added; a row with
     * neither is left alone. Exactly what dj_sampler_pick_with does to its
     * copy of a row, so a pick after it (argmax, sample) is the host's.
     * Ordered with compute; refused during a capture. */
    dj_status (*mask)(dj_backend_t *be, float *logits, uint32_t n, uint32_t vocab, const dj_mask_row *rows);
} dj_backend_vtbl;

/* Every backend struct begins with this header. */
struct dj_backend {
    const dj_backend_vtbl *vt;
    dj_dtype kv_dtype;    /* element type of K/V pages: act_dtype, or f8_e4m3 when the owner
                           * asks before any session (dj_backend_set_kv_dtype) */
    dj_dtype act_dtype;   /* element type of activations (f32 on the CPU) */
    dj_dtype res_dtype;   /* element type the executor keeps the residual stream in
                           * (EMBED and ADD outputs): act_dtype or f32 */
    bool host_memory;     /* device memory is host memory (the CPU backend) */
    bool deterministic;   /* set by the owner before any compute: each row of a MATMUL with
                           * n <= DJ_DETERMINISTIC_MAX_ROWS computed independently of n
                           * (batch-invariant logits); the CPU backend always is */
    /* Set by the backend, 0 = none: decode steps of at most short_rows rows that all lie
     * below position short_pos are a class of their own (their ATTENTION calls carry
     * pos_bound = short_pos, and the executor records their graphs apart). */
    uint32_t short_pos;
    uint32_t short_rows;
};

#define DJ_DETERMINISTIC_MAX_ROWS 256

/* The CPU backend. n_threads 0 = every core (omp_get_max_threads()). Its
 * device memory is host memory aligned to 4096; compute is synchronous and
 * not reentrant for one backend (it keeps one scratch buffer). */
dj_status dj_backend_cpu_new(int n_threads, dj_backend_t **out /* OUT */);
/* K/V pages in t from now on: the backend's act_dtype (its default) or
 * f8_e4m3 (half the bytes of bf16, a quarter of f32). Call before any
 * session exists; DJ_EUNSUPPORTED names any other dtype. */
dj_status dj_backend_set_kv_dtype(dj_backend_t *be, dj_dtype t);
/* Frees any backend; NULL does nothing. */
void dj_backend_free(dj_backend_t *be);

static inline dj_status dj_backend_compute(dj_backend_t *be, const dj_op_call *c) {
    return be->vt->compute(be, c);
}

/* compute_plan where the backend has it, else compute on each call in order. */
static inline dj_status dj_backend_compute_plan(dj_backend_t *be, const dj_op_call *calls, size_t n,
                                                const void *plan_key) {
    if (be->vt->compute_plan) return be->vt->compute_plan(be, calls, n, plan_key, NULL);
    for (size_t i = 0; i < n; i++) {
        const dj_status st = be->vt->compute(be, &calls[i]);
        if (st != DJ_OK) return st;
    }
    return DJ_OK;
}

#endif
