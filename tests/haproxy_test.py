"""haproxy_test.py: three djinnd behind HAProxy (deploy/haproxy/haproxy.cfg) - 30 conversations
(HTTP and binary) with a daemon drained mid-run, each equal to a single-daemon run; issue 51.

usage: haproxy_test.py DJINND DJINN_CLI. Without haproxy it fails (scripts/setup.sh installs it).
Every conversation decodes greedily: its tokens do not depend on where or beside what it ran.
"""

import os
import signal
import socket
import struct
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import haproxy_cluster  # noqa: E402

import djinn  # noqa: E402  (python/ of this tree, put first by haproxy_cluster)
from djinn import balance  # noqa: E402

# Four "system prompts" (the demo model knows manual pages), each over a prefix-cache block.
SYSTEMS = [
    "NAME\n  tar - an archiving utility\n\nSYNOPSIS\n  tar [OPTION...] [FILE]...\n\nDESCRIPTION\n"
    "  GNU tar saves many files together into a single tape or disk archive, and can restore\n",
    "NAME\n  grep - print lines that match patterns\n\nSYNOPSIS\n  grep [OPTION...] PATTERNS [FILE...]\n\n"
    "DESCRIPTION\n  grep searches for PATTERNS in each FILE. PATTERNS is one or more patterns\n",
    "NAME\n  ssh - OpenSSH remote login client\n\nSYNOPSIS\n  ssh [-46AaCfGgKkMNnqsTtVvXxYy] destination\n\n"
    "DESCRIPTION\n  ssh is a program for logging into a remote machine and for executing commands\n",
    "NAME\n  cron - daemon to execute scheduled commands\n\nSYNOPSIS\n  cron [-f] [-l] [-L loglevel]\n\n"
    "DESCRIPTION\n  cron is started automatically from /etc/init.d on entering multi-user runlevels\n",
]
TURNS = ["\nOPTIONS\n  -", "\n  -v, --verbose\n", "\nSEE ALSO\n  "]
MAX_TOKENS = 10
N_HTTP, N_BIN = 15, 15
WAVE_A = 20  # conversations 0..19 start before the drain (10 HTTP, 10 binary), 20..29 after


def is_http(i):
    return i % 2 == 0


def http_conv(cl, port, i, before_turn=None):
    """One HTTP conversation of three turns (completions, the history resent): [(text, server)]."""
    prompt, out = SYSTEMS[i % 4], []
    hdr = balance.http_headers(session="conv-%d" % i, prefix_of=SYSTEMS[i % 4] if i % 4 < 2 else None)
    for t, user in enumerate(TURNS):
        if before_turn:
            before_turn(t)
        prompt += user
        r, server = cl.http_post(port, "/v1/completions", {"model": "demo", "prompt": prompt,
                                                          "max_tokens": MAX_TOKENS, "temperature": 0, "seed": 1},
                                 headers=hdr)
        text = r["choices"][0]["text"]
        out.append((text, r["usage"]["completion_tokens"], server))
        prompt += text
    return out


def bin_conv(addr, i, before_turn=None, drop=False):
    """One binary conversation: a session continued over three GENERATEs. drop: the
    connection is cut before the second turn and the client reconnects, reattaching its
    session - through HAProxy only the routing token brings it back to the same daemon."""
    c = djinn.connect(addr, route="conv-%d" % i)
    try:
        s = c.model("demo").session()
        out = []
        for t, user in enumerate(TURNS):
            if before_turn:
                before_turn(t)
            if drop and t == 1:
                c._sock.shutdown(socket.SHUT_RDWR)
                end = haproxy_cluster.time.monotonic() + haproxy_cluster.GUARD_S
                while c.reconnects < 1 and haproxy_cluster.time.monotonic() < end:
                    haproxy_cluster.time.sleep(0.01)
                assert c.reconnects >= 1, "conversation %d: the client did not reconnect" % i
            g = s.generate((SYSTEMS[i % 4] if t == 0 else "") + user, max_new_tokens=MAX_TOKENS,
                           temperature=0, stream=False)
            out.append((list(g.ids), g.reason, None))
        s.close()
        return out
    finally:
        c.close()


def drain_mid_run(cl, cli, futs, turn1, failures, out):
    """Once wave A has done its first turn: drains the daemon holding the most of its
    binary sessions (live sessions that must finish there) with `djinn admin drain`."""
    turn1.wait()
    table = cl.bin_table()  # where wave A's binary sessions went
    counts = {}
    for i in range(WAVE_A):
        key = struct.pack("<Q", balance.route_id("conv-%d" % i)).hex().upper()
        if not is_http(i) and key in table:
            counts["d%d" % table[key]] = counts.get("d%d" % table[key], 0) + 1
    if not counts:
        raise AssertionError("no binary session has a stick entry:\n%s" % cl.api("show table djinn_bin"))
    victim = out["victim"] = max(sorted(counts), key=lambda k: counts[k])
    r = haproxy_cluster.subprocess.run([cli, "admin", "drain", victim, "--haproxy", cl.sock],
                                       capture_output=True, text=True)
    print("djinn admin drain %s: rc %d\n%s%s" % (victim, r.returncode, r.stdout, r.stderr))
    if r.returncode != 0:
        failures.append("djinn admin drain %s failed" % victim)
    state = {(s["be"], s["name"]): s["admin"] for s in cl.servers()}
    for be in ("djinn_http", "djinn_prefix", "djinn_bin"):
        if not state.get((be, victim), 0) & 0x8:
            failures.append("%s/%s is not in drain after djinn admin drain" % (be, victim))


def main():
    djinnd, cli = sys.argv[1], sys.argv[2]
    hp = haproxy_cluster.find_haproxy()
    r = haproxy_cluster.subprocess.run([hp, "-c", "-f", haproxy_cluster.HAPROXY_CFG], capture_output=True, text=True)
    if r.returncode != 0:
        print("FAIL: haproxy -c refuses %s:\n%s%s" % (haproxy_cluster.HAPROXY_CFG, r.stdout, r.stderr))
        return 1
    cl = haproxy_cluster.Cluster(djinnd, n=3, extra=["--threads", "1"])
    failures = []
    try:
        n_conv = N_HTTP + N_BIN
        # ---- the single-daemon run: every conversation straight to d1, no balancer ----
        with ThreadPoolExecutor(n_conv) as ex:
            ref = list(ex.map(lambda i: http_conv(cl, cl.http[0], i) if is_http(i)
                              else bin_conv("127.0.0.1:%d" % cl.bin[0], i), range(n_conv)))

        # ---- through HAProxy: wave A, the drain, wave B ----
        placed_out = {}
        turn1 = threading.Barrier(WAVE_A + 1)  # wave A has done its first turn
        drained = threading.Event()            # the drain is done: wave A goes on, wave B starts

        def wave_a_gate(t):
            if t == 1:
                turn1.wait()
                drained.wait()

        lb_bin = "127.0.0.1:%d" % cl.lb_bin

        def conv(i):
            gate = wave_a_gate if i < WAVE_A else None
            if i >= WAVE_A:
                drained.wait()
            if is_http(i):
                return http_conv(cl, cl.lb_http, i, gate)
            return bin_conv(lb_bin, i, gate, drop=True)

        with ThreadPoolExecutor(n_conv) as ex:
            futs = [ex.submit(conv, i) for i in range(n_conv)]
            try:
                drain_mid_run(cl, cli, futs, turn1, failures, placed_out)
            finally:  # whatever happened, nobody waits for the drain any longer
                turn1.abort()
                drained.set()
            got = [f.result() for f in futs]
        victim = placed_out["victim"]
        table = cl.bin_table()

        def bin_server(i):
            key = struct.pack("<Q", balance.route_id("conv-%d" % i)).hex().upper()
            return "d%d" % table[key] if key in table else None

        # ---- the checks ----
        lost = changed = 0
        on_victim_live = on_victim_new = 0
        for i in range(n_conv):
            want = [t[:2] for t in ref[i]]
            have = [t[:2] for t in got[i]]
            if have != want:
                changed += 1
                failures.append("conversation %d (%s) differs from the single-daemon run:\n  want %r\n  have %r" %
                                (i, "http" if is_http(i) else "binary", want, have))
            servers = [t[2] for t in got[i]] if is_http(i) else [bin_server(i)] * len(TURNS)
            if is_http(i) and len(set(servers)) != 1:
                failures.append("HTTP conversation %d moved between daemons: %r" % (i, servers))
            if servers[0] == victim:
                if i < WAVE_A:
                    on_victim_live += 1
                else:
                    on_victim_new += 1
                    failures.append("conversation %d started after the drain on the drained %s" % (i, victim))
            if not is_http(i) and servers[0] is None:
                lost += 1
                failures.append("binary conversation %d has no stick entry" % i)
        print("30 conversations: %d changed, %d without a placement; %d live on the drained %s finished there, "
              "%d new ones went there" % (changed, lost, on_victim_live, victim, on_victim_new))
        if on_victim_live == 0:
            failures.append("no live conversation was on the drained daemon: the drain tested nothing")

        # ---- the agent's own drain (SIGUSR1), then ready again (SIGUSR2) ----
        other = 2 if victim != "d3" else 1  # index of a daemon not drained by the CLI
        name = "d%d" % (other + 1)
        cl.kill(other, signal.SIGUSR1)
        cl.wait_servers(lambda ss: all(s["admin"] & 0x8 for s in ss if s["name"] == name),
                        "%s drained by its agent-check" % name)
        cl.kill(other, signal.SIGUSR2)
        cl.wait_servers(lambda ss: all(not s["admin"] & 0x8 for s in ss if s["name"] == name),
                        "%s ready again after its agent said so" % name)
        r = haproxy_cluster.subprocess.run([cli, "admin", "ready", victim, "--haproxy", cl.sock],
                                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append("djinn admin ready %s failed: %s" % (victim, r.stderr))

        # ---- djinn admin's refusals: an unknown server, the move step before export/import ----
        for argv, want_rc, want_text in ((["drain", "d9"], 1, "no server named or at 'd9'"),
                                         (["drain", "d1", "--move"], 2, "--move is not built yet"),
                                         (["drain"], 2, "which HOST")):
            r = haproxy_cluster.subprocess.run([cli, "admin"] + argv + ["--haproxy", cl.sock], capture_output=True,
                                               text=True)
            if r.returncode != want_rc or want_text not in r.stderr:
                failures.append("djinn admin %s: rc %d, %r (want rc %d and %r)" %
                                (" ".join(argv), r.returncode, r.stderr, want_rc, want_text))
        if any(s["admin"] & 0x8 for s in cl.servers()):
            failures.append("a refused djinn admin command left a server drained:\n%s" % cl.api("show servers state"))

        # ---- a daemon that dies is taken out; new conversations go on elsewhere ----
        cl.kill(other)
        cl.wait_servers(lambda ss: all(s["op"] != 2 for s in ss if s["name"] == name), "%s down" % name)
        after = http_conv(cl, cl.lb_http, 1000)
        if any(t[2] == name for t in after):
            failures.append("a request went to the dead %s" % name)
        if [t[:2] for t in after] != [t[:2] for t in http_conv(cl, cl.http[0], 1000)]:
            failures.append("the conversation after the death differs from d1's")
    except BaseException:
        print(cl.logs())
        raise
    finally:
        if failures:
            print(cl.logs())
        failures += ["djinnd %s (sanitizer report or crash: its log above)" % b for b in cl.close()]
    for f in failures:
        print("FAIL:", f)
    print("haproxy_test: %d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
