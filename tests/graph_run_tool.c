/* graph_run_tool.c: the test harness of captured graphs - a msgpack bundle on stdin (a graph,
 * its f32 inputs and weights), the graph decoded, validated and run by src/capture, outputs on stdout.
 *
 * stdin:  {"graph": bin, "inputs": [bin f32 LE...], "weights": [bin f32 LE...]}
 * stdout: {"ok": true, "outputs": [{"shape": [...], "dtype": "f32|i64|bool", "data": bin f32 LE}]}
 *      or {"ok": false, "status": int, "name": "DJ_E...", "kind": "CYCLE", "node": int, "op": str,
 *          "message": str}
 * python/djinn/capture.py's ToolExecutor drives it (python/tests/test_capture.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture_impl.h"
#include "djinn/backend.h"
#include "djinn/capture.h"

/* ---- a tiny msgpack writer onto stdout ---- */
static void w_be(uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--) putchar((int)(v >> (8 * i)) & 0xff);
}
static void w_map(uint32_t n) { putchar(0xdf), w_be(n, 4); }
static void w_arr(uint32_t n) { putchar(0xdd), w_be(n, 4); }
static void w_str(const char *s) {
    const size_t n = strlen(s);
    putchar(0xdb), w_be(n, 4);
    fwrite(s, 1, n, stdout);
}
static void w_int(int64_t v) { putchar(0xd3), w_be((uint64_t)v, 8); }
static void w_bool(int b) { putchar(b ? 0xc3 : 0xc2); }
static void w_bin(const void *p, size_t n) {
    putchar(0xc6), w_be(n, 4);
    fwrite(p, 1, n, stdout);
}

static void reply_error(dj_status st, const dj_cgraph_error *e, const char *msg) {
    w_map(7);
    w_str("ok"), w_bool(0);
    w_str("status"), w_int(st);
    w_str("name"), w_str(dj_status_name(st));
    w_str("kind"), w_str(e ? dj_cgraph_err_name(e->kind) : "NONE");
    w_str("node"), w_int(e ? e->node : -1);
    w_str("op"), w_str(e ? e->op : "");
    w_str("message"), w_str(msg);
}

/* A list of f32 buffers: want[i] elements each. */
static dj_status read_bufs(dj__mp *m, uint32_t n, const dj_ctensor_info *(*info)(const dj_cgraph_t *, uint32_t),
                           const dj_cgraph_t *g, const float **out, const char *what) {
    uint32_t cnt;
    if (!dj__mp_array(m, &cnt)) return dj_fail(DJ_EFORMAT, "%s is not an array", what);
    if (cnt != n) return dj_fail(DJ_EINVAL, "%u %s sent, the graph has %u", cnt, what, n);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *p;
        uint32_t len;
        if (!dj__mp_bin(m, &p, &len)) return dj_fail(DJ_EFORMAT, "%s %u is not bin", what, i);
        if ((uint64_t)len != info(g, i)->numel * 4)
            return dj_fail(DJ_EINVAL, "%s %u: %u bytes for %llu f32 values", what, i, len,
                           (unsigned long long)info(g, i)->numel);
        float *f = malloc(len ? len : 4); /* bin bytes are not aligned for floats */
        if (!f) return dj_fail(DJ_ENOMEM, "out of memory");
        memcpy(f, p, len);
        out[i] = f;
    }
    return DJ_OK;
}

int main(void) {
    size_t cap = 1 << 20, len = 0;
    uint8_t *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + len, 1, cap - len, stdin)) > 0;) {
        len += r;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    if (!buf) return 2;
    dj_cgraph_t *g = NULL;
    const float **in = NULL, **wt = NULL, **outs = NULL;
    uint32_t ni = 0, nw = 0, no = 0;
    void *stack = NULL;
    dj_backend_t *cpu = NULL;
    dj_cgraph_error err;
    dj__mp m = {buf, buf + len};
    uint32_t nk;
    const uint8_t *graph = NULL, *inputs_at = NULL, *weights_at = NULL;
    uint32_t graph_len = 0;
    dj_status st = dj__mp_map(&m, &nk) ? DJ_OK : dj_fail(DJ_EFORMAT, "the bundle is not a map");
    for (uint32_t i = 0; st == DJ_OK && i < nk; i++) {
        const char *k;
        uint32_t kn;
        if (!dj__mp_str(&m, &k, &kn)) {
            st = dj_fail(DJ_EFORMAT, "a bundle key is not a string");
        } else if (kn == 5 && !memcmp(k, "graph", 5)) {
            if (!dj__mp_bin(&m, &graph, &graph_len)) st = dj_fail(DJ_EFORMAT, "graph is not bin");
        } else {
            if (kn == 6 && !memcmp(k, "inputs", 6)) inputs_at = m.p;
            if (kn == 7 && !memcmp(k, "weights", 7)) weights_at = m.p;
            if (!dj__mp_skip(&m, 4)) st = dj_fail(DJ_EFORMAT, "a bundle value is malformed");
        }
    }
    if (st == DJ_OK && (!graph || !inputs_at || !weights_at))
        st = dj_fail(DJ_EFORMAT, "the bundle needs graph, inputs, weights");
    if (st != DJ_OK) {
        reply_error(st, NULL, dj_last_error());
        goto out;
    }
    st = dj_cgraph_decode(graph, graph_len, NULL, &g, &err);
    if (st != DJ_OK) {
        reply_error(st, &err, err.msg);
        goto out;
    }
    ni = dj_cgraph_n_inputs(g), nw = dj_cgraph_n_weights(g), no = dj_cgraph_n_outputs(g);
    in = calloc(ni + 1, sizeof *in), wt = calloc(nw + 1, sizeof *wt), outs = calloc(no + 1, sizeof *outs);
    if (!in || !wt || !outs) {
        reply_error(DJ_ENOMEM, NULL, "out of memory");
        goto out;
    }
    m.p = inputs_at;
    st = read_bufs(&m, ni, dj_cgraph_input, g, in, "inputs");
    if (st == DJ_OK) {
        m.p = weights_at;
        st = read_bufs(&m, nw, dj_cgraph_weight, g, wt, "weights");
    }
    if (st == DJ_OK) {
        const size_t sb = dj_cgraph_stack_bytes(g);
        stack = aligned_alloc(64, sb ? sb : 64);
        if (stack) memset(stack, 0xff, sb); /* NaN everywhere: a kernel reading what nothing wrote shows in the outputs */
        st = stack ? dj_backend_cpu_new(1, &cpu) : dj_fail(DJ_ENOMEM, "no memory for a stack of %zu bytes", sb);
    }
    if (st == DJ_OK) st = dj_cgraph_run(g, cpu, in, wt, stack, outs);
    if (st != DJ_OK) {
        reply_error(st, NULL, dj_last_error());
    } else {
        w_map(2);
        w_str("ok"), w_bool(1);
        w_str("outputs"), w_arr(no);
        for (uint32_t i = 0; i < no; i++) {
            const dj_ctensor_info *t = dj_cgraph_output(g, i);
            w_map(3);
            w_str("shape"), w_arr(t->rank);
            for (uint32_t k = 0; k < t->rank; k++) w_int(t->shape[k]);
            w_str("dtype"), w_str(dj_cdtype_name(t->dtype));
            w_str("data"), w_bin(outs[i], t->numel * 4);
        }
    }
out:
    for (uint32_t i = 0; in && i < ni; i++) free((void *)in[i]);
    for (uint32_t i = 0; wt && i < nw; i++) free((void *)wt[i]);
    free(in), free(wt), free(outs), free(stack), free(buf);
    dj_backend_free(cpu);
    dj_cgraph_free(g);
    return 0;
}
