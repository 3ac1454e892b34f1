#!/usr/bin/env bash
# gpu_bundle.sh: builds Djinn with CUDA here (nvcc, no GPU needed) and packs
# the programs with the shared libraries the GPU machine lacks (our Debian
# -dev dependencies) into .carry/gpu.tar.xz ({bin,lib}), so that that
# machine - which has CUDA but none of our apt packages - can run them:
#   mkdir -p /tmp/g && tar xJf .carry/gpu.tar.xz -C /tmp/g
#   LD_LIBRARY_PATH=/tmp/g/lib /tmp/g/bin/gpu_check
# capture/ holds the captured-graph bundles tests/gpu/gpu_capture.c replays (scripts/capture_bundles.sh).
# usage: scripts/gpu_bundle.sh [extra targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DDJ_CUDA=ON >/dev/null
cmake --build build-cuda -j "$(nproc)"
out=.carry/gpu
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for f in build-cuda/djinn build-cuda/djinnd build-cuda/gpu_check build-cuda/gpu_models build-cuda/gpu_swap build-cuda/gpu_prefix build-cuda/bench_gpu \
    build-cuda/make_random_checkpoint build-cuda/bench_brk build-cuda/bench_fairness build-cuda/bench_http build-cuda/bench_q4_loads build-cuda/libdj_ktrace.so build-cuda/bench_gemm_algos build-cuda/gpu_capture "$@"; do
    [ -x "$f" ] && [ -f "$f" ] && cp "$f" "$out/bin/"
done
# Every shared library the programs load, except the C runtime and CUDA's own
# (the GPU machine has a matching CUDA 13 and driver).
for b in "$out"/bin/*; do
    ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*|libcudart*|libstdc++*|libgcc_s*) ;;
        *) cp -L "$lib" "$out/lib/" ;;
    esac
done
# The captured graphs gpu_capture replays (capture/; needs python3 with torch here, else left out).
scripts/capture_bundles.sh "$out/capture" build-cuda/graph_run_tool || echo "gpu_bundle.sh: no capture bundles (python3 torch?)" >&2
# -9: a 64 MiB dictionary, so the programs' shared CUDA code (~16 MB each) is stored once
XZ_OPT=-9 tar cJf .carry/gpu.tar.xz -C "$out" bin lib $([ -d "$out/capture" ] && echo capture)
rm -rf "$out"
ls -la .carry/gpu.tar.xz
