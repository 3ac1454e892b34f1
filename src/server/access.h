/* access.h: the daemon's access lines (djinn/log_access.h) filled in from
 * its own structures - a GENERATE's job on the binary port, a request of
 * the HTTP door - so each call site is one line. */
#ifndef DJ_ACCESS_H
#define DJ_ACCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"

struct dj__server;
struct dj__job;
struct dj__sess;
struct MHD_Connection;

#define DJ__ACCESS_PEER 64

/* Loop thread, as a request becomes a job: who sent it - peer (the
 * connection's address, "unix", or "door" for a portal of the HTTP door: submit.h)
 * and the name of its tenant's token ("" without --token-file). */
void dj__access_who(const struct dj__server *s, const void *uv_stream, bool is_unix, bool door, uint64_t tenant,
                    char peer[DJ__ACCESS_PEER], char token[64]);
/* Worker: a GENERATE ended - DONE (st DJ_OK; its finish reason) or an error. */
void dj__access_generate(const struct dj__job *j, const struct dj__sess *ss, dj_status st);

/* The HTTP door: at a request's start, its line ("POST /v1/completions")
 * and start time; when MHD is through with it, the line (status: the
 * answer's, 0 when none was given). */
void dj__access_http_begin(char *line, size_t cap, double *t0, const char *method, const char *url);
void dj__access_http_done(struct MHD_Connection *c, const char *line, double t0, const char *token, unsigned status,
                          int mhd_termination);

#endif
