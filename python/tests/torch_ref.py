"""torch_ref.py: a pure-torch forward of the Llama-family fixture models (f32,
from the stored weights) with the named points of djinn's traces - the
reference the intervention tests compare with where transformers is absent.
It is checked against the fixtures' transformers logits (reference.json)
before any hidden state is compared, so it is trusted only as far as that
check holds. Supports LlamaForCausalLM with default, linear and llama3 RoPE."""

import json
import math
import os
import struct

import numpy as np
import torch

_ST_DTYPES = {"F32": (np.float32, None), "F16": (np.float16, None), "BF16": (np.uint16, "bf16")}


def load_safetensors(path):
    """{name: f32 torch tensor} of a .safetensors file (parsed here: Debian
    has no safetensors package)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            np_dtype, kind = _ST_DTYPES[info["dtype"]]
            lo, hi = info["data_offsets"]
            f.seek(base + lo)
            a = np.frombuffer(f.read(hi - lo), dtype=np_dtype).reshape(info["shape"])
            if kind == "bf16":
                a = (a.astype(np.uint32) << 16).view(np.float32)
            out[name] = torch.from_numpy(a.astype(np.float32).copy())
        return out


class LlamaRef:
    """model = LlamaRef(folder); logits, points = model.forward(ids, edits)
    - ids: a list of token ids (one sequence, from position 0);
    - edits: {point name: [("add"|"replace", tensor [hidden] or [k, hidden])]}
      applied in order where the point is computed (a forward hook's edit;
      a [k, hidden] tensor edits the first k rows);
    - points: {name: [n, hidden] tensor} of every point (after its edits);
    - logits: [n, vocab]."""

    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        if c["architectures"] != ["LlamaForCausalLM"]:
            raise ValueError("torch_ref handles LlamaForCausalLM only, not %s" % c["architectures"])
        self.c = c
        self.L = c["num_hidden_layers"]
        self.d = c["hidden_size"]
        self.nh = c["num_attention_heads"]
        self.nkv = c.get("num_key_value_heads", self.nh)
        self.hd = c.get("head_dim") or self.d // self.nh
        self.eps = c["rms_norm_eps"]
        w = {}
        for fn in sorted(os.listdir(folder)):
            if fn.endswith(".safetensors"):
                w.update(load_safetensors(os.path.join(folder, fn)))
        self.w = w
        self.lm_head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
        self.inv_freq = self._inv_freq()

    def _inv_freq(self):
        rp = self.c.get("rope_parameters") or self.c.get("rope_scaling") or {}
        theta = rp.get("rope_theta", self.c.get("rope_theta", 10000.0))
        kind = rp.get("rope_type", "default")
        inv = 1.0 / (theta ** (torch.arange(0, self.hd, 2, dtype=torch.int64).float() / self.hd))
        if kind == "linear":
            inv = inv / rp["factor"]
        elif kind == "llama3":
            factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
            old = rp["original_max_position_embeddings"]
            low_wl, high_wl = old / lo, old / hi
            wl = 2 * math.pi / inv
            out = torch.where(wl > low_wl, inv / factor, inv)
            smooth = (old / wl - lo) / (hi - lo)
            mid = (1 - smooth) * out / factor + smooth * out
            is_mid = ~(wl < high_wl) * ~(wl > low_wl)
            inv = torch.where(is_mid, mid, out)
        elif kind != "default":
            raise ValueError("rope_type %s is not in torch_ref" % kind)
        return inv

    def _lin(self, x, name):
        """x @ W.T (+ bias where the checkpoint has one: attention_bias, mlp_bias)."""
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")
        return y if b is None else y + b

    def _norm(self, x, w):
        v = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(v + self.eps))

    def _rope(self, x, pos):
        f = torch.outer(pos.float(), self.inv_freq)
        emb = torch.cat([f, f], dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
        return x * cos + rot * sin

    @torch.no_grad()
    def forward(self, ids, edits=None):
        edits = edits or {}
        w, n = self.w, len(ids)
        points = {}

        def edit(name, x):
            for op, v in edits.get(name, ()):
                v = torch.from_numpy(np.array(v, dtype=np.float32))
                rows = v.shape[0] if v.dim() == 2 else n  # a [k, hidden] edit: the first k rows only
                x = x.clone()
                x[:rows] = x[:rows] + v if op == "add" else v.expand(rows, self.d)
            return x

        def at(name, x):
            x = edit(name, x)
            points[name] = x.clone()
            return x

        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        x = at("layers.0.input", x)
        pos = torch.arange(n)
        mask = torch.full((n, n), float("-inf")).triu(1)
        for i in range(self.L):
            p = "model.layers.%d." % i
            h = self._norm(x, w[p + "input_layernorm.weight"])
            q = self._lin(h, p + "self_attn.q_proj").view(n, self.nh, self.hd)
            k = self._lin(h, p + "self_attn.k_proj").view(n, self.nkv, self.hd)
            v = self._lin(h, p + "self_attn.v_proj").view(n, self.nkv, self.hd)
            q, k = self._rope(q, pos), self._rope(k, pos)
            rep = self.nh // self.nkv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.hd) + mask
            a = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(n, self.nh * self.hd)
            a = self._lin(a, p + "self_attn.o_proj")
            a = at("layers.%d.attn.output" % i, a)
            x = x + a
            h = self._norm(x, w[p + "post_attention_layernorm.weight"])
            g = self._lin(h, p + "mlp.gate_proj")
            u = self._lin(h, p + "mlp.up_proj")
            m = self._lin(torch.nn.functional.silu(g) * u, p + "mlp.down_proj")
            m = at("layers.%d.mlp.output" % i, m)
            x = x + m
            x = at("layers.%d.output" % i, x)
            if i + 1 < self.L:  # the same point as layers.{i}.output
                x = at("layers.%d.input" % (i + 1), x)
        x = self._norm(x, w["model.norm.weight"])
        x = at("final_norm.output", x)
        return x @ self.lm_head.T, points
