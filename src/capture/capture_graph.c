/* capture_graph.c: captured graphs from msgpack - decoding, the validator (refs, arity, the
 * shapes and dtypes each op gives, sizes, limits) and the plan of every value on one stack. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture_impl.h"

const char *const dj__cop_names[DJ_COP_COUNT] = {
#define DJ__COP_NAME(e, name, na, no) name,
    DJ_COP_LIST(DJ__COP_NAME)
#undef DJ__COP_NAME
};
static const uint8_t cop_nargs[DJ_COP_COUNT] = {
#define DJ__COP_NA(e, name, na, no) na,
    DJ_COP_LIST(DJ__COP_NA)
#undef DJ__COP_NA
};
static const uint8_t cop_nout[DJ_COP_COUNT] = {
#define DJ__COP_NO(e, name, na, no) no,
    DJ_COP_LIST(DJ__COP_NO)
#undef DJ__COP_NO
};

const char *dj_cgraph_err_name(dj_cgraph_err kind) {
    switch (kind) {
#define DJ__CGRAPH_ERR_STR(name, st) \
    case DJ_CGRAPH_ERR_##name:       \
        return #name;
        DJ_CGRAPH_ERR_MAP(DJ__CGRAPH_ERR_STR)
#undef DJ__CGRAPH_ERR_STR
    }
    return "UNKNOWN";
}

static dj_status err_status(dj_cgraph_err kind) {
    switch (kind) {
#define DJ__CGRAPH_ERR_ST(name, st) \
    case DJ_CGRAPH_ERR_##name:      \
        return st;
        DJ_CGRAPH_ERR_MAP(DJ__CGRAPH_ERR_ST)
#undef DJ__CGRAPH_ERR_ST
    }
    return DJ_EINTERNAL;
}

const char *dj_cdtype_name(dj_cdtype t) {
    switch (t) {
    case DJ_CDTYPE_F32: return "f32";
    case DJ_CDTYPE_I64: return "i64";
    case DJ_CDTYPE_BOOL: return "bool";
    }
    return "?";
}

/* ---- the decoder's state and its one way to fail ---- */

typedef struct dec {
    dj__mp m;
    dj_cgraph_t *g;
    dj_cgraph_error *err;
    dj_cgraph_limits lim;
    int32_t node;          /* the node being read, -1 outside nodes */
    const char *op;        /* its op string (not NUL-terminated) */
    uint32_t op_len;
    const char *path;      /* the module path it was recorded in, or NULL */
    uint32_t path_len;
    uint32_t *node_base;   /* [n_nodes] value id of each node's output 0 */
    double ops;            /* the work of the nodes read so far (dj_cgraph_limits.max_ops) */
    int32_t *producer;     /* [n_vals] the node making each value, -1 for inputs and weights */
} dec;

static dj_status fail(dec *d, dj_cgraph_err kind, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static dj_status fail(dec *d, dj_cgraph_err kind, const char *fmt, ...) {
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    dj_cgraph_error e = {.kind = kind, .node = d->node};
    if (d->node >= 0 && d->op) {
        const int n = d->op_len < sizeof e.op - 1 ? (int)d->op_len : (int)sizeof e.op - 1;
        memcpy(e.op, d->op, (size_t)n);
        e.op[n] = '\0';
        for (int i = 0; i < n; i++)
            if (e.op[i] < 0x20 || e.op[i] == 0x7f) e.op[i] = '?'; /* bytes from the wire */
    }
    if (d->node >= 0 && d->path && d->path_len)
        snprintf(e.msg, sizeof e.msg, "captured graph: node %d (%s, in %.*s): %s", (int)d->node,
                 e.op[0] ? e.op : "?", (int)(d->path_len < 64 ? d->path_len : 64), d->path, what);
    else if (d->node >= 0)
        snprintf(e.msg, sizeof e.msg, "captured graph: node %d (%s): %s", (int)d->node, e.op[0] ? e.op : "?", what);
    else
        snprintf(e.msg, sizeof e.msg, "captured graph: %s", what);
    for (char *c = e.msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
    if (d->err) *d->err = e;
    return dj_fail(err_status(kind), "%s", e.msg);
}

/* ---- sizes ---- */

/* numel, with the product of the non-zero dims bounded by max_elems too: an empty tensor of
 * shape [2^40, 2^40, 0] would pass a bound on numel alone, and then the kernels' products of
 * its leading dims overflow. */
static dj_status info_finish(dec *d, dj_ctensor_info *t) {
    uint64_t n = 1;
    bool empty = false;
    for (uint32_t i = 0; i < t->rank; i++) {
        if (t->shape[i] < 0) return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "negative dimension %lld", (long long)t->shape[i]);
        const uint64_t s = (uint64_t)t->shape[i];
        if (!s) {
            empty = true;
            continue;
        }
        if (n > d->lim.max_elems / s)
            return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "a tensor of more than %llu elements (its non-zero dims)",
                        (unsigned long long)d->lim.max_elems);
        n *= s;
    }
    if (n > d->lim.max_elems)
        return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "a tensor of more than %llu elements",
                    (unsigned long long)d->lim.max_elems);
    t->numel = empty ? 0 : n;
    return DJ_OK;
}

static bool key_is(const char *s, uint32_t n, const char *k) { return strlen(k) == n && !memcmp(s, k, n); }

static dj_status read_dtype(dec *d, dj_cdtype *t) {
    const char *s;
    uint32_t n;
    if (!dj__mp_str(&d->m, &s, &n)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "dtype is not a string");
    if (key_is(s, n, "f32")) *t = DJ_CDTYPE_F32;
    else if (key_is(s, n, "i64")) *t = DJ_CDTYPE_I64;
    else if (key_is(s, n, "bool")) *t = DJ_CDTYPE_BOOL;
    else return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "dtype '%.*s' (f32, i64 and bool are built)", (int)(n < 16 ? n : 16), s);
    return DJ_OK;
}

static dj_status read_shape(dec *d, dj_ctensor_info *t) {
    uint32_t n;
    if (!dj__mp_array(&d->m, &n)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "shape is not an array");
    if (n > DJ_CGRAPH_MAX_RANK) return fail(d, DJ_CGRAPH_ERR_LIMIT, "rank %u above %d", n, DJ_CGRAPH_MAX_RANK);
    t->rank = n;
    for (uint32_t i = 0; i < n; i++)
        if (!dj__mp_int(&d->m, &t->shape[i])) return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "a dimension is not an int64");
    return info_finish(d, t);
}

/* {"shape": [...], "dtype": "f32"} plus, for weights, "name" and "hash". */
static dj_status read_spec(dec *d, dj_ctensor_info *t, uint32_t weight /* UINT32_MAX: not a weight */) {
    uint32_t n;
    if (!dj__mp_map(&d->m, &n)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a tensor spec is not a map");
    bool has_shape = false, has_dtype = false, has_hash = false;
    memset(t, 0, sizeof *t);
    for (uint32_t i = 0; i < n; i++) {
        const char *k;
        uint32_t kn;
        if (!dj__mp_str(&d->m, &k, &kn)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a tensor spec key is not a string");
        dj_status st = DJ_OK;
        if (key_is(k, kn, "shape")) {
            st = read_shape(d, t);
            has_shape = true;
        } else if (key_is(k, kn, "dtype")) {
            st = read_dtype(d, &t->dtype);
            has_dtype = true;
        } else if (weight != UINT32_MAX && key_is(k, kn, "hash")) {
            const uint8_t *h;
            uint32_t hn;
            if (!dj__mp_bin(&d->m, &h, &hn) || hn < 8 || hn > 32)
                return fail(d, DJ_CGRAPH_ERR_FORMAT, "weight %u: hash is not 8 to 32 bytes of bin", weight);
            memcpy(d->g->hashes[weight], h, hn);
            d->g->hash_len[weight] = (uint8_t)hn;
            has_hash = true;
        } else if (weight != UINT32_MAX && key_is(k, kn, "name")) {
            const char *s;
            uint32_t sn;
            if (!dj__mp_str(&d->m, &s, &sn)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "weight %u: name is not a string", weight);
            const uint32_t c = sn < sizeof d->g->names[0] - 1 ? sn : (uint32_t)sizeof d->g->names[0] - 1;
            memcpy(d->g->names[weight], s, c);
            d->g->names[weight][c] = '\0';
        } else if (!dj__mp_skip(&d->m, 8)) {
            return fail(d, DJ_CGRAPH_ERR_FORMAT, "a tensor spec value is malformed");
        }
        if (st != DJ_OK) return st;
    }
    if (!has_shape || !has_dtype) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a tensor spec without shape or dtype");
    if (weight != UINT32_MAX && !has_hash) return fail(d, DJ_CGRAPH_ERR_FORMAT, "weight %u has no hash", weight);
    return DJ_OK;
}

/* ---- arguments ---- */

static dj_status read_ref(dec *d, uint32_t *v) {
    uint32_t n;
    if (!dj__mp_map(&d->m, &n) || n != 1) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a reference is not a map of one key");
    const char *k;
    uint32_t kn;
    if (!dj__mp_str(&d->m, &k, &kn)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a reference key is not a string");
    dj_cgraph_t *g = d->g;
    if (key_is(k, kn, "n")) {
        uint32_t an;
        int64_t j, o;
        if (!dj__mp_array(&d->m, &an) || an != 2 || !dj__mp_int(&d->m, &j) || !dj__mp_int(&d->m, &o))
            return fail(d, DJ_CGRAPH_ERR_FORMAT, "a node reference is not [node, output]");
        if (j < 0 || j >= (int64_t)g->n_nodes)
            return fail(d, DJ_CGRAPH_ERR_REF, "reference to node %lld of %u", (long long)j, g->n_nodes);
        if (d->node < 0 ? false : j >= d->node)
            return fail(d, DJ_CGRAPH_ERR_CYCLE, "reads node %lld, which is not before it", (long long)j);
        if (o < 0 || o >= (int64_t)g->nodes[j].n_out)
            return fail(d, DJ_CGRAPH_ERR_REF, "reference to output %lld of node %lld, which has %u", (long long)o,
                        (long long)j, g->nodes[j].n_out);
        *v = d->node_base[j] + (uint32_t)o;
    } else if (key_is(k, kn, "i") || key_is(k, kn, "w")) {
        const bool in = k[0] == 'i';
        const uint32_t lim = in ? g->n_inputs : g->n_weights;
        int64_t j;
        if (!dj__mp_int(&d->m, &j)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "an %s reference is not an int", in ? "input" : "weight");
        if (j < 0 || j >= (int64_t)lim)
            return fail(d, DJ_CGRAPH_ERR_REF, "reference to %s %lld of %u", in ? "input" : "weight", (long long)j, lim);
        *v = (in ? 0 : g->n_inputs) + (uint32_t)j;
    } else {
        return fail(d, DJ_CGRAPH_ERR_FORMAT, "a reference key is not n, i or w");
    }
    return DJ_OK;
}

static dj_status read_arg(dec *d, dj__carg *a) {
    memset(a, 0, sizeof *a);
    const char *s;
    uint32_t n;
    bool b;
    switch (dj__mp_peek(&d->m)) {
    case DJ_MP_NIL:
        dj__mp_nil(&d->m);
        a->kind = DJ_CARG_NONE;
        return DJ_OK;
    case DJ_MP_BOOL:
        dj__mp_bool(&d->m, &b);
        a->kind = DJ_CARG_BOOL;
        a->i = b;
        a->f = b;
        return DJ_OK;
    case DJ_MP_INT:
        if (!dj__mp_int(&d->m, &a->i)) return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "an integer argument above int64");
        a->kind = DJ_CARG_INT;
        a->f = (double)a->i;
        return DJ_OK;
    case DJ_MP_FLOAT:
        dj__mp_float(&d->m, &a->f);
        a->kind = DJ_CARG_FLOAT;
        return DJ_OK;
    case DJ_MP_STR:
        dj__mp_str(&d->m, &s, &n);
        a->kind = DJ_CARG_STR;
        memcpy(a->str, s, n < sizeof a->str - 1 ? n : sizeof a->str - 1);
        return DJ_OK;
    case DJ_MP_MAP:
        a->kind = DJ_CARG_TENSOR;
        return read_ref(d, &a->v);
    case DJ_MP_ARRAY: {
        if (!dj__mp_array(&d->m, &n)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a malformed list argument");
        const dj__mp_type first = n ? dj__mp_peek(&d->m) : DJ_MP_INT;
        if (first == DJ_MP_MAP || first == DJ_MP_NIL) { /* tensors, None among them for a Tensor?[] */
            a->kind = DJ_CARG_TENSORS;
            if (!(a->vals = malloc(sizeof *a->vals * (n ? n : 1)))) return fail(d, DJ_CGRAPH_ERR_LIMIT, "out of memory");
            a->n = n;
            for (uint32_t i = 0; i < n; i++) {
                if (dj__mp_peek(&d->m) == DJ_MP_NIL) {
                    dj__mp_nil(&d->m);
                    a->vals[i] = DJ_CARG_HOLE;
                    a->holes = true;
                    continue;
                }
                if (dj__mp_peek(&d->m) != DJ_MP_MAP) return fail(d, DJ_CGRAPH_ERR_ARG, "a list mixing tensors and others");
                dj_status st = read_ref(d, &a->vals[i]);
                if (st != DJ_OK) return st;
            }
            return DJ_OK;
        }
        if (n > DJ_CGRAPH_MAX_OUTS) return fail(d, DJ_CGRAPH_ERR_LIMIT, "a list of %u (at most %d)", n, DJ_CGRAPH_MAX_OUTS);
        if (first == DJ_MP_FLOAT) {
            a->kind = DJ_CARG_FLOATS;
            if (!(a->fls = malloc(sizeof *a->fls * n))) return fail(d, DJ_CGRAPH_ERR_LIMIT, "out of memory");
            a->n = n;
            for (uint32_t i = 0; i < n; i++)
                if (!dj__mp_float(&d->m, &a->fls[i])) return fail(d, DJ_CGRAPH_ERR_ARG, "a float list holding a non-float");
            return DJ_OK;
        }
        a->kind = DJ_CARG_INTS;
        if (!(a->ints = malloc(sizeof *a->ints * (n ? n : 1)))) return fail(d, DJ_CGRAPH_ERR_LIMIT, "out of memory");
        a->n = n;
        for (uint32_t i = 0; i < n; i++)
            if (!dj__mp_int(&d->m, &a->ints[i])) return fail(d, DJ_CGRAPH_ERR_ARG, "a list holding a non-integer");
        return DJ_OK;
    }
    case DJ_MP_BIN:
    case DJ_MP_BAD: break;
    }
    return fail(d, DJ_CGRAPH_ERR_FORMAT, "an argument of a kind the schema lacks");
}

/* ---- the shapes each op gives ---- */

#define TRY(x)                              \
    do {                                    \
        const dj_status st_ = (x);          \
        if (st_ != DJ_OK) return st_;       \
    } while (0)

static const dj_ctensor_info *vinfo(const dec *d, uint32_t v) { return &d->g->vals[v].t; }

static dj_status arg_t(dec *d, const dj__cnode *n, uint32_t i, const dj_ctensor_info **t) {
    if (n->args[i].kind != DJ_CARG_TENSOR) return fail(d, DJ_CGRAPH_ERR_ARG, "argument %u is not a tensor", i);
    *t = vinfo(d, n->args[i].v);
    return DJ_OK;
}
static dj_status arg_opt_t(dec *d, const dj__cnode *n, uint32_t i, const dj_ctensor_info **t) {
    if (n->args[i].kind == DJ_CARG_NONE) {
        *t = NULL;
        return DJ_OK;
    }
    return arg_t(d, n, i, t);
}
static dj_status arg_f32(dec *d, const dj__cnode *n, uint32_t i, const dj_ctensor_info **t) {
    TRY(arg_t(d, n, i, t));
    if ((*t)->dtype != DJ_CDTYPE_F32)
        return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "argument %u is %s (this op is built for f32)", i, dj_cdtype_name((*t)->dtype));
    return DJ_OK;
}
static dj_status arg_int(dec *d, const dj__cnode *n, uint32_t i, int64_t *v) {
    if (n->args[i].kind != DJ_CARG_INT && n->args[i].kind != DJ_CARG_BOOL)
        return fail(d, DJ_CGRAPH_ERR_ARG, "argument %u is not an int", i);
    *v = n->args[i].i;
    return DJ_OK;
}
static dj_status arg_num(dec *d, const dj__cnode *n, uint32_t i, double *v) {
    const dj__carg_kind k = n->args[i].kind;
    if (k != DJ_CARG_INT && k != DJ_CARG_FLOAT && k != DJ_CARG_BOOL)
        return fail(d, DJ_CGRAPH_ERR_ARG, "argument %u is not a number", i);
    *v = n->args[i].f;
    return DJ_OK;
}
static dj_status arg_bool(dec *d, const dj__cnode *n, uint32_t i, bool *v) {
    if (n->args[i].kind != DJ_CARG_BOOL) return fail(d, DJ_CGRAPH_ERR_ARG, "argument %u is not a bool", i);
    *v = n->args[i].i != 0;
    return DJ_OK;
}
static dj_status arg_ints(dec *d, const dj__cnode *n, uint32_t i, uint32_t *cnt, const int64_t **v) {
    if (n->args[i].kind != DJ_CARG_INTS) return fail(d, DJ_CGRAPH_ERR_ARG, "argument %u is not an int list", i);
    *cnt = n->args[i].n;
    *v = n->args[i].ints;
    return DJ_OK;
}
static dj_status arg_none(dec *d, const dj__cnode *n, uint32_t i, const char *what) {
    if (n->args[i].kind != DJ_CARG_NONE) return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "%s (argument %u) is not built", what, i);
    return DJ_OK;
}
static dj_status wrap_dim(dec *d, int64_t dim, uint32_t rank, uint32_t *out) {
    const int64_t r = rank ? rank : 1;
    if (dim < -r || dim >= r) return fail(d, DJ_CGRAPH_ERR_ARG, "dim %lld out of range for rank %u", (long long)dim, rank);
    *out = (uint32_t)(dim < 0 ? dim + r : dim);
    return DJ_OK;
}

static dj_status broadcast(dec *d, const dj_ctensor_info *a, const dj_ctensor_info *b, dj_ctensor_info *o) {
    const uint32_t r = a->rank > b->rank ? a->rank : b->rank;
    o->rank = r;
    for (uint32_t i = 0; i < r; i++) {
        const int64_t x = i < r - a->rank ? 1 : a->shape[i - (r - a->rank)];
        const int64_t y = i < r - b->rank ? 1 : b->shape[i - (r - b->rank)];
        if (x != y && x != 1 && y != 1)
            return fail(d, DJ_CGRAPH_ERR_ARG, "shapes do not broadcast (dim %u: %lld and %lld)", i, (long long)x, (long long)y);
        o->shape[i] = x == 1 ? y : x;
    }
    return DJ_OK;
}

/* A 2-d pooling or convolution window list: one value or two. */
static dj_status pair(dec *d, const dj__cnode *n, uint32_t i, int64_t dflt, int64_t lo, int64_t out[2]) {
    uint32_t c = 0;
    const int64_t *v = NULL;
    TRY(arg_ints(d, n, i, &c, &v));
    if (c == 0 && dflt >= 0) out[0] = out[1] = dflt;
    else if (c == 1) out[0] = out[1] = v[0];
    else if (c == 2) out[0] = v[0], out[1] = v[1];
    else return fail(d, DJ_CGRAPH_ERR_ARG, "argument %u has %u values (1 or 2)", i, c);
    if (out[0] < lo || out[1] < lo || out[0] > (1 << 20) || out[1] > (1 << 20))
        return fail(d, DJ_CGRAPH_ERR_ARG, "argument %u holds %lld, %lld (at least %lld)", i, (long long)out[0],
                    (long long)out[1], (long long)lo);
    return DJ_OK;
}

static dj_status pool_len(dec *d, int64_t in, int64_t k, int64_t s, int64_t p, int64_t dil, bool ceil_mode, int64_t *out) {
    const int64_t span = in + 2 * p - dil * (k - 1) - 1;
    if (span < 0) return fail(d, DJ_CGRAPH_ERR_ARG, "window %lld (dilation %lld) larger than the padded input %lld",
                              (long long)k, (long long)dil, (long long)(in + 2 * p));
    int64_t o = (span + (ceil_mode ? s - 1 : 0)) / s + 1;
    if (ceil_mode && (o - 1) * s >= in + p) o--;
    *out = o;
    return DJ_OK;
}

/* A reshape's sizes with one -1 at most: their product must be numel. */
static dj_status sizes(dec *d, const dj__cnode *n, uint32_t i, uint64_t numel, dj_ctensor_info *o) {
    uint32_t c = 0;
    const int64_t *v = NULL;
    TRY(arg_ints(d, n, i, &c, &v));
    if (c > DJ_CGRAPH_MAX_RANK) return fail(d, DJ_CGRAPH_ERR_LIMIT, "rank %u above %d", c, DJ_CGRAPH_MAX_RANK);
    int infer = -1;
    uint64_t prod = 1;
    o->rank = c;
    for (uint32_t k = 0; k < c; k++) {
        if (v[k] == -1 && infer < 0) {
            infer = (int)k;
            continue;
        }
        if (v[k] < 0) return fail(d, DJ_CGRAPH_ERR_ARG, "size %lld in a reshape", (long long)v[k]);
        if (v[k] && prod > d->lim.max_elems / (uint64_t)v[k]) return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "reshape sizes overflow");
        prod *= (uint64_t)v[k];
        o->shape[k] = v[k];
    }
    if (infer >= 0) {
        if (prod == 0 || numel % prod) return fail(d, DJ_CGRAPH_ERR_ARG, "cannot infer -1 from %llu elements", (unsigned long long)numel);
        o->shape[infer] = (int64_t)(numel / prod);
    } else if (prod != numel) {
        return fail(d, DJ_CGRAPH_ERR_ARG, "reshape of %llu elements to %llu", (unsigned long long)numel, (unsigned long long)prod);
    }
    return DJ_OK;
}

static dj_status reduce_dims(dec *d, const dj__cnode *n, const dj_ctensor_info *x, uint32_t i, bool keep, dj_ctensor_info *o) {
    bool red[DJ_CGRAPH_MAX_RANK] = {0};
    if (n->args[i].kind == DJ_CARG_NONE || (n->args[i].kind == DJ_CARG_INTS && n->args[i].n == 0)) {
        for (uint32_t k = 0; k < x->rank; k++) red[k] = true;
    } else {
        uint32_t c = 0;
        const int64_t *v = NULL;
        TRY(arg_ints(d, n, i, &c, &v));
        for (uint32_t k = 0; k < c; k++) {
            uint32_t dd = 0;
            TRY(wrap_dim(d, v[k], x->rank, &dd));
            if (x->rank && red[dd]) return fail(d, DJ_CGRAPH_ERR_ARG, "dim %lld twice", (long long)v[k]);
            if (x->rank) red[dd] = true;
        }
    }
    o->rank = 0;
    for (uint32_t k = 0; k < x->rank; k++) {
        if (!red[k]) o->shape[o->rank++] = x->shape[k];
        else if (keep) o->shape[o->rank++] = 1;
    }
    return DJ_OK;
}

static bool same_shape(const dj_ctensor_info *a, const dj_ctensor_info *b) {
    if (a->rank != b->rank) return false;
    for (uint32_t i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

/* PyTorch's result type for our three dtypes (bool < i64 < f32); a 0-d tensor counts only when
 * it is of a higher category than the other operand, as a Python scalar would. */
static dj_cdtype promote(const dj_ctensor_info *a, const dj_ctensor_info *b) {
    if ((a->rank == 0) == (b->rank == 0)) return a->dtype > b->dtype ? a->dtype : b->dtype;
    const dj_ctensor_info *t = a->rank ? a : b, *s = a->rank ? b : a;
    return s->dtype > t->dtype ? s->dtype : t->dtype; /* categories equal our order here */
}
static dj_cdtype promote_scalar(dj_cdtype t, dj__carg_kind k) {
    if (k == DJ_CARG_FLOAT) return DJ_CDTYPE_F32;
    if (k == DJ_CARG_INT && t == DJ_CDTYPE_BOOL) return DJ_CDTYPE_I64;
    return t;
}

/* A ScalarType argument (the client sends its name: "float32", "int64", "bool") or None. */
static dj_status arg_dtype(dec *d, const dj__cnode *n, uint32_t i, dj_cdtype dflt, dj_cdtype *out) {
    const dj__carg *a = &n->args[i];
    if (a->kind == DJ_CARG_NONE) *out = dflt;
    else if (a->kind == DJ_CARG_STR && !strcmp(a->str, "float32")) *out = DJ_CDTYPE_F32;
    else if (a->kind == DJ_CARG_STR && !strcmp(a->str, "int64")) *out = DJ_CDTYPE_I64;
    else if (a->kind == DJ_CARG_STR && !strcmp(a->str, "bool")) *out = DJ_CDTYPE_BOOL;
    else if (a->kind == DJ_CARG_STR) return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "dtype %s (float32, int64 and bool are built)", a->str);
    else return fail(d, DJ_CGRAPH_ERR_ARG, "argument %u is not a dtype name", i);
    return DJ_OK;
}

/* The outputs node n gives (dtype and shape; numel filled by the caller). */
static dj_status infer(dec *d, dj__cnode *n, dj_ctensor_info o[DJ_CGRAPH_MAX_OUTS], uint32_t *n_out /* table's count; OUT for lists */) {
    const dj_ctensor_info *x = NULL, *y = NULL, *z = NULL;
    memset(o, 0, sizeof *o * 3);
    o[0].dtype = DJ_CDTYPE_F32;
    int64_t i0 = 0, i1 = 0;
    double f0 = 0;
    bool b0 = false;
    switch (n->op) {
    case DJ_COP_ADDMM:
    case DJ_COP_MM: {
        const uint32_t a = n->op == DJ_COP_ADDMM;
        TRY(arg_f32(d, n, a, &x));
        TRY(arg_f32(d, n, a + 1, &y));
        if (x->rank != 2 || y->rank != 2 || x->shape[1] != y->shape[0])
            return fail(d, DJ_CGRAPH_ERR_ARG, "matrices of shapes [%lld,%lld] and [%lld,%lld] do not multiply (rank %u, %u)",
                        (long long)x->shape[0], (long long)(x->rank > 1 ? x->shape[1] : 0), (long long)y->shape[0],
                        (long long)(y->rank > 1 ? y->shape[1] : 0), x->rank, y->rank);
        o[0].rank = 2;
        o[0].shape[0] = x->shape[0];
        o[0].shape[1] = y->shape[1];
        if (a) {
            TRY(arg_f32(d, n, 0, &z));
            dj_ctensor_info bc;
            TRY(broadcast(d, z, &o[0], &bc));
            if (bc.rank != 2 || bc.shape[0] != o[0].shape[0] || bc.shape[1] != o[0].shape[1])
                return fail(d, DJ_CGRAPH_ERR_ARG, "addmm's input does not broadcast to the product");
            TRY(arg_num(d, n, 3, &f0));
            TRY(arg_num(d, n, 4, &f0));
        }
        return DJ_OK;
    }
    case DJ_COP_BMM:
        TRY(arg_f32(d, n, 0, &x));
        TRY(arg_f32(d, n, 1, &y));
        if (x->rank != 3 || y->rank != 3 || x->shape[0] != y->shape[0] || x->shape[2] != y->shape[1])
            return fail(d, DJ_CGRAPH_ERR_ARG, "bmm of [%lld,%lld,%lld] and [%lld,%lld,%lld] (rank %u, %u)",
                        (long long)x->shape[0], (long long)x->shape[1], (long long)x->shape[2], (long long)y->shape[0],
                        (long long)y->shape[1], (long long)y->shape[2], x->rank, y->rank);
        o[0].rank = 3;
        o[0].shape[0] = x->shape[0];
        o[0].shape[1] = x->shape[1];
        o[0].shape[2] = y->shape[2];
        n->scratch_bytes = (uint64_t)y->shape[1] * (uint64_t)y->shape[2] * sizeof(float); /* one mat2 transposed */
        return DJ_OK;
    case DJ_COP_SLICE: {
        TRY(arg_t(d, n, 0, &x));
        uint32_t dd = 0;
        TRY(arg_int(d, n, 1, &i0));
        TRY(wrap_dim(d, i0, x->rank, &dd));
        if (!x->rank) return fail(d, DJ_CGRAPH_ERR_ARG, "slice of a 0-d tensor");
        int64_t start = 0, end = INT64_MAX, step = 1;
        if (n->args[2].kind != DJ_CARG_NONE) TRY(arg_int(d, n, 2, &start));
        if (n->args[3].kind != DJ_CARG_NONE) TRY(arg_int(d, n, 3, &end));
        TRY(arg_int(d, n, 4, &step));
        if (step < 1) return fail(d, DJ_CGRAPH_ERR_ARG, "slice step %lld (positive steps only)", (long long)step);
        int64_t first, len;
        dj__slice_bounds(x->shape[dd], start, end, step, &first, &len);
        o[0] = *x;
        o[0].shape[dd] = len;
        return DJ_OK;
    }
    case DJ_COP_SELECT: {
        TRY(arg_t(d, n, 0, &x));
        uint32_t dd = 0;
        TRY(arg_int(d, n, 1, &i0));
        TRY(arg_int(d, n, 2, &i1));
        if (!x->rank) return fail(d, DJ_CGRAPH_ERR_ARG, "select of a 0-d tensor");
        TRY(wrap_dim(d, i0, x->rank, &dd));
        if (i1 < -x->shape[dd] || i1 >= x->shape[dd])
            return fail(d, DJ_CGRAPH_ERR_ARG, "index %lld out of range for dim %u of size %lld", (long long)i1, dd,
                        (long long)x->shape[dd]);
        o[0].dtype = x->dtype;
        for (uint32_t k = 0; k < x->rank; k++)
            if (k != dd) o[0].shape[o[0].rank++] = x->shape[k];
        return DJ_OK;
    }
    case DJ_COP_LINEAR:
        TRY(arg_f32(d, n, 0, &x));
        TRY(arg_f32(d, n, 1, &y));
        if (n->args[2].kind != DJ_CARG_NONE) TRY(arg_f32(d, n, 2, &z));
        if (x->rank < 1 || y->rank != 2 || x->shape[x->rank - 1] != y->shape[1] || (z && (z->rank != 1 || z->shape[0] != y->shape[0])))
            return fail(d, DJ_CGRAPH_ERR_ARG, "linear of mismatched shapes");
        o[0] = *x;
        o[0].shape[x->rank - 1] = y->shape[0];
        return DJ_OK;
    case DJ_COP_ADD_T: case DJ_COP_ADD_S: case DJ_COP_SUB_T: case DJ_COP_SUB_S: case DJ_COP_MUL_T: case DJ_COP_MUL_S:
    case DJ_COP_DIV_T: case DJ_COP_DIV_S: case DJ_COP_GT_T: case DJ_COP_GT_S: case DJ_COP_LT_T: case DJ_COP_LT_S:
    case DJ_COP_GE_S: case DJ_COP_LE_S: case DJ_COP_EQ_T: case DJ_COP_EQ_S: case DJ_COP_NE_T: case DJ_COP_NE_S:
    case DJ_COP_GE_T: case DJ_COP_LE_T: case DJ_COP_POW_TS: case DJ_COP_POW_TT: case DJ_COP_RSUB_S: {
        TRY(arg_t(d, n, 0, &x));
        dj_cdtype dt;
        if (n->args[1].kind == DJ_CARG_TENSOR) {
            TRY(arg_t(d, n, 1, &y));
            TRY(broadcast(d, x, y, &o[0]));
            dt = promote(x, y);
        } else {
            TRY(arg_num(d, n, 1, &f0));
            o[0] = *x;
            dt = promote_scalar(x->dtype, n->args[1].kind);
        }
        if (n->op == DJ_COP_ADD_T || n->op == DJ_COP_ADD_S || n->op == DJ_COP_SUB_T || n->op == DJ_COP_SUB_S ||
            n->op == DJ_COP_RSUB_S)
            TRY(arg_num(d, n, 2, &f0));
        const bool cmp = (n->op >= DJ_COP_GT_T && n->op <= DJ_COP_LE_S) || (n->op >= DJ_COP_EQ_T && n->op <= DJ_COP_LE_T);
        if (n->op == DJ_COP_DIV_T || n->op == DJ_COP_DIV_S) dt = DJ_CDTYPE_F32; /* true division */
        if ((n->op == DJ_COP_SUB_T || n->op == DJ_COP_SUB_S || n->op == DJ_COP_RSUB_S) && dt == DJ_CDTYPE_BOOL)
            return fail(d, DJ_CGRAPH_ERR_ARG, "subtraction of bools");
        if (!cmp && dt == DJ_CDTYPE_BOOL && n->op != DJ_COP_MUL_T && n->op != DJ_COP_MUL_S)
            return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "arithmetic on bools other than mul");
        o[0].dtype = cmp ? DJ_CDTYPE_BOOL : dt;
        return DJ_OK;
    }
    case DJ_COP_WHERE: case DJ_COP_MASKED_FILL_S: case DJ_COP_MASKED_FILL_T: {
        const bool where = n->op == DJ_COP_WHERE;
        const dj_ctensor_info *c = NULL;
        TRY(arg_t(d, n, where ? 0 : 1, &c));
        TRY(arg_t(d, n, where ? 1 : 0, &x));
        if (c->dtype != DJ_CDTYPE_BOOL) return fail(d, DJ_CGRAPH_ERR_ARG, "the condition is %s, not bool", dj_cdtype_name(c->dtype));
        if (where) {
            dj_ctensor_info t;
            TRY(arg_t(d, n, 2, &y));
            TRY(broadcast(d, c, x, &t));
            TRY(broadcast(d, &t, y, &o[0]));
            o[0].dtype = promote(x, y);
            return DJ_OK;
        }
        dj_ctensor_info t;
        TRY(broadcast(d, x, c, &t));
        if (!same_shape(&t, x)) return fail(d, DJ_CGRAPH_ERR_ARG, "the mask does not broadcast to the tensor");
        if (n->op == DJ_COP_MASKED_FILL_T) {
            TRY(arg_t(d, n, 2, &y));
            if (y->rank) return fail(d, DJ_CGRAPH_ERR_ARG, "masked_fill's value is a tensor of rank %u (0 only)", y->rank);
        } else {
            TRY(arg_num(d, n, 2, &f0));
        }
        o[0] = *x;
        return DJ_OK;
    }
    case DJ_COP_SQRT: case DJ_COP_RSQRT: case DJ_COP_ABS: case DJ_COP_LOG: case DJ_COP_ERF:
        TRY(arg_t(d, n, 0, &x));
        if (x->dtype == DJ_CDTYPE_BOOL) return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "a bool argument");
        o[0] = *x;
        if (n->op != DJ_COP_ABS) o[0].dtype = DJ_CDTYPE_F32;
        return DJ_OK;
    case DJ_COP_TO_COPY: case DJ_COP_ZEROS_LIKE: case DJ_COP_ONES_LIKE: case DJ_COP_FULL_LIKE: {
        TRY(arg_t(d, n, 0, &x));
        const uint32_t dt_at = n->op == DJ_COP_FULL_LIKE ? 2 : 1;
        o[0] = *x;
        TRY(arg_dtype(d, n, dt_at, x->dtype, &o[0].dtype));
        if (n->op == DJ_COP_FULL_LIKE) TRY(arg_num(d, n, 1, &f0));
        return DJ_OK;
    }
    case DJ_COP_ZEROS: case DJ_COP_ONES: case DJ_COP_FULL: {
        uint32_t c = 0;
        const int64_t *v = NULL;
        TRY(arg_ints(d, n, 0, &c, &v));
        if (c > DJ_CGRAPH_MAX_RANK) return fail(d, DJ_CGRAPH_ERR_LIMIT, "rank %u above %d", c, DJ_CGRAPH_MAX_RANK);
        o[0].rank = c;
        for (uint32_t k = 0; k < c; k++) o[0].shape[k] = v[k]; /* negatives: info_finish refuses */
        dj_cdtype dflt = DJ_CDTYPE_F32;
        if (n->op == DJ_COP_FULL) {
            TRY(arg_num(d, n, 1, &f0));
            dflt = n->args[1].kind == DJ_CARG_BOOL ? DJ_CDTYPE_BOOL : n->args[1].kind == DJ_CARG_INT ? DJ_CDTYPE_I64 : DJ_CDTYPE_F32;
        }
        return arg_dtype(d, n, n->op == DJ_COP_FULL ? 2 : 1, dflt, &o[0].dtype);
    }
    case DJ_COP_ARANGE: case DJ_COP_ARANGE_START: case DJ_COP_ARANGE_STEP: {
        double start = 0, end = 0, step = 1;
        const uint32_t e_at = n->op == DJ_COP_ARANGE ? 0 : 1;
        bool ints = n->args[e_at].kind == DJ_CARG_INT;
        TRY(arg_num(d, n, e_at, &end));
        if (e_at) {
            TRY(arg_num(d, n, 0, &start));
            ints = ints && n->args[0].kind == DJ_CARG_INT;
        }
        if (n->op == DJ_COP_ARANGE_STEP) {
            TRY(arg_num(d, n, 2, &step));
            ints = ints && n->args[2].kind == DJ_CARG_INT;
        }
        if (!(step != 0) || !isfinite(start) || !isfinite(end) || !isfinite(step) || (end - start) / step < 0)
            return fail(d, DJ_CGRAPH_ERR_ARG, "arange from %g to %g by %g", start, end, step);
        const double len = ceil((end - start) / step);
        if (!(len < (double)d->lim.max_elems + 1)) return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "arange of %g elements", len);
        o[0].rank = 1;
        o[0].shape[0] = (int64_t)len;
        return arg_dtype(d, n, n->op == DJ_COP_ARANGE ? 1 : n->op == DJ_COP_ARANGE_START ? 2 : 3,
                         ints ? DJ_CDTYPE_I64 : DJ_CDTYPE_F32, &o[0].dtype);
    }
    case DJ_COP_EMBEDDING: {
        TRY(arg_f32(d, n, 0, &x));
        TRY(arg_t(d, n, 1, &y));
        if (x->rank != 2 || y->dtype != DJ_CDTYPE_I64 || y->rank + 1 > DJ_CGRAPH_MAX_RANK)
            return fail(d, DJ_CGRAPH_ERR_ARG, "embedding of a rank-%u table by %s indices", x->rank, dj_cdtype_name(y->dtype));
        TRY(arg_int(d, n, 2, &i0));
        o[0] = *y;
        o[0].dtype = DJ_CDTYPE_F32;
        o[0].shape[o[0].rank++] = x->shape[1];
        return DJ_OK;
    }
    case DJ_COP_BADDBMM: {
        TRY(arg_f32(d, n, 0, &z));
        TRY(arg_f32(d, n, 1, &x));
        TRY(arg_f32(d, n, 2, &y));
        if (x->rank != 3 || y->rank != 3 || x->shape[0] != y->shape[0] || x->shape[2] != y->shape[1])
            return fail(d, DJ_CGRAPH_ERR_ARG, "baddbmm of batches that do not multiply");
        o[0].rank = 3;
        o[0].shape[0] = x->shape[0];
        o[0].shape[1] = x->shape[1];
        o[0].shape[2] = y->shape[2];
        dj_ctensor_info bc;
        TRY(broadcast(d, z, &o[0], &bc));
        if (!same_shape(&bc, &o[0])) return fail(d, DJ_CGRAPH_ERR_ARG, "baddbmm's input does not broadcast to the product");
        TRY(arg_num(d, n, 3, &f0));
        TRY(arg_num(d, n, 4, &f0));
        n->scratch_bytes = (uint64_t)y->shape[1] * (uint64_t)y->shape[2] * sizeof(float);
        return DJ_OK;
    }
    case DJ_COP_SDPA: { /* torch 1.13: (q [..., L, E], k [..., S, E], v [..., S, Ev], mask?, dropout, need_weights, causal) */
        TRY(arg_f32(d, n, 0, &x));
        TRY(arg_f32(d, n, 1, &y));
        TRY(arg_f32(d, n, 2, &z));
        if (x->rank < 2 || y->rank != x->rank || z->rank != x->rank)
            return fail(d, DJ_CGRAPH_ERR_ARG, "attention of ranks %u, %u, %u", x->rank, y->rank, z->rank);
        const uint32_t r = x->rank;
        for (uint32_t k = 0; k + 2 < r; k++)
            if (y->shape[k] != x->shape[k] || z->shape[k] != x->shape[k])
                return fail(d, DJ_CGRAPH_ERR_ARG, "attention's batch dims differ");
        if (y->shape[r - 1] != x->shape[r - 1] || z->shape[r - 2] != y->shape[r - 2])
            return fail(d, DJ_CGRAPH_ERR_ARG, "attention's query, key and value do not match");
        o[0] = *x;
        o[0].shape[r - 1] = z->shape[r - 1];
        o[1] = *x;
        o[1].shape[r - 1] = y->shape[r - 2]; /* the weights [..., L, S] */
        const dj_ctensor_info *m = NULL;
        TRY(arg_opt_t(d, n, 3, &m));
        if (m) {
            if (m->dtype == DJ_CDTYPE_I64) return fail(d, DJ_CGRAPH_ERR_ARG, "an attention mask of i64");
            dj_ctensor_info bc;
            TRY(broadcast(d, m, &o[1], &bc));
            if (!same_shape(&bc, &o[1])) return fail(d, DJ_CGRAPH_ERR_ARG, "the attention mask does not broadcast to [..., L, S]");
        }
        TRY(arg_num(d, n, 4, &f0));
        if (f0 != 0.0) return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "attention dropout %g (eval mode has none)", f0);
        TRY(arg_bool(d, n, 5, &b0));
        TRY(arg_bool(d, n, 6, &b0));
        if (b0 && m) return fail(d, DJ_CGRAPH_ERR_ARG, "attention with both a mask and is_causal");
        return DJ_OK;
    }
    case DJ_COP_GROUP_NORM: {
        TRY(arg_f32(d, n, 0, &x));
        int64_t N = 0, C = 0, HW = 0, G = 0;
        TRY(arg_int(d, n, 3, &N));
        TRY(arg_int(d, n, 4, &C));
        TRY(arg_int(d, n, 5, &HW));
        TRY(arg_int(d, n, 6, &G));
        TRY(arg_num(d, n, 7, &f0));
        if (x->rank < 2 || N != x->shape[0] || C != x->shape[1] || G < 1 || C % G || !(f0 >= 0))
            return fail(d, DJ_CGRAPH_ERR_ARG, "group norm of N %lld, C %lld, %lld groups", (long long)N, (long long)C, (long long)G);
        int64_t hw = 1;
        for (uint32_t k = 2; k < x->rank; k++) hw *= x->shape[k];
        if (hw != HW) return fail(d, DJ_CGRAPH_ERR_ARG, "group norm's HxW %lld is not the input's %lld", (long long)HW, (long long)hw);
        for (uint32_t i = 1; i <= 2; i++) {
            const dj_ctensor_info *w = NULL;
            TRY(arg_opt_t(d, n, i, &w));
            if (w && (w->dtype != DJ_CDTYPE_F32 || w->rank != 1 || w->shape[0] != C))
                return fail(d, DJ_CGRAPH_ERR_ARG, "group norm argument %u is not f32 [%lld]", i, (long long)C);
        }
        o[0] = *x;
        o[1].rank = o[2].rank = 2;
        o[1].shape[0] = o[2].shape[0] = N;
        o[1].shape[1] = o[2].shape[1] = G;
        o[1].dtype = o[2].dtype = DJ_CDTYPE_F32;
        return DJ_OK;
    }
    case DJ_COP_UP_NEAREST: case DJ_COP_UP_BILINEAR: {
        TRY(arg_f32(d, n, 0, &x));
        if (x->rank != 4) return fail(d, DJ_CGRAPH_ERR_ARG, "upsample of rank %u (4)", x->rank);
        const uint32_t sc_at = n->op == DJ_COP_UP_NEAREST ? 2 : 3;
        if (n->op == DJ_COP_UP_BILINEAR) TRY(arg_bool(d, n, 2, &b0));
        o[0] = *x;
        if (n->args[1].kind == DJ_CARG_INTS) {
            if (n->args[1].n != 2 || n->args[sc_at].kind != DJ_CARG_NONE)
                return fail(d, DJ_CGRAPH_ERR_ARG, "upsample wants 2 output sizes and no scales, or scales");
            for (int k = 0; k < 2; k++) {
                if (n->args[1].ints[k] < 1 || n->args[1].ints[k] > (1 << 20)) return fail(d, DJ_CGRAPH_ERR_ARG, "upsample to size %lld", (long long)n->args[1].ints[k]);
                o[0].shape[2 + k] = n->args[1].ints[k];
            }
        } else {
            TRY(arg_none(d, n, 1, "output_size beside scales"));
            if (n->args[sc_at].kind != DJ_CARG_FLOATS || n->args[sc_at].n != 2)
                return fail(d, DJ_CGRAPH_ERR_ARG, "upsample wants 2 scale factors");
            for (int k = 0; k < 2; k++) {
                const double sc = n->args[sc_at].fls[k], len = floor((double)x->shape[2 + k] * sc);
                if (!(sc > 0) || !(len >= 1 && len <= (1 << 20))) return fail(d, DJ_CGRAPH_ERR_ARG, "upsample by %g", sc);
                o[0].shape[2 + k] = (int64_t)len;
            }
        }
        if (!x->shape[2] || !x->shape[3]) return fail(d, DJ_CGRAPH_ERR_ARG, "upsample of an empty image");
        return DJ_OK;
    }
    case DJ_COP_VAR: case DJ_COP_AMAX: case DJ_COP_AMIN: case DJ_COP_LOGSUMEXP: case DJ_COP_NORM: case DJ_COP_VNORM: {
        TRY(arg_t(d, n, 0, &x));
        if (x->dtype != DJ_CDTYPE_F32 && n->op != DJ_COP_AMAX && n->op != DJ_COP_AMIN)
            return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "argument 0 is %s (this op is built for f32)", dj_cdtype_name(x->dtype));
        uint32_t dim_at = 1, keep_at = 2;
        if (n->op == DJ_COP_VAR) {
            keep_at = 3;
            if (n->args[2].kind != DJ_CARG_NONE) TRY(arg_num(d, n, 2, &f0));
        } else if (n->op == DJ_COP_NORM || n->op == DJ_COP_VNORM) {
            dim_at = 2;
            keep_at = 3;
            if (n->args[1].kind != DJ_CARG_NONE) TRY(arg_num(d, n, 1, &f0));
            if (n->op == DJ_COP_VNORM) TRY(arg_none(d, n, 4, "dtype"));
        }
        if ((n->op == DJ_COP_AMAX || n->op == DJ_COP_AMIN) && !x->numel)
            return fail(d, DJ_CGRAPH_ERR_ARG, "amax/amin of an empty tensor");
        TRY(arg_bool(d, n, keep_at, &b0));
        TRY(reduce_dims(d, n, x, dim_at, b0, &o[0]));
        o[0].dtype = x->dtype;
        return DJ_OK;
    }
    case DJ_COP_ARGMAX: {
        TRY(arg_t(d, n, 0, &x));
        TRY(arg_bool(d, n, 2, &b0));
        if (!x->numel) return fail(d, DJ_CGRAPH_ERR_ARG, "argmax of an empty tensor");
        if (n->args[1].kind == DJ_CARG_NONE) {
            o[0].rank = b0 ? x->rank : 0;
            for (uint32_t k = 0; k < o[0].rank; k++) o[0].shape[k] = 1;
        } else {
            uint32_t dd = 0;
            TRY(arg_int(d, n, 1, &i0));
            TRY(wrap_dim(d, i0, x->rank, &dd));
            o[0] = *x;
            if (x->rank) o[0].shape[dd] = 1;
            if (x->rank && !b0) {
                o[0].rank = 0;
                for (uint32_t k = 0; k < x->rank; k++)
                    if (k != dd) o[0].shape[o[0].rank++] = x->shape[k];
            }
        }
        o[0].dtype = DJ_CDTYPE_I64;
        return DJ_OK;
    }
    case DJ_COP_STACK: {
        if (n->args[0].kind != DJ_CARG_TENSORS || n->args[0].n == 0 || n->args[0].holes)
            return fail(d, DJ_CGRAPH_ERR_ARG, "stack of no tensors (or a None among them)");
        TRY(arg_int(d, n, 1, &i0));
        const dj_ctensor_info *first = vinfo(d, n->args[0].vals[0]);
        if (first->rank + 1 > DJ_CGRAPH_MAX_RANK) return fail(d, DJ_CGRAPH_ERR_LIMIT, "rank above %d", DJ_CGRAPH_MAX_RANK);
        for (uint32_t k = 1; k < n->args[0].n; k++) {
            const dj_ctensor_info *t = vinfo(d, n->args[0].vals[k]);
            if (!same_shape(t, first) || t->dtype != first->dtype) return fail(d, DJ_CGRAPH_ERR_ARG, "stack of tensors of different shapes");
        }
        uint32_t dd = 0;
        TRY(wrap_dim(d, i0, first->rank + 1, &dd));
        o[0].dtype = first->dtype;
        o[0].rank = first->rank + 1;
        for (uint32_t k = 0, j = 0; k < o[0].rank; k++) o[0].shape[k] = k == dd ? (int64_t)n->args[0].n : first->shape[j++];
        return DJ_OK;
    }
    case DJ_COP_GATHER: case DJ_COP_INDEX_SELECT: {
        TRY(arg_t(d, n, 0, &x));
        TRY(arg_int(d, n, 1, &i0));
        TRY(arg_t(d, n, 2, &y));
        if (y->dtype != DJ_CDTYPE_I64) return fail(d, DJ_CGRAPH_ERR_ARG, "the index is %s, not i64", dj_cdtype_name(y->dtype));
        uint32_t dd = 0;
        TRY(wrap_dim(d, i0, x->rank, &dd));
        if (n->op == DJ_COP_GATHER) {
            TRY(arg_bool(d, n, 3, &b0));
            if (y->rank != x->rank) return fail(d, DJ_CGRAPH_ERR_ARG, "gather's index of rank %u for rank %u", y->rank, x->rank);
            for (uint32_t k = 0; k < x->rank; k++)
                if (k != dd && y->shape[k] > x->shape[k]) return fail(d, DJ_CGRAPH_ERR_ARG, "gather's index larger than the input in dim %u", k);
            o[0] = *y;
        } else {
            if (y->rank > 1) return fail(d, DJ_CGRAPH_ERR_ARG, "index_select's index of rank %u", y->rank);
            o[0] = *x;
            if (x->rank) o[0].shape[dd] = (int64_t)y->numel;
        }
        o[0].dtype = x->dtype;
        return DJ_OK;
    }
    case DJ_COP_SPLIT: case DJ_COP_SPLIT_SIZES: case DJ_COP_UNBIND: {
        TRY(arg_t(d, n, 0, &x));
        TRY(arg_int(d, n, n->op == DJ_COP_UNBIND ? 1 : 2, &i0));
        uint32_t dd = 0;
        TRY(wrap_dim(d, i0, x->rank, &dd));
        if (!x->rank) return fail(d, DJ_CGRAPH_ERR_ARG, "split of a 0-d tensor");
        const int64_t size = x->shape[dd];
        uint32_t cnt = 0;
        if (n->op == DJ_COP_UNBIND) {
            if (size > DJ_CGRAPH_MAX_OUTS) return fail(d, DJ_CGRAPH_ERR_LIMIT, "unbind into %lld (at most %d)", (long long)size, DJ_CGRAPH_MAX_OUTS);
            cnt = (uint32_t)size;
            for (uint32_t k = 0; k < cnt; k++) {
                o[k].dtype = x->dtype;
                o[k].rank = 0;
                for (uint32_t j = 0; j < x->rank; j++)
                    if (j != dd) o[k].shape[o[k].rank++] = x->shape[j];
            }
        } else if (n->op == DJ_COP_SPLIT) {
            TRY(arg_int(d, n, 1, &i1));
            if (i1 < 1) return fail(d, DJ_CGRAPH_ERR_ARG, "split size %lld", (long long)i1);
            const int64_t parts = size ? (size - 1) / i1 + 1 : 1;
            if (parts > DJ_CGRAPH_MAX_OUTS) return fail(d, DJ_CGRAPH_ERR_LIMIT, "split into %lld (at most %d)", (long long)parts, DJ_CGRAPH_MAX_OUTS);
            cnt = (uint32_t)parts;
            for (uint32_t k = 0; k < cnt; k++) {
                o[k] = *x;
                o[k].shape[dd] = size - (int64_t)k * i1 < i1 ? size - (int64_t)k * i1 : i1;
            }
        } else {
            uint32_t c = 0;
            const int64_t *v = NULL;
            TRY(arg_ints(d, n, 1, &c, &v));
            int64_t sum = 0;
            for (uint32_t k = 0; k < c; k++) {
                if (v[k] < 0 || v[k] > size - sum) return fail(d, DJ_CGRAPH_ERR_ARG, "split sizes do not add up to %lld", (long long)size);
                sum += v[k];
                o[k] = *x;
                o[k].shape[dd] = v[k];
            }
            if (sum != size || !c) return fail(d, DJ_CGRAPH_ERR_ARG, "split sizes do not add up to %lld", (long long)size);
            cnt = c;
        }
        *n_out = cnt;
        return DJ_OK;
    }
    case DJ_COP_MAX_DIM: case DJ_COP_MIN_DIM: case DJ_COP_CUMSUM: {
        TRY(arg_t(d, n, 0, &x));
        TRY(arg_int(d, n, 1, &i0));
        uint32_t dd = 0;
        TRY(wrap_dim(d, i0, x->rank, &dd));
        o[0] = *x;
        if (n->op == DJ_COP_CUMSUM) {
            TRY(arg_dtype(d, n, 2, x->dtype == DJ_CDTYPE_BOOL ? DJ_CDTYPE_I64 : x->dtype, &o[0].dtype));
            return DJ_OK;
        }
        TRY(arg_bool(d, n, 2, &b0));
        if (x->rank && !x->shape[dd]) return fail(d, DJ_CGRAPH_ERR_ARG, "max/min over an empty dim");
        if (x->rank) {
            o[0].shape[dd] = 1;
            if (!b0) {
                o[0].rank = 0;
                for (uint32_t k = 0; k < x->rank; k++)
                    if (k != dd) o[0].shape[o[0].rank++] = x->shape[k];
            }
        }
        o[1] = o[0];
        o[1].dtype = DJ_CDTYPE_I64;
        return DJ_OK;
    }
    case DJ_COP_TRIL: case DJ_COP_TRIU:
        TRY(arg_t(d, n, 0, &x));
        TRY(arg_int(d, n, 1, &i0));
        if (x->rank < 2) return fail(d, DJ_CGRAPH_ERR_ARG, "tril/triu of rank %u (2 or more)", x->rank);
        o[0] = *x;
        return DJ_OK;
    case DJ_COP_INDEX: { /* x[i0, i1, ...]: integer index tensors (None: the whole dim), broadcast together */
        TRY(arg_t(d, n, 0, &x));
        const dj__carg *L = &n->args[1];
        if (L->kind != DJ_CARG_TENSORS || L->n == 0 || L->n > x->rank)
            return fail(d, DJ_CGRAPH_ERR_ARG, "index of a rank-%u tensor needs 1 to %u indices (tensors or None)", x->rank, x->rank);
        dj_ctensor_info bc = {.rank = 0, .numel = 1, .dtype = DJ_CDTYPE_I64};
        int first = -1, last = -1;
        bool gap = false;
        for (uint32_t k = 0; k < L->n; k++) {
            if (L->vals[k] == DJ_CARG_HOLE) continue;
            const dj_ctensor_info *t = vinfo(d, L->vals[k]);
            if (t->dtype != DJ_CDTYPE_I64)
                return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "index %u is %s (integer indices only; a bool mask runs on the client)",
                            k, dj_cdtype_name(t->dtype));
            dj_ctensor_info nb;
            TRY(broadcast(d, &bc, t, &nb));
            bc = nb;
            if (last >= 0 && (int)k != last + 1) gap = true;
            if (first < 0) first = (int)k;
            last = (int)k;
        }
        if (first < 0) return fail(d, DJ_CGRAPH_ERR_ARG, "index with no index tensor");
        uint32_t indexed = 0;
        for (uint32_t k = 0; k < L->n; k++) indexed += L->vals[k] != DJ_CARG_HOLE;
        if (x->rank - indexed + bc.rank > DJ_CGRAPH_MAX_RANK)
            return fail(d, DJ_CGRAPH_ERR_LIMIT, "index gives rank %u (at most %d)", x->rank - indexed + bc.rank, DJ_CGRAPH_MAX_RANK);
        for (uint32_t k = 0; k < L->n; k++)
            if (L->vals[k] != DJ_CARG_HOLE && !x->shape[k] && bc.numel)
                return fail(d, DJ_CGRAPH_ERR_ARG, "index into an empty dim %u", k);
        /* adjacent indices: the broadcast dims replace them in place; else they go first */
        o[0].dtype = x->dtype;
        o[0].rank = 0;
        if (!gap)
            for (int k = 0; k < first; k++) o[0].shape[o[0].rank++] = x->shape[k];
        for (uint32_t k = 0; k < bc.rank; k++) o[0].shape[o[0].rank++] = bc.shape[k];
        for (uint32_t k = 0; k < x->rank; k++) {
            const bool idx = k < L->n && L->vals[k] != DJ_CARG_HOLE;
            if (idx || (!gap && (int)k < first)) continue;
            o[0].shape[o[0].rank++] = x->shape[k];
        }
        return DJ_OK;
    }
    case DJ_COP_FLIP: {
        TRY(arg_t(d, n, 0, &x));
        uint32_t c = 0;
        const int64_t *v = NULL;
        TRY(arg_ints(d, n, 1, &c, &v));
        bool seen[DJ_CGRAPH_MAX_RANK + 1] = {0};
        for (uint32_t k = 0; k < c; k++) {
            uint32_t dd = 0;
            TRY(wrap_dim(d, v[k], x->rank, &dd));
            if (seen[dd]) return fail(d, DJ_CGRAPH_ERR_ARG, "flip repeats dim %u", dd);
            seen[dd] = true;
        }
        o[0] = *x;
        return DJ_OK;
    }
    case DJ_COP_SORT: case DJ_COP_SORT_STABLE: {
        const uint32_t a = n->op == DJ_COP_SORT_STABLE; /* sort.stable: (self, stable, dim, descending) */
        TRY(arg_t(d, n, 0, &x));
        if (x->dtype == DJ_CDTYPE_BOOL) return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "sort of a bool tensor");
        if (a && n->args[1].kind != DJ_CARG_NONE) TRY(arg_bool(d, n, 1, &b0)); /* always stable here */
        TRY(arg_int(d, n, 1 + a, &i0));
        TRY(arg_bool(d, n, 2 + a, &b0));
        uint32_t dd = 0;
        TRY(wrap_dim(d, i0, x->rank, &dd));
        o[0] = *x;
        o[1] = *x;
        o[1].dtype = DJ_CDTYPE_I64;
        const uint64_t len = x->rank ? (uint64_t)x->shape[dd] : 1;
        n->scratch_bytes = 2 * len * sizeof(int64_t); /* one row's indices and the merge's buffer */
        return DJ_OK;
    }
    case DJ_COP_TOPK: {
        TRY(arg_f32(d, n, 0, &x));
        TRY(arg_int(d, n, 1, &i0));
        TRY(arg_int(d, n, 2, &i1));
        TRY(arg_bool(d, n, 3, &b0));
        TRY(arg_bool(d, n, 4, &b0));
        uint32_t dd = 0;
        TRY(wrap_dim(d, i1, x->rank, &dd));
        const int64_t size = x->rank ? x->shape[dd] : 1;
        if (i0 < 0 || i0 > size) return fail(d, DJ_CGRAPH_ERR_ARG, "topk of %lld from %lld", (long long)i0, (long long)size);
        o[0] = *x;
        if (x->rank) o[0].shape[dd] = i0;
        o[1] = o[0];
        o[1].dtype = DJ_CDTYPE_I64;
        n->scratch_bytes = (uint64_t)size * sizeof(float); /* one row's indices */
        return DJ_OK;
    }
    case DJ_COP_HARDTANH:
        TRY(arg_num(d, n, 1, &f0));
        TRY(arg_num(d, n, 2, &f0));
        TRY(arg_f32(d, n, 0, &x));
        o[0] = *x;
        return DJ_OK;
    case DJ_COP_GELU:
        if (n->args[1].kind != DJ_CARG_STR || (strcmp(n->args[1].str, "none") && strcmp(n->args[1].str, "tanh")))
            return fail(d, DJ_CGRAPH_ERR_ARG, "gelu's approximate is not 'none' or 'tanh'");
        /* fall through */
    case DJ_COP_RELU: case DJ_COP_SILU: case DJ_COP_SIGMOID: case DJ_COP_TANH: case DJ_COP_NEG: case DJ_COP_EXP:
        TRY(arg_f32(d, n, 0, &x));
        o[0] = *x;
        return DJ_OK;
    case DJ_COP_CONV: {
        TRY(arg_f32(d, n, 0, &x));
        TRY(arg_f32(d, n, 1, &y));
        TRY(arg_opt_t(d, n, 2, &z));
        TRY(arg_bool(d, n, 6, &b0));
        if (x->rank != 4 || y->rank != 4)
            return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "convolution of rank %u (2-d convolutions are built)", x->rank);
        int64_t s[2], p[2], dl[2];
        TRY(pair(d, n, 3, -1, 1, s));
        TRY(pair(d, n, 4, -1, 0, p));
        TRY(pair(d, n, 5, -1, 1, dl));
        TRY(arg_int(d, n, 8, &i0));
        if (b0) { /* transposed: weight [C_in, C_out/groups, KH, KW] */
            int64_t op[2];
            TRY(pair(d, n, 7, -1, 0, op));
            for (int k = 0; k < 2; k++) {
                if (s[k] > (1 << 20) || dl[k] > (1 << 20) || p[k] > (1 << 20))
                    return fail(d, DJ_CGRAPH_ERR_ARG, "transposed convolution: stride, dilation or padding above 2^20");
                if (op[k] >= (s[k] > dl[k] ? s[k] : dl[k]))
                    return fail(d, DJ_CGRAPH_ERR_ARG, "output_padding %lld not below stride %lld or dilation %lld",
                                (long long)op[k], (long long)s[k], (long long)dl[k]);
            }
            if (i0 < 1 || x->shape[1] != y->shape[0] || y->shape[0] % i0)
                return fail(d, DJ_CGRAPH_ERR_ARG, "transposed convolution: groups %lld, %lld input channels, weight [%lld, %lld, ...]",
                            (long long)i0, (long long)x->shape[1], (long long)y->shape[0], (long long)y->shape[1]);
            if ((uint64_t)y->shape[1] > d->lim.max_elems / (uint64_t)i0)
                return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "transposed convolution: output channels overflow");
            const int64_t oc = y->shape[1] * i0;
            if (z && (z->rank != 1 || z->shape[0] != oc)) return fail(d, DJ_CGRAPH_ERR_ARG, "bias is not [out channels]");
            o[0].rank = 4;
            o[0].shape[0] = x->shape[0];
            o[0].shape[1] = oc;
            for (int k = 0; k < 2; k++) {
                const int64_t in = x->shape[2 + k], kern = y->shape[2 + k];
                const int64_t len = (in - 1) * s[k] - 2 * p[k] + dl[k] * (kern - 1) + op[k] + 1;
                if (!in || !kern || len < 1)
                    return fail(d, DJ_CGRAPH_ERR_ARG, "transposed convolution gives an output of %lld in dim %d", (long long)len, 2 + k);
                o[0].shape[2 + k] = len;
            }
            return DJ_OK;
        }
        if (i0 < 1 || x->shape[1] % i0 || y->shape[0] % i0 || y->shape[1] * i0 != x->shape[1])
            return fail(d, DJ_CGRAPH_ERR_ARG, "groups %lld with %lld input and %lld output channels, weight [%lld, %lld, ...]",
                        (long long)i0, (long long)x->shape[1], (long long)y->shape[0], (long long)y->shape[0], (long long)y->shape[1]);
        if (z && (z->rank != 1 || z->shape[0] != y->shape[0])) return fail(d, DJ_CGRAPH_ERR_ARG, "bias is not [out channels]");
        o[0].rank = 4;
        o[0].shape[0] = x->shape[0];
        o[0].shape[1] = y->shape[0];
        TRY(pool_len(d, x->shape[2], y->shape[2], s[0], p[0], dl[0], false, &o[0].shape[2]));
        TRY(pool_len(d, x->shape[3], y->shape[3], s[1], p[1], dl[1], false, &o[0].shape[3]));
        /* the columns of one group of one image: [OH*OW][C/g*KH*KW] */
        uint64_t cols = (uint64_t)y->shape[1] * (uint64_t)y->shape[2];
        const uint64_t f[3] = {(uint64_t)y->shape[3], (uint64_t)o[0].shape[2], (uint64_t)o[0].shape[3]};
        for (int k = 0; k < 3; k++) {
            if (f[k] && cols > d->lim.max_elems / f[k]) return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "convolution columns overflow");
            cols *= f[k];
        }
        n->scratch_bytes = cols * sizeof(float);
        return DJ_OK;
    }
    case DJ_COP_MAXPOOL_IDX: case DJ_COP_MAXPOOL: case DJ_COP_AVGPOOL: {
        TRY(arg_f32(d, n, 0, &x));
        if (x->rank != 3 && x->rank != 4) return fail(d, DJ_CGRAPH_ERR_ARG, "pooling of rank %u (3 or 4)", x->rank);
        int64_t k[2], s[2], p[2], dl[2] = {1, 1};
        TRY(pair(d, n, 1, -1, 1, k));
        if (n->args[2].kind == DJ_CARG_INTS && n->args[2].n == 0) s[0] = k[0], s[1] = k[1]; /* stride [] = kernel */
        else TRY(pair(d, n, 2, -1, 1, s));
        TRY(pair(d, n, 3, -1, 0, p));
        if (n->op == DJ_COP_AVGPOOL) {
            TRY(arg_bool(d, n, 4, &b0));
            bool cip;
            TRY(arg_bool(d, n, 5, &cip));
            if (n->args[6].kind != DJ_CARG_NONE) {
                TRY(arg_int(d, n, 6, &i1));
                if (i1 == 0) return fail(d, DJ_CGRAPH_ERR_ARG, "divisor_override 0");
            }
        } else {
            TRY(pair(d, n, 4, -1, 1, dl));
            TRY(arg_bool(d, n, 5, &b0));
        }
        if (p[0] * 2 > k[0] || p[1] * 2 > k[1]) return fail(d, DJ_CGRAPH_ERR_ARG, "padding above half the window");
        o[0] = *x;
        const uint32_t h = x->rank - 2;
        TRY(pool_len(d, x->shape[h], k[0], s[0], p[0], dl[0], b0, &o[0].shape[h]));
        TRY(pool_len(d, x->shape[h + 1], k[1], s[1], p[1], dl[1], b0, &o[0].shape[h + 1]));
        if (n->op == DJ_COP_MAXPOOL_IDX) {
            o[1] = o[0];
            o[1].dtype = DJ_CDTYPE_I64;
        }
        return DJ_OK;
    }
    case DJ_COP_ADAPTIVE_AVG: case DJ_COP_ADAPTIVE_AVG2: {
        TRY(arg_f32(d, n, 0, &x));
        if (x->rank != 3 && x->rank != 4) return fail(d, DJ_CGRAPH_ERR_ARG, "pooling of rank %u (3 or 4)", x->rank);
        int64_t os[2];
        TRY(pair(d, n, 1, -1, 1, os));
        o[0] = *x;
        o[0].shape[x->rank - 2] = os[0];
        o[0].shape[x->rank - 1] = os[1];
        return DJ_OK;
    }
    case DJ_COP_BATCH_NORM: case DJ_COP_BATCH_NORM_EVAL: {
        TRY(arg_f32(d, n, 0, &x));
        if (x->rank < 2) return fail(d, DJ_CGRAPH_ERR_ARG, "batch norm of rank %u", x->rank);
        for (uint32_t i = 1; i <= 4; i++) {
            const dj_ctensor_info *c = NULL;
            TRY(arg_opt_t(d, n, i, &c));
            if (!c && i >= 3) return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "batch norm without running statistics");
            if (c && (c->dtype != DJ_CDTYPE_F32 || c->rank != 1 || c->shape[0] != x->shape[1]))
                return fail(d, DJ_CGRAPH_ERR_ARG, "batch norm argument %u is not f32 [%lld]", i, (long long)x->shape[1]);
        }
        const uint32_t eps_at = n->op == DJ_COP_BATCH_NORM ? 7 : 6;
        if (n->op == DJ_COP_BATCH_NORM) {
            TRY(arg_bool(d, n, 5, &b0));
            if (b0) return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "batch norm in training mode (call module.eval())");
        }
        TRY(arg_num(d, n, eps_at - 1, &f0));
        TRY(arg_num(d, n, eps_at, &f0));
        if (!(f0 >= 0)) return fail(d, DJ_CGRAPH_ERR_ARG, "eps %g", f0);
        o[0] = *x;
        /* save_mean / save_invstd: meta kernels say [C], CPU kernels [0] in eval; both are accepted
         * (see the check in read_node) and the executor leaves them unwritten. */
        o[1].rank = o[2].rank = 1;
        o[1].shape[0] = o[2].shape[0] = x->shape[1];
        return DJ_OK;
    }
    case DJ_COP_LAYER_NORM: {
        TRY(arg_f32(d, n, 0, &x));
        uint32_t c = 0;
        const int64_t *v = NULL;
        TRY(arg_ints(d, n, 1, &c, &v));
        if (c < 1 || c > x->rank) return fail(d, DJ_CGRAPH_ERR_ARG, "normalized_shape of %u dims for rank %u", c, x->rank);
        for (uint32_t k = 0; k < c; k++)
            if (v[k] != x->shape[x->rank - c + k]) return fail(d, DJ_CGRAPH_ERR_ARG, "normalized_shape is not the trailing shape");
        for (uint32_t i = 2; i <= 3; i++) {
            const dj_ctensor_info *w = NULL;
            TRY(arg_opt_t(d, n, i, &w));
            if (!w) continue;
            if (w->dtype != DJ_CDTYPE_F32 || w->rank != c)
                return fail(d, DJ_CGRAPH_ERR_ARG, "layer norm argument %u is not f32 of normalized_shape", i);
            for (uint32_t k = 0; k < c; k++)
                if (w->shape[k] != v[k]) return fail(d, DJ_CGRAPH_ERR_ARG, "layer norm argument %u is not of normalized_shape", i);
        }
        TRY(arg_num(d, n, 4, &f0));
        if (!(f0 >= 0)) return fail(d, DJ_CGRAPH_ERR_ARG, "eps %g", f0);
        o[0] = *x;
        o[1] = *x;
        for (uint32_t k = x->rank - c; k < x->rank; k++) o[1].shape[k] = 1;
        o[2] = o[1];
        return DJ_OK;
    }
    case DJ_COP_SOFTMAX: case DJ_COP_LOG_SOFTMAX: {
        TRY(arg_f32(d, n, 0, &x));
        uint32_t dd = 0;
        TRY(arg_int(d, n, 1, &i0));
        TRY(wrap_dim(d, i0, x->rank, &dd));
        TRY(arg_bool(d, n, 2, &b0));
        if (b0) return fail(d, DJ_CGRAPH_ERR_UNSUPPORTED, "half_to_float");
        o[0] = *x;
        return DJ_OK;
    }
    case DJ_COP_VIEW: case DJ_COP_RESHAPE: case DJ_COP_UNSAFE_VIEW: case DJ_COP_RESHAPE_ALIAS:
        TRY(arg_t(d, n, 0, &x));
        o[0].dtype = x->dtype;
        TRY(sizes(d, n, 1, x->numel, &o[0]));
        if (n->op == DJ_COP_RESHAPE_ALIAS) {
            uint32_t c = 0;
            const int64_t *v = NULL;
            TRY(arg_ints(d, n, 2, &c, &v));
            if (c != o[0].rank) return fail(d, DJ_CGRAPH_ERR_ARG, "strides of %u dims for rank %u", c, o[0].rank);
        }
        return DJ_OK;
    case DJ_COP_FLATTEN: {
        TRY(arg_t(d, n, 0, &x));
        uint32_t s = 0, e = 0;
        TRY(arg_int(d, n, 1, &i0));
        TRY(arg_int(d, n, 2, &i1));
        TRY(wrap_dim(d, i0, x->rank, &s));
        TRY(wrap_dim(d, i1, x->rank, &e));
        if (s > e) return fail(d, DJ_CGRAPH_ERR_ARG, "flatten from %u to %u", s, e);
        o[0].dtype = x->dtype;
        if (x->rank == 0) return DJ_OK; /* flatten of a scalar: [1]; rank 0 -> 1 below */
        for (uint32_t k = 0; k < s; k++) o[0].shape[o[0].rank++] = x->shape[k];
        int64_t p = 1;
        for (uint32_t k = s; k <= e; k++) p *= x->shape[k];
        o[0].shape[o[0].rank++] = p;
        for (uint32_t k = e + 1; k < x->rank; k++) o[0].shape[o[0].rank++] = x->shape[k];
        return DJ_OK;
    }
    case DJ_COP_UNSQUEEZE: {
        TRY(arg_t(d, n, 0, &x));
        TRY(arg_int(d, n, 1, &i0));
        if (x->rank >= DJ_CGRAPH_MAX_RANK) return fail(d, DJ_CGRAPH_ERR_LIMIT, "rank above %d", DJ_CGRAPH_MAX_RANK);
        uint32_t dd = 0;
        TRY(wrap_dim(d, i0, x->rank + 1, &dd));
        o[0].dtype = x->dtype;
        o[0].rank = x->rank + 1;
        for (uint32_t k = 0, j = 0; k < o[0].rank; k++) o[0].shape[k] = k == dd ? 1 : x->shape[j++];
        return DJ_OK;
    }
    case DJ_COP_SQUEEZE_DIM: {
        TRY(arg_t(d, n, 0, &x));
        TRY(arg_int(d, n, 1, &i0));
        uint32_t dd = 0;
        TRY(wrap_dim(d, i0, x->rank, &dd));
        o[0] = *x;
        if (x->rank && x->shape[dd] == 1) {
            o[0].rank = 0;
            for (uint32_t k = 0; k < x->rank; k++)
                if (k != dd) o[0].shape[o[0].rank++] = x->shape[k];
        }
        return DJ_OK;
    }
    case DJ_COP_PERMUTE: {
        TRY(arg_t(d, n, 0, &x));
        uint32_t c = 0;
        const int64_t *v = NULL;
        TRY(arg_ints(d, n, 1, &c, &v));
        if (c != x->rank) return fail(d, DJ_CGRAPH_ERR_ARG, "permute of %u dims for rank %u", c, x->rank);
        bool seen[DJ_CGRAPH_MAX_RANK] = {0};
        o[0] = *x;
        for (uint32_t k = 0; k < c; k++) {
            uint32_t dd = 0;
            TRY(wrap_dim(d, v[k], x->rank, &dd));
            if (seen[dd]) return fail(d, DJ_CGRAPH_ERR_ARG, "permute repeats dim %u", dd);
            seen[dd] = true;
            o[0].shape[k] = x->shape[dd];
        }
        return DJ_OK;
    }
    case DJ_COP_TRANSPOSE: case DJ_COP_T: {
        TRY(arg_t(d, n, 0, &x));
        uint32_t a = 0, b = 1;
        if (n->op == DJ_COP_TRANSPOSE) {
            TRY(arg_int(d, n, 1, &i0));
            TRY(arg_int(d, n, 2, &i1));
            TRY(wrap_dim(d, i0, x->rank, &a));
            TRY(wrap_dim(d, i1, x->rank, &b));
        } else if (x->rank > 2) {
            return fail(d, DJ_CGRAPH_ERR_ARG, "t() of rank %u", x->rank);
        }
        o[0] = *x;
        if (x->rank >= 2 || (n->op == DJ_COP_TRANSPOSE && x->rank)) {
            o[0].shape[a] = x->shape[b];
            o[0].shape[b] = x->shape[a];
        }
        return DJ_OK;
    }
    case DJ_COP_EXPAND: {
        TRY(arg_t(d, n, 0, &x));
        uint32_t c = 0;
        const int64_t *v = NULL;
        TRY(arg_ints(d, n, 1, &c, &v));
        if (c < x->rank || c > DJ_CGRAPH_MAX_RANK) return fail(d, DJ_CGRAPH_ERR_ARG, "expand to %u dims from %u", c, x->rank);
        o[0].dtype = x->dtype;
        o[0].rank = c;
        for (uint32_t k = 0; k < c; k++) {
            const int64_t have = k < c - x->rank ? 1 : x->shape[k - (c - x->rank)];
            if (v[k] == -1 && k >= c - x->rank) o[0].shape[k] = have;
            else if (v[k] < 0 || (have != 1 && v[k] != have))
                return fail(d, DJ_CGRAPH_ERR_ARG, "expand of size %lld to %lld", (long long)have, (long long)v[k]);
            else o[0].shape[k] = v[k];
        }
        return DJ_OK;
    }
    case DJ_COP_CLONE:
        if (n->args[1].kind != DJ_CARG_NONE && n->args[1].kind != DJ_CARG_STR)
            return fail(d, DJ_CGRAPH_ERR_ARG, "memory_format is not a name");
        /* fall through */
    case DJ_COP_DETACH: case DJ_COP_ALIAS:
        TRY(arg_t(d, n, 0, &x));
        o[0] = *x;
        return DJ_OK;
    case DJ_COP_MEAN_DIM: case DJ_COP_SUM_DIM:
        TRY(arg_f32(d, n, 0, &x));
        TRY(arg_bool(d, n, 2, &b0));
        TRY(arg_none(d, n, 3, "dtype"));
        return reduce_dims(d, n, x, 1, b0, &o[0]);
    case DJ_COP_MEAN: case DJ_COP_SUM:
        TRY(arg_f32(d, n, 0, &x));
        TRY(arg_none(d, n, 1, "dtype"));
        o[0].rank = 0;
        return DJ_OK;
    case DJ_COP_CAT: {
        if (n->args[0].kind != DJ_CARG_TENSORS || n->args[0].n == 0 || n->args[0].holes)
            return fail(d, DJ_CGRAPH_ERR_ARG, "cat of no tensors (or a None among them)");
        TRY(arg_int(d, n, 1, &i0));
        const dj_ctensor_info *first = NULL;
        for (uint32_t k = 0; k < n->args[0].n; k++) {
            const dj_ctensor_info *t = vinfo(d, n->args[0].vals[k]);
            if (t->rank == 1 && t->shape[0] == 0) continue; /* legacy: empty 1-d tensors are skipped */
            if (!first) {
                first = t;
                o[0] = *t;
                uint32_t dd = 0;
                TRY(wrap_dim(d, i0, t->rank, &dd));
                if (!t->rank) return fail(d, DJ_CGRAPH_ERR_ARG, "cat of 0-d tensors");
                o[0].shape[dd] = 0;
                i1 = dd;
            }
            if (t->rank != first->rank || t->dtype != first->dtype)
                return fail(d, DJ_CGRAPH_ERR_ARG, "cat of tensors of ranks %u and %u (or dtypes)", first->rank, t->rank);
            for (uint32_t j = 0; j < t->rank; j++)
                if ((int64_t)j != i1 && t->shape[j] != first->shape[j])
                    return fail(d, DJ_CGRAPH_ERR_ARG, "cat of tensors differing in dim %u", j);
            if (o[0].shape[i1] > INT64_MAX / 2 - t->shape[i1]) return fail(d, DJ_CGRAPH_ERR_OVERFLOW, "cat overflows");
            o[0].shape[i1] += t->shape[i1];
        }
        if (!first) o[0] = *vinfo(d, n->args[0].vals[0]);
        return DJ_OK;
    }
    case DJ_COP_COUNT: break;
    }
    return fail(d, DJ_CGRAPH_ERR_UNKNOWN_OP, "no shape rule");
}

static bool same_info(const dj_ctensor_info *a, const dj_ctensor_info *b) {
    if (a->rank != b->rank || a->dtype != b->dtype) return false;
    for (uint32_t i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

static void shape_str(const dj_ctensor_info *t, char *buf, size_t cap) {
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (uint32_t i = 0; i < t->rank && k < cap; i++) k += (size_t)snprintf(buf + k, cap - k, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "] %s", dj_cdtype_name(t->dtype));
}

/* The work of a node, as a double (no overflow): GEMMs and convolutions 2 x multiply-adds, pooling
 * its window taps, everything else the elements it reads and writes. */
static double node_ops(const dec *d, const dj__cnode *n) {
    const dj_cgraph_t *g = d->g;
    const dj_ctensor_info *o = &g->vals[n->out[0]].t;
    const double out = (double)o->numel;
    const dj__carg *a = n->args;
    switch (n->op) {
    case DJ_COP_ADDMM: return 2.0 * out * (double)g->vals[a[1].v].t.shape[1];
    case DJ_COP_MM: return 2.0 * out * (double)g->vals[a[0].v].t.shape[1];
    case DJ_COP_BMM: return 2.0 * out * (double)g->vals[a[0].v].t.shape[2];
    case DJ_COP_BADDBMM: return 2.0 * out * (double)g->vals[a[1].v].t.shape[2];
    case DJ_COP_SDPA: /* two GEMMs and a softmax per row */
        return 2.0 * (double)g->vals[n->out[1]].t.numel * (double)(g->vals[a[0].v].t.shape[g->vals[a[0].v].t.rank - 1] + g->vals[a[2].v].t.shape[g->vals[a[2].v].t.rank - 1]) + 4.0 * (double)g->vals[n->out[1]].t.numel;
    case DJ_COP_TOPK: { /* k rounds of selection over each row */
        const dj_ctensor_info *x = &g->vals[a[0].v].t;
        const int64_t dim = a[2].i < 0 ? a[2].i + x->rank : a[2].i;
        return out * (double)(x->rank ? x->shape[dim] : 1) + (double)x->numel;
    }
    case DJ_COP_LINEAR: return 2.0 * out * (double)g->vals[a[1].v].t.shape[1];
    case DJ_COP_CONV: {
        const dj_ctensor_info *w = &g->vals[a[1].v].t;
        const double each = (double)w->shape[1] * (double)w->shape[2] * (double)w->shape[3];
        if (a[6].i) return 2.0 * (double)g->vals[a[0].v].t.numel * each; /* transposed: each input scatters */
        return 2.0 * out * each;
    }
    case DJ_COP_SORT: case DJ_COP_SORT_STABLE: { /* a merge sort of each row: len log2(len) */
        const dj_ctensor_info *x = &g->vals[a[0].v].t;
        const int64_t dim = a[n->op == DJ_COP_SORT_STABLE ? 2 : 1].i;
        const double len = (double)(x->rank ? x->shape[dim < 0 ? dim + x->rank : dim] : 1);
        double lg = 1.0;
        for (double l = len; l > 1.0; l /= 2.0) lg += 1.0;
        return 2.0 * out * lg + (double)x->numel;
    }
    case DJ_COP_MAXPOOL_IDX: case DJ_COP_MAXPOOL: case DJ_COP_AVGPOOL: case DJ_COP_ADAPTIVE_AVG: case DJ_COP_ADAPTIVE_AVG2: {
        const dj_ctensor_info *x = &g->vals[a[0].v].t;
        const uint32_t h = x->rank - 2;
        /* taps inside the image: at most the window, at most the image (adaptive: H/OH + 1) */
        double th = (double)x->shape[h], tw = (double)x->shape[h + 1];
        if (n->op == DJ_COP_ADAPTIVE_AVG || n->op == DJ_COP_ADAPTIVE_AVG2) {
            th = o->shape[h] ? th / (double)o->shape[h] + 1.0 : 0.0;
            tw = o->shape[h + 1] ? tw / (double)o->shape[h + 1] + 1.0 : 0.0;
        } else {
            const double kh = (double)(a[1].n == 1 ? a[1].ints[0] : a[1].ints[0]), kw = (double)(a[1].n == 1 ? a[1].ints[0] : a[1].ints[1]);
            th = kh < th ? kh : th;
            tw = kw < tw ? kw : tw;
        }
        return out * (th > 1.0 ? th : 1.0) * (tw > 1.0 ? tw : 1.0);
    }
    default: break;
    }
    double r = out;
    for (uint32_t i = 0; i < n->n_args; i++) {
        if (a[i].kind == DJ_CARG_TENSOR) r += (double)g->vals[a[i].v].t.numel;
        else if (a[i].kind == DJ_CARG_TENSORS)
            for (uint32_t k = 0; k < a[i].n; k++)
                if (a[i].vals[k] != DJ_CARG_HOLE) r += (double)g->vals[a[i].vals[k]].t.numel;
    }
    return r;
}

/* Room for value ids below need (vals and producer grow together while nodes are read). */
static dj_status ensure_vals(dec *d, uint64_t need) {
    dj_cgraph_t *g = d->g;
    if (need <= g->cap_vals) return DJ_OK;
    if (need > (1u << 28)) return fail(d, DJ_CGRAPH_ERR_LIMIT, "more than 2^28 values");
    uint64_t cap = (uint64_t)g->cap_vals * 2;
    cap = cap < need ? need : cap;
    dj__cval *v = realloc(g->vals, sizeof *v * (cap + 1));
    if (!v) return dj_fail(DJ_ENOMEM, "out of memory decoding a captured graph");
    g->vals = v;
    int32_t *p = realloc(d->producer, sizeof *p * (cap + 1));
    if (!p) return dj_fail(DJ_ENOMEM, "out of memory decoding a captured graph");
    d->producer = p;
    for (uint64_t i = g->cap_vals; i <= cap; i++) {
        memset(&g->vals[i], 0, sizeof g->vals[i]);
        p[i] = -1;
    }
    g->cap_vals = (uint32_t)cap;
    return DJ_OK;
}

/* {"op": str, "args": [...], "out": [spec...], "path": str} */
static dj_status read_node(dec *d, uint32_t idx, uint32_t *next_val) {
    dj_cgraph_t *g = d->g;
    dj__cnode *n = &g->nodes[idx];
    d->node = (int32_t)idx;
    d->op = NULL;
    d->path = NULL;
    d->node_base[idx] = *next_val;
    uint32_t nk;
    if (!dj__mp_map(&d->m, &nk)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a node is not a map");
    /* op first: the other fields depend on it */
    const uint8_t *args_at = NULL, *out_at = NULL;
    for (uint32_t i = 0; i < nk; i++) {
        const char *k;
        uint32_t kn;
        if (!dj__mp_str(&d->m, &k, &kn)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a node key is not a string");
        if (key_is(k, kn, "op")) {
            if (!dj__mp_str(&d->m, &d->op, &d->op_len)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "op is not a string");
            continue;
        }
        if (key_is(k, kn, "path")) {
            if (!dj__mp_str(&d->m, &d->path, &d->path_len)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "path is not a string");
            continue;
        }
        if (key_is(k, kn, "args")) args_at = d->m.p;
        else if (key_is(k, kn, "out")) out_at = d->m.p;
        if (!dj__mp_skip(&d->m, 8)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a node's value is malformed (or nested deeper than 8)");
    }
    if (!d->op || !args_at || !out_at) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a node needs op, args and out");
    const uint8_t *after = d->m.p;
    int op = -1;
    for (int k = 0; k < DJ_COP_COUNT; k++)
        if (key_is(d->op, d->op_len, dj__cop_names[k])) op = k;
    if (op < 0) return fail(d, DJ_CGRAPH_ERR_UNKNOWN_OP, "op %.*s is not supported by this server", (int)(d->op_len < 64 ? d->op_len : 64), d->op);
    n->op = (dj__cop)op;
    d->m.p = args_at;
    uint32_t na;
    if (!dj__mp_array(&d->m, &na)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "args is not an array");
    if (na != cop_nargs[op]) return fail(d, DJ_CGRAPH_ERR_ARITY, "%u arguments (its schema has %u)", na, cop_nargs[op]);
    n->n_args = na;
    for (uint32_t i = 0; i < na; i++) TRY(read_arg(d, &n->args[i]));
    d->m.p = out_at;
    uint32_t no;
    if (!dj__mp_array(&d->m, &no)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "out is not an array");
    if (cop_nout[op] && no != cop_nout[op]) return fail(d, DJ_CGRAPH_ERR_ARITY, "%u outputs (its schema has %u)", no, cop_nout[op]);
    if (no > DJ_CGRAPH_MAX_OUTS) return fail(d, DJ_CGRAPH_ERR_LIMIT, "%u outputs (at most %d)", no, DJ_CGRAPH_MAX_OUTS);
    if (!no) return fail(d, DJ_CGRAPH_ERR_ARITY, "a node without outputs");
    n->n_out = no;
    if (!(n->out = calloc(no, sizeof *n->out))) return fail(d, DJ_CGRAPH_ERR_LIMIT, "out of memory");
    TRY(ensure_vals(d, *next_val + no));
    dj_ctensor_info want[DJ_CGRAPH_MAX_OUTS];
    uint32_t n_want = cop_nout[op];
    TRY(infer(d, n, want, &n_want));
    if (n_want != no) return fail(d, DJ_CGRAPH_ERR_ARITY, "%u outputs (its arguments give %u)", no, n_want);
    for (uint32_t k = 0; k < no; k++) {
        dj_ctensor_info got;
        TRY(read_spec(d, &got, UINT32_MAX));
        TRY(info_finish(d, &want[k]));
        bool ok = same_info(&got, &want[k]);
        if (!ok && k > 0 && (n->op == DJ_COP_BATCH_NORM || n->op == DJ_COP_BATCH_NORM_EVAL))
            ok = got.dtype == DJ_CDTYPE_F32 && got.rank == 1 && got.shape[0] == 0; /* eval's empty save_mean/invstd */
        if (!ok) {
            char a[128], b[128];
            shape_str(&got, a, sizeof a);
            shape_str(&want[k], b, sizeof b);
            return fail(d, DJ_CGRAPH_ERR_SHAPE, "output %u declared %s, but its inputs give %s", k, a, b);
        }
        g->vals[*next_val].t = got;
        g->vals[*next_val].last_use = -1;
        n->out[k] = (*next_val)++;
    }
    d->ops += node_ops(d, n);
    if (d->ops > (double)d->lim.max_ops)
        return fail(d, DJ_CGRAPH_ERR_LIMIT, "the graph's work reaches %.3g operations here, above the limit of %llu",
                    d->ops, (unsigned long long)d->lim.max_ops);
    d->m.p = after;
    d->node = -1;
    return DJ_OK;
}

/* ---- the plan ---- */

/* The tensor values node n reads, with the peephole: an addmm/mm whose second matrix is t() of
 * a 2-d value reads that value (the GEMM takes weights as rows) and not the t() node. */
static uint32_t node_reads(const dj_cgraph_t *g, dj__cnode *n, uint32_t *v, uint32_t cap, const int32_t *producer) {
    uint32_t c = 0;
    for (uint32_t i = 0; i < n->n_args; i++) {
        const dj__carg *a = &n->args[i];
        if (a->kind == DJ_CARG_TENSOR && c < cap) {
            uint32_t id = a->v;
            if ((n->op == DJ_COP_ADDMM && i == 2) || (n->op == DJ_COP_MM && i == 1)) {
                const int32_t p = producer[id];
                if (p >= 0 && g->nodes[p].op == DJ_COP_T && g->vals[g->nodes[p].args[0].v].t.rank == 2)
                    id = g->nodes[p].args[0].v;
                n->mat2_t = id != a->v;
                n->mat2_src = id;
            }
            v[c++] = id;
        } else if (a->kind == DJ_CARG_TENSORS) {
            for (uint32_t k = 0; k < a->n && c < cap; k++)
                if (a->vals[k] != DJ_CARG_HOLE) v[c++] = a->vals[k];
        }
    }
    return c;
}

typedef struct blk {
    uint64_t off, size;
} blk;

typedef struct arena {
    blk *b;      /* [n] sorted by off */
    uint32_t n, cap;
    uint64_t peak;
} arena;

static dj_status arena_alloc(arena *a, uint64_t bytes, uint64_t *off) {
    bytes = (bytes + 63) & ~(uint64_t)63;
    if (!bytes) {
        *off = 0;
        return DJ_OK;
    }
    uint64_t at = 0;
    uint32_t pos = 0;
    for (; pos < a->n; pos++) {
        if (a->b[pos].off - at >= bytes) break;
        at = a->b[pos].off + a->b[pos].size;
    }
    if (a->n == a->cap) {
        const uint32_t nc = a->cap ? a->cap * 2 : 64;
        blk *nb = realloc(a->b, sizeof *nb * nc);
        if (!nb) return dj_fail(DJ_ENOMEM, "out of memory planning a captured graph");
        a->b = nb;
        a->cap = nc;
    }
    memmove(a->b + pos + 1, a->b + pos, sizeof *a->b * (a->n - pos));
    a->b[pos] = (blk){at, bytes};
    a->n++;
    if (at + bytes > a->peak) a->peak = at + bytes;
    *off = at;
    return DJ_OK;
}

static void arena_free(arena *a, uint64_t off, uint64_t bytes) {
    if (!((bytes + 63) & ~(uint64_t)63)) return;
    for (uint32_t i = 0; i < a->n; i++)
        if (a->b[i].off == off) {
            memmove(a->b + i, a->b + i + 1, sizeof *a->b * (a->n - i - 1));
            a->n--;
            return;
        }
}

static uint64_t val_bytes(const dj__cval *v) { return v->t.numel * sizeof(float); }

static dj_status plan(dec *d) {
    dj_cgraph_t *g = d->g;
    const uint32_t first_node_val = g->n_inputs + g->n_weights;
    uint32_t cap = 1; /* the most tensors one node reads (a cat's list may be long) */
    for (uint32_t j = 0; j < g->n_nodes; j++) {
        uint32_t c = g->nodes[j].n_args;
        for (uint32_t i = 0; i < g->nodes[j].n_args; i++)
            if (g->nodes[j].args[i].kind == DJ_CARG_TENSORS) c += g->nodes[j].args[i].n;
        cap = c > cap ? c : cap;
    }
    uint32_t *reads = malloc(sizeof *reads * cap);
    if (!reads) return dj_fail(DJ_ENOMEM, "out of memory planning a captured graph");
    /* liveness backwards from the outputs */
    for (uint32_t i = 0; i < g->n_outputs; i++) {
        g->vals[g->outputs[i]].last_use = INT32_MAX;
        const int32_t p = d->producer[g->outputs[i]];
        if (p >= 0) g->nodes[p].live = true;
    }
    for (int32_t j = (int32_t)g->n_nodes - 1; j >= 0; j--) {
        dj__cnode *n = &g->nodes[j];
        if (!n->live) continue;
        const uint32_t c = node_reads(g, n, reads, cap, d->producer);
        for (uint32_t k = 0; k < c; k++) {
            dj__cval *v = &g->vals[reads[k]];
            if (v->last_use < j) v->last_use = j;
            if (d->producer[reads[k]] >= 0) g->nodes[d->producer[reads[k]]].live = true;
        }
    }
    arena a = {0};
    dj_status st = DJ_OK;
    for (uint32_t j = 0; j < g->n_nodes && st == DJ_OK; j++) {
        dj__cnode *n = &g->nodes[j];
        if (!n->live) continue;
        if ((n->op == DJ_COP_ADDMM || n->op == DJ_COP_MM) && !n->mat2_t) /* mat2 transposed into GEMM rows */
            n->scratch_bytes = g->vals[n->mat2_src].t.numel * sizeof(float);
        for (uint32_t k = 0; k < n->n_out && st == DJ_OK; k++) {
            dj__cval *v = &g->vals[n->out[k]];
            if (v->last_use < (int32_t)j) v->last_use = (int32_t)j; /* made, never read: dies here */
            st = arena_alloc(&a, val_bytes(v), &v->offset);
        }
        if (st == DJ_OK && n->scratch_bytes) {
            st = arena_alloc(&a, n->scratch_bytes, &n->scratch_off);
            arena_free(&a, n->scratch_off, n->scratch_bytes);
        }
        const uint32_t c = node_reads(g, n, reads, cap, d->producer);
        for (uint32_t k = 0; k < c; k++) {
            dj__cval *v = &g->vals[reads[k]];
            if (reads[k] >= first_node_val && v->last_use == (int32_t)j) {
                arena_free(&a, v->offset, val_bytes(v));
                v->last_use = -2; /* freed: a second read of it by this node frees nothing */
            }
        }
        for (uint32_t k = 0; k < n->n_out; k++) {
            dj__cval *v = &g->vals[n->out[k]];
            if (v->last_use == (int32_t)j) {
                arena_free(&a, v->offset, val_bytes(v));
                v->last_use = -2;
            }
        }
    }
    free(a.b);
    free(reads);
    if (st != DJ_OK) return st;
    if (a.peak > d->lim.max_stack_bytes)
        return fail(d, DJ_CGRAPH_ERR_LIMIT, "the planned stack of %llu bytes is above the limit of %llu",
                    (unsigned long long)a.peak, (unsigned long long)d->lim.max_stack_bytes);
    g->stack_bytes = (size_t)a.peak;
    return DJ_OK;
}

/* ---- the whole graph ---- */

void dj_cgraph_free(dj_cgraph_t *g) {
    if (!g) return;
    for (uint32_t j = 0; g->nodes && j < g->n_nodes; j++)
        for (uint32_t i = 0; i < DJ_CG_MAX_ARGS; i++) {
            free(g->nodes[j].args[i].ints);
            free(g->nodes[j].args[i].vals);
            free(g->nodes[j].args[i].fls);
        }
    for (uint32_t j = 0; g->nodes && j < g->n_nodes; j++) free(g->nodes[j].out);
    free(g->nodes);
    free(g->vals);
    free(g->outputs);
    free(g->hashes);
    free(g->hash_len);
    free(g->names);
    free(g);
}

static dj_status decode(dec *d, const uint8_t *bytes, size_t len) {
    dj_cgraph_t *g = d->g;
    d->m = (dj__mp){bytes, bytes + len};
    uint32_t nk;
    if (!dj__mp_map(&d->m, &nk)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "not a msgpack map");
    const uint8_t *at[4] = {0}; /* inputs, weights, nodes, outputs */
    static const char *const keys[4] = {"inputs", "weights", "nodes", "outputs"};
    int64_t version = -1;
    for (uint32_t i = 0; i < nk; i++) {
        const char *k;
        uint32_t kn;
        if (!dj__mp_str(&d->m, &k, &kn)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a key is not a string");
        if (key_is(k, kn, "v")) {
            if (!dj__mp_int(&d->m, &version)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "v is not an int");
            continue;
        }
        for (int j = 0; j < 4; j++)
            if (key_is(k, kn, keys[j])) at[j] = d->m.p;
        if (!dj__mp_skip(&d->m, 12)) return fail(d, DJ_CGRAPH_ERR_FORMAT, "a value is malformed (or nested deeper than 12)");
    }
    if (d->m.p != d->m.end) return fail(d, DJ_CGRAPH_ERR_FORMAT, "bytes after the graph");
    if (version != 1) return fail(d, DJ_CGRAPH_ERR_FORMAT, "version %lld (this server reads 1)", (long long)version);
    for (int j = 0; j < 4; j++)
        if (!at[j]) return fail(d, DJ_CGRAPH_ERR_FORMAT, "no %s", keys[j]);
    uint32_t cnt[4];
    for (int j = 0; j < 4; j++) {
        d->m.p = at[j];
        if (!dj__mp_array(&d->m, &cnt[j])) return fail(d, DJ_CGRAPH_ERR_FORMAT, "%s is not an array", keys[j]);
        at[j] = d->m.p;
    }
    if (cnt[2] > d->lim.max_nodes) return fail(d, DJ_CGRAPH_ERR_LIMIT, "%u nodes (the limit is %u)", cnt[2], d->lim.max_nodes);
    if (cnt[0] > 4096 || cnt[1] > (1u << 20) || cnt[3] > 4096)
        return fail(d, DJ_CGRAPH_ERR_LIMIT, "%u inputs, %u weights, %u outputs (4096, 2^20, 4096 at most)", cnt[0], cnt[1], cnt[3]);
    g->n_inputs = cnt[0];
    g->n_weights = cnt[1];
    g->n_nodes = cnt[2];
    g->n_outputs = cnt[3];
    g->cap_vals = cnt[0] + cnt[1] + 3 * (cnt[2] < 4096 ? cnt[2] : 4096); /* grows by ensure_vals */
    g->n_vals = g->cap_vals;
    if (!(g->vals = calloc(g->n_vals + 1, sizeof *g->vals)) || !(g->nodes = calloc(cnt[2] + 1, sizeof *g->nodes)) ||
        !(g->outputs = calloc(cnt[3] + 1, sizeof *g->outputs)) || !(g->hashes = calloc(cnt[1] + 1, sizeof *g->hashes)) ||
        !(g->hash_len = calloc(cnt[1] + 1, 1)) || !(g->names = calloc(cnt[1] + 1, sizeof *g->names)) ||
        !(d->node_base = calloc(cnt[2] + 1, sizeof *d->node_base)) || !(d->producer = malloc(sizeof *d->producer * (g->n_vals + 1))))
        return dj_fail(DJ_ENOMEM, "out of memory decoding a captured graph");
    d->m.p = at[0];
    for (uint32_t i = 0; i < cnt[0]; i++) {
        TRY(read_spec(d, &g->vals[i].t, UINT32_MAX));
    }
    d->m.p = at[1];
    for (uint32_t i = 0; i < cnt[1]; i++) {
        TRY(read_spec(d, &g->vals[cnt[0] + i].t, i));
    }
    for (uint32_t v = 0; v <= g->n_vals; v++) d->producer[v] = -1;
    for (uint32_t v = 0; v < cnt[0] + cnt[1]; v++) g->vals[v].last_use = -1;
    d->m.p = at[2];
    uint32_t next = cnt[0] + cnt[1];
    for (uint32_t j = 0; j < cnt[2]; j++) {
        TRY(read_node(d, j, &next));
        for (uint32_t k = 0; k < g->nodes[j].n_out; k++) d->producer[g->nodes[j].out[k]] = (int32_t)j;
    }
    g->n_vals = next;
    d->m.p = at[3];
    d->node = -1;
    for (uint32_t i = 0; i < cnt[3]; i++) {
        if (dj__mp_peek(&d->m) != DJ_MP_MAP) return fail(d, DJ_CGRAPH_ERR_FORMAT, "output %u is not a reference", i);
        TRY(read_ref(d, &g->outputs[i]));
    }
    return plan(d);
}

dj_status dj_cgraph_decode(const uint8_t *bytes, size_t len, const dj_cgraph_limits *lim, dj_cgraph_t **out,
                           dj_cgraph_error *err) {
    *out = NULL;
    if (err) memset(err, 0, sizeof *err);
    dec d = {.err = err, .node = -1};
    d.lim.max_nodes = lim && lim->max_nodes ? lim->max_nodes : 65536;
    d.lim.max_elems = lim && lim->max_elems && lim->max_elems < ((uint64_t)1 << 31) ? lim->max_elems : (uint64_t)1 << 31;
    d.lim.max_ops = lim && lim->max_ops ? lim->max_ops : (uint64_t)1 << 44;
    d.lim.max_stack_bytes = lim && lim->max_stack_bytes ? lim->max_stack_bytes : (uint64_t)4 << 30;
    if (!bytes && len) return fail(&d, DJ_CGRAPH_ERR_FORMAT, "no bytes");
    if (!(d.g = calloc(1, sizeof *d.g))) return dj_fail(DJ_ENOMEM, "out of memory");
    dj_status st = decode(&d, bytes, len);
    free(d.node_base);
    free(d.producer);
    if (st != DJ_OK) {
        dj_cgraph_free(d.g);
        return st;
    }
    *out = d.g;
    return DJ_OK;
}

uint32_t dj_cgraph_n_nodes(const dj_cgraph_t *g) { return g->n_nodes; }
uint32_t dj_cgraph_n_inputs(const dj_cgraph_t *g) { return g->n_inputs; }
uint32_t dj_cgraph_n_weights(const dj_cgraph_t *g) { return g->n_weights; }
uint32_t dj_cgraph_n_outputs(const dj_cgraph_t *g) { return g->n_outputs; }
const dj_ctensor_info *dj_cgraph_input(const dj_cgraph_t *g, uint32_t i) { return i < g->n_inputs ? &g->vals[i].t : NULL; }
const dj_ctensor_info *dj_cgraph_weight(const dj_cgraph_t *g, uint32_t i) {
    return i < g->n_weights ? &g->vals[g->n_inputs + i].t : NULL;
}
const dj_ctensor_info *dj_cgraph_output(const dj_cgraph_t *g, uint32_t i) {
    return i < g->n_outputs ? &g->vals[g->outputs[i]].t : NULL;
}
const uint8_t *dj_cgraph_weight_hash(const dj_cgraph_t *g, uint32_t i, size_t *hash_len) {
    if (i >= g->n_weights) return NULL;
    *hash_len = g->hash_len[i];
    return g->hashes[i];
}
const char *dj_cgraph_weight_name(const dj_cgraph_t *g, uint32_t i) { return i < g->n_weights ? g->names[i] : NULL; }
size_t dj_cgraph_stack_bytes(const dj_cgraph_t *g) { return g->stack_bytes; }

size_t dj_cgraph_mem_bytes(const dj_cgraph_t *g) {
    size_t n = sizeof *g + sizeof *g->vals * (g->cap_vals + 1) + sizeof *g->nodes * (g->n_nodes + 1) +
               sizeof *g->outputs * (g->n_outputs + 1) + (sizeof *g->hashes + 1 + sizeof *g->names) * (g->n_weights + 1);
    for (uint32_t j = 0; j < g->n_nodes; j++) {
        const dj__cnode *nd = &g->nodes[j];
        n += sizeof *nd->out * nd->n_out;
        for (uint32_t i = 0; i < DJ_CG_MAX_ARGS; i++) {
            const dj__carg *a = &nd->args[i];
            if (a->ints) n += sizeof *a->ints * (a->n ? a->n : 1);
            if (a->vals) n += sizeof *a->vals * (a->n ? a->n : 1);
            if (a->fls) n += sizeof *a->fls * a->n;
        }
    }
    return n;
}
