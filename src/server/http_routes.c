/* http_routes.c: the HTTP front end's endpoints beside the generation - /health,
 * GET /v1/models[/{id}] with each model's facts, POST /tokenize and /detokenize (vLLM's shapes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "djinn/alloc.h"
#include "model/jinja_impl.h"
#include "server/http_impl.h"

static char *print(cJSON *r, size_t *len) {
    char *s = r ? cJSON_PrintUnformatted(r) : NULL;
    cJSON_Delete(r);
    *len = s ? strlen(s) : 0;
    return s;
}

int dj__http_health(dj__server *s, const dj__token *tk, char **out, size_t *len, char *err, size_t cap) {
    *out = NULL;
    dj__portal *p = NULL;
    dj_status st = dj__portal_open(s, tk, &p);
    if (st == DJ_OK) st = dj__portal_call(p, &(dj__request){.type = DJ_MSG_HEARTBEAT}, NULL);
    dj__portal_close(p);
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "status", st == DJ_OK ? "ok" : "unavailable");
    if (st != DJ_OK) cJSON_AddStringToObject(r, "reason", dj_last_error());
    if (!(*out = print(r, len))) {
        snprintf(err, cap, "out of memory");
        return 503;
    }
    return st == DJ_OK ? 200 : st == DJ_EINVAL ? 401 : 503;
}

/* One model's entry: OpenAI's {id, object, created, owned_by} and what
 * djinnd knows of it (vLLM's max_model_len; loaded; its chat template). */
static cJSON *model_entry(const struct dj__rep_listed *m, dj__http_model_fn get, void *ctx) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "id", m->name);
    cJSON_AddStringToObject(e, "object", "model");
    cJSON_AddNumberToObject(e, "created", 0); /* a folder has no creation time worth telling */
    cJSON_AddStringToObject(e, "owned_by", "djinnd");
    cJSON_AddBoolToObject(e, "loaded", m->loaded);
    const dj__http_model *hm = get ? get(ctx, m->name) : NULL;
    if (hm) {
        cJSON_AddNumberToObject(e, "max_model_len", hm->max_pos);
        cJSON_AddBoolToObject(e, "chat_template", hm->tpl != NULL);
        cJSON_AddBoolToObject(e, "tokenizer", hm->tok != NULL);
    }
    return e;
}

int dj__http_models(const dj__rep_model_list *list, const char *id, dj__http_model_fn get, void *ctx, char **out,
                    size_t *len, char *err, size_t cap) {
    *out = NULL;
    const struct dj__rep_listed *ms = list->models;
    const size_t n = list->n;
    cJSON *r = NULL;
    if (id) {
        for (size_t i = 0; i < n && !r; i++)
            if (!strcmp(ms[i].name, id)) r = model_entry(&ms[i], get, ctx);
        if (!r) {
            snprintf(err, cap, "model '%.128s' is not in djinnd's model store", id);
            return 404;
        }
    } else {
        r = cJSON_CreateObject();
        cJSON_AddStringToObject(r, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(r, "data");
        for (size_t i = 0; data && i < n; i++) cJSON_AddItemToArray(data, model_entry(&ms[i], get, ctx));
    }
    if (!(*out = print(r, len))) {
        snprintf(err, cap, "out of memory");
        return 503;
    }
    return 200;
}

/* The body's model, by name (404 when the store lacks it). */
static int body_model(const cJSON *req, dj__http_model_fn get, void *ctx, const dj__http_model **m, char *err,
                      size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(req, "model");
    if (!cJSON_IsString(v) || !v->valuestring[0]) {
        snprintf(err, cap, "'model' must be a model name (a folder of the server's model store)");
        return 400;
    }
    if (!(*m = get(ctx, v->valuestring))) {
        snprintf(err, cap, "model '%.128s' is not in djinnd's model store", v->valuestring);
        return 404;
    }
    if (!(*m)->tok) {
        snprintf(err, cap, "model '%.128s' has no tokenizer.json", v->valuestring);
        return 400;
    }
    return 0;
}

static int only_fields(const cJSON *req, const char *const *names, size_t n, char *err, size_t cap) {
    for (const cJSON *f = req->child; f; f = f->next) {
        size_t k = 0;
        while (k < n && strcmp(names[k], f->string)) k++;
        if (k == n) {
            snprintf(err, cap, "unknown field '%.64s'", f->string);
            return 400;
        }
    }
    return 0;
}

int dj__http_tokenize(const char *body, size_t n, dj__http_model_fn get, void *ctx, char **out, size_t *len, char *err,
                      size_t cap) {
    *out = NULL;
    if (dj__json_has_nul_escape(body, n)) {
        snprintf(err, cap, "a string of the body holds \\u0000 (NUL)");
        return 400;
    }
    cJSON *req = cJSON_ParseWithLength(body, n);
    const dj__http_model *m = NULL;
    dj__oai o;
    memset(&o, 0, sizeof o);
    static const char *const fields[] = {"model", "prompt", "messages", "add_special_tokens", "tools"};
    int rc = !cJSON_IsObject(req) ? (snprintf(err, cap, "the body must be a JSON object"), 400)
                                  : only_fields(req, fields, 5, err, cap);
    if (!rc) rc = body_model(req, get, ctx, &m, err, cap);
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(req, "prompt");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(req, "add_special_tokens");
    if (!rc && !cJSON_IsString(prompt) == !msgs) {
        snprintf(err, cap, "send one of 'prompt' (a string) or 'messages' (a chat)");
        rc = 400;
    }
    if (!rc && !msgs && cJSON_GetObjectItemCaseSensitive(req, "tools")) {
        snprintf(err, cap, "'tools' goes with 'messages' (the chat template writes them)");
        rc = 400;
    }
    if (!rc && add && !cJSON_IsBool(add)) {
        snprintf(err, cap, "'add_special_tokens' must be true or false");
        rc = 400;
    }
    if (!rc && msgs) { /* the chat as the generation renders it: through the same parse and template */
        cJSON *chat = cJSON_CreateObject();
        cJSON_AddStringToObject(chat, "model", m->name);
        cJSON_AddItemReferenceToObject(chat, "messages", (cJSON *)msgs);
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
        if (tools) cJSON_AddItemReferenceToObject(chat, "tools", (cJSON *)tools);
        char *text = cJSON_PrintUnformatted(chat);
        cJSON_Delete(chat);
        rc = text ? dj__oai_parse(&o, text, strlen(text), true, NULL, err, cap) : 503;
        free(text);
        if (!rc) rc = dj__oai_prompt(&o, m, err, cap);
    } else if (!rc) {
        const size_t pl = strlen(prompt->valuestring);
        if (pl > (size_t)m->max_pos * (m->max_tok_bytes > 16 ? m->max_tok_bytes : 16)) {
            snprintf(err, cap, "the prompt has %zu bytes: more than model '%s' has positions for", pl, m->name);
            rc = 400;
        } else if (dj_tokenizer_encode(m->tok, prompt->valuestring, pl, !cJSON_IsFalse(add), &o.ids, &o.n_ids) !=
                   DJ_OK) {
            snprintf(err, cap, "the prompt cannot be tokenized: %s", dj_last_error());
            rc = 400;
        }
    }
    if (!rc) {
        cJSON *r = cJSON_CreateObject(), *t = cJSON_AddArrayToObject(r, "tokens");
        for (size_t i = 0; t && i < o.n_ids; i++) cJSON_AddItemToArray(t, cJSON_CreateNumber(o.ids[i]));
        cJSON_AddNumberToObject(r, "count", (double)o.n_ids);
        cJSON_AddNumberToObject(r, "max_model_len", m->max_pos);
        if (!(*out = print(r, len))) snprintf(err, cap, "out of memory"), rc = 503;
    }
    if (!req && !rc) rc = 400;
    dj__oai_free(&o);
    cJSON_Delete(req);
    if (!req) snprintf(err, cap, "the body is not valid JSON");
    return rc ? rc : 200;
}

int dj__http_detokenize(const char *body, size_t n, dj__http_model_fn get, void *ctx, char **out, size_t *len,
                        char *err, size_t cap) {
    *out = NULL;
    cJSON *req = cJSON_ParseWithLength(body, n);
    const dj__http_model *m = NULL;
    static const char *const fields[] = {"model", "tokens"};
    int rc = !req ? (snprintf(err, cap, "the body is not valid JSON"), 400)
             : !cJSON_IsObject(req) ? (snprintf(err, cap, "the body must be a JSON object"), 400)
                                    : only_fields(req, fields, 2, err, cap);
    if (!rc) rc = body_model(req, get, ctx, &m, err, cap);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(req, "tokens");
    const int count = cJSON_IsArray(toks) ? cJSON_GetArraySize(toks) : -1;
    int32_t *ids = NULL;
    if (!rc && count < 0) {
        snprintf(err, cap, "'tokens' must be an array of token ids");
        rc = 400;
    }
    if (!rc && !(ids = dj_malloc(((size_t)count + 1) * sizeof *ids))) snprintf(err, cap, "out of memory"), rc = 503;
    int k = 0;
    for (const cJSON *e = toks ? toks->child : NULL; !rc && e; e = e->next, k++) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= dj_tokenizer_vocab_size(m->tok) ||
            e->valuedouble != (double)(int32_t)e->valuedouble) {
            snprintf(err, cap, "tokens[%d] is not a token id of model '%s' (0 to %u)", k, m->name, dj_tokenizer_vocab_size(m->tok) - 1);
            rc = 400;
        } else {
            ids[k] = (int32_t)e->valuedouble;
        }
    }
    char *text = NULL;
    size_t tl = 0;
    if (!rc && dj_tokenizer_decode_len(m->tok, ids, (size_t)count, &text, &tl) != DJ_OK) {
        snprintf(err, cap, "the ids cannot be decoded: %s", dj_last_error());
        rc = 400;
    }
    if (!rc) {
        cJSON *r = cJSON_CreateObject();
        char *t = dj_strndup(text ? text : "", tl);
        cJSON_AddStringToObject(r, "prompt", t ? t : "");
        free(t);
        if (!(*out = print(r, len))) snprintf(err, cap, "out of memory"), rc = 503;
    }
    free(text);
    free(ids);
    cJSON_Delete(req);
    return rc ? rc : 200;
}
