/* chat_template.c: the chat template of a model - tokenizer_config.json's
 * chat_template with its bos/eos tokens, parsed once, rendered per request. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/file.h"
#include "model/jinja_impl.h"

/* Cap on a template's source: real ones are a few KiB. */
#define MAX_TEMPLATE ((size_t)1 << 20)

dj_status dj_chat_template_parse(const char *src, size_t len, dj_chat_template_t **out) {
    *out = NULL;
    if (len > MAX_TEMPLATE) return dj_fail(DJ_ERANGE, "chat template of %zu bytes (at most %zu)", len, MAX_TEMPLATE);
    dj_chat_template_t *t = calloc(1, sizeof *t);
    if (!t) return dj_fail(DJ_ENOMEM, "out of memory");
    t->arena.cap = 64 * MAX_TEMPLATE;
    t->bos = strdup("");
    t->eos = strdup("");
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
    char *s = strdup(v->valuestring);
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
    else if (!(*buf = malloc((size_t)n + 1))) st = dj_fail(DJ_ENOMEM, "out of memory");
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
    cJSON *vars = cJSON_ParseWithLength(vars_json, vars_len);
    if (!vars) return dj_fail(DJ_EFORMAT, "chat template variables are not valid JSON");
    dj_status st = dj__jinja_render(t, vars, text, len);
    cJSON_Delete(vars);
    return st;
}
