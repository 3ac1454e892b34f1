/* arch_list.h: the architectures Djinn runs, as one X-macro list - the
 * dj_arch enum, the config.json names and the per-architecture files
 * (src/model/arch/<file>.c) are all generated from it. */
#ifndef DJINN_ARCH_LIST_H
#define DJINN_ARCH_LIST_H

/* X(ENUM, "config.json architectures[0]", file stem) */
#define DJ_ARCH_LIST(X)                          \
    X(LLAMA, "LlamaForCausalLM", llama)          \
    X(MISTRAL, "MistralForCausalLM", mistral)    \
    X(QWEN2, "Qwen2ForCausalLM", qwen2)          \
    X(QWEN3, "Qwen3ForCausalLM", qwen3)          \
    X(GEMMA2, "Gemma2ForCausalLM", gemma2)       \
    X(GEMMA3, "Gemma3ForCausalLM", gemma3)       \
    X(PHI3, "Phi3ForCausalLM", phi3)             \
    X(MIXTRAL, "MixtralForCausalLM", mixtral)

#endif
