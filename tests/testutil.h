/* testutil.h: the tiny harness every test program uses - checks that count,
 * report where they failed, and a closing "N passed, N failed" line. */
#ifndef DJ_TESTUTIL_H
#define DJ_TESTUTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

extern int dj_test_passed, dj_test_failed;

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (cond) {                                                             \
            dj_test_passed++;                                                   \
        } else {                                                                \
            dj_test_failed++;                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                       \
    } while (0)

#define CHECK_MSG(cond, ...)                                                    \
    do {                                                                        \
        if (cond) {                                                             \
            dj_test_passed++;                                                   \
        } else {                                                                \
            dj_test_failed++;                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* Status equality with the error detail printed on mismatch. */
#define CHECK_ST(expr, want)                                                    \
    do {                                                                        \
        dj_status st_ = (expr);                                                 \
        CHECK_MSG(st_ == (want), "got %s (%s), want %s", dj_status_name(st_),   \
                  dj_last_error(), dj_status_name(want));                       \
    } while (0)

#define CHECK_OK(expr) CHECK_ST(expr, DJ_OK)

/* Prints the closing line and returns the process exit code. */
int dj_test_finish(const char *name);

/* Deterministic per-run random numbers: seeded from DJ_TEST_SEED or time,
 * printed so a failure can be replayed. */
void dj_test_seed(void);
/* The form ctest's programs use, first thing in main: with DJ_TEST_SEED set,
 * as dj_test_seed; without, the program runs once per seed of a fixed list
 * (DJ_TEST_FIXED_SEEDS) and once with a fresh one (from the clock, printed),
 * each a child process that returns from here; the parent waits for each in
 * turn, names every seed that failed and exits 0 only if every fixed seed
 * passed: a failure under the fresh seed is printed with it, not counted (a
 * test never depends on a fresh seed to pass; replay and fix what it found). */
void dj_test_seeds(void);
#define DJ_TEST_FIXED_SEEDS {1u, 2u, 1795421867u}
uint64_t dj_test_rand(void);
float dj_test_randf(float lo, float hi);

/* n sampling-test logits on a grid of k/8 (k in -40..40: many ties), with
 * -inf and NaN among them (1 in 50 each). */
void dj_test_grid_logits(float *l, uint32_t n);
/* The weight order dj_sampler_pick defines for logits[n] at temperature T:
 * descending expf((l - max) / T) (NaN weighs 0), ties by id. order[i] = the
 * id at position i, rank[id] = its position. */
void dj_test_weight_ranks(const float *logits, uint32_t n, float T, uint32_t *order, uint32_t *rank);

/* Read a whole file (NUL-terminated, malloc'd); NULL if it cannot be read. */
char *dj_test_read_file(const char *path, size_t *len /* OUT, may be NULL */);
/* A msgpack writer for hand-built captured graphs (docs/protocol.md): every
 * map, array, string, int and bin in its widest form (map32, array32, str32,
 * int64, bin32), so the tests know each byte's offset. Writing past b aborts. */
typedef struct dj_test_wb {
    uint8_t b[1 << 16];
    size_t n;
} dj_test_wb;
void dj_test_w_map(dj_test_wb *w, uint32_t n);
void dj_test_w_arr(dj_test_wb *w, uint32_t n);
void dj_test_w_str(dj_test_wb *w, const char *s);
void dj_test_w_int(dj_test_wb *w, int64_t v);
void dj_test_w_f64(dj_test_wb *w, double v);
void dj_test_w_nil(dj_test_wb *w);
void dj_test_w_bool(dj_test_wb *w, int v);
void dj_test_w_bin(dj_test_wb *w, const void *p, uint32_t n);

/* Removes the directory tree at dir (rm -rf); true when that succeeded. */
bool dj_test_rm_rf(const char *dir);

#endif
