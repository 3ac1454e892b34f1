#!/usr/bin/env bash
# view_test.sh: the live VMU view's page script, run under Node against a
# djinnd --http of this build (tests/view_check.mjs) with a --token-file:
# the page needs no token, its script sends the one of #token=..., and what
# it draws matches GET /v1/djinn/stats. Skips (77) only when node is absent.
# usage: view_test.sh DJINND SOURCE_DIR
set -u
DJINND=$1
SRC=$2
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node is not installed"
    exit 77
fi
TMP=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
mkdir -p "$TMP/store"
ln -s "$SRC/models/demo" "$TMP/store/demo"
echo "view-token admin" >"$TMP/tokens"
"$DJINND" --models "$TMP/store" --listen 127.0.0.1:0 --http 127.0.0.1:0 --token-file "$TMP/tokens" \
    --port-file "$TMP/ports" --threads 1 --vmu-gb 256m >"$TMP/log" 2>&1 &
pid=$!
for _ in $(seq 400); do
    [ -f "$TMP/ports" ] && [ "$(wc -l <"$TMP/ports")" -ge 2 ] && break
    sleep 0.05
done
port=$(sed -n 2p "$TMP/ports" 2>/dev/null)
if [ -z "$port" ]; then
    echo "FAIL: djinnd did not start" >&2
    cat "$TMP/log" >&2
    exit 1
fi
# a finished generation: its session is kept (--http-reuse), so the view has one to show
curl -sf "http://127.0.0.1:$port/v1/completions" -H "Authorization: Bearer view-token" \
    -d '{"model": "demo", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}' >/dev/null || {
    echo "FAIL: the completion did not go through" >&2
    exit 1
}
node "$SRC/tests/view_check.mjs" "$port" view-token
