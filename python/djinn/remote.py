"""remote.py: captured modules run on djinnd - `client.remote(module)` (docs/python.md, docs/capture.md).
Weights move by content: WEIGHT_HAS, then WEIGHT_UPLOAD of only what the server lacks (or a
challenge over what it holds from someone else), then GRAPH_RUN; outputs stay on the server."""

import numpy as np

from . import _wire, errors
from .capture import CapturedModule, _tensor_bytes, xxh3_128
from .tensor import RemoteTensor

CHUNK_BYTES = 4 << 20  # one WEIGHT_UPLOAD's payload (the server takes up to 16 MiB)
_HAS_BATCH = 4096      # hashes one WEIGHT_HAS asks about

ABSENT, HELD, USABLE = 0, 1, 2  # WEIGHT_HAS states


class RemoteExecutor:
    """Runs captured graphs on a djinnd connection. Counters (on the client, all calls together):
    client.weight_bytes_uploaded, client.weights_uploaded, client.weights_proven (by challenge)."""

    def __init__(self, client, qos=None):
        self.client = client
        self.qos = qos        # the class djinnd's scheduler admits each run in (None: interactive)
        self._usable = set()  # (epoch, hash) this connection has proven: the server keeps them while it lives
        self._sent = set()    # (epoch, graph id) whose bytes this connection has sent: named by id alone after

    def _sync_weights(self, graph):
        c = self.client
        to_ask, seen = [], set()
        for i, w in enumerate(graph.weights):  # one per hash: entries of one content differ in shape only
            if (c.epoch, w["hash"]) not in self._usable and w["hash"] not in seen:
                seen.add(w["hash"])
                to_ask.append(i)
        for start in range(0, len(to_ask), _HAS_BATCH):
            part = to_ask[start:start + _HAS_BATCH]
            meta, _ = c._call(_wire.WEIGHT_HAS, {"hashes": [graph.weights[i]["hash"] for i in part]})
            states = meta.get("state", [])
            if len(states) != len(part):
                raise errors.FormatError(-4, "DJ_EFORMAT", "WEIGHT_HAS answered %d states for %d hashes"
                                         % (len(states), len(part)))
            for i, state in zip(part, states):
                h = graph.weights[i]["hash"]
                data = _tensor_bytes(graph.weight_data[i])
                if state == ABSENT:
                    self._upload(h, data)
                elif state == HELD:
                    self._prove(h, data)
                self._usable.add((c.epoch, h))

    def _upload(self, h, data):
        c = self.client
        total = len(data)
        off = 0
        while True:
            n = min(CHUNK_BYTES, total - off)
            meta, _ = c._call(_wire.WEIGHT_UPLOAD, {"hash": h, "total": total, "offset": off},
                              data[off:off + n].tobytes())
            off += n
            c.weight_bytes_uploaded += n
            if off >= total:
                if not meta.get("done"):
                    raise errors.FormatError(-4, "DJ_EFORMAT", "djinnd did not complete the upload of %s" % h.hex())
                c.weights_uploaded += 1
                return

    def _prove(self, h, data):
        c = self.client
        meta, _ = c._call(_wire.WEIGHT_CHALLENGE, {"hash": h})
        ranges = meta.get("ranges", [])
        parts = []
        for off, n in ranges:
            if not (0 <= off and 0 < n and off + n <= len(data)):
                raise errors.FormatError(-4, "DJ_EFORMAT", "challenge range [%d, +%d) outside %d bytes"
                                         % (off, n, len(data)))
            parts.append(data[off:off + n].tobytes())
        answer = xxh3_128(b"".join(parts), int(meta.get("seed", 0)))
        c._call(_wire.WEIGHT_PROVE, {"hash": h, "answer": answer})
        c.weights_proven += 1

    def _meta(self, m):
        if self.qos is not None:
            m["qos"] = self.qos
        return m

    def run_graph(self, graph, data, inputs):
        c = self.client
        if "graph-run" not in c.capabilities:  # an older djinnd: fallback="local" runs the module here
            raise errors.UnsupportedError(-5, "DJ_EUNSUPPORTED", "djinnd at %s does not run captured modules "
                                          "(no graph-run capability)" % c.addr)
        self._sync_weights(graph)
        gid = xxh3_128(data)  # the server's plan cache names a graph by the XXH3-128 of its bytes
        refs, payload = [], []
        for x in inputs:
            if isinstance(x, RemoteTensor) and x._client is c and x._epoch == c.epoch and not x.released:
                refs.append(x.handle)  # stays on the server
                continue
            refs.append(None)
            arr = x.numpy() if isinstance(x, RemoteTensor) else x.numpy()
            payload.append(np.ascontiguousarray(arr).view(np.uint8).reshape(-1).tobytes())
        body = b"".join(payload)
        c.graph_input_bytes += len(body)
        meta = None
        if (c.epoch, gid) in self._sent:  # the server has its plan from our bytes: no bytes, no decode
            try:
                meta, _ = c._call(_wire.GRAPH_RUN, self._meta({"graph_bytes": 0, "graph_id": gid, "inputs": refs}), body)
            except errors.NotFoundError as e:
                if "graph_id" not in str(e):  # a handle input gone, not the plan: that is the caller's error
                    raise
                self._sent.discard((c.epoch, gid))  # evicted from the server's plan cache: send the bytes
        if meta is None:
            meta, _ = c._call(_wire.GRAPH_RUN, self._meta({"graph_bytes": len(data), "graph_id": gid, "inputs": refs}),
                              data + body)
            c.graph_bytes_sent += len(data)
            if "graph_id" in meta:  # a djinnd with a plan cache (an older one ignores graph_id and keeps none)
                self._sent.add((c.epoch, gid))
        c.graph_plans_cached = bool(meta.get("plan_cached", False))
        self.last_reply = meta  # run_s, plan_s, plan_cached, graph_id (docs/protocol.md)
        out = []
        for o in meta.get("outputs", []):
            shape = [int(d) for d in o["shape"]]
            n = 1
            for d in shape:
                n *= d
            declared = {"f32": np.float32, "i64": np.int64, "bool": np.bool_}.get(o.get("dtype"), np.float32)
            out.append(RemoteTensor(c, int(o["handle"]), shape, o.get("stored", "f32"), n * 4, declared=declared))
        return out


def remote(client, module, fallback=None, cache=True, qos=None):
    """module as a proxy whose calls run on djinnd (Client.remote)."""
    return CapturedModule(module, RemoteExecutor(client, qos=qos), fallback=fallback, cache=cache)
