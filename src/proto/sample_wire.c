/* sample_wire.c: the sampling fields' msgpack codec, one loop over the table
 * of djinn/sample_schema.h each way, so a new field needs no line here. */
#include "proto/sample_wire.h"

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
