#!/usr/bin/env bash
# openai_client_test.sh: runs tests/openai_client.mjs (the official `openai`
# npm package, which scripts/setup.sh installs into third_party/npm) against a
# djinnd --http of this build serving the demo model. Skips (77) only when
# node is absent; a missing package is a failure that says how to get it.
# usage: openai_client_test.sh DJINND SOURCE_DIR
set -u
DJINND=$1
SRC=$2
PKG=$SRC/third_party/npm/node_modules/openai
if ! command -v node >/dev/null 2>&1; then
    echo "SKIP: node is not installed: the openai npm client test needs Node.js (scripts/setup.sh installs npm)"
    exit 77
fi
if [ ! -f "$PKG/index.mjs" ]; then
    echo "FAIL: the openai npm package is not in $PKG: run scripts/setup.sh" >&2
    exit 1
fi
TMP=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
# the store: demo, and demo-chat (the same weights with a chat template)
mkdir -p "$TMP/store/demo-chat"
ln -s "$SRC/models/demo" "$TMP/store/demo"
for f in config.json model.safetensors tokenizer.json generation_config.json; do
    ln -s "$SRC/models/demo/$f" "$TMP/store/demo-chat/$f"
done
cat >"$TMP/store/demo-chat/tokenizer_config.json" <<'JSON'
{"bos_token": "<|bos|>", "eos_token": "<|eos|>",
 "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"}
JSON
echo "client-token" >"$TMP/tokens"
"$DJINND" --models "$TMP/store" --listen 127.0.0.1:0 --http 127.0.0.1:0 --token-file "$TMP/tokens" \
    --port-file "$TMP/ports" >"$TMP/log" 2>&1 &
pid=$!
for _ in $(seq 200); do
    [ -f "$TMP/ports" ] && [ "$(wc -l <"$TMP/ports")" -ge 2 ] && break
    sleep 0.05
done
port=$(sed -n 2p "$TMP/ports" 2>/dev/null)
if [ -z "$port" ]; then
    echo "FAIL: djinnd --http did not start:" >&2
    cat "$TMP/log" >&2
    exit 1
fi
node "$SRC/tests/openai_client.mjs" "$PKG" "http://127.0.0.1:$port/v1" client-token
rc=$?
[ $rc -ne 0 ] && { echo "djinnd's log:" >&2; tail -20 "$TMP/log" >&2; }
exit $rc
