/* gguf_writer.h: the little of GGUF (v3) that make_random_checkpoint needs
 * to hand llama.cpp the same random weights - llama metadata, a placeholder
 * SentencePiece vocabulary (byte tokens plus numbered ones), tensor infos,
 * then the data as the generator streams it (F16 matrices, F32 norms). */
#ifndef DJ_BENCH_GGUF_WRITER_H
#define DJ_BENCH_GGUF_WRITER_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define GGUF_ALIGN 32
enum { GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6, GGUF_STR = 8, GGUF_ARR = 9 };

static void gguf_u32(FILE *f, uint32_t v) { fwrite(&v, 4, 1, f); }
static void gguf_u64(FILE *f, uint64_t v) { fwrite(&v, 8, 1, f); }
static void gguf_str(FILE *f, const char *s) {
    gguf_u64(f, strlen(s));
    fwrite(s, 1, strlen(s), f);
}
static void gguf_kv_u32(FILE *f, const char *k, uint32_t v) {
    gguf_str(f, k);
    gguf_u32(f, GGUF_U32);
    gguf_u32(f, v);
}
static void gguf_kv_f32(FILE *f, const char *k, float v) {
    gguf_str(f, k);
    gguf_u32(f, GGUF_F32);
    fwrite(&v, 4, 1, f);
}
static void gguf_kv_str(FILE *f, const char *k, const char *v) {
    gguf_str(f, k);
    gguf_u32(f, GGUF_STR);
    gguf_str(f, v);
}

/* Token i's text: <unk>, <s>, </s>, <0x00>..<0xFF>, then t<i>. */
static void gguf_token(int i, char *buf, size_t cap) {
    if (i == 0) snprintf(buf, cap, "<unk>");
    else if (i == 1) snprintf(buf, cap, "<s>");
    else if (i == 2) snprintf(buf, cap, "</s>");
    else if (i < 3 + 256) snprintf(buf, cap, "<0x%02X>", i - 3);
    else snprintf(buf, cap, "t%d", i);
}

/* The header up to the data: arch fields, vocabulary, n tensors whose
 * infos come from info(i, name, dims, &ndim, &type) in data order; returns
 * the data start (aligned). Offsets are packed in order, each aligned. */
typedef void (*gguf_info_fn)(void *user, int i, char *name, uint64_t dims[2], uint32_t *ndim, uint32_t *type);
static long gguf_write_header(FILE *f, int hidden, int ffn, int layers, int heads, int kv_heads, int vocab,
                              int max_pos, double theta, int n, gguf_info_fn info, void *user) {
    fwrite("GGUF", 1, 4, f);
    gguf_u32(f, 3);
    gguf_u64(f, (uint64_t)n);
    gguf_u64(f, 18); /* the key-value pairs below */
    gguf_kv_str(f, "general.architecture", "llama");
    gguf_kv_str(f, "general.name", "djinn-random");
    gguf_kv_u32(f, "general.file_type", 1); /* mostly F16 */
    gguf_kv_u32(f, "llama.context_length", (uint32_t)max_pos);
    gguf_kv_u32(f, "llama.embedding_length", (uint32_t)hidden);
    gguf_kv_u32(f, "llama.block_count", (uint32_t)layers);
    gguf_kv_u32(f, "llama.feed_forward_length", (uint32_t)ffn);
    gguf_kv_u32(f, "llama.attention.head_count", (uint32_t)heads);
    gguf_kv_u32(f, "llama.attention.head_count_kv", (uint32_t)kv_heads);
    gguf_kv_f32(f, "llama.rope.freq_base", (float)theta);
    gguf_kv_f32(f, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_kv_u32(f, "llama.rope.dimension_count", (uint32_t)(hidden / heads));
    gguf_kv_str(f, "tokenizer.ggml.model", "llama");
    char tok[32];
    gguf_str(f, "tokenizer.ggml.tokens");
    gguf_u32(f, GGUF_ARR);
    gguf_u32(f, GGUF_STR);
    gguf_u64(f, (uint64_t)vocab);
    for (int i = 0; i < vocab; i++) gguf_token(i, tok, sizeof tok), gguf_str(f, tok);
    gguf_str(f, "tokenizer.ggml.scores");
    gguf_u32(f, GGUF_ARR);
    gguf_u32(f, GGUF_F32);
    gguf_u64(f, (uint64_t)vocab);
    for (int i = 0; i < vocab; i++) {
        const float s = -(float)i;
        fwrite(&s, 4, 1, f);
    }
    gguf_str(f, "tokenizer.ggml.token_type");
    gguf_u32(f, GGUF_ARR);
    gguf_u32(f, GGUF_I32);
    gguf_u64(f, (uint64_t)vocab);
    for (int i = 0; i < vocab; i++) {
        const int32_t ty = i == 0 ? 2 : i < 3 ? 3 : i < 3 + 256 ? 6 : 1; /* unknown, control, byte, normal */
        fwrite(&ty, 4, 1, f);
    }
    gguf_kv_u32(f, "tokenizer.ggml.bos_token_id", 1);
    gguf_kv_u32(f, "tokenizer.ggml.eos_token_id", 2);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        char name[96];
        uint64_t dims[2];
        uint32_t nd, ty;
        info(user, i, name, dims, &nd, &ty);
        gguf_str(f, name);
        gguf_u32(f, nd);
        for (uint32_t d = 0; d < nd; d++) gguf_u64(f, dims[d]);
        gguf_u32(f, ty);
        gguf_u64(f, off);
        uint64_t bytes = dims[0] * (nd > 1 ? dims[1] : 1) * (ty == 0 ? 4 : 2);
        off += (bytes + GGUF_ALIGN - 1) / GGUF_ALIGN * GGUF_ALIGN;
    }
    long pos = ftell(f);
    while (pos % GGUF_ALIGN) fputc(0, f), pos++;
    return pos;
}

/* Zero bytes up to the next aligned offset after a tensor of `bytes`. */
static void gguf_pad(FILE *f, uint64_t bytes) {
    for (uint64_t b = bytes; b % GGUF_ALIGN; b++) fputc(0, f);
}

#endif
