/* fuzz_graph.c: libFuzzer target - a captured graph's msgpack (docs/protocol.md): decode, validate
 * and plan answer any bytes with a status; an accepted graph runs (or refuses a run-time index). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "djinn/backend.h"
#include "djinn/capture.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static dj_backend_t *cpu;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* small limits: every accepted graph is cheap enough to run on zeros */
    const dj_cgraph_limits lim = {.max_nodes = 256, .max_elems = 4096, .max_stack_bytes = 1 << 20, .max_ops = 1 << 24};
    dj_cgraph_t *g = NULL;
    dj_cgraph_error e;
    const dj_status st = dj_cgraph_decode(data, size, &lim, &g, &e);
    if (st != DJ_OK) {
        if (g || e.kind == DJ_CGRAPH_ERR_NONE || !e.msg[0]) abort(); /* a refusal says what it was */
        return 0;
    }
    if (dj_cgraph_stack_bytes(g) > lim.max_stack_bytes || dj_cgraph_n_nodes(g) > lim.max_nodes) abort();
    if (!cpu && dj_backend_cpu_new(1, &cpu) != DJ_OK) abort();
    const uint32_t ni = dj_cgraph_n_inputs(g), nw = dj_cgraph_n_weights(g), no = dj_cgraph_n_outputs(g);
    const float **in = calloc(ni + 1, sizeof *in), **wt = calloc(nw + 1, sizeof *wt), **outs = calloc(no + 1, sizeof *outs);
    for (uint32_t i = 0; i < ni; i++) in[i] = calloc(dj_cgraph_input(g, i)->numel + 1, sizeof(float));
    for (uint32_t i = 0; i < nw; i++) wt[i] = calloc(dj_cgraph_weight(g, i)->numel + 1, sizeof(float));
    void *stack = aligned_alloc(64, dj_cgraph_stack_bytes(g) + 64);
    const dj_status rst = dj_cgraph_run(g, cpu, in, wt, stack, outs);
    if (rst != DJ_OK && rst != DJ_ERANGE) abort(); /* ERANGE: an index read at run time (embedding of an empty table) */
    volatile float sink = 0.0f;
    for (uint32_t i = 0; rst == DJ_OK && i < no; i++)
        for (uint64_t k = 0; k < dj_cgraph_output(g, i)->numel; k++) sink += outs[i][k]; /* every output readable */
    (void)sink;
    for (uint32_t i = 0; i < ni; i++) free((void *)in[i]);
    for (uint32_t i = 0; i < nw; i++) free((void *)wt[i]);
    free(in), free(wt), free(outs), free(stack);
    dj_cgraph_free(g);
    return 0;
}
