/* cuda_attention_wg.cu: prefill attention on Hopper's warpgroup MMA (wgmma,
 * sm_90a): bf16 pages, head_dim 128, causal with pos0, sliding windows, GQA.
 *
 * A block takes 128 query rows of one head, three warpgroups (384 threads):
 * - warpgroup 0 is the producer; one warp of it issues every load as TMA
 *   (cp.async.bulk.tensor): the block's Q tile once (a 3D map over
 *   [n][nh][128], rows past n read as zeros) and, per 128-key tile, K and V
 *   into a ring of two stages each. The K/V map is 5D over the paged layout,
 *   {dim, kv head, row in page, K or V, page}, so one box is up to 128 rows
 *   of one page (tpp a power of two from 8: a tile is whole boxes, each box
 *   starts on a 1024-byte swizzle atom); lane l loads box l/2, half l%2 of
 *   the head_dim (64 dims = 128 bytes, the 128-byte swizzle's span), the
 *   page taken from the block table. mbarriers hand stages over: "full"
 *   (expect_tx + the TMA bytes), "empty" (every consumer warp done reading).
 * - warpgroups 1 and 2 are consumers, 64 query rows each. Per tile:
 *   S = Q K^T as 8 wgmma m64n128k16 (both operands K-major from the
 *   swizzled tiles), mask and online softmax in registers (the C fragment
 *   layout is mma.sync's, so P becomes the A operand from registers
 *   without moving), O += P V as 8 wgmma with V transposed (MN-major: V is
 *   [key][dim] in the pages). The two consumers drift apart, so one's
 *   softmax runs beside the other's MMAs.
 * Tried and not kept (H100, 2048 rows, 32:8 heads; this kernel 86.5-89.4 us
 * over four runs):
 * issuing the next tile's S before this one's P V, the softmax beside it
 * (FA3's intra-warpgroup overlap) needs S, P and O live at once, more than
 * the 168 registers ptxas gives a thread of 384 here, setmaxnreg 40/232 for
 * the producer/consumers or not (it spilled and serialized the wgmmas:
 * 103.9 us); the consumers taking turns at the MMAs
 * through named barriers (FA3's ping-pong): 86.0-86.9 us, no gain; three
 * K/V stages with the pages read a tile ahead: 88.1-88.8 us.
 * Key tiles start at multiples of 128 (page-aligned); the masks take care of
 * the window's start and the causal edge. Keys past the context's last
 * position are read from valid pages anyway (fewer branches in the byte
 * count) and their V rows are zeroed in shared memory before the last P V:
 * P is 0 there, but a page's unwritten rows may hold NaNs and 0 * NaN = NaN.
 * The Q8 instantiation also writes the output as the FP8 block GEMM's
 * activations (e4m3 codes and a scale per row and head - a head is one
 * group of 128 channels - with quant_group's arithmetic, bit for bit the
 * quantization kernel's), for the plan step that runs o's FP8 GEMM after it
 * (cuda_matmul_fp8_lt.cu); the bf16 output then only where something
 * else reads it.
 * The dispatcher (cuda_attention.cu) sends every other shape to the
 * mma.sync kernel (cuda_attention_tc.cu). */
#include <cuda.h> /* CUtensorMap and its enums only: the encoder comes through the runtime */
#include <math.h>

#include "backend/cuda/attn_rows.cuh"
#include "backend/cuda/cuda_impl.h"

#define WG_HD 128     /* head_dim */
#define WG_BM 128     /* query rows a block, 64 a consumer warpgroup */
#define WG_BN 128     /* keys a K/V tile */
#define WG_THREADS 384
#define WG_TILE_BYTES (WG_BN * WG_HD * 2)  /* a K or V tile: two halves [128 keys][64 dims], 128-byte rows */
#define WG_HALF_BYTES (WG_TILE_BYTES / 2)
#define WG_Q_BYTES (WG_BM * WG_HD * 2)     /* [warpgroup][half][64 rows][64 dims] */
/* Q, two K stages, two V stages, then the mbarriers; 1024 of slack to align the base to a swizzle atom */
#define WG_BARS (WG_Q_BYTES + 4 * WG_TILE_BYTES)
#define WG_SMEM (WG_BARS + 9 * 8 + 1024)

struct wg_args {
    __nv_bfloat16 *out;    /* [n][nh][128]; NULL (Q8 only): not stored */
    uint8_t *codes;        /* Q8: the output's e4m3 codes [n][nh * 128], a head one group of 128 channels */
    float *scales;         /* Q8: a group's scale at [row * nh + head] (tok_major) or [head * ld + row], ld
                            * dj__f8_scale_ld(n) */
    bool tok_major;
    const uint32_t *table; /* device block table */
    uint32_t n, nh, group, pos0, window;
    uint32_t tpp_log2;     /* tokens per page = 1 << tpp_log2 */
    uint32_t box;          /* keys a TMA box: min(tpp, 128) */
    float scale_log2;      /* scale * log2(e): p = 2^(dot * scale_log2 - max) */
};

/* ---- PTX wrappers (mbarriers, TMA, wgmma) ---- */

static __device__ __forceinline__ uint32_t wg_smem(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
    return done != 0;
}
/* Until the barrier's phase of this parity completed. try_wait suspends in
 * hardware for a while before it answers false; a wait stuck for 2 s (a
 * protocol bug: the kernel takes well under a millisecond) traps, so the
 * launch fails instead of hanging the stream. */
static __device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    if (mbar_try_wait(bar, parity)) return;
    uint64_t t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (uint32_t spin = 1;; spin++) {
        if (mbar_try_wait(bar, parity)) return;
        if (spin % 256 == 0) {
            uint64_t t;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
            if (t - t0 > 2000000000ull) __trap();
        }
    }
}
static __device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [%0];\n\t}" ::"r"(bar) : "memory");
}
/* One arrival plus the bytes the phase's TMA loads will bring. */
static __device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}

static __device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2,
                                                   uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3, %4}], [%5];" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
static __device__ __forceinline__ void tma_load_5d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2,
                                                   int c3, int c4, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
                 "%3, %4, %5, %6}], [%7];" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
                 : "memory");
}

/* Shared-memory descriptor of a 128-byte-swizzled operand (swizzle mode 1
 * in bits 62-63; every tile starts on a 1024-byte atom, so base offset 0).
 * K-major (Q, K): rows of 128 bytes, 8-row groups sbo = 1024 apart, lbo
 * unused; a k-step of 16 inside the row adds 32 bytes to the start (the
 * hardware swizzles the address as TMA did). MN-major (V): 64 dims of a key
 * a 128-byte row, 8-key groups sbo = 1024 apart along k, the next 64 dims
 * lbo apart. */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t saddr, uint32_t lbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | (uint64_t)(lbo >> 4) << 16 | (uint64_t)(1024 >> 4) << 32 |
           (uint64_t)1 << 62;
}

#define F4(a, i) "+f"(a[i]), "+f"(a[i + 1]), "+f"(a[i + 2]), "+f"(a[i + 3])
#define F16(a, i) F4(a, i), F4(a, i + 4), F4(a, i + 8), F4(a, i + 12)
#define F64(a) F16(a, 0), F16(a, 16), F16(a, 32), F16(a, 48)
#define WG_D64                                                                                                         \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
    "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "   \
    "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* D (64 x 128 f32) = A B (+ D when acc): A and B from shared memory, both K-major. */
static __device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int acc) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %66, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64 ", %64, %65, p, 1, 1, 0, 0;\n\t}"
                 : F64(d)
                 : "l"(da), "l"(db), "r"(acc)
                 : "memory");
}
/* D += A B: A (64 x 16 bf16) from registers in the mma.sync A fragment layout, B MN-major (transposed). */
static __device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %69, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_D64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n\t}"
                 : F64(d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)
                 : "memory");
}
/* Orders this thread's earlier register accesses before the next wgmmas. */
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
/* Until every committed group is done. The accumulator in flight is an
 * in-out operand, so the compiler cannot move its reads above the wait. */
static __device__ __forceinline__ void wgmma_wait(float (&d)[64]) {
    asm volatile("wgmma.wait_group.sync.aligned 0;" : F64(d) : : "memory");
}
/* Keeps registers a pending wgmma reads (P) alive and unmoved up to here. */
static __device__ __forceinline__ void wg_keep(uint32_t (&p)[8][4]) {
#pragma unroll
    for (int i = 0; i < 8; i++)
        asm volatile("" : "+r"(p[i][0]), "+r"(p[i][1]), "+r"(p[i][2]), "+r"(p[i][3])::"memory");
}


/* ---- the kernel ---- */

template <bool Q8>
static __global__ void __launch_bounds__(WG_THREADS, 1)
    attn_wg_kernel(const __grid_constant__ CUtensorMap qmap, const __grid_constant__ CUtensorMap kvmap, wg_args a) {
    extern __shared__ __align__(1024) unsigned char wg_raw[];
    const uint32_t base = (wg_smem(wg_raw) + 1023) & ~1023u;
    const uint32_t qs = base, ks = base + WG_Q_BYTES, vs = ks + 2 * WG_TILE_BYTES, bars = base + WG_BARS;
    const uint32_t qfull = bars;
    auto kfull = [&](uint32_t s) { return bars + 8 + 8 * s; };
    auto vfull = [&](uint32_t s) { return bars + 24 + 8 * s; };
    auto kempty = [&](uint32_t s) { return bars + 40 + 8 * s; };
    auto vempty = [&](uint32_t s) { return bars + 56 + 8 * s; };

    const uint32_t h = blockIdx.x, r0 = (gridDim.y - 1 - blockIdx.y) * WG_BM, kvh = h / a.group;
    const uint32_t rows_end = min(r0 + WG_BM, a.n);
    const uint32_t hi = a.pos0 + rows_end - 1; /* last position any row of the block sees */
    const uint32_t tlo = attn_first_pos(a.pos0 + r0, a.window) & ~(uint32_t)(WG_BN - 1);
    const uint32_t tiles = (hi - tlo) / WG_BN + 1;
    const uint32_t wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;

    if (threadIdx.x == 0) {
        mbar_init(qfull, 1);
        for (uint32_t s = 0; s < 2; s++) {
            mbar_init(kfull(s), 1); /* the producer's expect_tx (+ the TMA bytes) */
            mbar_init(vfull(s), 1);
            mbar_init(kempty(s), 8); /* one arrival a consumer warp */
            mbar_init(vempty(s), 8);
        }
        /* the initialized barriers visible to the async proxy (TMA's complete_tx) */
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) { /* producer */
        if (warp != 0) return;
        if (lane == 0) {
            asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)&qmap) : "memory");
            asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)&kvmap) : "memory");
            /* a consumer whose rows all lie past n loads no Q (its outputs are never stored) */
            mbar_expect(qfull, r0 + 64 < a.n ? WG_Q_BYTES : WG_Q_BYTES / 2);
        }
        __syncwarp();
        if (lane < 4 && r0 + (lane / 2) * 64 < a.n) /* consumer lane/2's 64 rows, dims (lane%2)*64.. */
            tma_load_3d(qs + (lane / 2) * (WG_Q_BYTES / 2) + (lane % 2) * (WG_Q_BYTES / 4), &qmap, (int)(lane % 2) * 64,
                        (int)h, (int)(r0 + (lane / 2) * 64), qfull);
        /* lane l: box l/2 of the tile, dims (l%2)*64..; boxes past the tile's 128 keys idle */
        const uint32_t bx = lane / 2, half = lane % 2, mine = bx * a.box < WG_BN;
        const uint32_t last_box = hi & ~(a.box - 1); /* first key of the box holding hi */
        for (uint32_t i = 0; i < tiles; i++) {
            const uint32_t s = i & 1, ph = (i >> 1) & 1, t = tlo + i * WG_BN;
            const uint32_t key = min(t + bx * a.box, last_box); /* boxes past hi: read the last one again */
            const uint32_t page = mine ? a.table[key >> a.tpp_log2] : 0;
            const int row = (int)(key & ((1u << a.tpp_log2) - 1));
            const uint32_t off = half * WG_HALF_BYTES + bx * a.box * 128;
            mbar_wait(kempty(s), ph ^ 1);
            if (lane == 0) mbar_expect(kfull(s), WG_TILE_BYTES);
            __syncwarp();
            if (mine) tma_load_5d(ks + s * WG_TILE_BYTES + off, &kvmap, (int)half * 64, (int)kvh, row, 0, (int)page, kfull(s));
            mbar_wait(vempty(s), ph ^ 1);
            if (lane == 0) mbar_expect(vfull(s), WG_TILE_BYTES);
            __syncwarp();
            if (mine) tma_load_5d(vs + s * WG_TILE_BYTES + off, &kvmap, (int)half * 64, (int)kvh, row, 1, (int)page, vfull(s));
        }
        return;
    }

    /* consumers */
    const uint32_t c = wg - 1, tid = threadIdx.x - 128 * wg, g = lane / 4, c4 = lane % 4;
    /* this thread's rows in every fragment: a = 16 warp + g of the warpgroup's 64, b = a + 8 */
    const uint32_t pa = a.pos0 + r0 + 64 * c + 16 * warp + g, pb = pa + 8;
    const uint32_t fa = attn_first_pos(pa, a.window), fb = attn_first_pos(pb, a.window);
    /* keys up to wmin and from wfirst are visible to every row of the warpgroup: tiles inside need no mask */
    const uint32_t w0 = a.pos0 + r0 + 64 * c, wmin = min(w0, hi), wfirst = attn_first_pos(w0 + 63, a.window);
    const uint32_t qc = qs + c * (WG_Q_BYTES / 2);

    float o[64], s[64];
    uint32_t pf[8][4]; /* P as A fragments, k-step kk = keys 16kk.. of the tile */
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f; /* l: this thread's columns only */
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.0f;

    /* S = Q K^T of stage st, committed (not waited for). */
    /* The descriptors of a k-step are the first one's plus the step's offset / 16 (the start
     * address field): made per tile from an opaque base, so that the compiler does not keep
     * every step's descriptor of both stages in registers across the loop. */
    auto issue_qk = [&](uint32_t st) {
        uint64_t dq = wg_desc(qc, 16), dk = wg_desc(ks + st * WG_TILE_BYTES, 16);
        asm volatile("" : "+l"(dq), "+l"(dk));
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < WG_HD / 16; k++)
            wgmma_ss(s, dq + (((k / 4) * (WG_Q_BYTES / 4) + (k % 4) * 32) >> 4),
                     dk + (((k / 4) * WG_HALF_BYTES + (k % 4) * 32) >> 4), k > 0);
        wgmma_commit();
    };
    /* O += P V of stage st, committed. */
    auto issue_pv = [&](uint32_t st) {
        uint64_t dv = wg_desc(vs + st * WG_TILE_BYTES, WG_HALF_BYTES);
        asm volatile("" : "+l"(dv));
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < WG_BN / 16; kk++) wgmma_rs(o, pf[kk], dv + ((kk * 2048) >> 4));
        wgmma_commit();
    };
    /* Mask and online softmax of the scores of the tile at key t: s becomes
     * P (f32), m and l move on; returns the rows' output corrections. Element
     * e of n-block j is key 8j + 2 c4 + (e & 1) of the tile, row a (e < 2) or b. */
    auto softmax = [&](uint32_t t, float &corr_a, float &corr_b) {
        float mx_a = -INFINITY, mx_b = -INFINITY;
        if (t + WG_BN - 1 <= wmin && t >= wfirst) {
#pragma unroll
            for (int i = 0; i < 64; i++) {
                if (i & 2)
                    mx_b = fmaxf(mx_b, s[i]);
                else
                    mx_a = fmaxf(mx_a, s[i]);
            }
        } else {
            /* row a sees the tile's keys [fra, lra], row b [frb, lrb] */
            const int64_t t0 = (int64_t)t;
            const int lra = (int)max(min((int64_t)min(pa, hi) - t0, (int64_t)WG_BN), (int64_t)-1);
            const int lrb = (int)max(min((int64_t)min(pb, hi) - t0, (int64_t)WG_BN), (int64_t)-1);
            const int fra = (int)max(min((int64_t)fa - t0, (int64_t)WG_BN), (int64_t)0);
            const int frb = (int)max(min((int64_t)fb - t0, (int64_t)WG_BN), (int64_t)0);
#pragma unroll
            for (int i = 0; i < 64; i++) {
                const int kk = (i / 4) * 8 + (int)c4 * 2 + (i & 1);
                const bool rb = (i & 2) != 0;
                const bool ok = kk <= (rb ? lrb : lra) && kk >= (rb ? frb : fra);
                const float v = ok ? s[i] : -INFINITY;
                s[i] = v;
                if (rb)
                    mx_b = fmaxf(mx_b, v);
                else
                    mx_a = fmaxf(mx_a, v);
            }
        }
        /* the four lanes of a quad share the rows */
        attn_quad_max(mx_a, mx_b);
        const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
        /* the max stays in the scores' domain; a row with nothing visible yet keeps base 0:
         * 2^(-inf - 0) = 0, never NaN. A row whose max held keeps corr exactly 1. */
        const float k2 = a.scale_log2;
        const float nb_a = -(mn_a == -INFINITY ? 0.0f : mn_a) * k2;
        const float nb_b = -(mn_b == -INFINITY ? 0.0f : mn_b) * k2;
        corr_a = mn_a == m_a ? 1.0f : attn_ex2(fmaf(m_a, k2, nb_a));
        corr_b = mn_b == m_b ? 1.0f : attn_ex2(fmaf(m_b, k2, nb_b));
        m_a = mn_a;
        m_b = mn_b;
        float sa = 0.0f, sb = 0.0f;
#pragma unroll
        for (int i = 0; i < 64; i += 4) {
            s[i] = attn_ex2(fmaf(s[i], k2, nb_a));
            s[i + 1] = attn_ex2(fmaf(s[i + 1], k2, nb_a));
            s[i + 2] = attn_ex2(fmaf(s[i + 2], k2, nb_b));
            s[i + 3] = attn_ex2(fmaf(s[i + 3], k2, nb_b));
            sa += s[i] + s[i + 1];
            sb += s[i + 2] + s[i + 3];
        }
        l_a = l_a * corr_a + sa;
        l_b = l_b * corr_b + sb;
    };
    auto rescale = [&](float corr_a, float corr_b) {
        if (__any_sync(0xffffffffu, corr_a != 1.0f || corr_b != 1.0f))
#pragma unroll
            for (int i = 0; i < 64; i += 4) {
                o[i] *= corr_a;
                o[i + 1] *= corr_a;
                o[i + 2] *= corr_b;
                o[i + 3] *= corr_b;
            }
    };
    /* C fragments of n-blocks 2kk, 2kk+1 are exactly the A fragment of keys 16kk..16kk+15. */
    auto pack = [&]() {
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            pf[kk][0] = attn_pack_bf16(s[8 * kk], s[8 * kk + 1]);
            pf[kk][1] = attn_pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
            pf[kk][2] = attn_pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
            pf[kk][3] = attn_pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
        }
    };
    /* The V tile at key t in stage st: rows past hi zeroed (the last tile only), visible to this
     * warpgroup's wgmmas (proxy fence, then the warpgroup's named barrier). */
    auto v_ready = [&](uint32_t t, uint32_t st) {
        if (t + WG_BN - 1 > hi) {
            const uint32_t keep = hi - t + 1, vt = vs + st * WG_TILE_BYTES;
            for (uint32_t e = tid; e < (WG_BN - keep) * 16; e += 128) {
                const uint32_t row = keep + e / 16, hf = (e / 8) % 2, q = e % 8;
                asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(vt + hf * WG_HALF_BYTES + row * 128 + q * 16),
                             "r"(0u)
                             : "memory");
            }
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            asm volatile("bar.sync %0, 128;" ::"r"(1 + c) : "memory");
        }
    };

    mbar_wait(qfull, 0);
    float corr_a, corr_b;
    for (uint32_t i = 0; i < tiles; i++) {
        const uint32_t st = i & 1, ph = (i >> 1) & 1, t = tlo + i * WG_BN;
        mbar_wait(kfull(st), ph);
        issue_qk(st);
        wgmma_wait(s);
        if (lane == 0) mbar_arrive(kempty(st));
        softmax(t, corr_a, corr_b);
        rescale(corr_a, corr_b);
        pack();
        mbar_wait(vfull(st), ph);
        v_ready(t, st);
        issue_pv(st);
        wgmma_wait(o);
        wg_keep(pf);
        if (lane == 0) mbar_arrive(vempty(st));
    }

    l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
    l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
    /* every real row sees at least its own position, so l > 0 there */
    const float inv_a = 1.0f / l_a, inv_b = 1.0f / l_b;
    const uint32_t ia = pa - a.pos0, ib = ia + 8;
    if constexpr (Q8) {
        /* The rows as bf16 (what the plain kernel stores), then each row's head - one group of 128
         * channels, over the quad's four lanes - to e4m3 codes and its scale with quant_group's
         * arithmetic (quant_group.cuh), so the codes are the quantization kernel's bit for bit. */
        float am_a = 0.0f, am_b = 0.0f;
#pragma unroll
        for (int i = 0; i < 64; i += 4) {
            o[i] = __bfloat162float(__float2bfloat16_rn(o[i] * inv_a));
            o[i + 1] = __bfloat162float(__float2bfloat16_rn(o[i + 1] * inv_a));
            o[i + 2] = __bfloat162float(__float2bfloat16_rn(o[i + 2] * inv_b));
            o[i + 3] = __bfloat162float(__float2bfloat16_rn(o[i + 3] * inv_b));
            am_a = fmaxf(am_a, fmaxf(fabsf(o[i]), fabsf(o[i + 1])));
            am_b = fmaxf(am_b, fmaxf(fabsf(o[i + 2]), fabsf(o[i + 3])));
        }
        attn_quad_max(am_a, am_b);
        const float sc_a = fmaxf(am_a, 1e-12f) / 448.0f, sc_b = fmaxf(am_b, 1e-12f) / 448.0f;
        const float q_a = 1.0f / sc_a, q_b = 1.0f / sc_b;
        /* codes: lanes c4 and c4 ^ 1 trade a pair so that each stores 4 bytes - the even lane row a's,
         * the odd one row b's, columns (c4 & 2) * 2 .. + 3 of each 8 */
        const size_t ld = (size_t)a.nh * WG_HD;
        const bool odd = c4 & 1;
        const uint32_t row = odd ? ib : ia;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t col = j * 8 + c4 * 2;
            if (a.out && ia < a.n)
                *(__nv_bfloat162 *)(a.out + ((size_t)ia * a.nh + h) * WG_HD + col) =
                    __floats2bfloat162_rn(o[4 * j], o[4 * j + 1]);
            if (a.out && ib < a.n)
                *(__nv_bfloat162 *)(a.out + ((size_t)ib * a.nh + h) * WG_HD + col) =
                    __floats2bfloat162_rn(o[4 * j + 2], o[4 * j + 3]);
            const uint32_t ca = __nv_cvt_float2_to_fp8x2(make_float2(o[4 * j] * q_a, o[4 * j + 1] * q_a),
                                                         __NV_SATFINITE, __NV_E4M3);
            const uint32_t cb = __nv_cvt_float2_to_fp8x2(make_float2(o[4 * j + 2] * q_b, o[4 * j + 3] * q_b),
                                                         __NV_SATFINITE, __NV_E4M3);
            const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? ca : cb, 1);
            if (row < a.n)
                *(uint32_t *)(a.codes + row * ld + h * WG_HD + j * 8 + (c4 & 2) * 2) =
                    odd ? got | cb << 16 : ca | got << 16;
        }
        if (c4 == 0) {
            if (ia < a.n) a.scales[a.tok_major ? (size_t)ia * a.nh + h : (size_t)h * dj__f8_scale_ld(a.n) + ia] = sc_a;
            if (ib < a.n) a.scales[a.tok_major ? (size_t)ib * a.nh + h : (size_t)h * dj__f8_scale_ld(a.n) + ib] = sc_b;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const uint32_t col = j * 8 + c4 * 2;
            if (ia < a.n)
                *(__nv_bfloat162 *)(a.out + ((size_t)ia * a.nh + h) * WG_HD + col) =
                    __floats2bfloat162_rn(o[4 * j] * inv_a, o[4 * j + 1] * inv_a);
            if (ib < a.n)
                *(__nv_bfloat162 *)(a.out + ((size_t)ib * a.nh + h) * WG_HD + col) =
                    __floats2bfloat162_rn(o[4 * j + 2] * inv_b, o[4 * j + 3] * inv_b);
        }
    }
}

/* ---- host side ---- */

/* cuTensorMapEncodeTiled's signature (the driver API's), fetched through the runtime: no -lcuda. */
typedef CUresult (*wg_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static bool wg_pow2(uint32_t x) { return x && !(x & (x - 1)); }

bool dj__cuda_attention_wg_covers(const dj_cuda_backend *cb, const dj_op_call *c) {
    const dj_kv_view *kv = c->kv;
    const uint32_t tpp = kv->tokens_per_page;
    return cb->tmap_encode && c->head_dim == WG_HD && kv->dtype == DJ_DTYPE_BF16 && c->softcap == 0.0f &&
           !c->row_pos && !c->row_tables && c->n >= 1 && (c->n + WG_BM - 1) / WG_BM <= 65535u && wg_pow2(tpp) &&
           tpp >= 8 && kv->kv_dim % WG_HD == 0 && c->n_kv_heads >= 1 && c->n_heads % c->n_kv_heads == 0 &&
           c->n_kv_heads <= kv->kv_dim / WG_HD && ((uintptr_t)kv->seg_base & 15u) == 0 && kv->page_bytes % 16 == 0 &&
           ((uintptr_t)c->x & 15u) == 0 && ((uintptr_t)c->out & 3u) == 0 && (uint64_t)c->pos0 + c->n <= INT32_MAX;
}

dj_status dj__cuda_attention_wg_init(dj_cuda_backend *cb) {
    cb->tmap_encode = NULL;
    cudaDeviceProp prop;
    DJ_CU(cb, cudaGetDeviceProperties(&prop, cb->device));
    if (prop.major != 9) return DJ_OK; /* sm_90a code: Hopper only */
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn) {
        (void)cudaGetLastError(); /* no encoder: the mma.sync kernel takes every call */
        return DJ_OK;
    }
    DJ_CU(cb, cudaFuncSetAttribute(attn_wg_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM));
    DJ_CU(cb, cudaFuncSetAttribute(attn_wg_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM));
    cb->tmap_encode = fn;
    return DJ_OK;
}

dj_status dj__cuda_attention_wg(dj_cuda_backend *cb, const dj_op_call *c, const uint32_t *table_dev, uint8_t *codes,
                                float *scales, bool tok_major, bool store) {
    const dj_kv_view *kv = c->kv;
    const wg_encode_fn encode = (wg_encode_fn)cb->tmap_encode;
    const uint32_t tpp = kv->tokens_per_page, nkv = kv->kv_dim / WG_HD;
    CUtensorMap qmap, kvmap;
    /* Q [n][nh][128]: boxes of 64 rows x 64 dims; rows past n read as zeros */
    const cuuint64_t qdim[3] = {WG_HD, c->n_heads, c->n};
    const cuuint64_t qstride[2] = {WG_HD * 2, (cuuint64_t)c->n_heads * WG_HD * 2};
    const cuuint32_t qbox[3] = {64, 1, 64}, ones[5] = {1, 1, 1, 1, 1};
    CUresult r = encode(&qmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)c->x, qdim, qstride, qbox, ones,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return dj_fail(DJ_EDEVICE, "cuda:%d %s: Q tensor map: error %d", cb->device, __func__, (int)r);
    /* K/V pages {dim, kv head, row in page, K|V, page}. The page count is not known here (the
     * table names pages, the segment's size is the caller's): as many as strides below 2^40
     * bytes allow, so that no page the table can name reads as out of bounds. */
    const cuuint64_t pages = ((1ull << 40) - 1) / kv->page_bytes;
    const cuuint64_t kdim[5] = {WG_HD, nkv, tpp, 2, pages < INT32_MAX ? pages : INT32_MAX};
    const cuuint64_t kstride[4] = {WG_HD * 2, (cuuint64_t)kv->kv_dim * 2, (cuuint64_t)tpp * kv->kv_dim * 2,
                                   kv->page_bytes};
    const uint32_t box = tpp < WG_BN ? tpp : WG_BN;
    const cuuint32_t kbox[5] = {64, 1, box, 1, 1};
    r = encode(&kvmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, kv->seg_base, kdim, kstride, kbox, ones,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return dj_fail(DJ_EDEVICE, "cuda:%d %s: K/V tensor map: error %d", cb->device, __func__, (int)r);
    wg_args a;
    a.out = codes && !store ? NULL : (__nv_bfloat16 *)c->out;
    a.codes = codes;
    a.scales = scales;
    a.tok_major = tok_major;
    a.table = table_dev;
    a.n = c->n;
    a.nh = c->n_heads;
    a.group = c->n_heads / c->n_kv_heads;
    a.pos0 = c->pos0;
    a.window = c->window;
    a.tpp_log2 = (uint32_t)__builtin_ctz(tpp);
    a.box = box;
    a.scale_log2 = c->scale * 1.4426950408889634f;
    const dim3 grid(c->n_heads, (c->n + WG_BM - 1) / WG_BM);
    if (codes)
        attn_wg_kernel<true><<<grid, WG_THREADS, WG_SMEM, cb->stream>>>(qmap, kvmap, a);
    else
        attn_wg_kernel<false><<<grid, WG_THREADS, WG_SMEM, cb->stream>>>(qmap, kvmap, a);
    DJ_CU_LAUNCHED(cb);
    return DJ_OK;
}
