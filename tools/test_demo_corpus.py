#!/usr/bin/env python3
"""test_demo_corpus.py: checks of the pure-Python corpus helpers (demo_corpus.py)
and of the parts of train_demo_model.py that need no torch. Standard library
only; random inputs are fresh per run (the seed is printed).

    python3 tools/test_demo_corpus.py [--seed N]
"""
import json
import os
import random
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import demo_corpus as dc  # noqa: E402

FAILS = 0


def check(cond, what):
    global FAILS
    if not cond:
        FAILS += 1
        print(f"FAIL: {what[:300]}", flush=True)


def random_text(rng):
    alphabet = "\u2500" * 8 + "abc XYZ\t\n\n\r.-\u2010\u2019\u201c\u00a0\u00e9e\u0301\x07\x1b\ufeff\u200b\f"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 400)))


def test_normalize(rng):
    check(dc.normalize_text("") == "", "empty text stays empty")
    check(dc.normalize_text(" \n\t\n") == "", "blank text becomes empty")
    got = dc.normalize_text("TITLE(1)    x    TITLE(1)\n\n\n\nNAME\n       ls \u2010 list\u00a0it   \n"
                            "              indented\n\f")
    check(got == "TITLE(1) x TITLE(1)\n\nNAME\n  ls - list it\n    indented\n", f"known page: {got!r}")
    check(dc.normalize_text("e\u0301") == "\u00e9\n", "NFC composition")
    check(dc.normalize_text("\u250c" + "\u2500" * 900 + "\u2510") == "\u250c" + "\u2500" * 16 + "\u2510\n",
          "long table rules are cut")
    for _ in range(300):
        t = random_text(rng)
        n = dc.normalize_text(t)
        check(dc.normalize_text(n) == n, f"idempotent on {t!r}")
        check("\f" not in n and "\r" not in n and "\t" not in n, f"no control characters in {n!r}")
        check(n == "" or (n.endswith("\n") and not n.endswith("\n\n") and not n.startswith("\n")),
              f"edges of {n!r}")
        check("\n\n\n" not in n, f"blank runs collapsed in {n!r}")
        for line in n.split("\n"):
            body = line.lstrip(" ")
            check(line == line.rstrip(" "), f"trailing space in {line!r}")
            check((len(line) - len(body)) % 2 == 0, f"indent is a multiple of 2 in {line!r}")
            check("  " not in body, f"inner spaces collapsed in {line!r}")
            check(re.search(r"(.)\1{%d}" % dc.MAX_RUN, line) is None, f"no run over MAX_RUN in {line!r}")


def test_docs(rng):
    docs = []
    for _ in range(rng.randrange(1, 400)):
        d = dc.normalize_text(random_text(rng))
        if d:
            docs.append(d)
    corpus = dc.join_docs(docs)
    check(dc.split_docs(corpus) == docs, "split_docs inverts join_docs")
    check(dc.split_docs("") == [], "empty corpus has no documents")
    for bad in (["no newline"], ["form\ffeed\n"], [""]):
        try:
            dc.join_docs(bad)
            check(False, f"join_docs accepted {bad!r}")
        except ValueError:
            pass
    try:
        dc.split_docs("text without separator\n")
        check(False, "split_docs accepted a corpus without a final separator")
    except ValueError:
        pass
    train, held = dc.train_heldout(docs)
    check(len(train) + len(held) == len(docs), "split covers every document")
    check(len(held) == len(docs) // dc.HELDOUT_EVERY, f"{len(held)} held out of {len(docs)}")
    check(held == docs[dc.HELDOUT_EVERY - 1::dc.HELDOUT_EVERY], "held-out are every 50th")
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "corpus.txt")
        with open(p, "w", encoding="utf-8", newline="") as f:
            f.write(corpus)
        check(dc.read_docs(p) == docs, "read_docs round trip")
        import gzip
        with open(p + ".gz", "wb") as f:
            f.write(gzip.compress(corpus.encode("utf-8"), mtime=0))
        check(dc.read_docs(p + ".gz") == docs, "read_docs round trip through gzip")


def test_licenses():
    dep5 = ("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
            "Files: *\nCopyright: x\nLicense: GPL-3+ with Bison exception\n\n"
            "Files: a\nLicense: BSD-3-clause or GPL-2+, and ISC\n\nLicense: ISC\n text\n")
    fmt, names = dc.parse_copyright(dep5)
    check(fmt == "dep5" and names == ["BSD-3-clause", "GPL-2+", "GPL-3+", "ISC"], f"dep5 names {names}")
    text = ("strace is free software; you can redistribute it under the terms of the GNU Lesser General\n"
            "Public License as published by the Free Software Foundation; either version 2.1 of the License,\n"
            "or (at your option) any later version.\n")
    fmt, names = dc.parse_copyright(text)
    check(fmt == "text" and names == ["LGPL-2.1+"], f"text names {names}")
    fmt, names = dc.parse_copyright("Redistribution and use in source and binary forms, with or without\n")
    check(names == ["BSD"], f"BSD text {names}")
    check(dc.parse_copyright("All rights reserved.\n")[1] == [], "no license found")
    check(dc.license_verdict([])[0] is False, "no license -> excluded")
    check(dc.license_verdict(["GPL-3+", "Spencer-86"])[:1] == (True,), "free + local notice accepted")
    check(dc.license_verdict(["GPL-3+", "Spencer-86"])[2] == ["Spencer-86"], "local notice reported")
    check(dc.license_verdict(["Spencer-86"])[0] is False, "only unknown names -> excluded")
    check(dc.license_verdict(["GPL-2+", "CC-BY-NC-4.0"])[0] is False, "NC -> excluded")
    check(dc.license_verdict(["GFDL-1.3"])[0] is False, "GFDL that may have invariant sections -> excluded")
    check(dc.license_verdict(["GFDL-NIV-1.3"])[0] is True, "GFDL without invariant sections accepted")


def test_manifest_table():
    m = {"packages": [{"package": "grep", "version": "3.8-5", "licenses": ["GPL-3+"], "n_docs": 2,
                       "bytes": 1234}], "totals": {"n_docs": 2, "bytes": 1234}}
    t = dc.manifest_table(m)
    check("| grep | 3.8-5 | GPL-3+ | 2 | 1234 |" in t, f"table row in {t!r}")
    check("(1 packages)" in t, "table total")


def test_committed_manifest():
    path = os.path.join(HERE, "demo_corpus_manifest.json")
    if not os.path.exists(path):
        print("(no manifest yet)")
        return
    with open(path, encoding="utf-8") as f:
        m = json.load(f)
    total = sum(p["bytes"] for p in m["packages"])
    check(total == m["totals"]["bytes"], f"package bytes {total} sum to the total {m['totals']['bytes']}")
    ndocs = sum(len(p["files"]) for p in m["packages"])
    check(ndocs == m["totals"]["n_docs"], "file entries match the document count")
    held = sum(1 for p in m["packages"] for f in p["files"] if f.endswith(":heldout"))
    check(held == m["totals"]["heldout_docs"], "held-out marks match the held-out count")
    for p in m["packages"]:
        check(dc.license_verdict(p["licenses"])[0], f"{p['package']} has a free license")
        sizes = [int(f.removesuffix(":heldout").rsplit(":", 1)[1]) for f in p["files"]]
        check(sum(sizes) == p["bytes"], f"{p['package']} file bytes")


def test_train_script_helpers(rng):
    """The torch-free helpers of train_demo_model.py (imported lazily: torch is optional here)."""
    import train_demo_model as tdm
    n = tdm.param_count(tdm.MODEL)
    check(n * 2 <= 14 * 1000 * 1000, f"bf16 weights {n * 2} bytes fit in 14 MB")
    for _ in range(50):
        total, warm = rng.randrange(10, 10000), rng.randrange(1, 200)
        lrs = [tdm.lr_at(s, total, warm, 1.0, 0.1) for s in range(total + 5)]
        check(all(0.0 < x <= 1.0 + 1e-12 for x in lrs), "lr within (0, peak]")
        check(abs(lrs[min(warm, total) - 1] - 1.0) < 1e-9 or warm > total, "peak at the end of warm-up")
        check(warm > total or abs(lrs[total] - 0.1) < 1e-9, "floor at the end")
        check(all(lrs[i] <= lrs[i - 1] + 1e-12 for i in range(warm, total + 5)), "decays after warm-up")


def main():
    seed = random.SystemRandom().randrange(1 << 32)
    if len(sys.argv) == 3 and sys.argv[1] == "--seed":
        seed = int(sys.argv[2])
    print(f"seed {seed}", flush=True)
    rng = random.Random(seed)
    test_normalize(rng)
    test_docs(rng)
    test_licenses()
    test_manifest_table()
    test_committed_manifest()
    test_train_script_helpers(rng)
    print("OK" if FAILS == 0 else f"{FAILS} failure(s)")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
