/* checkpoint_table.h: an open checkpoint's structure - its shards and its
 * tensor table sorted by name - for the opener and the 4-bit repacking. */
#ifndef DJ_MODEL_CHECKPOINT_TABLE_H
#define DJ_MODEL_CHECKPOINT_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/checkpoint.h"

typedef struct {
    char *file;  /* name inside the directory, owned */
    void *map;   /* the whole file, PROT_READ; NULL until mapped */
    size_t size; /* bytes mapped */
    int fd;      /* the file, open while mapped (dj_checkpoint_huge_pages drops its cached pages) */
    uint64_t dev, ino, mtime_ns; /* the file's identity when mapped (fstat) */
} ck_shard;

typedef struct {
    dj_tensor_info info; /* name owned; data inside shards[shard].map, or owned (malloc'd) when
                          * shard == CK_OWNED: a tensor made at open (repacked 4-bit weights) */
    size_t shard;
} ck_tensor;
#define CK_OWNED SIZE_MAX

struct dj_checkpoint {
    dj_model_config cfg;
    ck_shard *shards; /* [n_shards] */
    size_t n_shards;
    ck_tensor *tensors; /* [n_tensors], sorted by name */
    size_t n_tensors;
    struct XXH3_state_s *hash; /* XXH3_state_t */
    bool have_fingerprint;
    bool huge_done; /* dj_checkpoint_huge_pages ran */
    bool headers_only; /* dj_checkpoint_open_headers: no weight byte may be read */
    uint64_t fingerprint;
    unsigned refs; /* the opener's reference plus dj_checkpoint_retain's; unmapped at 0 */
    void (*progress)(void *user, uint64_t done, uint64_t total); /* dj_checkpoint_set_progress */
    void *progress_user;
    uint64_t progress_done; /* atomic: bytes reported so far */
};

/* Sorts ck's tensor table by name. */
void dj__checkpoint_sort(dj_checkpoint_t *ck);

/* Drops every tensor for which drop(name) is true, then adds add[0..n_add)
 * (names and data malloc'd; taken by ck whatever the outcome: freed at close
 * or on failure) and sorts the table again. A name added twice, or added
 * while a stored tensor keeps it, is DJ_EFORMAT. */
dj_status dj__checkpoint_edit(dj_checkpoint_t *ck, dj_tensor_info *add, size_t n_add,
                              bool (*drop)(const char *name));

#endif
