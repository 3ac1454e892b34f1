/* bench_http.c: one generation requested N times in a row through djinnd's
 * OpenAI HTTP front end (whole answer, or streamed as server-sent events) or
 * through the binary protocol (libdjinn), to see what the HTTP road adds per
 * request and per token. Per-request wall times are printed (median, min,
 * max) with the tokens each produced.
 *
 * usage: bench_http ADDR HTTP_PORT http|http-stream|binary N [MAX_TOKENS [MODEL]]
 * against a running `djinnd --models DIR --listen ADDR --http 127.0.0.1:HTTP_PORT`
 * (MODEL default "demo", greedy, the prompt "Once upon a time"). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "daemon_util.h"
#include "djinn/client.h"

static const char *const prompt = "Once upon a time";

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static const char *model = "demo";

/* stream: the usage chunk (stream_options.include_usage) is the last "data: {" before [DONE] */
static int one_http(unsigned port, unsigned max_tokens, bool stream) {
    char body[512];
    snprintf(body, sizeof body,
             "{\"model\": \"%s\", \"prompt\": \"%s\", \"max_tokens\": %u, \"temperature\": 0%s}", model, prompt,
             max_tokens, stream ? ", \"stream\": true, \"stream_options\": {\"include_usage\": true}" : "");
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", NULL, body);
    int n = -1;
    const char *json = r.body;
    if (stream && json)
        for (const char *p = strstr(json, "data: {"); p; p = strstr(p + 1, "data: {")) json = p + 6;
    cJSON *j = r.status == 200 && json ? cJSON_Parse(json) : NULL;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "usage"), "completion_tokens");
    if (cJSON_IsNumber(u)) n = u->valueint;
    else fprintf(stderr, "bench_http: HTTP %d: %s\n", r.status, r.body ? r.body : "");
    cJSON_Delete(j);
    dj_test_resp_free(&r);
    return n;
}

static int one_binary(dj_client_t *c, unsigned max_tokens) {
    dj_session_opts so = {model, DJ_QOS_INTERACTIVE, 0};
    uint64_t sess;
    dj_generate_result res;
    dj_generate_params gp = {.prompt = prompt, .max_tokens = max_tokens, .sampling = {.top_p = 1.0f}};
    if (dj_client_session_open(c, &so, &sess) != DJ_OK || dj_client_generate(c, sess, &gp, NULL, NULL, &res) != DJ_OK ||
        dj_client_session_close(c, sess) != DJ_OK) {
        fprintf(stderr, "bench_http: %s\n", dj_last_error());
        return -1;
    }
    return (int)res.n_generated;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: bench_http ADDR HTTP_PORT http|http-stream|binary N [MAX_TOKENS [MODEL]]\n");
        return 2;
    }
    const unsigned port = (unsigned)atoi(argv[2]);
    const bool stream = !strcmp(argv[3], "http-stream"), http = stream || !strcmp(argv[3], "http");
    const int n = atoi(argv[4]);
    const unsigned max_tokens = argc > 5 ? (unsigned)atoi(argv[5]) : 16;
    if (argc > 6) model = argv[6];
    if (n < 1 || n > 100000 || (!http && strcmp(argv[3], "binary"))) return 2;
    dj_client_t *c = NULL;
    if (!http && dj_client_connect(argv[1], NULL, &c) != DJ_OK) {
        fprintf(stderr, "bench_http: %s\n", dj_last_error());
        return 1;
    }
    double *ms = calloc((size_t)n, sizeof *ms);
    int tokens = -2;
    for (int i = 0; i < n && ms; i++) {
        const double t0 = dj_test_now_s();
        const int got = http ? one_http(port, max_tokens, stream) : one_binary(c, max_tokens);
        ms[i] = (dj_test_now_s() - t0) * 1e3;
        if (got < 0 || (tokens != -2 && got != tokens)) {
            fprintf(stderr, "bench_http: request %d gave %d tokens (before: %d)\n", i, got, tokens);
            return 1;
        }
        tokens = got;
    }
    dj_client_free(c);
    if (!ms) return 1;
    qsort(ms, (size_t)n, sizeof *ms, cmp_double);
    printf("%s: %d requests of %d tokens: per request median %.3f ms, min %.3f, max %.3f\n", argv[3], n, tokens,
           ms[n / 2], ms[0], ms[n - 1]);
    free(ms);
    return 0;
}
