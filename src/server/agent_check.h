/* agent_check.h: djinnd's answer to HAProxy's agent-check (--agent-check ADDR:PORT) -
 * the load numbers in, the one-line reply out (a pure function), and the small listener. */
#ifndef DJ_SERVER_AGENT_CHECK_H
#define DJ_SERVER_AGENT_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"

/* What the daemon tells the balancer it wants (HAProxy's agent words). */
typedef enum dj__agent_admin {
    DJ__AGENT_UP = 0, /* take new sessions, at the computed weight */
    DJ__AGENT_DRAIN,  /* no new sessions; sticky ones (live sessions) still come (SIGUSR1) */
    DJ__AGENT_MAINT,  /* nothing comes: the daemon is stopping */
} dj__agent_admin;

/* The numbers one reply is computed from: a snapshot the worker published. */
typedef struct dj__agent_load {
    dj__agent_admin admin;
    int ready;            /* nonzero: say "ready", cancelling a drain this agent asked for (SIGUSR2) */
    uint64_t pages_total; /* KV pages of the data segment (0: not known yet - counted as all free) */
    uint64_t pages_free;  /* of those, free now, or held only by the prefix cache (evicted on demand) */
    uint64_t waiting;     /* requests held but not stepping (queued, restoring, preempted) */
    double step_ms;       /* mean generation step time over the last check interval (0: no step ran) */
    double step_best_ms;  /* the lowest such mean seen since start: the step time of a light load */
    int state_only;       /* nonzero: the check sent "state" (haproxy.cfg's agent-send): weight 100, only
                           * the state counts - a consistent-hash backend's keys stay put while load moves */
} dj__agent_load;

/* The weight (0..100, percent of the configured one) the load earns: the
 * product of three fractions - free KV pages / all pages, 4 / (4 + waiting)
 * (4 queued requests halve it), and step_best_ms / step_ms (steps twice as
 * slow as at light load halve it) - rounded, at least 1 while any page is
 * free, 0 when none is (HAProxy then sends only sessions stuck to it). */
int dj__agent_weight(const dj__agent_load *in);

/* The reply line HAProxy reads ("up 73%\n", "up ready 73%\n", "drain\n",
 * "maint\n") into out[cap]; returns its length (cap >= 32 always fits). */
size_t dj__agent_reply(const dj__agent_load *in, char *out /* OUT */, size_t cap);

/* The listener: a thread answering every connection with the reply for the
 * daemon's published numbers (dj__metrics, under its mutex), then closing.
 * A check that sends a line first (HAProxy's agent-send) is read for up to
 * DJ__AGENT_READ_MS: "state" asks for state_only.
 * SIGUSR1 makes it answer "drain" from then on, SIGUSR2 "up" again, with
 * "ready" for DJ__AGENT_READY_MS (every backend's check of this daemon must
 * read it once; a forced drain of HAProxy's own CLI in that window is undone).
 * dj__agent_stop(NULL) does nothing. */
#define DJ__AGENT_READY_MS 10000
#define DJ__AGENT_READ_MS 20
typedef struct dj__agent dj__agent;
struct dj__metrics;
dj_status dj__agent_start(const char *addr, struct dj__metrics *m, dj__agent **out /* OUT */);
void dj__agent_set_stopping(dj__agent *a); /* answer "maint" from now on */
void dj__agent_stop(dj__agent *a);

#endif
