"""haproxy_cluster.py: N djinnd and HAProxy (deploy/haproxy/haproxy.cfg itself) on 127.0.0.1
ports - what tests/haproxy_test.py and bench/haproxy_bench.py start, and the runtime API."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

HAPROXY_CFG = os.path.join(ROOT, "deploy", "haproxy", "haproxy.cfg")
# A hang guard for waits on the balancer's checks (1 s apart): never what a test passes by.
GUARD_S = 60


def find_haproxy():
    """haproxy's path; exits loudly without it (scripts/setup.sh installs Debian's)."""
    p = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.access("/usr/sbin/haproxy", os.X_OK) else None)
    if not p:
        sys.stderr.write("FAIL: haproxy is not installed (scripts/setup.sh installs it: apt-get install haproxy); "
                         "this test does not skip\n")
        sys.exit(1)
    return p


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class Cluster:
    """n daemons (d1..dn; the cfg has three servers - with n < 3 the others stay down,
    their ports closed) behind HAProxy. extra: djinnd options for every daemon."""

    def __init__(self, djinnd, n=3, extra=(), models=None, env=None):
        self.tmp = tempfile.mkdtemp(prefix="dj_haproxy_")
        self.djinnd, self.n = djinnd, n
        self.models = models or os.path.join(ROOT, "models")
        p = free_ports(3 * 3 + 2)
        self.bin = p[0:3]
        self.http = p[3:6]
        self.agent = p[6:9]
        self.lb_http, self.lb_bin = p[9], p[10]
        self.sock = os.path.join(self.tmp, "haproxy.sock")
        self.procs = [None] * 3
        self.haproxy = None
        self.extra = list(extra)
        self.env = dict(os.environ, **(env or {}))
        try:
            for i in range(n):
                self.start_daemon(i)
            for i in range(n):
                self.wait_port(self.bin[i], self.procs[i], "djinnd d%d" % (i + 1))
            self.start_haproxy()
        except BaseException:
            self.close()
            raise

    def start_daemon(self, i):
        log = open(os.path.join(self.tmp, "d%d.log" % (i + 1)), "ab")
        self.procs[i] = subprocess.Popen(
            [self.djinnd, "--models", self.models, "--listen", "127.0.0.1:%d" % self.bin[i],
             "--http", "127.0.0.1:%d" % self.http[i], "--agent-check", "127.0.0.1:%d" % self.agent[i]] + self.extra,
            stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()

    def wait_port(self, port, proc, what):
        end = time.monotonic() + GUARD_S
        while time.monotonic() < end:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError("%s exited (%s) at start:\n%s" % (what, proc.returncode, self.logs()))
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("%s never listened on %d:\n%s" % (what, port, self.logs()))

    def start_haproxy(self):
        env = dict(os.environ, LB_SOCKET=self.sock, LB_HTTP_ADDR="127.0.0.1:%d" % self.lb_http,
                   LB_BIN_ADDR="127.0.0.1:%d" % self.lb_bin)
        for i in range(3):
            env["DJINN%d_HOST" % (i + 1)] = "127.0.0.1"
            env["DJINN%d_BIN" % (i + 1)] = str(self.bin[i])
            env["DJINN%d_HTTP" % (i + 1)] = str(self.http[i])
            env["DJINN%d_AGENT" % (i + 1)] = str(self.agent[i])
        log = open(os.path.join(self.tmp, "haproxy.log"), "ab")
        self.haproxy = subprocess.Popen([find_haproxy(), "-db", "-f", HAPROXY_CFG], stdout=log,
                                        stderr=subprocess.STDOUT, env=env)
        log.close()
        self.wait_port(self.lb_bin, self.haproxy, "haproxy")
        end = time.monotonic() + GUARD_S
        while time.monotonic() < end:  # every running daemon up in every backend
            if os.path.exists(self.sock):
                up = [s for s in self.servers() if s["op"] == 2]
                if len(up) == 3 * self.n:
                    return
            time.sleep(0.1)
        raise RuntimeError("HAProxy never saw the daemons up:\n%s\n%s" % (self.api("show servers state"), self.logs()))

    # ---- HAProxy's runtime API ----

    def api(self, cmd):
        s = socket.socket(socket.AF_UNIX)
        s.connect(self.sock)
        s.sendall(cmd.encode() + b"\n")
        out = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
        s.close()
        return out.decode()

    def servers(self):
        """[{be, name, op (2: running), admin (0x8 forced drain), weight}] of `show servers state`."""
        out = []
        for line in self.api("show servers state").splitlines():
            f = line.split()
            if len(f) > 8 and not line.startswith("#"):
                out.append({"be": f[1], "name": f[3], "op": int(f[5]), "admin": int(f[6]), "weight": int(f[7])})
        return out

    def wait_servers(self, pred, what):
        end = time.monotonic() + GUARD_S
        while time.monotonic() < end:
            if pred(self.servers()):
                return
            time.sleep(0.1)
        raise AssertionError("HAProxy never showed %s:\n%s" % (what, self.api("show servers state")))

    def bin_table(self):
        """The binary backend's stick table: routing token (hex, as on the wire) -> server id."""
        out = {}
        for line in self.api("show table djinn_bin").splitlines():
            kv = dict(p.split("=", 1) for p in line.split() if "=" in p)
            if "key" in kv and "server_id" in kv:
                out[kv["key"].upper()] = int(kv["server_id"])
        return out

    # ---- clients ----

    def http_post(self, port, path, body, headers=None):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=json.dumps(body).encode(),
                                     headers=dict({"Content-Type": "application/json"}, **(headers or {})))
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return json.loads(r.read()), r.headers.get("X-Djinn-Server")
        except urllib.error.HTTPError as e:  # the answer's body says why
            raise RuntimeError("POST %s on port %d: %d %s" % (path, port, e.code, e.read()[:500])) from None

    def logs(self):
        out = []
        for name in sorted(os.listdir(self.tmp)):
            if name.endswith(".log"):
                with open(os.path.join(self.tmp, name), errors="replace") as f:
                    out.append("---- %s ----\n%s" % (name, f.read()[-3000:]))
        return "\n".join(out)

    def kill(self, i, sig=signal.SIGKILL):
        self.procs[i].send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.procs[i].wait()

    def close(self):
        for p in [self.haproxy] + self.procs:
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)
