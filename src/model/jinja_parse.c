/* jinja_parse.c: the Jinja subset of chat templates - lexer (with
 * transformers' trim_blocks and lstrip_blocks) and recursive-descent parser
 * into the tree of jinja_impl.h; anything outside the subset is refused. */
#include <ctype.h>
#include "djinn/alloc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja_impl.h"

/* ---- arena ---- */
struct dj__arena_chunk {
    dj__arena_chunk *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
};

void *dj__arena_alloc(dj__arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (a->cap && a->used + n > a->cap) return NULL;
    dj__arena_chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > 65536 ? n : 65536;
        c = dj_malloc(sizeof *c + size);
        if (!c) {
            a->nomem = true;
            return NULL;
        }
        c->next = a->head;
        c->used = 0;
        c->size = size;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

void dj__arena_free(dj__arena *a) {
    for (dj__arena_chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    a->head = NULL;
    a->used = 0;
}

/* ---- names: what the parser accepts and the renderer implements ---- */
static const char *const filters[] = {"abs",     "capitalize", "count",      "d",          "default", "first",
                                      "float",   "int",        "items",      "join",       "last",    "length",
                                      "list",    "lower",      "reject",     "rejectattr", "replace", "reverse",
                                      "safe",    "select",     "selectattr", "string",     "title",   "tojson",
                                      "trim",    "upper",      NULL};
static const char *const tests[] = {"boolean", "defined", "divisibleby", "eq",     "equalto", "even",    "false",
                                    "float",   "integer", "iterable",    "lower",  "mapping", "none",    "number",
                                    "odd",     "sameas",  "sequence",    "string", "true",    "undefined", "upper",
                                    NULL};
static const char *const globals[] = {"namespace", "raise_exception", "range", "strftime_now", NULL};
static const char *const methods[] = {"capitalize", "endswith", "find",  "get",   "items",   "join",
                                      "keys",       "lower",    "lstrip", "replace", "rstrip", "split",
                                      "startswith", "strip",    "title", "upper", "values",  NULL};

static bool in_list(const char *const *l, const char *name) {
    for (int i = 0; l[i]; i++)
        if (!strcmp(l[i], name)) return true;
    return false;
}
bool dj__jinja_filter_known(const char *name) { return in_list(filters, name); }
bool dj__jinja_test_known(const char *name) { return in_list(tests, name); }
bool dj__jinja_global_known(const char *name) { return in_list(globals, name); }
bool dj__jinja_method_known(const char *name) { return in_list(methods, name); }

/* ---- tokens ---- */
typedef enum { T_TEXT, T_VAR_BEGIN, T_BLOCK_BEGIN, T_VAR_END, T_BLOCK_END, T_NAME, T_INT, T_FLOAT, T_STR, T_OP, T_EOF } tkind;
typedef struct tok {
    tkind k;
    int line;
    const char *p; /* T_TEXT, T_NAME, T_OP: the source bytes; T_STR: decoded (arena) */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    dj_chat_template_t *t;
    char *src; /* normalised copy (\r\n -> \n, one trailing \n dropped) */
    size_t len;
    tok *toks;
    size_t n_toks, cap_toks, at;
    int depth;
    size_t line_pos; /* line_of's memory: src[0..line_pos) holds line - 1 newlines */
    int line;
} parser;

#define MAX_DEPTH 64

static dj_status syntax(int line, const char *what) {
    return dj_fail(DJ_EFORMAT, "chat template line %d: %s", line, what);
}

static dj_status push(parser *ps, tok t) {
    if (ps->n_toks == ps->cap_toks) {
        size_t cap = ps->cap_toks ? ps->cap_toks * 2 : 256;
        tok *n = dj_realloc(ps->toks, cap * sizeof *n);
        if (!n) return dj_fail(DJ_ENOMEM, "out of memory lexing a chat template");
        ps->toks = n;
        ps->cap_toks = cap;
    }
    ps->toks[ps->n_toks++] = t;
    return DJ_OK;
}

/* The line of a source position; the lexer asks in increasing order, so the
 * count goes on from the last answer. */
static int line_of(parser *ps, size_t pos) {
    if (pos < ps->line_pos) ps->line_pos = 0, ps->line = 1;
    for (size_t i = ps->line_pos; i < pos && i < ps->len; i++) ps->line += ps->src[i] == '\n';
    ps->line_pos = pos;
    return ps->line;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* A string literal at s[*i] (quote char q) decoded into the arena. */
static dj_status lex_string(parser *ps, size_t *i, int line, tok *out) {
    const char q = ps->src[*i];
    size_t j = *i + 1;
    char *buf = dj__arena_alloc(&ps->t->arena, ps->len - *i + 1);
    if (!buf) return dj_fail(DJ_ENOMEM, "out of memory lexing a chat template");
    size_t n = 0;
    for (;;) {
        if (j >= ps->len) return syntax(line, "unterminated string");
        char c = ps->src[j++];
        if (c == q) break;
        if (c != '\\') {
            buf[n++] = c;
            continue;
        }
        if (j >= ps->len) return syntax(line, "unterminated string");
        c = ps->src[j++];
        switch (c) {
        case 'n': buf[n++] = '\n'; break;
        case 't': buf[n++] = '\t'; break;
        case 'r': buf[n++] = '\r'; break;
        case '\\': buf[n++] = '\\'; break;
        case '\'': buf[n++] = '\''; break;
        case '"': buf[n++] = '"'; break;
        case '\n': break;
        default:
            /* Python keeps unknown escapes as written */
            buf[n++] = '\\';
            buf[n++] = c;
        }
    }
    *i = j;
    *out = (tok){.k = T_STR, .line = line, .p = buf, .n = n};
    return DJ_OK;
}

static const char *const ops2[] = {"==", "!=", "<=", ">=", "//", "**", NULL};
static const char ops1[] = "+-*/%~<>=.,:|()[]{}";

/* Tokens of one tag from ps->src[*i] to its end marker; *i after the end. */
static dj_status lex_tag(parser *ps, size_t *i, bool block, bool *strip_after) {
    int balance = 0;
    for (;;) {
        size_t j = *i;
        while (j < ps->len && is_ws(ps->src[j])) j++;
        *i = j;
        const int line = line_of(ps, j);
        if (j >= ps->len) return syntax(line, block ? "missing '%}'" : "missing '}}'");
        const char *s = ps->src + j;
        const size_t left = ps->len - j;
        const char end = block ? '%' : '}';
        if (balance == 0) {
            if (left >= 3 && s[0] == '-' && s[1] == end && s[2] == '}') {
                *i = j + 3;
                *strip_after = true;
                return push(ps, (tok){.k = block ? T_BLOCK_END : T_VAR_END, .line = line});
            }
            if (left >= 2 && s[0] == end && s[1] == '}') {
                *i = j + 2;
                *strip_after = false;
                return push(ps, (tok){.k = block ? T_BLOCK_END : T_VAR_END, .line = line});
            }
        }
        dj_status st;
        if (isalpha((unsigned char)s[0]) || s[0] == '_') {
            size_t n = 1;
            while (n < left && (isalnum((unsigned char)s[n]) || s[n] == '_')) n++;
            *i = j + n;
            if ((st = push(ps, (tok){.k = T_NAME, .line = line, .p = s, .n = n})) != DJ_OK) return st;
        } else if (isdigit((unsigned char)s[0])) {
            char num[64];
            size_t n = 0, k = 0;
            bool is_float = false;
            while (k < left && (isdigit((unsigned char)s[k]) || s[k] == '_' ||
                                (s[k] == '.' && !is_float && k + 1 < left && isdigit((unsigned char)s[k + 1])) ||
                                ((s[k] == 'e' || s[k] == 'E') && k + 1 < left &&
                                 (isdigit((unsigned char)s[k + 1]) || s[k + 1] == '-' || s[k + 1] == '+')))) {
                if (s[k] == '.' || s[k] == 'e' || s[k] == 'E') is_float = true;
                if ((s[k] == 'e' || s[k] == 'E') && (s[k + 1] == '-' || s[k + 1] == '+')) {
                    if (n < sizeof num - 2) num[n++] = s[k];
                    k++;
                }
                if (s[k] != '_' && n < sizeof num - 1) num[n++] = s[k];
                k++;
            }
            num[n] = '\0';
            *i = j + k;
            tok t = {.k = is_float ? T_FLOAT : T_INT, .line = line};
            if (is_float) t.f = strtod(num, NULL);
            else {
                char *e;
                unsigned long long v = strtoull(num, &e, 10);
                if (v > INT64_MAX) return syntax(line, "integer literal too large");
                t.i = (int64_t)v;
            }
            if ((st = push(ps, t)) != DJ_OK) return st;
        } else if (s[0] == '\'' || s[0] == '"') {
            tok t;
            if ((st = lex_string(ps, i, line, &t)) != DJ_OK) return st;
            if ((st = push(ps, t)) != DJ_OK) return st;
        } else {
            size_t n = 0;
            for (int k = 0; ops2[k]; k++)
                if (left >= 2 && s[0] == ops2[k][0] && s[1] == ops2[k][1]) n = 2;
            if (!n && strchr(ops1, s[0]) && s[0]) n = 1;
            if (!n) {
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected character '%c'", isprint((unsigned char)s[0]) ? s[0] : '?');
                return syntax(line, msg);
            }
            if (n == 1 && (s[0] == '(' || s[0] == '[' || s[0] == '{')) balance++;
            if (n == 1 && (s[0] == ')' || s[0] == ']' || s[0] == '}')) {
                if (balance == 0) return syntax(line, "unbalanced bracket");
                balance--;
            }
            *i = j + n;
            if ((st = push(ps, (tok){.k = T_OP, .line = line, .p = s, .n = n})) != DJ_OK) return st;
        }
    }
}

/* The whole source into tokens, with the whitespace rules applied to text. */
static dj_status lex(parser *ps) {
    size_t i = 0;
    bool strip_next = false;   /* the previous tag ended with '-' */
    bool trim_next = false;    /* the previous tag was a block or comment (trim_blocks) */
    bool line_starting = true; /* what came before ends a line */
    dj_status st;
    for (;;) {
        size_t k = i;
        while (k + 1 < ps->len && !(ps->src[k] == '{' && (ps->src[k + 1] == '{' || ps->src[k + 1] == '%' ||
                                                           ps->src[k + 1] == '#')))
            k++;
        const bool at_tag = k + 1 < ps->len;
        if (!at_tag) k = ps->len;
        const char *text = ps->src + i;
        size_t n = k - i;
        if (strip_next) {
            while (n && is_ws(*text)) text++, n--;
        } else if (trim_next && n && *text == '\n') {
            text++, n--;
        }
        char kind = at_tag ? ps->src[k + 1] : 0;
        char sign = at_tag && k + 2 < ps->len ? ps->src[k + 2] : 0;
        if (at_tag && sign == '-') {
            while (n && is_ws(text[n - 1])) n--;
        } else if (at_tag && (kind == '%' || kind == '#') && sign != '+') {
            /* lstrip_blocks: spaces and tabs from the line's start to the tag */
            size_t l = n;
            while (l && text[l - 1] != '\n') l--;
            if (l > 0 || line_starting) {
                bool only_ws = true;
                for (size_t q = l; q < n; q++)
                    if (text[q] != ' ' && text[q] != '\t') only_ws = false;
                if (only_ws) n = l;
            }
        }
        if (n && (st = push(ps, (tok){.k = T_TEXT, .line = line_of(ps, (size_t)(text - ps->src)), .p = text,
                                       .n = n})) != DJ_OK)
            return st;
        if (!at_tag) break;
        i = k + 2 + (sign == '-' || sign == '+');
        const int line = line_of(ps, k);
        if (kind == '#') {
            const char *e = NULL;
            for (size_t q = i; q + 1 < ps->len; q++)
                if (ps->src[q] == '#' && ps->src[q + 1] == '}') {
                    e = ps->src + q;
                    break;
                }
            if (!e) return syntax(line, "unterminated comment");
            strip_next = e > ps->src + i && e[-1] == '-';
            i = (size_t)(e - ps->src) + 2;
            trim_next = true;
        } else {
            if ((st = push(ps, (tok){.k = kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, .line = line})) != DJ_OK)
                return st;
            if ((st = lex_tag(ps, &i, kind == '%', &strip_next)) != DJ_OK) return st;
            trim_next = kind == '%';
        }
        /* what the tag's end consumed ends a line: with trim_blocks the
         * newline, with '-' the whitespace */
        if (strip_next) {
            size_t q = i;
            while (q < ps->len && is_ws(ps->src[q])) q++;
            line_starting = q > i && ps->src[q - 1] == '\n';
        } else {
            line_starting = trim_next && i < ps->len && ps->src[i] == '\n';
        }
    }
    return push(ps, (tok){.k = T_EOF, .line = line_of(ps, ps->len)});
}

/* ---- parser ---- */
static tok *peek(parser *ps) { return &ps->toks[ps->at]; }
static tok *next(parser *ps) {
    tok *t = &ps->toks[ps->at];
    if (t->k != T_EOF) ps->at++;
    return t;
}
static bool is_op(const tok *t, const char *op) { return t->k == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n); }
static bool is_name(const tok *t, const char *name) {
    return t->k == T_NAME && t->n == strlen(name) && !memcmp(t->p, name, t->n);
}
static bool accept_op(parser *ps, const char *op) {
    if (!is_op(peek(ps), op)) return false;
    ps->at++;
    return true;
}
static bool accept_name(parser *ps, const char *name) {
    if (!is_name(peek(ps), name)) return false;
    ps->at++;
    return true;
}
static dj_status expect_op(parser *ps, const char *op) {
    if (accept_op(ps, op)) return DJ_OK;
    char msg[64];
    snprintf(msg, sizeof msg, "expected '%s'", op);
    return syntax(peek(ps)->line, msg);
}

static const char *dup_name(parser *ps, const tok *t) {
    char *s = dj__arena_alloc(&ps->t->arena, t->n + 1);
    if (s) memcpy(s, t->p, t->n);
    return s;
}

static dj__jexpr *new_expr(parser *ps, dj__jexpr_kind k, int line) {
    dj__jexpr *e = dj__arena_alloc(&ps->t->arena, sizeof *e);
    if (e) {
        e->kind = k;
        e->line = line;
    }
    return e;
}

#define OOM() dj_fail(DJ_ENOMEM, "out of memory parsing a chat template")
#define TRY(x)                               \
    do {                                     \
        dj_status st__ = (x);                \
        if (st__ != DJ_OK) return st__;      \
    } while (0)

static dj_status parse_expr(parser *ps, dj__jexpr **out);
static dj_status parse_or(parser *ps, dj__jexpr **out);

/* Growing argument arrays in the arena (copied when they grow). */
typedef struct exprvec {
    dj__jexpr **v;
    const char **names;
    size_t n, cap;
} exprvec;
static dj_status vec_push(parser *ps, exprvec *v, dj__jexpr *e, const char *name) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4;
        dj__jexpr **nv = dj__arena_alloc(&ps->t->arena, cap * sizeof *nv);
        const char **nn = dj__arena_alloc(&ps->t->arena, cap * sizeof *nn);
        if (!nv || !nn) return OOM();
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv), memcpy(nn, v->names, v->n * sizeof *nn);
        v->v = nv;
        v->names = nn;
        v->cap = cap;
    }
    v->v[v->n] = e;
    v->names[v->n] = name;
    v->n++;
    return DJ_OK;
}

/* (args) after the '(' was taken: positional then keyword arguments. */
static dj_status parse_args(parser *ps, dj__jexpr *e) {
    exprvec pos = {0}, kw = {0};
    while (!accept_op(ps, ")")) {
        if (pos.n + kw.n) {
            if (!accept_op(ps, ",")) return syntax(peek(ps)->line, "expected ',' or ')'");
            if (accept_op(ps, ")")) break;
        }
        tok *t = peek(ps);
        if (t->k == T_NAME && is_op(&ps->toks[ps->at + 1], "=")) {
            const char *name = dup_name(ps, t);
            if (!name) return OOM();
            ps->at += 2;
            dj__jexpr *v;
            TRY(parse_expr(ps, &v));
            TRY(vec_push(ps, &kw, v, name));
        } else {
            if (kw.n) return syntax(t->line, "positional argument after a keyword argument");
            dj__jexpr *v;
            TRY(parse_expr(ps, &v));
            TRY(vec_push(ps, &pos, v, NULL));
        }
    }
    e->args = pos.v;
    e->n_args = pos.n;
    e->kw = kw.v;
    e->kw_names = kw.names;
    e->n_kw = kw.n;
    return DJ_OK;
}

static dj_status unsupported(int line, const char *what, const char *name) {
    return dj_fail(DJ_EUNSUPPORTED, "chat template line %d: %s '%s' is not supported by djinn's renderer", line, what,
                   name);
}

static dj_status parse_primary(parser *ps, dj__jexpr **out) {
    tok *t = next(ps);
    dj__jexpr *e = NULL;
    switch (t->k) {
    case T_STR: {
        /* adjacent literals concatenate */
        size_t n = t->n;
        size_t first = ps->at - 1;
        while (peek(ps)->k == T_STR) n += next(ps)->n;
        char *s = dj__arena_alloc(&ps->t->arena, n + 1);
        if (!s || !(e = new_expr(ps, JE_LIT, t->line))) return OOM();
        size_t o = 0;
        for (size_t k = first; k < ps->at; k++) memcpy(s + o, ps->toks[k].p, ps->toks[k].n), o += ps->toks[k].n;
        e->lit = (dj__jval){.k = JV_STR, .u.s = {s, n}};
        break;
    }
    case T_INT:
        if (!(e = new_expr(ps, JE_LIT, t->line))) return OOM();
        e->lit = (dj__jval){.k = JV_INT, .u.i = t->i};
        break;
    case T_FLOAT:
        if (!(e = new_expr(ps, JE_LIT, t->line))) return OOM();
        e->lit = (dj__jval){.k = JV_FLOAT, .u.f = t->f};
        break;
    case T_NAME:
        if (!(e = new_expr(ps, JE_LIT, t->line))) return OOM();
        if (is_name(t, "true") || is_name(t, "True")) e->lit = (dj__jval){.k = JV_BOOL, .u.b = true};
        else if (is_name(t, "false") || is_name(t, "False")) e->lit = (dj__jval){.k = JV_BOOL, .u.b = false};
        else if (is_name(t, "none") || is_name(t, "None")) e->lit = (dj__jval){.k = JV_NONE};
        else {
            e->kind = JE_NAME;
            if (!(e->name = dup_name(ps, t))) return OOM();
        }
        break;
    case T_OP:
        if (is_op(t, "(")) {
            dj__jexpr *first;
            if (accept_op(ps, ")")) { /* empty tuple */
                if (!(e = new_expr(ps, JE_LIST, t->line))) return OOM();
                e->negate = true;
                break;
            }
            TRY(parse_expr(ps, &first));
            if (accept_op(ps, ")")) {
                e = first;
                break;
            }
            exprvec v = {0};
            TRY(vec_push(ps, &v, first, NULL));
            while (accept_op(ps, ",")) {
                if (is_op(peek(ps), ")")) break;
                dj__jexpr *x;
                TRY(parse_expr(ps, &x));
                TRY(vec_push(ps, &v, x, NULL));
            }
            TRY(expect_op(ps, ")"));
            if (!(e = new_expr(ps, JE_LIST, t->line))) return OOM();
            e->negate = true; /* a tuple */
            e->args = v.v;
            e->n_args = v.n;
            break;
        }
        if (is_op(t, "[")) {
            exprvec v = {0};
            while (!accept_op(ps, "]")) {
                if (v.n) TRY(expect_op(ps, ","));
                if (accept_op(ps, "]")) break;
                dj__jexpr *x;
                TRY(parse_expr(ps, &x));
                TRY(vec_push(ps, &v, x, NULL));
            }
            if (!(e = new_expr(ps, JE_LIST, t->line))) return OOM();
            e->args = v.v;
            e->n_args = v.n;
            break;
        }
        if (is_op(t, "{")) {
            exprvec v = {0};
            while (!accept_op(ps, "}")) {
                if (v.n) TRY(expect_op(ps, ","));
                if (accept_op(ps, "}")) break;
                dj__jexpr *k, *x;
                TRY(parse_expr(ps, &k));
                TRY(expect_op(ps, ":"));
                TRY(parse_expr(ps, &x));
                TRY(vec_push(ps, &v, k, NULL));
                TRY(vec_push(ps, &v, x, NULL));
            }
            if (!(e = new_expr(ps, JE_DICT, t->line))) return OOM();
            e->args = v.v;
            e->n_args = v.n;
            break;
        }
        /* fall through */
    default:
        return syntax(t->line, t->k == T_EOF ? "unexpected end of template" : "unexpected token in expression");
    }
    *out = e;
    return DJ_OK;
}

/* a.b, a[...], a(...) */
static dj_status parse_postfix(parser *ps, dj__jexpr **io) {
    for (;;) {
        tok *t = peek(ps);
        if (is_op(t, ".")) {
            ps->at++;
            tok *n = next(ps);
            if (n->k != T_NAME && n->k != T_INT) return syntax(n->line, "expected a name after '.'");
            dj__jexpr *e = new_expr(ps, JE_ATTR, t->line);
            if (!e) return OOM();
            e->a = *io;
            if (n->k == T_INT) { /* a.0 is a[0] */
                e->kind = JE_INDEX;
                if (!(e->b = new_expr(ps, JE_LIT, n->line))) return OOM();
                e->b->lit = (dj__jval){.k = JV_INT, .u.i = n->i};
            } else if (!(e->name = dup_name(ps, n))) {
                return OOM();
            }
            *io = e;
        } else if (is_op(t, "[")) {
            ps->at++;
            dj__jexpr *parts[3] = {NULL, NULL, NULL};
            int n_colon = 0;
            for (;;) {
                if (is_op(peek(ps), "]")) break;
                if (is_op(peek(ps), ":")) {
                    if (++n_colon > 2) return syntax(t->line, "too many ':' in a slice");
                    ps->at++;
                    continue;
                }
                if (parts[n_colon]) return syntax(t->line, "expected ':' or ']'");
                TRY(parse_expr(ps, &parts[n_colon]));
            }
            ps->at++;
            dj__jexpr *e = new_expr(ps, n_colon ? JE_SLICE : JE_INDEX, t->line);
            if (!e) return OOM();
            e->a = *io;
            if (!n_colon && !parts[0]) return syntax(t->line, "empty subscript");
            e->b = parts[0];
            e->c = parts[1];
            e->d = parts[2];
            *io = e;
        } else if (is_op(t, "(")) {
            ps->at++;
            const dj__jexpr *callee = *io;
            if (callee->kind == JE_NAME) {
                if (!dj__jinja_global_known(callee->name)) return unsupported(t->line, "function", callee->name);
            } else if (callee->kind == JE_ATTR) {
                if (!dj__jinja_method_known(callee->name)) return unsupported(t->line, "method", callee->name);
            } else {
                return syntax(t->line, "only named functions and methods can be called");
            }
            dj__jexpr *e = new_expr(ps, JE_CALL, t->line);
            if (!e) return OOM();
            e->a = *io;
            TRY(parse_args(ps, e));
            *io = e;
        } else {
            return DJ_OK;
        }
    }
}

/* select/reject(attr)'s test, where it is a literal name: known, or the
 * template is refused here rather than at its first render. */
static dj_status check_test_arg(const dj__jexpr *e) {
    const bool sel = !strncmp(e->name, "select", 6) || !strncmp(e->name, "reject", 6);
    const size_t at = strstr(e->name, "attr") ? 1 : 0;
    if (!sel || e->n_args <= at || e->args[at]->kind != JE_LIT || e->args[at]->lit.k != JV_STR) return DJ_OK;
    char name[64];
    const size_t n = e->args[at]->lit.u.s.n < sizeof name - 1 ? e->args[at]->lit.u.s.n : sizeof name - 1;
    memcpy(name, e->args[at]->lit.u.s.p, n);
    name[n] = '\0';
    return dj__jinja_test_known(name) ? DJ_OK : unsupported(e->line, "test", name);
}

/* | filter(args), is [not] test(args) */
static dj_status parse_filters(parser *ps, dj__jexpr **io) {
    for (;;) {
        tok *t = peek(ps);
        if (is_op(t, "|")) {
            ps->at++;
            tok *n = next(ps);
            if (n->k != T_NAME) return syntax(n->line, "expected a filter name after '|'");
            dj__jexpr *e = new_expr(ps, JE_FILTER, n->line);
            if (!e || !(e->name = dup_name(ps, n))) return OOM();
            if (!dj__jinja_filter_known(e->name)) return unsupported(n->line, "filter", e->name);
            e->a = *io;
            if (accept_op(ps, "(")) TRY(parse_args(ps, e));
            TRY(check_test_arg(e));
            *io = e;
            TRY(parse_postfix(ps, io));
        } else if (is_name(t, "is")) {
            ps->at++;
            dj__jexpr *e = new_expr(ps, JE_TEST, t->line);
            if (!e) return OOM();
            e->negate = accept_name(ps, "not");
            tok *n = next(ps);
            if (n->k != T_NAME) return syntax(n->line, "expected a test name after 'is'");
            /* `is none`, `is true` are names here, not literals */
            if (!(e->name = dup_name(ps, n))) return OOM();
            if (!dj__jinja_test_known(e->name)) return unsupported(n->line, "test", e->name);
            e->a = *io;
            if (accept_op(ps, "(")) {
                TRY(parse_args(ps, e));
            } else {
                tok *x = peek(ps);
                /* one bare argument: `is divisibleby 3`, `is equalto 'x'` */
                if (x->k == T_INT || x->k == T_FLOAT || x->k == T_STR ||
                    (x->k == T_NAME && !is_name(x, "and") && !is_name(x, "or") && !is_name(x, "else") &&
                     !is_name(x, "if") && !is_name(x, "is") && !is_name(x, "in") && !is_name(x, "not"))) {
                    dj__jexpr *arg;
                    TRY(parse_primary(ps, &arg));
                    TRY(parse_postfix(ps, &arg));
                    dj__jexpr **args = dj__arena_alloc(&ps->t->arena, sizeof *args);
                    if (!args) return OOM();
                    args[0] = arg;
                    e->args = args;
                    e->n_args = 1;
                }
            }
            *io = e;
        } else {
            return DJ_OK;
        }
    }
}

static dj_status parse_unary(parser *ps, dj__jexpr **out, bool with_filter) {
    if (++ps->depth > MAX_DEPTH) return syntax(peek(ps)->line, "expression nested too deeply");
    tok *t = peek(ps);
    dj_status st;
    if (is_op(t, "-") || is_op(t, "+")) {
        ps->at++;
        dj__jexpr *e = new_expr(ps, is_op(t, "-") ? JE_NEG : JE_POS, t->line);
        if (!e) return OOM();
        if ((st = parse_unary(ps, &e->a, false)) != DJ_OK) return st;
        *out = e;
    } else {
        if ((st = parse_primary(ps, out)) != DJ_OK) return st;
        if ((st = parse_postfix(ps, out)) != DJ_OK) return st;
    }
    if (with_filter && (st = parse_filters(ps, out)) != DJ_OK) return st;
    ps->depth--;
    return DJ_OK;
}

static dj_status binary(parser *ps, dj__jexpr **io, dj__jop op, dj__jexpr *rhs, int line) {
    dj__jexpr *e = new_expr(ps, JE_BIN, line);
    if (!e) return OOM();
    e->op = op;
    e->a = *io;
    e->b = rhs;
    *io = e;
    return DJ_OK;
}

static dj_status parse_pow(parser *ps, dj__jexpr **out) {
    TRY(parse_unary(ps, out, true));
    while (is_op(peek(ps), "**")) {
        int line = next(ps)->line;
        dj__jexpr *r;
        TRY(parse_unary(ps, &r, true));
        TRY(binary(ps, out, JOP_POW, r, line));
    }
    return DJ_OK;
}

static dj_status parse_math2(parser *ps, dj__jexpr **out) {
    TRY(parse_pow(ps, out));
    for (;;) {
        tok *t = peek(ps);
        dj__jop op;
        if (is_op(t, "*")) op = JOP_MUL;
        else if (is_op(t, "/")) op = JOP_DIV;
        else if (is_op(t, "//")) op = JOP_FLOORDIV;
        else if (is_op(t, "%")) op = JOP_MOD;
        else return DJ_OK;
        ps->at++;
        dj__jexpr *r;
        TRY(parse_pow(ps, &r));
        TRY(binary(ps, out, op, r, t->line));
    }
}

static dj_status parse_concat(parser *ps, dj__jexpr **out) {
    TRY(parse_math2(ps, out));
    while (is_op(peek(ps), "~")) {
        int line = next(ps)->line;
        dj__jexpr *r;
        TRY(parse_math2(ps, &r));
        TRY(binary(ps, out, JOP_CONCAT, r, line));
    }
    return DJ_OK;
}

static dj_status parse_math1(parser *ps, dj__jexpr **out) {
    TRY(parse_concat(ps, out));
    for (;;) {
        tok *t = peek(ps);
        if (!is_op(t, "+") && !is_op(t, "-")) return DJ_OK;
        ps->at++;
        dj__jexpr *r;
        TRY(parse_concat(ps, &r));
        TRY(binary(ps, out, is_op(t, "+") ? JOP_ADD : JOP_SUB, r, t->line));
    }
}

/* a < b < c is a < b and b < c, as in Python (b is evaluated twice: template
 * expressions have no side effects but raise_exception) */
static dj_status parse_compare(parser *ps, dj__jexpr **out) {
    TRY(parse_math1(ps, out));
    dj__jexpr *prev_rhs = NULL;
    for (;;) {
        tok *t = peek(ps);
        dj__jop op;
        if (is_op(t, "==")) op = JOP_EQ;
        else if (is_op(t, "!=")) op = JOP_NE;
        else if (is_op(t, "<")) op = JOP_LT;
        else if (is_op(t, "<=")) op = JOP_LE;
        else if (is_op(t, ">")) op = JOP_GT;
        else if (is_op(t, ">=")) op = JOP_GE;
        else if (is_name(t, "in")) op = JOP_IN;
        else if (is_name(t, "not") && is_name(&ps->toks[ps->at + 1], "in")) {
            op = JOP_NOTIN;
            ps->at++;
        } else return DJ_OK;
        ps->at++;
        dj__jexpr *r;
        TRY(parse_math1(ps, &r));
        if (!prev_rhs) {
            TRY(binary(ps, out, op, r, t->line));
        } else {
            dj__jexpr *cmp = prev_rhs;
            TRY(binary(ps, &cmp, op, r, t->line));
            dj__jexpr *e = new_expr(ps, JE_AND, t->line);
            if (!e) return OOM();
            e->a = *out;
            e->b = cmp;
            *out = e;
        }
        prev_rhs = r;
    }
}

static dj_status parse_not(parser *ps, dj__jexpr **out) {
    tok *t = peek(ps);
    if (is_name(t, "not")) {
        if (++ps->depth > MAX_DEPTH) return syntax(t->line, "expression nested too deeply");
        ps->at++;
        dj__jexpr *e = new_expr(ps, JE_NOT, t->line);
        if (!e) return OOM();
        TRY(parse_not(ps, &e->a));
        ps->depth--;
        *out = e;
        return DJ_OK;
    }
    return parse_compare(ps, out);
}

static dj_status parse_and(parser *ps, dj__jexpr **out) {
    TRY(parse_not(ps, out));
    while (is_name(peek(ps), "and")) {
        int line = next(ps)->line;
        dj__jexpr *e = new_expr(ps, JE_AND, line);
        if (!e) return OOM();
        e->a = *out;
        TRY(parse_not(ps, &e->b));
        *out = e;
    }
    return DJ_OK;
}

static dj_status parse_or(parser *ps, dj__jexpr **out) {
    TRY(parse_and(ps, out));
    while (is_name(peek(ps), "or")) {
        int line = next(ps)->line;
        dj__jexpr *e = new_expr(ps, JE_OR, line);
        if (!e) return OOM();
        e->a = *out;
        TRY(parse_and(ps, &e->b));
        *out = e;
    }
    return DJ_OK;
}

/* x if cond [else y] */
static dj_status parse_expr(parser *ps, dj__jexpr **out) {
    if (++ps->depth > MAX_DEPTH) return syntax(peek(ps)->line, "expression nested too deeply");
    TRY(parse_or(ps, out));
    while (is_name(peek(ps), "if")) {
        int line = next(ps)->line;
        dj__jexpr *e = new_expr(ps, JE_COND, line);
        if (!e) return OOM();
        e->b = *out;
        TRY(parse_or(ps, &e->a));
        if (accept_name(ps, "else")) TRY(parse_expr(ps, &e->c));
        *out = e;
    }
    ps->depth--;
    return DJ_OK;
}

/* ---- statements ---- */
static dj_status expect_block_end(parser *ps) {
    if (peek(ps)->k == T_BLOCK_END) {
        ps->at++;
        return DJ_OK;
    }
    return syntax(peek(ps)->line, "expected '%}'");
}

static dj__jstmt *new_stmt(parser *ps, dj__jstmt_kind k, int line) {
    dj__jstmt *s = dj__arena_alloc(&ps->t->arena, sizeof *s);
    if (s) {
        s->kind = k;
        s->line = line;
    }
    return s;
}

static const char *const refused_tags[] = {"macro", "call", "filter", "include", "import", "from", "extends",
                                           "block", "with", "raw", "autoescape", "generation", "do", "endmacro",
                                           NULL};

/* Statements until a block tag whose name is one of `ends` (left unconsumed:
 * *end_at points at its name token) or the end of input (ends == NULL). */
static dj_status parse_body(parser *ps, const char *const *ends, dj__jstmt **out, size_t *end_at);

static dj_status parse_block(parser *ps, dj__jstmt **out) {
    tok *kw = next(ps);
    if (kw->k != T_NAME) return syntax(kw->line, "expected a tag name after '{%'");
    const int line = kw->line;
    if (is_name(kw, "if") || is_name(kw, "elif")) {
        if (++ps->depth > MAX_DEPTH) return syntax(line, "blocks nested too deeply");
        dj__jstmt *s = new_stmt(ps, JS_IF, line);
        if (!s) return OOM();
        TRY(parse_expr(ps, &s->e));
        TRY(expect_block_end(ps));
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        size_t at;
        TRY(parse_body(ps, ends, &s->body, &at));
        if (is_name(&ps->toks[at], "elif")) {
            ps->at = at;
            TRY(parse_block(ps, &s->orelse)); /* consumes through endif */
        } else {
            ps->at = at + 1;
            if (is_name(&ps->toks[at], "else")) {
                TRY(expect_block_end(ps));
                static const char *const endif[] = {"endif", NULL};
                TRY(parse_body(ps, endif, &s->orelse, &at));
                ps->at = at + 1;
            }
            TRY(expect_block_end(ps));
        }
        ps->depth--;
        *out = s;
        return DJ_OK;
    }
    if (is_name(kw, "for")) {
        if (++ps->depth > MAX_DEPTH) return syntax(line, "blocks nested too deeply");
        dj__jstmt *s = new_stmt(ps, JS_FOR, line);
        if (!s) return OOM();
        do {
            tok *n = next(ps);
            if (n->k != T_NAME) return syntax(n->line, "expected a loop variable");
            if (s->n_targets == 4) return syntax(n->line, "too many loop variables");
            if (!(s->targets[s->n_targets++] = dup_name(ps, n))) return OOM();
        } while (accept_op(ps, ","));
        if (!accept_name(ps, "in")) return syntax(peek(ps)->line, "expected 'in'");
        TRY(parse_or(ps, &s->e)); /* no conditional expression: `if` filters the loop */
        if (accept_name(ps, "if")) TRY(parse_expr(ps, &s->filter));
        if (accept_name(ps, "recursive")) return unsupported(line, "construct", "recursive loop");
        TRY(expect_block_end(ps));
        static const char *const ends[] = {"else", "endfor", NULL};
        size_t at;
        TRY(parse_body(ps, ends, &s->body, &at));
        ps->at = at + 1;
        if (is_name(&ps->toks[at], "else")) {
            TRY(expect_block_end(ps));
            static const char *const endfor[] = {"endfor", NULL};
            TRY(parse_body(ps, endfor, &s->orelse, &at));
            ps->at = at + 1;
        }
        TRY(expect_block_end(ps));
        ps->depth--;
        *out = s;
        return DJ_OK;
    }
    if (is_name(kw, "set")) {
        tok *n = next(ps);
        if (n->k != T_NAME) return syntax(n->line, "expected a name after 'set'");
        dj__jstmt *s = new_stmt(ps, JS_SET, line);
        if (!s || !(s->targets[0] = dup_name(ps, n))) return OOM();
        s->n_targets = 1;
        if (accept_op(ps, ".")) {
            tok *a = next(ps);
            if (a->k != T_NAME) return syntax(a->line, "expected an attribute name");
            if (!(s->attr = dup_name(ps, a))) return OOM();
        }
        if (accept_op(ps, ",")) return unsupported(line, "construct", "set with several targets");
        if (accept_op(ps, "=")) {
            TRY(parse_expr(ps, &s->e));
            TRY(expect_block_end(ps));
        } else {
            if (s->attr) return syntax(line, "expected '='");
            if (is_op(peek(ps), "|")) return unsupported(line, "construct", "filtered block set");
            TRY(expect_block_end(ps));
            if (++ps->depth > MAX_DEPTH) return syntax(line, "blocks nested too deeply");
            s->kind = JS_SETBLOCK;
            static const char *const ends[] = {"endset", NULL};
            size_t at;
            TRY(parse_body(ps, ends, &s->body, &at));
            ps->at = at + 1;
            TRY(expect_block_end(ps));
            ps->depth--;
        }
        *out = s;
        return DJ_OK;
    }
    if (is_name(kw, "break") || is_name(kw, "continue")) {
        dj__jstmt *s = new_stmt(ps, is_name(kw, "break") ? JS_BREAK : JS_CONTINUE, line);
        if (!s) return OOM();
        TRY(expect_block_end(ps));
        *out = s;
        return DJ_OK;
    }
    char name[32];
    snprintf(name, sizeof name, "%.*s", (int)(kw->n < 31 ? kw->n : 31), kw->p);
    for (int k = 0; refused_tags[k]; k++)
        if (!strcmp(name, refused_tags[k])) return unsupported(line, "tag", name);
    if (!strcmp(name, "endif") || !strcmp(name, "endfor") || !strcmp(name, "else") || !strcmp(name, "elif") ||
        !strcmp(name, "endset")) {
        char msg[64];
        snprintf(msg, sizeof msg, "'%s' without its opening tag", name);
        return syntax(line, msg);
    }
    return unsupported(line, "tag", name);
}

static dj_status parse_body(parser *ps, const char *const *ends, dj__jstmt **out, size_t *end_at) {
    dj__jstmt *head = NULL, **tail = &head;
    for (;;) {
        tok *t = peek(ps);
        dj__jstmt *s = NULL;
        if (t->k == T_EOF) {
            if (ends) {
                const char *want = ends[0];
                for (int k = 0; ends[k]; k++)
                    if (!strncmp(ends[k], "end", 3)) want = ends[k];
                char msg[64];
                snprintf(msg, sizeof msg, "missing '{%% %s %%}'", want);
                return syntax(t->line, msg);
            }
            *end_at = ps->at;
            break;
        }
        if (t->k == T_TEXT) {
            ps->at++;
            if (!(s = new_stmt(ps, JS_TEXT, t->line))) return OOM();
            s->text = t->p;
            s->text_len = t->n;
        } else if (t->k == T_VAR_BEGIN) {
            ps->at++;
            if (!(s = new_stmt(ps, JS_OUT, t->line))) return OOM();
            TRY(parse_expr(ps, &s->e));
            if (peek(ps)->k != T_VAR_END) return syntax(peek(ps)->line, "expected '}}'");
            ps->at++;
        } else if (t->k == T_BLOCK_BEGIN) {
            tok *kw = &ps->toks[ps->at + 1];
            bool is_end = false;
            for (int k = 0; ends && ends[k]; k++)
                if (is_name(kw, ends[k])) is_end = true;
            if (is_end) {
                *end_at = ps->at + 1;
                break;
            }
            ps->at++;
            TRY(parse_block(ps, &s));
        } else {
            return syntax(t->line, "unexpected token");
        }
        *tail = s;
        tail = &s->next;
    }
    *out = head;
    return DJ_OK;
}

dj_status dj__jinja_parse(dj_chat_template_t *t, const char *src, size_t len) {
    parser ps = {.t = t, .line = 1};
    /* newlines normalised to \n and one trailing newline dropped, as Jinja does */
    ps.src = dj__arena_alloc(&t->arena, len + 1);
    if (!ps.src) return OOM();
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            ps.src[ps.len++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            ps.src[ps.len++] = src[i];
        }
    }
    if (ps.len && ps.src[ps.len - 1] == '\n') ps.len--;
    dj_status st = lex(&ps);
    if (st == DJ_OK) {
        size_t end;
        st = parse_body(&ps, NULL, &t->body, &end);
    }
    free(ps.toks);
    return st;
}
