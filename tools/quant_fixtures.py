#!/usr/bin/env python3
"""quant_fixtures.py: 4-bit fixtures (issue 16) - a tiny Llama quantized by our
own group-wise quantizer and stored in the AWQ (GEMM) and GPTQ (v1) layouts
as HF dirs hold them, with references computed from an independent
dequantizer and a plain fp32 torch forward (W4A16 semantics: the dequantized
weights in fp32, activations in fp32).

Needs only numpy and torch (no transformers, no safetensors package): run by
tools/make_fixtures.py --quant, or alone:

    python3 tools/quant_fixtures.py [--out tests/fixtures/models] [--seed 4242]
    python3 tools/quant_fixtures.py --check-forward   # our forward vs transformers' tinyllama reference

Layouts written (K in features, N out features, G = 128):
  GPTQ: qweight [K/8, N] int32, input k = 8i+t in bits 4t of word (i, n);
        qzeros [K/G, N/8] int32, out feature 8j+t in bits 4t, stored as zero-1;
        scales [K/G, N] f16; g_idx [K] int32 = k // G.
  AWQ:  qweight [K, N/8] and qzeros [K/G, N/8] int32, out feature 8j+c in the
        nibble AWQ_ORDER.index(c) (columns packed in the order 0,2,4,6,1,3,5,7);
        scales [K/G, N] f16; zero stored as is.
The packers and the dequantizer below are written separately on purpose: the
reference reads the files back through the dequantizer only.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

G = 128
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
N_PROMPT = 11
N_GREEDY = 24

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=128, intermediate_size=256,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256,
              max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu",
              tie_word_embeddings=False, attention_bias=False, mlp_bias=False, bos_token_id=1, eos_token_id=2,
              torch_dtype="float16")

QUANT = {
    "awq": dict(quant_method="awq", bits=4, group_size=G, zero_point=True, version="gemm",
                modules_to_not_convert=None),
    "gptq": dict(quant_method="gptq", bits=4, group_size=G, desc_act=False, sym=False, true_sequential=True,
                 checkpoint_format="gptq", damp_percent=0.01, static_groups=False),
}

LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


# ---- safetensors, read and written by hand ----

ST_DTYPES = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
ST_NP = {v: k for k, v in ST_DTYPES.items()}


def save_safetensors(path, tensors):
    header, off, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": ST_DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=ST_NP[e["dtype"]]).reshape(e["shape"])
    return out


# ---- quantizer (ours) and the two packers ----

def quantize(w):
    """w [N, K] fp32 -> codes [N, K] uint8 (0..15), zeros [N, K/G] int (0..15),
    scales [N, K/G] f16: asymmetric min/max per group of G inputs."""
    n, k = w.shape
    g = w.reshape(n, k // G, G)
    lo, hi = np.minimum(g.min(-1), 0), np.maximum(g.max(-1), 0)
    scales = ((hi - lo) / 15).astype(np.float16)
    scales[scales == 0] = np.float16(1e-3)
    s = scales.astype(np.float32)
    zeros = np.clip(np.round(-lo / s), 0, 15).astype(np.int64)
    codes = np.clip(np.round(g / s[..., None]) + zeros[..., None], 0, 15).astype(np.uint8)
    return codes.reshape(n, k), zeros, scales


def pack_gptq(codes, zeros, scales):
    n, k = codes.shape
    c = codes.T.astype(np.uint32).reshape(k // 8, 8, n)              # [K/8, t, N]
    qweight = np.zeros((k // 8, n), np.uint32)
    for t in range(8):
        qweight |= c[:, t, :] << (4 * t)
    z = (zeros.T - 1).astype(np.int64) & 15                          # v1 format: zero - 1 (wraps at 0 as it does there)
    z = z.astype(np.uint32).reshape(k // G, n // 8, 8)
    qzeros = np.zeros((k // G, n // 8), np.uint32)
    for t in range(8):
        qzeros |= z[:, :, t] << (4 * t)
    g_idx = (np.arange(k) // G).astype(np.int32)
    return {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32),
            "scales": np.ascontiguousarray(scales.T), "g_idx": g_idx}


def pack_awq(codes, zeros, scales):
    def pack_cols(m):  # m [R, N] -> [R, N/8], column 8j + AWQ_ORDER[i] in nibble i
        r, n = m.shape
        m = m.astype(np.uint32).reshape(r, n // 8, 8)
        out = np.zeros((r, n // 8), np.uint32)
        for i in range(8):
            out |= m[:, :, AWQ_ORDER[i]] << (4 * i)
        return out.view(np.int32)
    return {"qweight": pack_cols(codes.T), "qzeros": pack_cols(zeros.T), "scales": np.ascontiguousarray(scales.T)}


# ---- the independent dequantizer: stored layout -> dense fp32 [N, K] ----

def unpack_nibbles(words):
    """int32 [..., W] -> [..., W, 8]: nibble t of each word at index t."""
    u = words.view(np.uint32)[..., None] >> (np.arange(8, dtype=np.uint32) * 4)
    return (u & 15).astype(np.int64)


def dequant(method, sd, p):
    qw, qz, sc = sd[p + ".qweight"], sd[p + ".qzeros"], sd[p + ".scales"].astype(np.float32)
    if method == "gptq":
        k = qw.shape[0] * 8
        w = unpack_nibbles(qw.T).reshape(qw.shape[1], k)             # [N, K]: word i nibble t -> k = 8i+t
        z = unpack_nibbles(qz).reshape(qz.shape[0], -1) + 1          # [K/G, N]
        gi = sd[p + ".g_idx"].astype(np.int64)
        assert (gi == np.arange(k) // G).all()
    else:
        inv = np.argsort(AWQ_ORDER)                                  # column c lives in nibble inv[c]
        w = unpack_nibbles(qw)[..., inv].reshape(qw.shape[0], -1).T  # [N, K]
        z = unpack_nibbles(qz)[..., inv].reshape(qz.shape[0], -1)    # [K/G, N]
        k = qw.shape[0]
    zs = np.repeat(z.T, G, axis=1)                                   # [N, K]
    ss = np.repeat(sc.T, G, axis=1)
    return ((w - zs).astype(np.float32) * ss).astype(np.float32)


# ---- a plain fp32 Llama forward (default or linear RoPE, GQA, SiLU MLP) ----

def rms(x, w, eps):  # in fp32, the result in x's dtype (as transformers' bf16 runs do)
    y = x.float()
    return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def forward(cfg, W, ids):
    """Logits [T, V] of the whole sequence ids (a full recompute), in W's dtype
    (norms and softmax in fp32)."""
    d, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // nh
    eps = cfg["rms_norm_eps"]
    T = len(ids)
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    if rp.get("rope_type", "default") == "linear":
        inv = inv / rp["factor"]
    elif rp.get("rope_type", "default") != "default":
        raise ValueError(f"rope_type {rp['rope_type']} is not in this forward")
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    dt = W["model.embed_tokens.weight"].dtype
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(dt), torch.cat([ang.sin()] * 2, -1).to(dt)

    def rope(x):  # [h, T, hd]
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = W["model.embed_tokens.weight"][torch.tensor(ids)]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        h = rms(x, W[pre + "input_layernorm.weight"], eps)
        q = (h @ W[pre + "self_attn.q_proj.weight"].T).view(T, nh, hd).transpose(0, 1)
        k = (h @ W[pre + "self_attn.k_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
        v = (h @ W[pre + "self_attn.v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
        a = torch.softmax((q @ k.transpose(1, 2)).float() / hd ** 0.5 + mask, -1).to(dt) @ v
        x = x + a.transpose(0, 1).reshape(T, nh * hd) @ W[pre + "self_attn.o_proj.weight"].T
        h = rms(x, W[pre + "post_attention_layernorm.weight"], eps)
        g = torch.nn.functional.silu(h @ W[pre + "mlp.gate_proj.weight"].T) * (h @ W[pre + "mlp.up_proj.weight"].T)
        x = x + g @ W[pre + "mlp.down_proj.weight"].T
    x = rms(x, W["model.norm.weight"], eps)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    return x @ head.T


@torch.no_grad()
def reference(cfg, W, prompt):
    last = forward(cfg, W, prompt)[-1]
    seq, logits, margin = list(prompt), last, float("inf")
    greedy = []
    for _ in range(N_GREEDY):
        top = torch.topk(logits, 2).values
        margin = min(margin, float(top[0] - top[1]))
        t = int(torch.argmax(logits))
        greedy.append(t)
        seq.append(t)
        logits = forward(cfg, W, seq)[-1]
    return last, greedy, logits, margin


def dense_weights(method, sd):
    """Every tensor as fp32 torch, the 4-bit linears through the dequantizer."""
    W = {}
    for name, a in sd.items():
        if name.endswith(".qweight"):
            p = name[:-len(".qweight")]
            W[p + ".weight"] = torch.from_numpy(dequant(method, sd, p))
        elif not name.endswith((".qzeros", ".scales", ".g_idx")):
            W[name] = torch.from_numpy(a.astype(np.float32))
    return W


def make(out, method, seed):
    rng = np.random.default_rng(seed)
    cfg = dict(CONFIG)
    d, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    qd, kvd = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"self_attn.q_proj": (qd, d), "self_attn.k_proj": (kvd, d), "self_attn.v_proj": (kvd, d),
              "self_attn.o_proj": (d, qd), "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d), "mlp.down_proj": (d, f)}
    sd = {"model.embed_tokens.weight": rng.standard_normal((V, d)).astype(np.float16),
          "lm_head.weight": (rng.standard_normal((V, d)) * 1.5 / d ** 0.5).astype(np.float16),
          "model.norm.weight": (rng.random(d) + 0.5).astype(np.float16)}
    pack = pack_gptq if method == "gptq" else pack_awq
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        sd[pre + "input_layernorm.weight"] = (rng.random(d) + 0.5).astype(np.float16)
        sd[pre + "post_attention_layernorm.weight"] = (rng.random(d) + 0.5).astype(np.float16)
        for lin in LINEARS:
            n, k = shapes[lin]
            w = (rng.standard_normal((n, k)) * 1.5 / k ** 0.5).astype(np.float32)
            for part, a in pack(*quantize(w)).items():
                sd[f"{pre}{lin}.{part}"] = a
    cfg["quantization_config"] = QUANT[method]
    name = f"llama_{method}"
    dd = os.path.join(out, name)
    os.makedirs(dd, exist_ok=True)
    for fn in os.listdir(dd):
        os.remove(os.path.join(dd, fn))
    with open(os.path.join(dd, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    save_safetensors(os.path.join(dd, "model.safetensors"), sd)
    # the reference reads the files back
    sd = load_safetensors(os.path.join(dd, "model.safetensors"))
    W = dense_weights(method, sd)
    prompt = [int(x) for x in rng.integers(3, V, N_PROMPT)]
    last, greedy, final, margin = reference(cfg, W, prompt)
    ref = {"name": name, "architecture": "LlamaForCausalLM", "stored_dtype": f"{method} 4-bit, float16",
           "reference": "tools/quant_fixtures.py: dequantized in fp32, own torch forward", "torch_version":
           torch.__version__, "seed": seed, "prompt_ids": prompt, "last_logits": [float(x) for x in last],
           "greedy": greedy, "final_logits": [float(x) for x in final], "min_margin": margin}
    with open(os.path.join(dd, "reference.json"), "w") as fh:
        json.dump(ref, fh)
    size = sum(os.path.getsize(os.path.join(dd, fn)) for fn in os.listdir(dd))
    print(f"{name}: {size / 1024:.0f} KB, greedy={greedy[:8]}..., min margin {margin:.4f}")


def check_forward(models):
    """Our forward on transformers' tinyllama fixture (f16, linear RoPE, one KV head)."""
    d = os.path.join(models, "tinyllama")
    cfg = json.load(open(os.path.join(d, "config.json")))
    ref = json.load(open(os.path.join(d, "reference.json")))
    W = {k: torch.from_numpy(v.astype(np.float32)) for k, v in load_safetensors(os.path.join(d, "model.safetensors")).items()}
    with torch.no_grad():
        last = forward(cfg, W, ref["prompt_ids"])[-1]
        full = forward(cfg, W, ref["prompt_ids"] + ref["greedy"])[-1]
    e1 = float((last - torch.tensor(ref["last_logits"])).abs().max() / torch.tensor(ref["last_logits"]).abs().max())
    e2 = float((full - torch.tensor(ref["final_logits"])).abs().max() / torch.tensor(ref["final_logits"]).abs().max())
    print(f"our forward vs transformers on tinyllama: rel err {e1:.2e} (prompt), {e2:.2e} (after greedy)")
    if max(e1, e2) > 1e-5:
        sys.exit("our forward disagrees with transformers")


@torch.no_grad()
def yardstick(models, path):
    """The bf16 yardstick of the 4-bit fixtures (tests/gpu/gpu_models.c holds
    the CUDA path to 1.25x it, or 1e-2): the same dequantized weights and
    forward in bf16 against the fp32 reference, merged into path."""
    out = json.load(open(path)) if os.path.exists(path) else {"cases": {}}
    for m in ("awq", "gptq"):
        name = "llama_" + m
        d = os.path.join(models, name)
        cfg = json.load(open(os.path.join(d, "config.json")))
        ref = json.load(open(os.path.join(d, "reference.json")))
        W = {k: v.bfloat16() for k, v in dense_weights(m, load_safetensors(os.path.join(d, "model.safetensors"))).items()}
        last = forward(cfg, W, ref["prompt_ids"])[-1].double()
        final = forward(cfg, W, ref["prompt_ids"] + ref["greedy"])[-1].double()
        c = {}
        for key, a, b in (("last", last, ref["last_logits"]), ("final", final, ref["final_logits"])):
            b = torch.tensor(b, dtype=torch.float64)
            c[key + "_l2"] = float((a - b).norm() / b.norm())
            c[key + "_maxabs"] = float((a - b).abs().max() / b.abs().max())
        c["by"] = "tools/quant_fixtures.py --yardstick (its forward in bf16, torch %s CPU)" % torch.__version__
        out["cases"][name] = c
        print("%s bf16: prompt logits %.2e, final logits %.2e" % (name, c["last_l2"], c["final_l2"]))
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


def self_test(seed=7):
    """The dequantizer inverts both packers exactly."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((24, 256)).astype(np.float32)
    codes, zeros, scales = quantize(w)
    want = ((codes.astype(np.float32) - np.repeat(zeros, G, 1)) * np.repeat(scales.astype(np.float32), G, 1))
    for m, pk in (("gptq", pack_gptq), ("awq", pack_awq)):
        sd = {"x." + k: v for k, v in pk(codes, zeros, scales).items()}
        assert np.array_equal(dequant(m, sd, "x"), want), m
    assert np.abs(want - w).max() <= scales.astype(np.float32).max()  # quantization error within a step


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/models")
    ap.add_argument("--seed", type=int, default=4242)
    ap.add_argument("--check-forward", action="store_true")
    ap.add_argument("--yardstick", metavar="JSON", help="write the fixtures' bf16 yardstick into JSON "
                    "(tests/fixtures/bf16_yardstick.json) and stop")
    args = ap.parse_args(argv)
    self_test()
    if args.check_forward:
        check_forward(args.out)
        return
    if args.yardstick:
        yardstick(args.out, args.yardstick)
        return
    for i, m in enumerate(("awq", "gptq")):
        make(args.out, m, args.seed + i)


if __name__ == "__main__":
    main()
