#!/usr/bin/env python3
"""train_demo_model.py: trains the small Llama model that ships with Djinn, from
scratch, on the manual-page corpus built by make_corpus.py, within a wall-clock
budget, and writes everything the engine's tests and docs need.

Runs on the GPU machine (PyTorch, transformers, tokenizers; no network):

    python3 tools/train_demo_model.py --corpus build-corpus/corpus.txt.gz --out build-demo --minutes 8

Steps (all inside --minutes, counted from the start of the script):
 1. split the corpus: every 50th document is held out (demo_corpus.train_heldout);
 2. train a byte-level BPE tokenizer (4096 tokens, <|bos|>=0, <|eos|>=1, BOS added
    by a TemplateProcessing post-processor) on the training documents;
 3. train a LlamaForCausalLM (MODEL below) on [<|bos|> doc <|eos|>]* packed into
    --ctx windows, bf16 autocast, AdamW, warm-up + cosine; the number of steps is
    fixed after timing the first steps so that training ends --reserve seconds
    before the budget (or given with --steps); held-out loss every --eval-every steps;
 4. save the weights of the best held-out evaluation in bf16 (HF layout), reload
    them from disk in fp32 on the CPU (eager attention) and from that compute the
    final held-out loss, samples from fixed prompts and the engine's reference.

OUT gets: config.json, model.safetensors, generation_config.json, tokenizer.json,
tokenizer_config.json (the model directory to ship), and reference.json,
refs_demo.json (tokenizer references), loss_curve.json, loss_curve.md,
samples.json, report.json, report.md.
"""
import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import demo_corpus as dc  # noqa: E402

VOCAB = 4096
BOS, EOS = "<|bos|>", "<|eos|>"
MODEL = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=8,
             num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
             rms_norm_eps=1e-5, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=True,
             attention_bias=False, mlp_bias=False, bos_token_id=0, eos_token_id=1)
GENERATION = dict(bos_token_id=0, eos_token_id=1, pad_token_id=1, do_sample=True, temperature=0.8,
                  top_p=0.95, max_new_tokens=256)
PROMPTS = [
    "NAME\n  grep - ",
    "NAME\n  ls - list directory contents\n\nSYNOPSIS\n",
    "DESCRIPTION\n  The ",
    "SYNOPSIS\n  #include <stdio.h>\n\n  int ",
    "  -v, --verbose\n    ",
    "RETURN VALUE\n  On success, ",
    "EXAMPLES\n  To ",
    "The following options are supported:\n",
]
REFERENCE_PROMPT = "NAME\n  tar - an archiving utility\n\nSYNOPSIS\n"
# Strings for the tokenizer references, beyond tests/fixtures/tokenizer/strings.json.
EXTRA_STRINGS = [
    "<|bos|>Hello<|eos|> with our own special tokens<|bos|>",
    "NAME\n  ls - list directory contents\n\nSYNOPSIS\n  ls [OPTION]... [FILE]...\n",
    "  -r, --recursive\n    read all files under each directory, recursively\n",
    "int open(const char *pathname, int flags, mode_t mode);",
]
SAMPLE_TOKENS = 64


def param_count(m):
    """Parameters of a Llama config given as a dict (tied embeddings count once)."""
    h, i, layers, v = m["hidden_size"], m["intermediate_size"], m["num_hidden_layers"], m["vocab_size"]
    hd = h // m["num_attention_heads"]
    kv = m["num_key_value_heads"] * hd
    attn = h * h * 2 + h * kv * 2
    mlp = 3 * h * i
    per_layer = attn + mlp + 2 * h
    emb = v * h * (1 if m["tie_word_embeddings"] else 2)
    return emb + layers * per_layer + h


def lr_at(step, total, warmup, peak, floor):
    """Learning rate at 0-based step: linear warm-up to peak over `warmup` steps,
    then cosine down to peak*floor at `total` and flat after."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p)))


def log(t0, msg):
    print(f"[{time.time() - t0:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------- tokenizer

def train_tokenizer(docs, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, 0)])
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    tok = Tokenizer.from_file(path)  # use exactly what ships
    if tok.token_to_id(BOS) != 0 or tok.token_to_id(EOS) != 1 or tok.get_vocab_size() != VOCAB:
        raise SystemExit(f"tokenizer: unexpected special ids or vocab size {tok.get_vocab_size()}")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
                   "pad_token": EOS, "add_bos_token": True, "model_max_length": MODEL["max_position_embeddings"]},
                  f, indent=1)
    return tok


def write_tokenizer_refs(tok, out_dir):
    import tokenizers
    with open(os.path.join(HERE, "..", "tests", "fixtures", "tokenizer", "strings.json"), encoding="utf-8") as f:
        strings = json.load(f) + EXTRA_STRINGS
    cases = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False).ids
        ids_sp = tok.encode(s, add_special_tokens=True).ids
        cases.append({"text": s, "ids": ids, "ids_special": ids_sp,
                      "decoded": tok.decode(ids, skip_special_tokens=False)})
    out = {"tokenizer": "demo", "tokenizers_version": tokenizers.__version__, "cases": cases}
    with open(os.path.join(out_dir, "refs_demo.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
    return len(cases)


def encode_stream(tok, docs):
    """[<|bos|> doc <|eos|>]* as an array of int32 ids."""
    from array import array
    ids = array("i")
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # _fast: no offsets, less memory
    for enc in encode(docs, add_special_tokens=False):
        ids.append(bos)
        ids.extend(enc.ids)
        ids.append(eos)
    return ids


# ---------------------------------------------------------------- model

def held_out_loss(model, windows, batch, autocast):
    """Mean next-token loss over all held-out windows ([n][ctx+1] ids on the model's device)."""
    import torch
    import torch.nn.functional as F
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, windows.shape[0], batch):
            w = windows[i:i + batch]
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=w[:, :-1]).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                   reduction="sum")
            total += float(loss)
            count += w[:, 1:].numel()
    model.train()
    return total / count


def curve_markdown(curve):
    rows = ["| step | tokens seen | elapsed s | lr | train loss | held-out loss | held-out ppl |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for c in curve:
        tl = "-" if c["train_loss"] is None else f"{c['train_loss']:.4f}"
        rows.append(f"| {c['step']} | {c['tokens']} | {c['elapsed_s']:.1f} | {c['lr']:.2e} | {tl} | "
                    f"{c['heldout_loss']:.4f} | {c['heldout_ppl']:.2f} |")
    return "\n".join(rows) + "\n"


def main():
    t0 = time.time()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True, help="corpus.txt or corpus.txt.gz from make_corpus.py")
    ap.add_argument("--out", required=True, help="output directory (created)")
    ap.add_argument("--minutes", type=float, default=8.0, help="wall-clock budget of the whole script")
    ap.add_argument("--reserve", type=float, default=75.0,
                    help="seconds of the budget kept for saving, evaluation, samples and the reference")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=0, help="fixed number of steps (0: fit the budget)")
    ap.add_argument("--batch", type=int, default=64, help="sequences per step")
    ap.add_argument("--ctx", type=int, default=MODEL["max_position_embeddings"], help="tokens per sequence")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=0, help="steps between held-out evaluations (0: ~24 in all)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model for training")
    ap.add_argument("--manifest", default=os.path.join(HERE, "demo_corpus_manifest.json"),
                    help="corpus manifest whose sha256 the corpus should match")
    args = ap.parse_args()
    deadline = t0 + args.minutes * 60.0

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig

    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    log(t0, f"torch {torch.__version__}, transformers {transformers.__version__}, "
            f"{torch.cuda.get_device_name(0)}; budget {args.minutes} min")

    # 1. corpus
    corpus_text = dc.read_corpus(args.corpus)
    corpus_sha = dc.sha256_text(corpus_text)
    docs = dc.split_docs(corpus_text)
    del corpus_text
    train_docs, held_docs = dc.train_heldout(docs)
    manifest_sha = None
    if args.manifest and os.path.exists(args.manifest):
        with open(args.manifest, encoding="utf-8") as f:
            manifest_sha = json.load(f).get("corpus_sha256")
    match = manifest_sha == corpus_sha
    log(t0, f"corpus: {len(docs)} documents ({len(held_docs)} held out), sha256 {corpus_sha[:16]}... "
            f"{'matches' if match else 'DOES NOT MATCH'} the manifest")

    # 2. tokenizer
    tok = train_tokenizer(train_docs, args.out)
    n_refs = write_tokenizer_refs(tok, args.out)
    log(t0, f"tokenizer: {tok.get_vocab_size()} tokens, {n_refs} reference strings")
    train_ids = encode_stream(tok, train_docs)
    held_ids = encode_stream(tok, held_docs)
    train_bytes = sum(len(d.encode("utf-8")) for d in train_docs)
    log(t0, f"tokens: train {len(train_ids)} ({train_bytes / len(train_ids):.2f} bytes/token), "
            f"held-out {len(held_ids)}")
    train_t = torch.frombuffer(train_ids, dtype=torch.int32).to(dev).long()
    held_t = torch.frombuffer(held_ids, dtype=torch.int32).long()
    ctx = args.ctx
    n_win = (held_t.numel() - 1) // ctx
    if n_win == 0:
        raise SystemExit(f"held-out set too small: {held_t.numel()} tokens for {ctx}-token windows")
    held_windows = torch.stack([held_t[i * ctx:i * ctx + ctx + 1] for i in range(n_win)]).to(dev)

    # 3. model and training
    cfg_kw = dict(MODEL, max_position_embeddings=ctx)
    cfg = LlamaConfig(**cfg_kw)
    model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32).to(dev)  # SDPA attention
    n_params = sum(p.numel() for p in model.parameters())
    if n_params != param_count(cfg_kw):
        raise SystemExit(f"parameter count {n_params} != expected {param_count(cfg_kw)}")
    log(t0, f"model: {n_params} parameters, {n_params * 2 / 1e6:.2f} MB in bf16")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    fwd = torch.compile(model) if args.compile else model
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    arange = torch.arange(ctx + 1, device=dev)
    tokens_per_step = args.batch * ctx
    curve, best = [], None

    def evaluate(step, lr, train_loss):
        nonlocal best
        loss = held_out_loss(model, held_windows, 64, True)
        entry = {"step": step, "tokens": step * tokens_per_step, "elapsed_s": time.time() - t0, "lr": lr,
                 "train_loss": train_loss, "heldout_loss": loss, "heldout_ppl": math.exp(loss)}
        curve.append(entry)
        if best is None or loss < best["heldout_loss"]:
            best = dict(entry, state={k: v.detach().clone() for k, v in model.state_dict().items()})
        tl = "-" if train_loss is None else f"{train_loss:.4f}"
        log(t0, f"step {step}: train {tl}, held-out {loss:.4f} (ppl {math.exp(loss):.2f}), lr {lr:.2e}")

    evaluate(0, 0.0, None)
    train_deadline = deadline - args.reserve
    total_steps = args.steps if args.steps > 0 else None
    eval_every = args.eval_every
    step, t_mark, loss_sum, loss_n = 0, None, torch.zeros((), device=dev), 0
    t_train = time.time()
    stopped_by = "steps"
    model.train()
    while total_steps is None or step < total_steps:
        if time.time() > train_deadline:
            stopped_by = "time"
            break
        lr = lr_at(step, total_steps or 10 ** 9, args.warmup, args.lr, 0.1)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train_t.numel() - ctx - 1, (args.batch,), device=dev, generator=gen)
        chunk = train_t[starts[:, None] + arange]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(input_ids=chunk[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_sum += loss.detach()
        loss_n += 1
        step += 1
        if step == 10:
            torch.cuda.synchronize()
            t_mark = time.time()
        if total_steps is None and step == 40:
            # Fix the schedule: steps 10..40 give the step time (warm-up is longer, so the lr so far is unaffected).
            torch.cuda.synchronize()
            per_step = (time.time() - t_mark) / 30
            eval_cost = 0.05 * per_step  # evaluations are small next to training; a margin for them
            total_steps = step + int((train_deadline - time.time()) / (per_step + eval_cost) * 0.97)
            total_steps = max(total_steps, step + 1)
            log(t0, f"{per_step * 1000:.1f} ms/step, {tokens_per_step / per_step:.0f} tokens/s: "
                    f"{total_steps} steps in the budget")
        if eval_every == 0 and total_steps is not None:
            eval_every = max(25, total_steps // 24)
        if eval_every and (step % eval_every == 0 or step == total_steps):
            evaluate(step, lr, float(loss_sum) / loss_n)
            loss_sum.zero_()
            loss_n = 0
    torch.cuda.synchronize()
    train_s = time.time() - t_train
    if curve[-1]["step"] != step:
        evaluate(step, lr, float(loss_sum) / max(1, loss_n))
    tok_s = step * tokens_per_step / train_s
    log(t0, f"trained {step} steps ({stopped_by}), {step * tokens_per_step} tokens in {train_s:.1f} s, "
            f"{tok_s:.0f} tokens/s; best held-out {best['heldout_loss']:.4f} at step {best['step']}")

    # 4. save the best weights in bf16
    model.load_state_dict(best.pop("state"))
    model.generation_config = GenerationConfig(**GENERATION)
    model.to(torch.bfloat16).save_pretrained(args.out, safe_serialization=True)
    shipped = ["config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
               "tokenizer_config.json"]
    size = sum(os.path.getsize(os.path.join(args.out, f)) for f in shipped)
    log(t0, f"saved {', '.join(shipped)}: {size} bytes")
    del model, fwd, opt

    # Final numbers from the weights as stored: fp32, eager attention.
    ref = AutoModelForCausalLM.from_pretrained(args.out, torch_dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    final_loss = held_out_loss(ref.to(dev), held_windows, 64, False)
    ref.to("cpu")
    log(t0, f"final held-out loss (stored bf16 weights, fp32): {final_loss:.4f}, ppl {math.exp(final_loss):.2f}")

    samples = []
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            ids = torch.tensor([tok.encode(prompt, add_special_tokens=True).ids])
            entry = {"prompt": prompt}
            for mode in ("greedy", "sampled"):
                torch.manual_seed(args.seed + i)
                gc = GenerationConfig(**dict(GENERATION, max_new_tokens=SAMPLE_TOKENS))
                if mode == "greedy":
                    gc = GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, do_sample=False,
                                          max_new_tokens=SAMPLE_TOKENS)
                out = ref.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
                new = out[0, ids.shape[1]:].tolist()
                entry[mode] = tok.decode(new, skip_special_tokens=False)
                entry[mode + "_ids"] = new
            samples.append(entry)
    with open(os.path.join(args.out, "samples.json"), "w", encoding="utf-8") as f:
        json.dump({"seed": args.seed, "max_new_tokens": SAMPLE_TOKENS, "temperature": 0.8, "top_p": 0.95,
                   "samples": samples}, f, ensure_ascii=False, indent=1)
    log(t0, f"samples: {len(samples)} prompts, greedy and sampled")

    # The engine's reference, as tools/make_fixtures.py computes it.
    from make_fixtures import reference
    prompt = tok.encode(REFERENCE_PROMPT, add_special_tokens=True).ids
    last, greedy, full, margin, step_logits = reference(ref, prompt)
    drift = float((full - step_logits).abs().max() / full.abs().max())
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"name": "demo", "architecture": "LlamaForCausalLM", "stored_dtype": "bfloat16",
                   "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                   "seed": args.seed, "prompt_text": REFERENCE_PROMPT, "prompt_ids": prompt,
                   "last_logits": [float(x) for x in last], "greedy": greedy,
                   "final_logits": [float(x) for x in full], "min_margin": margin,
                   "cache_vs_full_rel_diff": drift}, f)
    log(t0, f"reference: {len(prompt)} prompt ids, greedy {greedy[:8]}..., min margin {margin:.4f}")

    wall = time.time() - t0
    report = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
        "transformers": transformers.__version__, "seed": args.seed,
        "corpus_sha256": corpus_sha, "corpus_matches_manifest": match,
        "documents": {"train": len(train_docs), "heldout": len(held_docs)},
        "tokens": {"train": len(train_ids), "heldout": len(held_ids),
                   "train_bytes_per_token": train_bytes / len(train_ids)},
        "model": cfg_kw, "parameters": n_params, "shipped_bytes": size,
        "training": {"steps": step, "stopped_by": stopped_by, "batch": args.batch, "ctx": ctx,
                     "tokens_per_step": tokens_per_step, "tokens_seen": step * tokens_per_step,
                     "epochs": step * tokens_per_step / len(train_ids), "train_seconds": train_s,
                     "tokens_per_second": tok_s, "lr": args.lr, "warmup": args.warmup, "compile": args.compile},
        "best_eval": best,
        "final_heldout_loss": final_loss, "final_heldout_ppl": math.exp(final_loss),
        "wall_seconds": wall,
    }
    with open(os.path.join(args.out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(args.out, "loss_curve.json"), "w") as f:
        json.dump(curve, f, indent=1)
    with open(os.path.join(args.out, "loss_curve.md"), "w") as f:
        f.write(curve_markdown(curve))
    with open(os.path.join(args.out, "report.md"), "w", encoding="utf-8") as f:
        f.write(f"# Demo model training run\n\n`{report['command']}` on {report['device']}, "
                f"torch {torch.__version__}, transformers {transformers.__version__}\n\n"
                f"- parameters: {n_params} ({size} bytes shipped)\n"
                f"- steps: {step} x {tokens_per_step} tokens ({report['training']['epochs']:.1f} epochs), "
                f"{tok_s:.0f} tokens/s, stopped by {stopped_by}\n"
                f"- shipped weights: held-out evaluation at step {best['step']}\n"
                f"- final held-out loss {final_loss:.4f}, perplexity {math.exp(final_loss):.2f} "
                f"(stored bf16 weights in fp32)\n- wall time {wall:.1f} s\n\n## Loss curve\n\n"
                + curve_markdown(curve) + "\n## Samples\n\n")
        for s in samples:
            for mode in ("greedy", "sampled"):
                f.write(f"**{mode}**, prompt `{s['prompt']!r}`:\n\n```\n{s['prompt']}{s[mode]}\n```\n\n")
    log(t0, f"done in {wall:.1f} s (budget {args.minutes * 60:.0f} s)")


if __name__ == "__main__":
    main()
