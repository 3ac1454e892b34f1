/* metrics_vllm.c: the /metrics series of vLLM's dashboards, ours by name
 * (docs/operations.md has the table) - per model, buckets to 60 s. */
#include "server/metrics_vllm.h"

#include <string.h>

#include "djinn/generate.h"
#include "server/server_impl.h"

static const double sec_bounds[DJ__VLLM_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                    0.5,   1,      2.5,   5,    10,    20,   30,  60};
static const double tok_bounds[DJ__VLLM_BUCKETS] = {1,   2,    5,    10,   20,    50,    100,   200,
                                                    500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};

static const struct {
    const char *name, *help;
    bool tokens;
} hists[DJ__VH_COUNT] = {
    [DJ__VH_E2E] = {"djinn_request_e2e_seconds", "GENERATE from arrival to its last token.", false},
    [DJ__VH_TTFT] = {"djinn_request_ttft_seconds", "GENERATE from arrival to its first token.", false},
    [DJ__VH_TPOT] = {"djinn_request_time_per_output_token_seconds",
                     "A GENERATE's mean time between tokens after the first.", false},
    [DJ__VH_QUEUE] = {"djinn_request_queue_seconds", "GENERATE from arrival to the engine starting it.", false},
    [DJ__VH_PREFILL] = {"djinn_request_prefill_seconds", "The engine's time on a GENERATE's prompt.", false},
    [DJ__VH_DECODE] = {"djinn_request_decode_seconds", "A GENERATE from its first token to its last.", false},
    [DJ__VH_INFERENCE] = {"djinn_request_inference_seconds", "A GENERATE from its start to its last token.", false},
    [DJ__VH_PROMPT_TOK] = {"djinn_request_prompt_tokens", "Prompt tokens of a GENERATE.", true},
    [DJ__VH_GEN_TOK] = {"djinn_request_generation_tokens", "Tokens a GENERATE generated.", true},
};

static const char *const fin_names[DJ__VFIN_COUNT] = {"stop", "length", "abort", "error"};

static dj__vllm_model *model_of(dj__vllm *v, const char *name) {
    if (!name || !name[0]) name = "_unknown";
    for (size_t i = 0; i < v->n; i++)
        if (!strcmp(v->m[i].name, name)) return &v->m[i];
    if (v->n == DJ__VLLM_MODELS) { /* full: the shared row */
        dj__vllm_model *o = &v->m[DJ__VLLM_MODELS];
        if (!o->name[0]) strcpy(o->name, "_other");
        return o;
    }
    dj__vllm_model *m = &v->m[v->n++];
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    return m;
}

static void observe(dj__vhist *h, const double *bounds, double x) {
    if (x < 0) return; /* unknown */
    int b = 0;
    while (b < DJ__VLLM_BUCKETS && x > bounds[b]) b++;
    h->count[b]++;
    h->sum += x;
}

void dj__vllm_observe(dj__vllm *v, const dj__vllm_outcome *o) {
    dj__vllm_model *m = model_of(v, o->model);
    m->finished[o->fin < DJ__VFIN_COUNT ? o->fin : DJ__VFIN_ERROR]++;
    m->prompt_tokens += o->n_prompt;
    m->gen_tokens += o->n_generated;
    m->prefix_queries += o->n_prompt;
    m->prefix_hits += o->cached < o->n_prompt ? o->cached : o->n_prompt;
    observe(&m->h[DJ__VH_E2E], sec_bounds, o->e2e_s);
    observe(&m->h[DJ__VH_TTFT], sec_bounds, o->n_generated ? o->ttft_s : -1);
    observe(&m->h[DJ__VH_TPOT], sec_bounds,
            o->n_generated > 1 && o->decode_s >= 0 ? o->decode_s / (double)(o->n_generated - 1) : -1);
    observe(&m->h[DJ__VH_QUEUE], sec_bounds, o->queue_s);
    observe(&m->h[DJ__VH_PREFILL], sec_bounds, o->prefill_s);
    observe(&m->h[DJ__VH_DECODE], sec_bounds, o->n_generated ? o->decode_s : -1);
    observe(&m->h[DJ__VH_INFERENCE], sec_bounds, o->inference_s);
    observe(&m->h[DJ__VH_PROMPT_TOK], tok_bounds, (double)o->n_prompt);
    observe(&m->h[DJ__VH_GEN_TOK], tok_bounds, (double)o->n_generated);
}

void dj__vllm_set_queues(dj__vllm *v, const char *const *models, const uint32_t *running, const uint32_t *waiting,
                         size_t n) {
    for (size_t i = 0; i <= DJ__VLLM_MODELS; i++) v->m[i].running = v->m[i].waiting = 0;
    for (size_t i = 0; i < n; i++) {
        dj__vllm_model *m = model_of(v, models[i]);
        m->running += running[i];
        m->waiting += waiting[i];
    }
}

/* The rows with a name: the models seen, then "_other" once used. */
#define FOR_MODELS(v, m)                                                                                           \
    for (const dj__vllm_model *m = (v)->m; m <= &(v)->m[DJ__VLLM_MODELS]; m++)                                    \
        if (m < &(v)->m[(v)->n] || (m == &(v)->m[DJ__VLLM_MODELS] && m->name[0]))

static void put_counter(FILE *f, const dj__vllm *v, const char *name, const char *help, size_t off) {
    fprintf(f, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    FOR_MODELS(v, m) {
        fprintf(f, "%s{model=\"%s\"} %llu\n", name, m->name,
                (unsigned long long)*(const uint64_t *)((const char *)m + off));
    }
}

void dj__vllm_render(const dj__vllm *v, FILE *f) {
    /* model names are folder names of the store ([A-Za-z0-9._-]): nothing to escape */
    fputs("# HELP djinn_requests_running GENERATEs the engine is running, per model.\n"
          "# TYPE djinn_requests_running gauge\n", f);
    FOR_MODELS(v, m) { fprintf(f, "djinn_requests_running{model=\"%s\"} %u\n", m->name, m->running); }
    fputs("# HELP djinn_requests_waiting GENERATEs waiting for the engine (queued, admitted, tokenizing), per "
          "model.\n# TYPE djinn_requests_waiting gauge\n", f);
    FOR_MODELS(v, m) { fprintf(f, "djinn_requests_waiting{model=\"%s\"} %u\n", m->name, m->waiting); }
    fprintf(f, "# HELP djinn_kv_cache_usage_ratio Data-segment (KV) pages in use, 0 to 1.\n"
               "# TYPE djinn_kv_cache_usage_ratio gauge\ndjinn_kv_cache_usage_ratio %.6f\n", v->kv_usage);
    put_counter(f, v, "djinn_prompt_tokens_total", "Prompt tokens of ended GENERATEs.",
                offsetof(dj__vllm_model, prompt_tokens));
    put_counter(f, v, "djinn_generation_tokens_total", "Tokens generated by ended GENERATEs.",
                offsetof(dj__vllm_model, gen_tokens));
    put_counter(f, v, "djinn_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
                offsetof(dj__vllm_model, prefix_queries));
    put_counter(f, v, "djinn_prefix_cache_hits_total", "Prompt tokens the prefix cache held.",
                offsetof(dj__vllm_model, prefix_hits));
    fputs("# HELP djinn_request_finished_total GENERATEs ended, by finished_reason (stop, length, abort: "
          "its session went; error: refused or failed).\n# TYPE djinn_request_finished_total counter\n", f);
    FOR_MODELS(v, m) {
        for (int r = 0; r < DJ__VFIN_COUNT; r++)
            fprintf(f, "djinn_request_finished_total{model=\"%s\",finished_reason=\"%s\"} %llu\n", m->name,
                    fin_names[r], (unsigned long long)m->finished[r]);
    }
    for (int k = 0; k < DJ__VH_COUNT; k++) {
        const char *nm = hists[k].name;
        const double *bounds = hists[k].tokens ? tok_bounds : sec_bounds;
        fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", nm, hists[k].help, nm);
        FOR_MODELS(v, m) {
            const dj__vhist *h = &m->h[k];
            uint64_t cum = 0;
            for (int b = 0; b < DJ__VLLM_BUCKETS; b++) {
                cum += h->count[b];
                fprintf(f, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", nm, m->name, bounds[b], (unsigned long long)cum);
            }
            cum += h->count[DJ__VLLM_BUCKETS];
            fprintf(f, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n%s_sum{model=\"%s\"} %.9f\n%s_count{model=\"%s\"} %llu\n",
                    nm, m->name, (unsigned long long)cum, nm, m->name, h->sum, nm, m->name, (unsigned long long)cum);
        }
    }
}

/* ---- the daemon's side ---- */

void dj__vllm_generate_end(dj__server *s, const dj__job *j, const dj__sess *ss, dj_status st, dj__vfin fin_if_failed) {
    const dj__gen *g = j->gen;
    const double now = dj__now();
    dj__vllm_outcome o = {.model = ss ? ss->model : NULL, .fin = fin_if_failed, .queue_s = -1, .ttft_s = -1,
                          .e2e_s = now - j->t_enqueue, .prefill_s = -1, .decode_s = -1, .inference_s = -1};
    if (g) {
        o.n_prompt = g->n_prompt;
        if (g->g) {
            o.n_generated = dj_gen_n_generated(g->g);
            o.cached = dj_gen_cached(g->g);
        }
        if (g->t_start > 0) {
            o.queue_s = g->t_start - j->t_enqueue;
            o.inference_s = now - g->t_start;
            o.prefill_s = g->prefill_s;
        }
        if (o.n_generated && g->t_first > 0) {
            o.ttft_s = g->t_first - j->t_enqueue;
            o.decode_s = now - g->t_first;
        }
        if (st == DJ_OK && g->g)
            o.fin = dj_gen_finished(g->g) == DJ_GEN_STOP ? DJ__VFIN_STOP : DJ__VFIN_LENGTH; /* length, context */
    }
    pthread_mutex_lock(&s->metrics.mu);
    dj__vllm_observe(&s->metrics.vllm, &o);
    pthread_mutex_unlock(&s->metrics.mu);
}

/* GENERATEs of the scheduler's and the mailboxes', per model (worker). */
void dj__vllm_count_queues(dj__server *s) {
    const char *names[DJ__VLLM_MODELS];
    uint32_t run[DJ__VLLM_MODELS] = {0}, wait[DJ__VLLM_MODELS] = {0};
    size_t n = 0;
    /* one job: the row of its session's model (a model past the table's room counts nowhere) */
#define COUNT_JOB(job, running)                                                                                  \
    do {                                                                                                         \
        const dj__sess *ss_ = dj__map_get(&s->sessions, (job)->sess);                                            \
        const char *nm_ = ss_ ? ss_->model : "";                                                                 \
        size_t i_ = 0;                                                                                           \
        while (i_ < n && strcmp(names[i_], nm_)) i_++;                                                           \
        if (i_ == n && n < DJ__VLLM_MODELS) names[n++] = nm_;                                                    \
        if (i_ < n) (running) ? run[i_]++ : wait[i_]++;                                                          \
    } while (0)
    for (const dj__job *j = s->held; j; j = j->hnext)
        if (j->type == DJ_MSG_GENERATE) COUNT_JOB(j, j->gen && j->gen->g);
    pthread_mutex_lock(&s->mu);
    for (int q = 0; q < DJ_QOS_COUNT; q++)
        for (const dj__job *j = s->newq[q].head; j; j = j->next)
            if (j->type == DJ_MSG_GENERATE) COUNT_JOB(j, false);
    for (const dj__job *j = s->tokq.head; j; j = j->next)
        if (j->type == DJ_MSG_GENERATE) COUNT_JOB(j, false);
    pthread_mutex_unlock(&s->mu);
#undef COUNT_JOB
    dj_vmu_stats vs;
    dj_vmu_get_stats(dj_engine_vmu(s->engine), &vs);
    pthread_mutex_lock(&s->metrics.mu);
    dj__vllm_set_queues(&s->metrics.vllm, names, run, wait, n);
    s->metrics.vllm.kv_usage = vs.pages_total ? (double)(vs.pages_total - vs.pages_free) / (double)vs.pages_total : 0.0;
    pthread_mutex_unlock(&s->metrics.mu);
}
