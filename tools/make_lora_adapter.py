#!/usr/bin/python3
"""make_lora_adapter.py: writes a PEFT LoRA adapter (adapter_config.json +
adapter_model.safetensors, random A and B) for the model in a directory - a
fixture for tests and trials of `djinn run --lora` (numpy only; docs/lora.md)."""
import argparse
import json
import os
import struct

import numpy as np

LEAVES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj", "gate_up_proj")


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("model", help="the base model's directory (model.safetensors)")
    ap.add_argument("out", help="the adapter's directory (made)")
    ap.add_argument("--r", type=int, default=4)
    ap.add_argument("--alpha", type=float, default=8.0)
    ap.add_argument("--rslora", action="store_true")
    ap.add_argument("--targets", default="", help="comma-separated leaves (default: every projection the model has)")
    ap.add_argument("--std", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    hdr = read_header(os.path.join(a.model, "model.safetensors"))
    want = set(a.targets.split(",")) if a.targets else set(LEAVES)
    rng = np.random.default_rng(a.seed)
    tensors, leaves = {}, set()
    for name, t in sorted(hdr.items()):
        if name == "__metadata__" or not name.endswith(".weight") or len(t["shape"]) != 2:
            continue
        module = name[: -len(".weight")]
        leaf = module.rsplit(".", 1)[-1]
        if leaf not in LEAVES or leaf not in want:
            continue
        leaves.add(leaf)
        rows, cols = t["shape"]
        tensors[f"base_model.model.{module}.lora_A.weight"] = (rng.standard_normal((a.r, cols)) * a.std).astype("<f4")
        tensors[f"base_model.model.{module}.lora_B.weight"] = (rng.standard_normal((rows, a.r)) * a.std).astype("<f4")
    os.makedirs(a.out, exist_ok=True)
    meta, off = {}, 0
    for name, v in tensors.items():
        meta[name] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [off, off + v.nbytes]}
        off += v.nbytes
    head = json.dumps(meta).encode()
    head += b" " * (-len(head) % 8)
    with open(os.path.join(a.out, "adapter_model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for v in tensors.values():
            f.write(v.tobytes())
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": a.r, "lora_alpha": a.alpha, "use_rslora": a.rslora,
           "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
           "base_model_name_or_path": os.path.basename(os.path.normpath(a.model)),
           "target_modules": sorted(leaves)}
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print(f"{a.out}: {len(tensors) // 2} modules, r {a.r}, {off} bytes")


if __name__ == "__main__":
    main()
