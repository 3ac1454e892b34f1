/* logprobs.c: log_softmax of one row of raw logits for the picked token and
 * its most likely alternatives (sampler.h's dj_logprobs_of). */
#include "djinn/sampler.h"

#include <math.h>
#include <string.h>

/* x ranks before y: a larger logit, ties by the lower id. */
static bool ranks_before(float lx, int32_t x, float ly, int32_t y) { return lx > ly || (lx == ly && x < y); }

void dj_logprobs_of(const float *logits, uint32_t vocab, int32_t picked, uint32_t n_top, dj_token_logprobs *out) {
    memset(out, 0, sizeof *out);
    out->id = picked;
    if (n_top > DJ_MAX_TOP_LOGPROBS) n_top = DJ_MAX_TOP_LOGPROBS;
    if (n_top > vocab) n_top = vocab;
    float mx = -INFINITY;
    for (uint32_t i = 0; i < vocab; i++)
        if (logits[i] > mx) mx = logits[i]; /* NaN compares false: skipped */
    double sum = 0.0;
    if (isfinite(mx))
        for (uint32_t i = 0; i < vocab; i++)
            if (logits[i] > -INFINITY) sum += exp((double)logits[i] - (double)mx);
    /* +inf max: that token is certain (0), others -inf; all -inf/NaN: every one -inf */
    const double lse = isfinite(mx) ? (double)mx + log(sum) : (double)mx;
    const bool inf_max = mx == INFINITY, none = mx == -INFINITY;
#define LOGPROB(l) (isnan(l) || none ? -INFINITY : inf_max ? ((l) == INFINITY ? 0.0f : -INFINITY) : (float)((double)(l) - lse))
    out->logprob = picked >= 0 && (uint32_t)picked < vocab ? LOGPROB(logits[picked]) : -INFINITY;
    /* the n_top best in a sorted array, ids ascending so that ties keep the lower id first */
    uint32_t n = 0;
    for (uint32_t i = 0; i < vocab && n_top; i++) {
        const float l = isnan(logits[i]) ? -INFINITY : logits[i];
        if (n == n_top && !ranks_before(l, (int32_t)i, out->top_logprob[n - 1], out->top_id[n - 1])) continue;
        uint32_t at = n < n_top ? n++ : n - 1;
        while (at > 0 && ranks_before(l, (int32_t)i, out->top_logprob[at - 1], out->top_id[at - 1])) {
            out->top_logprob[at] = out->top_logprob[at - 1];
            out->top_id[at] = out->top_id[at - 1];
            at--;
        }
        out->top_logprob[at] = l; /* the logit for now */
        out->top_id[at] = (int32_t)i;
    }
    out->n_top = n;
    for (uint32_t k = 0; k < n; k++) out->top_logprob[k] = LOGPROB(out->top_logprob[k]);
#undef LOGPROB
}
