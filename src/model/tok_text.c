/* tok_text.c: the tokenizer's shared low-level pieces - byte buffers, UTF-8,
 * regexes, and the vocabulary and merge hash maps - below its loader and coders. */
#include <stdlib.h>
#include "djinn/alloc.h"
#include <string.h>
#include <xxhash.h>

#include "model/tok_impl.h"

/* ---- byte buffers and UTF-8 ---- */

dj_status dj__sbuf_put(dj__sbuf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = dj_realloc(b->p, cap);
        if (!p) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory (%zu bytes)", cap);
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return DJ_OK;
}

void dj__sbuf_free(dj__sbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

size_t dj__utf8_seq(const uint8_t *s, size_t n, size_t i, bool *truncated) {
    *truncated = false;
    uint8_t c = s[i];
    if (c < 0x80) return 1;
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) len = 3, lo = 0xA0;
    else if (c == 0xED) len = 3, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF) len = 3;
    else if (c == 0xF0) len = 4, lo = 0x90;
    else if (c == 0xF4) len = 4, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else return 0;
    for (size_t k = 1; k < len; k++) {
        if (i + k >= n) {
            *truncated = true;
            return 0;
        }
        uint8_t d = s[i + k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return 0;
    }
    return len;
}

bool dj__utf8_valid(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    bool tr;
    for (size_t i = 0; i < n;) {
        size_t l = dj__utf8_seq(u, n, i, &tr);
        if (!l) return false;
        i += l;
    }
    return true;
}

size_t dj__utf8_cp(const char *s, int32_t *cp) {
    const uint8_t *u = (const uint8_t *)s;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0) {
        *cp = ((u[0] & 0x0F) << 12) | ((u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((u[0] & 0x07) << 18) | ((u[1] & 0x3F) << 12) | ((u[2] & 0x3F) << 6) | (u[3] & 0x3F);
    return 4;
}

size_t dj__utf8_put(char out[4], int32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

dj_status dj__utf8_lossy(dj__sbuf *out, const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, run = 0; /* s[run..i) is valid and not yet copied */
    bool tr;
    while (i < n) {
        size_t l = dj__utf8_seq(u, n, i, &tr);
        if (l) {
            i += l;
            continue;
        }
        dj_status st = dj__sbuf_put(out, s + run, i - run);
        if (st) return st;
        if ((st = dj__sbuf_put(out, "\xEF\xBF\xBD", 3))) return st;
        /* skip the maximal invalid subpart: the lead byte plus the
         * continuation bytes that were still acceptable */
        size_t k = 1;
        uint8_t c = u[i];
        size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 1;
        if (c > 0xF4) want = 1;
        while (k < want && i + k < n) {
            uint8_t d = u[i + k];
            uint8_t lo = 0x80, hi = 0xBF;
            if (k == 1) {
                if (c == 0xE0) lo = 0xA0;
                else if (c == 0xED) hi = 0x9F;
                else if (c == 0xF0) lo = 0x90;
                else if (c == 0xF4) hi = 0x8F;
            }
            if (d < lo || d > hi) break;
            k++;
        }
        i += k;
        run = i;
    }
    return dj__sbuf_put(out, s + run, n - run);
}

/* ---- regexes ---- */

/* Rewrites \s so that it also matches U+0085 as the Unicode White_Space
 * property (and so the Oniguruma regexes the `tokenizers` library runs) does;
 * PCRE2's \s under UCP leaves it out. */
static dj_status rewrite_ws(const char *pat, size_t len, dj__sbuf *out) {
    bool in_class = false;
    dj_status st = DJ_OK;
    for (size_t i = 0; i < len && !st; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char d = pat[++i];
            if (d == 's') st = dj__sbuf_put(out, in_class ? "\\s\\x{85}" : "[\\s\\x{85}]", in_class ? 8 : 10);
            else if (d == 'S' && !in_class) st = dj__sbuf_put(out, "[^\\s\\x{85}]", 11);
            else {
                char two[2] = {c, d};
                st = dj__sbuf_put(out, two, 2);
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            st = dj__sbuf_put(out, pat + i, 1);
            /* a ']' right after '[' or '[^' is literal */
            if (!st && i + 1 < len && pat[i + 1] == '^') st = dj__sbuf_put(out, pat + ++i, 1);
            if (!st && i + 1 < len && pat[i + 1] == ']') st = dj__sbuf_put(out, pat + ++i, 1);
            continue;
        }
        if (in_class && c == ']') in_class = false;
        st = dj__sbuf_put(out, pat + i, 1);
    }
    return st;
}

dj_status dj__tok_regex(const char *pat, size_t len, bool literal, pcre2_code **out) {
    *out = NULL;
    dj__sbuf b = {0};
    dj_status st = literal ? dj__sbuf_put(&b, pat, len) : rewrite_ws(pat, len, &b);
    if (st) {
        dj__sbuf_free(&b);
        return st;
    }
    int err = 0;
    PCRE2_SIZE off = 0;
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)b.p, b.n, opts, &err, &off, NULL);
    dj__sbuf_free(&b);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return dj_fail(DJ_EFORMAT, "tokenizer: bad regex /%.*s/ at offset %zu: %s", (int)(len > 200 ? 200 : len), pat,
                       (size_t)off, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* the interpreter runs if JIT is unavailable */
    *out = re;
    return DJ_OK;
}

/* ---- vocabulary and merge maps ---- */

static uint32_t hash_bytes(const char *s, size_t n) { return (uint32_t)XXH3_64bits(s, n); }

static uint32_t hash_pair(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return (uint32_t)k;
}


int32_t dj__tok_vocab_find(const dj_tokenizer_t *tok, const char *s, size_t n) {
    const dj__strmap *m = &tok->vocab_map;
    if (!m->cap) return -1;
    uint32_t mask = m->cap - 1, h = hash_bytes(s, n) & mask;
    for (;; h = (h + 1) & mask) {
        uint32_t e = m->slots[h];
        if (!e) return -1;
        const dj__vocab_entry *v = &tok->vocab[e - 1];
        if (v->len == n && !memcmp(tok->arena + v->off, s, n)) return v->id;
    }
}

/* Inserts entry index i; a later duplicate string replaces the earlier one. */
void dj__tok_vocab_insert(dj_tokenizer_t *tok, uint32_t i) {
    dj__strmap *m = &tok->vocab_map;
    const dj__vocab_entry *v = &tok->vocab[i];
    const char *s = tok->arena + v->off;
    uint32_t mask = m->cap - 1, h = hash_bytes(s, v->len) & mask;
    for (;; h = (h + 1) & mask) {
        uint32_t e = m->slots[h];
        if (!e) {
            m->slots[h] = i + 1;
            return;
        }
        const dj__vocab_entry *w = &tok->vocab[e - 1];
        if (w->len == v->len && !memcmp(tok->arena + w->off, s, v->len)) {
            m->slots[h] = i + 1;
            return;
        }
    }
}

void dj__tok_merge_insert(dj_tokenizer_t *tok, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t mask = tok->merge_cap - 1, h = hash_pair(key) & mask;
    for (;; h = (h + 1) & mask) {
        dj__merge_slot *s = &tok->merges[h];
        if (s->key == UINT64_MAX || s->key == key) {
            if (s->key == UINT64_MAX) tok->n_merges++;
            s->key = key;
            s->rank = rank;
            s->new_id = new_id;
            return;
        }
    }
}

const dj__merge_slot *dj__tok_merge_find(const dj_tokenizer_t *tok, int32_t a, int32_t b) {
    if (!tok->merge_cap) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t mask = tok->merge_cap - 1, h = hash_pair(key) & mask;
    for (;; h = (h + 1) & mask) {
        const dj__merge_slot *s = &tok->merges[h];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}
