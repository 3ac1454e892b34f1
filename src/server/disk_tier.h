/* disk_tier.h: djinnd's side of the KV disk tier (--state-dir, --disk-swap-gb) -
 * opening it at start, the scheduler's spills, its STATS map; typed calls. */
#ifndef DJ_SERVER_DISK_TIER_H
#define DJ_SERVER_DISK_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "djinn/engine.h"
#include "sched/sched.h"

struct dj__mw;

/* Opens the engine's disk tier of `bytes` in `dir` below its swap pool
 * (made first). *disk_pages: its size in data-segment pages; *page_ms: a
 * first estimate of the ms to read one page back (refined by dj__tier_spill
 * from the measured reads). An error names the directory and what is wrong
 * with it (djinnd then does not start). */
dj_status dj__tier_open(dj_engine_t *e, const char *dir, size_t bytes, uint64_t *disk_pages /* OUT */,
                        double *page_ms /* OUT */);
/* The scheduler's DJ_SCHED_SPILL of session `sid` (engine session es, NULL
 * if it is gone): spilled, reported to the scheduler (dj_sched_spilled), the
 * measured disk read rate passed on. */
void dj__tier_spill(dj_engine_t *e, dj_sched_t *sc, uint64_t sid, dj_session_t *es);
/* STATS `disk`: one key and its map (docs/protocol.md). */
void dj__tier_pack_stats(struct dj__mw *w, const dj_disk_stats *ds, const dj_sched_stats *sst);

#endif
