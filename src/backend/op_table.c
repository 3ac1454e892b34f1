/* op_table.c: the op descriptor table (include/djinn/op_table.h), generated
 * from DJ_OP_LIST so that an op without a DJ_OP_DESC_<op> row does not build. */
#include "djinn/op_table.h"

const dj_op_desc dj_op_descs[DJ_OP_COUNT] = {
#define DJ_OP_DESC_ROW_(e, name) [DJ_OP_##e] = DJ_OP_DESC_##e,
    DJ_OP_LIST(DJ_OP_DESC_ROW_)
#undef DJ_OP_DESC_ROW_
};

size_t dj_op_width(const dj_op_call *c, dj_opd_width w) {
    switch (w) {
    case DJ_OPD_WIDTH_NONE: return 0;
    case DJ_OPD_WIDTH_D: return c->d;
    case DJ_OPD_WIDTH_GROUPS_D: return (size_t)(c->groups ? c->groups : 1) * c->d;
    case DJ_OPD_WIDTH_M: return c->m;
    case DJ_OPD_WIDTH_K: return c->k;
    case DJ_OPD_WIDTH_HEADS: return (size_t)c->n_heads * c->head_dim;
    case DJ_OPD_WIDTH_KV_DIM: return c->kv ? c->kv->kv_dim : 0;
    }
    return 0;
}

dj_dtype dj_op_x_dtype(const dj_op_call *c, dj_dtype act) {
    const dj_op_desc *d = dj_op_desc_of(c->op);
    switch (d ? (dj_opd_x)d->x : DJ_OPD_X_NONE) {
    case DJ_OPD_X_RES: return c->x_dtype;
    case DJ_OPD_X_F32: return DJ_DTYPE_F32;
    case DJ_OPD_X_NONE:
    case DJ_OPD_X_ACT: break;
    }
    return act;
}
