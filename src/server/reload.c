/* reload.c: djinnd's SIGHUP - the I/O loop, which owns what changes, re-reads
 * --config and the token file and applies the tokens, its own limits and the
 * log level; sessions and connections stay. Also the start's checks of them. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/alloc.h"
#include "server/config_file.h"
#include "server/http_impl.h"
#include "server/sd_notify.h"
#include "server/server_impl.h"

/* A token table replaced by a reload. The HTTP door and /metrics were handed
 * the start's table and may read it from their threads, so a replaced table
 * is kept until exit (each costs its tokens' bytes, ~400 B a token). */
typedef struct retired {
    dj__token *t;
    struct live_tokens *live; /* its publication (below), or NULL */
    struct retired *next;
} retired;

/* The table a reload made, for the threads that do not own the loop's (the
 * HTTP door's and /metrics' MHD threads): published whole through an atomic
 * pointer, never changed after, freed at exit (dj__reload_fini). NULL until
 * the first reload: they look in the start's table, which they were given. */
typedef struct live_tokens {
    const dj__token *t;
    size_t n;
} live_tokens;
static _Atomic(live_tokens *) g_live;

const dj__token *dj__token_find_live(const dj__token *t, size_t n_tokens, const char *tok, size_t n) {
    const live_tokens *l = atomic_load_explicit(&g_live, memory_order_acquire);
    return l ? dj__token_find(l->t, l->n, tok, n) : dj__token_find(t, n_tokens, tok, n);
}

typedef struct dj__reload {
    uv_signal_t sighup;
    int argc;
    char **argv;            /* main's: valid for the process's life */
    uint64_t next_tenant;   /* the tenant id of the next token no table had */
    uint64_t n_reloads;
    retired *old;
} dj__reload;

/* The new table's tenants: a secret the running table holds keeps its id
 * (its quotas, its sessions' reattach), a new one gets a fresh id. */
static void carry_tenants(dj__reload *rl, const dj__token *old, size_t n_old, dj__token *t, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const dj__token *o = dj__token_find(old, n_old, t[i].secret, t[i].len);
        t[i].tenant = o ? o->tenant : rl->next_tenant++;
    }
}

static void on_sighup(uv_signal_t *h, int signum) {
    (void)signum;
    dj__server *s = h->data;
    dj__reload *rl = s->reload;
    dj__sd_notify("RELOADING=1");
    dj__config nc;
    if (dj__parse_args(rl->argc, rl->argv, &nc) != 0) { /* it said why on stderr */
        dj__log_line(DJ_LOG_ERROR, __func__, "djinnd: SIGHUP: the configuration does not parse: the running one stays",
                     NULL);
        dj__sd_notify("READY=1");
        return;
    }
    char tokens_said[160] = "no token file";
    if (s->have_token && !nc.token_file) {
        snprintf(tokens_said, sizeof tokens_said, "the token file is no longer named: its %zu tokens stay",
                 s->n_tokens);
    } else if (s->have_token) {
        dj__token *t = NULL;
        size_t n = 0;
        retired *r = dj_calloc(1, sizeof *r);
        live_tokens *live = dj_calloc(1, sizeof *live);
        dj_status st = r && live ? dj__tokens_load(nc.token_file, &t, &n) : dj_fail(DJ_ENOMEM, "out of memory");
        if (st != DJ_OK) {
            free(r);
            free(live);
            snprintf(tokens_said, sizeof tokens_said, "tokens kept (%.120s)", dj_last_error());
            DJ_LOG(ERROR, "SIGHUP: %s: the running tokens stay", dj_last_error());
        } else {
            carry_tenants(rl, s->tokens, s->n_tokens, t, n);
            r->t = s->tokens;
            r->live = atomic_load_explicit(&g_live, memory_order_relaxed); /* the table's, if it was published */
            r->next = rl->old;
            rl->old = r;
            s->tokens = t; /* the loop's own: HELLO reads it on this thread */
            s->n_tokens = n;
            live->t = t;
            live->n = n;
            atomic_store_explicit(&g_live, live, memory_order_release); /* the door's and /metrics' */
            snprintf(tokens_said, sizeof tokens_said, "%zu tokens from %.100s", n, nc.token_file);
        }
    } else if (nc.token_file) {
        snprintf(tokens_said, sizeof tokens_said, "--token-file needs a restart to turn on");
    }
    /* the limits the loop alone reads (options.c marks them (R)) */
    dj__config *c = &s->cfg;
    c->max_pending = nc.max_pending > c->max_conns / 4 ? (c->max_conns / 4 ? c->max_conns / 4 : 1) : nc.max_pending;
    c->hello_timeout_ms = nc.hello_timeout_ms;
    c->idle_timeout_ms = nc.idle_timeout_ms;
    c->out_soft = nc.out_soft;
    c->out_hard = nc.out_hard;
    c->max_inflight = nc.max_inflight;
    c->max_conns_token = nc.max_conns_token;
    c->prompt_inflight = nc.prompt_inflight;
    c->max_sessions = nc.max_sessions;
    c->max_sessions_token = nc.max_sessions_token;
    c->max_handles = nc.max_handles;
    /* the worker's (it takes them at its next intake) and the HTTP door's */
    char limits_said[200] = "";
    if (dj__worker_limits(s, &nc) != DJ_OK)
        snprintf(limits_said, sizeof limits_said, "; the engine thread's limits kept (%.60s)", dj_last_error());
    if (s->http) {
        const dj__http_cfg want = {.max_conns = nc.http_conns, .unauth = nc.http_unauth, .per_addr = nc.http_per_addr,
                                   .per_token = nc.http_per_token, .max_body = nc.http_max_body,
                                   .header_s = nc.http_header_s, .body_s = nc.http_body_s};
        dj__http_cfg got;
        dj__http_set_limits(s->http, &want, &got);
        if (got.max_conns < want.max_conns || got.unauth < want.unauth)
            snprintf(limits_said + strlen(limits_said), sizeof limits_said - strlen(limits_said),
                     "; http-max-connections %u and http-max-unauth %u (a restart raises them)", got.max_conns,
                     got.unauth);
    }
    if (nc.log_level >= 0) dj_log_set_level((dj_log_level)nc.log_level);
    if (nc.log_format >= 0) dj_log_set_format((dj_log_format)nc.log_format);
    rl->n_reloads++;
    char said[640];
    snprintf(said, sizeof said, "djinnd: SIGHUP: reloaded (%s; log level %s%s)", tokens_said,
             nc.log_level >= 0 ? (const char *[]){"debug", "info", "warn", "error"}[nc.log_level] : "unchanged",
             limits_said);
    dj__log_line(DJ_LOG_WARN, __func__, said, NULL); /* whatever the level: an operator's act answered */
    dj__config_free(&nc);
    dj__sd_notify("READY=1");
}

dj_status dj__reload_init(dj__server *s, int argc, char **argv) {
    if (s->cfg.log_level >= 0) dj_log_set_level((dj_log_level)s->cfg.log_level);
    if (s->cfg.log_format >= 0) dj_log_set_format((dj_log_format)s->cfg.log_format);
    dj_status st = dj__models_check(s->cfg.models, s->cfg.allow_empty);
    if (st != DJ_OK) return st;
    dj__reload *rl = dj_calloc(1, sizeof *rl);
    if (!rl) return dj_fail(DJ_ENOMEM, "out of memory");
    rl->argc = argc;
    rl->argv = argv;
    rl->next_tenant = s->n_tokens + 1;
    s->reload = rl;
    uv_signal_init(&s->loop, &rl->sighup);
    rl->sighup.data = s;
    uv_signal_start(&rl->sighup, on_sighup, SIGHUP);
    return DJ_OK;
}

void dj__reload_fini(dj__server *s) {
    dj__reload *rl = s->reload;
    if (!rl) return;
    /* the door and /metrics have stopped: nobody reads the published table */
    free(atomic_exchange(&g_live, NULL));
    for (retired *r = rl->old, *n; r; r = n) {
        n = r->next;
        free(r->t);
        free(r->live);
        free(r);
    }
    free(rl);
    s->reload = NULL;
}
