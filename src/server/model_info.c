/* model_info.c: MODEL_INFO - what a client needs to hold a "ghost" of a model
 * (its config.json, generation and tokenizer settings, EOS ids), read from the
 * model store's folder without loading a single weight. */
#define _GNU_SOURCE
#include <errno.h>
#include "djinn/alloc.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/file.h"
#include "djinn/checkpoint.h"
#include "djinn/generate.h"
#include "server/server_impl.h"

#define INFO_MAX_FILE (256u << 10) /* a config file larger than this is not a config */

/* dir/name into *out (malloc'd, NUL-terminated, *n bytes). DJ_ENOTFOUND when
 * absent, DJ_ERANGE past INFO_MAX_FILE, DJ_EIO otherwise. */
static dj_status read_small(const char *dir, const char *name, char **out /* OUT */, size_t *n /* OUT */) {
    *out = NULL;
    *n = 0;
    char path[PATH_MAX];
    const int k = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (k < 0 || (size_t)k >= sizeof path) return dj_fail(DJ_ERANGE, "model path too long");
    FILE *f;
    dj_status st = dj__file_fopen(path, &f); /* never blocks on a FIFO; regular files only */
    if (st != DJ_OK) return st;
    char *buf = dj_malloc(INFO_MAX_FILE + 1);
    if (!buf) {
        fclose(f);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    const size_t got = fread(buf, 1, INFO_MAX_FILE + 1, f);
    const bool err = ferror(f) != 0;
    fclose(f);
    if (err || got > INFO_MAX_FILE) {
        free(buf);
        return err ? dj_fail(DJ_EIO, "%s: read error", path)
                   : dj_fail(DJ_ERANGE, "%s is larger than %u KiB", path, INFO_MAX_FILE >> 10);
    }
    buf[got] = '\0';
    *out = buf;
    *n = got;
    return DJ_OK;
}

/* Store names are folder names: letters, digits, '.', '_', '-'; not "." or "..". */
static bool store_name_ok(const char *n) {
    if (!n[0] || !strcmp(n, ".") || !strcmp(n, "..")) return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == '-'))
            return false;
    return true;
}

dj_status dj__model_info(const char *models_dir, const dj__meta *m, dj__mw *w) {
    char name[128];
    dj_status st = dj__meta_strcpy(m, "model", true, name, sizeof name);
    if (st != DJ_OK) return st;
    if (!store_name_ok(name))
        return dj_fail(DJ_EINVAL, "model name '%s': use the name of a folder in the model store", name);
    char dir[PATH_MAX];
    const int k = snprintf(dir, sizeof dir, "%s/%s", models_dir, name);
    if (k < 0 || (size_t)k >= sizeof dir) return dj_fail(DJ_ERANGE, "model path too long");
    char *config = NULL, *gen = NULL, *tokcfg = NULL;
    size_t n_config = 0, n_gen = 0, n_tokcfg = 0;
    if ((st = read_small(dir, "config.json", &config, &n_config)) != DJ_OK)
        return st == DJ_ENOTFOUND ? dj_fail(DJ_ENOTFOUND, "no model '%s' in the model store", name) : st;
    dj_model_config cfg;
    int32_t eos[8];
    size_t n_eos = 0;
    if ((st = dj_model_config_parse(config, n_config, &cfg)) != DJ_OK ||
        (st = dj_gen_eos_ids(dir, &cfg, eos, sizeof eos / sizeof *eos, &n_eos)) != DJ_OK) {
        free(config);
        return st;
    }
    /* optional files: absent is fine, unreadable or oversized is not */
    if ((st = read_small(dir, "generation_config.json", &gen, &n_gen)) == DJ_ENOTFOUND) st = DJ_OK;
    if (st == DJ_OK && (st = read_small(dir, "tokenizer_config.json", &tokcfg, &n_tokcfg)) == DJ_ENOTFOUND) st = DJ_OK;
    if (st != DJ_OK) {
        free(config);
        free(gen);
        return st;
    }
    char tok_path[PATH_MAX];
    struct stat sb;
    const int kt = snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
    const bool has_tok = kt > 0 && (size_t)kt < sizeof tok_path && stat(tok_path, &sb) == 0 && S_ISREG(sb.st_mode);
    dj__mw_str(w, "model", name);
    dj__mw_str(w, "arch", cfg.arch_name);
    dj__mw_u64(w, "vocab", cfg.vocab_size);
    dj__mw_u64(w, "max_ctx", cfg.max_position_embeddings);
    dj__mw_u64(w, "layers", cfg.n_layers);
    dj__mw_u64(w, "hidden", cfg.hidden_size);
    dj__mw_ids(w, "eos_ids", eos, n_eos);
    dj__mw_bool(w, "tokenizer", has_tok);
    dj__mw_strn(w, "config", config, n_config);
    if (gen) dj__mw_strn(w, "generation_config", gen, n_gen);
    if (tokcfg) dj__mw_strn(w, "tokenizer_config", tokcfg, n_tokcfg);
    free(config);
    free(gen);
    free(tokcfg);
    return DJ_OK;
}
