#!/usr/bin/env bash
# capture_bundles.sh: dumps every graph the Python capture tests run (test_capture.py,
# test_capture_transformers.py: per-op modules, torchvision ResNet/MobileNet/ViT, BERT and
# GPT-2 style modules; f32 weights over 64 KiB left out) and one graph per op those do not record
# (tests/gpu/capture_op_bundles.py) as bundles into OUT, for tests/gpu/gpu_capture.c.
# Needs /usr/bin/python3 with torch and a built graph_run_tool.
# usage: scripts/capture_bundles.sh OUT [graph_run_tool]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: $0 OUT [graph_run_tool]}
tool=${2:-build/graph_run_tool}
[ -x "$tool" ] || { echo "capture_bundles.sh: $tool not built" >&2; exit 2; }
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
tool=$(cd "$(dirname "$tool")" && pwd)/$(basename "$tool")
DJ_CAPTURE_DUMP=$out DJ_GRAPH_RUN=$tool PYTHONDONTWRITEBYTECODE=1 \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider python/tests/test_capture.py python/tests/test_capture_transformers.py >&2
# the overloads torch 1.13's dispatch never records (torch 2.x / make_fx graphs): one graph each
/usr/bin/python3 tests/gpu/capture_op_bundles.py "$out" "$tool" >&2
echo "$(ls "$out" | wc -l) bundles, $(du -sh "$out" | cut -f1) in $out"
