/* stream.c: the order of a streamed step, shared by the backends - which
 * copies to issue when, what each kernel waits for, when a load is done. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_impl.h"

/* Load k's copy may be issued while enqueueing: each load before k in this
 * step whose bytes k overwrites already has its done mark (a load after k is
 * the previous step's, whose marks are all enqueued). */
static bool can_issue(const dj_stream_run *r, uint32_t k) {
    const dj_stream_load *L = &r->ss->loads[k];
    for (uint32_t i = 0; i < L->n_after; i++) {
        const uint32_t j = L->after[i];
        if (j < k && r->left[j] > 0) return false;
    }
    return true;
}

static dj_status issue_ready(dj_stream_run *r) {
    while (r->ss->prefetch && r->next < r->ss->n_loads && can_issue(r, r->next)) {
        const uint32_t k = r->next++;
        if (r->left[k] == 0) continue; /* nothing reads it in this step */
        const dj_status st = r->dev.copy(r->dev.u, k, false);
        if (st != DJ_OK) return st;
    }
    return DJ_OK;
}

/* NULL when ss's host runs are ascending, disjoint, inside the step, have a
 * backend to run on, and the calls a whole-FFN run replaces read no load;
 * else what is wrong. */
static const char *check_runs(const dj_stream_step *ss, size_t n_calls) {
    if (ss->n_runs && (!ss->runs || !ss->host)) return "without runs or a host backend";
    size_t end = 0;
    for (uint32_t j = 0; j < ss->n_runs; j++) {
        const dj_host_run *h = &ss->runs[j];
        if (h->first < end || !h->n_calls) return "out of order or range";
        if (!h->calls || (h->n_in && !h->in) || (h->n_out && !h->out)) return "without calls or spans";
        if (h->join) { /* beside the device: it runs [first, join) and waits at join */
            if (h->join <= h->first || h->join >= n_calls) return "out of order or range";
            end = (size_t)h->join + 1;
            continue;
        }
        if ((size_t)h->first + h->n_calls > n_calls) return "out of order or range";
        for (uint32_t i = h->first; i < h->first + h->n_calls; i++)
            if (ss->call_load[i] >= 0) return "reading a streamed load";
        end = (size_t)h->first + h->n_calls;
    }
    return NULL;
}

dj_status dj__host_run_compute(dj_backend_t *host, const dj_op_call *calls, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        const dj_status st = dj_backend_compute(host, &calls[i]);
        if (st != DJ_OK) return st;
    }
    return DJ_OK;
}

dj_status dj__stream_start(dj_stream_run *r, const dj_stream_step *ss, size_t n_calls, dj_stream_dev dev) {
    memset(r, 0, sizeof *r);
    if (!ss->ring || !ss->call_load || (ss->n_loads && !ss->loads))
        return dj_fail(DJ_EINVAL, "streamed step: no ring, loads or call map");
    r->ss = ss;
    r->dev = dev;
    r->left = calloc(ss->n_loads ? ss->n_loads : 1, sizeof *r->left);
    r->waited = calloc(ss->n_loads ? ss->n_loads : 1, 1);
    if (!r->left || !r->waited) {
        free(r->left);
        free(r->waited);
        return dj_fail(DJ_ENOMEM, "streamed step: out of memory");
    }
    for (size_t i = 0; i < n_calls; i++) {
        const int32_t k = ss->call_load[i];
        if (k < -1 || k >= (int32_t)ss->n_loads) {
            free(r->left);
            free(r->waited);
            return dj_fail(DJ_EINVAL, "streamed step: call %zu reads load %d of %u", i, (int)k, ss->n_loads);
        }
        if (k >= 0) r->left[k]++;
    }
    const char *bad = check_runs(ss, n_calls);
    if (bad) {
        free(r->left);
        free(r->waited);
        return dj_fail(DJ_EINVAL, "streamed step: host runs %s", bad);
    }
    for (uint32_t k = 0; k < ss->n_loads; k++)
        for (uint32_t i = 0; i < ss->loads[k].n_after; i++)
            if (ss->loads[k].after[i] >= ss->n_loads) {
                free(r->left);
                free(r->waited);
                return dj_fail(DJ_EINVAL, "streamed step: load %u waits for load %u of %u", k, ss->loads[k].after[i],
                               ss->n_loads);
            }
    return issue_ready(r);
}

dj_status dj__stream_before(dj_stream_run *r, const int32_t *idx, uint32_t k) {
    for (uint32_t i = 0; i < k; i++) {
        const int32_t load = r->ss->call_load[idx[i]];
        if (load < 0 || r->waited[load]) continue;
        while (r->next <= (uint32_t)load) { /* serial mode, or a copy the ring had no room for yet */
            const uint32_t c = r->next;
            if (r->ss->prefetch && !can_issue(r, c))
                return dj_fail(DJ_EINTERNAL, "streamed step: load %u is needed before the ring has room for it", c);
            r->next++;
            if (r->left[c] == 0) continue;
            const dj_status st = r->dev.copy(r->dev.u, c, !r->ss->prefetch);
            if (st != DJ_OK) return st;
        }
        const dj_status st = r->dev.wait_ready(r->dev.u, (uint32_t)load);
        if (st != DJ_OK) return st;
        r->waited[load] = 1;
    }
    return DJ_OK;
}

dj_status dj__stream_after(dj_stream_run *r, const int32_t *idx, uint32_t k) {
    for (uint32_t i = 0; i < k; i++) {
        const int32_t load = r->ss->call_load[idx[i]];
        if (load < 0) continue;
        if (!r->waited[load] || r->left[load] == 0)
            return dj_fail(DJ_EINTERNAL, "streamed step: a call read load %d without waiting for it", (int)load);
        if (--r->left[load] == 0) {
            const dj_status st = r->dev.mark_done(r->dev.u, (uint32_t)load);
            if (st != DJ_OK) return st;
        }
    }
    return issue_ready(r);
}

dj_status dj__stream_end(dj_stream_run *r, dj_status st) {
    for (uint32_t k = 0; r->ss && k < r->ss->n_loads; k++) {
        if (r->left[k] == 0) continue;
        if (st == DJ_OK)
            st = dj_fail(DJ_EINTERNAL, "streamed step: load %u still has %u readers at the end", k, r->left[k]);
        /* a step that failed half-way: every load already copied is marked done, so the next
         * step's copies do not wait for readers that will never run */
        if (k < r->next) (void)r->dev.mark_done(r->dev.u, k);
    }
    free(r->left);
    free(r->waited);
    r->left = NULL;
    r->waited = NULL;
    return st;
}
