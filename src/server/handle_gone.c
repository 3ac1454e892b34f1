/* handle_gone.c: result handles that went with their session (closed, its
 * lease over, its client gone), remembered so a FETCH of one says so. I/O thread only. */
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
