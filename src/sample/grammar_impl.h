/* grammar_impl.h: the compiled schema's nodes and the matcher's parse stacks,
 * shared by the compiler/matcher (grammar.c) and the token masks (grammar_mask.c). */
#ifndef DJ_GRAMMAR_IMPL_H
#define DJ_GRAMMAR_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "djinn/grammar.h"

#define DJ__G_INF (UINT32_MAX / 4) /* no finite value / completion */
#define DJ__G_MAX_ALT 8            /* parse stacks a state keeps (anyOf forks; more are dropped: a narrower set) */
#define DJ__G_MAX_PROPS 64         /* properties of one object (a 64-bit seen mask) */

typedef enum {
    DJ__G_ANYOF,   /* one of alts (any value is the anyOf of the built-in free nodes) */
    DJ__G_OBJECT,  /* props listed, or free (any keys and values) */
    DJ__G_ARRAY,
    DJ__G_STRING,
    DJ__G_NUMBER,
    DJ__G_INTEGER,
    DJ__G_LITS     /* one of a sorted list of JSON texts (enum, const, true/false, null) */
} dj__g_kind;

typedef struct dj__g_node {
    dj__g_kind kind;
    bool free_obj;        /* OBJECT: no properties listed: any keys, any values */
    uint32_t n_props;
    char **names;         /* [n_props] sorted (bytes); no '"', '\\' or control characters */
    uint32_t *name_len;   /* [n_props] */
    int32_t *prop;        /* [n_props] each property's node */
    uint64_t required;    /* bit k: names[k] is required */
    int32_t items;        /* ARRAY: the items' node */
    uint32_t min_items, max_items;
    uint32_t n_lits;
    char **lits;          /* [n_lits] sorted, distinct */
    uint32_t *lit_len;
    uint32_t n_alts;
    int32_t *alts;        /* [n_alts] ANYOF */
    uint32_t minlen;      /* bytes of the shortest value (DJ__G_INF: none) */
} dj__g_node;

/* built-in nodes of every grammar */
enum { DJ__G_N_ANY, DJ__G_N_FREE_OBJ, DJ__G_N_FREE_ARR, DJ__G_N_STR, DJ__G_N_NUM, DJ__G_N_WORDS, DJ__G_N_ROOT };

struct dj_grammar {
    dj__g_node *n; /* [n_nodes] */
    uint32_t n_nodes, cap;
};

/* One frame of a parse stack: what is being read and where it stands. */
typedef enum { DJ__F_VALUE, DJ__F_OBJ, DJ__F_ARR, DJ__F_STR, DJ__F_NUM, DJ__F_LIT } dj__f_type;
typedef struct dj__g_frame {
    int32_t node;
    uint8_t type;  /* dj__f_type */
    uint8_t phase; /* per type (grammar.c) */
    uint8_t ws;    /* white space characters in a row here */
    uint8_t lead;  /* STR: the lead byte of the UTF-8 sequence under way (0 none) */
    uint32_t a, b, c; /* OBJ: key range lo, hi, position / the key's index in a; ARR: items so far in a;
                         STR: continuation bytes due in a, hex digits due in b; NUM: length in a;
                         LIT: range lo, hi, position */
    uint64_t seen; /* OBJ: properties written (bits by name index) */
} dj__g_frame;

typedef struct dj__g_stack {
    uint32_t depth;
    dj__g_frame f[DJ_GRAMMAR_MAX_DEPTH];
} dj__g_stack;

struct dj_grammar_state {
    const dj_grammar_t *g;
    uint32_t n; /* live stacks; 0: dead */
    dj__g_stack s[DJ__G_MAX_ALT];
};

/* Copies the used part of src into dst. */
void dj__grammar_state_copy(dj_grammar_state_t *dst, const dj_grammar_state_t *src);
/* One byte into st; false when dead. tmp: scratch of DJ__G_TMP stacks. */
#define DJ__G_TMP 32
bool dj__grammar_feed_byte(dj_grammar_state_t *st, uint8_t c, dj__g_stack *tmp);
/* A state at the start of g. */
void dj__grammar_state_init(dj_grammar_state_t *st, const dj_grammar_t *g);

#endif
