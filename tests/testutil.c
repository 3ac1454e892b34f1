/* testutil.c: counters, seeding, file reading, sampling-test helpers and a msgpack graph writer
 * for the test programs. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

int dj_test_passed, dj_test_failed;
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

int dj_test_finish(const char *name) {
    printf("%s: %d passed, %d failed\n", name, dj_test_passed, dj_test_failed);
    return dj_test_failed == 0 && dj_test_passed > 0 ? 0 : 1;
}

void dj_test_seed(void) {
    const char *e = getenv("DJ_TEST_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL);
    printf("seed: DJ_TEST_SEED=%llu\n", (unsigned long long)seed);
    rng_state = seed * 2654435761u + 1;
}

void dj_test_seeds(void) {
    const char *e = getenv("DJ_TEST_SEED");
    if (e && e[0]) {
        dj_test_seed();
        return;
    }
    static const uint64_t fixed[] = DJ_TEST_FIXED_SEEDS;
    enum { N_FIXED = sizeof fixed / sizeof fixed[0] };
    uint64_t seeds[N_FIXED + 1];
    for (int i = 0; i < N_FIXED; i++) seeds[i] = fixed[i];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    seeds[N_FIXED] = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 20;
    int failed = 0, fresh_failed = 0;
    for (int i = 0; i <= N_FIXED; i++) {
        char v[32];
        snprintf(v, sizeof v, "%llu", (unsigned long long)seeds[i]);
        printf("== run %d of %d: DJ_TEST_SEED=%s%s\n", i + 1, N_FIXED + 1, v, i == N_FIXED ? " (fresh)" : "");
        fflush(stdout);
        fflush(stderr);
        const pid_t pid = fork();
        if (pid == 0) {
            setenv("DJ_TEST_SEED", v, 1);
            dj_test_seed();
            return; /* the child runs the tests */
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (i == N_FIXED) { /* the fresh seed finds cases; passing never depends on it */
                printf("FAILED with the fresh DJ_TEST_SEED=%s (%s): not counted - replay it with that seed and "
                       "fix the test or the code\n",
                       v, pid < 0 ? "fork failed" : "see above");
                fresh_failed = 1;
            } else {
                printf("FAILED with DJ_TEST_SEED=%s (%s)\n", v, pid < 0 ? "fork failed" : "see above");
                failed++;
            }
        }
    }
    printf("seeds: %d of %d fixed runs failed%s\n", failed, N_FIXED, fresh_failed ? "; the fresh seed's run failed" : "");
    fflush(stdout);
    exit(failed ? 1 : 0);
}

uint64_t dj_test_rand(void) { /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float dj_test_randf(float lo, float hi) {
    return lo + (hi - lo) * (float)((dj_test_rand() >> 40) * (1.0 / 16777216.0));
}

char *dj_test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (!buf) return NULL;
    buf[n] = '\0';
    if (len) *len = (size_t)n;
    return buf;
}

void dj_test_grid_logits(float *l, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        l[i] = (float)((int)(dj_test_rand() % 81) - 40) / 8.0f;
        const uint32_t x = (uint32_t)(dj_test_rand() % 50);
        if (x == 0) l[i] = -INFINITY;
        if (x == 1) l[i] = NAN;
    }
}

static const float *rank_w; /* the weights by_weight compares */
static int by_weight(const void *a, const void *b) {
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    if (rank_w[x] != rank_w[y]) return rank_w[x] > rank_w[y] ? -1 : 1;
    return x < y ? -1 : (x > y);
}

void dj_test_weight_ranks(const float *logits, uint32_t n, float T, uint32_t *order, uint32_t *rank) {
    float *w = malloc((n ? n : 1) * sizeof *w);
    if (!w) abort(); /* test helper: out of memory ends the test */
    float mx = -INFINITY;
    for (uint32_t i = 0; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (uint32_t i = 0; i < n; i++) {
        const float v = expf((logits[i] - mx) / T);
        w[i] = v == v ? v : 0.0f;
        order[i] = i;
    }
    rank_w = w;
    qsort(order, n, sizeof *order, by_weight);
    for (uint32_t i = 0; i < n; i++) rank[order[i]] = i;
    free(w);
}

bool dj_test_rm_rf(const char *dir) {
    char cmd[1100];
    if (snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir) >= (int)sizeof cmd) return false;
    return system(cmd) == 0;
}

/* ---- the msgpack writer for hand-built graphs ---- */

static uint8_t *w_room(dj_test_wb *w, size_t k) {
    if (k > sizeof w->b - w->n) {
        fprintf(stderr, "dj_test_wb: %zu bytes more do not fit after %zu\n", k, w->n);
        abort();
    }
    uint8_t *p = w->b + w->n;
    w->n += k;
    return p;
}
static void w_tag(dj_test_wb *w, uint8_t tag, uint64_t v, int bytes) {
    uint8_t *p = w_room(w, 1 + (size_t)bytes);
    p[0] = tag;
    for (int i = 0; i < bytes; i++) p[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
}
void dj_test_w_map(dj_test_wb *w, uint32_t n) { w_tag(w, 0xdf, n, 4); }
void dj_test_w_arr(dj_test_wb *w, uint32_t n) { w_tag(w, 0xdd, n, 4); }
void dj_test_w_str(dj_test_wb *w, const char *s) {
    const size_t n = strlen(s);
    w_tag(w, 0xdb, n, 4);
    memcpy(w_room(w, n), s, n);
}
void dj_test_w_int(dj_test_wb *w, int64_t v) { w_tag(w, 0xd3, (uint64_t)v, 8); }
void dj_test_w_f64(dj_test_wb *w, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    w_tag(w, 0xcb, u, 8);
}
void dj_test_w_nil(dj_test_wb *w) { w_tag(w, 0xc0, 0, 0); }
void dj_test_w_bool(dj_test_wb *w, int v) { w_tag(w, v ? 0xc3 : 0xc2, 0, 0); }
void dj_test_w_bin(dj_test_wb *w, const void *p, uint32_t n) {
    w_tag(w, 0xc6, n, 4);
    if (n) memcpy(w_room(w, n), p, n);
}
