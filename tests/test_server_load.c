/* test_server_load.c: issue 50 item 6 against a real djinnd - a model load held half way
 * ($DJINN_TEST_LOAD_HOLD) is listed by STATS and /health, logs its lines, and --preload. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djinn/client.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_load_XXXXXX";
static char store[400];

/* Sends one request frame with an optional `model`: -2 once sent, -1 on failure. */
static int call(int fd, uint16_t type, uint64_t req, const char *model) {
    dj__mw w;
    uint8_t meta[512];
    dj__mw_init(&w);
    if (model) dj__mw_str(&w, "model", model);
    const size_t n = dj_test_meta_of(&w, meta);
    if (!dj_test_raw_send(fd, type, req, meta, n, 0)) return -1;
    return -2; /* sent: the caller reads */
}

/* The next frame: its metadata parsed into *m; its type, or -1. */
static int read_reply(int fd, dj__meta *m) {
    uint8_t hb[DJ_FRAME_HEADER_BYTES];
    dj_frame_header h;
    if (dj_test_raw_recv(fd, hb, sizeof hb) != 0) return -1;
    if (dj_frame_header_decode(hb, DJ_PROTO_MAX_REPLY_PAYLOAD, &h) != DJ_OK) return -1;
    uint8_t *meta = malloc(h.meta_len + h.payload_len + 1);
    if (!meta || dj_test_raw_recv(fd, meta, h.meta_len + h.payload_len) != 0) {
        free(meta);
        return -1;
    }
    const dj_status st = dj__meta_parse(m, meta, h.meta_len);
    free(meta);
    return st == DJ_OK ? (int)h.type : -1;
}

static bool str_is(const msgpack_object *o, const char *s) {
    return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) && !memcmp(o->via.str.ptr, s, o->via.str.size);
}

static void test_held_load(void) {
    char hold[512], err_path[512];
    snprintf(hold, sizeof hold, "%s/go", tmpdir);
    snprintf(err_path, sizeof err_path, "%s/err0", tmpdir);
    setenv("DJINN_TEST_LOAD_HOLD", hold, 1);
    const char *extra[] = {"--http", "127.0.0.1:0", "--local-admin", NULL};
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = store, .listen = "127.0.0.1:0",
                                   .save_stderr = true, .wait_ms = 20000};
    char addr[128];
    const pid_t pid = dj_test_daemon_start(0, &o, extra, addr, sizeof addr, NULL);
    unsetenv("DJINN_TEST_LOAD_HOLD");
    CHECK(pid > 0);
    if (pid <= 0) return;
    const unsigned http_port = dj_test_http_port(tmpdir, 0);
    CHECK(http_port > 0);

    /* before any load: healthy, nothing loading */
    char body[4096];
    CHECK_MSG(dj_test_http_text(http_port, "GET", "/health", NULL, body, sizeof body) == 200, "%s", body);
    CHECK_MSG(strstr(body, "\"status\":\"ok\""), "%s", body);

    dj_test_frame ans;
    const int a = dj_test_raw_hello(addr, 60, NULL, &ans), b = dj_test_raw_hello(addr, 60, NULL, &ans);
    CHECK(a >= 0 && b >= 0);
    if (a < 0 || b < 0) return;
    dj__meta m;
    CHECK(call(a, DJ_MSG_MODEL_LOAD, 2, "demo") == -2); /* held at its first bytes */

    /* STATS on another connection is answered during the load and lists it */
    bool seen = false;
    uint64_t done = 0, total = 0;
    for (int i = 0; i < 3000 && !seen; i++) { /* the hold keeps it listed: the bound only catches a hang */
        CHECK(call(b, DJ_MSG_STATS, 10 + (uint64_t)i, NULL) == -2);
        const int t = read_reply(b, &m);
        CHECK(t == DJ_MSG_REPLY);
        if (t != DJ_MSG_REPLY) break;
        const msgpack_object *busy = dj__meta_get(&m, "busy"), *ld = dj__meta_get(&m, "loading");
        if (str_is(busy, "loading") && ld && ld->type == MSGPACK_OBJECT_ARRAY && ld->via.array.size == 1) {
            const msgpack_object *e = &ld->via.array.ptr[0];
            CHECK(str_is(dj__obj_get(e, "name"), "demo"));
            CHECK(dj__obj_u64(dj__obj_get(e, "bytes_done"), &done));
            CHECK(dj__obj_u64(dj__obj_get(e, "bytes_total"), &total));
            seen = true;
        }
        dj__meta_destroy(&m);
        if (!seen) dj_test_sleep_ms(10);
    }
    CHECK_MSG(seen, "STATS never listed the held load");
    CHECK_MSG(done > 0 && done <= total, "bytes %llu of %llu", (unsigned long long)done, (unsigned long long)total);
    /* the demo model's weights: its safetensors file less the header */
    struct stat sb;
    CHECK(stat(DJ_SOURCE_DIR "/models/demo/model.safetensors", &sb) == 0);
    CHECK_MSG(total > 0 && total < (uint64_t)sb.st_size && total > (uint64_t)sb.st_size / 2, "total %llu of a %lld-byte file",
              (unsigned long long)total, (long long)sb.st_size);

    /* libdjinn reads the same reply (the fields every STATS has are there, empty) */
    dj_client_t *cl = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &cl));
    dj_client_stats cs;
    CHECK_OK(dj_client_stats_get(cl, &cs));
    CHECK(cs.busy_loading && cs.n_loading == 1 && !strcmp(cs.loading[0].name, "demo") && cs.loading[0].bytes_done >= done &&
          cs.loading[0].bytes_done <= cs.loading[0].bytes_total); /* other reading threads may have reported since */
    dj_client_stats_free(&cs);
    dj_client_free(cl);

    /* /health: 503, "loading", the model and its bytes */
    CHECK_MSG(dj_test_http_text(http_port, "GET", "/health", NULL, body, sizeof body) == 503, "%s", body);
    CHECK_MSG(strstr(body, "\"status\":\"loading\"") && strstr(body, "\"model\":\"demo\"") &&
                  strstr(body, "\"bytes_total\""),
              "%s", body);

    /* let it go: MODEL_LOAD answers, STATS is the worker's full one again, /health ok */
    const int fd = open(hold, O_WRONLY | O_CREAT, 0600);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    CHECK(read_reply(a, &m) == DJ_MSG_REPLY);
    dj__meta_destroy(&m);
    CHECK(call(b, DJ_MSG_STATS, 9999, NULL) == -2);
    CHECK(read_reply(b, &m) == DJ_MSG_REPLY);
    const msgpack_object *ld = dj__meta_get(&m, "loading");
    CHECK(!dj__meta_get(&m, "busy") && dj__meta_get(&m, "segments"));
    CHECK(ld && ld->type == MSGPACK_OBJECT_ARRAY && ld->via.array.size == 0);
    dj__meta_destroy(&m);
    CHECK_MSG(dj_test_http_text(http_port, "GET", "/health", NULL, body, sizeof body) == 200, "%s", body);
    close(a);
    close(b);
    CHECK(dj_test_daemon_stop(0, 30000) == 0);

    /* the log: a last line with the bytes and the rate (progress lines come only every 0.5 s) */
    char *log = dj_test_read_file(err_path, NULL);
    CHECK(log != NULL);
    CHECK_MSG(log && strstr(log, "model demo: loaded, ") && strstr(log, " GB read in ") && strstr(log, " GB/s)"), "%s",
              log ? log : "");
    free(log);
}

static void test_preload(void) {
    char err_path[512];
    snprintf(err_path, sizeof err_path, "%s/err1", tmpdir);
    /* a name not in the store stops the start, naming it */
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = store, .listen = "127.0.0.1:0",
                                   .save_stderr = true, .wait_ms = 20000};
    const char *bad[] = {"--preload", "demo,nosuch", NULL};
    char addr[128];
    int code = 0;
    pid_t pid = dj_test_daemon_start(1, &o, bad, addr, sizeof addr, &code);
    CHECK_MSG(pid < 0 && code != 0, "pid %d exit %d", (int)pid, code);
    char *log = dj_test_read_file(err_path, NULL);
    CHECK_MSG(log && strstr(log, "no model 'nosuch' in the store"), "%s", log ? log : "");
    free(log);
    const char *empty[] = {"--preload", "demo,", NULL};
    pid = dj_test_daemon_start(1, &o, empty, addr, sizeof addr, &code);
    CHECK_MSG(pid < 0 && code != 0, "pid %d exit %d", (int)pid, code);

    /* a good list: the model is pinned before the port is written */
    const char *good[] = {"--preload", "demo", "--local-admin", NULL};
    pid = dj_test_daemon_start(1, &o, good, addr, sizeof addr, NULL);
    CHECK(pid > 0);
    if (pid <= 0) return;
    dj_test_frame ans;
    const int fd = dj_test_raw_hello(addr, 60, NULL, &ans);
    CHECK(fd >= 0);
    dj__meta m;
    CHECK(call(fd, DJ_MSG_STATS, 2, NULL) == -2);
    CHECK(read_reply(fd, &m) == DJ_MSG_REPLY);
    const msgpack_object *ms = dj__meta_get(&m, "models");
    CHECK(ms && ms->type == MSGPACK_OBJECT_ARRAY && ms->via.array.size == 1);
    if (ms && ms->type == MSGPACK_OBJECT_ARRAY && ms->via.array.size == 1) {
        const msgpack_object *pin = dj__obj_get(&ms->via.array.ptr[0], "pinned");
        CHECK(str_is(dj__obj_get(&ms->via.array.ptr[0], "name"), "demo"));
        CHECK(pin && pin->type == MSGPACK_OBJECT_BOOLEAN && pin->via.boolean);
    }
    dj__meta_destroy(&m);
    close(fd);
    CHECK(dj_test_daemon_stop(1, 30000) == 0);
    log = dj_test_read_file(err_path, NULL);
    CHECK_MSG(log && strstr(log, "model demo: loaded, ") && strstr(log, "model demo: preloaded"), "%s", log ? log : "");
    free(log);
}

int main(void) {
    /* nothing here is random or timed: the hold file decides when the load goes on */
    dj_test_daemon_guard();
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!mkdtemp(tmpdir)) return 1;
    if (!dj_test_demo_store(tmpdir, store, sizeof store)) return 1;
    test_held_load();
    test_preload();
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_server_load");
}
