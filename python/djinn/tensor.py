"""tensor.py: RemoteTensor - a result that stays on the server (a STEP's
logits) with its shape and dtype here; bytes come over on .numpy(), .torch(),
.tolist(), printing or slicing (only the slice), and the server frees it when
the tensor is garbage-collected."""

import operator
import weakref

import numpy as np

from . import _wire, errors

_DTYPES = {"f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "i32": np.dtype("<i4")}
_MAX_RUNS = 64  # a slice in more contiguous pieces than this is fetched as one bounding range
_PRINT_BYTES = 1 << 20  # printing fetches a tensor up to this size; larger ones print their shape


class RemoteTensor:
    """A tensor held by djinnd behind a handle. shape, dtype, nbytes are local.

    t.numpy()      the whole tensor (fetched once, then the same local array)
    t.torch()      the same as a torch tensor (needs PyTorch)
    t.tolist()     nested lists
    t[-1, :100]    a numpy array of just that slice: only its bytes move
    t.release()    frees it on the server now (else when t is collected)
    """

    def __init__(self, client, handle, shape, dtype, nbytes, declared=None):
        self._client = client
        self.handle = handle
        # The finalizer only queues a RELEASE (no lock, no I/O here); at
        # interpreter exit it does not run: the closing connection frees all.
        self._epoch = client.epoch  # the connection it lives on (a reconnect starts another)
        self._finalizer = weakref.finalize(self, client._release_later, handle, self._epoch)
        self._finalizer.atexit = False
        if dtype not in _DTYPES:
            raise ValueError("djinnd sent a tensor of dtype %r, which this package does not read" % (dtype,))
        self.shape = tuple(int(d) for d in shape)
        # _store: what the server holds (FETCH's bytes); dtype: what reads give. A captured
        # graph's outputs are stored as f32 and read as the module's dtype (int64, bool).
        self._store = _DTYPES[dtype]
        self.dtype = np.dtype(declared) if declared is not None else self._store
        self.nbytes = int(nbytes)
        self._cache = None
        if self.size * self._store.itemsize != self.nbytes:
            raise ValueError("djinnd sent shape %s of %s (%d bytes) but nbytes %d"
                             % (self.shape, dtype, self.size * self._store.itemsize, self.nbytes))

    # ---- what is known locally ----

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d RemoteTensor")
        return self.shape[0]

    @property
    def released(self):
        return not self._finalizer.alive

    def release(self):
        """Frees the tensor on the server now (what garbage collection does
        later otherwise); reads of it then fail unless it was fetched whole."""
        self._finalizer()

    # ---- reading ----

    def _fetch(self, ranges):
        """Bytes of each (offset, length) range, requested all at once."""
        if not self._finalizer.alive:
            raise ValueError("RemoteTensor %016x was released" % self.handle)
        c = self._client
        if c.epoch != self._epoch:
            raise errors.ConnectionLost("RemoteTensor %016x was on a connection that dropped: the server freed it"
                                        % self.handle)
        reqs = [(c._begin(_wire.FETCH, {"handle": self.handle, "offset": off, "length": n}), off, n)
                for off, n in ranges]
        out = []
        for q, off, n in reqs:
            _, payload = c._final(q)
            parts, got = [payload], len(payload)
            while got < n:  # one answer carries at most 4 GiB
                if not len(parts[-1]):
                    raise ValueError("djinnd answered an empty FETCH at offset %d of %d" % (off + got, self.nbytes))
                _, more = c._call(_wire.FETCH, {"handle": self.handle, "offset": off + got, "length": n - got})
                parts.append(more)
                got += len(more)
            c.fetched_bytes += got
            out.append(parts[0] if len(parts) == 1 else b"".join(parts))
        return out

    def numpy(self):
        """The whole tensor as a numpy array (fetched on the first call; later
        calls return the same array)."""
        if self._cache is None:
            (b,) = self._fetch([(0, self.nbytes)]) if self.nbytes else [b""]
            self._cache = np.frombuffer(b, dtype=self._store).reshape(self.shape) if self.nbytes \
                else np.zeros(self.shape, self.dtype)
            if self._cache.dtype != self.dtype:
                self._cache = self._cache.astype(self.dtype)
            if not self._cache.flags.writeable:
                self._cache = self._cache.copy()
        return self._cache

    def __array__(self, dtype=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def torch(self):
        """The whole tensor as a torch tensor (sharing memory with .numpy())."""
        try:
            import torch
        except ImportError:
            raise ImportError("RemoteTensor.torch() needs PyTorch (Debian: apt install python3-torch); "
                              ".numpy() works without it") from None
        return torch.from_numpy(self.numpy())

    def tolist(self):
        return self.numpy().tolist()

    def __getitem__(self, key):
        """Basic indexing (ints, slices, ...) fetches only the selected bytes
        and returns a numpy array; other keys (index arrays, masks) index the
        whole tensor."""
        if self._cache is not None:
            return self._cache[key]
        sel = _select(key, self.shape)
        if sel is None:
            return self.numpy()[key]
        idx, out_shape = sel
        full_shape = tuple(len(i) for i in idx)
        if 0 in full_shape:
            return np.zeros(out_shape, self.dtype)
        esz = self._store.itemsize
        strides = [1] * self.ndim
        for d in range(self.ndim - 2, -1, -1):
            strides[d] = strides[d + 1] * self.shape[d + 1]
        # dims past j are taken whole; dim j is one contiguous run when consecutive
        j = self.ndim - 1
        while j >= 0 and len(idx[j]) == self.shape[j]:
            j -= 1
        if j < 0:
            return self.numpy()[key]
        consecutive = len(idx[j]) == 1 or bool(np.all(np.diff(idx[j]) == 1))
        lead = j if consecutive else j + 1  # dims whose every index starts a run
        run_el = strides[j] * (len(idx[j]) if consecutive else 1)
        n_runs = 1
        for d in range(lead):
            n_runs *= len(idx[d])
        if n_runs <= _MAX_RUNS:
            starts = np.zeros(1, dtype=np.int64)
            for d in range(lead):
                starts = (starts[:, None] + idx[d][None, :] * strides[d]).reshape(-1)
            if consecutive:
                starts = starts + int(idx[j][0]) * strides[j]
            parts = self._fetch([(int(s) * esz, run_el * esz) for s in starts])
            flat = np.frombuffer(b"".join(parts) if len(parts) > 1 else parts[0], dtype=self._store)
            return flat.reshape(full_shape).reshape(out_shape).astype(self.dtype)
        # many small pieces: one bounding range, then index here
        flat_idx = np.zeros((), dtype=np.int64)
        for d in range(self.ndim):
            shape = [1] * self.ndim
            shape[d] = len(idx[d])
            flat_idx = flat_idx + idx[d].reshape(shape) * strides[d]
        lo, hi = int(flat_idx.min()), int(flat_idx.max()) + 1
        (b,) = self._fetch([(lo * esz, (hi - lo) * esz)])
        chunk = np.frombuffer(b, dtype=self._store)
        return chunk[flat_idx - lo].reshape(out_shape).astype(self.dtype)

    def __repr__(self):
        head = "RemoteTensor(shape=%s, dtype=%s, handle=%016x" % (self.shape, self.dtype.name, self.handle)
        if not self._finalizer.alive and self._cache is None:
            return head + ", released)"
        if self._cache is None and self.nbytes > _PRINT_BYTES:
            return head + ", %d bytes on the server: .numpy() or a slice reads them)" % self.nbytes
        return head + ",\n" + np.array2string(self.numpy(), separator=", ", threshold=64) + ")"


def _select(key, shape):
    """Basic indexing -> ([index array per dim], result shape), or None for a
    key this does not handle (advanced indexing). IndexError when out of range."""
    if not isinstance(key, tuple):
        key = (key,)
    if any(k is None for k in key):
        return None
    n_ell = sum(1 for k in key if k is Ellipsis)
    if n_ell > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_ell:
        i = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:i] + (slice(None),) * (len(shape) - len(key) + 1) + key[i + 1:]
    if len(key) > len(shape):
        raise IndexError("too many indices: the tensor is %d-dimensional, %d were given" % (len(shape), len(key)))
    key = key + (slice(None),) * (len(shape) - len(key))
    idx, out_shape = [], []
    for d, (k, n) in enumerate(zip(key, shape)):
        if isinstance(k, slice):
            r = range(*k.indices(n))
            idx.append(np.arange(r.start, r.stop, r.step, dtype=np.int64))
            out_shape.append(len(r))
            continue
        if isinstance(k, (bool, np.bool_)):
            return None
        try:
            i = operator.index(k)
        except TypeError:
            return None
        if not -n <= i < n:
            raise IndexError("index %d is out of bounds for axis %d with size %d" % (i, d, n))
        idx.append(np.array([i % n], dtype=np.int64))
    return idx, tuple(out_shape)
