#!/usr/bin/env python3
"""http_reuse.py: issue 13's reuse bench - a multi-turn chat with a long system
prompt through djinnd's OpenAI front end, time to first token (client side,
streamed) of every turn, with usage's cached_tokens; then a fresh chat of about
100 prompt tokens (the bar: later turns' TTFT within 1.5x of that). Run it
against `djinnd --http ...` with reuse on (the default) and with --http-reuse 0.

usage: python3 bench/http_reuse.py URL MODEL [--system-tokens 2000] [--turns 10]
       [--max-tokens 32] [--runs 3]   (URL e.g. http://127.0.0.1:8080)
"""
import argparse
import json
import statistics
import time
import urllib.request

from sse_events import sse_events


def chat(url, model, messages, max_tokens):
    """(TTFT seconds, content, usage) of one streamed greedy chat request."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, content, usage = None, "", None
    with urllib.request.urlopen(req, timeout=600) as r:
        for ev in sse_events(r):
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                piece = (c.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.perf_counter() - t0
                content += piece
    return (ttft if ttft is not None else time.perf_counter() - t0), content, usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3, help="fresh 100-token chats for the baseline (median)")
    a = ap.parse_args()
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "paper"]
    system = " ".join(words[i % len(words)] for i in range(a.system_tokens))  # about one token a word
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Tell me a story."}]
    print("turn  prompt_tokens  cached_tokens  ttft_ms")
    ttfts = []
    for turn in range(a.turns):
        ttft, content, usage = chat(a.url, a.model, messages, a.max_tokens)
        cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        print(f"{turn:4d}  {(usage or {}).get('prompt_tokens', -1):13d}  {cached:13d}  {ttft * 1e3:7.1f}")
        ttfts.append(ttft)
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": f"And then? ({turn})"}]
    base = []
    for run in range(a.runs):  # a new prefix each time: nothing to reuse
        user = f"{run} " + " ".join(words[(i + run) % len(words)] for i in range(100))
        base.append(chat(a.url, a.model, [{"role": "user", "content": user}], a.max_tokens)[0])
    b = statistics.median(base)
    later = ttfts[1:] or ttfts
    print(f"fresh ~100-token chat: ttft {b * 1e3:.1f} ms (median of {a.runs})")
    print(f"turns 1..{a.turns - 1}: ttft median {statistics.median(later) * 1e3:.1f} ms, max {max(later) * 1e3:.1f} ms;"
          f" max / fresh = {max(later) / b:.2f} (bar <= 1.5)")


if __name__ == "__main__":
    main()
