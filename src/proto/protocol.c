/* protocol.c: frame header encode/decode with validation, a msgpack
 * structure check that runs before any allocation, and the metadata codec. */
#include "proto/proto_impl.h"
#include "djinn/alloc.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/un.h>

#define META_MAX_DEPTH 16
#define META_MAX_TOP_KEYS 256

/* ---- header ---- */

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t get32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

void dj_frame_header_encode(const dj_frame_header *h, uint8_t out[DJ_FRAME_HEADER_BYTES]) {
    put32(out, h->magic);
    put16(out + 4, h->version);
    put16(out + 6, h->type);
    put32(out + 8, h->flags);
    put32(out + 12, h->meta_len);
    put64(out + 16, h->request_id);
    put64(out + 24, h->payload_len);
}

dj_status dj_frame_header_decode(const uint8_t in[DJ_FRAME_HEADER_BYTES], uint64_t max_payload, dj_frame_header *h) {
    h->magic = get32(in);
    h->version = get16(in + 4);
    h->type = get16(in + 6);
    h->flags = get32(in + 8);
    h->meta_len = get32(in + 12);
    h->request_id = get64(in + 16);
    h->payload_len = get64(in + 24);
    if (h->magic != DJ_PROTO_MAGIC)
        return dj_fail(DJ_EFORMAT, "bad frame magic 0x%08x (want 0x%08x, \"DJN1\")", (unsigned)h->magic,
                       (unsigned)DJ_PROTO_MAGIC);
    if (h->version != DJ_PROTO_VERSION)
        return dj_fail(DJ_EUNSUPPORTED, "frame version %u (this build speaks %u)", (unsigned)h->version,
                       (unsigned)DJ_PROTO_VERSION);
    if (!dj_msg_type_known(h->type)) return dj_fail(DJ_EFORMAT, "unknown message type 0x%04x", (unsigned)h->type);
    if (h->flags != 0) return dj_fail(DJ_EFORMAT, "reserved frame flags 0x%08x set", (unsigned)h->flags);
    if (h->meta_len > DJ_PROTO_MAX_META)
        return dj_fail(DJ_ERANGE, "metadata of %u bytes exceeds the limit of %u", (unsigned)h->meta_len,
                       (unsigned)DJ_PROTO_MAX_META);
    if (h->payload_len > max_payload)
        return dj_fail(DJ_ERANGE, "payload of %llu bytes exceeds the limit of %llu",
                       (unsigned long long)h->payload_len, (unsigned long long)max_payload);
    return DJ_OK;
}

bool dj_msg_type_known(uint32_t type) {
    switch (type) {
#define DJ__MSG_CASE(name, code) case code:
        DJ_MSG_TYPE_MAP(DJ__MSG_CASE)
#undef DJ__MSG_CASE
        return true;
    default:
        return false;
    }
}

bool dj_msg_type_is_request(uint32_t type) { return type >= 1 && type <= DJ_MSG_REQUEST_LAST; }

const char *dj_msg_type_name(uint32_t type) {
    switch (type) {
#define DJ__MSG_NAME(name, code) \
    case code:                   \
        return #name;
        DJ_MSG_TYPE_MAP(DJ__MSG_NAME)
#undef DJ__MSG_NAME
    default:
        return "?";
    }
}

static const char *qos_names[DJ_QOS_COUNT] = {[DJ_QOS_INTERACTIVE] = "interactive", [DJ_QOS_REALTIME] = "realtime",
                                               [DJ_QOS_BATCH] = "batch"};

const char *dj_qos_name(dj_qos q) { return (unsigned)q < DJ_QOS_COUNT ? qos_names[q] : "?"; }

dj_status dj_qos_parse(const char *s, dj_qos *q) {
    for (int i = 0; i < DJ_QOS_COUNT; i++)
        if (!strcmp(s, qos_names[i])) {
            *q = (dj_qos)i;
            return DJ_OK;
        }
    return dj_fail(DJ_EINVAL, "QoS class '%s' (want realtime, interactive or batch)", s);
}

/* ---- structure check ---- */

typedef struct scan {
    const uint8_t *p;
    uint64_t len, off;
    const uint8_t *keys[META_MAX_TOP_KEYS]; /* top-level keys seen, for duplicates */
    uint64_t key_len[META_MAX_TOP_KEYS];
} scan;

static dj_status need(scan *s, uint64_t n) {
    if (s->len - s->off < n)
        return dj_fail(DJ_EFORMAT, "metadata truncated at byte %llu (needs %llu more)", (unsigned long long)s->off,
                       (unsigned long long)n);
    return DJ_OK;
}

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* One value at s->off (recursing into containers); top: must be the map. */
static dj_status scan_value(scan *s, int depth, bool top);

static dj_status scan_items(scan *s, uint64_t n, bool is_map, int depth, bool top) {
    if ((is_map ? 2 * n : n) > s->len - s->off)
        return dj_fail(DJ_EFORMAT, "metadata %s of %llu entries at byte %llu is longer than the frame",
                       is_map ? "map" : "array", (unsigned long long)n, (unsigned long long)s->off);
    if (depth >= META_MAX_DEPTH) return dj_fail(DJ_EFORMAT, "metadata nested deeper than %d", META_MAX_DEPTH);
    if (top && n > META_MAX_TOP_KEYS)
        return dj_fail(DJ_EFORMAT, "metadata map has %llu keys (at most %d)", (unsigned long long)n, META_MAX_TOP_KEYS);
    for (uint64_t i = 0; i < n; i++) {
        if (is_map) {
            dj_status st = need(s, 1);
            if (st != DJ_OK) return st;
            uint8_t t = s->p[s->off];
            uint64_t kl, hdr;
            if (t >= 0xa0 && t <= 0xbf) kl = t & 0x1f, hdr = 1;
            else if (t == 0xd9 || t == 0xda || t == 0xdb) {
                int w = t == 0xd9 ? 1 : t == 0xda ? 2 : 4;
                if ((st = need(s, 1 + (uint64_t)w)) != DJ_OK) return st;
                kl = be(s->p + s->off + 1, w);
                hdr = 1 + (uint64_t)w;
            } else {
                return dj_fail(DJ_EFORMAT, "metadata map key at byte %llu is not a string", (unsigned long long)s->off);
            }
            if ((st = need(s, hdr + kl)) != DJ_OK) return st;
            if (top) {
                const uint8_t *k = s->p + s->off + hdr;
                for (uint64_t j = 0; j < i; j++)
                    if (s->key_len[j] == kl && !memcmp(s->keys[j], k, kl))
                        return dj_fail(DJ_EFORMAT, "metadata key '%.*s' appears twice", (int)(kl > 64 ? 64 : kl),
                                       (const char *)k);
                s->keys[i] = k;
                s->key_len[i] = kl;
            }
            s->off += hdr + kl;
        }
        dj_status st = scan_value(s, depth + 1, false);
        if (st != DJ_OK) return st;
    }
    return DJ_OK;
}

static dj_status scan_value(scan *s, int depth, bool top) {
    dj_status st = need(s, 1);
    if (st != DJ_OK) return st;
    const uint8_t t = s->p[s->off++];
    uint64_t skip = 0;
    if (top && !((t >= 0x80 && t <= 0x8f) || t == 0xde || t == 0xdf))
        return dj_fail(DJ_EFORMAT, "metadata is not a msgpack map (type byte 0x%02x)", t);
    if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) return DJ_OK;
    if (t >= 0x80 && t <= 0x8f) return scan_items(s, t & 0x0f, true, depth, top);
    if (t >= 0x90 && t <= 0x9f) return scan_items(s, t & 0x0f, false, depth, top);
    if (t >= 0xa0 && t <= 0xbf) skip = t & 0x1f;
    else {
        int w = 0, extra = 0;
        switch (t) {
        case 0xc4: case 0xd9: w = 1; break;
        case 0xc5: case 0xda: w = 2; break;
        case 0xc6: case 0xdb: w = 4; break;
        case 0xc7: w = 1; extra = 1; break;
        case 0xc8: w = 2; extra = 1; break;
        case 0xc9: w = 4; extra = 1; break;
        case 0xca: skip = 4; break;
        case 0xcb: skip = 8; break;
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xce: case 0xd2: skip = 4; break;
        case 0xcf: case 0xd3: skip = 8; break;
        case 0xd4: skip = 2; break;
        case 0xd5: skip = 3; break;
        case 0xd6: skip = 5; break;
        case 0xd7: skip = 9; break;
        case 0xd8: skip = 17; break;
        case 0xdc: case 0xde: w = 2; break;
        case 0xdd: case 0xdf: w = 4; break;
        default:
            return dj_fail(DJ_EFORMAT, "metadata byte %llu: invalid msgpack type 0x%02x",
                           (unsigned long long)(s->off - 1), t);
        }
        if (w) {
            if ((st = need(s, (uint64_t)w)) != DJ_OK) return st;
            uint64_t n = be(s->p + s->off, w);
            s->off += (uint64_t)w;
            if (t == 0xdc || t == 0xdd) return scan_items(s, n, false, depth, top);
            if (t == 0xde || t == 0xdf) return scan_items(s, n, true, depth, top);
            skip = n + (uint64_t)extra;
        }
    }
    if ((st = need(s, skip)) != DJ_OK) return st;
    s->off += skip;
    return DJ_OK;
}

dj_status dj_meta_validate(const uint8_t *meta, uint64_t len) {
    if (len == 0) return dj_fail(DJ_EFORMAT, "metadata is empty");
    scan s;
    s.p = meta;
    s.len = len;
    s.off = 0;
    dj_status st = scan_value(&s, 0, true);
    if (st != DJ_OK) return st;
    if (s.off != len)
        return dj_fail(DJ_EFORMAT, "%llu bytes of garbage after the metadata map", (unsigned long long)(len - s.off));
    return DJ_OK;
}

/* ---- writer ---- */

/* msgpack_sbuffer_write's work through dj_realloc (the sbuffer's own is inline
 * realloc, out of the fault hook's reach); a failed write empties the buffer
 * for good, so no frame is ever sent with a value missing from its middle. */
static int mw_write(void *data, const char *buf, size_t len) {
    dj__mw *w = data;
    msgpack_sbuffer *sb = &w->sb;
    if (w->oom) return -1;
    if (sb->alloc - sb->size < len) {
        size_t cap = sb->alloc ? sb->alloc : 256;
        while (cap - sb->size < len) cap *= 2;
        char *p = dj_realloc(sb->data, cap);
        if (!p) {
            msgpack_sbuffer_destroy(sb);
            msgpack_sbuffer_init(sb);
            w->oom = true;
            return -1;
        }
        sb->data = p;
        sb->alloc = cap;
    }
    memcpy(sb->data + sb->size, buf, len);
    sb->size += len;
    return 0;
}

void dj__mw_init(dj__mw *w) {
    msgpack_sbuffer_init(&w->sb);
    msgpack_packer_init(&w->pk, w, mw_write);
    w->oom = false;
    static const char map32[5] = {(char)0xdf, 0, 0, 0, 0};
    mw_write(w, map32, sizeof map32);
    w->n_keys = 0;
}

void dj__mw_finish(dj__mw *w) {
    if (!w->sb.data || w->sb.size < 5) return; /* the sbuffer could not grow: sent as a broken frame never */
    uint8_t *p = (uint8_t *)w->sb.data;
    p[1] = (uint8_t)(w->n_keys >> 24);
    p[2] = (uint8_t)(w->n_keys >> 16);
    p[3] = (uint8_t)(w->n_keys >> 8);
    p[4] = (uint8_t)w->n_keys;
}

void dj__mw_destroy(dj__mw *w) { msgpack_sbuffer_destroy(&w->sb); }

void dj__pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

void dj__mw_key(dj__mw *w, const char *key) {
    dj__pack_str(&w->pk, key);
    w->n_keys++;
}
void dj__mw_u64(dj__mw *w, const char *key, uint64_t v) {
    dj__mw_key(w, key);
    msgpack_pack_uint64(&w->pk, v);
}
void dj__mw_i64(dj__mw *w, const char *key, int64_t v) {
    dj__mw_key(w, key);
    msgpack_pack_int64(&w->pk, v);
}
void dj__mw_f64(dj__mw *w, const char *key, double v) {
    dj__mw_key(w, key);
    msgpack_pack_double(&w->pk, v);
}
void dj__mw_bool(dj__mw *w, const char *key, bool v) {
    dj__mw_key(w, key);
    if (v) msgpack_pack_true(&w->pk);
    else msgpack_pack_false(&w->pk);
}
void dj__mw_str(dj__mw *w, const char *key, const char *s) { dj__mw_strn(w, key, s, strlen(s)); }
void dj__mw_strn(dj__mw *w, const char *key, const char *s, size_t n) {
    dj__mw_key(w, key);
    msgpack_pack_str(&w->pk, n);
    msgpack_pack_str_body(&w->pk, s, n);
}
void dj__mw_ids(dj__mw *w, const char *key, const int32_t *ids, size_t n) {
    dj__mw_key(w, key);
    msgpack_pack_array(&w->pk, n);
    for (size_t i = 0; i < n; i++) msgpack_pack_int32(&w->pk, ids[i]);
}

/* ---- reader ---- */

dj_status dj__meta_parse(dj__meta *m, const uint8_t *bytes, size_t len) {
    memset(m, 0, sizeof *m);
    m->root.type = MSGPACK_OBJECT_MAP;
    if (len == 0) return DJ_OK;
    dj_status st = dj_meta_validate(bytes, len);
    if (st != DJ_OK) return st;
    if (!(m->bytes = dj_malloc(len))) return dj_fail(DJ_ENOMEM, "out of memory");
    memcpy(m->bytes, bytes, len);
    if (!msgpack_zone_init(&m->zone, 4096)) {
        free(m->bytes);
        m->bytes = NULL;
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    m->has_zone = true;
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack((const char *)m->bytes, len, &off, &m->zone, &m->root);
    if (r != MSGPACK_UNPACK_SUCCESS || off != len || m->root.type != MSGPACK_OBJECT_MAP) {
        dj__meta_destroy(m);
        return r == MSGPACK_UNPACK_NOMEM_ERROR ? dj_fail(DJ_ENOMEM, "out of memory unpacking metadata")
                                               : dj_fail(DJ_EFORMAT, "metadata is not one msgpack map");
    }
    return DJ_OK;
}

void dj__meta_destroy(dj__meta *m) {
    if (m->has_zone) msgpack_zone_destroy(&m->zone);
    m->has_zone = false;
    free(m->bytes);
    m->bytes = NULL;
    m->root.type = MSGPACK_OBJECT_MAP;
    m->root.via.map.size = 0;
}

const msgpack_object *dj__obj_get(const msgpack_object *map, const char *key) {
    if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
    const size_t kl = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl && !memcmp(k->via.str.ptr, key, kl))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

const msgpack_object *dj__meta_get(const dj__meta *m, const char *key) { return dj__obj_get(&m->root, key); }

bool dj__obj_u64(const msgpack_object *o, uint64_t *out) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *out = o->via.u64;
        return true;
    }
    return false;
}

bool dj__obj_f64(const msgpack_object *o, double *out) {
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *out = o->via.f64; return true;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)o->via.u64; return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)o->via.i64; return true;
    default: return false;
    }
}

static dj_status absent(const char *key, bool required) {
    return required ? dj_fail(DJ_EFORMAT, "metadata field '%s' is missing", key) : DJ_OK;
}
static dj_status wrong(const char *key, const char *want) {
    return dj_fail(DJ_EFORMAT, "metadata field '%s' must be %s", key, want);
}

dj_status dj__meta_u64(const dj__meta *m, const char *key, bool required, uint64_t *out) {
    const msgpack_object *o = dj__meta_get(m, key);
    if (!o) return absent(key, required);
    if (!dj__obj_u64(o, out)) return wrong(key, "a non-negative integer");
    return DJ_OK;
}

dj_status dj__meta_u32(const dj__meta *m, const char *key, bool required, uint32_t *out) {
    uint64_t v;
    const msgpack_object *o = dj__meta_get(m, key);
    if (!o) return absent(key, required);
    if (!dj__obj_u64(o, &v) || v > UINT32_MAX) return wrong(key, "an integer in [0, 2^32)");
    *out = (uint32_t)v;
    return DJ_OK;
}

dj_status dj__meta_i64(const dj__meta *m, const char *key, bool required, int64_t *out) {
    const msgpack_object *o = dj__meta_get(m, key);
    if (!o) return absent(key, required);
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) *out = o->via.i64;
    else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX) *out = (int64_t)o->via.u64;
    else return wrong(key, "a 64-bit integer");
    return DJ_OK;
}

dj_status dj__meta_f64(const dj__meta *m, const char *key, bool required, double *out) {
    const msgpack_object *o = dj__meta_get(m, key);
    if (!o) return absent(key, required);
    if (!dj__obj_f64(o, out)) return wrong(key, "a number");
    return DJ_OK;
}

dj_status dj__meta_bool(const dj__meta *m, const char *key, bool required, bool *out) {
    const msgpack_object *o = dj__meta_get(m, key);
    if (!o) return absent(key, required);
    if (o->type != MSGPACK_OBJECT_BOOLEAN) return wrong(key, "a boolean");
    *out = o->via.boolean;
    return DJ_OK;
}

dj_status dj__meta_str(const dj__meta *m, const char *key, bool required, const char **s, size_t *n) {
    const msgpack_object *o = dj__meta_get(m, key);
    if (!o) return absent(key, required);
    if (o->type != MSGPACK_OBJECT_STR) return wrong(key, "a string");
    *s = o->via.str.ptr;
    *n = o->via.str.size;
    return DJ_OK;
}

dj_status dj__meta_strcpy(const dj__meta *m, const char *key, bool required, char *buf, size_t cap) {
    const char *s = NULL;
    size_t n = 0;
    dj_status st = dj__meta_str(m, key, required, &s, &n);
    if (st != DJ_OK || !s) return st;
    if (n >= cap) return dj_fail(DJ_ERANGE, "metadata field '%s' is longer than %zu bytes", key, cap - 1);
    if (memchr(s, '\0', n)) return dj_fail(DJ_EFORMAT, "metadata field '%s' contains a NUL byte", key);
    memcpy(buf, s, n);
    buf[n] = '\0';
    return DJ_OK;
}

dj_status dj__meta_ids(const dj__meta *m, const char *key, bool required, int32_t **ids, size_t *n) {
    *ids = NULL;
    *n = 0;
    const msgpack_object *o = dj__meta_get(m, key);
    if (!o) return absent(key, required);
    if (o->type != MSGPACK_OBJECT_ARRAY) return wrong(key, "an array of token ids");
    const uint32_t k = o->via.array.size;
    if (k == 0) return DJ_OK;
    int32_t *v = dj_malloc((size_t)k * sizeof *v);
    if (!v) return dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < k; i++) {
        uint64_t x;
        if (!dj__obj_u64(&o->via.array.ptr[i], &x) || x > INT32_MAX) {
            free(v);
            return dj_fail(DJ_EFORMAT, "metadata field '%s'[%u] is not a token id in [0, 2^31)", key, i);
        }
        v[i] = (int32_t)x;
    }
    *ids = v;
    *n = k;
    return DJ_OK;
}

/* ---- addresses and ids ---- */

dj_status dj__addr_parse(const char *addr, struct sockaddr_storage *ss, socklen_t *len) {
    memset(ss, 0, sizeof *ss);
    if (!strncmp(addr, "unix:", 5)) {
        struct sockaddr_un *un = (struct sockaddr_un *)ss;
        const char *path = addr + 5;
        if (!path[0] || strlen(path) >= sizeof un->sun_path)
            return dj_fail(DJ_EINVAL, "address '%s': unix socket path empty or longer than %zu bytes", addr,
                           sizeof un->sun_path - 1);
        un->sun_family = AF_UNIX;
        memcpy(un->sun_path, path, strlen(path) + 1);
        *len = (socklen_t)sizeof *un;
        return DJ_OK;
    }
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || !colon[1] || (size_t)(colon - addr) >= sizeof host)
        return dj_fail(DJ_EINVAL, "address '%s': want HOST:PORT, [IPv6]:PORT or unix:/path", addr);
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    char *h = host;
    size_t hl = strlen(h);
    if (h[0] == '[') {
        if (hl < 3 || h[hl - 1] != ']') return dj_fail(DJ_EINVAL, "address '%s': unbalanced [ ]", addr);
        h[hl - 1] = '\0';
        h++;
    }
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (errno || *end || port < 0 || port > 65535)
        return dj_fail(DJ_EINVAL, "address '%s': port '%s' is not in [0, 65535]", addr, colon + 1);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(h, colon + 1, &hints, &res);
    if (rc != 0 || !res) return dj_fail(DJ_EINVAL, "address '%s': %s", addr, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return DJ_OK;
}

dj_status dj__random_id(uint64_t *out) {
    uint64_t v = 0;
    do {
        ssize_t n = getrandom(&v, sizeof v, 0);
        if (n != (ssize_t)sizeof v) return dj_fail(DJ_EIO, "getrandom: %s", strerror(errno));
    } while (v == 0);
    *out = v;
    return DJ_OK;
}
