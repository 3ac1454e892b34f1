"""capture.py: a PyTorch module's forward recorded as ATen ops (a __torch_dispatch__ LazyTensor)
into the captured-graph form djinnd's executor reads (docs/capture.md, docs/protocol.md).

    rm = client.remote(net.eval())   # module-like: rm(x), rm.net_attr ... (djinn.remote)
    y = rm(x)              # recorded (shapes from meta tensors), run on djinnd, RemoteTensor leaves

Weights are identified by content (XXH3-128 of their bytes, cached per tensor version). Plain
Python control flow is followed: where the forward needs a value (bool(t), t.item()), the graph
recorded so far runs through the executor, the value comes back and capture goes on. The
executor is what runs graphs: `djinn.remote.RemoteExecutor` on djinnd (GRAPH_RUN), or
`ToolExecutor`, the server's C executor (src/capture) in a child process on this machine - a
test harness for the executor alone, not remote execution.
"""

import collections
import contextlib
import ctypes
import ctypes.util
import math
import os
import subprocess

import msgpack
import numpy as np

from . import errors
from .tensor import RemoteTensor

try:
    import torch
    from torch.utils import _pytree as pytree
except ImportError:  # the package works without torch; capture needs it
    torch = None

__all__ = ["CapturedModule", "ToolExecutor", "Graph", "capture_graph", "ResourceError"]

# fallback="local" runs a module here only when MemAvailable holds this much more than it needs.
LOCAL_HEADROOM = 1.5


class ResourceError(MemoryError):
    """fallback="local" found too little memory on this host to run the module itself:
    needed_bytes (1.5x the module's parameters, buffers and activation bound), available_bytes
    (MemAvailable of /proc/meminfo). The error that sent it to fallback is its __cause__."""

    def __init__(self, needed_bytes, available_bytes, why):
        self.needed_bytes = int(needed_bytes)
        self.available_bytes = int(available_bytes)
        super().__init__("running the module locally (fallback after: %s) needs %d bytes (1.5 x its parameters, "
                         "buffers and activations), this host has %d available"
                         % (why, self.needed_bytes, self.available_bytes))


def mem_available():
    """MemAvailable of /proc/meminfo in bytes (0 where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

GRAPH_VERSION = 1


class _XXH128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


_xxh = None


def _libxxhash():
    """libxxhash (the C library djinnd links; Debian: libxxhash0), through ctypes."""
    global _xxh
    if _xxh is None:
        name = ctypes.util.find_library("xxhash") or "libxxhash.so.0"
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            raise ImportError("weights are named by XXH3-128: this needs libxxhash (Debian: apt install "
                              "libxxhash0)") from None
        lib.XXH3_128bits_withSeed.restype = _XXH128
        lib.XXH3_128bits_withSeed.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64]
        _xxh = lib
    return _xxh


def xxh3_128(data, seed=0):
    """The canonical XXH3-128 of data (bytes-like): 16 bytes, the high half first - a weight's
    name on the wire (docs/protocol.md, "Captured modules")."""
    mv = memoryview(data).cast("B")
    buf = (ctypes.c_char * len(mv)).from_buffer_copy(mv) if mv.readonly else (ctypes.c_char * len(mv)).from_buffer(mv)
    h = _libxxhash().XXH3_128bits_withSeed(buf, len(mv), seed)
    return h.high64.to_bytes(8, "big") + h.low64.to_bytes(8, "big")

if torch is not None:
    _DTYPES = {torch.float32: "f32", torch.int64: "i64", torch.bool: "bool", torch.float16: "f16",
               torch.bfloat16: "bf16", torch.int32: "i32", torch.float64: "f64", torch.uint8: "u8"}
    _NP = {"f32": np.float32, "i64": np.int64, "bool": np.bool_}
    _TORCH_OF = {"float32": torch.float32, "int64": torch.int64, "bool": torch.bool}
_ITEMSIZE = {"f32": 4, "i64": 8, "bool": 1, "f16": 2, "bf16": 2, "i32": 4, "f64": 8, "u8": 1}


def _dtype_name(dt):
    return _DTYPES.get(dt, str(dt).replace("torch.", ""))


def _spec(t):
    return {"shape": [int(d) for d in t.shape], "dtype": _dtype_name(t.dtype)}


class Graph:
    """A graph being recorded: inputs, weights (by content), nodes in order."""

    def __init__(self):
        self.inputs = []         # [tensor spec]
        self.weights = []        # [{"name", "hash", "shape", "dtype"}]
        self.weight_data = []    # [contiguous CPU tensor] beside each weight
        self._weight_at = {}     # (hash, dtype, shape) -> index
        self.nodes = []          # [{"op", "args", "out", "path"}]
        self.path = []           # the module path being run (forward hooks keep it)

    def add_weight(self, t, name, digest):
        # one entry per content, dtype and shape: zeros(768) and zeros(1, 1, 768) share their bytes
        # (one copy on the server) but not their shape
        key = (digest, t.dtype, tuple(t.shape))
        i = self._weight_at.get(key)
        if i is None:
            i = len(self.weights)
            self._weight_at[key] = i
            self.weights.append({"name": name, "hash": digest, "shape": [int(d) for d in t.shape],
                                 "dtype": _dtype_name(t.dtype)})
            self.weight_data.append(t.detach().contiguous())
        return {"w": i}

    def encode(self, outputs):
        """The msgpack bytes of the graph with these output references."""
        return msgpack.packb({"v": GRAPH_VERSION, "inputs": self.inputs, "weights": self.weights,
                              "nodes": self.nodes, "outputs": list(outputs)}, use_bin_type=True)


if torch is not None:

    class LazyTensor(torch.Tensor):
        """A tensor of the graph being recorded: shape and dtype are real, the values are not
        here. Every ATen op on it is recorded; bool()/item() run the graph so far."""

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            # A real override (not the disabled one): modules with a fused fast path that has no
            # meta kernel in 1.13 (nn.MultiheadAttention's _native_multi_head_attention,
            # TransformerEncoderLayer) see a tensor with a torch function and take their
            # composite path, whose ATen ops the executor has. Everything runs unchanged.
            # .tolist() / .numpy() / .cpu() need the value: the graph so far runs, the real
            # tensor comes back, and recording goes on with it as a constant.
            if func in _VALUE_METHODS and args and isinstance(args[0], LazyTensor):
                real = args[0]._rec.materialize_tensors([args[0]])[0]
                return func(real, *args[1:], **(kwargs or {}))
            with torch._C.DisableTorchFunction():
                return func(*args, **(kwargs or {}))

        @staticmethod
        def __new__(cls, rec, ref, shape, dtype):
            t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device="cpu", requires_grad=False)
            t._rec = rec
            t._ref = ref
            t._weight = None  # (name, tensor) for a parameter or buffer
            return t

        def __repr__(self):
            return "LazyTensor(%s, %s, %s)" % (list(self.shape), _dtype_name(self.dtype), self._ref)

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            rec = None
            for a in pytree.tree_flatten((args, kwargs or {}))[0]:
                if isinstance(a, LazyTensor):
                    rec = a._rec
                    break
            return rec.dispatch(func, args, kwargs or {})


if torch is not None:
    _VALUE_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}


def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")
    return x


def _plain_value(v):
    """A schema argument that is not a tensor, as msgpack carries it."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, torch.Size)):
        return [_plain_value(x) for x in v]
    return str(v).replace("torch.", "")  # dtype, memory_format, layout, device: by name


class _Recorder:
    """One forward's recording: turns dispatched ATen calls into nodes."""

    MATERIALIZE = ("aten._local_scalar_dense.default", "aten.is_nonzero.default")
    # ops whose output shape depends on values (no meta kernel can give it): their tensor
    # arguments are materialized and the op runs here, on the real values
    DATA_DEPENDENT = ("aten.nonzero.default", "aten.masked_select.default", "aten.index.Tensor",
                      "aten.argwhere.default", "aten._unique2.default", "aten.unique_dim.default",
                      "aten.unique_consecutive.default", "aten.repeat_interleave.Tensor")

    def __init__(self, owner):
        self.owner = owner
        self.graph = Graph()

    def lazy(self, ref, t):
        return LazyTensor(self, ref, tuple(t.shape), t.dtype)

    def lazy_weight(self, name, t):
        """A parameter or buffer seen as a LazyTensor: it joins the graph's weights (by
        content) when an op first reads it, so weights the forward never reads are not sent."""
        lt = LazyTensor(self, None, tuple(t.shape), t.dtype)
        lt._weight = (name, t)
        return lt

    def ref_of(self, v):
        if v._rec is not self:
            raise ValueError("a LazyTensor of another capture was passed in")
        if v._ref is None:
            name, t = v._weight
            v._ref = self.graph.add_weight(t, name, self.owner._hash_of(t))
        return v._ref

    def encode_arg(self, v):
        if isinstance(v, LazyTensor):
            return self.ref_of(v)
        if isinstance(v, torch.Tensor):  # a weight, a buffer or a constant made in forward: by content
            return self.graph.add_weight(v, self.owner._name_of(v), self.owner._hash_of(v))
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return [self.encode_arg(x) for x in v]
        return _plain_value(v)

    def dispatch(self, func, args, kwargs):
        name = str(func)
        if name in self.MATERIALIZE:
            value = self.materialize(args[0])
            if name == "aten.is_nonzero.default":
                return bool(value.reshape(-1)[0])
            return value.reshape(-1)[0].item()
        schema = func._schema
        inplace = schema.name.endswith("_") or (
            schema.arguments and schema.arguments[0].alias_info is not None and schema.arguments[0].alias_info.is_write)
        if inplace:
            target = args[0]
            if not isinstance(target, LazyTensor):
                raise errors.UnsupportedError(-5, "DJ_EUNSUPPORTED",
                                              "%s writes into a tensor that is not captured" % name)
            if getattr(target, "_weight", None) is not None:  # parameters and buffers are read-only
                raise errors.UnsupportedError(-5, "DJ_EUNSUPPORTED", "%s writes into %s (module state: training "
                                              "mode? call module.eval())" % (name, target._weight[0]))
            base = schema.name.split("::")[-1][:-1] if schema.name.endswith("_") else None
            packet = getattr(torch.ops.aten, base, None) if base else None
            overload = getattr(packet, schema.overload_name or "default", None) if packet is not None else None
            if overload is None:
                raise errors.UnsupportedError(-5, "DJ_EUNSUPPORTED", "in-place op %s has no functional form" % name)
            out = self.dispatch(overload, args, kwargs)
            target._ref = out._ref  # the in-place result replaces the tensor (functionalization)
            return target
        # the schema's arguments in order, defaults filled (docs/protocol.md)
        full = []
        for i, a in enumerate(schema.arguments):
            if i < len(args) and not a.kwarg_only:
                full.append(args[i])
            elif a.name in kwargs:
                full.append(kwargs[a.name])
            elif a.has_default_value():
                full.append(a.default_value)
            else:
                raise TypeError("%s: argument %s missing" % (name, a.name))
        try:
            meta_out = func(*pytree.tree_map(_meta, tuple(args)), **pytree.tree_map(_meta, dict(kwargs)))
        except (NotImplementedError, RuntimeError) as e:
            if name in self.DATA_DEPENDENT:
                return self.run_here(func, args, kwargs)
            raise errors.UnsupportedError(-5, "DJ_EUNSUPPORTED",
                                          "%s: no shape rule in this torch (%s)" % (name, str(e).splitlines()[0]))
        flat, spec = pytree.tree_flatten(meta_out)
        j = len(self.graph.nodes)
        node = {"op": name, "args": [self.encode_arg(v) for v in full],
                "out": [_spec(t) for t in flat if isinstance(t, torch.Tensor)]}
        if self.graph.path:
            node["path"] = self.graph.path[-1]
        self.graph.nodes.append(node)
        k = 0
        outs = []
        for t in flat:
            if isinstance(t, torch.Tensor):
                outs.append(self.lazy({"n": [j, k]}, t))
                k += 1
            else:
                outs.append(t)
        return pytree.tree_unflatten(outs, spec)

    def materialize_tensors(self, ts):
        """The values of these LazyTensors now, as torch tensors (one run of the graph so far)."""
        if getattr(self.owner._executor, "records_only", False):
            raise errors.UnsupportedError(-5, "DJ_EUNSUPPORTED", "this forward needs a value while it is recorded "
                                          "(.tolist()/.cpu()/nonzero): capture_graph cannot give it")
        values = [np.array(_value(v)) for v in self.owner._run(self.graph, [self.ref_of(t) for t in ts])]
        self.owner._guard(values)
        return [torch.from_numpy(v).to(t.dtype) for v, t in zip(values, ts)]

    def run_here(self, func, args, kwargs):
        """func on the real values of its LazyTensor arguments (data-dependent shapes)."""
        flat, spec = pytree.tree_flatten((args, kwargs))
        lazy = [x for x in flat if isinstance(x, LazyTensor)]
        real = iter(self.materialize_tensors(lazy))
        flat = [next(real) if isinstance(x, LazyTensor) else x for x in flat]
        a, k = pytree.tree_unflatten(flat, spec)
        return func(*a, **k)

    def materialize(self, t):
        """The value of t now: the graph recorded so far runs with t as its one output."""
        if getattr(self.owner._executor, "records_only", False):
            raise errors.UnsupportedError(-5, "DJ_EUNSUPPORTED", "this forward needs a value while it is recorded "
                                          "(bool()/item()): capture_graph cannot give it")
        value = np.array(_value(self.owner._run(self.graph, [self.ref_of(t)])[0]))
        self.owner._guard([value])
        return value


class _GraphView:
    """The weights of a graph as they were when one of its runs was sent (a prefix of the final lists)."""

    def __init__(self, graph, n_weights):
        self.weights = graph.weights[:n_weights]
        self.weight_data = graph.weight_data[:n_weights]


class _Plan:
    """One recorded call, kept for replay: the runs it made in order (graph bytes, how many weights
    each had), the values each materializing run returned (the guards), and how the result is built."""

    def __init__(self, graph, state):
        self.graph = graph
        self.state = state    # the module's parameters/buffers (identity, version) and plain attributes
        self.guards = []      # [(graph bytes, n weights, [numpy value])]: the path's materializations
        self.final = None     # (graph bytes, n weights) of the last run
        self.ospec = None
        self.leaves = None    # the output leaves: _OUT where a run's output goes, else the constant


_OUT = object()

# A call's non-tensor arguments are part of its signature by value: these types only.
_PLAIN = (bool, int, float, str, bytes, type(None))


class CapturedModule:
    """A module whose forward is captured and run by an executor. Calling it records the
    forward as ATen ops with the call's inputs, runs the graph, and returns the forward's
    own structure (tuple, list, dict, namedtuple) with torch tensors where it had tensors.
    Other attributes are the module's."""

    PLAN_CACHE = 32  # signatures kept per module (least recently used out)

    def __init__(self, module, executor, fallback=None, cache=True):
        if torch is None:
            raise ImportError("djinn.capture needs PyTorch")
        if fallback not in (None, "local"):
            raise ValueError("fallback is None or 'local', not %r" % (fallback,))
        self._cache = bool(cache)
        self._plans = collections.OrderedDict()  # signature -> _Plan (docs/capture.md, "The plan cache")
        self._plan = None       # the plan being recorded
        self.replayed = False   # the last call replayed a recorded plan (no forward ran here)
        self.plan_stats = {"hits": 0, "misses": 0, "guard_misses": 0, "state_misses": 0}
        self._module = module
        self._executor = executor
        self._fallback = fallback
        self._graph = None        # the graph being (or last) recorded
        self.ran_locally = False  # the last call ran on this host (fallback="local")
        self._hashes = {}  # id(parameter or buffer) -> ((version, data_ptr, shape, dtype), digest, the tensor)
        self._names = {}
        self.last_graph = None  # the bytes of the last graph run (for inspection and tests)

    def __getattr__(self, name):
        return getattr(self._module, name)

    def _hash_of(self, t):
        key = id(t)
        ver = (t._version, t.data_ptr(), tuple(t.shape), t.dtype)
        hit = self._hashes.get(key)
        if hit is not None and hit[0] == ver and hit[2] is t:
            return hit[1]
        d = xxh3_128(_tensor_bytes(t))
        if key in self._names:  # parameters and buffers only: a constant made in forward dies with the
            self._hashes[key] = (ver, d, t)  # call, and a later one could reuse its id, pointer and version 0
        return d

    def _name_of(self, t):
        return self._names.get(id(t), "const")

    def _run(self, graph, out_refs):
        """Runs the graph so far with these outputs: the executor's results (numpy arrays, or
        RemoteTensors for a remote executor)."""
        data = graph.encode(out_refs)
        self._last_run = (data, len(graph.weights))
        return self._send(graph, data)

    def _send(self, graph, data):
        self.last_graph = data
        run_graph = getattr(self._executor, "run_graph", None)
        if run_graph is None:  # an executor of arrays only: run(graph bytes, inputs, weights)
            return self._executor.run(data, [np.ascontiguousarray(_input_array(x)) for x in self._inputs],
                                      [np.ascontiguousarray(w.numpy()) for w in graph.weight_data])
        return run_graph(graph, data, self._inputs)

    @contextlib.contextmanager
    def _paths(self, graph):
        hooks = []
        for name, m in self._module.named_modules():
            def pre(mod, inp, name=name):
                graph.path.append(name or type(mod).__name__)

            def post(mod, inp, out):
                graph.path.pop()
            hooks.append(m.register_forward_pre_hook(pre))
            hooks.append(m.register_forward_hook(post))
        try:
            yield
        finally:
            for h in hooks:
                h.remove()

    def _guard(self, values):
        """A run of the graph so far gave these values to the forward (a materialization)."""
        if self._plan is not None:
            self._plan.guards.append(self._last_run + (values,))

    def _signature(self, args, kwargs):
        """What a recorded call is kept under: the structure of the arguments, each tensor's kind,
        shape and dtype, each other leaf by type and value; None when a leaf is none of these."""
        flat, spec = pytree.tree_flatten((args, kwargs))
        key = [str(spec)]
        for x in flat:
            if isinstance(x, torch.Tensor):
                key.append(("t", tuple(x.shape), x.dtype))
            elif isinstance(x, RemoteTensor):
                key.append(("r", tuple(x.shape), x.dtype.name))
            elif isinstance(x, _PLAIN) or isinstance(x, torch.dtype):
                key.append((type(x), x))
            else:
                return None
        return tuple(key)

    def _state(self):
        """The module state a recorded call depends on besides its arguments: every parameter and
        buffer (which tensor, its version, where its data is) and every module's plain public
        attributes (training, eps, a flag)."""
        tensors = tuple((n, id(t), t._version, t.data_ptr()) for n, t in
                        list(self._module.named_parameters()) + list(self._module.named_buffers()))
        attrs = tuple((name, tuple((k, v) for k, v in vars(m).items() if k[0] != "_" and isinstance(v, _PLAIN)))
                      for name, m in self._module.named_modules())
        return tensors, attrs

    def _replay(self, plan, args, kwargs):
        """The recorded call again with new values: each guard's run first (its values must equal the
        recorded ones, else None: record again), then the last run. The forward does not run."""
        self._inputs = [x.detach().contiguous() if isinstance(x, torch.Tensor) else x
                        for x in pytree.tree_flatten((args, kwargs))[0] if isinstance(x, (torch.Tensor, RemoteTensor))]
        self._graph = plan.graph
        for data, nw, want in plan.guards:
            got = self._send(_GraphView(plan.graph, nw), data)
            for g, w in zip(got, want):
                g = np.array(_value(g))
                if g.shape != w.shape or not np.array_equal(g, w):
                    return None
        data, nw = plan.final
        values = iter(self._send(_GraphView(plan.graph, nw), data) if data is not None else [])
        result = []
        for x in plan.leaves:
            if x is _OUT:
                v = next(values)
                result.append(v if isinstance(v, RemoteTensor) else torch.from_numpy(np.array(v)))
            else:
                result.append(x)
        return pytree.tree_unflatten(result, plan.ospec)

    def __call__(self, *args, **kwargs):
        self.ran_locally = False
        self.replayed = False
        self._graph = None
        try:
            return self._call(*args, **kwargs)
        except (errors.UnsupportedError, errors.BusyError, errors.ConnectionLost) as e:
            # what the server cannot run, a server too busy, or no server: with fallback="local",
            # this host runs the module (when it has the memory)
            if self._fallback != "local" or getattr(self._executor, "records_only", False):
                raise
            why = str(e)
        need = int(math.ceil(self.local_bytes(args, kwargs) * LOCAL_HEADROOM))
        have = mem_available()
        if need > have:
            raise ResourceError(need, have, why)
        self.ran_locally = True
        args, kwargs = pytree.tree_map(lambda x: x.torch() if isinstance(x, RemoteTensor) else x, (args, kwargs))
        with torch.no_grad():
            return self._module(*args, **kwargs)

    def local_bytes(self, args, kwargs):
        """What running the module here takes at most: its parameters and buffers, the call's
        tensors, and every value of the graph recorded until the refusal (eager frees some of them
        as it goes; none is counted twice). Where capture stopped before the forward's end, the
        rest is not in the graph: the bound covers the recorded part."""
        state = sum(t.numel() * t.element_size() for t in
                    list(self._module.parameters()) + list(self._module.buffers()))
        inputs = sum(x.numel() * x.element_size() for x in pytree.tree_flatten((args, kwargs))[0]
                     if isinstance(x, torch.Tensor))
        acts = 0
        g = self._graph
        if g is not None:
            for n in g.nodes:
                for o in n["out"]:
                    k = 1
                    for d in o["shape"]:
                        k *= d
                    acts += k * _ITEMSIZE.get(o["dtype"], 8)
        return state + inputs + acts

    def _call(self, *args, **kwargs):
        key = self._signature(args, kwargs) if self._cache and not getattr(self._executor, "records_only", False) \
            else None
        state = self._state() if key is not None else None
        plan = self._plans.get(key) if key is not None else None
        if plan is not None:
            if plan.state != state:
                self.plan_stats["state_misses"] += 1
            else:
                out = self._replay(plan, args, kwargs)
                if out is not None:
                    self._plans.move_to_end(key)
                    self.plan_stats["hits"] += 1
                    self.replayed = True
                    return out
                self.plan_stats["guard_misses"] += 1
            del self._plans[key]
        elif key is not None:
            self.plan_stats["misses"] += 1
        rec = _Recorder(self)
        self._plan = _Plan(rec.graph, state) if key is not None else None
        try:
            out = self._record(rec, args, kwargs)
            plan, self._plan = self._plan, None
        finally:
            self._plan = None
        if plan is not None and plan.final is not None:
            self._plans[key] = plan
            while len(self._plans) > self.PLAN_CACHE:
                self._plans.popitem(last=False)
        return out

    def _record(self, rec, args, kwargs):
        self._graph = rec.graph
        g = rec.graph
        self._names = {}
        state = {}
        for n, p in list(self._module.named_parameters()) + list(self._module.named_buffers()):
            self._names[id(p)] = n
            state[n] = rec.lazy_weight(n, p)  # the forward runs on these (functional_call)
        flat, spec = pytree.tree_flatten((args, kwargs))
        self._inputs = []
        lazy_in = []
        for x in flat:
            if isinstance(x, torch.Tensor):
                g.inputs.append(_spec(x))
                self._inputs.append(x.detach().contiguous())
                lazy_in.append(rec.lazy({"i": len(g.inputs) - 1}, x))
            elif isinstance(x, RemoteTensor):  # a result of an earlier remote call: it stays on the server
                if x.dtype.name not in _TORCH_OF:
                    raise errors.UnsupportedError(-5, "DJ_EUNSUPPORTED", "a RemoteTensor of dtype %s as the input of a "
                                                  "captured module (f32, int64, bool are)" % x.dtype.name)
                meta = torch.empty(x.shape, dtype=_TORCH_OF[x.dtype.name], device="meta")
                g.inputs.append(_spec(meta))
                self._inputs.append(x)
                lazy_in.append(rec.lazy({"i": len(g.inputs) - 1}, meta))
            else:
                lazy_in.append(x)
        largs, lkwargs = pytree.tree_unflatten(lazy_in, spec)
        with torch.no_grad(), self._paths(g):
            out = _functional_call(self._module, state, tuple(largs), dict(lkwargs))
        oflat, ospec = pytree.tree_flatten(out)
        refs = [rec.ref_of(x) for x in oflat if isinstance(x, LazyTensor)]
        values = iter(self._run(g, refs) if refs else [])
        if self._plan is not None:
            self._plan.final = self._last_run if refs else (None, 0)
            self._plan.ospec = ospec
            self._plan.leaves = [_OUT if isinstance(x, LazyTensor) else x for x in oflat]
            if any(isinstance(x, torch.Tensor) and not isinstance(x, LazyTensor) for x in oflat):
                self._plan.final = None  # a real tensor in the result (made here): not replayed
        result = []
        for x in oflat:
            if isinstance(x, LazyTensor):
                v = next(values)
                result.append(v if isinstance(v, RemoteTensor) else torch.from_numpy(np.array(v)))
            else:
                result.append(x)
        return pytree.tree_unflatten(result, ospec)


def _tensor_bytes(t):
    """A tensor's bytes as the wire carries them: contiguous, little-endian, in its own dtype."""
    return np.ascontiguousarray(t.detach().contiguous().numpy()).view(np.uint8).reshape(-1)


def _value(v):
    """An executor's result as a numpy array (a RemoteTensor is fetched)."""
    return v.numpy() if isinstance(v, RemoteTensor) else v


def _input_array(x):
    """A call's input as numpy (a RemoteTensor fetched)."""
    return x.numpy() if isinstance(x, RemoteTensor) else x.numpy()


def _functional_call(module, state, args, kwargs):
    """module(*args, **kwargs) with its parameters and buffers replaced by state's tensors
    (torch.func in torch 2.x, torch.nn.utils.stateless in 1.13)."""
    func = getattr(getattr(torch, "func", None), "functional_call", None)
    if func is None:
        from torch.nn.utils import stateless
        func = stateless.functional_call
    return func(module, state, args, kwargs)


class _Recorded(Exception):
    pass


def capture_graph(module, *args, **kwargs):
    """The graph bytes of module(*args, **kwargs), recorded and not run. A forward that needs a
    value while it is recorded (bool(t), t.item()) raises UnsupportedError."""

    class _RecordOnly:
        records_only = True

        def run_graph(self, graph, data, inputs):
            raise _Recorded()

    cm = CapturedModule(module, _RecordOnly())
    try:
        cm(*args, **kwargs)
    except _Recorded:
        pass
    return cm.last_graph


def _dump_bundle(folder, graph, inputs, weights):
    """Writes graph_run_tool's bundle to folder/NNNN_<test>.mpk, f32 weights over 64 KiB as empty
    bins (the reader draws them: a ResNet's weights would not fit the GPU machine's carry; small
    ones - constants, masks, norms - keep their values and so their meaning)."""
    os.makedirs(folder, exist_ok=True)
    test = os.environ.get("PYTEST_CURRENT_TEST", "graph").split(" ")[0].split("::")[-1]
    test = "".join(c if c.isalnum() or c in "_-" else "_" for c in test)[:60]
    ws = [b"" if np.asarray(w).dtype == np.float32 and np.asarray(w).nbytes > 65536 else np.asarray(w, dtype="<f4").tobytes()
          for w in weights]
    n = len([f for f in os.listdir(folder) if f.endswith(".mpk")])
    with open(os.path.join(folder, "%04d_%s.mpk" % (n, test)), "wb") as f:
        f.write(msgpack.packb({"graph": graph, "inputs": [np.asarray(x, dtype="<f4").tobytes() for x in inputs],
                               "weights": ws}, use_bin_type=True))


class ToolExecutor:
    """Runs graphs through the server's C executor in a child process (tests/graph_run_tool.c):
    the same decoder, validator, planner and CPU kernels djinnd will use - a harness for tests
    while the daemon has no GRAPH_RUN message, not remote execution."""

    def __init__(self, path=None):
        self.path = path or os.environ.get("DJ_GRAPH_RUN")
        if not self.path or not os.access(self.path, os.X_OK):
            raise FileNotFoundError("graph_run_tool not found (set DJ_GRAPH_RUN)")

    def run_graph(self, graph, data, inputs):
        return self.run(data, [np.ascontiguousarray(_input_array(x)) for x in inputs],
                        [np.ascontiguousarray(w.numpy()) for w in graph.weight_data])

    def run(self, graph, inputs, weights):
        bundle = msgpack.packb({"graph": graph,
                                "inputs": [np.asarray(x, dtype="<f4").tobytes() for x in inputs],
                                "weights": [np.asarray(w, dtype="<f4").tobytes() for w in weights]},
                               use_bin_type=True)
        dump = os.environ.get("DJ_CAPTURE_DUMP")
        if dump:   # scripts/capture_bundles.sh: the bundles the GPU check replays (f32 weights left out: it draws them)
            _dump_bundle(dump, graph, inputs, weights)
        p = subprocess.run([self.path], input=bundle, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        if p.returncode != 0 and not p.stdout:
            raise errors.InternalError(-12, "DJ_EINTERNAL", "graph_run_tool failed: %s" % p.stderr.decode(errors="replace"))
        reply = msgpack.unpackb(p.stdout, raw=False)
        if not reply.get("ok"):
            raise errors.from_meta(reply)
        out = []
        for o in reply["outputs"]:
            dt = _NP[o["dtype"]]
            raw = np.frombuffer(o["data"], dtype="<f4")
            out.append(raw.astype(dt).reshape(o["shape"]))
        return out
