/* fuzz_tokenizer.c: libFuzzer target - arbitrary bytes as a tokenizer.json;
 * if they load, a slice of the same bytes is encoded and the ids decoded,
 * one-shot and streamed, which must agree. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dj_tokenizer_t *tok = NULL;
    if (dj_tokenizer_load_buffer((const char *)data, size, &tok) != DJ_OK) return 0;
    /* the text: the input's last quarter (often JSON strings, so words of the vocab) */
    size_t off = size - size / 4, len = size / 4;
    int32_t *ids = NULL;
    size_t n = 0;
    if (dj_tokenizer_encode(tok, (const char *)data + off, len, true, &ids, &n) == DJ_OK) {
        uint32_t vs = dj_tokenizer_vocab_size(tok);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (uint32_t)ids[i] >= vs) abort();
        char *text = NULL;
        size_t tl = 0;
        if (dj_tokenizer_decode_len(tok, ids, n, &text, &tl) == DJ_OK) {
            dj_detok_stream_t *s = NULL;
            if (dj_detok_stream_new(tok, &s) == DJ_OK) {
                size_t got_all = 0;
                char buf[16];
                size_t got;
                for (size_t i = 0; i < n; i++) {
                    if (dj_detok_stream_push(s, ids[i], buf, sizeof buf, &got) != DJ_OK) abort();
                    if (got_all + got > tl || memcmp(text + got_all, buf, got)) abort();
                    got_all += got;
                }
                do {
                    if (dj_detok_stream_finish(s, buf, sizeof buf, &got) != DJ_OK) abort();
                    if (got_all + got > tl || memcmp(text + got_all, buf, got)) abort();
                    got_all += got;
                } while (got);
                if (got_all != tl) abort();
                dj_detok_stream_free(s);
            }
            free(text);
        }
        free(ids);
    }
    dj_tokenizer_free(tok);
    return 0;
}
