/* test_server_sampling.c: djinnd takes every sampling field of the schema
 * (include/djinn/sample_schema.h) in range and refuses each one out of it, naming it. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "djinn/client.h"
#include "djinn/sample_schema.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_sampling_XXXXXX";
static const int32_t prompt[] = {1, 15, 27, 3, 8};

/* A GENERATE of 4 tokens with p on a fresh session; its status, the
 * error's text in err[cap]. */
static dj_status generate(dj_client_t *c, const dj_sampler_params *p, uint32_t *n_generated, char *err,
                          size_t cap) {
    uint64_t s = 0;
    const dj_session_opts so = {.model = "llama2", .qos = DJ_QOS_INTERACTIVE, .expected_tokens = 64};
    dj_status st = dj_client_session_open(c, &so, &s);
    if (st != DJ_OK) {
        snprintf(err, cap, "session: %s", dj_last_error());
        return st;
    }
    dj_generate_params gp = {.ids = prompt, .n_ids = sizeof prompt / sizeof *prompt, .max_tokens = 4,
                             .sampling = *p};
    dj_generate_result res;
    memset(&res, 0, sizeof res);
    st = dj_client_generate(c, s, &gp, NULL, NULL, &res);
    snprintf(err, cap, "%s", st == DJ_OK ? "" : dj_last_error());
    *n_generated = res.n_generated;
    dj_client_session_close(c, s);
    return st;
}

/* Sampled (T 0.8, top-k 40, seed 7) with one field set to v. */
static dj_sampler_params with(const dj_sample_field *f, double v) {
    dj_sampler_params p = {.temperature = 0.8f, .top_k = 40, .top_p = 1.0f, .seed = 7};
    dj_sample_field_set_f64(&p, f, v);
    return p;
}

static void test_fields(const char *addr) {
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (!c) return;
    char err[512];
    uint32_t n = 0;
    for (size_t i = 0; i < dj_sample_n_fields; i++) {
        const dj_sample_field *f = &dj_sample_fields[i];
        if (f->type != DJ_SAMPLE_F32) continue; /* integers: any value of their type */
        /* inside: three quarters into its range (a finite range; else lo + 0.5) */
        const double in = isinf(f->hi) ? f->lo + 0.5 : f->lo + (f->hi - f->lo) * 0.75;
        dj_sampler_params p = with(f, in);
        CHECK_MSG(generate(c, &p, &n, err, sizeof err) == DJ_OK && n == 4, "%s = %g refused: %s", f->name, in,
                  err);
        /* outside: past hi (NaN when unbounded above) */
        const double out = isinf(f->hi) ? NAN : f->hi + 0.5;
        p = with(f, out);
        const dj_status st = generate(c, &p, &n, err, sizeof err);
        CHECK_MSG(st == DJ_EINVAL && strstr(err, f->name) && strstr(err, "out of range"),
                  "%s = %g: status %d, '%s' (want DJ_EINVAL naming the field)", f->name, out, (int)st, err);
    }
    /* top_a by name (issue 42: the field added to prove the schema) */
    dj_sampler_params a = {.temperature = 0.8f, .top_p = 1.0f, .seed = 3, .top_a = 0.3f};
    CHECK_MSG(generate(c, &a, &n, err, sizeof err) == DJ_OK && n == 4, "top_a 0.3 refused: %s", err);
    a.top_a = 1.5f;
    CHECK_ST(generate(c, &a, &n, err, sizeof err), DJ_EINVAL);
    CHECK_MSG(strstr(err, "top_a 1.5 is out of range: must be in [0, 1]") != NULL, "top_a 1.5: '%s'", err);
    CHECK_OK(dj_client_heartbeat(c)); /* the refusals left the connection serving */
    dj_client_free(c);
}

int main(void) {
    dj_test_seeds();
    dj_test_daemon_guard();
    if (!mkdtemp(tmpdir)) return 1;
    char addr[128];
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = DJ_FIXTURES "/models",
                                   .listen = "127.0.0.1:0", .wait_ms = 10000};
    const pid_t pid = dj_test_daemon_start(0, &o, NULL, addr, sizeof addr, NULL);
    CHECK_MSG(pid > 0, "djinnd did not start");
    if (pid > 0) {
        test_fields(addr);
        CHECK_MSG(dj_test_daemon_stop(0, 10000) == 0, "djinnd did not exit cleanly on SIGTERM");
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) {}
    return dj_test_finish("test_server_sampling");
}
