/* checkpoint_table.c: an open checkpoint's tensor table - the accessors,
 * lookup by name, and the edits made at open (4-bit parts repacked). */
#include <stdlib.h>
#include <string.h>

#include "model/checkpoint_table.h"

static int cmp_tensor(const void *a, const void *b) {
    return strcmp(((const ck_tensor *)a)->info.name, ((const ck_tensor *)b)->info.name);
}

void dj__checkpoint_sort(dj_checkpoint_t *ck) {
    qsort(ck->tensors, ck->n_tensors, sizeof *ck->tensors, cmp_tensor);
}

dj_status dj__checkpoint_edit(dj_checkpoint_t *ck, dj_tensor_info *add, size_t n_add,
                              bool (*drop)(const char *name)) {
    ck_tensor *t = realloc(ck->tensors, (ck->n_tensors + n_add + 1) * sizeof *t);
    if (!t) {
        for (size_t i = 0; i < n_add; i++) {
            free((char *)add[i].name);
            free((void *)add[i].data);
        }
        return dj_fail(DJ_ENOMEM, "no memory for %zu tensors", ck->n_tensors + n_add);
    }
    ck->tensors = t;
    size_t n = 0;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        if (drop(t[i].info.name)) {
            free((char *)t[i].info.name);
            if (t[i].shard == CK_OWNED) free((void *)t[i].info.data);
        } else {
            t[n++] = t[i];
        }
    }
    for (size_t i = 0; i < n_add; i++) t[n++] = (ck_tensor){.info = add[i], .shard = CK_OWNED};
    ck->n_tensors = n;
    dj__checkpoint_sort(ck);
    for (size_t i = 1; i < ck->n_tensors; i++)
        if (!strcmp(t[i - 1].info.name, t[i].info.name))
            return dj_fail(DJ_EFORMAT, "tensor \"%.200s\" is stored and also made from 4-bit parts", t[i].info.name);
    return DJ_OK;
}

const dj_model_config *dj_checkpoint_config(const dj_checkpoint_t *ck) { return ck ? &ck->cfg : NULL; }

size_t dj_checkpoint_tensor_count(const dj_checkpoint_t *ck) { return ck ? ck->n_tensors : 0; }

const dj_tensor_info *dj_checkpoint_tensor(const dj_checkpoint_t *ck, size_t i) {
    return ck && i < ck->n_tensors ? &ck->tensors[i].info : NULL;
}

static int cmp_tensor_key(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const ck_tensor *)elem)->info.name);
}

const dj_tensor_info *dj_checkpoint_find(const dj_checkpoint_t *ck, const char *name) {
    if (!ck || !name) return NULL;
    const ck_tensor *t = bsearch(name, ck->tensors, ck->n_tensors, sizeof *ck->tensors, cmp_tensor_key);
    return t ? &t->info : NULL;
}
