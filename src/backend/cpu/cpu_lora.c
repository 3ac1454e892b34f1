/* cpu_lora.c: the CPU reference of LORA - each row's low-rank update
 * out[i] += scale * B (A x[i]) of its own adapter, every row alone. */
#include <stdlib.h>

#include "backend/cpu/cpu_impl.h"

/* Both products run on the decode kernel (`dot`, cpu_kern.h): every element
 * in the kernels' one summation order, so a row's bits depend on nothing but
 * the row - not the batch, the threads or the instruction set. */

#define UP_COLS 256 /* output columns of one lora_up item */

typedef struct lora_job {
    const dj_op_call *c;
    const dj__cpu_kernels *K;
    float *t;      /* [n][rmax] A x of each row */
    uint32_t rmax; /* the largest rank of the call's adapters */
} lora_job;

static const dj_lora_mat *row_mat(const dj_op_call *c, size_t i) {
    const int32_t a = c->lora_row[i];
    return a >= 0 && c->lora[a].a ? &c->lora[a] : NULL;
}

/* item i: t[i][0..rank) = A x[i] */
static void lora_down(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const lora_job *jb = ctx;
    const dj_op_call *c = jb->c;
    for (size_t i = lo; i < hi; i++) {
        const dj_lora_mat *l = row_mat(c, i);
        if (l)
            jb->K->dot((const float *)c->x + i * c->k, c->k, 1, l->a, (size_t)c->k * sizeof(float), l->rank,
                       DJ_DTYPE_F32, c->k, jb->t + i * jb->rmax, 1);
    }
}

/* items i * chunks + q: out[i][j] += scale * B[j] . t[i] for the q-th UP_COLS columns */
static void lora_up(void *ctx, size_t lo, size_t hi, int thread) {
    (void)thread;
    const lora_job *jb = ctx;
    const dj_op_call *c = jb->c;
    const size_t chunks = (c->m + UP_COLS - 1) / UP_COLS;
    float u[UP_COLS];
    for (size_t it = lo; it < hi; it++) {
        const size_t i = it / chunks, j0 = it % chunks * UP_COLS, j1 = j0 + UP_COLS < c->m ? j0 + UP_COLS : c->m;
        const dj_lora_mat *l = row_mat(c, i);
        if (!l) continue;
        jb->K->dot(jb->t + i * jb->rmax, jb->rmax, 1, l->b + j0 * l->ldb, (size_t)l->ldb * sizeof(float),
                   (uint32_t)(j1 - j0), DJ_DTYPE_F32, l->rank, u, 1);
        float *o = (float *)c->out + i * c->m;
        for (size_t j = j0; j < j1; j++) o[j] += l->scale * u[j - j0];
    }
}

dj_status dj__cpu_lora(dj_cpu_backend *cb, const dj_op_call *c) {
    uint32_t rmax = 0;
    for (uint32_t a = 0; a < c->n_lora; a++)
        if (c->lora[a].a && c->lora[a].rank > rmax) rmax = c->lora[a].rank;
    if (!rmax || !c->n) return DJ_OK;
    lora_job jb = {.c = c, .K = cb->kern, .rmax = rmax, .t = malloc((size_t)c->n * rmax * sizeof(float))};
    if (!jb.t) return dj_fail(DJ_ENOMEM, "cpu lora: no memory for %u rows of rank %u", c->n, rmax);
    dj__cpu_pool_for(cb->pool, c->n, 1, lora_down, &jb);
    dj__cpu_pool_for(cb->pool, (size_t)c->n * ((c->m + UP_COLS - 1) / UP_COLS), 4, lora_up, &jb);
    free(jb.t);
    return DJ_OK;
}
