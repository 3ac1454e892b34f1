/* backend.c: what every backend shares - releasing one through its vtable.
 * (Op names live with the SRG in src/graph/graph.c.) */
#include "djinn/backend.h"

void dj_backend_free(dj_backend_t *be) {
    if (be) be->vt->destroy(be);
}
