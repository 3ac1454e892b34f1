/* admin_balancer.c: `djinn admin drain|ready|servers HOST` over HAProxy's runtime API (its
 * stats socket, level admin): every backend's server named HOST (or at address HOST) at once. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli/admin_balancer.h"

#define DEFAULT_SOCKET "/run/haproxy/djinn.sock"
#define ANSWER_MAX (4u << 20) /* a runtime API answer we read at most (show servers state: a line a server) */

static int usage(FILE *f) {
    fputs("usage: djinn admin drain HOST [--haproxy SOCKET]   no new sessions to HOST; live ones finish there\n"
          "                                                   (--move: moves them instead - not built yet)\n"
          "       djinn admin ready HOST [--haproxy SOCKET]   HOST takes new sessions again\n"
          "       djinn admin servers [--haproxy SOCKET]      every backend's servers: state, weight, sessions\n"
          "HOST: a server's name in haproxy.cfg (d1) or its address (10.0.0.11); every backend's server of\n"
          "that name or address changes together. SOCKET: HAProxy's stats socket at level admin (default\n"
          DEFAULT_SOCKET ").\n",
          f);
    return 2;
}

/* One runtime API command (non-interactive: HAProxy answers and closes); its answer in
 * *out (malloc'd, NUL-terminated). Returns 0, or 1 with the reason on stderr. */
static int api(const char *sock_path, const char *cmd, char **out) {
    *out = NULL;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(sock_path) >= sizeof a.sun_path) {
        fprintf(stderr, "djinn admin: socket path too long: %s\n", sock_path);
        return 1;
    }
    strcpy(a.sun_path, sock_path);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "djinn admin: cannot reach HAProxy's runtime API at %s: %s (haproxy.cfg's 'stats socket ... "
                        "level admin'; --haproxy SOCKET)\n", sock_path, strerror(errno));
        if (fd >= 0) close(fd);
        return 1;
    }
    size_t n = strlen(cmd), done = 0;
    while (done < n) {
        const ssize_t w = send(fd, cmd + done, n - done, MSG_NOSIGNAL);
        if (w <= 0) {
            fprintf(stderr, "djinn admin: write to %s: %s\n", sock_path, strerror(errno));
            close(fd);
            return 1;
        }
        done += (size_t)w;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ssize_t r = 0;
    while (buf && (r = read(fd, buf + len, cap - 1 - len)) > 0) {
        len += (size_t)r;
        if (len + 1 == cap) {
            if (cap >= ANSWER_MAX) break;
            char *nb = realloc(buf, cap * 2);
            if (!nb) free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    close(fd);
    if (!buf) {
        fprintf(stderr, "djinn admin: out of memory\n");
        return 1;
    }
    buf[len] = 0;
    *out = buf;
    return 0;
}

/* A runtime API answer that is an error: HAProxy's words start so. */
static bool api_refused(const char *ans) {
    return !strncmp(ans, "Unknown command", 15) || !strncmp(ans, "Permission denied", 17) ||
           strstr(ans, "No such") || strstr(ans, "Require") || strstr(ans, "not found");
}

/* Fields of one `show servers state` line (space-separated): be_id be_name srv_id srv_name
 * srv_addr srv_op_state srv_admin_state srv_uweight ... */
typedef struct srv_line {
    char be[128], name[128], addr[128];
    int op, admin, uweight;
} srv_line;

static bool parse_srv(const char *line, srv_line *s) {
    int be_id, srv_id;
    return sscanf(line, "%d %127s %d %127s %127s %d %d %d", &be_id, s->be, &srv_id, s->name, s->addr, &s->op,
                  &s->admin, &s->uweight) == 8;
}

/* Current sessions of be/srv from `show stat` CSV (pxname,svname,qcur,qmax,scur,...): -1 if absent. */
static long stat_scur(const char *csv, const char *be, const char *srv) {
    for (const char *l = csv; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const size_t nb = strlen(be), ns = strlen(srv);
        if (!strncmp(l, be, nb) && l[nb] == ',' && !strncmp(l + nb + 1, srv, ns) && l[nb + 1 + ns] == ',') {
            const char *p = l + nb + 1 + ns + 1; /* qcur,qmax,scur */
            for (int k = 0; k < 2 && p; k++) p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL;
            return p ? strtol(p, NULL, 10) : -1;
        }
    }
    return -1;
}

int dj__cli_admin_balancer(int argc, char **argv) {
    if (argc < 3) return usage(stderr);
    const char *verb = argv[2], *host = NULL, *sock = DEFAULT_SOCKET;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--haproxy") && i + 1 < argc) sock = argv[++i];
        else if (!strcmp(argv[i], "--move")) {
            /* The move step, on session export/import (issue 46, built): for each live session
             * of HOST, export it there, import it on the daemon HAProxy would pick now, point
             * its stick entry there (set table djinn_bin key TOKEN data.server_id ID; for HTTP
             * the X-Djinn-Session key of http_sessions) and close the old connection, so that
             * the client's reconnect with its routing token lands where the session now is. */
            fprintf(stderr, "djinn admin: --move is not built yet; 'drain' alone lets live sessions finish where "
                            "they are (a session moves by hand: djinn session export, then import on another daemon)\n");
            return 2;
        }
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout), 0;
        else if (argv[i][0] != '-' && !host) host = argv[i];
        else {
            fprintf(stderr, "djinn admin: unexpected argument '%s'\n", argv[i]);
            return usage(stderr);
        }
    }
    const bool drain = !strcmp(verb, "drain"), ready = !strcmp(verb, "ready"), list = !strcmp(verb, "servers");
    if (!drain && !ready && !list) {
        fprintf(stderr, "djinn admin: unknown command '%s' (drain, ready, servers)\n", verb);
        return usage(stderr);
    }
    if (!list && !host) {
        fprintf(stderr, "djinn admin %s: which HOST? (a server name of haproxy.cfg, or its address)\n", verb);
        return 2;
    }
    char *state = NULL, *csv = NULL;
    if (api(sock, "show servers state\n", &state) || api(sock, "show stat\n", &csv)) {
        free(state);
        return 1;
    }
    int rc = 0, matched = 0;
    for (char *l = state; l && *l;) {
        char *nl = strchr(l, '\n');
        if (nl) *nl = 0;
        srv_line s;
        if (l[0] != '#' && parse_srv(l, &s) && (list || !strcmp(s.name, host) || !strcmp(s.addr, host))) {
            matched++;
            if (!list) {
                char cmd[512], *ans = NULL;
                snprintf(cmd, sizeof cmd, "set server %s/%s state %s\n", s.be, s.name, drain ? "drain" : "ready");
                if (api(sock, cmd, &ans)) {
                    rc = 1;
                } else if (api_refused(ans)) {
                    fprintf(stderr, "djinn admin: HAProxy refused '%.*s': %s", (int)strlen(cmd) - 1, cmd, ans);
                    rc = 1;
                }
                free(ans);
            }
            /* srv_admin_state bits: 0x1 forced maint, 0x8 forced drain (HAProxy's SRV_ADMF_*) */
            printf("%s/%s %s: %s%s, weight %d, %ld sessions\n", s.be, s.name, s.addr, s.op == 2 ? "up" : "down",
                   list ? ((s.admin & 0x1) ? " maint" : (s.admin & 0x18) ? " drain" : "")
                        : drain ? " -> drain" : " -> ready",
                   s.uweight, stat_scur(csv, s.be, s.name));
        }
        l = nl ? nl + 1 : NULL;
    }
    if (!list && !matched) {
        fprintf(stderr, "djinn admin %s: no server named or at '%s' in HAProxy's backends (djinn admin servers "
                        "lists them)\n", verb, host);
        rc = 1;
    }
    if (drain && matched && !rc)
        printf("%s: no new sessions; live sessions finish there (moving them needs session export/import)\n", host);
    free(state);
    free(csv);
    return rc;
}
