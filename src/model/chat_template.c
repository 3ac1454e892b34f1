/* chat_template.c: the chat template of a model - tokenizer_config.json's
 * chat_template with its bos/eos tokens, parsed once, rendered per request. */
#include <stdio.h>
#include "djinn/alloc.h"
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/file.h"
#include "model/jinja_impl.h"
#include "model/tok_impl.h"

static dj_status refuse_nul(const char *vars_json, size_t vars_len);

/* Cap on a template's source: real ones are a few KiB. */
#define MAX_TEMPLATE ((size_t)1 << 20)

dj_status dj_chat_template_parse(const char *src, size_t len, dj_chat_template_t **out) {
    *out = NULL;
    if (len > MAX_TEMPLATE) return dj_fail(DJ_ERANGE, "chat template of %zu bytes (at most %zu)", len, MAX_TEMPLATE);
    dj_chat_template_t *t = dj_calloc(1, sizeof *t);
    if (!t) return dj_fail(DJ_ENOMEM, "out of memory");
    t->arena.cap = 64 * MAX_TEMPLATE;
    t->bos = dj_strdup("");
    t->eos = dj_strdup("");
    dj_status st = t->bos && t->eos ? dj__jinja_parse(t, src, len) : dj_fail(DJ_ENOMEM, "out of memory");
    if (st != DJ_OK) {
        dj_chat_template_free(t);
        return st;
    }
    *out = t;
    return DJ_OK;
}

void dj_chat_template_free(dj_chat_template_t *t) {
    if (!t) return;
    dj__arena_free(&t->arena);
    free(t->bos);
    free(t->eos);
    free(t);
}

const char *dj_chat_template_bos(const dj_chat_template_t *t) { return t->bos; }
const char *dj_chat_template_eos(const dj_chat_template_t *t) { return t->eos; }

/* bos_token / eos_token: a string, {"content": string}, null or absent. */
static dj_status special(const cJSON *cfg, const char *key, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!v || cJSON_IsNull(v)) return DJ_OK;
    if (!cJSON_IsString(v)) return dj_fail(DJ_EFORMAT, "tokenizer_config.json: %s is not a string", key);
    char *s = dj_strdup(v->valuestring);
    if (!s) return dj_fail(DJ_ENOMEM, "out of memory");
    free(*out);
    *out = s;
    return DJ_OK;
}

dj_status dj_chat_template_load_config(const char *json, size_t len, dj_chat_template_t **out) {
    *out = NULL;
    cJSON *cfg = cJSON_ParseWithLength(json, len);
    if (!cfg) return dj_fail(DJ_EFORMAT, "tokenizer_config.json is not valid JSON");
    dj_status st = DJ_OK;
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (cJSON_IsArray(tpl)) { /* [{"name": ..., "template": ...}]: the default one */
        const cJSON *pick = NULL;
        for (const cJSON *e = tpl->child; e; e = e->next) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(n) && !strcmp(n->valuestring, "default")) pick = e;
        }
        tpl = pick ? cJSON_GetObjectItemCaseSensitive(pick, "template") : NULL;
    }
    if (!cJSON_IsString(tpl)) {
        st = dj_fail(DJ_ENOTFOUND, "tokenizer_config.json has no chat_template");
        goto done;
    }
    if ((st = dj_chat_template_parse(tpl->valuestring, strlen(tpl->valuestring), out)) != DJ_OK) goto done;
    if ((st = special(cfg, "bos_token", &(*out)->bos)) != DJ_OK ||
        (st = special(cfg, "eos_token", &(*out)->eos)) != DJ_OK) {
        dj_chat_template_free(*out);
        *out = NULL;
    }
done:
    cJSON_Delete(cfg);
    return st;
}

/* The bytes of path (NUL-terminated; at most cap): DJ_ENOTFOUND when it
 * cannot be opened. */
static dj_status read_file(const char *path, size_t cap, char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    FILE *f;
    dj_status st = dj__file_fopen(path, &f); /* never blocks on a FIFO; regular files only */
    if (st != DJ_OK) return st;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || (size_t)n > cap) st = dj_fail(DJ_ERANGE, "%s: unreadable or over %zu MiB", path, cap >> 20);
    else if (!(*buf = dj_malloc((size_t)n + 1))) st = dj_fail(DJ_ENOMEM, "out of memory");
    else if (fseek(f, 0, SEEK_SET) != 0 || fread(*buf, 1, (size_t)n, f) != (size_t)n) st = dj_fail(DJ_EIO, "%s: read failed", path);
    fclose(f);
    if (st != DJ_OK) {
        free(*buf);
        *buf = NULL;
        return st;
    }
    (*buf)[n] = '\0';
    *len = (size_t)n;
    return DJ_OK;
}

/* The last error again, prefixed with path. */
static dj_status naming(dj_status st, const char *path) {
    char why[512];
    snprintf(why, sizeof why, "%s", dj_last_error());
    return dj_fail(st, "%s: %s", path, why);
}

dj_status dj_chat_template_load(const char *model_dir, dj_chat_template_t **out) {
    *out = NULL;
    char cfg_path[4096], tpl_path[4096];
    if (snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", model_dir) >= (int)sizeof cfg_path ||
        snprintf(tpl_path, sizeof tpl_path, "%s/chat_template.jinja", model_dir) >= (int)sizeof tpl_path)
        return dj_fail(DJ_EINVAL, "model path too long");
    char *cfg = NULL, *tpl = NULL;
    size_t n_cfg = 0, n_tpl = 0;
    dj_status st = read_file(tpl_path, MAX_TEMPLATE, &tpl, &n_tpl);
    const bool have_tpl = st == DJ_OK;
    if (st != DJ_OK && st != DJ_ENOTFOUND) return st;
    /* transformers reads the file in Python's text mode: \r\n and \r are \n */
    size_t w = 0;
    for (size_t i = 0; i < n_tpl; i++) {
        if (tpl[i] == '\r' && i + 1 < n_tpl && tpl[i + 1] == '\n') continue;
        tpl[w++] = tpl[i] == '\r' ? '\n' : tpl[i];
    }
    n_tpl = w;
    st = read_file(cfg_path, 64 * MAX_TEMPLATE, &cfg, &n_cfg);
    if (st == DJ_ENOTFOUND && !have_tpl) st = dj_fail(DJ_ENOTFOUND, "%s: no chat_template.jinja and no tokenizer_config.json", model_dir);
    else if (st == DJ_ENOTFOUND) st = DJ_OK; /* a template without a config: no bos/eos */
    if (st == DJ_OK && !have_tpl) {
        if ((st = dj_chat_template_load_config(cfg, n_cfg, out)) != DJ_OK) st = naming(st, cfg_path);
    } else if (st == DJ_OK) {
        if ((st = dj_chat_template_parse(tpl, n_tpl, out)) != DJ_OK) st = naming(st, tpl_path);
        cJSON *j = st == DJ_OK && cfg ? cJSON_ParseWithLength(cfg, n_cfg) : NULL;
        if (st == DJ_OK && cfg && !j) st = dj_fail(DJ_EFORMAT, "%s: not valid JSON", cfg_path);
        if (j && ((st = special(j, "bos_token", &(*out)->bos)) != DJ_OK || (st = special(j, "eos_token", &(*out)->eos)) != DJ_OK))
            st = naming(st, cfg_path);
        cJSON_Delete(j);
        if (st != DJ_OK) {
            dj_chat_template_free(*out);
            *out = NULL;
        }
    }
    free(cfg);
    free(tpl);
    return st;
}

dj_status dj_chat_template_render(const dj_chat_template_t *t, const char *vars_json, size_t vars_len, char **text,
                                  size_t *len) {
    *text = NULL;
    *len = 0;
    if (refuse_nul(vars_json, vars_len) != DJ_OK) return DJ_EINVAL;
    cJSON *vars = cJSON_ParseWithLength(vars_json, vars_len);
    if (!vars) return dj_fail(DJ_EFORMAT, "chat template variables are not valid JSON");
    dj_status st = dj__jinja_render(t, vars, text, len);
    cJSON_Delete(vars);
    return st;
}

bool dj__json_has_nul_escape(const char *s, size_t n) {
    if (memchr(s, 0, n)) return true; /* a raw one too */
    for (size_t i = 0; i + 5 < n; i++) {
        if (s[i] != '\\' || s[i + 1] != 'u' || memcmp(s + i + 2, "0000", 4)) continue;
        size_t k = 0; /* backslashes before this one: an odd count escapes it */
        while (k < i && s[i - 1 - k] == '\\') k++;
        if (k % 2 == 0) return true;
    }
    return false;
}

static dj_status refuse_nul(const char *vars_json, size_t vars_len) {
    if (vars_json && dj__json_has_nul_escape(vars_json, vars_len))
        return dj_fail(DJ_EINVAL, "chat template variables: a string holds \\u0000 (NUL), which is not text");
    return DJ_OK;
}

/* ---- rendering for the tokenizer: message content is text ---- */

/* Special tokens written in the variables (message content, tools: anything
 * a client sent) must stay text, while the template's own stay control
 * tokens. Before rendering, each occurrence of a special token's text in a
 * variable string becomes one placeholder character of Unicode's
 * supplementary private use area B (U+100000 + its index); a character of
 * that area already in a variable becomes a placeholder for itself, so a
 * client cannot forge one. The template moves placeholders about as any
 * character (filters, slices, concatenation). After rendering, each one
 * becomes its text again, and its bytes a plain span: the tokenizer matches
 * no special token over them (dj_tokenizer_encode_plain). The price: a
 * template that inspects special-token text inside content sees one
 * character instead. */
#define MARK_BASE 0x100000u
#define MARK_MAX 0xFFFEu /* U+100000..U+10FFFD */

typedef struct {
    const char *p; /* the text it stands for (tokenizer arena, or pua[]) */
    uint32_t n;
} mark_lit;

typedef struct {
    const dj_tokenizer_t *tok;
    uint32_t *spec;        /* [n_spec] indices of the special added tokens, sorted by first byte */
    uint32_t n_spec;
    uint32_t bucket[257];  /* spec[bucket[b] .. bucket[b+1]) start with byte b */
    int32_t *of_spec;      /* [tok->n_added] its mark, or -1 */
    int32_t *of_pua;       /* [MARK_MAX] a private-use character's mark, or -1 (allocated on first need) */
    char (*pua)[4];        /* [MARK_MAX] the bytes of those characters */
    mark_lit *lit;         /* [n_lit] mark i stands for lit[i] */
    uint32_t n_lit, cap_lit;
} marks;

static void marks_free(marks *m) {
    free(m->spec);
    free(m->of_spec);
    free(m->of_pua);
    free(m->pua);
    free(m->lit);
}

static dj_status marks_init(marks *m, const dj_tokenizer_t *tok) {
    memset(m, 0, sizeof *m);
    m->tok = tok;
    m->spec = dj_malloc((tok->n_added + 1) * sizeof *m->spec);
    m->of_spec = dj_malloc((tok->n_added + 1) * sizeof *m->of_spec);
    if (!m->spec || !m->of_spec) return dj_fail(DJ_ENOMEM, "chat template: out of memory");
    uint32_t count[256] = {0};
    for (uint32_t k = 0; k < tok->n_added; k++) {
        m->of_spec[k] = -1;
        const dj__added *a = &tok->added[k];
        if (a->special && a->len) count[(uint8_t)tok->arena[a->off]]++;
    }
    for (int b = 0; b < 256; b++) m->bucket[b + 1] = m->bucket[b] + count[b];
    uint32_t fill[256];
    memcpy(fill, m->bucket, sizeof fill);
    for (uint32_t k = 0; k < tok->n_added; k++) {
        const dj__added *a = &tok->added[k];
        if (a->special && a->len) m->spec[fill[(uint8_t)tok->arena[a->off]]++] = k;
    }
    m->n_spec = m->bucket[256];
    return DJ_OK;
}

static dj_status mark_new(marks *m, const char *p, uint32_t n, int32_t *out) {
    if (m->n_lit == MARK_MAX)
        return dj_fail(DJ_ERANGE, "chat messages hold more than %u distinct special tokens and private-use characters",
                       MARK_MAX);
    if (m->n_lit == m->cap_lit) {
        const uint32_t cap = m->cap_lit ? 2 * m->cap_lit : 16;
        mark_lit *v = dj_realloc(m->lit, cap * sizeof *v);
        if (!v) return dj_fail(DJ_ENOMEM, "chat template: out of memory");
        m->lit = v;
        m->cap_lit = cap;
    }
    m->lit[m->n_lit] = (mark_lit){p, n};
    *out = (int32_t)m->n_lit++;
    return DJ_OK;
}

/* The code point of a 4-byte UTF-8 sequence of the marks' area at s[0..n), or 0. */
static uint32_t mark_cp(const uint8_t *s, size_t n) {
    if (n < 4 || s[0] != 0xF4 || s[1] < 0x80 || s[1] > 0x8F || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
        return 0;
    const uint32_t cp = (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (uint32_t)(s[3] & 0x3F);
    return cp <= 0xFFFDu ? MARK_BASE + cp : 0; /* U+10FFFE and U+10FFFF are not private use */
}

static void mark_put(char *o, int32_t idx) {
    const uint32_t cp = MARK_BASE + (uint32_t)idx;
    o[0] = (char)0xF4;
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
}

/* s with its special tokens and private-use characters marked: *out NULL when
 * nothing changed, else malloc'd (NUL-terminated). */
static dj_status mark_string(marks *m, const char *s, char **out) {
    *out = NULL;
    const size_t n = strlen(s);
    const dj_tokenizer_t *tok = m->tok;
    char *o = NULL;
    size_t on = 0, copied = 0; /* s[copied..i) still to copy into o */
    for (size_t i = 0; i < n;) {
        const uint8_t b = (uint8_t)s[i];
        int32_t idx = -1;
        size_t len = 0;
        if (b == 0xF4 && mark_cp((const uint8_t *)s + i, n - i)) {
            const uint32_t k = mark_cp((const uint8_t *)s + i, n - i) - MARK_BASE;
            if (!m->of_pua) {
                m->of_pua = dj_malloc(MARK_MAX * sizeof *m->of_pua);
                m->pua = dj_malloc(MARK_MAX * sizeof *m->pua);
                if (!m->of_pua || !m->pua) return dj_fail(DJ_ENOMEM, "chat template: out of memory");
                for (uint32_t j = 0; j < MARK_MAX; j++) m->of_pua[j] = -1;
            }
            if (m->of_pua[k] < 0) {
                memcpy(m->pua[k], s + i, 4);
                dj_status st = mark_new(m, m->pua[k], 4, &m->of_pua[k]);
                if (st != DJ_OK) return st;
            }
            idx = m->of_pua[k];
            len = 4;
        } else {
            uint32_t best = UINT32_MAX;
            for (uint32_t j = m->bucket[b]; j < m->bucket[b + 1]; j++) {
                const dj__added *a = &tok->added[m->spec[j]];
                if (a->len > len && i + a->len <= n && !memcmp(s + i, tok->arena + a->off, a->len)) {
                    len = a->len;
                    best = m->spec[j];
                }
            }
            if (best != UINT32_MAX) {
                if (m->of_spec[best] < 0) {
                    dj_status st = mark_new(m, tok->arena + tok->added[best].off, tok->added[best].len,
                                            &m->of_spec[best]);
                    if (st != DJ_OK) return st;
                }
                idx = m->of_spec[best];
            }
        }
        if (idx < 0) {
            i++;
            continue;
        }
        /* a mark (4 bytes) stands for 1 byte at least: the string grows 4 times at most */
        if (!o && !(o = dj_malloc(4 * n + 1))) return dj_fail(DJ_ENOMEM, "chat template: out of memory");
        memcpy(o + on, s + copied, i - copied);
        on += i - copied;
        mark_put(o + on, idx);
        on += 4;
        i += len;
        copied = i;
    }
    if (!o) return DJ_OK;
    memcpy(o + on, s + copied, n - copied);
    on += n - copied;
    o[on] = '\0';
    *out = o;
    return DJ_OK;
}

/* Every string (and key) of j, marked. */
static dj_status mark_json(marks *m, cJSON *j, int depth) {
    if (depth > 256) return dj_fail(DJ_ERANGE, "chat template variables nest deeper than 256");
    for (cJSON *c = j; c; c = c->next) {
        char *o = NULL;
        dj_status st;
        if (c->string && !(c->type & cJSON_StringIsConst)) {
            if ((st = mark_string(m, c->string, &o)) != DJ_OK) return st;
            if (o) {
                char *k = cJSON_malloc(strlen(o) + 1);
                if (!k) {
                    free(o);
                    return dj_fail(DJ_ENOMEM, "chat template: out of memory");
                }
                strcpy(k, o);
                cJSON_free(c->string);
                c->string = k;
                free(o);
            }
        }
        if (cJSON_IsString(c) && c->valuestring) {
            if ((st = mark_string(m, c->valuestring, &o)) != DJ_OK) return st;
            if (o) {
                const bool ok = cJSON_SetValuestring(c, o) != NULL;
                free(o);
                if (!ok) return dj_fail(DJ_ENOMEM, "chat template: out of memory");
            }
        }
        if (c->child && (st = mark_json(m, c->child, depth + 1)) != DJ_OK) return st;
    }
    return DJ_OK;
}

/* The rendered text with its marks replaced by their texts (*out malloc'd),
 * and those texts' byte ranges (*spans malloc'd, sorted, disjoint). */
static dj_status unmark(const marks *m, const char *s, size_t n, char **out, size_t *n_out, dj_text_span **spans,
                        size_t *n_spans) {
    *out = NULL;
    *spans = NULL;
    *n_out = *n_spans = 0;
    size_t cap = n + 1, cap_sp = 0, on = 0, ns = 0;
    char *o = dj_malloc(cap);
    dj_text_span *sp = NULL;
    if (!o) return dj_fail(DJ_ENOMEM, "chat template: out of memory");
    for (size_t i = 0; i < n;) {
        const uint32_t cp = (uint8_t)s[i] == 0xF4 ? mark_cp((const uint8_t *)s + i, n - i) : 0;
        const uint32_t k = cp ? cp - MARK_BASE : 0;
        if (!cp || k >= m->n_lit) { /* the template's own text */
            o[on++] = s[i++];
            continue;
        }
        const mark_lit *l = &m->lit[k];
        if (on + l->n + (n - i) + 1 > cap) {
            cap = 2 * (on + l->n + (n - i) + 1);
            char *g = dj_realloc(o, cap);
            if (!g) goto oom;
            o = g;
        }
        if (ns && sp[ns - 1].end == on) { /* adjacent: one span */
            sp[ns - 1].end = on + l->n;
        } else {
            if (ns == cap_sp) {
                cap_sp = cap_sp ? 2 * cap_sp : 16;
                dj_text_span *g = dj_realloc(sp, cap_sp * sizeof *g);
                if (!g) goto oom;
                sp = g;
            }
            sp[ns++] = (dj_text_span){on, on + l->n};
        }
        memcpy(o + on, l->p, l->n);
        on += l->n;
        i += 4;
    }
    o[on] = '\0';
    *out = o;
    *n_out = on;
    *spans = sp;
    *n_spans = ns;
    return DJ_OK;
oom:
    free(o);
    free(sp);
    return dj_fail(DJ_ENOMEM, "chat template: out of memory");
}

dj_status dj_chat_template_encode(const dj_chat_template_t *t, const dj_tokenizer_t *tok, const char *vars_json,
                                  size_t vars_len, bool add_special, int32_t **ids, size_t *n_ids) {
    if (!ids || !n_ids) return dj_fail(DJ_EINVAL, "dj_chat_template_encode: NULL output");
    *ids = NULL;
    *n_ids = 0;
    if (!t || !tok || (!vars_json && vars_len))
        return dj_fail(DJ_EINVAL, "dj_chat_template_encode: NULL template, tokenizer or variables");
    if (refuse_nul(vars_json, vars_len) != DJ_OK) return DJ_EINVAL;
    cJSON *vars = cJSON_ParseWithLength(vars_json ? vars_json : "", vars_len);
    if (!vars) return dj_fail(DJ_EFORMAT, "chat template variables are not valid JSON");
    marks m;
    char *text = NULL, *plain = NULL;
    size_t len = 0, n_plain = 0, n_spans = 0;
    dj_text_span *spans = NULL;
    dj_status st = marks_init(&m, tok);
    if (st == DJ_OK && vars->child) st = mark_json(&m, vars->child, 0);
    if (st == DJ_OK) st = dj__jinja_render(t, vars, &text, &len);
    cJSON_Delete(vars);
    if (st == DJ_OK) st = unmark(&m, text, len, &plain, &n_plain, &spans, &n_spans);
    if (st == DJ_OK) st = dj_tokenizer_encode_plain(tok, plain, n_plain, add_special, spans, n_spans, ids, n_ids);
    marks_free(&m);
    free(text);
    free(plain);
    free(spans);
    return st;
}
