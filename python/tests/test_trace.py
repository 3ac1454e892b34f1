"""test_trace.py: interventions (Session.trace) against a real djinnd - saved
points equal a pure-torch forward of the fixture models (torch_ref.py,
itself checked against the fixtures' transformers logits), edits change the
step (and the KV the next step reads) as a forward hook would, and every
bad request is a clear exception. Needs torch (skipped without it)."""

import numpy as np
import pytest

import djinn
from djinn import _wire
from conftest import FIXTURES, reference

torch = pytest.importorskip("torch")
from torch_ref import LlamaRef  # noqa: E402  (needs torch)

MODELS = ("llama2", "llama3", "tinyllama")  # f32, bf16 and f16 weights; biases; three RoPE kinds
TOL = 1e-4  # max |djinn - torch| / max |torch| (f32 on both sides, different summation orders)


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(1e-6, np.max(np.abs(want))))


_REFS = {}


def torch_model(name):
    if name not in _REFS:
        r = LlamaRef("%s/models/%s" % (FIXTURES, name))
        ref = reference(name)
        lg, _ = r.forward(ref["prompt_ids"])  # the reference itself against transformers first
        assert rel(lg[-1].numpy(), ref["last_logits"]) < 1e-5, "torch_ref disagrees with transformers on " + name
        _REFS[name] = r
    return _REFS[name]


def all_points(L):
    names = ["layers.%d.%s" % (i, p) for i in range(L) for p in ("input", "attn.output", "mlp.output", "output")]
    return names + ["final_norm.output"]


@pytest.mark.parametrize("name", MODELS)
def test_saved_points_equal_torch(client, name):
    r = torch_model(name)
    ids = reference(name)["prompt_ids"]
    m = client.model(name)
    names = all_points(m.num_layers)
    with m.session() as s:
        plain = s.step(ids).numpy()
    with m.session() as s:
        with s.trace(ids) as t:
            saved = {n: t.point(n).save() for n in names}
        assert s.pos == len(ids)
        # saving changes nothing: the same logits as a plain step, bit for bit
        assert np.array_equal(t.logits.numpy(), plain)
        got = {n: saved[n].numpy() for n in names}  # a session's tensors go with it: read them inside
    _, want = r.forward(ids)
    for n in names:
        assert got[n].shape == (len(ids), m.hidden_size) and got[n].dtype == np.float32
        assert rel(got[n], want[n].numpy()) < TOL, n
    # one point under two names
    assert np.array_equal(got["layers.0.output"], got["layers.1.input"])


def test_decode_step_trace(client):
    """A one-token trace (the decode path) after a prefill: its rows are that token's."""
    name = "llama3"
    r = torch_model(name)
    ids = reference(name)["prompt_ids"]
    with client.model(name).session() as s:
        s.step(ids[:-1], logits="none")
        with s.trace(ids[-1:]) as t:
            h = t.layers[1].output.save()
            f = t.final_norm.output.save()
        lg, want = r.forward(ids)
        assert h.shape == (1, 64)
        assert rel(h.numpy()[0], want["layers.1.output"][-1].numpy()) < TOL
        assert rel(f.numpy()[0], want["final_norm.output"][-1].numpy()) < TOL
        assert rel(t.logits.numpy(), lg[-1].numpy()) < TOL


def test_steering_equals_a_hook(client):
    """`+=` a vector and `=` a tensor: the step's logits, the saved points and
    the next (plain) step - which reads the changed KV - equal torch with the
    same edits made in its forward."""
    name = "llama2"
    r = torch_model(name)
    ids = reference(name)["prompt_ids"]
    n, d = len(ids), 64
    rng = np.random.default_rng(14)
    steer = rng.standard_normal(d).astype(np.float32) * 2.0
    repl = rng.standard_normal((n, d)).astype(np.float32)
    m = client.model(name)
    with m.session() as s:
        with s.trace(ids) as t:
            before = t.layers[0].output.save()
            t.layers[0].output += steer
            after = t.layers[0].output.save()
            t.layers[1].attn.output = repl
            a1 = t.layers[1].attn.output.save()
            t.final_norm.output += torch.from_numpy(steer)  # torch tensors work as well
        nxt = s.step([7]).numpy()
        before, after, a1, logits = before.numpy(), after.numpy(), a1.numpy(), t.logits.numpy()
    edits = {"layers.0.output": [("add", steer)], "layers.1.attn.output": [("replace", repl)],
             "final_norm.output": [("add", steer)]}
    lg, want = r.forward(ids, edits)
    _, plain = r.forward(ids)
    assert rel(before, plain["layers.0.output"].numpy()) < TOL  # saved before the add
    assert rel(after, want["layers.0.output"].numpy()) < TOL  # and after it
    assert np.array_equal(a1, repl)
    assert rel(logits, lg[-1].numpy()) < TOL
    assert rel(logits, r.forward(ids)[0][-1].numpy()) > 1e-2  # it did change the step
    # the next token reads the KV the edited step wrote: torch with the edits on the first n rows only
    rows = np.broadcast_to(steer, (n, d))
    lg2, _ = r.forward(ids + [7], {"layers.0.output": [("add", rows)], "layers.1.attn.output": [("replace", repl)],
                                   "final_norm.output": [("add", rows)]})
    assert rel(nxt, lg2[-1].numpy()) < TOL
    assert rel(nxt, r.forward(ids + [7])[0][-1].numpy()) > 1e-2


def test_trace_without_points_is_a_step(client):
    ref = reference("llama3")
    with client.model("llama3").session() as s:
        with s.trace(ref["prompt_ids"]) as t:
            pass
        assert rel(t.logits.numpy(), ref["last_logits"]) < 2e-3
        with s.trace([5], logits="none") as t:
            h = t.layers[0].output.save()
        assert t.logits is None and h.shape == (1, 64) and s.pos == len(ref["prompt_ids"]) + 1


def test_local_checks(client):
    """Bad names, layers, tensors and counts are refused before anything is sent."""
    m = client.model("llama2")
    with m.session() as s:
        t = s.trace([1, 2, 3])
        with pytest.raises(ValueError, match="unknown point"):
            t.point("layers.0.resid")
        with pytest.raises(IndexError, match="out of range"):
            t.point("layers.2.output")
        with pytest.raises(IndexError, match="out of range"):
            t.layers[2]
        with pytest.raises(AttributeError, match="no point"):
            t.layers[0].attn.input
        with pytest.raises(ValueError, match="does not fit"):
            t.layers[0].output += np.zeros(63, np.float32)
        with pytest.raises(ValueError, match="does not fit"):
            t.layers[0].output = np.zeros((2, 64), np.float32)
        with pytest.raises(TypeError, match="real numbers"):
            t.layers[0].output += np.array(["a"] * 64)
        with pytest.raises(ValueError, match="NaN"):
            t.layers[0].output += np.full(64, np.nan, np.float32)
        for _ in range(64):
            t.layers[0].output.save()
        with pytest.raises(ValueError, match="at most 64"):
            t.layers[1].output.save()
        with pytest.raises(RuntimeError, match="after the `with` block"):
            djinn.trace.Saved("layers.0.output").numpy()
        with pytest.raises(ValueError, match="'last' or 'none'"):
            s.trace([1], logits="all")
        assert s.pos == 0  # nothing ran


def raw_step(client, sess, points, ids=(1, 2, 3), payload=b"", **extra):
    meta = {"session": sess.id, "ids": list(ids), "points": points}
    meta.update(extra)
    return client._call(_wire.STEP, meta, payload)


def test_server_checks(client):
    """The server's own checks, for clients that are not this package."""
    m = client.model("llama2")
    vec = np.zeros(64, "<f4").tobytes()
    with m.session() as s:
        cases = [
            ([{"point": "layers.0.resid", "op": "save"}], b"", {}, djinn.InvalidError, "unknown point"),
            ([{"point": "layers.2.output", "op": "save"}], b"", {}, djinn.RangeError, "out of range"),
            ([{"point": "layers.0.output", "op": "scale"}], b"", {}, djinn.InvalidError, "op must be"),
            ([{"point": "layers.0.output", "op": "add", "shape": [63]}], vec[:252], {}, djinn.InvalidError,
             "does not fit"),
            ([{"point": "layers.0.output", "op": "add", "shape": [2, 64]}], vec * 2, {}, djinn.InvalidError,
             "does not fit"),
            ([{"point": "layers.0.output", "op": "add", "shape": [64]}], vec + b"\0\0\0\0", {}, djinn.InvalidError,
             "payload holds"),
            ([{"point": "layers.0.output", "op": "add", "shape": [64], "dtype": "f16"}], vec, {},
             djinn.UnsupportedError, "f32"),
            ([{"point": "layers.0.output", "op": "save"}] * 65, b"", {}, djinn.InvalidError, "at most 64"),
            ([], b"", {}, djinn.InvalidError, "empty"),
            ([{"point": "layers.0.output", "op": "save"}], b"", {"logits": "all"}, djinn.InvalidError,
             "'last' or 'none'"),
        ]
        for points, payload, extra, exc, msg in cases:
            with pytest.raises(exc, match=msg):
                raw_step(client, s, points, payload=payload, **extra)
        assert [x["pos"] for x in client.stats()["sessions"] if x["id"] == s.id] == [0]  # none of them ran
    # malformed points (a format error) and an oversized payload (refused
    # before it is read) close the connection, as the protocol says
    for points, payload, exc, msg in (
            ([{"op": "save"}], b"", djinn.FormatError, "'point' and 'op'"),
            ([{"point": "layers.0.output", "op": "add", "shape": [64]}], b"\0" * (64 * 4 * 64 + 4), djinn.RangeError,
             "take at most")):
        c2 = djinn.connect(client.addr, reconnect=False)
        s2 = c2.model("llama2").session()
        with pytest.raises(exc, match=msg):
            raw_step(c2, s2, points, ids=[1], payload=payload)
        c2.close()


def test_handle_quota_counts_saves(daemon):
    """Saved points are handles: they count against --max-handles-per-conn."""
    c = djinn.connect(daemon.addr)
    try:
        with c.model("llama2").session() as s:
            held = []
            while len(held) + 64 <= c.max_handles:
                with s.trace([1], logits="none") as t:
                    held += [t.layers[0].output.save() for _ in range(64)]
            with pytest.raises(djinn.QuotaError, match="RELEASE some"):
                with s.trace([1], logits="none") as t:
                    for _ in range(c.max_handles - len(held) + 1):
                        t.layers[0].output.save()
    finally:
        c.close()


# ---- against transformers itself: reference.json's "trace" (tools/make_fixtures.py --add-trace) ----

ALL_FIXTURES = ("llama2", "llama3", "mistral", "qwen2", "tinyllama", "qwen3", "gemma2", "gemma3", "phi3",
                "phi3_longrope", "mixtral")


def check_against(client, name, ids, tr, tol=TOL):
    """Saves every point and steers as tr (the "trace" entry) says; compares."""
    m = client.model(name)
    L = m.num_layers
    with m.session() as s:
        with s.trace(ids) as t:
            hs = [t.layers[i].input.save() for i in range(L)] + [t.final_norm.output.save()]
            at = [t.layers[i].attn.output.save() for i in range(L)]
            ml = [t.layers[i].mlp.output.save() for i in range(L)]
        for i in range(L + 1):
            assert rel(hs[i].numpy(), tr["hidden_states"][i]) < tol, "%s hidden_states[%d]" % (name, i)
        for i in range(L):
            assert rel(at[i].numpy(), tr["attn_output"][i]) < tol, "%s layers.%d.attn.output" % (name, i)
            assert rel(ml[i].numpy(), tr["mlp_output"][i]) < tol, "%s layers.%d.mlp.output" % (name, i)
    st = tr["steer"]
    with m.session() as s:
        with s.trace(ids) as t:
            t.layers[st["layer"]].output += np.asarray(st["vector"], np.float32)
        assert rel(t.logits.numpy(), st["last_logits"]) < tol, "%s steered logits" % name


def torch_trace(name):
    """A "trace" entry made by torch_ref (the same fields make_fixtures.py
    writes from transformers): exercises check_against where the fixtures
    have none yet."""
    r = torch_model(name)
    ids = reference(name)["prompt_ids"]
    _, pts = r.forward(ids)
    vec = np.random.default_rng(1).standard_normal(r.d).astype(np.float32) * 2.0
    lg, _ = r.forward(ids, {"layers.0.output": [("add", vec)]})
    L = r.L
    return {"hidden_states": [pts["layers.%d.input" % i].tolist() for i in range(L)] + [pts["final_norm.output"].tolist()],
            "attn_output": [pts["layers.%d.attn.output" % i].tolist() for i in range(L)],
            "mlp_output": [pts["layers.%d.mlp.output" % i].tolist() for i in range(L)],
            "steer": {"layer": 0, "vector": vec.tolist(), "last_logits": lg[-1].tolist()}}


def test_check_against_torch_trace(client):
    check_against(client, "llama2", reference("llama2")["prompt_ids"], torch_trace("llama2"))


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_against_transformers(client, name):
    ref = reference(name)
    if "trace" not in ref:
        pytest.skip("%s: reference.json has no 'trace' yet (python3 tools/make_fixtures.py --add-trace on a "
                    "machine with transformers)" % name)
    check_against(client, name, ref["prompt_ids"], ref["trace"])
