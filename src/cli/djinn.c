/* djinn.c: the `djinn` command line (run, tokenize, detokenize, info). */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        printf("usage: djinn <run|tokenize|detokenize|info> ...\n");
        return argc < 2 ? 2 : 0;
    }
    fprintf(stderr, "djinn: unknown command '%s'\n", argv[1]);
    return 2;
}
