/* log_access.c: the access line of one request (log_access.h) - the record's
 * fields in text (key=value) or as JSON members, through the logger. */
#include "djinn/log_access.h"

#include <stdio.h>
#include <string.h>

#include "djinn/status.h"

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

/* A text value: bare when it holds no space, quote or control byte, else quoted with those escaped. */
static size_t text_val(char *out, size_t cap, const char *v) {
    v = or_dash(v);
    bool bare = true;
    for (const char *p = v; *p; p++) bare &= *p != ' ' && *p != '"' && (unsigned char)*p >= 0x21 && *p != 0x7f;
    if (bare) return (size_t)snprintf(out, cap, "%s", v);
    char esc[512];
    dj__log_escape(v, esc, sizeof esc);
    return (size_t)snprintf(out, cap, "\"%s\"", esc);
}

static void ms_text(char *out, size_t cap, double ms) {
    if (ms < 0) snprintf(out, cap, "-");
    else snprintf(out, cap, "%.1f", ms);
}

static void ms_json(char *out, size_t cap, double ms) {
    if (ms < 0) snprintf(out, cap, "null");
    else snprintf(out, cap, "%.1f", ms);
}

void dj_log_access(const dj_access_rec *r) {
    if (!dj_log_enabled(DJ_LOG_INFO)) return;
    const char *names[] = {"door", "peer", "token", "request", "model", "qos", "outcome"};
    const char *vals[] = {r->door, r->peer, r->token, r->request, r->model, r->qos, r->outcome};
    enum { N_STR = sizeof names / sizeof *names };
    char q[24], t[24], tot[24];
    /* both forms are built; the logger writes the one its format wants */
    char text[2048], json[2048];
    size_t n = 0;
    text[0] = '\0';
    size_t m = 0;
    json[0] = '\0';
    for (int i = 0; i < N_STR && n < sizeof text; i++) {
        n += (size_t)snprintf(text + n, sizeof text - n, "%s%s=", i ? " " : "", names[i]);
        if (n < sizeof text) n += text_val(text + n, sizeof text - n, vals[i]);
        char esc[512];
        dj__log_escape(or_dash(vals[i]), esc, sizeof esc);
        if (m < sizeof json)
            m += (size_t)snprintf(json + m, sizeof json - m, "%s\"%s\":\"%s\"", i ? "," : "", names[i], esc);
    }
    ms_text(q, sizeof q, r->queue_ms);
    ms_text(t, sizeof t, r->ttft_ms);
    ms_text(tot, sizeof tot, r->total_ms);
    if (n < sizeof text)
        snprintf(text + n, sizeof text - n,
                 " status=%d prompt_tokens=%u gen_tokens=%u queue_ms=%s ttft_ms=%s total_ms=%s", r->status,
                 r->prompt_tokens, r->gen_tokens, q, t, tot);
    ms_json(q, sizeof q, r->queue_ms);
    ms_json(t, sizeof t, r->ttft_ms);
    ms_json(tot, sizeof tot, r->total_ms);
    if (m < sizeof json)
        snprintf(json + m, sizeof json - m,
                 ",\"status\":%d,\"prompt_tokens\":%u,\"gen_tokens\":%u,\"queue_ms\":%s,\"ttft_ms\":%s,\"total_ms\":%s,"
                 "\"type\":\"access\"",
                 r->status, r->prompt_tokens, r->gen_tokens, q, t, tot);
    dj__log_line(DJ_LOG_INFO, "access", text, json);
}
