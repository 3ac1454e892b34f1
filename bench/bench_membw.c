/* bench_membw.c: the machine's memory read bandwidth, as decode sees it -
 * every thread sums its slice of a buffer far larger than the caches, once
 * per run; prints each run's GB/s and the median (the figure that
 * cpu_bench.sh divides decode's weight traffic by).
 *   bench_membw [GIB=2] [THREADS=all] [RUNS=7] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sum of p[0..n), four independent vector sums (loads, not adds, limit). */
static float sum(const float *p, size_t n) {
    size_t i = 0;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    for (; i + 32 <= n; i += 32) {
        a = _mm256_add_ps(a, _mm256_load_ps(p + i));
        b = _mm256_add_ps(b, _mm256_load_ps(p + i + 8));
        c = _mm256_add_ps(c, _mm256_load_ps(p + i + 16));
        d = _mm256_add_ps(d, _mm256_load_ps(p + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    for (int k = 0; k < 8; k++) s += t[k];
#endif
    for (; i < n; i++) s += p[i];
    return s;
}

int main(int argc, char **argv) {
    const double gib = argc > 1 ? atof(argv[1]) : 2.0;
    const int threads = argc > 2 && atoi(argv[2]) > 0 ? atoi(argv[2]) : omp_get_max_threads();
    int runs = argc > 3 ? atoi(argv[3]) : 7;
    if (gib <= 0 || runs < 1 || runs > 100) {
        fprintf(stderr, "usage: %s [GIB=2] [THREADS=all] [RUNS=7]\n", argv[0]);
        return 2;
    }
    const size_t n = (size_t)(gib * (1 << 30)) / sizeof(float) / 64 * 64;
    float *buf = aligned_alloc(64, n * sizeof(float));
    if (!buf) {
        fprintf(stderr, "cannot allocate %.2f GiB\n", gib);
        return 1;
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7); /* each thread faults in its own slice */
    double *gbs = malloc((size_t)runs * sizeof *gbs);
    volatile float sink = 0.0f;
    for (int r = 0; r < runs; r++) {
        float total = 0.0f;
        const double t0 = now();
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const size_t per = n / (size_t)nt / 64 * 64, lo = (size_t)t * per, hi = t == nt - 1 ? n : lo + per;
            total += sum(buf + lo, hi - lo);
        }
        const double dt = now() - t0;
        sink += total;
        gbs[r] = (double)n * sizeof(float) / dt / 1e9;
        printf("run %d: %.1f GB/s\n", r + 1, gbs[r]);
    }
    qsort(gbs, (size_t)runs, sizeof *gbs, cmp);
    printf("read bandwidth: %.1f GB/s median of %d runs (%.1f-%.1f), %d threads, %.2f GiB\n", gbs[runs / 2], runs,
           gbs[0], gbs[runs - 1], threads, gib);
    free(gbs);
    free(buf);
    return sink == 12345.0f;
}
