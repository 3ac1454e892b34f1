/* bench_trace_host.c: the host's share of one saved point at a step shape
 * (rows x hidden, bf16 activations as on a GPU) - the path interventions had
 * until issue 14's fix (fresh [n][d] f32 scratch each step, the bytes copied
 * in, widened element by element, copied out to the caller: the device idle
 * meanwhile, as the step waited at the point) against today's
 * (dj_dtype_widen_f32: the bytes widened in blocks from the engine's kept
 * buffer straight into the caller's, on one thread and on every core).
 * Host memory only: it runs anywhere. Best of --reps.
 *   bench_trace_host [--rows N (512)] [--hidden D (4096)] [--reps R (20)] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <omp.h>

#include "djinn/dtype.h"
#include "djinn/intervene.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The old path's widening: element by element. */
static void widen_scalar(const uint8_t *src, float *dst, size_t k) {
    for (size_t i = 0; i < k; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = dj_bf16_to_f32(h);
    }
}

int main(int argc, char **argv) {
    size_t rows = 512, hidden = 4096;
    int reps = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) rows = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--hidden")) hidden = strtoul(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_trace_host [--rows N] [--hidden D] [--reps R]\n");
            return 2;
        }
    }
    if (!rows || !hidden || reps < 1 || (argc % 2) == 0) {
        fprintf(stderr, "usage: bench_trace_host [--rows N] [--hidden D] [--reps R]\n");
        return 2;
    }
    const size_t k = rows * hidden;
    uint8_t *dev = malloc(2 * k); /* stands for the device's bytes */
    float *out = malloc(4 * k);   /* the caller's buffer, reused as bench_trace does */
    if (!dev || !out) return 2;
    for (size_t i = 0; i < 2 * k; i++) dev[i] = (uint8_t)(i * 7 + 3);
    memset(out, 0, 4 * k);
    double old_best = 1e30, one_best = 1e30, new_best = 1e30;
    const int cores = omp_get_max_threads();
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        float *f32 = malloc(4 * k);
        uint8_t *raw = malloc(4 * k);
        if (!f32 || !raw) return 2;
        memcpy(raw, dev, 2 * k); /* what the download wrote */
        widen_scalar(raw, f32, k);
        memcpy(out, f32, 4 * k);
        free(f32);
        free(raw);
        const double t_old = now() - t0;
        omp_set_num_threads(1);
        t0 = now();
        dj_dtype_widen_f32(DJ_DTYPE_BF16, dev, out, k);
        const double t_one = now() - t0;
        omp_set_num_threads(cores);
        t0 = now();
        dj_dtype_widen_f32(DJ_DTYPE_BF16, dev, out, k);
        const double t_new = now() - t0;
        old_best = t_old < old_best ? t_old : old_best;
        one_best = t_one < one_best ? t_one : one_best;
        new_best = t_new < new_best ? t_new : new_best;
    }
    uint16_t h;
    memcpy(&h, dev + 2 * (k - 1), 2);
    const int ok = out[k - 1] == dj_bf16_to_f32(h);
    printf("host work of one saved point, %zu x %zu bf16 -> f32: before %.3f ms (fresh scratch, copy in, widen "
           "element by element, copy out), one thread %.3f ms (widen into the caller's buffer, a shift each), now "
           "%.3f ms (the same on %d threads)%s\n",
           rows, hidden, old_best * 1e3, one_best * 1e3, new_best * 1e3, cores, ok ? "" : "; MISMATCH");
    free(dev);
    free(out);
    return ok ? 0 : 1;
}
