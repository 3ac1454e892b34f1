/* ktrace.c: a CUPTI activity tracer loaded into any CUDA program through the
 * driver's injection hook (no change to the program): every kernel, memcpy and
 * memset with its device start and end, and every runtime and driver API call
 * with its host start and end, on one clock, written as TSV when the program
 * exits - so the time between a step's kernels can be placed (the GPU machine
 * has ncu, which serialises kernels, but no nsys).
 *   CUDA_INJECTION64_PATH=build-cuda/libdj_ktrace.so DJ_KTRACE=/tmp/t.tsv prog ...
 *   python3 tools/ktrace_gaps.py /tmp/t.tsv
 * Rows: kind (K kernel, C memcpy, S memset, R runtime API, D driver API),
 * start ns, end ns, correlation id, stream (K/C/S) or callback id (R/D), name.
 * Records are buffered by CUPTI in 8 MiB blocks and written as each completes. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_BYTES (8u << 20)

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *buf = aligned_alloc(8, BUF_BYTES);
    *size = *buf ? BUF_BYTES : 0;
    *max_records = 0;
}

static void write_record(const CUpti_Activity *r) {
    switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
        const CUpti_ActivityKernel10 *k = (const void *)r;
        fprintf(out, "K\t%llu\t%llu\t%u\t%u\t%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                k->correlationId, k->streamId, k->name ? k->name : "?");
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const CUpti_ActivityMemcpy6 *m = (const void *)r;
        fprintf(out, "C\t%llu\t%llu\t%u\t%u\tmemcpy kind %u %llu bytes\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->correlationId, m->streamId, (unsigned)m->copyKind,
                (unsigned long long)m->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const CUpti_ActivityMemset4 *m = (const void *)r;
        fprintf(out, "S\t%llu\t%llu\t%u\t%u\tmemset %llu bytes\n", (unsigned long long)m->start,
                (unsigned long long)m->end, m->correlationId, m->streamId, (unsigned long long)m->bytes);
        break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME:
    case CUPTI_ACTIVITY_KIND_DRIVER: {
        const CUpti_ActivityAPI *a = (const void *)r;
        const char *name = NULL;
        const CUpti_CallbackDomain d =
            r->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API;
        if (cuptiGetCallbackName(d, a->cbid, &name) != CUPTI_SUCCESS) name = "?";
        fprintf(out, "%c\t%llu\t%llu\t%u\t%u\t%s\n", r->kind == CUPTI_ACTIVITY_KIND_RUNTIME ? 'R' : 'D',
                (unsigned long long)a->start, (unsigned long long)a->end, a->correlationId, a->cbid, name);
        break;
    }
    default:
        break;
    }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *r = NULL;
    while (out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS) write_record(r);
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "ktrace: %zu records dropped\n", dropped);
    free(buf);
}

static void at_exit(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

/* The driver calls this once, when CUDA_INJECTION64_PATH names this library. */
int InitializeInjection(void) {
    const char *path = getenv("DJ_KTRACE");
    out = fopen(path ? path : "ktrace.tsv", "w");
    if (!out) {
        perror("ktrace: cannot open the output ($DJ_KTRACE)");
        return 0;
    }
    static const CUpti_ActivityKind kinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                               CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME,
                                               CUPTI_ACTIVITY_KIND_DRIVER};
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
        fprintf(stderr, "ktrace: cuptiActivityRegisterCallbacks failed\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (cuptiActivityEnable(kinds[i]) != CUPTI_SUCCESS) fprintf(stderr, "ktrace: activity kind %d not traced\n", (int)kinds[i]);
    atexit(at_exit);
    return 1;
}
