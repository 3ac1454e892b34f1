/* djinn.c: the `djinn` command line - run a model embedded (no server),
 * tokenize/detokenize with a model's tokenizer, and show what a model needs. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/switches.h"
#include "djinn/checkpoint.h"
#include "djinn/engine.h"
#include "djinn/generate.h"
#include "djinn/lora.h"
#include "djinn/sampler.h"
#include "djinn/tokenizer.h"
#include "djinn/protocol.h"
#include "djinn/version.h"
#ifdef DJ_HAVE_CUDA
#include "djinn/dj_cuda.h"
#endif
#include "cli/admin_balancer.h"
#include "cli/remote.h"
#include "server/serve.h"

#define DEFAULT_NEW_TOKENS 64

typedef struct opts {
    const char *model, *prompt, *tokens, *text, *device, *vmu, *kv_dtype;
    const char *lora; /* --lora DIR[:SCALE][,...] */
    long n_new;
    double temp, top_p, min_p, repeat_penalty, frequency_penalty, presence_penalty;
    long top_k, ctx, threads, step;
    unsigned long long seed;
    int greedy, print_tokens, add_special, ignore_eos, stats, have_temp, have_top_p, have_top_k;
    int deterministic, no_prefetch, host_layers;
    double host_share;
} opts;

static int usage(FILE *f) {
    fputs("usage:\n"
          "  djinn --version\n"
          "  djinn run [--model DIR] (--prompt TEXT | --tokens 1,2,3) [-n N] [--greedy]\n"
          "            [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--print-tokens]\n"
          "            [--repeat-penalty R] [--frequency-penalty F] [--presence-penalty P]\n"
          "            [--ctx N] [--vmu-gb G] [--threads N] [--ignore-eos] [--stats] [--deterministic]\n"
          "            [--no-prefetch] [--host-layers auto|none|K] [--host-share auto|F] [--kv-dtype auto|fp8]\n"
          "            [--lora DIR[:SCALE][,DIR[:SCALE]...]: PEFT LoRA adapters of the model, stacked, each\n"
          "             SCALE times (1); docs/lora.md]\n"
          "  djinn tokenize --model DIR --text TEXT [--add-special]\n"
          "  djinn detokenize --model DIR --tokens 1,2,3\n"
          "  djinn info [--model DIR] [--ctx N] [--kv-dtype auto|fp8]\n"
          "  djinn serve [djinnd options]            (the daemon; see djinnd --help)\n"
          "  djinn generate --server ADDR (--model NAME | --session ID --secret S) (--prompt TEXT | --tokens 1,2,3)\n"
          "            [--qos Q] [--keep: the session outlives the command; its id and secret are printed]\n"
          "            [--session-file F: the session F names, else a new one written to F; kept]\n"
          "            [--stop-ids 1,2] [--token-file F] [run's flags but --model DIR, --device, --vmu-gb,\n"
          "            --threads, --step, --deterministic]\n"
          "  djinn stat --server ADDR\n"
          "  djinn session export --server ADDR (--session ID --secret S | --session-file F) --file IMAGE [--close]\n"
          "  djinn session import --server ADDR --file IMAGE [--session-file F]   (prints: ID SECRET)\n"
          "  djinn admin drain|ready HOST [--haproxy SOCKET]   (HAProxy in front: docs/deploy.md)\n"
          "Sizes: --vmu-gb takes GiB (\"2\", \"0.5\") or bytes (\"1048576b\"); without it the VMU\n"
          "is sized from the model. --ctx defaults to min(max_position_embeddings, 4096) (longrope\n"
          "models: at most original_max_position_embeddings; a longer --ctx takes the long factors).\n"
          "Without --model, run and info use $DJINN_MODEL or the demo model in models/demo.\n"
          "--deterministic: on a GPU, a sequence's logits do not depend on what else shares its\n"
          "steps (slower batched steps: bench/RESULTS.md); the CPU engine is always so.\n"
          "--kv-dtype fp8: the KV cache in float8 e4m3 with a power-of-two scale per page and\n"
          "head (twice the tokens of bf16 in the same memory; docs/internals.md, \"FP8 K/V\").\n",
          f);
    return 2;
}

static int die(const char *what, dj_status st) {
    const char *detail = dj_last_error();
    fprintf(stderr, "djinn: %s: %s%s%s\n", what, dj_strerror(st), detail[0] ? ": " : "", detail);
    return 1;
}

static int bad_arg(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "djinn: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 2;
}

static int parse_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

/* "1,2,3" -> ids; spaces allowed around commas. */
static dj_status parse_ids(const char *s, int32_t **ids, size_t *n) {
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return dj_fail(DJ_ENOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        while (*p == ' ') p++;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX) {
            free(v);
            return dj_fail(DJ_EINVAL, "token list '%s': '%.16s' is not a non-negative 32-bit integer", s, p);
        }
        if (k == cap) {
            int32_t *nv = realloc(v, 2 * cap * sizeof *v);
            if (!nv) {
                free(v);
                return dj_fail(DJ_ENOMEM, "out of memory");
            }
            v = nv;
            cap *= 2;
        }
        v[k++] = (int32_t)x;
        p = end;
        while (*p == ' ') p++;
        if (*p == ',') {
            p++;
            if (!*p) break;
        } else if (*p) {
            free(v);
            return dj_fail(DJ_EINVAL, "token list '%s': expected ',' at '%.16s'", s, p);
        }
    }
    if (k == 0) {
        free(v);
        return dj_fail(DJ_EINVAL, "token list is empty");
    }
    *ids = v;
    *n = k;
    return DJ_OK;
}

static int parse_opts(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->n_new = DEFAULT_NEW_TOKENS;
    o->top_p = 1.0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV                                                         \
    do {                                                              \
        if (!v) return bad_arg("option %s needs a value%s", a, "");   \
        i++;                                                          \
    } while (0)
        if (!strcmp(a, "--model") || !strcmp(a, "-m")) { NEEDV; o->model = v; }
        else if (!strcmp(a, "--prompt") || !strcmp(a, "-p")) { NEEDV; o->prompt = v; }
        else if (!strcmp(a, "--tokens")) { NEEDV; o->tokens = v; }
        else if (!strcmp(a, "--text")) { NEEDV; o->text = v; }
        else if (!strcmp(a, "--device")) { NEEDV; o->device = v; }
        else if (!strcmp(a, "--vmu-gb")) { NEEDV; o->vmu = v; }
        else if (!strcmp(a, "--kv-dtype")) { NEEDV; o->kv_dtype = v; }
        else if (!strcmp(a, "--lora")) { NEEDV; o->lora = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens")) {
            NEEDV;
            if (parse_long(v, 0, 1L << 30, &o->n_new)) return bad_arg("%s: '%s' is not a token count", a, v);
        } else if (!strcmp(a, "--temp")) {
            NEEDV;
            if (parse_double(v, &o->temp) || o->temp < 0) return bad_arg("%s: '%s' is not a temperature >= 0", a, v);
            o->have_temp = 1;
        } else if (!strcmp(a, "--top-p")) {
            NEEDV;
            if (parse_double(v, &o->top_p) || !(o->top_p > 0 && o->top_p <= 1))
                return bad_arg("%s: '%s' is not in (0, 1]", a, v);
            o->have_top_p = 1;
        } else if (!strcmp(a, "--top-k")) {
            NEEDV;
            if (parse_long(v, 0, INT32_MAX, &o->top_k)) return bad_arg("%s: '%s' is not a count >= 0", a, v);
            o->have_top_k = 1;
        } else if (!strcmp(a, "--min-p")) {
            NEEDV;
            if (parse_double(v, &o->min_p) || !(o->min_p >= 0 && o->min_p <= 1))
                return bad_arg("%s: '%s' is not in [0, 1]", a, v);
        } else if (!strcmp(a, "--repeat-penalty")) {
            NEEDV;
            if (parse_double(v, &o->repeat_penalty) || !(o->repeat_penalty >= 0 && o->repeat_penalty <= 100))
                return bad_arg("%s: '%s' is not a penalty in [0, 100] (1 or 0 = off)", a, v);
        } else if (!strcmp(a, "--frequency-penalty") || !strcmp(a, "--presence-penalty")) {
            NEEDV;
            double x;
            if (parse_double(v, &x) || !(x >= -2 && x <= 2)) return bad_arg("%s: '%s' is not in [-2, 2]", a, v);
            *(a[2] == 'f' ? &o->frequency_penalty : &o->presence_penalty) = x;
        } else if (!strcmp(a, "--seed")) {
            NEEDV;
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') return bad_arg("%s: '%s' is not a seed", a, v);
        } else if (!strcmp(a, "--ctx")) {
            NEEDV;
            if (parse_long(v, 1, INT32_MAX, &o->ctx)) return bad_arg("%s: '%s' is not a context length", a, v);
        } else if (!strcmp(a, "--threads")) {
            NEEDV;
            if (parse_long(v, 0, 4096, &o->threads)) return bad_arg("%s: '%s' is not a thread count", a, v);
        } else if (!strcmp(a, "--step")) {
            NEEDV;
            if (parse_long(v, 1, 1 << 16, &o->step)) return bad_arg("%s: '%s' is not a chunk size", a, v);
        } else if (!strcmp(a, "--greedy")) o->greedy = 1;
        else if (!strcmp(a, "--print-tokens")) o->print_tokens = 1;
        else if (!strcmp(a, "--add-special")) o->add_special = 1;
        else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = 1;
        else if (!strcmp(a, "--deterministic")) o->deterministic = 1;
        else if (!strcmp(a, "--no-prefetch")) o->no_prefetch = 1;
        else if (!strcmp(a, "--host-layers")) {
            NEEDV;
            long k = 0;
            if (!strcmp(v, "auto")) o->host_layers = 0;
            else if (!strcmp(v, "none")) o->host_layers = -1;
            else if (!parse_long(v, 1, 1 << 16, &k)) o->host_layers = (int)k;
            else return bad_arg("%s: '%s' is not auto, none or a layer count", a, v);
        } else if (!strcmp(a, "--host-share")) {
            NEEDV;
            if (!strcmp(v, "auto")) o->host_share = 0;
            else if (parse_double(v, &o->host_share) || !(o->host_share > 0 && o->host_share <= 1))
                return bad_arg("%s: '%s' is not auto or a share in (0, 1]", a, v);
        }
        else if (!strcmp(a, "--stats")) o->stats = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 3;
        else return bad_arg("unknown option '%s' for '%s' (see djinn --help)", a, argv[1]);
#undef NEEDV
    }
    return 0;
}

static dj_status load_tokenizer(const char *dir, dj_tokenizer_t **tok) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return dj_fail(DJ_ENOTFOUND, "%s: no tokenizer.json in the model directory", dir);
    return dj_tokenizer_load(path, tok);
}

/* ---- tokenize / detokenize ---- */

static int cmd_tokenize(const opts *o) {
    if (!o->model || !o->text) return bad_arg("tokenize needs --model DIR and --text TEXT%s%s", "", "");
    dj_tokenizer_t *tok = NULL;
    dj_status st = load_tokenizer(o->model, &tok);
    if (st != DJ_OK) return die("loading the tokenizer", st);
    int32_t *ids = NULL;
    size_t n = 0;
    st = dj_tokenizer_encode(tok, o->text, strlen(o->text), o->add_special, &ids, &n);
    if (st != DJ_OK) {
        dj_tokenizer_free(tok);
        return die("tokenizing", st);
    }
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
    printf("\n");
    free(ids);
    dj_tokenizer_free(tok);
    return 0;
}

static int cmd_detokenize(const opts *o) {
    if (!o->model || !o->tokens) return bad_arg("detokenize needs --model DIR and --tokens 1,2,3%s%s", "", "");
    int32_t *ids = NULL;
    size_t n = 0;
    dj_status st = parse_ids(o->tokens, &ids, &n);
    if (st != DJ_OK) return die("reading --tokens", st);
    dj_tokenizer_t *tok = NULL;
    st = load_tokenizer(o->model, &tok);
    if (st != DJ_OK) {
        free(ids);
        return die("loading the tokenizer", st);
    }
    char *text = NULL;
    st = dj_tokenizer_decode(tok, ids, n, &text);
    free(ids);
    dj_tokenizer_free(tok);
    if (st != DJ_OK) return die("detokenizing", st);
    printf("%s\n", text);
    free(text);
    return 0;
}

/* ---- engine setup shared by run and info ---- */

static uint32_t pick_ctx(const opts *o, const dj_model_config *c) {
    return o->ctx ? (uint32_t)o->ctx : dj_model_config_default_ctx(c);
}

/* The device a command runs on: --device, else the first GPU of a CUDA build,
 * else the CPU (saying so when a CUDA build finds no GPU). */
static const char *pick_device(opts *o) {
    if (o->device) return o->device;
#ifdef DJ_HAVE_CUDA
    if (dj_cuda_device_count() > 0) return o->device = "cuda:0";
    fprintf(stderr, "djinn: no GPU found; running on the CPU\n");
#endif
    return o->device = "cpu";
}

static int on_gpu(const opts *o) { return o->device && strncmp(o->device, "cuda", 4) == 0; }

/* K/V element type of the engine the device gets (--kv-dtype; auto: f32 CPU, bf16 GPU). */
static dj_status kv_dtype_of(const opts *o, dj_dtype *t) { return dj_kv_dtype_parse(o->kv_dtype, on_gpu(o), t); }

/* Text-segment bytes the adapters of --lora DIR[:S],... take at most: their
 * tensors as f32 (twice a bf16 file) and each tensor's alignment. */
static size_t lora_text_bytes(const char *arg) {
    char list[PATH_MAX];
    size_t bytes = 0;
    snprintf(list, sizeof list, "%s", arg);
    for (char *save = NULL, *dir = strtok_r(list, ",", &save); dir; dir = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(dir, ':');
        if (colon) *colon = '\0';
        char path[PATH_MAX + 32];
        struct stat sb;
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        if (stat(path, &sb) == 0) bytes += 2 * (size_t)sb.st_size + ((size_t)1 << 20);
    }
    return bytes;
}

static dj_status make_engine(opts *o, dj_checkpoint_t *ck, uint32_t ctx, dj_engine_t **e,
                             dj_model_needs *needs) {
    dj_engine_config ec;
    memset(&ec, 0, sizeof ec);
    ec.device = pick_device(o);
    ec.n_threads = (int)o->threads;
    ec.max_step_tokens = o->step ? (uint32_t)o->step : 512;
    ec.deterministic = o->deterministic != 0;
    ec.no_prefetch = o->no_prefetch != 0;
    ec.host_layers = o->host_layers;
    ec.host_share = o->host_share;
    ec.kv_dtype = o->kv_dtype;
    dj_dtype kvt;
    dj_status st = kv_dtype_of(o, &kvt);
    if (st == DJ_OK) st = dj_model_estimate(ck, kvt, ec.max_step_tokens, needs);
    if (st != DJ_OK) return st;
    if (o->lora) needs->text_bytes += lora_text_bytes(o->lora); /* the adapters beside the model */
    if (o->vmu) {
        size_t bytes;
        st = dj_vmu_parse_size(o->vmu, &bytes);
        if (st != DJ_OK) return st;
        dj_vmu_config_default(&ec.vmu, bytes);
    } else {
        dj_engine_config_for(needs, ctx, 0, &ec.vmu);
    }
    return dj_engine_new(&ec, e);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Without --model: $DJINN_MODEL, else the demo model that ships with Djinn. */
static const char *default_model(void) {
    const char *env = dj_switch_read_str(DJ_SW_MODEL);
    if (env) return env;
#ifdef DJ_DEFAULT_MODEL
    return DJ_DEFAULT_MODEL;
#else
    return NULL;
#endif
}

/* dir/name parsed as JSON (at most 64 KiB), or NULL if absent; a file that is
 * there but not JSON gets a warning and is ignored. Free with cJSON_Delete. */
static cJSON *read_json_in(const char *dir, const char *name) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    cJSON *j = cJSON_Parse(buf);
    if (!j) fprintf(stderr, "djinn: warning: %s is not valid JSON; ignoring it\n", path);
    return j;
}

/* Where a model came from, if its folder says (djinn_model.json). */
static void print_origin(const char *dir) {
    cJSON *j = read_json_in(dir, "djinn_model.json");
    if (!j) return;
    static const char *const keys[][2] = {{"name", "origin:         "},     {"description", "                "},
                                          {"trained_by", "trained by:     "}, {"trained_on", "trained on:     "},
                                          {"corpus", "corpus:         "},     {"doc", "documented in:  "}};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[i][0]);
        if (cJSON_IsString(v)) printf("%s%s\n", keys[i][1], v->valuestring);
    }
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(j, "held_out_loss");
    const cJSON *ppl = cJSON_GetObjectItemCaseSensitive(j, "held_out_perplexity");
    if (cJSON_IsNumber(loss) && cJSON_IsNumber(ppl))
        printf("quality:        held-out loss %.4f, perplexity %.2f\n", loss->valuedouble, ppl->valuedouble);
    cJSON_Delete(j);
}

/* The placement lines of `info` and `run --stats`. */
static void print_placement_of(FILE *f, const dj_model_placement *p) {
    if (!p->n_streamed) {
        fprintf(f, "placement:      all %u layers resident (%zu bytes, %.1f MiB)\n", p->n_layers, p->resident_bytes,
                p->resident_bytes / 1048576.0);
        return;
    }
    fprintf(f, "placement:      %u of %u layers stream through a ring of %.1f MiB (%u layers deep); %.1f MiB resident\n",
            p->n_streamed, p->n_layers, p->ring_bytes / 1048576.0, p->ring_layers, p->resident_bytes / 1048576.0);
    fprintf(f, "streamed:       %.1f MiB copied per step%s%s\n", p->streamed_bytes / 1048576.0,
            p->source[0] ? ", from " : "", p->source);
    fprintf(f, "layers:         %s (R resident, S streamed, H streamed, its FFN on the host at small batches, h a "
               "share of it)\n", p->layers);
    if (p->n_host)
        fprintf(f, "host compute:   %.0f%% of the FFN of %u layers on the host's cores at steps of up to %u rows%s\n",
                100.0 * p->host_share, p->n_host, p->host_rows, p->copy_gbps > 0 ? "" : " (set by --host-layers)");
    if (p->copy_gbps > 0)
        fprintf(f, "rates:          copies %.1f GB/s, host FFN reads %.1f GB/s (measured at load)\n", p->copy_gbps,
                p->host_gbps);
}

static void print_placement(FILE *f, const dj_model_t *m) {
    dj_model_placement p;
    dj_model_get_placement(m, &p);
    print_placement_of(f, &p);
}

static int cmd_info(opts *o) {
    if (!o->model) o->model = default_model();
    if (!o->model) return bad_arg("info needs --model DIR%s%s", "", "");
    dj_checkpoint_t *ck = NULL;
    dj_status st = dj_checkpoint_open(o->model, &ck);
    if (st != DJ_OK) return die("opening the model", st);
    const dj_model_config *c = dj_checkpoint_config(ck);
    const uint32_t ctx = pick_ctx(o, c);
    dj_model_needs needs;
    pick_device(o);
    dj_dtype kvt;
    st = kv_dtype_of(o, &kvt);
    if (st != DJ_OK) {
        dj_checkpoint_close(ck);
        return die("--kv-dtype", st);
    }
    st = dj_model_estimate(ck, kvt, o->step ? (uint32_t)o->step : 512, &needs);
    if (st != DJ_OK) {
        dj_checkpoint_close(ck);
        return die("sizing the model", st);
    }
    dj_model_needs decode;
    dj_model_estimate(ck, kvt, 1, &decode);
    printf("model:          %s\n", o->model);
    print_origin(o->model);
    printf("architecture:   %s\n", c->arch_name);
    printf("parameters:     %llu (%.3f B)\n", (unsigned long long)needs.n_params, (double)needs.n_params / 1e9);
    printf("weights dtype:  %s\n", c->torch_dtype[0] ? c->torch_dtype : "?");
    if (c->quant == DJ_QUANT_AWQ || c->quant == DJ_QUANT_GPTQ) { /* docs/internals.md, "4-bit weights" */
        printf("quantized:      %s: 4-bit linear weights, groups of 128 with zero points (repacked at load)\n",
               c->quant == DJ_QUANT_AWQ ? "awq gemm" : "gptq");
    } else if (c->quant != DJ_QUANT_NONE) { /* docs/quantization.md */
        char how[64] = "per-tensor or per-channel scales";
        if (c->quant_block[0]) snprintf(how, sizeof how, "%ux%u-block scales", c->quant_block[0], c->quant_block[1]);
        printf("quantized:      %s: f8_e4m3 linear weights, %s\n",
               c->quant == DJ_QUANT_FP8 ? "transformers fp8" : "compressed-tensors float8", how);
    }
    printf("shape:          %u layers, hidden %u, ffn %u, heads %u/%u kv, head_dim %u, vocab %u\n", c->n_layers,
           c->hidden_size, c->intermediate_size, c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size);
    if (c->rope_type == DJ_ROPE_LONGROPE)
        printf("rope:           longrope, %s factors for a context of %u (short ones up to %u positions)\n",
               dj_model_config_rope_long(c, ctx) ? "long" : "short", ctx, c->rope_original_max_pos);
    printf("fingerprint:    %016llx\n", (unsigned long long)dj_checkpoint_fingerprint(ck));
    if (on_gpu(o)) {
        char name[256] = "?";
#ifdef DJ_HAVE_CUDA
        int dev = o->device[4] == ':' ? atoi(o->device + 5) : 0;
        if (dj_cuda_device_name(dev, name, sizeof name) != DJ_OK) snprintf(name, sizeof name, "not available: %s", dj_last_error());
#endif
        printf("device:         %s = %s (bf16 activations, %s KV)\n", o->device, name, dj_dtype_name(kvt));
    } else {
        printf("device:         cpu (f32 activations, %s KV)\n", dj_dtype_name(kvt));
    }
    printf("text segment:   %zu bytes (%.1f MiB) of weights\n", needs.text_bytes, needs.text_bytes / 1048576.0);
    printf("data segment:   %zu bytes per token, %zu bytes (%.1f MiB) for a context of %u\n",
           needs.kv_bytes_per_token, needs.kv_bytes_per_token * ctx, needs.kv_bytes_per_token * ctx / 1048576.0, ctx);
    printf("stack peak:     %zu bytes (%.1f MiB) for a %u-token prefill step; %zu bytes for decode\n",
           needs.stack_peak, needs.stack_peak / 1048576.0, o->step ? (unsigned)o->step : 512u, decode.stack_peak);
    if (o->vmu) { /* the placement in that budget's text segment */
        size_t bytes = 0;
        dj_vmu_config vc;
        if ((st = dj_vmu_parse_size(o->vmu, &bytes)) != DJ_OK) {
            dj_checkpoint_close(ck);
            return die("--vmu-gb", st);
        }
        dj_vmu_config_default(&vc, bytes);
        dj_model_placement p;
        st = dj_model_plan_placement(ck, (size_t)(vc.text_frac * (double)bytes), &p);
        if (st == DJ_OK) print_placement_of(stdout, &p);
        else printf("placement:      none: %s\n", dj_last_error());
    } else {
        printf("placement:      all resident (the VMU is sized from the model; --vmu-gb G shows a budget's)\n");
    }
    dj_checkpoint_close(ck);
    return 0;
}

/* ---- run ---- */

/* generation_config.json decides sampling when the command line does not. */
static void read_generation_config(const char *dir, opts *o) {
    cJSON *j = read_json_in(dir, "generation_config.json");
    if (!j) return;
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(j, "do_sample");
    if (cJSON_IsTrue(ds) && !o->have_temp && !o->greedy) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "temperature");
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "top_p");
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "top_k");
        o->temp = cJSON_IsNumber(t) && t->valuedouble >= 0 ? t->valuedouble : 1.0;
        o->have_temp = 1;
        if (!o->have_top_p && cJSON_IsNumber(p) && p->valuedouble > 0 && p->valuedouble <= 1) o->top_p = p->valuedouble;
        if (!o->have_top_k && cJSON_IsNumber(k) && k->valuedouble >= 0) o->top_k = (long)k->valuedouble;
    }
    cJSON_Delete(j);
}

/* Print a piece of streamed text; warn once if the stream failed. */
static void put_text(const char *p, size_t n) {
    if (!n) return;
    fwrite(p, 1, n, stdout);
    fflush(stdout);
}

/* --lora DIR[:SCALE][,DIR[:SCALE]...]: the adapters in the DIRs stacked on s
 * (of model m), each at its SCALE (1); out[DJ_LORA_STACK_MAX] receives the
 * loader's references (*n_out of them), the caller releases them. */
static dj_status use_lora(dj_engine_t *e, dj_model_t *m, dj_session_t *s, const char *arg, dj_lora_t **out,
                          uint32_t *n_out) {
    char list[PATH_MAX];
    float scale[DJ_LORA_STACK_MAX];
    uint32_t n = 0;
    dj_status st = DJ_OK;
    snprintf(list, sizeof list, "%s", arg);
    for (char *save = NULL, *dir = strtok_r(list, ",", &save); dir && st == DJ_OK; dir = strtok_r(NULL, ",", &save)) {
        if (n == DJ_LORA_STACK_MAX) {
            st = dj_fail(DJ_EINVAL, "--lora %s: at most %d adapters on one session", arg, DJ_LORA_STACK_MAX);
            break;
        }
        scale[n] = 1.0f;
        char *colon = strrchr(dir, ':');
        if (colon) {
            char *end;
            errno = 0;
            const double v = strtod(colon + 1, &end);
            if (end == colon + 1 || *end || errno || !(v == v) || v < -1e6 || v > 1e6) {
                st = dj_fail(DJ_EINVAL, "--lora %s: '%s' is not a scale (a number, e.g. DIR:0.5)", arg, colon + 1);
                break;
            }
            scale[n] = (float)v;
            *colon = '\0';
        }
        if ((st = dj_lora_load(e, m, dir, &out[n])) != DJ_OK) break;
        fprintf(stderr, "djinn: adapter %s (rank %u, scale %g x %g)\n", dj_lora_name(out[n]),
                dj_lora_get_config(out[n])->r, (double)dj_lora_get_config(out[n])->scale, (double)scale[n]);
        n++;
    }
    *n_out = n;
    if (st == DJ_OK && n == 0) st = dj_fail(DJ_EINVAL, "--lora '%s' names no adapter", arg);
    return st == DJ_OK ? dj_session_set_loras(e, s, out, scale, n) : st;
}

static int cmd_run(opts *o) {
    if (!o->model) o->model = default_model();
    if (!o->model) return bad_arg("run needs --model DIR%s%s", "", "");
    if (!!o->prompt == !!o->tokens) return bad_arg("run needs exactly one of --prompt TEXT or --tokens 1,2,3%s%s", "", "");
    if (o->greedy && o->have_temp && o->temp > 0) return bad_arg("--greedy contradicts --temp %s%s (use one of them)", "> 0", "");
    read_generation_config(o->model, o);
    int rc = 1;
    dj_status st;
    dj_tokenizer_t *tok = NULL;
    dj_checkpoint_t *ck = NULL;
    dj_engine_t *e = NULL;
    dj_model_t *m = NULL;
    dj_session_t *s = NULL;
    dj_lora_t *lora[DJ_LORA_STACK_MAX] = {NULL};
    uint32_t n_lora = 0;
    dj_gen_t *g = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;

    if (o->prompt) {
        if (!o->prompt[0]) {
            fprintf(stderr, "djinn: the prompt is empty: give some text, or token ids with --tokens\n");
            return 2;
        }
        st = load_tokenizer(o->model, &tok);
        if (st != DJ_OK) return die("loading the tokenizer", st);
        st = dj_tokenizer_encode(tok, o->prompt, strlen(o->prompt), true, &ids, &n_ids);
        if (st != DJ_OK) {
            rc = die("tokenizing the prompt", st);
            goto done;
        }
        if (n_ids == 0) {
            fprintf(stderr, "djinn: the prompt encodes to no tokens\n");
            rc = 2;
            goto done;
        }
    } else {
        st = parse_ids(o->tokens, &ids, &n_ids);
        if (st != DJ_OK) {
            rc = die("reading --tokens", st);
            goto done;
        }
    }
    st = dj_checkpoint_open(o->model, &ck);
    if (st != DJ_OK) {
        rc = die("opening the model", st);
        goto done;
    }
    const dj_model_config *c = dj_checkpoint_config(ck);
    uint32_t ctx = pick_ctx(o, c);
    if (!o->ctx && n_ids + (size_t)o->n_new > ctx && n_ids + (size_t)o->n_new <= c->max_position_embeddings)
        ctx = (uint32_t)(n_ids + (size_t)o->n_new);
    if (n_ids + (size_t)o->n_new > ctx) {
        fprintf(stderr, "djinn: %zu prompt tokens + %ld new tokens exceed the context of %u\n", n_ids, o->n_new, ctx);
        rc = 2;
        goto done;
    }
    int32_t eos[16];
    size_t n_eos = 0;
    if ((st = dj_gen_eos_ids(o->model, c, eos, 16, &n_eos)) != DJ_OK) {
        rc = die("reading the model's EOS ids", st);
        goto done;
    }
    dj_model_needs needs;
    st = make_engine(o, ck, ctx, &e, &needs);
    if (st != DJ_OK) {
        rc = die("starting the engine", st);
        goto done;
    }
    double t0 = now_s();
    const char *base = strrchr(o->model, '/');
    st = dj_model_load_checkpoint(e, ck, base && base[1] ? base + 1 : o->model, &m);
    if (st != DJ_OK) {
        rc = die("loading the model", st);
        goto done;
    }
    dj_checkpoint_close(ck); /* copied into the text segment, or kept mapped by the model */
    ck = NULL;
    st = dj_session_new(e, m, ctx, 0, &s);
    if (st != DJ_OK) {
        rc = die("opening a session", st);
        goto done;
    }
    if (o->lora && (st = use_lora(e, m, s, o->lora, lora, &n_lora)) != DJ_OK) {
        rc = die("loading the adapter", st);
        goto done;
    }
    const dj_gen_params gp = {.sampling = {.temperature = o->greedy ? 0.0f : (float)o->temp,
                                           .top_k = (uint32_t)o->top_k,
                                           .top_p = (float)o->top_p,
                                           .seed = o->seed,
                                           .min_p = (float)o->min_p,
                                           .repetition_penalty = (float)o->repeat_penalty,
                                           .frequency_penalty = (float)o->frequency_penalty,
                                           .presence_penalty = (float)o->presence_penalty},
                              .max_tokens = (uint32_t)o->n_new,
                              .eos_ids = eos,
                              .n_eos = n_eos,
                              .ignore_eos = o->ignore_eos,
                              .tok = o->print_tokens ? NULL : tok};
    st = dj_gen_new(e, s, ids, n_ids, &gp, &g);
    if (st != DJ_OK) {
        rc = die("starting the generation", st);
        goto done;
    }
    const double t_load = now_s() - t0;
    /* The prompt's last chunk picks the first token: prefill time includes it. */
    double t_prefill = 0, t_first = 0;
    t0 = now_s();
    while (dj_gen_finished(g) == DJ_GEN_RUNNING) {
        const bool feeding = dj_gen_feeding(g);
        dj_gen_event ev;
        st = dj_gen_step(e, &g, 1, &ev);
        if (st != DJ_OK) {
            rc = die(feeding ? "prefill" : "decode", st);
            goto done;
        }
        if (feeding && !dj_gen_feeding(g)) t_first = now_s(), t_prefill = t_first - t0;
        put_text(ev.text, ev.text_len);
    }
    const double t_decode = t_first ? now_s() - t_first : 0;
    const long n_gen = (long)dj_gen_n_generated(g);
    char piece[1024];
    size_t len = 0; /* the rest comes out a buffer at a time */
    if (!o->print_tokens && tok) {
        while (dj_gen_text_rest(g, piece, sizeof piece, &len) == DJ_OK && len) put_text(piece, len);
        printf("\n");
    }
    if (o->print_tokens) {
        const int32_t *gen = dj_gen_ids(g);
        for (long i = 0; i < n_gen; i++) printf("%s%d", i ? " " : "", gen[i]);
        printf("\n");
    }
    fflush(stdout);
    fprintf(stderr, "djinn: %zu prompt tokens in %.3f s (%.1f tok/s), %ld new tokens in %.3f s (%.2f tok/s); load %.3f s; %s\n",
            n_ids, t_prefill, n_ids / (t_prefill > 0 ? t_prefill : 1e-9), n_gen, t_decode,
            n_gen > 1 ? (n_gen - 1) / (t_decode > 0 ? t_decode : 1e-9) : 0.0, t_load,
            dj_gen_finish_name(dj_gen_finished(g)));
    if (o->stats) {
        print_placement(stderr, m);
        dj_vmu_print_stats(dj_engine_vmu(e), stderr);
    }
    rc = 0;
done:
    dj_gen_free(g);
    if (e) {
        dj_session_free(e, s);
        for (uint32_t i = 0; i < n_lora; i++) dj_lora_release(e, lora[i]);
        dj_model_release(e, m);
    }
    dj_engine_free(e);
    dj_checkpoint_close(ck);
    dj_tokenizer_free(tok);
    free(ids);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
        return argc < 2 ? usage(stderr) : (usage(stdout), 0);
    /* Commands with their own option parsers. */
    if (!strcmp(argv[1], "--version")) {
        printf("djinn %s (protocol %u)\n", DJ_VERSION_STRING, (unsigned)DJ_PROTO_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "serve")) return dj__serve_main(argc, argv);
    if (!strcmp(argv[1], "generate")) return dj__cli_generate(argc, argv);
    if (!strcmp(argv[1], "stat")) return dj__cli_stat(argc, argv);
    if (!strcmp(argv[1], "session")) return dj__cli_session(argc, argv);
    if (!strcmp(argv[1], "admin")) return dj__cli_admin_balancer(argc, argv); /* admin_balancer.c */
    opts o;
    int r = parse_opts(argc, argv, &o);
    if (r == 3) return 0;
    if (r) return r;
    if (!strcmp(argv[1], "run")) return cmd_run(&o);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(&o);
    if (!strcmp(argv[1], "detokenize")) return cmd_detokenize(&o);
    if (!strcmp(argv[1], "info")) return cmd_info(&o);
    fprintf(stderr,
            "djinn: unknown command '%s' (commands: run, tokenize, detokenize, info, serve, generate, stat, admin)\n",
            argv[1]);
    return 2;
}
