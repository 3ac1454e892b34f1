"""fp8_fixtures.py: the FP8 fixtures (issue 16) - the llama3 fixture's weights
quantized to float8_e4m3fn by our own quantizer (numpy) and written in the
layouts Hugging Face checkpoints use, with references from an independent
dequantizer (tools/dequant_fp8.py: stored layout -> dense f32 checkpoint) run
by the pure-torch forward python/tests/torch_ref.py in fp32 (W8A16: the
activations are not quantized). Called by `tools/make_fixtures.py --fp8`;
needs numpy and torch, not transformers.

Layouts (one fixture each):
  llama3_fp8        transformers "fp8": weight F8_E4M3 [out, in], f32
                    weight_scale_inv [ceil(out/32), ceil(in/32)] (block 32x32 so
                    that a 64-wide fixture has several blocks; the releases use
                    128x128, the same layout); lm_head left bf16
                    (modules_to_not_convert)
  llama3_ct_tensor  compressed-tensors float-quantized, strategy tensor: f32
                    weight_scale [1] and a static input_scale [1] (not applied);
                    lm_head ignored
  llama3_ct_channel compressed-tensors, strategy channel: bf16 weight_scale
                    [out, 1]; lm_head quantized too (ignore: [])
"""
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))

import dequant_fp8  # noqa: E402  (the independent reference dequantizer)

N_GREEDY = 24
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# ---- safetensors in and out (Debian has no safetensors package) ----

_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F8_E4M3": np.uint8}


def read_st(path):
    """{name: (dtype string, numpy array of the raw elements)}."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        out[name] = (info["dtype"], np.frombuffer(data[lo:hi], dtype=_NP[info["dtype"]]).reshape(info["shape"]))
    return out


def write_st(path, tensors):
    """tensors: {name: (dtype string, numpy array)}; largest elements first so
    every tensor is aligned to its element size."""
    names = sorted(tensors, key=lambda k: (-tensors[k][1].dtype.itemsize, k))
    header, blobs, off = {}, [], 0
    for k in names:
        dt, a = tensors[k]
        b = np.ascontiguousarray(a).tobytes()
        header[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def bf16_to_f32(a):
    return (a.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(a):
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


# ---- our quantizer: f32 -> nearest float8_e4m3fn code ----

def _e4m3_grid():
    """(values, codes) of the 127 finite non-negative e4m3fn codes, ascending:
    value = 2^(e-7) * (1 + m/8), subnormals 2^-6 * m/8."""
    vals, codes = [], []
    for e in range(16):
        for m in range(8):
            if e == 15 and m == 7:
                continue  # NaN
            vals.append(2.0 ** -6 * m / 8 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8))
            codes.append(e << 3 | m)
    return np.array(vals, dtype=np.float64), np.array(codes, dtype=np.uint8)


_GRID, _CODES = _e4m3_grid()


def to_e4m3(x):
    """Nearest code (ties to the even code), |x| <= 448 expected."""
    a = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    hi = np.clip(np.searchsorted(_GRID, a), 1, len(_GRID) - 1)
    lo = hi - 1
    dlo, dhi = a - _GRID[lo], _GRID[hi] - a
    pick = np.where((dhi < dlo) | ((dhi == dlo) & (_CODES[hi] % 2 == 0)), hi, lo)
    return _CODES[pick] | np.where(x < 0, 0x80, 0).astype(np.uint8)


def quant_blocks(w, b0, b1):
    """w f32 [R, C] -> (codes [R, C], f32 scales [ceil(R/b0), ceil(C/b1)])."""
    R, C = w.shape
    sr, sc = -(-R // b0), -(-C // b1)
    s = np.zeros((sr, sc), np.float32)
    q = np.zeros((R, C), np.uint8)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1]
            s[i, j] = np.float32(max(float(np.abs(blk).max()), 1e-12) / 448.0)
            q[i * b0:(i + 1) * b0, j * b1:(j + 1) * b1] = to_e4m3(blk / s[i, j])
    return q, s


def quant_rows(w, scale_of_row):
    """Per-row scales (already in their stored precision, f32 values)."""
    return to_e4m3(w / scale_of_row[:, None]), scale_of_row


# ---- fixtures ----

def _quantize(src, layout):
    """Tensors of the llama3 fixture (bf16) in one FP8 layout; returns
    (tensors, quantization_config)."""
    out = {}
    for name, (dt, a) in src.items():
        mod = name[:-len(".weight")] if name.endswith(".weight") else None
        is_lin = mod is not None and mod.split(".")[-1] in LINEAR
        is_head = name == "lm_head.weight"
        if not (is_lin or (is_head and layout == "ct_channel")):
            out[name] = (dt, a)
            continue
        w = bf16_to_f32(a) if dt == "BF16" else a.astype(np.float32)
        if layout == "fp8":
            q, s = quant_blocks(w, 32, 32)
            out[name] = ("F8_E4M3", q)
            out[name + "_scale_inv"] = ("F32", s)
        elif layout == "ct_tensor":
            q, s = quant_blocks(w, w.shape[0], w.shape[1])
            out[name] = ("F8_E4M3", q)
            out[mod + ".weight_scale"] = ("F32", s.reshape(1))
            out[mod + ".input_scale"] = ("F32", np.array([0.05], np.float32))  # static; not applied
        else:  # ct_channel, bf16 scales: quantize with the stored (rounded) value
            s16 = f32_to_bf16(np.maximum(np.abs(w).max(axis=1), 1e-12) / 448.0)
            q, _ = quant_rows(w, bf16_to_f32(s16))
            out[name] = ("F8_E4M3", q)
            out[mod + ".weight_scale"] = ("BF16", s16.reshape(-1, 1))
    if layout == "fp8":
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
              "weight_block_size": [32, 32], "modules_to_not_convert": ["lm_head"]}
    else:
        strategy = "tensor" if layout == "ct_tensor" else "channel"
        acts = ({"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
                if layout == "ct_tensor" else None)
        qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
              "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": acts, "output_activations": None,
                                            "weights": {"num_bits": 8, "type": "float", "strategy": strategy,
                                                        "symmetric": True, "dynamic": False, "group_size": None,
                                                        "block_structure": None}}},
              "ignore": ["lm_head"] if layout == "ct_tensor" else [], "kv_cache_scheme": None,
              "sparsity_config": {}}
    return out, qc


def _reference(dense_dir, prompt):
    import torch
    from torch_ref import LlamaRef
    model = LlamaRef(dense_dir)
    with torch.no_grad():
        last = model.forward(prompt)[0][-1]
        seq, margins = list(prompt), []
        logits = last
        for _ in range(N_GREEDY):
            top2 = torch.topk(logits, 2).values
            margins.append(float(top2[0] - top2[1]))
            seq.append(int(torch.argmax(logits)))
            logits = model.forward(seq)[0][-1]
    return last, seq[len(prompt):], logits, min(margins)


def make(out_root):
    base = os.path.join(out_root, "llama3")
    src = read_st(os.path.join(base, "model.safetensors"))
    with open(os.path.join(base, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(base, "reference.json")) as f:
        base_ref = json.load(f)
    prompt = base_ref["prompt_ids"]
    bf16_last = np.array(base_ref["last_logits"], np.float64)
    for layout, name in (("fp8", "llama3_fp8"), ("ct_tensor", "llama3_ct_tensor"),
                         ("ct_channel", "llama3_ct_channel")):
        d = os.path.join(out_root, name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        tensors, qc = _quantize(src, layout)
        write_st(os.path.join(d, "model.safetensors"), tensors)
        c = dict(cfg)
        c["quantization_config"] = qc
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
        with tempfile.TemporaryDirectory() as dense:
            dequant_fp8.dequantize_dir(d, dense)
            last, greedy, final, margin = _reference(dense, prompt)
        qerr = float(np.abs(last.numpy() - bf16_last).max() / np.abs(bf16_last).max())
        ref = {"name": name, "architecture": "LlamaForCausalLM", "stored_dtype": "f8_e4m3 (%s)" % layout,
               "reference": "tools/dequant_fp8.py + python/tests/torch_ref.py (fp32)", "prompt_ids": prompt,
               "last_logits": [float(x) for x in last], "greedy": greedy,
               "final_logits": [float(x) for x in final], "min_margin": margin,
               "quant_vs_bf16_rel_err": qerr}
        with open(os.path.join(d, "reference.json"), "w") as f:
            json.dump(ref, f)
        size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
        print(f"{name}: {size / 1024:.0f} KB, greedy={greedy[:8]}..., min margin {margin:.4f}, "
              f"last logits vs the bf16 model {qerr:.3e}")
