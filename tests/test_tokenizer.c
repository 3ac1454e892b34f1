/* test_tokenizer.c: tokenizer.json loading, encoding and decoding - small
 * hand-made tokenizers per feature, bad inputs, the real Llama 2 / Llama 3 /
 * Qwen3 files, and the reference ids of the `tokenizers` library when present;
 * tokenizers read from llama.cpp's GGUF vocabularies (Phi-3, Llama 2) against
 * the ids of HF's AutoTokenizer that llama.cpp ships with them. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "djinn/tokenizer.h"
#include "testutil.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- building small tokenizer.json documents ---- */

/* vocab: NULL-terminated token list, ids in order from first_id; model_extra
 * and rest: JSON objects whose members join the model / the document. */
static char *mk_json(const char *const *vocab, int first_id, const char *merges, const char *model_extra,
                     const char *rest) {
    cJSON *root = rest ? cJSON_Parse(rest) : cJSON_CreateObject();
    cJSON *model = model_extra ? cJSON_Parse(model_extra) : cJSON_CreateObject();
    if (!root || !model) {
        fprintf(stderr, "bad test JSON: %s / %s\n", rest ? rest : "", model_extra ? model_extra : "");
        abort();
    }
    if (!cJSON_GetObjectItem(model, "type")) cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *v = cJSON_AddObjectToObject(model, "vocab");
    for (int i = 0; vocab[i]; i++) cJSON_AddNumberToObject(v, vocab[i], first_id + i);
    cJSON_AddItemToObject(model, "merges", cJSON_Parse(merges ? merges : "[]"));
    cJSON_AddItemToObject(root, "model", model);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

static dj_tokenizer_t *load_str(const char *json) {
    dj_tokenizer_t *t = NULL;
    dj_status st = dj_tokenizer_load_buffer(json, strlen(json), &t);
    CHECK_MSG(st == DJ_OK, "load failed: %s (%s)\n%s", dj_status_name(st), dj_last_error(), json);
    return t;
}

static dj_tokenizer_t *mk(const char *const *vocab, const char *merges, const char *model_extra, const char *rest) {
    char *j = mk_json(vocab, 0, merges, model_extra, rest);
    dj_tokenizer_t *t = load_str(j);
    free(j);
    return t;
}

/* Concatenation of a streamed decode, fed with output buffers of random sizes. */
static char *stream_decode(const dj_tokenizer_t *tok, const int32_t *ids, size_t n, size_t *out_len) {
    dj_detok_stream_t *s = NULL;
    if (dj_detok_stream_new(tok, &s)) return NULL;
    size_t cap_all = 64, len = 0;
    char *all = malloc(cap_all);
    char buf[80];
    all[0] = '\0';
    for (size_t i = 0; i <= n + 64; i++) {
        size_t cap = 5 + dj_test_rand() % 60, got = 0;
        dj_status st = i < n ? dj_detok_stream_push(s, ids[i], buf, cap, &got) : dj_detok_stream_finish(s, buf, cap, &got);
        if (st) {
            fprintf(stderr, "stream: %s\n", dj_last_error());
            free(all);
            all = NULL;
            break;
        }
        if (got >= cap || buf[got] != '\0') { /* (a decoded U+0000 may sit inside buf) */
            fprintf(stderr, "stream wrote %zu bytes into %zu\n", got, cap);
            free(all);
            all = NULL;
            break;
        }
        if (len + got + 1 > cap_all) {
            cap_all = (len + got + 1) * 2;
            all = realloc(all, cap_all);
        }
        memcpy(all + len, buf, got);
        len += got;
        all[len] = '\0';
        if (i >= n && got == 0) break;
    }
    dj_detok_stream_free(s);
    *out_len = len;
    return all;
}

/* Decoding ids: the one-shot text equals want (if given) and the stream's. */
static void check_decode(const dj_tokenizer_t *tok, const int32_t *ids, size_t n, const char *want, const char *what) {
    char *text = NULL;
    size_t len = 0, slen = 0;
    dj_status st = dj_tokenizer_decode_len(tok, ids, n, &text, &len);
    CHECK_MSG(st == DJ_OK, "%s: decode: %s", what, dj_last_error());
    if (st) return;
    if (want) CHECK_MSG(len == strlen(want) && !memcmp(text, want, len), "%s: decoded \"%s\", want \"%s\"", what, text, want);
    char *streamed = stream_decode(tok, ids, n, &slen);
    CHECK_MSG(streamed && slen == len && !memcmp(streamed, text, len), "%s: streamed \"%s\" != one-shot \"%s\"", what,
              streamed ? streamed : "(error)", text);
    free(streamed);
    free(text);
}

/* Encodes text and compares with the ids of the named tokens (NULL-terminated). */
static void check_enc(const dj_tokenizer_t *tok, const char *text, bool special, const char *const *want) {
    if (!tok) return;
    int32_t *ids = NULL;
    size_t n = 0;
    dj_status st = dj_tokenizer_encode(tok, text, strlen(text), special, &ids, &n);
    CHECK_MSG(st == DJ_OK, "encode \"%s\": %s", text, dj_last_error());
    size_t nw = 0;
    while (want[nw]) nw++;
    bool same = st == DJ_OK && n == nw;
    for (size_t i = 0; same && i < n; i++) {
        int32_t w = dj_tokenizer_token_id(tok, want[i]);
        CHECK_MSG(w >= 0, "test names unknown token %s", want[i]);
        same = ids[i] == w;
    }
    if (!same) {
        fprintf(stderr, "encode \"%s\" gave [", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, "%d ", ids[i]);
        fprintf(stderr, "], want [");
        for (size_t i = 0; i < nw; i++) fprintf(stderr, "%s(%d) ", want[i], dj_tokenizer_token_id(tok, want[i]));
        fprintf(stderr, "]\n");
    }
    CHECK_MSG(same, "encode \"%s\" (add_special=%d)", text, special);
    free(ids);
}

#define TOKS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NO_TOKS ((const char *const[]){NULL})

/* ---- features ---- */

static const char *const BL_VOCAB[] = {"a", "b", "c", "\xC4\xA0" /* Ġ */, "ab", "abc", "\xC4\xA0" "a", "x", "y", "xy", "!",
                                       NULL};

static void test_bytelevel_bpe(void) {
    const char *rest = "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true},"
                       "\"decoder\":{\"type\":\"ByteLevel\"}}";
    /* merge rank beats position: "Ġab" merges a+b (rank 0) before Ġ+a (rank 2) */
    dj_tokenizer_t *t = mk(BL_VOCAB, "[\"a b\", \"ab c\", \"\xC4\xA0 a\"]", NULL, rest);
    check_enc(t, "abc ab", false, TOKS("abc", "\xC4\xA0", "ab"));
    check_enc(t, "xy!", false, TOKS("x", "y", "!"));
    check_enc(t, "", false, NO_TOKS);
    check_enc(t, "az", false, TOKS("a")); /* no unk token: unknown characters vanish, as in `tokenizers` */
    CHECK(dj_tokenizer_vocab_size(t) == 11);
    CHECK(dj_tokenizer_bos_id(t) == -1);
    int32_t ids[] = {5, 3, 4, 10};
    check_decode(t, ids, 4, "abc ab!", "byte-level decode");
    dj_tokenizer_free(t);

    /* the list form of merges; ignore_merges: a pre-token in the vocab is
     * one token, though no merge makes it */
    const char *list_merges = "[[\"a\",\"b\"],[\"ab\",\"c\"],[\"\xC4\xA0\",\"a\"]]";
    t = mk(BL_VOCAB, list_merges, "{\"ignore_merges\":true}",
           "{\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false},\"decoder\":{\"type\":\"ByteLevel\"}}");
    check_enc(t, "abc ab", false, TOKS("abc", "\xC4\xA0", "ab"));
    check_enc(t, "xy", false, TOKS("xy"));
    dj_tokenizer_free(t);
    /* add_prefix_space (the default) */
    t = mk(BL_VOCAB, list_merges, "{\"ignore_merges\":false}", "{\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}");
    check_enc(t, "abc", false, TOKS("\xC4\xA0", "abc"));
    check_enc(t, "xy", false, TOKS("\xC4\xA0", "x", "y"));
    dj_tokenizer_free(t);
}

/* Llama 2 style: SentencePiece BPE with byte fallback. */
static char *spm_json(const char *model_extra) {
    static const char *const words[] = {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "\xE2\x96\x81" "ab", "ab", NULL};
    const char *v[3 + 256 + 7];
    char names[256][8];
    size_t k = 0;
    v[k++] = "<unk>";
    v[k++] = "<s>";
    v[k++] = "</s>";
    for (int b = 0; b < 256; b++) {
        snprintf(names[b], sizeof names[b], "<0x%02X>", b);
        v[k++] = names[b];
    }
    for (int i = 0; words[i]; i++) v[k++] = words[i];
    v[k] = NULL;
    const char *rest =
        "{\"added_tokens\":["
        "{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false},"
        "{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
        "{\"id\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false}],"
        "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xE2\x96\x81\"},"
        "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\xE2\x96\x81\"}]},"
        "\"pre_tokenizer\":null,"
        "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
        "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\xE2\x96\x81\"},"
        "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]}}";
    return mk_json(v, 0, "[\"\xE2\x96\x81 a\", \"\xE2\x96\x81" "a b\", \"a b\"]", model_extra, rest);
}

static void test_sentencepiece_bpe(void) {
    char *j = spm_json("{\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true}");
    dj_tokenizer_t *t = load_str(j);
    free(j);
    if (!t) return;
    const char *sp = "\xE2\x96\x81";
    check_enc(t, "ab", false, TOKS("\xE2\x96\x81" "ab"));
    check_enc(t, "ab", true, TOKS("<s>", "\xE2\x96\x81" "ab"));
    check_enc(t, "ab ab", false, TOKS("\xE2\x96\x81" "ab", "\xE2\x96\x81" "ab"));
    check_enc(t, "\xC3\xA9", false, TOKS(sp, "<0xC3>", "<0xA9>")); /* é by byte fallback */
    /* special tokens written in the text are recognised even without add_special;
     * each piece between them gets its own Prepend */
    check_enc(t, "a<s>b", false, TOKS("\xE2\x96\x81" "a", "<s>", sp, "b"));
    CHECK(dj_tokenizer_bos_id(t) == 1);
    CHECK(dj_tokenizer_token_id(t, "<s>") == 1);
    CHECK(dj_tokenizer_token_id(t, "nope") == -1);

    int32_t ab = dj_tokenizer_token_id(t, "\xE2\x96\x81" "ab"), b = dj_tokenizer_token_id(t, "b");
    int32_t spid = dj_tokenizer_token_id(t, sp);
    int32_t ids1[] = {ab, ab};
    check_decode(t, ids1, 2, "ab ab", "spm: leading space stripped once");
    int32_t ids2[] = {1, ab};
    check_decode(t, ids2, 2, "<s> ab", "spm: BOS then word");
    int32_t ids3[] = {spid, 3 + 0xC3, 3 + 0xA9, b};
    check_decode(t, ids3, 4, "\xC3\xA9" "b", "spm: byte fallback run");
    int32_t ids4[] = {3 + 0xC3, 3 + 0x41, b};
    check_decode(t, ids4, 3, "\xEF\xBF\xBD\xEF\xBF\xBD" "b", "spm: an invalid byte run is one U+FFFD per byte");
    int32_t ids6[] = {spid, 3 + 0x00, b};
    char *nul = NULL;
    size_t nul_len = 0;
    CHECK_OK(dj_tokenizer_decode_len(t, ids6, 3, &nul, &nul_len));
    CHECK(nul && nul_len == 2 && nul[0] == '\0' && nul[1] == 'b');
    free(nul);
    check_decode(t, ids6, 3, NULL, "spm: a decoded NUL");
    int32_t ids5[] = {spid, spid, 3 + 0xE6};
    check_decode(t, ids5, 3, " \xEF\xBF\xBD", "spm: truncated run at the end");
    dj_tokenizer_free(t);

    /* unknown characters without byte fallback: one <unk>, or one per character */
    j = spm_json("{\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":false}");
    t = load_str(j);
    free(j);
    check_enc(t, "\xC3\xA9\xC3\xA9", false, TOKS(sp, "<unk>"));
    check_enc(t, "a\xC3\xA9" "b", false, TOKS("\xE2\x96\x81" "a", "<unk>", "b"));
    dj_tokenizer_free(t);
    j = spm_json("{\"unk_token\":\"<unk>\",\"fuse_unk\":false}");
    t = load_str(j);
    free(j);
    check_enc(t, "\xC3\xA9\xC3\xA9", false, TOKS(sp, "<unk>", "<unk>"));
    dj_tokenizer_free(t);
}

static void test_metaspace(void) {
    static const char *const v[] = {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "\xE2\x96\x81" "b", NULL};
    const char *merges = "[\"\xE2\x96\x81 a\", \"\xE2\x96\x81 b\"]";
    const char *fmt = "{\"added_tokens\":[{\"id\":5,\"content\":\"<x>\",\"special\":true,\"normalized\":false}],"
                      "\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\",\"prepend_scheme\":\"%s\","
                      "\"split\":true},\"decoder\":{\"type\":\"Metaspace\",\"replacement\":\"\xE2\x96\x81\","
                      "\"prepend_scheme\":\"%s\",\"split\":true}}";
    char rest[1024];
    snprintf(rest, sizeof rest, fmt, "first", "first");
    dj_tokenizer_t *t = mk(v, merges, NULL, rest);
    check_enc(t, "a b", false, TOKS("\xE2\x96\x81" "a", "\xE2\x96\x81" "b"));
    check_enc(t, "<x>a", false, TOKS("<x>", "a")); /* "first": only the text's start gets the prefix */
    int32_t ids[] = {3, 4};
    check_decode(t, ids, 2, "a b", "metaspace decode");
    int32_t ids2[] = {0, 0, 3};
    check_decode(t, ids2, 3, "  a", "metaspace decode: the first token's replacement goes");
    dj_tokenizer_free(t);
    snprintf(rest, sizeof rest, fmt, "always", "always");
    t = mk(v, merges, NULL, rest);
    check_enc(t, "<x>a", false, TOKS("<x>", "\xE2\x96\x81" "a"));
    dj_tokenizer_free(t);
    snprintf(rest, sizeof rest, fmt, "never", "never");
    t = mk(v, merges, NULL, rest);
    check_enc(t, "a b", false, TOKS("a", "\xE2\x96\x81" "b"));
    check_decode(t, ids, 2, " a b", "metaspace decode, never");
    dj_tokenizer_free(t);
}

static void test_split(void) {
    static const char *const v[] = {"a", "b", "-", "a-", "-b", "--", "1", "2", "12", "a12", NULL};
    const struct {
        const char *pre, *text;
        const char *const *want;
    } cases[] = {
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Removed\",\"invert\":false}", "a-b", TOKS("a", "b")},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Isolated\",\"invert\":false}", "a-b", TOKS("a", "-", "b")},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"MergedWithPrevious\"}", "a-b", TOKS("a-", "b")},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"MergedWithNext\"}", "a-b", TOKS("a", "-b")},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Contiguous\"}", "a--b", TOKS("a", "--", "b")},
        {"{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Removed\",\"invert\":true}", "a-b", TOKS("-")},
        {"{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\p{N}+\"},\"behavior\":\"Isolated\"}", "a12", TOKS("a", "12")},
        {"{\"type\":\"Digits\",\"individual_digits\":true}", "a12", TOKS("a", "1", "2")},
        {"{\"type\":\"Digits\",\"individual_digits\":false}", "a12", TOKS("a", "12")},
        {"{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Digits\",\"individual_digits\":true},"
         "{\"type\":\"Split\",\"pattern\":{\"String\":\"-\"},\"behavior\":\"Isolated\"}]}", "a1-2", TOKS("a", "1", "-", "2")},
        {"null", "a12", TOKS("a12")},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char rest[512];
        snprintf(rest, sizeof rest, "{\"pre_tokenizer\":%s}", cases[i].pre);
        /* ignore_merges with no merges: a piece is one id exactly when the whole piece is in the vocab */
        dj_tokenizer_t *t = mk(v, "[]", "{\"ignore_merges\":true}", rest);
        check_enc(t, cases[i].text, false, cases[i].want);
        dj_tokenizer_free(t);
    }
}

static void test_normalizers(void) {
    static const char *const v[] = {"\xC3\xA9", "e", "\xCC\x81", "a", "B", "q", NULL};
    dj_tokenizer_t *t = mk(v, "[]", NULL, "{\"normalizer\":{\"type\":\"NFC\"}}");
    check_enc(t, "e\xCC\x81", false, TOKS("\xC3\xA9"));
    dj_tokenizer_free(t);
    t = mk(v, "[]", NULL, "{\"normalizer\":{\"type\":\"NFD\"}}");
    check_enc(t, "\xC3\xA9", false, TOKS("e", "\xCC\x81"));
    dj_tokenizer_free(t);
    t = mk(v, "[]", NULL, "{\"normalizer\":null}");
    check_enc(t, "e\xCC\x81", false, TOKS("e", "\xCC\x81"));
    dj_tokenizer_free(t);
    t = mk(v, "[]", NULL, "{\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"q+\"},\"content\":\"B\"}}");
    check_enc(t, "aqqqa", false, TOKS("a", "B", "a"));
    dj_tokenizer_free(t);
}

static void test_added_tokens(void) {
    static const char *const v[] = {"a", "b", " ", "x", "q", "B", NULL};
    const char *rest = "{\"added_tokens\":["
                       "{\"id\":10,\"content\":\"<m>\",\"lstrip\":true,\"rstrip\":true,\"special\":true,\"normalized\":false},"
                       "{\"id\":11,\"content\":\"ab\",\"single_word\":true,\"special\":false,\"normalized\":false},"
                       "{\"id\":12,\"content\":\"<mm>\",\"special\":true,\"normalized\":false},"
                       "{\"id\":13,\"content\":\"Z\",\"special\":false,\"normalized\":true},"
                       "{\"id\":14,\"content\":\"x\",\"special\":false,\"normalized\":false}],"
                       "\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"String\":\"q\"},\"content\":\"Z\"}}";
    dj_tokenizer_t *t = mk(v, "[]", NULL, rest);
    check_enc(t, "a <m> b", false, TOKS("a", "<m>", "b"));
    check_enc(t, "ab xab ab", false, TOKS("ab", " ", "x", "a", "b", " ", "ab"));
    check_enc(t, "<mm><m>", false, TOKS("<mm>", "<m>")); /* longest match first */
    check_enc(t, "aq", false, TOKS("a", "Z")); /* a normalized token found after normalization */
    check_enc(t, "Z", false, TOKS("Z"));
    CHECK(dj_tokenizer_token_id(t, "Z") == 13);
    CHECK(dj_tokenizer_token_id(t, "x") == 3); /* an added token already in the vocab keeps the vocab's id */
    int32_t ids[] = {0, 10, 1, 11};
    check_decode(t, ids, 4, NULL, "added tokens decode"); /* no decoder: tokens joined with spaces */
    char *text = NULL;
    CHECK_OK(dj_tokenizer_decode(t, ids, 4, &text));
    CHECK(text && !strcmp(text, "a <m> b ab"));
    free(text);
    dj_tokenizer_free(t);
}

static void test_post_processors(void) {
    static const char *const v[] = {"<s>", "</s>", "a", NULL};
    dj_tokenizer_t *t = mk(v, "[]", NULL,
                           "{\"post_processor\":{\"type\":\"Sequence\",\"processors\":[{\"type\":\"ByteLevel\"},"
                           "{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
                           "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"SpecialToken\":{\"id\":\"</s>\",\"type_id\":0}}]}]}}");
    check_enc(t, "aa", true, TOKS("<s>", "a", "a", "</s>"));
    check_enc(t, "aa", false, TOKS("a", "a"));
    check_enc(t, "", true, TOKS("<s>", "</s>"));
    CHECK(dj_tokenizer_bos_id(t) == 0);
    dj_tokenizer_free(t);
    t = mk(v, "[]", NULL, "{\"post_processor\":{\"type\":\"RobertaProcessing\",\"cls\":[\"<s>\",0],\"sep\":[\"</s>\",1]}}");
    check_enc(t, "a", true, TOKS("<s>", "a", "</s>"));
    dj_tokenizer_free(t);
}

static void expect_load_error(const char *json, dj_status want, const char *needle) {
    dj_tokenizer_t *t = (dj_tokenizer_t *)1;
    dj_clear_error();
    dj_status st = dj_tokenizer_load_buffer(json, strlen(json), &t);
    CHECK_MSG(st == want, "want %s, got %s (%s) for %s", dj_status_name(want), dj_status_name(st), dj_last_error(), json);
    CHECK_MSG(t == NULL, "failed load left a handle: %s", json);
    CHECK_MSG(strstr(dj_last_error(), needle), "message \"%s\" should name \"%s\"", dj_last_error(), needle);
    if (st == DJ_OK) dj_tokenizer_free(t);
}

static void test_bad_input(void) {
    static const char *const v[] = {"a", "b", "ab", NULL};
    expect_load_error("{\"model\":", DJ_EFORMAT, "malformed JSON");
    expect_load_error("[1,2]", DJ_EFORMAT, "not an object");
    expect_load_error("{\"model\":{}} x", DJ_EFORMAT, "trailing");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"\xff\":0}}}", DJ_EFORMAT, "UTF-8");
    expect_load_error("{}", DJ_EFORMAT, "model");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"merges\":[]}}", DJ_EFORMAT, "vocab");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", DJ_EFORMAT, "\"a\"");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1.5},\"merges\":[]}}", DJ_EFORMAT, "integer");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"0\"},\"merges\":[]}}", DJ_EFORMAT, "number");
    expect_load_error("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999},\"merges\":[]}}", DJ_EFORMAT, "integer");
    expect_load_error("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", DJ_EUNSUPPORTED, "WordPiece");
    struct {
        const char *merges, *extra, *rest, *needle;
        dj_status st;
    } bad[] = {
        {"[\"a q\"]", NULL, NULL, "\"q\"", DJ_EFORMAT},
        {"[\"a b c\"]", NULL, NULL, "merge #0", DJ_EFORMAT},
        {"[\"b a\"]", NULL, NULL, "\"ba\"", DJ_EFORMAT},
        {"[[\"a\"]]", NULL, NULL, "merge #0", DJ_EFORMAT},
        {"[\"a b\", 7]", NULL, NULL, "merge #1", DJ_EFORMAT},
        {"[]", "{\"dropout\":0.1}", NULL, "dropout", DJ_EUNSUPPORTED},
        {"[]", NULL, "{\"normalizer\":{\"type\":\"Lowercase\"}}", "Lowercase", DJ_EUNSUPPORTED},
        {"[]", NULL, "{\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"},{\"type\":\"BertNormalizer\"}]}}",
         "BertNormalizer", DJ_EUNSUPPORTED},
        {"[]", NULL, "{\"pre_tokenizer\":{\"type\":\"Whitespace\"}}", "Whitespace", DJ_EUNSUPPORTED},
        {"[]", NULL, "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}}",
         "regex", DJ_EFORMAT},
        {"[]", NULL, "{\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\"}}",
         "Sideways", DJ_EUNSUPPORTED},
        {"[]", NULL, "{\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}}", "one character", DJ_EFORMAT},
        {"[]", NULL, "{\"decoder\":{\"type\":\"WordPiece\"}}", "WordPiece", DJ_EUNSUPPORTED},
        {"[]", NULL, "{\"decoder\":{\"type\":\"Strip\",\"content\":\" \",\"start\":-1,\"stop\":0}}", "start", DJ_EFORMAT},
        {"[]", NULL, "{\"post_processor\":{\"type\":\"Foo\"}}", "Foo", DJ_EUNSUPPORTED},
        {"[]", NULL, "{\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<zz>\"}},"
         "{\"Sequence\":{\"id\":\"A\"}}]}}", "<zz>", DJ_EFORMAT},
        {"[]", NULL, "{\"added_tokens\":[{\"id\":3}]}", "content", DJ_EFORMAT},
        {"[]", NULL, "{\"added_tokens\":{\"id\":3}}", "added_tokens", DJ_EFORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *j = mk_json(v, 0, bad[i].merges, bad[i].extra, bad[i].rest);
        expect_load_error(j, bad[i].st, bad[i].needle);
        free(j);
    }

    dj_tokenizer_t *t = NULL;
    CHECK_ST(dj_tokenizer_load("/nonexistent/tokenizer.json", &t), DJ_EIO);
    CHECK(strstr(dj_last_error(), "/nonexistent/tokenizer.json"));
    CHECK_ST(dj_tokenizer_load_buffer(NULL, 0, &t), DJ_EINVAL);
    dj_tokenizer_free(NULL);

    t = mk(v, "[\"a b\"]", NULL, NULL);
    if (!t) return;
    static const char *const bad_text[] = {"\xff", "a\xC3", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "ab\x80"};
    for (size_t i = 0; i < sizeof bad_text / sizeof bad_text[0]; i++) {
        int32_t *ids = (int32_t *)1;
        size_t n = 7;
        CHECK_ST(dj_tokenizer_encode(t, bad_text[i], strlen(bad_text[i]), false, &ids, &n), DJ_EFORMAT);
        CHECK(ids == NULL && n == 0);
        CHECK(strstr(dj_last_error(), "UTF-8"));
    }
    int32_t *ids = NULL;
    size_t n = 0;
    /* NUL is valid UTF-8; unknown without an unk token, so dropped, and a, b merge */
    CHECK_OK(dj_tokenizer_encode(t, "a\0b", 3, false, &ids, &n));
    CHECK(n == 1 && ids && ids[0] == 2);
    free(ids);
    char *text = (char *)1;
    int32_t bad_ids[] = {0, 3};
    CHECK_ST(dj_tokenizer_decode(t, bad_ids, 2, &text), DJ_ERANGE);
    CHECK(text == NULL && strstr(dj_last_error(), "3"));
    bad_ids[1] = -5;
    CHECK_ST(dj_tokenizer_decode(t, bad_ids, 2, &text), DJ_ERANGE);
    CHECK(strstr(dj_last_error(), "-5"));
    dj_detok_stream_t *s = NULL;
    CHECK_OK(dj_detok_stream_new(t, &s));
    char buf[16];
    size_t got = 99;
    CHECK_ST(dj_detok_stream_push(s, 3, buf, sizeof buf, &got), DJ_ERANGE);
    CHECK(got == 0);
    CHECK_ST(dj_detok_stream_push(s, 0, buf, 2, &got), DJ_EINVAL);
    CHECK_OK(dj_detok_stream_push(s, 0, buf, sizeof buf, &got));
    CHECK_OK(dj_detok_stream_finish(s, buf, sizeof buf, &got));
    dj_detok_stream_free(s);
    dj_detok_stream_free(NULL);
    dj_tokenizer_free(t);
}

/* Random id sequences through the streamer: held-back byte runs and split
 * UTF-8 must come out exactly as the one-shot decode. */
static void test_stream_random(const dj_tokenizer_t *t, const char *name, int32_t lo, int32_t hi, int rounds) {
    if (!t) return;
    int32_t ids[48];
    for (int r = 0; r < rounds; r++) {
        size_t n = 1 + dj_test_rand() % 48;
        for (size_t i = 0; i < n; i++) ids[i] = lo + (int32_t)(dj_test_rand() % (uint64_t)(hi - lo));
        char what[64];
        snprintf(what, sizeof what, "%s random ids #%d", name, r);
        check_decode(t, ids, n, NULL, what);
    }
}

/* ---- the real tokenizer files ---- */

static dj_tokenizer_t *load_real(const char *name, double *secs) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizers/%s/tokenizer.json", DJ_THIRD_PARTY, name);
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "%s is missing: run scripts/setup.sh (it fetches the tokenizer files)", path);
    if (!f) return NULL;
    fclose(f);
    dj_tokenizer_t *t = NULL;
    double t0 = now_s();
    dj_status st = dj_tokenizer_load(path, &t);
    *secs = now_s() - t0;
    CHECK_MSG(st == DJ_OK, "loading %s: %s", path, dj_last_error());
    printf("%s: loaded in %.3f s, vocab %u\n", name, *secs, dj_tokenizer_vocab_size(t));
    return t;
}

static char **read_strings(size_t *n) {
    *n = 0;
    char *j = dj_test_read_file(DJ_FIXTURES "/tokenizer/strings.json", NULL);
    CHECK_MSG(j != NULL, "cannot read %s", DJ_FIXTURES "/tokenizer/strings.json");
    cJSON *root = j ? cJSON_Parse(j) : NULL;
    free(j);
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return NULL;
    }
    char **out = calloc((size_t)cJSON_GetArraySize(root) + 1, sizeof *out);
    const cJSON *it;
    cJSON_ArrayForEach(it, root) if (cJSON_IsString(it)) out[(*n)++] = strdup(it->valuestring);
    cJSON_Delete(root);
    return out;
}

static bool encode_ok(const dj_tokenizer_t *t, const char *s, bool special, int32_t **ids, size_t *n) {
    dj_status st = dj_tokenizer_encode(t, s, strlen(s), special, ids, n);
    CHECK_MSG(st == DJ_OK, "encode \"%s\": %s", s, dj_last_error());
    return st == DJ_OK;
}

/* Encode-decode round trips that hold by construction of each tokenizer. */
static void check_roundtrip(const dj_tokenizer_t *t, const char *name, const char *s) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (!encode_ok(t, s, false, &ids, &n)) return;
    char what[96];
    snprintf(what, sizeof what, "%s round trip of \"%.40s\"", name, s);
    check_decode(t, ids, n, s, what);
    free(ids);
}

/* Random text from several scripts (ASCII, Latin-1, CJK, emoji, spaces). */
static size_t random_text(char *buf, size_t cap) {
    static const int32_t ranges[][2] = {{0x20, 0x7E}, {0xA0, 0x17F}, {0x4E00, 0x4E80}, {0x1F600, 0x1F64F}, {9, 13},
                                        {0x400, 0x44F}, {0x3000, 0x3000}, {0x200B, 0x200D}};
    size_t n = 0;
    size_t len = 1 + dj_test_rand() % 40;
    for (size_t i = 0; i < len && n + 5 < cap; i++) {
        size_t r = dj_test_rand() % (sizeof ranges / sizeof ranges[0]);
        int32_t cp = ranges[r][0] + (int32_t)(dj_test_rand() % (uint64_t)(ranges[r][1] - ranges[r][0] + 1));
        if (dj_test_rand() % 3 == 0) cp = ' ';
        char u[4];
        size_t l;
        if (cp < 0x80) u[0] = (char)cp, l = 1;
        else if (cp < 0x800) u[0] = (char)(0xC0 | (cp >> 6)), u[1] = (char)(0x80 | (cp & 0x3F)), l = 2;
        else if (cp < 0x10000)
            u[0] = (char)(0xE0 | (cp >> 12)), u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[2] = (char)(0x80 | (cp & 0x3F)), l = 3;
        else
            u[0] = (char)(0xF0 | (cp >> 18)), u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)),
            u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (char)(0x80 | (cp & 0x3F)), l = 4;
        memcpy(buf + n, u, l);
        n += l;
    }
    buf[n] = '\0';
    return n;
}

static void check_one_token(const dj_tokenizer_t *t, const char *text, const char *token) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (!encode_ok(t, text, false, &ids, &n)) return;
    int32_t want = dj_tokenizer_token_id(t, token);
    CHECK_MSG(want >= 0 && n == 1 && ids[0] == want, "\"%s\" should be the single token %s (%d), got %zu ids", text,
              token, want, n);
    free(ids);
}

static void check_speed(const dj_tokenizer_t *t, const char *name, char **strs, size_t ns) {
    size_t cap = 16384, len = 0;
    char *big = malloc(cap);
    for (size_t i = 0; len < 8192; i = (i + 1) % ns) {
        size_t l = strlen(strs[i]);
        if (len + l + 1 >= cap) break;
        memcpy(big + len, strs[i], l);
        len += l;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    double t0 = now_s();
    dj_status st = dj_tokenizer_encode(t, big, len, false, &ids, &n);
    double dt = now_s() - t0;
    CHECK_OK(st);
    printf("%s: encoded %zu bytes into %zu ids in %.2f ms\n", name, len, n, dt * 1e3);
    free(ids);
    free(big);
}

static bool int_list_eq(const cJSON *arr, const int32_t *ids, size_t n) {
    if (!cJSON_IsArray(arr) || (size_t)cJSON_GetArraySize(arr) != n) return false;
    size_t i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) if (!cJSON_IsNumber(v) || (int32_t)v->valuedouble != ids[i++]) return false;
    return true;
}

/* tests/fixtures/tokenizer/refs_<name>.json: ids, ids_special, decoded, streaming. */
static void check_refs(const dj_tokenizer_t *t, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer/refs_%s.json", DJ_FIXTURES, name);
    char *j = dj_test_read_file(path, NULL);
    if (!j) {
        printf("%s: no %s yet - reference comparison not run\n", name, path);
        return;
    }
    cJSON *root = cJSON_Parse(j);
    free(j);
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    CHECK_MSG(cJSON_IsArray(cases), "%s: no \"cases\" list", path);
    size_t n_cases = 0, bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *text = cJSON_GetObjectItem(c, "text"), *want = cJSON_GetObjectItem(c, "ids"),
                    *want_sp = cJSON_GetObjectItem(c, "ids_special"), *dec = cJSON_GetObjectItem(c, "decoded");
        if (!cJSON_IsString(text)) continue;
        n_cases++;
        const char *s = text->valuestring;
        int32_t *ids = NULL, *ids_sp = NULL;
        size_t n = 0, n_sp = 0;
        if (!encode_ok(t, s, false, &ids, &n) || !encode_ok(t, s, true, &ids_sp, &n_sp)) {
            free(ids);
            bad++;
            continue;
        }
        bool ok1 = int_list_eq(want, ids, n), ok2 = int_list_eq(want_sp, ids_sp, n_sp);
        CHECK_MSG(ok1, "%s: ids of \"%s\" differ from the reference", name, s);
        CHECK_MSG(ok2, "%s: ids_special of \"%s\" differ from the reference", name, s);
        if (!ok1) {
            char *got = cJSON_PrintUnformatted(want);
            fprintf(stderr, "  want %s\n  got  [", got);
            for (size_t i = 0; i < n; i++) fprintf(stderr, "%d%s", ids[i], i + 1 < n ? "," : "");
            fprintf(stderr, "]\n");
            free(got);
        }
        /* decode the reference ids (not ours) so a decode check stands on its own */
        size_t nr = (size_t)cJSON_GetArraySize(want), nrs = (size_t)cJSON_GetArraySize(want_sp);
        int32_t *ref = malloc((nr + nrs + 1) * sizeof *ref);
        size_t k = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, want) ref[k++] = (int32_t)v->valuedouble;
        char what[96];
        snprintf(what, sizeof what, "%s decode of \"%.40s\"", name, s);
        check_decode(t, ref, nr, cJSON_IsString(dec) ? dec->valuestring : NULL, what);
        k = 0;
        cJSON_ArrayForEach(v, want_sp) ref[k++] = (int32_t)v->valuedouble;
        snprintf(what, sizeof what, "%s decode (special) of \"%.40s\"", name, s);
        check_decode(t, ref, nrs, NULL, what);
        bad += !ok1 || !ok2;
        free(ref);
        free(ids);
        free(ids_sp);
    }
    printf("%s: %zu reference cases, %zu differ\n", name, n_cases, bad);
    CHECK(n_cases > 0);
    cJSON_Delete(root);
}

static bool has_special_text(const char *s) { return strstr(s, "<s>") || strstr(s, "</s>") || strstr(s, "<|"); }

static void test_real(void) {
    size_t ns = 0;
    char **strs = read_strings(&ns);
    CHECK(ns > 10);
    /* gemma3: SentencePiece-style BPE with byte fallback like llama2, but spaces
     * become U+2581 by a Replace normalizer and nothing is prepended */
    static const char *const names[] = {"llama2", "llama3", "qwen3", "gemma3"};
    for (int k = 0; k < 4; k++) {
        double secs = 0;
        dj_tokenizer_t *t = load_real(names[k], &secs);
        if (!t) continue;
        check_refs(t, names[k]);
        /* facts readable from the vocab itself */
        if (k == 0) {
            check_one_token(t, "Hello", "\xE2\x96\x81Hello");
            CHECK(dj_tokenizer_bos_id(t) == dj_tokenizer_token_id(t, "<s>"));
            CHECK(dj_tokenizer_token_id(t, "<0x0A>") >= 0);
        } else if (k == 3) {
            check_one_token(t, "Hello", "Hello");
            check_one_token(t, " world", "\xE2\x96\x81world");
            check_one_token(t, "<start_of_turn>", "<start_of_turn>");
            CHECK(dj_tokenizer_bos_id(t) == dj_tokenizer_token_id(t, "<bos>"));
        } else {
            check_one_token(t, "Hello", "Hello");
            check_one_token(t, " world", "\xC4\xA0world");
        }
        if (k == 1) check_one_token(t, "<|begin_of_text|>", "<|begin_of_text|>");
        if (k == 2) check_one_token(t, "<|im_start|>", "<|im_start|>");
        for (size_t i = 0; i < ns; i++) {
            /* byte-level BPE without a normalizer is lossless; with Llama 2's
             * Prepend/Strip it is too, where no special token splits the text */
            if (k == 1 || k == 3 || (k == 0 && !has_special_text(strs[i]))) check_roundtrip(t, names[k], strs[i]);
        }
        char buf[256];
        for (int r = 0; r < 40; r++) {
            random_text(buf, sizeof buf);
            check_roundtrip(t, names[k], buf); /* NFC leaves these scripts as they are */
        }
        uint32_t vs = dj_tokenizer_vocab_size(t);
        test_stream_random(t, names[k], 0, (int32_t)vs, 30);
        if (k == 0) test_stream_random(t, "llama2 bytes", 3, 3 + 256, 30);
        if (k == 3) test_stream_random(t, "gemma3 bytes", 238, 238 + 256, 30); /* <0x00>..<0xFF> */
        check_speed(t, names[k], strs, ns);
        dj_tokenizer_free(t);
    }
    for (size_t i = 0; i < ns; i++) free(strs[i]);
    free(strs);
}

/* The demo model's tokenizer (trained with the tokenizers library on the
 * man-page corpus) against that library's encodings. */
static void test_demo(void) {
    dj_tokenizer_t *t = NULL;
    dj_status st = dj_tokenizer_load(DJ_SOURCE_DIR "/models/demo/tokenizer.json", &t);
    CHECK_MSG(st == DJ_OK, "loading models/demo/tokenizer.json: %s", dj_last_error());
    if (!t) return;
    CHECK(dj_tokenizer_vocab_size(t) == 4096);
    CHECK(dj_tokenizer_bos_id(t) == 0);
    check_refs(t, "demo");
    test_stream_random(t, "demo", 0, 4096, 30);
    dj_tokenizer_free(t);
}

/* llama.cpp's vocabulary files (scripts/fetch_tokenizers.sh): the
 * tokenizer we build from <name>.gguf (tokenizer.h: as transformers'
 * LlamaConverter would) against the ids that Hugging Face's AutoTokenizer
 * gave for its test strings (<name>.gguf.inp: the strings, each followed by
 * "\n__ggml_vocab_test__\n"; .out: one line of ids per string, encoded
 * without special tokens). Every string must match; the count is printed. */
static void test_gguf_vocab(const char *dir, const char *name, size_t want_n) {
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizers/%s/%s.gguf", DJ_THIRD_PARTY, dir, name);
    dj_tokenizer_t *t = NULL;
    dj_status st = dj_tokenizer_load(path, &t);
    CHECK_MSG(st == DJ_OK, "%s: %s (run scripts/fetch_tokenizers.sh)", path, dj_last_error());
    if (st != DJ_OK) return;
    snprintf(path, sizeof path, "%s/tokenizers/%s/%s.gguf.inp", DJ_THIRD_PARTY, dir, name);
    char *inp = dj_test_read_file(path, NULL);
    snprintf(path, sizeof path, "%s/tokenizers/%s/%s.gguf.out", DJ_THIRD_PARTY, dir, name);
    char *outs = dj_test_read_file(path, NULL);
    CHECK(inp && outs);
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t n = 0, same = 0;
    char *text = inp, *line = outs;
    for (char *end; text && line && (end = strstr(text, sep)); text = end + sizeof sep - 1, n++) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        int32_t want[512];
        size_t nw = 0;
        for (char *q = line, *e; nw < 512; q = e) {
            long v = strtol(q, &e, 10);
            if (e == q) break;
            want[nw++] = (int32_t)v;
        }
        int32_t *ids = NULL;
        size_t ni = 0;
        st = dj_tokenizer_encode(t, text, (size_t)(end - text), false, &ids, &ni);
        const bool ok = st == DJ_OK && ni == nw && (nw == 0 || !memcmp(ids, want, nw * sizeof *ids));
        same += ok;
        CHECK_MSG(ok, "%s string %zu ('%.*s'): %zu ids, want %zu (first %d vs %d)", name, n, (int)(end - text), text,
                  ni, nw, ni ? ids[0] : -1, nw ? want[0] : -1);
        free(ids);
        line = nl ? nl + 1 : NULL;
    }
    CHECK_MSG(n == want_n, "%s: %zu test strings, want %zu", name, n, want_n);
    printf("%s: %zu of %zu of llama.cpp's test strings encode to HF's ids\n", name, same, n);
    /* the ids decode back (SentencePiece drops the leading space it added) */
    int32_t *ids = NULL;
    size_t ni = 0;
    char *back = NULL;
    CHECK_OK(dj_tokenizer_encode(t, "Hello world", 11, true, &ids, &ni));
    CHECK(ni == 3 && ids[0] == dj_tokenizer_bos_id(t));
    CHECK_OK(dj_tokenizer_decode(t, ids + 1, ni - 1, &back));
    CHECK_MSG(back && !strcmp(back, "Hello world"), "%s: decodes to '%s'", name, back ? back : "");
    free(back);
    free(ids);
    free(inp);
    free(outs);
    dj_tokenizer_free(t);
}

/* Refusals of GGUF input: not GGUF, truncated, another tokenizer model. */
static void test_gguf_bad(void) {
    char path[] = "/tmp/dj_gguf_XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    CHECK(fd >= 0);
    if (fd < 0) return;
    dj_tokenizer_t *t = NULL;
    /* header, 0 tensors, 1 key: tokenizer.ggml.model = "gpt2" */
    static const char gpt2[] = "GGUF\x03\0\0\0" "\0\0\0\0\0\0\0\0" "\x01\0\0\0\0\0\0\0"
                               "\x14\0\0\0\0\0\0\0tokenizer.ggml.model" "\x08\0\0\0" "\x04\0\0\0\0\0\0\0gpt2";
    struct {
        const char *bytes;
        size_t n;
        dj_status st;
        const char *needle;
    } cases[] = {{"GGML", 4, DJ_EFORMAT, "not a GGUF file"},
                 {gpt2, sizeof gpt2 - 1, DJ_EUNSUPPORTED, "'gpt2'"},
                 {gpt2, sizeof gpt2 - 3, DJ_EFORMAT, "past the end"},
                 {gpt2, 24, DJ_EFORMAT, "past the end"},
                 {"GGUF\x01\0\0\0", 8, DJ_EUNSUPPORTED, "version 1"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK(ftruncate(fd, 0) == 0 && pwrite(fd, cases[i].bytes, cases[i].n, 0) == (ssize_t)cases[i].n);
        const dj_status st = dj_tokenizer_load(path, &t);
        CHECK_MSG(st == cases[i].st && strstr(dj_last_error(), cases[i].needle), "case %zu: %s '%s'", i,
                  dj_status_name(st), dj_last_error());
        dj_tokenizer_free(t);
        t = NULL;
    }
    close(fd);
    unlink(path);
    /* the fuzzer's seed: a hand-made vocabulary of 12 pieces, one of them
     * llama.cpp's "[PAD11]" filler (left out), a control token in the text */
    CHECK_OK(dj_tokenizer_load(DJ_SOURCE_DIR "/fuzz/seeds/fuzz_tok_gguf/tiny.gguf", &t));
    if (!t) return;
    CHECK(dj_tokenizer_vocab_size(t) == 11 && dj_tokenizer_token_id(t, "[PAD11]") < 0);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(dj_tokenizer_encode(t, "ab<|end|>\nA", 11, true, &ids, &n));
    /* <s> ▁ab <|end|> ▁ <0x0A> <0x41>: the text after an added token is
     * normalized on its own, so it gets its "▁" too (transformers' legacy Llama) */
    static const int32_t want[] = {1, 9, 10, 5, 3, 4};
    CHECK_MSG(n == 6 && !memcmp(ids, want, sizeof want), "tiny.gguf: %zu ids, first %d", n, n ? ids[0] : -1);
    free(ids);
    dj_tokenizer_free(t);
}

int main(void) {
    dj_test_seed();
    test_bytelevel_bpe();
    test_sentencepiece_bpe();
    test_metaspace();
    test_split();
    test_normalizers();
    test_added_tokens();
    test_post_processors();
    test_bad_input();
    char *j = spm_json("{\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true}");
    dj_tokenizer_t *t = load_str(j);
    free(j);
    test_stream_random(t, "tiny spm", 0, 265, 200);
    dj_tokenizer_free(t);
    test_real();
    test_demo();
    test_gguf_bad();
    test_gguf_vocab("phi3", "ggml-vocab-phi-3", 46);
    test_gguf_vocab("llama2-spm", "ggml-vocab-llama-spm", 46);
    return dj_test_finish("test_tokenizer");
}
