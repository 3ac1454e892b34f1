/* options.c: djinnd's command line - every option with its default, the
 * limits against hostile clients among them (docs/protocol.md, "Limits"). */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/alloc.h"
#include "djinn/version.h"
#include "server/config_file.h"
#include "server/server_impl.h"

static int usage(FILE *f) {
    fputs("usage: djinnd --version | --help\n"
          "       djinnd [--config FILE] [--allow-empty] [--log-level debug|info|warn|error] [--log-format text|json]\n"
          "              [--listen ADDR:PORT | --listen unix:/path] [--models DIR] [--vmu-gb G] [--device D]\n"
          "              [--token-file FILE] [--metrics ADDR:PORT] [--agent-check ADDR:PORT] [--threads N] [--lease-ms MS]\n"
          "              [--max-running N] [--prefill-chunk N] [--mixed-steps on|off|short|auto]\n"
          "              [--deterministic on|off] [--host-layers auto|none|K] [--prefix-cache on|off]\n"
          "              [--kv-dtype auto|fp8] [--port-file FILE] [--graph-device cpu|engine]\n"
          "              [--max-connections N] [--max-pending-connections N] [--hello-timeout-ms MS]\n"
          "              [--idle-timeout-ms MS]\n"
          "              [--max-reply-buffer SOFT,HARD] [--max-inflight N] [--max-sessions-per-conn N]\n"
          "              [--max-handles-per-conn N] [--metrics-max-connections N]\n"
          "              [--max-prompt-bytes BYTES] [--max-prompt-inflight BYTES]\n"
          "              [--max-sessions-per-token N] [--max-connections-per-token N]\n"
          "              [--swap-gb G] [--data-gb G] [--swap-policy semantic|reactive|recompute]\n"
          "              [--idle-ms MS] [--quota-gb G] [--swap-quota-gb G] [--max-wait-ms MS]\n"
          "              [--state-dir DIR --disk-swap-gb G]\n"
          "              [--weights-gb G] [--weight-quota-gb G] [--graph-gb G] [--graph-quota-gb G]\n"
          "              [--http ADDR:PORT] [--http-max-connections N] [--http-max-body BYTES] [--http-timeout-s S]\n"
          "              [--http-reuse N] [--http-header-timeout-s S] [--http-body-timeout-s S]\n"
          "              [--http-max-per-address N] [--http-max-unauth N] [--http-max-per-token N]\n"
          "              [--http-allowed-hosts HOST,...] [--local-admin]\n"
          "Defaults: --listen 127.0.0.1:7070, --models ., --device cpu, --lease-ms 10000,\n"
          "--vmu-gb auto (the device's free memory less max(1 GiB, 5%); the CPU: half the available RAM),\n"
          "--swap-gb auto (host swap pool for paused and idle sessions' KV, pinned on a GPU: half the\n"
          "available RAM with a GPU, a quarter without), --data-gb: the data segment (KV) of the VMU\n"
          "(default 30% of it), --swap-policy semantic, --idle-ms 1000 (a session with no request for this\n"
          "long may be swapped out), --quota-gb: KV one token's sessions may hold, all its connections together\n"
          "(one connection's without --token-file; default none), --swap-quota-gb: the swap pool one token's\n"
          "sessions may hold (default: as --quota-gb; 0: none) - past it its own work waits, not others',\n"
          "--state-dir DIR --disk-swap-gb G: a disk tier of G GiB below the swap pool, the page file\n"
          "DIR/kv-pages.djinn (made and reserved at start; DIR must exist): when the pool is full the swapped\n"
          "sessions wanted furthest ahead go on to disk, checksummed, and are read back before they resume\n"
          "(semantic policy only; docs/swap.md),\n",
          f);
    fputs("--weights-gb 8 (captured modules' weights stored by content, shared by all; unused ones are evicted\n"
          "oldest first), --weight-quota-gb (bytes one token's weight uploads may hold; default: all of it),\n"
          "--max-wait-ms 10000 (batch-class overload is served newest first, except past this age),\n"
          "--max-running 64, --prefill-chunk 256 (prompt tokens per scheduler turn; 0 = the whole prompt),\n"
          "--deterministic off (on: a generation's tokens do not depend on what shares its steps; on a GPU\n"
          "batched steps are slower, bench/RESULTS.md; the CPU engine is always so).\n"
          "--prefix-cache on (full KV blocks of prompts are shared by content between sessions: a prompt\n"
          "that starts with cached blocks prefills only the rest; off: the kill switch, same results).\n"
          "--mixed-steps auto (prompt chunks share the decode steps: on for the CPU engine; on a GPU\n"
          "'short': only prompts with at most 64 tokens left).\n"
          "--host-layers auto (a model larger than its text budget streams layers through a ring; at steps of\n"
          "few rows the host's cores run the FFN of as many streamed layers as the rates measured at load say\n"
          "pay; none: everything streams; K: K layers, at steps of up to 16 rows).\n"
          "--kv-dtype auto (the KV cache in the device's activation dtype: bf16 on a GPU, f32 on the CPU;\n"
          "fp8: float8 e4m3 with a power-of-two scale per page and head, twice the tokens of bf16).\n",
          f);
    fputs("--agent-check ADDR:PORT: answer HAProxy's agent-check there ('up N%' from free KV pages, queued\n"
          "requests and step time; 'drain' after SIGUSR1, 'up ready' again after SIGUSR2; deploy/haproxy).\n",
          f);
    fputs("--drain-s S (30): with --state-dir, SIGTERM waits up to S s for the requests taken to end (new\n"
          "  ones are refused \"restarting, reattach\"), then writes every session to DIR/sessions and exits;\n"
          "  the next djinnd on DIR restores them for their clients to reattach (0: no wait).\n"
          "--persist on-stop|always|off (on-stop): with --state-dir, when sessions are written there - at the\n"
          "  stop; also after every request that changed one, before its answer (always: a kill -9 or a\n"
          "  power loss loses no answered work; measured in bench/RESULTS.md); never (off).\n",
          f);
    fputs("--graph-device cpu (captured graphs on the CPU executor; engine: on the engine's device, the CUDA\n"
          "executor with --device cuda:N - an op without a GPU kernel is refused by name).\n"
          "--graph-gb, --graph-quota-gb (captured-graph runs' planned stacks and outputs admitted at once, all\n"
          "and one token's: past it a run waits in its QoS class's line; a larger plan is refused; default none).\n"
          "--config FILE: an INI file of NAME = VALUE lines (an option's name without '--'; '#' or ';' starts a\n"
          "comment; an optional [djinnd] header), read before the command line, whose flags override it.\n"
          "SIGHUP re-reads it with the token file: the tokens, the log level and the limits marked (R) below\n"
          "change for what comes next; sessions and connections stay. A --models store without a model\n"
          "(a folder holding config.json) stops the start unless --allow-empty (allow-empty = on in a file).\n"
          "--log-level (default warn, or $DJINN_LOG): what goes to stderr; info adds an access line per request\n"
          "(GENERATE on the binary port, every HTTP request). --log-format text (default) or json: one JSON\n"
          "object a line. Every line starts with (or holds, \"ts\") an RFC 3339 UTC time.\n",
          f);
    fputs("Limits per connection and of the daemon (against hostile clients):\n"
          "  --max-connections 1024     connections at once (lowered to fit the fd limit); more get DJ_EBUSY\n"
          "(R)--max-pending-connections 64   of those, connections without a completed HELLO (at most a quarter\n"
          "                             of --max-connections): a new one past it closes the oldest silent one\n"
          "(R)--hello-timeout-ms 10000   a connection that has not completed HELLO by then is closed\n"
          "(R)--idle-timeout-ms 300000   a connection with no byte either way and nothing pending is closed (0: never)\n"
          "(R)--max-reply-buffer 4m,64m  unsent reply bytes: past SOFT the connection is not read, past HARD\n"
          "                             (header and metadata bytes) it is dropped (suffixes k, m, g)\n"
          "(R)--max-inflight 64          requests queued or running per connection before it is not read\n"
          "  --max-sessions-per-conn 64, --max-handles-per-conn 256   more get DJ_EQUOTA\n"
          "  --max-sessions-per-token 256  sessions of one token's connections together; more get DJ_EQUOTA\n"
          "(R)--max-connections-per-token 256  connections of one token at once; HELLO past it gets DJ_EQUOTA\n"
          "  --metrics-max-connections 16   /metrics connections at once (each closed after 10 s)\n"
          "  --max-prompt-bytes 1m      a GENERATE's text prompt: more bytes get DJ_ERANGE before tokenizing\n"
          "(R)--max-prompt-inflight 4m   text prompt bytes of one connection awaiting the tokenizer thread before\n"
          "                             the connection is not read\n"
          "--http ADDR:PORT serves the OpenAI API (GET /v1/models, POST /v1/completions and\n"
          "/v1/chat/completions, streaming too) through this daemon's own listener, and the live view of\n"
          "the VMU: GET / (a page), GET /v1/djinn/stats (its JSON), GET /v1/djinn/events (the same pushed\n"
          "every 500 ms as server-sent events; ?count=N ends after N; each open stream holds a connection):\n"
          "  --http-max-connections 64  requests at once; more get 503\n"
          "  --http-max-body 4m         request body bytes; more get 413 (suffixes k, m, g)\n"
          "  --http-timeout-s 30        an HTTP connection idle this long (headers, body) is closed\n"
          "  --http-reuse 16            finished sessions kept (10 min at most) so that a request whose prompt\n"
          "                             extends one's tokens prefills only the rest; 0 = off\n"
          "  --http-header-timeout-s 10 a request's headers must all have come this long after the connection\n"
          "                             opened or its last answer (an absolute deadline, not an idle timer)\n"
          "  --http-body-timeout-s 60   ... and its body this long after its headers; else the connection closes\n"
          "  --http-max-per-address 32  connections at once from one address (an IPv6 /64); more get 429\n"
          "  --http-max-unauth 32       connections still sending their headers: past this the oldest (if\n"
          "                             waiting over 1 s) is closed\n"
          "  --http-max-per-token 0     requests at once (event streams too) per --token-file token; more get\n"
          "                             429 (0: half of --http-max-connections)\n"
          "  --http-allowed-hosts H,... Host header names accepted besides localhost, IP literals and --http's\n"
          "                             host (checked without --token-file, or whenever given)\n"
          "POST bodies must be Content-Type: application/json (else 415).\n"
          "Without --token-file only loopback (and unix socket) peers are accepted, with every QoS class; none\n"
          "has the admin role (every session in STATS, another connection's MODEL_UNLOAD, /v1/djinn/stats\n"
          "and /v1/djinn/events, /metrics: 403) unless --local-admin is given (a single-user machine).\n"
          "The token file holds one token per line: TOKEN [qos=CLASS,...] [admin] [shared]\n"
          "[name=NAME] (NAME: what logs show for it, never the token; default lineN)\n"
          "(printable ASCII, at most 256 bytes; classes default to interactive,batch; '#' starts a comment).\n"
          "Each token has a prefix cache of its own; tokens marked 'shared' share one.\n"
          "A wrong token slows that address's next HELLO (100 ms doubling to 2 s); /metrics then wants\n"
          "'Authorization: Bearer TOKEN' of an admin token.\n",
          f);
    return 2;
}

/* "4m" -> 4 MiB; k, m, g suffixes (binary), no suffix: bytes. */
static bool parse_bytes(const char *v, uint64_t *out) {
    errno = 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || v[0] == '-') return false;
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ull << 10, end++;
    else if (*end == 'm' || *end == 'M') mul = 1ull << 20, end++;
    else if (*end == 'g' || *end == 'G') mul = 1ull << 30, end++;
    if (*end || x > UINT64_MAX / mul) return false;
    *out = x * mul;
    return true;
}

static bool parse_buffer(const char *v, dj__config *cfg) {
    const char *comma = strchr(v, ',');
    char soft[32];
    if (!comma || (size_t)(comma - v) >= sizeof soft) return false;
    memcpy(soft, v, (size_t)(comma - v));
    soft[comma - v] = '\0';
    uint64_t a, b;
    if (!parse_bytes(soft, &a) || !parse_bytes(comma + 1, &b) || a < 1024 || b < a) return false;
    cfg->out_soft = a;
    cfg->out_hard = b;
    return true;
}

/* Counting options: name, where it goes, whether 0 is allowed. */
typedef struct count_opt {
    const char *name;
    size_t off;
    bool zero_ok, is_int;
} count_opt;

static const count_opt counts[] = {
    {"--threads", offsetof(dj__config, threads), true, true},
    {"--lease-ms", offsetof(dj__config, lease_ms), false, false},
    {"--max-running", offsetof(dj__config, max_running), false, false},
    {"--prefill-chunk", offsetof(dj__config, prefill_chunk), true, false},
    {"--max-connections", offsetof(dj__config, max_conns), false, false},
    {"--max-pending-connections", offsetof(dj__config, max_pending), false, false},
    {"--hello-timeout-ms", offsetof(dj__config, hello_timeout_ms), false, false},
    {"--idle-timeout-ms", offsetof(dj__config, idle_timeout_ms), true, false},
    {"--max-inflight", offsetof(dj__config, max_inflight), false, false},
    {"--max-sessions-per-conn", offsetof(dj__config, max_sessions), false, false},
    {"--max-sessions-per-token", offsetof(dj__config, max_sessions_token), false, false},
    {"--max-connections-per-token", offsetof(dj__config, max_conns_token), false, false},
    {"--max-handles-per-conn", offsetof(dj__config, max_handles), false, false},
    {"--metrics-max-connections", offsetof(dj__config, metrics_conns), false, false},
    {"--http-max-connections", offsetof(dj__config, http_conns), false, false},
    {"--http-timeout-s", offsetof(dj__config, http_timeout_s), false, false},
    {"--http-reuse", offsetof(dj__config, http_reuse), true, false},
    {"--http-header-timeout-s", offsetof(dj__config, http_header_s), false, false},
    {"--http-body-timeout-s", offsetof(dj__config, http_body_s), false, false},
    {"--http-max-per-address", offsetof(dj__config, http_per_addr), false, false},
    {"--http-max-unauth", offsetof(dj__config, http_unauth), false, false},
    {"--http-max-per-token", offsetof(dj__config, http_per_token), true, false},
    {"--idle-ms", offsetof(dj__config, idle_ms), true, false},
    {"--max-wait-ms", offsetof(dj__config, max_wait_ms), true, false},
    {"--drain-s", offsetof(dj__config, drain_s), true, false},
};

/* Size options: name, where it goes (size_t bytes), whether "auto" is allowed. */
typedef struct size_opt {
    const char *name;
    size_t off;
} size_opt;

static const size_opt sizes[] = {
    {"--vmu-gb", offsetof(dj__config, vmu_bytes)},
    {"--swap-gb", offsetof(dj__config, swap_bytes)},
    {"--data-gb", offsetof(dj__config, data_bytes)},
    {"--quota-gb", offsetof(dj__config, quota_bytes)},
    {"--swap-quota-gb", offsetof(dj__config, swap_quota_bytes)},
    {"--disk-swap-gb", offsetof(dj__config, disk_bytes)},
    {"--weights-gb", offsetof(dj__config, weights_bytes)},
    {"--weight-quota-gb", offsetof(dj__config, weight_quota_bytes)},
    {"--graph-gb", offsetof(dj__config, graph_bytes)},
    {"--graph-quota-gb", offsetof(dj__config, graph_quota_bytes)},
};

/* Options that are flags: no value on the command line. */
static bool is_flag(const char *a) { return !strcmp(a, "--allow-empty") || !strcmp(a, "--local-admin"); }

/* One option: a ("--name") set to v on cfg. Returns 0, 1 for an unknown
 * option or 2 for a bad value, with the reason in err[cap]. */
static int set_option(dj__config *cfg, const char *a, const char *v, char *err, size_t cap) {
    if (is_flag(a)) { /* flags take no value on the command line; on/off in a config file */
        bool *dst = !strcmp(a, "--allow-empty") ? &cfg->allow_empty : &cfg->local_admin;
        if (!v || !strcmp(v, "on") || !strcmp(v, "true") || !strcmp(v, "yes"))
            *dst = true;
        else if (!strcmp(v, "off") || !strcmp(v, "false") || !strcmp(v, "no"))
            *dst = false;
        else
            return snprintf(err, cap, "%s '%s': want on or off", a, v), 2;
        return 0;
    }
    if (!v) return snprintf(err, cap, "unknown option or missing value: '%s'", a), 1;
    const count_opt *co = NULL;
    for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
        if (!strcmp(a, counts[k].name)) co = &counts[k];
    const size_opt *so = NULL;
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
        if (!strcmp(a, sizes[k].name)) so = &sizes[k];
    if (so) {
        size_t *dst = (size_t *)((char *)cfg + so->off);
        if (!strcmp(v, "auto") && (so->off == offsetof(dj__config, vmu_bytes) ||
                                   so->off == offsetof(dj__config, swap_bytes))) {
            *dst = so->off == offsetof(dj__config, vmu_bytes) ? 0 : DJ__SIZE_AUTO;
        } else if (dj_vmu_parse_size(v, dst) != DJ_OK) {
            snprintf(err, cap, "%s '%s': %s", a, v, dj_last_error());
            return 2;
        } else if (*dst == 0 && so->off != offsetof(dj__config, swap_bytes) &&
                   so->off != offsetof(dj__config, swap_quota_bytes)) {
            snprintf(err, cap, "%s '%s': must be more than 0", a, v);
            return 2;
        }
    } else if (!strcmp(a, "--persist")) {
        if (!strcmp(v, "on-stop")) cfg->persist = DJ__PERSIST_ON_STOP;
        else if (!strcmp(v, "always")) cfg->persist = DJ__PERSIST_ALWAYS;
        else if (!strcmp(v, "off")) cfg->persist = DJ__PERSIST_OFF;
        else {
            snprintf(err, cap, "--persist: '%s' is not always, on-stop or off", v);
            return 2;
        }
    } else if (!strcmp(a, "--swap-policy")) {
        if (dj_swap_policy_parse(v, &cfg->swap_policy) != DJ_OK) {
            snprintf(err, cap, "--swap-policy: %s", dj_last_error());
            return 2;
        }
    } else if (co) {
        errno = 0;
        char *end;
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < 0 || x > INT32_MAX || (x == 0 && !co->zero_ok)) {
            snprintf(err, cap, "%s '%s' is not a valid count", a, v);
            return 2;
        }
        if (co->is_int) *(int *)((char *)cfg + co->off) = (int)x;
        else *(uint32_t *)((char *)cfg + co->off) = (uint32_t)x;
    } else if (!strcmp(a, "--listen")) {
        cfg->listen = v;
    } else if (!strcmp(a, "--models")) {
        cfg->models = v;
    } else if (!strcmp(a, "--device")) {
        cfg->device = v;
    } else if (!strcmp(a, "--metrics")) {
        cfg->metrics = v;
    } else if (!strcmp(a, "--agent-check")) {
        cfg->agent_check = v;
    } else if (!strcmp(a, "--http")) {
        cfg->http = v;
    } else if (!strcmp(a, "--http-allowed-hosts")) {
        cfg->http_hosts = v;
    } else if (!strcmp(a, "--http-max-body")) {
        if (!parse_bytes(v, &cfg->http_max_body) || cfg->http_max_body < 1024) {
            snprintf(err, cap, "--http-max-body '%s': want a size of at least 1k (suffixes k, m, g)", v);
            return 2;
        }
    } else if (!strcmp(a, "--max-prompt-bytes") || !strcmp(a, "--max-prompt-inflight")) {
        uint64_t *dst = !strcmp(a, "--max-prompt-bytes") ? &cfg->max_prompt_bytes : &cfg->prompt_inflight;
        if (!parse_bytes(v, dst) || *dst < 1024) {
            snprintf(err, cap, "%s '%s': want a size of at least 1k (suffixes k, m, g)", a, v);
            return 2;
        }
    } else if (!strcmp(a, "--log-format")) {
        if (!strcmp(v, "text")) cfg->log_format = DJ_LOG_TEXT;
        else if (!strcmp(v, "json")) cfg->log_format = DJ_LOG_JSON;
        else return snprintf(err, cap, "--log-format '%s': want text or json", v), 2;
    } else if (!strcmp(a, "--log-level")) {
        static const char *const levels[] = {"debug", "info", "warn", "error"};
        cfg->log_level = -2;
        for (int k = 0; k < 4; k++)
            if (!strcmp(v, levels[k])) cfg->log_level = k;
        if (cfg->log_level == -2) return snprintf(err, cap, "--log-level '%s': want debug, info, warn or error", v), 2;
    } else if (!strcmp(a, "--state-dir")) {
        cfg->state_dir = v;
    } else if (!strcmp(a, "--token-file")) {
        cfg->token_file = v;
    } else if (!strcmp(a, "--port-file")) {
        cfg->port_file = v;
    } else if (!strcmp(a, "--max-reply-buffer")) {
        if (!parse_buffer(v, cfg)) {
            snprintf(err, cap, "--max-reply-buffer '%s': want SOFT,HARD (e.g. 4m,64m; SOFT >= 1k, "
                            "HARD >= SOFT)", v);
            return 2;
        }
    } else if (!strcmp(a, "--deterministic")) {
        if (strcmp(v, "on") && strcmp(v, "off")) {
            snprintf(err, cap, "--deterministic '%s': want on or off", v);
            return 2;
        }
        cfg->deterministic = !strcmp(v, "on");
    } else if (!strcmp(a, "--host-layers")) {
        char *end = NULL;
        const long k = strtol(v, &end, 10);
        if (!strcmp(v, "auto"))
            cfg->host_layers = 0;
        else if (!strcmp(v, "none"))
            cfg->host_layers = -1;
        else if (end != v && !*end && k >= 1 && k <= 65536)
            cfg->host_layers = (int)k;
        else {
            snprintf(err, cap, "--host-layers '%s': want auto, none or a layer count 1..65536", v);
            return 2;
        }
    } else if (!strcmp(a, "--graph-device")) {
        if (strcmp(v, "cpu") && strcmp(v, "engine")) {
            snprintf(err, cap, "--graph-device '%s': want cpu or engine", v);
            return 2;
        }
        cfg->graph_on_engine = !strcmp(v, "engine");
    } else if (!strcmp(a, "--kv-dtype")) {
        if (strcmp(v, "auto") && strcmp(v, "fp8")) {
            snprintf(err, cap, "--kv-dtype '%s': want auto or fp8", v);
            return 2;
        }
        cfg->kv_dtype = v;
    } else if (!strcmp(a, "--prefix-cache")) {
        if (strcmp(v, "on") && strcmp(v, "off")) {
            snprintf(err, cap, "--prefix-cache '%s': want on or off", v);
            return 2;
        }
        cfg->no_prefix_cache = !strcmp(v, "off");
    } else if (!strcmp(a, "--mixed-steps")) {
        if (!strcmp(v, "on"))
            cfg->mixed_steps = 1;
        else if (!strcmp(v, "off"))
            cfg->mixed_steps = 0;
        else if (!strcmp(v, "auto"))
            cfg->mixed_steps = -1;
        else if (!strcmp(v, "short"))
            cfg->mixed_steps = 2;
        else {
            snprintf(err, cap, "--mixed-steps '%s': want on, off, short or auto", v);
            return 2;
        }
    } else {
        snprintf(err, cap, "unknown option '%s'", a);
        return 1;
    }
    return 0;
}

static void set_defaults(dj__config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->log_level = -1;
    cfg->log_format = -1;
    cfg->listen = "127.0.0.1:7070";
    cfg->models = ".";
    cfg->vmu_bytes = 0;              /* auto */
    cfg->swap_bytes = DJ__SIZE_AUTO;
    cfg->swap_quota_bytes = DJ__SIZE_AUTO;
    cfg->idle_ms = 1000;
    cfg->max_wait_ms = 10000;
    cfg->lease_ms = 10000;
    cfg->drain_s = 30;
    cfg->max_running = 64;
    cfg->prefill_chunk = 256;
    cfg->mixed_steps = -1;
    cfg->max_conns = 1024;
    cfg->max_pending = 64;
    cfg->hello_timeout_ms = 10000;
    cfg->idle_timeout_ms = 300000;
    cfg->out_soft = (uint64_t)4 << 20;
    cfg->out_hard = (uint64_t)64 << 20;
    cfg->max_inflight = 64;
    cfg->max_sessions = 64;
    cfg->max_sessions_token = 256;
    cfg->max_conns_token = 256;
    cfg->max_handles = 256;
    cfg->metrics_conns = 16;
    cfg->max_prompt_bytes = (uint64_t)1 << 20;
    cfg->prompt_inflight = (uint64_t)4 << 20;
    cfg->http_conns = 64;
    cfg->http_max_body = (uint64_t)4 << 20;
    cfg->http_timeout_s = 30;
    cfg->http_reuse = 16;
    cfg->http_header_s = 10;
    cfg->http_body_s = 60;
    cfg->http_per_addr = 32;
    cfg->http_unauth = 32;
}

void dj__config_free(dj__config *cfg) {
    if (!cfg || !cfg->conf) return;
    dj__conf_free(cfg->conf);
    free(cfg->conf);
    cfg->conf = NULL;
}

int dj__parse_args(int argc, char **argv, dj__config *cfg) {
    set_defaults(cfg);
    char err[512];
    /* --help and --version first: they answer whatever else the line holds */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return usage(stdout), 3;
        if (!strcmp(argv[i], "--version")) {
            printf("djinnd %s (protocol %u)\n", DJ_VERSION_STRING, (unsigned)DJ_PROTO_VERSION);
            return 3;
        }
    }
    /* --config FILE: its options first, in the file's order, so the command line overrides them */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config")) continue;
        if (i + 1 >= argc) {
            fprintf(stderr, "djinnd: --config wants a FILE\n");
            return 2;
        }
        if (cfg->config) {
            fprintf(stderr, "djinnd: --config given twice\n");
            return 2;
        }
        cfg->config = argv[i + 1];
    }
    if (cfg->config) {
        cfg->conf = dj_calloc(1, sizeof *cfg->conf);
        dj_status st = cfg->conf ? dj__conf_read(cfg->config, cfg->conf) : dj_fail(DJ_ENOMEM, "out of memory");
        if (st != DJ_OK) {
            fprintf(stderr, "djinnd: %s\n", dj_last_error());
            dj__config_free(cfg);
            return 2;
        }
        for (size_t k = 0; k < cfg->conf->n; k++) {
            const dj__conf_entry *e = &cfg->conf->e[k];
            char name[96];
            int r = 1;
            if (strcmp(e->name, "config") && snprintf(name, sizeof name, "--%s", e->name) < (int)sizeof name)
                r = set_option(cfg, name, e->value, err, sizeof err);
            if (r == 1) snprintf(err, sizeof err, "unknown option '%s' (djinnd --help lists them, without '--')", e->name);
            if (r) {
                fprintf(stderr, "djinnd: --config %s line %d: %s\n", cfg->config, e->line, err);
                dj__config_free(cfg);
                return 2;
            }
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "serve") && i == 1) continue; /* `djinn serve ...` passes its argv through */
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (is_flag(a)) v = NULL; /* a flag: no value follows */
        else i++;
        const int r = set_option(cfg, a, v, err, sizeof err);
        if (r) {
            fprintf(stderr, "djinnd: %s\n", err);
            dj__config_free(cfg);
            return r == 1 ? usage(stderr) : 2;
        }
    }
    if (!!cfg->state_dir != !!cfg->disk_bytes) {
        fprintf(stderr, "djinnd: --state-dir DIR and --disk-swap-gb G go together (the disk tier's place and size)\n");
        dj__config_free(cfg);
        return 2;
    }
    if (cfg->state_dir && cfg->swap_policy != DJ_SWAP_SEMANTIC) {
        fprintf(stderr, "djinnd: the disk tier (--state-dir) takes sessions the swap pool cannot hold: it needs "
                        "--swap-policy semantic, not %s\n", dj_swap_policy_name(cfg->swap_policy));
        dj__config_free(cfg);
        return 2;
    }
    if (cfg->local_admin && cfg->token_file) {
        fprintf(stderr, "djinnd: --local-admin with --token-file: the token file says who is admin (mark a token "
                        "'admin'); drop one of them\n");
        dj__config_free(cfg);
        return 2;
    }
    return 0;
}
