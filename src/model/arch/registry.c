/* registry.c: the architecture table, generated from djinn/arch_list.h - each
 * entry is the dj__arch_<file> that src/model/arch/<file>.c defines. */
#include "model/arch/arch.h"

#define DJ_ARCH_EXTERN_(e, hf, file) extern const dj_arch_desc dj__arch_##file;
DJ_ARCH_LIST(DJ_ARCH_EXTERN_)
#undef DJ_ARCH_EXTERN_

static const dj_arch_desc *const archs[DJ_ARCH_COUNT] = {
#define DJ_ARCH_ENTRY_(e, hf, file) [DJ_ARCH_##e] = &dj__arch_##file,
    DJ_ARCH_LIST(DJ_ARCH_ENTRY_)
#undef DJ_ARCH_ENTRY_
};

static const char *const names[DJ_ARCH_COUNT] = {
#define DJ_ARCH_NAME_(e, hf, file) [DJ_ARCH_##e] = hf,
    DJ_ARCH_LIST(DJ_ARCH_NAME_)
#undef DJ_ARCH_NAME_
};

const dj_arch_desc *dj__arch(dj_arch a) { return (unsigned)a < DJ_ARCH_COUNT ? archs[a] : NULL; }
const char *dj__arch_name(dj_arch a) { return (unsigned)a < DJ_ARCH_COUNT ? names[a] : "unknown"; }
