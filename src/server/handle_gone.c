/* handle_gone.c: result handles that went with their session, and sessions
 * whose lease ended, remembered so a request naming one says so. I/O thread only. */
#include "server/server_impl.h"

void dj__gone_note(dj__server *s, uint64_t handle, uint64_t conn, uint64_t sess) {
    s->gone[s->gone_next % DJ__GONE_HANDLES] = (struct dj__gone_handle){.id = handle, .conn = conn, .sess = sess};
    s->gone_next++;
}

dj_status dj__gone_why(const dj__server *s, uint64_t conn, uint64_t handle) {
    const size_t n = s->gone_next < DJ__GONE_HANDLES ? s->gone_next : DJ__GONE_HANDLES;
    for (size_t i = 0; i < n; i++) {
        const struct dj__gone_handle *g = &s->gone[i];
        if (g->id == handle && g->conn == conn)
            return dj_fail(DJ_ENOTFOUND,
                           "handle %016llx went with its session %016llx (closed, its lease over or its KV lost); a "
                           "save with keep true is the connection's and outlives its session",
                           (unsigned long long)handle, (unsigned long long)g->sess);
    }
    return dj_fail(DJ_ENOTFOUND, "no handle %016llx on this connection", (unsigned long long)handle);
}

void dj__gone_lease(dj__server *s, uint64_t conn, uint64_t sess) {
    s->gone_leases[s->gone_leases_next % DJ__GONE_LEASES] = (struct dj__gone_handle){.id = sess, .conn = conn};
    s->gone_leases_next++;
}

dj_status dj__no_session(const dj__server *s, uint64_t conn, uint64_t sess) {
    const size_t n = s->gone_leases_next < DJ__GONE_LEASES ? s->gone_leases_next : DJ__GONE_LEASES;
    for (size_t i = 0; i < n; i++)
        if (s->gone_leases[i].id == sess && s->gone_leases[i].conn == conn)
            return dj_fail(DJ_ENOTFOUND,
                           "session %016llx is gone: its lease ended (no request or heartbeat for --lease-ms %u "
                           "ms) and what it held went with it, a step paused at a breakpoint included",
                           (unsigned long long)sess, s->cfg.lease_ms);
    return dj_fail(DJ_ENOTFOUND, "no session %016llx on this connection", (unsigned long long)sess);
}
