/* tok_encode.c: text -> ids the way the `tokenizers` library does it: added
 * tokens split out of the raw text, normalizers, pre-tokenizers, BPE merges
 * (priority queue per word), then the post-processor's special tokens. */
#include <stdlib.h>
#include "djinn/alloc.h"
#include <string.h>
#include <utf8proc.h>

#include "model/tok_impl.h"

/* A span of a string: [start, end); is_match says whether a pattern matched it. */
typedef struct {
    size_t start, end;
    bool is_match;
} span;

typedef struct {
    span *v;
    size_t n, cap;
} spans;

/* Pieces of text on their way through the pre-tokenizers. first: the piece
 * starts at offset 0 of the original input (Metaspace's "first" scheme). */
typedef struct {
    size_t off, len;
    bool first;
} piece;

typedef struct {
    dj__sbuf text;
    piece *v;
    size_t n, cap;
} plist;

typedef struct {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes of the word it covers; 0 = merged away */
} sym;

typedef struct {
    uint32_t rank, pos;
    int32_t new_id;
} hent;

/* Everything one encode call allocates; nothing outlives the call. */
typedef struct {
    const dj_tokenizer_t *tok;
    int32_t *ids;
    size_t n, cap;
    pcre2_match_data *md;
    sym *syms;
    size_t syms_cap;
    hent *heap;
    size_t heap_n, heap_cap;
    dj__sbuf key;
    spans sp;
    const dj_text_span *plain; /* [n_plain] sorted, disjoint: raw bytes where no special token may match */
    size_t n_plain;
} ectx;

/* Whether [a, b) overlaps one of the plain spans (binary search). */
static bool in_plain(const ectx *c, size_t a, size_t b) {
    size_t lo = 0, hi = c->n_plain;
    while (lo < hi) { /* the first span ending after a */
        const size_t mid = lo + (hi - lo) / 2;
        if (c->plain[mid].end <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo < c->n_plain && c->plain[lo].start < b;
}

static dj_status oom(void) { return dj_fail(DJ_ENOMEM, "tokenizer: out of memory"); }

static dj_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return DJ_OK;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *q = dj_realloc(*p, nc * elem);
    if (!q) return oom();
    *p = q;
    *cap = nc;
    return DJ_OK;
}

static dj_status spans_add(spans *s, size_t a, size_t b, bool m) {
    dj_status st = grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v);
    if (st) return st;
    s->v[s->n++] = (span){a, b, m};
    return DJ_OK;
}

static dj_status plist_add(plist *l, const char *s, size_t n, bool first) {
    dj_status st = grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v);
    if (st) return st;
    l->v[l->n++] = (piece){l->text.n, n, first};
    return dj__sbuf_put(&l->text, s, n);
}

static void plist_free(plist *l) {
    dj__sbuf_free(&l->text);
    free(l->v);
}

static dj_status emit(ectx *c, int32_t id) {
    dj_status st = grow((void **)&c->ids, &c->cap, c->n + 1, sizeof *c->ids);
    if (st) return st;
    c->ids[c->n++] = id;
    return DJ_OK;
}

static size_t cp_len(uint8_t b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

/* Rust's char::is_whitespace (the White_Space property). */
static bool is_ws(int32_t c) {
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool is_numeric(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

static bool is_word_char(int32_t c) {
    if (c == '_') return true;
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || is_numeric(c);
}

/* ---- regex matching ---- */

/* All matches of re in s as spans covering s (gaps are non-matches). */
static dj_status regex_spans(ectx *c, const pcre2_code *re, const char *s, size_t n, spans *out) {
    out->n = 0;
    size_t pos = 0, prev = 0;
    dj_status st;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, c->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return dj_fail(DJ_EFORMAT, "tokenizer: regex match failed: %s", (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms || ms < prev || me > n) return dj_fail(DJ_EUNSUPPORTED, "tokenizer: regex with \\K lookbehind tricks");
        if (prev != ms && (st = spans_add(out, prev, ms, false))) return st;
        if ((st = spans_add(out, ms, me, true))) return st;
        prev = me;
        if (me == ms) {
            if (me >= n) break;
            pos = me + cp_len((uint8_t)s[me]);
        } else {
            pos = me;
        }
    }
    if (prev != n) return spans_add(out, prev, n, false);
    return DJ_OK;
}

/* Each character for which pred holds (or which equals ch) is its own match. */
static dj_status char_spans(const char *s, size_t n, const char *ch, size_t ch_len, bool (*pred)(int32_t),
                            spans *out) {
    out->n = 0;
    size_t last = 0;
    dj_status st;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        size_t l = dj__utf8_cp(s + i, &cp);
        bool m = pred ? pred(cp) : (l == ch_len && !memcmp(s + i, ch, l));
        if (m) {
            if (last < i && (st = spans_add(out, last, i, false))) return st;
            if ((st = spans_add(out, i, i + l, true))) return st;
            last = i + l;
        }
        i += l;
    }
    if (last < n) return spans_add(out, last, n, false);
    return DJ_OK;
}

/* Applies a split behavior to spans in place; afterwards is_match = "remove". */
static void apply_behavior(spans *sp, dj__split_behavior b, bool invert) {
    if (invert)
        for (size_t i = 0; i < sp->n; i++) sp->v[i].is_match = !sp->v[i].is_match;
    size_t k = 0;
    bool prevm = false;
    switch (b) {
    case DJ__SPLIT_REMOVED:
        return;
    case DJ__SPLIT_ISOLATED:
        for (size_t i = 0; i < sp->n; i++) sp->v[i].is_match = false;
        return;
    case DJ__SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            bool m = sp->v[i].is_match;
            if (m == prevm && k > 0) sp->v[k - 1].end = sp->v[i].end;
            else sp->v[k++] = (span){sp->v[i].start, sp->v[i].end, false};
            prevm = m;
        }
        break;
    case DJ__SPLIT_MERGED_PREV:
        for (size_t i = 0; i < sp->n; i++) {
            bool m = sp->v[i].is_match;
            if (m && !prevm && k > 0) sp->v[k - 1].end = sp->v[i].end;
            else sp->v[k++] = (span){sp->v[i].start, sp->v[i].end, false};
            prevm = m;
        }
        break;
    case DJ__SPLIT_MERGED_NEXT: /* the same, walking backwards */
        for (size_t j = sp->n; j-- > 0;) {
            bool m = sp->v[j].is_match;
            span cur = sp->v[j];
            if (m && !prevm && k > 0) {
                sp->v[sp->n - k].start = cur.start;
            } else {
                k++;
                sp->v[sp->n - k] = (span){cur.start, cur.end, false};
            }
            prevm = m;
        }
        memmove(sp->v, sp->v + (sp->n - k), k * sizeof *sp->v);
        break;
    }
    sp->n = k;
}

/* Adds the kept, non-empty spans of p's text s as pieces of out. */
static dj_status add_spans(plist *out, const spans *sp, const char *s, bool first) {
    for (size_t i = 0; i < sp->n; i++) {
        const span *v = &sp->v[i];
        if (v->is_match || v->end == v->start) continue;
        dj_status st = plist_add(out, s + v->start, v->end - v->start, first && v->start == 0);
        if (st) return st;
    }
    return DJ_OK;
}

/* ---- normalizers ---- */

static dj_status replace_all(const dj__norm *nm, ectx *c, const char *s, size_t n, dj__sbuf *out) {
    dj_status st;
    if (nm->re) {
        spans sp = {0};
        if ((st = regex_spans(c, nm->re, s, n, &sp))) {
            free(sp.v);
            return st;
        }
        for (size_t i = 0; i < sp.n && !st; i++)
            st = sp.v[i].is_match ? dj__sbuf_put(out, nm->content, nm->content_len)
                                  : dj__sbuf_put(out, s + sp.v[i].start, sp.v[i].end - sp.v[i].start);
        free(sp.v);
        return st;
    }
    size_t i = 0, run = 0;
    while (i + nm->str_len <= n) {
        if (!memcmp(s + i, nm->str, nm->str_len)) {
            if ((st = dj__sbuf_put(out, s + run, i - run))) return st;
            if ((st = dj__sbuf_put(out, nm->content, nm->content_len))) return st;
            i += nm->str_len;
            run = i;
        } else {
            i++;
        }
    }
    return dj__sbuf_put(out, s + run, n - run);
}

static dj_status normalize_one(const dj__norm *nm, ectx *c, const char *s, size_t n, dj__sbuf *out) {
    dj_status st;
    utf8proc_option_t opt = UTF8PROC_STABLE;
    switch (nm->kind) {
    case DJ__NORM_PREPEND:
        if (n && (st = dj__sbuf_put(out, nm->str, nm->str_len))) return st;
        return dj__sbuf_put(out, s, n);
    case DJ__NORM_REPLACE:
        return replace_all(nm, c, s, n, out);
    case DJ__NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case DJ__NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case DJ__NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case DJ__NORM_NFKD: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    if (n == 0) return dj__sbuf_put(out, "", 0);
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, opt);
    if (r < 0) return dj_fail(DJ_EFORMAT, "tokenizer: Unicode normalization failed: %s", utf8proc_errmsg(r));
    st = dj__sbuf_put(out, dst, (size_t)r);
    free(dst);
    return st;
}

static dj_status normalize(const dj_tokenizer_t *tok, ectx *c, const char *s, size_t n, dj__sbuf *out) {
    dj__sbuf a = {0}, b = {0};
    dj_status st = dj__sbuf_put(&a, s, n);
    for (size_t i = 0; i < tok->n_norms && !st; i++) {
        b.n = 0;
        if ((st = dj__sbuf_put(&b, "", 0))) break;
        st = normalize_one(&tok->norms[i], c, a.p, a.n, &b);
        dj__sbuf t = a;
        a = b;
        b = t;
    }
    if (!st) st = dj__sbuf_put(out, a.p, a.n);
    dj__sbuf_free(&a);
    dj__sbuf_free(&b);
    return st;
}

dj_status dj__tok_normalize(const dj_tokenizer_t *tok, const char *s, size_t n, dj__sbuf *out) {
    ectx c = {0};
    c.md = pcre2_match_data_create(1, NULL);
    if (!c.md) return oom();
    dj_status st = normalize(tok, &c, s, n, out);
    pcre2_match_data_free(c.md);
    return st;
}

/* ---- added tokens ---- */

/* Splits s on the added tokens of set (leftmost-longest, then lstrip /
 * rstrip / single_word as the `tokenizers` AddedVocabulary does). Spans with
 * is_match carry the added token index in `end`'s companion array ids. */
typedef struct {
    size_t start, end;
    int32_t id; /* -1: plain text */
} seg;

typedef struct {
    seg *v;
    size_t n, cap;
} segs;

static dj_status segs_add(segs *s, size_t a, size_t b, int32_t id) {
    dj_status st = grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v);
    if (st) return st;
    s->v[s->n++] = (seg){a, b, id};
    return DJ_OK;
}

static int32_t last_cp(const char *s, size_t end) {
    size_t i = end;
    while (i > 0 && ((uint8_t)s[i - 1] & 0xC0) == 0x80) i--;
    if (i == 0) return -1;
    int32_t cp;
    dj__utf8_cp(s + i - 1, &cp);
    return cp;
}

/* no_special: special tokens are not matched at all; c (may be NULL): nor
 * where they overlap c's plain spans (s is then the raw text from byte 0). */
static dj_status split_added(const dj_tokenizer_t *tok, const dj__added_set *set, bool norm, const char *s, size_t n,
                             const ectx *c, bool no_special, segs *out) {
    out->n = 0;
    size_t start_off = 0, pos = 0;
    dj_status st;
    while (set->n && pos < n) {
        /* leftmost-longest match at or after pos */
        size_t ms = n, best = 0;
        const dj__added *hit = NULL;
        for (size_t i = pos; i < n && !hit; i++) {
            uint8_t b = (uint8_t)s[i];
            for (uint32_t k = set->bucket[b]; k < set->bucket[b + 1]; k++) {
                const dj__added *a = &tok->added[set->idx[k]];
                size_t l = norm ? a->nlen : a->len;
                const char *t = tok->arena + (norm ? a->noff : a->off);
                if (a->special && (no_special || (c && c->n_plain && in_plain(c, i, i + l)))) continue;
                if (l > best && i + l <= n && !memcmp(s + i, t, l)) {
                    best = l;
                    hit = a;
                    ms = i;
                }
            }
        }
        if (!hit) break;
        size_t me = ms + best, start = ms, stop = me;
        pos = me;
        if (hit->single_word) {
            int32_t before = last_cp(s, ms), after = -1;
            if (me < n) dj__utf8_cp(s + me, &after);
            if ((before >= 0 && is_word_char(before)) || (after >= 0 && is_word_char(after))) continue;
        }
        if (hit->lstrip) {
            size_t ns = ms;
            while (ns > 0) {
                int32_t cp = last_cp(s, ns);
                if (!is_ws(cp)) break;
                size_t l = ns;
                while (l > 0 && ((uint8_t)s[l - 1] & 0xC0) == 0x80) l--;
                ns = l - 1;
            }
            start = ns > start_off ? ns : start_off;
        }
        if (hit->rstrip) {
            while (stop < n) {
                int32_t cp;
                size_t l = dj__utf8_cp(s + stop, &cp);
                if (!is_ws(cp)) break;
                stop += l;
            }
            pos = stop;
        }
        if (start_off < start && (st = segs_add(out, start_off, start, -1))) return st;
        if ((st = segs_add(out, start, stop, hit->id))) return st;
        start_off = stop;
    }
    if (start_off < n) return segs_add(out, start_off, n, -1);
    return DJ_OK;
}

/* ---- pre-tokenizers ---- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves,
 * the other 68 (0-32, 127-160, 173) map to U+0100.. in byte order. */
static size_t byte_char(uint8_t b, char out[4]) {
    int32_t cp = b <= 32 ? 256 + b : (b >= 127 && b <= 160) ? 256 + 33 + (b - 127) : b == 173 ? 323 : b;
    return dj__utf8_put(out, cp);
}

static dj_status pretok_one(ectx *c, const dj__pretok *p, const plist *in, plist *out) {
    dj_status st = DJ_OK;
    dj__sbuf tmp = {0};
    for (size_t i = 0; i < in->n && !st; i++) {
        const piece *pc = &in->v[i];
        const char *s = in->text.p + pc->off;
        size_t n = pc->len;
        switch (p->kind) {
        case DJ__PRE_SPLIT:
            if (!(st = regex_spans(c, p->re, s, n, &c->sp))) {
                apply_behavior(&c->sp, p->behavior, p->invert);
                st = add_spans(out, &c->sp, s, pc->first);
            }
            break;
        case DJ__PRE_DIGITS:
            if (!(st = char_spans(s, n, NULL, 0, is_numeric, &c->sp))) {
                apply_behavior(&c->sp, p->individual_digits ? DJ__SPLIT_ISOLATED : DJ__SPLIT_CONTIGUOUS, false);
                st = add_spans(out, &c->sp, s, pc->first);
            }
            break;
        case DJ__PRE_METASPACE: {
            tmp.n = 0;
            bool starts = n >= p->repl_len && !memcmp(s, p->repl, p->repl_len);
            /* a leading space becomes the replacement too */
            if (n && s[0] == ' ') starts = true;
            bool pre = !starts && (p->prepend_scheme == DJ__PREPEND_ALWAYS ||
                                   (p->prepend_scheme == DJ__PREPEND_FIRST && pc->first));
            if (pre) st = dj__sbuf_put(&tmp, p->repl, p->repl_len);
            for (size_t k = 0; k < n && !st; k++)
                st = s[k] == ' ' ? dj__sbuf_put(&tmp, p->repl, p->repl_len) : dj__sbuf_put(&tmp, s + k, 1);
            if (st) break;
            if (p->split) {
                if (!(st = char_spans(tmp.p, tmp.n, p->repl, p->repl_len, NULL, &c->sp))) {
                    apply_behavior(&c->sp, DJ__SPLIT_MERGED_NEXT, false);
                    st = add_spans(out, &c->sp, tmp.p, pc->first);
                }
            } else if (tmp.n) {
                st = plist_add(out, tmp.p, tmp.n, pc->first);
            }
            break;
        }
        case DJ__PRE_BYTELEVEL: {
            tmp.n = 0;
            if (p->add_prefix_space && s[0] != ' ') st = dj__sbuf_put(&tmp, " ", 1);
            if (!st) st = dj__sbuf_put(&tmp, s, n);
            if (st) break;
            span whole = {0, tmp.n, false};
            spans one = {&whole, 1, 1};
            spans *sp = &one;
            if (p->re) {
                sp = &c->sp;
                st = regex_spans(c, p->re, tmp.p, tmp.n, sp);
                apply_behavior(sp, DJ__SPLIT_ISOLATED, false);
            }
            for (size_t k = 0; k < sp->n && !st; k++) {
                const span *v = &sp->v[k];
                if (v->end == v->start) continue;
                dj_status s2 = grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v);
                if (s2) {
                    st = s2;
                    break;
                }
                piece np = {out->text.n, 0, pc->first && v->start == 0};
                for (size_t j = v->start; j < v->end && !st; j++) {
                    char bc[4];
                    size_t bl = byte_char((uint8_t)tmp.p[j], bc);
                    st = dj__sbuf_put(&out->text, bc, bl);
                    np.len += bl;
                }
                out->v[out->n++] = np;
            }
            break;
        }
        }
    }
    dj__sbuf_free(&tmp);
    return st;
}

/* ---- BPE ---- */

static bool hless(const hent *a, const hent *b) { return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos; }

static dj_status heap_push(ectx *c, hent e) {
    dj_status st = grow((void **)&c->heap, &c->heap_cap, c->heap_n + 1, sizeof *c->heap);
    if (st) return st;
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(&e, &c->heap[p])) break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = e;
    return DJ_OK;
}

static hent heap_pop(ectx *c) {
    hent top = c->heap[0], last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const hent *best = &last;
        if (l < n && hless(&c->heap[l], best)) m = l, best = &c->heap[l];
        if (r < n && hless(&c->heap[r], best)) m = r;
        if (m == i) break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n) c->heap[i] = last;
    return top;
}

static dj_status sym_add(ectx *c, size_t *ns, int32_t id, uint32_t len) {
    dj_status st = grow((void **)&c->syms, &c->syms_cap, *ns + 1, sizeof *c->syms);
    if (st) return st;
    int32_t i = (int32_t)*ns;
    c->syms[i] = (sym){id, i - 1, -1, len};
    if (i > 0) c->syms[i - 1].next = i;
    (*ns)++;
    return DJ_OK;
}

static dj_status bpe_word(ectx *c, const char *w, size_t n) {
    const dj_tokenizer_t *tok = c->tok;
    dj_status st;
    if (n == 0) return DJ_OK;
    if (tok->ignore_merges) {
        int32_t id = dj__tok_vocab_find(tok, w, n);
        if (id >= 0) return emit(c, id);
    }
    size_t ns = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        size_t l = cp_len((uint8_t)w[i]);
        const char *key = w + i;
        size_t kl = l;
        if ((i > 0 && tok->cont_prefix) || (i + l == n && tok->word_suffix)) {
            c->key.n = 0;
            if (i > 0 && tok->cont_prefix && (st = dj__sbuf_put(&c->key, tok->cont_prefix, tok->cont_prefix_len)))
                return st;
            if ((st = dj__sbuf_put(&c->key, w + i, l))) return st;
            if (i + l == n && tok->word_suffix && (st = dj__sbuf_put(&c->key, tok->word_suffix, tok->word_suffix_len)))
                return st;
            key = c->key.p;
            kl = c->key.n;
        }
        int32_t id = dj__tok_vocab_find(tok, key, kl);
        if (id >= 0) {
            if (unk >= 0 && (st = sym_add(c, &ns, unk, unk_len))) return st;
            unk = -1;
            if ((st = sym_add(c, &ns, id, (uint32_t)l))) return st;
        } else {
            bool done = false;
            if (tok->byte_fallback) {
                bool all = true;
                for (size_t k = 0; k < kl; k++) all = all && tok->byte_ids[(uint8_t)key[k]] >= 0;
                if (all) {
                    if (unk >= 0 && (st = sym_add(c, &ns, unk, unk_len))) return st;
                    unk = -1;
                    for (size_t k = 0; k < kl; k++)
                        if ((st = sym_add(c, &ns, tok->byte_ids[(uint8_t)key[k]], 1))) return st;
                    done = true;
                }
            }
            if (!done && tok->unk_name) {
                if (tok->unk_id < 0)
                    return dj_fail(DJ_EFORMAT, "tokenizer: unk_token \"%.40s\" is not in the vocab", tok->unk_name);
                if (unk >= 0 && tok->fuse_unk) {
                    unk_len += (uint32_t)l;
                } else {
                    if (unk >= 0 && (st = sym_add(c, &ns, unk, unk_len))) return st;
                    unk = tok->unk_id;
                    unk_len = (uint32_t)l;
                }
            }
        }
        i += l;
    }
    if (unk >= 0 && (st = sym_add(c, &ns, unk, unk_len))) return st;

    sym *y = c->syms;
    c->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const dj__merge_slot *m = dj__tok_merge_find(tok, y[i].id, y[i + 1].id);
        if (m && (st = heap_push(c, (hent){m->rank, (uint32_t)i, m->new_id}))) return st;
    }
    while (c->heap_n) {
        hent top = heap_pop(c);
        y = c->syms;
        sym *s = &y[top.pos];
        if (s->len == 0 || s->next < 0) continue;
        int32_t nx = s->next;
        const dj__merge_slot *m = dj__tok_merge_find(tok, s->id, y[nx].id);
        if (!m || m->new_id != top.new_id) continue; /* stale entry */
        s->id = top.new_id;
        s->len += y[nx].len;
        s->next = y[nx].next;
        y[nx].len = 0;
        if (s->next >= 0) y[s->next].prev = (int32_t)top.pos;
        if (s->prev >= 0) {
            m = dj__tok_merge_find(tok, y[s->prev].id, s->id);
            if (m && (st = heap_push(c, (hent){m->rank, (uint32_t)s->prev, m->new_id}))) return st;
        }
        if (s->next >= 0) {
            m = dj__tok_merge_find(tok, s->id, y[s->next].id);
            if (m && (st = heap_push(c, (hent){m->rank, top.pos, m->new_id}))) return st;
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (c->syms[i].len && (st = emit(c, c->syms[i].id))) return st;
    return DJ_OK;
}

/* ---- the pipeline ---- */

/* Normalized text of one raw segment -> normalized added tokens, pre-tokenizers, BPE. */
static dj_status encode_normalized(ectx *c, const char *s, size_t n, bool first, bool no_special) {
    const dj_tokenizer_t *tok = c->tok;
    segs sg = {0};
    plist a = {0}, b = {0};
    dj_status st = split_added(tok, &tok->added_norm, true, s, n, NULL, no_special, &sg);
    for (size_t i = 0; i < sg.n && !st; i++) {
        if (sg.v[i].id >= 0) {
            st = emit(c, sg.v[i].id);
            continue;
        }
        a.n = b.n = 0;
        a.text.n = b.text.n = 0;
        if ((st = plist_add(&a, s + sg.v[i].start, sg.v[i].end - sg.v[i].start, first && sg.v[i].start == 0))) break;
        for (size_t k = 0; k < tok->n_pretoks && !st; k++) {
            b.n = 0;
            b.text.n = 0;
            st = pretok_one(c, &tok->pretoks[k], &a, &b);
            plist t = a;
            a = b;
            b = t;
        }
        for (size_t k = 0; k < a.n && !st; k++) st = bpe_word(c, a.text.p + a.v[k].off, a.v[k].len);
    }
    free(sg.v);
    plist_free(&a);
    plist_free(&b);
    return st;
}

static dj_status encode(ectx *c, const char *text, size_t len, bool add_special) {
    const dj_tokenizer_t *tok = c->tok;
    segs sg = {0};
    dj__sbuf norm = {0};
    dj_status st = split_added(tok, &tok->added_raw, false, text, len, c, false, &sg);
    for (size_t i = 0; i < sg.n && !st; i++) {
        if (sg.v[i].id >= 0) {
            st = emit(c, sg.v[i].id);
            continue;
        }
        norm.n = 0;
        if ((st = normalize(tok, c, text + sg.v[i].start, sg.v[i].end - sg.v[i].start, &norm))) break;
        /* a segment holding plain bytes matches no special token after normalizing either */
        if (norm.n)
            st = encode_normalized(c, norm.p, norm.n, sg.v[i].start == 0,
                                   c->n_plain && in_plain(c, sg.v[i].start, sg.v[i].end));
    }
    free(sg.v);
    dj__sbuf_free(&norm);
    if (st || !add_special) return st;
    for (size_t t = 0; t < tok->n_templates; t++) {
        const dj__template *tp = &tok->templates[t];
        size_t extra = tp->n_ids;
        if ((st = grow((void **)&c->ids, &c->cap, c->n + extra, sizeof *c->ids))) return st;
        memmove(c->ids + tp->n_before, c->ids, c->n * sizeof *c->ids);
        memcpy(c->ids, tp->ids, tp->n_before * sizeof *c->ids);
        memcpy(c->ids + tp->n_before + c->n, tp->ids + tp->n_before, (tp->n_ids - tp->n_before) * sizeof *c->ids);
        c->n += extra;
    }
    return DJ_OK;
}

dj_status dj_tokenizer_encode(const dj_tokenizer_t *tok, const char *text, size_t len, bool add_special, int32_t **ids,
                              size_t *n_ids) {
    return dj_tokenizer_encode_plain(tok, text, len, add_special, NULL, 0, ids, n_ids);
}

dj_status dj_tokenizer_encode_plain(const dj_tokenizer_t *tok, const char *text, size_t len, bool add_special,
                                    const dj_text_span *plain, size_t n_plain, int32_t **ids, size_t *n_ids) {
    if (!ids || !n_ids) return dj_fail(DJ_EINVAL, "dj_tokenizer_encode: NULL output");
    *ids = NULL;
    *n_ids = 0;
    if (!tok || (!text && len)) return dj_fail(DJ_EINVAL, "dj_tokenizer_encode: NULL tokenizer or text");
    if (!text) text = "";
    if (!dj__utf8_valid(text, len)) {
        const uint8_t *u = (const uint8_t *)text;
        size_t i = 0;
        bool tr;
        while (i < len) {
            size_t l = dj__utf8_seq(u, len, i, &tr);
            if (!l) break;
            i += l;
        }
        return dj_fail(DJ_EFORMAT, "tokenizer: input text is not valid UTF-8 (byte %zu)", i);
    }
    if (n_plain && !plain) return dj_fail(DJ_EINVAL, "dj_tokenizer_encode_plain: NULL spans");
    for (size_t i = 0; i < n_plain; i++)
        if (plain[i].start > plain[i].end || plain[i].end > len || (i && plain[i].start < plain[i - 1].end))
            return dj_fail(DJ_EINVAL, "dj_tokenizer_encode_plain: span %zu [%zu, %zu) is not sorted, disjoint and "
                           "within the %zu bytes", i, plain[i].start, plain[i].end, len);
    ectx c = {0};
    c.tok = tok;
    c.plain = plain;
    c.n_plain = n_plain;
    c.md = pcre2_match_data_create(1, NULL);
    dj_status st = c.md ? encode(&c, text, len, add_special) : oom();
    pcre2_match_data_free(c.md);
    free(c.syms);
    free(c.heap);
    free(c.sp.v);
    dj__sbuf_free(&c.key);
    if (st) {
        free(c.ids);
        return st;
    }
    if (!c.ids) { /* an empty result is still a malloc'd array */
        c.ids = dj_malloc(sizeof *c.ids);
        if (!c.ids) return oom();
    }
    *ids = c.ids;
    *n_ids = c.n;
    return DJ_OK;
}
