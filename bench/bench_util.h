/* bench_util.h: what the engine benchmarks share (each .c file in bench/ is a program of its own):
 * a monotonic clock, dying on an error with the library's message, malloc or die, a median. */
#ifndef DJ_BENCH_UTIL_H
#define DJ_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "djinn/status.h"

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* prog: the benchmark's name; what failed, then dj_last_error() */
static inline void bench_die(const char *prog, const char *what) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, dj_last_error());
    exit(2);
}

static inline void *bench_xmalloc(const char *prog, size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "%s: out of host memory (%zu bytes)\n", prog, n);
        exit(2);
    }
    return p;
}

static inline int bench_cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* v[0..n) sorted in place; n >= 1 */
static inline double bench_median(double *v, uint32_t n) {
    qsort(v, n, sizeof *v, bench_cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
