/* http_openai.c: the OpenAI API's JSON - requests of /v1/completions and
 * /v1/chat/completions checked field by field, the prompt through the model's
 * chat template and tokenizer, stop strings, answers and streamed chunks. */
#define _GNU_SOURCE
#include <ctype.h>
#include <math.h>
#include "djinn/alloc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "djinn/grammar.h"
#include "djinn/sample_schema.h"
#include "model/jinja_impl.h"
#include "model/tok_impl.h"
#include "server/http_impl.h"

#define MAX_STOP_BYTES 256

void dj__buf_put(dj__buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = dj_realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void dj__buf_free(dj__buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

size_t dj__oai_json_values(const char *body, size_t n, char *model, size_t cap, bool *nul) {
    /* every value starts the document or follows '[', ',' or ':' (a member
     * is one node, after '{' or ','): one per '[' '{' ',' ':' outside
     * strings, plus one, bounds them */
    size_t values = 1;
    long depth = 0;
    bool key = false, model_key = false; /* the next top-level string is a key; the last key was "model" */
    if (cap) model[0] = '\0';
    *nul = false;
    for (size_t i = 0; i < n; i++) {
        const char ch = body[i];
        if (ch == '"') {
            const size_t start = ++i;
            bool plain = true;
            while (i < n && body[i] != '"') {
                if (body[i] == '\\') {
                    plain = false;
                    if (i + 5 < n && body[i + 1] == 'u' && !memcmp(body + i + 2, "0000", 4)) *nul = true;
                    i++;
                }
                i++;
            }
            const size_t len = i < n ? i - start : 0;
            if (depth == 1 && key) {
                model_key = len == 5 && !memcmp(body + start, "model", 5);
                key = false;
            } else if (depth == 1 && model_key) {
                if (plain && len < cap) {
                    memcpy(model, body + start, len);
                    model[len] = '\0';
                }
                model_key = false;
            }
            continue;
        }
        if (ch == '{' || ch == '[') {
            values++;
            if (++depth == 1) key = ch == '{';
        } else if (ch == '}' || ch == ']') {
            depth--;
        } else if (ch == ',' || ch == ':') {
            values++;
            if (ch == ',' && depth == 1) key = true, model_key = false;
        }
    }
    return values;
}

size_t dj__oai_max_token_bytes(const dj_tokenizer_t *tok) {
    size_t m = 0;
    for (uint32_t id = 0; tok && id < tok->n_ids; id++)
        if (tok->id_off[id] != DJ__TOK_NO_STR && tok->id_len[id] > m) m = tok->id_len[id];
    return m;
}

static int bad(char *err, size_t cap, const char *fmt, const char *field) {
    snprintf(err, cap, fmt, field);
    return 400;
}

/* A number field in [lo, hi] into *out; absent or null leaves *out. */
static int number(const cJSON *req, const char *key, double lo, double hi, double *out, bool *given, char *err,
                  size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, key);
    if (given) *given = false;
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return bad(err, cap, "'%s' must be a number", key);
    if (v->valuedouble < lo || v->valuedouble > hi) {
        snprintf(err, cap, "'%s' is %g: it must be in [%g, %g]", key, v->valuedouble, lo, hi);
        return 400;
    }
    *out = v->valuedouble;
    if (given) *given = true;
    return 0;
}

/* logit_bias: an object of token id (a decimal string, as OpenAI's JSON
 * has it) to a number in [-100, 100], at most DJ_MAX_LOGIT_BIAS of them. */
static int parse_logit_bias(dj__oai *o, const cJSON *v, char *err, size_t cap) {
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsObject(v)) return bad(err, cap, "'%s' must be an object of token id to bias", "logit_bias");
    const int n = cJSON_GetArraySize(v);
    if (n == 0) return 0;
    if (n > DJ_MAX_LOGIT_BIAS) {
        snprintf(err, cap, "'logit_bias' has %d entries: at most %d", n, DJ_MAX_LOGIT_BIAS);
        return 400;
    }
    if (!(o->logit_bias = dj_malloc((size_t)n * sizeof *o->logit_bias))) {
        snprintf(err, cap, "out of memory");
        return 503;
    }
    for (const cJSON *e = v->child; e; e = e->next) {
        const char *k = e->string;
        size_t d = 0;
        while (k[d] >= '0' && k[d] <= '9' && d < 11) d++;
        const long long id = d && d <= 10 && !k[d] ? strtoll(k, NULL, 10) : -1;
        if (id < 0 || id > INT32_MAX) {
            snprintf(err, cap, "'logit_bias' key '%.32s' is not a token id (a non-negative integer below 2^31)", k);
            return 400;
        }
        const double b = cJSON_IsNumber(e) ? e->valuedouble : NAN;
        if (!(b >= -DJ_LOGIT_BIAS_MAX_ABS && b <= DJ_LOGIT_BIAS_MAX_ABS)) { /* NaN too */
            snprintf(err, cap, "'logit_bias.%.32s' must be a number in [-100, 100]", k);
            return 400;
        }
        o->logit_bias[o->n_logit_bias++] = (dj_logit_bias){.id = (int32_t)id, .bias = (float)e->valuedouble};
    }
    if (dj_logit_bias_check(o->logit_bias, o->n_logit_bias, 0) != DJ_OK) { /* "1" and "01" name one id twice */
        snprintf(err, cap, "'logit_bias': %s", dj_last_error());
        return 400;
    }
    return 0;
}

static int parse_stop(dj__oai *o, const cJSON *v, char *err, size_t cap) {
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *one = cJSON_IsString(v) ? v : NULL;
    if (!one && !cJSON_IsArray(v)) return bad(err, cap, "'%s' must be a string or an array of strings", "stop");
    if (!one && cJSON_GetArraySize(v) > DJ__OAI_MAX_STOP) {
        snprintf(err, cap, "'stop' has %d strings: at most %d", cJSON_GetArraySize(v), DJ__OAI_MAX_STOP);
        return 400;
    }
    for (const cJSON *s = one ? one : v->child; s; s = one ? NULL : s->next) {
        if (!cJSON_IsString(s)) return bad(err, cap, "'%s' must be a string or an array of strings", "stop");
        const size_t n = strlen(s->valuestring);
        if (n == 0) continue;
        if (n > MAX_STOP_BYTES) {
            snprintf(err, cap, "a 'stop' string has %zu bytes: at most %d", n, MAX_STOP_BYTES);
            return 400;
        }
        if (!(o->stop[o->n_stop] = dj_strdup(s->valuestring))) return 500;
        o->stop_len[o->n_stop++] = n;
        if (n > o->max_stop_len) o->max_stop_len = n;
    }
    return 0;
}

static int parse_qos(dj__oai *o, const char *name, char *err, size_t cap) {
    for (int q = 0; q < DJ_QOS_COUNT; q++)
        if (!strcmp(name, dj_qos_name((dj_qos)q))) {
            o->qos = (dj_qos)q;
            return 0;
        }
    snprintf(err, cap, "QoS class '%.32s' is not realtime, interactive or batch", name);
    return 400;
}

/* An integer field in [0, DJ_MAX_TOP_LOGPROBS] (absent or null: *given false). */
static int top_count(const cJSON *req, const char *key, uint32_t *out, bool *given, char *err, size_t cap) {
    double x = 0;
    int rc = number(req, key, 0, DJ_MAX_TOP_LOGPROBS, &x, given, err, cap);
    if (rc) return rc;
    if (*given && x != floor(x)) return bad(err, cap, "'%s' must be an integer", key);
    *out = (uint32_t)x;
    return 0;
}

/* Chat: logprobs true/false and top_logprobs 0..20 (which needs logprobs
 * true). Completions: logprobs N in 0..20 (OpenAI caps it at 5). */
static int parse_logprobs(dj__oai *o, const cJSON *req, char *err, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, "logprobs");
    bool given = false;
    int rc;
    if (!o->chat) {
        if (cJSON_GetObjectItemCaseSensitive(req, "top_logprobs"))
            return bad(err, cap, "%s", "'top_logprobs' is a chat field: completions take 'logprobs': N (0 to 20)");
        if (v && !cJSON_IsNull(v) && !cJSON_IsNumber(v))
            return bad(err, cap, "%s", "'logprobs' of a completion must be an integer from 0 to 20, or null");
        if ((rc = top_count(req, "logprobs", &o->top_logprobs, &given, err, cap))) return rc;
        o->logprobs = given;
        return 0;
    }
    if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) return bad(err, cap, "'%s' must be true or false", "logprobs");
    o->logprobs = cJSON_IsTrue(v);
    if ((rc = top_count(req, "top_logprobs", &o->top_logprobs, &given, err, cap))) return rc;
    if (given && !o->logprobs) return bad(err, cap, "%s", "'top_logprobs' needs 'logprobs': true");
    return 0;
}

/* Every message: an object with a string role, content a string, null or a
 * list of parts (what the templates read). */
static int check_messages(const cJSON *msgs, char *err, size_t cap) {
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return bad(err, cap, "'%s' must be a non-empty array", "messages");
    int i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) {
            snprintf(err, cap, "messages[%d] must be an object with a string 'role'", i);
            return 400;
        }
        /* a role is a name (user, assistant, tool...): templates write it beside their own special
         * tokens ('<|' + role + '|>'), so its characters could complete one */
        size_t rl = 0;
        while (role->valuestring[rl] && rl <= 32 && (isalnum((unsigned char)role->valuestring[rl]) ||
                                                     role->valuestring[rl] == '_' || role->valuestring[rl] == '-'))
            rl++;
        if (rl == 0 || rl > 32 || role->valuestring[rl]) {
            snprintf(err, cap, "messages[%d].role must be 1 to 32 letters, digits, '_' or '-'", i);
            return 400;
        }
        if (content && !cJSON_IsString(content) && !cJSON_IsNull(content) && !cJSON_IsArray(content)) {
            snprintf(err, cap, "messages[%d].content must be a string, an array of parts or null", i);
            return 400;
        }
        /* what the templates may read of a message; the rest is refused */
        static const char *const keys[] = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"};
        for (const cJSON *f = m->child; f; f = f->next) {
            size_t k = 0;
            while (k < sizeof keys / sizeof *keys && strcmp(keys[k], f->string)) k++;
            if (k == sizeof keys / sizeof *keys && !cJSON_IsNull(f)) {
                snprintf(err, cap, "unknown field 'messages[%d].%.64s': djinnd refuses what it would not honour", i,
                         f->string);
                return 400;
            }
        }
    }
    return 0;
}

/* Content given as a list of parts becomes one string: the text parts
 * joined by "\n" (as vLLM does); a part of another type (an image, audio, a
 * file) is refused naming it. */
static int join_parts(cJSON *msgs, char *err, size_t cap) {
    int i = 0;
    for (cJSON *m = msgs->child; m; m = m->next, i++) {
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsArray(content)) continue;
        dj__buf b = {0};
        int k = 0;
        for (const cJSON *part = content->child; part; part = part->next, k++) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsObject(part) || !cJSON_IsString(type)) {
                snprintf(err, cap, "messages[%d].content[%d] must be an object with a string 'type'", i, k);
                dj__buf_free(&b);
                return 400;
            }
            if (strcmp(type->valuestring, "text")) {
                snprintf(err, cap, "messages[%d].content[%d] is of type '%.32s': djinnd takes text parts only", i, k,
                         type->valuestring);
                dj__buf_free(&b);
                return 400;
            }
            if (!cJSON_IsString(text)) {
                snprintf(err, cap, "messages[%d].content[%d].text must be a string", i, k);
                dj__buf_free(&b);
                return 400;
            }
            if (k) dj__buf_put(&b, "\n", 1);
            dj__buf_put(&b, text->valuestring, strlen(text->valuestring));
        }
        cJSON *joined = b.oom ? NULL : cJSON_CreateString(b.p ? b.p : "");
        dj__buf_free(&b);
        if (!joined || !cJSON_ReplaceItemInObjectCaseSensitive(m, "content", joined)) {
            cJSON_Delete(joined);
            snprintf(err, cap, "out of memory");
            return 503;
        }
    }
    return 0;
}

/* Every request field djinnd knows, by endpoint (C chat, P completions):
 * each is honoured below, or refused with a 400 naming it unless it asks for
 * nothing (null, false, an empty list, the default). A field not listed is
 * refused as unknown, as OpenAI's own API does. */
#define F_CHAT 1
#define F_COMPL 2
static const struct {
    const char *name;
    unsigned where;
} known_fields[] = {
    {"model", F_CHAT | F_COMPL}, {"messages", F_CHAT}, {"prompt", F_COMPL},
    {"stream", F_CHAT | F_COMPL}, {"stream_options", F_CHAT | F_COMPL},
    {"max_tokens", F_CHAT | F_COMPL}, {"max_completion_tokens", F_CHAT},
    {"temperature", F_CHAT | F_COMPL}, {"top_p", F_CHAT | F_COMPL}, {"seed", F_CHAT | F_COMPL},
    {"frequency_penalty", F_CHAT | F_COMPL}, {"presence_penalty", F_CHAT | F_COMPL},
    {"top_k", F_CHAT | F_COMPL}, {"min_p", F_CHAT | F_COMPL}, {"repetition_penalty", F_CHAT | F_COMPL}, /* vLLM's */
    {"stop", F_CHAT | F_COMPL}, {"n", F_CHAT | F_COMPL}, {"best_of", F_COMPL},
    {"logprobs", F_CHAT | F_COMPL}, {"top_logprobs", F_CHAT | F_COMPL}, /* completions: refused, naming chat's */
    {"echo", F_COMPL}, {"suffix", F_COMPL}, {"logit_bias", F_CHAT | F_COMPL},
    {"user", F_CHAT | F_COMPL}, {"safety_identifier", F_CHAT}, {"prompt_cache_key", F_CHAT},
    {"response_format", F_CHAT}, {"tools", F_CHAT}, {"tool_choice", F_CHAT}, {"parallel_tool_calls", F_CHAT},
    {"functions", F_CHAT}, {"function_call", F_CHAT}, {"audio", F_CHAT}, {"modalities", F_CHAT},
    {"store", F_CHAT}, {"metadata", F_CHAT}, {"prediction", F_CHAT}, {"reasoning_effort", F_CHAT},
    {"verbosity", F_CHAT}, {"service_tier", F_CHAT}, {"web_search_options", F_CHAT},
    {"qos", F_CHAT | F_COMPL}, {"cache_salt", F_CHAT | F_COMPL}, /* djinnd's, vLLM's */
};

static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* A field that asks for nothing: null, false, "", [], {}. */
static bool empty(const cJSON *v) {
    return absent(v) || cJSON_IsFalse(v) || (cJSON_IsString(v) && !v->valuestring[0]) ||
           ((cJSON_IsArray(v) || cJSON_IsObject(v)) && !v->child);
}

/* Unknown fields, and known ones djinnd does not do, with a request that
 * asks for them: a 400 naming the field. */
static int check_fields(const cJSON *req, bool chat, char *err, size_t cap) {
    const unsigned where = chat ? F_CHAT : F_COMPL;
    for (const cJSON *f = req->child; f; f = f->next) {
        size_t k = 0;
        const size_t nk = sizeof known_fields / sizeof *known_fields;
        while (k < nk && strcmp(known_fields[k].name, f->string)) k++;
        if (k == nk || !(known_fields[k].where & where)) {
            snprintf(err, cap, "unknown field '%.64s' for %s: djinnd refuses what it would not honour", f->string,
                     chat ? "/v1/chat/completions" : "/v1/completions");
            return 400;
        }
    }
    static const struct {
        const char *name, *why;
    } refused[] = {
        {"functions", "(deprecated by OpenAI) is not supported by djinnd: send 'tools'"},
        {"audio", "is not supported by djinnd: it answers text only"},
        {"prediction", "is not supported by djinnd"},
        {"reasoning_effort", "is not supported by djinnd"},
        {"verbosity", "is not supported by djinnd"},
        {"web_search_options", "is not supported by djinnd: it searches nothing"},
        {"metadata", "tags stored completions: djinnd stores none"},
        {"store", "is not supported by djinnd: it stores no completions"},
        {"suffix", "is not supported by djinnd"},
        {"echo", "is not supported yet by djinnd"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, refused[k].name);
        if (!empty(v)) {
            snprintf(err, cap, "'%s' %s", refused[k].name, refused[k].why);
            return 400;
        }
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, "function_call");
    if (!absent(v) && !(cJSON_IsString(v) && (!strcmp(v->valuestring, "none") || !strcmp(v->valuestring, "auto"))))
        return bad(err, cap, "'%s' (deprecated by OpenAI) other than \"none\" or \"auto\" is not supported by "
                   "djinnd: send 'tools' and 'tool_choice'", "function_call");
    v = cJSON_GetObjectItemCaseSensitive(req, "modalities");
    if (!absent(v) && !(cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(v->child) &&
                        !strcmp(v->child->valuestring, "text")))
        return bad(err, cap, "'%s' other than [\"text\"] is not supported by djinnd: it answers text only",
                   "modalities");
    v = cJSON_GetObjectItemCaseSensitive(req, "service_tier");
    if (!absent(v) && !(cJSON_IsString(v) && (!strcmp(v->valuestring, "auto") || !strcmp(v->valuestring, "default"))))
        return bad(err, cap, "'%s' other than \"auto\" or \"default\" is not supported by djinnd: use 'qos'",
                   "service_tier");
    static const char *const strings[] = {"user", "safety_identifier", "prompt_cache_key"};
    for (size_t k = 0; k < sizeof strings / sizeof *strings; k++) {
        v = cJSON_GetObjectItemCaseSensitive(req, strings[k]);
        if (!absent(v) && !cJSON_IsString(v)) return bad(err, cap, "'%s' must be a string", strings[k]);
    }
    return 0;
}

/* response_format: text (nothing to do), json_object (any JSON object) or
 * json_schema {name, schema, strict, description}: the schema, checked
 * here (a 400 naming what the subset lacks), as text for the daemon. */
static int parse_response_format(dj__oai *o, const cJSON *v, char *err, size_t cap) {
    if (absent(v)) return 0;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (!cJSON_IsObject(v) || !cJSON_IsString(t))
        return bad(err, cap, "'%s' must be an object with a string 'type'", "response_format");
    for (const cJSON *f = v->child; f; f = f->next)
        if (strcmp(f->string, "type") && strcmp(f->string, "json_schema")) {
            snprintf(err, cap, "unknown field 'response_format.%.64s'", f->string);
            return 400;
        }
    if (!strcmp(t->valuestring, "text")) return 0;
    if (!strcmp(t->valuestring, "json_object")) return (o->json_schema = dj_strdup("{\"type\":\"object\"}")) ? 0 : 503;
    if (strcmp(t->valuestring, "json_schema")) {
        snprintf(err, cap, "'response_format' of type '%.32s' is not supported: text, json_object or json_schema",
                 t->valuestring);
        return 400;
    }
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(v, "json_schema");
    if (!cJSON_IsObject(js)) return bad(err, cap, "'%s' must be an object", "response_format.json_schema");
    for (const cJSON *f = js->child; f; f = f->next)
        if (strcmp(f->string, "name") && strcmp(f->string, "schema") && strcmp(f->string, "strict") &&
            strcmp(f->string, "description")) {
            snprintf(err, cap, "unknown field 'response_format.json_schema.%.64s'", f->string);
            return 400;
        }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name"), *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (!cJSON_IsString(name) || !name->valuestring[0])
        return bad(err, cap, "'%s' must be a non-empty string", "response_format.json_schema.name");
    if (!absent(strict) && !cJSON_IsBool(strict))
        return bad(err, cap, "'%s' must be true or false", "response_format.json_schema.strict");
    if (!cJSON_IsObject(schema)) return bad(err, cap, "'%s' must be an object", "response_format.json_schema.schema");
    if (!(o->json_schema = cJSON_PrintUnformatted(schema))) return 503;
    dj_grammar_t *g = NULL;
    const dj_status st = dj_grammar_from_json_schema(o->json_schema, strlen(o->json_schema), &g);
    dj_grammar_free(g);
    if (st == DJ_ENOMEM) return 503;
    if (st != DJ_OK) {
        snprintf(err, cap, "'response_format.json_schema.schema': %s", dj_last_error());
        return 400;
    }
    return 0;
}

int dj__oai_parse(dj__oai *o, const char *body, size_t n, bool chat, const char *qos_header, char *err, size_t cap) {
    memset(o, 0, sizeof *o);
    o->chat = chat;
    o->qos = DJ_QOS_INTERACTIVE;
    o->created = (int64_t)time(NULL);
    uint8_t rnd[12];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) memset(rnd, 0, sizeof rnd);
    int k = snprintf(o->id, sizeof o->id, "%s", chat ? "chatcmpl-" : "cmpl-");
    for (size_t i = 0; i < sizeof rnd; i++) k += snprintf(o->id + k, sizeof o->id - (size_t)k, "%02x", rnd[i]);
    /* cJSON would cut a string at \u0000 without a word: a prompt, message or model name so cut is refused */
    if (dj__json_has_nul_escape(body, n)) return bad(err, cap, "%s", "a string of the body holds \\u0000 (NUL)");
    cJSON *req = cJSON_ParseWithLength(body, n);
    if (!req) return bad(err, cap, "%s", "the body is not valid JSON");
    int rc = 0;
    if (!cJSON_IsObject(req)) {
        rc = bad(err, cap, "%s", "the body must be a JSON object");
        goto done;
    }
    if ((rc = check_fields(req, chat, err, cap))) goto done;
    if ((rc = parse_response_format(o, cJSON_GetObjectItemCaseSensitive(req, "response_format"), err, cap))) goto done;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) >= sizeof o->model) {
        rc = bad(err, cap, "'%s' must be a model name (a folder of the server's model store)", "model");
        goto done;
    }
    snprintf(o->model, sizeof o->model, "%s", v->valuestring);
    v = cJSON_GetObjectItemCaseSensitive(req, "stream");
    if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) {
        rc = bad(err, cap, "'%s' must be true or false", "stream");
        goto done;
    }
    o->stream = cJSON_IsTrue(v);
    v = cJSON_GetObjectItemCaseSensitive(req, "stream_options");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsObject(v)) {
            rc = bad(err, cap, "'%s' must be an object", "stream_options");
            goto done;
        }
        for (const cJSON *f = v->child; f; f = f->next)
            if (strcmp(f->string, "include_usage")) {
                snprintf(err, cap, "unknown field 'stream_options.%.64s': djinnd honours 'include_usage' only",
                         f->string);
                rc = 400;
                goto done;
            }
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(v, "include_usage");
        if (!absent(iu) && !cJSON_IsBool(iu)) {
            rc = bad(err, cap, "'%s' must be true or false", "stream_options.include_usage");
            goto done;
        }
        o->include_usage = cJSON_IsTrue(iu);
    }
    /* max_completion_tokens (chat's newer name) wins over max_tokens */
    double x = 0;
    bool given = false;
    static const char *const max_keys[] = {"max_tokens", "max_completion_tokens"};
    for (int k = 0; k < 2; k++) {
        if ((rc = number(req, max_keys[k], 0, UINT32_MAX, &x, &given, err, cap))) goto done;
        if (given && x != floor(x)) {
            rc = bad(err, cap, "'%s' must be an integer", max_keys[k]);
            goto done;
        }
        if (given) o->max_given = true, o->max_tokens = (uint32_t)x;
    }
    x = 1.0;
    if ((rc = number(req, "temperature", 0, 2, &x, NULL, err, cap))) goto done;
    o->sampling.temperature = (float)x;
    x = 1.0;
    if ((rc = number(req, "top_p", 0, 1, &x, NULL, err, cap))) goto done;
    if (x <= 0) {
        rc = bad(err, cap, "'%s' must be greater than 0", "top_p");
        goto done;
    }
    o->sampling.top_p = (float)x;
    x = 0;
    if ((rc = number(req, "presence_penalty", -2, 2, &x, NULL, err, cap))) goto done;
    o->sampling.presence_penalty = (float)x;
    x = 0;
    if ((rc = number(req, "frequency_penalty", -2, 2, &x, NULL, err, cap))) goto done;
    o->sampling.frequency_penalty = (float)x;
    /* vLLM's: top_k -1 or 0 is off */
    x = 0;
    if ((rc = number(req, "top_k", -1, UINT32_MAX, &x, &given, err, cap))) goto done;
    if (given && x != floor(x)) {
        rc = bad(err, cap, "'%s' must be an integer", "top_k");
        goto done;
    }
    o->sampling.top_k = x > 0 ? (uint32_t)x : 0;
    x = 0;
    if ((rc = number(req, "min_p", 0, 1, &x, NULL, err, cap))) goto done;
    o->sampling.min_p = (float)x;
    x = 1;
    if ((rc = number(req, "repetition_penalty", 0, 100, &x, &given, err, cap))) goto done;
    if (given && x <= 0) {
        rc = bad(err, cap, "'%s' must be greater than 0 (1 is off)", "repetition_penalty");
        goto done;
    }
    o->sampling.repetition_penalty = (float)x;
    /* no seed: a fresh one, below 2^53 so that it reads back exactly from
     * the answer's "seed" (JSON numbers are doubles) */
    x = 0;
    if ((rc = number(req, "seed", -9.2e18, 9.2e18, &x, &given, err, cap))) goto done;
    if (given && x != floor(x)) {
        rc = bad(err, cap, "'%s' must be an integer", "seed");
        goto done;
    }
    o->seed_given = given;
    if (given) {
        o->sampling.seed = (uint64_t)(int64_t)x;
    } else {
        uint64_t r = 0;
        if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) {
            snprintf(err, cap, "no random seed to be had (getrandom failed): send a 'seed'");
            rc = 503;
            goto done;
        }
        o->sampling.seed = r & ((1ull << 53) - 1);
    }
    static const char *const counts[] = {"n", "best_of"};
    for (int k = 0; k < 2; k++) {
        x = 1;
        if ((rc = number(req, counts[k], 1, 128, &x, &given, err, cap))) goto done;
        if (x != 1) {
            snprintf(err, cap, "'%s' above 1 is not supported yet by djinnd: send the request again for another choice",
                     counts[k]);
            rc = 400;
            goto done;
        }
    }
    if ((rc = parse_logprobs(o, req, err, cap))) goto done;
    if ((rc = parse_stop(o, cJSON_GetObjectItemCaseSensitive(req, "stop"), err, cap))) goto done;
    if ((rc = parse_logit_bias(o, cJSON_GetObjectItemCaseSensitive(req, "logit_bias"), err, cap))) goto done;
    v = cJSON_GetObjectItemCaseSensitive(req, "qos");
    o->qos_given = (v && !cJSON_IsNull(v)) || qos_header;
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) {
            rc = bad(err, cap, "'%s' must be a string", "qos");
            goto done;
        }
        if ((rc = parse_qos(o, v->valuestring, err, cap))) goto done;
    } else if (qos_header && (rc = parse_qos(o, qos_header, err, cap))) {
        goto done;
    }
    v = cJSON_GetObjectItemCaseSensitive(req, "cache_salt"); /* vLLM's name */
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) > DJ__SALT_BYTES_MAX) {
            rc = bad(err, cap, "'%s' must be a string of 1 to 256 bytes", "cache_salt"); /* DJ__SALT_BYTES_MAX */
            goto done;
        }
        if (!(o->cache_salt = dj_strdup(v->valuestring))) {
            rc = 500;
            goto done;
        }
    }
    if (chat) {
        cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
        if ((rc = check_messages(msgs, err, cap))) goto done;
        if ((rc = join_parts(msgs, err, cap))) goto done;
        if ((rc = dj__oai_tool_messages(msgs, err, cap))) goto done;
        o->messages = cJSON_DetachItemViaPointer(req, msgs);
        cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
        if ((rc = dj__oai_tools_parse(tools, cJSON_GetObjectItemCaseSensitive(req, "tool_choice"),
                                      cJSON_GetObjectItemCaseSensitive(req, "parallel_tool_calls"), &o->calls, err,
                                      cap)))
            goto done;
        if (o->calls.schema) { /* a forced call: decoded under its schema, as structured output is */
            if (o->json_schema) {
                rc = bad(err, cap, "%s", "'tool_choice' \"required\" or a named function cannot be combined with a "
                                        "JSON 'response_format': the answer is the call");
                goto done;
            }
            if (!(o->json_schema = dj_strdup(o->calls.schema))) {
                snprintf(err, cap, "out of memory");
                rc = 503;
                goto done;
            }
        }
        if (cJSON_GetArraySize(tools) > 0) o->tools = cJSON_DetachItemViaPointer(req, tools);
    } else {
        v = cJSON_GetObjectItemCaseSensitive(req, "prompt");
        /* a string, [string] or [int, ...] (token ids) */
        if (cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(v->child)) v = v->child;
        if (cJSON_IsString(v)) {
            if (!(o->prompt = dj_strdup(v->valuestring))) rc = 500;
        } else if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) {
            const int n_ids = cJSON_GetArraySize(v);
            if (!(o->ids = dj_malloc((size_t)n_ids * sizeof *o->ids))) {
                rc = 500;
                goto done;
            }
            for (const cJSON *e = v->child; e; e = e->next) {
                if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > INT32_MAX ||
                    e->valuedouble != floor(e->valuedouble)) {
                    rc = bad(err, cap, "%s", "'prompt' must be a string, one string, or an array of token ids");
                    goto done;
                }
                o->ids[o->n_ids++] = (int32_t)e->valuedouble;
            }
        } else {
            rc = bad(err, cap, "%s", "'prompt' must be a string, one string, or an array of token ids");
        }
    }
done:
    cJSON_Delete(req);
    return rc;
}

int dj__oai_prompt(dj__oai *o, const dj__http_model *m, char *err, size_t cap) {
    if (o->ids) return 0; /* given as ids */
    if (!m->tok) {
        snprintf(err, cap, "model '%s' has no tokenizer.json: send the prompt as token ids", m->name);
        return 400;
    }
    char *text = o->prompt;
    size_t len = text ? strlen(text) : 0;
    if (o->chat) {
        if (!m->tpl) {
            snprintf(err, cap, "model '%s' has no usable chat template: %s", m->name, m->tpl_why);
            return 400;
        }
        cJSON *vars = cJSON_CreateObject();
        if (!vars) return 500;
        cJSON_AddItemReferenceToObject(vars, "messages", o->messages);
        if (o->tools) cJSON_AddItemReferenceToObject(vars, "tools", o->tools);
        cJSON_AddBoolToObject(vars, "add_generation_prompt", true);
        char *vj = cJSON_PrintUnformatted(vars);
        cJSON_Delete(vars);
        if (!vj) return 500;
        /* message content is text: special tokens written in it are not control tokens */
        dj_status st = dj_chat_template_encode(m->tpl, m->tok, vj, strlen(vj), false, &o->ids, &o->n_ids);
        free(vj);
        if (st == DJ_ENOMEM) {
            snprintf(err, cap, "out of memory rendering the chat template of '%s'", m->name);
            return 503;
        }
        if (st != DJ_OK) {
            snprintf(err, cap, "the chat template of '%s' refused these messages: %s", m->name, dj_last_error());
            return 400;
        }
    } else {
        /* no tokenizer run (nor the memory it takes) for a text the model's
         * context cannot hold: each token covers at most max_tok_bytes of it */
        const uint64_t most = (uint64_t)m->max_pos * (m->max_tok_bytes > 16 ? m->max_tok_bytes : 16);
        if (len > most) {
            snprintf(err, cap, "the prompt has %zu bytes: model '%s' has %u positions of at most %zu bytes (%llu)",
                     len, m->name, m->max_pos, m->max_tok_bytes, (unsigned long long)most);
            return 400;
        }
        dj_status st = dj_tokenizer_encode(m->tok, text, len, true, &o->ids, &o->n_ids);
        if (st == DJ_ENOMEM) {
            snprintf(err, cap, "out of memory tokenizing the prompt");
            return 503;
        }
        if (st != DJ_OK) {
            snprintf(err, cap, "the prompt cannot be tokenized: %s", dj_last_error());
            return 400;
        }
    }
    if (o->n_ids == 0) {
        snprintf(err, cap, "the prompt has no tokens");
        return 400;
    }
    return 0;
}

void dj__oai_logprobs(dj__oai *o, const dj_token_logprobs *lp) {
    if (o->finished || !o->logprobs) return;
    if (o->n_lps == o->cap_lps) {
        const size_t cap = o->cap_lps ? 2 * o->cap_lps : 32;
        struct dj__oai_lp *p = dj_realloc(o->lps, cap * sizeof *p);
        if (!p) {
            o->text.oom = true; /* answered as out of memory */
            return;
        }
        o->lps = p;
        o->cap_lps = cap;
    }
    o->lps[o->n_lps++] = (struct dj__oai_lp){.lp = *lp, .offset = o->text.n};
}

void dj__oai_text(dj__oai *o, const char *text, size_t n) {
    if (o->finished || !n) return;
    const size_t old = o->text.n;
    dj__buf_put(&o->text, text, n);
    if (!o->n_stop || o->text.oom) return;
    /* a stop string may straddle the old end */
    size_t from = old > o->max_stop_len ? old - o->max_stop_len : 0;
    size_t cut = SIZE_MAX;
    for (size_t s = 0; s < o->n_stop; s++) {
        const char *hit = memmem(o->text.p + from, o->text.n - from, o->stop[s], o->stop_len[s]);
        if (hit && (size_t)(hit - o->text.p) < cut) cut = (size_t)(hit - o->text.p);
    }
    if (cut != SIZE_MAX) {
        o->text.n = cut;
        o->text.p[cut] = '\0';
        while (o->n_lps && o->lps[o->n_lps - 1].offset >= cut && o->n_lps > o->lps_sent) o->n_lps--;
        o->finished = true;
        o->finish = "stop";
    }
}

void dj__oai_done(dj__oai *o, const char *reason) {
    if (o->finish) return;
    o->finished = true;
    o->finish = !strcmp(reason, "stop") ? "stop" : "length";
}

static void add_usage(const dj__oai *o, cJSON *r) {
    cJSON *u = cJSON_AddObjectToObject(r, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)o->n_ids);
    cJSON_AddNumberToObject(u, "completion_tokens", o->n_generated);
    cJSON_AddNumberToObject(u, "total_tokens", (double)o->n_ids + o->n_generated);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    if (d) cJSON_AddNumberToObject(d, "cached_tokens", (double)o->cached);
}

/* ---- logprobs in OpenAI's two shapes ---- */

/* A token's text: the tokenizer's decoding of it alone; text that is not
 * valid UTF-8 on its own (a piece of a character) is written as OpenAI
 * does, "bytes:\\xe2\\x80". raw, n_raw: the bytes themselves (malloc'd). */
static char *token_text(const dj__oai *o, int32_t id, char **raw, size_t *n_raw) {
    *raw = NULL;
    *n_raw = 0;
    if (o->tok && dj_tokenizer_decode_len(o->tok, &id, 1, raw, n_raw) != DJ_OK) {
        *raw = NULL;
        *n_raw = 0;
    }
    if (!*raw) return dj_strdup("");
    if (dj__utf8_valid(*raw, *n_raw) && !memchr(*raw, '\0', *n_raw)) return dj_strdup(*raw);
    char *s = dj_malloc(6 + 4 * *n_raw + 1);
    if (!s) return NULL;
    size_t k = (size_t)sprintf(s, "bytes:");
    for (size_t i = 0; i < *n_raw; i++) k += (size_t)sprintf(s + k, "\\x%02x", (unsigned char)(*raw)[i]);
    return s;
}

/* OpenAI's floor for a logprob (JSON has no -infinity). */
static double lp_json(float x) { return x > -9999.0f ? (double)x : -9999.0; }

/* One chat logprob entry {token, logprob, bytes[, top_logprobs]}. */
static cJSON *chat_entry(const dj__oai *o, int32_t id, float lp, const dj_token_logprobs *top) {
    char *raw;
    size_t n_raw;
    char *t = token_text(o, id, &raw, &n_raw);
    cJSON *e = cJSON_CreateObject(), *b = NULL;
    cJSON_AddStringToObject(e, "token", t ? t : "");
    cJSON_AddNumberToObject(e, "logprob", lp_json(lp));
    if ((b = cJSON_AddArrayToObject(e, "bytes")))
        for (size_t i = 0; i < n_raw; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)raw[i]));
    free(t);
    free(raw);
    if (top) {
        cJSON *a = cJSON_AddArrayToObject(e, "top_logprobs");
        for (uint32_t k = 0; a && k < top->n_top && k < o->top_logprobs; k++)
            cJSON_AddItemToArray(a, chat_entry(o, top->top_id[k], top->top_logprob[k], NULL));
    }
    return e;
}

/* Code points of text[0, bytes) (OpenAI's offsets count characters). */
static size_t chars(const char *text, size_t bytes) {
    size_t n = 0;
    for (size_t i = 0; i < bytes; i++) n += ((unsigned char)text[i] & 0xc0) != 0x80;
    return n;
}

/* The logprobs of tokens [from, to): chat's {content, refusal} or the
 * completions' {tokens, token_logprobs, top_logprobs, text_offset}. */
static cJSON *logprobs_json(const dj__oai *o, size_t from, size_t to) {
    cJSON *r = cJSON_CreateObject();
    if (o->chat) {
        cJSON *a = cJSON_AddArrayToObject(r, "content");
        for (size_t i = from; a && i < to; i++)
            cJSON_AddItemToArray(a, chat_entry(o, o->lps[i].lp.id, o->lps[i].lp.logprob, &o->lps[i].lp));
        cJSON_AddNullToObject(r, "refusal");
        return r;
    }
    cJSON *toks = cJSON_AddArrayToObject(r, "tokens"), *lps = cJSON_AddArrayToObject(r, "token_logprobs");
    cJSON *tops = cJSON_AddArrayToObject(r, "top_logprobs"), *offs = cJSON_AddArrayToObject(r, "text_offset");
    for (size_t i = from; toks && lps && tops && offs && i < to; i++) {
        const dj_token_logprobs *lp = &o->lps[i].lp;
        char *raw;
        size_t n_raw;
        char *t = token_text(o, lp->id, &raw, &n_raw);
        free(raw);
        cJSON_AddItemToArray(toks, cJSON_CreateString(t ? t : ""));
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(lp_json(lp->logprob)));
        /* the top N and, as OpenAI does, the sampled token: up to N + 1 keys */
        cJSON *d = cJSON_CreateObject();
        for (uint32_t k = 0; d && k <= lp->n_top && k <= o->top_logprobs; k++) {
            const bool sampled = k == lp->n_top || k == o->top_logprobs;
            char *tt = sampled ? t : token_text(o, lp->top_id[k], &raw, &n_raw);
            if (!sampled) free(raw);
            if (tt && !cJSON_GetObjectItemCaseSensitive(d, tt))
                cJSON_AddNumberToObject(d, tt, lp_json(sampled ? lp->logprob : lp->top_logprob[k]));
            if (!sampled) free(tt);
        }
        free(t);
        cJSON_AddItemToArray(tops, d);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)chars(o->text.p ? o->text.p : "", o->lps[i].offset)));
    }
    return r;
}

static void add_logprobs(const dj__oai *o, cJSON *choice, size_t from, size_t to) {
    if (o->logprobs) cJSON_AddItemToObject(choice, "logprobs", logprobs_json(o, from, to));
    else cJSON_AddNullToObject(choice, "logprobs");
}

static cJSON *head(const dj__oai *o, const char *object) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "id", o->id);
    cJSON_AddStringToObject(r, "object", object);
    cJSON_AddNumberToObject(r, "created", (double)o->created);
    cJSON_AddStringToObject(r, "model", o->model);
    /* the seed sampled with (the request's, or the fresh one drawn for it):
     * sent back as "seed", it repeats the answer */
    char seed[24]; /* as an integer: cJSON's doubles print 16-digit numbers only nearly */
    snprintf(seed, sizeof seed, "%lld", (long long)(int64_t)o->sampling.seed);
    cJSON_AddRawToObject(r, "seed", seed);
    return r;
}

static char *print(cJSON *r, size_t *len) {
    char *s = cJSON_PrintUnformatted(r);
    cJSON_Delete(r);
    *len = s ? strlen(s) : 0;
    return s;
}

/* The answer's tool calls (a cJSON array, or NULL: none) and *keep, the
 * bytes of its text that stay content: only a whole answer (not cut by
 * max_tokens or the context) is read for calls. */
static cJSON *answer_calls(const dj__oai *o, size_t *keep) {
    *keep = o->text.n;
    if (!o->chat || o->calls.choice == DJ__TOOLS_OFF || !o->finish || strcmp(o->finish, "stop")) return NULL;
    const char *base = strchr(o->id, '-') ? strchr(o->id, '-') + 1 : o->id;
    return dj__oai_tool_calls(&o->calls, o->text.p, o->text.n, base, keep);
}

char *dj__oai_response(const dj__oai *o, size_t *len) {
    if (o->text.oom) return NULL; /* text (or logprobs) lost for want of memory: answered 503, never a hole */
    cJSON *r = head(o, o->chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    const char *text = o->text.p ? o->text.p : "";
    size_t keep = o->text.n;
    cJSON *calls = answer_calls(o, &keep);
    if (o->chat) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        char *t = calls ? dj_strndup(text, keep) : NULL;
        if (calls && !keep) cJSON_AddNullToObject(m, "content"); /* as OpenAI answers a call */
        else cJSON_AddStringToObject(m, "content", calls ? (t ? t : "") : text);
        free(t);
        if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    add_logprobs(o, c, 0, o->n_lps);
    cJSON_AddStringToObject(c, "finish_reason", calls ? "tool_calls" : o->finish ? o->finish : "length");
    cJSON_AddItemToArray(choices, c);
    add_usage(o, r);
    return print(r, len);
}

static void event(dj__buf *out, cJSON *r) {
    size_t n;
    char *s = print(r, &n);
    if (!s) {
        out->oom = true;
        return;
    }
    dj__sse_put(out, NULL, s, n);
    free(s);
}

void dj__sse_put(dj__buf *out, const char *name, const char *data, size_t n) {
    if (name) {
        dj__buf_put(out, "event: ", 7);
        dj__buf_put(out, name, strlen(name));
        dj__buf_put(out, "\n", 1);
    }
    dj__buf_put(out, "data: ", 6);
    dj__buf_put(out, data, n);
    dj__buf_put(out, "\n\n", 2);
}

/* One chunk: a delta of text (may be NULL) and/or the finish reason, with
 * the logprobs of tokens [lp_from, lp_to) (none when equal). */
static void chunk(const dj__oai *o, const char *text, size_t n, bool role, const char *finish, size_t lp_from,
                  size_t lp_to, dj__buf *out) {
    cJSON *r = head(o, o->chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    char *t = dj_strndup(text ? text : "", n);
    if (o->chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (text) cJSON_AddStringToObject(d, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(c, "text", t ? t : "");
    }
    free(t);
    if (lp_to > lp_from) add_logprobs(o, c, lp_from, lp_to);
    else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish);
    else cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    event(out, r);
}

/* One chunk whose delta holds one tool call's piece d (taken). */
static void calls_chunk(const dj__oai *o, cJSON *d, dj__buf *out) {
    cJSON *r = head(o, "chat.completion.chunk");
    cJSON *choices = cJSON_AddArrayToObject(r, "choices"), *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", 0);
    cJSON *delta = cJSON_AddObjectToObject(c, "delta"), *a = delta ? cJSON_AddArrayToObject(delta, "tool_calls") : NULL;
    if (a) cJSON_AddItemToArray(a, d);
    else cJSON_Delete(d);
    cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddNullToObject(c, "finish_reason");
    cJSON_AddItemToArray(choices, c);
    event(out, r);
}

/* Bytes at the end of the text that could still begin a stop string. */
static size_t holdback(const dj__oai *o) {
    size_t keep = 0;
    for (size_t s = 0; s < o->n_stop; s++)
        for (size_t k = o->stop_len[s] - 1; k > keep; k--)
            if (k <= o->text.n && !memcmp(o->text.p + o->text.n - k, o->stop[s], k)) {
                keep = k;
                break;
            }
    return keep;
}

void dj__oai_events(dj__oai *o, bool last, dj__buf *out) {
    if (o->text.oom) { /* text (or logprobs) lost for want of memory: the stream ends with an error */
        out->oom = true;
        return;
    }
    if (o->chat && !o->role_sent) {
        chunk(o, "", 0, true, NULL, 0, 0, out);
        o->role_sent = true;
    }
    size_t upto = last || o->finished ? o->text.n : o->text.n - holdback(o);
    /* tools: text that may begin a call waits; at the end the calls go out as OpenAI streams them */
    cJSON *calls = NULL;
    if (o->chat && o->calls.choice != DJ__TOOLS_OFF) {
        if (last) {
            size_t keep;
            calls = answer_calls(o, &keep);
            if (calls) upto = keep > o->sent ? keep : o->sent;
        } else {
            const size_t safe = dj__oai_tools_safe(&o->calls, o->text.p, o->text.n);
            if (safe < upto) upto = safe > o->sent ? safe : o->sent;
        }
    }
    /* the tokens whose text starts in what goes out (all of them at the end) */
    size_t lp_to = o->lps_sent;
    while (lp_to < o->n_lps && (last || o->lps[lp_to].offset < upto)) lp_to++;
    if (upto > o->sent || (last && lp_to > o->lps_sent)) {
        chunk(o, o->text.p ? o->text.p + o->sent : "", upto - o->sent, false, NULL, o->lps_sent, lp_to, out);
        o->sent = upto;
        o->lps_sent = lp_to;
    }
    if (!last) return;
    int k = 0;
    for (const cJSON *call = calls ? calls->child : NULL; call; call = call->next, k++) {
        /* each call in two deltas: its id, type and name with arguments "", then the arguments */
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        for (int part = 0; part < 2; part++) {
            cJSON *d = cJSON_CreateObject(), *f = NULL;
            cJSON_AddNumberToObject(d, "index", k);
            if (part == 0) {
                cJSON_AddStringToObject(d, "id", cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(call, "id")));
                cJSON_AddStringToObject(d, "type", "function");
            }
            if ((f = cJSON_AddObjectToObject(d, "function"))) {
                const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(fn, "name"));
                if (part == 0) cJSON_AddStringToObject(f, "name", name);
                cJSON_AddStringToObject(f, "arguments", part == 0 ? "" : cJSON_GetStringValue(args));
            }
            calls_chunk(o, d, out);
        }
    }
    chunk(o, NULL, 0, false, calls ? "tool_calls" : o->finish ? o->finish : "length", 0, 0, out);
    cJSON_Delete(calls);
    if (o->include_usage) {
        cJSON *r = head(o, o->chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(r, "choices");
        add_usage(o, r);
        event(out, r);
    }
    dj__sse_put(out, NULL, "[DONE]", 6);
}

void dj__oai_free(dj__oai *o) {
    for (size_t s = 0; s < o->n_stop; s++) free(o->stop[s]);
    cJSON_Delete(o->messages);
    cJSON_Delete(o->tools);
    dj__oai_tools_free(&o->calls);
    free(o->prompt);
    free(o->cache_salt);
    free(o->logit_bias);
    free(o->json_schema);
    free(o->ids);
    free(o->lps);
    dj__buf_free(&o->text);
    memset(o, 0, sizeof *o);
}

char *dj__oai_error(int status, const char *message, size_t *len) {
    const char *type = status == 401   ? "authentication_error"
                       : status == 403 ? "permission_error"
                       : status == 404 ? "not_found_error"
                       : status == 429 ? "rate_limit_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    cJSON *r = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(r, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddNullToObject(e, "param");
    if (status == 404 && !strncmp(message, "model", 5)) cJSON_AddStringToObject(e, "code", "model_not_found");
    else cJSON_AddNullToObject(e, "code");
    return print(r, len);
}
