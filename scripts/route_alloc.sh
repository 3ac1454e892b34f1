#!/usr/bin/env bash
# route_alloc.sh: routes the named C files' malloc/calloc/realloc/strdup/strndup
# calls through djinn/alloc.h (dj_malloc ...) so tests can fail them; idempotent.
# Run it again over a file that changed elsewhere to route its new calls:
#   scripts/route_alloc.sh            (the daemon's files, listed below)
#   scripts/route_alloc.sh FILE...    (those files only)
# free() is left alone: dj_* memory is the C library's (see alloc.h).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ]; then
    set -- src/server/*.c src/client/client.c src/exec/*.c src/sched/*.c src/graph/*.c \
        src/model/tokenizer.c src/model/tok_text.c src/model/tok_encode.c src/model/tok_decode.c src/model/tok_gguf.c \
        src/model/chat_template.c src/model/jinja_parse.c src/model/jinja_eval.c \
        src/sample/sampler.c src/sample/logprobs.c
fi
for f in "$@"; do
    # a call: the name not preceded by an identifier character, '.' or '>' (fields,
    # dj_malloc itself, msgpack_zone_malloc), nor inside a // or /* comment line
    sed -E -i '/^[[:space:]]*(\/\/|\/\*|\*)/!s/(^|[^A-Za-z0-9_.>])(malloc|calloc|realloc|strdup|strndup)\(/\1dj_\2(/g' "$f"
    if grep -qE '(^|[^A-Za-z0-9_])dj_(malloc|calloc|realloc|strdup|strndup)\(' "$f" &&
        ! grep -q '^#include "djinn/alloc.h"' "$f"; then
        # after the file's first #include (its own header, where it has one)
        sed -i '0,/^#include.*/s//&\n#include "djinn\/alloc.h"/' "$f"
    fi
done
