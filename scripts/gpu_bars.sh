#!/usr/bin/env bash
# gpu_bars.sh: issue 16's bars in one GPU command, on the Llama-3-8B shape with
# random weights (make_random_checkpoint --seed 1): bf16, FP8 (128x128 blocks)
# and AWQ checkpoints; full bench_gpu runs of each (decode b=1, b=32,
# prefill 2048); PAIRS alternating quick prefill pairs bf16 / FP8 (the prefill
# bar is a ratio of rates, so its two sides are measured side by side, a pair
# at a time, and every pair is printed); a 2,047-token prefill of bf16 and FP8;
# quick decode b=1 of FP8 and AWQ; with --kv also FP8 K/V against bf16 K/V at
# ctx 8192 and 32768.
# Logs land in OUT (default /tmp/djinn-bars); bars.log holds the lines to paste.
# usage (repo root): scripts/gpu_bars.sh [--pairs N] [--kv] [--out DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
PAIRS=5
KV=0
OUT=${OUT:-/tmp/djinn-bars}
while [ $# -gt 0 ]; do
    case "$1" in
        --pairs) PAIRS=$2; shift ;;
        --kv) KV=1 ;;
        --out) OUT=$2; shift ;;
        *) echo "usage: $0 [--pairs N] [--kv] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
. scripts/gpu_programs.sh
dj_gpu_programs bench_gpu make_random_checkpoint || exit 2
M=${DJ_BARS_MODELS:-/tmp/djinn-bars-models}
mkdir -p "$M"
log=$OUT/bars.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
say "== $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1), commit $(git rev-parse --short HEAD 2>/dev/null)"
# The three checkpoints at once (CPU and disk work).
for fmt in bf16 fp8 awq; do
    [ -s "$M/$fmt/model.safetensors" ] && continue
    case $fmt in
        bf16) a="" ;;
        fp8) a="--dtype fp8" ;;
        awq) a="--quant awq" ;;
    esac
    # shellcheck disable=SC2086
    "$B/make_random_checkpoint" llama3-8b "$M/$fmt" --seed 1 $a >"$OUT/ckpt_$fmt.log" 2>&1 &
done
wait
for fmt in bf16 fp8 awq; do
    [ -s "$M/$fmt/model.safetensors" ] || { say "checkpoint $fmt not written"; cat "$OUT/ckpt_$fmt.log"; exit 2; }
done
fail=0
bench() { # LOG ARGS...: one bench_gpu run, its log kept whole in OUT
    local l=$1
    shift
    "$B/bench_gpu" "$@" >>"$OUT/$l.log" 2>&1 || { say "bench_gpu $* failed"; fail=1; }
}
line() { grep -E "$2" "$OUT/$1.log" | tail -1 | awk '{for (i = 1; i <= NF; i++) if ($i == "s" || $i == "ms") {print $(i - 1); exit}}'; }
# Full runs (the figures of bench/RESULTS.md's tables).
for fmt in bf16 fp8 awq; do
    bench "full_$fmt" "$M/$fmt" --seed 1
    say "full $fmt: $(grep -E '^decode b=1 ctx 512|^prefill 2048 tokens \(s|^decode b=32' "$OUT/full_$fmt.log" | tr -s ' ' | tr '\n' ';')"
done
# Quick prefill pairs, bf16 then FP8, each the median of bench_gpu's 5 prefills.
ratios=""
for i in $(seq 1 "$PAIRS"); do
    for fmt in bf16 fp8; do
        : >"$OUT/pair_${fmt}_$i.log"
        bench "pair_${fmt}_$i" "$M/$fmt" --seed 1 --steps 8 --batch 2 --prefill 2048
    done
    b=$(line "pair_bf16_$i" '^prefill 2048 tokens \(s')
    f=$(line "pair_fp8_$i" '^prefill 2048 tokens \(s')
    r=$(awk -v b="$b" -v f="$f" 'BEGIN {if (f > 0) printf "%.3f", b / f}')
    ratios="$ratios $r"
    say "pair $i: prefill 2048 bf16 $b s, FP8 $f s: FP8 at ${r}x bf16's rate"
done
say "pairs' ratios:$ratios (median $(echo "$ratios" | tr ' ' '\n' | grep . | sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')x)"
# A prompt whose length is not a multiple of 4 (cuBLASLt's FP8 rows come in 4s).
for fmt in bf16 fp8; do
    bench "p2047_$fmt" "$M/$fmt" --seed 1 --steps 8 --batch 2 --prefill 2047
    say "prefill 2047 $fmt: $(line "p2047_$fmt" '^prefill 2047 tokens \(s') s"
done
# Quick decode b=1 (ctx 512, graphs) of the two quantized formats.
for fmt in fp8 awq; do
    bench "decode_$fmt" "$M/$fmt" --seed 1 --steps 48 --batch 2 --prefill 128
    say "decode b=1 $fmt: $(line "decode_$fmt" '^decode b=1 ctx 512') ms"
done
if [ $KV = 1 ]; then
    for c in "8192 16" "32768 4"; do
        set -- $c
        for kv in auto fp8; do
            bench "kv_${1}_$kv" "$M/bf16" --seed 1 --ctx "$1" --batch "$2" --steps 32 --kv-dtype "$kv"
            say "ctx $1 kv $kv: $(grep -E "^decode b=1 ctx|^decode b=$2 " "$OUT/kv_${1}_$kv.log" | tr -s ' ' | tr '\n' ';')"
        done
    done
fi
grep -hE "checks,|FAIL" "$OUT"/*.log | sort | uniq -c | tee -a "$log"
say "gpu_bars.sh: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
