/* guard.c: djinnd's defences against hostile clients that need no socket -
 * the token file (read by length, with roles), constant-time token lookup,
 * the per-peer failed-HELLO schedule and the scrubbing of error text. */
#define _GNU_SOURCE
#include <errno.h>
#include "djinn/alloc.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "server/server_impl.h"

/* A token file bigger than this is not a token file. */
#define TOKEN_FILE_MAX (64 * 1024)

/* ---- the token file ---- */

static dj_status parse_qos_list(const char *path, int line, const char *v, size_t n, uint32_t *mask) {
    *mask = 0;
    while (n) {
        size_t k = 0;
        while (k < n && v[k] != ',') k++;
        char name[16];
        dj_qos q;
        if (k == 0 || k >= sizeof name)
            return dj_fail(DJ_EINVAL, "--token-file %s line %d: empty or over-long class in qos=", path, line);
        memcpy(name, v, k);
        name[k] = '\0';
        if (dj_qos_parse(name, &q) != DJ_OK)
            return dj_fail(DJ_EINVAL, "--token-file %s line %d: unknown class '%s' (realtime, interactive, batch)",
                           path, line, name);
        *mask |= 1u << q;
        v += k;
        n -= k;
        if (n) { /* the comma */
            v++;
            n--;
            if (!n) return dj_fail(DJ_EINVAL, "--token-file %s line %d: qos= ends with a comma", path, line);
        }
    }
    return DJ_OK;
}

/* One line "TOKEN [qos=a,b] [admin] [shared] [name=NAME]" (bytes [p, p+n), no newline). */
static dj_status parse_line(const char *path, int line, const char *p, size_t n, dj__token *t, bool *blank) {
    size_t i = 0, field = 0;
    *blank = true;
    memset(t, 0, sizeof *t);
    t->qos_mask = 1u << DJ_QOS_INTERACTIVE | 1u << DJ_QOS_BATCH;
    while (i < n) {
        while (i < n && (p[i] == ' ' || p[i] == '\t')) i++;
        if (i == n) break;
        if (field == 0 && p[i] == '#') return DJ_OK; /* a comment */
        size_t k = i;
        while (k < n && p[k] != ' ' && p[k] != '\t') k++;
        const char *w = p + i;
        const size_t wn = k - i;
        if (field == 0) {
            if (wn > DJ__TOKEN_MAX)
                return dj_fail(DJ_EINVAL, "--token-file %s line %d: token of %zu bytes (at most %d)", path, line, wn,
                               DJ__TOKEN_MAX);
            memcpy(t->secret, w, wn);
            t->len = wn;
            *blank = false;
        } else if (wn == 5 && !memcmp(w, "admin", 5)) {
            t->admin = true;
        } else if (wn == 6 && !memcmp(w, "shared", 6)) {
            t->shared = true;
        } else if (wn > 5 && !memcmp(w, "name=", 5)) {
            if (wn - 5 >= sizeof t->name)
                return dj_fail(DJ_EINVAL, "--token-file %s line %d: name= of %zu bytes (at most %zu)", path, line,
                               wn - 5, sizeof t->name - 1);
            memcpy(t->name, w + 5, wn - 5);
            t->name[wn - 5] = '\0';
        } else if (wn > 4 && !memcmp(w, "qos=", 4)) {
            dj_status st = parse_qos_list(path, line, w + 4, wn - 4, &t->qos_mask);
            if (st != DJ_OK) return st;
        } else {
            return dj_fail(DJ_EINVAL, "--token-file %s line %d: unknown attribute '%.*s' (want qos=CLASS,..., admin, shared or name=NAME)",
                           path, line, (int)(wn > 32 ? 32 : wn), w);
        }
        field++;
        i = k;
    }
    return DJ_OK;
}

dj_status dj__tokens_load(const char *path, dj__token **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return dj_fail(DJ_EIO, "--token-file %s: %s", path, strerror(errno));
    char *buf = dj_malloc(TOKEN_FILE_MAX + 1);
    dj__token *toks = dj_calloc(DJ__TOKENS_MAX, sizeof *toks);
    size_t len = buf ? fread(buf, 1, TOKEN_FILE_MAX + 1, f) : 0;
    const bool read_err = ferror(f) != 0;
    fclose(f);
    dj_status st = DJ_OK;
    if (!buf || !toks) {
        st = dj_fail(DJ_ENOMEM, "out of memory");
        goto fail;
    }
    if (read_err) {
        st = dj_fail(DJ_EIO, "--token-file %s: read error", path);
        goto fail;
    }
    if (len > TOKEN_FILE_MAX) {
        st = dj_fail(DJ_EINVAL, "--token-file %s: larger than %d bytes", path, TOKEN_FILE_MAX);
        goto fail;
    }
    size_t n = 0;
    int line = 1;
    for (size_t i = 0; i < len;) {
        size_t e = i;
        while (e < len && buf[e] != '\n') e++;
        size_t le = e;
        if (le > i && buf[le - 1] == '\r') le--;
        for (size_t k = i; k < le; k++) {
            const unsigned char ch = (unsigned char)buf[k];
            if (ch == 0) {
                st = dj_fail(DJ_EINVAL, "--token-file %s line %d: a NUL byte (tokens are printable ASCII)", path,
                             line);
                goto fail;
            }
            if ((ch < 0x21 || ch > 0x7e) && ch != ' ' && ch != '\t') {
                st = dj_fail(DJ_EINVAL, "--token-file %s line %d: byte 0x%02x (tokens are printable ASCII)", path,
                             line, ch);
                goto fail;
            }
        }
        bool blank;
        dj__token t;
        if ((st = parse_line(path, line, buf + i, le - i, &t, &blank)) != DJ_OK) goto fail;
        if (!blank) {
            if (n == DJ__TOKENS_MAX) {
                st = dj_fail(DJ_EINVAL, "--token-file %s: more than %d tokens", path, DJ__TOKENS_MAX);
                goto fail;
            }
            if (!t.shared) dj__cache_salt_of(NULL, t.secret, t.len, t.cache_salt);
            if (!t.name[0]) snprintf(t.name, sizeof t.name, "line%d", line);
            t.tenant = n + 1;
            toks[n++] = t;
        }
        i = e + 1;
        line++;
    }
    if (n == 0) {
        st = dj_fail(DJ_EINVAL, "--token-file %s holds no token", path);
        goto fail;
    }
    free(buf);
    *out = toks;
    *n_out = n;
    return DJ_OK;
fail:
    free(buf);
    free(toks);
    return st;
}

/* Every byte of every token is looked at whatever the guess, so the time
 * says nothing about how much of a token matched. */
const dj__token *dj__token_find(const dj__token *t, size_t n_tokens, const char *tok, size_t n) {
    const dj__token *found = NULL;
    for (size_t k = 0; k < n_tokens; k++) {
        unsigned d = n != t[k].len;
        for (size_t i = 0; i < DJ__TOKEN_MAX; i++) {
            const unsigned char g = i < n ? (unsigned char)tok[i] : 0;
            d |= (unsigned)(g ^ (unsigned char)t[k].secret[i]);
        }
        if (d == 0) found = &t[k];
    }
    return found;
}

/* ---- failed HELLOs, per peer ---- */

/* Wait before the next HELLO of a peer with `fails` failures: 100 ms
 * doubling to 2 s. */
static uint64_t penalty_ms(uint32_t fails) {
    if (!fails) return 0;
    const uint32_t sh = fails > 6 ? 5 : fails - 1;
    const uint64_t d = (uint64_t)100 << sh;
    return d > 2000 ? 2000 : d;
}

/* The record a peer's HELLOs answer to: its own, or once the table is full
 * the shared overflow record (key 0), so that new addresses past
 * DJ__PEERS_MAX are slowed together rather than not at all. */
static dj__peer *peer_of(dj__map *peers, uint64_t key) {
    dj__peer *p = dj__map_get(peers, key);
    if (!p && peers->n >= DJ__PEERS_MAX) p = dj__map_get(peers, 0);
    return p;
}

uint64_t dj__peer_check_at(dj__map *peers, uint64_t key, uint64_t now) {
    const dj__peer *p = peer_of(peers, key);
    if (!p || !p->fails) return now;
    const uint64_t at = p->checked_ms + penalty_ms(p->fails);
    return at > now ? at : now;
}

uint64_t dj__peer_hello_at(dj__map *peers, uint64_t key, uint64_t now) {
    dj__peer *p = peer_of(peers, key);
    if (!p || !p->fails) return now;
    const uint64_t at = p->next_ms > now ? p->next_ms : now;
    if (at > now + DJ__PEER_MAX_WAIT_MS) return at; /* refused by the caller: no slot taken */
    p->next_ms = at + penalty_ms(p->fails); /* the slot after this one */
    return at;
}

bool dj__peer_wait(dj__map *peers, uint64_t key) {
    dj__peer *p = peer_of(peers, key);
    if (!p) return true; /* nothing to wait for */
    if (p->waiting >= DJ__PEER_WAITING) return false;
    p->waiting++;
    return true;
}

void dj__peer_unwait(dj__map *peers, uint64_t key) {
    dj__peer *p = peer_of(peers, key);
    if (p && p->waiting) p->waiting--;
}

void dj__peer_hello_result(dj__map *peers, uint64_t key, uint64_t now, bool ok) {
    dj__peer *p = dj__map_get(peers, key);
    if (ok) {
        /* a valid token clears its own address (never the shared overflow
         * record); HELLOs still held back go at once */
        if (p && p->waiting) p->fails = 0;
        else if (p) free(dj__map_del(peers, key));
        return;
    }
    if (!p) {
        if (peers->n >= DJ__PEERS_MAX) key = 0; /* full: the overflow shares one record */
        p = dj__map_get(peers, key);
        if (!p) {
            p = dj_calloc(1, sizeof *p);
            if (!p || dj__map_put(peers, key, p) != DJ_OK) {
                free(p);
                return;
            }
        }
    }
    p->fails++;
    p->last_fail_ms = p->checked_ms = now;
    if (p->next_ms < now + penalty_ms(p->fails)) p->next_ms = now + penalty_ms(p->fails);
}

void dj__peers_sweep(dj__map *peers, uint64_t now) {
    for (size_t b = 0; b < peers->n_buckets; b++)
        for (dj__ment *e = peers->b[b], *nx; e; e = nx) {
            nx = e->next;
            dj__peer *p = e->val;
            if (!p->waiting && now > p->next_ms && now - p->last_fail_ms > DJ__PEER_FORGET_MS)
                free(dj__map_del(peers, e->key));
        }
}

/* ---- error text ---- */

static char models_dir[PATH_MAX], models_real[PATH_MAX];

void dj__scrub_set_models(const char *dir) {
    snprintf(models_dir, sizeof models_dir, "%s", dir ? dir : "");
    models_real[0] = '\0';
    if (dir && !realpath(dir, models_real)) models_real[0] = '\0';
}

/* Length of a valid UTF-8 sequence at p (n bytes left), 0 if invalid. */
static size_t utf8_len(const unsigned char *p, size_t n) {
    if (p[0] < 0x80) return 1;
    size_t k;
    uint32_t cp;
    if ((p[0] & 0xe0) == 0xc0) k = 2, cp = p[0] & 0x1f;
    else if ((p[0] & 0xf0) == 0xe0) k = 3, cp = p[0] & 0x0f;
    else if ((p[0] & 0xf8) == 0xf0) k = 4, cp = p[0] & 0x07;
    else return 0;
    if (k > n) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return k;
}

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static bool ends_path(char c) {
    return c == '\0' || c == ' ' || c == '\t' || c == '\n' || c == '\'' || c == '"' || c == ':' || c == ',' ||
           c == ')' || c == ';';
}

void dj__scrub_message(const char *msg, char *out, size_t cap) {
    size_t o = 0;
    if (!cap) return;
#define PUT(ch)                                                                                                    \
    do {                                                                                                           \
        if (o + 1 < cap) out[o++] = (ch);                                                                          \
    } while (0)
    const size_t n = strlen(msg);
    for (size_t i = 0; i < n;) {
        const char *p = msg + i;
        /* the model store's own path: the model's folder name is enough */
        const char *dirs[2] = {models_real, models_dir};
        bool skipped = false;
        for (int d = 0; d < 2 && !skipped; d++) {
            const size_t dl = strlen(dirs[d]);
            if (dl > 1 && !strncmp(p, dirs[d], dl) && p[dl] == '/') {
                i += dl + 1;
                skipped = true;
            }
        }
        if (skipped) continue;
        /* any other absolute path: its last component */
        if (p[0] == '/' && (i == 0 || ends_path(msg[i - 1]) || msg[i - 1] == '=' || msg[i - 1] == '(')) {
            size_t e = i, last = i;
            while (!ends_path(msg[e])) {
                if (msg[e] == '/') last = e;
                e++;
            }
            for (const char *q = "..."; *q; q++) PUT(*q);
            for (size_t k = last; k < e; k++) PUT(msg[k]);
            i = e;
            continue;
        }
        /* a pointer: 0x and more hex digits than any code we print */
        if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
            size_t h = 2;
            while (is_hex(p[h])) h++;
            if (h - 2 > 8) {
                for (const char *q = "0x?"; *q; q++) PUT(*q);
                i += h;
                continue;
            }
        }
        const size_t k = utf8_len((const unsigned char *)p, n - i);
        if (k == 0 || (k == 1 && ((unsigned char)p[0] < 0x20 || p[0] == 0x7f) && p[0] != '\n')) {
            PUT('?');
            i++;
            continue;
        }
        if (o + k >= cap) break; /* never cut a character */
        memcpy(out + o, p, k);
        o += k;
        i += k;
    }
#undef PUT
    out[o] = '\0';
}

/* ---- the prefix cache's salts ---- */

void dj__cache_salt_of(const uint64_t base[2], const char *bytes, size_t n, uint64_t out[2]) {
    if (!base && !n) {
        out[0] = out[1] = 0;
        return;
    }
    /* a 128-bit hash of (base, n, bytes): a token's salt never holds its secret in clear, no
     * (base, cache_salt) pair gives another's, and a NULL base (a token's own salt) is not {0, 0} */
    uint8_t buf[4 * sizeof(uint64_t) + DJ__SALT_BYTES_MAX];
    const uint64_t head[4] = {0x646a2d73616c7400ull /* "dj-salt" */, base ? base[0] : 1, base ? base[1] : 1,
                              (uint64_t)n};
    if (n > DJ__SALT_BYTES_MAX) n = DJ__SALT_BYTES_MAX; /* callers refuse longer ones */
    memcpy(buf, head, sizeof head);
    if (n) memcpy(buf + sizeof head, bytes, n);
    const XXH128_hash_t k = XXH3_128bits(buf, sizeof head + n);
    out[0] = k.low64;
    out[1] = k.high64;
}
