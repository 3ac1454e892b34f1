"""trace.py: interventions inside one step - `with session.trace(ids) as t:`
names points of the forward pass to save (a RemoteTensor kept on the server)
or to change (a vector or tensor added or written in); the step runs when the
block ends, as one STEP with `points` (docs/protocol.md)."""

import re

import numpy as np

from . import _wire, errors
from .tensor import RemoteTensor

MAX_POINTS = 64  # DJ_IV_MAX: interventions in one step
_NAME = re.compile(r"^(?:layers\.(0|[1-9][0-9]{0,9})\.(input|attn\.output|mlp\.output|output)|final_norm\.output)$")


def check_point(name, num_layers):
    """A point's name, checked as the server does: ValueError for an unknown
    name, IndexError for a layer out of range."""
    if not isinstance(name, str):
        raise TypeError("a point's name must be a str, not %s" % type(name).__name__)
    m = _NAME.match(name)
    if not m:
        raise ValueError("unknown point %r: want layers.{i}.input, layers.{i}.attn.output, layers.{i}.mlp.output, "
                         "layers.{i}.output or final_norm.output" % name)
    if m.group(1) is not None and num_layers and int(m.group(1)) >= num_layers:
        raise IndexError("point %r: layer %s is out of range; the model has %d layers (0..%d)"
                         % (name, m.group(1), num_layers, num_layers - 1))
    return name


def as_f32(value, n, hidden, what):
    """value (numpy array, torch tensor, list, scalar-free) -> float32 array of
    shape [hidden] or [n, hidden]; TypeError/ValueError otherwise."""
    if isinstance(value, (RemoteTensor, Saved)):
        value = value.numpy()
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch, without importing it
        value = value.detach().cpu().float().numpy()
    try:
        a = np.asarray(value)
    except Exception:
        raise TypeError("%s: want a numpy array, torch tensor or list of numbers, not %s"
                        % (what, type(value).__name__)) from None
    if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
        raise TypeError("%s: want real numbers, got dtype %s" % (what, a.dtype))
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if n is None and a.ndim == 2 and a.shape[1] == hidden:  # a text prompt's rows: the server checks them
        n = a.shape[0]
    if not ((a.ndim == 1 and a.shape[0] == hidden) or (a.ndim == 2 and a.shape == (n, hidden))):
        rows = "n" if n is None else str(n)
        raise ValueError("%s: a tensor of shape %s does not fit the point's (%s, %d); give (%d,) (every position) "
                         "or (%s, %d)" % (what, tuple(a.shape), rows, hidden, hidden, rows, hidden))
    a = np.ascontiguousarray(a, dtype="<f4")
    if not np.all(np.isfinite(a)):
        raise ValueError("%s: the tensor holds NaN or infinity" % what)
    return a


class Saved:
    """What `.save()` returns: after the trace ran, the saved activation as a
    RemoteTensor of shape (n, hidden) f32 (.tensor), kept on the server until
    read; .numpy(), .torch(), .tolist(), slicing and printing go to it."""

    def __init__(self, name):
        self.point = name
        self.keep = False
        self._tensor = None

    @property
    def tensor(self):
        if self._tensor is None:
            raise RuntimeError("point %s is saved when the trace runs: read it after the `with` block" % self.point)
        return self._tensor

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.tensor, attr)

    def __getitem__(self, key):
        return self.tensor[key]

    def __array__(self, dtype=None):
        return self.tensor.__array__(dtype)

    def __len__(self):
        return len(self.tensor)

    def __repr__(self):
        if self._tensor is None:
            return "<djinn.Saved %s (not run yet)>" % self.point
        return "Saved(%s, %r)" % (self.point, self._tensor)


class Breakpoint:
    """Where a step stops (Point.breakpoint()). While the trace is paused
    here (trace.at is this), .value is the point's value, a RemoteTensor of
    shape (n, hidden) f32; .numpy() reads it; .add(v), .replace(v) and
    slice assignment (`b[:, 3] = 0`, `b[..., 10:20] *= 2`) change what the
    rest of the step reads, sent with Trace.resume()."""

    def __init__(self, trace, name):
        self._trace = trace
        self.point = name
        self.value = None
        self._edits = []     # (op, array) sent with the resume
        self._local = None   # the edited value, once a slice was assigned: sent whole

    def _check_paused(self):
        if self._trace.at is not self:
            raise RuntimeError("the step is not paused at %s%s" % (
                self.point, "" if self._trace.at is None else " (it is paused at %s)" % self._trace.at.point))

    def numpy(self):
        """The point's value as the step will go on with it (edits applied)."""
        self._check_paused()
        return self._current().copy()

    def _current(self):
        if self._local is None:
            a = np.array(self.value.numpy(), dtype=np.float32).reshape(self._trace.n, self._trace.hidden)
            for op, v in self._edits:
                a = a + v if op == "add" else np.broadcast_to(v, a.shape).copy()
            self._local = a
            self._edits = []
        return self._local

    def add(self, value):
        self._check_paused()
        a = as_f32(value, self._trace.n, self._trace.hidden, "the tensor added at breakpoint %s" % self.point)
        if self._local is not None:
            self._local += a
        else:
            self._edits.append(("add", a))
        return self

    def replace(self, value):
        self._check_paused()
        a = as_f32(value, self._trace.n, self._trace.hidden, "the tensor written at breakpoint %s" % self.point)
        if self._local is not None:
            self._local[...] = a
        else:
            self._edits = [("replace", a)]
        return self

    def __getitem__(self, key):
        self._check_paused()
        return self._current()[key]

    def __setitem__(self, key, value):
        self._check_paused()
        cur = self._current()
        if isinstance(value, np.ndarray) and np.shares_memory(value, cur):
            return  # `b[k] *= x`: numpy changed the view in place already
        v = np.asarray(value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value,
                       dtype=np.float32)
        if not np.all(np.isfinite(v)):
            raise ValueError("breakpoint %s: the value holds NaN or infinity" % self.point)
        cur[key] = v

    def _resume_entries(self):
        """The resume's points and payload."""
        if self._local is not None:
            edits = [("replace", np.ascontiguousarray(self._local, dtype="<f4"))]
        else:
            edits = self._edits
        points = [{"point": self.point, "op": op, "shape": list(a.shape), "dtype": "f32"} for op, a in edits]
        return points, b"".join(a.tobytes() for _, a in edits)

    def __repr__(self):
        return "<djinn.Breakpoint %s%s>" % (self.point, " (paused here)" if self._trace.at is self else "")


class Point:
    """One named point of the forward pass inside a trace. .save() keeps its
    value; `+=` adds a vector or tensor to it; assigning to it (through its
    parent: `t.layers[3].output = x`) replaces it."""

    def __init__(self, trace, name):
        self._trace = trace
        self.name = name
        self._added = False

    def save(self, keep=False):
        """The point's value once the step ran (a Saved). keep=True: its
        handle is the connection's and outlives the session (it counts
        against the connection's handles until released or read and dropped)."""
        return self._trace._save(self.name, keep)

    def breakpoint(self):
        """Stops the step here (a Breakpoint): when the trace runs, the step
        pauses at this point and the client has control - read and edit the
        value, then Trace.resume() or Trace.cancel()."""
        return self._trace._breakpoint(self.name)

    def add(self, value):
        self._trace._edit(self.name, "add", value)
        return self

    def replace(self, value):
        self._trace._edit(self.name, "replace", value)
        return self

    def __iadd__(self, value):
        self.add(value)
        self._added = True  # the assignment that follows `+=` is not a replace
        return self

    def __imul__(self, value):
        self._trace._region_edit(self.name, "mul", (slice(None), slice(None)), value)
        self._added = True
        return self

    def __getitem__(self, key):
        """A region of the point, (positions, hidden units), for in-place
        edits made on the server: `t.layers[4].output[:, 3] *= 0`,
        `t.layers[2].output[..., 10:20] = v`, `[-1] += v` (contiguous slices
        and ints; a text prompt's positions only from the start)."""
        return _Region(self, key)

    def __setitem__(self, key, value):
        if isinstance(value, _Region) and value._point is self and value._done:
            return  # `x[k] *= v` / `x[k] += v`: recorded by the region
        self._trace._region_edit(self.name, "replace", key, value)

    def __isub__(self, value):
        self.add(-as_f32(value, self._trace.n, self._trace.hidden, "a tensor subtracted at %s" % self.name))
        self._added = True
        return self

    def __repr__(self):
        return "<djinn.Point %s>" % self.name


class _Region:
    """Point[key]: `+=`, `-=`, `*=` record an edit of that region."""

    def __init__(self, point, key):
        self._point = point
        self._key = key
        self._done = False

    def _edit(self, op, value):
        self._point._trace._region_edit(self._point.name, op, self._key, value)
        self._done = True
        return self

    def __iadd__(self, value):
        return self._edit("add", value)

    def __isub__(self, value):
        return self._edit("add", -np.asarray(value, dtype=np.float64))

    def __imul__(self, value):
        return self._edit("mul", value)

    def __itruediv__(self, value):
        return self._edit("mul", 1.0 / np.asarray(value, dtype=np.float64))


def _span(k, size, what):
    """[from, to) of an int or a contiguous slice over size (None: unknown,
    then only non-negative bounds)."""
    if isinstance(k, (bool, np.bool_)):
        raise TypeError("%s index must be an int or a slice, not bool" % what)
    if isinstance(k, (int, np.integer)):
        k = int(k)
        if k < 0:
            if size is None:
                raise IndexError("%s index %d: negative positions need the step's length (ids, not text)" % (what, k))
            k += size
        if k < 0 or (size is not None and k >= size):
            raise IndexError("%s index out of range" % what)
        return k, k + 1
    if isinstance(k, slice):
        if k.step not in (None, 1):
            raise ValueError("%s slice: only contiguous slices (step 1)" % what)
        if size is None:
            if (k.start or 0) < 0 or (k.stop is not None and k.stop < 0):
                raise IndexError("%s slice: negative bounds need the step's length (ids, not text)" % what)
            return (k.start or 0), k.stop  # stop None: to the end, the server's n
        a, b, _ = k.indices(size)
        if a >= b:
            raise IndexError("%s slice %r is empty" % (what, k))
        return a, b
    raise TypeError("%s index must be an int or a slice, not %s" % (what, type(k).__name__))


class _Scope:
    """A part of the model with points under it: t.layers[i], its .attn and
    .mlp, t.final_norm."""

    def __init__(self, trace, prefix, points, children=()):
        object.__setattr__(self, "_trace", trace)
        object.__setattr__(self, "_prefix", prefix)
        object.__setattr__(self, "_points", points)
        object.__setattr__(self, "_children", children)

    def __getattr__(self, attr):
        if attr in self._points:
            return Point(self._trace, self._prefix + attr)
        if attr in self._children:
            return _Scope(self._trace, self._prefix + attr + ".", ("output",))
        raise AttributeError("%s has no point %r (it has %s)" % (
            self._prefix.rstrip(".") or "the model", attr, ", ".join(self._points + tuple(self._children))))

    def __setattr__(self, attr, value):
        if attr not in self._points:
            raise AttributeError("%s has no point %r to assign (it has %s)" % (
                self._prefix.rstrip("."), attr, ", ".join(self._points)))
        if isinstance(value, Point) and value.name == self._prefix + attr and value._added:
            value._added = False  # `x += v` ends here: the add is recorded
            return
        self._trace._edit(self._prefix + attr, "replace", value)


class _Layers:
    def __init__(self, trace):
        self._trace = trace

    def __len__(self):
        return self._trace.num_layers

    def __getitem__(self, i):
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError("layer index must be an int, not %s" % type(i).__name__)
        L = self._trace.num_layers
        if not -L <= i < L:
            raise IndexError("layer %d is out of range; the model has %d layers" % (i, L))
        return _Scope(self._trace, "layers.%d." % (int(i) % L), ("input", "output"), ("attn", "mlp"))


class Trace:
    """One step with interventions; made by Session.trace(ids). Inside the
    `with` block nothing runs: the block records what to save and change; the
    step runs (one STEP request) when the block ends without an exception.
    Afterwards .logits is the last position's logits (a RemoteTensor, or
    None with logits="none") and every Saved holds its tensor.

    Interventions at one point run in the order written: a save written
    before an add sees the value before it. layers.{i}.output and
    layers.{i+1}.input are the same point. The ids advance the session (their
    KV, computed with the changes, stays in the cache) like Session.step."""

    def __init__(self, session, ids, logits="last"):
        if logits not in ("last", "none"):
            raise ValueError("a trace's logits must be 'last' or 'none', got %r" % (logits,))
        self.session = session
        self.prompt = ids if isinstance(ids, str) else None
        self.ids = None if self.prompt is not None else ids
        self.n = None if self.prompt is not None else len(ids)  # a text prompt's: once it ran
        self.hidden = session.model.hidden_size
        self.num_layers = session.model.num_layers
        self.layers = _Layers(self)
        self.final_norm = _Scope(self, "final_norm.", ("output",))
        self._logits_mode = logits
        self._entries = []  # (name, op, array, Saved or Breakpoint)
        self._ran = False
        self.logits = None
        self.at = None         # the Breakpoint the step is paused at, if any
        self.cancelled = False

    def point(self, name):
        """The point by its name ("layers.5.output")."""
        return Point(self, check_point(name, self.num_layers))

    def _check_open(self):
        if self._ran:
            raise RuntimeError("this trace has run; start another with session.trace(ids)")
        if len(self._entries) >= MAX_POINTS:
            raise ValueError("at most %d interventions in one step" % MAX_POINTS)

    def _save(self, name, keep=False):
        self._check_open()
        s = Saved(name)
        s.keep = bool(keep)
        self._entries.append((name, "save", s))
        return s

    def _breakpoint(self, name):
        self._check_open()
        b = Breakpoint(self, name)
        self._entries.append((name, "break", b))
        return b

    def _region_edit(self, name, op, key, value):
        """op (add, mul, replace) of value over point[key] - key over
        (positions, hidden units) as numpy indexes them."""
        self._check_open()
        if not isinstance(key, tuple):
            key = (key,)
        if Ellipsis in key:
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (2 - len(key) + 1) + key[i + 1:]
        if len(key) == 1:
            key = key + (slice(None),)
        if len(key) != 2:
            raise IndexError("a point is (positions, hidden units): at most 2 indices, got %d" % len(key))
        r0, r1 = _span(key[0], self.n, "position")
        c0, c1 = _span(key[1], self.hidden, "hidden unit")
        w = c1 - c0
        h = None if r1 is None else r1 - r0
        if isinstance(value, (RemoteTensor, Saved)):
            value = value.numpy()
        if hasattr(value, "detach") and hasattr(value, "cpu"):
            value = value.detach().cpu().float().numpy()
        a = np.asarray(value)
        if a.dtype.kind not in "fiu" or a.dtype == np.bool_:
            raise TypeError("the tensor for %s %s[...]: want real numbers, got dtype %s" % (op, name, a.dtype))
        if a.ndim == 0 or (a.ndim == 1 and a.shape[0] == 1 and w != 1):
            a = np.full(w, float(a.reshape(())), dtype=np.float32)  # a scalar: every element of the region
        if a.ndim == 2 and a.shape[0] == 1:
            a = a[0]
        if not ((a.ndim == 1 and a.shape[0] == w) or (a.ndim == 2 and a.shape[1] == w and
                                                      (h is None or a.shape[0] == h))):
            raise ValueError("the tensor for %s %s[...]: shape %s does not fit the region's (%s, %d); give a "
                             "scalar, (%d,) or (%s, %d)" % (op, name, tuple(a.shape), "n" if h is None else h, w,
                                                            w, "n" if h is None else h, w))
        a = np.ascontiguousarray(a, dtype="<f4")
        if not np.all(np.isfinite(a)):
            raise ValueError("the tensor for %s %s[...]: it holds NaN or infinity" % (op, name))
        region = {"cols": [c0, c1]}
        if r1 is not None:
            region["rows"] = [r0, r1]
        elif r0:
            region["rows_from"] = r0
        self._entries.append((name, op, (a, region)))

    def _edit(self, name, op, value):
        self._check_open()
        a = as_f32(value, self.n, self.hidden, "the tensor for %s %s" % (op, name))
        self._entries.append((name, op, a))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.run()
        return False

    def run(self):
        """Runs the step (what leaving the `with` block does)."""
        if self._ran:
            raise RuntimeError("this trace has run already")
        self._ran = True
        sess = self.session
        sess._check_open()
        if not self._entries and self.prompt is None:  # nothing named: a plain step
            self.logits = sess.step(self.ids, logits=self._logits_mode)
            return self
        points, blobs = [], []
        for name, op, v in self._entries:
            e = {"point": name, "op": op}
            if isinstance(v, tuple):  # a region's edit
                v, region = v
                if "rows_from" in region:  # a text prompt's rows [a, its end): the server's n
                    raise ValueError("a slice of positions from %d to the end needs the step's length: trace ids, "
                                     "or give the end" % region["rows_from"])
                e.update(region)
            if op == "save" and v.keep:
                e["keep"] = True
            if op not in ("save", "break"):
                e["shape"] = list(v.shape)
                e["dtype"] = "f32"
                blobs.append(v.tobytes())
            points.append(e)
        meta = {"session": sess.id}
        if self.prompt is not None:
            meta["prompt"] = self.prompt
        else:
            meta["ids"] = self.ids
        if points:
            meta["points"] = points
        if self._logits_mode != "last":
            meta["logits"] = self._logits_mode
        reply, _ = sess._client._call(_wire.STEP, meta, b"".join(blobs))
        return self._answer(reply)

    @property
    def paused(self):
        return self.at is not None

    def resume(self):
        """Runs the paused step on - with the edits made at the breakpoint -
        to its next breakpoint (trace.at) or its end (then .logits and the
        saves are there). Returns self."""
        if self.at is None:
            raise RuntimeError("this trace is not paused at a breakpoint")
        sess = self.session
        sess._check_open()
        points, payload = self.at._resume_entries()
        meta = {"session": sess.id, "resume": True}
        if points:
            meta["points"] = points
        b, self.at = self.at, None
        b.value = None
        try:
            reply, _ = sess._client._call(_wire.STEP, meta, payload)
        except errors.NotFoundError as e:
            raise errors.NotFoundError(e.status, e.name, "session %016x went (its lease ended, or it was closed) "
                                       "with its step paused at %s; the step went with it (%s)"
                                       % (sess.id, b.point, e.message)) from None
        return self._answer(reply)

    def cancel(self):
        """Drops the paused step: the session is as it was before it (its KV
        rolled back); the trace's saves and logits never come."""
        if self.at is None:
            raise RuntimeError("this trace is not paused at a breakpoint")
        sess = self.session
        sess._check_open()
        self.at.value, self.at = None, None
        reply, _ = sess._client._call(_wire.STEP, {"session": sess.id, "cancel": True})
        sess.pos = int(reply.get("pos", sess.pos))
        self.cancelled = True
        return self

    def _answer(self, reply):
        sess = self.session
        c = sess._client
        sess.pos = int(reply.get("pos", sess.pos))
        if "ids" in reply:  # what a text prompt became
            self.ids = [int(i) for i in reply["ids"]]
            self.n = len(self.ids)
        if reply.get("paused"):
            name = reply.get("break")
            got = reply.get("saved", [])
            bps = [v for n, op, v in self._entries if op == "break" and n == name]
            if len(bps) != 1 or len(got) != 1 or "handle" not in got[0]:
                raise errors.FormatError(-4, "DJ_EFORMAT", "djinnd paused at %r, which this trace did not ask for"
                                         % (name,))
            g = got[0]
            bp = bps[0]
            bp.value = RemoteTensor(c, int(g["handle"]), g.get("shape", []), g.get("dtype", "f32"),
                                    int(g.get("nbytes", 0)))
            bp._edits, bp._local = [], None
            self.at = bp
            return self
        if "handle" in reply:
            self.logits = RemoteTensor(c, int(reply["handle"]), reply.get("shape", []), reply.get("dtype", "f32"),
                                       int(reply.get("nbytes", 0)))
        saves = [v for _, op, v in self._entries if op == "save"]
        got = reply.get("saved", [])
        if len(got) != len(saves) or any("handle" not in g for g in got):
            raise errors.FormatError(-4, "DJ_EFORMAT", "djinnd answered %d saved tensors for %d saves"
                                     % (len(got), len(saves)))
        for s, g in zip(saves, got):
            s._tensor = RemoteTensor(c, int(g["handle"]), g.get("shape", []), g.get("dtype", "f32"),
                                     int(g.get("nbytes", 0)))
        return self


def generation_points(session, fn):
    """GENERATE's `points`: the edits fn(t) records on a trace, each one row
    to every position of every step, its tensor in `data`."""
    if not callable(fn):
        raise TypeError("trace must be a function of a trace (def steer(t): t.layers[5].output += v)")
    t = Trace(session, "x")  # a recorder: n unknown, nothing runs
    fn(t)
    points = []
    for name, op, v in t._entries:
        region = None
        if isinstance(v, tuple):
            v, region = v
        if op not in ("add", "replace", "mul"):
            raise ValueError("a generation's trace takes edits only (add, replace, mul), not %s of %s" % (op, name))
        a = np.asarray(v, dtype="<f4")
        if a.ndim == 2:
            if a.shape[0] != 1:
                raise ValueError("a generation's trace: %s %s takes one row to every position, not %s"
                                 % (op, name, tuple(a.shape)))
            a = a[0]
        if region and ("rows" in region or "rows_from" in region):
            raise ValueError("a generation's trace: %s %s cannot take positions (its steps differ in length)"
                             % (op, name))
        e = {"point": name, "op": op, "shape": [int(a.shape[0])], "dtype": "f32",
             "data": np.ascontiguousarray(a, dtype="<f4").tobytes()}
        if region:
            e["cols"] = region["cols"]
        points.append(e)
    if not points:
        raise ValueError("the generation's trace edits nothing")
    return points
