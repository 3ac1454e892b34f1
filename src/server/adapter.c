/* adapter.c: LoRA adapters as the daemon's requests name them - loading a
 * store folder for a session (the worker) and splitting "base:adapter". */
#include <stdio.h>
#include <string.h>

#include "djinn/lora.h"
#include "server/adapter.h"

static bool plain_name(const char *n) {
    if (!n[0] || !strcmp(n, ".") || !strcmp(n, "..")) return false;
    for (const char *p = n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
              *p == '_' || *p == '-'))
            return false;
    return true;
}

dj_status dj__adapter_use(dj_engine_t *e, const char *models_dir, dj_session_t *es, const char *name, bool fresh) {
    if (!name || !name[0]) return DJ_OK;
    const dj_lora_t *have = dj_session_lora(es);
    if (have && !strcmp(dj_lora_name(have), name)) return DJ_OK;
    if (!plain_name(name)) return dj_fail(DJ_EINVAL, "adapter '%.128s': use the name of a folder in the model store", name);
    if (!fresh)
        return dj_fail(DJ_EINVAL, "adapter '%s': the session's KV was made with %s%s (an adapter is chosen by the "
                                  "session's first GENERATE)",
                       name, have ? "adapter " : "the bare model", have ? dj_lora_name(have) : "");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", models_dir, name);
    dj_lora_t *a = NULL;
    dj_status st = dj_lora_load(e, dj_session_model(es), dir, &a);
    if (st != DJ_OK) return st;
    st = dj_session_set_lora(e, es, a, 1.0f);
    dj_lora_release(e, a); /* the session holds its own reference */
    return st;
}

dj_status dj__adapter_split(const char *model, char *base, size_t base_n, char *adapter, size_t adapter_n) {
    const char *colon = strchr(model, ':');
    const size_t bl = colon ? (size_t)(colon - model) : strlen(model);
    const char *ad = colon ? colon + 1 : "";
    if (bl == 0 || bl >= base_n || (colon && (!ad[0] || strchr(ad, ':'))) || strlen(ad) >= adapter_n)
        return dj_fail(DJ_EINVAL, "model '%.128s': name a model, or \"base:adapter\" for a LoRA adapter of it", model);
    memcpy(base, model, bl);
    base[bl] = '\0';
    snprintf(adapter, adapter_n, "%s", ad);
    return DJ_OK;
}
