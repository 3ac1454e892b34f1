/* test_server_fifo.c: a FIFO (or directory) named like a model file in the store is a clear error, never a
 * hang (issue 43, finding 11) - in the loaders themselves and in djinnd (MODEL_INFO, MODEL_LOAD, GENERATE, the
 * HTTP door), which keeps serving the store's other models. Every step is bounded by a receive timeout. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djinn/chat_template.h"
#include "djinn/checkpoint.h"
#include "djinn/client.h"
#include "djinn/generate.h"
#include "djinn/tokenizer.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_fifo_XXXXXX";
static char store[400];

/* Each folder: the demo model's files, with the named one a FIFO (or a directory). */
static const struct {
    const char *dir, *file;
    bool as_dir;
} bad[] = {
    {"fifo-config", "config.json", false},        {"fifo-weights", "model.safetensors", false},
    {"fifo-tok", "tokenizer.json", false},        {"fifo-tpl", "chat_template.jinja", false},
    {"fifo-gen", "generation_config.json", false}, {"fifo-tokcfg", "tokenizer_config.json", false},
    {"dir-config", "config.json", true},
};
#define N_BAD (sizeof bad / sizeof *bad)

static bool make_store(void) {
    snprintf(store, sizeof store, "%s/store", tmpdir);
    char p[600], q[600];
    if (mkdir(store, 0700)) return false;
    snprintf(p, sizeof p, "%s/demo", store);
    if (symlink(DJ_SOURCE_DIR "/models/demo", p)) return false;
    static const char *const files[] = {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"};
    for (size_t k = 0; k < N_BAD; k++) {
        snprintf(p, sizeof p, "%s/%s", store, bad[k].dir);
        if (mkdir(p, 0700)) return false;
        for (int i = 0; i < 4; i++) {
            if (!strcmp(files[i], bad[k].file)) continue;
            snprintf(p, sizeof p, "%s/%s/%s", store, bad[k].dir, files[i]);
            snprintf(q, sizeof q, DJ_SOURCE_DIR "/models/demo/%s", files[i]);
            if (symlink(q, p)) return false;
        }
        snprintf(p, sizeof p, "%s/%s/%s", store, bad[k].dir, bad[k].file);
        if (bad[k].as_dir ? mkdir(p, 0700) : mkfifo(p, 0600)) return false;
    }
    return true;
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_server_fifo: a step hung for 120 s (a FIFO blocked a reader)\n";
    if (write(2, msg, sizeof msg - 1) < 0) {}
    raise(SIGABRT); /* dj_test_daemon_guard kills the daemons on SIGABRT */
}

/* The loaders alone: each refuses its FIFO with an error naming it, at once. */
static void test_loaders(void) {
    char dir[600], path[700];
    const double t0 = dj_test_now_s();
    snprintf(dir, sizeof dir, "%s/fifo-config", store);
    dj_checkpoint_t *ck = NULL;
    CHECK_ST(dj_checkpoint_open(dir, &ck), DJ_EFORMAT);
    CHECK_MSG(strstr(dj_last_error(), "config.json") && strstr(dj_last_error(), "not a regular file"), "%s",
              dj_last_error());
    snprintf(dir, sizeof dir, "%s/dir-config", store);
    CHECK_ST(dj_checkpoint_open(dir, &ck), DJ_EFORMAT);
    snprintf(dir, sizeof dir, "%s/fifo-weights", store);
    CHECK_ST(dj_checkpoint_open(dir, &ck), DJ_EFORMAT);
    CHECK_MSG(strstr(dj_last_error(), "model.safetensors") != NULL, "%s", dj_last_error());
    snprintf(path, sizeof path, "%s/fifo-tok/tokenizer.json", store);
    dj_tokenizer_t *tok = NULL;
    CHECK_ST(dj_tokenizer_load(path, &tok), DJ_EFORMAT);
    CHECK_MSG(strstr(dj_last_error(), "FIFO") != NULL, "%s", dj_last_error());
    snprintf(dir, sizeof dir, "%s/fifo-tpl", store);
    dj_chat_template_t *t = NULL;
    CHECK_ST(dj_chat_template_load(dir, &t), DJ_EFORMAT);
    snprintf(dir, sizeof dir, "%s/fifo-tokcfg", store);
    CHECK_ST(dj_chat_template_load(dir, &t), DJ_EFORMAT);
    snprintf(dir, sizeof dir, "%s/fifo-gen", store);
    dj_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int32_t ids[8];
    size_t n = 0;
    CHECK_ST(dj_gen_eos_ids(dir, &cfg, ids, 8, &n), DJ_EFORMAT);
    /* the healthy model still loads */
    snprintf(dir, sizeof dir, "%s/demo", store);
    CHECK_OK(dj_checkpoint_open(dir, &ck));
    dj_checkpoint_close(ck);
    CHECK_MSG(dj_test_now_s() - t0 < 30, "the loaders took %.1f s", dj_test_now_s() - t0);
}

static int http_status(unsigned port, const char *path, const char *body, char *out, size_t cap) {
    return dj_test_http_text(port, body ? "POST" : "GET", path, body, out, cap);
}

static void test_daemon(void) {
    char addr[128], body[4096];
    unsigned port = 0;
    pid_t pid = dj_test_http_daemon_start(0, tmpdir, store, NULL, addr, sizeof addr, &port);
    CHECK_MSG(pid > 0, "djinnd did not start");
    if (pid <= 0) return;
    CHECK(port > 0);
    const double t0 = dj_test_now_s();

    /* MODEL_INFO on the I/O loop: an ERROR naming the file. (A format error still closes its connection,
     * finding 12's part of issue 43: one connection per request here.) */
    static const char *const info_of[] = {"fifo-config", "dir-config", "fifo-gen", "fifo-tokcfg"};
    for (size_t k = 0; k < sizeof info_of / sizeof *info_of; k++) {
        dj_test_frame fr;
        const int fd = dj_test_raw_hello(addr, 30, NULL, &fr);
        CHECK(fd >= 0);
        if (fd < 0) continue;
        uint8_t m[512];
        dj__mw w;
        dj__mw_init(&w);
        dj__mw_str(&w, "model", info_of[k]);
        const size_t n = dj_test_meta_of(&w, m);
        CHECK(dj_test_raw_send(fd, DJ_MSG_MODEL_INFO, 10 + k, m, n, 0));
        fr = dj_test_raw_frame(fd, NULL);
        CHECK_MSG(fr.type == DJ_MSG_ERROR && (strstr(fr.msg, "regular file") || strstr(fr.msg, "FIFO")),
                  "MODEL_INFO %s: frame %d, %lld %s", info_of[k], fr.type, (long long)fr.st, fr.msg);
        close(fd);
    }

    /* MODEL_LOAD and GENERATE on the worker */
    static const char *const load_of[] = {"fifo-config", "fifo-weights"};
    for (int k = 0; k < 2; k++) {
        dj_client_t *c = NULL;
        CHECK_OK(dj_client_connect(addr, NULL, &c));
        if (!c) continue;
        CHECK(dj_client_model_load(c, load_of[k]) != DJ_OK);
        dj_client_free(c);
    }
    static const char *const gen_on[] = {"fifo-tok", "fifo-gen"};
    for (int k = 0; k < 2; k++) {
        dj_client_t *c = NULL;
        CHECK_OK(dj_client_connect(addr, NULL, &c));
        if (!c) continue;
        uint64_t s = 0;
        const dj_session_opts so = {.model = gen_on[k], .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 64};
        const dj_generate_params gp = {.prompt = "Hello", .max_tokens = 2};
        dj_status st = dj_client_session_open(c, &so, &s);
        if (st == DJ_OK) st = dj_client_generate(c, s, &gp, NULL, NULL, NULL);
        /* no tokenizer: refused; an unreadable generation_config.json: logged, config.json's EOS ids used */
        if (k == 0) CHECK_MSG(st != DJ_OK, "a text GENERATE on %s went through", gen_on[k]);
        else CHECK_MSG(st == DJ_OK, "GENERATE on %s: %s", gen_on[k], dj_last_error());
        dj_client_free(c);
    }
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (c) {
        dj_client_model *ms = NULL;
        size_t n = 0;
        CHECK_OK(dj_client_model_list(c, &ms, &n));
        free(ms);
        dj_client_free(c);
    }

    /* the HTTP door: 4xx for each, and the healthy model still answers */
    static const char *const http_on[] = {"fifo-config", "dir-config", "fifo-tok", "fifo-tpl", "fifo-tokcfg"};
    char req[512];
    for (size_t k = 0; k < sizeof http_on / sizeof *http_on; k++) {
        snprintf(req, sizeof req,
                 "{\"model\": \"%s\", \"max_tokens\": 2, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
                 http_on[k]);
        const int st = http_status(port, "/v1/chat/completions", req, body, sizeof body);
        CHECK_MSG(st >= 400 && st < 500, "HTTP chat on %s: %d %s", http_on[k], st, body);
    }
    snprintf(req, sizeof req, "{\"model\": \"fifo-tok\", \"max_tokens\": 2, \"prompt\": \"hi\"}");
    int st = http_status(port, "/v1/completions", req, body, sizeof body);
    CHECK_MSG(st == 400 && strstr(body, "tokenizer"), "HTTP completion on fifo-tok: %d %s", st, body);
    snprintf(req, sizeof req, "{\"model\": \"demo\", \"max_tokens\": 2, \"prompt\": \"hi\"}");
    st = http_status(port, "/v1/completions", req, body, sizeof body);
    CHECK_MSG(st == 200, "HTTP completion on demo after the FIFOs: %d %s", st, body);
    CHECK_MSG(dj_test_now_s() - t0 < 60, "the daemon steps took %.1f s", dj_test_now_s() - t0);
    CHECK_MSG(dj_test_daemon_stop(0, 10000) == 0, "djinnd did not exit cleanly on SIGTERM");
}

int main(void) {
    /* no dj_test_seeds(): nothing here is random, one run says it all */
    dj_test_daemon_guard();
    setvbuf(stdout, NULL, _IONBF, 0);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, on_alarm);
    if (!mkdtemp(tmpdir)) return 1;
    CHECK_MSG(make_store(), "could not build the store in %s", tmpdir);
    alarm(120);
    test_loaders();
    alarm(300);
    test_daemon();
    alarm(0);
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_server_fifo");
}
