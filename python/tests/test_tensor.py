"""test_tensor.py: RemoteTensor - values equal to the whole fetch, slices
that move only their bytes, handles freed by garbage collection."""

import gc

import numpy as np
import pytest

import djinn
from conftest import reference

V = 320  # the Llama 3 fixture's vocabulary


@pytest.fixture
def logits_all(client):
    """A [n, vocab] logits handle of the Llama 3 fixture (vocab 320) and its session."""
    ref = reference("llama3")
    s = client.model("llama3").session()
    t = s.step(ref["prompt_ids"], logits="all")
    yield s, t, ref
    s.close()


def test_shape_dtype_local(client, logits_all):
    s, t, ref = logits_all
    n = len(ref["prompt_ids"])
    before = client.fetched_bytes
    assert t.shape == (n, V) and t.ndim == 2 and len(t) == n and t.size == n * V
    assert t.dtype == np.float32 and t.nbytes == n * V * 4
    assert client.fetched_bytes == before  # nothing moved yet


def test_slice_moves_only_the_slice(client, logits_all):
    s, t, ref = logits_all
    n = len(ref["prompt_ids"])
    b0 = client.fetched_bytes
    head = t[-1, :100]
    assert head.shape == (100,) and client.fetched_bytes - b0 == 100 * 4
    b1 = client.fetched_bytes
    col = t[:, 7]  # one float from each row: n runs, n * 4 bytes
    assert col.shape == (n,) and client.fetched_bytes - b1 == n * 4
    b2 = client.fetched_bytes
    row = t[3]
    assert client.fetched_bytes - b2 == V * 4
    full = t.numpy()
    assert client.fetched_bytes - b2 == V * 4 + t.nbytes
    np.testing.assert_array_equal(head, full[-1, :100])
    np.testing.assert_array_equal(col, full[:, 7])
    np.testing.assert_array_equal(row, full[3])
    # the last row of "all" is what "last" gives, and transformers' reference
    want = np.array(ref["last_logits"], dtype=np.float32)
    assert np.max(np.abs(full[-1] - want)) < 2e-3 * max(1.0, np.max(np.abs(want)))
    # once fetched whole, slices are local
    b3 = client.fetched_bytes
    np.testing.assert_array_equal(t[2:5, ::3], full[2:5, ::3])
    assert client.fetched_bytes == b3


def test_slices_equal_numpy_indexing(client, logits_all):
    """Every kind of basic index against numpy's answer on the whole tensor,
    each through a fresh handle so nothing comes from the cache."""
    s, _, ref = logits_all
    ids = ref["prompt_ids"][:6]
    keys = [0, -1, (2, 5), (slice(None), 0), (slice(1, 4), slice(10, 20)), (slice(None, None, 2), slice(0, 8)),
            (Ellipsis, -3), (1, slice(100, None, 7)), (slice(4, 1, -1), slice(3, 9)), (slice(2, 2),),
            (slice(None), slice(None)), ([0, 2], 5), (np.int64(3), slice(None, 16))]
    with s.model.session() as s2:
        full = s2.step(ids, logits="all").numpy()
    for k in keys:
        with s.model.session() as s3:
            t = s3.step(ids, logits="all")
            got = t[k]
            np.testing.assert_array_equal(got, full[k], err_msg=repr(k))
            assert got.shape == full[k].shape
    with s.model.session() as s4:
        t = s4.step(ids, logits="all")
        for bad in [(6, 0), (0, V), (-7,), (0, 0, 0)]:
            with pytest.raises(IndexError):
                t[bad]


def test_many_pieces_fetch_one_bounding_range(client, logits_all):
    s, _, ref = logits_all
    with s.model.session() as s2:
        t = s2.step(ref["prompt_ids"][:2], logits="all")
        b0 = client.fetched_bytes
        every_other = t[0, ::2]  # 160 one-float pieces: one range instead
        assert client.fetched_bytes - b0 == (V - 1) * 4
        np.testing.assert_array_equal(every_other, t.numpy()[0, ::2])


def test_numpy_torch_tolist_repr(client):
    ref = reference("llama3")
    with client.model("llama3").session() as s:
        t = s.step(ref["prompt_ids"])
        b0 = client.fetched_bytes
        text = repr(t)  # small: printing fetches it
        assert text.startswith("RemoteTensor(shape=(320,), dtype=float32") and client.fetched_bytes - b0 == 320 * 4
        assert t.tolist() == t.numpy().tolist()
        assert np.asarray(t).shape == (320,)
        torch = pytest.importorskip("torch")
        tt = t.torch()
        assert isinstance(tt, torch.Tensor) and tt.shape == (320,) and int(tt.argmax()) == ref["greedy"][0]


def test_gc_frees_the_handle(client):
    with client.model("llama2").session() as s:
        base = client.stats()["handles"]
        t = s.step([1, 2, 3])
        u = s.step([4])
        assert client.stats()["handles"] == base + 2
        del t
        gc.collect()
        # the RELEASE goes out before the next request of this client
        assert client.stats()["handles"] == base + 1
        u.release()
        assert u.released and client.stats()["handles"] == base
        assert "released" in repr(u)
        with pytest.raises(ValueError, match="released"):
            u[0]


def test_handles_go_with_the_session(client):
    s = client.model("llama2").session()
    t = s.step([1, 2])
    s.close()
    with pytest.raises(djinn.NotFoundError):
        t.numpy()
