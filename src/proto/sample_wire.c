/* sample_wire.c: the sampling fields' msgpack codec, one loop over the table
 * of djinn/sample_schema.h each way, so a new field needs no line here. */
#include "proto/sample_wire.h"

#include <stdlib.h>

#include "djinn/alloc.h"

void dj__sample_encode(dj__mw *w, const dj_sampler_params *p) {
    for (size_t i = 0; i < dj_sample_n_fields; i++) {
        const dj_sample_field *f = &dj_sample_fields[i];
        if (f->type == DJ_SAMPLE_F32) {
            const double v = dj_sample_field_f64(p, f);
            if (v != 0.0 && v != f->def) dj__mw_f64(w, f->name, v);
        } else {
            const uint64_t v = dj_sample_field_u64(p, f);
            if (v != 0 && (double)v != f->def) dj__mw_u64(w, f->name, v);
        }
    }
}

dj_status dj__sample_decode(const dj__meta *m, dj_sampler_params *out) {
    *out = dj_sample_schema_default();
    for (size_t i = 0; i < dj_sample_n_fields; i++) {
        const dj_sample_field *f = &dj_sample_fields[i];
        dj_status st;
        if (f->type == DJ_SAMPLE_F32) {
            double v = f->def;
            if ((st = dj__meta_f64(m, f->name, false, &v)) != DJ_OK) return st;
            dj_sample_field_set_f64(out, f, v);
        } else {
            uint64_t v = (uint64_t)f->def;
            if ((st = dj__meta_u64(m, f->name, false, &v)) != DJ_OK) return st;
            dj_sample_field_set_u64(out, f, v);
        }
    }
    return dj_sample_schema_check(out);
}

void dj__logit_bias_encode(dj__mw *w, const dj_logit_bias *bias, size_t n) {
    if (!n) return;
    dj__mw_key(w, "logit_bias");
    msgpack_pack_array(&w->pk, n);
    for (size_t k = 0; k < n; k++) {
        msgpack_pack_array(&w->pk, 2);
        msgpack_pack_uint32(&w->pk, (uint32_t)bias[k].id);
        msgpack_pack_double(&w->pk, bias[k].bias);
    }
}

dj_status dj__logit_bias_decode(const dj__meta *m, dj_logit_bias **out, size_t *n) {
    *out = NULL;
    *n = 0;
    const msgpack_object *o = dj__meta_get(m, "logit_bias");
    if (!o) return DJ_OK;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return dj_fail(DJ_EFORMAT, "metadata field 'logit_bias' must be an array of [token id, bias] pairs");
    const uint32_t k = o->via.array.size;
    if (k == 0) return DJ_OK;
    if (k > DJ_MAX_LOGIT_BIAS)
        return dj_fail(DJ_EINVAL, "logit_bias has %u entries: at most %d", k, DJ_MAX_LOGIT_BIAS);
    dj_logit_bias *b = dj_malloc((size_t)k * sizeof *b);
    if (!b) return dj_fail(DJ_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < k; i++) {
        const msgpack_object *e = &o->via.array.ptr[i];
        uint64_t id;
        double v;
        if (e->type != MSGPACK_OBJECT_ARRAY || e->via.array.size != 2 || !dj__obj_u64(&e->via.array.ptr[0], &id) ||
            id > INT32_MAX || !dj__obj_f64(&e->via.array.ptr[1], &v)) {
            free(b);
            return dj_fail(DJ_EFORMAT, "metadata field 'logit_bias'[%u] is not a [token id in [0, 2^31), number] pair",
                           i);
        }
        b[i] = (dj_logit_bias){.id = (int32_t)id, .bias = (float)v};
        if (!(v >= -DJ_LOGIT_BIAS_MAX_ABS && v <= DJ_LOGIT_BIAS_MAX_ABS)) b[i].bias = (float)NAN; /* refused below */
    }
    const dj_status st = dj_logit_bias_check(b, k, 0);
    if (st != DJ_OK) {
        free(b);
        return st;
    }
    *out = b;
    *n = k;
    return DJ_OK;
}
