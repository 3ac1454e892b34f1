/* client_util.h: what tests share that drive a real djinnd through libdjinn - the scripted agents
 * (seeded prompts, generate/pause/resume rounds, the comparison with a run alone) and reference texts. */
#ifndef DJ_CLIENT_UTIL_H
#define DJ_CLIENT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/client.h"

#define DJ_TEST_AGENT_ROUNDS 3
#define DJ_TEST_AGENT_PROMPT 100 /* the longest prompt of a round */
#define DJ_TEST_AGENT_GEN 10     /* tokens generated a round (ignore_eos) */

typedef struct dj_test_agent {
    int idx;
    const char *addr; /* the daemon's listener */
    int32_t prompt[DJ_TEST_AGENT_ROUNDS][DJ_TEST_AGENT_PROMPT];
    size_t n_prompt[DJ_TEST_AGENT_ROUNDS];
    int32_t out[DJ_TEST_AGENT_ROUNDS][DJ_TEST_AGENT_GEN];
    uint32_t n_out[DJ_TEST_AGENT_ROUNDS];
    int pause_ms[DJ_TEST_AGENT_ROUNDS];
    dj_status st; /* the first failure, or DJ_OK */
    char err[256];
} dj_test_agent;

/* Token ids of a generation into ids[cap]; n counts them all (it may pass cap). */
typedef struct dj_test_ids {
    int32_t *ids;
    uint32_t n, cap;
} dj_test_ids;
/* A dj_client_generate callback: user is a dj_test_ids; the held-back text (id < 0) is skipped. */
void dj_test_on_ids(int32_t id, const char *text, size_t len, void *user);

/* Agent idx of the run with this seed: round 0's prompt first_len ids, later
 * rounds later_len (both at most DJ_TEST_AGENT_PROMPT), ids in 2..vocab-1,
 * pauses below max_pause_ms - all from the seed. */
void dj_test_agent_make(dj_test_agent *a, int idx, uint64_t seed, size_t first_len, size_t later_len, uint32_t vocab,
                        int max_pause_ms);
/* Round r of a on session sid: DJ_TEST_AGENT_GEN tokens into a->out[r]. */
dj_status dj_test_agent_generate(dj_client_t *c, uint64_t sid, dj_test_agent *a, int r);
/* One agent: a session on a->addr, ROUNDS x (generate, and with pause: pause,
 * wait, resume); a->st and a->err say how it went. */
void dj_test_agent_run(dj_test_agent *a, bool pause);
/* dj_test_agent_run(p, true), for pthread_create. */
void *dj_test_agent_thread(void *p);
/* Runs alone[0..n) one after another on addr, without pauses: the tokens a
 * crowd must match. Each must succeed (a failed check otherwise). */
void dj_test_agents_alone(dj_test_agent *alone, int n, const char *addr);
/* Runs crowd[0..n) at once on addr (a thread each, with pauses), then holds
 * each against alone[i]: a failed agent is printed (tagged with what) and
 * counted in the result; *differ counts the others whose tokens differ. */
int dj_test_agents_crowd(dj_test_agent *crowd, const dj_test_agent *alone, int n, const char *addr, const char *what,
                         int *differ /* OUT */);
/* Whether y's first `rounds` rounds have x's tokens (all DJ_TEST_AGENT_GEN);
 * each round that differs is printed to stderr, tagged with what. */
bool dj_test_agent_same(const dj_test_agent *x, const dj_test_agent *y, int rounds, const char *what);

/* What libdjinn generates: the text (cut at the buffer's end) and the count of tokens. */
typedef struct dj_test_text {
    char text[8192];
    size_t n;
    int tokens;
} dj_test_text;
/* model's generation on addr of text, encoded with the demo tokenizer (add_bos: a BOS first),
 * sampled with sp, at most max_tokens tokens - the reference an HTTP answer must equal. Failures
 * count as failed checks. */
dj_test_text dj_test_reference(const char *addr, const char *model, const char *text, bool add_bos,
                               const dj_sampler_params *sp, uint32_t max_tokens);
/* ... of token ids[n_ids] as given */
dj_test_text dj_test_reference_ids(const char *addr, const char *model, const int32_t *ids, size_t n_ids,
                                   const dj_sampler_params *sp, uint32_t max_tokens);
/* ... with a logit bias (bias[n_bias]) */
dj_test_text dj_test_reference_biased(const char *addr, const char *model, const char *text, bool add_bos,
                                      const dj_sampler_params *sp, uint32_t max_tokens, const dj_logit_bias *bias,
                                      size_t n_bias);

#endif
