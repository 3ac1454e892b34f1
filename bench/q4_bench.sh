#!/usr/bin/env bash
# q4_bench.sh: bf16 against 4-bit weights (issue 16) on the Llama-3-8B shape in
# one GPU run - bench_gpu (decode b=1, decode b=32, prefill 2048) on a random
# bf16 checkpoint and on random AWQ and GPTQ checkpoints of the same shape
# (make_random_checkpoint --quant; the 4-bit kinds repack to the same rows, so
# their figures should agree). Logs and bench_gpu's JSON go to OUT. The
# programs: scripts/gpu_programs.sh ($DJ_BIN, else .carry/gpu.tar.xz from
# scripts/gpu_bundle.sh, else built here into build-cuda).
# usage (repo root, GPU machine): bash bench/q4_bench.sh [OUT (default /tmp/djinn-q4)]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/djinn-q4}
M=${DJ_Q4_MODELS:-/tmp/djinn-q4-models}
mkdir -p "$OUT" "$M"
. scripts/gpu_programs.sh
dj_gpu_programs bench_gpu make_random_checkpoint || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
git log -1 --format='commit %h %s' 2>/dev/null || true
fail=0
for kind in bf16 awq gptq; do
    d=$M/llama3-8b-$kind
    q=""
    [ "$kind" != bf16 ] && q="--quant $kind"
    [ "$kind" = bf16 ] && d=${DJ_BENCH_MODEL:-/tmp/djinn-llama3-8b} # scripts/gpu_check.sh --bench's, the same seed
    [ -s "$d/model.safetensors" ] || "$B/make_random_checkpoint" llama3-8b "$d" --seed 1 $q || exit 2
    echo "== $kind: $(du -sh "$d" | cut -f1) on disk"
    "$B/bench_gpu" "$d" --seed 1 --json "$OUT/bench_$kind.json" >"$OUT/bench_$kind.log" 2>&1 || fail=1
    grep -E "model load|decode b=|prefill|checks,|FAIL" "$OUT/bench_$kind.log"
done
exit $fail
