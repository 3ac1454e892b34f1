"""client.py: one connection to djinnd - a reader thread that routes answers
to the waiting callers by request id, a background thread for heartbeats, for
the RELEASE of garbage-collected remote tensors and for reconnecting (and
reattaching the sessions) after a drop, and the request calls."""

import collections
import os
import select
import socket
import threading
import time
import weakref

from . import _wire, balance, errors

_DEAD = object()  # put into a waiting caller's queue when the connection dies


class ModelListing(collections.namedtuple("ModelListing", "name loaded refs")):
    """One folder of the server's model store: loaded (held by the server),
    refs (its sessions plus a pin)."""


def _parse_addr(addr):
    """"HOST:PORT", "[V6]:PORT" or "unix:/path" -> (family, sockaddr)."""
    if not isinstance(addr, str):
        raise TypeError("addr must be a str like '127.0.0.1:7070' or 'unix:/path', not %s" % type(addr).__name__)
    if addr.startswith("unix:"):
        path = addr[5:]
        if not path:
            raise ValueError("addr %r: a unix socket needs a path ('unix:/run/djinn.sock')" % addr)
        return socket.AF_UNIX, path
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("addr %r: want HOST:PORT (e.g. '127.0.0.1:7070') or 'unix:/path'" % addr)
    if host.startswith("[") and host.endswith("]"):
        return socket.AF_INET6, (host[1:], int(port), 0, 0)
    return socket.AF_INET, (host, int(port))


class Client:
    """A connection to djinnd. Safe to use from several threads: requests are
    matched to answers by id. Close it (or use `with`) to end every session
    and free every handle it holds on the server.

    reconnect=True: when the connection drops (not closed by this client),
    the requests waiting on it raise ConnectionLost; then the client connects
    again (within the server's lease) and reattaches its sessions, which were
    opened with `reattach` (SESSION_ATTACH: their KV cache and position
    survive). Remote tensors of the old connection are gone (the server
    freed them): reading one raises ConnectionLost. A session that cannot be
    reattached raises ConnectionLost when used. reconnect=False: a drop
    ends the client, every later call raises ConnectionLost."""

    def __init__(self, addr, token=None, heartbeat=True, reconnect=True, route=None):
        family, sockaddr = _parse_addr(addr)
        if token is not None and not isinstance(token, str):
            raise TypeError("token must be a str or None, not %s" % type(token).__name__)
        self.addr = addr
        self._family, self._sockaddr, self._token = family, sockaddr, token
        self.reconnect = bool(reconnect)
        # route: HELLO's request id is balance.route_id(route), HAProxy's routing token
        self._hello_rid = None if route is None else balance.route_id(route)
        self.epoch = 0  # bumped by every reconnect: tensors of an older epoch are gone
        self.reconnects = 0
        self._sessions = weakref.WeakValueDictionary()  # id -> Session, to reattach
        self._conn_mu = threading.Lock()  # one reconnect at a time
        self._connecting = False  # a reconnect is under way: requests wait for it (and its reattaches)
        self.fetched_bytes = 0  # tensor bytes FETCH brought here (RemoteTensor reads)
        self.weight_bytes_uploaded = 0  # captured modules' weight bytes sent (WEIGHT_UPLOAD)
        self.weights_uploaded = 0  # weights uploaded whole
        self.weights_proven = 0  # weights the server held, proven by a challenge instead
        self.graph_input_bytes = 0  # GRAPH_RUN inputs sent as bytes (not as handles)
        self.graph_bytes_sent = 0  # GRAPH_RUN graph bytes sent (a graph the server has is named by id)
        self.graph_plans_cached = False  # the last GRAPH_RUN found its plan in the server's cache
        self._mu = threading.Lock()  # _pending, _next_id, _dead
        self._wmu = threading.Lock()  # one frame at a time on the socket
        self._pending = {}  # request id -> queue of (type, meta, payload)
        self._next_id = 0
        self._dead = None  # why the connection ended
        self._closing = False
        self._releases = collections.deque()  # handle ids to RELEASE (appended by finalizers)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._sock = None
        try:
            info = self._open()
        except BaseException:
            self.close()
            raise
        self.server = info.get("server", "")
        self.lease_ms = int(info.get("lease_ms", 10000))
        self.capabilities = list(info.get("capabilities", []))
        self.admin = bool(info.get("admin", False))
        self.max_handles = int(info.get("max_handles", 0))
        self._hb_period_s = max(self.lease_ms / 3000.0, 0.001) if heartbeat else 0.0
        self._bg = threading.Thread(target=self._bg_loop, name="djinn-heartbeat", daemon=True)
        self._bg.start()

    # ---- life ----

    def _open(self):
        """Connects a new socket, starts its reader and says HELLO; returns
        HELLO's answer. ConnectionLost when it cannot."""
        sock = socket.socket(self._family, socket.SOCK_STREAM)
        try:
            sock.connect(self._sockaddr)
        except OSError as e:
            sock.close()
            raise errors.ConnectionLost("connect to %s: %s" % (self.addr, e.strerror or e)) from None
        if self._family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        old = self._sock
        with self._mu:
            self._sock = sock
            self._dead = None
        if old is not None:
            old.close()
        self._reader = threading.Thread(target=self._read_loop, args=(sock,), name="djinn-reader", daemon=True)
        self._reader.start()
        hello = {"version": _wire.VERSION, "client": "djinn-python 0.1"}
        if self._token is not None:
            hello["token"] = self._token
        info, _ = self._final(self._begin(_wire.HELLO, hello, reconnect=False, rid=self._hello_rid))
        return info

    def _reconnect(self):
        """After a drop: connects again and reattaches the sessions, trying
        until the lease would have lapsed. True when connected."""
        with self._conn_mu:
            if self._closing:
                return False
            if self._dead is None:
                return True  # another thread did it
            self._connecting = True
            try:
                return self._reconnect_locked()
            finally:
                self._connecting = False

    def _reconnect_locked(self):
        deadline = time.monotonic() + max(getattr(self, "lease_ms", 10000), 1000) / 1000.0
        delay = 0.02
        while True:
            try:
                self._open()
                break
            except errors.ConnectionLost as e:
                if self._closing or time.monotonic() + delay > deadline:
                    self.reconnect = False  # given up: later calls raise at once
                    self._dead = "%s; reconnecting failed: %s" % (self._dead, e)
                    return False
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except errors.DjinnError as e:  # HELLO refused (the token changed)
                self.reconnect = False
                self._dead = "reconnected, but HELLO was refused: %s" % e
                return False
        self.epoch += 1
        self.reconnects += 1
        for sid, sess in list(self._sessions.items()):
            if sess.closed:
                continue
            if sess._secret is None:
                sess._lost = "its connection dropped and it was not opened to reattach"
                continue
            try:
                reply, _ = self._final(self._begin(_wire.SESSION_ATTACH, {"session": sid, "secret": sess._secret},
                                                   reconnect=False))
                sess.pos = int(reply.get("pos", sess.pos))
                sess.paused = bool(reply.get("paused", sess.paused))
            except errors.DjinnError as e:
                sess._lost = "its connection dropped and SESSION_ATTACH failed: %s" % e
        self._wake()  # the heartbeat thread goes on
        return True

    def close(self):
        """Ends the connection: the server releases its sessions and handles.
        Calling it again does nothing."""
        if not self._closing and self._dead is None:
            for sess in list(self._sessions.values()):  # reattachable ones would wait out their lease
                if not sess.closed and sess._secret is not None and not sess._keep:
                    try:
                        sess.close()
                    except errors.DjinnError:
                        pass
        with self._mu:
            if self._closing:
                return
            self._closing = True
        self._wake()
        try:
            if self._sock is not None:
                self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        me = threading.current_thread()
        for t in (getattr(self, "_reader", None), getattr(self, "_bg", None)):
            if t is not None and t is not me and t.is_alive():
                t.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    @property
    def closed(self):
        return self._closing or self._dead is not None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else "open"
        return "<djinn.Client %s %s>" % (self.addr, state)

    # ---- the reader ----

    @staticmethod
    def _recv_exact(sock, n):
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = sock.recv_into(view[got:], n - got)
            if k == 0:
                raise EOFError
            got += k
        return buf

    def _read_loop(self, sock):
        why = "connection closed by djinnd"
        try:
            while True:
                msg_type, rid, meta_len, payload_len = _wire.decode_header(self._recv_exact(sock, _wire.HEADER_BYTES))
                meta = _wire.unpack_meta(self._recv_exact(sock, meta_len)) if meta_len else {}
                payload = self._recv_exact(sock, payload_len) if payload_len else b""
                with self._mu:
                    q = self._pending.get(rid)
                    if q is not None and msg_type in _wire.FINAL:
                        del self._pending[rid]
                if q is not None:  # else an answer nobody waits for (heartbeats, releases)
                    q.append((msg_type, meta, payload))
                    q.event.set()
        except (EOFError, OSError):
            if self._closing:
                why = "connection closed by this client"
        except ValueError as e:  # a bad frame: nothing after it can be trusted
            why = "bad frame from djinnd: %s" % e
        with self._mu:
            if sock is not self._sock:  # an old connection's reader: a new one took over
                return
            self._dead = why
            waiting = list(self._pending.values())
            self._pending.clear()
        for q in waiting:
            q.append(_DEAD)
            q.event.set()
        self._wake()

    # ---- requests ----

    def _send(self, msg_type, meta, payload, rid):
        meta_b = _wire.pack_meta(meta)
        head = _wire.encode_header(msg_type, rid, len(meta_b), len(payload))
        with self._wmu:
            if payload and len(payload) > 65536:
                self._sock.sendall(head + meta_b)
                self._sock.sendall(payload)
            else:
                self._sock.sendall(head + meta_b + bytes(payload))

    def _next(self):
        with self._mu:
            if self._dead is not None or self._closing:
                raise errors.ConnectionLost("djinnd connection: %s" % (self._dead or "closed by this client"))
            self._next_id += 1
            return self._next_id

    def _begin(self, msg_type, meta, payload=b"", reconnect=True, rid=None):
        """Sends a request; returns the queue its answers arrive in. After a
        drop it reconnects first (when the client does)."""
        if reconnect and (self._dead is not None or self._connecting) and self.reconnect and not self._closing:
            self._reconnect()  # waits for one under way
        if reconnect:
            self._drain_releases()
        q = _Answers()
        with self._mu:
            if self._dead is not None or self._closing:
                raise errors.ConnectionLost("djinnd connection: %s" % (self._dead or "closed by this client"))
            if rid is None:  # else HELLO's routing token (top bit set: never one of these)
                self._next_id += 1
                rid = self._next_id
            self._pending[rid] = q
        try:
            self._send(msg_type, meta, payload, rid)
        except OSError as e:
            with self._mu:
                self._pending.pop(rid, None)
            raise errors.ConnectionLost("send to djinnd: %s" % (e.strerror or e)) from None
        q.rid = rid
        return q

    def _forget(self, q):
        """Stops waiting for q's answers: the reader drops them."""
        with self._mu:
            self._pending.pop(q.rid, None)

    def _next_frame(self, q):
        """The next (type, meta, payload) answering q; raises ConnectionLost."""
        item = q.get()
        if item is _DEAD:
            raise errors.ConnectionLost("djinnd connection: %s" % (self._dead or "dropped (reconnected since)"))
        return item

    def _final(self, q):
        """The REPLY of a request (meta, payload); ERROR raises."""
        msg_type, meta, payload = self._next_frame(q)
        if msg_type == _wire.ERROR:
            raise errors.from_meta(meta)
        if msg_type != _wire.REPLY:
            raise errors.FormatError(-4, "DJ_EFORMAT", "unexpected frame type 0x%02x" % msg_type)
        return meta, payload

    def _call(self, msg_type, meta=None, payload=b""):
        return self._final(self._begin(msg_type, meta or {}, payload))

    def _send_nowait(self, msg_type, meta):
        """A request whose answer nobody reads (HEARTBEAT, RELEASE)."""
        try:
            rid = self._next()
            self._send(msg_type, meta, b"", rid)
        except (OSError, errors.ConnectionLost):
            pass

    # ---- background: heartbeats and releases ----

    def _wake(self):
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # a full pipe is awake already; a closed one is gone
            pass

    def _release_later(self, handle, epoch=None):
        """Called from RemoteTensor finalizers (any thread, GC time, exit):
        never blocks, never raises. A tensor of an older connection is gone."""
        try:
            if not self._closing and self._dead is None and (epoch is None or epoch == self.epoch):
                self._releases.append(handle)
                self._wake()
        except Exception:
            pass

    def _drain_releases(self):
        while True:
            try:
                h = self._releases.popleft()
            except IndexError:
                return
            self._send_nowait(_wire.RELEASE, {"handle": h})

    def _bg_loop(self):
        last_hb = time.monotonic()
        while not self._closing:
            if self._dead is not None:  # dropped: reconnect now, while the sessions' leases run
                if not self.reconnect or not self._reconnect():
                    return
                last_hb = time.monotonic()
            period = self._hb_period_s
            timeout = max(0.0, last_hb + period - time.monotonic()) if period else 1.0
            try:
                r, _, _ = select.select([self._wake_r], [], [], timeout)
                if r:
                    os.read(self._wake_r, 4096)
            except (OSError, ValueError):
                return
            if self._closing:
                return
            if self._dead is not None:
                continue
            self._drain_releases()
            if period and time.monotonic() - last_hb >= period:
                self._send_nowait(_wire.HEARTBEAT, {})
                last_hb = time.monotonic()

    def set_heartbeat(self, period_ms):
        """Heartbeat period in ms (0 stops heartbeats: sessions then lapse after
        the lease)."""
        if not isinstance(period_ms, int) or isinstance(period_ms, bool) or period_ms < 0:
            raise ValueError("period_ms must be an int >= 0, not %r" % (period_ms,))
        self._hb_period_s = period_ms / 1000.0
        self._wake()

    # ---- the API ----

    def heartbeat(self):
        """One HEARTBEAT round trip; renews every session of this connection."""
        meta, _ = self._call(_wire.HEARTBEAT)
        return meta

    def stats(self):
        """The server's STATS as a dict (docs/protocol.md)."""
        meta, _ = self._call(_wire.STATS)
        return meta

    def models(self):
        """The server's model store: [ModelListing(name, loaded, refs)]."""
        meta, _ = self._call(_wire.MODEL_LIST)
        return [ModelListing(m.get("name", ""), bool(m.get("loaded", False)), int(m.get("refs", 0)))
                for m in meta.get("models", [])]

    def model(self, name):
        """A ghost of the model `name`: its config and tokenizer settings, no
        weights (they stay on the server). NotFoundError if the store lacks it."""
        from .model import Model
        if not isinstance(name, str):
            raise TypeError("model name must be a str, not %s" % type(name).__name__)
        if not name:
            raise ValueError("model name is empty")
        meta, _ = self._call(_wire.MODEL_INFO, {"model": name})
        return Model(self, meta)

    def remote(self, module, fallback=None, cache=True, qos=None):
        """A proxy of the PyTorch module whose calls run on the server: each call records the
        forward as ATen ops (djinn.capture), uploads only the weights the server lacks, runs the
        graph there and returns the forward's own structure with RemoteTensor leaves (shape and
        dtype here; .numpy()/.torch() fetch). A RemoteTensor passed to the next call stays on the
        server. fallback="local": what the server cannot run (an unsupported op), a busy or
        unreachable server, runs here instead, given 1.5x its memory. cache=False: record every
        call (no plan cache; docs/capture.md says when replaying a recorded call is sound).
        qos: the class ("realtime", "interactive", "batch") djinnd's scheduler admits each run in
        (default interactive; the token must grant it)."""
        from .remote import remote
        return remote(self, module, fallback=fallback, cache=cache, qos=qos)

    def session(self, model, qos="interactive", expected_tokens=None, cache_salt=None, reattach=False):
        """Opens a session on `model` (a name or a Model); see Model.session."""
        from .model import Model
        m = model if isinstance(model, Model) else self.model(model)
        return m.session(qos=qos, expected_tokens=expected_tokens, cache_salt=cache_salt, reattach=reattach)

    def attach(self, session_id, secret, wait_s=2.0):
        """Takes over a session opened with reattach=True (by this process or
        another) whose client closed or dropped, within its lease
        (SESSION_ATTACH): returns it as a Session with its KV cache and
        position. Like the one opened, it outlives this client until close().
        NotFoundError for a wrong id or secret, a session still attached
        elsewhere, or one whose lease ended - after retrying for wait_s
        seconds, as the server may not yet have seen its old client go."""
        from .model import Session
        for name, v in (("session_id", session_id), ("secret", secret)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError("%s must be an int, not %r" % (name, v))
            if not 0 <= v < 1 << 64:
                raise ValueError("%s must be a u64, got %d" % (name, v))
        wait_s = float(wait_s)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                reply, _ = self._call(_wire.SESSION_ATTACH, {"session": session_id, "secret": secret})
                break
            except errors.NotFoundError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        m = self.model(reply.get("model", ""))
        return Session(m, reply, keep=True, secret=secret)


    def import_session(self, image):
        """Opens the session an image holds (SESSION_IMPORT): image is the
        bytes Session.export returned, or the path of a file it wrote.
        Returns it as a Session (a new id, and a secret: it outlives this
        client like one opened with reattach=True) at the position it was
        exported at. InvalidError for a damaged image or one of
        another checkpoint (both fingerprints named); DjinnError (DJ_EIO) for a KV page
        failing its checksum."""
        from .model import Session
        if isinstance(image, (bytes, bytearray, memoryview)):
            data = bytes(image)
        else:
            with open(image, "rb") as f:
                data = f.read()
        if not data:
            raise ValueError("import_session: an empty image")
        reply, _ = self._call(_wire.SESSION_IMPORT, {}, data)
        m = self.model(reply.get("model", ""))
        return Session(m, reply, keep=True)


class _Answers:
    """The frames answering one request, in arrival order (appended by the
    reader thread, taken by the caller)."""

    __slots__ = ("items", "event", "rid")

    def __init__(self):
        self.items = collections.deque()
        self.event = threading.Event()
        self.rid = 0

    def append(self, item):
        self.items.append(item)

    def get(self):
        while True:
            try:
                return self.items.popleft()
            except IndexError:
                pass
            self.event.wait()
            self.event.clear()


def connect(addr="127.0.0.1:7070", token=None, reconnect=True, route=None):
    """Connects to djinnd at addr ("HOST:PORT" or "unix:/path") and says HELLO
    with token (None when the server has no token file). reconnect: after a
    dropped connection, connect again and reattach the sessions (Client).
    route: behind HAProxy, a key (str) naming what this client keeps on one
    daemon (a conversation, a user): every connection with the same key lands
    on the same daemon, so a reconnect finds its sessions (docs/deploy.md)."""
    return Client(addr, token=token, reconnect=reconnect, route=route)
