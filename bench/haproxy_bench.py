"""haproxy_bench.py: djinnd behind HAProxy (deploy/haproxy/haproxy.cfg) on this machine - HTTP
throughput with 1, 2 and 3 daemons, and the prefix-cache hit rate of placement by prompt prefix
(X-Djinn-Prefix, consistent hash) against round-robin on a 4-system-prompt workload. Issue 51.

usage: /usr/bin/python3 bench/haproxy_bench.py [build/djinnd] [--threads T] [--clients C]
       [--requests R] [--tokens N] [--data SIZE] [--skip-throughput] [--skip-prefix]
Prints one line per measurement; bench/RESULTS.md records a run.
"""

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import haproxy_cluster  # noqa: E402
import djinn  # noqa: E402
from djinn import balance  # noqa: E402

# Man-page openings the demo model knows, each well over two prefix-cache blocks (64 tokens
# a block for the demo model's KV rows in 64 KiB pages).
SYSTEMS = [
    "NAME\n  tar - an archiving utility\n\nSYNOPSIS\n  tar [OPTION...] [FILE]...\n\nDESCRIPTION\n"
    "  GNU tar saves many files together into a single tape or disk archive, and can restore individual files "
    "from the archive. It includes multivolume support, the ability to archive sparse files, automatic archive "
    "compression and decompression, remote archives and special features that allow tar to be used for "
    "incremental and full backups.\n",
    "NAME\n  grep - print lines that match patterns\n\nSYNOPSIS\n  grep [OPTION...] PATTERNS [FILE...]\n\n"
    "DESCRIPTION\n  grep searches for PATTERNS in each FILE. PATTERNS is one or more patterns separated by "
    "newline characters, and grep prints each line that matches a pattern. Typically PATTERNS should be quoted "
    "when grep is used in a shell command. A FILE of - stands for standard input.\n",
    "NAME\n  ssh - OpenSSH remote login client\n\nSYNOPSIS\n  ssh [-46AaCfGgKkMNnqsTtVvXxYy] destination\n\n"
    "DESCRIPTION\n  ssh is a program for logging into a remote machine and for executing commands on a remote "
    "machine. It is intended to provide secure encrypted communications between two untrusted hosts over an "
    "insecure network. X11 connections, arbitrary TCP ports and sockets can also be forwarded.\n",
    "NAME\n  cron - daemon to execute scheduled commands\n\nSYNOPSIS\n  cron [-f] [-l] [-L loglevel]\n\n"
    "DESCRIPTION\n  cron is started automatically from /etc/init.d on entering multi-user runlevels. Cron "
    "searches its spool area for crontab files which are named after accounts in /etc/passwd; crontabs found "
    "are loaded into memory. Cron also searches for /etc/crontab and the files in the /etc/cron.d directory.\n",
]
USERS = ["\nOPTIONS\n  -%s" % c for c in "abcdefghijklmnopqrstuvwxyz"]


def cfg_roundrobin():
    """The shipped cfg with the load-placed HTTP backend balanced round-robin (the baseline)."""
    with open(haproxy_cluster.HAPROXY_CFG) as f:
        text = f.read()
    assert "    balance leastconn\n    stick on req.hdr(X-Djinn-Session)" in text
    text = text.replace("    balance leastconn\n    stick on req.hdr(X-Djinn-Session)",
                        "    balance roundrobin\n    stick on req.hdr(X-Djinn-Session)", 1)
    fd, path = tempfile.mkstemp(suffix=".cfg")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def throughput(djinnd, n, args):
    """args.clients binary connections through HAProxy (placed by leastconn), each running its
    share of args.requests generations of args.tokens tokens (ignore_eos) one after another."""
    cl = haproxy_cluster.Cluster(djinnd, n=n, extra=["--threads", str(args.threads)])
    try:
        per = [args.requests // args.clients + (1 if c < args.requests % args.clients else 0)
               for c in range(args.clients)]
        conns = [djinn.connect("127.0.0.1:%d" % cl.lb_bin) for _ in range(args.clients)]
        models = [c.model("demo") for c in conns]

        def one(c, k):  # distinct prompts: compute, not the prefix cache, is measured
            g = models[c].generate("NAME\n  tool%d-%d - " % (c, k), max_new_tokens=args.tokens, temperature=0,
                                   ignore_eos=True, stream=False)
            return len(g.ids)

        with ThreadPoolExecutor(args.clients) as ex:  # warm-up: every daemon has loaded the model
            list(ex.map(lambda c: one(c, -1), range(args.clients)))
        t0 = time.monotonic()
        with ThreadPoolExecutor(args.clients) as ex:
            toks = sum(ex.map(lambda c: sum(one(c, k) for k in range(per[c])), range(args.clients)))
        dt = time.monotonic() - t0
        for c in conns:
            c.close()
        return toks / dt, toks, dt
    finally:
        cl.close()


def prefix_hits(djinnd, by_prefix, args):
    """Requests of 4 system prompts (each with its own user line) through 3 daemons, one at a
    time; cached_tokens / prompt_tokens over them all (the first of each prompt included)."""
    cfg = None if by_prefix else cfg_roundrobin()
    saved = haproxy_cluster.HAPROXY_CFG
    try:
        if cfg:
            haproxy_cluster.HAPROXY_CFG = cfg
        cl = haproxy_cluster.Cluster(djinnd, n=3, extra=["--threads", str(args.threads), "--data-gb", args.data_one])
    finally:
        haproxy_cluster.HAPROXY_CFG = saved
        if cfg:
            os.unlink(cfg)
    try:
        cached = prompt = 0
        where = {}
        for k in range(args.prefix_requests):
            sp = SYSTEMS[k % 4]
            hdr = balance.http_headers(prefix_of=sp) if by_prefix else {}
            r, server = cl.http_post(cl.lb_http, "/v1/completions",
                                     {"model": "demo", "prompt": sp + USERS[k % len(USERS)], "max_tokens": 8,
                                      "temperature": 0}, headers=hdr)
            u = r["usage"]
            prompt += u["prompt_tokens"]
            cached += (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            where.setdefault(k % 4, set()).add(server)
        return cached / prompt, cached, prompt, {p: sorted(s) for p, s in where.items()}
    finally:
        cl.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("djinnd", nargs="?", default="build/djinnd")
    ap.add_argument("--threads", type=int, default=1, help="engine threads (cores) per daemon")
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--requests", type=int, default=36)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prefix-requests", type=int, default=48)
    ap.add_argument("--data", default="3m,16m",
                    help="each daemon's KV data segment in the prefix runs (--data-gb), comma-separated: 3m holds "
                         "about two system prompts' blocks beside a running request, 16m all four")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-prefix", action="store_true")
    args = ap.parse_args()
    haproxy_cluster.find_haproxy()
    print("cores on this machine: %d; engine threads per daemon: %d" % (os.cpu_count(), args.threads))
    if not args.skip_throughput:
        base = None
        for n in (1, 2, 3):
            tps, toks, dt = throughput(args.djinnd, n, args)
            base = base or tps
            print("throughput: %d daemon(s): %.1f tokens/s (%d tokens in %.2f s, %d clients) = %.2fx one daemon" %
                  (n, tps, toks, dt, args.clients, tps / base), flush=True)
    for data in ([] if args.skip_prefix else args.data.split(",")):
        args.data_one = data
        rr = prefix_hits(args.djinnd, False, args)
        ph = prefix_hits(args.djinnd, True, args)
        print("prefix (--data-gb %s, %d requests, 4 system prompts, 3 daemons): round-robin %.3f (%d of %d prompt "
              "tokens cached; daemons per prompt %s)" % (data, args.prefix_requests, rr[0], rr[1], rr[2], rr[3]))
        print("prefix (--data-gb %s): X-Djinn-Prefix hash %.3f (%d of %d; daemons per prompt %s) = %s round-robin's"
              % (data, ph[0], ph[1], ph[2], ph[3], "%.2fx" % (ph[0] / rr[0]) if rr[0] else "inf x (it had none)"),
              flush=True)


if __name__ == "__main__":
    main()
