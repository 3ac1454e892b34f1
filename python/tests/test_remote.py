"""test_remote.py: client.remote(module) on a real djinnd - captured modules run by GRAPH_RUN with
their weights synced by content (WEIGHT_HAS / WEIGHT_UPLOAD / challenges), checked against
PyTorch eager; RemoteTensor leaves and chaining; every refusal typed (docs/capture.md)."""

import collections

import msgpack
import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import djinn  # noqa: E402
from djinn import _wire, errors  # noqa: E402
from djinn.capture import capture_graph, xxh3_128  # noqa: E402

from conftest import Daemon, capture_close, randomize_bn  # noqa: E402


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 32)
        self.norm = nn.LayerNorm(32)
        self.fc3 = nn.Linear(32, 10)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        h = self.norm(torch.tanh(self.fc2(h)) + F.silu(self.fc2(h)))
        return F.log_softmax(self.fc3(h), dim=-1)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.b1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=4)
        self.pool = nn.AdaptiveAvgPool2d((2, 2))
        self.fc = nn.Linear(64, 7)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = self.pool(F.relu(self.c2(x)))
        return torch.softmax(self.fc(torch.flatten(x, 1)), dim=1)


class RollNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return torch.roll(self.fc(x), 1, 0)  # aten.roll: not an op of the executor


def weights_stats(c):
    return c.stats()["weights"]


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_hand_written_modules_match_eager(client, kind):
    torch.manual_seed(1)
    m = (MLP() if kind == "mlp" else randomize_bn(CNN(), 2, affine=False)).eval()
    x = torch.randn(4, 20) if kind == "mlp" else torch.randn(2, 3, 16, 16)
    rm = client.remote(m)
    got = rm(x)
    assert isinstance(got, djinn.RemoteTensor)
    assert got.shape == tuple(m(x).shape) and got.dtype == np.float32
    with torch.no_grad():
        capture_close(got, m(x))
    assert not rm.ran_locally


def test_resnet18_matches_eager_and_second_call_moves_no_weights(client):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(3)
    m = randomize_bn(torchvision.models.resnet18(), 4, affine=False).eval()
    x = torch.randn(1, 3, 64, 64)
    rm = client.remote(m)
    before = weights_stats(client)["received_bytes"]
    up0 = client.weight_bytes_uploaded
    got = rm(x)
    with torch.no_grad():
        want = m(x)
    capture_close(got, want)
    sent = client.weight_bytes_uploaded - up0
    assert sent > 0 and weights_stats(client)["received_bytes"] - before == sent
    # the second call: weights stay where they are, on the server and here
    up1 = client.weight_bytes_uploaded
    recv1 = weights_stats(client)["received_bytes"]
    x2 = torch.randn(1, 3, 64, 64)
    got2 = rm(x2)
    assert client.weight_bytes_uploaded == up1
    assert weights_stats(client)["received_bytes"] == recv1
    with torch.no_grad():
        capture_close(got2, m(x2))


def test_two_clients_hold_one_copy(daemon):
    torch.manual_seed(5)
    m = MLP().eval()
    x = torch.randn(3, 20)
    a, b = djinn.connect(daemon.addr), djinn.connect(daemon.addr)
    try:
        ya = a.remote(m)(x)
        s1 = weights_stats(a)
        yb = b.remote(m)(x)  # the server holds every weight: b proves them by challenge, uploads nothing
        s2 = weights_stats(b)
        assert b.weight_bytes_uploaded == 0 and b.weights_proven == 8  # 3 linears and a norm: 8 tensors
        assert s2["count"] == s1["count"] and s2["bytes"] == s1["bytes"]
        assert s2["challenges_passed"] - s1["challenges_passed"] == b.weights_proven
        np.testing.assert_array_equal(ya.numpy(), yb.numpy())
    finally:
        a.close()
        b.close()


def test_remote_tensor_chains_without_coming_back(client):
    torch.manual_seed(6)
    enc = nn.Sequential(nn.Linear(12, 24), nn.ReLU()).eval()
    head = nn.Linear(24, 5).eval()
    x = torch.randn(7, 12)
    h = client.remote(enc)(x)
    sent, fetched = client.graph_input_bytes, client.fetched_bytes
    y = client.remote(head)(h)
    assert client.graph_input_bytes == sent and client.fetched_bytes == fetched  # h never came back
    with torch.no_grad():
        capture_close(y, head(enc(x)))


def test_output_structure_and_branches(client):
    Pair = collections.namedtuple("Pair", "left right")

    class Multi(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 6)

        def forward(self, x):
            h = self.fc(x)
            if h.sum() > 0:  # the prefix runs on the server, its value comes back
                h = h * 2
            return {"h": h, "parts": (F.relu(h), [h.argmax(-1), "label"]), "pair": Pair(h.sum(1), None)}

    torch.manual_seed(7)
    m = Multi().eval()
    rm = client.remote(m)
    for sign in (1.0, -1.0):
        with torch.no_grad():
            m.fc.bias.fill_(sign * 10.0)
        x = torch.randn(3, 4)
        got = rm(x)
        with torch.no_grad():
            want = m(x)
        assert isinstance(got["parts"][1], list) and got["parts"][1][1] == "label" and got["pair"].right is None
        capture_close(got["h"], want["h"])
        capture_close(got["parts"][0], want["parts"][0])
        assert got["parts"][1][0].dtype == np.int64
        np.testing.assert_array_equal(got["parts"][1][0].numpy(), want["parts"][1][0].numpy())
        capture_close(got["pair"].left, want["pair"].left)


def test_unsupported_op_refused_by_name_and_runs_locally_with_fallback(client):
    torch.manual_seed(8)
    m = RollNet().eval()
    x = torch.randn(3, 8)
    rm = client.remote(m)
    with pytest.raises(errors.UnsupportedError) as e:
        rm(x)
    assert "aten.roll.default" in str(e.value) and not rm.ran_locally
    rl = client.remote(m, fallback="local")
    got = rl(x)
    assert rl.ran_locally and isinstance(got, torch.Tensor)
    with torch.no_grad():
        assert torch.equal(got, m(x))


def _graph_run(c, graph, x):
    return c._call(_wire.GRAPH_RUN, {"graph_bytes": len(graph), "inputs": [None]},
                   graph + np.ascontiguousarray(x.numpy()).tobytes())


def test_unknown_hash_and_wrong_challenge_refused(daemon):
    torch.manual_seed(9)
    m = nn.Linear(6, 3).eval()
    x = torch.randn(2, 6)
    a, b = djinn.connect(daemon.addr), djinn.connect(daemon.addr)
    try:
        a.remote(m)(x)  # a uploads (or proves) both weights
        g = msgpack.unpackb(capture_graph(m, x), raw=False)
        # a hash nobody uploaded
        g2 = dict(g, weights=[dict(w, hash=b"\x01" * 16) for w in g["weights"]])
        with pytest.raises(errors.NotFoundError) as e:
            _graph_run(a, msgpack.packb(g2, use_bin_type=True), x)
        assert "not stored" in str(e.value)
        # b knows the real hashes, not the bytes: refused until it proves them
        graph = msgpack.packb(g, use_bin_type=True)
        with pytest.raises(errors.NotFoundError) as e:
            _graph_run(b, graph, x)
        assert "not proven" in str(e.value)
        h = g["weights"][0]["hash"]
        meta, _ = b._call(_wire.WEIGHT_CHALLENGE, {"hash": h})
        assert 1 <= len(meta["ranges"]) <= 8
        with pytest.raises(errors.InvalidError) as e:
            b._call(_wire.WEIGHT_PROVE, {"hash": h, "answer": xxh3_128(b"guess", meta["seed"])})
        assert "wrong answer" in str(e.value)
        state, _ = b._call(_wire.WEIGHT_HAS, {"hashes": [h]})
        assert state["state"] == [1]  # still held, still not usable by b
        # bytes that hash to another name are refused
        with pytest.raises(errors.InvalidError) as e:
            b._call(_wire.WEIGHT_UPLOAD, {"hash": h, "total": 4, "offset": 0}, b"abcd")
        assert "hash to" in str(e.value)
    finally:
        a.close()
        b.close()


def test_upload_over_quota_refused(tmp_path):
    d = Daemon(str(tmp_path), extra=("--weight-quota-gb", "64k"))
    try:
        c = djinn.connect(d.addr)
        torch.manual_seed(10)
        small = nn.Linear(16, 16).eval()
        out = c.remote(small)(torch.randn(1, 16))  # about 1 KiB: fits
        assert out.shape == (1, 16)
        big = nn.Linear(128, 160).eval()  # 80 KiB of weight: past the 64 KiB quota
        with pytest.raises(errors.RangeError) as e:  # one weight larger than the quota
            c.remote(big)(torch.randn(1, 128))
        assert "more than" in str(e.value)
        two = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 128)).eval()  # 24 + 48 KiB: the second is past it
        with pytest.raises(errors.QuotaError) as e:
            c.remote(two)(torch.randn(1, 64))
        assert "quota" in str(e.value)
        c.close()
    finally:
        assert d.stop() == 0, d.stderr()


def test_graph_runs_admitted_by_planned_bytes(tmp_path):
    """--graph-quota-gb: a run whose plan (stack and outputs) is larger than one token's captured
    runs may hold is refused naming its bytes; smaller ones run, in the class the caller asks for."""
    d = Daemon(str(tmp_path), extra=("--graph-quota-gb", "64k"))
    try:
        c = djinn.connect(d.addr)
        torch.manual_seed(11)
        m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
        x = torch.randn(4, 16)
        for qos in (None, "batch", "realtime"):
            got = c.remote(m, qos=qos)(x)
            with torch.no_grad():
                capture_close(got, m(x))
        big = torch.randn(1024, 16)  # activations of 1024 x 32 f32: 128 KiB, past the 64 KiB
        with pytest.raises(errors.NoSpaceError) as e:
            c.remote(m)(big)
        assert "bytes" in str(e.value) and "65536 bytes" in str(e.value) and "--graph-quota-gb" in str(e.value)
        with pytest.raises(errors.DjinnError):
            c.remote(m, qos="urgent")(x)  # not a class
        c.close()
    finally:
        assert d.stop() == 0, d.stderr()


def test_same_bytes_different_shapes_stored_once(client):
    class Shared(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            nn.init.zeros_(self.fc.bias)
            self.register_buffer("tok", torch.zeros(1, 1, 8))  # the bias's bytes in another shape

        def forward(self, x):
            return self.fc(x) + self.tok.expand(x.shape[0], -1, -1).squeeze(1)

    torch.manual_seed(11)
    m = Shared().eval()
    x = torch.randn(3, 8)
    g = msgpack.unpackb(capture_graph(m, x), raw=False)
    shapes = sorted((w["hash"], tuple(w["shape"])) for w in g["weights"])
    assert len(g["weights"]) == 3 and len({h for h, _ in shapes}) == 2  # two entries, one hash
    up = client.weight_bytes_uploaded
    got = client.remote(m)(x)
    assert client.weight_bytes_uploaded - up <= 8 * 8 * 4 + 8 * 4  # the zeros went once (if at all)
    with torch.no_grad():
        capture_close(got, m(x))


def test_server_without_graph_run_falls_back(client):
    assert "graph-run" in client.capabilities
    torch.manual_seed(12)
    m = nn.Linear(5, 2).eval()
    x = torch.randn(2, 5)
    saved = client.capabilities
    client.capabilities = [c for c in saved if c != "graph-run"]  # as an older djinnd says HELLO
    try:
        with pytest.raises(errors.UnsupportedError) as e:
            client.remote(m)(x)
        assert "graph-run" in str(e.value)
        rl = client.remote(m, fallback="local")
        got = rl(x)
        assert rl.ran_locally
        with torch.no_grad():
            assert torch.equal(got, m(x))
    finally:
        client.capabilities = saved


# ---- the plan cache (docs/capture.md, "The plan cache") ----

class Branchy(nn.Module):
    """A forward whose path depends on values: bool() of a comparison, and .item()."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.scale = 2.0  # a plain attribute the forward reads

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:  # bool(t): a materialization, its value a guard
            h = F.relu(h) * self.scale
        else:
            h = -h
        k = int(x[0, 0].item() > 0)  # .item(): the value itself is the guard
        return {"y": h + k, "k": k}


def test_plan_cache_replays_without_recording_or_resending(client):
    torch.manual_seed(11)
    m = MLP().eval()
    rm = client.remote(m)
    x1, x2 = torch.randn(4, 20), torch.randn(4, 20)
    y1 = rm(x1)
    assert not rm.replayed and rm.plan_stats["misses"] == 1
    sent = client.graph_bytes_sent
    assert sent > 0
    hits0 = client.stats()["graph_plans"]["hits"]
    y2 = rm(x2)
    assert rm.replayed and rm.plan_stats["hits"] == 1
    assert client.graph_bytes_sent == sent  # named by id: no graph bytes sent
    assert client.graph_plans_cached and client.stats()["graph_plans"]["hits"] == hits0 + 1
    with torch.no_grad():
        capture_close(y1, m(x1))
        capture_close(y2, m(x2))
    # another shape is another signature: recorded, its bytes sent
    x3 = torch.randn(2, 20)
    y3 = rm(x3)
    assert not rm.replayed and client.graph_bytes_sent > sent
    with torch.no_grad():
        capture_close(y3, m(x3))
    # cache=False records every call
    rn = client.remote(m, cache=False)
    rn(x1)
    rn(x2)
    assert not rn.replayed and rn.plan_stats["hits"] == 0


def test_plan_cache_guards_values_and_module_state(client):
    torch.manual_seed(12)
    m = Branchy().eval()
    rm = client.remote(m)

    def check(x, replayed):
        got = rm(x)
        with torch.no_grad():
            want = m(x)
        assert rm.replayed == replayed
        assert got["k"] == want["k"]
        capture_close(got["y"], want["y"])

    pos = torch.ones(2, 6)
    # find inputs taking each branch of h.sum() > 0
    with torch.no_grad():
        w_pos = m.fc(pos).sum() > 0
    a = pos if w_pos else -pos
    check(a, False)
    check(a.clone(), True)     # the same guard values: replayed
    check(a * 1.0001, False)   # x[0, 0].item() differs: a guard fails, recorded again
    check(-a, False)           # the other branch (and the other item): recorded
    assert rm.plan_stats["guard_misses"] == 2
    check(-a, True)
    # module state: a plain attribute, then a parameter changed in place
    m.scale = 3.0
    check(-a, False)
    with torch.no_grad():
        m.fc.bias.add_(0.5)
    check(-a, False)
    assert rm.plan_stats["state_misses"] == 2
    check(-a, True)


def test_graph_id_needs_the_bytes_sent_on_this_connection(daemon):
    torch.manual_seed(13)
    m = MLP().eval()
    x = torch.randn(3, 20)
    a, b = djinn.connect(daemon.addr), djinn.connect(daemon.addr)
    try:
        ra = a.remote(m)
        ra(x)
        gid = xxh3_128(ra.last_graph)
        rb = b.remote(m)
        # b claims to have sent the graph: the server refuses the id, b sends the bytes and runs
        rb._executor._sent.add((b.epoch, gid))
        before = b.graph_bytes_sent
        refused = b.stats()["graph_plans"]["refused_id"]
        y = rb(x)
        assert b.graph_bytes_sent - before == len(ra.last_graph)
        assert b.stats()["graph_plans"]["refused_id"] == refused + 1
        assert b.graph_plans_cached  # a's bytes were decoded already
        with torch.no_grad():
            capture_close(y, m(x))
    finally:
        a.close()
        b.close()


def test_flip_sort_transposed_conv_on_the_server(client):
    torch.manual_seed(22)
    up = nn.Sequential(nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1), nn.ReLU()).eval()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.up = up

        def forward(self, x):
            h = torch.flip(self.up(x), [2])
            v, i = torch.sort(h.mean((2, 3)), dim=1, stable=True)
            return v, i

    m = M().eval()
    x = torch.randn(2, 3, 4, 4)
    v, i = client.remote(m)(x)
    with torch.no_grad():
        wv, wi = m(x)
    capture_close(v, wv)
    assert i.torch().dtype == torch.int64 and torch.equal(i.torch(), wi)
