#!/usr/bin/env bash
# gpu_check.sh: on a machine with a GPU, build the CUDA backend (build-cuda/)
# and compare every CUDA op with the CPU backend; --bench adds timings.
# Usage (from the repo root): scripts/gpu_check.sh [--bench] [--device N]
# Extra CMake arguments (e.g. where the static libraries are) come from
# DJ_CMAKE_ARGS, e.g. DJ_CMAKE_ARGS="-DCMAKE_PREFIX_PATH=/opt/deps".
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC2086
cmake -S . -B build-cuda -DDJ_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${DJ_CMAKE_ARGS:-}
cmake --build build-cuda -j"$(nproc)" --target gpu_check test_cuda_probe
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
./build-cuda/test_cuda_probe
exec ./build-cuda/gpu_check "$@"
