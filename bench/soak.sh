#!/usr/bin/env bash
# soak.sh: djinnd (CPU engine, the demo model, a token file, --http) for
# SECONDS (default 600) with only honest clients (the quiet run), then a fresh
# one for SECONDS more with hostile clients beside them (issue 9's attacks and
# issue 43's: 1 MB prompts from a batch token, slowloris HTTP, silent binary
# connections, unread replies, a token's connection/session flood, oversized
# JSON bodies). bench_soak prints honest p50/p99 latency and the daemon's RSS
# per interval; at the end the two runs side by side: honest p99 hostile/quiet
# and peak RSS. Run from a release build in build/:
#   bench/soak.sh [SECONDS] [HONEST] [HOSTILE] [THREADS]    (total time: 2 x SECONDS)
set -u
cd "$(dirname "$0")/.."
secs=${1:-600}
honest=${2:-4}
hostile=${3:-4}
threads=${4:-1}
dir=$(mktemp -d /tmp/djinn_soak.XXXXXX)
trap '[ -n "${SOAK_KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"' EXIT  # SOAK_KEEP=1: keep the daemons' logs
printf 'soak-honest-token qos=interactive,batch\nsoak-batch-token qos=batch\n' > "$dir/tokens"

# run NAME HOSTILE: a fresh djinnd, bench_soak against it; its summary line in $dir/NAME.sum
run() {
    rm -f "$dir/port"
    ./build/djinnd --listen 127.0.0.1:0 --port-file "$dir/port" --models models --threads "$threads" \
        --token-file "$dir/tokens" --http 127.0.0.1:0 --hello-timeout-ms 1000 --idle-timeout-ms 5000 \
        >"$dir/log_$1" 2>&1 &
    local pid=$!
    for _ in $(seq 1 200); do [ -s "$dir/port" ] && break; sleep 0.05; done
    if [ ! -s "$dir/port" ]; then
        echo "soak.sh: djinnd did not start:" >&2
        cat "$dir/log_$1" >&2
        kill "$pid" 2>/dev/null
        return 1
    fi
    { read -r bport; read -r hport; } < "$dir/port"
    echo "== $1 run: $secs s, $honest honest clients (+1 HTTP), $2 hostile; load $(cut -d' ' -f1-3 /proc/loadavg)"
    ./build/bench_soak "127.0.0.1:$bport" soak-honest-token "$pid" "$secs" "$honest" "$2" demo "$hport" \
        soak-batch-token | tee "$dir/out_$1"
    local rc=${PIPESTATUS[0]}
    kill "$pid"
    wait "$pid" 2>/dev/null
    grep '^summary:' "$dir/out_$1" > "$dir/$1.sum"
    return "$rc"
}

run quiet 0 || { echo "soak.sh: the quiet run failed ($?)" >&2; exit 1; }
run hostile "$hostile" || { echo "soak.sh: the hostile run failed ($?)" >&2; exit 1; }
q99=$(sed -E 's/^summary: honest [^;]* p99 ([0-9.]+) ms;.*/\1/' "$dir/quiet.sum")
h99=$(sed -E 's/^summary: honest [^;]* p99 ([0-9.]+) ms;.*/\1/' "$dir/hostile.sum")
qh99=$(sed -E 's/.*HTTP [^;]* p99 ([0-9.]+) ms;.*/\1/' "$dir/quiet.sum")
hh99=$(sed -E 's/.*HTTP [^;]* p99 ([0-9.]+) ms;.*/\1/' "$dir/hostile.sum")
echo "== quiet:   $(cut -d' ' -f2- "$dir/quiet.sum")"
echo "== hostile: $(cut -d' ' -f2- "$dir/hostile.sum")"
awk -v q="$q99" -v h="$h99" -v qh="$qh99" -v hh="$hh99" 'BEGIN {
    printf "honest p99 hostile/quiet: binary %.2f ms / %.2f ms = %.2fx, HTTP %.2f ms / %.2f ms = %.2fx (bar: 2x)\n",
           h, q, (q > 0 ? h / q : 0), hh, qh, (qh > 0 ? hh / qh : 0) }'
