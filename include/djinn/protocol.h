/* protocol.h: the djinnd wire format shared by server and client - the fixed
 * 32-byte frame header, message types and limits (docs/protocol.md). */
#ifndef DJINN_PROTOCOL_H
#define DJINN_PROTOCOL_H

#include <stdbool.h>
#include <stdint.h>

#include "djinn/status.h"

#define DJ_PROTO_MAGIC 0x314e4a44u /* the bytes "DJN1" on the wire (little-endian u32) */
#define DJ_PROTO_VERSION 1
#define DJ_FRAME_HEADER_BYTES 32
#define DJ_PROTO_MAX_META (1u << 20)                 /* metadata bytes, either direction */
#define DJ_PROTO_MAX_REQ_PAYLOAD (1ull << 30)        /* payload bytes of a request */
#define DJ_PROTO_MAX_REPLY_PAYLOAD (64ull << 30)     /* payload bytes a client accepts by default */

/* Message types. Requests are below 0x80; the server answers each request
 * with exactly one of REPLY, DONE (for GENERATE) or ERROR carrying the same
 * request id, and streams TOKEN frames before DONE. */
#define DJ_MSG_TYPE_MAP(X)        \
    X(HELLO, 0x01)                \
    X(HEARTBEAT, 0x02)            \
    X(STATS, 0x03)                \
    X(MODEL_LIST, 0x04)           \
    X(MODEL_LOAD, 0x05)           \
    X(MODEL_UNLOAD, 0x06)         \
    X(SESSION_OPEN, 0x07)         \
    X(SESSION_CLOSE, 0x08)        \
    X(GENERATE, 0x09)             \
    X(STEP, 0x0a)                 \
    X(FETCH, 0x0b)                \
    X(RELEASE, 0x0c)              \
    X(PAUSE, 0x0d)                \
    X(RESUME, 0x0e)               \
    X(MODEL_INFO, 0x0f)           \
    X(SESSION_ATTACH, 0x10)       \
    X(WEIGHT_HAS, 0x11)           \
    X(WEIGHT_UPLOAD, 0x12)        \
    X(WEIGHT_CHALLENGE, 0x13)     \
    X(WEIGHT_PROVE, 0x14)         \
    X(GRAPH_RUN, 0x15)            \
    X(SESSION_EXPORT, 0x16)       \
    X(SESSION_IMPORT, 0x17)       \
    X(REPLY, 0x80)                \
    X(TOKEN, 0x81)                \
    X(DONE, 0x82)                 \
    X(ERROR, 0x83)

typedef enum {
#define DJ__MSG_ENUM(name, code) DJ_MSG_##name = code,
    DJ_MSG_TYPE_MAP(DJ__MSG_ENUM)
#undef DJ__MSG_ENUM
} dj_msg_type;

#define DJ_MSG_REQUEST_LAST DJ_MSG_SESSION_IMPORT /* requests are 1..DJ_MSG_REQUEST_LAST */

/* QoS classes of a session. The zero value is interactive, so a zeroed
 * dj_session_opts asks for the ordinary class, never one that pre-empts
 * everyone; the order of urgency is dj_qos_rank's, not the values'. On the
 * wire a class is its name (dj_qos_name). */
typedef enum { DJ_QOS_INTERACTIVE = 0, DJ_QOS_REALTIME = 1, DJ_QOS_BATCH = 2, DJ_QOS_COUNT = 3 } dj_qos;
/* Urgency, 0 most urgent: realtime 0, interactive 1, batch 2 (the
 * scheduler's class numbers, src/sched/sched.h). */
static inline uint32_t dj_qos_rank(dj_qos q) {
    return q == DJ_QOS_REALTIME ? 0u : q == DJ_QOS_INTERACTIVE ? 1u : 2u;
}

/* The header as decoded. On the wire (little-endian, no padding):
 * magic u32 | version u16 | type u16 | flags u32 | meta_len u32 |
 * request_id u64 | payload_len u64. Flags are reserved (must be 0). */
typedef struct dj_frame_header {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t flags;
    uint32_t meta_len;    /* msgpack map bytes following the header */
    uint64_t request_id;  /* chosen by the client, echoed by the server */
    uint64_t payload_len; /* raw bytes following the metadata */
} dj_frame_header;

void dj_frame_header_encode(const dj_frame_header *h, uint8_t out[DJ_FRAME_HEADER_BYTES] /* OUT */);

/* Decode and validate a header: magic, version, known type, flags 0,
 * meta_len <= DJ_PROTO_MAX_META, payload_len <= max_payload. DJ_EFORMAT
 * (bad magic/type/flags), DJ_EUNSUPPORTED (version) or DJ_ERANGE (lengths),
 * each with a message; *h is filled as far as it could be read. */
dj_status dj_frame_header_decode(const uint8_t in[DJ_FRAME_HEADER_BYTES], uint64_t max_payload,
                                 dj_frame_header *h /* OUT */);

bool dj_msg_type_known(uint32_t type);
bool dj_msg_type_is_request(uint32_t type);
const char *dj_msg_type_name(uint32_t type); /* "GENERATE"; "?" if unknown */
const char *dj_qos_name(dj_qos q);           /* "realtime" ... */
/* "realtime" | "interactive" | "batch" -> q; DJ_EINVAL otherwise. */
dj_status dj_qos_parse(const char *s, dj_qos *q /* OUT */);

/* Checks that `meta` is exactly one well-formed msgpack map with string keys
 * (no duplicates), nesting at most 16 deep, every count bounded by the bytes
 * left, before anything is allocated from it. DJ_EFORMAT with the offset. */
dj_status dj_meta_validate(const uint8_t *meta, uint64_t len);

#endif
