#!/usr/bin/env bash
# cli_test.sh: the `djinn` command as scripts use it - exact output forms,
# greedy tokens equal to transformers' on every fixture, and clear errors
# (non-zero exit, a message, never a crash) on bad input.
# usage: cli_test.sh DJINN FIXTURES_DIR THIRD_PARTY_DIR
set -u
DJINN=$1
FX=$2
TP=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# expect_error NAME PATTERN CMD...: exit status 1 or 2 (not a signal), and
# stderr mentions PATTERN.
expect_error() {
    local name=$1 pat=$2
    shift 2
    "$@" >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
        bad "$name: exit status $rc (want 1 or 2)"; cat "$TMP/err" >&2; return
    fi
    if ! grep -qi -- "$pat" "$TMP/err"; then
        bad "$name: stderr lacks '$pat':"; cat "$TMP/err" >&2; return
    fi
    ok
}

json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"; }

# 1. greedy tokens of every fixture, through the exact scripted form
for m in llama2 llama3 tinyllama mistral qwen2; do
    ref="$FX/models/$m/reference.json"
    prompt=$(json "$ref" "','.join(map(str, d['prompt_ids']))")
    want=$(json "$ref" "' '.join(map(str, d['greedy']))")
    got=$("$DJINN" run --model "$FX/models/$m" --tokens "$prompt" -n 24 --greedy --print-tokens --ignore-eos 2>"$TMP/err")
    if [ "$got" = "$want" ]; then ok; else bad "$m: greedy tokens '$got' != reference '$want'"; cat "$TMP/err" >&2; fi
done

# 2. info
out=$("$DJINN" info --model "$FX/models/qwen2" --ctx 128)
if echo "$out" | grep -q "Qwen2ForCausalLM" && echo "$out" | grep -q "stack peak"; then ok; else bad "info: $out"; fi
# longrope: the default context stays on the short factors, a longer --ctx takes the long ones
out=$("$DJINN" info --model "$FX/models/phi3_longctx")
if echo "$out" | grep -q "longrope, short factors for a context of 32 "; then ok; else bad "info longrope default: $out"; fi
out=$("$DJINN" info --model "$FX/models/phi3_longctx" --ctx 64)
if echo "$out" | grep -q "longrope, long factors for a context of 64 "; then ok; else bad "info longrope --ctx 64: $out"; fi

# 3. tokenizer commands on a real tokenizer (Llama 3), against tokenizers' ids
if [ -s "$TP/tokenizers/llama3/tokenizer.json" ]; then
    want=$(python3 -c "
import json; d=json.load(open('$FX/tokenizer/refs_llama3.json'))
c=[c for c in d['cases'] if c['text']=='Hello, world!'][0]; print(' '.join(map(str,c['ids'])))")
    got=$("$DJINN" tokenize --model "$TP/tokenizers/llama3" --text "Hello, world!")
    if [ "$got" = "$want" ]; then ok; else bad "tokenize: '$got' != '$want'"; fi
    want_sp=$(python3 -c "
import json; d=json.load(open('$FX/tokenizer/refs_llama2.json'))
c=[c for c in d['cases'] if c['text']=='Hello, world!'][0]; print(' '.join(map(str,c['ids_special'])))")
    got=$("$DJINN" tokenize --model "$TP/tokenizers/llama2" --text "Hello, world!" --add-special)
    if [ "$got" = "$want_sp" ] && [ "${got%% *}" = "1" ]; then ok; else bad "tokenize --add-special (llama2, BOS 1): '$got' want '$want_sp'"; fi
    ids=$(echo "$want" | tr ' ' ',')
    got=$("$DJINN" detokenize --model "$TP/tokenizers/llama3" --tokens "$ids")
    if [ "$got" = "Hello, world!" ]; then ok; else bad "detokenize: '$got'"; fi
    expect_error "detokenize bad id" "range" "$DJINN" detokenize --model "$TP/tokenizers/llama3" --tokens 999999999
else
    bad "third_party/tokenizers/llama3 missing: run scripts/setup.sh"
fi

# 4. --prompt end to end: a tiny byte-level tokenizer beside the llama2 weights
mkdir -p "$TMP/withtok"
cp "$FX/models/llama2/config.json" "$FX/models/llama2/model.safetensors" "$TMP/withtok/"
python3 - "$TMP/withtok/tokenizer.json" <<'PY'
import json, sys
# GPT-2 byte alphabet: printable bytes map to themselves, the rest to 256+i.
bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
alpha = {b: chr(c) for b, c in zip(bs, cs)}
vocab = {"<s>": 0, "</s>": 1}
for b in range(256):
    vocab[alpha[b]] = len(vocab)
merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("\u0120", "w")]
for a, b in merges:
    vocab[a + b] = len(vocab)
while len(vocab) < 384:  # the model's vocabulary: every id it can emit has text
    vocab["tok%d" % len(vocab)] = len(vocab)
tok = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [{"id": 0, "content": "<s>", "single_word": False, "lstrip": False, "rstrip": False,
                         "normalized": False, "special": True},
                        {"id": 1, "content": "</s>", "single_word": False, "lstrip": False, "rstrip": False,
                         "normalized": False, "special": True}],
       "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "post_processor": {"type": "TemplateProcessing",
                          "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                          "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                          "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                 "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}
json.dump(tok, open(sys.argv[1], "w"))
PY
ids=$("$DJINN" tokenize --model "$TMP/withtok" --text "hello world" --add-special)
# <s>=0, byte b -> 2+b, merges: hello=261, "\u0120w"=262; then o r l d as bytes
if [ "$ids" = "0 261 262 113 116 110 102" ]; then ok; else bad "tokenize tiny: '$ids'"; fi
viatok=$("$DJINN" run --model "$TMP/withtok" --tokens "$(echo "$ids" | tr ' ' ',')" -n 12 --greedy --print-tokens --ignore-eos 2>/dev/null)
viaprompt=$("$DJINN" run --model "$TMP/withtok" --prompt "hello world" -n 12 --greedy --print-tokens --ignore-eos 2>/dev/null)
if [ -n "$viatok" ] && [ "$viatok" = "$viaprompt" ]; then ok; else bad "--prompt '$viaprompt' != --tokens '$viatok'"; fi
text=$("$DJINN" run --model "$TMP/withtok" --prompt "hello world" -n 12 --greedy --ignore-eos 2>/dev/null)
want=$("$DJINN" detokenize --model "$TMP/withtok" --tokens "$(echo "$viatok" | tr ' ' ',')")
if [ "$text" = "$want" ]; then ok; else bad "streamed text '$text' != detokenized '$want'"; fi
s1=$("$DJINN" run --model "$TMP/withtok" --prompt "hello" -n 16 --temp 0.9 --top-k 50 --top-p 0.9 --seed 7 --print-tokens --ignore-eos 2>/dev/null)
s2=$("$DJINN" run --model "$TMP/withtok" --prompt "hello" -n 16 --temp 0.9 --top-k 50 --top-p 0.9 --seed 7 --print-tokens --ignore-eos 2>/dev/null)
if [ -n "$s1" ] && [ "$s1" = "$s2" ]; then ok; else bad "seeded sampling not reproducible: '$s1' vs '$s2'"; fi

# 5. bad input: a clear message, exit 1/2, no crash
M="$FX/models/llama2"
expect_error "no such model" "config.json" "$DJINN" run --model "$TMP/nope" --tokens 1,2 -n 2 --greedy
expect_error "bad token list" "token list" "$DJINN" run --model "$M" --tokens 1,x,3 -n 2 --greedy
expect_error "empty token list" "token list" "$DJINN" run --model "$M" --tokens "" -n 2 --greedy
expect_error "token outside vocab" "vocabulary" "$DJINN" run --model "$M" --tokens 1,99999 -n 2 --greedy
expect_error "empty prompt" "empty" "$DJINN" run --model "$TMP/withtok" --prompt "" -n 2
expect_error "no tokenizer" "tokenizer.json" "$DJINN" run --model "$M" --prompt "hi" -n 2
expect_error "unknown option" "unknown option" "$DJINN" run --model "$M" --frobnicate
expect_error "unknown command" "unknown command" "$DJINN" fly
expect_error "bad temperature" "temperature" "$DJINN" run --model "$M" --tokens 1 --temp -1
expect_error "bad top-p" "top-p" "$DJINN" run --model "$M" --tokens 1 --top-p 1.5
expect_error "missing value" "needs a value" "$DJINN" run --model
expect_error "tiny vmu" "needs" "$DJINN" run --model "$M" --tokens 1,2 -n 2 --greedy --vmu-gb 65536b
expect_error "bad vmu size" "size" "$DJINN" run --model "$M" --tokens 1,2 -n 2 --greedy --vmu-gb lots
expect_error "context overflow" "context" "$DJINN" run --model "$M" --tokens 1,2,3 -n 300 --greedy --ctx 16
mkdir -p "$TMP/trunc" && cp "$M/config.json" "$TMP/trunc/"
head -c 3000 "$M/model.safetensors" >"$TMP/trunc/model.safetensors"
expect_error "truncated safetensors" "model.safetensors" "$DJINN" run --model "$TMP/trunc" --tokens 1,2 -n 2 --greedy
mkdir -p "$TMP/badcfg" && cp "$M/model.safetensors" "$TMP/badcfg/" && echo '{"architectures": ["LlamaForCausalLM"], "hidden_size": "big"' >"$TMP/badcfg/config.json"
expect_error "malformed config" "config" "$DJINN" run --model "$TMP/badcfg" --tokens 1,2 -n 2 --greedy
mkdir -p "$TMP/arch" && cp "$M/model.safetensors" "$TMP/arch/" && sed 's/LlamaForCausalLM/GPTNeoXForCausalLM/' "$M/config.json" >"$TMP/arch/config.json"
expect_error "unknown architecture" "GPTNeoXForCausalLM" "$DJINN" run --model "$TMP/arch" --tokens 1,2 -n 2 --greedy
mkdir -p "$TMP/badtok" && cp "$M/config.json" "$M/model.safetensors" "$TMP/badtok/" && echo '{"model": {"type": "BPE", "vocab": ' >"$TMP/badtok/tokenizer.json"
expect_error "malformed tokenizer.json" "tokenizer" "$DJINN" run --model "$TMP/badtok" --prompt "hi" -n 2
mkdir -p "$TMP/missing" && cp "$M/config.json" "$TMP/missing/" && python3 - "$M/model.safetensors" "$TMP/missing/model.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
hdr = json.loads(raw[8:8 + n])
del hdr["model.norm.weight"]
h = json.dumps(hdr).encode()
open(sys.argv[2], "wb").write(struct.pack("<Q", len(h)) + h + raw[8 + n:])
PY
expect_error "missing tensor" "model.norm.weight" "$DJINN" run --model "$TMP/missing" --tokens 1,2 -n 2 --greedy

# the daemon's counts are checked before it starts
expect_error "serve: negative --prefill-chunk" "prefill-chunk" "$DJINN" serve --prefill-chunk -3
expect_error "serve: --max-running 0" "max-running" "$DJINN" serve --max-running 0

# DJINN_PROFILE: a per-op table on stderr, one q_proj call per layer and
# step (llama3 fixture: 2 layers; a 3-token prompt and 4 new tokens = 4 steps)
DJINN_PROFILE=1 "$DJINN" run --model "$FX/models/llama3" --tokens 1,2,3 -n 4 --greedy --ignore-eos \
    >/dev/null 2>"$TMP/prof"
calls=$(awk '$2 == "q_proj" { print $1 ":" $3 }' "$TMP/prof" | sort | tr '\n' ' ')
if grep -q "DJINN_PROFILE (cpu backend" "$TMP/prof" && [ "$calls" = "decode:6 prefill:2 " ]; then ok; else
    bad "DJINN_PROFILE: want q_proj calls decode:6 prefill:2, got '$calls'"; cat "$TMP/prof" >&2; fi

# EOS ids come from generation_config.json (a list) before config.json: a model
# whose greedy continuation's third token is an EOS stops after two tokens,
# in `djinn run` and through djinnd with `djinn generate`; --ignore-eos runs on
# the daemon binds its socket before it listens: wait until a connect works (10 s)
wait_sock() {
    for _ in $(seq 1 500); do
        [ -S "$1" ] && python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$1" \
            2>/dev/null && return 0
        sleep 0.02
    done
    return 1
}
ref="$FX/models/llama2/reference.json"
prompt=$(json "$ref" "','.join(map(str, d['prompt_ids']))")
want=$(json "$ref" "' '.join(map(str, d['greedy'][:2]))")
eos=$(json "$ref" "d['greedy'][2]")
mkdir -p "$TMP/store/eos"
ln -s "$FX/models/llama2/config.json" "$FX/models/llama2/model.safetensors" "$TMP/store/eos/"
echo "{\"eos_token_id\": [99999, $eos]}" >"$TMP/store/eos/generation_config.json"
got=$("$DJINN" run --model "$TMP/store/eos" --tokens "$prompt" -n 24 --greedy --print-tokens 2>"$TMP/err")
if [ "$got" = "$want" ] && grep -q "; stop" "$TMP/err"; then ok; else bad "run: EOS from generation_config.json: got '$got'"; fi
"$DJINN" serve --listen "unix:$TMP/sock" --models "$TMP/store" --threads 1 --vmu-gb 256m 2>"$TMP/serve.err" &
serve_pid=$!
wait_sock "$TMP/sock"
got=$("$DJINN" generate --server "unix:$TMP/sock" --model eos --tokens "$prompt" -n 24 --greedy --print-tokens 2>"$TMP/err")
if [ "$got" = "$want" ] && grep -q "(stop)" "$TMP/err"; then ok; else bad "generate: EOS: got '$got'"; cat "$TMP/err" >&2; fi
# every run flag with a remote meaning: the same tokens as `djinn run` with them
flags=(--tokens "$prompt" -n 12 --ctx 64 --ignore-eos --temp 0.9 --top-k 20 --top-p 0.95 --min-p 0 --seed 7
       --repeat-penalty 1 --frequency-penalty 0 --presence-penalty 0 --print-tokens)
want=$("$DJINN" run --model "$TMP/store/eos" "${flags[@]}" 2>/dev/null)
got=$("$DJINN" generate --server "unix:$TMP/sock" --model eos "${flags[@]}" --stats 2>"$TMP/err")
if [ -n "$want" ] && [ "$got" = "$want" ] && grep -q "generation steps" "$TMP/err"; then ok; else
    bad "generate with run's flags: got '$got', run gave '$want'"; cat "$TMP/err" >&2; fi
got=$("$DJINN" generate --server "unix:$TMP/sock" --model eos --tokens "$prompt" -n 24 --greedy --ignore-eos \
    --stop-ids "$(json "$ref" "d['greedy'][3]")" --print-tokens 2>"$TMP/err")
if [ "$got" = "$(json "$ref" "' '.join(map(str, d['greedy'][:3]))")" ]; then ok; else bad "generate --stop-ids: got '$got'"; fi
expect_error "generate: --ctx over the model" "exceeds" "$DJINN" generate --server "unix:$TMP/sock" --model eos \
    --tokens 1,2 --ctx 100000
kill "$serve_pid"; wait "$serve_pid" 2>/dev/null
expect_error "generate: --device is the server's" "server" "$DJINN" generate --server unix:/nonexistent --device cpu
expect_error "generate: --min-p 2" "min-p" "$DJINN" generate --server unix:/nonexistent --min-p 2
expect_error "generate: --deterministic is the server's" "server" "$DJINN" generate --server unix:/nonexistent --deterministic
expect_error "generate: --session without --secret" "go together" "$DJINN" generate --server unix:/nonexistent --session 5 --tokens 1
expect_error "generate: --secret -1" "not a session secret" "$DJINN" generate --server unix:/nonexistent --session 5 --secret -1 --tokens 1
expect_error "generate: neither --model nor --session" "--session ID" "$DJINN" generate --server unix:/nonexistent --tokens 1
expect_error "serve --deterministic maybe" "want on or off" "$DJINN" serve --deterministic maybe
# the CPU engine is batch-invariant anyway: --deterministic picks the same tokens
ref="$FX/models/llama3/reference.json"
prompt=$(json "$ref" "','.join(map(str, d['prompt_ids']))")
a=$("$DJINN" run --model "$FX/models/llama3" --tokens "$prompt" -n 12 --temp 0.9 --seed 5 --print-tokens --ignore-eos 2>/dev/null)
b=$("$DJINN" run --model "$FX/models/llama3" --tokens "$prompt" -n 12 --temp 0.9 --seed 5 --print-tokens --ignore-eos \
    --deterministic 2>/dev/null)
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok; else bad "run --deterministic: '$b' != '$a'"; fi
expect_error "run: --repeat-penalty -1" "repeat-penalty" "$DJINN" run --tokens 1 --repeat-penalty -1
# --kv-dtype: fp8 K/V pages generate the asked-for tokens and info says what a token costs; a dtype the CPU
# engine does not store K/V in is refused naming the ones it does
got=$("$DJINN" run --model "$FX/models/llama3" --tokens "$prompt" -n 12 --greedy --print-tokens --ignore-eos \
    --kv-dtype fp8 2>/dev/null | wc -w | tr -d ' ')
if [ "$got" = 12 ]; then ok; else bad "run --kv-dtype fp8: $got tokens, want 12"; fi
if "$DJINN" info --model "$FX/models/llama3" --kv-dtype fp8 | grep -q "f8_e4m3 KV"; then ok; else bad "info --kv-dtype fp8"; fi
expect_error "run: --kv-dtype bf16 on the CPU" "'auto' (f32), 'fp8' or 'f32'" "$DJINN" run --tokens 1 --kv-dtype bf16
expect_error "serve --kv-dtype bf8" "want auto or fp8" "$DJINN" serve --kv-dtype bf8

# a model larger than its text budget streams some layers through a ring: the
# same tokens with and without prefetch, the placement printed (weights copied
# into the text segment - DJINN_WEIGHTS_IN_PLACE=0 - so that the budget binds)
want=$("$DJINN" run --tokens 1,2,3 -n 12 --greedy --ignore-eos --print-tokens 2>/dev/null)
got=$(DJINN_WEIGHTS_IN_PLACE=0 "$DJINN" run --tokens 1,2,3 -n 12 --greedy --ignore-eos --print-tokens --vmu-gb 0.02 \
    --stats 2>"$TMP/err")
if [ -n "$want" ] && [ "$got" = "$want" ] && grep -q "layers stream through a ring" "$TMP/err"; then ok; else
    bad "run streamed: got '$got', resident '$want'"; cat "$TMP/err" >&2; fi
got=$(DJINN_WEIGHTS_IN_PLACE=0 "$DJINN" run --tokens 1,2,3 -n 12 --greedy --ignore-eos --print-tokens --vmu-gb 0.02 \
    --no-prefetch 2>/dev/null)
if [ "$got" = "$want" ]; then ok; else bad "run streamed --no-prefetch: got '$got', resident '$want'"; fi
got=$(DJINN_WEIGHTS_IN_PLACE=0 "$DJINN" run --tokens 1,2,3 -n 12 --greedy --ignore-eos --print-tokens --vmu-gb 0.02 \
    --host-layers 2 --stats 2>"$TMP/err")
if [ "$got" = "$want" ] && grep -q "host compute:   100% of the FFN of 2 layers" "$TMP/err"; then ok; else
    bad "run streamed --host-layers 2: got '$got', resident '$want'"; cat "$TMP/err" >&2; fi
# half of each host layer's FFN width on the host, the other half on the "device" (here the CPU too):
# the down projection summed in two pieces, so the tokens are checked for count, not equality
got=$(DJINN_WEIGHTS_IN_PLACE=0 "$DJINN" run --tokens 1,2,3 -n 12 --greedy --ignore-eos --print-tokens --vmu-gb 0.02 \
    --host-layers 2 --host-share 0.5 --stats 2>"$TMP/err")
if [ "$(echo "$got" | wc -w)" -eq 12 ] && grep -q "host compute:   5[01]% of the FFN of 2 layers" "$TMP/err" &&
    grep -q "^layers: .*h" "$TMP/err"; then ok; else
    bad "run streamed --host-share 0.5: got '$got'"; cat "$TMP/err" >&2; fi
expect_error "run: --host-layers bad" "is not auto, none or a layer count" "$DJINN" run --tokens 1 --host-layers 0
expect_error "run: --host-share bad" "is not auto or a share in (0, 1]" "$DJINN" run --tokens 1 --host-share 1.5
if "$DJINN" info --vmu-gb 0.02 | grep -q "layers stream through a ring"; then ok; else bad "info --vmu-gb 0.02: no placement"; fi
if "$DJINN" info --vmu-gb 0.005 | grep -q "placement:      none: .*cannot run this model even streamed"; then ok; else
    bad "info --vmu-gb 0.005: no refusal"; fi
expect_error "run: budget below one layer" "cannot run this model even streamed" env DJINN_WEIGHTS_IN_PLACE=0 \
    "$DJINN" run --tokens 1,2 -n 2 --greedy --vmu-gb 0.005
mkdir -p "$TMP/store2"
ln -s "$(cd "$FX/../.." && pwd)/models/demo" "$TMP/store2/demo"
DJINN_LOG=info DJINN_WEIGHTS_IN_PLACE=0 "$DJINN" serve --listen "unix:$TMP/sock2" --models "$TMP/store2" --threads 1 --vmu-gb 0.02 \
    --host-layers 2 2>"$TMP/serve2.err" &
serve_pid=$!
wait_sock "$TMP/sock2"
got=$("$DJINN" generate --server "unix:$TMP/sock2" --model demo --tokens 1,2,3 -n 12 --greedy --ignore-eos \
    --print-tokens 2>"$TMP/err")
if [ "$got" = "$want" ] && grep -q "model demo streams" "$TMP/serve2.err"; then ok; else
    bad "serve streamed: got '$got', resident '$want'"; cat "$TMP/err" "$TMP/serve2.err" >&2; fi
if grep -q "the host computes all of the FFN of 2 of its" "$TMP/serve2.err"; then ok; else
    bad "serve --host-layers 2: no host layers"; cat "$TMP/serve2.err" >&2; fi
kill "$serve_pid"; wait "$serve_pid" 2>/dev/null

# --lora: an adapter changes the greedy tokens, at scale 0 it gives the base's; bad forms are refused
DEMO="$(cd "$FX/../.." && pwd)/models/demo"
if /usr/bin/python3 "$FX/../../tools/make_lora_adapter.py" "$DEMO" "$TMP/demo-ad" --seed 3 >/dev/null; then
    base=$("$DJINN" run --model "$DEMO" --tokens 5,6,7,8 -n 12 --greedy --ignore-eos --print-tokens 2>/dev/null)
    withad=$("$DJINN" run --model "$DEMO" --lora "$TMP/demo-ad" --tokens 5,6,7,8 -n 12 --greedy --ignore-eos \
        --print-tokens 2>"$TMP/err")
    zero=$("$DJINN" run --model "$DEMO" --lora "$TMP/demo-ad:0" --tokens 5,6,7,8 -n 12 --greedy --ignore-eos \
        --print-tokens 2>/dev/null)
    if [ -n "$base" ] && [ -n "$withad" ] && [ "$base" != "$withad" ] && [ "$zero" = "$base" ] &&
        grep -q "adapter demo-ad (rank 4" "$TMP/err"; then ok; else
        bad "--lora: base '$base', adapter '$withad', scale 0 '$zero'"; cat "$TMP/err" >&2; fi
    expect_error "lora scale" "not a scale" "$DJINN" run --model "$DEMO" --lora "$TMP/demo-ad:x" --tokens 5 -n 1
    /usr/bin/python3 "$FX/../../tools/make_lora_adapter.py" "$DEMO" "$TMP/demo-ad2" --seed 4 --r 2 >/dev/null
    both=$("$DJINN" run --model "$DEMO" --lora "$TMP/demo-ad,$TMP/demo-ad2:0" --tokens 5,6,7,8 -n 12 --greedy \
        --ignore-eos --print-tokens 2>/dev/null)
    if [ -n "$both" ] && [ "$both" = "$withad" ]; then ok; else
        bad "--lora stacked with a second at scale 0: '$both', want '$withad'"; fi
    expect_error "lora five" "at most 4" "$DJINN" run --model "$DEMO" --lora "$TMP/demo-ad,$TMP/demo-ad,$TMP/demo-ad,$TMP/demo-ad,$TMP/demo-ad" --tokens 5 -n 1
    expect_error "lora missing" "adapter_config.json" "$DJINN" run --model "$DEMO" --lora "$TMP/none" --tokens 5 -n 1
    expect_error "lora other base" "llama3" "$DJINN" run --model "$FX/models/llama3" --lora "$TMP/demo-ad" --tokens 5 -n 1
else
    bad "tools/make_lora_adapter.py failed"
fi

echo "cli_test: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
