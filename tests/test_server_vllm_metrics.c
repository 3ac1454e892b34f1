/* test_server_vllm_metrics.c: issue 50 item 7 - /metrics parsed strictly as Prometheus' text format
 * (names, labels, values, TYPE before samples, cumulative buckets) and its per-model vLLM-style series
 * moving by exactly what the GENERATEs between two scrapes did. */
#define _GNU_SOURCE
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "djinn/client.h"
#include "daemon_util.h"
#include "testutil.h"

static char tmpdir[] = "/tmp/dj_vmetrics_XXXXXX";
static char store[400];

/* ---- a strict parser of the text format (version 0.0.4) ---- */

#define MAX_SAMPLES 8192
typedef struct sample {
    char name[128];
    char labels[256]; /* k="v",... as written, le included */
    char le[32];      /* the le label's value, "" when none */
    char model[128];
    char reason[32];
    double value;
} sample;

typedef struct family {
    char name[128];
    char type[16];
} family;

typedef struct scrape {
    sample *s; /* [MAX_SAMPLES] */
    size_t n;
    family f[512];
    size_t n_f;
} scrape;

static bool name_ok(const char *p, size_t n) {
    if (!n || !(isalpha((unsigned char)p[0]) || p[0] == '_' || p[0] == ':')) return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)p[i]) || p[i] == '_' || p[i] == ':')) return false;
    return true;
}

static const family *family_of(const scrape *sc, const char *sample_name) {
    for (size_t i = 0; i < sc->n_f; i++) {
        const size_t l = strlen(sc->f[i].name);
        if (strncmp(sample_name, sc->f[i].name, l)) continue;
        const char *rest = sample_name + l;
        if (!*rest) return &sc->f[i];
        if (!strcmp(sc->f[i].type, "histogram") &&
            (!strcmp(rest, "_bucket") || !strcmp(rest, "_sum") || !strcmp(rest, "_count")))
            return &sc->f[i];
    }
    return NULL;
}

/* Parses body into sc; false (with the line) on the first line that breaks the format. */
static bool parse(char *body, scrape *sc, char *why, size_t cap) {
    sc->n = sc->n_f = 0;
    int lineno = 0;
    for (char *line = strtok(body, "\n"); line; line = strtok(NULL, "\n")) {
        lineno++;
        if (line[0] == '#') {
            char kind[8], name[128], rest[256];
            if (sscanf(line, "# %7s %127s %255[^\n]", kind, name, rest) < 2)
                return snprintf(why, cap, "line %d: bad comment '%s'", lineno, line), false;
            if (!strcmp(kind, "TYPE")) {
                if (!name_ok(name, strlen(name))) return snprintf(why, cap, "line %d: bad name", lineno), false;
                if (strcmp(rest, "counter") && strcmp(rest, "gauge") && strcmp(rest, "histogram") &&
                    strcmp(rest, "summary") && strcmp(rest, "untyped"))
                    return snprintf(why, cap, "line %d: bad type '%.32s'", lineno, rest), false;
                for (size_t i = 0; i < sc->n_f; i++)
                    if (!strcmp(sc->f[i].name, name))
                        return snprintf(why, cap, "line %d: TYPE of %s twice", lineno, name), false;
                for (size_t i = 0; i < sc->n; i++)
                    if (!strcmp(sc->s[i].name, name))
                        return snprintf(why, cap, "line %d: TYPE of %s after its samples", lineno, name), false;
                if (sc->n_f == sizeof sc->f / sizeof *sc->f) return snprintf(why, cap, "too many families"), false;
                snprintf(sc->f[sc->n_f].name, sizeof sc->f[0].name, "%s", name);
                snprintf(sc->f[sc->n_f].type, sizeof sc->f[0].type, "%.15s", rest);
                sc->n_f++;
            } else if (strcmp(kind, "HELP")) {
                return snprintf(why, cap, "line %d: comment '%s' is neither HELP nor TYPE", lineno, kind), false;
            }
            continue;
        }
        if (sc->n == MAX_SAMPLES) return snprintf(why, cap, "too many samples"), false;
        sample *s = &sc->s[sc->n];
        memset(s, 0, sizeof *s);
        const char *p = line;
        size_t nl = 0;
        while (p[nl] && p[nl] != '{' && p[nl] != ' ') nl++;
        if (!name_ok(p, nl) || nl >= sizeof s->name) return snprintf(why, cap, "line %d: bad name '%s'", lineno, line), false;
        memcpy(s->name, p, nl);
        p += nl;
        if (*p == '{') {
            const char *lab0 = ++p;
            while (*p != '}') {
                size_t kl = 0;
                while (p[kl] && p[kl] != '=') kl++;
                if (!name_ok(p, kl) || p[kl + 1] != '"') return snprintf(why, cap, "line %d: bad label", lineno), false;
                char key[64] = "", val[256] = "";
                if (kl < sizeof key) memcpy(key, p, kl);
                p += kl + 2;
                size_t vl = 0;
                while (*p && *p != '"') {
                    if (*p == '\\') {
                        p++;
                        if (*p != '\\' && *p != '"' && *p != 'n')
                            return snprintf(why, cap, "line %d: bad escape", lineno), false;
                    }
                    if (!*p) break;
                    if (vl + 1 < sizeof val) val[vl++] = *p;
                    p++;
                }
                if (*p != '"') return snprintf(why, cap, "line %d: unterminated label value", lineno), false;
                p++;
                if (!strcmp(key, "le")) snprintf(s->le, sizeof s->le, "%.31s", val);
                if (!strcmp(key, "model")) snprintf(s->model, sizeof s->model, "%.127s", val);
                if (!strcmp(key, "finished_reason")) snprintf(s->reason, sizeof s->reason, "%.31s", val);
                if (*p == ',') p++;
                else if (*p != '}') return snprintf(why, cap, "line %d: want ',' or '}'", lineno), false;
            }
            snprintf(s->labels, sizeof s->labels, "%.*s", (int)(p - lab0), lab0);
            p++;
        }
        if (*p != ' ') return snprintf(why, cap, "line %d: no space before the value", lineno), false;
        p++;
        char *end;
        if (!strcmp(p, "+Inf")) s->value = INFINITY;
        else if (!strcmp(p, "-Inf")) s->value = -INFINITY;
        else if (!strcmp(p, "NaN")) s->value = NAN;
        else {
            s->value = strtod(p, &end);
            if (end == p || (*end && *end != ' ')) return snprintf(why, cap, "line %d: bad value '%s'", lineno, p), false;
        }
        const family *f = family_of(sc, s->name);
        if (!f) return snprintf(why, cap, "line %d: sample %s without a TYPE before it", lineno, s->name), false;
        if (!strcmp(f->type, "counter") && !(s->value >= 0))
            return snprintf(why, cap, "line %d: counter %s below 0", lineno, s->name), false;
        for (size_t i = 0; i < sc->n; i++)
            if (!strcmp(sc->s[i].name, s->name) && !strcmp(sc->s[i].labels, s->labels))
                return snprintf(why, cap, "line %d: %s{%s} twice", lineno, s->name, s->labels), false;
        sc->n++;
    }
    /* histograms: per label set (less le), le ascending, counts cumulative, +Inf last and equal to _count */
    for (size_t i = 0; i < sc->n_f; i++) {
        if (strcmp(sc->f[i].type, "histogram")) continue;
        char bucket[160], count[160];
        snprintf(bucket, sizeof bucket, "%s_bucket", sc->f[i].name);
        snprintf(count, sizeof count, "%s_count", sc->f[i].name);
        for (size_t k = 0; k < sc->n; k++) {
            if (strcmp(sc->s[k].name, count)) continue;
            double prev_le = -INFINITY, prev_v = 0;
            bool inf = false;
            size_t buckets = 0;
            for (size_t b = 0; b < sc->n; b++) {
                if (strcmp(sc->s[b].name, bucket) || strcmp(sc->s[b].model, sc->s[k].model)) continue;
                const double le = !strcmp(sc->s[b].le, "+Inf") ? INFINITY : strtod(sc->s[b].le, NULL);
                if (!sc->s[b].le[0] || le <= prev_le || sc->s[b].value < prev_v || inf)
                    return snprintf(why, cap, "%s{model=%s}: buckets out of order at le=%s", bucket, sc->s[k].model,
                                    sc->s[b].le), false;
                prev_le = le;
                prev_v = sc->s[b].value;
                inf = isinf(le);
                buckets++;
            }
            if (!inf || prev_v != sc->s[k].value)
                return snprintf(why, cap, "%s{model=%s}: +Inf bucket %g, count %g", bucket, sc->s[k].model, prev_v,
                                sc->s[k].value), false;
            if (buckets < 2) return snprintf(why, cap, "%s: %zu buckets", bucket, buckets), false;
        }
    }
    return true;
}

/* The value of name with model (and finished_reason, le when given); NAN when absent. */
static double get(const scrape *sc, const char *name, const char *model, const char *reason, const char *le) {
    for (size_t i = 0; i < sc->n; i++) {
        const sample *s = &sc->s[i];
        if (strcmp(s->name, name) || strcmp(s->model, model)) continue;
        if (reason && strcmp(s->reason, reason)) continue;
        if (le && strcmp(s->le, le)) continue;
        return s->value;
    }
    return NAN;
}

static const char *type_of(const scrape *sc, const char *family) {
    for (size_t i = 0; i < sc->n_f; i++)
        if (!strcmp(sc->f[i].name, family)) return sc->f[i].type;
    return "";
}

static bool do_scrape(const char *mport, scrape *sc) {
    int fd = dj_test_raw_connect(mport, NULL, 30, 0);
    if (fd < 0) return false;
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
    size_t cap = 1 << 20, got = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while (buf && got < cap - 1 && (k = recv(fd, buf + got, cap - 1 - got, 0)) > 0) got += (size_t)k;
    close(fd);
    if (!buf) return false;
    buf[got] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    CHECK_MSG(body && !strncmp(buf + 8, " 200", 4) && !strncmp(buf, "HTTP/1.", 7) && got < cap - 1, "%.200s", buf);
    char why[512] = "";
    const bool ok = body && parse(body + 4, sc, why, sizeof why);
    CHECK_MSG(ok, "/metrics is not valid Prometheus text: %s", why);
    free(buf);
    return ok;
}

int main(void) {
    /* nothing here is random: greedy generations of fixed prompts */
    dj_test_daemon_guard();
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!mkdtemp(tmpdir)) return 1;
    if (!dj_test_demo_store(tmpdir, store, sizeof store)) return 1;
    char addr[128], mport[64];
    const char *extra[] = {"--metrics", mport, "--local-admin", NULL};
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = store, .listen = "127.0.0.1:0",
                                   .wait_ms = 20000};
    pid_t pid = -1;
    for (int attempt = 0, code = 0; attempt < 5 && pid <= 0; attempt++) { /* a port another test took: retry */
        snprintf(mport, sizeof mport, "127.0.0.1:%d", dj_test_free_port());
        pid = dj_test_daemon_start(0, &o, extra, addr, sizeof addr, &code);
        if (pid <= 0 && code == 0) break;
    }
    CHECK(pid > 0);
    if (pid <= 0) return dj_test_finish("test_server_vllm_metrics");
    scrape a = {.s = calloc(MAX_SAMPLES, sizeof(sample))}, b = {.s = calloc(MAX_SAMPLES, sizeof(sample))};
    CHECK(a.s && b.s);

    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    dj_session_opts so = {.model = "demo"};
    uint64_t s1 = 0, s2 = 0;
    CHECK_OK(dj_client_session_open(c, &so, &s1));
    CHECK(do_scrape(mport, &a)); /* after the session opened: its model's rows may exist */

    /* three generations: two to their length, one stopped by a stop id; a fourth refused
     * (an id past the vocabulary); a second session repeats the first prompt (prefix-cache hits:
     * its two full 64-token blocks) */
    int32_t prompt[150];
    for (int i = 0; i < 150; i++) prompt[i] = 5 + (i * 37) % 1000;
    dj_generate_params p = {.ids = prompt, .n_ids = 150, .max_tokens = 6, .ignore_eos = true};
    dj_generate_result r[4];
    memset(r, 0, sizeof r);
    CHECK_OK(dj_client_generate(c, s1, &p, NULL, NULL, &r[0]));
    CHECK(!strcmp(r[0].reason, "length") && r[0].n_generated == 6);
    /* the greedy continuation of [prompt, its 6 tokens, t] : stop at the 3rd token of a fresh run */
    CHECK_OK(dj_client_session_open(c, &so, &s2));
    int32_t toks[8];
    size_t nt = 0;
    dj_client_gen_t *g = NULL;
    CHECK_OK(dj_client_generate_start(c, s2, &p, &g));
    for (dj_client_event ev; g && dj_client_generate_next(g, 30000, &ev, &r[1]) == DJ_OK && ev.kind != DJ_CLIENT_EVENT_DONE;)
        if (ev.kind == DJ_CLIENT_EVENT_TOKEN && nt < 8) toks[nt++] = ev.id;
    dj_client_generate_end(g);
    CHECK(nt == 6 && !strcmp(r[1].reason, "length"));
    CHECK_MSG(r[1].cached > 0, "the repeated prompt mapped %u cached ids", r[1].cached);
    uint64_t s3 = 0;
    CHECK_OK(dj_client_session_open(c, &so, &s3));
    int32_t stop = nt >= 3 ? toks[2] : 0;
    dj_generate_params ps = p;
    ps.stop_ids = &stop;
    ps.n_stop = 1;
    CHECK_OK(dj_client_generate(c, s3, &ps, NULL, NULL, &r[2]));
    CHECK_MSG(!strcmp(r[2].reason, "stop") && r[2].n_generated == 2, "reason %s, %u tokens", r[2].reason,
              r[2].n_generated);
    int32_t bad = 1 << 30;
    dj_generate_params pb = {.ids = &bad, .n_ids = 1, .max_tokens = 2};
    CHECK(dj_client_generate(c, s1, &pb, NULL, NULL, NULL) != DJ_OK);
    CHECK(do_scrape(mport, &b));

    /* the moves, exactly */
    const uint32_t n_prompt = r[0].n_prompt + r[1].n_prompt + r[2].n_prompt;
    const uint32_t n_gen = r[0].n_generated + r[1].n_generated + r[2].n_generated;
    const uint32_t cached = r[0].cached + r[1].cached + r[2].cached;
    CHECK(n_prompt == 450 && n_gen == 14);
    /* the refused GENERATE started (its one id counted) and failed at its prompt */
#define DELTA(name, reason, le) (get(&b, name, "demo", reason, le) - (isnan(get(&a, name, "demo", reason, le)) ? 0 : get(&a, name, "demo", reason, le)))
#define CHECK_DELTA(name, reason, le, want)                                                                      \
    CHECK_MSG(DELTA(name, reason, le) == (double)(want), "%s%s%s moved by %g, want %g", name, reason ? " " : "",  \
              reason ? reason : "", DELTA(name, reason, le), (double)(want))
    CHECK_DELTA("djinn_prompt_tokens_total", NULL, NULL, n_prompt + 1);
    CHECK_DELTA("djinn_generation_tokens_total", NULL, NULL, n_gen);
    CHECK_DELTA("djinn_prefix_cache_queries_total", NULL, NULL, n_prompt + 1);
    CHECK_DELTA("djinn_prefix_cache_hits_total", NULL, NULL, cached);
    CHECK_DELTA("djinn_request_finished_total", "length", NULL, 2);
    CHECK_DELTA("djinn_request_finished_total", "stop", NULL, 1);
    CHECK_DELTA("djinn_request_finished_total", "abort", NULL, 0);
    CHECK_DELTA("djinn_request_finished_total", "error", NULL, 1);
    CHECK_DELTA("djinn_request_e2e_seconds_count", NULL, NULL, 4);
    CHECK_DELTA("djinn_request_ttft_seconds_count", NULL, NULL, 3);
    CHECK_DELTA("djinn_request_time_per_output_token_seconds_count", NULL, NULL, 3);
    CHECK_DELTA("djinn_request_queue_seconds_count", NULL, NULL, 4);
    CHECK_DELTA("djinn_request_prompt_tokens_count", NULL, NULL, 4);
    CHECK_DELTA("djinn_request_prompt_tokens_sum", NULL, NULL, n_prompt + 1);
    CHECK_DELTA("djinn_request_generation_tokens_sum", NULL, NULL, n_gen);
    /* 150-token prompts and the refused one's single id: le=200 has all four, le=100 the one */
    CHECK_DELTA("djinn_request_prompt_tokens_bucket", NULL, "200", 4);
    CHECK_DELTA("djinn_request_prompt_tokens_bucket", NULL, "100", 1);
    CHECK_DELTA("djinn_request_prompt_tokens_bucket", NULL, "1", 1);
    /* the buckets reach 60 s; the gauges and the KV ratio are there, typed */
    CHECK(!isnan(get(&b, "djinn_request_e2e_seconds_bucket", "demo", NULL, "60")));
    CHECK(!isnan(get(&b, "djinn_request_ttft_seconds_bucket", "demo", NULL, "60")));
    CHECK(!strcmp(type_of(&b, "djinn_requests_running"), "gauge") && !strcmp(type_of(&b, "djinn_requests_waiting"), "gauge"));
    CHECK(get(&b, "djinn_requests_running", "demo", NULL, NULL) >= 0 && get(&b, "djinn_requests_waiting", "demo", NULL, NULL) >= 0);
    CHECK(!strcmp(type_of(&b, "djinn_request_ttft_seconds"), "histogram"));
    CHECK(!strcmp(type_of(&b, "djinn_request_finished_total"), "counter"));
    const double kv = get(&b, "djinn_kv_cache_usage_ratio", "", NULL, NULL);
    CHECK_MSG(kv > 0 && kv <= 1, "kv usage %g with three sessions open", kv);

    dj_client_free(c);
    free(a.s);
    free(b.s);
    CHECK(dj_test_daemon_stop(0, 30000) == 0);
    CHECK(dj_test_rm_rf(tmpdir));
    return dj_test_finish("test_server_vllm_metrics");
}
