/* alloc.h: the daemon's allocation functions (dj_malloc ... dj_strdup) and the
 * hook a test uses to fail the n-th allocation (as SQLite's sqlite3FaultSim). */
#ifndef DJINN_ALLOC_H
#define DJINN_ALLOC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* The memory always comes from the C library's malloc: a hook can only make an
 * allocation fail, so free() and dj_free() are interchangeable, and memory from
 * dj_malloc may be handed to libraries that free it with free(). With no hook
 * and no fault armed each call costs one relaxed load and a predictable branch. */

/* The hook: called before each allocation of size bytes on a thread not
 * exempted (dj_alloc_thread_exempt); true fails it (the call returns NULL).
 * ctx as given to dj_alloc_set_hook. It runs on any thread, concurrently. */
typedef bool (*dj_alloc_hook_fn)(void *ctx, size_t size);

/* Installs fn (NULL removes it). Not synchronised with allocations in flight:
 * install before the threads it should see start, or accept that an allocation
 * racing the call may or may not see it. */
void dj_alloc_set_hook(dj_alloc_hook_fn fn, void *ctx);

/* The built-in fault: the n-th counted allocation from now (n >= 1) fails, once;
 * counted are the dj_* allocations of every thread not exempted. 0 disarms. */
void dj_alloc_fail_nth(uint64_t n);
/* Whether the armed fault has fired since the last dj_alloc_fail_nth. */
bool dj_alloc_fault_fired(void);
/* Allocations counted since the last dj_alloc_fail_nth (or dj_alloc_count_start). */
uint64_t dj_alloc_counted(void);
/* Counts allocations from now without failing any (dj_alloc_counted reads it);
 * dj_alloc_fail_nth(0) stops counting. */
void dj_alloc_count_start(void);
/* The calling thread's allocations are never counted, failed or hooked (a test's
 * own client thread beside the daemon it drives). */
void dj_alloc_thread_exempt(bool exempt);

/* ---- the functions, as the C library's ---- */

extern atomic_bool dj__alloc_on; /* a hook is installed or a fault armed */
bool dj__alloc_refuse(size_t size); /* true: this allocation fails */

static inline bool dj__alloc_fails(size_t size) {
    return __builtin_expect(atomic_load_explicit(&dj__alloc_on, memory_order_relaxed), 0) && dj__alloc_refuse(size);
}
static inline void *dj_malloc(size_t size) { return dj__alloc_fails(size) ? NULL : malloc(size); }
static inline void *dj_calloc(size_t n, size_t size) { return dj__alloc_fails(n * size) ? NULL : calloc(n, size); }
/* A failed dj_realloc leaves p as it was (and owned by the caller), as realloc. */
static inline void *dj_realloc(void *p, size_t size) { return dj__alloc_fails(size) ? NULL : realloc(p, size); }
static inline void dj_free(void *p) { free(p); }
char *dj_strdup(const char *s);
char *dj_strndup(const char *s, size_t n);

#endif
