#!/usr/bin/env python3
"""Aggregate generation throughput of an OpenAI-compatible server (`snug serve`, `llama-server`)
with N concurrent streaming clients.

Each client sends the same kind of request (a short code prompt, greedy, `max_tokens` tokens)
over `/v1/completions` with `stream: true` and `stream_options.include_usage`, `rounds` times in
a row; the prompts differ per client so no server can share their work. Reported per N: the
generated tokens of all clients over the wall time (aggregate tok/s), the median time to first
token, and the median and p95 time between tokens of one stream.

Usage: bench_serve.py BASE_URL [--n 1,2,4,8] [--max-tokens 64] [--rounds 2] [--model NAME]
                      [--api-key KEY]
       bench_serve.py BASE_URL --long-prompt 2000 --n 2 --max-tokens 400
         (p95 inter-token time of 2 streams before and while a 2000-word prompt is read)
       bench_serve.py BASE_URL --model BASE --adapters a,b,c,d,e,f,g,h --n 8
         (LoRA, issue 15: per N, the bare model, then client i on model BASE:adapter_i; prints
         both tables' rows and the ratio of aggregate tok/s. Each adapter is warmed up first,
         so its load from disk is not measured. Serve with `snug serve --lora-dir DIR
         --max-loras 8`; make the adapters with `scripts/make_lora.py BASE.gguf DIR --count 8
         --rank 16 --targets q,k,v,o,gate,up,down`.)
Standard library only.
"""

import argparse
import json
import statistics
import threading
import time
import urllib.request

PROMPTS = [
    "def quicksort(items):",
    "// Binary search in C\nint bsearch(const int *a, int n, int key) {",
    "class LinkedList:\n    def __init__(self):",
    "fn parse_args() -> Args {",
    "def merge_sorted(a, b):",
    "function debounce(fn, ms) {",
    "def is_prime(n):",
    "SELECT customers.name, COUNT(orders.id)",
]


API_KEY = ""


def one(base, model, prompt, max_tokens, out):
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    req = urllib.request.Request(
        base + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    t0 = time.monotonic()
    stamps, tokens = [], 0
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                tokens = ev["usage"]["completion_tokens"]
            if ev.get("choices") and ev["choices"][0].get("text"):
                stamps.append(time.monotonic())
    out.append((t0, stamps, tokens))


def run(base, model, n, max_tokens, rounds):
    """`model`: one name for every client, or a list (client i uses model[i % len])."""
    results = []
    models = model if isinstance(model, list) else [model]

    def client(i):
        for r in range(rounds):
            m = models[i % len(models)]
            one(base, m, PROMPTS[(i + r * n) % len(PROMPTS)], max_tokens, results)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    total = sum(tok for _, _, tok in results)
    ttft = [s[0] - t for t, s, _ in results if s]
    gaps = [b - a for _, s, _ in results for a, b in zip(s, s[1:])]
    p95 = sorted(gaps)[int(0.95 * (len(gaps) - 1))] if gaps else 0.0
    return {
        "n": n,
        "tokens": total,
        "wall_s": round(wall, 2),
        "tok_s": round(total / wall, 2),
        "ttft_median_s": round(statistics.median(ttft), 3) if ttft else None,
        "itl_median_ms": round(1000 * statistics.median(gaps), 1) if gaps else None,
        "itl_p95_ms": round(1000 * p95, 1),
    }


def interference(base, model, n, prompt_words, max_tokens):
    """p95 inter-token time of `n` running streams before and while one long prompt is read."""
    results = []
    threads = [threading.Thread(target=one, args=(base, model, PROMPTS[i], max_tokens, results))
               for i in range(n)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    long_req = urllib.request.Request(
        base + "/v1/completions",
        data=json.dumps({"prompt": "word " * prompt_words, "max_tokens": 1,
                         **({"model": model} if model else {})}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"},
    )
    t0 = time.monotonic()
    with urllib.request.urlopen(long_req) as r:
        n_prompt = json.load(r)["usage"]["prompt_tokens"]
    t1 = time.monotonic()
    for t in threads:
        t.join()

    def p95(gaps):
        return round(1000 * sorted(gaps)[int(0.95 * (len(gaps) - 1))], 1) if gaps else None

    before = [b - a for _, st, _ in results for a, b in zip(st, st[1:]) if b < t0]
    during = [b - a for _, st, _ in results for a, b in zip(st, st[1:]) if t0 <= b <= t1]
    print(f"{n} streams; a {n_prompt}-token prompt read in {t1 - t0:.1f} s; inter-token p95 "
          f"before {p95(before)} ms ({len(before)} gaps), during {p95(during)} ms "
          f"({len(during)} gaps)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--n", default="1,2,4,8")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--adapters", default="",
                    help="comma-separated adapter names: compare client i on MODEL:adapter_i "
                    "with the bare MODEL (needs --model)")
    ap.add_argument("--long-prompt", type=int, default=0,
                    help="instead: p95 inter-token time of --n streams while a prompt of this "
                    "many words is read")
    a = ap.parse_args()
    global API_KEY
    API_KEY = a.api_key
    if a.long_prompt:
        interference(a.base, a.model, int(a.n.split(",")[0]), a.long_prompt, a.max_tokens)
        return
    # Warm-up: page in the weights.
    one(a.base, a.model, PROMPTS[0], 4, [])
    adapters = [f"{a.model}:{x}" for x in a.adapters.split(",") if x]
    if adapters and not a.model:
        ap.error("--adapters needs --model (the base model's name)")
    for m in adapters:
        t0 = time.monotonic()
        one(a.base, m, PROMPTS[0], 4, [])
        print(f"warm-up {m}: {time.monotonic() - t0:.2f} s (load from disk included)", flush=True)
    print("| model | clients | generated tokens | wall s | aggregate tok/s | TTFT median s | ITL median ms | ITL p95 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")

    def row(label, r):
        print(f"| {label} | {r['n']} | {r['tokens']} | {r['wall_s']} | {r['tok_s']} "
              f"| {r['ttft_median_s']} | {r['itl_median_ms']} | {r['itl_p95_ms']} |", flush=True)

    ratios = []
    for n in [int(x) for x in a.n.split(",")]:
        bare = run(a.base, a.model, n, a.max_tokens, a.rounds)
        row("bare", bare)
        if adapters:
            lora = run(a.base, adapters, n, a.max_tokens, a.rounds)
            row(f"{min(n, len(adapters))} adapters", lora)
            ratios.append((n, lora["tok_s"] / bare["tok_s"] if bare["tok_s"] else 0.0))
    for n, ratio in ratios:
        print(f"N = {n}: adapters / bare aggregate tok/s = {ratio:.3f} (target >= 0.85)")


if __name__ == "__main__":
    main()
