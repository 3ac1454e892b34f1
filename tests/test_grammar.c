/* test_grammar.c: structured output below the daemon - the JSON-schema compiler's
 * refusals, the matcher on texts, random schemas walked token by token under the
 * mask (a test-side validator checks every text), and dj_gen on the demo model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "djinn/engine.h"
#include "djinn/generate.h"
#include "djinn/grammar.h"
#include "djinn/tokenizer.h"
#include "testutil.h"

#if defined(__SANITIZE_ADDRESS__) /* the same checks, fewer of them: ASan runs each walk ~20x slower */
#define WALKS 80
#define GEN_ROUNDS 2
#else
#define WALKS 300
#define GEN_ROUNDS 6
#endif

/* ---- refusals name the keyword ---- */

static void test_refusals(void) {
    static const struct {
        const char *schema, *needle;
    } bad[] = {
        {"{\"type\": \"string\", \"pattern\": \"^a\"}", "'pattern'"},
        {"{\"type\": \"string\", \"minLength\": 2}", "'minLength'"},
        {"{\"type\": \"string\", \"format\": \"date\"}", "'format'"},
        {"{\"type\": \"number\", \"minimum\": 0}", "'minimum'"},
        {"{\"oneOf\": [{\"type\": \"string\"}]}", "'oneOf'"},
        {"{\"allOf\": [{\"type\": \"string\"}]}", "'allOf'"},
        {"{\"type\": \"object\", \"patternProperties\": {}}", "'patternProperties'"},
        {"{\"type\": \"array\", \"prefixItems\": []}", "'prefixItems'"},
        {"{\"type\": \"array\", \"items\": [{\"type\": \"string\"}]}", "'items' as a list"},
        {"{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", "'minItems' 3 is above 'maxItems' 2"},
        {"{\"type\": \"array\", \"minItems\": -1}", "'minItems'"},
        {"{\"enum\": []}", "'enum' admits no value"},
        {"{\"type\": \"string\", \"enum\": [1, 2]}", "of its 'type'"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", "'b'"},
        {"{\"$ref\": \"#/$defs/nope\"}", "names no definition"},
        {"{\"$ref\": \"http://x/y\"}", "'$ref'"},
        {"{\"$defs\": {\"a\": {\"type\": \"object\", \"properties\": {\"x\": {\"$ref\": \"#/$defs/a\"}}, \"required\": "
         "[\"x\"]}}, \"$ref\": \"#/$defs/a\"}", "no finite value"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"$defs\": {}}}}", "'$defs' below the root"},
        {"{\"type\": \"text\"}", "'text' is not a JSON type"},
        {"{\"type\": \"object\", \"properties\": {\"a\\\"b\": {}}}", "needs escaping"},
        {"[1]", "must be an object"},
        {"{not json", "not valid JSON"},
        {"false", "must be an object or true"},
        {"{\"anyOf\": []}", "'anyOf'"},
        {"{\"type\": \"string\", \"anyOf\": [{}]}", "'type' beside 'anyOf'"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        dj_grammar_t *g = NULL;
        const dj_status st = dj_grammar_from_json_schema(bad[k].schema, strlen(bad[k].schema), &g);
        CHECK_MSG(st == DJ_EINVAL && strstr(dj_last_error(), bad[k].needle), "%s: %s '%s', want '%s'", bad[k].schema,
                  dj_status_name(st), dj_last_error(), bad[k].needle);
        dj_grammar_free(g);
    }
}

/* ---- the matcher on whole texts ---- */

static void test_texts(void) {
    static const struct {
        const char *schema, *text;
        int want; /* 2 complete, 1 a prefix (not complete), 0 refused */
    } cases[] = {
        {"{\"type\": \"object\"}", "{}", 2},
        {"{\"type\": \"object\"}", " {\"a\": [1, -2.5e+3, true, null, \"x\\u00e9\\n\"], \"b\": {}}", 2},
        {"{\"type\": \"object\"}", "{\"a\": 01}", 0},
        {"{\"type\": \"object\"}", "{\"a\": 1,}", 0},
        {"{\"type\": \"object\"}", "{\"a\"", 1},
        {"{\"type\": \"object\"}", "{} ", 0},
        {"{\"type\": \"object\"}", "[]", 0},
        {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}}, "
         "\"required\": [\"name\"]}", "{\"age\": 3, \"name\": \"Bo\"}", 2},
        {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}}, "
         "\"required\": [\"name\"]}", "{\"age\": 3}", 0},
        {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": \"integer\"}}, "
         "\"required\": [\"name\"]}", "{\"age\": 3.5", 0},
        {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}}}", "{\"name\": \"a\", \"name\"", 0},
        {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}}}", "{\"nam\": 1", 0},
        {"{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}}}", "{\"other\"", 0},
        {"{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1, \"maxItems\": 2}", "[]", 0},
        {"{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1, \"maxItems\": 2}", "[1,2]", 2},
        {"{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1, \"maxItems\": 2}", "[1,2,", 0},
        {"{\"enum\": [\"red\", \"green\", 12, 1]}", "\"green\"", 2},
        {"{\"enum\": [\"red\", \"green\", 12, 1]}", "1", 2},
        {"{\"enum\": [\"red\", \"green\", 12, 1]}", "12", 2},
        {"{\"enum\": [\"red\", \"green\", 12, 1]}", "\"gr", 1},
        {"{\"enum\": [\"red\", \"green\", 12, 1]}", "\"blue\"", 0},
        {"{\"const\": {\"a\": [1, 2]}}", "{\"a\":[1,2]}", 2},
        {"{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"object\", \"properties\": {\"k\": {\"type\": \"null\"}}, "
         "\"required\": [\"k\"]}]}", "{\"k\": null}", 2},
        {"{\"anyOf\": [{\"type\": \"string\"}, {\"type\": \"object\", \"properties\": {\"k\": {\"type\": \"null\"}}, "
         "\"required\": [\"k\"]}]}", "\"s\"", 2},
        {"{\"type\": [\"integer\", \"null\"]}", "null", 2},
        {"{\"type\": [\"integer\", \"null\"]}", "-0", 2},
        {"{\"type\": [\"integer\", \"null\"]}", "1.5", 0},
        {"{\"type\": \"string\"}", "\"\\x\"", 0},
        {"{\"type\": \"string\"}", "\"a\tb\"", 0},
        {"{\"type\": \"string\"}", "\"\xc3\xa9\"", 2},
        {"{\"type\": \"string\"}", "\"\xc3\"", 0},
        {"{\"type\": \"string\"}", "\"\xed\xa0\x80\"", 0}, /* a surrogate in UTF-8 */
        {"{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"next\": {\"$ref\": \"#/$defs/node\"}, \"v\": "
         "{\"type\": \"integer\"}}, \"required\": [\"v\"]}}, \"$ref\": \"#/$defs/node\"}",
         "{\"v\": 1, \"next\": {\"v\": 2, \"next\": {\"v\": 3}}}", 2},
        {"{\"anyOf\": [{\"$ref\": \"#\"}, {\"type\": \"integer\"}]}", "7", 2},
        {"{\"type\": \"boolean\"}", "tru", 1},
        {"{\"type\": \"boolean\"}", "true", 2},
        {"{\"type\": \"number\"}", "1e5", 2},
        {"{\"type\": \"number\"}", "1e", 1},
        {"{\"type\": \"number\"}", "12345678901234567890123456789", 0}, /* over DJ_GRAMMAR_MAX_NUMBER */
        {"{\"type\": \"object\", \"additionalProperties\": false}", "{}", 2},
        {"{\"type\": \"object\", \"additionalProperties\": false}", "{\"a\": 1}", 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        dj_grammar_t *g = NULL;
        dj_grammar_state_t *s = NULL;
        CHECK_OK(dj_grammar_from_json_schema(cases[k].schema, strlen(cases[k].schema), &g));
        if (!g) continue;
        CHECK_OK(dj_grammar_state_new(g, &s));
        const bool fed = dj_grammar_feed(s, cases[k].text, strlen(cases[k].text));
        const int got = !fed ? 0 : dj_grammar_complete(s) ? 2 : 1;
        CHECK_MSG(got == cases[k].want, "%s on '%s': %d, want %d", cases[k].schema, cases[k].text, got, cases[k].want);
        if (got == 2) CHECK(dj_grammar_cost(s) == 0);
        if (got == 1) CHECK(dj_grammar_cost(s) > 0 && dj_grammar_cost(s) < 1000);
        dj_grammar_state_free(s);
        dj_grammar_free(g);
    }
}

/* ---- the test's own validator (the subset's meaning, written apart from the compiler) ---- */

static bool validate(const cJSON *root, const cJSON *sc, const cJSON *v, int depth);

static bool has_type(const cJSON *v, const char *t) {
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble);
    return false;
}

static bool validate(const cJSON *root, const cJSON *sc, const cJSON *v, int depth) {
    if (depth > 200) return false;
    if (cJSON_IsTrue(sc)) return true;
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(sc, "$ref");
    if (ref) {
        const char *r = ref->valuestring;
        const cJSON *t = !strcmp(r, "#") ? root
                         : !strncmp(r, "#/$defs/", 8)
                             ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "$defs"), r + 8)
                             : NULL;
        return t && validate(root, t, v, depth + 1);
    }
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(sc, "enum");
    if (x) {
        bool any = false;
        for (const cJSON *e = x->child; e; e = e->next) any = any || cJSON_Compare(e, v, true);
        if (!any) return false;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(sc, "const")) && !cJSON_Compare(x, v, true)) return false;
    if ((x = cJSON_GetObjectItemCaseSensitive(sc, "anyOf"))) {
        bool any = false;
        for (const cJSON *a = x->child; a && !any; a = a->next) any = validate(root, a, v, depth + 1);
        if (!any) return false;
    }
    if ((x = cJSON_GetObjectItemCaseSensitive(sc, "type"))) {
        bool any = false;
        for (const cJSON *t = cJSON_IsArray(x) ? x->child : x; t; t = cJSON_IsArray(x) ? t->next : NULL)
            any = any || has_type(v, t->valuestring);
        if (!any) return false;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(sc, "properties");
        const cJSON *extra = cJSON_GetObjectItemCaseSensitive(sc, "additionalProperties");
        for (const cJSON *m = v->child; m; m = m->next) {
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(props, m->string);
            if (p && !validate(root, p, m, depth + 1)) return false;
            if (!p && cJSON_IsFalse(extra)) return false;
        }
        for (const cJSON *r = cJSON_GetObjectItemCaseSensitive(sc, "required") ? cJSON_GetObjectItemCaseSensitive(sc, "required")->child : NULL; r; r = r->next)
            if (!cJSON_GetObjectItemCaseSensitive(v, r->valuestring)) return false;
    }
    if (cJSON_IsArray(v)) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(sc, "items");
        const int n = cJSON_GetArraySize(v);
        for (const cJSON *e = v->child; items && e; e = e->next)
            if (!validate(root, items, e, depth + 1)) return false;
        if ((x = cJSON_GetObjectItemCaseSensitive(sc, "minItems")) && n < x->valueint) return false;
        if ((x = cJSON_GetObjectItemCaseSensitive(sc, "maxItems")) && n > x->valueint) return false;
    }
    return true;
}

/* ---- random schemas of the subset ---- */

static uint32_t rnd(uint32_t n) { return (uint32_t)(dj_test_rand() % n); }

static cJSON *random_value(void) {
    switch (rnd(5)) {
    case 0: {
        static const char *const w[] = {"red", "green", "a b", "caf\xc3\xa9", "", "x\"y"};
        return cJSON_CreateString(w[rnd(6)]);
    }
    case 1: return cJSON_CreateNumber((double)rnd(200) - 50);
    case 2: return cJSON_CreateNumber(rnd(100) / 4.0);
    case 3: return cJSON_CreateBool(rnd(2));
    default: return cJSON_CreateNull();
    }
}

static cJSON *random_schema(int depth, int n_defs) {
    cJSON *s = cJSON_CreateObject();
    static const char *const types[] = {"string", "number", "integer", "boolean", "null"};
    const uint32_t pick = depth >= 3 ? rnd(7) : rnd(12);
    switch (pick) {
    case 0: case 1: case 2: case 3: case 4: cJSON_AddStringToObject(s, "type", types[pick]); break;
    case 5: {
        cJSON *e = cJSON_AddArrayToObject(s, "enum");
        for (uint32_t i = 0, n = 1 + rnd(4); i < n; i++) cJSON_AddItemToArray(e, random_value());
        break;
    }
    case 6:
        if (n_defs && rnd(2)) {
            char ref[32];
            snprintf(ref, sizeof ref, "#/$defs/d%u", rnd((uint32_t)n_defs));
            cJSON_AddStringToObject(s, "$ref", ref);
        } else {
            cJSON_AddItemToObject(s, "const", random_value());
        }
        break;
    case 7: case 8: {
        static const char *const names[] = {"a", "b", "name", "id", "value", "tags", "x1", "nested"};
        cJSON_AddStringToObject(s, "type", "object");
        cJSON *props = cJSON_AddObjectToObject(s, "properties"), *req = cJSON_AddArrayToObject(s, "required");
        for (uint32_t i = 0, n = 1 + rnd(4); i < n; i++) {
            const char *name = names[rnd(8)];
            if (cJSON_GetObjectItemCaseSensitive(props, name)) continue;
            cJSON_AddItemToObject(props, name, random_schema(depth + 1, n_defs));
            if (rnd(3)) cJSON_AddItemToArray(req, cJSON_CreateString(name));
        }
        if (rnd(2)) cJSON_AddBoolToObject(s, "additionalProperties", false);
        break;
    }
    case 9: {
        cJSON_AddStringToObject(s, "type", "array");
        cJSON_AddItemToObject(s, "items", random_schema(depth + 1, n_defs));
        const uint32_t lo = rnd(3);
        if (rnd(2)) cJSON_AddNumberToObject(s, "minItems", lo);
        if (rnd(2)) cJSON_AddNumberToObject(s, "maxItems", lo + rnd(4));
        break;
    }
    case 10: {
        cJSON *a = cJSON_AddArrayToObject(s, "anyOf");
        cJSON_AddItemToArray(a, random_schema(depth + 1, n_defs));
        cJSON_AddItemToArray(a, random_schema(depth + 1, n_defs));
        break;
    }
    default: {
        cJSON *t = cJSON_AddArrayToObject(s, "type");
        cJSON_AddItemToArray(t, cJSON_CreateString(types[rnd(3)]));
        cJSON_AddItemToArray(t, cJSON_CreateString("null"));
        break;
    }
    }
    if (!rnd(4)) cJSON_AddStringToObject(s, "description", "an annotation");
    return s;
}

/* A root object schema, sometimes with $defs. */
static cJSON *random_root(void) {
    const int n_defs = (int)rnd(3);
    cJSON *defs = cJSON_CreateObject();
    for (int i = 0; i < n_defs; i++) {
        char name[16];
        snprintf(name, sizeof name, "d%d", i);
        cJSON_AddItemToObject(defs, name, random_schema(2, 0));
    }
    cJSON *root;
    do {
        root = random_schema(0, n_defs);
        if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "type")) &&
            !strcmp(cJSON_GetObjectItemCaseSensitive(root, "type")->valuestring, "object"))
            break;
        cJSON_Delete(root);
    } while (1);
    if (n_defs) cJSON_AddItemToObject(root, "$defs", defs);
    else cJSON_Delete(defs);
    return root;
}

/* ---- random walks under the mask: a uniform "model" over the allowed ids ---- */

static dj_tokenizer_t *demo_tok;
static dj_grammar_vocab_t *demo_vocab;

static void test_walks(void) {
    uint8_t *allowed = malloc(4096);
    const int32_t eos = 1;
    int whole = 0, walks = 0, with_eos = 0;
    for (int w = 0; w < WALKS; w++) {
        cJSON *root = random_root();
        char *text = cJSON_PrintUnformatted(root);
        dj_grammar_t *g = NULL;
        const dj_status st = dj_grammar_from_json_schema(text, strlen(text), &g);
        if (st != DJ_OK) { /* a random schema may admit nothing: say so, not fail, when the refusal says why */
            CHECK_MSG(strstr(dj_last_error(), "no finite value") || strstr(dj_last_error(), "admits no value"),
                      "%s: %s", text, dj_last_error());
            free(text);
            cJSON_Delete(root);
            continue;
        }
        dj_constraint_t *c = NULL;
        CHECK_OK(dj_constraint_new(g, demo_vocab, &eos, 1, &c));
        /* tokens enough for the shortest value (the demo vocabulary has every byte) */
        const uint32_t budget = (c ? dj_grammar_cost(dj_constraint_state(c)) : 0) + rnd(150);
        char out[8192];
        size_t n = 0;
        int32_t ids[4096];
        size_t n_ids = 0;
        bool ended = false;
        for (uint32_t t = 0; c && t < budget && !dj_constraint_finished(c); t++) {
            const uint32_t count = dj_constraint_mask(c, budget - t, allowed);
            CHECK_MSG(count > 0, "%s: stuck after '%.*s'", text, (int)n, out);
            if (!count) break;
            uint32_t k = rnd(count), id = 0;
            for (;; id++)
                if (allowed[id] && k-- == 0) break;
            if ((int32_t)id == eos) {
                ended = true;
                break;
            }
            CHECK(dj_constraint_accept(c, (int32_t)id));
            if (n_ids < 4096) ids[n_ids++] = (int32_t)id;
        }
        char *piece = NULL; /* the whole text at once: a character may span tokens */
        if (dj_tokenizer_decode_len(demo_tok, ids, n_ids, &piece, &n) != DJ_OK || n >= sizeof out) n = 0;
        if (n) memcpy(out, piece, n);
        free(piece);
        walks++;
        with_eos += ended;
        out[n] = '\0';
        cJSON *v = cJSON_ParseWithLength(out, n);
        const bool ok = v && c && dj_grammar_complete(dj_constraint_state(c)) && validate(root, root, v, 0);
        whole += ok;
        CHECK_MSG(ok, "schema %s, %u tokens: '%s' does not %s", text, budget, out, v ? "validate" : "parse");
        cJSON_Delete(v);
        dj_constraint_free(c);
        free(text);
        cJSON_Delete(root);
    }
    printf("test_grammar: %d of %d random walks gave valid JSON (%d ended by EOS)\n", whole, walks, with_eos);
    free(allowed);
}

/* ---- dj_gen on the demo model: sampled, batched beside an unconstrained generation ---- */

static void test_generation(void) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.n_threads = 2;
    dj_vmu_config_default(&ec.vmu, (size_t)256 << 20);
    dj_engine_t *e = NULL;
    dj_model_t *m = NULL;
    CHECK_OK(dj_engine_new(&ec, &e));
    if (e) CHECK_OK(dj_model_load(e, DJ_SOURCE_DIR "/models/demo", &m));
    if (!m) {
        dj_engine_free(e);
        return;
    }
    int32_t eos[8];
    size_t n_eos = 0;
    CHECK_OK(dj_gen_eos_ids(DJ_SOURCE_DIR "/models/demo", dj_model_get_config(m), eos, 8, &n_eos));
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    CHECK_OK(dj_tokenizer_encode(demo_tok, "Once upon a time", 16, true, &prompt, &n_prompt));
    for (int round = 0; round < GEN_ROUNDS; round++) {
        cJSON *root = random_root();
        char *schema = cJSON_PrintUnformatted(root);
        dj_grammar_t *g = NULL;
        dj_constraint_t *c = NULL;
        if (dj_grammar_from_json_schema(schema, strlen(schema), &g) != DJ_OK) {
            free(schema);
            cJSON_Delete(root);
            round--;
            continue;
        }
        CHECK_OK(dj_constraint_new(g, demo_vocab, eos, n_eos, &c));
        dj_session_t *s[2] = {NULL, NULL};
        dj_gen_t *gen[2] = {NULL, NULL};
        for (int i = 0; i < 2; i++) {
            CHECK_OK(dj_session_new(e, m, 400, 0, &s[i]));
            dj_gen_params gp = {.sampling = {.temperature = 1.0f, .top_p = 1.0f, .seed = 100 + (uint64_t)round},
                                .max_tokens = 120, .eos_ids = eos, .n_eos = n_eos, .tok = demo_tok,
                                .constraint = i == 0 ? c : NULL};
            CHECK_OK(dj_gen_new(e, s[i], prompt, n_prompt, &gp, &gen[i]));
        }
        char out[8192];
        size_t n = 0;
        while (gen[0] && gen[1] && dj_gen_finished(gen[0]) == DJ_GEN_RUNNING) {
            dj_gen_t *batch[2] = {gen[0], gen[1]};
            const uint32_t nb = dj_gen_finished(gen[1]) == DJ_GEN_RUNNING ? 2 : 1;
            dj_gen_event ev[2];
            if (dj_gen_step(e, batch, nb, ev) != DJ_OK) break;
            if (n + ev[0].text_len < sizeof out) memcpy(out + n, ev[0].text, ev[0].text_len), n += ev[0].text_len;
        }
        size_t rest = 0;
        if (gen[0]) CHECK_OK(dj_gen_text_rest(gen[0], out + n, sizeof out - n - 1, &rest));
        n += rest;
        out[n] = '\0';
        if (round == 0) printf("test_grammar: the demo model under %s wrote '%s' (%s)\n", schema, out,
                               gen[0] ? dj_gen_finish_name(dj_gen_finished(gen[0])) : "-");
        cJSON *v = cJSON_Parse(out);
        CHECK_MSG(v && validate(root, root, v, 0), "demo model under %s: '%s' (%s)", schema, out,
                  gen[0] ? dj_gen_finish_name(dj_gen_finished(gen[0])) : "-");
        cJSON_Delete(v);
        for (int i = 0; i < 2; i++) dj_gen_free(gen[i]), dj_session_free(e, s[i]);
        free(schema);
        cJSON_Delete(root);
    }
    free(prompt);
    dj_engine_free(e);
}

/* dj_constraint_from_schema: one trie per tokenizer's texts, whichever object holds them */
static void test_vocab_cache(void) {
    dj_tokenizer_t *again = NULL;
    CHECK_OK(dj_tokenizer_load(DJ_SOURCE_DIR "/models/demo/tokenizer.json", &again));
    const char *schema = "{\"type\": \"object\"}";
    const int32_t eos = 1;
    dj_constraint_t *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(dj_constraint_from_schema(schema, strlen(schema), demo_tok, 4096, &eos, 1, &a));
    CHECK_OK(dj_constraint_from_schema(schema, strlen(schema), again, 4096, &eos, 1, &b));
    CHECK_OK(dj_constraint_from_schema(schema, strlen(schema), again, 4000, &eos, 1, &c)); /* another length: another */
    CHECK(a && b && c && dj_constraint_vocab(a) == dj_constraint_vocab(b) && dj_constraint_vocab(c) != dj_constraint_vocab(a));
    uint8_t *ma = malloc(4096), *mb = malloc(4096);
    if (a && b) CHECK(dj_constraint_mask(a, 50, ma) == dj_constraint_mask(b, 50, mb) && !memcmp(ma, mb, 4096));
    free(ma);
    free(mb);
    dj_constraint_free(a);
    dj_constraint_free(b);
    dj_constraint_free(c);
    dj_tokenizer_free(again);
    CHECK_ST(dj_constraint_from_schema(schema, strlen(schema), NULL, 4096, &eos, 1, &a), DJ_EINVAL);
}

int main(void) {
    dj_test_seeds();
    CHECK_OK(dj_tokenizer_load(DJ_SOURCE_DIR "/models/demo/tokenizer.json", &demo_tok));
    if (demo_tok) CHECK_OK(dj_grammar_vocab_new(demo_tok, 4096, &demo_vocab));
    test_refusals();
    test_texts();
    if (demo_vocab) {
        test_walks();
        test_vocab_cache();
        test_generation();
    }
    dj_grammar_vocab_free(demo_vocab);
    dj_tokenizer_free(demo_tok);
    return dj_test_finish("test_grammar");
}
