/* test_http_many.c: 64 streaming HTTP clients at once (16 under sanitizers) against one djinnd on
 * the demo model - every stream well framed and equal to its request run
 * alone afterwards (greedy and seeded sampling: the CPU engine's rows do not
 * depend on what shares their steps), the steps really shared, no session
 * left behind. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "daemon_util.h"
#include "djinn/client.h"
#include "testutil.h"

/* Sanitizer builds run some 20x slower on a loaded machine: 16 clients there */
#if defined(__SANITIZE_ADDRESS__)
#define N_CLIENTS 16
#else
#define N_CLIENTS 64
#endif
#define MAX_TOKENS 24

static char tmpdir[] = "/tmp/dj_http_many_XXXXXX";
static unsigned http_port;
static pthread_barrier_t go;

typedef struct client {
    int i;
    char body[512];
    char *text;       /* concatenated deltas (malloc'd) */
    int tokens;       /* usage.completion_tokens, -1 if absent */
    bool framed;      /* every event "data: {json}", the last "data: [DONE]" */
    int status;
} client;

static void request_body(int i, char *out, size_t cap) {
    /* a distinct prompt each; every other client samples with its own seed */
    int k = snprintf(out, cap, "{\"model\": \"demo\", \"max_tokens\": %d, \"stream\": true, "
                               "\"stream_options\": {\"include_usage\": true}, \"prompt\": [1", MAX_TOKENS);
    for (int t = 0; t < 10; t++) k += snprintf(out + k, cap - (size_t)k, ", %d", 10 + (i * 53 + t * 17) % 4000);
    if (i % 2) snprintf(out + k, cap - (size_t)k, "], \"temperature\": 0.8, \"seed\": %d}", 100 + i);
    else snprintf(out + k, cap - (size_t)k, "], \"temperature\": 0}");
}

/* One streamed request: its text, token count and framing. */
static void run(client *c) {
    /* a stream's first event may wait long behind 63 others on a slow build:
     * 10 minutes of receive timeout, not the harness's 30 s */
    dj_test_resp r = {0};
    const int fd = dj_test_http_connect(http_port);
    if (fd >= 0) {
        const struct timeval tv = {600, 0};
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (dj_test_http_send(fd, "POST", "/v1/completions", NULL, c->body)) r = dj_test_http_read(fd);
        close(fd);
    }
    c->status = r.status;
    c->text = calloc(1, r.len + 1);
    c->tokens = -1;
    bool done = false, ok = r.body != NULL;
    size_t n = 0;
    for (char *line = r.body; ok && line && *line;) {
        char *next = strstr(line, "\n\n");
        if (next) *next = '\0';
        if (done || strncmp(line, "data: ", 6)) ok = false;
        else if (!strcmp(line, "data: [DONE]")) done = true;
        else {
            cJSON *j = cJSON_Parse(line + 6);
            if (!j) ok = false;
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(ch, "text");
            if (cJSON_IsString(t)) {
                const size_t l = strlen(t->valuestring);
                memcpy(c->text + n, t->valuestring, l);
                n += l;
            }
            const cJSON *u =
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "usage"), "completion_tokens");
            if (cJSON_IsNumber(u)) c->tokens = u->valueint;
            cJSON_Delete(j);
        }
        line = next ? next + 2 : NULL;
    }
    c->framed = ok && done;
    dj_test_resp_free(&r);
}

static void *thread_main(void *p) {
    client *c = p;
    pthread_barrier_wait(&go); /* every request goes out at once */
    run(c);
    return NULL;
}

static void stats(const char *addr, dj_client_stats *st) {
    dj_client_t *cl = NULL;
    memset(st, 0, sizeof *st);
    CHECK_OK(dj_client_connect(addr, NULL, &cl));
    if (cl) CHECK_OK(dj_client_stats_get(cl, st));
    dj_client_free(cl);
}

int main(void) {
    /* nothing random: one run, no seeds */
    dj_test_daemon_guard();
    if (!mkdtemp(tmpdir)) return 1;
    char store[600], link[700];
    snprintf(store, sizeof store, "%s/store", tmpdir);
    snprintf(link, sizeof link, "%s/demo", store);
    if (mkdir(store, 0700) || symlink(DJ_SOURCE_DIR "/models/demo", link)) return 1;
    const char *args[] = {"--http", "127.0.0.1:0", "--http-max-connections", "80", "--http-max-per-address", "80", "--max-running", "64",
                          "--threads", "2", "--http-reuse", "0", "--local-admin", NULL}; /* the daemon-wide STATS */
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = store, .listen = "127.0.0.1:0",
                                   .wait_ms = 10000};
    char addr[128];
    pid_t pid = dj_test_daemon_start(0, &o, args, addr, sizeof addr, NULL);
    char path[700];
    snprintf(path, sizeof path, "%s/port0", tmpdir);
    FILE *f = fopen(path, "r");
    unsigned a = 0;
    if (f) {
        if (fscanf(f, "%u %u", &a, &http_port) != 2) http_port = 0;
        fclose(f);
    }
    CHECK_MSG(pid > 0 && http_port > 0, "djinnd --http did not start");
    if (pid > 0 && http_port > 0) {
        dj_client_stats before, after;
        stats(addr, &before);
        static client cs[N_CLIENTS];
        pthread_t th[N_CLIENTS];
        pthread_barrier_init(&go, NULL, N_CLIENTS + 1);
        const double t0 = dj_test_now_s();
        for (int i = 0; i < N_CLIENTS; i++) {
            cs[i].i = i;
            request_body(i, cs[i].body, sizeof cs[i].body);
            CHECK(pthread_create(&th[i], NULL, thread_main, &cs[i]) == 0);
        }
        pthread_barrier_wait(&go);
        for (int i = 0; i < N_CLIENTS; i++) pthread_join(th[i], NULL);
        const double wall = dj_test_now_s() - t0;
        pthread_barrier_destroy(&go);
        stats(addr, &after);
        int tokens = 0;
        for (int i = 0; i < N_CLIENTS; i++) {
            client alone = cs[i];
            run(&alone); /* the same request with nothing beside it */
            /* (an EOS may end one early: alone too) */
            CHECK_MSG(cs[i].status == 200 && cs[i].framed && cs[i].tokens >= 1 && cs[i].tokens <= MAX_TOKENS,
                      "client %d: status %d, framed %d, %d tokens", i, cs[i].status, cs[i].framed, cs[i].tokens);
            CHECK_MSG(alone.status == 200 && !strcmp(cs[i].text, alone.text) && alone.tokens == cs[i].tokens,
                      "client %d: '%s' among %d, '%s' alone", i, cs[i].text, N_CLIENTS, alone.text);
            tokens += cs[i].tokens;
            free(alone.text);
            free(cs[i].text);
        }
        /* they shared steps: rows per batched step well above one */
        const uint64_t steps = after.batched_steps - before.batched_steps, rows = after.batched_rows - before.batched_rows;
        CHECK_MSG(steps > 0 && rows >= 4 * steps, "%llu batched steps carried %llu rows", (unsigned long long)steps,
                  (unsigned long long)rows);
        printf("%d streaming clients at once: %d tokens in %.2f s (%.0f tok/s, a loaded CPU); %llu batched steps "
               "carried %llu rows\n", N_CLIENTS, tokens, wall, tokens / wall, (unsigned long long)steps,
               (unsigned long long)rows);
        /* nothing left behind */
        size_t left = 99;
        for (int k = 0; k < 600 && left; k++) {
            dj_client_stats st;
            stats(addr, &st);
            left = st.n_sessions;
            dj_client_stats_free(&st);
            if (left) dj_test_sleep_ms(50);
        }
        CHECK_MSG(left == 0, "%zu sessions left", left);
        dj_client_stats_free(&before);
        dj_client_stats_free(&after);
        CHECK(dj_test_daemon_stop(0, 10000) == 0);
    }
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_http_many");
}
