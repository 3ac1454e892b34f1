#!/usr/bin/env python3
"""bf16_yardstick.py: how far transformers itself lands from its own fp32
reference when it runs the fixture models in bf16 on the GPU - the yardstick
for Djinn's bf16 CUDA path (tests/gpu/gpu_models.c prints the same two
metrics). For each fixture: the prompt's last logits and the teacher-forced
final logits, as ||a-b||/||b|| and max|a-b|/max|b|.

    python3 tools/bf16_yardstick.py [--root .] [--json tests/fixtures/bf16_yardstick.json]

The JSON ({name: {"last_l2", "last_maxabs", "final_l2", "final_maxabs"}}) is
what tests/gpu/gpu_models.c holds Djinn's bf16 path to: no worse than 1.25x
transformers' own bf16 error, or 1e-2, whichever is larger.
"""
import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM


def errs(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm()), float((a - b).abs().max() / b.abs().max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=".")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0), "cases": {}}
    cases = [(n, f"tests/fixtures/models/{n}", f"tests/fixtures/models/{n}/reference.json")
             for n in ("llama2", "llama3", "tinyllama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3",
                       "phi3_longrope", "mixtral", "phi3_longctx")]
    cases.append(("demo", "models/demo", "tests/fixtures/demo/reference.json"))
    for name, d, r in cases:
        ref = json.load(open(os.path.join(args.root, r)))
        m = AutoModelForCausalLM.from_pretrained(os.path.join(args.root, d), dtype=torch.bfloat16,
                                                 attn_implementation="eager").cuda().eval()
        with torch.no_grad():
            p = torch.tensor([ref["prompt_ids"]], device="cuda")
            last = m(p).logits[0, -1].float().cpu()
            s = torch.tensor([ref["prompt_ids"] + ref["greedy"]], device="cuda")
            final = m(s).logits[0, -1].float().cpu()
        l2a, mxa = errs(last, torch.tensor(ref["last_logits"]))
        l2b, mxb = errs(final, torch.tensor(ref["final_logits"]))
        print(f"{name:10s} transformers bf16: prompt logits {l2a:.2e} (max-abs {mxa:.2e})  "
              f"final logits {l2b:.2e} (max-abs {mxb:.2e})")
        out["cases"][name] = {"last_l2": l2a, "last_maxabs": mxa, "final_l2": l2b, "final_maxabs": mxb}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
