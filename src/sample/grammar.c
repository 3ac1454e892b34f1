/* grammar.c: a JSON schema of the common subset compiled into nodes, and the
 * byte-at-a-time matcher of JSON text against them (parse stacks, anyOf forks, completion cost). */
#include "sample/grammar_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "djinn/alloc.h"

#define MAX_NODES 20000
#define MAX_NEST 64   /* schema nesting the compiler follows */
#define MAX_LITS 4096 /* enum values of one node */

/* ---- building nodes ---- */

static void node_clear(dj__g_node *n) {
    for (uint32_t k = 0; k < n->n_props; k++) free(n->names[k]);
    free(n->names);
    free(n->name_len);
    free(n->prop);
    for (uint32_t k = 0; k < n->n_lits; k++) free(n->lits[k]);
    free(n->lits);
    free(n->lit_len);
    free(n->alts);
    memset(n, 0, sizeof *n);
}

void dj_grammar_free(dj_grammar_t *g) {
    if (!g) return;
    for (uint32_t i = 0; i < g->n_nodes; i++) node_clear(&g->n[i]);
    free(g->n);
    free(g);
}

static dj_status new_node(dj_grammar_t *g, dj__g_kind kind, int32_t *out) {
    if (g->n_nodes == MAX_NODES) return dj_fail(DJ_EINVAL, "JSON schema: more than %d nodes", MAX_NODES);
    if (g->n_nodes == g->cap) {
        const uint32_t cap = g->cap ? 2 * g->cap : 16;
        dj__g_node *p = dj_realloc(g->n, cap * sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "out of memory");
        g->n = p;
        g->cap = cap;
    }
    memset(&g->n[g->n_nodes], 0, sizeof g->n[0]);
    g->n[g->n_nodes].kind = kind;
    g->n[g->n_nodes].items = DJ__G_N_ANY;
    g->n[g->n_nodes].max_items = UINT32_MAX;
    *out = (int32_t)g->n_nodes++;
    return DJ_OK;
}

static int cmp_bytes(const char *a, uint32_t na, const char *b, uint32_t nb) {
    const int c = memcmp(a, b, na < nb ? na : nb);
    return c ? c : (na > nb) - (na < nb);
}

/* Literals (JSON texts, taken) sorted and made distinct in node k. */
static void set_lits(dj__g_node *n, char **lits, uint32_t count) {
    for (uint32_t i = 1; i < count; i++) /* insertion sort: enums are short */
        for (uint32_t j = i; j > 0 && strcmp(lits[j - 1], lits[j]) > 0; j--) {
            char *t = lits[j];
            lits[j] = lits[j - 1];
            lits[j - 1] = t;
        }
    uint32_t m = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (m && !strcmp(lits[m - 1], lits[i])) {
            free(lits[i]);
            continue;
        }
        lits[m++] = lits[i];
    }
    n->lits = lits;
    n->n_lits = m;
    for (uint32_t i = 0; i < m; i++) n->lit_len[i] = (uint32_t)strlen(lits[i]);
}

static dj_status words_node(dj_grammar_t *g, int32_t k, const char *const *words, uint32_t count) {
    dj__g_node *n = &g->n[k];
    n->kind = DJ__G_LITS;
    char **l = dj_calloc(count, sizeof *l);
    n->lit_len = dj_calloc(count, sizeof *n->lit_len);
    if (!l || !n->lit_len) {
        free(l);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    for (uint32_t i = 0; i < count; i++)
        if (!(l[i] = dj_strdup(words[i]))) {
            for (uint32_t j = 0; j < i; j++) free(l[j]);
            free(l);
            return dj_fail(DJ_ENOMEM, "out of memory");
        }
    set_lits(n, l, count);
    return DJ_OK;
}

/* ---- the compiler ---- */

typedef struct compiler {
    dj_grammar_t *g;
    const cJSON *defs[2];  /* the root's $defs and definitions (NULL: none) */
    struct def_slot {
        const cJSON *schema;
        int32_t node;      /* -1: not compiled yet */
    } *slots;
    uint32_t n_slots;
} compiler;

static const char *const annotations[] = {"title", "description", "$schema", "$id", "$comment", "default",
                                          "examples", "strict", "$defs", "definitions"};
static const char *const keywords[] = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                       "items", "minItems", "maxItems", "anyOf", "$ref"};

static bool in(const char *s, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(s, list[i])) return true;
    return false;
}
#define IN(s, list) in((s), (list), sizeof(list) / sizeof *(list))

static dj_status compile(compiler *cp, const cJSON *js, const char *path, int depth, int32_t into, int32_t *out);

static const char *type_of(const cJSON *v) {
    if (cJSON_IsObject(v)) return "object";
    if (cJSON_IsArray(v)) return "array";
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsNull(v)) return "null";
    return v->valuedouble == (double)(long long)v->valuedouble && v->valuedouble > -9e15 && v->valuedouble < 9e15
               ? "integer"
               : "number";
}

/* Whether value v has one of the types (NULL: any). */
static bool type_ok(const cJSON *v, const cJSON *types) {
    if (!types) return true;
    const char *t = type_of(v);
    for (const cJSON *e = cJSON_IsArray(types) ? types->child : types; e; e = cJSON_IsArray(types) ? e->next : NULL)
        if (!strcmp(e->valuestring, t) || (!strcmp(e->valuestring, "number") && !strcmp(t, "integer"))) return true;
    return false;
}

/* enum / const: the allowed values as JSON texts. */
static dj_status compile_lits(compiler *cp, const cJSON *js, const char *path, int32_t k) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(js, "enum"), *co = cJSON_GetObjectItemCaseSensitive(js, "const");
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(js, "type");
    if (en && co) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'enum' and 'const' together are not supported", path);
    if (en && !cJSON_IsArray(en)) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'enum' must be an array", path);
    for (const cJSON *f = js->child; f; f = f->next)
        if (strcmp(f->string, "enum") && strcmp(f->string, "const") && strcmp(f->string, "type") &&
            !IN(f->string, annotations))
            return dj_fail(DJ_EINVAL, "JSON schema at %s: '%s' beside '%s' is not supported", path, f->string,
                           en ? "enum" : "const");
    const uint32_t count = en ? (uint32_t)cJSON_GetArraySize(en) : 1;
    if (count > MAX_LITS) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'enum' has over %d values", path, MAX_LITS);
    dj__g_node *n = &cp->g->n[k];
    n->kind = DJ__G_LITS;
    char **l = dj_calloc(count ? count : 1, sizeof *l);
    n->lit_len = dj_calloc(count ? count : 1, sizeof *n->lit_len);
    if (!l || !n->lit_len) {
        free(l);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    uint32_t m = 0;
    for (const cJSON *v = en ? en->child : co; v; v = en ? v->next : NULL) {
        if (!type_ok(v, types)) continue;
        if (!(l[m] = cJSON_PrintUnformatted(v))) {
            for (uint32_t j = 0; j < m; j++) free(l[j]);
            free(l);
            return dj_fail(DJ_ENOMEM, "out of memory");
        }
        m++;
    }
    if (m == 0) {
        free(l);
        return dj_fail(DJ_EINVAL, "JSON schema at %s: '%s' admits no value%s", path, en ? "enum" : "const",
                       types ? " of its 'type'" : "");
    }
    set_lits(n, l, m);
    return DJ_OK;
}

static dj_status count_field(const cJSON *js, const char *key, const char *path, uint32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(js, key);
    if (!v) return DJ_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e9 || v->valuedouble != (double)(int)v->valuedouble)
        return dj_fail(DJ_EINVAL, "JSON schema at %s: '%s' must be a non-negative integer", path, key);
    *out = (uint32_t)v->valuedouble;
    return DJ_OK;
}

static dj_status compile_object(compiler *cp, const cJSON *js, const char *path, int depth, int32_t k) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(js, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(js, "required");
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(js, "additionalProperties");
    if (props && !cJSON_IsObject(props))
        return dj_fail(DJ_EINVAL, "JSON schema at %s: 'properties' must be an object", path);
    if (req && !cJSON_IsArray(req)) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'required' must be an array", path);
    if (extra && !cJSON_IsBool(extra) && !cJSON_IsObject(extra))
        return dj_fail(DJ_EINVAL, "JSON schema at %s: 'additionalProperties' must be a boolean or a schema", path);
    const uint32_t np = props ? (uint32_t)cJSON_GetArraySize(props) : 0;
    if (!props && !cJSON_IsFalse(extra)) {
        if (cJSON_IsObject(extra))
            return dj_fail(DJ_EINVAL, "JSON schema at %s: 'additionalProperties' as a schema without 'properties' is "
                                      "not supported", path);
        if (req && cJSON_GetArraySize(req))
            return dj_fail(DJ_EINVAL, "JSON schema at %s: 'required' names a property not in 'properties'", path);
        cp->g->n[k].kind = DJ__G_OBJECT;
        cp->g->n[k].free_obj = true;
        return DJ_OK;
    }
    if (np > DJ__G_MAX_PROPS)
        return dj_fail(DJ_EINVAL, "JSON schema at %s: 'properties' lists %u: at most %d", path, np, DJ__G_MAX_PROPS);
    dj__g_node *n = &cp->g->n[k];
    n->kind = DJ__G_OBJECT;
    n->names = dj_calloc(np ? np : 1, sizeof *n->names);
    n->name_len = dj_calloc(np ? np : 1, sizeof *n->name_len);
    n->prop = dj_calloc(np ? np : 1, sizeof *n->prop);
    if (!n->names || !n->name_len || !n->prop) return dj_fail(DJ_ENOMEM, "out of memory");
    /* sorted names; the schemas compiled after (new nodes move the array) */
    const cJSON **schemas = dj_calloc(np ? np : 1, sizeof *schemas);
    if (!schemas) return dj_fail(DJ_ENOMEM, "out of memory");
    dj_status st = DJ_OK;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        const size_t len = strlen(p->string);
        for (size_t i = 0; i < len; i++)
            if (p->string[i] == '"' || p->string[i] == '\\' || (unsigned char)p->string[i] < 0x20) {
                st = dj_fail(DJ_EINVAL, "JSON schema at %s: property name '%.64s' needs escaping: not supported",
                             path, p->string);
                goto done;
            }
        uint32_t at = n->n_props;
        while (at > 0 && cmp_bytes(n->names[at - 1], n->name_len[at - 1], p->string, (uint32_t)len) > 0) at--;
        if (at > 0 && !strcmp(n->names[at - 1], p->string)) continue; /* a repeated key: cJSON keeps both */
        char *name = dj_strdup(p->string);
        if (!name) {
            st = dj_fail(DJ_ENOMEM, "out of memory");
            goto done;
        }
        memmove(n->names + at + 1, n->names + at, (n->n_props - at) * sizeof *n->names);
        memmove(n->name_len + at + 1, n->name_len + at, (n->n_props - at) * sizeof *n->name_len);
        memmove(schemas + at + 1, schemas + at, (n->n_props - at) * sizeof *schemas);
        n->names[at] = name;
        n->name_len[at] = (uint32_t)len;
        schemas[at] = p;
        n->n_props++;
    }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) {
        uint32_t i = 0;
        while (cJSON_IsString(r) && i < n->n_props && strcmp(n->names[i], r->valuestring)) i++;
        if (!cJSON_IsString(r) || i == n->n_props) {
            st = dj_fail(DJ_EINVAL, "JSON schema at %s: 'required' names %s%.64s%s, not in 'properties'", path,
                         cJSON_IsString(r) ? "'" : "", cJSON_IsString(r) ? r->valuestring : "a non-string",
                         cJSON_IsString(r) ? "'" : "");
            goto done;
        }
        n->required |= 1ull << i;
    }
    const uint32_t count = n->n_props;
    for (uint32_t i = 0; i < count; i++) {
        char sub[512];
        snprintf(sub, sizeof sub, "%.300s.properties.%.64s", path, cp->g->n[k].names[i]);
        int32_t child;
        if ((st = compile(cp, schemas[i], sub, depth + 1, -1, &child)) != DJ_OK) goto done;
        cp->g->n[k].prop[i] = child;
    }
done:
    free(schemas);
    return st;
}

static dj_status compile_array(compiler *cp, const cJSON *js, const char *path, int depth, int32_t k) {
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(js, "items");
    uint32_t lo = 0, hi = UINT32_MAX;
    dj_status st = count_field(js, "minItems", path, &lo);
    if (st == DJ_OK) st = count_field(js, "maxItems", path, &hi);
    if (st != DJ_OK) return st;
    if (lo > hi) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'minItems' %u is above 'maxItems' %u", path, lo, hi);
    if (lo > 4096) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'minItems' %u: at most 4096", path, lo);
    cp->g->n[k].kind = DJ__G_ARRAY;
    cp->g->n[k].min_items = lo;
    cp->g->n[k].max_items = hi;
    if (items && cJSON_IsArray(items))
        return dj_fail(DJ_EINVAL, "JSON schema at %s: 'items' as a list (a tuple) is not supported", path);
    if (!items) return DJ_OK;
    char sub[512];
    snprintf(sub, sizeof sub, "%.400s.items", path);
    int32_t child;
    if ((st = compile(cp, items, sub, depth + 1, -1, &child)) != DJ_OK) return st;
    cp->g->n[k].items = child;
    return DJ_OK;
}

/* One type's node (into k) of a schema object. */
static dj_status compile_type(compiler *cp, const cJSON *js, const char *type, const char *path, int depth, int32_t k) {
    if (!strcmp(type, "object")) return compile_object(cp, js, path, depth, k);
    if (!strcmp(type, "array")) return compile_array(cp, js, path, depth, k);
    if (!strcmp(type, "string")) return cp->g->n[k].kind = DJ__G_STRING, DJ_OK;
    if (!strcmp(type, "number")) return cp->g->n[k].kind = DJ__G_NUMBER, DJ_OK;
    if (!strcmp(type, "integer")) return cp->g->n[k].kind = DJ__G_INTEGER, DJ_OK;
    static const char *const tf[] = {"false", "true"}, *const nul[] = {"null"};
    if (!strcmp(type, "boolean")) return words_node(cp->g, k, tf, 2);
    if (!strcmp(type, "null")) return words_node(cp->g, k, nul, 1);
    return dj_fail(DJ_EINVAL, "JSON schema at %s: 'type' '%.32s' is not a JSON type", path, type);
}

static dj_status resolve_ref(compiler *cp, const cJSON *ref, const char *path, int depth, int32_t *out) {
    if (!cJSON_IsString(ref)) return dj_fail(DJ_EINVAL, "JSON schema at %s: '$ref' must be a string", path);
    const char *r = ref->valuestring;
    if (!strcmp(r, "#")) {
        *out = DJ__G_N_ROOT;
        return DJ_OK;
    }
    const cJSON *defs = NULL;
    const char *name = NULL;
    if (!strncmp(r, "#/$defs/", 8)) defs = cp->defs[0], name = r + 8;
    else if (!strncmp(r, "#/definitions/", 14)) defs = cp->defs[1], name = r + 14;
    else
        return dj_fail(DJ_EINVAL, "JSON schema at %s: '$ref' '%.64s' is not supported (\"#\", \"#/$defs/NAME\" or "
                                  "\"#/definitions/NAME\")", path, r);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(defs, name);
    if (!d || strchr(name, '/') || strchr(name, '~'))
        return dj_fail(DJ_EINVAL, "JSON schema at %s: '$ref' '%.64s' names no definition", path, r);
    for (uint32_t i = 0; i < cp->n_slots; i++)
        if (cp->slots[i].schema == d) {
            *out = cp->slots[i].node;
            return DJ_OK;
        }
    struct def_slot *s = dj_realloc(cp->slots, (cp->n_slots + 1) * sizeof *s);
    if (!s) return dj_fail(DJ_ENOMEM, "out of memory");
    cp->slots = s;
    int32_t k;
    dj_status st = new_node(cp->g, DJ__G_ANYOF, &k);
    if (st != DJ_OK) return st;
    cp->slots[cp->n_slots++] = (struct def_slot){.schema = d, .node = k};
    char sub[512];
    snprintf(sub, sizeof sub, "#.%s.%.64s", defs == cp->defs[0] ? "$defs" : "definitions", name);
    if ((st = compile(cp, d, sub, depth + 1, k, out)) != DJ_OK) return st;
    *out = k;
    return DJ_OK;
}

/* js into node `into` (-1: a new one); *out its index. */
static dj_status compile(compiler *cp, const cJSON *js, const char *path, int depth, int32_t into, int32_t *out) {
    if (depth > MAX_NEST) return dj_fail(DJ_EINVAL, "JSON schema at %.200s: nested deeper than %d", path, MAX_NEST);
    dj_status st;
    int32_t k = into;
    if (k < 0 && (st = new_node(cp->g, DJ__G_ANYOF, &k)) != DJ_OK) return st;
    *out = k;
    if (cJSON_IsTrue(js)) { /* any value */
        cp->g->n[k].kind = DJ__G_ANYOF;
        if (!(cp->g->n[k].alts = dj_malloc(sizeof(int32_t)))) return dj_fail(DJ_ENOMEM, "out of memory");
        cp->g->n[k].alts[0] = DJ__G_N_ANY;
        cp->g->n[k].n_alts = 1;
        return DJ_OK;
    }
    if (!cJSON_IsObject(js)) return dj_fail(DJ_EINVAL, "JSON schema at %s: a schema must be an object or true", path);
    for (const cJSON *f = js->child; f; f = f->next) {
        if (!IN(f->string, keywords) && !IN(f->string, annotations))
            return dj_fail(DJ_EINVAL, "JSON schema keyword '%.64s' (at %s) is not supported", f->string, path);
        if (depth > 0 && (!strcmp(f->string, "$defs") || !strcmp(f->string, "definitions")))
            return dj_fail(DJ_EINVAL, "JSON schema at %s: '%s' below the root is not supported", path, f->string);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(js, "$ref");
    if (ref) {
        for (const cJSON *f = js->child; f; f = f->next)
            if (strcmp(f->string, "$ref") && !IN(f->string, annotations))
                return dj_fail(DJ_EINVAL, "JSON schema at %s: '%s' beside '$ref' is not supported", path, f->string);
        int32_t target;
        if ((st = resolve_ref(cp, ref, path, depth, &target)) != DJ_OK) return st;
        cp->g->n[k].kind = DJ__G_ANYOF;
        if (!(cp->g->n[k].alts = dj_malloc(sizeof(int32_t)))) return dj_fail(DJ_ENOMEM, "out of memory");
        cp->g->n[k].alts[0] = target;
        cp->g->n[k].n_alts = 1;
        return DJ_OK;
    }
    if (cJSON_GetObjectItemCaseSensitive(js, "enum") || cJSON_GetObjectItemCaseSensitive(js, "const")) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(js, "type");
        if (t && !cJSON_IsString(t) && !cJSON_IsArray(t))
            return dj_fail(DJ_EINVAL, "JSON schema at %s: 'type' must be a string or a list", path);
        for (const cJSON *e = cJSON_IsArray(t) ? t->child : NULL; e; e = e->next)
            if (!cJSON_IsString(e)) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'type' lists a non-string", path);
        return compile_lits(cp, js, path, k);
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(js, "anyOf");
    if (any) {
        for (const cJSON *f = js->child; f; f = f->next)
            if (strcmp(f->string, "anyOf") && !IN(f->string, annotations))
                return dj_fail(DJ_EINVAL, "JSON schema at %s: '%s' beside 'anyOf' is not supported", path, f->string);
        const int na = cJSON_IsArray(any) ? cJSON_GetArraySize(any) : 0;
        if (na == 0) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'anyOf' must be a non-empty array", path);
        int32_t *alts = dj_calloc((size_t)na, sizeof *alts);
        if (!alts) return dj_fail(DJ_ENOMEM, "out of memory");
        cp->g->n[k].kind = DJ__G_ANYOF;
        cp->g->n[k].alts = alts;
        int i = 0;
        for (const cJSON *a = any->child; a; a = a->next, i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%.400s.anyOf[%d]", path, i);
            int32_t child;
            if ((st = compile(cp, a, sub, depth + 1, -1, &child)) != DJ_OK) return st;
            cp->g->n[k].alts[i] = child;
            cp->g->n[k].n_alts = (uint32_t)i + 1;
        }
        return DJ_OK;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(js, "type");
    if (!type) { /* no type: what the keywords speak of, else any value */
        if (cJSON_GetObjectItemCaseSensitive(js, "properties") || cJSON_GetObjectItemCaseSensitive(js, "required") ||
            cJSON_GetObjectItemCaseSensitive(js, "additionalProperties"))
            return compile_object(cp, js, path, depth, k);
        if (cJSON_GetObjectItemCaseSensitive(js, "items") || cJSON_GetObjectItemCaseSensitive(js, "minItems") ||
            cJSON_GetObjectItemCaseSensitive(js, "maxItems"))
            return compile_array(cp, js, path, depth, k);
        cp->g->n[k].kind = DJ__G_ANYOF;
        if (!(cp->g->n[k].alts = dj_malloc(sizeof(int32_t)))) return dj_fail(DJ_ENOMEM, "out of memory");
        cp->g->n[k].alts[0] = DJ__G_N_ANY;
        cp->g->n[k].n_alts = 1;
        return DJ_OK;
    }
    if (cJSON_IsString(type)) return compile_type(cp, js, type->valuestring, path, depth, k);
    const int nt = cJSON_IsArray(type) ? cJSON_GetArraySize(type) : 0;
    if (nt == 0) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'type' must be a string or a non-empty list", path);
    int32_t *alts = dj_calloc((size_t)nt, sizeof *alts);
    if (!alts) return dj_fail(DJ_ENOMEM, "out of memory");
    cp->g->n[k].kind = DJ__G_ANYOF;
    cp->g->n[k].alts = alts;
    int i = 0;
    for (const cJSON *t = type->child; t; t = t->next, i++) {
        if (!cJSON_IsString(t)) return dj_fail(DJ_EINVAL, "JSON schema at %s: 'type' lists a non-string", path);
        int32_t child;
        if ((st = new_node(cp->g, DJ__G_ANYOF, &child)) != DJ_OK) return st;
        cp->g->n[k].alts[i] = child;
        cp->g->n[k].n_alts = (uint32_t)i + 1;
        if ((st = compile_type(cp, js, t->valuestring, path, depth, child)) != DJ_OK) return st;
    }
    return DJ_OK;
}

/* ---- shortest values ---- */

static uint32_t sadd(uint32_t a, uint32_t b) {
    const uint64_t s = (uint64_t)a + b;
    return s > DJ__G_INF ? DJ__G_INF : (uint32_t)s;
}

static uint32_t smul(uint32_t a, uint32_t b) {
    const uint64_t s = (uint64_t)a * b;
    return s > DJ__G_INF ? DJ__G_INF : (uint32_t)s;
}

/* A written property's bytes: "name":value */
static uint32_t entry_len(const dj_grammar_t *g, const dj__g_node *n, uint32_t k) {
    return sadd(n->name_len[k] + 3, g->n[n->prop[k]].minlen);
}

static uint32_t node_minlen(const dj_grammar_t *g, const dj__g_node *n) {
    switch (n->kind) {
    case DJ__G_STRING: return 2;
    case DJ__G_NUMBER:
    case DJ__G_INTEGER: return 1;
    case DJ__G_LITS: {
        uint32_t m = DJ__G_INF;
        for (uint32_t i = 0; i < n->n_lits; i++)
            if (n->lit_len[i] < m) m = n->lit_len[i];
        return m;
    }
    case DJ__G_ANYOF: {
        uint32_t m = DJ__G_INF;
        for (uint32_t i = 0; i < n->n_alts; i++)
            if (g->n[n->alts[i]].minlen < m) m = g->n[n->alts[i]].minlen;
        return m;
    }
    case DJ__G_ARRAY:
        if (n->min_items == 0) return 2;
        return sadd(2 + n->min_items - 1, smul(n->min_items, g->n[n->items].minlen));
    case DJ__G_OBJECT: {
        if (n->free_obj) return 2;
        uint32_t m = 2, k = 0;
        for (uint32_t i = 0; i < n->n_props; i++)
            if (n->required >> i & 1) m = sadd(m, entry_len(g, n, i)), k++;
        return sadd(m, k ? k - 1 : 0);
    }
    }
    return DJ__G_INF;
}

dj_status dj_grammar_from_json_schema(const char *schema, size_t len, dj_grammar_t **out) {
    *out = NULL;
    if (!schema) return dj_fail(DJ_EINVAL, "JSON schema: NULL");
    cJSON *js = cJSON_ParseWithLength(schema, len);
    if (!js) return dj_fail(DJ_EINVAL, "JSON schema: not valid JSON");
    compiler cp = {0};
    dj_grammar_t *g = dj_calloc(1, sizeof *g);
    dj_status st = g ? DJ_OK : dj_fail(DJ_ENOMEM, "out of memory");
    cp.g = g;
    int32_t k;
    /* the built-in nodes: any value (anyOf the free ones), free object and
     * array, string, number, true/false/null; the root */
    for (int i = 0; st == DJ_OK && i <= DJ__G_N_ROOT; i++) st = new_node(g, DJ__G_ANYOF, &k);
    if (st == DJ_OK) {
        static const char *const words[] = {"false", "null", "true"};
        g->n[DJ__G_N_FREE_OBJ].kind = DJ__G_OBJECT;
        g->n[DJ__G_N_FREE_OBJ].free_obj = true;
        g->n[DJ__G_N_FREE_ARR].kind = DJ__G_ARRAY;
        g->n[DJ__G_N_STR].kind = DJ__G_STRING;
        g->n[DJ__G_N_NUM].kind = DJ__G_NUMBER;
        st = words_node(g, DJ__G_N_WORDS, words, 3);
    }
    if (st == DJ_OK) {
        dj__g_node *any = &g->n[DJ__G_N_ANY];
        if (!(any->alts = dj_malloc(5 * sizeof *any->alts))) st = dj_fail(DJ_ENOMEM, "out of memory");
        else {
            for (int i = 0; i < 5; i++) any->alts[i] = DJ__G_N_FREE_OBJ + i;
            any->n_alts = 5;
        }
    }
    if (st == DJ_OK && cJSON_IsObject(js)) {
        cp.defs[0] = cJSON_GetObjectItemCaseSensitive(js, "$defs");
        cp.defs[1] = cJSON_GetObjectItemCaseSensitive(js, "definitions");
        for (int i = 0; i < 2 && st == DJ_OK; i++)
            if (cp.defs[i] && !cJSON_IsObject(cp.defs[i]))
                st = dj_fail(DJ_EINVAL, "JSON schema: '%s' must be an object", i ? "definitions" : "$defs");
    }
    if (st == DJ_OK) st = compile(&cp, js, "#", 0, DJ__G_N_ROOT, &k); /* paths: #.properties.a.items ... */
    /* unreachable definitions are not compiled: what is never used is not checked */
    if (st == DJ_OK) {
        for (uint32_t i = 0; i < g->n_nodes; i++) g->n[i].minlen = DJ__G_INF;
        for (bool changed = true; changed;) {
            changed = false;
            for (uint32_t i = 0; i < g->n_nodes; i++) {
                const uint32_t m = node_minlen(g, &g->n[i]);
                if (m < g->n[i].minlen) g->n[i].minlen = m, changed = true;
            }
        }
        if (g->n[DJ__G_N_ROOT].minlen >= DJ__G_INF)
            st = dj_fail(DJ_EINVAL, "JSON schema: it admits no finite value (a required '$ref' cycle, or 'minItems' "
                                    "of items that admit none)");
    }
    cJSON_Delete(js);
    free(cp.slots);
    if (st != DJ_OK) {
        dj_grammar_free(g);
        return st;
    }
    *out = g;
    return DJ_OK;
}

/* ---- the matcher ---- */

enum { O_OPEN, O_KEY, O_KEYF, O_COLON, O_VALUE, O_AFTER, O_NEXT };
enum { A_OPEN, A_ITEM, A_AFTER };
enum { S_BODY, S_ESC, S_HEX };
enum { N_SIGN, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

typedef struct outbuf {
    dj__g_stack *s; /* [DJ__G_TMP] */
    uint32_t n;
} outbuf;

static bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

static void stack_copy(dj__g_stack *dst, const dj__g_stack *src) {
    dst->depth = src->depth;
    memcpy(dst->f, src->f, src->depth * sizeof src->f[0]);
}

static void emit(outbuf *o, const dj__g_stack *s) {
    if (o->n < DJ__G_TMP) stack_copy(&o->s[o->n++], s);
}

static bool push(dj__g_stack *s, dj__g_frame f) {
    if (s->depth == DJ_GRAMMAR_MAX_DEPTH) return false;
    s->f[s->depth++] = f;
    return true;
}

static dj__g_frame value_frame(int32_t node) { return (dj__g_frame){.node = node, .type = DJ__F_VALUE}; }

/* The top frame is done: pop it, the parent moves on. */
static void child_done(dj__g_stack *s) {
    s->depth--;
    if (!s->depth) return;
    dj__g_frame *p = &s->f[s->depth - 1];
    p->ws = 0;
    if (p->type == DJ__F_OBJ) p->phase = p->phase == O_KEYF ? O_COLON : O_AFTER;
    else if (p->type == DJ__F_ARR) p->phase = A_AFTER;
}

static bool num_accepting(uint8_t phase) { return phase == N_ZERO || phase == N_INT || phase == N_FRAC || phase == N_EXP; }

/* LIT: whether some literal of [lo, hi] is exactly pos bytes, and whether some is longer. */
static void lit_ends(const dj__g_node *n, const dj__g_frame *f, bool *exact, bool *longer) {
    *exact = *longer = false;
    for (uint32_t i = f->a; i <= f->b; i++) {
        if (n->lit_len[i] == f->c) *exact = true;
        if (n->lit_len[i] > f->c) *longer = true;
    }
}

/* Whether an object may take another key (one it has not written). */
static bool obj_more(const dj__g_node *n, const dj__g_frame *f) {
    return n->free_obj || (n->n_props < 64 ? f->seen != (1ull << n->n_props) - 1 : f->seen != UINT64_MAX);
}

static void feed(const dj_grammar_t *g, dj__g_stack *s, uint8_t c, outbuf *o, int hops);

/* A frame that cannot take c but may end here: it ends, its parent takes c. */
static void end_then(const dj_grammar_t *g, dj__g_stack *s, uint8_t c, outbuf *o, int hops) {
    child_done(s);
    if (s->depth) feed(g, s, c, o, hops + 1);
}

/* hops: frames entered without taking c (anyOf forks, ends): a bound on
 * left recursion through '$ref' ("anyOf": [{"$ref": "#"}, ...]). */
static void feed(const dj_grammar_t *g, dj__g_stack *s, uint8_t c, outbuf *o, int hops) {
    if (!s->depth || hops > 2 * DJ_GRAMMAR_MAX_DEPTH) return; /* a whole value: nothing follows */
    dj__g_frame *f = &s->f[s->depth - 1];
    const dj__g_node *n = &g->n[f->node];
    switch ((dj__f_type)f->type) {
    case DJ__F_VALUE:
        if (is_ws(c)) {
            if (f->ws < DJ_GRAMMAR_MAX_WS) f->ws++, emit(o, s);
            return;
        }
        switch (n->kind) {
        case DJ__G_ANYOF:
            for (uint32_t i = 0; i < n->n_alts && o->n < DJ__G_TMP; i++) {
                if (g->n[n->alts[i]].minlen >= DJ__G_INF) continue; /* it has no value to write */
                dj__g_stack t;
                stack_copy(&t, s);
                t.f[t.depth - 1].node = n->alts[i];
                feed(g, &t, c, o, hops + 1);
            }
            return;
        case DJ__G_OBJECT:
            if (c == '{') *f = (dj__g_frame){.node = f->node, .type = DJ__F_OBJ, .phase = O_OPEN}, emit(o, s);
            return;
        case DJ__G_ARRAY:
            if (c == '[') *f = (dj__g_frame){.node = f->node, .type = DJ__F_ARR, .phase = A_OPEN}, emit(o, s);
            return;
        case DJ__G_STRING:
            if (c == '"') *f = (dj__g_frame){.node = f->node, .type = DJ__F_STR, .phase = S_BODY}, emit(o, s);
            return;
        case DJ__G_NUMBER:
        case DJ__G_INTEGER:
            if (c != '-' && !is_digit(c)) return;
            *f = (dj__g_frame){.node = f->node, .type = DJ__F_NUM, .a = 1,
                               .phase = c == '-' ? N_SIGN : c == '0' ? N_ZERO : N_INT};
            emit(o, s);
            return;
        case DJ__G_LITS:
            *f = (dj__g_frame){.node = f->node, .type = DJ__F_LIT, .a = 0, .b = n->n_lits - 1, .c = 0};
            feed(g, s, c, o, hops + 1);
            return;
        }
        return;
    case DJ__F_LIT: {
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint32_t i = f->a; i <= f->b; i++)
            if (n->lit_len[i] > f->c && (uint8_t)n->lits[i][f->c] == c) {
                if (lo == UINT32_MAX) lo = i;
                hi = i;
            }
        if (lo == UINT32_MAX) {
            bool exact, longer;
            lit_ends(n, f, &exact, &longer);
            if (exact) end_then(g, s, c, o, hops);
            return;
        }
        f->a = lo, f->b = hi, f->c++;
        bool exact, longer;
        lit_ends(n, f, &exact, &longer);
        if (exact && !longer) child_done(s);
        emit(o, s);
        return;
    }
    case DJ__F_STR:
        if (f->phase == S_ESC) {
            if (c == 'u') f->phase = S_HEX, f->b = 4;
            else if (strchr("\"\\/bfnrt", c) && c) f->phase = S_BODY;
            else return;
            emit(o, s);
            return;
        }
        if (f->phase == S_HEX) {
            if (!is_digit(c) && !(c >= 'a' && c <= 'f') && !(c >= 'A' && c <= 'F')) return;
            if (--f->b == 0) f->phase = S_BODY;
            emit(o, s);
            return;
        }
        if (f->a) { /* a continuation byte; the first after some leads is narrower (no overlongs, surrogates) */
            uint8_t lo = 0x80, hi = 0xbf;
            if (f->lead == 0xe0) lo = 0xa0;
            else if (f->lead == 0xed) hi = 0x9f;
            else if (f->lead == 0xf0) lo = 0x90;
            else if (f->lead == 0xf4) hi = 0x8f;
            if (c < lo || c > hi) return;
            f->a--;
            f->lead = 0;
            emit(o, s);
            return;
        }
        if (c == '"') {
            child_done(s);
            emit(o, s);
            return;
        }
        if (c == '\\') f->phase = S_ESC;
        else if (c < 0x20) return;
        else if (c >= 0x80) {
            if (c >= 0xc2 && c <= 0xdf) f->a = 1;
            else if (c >= 0xe0 && c <= 0xef) f->a = 2;
            else if (c >= 0xf0 && c <= 0xf4) f->a = 3;
            else return;
            f->lead = c;
        }
        emit(o, s);
        return;
    case DJ__F_NUM: {
        const bool integer = n->kind == DJ__G_INTEGER, acc = num_accepting(f->phase);
        const bool room = f->a < DJ_GRAMMAR_MAX_NUMBER, room_more = f->a + 3 < DJ_GRAMMAR_MAX_NUMBER;
        int next = -1;
        switch (f->phase) {
        case N_SIGN: next = c == '0' ? N_ZERO : is_digit(c) ? N_INT : -1; break;
        case N_ZERO:
        case N_INT:
        case N_FRAC:
            if (is_digit(c) && f->phase != N_ZERO) next = room ? f->phase : -1;
            else if (c == '.' && f->phase != N_FRAC && !integer && room_more) next = N_DOT;
            else if ((c == 'e' || c == 'E') && !integer && room_more) next = N_E;
            break;
        case N_DOT: next = is_digit(c) ? N_FRAC : -1; break;
        case N_E: next = c == '+' || c == '-' ? N_ESIGN : is_digit(c) ? N_EXP : -1; break;
        case N_ESIGN: next = is_digit(c) ? N_EXP : -1; break;
        case N_EXP: next = is_digit(c) && room ? N_EXP : -1; break;
        }
        if (next < 0) {
            if (acc) end_then(g, s, c, o, hops);
            return;
        }
        f->phase = (uint8_t)next;
        f->a++;
        if (num_accepting(f->phase) && f->a >= DJ_GRAMMAR_MAX_NUMBER) child_done(s);
        emit(o, s);
        return;
    }
    case DJ__F_ARR:
        if (is_ws(c) && f->phase != A_ITEM) {
            if (f->ws < DJ_GRAMMAR_MAX_WS) f->ws++, emit(o, s);
            return;
        }
        f->ws = 0;
        if (f->phase == A_OPEN) {
            if (c == ']') {
                if (n->min_items == 0) child_done(s), emit(o, s);
                return;
            }
            if (n->max_items == 0) return;
            f->phase = A_ITEM;
            f->a = 1;
            if (push(s, value_frame(n->items))) feed(g, s, c, o, hops + 1);
            return;
        }
        if (f->phase == A_AFTER) {
            if (c == ']' && f->a >= n->min_items) child_done(s), emit(o, s);
            if (c == ',' && f->a < n->max_items) {
                f->phase = A_ITEM;
                f->a++;
                if (push(s, value_frame(n->items))) emit(o, s);
            }
        }
        return;
    case DJ__F_OBJ:
        if (is_ws(c) && f->phase != O_KEY && f->phase != O_KEYF && f->phase != O_VALUE) {
            if (f->ws < DJ_GRAMMAR_MAX_WS) f->ws++, emit(o, s);
            return;
        }
        switch (f->phase) {
        case O_OPEN:
        case O_NEXT:
            f->ws = 0;
            if (c == '}' && f->phase == O_OPEN) {
                if (!(n->required & ~f->seen)) child_done(s), emit(o, s);
                return;
            }
            if (c != '"' || !obj_more(n, f)) return;
            if (n->free_obj) {
                f->phase = O_KEYF;
                if (push(s, (dj__g_frame){.node = DJ__G_N_STR, .type = DJ__F_STR, .phase = S_BODY})) emit(o, s);
                return;
            }
            f->phase = O_KEY, f->a = 0, f->b = n->n_props - 1, f->c = 0;
            emit(o, s);
            return;
        case O_KEY: {
            if (c == '"') {
                for (uint32_t i = f->a; i <= f->b; i++)
                    if (n->name_len[i] == f->c && !(f->seen >> i & 1)) {
                        f->seen |= 1ull << i;
                        f->a = i;
                        f->phase = O_COLON;
                        f->ws = 0;
                        emit(o, s);
                        return;
                    }
                return;
            }
            uint32_t lo = UINT32_MAX, hi = 0;
            bool fresh = false;
            for (uint32_t i = f->a; i <= f->b; i++)
                if (n->name_len[i] > f->c && (uint8_t)n->names[i][f->c] == c) {
                    if (lo == UINT32_MAX) lo = i;
                    hi = i;
                    fresh = fresh || !(f->seen >> i & 1);
                }
            if (!fresh) return;
            f->a = lo, f->b = hi, f->c++;
            emit(o, s);
            return;
        }
        case O_COLON:
            if (c != ':') return;
            f->phase = O_VALUE;
            if (push(s, value_frame(n->free_obj ? DJ__G_N_ANY : n->prop[f->a]))) emit(o, s);
            return;
        case O_AFTER:
            f->ws = 0;
            if (c == '}' && !(n->required & ~f->seen)) child_done(s), emit(o, s);
            if (c == ',' && obj_more(n, f)) f->phase = O_NEXT, emit(o, s);
            return;
        }
        return;
    }
}

void dj__grammar_state_init(dj_grammar_state_t *st, const dj_grammar_t *g) {
    st->g = g;
    st->n = 1;
    st->s[0].depth = 1;
    st->s[0].f[0] = value_frame(DJ__G_N_ROOT);
}

void dj__grammar_state_copy(dj_grammar_state_t *dst, const dj_grammar_state_t *src) {
    dst->g = src->g;
    dst->n = src->n;
    for (uint32_t i = 0; i < src->n; i++) stack_copy(&dst->s[i], &src->s[i]);
}

bool dj__grammar_feed_byte(dj_grammar_state_t *st, uint8_t c, dj__g_stack *tmp) {
    outbuf o = {.s = tmp, .n = 0};
    for (uint32_t i = 0; i < st->n; i++) {
        dj__g_stack w;
        stack_copy(&w, &st->s[i]);
        feed(st->g, &w, c, &o, 0);
    }
    st->n = 0;
    for (uint32_t i = 0; i < o.n && st->n < DJ__G_MAX_ALT; i++) stack_copy(&st->s[st->n++], &o.s[i]);
    return st->n > 0;
}

dj_status dj_grammar_state_new(const dj_grammar_t *g, dj_grammar_state_t **out) {
    *out = NULL;
    dj_grammar_state_t *s = dj_malloc(sizeof *s);
    if (!s) return dj_fail(DJ_ENOMEM, "out of memory");
    dj__grammar_state_init(s, g);
    *out = s;
    return DJ_OK;
}

void dj_grammar_state_free(dj_grammar_state_t *s) { free(s); }

bool dj_grammar_feed(dj_grammar_state_t *s, const char *bytes, size_t n) {
    dj__g_stack *tmp = dj_malloc(DJ__G_TMP * sizeof *tmp);
    if (!tmp) {
        s->n = 0;
        return false;
    }
    for (size_t i = 0; i < n && s->n; i++) dj__grammar_feed_byte(s, (uint8_t)bytes[i], tmp);
    free(tmp);
    return s->n > 0;
}

/* ---- completion cost ---- */

/* What an object still needs after the keys in seen (required ones left, each with its comma), and '}'. */
static uint32_t obj_rest(const dj_grammar_t *g, const dj__g_node *n, uint64_t seen) {
    uint32_t m = 1;
    for (uint32_t i = 0; i < n->n_props; i++)
        if ((n->required & ~seen) >> i & 1) m = sadd(m, sadd(1, entry_len(g, n, i)));
    return m;
}

/* What key i, from byte pos of its name, costs with the rest of the object. */
static uint32_t key_cost(const dj_grammar_t *g, const dj__g_node *n, uint64_t seen, uint32_t i, uint32_t pos) {
    return sadd(sadd(n->name_len[i] - pos + 2, g->n[n->prop[i]].minlen), obj_rest(g, n, seen | 1ull << i));
}

static uint32_t frame_cost(const dj_grammar_t *g, const dj__g_frame *f) {
    const dj__g_node *n = &g->n[f->node];
    switch ((dj__f_type)f->type) {
    case DJ__F_VALUE: return n->minlen;
    case DJ__F_STR: return f->phase == S_BODY ? f->a + 1 : f->phase == S_ESC ? 2 : f->b + 1;
    case DJ__F_NUM: return num_accepting(f->phase) ? 0 : 1;
    case DJ__F_LIT: {
        uint32_t m = DJ__G_INF;
        for (uint32_t i = f->a; i <= f->b; i++)
            if (n->lit_len[i] >= f->c && n->lit_len[i] - f->c < m) m = n->lit_len[i] - f->c;
        return m;
    }
    case DJ__F_ARR: {
        const uint32_t item = g->n[n->items].minlen;
        if (f->phase == A_OPEN)
            return n->min_items == 0 ? 1 : sadd(n->min_items, smul(n->min_items, item)); /* items, commas, ']' */
        const uint32_t left = n->min_items > f->a ? n->min_items - f->a : 0;
        return sadd(1, smul(left, sadd(1, item)));
    }
    case DJ__F_OBJ:
        if (n->free_obj) {
            static const uint32_t free_cost[] = {[O_OPEN] = 1, [O_KEYF] = 3, [O_COLON] = 3, [O_VALUE] = 1,
                                                 [O_AFTER] = 1, [O_NEXT] = 5};
            return free_cost[f->phase];
        }
        switch (f->phase) {
        case O_OPEN: {
            uint32_t m = 1, k = 0;
            for (uint32_t i = 0; i < n->n_props; i++)
                if (n->required >> i & 1) m = sadd(m, entry_len(g, n, i)), k++;
            return sadd(m, k ? k - 1 : 0);
        }
        case O_KEY: {
            uint32_t m = DJ__G_INF;
            for (uint32_t i = f->a; i <= f->b; i++)
                if (!(f->seen >> i & 1) && n->name_len[i] >= f->c) {
                    const uint32_t x = key_cost(g, n, f->seen, i, f->c);
                    if (x < m) m = x;
                }
            return m;
        }
        case O_COLON: return sadd(sadd(1, g->n[n->prop[f->a]].minlen), obj_rest(g, n, f->seen));
        case O_VALUE:
        case O_AFTER: return obj_rest(g, n, f->seen);
        case O_NEXT: {
            uint32_t m = DJ__G_INF;
            for (uint32_t i = 0; i < n->n_props; i++)
                if (!(f->seen >> i & 1)) {
                    const uint32_t x = sadd(1, key_cost(g, n, f->seen, i, 0)); /* the opening quote */
                    if (x < m) m = x;
                }
            return m;
        }
        }
        return DJ__G_INF;
    }
    return DJ__G_INF;
}

uint32_t dj_grammar_cost(const dj_grammar_state_t *s) {
    uint32_t best = UINT32_MAX;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t m = 0;
        for (uint32_t d = 0; d < s->s[i].depth; d++) m = sadd(m, frame_cost(s->g, &s->s[i].f[d]));
        if (m < best) best = m;
    }
    return best;
}

bool dj_grammar_complete(const dj_grammar_state_t *s) { return s->n && dj_grammar_cost(s) == 0; }

bool dj_grammar_finished(const dj_grammar_state_t *s) {
    for (uint32_t i = 0; i < s->n; i++)
        if (s->s[i].depth == 0) return true;
    return false;
}
