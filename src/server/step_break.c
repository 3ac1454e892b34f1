/* step_break.c: a session's STEP paused at a breakpoint (docs/protocol.md,
 * "Breakpoints") - held busy until a STEP resumes or cancels it. Worker thread only. */
#include <stdio.h>
#include "djinn/alloc.h"
#include <stdlib.h>
#include <string.h>

#include "djinn/intervene.h"
#include "server/server_impl.h"

struct dj__brk {
    dj_step_brk_t *b;     /* the engine's paused step (holds ss->es) */
    dj__trace_req *tr;    /* its points: the iv the engine reads, the saves, the BREAKs' values */
    float *lg;            /* [vocab] the logits at its end (NULL: none asked) */
    uint32_t vocab;
    int32_t *ids;         /* [n] its ids: the session's history once it ends */
    uint32_t n;
};

static void brk_free(dj__brk *k) {
    if (!k) return;
    dj__trace_free(k->tr);
    free(k->lg);
    free(k->ids);
    free(k);
}

dj_status dj__brk_begin(dj_engine_t *e, dj__sess *ss, dj__trace_req **tr, const int32_t *ids, uint32_t n, float **lg,
                        uint32_t vocab, dj__rep_step *out, bool *paused) {
    *paused = false;
    dj_step_brk_t *b = NULL;
    dj_status st = dj__trace_run_break(e, ss->es, ids, n, *tr, *lg, &b);
    if (st != DJ_OK || !b) return st; /* failed (nothing changed) or ran to its end */
    dj__brk *k = dj_calloc(1, sizeof *k);
    if (k) k->ids = dj_malloc((size_t)n * sizeof *ids);
    if (!k || !k->ids) {
        dj_step_brk_cancel(e, b);
        free(k);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    memcpy(k->ids, ids, (size_t)n * sizeof *ids);
    k->n = n;
    k->b = b;
    k->tr = *tr;
    k->lg = *lg;
    k->vocab = vocab;
    *tr = NULL;
    *lg = NULL;
    ss->brk = k;
    *paused = true;
    out->pos = dj_session_pos(ss->es);
    st = dj__trace_publish_break(k->tr, dj_step_brk_at(b), out);
    DJ_LOG(DEBUG, "session=%016llx paused at %s", (unsigned long long)ss->id,
           dj__trace_point_name(k->tr, dj_step_brk_at(b)));
    return st;
}

void dj__brk_drop(dj_engine_t *e, dj__sess *ss) {
    if (!ss || !ss->brk) return;
    dj_step_brk_cancel(e, ss->brk->b);
    brk_free(ss->brk);
    ss->brk = NULL;
}

dj_status dj__brk_continue(dj_engine_t *e, dj__sess *ss, const dj__req_step *rq, dj__rep_step *out,
                           int32_t **done_ids, uint32_t *n_done) {
    *done_ids = NULL;
    *n_done = 0;
    dj__brk *k = ss->brk;
    if (!k)
        return dj_fail(DJ_EINVAL, "session %016llx has no step paused at a breakpoint to %s",
                       (unsigned long long)ss->id, rq->brk == DJ__BRK_CANCEL ? "cancel" : "resume");
    const char *at = dj__trace_point_name(k->tr, dj_step_brk_at(k->b));
    if (rq->brk == DJ__BRK_NONE)
        return dj_fail(DJ_EBUSY, "session %016llx has a step paused at %s: resume or cancel it first",
                       (unsigned long long)ss->id, at);
    if (rq->brk == DJ__BRK_CANCEL) {
        dj__brk_drop(e, ss);
        out->pos = dj_session_pos(ss->es);
        return DJ_OK;
    }
    dj_status st = dj__trace_edit(k->tr, dj_step_brk_at(k->b), rq, dj_model_get_config(dj_session_model(ss->es)));
    if (st != DJ_OK) return st; /* still paused: the client may send a good resume or cancel */
    st = dj_step_brk_resume(e, &k->b, k->lg, NULL);
    if (st != DJ_OK) { /* the engine cancelled it */
        brk_free(k);
        ss->brk = NULL;
        return st;
    }
    out->pos = dj_session_pos(ss->es);
    if (k->b) return dj__trace_publish_break(k->tr, dj_step_brk_at(k->b), out); /* the next breakpoint */
    ss->brk = NULL; /* ended: the reply a STEP without breakpoints has */
    if (k->lg) {
        out->logits = k->lg;
        k->lg = NULL;
        out->ndim = 1;
        out->shape[0] = k->vocab;
        out->nbytes = (uint64_t)k->vocab * sizeof(float);
    }
    st = dj__trace_publish(k->tr, out);
    *done_ids = k->ids;
    *n_done = k->n;
    k->ids = NULL;
    brk_free(k);
    return st;
}

uint64_t dj__brk_bytes(const dj__sess *ss) {
    if (!ss || !ss->brk) return 0;
    dj_step_brk_stats bs;
    dj_step_brk_info(ss->brk->b, &bs);
    return bs.held_bytes;
}

void dj__brk_totals(const dj__server *s, uint64_t *n, uint64_t *bytes) {
    *n = *bytes = 0;
    for (size_t b = 0; b < s->sessions.n_buckets; b++)
        for (dj__ment *m = s->sessions.b[b]; m; m = m->next) {
            const dj__sess *ss = m->val;
            if (!ss->brk) continue;
            (*n)++;
            *bytes += dj__brk_bytes(ss);
        }
}
