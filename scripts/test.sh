#!/usr/bin/env bash
# test.sh: builds and runs every test - the release build, the same tests under
# ASan/UBSan, and each libFuzzer target for a bounded time.
# DJ_FUZZ_SECONDS (default 30) sets the time per fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${DJ_FUZZ_SECONDS:-30}

echo "== release build + tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$JOBS"
ctest --test-dir build --output-on-failure -j "$JOBS"

# The CUDA backend is compiled wherever nvcc is (CI has it, but no GPU): the
# same tests then run with it linked in, and test_cuda_probe checks the
# no-device paths. On a GPU machine scripts/gpu_check.sh runs the GPU checks.
NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -n "$NVCC" ]; then
    echo "== CUDA build (nvcc: $NVCC) + tests"
    cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DDJ_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
    cmake --build build-cuda -j "$JOBS"
    ctest --test-dir build-cuda --output-on-failure -j "$JOBS"
else
    echo "== no nvcc: the CUDA backend is not compiled"
fi

echo "== ASan/UBSan build + tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDJ_SANITIZE=ON >/dev/null
cmake --build build-asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j "$JOBS"

echo "== libFuzzer targets, ${FUZZ_SECONDS}s each"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DDJ_FUZZ=ON -DDJ_TESTS=OFF \
    -DDJ_FUZZ_SECONDS="$FUZZ_SECONDS" >/dev/null
cmake --build build-fuzz -j "$JOBS"
ctest --test-dir build-fuzz --output-on-failure -L fuzz
