/* fuzz_point.c: libFuzzer target - the input is a point's name as a STEP's
 * `points` carries it (any bytes, not NUL-terminated); what parses names
 * itself back exactly, with its layer in range. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/intervene.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dj_point p;
    const uint32_t n_layers = 40;
    if (dj_point_parse((const char *)data, size, n_layers, &p) != DJ_OK) return 0;
    if (p.kind > DJ_POINT_FINAL_NORM || (p.kind != DJ_POINT_FINAL_NORM && p.layer >= n_layers)) abort();
    char buf[48];
    dj_point_name(p, buf, sizeof buf);
    if (strlen(buf) != size || memcmp(buf, data, size) != 0) abort(); /* one spelling per point */
    return 0;
}
