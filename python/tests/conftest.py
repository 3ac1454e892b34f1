"""conftest.py: the Python tests' daemon - a real djinnd of this tree (DJINND,
else build/djinnd) on a free port, serving the demo model and the tiny
fixture models; the package under test is python/djinn of this tree."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
FIXTURE_MODELS = ("llama2", "llama3", "mistral", "qwen2", "tinyllama", "qwen3", "gemma2", "gemma3", "phi3",
                  "phi3_longrope", "mixtral")
# The shared daemon's lease: djinnd's default, so that no test depends on how
# promptly a loaded machine runs the client's heartbeat thread (lease/3).
LEASE_MS = 10000
# The heartbeat test's own daemon: short, so that it sees a lease lapse soon.
SHORT_LEASE_MS = 1500



def randomize_bn(m, seed, affine=True):
    """m with every BatchNorm2d's running statistics (and, with affine, its
    weight and bias) drawn from a generator seeded with seed: eval-mode batch
    norm that is not the identity. Returns m."""
    import torch  # only the capture tests need it; they skip without it

    g = torch.Generator().manual_seed(seed)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.copy_(torch.rand(mod.num_features, generator=g) - 0.5)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
            if affine:
                mod.weight.data.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.bias.data.copy_(torch.rand(mod.num_features, generator=g) - 0.5)
    return m

CAPTURE_RTOL = 1e-4
GRAPH_RUN_TOOL = os.environ.get("DJ_GRAPH_RUN") or os.path.join(ROOT, "build", "graph_run_tool")


def capture_close(got, want, rtol=CAPTURE_RTOL):
    """A captured module's output against eager torch's: same shape, and the
    largest difference within rtol of want's largest magnitude. got: a
    RemoteTensor, a tensor or an array."""
    import torch  # only the capture tests need it; they skip without it

    got = got.torch() if hasattr(got, "torch") else torch.as_tensor(got)
    assert tuple(got.shape) == tuple(want.shape), (got.shape, want.shape)
    scale = max(float(want.abs().max()), 1e-6)
    err = float((got.to(want.dtype) - want).abs().max()) / scale
    assert err < rtol, "max error %g of the largest magnitude" % err


@pytest.fixture(scope="module")
def ex():
    """The C executor of captured graphs alone (tests/graph_run_tool.c)."""
    from djinn.capture import ToolExecutor

    if not os.access(GRAPH_RUN_TOOL, os.X_OK):
        pytest.fail("graph_run_tool not built (%s): build the tree or set DJ_GRAPH_RUN" % GRAPH_RUN_TOOL)
    return ToolExecutor(GRAPH_RUN_TOOL)


def _exe(env, rel):
    p = os.environ.get(env) or os.path.join(ROOT, "build", rel)
    if not os.access(p, os.X_OK):
        pytest.exit("%s not found: build the tree first (or set %s)" % (p, env), returncode=2)
    return p


def reference(name):
    """tests/fixtures/.../reference.json of a model (transformers' outputs)."""
    path = os.path.join(FIXTURES, "demo" if name == "demo" else os.path.join("models", name), "reference.json")
    with open(path) as f:
        return json.load(f)


class Daemon:
    def __init__(self, tmp, extra=(), lease_ms=LEASE_MS):
        self.store = os.path.join(tmp, "store")
        os.mkdir(self.store)
        os.symlink(os.path.join(ROOT, "models", "demo"), os.path.join(self.store, "demo"))
        for m in FIXTURE_MODELS:
            os.symlink(os.path.join(FIXTURES, "models", m), os.path.join(self.store, m))
        # folders MODEL_INFO must refuse: an architecture the engine lacks, an oversized config
        for name, text in (("alien", json.dumps({"architectures": ["GPT2LMHeadModel"], "vocab_size": 8})),
                           ("huge", json.dumps({"pad": " " * (300 << 10)}))):
            os.mkdir(os.path.join(self.store, name))
            with open(os.path.join(self.store, name, "config.json"), "w") as f:
                f.write(text)
        self.djinnd = _exe("DJINND", "djinnd")
        self.cli = _exe("DJINN_CLI", "djinn")
        if "--token-file" not in extra:  # the tests read the daemon-wide stats: the admin role without tokens
            extra = ("--local-admin",) + tuple(extra)
        # scripts/gpu_check.sh: "--device cuda:0 --graph-device engine" (captured modules on the GPU)
        extra = tuple(extra) + tuple(os.environ.get("DJ_TEST_DAEMON_ARGS", "").split())
        port_file = os.path.join(tmp, "port")
        self.err_path = os.path.join(tmp, "djinnd.err")
        self.err = open(self.err_path, "wb")
        self.proc = subprocess.Popen(
            [self.djinnd, "--listen", "127.0.0.1:0", "--port-file", port_file, "--models", self.store,
             "--vmu-gb", "256m", "--threads", "1", "--lease-ms", str(lease_ms), *extra],
            stdout=self.err, stderr=self.err)
        for _ in range(600):  # the port file appears once it listens (ASan builds start slower)
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            if self.proc.poll() is not None:
                raise RuntimeError("djinnd exited with %s: %s" % (self.proc.returncode, self.stderr()))
            time.sleep(0.05)
        else:
            self.proc.kill()
            raise RuntimeError("djinnd wrote no port file in 30 s: %s" % self.stderr())
        self.addr = "127.0.0.1:%s" % open(port_file).read().strip()

    def stderr(self):
        self.err.flush()
        with open(self.err_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def stop(self):
        """SIGTERM; the exit status (0 when it shut down clean, sanitizers included)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9


@pytest.fixture(scope="session")
def daemon(tmp_path_factory):
    d = Daemon(str(tmp_path_factory.mktemp("djinnd")))
    yield d
    rc = d.stop()
    assert rc == 0, "djinnd exited with %s:\n%s" % (rc, d.stderr())


@pytest.fixture
def client(daemon):
    import djinn
    c = djinn.connect(daemon.addr)
    yield c
    c.close()
