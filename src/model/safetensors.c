/* safetensors.c: validation of one safetensors header (the JSON between the
 * 8-byte length and the data area) into tensor descriptions, plus the small
 * JSON helpers the config and checkpoint readers share. */
#include <stdlib.h>
#include <string.h>

#include "djinn/checkpoint.h"
#include "model/checkpoint_impl.h"

/* ---- JSON helpers ---- */

const char *dj__json_type_name(const cJSON *item) {
    if (!item) return "missing";
    switch (item->type & 0xff) {
    case cJSON_NULL: return "null";
    case cJSON_False:
    case cJSON_True: return "boolean";
    case cJSON_Number: return "number";
    case cJSON_String: return "string";
    case cJSON_Array: return "array";
    case cJSON_Object: return "object";
    case cJSON_Raw: return "raw";
    default: return "invalid";
    }
}

const cJSON *dj__json_member(const cJSON *obj, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsNull(it) ? NULL : it;
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

dj_status dj__json_find_duplicate_key(const cJSON *obj, const char **dup) {
    *dup = NULL;
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next) n++;
    if (n < 2) return DJ_OK;
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) return dj_fail(DJ_ENOMEM, "no memory for %zu JSON keys", n);
    size_t i = 0;
    for (const cJSON *c = obj->child; c; c = c->next) keys[i++] = c->string ? c->string : "";
    qsort(keys, n, sizeof *keys, cmp_str_ptr);
    for (i = 1; i < n; i++) {
        if (!strcmp(keys[i - 1], keys[i])) {
            *dup = keys[i];
            break;
        }
    }
    free(keys);
    return DJ_OK;
}

bool dj__json_get_uint(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return false;
    double d = item->valuedouble;
    if (!(d >= 0.0 && d < DJ__JSON_MAX_EXACT_INT)) return false;
    uint64_t u = (uint64_t)d;
    if ((double)u != d) return false;
    *out = u;
    return true;
}

static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

cJSON *dj__json_parse(const char *json, size_t len, size_t *err_pos) {
    *err_pos = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root) {
        *err_pos = end && end >= json ? (size_t)(end - json) : 0;
        return NULL;
    }
    size_t off = (size_t)(end - json);
    while (off < len && is_json_space(json[off])) off++;
    if (off < len) {
        cJSON_Delete(root);
        *err_pos = off;
        return NULL;
    }
    return root;
}

/* ---- safetensors ---- */

/* Every dtype name the safetensors format defines; only some map to ours. */
typedef struct {
    const char *name;
    bool supported;
    dj_dtype dtype;
} st_dtype;

static const st_dtype st_dtypes[] = {
    {"F32", true, DJ_DTYPE_F32},        {"F16", true, DJ_DTYPE_F16},
    {"BF16", true, DJ_DTYPE_BF16},      {"F64", false, DJ_DTYPE_COUNT},
    {"I64", false, DJ_DTYPE_COUNT},     {"I32", true, DJ_DTYPE_I32}, /* AWQ/GPTQ parts */
    {"I16", false, DJ_DTYPE_COUNT},     {"I8", false, DJ_DTYPE_COUNT},
    {"U64", false, DJ_DTYPE_COUNT},     {"U32", false, DJ_DTYPE_COUNT},
    {"U16", false, DJ_DTYPE_COUNT},     {"U8", false, DJ_DTYPE_COUNT},
    {"BOOL", false, DJ_DTYPE_COUNT},    {"F8_E4M3", true, DJ_DTYPE_F8_E4M3},
    {"F8_E5M2", false, DJ_DTYPE_COUNT}, {"F8_E8M0", false, DJ_DTYPE_COUNT},
    {"F6_E2M3", false, DJ_DTYPE_COUNT}, {"F6_E3M2", false, DJ_DTYPE_COUNT},
    {"F4", false, DJ_DTYPE_COUNT},      {"C64", false, DJ_DTYPE_COUNT},
};

/* A tensor's byte range in the data area, for the overlap check. */
typedef struct {
    uint64_t begin, end;
    const char *name;
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int cmp_info_name(const void *a, const void *b) {
    return strcmp(((const dj_tensor_info *)a)->name, ((const dj_tensor_info *)b)->name);
}

static dj_status parse_metadata(const cJSON *meta) {
    if (!cJSON_IsObject(meta))
        return dj_fail(DJ_EFORMAT, "\"__metadata__\" is a JSON %s, expected an object",
                       dj__json_type_name(meta));
    for (const cJSON *c = meta->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return dj_fail(DJ_EFORMAT, "\"__metadata__\" key \"%s\" is a JSON %s, expected a string",
                           c->string, dj__json_type_name(c));
    }
    return DJ_OK;
}

static dj_status parse_dtype(const char *tname, const cJSON *it, dj_dtype *out) {
    if (!cJSON_IsString(it))
        return dj_fail(DJ_EFORMAT, "tensor \"%s\": \"dtype\" is a JSON %s, expected a string", tname,
                       dj__json_type_name(it));
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(st_dtypes[i].name, it->valuestring)) continue;
        if (!st_dtypes[i].supported)
            return dj_fail(DJ_EUNSUPPORTED,
                           "tensor \"%s\" has dtype %s, which Djinn does not support (F32, F16, BF16, F8_E4M3; I32 for 4-bit parts)",
                           tname, it->valuestring);
        *out = st_dtypes[i].dtype;
        return DJ_OK;
    }
    return dj_fail(DJ_EFORMAT, "tensor \"%s\" has unknown dtype \"%.64s\"", tname, it->valuestring);
}

static dj_status parse_shape(const char *tname, const cJSON *it, dj_tensor_info *ti) {
    if (!cJSON_IsArray(it))
        return dj_fail(DJ_EFORMAT, "tensor \"%s\": \"shape\" is a JSON %s, expected an array", tname,
                       dj__json_type_name(it));
    int nd = cJSON_GetArraySize(it);
    if (nd > DJ_TENSOR_MAX_DIMS)
        return dj_fail(DJ_EUNSUPPORTED, "tensor \"%s\" has %d dimensions, at most %d are supported", tname,
                       nd, DJ_TENSOR_MAX_DIMS);
    int d = 0;
    for (const cJSON *c = it->child; c; c = c->next, d++) {
        uint64_t v;
        if (!dj__json_get_uint(c, &v))
            return dj_fail(DJ_EFORMAT, "tensor \"%s\": shape[%d] is not a non-negative integer", tname, d);
        ti->shape[d] = (int64_t)v;
    }
    ti->ndim = nd;
    return DJ_OK;
}

static dj_status parse_offsets(const char *tname, const cJSON *it, uint64_t *begin, uint64_t *end) {
    if (!cJSON_IsArray(it) || cJSON_GetArraySize(it) != 2 || !dj__json_get_uint(it->child, begin) ||
        !dj__json_get_uint(it->child->next, end))
        return dj_fail(DJ_EFORMAT,
                       "tensor \"%s\": \"data_offsets\" must be an array of two non-negative integers",
                       tname);
    return DJ_OK;
}

/* Fills ti (name excepted) from one header entry; its byte range goes to r. */
static dj_status parse_entry(const cJSON *e, size_t data_len, dj_tensor_info *ti, st_range *r) {
    const char *tname = e->string;
    if (!cJSON_IsObject(e))
        return dj_fail(DJ_EFORMAT, "tensor \"%s\": entry is a JSON %s, expected an object", tname,
                       dj__json_type_name(e));
    const cJSON *f_dtype = NULL, *f_shape = NULL, *f_off = NULL;
    for (const cJSON *c = e->child; c; c = c->next) {
        const cJSON **slot = !strcmp(c->string, "dtype")          ? &f_dtype
                             : !strcmp(c->string, "shape")        ? &f_shape
                             : !strcmp(c->string, "data_offsets") ? &f_off
                                                                  : NULL;
        if (!slot)
            return dj_fail(DJ_EFORMAT, "tensor \"%s\" has unexpected key \"%.64s\"", tname, c->string);
        if (*slot) return dj_fail(DJ_EFORMAT, "tensor \"%s\" has key \"%s\" twice", tname, c->string);
        *slot = c;
    }
    if (!f_dtype) return dj_fail(DJ_EFORMAT, "tensor \"%s\" has no \"dtype\"", tname);
    if (!f_shape) return dj_fail(DJ_EFORMAT, "tensor \"%s\" has no \"shape\"", tname);
    if (!f_off) return dj_fail(DJ_EFORMAT, "tensor \"%s\" has no \"data_offsets\"", tname);

    dj_status st = parse_dtype(tname, f_dtype, &ti->dtype);
    if (st) return st;
    if ((st = parse_shape(tname, f_shape, ti))) return st;
    uint64_t begin = 0, end = 0;
    if ((st = parse_offsets(tname, f_off, &begin, &end))) return st;

    /* Element count; a zero dimension makes it 0 whatever the others say. */
    uint64_t count = 1;
    bool overflow = false;
    for (int d = 0; d < ti->ndim; d++) {
        uint64_t v = (uint64_t)ti->shape[d];
        if (v == 0) {
            count = 0;
            overflow = false;
            break;
        }
        if (count > UINT64_MAX / v) overflow = true;
        else count *= v;
    }
    uint64_t esize = dj_dtype_size(ti->dtype);
    if (overflow || count > UINT64_MAX / esize)
        return dj_fail(DJ_EFORMAT, "tensor \"%s\": shape is too large (byte size overflows)", tname);
    uint64_t nbytes = count * esize;
    if (begin > end)
        return dj_fail(DJ_EFORMAT, "tensor \"%s\": data_offsets [%llu, %llu] end before they begin", tname,
                       (unsigned long long)begin, (unsigned long long)end);
    if (end > data_len)
        return dj_fail(DJ_EFORMAT, "tensor \"%s\": data_offsets [%llu, %llu] exceed the data area of %zu bytes",
                       tname, (unsigned long long)begin, (unsigned long long)end, data_len);
    if (end - begin != nbytes)
        return dj_fail(DJ_EFORMAT,
                       "tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes but %llu elements of %s need %llu",
                       tname, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin), (unsigned long long)count, f_dtype->valuestring,
                       (unsigned long long)nbytes);
    ti->data = (const void *)(uintptr_t)begin;
    ti->nbytes = (size_t)nbytes;
    r->begin = begin;
    r->end = end;
    return DJ_OK;
}

dj_status dj_safetensors_parse_header(const char *json, size_t json_len, size_t data_len,
                                      dj_tensor_info **out, size_t *n_out) {
    if (!out || !n_out || (!json && json_len)) return dj_fail(DJ_EINVAL, "safetensors: NULL argument");
    *out = NULL;
    *n_out = 0;
    dj_status st = DJ_OK;
    dj_tensor_info *infos = NULL;
    st_range *ranges = NULL;
    size_t n = 0;

    size_t err_pos;
    cJSON *root = dj__json_parse(json, json_len, &err_pos);
    if (!root) return dj_fail(DJ_EFORMAT, "header is not valid JSON (error at byte %zu)", err_pos);
    if (!cJSON_IsObject(root)) {
        st = dj_fail(DJ_EFORMAT, "header is a JSON %s, expected an object", dj__json_type_name(root));
        goto fail;
    }
    const char *dup;
    if ((st = dj__json_find_duplicate_key(root, &dup))) goto fail;
    if (dup) {
        st = dj_fail(DJ_EFORMAT, "header names tensor \"%s\" twice", dup);
        goto fail;
    }

    size_t cap = 0;
    for (const cJSON *c = root->child; c; c = c->next) cap++;
    infos = calloc(cap ? cap : 1, sizeof *infos);
    ranges = calloc(cap ? cap : 1, sizeof *ranges);
    if (!infos || !ranges) {
        st = dj_fail(DJ_ENOMEM, "no memory for %zu tensor descriptions", cap);
        goto fail;
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        if (!strcmp(c->string, "__metadata__")) {
            if ((st = parse_metadata(c))) goto fail;
            continue;
        }
        dj_tensor_info *ti = &infos[n];
        if ((st = parse_entry(c, data_len, ti, &ranges[n]))) goto fail;
        if (!(ti->name = strdup(c->string))) {
            st = dj_fail(DJ_ENOMEM, "no memory for tensor name");
            goto fail;
        }
        ranges[n].name = ti->name;
        n++;
    }

    /* Overlap: sorted by begin, each range that holds bytes must start at or
     * after the end of the previous one that does. */
    qsort(ranges, n, sizeof *ranges, cmp_range);
    const st_range *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        if (ranges[i].begin == ranges[i].end) continue;
        if (prev && ranges[i].begin < prev->end) {
            st = dj_fail(DJ_EFORMAT, "tensors \"%s\" [%llu, %llu] and \"%s\" [%llu, %llu] overlap", prev->name,
                         (unsigned long long)prev->begin, (unsigned long long)prev->end, ranges[i].name,
                         (unsigned long long)ranges[i].begin, (unsigned long long)ranges[i].end);
            goto fail;
        }
        prev = &ranges[i];
    }
    qsort(infos, n, sizeof *infos, cmp_info_name);

    free(ranges);
    cJSON_Delete(root);
    *out = infos;
    *n_out = n;
    return DJ_OK;

fail:
    dj_safetensors_free_infos(infos, n);
    free(ranges);
    cJSON_Delete(root);
    return st;
}

void dj_safetensors_free_infos(dj_tensor_info *infos, size_t n) {
    if (!infos) return;
    for (size_t i = 0; i < n; i++) free((char *)infos[i].name);
    free(infos);
}
