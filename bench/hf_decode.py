#!/usr/bin/env python3
# hf_decode.py: Hugging Face transformers decode in PyTorch eager mode on the GPU
# (bf16, batch 1, greedy, use_cache, no torch.compile) on a checkpoint dir, for
# the "at least 3x HF eager" bar. Timed: 64 forward calls of one token each,
# the picked id read back every step, torch.cuda.synchronize around.
# usage: python3 bench/hf_decode.py MODEL_DIR [--prompt 512] [--new 64] [--attn sdpa|eager] [--json PATH]
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    ap.add_argument("--new", type=int, default=64, help="greedy tokens generated")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa (transformers' default) or eager")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    dev = torch.device("cuda")
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.bfloat16, attn_implementation=a.attn)
    model.to(dev).eval()
    vocab = model.config.vocab_size
    ids = torch.randint(100, vocab - 100, (1, a.prompt), device=dev)

    def prefill():
        out = model(input_ids=ids, use_cache=True)
        return out.past_key_values, out.logits[:, -1, :].argmax(-1, keepdim=True)

    with torch.inference_mode():
        # warm-up: kernels, allocator, cuBLAS heuristics
        past, tok = prefill()
        for _ in range(4):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1, :].argmax(-1, keepdim=True)
        torch.cuda.synchronize()

        t0 = time.perf_counter()
        past, tok = prefill()
        torch.cuda.synchronize()
        t_prefill = time.perf_counter() - t0

        t0 = time.perf_counter()
        for _ in range(a.new):
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, out.logits[:, -1, :].argmax(-1, keepdim=True)
            tok.item()  # the token reaches the host every step, as in a server
        torch.cuda.synchronize()
        t_decode = time.perf_counter() - t0

    ms = t_decode / a.new * 1e3
    name = torch.cuda.get_device_name(dev)
    print(f"hf_decode: {a.model} on {name}, transformers (PyTorch eager mode, attention {a.attn}) bf16, batch 1")
    print(f"{'what':<40} {'measured':>14}")
    print(f"{'prefill ' + str(a.prompt) + ' tokens (s)':<40} {t_prefill:>14.4f}")
    print(f"{'decode ' + str(a.new) + ' greedy tokens (ms/token)':<40} {ms:>14.3f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": name, "model": a.model, "prompt": a.prompt, "new_tokens": a.new,
                       "attn": a.attn, "prefill_s": t_prefill, "decode_ms_per_token": ms}, f, indent=2)


if __name__ == "__main__":
    main()
