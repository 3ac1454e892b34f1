/* lora.c: LoRA adapters - adapter_config.json checked and parsed, the
 * adapter's tensors bound to the base's projections and copied to the text
 * segment as f32, sessions choosing one, and each step's LORA calls. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "core/file.h"
#include "djinn/alloc.h"
#include "djinn/checkpoint.h"
#include "exec/engine_impl.h"
#include "exec/lora_impl.h"
#include "model/model_impl.h"

#define CONFIG_MAX ((size_t)1 << 20)
#define TENSORS_MAX ((size_t)1 << 34)

/* ---- adapter_config.json ---- */

static const struct {
    const char *leaf;
    unsigned bit;
} TARGETS[] = {{"q_proj", DJ_LORA_Q},       {"k_proj", DJ_LORA_K},     {"v_proj", DJ_LORA_V},
               {"o_proj", DJ_LORA_O},       {"gate_proj", DJ_LORA_GATE}, {"up_proj", DJ_LORA_UP},
               {"down_proj", DJ_LORA_DOWN}, {"qkv_proj", DJ_LORA_QKV}, {"gate_up_proj", DJ_LORA_GATE_UP}};
#define N_TARGETS (sizeof TARGETS / sizeof *TARGETS)

static unsigned target_bit(const char *leaf) {
    for (size_t i = 0; i < N_TARGETS; i++)
        if (strcmp(TARGETS[i].leaf, leaf) == 0) return TARGETS[i].bit;
    return 0;
}

static const char *target_leaf(unsigned bit) {
    for (size_t i = 0; i < N_TARGETS; i++)
        if (TARGETS[i].bit == bit) return TARGETS[i].leaf;
    return "?";
}

static const char *last_part(const char *s, char sep) {
    const char *p = strrchr(s, sep);
    return p && p[1] ? p + 1 : s;
}

/* A field that must be absent, null, false, or empty to mean "off". */
static bool field_set(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return false;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return cJSON_GetArraySize(v) > 0;
    if (cJSON_IsString(v)) return v->valuestring[0] != '\0';
    return true;
}

dj_status dj_lora_config_parse(const char *json, size_t len, dj_lora_config *out) {
    if (!json || !out) return dj_fail(DJ_EINVAL, "dj_lora_config_parse: NULL argument");
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dj_fail(DJ_EFORMAT, "adapter_config.json is not a JSON object");
    }
    dj_status st = DJ_OK;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (!cJSON_IsString(v)) {
        st = dj_fail(DJ_EFORMAT, "adapter_config.json: peft_type is missing (a PEFT LORA adapter has \"LORA\")");
        goto done;
    }
    if (strcmp(v->valuestring, "LORA") != 0) {
        st = dj_fail(DJ_EUNSUPPORTED, "adapter_config.json: peft_type \"%.64s\" is not supported (only LORA)",
                     v->valuestring);
        goto done;
    }
    static const char *const off_fields[] = {"modules_to_save", "layers_to_transform", "layers_pattern",
                                             "rank_pattern",    "alpha_pattern",       "use_dora",
                                             "fan_in_fan_out",  "lora_bias",           "megatron_config",
                                             "trainable_token_indices"};
    for (size_t i = 0; i < sizeof off_fields / sizeof *off_fields; i++)
        if (field_set(cJSON_GetObjectItemCaseSensitive(root, off_fields[i]))) {
            st = dj_fail(DJ_EUNSUPPORTED, "adapter_config.json: %s is set; adapters with it are not supported",
                         off_fields[i]);
            goto done;
        }
    v = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && strcmp(v->valuestring, "none") == 0)) {
        st = dj_fail(DJ_EUNSUPPORTED, "adapter_config.json: bias is not \"none\"; trained biases are not supported");
        goto done;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "r");
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
        v->valuedouble > DJ_LORA_MAX_RANK) {
        st = dj_fail(DJ_ERANGE, "adapter_config.json: r must be a whole number in 1..%d, got %.32s", DJ_LORA_MAX_RANK,
                     cJSON_IsNumber(v) ? "" : "none");
        if (cJSON_IsNumber(v))
            st = dj_fail(DJ_ERANGE, "adapter_config.json: r must be a whole number in 1..%d, got %g",
                         DJ_LORA_MAX_RANK, v->valuedouble);
        goto done;
    }
    out->r = (uint32_t)v->valuedouble;
    v = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    out->alpha = 8.0f; /* PEFT's default */
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || !isfinite(v->valuedouble) || v->valuedouble > 1e6) {
            st = dj_fail(DJ_ERANGE, "adapter_config.json: lora_alpha must be a positive number (at most 1e6)");
            goto done;
        }
        out->alpha = (float)v->valuedouble;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "use_rslora");
    if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v)) {
        st = dj_fail(DJ_EFORMAT, "adapter_config.json: use_rslora must be true or false");
        goto done;
    }
    out->rslora = cJSON_IsTrue(v);
    out->scale = out->rslora ? out->alpha / sqrtf((float)out->r) : out->alpha / (float)out->r;
    v = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    if (cJSON_IsString(v)) {
        st = dj_fail(DJ_EUNSUPPORTED,
                     "adapter_config.json: target_modules \"%.64s\" is a pattern; list the module names instead",
                     v->valuestring);
        goto done;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0) {
        st = dj_fail(DJ_EFORMAT, "adapter_config.json: target_modules must be a non-empty list of module names");
        goto done;
    }
    const cJSON *t;
    cJSON_ArrayForEach(t, v) {
        if (!cJSON_IsString(t)) {
            st = dj_fail(DJ_EFORMAT, "adapter_config.json: target_modules holds a value that is not a name");
            goto done;
        }
        const unsigned bit = target_bit(last_part(t->valuestring, '.'));
        if (!bit) {
            st = dj_fail(DJ_EUNSUPPORTED,
                         "adapter_config.json: target module \"%.64s\" is not supported (q_proj, k_proj, v_proj, "
                         "o_proj, gate_proj, up_proj, down_proj, qkv_proj, gate_up_proj)",
                         t->valuestring);
            goto done;
        }
        out->targets |= bit;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "base_model_name_or_path");
    if (cJSON_IsString(v)) snprintf(out->base, sizeof out->base, "%s", v->valuestring);
    else if (v && !cJSON_IsNull(v)) {
        st = dj_fail(DJ_EFORMAT, "adapter_config.json: base_model_name_or_path is not a string");
        goto done;
    }
done:
    cJSON_Delete(root);
    return st;
}

/* ---- reading the files ---- */

static dj_status read_all(const char *path, size_t max, uint8_t **out, size_t *len) {
    *out = NULL;
    *len = 0;
    int fd;
    struct stat sb;
    dj_status st = dj__file_open(path, &fd, &sb);
    if (st != DJ_OK) return st;
    if ((uint64_t)sb.st_size > max) {
        close(fd);
        return dj_fail(DJ_ERANGE, "%s: %lld bytes exceeds the limit of %zu", path, (long long)sb.st_size, max);
    }
    const size_t n = (size_t)sb.st_size;
    uint8_t *buf = dj_malloc(n ? n : 1);
    if (!buf) {
        close(fd);
        return dj_fail(DJ_ENOMEM, "%s: no memory for %zu bytes", path, n);
    }
    for (size_t got = 0; got < n;) {
        const ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            close(fd);
            free(buf);
            return dj_fail(DJ_EIO, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "file shrank");
        }
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = n;
    return DJ_OK;
}

/* ---- adapters known by their files' identity ---- */

/* A loaded adapter's fingerprint by its files' identity - the config's
 * bytes, the tensor file's (st_dev, st_ino, size, mtime ns) and the base -
 * so that loading it again (a daemon's new session) finds it in the text
 * segment without reading or hashing its tensors. A file rewritten in place
 * within one mtime tick with the same size is not noticed (as checkpoints). */
#define IDC_SLOTS 64
static struct {
    pthread_mutex_t mu;
    uint64_t id[IDC_SLOTS], fp[IDC_SLOTS];
    unsigned next;
} idc = {.mu = PTHREAD_MUTEX_INITIALIZER};

static uint64_t identity(const char *tensors, const uint8_t *cfg, size_t cfg_len, uint64_t base_fp) {
    struct stat sb;
    if (stat(tensors, &sb) != 0) return 0;
    const uint64_t v[6] = {base_fp, (uint64_t)sb.st_dev, (uint64_t)sb.st_ino, (uint64_t)sb.st_size,
                           (uint64_t)sb.st_mtim.tv_sec, (uint64_t)sb.st_mtim.tv_nsec};
    XXH3_state_t *h = XXH3_createState();
    if (!h) return 0;
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, v, sizeof v);
    XXH3_64bits_update(h, cfg, cfg_len);
    const uint64_t id = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return id ? id : 1;
}

static bool idc_get(uint64_t id, uint64_t *fp) {
    bool hit = false;
    pthread_mutex_lock(&idc.mu);
    for (unsigned i = 0; i < IDC_SLOTS && !hit; i++)
        if (id && idc.id[i] == id) {
            *fp = idc.fp[i];
            hit = true;
        }
    pthread_mutex_unlock(&idc.mu);
    return hit;
}

static void idc_put(uint64_t id, uint64_t fp) {
    if (!id) return;
    pthread_mutex_lock(&idc.mu);
    idc.id[idc.next] = id;
    idc.fp[idc.next] = fp;
    idc.next = (idc.next + 1) % IDC_SLOTS;
    pthread_mutex_unlock(&idc.mu);
}

/* ---- binding to the base ---- */

static const int PROJ_SLOTS[] = {DJ_W_Q, DJ_W_K, DJ_W_V, DJ_W_O, DJ_W_GATE, DJ_W_UP, DJ_W_DOWN};
#define N_PROJ (int)(sizeof PROJ_SLOTS / sizeof *PROJ_SLOTS)

/* One projection slot's binding: its A and B tensors (indices into the
 * file's table) and its first row of B (a fused tensor's part). */
typedef struct bind {
    int slot;
    size_t ta, tb;
    uint32_t b_row0;
} bind;

static const dj_tensor_info *find_info(const dj_tensor_info *t, size_t n, const char *name, size_t *at) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        const int c = strcmp(t[mid].name, name);
        if (c == 0) {
            *at = mid;
            return &t[mid];
        }
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static bool float_dtype(dj_dtype t) { return t == DJ_DTYPE_F32 || t == DJ_DTYPE_F16 || t == DJ_DTYPE_BF16; }

/* Element i of tensor data p of dtype t, as f32 (p may be unaligned). */
static float elem(const uint8_t *p, dj_dtype t, size_t i) {
    if (t == DJ_DTYPE_F32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t == DJ_DTYPE_BF16 ? dj_bf16_to_f32(h) : dj_f16_to_f32(h);
}

/* Whether the base's name and the adapter's base_model_name_or_path name the
 * same model: equal, or equal last path components ("org/Model" and "Model"). */
static bool same_base(const char *model, const char *want) {
    if (!want[0] || strcmp(model, want) == 0) return true;
    char a[512], b[512];
    snprintf(a, sizeof a, "%s", model);
    snprintf(b, sizeof b, "%s", want);
    for (char *p = a + strlen(a); p > a && p[-1] == '/';) *--p = '\0';
    for (char *p = b + strlen(b); p > b && p[-1] == '/';) *--p = '\0';
    return strcmp(last_part(a, '/'), last_part(b, '/')) == 0;
}

static void lora_dtor(void *user) {
    dj_lora_t *a = user;
    if (!a) return;
    free(a->slot);
    free(a);
}

dj_status dj_lora_load(dj_engine_t *e, const dj_model_t *base, const char *dir, dj_lora_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "dj_lora_load: NULL output");
    *out = NULL;
    if (!e || !base || !dir) return dj_fail(DJ_EINVAL, "dj_lora_load: NULL engine, base or directory");
    const dj_model_config *c = &base->cfg;
    char path[4096];
    uint8_t *cfg_bytes = NULL, *file = NULL;
    size_t cfg_len = 0, file_len = 0, n_info = 0, n_bind = 0;
    dj_tensor_info *info = NULL;
    bool *used = NULL;
    bind *binds = NULL;
    float **host = NULL; /* [n_info] f32 copies of the used tensors */
    dj_lora_t *a = NULL;
    dj_vmu_model_t *region = NULL;
    dj_status st;
    dj_lora_config lc;

    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if ((st = read_all(path, CONFIG_MAX, &cfg_bytes, &cfg_len)) != DJ_OK) goto fail;
    if ((st = dj_lora_config_parse((const char *)cfg_bytes, cfg_len, &lc)) != DJ_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", dj_last_error());
        dj_fail(st, "%s: %s", dir, why);
        goto fail;
    }
    if (!same_base(base->name, lc.base)) {
        st = dj_fail(DJ_EINVAL, "%s: an adapter of base \"%s\", not of \"%s\" (base_model_name_or_path)", dir,
                     lc.base, base->name);
        goto fail;
    }
    if (base->stream) {
        st = dj_fail(DJ_EUNSUPPORTED, "%s: model %s streams its weights; adapters need every layer resident", dir,
                     base->name);
        goto fail;
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    const uint64_t id = identity(path, cfg_bytes, cfg_len, base->fingerprint);
    uint64_t known = 0;
    if (idc_get(id, &known) && dj_vmu_model_lookup(e->vmu, known, &region) == DJ_OK) {
        a = dj_vmu_model_user(region);
        if (a && a->base_fp == base->fingerprint) { /* loaded before and still in the text segment */
            *out = a;
            region = NULL;
            a = NULL;
            st = DJ_OK;
            goto fail_quiet;
        }
        dj_vmu_model_release(e->vmu, region); /* not an adapter of this base: read the files */
        region = NULL;
        a = NULL;
    }
    if ((st = read_all(path, TENSORS_MAX, &file, &file_len)) != DJ_OK) goto fail;
    uint64_t hlen = 0;
    if (file_len < 8) {
        st = dj_fail(DJ_EFORMAT, "%s: %zu bytes, too short for a safetensors header", path, file_len);
        goto fail;
    }
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | file[i];
    if (hlen > file_len - 8) {
        st = dj_fail(DJ_EFORMAT, "%s: header length %llu exceeds the file", path, (unsigned long long)hlen);
        goto fail;
    }
    if ((st = dj_safetensors_parse_header((const char *)file + 8, (size_t)hlen, file_len - 8 - (size_t)hlen, &info,
                                          &n_info)) != DJ_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", dj_last_error());
        dj_fail(st, "%s: %s", path, why);
        goto fail;
    }
    uint8_t *data = file + 8 + hlen;

    /* the fingerprint: config, tensors, base; a second load is a reference */
    XXH3_state_t *h = XXH3_createState();
    if (!h) goto nomem;
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, "djinn-lora", 10);
    XXH3_64bits_update(h, &base->fingerprint, sizeof base->fingerprint);
    XXH3_64bits_update(h, cfg_bytes, cfg_len);
    XXH3_64bits_update(h, file, file_len);
    const uint64_t fp = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    if (dj_vmu_model_lookup(e->vmu, fp, &region) == DJ_OK) {
        a = dj_vmu_model_user(region);
        if (!a) { /* a region of this fingerprint that is no adapter: not ours to take */
            dj_vmu_model_release(e->vmu, region);
            st = dj_fail(DJ_EBUSY, "%s: the text segment holds another region under its fingerprint", dir);
            goto fail_quiet;
        }
        *out = a;
        region = NULL;
        a = NULL;
        idc_put(id, fp);
        st = DJ_OK;
        goto fail_quiet; /* frees what was read */
    }

    /* bind every targeted projection of every layer */
    const int n_slots = dj__wslot_count(c);
    used = dj_calloc(n_info ? n_info : 1, sizeof *used);
    binds = dj_calloc((size_t)c->n_layers * N_PROJ, sizeof *binds);
    host = dj_calloc(n_info ? n_info : 1, sizeof *host);
    if (!used || !binds || !host) goto nomem;
    unsigned matched = 0;
    for (uint32_t l = 0; l < c->n_layers; l++) {
        uint32_t row0 = 0;
        const char *prev = NULL;
        for (int p = 0; p < N_PROJ; p++) {
            const int slot = dj__wslot_layer_c(c, (int)l, PROJ_SLOTS[p]);
            const dj_weight *w = &base->w[slot];
            if (!w->hf_name) continue;
            /* a fused tensor's slots follow each other: B's rows for this one start after theirs */
            row0 = prev && strcmp(prev, w->hf_name) == 0 ? row0 : 0;
            char module[256];
            snprintf(module, sizeof module, "%s", w->hf_name);
            char *dot = strrchr(module, '.');
            if (dot && strcmp(dot, ".weight") == 0) *dot = '\0';
            const unsigned bit = target_bit(last_part(module, '.'));
            const uint32_t my_row0 = row0;
            row0 += (uint32_t)w->shape[0];
            prev = w->hf_name;
            if (!(bit & lc.targets)) continue;
            matched |= bit;
            if (!float_dtype(w->dtype)) {
                st = dj_fail(DJ_EUNSUPPORTED, "%s: base %s holds %s as %s; adapters on quantized bases are not "
                                              "supported yet",
                             dir, base->name, w->hf_name, dj_dtype_name(w->dtype));
                goto fail;
            }
            int64_t total = 0; /* the module's rows: every slot it feeds */
            for (int q = 0; q < N_PROJ; q++) {
                const dj_weight *o = &base->w[dj__wslot_layer_c(c, (int)l, PROJ_SLOTS[q])];
                if (o->hf_name && strcmp(o->hf_name, w->hf_name) == 0) total += o->shape[0];
            }
            if ((int64_t)lc.r > w->shape[1] || (int64_t)lc.r > total) {
                st = dj_fail(DJ_ERANGE, "%s: rank %u exceeds the dimensions of %s ([%lld,%lld]): not a low-rank update",
                             dir, lc.r, w->hf_name, (long long)total, (long long)w->shape[1]);
                goto fail;
            }
            char na[320], nb[320];
            snprintf(na, sizeof na, "base_model.model.%s.lora_A.weight", module);
            snprintf(nb, sizeof nb, "base_model.model.%s.lora_B.weight", module);
            size_t ia = 0, ib = 0;
            const dj_tensor_info *ta = find_info(info, n_info, na, &ia), *tb = find_info(info, n_info, nb, &ib);
            if (!ta || !tb) {
                st = dj_fail(DJ_ENOTFOUND, "%s: target %s of layer %u has no tensor '%s'", dir, target_leaf(bit), l,
                             ta ? nb : na);
                goto fail;
            }
            if (ta->ndim != 2 || ta->shape[0] != lc.r || ta->shape[1] != w->shape[1] || tb->ndim != 2 ||
                tb->shape[0] != total || tb->shape[1] != lc.r) {
                st = dj_fail(DJ_EFORMAT,
                             "%s: '%s' must be [%u,%lld] and '%s' [%lld,%u] for base %s (r %u); got [%lld,%lld] and "
                             "[%lld,%lld]",
                             dir, na, lc.r, (long long)w->shape[1], nb, (long long)total, lc.r, base->name, lc.r,
                             (long long)ta->shape[0], (long long)(ta->ndim > 1 ? ta->shape[1] : 0),
                             (long long)tb->shape[0], (long long)(tb->ndim > 1 ? tb->shape[1] : 0));
                goto fail;
            }
            if (!float_dtype(ta->dtype) || !float_dtype(tb->dtype)) {
                st = dj_fail(DJ_EUNSUPPORTED, "%s: '%s' is %s; adapter tensors are f32, f16 or bf16", dir,
                             float_dtype(ta->dtype) ? nb : na, dj_dtype_name(float_dtype(ta->dtype) ? tb->dtype : ta->dtype));
                goto fail;
            }
            used[ia] = used[ib] = true;
            binds[n_bind++] = (bind){.slot = slot, .ta = ia, .tb = ib, .b_row0 = my_row0};
        }
    }
    if (matched != lc.targets) {
        const unsigned miss = lc.targets & ~matched;
        st = dj_fail(DJ_ENOTFOUND, "%s: target_modules names %s, which base %s has no module of", dir,
                     target_leaf(miss & -miss), base->name);
        goto fail;
    }
    for (size_t i = 0; i < n_info; i++)
        if (!used[i]) {
            st = dj_fail(DJ_EUNSUPPORTED, "%s: tensor '%s' adapts nothing we support (targets: q/k/v/o, gate/up/down)",
                         dir, info[i].name);
            goto fail;
        }

    /* f32 copies, every value finite */
    size_t text = 0;
    for (size_t i = 0; i < n_info; i++) {
        const size_t count = info[i].nbytes / dj_dtype_size(info[i].dtype);
        if (!(host[i] = dj_malloc(count ? count * sizeof(float) : 1))) goto nomem;
        const uint8_t *src = data + (uintptr_t)info[i].data;
        for (size_t k = 0; k < count; k++) {
            host[i][k] = elem(src, info[i].dtype, k);
            if (!isfinite(host[i][k])) {
                st = dj_fail(DJ_EINVAL, "%s: tensor '%s' holds a value that is not finite (element %zu)", dir,
                             info[i].name, k);
                goto fail;
            }
        }
        text += dj_vmu_aligned(count * sizeof(float));
    }

    if (!(a = dj_calloc(1, sizeof *a)) || !(a->slot = dj_calloc((size_t)n_slots, sizeof *a->slot))) goto nomem;
    a->cfg = lc;
    a->fingerprint = fp;
    a->base_fp = base->fingerprint;
    a->n_slots = (uint32_t)n_slots;
    {
        char d[512];
        snprintf(d, sizeof d, "%s", dir);
        for (char *p = d + strlen(d); p > d && p[-1] == '/';) *--p = '\0';
        snprintf(a->name, sizeof a->name, "%s", last_part(d, '/'));
    }
    char rname[300];
    snprintf(rname, sizeof rname, "lora:%s", a->name);
    if ((st = dj_vmu_model_create(e->vmu, fp, rname, text ? text : DJ_VMU_ALIGN, &region)) != DJ_OK) goto fail;
    a->region = region;
    float **dev = dj_calloc(n_info ? n_info : 1, sizeof *dev); /* each tensor's text-segment copy */
    if (!dev) goto nomem;
    for (size_t i = 0; i < n_info && st == DJ_OK; i++) {
        const size_t bytes = info[i].nbytes / dj_dtype_size(info[i].dtype) * sizeof(float);
        void *p = NULL;
        st = dj_vmu_model_alloc(region, bytes ? bytes : 4, &p);
        if (st == DJ_OK && bytes) st = e->be->vt->upload(e->be, p, host[i], bytes);
        dev[i] = p;
    }
    if (st == DJ_OK)
        for (size_t i = 0; i < n_bind; i++) {
            dj_lora_mat *m = &a->slot[binds[i].slot];
            m->a = dev[binds[i].ta];
            m->b = dev[binds[i].tb] + (size_t)binds[i].b_row0 * lc.r;
            m->rank = lc.r;
            m->ldb = lc.r;
            m->scale = lc.scale;
        }
    free(dev);
    if (st != DJ_OK) goto fail;
    dj_vmu_model_set_user(region, a, lora_dtor);
    idc_put(id, fp);
    region = NULL;
    *out = a;
    a = NULL;
    st = DJ_OK;
    goto fail_quiet;
nomem:
    st = dj_fail(DJ_ENOMEM, "%s: out of memory loading the adapter", dir);
fail:
    DJ_LOG(WARN, "%s", dj_last_error());
fail_quiet:
    if (region) { /* made here and not handed out: undo */
        dj_vmu_model_release(e->vmu, region);
        (void)dj_vmu_model_evict(e->vmu, region);
    }
    lora_dtor(a); /* made here and not handed to a region */
    if (host)
        for (size_t i = 0; i < n_info; i++) free(host[i]);
    free(host);
    free(binds);
    free(used);
    dj_safetensors_free_infos(info, n_info);
    free(file);
    free(cfg_bytes);
    return st;
}

void dj_lora_release(dj_engine_t *e, dj_lora_t *a) {
    if (e && a) dj_vmu_model_release(e->vmu, a->region);
}

const char *dj_lora_name(const dj_lora_t *a) { return a->name; }
const dj_lora_config *dj_lora_get_config(const dj_lora_t *a) { return &a->cfg; }
uint64_t dj_lora_fingerprint(const dj_lora_t *a) { return a->fingerprint; }
uint64_t dj_lora_base_fingerprint(const dj_lora_t *a) { return a->base_fp; }
uint32_t dj_lora_refcount(const dj_lora_t *a) { return dj_vmu_model_refcount(a->region); }
uint64_t dj__lora_key(const struct dj_lora *a) { return a->fingerprint; }

/* ---- sessions ---- */

dj_status dj_session_set_loras(dj_engine_t *e, dj_session_t *s, dj_lora_t *const *a, const float *scales,
                               uint32_t n) {
    if (!e || !s || (n && !a)) return dj_fail(DJ_EINVAL, "dj_session_set_loras: NULL engine, session or adapters");
    if (n > DJ_LORA_STACK_MAX)
        return dj_fail(DJ_EINVAL, "%u adapters on one session; at most %d", n, DJ_LORA_STACK_MAX);
    if (s->pos || s->pfx_full || s->pfx_n)
        return dj_fail(DJ_EBUSY, "a session's adapter is set before it holds tokens (it is at position %u)", s->pos);
    for (uint32_t i = 0; i < n; i++) {
        if (!a[i]) return dj_fail(DJ_EINVAL, "dj_session_set_loras: adapter %u is NULL", i);
        const float sc = scales ? scales[i] : 1.0f;
        if (!isfinite(sc)) return dj_fail(DJ_EINVAL, "adapter scale %g is not finite", (double)sc);
        if (a[i]->base_fp != s->model_fp)
            return dj_fail(DJ_EINVAL, "adapter %s was loaded for another base than the session's model %s",
                           a[i]->name, s->model->name);
    }
    uint32_t got = 0; /* one more reference on each */
    for (; got < n; got++) {
        dj_vmu_model_t *r = NULL;
        if (dj_vmu_model_lookup(e->vmu, a[got]->fingerprint, &r) != DJ_OK || r != a[got]->region) {
            if (r) dj_vmu_model_release(e->vmu, r);
            break;
        }
    }
    if (got < n) {
        for (uint32_t i = 0; i < got; i++) dj_lora_release(e, a[i]);
        return dj_fail(DJ_ENOTFOUND, "adapter %s is no longer loaded", a[got]->name);
    }
    for (uint32_t i = 0; i < s->n_lora; i++) dj_lora_release(e, s->lora[i]);
    for (uint32_t i = 0; i < n; i++) {
        s->lora[i] = a[i];
        s->lora_scale[i] = scales ? scales[i] : 1.0f;
    }
    s->n_lora = n;
    dj__prefix_root(s, s->pfx_key);
    return DJ_OK;
}

dj_status dj_session_set_lora(dj_engine_t *e, dj_session_t *s, dj_lora_t *a, float use_scale) {
    return dj_session_set_loras(e, s, &a, &use_scale, a ? 1 : 0);
}

const dj_lora_t *dj_session_lora(const dj_session_t *s) { return s && s->n_lora ? s->lora[0] : NULL; }
uint32_t dj_session_lora_count(const dj_session_t *s) { return s ? s->n_lora : 0; }

dj_status dj_session_set_lora_like(dj_engine_t *e, dj_session_t *s, const dj_session_t *like) {
    if (!like) return dj_fail(DJ_EINVAL, "dj_session_set_lora_like: NULL session");
    if (!like->n_lora && !(s && s->n_lora)) return DJ_OK;
    return dj_session_set_loras(e, s, like->lora, like->lora_scale, like->n_lora);
}

/* ---- a step's LORA calls ---- */

dj_status dj__lora_step_prepare(dj__lora_step *ls, dj_session_t *const *ss, const uint32_t *n_tok, uint32_t B,
                                uint32_t rows, size_t max_calls, bool *any) {
    *any = false;
    ls->n = 0;
    ls->levels = 0;
    ls->mats_used = 0;
    if (rows > ls->row_cap) {
        int32_t *p = dj_realloc(ls->row, (size_t)DJ_LORA_STACK_MAX * rows * sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "out of memory for a step's adapter rows");
        ls->row = p;
        ls->row_cap = rows;
    }
    for (uint32_t r = 0; r < B; r++)
        ls->levels = ss[r]->n_lora > ls->levels ? ss[r]->n_lora : ls->levels;
    for (uint32_t lv = 0; lv < ls->levels; lv++) {
        int32_t *lrow = ls->row + (size_t)lv * rows;
        uint32_t row = 0;
        for (uint32_t r = 0; r < B; r++) {
            const dj_session_t *s = ss[r];
            int32_t at = -1;
            if (lv < s->n_lora) {
                const struct dj_lora *ad = s->lora[lv];
                const float sc = s->lora_scale[lv] * ad->cfg.scale;
                for (uint32_t k = 0; k < ls->n && at < 0; k++)
                    if (ls->ad[k] == ad && ls->scale[k] == sc) at = (int32_t)k;
                if (at < 0) {
                    if (ls->n == DJ__LORA_STEP_MAX)
                        return dj_fail(DJ_EINVAL, "a step mixes more than %d adapters", DJ__LORA_STEP_MAX);
                    ls->ad[ls->n] = ad;
                    ls->scale[ls->n] = sc;
                    at = (int32_t)ls->n++;
                }
                *any = true;
            }
            const uint32_t n = n_tok ? n_tok[r] : 1;
            for (uint32_t t = 0; t < n; t++) {
                const uint32_t i = t + 1 == n ? rows - B + r : row++;
                if (i < rows) lrow[i] = at;
            }
        }
    }
    if (!*any) return DJ_OK;
    const size_t need = max_calls * ls->n * ls->levels;
    if (need > ls->mats_cap) {
        dj_lora_mat *p = dj_realloc(ls->mats, need * sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "out of memory for a step's adapter tables");
        ls->mats = p;
        ls->mats_cap = need;
    }
    ls->row_stride = rows;
    return DJ_OK;
}

uint32_t dj__lora_calls(dj__lora_step *ls, int slot, const dj_op_call *mm, dj_op_call *out) {
    if (slot < 0 || ls->mats_used + ls->n > ls->mats_cap) return 0;
    dj_lora_mat *t = ls->mats + ls->mats_used;
    bool some = false;
    for (uint32_t k = 0; k < ls->n; k++) {
        const struct dj_lora *a = ls->ad[k];
        if ((uint32_t)slot < a->n_slots && a->slot[slot].a) {
            t[k] = a->slot[slot];
            t[k].scale = ls->scale[k];
            some = true;
        } else {
            memset(&t[k], 0, sizeof t[k]);
        }
    }
    if (!some) return 0;
    ls->mats_used += ls->n;
    uint32_t n_out = 0;
    for (uint32_t lv = 0; lv < ls->levels; lv++) {
        const int32_t *lrow = ls->row + (size_t)lv * ls->row_stride;
        bool used = false; /* a level whose rows' adapters all leave this projection alone adds no call */
        for (uint32_t i = 0; i < mm->n && !used; i++) used = lrow[i] >= 0 && t[lrow[i]].a;
        if (!used) continue;
        dj_op_call *c = &out[n_out++];
        memset(c, 0, sizeof *c);
        c->op = DJ_OP_LORA;
        c->n = mm->n;
        c->out = mm->out;
        c->out_dtype = mm->out_dtype;
        c->x = mm->x;
        c->x_dtype = mm->x_dtype;
        c->k = mm->k;
        c->m = mm->m;
        c->lora = t;
        c->n_lora = ls->n;
        c->lora_row = lrow;
    }
    return n_out;
}

void dj__lora_step_free(dj__lora_step *ls) {
    if (!ls) return;
    free(ls->row);
    free(ls->mats);
    free(ls);
}
