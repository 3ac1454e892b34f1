/* switches.h: the environment switches ($DJINN_*), one table - name, values,
 * default, what each does - and the one place their variables are read. */
#ifndef DJ_CORE_SWITCHES_H
#define DJ_CORE_SWITCHES_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(ID, "VARIABLE", "values", "default", "other", "what it does"):
 *  values   the accepted values, '|' between them; NULL: any string (a
 *           setting, not a switch)
 *  default  the value when the variable is unset or empty
 *  other    what any other value counts as (after a warning): what it always
 *           meant before the table
 * README.md's switch table names exactly these (tests/switches_readme.py).
 * Each owner reads its switches once, when it is made, and keeps the values:
 * the engine (dj_engine_new: PROFILE, WEIGHTS_IN_PLACE, NO_GRAPHS,
 * DEVICE_SAMPLING), the CPU backend (CPU_ISA), the CUDA backend (ATTN, FUSE,
 * PDL; FP8_TC when its FP8 state is made, at the first FP8 GEMM), the logger
 * (LOG, at its first line), the CLI (MODEL), djinnd's
 * loads (TEST_LOAD_HOLD, at each load: load_progress.c); HUGE_REREAD at each
 * dj_checkpoint_huge_pages. Nothing else reads a $DJINN_* variable. */
#define DJ_SWITCH_LIST(X)                                                                                          \
    X(PROFILE, "DJINN_PROFILE", "0|1", "0", "1",                                                                   \
      "per-op time table on stderr when the engine is freed (each op synced)")                                     \
    X(WEIGHTS_IN_PLACE, "DJINN_WEIGHTS_IN_PLACE", "0|1", "1", "1",                                                 \
      "kill switch: 0 makes the CPU engine copy the weights into the VMU instead of reading the mapped files")     \
    X(HUGE_REREAD, "DJINN_HUGE_REREAD", "0|1", "1", "1",                                                           \
      "kill switch: 0 keeps a mapped checkpoint in the small pages it has instead of reading it again in 2 MiB pages")           \
    X(CPU_ISA, "DJINN_CPU_ISA", "portable|avx2|avx512", "avx512", "avx512",                                        \
      "kill switch: caps the CPU kernels' instruction set (default: the best cpuid offers)")                       \
    X(NO_GRAPHS, "DJINN_NO_GRAPHS", "0|1", "0", "1", "kill switch: 1 runs decode steps eagerly (no CUDA Graphs)")   \
    X(DEVICE_SAMPLING, "DJINN_DEVICE_SAMPLING", "off|on", "on", "on",                                              \
      "kill switch: off picks non-greedy tokens on the host (default: on the device)")                             \
    X(ATTN, "DJINN_ATTN", "wg|tc|simple", "wg", "wg",                                                              \
      "kill switches: prefill attention on the mma.sync kernel instead of the wgmma one (tc), or without tensor "  \
      "cores (simple)")                                                                                            \
    X(FP8_TC, "DJINN_FP8_TC", "off|on", "on", "on",                                                                \
      "kill switch: off keeps FP8 weights off the FP8 tensor cores (prefill dequantizes tiles to bf16: W8A16)")    \
    X(FUSE, "DJINN_FUSE", "off|on", "on", "on",                                                                    \
      "kill switch: off fuses none of a step's calls (GEMV groups, ADD+RMSNORM and Gemma's norm before it, "       \
      "RoPE+KV_WRITE, 4-bit gate/up with their GLU)")                                                              \
    X(PDL, "DJINN_PDL", "off|on", "on", "on",                                                                      \
      "kill switch: off launches decode kernels without programmatic dependent launch")                            \
    X(LOG, "DJINN_LOG", "debug|info|warn|error", "warn", "warn", "the least level of log line written to stderr") \
    X(MODEL, "DJINN_MODEL", NULL, "", "",                                                                          \
      "a user default, not a kill switch: the model `djinn` runs without --model (else the demo model)") \
    X(TEST_LOAD_HOLD, "DJINN_TEST_LOAD_HOLD", NULL, "", "",                                                        \
      "tests only: djinnd's model loads pause after their first weight bytes until this file exists")

typedef enum {
#define DJ_SW_ENUM_(id, var, values, dflt, other, doc) DJ_SW_##id,
    DJ_SWITCH_LIST(DJ_SW_ENUM_)
#undef DJ_SW_ENUM_
    DJ_SW_COUNT
} dj_switch;

/* One row of the table. */
typedef struct dj_switch_desc {
    const char *var;    /* "DJINN_..." */
    const char *values; /* "a|b|c", or NULL: any string */
    const char *dflt;
    const char *other;
    const char *doc;
} dj_switch_desc;

/* The row of s; NULL past the table. */
const dj_switch_desc *dj_switch_desc_of(dj_switch s);

/* Reads s's variable now: the index of its value in the row's values (0 for
 * the first), the default's where it is unset or empty, and for any other
 * value a warning on stderr and the index of the row's `other`. Owners call it
 * once, when they are made (see above), and keep the result. A string setting
 * (values NULL) gives 0. */
int dj_switch_read(dj_switch s);

/* Reads a string setting (values NULL) now: its value, or NULL where it is
 * unset or empty (the pointer is the environment's: valid until it changes). */
const char *dj_switch_read_str(dj_switch s);

#ifdef __cplusplus
}
#endif

#endif
