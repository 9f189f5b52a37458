#!/usr/bin/env python3
"""Issue 49's "Done when" numbers for the prefix cache's disk tier: time to first token of a
~6k-token prompt on qwen2.5-coder-0.5b cold, after the server restarted on the same
--prefix-cache-dir, and for a new question on the same document after another restart; the
answers' text and cached_tokens beside them.

    python3 scripts/benchmarks/prefix_disk.py target/ci/snug /root/.cache/snug/models/qwen2.5-coder-0.5b.gguf

Each request streams /v1/completions (greedy, 16 tokens, usage included); time to first token is
from sending the request to the first chunk with text. Standard library only. Record the figures
in BENCHMARKS.md with the CPU and the machine's load. LINES (170: ~6k tokens) sizes the document
and CTX (8192) the server's context: LINES=340 CTX=20480 is the 16k-token agent case (about 16.2k tokens on qwen2.5-coder-1.5b).
ROWS (cold,restart,question) picks the rows; `evict` is one server that reads the prompt, then
a second user's prompt as long (another document), then the prompt again, whose blocks the
second one evicted from RAM: they come back from disk. CACHE_DIR keeps the tier there across
runs (default: a temporary folder). TIMEOUT (600) is the client's read timeout in seconds:
nothing arrives during a prefill. CGROUP=3G runs every server in a fresh cgroup-v1 memory
cgroup of that limit (root, /sys/fs/cgroup/memory).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def document(lines):
    """A deterministic source file, about 35 tokens a line."""
    out = ["// Inventory service: record types and helpers.\n"]
    for i in range(lines):
        out.append(
            f"pub fn price_{i}(qty: u32, unit: u32) -> u64 {{ (qty as u64) * (unit as u64 + {i * 17 % 97}) / {i % 9 + 1} }}\n"
        )
    return "".join(out)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CGROUP = f"/sys/fs/cgroup/memory/snug-prefix-disk-{os.getpid()}"


def start(snug, model, cache_dir, port):
    ctx = os.environ.get("CTX", "8192")
    args = [snug, "serve", model, "--port", str(port), "--ctx", ctx, "--parallel", "1",
            "--threads", "2", "--prefix-cache-dir", cache_dir]
    limit = os.environ.get("CGROUP")
    if limit:
        os.makedirs(CGROUP, exist_ok=True)
        with open(os.path.join(CGROUP, "memory.limit_in_bytes"), "w") as f:
            f.write(limit)
        args = ["sh", "-c", f'echo $$ > {CGROUP}/cgroup.procs && exec "$@"', "sh"] + args
    return launch(args, port)


def launch(args, port):
    """Runs the server command `args` and waits (at most 120 s) until it answers /ready."""
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.time()
    while time.time() - t0 < 120:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1).status == 200:
                return p
        except Exception:
            time.sleep(0.2)
    p.kill()
    sys.exit("the server did not become ready: " + p.stderr.read().decode())


def stop(p):
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)


def ask(port, prompt):
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    ttft, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=int(os.environ.get("TIMEOUT", "600"))) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for c in chunk.get("choices", []):
                if c.get("text") and ttft is None:
                    ttft = time.time() - t0
                text += c.get("text", "")
            if chunk.get("usage"):
                usage = chunk["usage"]
    return ttft, text, usage


def report(label, ttft, text, usage):
    print(f"{label:28} ttft {ttft:7.2f} s  prompt {usage['prompt_tokens']} cached "
          f"{usage['prompt_tokens_details']['cached_tokens']}  {text!r}", flush=True)


def main():
    snug, model = sys.argv[1], sys.argv[2]
    lines = int(os.environ.get("LINES", "170"))
    doc = document(lines)
    q1 = doc + "\n// Question: which function divides by 5? Answer: price_"
    q2 = doc + "\n// Question: what does price_7 add to the unit price? Answer:"
    other = document(lines).replace("Inventory service", "Billing service").replace("price_", "cost_")
    q3 = other + "\n// Question: which function divides by 5? Answer: cost_"
    wanted = os.environ.get("ROWS", "cold,restart,question").split(",")
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.environ.get("CACHE_DIR") or os.path.join(tmp, "kv")
        rows = {}
        for key, label, prompt in [("cold", "cold", q1), ("restart", "after restart", q1),
                                   ("question", "new question, after restart", q2)]:
            if key not in wanted:
                continue
            port = free_port()
            p = start(snug, model, cache, port)
            rows[key] = ask(port, prompt)
            stop(p)
            report(label, *rows[key])
        if "evict" in wanted:
            port = free_port()
            p = start(snug, model, cache, port)
            report("evict: the prompt", *ask(port, q1))
            report("evict: a second user's", *ask(port, q3))
            rows["evict"] = ask(port, q1)
            report("evict: the prompt again", *rows["evict"])
            stop(p)
        if "cold" in rows:
            cold = rows["cold"][0]
            for key in ("restart", "question", "evict"):
                if key in rows:
                    same = "" if key == "question" else f", same text as cold: {rows[key][1] == rows['cold'][1]}"
                    print(f"{key}: {100 * rows[key][0] / cold:.1f}% of cold{same}")
        if os.environ.get("CGROUP"):
            os.rmdir(CGROUP)
        files = [f for f in os.listdir(cache) if f.endswith(".kv")]
        size = sum(os.path.getsize(os.path.join(cache, f)) for f in files)
        print(f"disk tier: {len(files)} files, {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
