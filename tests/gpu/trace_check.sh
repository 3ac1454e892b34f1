#!/usr/bin/env bash
# trace_check.sh: issue 14 on the GPU machine in one go - gpu_trace
# (interventions against the CPU engine, traced decode steps replaying graphs),
# bench_trace on the Llama-3-8B shape (a plain step against one saving 2
# points: prefill 512 and decode at ctx 512; bar 1.05), and the fixtures'
# transformers references of interventions (tools/make_fixtures.py
# --add-trace), whose reference.json files land in OUT/fixtures/<name>/ to be
# copied into tests/fixtures/models/<name>/.
# The programs: scripts/gpu_programs.sh ($DJ_BIN, else .carry/gpu.tar.xz from
# scripts/gpu_bundle.sh build-cuda/gpu_trace build-cuda/bench_trace
# build-cuda/bench_trace_host, else built here).
# usage (repo root): tests/gpu/trace_check.sh [--out DIR] [--no-fixtures]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/djinn-trace-out}
FIX=1
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift ;;
        --no-fixtures) FIX=0 ;;
        *) echo "usage: $0 [--out DIR] [--no-fixtures]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
. scripts/gpu_programs.sh
dj_gpu_programs gpu_trace bench_trace bench_trace_host make_random_checkpoint || exit 2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
echo "commit $(git rev-parse --short HEAD 2>/dev/null)"
fail=0
"$B/gpu_trace" . >"$OUT/gpu_trace.log" 2>&1 || fail=1
grep -E "points:|graph replays|passed|FAIL" "$OUT/gpu_trace.log" | tail -40
M=${DJ_BENCH_MODEL:-/tmp/djinn-llama3-8b}
[ -s "$M/model.safetensors" ] || "$B/make_random_checkpoint" llama3-8b "$M" --seed 1 >/dev/null || exit 2
"$B/bench_trace" --model "$M" --device cuda:0 --prefill 512 --ctx 512 --reps 20 2>&1 | tee "$OUT/bench_trace.log"
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
# the host's share of a saved point at that shape, before the fix and now (this machine's host)
"$B/bench_trace_host" --rows 512 --hidden 4096 2>&1 | tee -a "$OUT/bench_trace.log"
if [ $FIX = 1 ]; then
    python3 tools/make_fixtures.py --add-trace >"$OUT/add_trace.log" 2>&1 || fail=1
    tail -14 "$OUT/add_trace.log"
    for d in tests/fixtures/models/*/; do
        n=$(basename "$d")
        mkdir -p "$OUT/fixtures/$n"
        cp "$d/reference.json" "$OUT/fixtures/$n/"
    done
fi
echo "trace_check.sh: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
