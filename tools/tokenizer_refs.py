#!/usr/bin/env python3
"""tokenizer_refs.py: reference encodings for the tokenizer tests.

Runs where the Hugging Face `tokenizers` library is installed (the GPU machine).
For each tokenizer.json under third_party/tokenizers/<name>/ and each string in
tests/fixtures/tokenizer/strings.json it records the ids without special tokens
(add_special_tokens=False), with them (True), and the decoding of the former,
into tests/fixtures/tokenizer/refs_<name>.json.

    python3 tools/tokenizer_refs.py [--tokenizers third_party/tokenizers] [--out tests/fixtures/tokenizer]
"""
import argparse
import json
import os

from tokenizers import Tokenizer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", default="third_party/tokenizers")
    ap.add_argument("--out", default="tests/fixtures/tokenizer")
    args = ap.parse_args()
    with open(os.path.join(args.out, "strings.json"), encoding="utf-8") as f:
        strings = json.load(f)
    import tokenizers
    for name in sorted(os.listdir(args.tokenizers)):
        path = os.path.join(args.tokenizers, name, "tokenizer.json")
        if not os.path.exists(path):
            continue
        tok = Tokenizer.from_file(path)
        cases = []
        for s in strings:
            ids = tok.encode(s, add_special_tokens=False).ids
            ids_sp = tok.encode(s, add_special_tokens=True).ids
            cases.append({"text": s, "ids": ids, "ids_special": ids_sp,
                          "decoded": tok.decode(ids, skip_special_tokens=False)})
        out = {"tokenizer": name, "tokenizers_version": tokenizers.__version__, "cases": cases}
        with open(os.path.join(args.out, f"refs_{name}.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=0)
        print(f"{name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
