/* jinja_impl.h: the chat-template interpreter's insides - arena, syntax
 * tree (jinja_parse.c) and values (jinja_eval.c). Everything of a parsed
 * template lives in its arena; everything of one render in another. */
#ifndef DJ_JINJA_IMPL_H
#define DJ_JINJA_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/chat_template.h"

/* ---- arena: bump allocation in chunks, freed at once ---- */
typedef struct dj__arena_chunk dj__arena_chunk;
typedef struct dj__arena {
    dj__arena_chunk *head;
    size_t used, cap; /* bytes handed out in all, and the most allowed */
    bool nomem;       /* an allocation failed for want of memory, not for cap */
} dj__arena;
void *dj__arena_alloc(dj__arena *a, size_t n); /* zeroed; NULL past cap or out of memory */
void dj__arena_free(dj__arena *a);

/* ---- expressions ---- */
typedef enum {
    JE_LIT,    /* lit */
    JE_NAME,   /* name */
    JE_ATTR,   /* a.name */
    JE_INDEX,  /* a[b] */
    JE_SLICE,  /* a[b:c:d], each may be NULL */
    JE_CALL,   /* a(args) - a is JE_NAME (a global) or JE_ATTR (a method) */
    JE_FILTER, /* a | name(args) */
    JE_TEST,   /* a is [not] name(args) */
    JE_BIN,    /* a op b */
    JE_AND, JE_OR, JE_NOT, JE_NEG, JE_POS,
    JE_COND,   /* b if a else c (c may be NULL) */
    JE_LIST,   /* [args] (tuples too) */
    JE_DICT,   /* {args[2i]: args[2i+1]} */
} dj__jexpr_kind;

typedef enum {
    JOP_ADD, JOP_SUB, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_CONCAT,
    JOP_EQ, JOP_NE, JOP_LT, JOP_LE, JOP_GT, JOP_GE, JOP_IN, JOP_NOTIN,
} dj__jop;

typedef struct dj__jval dj__jval;
typedef struct dj__jexpr dj__jexpr;

/* JV_GEN: what jinja2's select/reject/selectattr/rejectattr and items
 * filters return - a generator: its items are computed at once here (u.l),
 * but it behaves as jinja2's does: always true, no length, an index is
 * undefined, no slice, not printable (Python prints an address), and spent
 * after one pass (a second one is refused, see `used`). */
typedef enum { JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_GEN } dj__jval_kind;
typedef struct dj__jlist {
    size_t n;
    bool tuple;         /* printed as Python prints a tuple */
    bool used;          /* JV_GEN: iterated once already */
    struct dj__jval *v; /* [n] */
} dj__jlist;
typedef struct dj__jdict {
    size_t n, cap;
    const char **key;   /* [n] NUL-terminated */
    size_t *key_len;    /* [n] */
    struct dj__jval *v; /* [n] */
} dj__jdict;
struct dj__jval {
    dj__jval_kind k;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p; /* not necessarily NUL-terminated */
            size_t n;
        } s;
        dj__jlist *l; /* JV_LIST and JV_GEN */
        dj__jdict *d; /* JV_DICT and JV_NS (a namespace: a dict set may change) */
    } u;
};

struct dj__jexpr {
    dj__jexpr_kind kind;
    int line;
    dj__jop op;
    bool negate;            /* JE_TEST: is not; JE_LIST: a tuple */
    dj__jval lit;           /* JE_LIT */
    const char *name;       /* JE_NAME, JE_ATTR, JE_FILTER, JE_TEST */
    dj__jexpr *a, *b, *c, *d;
    dj__jexpr **args;       /* [n_args] positional (JE_CALL/FILTER/TEST/LIST/DICT) */
    size_t n_args;
    const char **kw_names;  /* [n_kw] keyword arguments */
    dj__jexpr **kw;         /* [n_kw] */
    size_t n_kw;
};

/* ---- statements ---- */
typedef enum { JS_TEXT, JS_OUT, JS_IF, JS_FOR, JS_SET, JS_SETBLOCK, JS_BREAK, JS_CONTINUE } dj__jstmt_kind;
typedef struct dj__jstmt dj__jstmt;
struct dj__jstmt {
    dj__jstmt_kind kind;
    int line;
    dj__jstmt *next;
    const char *text;       /* JS_TEXT */
    size_t text_len;
    dj__jexpr *e;           /* JS_OUT value, JS_IF/JS_FOR condition... JS_SET value, JS_FOR iterable */
    dj__jexpr *filter;      /* JS_FOR: `if` filter (may be NULL) */
    dj__jstmt *body, *orelse; /* JS_IF then/else (elif is an if in orelse), JS_FOR body/else, JS_SETBLOCK body */
    const char *targets[4]; /* JS_FOR loop variables, JS_SET/JS_SETBLOCK name */
    size_t n_targets;
    const char *attr;       /* JS_SET ns.attr: the attribute (targets[0] is ns) */
};

struct dj_chat_template {
    dj__arena arena;
    dj__jstmt *body;
    char *bos, *eos; /* malloc'd */
};

/* jinja_parse.c: the statements of src into t->body (t->arena). */
dj_status dj__jinja_parse(dj_chat_template_t *t, const char *src, size_t len);
/* jinja_eval.c: render t with vars (a cJSON object, void * to keep cJSON out of this header). */
dj_status dj__jinja_render(const dj_chat_template_t *t, const void *vars, char **text, size_t *len);

/* Whether JSON text s[0..n) holds a NUL byte or the escape \u0000: cJSON
 * keeps strings NUL-terminated, so such a string would be cut there
 * silently; callers refuse it instead. */
bool dj__json_has_nul_escape(const char *s, size_t n);

/* Known names, shared by the parser (refuses others) and the renderer. */
bool dj__jinja_filter_known(const char *name);
bool dj__jinja_test_known(const char *name);
bool dj__jinja_global_known(const char *name);
bool dj__jinja_method_known(const char *name);

#endif
