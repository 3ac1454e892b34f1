/* graph_serve.h: djinnd's side of captured modules - WEIGHT_HAS / WEIGHT_UPLOAD / WEIGHT_CHALLENGE /
 * WEIGHT_PROVE answered on the I/O thread, GRAPH_RUN decoded there and run by the worker. */
#ifndef DJ_GRAPH_SERVE_H
#define DJ_GRAPH_SERVE_H

#include <stdbool.h>
#include <stdint.h>

#include "capture/gplan_cache.h"
#include "djinn/weights.h"
#include "proto/proto_impl.h"

/* Bounds on what a client sends (docs/protocol.md, "Captured modules"). */
#define DJ__WEIGHT_CHUNK_MAX ((uint64_t)16 << 20) /* payload of one WEIGHT_UPLOAD */
#define DJ__GRAPH_MAX_BYTES ((uint64_t)16 << 20)  /* a GRAPH_RUN's graph */
#define DJ__GRAPH_MAX_INPUTS 4096
#define DJ__WEIGHT_HAS_MAX 65536                  /* hashes one WEIGHT_HAS asks about */

typedef struct dj__capture dj__capture;
typedef struct dj__server dj__server;

/* The server's weight store (capacity and per-token quota in bytes; 0: defaults) and graph runner. */
dj_status dj__capture_open(uint64_t store_bytes, uint64_t quota_bytes, int threads, dj__capture **out /* OUT */);
void dj__capture_close(dj__capture *c); /* NULL does nothing */

/* Messages of this file that carry a payload (WEIGHT_UPLOAD, GRAPH_RUN). */
bool dj__capture_takes_payload(uint32_t type);
/* Once the metadata of such a message is in: its payload is within bounds (else the error to send
 * before the payload is read, and the connection closes). */
dj_status dj__capture_payload_check(uint32_t type, const uint8_t *meta, uint32_t meta_len, uint64_t payload_len);

/* WEIGHT_HAS, WEIGHT_UPLOAD, WEIGHT_CHALLENGE, WEIGHT_PROVE of connection conn (tenant: its token):
 * the reply's fields into w. I/O thread (the store has its own lock). */
dj_status dj__capture_inline(dj__capture *c, uint64_t conn, uint64_t tenant, uint32_t type, const dj__meta *m,
                             const uint8_t *payload, uint64_t payload_len, dj__mw *w);

/* A GRAPH_RUN as typed values: the graph's bytes and the inputs, each from the payload or a result
 * handle. Points into the request's body (the job owns it). */
typedef struct dj__graph_req {
    const uint8_t *graph; /* [graph_len]; graph_len 0: the graph is named by graph_id (the plan cache) */
    uint64_t graph_len;
    bool has_id;          /* graph_id given: the XXH3-128 of the graph's bytes (checked when they are sent too) */
    uint8_t graph_id[16];
    const uint8_t *data;  /* [data_len]: the payload's inputs, in order */
    uint64_t data_len;
    uint32_t n_inputs;
    uint64_t *handles;    /* [n_inputs]: a handle id, or 0 for the next bytes of data */
    float **hin;          /* [n_inputs] or NULL: a copy of each handle input's f32 values (dj__graph_req_bind) */
    uint64_t *hin_bytes;  /* [n_inputs]: their sizes */
    bool has_qos;         /* `qos` given: the class the scheduler admits it in (else interactive) */
    dj_qos qos;
    /* Its plan, taken as it arrives (dj__graph_plan_bytes), run by dj__graph_serve, released by
     * dj__graph_req_free: one cache lookup a run. plan NULL: not taken. */
    dj_gplan_cache *plans;
    dj_gplan *plan;
    const struct dj_cgraph *g;
    uint8_t plan_id[DJ_GPLAN_ID_BYTES];
    bool plan_hit;
    double plan_s;        /* the lookup's (or decode and plan's) seconds */
} dj__graph_req;

/* I/O thread: GRAPH_RUN's metadata and payload into *out (malloc'd; dj__graph_req_free). */
dj_status dj__graph_req_parse(const dj__meta *m, const uint8_t *payload, uint64_t payload_len,
                              dj__graph_req **out /* OUT */);
void dj__graph_req_free(dj__graph_req *r); /* NULL does nothing */
/* I/O thread (the result handles are its own): r's handle inputs copied from conn's handles -
 * DJ_ENOTFOUND for one conn does not hold. */
dj_status dj__graph_req_bind(dj__server *s, dj__graph_req *r, uint64_t conn);

/* Worker: runs r for conn - the graph's plan from the plan cache (src/capture/gplan_cache.h: by id
 * when conn has sent those bytes before, else decoded, validated, planned and cached), its weights acquired (proven by conn),
 * its inputs gathered, run on the CPU executor; the outputs and how it ran into out (typed: no msgpack
 * here), which the I/O side files as result handles of conn (FETCH reads them, RELEASE frees them, they
 * go when conn closes). On failure out may hold outputs made so far (dj__event_clear frees them). */
/* Worker, as r arrives: its plan taken into r (decoded and cached if new) and the bytes its run will
 * hold - the plan's stack and its outputs - for the scheduler. The graph's refusal (decode,
 * validation, unknown id) is returned as the run would have returned it. */
dj_status dj__graph_plan_bytes(dj__server *s, dj__graph_req *r, uint64_t conn, uint64_t *bytes /* OUT */);
struct dj__rep_graph;
dj_status dj__graph_serve(dj__server *s, const dj__graph_req *r, uint64_t conn, struct dj__rep_graph *out);

/* I/O thread, conn closed: its proofs, uploads, challenges and graph results go. */
void dj__capture_conn_closed(dj__server *s, uint64_t conn);

/* STATS' "weights" and "graph_runs" into w. */
void dj__capture_stats(dj__capture *c, dj__mw *w);

#endif
