/* tokenizer.c: loading a Hugging Face tokenizer.json (BPE model, normalizers,
 * pre-tokenizers, added tokens, post-processor, decoders) into dj_tokenizer_t. */
#include <cjson/cJSON.h>
#include "djinn/alloc.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "model/tok_impl.h"

/* ---- maps (their entries: tok_text.c) ---- */

static uint32_t pow2_above(uint32_t n) {
    uint32_t cap = 16;
    while (cap < 2 * n + 1) cap *= 2;
    return cap;
}

/* ---- JSON helpers ---- */

static const cJSON *jget(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static bool jnull(const cJSON *v) { return !v || cJSON_IsNull(v); }

/* Boolean field: absent/null gives def; a non-boolean is an error. */
static dj_status jbool(const cJSON *o, const char *k, bool def, const char *where, bool *out) {
    const cJSON *v = jget(o, k);
    if (jnull(v)) {
        *out = def;
        return DJ_OK;
    }
    if (!cJSON_IsBool(v)) return dj_fail(DJ_EFORMAT, "tokenizer: %s.%s must be true or false", where, k);
    *out = cJSON_IsTrue(v);
    return DJ_OK;
}

/* String field (NULL if absent or null, error if another type). */
static dj_status jstr(const cJSON *o, const char *k, const char *where, const char **out) {
    const cJSON *v = jget(o, k);
    *out = NULL;
    if (jnull(v)) return DJ_OK;
    if (!cJSON_IsString(v)) return dj_fail(DJ_EFORMAT, "tokenizer: %s.%s must be a string", where, k);
    *out = v->valuestring;
    return DJ_OK;
}

static dj_status jint(const cJSON *v, long lo, long hi, const char *what, long *out) {
    if (!cJSON_IsNumber(v)) return dj_fail(DJ_EFORMAT, "tokenizer: %s must be a number", what);
    double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || d != (double)(long)d)
        return dj_fail(DJ_EFORMAT, "tokenizer: %s must be an integer in [%ld, %ld]", what, lo, hi);
    *out = (long)d;
    return DJ_OK;
}

static dj_status dupstr(const char *s, size_t n, char **out) {
    *out = malloc(n + 1);
    if (!*out) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    memcpy(*out, s, n);
    (*out)[n] = '\0';
    return DJ_OK;
}

/* {"String": s} or {"Regex": r} -> a literal string or a compiled regex. */
static dj_status parse_pattern(const cJSON *p, const char *where, char **lit, size_t *lit_len, pcre2_code **re) {
    *lit = NULL;
    *re = NULL;
    const cJSON *s = cJSON_IsObject(p) ? jget(p, "String") : NULL;
    const cJSON *r = cJSON_IsObject(p) ? jget(p, "Regex") : NULL;
    if (cJSON_IsString(s)) {
        *lit_len = strlen(s->valuestring);
        return dupstr(s->valuestring, *lit_len, lit);
    }
    if (cJSON_IsString(r)) return dj__tok_regex(r->valuestring, strlen(r->valuestring), false, re);
    return dj_fail(DJ_EFORMAT, "tokenizer: %s.pattern must be {\"String\": ...} or {\"Regex\": ...}", where);
}

/* One character (the Metaspace replacement, the Strip content) as UTF-8. */
static dj_status parse_char(const cJSON *o, const char *k, const char *where, const char *def, char out[5],
                            size_t *len) {
    const char *s;
    dj_status st = jstr(o, k, where, &s);
    if (st) return st;
    if (!s) s = def;
    if (!s) return dj_fail(DJ_EFORMAT, "tokenizer: %s.%s is missing", where, k);
    size_t n = strlen(s);
    bool tr;
    if (n == 0 || n > 4 || !dj__utf8_valid(s, n) || dj__utf8_seq((const uint8_t *)s, n, 0, &tr) != n)
        return dj_fail(DJ_EFORMAT, "tokenizer: %s.%s must be one character", where, k);
    memcpy(out, s, n);
    out[n] = '\0';
    *len = n;
    return DJ_OK;
}

static dj_status parse_prepend_scheme(const cJSON *o, const char *where, dj__prepend_scheme *out) {
    const char *s;
    dj_status st = jstr(o, "prepend_scheme", where, &s);
    if (st) return st;
    if (s) {
        if (!strcmp(s, "always")) *out = DJ__PREPEND_ALWAYS;
        else if (!strcmp(s, "first")) *out = DJ__PREPEND_FIRST;
        else if (!strcmp(s, "never")) *out = DJ__PREPEND_NEVER;
        else return dj_fail(DJ_EUNSUPPORTED, "tokenizer: %s.prepend_scheme \"%.40s\" is not supported", where, s);
        return DJ_OK;
    }
    bool aps = true; /* the older form */
    if ((st = jbool(o, "add_prefix_space", true, where, &aps))) return st;
    *out = aps ? DJ__PREPEND_ALWAYS : DJ__PREPEND_NEVER;
    return DJ_OK;
}

static const char *jtype(const cJSON *o) {
    const cJSON *t = cJSON_IsObject(o) ? jget(o, "type") : NULL;
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* ---- normalizers ---- */

static dj_status add_normalizer(dj_tokenizer_t *tok, const cJSON *o, size_t *cap, int depth) {
    const char *type = jtype(o);
    if (!type) return dj_fail(DJ_EFORMAT, "tokenizer: normalizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "normalizers");
        if (!cJSON_IsArray(list)) return dj_fail(DJ_EFORMAT, "tokenizer: Sequence normalizer needs a \"normalizers\" list");
        if (depth > 8) return dj_fail(DJ_EFORMAT, "tokenizer: normalizer Sequences nested too deeply");
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            dj_status st = add_normalizer(tok, it, cap, depth + 1);
            if (st) return st;
        }
        return DJ_OK;
    }
    if (tok->n_norms == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        dj__norm *p = dj_realloc(tok->norms, nc * sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
        tok->norms = p;
        *cap = nc;
    }
    dj__norm *n = &tok->norms[tok->n_norms];
    memset(n, 0, sizeof *n);
    dj_status st = DJ_OK;
    if (!strcmp(type, "Prepend")) {
        const char *s;
        if ((st = jstr(o, "prepend", "Prepend normalizer", &s))) return st;
        if (!s) return dj_fail(DJ_EFORMAT, "tokenizer: Prepend normalizer needs \"prepend\"");
        n->kind = DJ__NORM_PREPEND;
        n->str_len = strlen(s);
        st = dupstr(s, n->str_len, &n->str);
    } else if (!strcmp(type, "Replace")) {
        const char *c;
        if ((st = jstr(o, "content", "Replace normalizer", &c))) return st;
        if (!c) return dj_fail(DJ_EFORMAT, "tokenizer: Replace normalizer needs \"content\"");
        n->kind = DJ__NORM_REPLACE;
        n->content_len = strlen(c);
        if ((st = dupstr(c, n->content_len, &n->content))) return st;
        tok->n_norms++; /* owned from here on, freed with the tokenizer */
        st = parse_pattern(jget(o, "pattern"), "Replace normalizer", &n->str, &n->str_len, &n->re);
        if (!st && n->str && n->str_len == 0)
            st = dj_fail(DJ_EFORMAT, "tokenizer: Replace normalizer with an empty pattern");
        return st;
    } else if (!strcmp(type, "NFC")) {
        n->kind = DJ__NORM_NFC;
    } else if (!strcmp(type, "NFD")) {
        n->kind = DJ__NORM_NFD;
    } else if (!strcmp(type, "NFKC")) {
        n->kind = DJ__NORM_NFKC;
    } else if (!strcmp(type, "NFKD")) {
        n->kind = DJ__NORM_NFKD;
    } else {
        return dj_fail(DJ_EUNSUPPORTED, "tokenizer: normalizer type \"%.40s\" is not supported", type);
    }
    if (!st) tok->n_norms++;
    return st;
}

/* ---- pre-tokenizers ---- */

static const char GPT2_SPLIT[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static dj_status add_pretok(dj_tokenizer_t *tok, const cJSON *o, size_t *cap, int depth) {
    const char *type = jtype(o);
    if (!type) return dj_fail(DJ_EFORMAT, "tokenizer: pre_tokenizer without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "pretokenizers");
        if (!cJSON_IsArray(list))
            return dj_fail(DJ_EFORMAT, "tokenizer: Sequence pre_tokenizer needs a \"pretokenizers\" list");
        if (depth > 8) return dj_fail(DJ_EFORMAT, "tokenizer: pre_tokenizer Sequences nested too deeply");
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            dj_status st = add_pretok(tok, it, cap, depth + 1);
            if (st) return st;
        }
        return DJ_OK;
    }
    if (tok->n_pretoks == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        dj__pretok *p = dj_realloc(tok->pretoks, nc * sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
        tok->pretoks = p;
        *cap = nc;
    }
    dj__pretok *p = &tok->pretoks[tok->n_pretoks];
    memset(p, 0, sizeof *p);
    dj_status st;
    if (!strcmp(type, "Split")) {
        p->kind = DJ__PRE_SPLIT;
        const char *b;
        if ((st = jstr(o, "behavior", "Split pre_tokenizer", &b))) return st;
        if (!b) return dj_fail(DJ_EFORMAT, "tokenizer: Split pre_tokenizer needs \"behavior\"");
        if (!strcmp(b, "Removed")) p->behavior = DJ__SPLIT_REMOVED;
        else if (!strcmp(b, "Isolated")) p->behavior = DJ__SPLIT_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious")) p->behavior = DJ__SPLIT_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) p->behavior = DJ__SPLIT_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) p->behavior = DJ__SPLIT_CONTIGUOUS;
        else return dj_fail(DJ_EUNSUPPORTED, "tokenizer: Split behavior \"%.40s\" is not supported", b);
        if ((st = jbool(o, "invert", false, "Split pre_tokenizer", &p->invert))) return st;
        const cJSON *pat = jget(o, "pattern");
        const cJSON *s = cJSON_IsObject(pat) ? jget(pat, "String") : NULL;
        const cJSON *r = cJSON_IsObject(pat) ? jget(pat, "Regex") : NULL;
        if (cJSON_IsString(s)) {
            if (!s->valuestring[0]) return dj_fail(DJ_EFORMAT, "tokenizer: Split pre_tokenizer with an empty pattern");
            st = dj__tok_regex(s->valuestring, strlen(s->valuestring), true, &p->re);
        } else if (cJSON_IsString(r)) {
            st = dj__tok_regex(r->valuestring, strlen(r->valuestring), false, &p->re);
        } else {
            return dj_fail(DJ_EFORMAT, "tokenizer: Split pre_tokenizer needs a String or Regex pattern");
        }
        if (st) return st;
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = DJ__PRE_BYTELEVEL;
        bool use_regex = true;
        if ((st = jbool(o, "add_prefix_space", true, "ByteLevel pre_tokenizer", &p->add_prefix_space))) return st;
        if ((st = jbool(o, "use_regex", true, "ByteLevel pre_tokenizer", &use_regex))) return st;
        if (use_regex && (st = dj__tok_regex(GPT2_SPLIT, sizeof GPT2_SPLIT - 1, false, &p->re))) return st;
    } else if (!strcmp(type, "Metaspace")) {
        p->kind = DJ__PRE_METASPACE;
        if ((st = parse_char(o, "replacement", "Metaspace pre_tokenizer", "\xE2\x96\x81", p->repl, &p->repl_len)))
            return st;
        if ((st = parse_prepend_scheme(o, "Metaspace pre_tokenizer", &p->prepend_scheme))) return st;
        if ((st = jbool(o, "split", true, "Metaspace pre_tokenizer", &p->split))) return st;
    } else if (!strcmp(type, "Digits")) {
        p->kind = DJ__PRE_DIGITS;
        if ((st = jbool(o, "individual_digits", false, "Digits pre_tokenizer", &p->individual_digits))) return st;
    } else {
        return dj_fail(DJ_EUNSUPPORTED, "tokenizer: pre_tokenizer type \"%.40s\" is not supported", type);
    }
    tok->n_pretoks++;
    return DJ_OK;
}

/* ---- decoders ---- */

static dj_status add_decoder(dj_tokenizer_t *tok, const cJSON *o, size_t *cap, int depth) {
    const char *type = jtype(o);
    if (!type) return dj_fail(DJ_EFORMAT, "tokenizer: decoder without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "decoders");
        if (!cJSON_IsArray(list)) return dj_fail(DJ_EFORMAT, "tokenizer: Sequence decoder needs a \"decoders\" list");
        if (depth > 8) return dj_fail(DJ_EFORMAT, "tokenizer: decoder Sequences nested too deeply");
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            dj_status st = add_decoder(tok, it, cap, depth + 1);
            if (st) return st;
        }
        return DJ_OK;
    }
    if (tok->n_decs == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        dj__dec *p = dj_realloc(tok->decs, nc * sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
        tok->decs = p;
        *cap = nc;
    }
    dj__dec *d = &tok->decs[tok->n_decs];
    memset(d, 0, sizeof *d);
    dj_status st = DJ_OK;
    if (!strcmp(type, "ByteLevel")) {
        d->kind = DJ__DEC_BYTELEVEL;
    } else if (!strcmp(type, "ByteFallback")) {
        d->kind = DJ__DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        d->kind = DJ__DEC_FUSE;
    } else if (!strcmp(type, "Replace")) {
        d->kind = DJ__DEC_REPLACE;
        const char *c;
        if ((st = jstr(o, "content", "Replace decoder", &c))) return st;
        if (!c) return dj_fail(DJ_EFORMAT, "tokenizer: Replace decoder needs \"content\"");
        d->content_len = strlen(c);
        if ((st = dupstr(c, d->content_len, &d->content))) return st;
        tok->n_decs++;
        st = parse_pattern(jget(o, "pattern"), "Replace decoder", &d->pat, &d->pat_len, &d->re);
        if (!st && d->pat && d->pat_len == 0) st = dj_fail(DJ_EFORMAT, "tokenizer: Replace decoder with an empty pattern");
        return st;
    } else if (!strcmp(type, "Strip")) {
        d->kind = DJ__DEC_STRIP;
        char c[5];
        size_t cl;
        long v = 0;
        if ((st = parse_char(o, "content", "Strip decoder", NULL, c, &cl))) return st;
        if ((st = dupstr(c, cl, &d->content))) return st;
        d->content_len = cl;
        tok->n_decs++;
        const cJSON *a = jget(o, "start"), *b = jget(o, "stop");
        if ((st = jint(a, 0, 1 << 20, "Strip decoder start", &v))) return st;
        d->start = (size_t)v;
        if ((st = jint(b, 0, 1 << 20, "Strip decoder stop", &v))) return st;
        d->stop = (size_t)v;
        return DJ_OK;
    } else if (!strcmp(type, "Metaspace")) {
        d->kind = DJ__DEC_METASPACE;
        if ((st = parse_char(o, "replacement", "Metaspace decoder", "\xE2\x96\x81", d->repl, &d->repl_len))) return st;
        if ((st = parse_prepend_scheme(o, "Metaspace decoder", &d->prepend_scheme))) return st;
    } else {
        return dj_fail(DJ_EUNSUPPORTED, "tokenizer: decoder type \"%.40s\" is not supported", type);
    }
    tok->n_decs++;
    return st;
}

/* ---- post-processors ---- */

static dj_status push_template(dj_tokenizer_t *tok, dj__template *t) {
    dj__template *p = dj_realloc(tok->templates, (tok->n_templates + 1) * sizeof *p);
    if (!p) {
        free(t->ids);
        return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    }
    tok->templates = p;
    p[tok->n_templates++] = *t;
    return DJ_OK;
}

static dj_status id_of(const dj_tokenizer_t *tok, const char *s, const char *where, int32_t *out) {
    int32_t id = dj_tokenizer_token_id(tok, s);
    if (id < 0) return dj_fail(DJ_EFORMAT, "tokenizer: %s names token \"%.60s\" that is not in the vocab", where, s);
    *out = id;
    return DJ_OK;
}

static dj_status add_template(dj_tokenizer_t *tok, const cJSON *o) {
    const cJSON *single = jget(o, "single"), *specials = jget(o, "special_tokens");
    if (!cJSON_IsArray(single)) return dj_fail(DJ_EFORMAT, "tokenizer: TemplateProcessing needs a \"single\" list");
    dj__template t = {0};
    bool seen_a = false;
    size_t cap = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, single) {
        const cJSON *seq = cJSON_IsObject(it) ? jget(it, "Sequence") : NULL;
        const cJSON *sp = cJSON_IsObject(it) ? jget(it, "SpecialToken") : NULL;
        if (seq) {
            const cJSON *id = jget(seq, "id");
            if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") || seen_a) {
                free(t.ids);
                return dj_fail(DJ_EFORMAT, "tokenizer: TemplateProcessing \"single\" must use the sequence $A once");
            }
            seen_a = true;
            continue;
        }
        const cJSON *name = sp ? jget(sp, "id") : NULL;
        if (!cJSON_IsString(name)) {
            free(t.ids);
            return dj_fail(DJ_EFORMAT, "tokenizer: TemplateProcessing item must be Sequence or SpecialToken");
        }
        /* the special_tokens table gives the ids; without an entry, the vocab */
        const cJSON *entry = cJSON_IsObject(specials) ? jget(specials, name->valuestring) : NULL;
        const cJSON *ids = entry ? jget(entry, "ids") : NULL;
        int32_t one[1] = {0};
        size_t n = 0;
        if (cJSON_IsArray(ids)) {
            n = (size_t)cJSON_GetArraySize(ids);
        } else {
            dj_status st = id_of(tok, name->valuestring, "TemplateProcessing", one);
            if (st) {
                free(t.ids);
                return st;
            }
            n = 1;
        }
        if (t.n_ids + n > cap) {
            cap = (t.n_ids + n) * 2;
            int32_t *p = dj_realloc(t.ids, cap * sizeof *p);
            if (!p) {
                free(t.ids);
                return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
            }
            t.ids = p;
        }
        if (cJSON_IsArray(ids)) {
            const cJSON *v;
            cJSON_ArrayForEach(v, ids) {
                long x = 0;
                dj_status st = jint(v, 0, (long)tok->n_ids - 1, "TemplateProcessing special token id", &x);
                if (st) {
                    free(t.ids);
                    return st;
                }
                t.ids[t.n_ids++] = (int32_t)x;
            }
        } else {
            t.ids[t.n_ids++] = one[0];
        }
        if (!seen_a) t.n_before = t.n_ids;
    }
    if (!seen_a) {
        free(t.ids);
        return dj_fail(DJ_EFORMAT, "tokenizer: TemplateProcessing \"single\" lacks $A");
    }
    return push_template(tok, &t);
}

/* RobertaProcessing / BertProcessing: cls $A sep, each given as [token, id]. */
static dj_status add_cls_sep(dj_tokenizer_t *tok, const cJSON *o, const char *type) {
    const cJSON *cls = jget(o, "cls"), *sep = jget(o, "sep");
    long a = 0, b = 0;
    dj_status st;
    if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || cJSON_GetArraySize(cls) != 2 || cJSON_GetArraySize(sep) != 2)
        return dj_fail(DJ_EFORMAT, "tokenizer: %s needs \"cls\" and \"sep\" as [token, id]", type);
    if ((st = jint(cJSON_GetArrayItem(cls, 1), 0, (long)tok->n_ids - 1, "cls id", &a))) return st;
    if ((st = jint(cJSON_GetArrayItem(sep, 1), 0, (long)tok->n_ids - 1, "sep id", &b))) return st;
    dj__template t = {0};
    t.ids = dj_malloc(2 * sizeof *t.ids);
    if (!t.ids) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    t.ids[0] = (int32_t)a;
    t.ids[1] = (int32_t)b;
    t.n_ids = 2;
    t.n_before = 1;
    return push_template(tok, &t);
}

static dj_status add_postproc(dj_tokenizer_t *tok, const cJSON *o, int depth) {
    const char *type = jtype(o);
    if (!type) return dj_fail(DJ_EFORMAT, "tokenizer: post_processor without a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = jget(o, "processors");
        if (!cJSON_IsArray(list))
            return dj_fail(DJ_EFORMAT, "tokenizer: Sequence post_processor needs a \"processors\" list");
        if (depth > 8) return dj_fail(DJ_EFORMAT, "tokenizer: post_processor Sequences nested too deeply");
        const cJSON *it;
        cJSON_ArrayForEach(it, list) {
            dj_status st = add_postproc(tok, it, depth + 1);
            if (st) return st;
        }
        return DJ_OK;
    }
    if (!strcmp(type, "ByteLevel")) return DJ_OK; /* adjusts offsets only */
    if (!strcmp(type, "TemplateProcessing")) return add_template(tok, o);
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) return add_cls_sep(tok, o, type);
    return dj_fail(DJ_EUNSUPPORTED, "tokenizer: post_processor type \"%.40s\" is not supported", type);
}

/* ---- model and added tokens ---- */

static dj_status arena_put(dj__sbuf *arena, const char *s, size_t n, uint32_t *off) {
    if (arena->n + n >= UINT32_MAX) return dj_fail(DJ_EFORMAT, "tokenizer: vocabulary text over 4 GiB");
    *off = (uint32_t)arena->n;
    return dj__sbuf_put(arena, s, n);
}

static dj_status parse_merge(const cJSON *m, size_t i, const char **a, size_t *al, const char **b, size_t *bl) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return dj_fail(DJ_EFORMAT, "tokenizer: merge #%zu \"%.60s\" is not two tokens separated by one space", i, s);
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = strlen(sp + 1);
        return DJ_OK;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
        const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
        if (cJSON_IsString(x) && cJSON_IsString(y)) {
            *a = x->valuestring;
            *al = strlen(*a);
            *b = y->valuestring;
            *bl = strlen(*b);
            return DJ_OK;
        }
    }
    return dj_fail(DJ_EFORMAT, "tokenizer: merge #%zu must be \"a b\" or [\"a\", \"b\"]", i);
}

static dj_status load_model(dj_tokenizer_t *tok, const cJSON *model, const cJSON *added, dj__sbuf *arena) {
    dj_status st;
    const char *type;
    if (!cJSON_IsObject(model)) return dj_fail(DJ_EFORMAT, "tokenizer: no \"model\" object");
    if ((st = jstr(model, "type", "model", &type))) return st;
    const cJSON *vocab = jget(model, "vocab"), *merges = jget(model, "merges");
    if (!type && cJSON_IsObject(vocab) && cJSON_IsArray(merges)) type = "BPE"; /* older files leave it out */
    if (!type) return dj_fail(DJ_EFORMAT, "tokenizer: model has no \"type\"");
    if (strcmp(type, "BPE")) return dj_fail(DJ_EUNSUPPORTED, "tokenizer: model type \"%.40s\" is not supported (only BPE)", type);
    if (!cJSON_IsObject(vocab)) return dj_fail(DJ_EFORMAT, "tokenizer: BPE model has no \"vocab\" object");
    if (!jnull(merges) && !cJSON_IsArray(merges)) return dj_fail(DJ_EFORMAT, "tokenizer: BPE \"merges\" must be a list");
    const cJSON *dropout = jget(model, "dropout");
    if (!jnull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return dj_fail(DJ_EUNSUPPORTED, "tokenizer: BPE dropout is not supported");
    if ((st = jbool(model, "fuse_unk", false, "model", &tok->fuse_unk))) return st;
    if ((st = jbool(model, "byte_fallback", false, "model", &tok->byte_fallback))) return st;
    if ((st = jbool(model, "ignore_merges", false, "model", &tok->ignore_merges))) return st;
    const char *unk, *pre, *suf;
    if ((st = jstr(model, "unk_token", "model", &unk))) return st;
    if ((st = jstr(model, "continuing_subword_prefix", "model", &pre))) return st;
    if ((st = jstr(model, "end_of_word_suffix", "model", &suf))) return st;
    if (unk && (st = dupstr(unk, strlen(unk), &tok->unk_name))) return st;
    if (pre && pre[0]) {
        tok->cont_prefix_len = strlen(pre);
        if ((st = dupstr(pre, tok->cont_prefix_len, &tok->cont_prefix))) return st;
    }
    if (suf && suf[0]) {
        tok->word_suffix_len = strlen(suf);
        if ((st = dupstr(suf, tok->word_suffix_len, &tok->word_suffix))) return st;
    }

    /* vocab: strings into the arena, ids checked */
    int nv = cJSON_GetArraySize(vocab);
    if (nv <= 0) return dj_fail(DJ_EFORMAT, "tokenizer: BPE vocab is empty");
    tok->vocab = dj_malloc((size_t)nv * sizeof *tok->vocab);
    if (!tok->vocab) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    long max_id = -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        long id = 0;
        char what[96];
        snprintf(what, sizeof what, "id of vocab token \"%.40s\"", it->string);
        if ((st = jint(it, 0, DJ__TOK_MAX_ID - 1, what, &id))) return st;
        dj__vocab_entry *e = &tok->vocab[tok->n_vocab++];
        size_t len = strlen(it->string);
        if ((st = arena_put(arena, it->string, len, &e->off))) return st;
        e->len = (uint32_t)len;
        e->id = (int32_t)id;
        if (id > max_id) max_id = id;
    }
    int na = cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0;
    if (!jnull(added) && !cJSON_IsArray(added)) return dj_fail(DJ_EFORMAT, "tokenizer: \"added_tokens\" must be a list");
    if (na > 0) {
        cJSON_ArrayForEach(it, added) {
            const cJSON *id = cJSON_IsObject(it) ? jget(it, "id") : NULL;
            long x = 0;
            if ((st = jint(id, 0, DJ__TOK_MAX_ID - 1, "added token id", &x))) return st;
            if (x > max_id) max_id = x;
        }
    }
    tok->n_ids = (uint32_t)max_id + 1;
    tok->id_off = dj_malloc(tok->n_ids * sizeof *tok->id_off);
    tok->id_len = dj_calloc(tok->n_ids, sizeof *tok->id_len);
    tok->id_added = dj_calloc(tok->n_ids, 1);
    if (!tok->id_off || !tok->id_len || !tok->id_added) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < tok->n_ids; i++) tok->id_off[i] = DJ__TOK_NO_STR;
    for (uint32_t i = 0; i < tok->n_vocab; i++) {
        tok->id_off[tok->vocab[i].id] = tok->vocab[i].off;
        tok->id_len[tok->vocab[i].id] = tok->vocab[i].len;
    }
    return DJ_OK;
}

/* After the arena is final: the vocab map, merges, byte ids. */
static dj_status build_model_maps(dj_tokenizer_t *tok, const cJSON *model) {
    tok->vocab_map.cap = pow2_above(tok->n_vocab);
    tok->vocab_map.slots = dj_calloc(tok->vocab_map.cap, sizeof *tok->vocab_map.slots);
    if (!tok->vocab_map.slots) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < tok->n_vocab; i++) dj__tok_vocab_insert(tok, i);

    tok->unk_id = -1;
    if (tok->unk_name) {
        tok->unk_id = dj__tok_vocab_find(tok, tok->unk_name, strlen(tok->unk_name));
        if (tok->unk_id < 0) tok->unk_id = -2;
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tok->byte_ids[b] = dj__tok_vocab_find(tok, name, 6);
    }

    const cJSON *merges = jget(model, "merges");
    int nm = cJSON_IsArray(merges) ? cJSON_GetArraySize(merges) : 0;
    tok->merge_cap = pow2_above((uint32_t)nm);
    tok->merges = dj_malloc(tok->merge_cap * sizeof *tok->merges);
    if (!tok->merges) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < tok->merge_cap; i++) tok->merges[i].key = UINT64_MAX;
    if (!nm) return DJ_OK;
    dj__sbuf cat = {0};
    size_t i = 0;
    const cJSON *m;
    dj_status st = DJ_OK;
    cJSON_ArrayForEach(m, merges) {
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if ((st = parse_merge(m, i, &a, &al, &b, &bl))) break;
        int32_t ia = dj__tok_vocab_find(tok, a, al), ib = dj__tok_vocab_find(tok, b, bl);
        if (ia < 0 || ib < 0) {
            st = dj_fail(DJ_EFORMAT, "tokenizer: merge #%zu names token \"%.*s\" that is not in the vocab", i,
                         (int)((ia < 0 ? al : bl) > 60 ? 60 : (ia < 0 ? al : bl)), ia < 0 ? a : b);
            break;
        }
        if (tok->cont_prefix && bl >= tok->cont_prefix_len && !memcmp(b, tok->cont_prefix, tok->cont_prefix_len)) {
            b += tok->cont_prefix_len;
            bl -= tok->cont_prefix_len;
        }
        cat.n = 0;
        if ((st = dj__sbuf_put(&cat, a, al)) || (st = dj__sbuf_put(&cat, b, bl))) break;
        int32_t id = dj__tok_vocab_find(tok, cat.p, cat.n);
        if (id < 0) {
            st = dj_fail(DJ_EFORMAT, "tokenizer: merge #%zu makes token \"%.*s\" that is not in the vocab", i,
                         (int)(cat.n > 60 ? 60 : cat.n), cat.p);
            break;
        }
        dj__tok_merge_insert(tok, ia, ib, (uint32_t)i, id);
        i++;
    }
    dj__sbuf_free(&cat);
    return st;
}

static dj_status load_added(dj_tokenizer_t *tok, const cJSON *added, dj__sbuf *arena) {
    int na = cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0;
    if (na <= 0) return DJ_OK;
    tok->added = dj_calloc((size_t)na, sizeof *tok->added);
    if (!tok->added) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    const cJSON *it;
    dj_status st;
    cJSON_ArrayForEach(it, added) {
        const char *content;
        long id = 0;
        if ((st = jstr(it, "content", "added token", &content))) return st;
        if (!content) return dj_fail(DJ_EFORMAT, "tokenizer: added token without \"content\"");
        if ((st = jint(jget(it, "id"), 0, DJ__TOK_MAX_ID - 1, "added token id", &id))) return st;
        dj__added *a = &tok->added[tok->n_added];
        if ((st = jbool(it, "special", false, "added token", &a->special))) return st;
        if ((st = jbool(it, "lstrip", false, "added token", &a->lstrip))) return st;
        if ((st = jbool(it, "rstrip", false, "added token", &a->rstrip))) return st;
        if ((st = jbool(it, "single_word", false, "added token", &a->single_word))) return st;
        if ((st = jbool(it, "normalized", !a->special, "added token", &a->normalized))) return st;
        size_t len = strlen(content);
        if (!dj__utf8_valid(content, len)) return dj_fail(DJ_EFORMAT, "tokenizer: added token id %ld is not valid UTF-8", id);
        if ((st = arena_put(arena, content, len, &a->off))) return st;
        a->len = (uint32_t)len;
        /* a token already in the model vocab keeps the model's id */
        a->id = (int32_t)id;
        if (len == 0) continue; /* never matches; keep no entry */
        tok->n_added++;
    }
    return DJ_OK;
}

/* Normalized forms of the normalized added tokens, appended to the arena. */
static dj_status finish_added(dj_tokenizer_t *tok, dj__sbuf *arena) {
    dj__sbuf tmp = {0};
    dj_status st = DJ_OK;
    for (uint32_t i = 0; i < tok->n_added && !st; i++) {
        dj__added *a = &tok->added[i];
        if (!a->normalized) continue;
        tmp.n = 0;
        if ((st = dj__sbuf_put(&tmp, "", 0))) break;
        if ((st = dj__tok_normalize(tok, arena->p + a->off, a->len, &tmp))) break;
        if (tmp.n == 0) {
            a->normalized = false; /* normalizes to nothing: match the raw text */
            continue;
        }
        st = arena_put(arena, tmp.p, tmp.n, &a->noff);
        a->nlen = (uint32_t)tmp.n;
    }
    dj__sbuf_free(&tmp);
    return st;
}

static dj_status build_added_sets(dj_tokenizer_t *tok) {
    for (int pass = 0; pass < 2; pass++) {
        dj__added_set *set = pass ? &tok->added_norm : &tok->added_raw;
        set->idx = dj_malloc((tok->n_added + 1) * sizeof *set->idx);
        if (!set->idx) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
        uint32_t count[257] = {0};
        for (uint32_t i = 0; i < tok->n_added; i++) {
            const dj__added *a = &tok->added[i];
            if (a->normalized != (pass == 1)) continue;
            uint8_t b = (uint8_t)tok->arena[pass ? a->noff : a->off];
            count[b + 1]++;
        }
        for (int b = 0; b < 256; b++) count[b + 1] += count[b];
        memcpy(set->bucket, count, sizeof count);
        for (uint32_t i = 0; i < tok->n_added; i++) {
            const dj__added *a = &tok->added[i];
            if (a->normalized != (pass == 1)) continue;
            uint8_t b = (uint8_t)tok->arena[pass ? a->noff : a->off];
            set->idx[count[b]++] = i;
        }
        set->n = set->bucket[256];
    }
    return DJ_OK;
}

static dj_status load_json(dj_tokenizer_t *tok, const cJSON *root) {
    dj_status st;
    dj__sbuf arena = {0};
    if (!cJSON_IsObject(root)) return dj_fail(DJ_EFORMAT, "tokenizer: the JSON document is not an object");
    const cJSON *model = jget(root, "model"), *added = jget(root, "added_tokens");
    if ((st = load_model(tok, model, added, &arena))) goto done;
    if ((st = load_added(tok, added, &arena))) goto done;

    const cJSON *norm = jget(root, "normalizer");
    size_t cap = 0;
    if (!jnull(norm) && (st = add_normalizer(tok, norm, &cap, 0))) goto done;
    if ((st = finish_added(tok, &arena))) goto done;
    tok->arena = arena.p;
    tok->arena_len = arena.n;
    arena.p = NULL; /* owned by tok */

    if ((st = build_model_maps(tok, model))) goto done;
    for (uint32_t i = 0; i < tok->n_added; i++) {
        dj__added *a = &tok->added[i];
        int32_t mid = dj__tok_vocab_find(tok, tok->arena + a->off, a->len);
        if (mid >= 0) a->id = mid;
        tok->id_off[a->id] = a->off;
        tok->id_len[a->id] = a->len;
        tok->id_added[a->id] = 1;
    }
    if ((st = build_added_sets(tok))) goto done;

    const cJSON *pre = jget(root, "pre_tokenizer");
    cap = 0;
    if (!jnull(pre) && (st = add_pretok(tok, pre, &cap, 0))) goto done;
    const cJSON *post = jget(root, "post_processor");
    if (!jnull(post) && (st = add_postproc(tok, post, 0))) goto done;
    const cJSON *dec = jget(root, "decoder");
    cap = 0;
    tok->has_decoder = !jnull(dec);
    if (tok->has_decoder && (st = add_decoder(tok, dec, &cap, 0))) goto done;
done:
    dj__sbuf_free(&arena);
    return st;
}

dj_status dj_tokenizer_load_buffer(const char *json, size_t len, dj_tokenizer_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "dj_tokenizer_load_buffer: out is NULL");
    *out = NULL;
    if (!json) return dj_fail(DJ_EINVAL, "dj_tokenizer_load_buffer: json is NULL");
    dj_status st;
    dj_tokenizer_t *tok = dj_calloc(1, sizeof *tok);
    if (!tok) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    if (!dj__utf8_valid(json, len)) { /* then every string cJSON hands us is valid too */
        st = dj_fail(DJ_EFORMAT, "tokenizer: the JSON is not valid UTF-8");
        goto fail;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
    while (root && end < json + len && (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')) end++;
    if (root && end != json + len) {
        cJSON_Delete(root);
        st = dj_fail(DJ_EFORMAT, "tokenizer: malformed JSON: trailing bytes at byte %zu", (size_t)(end - json));
        goto fail;
    }
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t off = at && at >= json && at <= json + len ? (size_t)(at - json) : 0;
        st = dj_fail(DJ_EFORMAT, "tokenizer: malformed JSON near byte %zu", off);
        goto fail;
    }
    st = load_json(tok, root);
    cJSON_Delete(root);
    if (st) goto fail;
    *out = tok;
    return DJ_OK;
fail:
    dj_tokenizer_free(tok);
    return st;
}

dj_status dj_tokenizer_load(const char *path, dj_tokenizer_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "dj_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return dj_fail(DJ_EINVAL, "dj_tokenizer_load: path is NULL");
    const size_t plen = strlen(path);
    if (plen > 5 && !strcmp(path + plen - 5, ".gguf")) {
        cJSON *root = NULL;
        dj_status st = dj__tok_gguf_json(path, &root);
        dj_tokenizer_t *tok = st == DJ_OK ? dj_calloc(1, sizeof *tok) : NULL;
        if (st == DJ_OK && !tok) st = dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
        if (st == DJ_OK) st = load_json(tok, root);
        cJSON_Delete(root);
        if (st != DJ_OK) {
            dj_tokenizer_free(tok);
            return st;
        }
        *out = tok;
        return DJ_OK;
    }
    FILE *f;
    dj_status st = dj__file_fopen(path, &f); /* never blocks on a FIFO; regular files only */
    if (st == DJ_ENOTFOUND) { /* DJ_EIO, as before */
        char why[512];
        snprintf(why, sizeof why, "%s", dj_last_error());
        return dj_fail(DJ_EIO, "tokenizer: %s", why);
    }
    if (st != DJ_OK) return st;
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        st = dj_fail(DJ_EIO, "tokenizer: cannot size %s", path);
        goto done;
    }
    buf = dj_malloc((size_t)n + 1);
    if (!buf) {
        st = dj_fail(DJ_ENOMEM, "tokenizer: out of memory reading %s (%ld bytes)", path, n);
        goto done;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        st = dj_fail(DJ_EIO, "tokenizer: short read on %s", path);
        goto done;
    }
    buf[n] = '\0';
    st = dj_tokenizer_load_buffer(buf, (size_t)n, out);
done:
    free(buf);
    fclose(f);
    return st;
}

void dj_tokenizer_free(dj_tokenizer_t *tok) {
    if (!tok) return;
    free(tok->arena);
    free(tok->id_off);
    free(tok->id_len);
    free(tok->id_added);
    free(tok->vocab);
    free(tok->vocab_map.slots);
    free(tok->merges);
    free(tok->unk_name);
    free(tok->cont_prefix);
    free(tok->word_suffix);
    for (size_t i = 0; i < tok->n_norms; i++) {
        free(tok->norms[i].str);
        free(tok->norms[i].content);
        pcre2_code_free(tok->norms[i].re);
    }
    free(tok->norms);
    for (size_t i = 0; i < tok->n_pretoks; i++) pcre2_code_free(tok->pretoks[i].re);
    free(tok->pretoks);
    for (size_t i = 0; i < tok->n_decs; i++) {
        free(tok->decs[i].pat);
        free(tok->decs[i].content);
        pcre2_code_free(tok->decs[i].re);
    }
    free(tok->decs);
    free(tok->added);
    free(tok->added_raw.idx);
    free(tok->added_norm.idx);
    for (size_t i = 0; i < tok->n_templates; i++) free(tok->templates[i].ids);
    free(tok->templates);
    free(tok);
}

uint32_t dj_tokenizer_vocab_size(const dj_tokenizer_t *tok) { return tok ? tok->n_ids : 0; }

int32_t dj_tokenizer_token_id(const dj_tokenizer_t *tok, const char *token) {
    if (!tok || !token) return -1;
    size_t n = strlen(token);
    for (uint32_t i = 0; i < tok->n_added; i++) {
        const dj__added *a = &tok->added[i];
        if (a->len == n && !memcmp(tok->arena + a->off, token, n)) return a->id;
    }
    return dj__tok_vocab_find(tok, token, n);
}

int32_t dj_tokenizer_bos_id(const dj_tokenizer_t *tok) {
    if (!tok) return -1;
    for (size_t i = 0; i < tok->n_templates; i++)
        if (tok->templates[i].n_before > 0) return tok->templates[i].ids[0];
    return -1;
}
