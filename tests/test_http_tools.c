/* test_http_tools.c: OpenAI tool calls at djinnd's HTTP door - tools and tool_choice checked (every bad input a
 * 400 naming it), calls parsed from each template family's output, and forced calls end to end on the demo model. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "daemon_util.h"
#include "server/http_impl.h"
#include "testutil.h"

#define WEATHER                                                                                                      \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather of a city\", "     \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": " \
    "\"integer\"}}, \"required\": [\"city\", \"days\"]}}}"
#define TIME                                                                                                         \
    "{\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": {\"type\": \"object\", "        \
    "\"properties\": {\"zone\": {\"enum\": [\"UTC\", \"CET\"]}}, \"required\": [\"zone\"]}}}"

/* tools / tool_choice / parallel_tool_calls as JSON texts (NULL: absent) through dj__oai_tools_parse. */
static int parse(const char *tools, const char *choice, const char *par, dj__oai_tools *t, char *err, size_t cap) {
    cJSON *a = tools ? cJSON_Parse(tools) : NULL, *b = choice ? cJSON_Parse(choice) : NULL;
    cJSON *c = par ? cJSON_Parse(par) : NULL;
    const int rc = dj__oai_tools_parse(a, b, c, t, err, cap);
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(c);
    return rc;
}

static void test_parse(void) {
    static const struct {
        const char *tools, *choice, *par, *needle; /* needle NULL: accepted */
        dj__tool_choice want;
    } cases[] = {
        {NULL, NULL, NULL, NULL, DJ__TOOLS_OFF},
        {"[]", "\"auto\"", NULL, NULL, DJ__TOOLS_OFF},
        {"[" WEATHER "]", NULL, NULL, NULL, DJ__TOOLS_AUTO},
        {"[" WEATHER "]", "\"none\"", NULL, NULL, DJ__TOOLS_OFF},
        {"[" WEATHER "," TIME "]", "\"required\"", NULL, NULL, DJ__TOOLS_REQUIRED},
        {"[" WEATHER "," TIME "]", "{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}", "false", NULL,
         DJ__TOOLS_NAMED},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}]", "\"required\"", "false", NULL,
         DJ__TOOLS_REQUIRED},
        {"{}", NULL, NULL, "'tools' must be an array", 0},
        {"[5]", NULL, NULL, "'tools[0]' must be an object", 0},
        {"[{\"type\": \"code_interpreter\"}]", NULL, NULL, "'tools[0].type'", 0},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]", NULL, NULL, "'tools[0].function.name'", 0},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"x\": 1}}]", NULL, NULL,
         "'tools[0].function.x'", 0},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 3}}]", NULL, NULL,
         "'tools[0].function.parameters'", 0},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"strict\": 1}}]", NULL, NULL,
         "'tools[0].function.strict'", 0},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": 1}}]", NULL, NULL,
         "'tools[0].function.description'", 0},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\"}, \"extra\": 1}]", NULL, NULL,
         "'tools[0].extra'", 0},
        {"[" WEATHER "," WEATHER "]", NULL, NULL, "twice", 0},
        {NULL, "\"required\"", NULL, "'tool_choice' \"required\" needs 'tools'", 0},
        {"[" WEATHER "]", "\"sometimes\"", NULL, "'tool_choice' 'sometimes'", 0},
        {"[" WEATHER "]", "3", NULL, "'tool_choice' must be", 0},
        {"[" WEATHER "]", "{\"type\": \"function\", \"function\": {\"name\": \"nope\"}}", NULL,
         "'tool_choice.function.name' 'nope'", 0},
        {"[" WEATHER "]", "{\"type\": \"allowed_tools\"}", NULL, "'tool_choice.type'", 0},
        {"[" WEATHER "]", "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"x\": 1}}", NULL,
         "'tool_choice.function.x'", 0},
        {"[" WEATHER "]", NULL, "\"yes\"", "'parallel_tool_calls'", 0},
        /* a forced call needs parameters the grammar can force; auto does not */
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"string\", "
         "\"pattern\": \"a\"}}}]", "\"required\"", NULL, "'tools[0].function.parameters' cannot force a call", 0},
        {"[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"string\", "
         "\"pattern\": \"a\"}}}]", "\"auto\"", NULL, NULL, DJ__TOOLS_AUTO},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        dj__oai_tools t;
        char err[512] = "";
        const int rc = parse(cases[k].tools, cases[k].choice, cases[k].par, &t, err, sizeof err);
        if (cases[k].needle)
            CHECK_MSG(rc == 400 && strstr(err, cases[k].needle), "case %zu: %d '%s', want 400 with %s", k, rc, err,
                      cases[k].needle);
        else
            CHECK_MSG(rc == 0 && t.choice == cases[k].want, "case %zu: %d '%s' choice %d", k, rc, err, (int)t.choice);
        /* a forced choice carries a schema; the others none */
        if (!rc) CHECK(!!t.schema == (t.choice == DJ__TOOLS_REQUIRED || t.choice == DJ__TOOLS_NAMED));
        dj__oai_tools_free(&t);
    }
    /* the schemas: named is one object; required with parallel an array of 1..8 */
    dj__oai_tools t;
    char err[256];
    CHECK(parse("[" WEATHER "," TIME "]", "\"required\"", NULL, &t, err, sizeof err) == 0);
    CHECK(t.schema && strstr(t.schema, "\"type\":\"array\"") && strstr(t.schema, "\"maxItems\":8") &&
          strstr(t.schema, "\"anyOf\""));
    dj__oai_tools_free(&t);
    CHECK(parse("[" WEATHER "," TIME "]", "{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}", NULL, &t,
                err, sizeof err) == 0);
    CHECK(t.schema && !strstr(t.schema, "array") && strstr(t.schema, "{\"const\":\"get_time\"}") &&
          !strstr(t.schema, "get_weather"));
    dj__oai_tools_free(&t);
}

/* The calls text holds, as "name(args);..." with the content kept; "" when none. */
static void calls_of(const dj__oai_tools *t, const char *text, char *out, size_t cap, size_t *content) {
    cJSON *calls = dj__oai_tool_calls(t, text, strlen(text), "x", content);
    size_t k = 0;
    out[0] = '\0';
    for (const cJSON *c = calls ? calls->child : NULL; c; c = c->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const char *id = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "id"));
        CHECK(id && !strncmp(id, "call_x_", 7));
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "type")), "function"));
        k += (size_t)snprintf(out + k, cap - k, "%s(%s);",
                              cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name")),
                              cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "arguments")));
    }
    cJSON_Delete(calls);
}

static void test_output(void) {
    dj__oai_tools t, one;
    char err[256];
    CHECK(parse("[" WEATHER "," TIME "]", NULL, NULL, &t, err, sizeof err) == 0);
    CHECK(parse("[" WEATHER "," TIME "]", NULL, "false", &one, err, sizeof err) == 0);
    static const struct {
        const char *text, *want;
        size_t content; /* bytes kept as content */
    } cases[] = {
        /* Hermes / Qwen */
        {"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>",
         "get_time({\"zone\": \"UTC\"});", 0},
        {"Let me look.\n<tool_call>{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}</tool_call>\n"
         "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 2}}</tool_call>",
         "get_time({\"zone\": \"CET\"});get_weather({\"city\": \"Oslo\", \"days\": 2});", 12},
        /* unclosed at EOS: the JSON runs to the end */
        {"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}", "get_time({});", 0},
        /* Mistral */
        {"[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]", "get_time({\"zone\": \"UTC\"});",
         0},
        /* Llama 3.1: the tag, or the bare JSON with "parameters" */
        {"<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}",
         "get_time({\"zone\": \"UTC\"});", 0},
        {"  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\", \"days\": 1}}",
         "get_weather({\"city\": \"Rome\", \"days\": 1});", 0},
        /* not calls: plain text, an undeclared function, broken JSON, a JSON answer that is no call */
        {"The weather is fine.", "", 20},
        {"<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>", "", 57},
        {"<tool_call>{\"name\": \"get_time\", \"arguments\": {</tool_call>", "", 58},
        {"{\"answer\": 42}", "", 14},
        {"[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"nope\", \"arguments\": {}}]", "", 74},
        {"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> trailing words", "", 75},
        /* control bytes cJSON reads as white space, or raw in a string: no call a client could parse */
        {"{\"name\": \"get_time\", \"arguments\": {\"zone\":\x01\"CET\"}}", "", 50},
        {"{\"name\": \"get_time\", \"arguments\": {\"zone\": \"C\tET\"}}", "", 51},
        /* the arguments as the model wrote them: digits kept (cJSON would print 1e+23), key order, spacing */
        {"{\"name\": \"get_weather\", \"arguments\": {\"days\": 198588787883784000000000, \"city\": \"a\\\"}\"}}",
         "get_weather({\"days\": 198588787883784000000000, \"city\": \"a\\\"}\"});", 0},
        {"[{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}} , {\"arguments\": {\"zone\":\"CET\"}, "
         "\"name\": \"get_time\"}]", "get_time({\"zone\": \"UTC\"});get_time({\"zone\":\"CET\"});", 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char got[512];
        size_t content = 0;
        calls_of(&t, cases[k].text, got, sizeof got, &content);
        CHECK_MSG(!strcmp(got, cases[k].want) && content == cases[k].content, "case %zu: '%s' (content %zu)", k, got,
                  content);
    }
    /* parallel_tool_calls false: two calls are no answer of this request (content) */
    char got[512];
    size_t content = 0;
    calls_of(&one, cases[1].text, got, sizeof got, &content);
    CHECK(!got[0] && content == strlen(cases[1].text));
    /* streaming: text goes out up to where a call may begin */
    static const struct {
        const char *text;
        size_t safe;
    } safe[] = {
        {"Hello there", 11}, {"Hello <tool", 6}, {"Hello <b>", 9}, {"Hi [TOOL_C", 3}, {"Hi [1]", 6},
        {"  {\"name\"", 0},  {"", 0},             {" \n", 0},      {"a <|python_tag|>{", 2},
    };
    for (size_t k = 0; k < sizeof safe / sizeof *safe; k++) {
        const size_t s = dj__oai_tools_safe(&t, safe[k].text, strlen(safe[k].text));
        CHECK_MSG(s == safe[k].safe, "safe '%s': %zu, want %zu", safe[k].text, s, safe[k].safe);
    }
    dj__oai_tools_free(&t);
    dj__oai_tools_free(&one);
    CHECK(parse("[" WEATHER "]", "\"required\"", NULL, &t, err, sizeof err) == 0);
    CHECK(dj__oai_tools_safe(&t, "[{", 2) == 0);
    calls_of(&t, "[{\"name\": \"get_weather\", \"arguments\": {\"city\":\"A\",\"days\":3}}]", got, sizeof got,
             &content);
    CHECK(!strcmp(got, "get_weather({\"city\":\"A\",\"days\":3});") && content == 0);
    dj__oai_tools_free(&t);
    CHECK(parse("[" WEATHER "]", "\"none\"", NULL, &t, err, sizeof err) == 0);
    CHECK(dj__oai_tools_safe(&t, "<tool_call>", 11) == 11);
    CHECK(dj__oai_tool_calls(&t, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}", 50, "x", &content) ==
          NULL);
    dj__oai_tools_free(&t);
}

/* An assistant turn's arguments as text become the object the templates read. */
static void test_messages(void) {
    cJSON *m = cJSON_Parse("[{\"role\": \"user\", \"content\": \"Weather?\"}, "
                           "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", "
                           "\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\", \\\"days\\\": 2}\"}}]}, "
                           "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"rain\"}]");
    char err[256] = "";
    CHECK(dj__oai_tool_messages(m, err, sizeof err) == 0);
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(m, 1), "tool_calls");
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(calls, 0), "function");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    CHECK(cJSON_IsObject(args) && cJSON_GetObjectItemCaseSensitive(args, "days")->valuedouble == 2);
    cJSON_Delete(m);
    static const struct {
        const char *msgs, *needle;
    } bad[] = {
        {"[{\"role\": \"assistant\", \"tool_calls\": {}}]", "'messages[0].tool_calls' must be an array"},
        {"[{\"role\": \"assistant\", \"tool_calls\": [3]}]", "'messages[0].tool_calls[0]'"},
        {"[{\"role\": \"user\"}, {\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
         "\"arguments\": \"{oops\"}}]}]", "'messages[1].tool_calls[0].function.arguments'"},
        {"[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"[1]\"}}]}]",
         "'messages[0].tool_calls[0].function.arguments'"},
        {"[{\"role\": \"tool\", \"tool_call_id\": 5, \"content\": \"x\"}]", "'messages[0].tool_call_id'"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        m = cJSON_Parse(bad[k].msgs);
        const int rc = dj__oai_tool_messages(m, err, sizeof err);
        CHECK_MSG(rc == 400 && strstr(err, bad[k].needle), "messages %s: %d '%s'", bad[k].msgs, rc, err);
        cJSON_Delete(m);
    }
}

/* ---- end to end, through djinnd --http on the demo model ---- */

static char tmpdir[] = "/tmp/dj_http_tools_XXXXXX";
static char store[400];

/* STORE/demo-qwen: the demo model's files with Qwen 2.5's chat template (its tool conventions). */
static bool make_qwen(void) {
    char p[700];
    snprintf(p, sizeof p, "%s/demo-qwen", store);
    if (!dj_test_link_demo_files(p)) return false;
    char *cfg = dj_test_read_file(DJ_THIRD_PARTY "/tokenizers/qwen2_5/tokenizer_config.json", NULL);
    cJSON *j = cfg ? cJSON_Parse(cfg) : NULL, *out = cJSON_CreateObject();
    free(cfg);
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    if (!cJSON_IsString(tpl)) return false;
    cJSON_AddStringToObject(out, "bos_token", "<|bos|>");
    cJSON_AddStringToObject(out, "eos_token", "<|eos|>");
    cJSON_AddStringToObject(out, "chat_template", tpl->valuestring);
    char *text = cJSON_Print(out);
    cJSON_Delete(out);
    cJSON_Delete(j);
    snprintf(p, sizeof p, "%s/demo-qwen/tokenizer_config.json", store);
    FILE *f = fopen(p, "w");
    const bool ok = f && text && fputs(text, f) >= 0;
    free(text);
    return f && fclose(f) == 0 && ok;
}

/* The answer's first choice (a detached cJSON, the caller deletes it), or NULL. */
static cJSON *choice0(const dj_test_resp *r) {
    cJSON *j = r->body ? cJSON_Parse(r->body) : NULL;
    cJSON *c = cJSON_DetachItemFromArray(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    cJSON_Delete(j);
    return c;
}

/* A call's arguments valid for get_weather / get_time (the schemas above). */
static bool valid_call(const cJSON *call) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
    const char *args = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
    cJSON *a = args ? cJSON_Parse(args) : NULL;
    bool ok = false;
    if (name && !strcmp(name, "get_weather")) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(a, "days");
        ok = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(a, "city")) && cJSON_IsNumber(d) &&
             d->valuedouble == floor(d->valuedouble) && cJSON_GetArraySize(a) == 2;
    } else if (name && !strcmp(name, "get_time")) {
        const char *z = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(a, "zone"));
        ok = z && (!strcmp(z, "UTC") || !strcmp(z, "CET")) && cJSON_GetArraySize(a) == 1;
    }
    if (!ok) fprintf(stderr, "  invalid call %s(%s)\n", name ? name : "?", args ? args : "?");
    cJSON_Delete(a);
    return ok;
}

static void test_forced(unsigned port) {
    static const char *const body =
        "{\"model\": \"%s\", \"messages\": [{\"role\": \"user\", \"content\": \"Weather in Oslo?\"}], "
        "\"max_tokens\": 200, \"temperature\": 1, \"seed\": %d, \"tools\": [" WEATHER ", " TIME "], "
        "\"tool_choice\": %s%s}";
    static const struct {
        const char *model, *choice, *extra;
        const char *only; /* the one function every call names, or NULL */
        int most;         /* calls at most */
    } cases[] = {
        {"demo-chat", "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}", "", "get_weather", 1},
        {"demo-qwen", "{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}", "", "get_time", 1},
        {"demo-chat", "\"required\"", ", \"parallel_tool_calls\": false", NULL, 1},
        {"demo-qwen", "\"required\"", "", NULL, DJ__MAX_PARALLEL_CALLS},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        for (int seed = 1; seed <= 2; seed++) { /* two each: under ASan on a loaded machine a qwen prompt is slow */
            char req[4096];
            snprintf(req, sizeof req, body, cases[k].model, seed, cases[k].choice, cases[k].extra);
            dj_test_resp r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, req);
            cJSON *c = choice0(&r);
            const cJSON *msg = cJSON_GetObjectItemCaseSensitive(c, "message");
            const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
            const int n = cJSON_GetArraySize(calls);
            bool ok = r.status == 200 && n >= 1 && n <= cases[k].most &&
                      cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(msg, "content")) &&
                      !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(c, "finish_reason")), "tool_calls");
            for (const cJSON *call = calls ? calls->child : NULL; call; call = call->next) {
                const char *name = cJSON_GetStringValue(
                    cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(call, "function"), "name"));
                ok = ok && valid_call(call) && (!cases[k].only || !strcmp(name, cases[k].only));
            }
            CHECK_MSG(ok, "case %zu seed %d: %d %.600s", k, seed, r.status, r.body ? r.body : "");
            cJSON_Delete(c);
            dj_test_resp_free(&r);
        }
    }
}

/* The stream's tool_calls deltas joined, as a client accumulates them, equal the unstreamed answer's calls; no
 * content goes out. */
static void test_stream(unsigned port) {
    static const char *const body =
        "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 200, "
        "\"temperature\": 0.9, \"seed\": 11, \"tools\": [" WEATHER ", " TIME "], \"tool_choice\": \"required\"%s}";
    char req[4096];
    snprintf(req, sizeof req, body, "");
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, req);
    cJSON *c = choice0(&r);
    cJSON *want = cJSON_DetachItemFromObject(cJSON_GetObjectItemCaseSensitive(c, "message"), "tool_calls");
    CHECK_MSG(cJSON_GetArraySize(want) >= 1, "unstreamed: %.400s", r.body ? r.body : "");
    cJSON_Delete(c);
    dj_test_resp_free(&r);
    snprintf(req, sizeof req, body, ", \"stream\": true");
    r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, req);
    cJSON *got = cJSON_CreateArray();
    char finish[32] = "";
    bool content = false;
    for (char *line = r.body; line && (line = strstr(line, "data: {")); line += 6) {
        cJSON *j = cJSON_ParseWithOpts(line + 6, NULL, 0);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(ch, "delta");
        const char *f = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ch, "finish_reason"));
        if (f) snprintf(finish, sizeof finish, "%s", f);
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "content"));
        content = content || (t && t[0]);
        const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(d, "tool_calls");
        for (const cJSON *tc = tcs ? tcs->child : NULL; tc; tc = tc->next) {
            const int idx = (int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(tc, "index"));
            while (cJSON_GetArraySize(got) <= idx) {
                cJSON *n = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(n, "function");
                cJSON_AddStringToObject(fn, "name", "");
                cJSON_AddStringToObject(fn, "arguments", "");
                cJSON_AddItemToArray(got, n);
            }
            cJSON *acc = cJSON_GetArrayItem(got, idx), *afn = cJSON_GetObjectItemCaseSensitive(acc, "function");
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id");
            if (cJSON_IsString(id)) cJSON_AddStringToObject(acc, "id", id->valuestring);
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
            const char *args = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "arguments"));
            char buf[4096];
            if (name) cJSON_ReplaceItemInObject(afn, "name", cJSON_CreateString(name));
            if (args) {
                snprintf(buf, sizeof buf, "%s%s", cJSON_GetStringValue(cJSON_GetObjectItem(afn, "arguments")), args);
                cJSON_ReplaceItemInObject(afn, "arguments", cJSON_CreateString(buf));
            }
        }
        cJSON_Delete(j);
    }
    bool same = cJSON_GetArraySize(got) == cJSON_GetArraySize(want);
    for (int k = 0; same && k < cJSON_GetArraySize(want); k++) {
        const cJSON *a = cJSON_GetObjectItem(cJSON_GetArrayItem(want, k), "function");
        const cJSON *b = cJSON_GetObjectItem(cJSON_GetArrayItem(got, k), "function");
        same = !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(a, "name")),
                       cJSON_GetStringValue(cJSON_GetObjectItem(b, "name"))) &&
               !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(a, "arguments")),
                       cJSON_GetStringValue(cJSON_GetObjectItem(b, "arguments"))) &&
               cJSON_IsString(cJSON_GetObjectItem(cJSON_GetArrayItem(got, k), "id"));
    }
    CHECK_MSG(r.status == 200 && same && !content && !strcmp(finish, "tool_calls"), "streamed calls: %.800s",
              r.body ? r.body : "");
    cJSON_Delete(got);
    cJSON_Delete(want);
    dj_test_resp_free(&r);
}

/* The second turn: the call and the tool's answer go back in; Qwen's template writes them as its model was
 * trained to read them (/tokenize renders what chat completions would). */
static void test_second_turn(unsigned port) {
    static const char *const msgs =
        "[{\"role\": \"user\", \"content\": \"Weather in Oslo?\"}, {\"role\": \"assistant\", \"content\": null, "
        "\"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": \"{\\\"city\\\": \\\"Oslo\\\", \\\"days\\\": 2}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": "
        "\"call_1\", \"content\": \"rain, 4 C\"}]";
    char req[4096], out[16384];
    snprintf(req, sizeof req, "{\"model\": \"demo-qwen\", \"messages\": %s, \"tools\": [" WEATHER "]}", msgs);
    int st = dj_test_http_text(port, "POST", "/tokenize", req, out, sizeof out);
    cJSON *j = cJSON_Parse(out);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    CHECK_MSG(st == 200 && cJSON_GetArraySize(toks) > 0, "tokenize: %d %.300s", st, out);
    char *ids = cJSON_PrintUnformatted(toks);
    snprintf(req, sizeof req, "{\"model\": \"demo-qwen\", \"tokens\": %s}", ids ? ids : "[]");
    free(ids);
    cJSON_Delete(j);
    st = dj_test_http_text(port, "POST", "/detokenize", req, out, sizeof out);
    j = cJSON_Parse(out);
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "prompt"));
    /* the arguments written as an object, not as a string of JSON */
    CHECK_MSG(st == 200 && text && strstr(text, "<tool_call>") && strstr(text, "\"name\": \"get_weather\"") &&
                  strstr(text, "\"arguments\": {\"city\": \"Oslo\", \"days\": 2}") && strstr(text, "<tool_response>") &&
                  strstr(text, "rain, 4 C") && strstr(text, "\"description\": \"Weather of a city\""),
              "rendered: %.2000s", text ? text : out);
    cJSON_Delete(j);
    /* and as a request, answered (auto: the demo model's text is no call) */
    snprintf(req, sizeof req,
             "{\"model\": \"demo-qwen\", \"messages\": %s, \"tools\": [" WEATHER "], \"max_tokens\": 8, "
             "\"temperature\": 0}",
             msgs);
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, req);
    CHECK_MSG(r.status == 200, "second turn: %d %.300s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    /* refused, naming the field */
    static const struct {
        const char *extra, *needle;
    } bad[] = {
        {", \"tool_choice\": \"required\", \"response_format\": {\"type\": \"json_object\"}", "'tool_choice'"},
        {", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"other\"}}",
         "'tool_choice.function.name'"},
        {", \"functions\": [{\"name\": \"f\"}]", "'functions'"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        snprintf(req, sizeof req,
                 "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                 "\"tools\": [" WEATHER "]%s}", bad[k].extra);
        r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, req);
        CHECK_MSG(r.status == 400 && r.body && strstr(r.body, bad[k].needle), "%s: %d %.300s", bad[k].extra, r.status,
                  r.body ? r.body : "");
        dj_test_resp_free(&r);
    }
}

int main(void) {
    test_parse();
    test_output();
    test_messages();
    dj_test_daemon_guard();
    if (!mkdtemp(tmpdir) || !dj_test_demo_store(tmpdir, store, sizeof store) || !dj_test_make_demo_chat(store) ||
        !make_qwen()) {
        fprintf(stderr, "test_http_tools: cannot make the model store in %s\n", tmpdir);
        return 1;
    }
    char addr[128];
    unsigned port = 0;
    const pid_t pid = dj_test_http_daemon_start(0, tmpdir, store, NULL, addr, sizeof addr, &port);
    CHECK_MSG(pid > 0 && port > 0, "djinnd --http did not start");
    if (pid > 0 && port > 0) {
        test_forced(port);
        test_stream(port);
        test_second_turn(port);
        CHECK(dj_test_daemon_stop(0, 10000) == 0);
    }
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_http_tools");
}
