"""persist_cost.py: what djinnd's --persist always costs - tokens/s of 8 clients x 6
rounds (8 prompt ids, 32 tokens each) on the demo model, --persist on-stop and always in turns.
Usage: python3 bench/persist_cost.py BUILD_DIR STATE_PARENT_DIR [PAIRS]"""
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import djinn  # noqa: E402


def run(djinnd, mode, base):
    d = tempfile.mkdtemp(dir=base)
    os.mkdir(d + "/s")
    pf = d + "/port"
    p = subprocess.Popen([djinnd, "--listen", "127.0.0.1:0", "--port-file", pf, "--models", os.path.join(ROOT, "models"),
                          "--vmu-gb", "256m", "--threads", "1", "--state-dir", d + "/s", "--disk-swap-gb", "64m",
                          "--persist", mode], stderr=subprocess.DEVNULL)
    while not os.path.exists(pf) or not open(pf).read().strip():
        time.sleep(0.05)
    addr = "127.0.0.1:" + open(pf).read().split()[0]
    counts = []

    def agent(i):
        with djinn.connect(addr) as c:
            s = c.model("demo").session()
            for r in range(6):
                out = s.generate([5 + i, 6 + r, 7, 8, 9, 10, 11, 12], max_new_tokens=32, ignore_eos=True,
                                 stream=False).ids
                counts.append(len(out))
            s.close()
    t0 = time.monotonic()
    th = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    dt = time.monotonic() - t0
    p.terminate()
    p.wait()
    return sum(counts) / dt


def main():
    djinnd = os.path.join(sys.argv[1], "djinnd")
    base = sys.argv[2]
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    for _ in range(pairs):
        a = run(djinnd, "on-stop", base)
        b = run(djinnd, "always", base)
        print("on-stop %6.0f tok/s  always %6.0f tok/s  (%.2fx)" % (a, b, b / a), flush=True)


if __name__ == "__main__":
    main()
