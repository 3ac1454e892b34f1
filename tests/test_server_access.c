/* test_server_access.c: djinnd's logs (issue 50 item 5) - with --log-level info one access line per
 * request, binary (GENERATE, the worker's other requests, the I/O thread's, a refused one; no
 * successful HEARTBEAT) and HTTP alike, naming the token's name and never its secret, in
 * --log-format text and json; every line starts with (text) or holds (json "ts") an RFC 3339 UTC time. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "djinn/client.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_access_XXXXXX";
static char store[400], tokens[400];
#define SECRET "s3cret-alice-7f3a"

/* "2026-12-07T19:02:03.123Z": RFC 3339, UTC, milliseconds. */
static bool rfc3339(const char *p) {
    static const char shape[] = "dddd-dd-ddTdd:dd:dd.dddZ";
    for (size_t i = 0; shape[i]; i++)
        if (shape[i] == 'd' ? !isdigit((unsigned char)p[i]) : p[i] != shape[i]) return false;
    return true;
}

/* Starts djinnd with --log-format fmt, makes its requests, stops it and returns its stderr (malloc'd). */
static char *run_requests(int slot, const char *fmt) {
    const char *args[] = {"--http", "127.0.0.1:0", "--log-level", "info", "--log-format", fmt, "--token-file", tokens,
                          NULL};
    dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = store, .listen = "127.0.0.1:0",
                             .wait_ms = 60000, .save_stderr = true};
    char addr[128];
    const pid_t pid = dj_test_daemon_start(slot, &o, args, addr, sizeof addr, NULL);
    CHECK(pid > 0);
    if (pid <= 0) return NULL;
    const unsigned port = dj_test_http_port(tmpdir, slot);
    CHECK(port != 0);
    /* 1: a binary GENERATE */
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, SECRET, &c));
    if (c) {
        uint64_t sess = 0;
        const dj_session_opts so = {.model = "demo", .qos = DJ_QOS_BATCH, .expected_tokens = 64};
        const int32_t ids[3] = {5, 6, 7};
        dj_generate_params gp = {.ids = ids, .n_ids = 3, .max_tokens = 4, .ignore_eos = true};
        dj_generate_result res;
        CHECK_OK(dj_client_session_open(c, &so, &sess));
        CHECK_OK(dj_client_generate(c, sess, &gp, NULL, NULL, &res));
        /* the worker's (STATS; MODEL_LOAD of a model not in the store), the I/O thread's (HEARTBEAT: no line) */
        dj_client_stats st;
        CHECK_OK(dj_client_stats_get(c, &st));
        dj_client_stats_free(&st);
        CHECK_ST(dj_client_model_load(c, "nosuch"), DJ_ENOTFOUND);
        CHECK_OK(dj_client_heartbeat(c));
        dj_client_free(c);
    }
    /* 2: an HTTP completion, greedy (sampled with a fresh seed it may end at EOS after one
     * token; its door's GENERATE writes a binary line too), 3: an HTTP 404, 4: a 401 */
    const char *auth = "Authorization: Bearer " SECRET "\r\n";
    dj_test_resp r = dj_test_http_request(port, "POST", "/v1/completions", auth,
                                          "{\"model\": \"demo\", \"prompt\": [1, 2], \"max_tokens\": 2, \"temperature\": 0}");
    CHECK_MSG(r.status == 200, "completion: %d %s", r.status, r.body ? r.body : "");
    dj_test_resp_free(&r);
    r = dj_test_http_request(port, "GET", "/no/such/path", auth, NULL);
    CHECK(r.status == 404);
    dj_test_resp_free(&r);
    r = dj_test_http_request(port, "GET", "/v1/models", "Authorization: Bearer wrong-token\r\n", NULL);
    CHECK(r.status == 401);
    dj_test_resp_free(&r);
    CHECK(dj_test_daemon_stop(slot, 30000) == 0);
    char path[600];
    snprintf(path, sizeof path, "%s/err%d", tmpdir, slot);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f) return NULL;
    char *buf = calloc(1, 1 << 20);
    if (buf) buf[fread(buf, 1, (1 << 20) - 1, f)] = '\0';
    fclose(f);
    return buf;
}

static void test_text(void) {
    char *log = run_requests(0, "text");
    if (!log) return;
    CHECK_MSG(!strstr(log, SECRET), "the secret is in the log");
    int n_lines = 0, n_bin = 0, n_gen = 0, n_http = 0;
    bool gen_ok = false, door_ok = false, post_ok = false, miss_ok = false, unauth_ok = false;
    bool hello_ok = false, open_ok = false, stats_ok = false, load_ok = false;
    for (char *save = NULL, *l = strtok_r(log, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        n_lines++;
        CHECK_MSG(rfc3339(l) && l[24] == ' ', "a line without its time: '%s'", l);
        const char *a = strstr(l, " djinn info access: ");
        if (!a) continue;
        if (strstr(a, "door=binary")) {
            n_bin++;
            n_gen += strstr(a, "request=GENERATE ") != NULL;
            CHECK_MSG(!strstr(a, "request=HEARTBEAT"), "a HEARTBEAT's line: '%s'", a);
            hello_ok |= strstr(a, "token=alice request=HELLO model=- qos=- outcome=DJ_OK") && !strstr(a, "peer=door");
            open_ok |= strstr(a, "token=alice request=SESSION_OPEN model=demo qos=batch outcome=DJ_OK") != NULL;
            stats_ok |= strstr(a, "token=alice request=STATS model=- qos=interactive outcome=DJ_OK") != NULL;
            load_ok |= strstr(a, "token=alice request=MODEL_LOAD model=nosuch qos=interactive outcome=DJ_ENOTFOUND") != NULL;
            gen_ok |= strstr(a, "token=alice request=GENERATE model=demo qos=batch outcome=length") &&
                      strstr(a, "prompt_tokens=3 gen_tokens=4 queue_ms=") && strstr(a, "total_ms=") &&
                      !strstr(a, "peer=door");
            door_ok |= strstr(a, "peer=door token=alice") && strstr(a, "prompt_tokens=2 gen_tokens=2");
        } else if (strstr(a, "door=http")) {
            n_http++;
            post_ok |= strstr(a, "token=alice request=\"POST /v1/completions\"") && strstr(a, "status=200");
            miss_ok |= strstr(a, "request=\"GET /no/such/path\"") && strstr(a, "status=404");
            unauth_ok |= strstr(a, "token=- request=\"GET /v1/models\"") && strstr(a, "status=401");
            CHECK_MSG(strstr(a, "peer=127.0.0.1:"), "no peer: '%s'", a);
        }
    }
    /* binary: HELLO, SESSION_OPEN, STATS, MODEL_LOAD, GENERATE of the client, and the door's
     * SESSION_OPEN and GENERATE (it enters in-process: no HELLO of its own) */
    CHECK_MSG(n_gen == 2 && n_bin >= 7 && n_http == 3, "access lines: %d binary, %d GENERATE (want 2), %d http (want 3)",
              n_bin, n_gen, n_http);
    CHECK_MSG(gen_ok && door_ok && post_ok && miss_ok && unauth_ok, "generate %d door %d post %d 404 %d 401 %d",
              gen_ok, door_ok, post_ok, miss_ok, unauth_ok);
    CHECK_MSG(hello_ok && open_ok && stats_ok && load_ok, "HELLO %d SESSION_OPEN %d STATS %d MODEL_LOAD %d", hello_ok,
              open_ok, stats_ok, load_ok);
    CHECK(n_lines >= n_bin + n_http);
    free(log);
}

static void test_json(void) {
    char *log = run_requests(1, "json");
    if (!log) return;
    CHECK_MSG(!strstr(log, SECRET), "the secret is in the log");
    int n_bin = 0, n_other = 0, n_http = 0, n_lines = 0;
    for (char *save = NULL, *l = strtok_r(log, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(l);
        CHECK_MSG(o != NULL, "not JSON: '%s'", l);
        if (!o) continue;
        n_lines++;
        const cJSON *ts = cJSON_GetObjectItem(o, "ts"), *lvl = cJSON_GetObjectItem(o, "level");
        CHECK(cJSON_IsString(ts) && rfc3339(ts->valuestring) && strlen(ts->valuestring) == 24);
        CHECK(cJSON_IsString(lvl) && cJSON_IsString(cJSON_GetObjectItem(o, "msg")));
        const cJSON *type = cJSON_GetObjectItem(o, "type");
        if (cJSON_IsString(type) && !strcmp(type->valuestring, "access")) {
            const char *door = cJSON_GetStringValue(cJSON_GetObjectItem(o, "door"));
            const char *tok = cJSON_GetStringValue(cJSON_GetObjectItem(o, "token"));
            const cJSON *total = cJSON_GetObjectItem(o, "total_ms");
            CHECK(cJSON_IsNumber(total) && total->valuedouble >= 0);
            const char *req = cJSON_GetStringValue(cJSON_GetObjectItem(o, "request"));
            if (door && !strcmp(door, "binary") && req && !strcmp(req, "GENERATE")) {
                n_bin++;
                CHECK(tok && !strcmp(tok, "alice"));
                CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(o, "model")), "demo"));
                CHECK(cJSON_IsNumber(cJSON_GetObjectItem(o, "ttft_ms")));
            } else if (door && !strcmp(door, "binary")) {
                n_other++;
                CHECK(tok && !strcmp(tok, "alice"));
                CHECK(req && strcmp(req, "HEARTBEAT"));
            } else if (door && !strcmp(door, "http")) {
                n_http++;
                CHECK(cJSON_IsNumber(cJSON_GetObjectItem(o, "status")));
            }
        }
        cJSON_Delete(o);
    }
    CHECK_MSG(n_bin == 2 && n_http == 3, "access lines: %d GENERATE (want 2), %d http (want 3)", n_bin, n_http);
    CHECK_MSG(n_other >= 5, "%d other binary lines", n_other); /* as test_text's 7 but the GENERATEs */
    CHECK(n_lines > 5);
    free(log);
}

int main(void) {
    /* nothing here is random */
    dj_test_daemon_guard();
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!mkdtemp(tmpdir)) return 1;
    if (!dj_test_demo_store(tmpdir, store, sizeof store)) return 1;
    snprintf(tokens, sizeof tokens, "%s/tokens", tmpdir);
    FILE *f = fopen(tokens, "w");
    if (!f) return 1;
    fputs(SECRET " qos=interactive,batch name=alice\n", f);
    fclose(f);
    test_text();
    test_json();
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_server_access");
}
