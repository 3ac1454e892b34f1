/* chat_template.h: the chat template of a Hugging Face model directory
 * (chat_template.jinja or tokenizer_config.json's chat_template), rendered by our own interpreter of the Jinja subset real templates use. */
#ifndef DJINN_CHAT_TEMPLATE_H
#define DJINN_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "djinn/status.h"
#include "djinn/tokenizer.h"

typedef struct dj_chat_template dj_chat_template_t;

/* Parse Jinja source (len bytes, need not be NUL-terminated) with the
 * environment transformers uses (trim_blocks, lstrip_blocks, loop controls).
 * A construct outside the subset (a tag such as macro or include, an unknown
 * filter, test, function or method) is refused with DJ_EUNSUPPORTED naming it
 * and its line; a syntax error is DJ_EFORMAT with its line.
 * Supported: text, {{ }}, {# #}, whitespace control (-), if/elif/else, for
 * (tuple targets, `if` filter, else, loop.*), set (also ns.attr and block
 * set), break/continue; literals, lists, dicts, attribute/index/slice,
 * calls, filters, tests, arithmetic, ~, comparisons, in, and/or/not,
 * conditional expressions. Globals: raise_exception, namespace, range,
 * strftime_now. Filters select/reject/selectattr/rejectattr and items
 * return a generator as jinja2's do (always true, no length, one pass); where
 * jinja2 would print a generator's address, or find it spent on a second
 * pass, the render fails with an error saying so.
 * The template copies what it needs from src. */
dj_status dj_chat_template_parse(const char *src, size_t len, dj_chat_template_t **out /* OUT */);
void dj_chat_template_free(dj_chat_template_t *t); /* NULL does nothing */

/* Load the chat template of <model_dir> as transformers does: the text of
 * <model_dir>/chat_template.jinja where that file exists (it takes priority),
 * else tokenizer_config.json's chat_template (a string, or the list of named
 * templates: "default" is taken); bos_token and eos_token (strings or
 * {"content": ...}) from tokenizer_config.json where it exists ("" without).
 * DJ_ENOTFOUND when there is no template. */
dj_status dj_chat_template_load(const char *model_dir, dj_chat_template_t **out /* OUT */);
/* The same from the text of a tokenizer_config.json. */
dj_status dj_chat_template_load_config(const char *json, size_t len, dj_chat_template_t **out /* OUT */);

/* Special tokens the renderer passes as bos_token / eos_token ("" if none);
 * valid while t lives. */
const char *dj_chat_template_bos(const dj_chat_template_t *t);
const char *dj_chat_template_eos(const dj_chat_template_t *t);

/* Render with the variables of vars_json, a JSON object (typically
 * {"messages": [...], "tools": [...], "add_generation_prompt": true}); its
 * bos_token/eos_token default to the template's. *text is malloc'd,
 * NUL-terminated, *len bytes. raise_exception(msg) in the template is
 * DJ_EINVAL with msg; runaway templates stop at limits (output 16 MiB,
 * 10 million evaluation steps, nesting 64) with DJ_ERANGE. */
dj_status dj_chat_template_render(const dj_chat_template_t *t, const char *vars_json, size_t vars_len,
                                  char **text /* OUT */, size_t *len /* OUT */);

/* Render and encode for a model: every string of vars_json (message content,
 * roles, tools: what a client sent) is text - a special token written in it
 * is encoded as its plain text (as transformers' split_special_tokens does),
 * never as a control token - while the template's own special tokens (its
 * text, bos_token, eos_token) stay special. With content free of special
 * tokens the ids are dj_tokenizer_encode's of dj_chat_template_render's text.
 * add_special as dj_tokenizer_encode's (templates write BOS themselves:
 * false). *ids malloc'd. */
dj_status dj_chat_template_encode(const dj_chat_template_t *t, const dj_tokenizer_t *tok, const char *vars_json,
                                  size_t vars_len, bool add_special, int32_t **ids /* OUT */, size_t *n_ids /* OUT */);

#endif
