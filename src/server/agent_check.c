/* agent_check.c: HAProxy's agent-check for djinnd (--agent-check ADDR:PORT): the weight
 * from free KV pages, queued requests and step time, and a thread that answers it. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "djinn/alloc.h"
#include "server/agent_check.h"
#include "server/server_impl.h"

int dj__agent_weight(const dj__agent_load *in) {
    if (in->state_only) return 100;
    double kv = 1.0;
    if (in->pages_total) {
        if (!in->pages_free) return 0;
        const uint64_t f = in->pages_free < in->pages_total ? in->pages_free : in->pages_total;
        kv = (double)f / (double)in->pages_total;
    }
    const double queue = 4.0 / (4.0 + (double)in->waiting);
    double step = 1.0;
    if (in->step_ms > 0 && in->step_best_ms > 0 && in->step_ms > in->step_best_ms)
        step = in->step_best_ms / in->step_ms;
    const double w = round(100.0 * kv * queue * step);
    return w < 1.0 ? 1 : w > 100.0 ? 100 : (int)w;
}

size_t dj__agent_reply(const dj__agent_load *in, char *out, size_t cap) {
    int n;
    switch (in->admin) {
    case DJ__AGENT_DRAIN: n = snprintf(out, cap, "drain\n"); break;
    case DJ__AGENT_MAINT: n = snprintf(out, cap, "maint\n"); break;
    default: n = snprintf(out, cap, "up %s%d%%\n", in->ready ? "ready " : "", dj__agent_weight(in)); break;
    }
    if (n < 0) return 0;
    return (size_t)n < cap ? (size_t)n : cap ? cap - 1 : 0;
}

/* ---- the listener ---- */

/* SIGUSR1 / SIGUSR2 set these (a signal is the process's, as is the daemon). */
static atomic_int g_drain_req;  /* 1: drain asked, 2: ready asked, 0: nothing new */

static void on_usr(int sig) { atomic_store(&g_drain_req, sig == SIGUSR1 ? 1 : 2); }

struct dj__agent {
    int fd, stop_r, stop_w;
    pthread_t th;
    dj__metrics *m;
    atomic_bool stopping;
    bool draining;
    uint64_t ready_until_ms; /* after SIGUSR2: "ready" in every reply until then */
    uint64_t last_steps;
    double last_step_s, best_ms;
};

/* The load now: the worker's published numbers, the step time since the last check. */
static void load_now(dj__agent *a, dj__agent_load *in) {
    memset(in, 0, sizeof *in);
    pthread_mutex_lock(&a->m->mu);
    in->pages_total = a->m->vmu.pages_total;
    in->pages_free = a->m->vmu.pages_free + a->m->pages_reclaimable;
    in->waiting = a->m->waiting;
    const uint64_t steps = a->m->gen_steps;
    const double step_s = a->m->gen_step_s;
    pthread_mutex_unlock(&a->m->mu);
    if (steps > a->last_steps) {
        in->step_ms = (step_s - a->last_step_s) * 1e3 / (double)(steps - a->last_steps);
        if (in->step_ms > 0 && (a->best_ms == 0 || in->step_ms < a->best_ms)) a->best_ms = in->step_ms;
    }
    a->last_steps = steps;
    a->last_step_s = step_s;
    in->step_best_ms = a->best_ms;
    const int req = atomic_exchange(&g_drain_req, 0);
    if (req == 1) a->draining = true;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const uint64_t now_ms = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    if (req == 1) a->draining = true, a->ready_until_ms = 0;
    /* HAProxy runs one agent check per backend naming this daemon (three in deploy/haproxy):
     * each must read "ready" once, so it is said for a while, not once */
    if (req == 2 && a->draining) a->draining = false, a->ready_until_ms = now_ms + DJ__AGENT_READY_MS;
    in->admin = atomic_load(&a->stopping) ? DJ__AGENT_MAINT : a->draining ? DJ__AGENT_DRAIN : DJ__AGENT_UP;
    if (in->admin == DJ__AGENT_UP && now_ms < a->ready_until_ms) in->ready = 1;
}

static void *agent_main(void *arg) {
    dj__agent *a = arg;
    for (;;) {
        struct pollfd p[2] = {{.fd = a->fd, .events = POLLIN}, {.fd = a->stop_r, .events = POLLIN}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[1].revents) break;
        if (!(p[0].revents & POLLIN)) continue;
        const int c = accept4(a->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) continue; /* EAGAIN, a peer gone, out of fds: the next check tries again */
        /* HAProxy's agent-send, if configured, arrives with the connection */
        char said[64] = {0};
        struct pollfd pc = {.fd = c, .events = POLLIN};
        if (poll(&pc, 1, DJ__AGENT_READ_MS) == 1 && (pc.revents & POLLIN)) {
            const ssize_t r = recv(c, said, sizeof said - 1, 0);
            if (r < 0) said[0] = 0;
        }
        dj__agent_load in;
        load_now(a, &in);
        in.state_only = !strncmp(said, "state", 5);
        char line[64];
        const size_t n = dj__agent_reply(&in, line, sizeof line);
        /* a few bytes into an empty socket buffer: one write; a peer that is gone loses nothing */
        if (send(c, line, n, MSG_NOSIGNAL) < 0) DJ_LOG(DEBUG, "agent-check: send: %s", strerror(errno));
        close(c);
    }
    return NULL;
}

dj_status dj__agent_start(const char *addr, dj__metrics *m, dj__agent **out) {
    *out = NULL;
    struct sockaddr_storage ss;
    socklen_t len;
    dj_status st = dj__addr_parse(addr, &ss, &len);
    if (st != DJ_OK) return st;
    if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6)
        return dj_fail(DJ_EINVAL, "--agent-check %s: want HOST:PORT", addr);
    dj__agent *a = dj_calloc(1, sizeof *a);
    if (!a) return dj_fail(DJ_ENOMEM, "out of memory");
    a->m = m;
    a->fd = a->stop_r = a->stop_w = -1;
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        st = dj_fail(DJ_EIO, "--agent-check: pipe: %s", strerror(errno));
        goto fail;
    }
    a->stop_r = pfd[0];
    a->stop_w = pfd[1];
    a->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    const int one = 1;
    if (a->fd < 0 || setsockopt(a->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(a->fd, (struct sockaddr *)&ss, len) != 0 || listen(a->fd, 64) != 0) {
        st = dj_fail(DJ_EIO, "--agent-check %s: %s", addr, strerror(errno));
        goto fail;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    if (pthread_create(&a->th, NULL, agent_main, a) != 0) {
        st = dj_fail(DJ_EIO, "--agent-check: cannot start its thread");
        goto fail;
    }
    DJ_LOG(INFO, "djinnd: agent-check on %s", addr);
    *out = a;
    return DJ_OK;
fail:
    if (a->fd >= 0) close(a->fd);
    if (a->stop_r >= 0) close(a->stop_r);
    if (a->stop_w >= 0) close(a->stop_w);
    dj_free(a);
    return st;
}

void dj__agent_set_stopping(dj__agent *a) {
    if (a) atomic_store(&a->stopping, true);
}

void dj__agent_stop(dj__agent *a) {
    if (!a) return;
    const char b = 1;
    if (write(a->stop_w, &b, 1) != 1) DJ_LOG(WARN, "agent-check: cannot wake its thread: %s", strerror(errno));
    pthread_join(a->th, NULL);
    close(a->fd);
    close(a->stop_r);
    close(a->stop_w);
    dj_free(a);
}
