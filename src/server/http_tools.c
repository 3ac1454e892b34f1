/* http_tools.c: OpenAI tool calls at the HTTP door - tools, tool_choice and
 * parallel_tool_calls checked, the schema that forces a call, the model's output parsed into tool_calls. */
#define _GNU_SOURCE /* memmem */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "djinn/alloc.h"
#include "djinn/grammar.h"
#include "server/http_impl.h"

/* The markers the chat templates' models write before a call (auto choice):
 * Hermes / Qwen 2.5 / Qwen3, Mistral, Llama 3.1's built-in-tool tag. */
static const char *const markers[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};
#define N_MARKERS (sizeof markers / sizeof *markers)

static int bad(char *err, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return 400;
}

static int oom(char *err, size_t cap) {
    snprintf(err, cap, "out of memory");
    return 503;
}

/* OpenAI's rule for a function's name: 1 to 64 of a-z, A-Z, 0-9, '_', '-'. */
static bool name_ok(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (n == DJ__TOOL_NAME_MAX || !((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') ||
                                        (s[n] >= '0' && s[n] <= '9') || s[n] == '_' || s[n] == '-'))
            return false;
    return n > 0;
}

/* An object's keys all in keys[n] (a null value counts as absent); else a
 * 400 naming the first other one under `where`. */
static int only_keys(const cJSON *o, const char *const *keys, size_t n, const char *where, char *err, size_t cap) {
    for (const cJSON *f = o->child; f; f = f->next) {
        size_t k = 0;
        while (k < n && strcmp(keys[k], f->string)) k++;
        if (k == n && !cJSON_IsNull(f))
            return bad(err, cap, "unknown field '%s.%.64s': djinnd refuses what it would not honour", where, f->string);
    }
    return 0;
}

/* The schema of one call of fn: {"name": its name, "arguments": its
 * parameters} (no parameters: an empty object), those two keys only. */
static cJSON *call_schema(const cJSON *fn) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    cJSON *s = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(s, "properties");
    cJSON_AddStringToObject(s, "type", "object");
    cJSON *n = cJSON_AddObjectToObject(props, "name");
    if (n) cJSON_AddStringToObject(n, "const", name->valuestring);
    if (cJSON_IsObject(params)) {
        cJSON_AddItemToObject(props, "arguments", cJSON_Duplicate(params, true));
    } else {
        cJSON *a = cJSON_AddObjectToObject(props, "arguments");
        if (a) cJSON_AddStringToObject(a, "type", "object");
        if (a) cJSON_AddObjectToObject(a, "properties");
        if (a) cJSON_AddFalseToObject(a, "additionalProperties");
    }
    cJSON *req = cJSON_AddArrayToObject(s, "required");
    if (req) cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    if (req) cJSON_AddItemToArray(req, cJSON_CreateString("arguments"));
    cJSON_AddFalseToObject(s, "additionalProperties");
    return s;
}

/* Whether schema (as text) compiles to a grammar; else a 400 naming tools[i]. */
static int compiles(const cJSON *schema, int i, char *err, size_t cap) {
    char *text = cJSON_PrintUnformatted(schema);
    if (!text) return oom(err, cap);
    dj_grammar_t *g = NULL;
    const dj_status st = dj_grammar_from_json_schema(text, strlen(text), &g);
    free(text);
    dj_grammar_free(g);
    if (st == DJ_ENOMEM) return oom(err, cap);
    if (st != DJ_OK)
        return bad(err, cap, "'tools[%d].function.parameters' cannot force a call: %s", i, dj_last_error());
    return 0;
}

/* tools[i] checked; its function's name into t->names[i]. */
static int check_tool(const cJSON *tool, int i, dj__oai_tools *t, char *err, size_t cap) {
    char where[48];
    snprintf(where, sizeof where, "tools[%d]", i);
    if (!cJSON_IsObject(tool)) return bad(err, cap, "'%s' must be an object", where);
    static const char *const keys[] = {"type", "function"};
    int rc = only_keys(tool, keys, 2, where, err, cap);
    if (rc) return rc;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(tool, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
        return bad(err, cap, "'%s.type' must be \"function\": djinnd takes function tools only", where);
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
    snprintf(where, sizeof where, "tools[%d].function", i);
    if (!cJSON_IsObject(fn)) return bad(err, cap, "'%s' must be an object", where);
    static const char *const fkeys[] = {"name", "description", "parameters", "strict"};
    if ((rc = only_keys(fn, fkeys, 4, where, err, cap))) return rc;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsString(name) || !name_ok(name->valuestring))
        return bad(err, cap, "'%s.name' must be 1 to 64 letters, digits, '_' or '-'", where);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(fn, "description");
    if (v && !cJSON_IsNull(v) && !cJSON_IsString(v)) return bad(err, cap, "'%s.description' must be a string", where);
    v = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    if (v && !cJSON_IsNull(v) && !cJSON_IsObject(v)) return bad(err, cap, "'%s.parameters' must be an object", where);
    v = cJSON_GetObjectItemCaseSensitive(fn, "strict");
    if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) return bad(err, cap, "'%s.strict' must be true or false", where);
    for (size_t k = 0; k < t->n_names; k++)
        if (!strcmp(t->names[k], name->valuestring))
            return bad(err, cap, "'%s.name' '%s' is in 'tools' twice", where, name->valuestring);
    snprintf(t->names[t->n_names++], DJ__TOOL_NAME_MAX + 1, "%s", name->valuestring);
    return 0;
}

int dj__oai_tools_parse(const void *tools_json, const void *choice_json, const void *parallel_json, dj__oai_tools *t,
                        char *err, size_t cap) {
    const cJSON *tools = tools_json, *choice = choice_json, *par = parallel_json;
    memset(t, 0, sizeof *t);
    t->parallel = true;
    if (par && !cJSON_IsNull(par)) {
        if (!cJSON_IsBool(par)) return bad(err, cap, "'%s' must be true or false", "parallel_tool_calls");
        t->parallel = cJSON_IsTrue(par);
    }
    const int n = tools && !cJSON_IsNull(tools) ? cJSON_GetArraySize(tools) : 0;
    if (tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools)) return bad(err, cap, "'%s' must be an array", "tools");
    if (n > DJ__MAX_TOOLS) return bad(err, cap, "'tools' has %d functions: at most %d", n, DJ__MAX_TOOLS);
    if (n && !(t->names = dj_calloc((size_t)n, sizeof *t->names))) return oom(err, cap);
    int i = 0, rc;
    for (const cJSON *tool = n ? tools->child : NULL; tool; tool = tool->next, i++)
        if ((rc = check_tool(tool, i, t, err, cap))) return rc;
    /* the choice */
    t->choice = n ? DJ__TOOLS_AUTO : DJ__TOOLS_OFF;
    int named = -1;
    if (choice && !cJSON_IsNull(choice)) {
        if (cJSON_IsString(choice)) {
            if (!strcmp(choice->valuestring, "none")) t->choice = DJ__TOOLS_OFF;
            else if (!strcmp(choice->valuestring, "required")) t->choice = DJ__TOOLS_REQUIRED;
            else if (strcmp(choice->valuestring, "auto"))
                return bad(err, cap, "'tool_choice' '%.32s': \"none\", \"auto\", \"required\" or "
                                     "{\"type\": \"function\", \"function\": {\"name\": ...}}", choice->valuestring);
        } else if (cJSON_IsObject(choice)) {
            static const char *const keys[] = {"type", "function"}, *const fkeys[] = {"name"};
            if ((rc = only_keys(choice, keys, 2, "tool_choice", err, cap))) return rc;
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
                return bad(err, cap, "'tool_choice.type' must be \"function\": djinnd takes function tools only");
            if (!cJSON_IsObject(fn)) return bad(err, cap, "'tool_choice.function' must be an object");
            if ((rc = only_keys(fn, fkeys, 1, "tool_choice.function", err, cap))) return rc;
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsString(name)) return bad(err, cap, "'tool_choice.function.name' must be a string");
            for (size_t k = 0; k < t->n_names && named < 0; k++)
                if (!strcmp(t->names[k], name->valuestring)) named = (int)k;
            if (named < 0)
                return bad(err, cap, "'tool_choice.function.name' '%.64s' is not a function of 'tools'",
                           name->valuestring);
            t->choice = DJ__TOOLS_NAMED;
        } else {
            return bad(err, cap, "'tool_choice' must be a string or an object");
        }
        if (t->choice == DJ__TOOLS_REQUIRED && !n) return bad(err, cap, "'tool_choice' \"required\" needs 'tools'");
    }
    if (t->choice != DJ__TOOLS_REQUIRED && t->choice != DJ__TOOLS_NAMED) return 0;
    /* a forced call: the output is decoded under this schema */
    cJSON *one = NULL;
    rc = 0;
    if (t->choice == DJ__TOOLS_NAMED) {
        cJSON *fn = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(tools, named), "function");
        if (!(one = call_schema(fn))) return oom(err, cap);
        if ((rc = compiles(one, named, err, cap))) goto done;
    } else {
        cJSON *any = NULL;
        if (n > 1 && !(one = cJSON_CreateObject())) return oom(err, cap);
        if (n > 1 && !(any = cJSON_AddArrayToObject(one, "anyOf"))) {
            rc = oom(err, cap);
            goto done;
        }
        i = 0;
        for (const cJSON *tool = tools->child; tool; tool = tool->next, i++) {
            cJSON *s = call_schema(cJSON_GetObjectItemCaseSensitive(tool, "function"));
            if (!s) {
                rc = oom(err, cap);
                goto done;
            }
            if ((rc = compiles(s, i, err, cap))) {
                cJSON_Delete(s);
                goto done;
            }
            if (n == 1) one = s;
            else cJSON_AddItemToArray(any, s);
        }
        if (t->parallel) { /* one call or more, as OpenAI's answers hold them */
            cJSON *arr = cJSON_CreateObject();
            if (!arr) {
                rc = oom(err, cap);
                goto done;
            }
            cJSON_AddStringToObject(arr, "type", "array");
            cJSON_AddItemToObject(arr, "items", one);
            cJSON_AddNumberToObject(arr, "minItems", 1);
            cJSON_AddNumberToObject(arr, "maxItems", DJ__MAX_PARALLEL_CALLS);
            one = arr;
        }
    }
    if (!(t->schema = cJSON_PrintUnformatted(one))) rc = oom(err, cap);
done:
    cJSON_Delete(one);
    return rc;
}

void dj__oai_tools_free(dj__oai_tools *t) {
    free(t->names);
    free(t->schema);
    memset(t, 0, sizeof *t);
}

int dj__oai_tool_messages(void *messages, char *err, size_t cap) {
    cJSON *msgs = messages;
    int i = 0;
    for (cJSON *m = msgs ? msgs->child : NULL; m; m = m->next, i++) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        if (id && !cJSON_IsNull(id) && !cJSON_IsString(id))
            return bad(err, cap, "'messages[%d].tool_call_id' must be a string", i);
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (!calls || cJSON_IsNull(calls)) continue;
        if (!cJSON_IsArray(calls)) return bad(err, cap, "'messages[%d].tool_calls' must be an array", i);
        int j = 0;
        for (cJSON *c = calls->child; c; c = c->next, j++) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsObject(c) || !cJSON_IsObject(fn) || !cJSON_IsString(name))
                return bad(err, cap, "'messages[%d].tool_calls[%d]' must be {\"id\", \"type\": \"function\", "
                                     "\"function\": {\"name\", \"arguments\"}}", i, j);
            cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            if (cJSON_IsObject(args)) continue;
            /* OpenAI sends the arguments as JSON text; the templates read an object (as transformers and vLLM
             * hand them one) */
            cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
            if (!cJSON_IsObject(parsed)) {
                cJSON_Delete(parsed);
                return bad(err, cap, "'messages[%d].tool_calls[%d].function.arguments' must be a JSON object "
                                     "(as text or as an object)", i, j);
            }
            if (!cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed)) {
                cJSON_Delete(parsed);
                return oom(err, cap);
            }
        }
    }
    return 0;
}

/* ---- the answer ---- */

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    return p;
}

static bool declared(const dj__oai_tools *t, const char *name) {
    for (size_t k = 0; k < t->n_names; k++)
        if (!strcmp(t->names[k], name)) return true;
    return false;
}

/* The end of the JSON value at p (one cJSON has parsed: no checks). */
static const char *skip_value(const char *p, const char *end) {
    p = skip_ws(p, end);
    if (p < end && *p == '"') {
        for (p++; p < end && *p != '"'; p++)
            if (*p == '\\') p++;
        return p < end ? p + 1 : end;
    }
    if (p < end && (*p == '{' || *p == '[')) {
        int depth = 0;
        while (p < end) {
            if (*p == '"') {
                p = skip_value(p, end);
                continue;
            }
            if (*p == '{' || *p == '[') depth++;
            else if ((*p == '}' || *p == ']') && --depth == 0) return p + 1;
            p++;
        }
        return end;
    }
    while (p < end && !memchr(",}] \t\r\n", *p, 7)) p++;
    return p;
}

/* The text of member key of the object at p, as written (so numbers keep
 * their digits: cJSON would print them back as doubles). */
static bool raw_member(const char *p, const char *end, const char *key, const char **vs, const char **ve) {
    p = skip_ws(p, end);
    if (p >= end || *p != '{') return false;
    const size_t kl = strlen(key);
    for (p++;;) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"') return false;
        const char *ks = p;
        p = skip_ws(skip_value(p, end), end);
        const bool match = (size_t)(p - ks) >= kl + 2 && ks[kl + 1] == '"' && !memcmp(ks + 1, key, kl);
        if (p >= end || *p != ':') return false;
        const char *s = skip_ws(p + 1, end);
        p = skip_value(s, end);
        if (match) {
            *vs = s;
            *ve = p;
            return true;
        }
        p = skip_ws(p, end);
        if (p >= end || *p != ',') return false;
        p++;
    }
}

/* Whether JSON text p[0, end) (one cJSON has parsed) is strict JSON too:
 * cJSON reads every byte below 0x20 as white space and takes raw control
 * characters in strings, which the clients' parsers refuse. */
static bool strict_json(const char *p, const char *end) {
    bool in_str = false;
    for (; p < end; p++) {
        const unsigned char c = (unsigned char)*p;
        if (in_str) {
            if (c < 0x20) return false;
            if (c == '\\') p++;
            else if (c == '"') in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            return false;
        }
    }
    return !in_str;
}

/* One call {name, arguments | parameters} (c, written as raw[0, end))
 * appended to calls as OpenAI's tool_call; false when it is not one (or
 * names no declared function). */
static bool add_call(const dj__oai_tools *t, const cJSON *c, const char *raw, const char *end, const char *id_base,
                     cJSON *calls) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
    const char *key = "arguments";
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(c, key);
    if (!args) args = cJSON_GetObjectItemCaseSensitive(c, key = "parameters"); /* Llama 3.1's word */
    if (!cJSON_IsObject(c) || !cJSON_IsString(name) || !declared(t, name->valuestring) || !cJSON_IsObject(args))
        return false;
    const char *vs, *ve;
    if (raw_member(raw, end, key, &vs, &ve) && !strict_json(vs, ve)) return false; /* no arguments a client can read */
    char *text = raw_member(raw, end, key, &vs, &ve) ? dj_strndup(vs, (size_t)(ve - vs)) : cJSON_PrintUnformatted(args);
    cJSON *call = cJSON_CreateObject(), *fn = NULL;
    char id[96];
    snprintf(id, sizeof id, "call_%.48s_%d", id_base, cJSON_GetArraySize(calls));
    if (!text || !call || !cJSON_AddStringToObject(call, "id", id) ||
        !cJSON_AddStringToObject(call, "type", "function") || !(fn = cJSON_AddObjectToObject(call, "function")) ||
        !cJSON_AddStringToObject(fn, "name", name->valuestring) || !cJSON_AddStringToObject(fn, "arguments", text)) {
        free(text);
        cJSON_Delete(call);
        return false;
    }
    free(text);
    cJSON_AddItemToArray(calls, call);
    return true;
}

/* JSON text[n] (an object: one call, an array: several) into calls; none
 * added when any is not a call. */
static bool add_json(const dj__oai_tools *t, const char *text, size_t n, const char *id_base, cJSON *calls) {
    const char *end = NULL, *stop = text + n;
    const int had = cJSON_GetArraySize(calls);
    cJSON *v = cJSON_ParseWithLengthOpts(text, n, &end, false);
    bool ok = v && skip_ws(end, stop) == stop && (cJSON_IsObject(v) || cJSON_GetArraySize(v) > 0);
    if (ok && cJSON_IsArray(v)) {
        const char *p = skip_ws(text, stop) + 1; /* past '[' */
        for (const cJSON *c = v->child; ok && c; c = c->next) {
            const char *s = skip_ws(p, stop), *e = skip_value(s, stop);
            ok = add_call(t, c, s, e, id_base, calls);
            p = skip_ws(e, stop);
            if (p < stop && *p == ',') p++;
        }
    } else if (ok) {
        ok = add_call(t, v, text, stop, id_base, calls);
    }
    cJSON_Delete(v);
    while (!ok && cJSON_GetArraySize(calls) > had) cJSON_DeleteItemFromArray(calls, cJSON_GetArraySize(calls) - 1);
    return ok;
}

void *dj__oai_tool_calls(const dj__oai_tools *t, const char *text, size_t n, const char *id_base, size_t *content) {
    *content = n;
    if (t->choice == DJ__TOOLS_OFF || !text) return NULL;
    cJSON *calls = cJSON_CreateArray();
    if (!calls) return NULL;
    const char *end = text + n, *start = skip_ws(text, end);
    bool ok = false;
    size_t before = 0;
    if (t->choice != DJ__TOOLS_AUTO) { /* the text is the forced schema's value */
        ok = add_json(t, start, (size_t)(end - start), id_base, calls);
    } else if (start < end && (*start == '{' || *start == '[') &&
               add_json(t, start, (size_t)(end - start), id_base, calls)) { /* a call as the whole answer */
        ok = true;
    } else {
        const char *hit = NULL;
        size_t m = 0;
        for (size_t k = 0; k < N_MARKERS; k++) {
            const char *h = memmem(text, n, markers[k], strlen(markers[k]));
            if (h && (!hit || h < hit)) hit = h, m = k;
        }
        before = hit ? (size_t)(hit - text) : 0;
        if (hit && m == 0) { /* <tool_call>{json}</tool_call>, one or more */
            const char *p = hit;
            ok = true;
            while (ok && p < end) {
                p = skip_ws(p, end);
                if (p == end) break;
                if ((size_t)(end - p) < 11 || memcmp(p, "<tool_call>", 11)) {
                    ok = false;
                    break;
                }
                p += 11;
                const char *close = memmem(p, (size_t)(end - p), "</tool_call>", 12);
                const char *stop = close ? close : end;
                ok = add_json(t, skip_ws(p, stop), (size_t)(stop - skip_ws(p, stop)), id_base, calls);
                p = close ? close + 12 : end;
            }
        } else if (hit) { /* [TOOL_CALLS][...] or <|python_tag|>{...}: the rest is the JSON */
            const char *p = skip_ws(hit + strlen(markers[m]), end);
            ok = add_json(t, p, (size_t)(end - p), id_base, calls);
        }
    }
    if (!ok || cJSON_GetArraySize(calls) == 0 || (!t->parallel && cJSON_GetArraySize(calls) > 1)) {
        cJSON_Delete(calls);
        return NULL;
    }
    while (before && (text[before - 1] == ' ' || text[before - 1] == '\n' || text[before - 1] == '\r' ||
                      text[before - 1] == '\t'))
        before--;
    *content = before;
    return calls;
}

size_t dj__oai_tools_safe(const dj__oai_tools *t, const char *text, size_t n) {
    if (t->choice == DJ__TOOLS_OFF) return n;
    if (t->choice != DJ__TOOLS_AUTO || !text) return 0;
    const char *s = skip_ws(text, text + n);
    if (s == text + n || *s == '{' || *s == '[') return 0; /* maybe a call as the whole answer */
    for (size_t p = 0; p < n; p++) {
        if (text[p] != '<' && text[p] != '[') continue;
        for (size_t k = 0; k < N_MARKERS; k++) {
            const size_t len = strlen(markers[k]), cmp = len < n - p ? len : n - p;
            if (!memcmp(text + p, markers[k], cmp)) return p;
        }
    }
    return n;
}
