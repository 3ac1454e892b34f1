/* fuzz_oai_tools.c: libFuzzer target - the input is tools JSON, NUL, tool_choice JSON, NUL, an answer's text: the
 * HTTP door's tool checks (http_tools.c), the forced schema compiled, the answer parsed into calls, the stream's hold. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "djinn/grammar.h"
#include "server/http_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *p = (const char *)data, *end = p + size;
    const char *z1 = memchr(p, 0, size);
    const char *z2 = z1 ? memchr(z1 + 1, 0, (size_t)(end - z1 - 1)) : NULL;
    cJSON *tools = cJSON_ParseWithLength(p, z1 ? (size_t)(z1 - p) : size);
    cJSON *choice = z1 ? cJSON_ParseWithLength(z1 + 1, z2 ? (size_t)(z2 - z1 - 1) : (size_t)(end - z1 - 1)) : NULL;
    const char *text = z2 ? z2 + 1 : "";
    const size_t n = z2 ? (size_t)(end - z2 - 1) : 0;
    cJSON *par = cJSON_CreateBool(size & 1);
    dj__oai_tools t;
    char err[256];
    const int rc = dj__oai_tools_parse(tools, choice, par, &t, err, sizeof err);
    if (rc != 0 && rc != 400 && rc != 503) abort();
    if (rc == 0) {
        /* what the header promises: a forced choice carries a schema the grammar compiles */
        const bool forced = t.choice == DJ__TOOLS_REQUIRED || t.choice == DJ__TOOLS_NAMED;
        if (forced != (t.schema != NULL)) abort();
        if (t.schema) {
            dj_grammar_t *g = NULL;
            const dj_status st = dj_grammar_from_json_schema(t.schema, strlen(t.schema), &g);
            if (st != DJ_OK && st != DJ_ENOMEM) abort();
            dj_grammar_free(g);
        }
        size_t content = SIZE_MAX;
        cJSON *calls = dj__oai_tool_calls(&t, text, n, "f", &content);
        if (content > n) abort();
        for (const cJSON *c = calls ? calls->child : NULL; c; c = c->next) {
            /* every call names a declared function and its arguments parse as an object */
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
            const char *args = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
            bool known = false;
            for (size_t k = 0; name && k < t.n_names; k++) known = known || !strcmp(t.names[k], name);
            cJSON *a = args ? cJSON_Parse(args) : NULL;
            if (!known || !cJSON_IsObject(a)) abort();
            cJSON_Delete(a);
        }
        if (calls && !t.parallel && cJSON_GetArraySize(calls) > 1) abort();
        cJSON_Delete(calls);
        if (dj__oai_tools_safe(&t, text, n) > n) abort();
    }
    dj__oai_tools_free(&t);
    if (cJSON_IsArray(tools)) (void)dj__oai_tool_messages(tools, err, sizeof err); /* as messages, too */
    cJSON_Delete(tools);
    cJSON_Delete(choice);
    cJSON_Delete(par);
    return 0;
}
