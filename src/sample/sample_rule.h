/* sample_rule.h: the arithmetic of the sampling rule that the host pick
 * (pick.c) and the CUDA sample kernel share, so that both pick the same id. */
#ifndef DJ_SAMPLE_RULE_H
#define DJ_SAMPLE_RULE_H

#include <math.h>
#include <stdint.h>

#include "djinn/sample_params.h"

#ifdef __CUDACC__
#define DJ_HD __host__ __device__ __forceinline__
#else
#define DJ_HD static inline
#endif

/* Masses are integers: q(w) = floor(w * 2^36) for a weight w in [0, 1], so
 * sums are exact in any order (a row of up to 2^28 ids fits in 64 bits) and
 * weights below 2^-36 of the largest never win a draw. */
#define DJ_SAMPLE_Q_SCALE 68719476736.0 /* 2^36 */
#define DJ_SAMPLE_ONE_BITS 0x3f800000u  /* bits of 1.0f, the largest weight */

/* fma in f32, one rounding, on both sides (host fmaf may be a library call). */
#ifdef __CUDA_ARCH__
#define DJ__FMA(a, b, c) __fmaf_rn((a), (b), (c))
#else
#define DJ__FMA(a, b, c) fmaf((a), (b), (c))
#endif

/* The weight of a logit l with row max mx at temperature t > 0: exp((l -
 * mx) / t) by our own polynomial (not the libm's or the device's expf, which
 * differ by an ulp), so host and device agree bit for bit. NaN weighs 0, as
 * does anything below exp(-32) (its mass would be 0 anyway). */
DJ_HD float dj__sample_weight(float l, float mx, float t) {
    const float d = (l - mx) / t;
    if (!(d >= -32.0f)) return 0.0f; /* NaN, -inf and the far tail */
    const float n = rintf(d * 1.44269504f); /* in [-47, 0] */
    float r = DJ__FMA(-n, 0.693145752f, d); /* ln2 in two parts (Cody-Waite) */
    r = DJ__FMA(-n, 1.42860677e-6f, r);
    float p = 1.98412698e-4f; /* Taylor to r^7: |r| <= 0.35 */
    p = DJ__FMA(p, r, 1.38888889e-3f);
    p = DJ__FMA(p, r, 8.33333333e-3f);
    p = DJ__FMA(p, r, 4.16666667e-2f);
    p = DJ__FMA(p, r, 1.66666667e-1f);
    p = DJ__FMA(p, r, 0.5f);
    p = DJ__FMA(p, r, 1.0f);
    p = DJ__FMA(p, r, 1.0f);
    const float w = ldexpf(p, (int)n);
    return w < 1.0f ? w : 1.0f; /* d = 0 gives exactly 1; never above */
}

DJ_HD uint64_t dj__sample_q(float w) { return (uint64_t)((double)w * DJ_SAMPLE_Q_SCALE); }

/* A logit after the penalties of one observed id: repetition (rep not 0 or
 * 1: positive logits divided by rep, negative multiplied), then sub (the
 * frequency and presence penalties) subtracted. */
DJ_HD float dj__sample_penalize(float l, float rep, float sub) {
    if (rep != 0.0f && rep != 1.0f) l = l > 0.0f ? l / rep : l * rep;
    return l - sub;
}

/* Of the `avail` weights tied at mass q (q > 0) after a prefix of mass
 * above, the fewest j >= 1 with above + j*q >= goal (as doubles): how many of
 * the ties top-p keeps. */
DJ_HD uint32_t dj__sample_ties_for(uint64_t above, uint64_t q, uint32_t avail, double goal) {
    double jd = ceil((goal - (double)above) / (double)q);
    uint32_t j = jd < 1.0 ? 1u : jd > (double)avail ? avail : (uint32_t)jd;
    while (j > 1 && (double)(above + (uint64_t)(j - 1) * q) >= goal) j--;
    while (j < avail && (double)(above + (uint64_t)j * q) < goal) j++;
    return j;
}

/* The rule's floor: after top-k and top-p, the weights below it are dropped
 * (min-p, top-a: rules of that kind), from the row's parameters and `total`,
 * the mass of every id of the row after penalties and temperature (>= 2^36:
 * the largest weight is 1). 0 keeps every weight; it never exceeds 1, so the
 * largest weight always stays. The host pick (pick.c) applies it whole; the
 * CUDA kernel applies min_p, and the engine sends a row with a field that a
 * dj_sample_row does not carry to the host (dj_sample_row_carries). */
DJ_HD float dj__sample_floor(const dj_sampler_params *p, uint64_t total) {
    float f = p->min_p > 0.0f ? p->min_p : 0.0f;
    if (p->top_a > 0.0f) { /* prob >= top_a * pmax^2, pmax = 2^36 / total: w >= top_a * 2^36 / total */
        const double a = (double)p->top_a * DJ_SAMPLE_Q_SCALE / (double)total;
        const float fa = a < 1.0 ? (float)a : 1.0f;
        f = fa > f ? fa : f;
    }
    return f;
}

/* The draw's target in [0, mass): floor(u * mass). */
DJ_HD uint64_t dj__sample_target(double u, uint64_t mass) {
    uint64_t t = (uint64_t)(u * (double)mass);
    return t < mass ? t : mass - 1;
}

#endif
