/* view_stats.h: what STATS carries for the live view beyond the counts - the
 * data segment's page map, each part named by the session that holds it. */
#ifndef DJ_SERVER_VIEW_STATS_H
#define DJ_SERVER_VIEW_STATS_H

#include "djinn/status.h"

struct dj__server;
struct dj__stats_snap;

/* The parts a page map has at most (a part: pages_total / cells pages). */
#define DJ__PAGE_CELLS_MAX 1024

/* Worker, after out's session list is made: out->page_runs, n_page_runs and
 * page_cells from the VMU's holders, matched to out->sessions by their
 * engine sessions. */
dj_status dj__stats_page_map(struct dj__server *s, struct dj__stats_snap *out);

#endif
