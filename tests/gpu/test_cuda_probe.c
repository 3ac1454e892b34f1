/* test_cuda_probe.c: what of the CUDA backend runs without a GPU (ctest on
 * machines with nvcc but no device) - the probe and clean failures - and,
 * where a GPU is present, a memory round trip. */
#include <string.h>

#include "djinn/backend.h"
#include "djinn/dj_cuda.h"
#include "testutil.h"

int main(void) {
    const int count = dj_cuda_device_count();
    CHECK(count >= 0);
    dj_backend_t *be = (dj_backend_t *)&count; /* must be overwritten with NULL on failure */
    CHECK_ST(dj_backend_cuda_new(0, NULL), DJ_EINVAL);
    CHECK_ST(dj_backend_cuda_new(-1, &be), count == 0 ? DJ_EDEVICE : DJ_EINVAL);
    CHECK(be == NULL);
    if (count == 0) {
        be = (dj_backend_t *)&count;
        CHECK_ST(dj_backend_cuda_new(0, &be), DJ_EDEVICE);
        CHECK(be == NULL);
        CHECK(strncmp(dj_last_error(), "cuda:0 ", 7) == 0);
        char name[64];
        CHECK(dj_cuda_device_name(0, name, sizeof name) != DJ_OK);
        printf("no CUDA device: probe and failure paths only\n");
        return dj_test_finish("test_cuda_probe");
    }
    CHECK_OK(dj_backend_cuda_new(0, &be));
    if (!be) return dj_test_finish("test_cuda_probe");
    CHECK(be->act_dtype == DJ_DTYPE_BF16 && be->kv_dtype == DJ_DTYPE_BF16);
    CHECK(strcmp(be->vt->name, "cuda") == 0);
    void *p = NULL;
    CHECK_ST(be->vt->alloc(be, 0, &p), DJ_EINVAL);
    CHECK_ST(be->vt->alloc(be, (size_t)1 << 62, &p), DJ_ENOMEM);
    CHECK(p == NULL);
    CHECK_OK(be->vt->alloc(be, 4096, &p));
    const char msg[] = "device bytes";
    char back[sizeof msg] = {0};
    CHECK_OK(be->vt->upload(be, p, msg, sizeof msg));
    CHECK_OK(be->vt->download(be, back, p, sizeof msg));
    CHECK(memcmp(msg, back, sizeof msg) == 0);
    CHECK_OK(be->vt->sync(be));
    be->vt->free(be, p);
    dj_backend_free(be);
    dj_backend_free(NULL);
    return dj_test_finish("test_cuda_probe");
}
