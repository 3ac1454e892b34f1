#!/usr/bin/env python3
"""demo_corpus.py: the pure-Python parts of the demo-model corpus, shared by
make_corpus.py (which builds it here) and train_demo_model.py (which reads it
on the GPU machine). Standard library only; checked by test_demo_corpus.py.

corpus.txt holds documents (one rendered manual page each, in manifest order)
each followed by a line holding only a form feed: DOC_SEP. Normalised text
never contains a form feed, so splitting is unambiguous.

    python3 tools/demo_corpus.py table MANIFEST.json   # markdown package table
"""
import hashlib
import json
import re
import sys
import unicodedata

DOC_SEP = "\f\n"
HELDOUT_EVERY = 50  # document i is held out when i % HELDOUT_EVERY == HELDOUT_EVERY - 1

# Typographic characters groff may emit, mapped to what a user would type.
_TYPO = {
    "\u2010": "-", "\u2011": "-", "\u2212": "-", "\u00ad": "",
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
    "\u00a0": " ", "\u2002": " ", "\u2003": " ", "\u2009": " ",
}
_TYPO_RE = re.compile("[" + "".join(_TYPO) + "]")
_SPACES_RE = re.compile(r"[ \t]{2,}")
MAX_RUN = 16
_RUN_RE = re.compile(r"([^ \n])\1{%d,}" % MAX_RUN)  # table rules drawn across very wide lines


def _clean_char(c):
    if c == "\n" or c == " ":
        return c
    if c == "\t":
        return " "
    cat = unicodedata.category(c)
    if cat in ("Cc", "Cf", "Cs", "Co", "Cn"):
        return ""
    return c


def normalize_text(text):
    """Rendered manual page -> clean text.

    Unicode NFC; typographic hyphens/quotes/spaces to ASCII; control and format
    characters dropped (tabs become spaces); per line: trailing space stripped,
    leading indentation of n columns rewritten as 2*ceil(n/7) spaces (man's
    7-column indent steps become 2-space levels), inner runs of spaces collapsed
    to one; a run of one character longer than MAX_RUN (table rules drawn
    across the wide page) cut to MAX_RUN; runs of blank lines collapsed to one; no leading/trailing blank
    lines; ends with exactly one newline (empty string if nothing is left)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _TYPO_RE.sub(lambda m: _TYPO[m.group(0)], text)
    text = unicodedata.normalize("NFC", "".join(_clean_char(c) for c in text))
    text = _RUN_RE.sub(lambda m: m.group(1) * MAX_RUN, text)
    out = []
    blank = False
    for line in text.split("\n"):
        body = line.strip(" ")
        if not body:
            blank = bool(out)
            continue
        indent = len(line) - len(line.lstrip(" "))
        if blank:
            out.append("")
            blank = False
        out.append(" " * (2 * ((indent + 6) // 7)) + _SPACES_RE.sub(" ", body))
    return "\n".join(out) + "\n" if out else ""


def join_docs(docs):
    """Documents -> corpus text. Each document must be normalised (non-empty,
    ending in a newline, no form feed)."""
    for i, d in enumerate(docs):
        if not d or not d.endswith("\n") or "\f" in d:
            raise ValueError(f"document {i} is not normalised")
    return "".join(d + DOC_SEP for d in docs)


def split_docs(corpus):
    """Corpus text -> list of documents (inverse of join_docs)."""
    if corpus and not corpus.endswith(DOC_SEP):
        raise ValueError("corpus does not end with a document separator")
    parts = corpus.split(DOC_SEP)
    return parts[:-1]


def read_corpus(path):
    """Corpus text from corpus.txt or corpus.txt.gz."""
    if path.endswith(".gz"):
        import gzip
        with gzip.open(path, "rb") as f:
            return f.read().decode("utf-8")
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def read_docs(path):
    return split_docs(read_corpus(path))


def is_heldout(index):
    return index % HELDOUT_EVERY == HELDOUT_EVERY - 1


def train_heldout(docs):
    """(train docs, held-out docs): every HELDOUT_EVERY-th document is held out."""
    train, held = [], []
    for i, d in enumerate(docs):
        (held if is_heldout(i) else train).append(d)
    return train, held


def sha256_text(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---- licenses (from /usr/share/doc/<pkg>/copyright) ----

# License families accepted as clearly free (matched against each name, case-insensitive).
FREE_PATTERNS = [
    r"^(a|l)?gpl", r"^gplv?\d", r"^lgplv?\d", r"^gfdl-niv", r"^gfdl-[\d.+]+-no-invariant",
    r"^bsd", r"^mit", r"^expat", r"^x11", r"^isc", r"^apache", r"^artistic", r"^zlib",
    r"^public-domain", r"^cc0", r"^postgresql", r"^curl", r"^tcl", r"^zsh", r"^less$",
    r"^fsf", r"^boost", r"^bsl", r"^openssh", r"^beerware", r"^oldap", r"^latex2e",
    r"^edl-", r"^linux-man-pages-copyleft", r"^permissive", r"^bzip", r"^cc-by-sa", r"^pcre",
    r"^unicode", r"bsd-style",
]
# Names that mark a package as not clearly free.
NONFREE_PATTERNS = [r"non-?free", r"-nc\b", r"-nd\b", r"proprietary", r"gfdl(?!-niv|-[\d.+]+-no-invariant)"]

_SPLIT_RE = re.compile(r"\s+(?:or|and|and/or)\s+|,\s*(?:and\s+)?|\(|\)")


def dep5_licenses(text):
    """License names in a machine-readable (DEP-5) copyright file: the first
    line of every License: field, split at 'or'/'and'/commas, exceptions
    ('with ... exception') dropped. Sorted, unique."""
    names = set()
    for m in re.finditer(r"^License:[ \t]*(.*)$", text, re.M):
        expr = re.sub(r"\s+with\s+.*?exception", "", m.group(1).strip(), flags=re.I)
        for part in _SPLIT_RE.split(expr):
            part = part.strip()
            if part:
                names.add(part)
    return sorted(names)


# (name, regex) for copyright files that are not machine-readable.
_TEXT_LICENSES = [
    ("LGPL", re.compile(r"GNU\s+(Lesser|Library)\s+General\s+Public\s+License", re.I)),
    ("GPL", re.compile(r"GNU\s+General\s+Public\s+License", re.I)),
    ("BSD", re.compile(r"Redistribution and use in source and binary forms", re.I)),
    ("MIT/X11", re.compile(r"Permission is hereby granted, free of charge", re.I)),
    ("Tcl", re.compile(r"hereby grant permission to use, copy, modify, distribute,\s+and license", re.I)),
    ("Apache", re.compile(r"Apache License", re.I)),
    ("Artistic", re.compile(r"Artistic License", re.I)),
    ("public-domain", re.compile(r"public domain", re.I)),
]


def _gpl_versions(text, lesser):
    """'GPL-2+'-style names from 'version N ... or (at your option) any later version'."""
    kind = r"(?:Lesser|Library)\s+" if lesser else r""
    out = set()
    for m in re.finditer(r"GNU\s+" + kind + r"General\s+Public\s+License[^.]{0,120}?version\s+([\d.]+)([^.]{0,80})",
                         text, re.I | re.S):
        ver = m.group(1).rstrip(".")
        later = re.search(r"any later", m.group(2), re.I)
        out.add(("LGPL-" if lesser else "GPL-") + ver + ("+" if later else ""))
    return out


def text_licenses(text):
    """Best-effort license names in a free-form copyright file."""
    names = set()
    for name, rx in _TEXT_LICENSES:
        if rx.search(text):
            names.add(name)
    if "LGPL" in names:
        vers = _gpl_versions(text, True)
        if vers:
            names.discard("LGPL")
            names |= vers
    if "GPL" in names:
        vers = _gpl_versions(text, False)
        if vers:
            names.discard("GPL")
            names |= vers
    return sorted(names)


def parse_copyright(text):
    """(format, names): format is 'dep5' or 'text'."""
    first = text.lstrip().split("\n", 1)[0]
    if re.match(r"Format:.*(copyright-format|dep5|DEP-5)", first, re.I):
        return "dep5", dep5_licenses(text)
    return "text", text_licenses(text)


def license_verdict(names):
    """(ok, reason, unrecognised names). ok when at least one name is in a
    clearly free family and no name marks non-free text. Names outside the known
    families (package-specific permissive notices such as 'Spencer-86') are
    returned so the manifest can list them; the caller also requires the package
    to come from Debian main, whose every license the archive has reviewed."""
    if not names:
        return False, "license not determinable", []
    for n in names:
        for rx in NONFREE_PATTERNS:
            if re.search(rx, n, re.I):
                return False, f"license {n!r} is not clearly free", []
    unknown = [n for n in names if not any(re.search(rx, n, re.I) for rx in FREE_PATTERNS)]
    if len(unknown) == len(names):
        return False, "no recognised free license: " + ", ".join(unknown), unknown
    return True, "ok", unknown


# ---- manifest ----

def manifest_table(manifest):
    """Markdown table of the packages in a manifest."""
    rows = ["| package | version | licenses (from its copyright file) | pages | bytes |",
            "| --- | --- | --- | ---: | ---: |"]
    for p in manifest["packages"]:
        lic = ", ".join(p["licenses"])
        rows.append(f"| {p['package']} | {p['version']} | {lic} | {p['n_docs']} | {p['bytes']} |")
    t = manifest["totals"]
    rows.append(f"| **total** ({len(manifest['packages'])} packages) | | | {t['n_docs']} | {t['bytes']} |")
    return "\n".join(rows) + "\n"


def main(argv):
    if len(argv) == 3 and argv[1] == "table":
        with open(argv[2], encoding="utf-8") as f:
            sys.stdout.write(manifest_table(json.load(f)))
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
