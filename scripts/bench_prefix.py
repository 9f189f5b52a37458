#!/usr/bin/env python3
"""Time to first token with and without the prefix cache of an OpenAI-compatible server.

Each run builds a fresh long prefix (about `--words` words of numbered lines, starting with the
run's number so no earlier run shares it), then sends two streamed `/v1/completions` requests
one after the other, one token each: the prefix plus a first question (cold: nothing cached
starts that way), then the prefix plus another question (cached: the first request finished and
left the prefix's blocks behind). Reported: the time to the first streamed token of each, per
run and as medians, and the prompt's token count.

Usage: bench_prefix.py BASE_URL [--runs 5] [--words 700] [--model NAME] [--api-key KEY]
Standard library only.
"""

import argparse
import json
import statistics
import time
import urllib.request


def ttft(base, key, model, prompt):
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    t0 = time.perf_counter()
    first, n_prompt = None, None
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                n_prompt = chunk["usage"]["prompt_tokens"]
    return first, n_prompt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--words", type=int, default=700)
    ap.add_argument("--model", default="")
    ap.add_argument("--api-key", default="")
    a = ap.parse_args()
    cold, warm = [], []
    for run in range(a.runs):
        lines, n = [f"Run {run}: a table of values.\n"], 0
        while n < a.words:
            i = len(lines)
            lines.append(f"value {i} of run {run} is {i * 37 % 101}\n")
            n += 6
        prefix = "".join(lines)
        c, n_prompt = ttft(a.base, a.api_key, a.model, prefix + "The largest value is")
        w, _ = ttft(a.base, a.api_key, a.model, prefix + "The smallest value is")
        cold.append(c)
        warm.append(w)
        print(f"run {run}: {n_prompt} prompt tokens, TTFT cold {c:.3f} s, cached {w:.3f} s",
              flush=True)
    print(f"median TTFT: cold {statistics.median(cold):.3f} s, "
          f"cached {statistics.median(warm):.3f} s "
          f"({statistics.median(cold) / statistics.median(warm):.1f}x)")


if __name__ == "__main__":
    main()
