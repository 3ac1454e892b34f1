/* checkpoint.c: a Hugging Face model directory - config.json plus one
 * safetensors file or an index and its shards, mmapped read-only - and its
 * content fingerprint. */
#define _DEFAULT_SOURCE /* madvise(MADV_HUGEPAGE) */
#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/file.h"
#include "djinn/checkpoint.h"
#include "model/checkpoint_impl.h"
#include "model/checkpoint_table.h"
#include "model/file_pages.h"

/* Same bound as the reference safetensors reader. */
#define CK_MAX_HEADER_LEN 100000000ull
#define CK_MAX_CONFIG_LEN (16u << 20)
#define CK_MAX_INDEX_LEN (256u << 20)

/* Re-records the thread's error detail with `who: ` in front. */
static dj_status prefix_error(dj_status st, const char *who) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dj_last_error());
    return dj_fail(st, "%s: %s", who, msg);
}

static char *join_path(const char *dir, const char *file) {
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, file);
    return p;
}

/* Reads a whole small file (at most max bytes) into a malloc'd buffer. */
static dj_status read_file(const char *path, size_t max, char **out /* OUT */, size_t *len /* OUT */) {
    *out = NULL;
    *len = 0;
    int fd;
    struct stat sb;
    dj_status st = dj__file_open(path, &fd, &sb); /* never blocks on a FIFO; regular files only */
    if (st != DJ_OK) return st;
    char *buf = NULL;
    if ((uint64_t)sb.st_size > max) {
        st = dj_fail(DJ_ERANGE, "%s: %lld bytes exceeds the limit of %zu", path, (long long)sb.st_size, max);
        goto fail;
    }
    size_t n = (size_t)sb.st_size;
    if (!(buf = malloc(n ? n : 1))) {
        st = dj_fail(DJ_ENOMEM, "%s: no memory for %zu bytes", path, n);
        goto fail;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            st = dj_fail(DJ_EIO, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "file shrank");
            goto fail;
        }
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = n;
    return DJ_OK;
fail:
    free(buf);
    close(fd);
    return st;
}

static bool pread_all(int fd, void *buf, size_t n, off_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        got += (size_t)r;
    }
    return true;
}

/* Maps dir/sh->file and validates its header. On success *infos holds its
 * tensors (sorted by name) with data pointing into the mapping. */
static dj_status open_shard(const char *dir, ck_shard *sh, bool headers_only, dj_tensor_info **infos /* OUT */,
                            size_t *n /* OUT */) {
    *infos = NULL;
    *n = 0;
    char *path = join_path(dir, sh->file);
    if (!path) return dj_fail(DJ_ENOMEM, "no memory for a path");
    dj_status st = DJ_OK;
    int fd;
    struct stat sb;
    if ((st = dj__file_open(path, &fd, &sb)) != DJ_OK) goto done; /* regular files only, never blocks */
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        st = dj_fail(DJ_EFORMAT, "%s: file is %llu bytes, too short for a safetensors header length", path,
                     (unsigned long long)size);
        goto done;
    }
    unsigned char lenbuf[8];
    if (!pread_all(fd, lenbuf, 8, 0)) {
        st = dj_fail(DJ_EIO, "%s: cannot read the header length", path);
        goto done;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenbuf[i];
    if (hlen > CK_MAX_HEADER_LEN) {
        st = dj_fail(DJ_EFORMAT, "%s: header length %llu exceeds the limit of %llu", path,
                     (unsigned long long)hlen, CK_MAX_HEADER_LEN);
        goto done;
    }
    if (hlen > size - 8) {
        st = dj_fail(DJ_EFORMAT, "%s: header length %llu exceeds file size %llu", path,
                     (unsigned long long)hlen, (unsigned long long)size);
        goto done;
    }
    if (size > SIZE_MAX) {
        st = dj_fail(DJ_ERANGE, "%s: file too large to map", path);
        goto done;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        st = dj_fail(DJ_EIO, "%s: mmap failed: %s", path, strerror(errno));
        goto done;
    }
#ifdef MADV_HUGEPAGE
    /* Pages read in through this mapping come as 2 MiB folios where the file system can. */
    madvise(map, (size_t)size, MADV_HUGEPAGE);
#endif
    sh->map = map;
    sh->size = (size_t)size;
    sh->fd = fd;
    fd = -1;
    sh->dev = (uint64_t)sb.st_dev;
    sh->ino = (uint64_t)sb.st_ino;
    sh->mtime_ns = (uint64_t)sb.st_mtim.tv_sec * 1000000000u + (uint64_t)sb.st_mtim.tv_nsec;
    const char *header = (const char *)map + 8;
    const char *data = header + hlen;
    /* headers only: tensors may lie past the end of a file cut short (their
     * bytes are never read: dj_checkpoint_read refuses) */
    st = dj_safetensors_parse_header(header, (size_t)hlen, headers_only ? SIZE_MAX : (size_t)(size - 8 - hlen), infos, n);
    if (st) {
        st = prefix_error(st, path);
        goto done;
    }
    for (size_t i = 0; i < *n; i++) (*infos)[i].data = data + (uintptr_t)(*infos)[i].data;
done:
    if (fd >= 0) close(fd);
    free(path);
    return st;
}

static int cmp_info_key(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const dj_tensor_info *)elem)->name);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name from an index must stay inside the directory. */
static bool shard_name_ok(const char *s) {
    return s[0] != '\0' && !strchr(s, '/') && !strstr(s, "..");
}

/* Reads the index: the distinct shard files (sorted) go to ck->shards. The
 * parsed index is returned for the tensor check after the shards are read. */
static dj_status read_index(const char *path, dj_checkpoint_t *ck, cJSON **index /* OUT */) {
    *index = NULL;
    char *text = NULL;
    size_t len;
    const char **names = NULL;
    dj_status st = read_file(path, CK_MAX_INDEX_LEN, &text, &len);
    if (st) return st;
    size_t err_pos;
    cJSON *root = dj__json_parse(text, len, &err_pos);
    free(text);
    if (!root) return dj_fail(DJ_EFORMAT, "%s: not valid JSON (error at byte %zu)", path, err_pos);
    const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        st = dj_fail(DJ_EFORMAT, "%s: expected an object with a \"weight_map\" object", path);
        goto fail;
    }
    const char *dup;
    if ((st = dj__json_find_duplicate_key(wm, &dup))) goto fail;
    if (dup) {
        st = dj_fail(DJ_EFORMAT, "%s: weight_map lists tensor \"%.200s\" twice", path, dup);
        goto fail;
    }
    size_t n = 0;
    for (const cJSON *c = wm->child; c; c = c->next) {
        if (!cJSON_IsString(c)) {
            st = dj_fail(DJ_EFORMAT, "%s: weight_map entry \"%.200s\" is a JSON %s, expected a file name", path,
                         c->string, dj__json_type_name(c));
            goto fail;
        }
        if (!shard_name_ok(c->valuestring)) {
            st = dj_fail(DJ_EFORMAT, "%s: weight_map entry \"%.200s\" names shard \"%.200s\" outside the directory",
                         path, c->string, c->valuestring);
            goto fail;
        }
        n++;
    }
    if (!(names = malloc((n ? n : 1) * sizeof *names))) {
        st = dj_fail(DJ_ENOMEM, "no memory for %zu shard names", n);
        goto fail;
    }
    size_t i = 0;
    for (const cJSON *c = wm->child; c; c = c->next) names[i++] = c->valuestring;
    qsort(names, n, sizeof *names, cmp_str_ptr);
    size_t distinct = 0;
    for (i = 0; i < n; i++)
        if (i == 0 || strcmp(names[i], names[i - 1])) names[distinct++] = names[i];
    if (!(ck->shards = calloc(distinct ? distinct : 1, sizeof *ck->shards))) {
        st = dj_fail(DJ_ENOMEM, "no memory for %zu shards", distinct);
        goto fail;
    }
    for (i = 0; i < distinct; i++) {
        if (!(ck->shards[i].file = strdup(names[i]))) {
            st = dj_fail(DJ_ENOMEM, "no memory for a shard name");
            goto fail;
        }
        ck->n_shards++;
    }
    free(names);
    *index = root;
    return DJ_OK;
fail:
    free(names);
    cJSON_Delete(root);
    return st;
}

static size_t find_shard(const dj_checkpoint_t *ck, const char *file) {
    size_t lo = 0, hi = ck->n_shards;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(file, ck->shards[mid].file);
        if (c == 0) return mid;
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return SIZE_MAX;
}

/* Opens every shard in ck->shards; the tensors of all of them go to
 * ck->tensors. If index is given, each of its entries must be in its shard. */
static dj_status load_shards(const char *dir, dj_checkpoint_t *ck, const cJSON *index) {
    dj_tensor_info **per = calloc(ck->n_shards ? ck->n_shards : 1, sizeof *per);
    size_t *per_n = calloc(ck->n_shards ? ck->n_shards : 1, sizeof *per_n);
    dj_status st = DJ_OK;
    if (!per || !per_n) {
        st = dj_fail(DJ_ENOMEM, "no memory for %zu shards", ck->n_shards);
        goto done;
    }
    size_t total = 0;
    for (size_t s = 0; s < ck->n_shards; s++) {
        if ((st = open_shard(dir, &ck->shards[s], ck->headers_only, &per[s], &per_n[s]))) goto done;
        total += per_n[s];
    }
    if (index) {
        const cJSON *wm = cJSON_GetObjectItemCaseSensitive(index, "weight_map");
        for (const cJSON *c = wm->child; c; c = c->next) {
            size_t s = find_shard(ck, c->valuestring);
            if (s == SIZE_MAX || !bsearch(c->string, per[s], per_n[s], sizeof *per[s], cmp_info_key)) {
                st = dj_fail(DJ_EFORMAT, "%s/model.safetensors.index.json: tensor \"%.200s\" is not in shard %s",
                             dir, c->string, c->valuestring);
                goto done;
            }
        }
    }
    if (!(ck->tensors = calloc(total ? total : 1, sizeof *ck->tensors))) {
        st = dj_fail(DJ_ENOMEM, "no memory for %zu tensors", total);
        goto done;
    }
    /* Names move from the per-shard arrays into ck->tensors. */
    for (size_t s = 0; s < ck->n_shards; s++) {
        for (size_t i = 0; i < per_n[s]; i++) {
            ck->tensors[ck->n_tensors].info = per[s][i];
            ck->tensors[ck->n_tensors].shard = s;
            ck->n_tensors++;
        }
        free(per[s]);
        per[s] = NULL;
        per_n[s] = 0;
    }
    dj__checkpoint_sort(ck);
    for (size_t i = 1; i < ck->n_tensors; i++) {
        const ck_tensor *a = &ck->tensors[i - 1], *b = &ck->tensors[i];
        if (!strcmp(a->info.name, b->info.name)) {
            st = dj_fail(DJ_EFORMAT, "%s: tensor \"%.200s\" is in both %s and %s", dir, a->info.name,
                         ck->shards[a->shard].file, ck->shards[b->shard].file);
            goto done;
        }
    }
done:
    if (per && per_n)
        for (size_t s = 0; s < ck->n_shards; s++) dj_safetensors_free_infos(per[s], per_n[s]);
    free(per);
    free(per_n);
    return st;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static dj_status open_dir(const char *dir, bool headers_only, dj_checkpoint_t **out);

dj_status dj_checkpoint_open(const char *dir, dj_checkpoint_t **out) { return open_dir(dir, false, out); }

dj_status dj_checkpoint_open_headers(const char *dir, dj_checkpoint_t **out) { return open_dir(dir, true, out); }

static dj_status open_dir(const char *dir, bool headers_only, dj_checkpoint_t **out) {
    if (!out) return dj_fail(DJ_EINVAL, "checkpoint: NULL output");
    *out = NULL;
    if (!dir) return dj_fail(DJ_EINVAL, "checkpoint: NULL directory");
    dj_status st = DJ_OK;
    char *path = NULL, *text = NULL;
    cJSON *index = NULL;
    dj_checkpoint_t *ck = calloc(1, sizeof *ck);
    if (ck) ck->refs = 1;
    if (!ck) return dj_fail(DJ_ENOMEM, "no memory for a checkpoint");
    if (!(ck->hash = XXH3_createState())) {
        st = dj_fail(DJ_ENOMEM, "no memory for a hash state");
        goto fail;
    }

    size_t len;
    if (!(path = join_path(dir, "config.json"))) goto nomem;
    if ((st = read_file(path, CK_MAX_CONFIG_LEN, &text, &len))) goto fail;
    if ((st = dj_model_config_parse(text, len, &ck->cfg))) {
        st = prefix_error(st, dir);
        goto fail;
    }
    free(path);
    path = NULL;
    /* 4-bit AWQ/GPTQ weights are repacked at open (quant4.c), which reads
     * them: those checkpoints open whole even for their headers */
    ck->headers_only = headers_only && ck->cfg.quant != DJ_QUANT_AWQ && ck->cfg.quant != DJ_QUANT_GPTQ;

    /* As transformers: a single model.safetensors wins over an index. */
    if (!(path = join_path(dir, "model.safetensors"))) goto nomem;
    if (file_exists(path)) {
        if (!(ck->shards = calloc(1, sizeof *ck->shards))) goto nomem;
        if (!(ck->shards[0].file = strdup("model.safetensors"))) goto nomem;
        ck->n_shards = 1;
    } else {
        free(path);
        if (!(path = join_path(dir, "model.safetensors.index.json"))) goto nomem;
        if (!file_exists(path)) {
            st = dj_fail(DJ_ENOTFOUND, "%s: neither model.safetensors nor model.safetensors.index.json exists",
                         dir);
            goto fail;
        }
        if ((st = read_index(path, ck, &index))) goto fail;
    }
    if ((st = load_shards(dir, ck, index))) goto fail;
    if ((st = dj__quant_open(dir, text, len, ck))) goto fail;

    cJSON_Delete(index);
    free(path);
    free(text);
    *out = ck;
    return DJ_OK;

nomem:
    st = dj_fail(DJ_ENOMEM, "no memory while opening %s", dir);
fail:
    cJSON_Delete(index);
    free(path);
    free(text);
    dj_checkpoint_close(ck);
    return st;
}

dj_checkpoint_t *dj_checkpoint_retain(dj_checkpoint_t *ck) {
    if (ck) __atomic_add_fetch(&ck->refs, 1, __ATOMIC_RELAXED);
    return ck;
}

void dj_checkpoint_close(dj_checkpoint_t *ck) {
    if (!ck || __atomic_sub_fetch(&ck->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    for (size_t i = 0; i < ck->n_tensors; i++) {
        free((char *)ck->tensors[i].info.name);
        if (ck->tensors[i].shard == CK_OWNED) free((void *)ck->tensors[i].info.data);
    }
    free(ck->tensors);
    for (size_t s = 0; s < ck->n_shards; s++) {
        if (ck->shards[s].map) {
            munmap(ck->shards[s].map, ck->shards[s].size);
            close(ck->shards[s].fd);
        }
        free(ck->shards[s].file);
    }
    free(ck->shards);
    XXH3_freeState(ck->hash);
    free(ck);
}

/* Fixed-width little-endian encoding, so the fingerprint does not depend on
 * the host's integer layout. */
static void hash_u64(XXH3_state_t *h, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    XXH3_64bits_update(h, b, sizeof b);
}

static void hash_f32(XXH3_state_t *h, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    hash_u64(h, u);
}

/* The config fields that shape the computation (fingerprint and identity). */
static void hash_config(XXH3_state_t *h, const dj_model_config *c) {
    hash_u64(h, (uint64_t)c->arch);
    hash_u64(h, c->vocab_size);
    hash_u64(h, c->hidden_size);
    hash_u64(h, c->intermediate_size);
    hash_u64(h, c->n_layers);
    hash_u64(h, c->n_heads);
    hash_u64(h, c->n_kv_heads);
    hash_u64(h, c->head_dim);
    hash_u64(h, c->max_position_embeddings);
    hash_f32(h, c->rms_norm_eps);
    hash_f32(h, c->rope_theta);
    hash_u64(h, (uint64_t)c->rope_type);
    hash_f32(h, c->rope_factor);
    hash_f32(h, c->rope_low_freq_factor);
    hash_f32(h, c->rope_high_freq_factor);
    hash_u64(h, c->rope_original_max_pos);
    hash_u64(h, c->tie_word_embeddings);
    hash_u64(h, c->attention_bias);
    hash_u64(h, c->mlp_bias);
    hash_u64(h, c->sliding_window);
    hash_u64(h, c->sliding_window_first_layer);
    /* the variants beyond Llama (all zero or one for the Llama family) */
    hash_u64(h, c->sliding_by_layer);
    XXH3_64bits_update(h, c->layer_sliding, sizeof c->layer_sliding);
    hash_u64(h, (uint64_t)c->hidden_act);
    hash_f32(h, c->norm_offset);
    hash_u64(h, c->qk_norm);
    hash_u64(h, c->sandwich_norm);
    hash_f32(h, c->embed_scale);
    hash_f32(h, c->attn_scale);
    hash_f32(h, c->attn_softcap);
    hash_f32(h, c->final_softcap);
    hash_u64(h, c->rope_dim);
    hash_f32(h, c->rope_attn_factor);
    hash_f32(h, c->rope_local_theta);
    for (uint32_t i = 0; i < c->rope_dim / 2 && i < DJ_ROPE_MAX_FACTORS; i++) hash_f32(h, c->rope_ext_factor[i]);
    if (c->rope_type == DJ_ROPE_LONGROPE) /* (only there: the other models' fingerprints stay as they were) */
        for (uint32_t i = 0; i < c->rope_dim / 2 && i < DJ_ROPE_MAX_FACTORS; i++) hash_f32(h, c->rope_long_factor[i]);
    hash_u64(h, c->n_experts);
    hash_u64(h, c->n_experts_used);
}

static void hash_tensor_meta(XXH3_state_t *h, const dj_tensor_info *t) {
    const size_t nl = strlen(t->name);
    hash_u64(h, nl);
    XXH3_64bits_update(h, t->name, nl);
    hash_u64(h, (uint64_t)t->dtype);
    hash_u64(h, (uint64_t)t->ndim);
    for (int d = 0; d < t->ndim; d++) hash_u64(h, (uint64_t)t->shape[d]);
    hash_u64(h, t->nbytes);
}

/* ---- fingerprints remembered by file identity (process-wide) ---- */

#define ID_CACHE_CAP 256

static struct {
    pthread_mutex_t mu;
    struct { uint64_t id, fp; } e[ID_CACHE_CAP];
    size_t n, next;      /* entries used; the slot the next insert overwrites once full */
    uint64_t hash_passes; /* passes over every weight byte, for tests */
} idc = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Identity of the files behind ck: the config's fields, then each shard's
 * name, device, inode, size and mtime (ns). Any rewrite of a shard that
 * changes its size or mtime changes it. */
static uint64_t identity(const dj_checkpoint_t *ck) {
    XXH3_state_t *h = ck->hash;
    XXH3_64bits_reset(h);
    hash_config(h, &ck->cfg);
    hash_u64(h, ck->n_shards);
    for (size_t i = 0; i < ck->n_shards; i++) {
        const ck_shard *sh = &ck->shards[i];
        const size_t nl = strlen(sh->file);
        hash_u64(h, nl);
        XXH3_64bits_update(h, sh->file, nl);
        hash_u64(h, sh->dev);
        hash_u64(h, sh->ino);
        hash_u64(h, sh->size);
        hash_u64(h, sh->mtime_ns);
    }
    return XXH3_64bits_digest(h);
}

static bool idc_get(uint64_t id, uint64_t *fp) {
    bool hit = false;
    pthread_mutex_lock(&idc.mu);
    for (size_t i = 0; i < idc.n && !hit; i++)
        if (idc.e[i].id == id) {
            *fp = idc.e[i].fp;
            hit = true;
        }
    pthread_mutex_unlock(&idc.mu);
    return hit;
}

static void idc_put(uint64_t id, uint64_t fp) {
    pthread_mutex_lock(&idc.mu);
    size_t i = 0;
    while (i < idc.n && idc.e[i].id != id) i++;
    if (i == idc.n) {
        if (idc.n < ID_CACHE_CAP) {
            i = idc.n++;
        } else {
            i = idc.next;
            idc.next = (idc.next + 1) % ID_CACHE_CAP;
        }
    }
    idc.e[i].id = id;
    idc.e[i].fp = fp;
    pthread_mutex_unlock(&idc.mu);
}

static void count_pass(void) {
    pthread_mutex_lock(&idc.mu);
    idc.hash_passes++;
    pthread_mutex_unlock(&idc.mu);
}

size_t dj_checkpoint_huge_pages(dj_checkpoint_t *ck) {
    size_t pmd = 0;
    for (size_t s = 0; s < ck->n_shards; s++)
        if (ck->shards[s].map) pmd += dj__file_pages_huge(ck->shards[s].fd, ck->shards[s].map, ck->shards[s].size);
    ck->huge_done = true;
    return pmd;
}

bool dj_checkpoint_huge_pages_done(const dj_checkpoint_t *ck) { return ck->huge_done; }

uint64_t dj_checkpoint_hash_passes(void) {
    pthread_mutex_lock(&idc.mu);
    const uint64_t n = idc.hash_passes;
    pthread_mutex_unlock(&idc.mu);
    return n;
}

bool dj_checkpoint_fingerprint_known(dj_checkpoint_t *ck, uint64_t *fp) {
    if (!ck) return false;
    if (!ck->have_fingerprint && idc_get(identity(ck), &ck->fingerprint)) ck->have_fingerprint = true;
    if (ck->have_fingerprint && fp) *fp = ck->fingerprint;
    return ck->have_fingerprint;
}

void dj_checkpoint_set_progress(dj_checkpoint_t *ck, dj_checkpoint_progress_fn fn, void *user) {
    if (!ck) return;
    ck->progress = fn;
    ck->progress_user = user;
}

uint64_t dj_checkpoint_data_bytes(const dj_checkpoint_t *ck) {
    uint64_t n = 0;
    for (size_t i = 0; ck && i < ck->n_tensors; i++) n += ck->tensors[i].info.nbytes;
    return n;
}

void dj_checkpoint_note_progress(dj_checkpoint_t *ck, size_t n) {
    if (!ck || !ck->progress) return;
    const uint64_t total = dj_checkpoint_data_bytes(ck);
    uint64_t done = __atomic_add_fetch(&ck->progress_done, (uint64_t)n, __ATOMIC_RELAXED);
    ck->progress(ck->progress_user, done < total ? done : total, total);
}

/* The fingerprint hashes each tensor's bytes in pieces of this many (one
 * XXH3 each), then the pieces' hashes in order with the metadata, so that
 * threads can take the pieces. */
#define PIECE_BYTES ((size_t)64 << 20)
#define READ_THREADS_MAX 8

typedef struct read_piece {
    size_t tensor, off, n;
    uint64_t hash;
} read_piece;

dj_status dj_checkpoint_read(dj_checkpoint_t *ck, size_t chunk, dj_checkpoint_visit_fn visit, void *user) {
    if (!ck || !visit) return dj_fail(DJ_EINVAL, "checkpoint read: NULL checkpoint or visitor");
    if (ck->headers_only) return dj_fail(DJ_EINVAL, "checkpoint read: opened for its headers only (dj_checkpoint_open_headers)");
    if (chunk == 0) chunk = (size_t)4 << 20;
    size_t n_pieces = 0;
    for (size_t i = 0; i < ck->n_tensors; i++)
        n_pieces += (ck->tensors[i].info.nbytes + PIECE_BYTES - 1) / PIECE_BYTES;
    read_piece *pc = calloc(n_pieces ? n_pieces : 1, sizeof *pc);
    if (!pc) return dj_fail(DJ_ENOMEM, "checkpoint read: %zu pieces", n_pieces);
    for (size_t i = 0, k = 0; i < ck->n_tensors; i++)
        for (size_t off = 0; off < ck->tensors[i].info.nbytes; off += PIECE_BYTES, k++) {
            const size_t left = ck->tensors[i].info.nbytes - off;
            pc[k] = (read_piece){.tensor = i, .off = off, .n = left < PIECE_BYTES ? left : PIECE_BYTES};
        }
    count_pass();
    /* Pieces go to threads; a visitor's first error stops the rest and is
     * raised again on this thread (error detail is per thread). */
    dj_status first = DJ_OK;
    char why[256] = "";
    int threads = omp_get_max_threads();
    threads = threads < 1 ? 1 : threads > READ_THREADS_MAX ? READ_THREADS_MAX : threads;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (size_t k = 0; k < n_pieces; k++) {
        dj_status seen;
#pragma omp atomic read
        seen = first;
        if (seen != DJ_OK) continue;
        const dj_tensor_info *t = &ck->tensors[pc[k].tensor].info;
        XXH3_state_t *h = XXH3_createState();
        dj_status st = h ? DJ_OK : dj_fail(DJ_ENOMEM, "checkpoint read: no hash state");
        if (h) XXH3_64bits_reset(h);
        for (size_t o = 0; st == DJ_OK && o < pc[k].n; o += chunk) {
            const size_t n = pc[k].n - o < chunk ? pc[k].n - o : chunk;
            const uint8_t *p = (const uint8_t *)t->data + pc[k].off + o;
            XXH3_64bits_update(h, p, n); /* the bytes are in cache when the visitor copies them */
            st = visit(user, pc[k].tensor, pc[k].off + o, p, n);
            if (st == DJ_OK) dj_checkpoint_note_progress(ck, n);
        }
        if (h) pc[k].hash = XXH3_64bits_digest(h);
        XXH3_freeState(h);
        if (st != DJ_OK) {
#pragma omp critical(dj_checkpoint_read_error)
            if (first == DJ_OK) {
                snprintf(why, sizeof why, "%s", dj_last_error());
#pragma omp atomic write
                first = st;
            }
        }
    }
    if (first != DJ_OK) {
        free(pc);
        return dj_fail(first, "%s", why);
    }
    XXH3_state_t *h = ck->hash;
    XXH3_64bits_reset(h);
    hash_config(h, &ck->cfg);
    hash_u64(h, ck->n_tensors);
    for (size_t i = 0, k = 0; i < ck->n_tensors; i++) {
        hash_tensor_meta(h, &ck->tensors[i].info);
        for (; k < n_pieces && pc[k].tensor == i; k++) hash_u64(h, pc[k].hash);
    }
    free(pc);
    ck->fingerprint = XXH3_64bits_digest(h);
    ck->have_fingerprint = true;
    idc_put(identity(ck), ck->fingerprint);
    return DJ_OK;
}

static dj_status skip_bytes(void *user, size_t tensor, size_t off, const void *bytes, size_t n) {
    (void)user, (void)tensor, (void)off, (void)bytes, (void)n;
    return DJ_OK;
}

uint64_t dj_checkpoint_fingerprint(dj_checkpoint_t *ck) {
    if (!ck) return 0;
    uint64_t fp = 0;
    if (dj_checkpoint_fingerprint_known(ck, &fp)) return fp;
    (void)dj_checkpoint_read(ck, SIZE_MAX, skip_bytes, NULL); /* a visitor that cannot fail */
    return ck->fingerprint;
}
