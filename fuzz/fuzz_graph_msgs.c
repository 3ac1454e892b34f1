/* fuzz_graph_msgs.c: libFuzzer target - the metadata and payloads of WEIGHT_HAS / WEIGHT_UPLOAD /
 * WEIGHT_CHALLENGE / WEIGHT_PROVE / GRAPH_RUN (src/server/graph_serve.c) answer any bytes with a status. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/graph_serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dj__capture *cap; /* one store for the whole run, 1 MiB: uploads stay bounded */

/* data: [type selector][meta length: 2 bytes, big-endian][meta][payload] */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const uint32_t types[] = {DJ_MSG_WEIGHT_HAS, DJ_MSG_WEIGHT_UPLOAD, DJ_MSG_WEIGHT_CHALLENGE,
                                     DJ_MSG_WEIGHT_PROVE, DJ_MSG_GRAPH_RUN};
    if (size < 3) return 0;
    if (!cap && dj__capture_open(1 << 20, 1 << 19, 1, &cap) != DJ_OK) abort();
    const uint32_t type = types[data[0] % 5];
    size_t mlen = (size_t)data[1] << 8 | data[2];
    if (mlen > size - 3) mlen = size - 3;
    const uint8_t *meta = data + 3, *payload = meta + mlen;
    const uint64_t plen = size - 3 - mlen;
    if (dj__capture_takes_payload(type) && dj__capture_payload_check(type, meta, (uint32_t)mlen, plen) != DJ_OK)
        return 0;
    dj__meta m;
    if (dj__meta_parse(&m, meta, mlen) != DJ_OK) return 0;
    if (type == DJ_MSG_GRAPH_RUN) {
        dj__graph_req *r = NULL;
        if (dj__graph_req_parse(&m, payload, plen, &r) == DJ_OK) {
            if (!r || r->graph_len + r->data_len != plen) abort(); /* the payload split in two, nothing outside */
            for (uint32_t i = 0; i < r->n_inputs; i++) (void)r->handles[i];
        } else if (r) {
            abort();
        }
        dj__graph_req_free(r);
    } else {
        dj__mw w;
        dj__mw_init(&w);
        (void)dj__capture_inline(cap, 1 + data[0] / 5 % 2, 1, type, &m, payload, plen, &w);
        dj__mw_destroy(&w);
    }
    dj__meta_destroy(&m);
    return 0;
}
