/* cuda_plan.cu: a planned step on the CUDA backend - which calls run as one
 * kernel (decided once per plan by a scan of the calls, kept per plan key), then the launches. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"
#include "backend/cuda/cuda_impl.h"

/* One launch of a plan: a call alone, or calls fused. Indices into the calls. */
typedef enum {
    STEP_ONE,      /* calls[first] alone */
    STEP_GEMV,     /* calls[first .. first+count) as one GEMV launch */
    STEP_ADD_NORM, /* ADD calls[first], RMSNORM calls[first+1] of its sum (dj__cuda_add_rmsnorm) */
    STEP_GEMV_GLU, /* calls[first], [first+1]: gate and up (4-bit), calls[first+2] their GLU (dj__cuda_gemv_q4_glu) */
    STEP_NORM_ADD_NORM, /* RMSNORM calls[first] of what ADD calls[first+1] adds, RMSNORM calls[first+2] of the sum */
    STEP_ROPE_KV,  /* [ROPE of q calls[rope_q],] ROPE of k calls[first], its KV_WRITE calls[first+1] */
    STEP_F8_SHARED, /* calls[first .. first+count): FP8 tensor-core GEMMs of one input, quantized once */
    STEP_GLU_F8,    /* calls[first]: SILU_MUL / GELU_MUL quantizing its output for calls[first+1], its FP8 GEMM */
    STEP_NORM_ROPE_KV, /* calls[first .. first+5): per-head RMSNORMs of q and k, their ROPEs, k's KV_WRITE */
    STEP_NORM_F8, /* STEP_ADD_NORM or STEP_NORM_ADD_NORM (norms: its calls) quantizing the norm's output for the
                   * FP8 tensor-core GEMMs of it that follow (dj__cuda_norm_fp8_lt) */
    STEP_F8_MLP,  /* the norm step (norms: its calls), then gate, up, their GLU and down of FP8 blocks, gate and
                   * up as one GEMM (dj__cuda_f8_mlp_lt) */
    STEP_ATTN_F8, /* calls[first]: ATTENTION on the wgmma kernel writing codes for calls[first+1], its FP8 GEMM */
    STEP_F8_QKV,  /* the norm step (norms: its calls), then q, k, v of FP8 blocks as one GEMM, the ROPEs of q and
                   * k and the KV_WRITE reading its rows (dj__cuda_f8_qkv_lt) */
} step_kind;

#define F8_SHARED_GROUP 4 /* q, k, v (and gate, up) */

typedef struct plan_step {
    uint8_t kind;   /* step_kind */
    uint8_t count;  /* calls the launch runs from first on */
    int32_t first;
    int32_t rope_q; /* STEP_ROPE_KV: the q ROPE's index, or -1 */
    uint8_t norms;  /* STEP_NORM_F8, STEP_F8_MLP: the calls of its norm step (2 or 3), the GEMMs after them */
    uint8_t dead;   /* STEP_NORM_F8, STEP_F8_MLP, STEP_F8_QKV, STEP_GLU_F8: DJ_F8_DEAD_* of outputs nothing reads after */
} plan_step;

typedef struct dj_cuda_plan {
    const void *key;  /* NULL: free slot */
    uint64_t sig;     /* plan_sig of the calls it was decided for */
    size_t n_calls;
    bool fuse;        /* cb->fuse when decided */
    plan_step *steps; /* [n_steps]; owned */
    size_t n_steps;
} dj_cuda_plan;

static bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    const uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + nb && pb < pa + na;
}

/* ---- what fuses (every call of the plan has passed dj__cuda_check_call) ---- */

/* An ADD and the RMSNORM of its sum as one kernel: the sum and add's x have
 * one type (the residual stream's), the norm reads the sum as such, and
 * norm.out is one of add's bf16 buffers or clear of all of them. */
static bool fuses_with_add(const dj_op_call *add, const dj_op_call *c) {
    if (add->op != DJ_OP_ADD || c->op != DJ_OP_RMSNORM || c->x != add->out || c->n != add->n || c->d != add->d ||
        c->groups > 1 || c->d > DJ_FUSE_MAX_D || add->x_dtype != add->out_dtype || c->x_dtype != add->out_dtype)
        return false;
    const size_t row = (size_t)c->n * c->d;
    const size_t out_bytes = row * sizeof(__nv_bfloat16), res_bytes = row * dj_dtype_size(add->out_dtype);
    const void *bufs[3] = {add->x, add->x2, add->out};
    const size_t sizes[3] = {res_bytes, out_bytes, res_bytes};
    for (int i = 0; i < 3; i++) {
        if (c->out == bufs[i] && sizes[i] == out_bytes) continue; /* in place over a bf16 buffer */
        if (overlap(c->out, out_bytes, bufs[i], sizes[i])) return false;
    }
    return true;
}

/* An RMSNORM whose output the ADD add then adds to the residual stream
 * (Gemma's sandwich norms), before an ADD and RMSNORM that fuse: whole rows
 * (one block each), bf16 in and out, weights of the second norm's dtype, its
 * output the ADD's bf16 input and clear of every other buffer of the three. */
static bool fuses_before_add(const dj_op_call *p, const dj_op_call *add, const dj_op_call *norm) {
    if (p->op != DJ_OP_RMSNORM || !fuses_with_add(add, norm) || add->x2 != p->out || p->n != add->n ||
        p->d != add->d || p->groups > 1 || p->x_dtype != DJ_DTYPE_BF16 || p->w_dtype != norm->w_dtype)
        return false;
    const size_t row = (size_t)p->n * p->d, bb = row * sizeof(__nv_bfloat16);
    const size_t rb = row * dj_dtype_size(add->out_dtype);
    return !overlap(p->out, bb, add->x, rb) && !overlap(p->out, bb, add->out, rb) && !overlap(p->out, bb, norm->out, bb);
}

/* A ROPE (of k) and this KV_WRITE of its output as one kernel: the same rows
 * at the same positions, k's heads filling kv_dim, v clear of k. */
static bool fuses_with_rope(const dj_op_call *rope, const dj_op_call *c) {
    if (rope->op != DJ_OP_ROPE || c->op != DJ_OP_KV_WRITE || c->x != rope->out || c->n != rope->n ||
        rope->rot_dim != 0 || /* the fused kernel rotates whole heads */
        c->pos0 != rope->pos0 || c->row_pos != rope->row_pos ||
        (uint64_t)rope->n_heads * rope->head_dim != c->kv->kv_dim ||
        /* f8 pages: a scale per view head, so k's heads must be the view's */
        (c->kv->dtype == DJ_DTYPE_F8_E4M3 && c->kv->n_kv_heads != rope->n_heads))
        return false;
    const size_t bytes = (size_t)c->n * c->kv->kv_dim * sizeof(__nv_bfloat16);
    return !overlap(c->x2, bytes, rope->out, bytes) && !overlap(c->x2, bytes, rope->x, bytes);
}

/* A ROPE of q that may join k's ROPE and KV_WRITE: the same rows, positions,
 * frequencies and scale, no buffer of one touching a buffer of the other,
 * and v clear of q's output. */
static bool pairs_with_rope(const dj_op_call *q, const dj_op_call *k, const dj_op_call *kvw) {
    if (q->op != DJ_OP_ROPE || q->rot_dim != 0 || k->n != q->n || k->pos0 != q->pos0 || k->row_pos != q->row_pos ||
        k->inv_freq != q->inv_freq || k->row_freq != q->row_freq || k->head_dim != q->head_dim || k->scale != q->scale)
        return false;
    const size_t qb = (size_t)q->n * q->n_heads * q->head_dim * sizeof(__nv_bfloat16);
    const size_t kb = (size_t)k->n * k->n_heads * k->head_dim * sizeof(__nv_bfloat16);
    const void *qs[2] = {q->x, q->out}, *ks[2] = {k->x, k->out};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (overlap(qs[i], qb, ks[j], kb)) return false;
    const size_t vb = (size_t)kvw->n * kvw->kv->kv_dim * sizeof(__nv_bfloat16);
    return !overlap(kvw->x2, vb, q->out, qb);
}

static bool same_or_apart(const void *a, const void *b, size_t bytes) { return a == b || !overlap(a, bytes, b, bytes); }

/* Per-head q and k norms (Qwen3, Gemma 3), the ROPEs of their outputs and
 * k's KV_WRITE (c[0..5)) as one kernel (dj__cuda_norm_rope_kv_write): the
 * ROPEs and KV_WRITE as they fuse, the norms' inputs each clear of the other
 * side's buffers and of v, and equal to or clear of its own side's outputs
 * (a lane touches only its own elements of a head). */
static bool fuses_norm_rope(const dj_op_call *c) {
    const dj_op_call *qn = &c[0], *kn = &c[1], *rq = &c[2], *rk = &c[3], *kvw = &c[4];
    if (!fuses_with_rope(rk, kvw) || !pairs_with_rope(rq, rk, kvw) || !dj__cuda_norm_rope_takes(qn, kn, rq, rk, kvw))
        return false;
    const size_t qb = (size_t)rq->n * rq->n_heads * rq->head_dim * sizeof(__nv_bfloat16);
    const size_t kb = (size_t)rk->n * rk->n_heads * rk->head_dim * sizeof(__nv_bfloat16);
    return same_or_apart(qn->x, qn->out, qb) && same_or_apart(qn->x, rq->out, qb) &&
           same_or_apart(kn->x, kn->out, kb) && same_or_apart(kn->x, rk->out, kb) &&
           !overlap(qn->x, qb, kn->x, kb) && !overlap(qn->x, qb, kn->out, kb) && !overlap(qn->x, qb, rk->out, kb) &&
           !overlap(kn->x, kb, qn->out, qb) && !overlap(kn->x, kb, rq->out, qb) &&
           !overlap(kvw->x2, kb, qn->x, qb) && !overlap(kvw->x2, kb, kn->x, kb) && !overlap(kvw->x2, kb, qn->out, qb);
}

/* The 4-bit GEMV group gate, up (g[0..2)) and the GLU glu of their outputs
 * as one kernel: the GLU's output clear of x and each of gate's and up's
 * outputs or equal to one (each value is written by one lane, the GLU's
 * last). */
static bool fuses_glu(const dj_op_call *g, const dj_op_call *glu) {
    if (!dj__cuda_q4_glu_takes(&g[0], &g[1], glu)) return false;
    const size_t ob = (size_t)g[0].n * g[0].m * sizeof(__nv_bfloat16), xb = (size_t)g[0].n * g[0].k * 2;
    if (overlap(glu->out, ob, g[0].x, xb)) return false;
    for (int i = 0; i < 2; i++)
        if (glu->out != g[i].out && overlap(glu->out, ob, g[i].out, ob)) return false;
    return true;
}

/* c may join the GEMV group g[0..count): same input, shapes and dtypes, its
 * output clear of the group's outputs. */
static bool joins_gemv(const dj_cuda_backend *cb, const dj_op_call *g, int count, const dj_op_call *c) {
    if (count == DJ_GEMV_GROUP || !dj__cuda_gemv_takes(cb, c)) return false;
    if (c->x != g->x || c->n != g->n || c->k != g->k || c->w_dtype != g->w_dtype || c->out_dtype != g->out_dtype)
        return false;
    const size_t es = dj_dtype_size(c->out_dtype);
    for (int i = 0; i < count; i++)
        if (overlap(c->out, (size_t)c->n * c->m * es, g[i].out, (size_t)g[i].n * g[i].m * es)) return false;
    return true;
}

/* c may join the group g[0..count) of FP8 tensor-core GEMMs of one input:
 * the same input, shape and weight blocks; no output overlapping the input
 * or another's (the input is read, quantized, once, before any of them runs). */
static bool joins_f8_shared(const dj_cuda_backend *cb, const dj_op_call *g, int count, const dj_op_call *c) {
    if (count == F8_SHARED_GROUP || !dj__cuda_fp8_shared_takes(cb, c)) return false;
    if (c->x != g->x || c->n != g->n || c->k != g->k || c->w_block_rows != g->w_block_rows ||
        c->w_block_cols != g->w_block_cols)
        return false;
    const size_t xb = (size_t)c->n * c->k * 2;
    for (int i = 0; i <= count; i++) {
        const dj_op_call *a = i < count ? &g[i] : c;
        if (overlap(a->out, (size_t)a->n * a->m * 2, g->x, xb)) return false;
        for (int j = 0; j < i; j++)
            if (overlap(a->out, (size_t)a->n * a->m * 2, g[j].out, (size_t)g[j].n * g[j].m * 2)) return false;
    }
    return true;
}

/* ---- deciding ---- */

/* What the decisions depend on, hashed (FNV-1a): ops, shapes, dtypes,
 * pointers, and positions relative to the first call's. */
static uint64_t plan_sig(const dj_op_call *calls, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const uint32_t pos0 = n ? calls[0].pos0 : 0;
    for (size_t i = 0; i < n; i++) {
        const dj_op_call *c = &calls[i];
        uint32_t scale_bits = 0, off_bits = 0, cap_bits = 0;
        memcpy(&scale_bits, &c->scale, sizeof scale_bits);
        memcpy(&off_bits, &c->w_offset, sizeof off_bits);
        memcpy(&cap_bits, &c->softcap, sizeof cap_bits);
        const uint64_t v[] = {(uint64_t)c->op, c->n, (uintptr_t)c->out, (uintptr_t)c->x, (uintptr_t)c->x2,
                              (uintptr_t)c->w, (uint64_t)c->w_dtype, (uint64_t)c->out_dtype, (uint64_t)c->x_dtype,
                              c->k, c->m, c->d, (uint64_t)(c->pos0 - pos0), (uintptr_t)c->row_pos,
                              (uintptr_t)c->inv_freq, (uintptr_t)c->row_freq, c->n_heads, c->head_dim, scale_bits,
                              c->kv ? c->kv->kv_dim : 0, off_bits, cap_bits, c->groups, c->rot_dim,
                              (uintptr_t)c->route, c->expert, c->top_k};
        for (size_t j = 0; j < sizeof v / sizeof *v; j++) {
            h ^= v[j];
            h *= 1099511628211ull;
        }
    }
    return h;
}

/* The calls from calls[i] on that form one GEMV group (calls[i] takes the GEMV). */
static int gemv_run(const dj_cuda_backend *cb, const dj_op_call *calls, size_t n, size_t i) {
    int count = 1;
    while (i + (size_t)count < n && joins_gemv(cb, &calls[i], count, &calls[i + (size_t)count])) count++;
    return count;
}

/* The calls from calls[i] on that form one shared-input FP8 group. */
static int f8_shared_run(const dj_cuda_backend *cb, const dj_op_call *calls, size_t n, size_t i) {
    int count = 1;
    while (i + (size_t)count < n && joins_f8_shared(cb, &calls[i], count, &calls[i + (size_t)count])) count++;
    return count;
}

/* ---- what a plan reads after a point ---- */

/* The bytes c reads as activations at x (which 0) or x2 (1): 0 where there
 * is none, SIZE_MAX where this file does not know them. */
static size_t in_bytes(const dj_op_call *c, int which) {
    const void *p = which ? c->x2 : c->x;
    if (!p) return 0;
    const size_t n = c->n, bf = sizeof(__nv_bfloat16);
    switch (c->op) {
    case DJ_OP_MATMUL: return which ? SIZE_MAX : n * c->k * bf;
    case DJ_OP_RMSNORM:
        return which ? SIZE_MAX : n * c->d * (c->groups > 1 ? c->groups : 1) * dj_dtype_size(c->x_dtype);
    case DJ_OP_ADD: return n * c->d * (which ? bf : dj_dtype_size(c->x_dtype));
    case DJ_OP_SILU_MUL:
    case DJ_OP_GELU_MUL: return n * c->d * bf;
    case DJ_OP_ROPE:
    case DJ_OP_ATTENTION: return which ? SIZE_MAX : n * c->n_heads * c->head_dim * bf;
    case DJ_OP_KV_WRITE: return c->kv ? n * c->kv->kv_dim * bf : SIZE_MAX;
    case DJ_OP_EMBED:
    case DJ_OP_SOFTCAP:
    case DJ_OP_MOE_ROUTE:
    case DJ_OP_MOE_FFN:
    case DJ_OP_LORA:
    case DJ_OP_COUNT: break; /* not known here: counts as reading everything */
    }
    return SIZE_MAX;
}

/* The bytes c writes at out (0: none, or not known here). */
static size_t out_bytes(const dj_op_call *c) {
    const size_t n = c->n, bf = sizeof(__nv_bfloat16);
    if (!c->out) return 0;
    switch (c->op) {
    case DJ_OP_MATMUL: return n * c->m * dj_dtype_size(c->out_dtype);
    case DJ_OP_RMSNORM: return n * c->d * (c->groups > 1 ? c->groups : 1) * bf;
    case DJ_OP_ADD: return n * c->d * dj_dtype_size(c->out_dtype);
    case DJ_OP_SILU_MUL:
    case DJ_OP_GELU_MUL: return n * c->d * bf;
    case DJ_OP_ROPE:
    case DJ_OP_ATTENTION: return n * c->n_heads * c->head_dim * bf;
    case DJ_OP_EMBED:
    case DJ_OP_KV_WRITE:
    case DJ_OP_SOFTCAP:
    case DJ_OP_MOE_ROUTE:
    case DJ_OP_MOE_FFN:
    case DJ_OP_LORA:
    case DJ_OP_COUNT: break; /* not known here: counts as writing nothing */
    }
    return 0;
}

/* Whether no call from calls[from] on reads any of [p, p + bytes) before
 * calls write all of it over. Bytes still unwritten at the plan's end count
 * as read (the engine, or a hook at the end of a segment, may read them).
 * The unwritten bytes are kept as up to DEAD_PIECES intervals; more count
 * as read. */
#define DEAD_PIECES 8
static bool dead_after(const dj_op_call *calls, size_t n, size_t from, const void *p, size_t bytes) {
    uintptr_t lo[DEAD_PIECES], hi[DEAD_PIECES];
    int np = 1;
    lo[0] = (uintptr_t)p, hi[0] = (uintptr_t)p + bytes;
    for (size_t i = from; i < n; i++) {
        const dj_op_call *c = &calls[i];
        if (c->op == DJ_OP_LORA) return false; /* it reads its x and its out: counts as reading everything */
        for (int w = 0; w < 2; w++) {
            const size_t nb = in_bytes(c, w);
            if (!nb) continue;
            const uintptr_t a = (uintptr_t)(w ? c->x2 : c->x), b = nb == SIZE_MAX ? UINTPTR_MAX : a + nb;
            for (int k = 0; k < np; k++)
                if (a < hi[k] && lo[k] < b) return false;
        }
        const size_t ob = out_bytes(c);
        if (!ob) continue;
        const uintptr_t a = (uintptr_t)c->out, b = a + ob;
        uintptr_t nlo[2 * DEAD_PIECES], nhi[2 * DEAD_PIECES];
        int nn = 0;
        for (int k = 0; k < np; k++) { /* what of piece k the write leaves: up to two pieces */
            if (b <= lo[k] || hi[k] <= a) {
                nlo[nn] = lo[k], nhi[nn++] = hi[k];
                continue;
            }
            if (lo[k] < a) nlo[nn] = lo[k], nhi[nn++] = a;
            if (b < hi[k]) nlo[nn] = b, nhi[nn++] = hi[k];
        }
        if (nn == 0) return true;
        if (nn > DEAD_PIECES) return false;
        memcpy(lo, nlo, sizeof(uintptr_t) * (size_t)nn);
        memcpy(hi, nhi, sizeof(uintptr_t) * (size_t)nn);
        np = nn;
    }
    return false;
}

/* Whether the GLU calls[i]'s output is read by nothing after its GEMM calls[i + 1]. */
static bool glu_dead(const dj_op_call *calls, size_t n, size_t i) {
    const dj_op_call *glu = &calls[i];
    return i + 2 <= n && dead_after(calls, n, i + 2, glu->out, (size_t)glu->n * glu->d * sizeof(__nv_bfloat16));
}

/* After a norm step quantizing for the FP8 group gate, up at calls[j],
 * calls[j + 1]: their GLU and down as dj__cuda_f8_mlp_lt runs them - gate's
 * and up's weights one matrix, the GLU of their outputs quantizing for down,
 * and nothing after it reading gate's or up's output (the step leaves them
 * unwritten). */
static bool f8_mlp_fuses(const dj_cuda_backend *cb, const dj_op_call *calls, size_t n, size_t j) {
    if (j + 3 >= n) return false;
    const dj_op_call *gate = &calls[j], *up = &calls[j + 1], *glu = &calls[j + 2], *down = &calls[j + 3];
    if (!dj__cuda_f8_pair_takes(gate, up) || !dj__cuda_glu_fp8_takes(cb, glu, down) || glu->x != gate->out ||
        glu->x2 != up->out || gate->out_dtype != DJ_DTYPE_BF16 || up->out_dtype != DJ_DTYPE_BF16)
        return false;
    const size_t ob = (size_t)gate->n * gate->m * sizeof(__nv_bfloat16);
    return dead_after(calls, n, j + 3, gate->out, ob) && dead_after(calls, n, j + 3, up->out, ob);
}

/* After a norm step quantizing for the FP8 group q, k, v at calls[j..j+3):
 * the ROPEs of q and k and the KV_WRITE as dj__cuda_f8_qkv_lt runs them -
 * the three weights one matrix, the ROPE step of their outputs on bf16
 * pages, and each output either written over in place by its ROPE or read
 * by nothing after the step (v's always: the pages take it). */
static bool f8_qkv_fuses(const dj_op_call *calls, size_t n, size_t j) {
    if (j + 5 >= n) return false;
    const dj_op_call *g = &calls[j], *rq = &calls[j + 3], *rk = &calls[j + 4], *kvw = &calls[j + 5];
    if (!dj__cuda_f8_triple_takes(g) || rq->op != DJ_OP_ROPE || !fuses_with_rope(rk, kvw) ||
        !pairs_with_rope(rq, rk, kvw) || kvw->kv->dtype != DJ_DTYPE_BF16 || rq->x != g[0].out || rk->x != g[1].out ||
        kvw->x2 != g[2].out || (uint64_t)rq->n_heads * rq->head_dim != g[0].m ||
        (uint64_t)rk->n_heads * rk->head_dim != g[1].m || kvw->kv->kv_dim != g[2].m)
        return false;
    for (int i = 0; i < 3; i++) {
        if (g[i].out_dtype != DJ_DTYPE_BF16) return false;
        const void *rot = i == 0 ? rq->out : i == 1 ? rk->out : NULL;
        if (g[i].out != rot && !dead_after(calls, n, j + 6, g[i].out, (size_t)g[i].n * g[i].m * sizeof(__nv_bfloat16)))
            return false;
    }
    return true;
}

/* The steps of calls[0..n) into steps (room for n). Returns how many. */
static size_t decide(const dj_cuda_backend *cb, const dj_op_call *calls, size_t n, plan_step *steps) {
    size_t ns = 0;
    for (size_t i = 0; i < n;) {
        const dj_op_call *c = &calls[i];
        plan_step s = {STEP_ONE, 1, (int32_t)i, -1, 0, 0};
        if (cb->fuse) {
            if (i + 4 < n && c->op == DJ_OP_RMSNORM && c->groups > 1 && fuses_norm_rope(c)) {
                s = (plan_step){STEP_NORM_ROPE_KV, 5, (int32_t)i, -1, 0, 0};
            } else if (i + 2 < n && c->op == DJ_OP_ROPE && fuses_with_rope(&calls[i + 1], &calls[i + 2]) &&
                pairs_with_rope(c, &calls[i + 1], &calls[i + 2])) {
                s = (plan_step){STEP_ROPE_KV, 2, (int32_t)i + 1, (int32_t)i, 0, 0};
            } else if (i + 1 < n && fuses_with_rope(c, &calls[i + 1])) {
                s = (plan_step){STEP_ROPE_KV, 2, (int32_t)i, -1, 0, 0};
            } else if (i + 2 < n && fuses_before_add(c, &calls[i + 1], &calls[i + 2])) {
                s = (plan_step){STEP_NORM_ADD_NORM, 3, (int32_t)i, -1, 0, 0};
            } else if (i + 1 < n && fuses_with_add(c, &calls[i + 1])) {
                s = (plan_step){STEP_ADD_NORM, 2, (int32_t)i, -1, 0, 0};
            } else if (i + 1 < n && dj__cuda_glu_fp8_takes(cb, c, &calls[i + 1])) {
                s = (plan_step){STEP_GLU_F8, 2, (int32_t)i, -1, 0, 0};
            } else if (i + 1 < n && dj__cuda_attn_fp8_takes(cb, c, &calls[i + 1])) {
                s = (plan_step){STEP_ATTN_F8, 2, (int32_t)i, -1, 0, 0};
                if (dead_after(calls, n, i + 2, c->out, (size_t)c->n * c->n_heads * c->head_dim * sizeof(__nv_bfloat16)))
                    s.dead |= DJ_F8_DEAD_ATTN;
            } else if (dj__cuda_gemv_takes(cb, c)) {
                s = (plan_step){STEP_GEMV, (uint8_t)gemv_run(cb, calls, n, i), (int32_t)i, -1, 0, 0};
                if (s.count == 2 && i + 2 < n && fuses_glu(c, &calls[i + 2]))
                    s = (plan_step){STEP_GEMV_GLU, 3, (int32_t)i, -1, 0, 0};
            } else if (dj__cuda_fp8_shared_takes(cb, c)) {
                const int cnt = f8_shared_run(cb, calls, n, i);
                if (cnt > 1) s = (plan_step){STEP_F8_SHARED, (uint8_t)cnt, (int32_t)i, -1, 0, 0};
            }
        }
        const size_t j = i + s.count; /* the FP8 GEMMs reading the norm's output */
        if ((s.kind == STEP_ADD_NORM || s.kind == STEP_NORM_ADD_NORM) && j < n &&
            dj__cuda_norm_fp8_takes(cb, &calls[j - 1], &calls[j])) {
            const uint8_t norms = s.count;
            const int ng = f8_shared_run(cb, calls, n, j);
            const bool mlp = ng == 2 && f8_mlp_fuses(cb, calls, n, j), qkv = ng == 3 && f8_qkv_fuses(calls, n, j);
            s = (plan_step){(uint8_t)(mlp ? STEP_F8_MLP : qkv ? STEP_F8_QKV : STEP_NORM_F8),
                            (uint8_t)(norms + (mlp ? 4 : qkv ? 6 : ng)), (int32_t)i, -1, norms, 0};
            /* the norm's bf16 output, read by the GEMMs only through the codes; the GLU's, by down */
            const dj_op_call *nm = &calls[j - 1];
            if (dead_after(calls, n, j + (size_t)ng, nm->out, (size_t)nm->n * nm->d * sizeof(__nv_bfloat16)))
                s.dead |= DJ_F8_DEAD_NORM;
            if (mlp && glu_dead(calls, n, j + 2)) s.dead |= DJ_F8_DEAD_GLU;
        }
        if (s.kind == STEP_GLU_F8 && glu_dead(calls, n, i)) s.dead |= DJ_F8_DEAD_GLU;
        steps[ns++] = s;
        i = (size_t)s.first + s.count;
    }
    return ns;
}

/* The kept decisions for this plan, made now where none fit. */
static dj_status plan_for(dj_cuda_backend *cb, const dj_op_call *calls, size_t n, const void *key,
                          const plan_step **steps, size_t *n_steps) {
    if (!cb->plans) {
        cb->plans = (dj_cuda_plan *)calloc(DJ_CUDA_PLANS, sizeof *cb->plans);
        if (!cb->plans) return dj_fail(DJ_ENOMEM, "cuda plan cache: out of host memory");
    }
    const uint64_t sig = plan_sig(calls, n);
    dj_cuda_plan *p = NULL;
    for (unsigned i = 0; key && i < DJ_CUDA_PLANS; i++)
        if (cb->plans[i].key == key) p = &cb->plans[i];
    if (p && p->sig == sig && p->n_calls == n && p->fuse == cb->fuse) {
        *steps = p->steps;
        *n_steps = p->n_steps;
        return DJ_OK;
    }
    if (!p) { /* a key not kept, or none: the next slot */
        p = &cb->plans[cb->plan_next];
        cb->plan_next = (cb->plan_next + 1) % DJ_CUDA_PLANS;
    }
    plan_step *s = (plan_step *)realloc(p->steps, (n ? n : 1) * sizeof *s);
    if (!s) return dj_fail(DJ_ENOMEM, "cuda plan of %zu calls: out of host memory", n);
    p->steps = s;
    p->n_steps = decide(cb, calls, n, s);
    p->key = key;
    p->sig = sig;
    p->n_calls = n;
    p->fuse = cb->fuse;
    *steps = p->steps;
    *n_steps = p->n_steps;
    if (!key) p->key = NULL; /* kept for this call only */
    return DJ_OK;
}

void dj__cuda_plans_free(dj_cuda_backend *cb) {
    for (unsigned i = 0; cb->plans && i < DJ_CUDA_PLANS; i++) free(cb->plans[i].steps);
    free(cb->plans);
    cb->plans = NULL;
}

/* ---- running ---- */

/* FP8 tensor-core GEMMs of one input g[0..count): the input quantized once for
 * those cuBLASLt takes (more than one), the rest - or a lone one - alone. */
static dj_status run_f8_group(dj_cuda_backend *cb, const dj_op_call *g, int count) {
    int done = 0;
    dj_status st = count > 1 ? dj__cuda_matmul_fp8_lt_shared(cb, g, count, &done) : DJ_OK;
    if (done > 1) cb->fusions += (uint64_t)(done - 1); /* quantizations saved */
    for (int i = done; st == DJ_OK && i < count; i++) st = dj__cuda_compute_one(cb, &g[i]);
    return st;
}

/* The norm step c[0..nn) quantizing its output for the FP8 GEMMs c[nn .. nn + ng) of it. */
static dj_status run_norm_f8(dj_cuda_backend *cb, const dj_op_call *c, int nn, int ng, unsigned dead) {
    const dj_op_call *pre = nn == 3 ? &c[0] : NULL, *g = &c[nn];
    int done = 0;
    dj_status st = dj__cuda_norm_fp8_lt(cb, pre, &c[nn - 2], &c[nn - 1], g, ng, dead, &done);
    if (st != DJ_OK) return st;
    if (done == 0) { /* not taken (the GEMMs' first run probes cuBLASLt): the two steps apart */
        if ((st = dj__cuda_add_rmsnorm(cb, pre, &c[nn - 2], &c[nn - 1], NULL)) != DJ_OK) return st;
        cb->fusions += (uint64_t)(nn - 1);
        return run_f8_group(cb, g, ng);
    }
    cb->fusions += (uint64_t)(nn - 1 + done - 1); /* the norm's, and a quantization saved a GEMM run */
    for (int i = done - 1; st == DJ_OK && i < ng; i++) st = dj__cuda_compute_one(cb, &g[i]);
    return st;
}

/* The GLU c[0] quantizing its output for c[1], its FP8 GEMM. */
static dj_status run_glu_f8(dj_cuda_backend *cb, const dj_op_call *c, unsigned dead) {
    int done = 0;
    dj_status st = dj__cuda_glu_fp8_lt(cb, &c[0], &c[1], dead, &done);
    if (done == 2) cb->fusions++; /* a quantization pass saved */
    for (int i = done; st == DJ_OK && i < 2; i++) st = dj__cuda_compute_one(cb, &c[i]);
    return st;
}

static dj_status run_step(dj_cuda_backend *cb, const dj_op_call *calls, const plan_step *s) {
    const dj_op_call *c = &calls[s->first];
    if (s->kind == STEP_ONE) return dj__cuda_compute_one(cb, c);
    DJ_CU(cb, cudaSetDevice(cb->device));
    switch (s->kind) {
    case STEP_GEMV:
        return dj__cuda_gemv(cb, c, s->count);
    case STEP_ADD_NORM:
        cb->fusions++;
        return dj__cuda_add_rmsnorm(cb, NULL, &c[0], &c[1], NULL);
    case STEP_GEMV_GLU:
        cb->fusions++;
        return dj__cuda_gemv_q4_glu(cb, c, &c[2]);
    case STEP_NORM_ADD_NORM:
        cb->fusions += 2;
        return dj__cuda_add_rmsnorm(cb, &c[0], &c[1], &c[2], NULL);
    case STEP_F8_SHARED:
        return run_f8_group(cb, c, s->count);
    case STEP_NORM_F8:
        return run_norm_f8(cb, c, s->norms, s->count - s->norms, s->dead);
    case STEP_F8_MLP: {
        const int nn = s->norms;
        const dj_op_call *pre = nn == 3 ? &c[0] : NULL, *g = &c[nn];
        int done = 0;
        dj_status st = dj__cuda_f8_mlp_lt(cb, pre, &c[nn - 2], &c[nn - 1], g, s->dead, &done);
        if (st != DJ_OK) return st;
        if (done == 0) { /* not taken: the norm step with gate and up, then the GLU with down */
            if ((st = run_norm_f8(cb, c, nn, 2, s->dead & DJ_F8_DEAD_NORM)) != DJ_OK) return st;
            return run_glu_f8(cb, &g[2], s->dead & DJ_F8_DEAD_GLU);
        }
        /* the norm's fusions; its quantization serving gate and up (2, as STEP_NORM_F8 counts it) and the
         * pair as one GEMM; the GLU's quantization for down */
        cb->fusions += (uint64_t)(nn - 1) + (done >= 3 ? 3u : 0u) + (done == 5 ? 1u : 0u);
        if (done == 1) { /* the pair refused: gate and up from the norm's output, then the GLU with down */
            for (int i = 0; st == DJ_OK && i < 2; i++) st = dj__cuda_compute_one(cb, &g[i]);
            return st == DJ_OK ? run_glu_f8(cb, &g[2], s->dead & DJ_F8_DEAD_GLU) : st;
        }
        return done < 5 ? dj__cuda_compute_one(cb, &g[3]) : DJ_OK;
    }
    case STEP_GLU_F8:
        return run_glu_f8(cb, c, s->dead);
    case STEP_ATTN_F8: {
        const uint32_t *table = NULL;
        int done = 0;
        dj_status st = dj__cuda_device_table(cb, &c[0], &table);
        if (st == DJ_OK) st = dj__cuda_attn_fp8_lt(cb, &c[0], &c[1], table, (s->dead & DJ_F8_DEAD_ATTN) != 0, &done);
        if (done == 2) cb->fusions++; /* a quantization pass saved */
        for (int i = done; st == DJ_OK && i < 2; i++) st = dj__cuda_compute_one(cb, &c[i]);
        return st;
    }
    case STEP_F8_QKV: {
        const int nn = s->norms;
        const dj_op_call *pre = nn == 3 ? &c[0] : NULL, *g = &c[nn];
        const uint32_t *table = NULL;
        int done = 0;
        dj_status st = dj__cuda_device_table(cb, &g[5], &table);
        if (st == DJ_OK) st = dj__cuda_f8_qkv_lt(cb, pre, &c[nn - 2], &c[nn - 1], g, table, s->dead, &done);
        if (st != DJ_OK) return st;
        if (done == 0) st = run_norm_f8(cb, c, nn, 3, s->dead); /* not taken: the steps apart */
        for (int i = 0; done == 1 && st == DJ_OK && i < 3; i++) st = dj__cuda_compute_one(cb, &g[i]);
        if (st == DJ_OK && done < 7) st = dj__cuda_rope_kv_write(cb, &g[3], &g[4], &g[5], table);
        /* the norm's fusions and its quantization serving q, k and v (as STEP_NORM_F8 counts them); the three
         * as one GEMM (2); the ROPEs with the KV_WRITE (2, as STEP_ROPE_KV) */
        if (st == DJ_OK) cb->fusions += 2u + (done >= 4 ? (uint64_t)(nn - 1) + 5u : 0u) + (done == 1 ? (uint64_t)(nn - 1) : 0u);
        return st;
    }
    case STEP_NORM_ROPE_KV: {
        const uint32_t *table = NULL;
        const dj_status st = dj__cuda_device_table(cb, &c[4], &table);
        if (st != DJ_OK) return st;
        cb->fusions += 4;
        return dj__cuda_norm_rope_kv_write(cb, &c[0], &c[1], &c[2], &c[3], &c[4], table);
    }
    case STEP_ROPE_KV: {
        const uint32_t *table = NULL;
        const dj_status st = dj__cuda_device_table(cb, &c[1], &table);
        if (st != DJ_OK) return st;
        cb->fusions += s->rope_q >= 0 ? 2 : 1;
        return dj__cuda_rope_kv_write(cb, s->rope_q >= 0 ? &calls[s->rope_q] : NULL, &c[0], &c[1], table);
    }
    default: break;
    }
    return dj_fail(DJ_EINTERNAL, "cuda plan: step kind %d", (int)s->kind);
}

/* The calls a launch reads: idx[0..return). */
static uint32_t step_calls(const plan_step *s, int32_t *idx) {
    uint32_t k = 0;
    for (int i = 0; i < s->count; i++) idx[k++] = s->first + i;
    if (s->rope_q >= 0) idx[k++] = s->rope_q;
    return k;
}

/* A streamed step's calls [a, b) as one planned segment (its decisions kept
 * under key): each launch waits for its load and marks it done after. */
static dj_status stream_segment(dj_cuda_backend *cb, dj_stream_run *run, const dj_op_call *calls, size_t a, size_t b,
                                const void *key) {
    if (b <= a) return DJ_OK;
    const plan_step *steps = NULL;
    size_t n_steps = 0;
    int32_t idx[DJ_GEMV_GROUP + 4];
    dj_status st = plan_for(cb, calls + a, b - a, key, &steps, &n_steps);
    for (size_t i = 0; st == DJ_OK && i < n_steps; i++) {
        const uint32_t k = step_calls(&steps[i], idx);
        for (uint32_t t = 0; t < k; t++) idx[t] += (int32_t)a;
        st = dj__stream_before(run, idx, k);
        if (st == DJ_OK) st = run_step(cb, calls + a, &steps[i]);
        if (st == DJ_OK) st = dj__stream_after(run, idx, k);
    }
    return st;
}

dj_status dj__cuda_compute_plan(dj_backend_t *be, const dj_op_call *calls, size_t n, const void *plan_key,
                                const dj_stream_step *stream) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    if (n && !calls) return dj_fail(DJ_EINVAL, "cuda compute_plan: NULL calls");
    const plan_step *steps = NULL;
    size_t n_steps = 0;
    dj_status st = DJ_OK;
    for (size_t i = 0; st == DJ_OK && i < n; i++) st = dj__cuda_check_call(cb, &calls[i]); /* before any launch */
    if (st == DJ_OK && stream) st = dj__cuda_host_status(cb);
    if (st == DJ_OK && stream) {
        /* streamed weights: each launch waits for its load, marks it done after. The device calls
         * between host runs are planned (fused) as segments of their own, never across a run; a
         * segment's decisions are kept under its run's address (the last one's under plan_key);
         * the device's share beside a host run, [first, join), is one more (under &run.join). */
        dj_stream_run run;
        st = dj__cuda_stream_begin(cb, stream, n, &run);
        if (st != DJ_OK) return st;
        size_t a = 0;
        for (uint32_t j = 0; st == DJ_OK && j <= stream->n_runs; j++) {
            const dj_host_run *h = j < stream->n_runs ? &stream->runs[j] : NULL;
            st = stream_segment(cb, &run, calls, a, h ? h->first : n, h ? (const void *)h : plan_key);
            if (st != DJ_OK || !h) break;
            st = dj__cuda_host_run(cb, stream->host, h, j);
            if (st == DJ_OK && h->join) { /* the device's share beside the host's, then the join */
                st = stream_segment(cb, &run, calls, h->first, h->join, (const void *)&h->join);
                const dj_status jst = dj__cuda_host_join(cb, j);
                if (st == DJ_OK) st = jst;
                a = h->join;
            } else {
                a = (size_t)h->first + h->n_calls;
            }
        }
        return dj__cuda_stream_end(&run, st);
    }
    if (st == DJ_OK) st = plan_for(cb, calls, n, plan_key, &steps, &n_steps);
    for (size_t i = 0; st == DJ_OK && i < n_steps; i++) st = run_step(cb, calls, &steps[i]);
    if (st != DJ_OK && cb->capturing && cb->capture_st == DJ_OK) cb->capture_st = st;
    return st;
}
