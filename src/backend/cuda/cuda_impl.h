/* cuda_impl.h: private state of the CUDA backend, the error-check macros and
 * the launchers its compute switch dispatches to (one .cu per kernel family). */
#ifndef DJ_CUDA_IMPL_H
#define DJ_CUDA_IMPL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/dj_cuda.h"
#include "backend/backend_impl.h"

/* Most GEMV calls merged into one launch. */
#define DJ_GEMV_GROUP 4
/* Plans whose fusion decisions are kept (a step's graph per batch bucket and phase). */
#define DJ_CUDA_PLANS 64

typedef struct dj_cuda_backend {
    struct dj_backend base; /* must stay first */
    int device;
    int n_sm;                 /* streaming multiprocessors */
    size_t smem_optin;        /* largest dynamic shared memory a block may opt into */
    cudaStream_t stream;      /* every copy and kernel of this backend */
    cublasHandle_t blas;      /* bound to stream */
    /* Staging for host inputs (token ids, block tables): a pinned host buffer
     * and a device buffer of the same size, bump-allocated between syncs. */
    uint8_t *stage_host;      /* [stage_cap] pinned; owned */
    uint8_t *stage_dev;       /* [stage_cap] device; owned */
    size_t stage_cap, stage_off;
    float *scratch;           /* [scratch_cap] device f32 (attention partials); owned */
    size_t scratch_cap;       /* floats */
    /* Scratch buffers outgrown: a captured graph may still point into them,
     * so they are freed only with the backend. */
    void **retired;           /* [n_retired] device; owned */
    size_t n_retired, retired_cap;
    void *blas_ws;            /* cuBLAS workspace (fixed, so captures allocate none); owned */
    bool capturing;           /* between capture_begin and capture_end */
    dj_status capture_st;     /* first failure of a call recorded in this capture */
    bool fuse;                /* compute_plan fuses at all ($DJINN_FUSE != off) */
    uint64_t fusions;         /* calls that ran inside another call's kernel */
    uint64_t unstored;        /* bf16 outputs left unstored: read by nothing but through FP8 codes */
    /* Fusion decisions of recent plans (cuda_plan.cu), replaced round robin. */
    struct dj_cuda_plan *plans; /* [DJ_CUDA_PLANS]; owned */
    unsigned plan_next;
    int attention_path;       /* dj__cuda_set_paths */
    bool attn_tc;             /* automatic prefill may use tensor cores ($DJINN_ATTN != simple) */
    bool attn_wg;             /* ... and the wgmma kernel ($DJINN_ATTN != simple, tc) */
    void *tmap_encode;        /* cuTensorMapEncodeTiled (Hopper only), or NULL: no wgmma attention */
    int last_attention;       /* kernel of the latest ATTENTION call: 1 decode, 2 f32 prefill, 3 tensor cores
                               * (mma.sync), 4 wgmma */
    int matmul_path;
    struct dj_fp8_lt *fp8_lt; /* cuBLASLt FP8 state (cuda_matmul_fp8_lt.cu), made at first use; owned */
    uint32_t sample_split; /* blocks per sampled row forced by a test; 0 = chosen by rows and vocab */
    /* KV swap (cuda_swap.cu): host<->device copies on a stream of their own,
     * made at the first transfer, ordered after compute by compute_mark. */
    cudaStream_t copy_stream; /* owned, or NULL */
    cudaEvent_t compute_mark; /* recorded on stream, waited on by copy_stream; owned, or NULL */
    bool batch_refused;       /* cudaMemcpyBatchAsync refused once: copy span by span */
    /* Weight streaming (cuda_ring.cu): host->device copies of streamed layers
     * on a stream of their own, made at the first ring. */
    cudaStream_t weight_stream; /* owned, or NULL */
    cudaEvent_t weight_mark;    /* serial copies: recorded on stream, waited on by weight_stream */
    /* Host compute (cuda_ring.cu): a host run failed inside a host function
     * (set there, __atomic); the next sync or streamed step reports host_err. */
    int host_failed;
    char host_err[256];
    /* A host run beside the device (dj_host_run.join): its copies and host function on a stream of
     * their own after host_mark; host_done[slot] recorded after them, waited on at the join. */
    cudaStream_t host_stream; /* owned, or NULL */
    cudaEvent_t host_mark;    /* owned, or NULL */
    cudaEvent_t *host_done;   /* [n_host_done]; owned */
    uint32_t n_host_done;
    bool pdl; /* programmatic dependent launch of the decode kernels (dj__launch); $DJINN_PDL=off: the kill switch */
} dj_cuda_backend;

template <typename... P, typename... A>
static inline cudaError_t dj__launch(const dj_cuda_backend *cb, void (*kernel)(P...), dim3 grid, dim3 block,
                                     size_t smem, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = cb->stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = cb->pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, kernel, args...);
}

/* Enqueues host run h (the slot-th of its step) of a streamed step: its in
 * copies, its calls on `host` in a host function, its out copies - on the
 * compute stream (h->join 0), or beside it on the host stream after the
 * compute enqueued so far, marking host_done[slot] (then the compute waits
 * at the join: dj__cuda_host_join). */
dj_status dj__cuda_host_run(dj_cuda_backend *cb, dj_backend_t *host, const dj_host_run *h, uint32_t slot);
dj_status dj__cuda_host_join(dj_cuda_backend *cb, uint32_t slot);
/* Waits for the host stream and releases it and its events (backend free). */
void dj__cuda_host_destroy(dj_cuda_backend *cb);
/* DJ_OK, or the failure of a host run since the last call (then cleared). */
dj_status dj__cuda_host_status(dj_cuda_backend *cb);

/* Records "cuda:<dev> <file>:<line>: <msg>" and returns st. */
dj_status dj__cuda_fail(dj_status st, int device, const char *file, int line, const char *msg);

/* Checks a CUDA runtime call inside a function returning dj_status. */
#define DJ_CU(cb, call)                                                                          \
    do {                                                                                         \
        cudaError_t dj_e_ = (call);                                                              \
        if (dj_e_ != cudaSuccess)                                                                \
            return dj__cuda_fail(DJ_EDEVICE, (cb)->device, __FILE__, __LINE__, cudaGetErrorString(dj_e_)); \
    } while (0)

/* Checks the launch just made. */
#define DJ_CU_LAUNCHED(cb) DJ_CU(cb, cudaGetLastError())

/* ---- programmatic dependent launch (Hopper; docs/internals.md, the CUDA backend) ----
 * A kernel launched through dj__launch with cb->pdl set may be scheduled
 * while the kernel before it on the stream still runs (once every block of
 * that one has called dj_pdl_release or exited), so its launch and its
 * weight prefetch overlap the other's tail. Such a kernel calls dj_pdl_wait
 * before it reads anything an earlier kernel of the step writes, or writes
 * anything one reads (wait returns once the earlier grids have completed and
 * their stores are visible; without PDL it returns at once). On the H100
 * (bench/RESULTS.md, 2026-11-26) it took 1-2% off a decode step; each GEMV
 * warp prefetching its first 2 KiB of weights into L2 before the wait made
 * the step 1.5-4% slower instead (deleted). */
static __device__ __forceinline__ void dj_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
static __device__ __forceinline__ void dj_pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/* kernel<<<grid, block, smem, cb->stream>>>(args...), with the PDL attribute
 * when cb->pdl. Returns the launch's error. */
template <typename... P, typename... A>
static inline cudaError_t dj__launch(const struct dj_cuda_backend *cb, void (*kernel)(P...), dim3 grid, dim3 block,
                                     size_t smem, A... args);

/* Checks a cuBLAS call. */
#define DJ_CUBLAS(cb, call)                                                                      \
    do {                                                                                         \
        cublasStatus_t dj_s_ = (call);                                                           \
        if (dj_s_ != CUBLAS_STATUS_SUCCESS)                                                      \
            return dj__cuda_fail(DJ_EDEVICE, (cb)->device, __FILE__, __LINE__,                  \
                                 cublasGetStatusString(dj_s_));                                  \
    } while (0)

/* Copies host bytes to the device through the staging buffers, ordered on
 * the stream; *dev is valid for kernels enqueued before the next sync. */
dj_status dj__cuda_stage(dj_cuda_backend *cb, const void *host, size_t bytes, const void **dev /* OUT */);
/* Device f32 scratch of at least `floats`, valid until the next call. */
dj_status dj__cuda_scratch(dj_cuda_backend *cb, size_t floats, float **out /* OUT */);

/* Element loads and stores in f32. */
/* out[i] = act(gate[i]) * up[i] over count bf16 values (SwiGLU, GeGLU), by
 * the whole grid: 8 values a thread per step with 16-byte loads and stores
 * when vec (prefill rows: count >= 2^16, count % 8 == 0, every pointer
 * 16-byte aligned: dj_glu_vec), else one (decode rows keep a thread a value,
 * so as many SMs share the few bytes). Each value's arithmetic is the same
 * either way. act: a functor float -> float. */
/* The GLU activations in f32: SiLU, and PyTorch's gelu(approximate="tanh"). */
struct dj_silu_fn {
    __device__ float operator()(float g) const { return g / (1.0f + expf(-g)); }
};
struct dj_gelu_fn {
    __device__ float operator()(float x) const {
        const float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.0f + tanhf(inner));
    }
};
static inline bool dj_glu_vec(const void *gate, const void *up, const void *out, size_t count) {
    return count >= ((size_t)1 << 16) && count % 8 == 0 &&
           (((uintptr_t)gate | (uintptr_t)up | (uintptr_t)out) & 15u) == 0;
}
template <typename Act>
static __device__ __forceinline__ void dj_glu(const __nv_bfloat16 *gate, const __nv_bfloat16 *up, __nv_bfloat16 *out,
                                              size_t count, bool vec, Act act) {
    const size_t stride = (size_t)gridDim.x * blockDim.x, first = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (!vec) {
        for (size_t i = first; i < count; i += stride)
            out[i] = __float2bfloat16(act(__bfloat162float(gate[i])) * __bfloat162float(up[i]));
        return;
    }
    for (size_t v = first; v < count / 8; v += stride) {
        const uint4 g = ((const uint4 *)gate)[v], u = ((const uint4 *)up)[v];
        const __nv_bfloat162 *g2 = (const __nv_bfloat162 *)&g, *u2 = (const __nv_bfloat162 *)&u;
        uint4 o;
        __nv_bfloat162 *o2 = (__nv_bfloat162 *)&o;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float2 gf = __bfloat1622float2(g2[e]), uf = __bfloat1622float2(u2[e]);
            o2[e] = __floats2bfloat162_rn(act(gf.x) * uf.x, act(gf.y) * uf.y);
        }
        ((uint4 *)out)[v] = o;
    }
}

/* D = A B + D on the tensor cores, m16n8k16, bf16 in, f32 accumulate. With g = lane/4, c = lane%4
 * (PTX ISA, "Matrix Fragments for mma.m16n8k16" for .bf16):
 *   A (16x16, row-major): a0 = (g, 2c..2c+1), a1 = (g+8, 2c..), a2 = (g, 2c+8..), a3 = (g+8, 2c+8..)
 *   B (16x8, k x n):      b0 = (k 2c..2c+1, n g), b1 = (k 2c+8..2c+9, n g)
 *   C/D (16x8 f32):       d0,d1 = (g, 2c..2c+1), d2,d3 = (g+8, 2c..2c+1)
 * each .b32 register packing two bf16, the lower column (or k) in the low half. */
static __device__ __forceinline__ void dj_mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ float dj_ld(const __nv_bfloat16 *p, size_t i) { return __bfloat162float(p[i]); }
static __device__ __forceinline__ float dj_ld(const __half *p, size_t i) { return __half2float(p[i]); }
static __device__ __forceinline__ float dj_ld(const float *p, size_t i) { return p[i]; }
static __device__ __forceinline__ void dj_st(__nv_bfloat16 *p, size_t i, float v) { p[i] = __float2bfloat16(v); }
static __device__ __forceinline__ void dj_st(float *p, size_t i, float v) { p[i] = v; }

/* f8_e4m3 K/V pages (backend.h's layout). 2^e as a float, exact for every
 * int8 exponent (subnormal below 2^-126). */
static __device__ __forceinline__ float dj_pow2f(int e) {
    return e >= -126 ? __int_as_float((e + 127) << 23) : __int_as_float(1 << (e + 149));
}
/* Two e4m3 codes (the lower byte is the lower element) as floats, exactly
 * (through f16: one cvt.f16x2.e4m3x2 on sm_89+). */
static __device__ __forceinline__ float2 dj_f8x2_to_float2(uint16_t codes) {
    return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)codes, __NV_E4M3)));
}

/* Launchers: the call has been validated by the compute switch. */
dj_status dj__cuda_embed(dj_cuda_backend *cb, const dj_op_call *c, const int32_t *ids_dev);
dj_status dj__cuda_argmax(dj_cuda_backend *cb, const float *logits, uint32_t n, uint32_t vocab, int32_t *out);
/* rows: [n] host memory, validated by the caller (staged here with their penalties). */
dj_status dj__cuda_sample(dj_cuda_backend *cb, const float *logits, uint32_t n, uint32_t vocab,
                          const dj_sample_row *rows, int32_t *out);
/* The mask hook (backend.h): each masked row's bytes and every bias staged,
 * then one kernel sets the disallowed logits to -inf and one adds the biases. */
dj_status dj__cuda_mask(dj_cuda_backend *cb, float *logits, uint32_t n, uint32_t vocab, const dj_mask_row *rows);
dj_status dj__cuda_silu_mul(dj_cuda_backend *cb, const dj_op_call *c);
dj_status dj__cuda_add(dj_cuda_backend *cb, const dj_op_call *c);
/* cuda_arch_ops.cu: the ops of the architectures beyond Llama. */
dj_status dj__cuda_gelu_mul(dj_cuda_backend *cb, const dj_op_call *c);
dj_status dj__cuda_softcap(dj_cuda_backend *cb, const dj_op_call *c);
dj_status dj__cuda_lora(dj_cuda_backend *cb, const dj_op_call *c); /* cuda_lora.cu */
dj_status dj__cuda_moe_route(dj_cuda_backend *cb, const dj_op_call *c);
/* Reads the weights of expert e only for rows routed to it: a launch whose
 * rows none route to e exits before reading any weight (decode reads only the
 * routed experts' bytes). */
dj_status dj__cuda_moe_ffn(dj_cuda_backend *cb, const dj_op_call *c);
dj_status dj__cuda_rmsnorm(dj_cuda_backend *cb, const dj_op_call *c);
/* add.out = add.x + add.x2 and norm.out = RMSNORM(add.out) in one pass;
 * bit-identical to the two launches. Requires norm.x == add.out, equal n and
 * d <= DJ_FUSE_MAX_D, and norm.out overlapping none of add's buffers except
 * by equality. prenorm (or NULL): an RMSNORM of whole rows whose output is
 * add.x2 (Gemma's post-attention and post-MLP norms), done first in the same
 * pass and stored too, bit-identical to its own launch; its weights of
 * norm's dtype, its output clear of add.x, add.out and norm.out. */
#define DJ_FUSE_MAX_D 16384 /* a thread holds its part of the row in registers (cuda_norm.cu) */
/* FP8 activation scales, group-major (not tok_major): group g's scale of row r at [g * ld + r], ld this of the
 * n rows - n rounded up to 4, cuBLASLt's block-scale rows coming in 4s, so that a GEMM can run on whole 4s
 * where its output has room (dj_op_call.out_rows; cuda_matmul_fp8_lt.cu's lt_matmul). */
static inline __host__ __device__ uint32_t dj__f8_scale_ld(uint32_t n) { return (n + 3u) / 4u * 4u; }

/* The norm's bf16 output also as e4m3 codes for FP8 GEMMs of 128x128-block
 * weights (quant_group.cuh: the codes and scales the activation
 * quantization makes of that output): codes [n][d] at q (8-byte aligned), a
 * scale per (row r, 128 channels g) at sc[tok_major ? r * d / 128 + g : g *
 * dj__f8_scale_ld(n) + r]. Rows that cannot take it (d % 128, or pointers or d that rule out
 * 16-byte chunks) get DJ_EUNSUPPORTED, nothing launched. codes_only: the
 * bf16 output is not stored (nothing reads it but through the codes). */
typedef struct dj_norm_q8 {
    uint8_t *q;
    float *sc;
    bool tok_major;
    bool codes_only;
} dj_norm_q8;
dj_status dj__cuda_add_rmsnorm(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                               const dj_op_call *norm, const dj_norm_q8 *q8 /* or NULL */);
dj_status dj__cuda_rope(dj_cuda_backend *cb, const dj_op_call *c);
dj_status dj__cuda_kv_write(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t *table_dev);
/* ROPE of k then the KV_WRITE of its output, in one pass (bit-equal to the
 * two launches). Requires kvw.x == rope.out, the same rows and positions,
 * rope.n_heads * head_dim == kv_dim, and v clear of rope.out. rope_q (or
 * NULL): a ROPE of q at the same rows, positions, frequencies and scale,
 * done in the same launch; its buffers clear of k's and v. */
dj_status dj__cuda_rope_kv_write(dj_cuda_backend *cb, const dj_op_call *rope_q, const dj_op_call *rope,
                                 const dj_op_call *kvw, const uint32_t *table_dev);
/* The same reading q, k and v from qkv (or the calls' inputs where NULL):
 * rows of ld values, q's columns, then k's, then v's (one GEMM of the
 * three); bf16 pages and rope_q only. */
dj_status dj__cuda_rope_kv_write_from(dj_cuda_backend *cb, const dj_op_call *rope_q, const dj_op_call *rope,
                                      const dj_op_call *kvw, const uint32_t *table_dev, const __nv_bfloat16 *qkv,
                                      uint32_t ld);
/* Per-head RMSNORMs of q and k (qn, kn: groups = heads, d = head_dim), the
 * ROPEs of their outputs (rq, rk) and k's KV_WRITE into bf16 pages, in one
 * pass (bit-equal to the launches it replaces). _takes: the calls' own
 * conditions (bf16 pages, head_dim 64, 128 or 256, one eps, offset and weight
 * dtype, each norm's output its ROPE's input); the caller checks the ROPEs
 * and KV_WRITE fuse (dj__cuda_rope_kv_write's conditions) and the buffers. */
bool dj__cuda_norm_rope_takes(const dj_op_call *qn, const dj_op_call *kn, const dj_op_call *rq, const dj_op_call *rk,
                              const dj_op_call *kvw);
dj_status dj__cuda_norm_rope_kv_write(dj_cuda_backend *cb, const dj_op_call *qn, const dj_op_call *kn,
                                      const dj_op_call *rq, const dj_op_call *rk, const dj_op_call *kvw,
                                      const uint32_t *table_dev);
dj_status dj__cuda_attention(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t *table_dev);
/* Whether the tensor-core prefill kernel takes this call, and its launcher. */
bool dj__cuda_attention_tc_covers(const dj_op_call *c);
/* Once per backend, after cudaSetDevice: the kernels' shared-memory limits. */
dj_status dj__cuda_attention_tc_init(dj_cuda_backend *cb);
/* Decode steps of up to DJ_CUDA_SHORT_ROWS rows below DJ_CUDA_SHORT_POS
 * positions are a class of their own (dj_backend.short_pos, short_rows):
 * the decode attention's launch differs there (cuda_attention.cu). */
#define DJ_CUDA_SHORT_POS 2048
#define DJ_CUDA_SHORT_ROWS 4
dj_status dj__cuda_attention_tc(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t *table_dev);
/* The wgmma prefill kernel (Hopper; cuda_attention_wg.cu): whether it takes the call, its setup
 * (after cudaSetDevice; no encoder or no Hopper leaves cb->tmap_encode NULL, not an error), and its
 * launcher: with codes, also the output's e4m3 codes [n][nh * 128] and a scale per row and head
 * (a head one group of 128 channels: the FP8 block GEMM's activation layout, tok_major as its
 * probe chose), the bf16 output stored only where store is set. */
bool dj__cuda_attention_wg_covers(const dj_cuda_backend *cb, const dj_op_call *c);
dj_status dj__cuda_attention_wg_init(dj_cuda_backend *cb);
dj_status dj__cuda_attention_wg(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t *table_dev, uint8_t *codes,
                                float *scales, bool tok_major, bool store);
/* Whether dj__cuda_attention runs c on the wgmma kernel (cuda_attention.cu). */
bool dj__cuda_attention_takes_wg(const dj_cuda_backend *cb, const dj_op_call *c);
dj_status dj__cuda_matmul(dj_cuda_backend *cb, const dj_op_call *c);
/* Whether this (validated) MATMUL runs as one GEMV launch, so that calls of
 * the same x, n, k and dtypes may share the launch (q/k/v, gate/up). */
bool dj__cuda_gemv_takes(const dj_cuda_backend *cb, const dj_op_call *c);
/* calls[0..count) (count <= DJ_GEMV_GROUP, each dj__cuda_gemv_takes, the
 * same x, n, k, weight and output dtypes, outputs apart) as one launch. */
dj_status dj__cuda_gemv(dj_cuda_backend *cb, const dj_op_call *calls, int count);
/* cuda_matmul_fp8.cu: f8_e4m3 weights with their scales - the GEMV of up to
 * 8 rows, or up to 32 on the tensor cores (as dj__cuda_gemv, which hands them over), and the tiled path.
 * dj__cuda_f8_gemv_takes: whether the GEMV takes c's 9 or more rows (gemv_path asks it). */
dj_status dj__cuda_gemv_fp8(dj_cuda_backend *cb, const dj_op_call *calls, int count);
bool dj__cuda_f8_gemv_takes(const dj_cuda_backend *cb, const dj_op_call *c);
/* cuda_q4.cu: whether the tensor-core 4-bit GEMV takes c (4-byte aligned x
 * and weights, at most Q4_MMA_ROWS rows of x): dj__cuda_gemv_q4 runs it. */
#define Q4_MMA_ROWS 32
bool dj__cuda_q4_mma_takes(const dj_op_call *c);
/* gate_up[0..2) (gate and up, a GEMV group of one x) and the SILU_MUL or
 * GELU_MUL of their outputs as one launch: the three outputs bit-equal to
 * the launches apart. takes: the shapes and buffers allow it (the caller
 * checks the outputs apart from each other and from x). */
bool dj__cuda_q4_glu_takes(const dj_op_call *gate, const dj_op_call *up, const dj_op_call *glu);
dj_status dj__cuda_gemv_q4_glu(dj_cuda_backend *cb, const dj_op_call *gate_up, const dj_op_call *glu);
dj_status dj__cuda_matmul_fp8(dj_cuda_backend *cb, const dj_op_call *c);
/* cuda_matmul_fp8_lt.cu: the FP8 tensor-core GEMM (W8A8, cuBLASLt). covers:
 * the call's shape and scaling may take it (not yet refused); run: DJ_OK,
 * or DJ_EUNSUPPORTED when cuBLASLt refuses (the caller falls back; the mode
 * is then off for the backend), or another error. destroy: with the backend. */
bool dj__cuda_fp8_lt_covers(const dj_cuda_backend *cb, const dj_op_call *c);
/* Whether cuBLASLt's GEMM would run all of c's rows in one pass over the weights: rows of 4, or out with
 * room for n rounded up to 4 (dj_op_call.out_rows) - else its last 1..3 rows take the GEMV too. */
bool dj__cuda_fp8_lt_one_pass(const dj_op_call *c);
/* Whether dj__cuda_matmul_fp8 tries the tensor cores for c (the automatic
 * choice, or path 3); and whether dj__cuda_matmul sends c there at all. */
bool dj__cuda_fp8_lt_wanted(const dj_cuda_backend *cb, const dj_op_call *c);
bool dj__cuda_fp8_shared_takes(const dj_cuda_backend *cb, const dj_op_call *c);
/* calls[0..count): MATMULs of one input (same x, n, k, block shape), each
 * dj__cuda_fp8_shared_takes: the activations quantized once for all (q, k
 * and v; gate and up). *done: how many ran; the caller runs the rest alone
 * (cuBLASLt refused one: the tiles from then on). */
dj_status dj__cuda_matmul_fp8_lt_shared(dj_cuda_backend *cb, const dj_op_call *calls, int count, int *done);
/* A SILU_MUL / GELU_MUL and the FP8 tensor-core GEMM of its output (128x128
 * blocks) as one step: the GLU's kernel also quantizes what it writes, so the
 * GEMM's activations are not read back. takes: shapes, alignment, and the
 * GEMM one dj__cuda_fp8_shared_takes. *done: the calls run (0 - the path not
 * verified yet - 1 or 2); the caller runs the rest as usual. */
bool dj__cuda_glu_fp8_takes(const dj_cuda_backend *cb, const dj_op_call *glu, const dj_op_call *mm);
/* dead: DJ_F8_DEAD_* of the calls' outputs nothing reads after the step (the
 * plan's finding): those are not stored, and a GEMM refused after its input
 * went unstored is an error, not a fallback. */
#define DJ_F8_DEAD_NORM 1u /* the norm's bf16 output */
#define DJ_F8_DEAD_GLU 2u  /* the GLU's bf16 output */
#define DJ_F8_DEAD_ATTN 4u /* the attention's bf16 output */
dj_status dj__cuda_glu_fp8_lt(dj_cuda_backend *cb, const dj_op_call *glu, const dj_op_call *mm, unsigned dead,
                              int *done);
/* An ATTENTION the wgmma kernel runs and the FP8 tensor-core GEMM of its
 * output (o's projection) as one step: the attention's epilogue writes the
 * GEMM's codes and scales (a head one group of 128 channels), so no
 * quantization pass reads its output back; its bf16 output stored unless
 * unstored. takes: the kernel, shapes and the GEMM one
 * dj__cuda_fp8_shared_takes. *done as dj__cuda_glu_fp8_lt's. */
bool dj__cuda_attn_fp8_takes(const dj_cuda_backend *cb, const dj_op_call *attn, const dj_op_call *mm);
dj_status dj__cuda_attn_fp8_lt(dj_cuda_backend *cb, const dj_op_call *attn, const dj_op_call *mm,
                               const uint32_t *table_dev, bool unstored, int *done);
/* An ADD+RMSNORM (prenorm: Gemma's RMSNORM in front, or NULL) whose output
 * the FP8 tensor-core GEMMs mms[0..count) of 128x128-block weights read
 * (dj__cuda_norm_fp8_takes of each; one input, as a shared group): the norm
 * kernel quantizes its output for them, so no GEMM quantizes it again -
 * every output bit for bit the calls apart. *done: 0 when nothing ran (the
 * scale layout not probed yet, or rows the norm cannot quantize), else 1 +
 * the GEMMs run (the rest are the caller's). */
bool dj__cuda_norm_fp8_takes(const dj_cuda_backend *cb, const dj_op_call *norm, const dj_op_call *mm);
dj_status dj__cuda_norm_fp8_lt(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                               const dj_op_call *norm, const dj_op_call *mms, int count, unsigned dead, int *done);
/* An MLP of FP8 128x128-block weights after its norm step (prenorm, add, norm
 * as dj__cuda_norm_fp8_lt takes them): mlp[0..4) gate, up, their GLU, down,
 * where gate's weights and scales run straight on into up's (_pair_takes:
 * one matrix of 2f rows, as the loader lays a layer's slots out): the norm
 * quantizing its output, gate and up as one GEMM into scratch (on the H100
 * the GEMM of 28,672 rows ran 11% faster than two of 14,336: bench/RESULTS.md),
 * the GLU reading its halves and quantizing for down, down. gate's and up's
 * own outputs are not written: the plan runs this only where nothing reads
 * them. *done: 0 nothing ran; 1 the norm; 3 gate and up too; 4 the GLU too;
 * 5 all (the caller runs the rest apart; only the norm's failure leaves 0). */
bool dj__cuda_f8_pair_takes(const dj_op_call *gate, const dj_op_call *up);
/* Likewise q, k and v (g[0..3)) after their norm step, as one GEMM into
 * scratch whose rows the ROPEs of q and k and the KV_WRITE (g[3..6): bf16
 * pages, dj__cuda_rope_kv_write's conditions) then read: q's, k's and v's
 * own outputs are not written (the plan runs this only where nothing reads
 * them, or a ROPE writes them in place). *done: 0 nothing ran; 1 the norm;
 * 4 the GEMM too; 7 all. */
bool dj__cuda_f8_triple_takes(const dj_op_call *g);
dj_status dj__cuda_f8_qkv_lt(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                             const dj_op_call *norm, const dj_op_call *g, const uint32_t *table_dev, unsigned dead,
                             int *done);
dj_status dj__cuda_f8_mlp_lt(dj_cuda_backend *cb, const dj_op_call *prenorm, const dj_op_call *add,
                             const dj_op_call *norm, const dj_op_call *mlp, unsigned dead, int *done);
dj_status dj__cuda_matmul_fp8_lt(dj_cuda_backend *cb, const dj_op_call *c);
void dj__cuda_fp8_lt_destroy(dj_cuda_backend *cb);
/* cuda_q4.cu: 4-bit weights (DJ_DTYPE_Q4, 4-byte aligned): the GEMV of a
 * group as dj__cuda_gemv (up to 8 rows), and larger n by bf16 tiles and cuBLAS. */
dj_status dj__cuda_gemv_q4(dj_cuda_backend *cb, const dj_op_call *calls, int count);
dj_status dj__cuda_gemm_q4(dj_cuda_backend *cb, const dj_op_call *c);

/* cuda_backend.cu: the checks of one call (K/V in the backend's kv_dtype), and
 * one call launched alone. */
dj_status dj__cuda_check_call(const dj_cuda_backend *cb, const dj_op_call *c);
dj_status dj__cuda_compute_one(dj_cuda_backend *cb, const dj_op_call *c);
/* The view's block table on the device (staged when the caller has none). */
dj_status dj__cuda_device_table(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t **out /* OUT */);

/* cuda_swap.cu: the vtable's KV swap hooks and device memory info, and the
 * release of the copy stream (called by the backend's destroy). */
dj_status dj__cuda_host_alloc(dj_backend_t *be, size_t bytes, void **out);
void dj__cuda_host_free(dj_backend_t *be, void *ptr);
dj_status dj__cuda_xfer_start(dj_backend_t *be, bool to_host, const dj_copy_span *spans, size_t n,
                              dj_backend_xfer_t **out);
dj_status dj__cuda_xfer_query(dj_backend_t *be, dj_backend_xfer_t *x, double *seconds);
dj_status dj__cuda_xfer_order(dj_backend_t *be, dj_backend_xfer_t *x);
void dj__cuda_xfer_free(dj_backend_t *be, dj_backend_xfer_t *x);
dj_status dj__cuda_mem_info(dj_backend_t *be, size_t *free_bytes, size_t *total_bytes);
void dj__cuda_swap_destroy(dj_cuda_backend *cb);

/* cuda_ring.cu: weight streaming - the vtable's ring and host_register hooks,
 * the driver of a streamed step (begin/end around compute_plan's launches)
 * and the release of the weight stream (called by the backend's destroy). */
dj_status dj__cuda_ring_new(dj_backend_t *be, uint32_t n_loads, dj_backend_ring_t **out);
void dj__cuda_ring_free(dj_backend_t *be, dj_backend_ring_t *r);
dj_status dj__cuda_host_register(dj_backend_t *be, void *p, size_t bytes);
void dj__cuda_host_unregister(dj_backend_t *be, void *p);
dj_status dj__cuda_stream_begin(dj_cuda_backend *cb, const dj_stream_step *ss, size_t n_calls, dj_stream_run *run);
dj_status dj__cuda_stream_end(dj_stream_run *run, dj_status st);
void dj__cuda_ring_destroy(dj_cuda_backend *cb);

/* cuda_plan.cu: the vtable's compute_plan, and the plan cache's release. */
dj_status dj__cuda_compute_plan(dj_backend_t *be, const dj_op_call *calls, size_t n, const void *plan_key,
                                const dj_stream_step *stream);
void dj__cuda_plans_free(dj_cuda_backend *cb);

#endif
