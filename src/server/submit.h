/* submit.h: the one way a typed request enters djinnd - dj__submit, which the
 * binary door calls for a decoded frame and the HTTP door reaches through a portal. */
#ifndef DJ_SERVER_SUBMIT_H
#define DJ_SERVER_SUBMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "djinn/status.h"
#include "server/event.h"
#include "server/request.h"

struct dj__server;
struct dj__conn;
struct dj__meta;
struct dj__graph_req;
struct dj__token;

/* Loop thread: a decoded request r of connection c (a socket's, or a
 * portal's) - its limits, its session's lease, the session quotas - then
 * answered on the I/O side (the message table's DJ__AT_IO rows) or posted to
 * the worker. r is taken (also on refusal, which answers c with an ERROR);
 * graph: a GRAPH_RUN's typed graph (taken) or NULL; m: the metadata, for the
 * I/O rows that read their own fields (MODEL_INFO, WEIGHT_*), NULL from a
 * portal, which may not send those. server.c. */
void dj__submit(struct dj__conn *c, dj__request *r, struct dj__graph_req *graph, const struct dj__meta *m);

/* ---- portals: in-process connections (the HTTP door's) ----
 * A portal is a connection of the daemon without a socket: it is opened for
 * a token (the caller checked it), its typed requests go through dj__submit
 * on the loop thread, and the answers come back as typed events (event.h) in
 * its mailbox, woken through an eventfd - no msgpack, no polling. Closing it
 * is closing a connection: its sessions go and their generations stop. Its
 * sessions' leases hold while the portal is open (its holder is in this
 * process: no heartbeats). Any thread but the loop's; one user at a time. */
typedef struct dj__portal dj__portal;

/* A portal for the token tk (copied; NULL: no --token-file). Blocks until
 * the loop made it: DJ_EQUOTA past --max-connections-per-token, DJ_EIO when
 * the daemon is stopping (or s is NULL: a door without a daemon, in tests). */
dj_status dj__portal_open(struct dj__server *s, const struct dj__token *tk, dj__portal **out /* OUT */);
/* Posts r (taken, also on failure; its type and fields set, id and body
 * ignored): returns the request id its events carry in *req. */
dj_status dj__portal_post(dj__portal *p, dj__request *r, uint64_t *req /* OUT */);
/* The next event (the caller frees it: dj__event_free), waiting until one
 * comes, or until watch_fd (a client's socket; -1: none) hangs up (*out
 * NULL, DJ_OK), or timeout_ms passes (-1: none; *out NULL, DJ_OK). DJ_EIO
 * when the daemon stopped. */
dj_status dj__portal_next(dj__portal *p, int watch_fd, int timeout_ms, dj__event **out /* OUT */);
/* Posts r and waits for its answer (REPLY, or ERROR: its status returned,
 * the message in dj_last_error); *reply gets the REPLY event (caller frees) or NULL. */
dj_status dj__portal_call(dj__portal *p, dj__request *r, dj__event **reply /* OUT */);
void dj__portal_close(dj__portal *p); /* NULL does nothing */

/* Loop side (server.c and submit.c between them). */
dj_status dj__portals_init(struct dj__server *s); /* before the loop runs */
void dj__portals_stop(struct dj__server *s);      /* loop thread, at shutdown: every portal's waits end (DJ_EIO) */
void dj__portals_fini(struct dj__server *s);      /* after the loop closed */
/* An answer for the portal (loop thread; e taken). */
void dj__portal_deliver(dj__portal *p, dj__event *e);
/* The loop is done with a portal's connection (its last reference). */
void dj__portal_release(dj__portal *p);
/* A portal's connection cannot answer any more (out of memory): its user's waits end (DJ_EIO). */
void dj__portal_fail(dj__portal *p);

/* server.c, loop thread: a portal's connection (NULL: out of memory, or
 * refused - the status in *st) and its close. */
struct dj__conn *dj__conn_portal(struct dj__server *s, dj__portal *p, const struct dj__token *tk, dj_status *st);
void dj__conn_portal_close(struct dj__conn *c);
void dj__portals_close_conns(struct dj__server *s); /* every portal's connection (shutdown) */

#endif
