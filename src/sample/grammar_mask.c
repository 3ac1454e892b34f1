/* grammar_mask.c: a model's token texts as a trie, and one generation's
 * constraint - the grammar state walked down the trie for each step's mask of allowed ids. */
#include "sample/grammar_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "djinn/alloc.h"
#include "model/tok_impl.h"

#define MAX_TOKEN_BYTES 256 /* longer token texts are never allowed (the walk keeps a state per byte) */

typedef struct tnode {
    uint32_t child;   /* first child (0: none; the root is 0 and never a child) */
    uint32_t sibling; /* next child of the same parent (0: none) */
    uint32_t ids_off, n_ids; /* ids ending here: ids[ids_off, +n_ids) */
    uint32_t below;   /* bytes of the longest path under this node */
    uint32_t sub_lo, sub_hi; /* the ids of this node and all below it: ids[sub_lo, sub_hi) (sorted texts: one run) */
    uint8_t byte;
    bool plain;       /* this byte and every byte below are plain string characters (' '..'~' but '"', '\\') */
} tnode;

struct dj_grammar_vocab {
    uint32_t n_vocab;
    tnode *t; /* [n_t]; t[0] the root */
    uint32_t n_t;
    int32_t *ids;      /* [n_ids] in trie order */
    uint32_t n_ids;
    char *bytes;       /* every allowed id's text */
    uint32_t *off, *len; /* [n_vocab] each id's text in bytes (len 0: never allowed) */
    uint32_t max_len;
};

typedef struct tok_text {
    int32_t id;
    uint32_t off, len;
    const char *p; /* the text (set once the bytes stop moving) */
} tok_text;

static int cmp_text(const void *pa, const void *pb) {
    const tok_text *a = pa, *b = pb;
    const int c = memcmp(a->p, b->p, a->len < b->len ? a->len : b->len);
    if (c) return c;
    if (a->len != b->len) return a->len < b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

void dj_grammar_vocab_free(dj_grammar_vocab_t *v) {
    if (!v) return;
    free(v->t);
    free(v->ids);
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v);
}

uint32_t dj_grammar_vocab_size(const dj_grammar_vocab_t *v) { return v->n_vocab; }

static bool plain_byte(uint8_t b) { return b >= 0x20 && b < 0x7f && b != '"' && b != '\\'; }

/* below, plain and the id runs of node k's subtree. */
static uint32_t fill_below(tnode *t, uint32_t k, int depth) {
    uint32_t m = 0;
    bool plain = k == 0 || plain_byte(t[k].byte);
    uint32_t lo = t[k].n_ids ? t[k].ids_off : UINT32_MAX, hi = t[k].n_ids ? t[k].ids_off + t[k].n_ids : 0;
    for (uint32_t c = t[k].child; c; c = t[c].sibling) {
        const uint32_t b = depth < MAX_TOKEN_BYTES + 2 ? 1 + fill_below(t, c, depth + 1) : 1;
        if (b > m) m = b;
        plain = plain && t[c].plain;
        if (t[c].sub_lo < lo) lo = t[c].sub_lo;
        if (t[c].sub_hi > hi) hi = t[c].sub_hi;
    }
    t[k].plain = plain;
    t[k].sub_lo = lo == UINT32_MAX ? 0 : lo;
    t[k].sub_hi = lo == UINT32_MAX ? 0 : hi;
    return t[k].below = m;
}

dj_status dj_grammar_vocab_new(const dj_tokenizer_t *tok, uint32_t n_vocab, dj_grammar_vocab_t **out) {
    *out = NULL;
    if (!tok || n_vocab == 0) return dj_fail(DJ_EINVAL, "grammar vocabulary: no tokenizer or an empty vocabulary");
    dj_grammar_vocab_t *v = dj_calloc(1, sizeof *v);
    tok_text *tt = dj_calloc(n_vocab, sizeof *tt);
    dj__sbuf all = {0};
    dj_status st = DJ_OK;
    if (!v || !tt || !(v->off = dj_calloc(n_vocab, sizeof *v->off)) || !(v->len = dj_calloc(n_vocab, sizeof *v->len))) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto fail;
    }
    v->n_vocab = n_vocab;
    uint32_t n = 0;
    for (uint32_t id = 0; id < n_vocab && id < tok->n_ids; id++) {
        if (tok->id_off[id] == DJ__TOK_NO_STR) continue;
        bool special = false;
        for (uint32_t a = 0; tok->id_added[id] && a < tok->n_added; a++)
            if (tok->added[a].id == (int32_t)id) special = tok->added[a].special;
        if (special) continue;
        dj__sbuf one = {0};
        const int32_t i = (int32_t)id;
        /* the text it adds mid-way (not first: no decoder's start rule) */
        st = dj__tok_decode_raw(tok, &i, 1, false, false, &one);
        if (st == DJ_OK && one.n && one.n <= MAX_TOKEN_BYTES) {
            tt[n] = (tok_text){.id = i, .off = (uint32_t)all.n, .len = (uint32_t)one.n};
            st = dj__sbuf_put(&all, one.p, one.n);
            n++;
        }
        dj__sbuf_free(&one);
        if (st != DJ_OK) goto fail;
    }
    v->bytes = all.p;
    all.p = NULL;
    for (uint32_t k = 0; k < n; k++) tt[k].p = v->bytes + tt[k].off;
    qsort(tt, n, sizeof *tt, cmp_text);
    /* the trie: sorted texts share their prefixes with the texts just before */
    v->t = dj_calloc((size_t)(all.n ? all.n : 0) + n + 1, sizeof *v->t);
    v->ids = dj_calloc(n ? n : 1, sizeof *v->ids);
    if (!v->t || !v->ids) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto fail;
    }
    v->n_t = 1;
    for (uint32_t k = 0; k < n; k++) {
        const uint8_t *s = (const uint8_t *)v->bytes + tt[k].off;
        uint32_t at = 0;
        for (uint32_t b = 0; b < tt[k].len; b++) {
            const uint32_t c = v->t[at].child;
            if (c && v->t[c].byte == s[b]) { /* the newest child is the one a sorted text continues */
                at = c;
                continue;
            }
            const uint32_t fresh = v->n_t++;
            v->t[fresh] = (tnode){.byte = s[b], .sibling = c};
            v->t[at].child = fresh;
            at = fresh;
        }
        if (v->t[at].n_ids == 0) v->t[at].ids_off = v->n_ids;
        v->t[at].n_ids++;
        v->ids[v->n_ids++] = tt[k].id;
        v->off[tt[k].id] = tt[k].off;
        v->len[tt[k].id] = tt[k].len;
        if (tt[k].len > v->max_len) v->max_len = tt[k].len;
    }
    fill_below(v->t, 0, 0);
    free(tt);
    *out = v;
    return DJ_OK;
fail:
    dj__sbuf_free(&all);
    free(tt);
    dj_grammar_vocab_free(v);
    return st;
}

/* ---- the constraint ---- */

static void vocab_release(dj_grammar_vocab_t *v, bool alone);

struct dj_constraint {
    dj_grammar_t *g;                 /* owned */
    const dj_grammar_vocab_t *v;     /* borrowed, or own_v */
    dj_grammar_vocab_t *own_v;       /* from the cache (released), or own_free: built for this one (freed) */
    bool own_free;
    int32_t *eos;                    /* [n_eos] */
    size_t n_eos;
    dj_grammar_state_t *levels;      /* [max_len + 1]: the state down the trie; levels[0] the text's */
    dj__g_stack *tmp;                /* [DJ__G_TMP] */
};

void dj_constraint_free(dj_constraint_t *c) {
    if (!c) return;
    dj_grammar_free(c->g);
    vocab_release(c->own_v, c->own_free);
    free(c->eos);
    free(c->levels);
    free(c->tmp);
    free(c);
}

dj_status dj_constraint_new(dj_grammar_t *g, const dj_grammar_vocab_t *v, const int32_t *eos, size_t n_eos,
                            dj_constraint_t **out) {
    *out = NULL;
    if (!g || !v || (n_eos && !eos)) {
        dj_grammar_free(g);
        return dj_fail(DJ_EINVAL, "dj_constraint_new: NULL grammar, vocabulary or EOS ids");
    }
    dj_constraint_t *c = dj_calloc(1, sizeof *c);
    if (!c) {
        dj_grammar_free(g);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    c->g = g;
    c->v = v;
    c->levels = dj_malloc(((size_t)v->max_len + 1) * sizeof *c->levels);
    c->tmp = dj_malloc(DJ__G_TMP * sizeof *c->tmp);
    c->eos = dj_malloc((n_eos ? n_eos : 1) * sizeof *c->eos);
    if (!c->levels || !c->tmp || !c->eos) {
        dj_constraint_free(c);
        return dj_fail(DJ_ENOMEM, "out of memory for a grammar's states");
    }
    if (n_eos) memcpy(c->eos, eos, n_eos * sizeof *eos);
    c->n_eos = n_eos;
    dj__grammar_state_init(&c->levels[0], g);
    *out = c;
    return DJ_OK;
}

/* ---- the vocabularies of the tokenizers in use, built once ----
 * Keyed by a hash of the token texts themselves (not the tokenizer's
 * address, which a reloaded model may reuse for another): a hit is the same
 * trie. Entries in use are never evicted; a full cache of busy entries
 * builds one for the caller alone. */
#define VCACHE 4
static struct vcache {
    uint64_t key;
    uint32_t n_vocab, refs;
    uint64_t used;
    dj_grammar_vocab_t *v;
} vcache[VCACHE];
static uint64_t vcache_clock;
static pthread_mutex_t vcache_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t vocab_key(const dj_tokenizer_t *tok) {
    XXH3_state_t *h = XXH3_createState();
    if (!h) return 0;
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, &tok->n_ids, sizeof tok->n_ids);
    XXH3_64bits_update(h, tok->arena, tok->arena_len);
    XXH3_64bits_update(h, tok->id_off, (size_t)tok->n_ids * sizeof *tok->id_off);
    XXH3_64bits_update(h, tok->id_len, (size_t)tok->n_ids * sizeof *tok->id_len);
    XXH3_64bits_update(h, tok->id_added, tok->n_ids);
    for (uint32_t a = 0; a < tok->n_added; a++) XXH3_64bits_update(h, &tok->added[a].special, sizeof(bool));
    const uint64_t k = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return k;
}

/* The vocabulary of tok over n_vocab ids; *alone: not cached (the caller frees it). */
static dj_status vocab_acquire(const dj_tokenizer_t *tok, uint32_t n_vocab, dj_grammar_vocab_t **out, bool *alone) {
    const uint64_t key = vocab_key(tok);
    *alone = false;
    pthread_mutex_lock(&vcache_mu);
    for (int i = 0; i < VCACHE; i++)
        if (vcache[i].v && vcache[i].key == key && vcache[i].n_vocab == n_vocab) {
            vcache[i].refs++;
            vcache[i].used = ++vcache_clock;
            *out = vcache[i].v;
            pthread_mutex_unlock(&vcache_mu);
            return DJ_OK;
        }
    /* built under the lock: one build per tokenizer, however many requests wait */
    dj_status st = dj_grammar_vocab_new(tok, n_vocab, out);
    if (st == DJ_OK) {
        int slot = -1;
        for (int i = 0; i < VCACHE; i++)
            if (!vcache[i].refs && (slot < 0 || !vcache[i].v || (vcache[slot].v && vcache[i].used < vcache[slot].used)))
                slot = i;
        if (slot < 0) {
            *alone = true;
        } else {
            dj_grammar_vocab_free(vcache[slot].v);
            vcache[slot] = (struct vcache){.key = key, .n_vocab = n_vocab, .refs = 1, .used = ++vcache_clock, .v = *out};
        }
    }
    pthread_mutex_unlock(&vcache_mu);
    return st;
}

static void vocab_release(dj_grammar_vocab_t *v, bool alone) {
    if (!v) return;
    if (alone) {
        dj_grammar_vocab_free(v);
        return;
    }
    pthread_mutex_lock(&vcache_mu);
    for (int i = 0; i < VCACHE; i++)
        if (vcache[i].v == v && vcache[i].refs) vcache[i].refs--;
    pthread_mutex_unlock(&vcache_mu);
}

dj_status dj_constraint_from_schema(const char *schema, size_t len, const dj_tokenizer_t *tok, uint32_t n_vocab,
                                    const int32_t *eos, size_t n_eos, dj_constraint_t **out) {
    *out = NULL;
    if (!tok) return dj_fail(DJ_EINVAL, "structured output needs the model's tokenizer.json: this model has none");
    dj_grammar_t *g = NULL;
    dj_grammar_vocab_t *v = NULL;
    bool alone = false;
    dj_status st = dj_grammar_from_json_schema(schema, len, &g);
    if (st == DJ_OK) st = vocab_acquire(tok, n_vocab, &v, &alone);
    if (st != DJ_OK) {
        dj_grammar_free(g);
        return st;
    }
    if ((st = dj_constraint_new(g, v, eos, n_eos, out)) != DJ_OK) {
        vocab_release(v, alone);
        return st;
    }
    (*out)->own_v = v;
    (*out)->own_free = alone;
    return DJ_OK;
}

typedef struct walk {
    dj_constraint_t *c;
    uint8_t *allowed;
    uint32_t budget; /* the cost a token may leave */
    uint32_t count;
} walk;

/* Inside a string, between characters: a plain character leaves the state as it is. */
static bool in_plain_string(const dj_grammar_state_t *s) {
    if (s->n != 1 || !s->s[0].depth) return false;
    const dj__g_frame *f = &s->s[0].f[s->s[0].depth - 1];
    return f->type == DJ__F_STR && f->phase == 0 /* S_BODY */ && f->a == 0;
}

static void walk_down(walk *w, uint32_t node, uint32_t depth) {
    const dj_grammar_vocab_t *v = w->c->v;
    const dj_grammar_state_t *here = &w->c->levels[depth];
    /* a run of plain characters in a string: every id below keeps the state (and its cost) */
    const bool plain_here = in_plain_string(here);
    const bool fits = plain_here && dj_grammar_cost(here) <= w->budget;
    for (uint32_t ch = v->t[node].child; ch; ch = v->t[ch].sibling) {
        if (plain_here && v->t[ch].plain) {
            for (uint32_t k = v->t[ch].sub_lo; fits && k < v->t[ch].sub_hi; k++) {
                w->allowed[v->ids[k]] = 1;
                w->count++;
            }
            continue;
        }
        dj_grammar_state_t *st = &w->c->levels[depth + 1];
        dj__grammar_state_copy(st, &w->c->levels[depth]);
        if (!dj__grammar_feed_byte(st, v->t[ch].byte, w->c->tmp)) continue;
        const uint32_t cost = dj_grammar_cost(st);
        /* each byte lowers the cost by at most 1: past this, nothing below fits */
        if (cost > w->budget && cost - w->budget > v->t[ch].below) continue;
        if (cost <= w->budget)
            for (uint32_t k = 0; k < v->t[ch].n_ids; k++) {
                w->allowed[v->ids[v->t[ch].ids_off + k]] = 1;
                w->count++;
            }
        walk_down(w, ch, depth + 1);
    }
}

uint32_t dj_constraint_mask(dj_constraint_t *c, uint32_t tokens_left, uint8_t *allowed) {
    memset(allowed, 0, c->v->n_vocab);
    const dj_grammar_state_t *st = &c->levels[0];
    if (!st->n) return 0;
    walk w = {.c = c, .allowed = allowed, .budget = tokens_left ? tokens_left - 1 : 0};
    if (tokens_left && !dj_grammar_finished(st)) walk_down(&w, 0, 0);
    if (dj_grammar_complete(st))
        for (size_t k = 0; k < c->n_eos; k++)
            if (c->eos[k] >= 0 && (uint32_t)c->eos[k] < c->v->n_vocab && !allowed[c->eos[k]]) {
                allowed[c->eos[k]] = 1;
                w.count++;
            }
    return w.count;
}

bool dj_constraint_accept(dj_constraint_t *c, int32_t id) {
    dj_grammar_state_t *st = &c->levels[0];
    for (size_t k = 0; k < c->n_eos; k++)
        if (c->eos[k] == id) return dj_grammar_complete(st);
    if (id < 0 || (uint32_t)id >= c->v->n_vocab || c->v->len[id] == 0) {
        st->n = 0;
        return false;
    }
    const uint8_t *s = (const uint8_t *)c->v->bytes + c->v->off[id];
    for (uint32_t i = 0; i < c->v->len[id] && st->n; i++) dj__grammar_feed_byte(st, s[i], c->tmp);
    return st->n > 0;
}

bool dj_constraint_finished(const dj_constraint_t *c) { return dj_grammar_finished(&c->levels[0]); }

const dj_grammar_state_t *dj_constraint_state(const dj_constraint_t *c) { return &c->levels[0]; }

uint32_t dj_constraint_vocab_size(const dj_constraint_t *c) { return c->v->n_vocab; }

const dj_grammar_vocab_t *dj_constraint_vocab(const dj_constraint_t *c) { return c->v; }
