/* ring.c: the skip-end ring's layout (offsets and each load's dependencies)
 * and the placement of a model's layers between resident and streamed. */
#include <stdlib.h>
#include "djinn/alloc.h"
#include <string.h>

#include "exec/stream_impl.h"

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static bool ranges_meet(size_t a0, size_t a1, size_t b0, size_t b1) { return a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1; }

bool dj_ring_overlap(const dj_ring_layout *r, uint32_t a, uint32_t b) {
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (ranges_meet(r->lo[2 * a + i], r->hi[2 * a + i], r->lo[2 * b + j], r->hi[2 * b + j])) return true;
    return false;
}

void dj_ring_layout_free(dj_ring_layout *r) {
    if (!r) return;
    free(r->off);
    free(r->lo);
    free(r->hi);
    free(r->after);
    free(r->after_at);
    memset(r, 0, sizeof *r);
}

dj_status dj_ring_layout_make(size_t ring_bytes, size_t align, const size_t *bytes, const uint32_t *load, size_t n,
                              uint32_t n_loads, dj_ring_layout *out) {
    memset(out, 0, sizeof *out);
    if (!bytes || !load || n == 0 || n_loads == 0 || align == 0 || ring_bytes == 0)
        return dj_fail(DJ_EINVAL, "ring layout: %zu tensors of %u loads in %zu bytes (align %zu)", n, n_loads,
                       ring_bytes, align);
    for (size_t i = 0; i < n; i++) {
        if (load[i] >= n_loads || (i > 0 && load[i] < load[i - 1]) || (i > 0 && load[i] > load[i - 1] + 1) ||
            (i == 0 && load[0] != 0))
            return dj_fail(DJ_EINVAL, "ring layout: tensor %zu belongs to load %u; loads must run 0..%u in order", i,
                           load[i], n_loads - 1);
        if (bytes[i] == 0 || round_up(bytes[i], align) > ring_bytes)
            return dj_fail(DJ_ENOSPC, "ring layout: a tensor of %zu bytes (load %u) does not fit a ring of %zu bytes",
                           bytes[i], load[i], ring_bytes);
    }
    if (load[n - 1] != n_loads - 1)
        return dj_fail(DJ_EINVAL, "ring layout: the tensors cover loads 0..%u of %u", load[n - 1], n_loads);
    dj_ring_layout r = {.ring_bytes = ring_bytes, .n_loads = n_loads, .n_tensors = n};
    r.off = dj_malloc(n * sizeof *r.off);
    r.lo = dj_calloc(2 * (size_t)n_loads, sizeof *r.lo);
    r.hi = dj_calloc(2 * (size_t)n_loads, sizeof *r.hi);
    r.after_at = dj_calloc((size_t)n_loads + 1, sizeof *r.after_at);
    r.after = dj_malloc((size_t)n_loads * n_loads * sizeof *r.after);
    if (!r.off || !r.lo || !r.hi || !r.after_at || !r.after) {
        dj_ring_layout_free(&r);
        return dj_fail(DJ_ENOMEM, "ring layout: out of memory for %u loads", n_loads);
    }
    /* offsets: one after another, skipping to 0 where a tensor would cross the end */
    size_t cur = 0;
    bool second = false; /* the current load has wrapped: its bytes go on from 0 */
    for (size_t i = 0; i < n; i++) {
        const uint32_t k = load[i];
        const size_t sz = round_up(bytes[i], align);
        const bool first = i == 0 || load[i - 1] != k;
        const bool wrap = cur + sz > ring_bytes;
        if (wrap) cur = 0;
        if (first) {
            second = false;
            r.lo[2 * k] = r.hi[2 * k] = cur;
        } else if (wrap) {
            if (second) {
                dj_ring_layout_free(&r);
                return dj_fail(DJ_ENOSPC, "ring layout: load %u wraps the %zu-byte ring twice", k, ring_bytes);
            }
            second = true;
            r.lo[2 * k + 1] = r.hi[2 * k + 1] = 0;
        }
        r.off[i] = cur;
        cur += sz;
        r.hi[2 * k + (second ? 1 : 0)] = cur;
    }
    for (uint32_t k = 0; k < n_loads; k++) {
        if (ranges_meet(r.lo[2 * k], r.hi[2 * k], r.lo[2 * k + 1], r.hi[2 * k + 1])) {
            const size_t total = (r.hi[2 * k] - r.lo[2 * k]) + (r.hi[2 * k + 1] - r.lo[2 * k + 1]);
            dj_ring_layout_free(&r);
            return dj_fail(DJ_ENOSPC, "ring layout: load %u (%zu bytes) overlaps itself in a ring of %zu bytes", k,
                           total, ring_bytes);
        }
    }
    uint32_t m = 0;
    for (uint32_t k = 0; k < n_loads; k++) {
        r.after_at[k] = m;
        for (uint32_t j = 0; j < n_loads; j++)
            if (j == k || dj_ring_overlap(&r, k, j)) r.after[m++] = j;
    }
    r.after_at[n_loads] = m;
    *out = r;
    return DJ_OK;
}

void dj_placement_free(dj_placement *p) {
    if (!p) return;
    free(p->streamed);
    memset(p, 0, sizeof *p);
}

/* Whether layer l of L is one of S streamed, spread evenly over the depth. */
static bool spread(uint32_t l, uint32_t L, uint32_t S) {
    return (uint64_t)(l + 1) * S / L > (uint64_t)l * S / L;
}

dj_status dj_placement_decide(const size_t *layer_bytes, uint32_t n_layers, size_t max_tensor, size_t global_bytes,
                              size_t room, dj_placement *out) {
    memset(out, 0, sizeof *out);
    if (!layer_bytes || n_layers == 0) return dj_fail(DJ_EINVAL, "placement: no layers");
    out->streamed = dj_calloc(n_layers, 1);
    if (!out->streamed) return dj_fail(DJ_ENOMEM, "placement: out of memory");
    out->n_layers = n_layers;
    size_t all = global_bytes, max_layer = 0;
    for (uint32_t l = 0; l < n_layers; l++) {
        all += layer_bytes[l];
        if (layer_bytes[l] > max_layer) max_layer = layer_bytes[l];
    }
    if (all <= room) {
        out->resident_bytes = all;
        return DJ_OK;
    }
    /* The fewest streamed layers that fit, each through the deepest ring that
     * fits with them. A ring as deep as the streamed layers would hold them
     * all (resident, copied for nothing): it is always shallower. */
    for (uint32_t S = 2; S <= n_layers; S++) {
        for (uint32_t depth = S - 1 < DJ_RING_LAYERS ? S - 1 : DJ_RING_LAYERS; depth >= 1; depth--) {
            const size_t ring = depth * max_layer + max_tensor; /* + the skip at the end */
            size_t resident = global_bytes, streamed = 0;
            for (uint32_t l = 0; l < n_layers; l++) {
                if (spread(l, n_layers, S)) streamed += layer_bytes[l];
                else resident += layer_bytes[l];
            }
            if (resident + ring > room) continue;
            for (uint32_t l = 0; l < n_layers; l++) out->streamed[l] = spread(l, n_layers, S);
            out->n_streamed = S;
            out->resident_bytes = resident;
            out->ring_bytes = ring;
            out->streamed_bytes = streamed;
            out->ring_layers = depth;
            return DJ_OK;
        }
    }
    const size_t least = global_bytes + max_layer + max_tensor;
    dj_placement_free(out);
    return dj_fail(DJ_ENOSPC,
                   "the text budget of %zu bytes (%.1f MiB) cannot run this model even streamed: it needs at least "
                   "%zu bytes (%.1f MiB) - the embedding, head and norms (%zu) and a ring of one layer of %zu bytes "
                   "with room for the skip at its end (%zu) (the whole model is %zu bytes)",
                   room, (double)room / 1048576.0, least, (double)least / 1048576.0, global_bytes, max_layer, max_tensor,
                   all);
}
