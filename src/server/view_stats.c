/* view_stats.c: the data segment's page map for STATS (the live view draws
 * it to scale), run-length over parts of the segment, holders by session. */
#include "server/view_stats.h"

#include <stdlib.h>

#include "djinn/alloc.h"
#include "djinn/kv.h"
#include "server/server_impl.h"

dj_status dj__stats_page_map(dj__server *s, dj__stats_snap *out) {
    const dj_vmu_t *vmu = dj_engine_vmu(s->engine);
    dj_vmu_stats vs;
    dj_vmu_get_stats(vmu, &vs);
    const uint32_t cells = vs.pages_total < DJ__PAGE_CELLS_MAX ? (uint32_t)vs.pages_total : DJ__PAGE_CELLS_MAX;
    if (!cells) return DJ_OK;
    const dj_vmu_session_t **holder = dj_calloc(cells, sizeof *holder);
    const struct dj_vmu_session **keys = dj_calloc(out->n_sessions ? out->n_sessions : 1, sizeof *keys);
    int32_t *runs = dj_malloc(2 * (size_t)cells * sizeof *runs);
    if (!holder || !keys || !runs) {
        free(holder);
        free((void *)keys);
        free(runs);
        return dj_fail(DJ_ENOMEM, "out of memory for the page map");
    }
    for (size_t i = 0; i < out->n_sessions; i++) { /* the listed sessions' engine sessions, in list order */
        const dj__sess *ss = dj__map_get(&s->sessions, out->sessions[i].id);
        keys[i] = ss ? dj_session_vmu(ss->es) : NULL;
    }
    dj_vmu_page_holders(vmu, cells, holder);
    size_t n = 0;
    for (uint32_t c = 0; c < cells; c++) {
        int32_t h = -1;
        if (holder[c]) {
            h = -2;
            for (size_t i = 0; i < out->n_sessions && h == -2; i++)
                if (keys[i] == holder[c]) h = (int32_t)i;
        }
        if (n && runs[2 * (n - 1)] == h) {
            runs[2 * (n - 1) + 1]++;
        } else {
            runs[2 * n] = h;
            runs[2 * n + 1] = 1;
            n++;
        }
    }
    free(holder);
    free((void *)keys);
    out->page_runs = runs;
    out->n_page_runs = n;
    out->page_cells = cells;
    return DJ_OK;
}
