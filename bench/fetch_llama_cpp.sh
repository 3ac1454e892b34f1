#!/usr/bin/env bash
# fetch_llama_cpp.sh: llama.cpp's source for cpu_bench.sh's side-by-side,
# from the npm registry (node-llama-cpp ships the llama.cpp release it binds
# as a git bundle): writes .carry/llama.cpp.bundle (about 34 MB, small enough
# to carry to a machine without network). Benchmarks only; nothing links it.
# usage: bench/fetch_llama_cpp.sh [NODE_LLAMA_CPP_VERSION=3.22.1]
set -euo pipefail
cd "$(dirname "$0")/.."
VER=${1:-3.22.1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack "node-llama-cpp@$VER" >/dev/null 2>&1)
tar -xzf "$tmp"/node-llama-cpp-*.tgz -C "$tmp" package/llama/gitRelease.bundle
mkdir -p .carry
mv "$tmp/package/llama/gitRelease.bundle" .carry/llama.cpp.bundle
echo "llama.cpp (node-llama-cpp $VER's bundle): .carry/llama.cpp.bundle, $(du -h .carry/llama.cpp.bundle | cut -f1)"
