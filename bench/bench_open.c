/* bench_open.c: what a session open costs on a model already in djinnd's text
 * segment (issue 8: no hashing on a cached open) - open/close round trips.
 *   bench_open ADDR MODEL [N]   (a running djinnd; prints first, median, min) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "djinn/client.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_open ADDR MODEL [N]\n");
        return 2;
    }
    const int n = argc > 3 ? atoi(argv[3]) : 50;
    if (n < 1 || n > 100000) {
        fprintf(stderr, "bench_open: N '%s' is not in 1..100000\n", argv[3]);
        return 2;
    }
    dj_client_t *c = NULL;
    dj_status st = dj_client_connect(argv[1], NULL, &c);
    if (st != DJ_OK) {
        fprintf(stderr, "bench_open: connect %s: %s: %s\n", argv[1], dj_strerror(st), dj_last_error());
        return 1;
    }
    double *t = malloc((size_t)(n + 1) * sizeof *t);
    const dj_session_opts o = {argv[2], DJ_QOS_INTERACTIVE, 0};
    for (int i = 0; t && i <= n; i++) { /* the first open loads; each close drops the model to the cache */
        uint64_t s = 0;
        const double t0 = now();
        st = dj_client_session_open(c, &o, &s);
        t[i] = now() - t0;
        if (st == DJ_OK) st = dj_client_session_close(c, s);
        if (st != DJ_OK) {
            fprintf(stderr, "bench_open: %s: %s\n", dj_strerror(st), dj_last_error());
            free(t);
            dj_client_free(c);
            return 1;
        }
    }
    if (t) {
        const double first = t[0];
        qsort(t + 1, (size_t)n, sizeof *t, cmp);
        printf("session open of %s: first %.3f ms; then (cached, %d opens) median %.3f ms, min %.3f ms, max %.3f ms\n",
               argv[2], first * 1e3, n, t[1 + n / 2] * 1e3, t[1] * 1e3, t[n] * 1e3);
    }
    free(t);
    dj_client_free(c);
    return 0;
}
