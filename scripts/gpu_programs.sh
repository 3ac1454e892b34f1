# gpu_programs.sh: sourced by the GPU machine's scripts (gpu_check.sh,
# gpu_http.sh, tests/gpu/trace_check.sh, bench/q4_bench.sh) to find our
# programs. `dj_gpu_programs TARGET...` sets B to their folder: $DJ_BIN when
# set; else .carry/gpu.tar.xz unpacked into a temporary folder (what
# scripts/gpu_bundle.sh packs; its lib/ goes first on LD_LIBRARY_PATH); else
# build-cuda, with the TARGETs built there now (CUDA_ARGS: more cmake -D
# settings). Returns non-zero when none of these works.
dj_gpu_programs() {
    if [ -n "${DJ_BIN:-}" ]; then
        B=$DJ_BIN
    elif [ -f .carry/gpu.tar.xz ]; then
        local g
        g=$(mktemp -d) && tar xJf .carry/gpu.tar.xz -C "$g" || return 2
        export LD_LIBRARY_PATH="$g/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        B=$g/bin
    else
        # shellcheck disable=SC2086
        cmake -S . -B build-cuda -DDJ_CUDA=ON -DCMAKE_BUILD_TYPE=Release ${CUDA_ARGS:-} >/dev/null || return 2
        [ $# -eq 0 ] || cmake --build build-cuda -j"$(nproc)" --target "$@" >/dev/null || return 2
        B=build-cuda
    fi
}
