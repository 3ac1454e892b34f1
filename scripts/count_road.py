# count_road.py: counts the road of one request in a callgrind dump - functions of src/ entered,
# their files, calls across layers (docs/architecture.md, "How these were counted").
"""usage: count_road.py CALLGRIND_OUT [--list]

Reads a dump written with --compress-strings=no --compress-pos=no while one
request ran (scripts/count_road.sh). A function counts when it lies in src/
and is reachable, through the calls the dump recorded, from a project
function called by code outside src/ (libuv, libmicrohttpd, a thread start)
or with no recorded caller (a loop already running when the recording began),
except the periodic ones that run whether or not a request comes (BACKGROUND).
A call up a layer is a call (caller, callee), counted once per pair, whose
callee lies in a higher layer than its caller (LAYERS, lowest first); a call
down a layer the reverse (the road climbs back up when it returns)."""
import collections
import re
import sys

# lowest first; a file's layer is the first prefix that matches
LAYERS = [
    ("core", ("src/core/",)),
    ("sample", ("src/sample/",)),
    ("proto", ("src/proto/", "src/server/protocol.c")),  # the wire codec both sides link (src/server/ before)
    ("backend", ("src/backend/",)),
    ("client", ("src/client/",)),
    ("vmu", ("src/vmu/",)),
    ("capture", ("src/capture/",)),
    ("graph", ("src/graph/",)),
    ("model", ("src/model/",)),
    ("exec", ("src/exec/",)),
    ("sched", ("src/sched/",)),
    ("server", ("src/server/",)),
    ("cli", ("src/cli/",)),
]
# periodic work of the daemon, not of a request: timers, the clock, the reaper
BACKGROUND = {"on_tick", "on_clock", "reap", "on_signal"}


def layer_of(path):
    for rank, (name, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if p in path:
                return rank, name
    return None


def src_path(path):
    i = path.find("/src/")
    return path[i + 1:] if i >= 0 else None


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    fl = fn = cfl = None
    funcs = {}  # (file, name) of every function with cost or calls in the dump
    edges = collections.defaultdict(int)
    with open(sys.argv[1], errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^(fl|fi|fe|fn|cfl|cfi|cfn|calls)=(.*)$", line)
            if not m:
                continue
            k, v = m.groups()
            if k == "fl":
                fl = v
                cfl = None
            elif k in ("fi", "fe"):
                pass  # inlined code of another file: the function stays fl's
            elif k == "fn":
                fn = v
                cfl = None
                funcs[(fl, fn)] = True
            elif k in ("cfl", "cfi"):
                cfl = v
            elif k == "cfn":
                callee = (cfl if cfl else fl, v)
                edges[((fl, fn), callee)] += 1
                funcs.setdefault(callee, True)
                cfl = None

    def ours(node):
        return src_path(node[0]) is not None and layer_of(src_path(node[0])) is not None

    def name(node):
        return node[1].split("'")[0]  # callgrind marks recursion as name'2

    callees = collections.defaultdict(set)
    called = set()
    roots = set()
    for (a, b) in edges:
        called.add(b)
        if ours(b):
            callees[a].add(b)
            if not ours(a) and name(b) not in BACKGROUND:
                roots.add(b)
    # a loop already running when the recording began (the worker, the CPU pool's threads)
    # has no recorded caller: it is a root too
    roots |= {n for n in funcs if ours(n) and n not in called and name(n) not in BACKGROUND}
    seen = set()  # (file, name), a recursion level (name'2) counted with its function
    walked = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in walked or not ours(n) or name(n) in BACKGROUND:
            continue
        walked.add(n)
        seen.add((n[0], name(n)))
        stack.extend(c for c in callees[n] if name(c) not in BACKGROUND)
    files = collections.Counter(src_path(f) for f, _ in seen)
    climbs, descents = set(), set()
    for (a, b) in edges:
        if not (ours(a) and ours(b)):
            continue
        ka, kb = (a[0], name(a)), (b[0], name(b))
        if ka not in seen or kb not in seen:
            continue
        la, lb = layer_of(src_path(a[0]))[0], layer_of(src_path(b[0]))[0]
        if lb > la:
            climbs.add((ka, kb))
        elif lb < la:
            descents.add((ka, kb))
    by_layer = collections.Counter(layer_of(src_path(f))[1] for f, _ in seen)
    print("functions %d  files %d  calls up a layer %d  calls down a layer %d" %
          (len(seen), len(files), len(climbs), len(descents)))
    print("by layer: " + ", ".join("%s %d" % (n, by_layer[n]) for n, _ in LAYERS if by_layer[n]))
    if "--list" in sys.argv:
        for path, n in sorted(files.items()):
            print("  %-36s %3d  %s" % (path, n, " ".join(sorted(x for f, x in seen if src_path(f) == path))))
        for (a, b) in sorted(climbs, key=lambda e: (src_path(e[0][0]), e[0][1])):
            print("  climb %s:%s -> %s:%s" % (src_path(a[0]), a[1], src_path(b[0]), b[1]))


if __name__ == "__main__":
    main()
