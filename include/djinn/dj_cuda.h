/* dj_cuda.h: the CUDA backend behind a plain C header (no CUDA types): the
 * device probe and the constructor of a backend on one GPU. */
#ifndef DJINN_DJ_CUDA_H
#define DJINN_DJ_CUDA_H

#include <stddef.h>
#include <stdint.h>

/* The C headers below carry no C++ guards of their own. */
#ifdef __cplusplus
extern "C" {
#endif

#include "djinn/status.h"

/* backend.h's handle, named here without the backend interface itself
 * (include djinn/backend.h to use one). */
typedef struct dj_backend dj_backend_t;

/* Number of usable CUDA devices; 0 when there is no driver, no GPU or any
 * error (never aborts, records no error). */
int dj_cuda_device_count(void);

/* Name of device `device` ("NVIDIA H100 80GB HBM3") into buf[len]; DJ_EDEVICE
 * or DJ_EINVAL with a message on failure. */
dj_status dj_cuda_device_name(int device, char *buf /* OUT */, size_t len);

/* A backend on GPU `device`: its own stream and cuBLAS handle. Activations
 * and K/V pages are bf16 (act_dtype = kv_dtype = DJ_DTYPE_BF16); the
 * residual stream between layers is f32 (res_dtype); every kernel
 * accumulates in f32. compute only enqueues work on the stream (ids
 * and block tables are copied out of host memory before it returns); sync
 * waits for it and reports a kernel fault as DJ_EDEVICE. Every CUDA failure
 * becomes DJ_EDEVICE (DJ_ENOMEM for alloc) with the message
 * "cuda:<device> <file>:<line>: <CUDA error string>". Not reentrant: one
 * thread drives a backend. Free it with dj_backend_free. */
dj_status dj_backend_cuda_new(int device, dj_backend_t **out /* OUT */);

/* Machine limits for benchmarks, measured on the backend's GPU and stream
 * (one warm-up, then `iters` timed calls by CUDA events). Copy: a
 * device-to-device cudaMemcpy of `bytes`, reported as bytes read + written
 * per second (GB/s = 1e9), the HBM rate a weight-streaming step can reach.
 * GEMM: a bf16 n x n x n cublasGemmEx with f32 accumulation on uniform random
 * operands (constant ones run faster than any weights do), in TFLOP/s
 * (2 n^3 per call). Scratch buffers are allocated and freed inside. */
dj_status dj_cuda_measure_copy(dj_backend_t *be, size_t bytes, int iters, double *gbps /* OUT */);
dj_status dj_cuda_measure_gemm(dj_backend_t *be, uint32_t n, int iters, double *tflops /* OUT */);

/* Test hook: attention kernel choice. 0 = automatic (split-K decode for
 * few query rows or per-row positions; otherwise tensor-core prefill where
 * it covers the shape, unless $DJINN_ATTN=simple, else the f32 tiled
 * prefill), 1 = always decode, 2 = always the f32 tiled prefill, 3 = the
 * mma.sync tensor-core prefill where it covers the call (else the f32 prefill),
 * 4 = the wgmma prefill where it covers the call (else as 3). Matmul: 0 = automatic, 1 = always the GEMV kernel (n <= 8), 2 =
 * always the GEMM path (f8_e4m3 weights: dequantized tiles, W8A16), 3 = as 2 but f8_e4m3 weights on the FP8
 * tensor cores (W8A8) wherever cuBLASLt takes them (automatic: from 64 rows). */
void dj__cuda_set_paths(dj_backend_t *be, int attention, int matmul);
/* Test hook: blocks each sampled row is split over (1..64; 0 = chosen by the
 * row count and vocabulary), for gpu_check's block-edge cases. */
void dj__cuda_set_sample_split(dj_backend_t *be, uint32_t blocks);
/* Test hook: which kernel ran the latest ATTENTION call: 1 split-K decode,
 * 2 f32 tiled prefill, 3 mma.sync tensor-core prefill, 4 wgmma prefill
 * (0: none yet). */
int dj__cuda_last_attention(dj_backend_t *be);
/* Test hooks: backend-internal fusion (on unless $DJINN_FUSE=off) of an ADD
 * with the RMSNORM that reads its sum, of a ROPE with the KV_WRITE of its
 * output (and the per-head norms in front of them), ..., and how many calls
 * ran fused beyond the first of each launch. */
void dj__cuda_set_fuse(dj_backend_t *be, int on);
uint64_t dj__cuda_fusions(dj_backend_t *be);
/* Test hook: the bf16 outputs of norms and GLUs in front of FP8 GEMMs left
 * unstored because nothing in the plan reads them but through the codes. */
uint64_t dj__cuda_unstored(dj_backend_t *be);

#ifdef __cplusplus
}
#endif

#endif
