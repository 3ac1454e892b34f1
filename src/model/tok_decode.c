/* tok_decode.c: ids -> text through the tokenizer.json decoder chain
 * (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace), one-shot and
 * streaming (only complete UTF-8 leaves the streamer). */
#include <stdlib.h>
#include "djinn/alloc.h"
#include <string.h>

#include "model/tok_impl.h"

/* A list of token strings on their way through the decoder chain. */
typedef struct {
    dj__sbuf text;
    size_t *off, *len; /* [n] */
    size_t n, cap;
} tlist;

static dj_status oom(void) { return dj_fail(DJ_ENOMEM, "tokenizer: out of memory"); }

static dj_status tl_begin(tlist *l) { /* opens a new, empty token */
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 16;
        size_t *o = dj_realloc(l->off, nc * sizeof *o);
        if (!o) return oom();
        l->off = o;
        size_t *q = dj_realloc(l->len, nc * sizeof *q);
        if (!q) return oom();
        l->len = q;
        l->cap = nc;
    }
    l->off[l->n] = l->text.n;
    l->len[l->n] = 0;
    l->n++;
    return dj__sbuf_put(&l->text, "", 0);
}

static dj_status tl_put(tlist *l, const void *s, size_t n) { /* appends to the last token */
    l->len[l->n - 1] += n;
    return dj__sbuf_put(&l->text, s, n);
}

static void tl_reset(tlist *l) {
    l->n = 0;
    l->text.n = 0;
}

static void tl_free(tlist *l) {
    dj__sbuf_free(&l->text);
    free(l->off);
    free(l->len);
}

/* Value of a "<0xXX>" token (as Rust's u8::from_str_radix reads XX), or -1. */
static int byte_token_value(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) {
            if (i == 3 && c == '+') continue; /* a leading sign is accepted */
            return -1;
        }
        v = v * 16 + d;
    }
    return v;
}

bool dj__tok_is_byte_token(const dj_tokenizer_t *tok, int32_t id) {
    if (id < 0 || (uint32_t)id >= tok->n_ids || tok->id_off[id] == DJ__TOK_NO_STR) return false;
    bool has = false;
    for (size_t i = 0; i < tok->n_decs; i++) has = has || tok->decs[i].kind == DJ__DEC_BYTEFALLBACK;
    return has && byte_token_value(tok->arena + tok->id_off[id], tok->id_len[id]) >= 0;
}

/* Reverse of GPT-2's bytes_to_unicode (see byte_char in tok_encode.c):
 * code point -> byte, -1 if none. */
static int unbyte(int32_t cp) {
    if (cp < 0 || cp > 323) return -1;
    if (cp < 256) return (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) ? -1 : cp;
    if (cp <= 256 + 32) return cp - 256;
    if (cp <= 256 + 66) return cp - 256 - 33 + 127;
    return 173;
}

static dj_status pcre_replace(const pcre2_code *re, const char *s, size_t n, const char *with, size_t wl,
                              pcre2_match_data *md, dj__sbuf *out) {
    size_t pos = 0, prev = 0;
    dj_status st;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return dj_fail(DJ_EFORMAT, "tokenizer: decoder regex failed (%d)", rc);
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me < ms || ms < prev || me > n) return dj_fail(DJ_EUNSUPPORTED, "tokenizer: decoder regex with \\K");
        if ((st = dj__sbuf_put(out, s + prev, ms - prev)) || (st = dj__sbuf_put(out, with, wl))) return st;
        prev = me;
        if (me == ms) {
            if (me >= n) break;
            size_t l = 1;
            while (me + l < n && ((uint8_t)s[me + l] & 0xC0) == 0x80) l++;
            pos = me + l;
        } else {
            pos = me;
        }
    }
    return dj__sbuf_put(out, s + prev, n - prev);
}

static dj_status dec_step(const dj__dec *d, bool last, bool first, bool lossy, bool *fused, pcre2_match_data **md,
                          const tlist *in, tlist *out) {
    dj_status st = DJ_OK;
    switch (d->kind) {
    case DJ__DEC_BYTELEVEL:
    case DJ__DEC_FUSE: {
        dj__sbuf raw = {0};
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i];
            bool mapped = d->kind == DJ__DEC_BYTELEVEL;
            size_t start = raw.n;
            for (size_t k = 0; k < n && mapped && !st;) {
                int32_t cp;
                k += dj__utf8_cp(s + k, &cp);
                int b = unbyte(cp);
                if (b < 0) {
                    mapped = false;
                    break;
                }
                uint8_t byte = (uint8_t)b;
                st = dj__sbuf_put(&raw, &byte, 1);
            }
            if (!mapped) { /* a token outside the byte alphabet passes as its own bytes */
                raw.n = start;
                st = dj__sbuf_put(&raw, s, n);
            }
        }
        if (!st) st = tl_begin(out);
        if (!st) {
            if (d->kind == DJ__DEC_BYTELEVEL && (lossy || !last)) {
                dj__sbuf fixed = {0};
                st = dj__utf8_lossy(&fixed, raw.p ? raw.p : "", raw.n);
                if (!st) st = tl_put(out, fixed.p, fixed.n);
                dj__sbuf_free(&fixed);
            } else {
                st = tl_put(out, raw.p ? raw.p : "", raw.n);
            }
        }
        dj__sbuf_free(&raw);
        *fused = true;
        return st;
    }
    case DJ__DEC_REPLACE:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i];
            if ((st = tl_begin(out))) break;
            size_t before = out->text.n;
            if (d->re) {
                if (!*md && !(*md = pcre2_match_data_create(1, NULL))) return oom();
                st = pcre_replace(d->re, s, n, d->content, d->content_len, *md, &out->text);
            } else {
                size_t k = 0, run = 0;
                while (!st && k + d->pat_len <= n) {
                    if (!memcmp(s + k, d->pat, d->pat_len)) {
                        st = dj__sbuf_put(&out->text, s + run, k - run);
                        if (!st) st = dj__sbuf_put(&out->text, d->content, d->content_len);
                        k += d->pat_len;
                        run = k;
                    } else {
                        k++;
                    }
                }
                if (!st) st = dj__sbuf_put(&out->text, s + run, n - run);
            }
            out->len[out->n - 1] = out->text.n - before;
        }
        return st;
    case DJ__DEC_BYTEFALLBACK: {
        dj__sbuf run = {0};
        for (size_t i = 0; i <= in->n && !st; i++) {
            int v = i < in->n ? byte_token_value(in->text.p + in->off[i], in->len[i]) : -1;
            if (v >= 0) {
                uint8_t b = (uint8_t)v;
                st = dj__sbuf_put(&run, &b, 1);
                continue;
            }
            if (run.n) { /* a run of byte tokens: its text if valid UTF-8, else one U+FFFD per byte */
                if ((st = tl_begin(out))) break;
                if (dj__utf8_valid(run.p, run.n)) {
                    st = tl_put(out, run.p, run.n);
                } else {
                    for (size_t k = 0; k < run.n && !st; k++) st = tl_put(out, "\xEF\xBF\xBD", 3);
                }
                run.n = 0;
            }
            if (i < in->n && !st && !(st = tl_begin(out))) st = tl_put(out, in->text.p + in->off[i], in->len[i]);
        }
        dj__sbuf_free(&run);
        return st;
    }
    case DJ__DEC_STRIP:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i], a = 0, b = n;
            /* after a fuse, a window that does not start the text keeps its start */
            size_t start = (*fused && !first && i == 0) ? 0 : d->start;
            for (size_t k = 0; k < start && a + d->content_len <= n && !memcmp(s + a, d->content, d->content_len); k++)
                a += d->content_len;
            for (size_t k = 0; k < d->stop && b >= a + d->content_len &&
                               !memcmp(s + b - d->content_len, d->content, d->content_len);
                 k++)
                b -= d->content_len;
            if (!(st = tl_begin(out))) st = tl_put(out, s + a, b - a);
        }
        return st;
    case DJ__DEC_METASPACE:
        for (size_t i = 0; i < in->n && !st; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i];
            bool drop = i == 0 && first && d->prepend_scheme != DJ__PREPEND_NEVER;
            if ((st = tl_begin(out))) break;
            size_t k = 0, run = 0;
            while (!st && k < n) {
                if (k + d->repl_len <= n && !memcmp(s + k, d->repl, d->repl_len)) {
                    st = tl_put(out, s + run, k - run);
                    if (!st && !drop) st = tl_put(out, " ", 1);
                    k += d->repl_len;
                    run = k;
                } else {
                    k++;
                }
            }
            if (!st) st = tl_put(out, s + run, n - run);
        }
        return st;
    }
    return st;
}

dj_status dj__tok_decode_raw(const dj_tokenizer_t *tok, const int32_t *ids, size_t n, bool first, bool lossy,
                             dj__sbuf *out) {
    tlist a = {0}, b = {0};
    dj_status st = DJ_OK;
    for (size_t i = 0; i < n && !st; i++) {
        int32_t id = ids[i];
        if (id < 0 || (uint32_t)id >= tok->n_ids || tok->id_off[id] == DJ__TOK_NO_STR) {
            st = dj_fail(DJ_ERANGE, "tokenizer: token id %d is out of range (vocab size %u)", (int)id, tok->n_ids);
            break;
        }
        if (!(st = tl_begin(&a))) st = tl_put(&a, tok->arena + tok->id_off[id], tok->id_len[id]);
    }
    pcre2_match_data *md = NULL;
    bool fused = false;
    if (!tok->has_decoder) { /* the library joins with spaces */
        for (size_t i = 0; i < a.n && !st; i++) {
            if ((i > 0 || !first) && (st = dj__sbuf_put(out, " ", 1))) break;
            st = dj__sbuf_put(out, a.text.p + a.off[i], a.len[i]);
        }
    } else {
        for (size_t k = 0; k < tok->n_decs && !st; k++) {
            tl_reset(&b);
            st = dec_step(&tok->decs[k], k + 1 == tok->n_decs, first, lossy, &fused, &md, &a, &b);
            tlist t = a;
            a = b;
            b = t;
        }
        for (size_t i = 0; i < a.n && !st; i++) st = dj__sbuf_put(out, a.text.p + a.off[i], a.len[i]);
    }
    if (!st) st = dj__sbuf_put(out, "", 0);
    pcre2_match_data_free(md);
    tl_free(&a);
    tl_free(&b);
    return st;
}

dj_status dj_tokenizer_decode(const dj_tokenizer_t *tok, const int32_t *ids, size_t n, char **text) {
    size_t len;
    return dj_tokenizer_decode_len(tok, ids, n, text, &len);
}

dj_status dj_tokenizer_decode_len(const dj_tokenizer_t *tok, const int32_t *ids, size_t n, char **text, size_t *len) {
    if (!text || !len) return dj_fail(DJ_EINVAL, "dj_tokenizer_decode: text or len is NULL");
    *text = NULL;
    *len = 0;
    if (!tok || (!ids && n)) return dj_fail(DJ_EINVAL, "dj_tokenizer_decode: NULL tokenizer or ids");
    dj__sbuf out = {0};
    dj_status st = dj__tok_decode_raw(tok, ids, n, true, true, &out);
    if (st) {
        dj__sbuf_free(&out);
        return st;
    }
    if (!out.p && (st = dj__sbuf_put(&out, "", 0))) return st;
    *text = out.p;
    *len = out.n;
    return DJ_OK;
}

/* ---- streaming ---- */

/* The streamer decodes a window of ids (those since the last point where the
 * text so far was settled) and releases the part of its text that no later
 * id can change: it holds back a trailing run of byte-fallback tokens (the
 * whole run becomes U+FFFDs if it ends invalid) and a trailing incomplete
 * UTF-8 character. When the window's text is settled it starts a new window,
 * so each push costs about one token's decode. */
struct dj_detok_stream {
    const dj_tokenizer_t *tok;
    int32_t *win; /* [n] ids of the current window */
    size_t n, cap;
    bool first;       /* the window starts the sequence */
    size_t emitted;   /* bytes of the window's text already queued */
    bool never_settle; /* a Strip of trailing characters: the window never restarts */
    bool has_fallback;
    dj__sbuf q; /* text queued for the caller, from q_off */
    size_t q_off;
};

dj_status dj_detok_stream_new(const dj_tokenizer_t *tok, dj_detok_stream_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "dj_detok_stream_new: out is NULL");
    *out = NULL;
    if (!tok) return dj_fail(DJ_EINVAL, "dj_detok_stream_new: tok is NULL");
    dj_detok_stream_t *s = dj_calloc(1, sizeof *s);
    if (!s) return oom();
    s->tok = tok;
    s->first = true;
    for (size_t i = 0; i < tok->n_decs; i++) {
        if (tok->decs[i].kind == DJ__DEC_STRIP && tok->decs[i].stop > 0) s->never_settle = true;
        if (tok->decs[i].kind == DJ__DEC_BYTEFALLBACK) s->has_fallback = true;
    }
    *out = s;
    return DJ_OK;
}

void dj_detok_stream_free(dj_detok_stream_t *s) {
    if (!s) return;
    free(s->win);
    dj__sbuf_free(&s->q);
    free(s);
}

static dj_status queue(dj_detok_stream_t *s, const char *t, size_t n) {
    if (n <= s->emitted) return DJ_OK;
    dj_status st = dj__sbuf_put(&s->q, t + s->emitted, n - s->emitted);
    if (!st) s->emitted = n;
    return st;
}

static dj_status drain(dj_detok_stream_t *s, char *out, size_t cap, size_t *n_out) {
    size_t avail = s->q.n - s->q_off, k = avail < cap - 1 ? avail : cap - 1;
    while (k < avail && k > 0 && ((uint8_t)s->q.p[s->q_off + k] & 0xC0) == 0x80) k--; /* whole characters only */
    if (k) memcpy(out, s->q.p + s->q_off, k);
    out[k] = '\0';
    *n_out = k;
    s->q_off += k;
    if (s->q_off == s->q.n) s->q_off = s->q.n = 0;
    return DJ_OK;
}

static dj_status check_out(char *out, size_t cap, size_t *n_out) {
    if (n_out) *n_out = 0;
    if (!out || !n_out || cap < 5)
        return dj_fail(DJ_EINVAL, "dj_detok_stream: needs an output buffer of at least 5 bytes and n_out");
    out[0] = '\0';
    return DJ_OK;
}

dj_status dj_detok_stream_push(dj_detok_stream_t *s, int32_t id, char *out, size_t cap, size_t *n_out) {
    dj_status st = check_out(out, cap, n_out);
    if (st) return st;
    if (!s) return dj_fail(DJ_EINVAL, "dj_detok_stream_push: stream is NULL");
    const dj_tokenizer_t *tok = s->tok;
    if (id < 0 || (uint32_t)id >= tok->n_ids || tok->id_off[id] == DJ__TOK_NO_STR)
        return dj_fail(DJ_ERANGE, "tokenizer: token id %d is out of range (vocab size %u)", (int)id, tok->n_ids);
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 16;
        int32_t *w = dj_realloc(s->win, nc * sizeof *w);
        if (!w) return oom();
        s->win = w;
        s->cap = nc;
    }
    s->win[s->n++] = id;
    size_t hold = 0;
    while (s->has_fallback && hold < s->n && dj__tok_is_byte_token(tok, s->win[s->n - 1 - hold])) hold++;
    dj__sbuf raw = {0}, text = {0};
    if ((st = dj__tok_decode_raw(tok, s->win, s->n - hold, s->first, false, &raw))) goto done;
    /* cut a trailing incomplete character */
    size_t p = 0;
    for (size_t i = 0; i < raw.n;) {
        bool tr;
        size_t l = dj__utf8_seq((const uint8_t *)raw.p, raw.n, i, &tr);
        if (tr) break;
        i += l ? l : 1;
        p = i;
    }
    if ((st = dj__utf8_lossy(&text, raw.p ? raw.p : "", p))) goto done;
    if ((st = queue(s, text.p, text.n))) goto done;
    if (hold == 0 && p == raw.n && !s->never_settle && (!s->first || text.n > 0)) {
        s->n = 0;
        s->first = false;
        s->emitted = 0;
    }
    st = drain(s, out, cap, n_out);
done:
    dj__sbuf_free(&raw);
    dj__sbuf_free(&text);
    return st;
}

dj_status dj_detok_stream_finish(dj_detok_stream_t *s, char *out, size_t cap, size_t *n_out) {
    dj_status st = check_out(out, cap, n_out);
    if (st) return st;
    if (!s) return dj_fail(DJ_EINVAL, "dj_detok_stream_finish: stream is NULL");
    if (s->n) {
        dj__sbuf text = {0};
        st = dj__tok_decode_raw(s->tok, s->win, s->n, s->first, true, &text);
        if (!st) st = queue(s, text.p, text.n);
        dj__sbuf_free(&text);
        if (st) return st;
    }
    s->n = 0;
    s->first = true;
    s->emitted = 0;
    return drain(s, out, cap, n_out);
}
