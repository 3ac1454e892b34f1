/* session_move.c: a worker session to its image and back (persist.h) - what
 * SESSION_EXPORT, SESSION_IMPORT and the restart's state directory carry. */
#include "server/session_move.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "djinn/alloc.h"
#include "djinn/status.h"

typedef struct {
    dj_engine_t *e;
    dj_session_t *es;
} read_ctx;

static dj_status read_page(void *ctx, uint32_t i, void *buf) {
    read_ctx *r = ctx;
    return dj_session_kv_read(r->e, r->es, i, buf);
}

dj_status dj__session_image(dj_engine_t *e, const dj__sess *ss, uint64_t secret, uint8_t **out, size_t *n) {
    *out = NULL;
    *n = 0;
    if (ss->busy) return dj_fail(DJ_EBUSY, "session %016llx is generating", (unsigned long long)ss->id);
    if (ss->xfer) return dj_fail(DJ_EBUSY, "session %016llx has a swap in flight", (unsigned long long)ss->id);
    const dj_model_t *m = dj_session_model(ss->es);
    dj__simg img = {.version = DJ__SIMG_VERSION, .fingerprint = dj_model_fingerprint(m), .id = ss->id,
                    .secret = secret, .tenant = ss->tenant, .qos = ss->qos, .max_ctx = dj_session_max_ctx(ss->es),
                    .pending = ss->pending, .paused = ss->paused};
    snprintf(img.model, sizeof img.model, "%s", ss->model);
    dj_session_kv_layout(ss->es, &img.kv);
    dj_session_cache_salt(ss->es, img.salt);
    const uint32_t pos = ss->dropped ? ss->n_hist : dj_session_pos(ss->es);
    const bool whole_hist = ss->n_hist == pos;
    if (ss->dropped || dj_session_residency(ss->es) != DJ_KV_RESIDENT) {
        /* its KV is not in the data segment: the history carries it (re-fed on import) */
        if (!whole_hist)
            return dj_fail(DJ_EBUSY, "session %016llx is swapped out and its history is not kept (djinnd keeps it "
                           "with --state-dir or --swap-policy recompute): resume it, then export",
                           (unsigned long long)ss->id);
        img.kv.n_blocks = 0;
    }
    img.kv.pos = pos;
    img.n_hist = whole_hist ? ss->n_hist : 0;
    img.hist = ss->hist;
    const size_t size = dj__simg_size(img.n_hist, (uint64_t)img.kv.n_layers * img.kv.n_blocks, img.kv.page_bytes);
    uint8_t *buf = size ? dj_malloc(size) : NULL;
    if (!buf) return dj_fail(DJ_ENOMEM, "out of memory for a session image of %zu bytes", size);
    read_ctx rc = {e, ss->es};
    const dj_status st = dj__simg_encode(&img, read_page, &rc, buf, size);
    if (st != DJ_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *n = size;
    return DJ_OK;
}

static dj_status image_page(void *ctx, uint32_t i, void *buf) { return dj__simg_page(ctx, i, buf); }

dj_status dj__session_check_image(const dj__simg *img, const dj_model_t *m, const char *served_as) {
    const uint64_t fp = dj_model_fingerprint(m);
    if (img->fingerprint != fp)
        return dj_fail(DJ_EINVAL, "the session was saved by model %s with fingerprint %016llx; %s here has "
                       "fingerprint %016llx (another checkpoint): refused", img->model,
                       (unsigned long long)img->fingerprint, served_as, (unsigned long long)fp);
    return DJ_OK;
}

dj_status dj__session_load_image(dj_engine_t *e, dj__sess *ss, const dj__simg *img) {
    if (img->n_hist) {
        int32_t *h = dj_malloc((size_t)img->n_hist * sizeof *h);
        if (!h) return dj_fail(DJ_ENOMEM, "out of memory for the session's history");
        for (uint32_t i = 0; i < img->n_hist; i++) h[i] = dj__simg_hist(img, i);
        free(ss->hist);
        ss->hist = h;
        ss->n_hist = ss->cap_hist = img->n_hist;
    }
    const uint32_t vocab = dj_model_get_config(dj_session_model(ss->es))->vocab_size;
    for (uint32_t i = 0; i < img->n_hist; i++)
        if (ss->hist[i] < 0 || (uint32_t)ss->hist[i] >= vocab)
            return dj_fail(DJ_EINVAL, "the session's history holds token %d, outside the vocabulary of %u",
                           ss->hist[i], vocab);
    if (img->pending >= 0 && (uint32_t)img->pending >= vocab)
        return dj_fail(DJ_EINVAL, "the session's pending token %d is outside the vocabulary of %u", img->pending,
                       vocab);
    ss->pending = img->pending;
    if (img->kv.n_blocks) return dj_session_kv_load(e, ss->es, &img->kv, image_page, (void *)img);
    ss->dropped = img->kv.pos > 0; /* the history is fed again before its next request */
    return DJ_OK;
}

/* ---- the state directory: sessions kept across a restart ---- */

dj_status dj__persist_dir(const char *state_dir, char *out, size_t cap) {
    if ((size_t)snprintf(out, cap, "%s/sessions", state_dir) >= cap)
        return dj_fail(DJ_EINVAL, "--state-dir %s: path too long", state_dir);
    if (mkdir(out, 0700) != 0 && errno != EEXIST)
        return dj_fail(DJ_EIO, "%s: %s", out, strerror(errno));
    return DJ_OK;
}

dj_status dj__persist_save(dj_engine_t *e, const dj__sess *ss, const char *dir) {
    uint8_t *buf = NULL;
    size_t n = 0;
    dj_status st = dj__session_image(e, ss, ss->secret, &buf, &n);
    if (st != DJ_OK) return st;
    char name[64];
    snprintf(name, sizeof name, "%016llx.djs", (unsigned long long)ss->id);
    st = dj__simg_write_file(dir, name, buf, n);
    free(buf);
    return st;
}

dj_status dj__persist_job(const char *dir, const char *name, dj__job **out) {
    *out = NULL;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return dj_fail(DJ_EINVAL, "%s/%s: path too long", dir, name);
    uint8_t *buf = NULL;
    size_t n = 0;
    dj_status st = dj__simg_read_file(path, DJ_PROTO_MAX_REQ_PAYLOAD, &buf, &n);
    if (st != DJ_OK) return st;
    dj__job *j = dj_calloc(1, sizeof *j);
    if (!j) {
        free(buf);
        return dj_fail(DJ_ENOMEM, "out of memory");
    }
    j->type = j->r.type = DJ_MSG_SESSION_IMPORT;
    j->r.body = buf;
    j->r.u.import.payload = buf;
    j->r.u.import.payload_len = n;
    if ((st = dj__simg_decode(buf, n, &j->r.u.import.img)) != DJ_OK) {
        dj__job_free(j);
        return st;
    }
    j->tenant = j->r.u.import.img.tenant;
    j->qos = j->r.u.import.img.qos;
    *out = j;
    return DJ_OK;
}
