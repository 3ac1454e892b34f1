/* proto_impl.h: msgpack metadata of protocol frames for server and client -
 * a map writer (count patched at the end) and a validated, typed reader. */
#ifndef DJ_PROTO_IMPL_H
#define DJ_PROTO_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/socket.h>

#include <msgpack.h>

#include "djinn/protocol.h"

/* ---- writer: one top-level map; values written with the packer ---- */
typedef struct dj__mw {
    msgpack_sbuffer sb;  /* owns the bytes (dj_realloc'd); data NULL once a write found no memory */
    msgpack_packer pk;   /* writes to this dj__mw: the struct must not move after dj__mw_init */
    uint32_t n_keys;     /* top-level keys written so far */
    bool oom;            /* a write found no memory: sb is empty and takes nothing more */
} dj__mw;

void dj__mw_init(dj__mw *w);        /* starts a map32 whose count is patched by dj__mw_finish */
void dj__mw_finish(dj__mw *w);      /* patch the key count; bytes in w->sb.data, w->sb.size (data NULL: out of memory) */
void dj__mw_destroy(dj__mw *w);
void dj__mw_key(dj__mw *w, const char *key); /* then exactly one value with w->pk */
void dj__mw_u64(dj__mw *w, const char *key, uint64_t v);
void dj__mw_i64(dj__mw *w, const char *key, int64_t v);
void dj__mw_f64(dj__mw *w, const char *key, double v);
void dj__mw_bool(dj__mw *w, const char *key, bool v);
void dj__mw_str(dj__mw *w, const char *key, const char *s);
void dj__mw_strn(dj__mw *w, const char *key, const char *s, size_t n);
void dj__mw_ids(dj__mw *w, const char *key, const int32_t *ids, size_t n);
void dj__pack_str(msgpack_packer *pk, const char *s);

/* ---- reader ---- */
typedef struct dj__meta {
    msgpack_zone zone;
    msgpack_object root; /* a map (empty map when meta_len is 0); strings point into bytes */
    uint8_t *bytes;      /* owned copy of the metadata */
    bool has_zone;
} dj__meta;

/* Validates (dj_meta_validate), copies and unpacks; len 0 is an empty map.
 * The input may be freed afterwards. */
dj_status dj__meta_parse(dj__meta *m /* OUT */, const uint8_t *bytes, size_t len);
void dj__meta_destroy(dj__meta *m);
const msgpack_object *dj__meta_get(const dj__meta *m, const char *key); /* NULL if absent */

/* Typed getters: DJ_EFORMAT naming the key when required and absent or of the
 * wrong type / out of range; when optional and absent *out is untouched. */
dj_status dj__meta_u64(const dj__meta *m, const char *key, bool required, uint64_t *out);
dj_status dj__meta_u32(const dj__meta *m, const char *key, bool required, uint32_t *out);
dj_status dj__meta_i64(const dj__meta *m, const char *key, bool required, int64_t *out);
dj_status dj__meta_f64(const dj__meta *m, const char *key, bool required, double *out);
dj_status dj__meta_bool(const dj__meta *m, const char *key, bool required, bool *out);
/* Pointer into the zone (not NUL-terminated), valid until dj__meta_destroy. */
dj_status dj__meta_str(const dj__meta *m, const char *key, bool required, const char **s, size_t *n);
/* Copy into buf (NUL-terminated); DJ_ERANGE if it does not fit or holds a NUL. */
dj_status dj__meta_strcpy(const dj__meta *m, const char *key, bool required, char *buf, size_t cap);
/* Array of token ids in [0, INT32_MAX] -> *ids malloc'd (NULL, 0 when absent/empty). */
dj_status dj__meta_ids(const dj__meta *m, const char *key, bool required, int32_t **ids, size_t *n);

/* Object helpers for nested values. */
bool dj__obj_u64(const msgpack_object *o, uint64_t *out);
bool dj__obj_f64(const msgpack_object *o, double *out);
const msgpack_object *dj__obj_get(const msgpack_object *map, const char *key);

/* "127.0.0.1:7070", "[::1]:7070", "localhost:7070" or "unix:/path/to/socket"
 * -> a socket address (numeric port; 0 allowed for servers). */
dj_status dj__addr_parse(const char *addr, struct sockaddr_storage *ss /* OUT */, socklen_t *len /* OUT */);

/* 64 bits from getrandom(), never 0. */
dj_status dj__random_id(uint64_t *out /* OUT */);

#endif
