/* engine.c: the embedded engine - made over a backend, its VMU and KV store,
 * and executing planned steps with every activation on the stack segment
 * (models are loaded in engine_load.c, sessions made in session.c). */
#include "djinn/engine.h"
#include "djinn/alloc.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "djinn/op_table.h"
#include "djinn/sampler.h"
#include "core/switches.h"
#include "exec/engine_impl.h"
#include "exec/lora_impl.h"
#include "exec/stream_impl.h"

#ifdef DJ_HAVE_CUDA
#include "djinn/dj_cuda.h"
#endif

#define DJ_PLAN_CACHE_ENTRIES 64
#define DJ_MAX_BATCH 1024  /* sessions in one decode step */
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

/* ---- engine ---- */

/* ---- memory sized from the machine ---- */

dj_status dj_host_mem_available(size_t *bytes) {
    *bytes = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb = 0;
        bool found = false;
        while (!found && fgets(line, sizeof line, f))
            found = sscanf(line, "MemAvailable: %llu kB", &kb) == 1;
        fclose(f);
        if (found && kb > 0 && kb <= SIZE_MAX / 1024) {
            *bytes = (size_t)kb * 1024;
            return DJ_OK;
        }
    }
#ifdef _SC_AVPHYS_PAGES
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (unsigned long)pages <= SIZE_MAX / (unsigned long)page) {
        *bytes = (size_t)pages * (size_t)page;
        return DJ_OK;
    }
#endif
    return dj_fail(DJ_EUNSUPPORTED, "available host memory unknown: no MemAvailable in /proc/meminfo and no "
                                    "sysconf(_SC_AVPHYS_PAGES)");
}

size_t dj_engine_vmu_auto_bytes(size_t dev_free, size_t dev_total, size_t host_avail) {
    size_t v;
    if (dev_total) {
        const size_t margin = dev_total / 20 > GIB ? dev_total / 20 : GIB;
        v = dev_free > margin ? dev_free - margin : 0;
    } else {
        v = host_avail / 2;
    }
    return v / MIB * MIB;
}

size_t dj_engine_swap_default_bytes(const dj_engine_t *e) {
    size_t host = 0;
    if (dj_host_mem_available(&host) != DJ_OK) return 0;
    const size_t v = e->be->host_memory ? host / 4 : host / 2;
    return v / MIB * MIB;
}

/* cfg->total_bytes 0: the VMU sized from the machine (dj_engine_vmu_auto_bytes). */
static dj_status vmu_auto(dj_backend_t *be, dj_vmu_config *cfg) {
    size_t dev_free = 0, dev_total = 0, host = 0;
    dj_status st = DJ_OK;
    if (be->vt->mem_info) st = be->vt->mem_info(be, &dev_free, &dev_total);
    else if (be->host_memory) st = dj_host_mem_available(&host);
    else return dj_fail(DJ_EUNSUPPORTED, "VMU size 0: the %s backend cannot say how much memory it has; give a size",
                        be->vt->name);
    if (st != DJ_OK) return st;
    cfg->total_bytes = dj_engine_vmu_auto_bytes(dev_free, dev_total, host);
    if (cfg->total_bytes == 0)
        return dj_fail(DJ_ENOSPC, "VMU size 0: the %s backend has too little memory to size one from (%zu of %zu "
                       "device bytes free, %zu host bytes available)", be->vt->name, dev_free, dev_total, host);
    if (cfg->text_frac == 0.0 && cfg->data_frac == 0.0 && cfg->stack_frac == 0.0) {
        const size_t page = cfg->page_bytes, total = cfg->total_bytes;
        dj_vmu_config_default(cfg, total);
        if (page) cfg->page_bytes = page;
    } else if (cfg->page_bytes == 0) {
        cfg->page_bytes = 64 * 1024;
    }
    DJ_LOG(INFO, "VMU sized from the machine: %.2f GiB (%s)", (double)cfg->total_bytes / (1024.0 * 1024.0 * 1024.0),
           dev_total ? "device free memory less a margin" : "half the available host memory");
    return DJ_OK;
}

dj_status dj_kv_dtype_parse(const char *name, bool gpu, dj_dtype *out) {
    if (!name || !*name || strcmp(name, "auto") == 0) *out = gpu ? DJ_DTYPE_BF16 : DJ_DTYPE_F32;
    else if (strcmp(name, "fp8") == 0 || strcmp(name, "f8_e4m3") == 0) *out = DJ_DTYPE_F8_E4M3;
    else if (strcmp(name, "bf16") == 0 && gpu) *out = DJ_DTYPE_BF16;
    else if (strcmp(name, "f32") == 0 && !gpu) *out = DJ_DTYPE_F32;
    else
        return dj_fail(DJ_EINVAL, "KV dtype '%s' on the %s: 'auto' (%s), 'fp8' or '%s'", name, gpu ? "GPU" : "CPU",
                       gpu ? "bf16" : "f32", gpu ? "bf16" : "f32");
    return DJ_OK;
}

static dj_status kv_dtype_apply(dj_backend_t *be, const char *name) {
    dj_dtype t;
    const dj_status st = dj_kv_dtype_parse(name, !be->host_memory, &t);
    return st != DJ_OK ? st : dj_backend_set_kv_dtype(be, t);
}

dj_status dj_engine_new(const dj_engine_config *cfg, dj_engine_t **out) {
    *out = NULL;
    const bool cpu = !cfg->device || strcmp(cfg->device, "cpu") == 0;
    int gpu = -1; /* "cuda" or "cuda:N" */
#ifdef DJ_HAVE_CUDA
    if (!cpu && strncmp(cfg->device, "cuda", 4) == 0) {
        char *end = NULL;
        const char *d = cfg->device + 4;
        long v = *d == ':' ? strtol(d + 1, &end, 10) : 0;
        if ((*d == '\0' || (end && end != d + 1 && *end == '\0')) && v >= 0 && v <= INT_MAX) gpu = (int)v;
    }
#endif
    if (!cpu && gpu < 0)
        return dj_fail(DJ_EUNSUPPORTED, "device '%s' is not available in this build (%s)", cfg->device,
#ifdef DJ_HAVE_CUDA
                       "'cpu', 'cuda' or 'cuda:N'"
#else
                       "only 'cpu'"
#endif
        );
    dj_engine_t *e = dj_calloc(1, sizeof *e);
    if (!e) return dj_fail(DJ_ENOMEM, "out of memory");
    dj_status st = DJ_OK;
#ifdef DJ_HAVE_CUDA
    if (gpu >= 0) st = dj_backend_cuda_new(gpu, &e->be);
    else
#endif
        st = dj_backend_cpu_new(cfg->n_threads, &e->be);
    if (st != DJ_OK) goto fail;
    e->be->deterministic = cfg->deterministic;
    if ((st = kv_dtype_apply(e->be, cfg->kv_dtype)) != DJ_OK) goto fail;
    {
        dj_vmu_config vc = cfg->vmu;
        if (vc.total_bytes == 0 && (st = vmu_auto(e->be, &vc)) != DJ_OK) goto fail;
        /* f8 K/V: a power-of-two page keeps every position its codes hold, the exponents past them */
        if (e->be->kv_dtype == DJ_DTYPE_F8_E4M3 && vc.page_bytes && !(vc.page_bytes & (vc.page_bytes - 1)))
            vc.page_bytes += DJ_KV_F8_PAGE_EXTRA;
        st = dj_vmu_new(e->be, &vc, &e->vmu);
    }
    if (st != DJ_OK) goto fail;
    st = dj_plan_cache_new(DJ_PLAN_CACHE_ENTRIES, &e->plans);
    if (st != DJ_OK) goto fail;
    e->max_step = cfg->max_step_tokens ? cfg->max_step_tokens : 512;
    e->prefetch = !cfg->no_prefetch;
    e->host_layers = cfg->host_layers;
    e->host_share = cfg->host_share;
    if (!(cfg->host_share >= 0.0 && cfg->host_share <= 1.0)) {
        st = dj_fail(DJ_EINVAL, "engine: host_share %g (want 0: from measured rates, or a share in (0, 1])",
                     cfg->host_share);
        goto fail;
    }
    if ((st = dj__kv_new(e->be, e->vmu, cfg->no_prefix_cache, &e->kv)) != DJ_OK) goto fail;
    {
        /* the engine's switches (src/core/switches.h), read once, here */
        e->profile = dj_switch_read(DJ_SW_PROFILE) == 1;
        e->device_sampling = dj_switch_read(DJ_SW_DEVICE_SAMPLING) == 1;
        e->weights_in_place = dj_switch_read(DJ_SW_WEIGHTS_IN_PLACE) == 1;
        e->no_graphs = dj_switch_read(DJ_SW_NO_GRAPHS) == 1;
    }
    *out = e;
    return DJ_OK;
fail:
    dj_engine_free(e);
    return st;
}

static void trace_area_free(dj_engine_t *e);

static void free_graphs(dj_engine_t *e) {
    for (int i = 0; i < DJ_STEP_GRAPHS; i++) {
        if (e->graphs[i].graph) e->be->vt->graph_free(e->be, e->graphs[i].graph);
        memset(&e->graphs[i], 0, sizeof e->graphs[i]);
    }
}

static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void prof_add(dj_engine_t *e, dj_phase phase, const char *node_name, double sec) {
    const char *op = node_name;
    if (op[0] == 'l' && strchr(op, '.')) op = strchr(op, '.') + 1; /* "l12.q_proj" -> "q_proj" */
    char name[sizeof e->prof[0].name];
    snprintf(name, sizeof name, "%s %s", phase == DJ_PHASE_PREFILL ? "prefill" : "decode", op);
    int i = 0;
    while (i < e->n_prof && strcmp(e->prof[i].name, name) != 0) i++;
    if (i == e->n_prof) {
        if (i == DJ_PROF_NAMES) return;
        snprintf(e->prof[i].name, sizeof e->prof[i].name, "%s", name);
        e->n_prof++;
    }
    e->prof[i].calls++;
    e->prof[i].sec += sec;
}

static int prof_cmp(const void *a, const void *b) {
    const double x = ((const prof_entry *)a)->sec, y = ((const prof_entry *)b)->sec;
    return x < y ? 1 : x > y ? -1 : 0;
}

static void prof_report(dj_engine_t *e) {
    double total = 0.0;
    for (int i = 0; i < e->n_prof; i++) total += e->prof[i].sec;
    if (total <= 0.0) return;
    qsort(e->prof, (size_t)e->n_prof, sizeof e->prof[0], prof_cmp);
    fprintf(stderr, "DJINN_PROFILE (%s backend; each op synced, unfused): %.3f ms in all\n", e->be->vt->name,
            total * 1e3);
    fprintf(stderr, "  %-28s %10s %12s %12s %7s\n", "op", "calls", "total ms", "us/call", "share");
    for (int i = 0; i < e->n_prof; i++) {
        const prof_entry *p = &e->prof[i];
        fprintf(stderr, "  %-28s %10llu %12.3f %12.2f %6.1f%%\n", p->name, (unsigned long long)p->calls, p->sec * 1e3,
                p->sec * 1e6 / (double)p->calls, 100.0 * p->sec / total);
    }
}

void dj_engine_free(dj_engine_t *e) {
    if (!e) return;
    if (e->profile) prof_report(e);
    if (e->be) {
        free_graphs(e);
        if (e->args_dev) e->be->vt->free(e->be, e->args_dev);
    }
    trace_area_free(e);
    free(e->args_host);
    free(e->host_logits);
    free(e->calls);
    dj__lora_step_free(e->lora);
    free(e->sample_rows);
    dj__kv_free(e->kv); /* waits for swap transfers still in flight */
    dj_plan_cache_free(e->plans);
    dj_vmu_free(e->vmu); /* evicts cached models: their dtors free the host structs */
    dj_backend_free(e->be);
    free(e);
}

/* Host bytes to device memory, ordered with compute (no wait where the
 * backend can stage them). */
static dj_status upload_now(dj_engine_t *e, void *dst, const void *src, size_t bytes) {
    if (e->be->vt->upload_async) return e->be->vt->upload_async(e->be, dst, src, bytes);
    return e->be->vt->upload(e->be, dst, src, bytes);
}

static size_t align8(size_t x) { return (x + 7) & ~(size_t)7; }

/* Step-args buffers large enough for B rows of n_layers; offsets for B. A
 * buffer that moves invalidates every recorded graph. */
static dj_status ensure_args(dj_engine_t *e, uint32_t B, uint32_t n_layers) {
    const size_t a4 = align8((size_t)B * sizeof(int32_t));
    const size_t need = 3 * a4 + (size_t)(n_layers + 1) * B * sizeof(void *);
    if (need > e->args_cap) {
        size_t cap = e->args_cap * 2 > need ? e->args_cap * 2 : need;
        if (cap < 4096) cap = 4096;
        free_graphs(e);
        if (e->args_dev) e->be->vt->free(e->be, e->args_dev);
        free(e->args_host);
        e->args_dev = e->args_host = NULL;
        e->args_cap = 0;
        void *d = NULL;
        dj_status st = e->be->vt->alloc(e->be, cap, &d);
        if (st != DJ_OK) return st;
        e->args_dev = d;
        e->args_host = dj_malloc(cap);
        if (!e->args_host) return dj_fail(DJ_ENOMEM, "out of memory for %zu bytes of step arguments", cap);
        e->args_cap = cap;
    }
    e->off_pos = a4;
    e->off_next = 2 * a4;
    e->off_freq = 3 * a4;
    e->off_tables = 3 * a4 + (size_t)B * sizeof(void *);
    e->args_next = (int32_t *)(void *)(e->args_dev + e->off_next);
    return DJ_OK;
}

static void trace_area_free(dj_engine_t *e) {
    if (e->trace_dev) e->be->vt->free(e->be, e->trace_dev);
    if (e->trace_pinned) e->be->vt->host_free(e->be, e->trace_host);
    else free(e->trace_host);
    e->trace_dev = e->trace_host = NULL;
    e->trace_pinned = false;
    e->trace_cap = 0;
}

dj_status dj__engine_trace_area(dj_engine_t *e, size_t bytes, uint8_t **dev, uint8_t **host, bool *pinned) {
    *dev = *host = NULL;
    *pinned = false;
    if (bytes > e->trace_cap) {
        size_t cap = e->trace_cap * 2 > bytes ? e->trace_cap * 2 : bytes;
        if (cap < 4096) cap = 4096;
        free_graphs(e); /* recorded traced steps write the old buffer */
        trace_area_free(e);
        void *d = NULL, *h = NULL;
        dj_status st = e->be->vt->alloc(e->be, cap, &d);
        if (st != DJ_OK) return st;
        e->trace_dev = d;
        if (e->be->vt->host_alloc && e->be->vt->host_free && e->be->vt->host_alloc(e->be, cap, &h) == DJ_OK) {
            e->trace_pinned = true;
        } else if (!(h = dj_malloc(cap))) {
            trace_area_free(e);
            return dj_fail(DJ_ENOMEM, "out of host memory for %zu bytes of saved activations", cap);
        }
        e->trace_host = h;
        e->trace_cap = cap;
    }
    *dev = e->trace_dev;
    *host = e->trace_host;
    *pinned = e->trace_pinned;
    return DJ_OK;
}

dj_vmu_t *dj_engine_vmu(dj_engine_t *e) { return e->vmu; }
dj_backend_t *dj_engine_backend(dj_engine_t *e) { return e->be; }

/* ---- execution ---- */

/* Decode plans (one token per row, every row its own sequence, logits of
 * every row) and prefill plans share the cache: decode keys carry the top bit. */
#define DECODE_KEY (1u << 31)
/* Prefill plans that output every row's logits carry this bit. */
#define ALL_LOGITS_KEY (1u << 30)
#define MIXED_KEY (3u << 30) /* | rows << 11 | output rows */

/* The plan of a step: prefill buckets, decode rows, or (out_rows > 0) a
 * decode-phase step of n rows whose logits are those of its last out_rows
 * rows (prompt chunks beside decode rows). */
static dj_status get_plan(dj_engine_t *e, const dj_model_t *m, dj_phase phase, uint32_t n, unsigned flags,
                          uint32_t out_rows, dj_graph_t **out) {
    const uint32_t bucket = phase == DJ_PHASE_DECODE ? n : dj_shape_bucket(phase, n, e->max_step);
    if (out_rows && (n >= (1u << 19) || out_rows >= (1u << 11)))
        return dj_fail(DJ_EINVAL, "a mixed step of %u rows and %u outputs is too large", n, out_rows);
    const uint32_t key = out_rows                        ? MIXED_KEY | n << 11 | out_rows
                         : phase == DJ_PHASE_DECODE      ? DECODE_KEY | n
                         : (flags & DJ_GRAPH_ALL_LOGITS) ? ALL_LOGITS_KEY | bucket
                                                         : bucket;
    dj_graph_t *g = dj_plan_cache_get(e->plans, m->fingerprint, key);
    if (g) {
        *out = g;
        return DJ_OK;
    }
    dj_status st = dj__model_build_graph_out(&m->cfg, m, phase, bucket, flags, out_rows, &g);
    if (st != DJ_OK) return st;
    size_t peak = 0;
    st = dj_graph_plan(g, &peak);
    if (st == DJ_OK) st = dj_plan_cache_put(e->plans, m->fingerprint, key, g);
    if (st != DJ_OK) {
        dj_graph_free(g);
        return st;
    }
    *out = g;
    return DJ_OK;
}

static const void *node_ptr(const dj_model_t *m, const dj_graph_t *g, int idx, uint8_t *stack) {
    if (idx < 0) return NULL;
    const dj_node *nd = dj_graph_node_c(g, idx);
    switch (nd->res) {
    case DJ_RES_WEIGHT: return nd->data ? nd->data : m->w[nd->weight_slot].data;
    case DJ_RES_ACTIVATION:
    case DJ_RES_OUTPUT: return stack + nd->offset;
    default: return NULL;
    }
}

/* longrope's long-factor RoPE table (text segment), NULL for other models. */
static const float *rope_long_table(const dj_model_t *m) {
    return m->cfg.rope_type == DJ_ROPE_LONGROPE ? m->w[dj__wslot_global(&m->cfg, DJ_W_INV_FREQ_LONG)].data : NULL;
}

static dj_dtype node_dtype(const dj_graph_t *g, int idx) {
    return idx < 0 ? DJ_DTYPE_F32 : dj_graph_node_c(g, idx)->dtype;
}

/* The element type an op node's output has on this backend (the op table's
 * out): f32 logits and router weights, the residual stream (EMBED, ADD) in
 * res_dtype, every other activation in act_dtype. The plan sized every activation for f32, so all of them fit. */
static dj_dtype exec_dtype(const dj_backend_t *be, const dj_node *nd) {
    const dj_op_desc *d = dj_op_desc_of(nd->op); /* NULL: an input or weight */
    if (nd->res == DJ_RES_OUTPUT || (d && d->out == DJ_OPD_OUT_F32)) return DJ_DTYPE_F32;
    return d && d->out == DJ_OPD_OUT_RES ? be->res_dtype : be->act_dtype;
}
_Static_assert(DJ_OPD_MAX_SRC == DJ_GRAPH_MAX_SRC, "the op table maps every node source");

static dj_dtype src_dtype(const dj_backend_t *be, const dj_graph_t *g, int idx) {
    return idx < 0 ? be->act_dtype : exec_dtype(be, dj_graph_node_c(g, idx));
}

dj_dtype dj__engine_node_dtype(const dj_engine_t *e, const dj_graph_t *g, int i) {
    return exec_dtype(e->be, dj_graph_node_c(g, i));
}

/* What one step reads besides the plan: rows at consecutive positions of one
 * session (prefill: pos0, host ids), or rows each at its own position and
 * session (decode: everything in the step-args buffer, device memory). */
typedef struct step_io {
    uint32_t n;                         /* token rows */
    uint32_t pos0;                      /* without row_pos */
    const int32_t *ids;                 /* host [n], or NULL */
    const int32_t *ids_dev;             /* device [n] when ids is NULL */
    const uint32_t *row_pos;            /* device [n] or NULL */
    const uint32_t *const *row_tables;  /* device [n_layers][n] or NULL */
    const float *const *row_freq;       /* device [n]: each row's RoPE table (models with longrope's
                                         * long one), or NULL: s's */
    const dj_session_t *s;              /* K/V layout (and its tables without row_tables) */
    uint32_t pos_bound;                 /* ATTENTION's pos_bound: the backend's short_pos when every
                                         * row lies below it, else 0 */
    bool decode_only;                   /* ATTENTION's decode_only: one token a session */
    dj__lora_step *lora;                /* the rows' adapters (lora.c), NULL: no row has one */
} step_io;

/* io->lora for a step of B sessions (n_tok as decode_rows'): the engine's
 * step table filled, or NULL when no session has an adapter. */
static dj_status lora_prepare(dj_engine_t *e, const dj_graph_t *g, dj_session_t *const *ss, const uint32_t *n_tok,
                              uint32_t B, uint32_t rows, dj__lora_step **out) {
    *out = NULL;
    bool any = false;
    for (uint32_t r = 0; r < B; r++) any |= ss[r]->n_lora > 0;
    if (!any) return DJ_OK;
    if (!e->lora && !(e->lora = dj_calloc(1, sizeof *e->lora)))
        return dj_fail(DJ_ENOMEM, "out of memory for a step's adapters");
    dj_status st = dj__lora_step_prepare(e->lora, ss, n_tok, B, rows, (size_t)dj_graph_count(g), &any);
    if (st == DJ_OK && any) *out = e->lora;
    return st;
}

/* A streaming model's step goes to the backend whole, with its stream: op by
 * op profiling, or a traced step's segments (a layer's readers split between
 * two of them), would leave loads half read, so both are refused. */
static dj_status stream_refuse(const dj_model_t *m, bool profile) {
    return dj_fail(DJ_EUNSUPPORTED, "%s model %s: it streams %u of its layers through the weight ring",
                   profile ? "$DJINN_PROFILE cannot profile" : "a traced step (saved or changed points) cannot run on",
                   m->name, m->stream->pl.n_streamed);
}

/* dj_op_call.out_rows of a MATMUL node's call of n rows: the rows of m
 * values of out_dtype its buffer holds - the graph sizes activations as f32,
 * so a bf16 backend's buffer holds twice its rows, and a prefill bucket more
 * rows than its step's - or 0 (n) where that is not more than n. */
static uint32_t out_rows_of(const dj_node *nd, uint32_t m, dj_dtype out_dtype, uint32_t n) {
    const size_t row = (size_t)m * dj_dtype_size(out_dtype);
    if ((nd->res != DJ_RES_ACTIVATION && nd->res != DJ_RES_OUTPUT) || !row) return 0;
    const size_t rows = nd->size / row;
    return rows <= n ? 0 : rows > UINT32_MAX ? UINT32_MAX : (uint32_t)rows;
}

/* Fills the call of op node i (its params, with op, n, pos0, out, out_dtype
 * and x_dtype set): the node's sources become call fields as the op table
 * says (include/djinn/op_table.h), then the step's per-row arguments, then
 * what is one op's own. DJ_EINTERNAL where a source has an element type the
 * op does not read. */
static dj_status resolve_call(const dj_engine_t *e, const dj_model_t *m, const dj_graph_t *g, const step_io *io,
                              uint8_t *stack, int i, dj_op_call *call) {
    const dj_node *nd = dj_graph_node_c(g, i);
    const dj_op_desc *d = dj_op_desc_of(nd->op);
    const dj_dtype act = e->be->act_dtype;
    /* x: act_dtype, except the residual stream's readers (either) and the logits' (f32); x2: act_dtype */
    bool types_ok = d->x == DJ_OPD_X_NONE || d->x == DJ_OPD_X_RES ||
                    call->x_dtype == (d->x == DJ_OPD_X_F32 ? DJ_DTYPE_F32 : act);
    for (int k = 0; k < d->n_src; k++)
        if (d->src[k] == DJ_OPD_SRC_X2) types_ok &= src_dtype(e->be, g, nd->src[k]) == act;
    if (!types_ok)
        return dj_fail(DJ_EINTERNAL, "node %d (%s) reads the residual stream where the backend takes only %s", i,
                       nd->name, dj_dtype_name(act));
    for (int k = 0; k < d->n_src; k++) {
        const int s = nd->src[k];
        const void *p = node_ptr(m, g, s, stack);
        switch ((dj_opd_src)d->src[k]) {
        case DJ_OPD_SRC_NONE:
        case DJ_OPD_SRC_AFTER: break;
        case DJ_OPD_SRC_IDS:
            call->ids = io->ids;
            call->ids_dev = io->ids_dev;
            break;
        case DJ_OPD_SRC_X: call->x = p; break;
        case DJ_OPD_SRC_X2: call->x2 = p; break;
        case DJ_OPD_SRC_W:
            call->w = p;
            call->w_dtype = node_dtype(g, s);
            if (call->w_dtype == DJ_DTYPE_F8_E4M3) { /* its scales, beside it in the slot */
                const dj_weight *ws = &m->w[dj_graph_node_c(g, s)->weight_slot];
                call->w_scale = ws->scale;
                call->w_block_rows = ws->block[0];
                call->w_block_cols = ws->block[1];
            }
            break;
        case DJ_OPD_SRC_BIAS:
            call->bias = p;
            call->bias_dtype = node_dtype(g, s);
            break;
        case DJ_OPD_SRC_INV_FREQ: call->inv_freq = p; break;
        case DJ_OPD_SRC_ROUTE: call->route = p; break;
        }
    }
    if (d->flags & DJ_OPD_ROW_POS) call->row_pos = io->row_pos;
    if (d->flags & DJ_OPD_KV) {
        call->kv = &io->s->kv[nd->layer];
        call->row_tables = io->row_tables ? io->row_tables + (size_t)nd->layer * io->n : NULL;
    }
    if ((d->flags & DJ_OPD_LAST_ROW) && (nd->flags & DJ_NODE_LAST_ROW)) { /* the last shape[0] rows */
        const uint32_t rows = (uint32_t)nd->shape[0];
        if (nd->op == DJ_OP_MATMUL) /* of its x; SOFTCAP's x (the logits) holds only those */
            call->x = (const uint8_t *)call->x + (size_t)(io->n - rows) * call->k * dj_dtype_size(act);
        call->n = rows;
    }
    /* what is one op's own */
    if (nd->op == DJ_OP_MATMUL) call->out_rows = out_rows_of(nd, call->m, call->out_dtype, call->n);
    if (nd->op == DJ_OP_ROPE &&
        dj_graph_node_c(g, nd->src[1])->weight_slot == dj__wslot_global(&m->cfg, DJ_W_INV_FREQ)) {
        /* the model's own RoPE (not Gemma 3's local one): longrope's long factors per session */
        if (io->row_freq) call->row_freq = io->row_freq;
        else if (io->s->rope_long) call->inv_freq = rope_long_table(m);
    }
    if (nd->op == DJ_OP_ATTENTION) {
        call->pos_bound = io->pos_bound;
        call->decode_only = io->decode_only;
    }
    if (nd->op == DJ_OP_MOE_FFN) { /* up and down: the two slots after the gate's */
        call->w_up = m->w[nd->weight_slot + DJ_W_EXPERT_UP].data;
        call->w_down = m->w[nd->weight_slot + DJ_W_EXPERT_DOWN].data;
    }
    return DJ_OK;
}

/* Enqueue every node of the plan; *out_idx receives the output node. With
 * a hook (intervene.c; NULL on every ordinary step) the plan goes to the
 * backend in segments ending at the hook's stops, the hook running after
 * each. */
/* first, first_stop: a resumed breakpoint step starts at node `first` with
 * the hook's stops[first_stop] next (0, 0 otherwise); a stop whose `at`
 * sets hook->pause ends it there (held->stop, held->node say where). */
static dj_status run_nodes(dj_engine_t *e, const dj_model_t *m, const dj_graph_t *g, const step_io *io,
                           uint8_t *stack, int *out_idx, bool recording, dj__step_hook *hook, int first,
                           int first_stop) {
    const uint32_t n = io->n;
    const bool profile = e->profile && !recording;
    dj_status st = profile ? e->be->vt->sync(e->be) : DJ_OK; /* earlier work is not the first op's */
    const int count = dj_graph_count(g);
    const size_t cap = (size_t)count * (io->lora ? 1 + io->lora->levels : 1); /* LORA calls after MATMULs */
    if (cap > e->calls_cap) {
        dj_op_call *p = dj_realloc(e->calls, cap * sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "out of memory for a step of %d calls", count);
        e->calls = p;
        e->calls_cap = cap;
    }
    size_t n_calls = 0;
    int next_stop = first_stop, seg_first = first; /* the hook's next stop; the node opening the segment */
    dj_model_stream *ms = m->stream;
    if (ms && st == DJ_OK) st = profile || hook ? stream_refuse(m, profile) : dj__stream_reserve(ms, (size_t)count);
    for (int i = first; i < count && st == DJ_OK; i++) {
        const dj_node *nd = dj_graph_node_c(g, i);
        if (nd->op >= DJ_OP_COUNT) continue; /* inputs and weights */
        dj_op_call call = nd->params;
        call.op = nd->op;
        call.n = n;
        call.pos0 = io->pos0;
        call.out = nd->res == DJ_RES_KV ? NULL : stack + nd->offset;
        call.out_dtype = exec_dtype(e->be, nd);
        call.x_dtype = src_dtype(e->be, g, nd->src[0]);
        st = resolve_call(e, m, g, io, stack, i, &call);
        if (st != DJ_OK) continue;
        if (nd->res == DJ_RES_OUTPUT) *out_idx = i;
        dj_op_call lcall[DJ_LORA_STACK_MAX]; /* the adapters' low-rank updates of a MATMUL's output, after it */
        const uint32_t n_lora = io->lora && nd->op == DJ_OP_MATMUL && !ms
                                    ? dj__lora_calls(io->lora, dj_graph_node_c(g, nd->src[1])->weight_slot, &call, lcall)
                                    : 0;
        if (!profile) { /* the whole step goes to the backend at once, below */
            if (ms) {
                ms->call_load[n_calls] = dj__stream_call_load(ms, &call, nd->layer);
                ms->call_layer[n_calls] = nd->layer;
            }
            e->calls[n_calls++] = call;
            for (uint32_t k = 0; k < n_lora; k++) e->calls[n_calls++] = lcall[k];
        } else { /* profiling: op by op, unfused, each timed to its end */
            const double t0 = prof_now();
            st = dj_backend_compute(e->be, &call);
            for (uint32_t k = 0; k < n_lora && st == DJ_OK; k++) st = dj_backend_compute(e->be, &lcall[k]);
            if (st == DJ_OK) {
                st = e->be->vt->sync(e->be);
                prof_add(e, dj_graph_phase(g), nd->name, prof_now() - t0);
            }
        }
        if (hook && next_stop < hook->n_stops && hook->stops[next_stop] == i && st == DJ_OK) {
            /* a segment ends here: each segment's decisions kept under its first node */
            if (n_calls) st = dj_backend_compute_plan(e->be, e->calls, n_calls, dj_graph_node_c(g, seg_first));
            n_calls = 0;
            seg_first = i + 1;
            if (st == DJ_OK) st = hook->at(hook->user, e, g, i, stack + nd->offset, call.out_dtype, n);
            if (st == DJ_OK && hook->pause && hook->held) { /* a breakpoint: the step stops here */
                hook->held->stop = next_stop;
                hook->held->node = i;
                return DJ_OK;
            }
            next_stop++;
        }
    }
    if (st == DJ_OK && n_calls && ms) {
        dj_stream_step ss;
        if ((st = dj__stream_host_runs(ms, e->calls, n_calls, n)) != DJ_OK) return st;
        dj__stream_step(ms, e->prefetch, &ss);
        st = e->be->vt->compute_plan(e->be, e->calls, n_calls, g, &ss);
    } else if (st == DJ_OK && n_calls) {
        st = dj_backend_compute_plan(e->be, e->calls, n_calls, hook ? (const void *)dj_graph_node_c(g, seg_first) : g);
    }
    return st;
}

/* Greedy and unpenalised: the argmax of the raw logits. */
static bool is_greedy(const dj_sampler_params *sp) {
    return !sp || (sp->temperature == 0.0f && (sp->repetition_penalty == 0.0f || sp->repetition_penalty == 1.0f) &&
                   sp->frequency_penalty == 0.0f && sp->presence_penalty == 0.0f);
}

static dj_status check_sampler(const dj_sampler_params *sp) { return sp ? dj_sampler_params_check(sp) : DJ_OK; }

static dj_status host_logits(dj_engine_t *e, size_t floats, float **out) {
    if (floats > e->host_logits_cap) {
        float *p = dj_realloc(e->host_logits, floats * sizeof *p);
        if (!p) return dj_fail(DJ_ENOMEM, "out of memory for %zu logits", floats);
        e->host_logits = p;
        e->host_logits_cap = floats;
    }
    *out = e->host_logits;
    return DJ_OK;
}

/* The session's host sampler for sp (a new one, seeded from sp->seed, when
 * the params changed). */
static dj_status session_sampler(dj_session_t *s, const dj_sampler_params *sp, uint32_t V) {
    if (s->sampler && memcmp(&s->sp, sp, sizeof *sp) == 0) return DJ_OK;
    dj_sampler_free(s->sampler);
    s->sampler = NULL;
    dj_status st = dj_sampler_new(sp, V, &s->sampler);
    if (st == DJ_OK) s->sp = *sp;
    return st;
}

/* Row r's sampler: the caller's samplers[r], else session r's for sp; NULL
 * for a greedy row. */
static dj_status row_sampler(dj_session_t *s, const dj_sampler_params *sp, dj_sampler_t *const *samplers, uint32_t r,
                             uint32_t V, dj_sampler_t **out) {
    *out = NULL;
    if (samplers) { /* NULL (no pick) rows count as greedy here */
        if (samplers[r] && !dj_sampler_is_greedy(samplers[r]))
            *out = samplers[r];
        return DJ_OK;
    }
    if (is_greedy(sp))
        return DJ_OK;
    dj_status st = session_sampler(s, sp, V);
    if (st == DJ_OK)
        *out = s->sampler;
    return st;
}

/* After a pick on the device: the rows whose sampler asks for logprobs come
 * to the host one by one (only those) and are recorded. */
static dj_status device_logprobs(dj_engine_t *e, const float *out_dev, uint32_t B, uint32_t V,
                                 dj_sampler_t *const *samplers, const int32_t *next) {
    for (uint32_t r = 0; samplers && r < B; r++) {
        if (!samplers[r] || !dj_sampler_wants_logprobs(samplers[r])) continue;
        float *row = NULL;
        dj_status st = host_logits(e, V, &row);
        if (st == DJ_OK) st = e->be->vt->download(e->be, row, out_dev + (size_t)r * V, (size_t)V * sizeof(float));
        if (st != DJ_OK) return st;
        dj_sampler_note_logprobs(samplers[r], row, next[r]);
    }
    return DJ_OK;
}

/* After the step's ops: the logits of its B output rows (`out_dev`,
 * [B][vocab] f32) to the caller and/or the next token of each row, picked by
 * the caller's samplers (one per row) or else each session's sampler for sp.
 * Picks on the device where the backend can: greedy rows by argmax, the
 * others by the sample hook (unless $DJINN_DEVICE_SAMPLING=off) with each row
 * sampler's own next uniform draw - the same rule and draw as on the host (a
 * draw is spent even if the step then fails on the device). Otherwise the
 * logits come to the host and each row's sampler picks. */
static dj_status finish(dj_engine_t *e, dj_session_t *const *ss, uint32_t B, const float *out_dev, float *logits,
                        const dj_sampler_params *sp, dj_sampler_t *const *samplers, int32_t *next) {
    const uint32_t V = ss[0]->model->cfg.vocab_size;
    dj_status st = DJ_OK;
    bool all_greedy = !samplers && is_greedy(sp), masked = false, masked_lp = false;
    bool carried = !sp || dj_sample_row_carries(sp); /* every row's rule fits a dj_sample_row */
    if (samplers) { /* a NULL sampler: that row picks nothing (next -1) */
        all_greedy = true;
        carried = true;
        for (uint32_t r = 0; r < B; r++) {
            const bool m = samplers[r] && dj_sampler_masked(samplers[r]);
            all_greedy = all_greedy && (!samplers[r] || dj_sampler_is_greedy(samplers[r]));
            carried = carried && (!samplers[r] || dj_sample_row_carries(dj_sampler_params_of(samplers[r])));
            masked = masked || m;
            masked_lp = masked_lp || (m && dj_sampler_wants_logprobs(samplers[r]));
        }
    }
    /* Masks and logit biases on the device (the backend's mask hook), in
     * place: only when the caller takes no logits and no masked row wants
     * logprobs (those come from the raw row); else those rows pick on the host. */
    if (masked && next && !logits && !masked_lp && e->be->vt->mask && e->device_sampling) {
        dj_mask_row *mr = dj_calloc(B, sizeof *mr);
        if (!mr) return dj_fail(DJ_ENOMEM, "out of memory for %u mask rows", B);
        for (uint32_t r = 0; r < B; r++)
            if (samplers[r] && dj_sampler_masked(samplers[r])) {
                mr[r].allowed = dj_sampler_allowed(samplers[r]);
                mr[r].bias = dj_sampler_bias(samplers[r], &mr[r].n_bias);
            }
        st = e->be->vt->mask(e->be, (float *)out_dev, B, V, mr); /* the step's own output rows */
        free(mr);
        if (st != DJ_OK) return st;
        masked = false;
        all_greedy = true;
        for (uint32_t r = 0; r < B; r++)
            all_greedy = all_greedy && (!samplers[r] || dj_sampler_rule_greedy(samplers[r]));
    }
    const bool device_greedy = next && all_greedy && e->be->vt->argmax;
    const bool device_sample = next && !all_greedy && carried && !masked && e->be->vt->sample && e->device_sampling;
    const bool device_pick = device_greedy || device_sample;
    if (device_greedy) {
        st = e->be->vt->argmax(e->be, out_dev, B, V, e->args_next);
        if (st != DJ_OK) return st;
    }
    if (device_sample) {
        if (B > e->sample_rows_cap) {
            dj_sample_row *r = dj_realloc(e->sample_rows, B * sizeof *r);
            if (!r) return dj_fail(DJ_ENOMEM, "out of memory for %u sampling rows", B);
            e->sample_rows = r;
            e->sample_rows_cap = B;
        }
        for (uint32_t r = 0; r < B; r++) {
            dj_sampler_t *smp = NULL;
            if ((st = row_sampler(ss[r], sp, samplers, r, V, &smp)) != DJ_OK)
                return st;
            const dj_sampler_params *p = smp ? dj_sampler_params_of(smp) : NULL;
            e->sample_rows[r] = (dj_sample_row){.temperature = 0.0f, .top_p = 1.0f}; /* greedy row */
            if (p) {
                const dj_sampler_penalty *pen = NULL;
                const uint32_t n_pen = dj_sampler_penalties(smp, &pen);
                e->sample_rows[r] = (dj_sample_row){.temperature = p->temperature,
                                                    .top_k = p->top_k,
                                                    .top_p = p->top_p,
                                                    .min_p = p->min_p,
                                                    .repetition_penalty = p->repetition_penalty,
                                                    .n_pen = n_pen,
                                                    .pen = pen,
                                                    .u = p->temperature != 0.0f ? dj_sampler_uniform(smp) : 0.0};
            }
        }
        st = e->be->vt->sample(e->be, out_dev, B, V, e->sample_rows, e->args_next);
        if (st != DJ_OK) return st;
    }
    st = e->be->vt->sync(e->be);
    if (st != DJ_OK) return st;
    if (device_pick) {
        st = e->be->vt->download(e->be, next, e->args_next, (size_t)B * sizeof(int32_t));
        if (st != DJ_OK) return st;
        for (uint32_t r = 0; samplers && r < B; r++)
            if (!samplers[r])
                next[r] = -1;
        if ((st = device_logprobs(e, out_dev, B, V, samplers, next)) != DJ_OK) return st;
    }
    if (!logits && (!next || device_pick)) return DJ_OK;
    float *lg = logits;
    if (!lg && (st = host_logits(e, (size_t)B * V, &lg)) != DJ_OK) return st;
    st = e->be->vt->download(e->be, lg, out_dev, (size_t)B * V * sizeof(float));
    if (st != DJ_OK || !next || device_pick) return st;
    for (uint32_t r = 0; r < B; r++) {
        const float *row = lg + (size_t)r * V;
        if (samplers && !samplers[r]) {
            next[r] = -1;
            continue;
        }
        dj_sampler_t *smp = NULL;
        if ((st = row_sampler(ss[r], sp, samplers, r, V, &smp)) != DJ_OK)
            return st;
        next[r] = smp ? dj_sampler_sample(smp, row) : dj_argmax(row, V);
        if (samplers && dj_sampler_wants_logprobs(samplers[r])) dj_sampler_note_logprobs(samplers[r], row, next[r]);
    }
    return DJ_OK;
}

/* ---- breakpoints: a step's live activations off the stack and back ---- */

/* Into hd: every activation at or before hd->node that a node after it
 * reads (the device's work up to the stop done). */
static dj_status held_save(dj_engine_t *e, const dj_graph_t *g, dj__step_held *hd, const uint8_t *stack) {
    const double t0 = prof_now();
    const int count = dj_graph_count(g), stop = hd->node;
    dj_status st = e->be->vt->sync(e->be);
    if (st != DJ_OK) return st;
    bool *live = dj_calloc((size_t)stop + 1, sizeof *live);
    if (!live) return dj_fail(DJ_ENOMEM, "out of memory");
    for (int j = stop + 1; j < count; j++) {
        const dj_node *nd = dj_graph_node_c(g, j);
        for (int k = 0; k < DJ_GRAPH_MAX_SRC; k++) {
            const int src = nd->src[k];
            if (src < 0 || src > stop) continue;
            const dj_residency r = dj_graph_node_c(g, src)->res;
            if (r == DJ_RES_ACTIVATION || r == DJ_RES_OUTPUT) live[src] = true;
        }
    }
    int n_live = 0;
    size_t bytes = 0;
    for (int i = 0; i <= stop; i++)
        if (live[i]) {
            n_live++;
            bytes += dj_graph_node_c(g, i)->size;
        }
    free(hd->live);
    free(hd->off);
    hd->live = dj_malloc((size_t)(n_live ? n_live : 1) * sizeof *hd->live);
    hd->off = dj_malloc((size_t)(n_live ? n_live : 1) * sizeof *hd->off);
    if (bytes > hd->cap) {
        free(hd->bytes);
        hd->cap = 0;
        if ((hd->bytes = dj_malloc(bytes))) hd->cap = bytes;
    }
    if (!hd->live || !hd->off || (bytes && !hd->bytes)) {
        free(live);
        return dj_fail(DJ_ENOMEM, "out of host memory for a paused step's %zu bytes of activations", bytes);
    }
    hd->n_live = 0;
    hd->used = 0;
    for (int i = 0; i <= stop && st == DJ_OK; i++) {
        if (!live[i]) continue;
        const dj_node *nd = dj_graph_node_c(g, i);
        hd->live[hd->n_live] = i;
        hd->off[hd->n_live++] = hd->used;
        st = e->be->vt->download(e->be, hd->bytes + hd->used, stack + nd->offset, nd->size);
        hd->used += nd->size;
    }
    free(live);
    hd->save_s = prof_now() - t0;
    return st;
}

/* hd's activations back onto the stack, where the same plan has them. */
static dj_status held_restore(dj_engine_t *e, const dj_graph_t *g, dj__step_held *hd, uint8_t *stack) {
    const double t0 = prof_now();
    dj_status st = DJ_OK;
    for (int k = 0; k < hd->n_live && st == DJ_OK; k++) {
        const dj_node *nd = dj_graph_node_c(g, hd->live[k]);
        st = e->be->vt->upload(e->be, stack + nd->offset, hd->bytes + hd->off[k], nd->size);
    }
    hd->restore_s = prof_now() - t0;
    return st;
}

/* One prefill chunk of n <= max_step tokens at the session's position. */
/* all_rows: logits receives [n][vocab] (sp and next unused). */
/* samplers (optional, [1]): the caller's picker, as in dj_engine_step_batch_samplers. */
/* hook: NULL, or a traced step's (intervene.c). */
static dj_status run_chunk(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n, float *logits,
                           const dj_sampler_params *sp, dj_sampler_t *const *samplers, int32_t *next, bool all_rows,
                           dj__step_hook *hook) {
    const dj_model_t *m = s->model;
    dj_graph_t *g = NULL;
    const double t_begin = prof_now();
    dj__step_held *hd = hook ? hook->held : NULL;
    const bool resuming = hd && hd->paused;
    dj_status st = dj__swap_before_step(e->kv, s);
    if (st != DJ_OK) return st;
    st = get_plan(e, m, DJ_PHASE_PREFILL, n, all_rows ? DJ_GRAPH_ALL_LOGITS : 0, 0, &g);
    if (st == DJ_OK && resuming && (hd->n != n || hd->plan_count != dj_graph_count(g) ||
                                    hd->plan_peak != dj_graph_peak(g)))
        st = dj_fail(DJ_EINTERNAL, "a paused step of %u rows resumed with another plan", hd->n);
    if (st == DJ_OK && hook && !resuming) st = hook->prepare(hook, e, g);
    if (st == DJ_OK && hd && !resuming) {
        hd->n = n;
        hd->n_blocks0 = s->n_blocks;
        hd->plan_count = dj_graph_count(g);
        hd->plan_peak = dj_graph_peak(g);
    }
    if (st == DJ_OK) st = dj__kv_map_pages(e->kv, s, s->pos + n);
    if (st == DJ_OK) st = dj__kv_sync_tables(e->kv, s);
    if (st == DJ_OK && next) st = ensure_args(e, 1, m->cfg.n_layers);
    if (st != DJ_OK) return st;
    const size_t mark = dj_vmu_stack_mark(e->vmu);
    void *stack_v = NULL;
    st = dj_vmu_stack_push(e->vmu, dj_graph_peak(g), &stack_v);
    if (st != DJ_OK) return st;
    uint8_t *stack = stack_v;
    int out_idx = -1;
    step_io io = {.n = n, .pos0 = s->pos, .ids = ids, .s = s};
    if ((st = lora_prepare(e, g, &s, &n, 1, n, &io.lora)) != DJ_OK) {
        dj_vmu_stack_reset(e->vmu, mark);
        return st;
    }
    int first = 0, first_stop = 0;
    if (resuming) {
        st = held_restore(e, g, hd, stack);
        const dj_node *nd = dj_graph_node_c(g, hd->node);
        if (st == DJ_OK)
            st = hook->restore(hook->user, e, g, hd->node, stack + nd->offset, exec_dtype(e->be, nd), n);
        first = hd->node + 1;
        first_stop = hd->stop + 1;
        hd->paused = false;
    }
    const double t_prepared = prof_now();
    if (st == DJ_OK) st = run_nodes(e, m, g, &io, stack, &out_idx, false, hook, first, first_stop);
    if (st == DJ_OK && hook && hook->pause && hd) { /* stopped at a breakpoint */
        hook->pause = false;
        st = held_save(e, g, hd, stack);
        hd->paused = st == DJ_OK;
        dj_vmu_stack_reset(e->vmu, mark);
        return st;
    }
    const double t_enqueued = prof_now();
    if (st == DJ_OK && out_idx < 0) st = dj_fail(DJ_EINTERNAL, "the step's plan has no output node");
    if (st == DJ_OK && hook && hook->enqueued) st = hook->enqueued(hook->user, e);
    if (st == DJ_OK && all_rows) {
        st = e->be->vt->sync(e->be);
        if (st == DJ_OK)
            st = e->be->vt->download(e->be, logits, stack + dj_graph_node_c(g, out_idx)->offset,
                                     (size_t)n * m->cfg.vocab_size * sizeof(float));
    } else if (st == DJ_OK) {
        st = finish(e, &s, 1, (const float *)(const void *)(stack + dj_graph_node_c(g, out_idx)->offset), logits, sp,
                    samplers, next);
    }
    else
        (void)e->be->vt->sync(e->be); /* drain what was enqueued before the failure */
    dj_vmu_stack_reset(e->vmu, mark);
    if (st == DJ_OK) {
        s->pos += n;
        dj_chunk_times *ct = &e->chunk_times;
        ct->chunks++;
        ct->prepare_s += t_prepared - t_begin;
        ct->enqueue_s += t_enqueued - t_prepared;
        ct->finish_s += prof_now() - t_enqueued;
    }
    return st;
}

static dj_status check_ids(const dj_model_config *c, const int32_t *ids, uint32_t n) {
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= c->vocab_size)
            return dj_fail(DJ_ERANGE, "token id %d at index %u is outside the vocabulary [0, %u)", ids[i], i,
                           c->vocab_size);
    return DJ_OK;
}

/* ---- decode steps: one token for each of B sessions, graphs on a device ---- */

static bool graphs_enabled(const dj_engine_t *e) {
    return e->be->vt->capture_begin && e->be->vt->capture_end && e->be->vt->graph_launch && e->be->vt->graph_free &&
           !e->no_graphs;
}

void dj__engine_set_graphs(dj_engine_t *e, bool on) { e->no_graphs = !on; }

/* The graph slot of a decode shape; what a recorded graph baked in (weights,
 * stack and step-args addresses, the plan) must match, or it is dropped. */
static step_graph *graph_slot(dj_engine_t *e, const dj_model_t *m, uint32_t B, const dj_graph_t *plan,
                              const uint8_t *stack, uint64_t key, uint32_t pos_bound) {
    const uint8_t *text = dj_vmu_model_base(m->region);
    step_graph *hit = NULL, *victim = &e->graphs[0], *traced = NULL; /* traced: the LRU traced one */
    int n_traced = 0;
    for (int i = 0; i < DJ_STEP_GRAPHS; i++) {
        step_graph *sg = &e->graphs[i];
        if (sg->state != SG_EMPTY && sg->fingerprint == m->fingerprint && sg->rows == B && sg->key == key &&
            sg->pos_bound == pos_bound) {
            hit = sg;
            break;
        }
        if (sg->state == SG_EMPTY || (victim->state != SG_EMPTY && sg->used < victim->used)) victim = sg;
        if (sg->state != SG_EMPTY && sg->key) {
            n_traced++;
            if (!traced || sg->used < traced->used) traced = sg;
        }
    }
    if (!hit && key && n_traced >= DJ_TRACE_GRAPHS) victim = traced;
    if (hit && (hit->text != text || hit->stack != stack || hit->plan != plan || hit->args != e->args_dev)) {
        e->be->vt->graph_free(e->be, hit->graph);
        memset(hit, 0, sizeof *hit); /* stale: start over (eager once, then capture) */
        victim = hit;
        hit = NULL;
    }
    if (!hit) {
        if (victim->state != SG_EMPTY) e->be->vt->graph_free(e->be, victim->graph);
        memset(victim, 0, sizeof *victim);
        victim->fingerprint = m->fingerprint;
        victim->rows = B;
        victim->text = text;
        victim->stack = stack;
        victim->plan = plan;
        victim->args = e->args_dev;
        victim->key = key;
        victim->pos_bound = pos_bound;
        victim->state = SG_NEW;
        hit = victim;
    }
    hit->used = ++e->graph_clock;
    return hit;
}

/* One step of B sessions of one model: session r is fed n_tok[r] tokens
 * (NULL: one each), ids[] holding them one session after another. With one
 * token each it is a decode step (recorded and replayed on a device); with
 * more it mixes prompt chunks with decode rows in one plan: every row keeps
 * its own position and pages, the sessions' last tokens are ordered last so
 * that only their logits are computed. */
/* hook: NULL, or a traced step's (intervene.c): the step then runs eagerly,
 * unless the hook gives a graph key (its stops only copy on the device). */
static dj_status decode_rows(dj_engine_t *e, dj_session_t *const *ss, const uint32_t *n_tok, const int32_t *ids,
                             uint32_t B, float *logits, const dj_sampler_params *sp, dj_sampler_t *const *samplers,
                             int32_t *next, dj__step_hook *hook) {
    if (B == 0) return dj_fail(DJ_EINVAL, "a step needs at least one session");
    if (B > DJ_MAX_BATCH) return dj_fail(DJ_EINVAL, "%u sessions in one step; at most %u", B, DJ_MAX_BATCH);
    const double t_begin = prof_now();
    const dj_model_t *m = ss[0]->model;
    const dj_model_config *c = &m->cfg;
    dj_status st = check_sampler(sp);
    if (st != DJ_OK) return st;
    uint64_t R = 0; /* token rows */
    for (uint32_t r = 0; r < B; r++) {
        const uint32_t n = n_tok ? n_tok[r] : 1;
        if (ss[r]->model != m)
            return dj_fail(DJ_EINVAL, "session %u runs another model than session 0; a batch shares one model", r);
        for (uint32_t q = 0; q < r; q++)
            if (ss[q] == ss[r]) return dj_fail(DJ_EINVAL, "session %u appears twice in one batch (also %u)", r, q);
        if (n == 0)
            return dj_fail(DJ_EINVAL, "session %u is fed no token", r);
        if ((st = dj__swap_before_step(e->kv, ss[r])) != DJ_OK)
            return st;
        if ((uint64_t)ss[r]->pos + n > ss[r]->max_ctx)
            return dj_fail(DJ_ERANGE, "session %u: %u more tokens would exceed its context of %u", r, n,
                           ss[r]->max_ctx);
        R += n;
    }
    if (R > B && R > e->max_step)
        return dj_fail(DJ_EINVAL, "%llu tokens in one step; at most %u (the engine's max_step_tokens)",
                       (unsigned long long)R, e->max_step);
    const uint32_t rows = (uint32_t)R;
    if ((st = check_ids(c, ids, rows)) != DJ_OK)
        return st;
    dj_graph_t *g = NULL;
    if ((st = get_plan(e, m, DJ_PHASE_DECODE, rows, 0, rows > B ? B : 0, &g)) != DJ_OK)
        return st;
    if (hook && (st = hook->prepare(hook, e, g)) != DJ_OK)
        return st;
    for (uint32_t r = 0; r < B && st == DJ_OK; r++) {
        st = dj__kv_map_pages(e->kv, ss[r], ss[r]->pos + (n_tok ? n_tok[r] : 1));
        if (st == DJ_OK) st = dj__kv_sync_tables(e->kv, ss[r]);
    }
    if (st == DJ_OK)
        st = ensure_args(e, rows, c->n_layers);
    if (st != DJ_OK) return st;

    /* Step args: ids [R], positions [R], tables [n_layers][R], one copy.
     * Rows: every session's tokens but its last, then the B last tokens. */
    int32_t *h_ids = (int32_t *)(void *)e->args_host;
    uint32_t *h_pos = (uint32_t *)(void *)(e->args_host + e->off_pos);
    const uint32_t **h_tab = (const uint32_t **)(void *)(e->args_host + e->off_tables);
    const float **h_freq = (const float **)(void *)(e->args_host + e->off_freq);
    const float *long_tab = rope_long_table(m);
    uint32_t row = 0, off = 0;
    uint64_t max_end = 0; /* one past the last position of any row: the step's context class */
    for (uint32_t r = 0; r < B; r++) {
        const uint32_t n = n_tok ? n_tok[r] : 1;
        if ((uint64_t)ss[r]->pos + n > max_end) max_end = (uint64_t)ss[r]->pos + n;
        for (uint32_t t = 0; t < n; t++) {
            const uint32_t at = t + 1 == n ? rows - B + r : row++;
            h_ids[at] = ids[off + t];
            h_pos[at] = ss[r]->pos + t;
            if (long_tab) h_freq[at] = ss[r]->rope_long ? long_tab : m->w[dj__wslot_global(c, DJ_W_INV_FREQ)].data;
            for (uint32_t l = 0; l < c->n_layers; l++)
                h_tab[(size_t)l * rows + at] = ss[r]->table_dev + (size_t)l * ss[r]->max_blocks;
        }
        off += n;
    }
    const size_t args_bytes = e->off_tables + (size_t)c->n_layers * rows * sizeof(void *);
    st = upload_now(e, e->args_dev, e->args_host, args_bytes);
    if (st != DJ_OK) return st;

    const size_t mark = dj_vmu_stack_mark(e->vmu);
    void *stack_v = NULL;
    if ((st = dj_vmu_stack_push(e->vmu, dj_graph_peak(g), &stack_v)) != DJ_OK) return st;
    uint8_t *stack = stack_v;
    step_io io = {.n = rows,
                        .ids_dev = (const int32_t *)(const void *)e->args_dev,
                        .row_pos = (const uint32_t *)(const void *)(e->args_dev + e->off_pos),
                        .row_tables = (const uint32_t *const *)(const void *)(e->args_dev + e->off_tables),
                        .row_freq = long_tab ? (const float *const *)(const void *)(e->args_dev + e->off_freq) : NULL,
                        .s = ss[0],
                        .pos_bound = rows == B && B <= e->be->short_rows && max_end <= e->be->short_pos
                                         ? e->be->short_pos
                                         : 0,
                        .decode_only = rows == B};
    if ((st = lora_prepare(e, g, ss, n_tok, B, rows, &io.lora)) != DJ_OK) {
        dj_vmu_stack_reset(e->vmu, mark);
        return st;
    }
    int out_idx = -1;
    bool ran = false;
    const double t_prepared = prof_now();
    const bool graphable = !hook || hook->graph_key;
    /* decode shapes only: mixed steps, and steps with adapters (their tables are the step's), run eagerly */
    if (rows == B && graphable && graphs_enabled(e) && !m->stream && !io.lora) {
        step_graph *sg = graph_slot(e, m, B, g, stack, hook ? hook->graph_key : 0, io.pos_bound);
        if (sg->state == SG_SEEN_ONCE) { /* second time: record it */
            st = e->be->vt->capture_begin(e->be);
            if (st == DJ_OK) {
                dj_status run_st = run_nodes(e, m, g, &io, stack, &out_idx, true, hook, 0, 0);
                dj_backend_graph_t *bg = NULL;
                st = e->be->vt->capture_end(e->be, &bg);
                if (run_st == DJ_OK && st == DJ_OK) {
                    sg->graph = bg;
                    sg->state = SG_RECORDED;
                    sg->out_idx = out_idx;
                    e->graph_captures++;
                } else {
                    DJ_LOG(WARN, "decode step of %u rows runs without a graph: %s", B, dj_last_error());
                    sg->state = SG_FAILED;
                    e->graph_failures++;
                }
            } else {
                DJ_LOG(WARN, "graph capture refused: %s", dj_last_error());
                sg->state = SG_FAILED;
                e->graph_failures++;
            }
            st = DJ_OK;
        } else if (sg->state == SG_NEW) {
            sg->state = SG_SEEN_ONCE; /* eager the first time: scratch and cuBLAS settle */
        }
        if (sg->state == SG_RECORDED) {
            st = e->be->vt->graph_launch(e->be, sg->graph);
            out_idx = sg->out_idx;
            ran = true;
            if (st == DJ_OK) e->graph_replays++;
        }
    }
    if (!ran) st = run_nodes(e, m, g, &io, stack, &out_idx, false, hook, 0, 0);
    const double t_enqueued = prof_now();
    if (st == DJ_OK && out_idx < 0) st = dj_fail(DJ_EINTERNAL, "the step's plan has no output node");
    if (st == DJ_OK && hook && hook->enqueued) st = hook->enqueued(hook->user, e);
    if (st == DJ_OK)
        st = finish(e, ss, B, (const float *)(const void *)(stack + dj_graph_node_c(g, out_idx)->offset), logits, sp,
                    samplers, next);
    else
        (void)e->be->vt->sync(e->be);
    dj_vmu_stack_reset(e->vmu, mark);
    if (st == DJ_OK) {
        dj_chunk_times *ct = &e->step_times;
        ct->chunks++;
        ct->prepare_s += t_prepared - t_begin;
        ct->enqueue_s += t_enqueued - t_prepared;
        ct->finish_s += prof_now() - t_enqueued;
        uint32_t at = 0;
        for (uint32_t r = 0; r < B; r++) {
            const uint32_t n = n_tok ? n_tok[r] : 1;
            ss[r]->pos += n;
            if (hook) ss[r]->pfx_off = true; /* a traced step's KV is not the ids' alone */
            else dj__prefix_fed(e->kv, ss[r], ids + at, n);
            at += n;
        }
    }
    return st;
}

/* ---- public steps ---- */

static dj_status session_step(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n, float *logits,
                              const dj_sampler_params *sp, int32_t *next) {
    const dj_model_config *c = &s->model->cfg;
    if (n == 0) return dj_fail(DJ_EINVAL, "a step needs at least one token");
    if (n == 1)
        return decode_rows(e, &s, NULL, ids, 1, logits, sp, NULL, next, NULL);
    dj_status st = check_ids(c, ids, n);
    if (st == DJ_OK) st = check_sampler(sp);
    if (st != DJ_OK) return st;
    if ((uint64_t)s->pos + n > s->max_ctx)
        return dj_fail(DJ_ERANGE, "%u more tokens would exceed the session's context of %u (%u used)", n,
                       s->max_ctx, s->pos);
    const uint32_t start = s->pos;
    for (uint32_t off = 0; off < n;) {
        uint32_t chunk = n - off < e->max_step ? n - off : e->max_step;
        const bool last = off + chunk == n;
        st = run_chunk(e, s, ids + off, chunk, last ? logits : NULL, sp, NULL, last ? next : NULL, false, NULL);
        if (st != DJ_OK) {
            s->pos = start; /* the KV rows written are simply overwritten next time */
            return st;
        }
        off += chunk;
    }
    dj__prefix_fed(e->kv, s, ids, n); /* after the whole step: a failed one published nothing */
    return DJ_OK;
}

dj_status dj__session_step_hooked(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n, float *logits,
                                  dj__step_hook *hook) {
    if (n == 0) return dj_fail(DJ_EINVAL, "a step needs at least one token");
    if (n > e->max_step)
        return dj_fail(DJ_EINVAL, "a traced step takes at most %u tokens (the engine's max_step_tokens), got %u",
                       e->max_step, n);
    if (n == 1) return decode_rows(e, &s, NULL, ids, 1, logits, NULL, NULL, NULL, hook);
    dj_status st = check_ids(&s->model->cfg, ids, n);
    if (st != DJ_OK) return st;
    if ((uint64_t)s->pos + n > s->max_ctx)
        return dj_fail(DJ_ERANGE, "%u more tokens would exceed the session's context of %u (%u used)", n,
                       s->max_ctx, s->pos);
    dj_status rs = run_chunk(e, s, ids, n, logits, NULL, NULL, NULL, false, hook);
    if (rs == DJ_OK) s->pfx_off = true; /* its KV may not be the ids' alone: never published */
    return rs;
}

dj_status dj__session_step_held(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n, float *logits,
                                dj__step_hook *hook) {
    if (!hook || !hook->held) return dj_fail(DJ_EINTERNAL, "a breakpoint step without its held state");
    if (n == 0) return dj_fail(DJ_EINVAL, "a step needs at least one token");
    if (n > e->max_step)
        return dj_fail(DJ_EINVAL, "a step with breakpoints takes at most %u tokens (the engine's max_step_tokens), "
                       "got %u", e->max_step, n);
    if (s->model->stream)
        return dj_fail(DJ_EUNSUPPORTED, "model %s streams %u of its layers through the weight ring: a step there "
                       "cannot stop at a breakpoint", s->model->name, s->model->stream->pl.n_streamed);
    dj_status st = check_ids(&s->model->cfg, ids, n);
    if (st != DJ_OK) return st;
    if ((uint64_t)s->pos + n > s->max_ctx)
        return dj_fail(DJ_ERANGE, "%u more tokens would exceed the session's context of %u (%u used)", n,
                       s->max_ctx, s->pos);
    st = run_chunk(e, s, ids, n, logits, NULL, NULL, NULL, false, hook);
    if (st == DJ_OK && !hook->held->paused) s->pfx_off = true; /* its KV may not be the ids' alone */
    return st;
}

void dj__session_step_drop(dj_engine_t *e, dj_session_t *s, dj__step_held *hd) {
    if (!hd) return;
    if (s && s->residency == DJ_KV_RESIDENT) dj__kv_unmap_from(e->kv, s, hd->n_blocks0);
    free(hd->live);
    free(hd->off);
    free(hd->bytes);
    memset(hd, 0, sizeof *hd);
}

dj_status dj_session_step(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n, float *logits) {
    return session_step(e, s, ids, n, logits, NULL, NULL);
}

dj_status dj_session_step_all(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n, float *logits) {
    const dj_model_config *c = &s->model->cfg;
    if (n == 0) return dj_fail(DJ_EINVAL, "a step needs at least one token");
    if (!logits) return dj_fail(DJ_EINVAL, "dj_session_step_all: NULL logits");
    dj_status st = check_ids(c, ids, n);
    if (st != DJ_OK) return st;
    if ((uint64_t)s->pos + n > s->max_ctx)
        return dj_fail(DJ_ERANGE, "%u more tokens would exceed the session's context of %u (%u used)", n,
                       s->max_ctx, s->pos);
    const uint32_t start = s->pos;
    for (uint32_t off = 0; off < n;) {
        const uint32_t chunk = n - off < e->max_step ? n - off : e->max_step;
        st = run_chunk(e, s, ids + off, chunk, logits + (size_t)off * c->vocab_size, NULL, NULL, NULL, true, NULL);
        if (st != DJ_OK) {
            s->pos = start;
            return st;
        }
        off += chunk;
    }
    dj__prefix_fed(e->kv, s, ids, n);
    return DJ_OK;
}

dj_status dj_session_step_sample(dj_engine_t *e, dj_session_t *s, const int32_t *ids, uint32_t n,
                                 const dj_sampler_params *sp, int32_t *next) {
    if (!next) return dj_fail(DJ_EINVAL, "dj_session_step_sample: NULL output token");
    return session_step(e, s, ids, n, NULL, sp, next);
}

dj_status dj_engine_step_batch(dj_engine_t *e, dj_session_t *const *sessions, const int32_t *ids,
                               uint32_t n_sessions, float *logits, const dj_sampler_params *sp, int32_t *next) {
    if (!sessions || !ids) return dj_fail(DJ_EINVAL, "dj_engine_step_batch: NULL sessions or ids");
    for (uint32_t r = 0; r < n_sessions; r++)
        if (!sessions[r]) return dj_fail(DJ_EINVAL, "dj_engine_step_batch: session %u is NULL", r);
    return decode_rows(e, sessions, NULL, ids, n_sessions, logits, sp, NULL, next, NULL);
}

dj_status dj_engine_step_batch_samplers(dj_engine_t *e, dj_session_t *const *sessions, const uint32_t *n_tokens,
                                        const int32_t *ids, uint32_t n_sessions, dj_sampler_t *const *samplers,
                                        int32_t *next) {
    if (!sessions || !ids || !samplers || !next)
        return dj_fail(DJ_EINVAL, "dj_engine_step_batch_samplers: NULL sessions, ids, samplers or next");
    for (uint32_t r = 0; r < n_sessions; r++) {
        if (!sessions[r])
            return dj_fail(DJ_EINVAL, "dj_engine_step_batch_samplers: session %u is NULL", r);
        const uint32_t V = dj_model_get_config(sessions[r]->model)->vocab_size;
        if (samplers[r] && dj_sampler_vocab(samplers[r]) != V)
            return dj_fail(DJ_EINVAL,
                           "dj_engine_step_batch_samplers: sampler %u is for a vocabulary of %u, the model's is %u", r,
                           dj_sampler_vocab(samplers[r]), V);
    }
    if (n_sessions == 1 && n_tokens && n_tokens[0] > 1) { /* a lone prompt chunk: the prefill plan */
        dj_session_t *s = sessions[0];
        const uint32_t n = n_tokens[0];
        if (n > e->max_step)
            return dj_fail(DJ_EINVAL, "%u tokens in one step; at most %u (the engine's max_step_tokens)", n,
                           e->max_step);
        dj_status st = check_ids(&s->model->cfg, ids, n);
        if (st != DJ_OK) return st;
        if ((uint64_t)s->pos + n > s->max_ctx)
            return dj_fail(DJ_ERANGE, "session 0: %u more tokens would exceed its context of %u", n, s->max_ctx);
        st = run_chunk(e, s, ids, n, NULL, NULL, samplers, next, false, NULL);
        if (st == DJ_OK) dj__prefix_fed(e->kv, s, ids, n);
        return st;
    }
    return decode_rows(e, sessions, n_tokens, ids, n_sessions, NULL, NULL, samplers, next, NULL);
}

uint32_t dj_engine_max_step_tokens(const dj_engine_t *e) { return e->max_step; }

dj_chunk_times dj_engine_chunk_times(const dj_engine_t *e) { return e->chunk_times; }
dj_chunk_times dj_engine_step_times(const dj_engine_t *e) { return e->step_times; }

void dj_engine_graph_stats(const dj_engine_t *e, size_t *captures, size_t *replays, size_t *failures) {
    if (captures) *captures = e->graph_captures;
    if (replays) *replays = e->graph_replays;
    if (failures) *failures = e->graph_failures;
}
