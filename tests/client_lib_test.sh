#!/bin/bash
# client_lib_test.sh: libdjinn and every archive it links (CMake's link closure of
# djinn_client) hold no engine, backend, model or CUDA symbol, and need no library but msgpack and pthread.
#   client_lib_test.sh --lib ARCHIVE... [--ext LINK_ITEM...]
set -u
libs=() ext=() mode=
for a in "$@"; do
    case "$a" in
    --lib) mode=lib ;;
    --ext) mode=ext ;;
    *) if [ "$mode" = lib ]; then libs+=("$a"); elif [ "$mode" = ext ]; then ext+=("$a"); else
           echo "client_lib_test: '$a' before --lib/--ext" >&2; exit 2; fi ;;
    esac
done
[ ${#libs[@]} -gt 0 ] || { echo "client_lib_test: no archive given" >&2; exit 2; }

# Symbol prefixes (defined or undefined) that belong above the wire: the engine
# (exec, vmu, sched, graph), the backends, the model layer, CUDA and the C++ it is
# compiled as, and OpenMP (the engine's thread team).
forbidden=(
    dj_engine_ dj__engine_ dj_session_ dj__session_ dj_gen_ dj_swap_ dj__swap_ dj__prefix_ dj_share_
    dj_host_ dj__host_ dj__stream_ dj_ring_ dj_point_ dj_placement_ dj_vmu_ dj__vmu_ dj_sched_
    dj_graph_ dj_plan_ dj_shape_
    dj_backend_ dj__cpu_ dj_cpu_ dj__cuda_ dj_cuda_ dj_op_ dj__op_ dj_kv_
    dj_model_ dj__model_ dj_checkpoint_ dj__checkpoint_ dj_safetensors_ dj__file_pages dj__quant_ dj__cfg_
    dj__arch dj__blk_ dj__layer_ dj__rope_ dj__gemma_ dj_tokenizer_ dj__tok_ dj_detok_ dj__utf8_
    dj__sbuf_ dj__json_ dj_chat_ dj__jinja_ dj__arena_ dj_sampler_ dj_pick dj_argmax dj_logprobs_
    cuda cublas __cuda _Z GOMP_ omp_ .gomp_
)
# Link items other than this build's archives that a client may need.
allowed_ext=(PkgConfig::MSGPACK PkgConfig::LIBUV Threads::Threads)

pattern=$(printf '^%s|' "${forbidden[@]}" | sed 's/\./\\./g; s/|$//')
fail=0
for lib in "${libs[@]}"; do
    if [ ! -f "$lib" ]; then
        echo "FAIL: $lib: no such archive" >&2
        fail=1
        continue
    fi
    # nm's lines: "ADDR T name" (defined) or "U name" (needed); the archive's members' names end in ':'.
    bad=$(nm -g "$lib" 2>/dev/null | awk 'NF >= 2 && $NF !~ /:$/ {print $NF}' | grep -E "$pattern" | sort -u)
    if [ -n "$bad" ]; then
        echo "FAIL: $(basename "$lib") holds or needs $(echo "$bad" | wc -l) engine/backend/model/CUDA symbol(s):" >&2
        echo "$bad" | head -20 | sed 's/^/  /' >&2
        fail=1
    else
        echo "ok: $(basename "$lib"): no engine, backend, model or CUDA symbol"
    fi
done
for e in ${ext[@]+"${ext[@]}"}; do
    ok=0
    for a in "${allowed_ext[@]}"; do [ "$e" = "$a" ] && ok=1; done
    if [ $ok = 1 ]; then
        echo "ok: links $e"
    else
        echo "FAIL: the client links $e (only ${allowed_ext[*]} are allowed)" >&2
        fail=1
    fi
done
exit $fail
