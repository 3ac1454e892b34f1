/* cpu_kern.c: which matmul kernel table this CPU runs - from cpuid (and the
 * OS's saved register state), capped by $DJINN_CPU_ISA. */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kern.h"
#include "core/switches.h"

int dj__cpu_isa_supported(dj_cpu_isa isa) {
    switch (isa) {
    case DJ_CPU_ISA_PORTABLE: return 1;
#if defined(__x86_64__) && defined(__GNUC__)
    case DJ_CPU_ISA_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case DJ_CPU_ISA_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    default: return 0;
    }
}

const dj__cpu_kernels *dj__cpu_kernels_for(dj_cpu_isa isa) {
    if (!dj__cpu_isa_supported(isa)) return NULL;
    switch (isa) {
    case DJ_CPU_ISA_PORTABLE: return &dj__cpu_kernels_portable;
#if defined(__x86_64__)
    case DJ_CPU_ISA_AVX2: return &dj__cpu_kernels_avx2;
    case DJ_CPU_ISA_AVX512: return &dj__cpu_kernels_avx512;
#endif
    default: return NULL;
    }
}

dj_cpu_isa dj__cpu_isa_best(void) {
    /* $DJINN_CPU_ISA's values are the dj_cpu_isa names in order: portable|avx2|avx512 */
    const dj_cpu_isa cap = (dj_cpu_isa)dj_switch_read(DJ_SW_CPU_ISA);
    for (int i = (int)cap; i > 0; i--)
        if (dj__cpu_kernels_for((dj_cpu_isa)i)) return (dj_cpu_isa)i;
    return DJ_CPU_ISA_PORTABLE;
}
