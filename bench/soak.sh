#!/usr/bin/env bash
# soak.sh: djinnd (CPU engine, the demo model, a token file) under honest
# and hostile clients for SECONDS (default 600): bench_soak prints honest
# p50/p99 latency and the daemon's RSS per interval. Run from a release
# build in build/: bench/soak.sh [SECONDS] [HONEST] [HOSTILE] [THREADS]
set -u
cd "$(dirname "$0")/.."
secs=${1:-600}
honest=${2:-4}
hostile=${3:-4}
threads=${4:-1}
dir=$(mktemp -d /tmp/djinn_soak.XXXXXX)
echo "soak-honest-token qos=interactive,batch" > "$dir/tokens"
./build/djinnd --listen 127.0.0.1:0 --port-file "$dir/port" --models models --threads "$threads" \
    --token-file "$dir/tokens" --hello-timeout-ms 1000 --idle-timeout-ms 5000 >"$dir/log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do [ -s "$dir/port" ] && break; sleep 0.05; done
if [ ! -s "$dir/port" ]; then
    echo "soak.sh: djinnd did not start:" >&2
    cat "$dir/log" >&2
    exit 1
fi
./build/bench_soak "127.0.0.1:$(cat "$dir/port")" soak-honest-token "$pid" "$secs" "$honest" "$hostile" demo
rc=$?
kill "$pid"
wait "$pid" 2>/dev/null
rm -rf "$dir"
exit $rc
