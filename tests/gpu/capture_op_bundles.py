"""capture_op_bundles.py: bundles for the ops the capture tests do not record under torch 1.13's
dispatch (overloads torch 2.x graphs and make_fx give: linear, the .Scalar arithmetic, factories...),
one small graph each, built by hand; each checked here against torch on the CPU executor
(graph_run_tool) before it is written, so gpu_capture replays only graphs that are right.
usage: python3 tests/gpu/capture_op_bundles.py OUT_DIR GRAPH_RUN_TOOL"""

import os
import subprocess
import sys

import msgpack
import numpy as np
import torch

A = torch.ops.aten
DT = {torch.float32: "f32", torch.int64: "i64", torch.bool: "bool"}


def spec(t):
    return {"shape": list(t.shape), "dtype": DT[t.dtype]}


def case(name, op, args, inputs, weights=()):
    """One graph: node 0 is op(*args); an arg ("i", k) / ("w", k) is input / weight k."""
    def real(a):
        if isinstance(a, tuple) and len(a) == 2 and a[0] in ("i", "w"):
            return (inputs if a[0] == "i" else weights)[a[1]]
        if isinstance(a, list):
            return [real(x) for x in a]
        return a

    def wire(a):
        if isinstance(a, tuple) and len(a) == 2 and a[0] in ("i", "w"):
            return {a[0]: a[1]}
        if isinstance(a, list):
            return [wire(x) for x in a]
        if isinstance(a, torch.dtype):
            return str(a).replace("torch.", "")
        return a

    pos, kw = [], {}
    for sa, a in zip(op._schema.arguments, args):   # the wire has every argument in order; torch wants kwargs
        if sa.kwarg_only:
            kw[sa.name] = real(a)
        else:
            pos.append(real(a))
    out = op(*pos, **kw)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    g = {"v": 1, "inputs": [spec(t) for t in inputs],
         "weights": [dict(spec(w), name="w%d" % k, hash=bytes([k + 1]) * 16) for k, w in enumerate(weights)],
         "nodes": [{"op": op_name(op),
                    "args": [wire(a) for a in args], "out": [spec(t) for t in outs]}],
         "outputs": [{"n": [0, k]} for k in range(len(outs))]}
    return name, msgpack.packb(g, use_bin_type=True), inputs, weights, outs


def op_name(op):
    # torch.ops.aten.add.Scalar -> "aten.add.Scalar"
    return "aten.%s.%s" % (op.__name__.split(".")[0], op._overloadname)


def cases():
    torch.manual_seed(5)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    img = torch.randn(1, 2, 6, 6)
    w, b = torch.randn(6, 8), torch.randn(6)
    mask = torch.rand(4, 8) > 0.5
    z0 = torch.tensor(-2.5)
    yield case("linear", A.linear.default, [("i", 0), ("w", 0), ("w", 1)], [x], [w, b])
    yield case("add_scalar", A.add.Scalar, [("i", 0), 2.0, 1], [x])
    yield case("sub_scalar", A.sub.Scalar, [("i", 0), 1.5, 2], [x])
    yield case("mul_scalar", A.mul.Scalar, [("i", 0), 3.0], [x])
    yield case("div_scalar", A.div.Scalar, [("i", 0), 4.0], [x])
    yield case("gt_tensor", A.gt.Tensor, [("i", 0), ("i", 1)], [x, y])
    yield case("lt_tensor", A.lt.Tensor, [("i", 0), ("i", 1)], [x, y])
    yield case("lt_scalar", A.lt.Scalar, [("i", 0), 0.1], [x])
    yield case("ge_scalar", A.ge.Scalar, [("i", 0), 0.0], [x])
    yield case("ne_tensor", A.ne.Tensor, [("i", 0), ("i", 1)], [x, x.clone().masked_fill(mask, 0.0)])
    yield case("le_tensor", A.le.Tensor, [("i", 0), ("i", 1)], [x, y])
    yield case("neg", A.neg.default, [("i", 0)], [x])
    yield case("exp", A.exp.default, [("i", 0)], [x])
    yield case("max_pool2d", A.max_pool2d.default, [("i", 0), [3, 3], [2, 2], [1, 1], [1, 1], False], [img])
    yield case("adaptive_avg_pool2d", A.adaptive_avg_pool2d.default, [("i", 0), [4, 3]], [img])
    yield case("reshape", A.reshape.default, [("i", 0), [8, 4]], [x])
    yield case("flatten", A.flatten.using_ints, [("i", 0), 1, -1], [img])
    yield case("clone", A.clone.default, [("i", 0), None], [x])
    yield case("detach", A.detach.default, [("i", 0)], [x])
    yield case("alias", A.alias.default, [("i", 0)], [x])
    yield case("masked_fill_tensor", A.masked_fill.Tensor, [("i", 0), ("i", 1), ("w", 0)], [x, mask], [z0])
    yield case("ones_like", A.ones_like.default, [("i", 0), None, None, None, None, None], [x])
    yield case("arange", A.arange.default, [7, None, None, None, None], [])
    yield case("arange_start", A.arange.start, [2.0, 9.0, None, None, None, None], [])
    yield case("arange_step", A.arange.start_step, [1, 20, 3, None, None, None, None], [])
    yield case("zeros", A.zeros.default, [[2, 3], None, None, None, None], [])
    yield case("ones", A.ones.default, [[3, 2], torch.int64, None, None, None], [])
    yield case("full", A.full.default, [[2, 2], 1.25, None, None, None, None], [])
    yield case("split_with_sizes", A.split_with_sizes.default, [("i", 0), [3, 5], 1], [x])
    yield case("tril", A.tril.default, [("i", 0), -1], [x])


def as_f32(t):
    return np.ascontiguousarray(t.detach().numpy().astype("<f4"))


def main():
    out_dir, tool = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    n = 0
    for name, graph, inputs, weights, want in cases():
        bundle = msgpack.packb({"graph": graph, "inputs": [as_f32(t).tobytes() for t in inputs],
                                "weights": [as_f32(t).tobytes() for t in weights]}, use_bin_type=True)
        p = subprocess.run([tool], input=bundle, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        reply = msgpack.unpackb(p.stdout, raw=False) if p.stdout else {"message": p.stderr.decode()}
        if not reply.get("ok"):
            sys.exit("capture_op_bundles: %s refused by the CPU executor: %s" % (name, reply.get("message")))
        for got, w in zip(reply["outputs"], want):
            g = np.frombuffer(got["data"], dtype="<f4").reshape(got["shape"])
            if g.shape != tuple(w.shape) or not np.allclose(g, as_f32(w), rtol=1e-5, atol=1e-6):
                sys.exit("capture_op_bundles: %s differs from torch on the CPU executor" % name)
        with open(os.path.join(out_dir, "op_%s.mpk" % name), "wb") as f:
            f.write(bundle)
        n += 1
    print("%d op bundles, each equal to torch on the CPU executor" % n)


if __name__ == "__main__":
    main()
