/* grammar.h: structured output - a JSON schema (a common subset) compiled into
 * a matcher of JSON text, and the per-step token mask that keeps a generation inside it. */
#ifndef DJINN_GRAMMAR_H
#define DJINN_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "djinn/status.h"
#include "djinn/tokenizer.h"

/* ---- the compiled schema ---- */

/* The subset: "type" (object, array, string, number, integer, boolean, null,
 * or a list of them), enum, const, properties, required,
 * additionalProperties (any value: only the listed properties are written,
 * which every value of it allows), items, minItems, maxItems, anyOf, $defs /
 * definitions with $ref "#", "#/$defs/NAME" or "#/definitions/NAME"; the
 * annotations title, description, $schema, $id, $comment, default, examples,
 * and OpenAI's "strict" are read past. Anything else is refused naming the
 * keyword. An object without "properties" is any JSON object; a schema
 * without "type" (and without enum/const/anyOf) is any JSON value. */
typedef struct dj_grammar dj_grammar_t;

/* Compiles schema[len] (JSON text). DJ_EINVAL with a message naming the
 * keyword (and where: "at /properties/a") for what is outside the subset,
 * malformed, or admits no finite value (enum [], minItems above maxItems, a
 * required $ref cycle). */
dj_status dj_grammar_from_json_schema(const char *schema, size_t len, dj_grammar_t **out /* OUT */);
void dj_grammar_free(dj_grammar_t *g); /* NULL does nothing */

/* ---- matching text ---- */

/* Where a text stands against a grammar: a set of parse stacks (anyOf forks
 * them), copied by value. What it accepts: the value with optional white
 * space (at most DJ_GRAMMAR_MAX_WS characters in a row) before it and between
 * its tokens, none after; strings of valid UTF-8; numbers of at most
 * DJ_GRAMMAR_MAX_NUMBER characters; nesting to DJ_GRAMMAR_MAX_DEPTH; only
 * the listed properties of an object that lists some, each at most once. */
#define DJ_GRAMMAR_MAX_WS 16
#define DJ_GRAMMAR_MAX_NUMBER 24
#define DJ_GRAMMAR_MAX_DEPTH 32
typedef struct dj_grammar_state dj_grammar_state_t;

/* A state at the start of a text; g must outlive it. */
dj_status dj_grammar_state_new(const dj_grammar_t *g, dj_grammar_state_t **out /* OUT */);
void dj_grammar_state_free(dj_grammar_state_t *s);
/* Feeds bytes; false (s left dead: it accepts nothing more) when they
 * cannot continue any text of the grammar. */
bool dj_grammar_feed(dj_grammar_state_t *s, const char *bytes, size_t n);
/* The text so far is a whole value of the grammar. */
bool dj_grammar_complete(const dj_grammar_state_t *s);
/* ... and nothing can follow it (an object closed; a number could go on). */
bool dj_grammar_finished(const dj_grammar_state_t *s);
/* The fewest bytes that make the text so far a whole value (0: complete;
 * UINT32_MAX: dead). */
uint32_t dj_grammar_cost(const dj_grammar_state_t *s);

/* ---- the token mask ---- */

/* A model's token texts as a trie (what each id adds to the text mid-way
 * through a generation), for masks over a vocabulary of n_vocab ids: ids the
 * tokenizer lacks, special tokens and empty ones are never allowed. tok is
 * read here only. */
typedef struct dj_grammar_vocab dj_grammar_vocab_t;
dj_status dj_grammar_vocab_new(const dj_tokenizer_t *tok, uint32_t n_vocab, dj_grammar_vocab_t **out /* OUT */);
void dj_grammar_vocab_free(dj_grammar_vocab_t *v);
uint32_t dj_grammar_vocab_size(const dj_grammar_vocab_t *v);

/* One generation's constraint: a grammar (owned), the vocabulary (borrowed:
 * it must outlive the constraint) and the model's EOS ids (copied), with the
 * state of the text generated so far. The generation loop (generate.h) asks
 * it for each step's mask and tells it each picked id. */
typedef struct dj_constraint dj_constraint_t;
/* Takes g (freed with the constraint, or here on failure). */
dj_status dj_constraint_new(dj_grammar_t *g, const dj_grammar_vocab_t *v, const int32_t *eos, size_t n_eos,
                            dj_constraint_t **out /* OUT */);
void dj_constraint_free(dj_constraint_t *c); /* NULL does nothing */
/* allowed[id] = 1 for the ids that may come next, 0 for the rest
 * ([dj_grammar_vocab_size]): an id whose text the grammar takes and after
 * which the text can still be completed within tokens_left - 1 more tokens
 * (each at least a byte: so a generation of tokens_left tokens ends a whole
 * value when the vocabulary has every byte); the EOS ids once the text is
 * complete. Returns how many are allowed (0: stuck - the vocabulary cannot
 * continue the text). */
uint32_t dj_constraint_mask(dj_constraint_t *c, uint32_t tokens_left, uint8_t *allowed /* OUT */);
/* The whole road from a request: schema[len] compiled, the vocabulary of
 * tok over n_vocab ids (from a process-wide cache of four, keyed by a hash
 * of the token texts: built once per tokenizer; thread-safe), the EOS ids copied.
 * DJ_EINVAL naming what is wrong (the keyword, a missing tokenizer). */
dj_status dj_constraint_from_schema(const char *schema, size_t len, const dj_tokenizer_t *tok, uint32_t n_vocab,
                                    const int32_t *eos, size_t n_eos, dj_constraint_t **out /* OUT */);
/* The picked id: its text fed to the state (an EOS id feeds nothing).
 * False when the grammar does not take it (the state is then dead). */
bool dj_constraint_accept(dj_constraint_t *c, int32_t id);
/* The text is a whole value and nothing may follow: the generation ends. */
bool dj_constraint_finished(const dj_constraint_t *c);
const dj_grammar_state_t *dj_constraint_state(const dj_constraint_t *c);
uint32_t dj_constraint_vocab_size(const dj_constraint_t *c); /* the mask's length */
const dj_grammar_vocab_t *dj_constraint_vocab(const dj_constraint_t *c);

#endif
