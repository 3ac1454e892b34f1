/* log_access.h: one access line per request (djinnd's binary port and its
 * HTTP door alike), written through the logger in text or JSON. */
#ifndef DJ_LOG_ACCESS_H
#define DJ_LOG_ACCESS_H

#include <stdint.h>

/* What one request was and how it went. Strings may be NULL ("-"); none is
 * kept after dj_log_access returns. token is the token's NAME (name= in the
 * token file, or "lineN"), never its secret. */
typedef struct dj_access_rec {
    const char *door;     /* "binary" or "http" */
    const char *peer;     /* "127.0.0.1:41234", "[::1]:5000", "unix" */
    const char *token;    /* the token's name, or NULL without --token-file */
    const char *request;  /* "GENERATE", "POST /v1/chat/completions" */
    const char *model;
    const char *qos;      /* "realtime", "interactive", "batch" */
    uint32_t prompt_tokens, gen_tokens;
    double queue_ms, ttft_ms, total_ms; /* < 0: not known (written as "-" or null) */
    const char *outcome;  /* "stop", "length", "DJ_EQUOTA", "cancelled", ... */
    int status;           /* HTTP status, 0 on the binary port */
} dj_access_rec;

/* Writes r as one line at level info (so --log-level info or debug shows
 * them), in the logger's format: text "access door=... peer=... ..." or a
 * JSON object with "type":"access". */
void dj_log_access(const dj_access_rec *r);

#endif
