/* test_quant4.c: 4-bit checkpoints (AWQ gemm, GPTQ v1) - parts hand-packed
 * here from known codes, zero points and scales (the layouts as AutoAWQ and
 * AutoGPTQ write them) repack into the DJ_DTYPE_Q4 values (code - zero) *
 * scale exactly, in rows (N % 16 != 0) and in 16-row bands (N % 16 == 0);
 * djinn/dtype.h's offset helpers agree with the layout it describes; the CPU
 * matmul on them equals the dense product; every refused quantization config
 * and malformed part is an error naming it, as is a fused tensor's 4-bit part
 * that is not whole bands. (The whole models against a torch reference:
 * test_models, llama_awq and llama_gptq.) */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djinn/backend.h"
#include "djinn/checkpoint.h"
#include "djinn/engine.h"
#include "testutil.h"

#define NMAX 144 /* out features, at most */
#define K 256   /* in features: two groups */
#define NG (K / DJ_Q4_GROUP)

static int N = 24; /* out features of the matrix at hand (a multiple of 8) */

static char base_dir[256];
static int case_no;

static const int AWQ_ORDER[8] = {0, 2, 4, 6, 1, 3, 5, 7}; /* nibble i holds column AWQ_ORDER[i] */

/* The matrix the parts describe. */
static uint8_t codes[NMAX][K];
static uint8_t zeros[NG][NMAX];     /* 1..15 (GPTQ v1 stores zero - 1) */
static uint16_t scales[NG * NMAX];  /* f16 [NG][N] as stored */

typedef struct {
    const char *name, *dtype;
    int ndim;
    int64_t shape[2];
    const void *data;
    size_t nbytes;
} part;

static void write_file(const char *dir, const char *file, const void *buf, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(buf, 1, n, f) != n)) {
        perror(path);
        exit(2);
    }
    fclose(f);
}

static void write_st(const char *dir, const part *ps, int n) {
    char header[4096];
    size_t hl = 0, off = 0;
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "{");
    for (int i = 0; i < n; i++) {
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld",
                               i ? "," : "", ps[i].name, ps[i].dtype, (long long)ps[i].shape[0]);
        if (ps[i].ndim == 2) hl += (size_t)snprintf(header + hl, sizeof header - hl, ",%lld", (long long)ps[i].shape[1]);
        hl += (size_t)snprintf(header + hl, sizeof header - hl, "],\"data_offsets\":[%zu,%zu]}", off,
                               off + ps[i].nbytes);
        off += ps[i].nbytes;
    }
    hl += (size_t)snprintf(header + hl, sizeof header - hl, "}");
    while (hl % 8) header[hl++] = ' ';
    uint8_t *buf = malloc(8 + hl + off);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    off = 8 + hl;
    for (int i = 0; i < n; i++) {
        memcpy(buf + off, ps[i].data, ps[i].nbytes);
        off += ps[i].nbytes;
    }
    write_file(dir, "model.safetensors", buf, off);
    free(buf);
}

static const char *CFG_HEAD =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 8,"
    " \"hidden_size\": 4, \"intermediate_size\": 16, \"num_hidden_layers\": 1,"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"max_position_embeddings\": 128,"
    " \"rms_norm_eps\": 1e-05, \"torch_dtype\": \"float16\"";

static void write_cfg(const char *dir, const char *quant) {
    char text[2048];
    snprintf(text, sizeof text, "%s%s%s}", CFG_HEAD, quant ? ", \"quantization_config\": " : "", quant ? quant : "");
    write_file(dir, "config.json", text, strlen(text));
}

static const char *new_dir(void) {
    static char buf[300];
    snprintf(buf, sizeof buf, "%s/case%d", base_dir, case_no++);
    if (mkdir(buf, 0700) != 0) {
        perror(buf);
        exit(2);
    }
    return buf;
}

static void random_matrix(void) {
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) codes[n][k] = (uint8_t)(dj_test_rand() % 16u);
    for (int g = 0; g < NG; g++)
        for (int n = 0; n < N; n++) {
            zeros[g][n] = (uint8_t)(1 + dj_test_rand() % 15u);
            scales[g * N + n] = dj_f32_to_f16(dj_test_randf(0.001f, 0.1f));
        }
}

/* GPTQ: qweight [K/8][N] along the input, qzeros [K/G][N/8] along the output (zero - 1). */
static uint32_t g_qw[K / 8 * NMAX], g_qz[NG * NMAX / 8];
static int32_t g_idx[K];
#define G_QW_BYTES ((size_t)K / 8 * N * 4)
#define QZ_BYTES ((size_t)NG * N / 8 * 4) /* GPTQ's and AWQ's qzeros */
#define SCALE_BYTES ((size_t)NG * N * 2)
static void pack_gptq(void) {
    memset(g_qw, 0, sizeof g_qw);
    memset(g_qz, 0, sizeof g_qz);
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) g_qw[k / 8 * N + n] |= (uint32_t)codes[n][k] << (4 * (k % 8));
    for (int g = 0; g < NG; g++)
        for (int n = 0; n < N; n++) g_qz[g * N / 8 + n / 8] |= (uint32_t)(zeros[g][n] - 1) << (4 * (n % 8));
    for (int k = 0; k < K; k++) g_idx[k] = k / DJ_Q4_GROUP;
}

/* AWQ: qweight [K][N/8] and qzeros [K/G][N/8], columns in AWQ_ORDER. */
static uint32_t a_qw[K * NMAX / 8], a_qz[NG * NMAX / 8];
#define A_QW_BYTES ((size_t)K * N / 8 * 4)
static void pack_awq(void) {
    memset(a_qw, 0, sizeof a_qw);
    memset(a_qz, 0, sizeof a_qz);
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N / 8; j++)
            for (int i = 0; i < 8; i++) a_qw[k * N / 8 + j] |= (uint32_t)codes[8 * j + AWQ_ORDER[i]][k] << (4 * i);
    for (int g = 0; g < NG; g++)
        for (int j = 0; j < N / 8; j++)
            for (int i = 0; i < 8; i++) a_qz[g * N / 8 + j] |= (uint32_t)zeros[g][8 * j + AWQ_ORDER[i]] << (4 * i);
}

static float want(int n, int k) {
    const int g = k / DJ_Q4_GROUP;
    return ((float)codes[n][k] - (float)zeros[g][n]) * dj_f16_to_f32(scales[g * N + n]);
}

/* Where value (n, k)'s code byte, scale and zero point lie in a DJ_DTYPE_Q4
 * matrix of m rows and k columns, as djinn/dtype.h's comment describes the
 * layout (written out here from the comment, not through its helpers). */
typedef struct {
    size_t code, scale, zero;
    int high; /* the code in the byte's high nibble */
} q4_place;
static q4_place q4_spec(size_t m, size_t cols, size_t n, size_t k) {
    const size_t rb = dj_dtype_row_bytes(DJ_DTYPE_Q4, cols), ng = cols / DJ_Q4_GROUP, g = k / DJ_Q4_GROUP;
    /* within a 32-bit word of 8 columns: even columns in nibbles 0..3, odd ones in 4..7 */
    const size_t cw = k % 8, nib = cw / 2 + 4 * (cw % 2), in_word = nib / 2;
    if (m % 16) {
        const size_t row = n * rb;
        return (q4_place){row + k / 8 * 4 + in_word, row + cols / 2 + 2 * g, row + cols / 2 + 2 * ng + 2 * g,
                          (int)(nib % 2)};
    }
    const size_t band = n / 16 * 16 * rb, r = n % 16, h = r / 8, r8 = r % 8, c = k % DJ_Q4_GROUP, t = c / 32;
    const size_t meta = band + 1024 * ng + 64 * g + 4 * r;
    return (q4_place){band + 1024 * g + 16 * (32 * h + 4 * r8 + t) + (c % 32) / 8 * 4 + in_word, meta, meta + 2,
                      (int)(nib % 2)};
}

/* Value (n, k) of the DJ_DTYPE_Q4 matrix w of N rows and K columns. */
static float q4_at(const uint8_t *w, int n, int k) {
    const q4_place p = q4_spec((size_t)N, K, (size_t)n, (size_t)k);
    const int code = p.high ? w[p.code] >> 4 : w[p.code] & 15;
    uint16_t s, z;
    memcpy(&s, w + p.scale, 2);
    memcpy(&z, w + p.zero, 2);
    return ((float)code - dj_f16_to_f32(z)) * dj_f16_to_f32(s);
}

/* seen[off .. off + len) += 1, what lies within bytes. */
static void mark(uint8_t *seen, size_t bytes, size_t off, size_t len) {
    for (size_t i = off; i < off + len && i < bytes; i++) seen[i]++;
}

/* dj_q4_codes_at / _scale_at / _zero_at against q4_spec for every row and
 * group of m x cols matrices, and each byte of a matrix placed exactly once. */
static void test_offsets(void) {
    static const size_t ms[] = {8, 16, 24, 48, 40}, cs[] = {128, 384};
    for (size_t a = 0; a < sizeof ms / sizeof *ms; a++)
        for (size_t b = 0; b < sizeof cs / sizeof *cs; b++) {
            const size_t m = ms[a], cols = cs[b], bytes = m * dj_dtype_row_bytes(DJ_DTYPE_Q4, cols);
            CHECK(dj_q4_banded(m) == (m % 16 == 0));
            uint8_t *seen = calloc(bytes, 1);
            int bad = 0;
            for (size_t j = 0; j < m; j++)
                for (size_t g = 0; g < cols / DJ_Q4_GROUP; g++) {
                    const size_t at = dj_q4_codes_at(m, cols, j, g);
                    for (size_t c = 0; c < DJ_Q4_GROUP; c++) { /* column c's nibble: dj_q4_nibble's in word c/8 */
                        const q4_place p = q4_spec(m, cols, j, DJ_Q4_GROUP * g + c);
                        const unsigned nib = dj_q4_nibble((unsigned)c);
                        bad += p.code != at + c / 8 * 4 + nib / 2 || p.high != (int)(nib % 2);
                    }
                    const q4_place p = q4_spec(m, cols, j, DJ_Q4_GROUP * g);
                    bad += dj_q4_scale_at(m, cols, j, g) != p.scale || dj_q4_zero_at(m, cols, j, g) != p.zero;
                    mark(seen, bytes, at, 64);
                    mark(seen, bytes, p.scale, 2);
                    mark(seen, bytes, p.zero, 2);
                }
            size_t once = 0;
            for (size_t i = 0; i < bytes; i++) once += seen[i] == 1;
            CHECK_MSG(bad == 0 && once == bytes, "q4 offsets m=%zu k=%zu: %d differ from the layout, %zu of %zu bytes "
                      "placed once", m, cols, bad, once, bytes);
            free(seen);
        }
}

static void write_gptq(const char *dir, const char *quant, bool with_gidx) {
    const part ps[] = {
        {"blk.g_idx", "I32", 1, {K, 0}, g_idx, sizeof g_idx},
        {"blk.qweight", "I32", 2, {K / 8, N}, g_qw, G_QW_BYTES},
        {"blk.qzeros", "I32", 2, {NG, N / 8}, g_qz, QZ_BYTES},
        {"blk.scales", "F16", 2, {NG, N}, scales, SCALE_BYTES},
        {"norm.weight", "F16", 1, {N, 0}, scales, 2 * N},
    };
    write_cfg(dir, quant);
    write_st(dir, with_gidx ? ps : ps + 1, with_gidx ? 5 : 4);
}

static void write_awq(const char *dir, const char *quant) {
    const part ps[] = {
        {"blk.qweight", "I32", 2, {K, N / 8}, a_qw, A_QW_BYTES},
        {"blk.qzeros", "I32", 2, {NG, N / 8}, a_qz, QZ_BYTES},
        {"blk.scales", "F16", 2, {NG, N}, scales, SCALE_BYTES},
        {"norm.weight", "F16", 1, {N, 0}, scales, 2 * N},
    };
    write_cfg(dir, quant);
    write_st(dir, ps, 4);
}

static const char *GPTQ = "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"desc_act\": false, "
                          "\"sym\": false, \"checkpoint_format\": \"gptq\"}";
static const char *AWQ = "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": true, "
                         "\"version\": \"gemm\"}";

/* The checkpoint in dir repacks to the matrix, the parts gone; and the CPU
 * matmul over it equals the dense product. */
static void check_repacked(const char *what, const char *dir) {
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    if (!ck) return;
    const dj_tensor_info *t = dj_checkpoint_find(ck, "blk.weight");
    CHECK_MSG(t && t->dtype == DJ_DTYPE_Q4 && t->ndim == 2 && t->shape[0] == N && t->shape[1] == K &&
                  t->nbytes == (size_t)N * dj_dtype_row_bytes(DJ_DTYPE_Q4, K),
              "%s: no repacked blk.weight [%d,%d] of q4", what, N, K);
    CHECK(!dj_checkpoint_find(ck, "blk.qweight") && !dj_checkpoint_find(ck, "blk.qzeros") &&
          !dj_checkpoint_find(ck, "blk.scales") && !dj_checkpoint_find(ck, "blk.g_idx"));
    CHECK(dj_checkpoint_find(ck, "norm.weight") != NULL);
    CHECK(dj_checkpoint_tensor_count(ck) == 2);
    if (!t) {
        dj_checkpoint_close(ck);
        return;
    }
    int bad = 0;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) bad += q4_at(t->data, n, k) != want(n, k);
    CHECK_MSG(bad == 0, "%s, %d rows: %d of %d values differ from (code - zero) * scale", what, N, bad, N * K);

    /* the CPU backend's MATMUL on the 4-bit rows against the dense product */
    enum { R = 5 };
    float x[R][K], out[R * NMAX];
    for (int r = 0; r < R; r++)
        for (int k = 0; k < K; k++) x[r][k] = dj_test_randf(-1.0f, 1.0f);
    dj_backend_t *be = NULL;
    CHECK_OK(dj_backend_cpu_new(2, &be));
    for (uint32_t n = 1; be && n <= R; n += 4) { /* one row (decode) and five */
        const dj_op_call c = {.op = DJ_OP_MATMUL, .n = n, .out = out, .x = x, .w = t->data,
                              .w_dtype = DJ_DTYPE_Q4, .k = K, .m = (uint32_t)N};
        CHECK_OK(dj_backend_compute(be, &c));
        double maxd = 0, maxr = 0;
        for (uint32_t r = 0; r < n; r++)
            for (int j = 0; j < N; j++) {
                double d = 0;
                for (int k = 0; k < K; k++) d += (double)x[r][k] * want(j, k);
                maxd = fmax(maxd, fabs(d - out[r * (uint32_t)N + (uint32_t)j]));
                maxr = fmax(maxr, fabs(d));
            }
        CHECK_MSG(maxd <= 1e-5 * maxr, "%s: matmul n=%u error %.3g of %.3g", what, n, maxd, maxr);
    }
    dj_backend_free(be);
    dj_checkpoint_close(ck);
}

/* Opening dir fails with st and an error mentioning needle. */
static void check_refused(const char *dir, dj_status st, const char *needle) {
    dj_checkpoint_t *ck = NULL;
    CHECK_ST(dj_checkpoint_open(dir, &ck), st);
    CHECK(ck == NULL);
    CHECK_MSG(strstr(dj_last_error(), needle) != NULL, "error \"%s\" lacks \"%s\"", dj_last_error(), needle);
    dj_checkpoint_close(ck);
}

static void test_configs(void) {
    static const struct {
        const char *quant, *needle;
        dj_status st;
    } cases[] = {
        {"{\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true}", "\"bitsandbytes\"", DJ_EUNSUPPORTED},
        {"{\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": 128, \"desc_act\": false}", "bits 8",
         DJ_EUNSUPPORTED},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 64, \"desc_act\": false}", "group_size 64",
         DJ_EUNSUPPORTED},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": -1, \"desc_act\": false}", "group_size -1",
         DJ_EUNSUPPORTED},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"desc_act\": true}", "desc_act true",
         DJ_EUNSUPPORTED},
        {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": \"gptq_v2\"}",
         "gptq_v2", DJ_EUNSUPPORTED},
        {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"version\": \"gemv\"}", "gemv",
         DJ_EUNSUPPORTED},
        {"{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 128, \"zero_point\": false}", "zero_point false",
         DJ_EUNSUPPORTED},
        {"{\"quant_method\": \"awq\", \"bits\": 3}", "bits 3", DJ_EUNSUPPORTED},
        {"{\"bits\": 4}", "quant_method", DJ_EFORMAT},
        {"[4]", "quantization_config", DJ_EFORMAT},
        {"{\"quant_method\": \"gptq\", \"bits\": \"4\"}", "bits", DJ_EFORMAT},
        {"{\"quant_method\": \"gptq\", \"desc_act\": 0}", "desc_act", DJ_EFORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *d = new_dir();
        write_gptq(d, cases[i].quant, true);
        check_refused(d, cases[i].st, cases[i].needle);
    }
}

static void test_parts(void) {
    const char *d;
    /* g_idx of an activation-order checkpoint */
    pack_gptq();
    g_idx[5] = 1;
    write_gptq(d = new_dir(), GPTQ, true);
    check_refused(d, DJ_EUNSUPPORTED, "g_idx[5]");
    pack_gptq();
    /* a missing part, a wrong dtype, shapes that do not agree */
    const part no_zeros[] = {{"blk.qweight", "I32", 2, {K / 8, N}, g_qw, G_QW_BYTES},
                             {"blk.scales", "F16", 2, {NG, N}, scales, SCALE_BYTES}};
    write_cfg(d = new_dir(), GPTQ);
    write_st(d, no_zeros, 2);
    check_refused(d, DJ_EFORMAT, "blk.qzeros");
    const part f32_scales[] = {{"blk.qweight", "I32", 2, {K / 8, N}, g_qw, G_QW_BYTES},
                               {"blk.qzeros", "I32", 2, {NG, N / 8}, g_qz, QZ_BYTES},
                               {"blk.scales", "F32", 2, {NG, N / 2}, scales, SCALE_BYTES}};
    write_cfg(d = new_dir(), GPTQ);
    write_st(d, f32_scales, 3);
    check_refused(d, DJ_EFORMAT, "blk.scales");
    const part bad_shape[] = {{"blk.qweight", "I32", 2, {K / 16, 2 * N}, g_qw, G_QW_BYTES},
                              {"blk.qzeros", "I32", 2, {NG, N / 8}, g_qz, QZ_BYTES},
                              {"blk.scales", "F16", 2, {NG, N}, scales, SCALE_BYTES}};
    write_cfg(d = new_dir(), GPTQ);
    write_st(d, bad_shape, 3);
    check_refused(d, DJ_EFORMAT, "do not describe");
    /* AWQ parts under a GPTQ config do not fit */
    pack_awq();
    write_awq(d = new_dir(), GPTQ);
    check_refused(d, DJ_EFORMAT, "blk");
    /* I32 tensors without a quantization config load (and are not weights) */
    write_awq(d = new_dir(), NULL);
    dj_checkpoint_t *ck = NULL;
    CHECK_OK(dj_checkpoint_open(d, &ck));
    CHECK(ck && dj_checkpoint_find(ck, "blk.qweight") && dj_checkpoint_find(ck, "blk.qweight")->dtype == DJ_DTYPE_I32);
    dj_checkpoint_close(ck);
}

/* A Phi-3 layer whose qkv_proj is 4-bit (hidden 128, 16 heads of 8): the k
 * and v slots are rows of it. One KV head makes k's part 8 rows, half a band:
 * the load is refused naming the tensor; two make every part whole bands, and
 * binding goes on to o_proj (absent here). */
static void test_fused_part(void) {
    static uint8_t zero[128 * 160 / 2];
    for (int kv = 1; kv <= 2; kv++) {
        const int64_t qkv = 128 + 2 * 8 * kv;
        char cfg[1024];
        snprintf(cfg, sizeof cfg,
                 "{\"architectures\": [\"Phi3ForCausalLM\"], \"model_type\": \"phi3\", \"vocab_size\": 8,"
                 " \"hidden_size\": 128, \"intermediate_size\": 128, \"num_hidden_layers\": 1,"
                 " \"num_attention_heads\": 16, \"num_key_value_heads\": %d, \"max_position_embeddings\": 128,"
                 " \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": true, \"torch_dtype\": \"float16\","
                 " \"quantization_config\": %s}",
                 kv, AWQ);
        const part ps[] = {
            {"model.layers.0.input_layernorm.weight", "F16", 1, {128, 0}, zero, 256},
            {"model.layers.0.post_attention_layernorm.weight", "F16", 1, {128, 0}, zero, 256},
            {"model.layers.0.self_attn.qkv_proj.qweight", "I32", 2, {128, qkv / 8}, zero, (size_t)qkv * 128 / 2},
            {"model.layers.0.self_attn.qkv_proj.qzeros", "I32", 2, {1, qkv / 8}, zero, (size_t)qkv / 2},
            {"model.layers.0.self_attn.qkv_proj.scales", "F16", 2, {1, qkv}, zero, (size_t)qkv * 2},
        };
        const char *d = new_dir();
        write_file(d, "config.json", cfg, strlen(cfg));
        write_st(d, ps, 5);
        dj_engine_config ec;
        memset(&ec, 0, sizeof ec);
        dj_vmu_config_default(&ec.vmu, (size_t)4 << 20);
        ec.max_step_tokens = 64;
        dj_engine_t *e = NULL;
        CHECK_OK(dj_engine_new(&ec, &e));
        if (!e) return;
        dj_model_t *m = NULL;
        const dj_status st = dj_model_load(e, d, &m);
        const char *needle = kv == 1 ? "qkv_proj.weight' is 4-bit with 144 rows: its part of rows 128..135" : "o_proj";
        CHECK_MSG(st == (kv == 1 ? DJ_EUNSUPPORTED : DJ_ENOTFOUND) && strstr(dj_last_error(), needle),
                  "%d KV heads: status %d, error \"%s\" (wanted \"%s\")", kv, (int)st, dj_last_error(), needle);
        if (m) dj_model_release(e, m);
        dj_engine_free(e);
    }
}

static void remove_tree(const char *path) {
    DIR *dd = opendir(path);
    if (!dd) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(dd))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[768];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        remove_tree(sub);
    }
    closedir(dd);
    rmdir(path);
}

int main(void) {
    dj_test_seeds();
    const char *tmp = getenv("TMPDIR");
    snprintf(base_dir, sizeof base_dir, "%s/djinn-q4-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base_dir)) {
        perror("mkdtemp");
        return 2;
    }
    CHECK(dj_dtype_row_bytes(DJ_DTYPE_Q4, 128) == 68 && dj_dtype_row_bytes(DJ_DTYPE_Q4, 4096) == 2176);
    CHECK(dj_dtype_row_bytes(DJ_DTYPE_Q4, 100) == 0 && dj_dtype_size(DJ_DTYPE_Q4) == 0);
    CHECK(!strcmp(dj_dtype_name(DJ_DTYPE_Q4), "q4"));
    test_offsets();
    /* rows (24, 136), bands (48, 144); past 128 rows, two repack blocks; 24 last, for the tests below */
    static const int ns[] = {48, 144, 136, 24};
    for (int trial = 0; trial < 4; trial++) {
        N = ns[trial];
        random_matrix();
        pack_gptq();
        const char *d = new_dir();
        write_gptq(d, GPTQ, true);
        check_repacked("gptq", d);
        write_gptq(d = new_dir(), "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128}", false);
        check_repacked("gptq without g_idx, defaults", d);
        pack_awq();
        write_awq(d = new_dir(), AWQ);
        check_repacked("awq", d);
        write_awq(d = new_dir(), "{\"quant_method\": \"awq\", \"w_bit\": 4, \"q_group_size\": 128, \"version\": \"GEMM\"}");
        check_repacked("awq, AutoAWQ's key names", d);
    }
    test_configs();
    test_parts();
    test_fused_part();
    remove_tree(base_dir);
    return dj_test_finish("test_quant4");
}
