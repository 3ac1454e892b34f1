"""test_reconnect.py: a dropped connection (its socket killed, the daemon
alive) raises in the calls waiting on it, then the client connects again and
reattaches its sessions - their KV cache and position intact."""

import signal
import socket
import time

import numpy as np
import pytest

import djinn
from conftest import SHORT_LEASE_MS, Daemon, reference


def drop(c):
    """Kills the client's socket under it (as a network failure would): the
    server sees the connection close; the client's reader sees EOF."""
    c._sock.shutdown(socket.SHUT_RDWR)


def wait_reconnected(c, n, timeout=10.0):
    end = time.monotonic() + timeout
    while c.reconnects < n and time.monotonic() < end:
        time.sleep(0.01)
    assert c.reconnects >= n, "the client did not reconnect"


def test_reconnect_reattaches_sessions(daemon):
    ref = reference("tinyllama")
    p = ref["prompt_ids"]
    c = djinn.connect(daemon.addr)
    try:
        m = c.model("tinyllama")
        s = m.session()
        old = s.step(p[:5])  # a tensor of the first connection
        drop(c)
        wait_reconnected(c, 1)  # the background thread reconnects at once
        assert not c.closed and c.epoch == 1
        # the session came back with its KV: the rest of the prompt continues it
        assert s.pos == 5
        new = s.step(p[5:])
        got = new.numpy()
        want = np.array(ref["last_logits"], np.float32)
        assert np.max(np.abs(got - want)) < 2e-3 * max(1.0, np.max(np.abs(want)))
        assert s.pos == len(p)
        # its old tensor went with the old connection
        with pytest.raises(djinn.ConnectionLost, match="dropped"):
            old.numpy()
        del old  # its finalizer sends nothing to the new connection
        assert c.stats()["handles"] >= 1  # the new tensor, still held
        assert new[:3].shape == (3,)
        s.close()
    finally:
        c.close()


def test_call_in_flight_raises_then_reconnects(daemon):
    ref = reference("tinyllama")
    c = djinn.connect(daemon.addr)
    try:
        s = c.model("tinyllama").session()
        s.step(ref["prompt_ids"], logits="none")
        # The daemon is stopped while the request goes out and the socket drops,
        # so no frame of the generation can reach the client first: the call is
        # in flight whatever the machine's speed (a tiny model running free could
        # finish all its tokens before the drop).
        daemon.proc.send_signal(signal.SIGSTOP)
        try:
            stream = s.generate([3], max_new_tokens=20, ignore_eos=True)
            drop(c)
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
        with pytest.raises(djinn.ConnectionLost):
            for _ in stream:
                pass
        wait_reconnected(c, 1)
        assert s.pos >= len(ref["prompt_ids"])  # what was fed before the drop stays
        pos = s.pos
        s.step([3], logits="none")
        # more than one: a step the worker was running when the session was
        # reattached, and the generation's last pick (fed first) may come before
        assert s.pos > pos
        assert [x["pos"] for x in c.stats()["sessions"] if x["id"] == s.id] == [s.pos]
        s.close()
    finally:
        c.close()


def test_lazy_reconnect_in_the_next_call(daemon):
    """Without the heartbeat thread's help: the next call reconnects first."""
    c = djinn.connect(daemon.addr)
    try:
        c.set_heartbeat(0)
        s = c.model("llama3").session()
        s.step([1, 2, 3], logits="none")
        with c._conn_mu:  # hold off the background thread's reconnect
            drop(c)
            for _ in range(500):
                if c._dead is not None:
                    break
                time.sleep(0.01)
            assert c.closed
        assert s.step([4]).shape == (320,)
        assert s.pos == 4 and c.reconnects == 1
        s.close()
    finally:
        c.close()


def test_session_past_its_lease_is_lost(tmp_path):
    """A session whose lease ran out before the client came back is gone:
    using it says so (a daemon of its own, with a short lease)."""
    d = Daemon(str(tmp_path), lease_ms=SHORT_LEASE_MS)
    c = djinn.connect(d.addr)
    try:
        s = c.model("llama3").session()
        with c._conn_mu:
            drop(c)
            time.sleep(2.5 * SHORT_LEASE_MS / 1000)  # past the lease, on the daemon's clock too
        wait_reconnected(c, 1)
        with pytest.raises(djinn.ConnectionLost, match="SESSION_ATTACH failed"):
            s.step([1])
        other = c.model("llama3").session()  # the connection itself works
        assert other.step([1]).shape == (320,)
        other.close()
    finally:
        c.close()
        d.stop()
