/* cuda_measure.cu: the machine limits benchmarks compare against, measured on
 * the backend's own GPU and stream: device-to-device copy rate and the bf16
 * cuBLAS GEMM rate. */
#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/fill_uniform.cuh"

/* Seconds per call of `run` (after one warm-up), by CUDA events on the stream. */
template <typename F>
static dj_status time_on_stream(dj_cuda_backend *cb, int iters, F run, double *secs) {
    cudaEvent_t a = NULL, b = NULL;
    DJ_CU(cb, cudaEventCreate(&a));
    cudaError_t e = cudaEventCreate(&b);
    if (e != cudaSuccess) {
        (void)cudaEventDestroy(a);
        return dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    }
    dj_status st = run();
    if (st == DJ_OK && (e = cudaEventRecord(a, cb->stream)) != cudaSuccess)
        st = dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    for (int i = 0; i < iters && st == DJ_OK; i++) st = run();
    float ms = 0.0f;
    if (st == DJ_OK) {
        e = cudaEventRecord(b, cb->stream);
        if (e == cudaSuccess) e = cudaEventSynchronize(b);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
        if (e != cudaSuccess) st = dj__cuda_fail(DJ_EDEVICE, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    }
    (void)cudaEventDestroy(a);
    (void)cudaEventDestroy(b);
    *secs = (double)ms * 1e-3 / iters;
    return st;
}

extern "C" dj_status dj_cuda_measure_copy(dj_backend_t *be, size_t bytes, int iters, double *gbps) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    *gbps = 0.0;
    if (bytes == 0 || iters <= 0) return dj_fail(DJ_EINVAL, "measure copy: zero bytes or iterations");
    DJ_CU(cb, cudaSetDevice(cb->device));
    void *src = NULL, *dst = NULL;
    cudaError_t e = cudaMalloc(&src, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&dst, bytes);
    if (e == cudaSuccess) e = cudaMemsetAsync(src, 1, bytes, cb->stream);
    dj_status st = DJ_OK;
    if (e != cudaSuccess) st = dj__cuda_fail(DJ_ENOMEM, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    double secs = 0.0;
    if (st == DJ_OK)
        st = time_on_stream(
            cb, iters,
            [&]() -> dj_status {
                DJ_CU(cb, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cb->stream));
                return DJ_OK;
            },
            &secs);
    if (st == DJ_OK) *gbps = 2.0 * (double)bytes / secs * 1e-9; /* read + write */
    if (src) (void)cudaFree(src);
    if (dst) (void)cudaFree(dst);
    return st;
}

extern "C" dj_status dj_cuda_measure_gemm(dj_backend_t *be, uint32_t n, int iters, double *tflops) {
    dj_cuda_backend *cb = (dj_cuda_backend *)be;
    *tflops = 0.0;
    if (n == 0 || n > 65536 || iters <= 0) return dj_fail(DJ_EINVAL, "measure gemm: size %u or iterations %d", n, iters);
    DJ_CU(cb, cudaSetDevice(cb->device));
    const size_t elems = (size_t)n * n;
    void *a = NULL, *b = NULL, *c = NULL;
    cudaError_t e = cudaMalloc(&a, elems * 2);
    if (e == cudaSuccess) e = cudaMalloc(&b, elems * 2);
    if (e == cudaSuccess) e = cudaMalloc(&c, elems * 2);
    if (e == cudaSuccess) {
        /* uniform operands: a memset's constant ones ran the 8192^3 GEMM 15% faster (H100,
         * 895 against 781 TFLOP/s, bench/gemm_algos.cu: fewer bits toggle, less power,
         * higher clocks) - a rate no model's weights reach */
        dj_fill_uniform_bf16<<<cb->n_sm * 8, 256, 0, cb->stream>>>((__nv_bfloat16 *)a, elems, 1, -0.0625f, 0.0625f);
        dj_fill_uniform_bf16<<<cb->n_sm * 8, 256, 0, cb->stream>>>((__nv_bfloat16 *)b, elems, 2, -0.0625f, 0.0625f);
        e = cudaGetLastError();
    }
    dj_status st = DJ_OK;
    if (e != cudaSuccess) st = dj__cuda_fail(DJ_ENOMEM, cb->device, __FILE__, __LINE__, cudaGetErrorString(e));
    const float alpha = 1.0f, beta = 0.0f;
    const int ni = (int)n;
    double secs = 0.0;
    if (st == DJ_OK)
        st = time_on_stream(
            cb, iters,
            [&]() -> dj_status {
                DJ_CUBLAS(cb, cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, ni, ni, ni, &alpha, a, CUDA_R_16BF, ni,
                                           b, CUDA_R_16BF, ni, &beta, c, CUDA_R_16BF, ni, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT));
                return DJ_OK;
            },
            &secs);
    if (st == DJ_OK) *tflops = 2.0 * (double)n * n * n / secs * 1e-12;
    if (a) (void)cudaFree(a);
    if (b) (void)cudaFree(b);
    if (c) (void)cudaFree(c);
    return st;
}
