/* jinja_eval.c: renders a parsed chat template - Python-like values (str()
 * and repr() as Python prints them, json.dumps for tojson), Jinja's scoping
 * (a for loop's sets stay in the loop; namespace() crosses it), filters,
 * tests, methods and globals, all bounded by output, step and memory limits. */
#include <ctype.h>
#include "djinn/alloc.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "model/jinja_impl.h"

#define MAX_OUT ((size_t)16 << 20)
#define MAX_STEPS 10000000ull
#define MAX_ARENA ((size_t)256 << 20)

/* ---- render state ---- */
typedef struct scope {
    struct scope *parent;
    dj__jdict vars;
} scope;

typedef struct rctx {
    dj__arena a;
    char *out;
    size_t n, cap;
    uint64_t steps;
    scope *sc;
    const dj__jdict *globals;
} rctx;

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;   /* past MAX_ARENA, or nomem */
    bool nomem; /* a realloc failed */
    bool gen; /* a generator was printed: Python would print its address */
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        if (cap > MAX_ARENA) {
            b->oom = true;
            return;
        }
        char *p = dj_realloc(b->p, cap);
        if (!p) {
            b->oom = b->nomem = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_fmt(sbuf *b, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0) sb_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

static dj_status err(int line, const char *fmt, ...) {
    char msg[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dj_fail(DJ_EINVAL, "chat template line %d: %s", line, msg);
}
/* An allocation refused: past the render's budget (the template's doing), or
 * no memory to be had (the machine's: r->a.nomem). */
static dj_status oom(const rctx *r) {
    if (r->a.nomem) return dj_fail(DJ_ENOMEM, "out of memory rendering a chat template");
    return dj_fail(DJ_ERANGE, "chat template: render needs more than %zu MiB", MAX_ARENA >> 20);
}
static dj_status gen_printed(void) {
    return dj_fail(DJ_EINVAL, "chat template: a select/reject result (a generator) is printed - jinja2 prints its "
                              "address; add '| list'");
}

static const char *kind_name(dj__jval_kind k) {
    static const char *const n[] = {"undefined", "none", "bool",      "int",      "float",
                                    "str",       "list", "dict",      "namespace", "generator"};
    return n[k];
}

static dj__jval mkstr(rctx *r, const char *s, size_t n, bool *ok) {
    char *p = dj__arena_alloc(&r->a, n + 1);
    if (!p) {
        *ok = false;
        return (dj__jval){.k = JV_NONE};
    }
    memcpy(p, s, n);
    return (dj__jval){.k = JV_STR, .u.s = {p, n}};
}

/* sbuf contents into an arena string; the sbuf is freed. */
static dj_status sb_val(rctx *r, sbuf *b, dj__jval *out) {
    if (b->oom || b->gen) {
        free(b->p);
        if (b->nomem) return dj_fail(DJ_ENOMEM, "out of memory rendering a chat template");
        return b->oom ? oom(r) : gen_printed();
    }
    bool ok = true;
    *out = mkstr(r, b->p ? b->p : "", b->n, &ok);
    free(b->p);
    return ok ? DJ_OK : oom(r);
}

static dj__jlist *mklist(rctx *r, size_t n) {
    dj__jlist *l = dj__arena_alloc(&r->a, sizeof *l);
    if (!l) return NULL;
    l->n = n;
    if (n && !(l->v = dj__arena_alloc(&r->a, n * sizeof *l->v))) return NULL;
    return l;
}

static dj__jval *dict_get(const dj__jdict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->key_len[i] == n && !memcmp(d->key[i], k, n)) return &d->v[i];
    return NULL;
}

static bool dict_set(dj__arena *a, dj__jdict *d, const char *k, size_t n, dj__jval v) {
    dj__jval *have = dict_get(d, k, n);
    if (have) {
        *have = v;
        return true;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 8;
        const char **nk = dj__arena_alloc(a, cap * sizeof *nk);
        size_t *nl = dj__arena_alloc(a, cap * sizeof *nl);
        dj__jval *nv = dj__arena_alloc(a, cap * sizeof *nv);
        if (!nk || !nl || !nv) return false;
        if (d->n) {
            memcpy(nk, d->key, d->n * sizeof *nk);
            memcpy(nl, d->key_len, d->n * sizeof *nl);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->key = nk;
        d->key_len = nl;
        d->v = nv;
        d->cap = cap;
    }
    char *kc = dj__arena_alloc(a, n + 1);
    if (!kc) return false;
    memcpy(kc, k, n);
    d->key[d->n] = kc;
    d->key_len[d->n] = n;
    d->v[d->n] = v;
    d->n++;
    return true;
}

/* ---- JSON in ---- */
static dj_status from_json(rctx *r, const cJSON *j, dj__jval *out) {
    if (cJSON_IsNull(j)) *out = (dj__jval){.k = JV_NONE};
    else if (cJSON_IsBool(j)) *out = (dj__jval){.k = JV_BOOL, .u.b = cJSON_IsTrue(j)};
    else if (cJSON_IsNumber(j)) {
        const double x = j->valuedouble;
        /* cJSON keeps no text: integral values within 2^53 are ints */
        if (x == floor(x) && fabs(x) < 9007199254740992.0) *out = (dj__jval){.k = JV_INT, .u.i = (int64_t)x};
        else *out = (dj__jval){.k = JV_FLOAT, .u.f = x};
    } else if (cJSON_IsString(j)) {
        bool ok = true;
        *out = mkstr(r, j->valuestring, strlen(j->valuestring), &ok);
        if (!ok) return oom(r);
    } else if (cJSON_IsArray(j)) {
        dj__jlist *l = mklist(r, (size_t)cJSON_GetArraySize(j));
        if (!l) return oom(r);
        size_t i = 0;
        for (const cJSON *c = j->child; c; c = c->next) {
            dj_status st = from_json(r, c, &l->v[i++]);
            if (st != DJ_OK) return st;
        }
        *out = (dj__jval){.k = JV_LIST, .u.l = l};
    } else if (cJSON_IsObject(j)) {
        dj__jdict *d = dj__arena_alloc(&r->a, sizeof *d);
        if (!d) return oom(r);
        for (const cJSON *c = j->child; c; c = c->next) {
            dj__jval v;
            dj_status st = from_json(r, c, &v);
            if (st != DJ_OK) return st;
            if (!dict_set(&r->a, d, c->string, strlen(c->string), v)) return oom(r);
        }
        *out = (dj__jval){.k = JV_DICT, .u.d = d};
    } else {
        return dj_fail(DJ_EFORMAT, "chat template variables: unreadable JSON value");
    }
    return DJ_OK;
}

/* ---- Python's str(), repr() and json.dumps ---- */
static void put_float(sbuf *b, double x) {
    if (isnan(x) || isinf(x)) {
        sb_str(b, isnan(x) ? "nan" : x < 0 ? "-inf" : "inf");
        return;
    }
    char tmp[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        if (strtod(tmp, NULL) == x) break;
    }
    /* tmp: [-]d[.ddd]e[+-]XX */
    char digits[24];
    size_t nd = 0;
    const char *p = tmp;
    bool neg = *p == '-';
    if (neg) p++;
    for (; *p && *p != 'e'; p++)
        if (isdigit((unsigned char)*p)) digits[nd++] = *p;
    int e = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) sb_put(b, "-", 1);
    if (e >= -4 && e < 16) {
        if (e < 0) {
            sb_put(b, "0.", 2);
            for (int k = 0; k < -e - 1; k++) sb_put(b, "0", 1);
            sb_put(b, digits, nd);
        } else {
            for (int k = 0; k <= e; k++) sb_put(b, k < (int)nd ? &digits[k] : "0", 1);
            sb_put(b, ".", 1);
            if ((int)nd > e + 1) sb_put(b, digits + e + 1, nd - (size_t)e - 1);
            else sb_put(b, "0", 1);
        }
    } else {
        sb_put(b, digits, 1);
        if (nd > 1) {
            sb_put(b, ".", 1);
            sb_put(b, digits + 1, nd - 1);
        }
        sb_fmt(b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

static void put_repr(sbuf *b, const dj__jval *v);

static void put_str(sbuf *b, const dj__jval *v) {
    switch (v->k) {
    case JV_UNDEF: break;
    case JV_NONE: sb_str(b, "None"); break;
    case JV_BOOL: sb_str(b, v->u.b ? "True" : "False"); break;
    case JV_INT: sb_fmt(b, "%lld", (long long)v->u.i); break;
    case JV_FLOAT: put_float(b, v->u.f); break;
    case JV_STR: sb_put(b, v->u.s.p, v->u.s.n); break;
    default: put_repr(b, v);
    }
}

static void put_str_repr(sbuf *b, const char *s, size_t n) {
    const bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    const char q = has_sq && !has_dq ? '"' : '\'';
    sb_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') sb_str(b, "\\\\");
        else if (c == (unsigned char)q) sb_fmt(b, "\\%c", q);
        else if (c == '\n') sb_str(b, "\\n");
        else if (c == '\r') sb_str(b, "\\r");
        else if (c == '\t') sb_str(b, "\\t");
        else if (c < 0x20 || c == 0x7f) sb_fmt(b, "\\x%02x", c);
        else sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, &q, 1);
}

static void put_repr(sbuf *b, const dj__jval *v) {
    switch (v->k) {
    case JV_STR: put_str_repr(b, v->u.s.p, v->u.s.n); break;
    case JV_LIST:
        sb_put(b, v->u.l->tuple ? "(" : "[", 1);
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) sb_put(b, ", ", 2);
            put_repr(b, &v->u.l->v[i]);
        }
        if (v->u.l->tuple && v->u.l->n == 1) sb_put(b, ",", 1);
        sb_put(b, v->u.l->tuple ? ")" : "]", 1);
        break;
    case JV_DICT:
        sb_put(b, "{", 1);
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i) sb_put(b, ", ", 2);
            put_str_repr(b, v->u.d->key[i], v->u.d->key_len[i]);
            sb_put(b, ": ", 2);
            put_repr(b, &v->u.d->v[i]);
        }
        sb_put(b, "}", 1);
        break;
    case JV_NS: sb_str(b, "<Namespace>"); break;
    case JV_UNDEF: sb_str(b, "Undefined"); break;
    case JV_GEN: b->gen = true; break;
    default: put_str(b, v);
    }
}

static void put_json_str(sbuf *b, const char *s, size_t n) {
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') sb_str(b, "\\\"");
        else if (c == '\\') sb_str(b, "\\\\");
        else if (c == '\n') sb_str(b, "\\n");
        else if (c == '\r') sb_str(b, "\\r");
        else if (c == '\t') sb_str(b, "\\t");
        else if (c == '\b') sb_str(b, "\\b");
        else if (c == '\f') sb_str(b, "\\f");
        else if (c < 0x20) sb_fmt(b, "\\u%04x", c);
        else sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, "\"", 1);
}

static void put_indent(sbuf *b, int indent, int level) {
    sb_put(b, "\n", 1);
    for (int i = 0; i < indent * level; i++) sb_put(b, " ", 1);
}

/* json.dumps(v, ensure_ascii=False, indent=indent): indent < 0 is None. */
static bool put_json(sbuf *b, const dj__jval *v, int indent, int level) {
    switch (v->k) {
    case JV_NONE: sb_str(b, "null"); return true;
    case JV_BOOL: sb_str(b, v->u.b ? "true" : "false"); return true;
    case JV_INT: sb_fmt(b, "%lld", (long long)v->u.i); return true;
    case JV_FLOAT:
        if (isnan(v->u.f)) sb_str(b, "NaN");
        else if (isinf(v->u.f)) sb_str(b, v->u.f < 0 ? "-Infinity" : "Infinity");
        else put_float(b, v->u.f);
        return true;
    case JV_STR: put_json_str(b, v->u.s.p, v->u.s.n); return true;
    case JV_LIST:
        if (!v->u.l->n) {
            sb_str(b, "[]");
            return true;
        }
        sb_put(b, "[", 1);
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i) sb_put(b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
            if (indent >= 0) put_indent(b, indent, level + 1);
            if (!put_json(b, &v->u.l->v[i], indent, level + 1)) return false;
        }
        if (indent >= 0) put_indent(b, indent, level);
        sb_put(b, "]", 1);
        return true;
    case JV_DICT:
        if (!v->u.d->n) {
            sb_str(b, "{}");
            return true;
        }
        sb_put(b, "{", 1);
        for (size_t i = 0; i < v->u.d->n; i++) {
            if (i) sb_put(b, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2);
            if (indent >= 0) put_indent(b, indent, level + 1);
            put_json_str(b, v->u.d->key[i], v->u.d->key_len[i]);
            sb_put(b, ": ", 2);
            if (!put_json(b, &v->u.d->v[i], indent, level + 1)) return false;
        }
        if (indent >= 0) put_indent(b, indent, level);
        sb_put(b, "}", 1);
        return true;
    default: return false; /* undefined, namespace: not JSON */
    }
}

/* ---- truth, equality, order ---- */
static bool truthy(const dj__jval *v) {
    switch (v->k) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v->u.b;
    case JV_INT: return v->u.i != 0;
    case JV_FLOAT: return v->u.f != 0.0;
    case JV_STR: return v->u.s.n != 0;
    case JV_LIST: return v->u.l->n != 0;
    case JV_DICT: return v->u.d->n != 0;
    default: return true;
    }
}

static bool is_num(const dj__jval *v) { return v->k == JV_INT || v->k == JV_FLOAT || v->k == JV_BOOL; }
static double num(const dj__jval *v) {
    return v->k == JV_FLOAT ? v->u.f : v->k == JV_INT ? (double)v->u.i : (double)v->u.b;
}
static int64_t inum(const dj__jval *v) { return v->k == JV_INT ? v->u.i : v->k == JV_BOOL ? (int64_t)v->u.b : 0; }

static bool equal(const dj__jval *a, const dj__jval *b) {
    if (is_num(a) && is_num(b)) {
        if (a->k != JV_FLOAT && b->k != JV_FLOAT) return inum(a) == inum(b);
        return num(a) == num(b);
    }
    if (a->k != b->k) return false;
    switch (a->k) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a->u.s.n == b->u.s.n && !memcmp(a->u.s.p, b->u.s.p, a->u.s.n);
    case JV_LIST:
        if (a->u.l->n != b->u.l->n) return false;
        for (size_t i = 0; i < a->u.l->n; i++)
            if (!equal(&a->u.l->v[i], &b->u.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a->u.d->n != b->u.d->n) return false;
        for (size_t i = 0; i < a->u.d->n; i++) {
            const dj__jval *o = dict_get(b->u.d, a->u.d->key[i], a->u.d->key_len[i]);
            if (!o || !equal(&a->u.d->v[i], o)) return false;
        }
        return true;
    case JV_GEN: return a->u.l == b->u.l;
    default: return a->u.d == b->u.d;
    }
}

/* -1/0/1 into *c; false when the two cannot be ordered. */
static bool order(const dj__jval *a, const dj__jval *b, int *c) {
    if (is_num(a) && is_num(b)) {
        if (a->k != JV_FLOAT && b->k != JV_FLOAT) *c = (inum(a) > inum(b)) - (inum(a) < inum(b));
        else *c = (num(a) > num(b)) - (num(a) < num(b));
        return true;
    }
    if (a->k == JV_STR && b->k == JV_STR) {
        size_t n = a->u.s.n < b->u.s.n ? a->u.s.n : b->u.s.n;
        int k = memcmp(a->u.s.p, b->u.s.p, n);
        *c = k ? (k > 0) - (k < 0) : (a->u.s.n > b->u.s.n) - (a->u.s.n < b->u.s.n);
        return true;
    }
    if (a->k == JV_LIST && b->k == JV_LIST) {
        for (size_t i = 0; i < a->u.l->n && i < b->u.l->n; i++) {
            if (equal(&a->u.l->v[i], &b->u.l->v[i])) continue;
            return order(&a->u.l->v[i], &b->u.l->v[i], c);
        }
        *c = (a->u.l->n > b->u.l->n) - (a->u.l->n < b->u.l->n);
        return true;
    }
    return false;
}

/* ---- strings: code points and Python's whitespace ---- */
static size_t utf8_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}
/* Byte offsets of the n_cp code points of s, plus n at [n_cp]. */
static size_t *utf8_offsets(rctx *r, const char *s, size_t n, size_t *n_cp) {
    size_t k = utf8_count(s, n);
    size_t *off = dj__arena_alloc(&r->a, (k + 1) * sizeof *off);
    if (!off) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xc0) != 0x80) off[j++] = i;
    off[k] = n;
    *n_cp = k;
    return off;
}
static bool py_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f); }

static bool in_chars(unsigned char c, const dj__jval *chars) {
    if (!chars) return py_space(c);
    return memchr(chars->u.s.p, c, chars->u.s.n) != NULL;
}
/* strip/lstrip/rstrip (which: 3 both, 1 left, 2 right) with ASCII chars. */
static dj__jval strip(const dj__jval *s, const dj__jval *chars, int which) {
    const char *p = s->u.s.p;
    size_t n = s->u.s.n;
    if (which & 1)
        while (n && in_chars((unsigned char)*p, chars)) p++, n--;
    if (which & 2)
        while (n && in_chars((unsigned char)p[n - 1], chars)) n--;
    return (dj__jval){.k = JV_STR, .u.s = {p, n}};
}

static dj_status to_str(rctx *r, const dj__jval *v, dj__jval *out) {
    if (v->k == JV_STR) {
        *out = *v;
        return DJ_OK;
    }
    sbuf b = {0};
    put_str(&b, v);
    return sb_val(r, &b, out);
}

static dj_status change_case(rctx *r, const dj__jval *s, int mode /* 0 upper 1 lower 2 title 3 capitalize */,
                             dj__jval *out) {
    bool ok = true;
    *out = mkstr(r, s->u.s.p, s->u.s.n, &ok);
    if (!ok) return oom(r);
    char *p = (char *)out->u.s.p;
    bool prev_cased = false;
    for (size_t i = 0; i < s->u.s.n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (mode == 0) p[i] = (char)toupper(c);
        else if (mode == 1) p[i] = (char)tolower(c);
        else if (mode == 2) {
            p[i] = (char)(prev_cased ? tolower(c) : toupper(c));
            prev_cased = isalpha(c) != 0;
        } else p[i] = (char)(i == 0 ? toupper(c) : tolower(c));
    }
    return DJ_OK;
}

/* ---- evaluation ---- */
static dj_status eval(rctx *r, const dj__jexpr *e, dj__jval *out);

static dj__jval *lookup(rctx *r, const char *name) {
    const size_t n = strlen(name);
    for (scope *s = r->sc; s; s = s->parent) {
        dj__jval *v = dict_get(&s->vars, name, n);
        if (v) return v;
    }
    return dict_get(r->globals, name, n);
}

/* Positional or keyword argument `pos`/`name` of a call, evaluated; *have
 * false when absent. */
static dj_status arg(rctx *r, const dj__jexpr *e, size_t pos, const char *name, dj__jval *out, bool *have) {
    *have = false;
    if (pos < e->n_args) {
        *have = true;
        return eval(r, e->args[pos], out);
    }
    for (size_t i = 0; name && i < e->n_kw; i++)
        if (!strcmp(e->kw_names[i], name)) {
            *have = true;
            return eval(r, e->kw[i], out);
        }
    return DJ_OK;
}

static dj_status want_str(const dj__jexpr *e, const char *what, const dj__jval *v) {
    if (v->k == JV_STR) return DJ_OK;
    return err(e->line, "%s wants a string, got %s", what, kind_name(v->k));
}

static bool norm_index(int64_t i, size_t n, size_t *out);

/* A generator's one pass: a second is refused (jinja2 would find it spent,
 * and only part of it where the first pass stopped early). */
static dj_status use_gen(const dj__jval *v, int line) {
    if (v->k != JV_GEN) return DJ_OK;
    if (v->u.l->used)
        return err(line, "a select/reject result (a generator) is used a second time - jinja2 finds it spent; add "
                         "'| list' where it is made");
    v->u.l->used = true;
    return DJ_OK;
}

/* What iterating v yields, as a list: a list's items, a dict's keys, a
 * string's characters, a generator's items (its one pass), nothing for
 * undefined. */
static dj_status iter_items(rctx *r, const dj__jval *v, int line, dj__jlist **out) {
    dj__jlist *items = NULL;
    dj_status st;
    if (v->k == JV_LIST) items = v->u.l;
    else if (v->k == JV_GEN) {
        if ((st = use_gen(v, line)) != DJ_OK) return st;
        items = v->u.l;
    } else if (v->k == JV_UNDEF) items = mklist(r, 0);
    else if (v->k == JV_DICT) {
        if (!(items = mklist(r, v->u.d->n))) return oom(r);
        for (size_t i = 0; i < v->u.d->n; i++)
            items->v[i] = (dj__jval){.k = JV_STR, .u.s = {v->u.d->key[i], v->u.d->key_len[i]}};
    } else if (v->k == JV_STR) {
        size_t n_cp;
        size_t *off = utf8_offsets(r, v->u.s.p, v->u.s.n, &n_cp);
        if (!off || !(items = mklist(r, n_cp))) return oom(r);
        for (size_t i = 0; i < n_cp; i++)
            items->v[i] = (dj__jval){.k = JV_STR, .u.s = {v->u.s.p + off[i], off[i + 1] - off[i]}};
    } else {
        return err(line, "cannot iterate over %s%s", v->k == JV_NONE ? "" : "a ", kind_name(v->k));
    }
    if (!items) return oom(r);
    *out = items;
    return DJ_OK;
}

/* a[b] as jinja2's sandbox looks it up: a dict's key, a list's or string's
 * index, undefined for anything else (a missing key, an index out of range,
 * any subscript of none or of a generator). */
static dj_status get_item(rctx *r, const dj__jval *a_, const dj__jval *b_, dj__jval *out) {
    const dj__jval av = *a_, bv = *b_, *a = &av, *b = &bv; /* out may be either */
    *out = (dj__jval){.k = JV_UNDEF};
    if ((a->k == JV_DICT || a->k == JV_NS) && b->k == JV_STR) {
        const dj__jval *v = dict_get(a->u.d, b->u.s.p, b->u.s.n);
        if (v) *out = *v;
    } else if (a->k == JV_LIST && (b->k == JV_INT || b->k == JV_BOOL)) {
        size_t i;
        if (norm_index(inum(b), a->u.l->n, &i)) *out = a->u.l->v[i];
    } else if (a->k == JV_STR && (b->k == JV_INT || b->k == JV_BOOL)) {
        size_t n_cp, i;
        size_t *off = utf8_offsets(r, a->u.s.p, a->u.s.n, &n_cp);
        if (!off) return oom(r);
        if (norm_index(inum(b), n_cp, &i))
            *out = (dj__jval){.k = JV_STR, .u.s = {a->u.s.p + off[i], off[i + 1] - off[i]}};
    }
    return DJ_OK;
}

static dj_status split(rctx *r, const dj__jexpr *e, const dj__jval *s, const dj__jval *sep, int64_t maxsplit,
                       dj__jval *out) {
    /* count, then fill */
    size_t cap = s->u.s.n + 2;
    dj__jlist *l = mklist(r, cap);
    if (!l) return oom(r);
    size_t n = 0;
    const char *p = s->u.s.p, *end = p + s->u.s.n;
    if (!sep) {
        for (;;) {
            while (p < end && py_space((unsigned char)*p)) p++;
            if (p == end) break;
            const char *q = p;
            if (maxsplit >= 0 && (int64_t)n == maxsplit) q = end;
            else
                while (q < end && !py_space((unsigned char)*q)) q++;
            if (maxsplit >= 0 && (int64_t)n == maxsplit)
                while (q > p && py_space((unsigned char)q[-1])) q--;
            l->v[n++] = (dj__jval){.k = JV_STR, .u.s = {p, (size_t)(q - p)}};
            p = q;
        }
    } else {
        if (sep->u.s.n == 0) return err(e->line, "split: empty separator");
        for (;;) {
            const char *q = NULL;
            if (maxsplit < 0 || (int64_t)n < maxsplit)
                for (const char *x = p; x + sep->u.s.n <= end; x++)
                    if (!memcmp(x, sep->u.s.p, sep->u.s.n)) {
                        q = x;
                        break;
                    }
            if (!q) {
                l->v[n++] = (dj__jval){.k = JV_STR, .u.s = {p, (size_t)(end - p)}};
                break;
            }
            l->v[n++] = (dj__jval){.k = JV_STR, .u.s = {p, (size_t)(q - p)}};
            p = q + sep->u.s.n;
        }
    }
    l->n = n;
    *out = (dj__jval){.k = JV_LIST, .u.l = l};
    return DJ_OK;
}

static dj_status replace(rctx *r, const dj__jexpr *e, const dj__jval *s, const dj__jval *old, const dj__jval *new_,
                         int64_t count, dj__jval *out) {
    if (old->u.s.n == 0) return err(e->line, "replace with an empty pattern is not supported");
    sbuf b = {0};
    const char *p = s->u.s.p, *end = p + s->u.s.n;
    int64_t done = 0;
    while (p < end) {
        if ((count < 0 || done < count) && (size_t)(end - p) >= old->u.s.n && !memcmp(p, old->u.s.p, old->u.s.n)) {
            sb_put(&b, new_->u.s.p, new_->u.s.n);
            p += old->u.s.n;
            done++;
        } else {
            sb_put(&b, p++, 1);
        }
    }
    return sb_val(r, &b, out);
}

static bool has_prefix(const dj__jval *s, const dj__jval *x, bool suffix) {
    if (x->u.s.n > s->u.s.n) return false;
    return !memcmp(s->u.s.p + (suffix ? s->u.s.n - x->u.s.n : 0), x->u.s.p, x->u.s.n);
}

static dj_status call_method(rctx *r, const dj__jexpr *e, dj__jval *out) {
    const char *m = e->a->name;
    dj__jval self;
    dj_status st = eval(r, e->a->a, &self);
    if (st != DJ_OK) return st;
    dj__jval a0 = {0}, a1 = {0}, a2 = {0};
    bool h0, h1, h2;
    if ((st = arg(r, e, 0, NULL, &a0, &h0)) != DJ_OK || (st = arg(r, e, 1, NULL, &a1, &h1)) != DJ_OK ||
        (st = arg(r, e, 2, NULL, &a2, &h2)) != DJ_OK)
        return st;
    if (self.k == JV_DICT || self.k == JV_NS) {
        const dj__jdict *d = self.u.d;
        if (!strcmp(m, "get")) {
            if (!h0 || a0.k != JV_STR) return err(e->line, "get wants a string key");
            const dj__jval *v = dict_get(d, a0.u.s.p, a0.u.s.n);
            *out = v ? *v : h1 ? a1 : (dj__jval){.k = JV_NONE};
            return DJ_OK;
        }
        const int which = !strcmp(m, "items") ? 0 : !strcmp(m, "keys") ? 1 : !strcmp(m, "values") ? 2 : -1;
        if (which >= 0) {
            dj__jlist *l = mklist(r, d->n);
            if (!l) return oom(r);
            for (size_t i = 0; i < d->n; i++) {
                dj__jval k = {.k = JV_STR, .u.s = {d->key[i], d->key_len[i]}};
                if (which == 0) {
                    dj__jlist *pair = mklist(r, 2);
                    if (!pair) return oom(r);
                    pair->tuple = true;
                    pair->v[0] = k;
                    pair->v[1] = d->v[i];
                    l->v[i] = (dj__jval){.k = JV_LIST, .u.l = pair};
                } else {
                    l->v[i] = which == 1 ? k : d->v[i];
                }
            }
            *out = (dj__jval){.k = JV_LIST, .u.l = l};
            return DJ_OK;
        }
        return err(e->line, "a dict has no method '%s'", m);
    }
    if (self.k != JV_STR) return err(e->line, "%s has no method '%s'", kind_name(self.k), m);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        const bool suffix = m[0] == 'e';
        if (!h0) return err(e->line, "%s wants an argument", m);
        bool yes = false;
        if (a0.k == JV_STR) yes = has_prefix(&self, &a0, suffix);
        else if (a0.k == JV_LIST) {
            for (size_t i = 0; i < a0.u.l->n; i++) {
                if (a0.u.l->v[i].k != JV_STR) return err(e->line, "%s wants strings", m);
                yes = yes || has_prefix(&self, &a0.u.l->v[i], suffix);
            }
        } else return err(e->line, "%s wants a string", m);
        *out = (dj__jval){.k = JV_BOOL, .u.b = yes};
        return DJ_OK;
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        if (h0 && a0.k != JV_NONE && (st = want_str(e, m, &a0)) != DJ_OK) return st;
        *out = strip(&self, h0 && a0.k == JV_STR ? &a0 : NULL, m[0] == 's' ? 3 : m[0] == 'l' ? 1 : 2);
        return DJ_OK;
    }
    if (!strcmp(m, "split")) {
        if (h0 && a0.k != JV_NONE && (st = want_str(e, m, &a0)) != DJ_OK) return st;
        if (h1 && a1.k != JV_INT) return err(e->line, "split: maxsplit wants an int");
        return split(r, e, &self, h0 && a0.k == JV_STR ? &a0 : NULL, h1 ? a1.u.i : -1, out);
    }
    if (!strcmp(m, "upper")) return change_case(r, &self, 0, out);
    if (!strcmp(m, "lower")) return change_case(r, &self, 1, out);
    if (!strcmp(m, "title")) return change_case(r, &self, 2, out);
    if (!strcmp(m, "capitalize")) return change_case(r, &self, 3, out);
    if (!strcmp(m, "replace")) {
        if (!h0 || !h1 || a0.k != JV_STR || a1.k != JV_STR) return err(e->line, "replace wants two strings");
        if (h2 && a2.k != JV_INT) return err(e->line, "replace: count wants an int");
        return replace(r, e, &self, &a0, &a1, h2 ? a2.u.i : -1, out);
    }
    if (!strcmp(m, "find")) {
        if (!h0 || a0.k != JV_STR) return err(e->line, "find wants a string");
        int64_t at = -1;
        for (size_t i = 0; i + a0.u.s.n <= self.u.s.n; i++)
            if (!memcmp(self.u.s.p + i, a0.u.s.p, a0.u.s.n)) {
                at = (int64_t)utf8_count(self.u.s.p, i);
                break;
            }
        *out = (dj__jval){.k = JV_INT, .u.i = at};
        return DJ_OK;
    }
    if (!strcmp(m, "join")) {
        if (!h0 || a0.k != JV_LIST) return err(e->line, "join wants a list");
        sbuf b = {0};
        for (size_t i = 0; i < a0.u.l->n; i++) {
            if (a0.u.l->v[i].k != JV_STR) {
                free(b.p);
                return err(e->line, "join: item %zu is %s, not a string", i, kind_name(a0.u.l->v[i].k));
            }
            if (i) sb_put(&b, self.u.s.p, self.u.s.n);
            sb_put(&b, a0.u.l->v[i].u.s.p, a0.u.l->v[i].u.s.n);
        }
        return sb_val(r, &b, out);
    }
    return err(e->line, "a string has no method '%s'", m);
}

static dj_status call_global(rctx *r, const dj__jexpr *e, dj__jval *out) {
    const char *f = e->a->name;
    dj_status st;
    if (!strcmp(f, "raise_exception")) {
        dj__jval msg = {0};
        bool have;
        if ((st = arg(r, e, 0, NULL, &msg, &have)) != DJ_OK) return st;
        sbuf b = {0};
        put_str(&b, &msg);
        st = dj_fail(DJ_EINVAL, "chat template raised an error: %s", b.p ? b.p : "");
        free(b.p);
        return st;
    }
    if (!strcmp(f, "namespace")) {
        dj__jdict *d = dj__arena_alloc(&r->a, sizeof *d);
        if (!d) return oom(r);
        for (size_t i = 0; i < e->n_args; i++) {
            dj__jval v;
            if ((st = eval(r, e->args[i], &v)) != DJ_OK) return st;
            if (v.k != JV_DICT) return err(e->line, "namespace() takes keyword arguments or a dict");
            for (size_t k = 0; k < v.u.d->n; k++)
                if (!dict_set(&r->a, d, v.u.d->key[k], v.u.d->key_len[k], v.u.d->v[k])) return oom(r);
        }
        for (size_t i = 0; i < e->n_kw; i++) {
            dj__jval v;
            if ((st = eval(r, e->kw[i], &v)) != DJ_OK) return st;
            if (!dict_set(&r->a, d, e->kw_names[i], strlen(e->kw_names[i]), v)) return oom(r);
        }
        *out = (dj__jval){.k = JV_NS, .u.d = d};
        return DJ_OK;
    }
    if (!strcmp(f, "range")) {
        int64_t a[3] = {0, 0, 1};
        if (e->n_args < 1 || e->n_args > 3 || e->n_kw) return err(e->line, "range takes 1 to 3 integers");
        for (size_t i = 0; i < e->n_args; i++) {
            dj__jval v;
            if ((st = eval(r, e->args[i], &v)) != DJ_OK) return st;
            if (v.k != JV_INT && v.k != JV_BOOL) return err(e->line, "range takes integers");
            a[i] = inum(&v);
        }
        int64_t start = e->n_args == 1 ? 0 : a[0], stop = e->n_args == 1 ? a[0] : a[1], step = a[2];
        if (step == 0) return err(e->line, "range: step must not be zero");
        if ((start < -(INT64_C(1) << 40)) || start > (INT64_C(1) << 40) || stop < -(INT64_C(1) << 40) ||
            stop > (INT64_C(1) << 40))
            return dj_fail(DJ_ERANGE, "chat template line %d: range too large", e->line);
        int64_t n = step > 0 ? (stop - start + step - 1) / step : (start - stop - step - 1) / -step;
        if (n < 0) n = 0;
        if (n > 1000000) return dj_fail(DJ_ERANGE, "chat template line %d: range of %lld items", e->line, (long long)n);
        dj__jlist *l = mklist(r, (size_t)n);
        if (!l) return oom(r);
        for (int64_t i = 0; i < n; i++) l->v[i] = (dj__jval){.k = JV_INT, .u.i = start + i * step};
        *out = (dj__jval){.k = JV_LIST, .u.l = l};
        return DJ_OK;
    }
    if (!strcmp(f, "strftime_now")) {
        dj__jval fmt = {0};
        bool have;
        if ((st = arg(r, e, 0, NULL, &fmt, &have)) != DJ_OK) return st;
        if (!have || fmt.k != JV_STR || fmt.u.s.n > 200) return err(e->line, "strftime_now wants a format string");
        char fbuf[256], buf[512];
        memcpy(fbuf, fmt.u.s.p, fmt.u.s.n);
        fbuf[fmt.u.s.n] = '\0';
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof buf, fbuf, &tm);
        bool ok = true;
        *out = mkstr(r, buf, n, &ok);
        return ok ? DJ_OK : oom(r);
    }
    return err(e->line, "unknown function '%s'", f);
}

static dj_status select_reject(rctx *r, const dj__jexpr *e, const dj__jval *v, dj__jval *out);

static dj_status apply_filter(rctx *r, const dj__jexpr *e, dj__jval *v, dj__jval *out) {
    const char *f = e->name;
    dj_status st;
    dj__jval a0 = {0}, a1 = {0};
    bool h0, h1;
    if (!strncmp(f, "select", 6) || !strncmp(f, "reject", 6)) return select_reject(r, e, v, out);
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        if ((st = arg(r, e, 0, "default_value", &a0, &h0)) != DJ_OK ||
            (st = arg(r, e, 1, "boolean", &a1, &h1)) != DJ_OK)
            return st;
        const bool use = v->k == JV_UNDEF || (h1 && truthy(&a1) && !truthy(v));
        *out = use ? (h0 ? a0 : (dj__jval){.k = JV_STR, .u.s = {"", 0}}) : *v;
        return DJ_OK;
    }
    if (!strcmp(f, "safe")) {
        *out = *v;
        return DJ_OK;
    }
    if (!strcmp(f, "tojson")) {
        if ((st = arg(r, e, 0, "indent", &a0, &h0)) != DJ_OK) return st;
        for (size_t i = 0; i < e->n_kw; i++)
            if (strcmp(e->kw_names[i], "indent")) return err(e->line, "tojson: option '%s' is not supported", e->kw_names[i]);
        int indent = -1;
        if (h0 && a0.k != JV_NONE) {
            if (a0.k != JV_INT || a0.u.i < 0 || a0.u.i > 16) return err(e->line, "tojson: indent wants 0..16");
            indent = (int)a0.u.i;
        }
        sbuf b = {0};
        if (!put_json(&b, v, indent, 0)) {
            free(b.p);
            return err(e->line, "tojson: a %s value is not JSON", kind_name(v->k));
        }
        return sb_val(r, &b, out);
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        int64_t n;
        if (v->k == JV_STR) n = (int64_t)utf8_count(v->u.s.p, v->u.s.n);
        else if (v->k == JV_LIST) n = (int64_t)v->u.l->n;
        else if (v->k == JV_DICT || v->k == JV_NS) n = (int64_t)v->u.d->n;
        else if (v->k == JV_UNDEF) n = 0;
        else return err(e->line, "length of a %s", kind_name(v->k));
        *out = (dj__jval){.k = JV_INT, .u.i = n};
        return DJ_OK;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        const bool last = f[0] == 'l';
        if (v->k == JV_GEN && !last) { /* next(iter(g)): the first of what is left */
            if ((st = use_gen(v, e->line)) != DJ_OK) return st;
            *out = v->u.l->n ? v->u.l->v[0] : (dj__jval){.k = JV_UNDEF};
            return DJ_OK;
        }
        if (v->k == JV_LIST) {
            *out = v->u.l->n ? v->u.l->v[last ? v->u.l->n - 1 : 0] : (dj__jval){.k = JV_UNDEF};
            return DJ_OK;
        }
        if (v->k == JV_STR) {
            size_t n_cp;
            size_t *off = utf8_offsets(r, v->u.s.p, v->u.s.n, &n_cp);
            if (!off) return oom(r);
            if (!n_cp) *out = (dj__jval){.k = JV_UNDEF};
            else {
                size_t i = last ? n_cp - 1 : 0;
                *out = (dj__jval){.k = JV_STR, .u.s = {v->u.s.p + off[i], off[i + 1] - off[i]}};
            }
            return DJ_OK;
        }
        return err(e->line, "%s of a %s", f, kind_name(v->k));
    }
    if (!strcmp(f, "join")) {
        if ((st = arg(r, e, 0, "d", &a0, &h0)) != DJ_OK) return st;
        if (h0 && a0.k != JV_STR) return err(e->line, "join: separator wants a string");
        if (v->k != JV_LIST && v->k != JV_GEN) return err(e->line, "join of a %s", kind_name(v->k));
        if ((st = use_gen(v, e->line)) != DJ_OK) return st;
        sbuf b = {0};
        for (size_t i = 0; i < v->u.l->n; i++) {
            if (i && h0) sb_put(&b, a0.u.s.p, a0.u.s.n);
            put_str(&b, &v->u.l->v[i]);
        }
        return sb_val(r, &b, out);
    }
    if (!strcmp(f, "string")) return to_str(r, v, out);
    if (!strcmp(f, "trim") || !strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") ||
        !strcmp(f, "capitalize")) {
        dj__jval s;
        if ((st = to_str(r, v, &s)) != DJ_OK) return st;
        if (f[0] == 't' && f[1] == 'r') {
            if ((st = arg(r, e, 0, "chars", &a0, &h0)) != DJ_OK) return st;
            if (h0 && a0.k != JV_NONE && a0.k != JV_STR) return err(e->line, "trim: chars wants a string");
            *out = strip(&s, h0 && a0.k == JV_STR ? &a0 : NULL, 3);
            return DJ_OK;
        }
        return change_case(r, &s, f[0] == 'u' ? 0 : f[0] == 'l' ? 1 : f[0] == 't' ? 2 : 3, out);
    }
    if (!strcmp(f, "int")) {
        if (v->k == JV_INT) *out = *v;
        else if (v->k == JV_BOOL) *out = (dj__jval){.k = JV_INT, .u.i = v->u.b};
        else if (v->k == JV_FLOAT && fabs(v->u.f) < 9.2e18) *out = (dj__jval){.k = JV_INT, .u.i = (int64_t)v->u.f};
        else if (v->k == JV_STR) {
            char buf[64];
            size_t n = v->u.s.n < 63 ? v->u.s.n : 63;
            memcpy(buf, v->u.s.p, n);
            buf[n] = '\0';
            char *end;
            double x = strtod(buf, &end);
            *out = (dj__jval){.k = JV_INT, .u.i = end != buf && fabs(x) < 9.2e18 ? (int64_t)x : 0};
        } else *out = (dj__jval){.k = JV_INT, .u.i = 0};
        return DJ_OK;
    }
    if (!strcmp(f, "float")) {
        if (is_num(v)) *out = (dj__jval){.k = JV_FLOAT, .u.f = num(v)};
        else if (v->k == JV_STR) {
            char buf[64];
            size_t n = v->u.s.n < 63 ? v->u.s.n : 63;
            memcpy(buf, v->u.s.p, n);
            buf[n] = '\0';
            *out = (dj__jval){.k = JV_FLOAT, .u.f = strtod(buf, NULL)};
        } else *out = (dj__jval){.k = JV_FLOAT, .u.f = 0.0};
        return DJ_OK;
    }
    if (!strcmp(f, "abs")) {
        if (v->k == JV_INT) *out = (dj__jval){.k = JV_INT, .u.i = v->u.i < 0 ? -v->u.i : v->u.i};
        else if (v->k == JV_FLOAT) *out = (dj__jval){.k = JV_FLOAT, .u.f = fabs(v->u.f)};
        else return err(e->line, "abs of a %s", kind_name(v->k));
        return DJ_OK;
    }
    if (!strcmp(f, "list") || !strcmp(f, "reverse") || !strcmp(f, "items")) {
        if (!strcmp(f, "items")) { /* a generator of (key, value) tuples in jinja2 */
            if (v->k == JV_UNDEF) {
                *out = (dj__jval){.k = JV_GEN, .u.l = mklist(r, 0)};
                return out->u.l ? DJ_OK : oom(r);
            }
            if (v->k != JV_DICT && v->k != JV_NS) return err(e->line, "items of a %s", kind_name(v->k));
            dj__jlist *l = mklist(r, v->u.d->n);
            if (!l) return oom(r);
            for (size_t i = 0; i < v->u.d->n; i++) {
                dj__jlist *pair = mklist(r, 2);
                if (!pair) return oom(r);
                pair->tuple = true;
                pair->v[0] = (dj__jval){.k = JV_STR, .u.s = {v->u.d->key[i], v->u.d->key_len[i]}};
                pair->v[1] = v->u.d->v[i];
                l->v[i] = (dj__jval){.k = JV_LIST, .u.l = pair};
            }
            *out = (dj__jval){.k = JV_GEN, .u.l = l};
            return DJ_OK;
        }
        const bool rev = f[0] == 'r';
        if (v->k == JV_STR) {
            size_t n_cp;
            size_t *off = utf8_offsets(r, v->u.s.p, v->u.s.n, &n_cp);
            if (!off) return oom(r);
            if (rev) {
                sbuf b = {0};
                for (size_t i = n_cp; i-- > 0;) sb_put(&b, v->u.s.p + off[i], off[i + 1] - off[i]);
                return sb_val(r, &b, out);
            }
            dj__jlist *l = mklist(r, n_cp);
            if (!l) return oom(r);
            for (size_t i = 0; i < n_cp; i++)
                l->v[i] = (dj__jval){.k = JV_STR, .u.s = {v->u.s.p + off[i], off[i + 1] - off[i]}};
            *out = (dj__jval){.k = JV_LIST, .u.l = l};
            return DJ_OK;
        }
        size_t n;
        if (v->k == JV_LIST || v->k == JV_GEN) n = v->u.l->n;
        else if (v->k == JV_DICT || v->k == JV_NS) n = v->u.d->n;
        else return err(e->line, "%s of a %s", f, kind_name(v->k));
        if ((st = use_gen(v, e->line)) != DJ_OK) return st;
        dj__jlist *l = mklist(r, n);
        if (!l) return oom(r);
        for (size_t i = 0; i < n; i++) {
            size_t j = rev ? n - 1 - i : i;
            l->v[i] = v->k == JV_LIST || v->k == JV_GEN ? v->u.l->v[j]
                                      : (dj__jval){.k = JV_STR, .u.s = {v->u.d->key[j], v->u.d->key_len[j]}};
        }
        *out = (dj__jval){.k = JV_LIST, .u.l = l};
        return DJ_OK;
    }
    if (!strcmp(f, "replace")) {
        dj__jval a2 = {0};
        bool h2;
        if ((st = arg(r, e, 0, "old", &a0, &h0)) != DJ_OK || (st = arg(r, e, 1, "new", &a1, &h1)) != DJ_OK ||
            (st = arg(r, e, 2, "count", &a2, &h2)) != DJ_OK)
            return st;
        if (!h0 || !h1 || a0.k != JV_STR || a1.k != JV_STR) return err(e->line, "replace wants two strings");
        dj__jval s;
        if ((st = to_str(r, v, &s)) != DJ_OK) return st;
        return replace(r, e, &s, &a0, &a1, h2 && a2.k == JV_INT ? a2.u.i : -1, out);
    }
    return err(e->line, "unknown filter '%s'", f);
}

/* Test t of v with its argument a0 (h0: given), on line `line`. */
static dj_status run_test(int line, const char *t, const dj__jval *v, const dj__jval *a0_, bool h0, bool *out) {
    const dj__jval a0 = *a0_;
    if (!strcmp(t, "defined")) *out = v->k != JV_UNDEF;
    else if (!strcmp(t, "undefined")) *out = v->k == JV_UNDEF;
    else if (!strcmp(t, "none")) *out = v->k == JV_NONE;
    else if (!strcmp(t, "string")) *out = v->k == JV_STR;
    else if (!strcmp(t, "number")) *out = is_num(v);
    else if (!strcmp(t, "integer")) *out = v->k == JV_INT;
    else if (!strcmp(t, "float")) *out = v->k == JV_FLOAT;
    else if (!strcmp(t, "boolean")) *out = v->k == JV_BOOL;
    else if (!strcmp(t, "true")) *out = v->k == JV_BOOL && v->u.b;
    else if (!strcmp(t, "false")) *out = v->k == JV_BOOL && !v->u.b;
    else if (!strcmp(t, "mapping")) *out = v->k == JV_DICT;
    else if (!strcmp(t, "iterable"))
        *out = v->k == JV_STR || v->k == JV_LIST || v->k == JV_DICT || v->k == JV_UNDEF || v->k == JV_GEN;
    else if (!strcmp(t, "sequence")) *out = v->k == JV_STR || v->k == JV_LIST || v->k == JV_DICT;
    else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v->k != JV_STR) return err(line, "test %s of a %s", t, kind_name(v->k));
        bool cased = false, ok = true;
        for (size_t i = 0; i < v->u.s.n; i++) {
            unsigned char c = (unsigned char)v->u.s.p[i];
            if (isalpha(c)) {
                cased = true;
                if (t[0] == 'l' ? isupper(c) : islower(c)) ok = false;
            }
        }
        *out = cased && ok;
    } else if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        if (v->k != JV_INT && v->k != JV_BOOL) return err(line, "test %s of a %s", t, kind_name(v->k));
        int64_t x = inum(v), d = 2;
        if (t[0] == 'd') {
            if (!h0 || (a0.k != JV_INT) || a0.u.i == 0) return err(line, "divisibleby wants a nonzero int");
            d = a0.u.i;
        }
        int64_t m = d == -1 ? 0 : x % d;
        *out = t[0] == 'o' ? m != 0 : m == 0;
    } else if (!strcmp(t, "eq") || !strcmp(t, "equalto")) {
        if (!h0) return err(line, "test %s wants an argument", t);
        *out = equal(v, &a0);
    } else if (!strcmp(t, "sameas")) {
        if (!h0) return err(line, "test sameas wants an argument");
        *out = (v->k == JV_NONE || v->k == JV_BOOL) ? equal(v, &a0) && v->k == a0.k
                                                    : v->k == a0.k && v->k >= JV_LIST && v->u.d == a0.u.d;
    } else return err(line, "unknown test '%s'", t);
    return DJ_OK;
}

static dj_status apply_test(rctx *r, const dj__jexpr *e, const dj__jval *v, bool *out) {
    dj__jval a0 = {0};
    bool h0;
    dj_status st = arg(r, e, 0, NULL, &a0, &h0);
    if (st == DJ_OK) st = run_test(e->line, e->name, v, &a0, h0, out);
    if (st == DJ_OK && e->negate) *out = !*out;
    return st;
}

/* select(test, arg), reject(...), selectattr(attr, test, arg), rejectattr(...):
 * the items whose value (the item, or its attribute - dotted parts, digits
 * index) passes the test (is true with no test named), or fails it for
 * reject; a generator, as jinja2 returns. */
static dj_status select_reject(rctx *r, const dj__jexpr *e, const dj__jval *v, dj__jval *out) {
    const char *f = e->name;
    const bool by_attr = strstr(f, "attr") != NULL, reject = f[0] == 'r';
    if (e->n_kw) return err(e->line, "%s: keyword arguments are not supported", f);
    size_t at = 0;
    dj__jval attr = {0}, test = {0}, targ = {0};
    dj_status st;
    if (by_attr) {
        if (e->n_args < 1) return err(e->line, "%s: missing the attribute name", f);
        if ((st = eval(r, e->args[0], &attr)) != DJ_OK) return st;
        if (attr.k != JV_STR && attr.k != JV_INT) return err(e->line, "%s: the attribute wants a string", f);
        at = 1;
    }
    char name[32] = "";
    if (e->n_args > at) {
        if ((st = eval(r, e->args[at], &test)) != DJ_OK) return st;
        if (test.k != JV_STR || test.u.s.n >= sizeof name) return err(e->line, "%s: the test wants a name", f);
        memcpy(name, test.u.s.p, test.u.s.n);
        name[test.u.s.n] = '\0';
        if (!dj__jinja_test_known(name)) return err(e->line, "%s: no test named '%s'", f, name);
    }
    if (e->n_args > at + 2) return err(e->line, "%s: at most one argument for the test", f);
    if (e->n_args > at + 1 && (st = eval(r, e->args[at + 1], &targ)) != DJ_OK) return st;
    dj__jlist *items, none = {0};
    if (!truthy(v)) items = &none; /* jinja2 looks at a false value no further */
    else if ((st = iter_items(r, v, e->line, &items)) != DJ_OK) return st;
    dj__jlist *l = mklist(r, items->n);
    if (!l) return oom(r);
    l->n = 0;
    for (size_t i = 0; i < items->n; i++) {
        dj__jval x = items->v[i];
        if (by_attr && attr.k == JV_INT) {
            if (x.k == JV_UNDEF) return err(e->line, "%s: an attribute of an undefined value", f);
            if ((st = get_item(r, &x, &attr, &x)) != DJ_OK) return st;
        } else if (by_attr) { /* "a.b.0": each part in turn, digits as an index */
            const char *p = attr.u.s.p, *end = p + attr.u.s.n;
            for (;;) {
                const char *dot = memchr(p, '.', (size_t)(end - p));
                const char *q = dot ? dot : end;
                dj__jval key = {.k = JV_STR, .u.s = {p, (size_t)(q - p)}};
                bool digits = q > p && q - p < 19;
                for (const char *c = p; c < q && digits; c++) digits = *c >= '0' && *c <= '9';
                if (digits) key = (dj__jval){.k = JV_INT, .u.i = strtoll(p, NULL, 10)};
                if (x.k == JV_UNDEF) return err(e->line, "%s: an attribute of an undefined value", f);
                if ((st = get_item(r, &x, &key, &x)) != DJ_OK) return st;
                if (!dot) break;
                p = dot + 1;
            }
        }
        bool pass;
        if (!name[0]) pass = truthy(&x);
        else if ((st = run_test(e->line, name, &x, &targ, e->n_args > at + 1, &pass)) != DJ_OK) return st;
        if (pass != reject) l->v[l->n++] = items->v[i];
    }
    *out = (dj__jval){.k = JV_GEN, .u.l = l};
    return DJ_OK;
}

/* Python's index normalisation for a[i] (false when out of range). */
static bool norm_index(int64_t i, size_t n, size_t *out) {
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

static dj_status slice_bound(rctx *r, const dj__jexpr *x, bool *have, int64_t *v) {
    *have = false;
    if (!x) return DJ_OK;
    dj__jval b;
    dj_status st = eval(r, x, &b);
    if (st != DJ_OK) return st;
    if (b.k == JV_NONE) return DJ_OK;
    if (b.k != JV_INT && b.k != JV_BOOL) return err(x->line, "slice indices must be integers");
    *have = true;
    *v = inum(&b);
    return DJ_OK;
}

static dj_status do_slice(rctx *r, const dj__jexpr *e, const dj__jval *a, dj__jval *out) {
    bool hs, he, hp;
    int64_t s = 0, en = 0, step = 1;
    dj_status st;
    if ((st = slice_bound(r, e->b, &hs, &s)) != DJ_OK || (st = slice_bound(r, e->c, &he, &en)) != DJ_OK ||
        (st = slice_bound(r, e->d, &hp, &step)) != DJ_OK)
        return st;
    if (hp && step == 0) return err(e->line, "slice step cannot be zero");
    size_t n;
    size_t *off = NULL;
    if (a->k == JV_LIST) n = a->u.l->n;
    else if (a->k == JV_STR) {
        if (!(off = utf8_offsets(r, a->u.s.p, a->u.s.n, &n))) return oom(r);
    } else return err(e->line, "cannot slice a %s", kind_name(a->k));
    const int64_t len = (int64_t)n;
    /* CPython's PySlice_AdjustIndices */
    if (!hs) s = step < 0 ? len - 1 : 0;
    else if (s < 0) s = s + len < 0 ? (step < 0 ? -1 : 0) : s + len;
    else if (s >= len) s = step < 0 ? len - 1 : len;
    if (!he) en = step < 0 ? -1 : len;
    else if (en < 0) en = en + len < 0 ? (step < 0 ? -1 : 0) : en + len;
    else if (en >= len) en = step < 0 ? len - 1 : len;
    int64_t count = 0;
    if (step < 0) count = en < s ? (s - en - 1) / -step + 1 : 0;
    else count = s < en ? (en - s - 1) / step + 1 : 0;
    if (a->k == JV_LIST) {
        dj__jlist *l = mklist(r, (size_t)count);
        if (!l) return oom(r);
        for (int64_t i = 0; i < count; i++) l->v[i] = a->u.l->v[s + i * step];
        *out = (dj__jval){.k = JV_LIST, .u.l = l};
        return DJ_OK;
    }
    sbuf b = {0};
    for (int64_t i = 0; i < count; i++) {
        size_t c = (size_t)(s + i * step);
        sb_put(&b, a->u.s.p + off[c], off[c + 1] - off[c]);
    }
    return sb_val(r, &b, out);
}

static dj_status arith(rctx *r, const dj__jexpr *e, const dj__jval *a, const dj__jval *b, dj__jval *out) {
    const dj__jop op = e->op;
    if (op == JOP_CONCAT) {
        sbuf s = {0};
        put_str(&s, a);
        put_str(&s, b);
        return sb_val(r, &s, out);
    }
    if (a->k == JV_UNDEF || b->k == JV_UNDEF) return err(e->line, "an undefined value in arithmetic");
    if (is_num(a) && is_num(b)) {
        const bool ints = a->k != JV_FLOAT && b->k != JV_FLOAT;
        const int64_t x = inum(a), y = inum(b);
        const double fx = num(a), fy = num(b);
        int64_t ir = 0;
        switch (op) {
        case JOP_ADD:
            if (ints) {
                if (__builtin_add_overflow(x, y, &ir)) return err(e->line, "integer overflow");
                *out = (dj__jval){.k = JV_INT, .u.i = ir};
            } else *out = (dj__jval){.k = JV_FLOAT, .u.f = fx + fy};
            return DJ_OK;
        case JOP_SUB:
            if (ints) {
                if (__builtin_sub_overflow(x, y, &ir)) return err(e->line, "integer overflow");
                *out = (dj__jval){.k = JV_INT, .u.i = ir};
            } else *out = (dj__jval){.k = JV_FLOAT, .u.f = fx - fy};
            return DJ_OK;
        case JOP_MUL:
            if (ints) {
                if (__builtin_mul_overflow(x, y, &ir)) return err(e->line, "integer overflow");
                *out = (dj__jval){.k = JV_INT, .u.i = ir};
            } else *out = (dj__jval){.k = JV_FLOAT, .u.f = fx * fy};
            return DJ_OK;
        case JOP_DIV:
            if (fy == 0.0) return err(e->line, "division by zero");
            *out = (dj__jval){.k = JV_FLOAT, .u.f = fx / fy};
            return DJ_OK;
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (ints) {
                if (y == 0) return err(e->line, "division by zero");
                if (x == INT64_MIN && y == -1) return err(e->line, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
                *out = (dj__jval){.k = JV_INT, .u.i = op == JOP_MOD ? m : q};
            } else {
                if (fy == 0.0) return err(e->line, "division by zero");
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                *out = (dj__jval){.k = JV_FLOAT, .u.f = op == JOP_MOD ? m : floor(fx / fy)};
            }
            return DJ_OK;
        case JOP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1;
                for (int64_t k = 0; k < y; k++) {
                    if (__builtin_mul_overflow(acc, x, &acc)) return err(e->line, "integer overflow");
                    if (acc == 0 || acc == 1) break;
                }
                *out = (dj__jval){.k = JV_INT, .u.i = acc};
            } else *out = (dj__jval){.k = JV_FLOAT, .u.f = pow(fx, fy)};
            return DJ_OK;
        default: break;
        }
    }
    if (op == JOP_ADD && a->k == JV_STR && b->k == JV_STR) {
        sbuf s = {0};
        sb_put(&s, a->u.s.p, a->u.s.n);
        sb_put(&s, b->u.s.p, b->u.s.n);
        return sb_val(r, &s, out);
    }
    if (op == JOP_ADD && a->k == JV_LIST && b->k == JV_LIST) {
        dj__jlist *l = mklist(r, a->u.l->n + b->u.l->n);
        if (!l) return oom(r);
        if (a->u.l->n) memcpy(l->v, a->u.l->v, a->u.l->n * sizeof *l->v);
        if (b->u.l->n) memcpy(l->v + a->u.l->n, b->u.l->v, b->u.l->n * sizeof *l->v);
        *out = (dj__jval){.k = JV_LIST, .u.l = l};
        return DJ_OK;
    }
    if (op == JOP_MUL && ((a->k == JV_STR && b->k == JV_INT) || (a->k == JV_INT && b->k == JV_STR))) {
        const dj__jval *s = a->k == JV_STR ? a : b;
        int64_t k = a->k == JV_INT ? a->u.i : b->u.i;
        if (k > 0 && s->u.s.n && (uint64_t)k > MAX_OUT / s->u.s.n)
            return dj_fail(DJ_ERANGE, "chat template line %d: string repetition too large", e->line);
        sbuf o = {0};
        for (int64_t i = 0; i < k; i++) sb_put(&o, s->u.s.p, s->u.s.n);
        return sb_val(r, &o, out);
    }
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    return err(e->line, "unsupported operand types for %s: %s and %s", names[op], kind_name(a->k), kind_name(b->k));
}

static dj_status eval(rctx *r, const dj__jexpr *e, dj__jval *out) {
    if (++r->steps > MAX_STEPS)
        return dj_fail(DJ_ERANGE, "chat template: more than %llu evaluation steps", (unsigned long long)MAX_STEPS);
    dj_status st;
    dj__jval a, b;
    switch (e->kind) {
    case JE_LIT: *out = e->lit; return DJ_OK;
    case JE_NAME: {
        const dj__jval *v = lookup(r, e->name);
        *out = v ? *v : (dj__jval){.k = JV_UNDEF};
        return DJ_OK;
    }
    case JE_ATTR:
    case JE_INDEX: {
        if ((st = eval(r, e->a, &a)) != DJ_OK) return st;
        if (a.k == JV_UNDEF || a.k == JV_NONE) {
            if (e->kind == JE_ATTR) return err(e->line, "attribute '%s' of %s value", e->name, kind_name(a.k));
            return err(e->line, "subscript of %s value", kind_name(a.k));
        }
        if (e->kind == JE_ATTR) b = (dj__jval){.k = JV_STR, .u.s = {e->name, strlen(e->name)}};
        else if ((st = eval(r, e->b, &b)) != DJ_OK) return st;
        return get_item(r, &a, &b, out);
    }
    case JE_SLICE:
        if ((st = eval(r, e->a, &a)) != DJ_OK) return st;
        return do_slice(r, e, &a, out);
    case JE_CALL: return e->a->kind == JE_NAME ? call_global(r, e, out) : call_method(r, e, out);
    case JE_FILTER:
        if ((st = eval(r, e->a, &a)) != DJ_OK) return st;
        return apply_filter(r, e, &a, out);
    case JE_TEST: {
        if ((st = eval(r, e->a, &a)) != DJ_OK) return st;
        bool yes = false;
        if ((st = apply_test(r, e, &a, &yes)) != DJ_OK) return st;
        *out = (dj__jval){.k = JV_BOOL, .u.b = yes};
        return DJ_OK;
    }
    case JE_AND:
    case JE_OR:
        if ((st = eval(r, e->a, &a)) != DJ_OK) return st;
        if (truthy(&a) == (e->kind == JE_OR)) {
            *out = a;
            return DJ_OK;
        }
        return eval(r, e->b, out);
    case JE_NOT:
        if ((st = eval(r, e->a, &a)) != DJ_OK) return st;
        *out = (dj__jval){.k = JV_BOOL, .u.b = !truthy(&a)};
        return DJ_OK;
    case JE_NEG:
    case JE_POS:
        if ((st = eval(r, e->a, &a)) != DJ_OK) return st;
        if (!is_num(&a)) return err(e->line, "unary %c of a %s", e->kind == JE_NEG ? '-' : '+', kind_name(a.k));
        if (e->kind == JE_POS) *out = a.k == JV_BOOL ? (dj__jval){.k = JV_INT, .u.i = a.u.b} : a;
        else if (a.k == JV_FLOAT) *out = (dj__jval){.k = JV_FLOAT, .u.f = -a.u.f};
        else if (inum(&a) == INT64_MIN) return err(e->line, "integer overflow");
        else *out = (dj__jval){.k = JV_INT, .u.i = -inum(&a)};
        return DJ_OK;
    case JE_COND:
        if ((st = eval(r, e->a, &a)) != DJ_OK) return st;
        if (truthy(&a)) return eval(r, e->b, out);
        if (e->c) return eval(r, e->c, out);
        *out = (dj__jval){.k = JV_UNDEF};
        return DJ_OK;
    case JE_LIST: {
        dj__jlist *l = mklist(r, e->n_args);
        if (!l) return oom(r);
        l->tuple = e->negate; /* the parser marks tuples so */
        for (size_t i = 0; i < e->n_args; i++)
            if ((st = eval(r, e->args[i], &l->v[i])) != DJ_OK) return st;
        *out = (dj__jval){.k = JV_LIST, .u.l = l};
        return DJ_OK;
    }
    case JE_DICT: {
        dj__jdict *d = dj__arena_alloc(&r->a, sizeof *d);
        if (!d) return oom(r);
        for (size_t i = 0; i + 1 < e->n_args; i += 2) {
            if ((st = eval(r, e->args[i], &a)) != DJ_OK || (st = eval(r, e->args[i + 1], &b)) != DJ_OK) return st;
            if (a.k != JV_STR) return err(e->line, "dict keys must be strings here");
            if (!dict_set(&r->a, d, a.u.s.p, a.u.s.n, b)) return oom(r);
        }
        *out = (dj__jval){.k = JV_DICT, .u.d = d};
        return DJ_OK;
    }
    case JE_BIN:
        if ((st = eval(r, e->a, &a)) != DJ_OK || (st = eval(r, e->b, &b)) != DJ_OK) return st;
        switch (e->op) {
        case JOP_EQ:
        case JOP_NE: *out = (dj__jval){.k = JV_BOOL, .u.b = equal(&a, &b) == (e->op == JOP_EQ)}; return DJ_OK;
        case JOP_LT:
        case JOP_LE:
        case JOP_GT:
        case JOP_GE: {
            int c;
            if (!order(&a, &b, &c)) return err(e->line, "cannot order %s and %s", kind_name(a.k), kind_name(b.k));
            bool y = e->op == JOP_LT ? c < 0 : e->op == JOP_LE ? c <= 0 : e->op == JOP_GT ? c > 0 : c >= 0;
            *out = (dj__jval){.k = JV_BOOL, .u.b = y};
            return DJ_OK;
        }
        case JOP_IN:
        case JOP_NOTIN: {
            bool found = false;
            if (b.k == JV_STR) {
                if (a.k != JV_STR) return err(e->line, "'in <string>' wants a string on the left");
                for (size_t i = 0; i + a.u.s.n <= b.u.s.n && !found; i++)
                    found = !memcmp(b.u.s.p + i, a.u.s.p, a.u.s.n);
            } else if (b.k == JV_LIST || b.k == JV_GEN) {
                if ((st = use_gen(&b, e->line)) != DJ_OK) return st;
                for (size_t i = 0; i < b.u.l->n && !found; i++) found = equal(&a, &b.u.l->v[i]);
            } else if (b.k == JV_DICT || b.k == JV_NS) {
                found = a.k == JV_STR && dict_get(b.u.d, a.u.s.p, a.u.s.n) != NULL;
            } else if (b.k != JV_UNDEF) {
                return err(e->line, "'in' a %s", kind_name(b.k));
            }
            *out = (dj__jval){.k = JV_BOOL, .u.b = found == (e->op == JOP_IN)};
            return DJ_OK;
        }
        default: return arith(r, e, &a, &b, out);
        }
    }
    return err(e->line, "bad expression");
}

/* ---- statements ---- */
enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE };

static dj_status emit(rctx *r, const char *s, size_t n) {
    if (r->n + n > MAX_OUT) return dj_fail(DJ_ERANGE, "chat template: output over %zu MiB", MAX_OUT >> 20);
    if (r->n + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 4096;
        while (cap < r->n + n + 1) cap *= 2;
        char *p = dj_realloc(r->out, cap);
        if (!p) return dj_fail(DJ_ENOMEM, "out of memory rendering a chat template");
        r->out = p;
        r->cap = cap;
    }
    memcpy(r->out + r->n, s, n);
    r->n += n;
    r->out[r->n] = '\0';
    return DJ_OK;
}

static dj_status exec(rctx *r, const dj__jstmt *s, int *flow);

static dj_status set_var(rctx *r, const char *name, dj__jval v) {
    dj__jdict *d = r->sc ? &r->sc->vars : NULL;
    if (!d || !dict_set(&r->a, d, name, strlen(name), v)) return oom(r);
    return DJ_OK;
}

/* The loop variables of `for a, b in ...` bound to item x: one target takes
 * it whole; several unpack a list of exactly as many (anything else is an
 * error naming the line - with no `if` filter this is the first look at x). */
static dj_status bind_targets(rctx *r, const dj__jstmt *s, const dj__jval *x) {
    if (s->n_targets == 1) return set_var(r, s->targets[0], *x);
    if (x->k != JV_LIST || x->u.l->n != s->n_targets)
        return err(s->line, "cannot unpack a %s into %zu loop variables", kind_name(x->k), s->n_targets);
    dj_status st = DJ_OK;
    for (size_t k = 0; k < s->n_targets && st == DJ_OK; k++) st = set_var(r, s->targets[k], x->u.l->v[k]);
    return st;
}

static dj_status exec_for(rctx *r, const dj__jstmt *s, int *flow) {
    dj__jval it;
    dj_status st = eval(r, s->e, &it);
    if (st != DJ_OK) return st;
    dj__jlist *items;
    if ((st = iter_items(r, &it, s->line, &items)) != DJ_OK) return st;
    scope sc = {.parent = r->sc};
    r->sc = &sc;
    /* with an `if` filter, loop.* counts only the kept items */
    size_t *keep = dj__arena_alloc(&r->a, (items->n + 1) * sizeof *keep), n_keep = 0;
    if (!keep) st = oom(r);
    for (size_t i = 0; st == DJ_OK && i < items->n; i++) {
        if (!s->filter) {
            keep[n_keep++] = i;
            continue;
        }
        sc.vars = (dj__jdict){0};
        bool ok = true;
        if ((st = bind_targets(r, s, &items->v[i])) != DJ_OK) break;
        if (s->filter) {
            dj__jval c;
            if ((st = eval(r, s->filter, &c)) != DJ_OK) break;
            ok = truthy(&c);
        }
        if (ok) keep[n_keep++] = i;
    }
    const bool ran = n_keep > 0;
    for (size_t j = 0; st == DJ_OK && j < n_keep; j++) {
        sc.vars = (dj__jdict){0};
        st = bind_targets(r, s, &items->v[keep[j]]);
        dj__jdict *loop = dj__arena_alloc(&r->a, sizeof *loop);
        if (st == DJ_OK && !loop) st = oom(r);
        if (st != DJ_OK) break;
        const int64_t n = (int64_t)n_keep, i = (int64_t)j;
        bool ok = dict_set(&r->a, loop, "index0", 6, (dj__jval){.k = JV_INT, .u.i = i}) &&
                  dict_set(&r->a, loop, "index", 5, (dj__jval){.k = JV_INT, .u.i = i + 1}) &&
                  dict_set(&r->a, loop, "revindex0", 9, (dj__jval){.k = JV_INT, .u.i = n - i - 1}) &&
                  dict_set(&r->a, loop, "revindex", 8, (dj__jval){.k = JV_INT, .u.i = n - i}) &&
                  dict_set(&r->a, loop, "first", 5, (dj__jval){.k = JV_BOOL, .u.b = i == 0}) &&
                  dict_set(&r->a, loop, "last", 4, (dj__jval){.k = JV_BOOL, .u.b = i == n - 1}) &&
                  dict_set(&r->a, loop, "length", 6, (dj__jval){.k = JV_INT, .u.i = n}) &&
                  (j == 0 || dict_set(&r->a, loop, "previtem", 8, items->v[keep[j - 1]])) &&
                  (j + 1 == n_keep || dict_set(&r->a, loop, "nextitem", 8, items->v[keep[j + 1]])) &&
                  dict_set(&r->a, &sc.vars, "loop", 4, (dj__jval){.k = JV_DICT, .u.d = loop});
        if (!ok) {
            st = oom(r);
            break;
        }
        int f = FLOW_NONE;
        for (const dj__jstmt *b = s->body; b && st == DJ_OK && f == FLOW_NONE; b = b->next) st = exec(r, b, &f);
        if (f == FLOW_BREAK) break;
    }
    r->sc = sc.parent;
    if (st != DJ_OK) return st;
    if (!ran && s->orelse) {
        for (const dj__jstmt *b = s->orelse; b && st == DJ_OK && *flow == FLOW_NONE; b = b->next) st = exec(r, b, flow);
    }
    return st;
}

static dj_status exec(rctx *r, const dj__jstmt *s, int *flow) {
    if (++r->steps > MAX_STEPS)
        return dj_fail(DJ_ERANGE, "chat template: more than %llu evaluation steps", (unsigned long long)MAX_STEPS);
    dj_status st;
    dj__jval v;
    switch (s->kind) {
    case JS_TEXT: return emit(r, s->text, s->text_len);
    case JS_OUT: {
        if ((st = eval(r, s->e, &v)) != DJ_OK) return st;
        if (v.k == JV_STR) return emit(r, v.u.s.p, v.u.s.n);
        sbuf b = {0};
        put_str(&b, &v);
        if (b.oom || b.gen) {
            free(b.p);
            if (b.nomem) return dj_fail(DJ_ENOMEM, "out of memory rendering a chat template");
            return b.oom ? oom(r) : gen_printed();
        }
        st = emit(r, b.p ? b.p : "", b.n);
        free(b.p);
        return st;
    }
    case JS_IF:
        if ((st = eval(r, s->e, &v)) != DJ_OK) return st;
        for (const dj__jstmt *b = truthy(&v) ? s->body : s->orelse; b && *flow == FLOW_NONE; b = b->next)
            if ((st = exec(r, b, flow)) != DJ_OK) return st;
        return DJ_OK;
    case JS_FOR: return exec_for(r, s, flow);
    case JS_SET:
        if ((st = eval(r, s->e, &v)) != DJ_OK) return st;
        if (s->attr) {
            dj__jval *ns = lookup(r, s->targets[0]);
            if (!ns || ns->k != JV_NS) return err(s->line, "'%s' is not a namespace: cannot set its attributes", s->targets[0]);
            if (!dict_set(&r->a, ns->u.d, s->attr, strlen(s->attr), v)) return oom(r);
            return DJ_OK;
        }
        return set_var(r, s->targets[0], v);
    case JS_SETBLOCK: {
        /* render the body into a string of its own */
        char *save = r->out;
        size_t save_n = r->n, save_cap = r->cap;
        r->out = NULL;
        r->n = r->cap = 0;
        st = DJ_OK;
        int f = FLOW_NONE;
        for (const dj__jstmt *b = s->body; b && st == DJ_OK && f == FLOW_NONE; b = b->next) st = exec(r, b, &f);
        char *body = r->out;
        size_t body_n = r->n;
        r->out = save;
        r->n = save_n;
        r->cap = save_cap;
        bool ok = true;
        if (st == DJ_OK) v = mkstr(r, body ? body : "", body_n, &ok);
        free(body);
        if (st != DJ_OK) return st;
        if (!ok) return oom(r);
        return set_var(r, s->targets[0], v);
    }
    case JS_BREAK: *flow = FLOW_BREAK; return DJ_OK;
    case JS_CONTINUE: *flow = FLOW_CONTINUE; return DJ_OK;
    }
    return err(s->line, "bad statement");
}

dj_status dj__jinja_render(const dj_chat_template_t *t, const void *vars, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    const cJSON *j = vars;
    rctx r = {.a = {.cap = MAX_ARENA}};
    scope root = {0};
    dj__jval g;
    dj_status st = from_json(&r, j, &g);
    if (st == DJ_OK && g.k != JV_DICT) st = dj_fail(DJ_EINVAL, "chat template variables must be a JSON object");
    if (st == DJ_OK) {
        r.globals = g.u.d;
        if (!dict_get(g.u.d, "bos_token", 9)) {
            bool ok = true;
            dj__jval b = mkstr(&r, t->bos, strlen(t->bos), &ok);
            if (!ok || !dict_set(&r.a, g.u.d, "bos_token", 9, b)) st = oom(&r);
        }
        if (st == DJ_OK && !dict_get(g.u.d, "eos_token", 9)) {
            bool ok = true;
            dj__jval b = mkstr(&r, t->eos, strlen(t->eos), &ok);
            if (!ok || !dict_set(&r.a, g.u.d, "eos_token", 9, b)) st = oom(&r);
        }
    }
    r.sc = &root;
    int flow = FLOW_NONE;
    for (const dj__jstmt *s = t->body; st == DJ_OK && s && flow == FLOW_NONE; s = s->next) st = exec(&r, s, &flow);
    if (st == DJ_OK && !r.out) st = emit(&r, "", 0);
    dj__arena_free(&r.a);
    if (st != DJ_OK) {
        free(r.out);
        return st;
    }
    *text = r.out;
    *len = r.n;
    return DJ_OK;
}
