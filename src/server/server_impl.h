/* server_impl.h: djinnd's shared state - the I/O thread (libuv) and the
 * engine worker thread, the tables they share under one mutex, and metrics. */
#ifndef DJ_SERVER_IMPL_H
#define DJ_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "djinn/engine.h"
#include "djinn/generate.h"
#include "djinn/protocol.h"
#include "djinn/sampler.h"
#include "djinn/tokenizer.h"
#include "sched/sched.h"
#include "proto/proto_impl.h"
#include "server/event.h"
#include "server/request.h"

/* ---- a u64 -> pointer hash map (chained; ids are random, so no mixing) ---- */
typedef struct dj__ment {
    uint64_t key;
    void *val;
    struct dj__ment *next;
} dj__ment;
typedef struct dj__map {
    dj__ment **b; /* [n_buckets] */
    size_t n_buckets, n;
} dj__map;
dj_status dj__map_init(dj__map *m, size_t n_buckets);
void dj__map_destroy(dj__map *m);
void *dj__map_get(const dj__map *m, uint64_t key);
dj_status dj__map_put(dj__map *m, uint64_t key, void *val);
void *dj__map_del(dj__map *m, uint64_t key); /* returns the value, NULL if absent */

/* ---- tokens and peers (guard.c) ---- */
/* Tokens: at most this long, this many per file (docs/protocol.md). */
#define DJ__TOKEN_MAX 256
#define DJ__TOKENS_MAX 64

typedef struct dj__token {
    char secret[DJ__TOKEN_MAX];
    size_t len;
    uint32_t qos_mask; /* 1 << class for each granted class */
    bool admin;
    bool shared;           /* `shared`: it shares the prefix cache with every other shared token */
    uint64_t cache_salt[2]; /* its tenant's prefix-cache salt: a hash of the secret; {0, 0} when shared */
    uint64_t tenant;        /* its quotas' key, kept by a SIGHUP reload for the same secret (reload.c) */
    char name[64];          /* `name=NAME`, or "line<N>": what logs show, never the secret */
} dj__token;
/* What a request that needs the admin role (the daemon-wide view, another
 * connection's pin) is told when nobody has it: no --token-file, no --local-admin. */
#define DJ__ADMIN_NEEDED                                                                                        \
    "the daemon-wide view needs the admin role: start djinnd with --token-file and use a token marked "       \
    "'admin' (or with --local-admin, which makes every local client admin when there is no token file)"

/* guard.c: the token file, refused with a clear message when empty, holding
 * a NUL or a non-printable byte, or a token over DJ__TOKEN_MAX bytes. */
dj_status dj__tokens_load(const char *path, dj__token **out /* OUT, malloc'd */, size_t *n /* OUT */);

/* out = the prefix-cache salt of (base, bytes[0..n)): {0, 0} for no base and
 * no bytes; base NULL and a token's secret: the token's salt; a tenant's
 * salt and a request's cache_salt: that request's (docs/prefix-cache.md). */
#define DJ__SALT_BYTES_MAX 256 /* a cache_salt's most bytes (a token's secret: DJ__TOKEN_MAX) */
void dj__cache_salt_of(const uint64_t base[2], const char *bytes, size_t n, uint64_t out[2] /* OUT */);

/* Failed HELLOs per peer (key: IPv4 address, IPv6 /64, or 1 for unix
 * sockets): after a failure the peer's next HELLO is checked no sooner than
 * 100 ms (doubling to 2 s with each failure) after its last checked one;
 * HELLOs that come sooner wait (at most DJ__PEER_WAITING of them, more get
 * DJ_EBUSY unchecked and uncharged). Only checked HELLOs count; a success
 * forgets the peer; a record is forgotten DJ__PEER_FORGET_MS after its last
 * failure. Past DJ__PEERS_MAX records new peers share one overflow record
 * (they are slowed together, never not at all). The HTTP door's
 * connections (portals, submit.h: no socket, no HELLO) are not peers: the
 * door checks its clients' tokens and slows them per address itself. Loop thread only. */
typedef struct dj__peer {
    uint32_t fails;
    uint32_t waiting;      /* HELLOs held back now (dj__peer_wait) */
    uint64_t checked_ms;   /* monotonic: when its last failed HELLO was checked */
    uint64_t next_ms;      /* dj__peer_hello_at's reservations: the earliest its next request is checked */
    uint64_t last_fail_ms;
} dj__peer;
#define DJ__PEERS_MAX 4096
#define DJ__PEER_WAITING 8
#define DJ__PEER_FORGET_MS (10u * 60u * 1000u)
#define DJ__PEER_MAX_WAIT_MS 10000
/* When a HELLO arriving now may be checked (reserves nothing: the daemon's HELLOs). */
uint64_t dj__peer_check_at(dj__map *peers, uint64_t key, uint64_t now);
/* The same for callers that wait in place (the HTTP door): reserves that
 * slot, unless it is over DJ__PEER_MAX_WAIT_MS away (then the caller refuses
 * it, and nothing is charged). */
uint64_t dj__peer_hello_at(dj__map *peers, uint64_t key, uint64_t now);
/* A HELLO starts or stops waiting its turn; false: DJ__PEER_WAITING already wait. */
bool dj__peer_wait(dj__map *peers, uint64_t key);
void dj__peer_unwait(dj__map *peers, uint64_t key);
/* A HELLO was checked: ok or a wrong token. */
void dj__peer_hello_result(dj__map *peers, uint64_t key, uint64_t now, bool ok);
void dj__peers_sweep(dj__map *peers, uint64_t now);

/* ---- metrics ---- */
#define DJ__HIST_BUCKETS 14
#define DJ__N_STATUS 13 /* -dj_status: 0..12 */
typedef struct dj__hist {
    uint64_t count[DJ__HIST_BUCKETS + 1]; /* last = +Inf */
    double sum;
} dj__hist;
typedef struct dj__metrics {
    pthread_mutex_t mu;
    uint64_t requests[DJ_MSG_REQUEST_LAST + 1][DJ__N_STATUS]; /* [type][-status] */
    dj__hist queue_s, ttft_s, token_s;
    dj__hist resume_s, swap_out_s, swap_in_s; /* RESUME -> next first token; swap transfers */
    uint64_t swaps_out, swaps_in, swap_bytes_out, swap_bytes_in, preemptions, drops;
    uint64_t pool_bytes, pool_used;
    uint32_t sess_states[DJ_SESS_DROPPED + 1];
    dj_vmu_stats vmu;              /* snapshot after the worker's last job */
    uint64_t sessions, connections, lease_expiries, tokens;
    uint64_t waiting, gen_steps;   /* requests held, not stepping; generation steps (agent_check.c) */
    uint64_t pages_reclaimable;   /* KV pages only the prefix cache holds (with --agent-check) */
    double gen_step_s;             /* those steps' wall time in all */
    void *mhd;                     /* struct MHD_Daemon * */
    const dj__token *auth;         /* [n_auth]: /metrics wants one as a bearer token when n_auth > 0 */
    size_t n_auth;
    bool local_admin;              /* --local-admin: without a token file, /metrics answers anyone it serves */
} dj__metrics;
extern const double dj__hist_bounds[DJ__HIST_BUCKETS];
void dj__metrics_count(dj__metrics *m, uint32_t type, dj_status st);
void dj__metrics_observe(dj__metrics *m, dj__hist *h, double seconds);
void dj__metrics_observe_locked(dj__metrics *m, dj__hist *h, double seconds); /* m->mu held */
dj_status dj__metrics_start(dj__metrics *m, const char *addr, uint32_t max_conns);
/* The token whose secret is tok[0..n), compared in constant time; NULL if none. */
const dj__token *dj__token_find(const dj__token *t, size_t n_tokens, const char *tok, size_t n);
/* metrics.c: the token of an Authorization header's value "Bearer TOKEN"
 * (the scheme in any case, RFC 9110 11.1), or NULL. */
const char *dj__bearer_of(const char *authorization);
void dj__metrics_stop(dj__metrics *m);

/* ---- sessions (one record per owner) and result handles (the I/O side's) ---- */
typedef struct dj__model_ent dj__model_ent;
typedef struct dj__job dj__job;

/* Answers lost for want of memory the loop is told of at once (dj__server.lost). */
#define DJ__LOST_MAX 256
#define DJ__GONE_HANDLES 1024 /* handles remembered as gone with their session (handle_gone.c) */
#define DJ__GONE_LEASES 256   /* sessions remembered as gone with their lease (handle_gone.c) */

/* Most running generations one batched decode step carries. */
#define DJ__MAX_BATCH 64

/* A session has two records, one per owner, kept in step by messages:
 * the I/O side's dj__lease (who holds it, its lease, what a request on it
 * may send) and the worker's dj__sess (the engine's session and what runs on
 * it). The I/O side tells the worker through its mailbox (dj__job with a
 * DJ__CTL_ type: PAUSE, DROP, ORPHAN, ATTACH); the worker tells the I/O side
 * through events (event.h: the SESSION_OPEN reply makes the lease, every
 * event of a request on it carries its position, DJ__EV_STATE a swap's end). */

/* Control messages of the I/O side to the worker (dj__job.type; never on the wire). */
#define DJ__CTL_PAUSE 0x100   /* ctl.paused, ctl.expect_ms, ctl.resume_at: PAUSE or RESUME */
#define DJ__CTL_DROP 0x101    /* the session goes: ctl.why (its lease ended, or its connection closed) */
#define DJ__CTL_ORPHAN 0x102  /* its connection closed: its requests are cancelled, it waits for an attach */
#define DJ__CTL_ATTACH 0x103  /* ctl.conn holds it now */

/* The I/O side's record (dj__server.leases; loop only). */
typedef struct dj__lease {
    uint64_t id, conn;          /* conn 0: orphaned */
    uint64_t tenant;            /* its opener's token (dj__tenant): quotas are per token */
    dj_qos qos;
    uint64_t lease_deadline_ms; /* on the daemon's clock (dj__clock_ms); renewed by heartbeats and
                                 * by requests naming it, as they arrive and as they end */
    uint32_t inflight;          /* requests naming it posted to the worker, not answered: its lease holds */
    bool paused, reattach, orphan;
    uint64_t secret;            /* given at open: a new connection reattaches with it (SESSION_ATTACH) */
    char model[128];
    uint32_t max_ctx;           /* positions the session allows */
    uint32_t hidden;            /* its model's hidden size (bounds a STEP's point tensors) */
    uint32_t pos;               /* its position, as the worker's last event said */
    bool swapped;               /* its KV in the host pool, as the worker's last event said */
    dj__job *drop_msg;          /* the DJ__CTL_DROP that ends it, made by the worker at open (posting
                                 * it allocates nothing); owned */
    dj__job *orphan_msg;        /* the DJ__CTL_ORPHAN for its connection's close (reattach only); owned */
} dj__lease;

/* The worker's record (dj__server.sessions; worker only). */
typedef struct dj__sess {
    uint64_t id, conn;          /* conn: the connection whose requests run on it (0: orphaned) */
    uint64_t tenant;
    uint64_t secret;            /* its reattach secret (0: none), kept across a restart */
    dj_qos qos;
    char model[128];
    bool paused;                /* the I/O side's last PAUSE/RESUME */
    uint32_t pos;               /* its position as its client sees it (snapshot) */
    uint64_t kv_bytes, pooled_bytes, swaps;
    dj_session_t *es;
    dj__model_ent *ment;
    int32_t pending;            /* sampled but not yet fed token, -1 if none */
    dj__job *busy;              /* the generation running on it, if any */
    struct dj__brk *brk;        /* its step paused at a breakpoint (step_break.c), if any: busy too */
    uint8_t xfer;               /* 1: swap-out in flight, 2: swap-in in flight */
    uint64_t xfer_bytes;
    double xfer_t0;             /* when it started (swap latency) */
    double resume_at;           /* when a RESUME came (the worker measures to the next first token) */
    bool dropped;               /* recompute policy: KV freed, hist re-fed on the next request */
    int32_t *hist;              /* recompute policy: every token fed, in order */
    uint32_t n_hist, cap_hist;
} dj__sess;

typedef struct dj__handle {
    uint64_t id, conn, sess;
    uint32_t ndim;
    uint64_t shape[8]; /* [ndim]: a captured graph's outputs have rank <= 8 (DJ_CGRAPH_MAX_RANK) */
    char dtype[8];
    uint8_t *bytes; /* [nbytes], immutable once published */
    uint64_t nbytes;
    int refs;       /* table + in-flight writes */
} dj__handle;

/* ---- work for the engine thread ---- */
typedef struct dj__gen {
    dj_gen_t *g;       /* the generation loop's state (generate.h); owned; NULL until it starts */
    int32_t *ids;      /* the prompt, tokenized by the tokenizer thread (owned) */
    size_t n_ids;
    /* a text prompt on its way through the tokenizer thread (worker.c, "the
     * tokenizer thread"): it holds tok_ment (tok_jobs) until the worker sees it back */
    dj__model_ent *tok_ment;   /* worker only */
    const dj_tokenizer_t *tok; /* tok_ment's, read by the tokenizer thread */
    const char *prompt;        /* [plen], inside the job's meta */
    size_t plen;
    bool add_special;          /* the session's first tokens: BOS and the like */
    bool tokenized;            /* the tokenizer thread is done with it: tok_st, tok_err */
    dj_status tok_st;
    char tok_err[256];
    uint32_t max_tokens;
    struct dj__trace_req *tr; /* GENERATE `points`: the edits at every step (step_trace.c), or NULL; owned */
    uint32_t pos0;     /* the session's position after its prompt (and re-fed history) */
    uint32_t n_prompt; /* the request's prompt tokens (without a pending one) */
    bool hist_added;   /* its generated tokens are in the session's history already (--persist always) */
    double t_start, t_first, t_last, prefill_s;
} dj__gen;

struct dj__job {
    dj__job *next;
    uint16_t type;
    uint64_t req, conn, sess; /* sess 0 for connection-level requests */
    uint64_t tenant;          /* the caller's token (dj__tenant) */
    dj_qos qos;
    uint32_t qos_mask;        /* 1 << class for each class the caller's token grants */
    bool admin;               /* the caller's token has the admin role */
    uint64_t cache_salt[2];   /* the caller's token's prefix-cache salt (dj__token) */
    bool counted;             /* its lease's inflight was raised for it (the I/O side): its events say so */
    uint32_t handle_quota;    /* STEP: handles the I/O side reserved for it (--max-handles-per-conn) */
    struct {                  /* DJ__CTL_ messages */
        bool paused;
        uint64_t expect_ms;
        double resume_at;
        dj_status why;
        const char *why_msg;  /* a static string */
    } ctl;
    bool model_error;         /* its error came from a model's files (not the request): the connection stays */
    dj__request r;            /* the request, decoded by the I/O thread (request.h); owned */
    double t_enqueue;
    char peer[64], token_name[64]; /* who sent it, for its access line (access.c) */
    dj__gen *gen;             /* a GENERATE's prompt and, once started, its loop */
    struct dj__graph_req *graph; /* a GRAPH_RUN as typed values (graph_serve.h), owned */
    bool lost;                /* a frame of its answer could not be built: the loop answered it ENOMEM
                               * (dj__server.lost), its later frames are dropped */
    uint64_t prompt_credit;   /* prompt bytes counted in its connection's prompt_bytes (server.c),
                               * given back (dj__out.credit) once it is tokenized or refused */
    dj__event *credit_ev;     /* the DJ__EV_CREDIT event that gives prompt_credit back, made with the
                               * job so that giving it back allocates nothing; owned until posted */
    dj__job *hprev, *hnext;   /* worker: jobs the scheduler holds */
};

typedef struct dj__jobq {
    dj__job *head, *tail;
    size_t n;
} dj__jobq;

/* A frame for the I/O thread to send (encode.c makes them of the worker's events). */
typedef struct dj__out {
    struct dj__out *next;
    uint64_t conn;
    dj_frame_header h;
    char *meta; /* malloc'd msgpack bytes (h.meta_len) */
    bool close_after;
} dj__out;

struct dj__model_ent {
    char name[128];
    dj_model_t *m;      /* valid while users > 0 or pinned */
    uint32_t users;     /* sessions */
    bool pinned;        /* MODEL_LOAD holds one engine reference */
    uint64_t pin_conn;  /* the connection that pinned it: only it (or an admin) unloads */
    dj_tokenizer_t *tok;
    bool tok_tried;
    uint32_t tok_jobs;  /* prompts the tokenizer thread holds that use tok: the entry stays */
    int32_t eos[16];    /* the model's EOS ids (dj_gen_eos_ids), read with the tokenizer */
    size_t n_eos;
    dj__model_ent *next;
};

typedef struct dj__config {
    const char *listen;   /* ADDR:PORT or unix:/path */
    const char *models;
    const char *device;     /* engine device: "cpu" (default), "cuda:N" in CUDA builds */   /* model store */
    const char *metrics;  /* ADDR:PORT or NULL */
    const char *agent_check; /* ADDR:PORT or NULL: HAProxy's agent-check (agent_check.c) */
    const char *token_file;
    size_t vmu_bytes;
    int threads;
    uint32_t lease_ms;
    uint32_t max_running; /* concurrency of the scheduler */
    uint32_t prefill_chunk; /* prompt tokens a GENERATE feeds per scheduler turn (0: the whole prompt) */
    bool deterministic;     /* --deterministic on: the engine option (a row's logits independent of its batch) */
    int host_layers;        /* --host-layers: the engine option (0 auto, -1 none, K) for streamed models */
    bool no_prefix_cache;   /* --prefix-cache off: the engine's kill switch */
    const char *kv_dtype;   /* --kv-dtype: the engine option (NULL/"auto" or "fp8"; points into argv) */
    int mixed_steps;        /* prompt chunks share decode steps: 1 on, 0 off, 2 short prompts only, -1 auto (on for the CPU engine, short on a GPU) */
    const char *port_file; /* write the bound TCP port here (tests) */
    /* limits against hostile clients (docs/protocol.md, "Limits") */
    uint32_t max_conns;        /* connections at once; clamped to the fd limit less DJ__FD_RESERVE */
    uint32_t max_pending;      /* of those, connections that have not completed HELLO (fewer than max_conns) */
    uint32_t hello_timeout_ms; /* a connection must complete HELLO within this */
    uint32_t idle_timeout_ms;  /* closed after this long without a byte either way (0: never) */
    uint64_t out_soft, out_hard; /* unsent reply bytes: stop reading past soft, disconnect past hard */
    uint32_t max_inflight;     /* requests of one connection queued or running before it stops being read */
    uint32_t max_sessions;     /* sessions per connection */
    uint32_t max_sessions_token; /* sessions of all the connections of one token */
    uint32_t max_conns_token;  /* connections of one token at once (HELLO refused past it) */
    uint32_t max_handles;      /* result handles per connection */
    uint32_t metrics_conns;    /* /metrics connections at once */
    uint64_t max_prompt_bytes; /* a GENERATE's text prompt: more bytes are refused before tokenizing */
    uint64_t prompt_inflight;  /* prompt bytes of one connection not yet tokenized before it stops being read */
    /* memory and the scheduler (src/sched/) */
    size_t swap_bytes;         /* host swap pool; DJ__SIZE_AUTO: the engine's default */
    size_t data_bytes;         /* data segment (KV) bytes; 0: the VMU's default share */
    size_t quota_bytes;        /* KV bytes per token (per connection without --token-file); 0: none */
    size_t swap_quota_bytes;   /* swap pool bytes per token; DJ__SIZE_AUTO: quota_bytes; 0: none */
    bool local_admin;          /* --local-admin: without --token-file every (loopback) peer has the admin role */
    size_t weights_bytes, weight_quota_bytes; /* --weights-gb, --weight-quota-gb (graph_serve.h); 0: defaults */
    size_t graph_bytes, graph_quota_bytes;    /* --graph-gb, --graph-quota-gb: captured runs' planned bytes (sched.h); 0: none */
    bool graph_on_engine;                     /* --graph-device engine: GRAPH_RUN on the engine's backend (CUDA executor) */
    uint32_t idle_ms, max_wait_ms;
    dj_swap_policy swap_policy;
    const char *state_dir;     /* --state-dir: the KV disk tier's directory, or NULL: none */
    size_t disk_bytes;         /* --disk-swap-gb: its size */
    uint32_t drain_s;          /* --drain-s: with state_dir, how long SIGTERM waits for the requests taken */
    int persist;               /* --persist: DJ__PERSIST_ (with state_dir) */
    /* the OpenAI-compatible HTTP front end (http.c; docs/protocol.md, "HTTP") */
    const char *http;          /* --http ADDR:PORT or NULL */
    uint32_t http_conns;       /* requests at once; more get 503 */
    uint64_t http_max_body;    /* request body bytes; more get 413 */
    uint32_t http_timeout_s;   /* an idle HTTP connection is closed after this */
    uint32_t http_reuse;       /* idle sessions kept for prompt-prefix reuse; 0 = off */
    uint32_t http_header_s, http_body_s; /* absolute deadlines: a request's headers, its body */
    uint32_t http_per_addr;    /* connections at once from one address */
    uint32_t http_unauth;      /* connections waiting for their headers (the oldest goes beyond) */
    uint32_t http_per_token;   /* requests at once per token (0: half of http_conns) */
    const char *http_hosts;    /* --http-allowed-hosts: Host names besides localhost and IP literals */
    /* the config file, the store check and the log (config_file.c, reload.c) */
    const char *config;        /* --config FILE or NULL */
    struct dj__conf *conf;     /* its entries, which string options point into (dj__config_free) */
    bool allow_empty;          /* --allow-empty: a missing model is a warning, not an error at start */
    int log_level;             /* --log-level: dj_log_level, or -1 ($DJINN_LOG, default warn) */
    int log_format;            /* --log-format: dj_log_format, or -1 (text) */
} dj__config;
void dj__config_free(dj__config *cfg); /* what parsing --config allocated */
#define DJ__SIZE_AUTO SIZE_MAX
/* --persist: when sessions go to --state-dir (docs/swap.md, "Restarts"). */
#define DJ__PERSIST_ON_STOP 0 /* at the stop (SIGTERM, SIGINT) */
#define DJ__PERSIST_ALWAYS 1  /* also after each GENERATE and STEP, before its answer, and at open */
#define DJ__PERSIST_OFF 2     /* never */

/* fds kept free for the listener, the loop, model files and /metrics' own
 * listener besides the connections (--max-connections is clamped so). */
#define DJ__FD_RESERVE 32
/* Sessions whose connection closed, kept for a reattach until their lease
 * ends; past this many the next orphan is released at once. */
#define DJ__MAX_ORPHANS 1024

/* Connections over the cap still get a typed ERROR while this many more are
 * open; past that they are closed at once. */
#define DJ__REFUSE_SLACK 16


typedef struct dj__server {
    dj__config cfg;
    bool mixed; /* worker: prompt chunks join decode steps (cfg.mixed_steps resolved) */
    uint32_t ride_rows; /* worker, without mixed: a prompt with at most this many tokens
                         * left still rides in the decode steps (auto on a GPU: short
                         * prompts do not cost the running generations a step each) */
    dj__token *tokens; /* [n_tokens] from --token-file */
    size_t n_tokens;
    bool have_token;
    uv_timer_t tick;   /* HELLO and idle timeouts, deferred HELLOs */
    dj__map peers;     /* loop only: peer key -> failed-HELLO record */
    uint32_t n_conns;  /* loop only: open connections */
    uint32_t n_pending; /* loop only: of those, accepted ones without a completed HELLO */
    uv_loop_t loop;
    union {
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } listener;
    /* A connection the loop has no memory for is accepted into this handle and
     * closed at once: libuv takes no new connection until the pending one is
     * accepted, so leaving it would stop the listener for good. */
    union {
        uv_tcp_t tcp;
        uv_pipe_t pipe;
        uv_handle_t handle;
    } refuse;
    bool refuse_busy;    /* refuse is open or closing */
    bool accept_stalled; /* a connection waits for refuse's close to be accepted */
    bool is_unix;
    struct dj__portals *portals; /* in-process connections' ops to the loop (submit.c: the HTTP door's) */
    uv_signal_t sigint, sigterm;
    uv_async_t wake;     /* worker -> loop: outbox has frames */
    uv_check_t clock_check; /* after each poll's callbacks: advances clock_ms */
    uint64_t clock_seen_ms;  /* loop only: the monotonic time clock_ms last caught up with */
    dj__map conns;       /* loop only: id -> dj__conn */
    dj__map leases;      /* loop only: session id -> dj__lease */
    dj__map handles;     /* loop only: id -> dj__handle (the worker's results arrive in its events) */
    uint64_t next_conn;
    bool stopping;
    bool draining;       /* loop only: SIGTERM with --state-dir: new work refused, the taken ends (drain_timer) */
    uv_timer_t drain_timer;
    uint64_t drain_until_ms;
    _Atomic uint32_t n_held; /* worker -> loop: jobs the worker holds (dj__server.held) */

    /* The daemon's clock for leases and the HELLO and idle timeouts (ms): the
     * monotonic time, except that one turn of the I/O loop adds at most
     * DJ__CLOCK_STEP_MS. A daemon that did not run (stopped, a paused VM, a
     * machine stalled on I/O) does not count that time against its clients,
     * whose heartbeats may be waiting unread in their sockets: it judges
     * silence only for as long as it was listening. Written by the loop once
     * its poll's callbacks ran, read by both threads. */
    _Atomic uint64_t clock_ms;

    dj__map sessions;    /* worker only: session id -> dj__sess */

    /* The worker's mailbox (I/O side -> worker): newq, under mu with cv;
     * also the tokenizer thread's queue (tokq) and live_conns. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dj__map live_conns;  /* id -> (void *)1 */
    dj__jobq newq[DJ_QOS_COUNT]; /* arrived, not yet handed to the scheduler */
    /* The I/O side's mailbox (worker -> I/O side), under out_mu, woken by
     * uv_async_send(wake): the worker's typed answers (event.h), and lost. */
    pthread_mutex_t out_mu;
    dj__event *ev_head, *ev_tail;
    /* Answers the worker could not build for want of memory (out_mu): the loop
     * answers each with an ENOMEM ERROR of its own, or closes its connection.
     * Past DJ__LOST_MAX, lost_overflow: every connection with a request in
     * flight is closed (no client waits for an answer that will never come). */
    struct {
        uint64_t conn, req, sess;
        uint16_t type;
        bool counted;
        uint32_t handle_quota;
    } lost[DJ__LOST_MAX];
    /* I/O thread: the last DJ__GONE_HANDLES result handles that went with
     * their session, so a FETCH of one says so (handle_gone.c) */
    struct dj__gone_handle {
        uint64_t id, conn, sess;
    } gone[DJ__GONE_HANDLES];
    size_t gone_next;
    struct dj__gone_handle gone_leases[DJ__GONE_LEASES]; /* sessions whose lease ended (id = the session) */
    size_t gone_leases_next;
    uint32_t n_lost;
    bool lost_overflow;
    bool stop_worker;    /* mu */

    dj__jobq tokq;       /* GENERATEs whose text prompt waits for the tokenizer thread */
    pthread_cond_t tok_cv;
    bool stop_tok;
    uint64_t tok_last_tenant; /* tokenizer thread: whose prompt it took last (tokq_take) */

    /* worker only */
    pthread_t worker, tokenizer;
    bool tok_started;
    bool worker_started;
    dj_engine_t *engine;
    dj_sched_t *sched;       /* the policy (src/sched/): decides what the worker does next */
    dj__job *held;           /* jobs the scheduler holds (waiting, admitted or running) */
    uint32_t n_xfer;         /* sessions with a swap in flight */
    uint64_t batched_steps, batched_rows; /* worker: decode steps that carried >1 session */
    uint64_t mixed_steps;                 /* worker: of those, steps that also carried a prompt chunk */
    uint64_t gen_steps;                   /* worker: generation steps (any batch size, prompt chunks too) */
    double gen_step_s, gen_engine_s;      /* worker: their wall time in all, and the part inside dj_gen_step */
    dj__model_ent *models;

    dj__metrics metrics;
    struct dj__agent *agent; /* --agent-check's listener, or NULL */
    struct dj__http *http; /* --http: the front end; its requests enter through portals (submit.h) */
    struct dj__capture *capture; /* captured modules: the weight store, graph runs (graph_serve.h) */
    struct dj__reload *reload; /* reload.c: SIGHUP's state (loop only) */
} dj__server;

double dj__now(void);          /* monotonic seconds */
uint64_t dj__now_ms(void);
/* The daemon's clock (dj__server.clock_ms), any thread. */
uint64_t dj__clock_ms(dj__server *s);
/* The most one turn of the I/O loop adds to the daemon's clock: its timer
 * wakes it every 100 ms, so a longer turn means the daemon was not running. */
#define DJ__CLOCK_STEP_MS 250

/* options.c: djinnd's command line; 0 to run, 3 after --help, else an exit code. */
int dj__parse_args(int argc, char **argv, dj__config *cfg);
/* reload.c: SIGHUP on the loop re-reads --config and the token file (the
 * tokens, the loop's own limits, the log level); started after the loop. */
dj_status dj__reload_init(struct dj__server *s, int argc, char **argv);
void dj__reload_fini(struct dj__server *s); /* after the loop closed */
/* Any thread: dj__token_find in the table the last SIGHUP published, or in
 * t[n_tokens] (the start's, which the caller was given) before any. */
const dj__token *dj__token_find_live(const dj__token *t, size_t n_tokens, const char *tok, size_t n);
/* The tenant a connection's requests count for: its token (index + 1 in
 * the token file) or, without --token-file, the connection itself (bit 63
 * set). Quotas of sessions, connections and KV pages are per tenant. */
#define DJ__TENANT_CONN(conn) ((conn) | (uint64_t)1 << 63)
/* server.c: the handles a connection holds (loop only). */
size_t dj__conn_handles(dj__server *s, uint64_t conn);

/* worker.c */
dj_status dj__worker_start(dj__server *s);
void dj__worker_stop(dj__server *s);
void dj__enqueue(dj__server *s, dj__job *j); /* into the worker's mailbox; takes ownership; locks mu */
void dj__job_free(dj__job *j);
/* Build an ERROR frame (st, message) for the outbox (call with mu held or not: it only allocates). */
dj__out *dj__out_error(uint64_t conn, uint64_t req, dj_status st, const char *msg, bool close_after);
/* msg made fit for a client: no heap addresses, no server paths, valid UTF-8
 * without control bytes (set once the models dir is known). */
void dj__scrub_message(const char *msg, char *out, size_t cap);
void dj__scrub_set_models(const char *dir);
dj__out *dj__out_meta(uint64_t conn, uint16_t type, uint64_t req, dj__mw *w); /* takes w's bytes */
/* encode.c: the frame of a worker's event (NULL: out of memory, or a
 * DJ__EV_CREDIT, which has none). I/O thread. */
dj__out *dj__event_encode(const dj__event *e);
void dj__handle_unref(dj__server *s, dj__handle *h); /* loop only */

/* model_info.c: MODEL_INFO's reply into w for the request's `model` (a folder
 * of models_dir): config texts, EOS ids, tokenizer presence. Reads only small
 * JSON files (no weights), so the I/O thread answers it. */
dj_status dj__model_info(const char *models_dir, const dj__meta *m, dj__mw *w);

/* ---- step_trace.c: a STEP's `points` (worker thread) ---- */
typedef struct dj__trace_req dj__trace_req;
struct dj__meta;
struct dj__mw;
/* A STEP's decoded `points` for a step of n ids of a model with config c,
 * with its payload holding their tensors (f32 LE, in order); validates every
 * name and shape against the model and the payload's size, and allocates the
 * saves' buffers. */
dj_status dj__trace_parse(const dj__req_step *rq, uint32_t n, const dj_model_config *c, dj__trace_req **out /* OUT */);
uint32_t dj__trace_saves(const dj__trace_req *t); /* handles the trace will publish */
/* dj_session_step_trace with the parsed points. */
dj_status dj__trace_run(dj_engine_t *e, dj_session_t *es, const int32_t *ids, uint32_t n, dj__trace_req *t,
                        float *logits /* OUT, [vocab] or NULL */);
/* The saved activations move into out->saved (the I/O side makes them handles). */
dj_status dj__trace_publish(dj__trace_req *t, dj__rep_step *out);
void dj__trace_free(dj__trace_req *t); /* NULL does nothing */
/* Breakpoints: the trace's BREAK points; dj_session_step_break with the
 * parsed points; the name of iv[k]; the paused step's reply (the BREAK
 * iv[k]'s value as its one `saved`, copied); a resume's `points` (add or
 * replace of the paused point iv[k], checked whole first) applied to the
 * value the step resumes with. */
uint32_t dj__trace_breaks(const dj__trace_req *t);
/* A GENERATE's `points` (edits at every step, one row each) as a trace
 * whose interventions (dj__trace_ivs, valid while t lives) go to dj_gen_new. */
dj_status dj__gen_trace_parse(const dj__req_generate *rq, const dj_model_config *c, dj__trace_req **out /* OUT */);
const dj_intervention *dj__trace_ivs(const dj__trace_req *t, uint32_t *n /* OUT */);
/* A STEP's text prompt as ids (*ids malloc'd, [*n]): tok NULL (the model
 * has no tokenizer.json) is DJ_EUNSUPPORTED; the worker waits for it, as
 * the text is at most --max-prompt-bytes. */
dj_status dj__step_tokenize(const dj_tokenizer_t *tok, const char *model, const char *text, size_t len,
                            bool add_special, int32_t **ids /* OUT */, size_t *n /* OUT */);
dj_status dj__trace_run_break(dj_engine_t *e, dj_session_t *es, const int32_t *ids, uint32_t n, dj__trace_req *t,
                              float *logits, dj_step_brk_t **out /* OUT */);
const char *dj__trace_point_name(const dj__trace_req *t, uint32_t k);
dj_status dj__trace_publish_break(dj__trace_req *t, uint32_t k, dj__rep_step *out);
dj_status dj__trace_edit(dj__trace_req *t, uint32_t k, const dj__req_step *rq, const dj_model_config *c);

/* ---- handle_gone.c: handles that went with their session (I/O thread) ---- */
/* Remembers handle h as gone with session sess. */
void dj__gone_note(dj__server *s, uint64_t handle, uint64_t conn, uint64_t sess);
/* The DJ_ENOTFOUND for a FETCH/RELEASE of handle on conn: that it went with
 * its session when remembered so, else that there is none. */
dj_status dj__gone_why(const dj__server *s, uint64_t conn, uint64_t handle);
/* Remembers session sess of conn as gone with its lease; dj__no_session is
 * the DJ_ENOTFOUND for a request naming a session conn does not hold: that
 * its lease ended when remembered so, else that there is none. */
void dj__gone_lease(dj__server *s, uint64_t conn, uint64_t sess);
dj_status dj__no_session(const dj__server *s, uint64_t conn, uint64_t sess);

/* ---- step_break.c: a session's step paused at a breakpoint (worker thread) ---- */
typedef struct dj__brk dj__brk;
/* The traced STEP tr (with BREAKs) on ss after its pending tokens: paused
 * (*paused; tr and *lg are the paused step's now, NULL here; out is the
 * pause's reply) or run to its end (out untouched: the caller publishes). */
dj_status dj__brk_begin(dj_engine_t *e, dj__sess *ss, dj__trace_req **tr, const int32_t *ids, uint32_t n,
                        float **lg, uint32_t vocab, dj__rep_step *out, bool *paused /* OUT */);
/* A STEP on ss while its step is paused (or a resume/cancel without one):
 * resume (to the next breakpoint or the end), cancel, or refused (busy).
 * *done_ids ([*n_done], malloc'd): the ids of a step that ended, for the
 * session's history; out the reply. */
dj_status dj__brk_continue(dj_engine_t *e, dj__sess *ss, const dj__req_step *rq, dj__rep_step *out,
                           int32_t **done_ids /* OUT */, uint32_t *n_done /* OUT */);
/* Drops ss's paused step (the session closes, its client went, its KV is
 * dropped); nothing when none. */
void dj__brk_drop(dj_engine_t *e, dj__sess *ss);
/* Paused steps of the worker's sessions and the bytes they hold. */
void dj__brk_totals(const dj__server *s, uint64_t *n /* OUT */, uint64_t *bytes /* OUT */);
uint64_t dj__brk_bytes(const dj__sess *ss); /* 0: none paused */

#endif
