/* access.c: the daemon's side of the access lines - the record of
 * djinn/log_access.h filled from a GENERATE's job and session, or from a
 * request of the HTTP door. */
#include "server/access.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "djinn/log_access.h"
#include "djinn/generate.h"
#include "server/server_impl.h"

static void addr_name(const struct sockaddr *sa, char *out, size_t cap) {
    char host[INET6_ADDRSTRLEN] = "?";
    if (sa && sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(out, cap, "%s:%u", host, (unsigned)ntohs(a->sin_port));
    } else if (sa && sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        snprintf(out, cap, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
    } else {
        snprintf(out, cap, sa && sa->sa_family == AF_UNIX ? "unix" : "?");
    }
}

void dj__access_who(const dj__server *s, const void *uv_stream, bool is_unix, bool door, uint64_t tenant,
                    char peer[DJ__ACCESS_PEER], char token[64]) {
    token[0] = '\0';
    if (!dj_log_enabled(DJ_LOG_INFO)) { /* no line will be written: no syscall */
        peer[0] = '\0';
        return;
    }
    if (door) {
        snprintf(peer, DJ__ACCESS_PEER, "door");
    } else if (is_unix) {
        snprintf(peer, DJ__ACCESS_PEER, "unix");
    } else {
        struct sockaddr_storage ss;
        int len = (int)sizeof ss;
        if (uv_tcp_getpeername((const uv_tcp_t *)uv_stream, (struct sockaddr *)&ss, &len) == 0)
            addr_name((const struct sockaddr *)&ss, peer, DJ__ACCESS_PEER);
        else
            snprintf(peer, DJ__ACCESS_PEER, "?");
    }
    for (size_t i = 0; s->have_token && i < s->n_tokens; i++)
        if (s->tokens[i].tenant == tenant) {
            snprintf(token, 64, "%s", s->tokens[i].name);
            break;
        }
}

void dj__access_generate(const dj__job *j, const dj__sess *ss, dj_status st) {
    if (!dj_log_enabled(DJ_LOG_INFO)) return;
    const dj__gen *g = j->gen;
    const double now = dj__now();
    dj_access_rec r = {.door = "binary", .peer = j->peer, .token = j->token_name, .request = "GENERATE",
                       .model = ss ? ss->model : NULL, .qos = dj_qos_name(ss ? ss->qos : j->qos),
                       .queue_ms = -1, .ttft_ms = -1, .total_ms = (now - j->t_enqueue) * 1e3,
                       .outcome = dj_status_name(st)};
    if (g) {
        r.prompt_tokens = g->n_prompt;
        if (g->g) r.gen_tokens = dj_gen_n_generated(g->g);
        if (g->t_start > 0) r.queue_ms = (g->t_start - j->t_enqueue) * 1e3;
        if (r.gen_tokens && g->t_first > 0) r.ttft_ms = (g->t_first - j->t_enqueue) * 1e3;
        if (st == DJ_OK && g->g) r.outcome = dj_gen_finish_name(dj_gen_finished(g->g));
    }
    dj_log_access(&r);
}

void dj__access_job(const dj__job *j, const char *model, dj_status st) {
    if (!dj_log_enabled(DJ_LOG_INFO)) return;
    const dj_access_rec r = {.door = "binary", .peer = j->peer, .token = j->token_name,
                             .request = dj_msg_type_name(j->type), .model = model && model[0] ? model : NULL,
                             .qos = dj_qos_name(j->qos), .queue_ms = -1, .ttft_ms = -1,
                             .total_ms = (dj__now() - j->t_enqueue) * 1e3, .outcome = dj_status_name(st)};
    dj_log_access(&r);
}

void dj__access_io(const dj__server *s, const void *uv_stream, bool is_unix, bool door, uint64_t tenant,
                   uint16_t type, dj_status st) {
    if (!dj_log_enabled(DJ_LOG_INFO) || (type == DJ_MSG_HEARTBEAT && st == DJ_OK)) return;
    char peer[DJ__ACCESS_PEER], token[64];
    dj__access_who(s, uv_stream, is_unix, door, tenant, peer, token);
    const dj_access_rec r = {.door = "binary", .peer = peer, .token = token,
                             .request = type ? dj_msg_type_name(type) : "INVALID", .queue_ms = -1, .ttft_ms = -1,
                             .total_ms = 0, .outcome = dj_status_name(st)};
    dj_log_access(&r);
}

void dj__access_http_begin(char *line, size_t cap, double *t0, const char *method, const char *url) {
    snprintf(line, cap, "%.16s %.*s", method ? method : "?", (int)(cap > 24 ? cap - 24 : 1), url ? url : "?");
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *t0 = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void dj__access_http_done(struct MHD_Connection *c, const char *line, double t0, const char *token, unsigned status,
                          int why) {
    if (!dj_log_enabled(DJ_LOG_INFO)) return;
    char peer[DJ__ACCESS_PEER] = "?";
    const union MHD_ConnectionInfo *ci = c ? MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS) : NULL;
    if (ci && ci->client_addr) addr_name(ci->client_addr, peer, sizeof peer);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const char *outcome = why == MHD_REQUEST_TERMINATED_COMPLETED_OK     ? "completed"
                          : why == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED ? "timeout"
                          : why == MHD_REQUEST_TERMINATED_CLIENT_ABORT    ? "client-abort"
                          : why == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN ? "shutdown"
                                                                          : "error";
    const dj_access_rec r = {.door = "http", .peer = peer, .token = token, .request = line, .queue_ms = -1,
                             .ttft_ms = -1, .total_ms = ((double)ts.tv_sec + ts.tv_nsec * 1e-9 - t0) * 1e3,
                             .outcome = outcome, .status = (int)status};
    dj_log_access(&r);
}
