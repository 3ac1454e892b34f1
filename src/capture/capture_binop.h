/* capture_binop.h: the binary elementwise ops of captured graphs (add, compare, pow, ...) - one
 * definition that the CPU executor (capture_exec.c) and the CUDA one (cuda_capture.cu) both compile. */
#ifndef DJ_CAPTURE_BINOP_H
#define DJ_CAPTURE_BINOP_H

#include <math.h>

#ifdef __CUDACC__
#define DJ__BINOP_FN static __host__ __device__ __forceinline__
#else
#define DJ__BINOP_FN static inline
#endif

typedef enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV, BIN_GT, BIN_LT, BIN_GE, BIN_LE, BIN_EQ, BIN_NE, BIN_POW, BIN_RSUB } binop;

/* a op b; alpha scales the second operand of add/sub (the first of rsub), as aten's alpha= */
DJ__BINOP_FN float bin1(int op, float a, float b, float alpha) {
    switch (op) {
    case BIN_ADD: return a + alpha * b;
    case BIN_SUB: return a - alpha * b;
    case BIN_MUL: return a * b;
    case BIN_DIV: return a / b;
    case BIN_GT: return a > b ? 1.0f : 0.0f;
    case BIN_LT: return a < b ? 1.0f : 0.0f;
    case BIN_GE: return a >= b ? 1.0f : 0.0f;
    case BIN_LE: return a <= b ? 1.0f : 0.0f;
    case BIN_EQ: return a == b ? 1.0f : 0.0f;
    case BIN_NE: return a != b ? 1.0f : 0.0f;
    case BIN_RSUB: return b - alpha * a;
    case BIN_POW: return b == 2.0f ? a * a : b == 0.5f ? sqrtf(a) : powf(a, b);
    }
    return 0.0f;
}

#endif
