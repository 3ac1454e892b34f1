/* tok_gguf.c: a tokenizer from a GGUF file's vocabulary (llama.cpp's
 * tokenizer.ggml.* keys), built as the tokenizer.json transformers makes of
 * the same SentencePiece model, then loaded like any tokenizer.json.
 *
 * Only SentencePiece BPE vocabularies (tokenizer.ggml.model "llama": Llama 2,
 * Phi-3, ...) are read. transformers' LlamaConverter (legacy) turns such a
 * model into: BPE with byte fallback and fuse_unk, its merges made from the
 * pieces' scores (every split of a piece into two pieces of the vocabulary,
 * ordered by the piece's score, highest first; then by the two halves' ids);
 * normalizer Prepend("▁") + Replace(" ", "▁") (without the Prepend when
 * tokenizer.ggml.add_space_prefix is false); decoder Replace("▁", " "),
 * ByteFallback, Fuse, Strip(1 left); BOS/EOS added as add_bos_token /
 * add_eos_token say. Token types: CONTROL and UNKNOWN are special added
 * tokens, USER_DEFINED added tokens that are not special. llama.cpp pads a
 * vocabulary to the model's embedding rows with "[PAD<id>]" tokens that the
 * Hugging Face tokenizer does not have: those ids are left out. */
#include <math.h>
#include "djinn/alloc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/file.h"
#include "model/tok_impl.h"

enum { GG_U8, GG_I8, GG_U16, GG_I16, GG_U32, GG_I32, GG_F32, GG_BOOL, GG_STR, GG_ARR, GG_U64, GG_I64, GG_F64 };
enum { TT_NORMAL = 1, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE };

#define MAX_STR ((uint64_t)1 << 24)  /* one string value (a chat template is the longest) */
#define MAX_KEY 65536u
#define MAX_KV ((uint64_t)1 << 16)

typedef struct {
    FILE *f;
    const char *path;
    uint64_t left; /* bytes of the file not read yet: bounds every count */
} reader;

typedef struct {
    char **tok;       /* [n] NUL-terminated */
    uint32_t *tok_len;
    float *score;     /* [n] */
    int32_t *type;    /* [n] */
    uint64_t n, n_score, n_type;
    char *model;
    int add_bos, add_eos, add_space; /* -1: absent */
    int64_t bos, eos, unk;           /* -1: absent */
} vocab;

static dj_status rd(reader *r, void *p, uint64_t n) {
    if (n > r->left || fread(p, 1, (size_t)n, r->f) != n)
        return dj_fail(DJ_EFORMAT, "tokenizer: %s: GGUF metadata runs past the end of the file", r->path);
    r->left -= n;
    return DJ_OK;
}
static dj_status skip(reader *r, uint64_t n) {
    if (n > r->left || fseeko(r->f, (off_t)n, SEEK_CUR) != 0)
        return dj_fail(DJ_EFORMAT, "tokenizer: %s: GGUF metadata runs past the end of the file", r->path);
    r->left -= n;
    return DJ_OK;
}
static dj_status rd_u32(reader *r, uint32_t *v) { return rd(r, v, 4); } /* GGUF is little-endian, as we are */
static dj_status rd_u64(reader *r, uint64_t *v) { return rd(r, v, 8); }

/* A GGUF string: u64 length, bytes; *out malloc'd and NUL-terminated. */
static dj_status rd_str(reader *r, uint64_t cap, char **out, uint32_t *len) {
    uint64_t n;
    dj_status st = rd_u64(r, &n);
    if (st) return st;
    if (n > r->left) return rd(r, NULL, n); /* the error */
    if (n > cap) return dj_fail(DJ_EFORMAT, "tokenizer: %s: a GGUF string of %llu bytes", r->path, (unsigned long long)n);
    char *s = dj_malloc((size_t)n + 1);
    if (!s) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    if ((st = rd(r, s, n))) {
        free(s);
        return st;
    }
    s[n] = '\0';
    *out = s;
    if (len) *len = (uint32_t)n;
    return DJ_OK;
}

static uint64_t scalar_size(uint32_t t) {
    static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof sz ? sz[t] : 0;
}

/* Skip a value of type t (arrays of strings walked, nested arrays refused). */
static dj_status skip_value(reader *r, uint32_t t, int depth) {
    dj_status st;
    if (t == GG_STR) {
        uint64_t n;
        if ((st = rd_u64(r, &n))) return st;
        return skip(r, n);
    }
    if (t == GG_ARR) {
        uint32_t et;
        uint64_t n;
        if (depth > 0) return dj_fail(DJ_EUNSUPPORTED, "tokenizer: %s: nested GGUF arrays", r->path);
        if ((st = rd_u32(r, &et)) || (st = rd_u64(r, &n))) return st;
        if (et == GG_STR) {
            for (uint64_t i = 0; i < n; i++)
                if ((st = skip_value(r, GG_STR, depth + 1))) return st;
            return DJ_OK;
        }
        if (!scalar_size(et)) return dj_fail(DJ_EFORMAT, "tokenizer: %s: GGUF array of type %u", r->path, et);
        if (n > r->left / scalar_size(et)) return skip(r, r->left + 1);
        return skip(r, n * scalar_size(et));
    }
    if (!scalar_size(t)) return dj_fail(DJ_EFORMAT, "tokenizer: %s: GGUF value of type %u", r->path, t);
    return skip(r, scalar_size(t));
}

/* An integer or bool scalar of type t as int64. */
static dj_status rd_int(reader *r, uint32_t t, const char *key, int64_t *v) {
    uint8_t b[8] = {0};
    if (t == GG_STR || t == GG_ARR || t == GG_F32 || t == GG_F64 || !scalar_size(t))
        return dj_fail(DJ_EFORMAT, "tokenizer: %s: GGUF key %s is not an integer", r->path, key);
    dj_status st = rd(r, b, scalar_size(t));
    if (st) return st;
    switch (t) {
    case GG_I8: *v = (int8_t)b[0]; break;
    case GG_I16: *v = (int16_t)(b[0] | b[1] << 8); break;
    case GG_I32: { int32_t x; memcpy(&x, b, 4); *v = x; break; }
    case GG_I64: memcpy(v, b, 8); break;
    case GG_U16: *v = b[0] | b[1] << 8; break;
    case GG_U32: { uint32_t x; memcpy(&x, b, 4); *v = x; break; }
    case GG_U64: { uint64_t x; memcpy(&x, b, 8); *v = x > INT64_MAX ? -1 : (int64_t)x; break; }
    default: *v = b[0]; /* u8, bool */
    }
    return DJ_OK;
}

/* The array header of key, which must hold elements of type want. */
static dj_status rd_arr(reader *r, uint32_t t, const char *key, uint32_t want, uint64_t *n) {
    uint32_t et;
    dj_status st;
    if (t != GG_ARR) return dj_fail(DJ_EFORMAT, "tokenizer: %s: GGUF key %s is not an array", r->path, key);
    if ((st = rd_u32(r, &et)) || (st = rd_u64(r, n))) return st;
    if (et != want) return dj_fail(DJ_EFORMAT, "tokenizer: %s: GGUF key %s has elements of type %u", r->path, key, et);
    const uint64_t least = want == GG_STR ? 8 : scalar_size(want);
    if (*n > r->left / least || *n > DJ__TOK_MAX_ID)
        return dj_fail(DJ_EFORMAT, "tokenizer: %s: GGUF key %s claims %llu elements", r->path, key, (unsigned long long)*n);
    return DJ_OK;
}

static dj_status read_vocab(reader *r, vocab *v) {
    char magic[4];
    uint32_t ver;
    uint64_t n_tensors, n_kv;
    dj_status st;
    if ((st = rd(r, magic, 4)) || memcmp(magic, "GGUF", 4))
        return dj_fail(DJ_EFORMAT, "tokenizer: %s is not a GGUF file", r->path);
    if ((st = rd_u32(r, &ver))) return st;
    if (ver < 2 || ver > 3) return dj_fail(DJ_EUNSUPPORTED, "tokenizer: %s: GGUF version %u (2 and 3 are read)", r->path, ver);
    if ((st = rd_u64(r, &n_tensors)) || (st = rd_u64(r, &n_kv))) return st;
    if (n_kv > MAX_KV) return dj_fail(DJ_EFORMAT, "tokenizer: %s: %llu GGUF keys", r->path, (unsigned long long)n_kv);
    for (uint64_t k = 0; k < n_kv; k++) {
        char *key = NULL;
        uint32_t t;
        if ((st = rd_str(r, MAX_KEY, &key, NULL))) return st;
        if ((st = rd_u32(r, &t))) goto next;
        int64_t iv;
        if (!strcmp(key, "tokenizer.ggml.model")) {
            if (t != GG_STR) st = dj_fail(DJ_EFORMAT, "tokenizer: %s: tokenizer.ggml.model is not a string", r->path);
            else if (!v->model) st = rd_str(r, MAX_KEY, &v->model, NULL);
            else st = skip_value(r, t, 0);
        } else if (!strcmp(key, "tokenizer.ggml.tokens") && !v->tok) {
            if ((st = rd_arr(r, t, key, GG_STR, &v->n))) goto next;
            v->tok = dj_calloc(v->n ? v->n : 1, sizeof *v->tok);
            v->tok_len = dj_calloc(v->n ? v->n : 1, sizeof *v->tok_len);
            if (!v->tok || !v->tok_len) st = dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
            for (uint64_t i = 0; !st && i < v->n; i++) st = rd_str(r, MAX_KEY, &v->tok[i], &v->tok_len[i]);
        } else if (!strcmp(key, "tokenizer.ggml.scores") && !v->score) {
            if ((st = rd_arr(r, t, key, GG_F32, &v->n_score))) goto next;
            if (!(v->score = dj_malloc((v->n_score ? v->n_score : 1) * sizeof *v->score))) st = dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
            else st = rd(r, v->score, v->n_score * 4);
        } else if (!strcmp(key, "tokenizer.ggml.token_type") && !v->type) {
            if ((st = rd_arr(r, t, key, GG_I32, &v->n_type))) goto next;
            if (!(v->type = dj_malloc((v->n_type ? v->n_type : 1) * sizeof *v->type))) st = dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
            else st = rd(r, v->type, v->n_type * 4);
        } else if (!strcmp(key, "tokenizer.ggml.add_bos_token")) {
            if (!(st = rd_int(r, t, key, &iv))) v->add_bos = iv != 0;
        } else if (!strcmp(key, "tokenizer.ggml.add_eos_token")) {
            if (!(st = rd_int(r, t, key, &iv))) v->add_eos = iv != 0;
        } else if (!strcmp(key, "tokenizer.ggml.add_space_prefix")) {
            if (!(st = rd_int(r, t, key, &iv))) v->add_space = iv != 0;
        } else if (!strcmp(key, "tokenizer.ggml.bos_token_id")) {
            st = rd_int(r, t, key, &v->bos);
        } else if (!strcmp(key, "tokenizer.ggml.eos_token_id")) {
            st = rd_int(r, t, key, &v->eos);
        } else if (!strcmp(key, "tokenizer.ggml.unknown_token_id")) {
            st = rd_int(r, t, key, &v->unk);
        } else {
            st = skip_value(r, t, 0);
        }
    next:
        free(key);
        if (st) return st;
    }
    if (!v->model) return dj_fail(DJ_EFORMAT, "tokenizer: %s: no tokenizer.ggml.model", r->path);
    if (strcmp(v->model, "llama"))
        return dj_fail(DJ_EUNSUPPORTED, "tokenizer: %s: GGUF tokenizer model '%s' (only SentencePiece 'llama' is read)", r->path, v->model);
    if (!v->tok || !v->score || !v->type || v->n_score != v->n || v->n_type != v->n || v->n == 0)
        return dj_fail(DJ_EFORMAT, "tokenizer: %s: tokenizer.ggml.tokens, scores and token_type missing or of different lengths", r->path);
    return DJ_OK;
}

static void vocab_free(vocab *v) {
    for (uint64_t i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->tok_len);
    free(v->score);
    free(v->type);
    free(v->model);
}

/* ---- merges from scores ---- */
typedef struct {
    uint32_t *slot; /* [cap] id + 1, 0 empty */
    uint32_t cap;
} idmap;

static uint64_t hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}
static int32_t idmap_get(const idmap *m, const vocab *v, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)hash(s, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->slot[i]) return -1;
        const uint32_t id = m->slot[i] - 1;
        if (v->tok_len[id] == n && !memcmp(v->tok[id], s, n)) return (int32_t)id;
    }
}

typedef struct {
    float score;
    uint32_t piece, l, r;
} merge;

static int merge_cmp(const void *a_, const void *b_) {
    const merge *a = a_, *b = b_;
    if (a->score != b->score) return a->score > b->score ? -1 : 1; /* highest score first */
    if (a->piece != b->piece) return a->piece < b->piece ? -1 : 1; /* then as listed (a stable sort) */
    if (a->l != b->l) return a->l < b->l ? -1 : 1;
    return a->r < b->r ? -1 : a->r > b->r;
}

static bool is_pad(const vocab *v, uint64_t i) {
    char want[32];
    snprintf(want, sizeof want, "[PAD%llu]", (unsigned long long)i);
    return !strcmp(v->tok[i], want);
}

static cJSON *special_token(const char *s, int64_t id) {
    cJSON *o = cJSON_CreateObject(), *ids = cJSON_CreateArray(), *toks = cJSON_CreateArray();
    cJSON_AddStringToObject(o, "id", s);
    cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)id));
    cJSON_AddItemToObject(o, "ids", ids);
    cJSON_AddItemToArray(toks, cJSON_CreateString(s));
    cJSON_AddItemToObject(o, "tokens", toks);
    return o;
}

/* One item of a TemplateProcessing sequence: {kind: {"id": id, "type_id": 0}}
 * (kind "SpecialToken" or "Sequence"). */
static cJSON *template_item(const char *kind, const char *id) {
    cJSON *e = cJSON_CreateObject(), *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "id", id);
    cJSON_AddNumberToObject(s, "type_id", 0);
    cJSON_AddItemToObject(e, kind, s);
    return e;
}

/* The tokenizer.json of v (see the top of the file). */
static dj_status build_json(const vocab *v, const char *path, cJSON **out) {
    dj_status st = DJ_OK;
    idmap m = {0};
    merge *mg = NULL;
    size_t n_mg = 0, cap_mg = 0;
    for (m.cap = 16; m.cap < 2 * v->n + 2; m.cap *= 2) {}
    if (!(m.slot = dj_calloc(m.cap, sizeof *m.slot))) return dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
    for (uint64_t i = 0; i < v->n; i++) {
        if (is_pad(v, i)) continue;
        if (!dj__utf8_valid(v->tok[i], v->tok_len[i])) {
            st = dj_fail(DJ_EFORMAT, "tokenizer: %s: token %llu is not valid UTF-8", path, (unsigned long long)i);
            goto done;
        }
        uint32_t s = (uint32_t)hash(v->tok[i], v->tok_len[i]) & (m.cap - 1);
        bool dup = false;
        for (; m.slot[s]; s = (s + 1) & (m.cap - 1)) {
            const uint32_t o = m.slot[s] - 1;
            if (v->tok_len[o] == v->tok_len[i] && !memcmp(v->tok[o], v->tok[i], v->tok_len[i])) dup = true;
        }
        if (dup) {
            st = dj_fail(DJ_EFORMAT, "tokenizer: %s: token %llu ('%s') appears twice", path, (unsigned long long)i, v->tok[i]);
            goto done;
        }
        m.slot[s] = (uint32_t)i + 1;
    }
    /* every split of a piece at a character boundary into two pieces */
    for (uint64_t i = 0; i < v->n; i++) {
        if (is_pad(v, i)) continue;
        const char *p = v->tok[i];
        const size_t n = v->tok_len[i];
        for (size_t k = 1; k < n; k++) {
            if (((uint8_t)p[k] & 0xC0) == 0x80) continue; /* inside a character */
            const int32_t l = idmap_get(&m, v, p, k), r = l < 0 ? -1 : idmap_get(&m, v, p + k, n - k);
            if (r < 0) continue;
            if (n_mg == cap_mg) {
                merge *g = dj_realloc(mg, (cap_mg = cap_mg ? 2 * cap_mg : 1024) * sizeof *mg);
                if (!g) {
                    st = dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
                    goto done;
                }
                mg = g;
            }
            /* LlamaConverter scores <unk>, <s>, </s> 0 */
            const float sc = i < 3 ? 0.0f : v->score[i];
            mg[n_mg++] = (merge){isnan(sc) ? -INFINITY : sc, (uint32_t)i, (uint32_t)l, (uint32_t)r};
        }
    }
    qsort(mg, n_mg, sizeof *mg, merge_cmp);

    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vj = cJSON_CreateObject();
    cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddBoolToObject(model, "byte_fallback", true);
    cJSON_AddBoolToObject(model, "fuse_unk", true);
    const int64_t unk = v->unk >= 0 && (uint64_t)v->unk < v->n ? v->unk : 0;
    cJSON_AddStringToObject(model, "unk_token", v->tok[unk]);
    cJSON_AddItemToObject(model, "vocab", vj);
    cJSON_AddItemToObject(model, "merges", merges);
    for (uint64_t i = 0; i < v->n; i++) {
        if (is_pad(v, i)) continue;
        cJSON_AddItemToObject(vj, v->tok[i], cJSON_CreateNumber((double)i));
        const int32_t t = v->type[i];
        if (t == TT_CONTROL || t == TT_UNKNOWN || t == TT_USER_DEFINED) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", v->tok[i]);
            cJSON_AddBoolToObject(a, "normalized", false);
            cJSON_AddBoolToObject(a, "special", t != TT_USER_DEFINED);
            cJSON_AddItemToArray(added, a);
        }
    }
    for (size_t i = 0; i < n_mg; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateString(v->tok[mg[i].l]));
        cJSON_AddItemToArray(pair, cJSON_CreateString(v->tok[mg[i].r]));
        cJSON_AddItemToArray(merges, pair);
    }
    /* normalizer, decoder */
    cJSON *norm = cJSON_CreateObject(), *norms = cJSON_CreateArray(), *rep = cJSON_CreateObject(), *pat = cJSON_CreateObject();
    cJSON_AddStringToObject(norm, "type", "Sequence");
    cJSON_AddItemToObject(norm, "normalizers", norms);
    if (v->add_space != 0) {
        cJSON *pre = cJSON_CreateObject();
        cJSON_AddStringToObject(pre, "type", "Prepend");
        cJSON_AddStringToObject(pre, "prepend", "\xe2\x96\x81");
        cJSON_AddItemToArray(norms, pre);
    }
    cJSON_AddStringToObject(rep, "type", "Replace");
    cJSON_AddStringToObject(pat, "String", " ");
    cJSON_AddItemToObject(rep, "pattern", pat);
    cJSON_AddStringToObject(rep, "content", "\xe2\x96\x81");
    cJSON_AddItemToArray(norms, rep);
    cJSON_AddItemToObject(root, "normalizer", norm);
    cJSON *dec = cJSON_Parse("{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "
                             "\"\xe2\x96\x81\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
                             "{\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}");
    cJSON_AddItemToObject(root, "decoder", dec);
    /* BOS/EOS as the post-processor adds them (llama's defaults: BOS yes, EOS no) */
    const bool bos = v->add_bos != 0 && v->bos >= 0 && (uint64_t)v->bos < v->n;
    const bool eos = v->add_eos == 1 && v->eos >= 0 && (uint64_t)v->eos < v->n;
    if (bos || eos) {
        cJSON *post = cJSON_CreateObject(), *single = cJSON_CreateArray(), *sp = cJSON_CreateObject();
        cJSON_AddStringToObject(post, "type", "TemplateProcessing");
        if (bos) {
            cJSON_AddItemToArray(single, template_item("SpecialToken", v->tok[v->bos]));
            cJSON_AddItemToObject(sp, v->tok[v->bos], special_token(v->tok[v->bos], v->bos));
        }
        cJSON_AddItemToArray(single, template_item("Sequence", "A"));
        if (eos) {
            cJSON_AddItemToArray(single, template_item("SpecialToken", v->tok[v->eos]));
            if (!cJSON_GetObjectItemCaseSensitive(sp, v->tok[v->eos]))
                cJSON_AddItemToObject(sp, v->tok[v->eos], special_token(v->tok[v->eos], v->eos));
        }
        cJSON_AddItemToObject(post, "single", single);
        cJSON_AddItemToObject(post, "special_tokens", sp);
        cJSON_AddItemToObject(root, "post_processor", post);
    }
    /* cJSON reports no allocation failure as it builds: check the whole at the end */
    if (!root || !model || !vj || !merges || !added || !dec || cJSON_GetArraySize(merges) != (int)n_mg ||
        cJSON_GetArraySize(vj) == 0) {
        cJSON_Delete(root);
        st = dj_fail(DJ_ENOMEM, "tokenizer: out of memory");
        goto done;
    }
    *out = root;
done:
    free(m.slot);
    free(mg);
    return st;
}

dj_status dj__tok_gguf_json(const char *path, struct cJSON **out) {
    *out = NULL;
    reader r = {.path = path};
    dj_status ost = dj__file_fopen(path, &r.f); /* never blocks on a FIFO; regular files only */
    if (ost == DJ_ENOTFOUND) { /* DJ_EIO, as before */
        char why[512];
        snprintf(why, sizeof why, "%s", dj_last_error());
        return dj_fail(DJ_EIO, "tokenizer: %s", why);
    }
    if (ost != DJ_OK) return ost;
    long size = -1;
    if (fseek(r.f, 0, SEEK_END) == 0) size = ftell(r.f);
    if (size < 0 || fseek(r.f, 0, SEEK_SET) != 0) {
        fclose(r.f);
        return dj_fail(DJ_EIO, "tokenizer: cannot size %s", path);
    }
    r.left = (uint64_t)size;
    vocab v = {.add_bos = -1, .add_eos = -1, .add_space = -1, .bos = -1, .eos = -1, .unk = -1};
    dj_status st = read_vocab(&r, &v);
    fclose(r.f);
    if (st == DJ_OK) st = build_json(&v, path, out);
    vocab_free(&v);
    return st;
}
