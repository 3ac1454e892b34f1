/* fuzz_tok_gguf.c: libFuzzer target - arbitrary bytes as a GGUF file whose
 * vocabulary a tokenizer is read from (tok_gguf.c); if it loads, a slice of
 * the bytes is encoded and the ids decoded. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "djinn/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char path[64];
    if (!path[0]) snprintf(path, sizeof path, "/tmp/dj_fuzz_gguf_%d.gguf", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    const bool ok = fwrite(data, 1, size, f) == size;
    fclose(f);
    dj_tokenizer_t *tok = NULL;
    if (!ok || dj_tokenizer_load(path, &tok) != DJ_OK) return 0;
    int32_t *ids = NULL;
    size_t n = 0;
    const size_t off = size - size / 8;
    if (dj_tokenizer_encode(tok, (const char *)data + off, size / 8, true, &ids, &n) == DJ_OK) {
        const uint32_t vs = dj_tokenizer_vocab_size(tok);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (uint32_t)ids[i] >= vs) abort();
        char *text = NULL;
        if (dj_tokenizer_decode(tok, ids, n, &text) == DJ_OK) free(text);
        free(ids);
    }
    dj_tokenizer_free(tok);
    return 0;
}
