/* alloc.c: the allocation hook and the n-th-allocation fault behind
 * djinn/alloc.h (the fast path is inline in the header). */
#include "djinn/alloc.h"

#include <string.h>

atomic_bool dj__alloc_on;

static _Atomic(dj_alloc_hook_fn) hook_fn;
static _Atomic(void *) hook_ctx;
static atomic_uint_fast64_t fault_left;  /* allocations until the fault; 0: none armed */
static atomic_bool fault_fired;
static atomic_bool counting;
static atomic_uint_fast64_t counted;
static _Thread_local bool exempt;

static void update_on(void) {
    atomic_store(&dj__alloc_on, atomic_load(&hook_fn) != NULL || atomic_load(&counting));
}

void dj_alloc_set_hook(dj_alloc_hook_fn fn, void *ctx) {
    atomic_store(&hook_ctx, ctx);
    atomic_store(&hook_fn, fn);
    update_on();
}

void dj_alloc_fail_nth(uint64_t n) {
    atomic_store(&counting, false);
    atomic_store(&fault_fired, false);
    atomic_store(&counted, 0);
    atomic_store(&fault_left, n);
    atomic_store(&counting, n > 0);
    update_on();
}

void dj_alloc_count_start(void) {
    dj_alloc_fail_nth(0);
    atomic_store(&counting, true);
    update_on();
}

bool dj_alloc_fault_fired(void) { return atomic_load(&fault_fired); }
uint64_t dj_alloc_counted(void) { return atomic_load(&counted); }
void dj_alloc_thread_exempt(bool e) { exempt = e; }

bool dj__alloc_refuse(size_t size) {
    if (exempt) return false;
    if (atomic_load(&counting)) {
        atomic_fetch_add(&counted, 1);
        /* decrement only while armed: exactly one caller sees 1 -> 0 */
        uint_fast64_t left = atomic_load(&fault_left);
        while (left > 0 && !atomic_compare_exchange_weak(&fault_left, &left, left - 1)) {
        }
        if (left == 1) {
            atomic_store(&fault_fired, true);
            return true;
        }
    }
    dj_alloc_hook_fn fn = atomic_load(&hook_fn);
    return fn && fn(atomic_load(&hook_ctx), size);
}

char *dj_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = dj_malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

char *dj_strndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *p = dj_malloc(len + 1);
    if (p) {
        memcpy(p, s, len);
        p[len] = 0;
    }
    return p;
}
