#!/usr/bin/env bash
# cpu_bench_remote.sh: cpu_bench.sh's side-by-side on a machine with no Debian
# packages and no network (the GPU machine's host cores): Djinn's programs
# come built from here with their shared libraries, llama.cpp as its source
# (node-llama-cpp's release bundle) and is built there for that CPU - the
# npm package's prebuilt llama.cpp is a Node addon and its libraries, with no
# llama-bench to run.
#
# Here:   bench/cpu_bench_remote.sh pack
#           builds build/{djinn,make_random_checkpoint,bench_membw} (Release),
#           fetches .carry/llama.cpp.bundle if missing (bench/fetch_llama_cpp.sh,
#           npm), writes .carry/cpu-bench.tar.xz (bin/, lib/: what ldd finds
#           beyond the C runtime).
# There:  bench/cpu_bench_remote.sh run [THREADS=nproc] [RUNS=3] [PRESETS="llama3.2-1b tinyllama-1.1b"]
#           needs .carry/cpu-bench.tar.xz and .carry/llama.cpp.bundle, a C/C++
#           compiler, cmake, git, python3; work in $WORK (default /tmp/djinn-cpu-bench:
#           about 10 GB of checkpoints); the table to stdout and, when $OUT is set,
#           $OUT/cpu_bench.txt and $OUT/bench-cpu.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true

pack() {
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build -j "$(nproc)" --target djinn make_random_checkpoint bench_membw >/dev/null
    [ -s .carry/llama.cpp.bundle ] || bench/fetch_llama_cpp.sh
    local out=.carry/cpu-bench
    rm -rf "$out"
    mkdir -p "$out/bin" "$out/lib"
    cp build/djinn build/make_random_checkpoint build/bench_membw "$out/bin/"
    for b in "$out"/bin/*; do
        ldd "$b" | awk '/=> \// {print $3}'
    done | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
            libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
            *) cp -L "$lib" "$out/lib/" ;;
        esac
    done
    tar cJf .carry/cpu-bench.tar.xz -C "$out" bin lib
    rm -rf "$out"
    echo "packed: .carry/cpu-bench.tar.xz ($(du -h .carry/cpu-bench.tar.xz | cut -f1)), .carry/llama.cpp.bundle" \
        "($(du -h .carry/llama.cpp.bundle | cut -f1)); commit $(git rev-parse --short HEAD)"
}

run() {
    local work=${WORK:-/tmp/djinn-cpu-bench}
    for f in .carry/cpu-bench.tar.xz .carry/llama.cpp.bundle; do
        [ -s "$f" ] || { echo "cpu_bench_remote: $f is missing (run 'bench/cpu_bench_remote.sh pack' where it was built)" >&2; exit 2; }
    done
    for t in cc c++ cmake git python3; do
        command -v "$t" >/dev/null || { echo "cpu_bench_remote: no $t on this machine" >&2; exit 2; }
    done
    mkdir -p "$work"
    rm -rf "$work/bin" "$work/lib"
    tar xJf .carry/cpu-bench.tar.xz -C "$work"
    export LD_LIBRARY_PATH="$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    "$work/bin/djinn" --help >/dev/null 2>&1 ||
        { echo "cpu_bench_remote: the bundled djinn does not start here:" >&2; "$work/bin/djinn" --help >&2; exit 2; }
    local src="$work/llama.cpp"
    [ -d "$src" ] || git clone -q .carry/llama.cpp.bundle "$src"
    if [ ! -x "$src/build-cpu/bin/llama-bench" ]; then
        echo "building llama-bench for this CPU ($(nproc) cores)..."
        cmake -S "$src" -B "$src/build-cpu" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF \
            -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
        cmake --build "$src/build-cpu" -j "$(nproc)" --target llama-bench >/dev/null
    fi
    local log=/dev/null
    [ -n "${OUT:-}" ] && mkdir -p "$OUT" && log="$OUT/cpu_bench.txt"
    DJINN_BIN="$work/bin" MODELS="$work/models" JSONL="${OUT:-$work}/bench-cpu.jsonl" \
        LLAMA_BENCH="$src/build-cpu/bin/llama-bench" bench/cpu_bench.sh "$@" | tee "$log"
}

case "$mode" in
    pack) pack ;;
    run) run "$@" ;;
    *) echo "usage: $0 pack | run [THREADS] [RUNS] [PRESETS]" >&2; exit 2 ;;
esac
