/* fuzz_chat_template.c: libFuzzer target - the input is a chat template's
 * source; what parses is rendered on a small conversation (the limits on
 * output, steps and memory hold). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}, "
    "{\"role\": \"assistant\", \"content\": \"<think>x</think>yo\", \"tool_calls\": [{\"function\": {\"name\": "
    "\"f\", \"arguments\": {\"a\": [1, 2.5, null]}}}]}, {\"role\": \"tool\", \"content\": \"42\"}], "
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"add_generation_prompt\": true}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dj_chat_template_t *t = NULL;
    if (dj_chat_template_parse((const char *)data, size, &t) != DJ_OK) return 0;
    char *text = NULL;
    size_t len = 0;
    if (dj_chat_template_render(t, vars, sizeof vars - 1, &text, &len) == DJ_OK) {
        /* what the renderer promises */
        if (!text || text[len] != '\0') abort();
    }
    free(text);
    dj_chat_template_free(t);
    return 0;
}
