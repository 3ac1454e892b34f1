/* q4_loads.cu: how fast the H100 reads 4-bit weights in the pattern the
 * 4-bit GEMV (src/backend/cuda/cuda_q4.cu) loads them - a warp's 16-byte
 * loads spanning 16 rows, 64 bytes of each (one group of 128 columns), the
 * rows of DJ_DTYPE_Q4 being k/2 bytes of codes plus scales - against the same
 * bytes stored tile by tile (a 16-row tile's group as 1 KiB in a row, the
 * layout a repacked copy would have). Loads only (no arithmetic), no PDL:
 * the ceiling each layout puts on the GEMV. Warp ks of KS a tile takes groups
 * ks, ks + KS, ..., U groups in flight; shared memory held back per block
 * fixes the blocks an SM. Prints one line per case:
 *   <layout> blocks/SM=<b> U=<u> KS=<ks> m=<m> k=<k>: <us> us <GB/s> GB/s of codes
 * usage: bench_q4_loads (needs a GPU; bench/RESULTS.md has its figures) */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "bench_q4_loads: %s: %s\n", #x, cudaGetErrorString(e_));             \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

enum { ROWS_LAYOUT = 0, TILED_LAYOUT = 1 };

template <int LAYOUT, int U, int KS>
__global__ void __launch_bounds__(256) read_tiles(const uint8_t *w, uint32_t m, uint32_t k, uint32_t *sink) {
    extern __shared__ uint32_t held[]; /* occupancy only */
    const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5, ks = warp % KS;
    const uint32_t g = lane >> 2, t = lane & 3, ng = k / 128;
    const size_t rb = k / 2 + 4 * (size_t)ng; /* a DJ_DTYPE_Q4 row */
    const uint32_t j0 = (blockIdx.x * (8 / KS) + warp / KS) * 16;
    if (j0 >= m) return;
    const uint8_t *tile = w + (size_t)j0 * rb;
    uint32_t acc = 0;
    for (uint32_t gb = ks; gb < ng; gb += KS * U) {
        uint4 a[U], c[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint32_t gi = gb + u * KS;
            a[u] = c[u] = make_uint4(0, 0, 0, 0);
            if (gi >= ng) continue;
            if (LAYOUT == ROWS_LAYOUT) {
                a[u] = *(const uint4 *)(tile + (size_t)g * rb + 64 * gi + 16 * t);
                c[u] = *(const uint4 *)(tile + (size_t)(g + 8) * rb + 64 * gi + 16 * t);
            } else {
                const uint8_t *p = tile + (size_t)gi * 1024;
                a[u] = *(const uint4 *)(p + 16 * lane);
                c[u] = *(const uint4 *)(p + 512 + 16 * lane);
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w ^ c[u].x ^ c[u].y ^ c[u].z ^ c[u].w;
    }
    if (acc == 0x9e3779b9u) sink[held[0] & 1] = acc; /* keeps the loads; never true for the fill below */
}

/* Times 40 launches cycling through the copies (more bytes than the L2). */
template <int LAYOUT, int U, int KS>
static int run(uint8_t **copies, int n_copies, uint32_t m, uint32_t k, uint32_t *sink, int blocks_per_sm) {
    const size_t held = (size_t)(220 * 1024) / blocks_per_sm;
    CHECK(cudaFuncSetAttribute(read_tiles<LAYOUT, U, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)held));
    const uint32_t tiles = (m + 15) / 16, blocks = (tiles + 8 / KS - 1) / (8 / KS);
    for (int i = 0; i < n_copies; i++) read_tiles<LAYOUT, U, KS><<<blocks, 256, held>>>(copies[i], m, k, sink);
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    const int iters = 40;
    CHECK(cudaEventRecord(e0));
    for (int i = 0; i < iters; i++)
        read_tiles<LAYOUT, U, KS><<<blocks, 256, held>>>(copies[i % n_copies], m, k, sink);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const double s = ms * 1e-3 / iters, bytes = (double)m * (k / 2);
    printf("%-6s blocks/SM=%d U=%d KS=%d m=%u k=%u: %7.2f us %7.1f GB/s of codes\n",
           LAYOUT == ROWS_LAYOUT ? "rows" : "tiled", blocks_per_sm, U, KS, m, k, s * 1e6, bytes / s / 1e9);
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    return 0;
}

int main(void) {
    enum { COPIES = 6 };
    const size_t bytes = (size_t)28672 * (4096 / 2 + 128); /* the largest case: gate and up */
    uint8_t *copies[COPIES];
    uint32_t *sink = NULL;
    for (int i = 0; i < COPIES; i++) {
        CHECK(cudaMalloc(&copies[i], bytes));
        CHECK(cudaMemset(copies[i], 0x11 * (i + 1), bytes));
    }
    CHECK(cudaMalloc(&sink, 64));
    /* the 8B shape's gate and up (k 4096), down (k 14336), q/k/v */
    const uint32_t shapes[3][2] = {{28672, 4096}, {4096, 14336}, {6144, 4096}};
    for (int s = 0; s < 3; s++)
        for (int b = 2; b <= 4; b += 2) {
            const uint32_t m = shapes[s][0], k = shapes[s][1];
            if (run<ROWS_LAYOUT, 2, 8>(copies, COPIES, m, k, sink, b) ||
                run<TILED_LAYOUT, 2, 8>(copies, COPIES, m, k, sink, b) ||
                run<ROWS_LAYOUT, 4, 8>(copies, COPIES, m, k, sink, b) ||
                run<TILED_LAYOUT, 4, 8>(copies, COPIES, m, k, sink, b))
                return 1;
        }
    for (int i = 0; i < COPIES; i++) CHECK(cudaFree(copies[i]));
    CHECK(cudaFree(sink));
    return 0;
}
