"""test_attach.py: a session opened with reattach=True outlives its client;
client.attach(id, secret) from another process takes it over with its KV
cache and position, and the CLI does the same (djinn generate --session)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import djinn
from conftest import ROOT, reference

# A second process: opens a reattachable session, feeds the prompt's first
# part, prints id, secret and position, and exits without closing it.
_OPENER = r"""
import sys
sys.path.insert(0, %r)
import djinn
c = djinn.connect(sys.argv[1])
s = c.model("tinyllama").session(reattach=True)
s.step([int(x) for x in sys.argv[2].split(",")], logits="none")
print(s.id, s.secret, s.pos, flush=True)
c.close()
"""


def _open_elsewhere(daemon, ids):
    out = subprocess.run([sys.executable, "-c", _OPENER % os.path.join(ROOT, "python"), daemon.addr,
                          ",".join(map(str, ids))], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    sid, secret, pos = (int(x) for x in out.stdout.split())
    return sid, secret, pos


def test_attach_from_another_process(daemon):
    ref = reference("tinyllama")
    p = ref["prompt_ids"]
    sid, secret, pos = _open_elsewhere(daemon, p[:5])
    assert pos == 5
    with djinn.connect(daemon.addr) as c:
        with pytest.raises(djinn.NotFoundError):
            c.attach(sid, secret ^ 1, wait_s=0)  # a wrong secret
        s = c.attach(sid, secret)
        assert (s.id, s.secret, s.pos, s.model.name) == (sid, secret, 5, "tinyllama")
        # the KV the other process fed is here: the rest of the prompt continues it
        got = s.step(p[5:]).numpy()
        want = np.array(ref["last_logits"], np.float32)
        assert np.max(np.abs(got - want)) < 2e-3 * max(1.0, np.max(np.abs(want)))
        assert s.pos == len(p)
    # closing the client left it for the next attach (reattach=True sessions outlive it)
    with djinn.connect(daemon.addr) as c:
        s = c.attach(sid, secret)
        assert s.pos == len(p)
        s.close()
    with djinn.connect(daemon.addr) as c:  # closed for good now
        with pytest.raises(djinn.NotFoundError):
            c.attach(sid, secret, wait_s=0)


def test_attach_bad_arguments(client):
    with pytest.raises(TypeError):
        client.attach("1", 2)
    with pytest.raises(ValueError):
        client.attach(1, -2)
    with pytest.raises(TypeError):
        client.model("tinyllama").session(reattach="yes")
    s = client.model("tinyllama").session(reattach=False)
    assert s.secret is not None or not client.reconnect  # a reconnecting client asks for one anyway
    s.close()


def test_cli_generate_in_an_attached_session(daemon):
    """A session fed its prompt in one process continues in `djinn generate
    --session ID --secret S` with the tokens of one uninterrupted generation."""
    ids = [1, 2, 3, 4, 5, 6]
    with djinn.connect(daemon.addr) as c:
        want = c.model("demo").generate(ids, max_new_tokens=8, ignore_eos=True, stream=False).ids
        s = c.model("demo").session(reattach=True)
        s.step(ids[:4], logits="none")
        sid, secret = s.id, s.secret
    out = subprocess.run([daemon.cli, "generate", "--server", daemon.addr, "--session", str(sid), "--secret",
                          str(secret), "--tokens", ",".join(map(str, ids[4:])), "-n", "8", "--greedy",
                          "--ignore-eos", "--print-tokens", "--keep"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert [int(x) for x in out.stdout.split()] == want
    assert "session %d secret %d" % (sid, secret) in out.stderr  # --keep says how to come back
    with djinn.connect(daemon.addr) as c:  # --keep left it open
        s = c.attach(sid, secret)
        assert s.pos == len(ids) + 8 - 1  # the last token is pending: fed with the next request
        s.close()
    out = subprocess.run([daemon.cli, "generate", "--server", daemon.addr, "--session", str(sid), "--secret",
                          str(secret), "--tokens", "1", "-n", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "not found" in out.stderr
    out = subprocess.run([daemon.cli, "generate", "--server", daemon.addr, "--session", "12x", "--secret", "1",
                          "--tokens", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--session" in out.stderr


def test_cli_session_file(daemon, tmp_path):
    """`djinn generate --session-file F` twice: the first opens a session and
    writes F, the second continues it - the tokens of both generations in one
    session."""
    ids1, ids2 = [7, 8, 9, 10, 11], [12, 13]
    with djinn.connect(daemon.addr) as c:
        with c.model("demo").session() as s:
            want1 = s.generate(ids1, max_new_tokens=5, ignore_eos=True, stream=False).ids
            want2 = s.generate(ids2, max_new_tokens=5, ignore_eos=True, stream=False).ids
    f = str(tmp_path / "sess")
    got = []
    for ids in (ids1, ids2):
        out = subprocess.run([daemon.cli, "generate", "--server", daemon.addr, "--model", "demo", "--session-file", f,
                              "--tokens", ",".join(map(str, ids)), "-n", "5", "--greedy", "--ignore-eos",
                              "--print-tokens"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        got.append([int(x) for x in out.stdout.split()])
    assert got == [want1, want2]
    assert oct(os.stat(f).st_mode & 0o777) == "0o600"
    sid, secret = (int(x) for x in open(f).read().split())
    with djinn.connect(daemon.addr) as c:
        c.attach(sid, secret).close()
    with open(f, "w") as fh:
        fh.write("garbage\n")
    out = subprocess.run([daemon.cli, "generate", "--server", daemon.addr, "--session-file", f, "--tokens", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "ID SECRET" in out.stderr


def test_export_import_continues_the_same_tokens(client, tmp_path):
    """Session.export / Client.import_session: a session moved (as bytes, and
    through a file) goes on with the tokens of one never moved, greedy and
    seeded; a damaged image is refused and the connection stays."""
    m = client.model("demo")
    p1, p2 = [5, 6, 7, 8, 9, 10, 11], [12, 13, 14]
    for kw in ({}, {"temperature": 0.8, "top_p": 0.9, "seed": 4242}):
        with m.session() as ref:
            a1 = ref.generate(p1, max_new_tokens=6, ignore_eos=True, stream=False, **kw).ids
            a2 = ref.generate(p2, max_new_tokens=6, ignore_eos=True, stream=False, **kw).ids
        s = m.session()
        b1 = s.generate(p1, max_new_tokens=6, ignore_eos=True, stream=False, **kw).ids
        image = s.export()
        path = s.export(str(tmp_path / "s.djs"))
        s.close()
        assert open(path, "rb").read() == image
        for src in (image, path):
            t = client.import_session(src)
            assert t.pos == len(p1) + 5 and t.secret is not None and t.model.name == "demo"
            b2 = t.generate(p2, max_new_tokens=6, ignore_eos=True, stream=False, **kw).ids
            t.close()
            assert (b1, b2) == (a1, a2), kw
    bad = bytearray(image)
    bad[40] ^= 1
    with pytest.raises(djinn.InvalidError, match="damaged"):
        client.import_session(bytes(bad))
    client.import_session(image).close()  # the connection is still good
