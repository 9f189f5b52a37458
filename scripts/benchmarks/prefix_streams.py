#!/usr/bin/env python3
"""Issue 49's "no cost to streams": the p95 inter-token time of 4 running streams while a fifth
client keeps sending long prompts whose blocks are on the prefix cache's disk tier (written by
a warm-up server, then the server restarted, so RAM holds none of them), against the same load
with the tier off (--prefix-cache-disk 0: the same prompts computed). Rounds alternate tier on
and off; the figures are medians over rounds. Streams alone (no fifth client) are measured once
per round pair as the floor.

    python3 scripts/benchmarks/prefix_streams.py target/release/snug /root/.cache/snug/models/qwen2.5-coder-0.5b.gguf

Each stream is a greedy /v1/completions of STREAM_TOKENS (160) tokens; an inter-token time is
the gap between two chunks with text of one stream (the first token's wait excluded), pooled
over the 4 streams of a round. The fifth client sends DOCS (24) documents of LINES (40: ~1.4k
tokens) lines, one after the other, each with a question (16 tokens answered), until the streams
end. ROUNDS (6) pairs. CACHE_DIR keeps the tier (and skips the warm-up when it holds files). Standard library only; reuses prefix_disk.py's document and server
helpers. Record the figures in BENCHMARKS.md with the CPU and the machine's load.
"""

import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefix_disk import ask, free_port, launch, stop  # noqa: E402


def start(snug, model, cache_dir, port, disk):
    args = [snug, "serve", model, "--port", str(port), "--ctx", os.environ.get("CTX", "4096"),
            "--parallel", "5", "--threads", "2", "--prefix-cache-dir", cache_dir,
            "--prefix-cache-disk", disk]
    return launch(args, port)


def document(k, lines):
    """Document `k`: a deterministic source file of about 35 tokens a line, its own from the
    first line on."""
    out = [f"// Inventory service {k}: record types and helpers.\n"]
    for i in range(lines):
        out.append(f"pub fn price_{k}_{i}(qty: u32, unit: u32) -> u64 {{ (qty as u64) * "
                   f"(unit as u64 + {(i + k) * 17 % 97}) / {i % 9 + 1} }}\n")
    return "".join(out)


def stream(port, prompt, n, out):
    """Streams `n` tokens; appends the arrival time of each chunk with text to `out`."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if any(c.get("text") for c in chunk.get("choices", [])):
                out.append(time.time())


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.95 * len(xs)))]


def one_round(snug, model, cache, disk, docs, fifth):
    """One server on `cache` (tier `disk`): 4 streams, and the fifth client if `fifth`.
    Returns (p95 gap ms, median gap ms, documents sent, their mean ttft s, cached share)."""
    port = free_port()
    p = start(snug, model, cache, port, disk)
    n = int(os.environ.get("STREAM_TOKENS", "160"))
    times = [[] for _ in range(4)]
    prompts = [f"// Stream {i}: a long list of the prime numbers, one per line.\n2\n3\n5\n"
               for i in range(4)]
    threads = [threading.Thread(target=stream, args=(port, prompts[i], n, times[i]))
               for i in range(4)]
    for t in threads:
        t.start()
    sent, ttfts, cached, total = 0, [], 0, 0
    if fifth:
        # Once every stream has its first token: the load runs beside decoding streams.
        while any(not t for t in times):
            time.sleep(0.01)
        for d in docs:
            if not any(t.is_alive() for t in threads):
                break
            ttft, _, usage = ask(port, d + "\n// Question: which function divides by 5? Answer:")
            sent += 1
            ttfts.append(ttft)
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            total += usage["prompt_tokens"]
    for t in threads:
        t.join()
    stop(p)
    gaps = [1000 * (b - a) for ts in times for a, b in zip(ts, ts[1:])]
    return (p95(gaps), statistics.median(gaps), sent,
            statistics.mean(ttfts) if ttfts else 0.0, cached / total if total else 0.0)


def main():
    snug, model = sys.argv[1], sys.argv[2]
    lines = int(os.environ.get("LINES", "40"))
    docs = [document(k, lines) for k in range(int(os.environ.get("DOCS", "24")))]
    rounds = int(os.environ.get("ROUNDS", "6"))
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.environ.get("CACHE_DIR") or os.path.join(tmp, "kv")
        # Warm-up: every document's blocks on disk (written through, flushed at shutdown),
        # unless CACHE_DIR holds them from an earlier run.
        if not os.path.isdir(cache) or not os.listdir(cache):
            port = free_port()
            p = start(snug, model, cache, port, "2G")
            for d in docs:
                ask(port, d + "\n// Question: which function divides by 5? Answer:")
            stop(p)
            print("warm-up done", flush=True)
        res = {"on": [], "off": [], "alone": []}
        for r in range(rounds):
            order = [("on", "2G"), ("off", "0")] if r % 2 == 0 else [("off", "0"), ("on", "2G")]
            for label, disk in order:
                row = one_round(snug, model, cache, disk, docs, True)
                res[label].append(row)
                print(f"round {r} tier {label:3}: p95 {row[0]:6.1f} ms  median {row[1]:5.1f} ms  "
                      f"fifth client: {row[2]} prompts, ttft {row[3]:.2f} s, "
                      f"cached {100 * row[4]:.0f}%", flush=True)
            row = one_round(snug, model, cache, "2G", docs, False)
            res["alone"].append(row)
            print(f"round {r} streams alone: p95 {row[0]:6.1f} ms  median {row[1]:5.1f} ms",
                  flush=True)
        med = {k: statistics.median(x[0] for x in v) for k, v in res.items()}
        print(f"median p95 inter-token: tier on {med['on']:.1f} ms, tier off {med['off']:.1f} ms "
              f"(on/off {med['on'] / med['off']:.2f}x), streams alone {med['alone']:.1f} ms "
              f"(on/alone {med['on'] / med['alone']:.2f}x)")
        for k in ("on", "off"):
            print(f"tier {k}: median ttft of the fifth client "
                  f"{statistics.median(x[3] for x in res[k]):.2f} s, prompts per round "
                  f"{statistics.median(x[2] for x in res[k])}")


if __name__ == "__main__":
    main()
