/* tokenizer.h: Hugging Face tokenizer.json in C - byte-level BPE with its
 * pre-tokenizer split regex (GPT-2 / Llama 3 / Qwen) and SentencePiece-style
 * BPE with byte fallback (Llama 2 / Mistral), added and special tokens, and a
 * decoder that streams valid UTF-8 token by token. */
#ifndef DJINN_TOKENIZER_H
#define DJINN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"

typedef struct dj_tokenizer dj_tokenizer_t;

/* Load from a file path or from memory (the memory form is fuzzed). Anything
 * unsupported (model type, normalizer, pre-tokenizer) gets an error naming it.
 * Supported: model BPE (merges as "a b" or ["a","b"], ignore_merges,
 * byte_fallback, unk_token, fuse_unk, continuing_subword_prefix,
 * end_of_word_suffix); normalizers Prepend, Replace, NFC, NFD, NFKC, NFKD,
 * Sequence; pre-tokenizers ByteLevel, Split, Metaspace, Digits, Sequence;
 * post-processors TemplateProcessing, RobertaProcessing, BertProcessing,
 * ByteLevel, Sequence; decoders ByteLevel, Replace, ByteFallback, Fuse, Strip,
 * Metaspace, Sequence. "truncation" and "padding" are ignored. */
/* A path ending in .gguf is read as a GGUF file's vocabulary instead
 * (llama.cpp's tokenizer.ggml.* keys; SentencePiece "llama" models only): the
 * tokenizer transformers' LlamaConverter builds of the same model (merges
 * from the scores; src/model/tok_gguf.c says how). */
dj_status dj_tokenizer_load(const char *path, dj_tokenizer_t **out /* OUT */);
dj_status dj_tokenizer_load_buffer(const char *json, size_t len, dj_tokenizer_t **out /* OUT */);
void dj_tokenizer_free(dj_tokenizer_t *tok); /* NULL does nothing */

/* A byte range [start, end) of a text. */
typedef struct dj_text_span {
    size_t start, end;
} dj_text_span;
/* dj_tokenizer_encode where the bytes of plain[n_plain] (sorted, disjoint)
 * are plain text: no special token that overlaps one of them is matched
 * (added tokens that are not special still are), as transformers'
 * split_special_tokens does for untrusted text; special tokens elsewhere
 * are matched as usual. The chat path marks message content so
 * (dj_chat_template_encode). */
dj_status dj_tokenizer_encode_plain(const dj_tokenizer_t *tok, const char *text, size_t len, bool add_special,
                                    const dj_text_span *plain, size_t n_plain, int32_t **ids /* OUT */,
                                    size_t *n_ids /* OUT */);
/* Encode `len` bytes of UTF-8 text. add_special: add what the post-processor
 * adds (BOS for Llama). Special/added tokens written in the text are always
 * recognised. *ids is malloc'd, caller frees. Invalid UTF-8 -> DJ_EFORMAT. */
dj_status dj_tokenizer_encode(const dj_tokenizer_t *tok, const char *text, size_t len, bool add_special,
                              int32_t **ids /* OUT */, size_t *n_ids /* OUT */);

/* Decode ids to text (malloc'd, NUL-terminated), skipping nothing. An id out of
 * range -> DJ_ERANGE naming it. */
dj_status dj_tokenizer_decode(const dj_tokenizer_t *tok, const int32_t *ids, size_t n, char **text /* OUT */);
/* The same, with the text's length: ids can decode to U+0000, which a plain
 * C string hides. */
dj_status dj_tokenizer_decode_len(const dj_tokenizer_t *tok, const int32_t *ids, size_t n, char **text /* OUT */,
                                  size_t *len /* OUT */);

uint32_t dj_tokenizer_vocab_size(const dj_tokenizer_t *tok);
/* Id of a token string (e.g. "<s>"), or -1. */
int32_t dj_tokenizer_token_id(const dj_tokenizer_t *tok, const char *token);
/* BOS the post-processor adds (-1 if none); whether add_special adds anything. */
int32_t dj_tokenizer_bos_id(const dj_tokenizer_t *tok);

/* Streaming decoder: feed ids one at a time, get the bytes that became valid,
 * complete UTF-8 (never half a code point; Llama 2's leading-space rule
 * handled). Owned by the caller; borrows tok. */
typedef struct dj_detok_stream dj_detok_stream_t;
dj_status dj_detok_stream_new(const dj_tokenizer_t *tok, dj_detok_stream_t **out /* OUT */);
void dj_detok_stream_free(dj_detok_stream_t *s);
/* Writes the newly complete text to out (up to cap-1 bytes, whole characters,
 * NUL-terminated); *n_out gets its length. Text that does not fit stays
 * queued and comes out first on the next push or finish. cap must be at
 * least 5. DJ_ERANGE for a bad id (the stream is unchanged). The pushes and
 * the finishes together give exactly dj_tokenizer_decode of all the ids. */
dj_status dj_detok_stream_push(dj_detok_stream_t *s, int32_t id, char *out, size_t cap, size_t *n_out /* OUT */);
/* Flush whatever is left (invalid trailing bytes become U+FFFD); call again
 * until *n_out is 0 if cap may be short. Afterwards the stream starts a new
 * sequence. */
dj_status dj_detok_stream_finish(dj_detok_stream_t *s, char *out, size_t cap, size_t *n_out /* OUT */);

#endif
