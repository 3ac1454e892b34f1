"""test_lora.py: LoRA adapters from the Python package - generate(adapter=NAME) with an adapter of the
demo model in the server's store gives `djinn run --lora`'s tokens; a session keeps its adapter."""
import os
import subprocess

import pytest

import djinn
from conftest import ROOT


@pytest.fixture(scope="module")
def adapter(daemon):
    out = os.path.join(daemon.store, "demo-lora")
    if not os.path.exists(out):
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_lora_adapter.py"),
                        os.path.join(daemon.store, "demo"), out, "--seed", "5"], check=True, capture_output=True)
    return out


def run_cli(daemon, ids, lora=None):
    cmd = [daemon.cli, "run", "--model", os.path.join(daemon.store, "demo"), "--tokens", ",".join(map(str, ids)),
           "-n", "10", "--greedy", "--print-tokens", "--ignore-eos"]
    if lora:
        cmd += ["--lora", lora]
    return [int(x) for x in subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()]


def test_generate_with_adapter_equals_djinn_run(client, daemon, adapter):
    ids = [5, 17, 99, 3, 250]
    want = run_cli(daemon, ids, adapter)
    assert want != run_cli(daemon, ids)  # the adapter changes the tokens
    m = client.model("demo")
    got = m.generate(ids, max_new_tokens=10, ignore_eos=True, adapter="demo-lora", stream=False).ids
    assert got == want
    with m.session() as s:  # a session keeps the adapter its first generation chose
        first = s.generate(ids, max_new_tokens=10, ignore_eos=True, adapter="demo-lora", stream=False).ids
        assert first == want
        s.generate([first[-1]], max_new_tokens=2, ignore_eos=True, stream=False)
        with pytest.raises(djinn.errors.InvalidError):
            s.generate([first[-1]], max_new_tokens=2, adapter="another", stream=False)
    with pytest.raises(djinn.errors.NotFoundError):
        m.generate(ids, max_new_tokens=2, adapter="no-such-adapter", stream=False)
    with pytest.raises(ValueError):
        m.generate(ids, adapter="")
