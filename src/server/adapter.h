/* adapter.h: LoRA adapters as the daemon's requests name them - a folder of
 * the model store chosen by a GENERATE's `adapter`, and HTTP's "base:adapter". */
#ifndef DJ_SERVER_ADAPTER_H
#define DJ_SERVER_ADAPTER_H

#include <stdbool.h>
#include <stddef.h>

#include "djinn/engine.h"
#include "djinn/status.h"

/* The adapter named `name` ("" or NULL: none asked, the session keeps its
 * own) for session es: the folder <models_dir>/<name> holding
 * adapter_config.json and adapter_model.safetensors, of es's model. Taken
 * when es holds nothing yet (fresh); a session that holds tokens keeps the
 * adapter its KV was made with: naming another is DJ_EINVAL. A name that is
 * not a plain folder name is DJ_EINVAL, a folder without an adapter
 * DJ_ENOTFOUND; the loader's refusals name the field or tensor. Worker only. */
dj_status dj__adapter_use(dj_engine_t *e, const char *models_dir, dj_session_t *es, const char *name, bool fresh);

/* Splits an HTTP "model" of the form "base:adapter" into base[base_n] and
 * adapter[adapter_n] (adapter "" when there is no ':'). DJ_EINVAL for an
 * empty part, a second ':' or a part that does not fit. */
dj_status dj__adapter_split(const char *model, char *base, size_t base_n, char *adapter, size_t adapter_n);

#endif
