"""test_client.py: djinn's client against a real djinnd - ghosts, generate
(equal to `djinn run`/`djinn generate` and to transformers' references),
sessions, errors, heartbeats, a dropped connection."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import djinn
from conftest import FIXTURE_MODELS, LEASE_MS, ROOT, SHORT_LEASE_MS, Daemon, reference


def test_models_and_ghost(client, daemon):
    names = {m.name for m in client.models()}
    assert names == {"demo", "alien", "huge", *FIXTURE_MODELS}
    m = client.model("demo")
    with open(os.path.join(ROOT, "models", "demo", "config.json")) as f:
        assert m.config == json.load(f)
    assert m.generation_config["temperature"] == 0.8
    assert m.tokenizer_config["eos_token"] == "<|eos|>"
    assert (m.vocab_size, m.max_ctx, m.num_layers, m.hidden_size) == (4096, 512, 8, 256)
    assert m.eos_token_ids == [1] and m.has_tokenizer and m.arch == "LlamaForCausalLM"
    q = client.model("qwen2")  # sharded checkpoint, no tokenizer, no generation_config
    assert not q.has_tokenizer and q.generation_config == {} and q.config["model_type"] == "qwen2"
    assert "weights on the server" in repr(m)
    # a ghost loads nothing: no model is held by the server
    assert all(not x.loaded for x in client.models())


@pytest.mark.parametrize("name", FIXTURE_MODELS + ("demo",))
def test_greedy_equals_reference(client, name):
    ref = reference(name)
    m = client.model(name)
    g = m.generate(ref["prompt_ids"], max_new_tokens=24, ignore_eos=True, stream=False)
    assert g.ids == ref["greedy"], name
    assert g.reason == "length" and g.info["n_prompt"] == len(ref["prompt_ids"])


def test_greedy_equals_djinn_run(client, daemon):
    ref = reference("llama3")
    got = subprocess.run([daemon.cli, "run", "--model", os.path.join(daemon.store, "llama3"), "--tokens",
                          ",".join(map(str, ref["prompt_ids"])), "-n", "16", "--greedy", "--print-tokens",
                          "--ignore-eos"], capture_output=True, text=True, check=True).stdout.split()
    ids = [t.id for t in client.model("llama3").generate(ref["prompt_ids"], max_new_tokens=16, ignore_eos=True)]
    assert ids == [int(x) for x in got]


def test_sampled_text_equals_djinn_generate(client, daemon):
    cli = subprocess.run([daemon.cli, "generate", "--server", daemon.addr, "--model", "demo", "--prompt", "NAME\n",
                          "-n", "12", "--temp", "0.8", "--top-p", "0.95", "--seed", "7", "--print-tokens"],
                         capture_output=True, text=True, check=True).stdout.split()
    stream = client.model("demo").generate("NAME\n", max_new_tokens=12, temperature=0.8, top_p=0.95, seed=7)
    toks = list(stream)
    assert [t.id for t in toks] == [int(x) for x in cli]
    assert [t.index for t in toks] == list(range(len(toks)))
    assert stream.result.text == "".join(t.text for t in toks) + stream.result.info.get("text", "")


def test_logit_bias_forces_and_bans(client):
    m = client.model("llama3")
    p = reference("llama3")["prompt_ids"]
    plain = m.generate(p, max_new_tokens=6, stream=False, ignore_eos=True)
    forced = m.generate(p, max_new_tokens=6, stream=False, ignore_eos=True, logit_bias={7: 100})
    assert forced.ids == [7] * 6
    banned = m.generate(p, max_new_tokens=6, stream=False, ignore_eos=True, logit_bias={plain.ids[0]: -100})
    assert plain.ids[0] not in banned.ids[:1]


def test_stream_false_and_stop_ids(client):
    m = client.model("llama3")
    p = reference("llama3")["prompt_ids"]
    full = m.generate(p, max_new_tokens=12, stream=False)
    assert isinstance(full, djinn.Generation) and len(full.ids) == 12 and str(full) == full.text
    stop = full.ids[5]
    cut = m.generate(p, max_new_tokens=12, stop_ids=[stop], stream=False)
    first = full.ids.index(stop)
    assert cut.ids == full.ids[:first] and cut.reason == "stop" and cut.stop_id == stop


def test_session_continues_context(client):
    """step + generate in one session equal one generate over the whole prompt."""
    ref = reference("llama2")
    p = ref["prompt_ids"]
    m = client.model("llama2")
    with m.session() as s:
        assert s.step(p[:5], logits="none") is None and s.pos == 5
        g = s.generate(p[5:], max_new_tokens=10, ignore_eos=True, stream=False)
        assert s.pos == len(p) + 9  # the last token is pending: fed by the next request
    assert g.ids == ref["greedy"][:10]


def test_step_logits_equal_reference(client):
    for name in ("llama3", "demo"):
        ref = reference(name)
        with client.model(name).session() as s:
            t = s.step(ref["prompt_ids"])
            assert t.shape == (len(ref["last_logits"]),) and t.dtype == np.float32
            got = t.numpy()
            want = np.array(ref["last_logits"], dtype=np.float32)
            assert np.max(np.abs(got - want)) < 2e-3 * max(1.0, np.max(np.abs(want)))
            assert int(np.argmax(got)) == ref["greedy"][0]
            assert s.pos == len(ref["prompt_ids"])


def test_pause_resume(client):
    with client.model("llama2").session() as s:
        s.step([1, 2, 3], logits="none")
        s.pause(expected_ms=500)
        assert s.paused
        with pytest.raises(djinn.BusyError) as e:
            s.step([4])
        assert e.value.name == "DJ_EBUSY" and "paused" in e.value.message and e.value.status == -10
        s.resume()
        assert not s.paused
        s.step([4], logits="none")
        assert s.pos == 4
        assert any(x["id"] == s.id for x in client.stats()["sessions"])
    assert not any(x["id"] == s.id for x in client.stats()["sessions"])


def test_server_errors_are_exceptions(client):
    with pytest.raises(djinn.NotFoundError) as e:
        client.model("no-such-model")
    assert e.value.name == "DJ_ENOTFOUND" and "no-such-model" in e.value.message
    with pytest.raises(djinn.InvalidError):
        client.model("../etc")
    m = client.model("llama2")
    with m.session(expected_tokens=8) as s:
        with pytest.raises(djinn.RangeError):
            s.step(list(range(1, 12)))
    with pytest.raises(ValueError, match="closed"):
        s.step([1])
    # the connection survives semantic errors
    assert client.heartbeat()["lease_ms"] == LEASE_MS


def test_session_cache_salt(client):
    m = client.model("llama2")
    with m.session(expected_tokens=16, cache_salt="tenant-a") as s:
        s.step([1, 2, 3])
    with client.session("llama2", expected_tokens=16, cache_salt="tenant-b") as s:
        s.step([1, 2, 3])
    for bad in ("", "x" * 257, 7):
        with pytest.raises(ValueError, match="cache_salt"):
            m.session(cache_salt=bad)


def test_model_info_refusals(client, daemon):
    with pytest.raises(djinn.UnsupportedError):
        client.model("alien")
    with pytest.raises(djinn.RangeError, match="256 KiB"):
        client.model("huge")
    # a wrong field type is a protocol error: ERROR, then the server closes
    raw = djinn.connect(daemon.addr, reconnect=False)
    with pytest.raises(djinn.FormatError):
        raw._call(0x0F, {"model": 7})
    with pytest.raises(djinn.ConnectionLost):
        raw.models()
    raw.close()


def test_bad_arguments_raise_before_sending(client):
    m = client.model("llama2")
    s = m.session()
    sent = client._next_id
    for call, exc in [
        (lambda: s.step([m.vocab_size]), ValueError),
        (lambda: s.step([-1]), ValueError),
        (lambda: s.step("hello"), TypeError),
        (lambda: s.step([1.5]), TypeError),
        (lambda: s.step(np.zeros((2, 2), dtype=np.int32)), ValueError),
        (lambda: s.step([1], logits="first"), ValueError),
        (lambda: s.pause(expected_ms=-1), ValueError),
        (lambda: m.generate([1, 2], temperature=-1), ValueError),
        (lambda: m.generate([1, 2], top_p=0), ValueError),
        (lambda: m.generate([1, 2], max_new_tokens="5"), TypeError),
        (lambda: m.generate([1, 2], seed=-3), ValueError),
        (lambda: m.generate([1, 2], bogus=1), TypeError),
        (lambda: m.generate([1, 2], min_p=1.5), ValueError),
        (lambda: m.generate([1, 2], presence_penalty=-3), ValueError),
        (lambda: m.generate([1, 2], repetition_penalty="1"), TypeError),
        (lambda: m.generate([1, 2], top_a=1.5), ValueError),
        (lambda: m.generate([1, 2], logit_bias=[1]), TypeError),
        (lambda: m.generate([1, 2], logit_bias={m.vocab_size: 1}), ValueError),
        (lambda: m.generate([1, 2], logit_bias={"1": 1}), TypeError),
        (lambda: m.generate([1, 2], logit_bias={1: 101}), ValueError),
        (lambda: m.generate("text", max_new_tokens=2), ValueError),  # llama2 fixture has no tokenizer
        (lambda: m.generate("", max_new_tokens=2), ValueError),
        (lambda: m.session(qos="urgent"), ValueError),
        (lambda: m.session(expected_tokens=0), ValueError),
        (lambda: client.model(3), TypeError),
    ]:
        with pytest.raises(exc):
            call()
    assert client._next_id == sent, "a bad argument reached the server"
    s.close()
    with pytest.raises(ValueError):
        djinn.connect("localhost")
    with pytest.raises(TypeError):
        djinn.connect(7070)


def test_heartbeats_keep_sessions(tmp_path):
    d = Daemon(str(tmp_path), lease_ms=SHORT_LEASE_MS)
    client = djinn.connect(d.addr)
    try:
        s = client.model("llama2").session()
        time.sleep(2.0 * SHORT_LEASE_MS / 1000)  # heartbeats every lease/3 keep it
        s.step([1], logits="none")
        client.set_heartbeat(0)
        time.sleep(2.0 * SHORT_LEASE_MS / 1000)  # no heartbeat, no request: the lease lapses
        with pytest.raises(djinn.NotFoundError):
            s.step([2], logits="none")
        s.close()  # already gone: closing is quiet
    finally:
        client.close()
        rc = d.stop()
    assert rc == 0, "djinnd exited with %s:\n%s" % (rc, d.stderr())


def test_dropped_connection_raises(daemon):
    c = djinn.connect(daemon.addr, reconnect=False)  # test_reconnect.py: the other way
    s = c.model("llama2").session()
    c._send(0x7F, {}, b"", 999)  # an unknown type: the server answers DJ_EFORMAT and closes
    with pytest.raises(djinn.ConnectionLost):
        for _ in range(100):
            s.step([1], logits="none")
            time.sleep(0.01)
    assert c.closed
    with pytest.raises(djinn.ConnectionLost):
        c.models()
    c.close()
    with pytest.raises(djinn.ConnectionLost):
        djinn.connect("127.0.0.1:1")


def test_connection_close_frees_everything(daemon, client):
    other = djinn.connect(daemon.addr)
    s = other.model("llama2").session()
    t = s.step([1, 2])
    before = client.stats()
    other.close()
    for _ in range(3000):  # the server sees the close on its own time (30 s: a bound for a stuck daemon)
        after = client.stats()  # the handles go first, the connection's count after them: wait for both
        if after["handles"] < before["handles"] and after["connections"] < before["connections"]:
            break
        time.sleep(0.01)
    assert after["handles"] == before["handles"] - 1
    assert after["connections"] == before["connections"] - 1
    del t


def test_several_threads_share_a_client(client):
    import threading
    ref = reference("tinyllama")
    m = client.model("tinyllama")
    out = [None] * 4

    def run(i):
        out[i] = m.generate(ref["prompt_ids"], max_new_tokens=8, ignore_eos=True, stream=False).ids

    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert out == [ref["greedy"][:8]] * 4


def test_without_torch(daemon):
    """numpy + msgpack are enough; torch-only parts say what they need."""
    code = r"""
import sys
sys.modules["torch"] = None  # import torch now fails, as without python3-torch
sys.path.insert(0, sys.argv[2])
import djinn
c = djinn.connect(sys.argv[1])
with c.model("llama2").session() as s:
    t = s.step([1, 2, 3])
    assert t[:4].shape == (4,)
    try:
        t.torch()
        raise SystemExit("torch() worked without torch")
    except ImportError as e:
        assert "python3-torch" in str(e)
try:
    import djinn.hf
    raise SystemExit("djinn.hf imported without torch")
except ImportError as e:
    assert "python3-torch" in str(e)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code, daemon.addr, os.path.join(ROOT, "python")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_exit_with_live_tensors_is_quiet(daemon):
    """Tensors still alive at interpreter exit: no error, no hang."""
    code = r"""
import sys
sys.path.insert(0, sys.argv[2])
import djinn
c = djinn.connect(sys.argv[1])
s = c.model("llama2").session()
keep = [s.step([1, 2]) for _ in range(3)]
"""
    r = subprocess.run([sys.executable, "-c", code, daemon.addr, os.path.join(ROOT, "python")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_token(tmp_path):
    """A daemon with --token-file: HELLO's token decides, and its QoS classes."""
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret qos=batch\n")
    d = Daemon(str(tmp_path), extra=("--token-file", str(tokens)))
    try:
        for bad in (None, "wrong"):
            with pytest.raises(djinn.InvalidError):
                djinn.connect(d.addr, token=bad)
        with djinn.connect(d.addr, token="s3cret") as c:
            m = c.model("llama2")
            with pytest.raises(djinn.InvalidError):
                m.session(qos="interactive")  # this token grants batch only
            with m.session(qos="batch") as s:
                assert s.step([1, 2]).shape == (m.vocab_size,)
    finally:
        assert d.stop() == 0, d.stderr()


def test_sampling_fields_follow_the_c_table():
    """_wire.sampling_value checks each field of the generated SAMPLING table
    (test_sample_schema keeps it equal to include/djinn/sample_schema.h)."""
    from djinn import _wire
    assert {"temperature", "top_k", "top_p", "seed", "min_p"} <= set(_wire.SAMPLING)
    for name, (kind, lo, lo_open, hi, default, _what) in _wire.SAMPLING.items():
        assert _wire.sampling_value(name, default) == default
        if kind != "f32":
            with pytest.raises(ValueError, match=name):
                _wire.sampling_value(name, -1)
            with pytest.raises(TypeError, match=name):
                _wire.sampling_value(name, 0.5)
            continue
        with pytest.raises(ValueError, match=name):
            _wire.sampling_value(name, lo if lo_open else lo - 0.5)
        with pytest.raises(ValueError, match=name):
            _wire.sampling_value(name, float("nan"))
        if hi != float("inf"):
            with pytest.raises(ValueError, match=r"%s .*\[|%s .*\(" % (name, name)):
                _wire.sampling_value(name, hi + 0.5)
        with pytest.raises(TypeError, match=name):
            _wire.sampling_value(name, "0.5")


def test_generate_with_top_a(client):
    """top_a (added to include/djinn/sample_schema.h alone) goes through
    generate's keywords to djinnd, which runs it; djinnd refuses one out of
    range naming it (sent raw, past the package's own check)."""
    m = client.model("llama2")
    g = m.generate([1, 15, 27], max_new_tokens=4, temperature=0.9, seed=5, top_a=0.3, stream=False)
    assert len(g.ids) == 4
    s = m.session()
    try:
        with pytest.raises(djinn.InvalidError, match=r"top_a 1\.5 is out of range"):
            list(s._start_generate({"ids": [1, 2], "max_tokens": 2, "top_a": 1.5}, own_session=False))
    finally:
        s.close()
