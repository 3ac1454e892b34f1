#!/usr/bin/env python3
"""dequant_fp8.py: the reference dequantizer of FP8 checkpoints - a Hugging
Face directory in transformers' "fp8" layout or compressed-tensors float8
(per tensor, per channel, block) turned into a dense f32 checkpoint that any
fp32 forward runs (W8A16 semantics: dense weight = e4m3 value * its scale).
Written apart from the quantizer (tools/fp8_fixtures.py) and from Djinn's C
loader: it decodes e4m3 bits itself and reads the scales by the config.

    python3 tools/dequant_fp8.py SRC_DIR DST_DIR
"""
import json
import os
import struct
import sys

import numpy as np

_NP = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F8_E4M3": np.uint8}


def _read(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        a = np.frombuffer(data[lo:hi], dtype=_NP[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], a)
    return out


def decode_e4m3(codes):
    """float8_e4m3fn bits -> f32: sign, 4 exponent bits (bias 7), 3 mantissa bits."""
    c = codes.astype(np.int32)
    sign = np.where(c & 0x80, -1.0, 1.0)
    e = (c >> 3) & 0xF
    m = (c & 7).astype(np.float64)
    mag = np.where(e == 0, m * 2.0 ** -9, np.ldexp(1.0 + m / 8.0, e - 7))
    mag = np.where((e == 15) & ((c & 7) == 7), np.nan, mag)
    return (sign * mag).astype(np.float32)


def _float(dt, a):
    if dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def dequantize(tensors, qc):
    """{name: (dtype, array)} -> {name: f32 array}, scales folded in and dropped."""
    method = qc.get("quant_method")
    if method == "fp8":
        b0, b1 = qc.get("weight_block_size") or [128, 128]
        suffix = "_scale_inv"
    elif method == "compressed-tensors":
        b0 = b1 = None
        for g in qc["config_groups"].values():
            if g["weights"].get("strategy") == "block":
                b0, b1 = g["weights"]["block_structure"]
        suffix = "_scale"
    else:
        raise ValueError("quant_method %r is not an FP8 layout" % method)
    out = {}
    for name, (dt, a) in tensors.items():
        if name.endswith("_scale") or name.endswith("_scale_inv") or name.endswith(".input_scale"):
            continue
        if dt != "F8_E4M3":
            out[name] = _float(dt, a)
            continue
        sdt, s = tensors[name + suffix]
        s = _float(sdt, s).astype(np.float32)
        R, C = a.shape
        if s.size == 1:
            full = np.full((R, C), s.reshape(()), np.float32)
        elif s.shape in ((R, 1), (R,)):
            full = np.repeat(s.reshape(R, 1), C, axis=1)
        else:
            full = np.repeat(np.repeat(s, b0, axis=0), b1, axis=1)[:R, :C]
        out[name] = (decode_e4m3(a) * full).astype(np.float32)
    return out


def _write(path, tensors):
    header, blobs, off = {}, [], 0
    for k in sorted(tensors):
        b = np.ascontiguousarray(tensors[k], dtype=np.float32).tobytes()
        header[k] = {"dtype": "F32", "shape": list(tensors[k].shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def dequantize_dir(src, dst):
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    tensors = {}
    for fn in sorted(os.listdir(src)):
        if fn.endswith(".safetensors"):
            tensors.update(_read(os.path.join(src, fn)))
    dense = dequantize(tensors, cfg.pop("quantization_config"))
    os.makedirs(dst, exist_ok=True)
    _write(os.path.join(dst, "model.safetensors"), dense)
    cfg["torch_dtype"] = "float32"
    cfg.pop("dtype", None)
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    dequantize_dir(sys.argv[1], sys.argv[2])
