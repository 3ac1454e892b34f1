/* bench_grammar.c: the cost of structured output on the host - building a
 * tokenizer's token trie, and one step's mask (dj_constraint_mask) along a generation.
 * usage: bench_grammar TOKENIZER_JSON VOCAB [STEPS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/grammar.h"
#include "djinn/tokenizer.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s TOKENIZER_JSON VOCAB [STEPS]\n", argv[0]);
        return 2;
    }
    const uint32_t V = (uint32_t)strtoul(argv[2], NULL, 10), steps = argc > 3 ? (uint32_t)atoi(argv[3]) : 200;
    dj_tokenizer_t *tok = NULL;
    if (dj_tokenizer_load(argv[1], &tok) != DJ_OK) {
        fprintf(stderr, "%s\n", dj_last_error());
        return 1;
    }
    double t0 = now();
    dj_grammar_vocab_t *v = NULL;
    if (dj_grammar_vocab_new(tok, V, &v) != DJ_OK) {
        fprintf(stderr, "%s\n", dj_last_error());
        return 1;
    }
    const double build = now() - t0;
    static const char *const schema =
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]}},\"address\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":[\"string\",\"null\"]}},"
        "\"required\":[\"city\",\"zip\"]}},\"required\":[\"name\",\"age\",\"tags\",\"address\"]}";
    dj_grammar_t *g = NULL;
    dj_constraint_t *c = NULL;
    const int32_t eos = -1;
    if (dj_grammar_from_json_schema(schema, strlen(schema), &g) != DJ_OK || dj_constraint_new(g, v, &eos, 0, &c) != DJ_OK) {
        fprintf(stderr, "%s\n", dj_last_error());
        return 1;
    }
    uint8_t *allowed = malloc(V);
    uint64_t x = 88172645463325252ull; /* xorshift: the walk picks a pseudo-random allowed id */
    double mask_s = 0, worst = 0;
    uint32_t n = 0, total_allowed = 0;
    for (; n < steps && !dj_constraint_finished(c); n++) {
        t0 = now();
        const uint32_t count = dj_constraint_mask(c, steps - n, allowed);
        const double dt = now() - t0;
        mask_s += dt;
        if (dt > worst) worst = dt;
        if (!count) break;
        total_allowed += count;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t k = (uint32_t)(x % count), id = 0;
        for (;; id++)
            if (allowed[id] && k-- == 0) break;
        dj_constraint_accept(c, (int32_t)id);
    }
    printf("bench_grammar: %s, %u ids: trie built in %.1f ms; %u masks, mean %.0f us, worst %.0f us, %.0f ids "
           "allowed on average; the value %s\n", argv[1], V, build * 1e3, n, n ? mask_s / n * 1e6 : 0, worst * 1e6,
           n ? (double)total_allowed / n : 0, dj_grammar_complete(dj_constraint_state(c)) ? "whole" : "not whole");
    free(allowed);
    dj_constraint_free(c);
    dj_grammar_vocab_free(v);
    dj_tokenizer_free(tok);
    return 0;
}
