#!/usr/bin/env bash
# count_road.sh: the road of one binary GENERATE and one HTTP chat completion through djinnd on
# the CPU, recorded by callgrind and counted by scripts/count_road.py (functions, files, layers).
# usage: [LIST=1] [KEEP=DIR] scripts/count_road.sh [BUILD_DIR]
#   LIST: name every function and every call up a layer; KEEP: copy the two callgrind dumps there;
#   BUILD_DIR: a -O0 -fno-inline build (default build-trace), made by
#     cmake -S . -B build-trace -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS="-O0 -fno-inline"
#     cmake --build build-trace --target djinnd
# Needs valgrind, curl and /usr/bin/python3 with msgpack.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$ROOT/build-trace}
TMP=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
# the demo model, once as it ships and once with a chat template (as tests/openai_client_test.sh)
mkdir -p "$TMP/store/demo-chat" && ln -s "$ROOT/models/demo" "$TMP/store/demo"
for f in config.json model.safetensors tokenizer.json generation_config.json; do
    ln -s "$ROOT/models/demo/$f" "$TMP/store/demo-chat/$f"
done
cat >"$TMP/store/demo-chat/tokenizer_config.json" <<'JSON'
{"bos_token": "<|bos|>", "eos_token": "<|eos|>",
 "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"}
JSON
PORT=$((20000 + RANDOM % 20000)) HPORT=$((40000 + RANDOM % 20000))
valgrind --tool=callgrind --instr-atstart=no --compress-strings=no --compress-pos=no \
    --callgrind-out-file="$TMP/cg.out" "$B/djinnd" --listen "127.0.0.1:$PORT" --http "127.0.0.1:$HPORT" \
    --models "$TMP/store" --threads 1 --vmu-gb 0.1 --swap-gb 0.01 --http-header-timeout-s 600 --http-body-timeout-s 600 --http-timeout-s 600 \
    2>"$TMP/log" &
PID=$!
for _ in $(seq 600); do
    curl -s "http://127.0.0.1:$HPORT/v1/models" >/dev/null 2>&1 && break
    sleep 0.2
done
toggle() { callgrind_control -i "$1" "$PID" >/dev/null; }
dump() { callgrind_control -d "$PID" >/dev/null; sleep 1; ls -t "$TMP"/cg.out.* | head -1; }

# 1. binary GENERATE: a session already open and the model warm, the prompt as text, 4 tokens sampled (temperature 0.8, as the chat request samples at its default 1)
PYTHONPATH="$ROOT/python" /usr/bin/python3 - "$PORT" "$PID" <<'EOF'
import subprocess, sys, djinn
port, pid = sys.argv[1], sys.argv[2]
c = djinn.connect("127.0.0.1:" + port, reconnect=False)
s = c.session("demo")
s.generate("Once upon a time", max_new_tokens=4, ignore_eos=True, stream=False, temperature=0.8, seed=1)  # warm: tokenizer, plans
subprocess.run(["callgrind_control", "-i", "on", pid], check=True, stdout=subprocess.DEVNULL)
g = s.generate(" there was", max_new_tokens=4, ignore_eos=True, stream=False, temperature=0.8, seed=1)
subprocess.run(["callgrind_control", "-i", "off", pid], check=True, stdout=subprocess.DEVNULL)
s.close()
c.close()
EOF
GEN=$(dump)

# 2. HTTP chat completion, streamed, 4 tokens, after one that warms the model and its plans (its
#    session, kept for reuse, holds the model; this prompt does not extend it, so a fresh one opens)
BODY='{"model":"demo-chat","messages":[{"role":"user","content":"Tell me a story."}],"max_tokens":4,"stream":true}'
curl -s "http://127.0.0.1:$HPORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$BODY" >/dev/null
toggle on
curl -s "http://127.0.0.1:$HPORT/v1/chat/completions" -H 'Content-Type: application/json' -d "$BODY" >"$TMP/chat.txt"
toggle off
CHAT=$(dump)
grep -q 'data: \[DONE\]' "$TMP/chat.txt" || { echo "the chat completion failed:" >&2; cat "$TMP/chat.txt" >&2; exit 1; }

[ -n "${KEEP:-}" ] && cp "$GEN" "$KEEP/generate.cg" && cp "$CHAT" "$KEEP/chat.cg"
echo "== binary GENERATE"
/usr/bin/python3 "$ROOT/scripts/count_road.py" "$GEN" ${LIST:+--list}
echo "== HTTP chat completion (streamed)"
/usr/bin/python3 "$ROOT/scripts/count_road.py" "$CHAT" ${LIST:+--list}
