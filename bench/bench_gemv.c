/* bench_gemv.c: the CPU backend's MATMUL alone over a Llama-3.2-1B-shaped
 * weight set (16 layers of q, k, v, o, gate, up, down; bf16, 1.8 GiB, far
 * larger than the caches) - the weight streaming of decode (rows 1) or the
 * blocked GEMM of prefill (rows 32, 512) without the rest of the engine.
 *   bench_gemv [THREADS=2] [ROWS=1] [RUNS=5] [cpu|wall] [small]
 * cpu: time is the process's CPU time divided by THREADS (a thread the OS
 * leaves waiting costs nothing: kernel A/B on a loaded machine, best with
 * THREADS 1); wall (default): the elapsed time. small: every op reads the
 * same 1024 x 2048 weight (4 MiB, cache resident: the compute ceiling). Prints
 * each run and the best: weight GB/s and GFLOP/s of the work done. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/backend.h"

static double now(clockid_t clk) {
    struct timespec t;
    clock_gettime(clk, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2, rows = argc > 2 ? atoi(argv[2]) : 1,
              runs = argc > 3 ? atoi(argv[3]) : 5;
    const int cpu = argc > 4 && !strcmp(argv[4], "cpu"), small = argc > 5 && !strcmp(argv[5], "small");
    if (threads < 1 || rows < 1 || rows > 4096 || runs < 1 || runs > 100) {
        fprintf(stderr, "usage: %s [THREADS=2] [ROWS=1 (1..4096)] [RUNS=5 (1..100)] [cpu|wall] [small]\n", argv[0]);
        return 2;
    }
    static const uint32_t shape[7][2] = {{2048, 2048}, {512, 2048}, {512, 2048}, {2048, 2048},
                                         {8192, 2048}, {8192, 2048}, {2048, 8192}}; /* {m, k} */
    size_t total = 0;
    for (int i = 0; i < 7; i++) total += (size_t)shape[i][0] * shape[i][1];
    total *= 16;
    const size_t huge = (size_t)2 << 20, bytes = (total * 2 + huge - 1) / huge * huge;
    uint16_t *w = aligned_alloc(huge, bytes);
    float *x = malloc((size_t)8192 * rows * sizeof *x), *out = malloc((size_t)8192 * rows * sizeof *out);
    dj_backend_t *be = NULL;
    if (!w || !x || !out || dj_backend_cpu_new(threads, &be) != DJ_OK) {
        fprintf(stderr, "bench_gemv: cannot allocate %zu MiB of weights or start the backend\n", bytes >> 20);
        return 1;
    }
    for (size_t i = 0; i < total; i++) w[i] = (uint16_t)(0x3c00 + ((i * 2654435761u) >> 20 & 0x3ff) - 0x200);
    for (size_t i = 0; i < (size_t)8192 * rows; i++) x[i] = (float)(i % 7) * 0.1f - 0.3f;
    const clockid_t clk = cpu ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC;
    double best = 1e30, moved = 0.0, flops = 0.0;
    for (int r = 0; r < runs; r++) {
        const double t0 = now(clk);
        size_t off = 0;
        moved = flops = 0.0;
        for (int l = 0; l < 16; l++)
            for (int i = 0; i < 7; i++) {
                const uint32_t m = small ? 1024 : shape[i][0], k = small ? 2048 : shape[i][1];
                dj_op_call c = {.op = DJ_OP_MATMUL, .n = (uint32_t)rows, .x = x, .out = out, .w = w + off,
                                .w_dtype = DJ_DTYPE_BF16, .k = k, .m = m};
                if (dj_backend_compute(be, &c) != DJ_OK) {
                    fprintf(stderr, "bench_gemv: %s\n", dj_last_error());
                    return 1;
                }
                moved += 2.0 * m * k;
                flops += 2.0 * m * k * rows;
                if (!small) off += (size_t)m * k;
            }
        double dt = now(clk) - t0;
        if (cpu) dt /= threads;
        if (dt < best) best = dt;
        printf("run %d: %.1f ms, %.1f GB/s of weights, %.1f GFLOP/s\n", r + 1, dt * 1e3, moved / dt / 1e9, flops / dt / 1e9);
    }
    printf("best: %.1f ms, %.1f GB/s of weights, %.1f GFLOP/s (%d threads, %d rows, %s time%s)\n", best * 1e3,
           moved / best / 1e9, flops / best / 1e9, threads, rows, cpu ? "cpu" : "wall", small ? ", small" : "");
    dj_backend_free(be);
    free(w);
    free(x);
    free(out);
    return 0;
}
