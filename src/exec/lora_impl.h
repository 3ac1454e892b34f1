/* lora_impl.h: a loaded adapter's record and the step's view of the
 * adapters its rows use (src/exec/lora.c; the executor in engine.c). */
#ifndef DJ_LORA_IMPL_H
#define DJ_LORA_IMPL_H

#include "djinn/backend.h"
#include "djinn/lora.h"
#include "djinn/vmu.h"

struct dj_lora {
    dj_lora_config cfg;
    char name[256];
    uint64_t fingerprint, base_fp;
    dj_vmu_model_t *region; /* owns this struct through its user dtor */
    uint32_t n_slots;       /* the base's weight slots */
    dj_lora_mat *slot;      /* [n_slots] text-segment matrices of slot i (a NULL: not adapted) */
};

/* Distinct (adapter, scale) pairs one step may mix. */
#define DJ__LORA_STEP_MAX (64 * DJ_LORA_STACK_MAX)

/* The adapters of one step and each row's (engine-owned, reused). */
typedef struct dj__lora_step {
    uint32_t n;                      /* distinct adapters of the step */
    const struct dj_lora *ad[DJ__LORA_STEP_MAX]; /* [n] */
    float scale[DJ__LORA_STEP_MAX];   /* [n] each one's scale times its sessions' use scale */
    uint32_t levels;                 /* the most adapters a session of the step stacks */
    int32_t *row;                    /* [DJ_LORA_STACK_MAX][row_cap] level l's adapter of row i (index in
                                      * ad), -1: none */
    uint32_t row_cap;
    uint32_t row_stride;             /* rows of the step: level l's rows start at row + l * row_stride */
    dj_lora_mat *mats;               /* [mats_cap] the step's LORA calls' tables, n each */
    size_t mats_cap, mats_used;
} dj__lora_step;

/* Fills ls for a step of B sessions ss where session r is fed n_tok[r]
 * tokens (NULL: one each), in the executor's row order (every session's
 * tokens but its last in turn, then the B last tokens: decode_rows in
 * engine.c). *any: some row has an adapter (else the step runs no LORA
 * call). max_calls: the most LORA calls the step may add. DJ_EINVAL past
 * DJ__LORA_STEP_MAX distinct (adapter, scale) pairs. */
dj_status dj__lora_step_prepare(dj__lora_step *ls, dj_session_t *const *ss, const uint32_t *n_tok, uint32_t B,
                                uint32_t rows, size_t max_calls, bool *any /* OUT */);
/* The LORA calls that follow `mm` (a MATMUL of weight slot `slot`) in the
 * step, one per stacking level some adapter of which adapts the slot, into
 * out[DJ_LORA_STACK_MAX]; returns how many (0: none). */
uint32_t dj__lora_calls(dj__lora_step *ls, int slot, const dj_op_call *mm, dj_op_call *out /* OUT */);
void dj__lora_step_free(dj__lora_step *ls);

#endif
