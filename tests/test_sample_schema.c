/* test_sample_schema.c: GENERATE's sampling fields from the one table - the C
 * codec's round trips, defaults and refusals, and the copies in docs/python. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/sample_schema.h"
#include "djinn/sampler.h"
#include "djinn/status.h"
#include "proto/sample_wire.h"
#include "testutil.h"

/* ---- the C codec ---- */

static dj_status decode_map(const dj__mw *w, dj_sampler_params *out, dj__meta *m) {
    CHECK_OK(dj__meta_parse(m, (const uint8_t *)w->sb.data, w->sb.size));
    return dj__sample_decode(m, out);
}

/* A value inside each field's bounds, not 0 and not its default. */
static void set_inside(dj_sampler_params *p, const dj_sample_field *f, unsigned salt) {
    if (f->type != DJ_SAMPLE_F32) {
        dj_sample_field_set_u64(p, f, f->type == DJ_SAMPLE_U64 ? (1ull << 63) + 5 + salt : 40u + salt);
        return;
    }
    const double hi = isinf(f->hi) ? f->lo + 4 : f->hi;
    double v = f->lo + (hi - f->lo) * (0.25 + 0.125 * (salt % 4));
    if (v == 0.0 || v == f->def) v = f->lo + (hi - f->lo) * 0.7;
    dj_sample_field_set_f64(p, f, v);
}

static void test_roundtrip(void) {
    dj__mw w;
    dj__meta m;
    dj_sampler_params p, q;
    /* a zeroed struct sends nothing and reads back as the defaults */
    memset(&p, 0, sizeof p);
    dj__mw_init(&w);
    dj__sample_encode(&w, &p);
    dj__mw_finish(&w);
    CHECK_MSG(w.n_keys == 0, "a zeroed dj_sampler_params wrote %u keys", w.n_keys);
    CHECK_OK(decode_map(&w, &q, &m));
    const dj_sampler_params d = dj_sample_schema_default();
    CHECK(!memcmp(&q, &d, sizeof q));
    CHECK(q.top_p == 1.0f && q.temperature == 0.0f && q.top_k == 0 && q.seed == 0);
    dj__meta_destroy(&m);
    dj__mw_destroy(&w);
    /* every field away from 0 and its default: each travels and comes back */
    for (unsigned salt = 0; salt < 4; salt++) {
        memset(&p, 0, sizeof p);
        for (size_t i = 0; i < dj_sample_n_fields; i++) set_inside(&p, &dj_sample_fields[i], salt);
        CHECK_OK(dj_sample_schema_check(&p));
        dj__mw_init(&w);
        dj__sample_encode(&w, &p);
        dj__mw_finish(&w);
        CHECK_MSG(w.n_keys == dj_sample_n_fields, "wrote %u keys of %zu", w.n_keys, dj_sample_n_fields);
        CHECK_OK(decode_map(&w, &q, &m));
        for (size_t i = 0; i < dj_sample_n_fields; i++) {
            const dj_sample_field *f = &dj_sample_fields[i];
            CHECK_MSG(dj_sample_field_u64(&p, f) == dj_sample_field_u64(&q, f) &&
                          dj_sample_field_f64(&p, f) == dj_sample_field_f64(&q, f),
                      "%s: sent %g, read %g", f->name, dj_sample_field_f64(&p, f), dj_sample_field_f64(&q, f));
        }
        dj__meta_destroy(&m);
        dj__mw_destroy(&w);
    }
    /* U32 saturates; U64 keeps all 64 bits */
    dj__mw_init(&w);
    dj__mw_u64(&w, "top_k", 1ull << 40);
    dj__mw_u64(&w, "seed", UINT64_MAX);
    dj__mw_finish(&w);
    CHECK_OK(decode_map(&w, &q, &m));
    CHECK(q.top_k == UINT32_MAX && q.seed == UINT64_MAX);
    dj__meta_destroy(&m);
    dj__mw_destroy(&w);
}

/* Each bounded field past each bound, NaN and the wrong type: refused, and
 * the message names the field and its range. */
static void test_refusals(void) {
    for (size_t i = 0; i < dj_sample_n_fields; i++) {
        const dj_sample_field *f = &dj_sample_fields[i];
        dj__mw w;
        dj__meta m;
        dj_sampler_params q;
        if (f->type == DJ_SAMPLE_F32) {
            const double bad[] = {f->lo_open ? f->lo : f->lo - 0.5, isinf(f->hi) ? INFINITY : f->hi + 0.5, NAN};
            for (size_t k = 0; k < 3; k++) {
                dj__mw_init(&w);
                dj__mw_f64(&w, f->name, bad[k]);
                dj__mw_finish(&w);
                CHECK_ST(decode_map(&w, &q, &m), DJ_EINVAL);
                char range[96];
                if (isinf(f->hi)) snprintf(range, sizeof range, "%s %g", f->lo_open ? ">" : ">=", f->lo);
                else snprintf(range, sizeof range, "%c%g, %g]", f->lo_open ? '(' : '[', f->lo, f->hi);
                CHECK_MSG(strstr(dj_last_error(), f->name) && strstr(dj_last_error(), range),
                          "%s = %g: '%s' does not name the field and %s", f->name, bad[k], dj_last_error(), range);
                dj__meta_destroy(&m);
                dj__mw_destroy(&w);
                /* the engine's check refuses the same value */
                dj_sampler_params p = dj_sample_schema_default();
                dj_sample_field_set_f64(&p, f, bad[k]);
                CHECK_ST(dj_sampler_params_check(&p), DJ_EINVAL);
            }
        } else {
            dj__mw_init(&w);
            dj__mw_i64(&w, f->name, -1);
            dj__mw_finish(&w);
            CHECK_ST(decode_map(&w, &q, &m), DJ_EFORMAT);
            CHECK_MSG(strstr(dj_last_error(), f->name) != NULL, "'%s' does not name %s", dj_last_error(), f->name);
            dj__meta_destroy(&m);
            dj__mw_destroy(&w);
        }
        dj__mw_init(&w);
        dj__mw_str(&w, f->name, "hot");
        dj__mw_finish(&w);
        CHECK_ST(decode_map(&w, &q, &m), DJ_EFORMAT);
        CHECK_MSG(strstr(dj_last_error(), f->name) != NULL, "'%s' does not name %s", dj_last_error(), f->name);
        dj__meta_destroy(&m);
        dj__mw_destroy(&w);
    }
}

/* ---- the copies: docs/protocol.md's table and python/djinn/_wire.py's
 * block, made here from the tables; checked (no arguments) or rewritten
 * (--write). ---- */

typedef struct buf {
    char *s;
    size_t n, cap;
} buf;

static void put(buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(buf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    const int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = (b->n + (size_t)k + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s) abort();
    }
    vsnprintf(b->s + b->n, (size_t)k + 1, fmt, ap2);
    va_end(ap2);
    b->n += (size_t)k;
}

/* A double as Python source: 0.5, -2.0, float("inf"). */
static const char *py_num(double v, char *out, size_t cap) {
    if (isinf(v)) snprintf(out, cap, "%sfloat(\"inf\")", v < 0 ? "-" : "");
    else {
        snprintf(out, cap, "%.17g", v);
        if (!strpbrk(out, ".e")) strncat(out, ".0", cap - strlen(out) - 1);
    }
    return out;
}

static const char *type_name(dj_sample_type t) {
    return t == DJ_SAMPLE_F32 ? "f32" : t == DJ_SAMPLE_U32 ? "u32" : "u64";
}

static void make_doc(buf *b) {
    put(b, "| field | type | range | default | what |\n| --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < dj_sample_n_fields; i++) {
        const dj_sample_field *f = &dj_sample_fields[i];
        char range[96];
        if (f->type == DJ_SAMPLE_U32) snprintf(range, sizeof range, "integer >= 0 (above 2^32-1: 2^32-1)");
        else if (f->type == DJ_SAMPLE_U64) snprintf(range, sizeof range, "integer in [0, 2^64)");
        else if (isinf(f->hi)) snprintf(range, sizeof range, "finite, %s %g", f->lo_open ? ">" : ">=", f->lo);
        else snprintf(range, sizeof range, "%c%g, %g]", f->lo_open ? '(' : '[', f->lo, f->hi);
        put(b, "| `%s` | %s | %s | %g | %s |\n", f->name, f->type == DJ_SAMPLE_F32 ? "number" : "integer", range,
            f->def, f->doc);
    }
}

static void make_py(buf *b) {
    put(b, "# Message types (include/djinn/protocol.h, DJ_MSG_TYPE_MAP).\n");
#define DJ__PY_MSG(name, code) put(b, "%s = 0x%02X\n", #name, code);
    DJ_MSG_TYPE_MAP(DJ__PY_MSG)
#undef DJ__PY_MSG
    put(b, "\n# dj_status codes (include/djinn/status.h, DJ_STATUS_MAP): stable on the wire.\nSTATUS_NAMES = {\n");
#define DJ__PY_ST(name, code, msg) \
    if (code) put(b, "    %d: \"DJ_%s\",\n", code, #name);
    DJ_STATUS_MAP(DJ__PY_ST)
#undef DJ__PY_ST
    put(b, "}\n\n# GENERATE's sampling fields (include/djinn/sample_schema.h): name -> (type, lo,\n"
           "# lo_open, hi, default, what); type f32 is a number in the bounds, u32/u64 an\n"
           "# integer >= 0 (u32 saturates at 2^32-1, u64 is below 2^64).\nSAMPLING = {\n");
    for (size_t i = 0; i < dj_sample_n_fields; i++) {
        const dj_sample_field *f = &dj_sample_fields[i];
        char lo[48], hi[48], def[48];
        const bool num = f->type == DJ_SAMPLE_F32;
        put(b, "    \"%s\": (\"%s\", %s, %s, %s, %s,\n        \"%s\"),\n", f->name, type_name(f->type),
            num ? py_num(f->lo, lo, sizeof lo) : "0", f->lo_open ? "True" : "False",
            num ? py_num(f->hi, hi, sizeof hi) : (f->type == DJ_SAMPLE_U32 ? "None" : "(1 << 64) - 1"),
            num ? py_num(f->def, def, sizeof def) : "0", f->doc);
    }
    put(b, "}\n");
}

/* The text between the line holding `begin` and the line holding `end` in
 * file rel: checked against want, or replaced by it. */
static void check_block(const char *rel, const char *begin, const char *end, const buf *want, bool write) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", DJ_SOURCE_DIR, rel);
    size_t len = 0;
    char *text = dj_test_read_file(path, &len);
    CHECK_MSG(text != NULL, "cannot read %s", path);
    if (!text) return;
    char *b = strstr(text, begin), *e = b ? strstr(b, end) : NULL;
    CHECK_MSG(b && e, "%s: no block between '%s' and '%s'", rel, begin, end);
    if (b && e) {
        char *from = strchr(b, '\n');
        char *to = e;
        while (to > text && to[-1] != '\n') to--; /* the start of the end marker's line */
        from = from ? from + 1 : e;
        const size_t have = (size_t)(to - from);
        const bool same = have == want->n && !memcmp(from, want->s, have);
        if (write && !same) {
            FILE *f = fopen(path, "wb");
            CHECK_MSG(f != NULL, "cannot write %s", path);
            if (f) {
                fwrite(text, 1, (size_t)(from - text), f);
                fwrite(want->s, 1, want->n, f);
                fwrite(to, 1, len - (size_t)(to - text), f);
                fclose(f);
                printf("rewrote %s\n", rel);
            }
        } else {
            CHECK_MSG(same,
                      "%s has drifted from the C tables; run `build/test_sample_schema --write` to regenerate "
                      "it. Want:\n%.*s\nHave:\n%.*s",
                      rel, (int)want->n, want->s, (int)have, from);
        }
    }
    free(text);
}

static void test_copies(bool write) {
    buf doc = {0}, py = {0};
    make_doc(&doc);
    make_py(&py);
    check_block("docs/protocol.md", "<!-- sampling fields: generated", "<!-- end of the sampling fields -->", &doc,
                write);
    check_block("python/djinn/_wire.py", "# --- generated by tests/test_sample_schema.c", "# --- end of the generated",
                &py, write);
    free(doc.s);
    free(py.s);
}

int main(int argc, char **argv) {
    const bool write = argc > 1 && !strcmp(argv[1], "--write");
    if (!write) {
        test_roundtrip();
        test_refusals();
    }
    test_copies(write);
    return dj_test_finish("test_sample_schema");
}
