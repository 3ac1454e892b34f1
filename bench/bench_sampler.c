/* bench_sampler.c: what a non-greedy pick costs on the host - one
 * dj_sampler_sample over a Llama-3-sized vocabulary of continuous random
 * logits, for the usual parameter sets (the host path downloads the logits
 * and sorts them; the device's sample hook does neither). Median of REPS
 * calls per setting.
 * usage: bench_sampler [VOCAB (128256)] [REPS (41)] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "djinn/sampler.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const long vocab = argc > 1 ? atol(argv[1]) : 128256;
    const int reps = argc > 2 ? atoi(argv[2]) : 41;
    if (vocab <= 0 || vocab > (1L << 24) || reps <= 0) {
        fprintf(stderr, "usage: bench_sampler [VOCAB in 1..16777216] [REPS > 0]\n");
        return 2;
    }
    const uint32_t V = (uint32_t)vocab;
    float *logits = malloc(V * sizeof *logits);
    double *t = malloc((size_t)reps * sizeof *t);
    if (!logits || !t) {
        fprintf(stderr, "bench_sampler: out of memory\n");
        return 2;
    }
    static const dj_sampler_params settings[] = {
        {.temperature = 0.0f, .top_p = 1.0f},
        {.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .seed = 1},
        {.temperature = 0.8f, .top_k = 40, .top_p = 1.0f, .seed = 1},
        {.temperature = 0.8f, .top_k = 0, .top_p = 0.9f, .seed = 1},
        {.temperature = 0.8f, .top_k = 40, .top_p = 0.9f, .seed = 1},
    };
    printf("bench_sampler: vocab %u, median of %d picks per setting\n", V, reps);
    /* logits: a sum of 4 uniforms (roughly normal) with sd ~1.7 (flat: top-p 0.9 keeps most ids) or ~6.9
     * (peaked, closer to a trained model's next-token logits: top-p 0.9 keeps few) */
    static const float scales[2] = {1.0f, 4.0f};
    for (int d = 0; d < 2; d++) {
        uint64_t x = 42;
        for (uint32_t i = 0; i < V; i++) {
            float a = 0.0f;
            for (int k = 0; k < 4; k++) {
                x = x * 6364136223846793005ull + 1442695040888963407ull;
                a += (float)((x >> 40) * (1.0 / 16777216.0)) * 3.0f - 1.5f;
            }
            logits[i] = a * scales[d];
        }
        printf("%s logits (sd %.1f):\n", d ? "peaked" : "flat", 1.73 * scales[d]);
        for (size_t s = 0; s < sizeof settings / sizeof *settings; s++) {
            dj_sampler_t *smp = NULL;
            if (dj_sampler_new(&settings[s], V, &smp) != DJ_OK) {
                fprintf(stderr, "bench_sampler: %s\n", dj_last_error());
                return 2;
            }
            volatile int32_t sink = 0;
            for (int r = 0; r < reps; r++) {
                const double t0 = now_s();
                sink += dj_sampler_sample(smp, logits);
                t[r] = now_s() - t0;
            }
            (void)sink;
            qsort(t, (size_t)reps, sizeof *t, cmp_double);
            printf("  T %.1f top_k %3u top_p %.2f: %10.1f us per pick\n", (double)settings[s].temperature,
                   settings[s].top_k, (double)settings[s].top_p, t[reps / 2] * 1e6);
            dj_sampler_free(smp);
        }
    }
    free(logits);
    free(t);
    return 0;
}
