/* fuzz_safetensors.c: libFuzzer target - the input is a whole safetensors
 * file image, split into its 8-byte length, header and data area. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    size_t avail = size - 8;
    size_t json_len = hlen < avail ? (size_t)hlen : avail;
    size_t data_len = avail - json_len;
    /* A private copy so that reads past the header are caught by ASan. */
    char *json = malloc(json_len ? json_len : 1);
    if (!json) return 0;
    if (json_len) memcpy(json, data + 8, json_len);
    dj_tensor_info *infos = NULL;
    size_t n = 0;
    if (dj_safetensors_parse_header(json, json_len, data_len, &infos, &n) == DJ_OK) {
        for (size_t i = 0; i < n; i++) {
            const dj_tensor_info *t = &infos[i];
            uint64_t count = 1;
            for (int d = 0; d < t->ndim; d++) count *= (uint64_t)t->shape[d];
            uintptr_t begin = (uintptr_t)t->data;
            /* What the parser promises; a breach is a bug, so crash. */
            if (t->ndim < 0 || t->ndim > DJ_TENSOR_MAX_DIMS || count * dj_dtype_size(t->dtype) != t->nbytes ||
                begin > data_len || t->nbytes > data_len - begin || (i && strcmp(infos[i - 1].name, t->name) >= 0))
                abort();
        }
    }
    dj_safetensors_free_infos(infos, n);
    free(json);
    return 0;
}
