/* request.h: djinnd's requests as typed structs - one message table (name,
 * code, payload, session, where it runs, decoder, limits) and its decoders. */
#ifndef DJ_SERVER_REQUEST_H
#define DJ_SERVER_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/protocol.h"
#include "djinn/sample_params.h"
#include "djinn/intervene.h"
#include "server/persist.h"

struct dj__meta;

/* Whether a request names a session (its `session` field). */
typedef enum dj__req_sess {
    DJ__SESS_NONE,     /* no session field */
    DJ__SESS_OPTIONAL, /* may name one (HEARTBEAT: one, or all of the connection's) */
    DJ__SESS_REQUIRED  /* names one: absent or not a u64 is DJ_EFORMAT */
} dj__req_sess;

/* Where a request is answered. */
typedef enum dj__req_at {
    DJ__AT_IO,    /* the I/O thread, at once (never touches the engine) */
    DJ__AT_WORKER /* posted to the worker's mailbox */
} dj__req_at;

/* The message table: X(NAME, payload, session, at, decoder). NAME is the
 * DJ_MSG_ name (its code from DJ_MSG_TYPE_MAP); payload: whether its frame
 * may carry one; the decoder fills its member of dj__request (request.c),
 * and its limits (the I/O thread's checks before it is posted) are in
 * request.c's table beside it. */
#define DJ__REQUEST_TABLE(X)                                                    \
    X(HELLO, false, DJ__SESS_NONE, DJ__AT_IO, hello)                            \
    X(HEARTBEAT, false, DJ__SESS_OPTIONAL, DJ__AT_IO, session_only)             \
    X(STATS, false, DJ__SESS_NONE, DJ__AT_WORKER, nothing)                      \
    X(MODEL_LIST, false, DJ__SESS_NONE, DJ__AT_WORKER, nothing)                 \
    X(MODEL_LOAD, false, DJ__SESS_NONE, DJ__AT_WORKER, model)                   \
    X(MODEL_UNLOAD, false, DJ__SESS_NONE, DJ__AT_WORKER, model)                 \
    X(SESSION_OPEN, false, DJ__SESS_NONE, DJ__AT_WORKER, open)                  \
    X(SESSION_CLOSE, false, DJ__SESS_REQUIRED, DJ__AT_WORKER, session_only)     \
    X(GENERATE, false, DJ__SESS_REQUIRED, DJ__AT_WORKER, generate)              \
    X(STEP, true, DJ__SESS_REQUIRED, DJ__AT_WORKER, step)                       \
    X(FETCH, false, DJ__SESS_NONE, DJ__AT_IO, fetch)                            \
    X(RELEASE, false, DJ__SESS_NONE, DJ__AT_IO, handle)                         \
    X(PAUSE, false, DJ__SESS_REQUIRED, DJ__AT_IO, pause)                        \
    X(RESUME, false, DJ__SESS_REQUIRED, DJ__AT_IO, session_only)                \
    X(MODEL_INFO, false, DJ__SESS_NONE, DJ__AT_IO, nothing)                     \
    X(SESSION_ATTACH, false, DJ__SESS_REQUIRED, DJ__AT_IO, attach)              \
    X(WEIGHT_HAS, false, DJ__SESS_NONE, DJ__AT_IO, nothing)                     \
    X(WEIGHT_UPLOAD, true, DJ__SESS_NONE, DJ__AT_IO, nothing)                   \
    X(WEIGHT_CHALLENGE, false, DJ__SESS_NONE, DJ__AT_IO, nothing)               \
    X(WEIGHT_PROVE, false, DJ__SESS_NONE, DJ__AT_IO, nothing)                   \
    X(GRAPH_RUN, true, DJ__SESS_NONE, DJ__AT_WORKER, nothing)                   \
    X(SESSION_EXPORT, false, DJ__SESS_REQUIRED, DJ__AT_WORKER, session_only)    \
    X(SESSION_IMPORT, true, DJ__SESS_NONE, DJ__AT_WORKER, import)

/* ---- the typed requests ---- */
typedef struct dj__req_hello {
    uint32_t version;  /* default DJ_PROTO_VERSION */
    char *token;       /* [token_len] (malloc'd, NUL-terminated) or NULL */
    size_t token_len;
} dj__req_hello;

typedef struct dj__req_open {
    char model[128];
    dj_qos qos;                /* default interactive; the caller's token must grant it (limits) */
    bool reattach;
    uint32_t expected_tokens;  /* 0: the model's default context */
    char *cache_salt;          /* [salt_len] (malloc'd) or NULL: 1..DJ__SALT_BYTES_MAX bytes */
    size_t salt_len;
} dj__req_open;

/* A GENERATE's sampling fields (docs/protocol.md): decoded and bounded by
 * dj__generate_sampling_decode alone. */
typedef struct dj__gen_sampling {
    dj_sampler_params sampling;
    bool ignore_eos, logprobs;
    uint32_t top_logprobs; /* 0..DJ_MAX_TOP_LOGPROBS, only with logprobs */
    int32_t *stop_ids;     /* [n_stop] (malloc'd) or NULL */
    size_t n_stop;
    dj_logit_bias *logit_bias; /* [n_logit_bias] (malloc'd) or NULL; ids checked against the model by the worker */
    size_t n_logit_bias;
} dj__gen_sampling;

typedef struct dj__req_generate {
    char *prompt;          /* [plen] text (malloc'd, no U+0000) or NULL: then ids */
    size_t plen;
    int32_t *ids;          /* [n_ids] (malloc'd) or NULL */
    size_t n_ids;
    uint32_t max_tokens;   /* default 64 */
    char *cache_salt;      /* as dj__req_open's */
    size_t salt_len;
    char *json_schema;     /* [schema_len] structured output (grammar.h; malloc'd) or NULL */
    size_t schema_len;
    char adapter[128];     /* a LoRA adapter's folder in the model store, "": the session's (adapter.h) */
    dj__gen_sampling s;
    struct dj__req_point *points; /* [n_points] (malloc'd) edits at every step, or NULL; their tensors in */
    uint32_t n_points;
    uint8_t *iv_bytes;     /* [iv_len] each point's `data` (f32 LE), one after another (malloc'd) */
    size_t iv_len;
} dj__req_generate;

typedef enum dj__step_logits { DJ__LOGITS_LAST, DJ__LOGITS_ALL, DJ__LOGITS_NONE } dj__step_logits;
struct dj__req_point;

/* One of a STEP's `points` as the wire gives it (the worker checks it
 * against the session's model: dj__trace_parse). */
typedef struct dj__req_point {
    char point[64];       /* the point's name as sent (NUL-terminated; longer ones are refused) */
    size_t point_len;
    dj_iv_op op;
    uint32_t nd;          /* shape's dims: 0 (save), 1 or 2 */
    uint64_t dims[2];
    bool has_rows, has_cols; /* `rows` [a, b) / `cols` [a, b): the region an edit takes (else all) */
    bool keep;            /* a save's `keep`: its handle is the connection's, it outlives the session */
    uint64_t rows[2], cols[2];
} dj__req_point;

/* A STEP on a session whose step is paused at a breakpoint (step_break.c). */
typedef enum dj__step_brk { DJ__BRK_NONE, DJ__BRK_RESUME, DJ__BRK_CANCEL } dj__step_brk;

typedef struct dj__req_step {
    dj__step_brk brk;     /* `resume` or `cancel` true: no ids; `points` (resume) edit the paused point */
    int32_t *ids;         /* [n_ids] (malloc'd): `ids`, or the payload's int32 LE ids */
    char *prompt;         /* [plen] text the worker tokenizes instead (malloc'd, no U+0000) or NULL */
    size_t plen;
    size_t n_ids;
    dj__step_logits logits;
    dj__req_point *points; /* [n_points] (malloc'd) or NULL: the payload then holds their tensors */
    uint32_t n_points;
    const uint8_t *payload; /* [payload_len] inside the request's body (with points) */
    uint64_t payload_len;
} dj__req_step;

typedef struct dj__req_fetch {
    uint64_t handle, offset, length, start, count; /* length/count default UINT64_MAX */
    bool by_elem;          /* `start` or `count` given: elements, not bytes */
} dj__req_fetch;

typedef struct dj__req_attach {
    uint64_t secret;
} dj__req_attach;

/* SESSION_IMPORT: its payload, a session image (persist.h), decoded and
 * checked on the I/O side; img's pointers point into the request's body. */
typedef struct dj__req_import {
    const uint8_t *payload; /* [payload_len] inside the request's body */
    uint64_t payload_len;
    dj__simg img;
} dj__req_import;

/* The requests that open a session on their connection (the session quotas
 * count them; their reply makes the I/O side's lease). */
static inline bool dj__req_opens(uint16_t type) {
    return type == DJ_MSG_SESSION_OPEN || type == DJ_MSG_SESSION_IMPORT;
}

/* A request, decoded: type and id from its frame, session (0: none named)
 * from the table's session column, the fields in the type's member. */
typedef struct dj__request {
    uint16_t type;
    uint64_t id;          /* the frame's request id */
    uint64_t session;
    uint8_t *body;        /* the frame's bytes (meta then payload, owned): a STEP's tensors point here */
    union {
        dj__req_hello hello;
        dj__req_open open;
        dj__req_generate gen;
        dj__req_step step;
        dj__req_fetch fetch;
        dj__req_attach attach;
        dj__req_import import;
        char model[128];        /* MODEL_LOAD, MODEL_UNLOAD */
        uint64_t handle;        /* RELEASE */
        uint64_t expected_ms;   /* PAUSE */
    } u;
} dj__request;

/* The table's row of a request type (NULL: not a request). */
typedef struct dj__msg_row {
    const char *name;
    uint16_t type;
    bool payload;
    dj__req_sess session;
    dj__req_at at;
    dj_status (*decode)(const struct dj__meta *m, dj__request *r);
} dj__msg_row;
const dj__msg_row *dj__msg_row_of(uint16_t type);

/* r's fields from m (r->type set; r->body owned by r from here): DJ_EFORMAT
 * for a field of the wrong type (the connection closes), other statuses for
 * values out of bounds. On failure r holds nothing to free but its body. */
dj_status dj__request_decode(const struct dj__meta *m, dj__request *r);
/* A GENERATE's sampling fields from m into out (the one place they are read). */
dj_status dj__generate_sampling_decode(const struct dj__meta *m, dj__gen_sampling *out /* OUT */);
void dj__request_free(dj__request *r); /* what the decoder allocated, and the body */

#endif
