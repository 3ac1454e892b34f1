/* test_http.c: djinnd --http against the binary protocol on the demo model -
 * completions and chat (the model's chat template) equal to the same
 * generation through libdjinn, streamed and not, stop strings, OpenAI errors
 * and limits, bearer tokens and QoS, clients that leave mid-generation,
 * logprobs (the wire's against plain steps' logits, OpenAI's two shapes),
 * prefix reuse (answers equal to a daemon without it, cached_tokens), the
 * engine's prefix cache across conversations sharing a system prompt, and the
 * live view (GET / and GET /v1/djinn/stats against libdjinn's STATS). */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "djinn/client.h"
#include "djinn/sampler.h"
#include "djinn/tokenizer.h"
#include "client_util.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_http_XXXXXX";
static char store[400];

/* Real chat templates on the demo weights: a store directory, the file of
 * third_party/tokenizers it takes (tokenizer_config.json, or Phi-3.5's
 * chat_template.jinja alone), and what jinja2 renders for CHAT_MESSAGES
 * (test_chat_template checks our renderer against jinja2 on these files). */
static const struct {
    const char *dir, *src, *file, *prompt;
} real_chat[] = {
    {"demo-mistral-nemo", "mistral_nemo/tokenizer_config.json", "tokenizer_config.json",
     "<s>[INST]Be brief.\n\n Hello there [/INST]"},
    {"demo-qwen2.5", "qwen2_5/tokenizer_config.json", "tokenizer_config.json",
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hello there <|im_end|>\n<|im_start|>assistant\n"},
    {"demo-phi3.5", "phi3_5/chat_template.jinja", "chat_template.jinja",
     "<|system|>\nBe brief.<|end|>\n<|user|>\n Hello there <|end|>\n<|assistant|>\n"},
};
#define CHAT_MESSAGES                                                                                          \
    "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \" Hello there \"}]"

/* A model store: demo (no chat template), demo-chat (the same weights with
 * a tokenizer_config.json that has one) and the real_chat directories. */
static bool make_store(void) {
    snprintf(store, sizeof store, "%s/store", tmpdir);
    char p[600], q[600];
    if (mkdir(store, 0700)) return false;
    snprintf(p, sizeof p, "%s/demo", store);
    if (symlink(DJ_SOURCE_DIR "/models/demo", p)) return false;
    if (!dj_test_make_demo_chat(store)) return false;
    for (size_t k = 0; k < sizeof real_chat / sizeof *real_chat; k++) {
        snprintf(p, sizeof p, "%s/%s", store, real_chat[k].dir);
        if (!dj_test_link_demo_files(p)) return false;
        snprintf(p, sizeof p, "%s/%s/%s", store, real_chat[k].dir, real_chat[k].file);
        snprintf(q, sizeof q, "%s/tokenizers/%s", DJ_THIRD_PARTY, real_chat[k].src);
        if (access(q, R_OK)) {
            fprintf(stderr, "%s missing: run scripts/fetch_tokenizers.sh\n", q);
            return false;
        }
        if (symlink(q, p)) return false;
    }
    return true;
}

/* djinnd with --http on the store: *addr its listener, *http_port the API's port. */
static pid_t start(int slot, const char *const *extra, char *addr, size_t cap, unsigned *http_port) {
    return dj_test_http_daemon_start(slot, tmpdir, store, extra, addr, cap, http_port);
}

/* The text of a non-streamed answer ("" on failure). */
static char *answer_text(const dj_test_resp *r, bool chat, char *finish, size_t cap, int *completion_tokens) {
    cJSON *j = r->body ? cJSON_Parse(r->body) : NULL;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
    const cJSON *t = chat ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "message"), "content")
                          : cJSON_GetObjectItemCaseSensitive(c, "text");
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "usage"), "completion_tokens");
    if (finish) snprintf(finish, cap, "%s", cJSON_IsString(fr) ? fr->valuestring : "");
    if (completion_tokens) *completion_tokens = cJSON_IsNumber(u) ? u->valueint : -1;
    char *out = strdup(cJSON_IsString(t) ? t->valuestring : "");
    cJSON_Delete(j);
    return out;
}

/* The concatenated deltas of a streamed answer; checks the event framing. */
static char *stream_text(const dj_test_resp *r, bool chat, char *finish, size_t cap, int *completion_tokens) {
    char *out = calloc(1, r->len + 1);
    size_t n = 0;
    bool done = false;
    if (finish) finish[0] = '\0';
    if (completion_tokens) *completion_tokens = -1;
    for (char *line = r->body; line && *line;) {
        char *next = strstr(line, "\n\n");
        if (next) *next = '\0';
        CHECK_MSG(!strncmp(line, "data: ", 6), "not an event: %.80s", line);
        if (!strcmp(line, "data: [DONE]")) done = true;
        else {
            cJSON *j = cJSON_Parse(line + 6);
            const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
            const cJSON *t = chat ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(c, "delta"), "content")
                                  : cJSON_GetObjectItemCaseSensitive(c, "text");
            if (cJSON_IsString(t)) {
                memcpy(out + n, t->valuestring, strlen(t->valuestring));
                n += strlen(t->valuestring);
            }
            const cJSON *fr = cJSON_GetObjectItemCaseSensitive(c, "finish_reason");
            if (cJSON_IsString(fr) && finish) snprintf(finish, cap, "%s", fr->valuestring);
            const cJSON *u = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "usage"), "completion_tokens");
            if (cJSON_IsNumber(u) && completion_tokens) *completion_tokens = u->valueint;
            CHECK_MSG(j != NULL, "event is not JSON: %.80s", line);
            cJSON_Delete(j);
        }
        line = next ? next + 2 : NULL;
    }
    CHECK_MSG(done, "the stream does not end with [DONE]");
    return out;
}

/* ---- the binary protocol's answer for the same ids ---- */
typedef dj_test_text collect; /* client_util.h */
static collect reference(const char *addr, const char *model, const char *text, bool add_bos, uint32_t max_tokens) {
    const dj_sampler_params greedy = {.top_p = 1.0f};
    return dj_test_reference(addr, model, text, add_bos, &greedy, max_tokens);
}

static void test_generation(const char *addr, unsigned port) {
    /* completions: greedy, same text and count as libdjinn on the same ids */
    collect ref = reference(addr, "demo", "Once upon a time", true, 24);
    CHECK(ref.tokens == 24 && ref.n > 0);
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", NULL,
                     "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0}");
    CHECK_MSG(r.status == 200, "status %d: %s", r.status, r.body ? r.body : "");
    char finish[32];
    int ct;
    char *text = answer_text(&r, false, finish, sizeof finish, &ct);
    CHECK_MSG(!strcmp(text, ref.text), "http '%s' vs binary '%s'", text, ref.text);
    CHECK(!strcmp(finish, "length") && ct == 24);
    CHECK(strstr(r.body, "\"prompt_tokens\"") && strstr(r.body, "\"object\":\"text_completion\""));
    free(text);
    dj_test_resp_free(&r);

    r = dj_test_http_request(port, "POST", "/v1/completions", NULL,
                "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0, "
                "\"stream\": true, \"stream_options\": {\"include_usage\": true}}");
    CHECK(r.status == 200);
    text = stream_text(&r, false, finish, sizeof finish, &ct);
    CHECK_MSG(!strcmp(text, ref.text), "stream '%s' vs binary '%s'", text, ref.text);
    CHECK(!strcmp(finish, "length") && ct == 24);
    free(text);
    dj_test_resp_free(&r);

    /* stop strings, cut and trimmed, streamed and not (the stream holds back
     * what may begin one): a piece from the middle of the reference */
    const size_t at = ref.n / 2;
    char stop[8] = "";
    memcpy(stop, ref.text + at, 3);
    char *want = strndup(ref.text, (size_t)(strstr(ref.text, stop) - ref.text));
    for (int stream = 0; stream < 2; stream++) {
        char body[512];
        snprintf(body, sizeof body, "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 24, "
                                    "\"temperature\": 0, \"stop\": [\"never-there\", \"%s\"], \"stream\": %s}",
                 stop, stream ? "true" : "false");
        r = dj_test_http_request(port, "POST", "/v1/completions", NULL, body);
        CHECK(r.status == 200);
        text = stream ? stream_text(&r, false, finish, sizeof finish, NULL) : answer_text(&r, false, finish, sizeof finish, NULL);
        CHECK_MSG(!strcmp(text, want) && !strcmp(finish, "stop"), "stop '%s' (stream %d): got '%s' (%s), want '%s'",
                  stop, stream, text, finish, want);
        free(text);
        dj_test_resp_free(&r);
    }
    free(want);

    /* chat: the model's template, no second BOS; both forms */
    collect cref = reference(addr, "demo-chat", "<|bos|>system: Be brief.\nuser: Hello there\nassistant:", false, 16);
    const char *chat = "{\"model\": \"demo-chat\", \"max_completion_tokens\": 16, \"temperature\": 0, \"messages\": "
                       "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
                       "\" Hello there \"}]%s}";
    char body[1024];
    snprintf(body, sizeof body, chat, "");
    r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, body);
    CHECK_MSG(r.status == 200, "chat status %d: %s", r.status, r.body ? r.body : "");
    text = answer_text(&r, true, finish, sizeof finish, &ct);
    CHECK_MSG(!strcmp(text, cref.text), "chat '%s' vs binary '%s'", text, cref.text);
    CHECK(strstr(r.body, "\"role\":\"assistant\"") && strstr(r.body, "\"object\":\"chat.completion\""));
    free(text);
    dj_test_resp_free(&r);
    snprintf(body, sizeof body, chat, ", \"stream\": true");
    r = dj_test_http_request(port, "POST", "/v1/chat/completions", "X-Djinn-QoS: batch\r\n", body);
    CHECK(r.status == 200);
    text = stream_text(&r, true, finish, sizeof finish, NULL);
    CHECK_MSG(!strcmp(text, cref.text), "chat stream '%s' vs binary '%s'", text, cref.text);
    CHECK(r.body && strstr(r.body, "\"delta\":{\"role\":\"assistant\"") != NULL);
    free(text);
    dj_test_resp_free(&r);

    /* real templates (Mistral-Nemo, Qwen2.5, Phi-3.5) on the demo weights:
     * the answer to jinja2's rendering of the chat */
    dj_tokenizer_t *demo_tok = NULL;
    CHECK_OK(dj_tokenizer_load(DJ_SOURCE_DIR "/models/demo/tokenizer.json", &demo_tok));
    for (size_t k = 0; demo_tok && k < sizeof real_chat / sizeof *real_chat; k++) {
        collect want = reference(addr, real_chat[k].dir, real_chat[k].prompt, false, 16);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        CHECK_OK(dj_tokenizer_encode(demo_tok, real_chat[k].prompt, strlen(real_chat[k].prompt), false, &ids, &n_ids));
        free(ids);
        snprintf(body, sizeof body,
                 "{\"model\": \"%s\", \"max_tokens\": 16, \"temperature\": 0, \"messages\": " CHAT_MESSAGES "}",
                 real_chat[k].dir);
        r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, body);
        CHECK_MSG(r.status == 200, "%s: chat status %d: %s", real_chat[k].dir, r.status, r.body ? r.body : "");
        text = answer_text(&r, true, NULL, 0, &ct);
        CHECK_MSG(want.tokens == 16 && ct == 16 && !strcmp(text, want.text), "%s: chat '%s' vs binary '%s'",
                  real_chat[k].dir, text, want.text);
        /* the prompt was as many tokens as jinja2's rendering */
        cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
        const cJSON *pt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "usage"), "prompt_tokens");
        CHECK_MSG(cJSON_IsNumber(pt) && pt->valueint == (int)n_ids, "%s: prompt_tokens %d, jinja2's rendering is %zu",
                  real_chat[k].dir, cJSON_IsNumber(pt) ? pt->valueint : -1, n_ids);
        cJSON_Delete(j);
        free(text);
        dj_test_resp_free(&r);
    }
    dj_tokenizer_free(demo_tok);

    /* sampled with a seed: the same twice */
    const char *seeded = "{\"model\": \"demo\", \"prompt\": [\"The\"], \"max_tokens\": 12, \"temperature\": 0.9, "
                         "\"top_p\": 0.9, \"seed\": 7, \"presence_penalty\": 0.5, \"frequency_penalty\": 0.3}";
    dj_test_resp a = dj_test_http_request(port, "POST", "/v1/completions", NULL, seeded), b = dj_test_http_request(port, "POST", "/v1/completions", NULL, seeded);
    char *ta = answer_text(&a, false, NULL, 0, NULL), *tb = answer_text(&b, false, NULL, 0, NULL);
    CHECK_MSG(a.status == 200 && !strcmp(ta, tb), "seeded: '%s' vs '%s'", ta, tb);
    free(ta);
    free(tb);
    dj_test_resp_free(&a);
    dj_test_resp_free(&b);

    r = dj_test_http_request(port, "GET", "/v1/models", NULL, NULL);
    CHECK(r.status == 200 && r.body && strstr(r.body, "\"id\":\"demo-chat\"") && strstr(r.body, "\"object\":\"list\""));
    dj_test_resp_free(&r);
}

/* ---- logprobs ---- */

/* The wire: a sampled generation's TOKEN logprobs (temperature, top-p and
 * penalties on, so the picks run through the sampler) equal the log_softmax
 * of the raw logits that plain steps of the same ids leave behind. */
static void test_logprobs_wire(const char *addr) {
    enum { VOCAB = 4096, N = 10, TOP = 5 };
    static float logits[VOCAB];
    dj_client_t *c = NULL;
    uint64_t s1 = 0, s2 = 0;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    const dj_session_opts so = {"demo", DJ_QOS_INTERACTIVE, 0};
    if (c) CHECK_OK(dj_client_session_open(c, &so, &s1));
    if (c) CHECK_OK(dj_client_session_open(c, &so, &s2));
    if (!s1 || !s2) {
        dj_client_free(c);
        return;
    }
    const int32_t prompt[] = {1, 300, 301, 302, 303};
    dj_generate_params gp = {.ids = prompt, .n_ids = 5, .max_tokens = N, .ignore_eos = true, .logprobs = true,
                             .top_logprobs = TOP,
                             .sampling = {.temperature = 0.8f, .top_p = 0.95f, .seed = 11, .presence_penalty = 0.4f}};
    dj_client_gen_t *g = NULL;
    int32_t ids[N];
    dj_token_logprobs lps[N];
    int n = 0;
    CHECK_OK(dj_client_generate_start(c, s1, &gp, &g));
    for (dj_client_event ev; g && dj_client_generate_next(g, -1, &ev, NULL) == DJ_OK;) {
        if (ev.kind == DJ_CLIENT_EVENT_TOKEN && n < N) {
            CHECK_MSG(ev.has_logprobs && ev.lp.id == ev.id && ev.lp.n_top == TOP, "token %d: no logprobs", n);
            ids[n] = ev.id;
            lps[n++] = ev.lp;
        }
        if (ev.kind == DJ_CLIENT_EVENT_DONE) break;
    }
    dj_client_generate_end(g);
    CHECK_MSG(n == N, "%d tokens, want %d", n, N);
    double worst = 0;
    for (int t = 0; t < n; t++) {
        dj_remote_tensor rt;
        size_t got = 0;
        CHECK_OK(t ? dj_client_step(c, s2, &ids[t - 1], 1, true, &rt) : dj_client_step(c, s2, prompt, 5, true, &rt));
        CHECK_OK(dj_client_fetch(c, rt.handle, 0, UINT64_MAX, logits, sizeof logits, &got));
        CHECK_OK(dj_client_release(c, rt.handle));
        CHECK(got == sizeof logits);
        dj_token_logprobs want;
        dj_logprobs_of(logits, VOCAB, ids[t], TOP, &want);
        double d = fabs((double)want.logprob - lps[t].logprob);
        for (int k = 0; k < TOP; k++) {
            CHECK_MSG(want.top_id[k] == lps[t].top_id[k], "token %d: alternative %d is %d, want %d", t, k,
                      lps[t].top_id[k], want.top_id[k]);
            const double dk = fabs((double)want.top_logprob[k] - lps[t].top_logprob[k]);
            d = dk > d ? dk : d;
        }
        worst = d > worst ? d : worst;
        CHECK(lps[t].top_logprob[0] >= lps[t].logprob); /* sampled: not always the best */
    }
    CHECK_MSG(worst < 1e-3, "logprobs differ from the steps' by %g", worst);
    /* bounds: the daemon refuses what the front end would */
    gp.top_logprobs = DJ_MAX_TOP_LOGPROBS + 1;
    CHECK_OK(dj_client_generate_start(c, s1, &gp, &g));
    dj_client_event ev;
    CHECK(g && dj_client_generate_next(g, -1, &ev, NULL) != DJ_OK && strstr(dj_last_error(), "top_logprobs"));
    dj_client_generate_end(g);
    dj_client_free(c);
}

/* The bytes a chat logprob entry names, appended to out; checks its shape. */
static void entry_check(const cJSON *e, bool top, char *out, size_t *n, size_t cap) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "token"), *lp = cJSON_GetObjectItemCaseSensitive(e, "logprob");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(e, "bytes"), *x;
    CHECK(cJSON_IsString(t) && cJSON_IsNumber(lp) && lp->valuedouble <= 0 && cJSON_IsArray(b));
    CHECK(top == (cJSON_GetObjectItemCaseSensitive(e, "top_logprobs") != NULL));
    size_t k = 0;
    char tb[64];
    cJSON_ArrayForEach(x, b) if (k < sizeof tb) tb[k++] = (char)x->valueint;
    if (cJSON_IsString(t) && strncmp(t->valuestring, "bytes:", 6))
        CHECK_MSG(k == strlen(t->valuestring) && !memcmp(tb, t->valuestring, k), "token '%s' and its bytes differ",
                  t->valuestring);
    if (out && *n + k < cap) {
        memcpy(out + *n, tb, k);
        *n += k;
        out[*n] = '\0';
    }
}

/* Every chat logprobs.content entry of a response or stream, in order, as one array. */
static cJSON *chat_entries(const dj_test_resp *r, bool stream) {
    cJSON *all = cJSON_CreateArray();
    for (char *line = r->body; line && *line;) {
        char *next = stream ? strstr(line, "\n\n") : NULL;
        if (next) *next = '\0';
        cJSON *j = cJSON_Parse(stream ? line + 6 : line);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        const cJSON *lp = cJSON_GetObjectItemCaseSensitive(c, "logprobs"), *e;
        CHECK(!c || lp != NULL);
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(lp, "content"))
            cJSON_AddItemToArray(all, cJSON_Duplicate(e, true));
        cJSON_Delete(j);
        if (next) *next = '\n';
        line = next ? next + 2 : NULL;
    }
    return all;
}

/* The front end: OpenAI's shapes for chat and completions, streamed chunks
 * carrying the same entries as the whole answer, greedy picks the best. */
static void test_logprobs_http(unsigned port) {
    const char *chat = "{\"model\": \"demo-chat\", \"max_completion_tokens\": 12, \"temperature\": 0, \"logprobs\": "
                       "true, \"top_logprobs\": 3, \"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]%s}";
    char body[512];
    snprintf(body, sizeof body, chat, "");
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, body);
    CHECK_MSG(r.status == 200, "chat logprobs: %d %s", r.status, r.body ? r.body : "");
    int ct = 0;
    char *text = answer_text(&r, true, NULL, 0, &ct);
    cJSON *whole = chat_entries(&r, false);
    CHECK_MSG(cJSON_GetArraySize(whole) == ct && ct > 0, "%d entries for %d tokens", cJSON_GetArraySize(whole), ct);
    char joined[4096] = "";
    size_t jn = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, whole) {
        entry_check(e, true, joined, &jn, sizeof joined);
        const cJSON *tops = cJSON_GetObjectItemCaseSensitive(e, "top_logprobs"), *x;
        CHECK(cJSON_GetArraySize(tops) == 3);
        double prev = 0;
        cJSON_ArrayForEach(x, tops) {
            entry_check(x, false, NULL, NULL, 0);
            const double v = cJSON_GetObjectItemCaseSensitive(x, "logprob")->valuedouble;
            CHECK(x == tops->child || v <= prev);
            prev = v;
        }
        const cJSON *best = tops->child;
        CHECK_MSG(best && cJSON_GetObjectItemCaseSensitive(e, "logprob")->valuedouble ==
                              cJSON_GetObjectItemCaseSensitive(best, "logprob")->valuedouble &&
                      !strcmp(cJSON_GetObjectItemCaseSensitive(e, "token")->valuestring,
                              cJSON_GetObjectItemCaseSensitive(best, "token")->valuestring),
                  "greedy: the picked token is not the best alternative");
    }
    CHECK_MSG(!strcmp(joined, text), "tokens '%s' vs text '%s'", joined, text);
    free(text);
    dj_test_resp_free(&r);
    snprintf(body, sizeof body, chat, ", \"stream\": true");
    r = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, body);
    CHECK(r.status == 200);
    cJSON *streamed = chat_entries(&r, true);
    CHECK_MSG(cJSON_Compare(whole, streamed, true), "streamed logprobs differ from the answer's");
    cJSON_Delete(streamed);
    cJSON_Delete(whole);
    dj_test_resp_free(&r);

    /* completions: logprobs N, the legacy arrays; streamed the same */
    const char *cmpl = "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 10, \"temperature\": 0, "
                       "\"logprobs\": 2%s}";
    cJSON *lp[2] = {NULL, NULL};
    for (int stream = 0; stream < 2; stream++) {
        snprintf(body, sizeof body, cmpl, stream ? ", \"stream\": true" : "");
        r = dj_test_http_request(port, "POST", "/v1/completions", NULL, body);
        CHECK(r.status == 200);
        lp[stream] = cJSON_CreateObject();
        static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
        for (int k = 0; k < 4; k++) cJSON_AddArrayToObject(lp[stream], keys[k]);
        for (char *line = r.body; line && *line;) {
            char *next = stream ? strstr(line, "\n\n") : NULL;
            if (next) *next = '\0';
            cJSON *j = cJSON_Parse(stream ? line + 6 : line);
            const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
            const cJSON *l = cJSON_GetObjectItemCaseSensitive(c, "logprobs"), *x;
            for (int k = 0; k < 4 && cJSON_IsObject(l); k++)
                cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(l, keys[k]))
                    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(lp[stream], keys[k]), cJSON_Duplicate(x, true));
            cJSON_Delete(j);
            line = next ? next + 2 : NULL;
        }
        const cJSON *toks = cJSON_GetObjectItemCaseSensitive(lp[stream], "tokens");
        const cJSON *tops = cJSON_GetObjectItemCaseSensitive(lp[stream], "top_logprobs");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(lp[stream], "text_offset"), *x;
        CHECK_MSG(cJSON_GetArraySize(toks) == 10 && cJSON_GetArraySize(tops) == 10 && cJSON_GetArraySize(offs) == 10 &&
                      cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(lp[stream], "token_logprobs")) == 10,
                  "completion logprobs (stream %d): %d tokens", stream, cJSON_GetArraySize(toks));
        double prev = 0;
        cJSON_ArrayForEach(x, offs) {
            CHECK(x->valuedouble >= prev && (x != offs->child || x->valuedouble == 0));
            prev = x->valuedouble;
        }
        cJSON_ArrayForEach(x, tops) CHECK(cJSON_IsObject(x) && cJSON_GetArraySize(x) >= 1 && cJSON_GetArraySize(x) <= 3);
        dj_test_resp_free(&r);
    }
    CHECK_MSG(cJSON_Compare(lp[0], lp[1], true), "streamed completion logprobs differ from the answer's");
    cJSON_Delete(lp[0]);
    cJSON_Delete(lp[1]);

    /* a stop string: no logprobs for tokens past the cut */
    r = dj_test_http_request(port, "POST", "/v1/completions", NULL,
                             "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 10, "
                             "\"temperature\": 0, \"logprobs\": 0}");
    text = answer_text(&r, false, NULL, 0, NULL);
    dj_test_resp_free(&r);
    if (strlen(text) > 4) {
        char stop_body[512];
        snprintf(stop_body, sizeof stop_body, "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 10, "
                 "\"temperature\": 0, \"logprobs\": 0, \"stop\": \"%.2s\"}", text + strlen(text) - 2);
        r = dj_test_http_request(port, "POST", "/v1/completions", NULL, stop_body);
        char *cut = answer_text(&r, false, NULL, 0, NULL);
        cJSON *j = cJSON_Parse(r.body ? r.body : "");
        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0), "logprobs"),
            "text_offset"), *x;
        CHECK(cJSON_GetArraySize(offs) > 0);
        cJSON_ArrayForEach(x, offs) CHECK_MSG(x->valuedouble < (double)strlen(cut) || !cut[0], "a token past the stop");
        cJSON_Delete(j);
        free(cut);
        dj_test_resp_free(&r);
    }
    free(text);
}

/* ---- prefix reuse (--http-reuse) ---- */

/* A completion of token ids on port: its text, usage's cached_tokens. */
static char *ids_completion(unsigned port, const int32_t *ids, size_t n, const char *extra, int *cached) {
    char *body = malloc(64 * n + 512);
    int k = sprintf(body, "{\"model\": \"demo\", \"max_tokens\": 8, \"prompt\": [");
    for (size_t i = 0; i < n; i++) k += sprintf(body + k, "%s%d", i ? ", " : "", ids[i]);
    sprintf(body + k, "]%s}", extra);
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", NULL, body);
    free(body);
    CHECK_MSG(r.status == 200, "ids completion: %d %s", r.status, r.body ? r.body : "");
    const bool stream = strstr(extra, "\"stream\": true") != NULL;
    *cached = -1;
    const char *c = r.body ? strstr(r.body, "\"cached_tokens\":") : NULL;
    if (c) *cached = atoi(c + 16);
    int ct;
    char *text = stream ? stream_text(&r, false, NULL, 0, &ct) : answer_text(&r, false, NULL, 0, &ct);
    dj_test_resp_free(&r);
    return text;
}

/* The greedy ids of a prompt through libdjinn (to build the next turn). */
static size_t greedy_ids(const char *addr, const int32_t *ids, size_t n, uint32_t max, int32_t *out) {
    dj_client_t *c = NULL;
    uint64_t s = 0;
    size_t k = 0;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    const dj_session_opts so = {"demo", DJ_QOS_INTERACTIVE, 0};
    if (c) CHECK_OK(dj_client_session_open(c, &so, &s));
    dj_generate_params gp = {.ids = ids, .n_ids = n, .max_tokens = max, .sampling = {.top_p = 1.0f}};
    dj_client_gen_t *g = NULL;
    if (s) CHECK_OK(dj_client_generate_start(c, s, &gp, &g));
    for (dj_client_event ev; g && dj_client_generate_next(g, -1, &ev, NULL) == DJ_OK && ev.kind != DJ_CLIENT_EVENT_DONE;)
        if (ev.kind == DJ_CLIENT_EVENT_TOKEN && k < max) out[k++] = ev.id;
    dj_client_generate_end(g);
    dj_client_free(c);
    return k;
}

static size_t idle_sessions(const char *addr) {
    dj_client_t *c = NULL;
    dj_client_stats st;
    size_t n = 99;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (c && dj_client_stats_get(c, &st) == DJ_OK) {
        n = st.n_sessions;
        dj_client_stats_free(&st);
    }
    dj_client_free(c);
    return n;
}

/* A conversation of three turns, each prompt the last one's tokens plus its
 * answer plus more: from the second turn on the kept session is reused
 * (usage's cached_tokens = the tokens it held) and every answer, greedy,
 * sampled or streamed, equals that of a daemon without reuse (ref_port);
 * then a chat of three turns the same way. */
static void test_reuse(const char *ref_addr, unsigned ref_port) {
    char addr[128];
    unsigned port = 0;
    const char *extra[] = {"--http-reuse", "2", "--prefix-cache", "off", "--local-admin", NULL}; /* every session */
    pid_t pid = start(2, extra, addr, sizeof addr, &port);
    CHECK_MSG(pid > 0 && port > 0, "djinnd --http-reuse 2 did not start");
    if (pid <= 0 || !port) return;
    int32_t ids[64] = {1, 300, 301, 302, 303};
    size_t n = 5;
    static const char *const modes[] = {", \"temperature\": 0",
                                        ", \"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}",
                                        ", \"temperature\": 0.8, \"seed\": 5, \"presence_penalty\": 0.5"};
    for (int turn = 0; turn < 3; turn++) {
        int cached = -1, ref_cached = -1;
        const size_t held = n; /* before this turn: the last prompt and its answer */
        char *got = ids_completion(port, ids, n, modes[turn], &cached);
        char *want = ids_completion(ref_port, ids, n, modes[turn], &ref_cached);
        CHECK_MSG(!strcmp(got, want), "turn %d: with reuse '%s', without '%s'", turn, got, want);
        CHECK_MSG(ref_cached == 0, "turn %d: reuse off, yet %d cached tokens", turn, ref_cached);
        if (turn == 0) CHECK_MSG(cached == 0, "turn 0: %d cached tokens", cached);
        else CHECK_MSG(cached == (int)held - 3, "turn %d: %d cached tokens, want %zu", turn, cached, held - 3);
        free(got);
        free(want);
        /* the next prompt: this one, its (greedy) answer, 3 more */
        if (turn < 2) {
            n += greedy_ids(ref_addr, ids, n, 8, ids + n);
            for (int k = 0; k < 3; k++) ids[n++] = 400 + 10 * turn + k;
        }
    }
    /* chat: the template renders each answer back to the ids it was
     * generated as (demo-chat's writes the content trimmed, then a newline),
     * so each turn reuses the last: cached = the last prompt + answer */
    char msgs[2048] = "{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hello there\"}";
    int last_total = 0;
    for (int turn = 0; turn < 3; turn++) {
        char body[4096];
        snprintf(body, sizeof body, "{\"model\": \"demo-chat\", \"max_tokens\": 12, \"temperature\": 0, \"messages\": [%s]}",
                 msgs);
        dj_test_resp a = dj_test_http_request(port, "POST", "/v1/chat/completions", NULL, body);
        dj_test_resp b = dj_test_http_request(ref_port, "POST", "/v1/chat/completions", NULL, body);
        int ct = 0;
        const char *c = a.body ? strstr(a.body, "\"cached_tokens\":") : NULL, *pt = a.body ? strstr(a.body, "\"total_tokens\":") : NULL;
        const int cached_chat = c ? atoi(c + 16) : -1, total = pt ? atoi(pt + 15) : -1;
        char *got = answer_text(&a, true, NULL, 0, &ct), *want = answer_text(&b, true, NULL, 0, NULL);
        CHECK_MSG(a.status == 200 && !strcmp(got, want), "chat turn %d: with reuse '%s', without '%s'", turn, got, want);
        CHECK_MSG(cached_chat == last_total, "chat turn %d: %d cached tokens, want %d", turn, cached_chat, last_total);
        last_total = total;
        CHECK_MSG(!strpbrk(got, "\"\\\n"), "chat turn %d: the answer needs JSON escapes: '%s'", turn, got);
        const size_t k = strlen(msgs);
        snprintf(msgs + k, sizeof msgs - k, ", {\"role\": \"assistant\", \"content\": \"%s\"}, {\"role\": \"user\", "
                 "\"content\": \"Tell me more\"}", got);
        free(got);
        free(want);
        dj_test_resp_free(&a);
        dj_test_resp_free(&b);
    }
    /* what does not match is not reused: other ids, another class */
    int cached = -1;
    const int32_t other[] = {1, 300, 999, 302, 303, 304};
    free(ids_completion(port, other, 6, ", \"temperature\": 0", &cached));
    CHECK_MSG(cached == 0, "another prefix: %d cached", cached);
    int32_t longer[64];
    memcpy(longer, ids, n * sizeof *ids);
    longer[n] = 7;
    free(ids_completion(port, longer, n + 1, ", \"temperature\": 0, \"qos\": \"batch\"", &cached));
    CHECK_MSG(cached == 0, "another QoS class: %d cached", cached);
    /* at most --http-reuse sessions are kept */
    CHECK_MSG(idle_sessions(addr) == 2, "%zu sessions kept, want 2", idle_sessions(addr));
    CHECK(dj_test_daemon_stop(2, 10000) == 0);
}

/* ---- the engine's prefix cache, and the live view ---- */

static void expect_error(unsigned port, const char *method, const char *path, const char *headers, const char *body,
                         int status, const char *needle);

static cJSON *get_json(unsigned port, const char *path) {
    dj_test_resp r = dj_test_http_request(port, "GET", path, NULL, NULL);
    CHECK_MSG(r.status == 200, "GET %s: %d %s", path, r.status, r.body ? r.body : "");
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    CHECK_MSG(j != NULL, "GET %s: not JSON", path);
    dj_test_resp_free(&r);
    return j;
}

static double num_at(const cJSON *o, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) v = cJSON_GetObjectItemCaseSensitive(v, b);
    return cJSON_IsNumber(v) ? v->valuedouble : -1.0;
}

/* Two conversations sharing a 200-token system prompt on a daemon with the
 * prefix cache (and no kept sessions): the second maps the three full
 * 64-token KV blocks of the first (usage's cached_tokens = 192), and both
 * answer as the reference daemon does, greedy and streamed. Then the view:
 * GET /v1/djinn/stats says what libdjinn's STATS says (segments, pages,
 * models, sessions, the prefix cache), and GET / is the page polling it. */
static void test_prefix_cache(const char *ref_addr, unsigned ref_port) {
    (void)ref_addr;
    char addr[128];
    unsigned port = 0;
    const char *extra[] = {"--http-reuse", "0", "--local-admin", NULL}; /* the daemon-wide view */
    pid_t pid = start(3, extra, addr, sizeof addr, &port);
    CHECK_MSG(pid > 0 && port > 0, "djinnd with the prefix cache did not start");
    if (pid <= 0 || !port) return;
    int32_t ids[256];
    for (int i = 0; i < 200; i++) ids[i] = 5 + (i * 37) % 4000;
    static const char *const modes[] = {", \"temperature\": 0",
                                        ", \"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}",
                                        ", \"temperature\": 0.7, \"seed\": 9"};
    for (int conv = 0; conv < 4; conv++) {
        for (int k = 0; k < 6; k++) ids[200 + k] = 600 + 31 * conv + k;
        int cached = -1, ref_cached = -1;
        char *got = ids_completion(port, ids, 206, modes[conv % 3], &cached);
        char *want = ids_completion(ref_port, ids, 206, modes[conv % 3], &ref_cached);
        CHECK_MSG(!strcmp(got, want), "conversation %d: with the prefix cache '%s', without '%s'", conv, got, want);
        CHECK_MSG(cached == (conv ? 192 : 0) && ref_cached == 0, "conversation %d: %d cached tokens (reference %d)",
                  conv, cached, ref_cached);
        free(got);
        free(want);
    }
    /* a session held open through libdjinn shows in the view */
    dj_client_t *cl = NULL;
    uint64_t sid = 0;
    CHECK_OK(dj_client_connect(addr, NULL, &cl));
    const dj_session_opts so = {"demo", DJ_QOS_INTERACTIVE, 0};
    if (cl) CHECK_OK(dj_client_session_open(cl, &so, &sid));
    dj_remote_tensor t;
    if (sid) CHECK_OK(dj_client_step(cl, sid, ids, 70, false, &t));
    cJSON *j = get_json(port, "/v1/djinn/stats");
    const cJSON *sg = cJSON_GetObjectItemCaseSensitive(j, "segments");
    const double text_cap = num_at(sg, "text", "capacity");
    dj_client_stats st;
    memset(&st, 0, sizeof st);
    if (cl) CHECK_OK(dj_client_stats_get(cl, &st));
    static const char *const segs[] = {"text", "data", "stack"};
    const dj_client_seg *seg[] = {&st.text, &st.data, &st.stack};
    for (int i = 0; i < 3; i++)
        CHECK_MSG(num_at(sg, segs[i], "capacity") == (double)seg[i]->capacity && seg[i]->capacity > 0,
                  "view: %s capacity %.0f, STATS %llu", segs[i], num_at(sg, segs[i], "capacity"),
                  (unsigned long long)seg[i]->capacity);
    CHECK(num_at(sg, "text", "used") == (double)st.text.used && st.text.used > 0);
    CHECK(num_at(j, "pages", "total") == (double)st.pages_total && num_at(j, "pages", "bytes") == 65536);
    const cJSON *px = cJSON_GetObjectItemCaseSensitive(j, "prefix_cache");
    CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(px, "enabled")) && st.prefix.enabled);
    CHECK_MSG(num_at(px, "hits", NULL) == (double)st.prefix.hits && st.prefix.hits >= 9 &&
              num_at(px, "tokens_mapped", NULL) == 64.0 * (double)st.prefix.hits &&
              num_at(px, "blocks", NULL) == (double)st.prefix.blocks && st.prefix.blocks >= 3,
              "view: prefix cache %.0f hits, %.0f blocks; STATS %llu, %llu", num_at(px, "hits", NULL),
              num_at(px, "blocks", NULL), (unsigned long long)st.prefix.hits, (unsigned long long)st.prefix.blocks);
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "models"), *m0 = cJSON_GetArrayItem(ms, 0);
    CHECK(cJSON_GetArraySize(ms) == (int)st.n_models && m0 &&
          !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m0, "name")), st.models[0].name));
    const cJSON *ss = cJSON_GetObjectItemCaseSensitive(j, "sessions");
    char idhex[20];
    snprintf(idhex, sizeof idhex, "%016llx", (unsigned long long)sid);
    bool seen = false;
    const cJSON *s;
    cJSON_ArrayForEach(s, ss) {
        if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "id")), idhex)) continue;
        seen = true;
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "residency")), "resident"));
        CHECK(num_at(s, "pos", NULL) == 70 && num_at(s, "kv_bytes", NULL) == 2 * 8 * 65536.0);
        CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(s, "model")), "demo"));
    }
    CHECK_MSG(seen && cJSON_GetArraySize(ss) == (int)st.n_sessions, "view: session %s not listed (%d sessions)",
              idhex, cJSON_GetArraySize(ss));
    CHECK(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "queues"), "interactive") != NULL);
    cJSON_Delete(j);
    dj_client_stats_free(&st);
    dj_client_free(cl);
    /* the reference daemon's cache is off */
    j = get_json(ref_port, "/v1/djinn/stats");
    CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "prefix_cache"), "enabled")));
    cJSON_Delete(j);
    /* the same pushed: count=2 gives two events (the STATS JSON) and ends */
    dj_test_resp r = dj_test_http_request(port, "GET", "/v1/djinn/events?count=2", NULL, NULL);
    int events = 0;
    for (const char *e = r.body; e && (e = strstr(e, "data: ")); e += 6) {
        const char *end = strstr(e, "\n\n");
        cJSON *ev = end ? cJSON_ParseWithLength(e + 6, (size_t)(end - e - 6)) : NULL;
        CHECK_MSG(ev && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(ev, "object")), "djinn.stats") &&
                      num_at(cJSON_GetObjectItemCaseSensitive(ev, "segments"), "text", "capacity") == text_cap,
                  "event %d: %.200s", events, e);
        cJSON_Delete(ev);
        events++;
    }
    CHECK_MSG(r.status == 200 && events == 2, "GET /v1/djinn/events?count=2: %d, %d events", r.status, events);
    dj_test_resp_free(&r);
    expect_error(port, "GET", "/v1/djinn/events?count=0", NULL, NULL, 400, "count=0");
    expect_error(port, "GET", "/v1/djinn/events?count=2x", NULL, NULL, 400, "count=2x");
    expect_error(port, "GET", "/v1/djinn/events?count=-1", NULL, NULL, 400, "count=-1");
    expect_error(port, "GET", "/v1/djinn/events?count=+3", NULL, NULL, 400, "want a number");
    /* the page: HTML listening to the events, nothing fetched from elsewhere */
    r = dj_test_http_request(port, "GET", "/", NULL, NULL);
    CHECK(r.status == 200 && r.body && strstr(r.body, "<!doctype html>") && strstr(r.body, "/v1/djinn/events") &&
          !strstr(r.body, "http://") && !strstr(r.body, "https://") && !strstr(r.body, "src="));
    dj_test_resp_free(&r);
    expect_error(port, "POST", "/v1/djinn/stats", NULL, "{}", 405, "not allowed");
    CHECK(dj_test_daemon_stop(3, 10000) == 0);
}

/* status and OpenAI's error object with the type */
static void expect_error(unsigned port, const char *method, const char *path, const char *headers, const char *body,
                         int status, const char *needle) {
    dj_test_resp r = dj_test_http_request(port, method, path, headers, body);
    cJSON *j = r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "error"), "message");
    CHECK_MSG(r.status == status && cJSON_IsString(m) && strstr(m->valuestring, needle),
              "%s %s %.60s: got %d %s, want %d with '%s'", method, path, body ? body : "", r.status,
              r.body ? r.body : "", status, needle);
    cJSON_Delete(j);
    dj_test_resp_free(&r);
}

static void test_errors(unsigned port) {
    const char *P = "/v1/completions";
    expect_error(port, "POST", P, NULL, "{not json", 400, "not valid JSON");
    expect_error(port, "POST", P, NULL, "[1]", 400, "JSON object");
    expect_error(port, "POST", P, NULL, "{\"prompt\": \"x\"}", 400, "'model'");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"temperature\": \"hot\"}", 400, "'temperature'");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"temperature\": 3}", 400, "[0, 2]");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"max_tokens\": 1.5}", 400, "integer");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"max_tokens\": 0}", 400, "at least 1");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"n\": 2}", 400, "'n'");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"stop\": [1]}", 400, "'stop'");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"logprobs\": 21}", 400, "[0, 20]");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"logprobs\": true}", 400, "integer");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"logprobs\": 1.5}", 400, "integer");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"top_logprobs\": 1}", 400, "chat field");
    const char *C = "/v1/chat/completions";
    expect_error(port, "POST", C, NULL, "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": "
                 "\"hi\"}], \"logprobs\": true, \"top_logprobs\": 21}", 400, "[0, 20]");
    expect_error(port, "POST", C, NULL, "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": "
                 "\"hi\"}], \"top_logprobs\": 2}", 400, "needs 'logprobs': true");
    expect_error(port, "POST", C, NULL, "{\"model\": \"demo-chat\", \"messages\": [{\"role\": \"user\", \"content\": "
                 "\"hi\"}], \"logprobs\": 1}", 400, "'logprobs' must be true or false");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": {}}", 400, "'prompt'");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": [99999999]}", 400, "djinnd");
    expect_error(port, "POST", P, NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"qos\": \"urgent\"}", 400, "QoS");
    expect_error(port, "POST", P, "X-Djinn-QoS: fast\r\n", "{\"model\": \"demo\", \"prompt\": \"x\"}", 400, "QoS");
    expect_error(port, "POST", P, NULL, "{\"model\": \"nope\", \"prompt\": \"x\"}", 404, "not in djinnd's model store");
    expect_error(port, "POST", P, NULL, "{\"model\": \"../demo\", \"prompt\": \"x\"}", 404, "model");
    expect_error(port, "POST", "/v1/chat/completions", NULL, "{\"model\": \"demo\", \"messages\": [{\"role\": \"user\", "
                 "\"content\": \"hi\"}]}", 400, "no usable chat template");
    expect_error(port, "POST", "/v1/chat/completions", NULL, "{\"model\": \"demo-chat\", \"messages\": []}", 400, "'messages'");
    expect_error(port, "POST", "/v1/chat/completions", NULL, "{\"model\": \"demo-chat\", \"messages\": [{\"content\": 1}]}",
                 400, "role");
    expect_error(port, "GET", P, NULL, NULL, 405, "not allowed");
    expect_error(port, "GET", "/v2/things", NULL, NULL, 404, "no such endpoint");
    /* a prompt longer than the model's context (512 positions) */
    char *big = malloc(40000);
    strcpy(big, "{\"model\": \"demo\", \"prompt\": \"");
    for (int i = 0; i < 3000; i++) strcat(big, "word ");
    strcat(big, "\"}");
    expect_error(port, "POST", P, NULL, big, 400, "positions");
    free(big);
    /* a body over --http-max-body (64k here), announced or not */
    size_t n = 100000;
    char *huge = malloc(n + 64);
    memset(huge, ' ', n);
    strcpy(huge + n, "{}");
    expect_error(port, "POST", P, NULL, huge, 413, "bytes");
    free(huge);
}

/* a client that leaves mid-generation: its session goes (stats show none),
 * and the daemon keeps serving */
static void wait_no_sessions(const char *addr, const char *what) {
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    size_t left = 99;
    /* the front end notices a leaving client within 100 ms of waiting, then
     * its daemon connection closes and the worker reaps: allow a slow
     * (sanitizer) build a minute */
    for (int i = 0; c && i < 1200; i++) {
        dj_client_stats st;
        if (dj_client_stats_get(c, &st) != DJ_OK) break;
        left = st.n_sessions;
        dj_client_stats_free(&st);
        if (!left) break;
        dj_test_sleep_ms(50);
    }
    CHECK_MSG(left == 0, "%s: %zu sessions left", what, left);
    dj_client_free(c);
}

static void test_disconnect(const char *addr, unsigned port) {
    const char *body = "{\"model\": \"demo\", \"prompt\": \"Once upon a time\", \"max_tokens\": 400, \"stream\": true, "
                       "\"temperature\": 1.0, \"seed\": 3}";
    int fd = dj_test_http_connect(port);
    CHECK(fd >= 0 && dj_test_http_send(fd, "POST", "/v1/completions", NULL, body));
    char buf[512];
    ssize_t k = recv(fd, buf, sizeof buf, 0); /* the first event */
    CHECK(k > 0);
    close(fd);
    wait_no_sessions(addr, "stream left");
    /* non-streamed: the request sent, then gone */
    fd = dj_test_http_connect(port);
    CHECK(fd >= 0 && dj_test_http_send(fd, "POST", "/v1/completions", NULL,
                                  "{\"model\": \"demo\", \"prompt\": \"Once\", \"max_tokens\": 400, \"seed\": 4}"));
    dj_test_sleep_ms(50);
    close(fd);
    wait_no_sessions(addr, "request left");
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", NULL, "{\"model\": \"demo\", \"prompt\": \"x\", \"max_tokens\": 2}");
    CHECK(r.status == 200);
    dj_test_resp_free(&r);
}

/* --http-max-connections 2: two requests holding (their bodies unsent), the
 * third gets 503 */
static void test_busy(unsigned port) {
    const char *head = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                       "Content-Length: 100\r\n\r\n";
    int a = -1, b = -1, status = 0;
    /* A request of an earlier test may still hold a slot for a moment (its
     * client left; the server notices at its next write): then one of the two
     * holders is itself refused. So: the two, then a third until it is
     * refused; if it never is, the slots were not free - again, from the start. */
    for (int attempt = 0; attempt < 20 && status != 503; attempt++) {
        if (attempt) {
            close(a);
            close(b);
            dj_test_sleep_ms(200);
        }
        a = dj_test_http_connect(port);
        b = dj_test_http_connect(port);
        CHECK(a >= 0 && b >= 0 && dj_test_send_all(a, head, strlen(head)) && dj_test_send_all(b, head, strlen(head)));
        for (int i = 0; i < 100 && status != 503; i++) { /* they count once the server has read their headers */
            dj_test_resp r = dj_test_http_request(port, "GET", "/v1/models", NULL, NULL);
            status = r.status;
            dj_test_resp_free(&r);
            if (status != 503) dj_test_sleep_ms(50);
        }
    }
    CHECK_MSG(status == 503, "third request: %d", status);
    close(a);
    close(b);
    for (int i = 0; i < 300 && status != 200; i++) { /* 30 s: a bound for a stuck server */
        dj_test_resp r = dj_test_http_request(port, "GET", "/v1/models", NULL, NULL);
        status = r.status;
        dj_test_resp_free(&r);
        if (status != 200) dj_test_sleep_ms(100);
    }
    CHECK_MSG(status == 200, "after the two left: %d", status);
}

/* GET /v1/djinn/events holds a slot of --http-max-connections (2) while its
 * client stays: two streams, a third request gets 503; both clients gone,
 * their slots (and daemon connections) are freed. */
static void test_events_busy(unsigned port) {
    const char *get = "GET /v1/djinn/events HTTP/1.1\r\nHost: localhost\r\n\r\n";
    int fd[2] = {-1, -1}, status = 0;
    for (int attempt = 0; attempt < 20 && status != 503; attempt++) { /* as test_busy: a slot may be held a moment */
        for (int i = 0; i < 2; i++) {
            if (attempt) close(fd[i]);
            fd[i] = dj_test_http_connect(port);
            CHECK(fd[i] >= 0 && dj_test_send_all(fd[i], get, strlen(get)));
        }
        if (attempt) dj_test_sleep_ms(200);
        for (int i = 0; i < 2; i++) { /* each its first event (or a 503 when a slot was still held) */
            char buf[256];
            const ssize_t k = recv(fd[i], buf, sizeof buf - 1, 0);
            CHECK(k > 0);
        }
        dj_test_resp r = dj_test_http_request(port, "GET", "/v1/djinn/stats", NULL, NULL);
        status = r.status;
        dj_test_resp_free(&r);
    }
    CHECK_MSG(status == 503, "a request beside two event streams: %d", status);
    /* the streams deliver events (one each 500 ms) */
    char buf[8192] = {0};
    size_t k = 0;
    while (k < sizeof buf - 1 && !strstr(buf, "data: {")) {
        const ssize_t m = recv(fd[0], buf + k, sizeof buf - 1 - k, 0);
        if (m <= 0) break;
        k += (size_t)m;
    }
    CHECK_MSG(strstr(buf, "data: {") != NULL, "the event stream stopped after %zu bytes", k);
    close(fd[0]);
    close(fd[1]);
    for (int i = 0; i < 300 && status != 200; i++) {
        dj_test_resp r = dj_test_http_request(port, "GET", "/v1/djinn/stats", NULL, NULL);
        status = r.status;
        dj_test_resp_free(&r);
        if (status != 200) dj_test_sleep_ms(100);
    }
    CHECK_MSG(status == 200, "after the event streams left: %d", status);
}

/* --token-file: bearer tokens, and QoS classes a token may not use */
static void test_tokens(void) {
    char path[600], addr[128];
    snprintf(path, sizeof path, "%s/tokens", tmpdir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs("good-token qos=interactive\nbatch-only qos=batch\n", f);
    fclose(f);
    const char *extra[] = {"--token-file", path, NULL};
    unsigned port;
    pid_t pid = start(1, extra, addr, sizeof addr, &port);
    CHECK(pid > 0 && port > 0);
    if (pid <= 0) return;
    const char *body = "{\"model\": \"demo\", \"prompt\": \"x\", \"max_tokens\": 2}";
    expect_error(port, "POST", "/v1/completions", NULL, body, 401, "Bearer");
    expect_error(port, "POST", "/v1/completions", "Authorization: Bearer wrong\r\n", body, 401, "Bearer");
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", "Authorization: Bearer good-token\r\n", body);
    CHECK_MSG(r.status == 200, "good token: %d %s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    /* a token that may not use the default class (interactive) gets its own, named or not */
    r = dj_test_http_request(port, "POST", "/v1/completions", "Authorization: Bearer batch-only\r\n", body);
    CHECK_MSG(r.status == 200, "batch token, no class named: %d %s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    expect_error(port, "POST", "/v1/completions", "Authorization: Bearer batch-only\r\nX-Djinn-QoS: interactive\r\n",
                 body, 400, "qos");
    /* the scheme is case-insensitive (RFC 9110 11.1) */
    r = dj_test_http_request(port, "POST", "/v1/completions", "Authorization: bearer good-token\r\n", body);
    CHECK_MSG(r.status == 200, "'bearer' in lower case: %d %s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    r = dj_test_http_request(port, "POST", "/v1/completions", "Authorization: Bearer batch-only\r\nX-Djinn-QoS: batch\r\n", body);
    CHECK_MSG(r.status == 200, "batch token, batch class: %d %s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    r = dj_test_http_request(port, "GET", "/v1/models", "Authorization: Bearer good-token\r\n", NULL);
    CHECK(r.status == 200);
    dj_test_resp_free(&r);
    /* the events: the header, or ?access_token= (EventSource sends no headers); the query only there */
    expect_error(port, "GET", "/v1/djinn/events?count=1", NULL, NULL, 401, "access_token");
    r = dj_test_http_request(port, "GET", "/v1/djinn/events?count=1&access_token=good-token", NULL, NULL);
    CHECK_MSG(r.status == 200 && r.body && strstr(r.body, "data: {\"object\":\"djinn.stats\""), "events, token in the query: %d",
              r.status);
    dj_test_resp_free(&r);
    expect_error(port, "GET", "/v1/djinn/events?count=1&access_token=wrong", NULL, NULL, 401, "Bearer");
    r = dj_test_http_request(port, "GET", "/v1/djinn/events?count=1", "Authorization: Bearer good-token\r\n", NULL);
    CHECK(r.status == 200 && r.body && strstr(r.body, "data: {"));
    dj_test_resp_free(&r);
    expect_error(port, "GET", "/v1/djinn/stats?access_token=good-token", NULL, NULL, 401, "Bearer");
    r = dj_test_http_request(port, "GET", "/v1/djinn/stats", "Authorization: Bearer good-token\r\n", NULL);
    CHECK(r.status == 200);
    dj_test_resp_free(&r);
    CHECK(dj_test_daemon_stop(1, 10000) == 0);
}

/* The door submits in-process (submit.h): it takes none of the binary
 * listener's connections. With --max-connections 2 held by two binary
 * clients, an HTTP completion is still served (a door that dialled the
 * listener was refused: 503), and the binary clients still count. */
static void test_in_process(void) {
    char addr[128];
    unsigned port = 0;
    const char *extra[] = {"--max-connections", "2", "--http-reuse", "0", NULL};
    pid_t pid = start(0, extra, addr, sizeof addr, &port);
    CHECK_MSG(pid > 0 && port > 0, "djinnd --http --max-connections 2 did not start");
    if (pid <= 0 || port == 0) return;
    dj_test_frame fa, fb, fc;
    const int a = dj_test_raw_hello(addr, 10, NULL, &fa), b = dj_test_raw_hello(addr, 10, NULL, &fb);
    CHECK_MSG(a >= 0 && b >= 0 && fa.type == DJ_MSG_REPLY && fb.type == DJ_MSG_REPLY, "two binary clients: %d %d",
              fa.type, fb.type);
    const int c = dj_test_raw_hello(addr, 10, NULL, &fc); /* the listener is full: a third is refused */
    CHECK_MSG(fc.type == DJ_MSG_ERROR && fc.st == DJ_EBUSY, "a third binary client: type %d st %lld", fc.type,
              (long long)fc.st);
    if (c >= 0) close(c);
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", NULL,
                                          "{\"model\": \"demo\", \"prompt\": \"hello\", \"max_tokens\": 3}");
    CHECK_MSG(r.status == 200 && r.body && strstr(r.body, "\"text_completion\""),
              "a completion while the listener is full: %d %.200s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    if (a >= 0) close(a);
    if (b >= 0) close(b);
    CHECK(dj_test_daemon_stop(0, 10000) == 0);
}

int main(void) {
    /* nothing random here: one run, no seeds */
    dj_test_daemon_guard();
    if (!mkdtemp(tmpdir) || !make_store()) {
        fprintf(stderr, "test_http: cannot make the model store in %s\n", tmpdir);
        return 1;
    }
    char addr[128];
    unsigned port;
    /* the reference daemon: no reuse of any kind */
    const char *extra[] = {"--http-max-body", "64k", "--http-max-connections", "2", "--http-reuse", "0",
                           "--prefix-cache", "off", "--local-admin", NULL}; /* its stats and events are read */
    pid_t pid = start(0, extra, addr, sizeof addr, &port);
    CHECK_MSG(pid > 0 && port > 0, "djinnd --http did not start");
    if (pid > 0 && port > 0) {
        test_generation(addr, port);
        test_logprobs_wire(addr);
        test_logprobs_http(port);
        test_reuse(addr, port);
        test_prefix_cache(addr, port);
        test_errors(port);
        test_disconnect(addr, port);
        test_busy(port);
        test_events_busy(port);
        CHECK(dj_test_daemon_stop(0, 10000) == 0);
    }
    test_tokens();
    test_in_process();
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_http");
}
