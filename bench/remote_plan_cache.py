"""remote_plan_cache.py: a captured module's second remote call with and without the plan cache
(a small MLP, torchvision resnet18 at 64x64) on a local djinnd, the server's plan lookup time,
and eager torch on one thread beside it.
usage: python3 bench/remote_plan_cache.py build/djinnd   (Release build; loopback; docs/capture.md)"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

import torch  # noqa: E402
import djinn  # noqa: E402
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def timed(rm, x, n):
    ts, plan, run = [], [], []
    for _ in range(n):
        t0 = time.perf_counter()
        y = rm(x)
        ts.append(time.perf_counter() - t0)
        r = rm._executor.last_reply
        plan.append(r.get("plan_s", float("nan")))  # a djinnd without the plan cache has none
        run.append(r["run_s"])
        del y
    return statistics.median(ts), statistics.median(plan), statistics.median(run)


def main():
    djinnd = sys.argv[1] if len(sys.argv) > 1 else "build/djinnd"
    tmp = tempfile.mkdtemp()
    port_file = os.path.join(tmp, "port")
    p = subprocess.Popen([djinnd, "--listen", "127.0.0.1:0", "--port-file", port_file, "--models", tmp,
                          "--vmu-gb", "256m", "--threads", "1", "--allow-empty"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            time.sleep(0.05)
        c = djinn.connect("127.0.0.1:" + open(port_file).read().strip())
        torch.manual_seed(0)
        cases = [("mlp 20-64-10, batch 4", MLP().eval(), torch.randn(4, 20), 200)]
        try:
            import torchvision
            cases.append(("resnet18 1x3x64x64", torchvision.models.resnet18().eval(), torch.randn(1, 3, 64, 64), 10))
        except ImportError:
            pass
        for name, m, x, n in cases:
            torch.set_num_threads(1)  # eager on one thread, as the daemon's engine runs (--threads 1)
            with torch.no_grad():
                m(x)
                t0 = time.perf_counter()
                for _ in range(n):
                    m(x)
                eager = (time.perf_counter() - t0) / n
            torch.set_num_threads(os.cpu_count() or 1)
            print("%-24s eager torch (1 thread) %8.3f ms" % (name, eager * 1e3))
            for cache in (False, True):
                rm = c.remote(m, cache=cache)
                rm(x)  # the first call: weights uploaded, graph sent
                t, plan, run = timed(rm, x, n)
                sig = state = 0.0
                if cache:
                    t0 = time.perf_counter()
                    for _ in range(n):
                        rm._signature((x,), {})
                    sig = (time.perf_counter() - t0) / n
                    t0 = time.perf_counter()
                    for _ in range(n):
                        rm._state()
                    state = (time.perf_counter() - t0) / n
                    print("%-24s client replay check: signature %.1f us, module state %.1f us"
                          % (name, sig * 1e6, state * 1e6))
                print("%-24s cache=%-5s second call %8.3f ms   server: plan %7.1f us, GRAPH_RUN %8.1f us%s"
                      % (name, cache, t * 1e3, plan * 1e6, run * 1e6, "  (replayed)" if rm.replayed else ""))
        c.close()
    finally:
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
