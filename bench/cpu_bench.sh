#!/usr/bin/env bash
# cpu_bench.sh: the CPU engine beside llama.cpp on the same machine in the
# same run - random-weight Llama-3.2-1B (tied) and TinyLlama-1.1B shapes,
# bf16 safetensors for Djinn and the same values as an F16 GGUF for
# llama.cpp (make_random_checkpoint --gguf); prompt 32 and 512, decode 64;
# the machine's read bandwidth (bench_membw) measured between the runs and
# decode's weight traffic reported as a fraction of it; time to first token
# (load + a 4-token prompt + the first pick) and peak RSS.
#
# usage: bench/cpu_bench.sh [THREADS=nproc] [RUNS=3] [PRESETS="llama3.2-1b tinyllama-1.1b"]
#   BUILD_ONLY=1 builds Djinn and llama-bench and stops (a first call on a fresh machine)
#   LLAMA_BENCH=/path/to/llama-bench   llama.cpp's benchmark, run alternately with Djinn
#   LLAMA_CPP_SRC=/path/to/llama.cpp   or a llama.cpp tree to build it from (CPU only);
#                                      by default build/llama.cpp, cloned from
#                                      .carry/llama.cpp.bundle (bench/fetch_llama_cpp.sh)
#   MODELS=DIR                         where the checkpoints go (default build/bench-models)
#   DJINN_BIN=DIR                      djinn, make_random_checkpoint and bench_membw already built
#                                      there (a bundle: bench/cpu_bench_remote.sh); no build here
#   JSONL=FILE                         the JSON lines' file (default build/bench-cpu.jsonl)
# With no llama.cpp at all only Djinn is measured. Figures are medians of
# RUNS alternating runs; the table goes to stdout, one JSON line per model to
# $JSONL.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=${1:-$(nproc)}
RUNS=${2:-3}
PRESETS=${3:-"llama3.2-1b tinyllama-1.1b"}
MODELS=${MODELS:-build/bench-models}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

BIN=${DJINN_BIN:-build}
JSONL=${JSONL:-build/bench-cpu.jsonl}
if [ -z "${DJINN_BIN:-}" ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build -j "$(nproc)" --target djinn make_random_checkpoint bench_membw >/dev/null
fi
mkdir -p "$(dirname "$JSONL")"

LB=${LLAMA_BENCH:-}
if [ -z "$LB" ] && [ -z "${LLAMA_CPP_SRC:-}" ] && [ -s .carry/llama.cpp.bundle ]; then
    [ -d build/llama.cpp ] || git clone -q .carry/llama.cpp.bundle build/llama.cpp 2>/dev/null
    LLAMA_CPP_SRC=build/llama.cpp
fi
if [ -z "$LB" ] && [ -n "${LLAMA_CPP_SRC:-}" ]; then
    LB="$LLAMA_CPP_SRC/build-cpu/bin/llama-bench"
    if [ ! -x "$LB" ]; then
        cmake -S "$LLAMA_CPP_SRC" -B "$LLAMA_CPP_SRC/build-cpu" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
            -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
            -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
        cmake --build "$LLAMA_CPP_SRC/build-cpu" -j "$(nproc)" --target llama-bench >/dev/null
    fi
fi
[ "${BUILD_ONLY:-0}" = 1 ] && { echo "built: $BIN/djinn${LB:+ and $LB}"; exit 0; }
[ -n "$LB" ] && [ ! -x "$LB" ] && { echo "cpu_bench: $LB is not executable" >&2; exit 2; }

ids() { seq 100 $((100 + $1 - 1)) | paste -sd, -; }
P32=$(ids 32)
P512=$(ids 512)
median() { $PY -c 'import sys,statistics as s; v=[float(x) for x in sys.argv[1:] if x!=""]; print("%.2f" % s.median(v) if v else "-")' "$@"; }
# "djinn: 32 prompt tokens in 0.811 s (39.5 tok/s), 64 new tokens in 11.142 s (5.65 tok/s); load 7.625 s; ..."
field() { # field LINE prompt|decode|load|prompt_s
    case $2 in
    prompt) sed -E 's/.*prompt tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<<"$1" ;;
    prompt_s) sed -E 's/.*prompt tokens in ([0-9.]+) s.*/\1/' <<<"$1" ;;
    decode) sed -E 's/.*new tokens in [0-9.]+ s \(([0-9.]+) tok\/s\).*/\1/' <<<"$1" ;;
    load) sed -E 's/.*load ([0-9.]+) s.*/\1/' <<<"$1" ;;
    esac
}
djinn_run() { # djinn_run DIR PROMPT N -> "LINE|RSS_KB"
    local out rss
    out=$( { /usr/bin/time -f "rss_kb %M" "$BIN/djinn" run --model "$1" --tokens "$2" -n "$3" --greedy --ignore-eos \
        --print-tokens --threads "$THREADS" >/dev/null; } 2>&1)
    rss=$(grep -o 'rss_kb [0-9]*' <<<"$out" | cut -d' ' -f2)
    echo "$(grep 'new tokens' <<<"$out")|$rss"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads," \
    "avx512f: $(grep -qw avx512f /proc/cpuinfo && echo yes || echo no); commit $(git rev-parse --short HEAD)"
[ -n "$LB" ] && echo "llama.cpp: $LB" || echo "llama.cpp: not given (LLAMA_BENCH / LLAMA_CPP_SRC): Djinn only"
: >"$JSONL"
for preset in $PRESETS; do
    dir="$MODELS/$preset"
    gguf="$MODELS/$preset-f16.gguf"
    if [ ! -s "$dir/model.safetensors" ] || { [ -n "$LB" ] && [ ! -s "$gguf" ]; }; then
        "$BIN/make_random_checkpoint" "$preset" "$dir" --seed 1 --gguf "$gguf" >/dev/null
    fi
    # weight bytes one decode step streams: every matmul, lm_head (the embedding when tied) included
    bytes=$($PY - "$dir/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
d, f, L, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
h = c["num_attention_heads"]; kv = c.get("num_key_value_heads", h); hd = c.get("head_dim", d // h)
print(2 * (L * (2 * d * h * hd + 2 * d * kv * hd + 3 * d * f) + v * d))
EOF
)
    cat "$dir/model.safetensors" >/dev/null # page cache warm
    [ -n "$LB" ] && cat "$gguf" >/dev/null
    bw=() dp32=() dp512=() ddec=() dload=() dttft=() drss=() lp32=() lp512=() ldec=()
    for r in $(seq 1 "$RUNS"); do
        bw+=("$("$BIN/bench_membw" 2 "$THREADS" 3 | sed -nE 's/read bandwidth: ([0-9.]+) GB\/s.*/\1/p')")
        IFS='|' read -r line rss <<<"$(djinn_run "$dir" "$P32" 64)"
        dp32+=("$(field "$line" prompt)") ddec+=("$(field "$line" decode)") drss+=("$rss")
        IFS='|' read -r line _ <<<"$(djinn_run "$dir" "$P512" 1)"
        dp512+=("$(field "$line" prompt)")
        IFS='|' read -r line _ <<<"$(djinn_run "$dir" 1,2,3,4 1)"
        dload+=("$(field "$line" load)")
        dttft+=("$($PY -c "print($(field "$line" load) + $(field "$line" prompt_s))")")
        if [ -n "$LB" ]; then
            res=$("$LB" -m "$gguf" -p 32,512 -n 64 -t "$THREADS" -r 1 -o jsonl 2>/dev/null)
            lp32+=("$($PY -c 'import sys,json
for l in sys.stdin:
    j=json.loads(l)
    if j["n_prompt"]==32 and j["n_gen"]==0: print(j["avg_ts"])' <<<"$res")")
            lp512+=("$($PY -c 'import sys,json
for l in sys.stdin:
    j=json.loads(l)
    if j["n_prompt"]==512 and j["n_gen"]==0: print(j["avg_ts"])' <<<"$res")")
            ldec+=("$($PY -c 'import sys,json
for l in sys.stdin:
    j=json.loads(l)
    if j["n_gen"]==64: print(j["avg_ts"])' <<<"$res")")
        fi
    done
    BW=$(median "${bw[@]}")
    DEC=$(median "${ddec[@]}")
    FRAC=$($PY -c "print('%.2f' % ($DEC * $bytes / 1e9 / $BW))")
    LDEC=$(median "${ldec[@]:-}")
    echo
    echo "== $preset: $(($bytes / 1000000)) MB of weights per decode step; read bandwidth $BW GB/s (median; runs: ${bw[*]})"
    printf "%-34s %-22s %-22s\n" "" "Djinn (bf16)" "llama.cpp (F16)"
    printf "%-34s %-22s %-22s\n" "prompt 32, tok/s" "$(median "${dp32[@]}") (${dp32[*]})" "$(median "${lp32[@]:-}") (${lp32[*]:-})"
    printf "%-34s %-22s %-22s\n" "prompt 512, tok/s" "$(median "${dp512[@]}") (${dp512[*]})" "$(median "${lp512[@]:-}") (${lp512[*]:-})"
    printf "%-34s %-22s %-22s\n" "decode 64, tok/s" "$DEC (${ddec[*]})" "$LDEC (${ldec[*]:-})"
    printf "%-34s %-22s\n" "decode weight traffic / bandwidth" "$FRAC"
    printf "%-34s %-22s\n" "load, s" "$(median "${dload[@]}") (${dload[*]})"
    printf "%-34s %-22s\n" "time to first token (4-token prompt), s" "$(median "${dttft[@]}")"
    printf "%-34s %-22s\n" "peak RSS, MB" "$(($(median "${drss[@]}" | cut -d. -f1) / 1000))"
    printf '{"model": "%s", "threads": %s, "runs": %s, "weight_bytes_per_token": %s, "read_gb_s": %s, "djinn": {"prompt32_tok_s": %s, "prompt512_tok_s": %s, "decode64_tok_s": %s, "decode_bw_fraction": %s, "load_s": %s, "ttft_s": %s}, "llama_cpp": {"prompt32_tok_s": "%s", "prompt512_tok_s": "%s", "decode64_tok_s": "%s"}}\n' \
        "$preset" "$THREADS" "$RUNS" "$bytes" "$BW" "$(median "${dp32[@]}")" "$(median "${dp512[@]}")" "$DEC" "$FRAC" \
        "$(median "${dload[@]}")" "$(median "${dttft[@]}")" "$(median "${lp32[@]:-}")" "$(median "${lp512[@]:-}")" "$LDEC" \
        >>"$JSONL"
done
