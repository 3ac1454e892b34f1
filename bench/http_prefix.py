#!/usr/bin/env python3
"""http_prefix.py: the engine prefix cache's bench (issue 13) - conversations
that share only a long system prompt, each a fresh request through djinnd's
OpenAI front end (token-id prompts: no tokenizer or chat template needed),
time to first token (client side, streamed) of each, with usage's
cached_tokens; then fresh prompts of about 100 tokens (the bar: a later
conversation's TTFT within 1.5x of those). Run it against
`djinnd --http ... --http-reuse 0` with --prefix-cache on (the default) and
off: the first conversation fills the cache, the others map its blocks.

usage: python3 bench/http_prefix.py URL MODEL [--system-tokens 2000]
       [--turns 10] [--user-tokens 40] [--max-tokens 16] [--vocab 4000] [--runs 3]
"""
import argparse
import json
import random
import statistics
import time
import urllib.request

from sse_events import sse_events


def complete(url, model, ids, max_tokens):
    """(TTFT seconds, usage) of one streamed greedy completion of token ids."""
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, usage = None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for ev in sse_events(r):
            if ev.get("usage"):
                usage = ev["usage"]
            if ev.get("choices") and ttft is None:  # the first token's event (its text may be empty)
                ttft = time.perf_counter() - t0
    return (ttft if ttft is not None else time.perf_counter() - t0), usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=10, help="conversations on the one system prompt")
    ap.add_argument("--user-tokens", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=4000, help="ids are drawn from [2, vocab)")
    ap.add_argument("--runs", type=int, default=3, help="fresh 100-token prompts for the baseline (median)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    draw = lambda n: [rng.randrange(2, a.vocab) for _ in range(n)]
    system = draw(a.system_tokens)
    print("conv  prompt_tokens  cached_tokens  ttft_ms")
    ttfts = []
    for turn in range(a.turns):
        ttft, usage = complete(a.url, a.model, system + draw(a.user_tokens), a.max_tokens)
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        print(f"{turn:4d}  {(usage or {}).get('prompt_tokens', 0):13d}  {cached:13d}  {ttft * 1e3:7.1f}")
        ttfts.append(ttft)
    base = statistics.median(complete(a.url, a.model, draw(100), a.max_tokens)[0] for _ in range(a.runs))
    later = statistics.median(ttfts[1:]) if len(ttfts) > 1 else ttfts[0]
    print(f"fresh 100-token prompt: ttft {base * 1e3:.1f} ms (median of {a.runs})")
    print(f"first conversation {ttfts[0] * 1e3:.1f} ms; later ones median {later * 1e3:.1f} ms = "
          f"{later / base:.2f}x the 100-token prompt (bar 1.5x)")


if __name__ == "__main__":
    main()
