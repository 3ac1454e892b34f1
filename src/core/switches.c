/* switches.c: the environment switches' table (switches.h) and the one
 * reader of their $DJINN_* variables, which warns on a value it does not know. */
#include "core/switches.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const dj_switch_desc table[DJ_SW_COUNT] = {
#define DJ_SW_ROW_(id, var, values, dflt, other, doc) [DJ_SW_##id] = {var, values, dflt, other, doc},
    DJ_SWITCH_LIST(DJ_SW_ROW_)
#undef DJ_SW_ROW_
};

const dj_switch_desc *dj_switch_desc_of(dj_switch s) {
    return (unsigned)s < (unsigned)DJ_SW_COUNT ? &table[s] : NULL;
}

/* The index of v among values ("a|b|c"), -1 when it is none of them. */
static int value_index(const char *values, const char *v) {
    const size_t len = strlen(v);
    int i = 0;
    for (const char *p = values;; i++) {
        const char *bar = strchr(p, '|');
        const size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, v, n) == 0) return i;
        if (!bar) return -1;
        p = bar + 1;
    }
}

int dj_switch_read(dj_switch s) {
    const dj_switch_desc *d = dj_switch_desc_of(s);
    if (!d || !d->values) return 0;
    const char *v = getenv(d->var);
    if (!v || !*v) return value_index(d->values, d->dflt);
    const int i = value_index(d->values, v);
    if (i >= 0) return i;
    /* straight to stderr in dj_log's format: the switches sit below the logger,
     * which reads its own level here */
    fprintf(stderr, "djinn warn %s: $%s=%s is not one of %s: taken as %s\n", __func__, d->var, v, d->values,
            d->other);
    return value_index(d->values, d->other);
}

const char *dj_switch_read_str(dj_switch s) {
    const dj_switch_desc *d = dj_switch_desc_of(s);
    if (!d || d->values) return NULL;
    const char *v = getenv(d->var);
    return v && *v ? v : NULL;
}
