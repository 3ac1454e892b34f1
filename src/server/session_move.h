/* session_move.h: a worker session (dj__sess) to its image and back - typed
 * calls for SESSION_EXPORT, SESSION_IMPORT and restarts (persist.h has the format). */
#ifndef DJ_SERVER_SESSION_MOVE_H
#define DJ_SERVER_SESSION_MOVE_H

#include "server/persist.h"
#include "server/server_impl.h"

/* ss's image into a malloc'd buffer: its KV pages when they are resident
 * (read out of the data segment), else its history alone (DJ_EBUSY when it
 * is not kept), its pending token, QoS, tenant, salt and `secret`. DJ_EBUSY
 * while it generates or a swap is in flight. Worker thread. */
dj_status dj__session_image(dj_engine_t *e, const dj__sess *ss, uint64_t secret, uint8_t **out /* OUT */,
                            size_t *n /* OUT */);
/* DJ_EINVAL naming both fingerprints when img was saved by another
 * checkpoint than m (served here as `served_as`). */
dj_status dj__session_check_image(const dj__simg *img, const dj_model_t *m, const char *served_as);
/* Loads img into ss, whose engine session is fresh (dj_session_new of img's
 * model and max_ctx): its KV pages (each checked: DJ_EIO naming a damaged
 * one), or its history to feed again; its history and pending token. On
 * error the caller closes ss. */
dj_status dj__session_load_image(dj_engine_t *e, dj__sess *ss, const dj__simg *img);

/* The state directory's sessions folder, STATE/sessions (made if absent), into out[cap]. */
dj_status dj__persist_dir(const char *state_dir, char *out /* OUT */, size_t cap);
/* ss's image (with its reattach secret) to DIR/<id as 16 hex digits>.djs:
 * a temporary name, fsync, rename. */
dj_status dj__persist_save(dj_engine_t *e, const dj__sess *ss, const char *dir);
/* DIR/NAME read and decoded as the SESSION_IMPORT job that restores it
 * (conn 0; its tenant and QoS the image's); *out owned by the caller. */
dj_status dj__persist_job(const char *dir, const char *name, dj__job **out /* OUT */);

#endif
