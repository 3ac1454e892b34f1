/* remote.c: the CLI's client commands - generate through djinnd with the
 * same input/sampling/output flags as `djinn run`, and a readable stat. */
#include "cli/remote.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "djinn/client.h"

typedef struct ropts {
    const char *server, *model, *prompt, *tokens, *token_file, *qos, *stop, *session, *secret, *session_file, *file;
    long n_new, ctx;
    double temp, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty;
    long top_k;
    unsigned long long seed;
    int greedy, print_tokens, have_temp, ignore_eos, stats, keep, close_after;
} ropts;

static int rbad(const char *fmt, const char *a) {
    fprintf(stderr, "djinn: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    return 2;
}

static int rdie(const char *what, dj_status st) {
    const char *d = dj_last_error();
    fprintf(stderr, "djinn: %s: %s%s%s\n", what, dj_strerror(st), d[0] ? ": " : "", d);
    return 1;
}

static int num(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

static int parse(int argc, char **argv, ropts *o) {
    memset(o, 0, sizeof *o);
    o->n_new = 64;
    o->top_p = 1.0;
    o->qos = "interactive";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x;
        if (!strcmp(a, "--greedy")) { o->greedy = 1; continue; }
        if (!strcmp(a, "--print-tokens")) { o->print_tokens = 1; continue; }
        if (!strcmp(a, "--ignore-eos")) { o->ignore_eos = 1; continue; }
        if (!strcmp(a, "--stats")) { o->stats = 1; continue; }
        if (!strcmp(a, "--keep")) { o->keep = 1; continue; }
        if (!strcmp(a, "--close")) { o->close_after = 1; continue; }
        if (!strcmp(a, "--device") || !strcmp(a, "--vmu-gb") || !strcmp(a, "--threads") || !strcmp(a, "--step") ||
            !strcmp(a, "--deterministic"))
            return rbad("%s is the server's to choose (see djinnd --help), not a request's", a);
        if (!v) return rbad("option %s needs a value (or is unknown)", a);
        i++;
        if (!strcmp(a, "--server")) o->server = v;
        else if (!strcmp(a, "--model") || !strcmp(a, "-m")) o->model = v;
        else if (!strcmp(a, "--prompt") || !strcmp(a, "-p")) o->prompt = v;
        else if (!strcmp(a, "--tokens")) o->tokens = v;
        else if (!strcmp(a, "--token-file")) o->token_file = v;
        else if (!strcmp(a, "--qos")) o->qos = v;
        else if (!strcmp(a, "--stop-ids")) o->stop = v;
        else if (!strcmp(a, "--session")) o->session = v;
        else if (!strcmp(a, "--secret")) o->secret = v;
        else if (!strcmp(a, "--session-file")) o->session_file = v;
        else if (!strcmp(a, "--file")) o->file = v;
        else if (!strcmp(a, "--ctx")) {
            if (num(v, &x) || x < 1 || x > INT32_MAX || x != (long)x) return rbad("--ctx: '%s' is not a context length", v);
            o->ctx = (long)x;
        } else if (!strcmp(a, "--min-p")) {
            if (num(v, &o->min_p) || !(o->min_p >= 0 && o->min_p <= 1)) return rbad("--min-p: '%s' is not in [0, 1]", v);
        } else if (!strcmp(a, "--repeat-penalty")) {
            if (num(v, &o->repeat_penalty) || !(o->repeat_penalty >= 0 && o->repeat_penalty <= 100))
                return rbad("--repeat-penalty: '%s' is not a penalty in [0, 100] (1 or 0 = off)", v);
        } else if (!strcmp(a, "--frequency-penalty") || !strcmp(a, "--presence-penalty")) {
            if (num(v, &x) || !(x >= -2 && x <= 2)) return rbad("penalty '%s' is not in [-2, 2]", v);
            *(a[2] == 'f' ? &o->frequency_penalty : &o->presence_penalty) = x;
        }
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens")) {
            if (num(v, &x) || x < 0 || x > (1 << 30) || x != (long)x) return rbad("-n: '%s' is not a token count", v);
            o->n_new = (long)x;
        } else if (!strcmp(a, "--temp")) {
            if (num(v, &o->temp) || o->temp < 0) return rbad("--temp: '%s' is not a temperature >= 0", v);
            o->have_temp = 1;
        } else if (!strcmp(a, "--top-p")) {
            if (num(v, &o->top_p) || !(o->top_p > 0 && o->top_p <= 1)) return rbad("--top-p: '%s' is not in (0, 1]", v);
        } else if (!strcmp(a, "--top-k")) {
            if (num(v, &x) || x < 0 || x > INT32_MAX || x != (long)x) return rbad("--top-k: '%s' is not a count", v);
            o->top_k = (long)x;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') return rbad("--seed: '%s' is not a seed", v);
        } else {
            return rbad("unknown option '%s'", a);
        }
    }
    if (!o->server) return rbad("%s needs --server ADDR:PORT (or unix:/path)", argv[1]);
    return 0;
}

/* A u64 in decimal (or 0x hex), as `--session`/`--secret` take it. */
static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || s[0] == '-' || s[0] == '+') return -1;
    *out = v;
    return 0;
}

/* --session-file: "ID SECRET\n". 1: read; 0: no such file; -1: not such a file. */
static int read_session_file(const char *path, uint64_t *sess, uint64_t *secret) {
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : -1;
    unsigned long long a = 0, b = 0;
    const int n = fscanf(f, "%llu %llu", &a, &b);
    fclose(f);
    if (n != 2) return -1;
    *sess = a;
    *secret = b;
    return 1;
}

static int write_session_file(const char *path, uint64_t sess, uint64_t secret) {
    const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return -1;
    char line[64];
    const int n = snprintf(line, sizeof line, "%llu %llu\n", (unsigned long long)sess, (unsigned long long)secret);
    const bool ok = write(fd, line, (size_t)n) == n;
    return close(fd) == 0 && ok ? 0 : -1;
}

static char *read_token(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = calloc(1, 256);
    size_t n = buf ? fread(buf, 1, 255, f) : 0;
    fclose(f);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) buf[--n] = '\0';
    return buf;
}

static int connect_to(const ropts *o, dj_client_t **c) {
    char *tok = NULL;
    if (o->token_file && !(tok = read_token(o->token_file))) {
        fprintf(stderr, "djinn: cannot read --token-file %s\n", o->token_file);
        return 2;
    }
    dj_status st = dj_client_connect(o->server, tok, c);
    free(tok);
    return st == DJ_OK ? 0 : rdie("connecting to djinnd", st);
}

static int32_t *parse_ids(const char *s, size_t *n) {
    size_t cap = 16;
    int32_t *v = malloc(cap * sizeof *v);
    *n = 0;
    const char *p = s;
    while (v && *p) {
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) goto bad;
        if (*n == cap) {
            int32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) goto bad;
            v = nv;
            cap *= 2;
        }
        v[(*n)++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') p++;
        else if (*p) goto bad;
        while (*p == ' ') p++;
    }
    if (*n) return v;
bad:
    free(v);
    return NULL;
}

typedef struct out_state {
    int print_tokens;
    int32_t *ids;
    size_t n, cap;
} out_state;

static void on_tok(int32_t id, const char *text, size_t len, void *user) {
    out_state *s = user;
    if (!s->print_tokens) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    if (id < 0) return;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        int32_t *nv = realloc(s->ids, cap * sizeof *nv);
        if (!nv) return;
        s->ids = nv;
        s->cap = cap;
    }
    s->ids[s->n++] = id;
}

int dj__cli_generate(int argc, char **argv) {
    ropts o;
    int r = parse(argc, argv, &o);
    if (r) return r;
    uint64_t sess = 0, secret = 0;
    if (!!o.session != !!o.secret) return rbad("--session ID and --secret S go together (SESSION_ATTACH wants both)%s", "");
    if (o.session && parse_u64(o.session, &sess)) return rbad("--session: '%s' is not a session id (a u64)", o.session);
    if (o.secret && parse_u64(o.secret, &secret)) return rbad("--secret: '%s' is not a session secret (a u64)", o.secret);
    if (o.session_file) { /* the session it names, or a new one it will name; kept either way */
        if (o.session) return rbad("--session-file names the session itself (drop --session/--secret)%s", "");
        const int got = read_session_file(o.session_file, &sess, &secret);
        if (got < 0) return rbad("--session-file %s: want \"ID SECRET\" (as djinn wrote it)", o.session_file);
        if (got) o.session = o.session_file;
        o.keep = 1;
    }
    if (!o.model && !o.session)
        return rbad("generate needs --model NAME (a model in the server's store) or --session ID --secret S%s", "");
    if (!!o.prompt == !!o.tokens) return rbad("generate needs exactly one of --prompt TEXT or --tokens 1,2,3%s", "");
    if (o.greedy && o.have_temp && o.temp > 0) return rbad("--greedy contradicts --temp %s (use one of them)", "> 0");
    dj_qos qos;
    if (dj_qos_parse(o.qos, &qos) != DJ_OK) return rdie("--qos", DJ_EINVAL);
    size_t n_ids = 0, n_stop = 0;
    int32_t *ids = NULL, *stop = NULL;
    if (o.tokens && !(ids = parse_ids(o.tokens, &n_ids)))
        return rbad("--tokens '%s': want non-negative 32-bit integers separated by commas", o.tokens);
    if (o.stop && !(stop = parse_ids(o.stop, &n_stop))) {
        free(ids);
        return rbad("--stop-ids '%s': want non-negative 32-bit integers separated by commas", o.stop);
    }
    dj_client_t *c = NULL;
    if ((r = connect_to(&o, &c))) {
        free(ids);
        free(stop);
        return r;
    }
    dj_session_opts so = {o.model, qos, (uint32_t)o.ctx};
    /* --session: a session left by another process (SESSION_ATTACH); --keep:
     * the session outlives this command (opened with reattach, not closed) */
    dj_status st = o.session ? dj_client_session_attach(c, sess, secret, NULL)
                   : o.keep  ? dj_client_session_open_secret(c, &so, &sess, &secret)
                             : dj_client_session_open(c, &so, &sess);
    /* the command before may have closed its connection a moment ago: the
     * daemon lets the session go to a new one once it has seen that (2 s) */
    for (int k = 0; o.session && st == DJ_ENOTFOUND && k < 200; k++) {
        const struct timespec ms10 = {0, 10 * 1000 * 1000};
        nanosleep(&ms10, NULL);
        st = dj_client_session_attach(c, sess, secret, NULL);
    }
    out_state os = {o.print_tokens, NULL, 0, 0};
    dj_generate_result res;
    if (st != DJ_OK) {
        r = rdie(o.session ? "attaching the session" : "opening a session", st);
    } else {
        dj_generate_params p;
        memset(&p, 0, sizeof p);
        p.prompt = o.prompt;
        p.ids = ids;
        p.n_ids = n_ids;
        p.max_tokens = (uint32_t)o.n_new;
        p.sampling.temperature = o.greedy ? 0.0f : (float)o.temp;
        p.sampling.top_k = (uint32_t)o.top_k;
        p.sampling.top_p = (float)o.top_p;
        p.sampling.seed = o.seed;
        p.sampling.min_p = (float)o.min_p;
        p.sampling.repetition_penalty = (float)o.repeat_penalty;
        p.sampling.frequency_penalty = (float)o.frequency_penalty;
        p.sampling.presence_penalty = (float)o.presence_penalty;
        p.stop_ids = stop;
        p.n_stop = n_stop;
        p.ignore_eos = o.ignore_eos;
        st = dj_client_generate(c, sess, &p, on_tok, &os, &res);
        if (!o.print_tokens) printf("\n");
        if (st != DJ_OK) {
            r = rdie("generating", st);
        } else {
            if (o.print_tokens) {
                for (size_t i = 0; i < os.n; i++) printf("%s%d", i ? " " : "", os.ids[i]);
                printf("\n");
            }
            fflush(stdout);
            fprintf(stderr,
                    "djinn: %u prompt tokens, %u new tokens (%s); queue %.2f ms, prefill %.2f ms, first token %.2f "
                    "ms, decode %.2f ms\n",
                    res.n_prompt, res.n_generated, res.reason, res.queue_ms, res.prefill_ms, res.ttft_ms,
                    res.decode_ms);
            dj_client_stats sst;
            if (o.stats && dj_client_stats_get(c, &sst) == DJ_OK) {
                dj_client_stats_print(&sst, stderr);
                dj_client_stats_free(&sst);
            }
        }
        if (o.session_file && write_session_file(o.session_file, sess, secret) != 0)
            r = rbad("--session-file %s: cannot write it", o.session_file);
        if (o.keep)
            fprintf(stderr, "djinn: session %llu secret %llu kept (djinn generate --session %llu --secret %llu "
                            "within its lease continues it)\n", (unsigned long long)sess, (unsigned long long)secret,
                    (unsigned long long)sess, (unsigned long long)secret);
        else
            dj_client_session_close(c, sess);
    }
    free(os.ids);
    free(stop);
    free(ids);
    dj_client_free(c);
    return r;
}

int dj__cli_stat(int argc, char **argv) {
    ropts o;
    int r = parse(argc, argv, &o);
    if (r) return r;
    dj_client_t *c = NULL;
    if ((r = connect_to(&o, &c))) return r;
    dj_client_stats st;
    dj_status s = dj_client_stats_get(c, &st);
    if (s != DJ_OK) {
        dj_client_free(c);
        return rdie("stats", s);
    }
    printf("djinnd at %s\n", o.server);
    dj_client_stats_print(&st, stdout);
    dj_client_stats_free(&st);
    dj_client_free(c);
    return 0;
}

/* `djinn session export|import`: a session's image to a file, or a file's
 * session opened on this server (docs/swap.md, "Session images"). */
int dj__cli_session(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[2], "export") && strcmp(argv[2], "import")))
        return rbad("session needs export or import (djinn --help)%s", "");
    const bool exp = !strcmp(argv[2], "export");
    ropts o;
    int r = parse(argc - 1, argv + 1, &o);
    if (r) return r;
    if (!o.file) return rbad("session %s needs --file PATH (the session image)", argv[2]);
    uint64_t sess = 0, secret = 0;
    if (exp) {
        if (o.session_file) {
            if (read_session_file(o.session_file, &sess, &secret) != 1)
                return rbad("--session-file %s: want \"ID SECRET\" (as djinn wrote it)", o.session_file);
        } else if (!o.session || !o.secret || parse_u64(o.session, &sess) || parse_u64(o.secret, &secret)) {
            return rbad("session export needs --session ID --secret S (or --session-file F)%s", "");
        }
    }
    dj_client_t *c = NULL;
    if ((r = connect_to(&o, &c))) return r;
    dj_status st;
    if (exp) {
        st = dj_client_session_attach(c, sess, secret, NULL);
        for (int k = 0; st == DJ_ENOTFOUND && k < 200; k++) { /* a command before may have just closed */
            const struct timespec ms10 = {0, 10 * 1000 * 1000};
            nanosleep(&ms10, NULL);
            st = dj_client_session_attach(c, sess, secret, NULL);
        }
        if (st != DJ_OK) r = rdie("attaching the session", st);
        else if ((st = dj_client_session_export_file(c, sess, o.file)) != DJ_OK) r = rdie("exporting", st);
        else {
            fprintf(stderr, "djinn: session %llu written to %s%s\n", (unsigned long long)sess, o.file,
                    o.close_after ? "; closed here" : "");
            if (o.close_after && (st = dj_client_session_close(c, sess)) != DJ_OK) r = rdie("closing", st);
        }
    } else {
        uint32_t pos = 0;
        if ((st = dj_client_session_import_file(c, o.file, &sess, &secret, &pos)) != DJ_OK) r = rdie("importing", st);
        else {
            printf("%llu %llu\n", (unsigned long long)sess, (unsigned long long)secret);
            fprintf(stderr, "djinn: session %llu secret %llu at position %u (djinn generate --session %llu --secret "
                    "%llu within its lease continues it)\n", (unsigned long long)sess, (unsigned long long)secret, pos,
                    (unsigned long long)sess, (unsigned long long)secret);
            if (o.session_file && write_session_file(o.session_file, sess, secret) != 0)
                r = rbad("--session-file %s: cannot write it", o.session_file);
        }
    }
    dj_client_free(c);
    return r;
}
