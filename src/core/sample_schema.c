/* sample_schema.c: the sampling fields' table (sample_schema.h) as data, its
 * defaults and the one bounds check the client, daemon and engine share. */
#include "djinn/sample_schema.h"

#include <string.h>

#define DJ__SF_ROW(name, type, lo, lo_open, hi, def, doc) \
    {#name, offsetof(dj_sampler_params, name), type, lo, hi, lo_open, def, doc},
const dj_sample_field dj_sample_fields[] = {DJ_SAMPLE_FIELD_MAP(DJ__SF_ROW)};
#undef DJ__SF_ROW
const size_t dj_sample_n_fields = sizeof dj_sample_fields / sizeof dj_sample_fields[0];

/* The table and the struct agree: a mirror of the struct built from the
 * table has every member at the same offset and the same size, so a member
 * added to one and not the other (or out of order) fails the build. */
#define DJ__SF_CTYPE_DJ_SAMPLE_F32 float
#define DJ__SF_CTYPE_DJ_SAMPLE_U32 uint32_t
#define DJ__SF_CTYPE_DJ_SAMPLE_U64 uint64_t
#define DJ__SF_MEMBER(name, type, lo, lo_open, hi, def, doc) DJ__SF_CTYPE_##type name;
typedef struct dj__sample_mirror {
    DJ_SAMPLE_FIELD_MAP(DJ__SF_MEMBER)
} dj__sample_mirror;
#undef DJ__SF_MEMBER
#define DJ__SF_SAME(name, type, lo, lo_open, hi, def, doc)                                         \
    _Static_assert(offsetof(dj__sample_mirror, name) == offsetof(dj_sampler_params, name) &&      \
                       sizeof(((dj__sample_mirror *)0)->name) == sizeof(((dj_sampler_params *)0)->name), \
                   "sample_schema.h: " #name " is not where dj_sampler_params has it");
DJ_SAMPLE_FIELD_MAP(DJ__SF_SAME)
#undef DJ__SF_SAME
_Static_assert(sizeof(dj__sample_mirror) == sizeof(dj_sampler_params),
               "dj_sampler_params has a member that sample_schema.h's table lacks");

double dj_sample_field_f64(const dj_sampler_params *p, const dj_sample_field *f) {
    const char *b = (const char *)p + f->offset;
    switch (f->type) {
    case DJ_SAMPLE_F32: {
        float v;
        memcpy(&v, b, sizeof v);
        return v;
    }
    case DJ_SAMPLE_U32: {
        uint32_t v;
        memcpy(&v, b, sizeof v);
        return v;
    }
    case DJ_SAMPLE_U64: {
        uint64_t v;
        memcpy(&v, b, sizeof v);
        return (double)v;
    }
    }
    return 0;
}

uint64_t dj_sample_field_u64(const dj_sampler_params *p, const dj_sample_field *f) {
    if (f->type == DJ_SAMPLE_F32) {
        const double v = dj_sample_field_f64(p, f);
        return v >= 1.0 && v < 18446744073709551616.0 ? (uint64_t)v : 0;
    }
    const char *b = (const char *)p + f->offset;
    if (f->type == DJ_SAMPLE_U32) {
        uint32_t v;
        memcpy(&v, b, sizeof v);
        return v;
    }
    uint64_t v;
    memcpy(&v, b, sizeof v);
    return v;
}

void dj_sample_field_set_f64(dj_sampler_params *p, const dj_sample_field *f, double v) {
    char *b = (char *)p + f->offset;
    if (f->type == DJ_SAMPLE_F32) {
        const float x = (float)v;
        memcpy(b, &x, sizeof x);
    } else {
        dj_sample_field_set_u64(p, f, v >= 1.0 && v < 18446744073709551616.0 ? (uint64_t)v : 0);
    }
}

void dj_sample_field_set_u64(dj_sampler_params *p, const dj_sample_field *f, uint64_t v) {
    char *b = (char *)p + f->offset;
    if (f->type == DJ_SAMPLE_F32) {
        dj_sample_field_set_f64(p, f, (double)v);
    } else if (f->type == DJ_SAMPLE_U32) {
        const uint32_t x = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
        memcpy(b, &x, sizeof x);
    } else {
        memcpy(b, &v, sizeof v);
    }
}

dj_sampler_params dj_sample_schema_default(void) {
    dj_sampler_params p;
    memset(&p, 0, sizeof p);
    for (size_t i = 0; i < dj_sample_n_fields; i++) {
        const dj_sample_field *f = &dj_sample_fields[i];
        if (f->type == DJ_SAMPLE_F32) dj_sample_field_set_f64(&p, f, f->def);
        else dj_sample_field_set_u64(&p, f, (uint64_t)f->def);
    }
    return p;
}

dj_status dj_sample_schema_check(const dj_sampler_params *p) {
    for (size_t i = 0; i < dj_sample_n_fields; i++) {
        const dj_sample_field *f = &dj_sample_fields[i];
        if (f->type != DJ_SAMPLE_F32) continue; /* integers take any value of their type */
        const double v = dj_sample_field_f64(p, f);
        const bool above_lo = f->lo_open ? v > f->lo : v >= f->lo;
        if (!(above_lo && v <= f->hi && isfinite(v))) {
            if (isinf(f->hi))
                return dj_fail(DJ_EINVAL, "%s %g is out of range: must be a finite number %s %g", f->name, v,
                               f->lo_open ? ">" : ">=", f->lo);
            return dj_fail(DJ_EINVAL, "%s %g is out of range: must be in %c%g, %g]", f->name, v,
                           f->lo_open ? '(' : '[', f->lo, f->hi);
        }
    }
    return DJ_OK;
}

dj_status dj_logit_bias_check(const dj_logit_bias *bias, size_t n, uint32_t vocab) {
    if (n > DJ_MAX_LOGIT_BIAS) return dj_fail(DJ_EINVAL, "logit_bias has %zu entries: at most %d", n, DJ_MAX_LOGIT_BIAS);
    if (n && !bias) return dj_fail(DJ_EINVAL, "logit_bias: NULL entries");
    for (size_t k = 0; k < n; k++) {
        const float b = bias[k].bias;
        if (bias[k].id < 0 || (vocab && (uint32_t)bias[k].id >= vocab))
            return dj_fail(DJ_EINVAL, "logit_bias names token id %d: the model's ids are 0 to %u", (int)bias[k].id,
                           vocab ? vocab - 1 : (unsigned)INT32_MAX);
        if (!(b >= -DJ_LOGIT_BIAS_MAX_ABS && b <= DJ_LOGIT_BIAS_MAX_ABS)) /* NaN fails too */
            return dj_fail(DJ_EINVAL, "logit_bias of token id %d is %g: must be in [-100, 100]", (int)bias[k].id,
                           (double)b);
        for (size_t j = 0; j < k; j++) /* at most DJ_MAX_LOGIT_BIAS^2 / 2 compares, once per request */
            if (bias[j].id == bias[k].id)
                return dj_fail(DJ_EINVAL, "logit_bias names token id %d twice", (int)bias[k].id);
    }
    return DJ_OK;
}
