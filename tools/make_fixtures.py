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
Each fixture's seed is --seed plus its index in FIXTURES, so --only (a comma
list of names) regenerates some without changing the others: new fixtures go
at the end of the list.
A MoE checkpoint is stored in the layout of the published checkpoints
(per-expert w1/w2/w3 under block_sparse_moe) whatever layout this
transformers version saves, and the reference is computed from it.

    python3 tools/make_fixtures.py [--out tests/fixtures/models] [--seed 1234] [--only qwen3,gemma2]

FP8 weights (issue 16): --fp8 writes llama3_fp8, llama3_ct_tensor and
llama3_ct_channel from the llama3 fixture with our own quantizer, referenced
by an independent dequantizer and the pure-torch forward (tools/fp8_fixtures.py;
numpy and torch only, no transformers):

    /usr/bin/python3 tools/make_fixtures.py --fp8

Interventions (issue 14): every new fixture's reference.json also gets a
"trace" entry (see trace_reference); --add-trace adds it to the fixtures
already in --out without touching their weights or other references:

    python3 tools/make_fixtures.py --add-trace [--only llama3,gemma2]

4-bit weights (issue 16): --quant writes llama_awq and llama_gptq instead, a
tiny Llama quantized by our own quantizer and stored in the AWQ and GPTQ
layouts, its reference from an independent dequantizer and a plain fp32
forward (tools/quant_fixtures.py; numpy and torch only):

    python3 tools/make_fixtures.py --quant [--out tests/fixtures/models] [--seed 4242]
"""
import argparse
import json
import os
import shutil

import inspect
import re
import sys
import traceback

if __name__ == "__main__" and "--quant" in sys.argv:  # the 4-bit fixtures need no transformers
    sys.argv.remove("--quant")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from quant_fixtures import main as quant_main
    quant_main()
    sys.exit(0)

import torch

try:
    import transformers
    from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig,
                              MixtralConfig, Phi3Config, Qwen2Config, Qwen3Config)
except ImportError:  # --fp8 needs only numpy and torch
    transformers = AutoModelForCausalLM = Gemma2Config = Gemma3TextConfig = LlamaConfig = None
    MistralConfig = MixtralConfig = Phi3Config = Qwen2Config = Qwen3Config = None

N_PROMPT = 11
N_GREEDY = 24
# Fixtures whose prompt is longer: phi3_longctx's exceeds its
# original_max_position_embeddings (32), so transformers rotates the whole
# sequence with the long factors (and djinn's session of 64 positions does).
PROMPT_LEN = {"phi3_longctx": 40}

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
    # ---- issue 12: the architectures beyond the Llama family ----
    ("qwen3", Qwen3Config, dict(vocab_size=352, num_key_value_heads=2, head_dim=32, rope_theta=1000000.0,
                                tie_word_embeddings=True, use_sliding_window=False, attention_bias=False,
                                bos_token_id=None, eos_token_id=2), torch.float32, None),
    ("gemma2", Gemma2Config, dict(vocab_size=320, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                                  hidden_act=None, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                                  query_pre_attn_scalar=24, sliding_window=8, attn_logit_softcapping=5.0,
                                  final_logit_softcapping=8.0, tie_word_embeddings=True,
                                  layer_types=["sliding_attention", "full_attention"],
                                  pad_token_id=0, bos_token_id=2, eos_token_id=1), torch.float32, None),
    ("gemma3", Gemma3TextConfig, dict(vocab_size=288, num_hidden_layers=3, num_key_value_heads=1, head_dim=16,
                                      hidden_act=None, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                                      query_pre_attn_scalar=16, sliding_window=8, tie_word_embeddings=True,
                                      layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                      ROPE_PER_LAYER_TYPE=dict(
                                          full_attention=dict(rope_type="linear", factor=2.0, rope_theta=1000000.0),
                                          sliding_attention=dict(rope_type="default", rope_theta=10000.0)),
                                      pad_token_id=0, bos_token_id=2, eos_token_id=1), torch.bfloat16, None),
    ("phi3", Phi3Config, dict(vocab_size=336, num_key_value_heads=2, rope_theta=10000.0, partial_rotary_factor=0.5,
                              tie_word_embeddings=False, sliding_window=None, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2), torch.float32, None),
    ("phi3_longrope", Phi3Config, dict(vocab_size=304, num_key_value_heads=4, rope_theta=10000.0,
                                       original_max_position_embeddings=64,
                                       rope_scaling=dict(rope_type="longrope",
                                                         short_factor=[1.0, 1.05, 1.2, 1.5, 2.0, 3.0, 4.5, 6.0],
                                                         long_factor=[1.0, 1.5, 2.5, 4.0, 6.0, 9.0, 12.0, 16.0]),
                                       tie_word_embeddings=False, sliding_window=None, pad_token_id=0,
                                       bos_token_id=1, eos_token_id=2), torch.bfloat16, None),
    ("mixtral", MixtralConfig, dict(vocab_size=320, intermediate_size=48, num_key_value_heads=2,
                                    num_local_experts=8, num_experts_per_tok=2, rope_theta=1000000.0,
                                    sliding_window=None, router_jitter_noise=0.0, tie_word_embeddings=False,
                                    bos_token_id=1, eos_token_id=2), torch.bfloat16, None),
    # longrope's long factors: a prompt past original_max_position_embeddings (PROMPT_LEN)
    ("phi3_longctx", Phi3Config, dict(vocab_size=296, num_key_value_heads=2, rope_theta=10000.0,
                                      original_max_position_embeddings=32,
                                      rope_scaling=dict(rope_type="longrope",
                                                        short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.2, 4.0],
                                                        long_factor=[1.0, 2.0, 3.5, 5.0, 8.0, 12.0, 18.0, 24.0]),
                                      tie_word_embeddings=False, sliding_window=None, pad_token_id=0,
                                      bos_token_id=1, eos_token_id=2), torch.bfloat16, None),
]

# Gemma stores RMSNorm weights as w in x * (1 + w): their spread is around 0.
ZERO_CENTRED_NORMS = ("gemma2", "gemma3")


def randomise(model, gen, norm_offset=0.5):
    """Give every parameter a non-trivial value: matrices ~ N(0, 1/fan_in) * 1.5,
    norm weights U(0.5, 1.5) (U(-0.5, 0.5) with norm_offset -0.5), biases
    N(0, 0.2), embeddings N(0, 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + norm_offset)
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


def _decoder(model):
    """The decoder stack (LlamaModel...) under a *ForCausalLM."""
    return model.model


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def trace_reference(model, prompt, seed):
    """What djinn's traces are checked against (python/tests/test_trace.py),
    from transformers itself on the prompt:
      hidden_states: output_hidden_states - [L+1][n][hidden]: entry i < L is
        layers.{i}.input, entry L final_norm.output;
      attn_output, mlp_output: [L][n][hidden], forward hooks' outputs of
        layers[i].self_attn and layers[i].mlp (block_sparse_moe where that is
        the name): layers.{i}.attn.output / layers.{i}.mlp.output;
      steer: {"layer", "vector" [hidden], "last_logits" [vocab]}: a forward
        hook adding the vector to layers[layer]'s output (every position) -
        djinn's `t.layers[layer].output += vector`."""
    dec = _decoder(model)
    layers = dec.layers
    ids = torch.tensor([prompt])
    attn, mlp, handles = {}, {}, []
    for i, layer in enumerate(layers):
        block = layer.mlp if hasattr(layer, "mlp") else layer.block_sparse_moe
        handles.append(layer.self_attn.register_forward_hook(
            lambda mod, inp, out, i=i: attn.__setitem__(i, _first(out)[0].clone())))
        handles.append(block.register_forward_hook(lambda mod, inp, out, i=i: mlp.__setitem__(i, _first(out)[0].clone())))
    try:
        out = model(ids, output_hidden_states=True, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    hs = [h[0] for h in out.hidden_states]
    gen = torch.Generator().manual_seed(seed)
    vec = torch.randn(model.config.hidden_size, generator=gen) * 2.0
    layer = 0

    def add(mod, inp, out):
        if isinstance(out, tuple):
            return (out[0] + vec,) + tuple(out[1:])
        return out + vec
    h = layers[layer].register_forward_hook(add)
    try:
        steered = model(ids, use_cache=False).logits[0, -1]
    finally:
        h.remove()
    rows = lambda t: [[float(x) for x in r] for r in t]  # noqa: E731
    return {"hidden_states": [rows(t) for t in hs],
            "attn_output": [rows(attn[i]) for i in range(len(layers))],
            "mlp_output": [rows(mlp[i]) for i in range(len(layers))],
            "steer": {"layer": layer, "vector": [float(x) for x in vec],
                      "last_logits": [float(x) for x in steered]}}


def add_trace(args, i, name):
    d = os.path.join(args.out, name)
    path = os.path.join(d, "reference.json")
    with open(path) as f:
        ref = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ref["trace"] = trace_reference(model, ref["prompt_ids"], args.seed + i)
    with open(path, "w") as f:
        json.dump(ref, f)
    print(f"{name}: trace reference added ({len(ref['trace']['hidden_states'])} hidden states)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/models")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    ap.add_argument("--add-trace", action="store_true",
                    help="add the interventions' reference to the existing fixtures (weights untouched)")
    ap.add_argument("--fp8", action="store_true",
                    help="write the FP8 fixtures (tools/fp8_fixtures.py) from the llama3 fixture; no transformers")
    args = ap.parse_args()
    if args.fp8:
        import fp8_fixtures
        fp8_fixtures.make(args.out)
        return
    if transformers is None:
        sys.exit("make_fixtures.py: transformers is needed (only --fp8 runs without it)")
    names = [f[0] for f in FIXTURES]
    only = [n for n in args.only.split(",") if n]
    for n in only:
        if n not in names:
            sys.exit(f"--only: no fixture named {n!r} (known: {', '.join(names)})")
    torch.manual_seed(args.seed)
    failed = []
    for i, fx in enumerate(FIXTURES):
        if only and fx[0] not in only:
            continue
        try:
            if args.add_trace:
                add_trace(args, i, fx[0])
            else:
                make_one(args, i, *fx)
        except Exception:  # one broken fixture must not hide the others' results
            traceback.print_exc()
            failed.append(fx[0])
    if failed:
        sys.exit(f"FAILED: {', '.join(failed)}")


def config_kwargs(cls, kw):
    """Legacy (4.x) or rope_parameters (5.x) spelling of the RoPE settings,
    whichever this transformers' config class takes."""
    kw = {k: v for k, v in kw.items() if v is not None or k not in ("hidden_act",)}
    per_type = kw.pop("ROPE_PER_LAYER_TYPE", None)
    takes_params = "rope_parameters" in inspect.signature(cls.__init__).parameters
    if per_type is not None:  # Gemma 3: global and local RoPE
        if takes_params:
            kw.pop("rope_theta", None)
            kw["rope_parameters"] = per_type
        else:
            g, loc = per_type["full_attention"], per_type["sliding_attention"]
            kw["rope_theta"] = g["rope_theta"]
            kw["rope_local_base_freq"] = loc["rope_theta"]
            if g["rope_type"] != "default":
                kw["rope_scaling"] = {k: v for k, v in g.items() if k != "rope_theta"}
    elif takes_params and "rope_scaling" in kw:
        rp = dict(kw.pop("rope_scaling"))
        rp["rope_theta"] = kw.pop("rope_theta", 10000.0)
        if "original_max_position_embeddings" in kw:
            rp["original_max_position_embeddings"] = kw["original_max_position_embeddings"]
        kw["rope_parameters"] = rp
    if takes_params and "partial_rotary_factor" in kw:  # 5.x may read it from either place
        rp = kw.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": kw.pop("rope_theta", 10000.0)})
        rp["partial_rotary_factor"] = kw["partial_rotary_factor"]
    return kw


def to_published_moe_layout(d, cfg):
    """Rewrite fused expert tensors (mlp.experts.gate_up_proj [E, 2F, D] or
    [E, D, 2F], mlp.experts.down_proj [E, D, F] or [E, F, D], mlp.gate) into
    the per-expert layout of the published Mixtral checkpoints:
    block_sparse_moe.gate.weight, block_sparse_moe.experts.<e>.w1/w2/w3.weight
    ([F, D], [D, F], [F, D]). Files already in that layout are left alone."""
    from safetensors.torch import load_file, save_file
    files = [f for f in os.listdir(d) if f.endswith(".safetensors")]
    assert len(files) == 1, files
    path = os.path.join(d, files[0])
    sd = load_file(path)
    if not any(".mlp.experts." in k or ".mlp.gate." in k for k in sd):
        return False
    F, D, E = cfg.intermediate_size, cfg.hidden_size, cfg.num_local_experts
    out = {}
    for k, t in sd.items():
        m = re.match(r"(model\.layers\.\d+)\.mlp\.(.*)$", k)
        if not m:
            out[k] = t
            continue
        pre, rest = m.group(1) + ".block_sparse_moe", m.group(2)
        if rest == "gate.weight":
            out[f"{pre}.gate.weight"] = t
        elif rest in ("experts.gate_up_proj", "experts.gate_up_proj.weight"):
            assert t.shape[0] == E
            if tuple(t.shape[1:]) == (D, 2 * F):
                t = t.transpose(1, 2)
            assert tuple(t.shape[1:]) == (2 * F, D), t.shape
            for e in range(E):
                out[f"{pre}.experts.{e}.w1.weight"] = t[e, :F].contiguous()
                out[f"{pre}.experts.{e}.w3.weight"] = t[e, F:].contiguous()
        elif rest in ("experts.down_proj", "experts.down_proj.weight"):
            assert t.shape[0] == E
            if tuple(t.shape[1:]) == (F, D):
                t = t.transpose(1, 2)
            assert tuple(t.shape[1:]) == (D, F), t.shape
            for e in range(E):
                out[f"{pre}.experts.{e}.w2.weight"] = t[e].contiguous()
        else:
            raise RuntimeError(f"unexpected MoE tensor {k} {tuple(t.shape)}")
    os.remove(path)
    for f in os.listdir(d):
        if f.endswith(".index.json"):
            os.remove(os.path.join(d, f))
    save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    return True


def make_one(args, i, name, cls, over, dtype, shard):
    gen = torch.Generator().manual_seed(args.seed + i)
    kw = dict(COMMON)
    kw.update(over)
    kw = config_kwargs(cls, kw)
    cfg = cls(**kw)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    randomise(model, gen, -0.5 if name in ZERO_CENTRED_NORMS else 0.5)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    d = os.path.join(args.out, name)
    shutil.rmtree(d, ignore_errors=True)
    model.to(dtype).save_pretrained(d, safe_serialization=True,
                                    **({"max_shard_size": shard} if shard else {}))
    if getattr(cfg, "num_local_experts", None):
        print(f"{name}: rewritten to the per-expert layout: {to_published_moe_layout(d, cfg)}")
    # Reference from the stored weights, upcast to fp32.
    ref_model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                     attn_implementation="eager")
    ref_model.eval()
    prompt = torch.randint(3, cfg.vocab_size, (PROMPT_LEN.get(name, N_PROMPT),), generator=gen).tolist()
    last, greedy, full, margin, step_logits = reference(ref_model, prompt)
    # The cached decode path and the full recompute must agree.
    drift = float((full - step_logits).abs().max() / full.abs().max())
    ref = {"name": name, "architecture": type(ref_model).__name__,
           "stored_dtype": str(dtype).replace("torch.", ""),
           "transformers_version": transformers.__version__, "torch_version": torch.__version__,
           "seed": args.seed + i, "prompt_ids": prompt,
           "last_logits": [float(x) for x in last], "greedy": greedy,
           "final_logits": [float(x) for x in full], "min_margin": margin,
           "cache_vs_full_rel_diff": drift, "trace": trace_reference(ref_model, prompt, args.seed + i)}
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
    from safetensors import safe_open
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), "pt") as st:
                for k in list(st.keys())[:40]:
                    print(f"  {f}: {k} {tuple(st.get_slice(k).get_shape())}")


if __name__ == "__main__":
    main()
