/* test_http_openai.c: djinnd --http's OpenAI request fields on the demo model -
 * fresh seeds reported and repeatable, vLLM's sampling fields passed through
 * (equal to libdjinn with the same params), every documented field of the chat
 * and completions requests honoured or refused with a 400 naming it, unknown
 * fields refused, content as a list of text parts, response_format (json_schema,
 * streamed, json_object), and /health, /v1/models/{id}, /tokenize, /detokenize. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "djinn/client.h"
#include "djinn/tokenizer.h"
#include "client_util.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_http_oai_XXXXXX";
static char store[400];

static bool make_store(void) {
    snprintf(store, sizeof store, "%s/store", tmpdir);
    char p[600];
    if (mkdir(store, 0700)) return false;
    snprintf(p, sizeof p, "%s/demo", store);
    if (symlink(DJ_SOURCE_DIR "/models/demo", p)) return false;
    return dj_test_make_demo_chat(store);
}

/* The answer's text (chat's message content or the completion's text) and
 * its "seed" (-1 when absent); "" when not an answer. */
static char *answer(const dj_test_resp *r, bool chat, double *seed) {
    cJSON *j = r->body ? cJSON_Parse(r->body) : NULL;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    const cJSON *t = chat ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "message"), "content")
                          : cJSON_GetObjectItemCaseSensitive(c, "text");
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "seed");
    if (seed) *seed = cJSON_IsNumber(s) ? s->valuedouble : -1;
    char *out = strdup(cJSON_IsString(t) ? t->valuestring : "");
    cJSON_Delete(j);
    return out;
}

static char *post(unsigned port, bool chat, const char *body, int *status, double *seed) {
    dj_test_resp r = dj_test_http_request(port, "POST", chat ? "/v1/chat/completions" : "/v1/completions", NULL, body);
    *status = r.status;
    char *t = answer(&r, chat, seed);
    if (r.status != 200) fprintf(stderr, "  (status %d: %.300s)\n", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    return t;
}

/* The OpenAI error of a request: its status and message (malloc'd). */
static char *post_error(unsigned port, bool chat, const char *body, int *status) {
    dj_test_resp r = dj_test_http_request(port, "POST", chat ? "/v1/chat/completions" : "/v1/completions", NULL, body);
    *status = r.status;
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
    char *out = strdup(cJSON_IsString(m) ? m->valuestring : (r.body ? r.body : ""));
    cJSON_Delete(j);
    dj_test_resp_free(&r);
    return out;
}

/* ---- seeds ---- */

static void test_seeds(unsigned port) {
    /* no seed: each request draws its own, says which, and that seed repeats
     * it. 20 at temperature 1 over 16 tokens: at least 15 distinct (a fresh
     * seed each, so this one check rests on the server's random draw; on the
     * demo model two equal 16-token samples are vanishingly rare) */
    const char *fresh = "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 1}";
    char *texts[20];
    double seeds[20];
    int distinct = 0, ok = 0;
    for (int i = 0; i < 20; i++) {
        int st;
        texts[i] = post(port, false, fresh, &st, &seeds[i]);
        ok += st == 200 && seeds[i] >= 0 && seeds[i] < 9007199254740992.0;
        bool seen = false;
        for (int k = 0; k < i; k++) seen = seen || !strcmp(texts[k], texts[i]);
        distinct += !seen;
    }
    CHECK_MSG(ok == 20, "%d of 20 unseeded answers were 200 with a seed below 2^53", ok);
    CHECK_MSG(distinct >= 15, "20 unseeded samples at temperature 1: %d distinct texts (want >= 15)", distinct);
    /* the reported seed gives the same text back (three of them) */
    for (int i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16, \"temperature\": 1, "
                 "\"seed\": %.0f}", seeds[i]);
        int st;
        double s2;
        char *t = post(port, false, body, &st, &s2);
        CHECK_MSG(st == 200 && s2 == seeds[i] && !strcmp(t, texts[i]), "seed %.0f again: '%s' vs '%s'", seeds[i], t,
                  texts[i]);
        free(t);
    }
    for (int i = 0; i < 20; i++) free(texts[i]);
    /* with a seed: the same text every time, chat and completions */
    for (int chat = 0; chat < 2; chat++) {
        const char *body = chat ? "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}],"
                                  " \"max_tokens\": 16, \"temperature\": 1, \"seed\": 42}"
                                : "{\"model\": \"demo\", \"prompt\": \"Once\", \"max_tokens\": 16, \"temperature\": 1, "
                                  "\"seed\": -5}";
        int st;
        double s0;
        char *first = post(port, chat, body, &st, &s0);
        CHECK_MSG(st == 200 && s0 == (chat ? 42 : -5), "seeded status %d, seed %g", st, s0);
        for (int i = 0; i < 4; i++) {
            char *t = post(port, chat, body, &st, NULL);
            CHECK_MSG(st == 200 && !strcmp(t, first), "seeded (chat %d): '%s' vs '%s'", chat, t, first);
            free(t);
        }
        free(first);
    }
}

/* ---- vLLM's sampling fields, passed through ---- */

typedef dj_test_text collect; /* client_util.h */
/* libdjinn's generation of "Once upon a time" (with BOS) with sp. */
static collect reference(const char *addr, const dj_sampler_params *sp, uint32_t max_tokens) {
    return dj_test_reference(addr, "demo", "Once upon a time", true, sp, max_tokens);
}

static void test_sampling_fields(const char *addr, unsigned port) {
    static const struct {
        const char *json;
        dj_sampler_params sp;
    } cases[] = {
        {"\"temperature\": 1.5, \"top_k\": 1, \"seed\": 3", {.temperature = 1.5f, .top_k = 1, .top_p = 1, .seed = 3}},
        {"\"temperature\": 0.9, \"top_k\": 5, \"min_p\": 0.2, \"seed\": 8",
         {.temperature = 0.9f, .top_k = 5, .top_p = 1, .min_p = 0.2f, .seed = 8}},
        {"\"temperature\": 0, \"repetition_penalty\": 1.8", {.top_p = 1, .repetition_penalty = 1.8f}},
        {"\"temperature\": 0.8, \"frequency_penalty\": 1.5, \"presence_penalty\": -0.5, \"top_p\": 0.9, \"seed\": 11",
         {.temperature = 0.8f, .top_p = 0.9f, .seed = 11, .frequency_penalty = 1.5f, .presence_penalty = -0.5f}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        collect want = reference(addr, &cases[k].sp, 24);
        char body[512];
        snprintf(body, sizeof body, "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 24, %s}",
                 cases[k].json);
        int st;
        char *t = post(port, false, body, &st, NULL);
        CHECK_MSG(st == 200 && !strcmp(t, want.text), "{%s}: http '%s' vs libdjinn '%s'", cases[k].json, t, want.text);
        free(t);
    }
    /* top_k 1 at temperature 1.5 is the greedy answer; so is min_p 1 */
    int st;
    char *greedy = post(port, false, "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 24, "
                                     "\"temperature\": 0}", &st, NULL);
    char *k1 = post(port, false, "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 24, "
                                 "\"temperature\": 1.5, \"top_k\": 1}", &st, NULL);
    char *p1 = post(port, false, "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 24, "
                                 "\"temperature\": 1.5, \"min_p\": 1}", &st, NULL);
    CHECK_MSG(greedy[0] && !strcmp(greedy, k1) && !strcmp(greedy, p1), "greedy '%s', top_k 1 '%s', min_p 1 '%s'",
              greedy, k1, p1);
    /* a repetition penalty changes the greedy answer (the demo model repeats itself) */
    char *rp = post(port, false, "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 24, "
                                 "\"temperature\": 0, \"repetition_penalty\": 1.8}", &st, NULL);
    CHECK_MSG(st == 200 && strcmp(rp, greedy), "repetition_penalty 1.8 left the greedy answer '%s'", greedy);
    free(greedy);
    free(k1);
    free(p1);
    free(rp);
}

/* ---- the two doors' defaults (docs/protocol.md's table) ---- */

static void test_defaults(const char *addr, unsigned port) {
    /* HTTP without temperature or top_p samples at temperature 1, top_p 1: GENERATE with those, the same seed */
    const dj_sampler_params t1 = {.temperature = 1, .top_p = 1, .seed = 77};
    collect want = reference(addr, &t1, 16);
    int st;
    char *t = post(port, false, "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16, "
                                "\"seed\": 77}", &st, NULL);
    CHECK_MSG(st == 200 && !strcmp(t, want.text), "HTTP's defaults: '%s' vs GENERATE at T 1, top_p 1: '%s'", t,
              want.text);
    free(t);
    /* GENERATE without sampling fields is greedy: HTTP's temperature 0 */
    const dj_sampler_params none = {0};
    want = reference(addr, &none, 16);
    t = post(port, false, "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16, "
                          "\"temperature\": 0}", &st, NULL);
    CHECK_MSG(st == 200 && !strcmp(t, want.text), "greedy: HTTP '%s' vs GENERATE's default '%s'", t, want.text);
    free(t);
    /* a seeded chat: the template's ids (/tokenize renders them) through libdjinn give the same text */
    static const char *const msgs = "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
                                    "\"content\": \"Hello there\"}]";
    char body[1024], out[8192];
    snprintf(body, sizeof body, "{\"model\": \"demo-chat\", \"messages\": %s}", msgs);
    st = dj_test_http_text(port, "POST", "/tokenize", body, out, sizeof out);
    cJSON *j = cJSON_Parse(out);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(j, "tokens");
    int32_t ids[512];
    size_t n = 0;
    for (const cJSON *e = toks ? toks->child : NULL; e && n < 512; e = e->next) ids[n++] = (int32_t)e->valuedouble;
    cJSON_Delete(j);
    CHECK_MSG(st == 200 && n > 0, "tokenize: %d %.200s", st, out);
    const dj_sampler_params sp = {.temperature = 0.9f, .top_p = 0.9f, .top_k = 40, .seed = 13};
    want = dj_test_reference_ids(addr, "demo-chat", ids, n, &sp, 16);
    snprintf(body, sizeof body,
             "{\"model\": \"demo-chat\", \"messages\": %s, \"temperature\": 0.9, \"top_p\": 0.9, \"top_k\": 40, "
             "\"seed\": 13, \"max_tokens\": 16}", msgs);
    t = post(port, true, body, &st, NULL);
    CHECK_MSG(st == 200 && !strcmp(t, want.text), "seeded chat: HTTP '%s' vs GENERATE '%s'", t, want.text);
    free(t);
}

/* ---- logit_bias: the same tokens through both doors ---- */

static void test_logit_bias(const char *addr, unsigned port) {
    const dj_sampler_params greedy = {.top_p = 1}, hot = {.temperature = 0.9f, .top_p = 1, .seed = 21};
    collect plain = reference(addr, &greedy, 16);
    /* the greedy answer's first token banned, and a weak token pushed up at temperature 0.9 */
    static const char *const ask = "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 16, %s}";
    static const struct {
        const char *json;
        bool hot;
        dj_logit_bias b[2];
        size_t n;
    } cases[] = {
        {"\"temperature\": 0, \"logit_bias\": {\"60\": 100}", false, {{60, 100.f}}, 1},
        {"\"temperature\": 0, \"logit_bias\": {\"60\": 100, \"61\": 99.5}", false, {{60, 100.f}, {61, 99.5f}}, 2},
        {"\"temperature\": 0.9, \"seed\": 21, \"logit_bias\": {\"60\": 8, \"33\": -100}", true,
         {{60, 8.f}, {33, -100.f}}, 2},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        collect want = dj_test_reference_biased(addr, "demo", "Once upon a time", true, cases[k].hot ? &hot : &greedy,
                                                16, cases[k].b, cases[k].n);
        char body[512];
        snprintf(body, sizeof body, ask, cases[k].json);
        int st;
        char *t = post(port, false, body, &st, NULL);
        CHECK_MSG(st == 200 && !strcmp(t, want.text), "{%s}: http '%s' vs libdjinn '%s'", cases[k].json, t, want.text);
        CHECK_MSG(strcmp(want.text, plain.text), "{%s} left the unbiased answer '%s'", cases[k].json, plain.text);
        free(t);
    }
}

/* ---- every documented field: honoured (200) or refused naming it ---- */

typedef struct field_case {
    bool chat;
    const char *json; /* the field and its value, spliced into a small request */
    int status;       /* 200, or 400 with needle in the message */
    const char *needle;
} field_case;

static const field_case field_cases[] = {
    /* chat: https://platform.openai.com/docs/api-reference/chat/create */
    {true, "\"frequency_penalty\": 0.5", 200, NULL},
    {true, "\"presence_penalty\": 0.5", 200, NULL},
    {true, "\"logit_bias\": {}", 200, NULL},
    {true, "\"logit_bias\": {\"5\": 10}", 200, NULL},
    {true, "\"logit_bias\": {\"5\": 10, \"7\": -100}, \"temperature\": 0.7, \"seed\": 2", 200, NULL},
    {true, "\"logit_bias\": [5]", 400, "'logit_bias' must be an object"},
    {true, "\"logit_bias\": {\"x\": 1}", 400, "'logit_bias' key 'x'"},
    {true, "\"logit_bias\": {\"-1\": 1}", 400, "'logit_bias' key '-1'"},
    {true, "\"logit_bias\": {\"5\": 100.5}", 400, "'logit_bias.5'"},
    {true, "\"logit_bias\": {\"5\": \"up\"}", 400, "'logit_bias.5'"},
    {true, "\"logit_bias\": {\"5\": 1, \"05\": 2}", 400, "twice"},
    {true, "\"logit_bias\": {\"2147483648\": 1}", 400, "'logit_bias' key"},
    {true, "\"logit_bias\": {\"99999\": 1}", 400, "logit_bias names token id 99999"},
    {true, "\"logprobs\": true, \"top_logprobs\": 2", 200, NULL},
    {true, "\"max_completion_tokens\": 3", 200, NULL},
    {true, "\"max_tokens\": 3", 200, NULL},
    {true, "\"n\": 1", 200, NULL},
    {true, "\"n\": 2", 400, "'n'"},
    {true, "\"seed\": 1", 200, NULL},
    {true, "\"stop\": [\"\\n\", \"xyz\"]", 200, NULL},
    {true, "\"stream\": false", 200, NULL},
    {true, "\"stream\": true, \"stream_options\": {\"include_usage\": true}", 200, NULL},
    {true, "\"stream_options\": {\"include_obfuscation\": true}", 400, "include_obfuscation"},
    {true, "\"temperature\": 0.5", 200, NULL},
    {true, "\"top_p\": 0.5", 200, NULL},
    {true, "\"user\": \"u-1\"", 200, NULL},
    {true, "\"user\": 5", 400, "'user'"},
    {true, "\"safety_identifier\": \"s-1\"", 200, NULL},
    {true, "\"prompt_cache_key\": \"k\"", 200, NULL},
    {true, "\"response_format\": {\"type\": \"text\"}", 200, NULL},
    {true, "\"response_format\": {\"type\": \"yaml\"}", 400, "'response_format'"},
    {true, "\"response_format\": {\"type\": \"json_object\"}", 200, NULL},
    {true, "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", \"strict\": true, "
           "\"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}}}}", 200, NULL},
    {true, "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", "
           "\"schema\": {\"type\": \"string\", \"pattern\": \"a+\"}}}", 400, "'pattern'"},
    {true, "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {}}}", 400,
     "response_format.json_schema.name"},
    {true, "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", \"schema\": {}, "
           "\"mode\": 1}}", 400, "'response_format.json_schema.mode'"},
    {true, "\"tools\": []", 200, NULL},
    {true, "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", 200, NULL},
    {true, "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"required\"", 200,
     NULL},
    {true, "\"tools\": [{\"type\": \"web_search\"}]", 400, "'tools[0].type'"},
    {true, "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}", 400,
     "'tool_choice.function.name'"},
    {true, "\"parallel_tool_calls\": 1", 400, "'parallel_tool_calls'"},
    {true, "\"tool_choice\": \"none\"", 200, NULL},
    {true, "\"tool_choice\": \"required\"", 400, "'tool_choice'"},
    {true, "\"parallel_tool_calls\": false", 200, NULL},
    {true, "\"functions\": [{\"name\": \"f\"}]", 400, "'functions'"},
    {true, "\"function_call\": {\"name\": \"f\"}", 400, "'function_call'"},
    {true, "\"audio\": {\"voice\": \"alloy\", \"format\": \"wav\"}", 400, "'audio'"},
    {true, "\"modalities\": [\"text\"]", 200, NULL},
    {true, "\"modalities\": [\"text\", \"audio\"]", 400, "'modalities'"},
    {true, "\"store\": false", 200, NULL},
    {true, "\"store\": true", 400, "'store'"},
    {true, "\"metadata\": {\"a\": \"b\"}", 400, "'metadata'"},
    {true, "\"prediction\": {\"type\": \"content\", \"content\": \"x\"}", 400, "'prediction'"},
    {true, "\"reasoning_effort\": \"low\"", 400, "'reasoning_effort'"},
    {true, "\"verbosity\": \"low\"", 400, "'verbosity'"},
    {true, "\"service_tier\": \"auto\"", 200, NULL},
    {true, "\"service_tier\": \"priority\"", 400, "'service_tier'"},
    {true, "\"web_search_options\": {}", 200, NULL},
    {true, "\"web_search_options\": {\"search_context_size\": \"low\"}", 400, "'web_search_options'"},
    {true, "\"top_k\": 3", 200, NULL},
    {true, "\"min_p\": 0.1", 200, NULL},
    {true, "\"repetition_penalty\": 1.1", 200, NULL},
    {true, "\"repetition_penalty\": 0", 400, "'repetition_penalty'"},
    {true, "\"top_k\": 1.5", 400, "'top_k'"},
    {true, "\"min_p\": 2", 400, "'min_p'"},
    {true, "\"frobnicate\": 1", 400, "'frobnicate'"},
    {true, "\"prompt\": \"x\"", 400, "'prompt'"},
    {true, "\"echo\": true", 400, "'echo'"},
    /* completions: https://platform.openai.com/docs/api-reference/completions/create */
    {false, "\"best_of\": 1", 200, NULL},
    {false, "\"best_of\": 3", 400, "'best_of'"},
    {false, "\"echo\": false", 200, NULL},
    {false, "\"echo\": true", 400, "'echo'"},
    {false, "\"frequency_penalty\": -0.5", 200, NULL},
    {false, "\"logit_bias\": {\"50\": -100}", 200, NULL},
    {false, "\"logit_bias\": {\"50256\": -100}", 400, "logit_bias names token id 50256"},
    {false, "\"logprobs\": 2", 200, NULL},
    {false, "\"max_tokens\": 3", 200, NULL},
    {false, "\"n\": 3", 400, "'n'"},
    {false, "\"presence_penalty\": -0.5", 200, NULL},
    {false, "\"seed\": 9", 200, NULL},
    {false, "\"stop\": \"xyz\"", 200, NULL},
    {false, "\"stream\": true, \"stream_options\": {\"include_usage\": false}", 200, NULL},
    {false, "\"suffix\": \"end\"", 400, "'suffix'"},
    {false, "\"temperature\": 0.2", 200, NULL},
    {false, "\"top_p\": 0.2", 200, NULL},
    {false, "\"user\": \"u-2\"", 200, NULL},
    {false, "\"top_k\": -1", 200, NULL},
    {false, "\"messages\": []", 400, "'messages'"},
    {false, "\"max_completion_tokens\": 3", 400, "'max_completion_tokens'"},
    {false, "\"response_format\": {\"type\": \"json_object\"}", 400, "'response_format'"},
    {false, "\"Temperature\": 1", 400, "'Temperature'"},
};

static void test_fields(unsigned port) {
    for (size_t k = 0; k < sizeof field_cases / sizeof *field_cases; k++) {
        const field_case *f = &field_cases[k];
        char body[1024];
        snprintf(body, sizeof body,
                 f->chat ? "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                           "\"max_tokens\": 4, %s}"
                         : "{\"model\": \"demo\", \"prompt\": \"Once\", \"max_tokens\": 4, %s}",
                 f->json);
        int st;
        char *msg = post_error(port, f->chat, body, &st);
        CHECK_MSG(st == f->status && (!f->needle || strstr(msg, f->needle)), "%s {%s}: %d '%s', want %d with %s",
                  f->chat ? "chat" : "completions", f->json, st, msg, f->status, f->needle ? f->needle : "-");
        free(msg);
    }
    /* a message's unknown field, and part types other than text */
    static const struct {
        const char *messages, *needle;
    } bad_msgs[] = {
        {"[{\"role\": \"user\", \"content\": \"Hi\", \"mood\": \"x\"}]", "'messages[0].mood'"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]", "'image_url'"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"input_audio\", "
         "\"input_audio\": {}}]}]", "'input_audio'"},
        {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]", "messages[0].content[0].text"},
        {"[{\"role\": \"user\", \"content\": [\"hi\"]}]", "messages[0].content[0]"},
    };
    for (size_t k = 0; k < sizeof bad_msgs / sizeof *bad_msgs; k++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"model\": \"demo-chat\", \"messages\": %s}", bad_msgs[k].messages);
        int st;
        char *msg = post_error(port, true, body, &st);
        CHECK_MSG(st == 400 && strstr(msg, bad_msgs[k].needle), "messages %s: %d '%s'", bad_msgs[k].messages, st, msg);
        free(msg);
    }
}

/* content as a list of text parts: the same answer as the parts joined by "\n" */
static void test_content_parts(unsigned port) {
    int st1, st2;
    char *parts = post(port, true, "{\"model\": \"demo-chat\", \"temperature\": 0, \"max_tokens\": 12, \"messages\": "
                                   "[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hello\"}, "
                                   "{\"type\": \"text\", \"text\": \"there\"}]}]}", &st1, NULL);
    char *joined = post(port, true, "{\"model\": \"demo-chat\", \"temperature\": 0, \"max_tokens\": 12, \"messages\": "
                                    "[{\"role\": \"user\", \"content\": \"Hello\\nthere\"}]}", &st2, NULL);
    CHECK_MSG(st1 == 200 && st2 == 200 && parts[0] && !strcmp(parts, joined), "parts '%s' vs joined '%s'", parts,
              joined);
    free(parts);
    free(joined);
}

/* response_format: the answer parses (streamed too, the same text), a
 * required key is there, and finish_reason is "stop" (EOS after the value) */
static void test_response_format(unsigned port) {
    const char *body = "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                       "\"max_tokens\": 120, \"temperature\": 1, \"seed\": 5%s, \"response_format\": {\"type\": "
                       "\"json_schema\", \"json_schema\": {\"name\": \"p\", \"schema\": {\"type\": \"object\", "
                       "\"properties\": {\"name\": {\"type\": \"string\"}, \"n\": {\"type\": \"integer\"}}, "
                       "\"required\": [\"name\", \"n\"], \"additionalProperties\": false}}}}";
    char req[1024];
    snprintf(req, sizeof req, body, "");
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, req);
    char *text = answer(&r, true, NULL);
    cJSON *v = cJSON_Parse(text);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(v, "n");
    CHECK_MSG(r.status == 200 && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(v, "name")) && cJSON_IsNumber(n) &&
                  n->valuedouble == (double)(long long)n->valuedouble && cJSON_GetArraySize(v) == 2,
              "json_schema answer: '%s'", text);
    CHECK_MSG(r.body && strstr(r.body, "\"finish_reason\":\"stop\""), "finish: %.300s", r.body ? r.body : "");
    cJSON_Delete(v);
    dj_test_resp_free(&r);
    snprintf(req, sizeof req, body, ", \"stream\": true");
    r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, req);
    /* the deltas joined */
    char joined[8192] = "";
    size_t k = 0;
    for (char *line = r.body; line && (line = strstr(line, "data: {")); line += 6) {
        cJSON *j = cJSON_ParseWithOpts(line + 6, NULL, 0);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "delta"), "content");
        if (cJSON_IsString(t) && k + strlen(t->valuestring) < sizeof joined) {
            memcpy(joined + k, t->valuestring, strlen(t->valuestring) + 1);
            k += strlen(t->valuestring);
        }
        cJSON_Delete(j);
    }
    CHECK_MSG(r.status == 200 && !strcmp(joined, text), "streamed '%s' vs '%s'", joined, text);
    free(text);
    dj_test_resp_free(&r);
    /* json_object: any object */
    r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL,
                             "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], "
                             "\"max_tokens\": 100, \"temperature\": 0, \"response_format\": {\"type\": \"json_object\"}}");
    text = answer(&r, true, NULL);
    v = cJSON_Parse(text);
    CHECK_MSG(r.status == 200 && cJSON_IsObject(v), "json_object answer: '%s'", text);
    cJSON_Delete(v);
    free(text);
    dj_test_resp_free(&r);
}

/* /health, /v1/models[/{id}], /tokenize, /detokenize */
static void test_endpoints(unsigned port) {
    char out[8192];
    CHECK(dj_test_http_text(port, "GET", "/health", NULL, out, sizeof out) == 200 && strstr(out, "\"status\":\"ok\""));
    CHECK(dj_test_http_text(port, "GET", "/v1/models", NULL, out, sizeof out) == 200 &&
          strstr(out, "{\"id\":\"demo-chat\",\"object\":\"model\",\"created\":0,\"owned_by\":\"djinnd\",\"loaded\":") &&
          strstr(out, "\"max_model_len\":512,\"chat_template\":true,\"tokenizer\":true}"));
    CHECK_MSG(dj_test_http_text(port, "GET", "/v1/models/demo", NULL, out, sizeof out) == 200 &&
                  !strncmp(out, "{\"id\":\"demo\",", 13) && strstr(out, "\"chat_template\":false"), "%s", out);
    CHECK(dj_test_http_text(port, "GET", "/v1/models/nope", NULL, out, sizeof out) == 404 && strstr(out, "'nope'"));
    CHECK(dj_test_http_text(port, "POST", "/health", NULL, out, sizeof out) == 405);
    /* tokenize: the tokenizer's ids (BOS added unless asked not to) */
    dj_tokenizer_t *tok = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(dj_tokenizer_load(DJ_SOURCE_DIR "/models/demo/tokenizer.json", &tok));
    if (tok) CHECK_OK(dj_tokenizer_encode(tok, "Once upon a time", 16, true, &ids, &n));
    char want[512] = "{\"tokens\":[";
    for (size_t i = 0; i < n; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? "," : "", ids[i]);
    snprintf(want + strlen(want), sizeof want - strlen(want), "],\"count\":%zu,\"max_model_len\":512}", n);
    CHECK_MSG(dj_test_http_text(port, "POST", "/tokenize", "{\"model\": \"demo\", \"prompt\": \"Once upon a time\"}", out,
                                sizeof out) == 200 && !strcmp(out, want), "%s vs %s", out, want);
    free(ids);
    dj_tokenizer_free(tok);
    CHECK(dj_test_http_text(port, "POST", "/tokenize", "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", "
                            "\"add_special_tokens\": false}", out, sizeof out) == 200 &&
          strstr(out, "\"count\":") && !strstr(out, "[0,"));
    /* a chat: as many tokens as the completion's prompt_tokens */
    const char *chat = "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello there\"}]";
    char body[512];
    snprintf(body, sizeof body, "%s}", chat);
    CHECK(dj_test_http_text(port, "POST", "/tokenize", body, out, sizeof out) == 200);
    cJSON *j = cJSON_Parse(out);
    const int count = cJSON_GetObjectItemCaseSensitive(j, "count") ? cJSON_GetObjectItemCaseSensitive(j, "count")->valueint : -1;
    cJSON_Delete(j);
    snprintf(body, sizeof body, "%s, \"max_tokens\": 1}", chat);
    CHECK(dj_test_http_text(port, "POST", "/v1/chat/completions", body, out, sizeof out) == 200);
    char pt[64];
    snprintf(pt, sizeof pt, "\"prompt_tokens\":%d,", count);
    CHECK_MSG(count > 0 && strstr(out, pt), "tokenize count %d; completion %s", count, out);
    /* detokenize */
    CHECK_MSG(dj_test_http_text(port, "POST", "/detokenize", "{\"model\": \"demo\", \"tokens\": [41, 444, 338, 987]}", out,
                                sizeof out) == 200 && !strcmp(out, "{\"prompt\":\"Hello there\"}"), "%s", out);
    static const struct {
        const char *path, *body, *needle;
        int status;
    } bad[] = {
        {"/tokenize", "{\"model\": \"demo\"}", "one of 'prompt'", 400},
        {"/tokenize", "{\"model\": \"demo\", \"prompt\": \"x\", \"extra\": 1}", "'extra'", 400},
        {"/tokenize", "{\"model\": \"nope\", \"prompt\": \"x\"}", "'nope'", 404},
        {"/tokenize", "[", "not valid JSON", 400},
        {"/detokenize", "{\"model\": \"demo\", \"tokens\": [5000]}", "tokens[0]", 400},
        {"/detokenize", "{\"model\": \"demo\", \"tokens\": \"x\"}", "'tokens'", 400},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        const int st = dj_test_http_text(port, "POST", bad[k].path, bad[k].body, out, sizeof out);
        CHECK_MSG(st == bad[k].status && strstr(out, bad[k].needle), "%s %s: %d %s", bad[k].path, bad[k].body, st, out);
    }
}

int main(void) {
    dj_test_daemon_guard();
    if (!mkdtemp(tmpdir) || !make_store()) {
        fprintf(stderr, "test_http_openai: cannot make the model store in %s\n", tmpdir);
        return 1;
    }
    char addr[128];
    unsigned port = 0;
    const pid_t pid = dj_test_http_daemon_start(0, tmpdir, store, NULL, addr, sizeof addr, &port);
    CHECK_MSG(pid > 0 && port > 0, "djinnd --http did not start");
    if (pid > 0 && port > 0) {
        test_seeds(port);
        test_sampling_fields(addr, port);
        test_logit_bias(addr, port);
        test_defaults(addr, port);
        test_fields(port);
        test_content_parts(port);
        test_response_format(port);
        test_endpoints(port);
        CHECK(dj_test_daemon_stop(0, 10000) == 0);
    }
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_http_openai");
}
