#!/usr/bin/env python3
"""ktrace_gaps.py: where a step's GPU time goes between its kernels, from a
tools/ktrace.c trace. Picks the busiest burst of device work (activity
separated from the rest by more than --split ms of idle device: the second
of the heaviest, as the first is a warm-up) or the --burst N'th, and prints its span, the kernels' busy time, the idle
time between them (by the kernel that follows the gap, and for each gap
whether the host had launched that kernel before the device went idle -
a gap the host could not have closed - or after it - the host was late).
usage: ktrace_gaps.py TRACE.tsv [--split MS] [--burst N] [--top K]"""
import argparse
import collections
import re


def short(name):
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"<.*", "", name)
    return name[:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--split", type=float, default=2.0, help="idle ms that separates bursts")
    ap.add_argument("--burst", type=int, default=0,
                    help="0: the second of the bursts within 0.8x the most busy one (the first is a warm-up); k: the k'th")
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    dev, api = [], {}
    for line in open(a.trace):
        f = line.rstrip("\n").split("\t")
        if len(f) < 6:
            continue
        kind, s, e, corr = f[0], int(f[1]), int(f[2]), int(f[3])
        if kind in "KCS":
            dev.append((s, e, kind, corr, f[5]))
        elif kind in "RD" and corr:
            api[(kind, corr)] = (s, e, f[5])
    dev.sort()
    bursts, cur, cur_end = [], [], 0
    for d in dev:
        if cur and d[0] - cur_end > a.split * 1e6:
            bursts.append(cur)
            cur = []
        cur_end = max(cur_end, d[1]) if cur else d[1]  # the burst's latest end so far
        cur.append(d)
    if cur:
        bursts.append(cur)
    busy = [sum(x[1] - x[0] for x in b) for b in bursts]
    print("%d bursts of device work; busy ms: %s" % (len(bursts), " ".join("%.2f" % (v / 1e6) for v in busy[:40])))
    big = [i for i, v in enumerate(busy) if v >= 0.8 * max(busy)]
    idx = big[min(1, len(big) - 1)] if a.burst == 0 else a.burst - 1
    b = bursts[idx]
    span = max(x[1] for x in b) - b[0][0]
    print("burst %d: %d device ops, span %.3f ms, busy %.3f ms" % (idx + 1, len(b), span / 1e6, busy[idx] / 1e6))
    by_name = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])  # count, gaps, kernel ns, gap ns
    late = early = 0.0
    gaps = []
    end = b[0][1]
    for i, (s, e, kind, corr, name) in enumerate(b):
        n = short(name)
        r = by_name[n]
        r[0] += 1
        r[2] += e - s
        if i:
            g = s - end
            if g > 0:
                r[1] += 1
                r[3] += g
                launch = api.get(("R", corr)) or api.get(("D", corr))
                if launch and launch[1] > end:
                    late += g
                else:
                    early += g
                gaps.append((g, short(b[i - 1][4]), n, launch[1] - end if launch else None))
        end = max(end, e)
    print("idle between ops %.3f ms: %.3f ms after the host launched the next op, %.3f ms waiting for its launch" %
          ((late + early) / 1e6, early / 1e6, late / 1e6))
    hist = collections.Counter()
    for g, *_ in gaps:
        hist[min(int(g / 1000), 20)] += 1
    print("gap histogram (us: count): " + " ".join("%s%d:%d" % ("" if k < 20 else ">=", k, hist[k]) for k in sorted(hist)))
    print("%-62s %6s %10s %10s" % ("op (by the one after the gap)", "count", "busy ms", "gaps ms"))
    for n, r in sorted(by_name.items(), key=lambda x: -(x[1][2] + x[1][3]))[: a.top]:
        print("%-62s %6d %10.3f %10.3f" % (n, r[0], r[2] / 1e6, r[3] / 1e6))
    print("largest gaps (us, before -> after, launch minus previous end us):")
    for g, p, n, lag in sorted(gaps, reverse=True)[:10]:
        print("  %8.1f  %s -> %s  %s" % (g / 1e3, p, n, "?" if lag is None else "%.1f" % (lag / 1e3)))


if __name__ == "__main__":
    main()
