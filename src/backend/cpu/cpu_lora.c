/* cpu_lora.c: the CPU reference of LORA - each row's low-rank update
 * out[i] += scale * B (A x[i]) of its own adapter, every row alone. */
#include "backend/cpu/cpu_impl.h"

/* Rows [lo, hi): t = A x in double, then out += scale * B t, each sum in a
 * fixed order, so a row's result depends on nothing but the row. */
static void lora_rows(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const dj_op_call *c = ctx;
    double t[DJ_LORA_MAX_RANK];
    for (size_t i = lo; i < hi; i++) {
        const int32_t a = c->lora_row[i];
        if (a < 0 || !c->lora[a].a) continue;
        const dj_lora_mat *l = &c->lora[a];
        const float *x = (const float *)c->x + i * c->k;
        float *o = (float *)c->out + i * c->m;
        for (uint32_t r = 0; r < l->rank; r++) {
            const float *ar = l->a + (size_t)r * c->k;
            double s = 0.0;
            for (uint32_t j = 0; j < c->k; j++) s += (double)ar[j] * (double)x[j];
            t[r] = s;
        }
        for (uint32_t j = 0; j < c->m; j++) {
            const float *br = l->b + (size_t)j * l->ldb;
            double s = 0.0;
            for (uint32_t r = 0; r < l->rank; r++) s += (double)br[r] * t[r];
            o[j] = (float)((double)o[j] + (double)l->scale * s);
        }
    }
}

dj_status dj__cpu_lora(dj_cpu_backend *cb, const dj_op_call *c) {
    dj__cpu_pool_for(cb->pool, c->n, 1, lora_rows, (void *)c);
    return DJ_OK;
}
