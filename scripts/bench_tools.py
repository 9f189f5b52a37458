#!/usr/bin/env python3
"""Decode speed with and without 50 offered tools (issue 31): the per-token cost of the lazy
tool-call grammar (`tool_choice: "auto"`: free text watched for the trigger) on the same prompt.

Usage: scripts/bench_tools.py BASE_URL [RUNS]   (a running `snug serve`, e.g. on
qwen2.5-coder-0.5b with --parallel 1). Not a test: run it on an idle machine. Each request is
streamed; decode tok/s is (completion tokens - 1) / (time from the first to the last token).
Prints the median of RUNS (default 5) per setting. The answer must stay text for the figure
to be the lazy cost: the prompt asks for prose, and a run whose answer made a call is reported.
"""

import json
import statistics
import sys
import time
import urllib.request

base = sys.argv[1].rstrip("/")
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper, in prose."}]


def tool(i):
    return {"type": "function", "function": {
        "name": f"tool_{i:02d}", "description": f"Look up record number {i} in the archive",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "limit": {"type": "integer"},
            "mode": {"type": "string", "enum": ["fast", "exact"]}}, "required": ["query"]}}}


TOOLS = [tool(i) for i in range(50)]


def one(tools):
    body = {"messages": PROMPT, "temperature": 0, "max_tokens": 200, "stream": True,
            "stream_options": {"include_usage": True}}
    if tools:
        body.update(tools=tools, tool_choice="auto")
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    first = last = None
    n, called = 0, False
    with urllib.request.urlopen(req) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            c = json.loads(line[6:])
            if c.get("usage"):
                n = c["usage"]["completion_tokens"]
            for ch in c.get("choices", []):
                d = ch.get("delta", {})
                if d.get("content") or d.get("tool_calls"):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                called |= bool(d.get("tool_calls"))
    return (n - 1) / (last - first) if first and last > first else float("nan"), called


for label, tools in (("no tools", None), ("50 tools, auto", TOOLS)):
    one(tools)  # warm the prefix cache and the vocabulary tables
    rates, calls = [], 0
    for _ in range(runs):
        r, called = one(tools)
        rates.append(r)
        calls += called
    note = f" ({calls} of {runs} answers made a call)" if calls else ""
    print(f"{label:16s} decode {statistics.median(rates):7.2f} tok/s (median of {runs}){note}")
