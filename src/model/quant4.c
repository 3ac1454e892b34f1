/* quant4.c: 4-bit weights as AWQ and GPTQ store them in HF dirs, checked
 * against config.json's quantization_config and repacked at open into
 * DJ_DTYPE_Q4 (djinn/dtype.h: rows, or 16-row bands where N % 16 == 0) that
 * every backend reads.
 *
 * Stored layouts (K in features, N out features, G = 128 the group):
 *  GPTQ (checkpoint_format "gptq", the v1 format every HF release uses):
 *    qweight [K/8][N] i32: word (i, n) holds k = 8i+t in bits 4t..4t+3;
 *    qzeros [K/G][N/8] i32: word (g, j) holds out feature 8j+t in bits 4t;
 *    the zero point is the stored value + 1; scales [K/G][N] f16;
 *    g_idx [K] i32 must be k/G (desc_act false).
 *  AWQ (version "gemm"): qweight [K][N/8] i32 and qzeros [K/G][N/8] i32,
 *    word (r, j) holding out feature 8j + c in bits 4*dj_q4_nibble(c) (AutoAWQ
 *    packs columns 0,2,4,6,1,3,5,7 into nibbles 0..7); scales [K/G][N] f16;
 *    the zero point is the stored value.
 *  Both: w[n][k] = (code - zero) * scale. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "model/checkpoint_impl.h"
#include "model/checkpoint_table.h"

typedef enum { Q4_AWQ, Q4_GPTQ } q4_kind;

/* The nibble of an AWQ word that holds column c of its 8 is dj_q4_nibble(c):
 * AutoAWQ's interleave is the one DJ_DTYPE_Q4 stores its codes in (along k). */

static const char SUPPORTED[] =
    "Djinn reads quant_method awq (bits 4, group_size 128, zero_point true, version gemm) and gptq (bits 4, "
    "group_size 128, desc_act false, checkpoint_format gptq)";

static dj_status get_int(const char *dir, const cJSON *qc, const char *key, const char *alt, long def, long *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(qc, key);
    if (!it && alt) it = cJSON_GetObjectItemCaseSensitive(qc, alt);
    if (!it || cJSON_IsNull(it)) {
        *out = def;
        return DJ_OK;
    }
    if (!cJSON_IsNumber(it) || it->valuedouble != (double)(long)it->valuedouble)
        return dj_fail(DJ_EFORMAT, "%s: quantization_config.%s is a JSON %s, expected an integer", dir, key,
                       dj__json_type_name(it));
    *out = (long)it->valuedouble;
    return DJ_OK;
}

static dj_status get_bool(const char *dir, const cJSON *qc, const char *key, bool def, bool *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(qc, key);
    if (!it || cJSON_IsNull(it)) {
        *out = def;
        return DJ_OK;
    }
    if (!cJSON_IsBool(it))
        return dj_fail(DJ_EFORMAT, "%s: quantization_config.%s is a JSON %s, expected true or false", dir, key,
                       dj__json_type_name(it));
    *out = cJSON_IsTrue(it);
    return DJ_OK;
}

static const char *get_str(const cJSON *qc, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(qc, key);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* The config's quantization: *kind, or an error naming what is refused. */
static dj_status read_config(const char *dir, const cJSON *qc, q4_kind *kind) {
    if (!cJSON_IsObject(qc))
        return dj_fail(DJ_EFORMAT, "%s: quantization_config is a JSON %s, expected an object", dir,
                       dj__json_type_name(qc));
    const char *method = get_str(qc, "quant_method");
    if (!method) return dj_fail(DJ_EFORMAT, "%s: quantization_config has no \"quant_method\" string", dir);
    dj_status st;
    long bits, group;
    if (!strcmp(method, "awq")) {
        *kind = Q4_AWQ;
        bool zp = true;
        if ((st = get_int(dir, qc, "bits", "w_bit", 4, &bits)) || (st = get_int(dir, qc, "group_size", "q_group_size", 128, &group)) ||
            (st = get_bool(dir, qc, "zero_point", true, &zp)))
            return st;
        const char *ver = get_str(qc, "version");
        if (ver && strcasecmp(ver, "gemm"))
            return dj_fail(DJ_EUNSUPPORTED, "%s: awq version \"%.32s\" is not supported (%s)", dir, ver, SUPPORTED);
        if (!zp) return dj_fail(DJ_EUNSUPPORTED, "%s: awq zero_point false is not supported (%s)", dir, SUPPORTED);
    } else if (!strcmp(method, "gptq")) {
        *kind = Q4_GPTQ;
        bool act = false;
        if ((st = get_int(dir, qc, "bits", NULL, 4, &bits)) || (st = get_int(dir, qc, "group_size", NULL, 128, &group)) ||
            (st = get_bool(dir, qc, "desc_act", false, &act)))
            return st;
        const char *fmt = get_str(qc, "checkpoint_format");
        if (fmt && strcmp(fmt, "gptq"))
            return dj_fail(DJ_EUNSUPPORTED, "%s: gptq checkpoint_format \"%.32s\" is not supported (%s)", dir, fmt,
                           SUPPORTED);
        if (act) return dj_fail(DJ_EUNSUPPORTED, "%s: gptq desc_act true is not supported (%s)", dir, SUPPORTED);
    } else {
        return dj_fail(DJ_EUNSUPPORTED, "%s: quantization_config.quant_method \"%.64s\" is not supported (%s)", dir,
                       method, SUPPORTED);
    }
    if (bits != 4)
        return dj_fail(DJ_EUNSUPPORTED, "%s: %s bits %ld is not supported (%s)", dir, method, bits, SUPPORTED);
    if (group != DJ_Q4_GROUP)
        return dj_fail(DJ_EUNSUPPORTED, "%s: %s group_size %ld is not supported (%s)", dir, method, group, SUPPORTED);
    return DJ_OK;
}

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static bool is_part(const char *name) {
    return ends_with(name, ".qweight") || ends_with(name, ".qzeros") || ends_with(name, ".scales") ||
           ends_with(name, ".g_idx");
}

/* p + suffix's tensor, checked to be dtype dt with ndim dims; NULL after an error. */
static const dj_tensor_info *part(const dj_checkpoint_t *ck, const char *dir, const char *p, const char *suffix,
                                  dj_dtype dt, int ndim, dj_status *st) {
    char nm[280];
    snprintf(nm, sizeof nm, "%s%s", p, suffix);
    const dj_tensor_info *t = dj_checkpoint_find(ck, nm);
    if (!t) {
        *st = dj_fail(DJ_EFORMAT, "%s: 4-bit weight %s.qweight has no %s", dir, p, nm);
        return NULL;
    }
    if (t->dtype != dt || t->ndim != ndim) {
        *st = dj_fail(DJ_EFORMAT, "%s: tensor %s has dtype %s and %d dimensions, expected %s with %d", dir, nm,
                      dj_dtype_name(t->dtype), t->ndim, dj_dtype_name(dt), ndim);
        return NULL;
    }
    return t;
}

static uint32_t rd32(const void *base, size_t i) {
    uint32_t v;
    memcpy(&v, (const uint8_t *)base + 4 * i, 4); /* the mapping is only as aligned as the file */
    return v;
}

static uint16_t rd16(const void *base, size_t i) {
    uint16_t v;
    memcpy(&v, (const uint8_t *)base + 2 * i, 2);
    return v;
}

/* One quantized linear p: its parts checked and repacked into *out. */
static dj_status repack(const dj_checkpoint_t *ck, const char *dir, q4_kind kind, const char *p,
                        dj_tensor_info *out /* OUT */) {
    dj_status st = DJ_OK;
    const dj_tensor_info *qw = part(ck, dir, p, ".qweight", DJ_DTYPE_I32, 2, &st);
    const dj_tensor_info *qz = qw ? part(ck, dir, p, ".qzeros", DJ_DTYPE_I32, 2, &st) : NULL;
    const dj_tensor_info *sc = qz ? part(ck, dir, p, ".scales", DJ_DTYPE_F16, 2, &st) : NULL;
    if (!sc) return st;
    const int64_t N = sc->shape[1], K = kind == Q4_GPTQ ? qw->shape[0] * 8 : qw->shape[0];
    const int64_t ng = K / DJ_Q4_GROUP;
    bool ok = N > 0 && K > 0 && N % 8 == 0 && K % DJ_Q4_GROUP == 0 && sc->shape[0] == ng && qz->shape[0] == ng &&
              qz->shape[1] == N / 8 && (kind == Q4_GPTQ ? qw->shape[1] == N : qw->shape[1] * 8 == N) &&
              K <= (int64_t)1 << 30 && N <= (int64_t)1 << 30;
    if (!ok)
        return dj_fail(DJ_EFORMAT,
                       "%s: %s: qweight [%lld,%lld], qzeros [%lld,%lld], scales [%lld,%lld] do not describe a %s "
                       "4-bit matrix with groups of %d (in features a multiple of 128, out features of 8)",
                       dir, p, (long long)qw->shape[0], (long long)qw->shape[1], (long long)qz->shape[0],
                       (long long)qz->shape[1], (long long)sc->shape[0], (long long)sc->shape[1],
                       kind == Q4_GPTQ ? "gptq" : "awq", DJ_Q4_GROUP);
    if (kind == Q4_GPTQ) {
        char nm[280];
        snprintf(nm, sizeof nm, "%s.g_idx", p);
        if (dj_checkpoint_find(ck, nm)) {
            const dj_tensor_info *gi = part(ck, dir, p, ".g_idx", DJ_DTYPE_I32, 1, &st);
            if (!gi) return st;
            if (gi->shape[0] != K)
                return dj_fail(DJ_EFORMAT, "%s: %s has %lld entries, expected %lld", dir, nm, (long long)gi->shape[0],
                               (long long)K);
            for (int64_t k = 0; k < K; k++)
                if ((int64_t)(int32_t)rd32(gi->data, (size_t)k) != k / DJ_Q4_GROUP)
                    return dj_fail(DJ_EUNSUPPORTED,
                                   "%s: %s[%lld] is %d, not %lld: an activation-order (desc_act) layout, which is "
                                   "not supported (%s)",
                                   dir, nm, (long long)k, (int)(int32_t)rd32(gi->data, (size_t)k),
                                   (long long)(k / DJ_Q4_GROUP), SUPPORTED);
        }
    }
    const size_t rb = dj_dtype_row_bytes(DJ_DTYPE_Q4, (size_t)K);
    uint8_t *buf = malloc((size_t)N * rb);
    char *name = malloc(strlen(p) + sizeof ".weight");
    if (!buf || !name) {
        free(buf);
        free(name);
        return dj_fail(DJ_ENOMEM, "%s: no memory to repack %s (%lld x %lld)", dir, p, (long long)N, (long long)K);
    }
    sprintf(name, "%s.weight", p);
    const int64_t nj = N / 8, kw = K / 8;
    /* Out features in blocks of 8 * JB (each thread a block): AWQ's words of
     * one stored row are then read JB at a time, a cache line. A block is
     * whole bands where N % 16 == 0 (djinn/dtype.h), so threads write apart. */
    enum { JB = 16 };
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t jb = 0; jb < nj; jb += JB) {
        const int64_t je = jb + JB < nj ? jb + JB : nj;
        for (int64_t j = jb; j < je; j++)
            for (int c = 0; c < 8; c++) { /* scales and zero points of out feature 8j + c */
                const int64_t n = 8 * j + c;
                const int zs = kind == Q4_AWQ ? 4 * (int)dj_q4_nibble((unsigned)c) : 4 * c;
                for (int64_t g = 0; g < ng; g++) {
                    const unsigned z = ((rd32(qz->data, (size_t)(g * nj + j)) >> zs) & 15u) + (kind == Q4_GPTQ);
                    const uint16_t sv = rd16(sc->data, (size_t)(g * N + n)), zh = dj_f32_to_f16((float)z);
                    memcpy(buf + dj_q4_scale_at((size_t)N, (size_t)K, (size_t)n, (size_t)g), &sv, 2);
                    memcpy(buf + dj_q4_zero_at((size_t)N, (size_t)K, (size_t)n, (size_t)g), &zh, 2);
                }
            }
        for (int64_t i = 0; i < kw; i++) { /* columns 8i..8i+7 of every row of the block */
            for (int64_t j = jb; j < je; j++) {
                uint32_t w[8] = {0};
                if (kind == Q4_GPTQ) { /* the stored word (i, n) holds column 8i + t of row n in nibble t */
                    for (int c = 0; c < 8; c++) {
                        const uint32_t v = rd32(qw->data, (size_t)(i * N + 8 * j + c));
                        for (unsigned t = 0; t < 8; t++) w[c] |= ((v >> (4 * t)) & 15u) << (4 * dj_q4_nibble(t));
                    }
                } else { /* word (8i + t, j) holds column 8i + t of the 8 rows, row 8j + c in nibble dj_q4_nibble(c) */
                    for (unsigned t = 0; t < 8; t++) {
                        const uint32_t v = rd32(qw->data, (size_t)((8 * i + t) * nj + j));
                        for (unsigned c = 0; c < 8; c++)
                            w[c] |= ((v >> (4 * dj_q4_nibble(c))) & 15u) << (4 * dj_q4_nibble(t));
                    }
                }
                for (int c = 0; c < 8; c++) /* word i % 16 of the row's group i / 16 */
                    memcpy(buf + dj_q4_codes_at((size_t)N, (size_t)K, (size_t)(8 * j + c), (size_t)(i / 16)) +
                               4 * (size_t)(i % 16),
                           &w[c], 4);
            }
        }
    }
    *out = (dj_tensor_info){.name = name, .dtype = DJ_DTYPE_Q4, .ndim = 2, .shape = {N, K}, .data = buf,
                            .nbytes = (size_t)N * rb};
    return DJ_OK;
}

dj_status dj__quant_open(const char *dir, const char *text, size_t len, dj_checkpoint_t *ck) {
    size_t err_pos;
    cJSON *root = dj__json_parse(text, len, &err_pos);
    if (!root) return dj_fail(DJ_EFORMAT, "%s/config.json: not valid JSON (error at byte %zu)", dir, err_pos);
    const cJSON *qc = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    dj_status st = DJ_OK;
    dj_tensor_info *add = NULL;
    size_t n_add = 0;
    q4_kind kind = Q4_AWQ;
    const dj_quant_method qm = dj_checkpoint_config(ck)->quant;
    if (!qc || cJSON_IsNull(qc) || (qm != DJ_QUANT_AWQ && qm != DJ_QUANT_GPTQ)) goto done; /* fp8: src/model/quant.c */
    if ((st = read_config(dir, qc, &kind))) goto done;
    const size_t n = dj_checkpoint_tensor_count(ck);
    for (size_t i = 0; i < n; i++)
        if (ends_with(dj_checkpoint_tensor(ck, i)->name, ".qweight")) n_add++;
    if (!(add = calloc(n_add ? n_add : 1, sizeof *add))) {
        st = dj_fail(DJ_ENOMEM, "%s: no memory for %zu 4-bit tensors", dir, n_add);
        goto done;
    }
    size_t made = 0;
    for (size_t i = 0; i < n && st == DJ_OK; i++) {
        const char *nm = dj_checkpoint_tensor(ck, i)->name;
        if (!ends_with(nm, ".qweight")) continue;
        const size_t plen = strlen(nm) - strlen(".qweight");
        char p[256];
        if (plen >= sizeof p) {
            st = dj_fail(DJ_EFORMAT, "%s: tensor name %.64s... is too long", dir, nm);
            break;
        }
        memcpy(p, nm, plen);
        p[plen] = '\0';
        if ((st = repack(ck, dir, kind, p, &add[made])) == DJ_OK) made++;
    }
    if (st != DJ_OK) {
        for (size_t i = 0; i < made; i++) {
            free((char *)add[i].name);
            free((void *)add[i].data);
        }
        goto done;
    }
    st = dj__checkpoint_edit(ck, add, made, is_part);
    if (st) {
        char why[512];
        snprintf(why, sizeof why, "%s", dj_last_error());
        st = dj_fail(st, "%s: %s", dir, why);
    }
done:
    free(add);
    cJSON_Delete(root);
    return st;
}
