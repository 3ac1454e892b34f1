/* gpu_capture.c: the CUDA executor of captured graphs against the CPU executor - every bundle of
 * a folder (scripts/capture_bundles.sh dumps them from the Python capture tests) run on both.
 *
 * A bundle is graph_run_tool's stdin: {"graph": bin, "inputs": [bin], "weights": [bin]}. f32
 * inputs are drawn (uniform -1..1, seeded: DJ_TEST_SEED, 1 unless set; printed); i64 and bool inputs
 * and weights (indices, masks) are the bundle's; f32 weights are the bundle's where it has
 * them (up to 64 KiB each), else drawn (rank >= 2: uniform +-1/sqrt(fan-in); vectors 0.5..1.5, so running
 * variances stay positive). Each graph then runs on the CPU (the reference) and the GPU; f32
 * outputs must agree within 1e-4 of the reference's largest magnitude, i64/bool outputs exactly.
 * A graph with an op that has no GPU kernel must be refused with DJ_EUNSUPPORTED naming it.
 * Prints per bundle: nodes, max error, CPU and GPU ms; then every op seen on the GPU and every
 * op of the table no bundle ran. --cpu: the "GPU" is a second CPU backend (the harness checked
 * where there is no GPU: ctest capture_harness). usage: gpu_capture [--cpu] DIR|FILE... */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capture/capture_impl.h"
#include "djinn/backend.h"
#include "djinn/capture.h"
#include "djinn/dj_cuda.h"
#include "testutil.h"

#define TOL 1e-4

static bool seen_gpu[DJ_COP_COUNT], refused_op[DJ_COP_COUNT];
static bool cpu_mode; /* --cpu */

static dj_status gpu_check(const dj_cgraph_t *g, dj_cgraph_error *err) { return cpu_mode ? DJ_OK : dj_cgraph_cuda_check(g, err); }
static dj_status gpu_run(const dj_cgraph_t *g, dj_backend_t *be, const float *const *in, const float *const *wt, void *stack,
                         const float **outs) {
    return cpu_mode ? dj_cgraph_run(g, be, in, wt, stack, outs) : dj_cgraph_run_cuda(g, be, in, wt, stack, outs);
}
static int n_pass, n_fail, n_refused;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static uint8_t *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = n > 0 ? malloc((size_t)n) : NULL;
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = b ? (size_t)n : 0;
    return b;
}

/* A list of bins: bins[i], lens[i] (pointers into the bundle). */
static bool read_bins(dj__mp *m, uint32_t want, const uint8_t **bins, uint32_t *lens) {
    uint32_t n;
    if (!dj__mp_array(m, &n) || n != want) return false;
    for (uint32_t i = 0; i < n; i++)
        if (!dj__mp_bin(m, &bins[i], &lens[i])) return false;
    return true;
}

/* f32 values of a tensor: the bundle's bytes, or drawn */
static float *values(const dj_ctensor_info *t, const uint8_t *bin, uint32_t len, bool input, const char *what) {
    float *f = malloc(t->numel ? t->numel * 4 : 4);
    if (!f) return NULL;
    const bool have = (uint64_t)len == t->numel * 4;
    if (t->dtype != DJ_CDTYPE_F32 || (have && !input)) {
        if (!have) {
            fprintf(stderr, "  %s: %s of %llu elements has %u bytes in the bundle\n", what, dj_cdtype_name(t->dtype),
                    (unsigned long long)t->numel, len);
            free(f);
            return NULL;
        }
        memcpy(f, bin, len);
        return f;
    }
    if (input) {
        for (uint64_t e = 0; e < t->numel; e++) f[e] = dj_test_randf(-1.0f, 1.0f);
    } else if (t->rank >= 2) {
        const float a = 1.0f / sqrtf((float)(t->numel / (uint64_t)t->shape[0]));
        for (uint64_t e = 0; e < t->numel; e++) f[e] = dj_test_randf(-a, a);
    } else {
        for (uint64_t e = 0; e < t->numel; e++) f[e] = dj_test_randf(0.5f, 1.5f);
    }
    return f;
}

static void check_bundle(const char *path, dj_backend_t *cpu, dj_backend_t *gpu) {
    size_t len = 0;
    uint8_t *buf = read_all(path, &len);
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    dj_cgraph_t *g = NULL;
    float **in = NULL, **wt = NULL;
    void **din = NULL, **dwt = NULL;
    const float **outs = NULL, **gouts = NULL;
    const uint8_t **ib = NULL, **wb = NULL;
    uint32_t *il = NULL, *wl = NULL, ni = 0, nw = 0, no = 0;
    void *stack = NULL, *dstack = NULL;
    float *host = NULL;
    bool ok = false;
    if (!buf) {
        printf("FAIL %s: cannot read\n", name);
        n_fail++;
        return;
    }
    dj__mp m = {buf, buf + len};
    uint32_t nk;
    const uint8_t *graph = NULL, *inputs_at = NULL, *weights_at = NULL;
    uint32_t graph_len = 0;
    if (!dj__mp_map(&m, &nk)) goto bad;
    for (uint32_t i = 0; i < nk; i++) {
        const char *k;
        uint32_t kn;
        if (!dj__mp_str(&m, &k, &kn)) goto bad;
        if (kn == 5 && !memcmp(k, "graph", 5)) {
            if (!dj__mp_bin(&m, &graph, &graph_len)) goto bad;
            continue;
        }
        if (kn == 6 && !memcmp(k, "inputs", 6)) inputs_at = m.p;
        if (kn == 7 && !memcmp(k, "weights", 7)) weights_at = m.p;
        if (!dj__mp_skip(&m, 4)) goto bad;
    }
    if (!graph || !inputs_at || !weights_at) goto bad;
    dj_cgraph_error err;
    if (dj_cgraph_decode(graph, graph_len, NULL, &g, &err) != DJ_OK) {
        /* the tests' hostile and unknown-op graphs: the shared decoder refuses them on either executor */
        printf("skip %s: refused by the decoder (%s)\n", name, err.msg);
        goto out;
    }
    ni = dj_cgraph_n_inputs(g), nw = dj_cgraph_n_weights(g), no = dj_cgraph_n_outputs(g);
    in = calloc(ni + 1, sizeof *in), wt = calloc(nw + 1, sizeof *wt), din = calloc(ni + 1, sizeof *din);
    dwt = calloc(nw + 1, sizeof *dwt), outs = calloc(no + 1, sizeof *outs), gouts = calloc(no + 1, sizeof *gouts);
    ib = calloc(ni + 1, sizeof *ib), wb = calloc(nw + 1, sizeof *wb), il = calloc(ni + 1, sizeof *il), wl = calloc(nw + 1, sizeof *wl);
    if (!in || !wt || !din || !dwt || !outs || !gouts || !ib || !wb || !il || !wl) goto bad;
    m.p = inputs_at;
    if (!read_bins(&m, ni, ib, il)) goto bad;
    m.p = weights_at;
    if (!read_bins(&m, nw, wb, wl)) goto bad;

    if (gpu_check(g, &err) != DJ_OK) {
        /* refused: and the run itself must refuse the same way, before touching anything */
        const dj_status st = gpu_run(g, gpu, NULL, NULL, NULL, gouts);
        if (st != DJ_EUNSUPPORTED || err.kind != DJ_CGRAPH_ERR_UNSUPPORTED || !strstr(err.msg, err.op)) {
            printf("FAIL %s: refusal %s: %s\n", name, dj_status_name(st), err.msg);
            n_fail++;
        } else {
            printf("refused %s: %s\n", name, err.msg);
            refused_op[g->nodes[err.node].op] = true;
            n_refused++;
        }
        goto out;
    }
    for (uint32_t i = 0; i < ni; i++)
        if (!(in[i] = values(dj_cgraph_input(g, i), ib[i], il[i], true, "input"))) goto bad;
    for (uint32_t i = 0; i < nw; i++)
        if (!(wt[i] = values(dj_cgraph_weight(g, i), wb[i], wl[i], false, dj_cgraph_weight_name(g, i)))) goto bad;
    const size_t sb = dj_cgraph_stack_bytes(g) ? dj_cgraph_stack_bytes(g) : 64;
    stack = aligned_alloc(64, sb);
    if (!stack) goto bad;
    double t0 = now_ms();
    const dj_status cpu_st = dj_cgraph_run(g, cpu, (const float *const *)in, (const float *const *)wt, stack, outs);
    if (cpu_st != DJ_OK && cpu_st != DJ_ERANGE) { /* DJ_ERANGE: an index out of range, the GPU must say so too */
        printf("FAIL %s: cpu run: %s\n", name, dj_last_error());
        n_fail++;
        goto out;
    }
    const double cpu_ms = now_ms() - t0;
    for (uint32_t i = 0; i < ni; i++) {
        const size_t b = dj_cgraph_input(g, i)->numel * 4 + 4;
        if (gpu->vt->alloc(gpu, b, &din[i]) != DJ_OK || gpu->vt->upload(gpu, din[i], in[i], b - 4) != DJ_OK) goto gpu_bad;
    }
    for (uint32_t i = 0; i < nw; i++) {
        const size_t b = dj_cgraph_weight(g, i)->numel * 4 + 4;
        if (gpu->vt->alloc(gpu, b, &dwt[i]) != DJ_OK || gpu->vt->upload(gpu, dwt[i], wt[i], b - 4) != DJ_OK) goto gpu_bad;
    }
    if (gpu->vt->alloc(gpu, sb, &dstack) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) goto gpu_bad;
    if (cpu_st == DJ_ERANGE) {
        const dj_status st = gpu_run(g, gpu, (const float *const *)din, (const float *const *)dwt, dstack, gouts);
        if (st == DJ_ERANGE) {
            printf("ok %s: both executors refuse an index out of range (%s)\n", name, dj_last_error());
            n_pass++;
        } else {
            printf("FAIL %s: the CPU refuses an index out of range, the GPU says %s\n", name, dj_status_name(st));
            n_fail++;
        }
        goto out;
    }
    if (gpu_run(g, gpu, (const float *const *)din, (const float *const *)dwt, dstack, gouts) != DJ_OK) goto gpu_bad;
    t0 = now_ms(); /* the second run timed: the first paid for cuBLAS's setup */
    if (gpu_run(g, gpu, (const float *const *)din, (const float *const *)dwt, dstack, gouts) != DJ_OK) goto gpu_bad;
    const double gpu_ms = now_ms() - t0;
    double worst = 0.0;
    uint64_t mism = 0;
    for (uint32_t i = 0; i < no; i++) {
        const dj_ctensor_info *t = dj_cgraph_output(g, i);
        free(host);
        host = malloc(t->numel * 4 + 4);
        if (!host || gpu->vt->download(gpu, host, gouts[i], t->numel * 4) != DJ_OK || gpu->vt->sync(gpu) != DJ_OK) goto gpu_bad;
        double scale = 1e-6, e = 0.0;
        for (uint64_t k = 0; k < t->numel; k++) scale = fmax(scale, fabs((double)outs[i][k]));
        for (uint64_t k = 0; k < t->numel; k++) {
            const double a = outs[i][k], b = host[k];
            if (t->dtype != DJ_CDTYPE_F32) mism += a != b;
            else if (isnan(a) != isnan(b)) e = INFINITY;
            else if (!isnan(a)) e = fmax(e, isinf(a) || isinf(b) ? (a == b ? 0.0 : INFINITY) : fabs(a - b) / scale);
        }
        worst = fmax(worst, e);
    }
    for (uint32_t j = 0; j < g->n_nodes; j++)
        if (g->nodes[j].live) seen_gpu[g->nodes[j].op] = true;
    ok = worst <= TOL && !mism;
    printf("%s %s: %u nodes, max error %.2e, %llu index mismatches, cpu %.2f ms, gpu %.3f ms\n", ok ? "ok" : "FAIL", name,
           dj_cgraph_n_nodes(g), worst, (unsigned long long)mism, cpu_ms, gpu_ms);
    ok ? n_pass++ : n_fail++;
    goto out;
gpu_bad:
    printf("FAIL %s: gpu: %s\n", name, dj_last_error());
    n_fail++;
    goto out;
bad:
    printf("FAIL %s: not a readable bundle (%s)\n", name, dj_last_error());
    n_fail++;
out:
    for (uint32_t i = 0; in && i < ni; i++) free(in[i]);
    for (uint32_t i = 0; wt && i < nw; i++) free(wt[i]);
    for (uint32_t i = 0; din && i < ni; i++)
        if (din[i]) gpu->vt->free(gpu, din[i]);
    for (uint32_t i = 0; dwt && i < nw; i++)
        if (dwt[i]) gpu->vt->free(gpu, dwt[i]);
    if (dstack) gpu->vt->free(gpu, dstack);
    free(in), free(wt), free(din), free(dwt), free((void *)outs), free((void *)gouts), free((void *)ib), free((void *)wb);
    free(il), free(wl), free(stack), free(host), free(buf);
    dj_cgraph_free(g);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void check_path(const char *path, dj_backend_t *cpu, dj_backend_t *gpu) {
    DIR *d = opendir(path);
    if (!d) {
        check_bundle(path, cpu, gpu);
        return;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".mpk")) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        const size_t pl = strlen(path) + l + 2;
        if (!(names[n] = malloc(pl))) break;
        snprintf(names[n++], pl, "%s/%s", path, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n; i++) {
        check_bundle(names[i], cpu, gpu);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv) {
    int first = 1;
    if (argc > 1 && !strcmp(argv[1], "--cpu")) cpu_mode = true, first = 2;
    if (argc <= first) {
        fprintf(stderr, "usage: gpu_capture [--cpu] DIR|FILE...\n");
        return 2;
    }
    setenv("DJ_TEST_SEED", "1", 0); /* a fixed draw unless one is asked for */
    dj_test_seed();
    dj_backend_t *cpu = NULL, *gpu = NULL;
    if (dj_backend_cpu_new(0, &cpu) != DJ_OK) return 2;
#ifdef DJ_HAVE_CUDA
    const bool no_gpu = cpu_mode ? dj_backend_cpu_new(0, &gpu) != DJ_OK
                                 : dj_cuda_device_count() < 1 || dj_backend_cuda_new(0, &gpu) != DJ_OK;
#else
    const bool no_gpu = !cpu_mode || dj_backend_cpu_new(0, &gpu) != DJ_OK; /* a build without CUDA: --cpu only */
#endif
    if (no_gpu) {
        fprintf(stderr, "gpu_capture: no GPU (%s)\n", dj_last_error());
        dj_backend_free(cpu);
        return 2;
    }
    for (int i = first; i < argc; i++) check_path(argv[i], cpu, gpu);
    printf("ops run on the GPU:");
    int seen = 0;
    for (int k = 0; k < DJ_COP_COUNT; k++)
        if (seen_gpu[k]) printf(" %s", dj__cop_names[k]), seen++;
    printf("\nops refused on the GPU (no kernel):");
    for (int k = 0; k < DJ_COP_COUNT; k++)
        if (refused_op[k]) printf(" %s", dj__cop_names[k]);
    printf("\nops no bundle ran:");
    for (int k = 0; k < DJ_COP_COUNT; k++)
        if (!seen_gpu[k] && !refused_op[k]) printf(" %s", dj__cop_names[k]);
    printf("\ncapture checks: %d passed, %d failed, %d refused by name; %d of %d ops run on the GPU\n", n_pass, n_fail,
           n_refused, seen, (int)DJ_COP_COUNT);
    dj_backend_free(gpu);
    dj_backend_free(cpu);
    return n_fail || !n_pass ? 1 : 0;
}
