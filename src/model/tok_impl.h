/* tok_impl.h: private layout of dj_tokenizer_t shared by the loader
 * (tokenizer.c), the encoder (tok_encode.c) and the decoders (tok_decode.c). */
#ifndef DJ_TOK_IMPL_H
#define DJ_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"
#include "djinn/tokenizer.h"

/* Ids are dense small integers; a file naming a larger id is refused. */
#define DJ__TOK_MAX_ID (1u << 22)
#define DJ__TOK_NO_STR UINT32_MAX

/* Growable byte buffer; p is malloc'd, always NUL-terminated when non-NULL. */
typedef struct {
    char *p;
    size_t n, cap;
} dj__sbuf;

dj_status dj__sbuf_put(dj__sbuf *b, const void *s, size_t n);
void dj__sbuf_free(dj__sbuf *b);

/* UTF-8 helpers. */
/* Length of the valid sequence starting at s[i] (1..4), or 0 if the bytes
 * there are not a complete valid sequence; *truncated says the bytes were a
 * valid start cut off by the end of the buffer. */
size_t dj__utf8_seq(const uint8_t *s, size_t n, size_t i, bool *truncated /* OUT */);
bool dj__utf8_valid(const char *s, size_t n);
/* Decode one code point of valid UTF-8 at s; returns its byte length. */
size_t dj__utf8_cp(const char *s, int32_t *cp /* OUT */);
size_t dj__utf8_put(char out[4], int32_t cp);
/* Appends s with invalid sequences replaced by U+FFFD, one per maximal
 * invalid subpart (the rule of Rust's String::from_utf8_lossy). */
dj_status dj__utf8_lossy(dj__sbuf *out, const char *s, size_t n);

/* Open-addressing map from byte strings (stored in tok->arena) to ids. */
typedef struct {
    uint32_t off, len; /* token bytes in arena */
    int32_t id;
} dj__vocab_entry;

typedef struct {
    uint32_t *slots; /* [cap] entry index + 1, 0 = empty */
    uint32_t cap;    /* power of two, > 2 * entries */
} dj__strmap;

typedef struct {
    uint64_t key; /* (a << 32) | b, UINT64_MAX = empty */
    uint32_t rank;
    int32_t new_id;
} dj__merge_slot;

typedef enum { DJ__NORM_PREPEND, DJ__NORM_REPLACE, DJ__NORM_NFC, DJ__NORM_NFD, DJ__NORM_NFKC, DJ__NORM_NFKD } dj__norm_kind;

typedef struct {
    dj__norm_kind kind;
    char *str;            /* Prepend: what to prepend; Replace: the literal pattern (NULL if regex) */
    size_t str_len;
    pcre2_code *re;       /* Replace with a Regex pattern */
    char *content;        /* Replace: the replacement */
    size_t content_len;
} dj__norm;

typedef enum { DJ__PRE_SPLIT, DJ__PRE_BYTELEVEL, DJ__PRE_METASPACE, DJ__PRE_DIGITS } dj__pre_kind;
typedef enum { DJ__SPLIT_REMOVED, DJ__SPLIT_ISOLATED, DJ__SPLIT_MERGED_PREV, DJ__SPLIT_MERGED_NEXT, DJ__SPLIT_CONTIGUOUS } dj__split_behavior;
typedef enum { DJ__PREPEND_ALWAYS, DJ__PREPEND_FIRST, DJ__PREPEND_NEVER } dj__prepend_scheme;

typedef struct {
    dj__pre_kind kind;
    pcre2_code *re;        /* Split's pattern; ByteLevel's GPT-2 regex when use_regex */
    dj__split_behavior behavior;
    bool invert;
    bool add_prefix_space; /* ByteLevel */
    char repl[5];          /* Metaspace replacement character, UTF-8 */
    size_t repl_len;
    dj__prepend_scheme prepend_scheme;
    bool split;             /* Metaspace */
    bool individual_digits; /* Digits */
} dj__pretok;

typedef enum { DJ__DEC_BYTELEVEL, DJ__DEC_REPLACE, DJ__DEC_BYTEFALLBACK, DJ__DEC_FUSE, DJ__DEC_STRIP, DJ__DEC_METASPACE } dj__dec_kind;

typedef struct {
    dj__dec_kind kind;
    char *pat; /* Replace literal pattern (NULL if regex) */
    size_t pat_len;
    pcre2_code *re;
    char *content; /* Replace replacement; Strip: the character (UTF-8) */
    size_t content_len;
    size_t start, stop; /* Strip: at most this many characters from each end */
    char repl[5];       /* Metaspace */
    size_t repl_len;
    dj__prepend_scheme prepend_scheme;
} dj__dec;

typedef struct {
    uint32_t off, len;  /* content bytes in arena */
    uint32_t noff, nlen; /* normalized content (for normalized tokens) in arena */
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} dj__added;

/* Added tokens of one kind (raw-text or normalized-text matched), sorted by
 * first byte so the matcher looks only at candidates for the byte at hand. */
typedef struct {
    uint32_t *idx;          /* [n] indices into tok->added, sorted by first byte */
    uint32_t n;
    uint32_t bucket[257];   /* idx[bucket[b] .. bucket[b+1]) start with byte b */
} dj__added_set;

/* One TemplateProcessing "single" template: items are either $A or ids. */
typedef struct {
    int32_t *ids;      /* [n_ids] all special ids, in template order */
    size_t n_ids;
    size_t n_before;   /* how many of ids come before $A */
} dj__template;

struct dj_tokenizer {
    char *arena; /* all token bytes: vocab, added tokens (normalized too) */
    size_t arena_len;

    uint32_t n_ids;           /* vocab size: max id + 1 */
    uint32_t *id_off, *id_len; /* [n_ids] decode string of each id; DJ__TOK_NO_STR = hole */
    uint8_t *id_added;        /* [n_ids] 1 if the id is an added token */

    dj__vocab_entry *vocab;   /* [n_vocab] model vocab */
    uint32_t n_vocab;
    dj__strmap vocab_map;

    dj__merge_slot *merges;   /* [merge_cap] */
    uint32_t merge_cap, n_merges;

    int32_t unk_id;       /* -1 none; -2 named but not in the vocab */
    char *unk_name;
    bool fuse_unk, byte_fallback, ignore_merges;
    char *cont_prefix, *word_suffix; /* continuing_subword_prefix / end_of_word_suffix or NULL */
    size_t cont_prefix_len, word_suffix_len;
    int32_t byte_ids[256]; /* ids of <0xXX> tokens, -1 if absent */

    dj__norm *norms;
    size_t n_norms;
    dj__pretok *pretoks;
    size_t n_pretoks;

    dj__added *added;
    uint32_t n_added;
    dj__added_set added_raw, added_norm;

    dj__template *templates; /* applied in order when add_special */
    size_t n_templates;

    bool has_decoder;
    dj__dec *decs;
    size_t n_decs;
};

/* Normalizes s[0..n) with tok's normalizers into out (appended). */
dj_status dj__tok_normalize(const dj_tokenizer_t *tok, const char *s, size_t n, dj__sbuf *out);

/* Decodes ids to raw text. first: the ids start the sequence (the Strip and
 * Metaspace decoders treat the start specially). lossy: replace invalid
 * UTF-8 left by ByteLevel (the one-shot form); false leaves it raw so the
 * streamer can hold back an incomplete trailing character. */
dj_status dj__tok_decode_raw(const dj_tokenizer_t *tok, const int32_t *ids, size_t n, bool first, bool lossy,
                             dj__sbuf *out);

/* Whether the id's token is a byte-fallback token "<0xXX>" and the decoder has ByteFallback. */
bool dj__tok_is_byte_token(const dj_tokenizer_t *tok, int32_t id);

/* Compile a PCRE2 pattern (UTF, UCP; literal if `literal`), JIT if available. */
dj_status dj__tok_regex(const char *pat, size_t len, bool literal, pcre2_code **out /* OUT */);

/* tok_text.c: the vocabulary map (string -> id; -1 when absent) and the merge
 * map ((a, b) -> rank and merged id; NULL when absent). Inserting into maps
 * sized by the loader (vocab_map.cap, merge_cap: powers of two above twice
 * the entries); a later duplicate string or pair replaces the earlier one. */
int32_t dj__tok_vocab_find(const dj_tokenizer_t *tok, const char *s, size_t n);
void dj__tok_vocab_insert(dj_tokenizer_t *tok, uint32_t i);
const dj__merge_slot *dj__tok_merge_find(const dj_tokenizer_t *tok, int32_t a, int32_t b);
void dj__tok_merge_insert(dj_tokenizer_t *tok, int32_t a, int32_t b, uint32_t rank, int32_t new_id);

/* tok_gguf.c: the tokenizer.json (a cJSON document, caller deletes) that
 * transformers would make of the SentencePiece vocabulary in a GGUF file. */
struct cJSON;
dj_status dj__tok_gguf_json(const char *path, struct cJSON **out /* OUT */);

#endif
