#!/usr/bin/env bash
# fairness.sh: bench_fairness against a djinnd started with each
# --prefill-chunk (0 = whole prompts, 256, 64) and --mixed-steps (off: chunks
# take their own steps; on: they share the decode steps), twice each; the
# demo model on the CPU with one engine thread. Run from a release build in
# build/.
set -u
cd "$(dirname "$0")/.."
for cfg in "0 off" "256 off" "64 off" "256 on" "64 on"; do
    set -- $cfg
    chunk=$1
    mixed=$2
    for rep in 1 2; do
        pf=$(mktemp -u /tmp/djinn_fairness_port.XXXXXX)
        ./build/djinnd --listen 127.0.0.1:0 --port-file "$pf" --models models --threads 1 \
            --prefill-chunk "$chunk" --mixed-steps "$mixed" >/dev/null 2>&1 &
        pid=$!
        for _ in $(seq 1 200); do [ -s "$pf" ] && break; sleep 0.05; done
        echo -n "chunk $chunk mixed $mixed: "
        ./build/bench_fairness "127.0.0.1:$(cat "$pf")" demo 480
        kill "$pid"
        wait "$pid" 2>/dev/null
        rm -f "$pf"
    done
done
