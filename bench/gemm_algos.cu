/* gemm_algos.cu: how much of the prefill's bf16 GEMM time the algorithm
 * choice holds - for each projection shape of the 8B-class models (tokens
 * 2048), cublasGemmEx's own pick (what the engine calls) beside every
 * algorithm cuBLASLt's heuristic offers for the same problem, each timed on
 * random bf16 data, and cublasGemmEx writing f32 added to its output (beta
 * 1: adding into the f32 residual stream in the GEMM); and the square GEMM the benchmarks' floor is measured on,
 * with constant data (as cuda_measure.cu fills it) and random data. Prints
 *   <shape> m n k: default <us> (<TF>) best <us> (<TF>, algo i of N) ...
 * usage: bench_gemm_algos [fp8 [--no-sweep]] (fp8: the FP8 part only, --no-sweep without the
 * configuration sweep; needs a GPU;
 * bench/RESULTS.md has its figures) */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/fill_uniform.cuh"

#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "bench_gemm_algos: %s: %s\n", #x, cudaGetErrorString(e_));                                 \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define CHECKB(x)                                                                                                      \
    do {                                                                                                               \
        int s_ = (int)(x);                                                                                             \
        if (s_ != 0) {                                                                                                 \
            fprintf(stderr, "bench_gemm_algos: %s: status %d\n", #x, s_);                                              \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

static const int ITERS = 20;
static const size_t WS = (size_t)32 << 20;

template <typename F>
static float time_us(cudaStream_t s, F run, int iters = ITERS) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) run();
    CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < iters; i++) run();
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return ms * 1e3f / iters;
}

struct shape {
    const char *name;
    int m, n, k; /* out features, tokens, in features */
};

/* A problem as the engine states it - out [n][m] = x [n][k] w [m][k]^T,
 * column-major for cuBLASLt: D (m x n) = A^T (A: w, k x m) B (B: x, k x n) -
 * in operand type `in`, D in bf16; the caller sets the descriptor's scale
 * attributes, then asks the heuristic (up to 32 algorithms). */
struct lt_problem {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
};
static lt_problem problem_make(cudaDataType_t in, int m, int n, int k) {
    lt_problem p;
    CHECKB(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t tA = CUBLAS_OP_T, tB = CUBLAS_OP_N;
    CHECKB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &tA, sizeof tA));
    CHECKB(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tB, sizeof tB));
    CHECKB(cublasLtMatrixLayoutCreate(&p.a, in, k, m, k));
    CHECKB(cublasLtMatrixLayoutCreate(&p.b, in, k, n, k));
    CHECKB(cublasLtMatrixLayoutCreate(&p.d, CUDA_R_16BF, m, n, m));
    return p;
}
static int problem_heuristic(cublasLtHandle_t lt, const lt_problem &p, cublasLtMatmulHeuristicResult_t res[32]) {
    cublasLtMatmulPreference_t pref;
    CHECKB(cublasLtMatmulPreferenceCreate(&pref));
    CHECKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &WS, sizeof WS));
    int found = 0;
    /* a problem cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED) has no algorithm: 0, said by the caller */
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.d, p.d, pref, 32, res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED) return 0;
    CHECKB(st);
    return found;
}
static void problem_free(lt_problem &p) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.op);
}

/* Every configuration of the heuristic's own algorithm for an FP8 problem:
 * from its algorithm (root), each tile and stage count it lists, each
 * cluster shape, custom option and CTA swizzle that cublasLtMatmulAlgoCheck
 * accepts, timed (5 runs each); the fastest six and the root timed again
 * (40 runs each, twice in turn). (An earlier sweep started from each
 * algorithm id's default configuration - no cluster shape or option set -
 * and cuBLASLt refused every one of those for block scales.) Prints the
 * counts, the root and the fastest six with their settings and workspace. */
struct tune_cfg {
    uint32_t tile, stages, custom, swz;
    uint16_t cluster;
    size_t ws;
    float us;
};
static void tune_set(cublasLtMatmulAlgo_t *a, const tune_cfg &c) {
    cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_TILE_ID, &c.tile, sizeof c.tile);
    cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &c.stages, sizeof c.stages);
    cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &c.custom, sizeof c.custom);
    cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &c.swz, sizeof c.swz);
    cublasLtMatmulAlgoConfigSetAttribute(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &c.cluster, sizeof c.cluster);
}
static void tune_print(const char *what, const tune_cfg &c, double flop) {
    printf("    %s %.1f us %.0f TF (tile %u stages %u cluster %u custom %u swizzle %u, workspace %zu)\n", what, c.us,
           flop / c.us * 1e-6, c.tile, c.stages, c.cluster, c.custom, c.swz, c.ws);
}
template <typename F>
static void fp8_tune(cudaStream_t s, cublasLtHandle_t lt, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t la,
                     cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, double flop,
                     const cublasLtMatmulHeuristicResult_t &root, F run_algo) {
    cublasLtMatmulAlgo_t algo = root.algo;
    tune_cfg rc = {0, 0, 0, 0, 0, root.workspaceSize, 0.0f};
    size_t got = 0;
    int32_t id = -1;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &rc.tile, sizeof rc.tile, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &rc.stages, sizeof rc.stages, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &rc.custom, sizeof rc.custom, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &rc.swz, sizeof rc.swz, &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &rc.cluster, sizeof rc.cluster,
                                         &got);
    uint32_t tiles[256], stages[256], cmax = 0;
    int32_t swz_ok = 0;
    size_t tb = 0, sb = 0;
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, sizeof tiles, &tb);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, sizeof stages, &sb);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX, &cmax, sizeof cmax, &got);
    cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_ok, sizeof swz_ok, &got);
    int nt = (int)(tb / 4), ns = (int)(sb / 4);
    if (!nt) tiles[nt++] = rc.tile;
    if (!ns) stages[ns++] = rc.stages;
    if (cmax > 15) cmax = 15;
    static tune_cfg all[16384];
    int checked = 0, ok = 0;
    auto try_cfg = [&](tune_cfg c) {
        cublasLtMatmulAlgo_t a = root.algo;
        tune_set(&a, c);
        cublasLtMatmulHeuristicResult_t r;
        checked++;
        if (cublasLtMatmulAlgoCheck(lt, op, la, lb, ld, ld, &a, &r) != CUBLAS_STATUS_SUCCESS ||
            r.workspaceSize > WS || ok == (int)(sizeof all / sizeof *all))
            return;
        c.ws = r.workspaceSize;
        if (run_algo(&a) != CUBLAS_STATUS_SUCCESS || cudaStreamSynchronize(s) != cudaSuccess) {
            (void)cudaGetLastError();
            return; /* accepted by the check, refused at the launch: not a candidate */
        }
        c.us = time_us(s, [&] { run_algo(&a); }, 5);
        all[ok++] = c;
    };
    /* each tile, cluster shape, option and swizzle at the root's stage count; then each stage count of the
     * three fastest of those */
    for (int t = 0; t < nt; t++)
        for (uint16_t cl = 0; cl < CUBLASLT_CLUSTER_SHAPE_END; cl++)
            for (uint32_t cu = 0; cu <= cmax; cu++)
                for (uint32_t sw = 0; sw <= (swz_ok ? 1u : 0u); sw++)
                    if (cl != 1) try_cfg({tiles[t], rc.stages, cu, sw, cl, 0, 0.0f}); /* no shape has id 1 */
    auto sort_all = [&] { /* insertion sort by time */
        for (int i = 1; i < ok; i++)
            for (int j = i; j > 0 && all[j].us < all[j - 1].us; j--) {
                const tune_cfg tmp = all[j];
                all[j] = all[j - 1];
                all[j - 1] = tmp;
            }
    };
    sort_all();
    const int nb = ok < 3 ? ok : 3;
    tune_cfg best3[3];
    for (int j = 0; j < nb; j++) best3[j] = all[j];
    for (int j = 0; j < nb; j++)
        for (int st = 0; st < ns; st++)
            if (stages[st] != rc.stages)
                try_cfg({best3[j].tile, stages[st], best3[j].custom, best3[j].swz, best3[j].cluster, 0, 0.0f});
    sort_all();
    const int top = ok < 6 ? ok : 6;
    float sum[7] = {0};
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i <= top; i++) {
            cublasLtMatmulAlgo_t a = root.algo;
            if (i < top) tune_set(&a, all[i]);
            sum[i] += time_us(s, [&] { run_algo(i < top ? &a : &root.algo); }, 40) / 2;
        }
    printf("  tune of algorithm %d: %d tiles, %d stage counts, custom options 0-%u, swizzle %s: %d configurations "
           "checked, %d accepted\n",
           id, nt, ns, cmax, swz_ok ? "0-1" : "0", checked, ok);
    rc.us = sum[top];
    tune_print("root", rc, flop);
    for (int i = 0; i < top; i++) {
        all[i].us = sum[i];
        tune_print("    ", all[i], flop);
    }
}

/* The FP8 prefill's GEMMs as cuda_matmul_fp8_lt.cu runs them: e4m3 weights
 * with a scale per 128x128 block, e4m3 activations with a scale per 128
 * channels of a token, bf16 out - every algorithm cuBLASLt's heuristic
 * offers, timed (the engine takes its first), and each other configuration
 * cuBLASLt accepts of the heuristic's algorithm (fp8_tune); beside them the same operands with one scale
 * per tensor (what the FP8 tensor cores give without block scales), with
 * and without fast accumulation; per-channel weights as cuda_matmul_fp8_lt.cu
 * runs them (VEC128 scales on both operands); and the block-scaled problem
 * asking for fast accumulation (whether cuBLASLt has another kernel for it),
 * and writing f32 added to the output's contents (beta 1: what adding into
 * the f32 residual stream in the GEMM would cost it). */
/* v[i] = a + b * (i % 7) for i < count. */
static __global__ void fill_steps_kernel(float *v, size_t count, float a, float b) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count; i += (size_t)gridDim.x * blockDim.x)
        v[i] = a + b * (float)(i % 7);
}

static bool fp8_sweep = true; /* the configuration sweep of kind 0 (fp8_tune); `fp8 --no-sweep`: off */

static void fp8_block(cudaStream_t s, cublasLtHandle_t lt, void *ws, const shape *shapes, int count) {
    const size_t cap = (size_t)28672 * 4096;
    uint8_t *w, *x;
    float *wsc, *xsc;
    __nv_bfloat16 *y;
    CHECK(cudaMalloc(&w, cap));
    CHECK(cudaMalloc(&x, cap));
    CHECK(cudaMalloc(&y, cap * 2));
    CHECK(cudaMalloc(&wsc, cap / 128 * sizeof(float)));
    CHECK(cudaMalloc(&xsc, cap / 128 * sizeof(float)));
    /* kind 6: unit block scales, and a scale per weight row as cuBLASLt's alpha vector (per-channel weights
     * on the block kernel); checked against kind 0's product (every block scale s0) times alpha / s0 */
    const float s0 = 2.9e-3f; /* 0x3b3b3b3b, the block scales below: 2.8592e-3 */
    float *ones, *av;
    __nv_bfloat16 *y0;
    CHECK(cudaMalloc(&ones, cap / 128 * sizeof(float)));
    CHECK(cudaMalloc(&av, 28672 * sizeof(float)));
    CHECK(cudaMalloc(&y0, cap * 2));
    /* codes of small magnitude from random bf16 bits; scales near 1 / 448 */
    dj_fill_uniform_bf16<<<1024, 256, 0, s>>>((__nv_bfloat16 *)w, cap / 2, 4, -0.05f, 0.05f);
    dj_fill_uniform_bf16<<<1024, 256, 0, s>>>((__nv_bfloat16 *)x, cap / 2, 5, -0.05f, 0.05f);
    CHECK(cudaMemsetAsync(wsc, 0x3b, cap / 128 * sizeof(float), s)); /* 0x3b3b3b3b: 2.9e-3 */
    CHECK(cudaMemsetAsync(xsc, 0x3b, cap / 128 * sizeof(float), s));
    fill_steps_kernel<<<256, 256, 0, s>>>(ones, cap / 128, 1.0f, 0.0f);
    fill_steps_kernel<<<64, 256, 0, s>>>(av, 28672, 0.5f * s0, s0 / 7.0f);
    CHECK(cudaGetLastError());
    float s0_exact = 0.0f;
    CHECK(cudaMemcpy(&s0_exact, wsc, sizeof s0_exact, cudaMemcpyDeviceToHost));
    const float one = 1.0f, zero = 0.0f;
    static const char *const kinds[] = {"block", "tensor", "tensor fast-accum", "channel as VEC128",
                                        "block fast-accum", "block f32 += C", "chan: unit blocks+alpha"};
    for (int si = 0; si < count; si++) {
        const int m = shapes[si].m, n = shapes[si].n, k = shapes[si].k;
        if (m % 128 || k % 128) continue;
        const double flop = 2.0 * m * n * (double)k;
        for (int kind = 0; kind < 7; kind++) {
            lt_problem pr = problem_make(CUDA_R_8F_E4M3, m, n, k);
            if (kind == 5) { /* f32 out added to what it holds (beta 1): a residual stream updated in place */
                cublasLtMatrixLayoutDestroy(pr.d);
                CHECKB(cublasLtMatrixLayoutCreate(&pr.d, CUDA_R_32F, m, n, m));
                CHECK(cudaMemsetAsync(y, 0, (size_t)m * n * sizeof(float), s));
            }
            const cublasLtMatmulDesc_t op = pr.op;
            const cublasLtMatrixLayout_t la = pr.a, lb = pr.b, ld = pr.d;
            const float *beta = kind == 5 ? &one : &zero;
            if (kind != 1 && kind != 2) { /* 3: per-channel weights' scales repeated per 128 columns */
                const int32_t amode = kind != 3 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
                              bmode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
                CHECKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof amode));
                CHECKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof bmode));
            }
            if (kind == 2 || kind == 4) {
                const int8_t fast = 1;
                CHECKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
            }
            const float *alpha = &one;
            if (kind == 6) {
                const int32_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
                CHECKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm));
                alpha = av;
            }
            /* per tensor: the first scale of each array */
            float *const asc = kind == 6 ? ones : wsc;
            CHECKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &asc, sizeof asc));
            CHECKB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xsc, sizeof xsc));
            cublasLtMatmulHeuristicResult_t res[32];
            const int found = problem_heuristic(lt, pr, res);
            printf("fp8 %-17s %-20s m %5d n %d k %5d: %d algorithms:", kinds[kind], shapes[si].name, m, n, k, found);
            bool ran = false;
            float best = 1e30f;
            for (int i = 0; i < found; i++) {
                if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
                const float us = time_us(s, [&] {
                    CHECKB(cublasLtMatmul(lt, op, alpha, w, la, x, lb, beta, y, ld, y, ld, &res[i].algo, ws, WS, s));
                });
                ran = true;
                if (us < best) best = us;
                int tile = -1, stages = -1, splitk = -1, cl = -1;
                size_t got = 0;
                cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile,
                                                     &got);
                cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                                     sizeof stages, &got);
                cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                     sizeof splitk, &got);
                cublasLtMatmulAlgoConfigGetAttribute(&res[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cl,
                                                     sizeof cl, &got);
                if (i < 4)
                    printf(" [%d] %.1f us %.0f TF (tile %d st %d sk %d cl %d)", i, us, flop / us * 1e-6, tile, stages,
                           splitk, cl);
            }
            if (best < 1e30f)
                printf(" | best %.1f us %.0f TF\n", best, flop / best * 1e-6);
            else
                printf(" none runs (refused by the heuristic)\n");
            if (kind == 0 && ran) CHECK(cudaMemcpyAsync(y0, y, (size_t)m * n * 2, cudaMemcpyDeviceToDevice, s));
            if (kind == 6 && ran) { /* y[t][j] against y0[t][j] * alpha[j] / s0 (column-major m x n: j fastest) */
                const size_t cnt = (size_t)m * n;
                uint16_t *h = (uint16_t *)malloc(cnt * 2), *h0 = (uint16_t *)malloc(cnt * 2);
                CHECK(cudaStreamSynchronize(s));
                CHECK(cudaMemcpy(h, y, cnt * 2, cudaMemcpyDeviceToHost));
                CHECK(cudaMemcpy(h0, y0, cnt * 2, cudaMemcpyDeviceToHost));
                double maxd = 0.0, maxr = 0.0;
                size_t skipped = 0;
                for (size_t e = 0; e < cnt; e++) {
                    uint32_t b = (uint32_t)h[e] << 16, b0 = (uint32_t)h0[e] << 16;
                    float f, f0;
                    memcpy(&f, &b, 4);
                    memcpy(&f0, &b0, 4);
                    const size_t j = e % (size_t)m;
                    const double want = (double)f0 * (0.5 * s0 + s0 / 7.0 * (double)(j % 7)) / s0_exact;
                    if (!isfinite(want) || !isfinite(f)) {
                        skipped++;
                        continue;
                    }
                    if (fabs(f - want) > maxd) maxd = fabs(f - want);
                    if (fabs(want) > maxr) maxr = fabs(want);
                }
                printf("    alpha-vector product against the block product times alpha / s0: max err %.3g of the "
                       "largest %.3g (%zu non-finite skipped)\n", maxd, maxr, skipped);
                free(h);
                free(h0);
            }
            if (kind == 0 && fp8_sweep && !strncmp(shapes[si].name, "llama", 5) && found > 0)
                fp8_tune(s, lt, op, la, lb, ld, flop, res[0], [&](const cublasLtMatmulAlgo_t *algo) {
                    return cublasLtMatmul(lt, op, &one, w, la, x, lb, &zero, y, ld, y, ld, algo, ws, WS, s);
                });
            problem_free(pr);
        }
    }
}

int main(int argc, char **argv) {
    const bool fp8_only = argc > 1 && !strcmp(argv[1], "fp8");
    fp8_sweep = !(argc > 2 && !strcmp(argv[2], "--no-sweep"));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cublasHandle_t blas;
    cublasLtHandle_t lt;
    CHECKB(cublasCreate(&blas));
    CHECKB(cublasLtCreate(&lt));
    CHECKB(cublasSetStream(blas, s));
    void *ws;
    CHECK(cudaMalloc(&ws, WS));
    CHECKB(cublasSetWorkspace(blas, ws, WS));
    const size_t cap = (size_t)28672 * 4096 + (size_t)8192 * 8192; /* largest operand */
    __nv_bfloat16 *w, *x, *y;
    CHECK(cudaMalloc(&w, cap * 2));
    CHECK(cudaMalloc(&x, cap * 2));
    CHECK(cudaMalloc(&y, cap * 2));
    dj_fill_uniform_bf16<<<1024, 256, 0, s>>>(w, cap, 1, -0.05f, 0.05f);
    dj_fill_uniform_bf16<<<1024, 256, 0, s>>>(x, cap, 2, -0.05f, 0.05f);
    CHECK(cudaGetLastError());
    const float one = 1.0f, zero = 0.0f;

    /* the floor's square GEMM: constant data (cuda_measure.cu) and random data */
    for (int rnd = 0; rnd < 2; rnd++) {
        const int n = 8192;
        __nv_bfloat16 *a = w, *b = x;
        if (!rnd) {
            a = y;
            b = y + (size_t)n * n;
            CHECK(cudaMemsetAsync(a, 0x3c, (size_t)n * n * 2 * 2, s));
        }
        __nv_bfloat16 *c = rnd ? y : y + (size_t)2 * n * n;
        if (!rnd) CHECK(cudaMalloc(&c, (size_t)n * n * 2));
        const float us = time_us(s, [&] {
            CHECKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                                &zero, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
        printf("square %d, %s data: %.1f us, %.0f TFLOPS\n", n, rnd ? "random" : "constant", us,
               2.0 * n * n * (double)n / us * 1e-6);
        if (!rnd) CHECK(cudaFree(c));
    }
    dj_fill_uniform_bf16<<<1024, 256, 0, s>>>(y, cap, 3, -0.05f, 0.05f);

    const shape shapes[] = {
        {"llama q/o", 4096, 2048, 4096},       {"llama k/v", 1024, 2048, 4096},
        {"llama gate/up", 14336, 2048, 4096},  {"llama down", 4096, 2048, 14336},
        {"llama qkv fused", 6144, 2048, 4096}, {"llama gate+up fused", 28672, 2048, 4096},
        {"qwen3 gate/up", 12288, 2048, 4096},  {"qwen3 down", 4096, 2048, 12288},
        {"gemma2 q", 4096, 2048, 3584},        {"gemma2 k/v", 2048, 2048, 3584},
        {"gemma2 o", 3584, 2048, 4096},        {"gemma2 gate/up", 14336, 2048, 3584},
        {"gemma2 down", 3584, 2048, 14336},    {"gemma2 qkv fused", 8192, 2048, 3584},
    };
    for (const shape &sh : shapes) {
        if (fp8_only) break;
        const int m = sh.m, n = sh.n, k = sh.k;
        const double flop = 2.0 * m * n * (double)k;
        const float def = time_us(s, [&] {
            CHECKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k,
                                &zero, y, CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
        /* f32 out added to what it holds (beta 1): the o or down GEMM adding into the f32 residual stream */
        const float acc = time_us(s, [&] {
            CHECKB(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k,
                                &one, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
        lt_problem pr = problem_make(CUDA_R_16BF, m, n, k);
        const cublasLtMatmulDesc_t op = pr.op;
        const cublasLtMatrixLayout_t la = pr.a, lb = pr.b, lc = pr.d;
        cublasLtMatmulHeuristicResult_t res[32];
        const int found = problem_heuristic(lt, pr, res);
        float best = 1e30f, first = 0;
        int bi = -1;
        for (int i = 0; i < found; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            const float us = time_us(s, [&] {
                CHECKB(cublasLtMatmul(lt, op, &one, w, la, x, lb, &zero, y, lc, y, lc, &res[i].algo, ws, WS, s));
            });
            if (i == 0) first = us;
            if (us < best) {
                best = us;
                bi = i;
            }
        }
        printf("%-20s m %5d n %d k %5d: default %7.1f us (%4.0f TF)  lt first %7.1f us  best %7.1f us (%4.0f TF, "
               "algo %d of %d) %+.1f%%  f32 += C %7.1f us\n",
               sh.name, m, n, k, def, flop / def * 1e-6, first, best, flop / best * 1e-6, bi, found,
               (best / def - 1) * 100, acc);
        problem_free(pr);
    }
    fp8_block(s, lt, ws, shapes, sizeof shapes / sizeof *shapes);
    return 0;
}
