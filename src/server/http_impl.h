/* http_impl.h: djinnd's OpenAI-compatible HTTP front end - typed requests
 * into the daemon through portals (submit.h) behind libmicrohttpd
 * (http.c), and the OpenAI request/response JSON (http_openai.c). */
#ifndef DJ_HTTP_IMPL_H
#define DJ_HTTP_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/chat_template.h"
#include "djinn/tokenizer.h"
#include "server/server_impl.h"
#include "server/submit.h"

/* ---- the front end (http.c) ---- */
typedef struct dj__http_cfg {
    const char *addr;        /* --http ADDR:PORT */
    struct dj__server *srv;  /* the daemon: requests enter through its portals (submit.h) */
    const char *models;      /* --models: tokenizers and chat templates are read here */
    const dj__token *auth;   /* [n_auth] --token-file: bearer tokens (none: loopback peers only) */
    size_t n_auth;
    uint32_t max_conns;      /* --http-max-connections: requests at once; more get 503 */
    uint64_t max_body;       /* --http-max-body: bytes; more get 413 */
    uint32_t timeout_s;      /* --http-timeout-s: idle connection (headers, body) */
    uint32_t reuse;          /* --http-reuse: idle sessions kept for prefix reuse (0: none) */
    uint32_t header_s;       /* --http-header-timeout-s: absolute deadline for a request's headers */
    uint32_t body_s;         /* --http-body-timeout-s: ... for its body, from its headers */
    uint32_t per_addr;       /* --http-max-per-address: connections at once per address; more get 429 */
    uint32_t unauth;         /* --http-max-unauth: connections waiting for headers; the oldest goes beyond */
    uint32_t per_token;      /* --http-max-per-token: requests at once per token (0: max_conns / 2) */
    const char *hosts;       /* --http-allowed-hosts: "a,b" (NULL: none besides the defaults) */
    bool local_admin;        /* --local-admin: without n_auth, /v1/djinn/stats and events answer (else 403) */
} dj__http_cfg;
typedef struct dj__http dj__http;
dj_status dj__http_start(const dj__http_cfg *cfg, dj__http **out /* OUT */);
void dj__http_stop(dj__http *h); /* NULL does nothing */
uint16_t dj__http_port(const dj__http *h); /* the bound port (for --http HOST:0) */
/* The door's own records - failed bearer tokens per address (its slowdown,
 * guard.c's rule) - older than DJ__PEER_FORGET_MS go, as the daemon's do
 * (dj__peers_sweep); its watchdog calls this every DJ__HTTP_SWEEP_MS with
 * dj__now_ms(). Returns the records left (now_ms 0: counts, sweeps nothing). */
#define DJ__HTTP_SWEEP_MS 10000u
size_t dj__http_sweep(dj__http *h, uint64_t now_ms);

/* ---- the live view (http_view.c) ---- */
/* GET /v1/djinn/stats's body, and each event's data of GET
 * /v1/djinn/events: the STATS reply as JSON, one line, with at (monotonic
 * seconds when it was taken: rates between two of them) as "at_s" (malloc'd,
 * *len bytes; NULL when out of memory). */
char *dj__http_stats_json(const dj__stats_snap *st, double at, size_t *len /* OUT */);
/* (A snapshot without the admin role - st->admin false - holds its own
 * sessions only: the daemon-wide counters are zero and "scope" is "own".) */
extern const char dj__http_view_html[]; /* GET /: the page, drawing the events above */

/* What the front end keeps of a model of the store (loaded on first use). */
typedef struct dj__http_model {
    char name[128];
    dj_tokenizer_t *tok;      /* NULL: the model has no tokenizer.json */
    dj_chat_template_t *tpl;  /* NULL: no chat template (tpl_why says why) */
    char tpl_why[384];
    uint32_t max_pos;         /* config.json's max_position_embeddings */
    size_t max_tok_bytes;     /* the longest token's text (0: no tokenizer): prompts past max_pos times
                                 this many bytes are refused before they are tokenized */
    struct dj__http_model *next;
} dj__http_model;

/* A growing byte buffer. */
typedef struct dj__buf {
    char *p;
    size_t n, cap;
    bool oom;
} dj__buf;
void dj__buf_put(dj__buf *b, const char *s, size_t n);
void dj__buf_free(dj__buf *b);
/* One server-sent event appended to out: "event: NAME" when name is not
 * NULL, then data[n] (one line: no '\n' in it) as "data: ...", a blank line. */
void dj__sse_put(dj__buf *out, const char *name, const char *data, size_t n);

/* ---- tool calls (http_tools.c) ---- */
#define DJ__MAX_TOOLS 128         /* functions in one request's tools */
#define DJ__TOOL_NAME_MAX 64      /* a function name's characters (OpenAI's rule) */
#define DJ__MAX_PARALLEL_CALLS 8  /* calls in one forced answer with parallel_tool_calls */
typedef enum dj__tool_choice {
    DJ__TOOLS_OFF,      /* no tools, or tool_choice "none": the text is the answer */
    DJ__TOOLS_AUTO,     /* the model may call: its output is parsed for calls */
    DJ__TOOLS_REQUIRED, /* it must call one of them (schema forces it) */
    DJ__TOOLS_NAMED     /* it must call the named one (schema forces it) */
} dj__tool_choice;
typedef struct dj__oai_tools {
    dj__tool_choice choice;
    bool parallel;                       /* parallel_tool_calls (default true) */
    char (*names)[DJ__TOOL_NAME_MAX + 1]; /* [n_names] the functions' names (malloc'd) */
    size_t n_names;
    char *schema;                        /* REQUIRED/NAMED: the JSON schema the answer is decoded under - one
                                          * {"name", "arguments"} object, or with parallel (REQUIRED only) an
                                          * array of 1..DJ__MAX_PARALLEL_CALLS of them (malloc'd); else NULL */
} dj__oai_tools;
/* A chat request's tools, tool_choice, parallel_tool_calls (cJSON *, each
 * NULL when absent) checked into *t: every bad input a 400 naming the field
 * (tools[i].function.name...); with a forced choice each function's
 * parameters must compile (grammar.h's subset). 0, or the status with err;
 * free *t with dj__oai_tools_free either way. */
int dj__oai_tools_parse(const void *tools, const void *choice, const void *parallel, dj__oai_tools *t /* OUT */,
                        char *err, size_t cap);
void dj__oai_tools_free(dj__oai_tools *t);
/* Messages (a cJSON array) as the templates read them: an assistant
 * message's tool_calls[j].function.arguments given as JSON text becomes the
 * object (400 naming it when it is not one); tool_call_id must be a string. */
int dj__oai_tool_messages(void *messages, char *err, size_t cap);
/* The calls in a finished answer text[n]: forced, the schema's value;
 * auto, Hermes/Qwen "<tool_call>{...}</tool_call>" blocks, Mistral's
 * "[TOOL_CALLS][...]", Llama 3.1's "<|python_tag|>{...}", or a JSON call
 * (or array of calls) as the whole answer - each {"name": a declared
 * function, "arguments" (or "parameters"): an object}. Returns OpenAI's
 * tool_calls (a cJSON array, ids "call_<id_base>_<k>"; the caller deletes
 * it), or NULL when there are none (then the whole text is content; so too
 * when a marker's JSON does not parse, or several calls come without
 * parallel). *content: the bytes of text before the calls (trailing white
 * space cut). */
void *dj__oai_tool_calls(const dj__oai_tools *t, const char *text, size_t n, const char *id_base,
                         size_t *content /* OUT */);
/* Streaming: the bytes of text[n] that may go out as content now - all with
 * tools off, none when forced, with auto up to where a call may begin. */
size_t dj__oai_tools_safe(const dj__oai_tools *t, const char *text, size_t n);

/* ---- one OpenAI request (http_openai.c) ---- */
#define DJ__OAI_MAX_STOP 4
typedef struct dj__oai {
    bool chat, stream, include_usage;
    char model[128];
    char id[48];             /* chatcmpl-... / cmpl-... */
    int64_t created;         /* unix seconds */
    dj_qos qos;
    bool qos_given;          /* the body's qos or X-Djinn-QoS named it */
    bool max_given;
    uint32_t max_tokens;
    dj_sampler_params sampling; /* seed: the request's, else a fresh one below 2^53 (answers say which) */
    bool seed_given;
    char *stop[DJ__OAI_MAX_STOP]; /* malloc'd */
    size_t stop_len[DJ__OAI_MAX_STOP], n_stop, max_stop_len;
    void *messages, *tools;  /* cJSON * (chat), owned */
    dj__oai_tools calls;     /* tools and tool_choice as checked (chat) */
    bool calls_sent;         /* stream: the tool_calls deltas went out */
    char *cache_salt;        /* the request's cache_salt (malloc'd), or NULL */
    dj_logit_bias *logit_bias; /* [n_logit_bias] (malloc'd) or NULL: ids checked against the model by the daemon */
    size_t n_logit_bias;
    char *json_schema;       /* response_format's JSON schema as text (malloc'd; json_object: any object), or NULL */
    char *prompt;            /* completions: text (malloc'd), or */
    int32_t *ids;            /* the prompt's token ids (malloc'd, n_ids) */
    size_t n_ids;
    /* the generation so far */
    dj__buf text;            /* generated text (cut at a stop string) */
    size_t sent;             /* stream: bytes of text already sent */
    uint32_t n_generated;
    size_t cached;           /* prompt tokens a reused session already held (usage's cached_tokens) */
    bool finished, role_sent;
    const char *finish;      /* "stop" or "length" */
    /* logprobs: chat's logprobs + top_logprobs, completions' logprobs N */
    bool logprobs;
    uint32_t top_logprobs;   /* 0..DJ_MAX_TOP_LOGPROBS */
    const dj_tokenizer_t *tok; /* the model's (borrowed) for the tokens' text; may be NULL */
    struct dj__oai_lp {
        dj_token_logprobs lp;
        size_t offset;       /* bytes of text before this token's */
    } *lps;                  /* [n_lps] one per generated token kept (malloc'd) */
    size_t n_lps, cap_lps, lps_sent;
} dj__oai;

/* JSON values in body[n] at most (each a cJSON node when parsed: ~100
 * bytes), counted without building anything; model[cap] gets the top-level
 * "model" string when it is plain (no escapes), else ""; *nul whether a
 * string holds \u0000 (C strings would end there: refused, not cut). */
size_t dj__oai_json_values(const char *body, size_t n, char *model, size_t cap, bool *nul /* OUT */);
/* The longest token text of tok, in bytes. */
size_t dj__oai_max_token_bytes(const dj_tokenizer_t *tok);

/* The request body (JSON) into o. Returns 0, or the HTTP status to answer
 * with err (a message for the client). qos_header: X-Djinn-QoS or NULL. */
int dj__oai_parse(dj__oai *o, const char *body, size_t n, bool chat, const char *qos_header, char *err, size_t cap);
/* The prompt's token ids: a chat rendered by the model's template (special
 * tokens as written, no BOS added - the template writes it), a completion's
 * text encoded with the tokenizer's BOS. 0 or an HTTP status with err. */
int dj__oai_prompt(dj__oai *o, const dj__http_model *m, char *err, size_t cap);
/* A generated token's logprobs, before its text (dj__oai_text). */
void dj__oai_logprobs(dj__oai *o, const dj_token_logprobs *lp);
/* Generated text arrives; sets finished (finish "stop") at a stop string
 * (tokens whose text starts past it lose their logprobs). */
void dj__oai_text(dj__oai *o, const char *text, size_t n);
/* The daemon's DONE reason ("length", "stop", "context"). */
void dj__oai_done(dj__oai *o, const char *reason);
/* The whole answer (stream false), malloc'd. */
char *dj__oai_response(const dj__oai *o, size_t *len /* OUT */);
/* Server-sent events for what is new (text that can no longer be part of a
 * stop string; with last, the rest, the finish chunk, usage if asked and
 * [DONE]) appended to out. */
void dj__oai_events(dj__oai *o, bool last, dj__buf *out);
void dj__oai_free(dj__oai *o);
/* OpenAI's error JSON for an HTTP status, malloc'd. */
char *dj__oai_error(int status, const char *message, size_t *len /* OUT */);

/* ---- the endpoints beside the generation (http_routes.c) ----
 * Each returns the HTTP status: 200 with *out (malloc'd JSON, *len bytes),
 * or another with err (a message for the client; *out is then set only for
 * /health's 503 body). A model comes from get(ctx, name): the front end's
 * entry (NULL: not in the store). */
typedef const dj__http_model *(*dj__http_model_fn)(void *ctx, const char *name);
/* GET /health: 200 {"status": "ok"} when the daemon opens a portal for the
 * token and answers its heartbeat, else 503 {"status": "unavailable", "reason"}. */
int dj__http_health(struct dj__server *s, const dj__token *tk, char **out, size_t *len, char *err, size_t cap);
/* GET /v1/models (id NULL) and /v1/models/{id} from MODEL_LIST's entries:
 * id, object, created (0), owned_by, loaded, and where the front end can
 * read the folder max_model_len, chat_template, tokenizer. */
int dj__http_models(const dj__rep_model_list *ms, const char *id, dj__http_model_fn get, void *ctx, char **out,
                    size_t *len, char *err, size_t cap);
/* POST /tokenize {model, prompt[, add_special_tokens]} or {model, messages}
 * (rendered as /v1/chat/completions renders them) -> {tokens, count,
 * max_model_len}; POST /detokenize {model, tokens} -> {prompt}. */
int dj__http_tokenize(const char *body, size_t n, dj__http_model_fn get, void *ctx, char **out, size_t *len, char *err,
                      size_t cap);
int dj__http_detokenize(const char *body, size_t n, dj__http_model_fn get, void *ctx, char **out, size_t *len,
                        char *err, size_t cap);

#endif
