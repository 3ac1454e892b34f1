/* metrics.c: djinnd's Prometheus endpoint over libmicrohttpd - request
 * counts by type and status, latency histograms, VMU bytes and sessions;
 * behind a bearer token when djinnd has a token file. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <microhttpd.h>

#include "server/server_impl.h"

const double dj__hist_bounds[DJ__HIST_BUCKETS] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                  0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5};

void dj__metrics_count(dj__metrics *m, uint32_t type, dj_status st) {
    int code = -(int)st;
    if (code < 0 || code >= DJ__N_STATUS) code = -(int)DJ_EINTERNAL;
    if (type > DJ_MSG_REQUEST_LAST) type = 0;
    pthread_mutex_lock(&m->mu);
    m->requests[type][code]++;
    pthread_mutex_unlock(&m->mu);
}

void dj__metrics_observe_locked(dj__metrics *m, dj__hist *h, double seconds) {
    (void)m;
    int b = 0;
    while (b < DJ__HIST_BUCKETS && seconds > dj__hist_bounds[b]) b++;
    h->count[b]++;
    h->sum += seconds;
}

void dj__metrics_observe(dj__metrics *m, dj__hist *h, double seconds) {
    pthread_mutex_lock(&m->mu);
    dj__metrics_observe_locked(m, h, seconds);
    pthread_mutex_unlock(&m->mu);
}

static void put_hist(FILE *f, const char *name, const char *help, const dj__hist *h) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < DJ__HIST_BUCKETS; b++) {
        cum += h->count[b];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", name, dj__hist_bounds[b], (unsigned long long)cum);
    }
    cum += h->count[DJ__HIST_BUCKETS];
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9f\n%s_count %llu\n", name, (unsigned long long)cum, name, h->sum,
            name, (unsigned long long)cum);
}

static char *render(dj__metrics *m, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    pthread_mutex_lock(&m->mu);
    fputs("# HELP djinn_requests_total Requests answered, by type and status.\n# TYPE djinn_requests_total counter\n", f);
    for (uint32_t t = 0; t <= DJ_MSG_REQUEST_LAST; t++)
        for (int c = 0; c < DJ__N_STATUS; c++)
            if (m->requests[t][c])
                fprintf(f, "djinn_requests_total{type=\"%s\",status=\"%s\"} %llu\n", t ? dj_msg_type_name(t) : "INVALID",
                        dj_status_name((dj_status)-c), (unsigned long long)m->requests[t][c]);
    put_hist(f, "djinn_queue_seconds", "Time from arrival to the engine picking a request up.", &m->queue_s);
    put_hist(f, "djinn_ttft_seconds", "Time from arrival of GENERATE to its first token.", &m->ttft_s);
    put_hist(f, "djinn_token_seconds", "Time between consecutive tokens of one generation.", &m->token_s);
    fputs("# HELP djinn_vmu_bytes VMU bytes per segment.\n# TYPE djinn_vmu_bytes gauge\n", f);
    const dj_vmu_seg_stats *seg[3] = {&m->vmu.text, &m->vmu.data, &m->vmu.stack};
    static const char *names[3] = {"text", "data", "stack"};
    for (int i = 0; i < 3; i++) {
        fprintf(f, "djinn_vmu_bytes{segment=\"%s\",kind=\"capacity\"} %zu\n", names[i], seg[i]->capacity);
        fprintf(f, "djinn_vmu_bytes{segment=\"%s\",kind=\"used\"} %zu\n", names[i], seg[i]->used);
        fprintf(f, "djinn_vmu_bytes{segment=\"%s\",kind=\"peak\"} %zu\n", names[i], seg[i]->peak);
    }
    fprintf(f, "# TYPE djinn_sessions gauge\ndjinn_sessions %llu\n", (unsigned long long)m->sessions);
    fprintf(f, "# TYPE djinn_connections gauge\ndjinn_connections %llu\n", (unsigned long long)m->connections);
    fprintf(f, "# TYPE djinn_models gauge\ndjinn_models %zu\n", m->vmu.n_models);
    fprintf(f, "# TYPE djinn_evictions_total counter\ndjinn_evictions_total %zu\n", m->vmu.evictions);
    fprintf(f, "# TYPE djinn_lease_expiries_total counter\ndjinn_lease_expiries_total %llu\n",
            (unsigned long long)m->lease_expiries);
    fprintf(f, "# TYPE djinn_tokens_total counter\ndjinn_tokens_total %llu\n", (unsigned long long)m->tokens);
    put_hist(f, "djinn_resume_seconds", "Time from a RESUME to the first token of the session's next generation.",
             &m->resume_s);
    put_hist(f, "djinn_swap_out_seconds", "Time a session's KV took to reach the host swap pool.", &m->swap_out_s);
    put_hist(f, "djinn_swap_in_seconds", "Time a session's KV took to come back from the pool.", &m->swap_in_s);
    fputs("# HELP djinn_swaps_total Sessions moved to the host pool (out) and back (in).\n"
          "# TYPE djinn_swaps_total counter\n", f);
    fprintf(f, "djinn_swaps_total{direction=\"out\"} %llu\ndjinn_swaps_total{direction=\"in\"} %llu\n",
            (unsigned long long)m->swaps_out, (unsigned long long)m->swaps_in);
    fputs("# TYPE djinn_swap_bytes_total counter\n", f);
    fprintf(f, "djinn_swap_bytes_total{direction=\"out\"} %llu\ndjinn_swap_bytes_total{direction=\"in\"} %llu\n",
            (unsigned long long)m->swap_bytes_out, (unsigned long long)m->swap_bytes_in);
    fprintf(f, "# TYPE djinn_swap_pool_bytes gauge\ndjinn_swap_pool_bytes{kind=\"capacity\"} %llu\n"
               "djinn_swap_pool_bytes{kind=\"used\"} %llu\n",
            (unsigned long long)m->pool_bytes, (unsigned long long)m->pool_used);
    fprintf(f, "# TYPE djinn_preemptions_total counter\ndjinn_preemptions_total %llu\n",
            (unsigned long long)m->preemptions);
    fprintf(f, "# TYPE djinn_kv_drops_total counter\ndjinn_kv_drops_total %llu\n", (unsigned long long)m->drops);
    fputs("# HELP djinn_sessions_by_state Sessions by scheduler state.\n# TYPE djinn_sessions_by_state gauge\n", f);
    for (int i = 0; i <= DJ_SESS_DROPPED; i++)
        fprintf(f, "djinn_sessions_by_state{state=\"%s\"} %u\n", dj_sched_state_name((dj_sched_state)i),
                m->sess_states[i]);
    dj__vllm_render(&m->vllm, f); /* metrics_vllm.c */
    pthread_mutex_unlock(&m->mu);
    fclose(f);
    return buf;
}

const char *dj__bearer_of(const char *v) {
    if (!v || strncasecmp(v, "Bearer", 6) || v[6] != ' ') return NULL;
    v += 7;
    while (*v == ' ') v++;
    return *v ? v : NULL;
}

/* The request carries "Authorization: Bearer T" with T a token of the file
 * with the admin role: the counters are the whole daemon's (every tenant's
 * requests, memory, swap), so a tenant's token does not read them. */
static bool bearer_ok(const dj__metrics *m, struct MHD_Connection *conn) {
    const char *v = dj__bearer_of(MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization"));
    const dj__token *t = v ? dj__token_find_live(m->auth, m->n_auth, v, strlen(v)) : NULL;
    return t && t->admin;
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                               const char *version, const char *upload, size_t *upload_size, void **ctx) {
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)ctx;
    dj__metrics *m = cls;
    struct MHD_Response *r;
    unsigned code = MHD_HTTP_OK;
    if (!m->n_auth && !m->local_admin) {
        static const char fb[] = "forbidden: " DJ__ADMIN_NEEDED "\n";
        r = MHD_create_response_from_buffer(sizeof fb - 1, (void *)fb, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_FORBIDDEN, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (m->n_auth && !bearer_ok(m, conn)) {
        static const char na[] = "unauthorized: send 'Authorization: Bearer TOKEN' (an admin token of --token-file)\n";
        r = MHD_create_response_from_buffer(sizeof na - 1, (void *)na, MHD_RESPMEM_PERSISTENT);
        if (!r) return MHD_NO;
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"djinnd\"");
        enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_UNAUTHORIZED, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (strcmp(method, "GET") != 0 || strcmp(url, "/metrics") != 0) {
        static const char nf[] = "not found: GET /metrics\n";
        r = MHD_create_response_from_buffer(sizeof nf - 1, (void *)nf, MHD_RESPMEM_PERSISTENT);
        code = MHD_HTTP_NOT_FOUND;
    } else {
        size_t len = 0;
        char *body = render(m, &len);
        if (!body) return MHD_NO;
        r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    }
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

dj_status dj__metrics_start(dj__metrics *m, const char *addr, uint32_t max_conns) {
    struct sockaddr_storage ss;
    socklen_t len;
    dj_status st = dj__addr_parse(addr, &ss, &len);
    if (st != DJ_OK) return st;
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)
        return dj_fail(DJ_EINVAL, "--metrics %s: want HOST:PORT", addr);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | (ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    /* its own limits: a few connections at once, each closed after 10 s,
     * no request body */
    m->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_http, m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conns, MHD_OPTION_CONNECTION_TIMEOUT,
                              (unsigned)10, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
                              MHD_OPTION_END);
    if (!m->mhd) return dj_fail(DJ_EIO, "--metrics %s: cannot start the HTTP listener", addr);
    return DJ_OK;
}

void dj__metrics_stop(dj__metrics *m) {
    if (m->mhd) MHD_stop_daemon(m->mhd);
    m->mhd = NULL;
}
