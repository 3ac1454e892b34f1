/* encode.c: the I/O side's encoder of the worker's typed events (event.h)
 * into protocol frames (msgpack metadata); the worker never packs a byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/alloc.h"
#include "djinn/version.h"
#include "server/disk_tier.h"
#include "server/graph_serve.h"
#include "server/server_impl.h"

dj__event *dj__event_new(dj__ev_kind kind, uint64_t conn, uint16_t req_type, uint64_t req, size_t extra) {
    dj__event *e = dj_calloc(1, sizeof *e + extra);
    if (!e) return NULL;
    e->kind = kind;
    e->conn = conn;
    e->req_type = req_type;
    e->req = req;
    return e;
}

dj__event *dj__event_error(uint64_t conn, uint16_t req_type, uint64_t req, dj_status st, const char *msg,
                           bool close_after) {
    dj__event *e = dj__event_new(DJ__EV_ERROR, conn, req_type, req, 0);
    if (!e) return NULL;
    e->u.error.st = st;
    e->u.error.close_after = close_after;
    snprintf(e->u.error.msg, sizeof e->u.error.msg, "%s", msg && msg[0] ? msg : dj_strerror(st));
    return e;
}

void dj__event_clear(dj__event *e) {
    if (e->kind == DJ__EV_REPLY) switch (e->req_type) {
        case DJ_MSG_STEP:
            free(e->u.step.logits);
            for (uint32_t k = 0; k < e->u.step.n_saved; k++) free(e->u.step.saved[k].bytes);
            free(e->u.step.saved);
            free(e->u.step.ids);
            break;
        case DJ_MSG_SESSION_EXPORT: free(e->u.exp.bytes); break;
        case DJ_MSG_SESSION_IMPORT:
        case DJ_MSG_SESSION_OPEN:
            dj__job_free(e->u.open.drop_msg);
            dj__job_free(e->u.open.orphan_msg);
            break;
        case DJ_MSG_MODEL_LIST: free(e->u.list.models); break;
        case DJ_MSG_GRAPH_RUN:
            for (uint32_t k = 0; k < e->u.graph.n_outs; k++) free(e->u.graph.outs[k].bytes);
            free(e->u.graph.outs);
            break;
        case DJ_MSG_STATS:
            free(e->u.stats.sessions);
            free(e->u.stats.models);
            free(e->u.stats.map);
            break;
        default: break;
        }
    memset(&e->u, 0, sizeof e->u);
}

void dj__event_free(dj__event *e) {
    if (!e) return;
    dj__event_clear(e);
    free(e);
}

static void kv_u64(msgpack_packer *pk, const char *k, uint64_t v) {
    dj__pack_str(pk, k);
    msgpack_pack_uint64(pk, v);
}

static void kv_bool(msgpack_packer *pk, const char *k, bool v) {
    dj__pack_str(pk, k);
    if (v) msgpack_pack_true(pk);
    else msgpack_pack_false(pk);
}

static void pack_sessions(const dj__stats_snap *st, dj__mw *w) {
    if (st->admin) dj__mw_u64(w, "sessions_total", st->sessions_total);
    dj__mw_key(w, "sessions");
    msgpack_pack_array(&w->pk, st->n_sessions);
    for (size_t i = 0; i < st->n_sessions; i++) {
        const dj__stats_sess *ss = &st->sessions[i];
        msgpack_pack_map(&w->pk, 12);
        kv_u64(&w->pk, "id", ss->id);
        dj__pack_str(&w->pk, "state");
        dj__pack_str(&w->pk, dj_sched_state_name(ss->state));
        kv_u64(&w->pk, "kv_bytes", ss->kv_bytes);
        kv_u64(&w->pk, "pooled_bytes", ss->pooled_bytes);
        kv_u64(&w->pk, "swaps", ss->swaps);
        dj__pack_str(&w->pk, "model");
        dj__pack_str(&w->pk, ss->model);
        dj__pack_str(&w->pk, "qos");
        dj__pack_str(&w->pk, dj_qos_name(ss->qos));
        kv_u64(&w->pk, "pos", ss->pos);
        kv_u64(&w->pk, "lease_left_ms", ss->lease_left_ms);
        kv_bool(&w->pk, "paused", ss->paused);
        kv_bool(&w->pk, "generating", ss->generating);
        kv_u64(&w->pk, "break_bytes", ss->break_bytes);
    }
}

static void pack_stats(const dj__stats_snap *st, dj__mw *w) {
    /* a token without the admin role sees its own sessions and nothing of
     * the daemon's that others' work moves (memory, steps, the prefix cache,
     * queues, swap, models, counts): issue 43 */
    dj__mw_str(w, "scope", st->admin ? "all" : "own");
    dj__mw_str(w, "version", DJ_VERSION_STRING);
    dj__mw_u64(w, "page_bytes", st->page_bytes);
    if (!st->admin) {
        dj__mw_key(w, "models"); /* the field clients expect, empty: which models others load is theirs */
        msgpack_pack_array(&w->pk, 0);
        pack_sessions(st, w);
        return;
    }
    const dj_vmu_stats *vs = &st->vs;
    const dj_vmu_seg_stats *seg[3] = {&vs->text, &vs->data, &vs->stack};
    static const char *seg_name[3] = {"text", "data", "stack"};
    dj__mw_key(w, "segments");
    msgpack_pack_map(&w->pk, 3);
    for (int i = 0; i < 3; i++) {
        dj__pack_str(&w->pk, seg_name[i]);
        msgpack_pack_map(&w->pk, 3);
        kv_u64(&w->pk, "capacity", seg[i]->capacity);
        kv_u64(&w->pk, "used", seg[i]->used);
        kv_u64(&w->pk, "peak", seg[i]->peak);
    }
    dj__mw_u64(w, "vmu_models", vs->n_models);
    dj__mw_u64(w, "vmu_sessions", vs->n_sessions);
    dj__mw_u64(w, "pages_total", vs->pages_total);
    dj__mw_u64(w, "pages_free", vs->pages_free);
    dj__mw_u64(w, "evictions", vs->evictions);
    dj__mw_u64(w, "text_pinned", vs->text_pinned);
    dj__mw_u64(w, "text_mapped", vs->text_mapped);
    dj__mw_u64(w, "batched_steps", st->batched_steps);
    dj__mw_u64(w, "mixed_steps", st->mixed_steps);
    dj__mw_u64(w, "batched_rows", st->batched_rows);
    dj__mw_u64(w, "gen_steps", st->gen_steps);
    dj__mw_f64(w, "step_ms", st->step_ms);
    dj__mw_f64(w, "step_engine_ms", st->step_engine_ms);
    dj__mw_u64(w, "graph_captures", st->graph_captures);
    dj__mw_u64(w, "graph_replays", st->graph_replays);
    dj__mw_u64(w, "graph_failures", st->graph_failures);
    const dj_prefix_stats *ps = &st->prefix;
    dj__mw_key(w, "prefix");
    msgpack_pack_map(&w->pk, 8);
    kv_bool(&w->pk, "enabled", ps->enabled);
    kv_u64(&w->pk, "blocks", ps->blocks);
    kv_u64(&w->pk, "blocks_unreferenced", ps->blocks_unreferenced);
    kv_u64(&w->pk, "pages", ps->pages);
    kv_u64(&w->pk, "pages_unreferenced", ps->pages_unreferenced);
    kv_u64(&w->pk, "hits", ps->hits);
    kv_u64(&w->pk, "tokens_mapped", ps->tokens_mapped);
    kv_u64(&w->pk, "evictions", ps->evictions);
    dj__mw_key(w, "models");
    msgpack_pack_array(&w->pk, st->n_models);
    for (size_t i = 0; i < st->n_models; i++) {
        const dj__stats_model *m = &st->models[i];
        const dj_model_placement *pl = &m->pl;
        msgpack_pack_map(&w->pk, 11);
        dj__pack_str(&w->pk, "name");
        dj__pack_str(&w->pk, m->name);
        kv_u64(&w->pk, "refs", m->refs);
        kv_u64(&w->pk, "sessions", m->sessions);
        kv_bool(&w->pk, "pinned", m->pinned);
        /* the placement: layers streamed through a ring (0: all resident) */
        kv_u64(&w->pk, "layers", pl->n_layers);
        kv_u64(&w->pk, "streamed_layers", pl->n_streamed);
        kv_u64(&w->pk, "resident_bytes", pl->resident_bytes);
        kv_u64(&w->pk, "ring_bytes", pl->ring_bytes);
        kv_u64(&w->pk, "streamed_bytes", pl->streamed_bytes);
        kv_u64(&w->pk, "host_layers", pl->n_host); /* streamed layers whose FFN the host computes */
        kv_u64(&w->pk, "host_share_pct", (uint64_t)(100.0 * pl->host_share + 0.5)); /* of each one's FFN */
    }
    pack_sessions(st, w);
    dj__mw_key(w, "queues");
    msgpack_pack_map(&w->pk, DJ_QOS_COUNT);
    for (int q = 0; q < DJ_QOS_COUNT; q++) {
        dj__pack_str(&w->pk, dj_qos_name((dj_qos)q));
        msgpack_pack_map(&w->pk, 2);
        kv_u64(&w->pk, "waiting", st->waiting[q]);
        kv_u64(&w->pk, "running", st->running[q]);
    }
    const dj_swap_stats *sw = &st->swap;
    dj__mw_key(w, "swap");
    msgpack_pack_map(&w->pk, 12);
    dj__pack_str(&w->pk, "policy");
    dj__pack_str(&w->pk, dj_swap_policy_name(st->policy));
    kv_u64(&w->pk, "pool_bytes", sw->capacity);
    kv_u64(&w->pk, "pool_used", sw->used);
    kv_u64(&w->pk, "pool_peak", sw->peak);
    kv_u64(&w->pk, "swaps_out", sw->swaps_out);
    kv_u64(&w->pk, "swaps_in", sw->swaps_in);
    kv_u64(&w->pk, "bytes_out", sw->bytes_out);
    kv_u64(&w->pk, "bytes_in", sw->bytes_in);
    kv_u64(&w->pk, "pages_reserved", st->sched.pages_reserved);
    kv_u64(&w->pk, "preemptions", st->sched.preemptions);
    kv_u64(&w->pk, "prefetches", st->sched.prefetches);
    kv_u64(&w->pk, "drops", st->sched.drops);
    dj__tier_pack_stats(w, &st->disk, &st->sched);
    dj__mw_u64(w, "handles", st->handles);
    dj__mw_u64(w, "paused_steps", st->brk_paused);
    dj__mw_u64(w, "paused_step_bytes", st->brk_bytes);
    dj__mw_u64(w, "connections", st->connections);
    if (st->capture) dj__capture_stats(st->capture, w);
    if (st->map) dj__mw_str(w, "map", st->map);
}

static void pack_step(const dj__rep_step *r, dj__mw *w) {
    dj__mw_u64(w, "pos", r->pos);
    if (r->ids) { /* a text prompt's ids */
        dj__mw_key(w, "ids");
        msgpack_pack_array(&w->pk, r->n_ids);
        for (uint32_t i = 0; i < r->n_ids; i++) msgpack_pack_int32(&w->pk, r->ids[i]);
    }
    if (r->handle) {
        dj__mw_u64(w, "handle", r->handle);
        dj__mw_str(w, "dtype", "f32");
        dj__mw_key(w, "shape");
        msgpack_pack_array(&w->pk, r->ndim);
        for (uint32_t d = 0; d < r->ndim; d++) msgpack_pack_uint64(&w->pk, r->shape[d]);
        dj__mw_u64(w, "nbytes", r->nbytes);
    }
    if (!r->traced) return;
    if (r->paused) {
        dj__mw_bool(w, "paused", true);
        dj__mw_str(w, "break", r->brk_point);
    }
    dj__mw_key(w, "saved");
    msgpack_pack_array(&w->pk, r->n_saved);
    for (uint32_t k = 0; k < r->n_saved; k++) {
        const dj__rep_saved *v = &r->saved[k];
        /* every entry is written, a failed one without a handle */
        msgpack_pack_map(&w->pk, v->handle ? 6 : 1);
        dj__pack_str(&w->pk, "point");
        dj__pack_str(&w->pk, v->point);
        if (!v->handle) continue;
        kv_u64(&w->pk, "handle", v->handle);
        dj__pack_str(&w->pk, "op");
        dj__pack_str(&w->pk, v->brk ? "break" : "save");
        dj__pack_str(&w->pk, "dtype");
        dj__pack_str(&w->pk, "f32");
        dj__pack_str(&w->pk, "shape");
        msgpack_pack_array(&w->pk, 2);
        msgpack_pack_uint64(&w->pk, v->n);
        msgpack_pack_uint64(&w->pk, v->d);
        kv_u64(&w->pk, "nbytes", (uint64_t)v->n * v->d * sizeof(float));
    }
}

static void pack_graph(const dj__rep_graph *r, dj__mw *w) {
    dj__mw_key(w, "outputs");
    msgpack_pack_array(&w->pk, r->n_outs);
    for (uint32_t i = 0; i < r->n_outs; i++) {
        const dj__graph_out *o = &r->outs[i];
        msgpack_pack_map(&w->pk, 4);
        dj__pack_str(&w->pk, "handle");
        msgpack_pack_uint64(&w->pk, o->handle);
        dj__pack_str(&w->pk, "shape");
        msgpack_pack_array(&w->pk, o->rank);
        for (uint32_t d = 0; d < o->rank; d++) msgpack_pack_int64(&w->pk, o->shape[d]);
        dj__pack_str(&w->pk, "dtype");
        dj__pack_str(&w->pk, o->dtype);
        dj__pack_str(&w->pk, "stored");
        dj__pack_str(&w->pk, "f32");
    }
    dj__mw_u64(w, "nodes", r->nodes);
    dj__mw_u64(w, "stack_bytes", r->stack_bytes);
    dj__mw_f64(w, "run_s", r->run_s);
    dj__mw_f64(w, "plan_s", r->plan_s); /* the plan: a cache lookup, or a decode, validation and plan */
    dj__mw_bool(w, "plan_cached", r->plan_cached);
    dj__mw_key(w, "graph_id");
    msgpack_pack_bin(&w->pk, sizeof r->graph_id);
    msgpack_pack_bin_body(&w->pk, r->graph_id, sizeof r->graph_id);
}

static void pack_reply(const dj__event *e, dj__mw *w) {
    switch (e->req_type) {
    case DJ_MSG_SESSION_EXPORT: {
        const dj__rep_export *r = &e->u.exp;
        dj__mw_u64(w, "handle", r->handle);
        dj__mw_u64(w, "bytes", r->nbytes);
        dj__mw_u64(w, "pos", r->pos);
        dj__mw_u64(w, "pages", r->pages);
        dj__mw_u64(w, "fingerprint", r->fingerprint);
        return;
    }
    case DJ_MSG_SESSION_IMPORT:
    case DJ_MSG_SESSION_OPEN: {
        const dj__rep_open *r = &e->u.open;
        if (e->req_type == DJ_MSG_SESSION_IMPORT) {
            dj__mw_u64(w, "pos", r->pos);
            dj__mw_str(w, "model", r->model);
        }
        dj__mw_u64(w, "session", r->session);
        if (r->has_secret) dj__mw_u64(w, "secret", r->secret);
        dj__mw_u64(w, "max_ctx", r->max_ctx);
        dj__mw_u64(w, "vocab", r->vocab);
        dj__mw_u64(w, "lease_ms", r->lease_ms);
        return;
    }
    case DJ_MSG_STEP: pack_step(&e->u.step, w); return;
    case DJ_MSG_MODEL_LOAD:
    case DJ_MSG_MODEL_UNLOAD: {
        const dj__rep_model *r = &e->u.model;
        if (r->unload) {
            dj__mw_u64(w, "sessions", r->sessions);
            return;
        }
        dj__mw_u64(w, "fingerprint", r->fingerprint);
        dj__mw_u64(w, "params", r->params);
        dj__mw_u64(w, "vocab", r->vocab);
        dj__mw_u64(w, "max_ctx", r->max_ctx);
        return;
    }
    case DJ_MSG_MODEL_LIST: {
        const dj__rep_model_list *r = &e->u.list;
        dj__mw_key(w, "models");
        msgpack_pack_array(&w->pk, r->n);
        for (size_t i = 0; i < r->n; i++) {
            msgpack_pack_map(&w->pk, 3);
            dj__pack_str(&w->pk, "name");
            dj__pack_str(&w->pk, r->models[i].name);
            kv_bool(&w->pk, "loaded", r->models[i].loaded);
            kv_u64(&w->pk, "refs", r->models[i].refs);
        }
        return;
    }
    case DJ_MSG_STATS: pack_stats(&e->u.stats, w); return;
    case DJ_MSG_GRAPH_RUN: pack_graph(&e->u.graph, w); return;
    default: return; /* SESSION_CLOSE: {} */
    }
}

dj__out *dj__event_encode(const dj__event *e) {
    if (e->kind == DJ__EV_ERROR)
        return dj__out_error(e->conn, e->req, e->u.error.st, e->u.error.msg, e->u.error.close_after);
    dj__mw w;
    dj__mw_init(&w);
    uint16_t type = DJ_MSG_REPLY;
    switch (e->kind) {
    case DJ__EV_REPLY: pack_reply(e, &w); break;
    case DJ__EV_TOKEN: {
        const dj__ev_token *t = &e->u.token;
        type = DJ_MSG_TOKEN;
        dj__mw_i64(&w, "id", t->id);
        dj__mw_u64(&w, "index", t->index);
        if (t->has_text) dj__mw_strn(&w, "text", t->text, t->text_len);
        if (t->has_logprobs) {
            const dj_token_logprobs *lp = &t->lp;
            dj__mw_f64(&w, "logprob", lp->logprob);
            dj__mw_ids(&w, "top_ids", lp->top_id, lp->n_top);
            dj__mw_key(&w, "top_logprobs");
            msgpack_pack_array(&w.pk, lp->n_top);
            for (uint32_t k = 0; k < lp->n_top; k++) msgpack_pack_double(&w.pk, lp->top_logprob[k]);
        }
        break;
    }
    case DJ__EV_DONE: {
        const dj__ev_done *d = &e->u.done;
        type = DJ_MSG_DONE;
        dj__mw_u64(&w, "n_prompt", d->n_prompt);
        dj__mw_u64(&w, "n_generated", d->n_generated);
        dj__mw_str(&w, "reason", d->reason);
        if (d->has_stop_id) dj__mw_i64(&w, "stop_id", d->stop_id); /* not emitted */
        dj__mw_u64(&w, "pos", d->pos);
        dj__mw_u64(&w, "cached", d->cached); /* prompt ids mapped from the prefix cache */
        dj__mw_f64(&w, "queue_ms", d->queue_ms);
        dj__mw_f64(&w, "prefill_ms", d->prefill_ms);
        dj__mw_f64(&w, "ttft_ms", d->ttft_ms);
        dj__mw_f64(&w, "decode_ms", d->decode_ms);
        if (d->text_len) dj__mw_strn(&w, "text", d->text, d->text_len);
        break;
    }
    default: dj__mw_destroy(&w); return NULL; /* DJ__EV_CREDIT and DJ__EV_STATE have no frame */
    }
    return dj__out_meta(e->conn, type, e->req, &w);
}
