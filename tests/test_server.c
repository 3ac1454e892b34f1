/* test_server.c: a real djinnd on loopback with the CPU engine on fixture
 * models - reference tokens through the wire, 64 concurrent clients, killed
 * clients and lapsed leases giving memory back, open/close cycles without fd
 * leaks, malformed frames refused without hurting others, metrics, unix
 * sockets with a token, clean shutdown. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "djinn/client.h"
#include "djinn/sampler.h"
#include "proto/proto_impl.h"
#include "daemon_util.h"
#include "testutil.h"

#define N_MODELS 5
#define N_CLIENTS 64
static const char *model_names[N_MODELS] = {"llama2", "llama3", "mistral", "qwen2", "tinyllama"};

typedef struct ref {
    int32_t prompt[64], greedy[64];
    int n_prompt, n_greedy;
} ref;
static ref refs[N_MODELS];

static char tmpdir[256];

/* djinnd on fixture models with extra args; *addr gets where it listens. */
static pid_t start_daemon_code(int slot, const char *listen, const char *const *extra, char *addr, size_t cap,
                               int *exit_code) {
    const dj_test_daemon_opts o = {.djinnd = DJ_DJINND, .dir = tmpdir, .models = DJ_FIXTURES "/models",
                                   .listen = listen, .wait_ms = 10000};
    return dj_test_daemon_start(slot, &o, extra, addr, cap, exit_code);
}
static pid_t start_daemon(int slot, const char *listen, const char *const *extra, char *addr, size_t cap) {
    return start_daemon_code(slot, listen, extra, addr, cap, NULL);
}

/* SIGTERM, then wait at most 10 s (SIGKILL after); returns the exit status or -1. */
static int stop_daemon(int slot) { return dj_test_daemon_stop(slot, 10000); }

static int count_fds(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static int read_ints(const cJSON *a, int32_t *out, int cap) {
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) if (n < cap) out[n++] = (int32_t)x->valuedouble;
    return n;
}

static void load_refs(void) {
    for (int i = 0; i < N_MODELS; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/models/%s/reference.json", DJ_FIXTURES, model_names[i]);
        char *txt = dj_test_read_file(path, NULL);
        cJSON *j = txt ? cJSON_Parse(txt) : NULL;
        CHECK_MSG(j != NULL, "%s", path);
        if (j) {
            refs[i].n_prompt = read_ints(cJSON_GetObjectItem(j, "prompt_ids"), refs[i].prompt, 64);
            refs[i].n_greedy = read_ints(cJSON_GetObjectItem(j, "greedy"), refs[i].greedy, 64);
        }
        CHECK(refs[i].n_greedy == 24 && refs[i].n_prompt > 0);
        cJSON_Delete(j);
        free(txt);
    }
}

/* ---- generation helpers ---- */

typedef struct collect {
    int32_t ids[512];
    int n;
    int kill_at; /* >0: SIGKILL ourselves at this many tokens */
} collect;

static void on_token(int32_t id, const char *text, size_t len, void *user) {
    (void)text;
    (void)len;
    collect *c = user;
    if (id < 0) return;
    if (c->n < 512) c->ids[c->n++] = id;
    if (c->kill_at && c->n == c->kill_at) kill(getpid(), SIGKILL);
}

static dj_status greedy(dj_client_t *c, uint64_t sess, const ref *r, uint32_t n, collect *out,
                        dj_generate_result *res) {
    dj_generate_params p;
    memset(&p, 0, sizeof p);
    p.ids = r->prompt;
    p.n_ids = (size_t)r->n_prompt;
    p.sampling.top_p = 1;
    p.max_tokens = n;
    out->n = 0;
    return dj_client_generate(c, sess, &p, on_token, out, res);
}

/* A seeded sampled generation (T 0.8, top-k 20, top-p 0.95, seed 1234):
 * batched or alone, the same tokens (batched logits equal single ones). */
static dj_status sampled(dj_client_t *c, uint64_t sess, const ref *r, uint32_t n, collect *out) {
    dj_generate_params p;
    memset(&p, 0, sizeof p);
    p.ids = r->prompt;
    p.n_ids = (size_t)r->n_prompt;
    p.sampling = (dj_sampler_params){.temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .seed = 1234};
    p.max_tokens = n;
    out->n = 0;
    return dj_client_generate(c, sess, &p, on_token, out, NULL);
}

static bool same_as_ref(const collect *got, const ref *r) {
    if (got->n != r->n_greedy) return false;
    return !memcmp(got->ids, r->greedy, (size_t)r->n_greedy * sizeof(int32_t));
}

static collect alone[N_MODELS], alone_sampled[N_MODELS];

static void test_reference(const char *addr) {
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (!c) return;
    dj_client_model *ms = NULL;
    size_t nm = 0;
    CHECK_OK(dj_client_model_list(c, &ms, &nm));
    int found = 0;
    for (size_t i = 0; i < nm; i++)
        for (int k = 0; k < N_MODELS; k++) found += !strcmp(ms[i].name, model_names[k]);
    CHECK_MSG(found == N_MODELS, "model list has %d of the %d fixtures", found, N_MODELS);
    free(ms);
    for (int i = 0; i < N_MODELS; i++) {
        uint64_t s = 0;
        dj_session_opts o = {model_names[i], DJ_QOS_INTERACTIVE, 0};
        CHECK_OK(dj_client_session_open(c, &o, &s));
        dj_generate_result res;
        CHECK_OK(greedy(c, s, &refs[i], 24, &alone[i], &res));
        CHECK_MSG(same_as_ref(&alone[i], &refs[i]), "%s: tokens through djinnd differ from reference.json",
                  model_names[i]);
        CHECK(res.n_generated == 24 && res.n_prompt == (uint32_t)refs[i].n_prompt && !strcmp(res.reason, "length"));
        CHECK_OK(dj_client_session_close(c, s));
        CHECK_OK(dj_client_session_open(c, &o, &s));
        CHECK_OK(sampled(c, s, &refs[i], 24, &alone_sampled[i]));
        CHECK_OK(dj_client_session_close(c, s));
        CHECK_ST(dj_client_session_close(c, s), DJ_ENOTFOUND);
    }
    int sampled_differs = 0; /* the sampled runs are not the greedy ones */
    for (int i = 0; i < N_MODELS; i++)
        sampled_differs +=
            alone_sampled[i].n == 24 && memcmp(alone_sampled[i].ids, refs[i].greedy, 24 * sizeof(int32_t));
    CHECK(sampled_differs > 0);
    /* unknown model, bad name, bad QoS-free input */
    uint64_t s = 0;
    dj_session_opts o = {"no-such-model", DJ_QOS_BATCH, 0};
    CHECK(dj_client_session_open(c, &o, &s) != DJ_OK);
    o.model = "../models/llama2";
    CHECK_ST(dj_client_session_open(c, &o, &s), DJ_EINVAL);
    CHECK_OK(dj_client_heartbeat(c)); /* the connection survived the errors */
    dj_client_free(c);
}

/* ---- concurrency ---- */

typedef struct worker_arg {
    const char *addr;
    int idx;
    int ok;
    char err[256];
} worker_arg;

static void *client_thread(void *p) {
    worker_arg *a = p;
    const int m = a->idx % N_MODELS;
    dj_client_t *c = NULL;
    dj_status st = dj_client_connect(a->addr, NULL, &c);
    uint64_t s = 0;
    static const dj_qos qos[3] = {DJ_QOS_REALTIME, DJ_QOS_INTERACTIVE, DJ_QOS_BATCH};
    dj_session_opts o = {model_names[m], qos[a->idx % 3], 0};
    if (st == DJ_OK) st = dj_client_session_open(c, &o, &s);
    collect got;
    memset(&got, 0, sizeof got);
    /* odd clients sample (their batches mix greedy and sampled rows) */
    const bool samp = a->idx % 2 == 1;
    const collect *want = samp ? &alone_sampled[m] : &alone[m];
    if (st == DJ_OK)
        st = samp ? sampled(c, s, &refs[m], 24, &got) : greedy(c, s, &refs[m], 24, &got, NULL);
    if (st == DJ_OK) st = dj_client_session_close(c, s);
    a->ok = st == DJ_OK && (samp || same_as_ref(&got, &refs[m])) && got.n == want->n &&
            !memcmp(got.ids, want->ids, (size_t)got.n * sizeof(int32_t));
    if (!a->ok) snprintf(a->err, sizeof a->err, "%s (%d tokens)", st ? dj_last_error() : "tokens differ", got.n);
    dj_client_free(c);
    return NULL;
}

static bool stats(dj_client_t *c, dj_client_stats *st);

static void test_concurrent(const char *addr) {
    pthread_t th[N_CLIENTS];
    worker_arg args[N_CLIENTS];
    double t0 = dj_test_now_s();
    for (int i = 0; i < N_CLIENTS; i++) {
        args[i] = (worker_arg){addr, i, 0, ""};
        pthread_create(&th[i], NULL, client_thread, &args[i]);
    }
    int ok = 0;
    for (int i = 0; i < N_CLIENTS; i++) {
        pthread_join(th[i], NULL);
        ok += args[i].ok;
        if (!args[i].ok) fprintf(stderr, "client %d: %s\n", i, args[i].err);
    }
    CHECK_MSG(ok == N_CLIENTS, "%d of %d concurrent clients (half greedy, half seeded sampling) got their tokens", ok,
              N_CLIENTS);
    printf("%d concurrent clients x 24 tokens in %.2f s\n", N_CLIENTS, dj_test_now_s() - t0);
    /* concurrent generations of one model share decode steps (continuous batching) */
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    dj_client_stats st;
    if (c && stats(c, &st)) {
        CHECK_MSG(st.batched_steps > 0 && st.batched_rows >= 2 * st.batched_steps,
                  "no batched decode steps after %d concurrent clients (%llu steps, %llu rows)", N_CLIENTS,
                  (unsigned long long)st.batched_steps, (unsigned long long)st.batched_rows);
        printf("batched decode: %llu steps carried %llu session-steps, %llu of them a prompt chunk too\n",
               (unsigned long long)st.batched_steps, (unsigned long long)st.batched_rows,
               (unsigned long long)st.mixed_steps);
        CHECK_MSG(st.mixed_steps > 0, "no step mixed a prompt chunk with decode rows (CPU engine: mixed steps on)");
        dj_client_stats_free(&st);
    }
    dj_client_free(c);
}

/* ---- a long prompt does not stall running generations ---- */

typedef struct stamped {
    double t[512];
    int n;
    pthread_mutex_t mu;
} stamped; /* arrival times of a generation's tokens */

static void on_stamp(int32_t id, const char *text, size_t len, void *user) {
    (void)text;
    (void)len;
    stamped *s = user;
    if (id < 0) return;
    pthread_mutex_lock(&s->mu);
    if (s->n < 512)
        s->t[s->n++] = dj_test_now_s();
    pthread_mutex_unlock(&s->mu);
}

typedef struct long_gen {
    const char *addr;
    stamped st;
    dj_status rc;
} long_gen;

static void *long_gen_thread(void *p) {
    long_gen *a = p;
    dj_client_t *c = NULL;
    uint64_t sess = 0;
    dj_session_opts o = {"demo", DJ_QOS_INTERACTIVE, 0};
    a->rc = dj_client_connect(a->addr, NULL, &c);
    if (a->rc == DJ_OK) a->rc = dj_client_session_open(c, &o, &sess);
    const int32_t prompt[4] = {1, 2, 3, 4};
    dj_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.ids = prompt;
    gp.n_ids = 4;
    gp.max_tokens = 400;
    gp.sampling.top_p = 1;
    if (a->rc == DJ_OK) a->rc = dj_client_generate(c, sess, &gp, on_stamp, &a->st, NULL);
    dj_client_free(c);
    return NULL;
}

/* A daemon of its own with the demo model (512 positions, a few ms a token
 * on one thread: a long runway) and prompt chunks of 4. A generates 400
 * tokens; once it runs, B (connected before A starts) sends a 60-token
 * prompt: 15 chunks, each of which should share a step with A's decode row -
 * the daemon's mixed_steps count rises by one per chunk. The client-side
 * count of A's tokens that arrived while B's prompt went in is printed
 * (client threads can be late to see them when the machine is busy, so it is
 * not the check). Nor is the clock: if A was no longer generating once B's
 * answer came (this process stalled for all of A's runway), the scenario
 * says nothing and runs again, at most 5 times.
 * mode is --mixed-steps; with "short" (a GPU's auto) only a prompt's chunks
 * after which at most 64 tokens are left ride: of a 200-token prompt's 50
 * chunks, the last 16 (want_min..want_max bound the count). */
static void test_prefill_interleave(const char *mode, int n_prompt, long want_min, long want_max) {
    char store[400], link_path[450], addr[128];
    snprintf(store, sizeof store, "%s/demo_store_%s_%d", tmpdir, mode, n_prompt);
    snprintf(link_path, sizeof link_path, "%s/demo", store);
    if (mkdir(store, 0700) != 0 || symlink(DJ_SOURCE_DIR "/models/demo", link_path) != 0) {
        CHECK_MSG(0, "cannot make %s: %s", store, strerror(errno));
        return;
    }
    const char *extra[] = {"--models", store, "--prefill-chunk", "4", "--mixed-steps", mode, "--local-admin", NULL};
    const pid_t pid = start_daemon(2, "127.0.0.1:0", extra, addr, sizeof addr);
    CHECK_MSG(pid > 0, "djinnd (demo store) did not start");
    if (pid <= 0)
        return;
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (!c) {
        stop_daemon(2);
        return;
    }
    if (n_prompt > 256) n_prompt = 256;
    bool valid = false;
    for (int attempt = 0; attempt < 5 && !valid; attempt++) {
        uint64_t sess = 0;
        dj_session_opts o = {"demo", DJ_QOS_INTERACTIVE, 0};
        CHECK_OK(dj_client_session_open(c, &o, &sess));
        if (!sess)
            break;
        long_gen a = {.addr = addr};
        pthread_mutex_init(&a.st.mu, NULL);
        pthread_t th;
        pthread_create(&th, NULL, long_gen_thread, &a);
        for (int i = 0; i < 60000; i++) { /* A is running (60 s: a bound for a stuck daemon) */
            pthread_mutex_lock(&a.st.mu);
            const int n = a.st.n;
            pthread_mutex_unlock(&a.st.mu);
            if (n >= 1 || a.rc != DJ_OK)
                break;
            usleep(1000);
        }
        dj_client_stats st0, st1;
        const bool have0 = stats(c, &st0);
        int32_t prompt[256];
        for (int i = 0; i < n_prompt; i++)
            prompt[i] = 1 + (i * 37) % 300;
        dj_generate_params gp;
        memset(&gp, 0, sizeof gp);
        gp.ids = prompt;
        gp.n_ids = (size_t)n_prompt;
        gp.max_tokens = 2;
        gp.sampling.top_p = 1;
        stamped b;
        memset(&b, 0, sizeof b);
        pthread_mutex_init(&b.mu, NULL);
        const double t_send = dj_test_now_s();
        CHECK_OK(dj_client_generate(c, sess, &gp, on_stamp, &b, NULL));
        const bool have1 = stats(c, &st1);
        /* A (the other session) still generating: it decoded all through B's prompt */
        for (size_t i = 0; have1 && i < st1.n_sessions; i++)
            valid |= st1.sessions[i].id != sess && st1.sessions[i].generating;
        pthread_join(th, NULL);
        CHECK_OK(a.rc);
        int during = 0;
        for (int i = 0; i < a.st.n && b.n > 0; i++) during += a.st.t[i] > t_send && a.st.t[i] < b.t[0];
        const long shared = have0 && have1 ? (long)(st1.mixed_steps - st0.mixed_steps) : -1;
        if (valid) {
            CHECK_MSG(b.n == 2 && a.st.n == 400 && shared >= want_min && shared <= want_max,
                      "--mixed-steps %s: B's %d-token prompt (%d chunks) shared %ld steps with A's decode (want "
                      "%ld..%ld)",
                      mode, n_prompt, (n_prompt + 3) / 4, shared, want_min, want_max);
            printf("chunked prefill, --mixed-steps %s: a %d-token prompt went in over %ld steps shared with a "
                   "running generation (%d of its tokens seen meanwhile)\n",
                   mode, n_prompt, shared, during);
        } else {
            printf("--mixed-steps %s: A's generation ended before B's prompt was in (this process stalled): "
                   "again\n", mode);
        }
        if (have0)
            dj_client_stats_free(&st0);
        if (have1)
            dj_client_stats_free(&st1);
        CHECK_OK(dj_client_session_close(c, sess));
        pthread_mutex_destroy(&a.st.mu);
        pthread_mutex_destroy(&b.mu);
    }
    CHECK_MSG(valid, "--mixed-steps %s: A never ran through B's prompt in 5 tries", mode);
    dj_client_free(c);
    CHECK_MSG(stop_daemon(2) == 0, "djinnd (demo store) did not exit cleanly");
}

/* ---- stop rules: the model's EOS ids (generation_config.json), ignore_eos, stop ids ---- */

static void test_eos(void) {
    const ref *r = &refs[0]; /* llama2 */
    int k = 2; /* the first greedy token not seen before it: the EOS of this test */
    while (k < r->n_greedy) {
        int seen = 0;
        for (int i = 0; i < k; i++) seen |= r->greedy[i] == r->greedy[k];
        if (!seen) break;
        k++;
    }
    int stop_at = k + 1; /* a later fresh token: the client's stop id */
    while (stop_at < r->n_greedy) {
        int seen = 0;
        for (int i = 0; i < stop_at; i++) seen |= r->greedy[i] == r->greedy[stop_at];
        if (!seen) break;
        stop_at++;
    }
    CHECK_MSG(stop_at < 24, "llama2's reference has no two fresh tokens to stop at");
    if (stop_at >= 24) return;
    char store[400], dir[450], path[500], addr[128];
    snprintf(store, sizeof store, "%s/eos_store", tmpdir);
    snprintf(dir, sizeof dir, "%s/eosmodel", store);
    static const char *files[] = {"config.json", "model.safetensors"};
    bool made = mkdir(store, 0700) == 0 && mkdir(dir, 0700) == 0;
    for (int i = 0; made && i < 2; i++) {
        char src[400];
        snprintf(src, sizeof src, "%s/models/llama2/%s", DJ_FIXTURES, files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        made = symlink(src, path) == 0;
    }
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = made ? fopen(path, "w") : NULL;
    if (f) {
        fprintf(f, "{\"eos_token_id\": [99999, %d]}\n", r->greedy[k]);
        fclose(f);
    }
    CHECK_MSG(f, "cannot make the model store %s", store);
    if (!f) return;
    const char *extra[] = {"--models", store, "--local-admin", NULL}; /* STATS' step counters */
    const pid_t pid = start_daemon(4, "127.0.0.1:0", extra, addr, sizeof addr);
    CHECK_MSG(pid > 0, "djinnd (EOS store) did not start");
    if (pid <= 0) return;
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    dj_session_opts o = {"eosmodel", DJ_QOS_INTERACTIVE, 0};
    for (int run = 0; c && run < 3; run++) {
        uint64_t sess = 0;
        CHECK_OK(dj_client_session_open(c, &o, &sess));
        dj_generate_params p;
        memset(&p, 0, sizeof p);
        p.ids = r->prompt;
        p.n_ids = (size_t)r->n_prompt;
        p.sampling.top_p = 1;
        p.max_tokens = 24;
        p.ignore_eos = run > 0;
        const int32_t stop = r->greedy[stop_at];
        if (run == 2) {
            p.stop_ids = &stop;
            p.n_stop = 1;
        }
        collect got = {0};
        dj_generate_result res;
        CHECK_OK(dj_client_generate(c, sess, &p, on_token, &got, &res));
        const int want = run == 0 ? k : run == 1 ? 24 : stop_at;
        CHECK_MSG(got.n == want && !memcmp(got.ids, r->greedy, (size_t)want * sizeof(int32_t)) &&
                      res.n_generated == (uint32_t)want && !strcmp(res.reason, run == 1 ? "length" : "stop"),
                  "run %d: %d tokens, reason %s (want the reference's first %d, %s)", run, got.n, res.reason, want,
                  run == 1 ? "length" : "stop");
        CHECK_OK(dj_client_session_close(c, sess));
    }
    dj_client_stats st;
    if (c && stats(c, &st)) { /* the worker's step counters */
        CHECK_MSG(st.gen_steps >= 24 && st.step_engine_ms <= st.step_ms,
                  "stats: %llu generation steps, %.3f ms each, %.3f ms in the engine", (unsigned long long)st.gen_steps,
                  st.step_ms, st.step_engine_ms);
        dj_client_stats_free(&st);
    }
    dj_client_free(c);
    CHECK_MSG(stop_daemon(4) == 0, "djinnd (EOS store) did not exit cleanly");
}

/* ---- a model larger than the text budget: its placement in STATS ---- */

/* The demo model in 0.02 GiB streams (as in cli_test.sh), two of its streamed
 * layers' FFNs on the host: STATS names the placement while a session holds
 * the model. */
static void test_streamed_stats(void) {
    char store[400], link[450], addr[128];
    snprintf(store, sizeof store, "%s/stream_store", tmpdir);
    snprintf(link, sizeof link, "%s/demo", store);
    const bool made = mkdir(store, 0700) == 0 && symlink(DJ_SOURCE_DIR "/models/demo", link) == 0;
    CHECK_MSG(made, "cannot make the model store %s", store);
    if (!made) return;
    const char *extra[] = {"--models", store, "--vmu-gb", "0.02", "--host-layers", "2", "--local-admin", NULL};
    setenv("DJINN_WEIGHTS_IN_PLACE", "0", 1); /* the weights copied into the text segment: its budget binds */
    const pid_t pid = start_daemon(5, "127.0.0.1:0", extra, addr, sizeof addr);
    unsetenv("DJINN_WEIGHTS_IN_PLACE");
    CHECK_MSG(pid > 0, "djinnd (streamed model) did not start");
    if (pid <= 0) return;
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    dj_session_opts o = {"demo", DJ_QOS_INTERACTIVE, 0};
    uint64_t sess = 0;
    if (c) CHECK_OK(dj_client_session_open(c, &o, &sess));
    dj_client_stats st;
    if (c && sess && stats(c, &st)) {
        const dj_client_model *m = st.n_models == 1 ? &st.models[0] : NULL;
        CHECK_MSG(m && !strcmp(m->name, "demo") && m->streamed_layers > 0 && m->streamed_layers < m->layers &&
                      m->host_layers == 2 && m->host_share_pct == 100 && m->ring_bytes > 0 && m->streamed_bytes > 0,
                  "stats of the streamed model: %zu models, %u of %u layers streamed, %u host layers at %u%%",
                  st.n_models, m ? m->streamed_layers : 0, m ? m->layers : 0, m ? m->host_layers : 0,
                  m ? m->host_share_pct : 0);
        dj_client_stats_free(&st);
    }
    if (sess) CHECK_OK(dj_client_session_close(c, sess));
    dj_client_free(c);
    CHECK_MSG(stop_daemon(5) == 0, "djinnd (streamed model) did not exit cleanly");
}

/* ---- stats and memory ---- */

static bool stats(dj_client_t *c, dj_client_stats *st) {
    dj_status s = dj_client_stats_get(c, st);
    CHECK_OK(s);
    return s == DJ_OK;
}

/* How long memory may take to come back (the daemon releases it
 * asynchronously): a bound for a stuck daemon, never reached by a working one
 * however loaded the machine. */
#define BACK_MS 30000

/* Wait (at most ms) until data/stack/text use and VMU session count are back to base. */
static bool back_to(dj_client_t *c, const dj_client_stats *base, int ms) {
    for (double t0 = dj_test_now_s(); dj_test_now_s() - t0 < ms / 1000.0; dj_test_sleep_ms(20)) {
        dj_client_stats st;
        if (!stats(c, &st)) return false;
        bool same = st.data.used == base->data.used && st.vmu_sessions == base->vmu_sessions &&
                    st.pages_free == base->pages_free && st.n_sessions == base->n_sessions &&
                    st.handles == base->handles && st.stack.used == base->stack.used;
        dj_client_stats_free(&st);
        if (same) return true;
    }
    return false;
}

static void test_step_fetch_share(const char *addr) {
    dj_client_t *c = NULL, *other = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    CHECK_OK(dj_client_connect(addr, NULL, &other));
    if (!c || !other) return;
    dj_client_stats base;
    if (!stats(c, &base)) return;
    const ref *r = &refs[0];
    uint64_t s1 = 0, s2 = 0;
    dj_session_opts o = {model_names[0], DJ_QOS_REALTIME, 64};
    CHECK_OK(dj_client_session_open(c, &o, &s1));
    CHECK_OK(dj_client_session_open(c, &o, &s2));
    dj_client_stats st;
    if (stats(c, &st)) {
        int refs2 = 0;
        for (size_t i = 0; i < st.n_models; i++)
            if (!strcmp(st.models[i].name, model_names[0])) refs2 = st.models[i].refs == 2;
        CHECK_MSG(refs2, "two sessions on %s: refcount 2 expected", model_names[0]);
        CHECK(st.vmu_sessions == base.vmu_sessions + 2);
        CHECK(strstr(st.map, "refs 2") != NULL);
        dj_client_stats_free(&st);
    }
    /* step -> handle -> fetch: the argmax of the last logits is the first greedy token */
    dj_remote_tensor t;
    CHECK_OK(dj_client_step(c, s1, r->prompt, (size_t)r->n_prompt, true, &t));
    CHECK(t.handle != 0 && t.ndim == 1 && !strcmp(t.dtype, "f32") && t.pos == (uint32_t)r->n_prompt);
    const size_t vocab = (size_t)t.shape[0];
    float *logits = malloc(vocab * sizeof *logits), *part = malloc(vocab * sizeof *part);
    size_t got = 0;
    CHECK_OK(dj_client_fetch(c, t.handle, 0, UINT64_MAX, logits, vocab * sizeof *logits, &got));
    CHECK(got == vocab * sizeof(float));
    CHECK(dj_argmax(logits, (uint32_t)vocab) == r->greedy[0]);
    /* a random byte slice equals the same bytes of the whole */
    const size_t a = dj_test_rand() % vocab, n = 1 + dj_test_rand() % (vocab - a);
    CHECK_OK(dj_client_fetch(c, t.handle, a * 4, n * 4, part, vocab * sizeof *part, &got));
    CHECK(got == n * 4 && !memcmp(part, logits + a, n * 4));
    /* every position's logits behind one [n, vocab] handle: its last row is
     * the last-position logits, fetched whole and in pieces */
    {
        uint64_t s3 = 0;
        CHECK_OK(dj_client_session_open(c, &o, &s3));
        dj_remote_tensor ta;
        CHECK_OK(dj_client_step_ex(c, s3, r->prompt, (size_t)r->n_prompt, DJ_LOGITS_ALL, &ta));
        CHECK(ta.ndim == 2 && ta.shape[0] == (uint64_t)r->n_prompt && ta.shape[1] == vocab &&
              ta.nbytes == (uint64_t)r->n_prompt * vocab * 4);
        float *rows = malloc((size_t)r->n_prompt * vocab * sizeof *rows);
        CHECK_OK(dj_client_fetch(c, ta.handle, 0, UINT64_MAX, rows, (size_t)r->n_prompt * vocab * 4, &got));
        CHECK(got == (size_t)r->n_prompt * vocab * 4);
        const float *last = rows + (size_t)(r->n_prompt - 1) * vocab;
        double md = 0, mx = 0;
        for (size_t i = 0; i < vocab; i++) {
            double d = fabs((double)last[i] - logits[i]);
            md = d > md || d != d ? d : md;
            mx = fabs(logits[i]) > mx ? fabs(logits[i]) : mx;
        }
        CHECK_MSG(md <= 1e-5 * mx, "all-positions handle: last row differs from the last-position logits by %g", md);
        CHECK(dj_argmax(last, (uint32_t)vocab) == r->greedy[0]);
        CHECK_OK(dj_client_fetch(c, ta.handle, (uint64_t)(r->n_prompt - 1) * vocab * 4, vocab * 4, part,
                                 vocab * sizeof *part, &got));
        CHECK(got == vocab * 4 && !memcmp(part, last, vocab * 4));
        free(rows);
        CHECK_OK(dj_client_session_close(c, s3));
    }
    /* decode steps through handles reproduce the greedy tokens */
    int32_t next = r->greedy[0];
    int same = 1;
    for (int i = 1; i < 6; i++) {
        dj_remote_tensor u;
        CHECK_OK(dj_client_step(c, s1, &next, 1, true, &u));
        CHECK_OK(dj_client_fetch(c, u.handle, 0, UINT64_MAX, logits, vocab * 4, &got));
        next = dj_argmax(logits, (uint32_t)vocab);
        same &= next == r->greedy[i];
        CHECK_OK(dj_client_release(c, u.handle));
    }
    CHECK_MSG(same, "step/fetch decode differs from the greedy reference");
    /* another connection cannot see our session */
    dj_remote_tensor u;
    CHECK_ST(dj_client_step(other, s1, &next, 1, true, &u), DJ_ENOTFOUND);
    dj_client_free(other); /* the server closed it: the foreign id was a violation */
    /* pause/resume: state only */
    CHECK_OK(dj_client_session_pause(c, s2, 500));
    CHECK_ST(dj_client_step(c, s2, r->prompt, 2, false, &u), DJ_EBUSY);
    CHECK_OK(dj_client_session_resume(c, s2));
    CHECK_OK(dj_client_step(c, s2, r->prompt, 2, false, &u));
    CHECK(u.handle == 0 && u.pos == 2);
    CHECK_OK(dj_client_release(c, t.handle));
    CHECK_ST(dj_client_release(c, t.handle), DJ_ENOTFOUND);
    CHECK_OK(dj_client_session_close(c, s1));
    CHECK_OK(dj_client_session_close(c, s2));
    CHECK_MSG(back_to(c, &base, BACK_MS), "memory not back to the baseline after closing");
    dj_client_stats_free(&base);
    free(logits);
    free(part);
    dj_client_free(c);
}

static void test_killed_client(const char *addr) {
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (!c) return;
    dj_client_stats base;
    if (!stats(c, &base)) return;
    pid_t child = fork();
    if (child == 0) {
        dj_client_t *k = NULL;
        uint64_t s = 0;
        dj_session_opts o = {model_names[1], DJ_QOS_BATCH, 0};
        if (dj_client_connect(addr, NULL, &k) || dj_client_session_open(k, &o, &s)) _exit(3);
        collect col;
        memset(&col, 0, sizeof col);
        col.kill_at = 3;
        greedy(k, s, &refs[1], 200, &col, NULL);
        _exit(4); /* not reached: killed at token 3 */
    }
    int status = 0;
    for (int i = 0; i < 3000 && waitpid(child, &status, WNOHANG) != child; i++) dj_test_sleep_ms(10);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child did not die mid-generation (status %d)",
              status);
    CHECK_MSG(back_to(c, &base, BACK_MS), "memory of a killed client not released");
    dj_client_stats_free(&base);
    dj_client_free(c);
}

static void test_lease(const char *addr, uint32_t lease_ms) {
    dj_client_t *c = NULL, *quiet = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    CHECK_OK(dj_client_connect(addr, NULL, &quiet));
    if (!c || !quiet) return;
    dj_client_set_heartbeat(quiet, 0);
    dj_client_stats base;
    if (!stats(c, &base)) return;
    uint64_t s = 0, kept = 0;
    dj_session_opts o = {model_names[2], DJ_QOS_INTERACTIVE, 0};
    CHECK_OK(dj_client_session_open(quiet, &o, &s));
    CHECK_OK(dj_client_session_open(c, &o, &kept)); /* heartbeats on: must survive */
    dj_remote_tensor t;
    CHECK_OK(dj_client_step(quiet, s, refs[2].prompt, (size_t)refs[2].n_prompt, true, &t));
    dj_client_stats st;
    if (stats(c, &st)) {
        CHECK(st.data.used > base.data.used && st.handles == base.handles + 1);
        dj_client_stats_free(&st);
    }
    const double t0 = dj_test_now_s();
    dj_test_sleep_ms((int)lease_ms + 300);
    bool gone = false;
    while (!gone && dj_test_now_s() - t0 < 30) { /* a bound for a stuck daemon, not a timing */
        if (!stats(c, &st)) break;
        gone = st.n_sessions == base.n_sessions + 1 && st.handles == base.handles;
        dj_client_stats_free(&st);
        if (!gone) dj_test_sleep_ms(20);
    }
    CHECK_MSG(gone, "session without heartbeats still there %.2f s after the lease", dj_test_now_s() - t0);
    CHECK_ST(dj_client_step(quiet, s, refs[2].prompt, 1, false, &t), DJ_ENOTFOUND);
    CHECK_OK(dj_client_step(c, kept, refs[2].prompt, 1, false, &t));
    CHECK_OK(dj_client_session_close(c, kept));
    CHECK_MSG(back_to(c, &base, BACK_MS), "memory not back after the lease expired");
    dj_client_stats_free(&base);
    dj_client_free(quiet);
    dj_client_free(c);
}

/* A daemon stopped (SIGSTOP: a paused VM, a machine stalled on I/O) for
 * longer than the lease does not count the stop against its clients: a
 * heartbeating client's session, whose heartbeats waited unread in the
 * socket, and a silent client's session both survive; once the daemon runs
 * again, the silent one's lease ends after a lease of silence. Without that,
 * the worker woke first and reaped both ("no session ... on this
 * connection"). The daemon's lease is 1500 ms; it is stopped for 2500 ms. */
static void test_stalled_daemon(const char *addr, pid_t pid, uint32_t lease_ms) {
    dj_client_t *c = NULL, *quiet = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    CHECK_OK(dj_client_connect(addr, NULL, &quiet));
    if (!c || !quiet) {
        dj_client_free(c);
        dj_client_free(quiet);
        return;
    }
    dj_client_set_heartbeat(quiet, 0);
    uint64_t s = 0, q = 0;
    dj_session_opts o = {model_names[0], DJ_QOS_INTERACTIVE, 64};
    dj_remote_tensor t;
    CHECK_OK(dj_client_session_open(c, &o, &s));
    CHECK_OK(dj_client_session_open(quiet, &o, &q));
    CHECK_OK(dj_client_step(quiet, q, refs[0].prompt, 2, false, &t)); /* its lease runs from here */
    CHECK(kill(pid, SIGSTOP) == 0);
    dj_test_sleep_ms((int)lease_ms + 1000); /* c's heartbeats pile up in its socket */
    CHECK(kill(pid, SIGCONT) == 0);
    dj_test_sleep_ms(200); /* the reaper's turn (every 50 ms) comes before our next requests */
    CHECK_OK(dj_client_step(c, s, refs[0].prompt, 2, false, &t));
    CHECK_OK(dj_client_step(quiet, q, refs[0].prompt + 2, 1, false, &t));
    CHECK(t.pos == 3);
    /* leases still end: the silent session goes after a lease of silence */
    const double t0 = dj_test_now_s();
    dj_status st = DJ_OK;
    while (st == DJ_OK && dj_test_now_s() - t0 < 30) {
        dj_test_sleep_ms((int)lease_ms / 4);
        dj_client_stats cs;
        if (!stats(quiet, &cs)) break;
        st = DJ_ENOTFOUND; /* unless STATS still lists it */
        for (size_t i = 0; i < cs.n_sessions; i++)
            if (cs.sessions[i].id == q) st = DJ_OK;
        dj_client_stats_free(&cs);
    }
    CHECK_MSG(st == DJ_ENOTFOUND, "the silent session outlived its lease by %.1f s", dj_test_now_s() - t0);
    CHECK_ST(dj_client_step(quiet, q, refs[0].prompt, 1, false, &t), DJ_ENOTFOUND);
    CHECK_OK(dj_client_session_close(c, s));
    dj_client_free(quiet);
    dj_client_free(c);
}

static void test_cycles(const char *addr, pid_t pid) {
    dj_client_t *c = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &c));
    if (!c) return;
    dj_client_stats base;
    if (!stats(c, &base)) return;
    /* baseline once connections closed by earlier tests are gone: the count
     * unchanged over 3 samples 20 ms apart (1 s at most) */
    int fds0 = count_fds(pid);
    for (int i = 0, same = 0; i < 50 && same < 3; i++) {
        dj_test_sleep_ms(20);
        const int f = count_fds(pid);
        same = f == fds0 ? same + 1 : 0;
        fds0 = f;
    }
    /* 2000 in CI; DJ_TEST_CYCLES=10000 for the full soak */
    const char *cy = getenv("DJ_TEST_CYCLES");
    const int cycles = cy && atoi(cy) > 0 ? atoi(cy) : 2000;
    int fails = 0;
    double t0 = dj_test_now_s();
    for (int i = 0; i < cycles; i++) {
        const int m = i % N_MODELS;
        uint64_t s = 0;
        dj_session_opts o = {model_names[m], DJ_QOS_INTERACTIVE, 32};
        collect col;
        if (dj_client_session_open(c, &o, &s) != DJ_OK || greedy(c, s, &refs[m], 2, &col, NULL) != DJ_OK ||
            dj_client_session_close(c, s) != DJ_OK || col.n != 2 || col.ids[1] != refs[m].greedy[1])
            fails++;
    }
    CHECK_MSG(fails == 0, "%d of %d open/generate/close cycles failed: %s", fails, cycles, dj_last_error());
    for (int i = 0; i < 100; i++) { /* connections come and go */
        dj_client_t *k = NULL;
        uint64_t s = 0;
        dj_session_opts o = {model_names[i % N_MODELS], DJ_QOS_BATCH, 16};
        if (dj_client_connect(addr, NULL, &k) == DJ_OK) dj_client_session_open(k, &o, &s);
        dj_client_free(k);
    }
    printf("%d cycles + 100 connections in %.2f s\n", cycles, dj_test_now_s() - t0);
    CHECK_MSG(back_to(c, &base, BACK_MS), "VMU not at baseline after the cycles");
    int fds1 = -1;
    /* no growth: the baseline may still count a connection an earlier test
     * closed (the daemon closes it asynchronously) */
    for (int i = 0; i < 100 && (fds1 = count_fds(pid)) > fds0; i++) dj_test_sleep_ms(20);
    CHECK_MSG(fds1 >= 0 && fds1 <= fds0, "daemon fds %d before, %d after", fds0, fds1);
    dj_client_stats_free(&base);
    dj_client_free(c);
}

/* ---- raw frames ---- */

#define RAW_TIMEOUT_S 5 /* receive timeout of the raw connections */

static bool raw_eof(int fd) {
    char c;
    return recv(fd, &c, 1, 0) == 0;
}

/* Connect and HELLO; the answer must be a REPLY. */
static int raw_hello(const char *addr) {
    dj_test_frame ans;
    const int fd = dj_test_raw_hello(addr, RAW_TIMEOUT_S, NULL, &ans);
    if (fd >= 0) CHECK(ans.type == DJ_MSG_REPLY);
    return fd;
}

static void test_malformed(const char *addr) {
    dj_client_t *good = NULL;
    CHECK_OK(dj_client_connect(addr, NULL, &good));
    if (!good) return;
    uint64_t gs = 0;
    dj_session_opts o = {model_names[4], DJ_QOS_INTERACTIVE, 0};
    CHECK_OK(dj_client_session_open(good, &o, &gs));
    dj_remote_tensor gt;
    CHECK_OK(dj_client_step(good, gs, refs[4].prompt, 3, true, &gt));
    uint8_t m[256];
    size_t n;
    dj__mw w;
    for (int kase = 0; kase < 9; kase++) {
        int fd = kase == 0 ? dj_test_raw_connect(addr, NULL, RAW_TIMEOUT_S, 0) : raw_hello(addr);
        CHECK(fd >= 0);
        if (fd < 0) continue;
        int64_t want = DJ_EFORMAT;
        switch (kase) {
        case 0: /* a request before HELLO */
            dj_test_raw_send(fd, DJ_MSG_STATS, 9, NULL, 0, 0);
            want = DJ_EINVAL;
            break;
        case 1: { /* bad magic */
            uint8_t b[DJ_FRAME_HEADER_BYTES] = "HTTP/1.1 GET /";
            send(fd, b, sizeof b, MSG_NOSIGNAL);
            break;
        }
        case 2: { /* unknown type */
            dj_frame_header h = {.magic = DJ_PROTO_MAGIC, .version = 1, .type = 0x55, .request_id = 3};
            uint8_t b[DJ_FRAME_HEADER_BYTES];
            dj_frame_header_encode(&h, b);
            send(fd, b, sizeof b, MSG_NOSIGNAL);
            break;
        }
        case 3: /* metadata length over the limit */
            dj_test_raw_send(fd, DJ_MSG_STATS, 4, NULL, DJ_PROTO_MAX_META + 1, 0);
            want = DJ_ERANGE;
            break;
        case 4: /* payload over the limit */
            dj_test_raw_send(fd, DJ_MSG_STEP, 5, NULL, 0, DJ_PROTO_MAX_REQ_PAYLOAD + 1);
            want = DJ_ERANGE;
            break;
        case 5: /* truncated msgpack: a map of 2 with one pair */
            dj_test_raw_send(fd, DJ_MSG_MODEL_LOAD, 6, "\x82\xa5model\xa6llama2", 14, 0);
            break;
        case 6: /* wrong field type */
            dj__mw_init(&w);
            dj__mw_u64(&w, "model", 5);
            n = dj_test_meta_of(&w, m);
            dj_test_raw_send(fd, DJ_MSG_SESSION_OPEN, 7, m, n, 0);
            break;
        case 7: /* another connection's handle */
            dj__mw_init(&w);
            dj__mw_u64(&w, "handle", gt.handle);
            n = dj_test_meta_of(&w, m);
            dj_test_raw_send(fd, DJ_MSG_FETCH, 8, m, n, 0);
            want = DJ_ENOTFOUND;
            break;
        case 8: /* another connection's session */
            dj__mw_init(&w);
            dj__mw_u64(&w, "session", gs);
            dj__mw_ids(&w, "ids", refs[4].prompt, 2);
            n = dj_test_meta_of(&w, m);
            dj_test_raw_send(fd, DJ_MSG_STEP, 9, m, n, 0);
            want = DJ_ENOTFOUND;
            break;
        }
        const dj_test_frame f = dj_test_raw_frame(fd, NULL);
        CHECK_MSG(f.type == DJ_MSG_ERROR && f.st == want, "case %d: frame type %d status %lld (want ERROR %lld)",
                  kase, f.type, (long long)f.st, (long long)want);
        CHECK_MSG(raw_eof(fd), "case %d: connection left open after a bad frame", kase);
        close(fd);
        /* the good client is unaffected, its handle intact */
        float lg[4];
        size_t got = 0;
        CHECK_OK(dj_client_fetch(good, gt.handle, 0, 16, lg, sizeof lg, &got));
        CHECK(got == 16);
    }
    /* a peer that vanishes halfway through a frame */
    int fd = raw_hello(addr);
    dj_test_raw_send(fd, DJ_MSG_STATS, 2, "\x81", 1, 0);
    close(fd);
    collect col;
    CHECK_OK(greedy(good, gs, &refs[4], 1, &col, NULL));
    CHECK_OK(dj_client_session_close(good, gs));
    dj_client_free(good);
}

static void test_metrics(const char *mport) {
    int fd = dj_test_raw_connect(mport, NULL, RAW_TIMEOUT_S, 0);
    CHECK(fd >= 0);
    if (fd < 0) return;
    const char req[] = "GET /metrics HTTP/1.0\r\n\r\n";
    send(fd, req, sizeof req - 1, MSG_NOSIGNAL);
    static char body[1 << 16];
    size_t got = 0;
    ssize_t k;
    while (got < sizeof body - 1 && (k = recv(fd, body + got, sizeof body - 1 - got, 0)) > 0) got += (size_t)k;
    body[got] = '\0';
    close(fd);
    CHECK_MSG(strstr(body, "djinn_requests_total{type=\"GENERATE\",status=\"DJ_OK\"}") != NULL, "metrics:\n%.400s",
              body);
    CHECK(strstr(body, "djinn_ttft_seconds_bucket") && strstr(body, "djinn_vmu_bytes{segment=\"data\""));
    CHECK(strstr(body, "type=\"STATS\",status=\"DJ_EINVAL\"") != NULL); /* the request before HELLO */
}

static void test_unix_token(void) {
    char sock[300], tokf[300], addr[320];
    snprintf(sock, sizeof sock, "unix:%s/d.sock", tmpdir);
    snprintf(tokf, sizeof tokf, "%s/token", tmpdir);
    FILE *f = fopen(tokf, "w");
    fprintf(f, "s3cret-%llx qos=realtime,interactive,batch\n", (unsigned long long)dj_test_rand());
    fclose(f);
    char tok[64];
    f = fopen(tokf, "r");
    CHECK(fscanf(f, "%63s", tok) == 1);
    fclose(f);
    const char *extra[] = {"--token-file", tokf, NULL};
    pid_t pid = start_daemon(1, sock, extra, addr, sizeof addr);
    CHECK(pid > 0);
    if (pid <= 0) return;
    dj_client_t *c = NULL;
    CHECK_ST(dj_client_connect(addr, "wrong", &c), DJ_EINVAL);
    CHECK_ST(dj_client_connect(addr, NULL, &c), DJ_EINVAL);
    CHECK_OK(dj_client_connect(addr, tok, &c));
    if (c) {
        uint64_t s = 0;
        dj_session_opts o = {model_names[3], DJ_QOS_REALTIME, 0};
        collect col;
        CHECK_OK(dj_client_session_open(c, &o, &s));
        CHECK_OK(greedy(c, s, &refs[3], 24, &col, NULL));
        CHECK(same_as_ref(&col, &refs[3]));
        CHECK_OK(dj_client_model_load(c, model_names[0]));
        CHECK_OK(dj_client_model_unload(c, model_names[0]));
        CHECK_ST(dj_client_model_unload(c, model_names[0]), DJ_ENOTFOUND);
        dj_client_free(c); /* session still open: the daemon must clean it up on exit */
    }
    CHECK_MSG(stop_daemon(1) == 0, "unix daemon did not exit cleanly");
    struct stat sb;
    CHECK(stat(sock + 5, &sb) != 0);
}

int main(void) {
    dj_test_seeds();
    signal(SIGPIPE, SIG_IGN);
    dj_test_daemon_guard();
    setvbuf(stdout, NULL, _IONBF, 0);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/djinn_test_server_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    load_refs();
    char addr[128], mport[64], lease_s[16];
    /* prompts go in 4 tokens per scheduler turn: every test runs chunked prefill.
     * The default lease (10 s): only the lease tests below take a short one,
     * on a daemon of their own, so no other test depends on how promptly a
     * loaded machine runs the client's heartbeat thread. */
    const char *extra[] = {"--metrics", mport, "--prefill-chunk", "4", "--local-admin", NULL}; /* STATS, /metrics */
    pid_t pid = -1;
    /* the metrics port is picked before the daemon binds it (a test beside this one may take it in
     * between: the daemon exits); a daemon alive but silent is not retried */
    for (int attempt = 0, code = 0; attempt < 5 && pid <= 0; attempt++) {
        snprintf(mport, sizeof mport, "127.0.0.1:%d", dj_test_free_port());
        pid = start_daemon_code(0, "127.0.0.1:0", extra, addr, sizeof addr, &code);
        if (pid <= 0 && code == 0) break;
    }
    CHECK_MSG(pid > 0, "djinnd did not start");
    if (pid > 0) {
        double t = dj_test_now_s();
        test_reference(addr);
        printf("reference ok\n");
        test_concurrent(addr);
        test_step_fetch_share(addr);
        test_killed_client(addr);
        test_malformed(addr);
        test_metrics(mport);
        test_cycles(addr, pid);
        printf("daemon tests in %.2f s\n", dj_test_now_s() - t);
        CHECK_MSG(stop_daemon(0) == 0, "djinnd did not exit cleanly on SIGTERM");
    }
    /* leases: 1500 ms, renewed every 500 ms by libdjinn's heartbeats */
    const uint32_t lease = 1500;
    snprintf(lease_s, sizeof lease_s, "%u", lease);
    const char *lease_args[] = {"--lease-ms", lease_s, "--local-admin", NULL}; /* STATS: every session */
    pid = start_daemon(3, "127.0.0.1:0", lease_args, addr, sizeof addr);
    CHECK_MSG(pid > 0, "djinnd (short lease) did not start");
    if (pid > 0) {
        test_lease(addr, lease);
        test_stalled_daemon(addr, pid, lease);
        CHECK_MSG(stop_daemon(3) == 0, "djinnd (short lease) did not exit cleanly");
    }
    test_unix_token();
    test_prefill_interleave("on", 60, 12, 15);
    test_prefill_interleave("short", 60, 12, 15);
    test_prefill_interleave("short", 200, 12, 17);
    test_eos();
    test_streamed_stats();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return dj_test_finish("test_server");
}
