/* capture_mpk.c: a small msgpack reader for captured graphs - a cursor over bytes that never
 * reads past the end and checks every count against the bytes left before anyone allocates. */
#include <string.h>

#include "capture/capture_impl.h"

static bool need(const dj__mp *m, size_t n) { return (size_t)(m->end - m->p) >= n; }

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

dj__mp_type dj__mp_peek(const dj__mp *m) {
    if (!need(m, 1)) return DJ_MP_BAD;
    const uint8_t c = *m->p;
    if (c <= 0x7f || c >= 0xe0) return DJ_MP_INT;
    if (c >= 0x80 && c <= 0x8f) return DJ_MP_MAP;
    if (c >= 0x90 && c <= 0x9f) return DJ_MP_ARRAY;
    if (c >= 0xa0 && c <= 0xbf) return DJ_MP_STR;
    switch (c) {
    case 0xc0: return DJ_MP_NIL;
    case 0xc2: case 0xc3: return DJ_MP_BOOL;
    case 0xc4: case 0xc5: case 0xc6: return DJ_MP_BIN;
    case 0xca: case 0xcb: return DJ_MP_FLOAT;
    case 0xcc: case 0xcd: case 0xce: case 0xcf: case 0xd0: case 0xd1: case 0xd2: case 0xd3: return DJ_MP_INT;
    case 0xd9: case 0xda: case 0xdb: return DJ_MP_STR;
    case 0xdc: case 0xdd: return DJ_MP_ARRAY;
    case 0xde: case 0xdf: return DJ_MP_MAP;
    default: return DJ_MP_BAD; /* ext types and 0xc1 are not in the schema */
    }
}

bool dj__mp_nil(dj__mp *m) {
    if (!need(m, 1) || *m->p != 0xc0) return false;
    m->p++;
    return true;
}

bool dj__mp_bool(dj__mp *m, bool *v) {
    if (!need(m, 1) || (*m->p != 0xc2 && *m->p != 0xc3)) return false;
    *v = *m->p == 0xc3;
    m->p++;
    return true;
}

bool dj__mp_int(dj__mp *m, int64_t *v) {
    if (!need(m, 1)) return false;
    const uint8_t c = *m->p;
    if (c <= 0x7f) { *v = c; m->p++; return true; }
    if (c >= 0xe0) { *v = (int8_t)c; m->p++; return true; }
    int n;
    bool sgn;
    switch (c) {
    case 0xcc: n = 1; sgn = false; break;
    case 0xcd: n = 2; sgn = false; break;
    case 0xce: n = 4; sgn = false; break;
    case 0xcf: n = 8; sgn = false; break;
    case 0xd0: n = 1; sgn = true; break;
    case 0xd1: n = 2; sgn = true; break;
    case 0xd2: n = 4; sgn = true; break;
    case 0xd3: n = 8; sgn = true; break;
    default: return false;
    }
    if (!need(m, 1 + (size_t)n)) return false;
    const uint64_t u = be(m->p + 1, n);
    if (sgn) {
        if (n == 1) *v = (int8_t)u;
        else if (n == 2) *v = (int16_t)u;
        else if (n == 4) *v = (int32_t)u;
        else *v = (int64_t)u;
    } else {
        if (u > (uint64_t)INT64_MAX) return false;
        *v = (int64_t)u;
    }
    m->p += 1 + n;
    return true;
}

bool dj__mp_float(dj__mp *m, double *v) {
    if (!need(m, 1)) return false;
    if (*m->p == 0xca) {
        if (!need(m, 5)) return false;
        const uint32_t u = (uint32_t)be(m->p + 1, 4);
        float f;
        memcpy(&f, &u, 4);
        *v = f;
        m->p += 5;
        return true;
    }
    if (*m->p == 0xcb) {
        if (!need(m, 9)) return false;
        const uint64_t u = be(m->p + 1, 8);
        memcpy(v, &u, 8);
        m->p += 9;
        return true;
    }
    return false;
}

static bool sized(dj__mp *m, uint8_t c8, uint8_t c16, uint8_t c32, const uint8_t **s, uint32_t *n) {
    if (!need(m, 1)) return false;
    const uint8_t c = *m->p;
    int hdr;
    if (c == c8) hdr = 1;
    else if (c == c16) hdr = 2;
    else if (c == c32) hdr = 4;
    else return false;
    if (!need(m, 1 + (size_t)hdr)) return false;
    const uint64_t len = be(m->p + 1, hdr);
    if (!need(m, 1 + (size_t)hdr + len)) return false;
    *s = m->p + 1 + hdr;
    *n = (uint32_t)len;
    m->p += 1 + hdr + len;
    return true;
}

bool dj__mp_str(dj__mp *m, const char **s, uint32_t *n) {
    if (need(m, 1) && *m->p >= 0xa0 && *m->p <= 0xbf) {
        const uint32_t len = *m->p & 0x1f;
        if (!need(m, 1 + (size_t)len)) return false;
        *s = (const char *)m->p + 1;
        *n = len;
        m->p += 1 + len;
        return true;
    }
    return sized(m, 0xd9, 0xda, 0xdb, (const uint8_t **)s, n);
}

bool dj__mp_bin(dj__mp *m, const uint8_t **s, uint32_t *n) { return sized(m, 0xc4, 0xc5, 0xc6, s, n); }

static bool container(dj__mp *m, uint8_t fix_lo, uint8_t c16, uint8_t c32, uint32_t *n, size_t per) {
    if (!need(m, 1)) return false;
    const uint8_t c = *m->p;
    uint64_t len;
    int hdr = 0;
    if (c >= fix_lo && c <= fix_lo + 15) len = c & 0x0f;
    else if (c == c16) hdr = 2;
    else if (c == c32) hdr = 4;
    else return false;
    if (hdr) {
        if (!need(m, 1 + (size_t)hdr)) return false;
        len = be(m->p + 1, hdr);
    }
    m->p += 1 + hdr;
    if ((uint64_t)(m->end - m->p) / per < len) return false; /* a count the bytes cannot hold */
    *n = (uint32_t)len;
    return true;
}

bool dj__mp_array(dj__mp *m, uint32_t *n) { return container(m, 0x90, 0xdc, 0xdd, n, 1); }
bool dj__mp_map(dj__mp *m, uint32_t *n) { return container(m, 0x80, 0xde, 0xdf, n, 2); }

bool dj__mp_skip(dj__mp *m, int depth) {
    if (depth <= 0) return false;
    const char *s;
    const uint8_t *b;
    uint32_t n;
    int64_t i;
    double f;
    bool v;
    switch (dj__mp_peek(m)) {
    case DJ_MP_NIL: return dj__mp_nil(m);
    case DJ_MP_BOOL: return dj__mp_bool(m, &v);
    case DJ_MP_INT:
        if (need(m, 9) && *m->p == 0xcf) { m->p += 9; return true; } /* any uint64 */
        return dj__mp_int(m, &i);
    case DJ_MP_FLOAT: return dj__mp_float(m, &f);
    case DJ_MP_STR: return dj__mp_str(m, &s, &n);
    case DJ_MP_BIN: return dj__mp_bin(m, &b, &n);
    case DJ_MP_ARRAY:
        if (!dj__mp_array(m, &n)) return false;
        for (uint32_t k = 0; k < n; k++)
            if (!dj__mp_skip(m, depth - 1)) return false;
        return true;
    case DJ_MP_MAP:
        if (!dj__mp_map(m, &n)) return false;
        for (uint32_t k = 0; k < 2 * n; k++)
            if (!dj__mp_skip(m, depth - 1)) return false;
        return true;
    case DJ_MP_BAD: break;
    }
    return false;
}
