"""test_breakpoint.py: breakpoints (Point.breakpoint, Trace.resume/cancel)
against a real djinnd - a resumed step equals the plain step bit for bit, edits
at a breakpoint equal a trace's, a cancelled step leaves the session as it
was, a paused session is busy while others generate, and a client that goes
at a breakpoint frees everything (STATS)."""

import time

import numpy as np
import pytest

import djinn
from conftest import SHORT_LEASE_MS, Daemon, reference

NAME = "llama3"


def ids_of(name=NAME):
    return reference(name)["prompt_ids"]


def test_resume_is_bit_identical(client):
    ids = ids_of()
    m = client.model(NAME)
    with m.session() as s:
        plain = s.step(ids).numpy()
        plain2 = s.step([5, 6]).numpy()
    with m.session() as s:
        with s.trace(ids) as t:
            want = t.layers[1].attn.output.save()
        want = want.numpy()
    with m.session() as s:
        with s.trace(ids) as t:
            b = t.layers[1].attn.output.breakpoint()
            late = t.layers[1].output.save()
        assert t.paused and t.at is b and s.pos == 0
        assert np.array_equal(b.value.numpy(), want)
        with pytest.raises(djinn.BusyError):
            s.step([1])  # the session is busy while its step is paused
        with pytest.raises(RuntimeError):
            late.numpy()  # saves come when the step ends
        t.resume()
        assert not t.paused and s.pos == len(ids)
        assert np.array_equal(t.logits.numpy(), plain)
        assert late.shape == (len(ids), m.hidden_size)
        assert np.array_equal(s.step([5, 6]).numpy(), plain2)  # the KV it left is the plain step's


def test_two_breakpoints_and_edits(client):
    ids = ids_of()
    m = client.model(NAME)
    rng = np.random.default_rng(7)
    v = rng.standard_normal(m.hidden_size).astype(np.float32) * 0.1
    with m.session() as s:
        with s.trace(ids) as t:
            ref_pre = t.layers[0].output.save()
            t.layers[0].output += v
        want = t.logits.numpy()
        ref_pre = ref_pre.numpy()
    with m.session() as s:
        with s.trace(ids) as t:
            b2 = t.final_norm.output.breakpoint()  # listed first, reached second
            b1 = t.layers[0].output.breakpoint()
        assert t.at is b1
        b1.add(v)
        t.resume()
        assert t.at is b2
        t.resume()
        assert np.array_equal(t.logits.numpy(), want)
    # slice assignment: equal to a trace that writes the edited tensor whole
    with m.session() as s:
        with s.trace(ids) as t:
            b = t.layers[0].output.breakpoint()
        x = b.numpy()
        assert np.array_equal(x, ref_pre)
        b[:, 3] = 0
        b[..., 10:20] *= 2
        x[:, 3] = 0
        x[..., 10:20] *= 2
        assert np.array_equal(b.numpy(), x)
        t.resume()
        got = t.logits.numpy()
    with m.session() as s:
        with s.trace(ids) as t:
            t.layers[0].output = x
        assert np.array_equal(got, t.logits.numpy())


def test_cancel_leaves_the_session(client):
    ids = ids_of()
    m = client.model(NAME)
    with m.session() as s:
        s.step(ids[:3], logits="none")
        want = s.step([9, 10]).numpy()
    with m.session() as s:
        s.step(ids[:3], logits="none")
        with s.trace(ids[3:]) as t:
            t.layers[1].mlp.output.breakpoint()
        assert t.paused
        t.cancel()
        assert t.cancelled and s.pos == 3
        assert np.array_equal(s.step([9, 10]).numpy(), want)
        with pytest.raises(RuntimeError):
            t.resume()


def test_refused_up_front(client):
    m = client.model(NAME)
    with m.session() as s:
        with pytest.raises(IndexError):
            s.trace([1, 2]).layers[99]
        # the wire: an unknown point, a second breakpoint at one place, a resume with nothing paused
        c = client
        for meta, err in (({"ids": [1, 2], "points": [{"point": "layers.1.foo", "op": "break"}]}, djinn.InvalidError),
                          ({"ids": [1, 2], "points": [{"point": "layers.0.output", "op": "break"},
                                                      {"point": "layers.1.input", "op": "break"}]},
                           djinn.InvalidError),
                          ({"resume": True}, djinn.InvalidError),
                          ({"cancel": True, "ids": [1]}, djinn.InvalidError)):
            meta["session"] = s.id
            with pytest.raises(err):
                c._call(djinn._wire.STEP, meta)
        assert s.pos == 0
        assert s.step([1, 2]).shape == (m.vocab_size,)


def test_others_run_while_paused(client, daemon):
    ids = ids_of()
    m = client.model(NAME)
    with m.session() as s:
        plain = s.step(ids).numpy()
    other = djinn.connect(daemon.addr)
    try:
        with m.session() as s:
            with s.trace(ids) as t:
                t.layers[1].input.breakpoint()
            assert t.paused
            with pytest.raises(djinn.BusyError):
                s.generate([1, 2], max_new_tokens=2, stream=False)
            g = other.model(NAME).generate(ids, max_new_tokens=8, ignore_eos=True, stream=False)
            assert len(g.ids) == 8
            st = client.stats()
            assert st["paused_steps"] == 1 and st["paused_step_bytes"] > 0
            mine = [x for x in st["sessions"] if x["id"] == s.id]
            assert mine and mine[0]["break_bytes"] == st["paused_step_bytes"]
            t.resume()
            assert np.array_equal(t.logits.numpy(), plain)
    finally:
        other.close()


def _paused_steps(c):
    for _ in range(200):
        st = c.stats()
        if st["paused_steps"] == 0:
            return st
        time.sleep(0.05)
    return st


def test_disconnect_frees_the_paused_step(daemon):
    watcher = djinn.connect(daemon.addr)
    try:
        c = djinn.connect(daemon.addr, reconnect=False)
        s = c.model(NAME).session()
        with s.trace(ids_of()) as t:
            t.layers[0].attn.output.breakpoint()
        assert t.paused
        st = watcher.stats()
        assert st["paused_steps"] == 1 and st["paused_step_bytes"] > 0
        c.close()  # at the breakpoint
        st = _paused_steps(watcher)
        assert st["paused_steps"] == 0 and st["paused_step_bytes"] == 0
        assert not [x for x in st["sessions"] if x["id"] == s.id]
    finally:
        watcher.close()


def test_resume_after_the_lease(tmp_path):
    d = Daemon(str(tmp_path), lease_ms=SHORT_LEASE_MS)
    c = djinn.connect(d.addr)
    try:
        s = c.model(NAME).session()
        with s.trace(ids_of()) as t:
            t.layers[1].output.breakpoint()
        c.set_heartbeat(0)
        time.sleep(2.5 * SHORT_LEASE_MS / 1000)  # the paused step counts against the lease: it lapses
        with pytest.raises(djinn.NotFoundError) as e:
            t.resume()
        assert "its lease ended" in e.value.message  # the server's word, kept by the client
        assert _paused_steps(c)["paused_steps"] == 0
    finally:
        c.close()
        rc = d.stop()
    assert rc == 0, "djinnd exited with %s:\n%s" % (rc, d.stderr())


def test_text_prompt_trace(client):
    """A trace of text: the server tokenizes it, the ids it used are readable,
    and the step equals the same ids sent as ids."""
    m = client.model("demo")
    text = "Hello there, general Kenobi"
    with m.session() as s:
        with s.trace(text) as t:
            h = t.layers[2].output.save()
        assert t.ids and t.n == len(t.ids) and s.pos == len(t.ids)
        assert h.shape == (len(t.ids), m.hidden_size)
        got, ids = t.logits.numpy(), t.ids
        hv = h.numpy()
    with m.session() as s:
        with s.trace(ids) as t:
            h2 = t.layers[2].output.save()
        assert np.array_equal(t.logits.numpy(), got) and np.array_equal(h2.numpy(), hv)
    # a breakpoint in a text trace: the ids come with the pause
    with m.session() as s:
        with s.trace(text) as t:
            b = t.layers[1].output.breakpoint()
        assert t.paused and t.ids == ids and b.value.shape == (len(ids), m.hidden_size)
        b[0] = 0  # the first position's row
        t.resume()
        assert s.pos == len(ids)
    with client.model(NAME).session() as s:  # a model without tokenizer.json: a clear error
        with pytest.raises(djinn.UnsupportedError):
            with s.trace("some text") as t:
                t.layers[0].output.save()


def test_region_edits_in_one_pass(client):
    """Slices and scaling made by the server: equal to writing the edited
    tensor whole."""
    ids = ids_of()
    m = client.model(NAME)
    n, d = len(ids), m.hidden_size
    v = (np.arange(10, dtype=np.float32) - 4.5) * 0.25
    bump = np.linspace(-1, 1, d).astype(np.float32)
    with m.session() as s:
        with s.trace(ids) as t:
            h = t.layers[0].output.save()
        x = h.numpy().copy()
    x[:, 3] *= 0
    x[..., 10:20] = v
    x[-1] += bump
    x[1:3, 5:7] *= 2.5
    with m.session() as s:
        with s.trace(ids) as t:
            t.layers[0].output[:, 3] *= 0
            t.layers[0].output[..., 10:20] = v
            t.layers[0].output[-1] += bump
            t.layers[1].input[1:3, 5:7] *= 2.5   # the same place by its other name
            after = t.layers[0].output.save()
        got = t.logits.numpy()
        assert np.array_equal(after.numpy(), x)
    with m.session() as s:
        with s.trace(ids) as t:
            t.layers[0].output = x
        assert np.array_equal(t.logits.numpy(), got)
    with m.session() as s:  # scaling a whole point
        with s.trace(ids) as t:
            y0 = t.layers[1].mlp.output.save()
            t.layers[1].mlp.output *= 0.5
            y = t.layers[1].mlp.output.save()
        assert np.array_equal(y.numpy(), y0.numpy() * np.float32(0.5))
    with m.session() as s:
        t = s.trace(ids)
        with pytest.raises(IndexError):
            t.layers[0].output[n] = 0
        with pytest.raises(ValueError):
            t.layers[0].output[::2] = 0
        with pytest.raises(ValueError):
            t.layers[0].output[:, 0:4] = np.zeros(5)
    # the wire: a region outside the point, a region on a resume
    with m.session() as s:
        for meta in ({"ids": [1, 2], "points": [{"point": "layers.0.output", "op": "mul", "shape": [1],
                                                 "rows": [0, 1], "cols": [d, d + 1]}]},
                     {"ids": [1, 2], "points": [{"point": "layers.0.output", "op": "mul", "shape": [2],
                                                 "rows": [1, 1], "cols": [0, 2]}]}):
            meta["session"] = s.id
            with pytest.raises(djinn.RangeError):
                client._call(djinn._wire.STEP, meta, np.ones(meta["points"][0]["shape"][0], "<f4").tobytes())
        assert s.pos == 0


def test_keep_outlives_its_session(client):
    ids = ids_of()
    m = client.model(NAME)
    with m.session() as s:
        with s.trace(ids) as t:
            kept = t.layers[0].output.save(keep=True)
            gone = t.layers[0].output.save()
    # the session closed: the kept save is the connection's, the other went with it
    a = kept.numpy()
    assert a.shape == (len(ids), m.hidden_size)
    with pytest.raises(djinn.NotFoundError) as e:
        gone.numpy()
    assert "went with its session" in str(e.value) and "keep" in str(e.value)
    with m.session() as s:  # the same values as a save read inside its session
        with s.trace(ids) as t:
            inside = t.layers[0].output.save()
        want = inside.numpy()
    assert np.array_equal(a, want)
    with m.session() as s:  # keep is a save's
        with pytest.raises(djinn.InvalidError):
            client._call(djinn._wire.STEP, {"session": s.id, "ids": [1, 2],
                                            "points": [{"point": "layers.0.output", "op": "break", "keep": True}]})


@pytest.mark.parametrize("name", ("demo", NAME))
def test_steered_generation_equals_the_client_loop(client, name):
    """s.generate(..., trace=steer): one request, the server applying the
    edits at every step, token for token the client's loop of traces."""
    m = client.model(name)
    ids = reference(name)["prompt_ids"][:6]
    rng = np.random.default_rng(3)
    v = rng.standard_normal(m.hidden_size).astype(np.float32)

    def steer(t):
        t.layers[1].output += v
        t.layers[0].mlp.output[..., 0:8] *= 0

    N = 24
    with m.session() as s:
        g = s.generate(ids, max_new_tokens=N, ignore_eos=True, stream=False, trace=steer)
    with m.session() as s:
        plain = s.generate(ids, max_new_tokens=N, ignore_eos=True, stream=False)
    loop, feed = [], ids
    with m.session() as s:
        for _ in range(N):
            with s.trace(feed) as t:
                steer(t)
            nxt = int(np.argmax(t.logits.numpy()))
            loop.append(nxt)
            feed = [nxt]
    assert list(g.ids) == loop
    assert list(plain.ids) != loop  # the steering changes the text
    with m.session() as s:
        with pytest.raises(ValueError):
            s.generate(ids, max_new_tokens=2, trace=lambda t: t.layers[0].output.save())
        with pytest.raises(ValueError):
            s.generate(ids, max_new_tokens=2, trace=lambda t: t.layers[0].output.__setitem__(0, 1.0))


def test_activation_patching_across_sessions(client):
    """Patching: the clean prompt's layer output written into the corrupted
    prompt's run (two sessions, positions addressed by slices). The last
    layer's whole output patched gives the clean logits bit for bit; one
    position patched at layer 0 moves the logits from the corrupted ones."""
    m = client.model(NAME)
    clean = ids_of()
    corrupt = list(clean)
    corrupt[1] = (corrupt[1] + 7) % m.vocab_size
    last = m.num_layers - 1
    with m.session() as s:
        with s.trace(clean) as t:
            h_last = t.layers[last].output.save()
            h0 = t.layers[0].output.save()
        want = t.logits.numpy()
        h_last, h0 = h_last.numpy(), h0.numpy()
    with m.session() as s:
        base = s.step(corrupt).numpy()
    assert not np.array_equal(base, want)
    with m.session() as s:
        with s.trace(corrupt) as t:
            t.layers[last].output = h_last
        assert np.array_equal(t.logits.numpy(), want)
    with m.session() as s:
        with s.trace(corrupt) as t:
            t.layers[0].output[1] = h0[1]  # the corrupted position only
            got0 = t.layers[0].output.save()
        assert np.array_equal(got0.numpy()[1], h0[1])
        assert not np.array_equal(t.logits.numpy(), base)
