/* generate.c: the one generation loop (generate.h) - prompt chunks and decode
 * rows of several generations in one engine step, stop rules, streaming text. */
#include "djinn/generate.h"
#include "djinn/intervene.h"
#include "djinn/alloc.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/file.h"

#define TEXT_CAP 512 /* one token's text per step; longer text comes out over the next steps */
#define MAX_BATCH 1024 /* as the engine's batched step */

struct dj_gen {
    dj_session_t *s;            /* borrowed */
    dj_sampler_t *smp;          /* owned */
    dj_detok_stream_t *ds;      /* owned; NULL without a tokenizer */
    int32_t *feed;              /* [n_feed] the prompt; owned */
    size_t n_feed, fed;
    uint32_t cached;            /* prompt tokens mapped from the prefix cache, not computed */
    uint32_t chunk;             /* prompt tokens per step */
    int32_t stop[DJ_GEN_MAX_STOP];
    size_t n_stop;
    uint32_t max_tokens;
    int32_t pending;            /* picked, not fed yet; -1 none */
    int32_t *ids;               /* [cap_ids] emitted tokens */
    uint32_t n_gen, cap_ids;
    dj_gen_finish finish;
    char text[TEXT_CAP];
    dj_constraint_t *con;       /* owned; NULL: no structured output */
    const dj_intervention *iv;  /* [n_iv] at every step (borrowed), or NULL */
    uint32_t n_iv;
    float *logits;              /* [vocab] a traced generation's picks read (owned) */
    uint8_t *allowed;           /* [vocab] the constraint's mask for this step's pick */
    bool stuck;                 /* the mask allowed nothing: this pick ends the generation */
};

const char *dj_gen_finish_name(dj_gen_finish f) {
    switch (f) {
    case DJ_GEN_LENGTH: return "length";
    case DJ_GEN_STOP: return "stop";
    case DJ_GEN_CONTEXT: return "context";
    default: return "running";
    }
}

dj_status dj_gen_new(dj_engine_t *e, dj_session_t *s, const int32_t *prompt, size_t n_prompt, const dj_gen_params *p,
                     dj_gen_t **out) {
    *out = NULL;
    dj_constraint_t *con = p ? p->constraint : NULL; /* ours from here, whatever happens */
    if (!e || !s || !p || (!prompt && n_prompt)) {
        dj_constraint_free(con);
        return dj_fail(DJ_EINVAL, "dj_gen_new: NULL engine, session, params or prompt");
    }
    if (n_prompt == 0) {
        dj_constraint_free(con);
        return dj_fail(DJ_EINVAL, "a generation needs at least one prompt token");
    }
    const size_t n_stop = p->n_stop + (p->ignore_eos ? 0 : p->n_eos);
    const dj_model_config *c = dj_model_get_config(dj_session_model(s));
    dj_gen_t *g = dj_calloc(1, sizeof *g);
    if (!g) {
        dj_constraint_free(con);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    g->con = con;
    dj_status st = DJ_OK;
    if (n_stop > DJ_GEN_MAX_STOP) {
        st = dj_fail(DJ_EINVAL, "%zu stop ids (with the model's EOS ids); at most %d", n_stop, DJ_GEN_MAX_STOP);
        goto fail;
    }
    if ((p->n_stop && !p->stop_ids) || (p->n_eos && !p->eos_ids)) {
        st = dj_fail(DJ_EINVAL, "dj_gen_new: NULL stop or EOS ids");
        goto fail;
    }
    if (con && dj_constraint_vocab_size(con) != c->vocab_size) {
        st = dj_fail(DJ_EINVAL, "a constraint over %u ids for a model of %u", dj_constraint_vocab_size(con),
                     c->vocab_size);
        goto fail;
    }
    for (uint32_t k = 0; k < p->n_iv && st == DJ_OK; k++) {
        const dj_intervention *v = &p->iv[k];
        if (v->op != DJ_IV_ADD && v->op != DJ_IV_REPLACE && v->op != DJ_IV_MUL)
            st = dj_fail(DJ_EINVAL, "a generation's intervention %u: only edits (add, replace, mul), no saves", k);
        else if (v->rows != 1 || v->r1)
            st = dj_fail(DJ_EINVAL, "a generation's intervention %u: one row to every position (no position "
                         "region): its steps have different lengths", k);
    }
    if (st == DJ_OK && p->n_iv && (!p->iv || con))
        st = dj_fail(p->iv ? DJ_EUNSUPPORTED : DJ_EINVAL, "%s", p->iv ? "a generation with interventions takes no "
                     "structured output" : "dj_gen_new: NULL interventions");
    if (st != DJ_OK) goto fail;
    g->iv = p->iv;
    g->n_iv = p->n_iv;
    if (g->n_iv && !(g->logits = dj_malloc((size_t)c->vocab_size * sizeof *g->logits))) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto fail;
    }
    if ((st = dj_sampler_new(&p->sampling, c->vocab_size, &g->smp)) != DJ_OK) goto fail;
    if (con && !(g->allowed = dj_malloc(c->vocab_size))) {
        st = dj_fail(DJ_ENOMEM, "out of memory for a mask of %u ids", c->vocab_size);
        goto fail;
    }
    if (p->n_logit_bias && (st = dj_sampler_set_bias(g->smp, p->logit_bias, p->n_logit_bias)) != DJ_OK) goto fail;
    if (p->logprobs && (st = dj_sampler_set_logprobs(g->smp, p->top_logprobs)) != DJ_OK) goto fail;
    if (p->tok && (st = dj_detok_stream_new(p->tok, &g->ds)) != DJ_OK) goto fail;
    if (!(g->feed = dj_malloc(n_prompt * sizeof *g->feed))) {
        st = dj_fail(DJ_ENOMEM, "out of memory for a prompt of %zu tokens", n_prompt);
        goto fail;
    }
    memcpy(g->feed, prompt, n_prompt * sizeof *g->feed);
    if (p->n_stop) memcpy(g->stop, p->stop_ids, p->n_stop * sizeof *g->stop);
    if (p->n_eos && !p->ignore_eos) memcpy(g->stop + p->n_stop, p->eos_ids, p->n_eos * sizeof *g->stop);
    g->n_stop = n_stop;
    g->s = s;
    g->n_feed = n_prompt;
    const uint32_t cap = dj_engine_max_step_tokens(e);
    g->chunk = p->prefill_chunk && p->prefill_chunk < cap ? p->prefill_chunk : cap;
    g->max_tokens = p->max_tokens;
    g->pending = -1;
    if (!g->n_iv && n_prompt <= UINT32_MAX &&
        (st = dj_session_map_prefix(e, s, prompt, (uint32_t)n_prompt, &g->cached)) != DJ_OK)
        goto fail;
    g->fed = g->cached;
    dj_sampler_observe(g->smp, prompt, n_prompt, true);
    *out = g;
    return DJ_OK;
fail:
    dj_gen_free(g);
    return st;
}

void dj_gen_free(dj_gen_t *g) {
    if (!g) return;
    dj_sampler_free(g->smp);
    dj_constraint_free(g->con);
    free(g->allowed);
    free(g->logits);
    dj_detok_stream_free(g->ds);
    free(g->feed);
    free(g->ids);
    free(g);
}

bool dj_gen_feeding(const dj_gen_t *g) { return g->fed < g->n_feed; }

size_t dj_gen_prompt_left(const dj_gen_t *g) { return g->n_feed - g->fed; }

uint32_t dj_gen_rows(const dj_gen_t *g) {
    if (g->finish != DJ_GEN_RUNNING) return 0;
    if (!dj_gen_feeding(g)) return 1;
    const size_t left = g->n_feed - g->fed;
    return left > g->chunk ? g->chunk : (uint32_t)left;
}

int32_t dj_gen_pending(const dj_gen_t *g) { return g->pending; }
uint32_t dj_gen_cached(const dj_gen_t *g) { return g->cached; }
uint32_t dj_gen_n_generated(const dj_gen_t *g) { return g->n_gen; }
dj_gen_finish dj_gen_finished(const dj_gen_t *g) { return g->finish; }
const int32_t *dj_gen_ids(const dj_gen_t *g) { return g->ids; }
uint32_t dj_gen_n_ids(const dj_gen_t *g) { return g->n_gen < g->cap_ids ? g->n_gen : g->cap_ids; }

static bool is_stop(const dj_gen_t *g, int32_t id) {
    for (size_t i = 0; i < g->n_stop; i++)
        if (g->stop[i] == id) return true;
    return false;
}

/* Room for the id a step may pick, made before the step runs, so that a
 * failure changes nothing and dj_gen_ids always holds every generated id
 * (the daemon's session history copies them). */
static dj_status ids_room(dj_gen_t *g) {
    if (g->n_gen < g->cap_ids) return DJ_OK;
    const uint32_t cap = g->cap_ids ? 2 * g->cap_ids : 64;
    int32_t *v = dj_realloc(g->ids, (size_t)cap * sizeof *v);
    if (!v) return dj_fail(DJ_ENOMEM, "out of memory for a generation's %u ids", cap);
    g->ids = v;
    g->cap_ids = cap;
    return DJ_OK;
}

/* The token picked after this step's rows: stop rules, then emit. */
static void after_pick(dj_gen_t *g, int32_t id, dj_gen_event *ev) {
    g->pending = id;
    dj_sampler_observe(g->smp, &id, 1, false);
    if (g->con && !g->stuck && !is_stop(g, id)) dj_constraint_accept(g->con, id); /* the mask allowed it */
    if (is_stop(g, id) || g->stuck) {
        g->finish = DJ_GEN_STOP;
        ev->finish = g->finish;
        return;
    }
    g->ids[g->n_gen++] = id; /* room made before the step (ids_room) */
    ev->id = id;
    const dj_token_logprobs *lp = dj_sampler_last_logprobs(g->smp);
    if (lp && lp->id == id) ev->logprobs = lp;
    if (g->ds) {
        size_t n = 0;
        if ((ev->text_st = dj_detok_stream_push(g->ds, id, g->text, sizeof g->text, &n)) == DJ_OK) {
            ev->text = g->text;
            ev->text_len = n;
        }
    }
    if (g->n_gen >= g->max_tokens) g->finish = DJ_GEN_LENGTH;
    else if (dj_session_pos(g->s) + 1 > dj_session_max_ctx(g->s)) g->finish = DJ_GEN_CONTEXT;
    ev->finish = g->finish;
}

/* The mask of g's pick after a step of `rows` rows: the ids that keep its
 * text completable in the tokens it may still emit. */
static dj_status constrain(dj_gen_t *g, uint32_t rows) {
    const uint32_t pos = dj_session_pos(g->s) + rows, ctx = dj_session_max_ctx(g->s);
    uint32_t left = g->max_tokens - g->n_gen;
    if (ctx > pos && ctx - pos < left) left = ctx - pos;
    if (left > 1) left--; /* the value whole one token early: room for EOS, so it ends as "stop", not "length" */
    if (left == 0) left = 1;
    g->stuck = dj_constraint_mask(g->con, left, g->allowed) == 0;
    if (g->stuck) DJ_LOG(WARN, "structured output: no token may continue the text; the generation ends");
    return dj_sampler_set_allowed(g->smp, g->stuck ? NULL : g->allowed);
}

static dj_status step_batch(dj_engine_t *e, dj_gen_t *const *gens, uint32_t n, dj_gen_event *ev);

/* A generation with interventions: its step alone, as a trace, the pick on the host. */
static dj_status step_traced(dj_engine_t *e, dj_gen_t *g, dj_gen_event *v) {
    if (g->finish != DJ_GEN_RUNNING) return dj_fail(DJ_EINVAL, "dj_gen_step: a generation has ended");
    if (!dj_gen_feeding(g) && g->pending < 0) return dj_fail(DJ_EINTERNAL, "dj_gen_step: nothing to feed");
    const uint32_t nt = dj_gen_rows(g);
    const bool feeding = dj_gen_feeding(g);
    const int32_t *ids = feeding ? g->feed + g->fed : &g->pending;
    const bool pick = !feeding || (g->fed + nt == g->n_feed && g->max_tokens);
    dj_status st = ids_room(g);
    if (st != DJ_OK) return st;
    st = dj_session_step_trace(e, g->s, ids, nt, g->iv, g->n_iv, pick ? g->logits : NULL);
    if (st != DJ_OK) return st;
    *v = (dj_gen_event){.id = -1, .fed = nt, .text = "", .finish = DJ_GEN_RUNNING};
    if (feeding) {
        g->fed += nt;
        if (dj_gen_feeding(g)) return DJ_OK;
        free(g->feed);
        g->feed = NULL;
        g->n_feed = g->fed = 0;
        if (g->max_tokens == 0) {
            g->finish = v->finish = DJ_GEN_LENGTH;
            return DJ_OK;
        }
    }
    const int32_t id = dj_sampler_sample(g->smp, g->logits);
    if (dj_sampler_wants_logprobs(g->smp)) dj_sampler_note_logprobs(g->smp, g->logits, id);
    after_pick(g, id, v);
    return DJ_OK;
}

dj_status dj_gen_step(dj_engine_t *e, dj_gen_t *const *gens, uint32_t n, dj_gen_event *ev) {
    if (!e || !gens || !ev || n == 0 || n > MAX_BATCH)
        return dj_fail(DJ_EINVAL, "dj_gen_step: NULL engine, generations or events, or %u generations (1 to %d)", n,
                       MAX_BATCH);
    uint32_t n_traced = 0;
    for (uint32_t i = 0; i < n; i++) n_traced += gens[i] && gens[i]->n_iv;
    if (!n_traced) return step_batch(e, gens, n, ev);
    /* traced generations step alone; the others together */
    dj_gen_t *plain[MAX_BATCH];
    dj_gen_event pev[MAX_BATCH];
    uint32_t at[MAX_BATCH], n_plain = 0;
    dj_status st = DJ_OK;
    for (uint32_t i = 0; i < n && st == DJ_OK; i++) {
        if (!gens[i]) return dj_fail(DJ_EINVAL, "dj_gen_step: generation %u is NULL", i);
        if (gens[i]->n_iv) {
            st = step_traced(e, gens[i], &ev[i]);
        } else {
            at[n_plain] = i;
            plain[n_plain++] = gens[i];
        }
    }
    if (st == DJ_OK && n_plain) st = step_batch(e, plain, n_plain, pev);
    for (uint32_t k = 0; st == DJ_OK && k < n_plain; k++) ev[at[k]] = pev[k];
    return st;
}

static dj_status step_batch(dj_engine_t *e, dj_gen_t *const *gens, uint32_t n, dj_gen_event *ev) {
    dj_session_t *ss[MAX_BATCH];
    dj_sampler_t *smp[MAX_BATCH];
    uint32_t n_tok[MAX_BATCH];
    int32_t next[MAX_BATCH];
    size_t rows = 0;
    for (uint32_t i = 0; i < n; i++) {
        const dj_gen_t *g = gens[i];
        if (!g) return dj_fail(DJ_EINVAL, "dj_gen_step: generation %u is NULL", i);
        if (g->finish != DJ_GEN_RUNNING) return dj_fail(DJ_EINVAL, "dj_gen_step: generation %u has ended", i);
        if (!dj_gen_feeding(g) && g->pending < 0)
            return dj_fail(DJ_EINTERNAL, "dj_gen_step: generation %u has nothing to feed", i);
        const dj_status st = ids_room(gens[i]);
        if (st != DJ_OK) return st;
        rows += dj_gen_rows(g);
    }
    int32_t *ids = dj_malloc(rows * sizeof *ids);
    if (!ids) return dj_fail(DJ_ENOMEM, "out of memory for %zu step rows", rows);
    rows = 0;
    for (uint32_t i = 0; i < n; i++) {
        const dj_gen_t *g = gens[i];
        ss[i] = g->s;
        n_tok[i] = dj_gen_rows(g);
        if (dj_gen_feeding(g)) {
            memcpy(ids + rows, g->feed + g->fed, n_tok[i] * sizeof *ids);
            /* a chunk before the last picks nothing; nor does a prompt-only generation */
            const bool last = g->fed + n_tok[i] == g->n_feed;
            smp[i] = last && g->max_tokens ? g->smp : NULL;
        } else {
            ids[rows] = g->pending;
            smp[i] = g->smp;
        }
        rows += n_tok[i];
    }
    dj_status st = DJ_OK;
    for (uint32_t i = 0; i < n && st == DJ_OK; i++) /* structured output: this pick's mask */
        if (smp[i] && gens[i]->con) st = constrain(gens[i], n_tok[i]);
    if (st == DJ_OK) st = dj_engine_step_batch_samplers(e, ss, n_tok, ids, n, smp, next);
    free(ids);
    if (st != DJ_OK) return st;
    for (uint32_t i = 0; i < n; i++) {
        dj_gen_t *g = gens[i];
        dj_gen_event *v = &ev[i];
        *v = (dj_gen_event){.id = -1, .fed = n_tok[i], .text = "", .finish = DJ_GEN_RUNNING};
        if (dj_gen_feeding(g)) {
            g->fed += n_tok[i];
            if (dj_gen_feeding(g)) continue;
            free(g->feed);
            g->feed = NULL;
            g->n_feed = g->fed = 0;
            if (g->max_tokens == 0) {
                g->finish = v->finish = DJ_GEN_LENGTH;
                continue;
            }
        }
        after_pick(g, next[i], v);
    }
    return DJ_OK;
}

dj_status dj_gen_text_rest(dj_gen_t *g, char *out, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (!g->ds) return DJ_OK;
    return dj_detok_stream_finish(g->ds, out, cap, n_out);
}

/* eos_token_id of a parsed JSON object: an int or a list of ints. */
static void eos_from_json(const cJSON *j, int32_t *ids, size_t cap, size_t *n) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    if (cJSON_IsNumber(v)) {
        if (v->valuedouble >= 0 && v->valuedouble <= INT32_MAX && cap) ids[(*n)++] = (int32_t)v->valuedouble;
        return;
    }
    if (!cJSON_IsArray(v)) return;
    const cJSON *x;
    cJSON_ArrayForEach(x, v) {
        if (*n < cap && cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble <= INT32_MAX)
            ids[(*n)++] = (int32_t)x->valuedouble;
    }
}

dj_status dj_gen_eos_ids(const char *model_dir, const dj_model_config *cfg, int32_t *ids, size_t cap, size_t *n_out) {
    *n_out = 0;
    if (model_dir) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
        FILE *f = NULL;
        const dj_status ost = dj__file_fopen(path, &f); /* never blocks on a FIFO; regular files only */
        if (ost != DJ_OK && ost != DJ_ENOTFOUND) return ost;
        if (f) {
            char buf[65536];
            const size_t len = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[len] = '\0';
            cJSON *j = cJSON_Parse(buf);
            if (!j) return dj_fail(DJ_EFORMAT, "%s is not valid JSON (or over 64 KiB)", path);
            const bool has = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id") != NULL;
            eos_from_json(j, ids, cap, n_out);
            cJSON_Delete(j);
            if (has) return DJ_OK;
        }
    }
    for (int i = 0; i < 4 && *n_out < cap; i++)
        if (cfg->eos_token_ids[i] >= 0) ids[(*n_out)++] = cfg->eos_token_ids[i];
    return DJ_OK;
}
