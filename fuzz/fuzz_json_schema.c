/* fuzz_json_schema.c: libFuzzer target - the input is a JSON schema, then a
 * NUL and a text: the schema compiler, the matcher on the text, and the cost and mask promises. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/grammar.h"
#include "djinn/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dj_tokenizer_t *tok;
static dj_grammar_vocab_t *vocab;

/* The cost after text[n] and one more byte b (UINT32_MAX: refused). */
static uint32_t cost_after(const dj_grammar_t *g, const char *text, size_t n, uint8_t b) {
    dj_grammar_state_t *t = NULL;
    if (dj_grammar_state_new(g, &t) != DJ_OK) abort();
    uint32_t c = UINT32_MAX;
    if (dj_grammar_feed(t, text, n) && dj_grammar_feed(t, (const char *)&b, 1)) c = dj_grammar_cost(t);
    dj_grammar_state_free(t);
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok && dj_tokenizer_load(DJ_SOURCE_DIR "/models/demo/tokenizer.json", &tok) == DJ_OK)
        dj_grammar_vocab_new(tok, 4096, &vocab);
    const uint8_t *nul = memchr(data, 0, size);
    const size_t n_schema = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "";
    size_t n_text = nul ? size - n_schema - 1 : 0;
    if (n_text > 48) n_text = 48; /* each byte of the text is checked against all 256 next bytes */
    dj_grammar_t *g = NULL;
    if (dj_grammar_from_json_schema((const char *)data, n_schema, &g) != DJ_OK) return 0;
    dj_grammar_state_t *s = NULL;
    if (dj_grammar_state_new(g, &s) != DJ_OK) abort();
    const bool live = dj_grammar_feed(s, text, n_text);
    const uint32_t cost = dj_grammar_cost(s);
    /* what the header promises; a breach is a bug, so crash */
    if (live != (cost != UINT32_MAX)) abort();
    if (dj_grammar_finished(s) && !dj_grammar_complete(s)) abort();
    if (live && dj_grammar_complete(s) != (cost == 0)) abort();
    if (live && cost > 0 && cost < (UINT32_MAX / 4)) {
        /* the cost is the shortest completion: a byte lowers it by one, none by more */
        bool step = false;
        for (int b = 0; b < 256; b++) {
            const uint32_t c = cost_after(g, text, n_text, (uint8_t)b);
            if (c != UINT32_MAX && c + 1 < cost) abort();
            step = step || c + 1 == cost;
        }
        if (!step) abort();
    }
    dj_grammar_state_free(s);
    if (vocab) { /* the mask keeps its promise: a walk of the last allowed id at each step ends a whole value */
        dj_constraint_t *c = NULL;
        const int32_t eos = 1;
        if (dj_constraint_new(g, vocab, &eos, 1, &c) != DJ_OK) abort();
        g = NULL; /* the constraint's */
        const uint32_t start = dj_grammar_cost(dj_constraint_state(c));
        if (start < 200) {
            uint8_t *allowed = malloc(4096);
            uint32_t left = start + (uint32_t)(n_text % 8) + 1;
            bool ended = false;
            for (; left > 0 && !ended && !dj_constraint_finished(c); left--) {
                if (!dj_constraint_mask(c, left, allowed)) abort(); /* stuck */
                int32_t id = 4095;
                while (!allowed[id]) id--;
                if (id == eos) ended = true;
                else if (!dj_constraint_accept(c, id)) abort();
            }
            if (!dj_grammar_complete(dj_constraint_state(c))) abort();
            free(allowed);
        }
        dj_constraint_free(c);
    }
    dj_grammar_free(g);
    return 0;
}
