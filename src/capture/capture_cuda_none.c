/* capture_cuda_none.c: the CUDA executor's entry points in a build without CUDA - each refuses
 * with DJ_EUNSUPPORTED (src/capture/cuda_capture.cu is the real one). */
#include "capture/capture_impl.h"

#ifndef DJ_HAVE_CUDA
#include <stdio.h>
#include <string.h>

dj_status dj_cgraph_cuda_check(const dj_cgraph_t *g, dj_cgraph_error *err) {
    (void)g;
    if (err) {
        memset(err, 0, sizeof *err);
        err->kind = DJ_CGRAPH_ERR_UNSUPPORTED;
        err->node = -1;
        snprintf(err->msg, sizeof err->msg, "captured graph: this build has no CUDA executor (configure with -DDJ_CUDA=ON)");
    }
    return dj_fail(DJ_EUNSUPPORTED, "captured graph: this build has no CUDA executor (configure with -DDJ_CUDA=ON)");
}

dj_status dj_cgraph_run_cuda(const dj_cgraph_t *g, dj_backend_t *cuda, const float *const *inputs, const float *const *weights,
                             void *stack, const float **outs) {
    (void)cuda, (void)inputs, (void)weights, (void)stack, (void)outs;
    return dj_cgraph_cuda_check(g, NULL);
}
#else
typedef int dj__capture_cuda_none_empty; /* ISO C: a translation unit is not empty */
#endif
