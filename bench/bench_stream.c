/* bench_stream.c: a model larger than its text budget, streamed - for each
 * budget, the placement, ms/token of greedy decode at each batch size, a
 * prefill, the streamed rate against the measured pinned host->device rate,
 * the same without prefetch, and the tokens and logits against the first
 * budget's run (list "all" first: everything resident).
 *   bench_stream MODEL_DIR [--device cpu|cuda:N] [--text-gb all,12,8,4] [--batch 1,8,32]
 *                [--decode 16] [--prefill 2048] [--no-prefetch-too] [--host auto,none,8,auto:1,16:0.7]
 * --host: each budget once per host-compute setting (engine host_layers: auto
 * = from the rates measured at load, none = everything streams, K = K layers'
 * FFNs on the host; ":S" sets host_share, the host's share of each such FFN -
 * 1 the whole FFN, default auto: from the rates with auto, 1 with K); decode
 * logits of one step are compared with the first
 * budget's too (host-computed layers run in f32 on the CPU: close, not equal).
 * On the CPU, DJINN_WEIGHTS_IN_PLACE=0 makes the text budget bind. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "djinn/engine.h"

#define MAX_LIST 8

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "bench_stream: %s: %s\n", what, dj_last_error());
    exit(1);
}

static int parse_list(const char *s, double *out) {
    int n = 0;
    for (const char *p = s; *p && n < MAX_LIST;) {
        out[n++] = strncmp(p, "all", 3) == 0 ? 0.0 : strtod(p, NULL);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    return n;
}

typedef struct result {
    double ms[MAX_LIST];   /* per decode step at each batch */
    double prefill_s;
    int32_t tokens[64];    /* session 0's greedy tokens at batch 1 */
    float *prefill_logits; /* [V] */
    float *decode_logits;  /* [V] one decode step after a 16-token prompt */
} result;

/* The pinned host -> device rate of this backend (GB/s), by its swap hooks. */
static double pinned_rate(dj_engine_t *e) {
    dj_backend_t *be = dj_engine_backend(e);
    if (!be->vt->host_alloc || !be->vt->xfer_start) return 0.0;
    const size_t bytes = (size_t)1 << 30;
    void *host = NULL, *dev = NULL;
    if (be->vt->host_alloc(be, bytes, &host) != DJ_OK) return 0.0;
    if (be->vt->alloc(be, bytes, &dev) != DJ_OK) {
        be->vt->host_free(be, host);
        return 0.0;
    }
    memset(host, 1, bytes);
    double best = 0.0;
    for (int r = 0; r < 4; r++) {
        const dj_copy_span sp = {.dev = dev, .host = host, .bytes = bytes};
        dj_backend_xfer_t *x = NULL;
        if (be->vt->xfer_start(be, false, &sp, 1, &x) != DJ_OK) break;
        double sec = 0;
        dj_status st;
        while ((st = be->vt->xfer_query(be, x, &sec)) == DJ_EBUSY) {
        }
        be->vt->xfer_free(be, x);
        if (st == DJ_OK && sec > 0 && bytes / sec / 1e9 > best) best = bytes / sec / 1e9;
    }
    be->vt->free(be, dev);
    be->vt->host_free(be, host);
    return best;
}

static double max_diff(const float *a, const float *b, uint32_t n) {
    double md = 0;
    for (uint32_t v = 0; v < n; v++) md = fmax(md, fabs((double)a[v] - b[v]));
    return md;
}

static void run_budget(const char *model, const char *device, double text_gb, const double *batch, int nb,
                       uint32_t decode, uint32_t prefill, bool prefetch, int host, double share, double pinned,
                       result *res, const result *ref) {
    dj_checkpoint_t *ck = NULL;
    if (dj_checkpoint_open(model, &ck) != DJ_OK) die("checkpoint");
    const bool gpu = strncmp(device, "cuda", 4) == 0;
    dj_model_needs needs;
    if (dj_model_estimate(ck, gpu ? DJ_DTYPE_BF16 : DJ_DTYPE_F32, prefill, &needs) != DJ_OK) die("estimate");
    const dj_model_config cfg = *dj_checkpoint_config(ck);
    const uint32_t V = cfg.vocab_size;
    uint32_t maxb = 1;
    for (int i = 0; i < nb; i++) maxb = (uint32_t)batch[i] > maxb ? (uint32_t)batch[i] : maxb;
    const size_t text = text_gb > 0 ? (size_t)(text_gb * 1073741824.0) : needs.text_bytes + ((size_t)64 << 20);
    const size_t data = needs.kv_bytes_per_token * ((size_t)maxb * (16 + decode + 8) + prefill + 64) * 5 / 4 +
                        ((size_t)64 << 20);
    const size_t stack = needs.stack_peak * 5 / 4 + ((size_t)64 << 20);
    const size_t total = text + data + stack + ((size_t)1 << 20);
    dj_engine_config ec = {.device = device, .max_step_tokens = prefill, .no_prefetch = !prefetch, .host_layers = host,
                           .host_share = share};
    ec.vmu = (dj_vmu_config){.total_bytes = total,
                             .text_frac = (double)text / (double)total,
                             .data_frac = (double)data / (double)total,
                             .stack_frac = (double)stack / (double)total,
                             .page_bytes = 64 * 1024};
    dj_engine_t *e = NULL;
    if (dj_engine_new(&ec, &e) != DJ_OK) die("engine");
    double t0 = now();
    dj_model_t *m = NULL;
    if (dj_model_load_checkpoint(e, ck, "bench", &m) != DJ_OK) die("load");
    const double load_s = now() - t0;
    dj_checkpoint_close(ck);
    dj_model_placement pl;
    dj_model_get_placement(m, &pl);
    printf("\n== text budget %s%.1f GB%s, %s\n", text_gb > 0 ? "" : "all: ", (double)text / 1e9,
           prefetch ? "" : " (no prefetch)", device);
    if (pl.n_streamed)
        printf("placement: %u of %u layers streamed (%s), ring %.2f GB (%u layers), resident %.2f GB, %.2f GB copied a "
               "step from %s; load %.1f s\n",
               pl.n_streamed, pl.n_layers, pl.layers, pl.ring_bytes / 1e9, pl.ring_layers, pl.resident_bytes / 1e9,
               pl.streamed_bytes / 1e9, pl.source, load_s);
    else
        printf("placement: all %u layers resident (%.2f GB); load %.1f s\n", pl.n_layers, pl.resident_bytes / 1e9,
               load_s);
    if (pl.n_streamed)
        printf("host compute (%s, share %s): %u layers' FFN (%.0f%% of it) on the host at up to %u rows (measured: "
               "copies %.1f GB/s, host %.1f GB/s)\n", host < 0 ? "none" : host == 0 ? "auto" : "forced",
               share > 0 ? "forced" : "auto", pl.n_host, 100.0 * pl.host_share, pl.host_rows, pl.copy_gbps,
               pl.host_gbps);
    { /* one decode step's logits after a 16-token prompt */
        dj_session_t *s = NULL;
        int32_t p[17], t;
        for (int i = 0; i < 16; i++) p[i] = (int32_t)((7919u + 104729u * (uint32_t)i) % V);
        res->decode_logits = malloc((size_t)V * sizeof(float));
        if (dj_session_new(e, m, 32, 0, &s) != DJ_OK || dj_session_step_sample(e, s, p, 16, NULL, &t) != DJ_OK ||
            dj_session_step(e, s, &t, 1, res->decode_logits) != DJ_OK)
            die("decode logits");
        dj_session_free(e, s);
        if (ref && ref->decode_logits)
            printf("decode logits max |diff| %.3g vs the first budget's\n", max_diff(res->decode_logits, ref->decode_logits, V));
    }
    /* decode at each batch: prompts of 16 tokens, then greedy steps (2 warm-up) */
    for (int bi = 0; bi < nb; bi++) {
        const uint32_t B = (uint32_t)batch[bi];
        dj_session_t **ss = calloc(B, sizeof *ss);
        int32_t *ids = calloc(B, sizeof *ids), *next = calloc(B, sizeof *next);
        for (uint32_t b = 0; b < B; b++) {
            if (dj_session_new(e, m, 16 + decode + 8, 0, &ss[b]) != DJ_OK) die("session");
            int32_t p[16];
            for (int i = 0; i < 16; i++) p[i] = (int32_t)((7919u * (b + 1) + 104729u * (uint32_t)i) % V);
            if (dj_session_step_sample(e, ss[b], p, 16, NULL, &ids[b]) != DJ_OK) die("prompt");
        }
        double t = 0;
        dj_model_placement p0 = pl;
        for (uint32_t s = 0; s < decode + 2; s++) {
            if (s == 2) {
                t = now();
                dj_model_get_placement(m, &p0);
            }
            if (dj_engine_step_batch(e, ss, ids, B, NULL, NULL, next) != DJ_OK) die("decode");
            if (B == 1 && s < 64) res->tokens[s] = next[0];
            memcpy(ids, next, B * sizeof *ids);
        }
        res->ms[bi] = (now() - t) * 1e3 / decode;
        dj_model_placement p1; /* what these steps copied, and whether the host computed FFNs */
        dj_model_get_placement(m, &p1);
        const double step_bytes = (double)(p1.copied_bytes - p0.copied_bytes) / decode;
        const double gbs = step_bytes / (res->ms[bi] * 1e-3) / 1e9;
        printf("decode batch %2u: %8.2f ms/step, %8.2f ms/token", B, res->ms[bi], res->ms[bi] / B);
        if (pl.n_streamed)
            printf(", copied %.2f GB/step at %.1f GB/s (%.0f%% of pinned %.1f)%s", step_bytes / 1e9, gbs,
                   pinned > 0 ? 100.0 * gbs / pinned : 0.0, pinned,
                   p1.host_steps > p0.host_steps ? ", FFNs on the host" : "");
        if (B == 1 && ref)
            printf(", tokens %s the first budget's",
                   memcmp(res->tokens, ref->tokens, sizeof(int32_t) * (decode < 64 ? decode : 64)) ? "DIFFER from"
                                                                                                   : "equal to");
        printf("\n");
        for (uint32_t b = 0; b < B; b++) dj_session_free(e, ss[b]);
        free(ss);
        free(ids);
        free(next);
    }
    if (prefill) {
        int32_t *p = malloc(prefill * sizeof *p);
        for (uint32_t i = 0; i < prefill; i++) p[i] = (int32_t)((2654435761u * (i + 1)) % V);
        dj_session_t *s = NULL;
        if (dj_session_new(e, m, prefill + 8, 0, &s) != DJ_OK) die("session");
        res->prefill_logits = malloc((size_t)V * sizeof(float));
        t0 = now();
        if (dj_session_step(e, s, p, prefill, res->prefill_logits) != DJ_OK) die("prefill");
        res->prefill_s = now() - t0;
        printf("prefill %u: %.3f s (%.0f tok/s)", prefill, res->prefill_s, prefill / res->prefill_s);
        if (pl.n_streamed)
            printf(", %.1f GB streamed at %.1f GB/s", pl.streamed_bytes * (double)((prefill + 2047) / 2048) / 1e9,
                   pl.streamed_bytes * (double)((prefill + 2047) / 2048) / res->prefill_s / 1e9);
        if (ref && ref->prefill_logits)
            printf(", logits max |diff| %.3g vs the first budget's", max_diff(res->prefill_logits, ref->prefill_logits, V));
        printf("\n");
        dj_session_free(e, s);
        free(p);
    }
    dj_model_release(e, m);
    dj_engine_free(e);
}

int main(int argc, char **argv) {
    const char *model = NULL, *device = "cuda:0", *texts = "all", *batches = "1,8,32", *hosts = "auto";
    uint32_t decode = 16, prefill = 2048;
    bool no_pf = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') model = a;
        else if (!strcmp(a, "--no-prefetch-too")) no_pf = true;
        else if (v && !strcmp(a, "--device")) device = argv[++i];
        else if (v && !strcmp(a, "--text-gb")) texts = argv[++i];
        else if (v && !strcmp(a, "--batch")) batches = argv[++i];
        else if (v && !strcmp(a, "--decode")) decode = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (v && !strcmp(a, "--prefill")) prefill = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (v && !strcmp(a, "--host")) hosts = argv[++i];
        else {
            fprintf(stderr, "usage: bench_stream MODEL_DIR [--device D] [--text-gb all,12,8] [--batch 1,8,32] "
                            "[--decode N] [--prefill N] [--no-prefetch-too] [--host auto,none,K[:SHARE]]\n");
            return 2;
        }
    }
    if (!model || decode < 1 || decode > 64) {
        fprintf(stderr, "bench_stream: a MODEL_DIR and --decode 1..64 are needed\n");
        return 2;
    }
    double tl[MAX_LIST], bl[MAX_LIST], hs[MAX_LIST];
    int hl[MAX_LIST], nh = 0;
    const int nt = parse_list(texts, tl), nb = parse_list(batches, bl);
    for (const char *p = hosts; *p && nh < MAX_LIST;) {
        hl[nh] = !strncmp(p, "auto", 4) ? 0 : !strncmp(p, "none", 4) ? -1 : atoi(p);
        const char *colon = strchr(p, ':'), *comma = strchr(p, ',');
        hs[nh] = colon && (!comma || colon < comma) ? strtod(colon + 1, NULL) : 0.0;
        if ((hl[nh] == 0 && strncmp(p, "auto", 4)) || !(hs[nh] >= 0.0 && hs[nh] <= 1.0)) {
            fprintf(stderr, "bench_stream: --host takes auto, none or a count >= 1, each with :SHARE in (0, 1]\n");
            return 2;
        }
        nh++;
        p = comma;
        if (!p) break;
        p++;
    }
    for (int i = 0; i < nb; i++)
        if (bl[i] < 1) {
            fprintf(stderr, "bench_stream: batch sizes must be >= 1\n");
            return 2;
        }
    /* the machine's pinned rate, on an engine of its own */
    double pinned = 0;
    {
        dj_engine_config ec = {.device = device};
        dj_vmu_config_default(&ec.vmu, (size_t)1 << 30);
        dj_engine_t *e = NULL;
        if (dj_engine_new(&ec, &e) != DJ_OK) die("engine");
        pinned = pinned_rate(e);
        dj_engine_free(e);
    }
    printf("bench_stream: %s on %s; pinned host->device %.1f GB/s (1 GiB copies, best of 4)\n", model, device, pinned);
    const int per = nh + 1;
    result *r = calloc((size_t)nt * per, sizeof *r);
    for (int i = 0; i < nt; i++) {
        for (int h = 0; h < (tl[i] > 0 ? nh : 1); h++)
            run_budget(model, device, tl[i], bl, nb, decode, prefill, true, hl[h], hs[h], pinned, &r[per * i + h],
                       i || h ? &r[0] : NULL);
        if (no_pf && tl[i] > 0)
            run_budget(model, device, tl[i], bl, 1, decode, prefill, false, -1, 0.0, pinned, &r[per * i + nh], &r[0]);
    }
    for (int i = 0; i < nt * per; i++) {
        free(r[i].prefill_logits);
        free(r[i].decode_logits);
    }
    free(r);
    return 0;
}
