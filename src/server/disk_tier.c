/* disk_tier.c: djinnd's side of the KV disk tier - opening it from the command
 * line, carrying out the scheduler's spills, and its STATS map. */
#include "server/disk_tier.h"

#include "djinn/status.h"
#include "proto/proto_impl.h"

dj_status dj__tier_open(dj_engine_t *e, const char *dir, size_t bytes, uint64_t *disk_pages, double *page_ms) {
    *disk_pages = 0;
    *page_ms = 0;
    dj_swap_stats sw;
    dj_engine_swap_stats(e, &sw);
    if (!sw.capacity)
        return dj_fail(DJ_EINVAL, "--state-dir %s: the disk tier sits below the host swap pool, and there is none "
                                  "(--swap-gb 0, or no host memory for it)", dir);
    dj_status st = dj_engine_disk_init(e, dir, bytes, 0);
    if (st != DJ_OK) return st;
    dj_disk_stats ds;
    dj_engine_disk_stats(e, &ds);
    *disk_pages = ds.capacity / ds.page_bytes;
    *page_ms = (double)ds.page_bytes / 1e9 * 1e3; /* ~1 GB/s until reads measure it */
    DJ_LOG(INFO, "disk tier: %s, %zu MiB (%llu pages) below a swap pool of %zu MiB, %s I/O", dir, ds.capacity >> 20,
           (unsigned long long)*disk_pages, sw.capacity >> 20, ds.direct ? "direct" : "buffered");
    return DJ_OK;
}

void dj__tier_spill(dj_engine_t *e, dj_sched_t *sc, uint64_t sid, dj_session_t *es) {
    const dj_status st = es ? dj_session_swap_spill(e, es) : dj_fail(DJ_ENOTFOUND, "the session is gone");
    dj_sched_spilled(sc, sid, st == DJ_OK);
    if (st != DJ_OK) {
        DJ_LOG(WARN, "session=%016llx: spill to disk failed (it stays in the pool): %s", (unsigned long long)sid,
               dj_last_error());
        return;
    }
    dj_disk_stats ds;
    dj_engine_disk_stats(e, &ds);
    DJ_LOG(DEBUG, "session=%016llx spilled to disk (%llu spills, %zu MiB on disk)", (unsigned long long)sid,
           (unsigned long long)ds.spills, ds.used >> 20);
    if (ds.bytes_read && ds.read_s > 0)
        dj_sched_disk_rate(sc, ds.read_s * 1e3 * (double)ds.page_bytes / (double)ds.bytes_read);
}

void dj__tier_pack_stats(struct dj__mw *w, const dj_disk_stats *ds, const dj_sched_stats *sst) {
    dj__mw_key(w, "disk");
    msgpack_packer *pk = &w->pk;
    msgpack_pack_map(pk, 16);
    const struct {
        const char *k;
        uint64_t v;
    } u[] = {
        {"capacity", ds->capacity},       {"used", ds->used},
        {"peak", ds->peak},               {"sessions", ds->sessions},
        {"spills", ds->spills},           {"reads", ds->reads},
        {"bytes_written", ds->bytes_written}, {"bytes_read", ds->bytes_read},
        {"bad_pages", ds->bad_pages},     {"failed_reads", ds->failed_reads},
        {"recoveries", sst->recoveries},  {"threads", ds->threads},
    };
    for (size_t i = 0; i < sizeof u / sizeof *u; i++) {
        dj__pack_str(pk, u[i].k);
        msgpack_pack_uint64(pk, u[i].v);
    }
    dj__pack_str(pk, "enabled");
    if (ds->enabled) msgpack_pack_true(pk);
    else msgpack_pack_false(pk);
    dj__pack_str(pk, "direct");
    if (ds->direct) msgpack_pack_true(pk);
    else msgpack_pack_false(pk);
    dj__pack_str(pk, "write_s");
    msgpack_pack_double(pk, ds->write_s);
    dj__pack_str(pk, "read_s");
    msgpack_pack_double(pk, ds->read_s);
}
