/* fuzz_frame.c: libFuzzer target for the frame codec - a header, then its
 * metadata through validation, unpacking and every typed getter. */
#include <stdlib.h>
#include <string.h>

#include "proto/proto_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < DJ_FRAME_HEADER_BYTES) return 0;
    dj_frame_header h;
    const bool hdr_ok = dj_frame_header_decode(data, DJ_PROTO_MAX_REQ_PAYLOAD, &h) == DJ_OK;
    const uint8_t *meta = data + DJ_FRAME_HEADER_BYTES;
    size_t n = size - DJ_FRAME_HEADER_BYTES;
    if (hdr_ok && h.meta_len < n) n = h.meta_len;
    dj__meta m;
    if (dj__meta_parse(&m, meta, n) != DJ_OK) return 0;
    uint64_t u;
    int64_t i;
    double f;
    bool b;
    char s[64];
    int32_t *ids = NULL;
    size_t k;
    static const char *keys[] = {"session", "model", "ids", "prompt", "handle", "offset", "qos", "token"};
    for (size_t j = 0; j < sizeof keys / sizeof *keys; j++) {
        dj__meta_u64(&m, keys[j], false, &u);
        dj__meta_i64(&m, keys[j], false, &i);
        dj__meta_f64(&m, keys[j], false, &f);
        dj__meta_bool(&m, keys[j], false, &b);
        dj__meta_strcpy(&m, keys[j], false, s, sizeof s);
        if (dj__meta_ids(&m, keys[j], false, &ids, &k) == DJ_OK) free(ids);
    }
    dj__meta_destroy(&m);
    return 0;
}
