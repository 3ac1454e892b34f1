#!/usr/bin/env bash
# gpu_ab.sh: two builds of Djinn side by side on one GPU machine - bench_gpu and
# bench_serve (djinnd with 1, 8 and 32 clients) of bundle A, then of B, alternating,
# on one Llama-3-8B-shape checkpoint (random bf16 weights, make_random_checkpoint --seed 1).
# A bundle is a tar.xz of {bin,lib} as scripts/gpu_bundle.sh packs it, holding at least
# bench_gpu, bench_serve and make_random_checkpoint. Logs land in OUT; ab.log has the lines to paste.
# usage (repo root): scripts/gpu_ab.sh A.tar.xz B.tar.xz [--rounds N] [--tokens T] [--out DIR]
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: $0 A.tar.xz B.tar.xz [--rounds N] [--tokens T] [--out DIR]" >&2; exit 2; }
A=$1 B=$2
shift 2
ROUNDS=1 TOKENS=256
OUT=${OUT:-/tmp/djinn-ab}
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS=$2; shift ;;
        --tokens) TOKENS=$2; shift ;;
        --out) OUT=$2; shift ;;
        *) echo "usage: $0 A.tar.xz B.tar.xz [--rounds N] [--tokens T] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
W=$(mktemp -d)
for s in A B; do
    mkdir -p "$W/$s"
    tar xJf "${!s}" -C "$W/$s" || { echo "gpu_ab: cannot unpack ${!s}" >&2; exit 2; }
done
log=$OUT/ab.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
say "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); A=$A B=$B"
M=${DJ_AB_STORE:-/tmp/djinn-ab-store}
if [ ! -s "$M/llama3-8b/model.safetensors" ]; then
    LD_LIBRARY_PATH=$W/A/lib "$W/A/bin/make_random_checkpoint" llama3-8b "$M/llama3-8b" --seed 1 >"$OUT/ckpt.log" 2>&1 ||
        { cat "$OUT/ckpt.log"; exit 2; }
fi
fail=0
run() { # SIDE NAME ARGS...: one program of one bundle, its log kept whole
    local s=$1 p=$2
    shift 2
    LD_LIBRARY_PATH=$W/$s/lib "$W/$s/bin/$p" "$@" >>"$OUT/${p}_$s.log" 2>&1 || { say "$s: $p $* failed"; fail=1; }
}
for r in $(seq 1 "$ROUNDS"); do
    for s in A B; do
        echo "== round $r" >>"$OUT/bench_gpu_$s.log"
        run $s bench_gpu "$M/llama3-8b" --seed 1
        say "round $r $s bench_gpu: $(sed -n "/== round $r/,\$p" "$OUT/bench_gpu_$s.log" |
            grep -E '^decode b=1 ctx 512|^prefill 2048 tokens \(s|^decode b=32' | tr -s ' ' | tr '\n' ';')"
    done
    for s in A B; do
        echo "== round $r" >>"$OUT/bench_serve_$s.log"
        run $s bench_serve "$M" llama3-8b cuda:0 40 "$TOKENS" 1,8,32
        say "round $r $s bench_serve:"
        sed -n "/== round $r/,\$p" "$OUT/bench_serve_$s.log" | grep -E '^\| [0-9]+ \|' | tee -a "$log"
    done
done
rm -rf "$W"
exit $fail
