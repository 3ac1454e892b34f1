/* bench_agents.c: tens of agents through djinnd - each: a long prompt, a
 * short answer, a tool call (PAUSE, a wait, RESUME), a few new prompt tokens,
 * another answer; several rounds - per swap policy and agent count.
 * usage: bench_agents STORE MODEL DEVICE [options]
 *   --n 8,32,128         agent counts
 *   --policies semantic,reactive,recompute
 *   --vmu-gb G --data-gb G --swap-gb G   the daemon's memory (data capped: N agents oversubscribe it)
 *   --prompt 2048 --decode 50 --resume 100 --wait-ms 10000 --rounds 3
 *   --give-up-s 120      an agent waiting this long for a token fails
 *   --kv-dtype auto|fp8  the daemon's KV dtype
 * Prints one line per (policy, N): agents that finished every round, resume
 * latency (RESUME -> first token of the next answer) p50/p99/max, aggregate
 * generated tok/s over the run's wall time and over its active time (the
 * run less one tool wait per round), swaps and bytes moved, and the bar
 * for p99: 2 x (an agent's KV bytes / the measured host->device rate) +
 * its resume prefill + one step, from the daemon's own figures; and the most
 * sessions resident at once (KV mapped, none of it in the swap pool: polled
 * every 200 ms) with the largest session's KV bytes. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "djinn/client.h"
#include "support/bench_daemon.h"

#define MAX_AGENTS 256
#define MAX_ROUNDS 8

typedef struct cfg {
    const char *store, *model, *device, *vmu, *data, *swap, *kv_dtype;
    int n[16], n_n;
    const char *policies[3];
    int n_pol;
    int prompt, decode, resume, wait_ms, rounds, give_up_s;
    int vocab;
} cfg;

typedef struct agent {
    const cfg *c;
    const char *addr;
    int idx;
    bool ok;
    char err[200];
    double resume_lat[MAX_ROUNDS]; /* seconds, per tool return */
    int n_lat;
    uint64_t tokens;
    double prefill_ms[MAX_ROUNDS + 1], decode_ms[MAX_ROUNDS + 1];
} agent;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

typedef struct tok_ctx {
    double t_first;
    uint32_t n;
} tok_ctx;

static void on_token(int32_t id, const char *text, size_t len, void *user) {
    (void)text;
    (void)len;
    tok_ctx *t = user;
    if (id < 0) return;
    if (!t->n) t->t_first = now_s();
    t->n++;
}

/* One answer: n_ids prompt ids, `decode` tokens; the first token's time. */
static dj_status answer(agent *a, dj_client_t *cl, uint64_t sid, int32_t *ids, int n_ids, int round, double *t_first) {
    const cfg *c = a->c;
    tok_ctx t = {0, 0};
    dj_generate_result res;
    const dj_generate_params gp = {.ids = ids, .n_ids = (size_t)n_ids, .max_tokens = (uint32_t)c->decode,
                                   .ignore_eos = true};
    dj_status st = dj_client_generate(cl, sid, &gp, on_token, &t, &res);
    if (st == DJ_OK && t.n != (uint32_t)c->decode) st = dj_fail(DJ_EINTERNAL, "%u tokens of %d", t.n, c->decode);
    if (st == DJ_OK) {
        a->tokens += t.n;
        a->prefill_ms[round] = res.prefill_ms;
        a->decode_ms[round] = res.decode_ms;
    }
    *t_first = t.t_first;
    return st;
}

static void *agent_main(void *p) {
    agent *a = p;
    const cfg *c = a->c;
    dj_client_t *cl = NULL;
    uint64_t sid = 0;
    int32_t *ids = malloc((size_t)(c->prompt > c->resume ? c->prompt : c->resume) * sizeof *ids);
    uint64_t x = mix((uint64_t)a->idx + 1);
    dj_status st = ids ? dj_client_connect(a->addr, NULL, &cl) : dj_fail(DJ_ENOMEM, "out of memory");
    const uint32_t ctx = (uint32_t)(c->prompt + c->rounds * (c->resume + c->decode) + c->decode + 16);
    const dj_session_opts so = {.model = c->model, .qos = DJ_QOS_INTERACTIVE, .expected_tokens = ctx};
    if (st == DJ_OK) st = dj_client_session_open(cl, &so, &sid);
    double t_first = 0;
    if (st == DJ_OK) {
        for (int i = 0; i < c->prompt; i++) ids[i] = (int32_t)((x = mix(x)) % (uint64_t)c->vocab);
        st = answer(a, cl, sid, ids, c->prompt, 0, &t_first);
    }
    for (int r = 0; r < c->rounds && st == DJ_OK; r++) {
        st = dj_client_session_pause(cl, sid, (uint64_t)c->wait_ms);
        if (st != DJ_OK) break;
        usleep((useconds_t)c->wait_ms * 1000);
        const double t_back = now_s();
        st = dj_client_session_resume(cl, sid);
        if (st != DJ_OK) break;
        for (int i = 0; i < c->resume; i++) ids[i] = (int32_t)((x = mix(x)) % (uint64_t)c->vocab);
        st = answer(a, cl, sid, ids, c->resume, r + 1, &t_first);
        if (st == DJ_OK) a->resume_lat[a->n_lat++] = t_first - t_back;
    }
    a->ok = st == DJ_OK;
    if (!a->ok) snprintf(a->err, sizeof a->err, "%s: %s", dj_status_name(st), dj_last_error());
    if (sid) dj_client_session_close(cl, sid);
    dj_client_free(cl);
    free(ids);
    return NULL;
}

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    for (const char *p = s; *p && n < cap;) {
        out[n++] = atoi(p);
        const char *comma = strchr(p, ',');
        if (!comma) break;
        p = comma + 1;
    }
    return n;
}

/* Polls the daemon's stats every 200 ms until stop: the most sessions
 * resident at once (KV bytes, none pooled) and the largest session's KV. */
typedef struct monitor {
    const char *addr;
    atomic_int stop;
    int peak_resident;
    uint64_t max_kv;
} monitor;

static void *monitor_main(void *p) {
    monitor *m = p;
    dj_client_t *cl = NULL;
    if (dj_client_connect(m->addr, NULL, &cl) != DJ_OK) return NULL;
    while (!m->stop) {
        dj_client_stats st;
        memset(&st, 0, sizeof st);
        if (dj_client_stats_get(cl, &st) != DJ_OK) break;
        int resident = 0;
        for (size_t i = 0; i < st.n_sessions; i++) {
            const dj_client_session_info *si = &st.sessions[i];
            resident += si->kv_bytes > 0 && si->pooled_bytes == 0 && strcmp(si->state, "swapped") != 0;
            if (si->kv_bytes > m->max_kv) m->max_kv = si->kv_bytes;
        }
        if (resident > m->peak_resident) m->peak_resident = resident;
        dj_client_stats_free(&st);
        usleep(200000);
    }
    dj_client_free(cl);
    return NULL;
}

/* Loads (and pins) the model, so its load is not in the first agents' times. */
static int preload(const char *addr, const char *model) {
    dj_client_t *cl = NULL;
    if (dj_client_connect(addr, NULL, &cl) != DJ_OK) return -1;
    const int rc = dj_client_model_load(cl, model) == DJ_OK ? 0 : -1;
    if (rc) fprintf(stderr, "bench_agents: model %s: %s\n", model, dj_last_error());
    dj_client_free(cl);
    return rc;
}

/* One daemon for one (policy, N): agents that have not finished by the
 * deadline are failures (the daemon is stopped under them, which ends their
 * calls). */
static void run_one(cfg *c, const char *policy, int n, int ni) {
    const char *args[40];
    int k = 0;
    args[k++] = "--models";
    args[k++] = c->store;
    args[k++] = "--device";
    args[k++] = c->device;
    args[k++] = "--swap-policy";
    args[k++] = policy;
    args[k++] = "--lease-ms";
    args[k++] = "600000";
    args[k++] = "--max-sessions-per-conn";
    args[k++] = "4";
    args[k++] = "--local-admin"; /* its STATS are the daemon-wide ones */
    if (c->vmu) {
        args[k++] = "--vmu-gb";
        args[k++] = c->vmu;
    }
    if (c->data) {
        args[k++] = "--data-gb";
        args[k++] = c->data;
    }
    if (c->swap) {
        args[k++] = "--swap-gb";
        args[k++] = c->swap;
    }
    if (c->kv_dtype) {
        args[k++] = "--kv-dtype";
        args[k++] = c->kv_dtype;
    }
    args[k] = NULL;
    dj_bench_daemon d;
    if (dj_bench_daemon_start(&d, args, 600000) != 0) {
        fprintf(stderr, "bench_agents: djinnd (%s) did not start\n", policy);
        return;
    }
    if (preload(d.addr, c->model) != 0) {
        dj_bench_daemon_stop(&d);
        return;
    }
    {
        static agent ag[MAX_AGENTS];
        pthread_t th[MAX_AGENTS];
        dj_client_t *cl = NULL;
        dj_client_stats s0, s1;
        memset(&s0, 0, sizeof s0);
        memset(&s1, 0, sizeof s1);
        if (dj_client_connect(d.addr, NULL, &cl) == DJ_OK) dj_client_stats_get(cl, &s0);
        monitor mon = {.addr = d.addr};
        pthread_t mon_th;
        const bool have_mon = pthread_create(&mon_th, NULL, monitor_main, &mon) == 0;
        const double t0 = now_s();
        for (int i = 0; i < n; i++) {
            memset(&ag[i], 0, sizeof ag[i]);
            ag[i].c = c;
            ag[i].addr = d.addr;
            ag[i].idx = i + 1000 * ni;
            pthread_create(&th[i], NULL, agent_main, &ag[i]);
        }
        /* every agent's own time at most: prompt, rounds of waits and answers, with room */
        const double deadline = t0 + c->rounds * c->wait_ms / 1e3 + c->give_up_s;
        bool stalled = false;
        for (int i = 0; i < n; i++) {
            const double left = deadline - now_s();
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            const double until = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + (left > 0 ? left : 0);
            ts.tv_sec = (time_t)until;
            ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
            if (pthread_timedjoin_np(th[i], NULL, &ts) != 0) {
                stalled = true;
                break;
            }
            th[i] = 0;
        }
        const double wall = now_s() - t0;
        mon.stop = 1;
        if (have_mon) pthread_join(mon_th, NULL);
        if (cl) dj_client_stats_get(cl, &s1);
        dj_client_free(cl);
        if (stalled) { /* the daemon goes: the agents still waiting get an error and end */
            dj_bench_daemon_stop(&d);
            for (int i = 0; i < n; i++)
                if (th[i]) pthread_join(th[i], NULL);
        }
        int ok = 0, n_lat = 0;
        uint64_t tokens = 0;
        static double lat[MAX_AGENTS * MAX_ROUNDS], pre[MAX_AGENTS * MAX_ROUNDS], dec[MAX_AGENTS * MAX_ROUNDS];
        int n_pre = 0;
        for (int i = 0; i < n; i++) {
            ok += ag[i].ok;
            tokens += ag[i].tokens;
            for (int r = 0; r < ag[i].n_lat; r++) lat[n_lat++] = ag[i].resume_lat[r];
            if (ag[i].ok)
                for (int r = 1; r <= c->rounds; r++) {
                    pre[n_pre] = ag[i].prefill_ms[r];
                    dec[n_pre++] = ag[i].decode_ms[r] / (c->decode > 1 ? c->decode - 1 : 1);
                }
            if (!ag[i].ok && i < 3) fprintf(stderr, "  agent %d: %s\n", i, ag[i].err);
        }
        qsort(lat, (size_t)n_lat, sizeof *lat, cmp_double);
        qsort(pre, (size_t)n_pre, sizeof *pre, cmp_double);
        qsort(dec, (size_t)n_pre, sizeof *dec, cmp_double);
        const double p50 = n_lat ? lat[n_lat / 2] : 0, p99 = n_lat ? lat[(n_lat * 99) / 100 < n_lat ? (n_lat * 99) / 100 : n_lat - 1] : 0;
        const double active = wall - c->rounds * c->wait_ms / 1e3;
        const uint64_t sw_out = s1.swap.swaps_out - s0.swap.swaps_out, sw_in = s1.swap.swaps_in - s0.swap.swaps_in;
        const double b_in = (double)(s1.swap.bytes_in - s0.swap.bytes_in);
        /* the bar: 2 x KV bytes / H2D + the resume's prefill + one step (medians) */
        const double kv_bytes = sw_in ? b_in / (double)sw_in : 0;
        printf("policy %-9s N %3d: %3d/%d agents finished (%.0f%%); resume p50 %.3f s p99 %.3f s max %.3f s; "
               "%.0f tok/s over %.1f s wall, %.0f tok/s active; swaps %llu out %llu in (%.2f GiB in); "
               "drops %llu, prefetches %llu; resume prefill p50 %.1f ms, decode step p50 %.2f ms; KV/agent %.0f MiB\n",
               policy, n, ok, n, 100.0 * ok / n, p50, p99, n_lat ? lat[n_lat - 1] : 0, tokens / wall, wall,
               active > 0 ? tokens / active : 0, (unsigned long long)sw_out, (unsigned long long)sw_in, b_in / 1073741824.0,
               (unsigned long long)(s1.swap.kv_drops - s0.swap.kv_drops),
               (unsigned long long)(s1.swap.prefetches - s0.swap.prefetches), n_pre ? pre[n_pre / 2] : 0,
               n_pre ? dec[n_pre / 2] : 0, kv_bytes / 1048576.0);
        printf("  KV %s: at most %d sessions resident at once (data segment %.2f GiB, largest session's KV %.1f MiB)\n",
               c->kv_dtype ? c->kv_dtype : "auto", mon.peak_resident, (double)s1.data.capacity / 1073741824.0,
               (double)mon.max_kv / 1048576.0);
        if (stalled) printf("  (stalled: the run was stopped %d s after its expected end)\n", c->give_up_s);
        fflush(stdout);
        dj_client_stats_free(&s0);
        dj_client_stats_free(&s1);
        if (!stalled) dj_bench_daemon_stop(&d);
    }
}

static void run_policy(cfg *c, const char *policy) {
    for (int ni = 0; ni < c->n_n; ni++) run_one(c, policy, c->n[ni], ni);
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_agents STORE MODEL DEVICE [--n 8,32,128] [--policies semantic,reactive,recompute]\n"
                        "       [--vmu-gb G] [--data-gb G] [--swap-gb G] [--prompt 2048] [--decode 50] [--resume 100]\n"
                        "       [--wait-ms 10000] [--rounds 3] [--vocab 128256] [--give-up-s 120] [--kv-dtype auto|fp8]\n");
        return 2;
    }
    cfg c = {.store = argv[1], .model = argv[2], .device = argv[3], .prompt = 2048, .decode = 50, .resume = 100,
             .wait_ms = 10000, .rounds = 3, .give_up_s = 120, .vocab = 128256};
    c.n_n = parse_list("8,32,128", c.n, 16);
    c.policies[0] = "semantic";
    c.policies[1] = "reactive";
    c.policies[2] = "recompute";
    c.n_pol = 3;
    for (int i = 4; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--n")) c.n_n = parse_list(v, c.n, 16);
        else if (!strcmp(a, "--vmu-gb")) c.vmu = v;
        else if (!strcmp(a, "--data-gb")) c.data = v;
        else if (!strcmp(a, "--swap-gb")) c.swap = v;
        else if (!strcmp(a, "--kv-dtype")) c.kv_dtype = v;
        else if (!strcmp(a, "--prompt")) c.prompt = atoi(v);
        else if (!strcmp(a, "--decode")) c.decode = atoi(v);
        else if (!strcmp(a, "--resume")) c.resume = atoi(v);
        else if (!strcmp(a, "--wait-ms")) c.wait_ms = atoi(v);
        else if (!strcmp(a, "--rounds")) c.rounds = atoi(v);
        else if (!strcmp(a, "--vocab")) c.vocab = atoi(v);
        else if (!strcmp(a, "--give-up-s")) c.give_up_s = atoi(v);
        else if (!strcmp(a, "--policies")) {
            c.n_pol = 0;
            char *dup = strdup(v);
            for (char *tok = strtok(dup, ","); tok && c.n_pol < 3; tok = strtok(NULL, ",")) c.policies[c.n_pol++] = tok;
        } else {
            fprintf(stderr, "bench_agents: unknown option %s\n", a);
            return 2;
        }
    }
    for (int i = 0; i < c.n_n; i++)
        if (c.n[i] < 1 || c.n[i] > MAX_AGENTS) {
            fprintf(stderr, "bench_agents: N %d out of 1..%d\n", c.n[i], MAX_AGENTS);
            return 2;
        }
    if (c.rounds < 1 || c.rounds > MAX_ROUNDS || c.prompt < 1 || c.decode < 1 || c.resume < 1 || c.vocab < 2) {
        fprintf(stderr, "bench_agents: rounds 1..%d, prompt, decode, resume >= 1, vocab >= 2\n", MAX_ROUNDS);
        return 2;
    }
    printf("bench_agents: model %s on %s; prompt %d, answer %d, tool wait %d ms, resume %d tokens, %d rounds; "
           "vmu %s, data %s, swap %s\n",
           c.model, c.device, c.prompt, c.decode, c.wait_ms, c.resume, c.rounds, c.vmu ? c.vmu : "auto",
           c.data ? c.data : "default", c.swap ? c.swap : "auto");
    for (int p = 0; p < c.n_pol; p++) run_policy(&c, c.policies[p]);
    return 0;
}
