/* bench_daemon.c: an in-process djinnd and a child-process embedded engine,
 * for bench_serve and bench_remote (see bench_daemon.h). */
#define _GNU_SOURCE
#include "bench_daemon.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server/serve.h"

int dj_bench_threads(void) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 1 ? (int)cores - 1 : 1;
}

static void *serve_thread(void *p) {
    dj_bench_daemon *d = p;
    dj__serve_main(d->argc, d->argv);
    return NULL;
}

int dj_bench_daemon_start(dj_bench_daemon *d, const char *const *args, int wait_ms) {
    memset(d, 0, sizeof *d);
    snprintf(d->port_file, sizeof d->port_file, "/tmp/djinn_bench_port_XXXXXX");
    int pfd = mkstemp(d->port_file);
    if (pfd < 0) return -1;
    close(pfd);
    unlink(d->port_file);
    const char *head[] = {"djinnd", "--listen", "127.0.0.1:0", "--port-file", d->port_file};
    for (size_t i = 0; i < sizeof head / sizeof *head; i++) d->argv[d->argc++] = (char *)head[i];
    for (size_t i = 0; args[i]; i++) {
        if (d->argc + 1 >= (int)(sizeof d->argv / sizeof *d->argv)) return -1;
        d->argv[d->argc++] = (char *)args[i];
    }
    if (pthread_create(&d->thread, NULL, serve_thread, d) != 0) return -1;
    unsigned port = 0;
    for (int i = 0; i < wait_ms / 10 && !port; i++) {
        FILE *f = fopen(d->port_file, "r");
        if (f) {
            if (fscanf(f, "%u", &port) != 1) port = 0;
            fclose(f);
        }
        if (!port) usleep(10000);
    }
    unlink(d->port_file);
    if (!port) return -1;
    snprintf(d->addr, sizeof d->addr, "127.0.0.1:%u", port);
    return 0;
}

void dj_bench_daemon_stop(dj_bench_daemon *d) {
    kill(getpid(), SIGTERM);
    pthread_join(d->thread, NULL);
}

int dj_bench_embedded(const char *who, const char *dir, const char *device, size_t vmu_bytes, int threads,
                      dj_bench_embedded_fn fn, void *arg, double *out, size_t n_out) {
    double res[16];
    if (n_out > sizeof res / sizeof *res) return -1;
    int pp[2];
    if (pipe(pp) != 0) return -1;
    pid_t child = fork();
    if (child == 0) {
        close(pp[0]);
        dj_engine_config ec;
        memset(&ec, 0, sizeof ec);
        dj_vmu_config_default(&ec.vmu, vmu_bytes);
        ec.device = device;
        ec.n_threads = threads;
        dj_engine_t *e = NULL;
        dj_model_t *m = NULL;
        if (dj_engine_new(&ec, &e) || dj_model_load(e, dir, &m)) {
            fprintf(stderr, "%s: embedded engine: %s\n", who, dj_last_error());
            _exit(1);
        }
        if (fn(e, m, arg, res) != 0) _exit(1);
        const ssize_t bytes = (ssize_t)(n_out * sizeof *res);
        _exit(write(pp[1], res, (size_t)bytes) == bytes ? 0 : 1);
    }
    close(pp[1]);
    const ssize_t bytes = (ssize_t)(n_out * sizeof *out);
    const bool have = child > 0 && read(pp[0], out, (size_t)bytes) == bytes;
    close(pp[0]);
    if (child > 0) waitpid(child, NULL, 0);
    return have ? 0 : -1;
}
