#!/usr/bin/env python3
"""make_corpus.py: builds the demo model's training corpus from the English
manual pages that Debian 12 packages ship, and a manifest of what went in.

Runs as root on Debian 12 (it installs the packages with apt-get). For every
package in PACKAGES (sorted) it reads /usr/share/doc/<pkg>/copyright, records
the license names it states and keeps the package only if they are clearly
free and the package is from Debian main. Each English page
(/usr/share/man/man*/, regular files, not '.so' redirects) is rendered with
man-db (`man -l`, no hyphenation or justification, very wide lines so a
paragraph is one line) and `col -bx`, normalised (demo_corpus.normalize_text),
dropped if shorter than MIN_BYTES or identical to (or a hard link of) an
earlier page, and written
in sorted (package, path) order. Outputs:

  OUT/corpus.txt    every document, each followed by a form-feed line
  OUT/corpus.txt.gz the same, gzip'd (what to carry to the GPU machine)
  OUT/heldout.txt   the held-out documents (every 50th), same format
  MANIFEST          packages, versions, licenses, files, bytes, hashes

    python3 tools/make_corpus.py [--out build-corpus] [--manifest tools/demo_corpus_manifest.json]
                                 [--no-install] [--jobs N] [--doc docs/demo-model.md]
    python3 tools/make_corpus.py --doc-only     # refresh the doc's package table from the manifest
"""
import argparse
import concurrent.futures
import gzip
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demo_corpus as dc  # noqa: E402

PACKAGES = sorted([
    # GNU and core tools
    "bash", "coreutils", "diffutils", "findutils", "gawk", "grep", "gzip", "less", "make", "sed", "tar",
    # system administration
    "e2fsprogs", "iproute2", "lvm2", "mdadm", "procps", "strace", "systemd", "util-linux",
    # networking and other tools
    "curl", "git-man", "openssh-client", "openssl", "rsync", "screen", "sqlite3", "tmux", "zsh-common",
    # programming manuals
    "manpages", "manpages-dev", "perl-doc", "libssl-doc", "libcurl4-doc", "libsystemd-dev", "libpcre2-dev",
    "libncurses-dev", "libbsd-dev", "libpcap0.8-dev", "libcap-dev", "tcl8.6-doc", "tk8.6-doc",
    "libx11-doc", "erlang-manpages", "freebsd-manpages",
])
MIN_BYTES = 300
MAN_RE = re.compile(r"^/usr/share/man/man[^/]+/[^/]+$")
DOC_BEGIN = "<!-- corpus-table:begin -->"
DOC_END = "<!-- corpus-table:end -->"


def sh(args, **kw):
    return subprocess.run(args, check=True, capture_output=True, text=True, **kw).stdout


def dpkg_field(pkg, field):
    return sh(["dpkg-query", "-W", "-f", "${" + field + "}", pkg]).strip()


def read_page(path):
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    return raw


def is_redirect(raw):
    """A page whose only content is a '.so other-page' request."""
    lines = [ln.strip() for ln in raw.decode("latin-1").splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(('.\\"', "'\\\"", '.\\#'))]
    return len(lines) == 1 and lines[0].startswith(".so ")


ENV = dict(os.environ, LC_ALL="C.UTF-8", LANG="C.UTF-8", MANWIDTH="1000", MAN_KEEP_FORMATTING="",
           MANROFFSEQ="", MANPAGER="cat", PAGER="cat")
ENV.pop("MANOPT", None)


def render(path):
    """Rendered plain text of one page, or (None, reason)."""
    man = subprocess.Popen(["man", "--nh", "--nj", "-E", "UTF-8", "-l", path], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, env=ENV, cwd="/")
    col = subprocess.run(["col", "-bx"], stdin=man.stdout, capture_output=True, env=ENV, timeout=120)
    man.stdout.close()
    rc = man.wait(timeout=120)
    if rc != 0 or col.returncode != 0:
        return None, f"render failed (man rc {rc}, col rc {col.returncode})"
    return col.stdout.decode("utf-8", errors="replace"), None


def process_file(path):
    try:
        raw = read_page(path)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        return None, f"unreadable: {e}"
    if is_redirect(raw):
        return None, "redirect (.so)"
    text, why = render(path)
    if text is None:
        return None, why
    text = dc.normalize_text(text)
    if len(text.encode("utf-8")) < MIN_BYTES:
        return None, f"shorter than {MIN_BYTES} bytes"
    return text, None


def man_files(pkg, inodes):
    """(pages to render, number of hard links to pages already seen); `inodes` collects (dev, ino)."""
    files = [f for f in sh(["dpkg-query", "-L", pkg]).splitlines() if MAN_RE.match(f)]
    out, links = [], 0
    for f in sorted(files):
        if not os.path.isfile(f) or os.path.islink(f):
            continue
        st = os.stat(f)
        if (st.st_dev, st.st_ino) in inodes:
            links += 1
            continue
        inodes.add((st.st_dev, st.st_ino))
        out.append(f)
    return out, links


def tool_versions():
    out = {}
    for name, args in (("man-db", ["man", "--version"]), ("groff", ["groff", "--version"])):
        out[name] = sh(args).splitlines()[0].strip()
    with open("/etc/debian_version") as f:
        out["debian"] = f.read().strip()
    return out


def update_doc(doc_path, manifest):
    with open(doc_path, encoding="utf-8") as f:
        doc = f.read()
    if DOC_BEGIN not in doc or DOC_END not in doc:
        raise SystemExit(f"{doc_path}: markers {DOC_BEGIN} / {DOC_END} not found")
    head, rest = doc.split(DOC_BEGIN, 1)
    _, tail = rest.split(DOC_END, 1)
    with open(doc_path, "w", encoding="utf-8") as f:
        f.write(head + DOC_BEGIN + "\n" + dc.manifest_table(manifest) + DOC_END + tail)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="build-corpus")
    ap.add_argument("--manifest", default="tools/demo_corpus_manifest.json")
    ap.add_argument("--no-install", action="store_true", help="do not run apt-get")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--doc", default="docs/demo-model.md", help="refresh its package table ('' to skip)")
    ap.add_argument("--doc-only", action="store_true", help="only refresh --doc from an existing --manifest")
    args = ap.parse_args()
    if args.doc_only:
        with open(args.manifest, encoding="utf-8") as f:
            update_doc(args.doc, json.load(f))
        return

    if not args.no_install:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        print("apt-get update / install ...", flush=True)
        subprocess.run(["apt-get", "update"], check=True, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends"] + PACKAGES, check=True, env=env,
                       stdout=subprocess.DEVNULL)

    packages, excluded, skipped = [], [], []
    docs, seen, inodes = [], {}, set()
    for pkg in PACKAGES:
        version = dpkg_field(pkg, "Version")
        section = dpkg_field(pkg, "Section")
        cfile = f"/usr/share/doc/{pkg}/copyright"
        try:
            with open(cfile, encoding="utf-8", errors="replace") as f:
                fmt, names = dc.parse_copyright(f.read())
        except OSError:
            fmt, names = "missing", []
        ok, why, unknown = dc.license_verdict(names)
        if ok and "/" in section:  # contrib/..., non-free/...: not Debian main
            ok, why = False, f"section {section} is not in Debian main"
        if not ok:
            excluded.append({"package": pkg, "version": version, "reason": why, "licenses": names})
            print(f"{pkg} {version}: EXCLUDED ({why})", flush=True)
            continue
        files, links = man_files(pkg, inodes)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as ex:
            results = list(ex.map(process_file, files))
        kept, nbytes = [], 0
        for path, (text, why) in zip(files, results):
            short = path[len("/usr/share/man/"):]
            if text is not None:
                h = dc.sha256_text(text)
                if h in seen:
                    text, why = None, f"duplicate of {seen[h]}"
                else:
                    seen[h] = f"{pkg}:{short}"
            if text is None:
                skipped.append(f"{pkg}:{short}: {why}")
                continue
            n = len(text.encode("utf-8"))
            kept.append(f"{short}:{n}{':heldout' if dc.is_heldout(len(docs)) else ''}")
            docs.append(text)
            nbytes += n
        packages.append({"package": pkg, "version": version, "section": section, "copyright_format": fmt,
                         "licenses": names, "unrecognised_license_names": unknown,
                         "n_docs": len(kept), "bytes": nbytes, "hard_links_skipped": links, "files": kept})
        print(f"{pkg} {version}: {len(kept)}/{len(files)} pages, {nbytes} bytes; licenses {', '.join(names)}",
              flush=True)

    corpus = dc.join_docs(docs)
    train, held = dc.train_heldout(docs)
    held_text = dc.join_docs(held)
    os.makedirs(args.out, exist_ok=True)
    for name, text in (("corpus.txt", corpus), ("heldout.txt", held_text)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8", newline="") as f:
            f.write(text)
    with open(os.path.join(args.out, "corpus.txt.gz"), "wb") as f:  # mtime 0: byte-identical every run
        f.write(gzip.compress(corpus.encode("utf-8"), compresslevel=9, mtime=0))
    manifest = {
        "generator": "tools/make_corpus.py",
        "tools": tool_versions(),
        "format": "documents in order, each followed by a line holding only a form feed (\\f)",
        "heldout_rule": f"document i (0-based, corpus order) is held out when i % {dc.HELDOUT_EVERY} == "
                        f"{dc.HELDOUT_EVERY - 1}",
        "file_entry": "path under /usr/share/man/ : bytes after normalisation [: heldout]",
        "totals": {"packages": len(packages), "n_docs": len(docs), "bytes": len(corpus.encode("utf-8")) -
                   len(docs) * len(dc.DOC_SEP), "train_docs": len(train), "heldout_docs": len(held),
                   "heldout_bytes": sum(len(d.encode("utf-8")) for d in held)},
        "corpus_sha256": dc.sha256_text(corpus),
        "heldout_sha256": dc.sha256_text(held_text),
        "packages": packages,
        "excluded": excluded,
        "skipped_files": skipped,
    }
    with open(args.manifest, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    if args.doc:
        update_doc(args.doc, manifest)
    t = manifest["totals"]
    print(f"corpus: {t['n_docs']} documents from {t['packages']} packages, {t['bytes']} bytes "
          f"({t['heldout_docs']} held out, {t['heldout_bytes']} bytes); sha256 {manifest['corpus_sha256']}",
          flush=True)


if __name__ == "__main__":
    main()
