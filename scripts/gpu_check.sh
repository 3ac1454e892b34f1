#!/usr/bin/env bash
# gpu_check.sh: the GPU machine's one command - every CUDA op against the CPU
# backend (gpu_check), the fixture and demo models end to end in bf16 against
# transformers (gpu_models); with --bench also the Llama-3-8B-shape benchmarks
# (bench_gpu) and HF transformers eager on the same weights (bench/hf_decode.py).
# The programs come from .carry/gpu.tar.xz when present (scripts/gpu_bundle.sh
# makes it on a machine with our apt packages), else they are built here.
# usage (repo root): scripts/gpu_check.sh [--bench] [--out DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH=0
OUT=${OUT:-/tmp/djinn-gpu-out}
while [ $# -gt 0 ]; do
    case "$1" in
        --bench) BENCH=1 ;;
        --out) OUT=$2; shift ;;
        *) echo "usage: $0 [--bench] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
if [ -f .carry/gpu.tar.xz ]; then
    G=$(mktemp -d)
    tar xJf .carry/gpu.tar.xz -C "$G" || exit 2
    export LD_LIBRARY_PATH="$G/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    B=$G/bin
else
    cmake -S . -B build-cuda -DDJ_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${DJ_CMAKE_ARGS:-} >/dev/null || exit 2
    cmake --build build-cuda -j"$(nproc)" --target gpu_check gpu_models djinn bench_gpu make_random_checkpoint || exit 2
    B=build-cuda
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fail=0
flags=""
[ $BENCH = 1 ] && flags="--bench"
"$B/gpu_check" $flags >"$OUT/gpu_check.log" 2>&1 || fail=1
grep -E "checks|^bench|FAIL" "$OUT/gpu_check.log"
"$B/gpu_models" . 2>&1 | tee "$OUT/gpu_models.log" | grep -vE "^seed" || fail=1
if [ $BENCH = 1 ]; then
    M=${DJ_BENCH_MODEL:-/tmp/djinn-llama3-8b}
    [ -s "$M/model.safetensors" ] || "$B/make_random_checkpoint" llama3-8b "$M" --seed 1 || exit 2
    "$B/bench_gpu" "$M" --json "$OUT/bench_gpu.json" >"$OUT/bench_gpu.log" 2>&1 || fail=1
    tail -22 "$OUT/bench_gpu.log"
    python3 bench/hf_decode.py "$M" --attn eager --json "$OUT/hf_eager.json" 2>&1 | grep -vi warn | tail -4
fi
echo "gpu_check.sh: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
