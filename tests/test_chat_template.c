/* test_chat_template.c: our chat-template renderer against Python's jinja2
 * (tools/chat_template_ref.py, run here) - the constructs one by one, the
 * real templates of the models in third_party/tokenizers on fixed and random
 * conversations (identical strings, or both fail), and refusals at load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "djinn/chat_template.h"
#include "testutil.h"

#define REF "/usr/bin/python3 " DJ_SOURCE_DIR "/tools/chat_template_ref.py"

static char tmpdir[] = "/tmp/dj_chat_XXXXXX";

/* Run the reference on args; its JSON answer (a list), or NULL. */
static cJSON *reference(const char *args) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s", REF, args);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += k;
        if (n + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) break;
            buf = nb;
        }
    }
    int rc = pclose(p);
    if (!buf) return NULL;
    buf[n] = '\0';
    cJSON *out = rc == 0 ? cJSON_Parse(buf) : NULL;
    if (!out) fprintf(stderr, "reference failed (rc %d): %s\n%.500s\n", rc, cmd, buf);
    free(buf);
    return out;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Our rendering of one case against the reference's answer. */
static void compare(const dj_chat_template_t *t, const cJSON *vars, const cJSON *ref, const char *what, int i) {
    char *vj = cJSON_PrintUnformatted(vars);
    char *text = NULL;
    size_t len = 0;
    dj_status st = dj_chat_template_render(t, vj, strlen(vj), &text, &len);
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(ref, "text");
    if (cJSON_IsString(want)) {
        const bool same = st == DJ_OK && len == strlen(want->valuestring) && !memcmp(text, want->valuestring, len);
        CHECK_MSG(same, "%s case %d: %s\n--- jinja2:\n%s\n--- ours:\n%s\n--- vars: %s", what, i,
                  st == DJ_OK ? "differs" : dj_last_error(), want->valuestring, text ? text : "(error)", vj);
    } else {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(ref, "error");
        CHECK_MSG(st != DJ_OK, "%s case %d: jinja2 fails (%s), ours renders:\n%s", what, i,
                  cJSON_IsString(e) ? e->valuestring : "?", text ? text : "");
    }
    free(text);
    free(vj);
}

/* Each construct: its own template, rendered by both. */
static void test_constructs(void) {
    const char *path = DJ_FIXTURES "/chat/constructs.json";
    char *src = dj_test_read_file(path, NULL);
    CHECK(src != NULL);
    if (!src) return;
    cJSON *cases = cJSON_Parse(src);
    char args[1024];
    snprintf(args, sizeof args, "--templates %s", path);
    cJSON *ref = reference(args);
    CHECK(cases && ref && cJSON_GetArraySize(cases) == cJSON_GetArraySize(ref));
    for (int i = 0; ref && i < cJSON_GetArraySize(cases); i++) {
        const cJSON *c = cJSON_GetArrayItem(cases, i);
        const char *tpl = cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring;
        dj_chat_template_t *t = NULL;
        dj_status st = dj_chat_template_parse(tpl, strlen(tpl), &t);
        CHECK_MSG(st == DJ_OK, "construct %d does not parse: %s", i, dj_last_error());
        if (st == DJ_OK) compare(t, cJSON_GetObjectItemCaseSensitive(c, "vars"), cJSON_GetArrayItem(ref, i), "construct", i);
        dj_chat_template_free(t);
    }
    cJSON_Delete(cases);
    cJSON_Delete(ref);
    free(src);
}

/* ---- random conversations ---- */
static const char *const pieces[] = {
    "hello", " ", "  ", "\n", "\n\n", "\t", "world", "é", "日本語", "🙂", "\"", "'", "\\", "{{ x }}", "{% if %}",
    "<think>", "</think>", "<tool_response>", "</tool_response>", "<|im_start|>", "[INST]", "42", "-", "a.b",
};

static cJSON *rand_text(void) {
    char buf[512] = "";
    size_t n = dj_test_rand() % 8;
    for (size_t i = 0; i < n; i++) strcat(buf, pieces[dj_test_rand() % (sizeof pieces / sizeof *pieces)]);
    return cJSON_CreateString(buf);
}

static cJSON *rand_tool_call(void) {
    cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    cJSON_AddStringToObject(tc, "type", "function");
    cJSON_AddStringToObject(fn, "name", dj_test_rand() % 2 ? "get_weather" : "search");
    if (dj_test_rand() % 3 == 0) {
        cJSON_AddStringToObject(fn, "arguments", "{\"q\": \"x\"}");
    } else {
        cJSON *args = cJSON_CreateObject();
        cJSON_AddItemToObject(args, "q", rand_text());
        if (dj_test_rand() % 2) cJSON_AddNumberToObject(args, "n", (double)(dj_test_rand() % 100));
        if (dj_test_rand() % 2) cJSON_AddNumberToObject(args, "x", 0.25 * (double)(dj_test_rand() % 9));
        if (dj_test_rand() % 2) cJSON_AddBoolToObject(args, "flag", dj_test_rand() % 2);
        cJSON_AddItemToObject(fn, "arguments", args);
    }
    cJSON_AddItemToObject(tc, "function", fn);
    return tc;
}

static cJSON *rand_case(void) {
    static const char *const roles[] = {"user", "assistant", "system", "tool"};
    cJSON *vars = cJSON_CreateObject(), *msgs = cJSON_CreateArray();
    const size_t n = dj_test_rand() % 7;
    const bool alternate = dj_test_rand() % 2; /* Gemma wants user/assistant turns */
    if (alternate && dj_test_rand() % 2) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddItemToObject(m, "content", rand_text());
        cJSON_AddItemToArray(msgs, m);
    }
    for (size_t i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        const char *role = alternate ? roles[i % 2] : roles[dj_test_rand() % 4];
        cJSON_AddStringToObject(m, "role", role);
        cJSON_AddItemToObject(m, "content", rand_text());
        if (!strcmp(role, "assistant") && dj_test_rand() % 3 == 0) {
            cJSON *tcs = cJSON_CreateArray();
            for (uint64_t k = 1 + dj_test_rand() % 2; k > 0; k--) cJSON_AddItemToArray(tcs, rand_tool_call());
            cJSON_AddItemToObject(m, "tool_calls", tcs);
        }
        if (!strcmp(role, "assistant") && dj_test_rand() % 4 == 0) cJSON_AddItemToObject(m, "reasoning_content", rand_text());
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON_AddItemToObject(vars, "messages", msgs);
    cJSON_AddBoolToObject(vars, "add_generation_prompt", dj_test_rand() % 2);
    if (dj_test_rand() % 3 == 0) {
        cJSON *tools = cJSON_CreateArray(), *tool = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(tool, "type", "function");
        cJSON_AddStringToObject(fn, "name", "search");
        cJSON_AddItemToObject(fn, "description", rand_text());
        cJSON_AddItemToObject(fn, "parameters", cJSON_Parse("{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"}}}"));
        cJSON_AddItemToObject(tool, "function", fn);
        cJSON_AddItemToArray(tools, tool);
        cJSON_AddItemToObject(vars, "tools", tools);
    }
    if (dj_test_rand() % 4 == 0) cJSON_AddBoolToObject(vars, "enable_thinking", dj_test_rand() % 2);
    return vars;
}

/* A real model's template on the fixed conversations and random ones. */
static void test_model(const char *name) {
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/tokenizers/%s", DJ_THIRD_PARTY, name);
    dj_chat_template_t *t = NULL;
    dj_status st = dj_chat_template_load(cfg, &t);
    CHECK_MSG(st == DJ_OK, "%s: %s (run scripts/fetch_tokenizers.sh)", name, dj_last_error());
    if (st != DJ_OK) return;
    char *fixed = dj_test_read_file(DJ_FIXTURES "/chat/conversations.json", NULL);
    cJSON *cases = fixed ? cJSON_Parse(fixed) : NULL;
    free(fixed);
    CHECK(cases != NULL);
    if (!cases) {
        dj_chat_template_free(t);
        return;
    }
    for (int i = 0; i < 24; i++) cJSON_AddItemToArray(cases, rand_case());
    char path[600], args[1400];
    snprintf(path, sizeof path, "%s/%s.json", tmpdir, name);
    char *text = cJSON_Print(cases);
    write_file(path, text);
    free(text);
    snprintf(args, sizeof args, "%s/tokenizer_config.json %s", cfg, path);
    cJSON *ref = reference(args);
    CHECK(ref && cJSON_GetArraySize(ref) == cJSON_GetArraySize(cases));
    int n_text = 0;
    for (int i = 0; ref && i < cJSON_GetArraySize(cases); i++) {
        compare(t, cJSON_GetArrayItem(cases, i), cJSON_GetArrayItem(ref, i), name, i);
        n_text += cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(ref, i), "text") != NULL;
    }
    /* most cases must render, or the comparison says little */
    CHECK_MSG(n_text >= cJSON_GetArraySize(cases) / 3, "%s: only %d cases render", name, n_text);
    unlink(path);
    cJSON_Delete(ref);
    cJSON_Delete(cases);
    dj_chat_template_free(t);
}

static void refused(const char *src, dj_status want, const char *needle) {
    dj_chat_template_t *t = NULL;
    dj_status st = dj_chat_template_parse(src, strlen(src), &t);
    CHECK_MSG(st == want && strstr(dj_last_error(), needle), "%s: got %s '%s', want %s naming '%s'", src,
              dj_status_name(st), dj_last_error(), dj_status_name(want), needle);
    dj_chat_template_free(t);
}

static void test_refusals(void) {
    refused("{% macro f() %}x{% endmacro %}", DJ_EUNSUPPORTED, "tag 'macro'");
    refused("{% include 'x' %}", DJ_EUNSUPPORTED, "tag 'include'");
    refused("{{ x | wordwrap }}", DJ_EUNSUPPORTED, "filter 'wordwrap'");
    refused("{{ x is callable }}", DJ_EUNSUPPORTED, "test 'callable'");
    refused("{{ cycler(1) }}", DJ_EUNSUPPORTED, "function 'cycler'");
    refused("line1\n{{ x.append(1) }}", DJ_EUNSUPPORTED, "line 2: method 'append'");
    refused("{% if x %}", DJ_EFORMAT, "endif");
    refused("{% endfor %}", DJ_EFORMAT, "without its opening");
    refused("{{ 'abc }}", DJ_EFORMAT, "unterminated string");
    char deep[256] = "{{ ";
    for (int i = 0; i < 70; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 70; i++) strcat(deep, ")");
    strcat(deep, " }}");
    refused(deep, DJ_EFORMAT, "deeply");
    /* runaway templates stop at a limit */
    dj_chat_template_t *t = NULL;
    const char *big = "{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}";
    CHECK_OK(dj_chat_template_parse(big, strlen(big), &t));
    char *text = NULL;
    size_t len;
    CHECK_ST(dj_chat_template_render(t, "{}", 2, &text, &len), DJ_ERANGE);
    dj_chat_template_free(t);
    /* several loop variables unpack lists of as many; anything else is an error, with an `if` filter
     * or without (the fuzzer found the unfiltered loop reading a string as a list) */
    const char *unpack[] = {"{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}",
                            "{% for a, b in 'xy' %}{{ a }}{% endfor %}",
                            "{% for a, b in 'xy' if a %}{{ a }}{% endfor %}",
                            "{% for a, b in [[1, 2], [3]] %}{{ a }}{% endfor %}"};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(dj_chat_template_parse(unpack[i], strlen(unpack[i]), &t));
        text = NULL;
        const dj_status st = t ? dj_chat_template_render(t, "{}", 2, &text, &len) : DJ_EINVAL;
        if (i == 0) CHECK(st == DJ_OK && text && !strcmp(text, "1234"));
        else CHECK_MSG(st != DJ_OK && strstr(dj_last_error(), "cannot unpack"), "%s: %s", unpack[i], dj_last_error());
        free(text);
        dj_chat_template_free(t);
        t = NULL;
    }
    /* bos/eos from the config, raise_exception's message */
    const char *cfg = "{\"chat_template\": \"{{ bos_token }}{% if messages|length == 0 %}{{ raise_exception('no "
                      "messages') }}{% endif %}{{ eos_token }}\", \"bos_token\": {\"content\": \"<s>\"}, "
                      "\"eos_token\": \"</s>\"}";
    CHECK_OK(dj_chat_template_load_config(cfg, strlen(cfg), &t));
    CHECK_OK(dj_chat_template_render(t, "{\"messages\": [1]}", 17, &text, &len));
    CHECK(text && !strcmp(text, "<s></s>"));
    free(text);
    CHECK_ST(dj_chat_template_render(t, "{\"messages\": []}", 16, &text, &len), DJ_EINVAL);
    CHECK(strstr(dj_last_error(), "no messages") != NULL);
    CHECK_ST(dj_chat_template_render(t, "[1]", 3, &text, &len), DJ_EINVAL);
    dj_chat_template_free(t);
    CHECK_ST(dj_chat_template_load_config("{}", 2, &t), DJ_ENOTFOUND);
}

int main(void) {
    dj_test_seeds();
    if (access("/usr/bin/python3", X_OK) != 0 || system("/usr/bin/python3 -c 'import jinja2' 2>/dev/null") != 0) {
        fprintf(stderr, "test_chat_template: needs /usr/bin/python3 with jinja2 (scripts/setup.sh installs "
                        "python3-jinja2)\n");
        return 1;
    }
    if (!mkdtemp(tmpdir)) return 1;
    test_refusals();
    test_constructs();
    static const char *const models[] = {"llama3", "llama3_1", "qwen3", "gemma3"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) test_model(models[i]);
    rmdir(tmpdir);
    return dj_test_finish("test_chat_template");
}
