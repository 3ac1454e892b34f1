#!/usr/bin/env bash
# gpu_http.sh: issue 13's HTTP benchmarks on the GPU machine, one command -
# the engine prefix cache (bench/http_prefix.py: conversations sharing a
# 2000-token system prompt, TTFT with --prefix-cache on and off, against a
# fresh 100-token prompt), 64 streaming clients at once
# (bench/http_clients.py: TTFT p50/p99, aggregate tok/s; then 64 clients
# sending short requests back to back: requests/s) and what HTTP adds per
# token against the binary protocol (bench/bench_http), on the Llama-3-8B
# shape (random bf16 weights; the demo model's tokenizer.json beside them so
# that streamed tokens have text: prompts are ids below 4000).
# Programs: scripts/gpu_programs.sh ($DJ_BIN, else .carry/gpu.tar.xz from
# scripts/gpu_bundle.sh, else built here). Logs land in OUT (default /tmp/djinn-gpu-out).
# A dry run on the CPU with the demo model: DJ_BIN=build DJ_BENCH_MODEL=$PWD/models/demo
# SYS_TOKENS=300 scripts/gpu_http.sh --device cpu
# usage (repo root): scripts/gpu_http.sh [--device cuda:0] [--out DIR] [--preset llama3-8b]
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=cuda:0
OUT=${OUT:-/tmp/djinn-gpu-out}
PRESET=llama3-8b
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift ;;
        --out) OUT=$2; shift ;;
        --preset) PRESET=$2; shift ;;
        *) echo "usage: $0 [--device D] [--out DIR] [--preset P]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
. scripts/gpu_programs.sh
dj_gpu_programs djinnd bench_http make_random_checkpoint || exit 2
M=${DJ_BENCH_MODEL:-/tmp/djinn-$PRESET}
[ -s "$M/model.safetensors" ] || "$B/make_random_checkpoint" "$PRESET" "$M" --seed 1 || exit 2
STORE=$(mktemp -d)
mkdir -p "$STORE/m"
ln -s "$M/config.json" "$M/model.safetensors" "$STORE/m/"
ln -s "$PWD/models/demo/tokenizer.json" "$STORE/m/"
PORT=18480
BPORT=18479 # the binary protocol's, for bench_http
fail=0
# GET PATH on the daemon (python3: the GPU machine may have no curl)
fetch() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "http://127.0.0.1:$PORT$1"; }
# one daemon per setting; --http-reuse 0: only the engine's cache reuses KV
run_daemon() { # $1: --prefix-cache on|off, $2: log name
    "$B/djinnd" --models "$STORE" --device "$DEVICE" --listen 127.0.0.1:$BPORT --http 127.0.0.1:$PORT --http-reuse 0 \
        --http-max-connections 80 --http-max-per-address 80 --max-running 64 --prefix-cache "$1" --local-admin >"$OUT/djinnd_$2.log" 2>&1 &
    DPID=$!
    for _ in $(seq 1 600); do
        fetch "/v1/models" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "djinnd did not come up (see $OUT/djinnd_$2.log)"; kill "$DPID" 2>/dev/null; return 1
}
stop_daemon() { kill "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; }
for pc in on off; do
    run_daemon "$pc" "prefix_$pc" || { fail=1; continue; }
    python3 bench/http_prefix.py "http://127.0.0.1:$PORT" m --system-tokens "${SYS_TOKENS:-2000}" --turns 10 --user-tokens 40 \
        --max-tokens 16 --runs 5 >"$OUT/http_prefix_$pc.log" 2>&1 || fail=1
    echo "== prefix cache $pc"; tail -14 "$OUT/http_prefix_$pc.log"
    if [ "$pc" = on ]; then
        fetch "/v1/djinn/stats" >"$OUT/stats_prefix_on.json" || true
        for r in 1 2; do
            python3 bench/http_clients.py "http://127.0.0.1:$PORT" m --clients 64 --prompt-tokens 128 \
                --max-tokens 128 --rounds 2 >>"$OUT/http_clients.log" 2>&1 || fail=1
        done
        python3 bench/http_clients.py "http://127.0.0.1:$PORT" m --clients 1 --prompt-tokens 128 --max-tokens 128 \
            --rounds 2 >>"$OUT/http_clients.log" 2>&1 || fail=1
        # short requests, 64 clients each sending one after another for 20 s
        python3 bench/http_clients.py "http://127.0.0.1:$PORT" m --clients 64 --max-tokens 16 --duration 20 \
            >>"$OUT/http_clients.log" 2>&1 || fail=1
        echo "== 64 streaming clients (then 1 for scale; then 64 closed-loop)"; cat "$OUT/http_clients.log"
        # what HTTP adds per token: one greedy 256-token generation, 3 in a row, over the binary
        # protocol, streamed over HTTP and whole over HTTP, in turn, 3 times
        if [ -x "$B/bench_http" ]; then
            for r in 1 2 3; do
                for mode in binary http-stream http; do
                    "$B/bench_http" 127.0.0.1:$BPORT $PORT $mode 3 256 m >>"$OUT/http_overhead.log" 2>&1 || fail=1
                done
            done
            echo "== HTTP against the binary protocol"; cat "$OUT/http_overhead.log"
        fi
    fi
    stop_daemon
done
rm -rf "$STORE"
exit $fail
