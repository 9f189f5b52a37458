#!/usr/bin/env python3
"""`snug plan --serve` against a real server's peak resident memory (issue 52): `snug serve MODEL
--parallel P --ctx C` (every other setting at its default: n-gram drafting, the disk tier of the
prefix cache in a fresh folder) under P streaming clients at once, each with 4 tools offered,
`tool_choice: auto`, a `logit_bias` and a prompt filling about 85% of its slot's context. Two
rounds of the same prompts (the second hits the prefix cache), then rounds of new ones until
the KV pool has had no free block (at most 12 rounds): finished prompts' blocks stay in the
pool as prefix cache, so a server that has run a while holds its whole pool, which the plan
counts. The peak is the server's VmHWM after the three first rounds ("short") and at the end
("filled").

    python3 scripts/benchmarks/serve_plan.py target/release/snug qwen2.5-coder-0.5b 4096 4 [f16|q8|q4]

`TOOLS=0` sends no tools (the bias and drafting stay): for a model whose chat template cannot
render tool calls (gemma3-270m), which refuses requests with tools.

Prints one JSON line: model, ctx, parallel, kv, planned and measured peak (bytes), and the
difference in percent. Standard library only.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

TOOLS = [
    {"type": "function", "function": {"name": f"tool_{i}", "description": f"Does task {i}.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"},
                                                      "count": {"type": "integer"}},
                    "required": ["path"]}}}
    for i in range(4)
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def document(seed, tokens):
    """A deterministic text of about `tokens` tokens (16 a line), different per seed."""
    out = []
    for i in range(tokens // 16):
        out.append(f"Line {seed}-{i}: item {i * 31 % 997} costs {i * 17 % 89} units.")
    return "\n".join(out)


def stream(port, prompt, out):
    body = {"messages": [{"role": "system", "content": "You call tools when asked."},
                         {"role": "user", "content": prompt + "\nSummarise the first line."}],
            "logit_bias": {"11": -2, "13": 1},
            "max_tokens": 48, "stream": True, "stream_options": {"include_usage": True},
            "temperature": 0}
    if os.environ.get("TOOLS", "1") != "0":
        body.update(tools=TOOLS, tool_choice="auto")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=1800)
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    usage = None
    if r.status != 200:
        out.append((r.status, r.read()[:300]))
        return
    for line in r:
        line = line.strip()
        if line.startswith(b"data: {"):
            v = json.loads(line[6:])
            usage = v.get("usage") or usage
    out.append((r.status, usage))


def free_blocks(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith("snug_kv_blocks_free "):
            return float(line.split()[1])
    return None


def vm(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    snug, model, ctx, parallel = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    kv = sys.argv[5] if len(sys.argv) > 5 else "f16"
    plan = json.loads(subprocess.check_output(
        [snug, "plan", model, "--ctx", str(ctx), "--parallel", str(parallel), "--threads", "2",
         "--kv", kv, "--serve", "--json"]))
    planned = plan["predicted_peak_rss_bytes"]
    port = free_port()
    with tempfile.TemporaryDirectory() as cache:
        p = subprocess.Popen(
            [snug, "serve", model, "--port", str(port), "--ctx", str(ctx), "--parallel",
             str(parallel), "--threads", "2", "--kv", kv, "--prefix-cache-dir", cache],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            t0 = time.time()
            while True:
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready",
                                              timeout=1).status == 200:
                        break
                except Exception:
                    if time.time() - t0 > 120 or p.poll() is not None:
                        sys.exit("not ready: " + p.stderr.read().decode())
                    time.sleep(0.2)
            tokens = int(ctx * 0.85) - 400
            filled, stop = threading.Event(), threading.Event()

            def watch():
                while not stop.is_set():
                    if free_blocks(port) == 0:
                        filled.set()
                    time.sleep(0.5)
            threading.Thread(target=watch, daemon=True).start()
            rounds = [range(parallel), range(parallel)]
            rounds += [range(k * parallel, (k + 1) * parallel) for k in range(1, 11)]
            short = None
            for rnd, seeds in enumerate(rounds):
                if rnd >= 3 and filled.is_set():
                    break
                out = []
                ts = [threading.Thread(target=stream, args=(port, document(s, tokens), out))
                      for s in seeds]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                bad = [o for o in out if o[0] != 200]
                if bad:
                    sys.exit(f"round {rnd}: {bad}")
                cached = [o[1]["prompt_tokens_details"]["cached_tokens"] for o in out]
                print(f"round {rnd}: cached {cached}, free blocks {free_blocks(port)}",
                      file=sys.stderr)
                if rnd == 2:
                    short = vm(p.pid, "VmHWM")
            stop.set()
            peak = vm(p.pid, "VmHWM")
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=60)
    print(json.dumps({"model": os.path.basename(model), "ctx": ctx, "parallel": parallel,
                      "kv": kv, "tools": os.environ.get("TOOLS", "1") != "0", "planned": planned, "peak_short": short, "peak_filled": peak,
                      "filled": filled.is_set(), "rounds": rnd + 1,
                      "over_short_pct": round(100.0 * (planned - short) / short, 2),
                      "over_filled_pct": round(100.0 * (planned - peak) / peak, 2)}))


if __name__ == "__main__":
    main()
