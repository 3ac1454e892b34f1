#!/usr/bin/env python3
"""make_fixtures.py: tiny random checkpoints of every supported architecture,
with reference outputs computed by transformers in fp32.

Runs on a machine with PyTorch + transformers (the GPU machine; CPU is enough).
For each fixture it writes tests/fixtures/models/<name>/:
  config.json, model.safetensors (or model.safetensors.index.json + shards),
  reference.json: {"prompt_ids", "last_logits" (logits at the last prompt
  position), "greedy" (24 greedy tokens), "final_logits" (logits after the
  whole prompt+greedy sequence, at its last position), "min_margin" (smallest
  top-1/top-2 logit gap seen while generating greedily)}.
Weights are random but non-trivial: every tensor (norm weights and biases
included) is drawn with a spread that makes logits well separated. The
reference is computed from the weights as re-read from disk, so a bf16/f16
checkpoint's reference uses exactly the stored values (upcast to fp32).

    python3 tools/make_fixtures.py [--out tests/fixtures/models] [--seed 1234]
"""
import argparse
import json
import os
import shutil

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

N_PROMPT = 11
N_GREEDY = 24

COMMON = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=256, rms_norm_eps=1e-5, hidden_act="silu")

FIXTURES = [
    # name, config class, overrides, stored dtype, shard size (None = single file)
    ("llama2", LlamaConfig, dict(vocab_size=384, num_key_value_heads=4, rope_theta=10000.0,
                                 attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                                 bos_token_id=1, eos_token_id=2), torch.float32, None),
    ("llama3", LlamaConfig, dict(vocab_size=320, num_key_value_heads=2, rope_theta=10000.0,
                                 rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                   high_freq_factor=4.0, original_max_position_embeddings=32),
                                 tie_word_embeddings=False, bos_token_id=0, eos_token_id=[1, 2]),
     torch.bfloat16, None),
    ("tinyllama", LlamaConfig, dict(vocab_size=300, num_key_value_heads=1, num_attention_heads=4,
                                    rope_theta=10000.0, rope_scaling=dict(rope_type="linear", factor=2.0),
                                    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
     torch.float16, None),
    ("mistral", MistralConfig, dict(vocab_size=352, num_key_value_heads=2, rope_theta=1000000.0,
                                    sliding_window=16, tie_word_embeddings=False, head_dim=16,
                                    bos_token_id=1, eos_token_id=2), torch.bfloat16, None),
    ("qwen2", Qwen2Config, dict(vocab_size=400, num_key_value_heads=2, rope_theta=1000000.0,
                                tie_word_embeddings=True, use_sliding_window=False,
                                bos_token_id=None, eos_token_id=3), torch.float32, "200KB"),
]


def randomise(model, gen):
    """Give every parameter a non-trivial value: matrices ~ N(0, 1/fan_in) * 1.5,
    norm weights U(0.5, 1.5), biases N(0, 0.2), embeddings N(0, 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / fan_in ** 0.5))


@torch.no_grad()
def reference(model, prompt):
    ids = torch.tensor([prompt])
    out = model(ids, use_cache=True)
    last = out.logits[0, -1].clone()
    past = out.past_key_values
    greedy, margins = [], []
    logits = last
    for _ in range(N_GREEDY):
        top2 = torch.topk(logits, 2).values
        margins.append(float(top2[0] - top2[1]))
        nxt = int(torch.argmax(logits))
        greedy.append(nxt)
        out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1]
    full = model(torch.tensor([prompt + greedy]), use_cache=False).logits[0, -1]
    return last, greedy, full, min(margins), logits


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/models")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    for i, (name, cls, over, dtype, shard) in enumerate(FIXTURES):
        gen = torch.Generator().manual_seed(args.seed + i)
        kw = dict(COMMON)
        kw.update(over)
        cfg = cls(**kw)
        cfg._attn_implementation = "eager"
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
        randomise(model, gen)
        if cfg.tie_word_embeddings:
            model.tie_weights()
        d = os.path.join(args.out, name)
        shutil.rmtree(d, ignore_errors=True)
        model.to(dtype).save_pretrained(d, safe_serialization=True,
                                        **({"max_shard_size": shard} if shard else {}))
        # Reference from the stored weights, upcast to fp32.
        ref_model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                         attn_implementation="eager")
        ref_model.eval()
        prompt = torch.randint(3, cfg.vocab_size, (N_PROMPT,), generator=gen).tolist()
        last, greedy, full, margin, step_logits = reference(ref_model, prompt)
        # The cached decode path and the full recompute must agree.
        drift = float((full - step_logits).abs().max() / full.abs().max())
        ref = {"name": name, "architecture": cls.__name__.replace("Config", "ForCausalLM"),
               "stored_dtype": str(dtype).replace("torch.", ""),
               "transformers_version": transformers.__version__, "torch_version": torch.__version__,
               "seed": args.seed + i, "prompt_ids": prompt,
               "last_logits": [float(x) for x in last], "greedy": greedy,
               "final_logits": [float(x) for x in full], "min_margin": margin,
               "cache_vs_full_rel_diff": drift}
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump(ref, f)
        for extra in ("generation_config.json",):
            p = os.path.join(d, extra)
            if os.path.exists(p):
                os.remove(p)
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{name}: {size/1024:.0f} KB, greedy={greedy[:8]}..., min margin {margin:.4f}, "
              f"cache vs full {drift:.2e}")
        print(open(os.path.join(d, "config.json")).read())


if __name__ == "__main__":
    main()
