/* client_generate.c: the smallest program on libdjinn - connect to djinnd,
 * open a session on a model, generate greedily from a prompt, print the text.
 * It links libdjinn and the C runtime (with msgpack, pthread) only, no engine:
 *   client_generate ADDR MODEL PROMPT [MAX_TOKENS]   (ADDR: HOST:PORT or unix:/path) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/client.h"

static void print_piece(int32_t id, const char *text, size_t len, void *user) {
    (void)id;
    (void)user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s ADDR MODEL PROMPT [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    char *end = NULL;
    const unsigned long max_tokens = argc == 5 ? strtoul(argv[4], &end, 10) : 16;
    if (argc == 5 && (!*argv[4] || *end || max_tokens == 0 || max_tokens > 4096)) {
        fprintf(stderr, "%s: MAX_TOKENS '%s': want a number in [1, 4096]\n", argv[0], argv[4]);
        return 2;
    }
    dj_client_t *c = NULL;
    uint64_t session = 0;
    dj_generate_result res;
    dj_status st = dj_client_connect(argv[1], NULL, &c);
    if (st == DJ_OK) {
        const dj_session_opts so = {.model = argv[2], .qos = DJ_QOS_INTERACTIVE};
        st = dj_client_session_open(c, &so, &session);
    }
    if (st == DJ_OK) {
        const dj_generate_params gp = {.prompt = argv[3], .sampling = {.top_p = 1.0f},
                                       .max_tokens = (uint32_t)max_tokens, .ignore_eos = true};
        st = dj_client_generate(c, session, &gp, print_piece, NULL, &res);
    }
    if (st != DJ_OK) {
        fprintf(stderr, "%s: %s: %s\n", argv[0], dj_strerror(st), dj_last_error());
        dj_client_free(c);
        return 1;
    }
    printf("\n[%u prompt tokens, %u generated, %s]\n", res.n_prompt, res.n_generated, res.reason);
    dj_client_session_close(c, session);
    dj_client_free(c);
    return 0;
}
