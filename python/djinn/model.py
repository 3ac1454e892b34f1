"""model.py: the ghost of a model (its config and tokenizer settings, no
weights), sessions on it (step, generate, pause, resume) and the token
streams a generation sends back."""

import collections
import json
import os
import random

import numpy as np

from . import _wire, errors
from .tensor import RemoteTensor

_QOS = ("realtime", "interactive", "batch")
_LOGITS = ("last", "all", "none")
_U64 = (1 << 64) - 1
_IDS_IN_META = 4096  # STEP ids up to this many go in the metadata; more in the payload


class Token(collections.namedtuple("Token", "id text index")):
    """One generated token: its id, its text piece ("" until a piece is
    complete UTF-8, or when the model has no tokenizer) and its index."""


def _json_or_empty(text, what):
    if not text:
        return {}
    try:
        v = json.loads(text)
    except ValueError as e:
        raise errors.FormatError(-4, "DJ_EFORMAT", "the model's %s is not JSON: %s" % (what, e)) from None
    return v if isinstance(v, dict) else {}


def _ids_list(ids, vocab, what="ids"):
    """ids (list/tuple/range of ints, 1-D numpy or torch integer tensor) ->
    list of int, each in [0, vocab). TypeError/ValueError before anything is sent."""
    if isinstance(ids, (str, bytes)):
        raise TypeError("%s must be token ids (a list of ints), not %s" % (what, type(ids).__name__))
    if hasattr(ids, "detach") and hasattr(ids, "cpu"):  # a torch tensor, without importing torch
        ids = ids.detach().cpu().numpy()
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise ValueError("%s must be 1-D, got shape %s (one sequence per call)" % (what, ids.shape))
        if ids.dtype.kind not in "iu":
            raise TypeError("%s must be integers, got dtype %s" % (what, ids.dtype))
        out = [int(x) for x in ids]
    else:
        try:
            out = list(ids)
        except TypeError:
            raise TypeError("%s must be a sequence of ints, not %s" % (what, type(ids).__name__)) from None
        for x in out:
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                raise TypeError("%s must be ints, found %r" % (what, x))
        out = [int(x) for x in out]
    for x in out:
        if not 0 <= x < vocab:
            raise ValueError("token id %d is outside the model's vocabulary [0, %d)" % (x, vocab))
    return out


def _number(name, v, lo=None, hi=None, integer=False, lo_open=False):
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, kinds):
        raise TypeError("%s must be %s, not %r" % (name, "an int" if integer else "a number", v))
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ValueError("%s must be %s %s, got %r" % (name, ">" if lo_open else ">=", lo, v))
    if hi is not None and v > hi:
        raise ValueError("%s must be <= %s, got %r" % (name, hi, v))
    return int(v) if integer else float(v)


class Model:
    """A model on the server, held here as a ghost: name, config (config.json
    as a dict), generation_config, tokenizer_config, eos_token_ids, vocab_size,
    max_ctx; no weights. Get one with client.model("name")."""

    def __init__(self, client, info):
        self._client = client
        self.name = info.get("model", "")
        self.arch = info.get("arch", "")
        self.vocab_size = int(info.get("vocab", 0))
        self.max_ctx = int(info.get("max_ctx", 0))
        self.num_layers = int(info.get("layers", 0))
        self.hidden_size = int(info.get("hidden", 0))
        self.eos_token_ids = [int(x) for x in info.get("eos_ids", [])]
        self.has_tokenizer = bool(info.get("tokenizer", False))
        self.config = _json_or_empty(info.get("config"), "config.json")
        self.generation_config = _json_or_empty(info.get("generation_config"), "generation_config.json")
        self.tokenizer_config = _json_or_empty(info.get("tokenizer_config"), "tokenizer_config.json")

    @property
    def client(self):
        return self._client

    def __repr__(self):
        return "<djinn.Model %r %s: %d layers, hidden %d, vocab %d, %d positions%s (weights on the server)>" % (
            self.name, self.arch, self.num_layers, self.hidden_size, self.vocab_size, self.max_ctx,
            ", tokenizer" if self.has_tokenizer else "")

    def session(self, qos="interactive", expected_tokens=None, cache_salt=None, reattach=False):
        """Opens a session (its own KV cache on the server); use it as a
        context manager or close() it. cache_salt (a str of 1-256 bytes): its
        prefix-cache blocks are shared only with sessions of the same token
        and the same cache_salt (docs/prefix-cache.md).

        reattach=True: the session outlives its client - closing the Client
        (or the process ending) leaves it on the server for its lease, and
        client.attach(s.id, s.secret) takes it over from any process (only
        s.close() ends it)."""
        if qos not in _QOS:
            raise ValueError("qos must be one of %s, got %r" % (", ".join(_QOS), qos))
        if not isinstance(reattach, (bool, np.bool_)):
            raise TypeError("reattach must be a bool, not %r" % (reattach,))
        meta = {"model": self.name, "qos": qos}
        if self._client.reconnect or reattach:
            meta["reattach"] = True  # it survives a dropped connection (Client reattaches it)
        if expected_tokens is not None:
            meta["expected_tokens"] = _number("expected_tokens", expected_tokens, 1, self.max_ctx or None,
                                              integer=True)
        if cache_salt is not None:
            if not isinstance(cache_salt, str) or not 1 <= len(cache_salt.encode()) <= 256:
                raise ValueError("cache_salt must be a str of 1 to 256 bytes, got %r" % (cache_salt,))
            meta["cache_salt"] = cache_salt
        reply, _ = self._client._call(_wire.SESSION_OPEN, meta)
        return Session(self, reply, keep=bool(reattach))

    def generate(self, prompt, max_new_tokens=64, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                 stop_ids=None, ignore_eos=False, stream=True, qos="interactive", adapter=None, **sampling):
        """Generates from prompt (text, or token ids) in a session of its own.

        stream=True: an iterator of Token(id, text, index) (close it early and
        the generation stops); stream=False: a Generation with .text, .ids.
        temperature 0 is greedy; seed None draws a fresh one. adapter: the
        name of a LoRA adapter of this model in the server's model store
        (docs/lora.md). Other sampling options: every other field of
        GENERATE's sampling table (_wire.SAMPLING, docs/protocol.md): min_p,
        repetition_penalty, frequency_penalty, ..."""
        req = _generate_meta(self, prompt, max_new_tokens, temperature, top_p, top_k, seed, stop_ids,
                             ignore_eos, sampling, adapter)
        sess = self.session(qos=qos)
        try:
            ts = sess._start_generate(req, own_session=True)
        except BaseException:
            sess.close()
            raise
        return ts if stream else ts.collect()

    def load(self):
        """Pins the model on the server (MODEL_LOAD): it stays resident
        between sessions. Returns the server's answer (fingerprint, params...)."""
        reply, _ = self._client._call(_wire.MODEL_LOAD, {"model": self.name})
        return reply

    def unload(self):
        """Drops this connection's pin (MODEL_UNLOAD)."""
        reply, _ = self._client._call(_wire.MODEL_UNLOAD, {"model": self.name})
        return reply


def _logit_bias(bias, vocab):
    """{token id: bias} -> GENERATE's [[id, bias], ...]: at most 1024 ids, each in
    [0, vocab), bias a number in [-100, 100] (sample_params.h's rule)."""
    if not isinstance(bias, dict):
        raise TypeError("logit_bias must be a dict of token id to bias, not %s" % type(bias).__name__)
    if len(bias) > 1024:
        raise ValueError("logit_bias has %d entries: at most 1024" % len(bias))
    out = []
    for k, v in bias.items():
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
            raise TypeError("logit_bias keys must be token ids (ints), not %r" % (k,))
        if not 0 <= int(k) < vocab:
            raise ValueError("logit_bias names token id %d: the model's ids are 0 to %d" % (int(k), vocab - 1))
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError("logit_bias of token id %d must be a number, not %r" % (int(k), v))
        if not -100.0 <= float(v) <= 100.0:
            raise ValueError("logit_bias of token id %d is %r: must be in [-100, 100]" % (int(k), v))
        out.append([int(k), float(v)])
    return out


def _generate_meta(model, prompt, max_new_tokens, temperature, top_p, top_k, seed, stop_ids, ignore_eos,
                   sampling, adapter=None):
    meta = {}
    if adapter is not None:  # a LoRA adapter's folder in the server's model store (docs/lora.md)
        if not isinstance(adapter, str) or not 1 <= len(adapter.encode()) <= 127:
            raise ValueError("adapter must be the name of a folder in the model store, got %r" % (adapter,))
        meta["adapter"] = adapter
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("the prompt is empty: give some text or token ids")
        if not model.has_tokenizer:
            raise ValueError("model %r has no tokenizer.json on the server: give token ids, not text"
                             % model.name)
        meta["prompt"] = prompt
    else:
        meta["ids"] = _ids_list(prompt, model.vocab_size, "prompt")
    meta["max_tokens"] = _number("max_new_tokens", max_new_tokens, 0, integer=True)
    if seed is None:
        seed = random.SystemRandom().getrandbits(63)
    for k, v in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k), ("seed", seed)):
        meta[k] = _wire.sampling_value(k, v)
    if stop_ids is not None:
        meta["stop_ids"] = _ids_list(stop_ids, model.vocab_size, "stop_ids")
    bias = sampling.pop("logit_bias", None)
    if bias:
        meta["logit_bias"] = _logit_bias(bias, model.vocab_size)
    if not isinstance(ignore_eos, (bool, np.bool_)):
        raise TypeError("ignore_eos must be a bool, not %r" % (ignore_eos,))
    if ignore_eos:
        meta["ignore_eos"] = True
    for k, v in sampling.items():  # the other sampling fields, by the C table (docs/protocol.md)
        if k not in _wire.SAMPLING or k in meta:
            raise TypeError("generate() got an unexpected keyword argument %r" % k)
        if v is not None:
            meta[k] = _wire.sampling_value(k, v)
    return meta


class Session:
    """A session on the server: its own KV cache, position and lease (kept
    alive by the client's heartbeats). A context manager; close() ends it.
    id and secret (None unless opened to reattach) are what client.attach
    takes in another process."""

    def __init__(self, model, reply, keep=False, secret=None):
        self.model = model
        self._client = model._client
        self.id = int(reply["session"])
        self.max_ctx = int(reply.get("max_ctx", 0))
        self.vocab_size = int(reply.get("vocab", model.vocab_size))
        self.closed = False
        self._secret = int(reply["secret"]) if "secret" in reply else secret  # SESSION_ATTACH wants it
        self._keep = keep  # outlives its client: Client.close() leaves it for a later attach
        self.paused = bool(reply.get("paused", False))
        self.pos = int(reply.get("pos", 0))
        self._lost = None  # why a reconnect could not bring it back
        self._client._sessions[self.id] = self

    def __repr__(self):
        return "<djinn.Session %016x on %r pos %d/%d%s>" % (
            self.id, self.model.name, self.pos, self.max_ctx,
            " closed" if self.closed else " paused" if self.paused else "")

    @property
    def secret(self):
        """The secret client.attach(self.id, secret) wants (a u64), or None
        for a session not opened to reattach."""
        return self._secret

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self):
        if self.closed:
            raise ValueError("session %016x is closed" % self.id)
        if self._lost:
            raise errors.ConnectionLost("session %016x is gone: %s" % (self.id, self._lost))

    def export(self, path=None):
        """The session's image (SESSION_EXPORT; docs/swap.md, "Session
        images"): its KV cache (or history), pending token, QoS and cache
        salt, as bytes - or, with path, written to that file (returns path).
        Client.import_session opens it on any djinnd serving the same model
        (checkpoint fingerprint checked) and generation continues with the
        same tokens. The session stays open here. BusyError while it
        generates."""
        self._check_open()
        reply, _ = self._client._call(_wire.SESSION_EXPORT, {"session": self.id})
        handle, n = int(reply["handle"]), int(reply["bytes"])
        parts, off = [], 0
        try:
            while off < n:
                want = min(n - off, 64 << 20)
                _, data = self._client._call(_wire.FETCH, {"handle": handle, "offset": off, "length": want})
                if not data:
                    raise errors.ConnectionLost("session image: %d of %d bytes came" % (off, n))
                parts.append(bytes(data))
                off += len(data)
        finally:
            self._client._send_nowait(_wire.RELEASE, {"handle": handle})
        image = b"".join(parts)
        if path is None:
            return image
        tmp = "%s.tmp" % os.fspath(path)
        with open(tmp, "wb") as f:
            f.write(image)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    def close(self):
        """Ends the session; the server frees its KV pages and its tensors.
        Calling it again does nothing."""
        if self.closed:
            return
        self.closed = True
        if self._client.closed:
            return
        try:
            self._client._call(_wire.SESSION_CLOSE, {"session": self.id})
        except errors.NotFoundError:
            pass  # already gone (lease lapsed)

    def step(self, ids, logits="last"):
        """Feeds ids (prefill when several); returns the logits as a
        RemoteTensor that stays on the server: [vocab] for logits="last",
        [n, vocab] for "all" (every fed position), or None for "none"."""
        self._check_open()
        if logits not in _LOGITS:
            raise ValueError("logits must be one of %s, got %r" % (", ".join(_LOGITS), logits))
        v = _ids_list(ids, self.vocab_size)
        if self.max_ctx and len(v) > self.max_ctx - self.pos:
            raise errors.RangeError(-7, "DJ_ERANGE", "%d ids do not fit: the session is at position %d of %d"
                                    % (len(v), self.pos, self.max_ctx))
        meta = {"session": self.id}
        if logits != "last":
            meta["logits"] = logits
        payload = b""
        if len(v) <= _IDS_IN_META:
            meta["ids"] = v
        else:  # a long prefill travels as int32 in the payload
            payload = np.asarray(v, dtype="<i4").tobytes()
        reply, _ = self._client._call(_wire.STEP, meta, payload)
        self.pos = int(reply.get("pos", self.pos))
        if "handle" not in reply:
            return None
        return RemoteTensor(self._client, int(reply["handle"]), reply.get("shape", []), reply.get("dtype", "f32"),
                            int(reply.get("nbytes", 0)))

    def trace(self, ids, logits="last"):
        """A step of ids with interventions, as a context manager:

            with sess.trace(ids) as t:
                h = t.layers[5].output.save()      # a RemoteTensor (n, hidden) after the block
                t.layers[7].output += steer        # (hidden,) to every position, or (n, hidden)
            h.numpy(); t.logits

        Points: layers[i].input, .output, .attn.output, .mlp.output and
        final_norm.output (t.point("layers.5.output") by name). ids may be
        text: the server tokenizes it (BOS and the like at the session's
        start) and t.ids holds the ids it became once the step ran. The step
        runs when the block ends; see djinn.trace.Trace."""
        from .trace import Trace
        self._check_open()
        if isinstance(ids, str):  # text: the server tokenizes it; t.ids holds the ids once it ran
            if not ids:
                raise ValueError("a trace needs a non-empty prompt")
            if "\x00" in ids:
                raise ValueError("a prompt cannot hold U+0000")
            return Trace(self, ids, logits=logits)
        v = _ids_list(ids, self.vocab_size)
        if not v:
            raise ValueError("a trace needs at least one token id")
        if self.max_ctx and len(v) > self.max_ctx - self.pos:
            raise errors.RangeError(-7, "DJ_ERANGE", "%d ids do not fit: the session is at position %d of %d"
                                    % (len(v), self.pos, self.max_ctx))
        return Trace(self, v, logits=logits)

    def generate(self, prompt, max_new_tokens=64, temperature=0.0, top_p=1.0, top_k=0, seed=None,
                 stop_ids=None, ignore_eos=False, stream=True, trace=None, adapter=None, **sampling):
        """Generates in this session, continuing its context (see
        Model.generate for the arguments). trace: a function of a trace
        that edits points (`def steer(t): t.layers[5].output += v`); the
        server applies its edits at every step - the prompt's and each
        generated token's - in one request: token for token the loop of
        `trace` steps a client would run. Edits only ((hidden,) vectors or
        column slices, to every position), no saves or breakpoints.
        adapter: the session's first generation chooses it; later ones
        repeat it or leave it out."""
        self._check_open()
        req = _generate_meta(self.model, prompt, max_new_tokens, temperature, top_p, top_k, seed, stop_ids,
                             ignore_eos, sampling, adapter)
        if trace is not None:
            from .trace import generation_points
            req["points"] = generation_points(self, trace)
        ts = self._start_generate(req, own_session=False)
        return ts if stream else ts.collect()

    def _start_generate(self, req, own_session):
        req["session"] = self.id
        return TokenStream(self, self._client._begin(_wire.GENERATE, req), own_session)

    def pause(self, expected_ms=None):
        """Marks the session paused (it refuses steps until resume());
        expected_ms: how long the pause should last, a hint for the server."""
        self._check_open()
        meta = {"session": self.id}
        if expected_ms is not None:
            meta["expected_ms"] = _number("expected_ms", expected_ms, 0, _U64, integer=True)
        reply, _ = self._client._call(_wire.PAUSE, meta)
        self.paused = bool(reply.get("paused", True))
        return reply

    def resume(self):
        self._check_open()
        reply, _ = self._client._call(_wire.RESUME, {"session": self.id})
        self.paused = bool(reply.get("paused", False))
        return reply


class Generation:
    """A finished generation: text, ids, reason ("length", "stop",
    "context"), stop_id (the id that stopped it, not in ids), and the
    server's numbers in .info (n_prompt, ttft_ms, decode_ms, ...)."""

    def __init__(self, ids, text, info):
        self.ids = ids
        self.text = text
        self.info = info
        self.reason = info.get("reason", "")
        self.stop_id = info.get("stop_id")

    def __str__(self):
        return self.text

    def __repr__(self):
        return "<djinn.Generation %d tokens, reason %s: %r>" % (len(self.ids), self.reason, self.text[:60])


class TokenStream:
    """The tokens of one GENERATE as they arrive: iterate for Token(id, text,
    index). After the end, .result holds the Generation. Closing it early
    ends a one-shot generation (its session is closed); in a session of
    yours the server finishes the generation and the rest is dropped."""

    def __init__(self, session, answers, own_session):
        self._session = session
        self._client = session._client
        self._q = answers
        self._own = own_session
        self.ids = []
        self._text = []
        self.result = None
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        try:
            msg_type, meta, _ = self._client._next_frame(self._q)
        except BaseException:
            self._finish()
            raise
        if msg_type == _wire.TOKEN:
            t = Token(int(meta.get("id", -1)), meta.get("text", "") or "", int(meta.get("index", len(self.ids))))
            self.ids.append(t.id)
            self._text.append(t.text)
            return t
        self._finish()
        if msg_type == _wire.ERROR:
            raise errors.from_meta(meta)
        if msg_type != _wire.DONE:
            raise errors.FormatError(-4, "DJ_EFORMAT", "unexpected frame type 0x%02x in a generation" % msg_type)
        if meta.get("text"):
            self._text.append(meta["text"])
        self._session.pos = int(meta.get("pos", self._session.pos))
        self.result = Generation(self.ids, "".join(self._text), meta)
        raise StopIteration

    @property
    def text(self):
        """The text so far."""
        return "".join(self._text)

    def collect(self):
        """Runs to the end; returns the Generation."""
        for _ in self:
            pass
        return self.result

    def _finish(self):
        if self._done:
            return
        self._done = True
        if self._own:
            self._session.close()

    def close(self):
        """Stops reading: the rest of the generation is dropped."""
        if self._done:
            return
        self._client._forget(self._q)
        self._finish()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
