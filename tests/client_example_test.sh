#!/bin/bash
# client_example_test.sh: examples/client_generate (a program on libdjinn alone)
# against a real djinnd serving the demo model: 8 greedy tokens, twice the same text.
#   client_example_test.sh DJINND CLIENT_GENERATE MODELS_DIR
set -u
djinnd=$1 prog=$2 models=$3
dir=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
"$djinnd" --listen "unix:$dir/sock" --port-file "$dir/port" --models "$models" --vmu-gb 256m --threads 1 \
    2>"$dir/err" &
pid=$!
for _ in $(seq 1 600); do # the port file (empty for a unix socket) says it listens (up to 60 s under ASan)
    [ -e "$dir/port" ] && break
    kill -0 "$pid" 2>/dev/null || { echo "FAIL: djinnd exited:"; cat "$dir/err"; exit 1; }
    sleep 0.1
done
[ -e "$dir/port" ] || { echo "FAIL: djinnd did not start"; cat "$dir/err"; exit 1; }
"$prog" "unix:$dir/sock" demo "Once upon a time" 8 >"$dir/out1" || { echo "FAIL: client_generate"; cat "$dir/out1"; exit 1; }
"$prog" "unix:$dir/sock" demo "Once upon a time" 8 >"$dir/out2" || { echo "FAIL: client_generate (2)"; exit 1; }
cat "$dir/out1"
grep -q ', 8 generated, length\]$' "$dir/out1" ||
    { echo "FAIL: not 8 tokens to the length limit"; exit 1; }
cmp -s "$dir/out1" "$dir/out2" || { echo "FAIL: greedy runs differ"; diff "$dir/out1" "$dir/out2"; exit 1; }
# Bad input gets a clear error and a non-zero exit.
if "$prog" "unix:$dir/sock" no_such_model "x" 2>"$dir/bad"; then echo "FAIL: unknown model accepted"; exit 1; fi
grep -q "client_generate: " "$dir/bad" || { echo "FAIL: no error message"; cat "$dir/bad"; exit 1; }
echo "ok"
