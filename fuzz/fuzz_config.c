/* fuzz_config.c: libFuzzer target - the input is a config.json text for
 * dj_model_config_parse. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    dj_model_config cfg;
    if (dj_model_config_parse(text, size, &cfg) == DJ_OK) {
        /* What the parser promises; a breach is a bug, so crash. */
        if (!cfg.n_heads || !cfg.n_kv_heads || cfg.n_heads % cfg.n_kv_heads || !cfg.head_dim || cfg.head_dim % 2 ||
            !cfg.vocab_size || !cfg.hidden_size || !cfg.n_layers || !(cfg.rms_norm_eps > 0) ||
            !(cfg.rope_theta > 0) || memchr(cfg.arch_name, 0, sizeof cfg.arch_name) == NULL)
            abort();
    }
    free(text);
    return 0;
}
