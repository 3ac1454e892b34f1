#!/usr/bin/env bash
# http_logprobs.sh: logprobs on the GPU - the same greedy and sampled
# requests with logprobs to a djinnd on --device cuda:0 and one on the CPU
# (the demo model, bf16 on the GPU): the picked tokens' and alternatives'
# logprobs within 0.05 (bf16 weights), the same greedy tokens, top ids in
# descending order. Exercises device_logprobs (engine.c): rows brought to the
# host after argmax / sample on the device, graphs recorded and replayed.
# usage (repo root, a build with -DDJ_CUDA=ON): tests/gpu/http_logprobs.sh BUILD_DIR [DEVICE]
set -uo pipefail
B=${1:-build-cuda}
D=${2:-cuda:0}
T=$(mktemp -d)
trap 'kill $(cat "$T"/pids) 2>/dev/null; rm -rf "$T"' EXIT
for dev in cpu "$D"; do
    "$B/djinnd" --models models --listen 127.0.0.1:0 --http 127.0.0.1:0 --device "$dev" \
        --port-file "$T/ports-${dev/:/}" >"$T/log-${dev/:/}" 2>&1 &
    echo $! >>"$T/pids"
done
for _ in $(seq 600); do
    [ -f "$T/ports-cpu" ] && [ -f "$T/ports-${D/:/}" ] && [ "$(wc -l <"$T/ports-${D/:/}")" -ge 2 ] && break
    sleep 0.1
done
/usr/bin/python3 - "$(sed -n 2p "$T/ports-cpu")" "$(sed -n 2p "$T/ports-${D/:/}")" <<'PY'
import json, sys, urllib.request
def ask(port, body):
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                               {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(r, timeout=120))["choices"][0]["logprobs"]
fail = 0
for body in ({"model": "demo", "prompt": "NAME\n  tar - ", "max_tokens": 24, "temperature": 0, "logprobs": 5},
             {"model": "demo", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0.8, "seed": 3,
              "logprobs": 5}):
    cpu, gpu = ask(sys.argv[1], body), ask(sys.argv[2], body)
    n = min(len(cpu["tokens"]), len(gpu["tokens"]))
    for i in range(n):
        if cpu["tokens"][i] != gpu["tokens"][i]:
            print(f"token {i}: cpu {cpu['tokens'][i]!r} gpu {gpu['tokens'][i]!r} (bf16 may diverge; stop here)")
            break
        d = abs(cpu["token_logprobs"][i] - gpu["token_logprobs"][i])
        v = list(gpu["top_logprobs"][i].values())
        if d > 0.05 or v != sorted(v, reverse=True):
            print(f"token {i}: logprob cpu {cpu['token_logprobs'][i]} gpu {gpu['token_logprobs'][i]}"); fail += 1
    print(f"{body['temperature']=}: {n} tokens compared")
print("http_logprobs:", "FAIL" if fail else "ok")
sys.exit(1 if fail else 0)
PY
