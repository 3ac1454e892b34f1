#!/usr/bin/env bash
# gpu_check.sh: the GPU machine's one command - every CUDA op against the CPU
# backend (gpu_check), the fixture and demo models end to end in bf16 against
# transformers (gpu_models), KV swap exactness and copy rates (gpu_swap), the
# prefix cache against an engine without it (gpu_prefix); with
# --bench also the Llama-3-8B-shape benchmarks (bench_gpu, and gpu_swap on
# that shape) and HF transformers eager on the same weights (bench/hf_decode.py).
# The programs: scripts/gpu_programs.sh ($DJ_BIN, else .carry/gpu.tar.xz, which
# scripts/gpu_bundle.sh makes on a machine with our apt packages, else built here).
# --ab adds bench_gpu under each kill switch (ab.log: one block per
# setting: what each default is worth) and a DJINN_PROFILE per-op table of prefill and eager decode
# (profile.log). Captured graphs (issue 44): gpu_capture over the
# bundles (gpu_capture.log) and test_remote.py through djinnd --graph-device engine (gpu_remote.log).
# --fp8 (issue 16; implies --bench) also writes the FP8 8B-shape checkpoint
# (transformers "fp8" layout: make_random_checkpoint --dtype fp8) and runs
# bench_gpu on it after the bf16 run (bench_fp8.log): decode b=1, b=32 and
# prefill 2048 of both printed side by side.
# usage (repo root): scripts/gpu_check.sh [--bench] [--ab] [--fp8] [--out DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH=0
AB=0
FP8=0
OUT=${OUT:-/tmp/djinn-gpu-out}
while [ $# -gt 0 ]; do
    case "$1" in
        --bench) BENCH=1 ;;
        --ab) AB=1; BENCH=1 ;;
        --fp8) FP8=1; BENCH=1 ;;
        --out) OUT=$2; shift ;;
        *) echo "usage: $0 [--bench] [--ab] [--fp8] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
. scripts/gpu_programs.sh
CUDA_ARGS=${DJ_CMAKE_ARGS:-} dj_gpu_programs gpu_check gpu_capture gpu_models gpu_swap gpu_prefix djinn djinnd bench_gpu \
    bench_fairness make_random_checkpoint || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fail=0
flags=""
[ $BENCH = 1 ] && flags="--bench"
"$B/gpu_check" $flags >"$OUT/gpu_check.log" 2>&1 || fail=1
grep -E "checks|^bench|FAIL" "$OUT/gpu_check.log"
"$B/gpu_models" . 2>&1 | tee "$OUT/gpu_models.log" | grep -vE "^seed" || fail=1
# captured graphs (issue 44): every bundle on the GPU against the CPU executor, fresh random inputs
CB=${DJ_CAPTURE_BUNDLES:-$B/../capture}
if [ -x "$B/gpu_capture" ] && [ -d "$CB" ]; then
    "$B/gpu_capture" "$CB" >"$OUT/gpu_capture.log" 2>&1 || fail=1
    grep -E "^FAIL|^ops|capture checks" "$OUT/gpu_capture.log"
else
    echo "gpu_capture: no bundles at $CB (scripts/capture_bundles.sh DIR, then DJ_CAPTURE_BUNDLES=DIR)"
fi
# captured modules through djinnd on the GPU (--graph-device engine), against eager on this torch
if python3 -c "import torch, msgpack, numpy" 2>/dev/null; then
    DJINND=$B/djinnd DJINN_CLI=$B/djinn DJ_TEST_DAEMON_ARGS="--device cuda:0 --graph-device engine" \
        python3 -m pytest -q -p no:cacheprovider python/tests/test_remote.py >"$OUT/gpu_remote.log" 2>&1 || fail=1
    tail -3 "$OUT/gpu_remote.log"
fi
if [ $BENCH = 1 ]; then
    M=${DJ_BENCH_MODEL:-/tmp/djinn-llama3-8b}
    [ -s "$M/model.safetensors" ] || "$B/make_random_checkpoint" llama3-8b "$M" --seed 1 || exit 2
fi
# KV swap: restored sessions bit-identical to unswapped twins, copy rates (and
# with --bench a 2048-token session of the 8B shape swapped out and back)
"$B/gpu_swap" . ${M:+--model "$M"} >"$OUT/gpu_swap.log" 2>&1 || fail=1
grep -E "restores|auto VMU|^bench swap|checks|passed|FAIL" "$OUT/gpu_swap.log"
# prefix cache: conversations on shared KV blocks against an engine without it
if [ -x "$B/gpu_prefix" ]; then
    "$B/gpu_prefix" . >"$OUT/gpu_prefix.log" 2>&1 || fail=1
    grep -E "steps after|passed|FAIL" "$OUT/gpu_prefix.log"
fi
if [ $BENCH = 1 ]; then
    "$B/bench_gpu" "$M" --json "$OUT/bench_gpu.json" >"$OUT/bench_gpu.log" 2>&1 || fail=1
    tail -24 "$OUT/bench_gpu.log"
    # --deterministic: batch rows bit-identical to a session alone; its b=32 cost
    "$B/bench_gpu" "$M" --deterministic --steps 16 >"$OUT/bench_det.log" 2>&1 || fail=1
    grep -E "deterministic|decode b=|checks," "$OUT/bench_det.log"
    python3 bench/hf_decode.py "$M" --attn eager --json "$OUT/hf_eager.json" 2>&1 | grep -vi warn | tail -4
fi
if [ $FP8 = 1 ]; then
    M8=${DJ_BENCH_FP8_MODEL:-/tmp/djinn-llama3-8b-fp8}
    [ -s "$M8/model.safetensors" ] || "$B/make_random_checkpoint" llama3-8b "$M8" --seed 1 --dtype fp8 || exit 2
    "$B/bench_gpu" "$M8" >"$OUT/bench_fp8.log" 2>&1 || fail=1
    for log in bench_gpu bench_fp8; do # bf16 (the --bench run above), then FP8, same machine
        echo "== $log"
        grep -E "^decode b=|^prefill|checks,|FAIL" "$OUT/$log.log"
    done
fi
if [ $AB = 1 ]; then
    : >"$OUT/ab.log"
    for setting in DJINN_NO_GRAPHS=1 DJINN_FUSE=off DJINN_DEVICE_SAMPLING=off; do
        echo "== $setting" >>"$OUT/ab.log"
        env "$setting" "$B/bench_gpu" "$M" >>"$OUT/ab.log" 2>&1 || { echo "bench_gpu failed under $setting" >>"$OUT/ab.log"; fail=1; }
    done
    grep -E "^== |decode b=1 ctx 512|prefill 2048 tokens \(s|decode b=32|checks," "$OUT/ab.log"
    DJINN_PROFILE=1 DJINN_NO_GRAPHS=1 "$B/bench_gpu" "$M" --steps 8 --batch 2 >"$OUT/profile.log" 2>&1 || fail=1
    grep -A40 "^DJINN_PROFILE" "$OUT/profile.log"
    # djinnd on the GPU: a 2048-token prompt beside a running generation,
    # prompt chunks in their own steps or riding in the decode steps
    for mixed in off on; do
        pf=$(mktemp -u /tmp/djinn_ab_port.XXXXXX)
        "$B/djinnd" --listen 127.0.0.1:0 --port-file "$pf" --models "$(dirname "$M")" --device cuda:0 \
            --vmu-gb 40 --mixed-steps "$mixed" >>"$OUT/ab.log" 2>&1 &
        dpid=$!
        for _ in $(seq 1 600); do [ -s "$pf" ] && break; sleep 0.1; done
        echo "== djinnd --mixed-steps $mixed" | tee -a "$OUT/ab.log"
        [ -s "$pf" ] && "$B/bench_fairness" "127.0.0.1:$(cat "$pf")" "$(basename "$M")" 2048 2>&1 | tee -a "$OUT/ab.log"
        kill "$dpid"
        wait "$dpid" 2>/dev/null
        rm -f "$pf"
    done
fi
# The lines to paste into bench/RESULTS.md.
{
    echo "## gpu_check.sh $* on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"
    echo '```'
    grep -E "checks|FAIL" "$OUT/gpu_check.log"
    grep -E "passed|failed|FAIL" "$OUT/gpu_models.log" | tail -3
    [ -f "$OUT/gpu_capture.log" ] && grep -E "^FAIL|capture checks|resnet|bert|gpt2" "$OUT/gpu_capture.log"
    grep -E "restores|auto VMU|^bench swap|passed|failed|FAIL" "$OUT/gpu_swap.log" 
    grep -E "^bench sample|^bench (gemv|fused|determin)" "$OUT/gpu_check.log"
    [ -f "$OUT/bench_gpu.log" ] && grep -E "^decode|^prefill|bar|checks,|FAIL" "$OUT/bench_gpu.log"
    [ -f "$OUT/bench_fp8.log" ] && grep -E "^== |^decode b=|^prefill|checks,|FAIL" "$OUT/bench_fp8.log"
    [ -f "$OUT/bench_det.log" ] && sed 's/^/--deterministic: /' "$OUT/bench_det.log" | grep -E "decode b=32|bit-identical|checks,|FAIL"
    echo "gpu_check.sh: $([ $fail = 0 ] && echo PASS || echo FAIL)"
    echo '```'
} >"$OUT/summary.md"
cat "$OUT/summary.md"
echo "gpu_check.sh: $([ $fail = 0 ] && echo PASS || echo FAIL) (summary: $OUT/summary.md)"
exit $fail
