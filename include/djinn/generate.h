/* generate.h: the one generation loop - prompt in chunks, batched steps, each
 * generation's own pick, stop rules, streaming text - used by `djinn run`, djinnd and the benchmarks. */
#ifndef DJINN_GENERATE_H
#define DJINN_GENERATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/engine.h"
#include "djinn/grammar.h"
#include "djinn/sampler.h"
#include "djinn/status.h"
#include "djinn/tokenizer.h"

/* Why a generation ended. */
typedef enum dj_gen_finish {
    DJ_GEN_RUNNING = 0, /* not ended */
    DJ_GEN_LENGTH,      /* max_tokens generated */
    DJ_GEN_STOP,        /* picked an EOS or stop id (not emitted) */
    DJ_GEN_CONTEXT      /* the session's context is full */
} dj_gen_finish;

/* "running", "length", "stop", "context": the wire's DONE `reason`. */
const char *dj_gen_finish_name(dj_gen_finish f);

#define DJ_GEN_MAX_STOP 64 /* stop ids plus EOS ids one generation checks */

typedef struct dj_gen_params {
    dj_sampler_params sampling; /* validated as dj_sampler_new does */
    uint32_t max_tokens;        /* tokens to emit; 0: feed the prompt only */
    const int32_t *stop_ids;    /* [n_stop] the client's; copied */
    size_t n_stop;
    const int32_t *eos_ids;     /* [n_eos] the model's (dj_gen_eos_ids); copied; unused with ignore_eos */
    size_t n_eos;
    bool ignore_eos;
    uint32_t prefill_chunk;     /* prompt tokens per step; 0 = the engine's max_step_tokens (also the cap) */
    const dj_tokenizer_t *tok;  /* optional: each token's text as complete UTF-8; borrowed for the gen's life */
    const dj_logit_bias *logit_bias; /* [n_logit_bias] added to the logits of every pick (copied; checked as
                                      * dj_sampler_set_bias does) */
    size_t n_logit_bias;
    bool logprobs;              /* each emitted token's dj_token_logprobs (raw logits' log_softmax) */
    uint32_t top_logprobs;      /* with logprobs: alternatives per token, 0..DJ_MAX_TOP_LOGPROBS */
    dj_constraint_t *constraint; /* NULL, or structured output (grammar.h): each pick masked to the ids that keep
                                  * the text inside its grammar and completable in the tokens left (max_tokens,
                                  * the context), then only EOS once it is whole. Owned by the generation from
                                  * dj_gen_new on (freed with it, or by dj_gen_new when that fails). A step with
                                  * no id allowed picks unmasked and ends as DJ_GEN_STOP (that id not emitted). */
    /* Interventions at every step of the generation (the prompt's chunks and
     * each generated token): edits only (add, replace, mul) of one row
     * ([width] to every position) and no position region; borrowed for the
     * generation's life. Such a generation steps alone (dj_session_step_trace),
     * picks on the host, maps no prefix-cache blocks (its prompt's KV is not
     * the ids' alone) and takes no constraint: token for token the client's
     * loop of traces. NULL/0: none. */
    const struct dj_intervention *iv;
    uint32_t n_iv;
} dj_gen_params;

typedef struct dj_gen dj_gen_t;

/* A generation on session s (borrowed; one generation per session at a
 * time): feeds prompt[n_prompt] (copied; n_prompt >= 1) from the session's
 * position, then emits up to max_tokens tokens. The prompt tokens are
 * observed by the sampler (dj_sampler_observe, prompt = true). */
dj_status dj_gen_new(dj_engine_t *e, dj_session_t *s, const int32_t *prompt, size_t n_prompt,
                     const dj_gen_params *p, dj_gen_t **out /* OUT */);
void dj_gen_free(dj_gen_t *g); /* NULL does nothing; the session keeps what was fed */

/* What one step did for one generation. */
typedef struct dj_gen_event {
    int32_t id;         /* token emitted by this step, -1 if none (a prompt chunk, or a stop id) */
    uint32_t fed;       /* tokens this step fed (a prompt chunk, or the last emitted token) */
    const char *text;   /* id's new complete text (NUL-terminated, valid until the gen's next step); "" if none */
    size_t text_len;
    dj_gen_finish finish; /* != DJ_GEN_RUNNING: it ended at this step */
    const dj_token_logprobs *logprobs; /* with params' logprobs and id >= 0: id's; valid until the next step; else NULL */
    dj_status text_st;  /* DJ_OK, or why id's text could not be made (no memory): the text has a hole from here on */
} dj_gen_event;

/* Token rows g adds to its next step: its next prompt chunk, or 1 (0 once ended). */
uint32_t dj_gen_rows(const dj_gen_t *g);
bool dj_gen_feeding(const dj_gen_t *g); /* prompt tokens still to go in */
size_t dj_gen_prompt_left(const dj_gen_t *g); /* how many */

/* One engine step for n unfinished generations of one model on distinct
 * sessions: each feeds its dj_gen_rows tokens (a prompt chunk, or its last
 * emitted token) as rows of one dj_engine_step_batch_samplers call; a
 * generation whose prompt is done picks its next token with its own sampler
 * (on the device where the engine can: no logits cross to the host), checks
 * it against the stop rules in this order - EOS/stop id, max_tokens, context
 * end - and emits it. ev[i] tells what happened to gens[i]. All or nothing:
 * on error no generation moved (retry them one by one to find the culprit);
 * a sampler's uniform draw may have been spent. A lone generation is a batch
 * of one. */
dj_status dj_gen_step(dj_engine_t *e, dj_gen_t *const *gens, uint32_t n, dj_gen_event *ev /* OUT, [n] */);

/* Prompt tokens taken from the prefix cache at dj_gen_new (not computed). */
uint32_t dj_gen_cached(const dj_gen_t *g);

/* The token picked last and not fed yet (-1 if none): a session that goes on
 * after the generation feeds it first. A stop id stays pending too. */
int32_t dj_gen_pending(const dj_gen_t *g);
uint32_t dj_gen_n_generated(const dj_gen_t *g);
dj_gen_finish dj_gen_finished(const dj_gen_t *g);
/* The generated ids so far ([dj_gen_n_generated]), valid until the next step. */
const int32_t *dj_gen_ids(const dj_gen_t *g);
/* How many of them dj_gen_ids holds (fewer than dj_gen_n_generated when growing its array failed). */
uint32_t dj_gen_n_ids(const dj_gen_t *g);

/* After the end: the text still held back by the stream (call until *n_out is 0). */
dj_status dj_gen_text_rest(dj_gen_t *g, char *out, size_t cap, size_t *n_out /* OUT */);

/* The model's EOS ids: model_dir/generation_config.json's eos_token_id (an
 * int or a list), else config's (cfg->eos_token_ids). A missing or unreadable
 * generation_config.json falls back; one that is not JSON is an error naming
 * it. At most cap ids; *n_out may be 0 (the model names none). */
dj_status dj_gen_eos_ids(const char *model_dir, const dj_model_config *cfg, int32_t *ids /* OUT, [cap] */,
                         size_t cap, size_t *n_out /* OUT */);

#endif
