#!/usr/bin/env python3
"""http_clients.py: N streaming clients at once against djinnd's OpenAI front
end (issue 13): each streams a completion of its own random token-id prompt;
time to first token per client (p50/p99, client side) and the aggregate
tokens per second (all completion tokens over the wall time from the first
request to the last [DONE]); --rounds repeats the burst. --duration S
instead keeps every client busy for S seconds, one request after another
(short exchanges: a streamed /v1/completions of a few words, so that a model
without a chat template serves too), and prints the requests per second all
of them completed; a client stops at its first error.

usage: python3 bench/http_clients.py URL MODEL [--clients 64] [--prompt-tokens 128]
       [--max-tokens 128] [--vocab 4000] [--rounds 2] [--temperature 0] [--duration S]
"""
import argparse
import http.client
import json
import random
import threading
import time
import urllib.parse

from sse_events import sse_events


def one(url, body, out, barrier):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    barrier.wait()
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    ttft, tokens, err = None, 0, None
    if r.status != 200:
        err = f"HTTP {r.status}: {r.read()[:200]!r}"
    else:
        try:
            for ev in sse_events(r):
                if ev.get("choices") and ttft is None:
                    ttft = time.perf_counter() - t0
                if ev.get("usage"):
                    tokens = ev["usage"]["completion_tokens"]
        except RuntimeError as e:
            err = str(e)
    out.append({"ttft": ttft, "tokens": tokens, "end": time.perf_counter(), "start": t0, "err": err})
    conn.close()


def chats(url, model, max_tokens, seed, until, out):
    """Short streamed chats back to back until the clock passes until."""
    u = urllib.parse.urlparse(url)
    rng = random.Random(seed)
    words = ["cedar", "river", "lamp", "orbit", "quartz", "meadow", "signal", "harbor"]
    done, tokens, errs = 0, 0, []
    while time.perf_counter() < until:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
        body = {"model": model, "prompt": "User: say " + rng.choice(words) + "\nAssistant:",
                "max_tokens": max_tokens, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            errs.append(f"HTTP {r.status}: {r.read()[:200]!r}")
        else:
            try:
                for ev in sse_events(r):
                    if ev.get("usage"):
                        tokens += ev["usage"]["completion_tokens"]
                done += 1
            except RuntimeError as e:
                errs.append(str(e))
        conn.close()
        if errs:
            break
    out.append((done, tokens, errs))


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--duration", type=float, default=0.0)
    a = ap.parse_args()
    if a.duration > 0:
        out, t0 = [], time.perf_counter()
        th = [threading.Thread(target=chats, args=(a.url, a.model, a.max_tokens, i, t0 + a.duration, out))
              for i in range(a.clients)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
        done, tokens = sum(o[0] for o in out), sum(o[1] for o in out)
        errs = [e for o in out for e in o[2]]
        print(f"{a.clients} clients, short completions (max_tokens {a.max_tokens}) for {a.duration:.0f} s: {done} requests "
              f"in {wall:.2f} s = {done / wall:.1f} requests/s, {tokens / wall:.0f} tok/s; {len(errs)} errors"
              + (f" (first: {errs[0]})" if errs else ""))
        return
    rng = random.Random(1)
    for rnd in range(a.rounds):
        bodies = [{"model": a.model, "prompt": [rng.randrange(2, a.vocab) for _ in range(a.prompt_tokens)],
                   "max_tokens": a.max_tokens, "temperature": a.temperature, "seed": i, "stream": True,
                   "stream_options": {"include_usage": True}} for i in range(a.clients)]
        out, barrier = [], threading.Barrier(a.clients)
        th = [threading.Thread(target=one, args=(a.url, b, out, barrier)) for b in bodies]
        for t in th:
            t.start()
        for t in th:
            t.join()
        errs = [o["err"] for o in out if o["err"]]
        ttfts = [o["ttft"] * 1e3 for o in out if o["ttft"] is not None]
        tokens = sum(o["tokens"] for o in out)
        wall = max(o["end"] for o in out) - min(o["start"] for o in out)
        if not ttfts:
            print(f"round {rnd}: {a.clients} clients: no token came; {len(errs)} errors"
                  + (f" (first: {errs[0]})" if errs else ""))
            continue
        print(f"round {rnd}: {a.clients} clients, prompt {a.prompt_tokens}, max_tokens {a.max_tokens}: "
              f"TTFT p50 {pct(ttfts, 50):.1f} ms, p99 {pct(ttfts, 99):.1f} ms, max {max(ttfts):.1f} ms; "
              f"{tokens} tokens in {wall:.2f} s = {tokens / wall:.0f} tok/s aggregate; {len(errs)} errors"
              + (f" (first: {errs[0]})" if errs else ""))


if __name__ == "__main__":
    main()
