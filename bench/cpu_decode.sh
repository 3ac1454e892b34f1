#!/usr/bin/env bash
# cpu_decode.sh: CPU decode speed of a TinyLlama-1.1B-shaped checkpoint with
# random bf16 weights (written once under build/bench-models/), measured with
# `djinn run` on every core. Prints a table and writes build/bench-cpu-decode.json.
# usage: bench/cpu_decode.sh [N_NEW=64] [PROMPT_TOKENS=32] [RUNS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
N_NEW=${1:-64}
PROMPT=${2:-32}
RUNS=${3:-3}
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" --target djinn make_random_checkpoint >/dev/null
DIR=build/bench-models/tinyllama-1.1b
[ -s "$DIR/model.safetensors" ] || ./build/make_random_checkpoint tinyllama-1.1b "$DIR" --seed 1
ids=$(seq 100 $((100 + PROMPT - 1)) | paste -sd, -)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
printf "%-5s %-14s %-14s %-10s\n" run prefill_tok_s decode_tok_s load_s
best=0
for r in $(seq 1 "$RUNS"); do
    line=$(./build/djinn run --model "$DIR" --tokens "$ids" -n "$N_NEW" --greedy --ignore-eos --print-tokens 2>&1 >/dev/null | grep "new tokens")
    pre=$(echo "$line" | sed -E 's/.*in [0-9.]+ s \(([0-9.]+) tok\/s\), [0-9]+ new.*/\1/')
    dec=$(echo "$line" | sed -E 's/.*new tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/')
    load=$(echo "$line" | sed -E 's/.*load ([0-9.]+) s.*/\1/')
    printf "%-5s %-14s %-14s %-10s\n" "$r" "$pre" "$dec" "$load"
    best=$(python3 -c "print(max($best, $dec))")
    last_pre=$pre
done
echo "best decode: $best tok/s (prompt $PROMPT tokens, $N_NEW new, TinyLlama-1.1B shape, bf16 weights, f32 compute)"
printf '{"model": "tinyllama-1.1b-random-bf16", "prompt_tokens": %s, "new_tokens": %s, "runs": %s, "best_decode_tok_s": %s, "last_prefill_tok_s": %s, "cores": %s}\n' \
    "$PROMPT" "$N_NEW" "$RUNS" "$best" "$last_pre" "$(nproc)" >build/bench-cpu-decode.json
