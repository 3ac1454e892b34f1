/* backend_impl.h: what every backend shares behind the vtable - the checks a
 * dj_op_call must pass before any backend runs it. Private to src/backend/. */
#ifndef DJ_BACKEND_IMPL_H
#define DJ_BACKEND_IMPL_H

#ifdef __cplusplus
extern "C" { /* the public C headers carry no linkage markers of their own */
#endif

#include "djinn/backend.h"

/* Validates a call for a backend whose activations are `act` and whose K/V
 * pages hold `kv` elements: NULL pointers, zero or inconsistent sizes, dtypes,
 * overlapping buffers (out may equal x only for ROPE), output dtype (act, or
 * f32 from MATMUL), and the K/V view and the positions it must map
 * (DJ_ERANGE). `backend` names the backend in messages. Backend-specific
 * limits (index ranges, kernel coverage) are the backend's own checks. */
dj_status dj__op_call_check(const dj_op_call *c, dj_dtype act, dj_dtype kv, const char *backend);

#ifdef __cplusplus
}
#endif

#endif
