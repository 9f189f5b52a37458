#!/usr/bin/env python3
"""How much of each agent turn's prompt comes from the prefix cache (issue 48).

A scripted 10-turn tool-using session through one API: the user asks for the weather in nine
cities one at a time; turns 1-9 are forced calls of `get_weather` (each answer sent back exactly
as the server gave it, with the tool's result), turn 10 answers in text. For turns 2-10 it
prints the prompt tokens, those read from the cache, and their fraction, as each API's usage
reports them (Chat Completions `prompt_tokens_details.cached_tokens`, Messages
`cache_read_input_tokens` over input + cache read, Responses
`input_tokens_details.cached_tokens`).

`--long` instead sends an agent-sized prompt (a system prompt plus 30 tool definitions,
about 16k tokens) twice, the second time with one more turn, and prints each one's time to the
first streamed byte of content and its cached tokens: the cold prefill and the warm turn.

`--agent-system` runs the session under an agent-sized system prompt (about 1.7k tokens).

Usage: bench_agents.py BASE_URL MODEL {chat,messages,responses} [--key KEY] [--long] [--agent-system]
Works against llama-server too (same routes).
"""

import argparse
import json
import time
import urllib.request

CITIES = ["Paris", "Berlin", "Madrid", "Rome", "Vienna", "Lisbon", "Dublin", "Oslo", "Prague"]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
SYSTEM = ("You are a coding agent ({api}). Use the tools to answer. Call one tool at a time and wait for "
          "its result before the next call.")


def post(base, path, body, key, stream=False):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}", "x-api-key": key,
        "anthropic-version": "2023-06-01"})
    r = urllib.request.urlopen(req, timeout=3600)
    return r if stream else json.loads(r.read())


def tools_for(api, n_extra=0, filler=""):
    defs = [("get_weather", "Get the current weather in a city.", SCHEMA)]
    for i in range(n_extra):
        props = {f"arg{j}": {"type": "string", "description": f"Argument {j} of tool {i}. {filler}"}
                 for j in range(3)}
        defs.append((f"tool_{i}", f"Tool number {i}: {filler}", {"type": "object", "properties": props}))
    if api == "chat":
        return [{"type": "function", "function": {"name": n, "description": d, "parameters": p}} for n, d, p in defs]
    if api == "messages":
        return [{"name": n, "description": d, "input_schema": p} for n, d, p in defs]
    return [{"type": "function", "name": n, "description": d, "parameters": p} for n, d, p in defs]


def turn(base, api, model, key, system, history, tools, force, max_tokens=60):
    """One request; returns (history items to append, prompt tokens, cached tokens, output
    tokens)."""
    if api == "chat":
        body = {"model": model, "messages": [{"role": "system", "content": system}] + history,
                "tools": tools, "tool_choice": "required" if force else "none",
                "temperature": 0, "max_tokens": max_tokens}
        r = post(base, "/v1/chat/completions", body, key)
        msg = r["choices"][0]["message"]
        u = r["usage"]
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        add = [msg]
        for c in msg.get("tool_calls") or []:
            city = json.loads(c["function"]["arguments"]).get("city", "?")
            add.append({"role": "tool", "tool_call_id": c["id"], "content": f"18 degrees in {city}"})
        return add, u["prompt_tokens"], cached, u["completion_tokens"]
    if api == "messages":
        body = {"model": model, "system": system, "messages": history, "tools": tools,
                "tool_choice": {"type": "any"} if force else {"type": "none"},
                "temperature": 0, "max_tokens": max_tokens}
        r = post(base, "/v1/messages", body, key)
        u = r["usage"]
        add = [{"role": "assistant", "content": r["content"]}]
        results = [{"type": "tool_result", "tool_use_id": b["id"],
                    "content": f"18 degrees in {b['input'].get('city', '?')}"}
                   for b in r["content"] if b["type"] == "tool_use"]
        if results:
            add.append({"role": "user", "content": results})
        cached = u.get("cache_read_input_tokens") or 0
        return add, u["input_tokens"] + cached, cached, u["output_tokens"]
    body = {"model": model, "instructions": system, "input": history, "tools": tools,
            "tool_choice": "required" if force else "none", "temperature": 0,
            "max_output_tokens": max_tokens}
    r = post(base, "/v1/responses", body, key)
    u = r["usage"]
    add = list(r["output"])
    for o in r["output"]:
        if o["type"] == "function_call":
            city = json.loads(o["arguments"]).get("city", "?")
            add.append({"type": "function_call_output", "call_id": o["call_id"], "output": f"18 degrees in {city}"})
    return add, u["input_tokens"], (u.get("input_tokens_details") or {}).get("cached_tokens", 0), u["output_tokens"]


def session(args):
    ask = "Check the weather in these cities one at a time: " + ", ".join(CITIES) + "."
    history = [{"role": "user", "content": ask}]
    tools = tools_for(args.api)
    fractions = []
    for t in range(1, 11):
        system = SYSTEM.format(api=args.api)  # each API its own prompts: no cache shared across runs
        if args.agent_system:
            system = long_system(args.api)
        add, prompt, cached, _ = turn(args.base, args.api, args.model, args.key, system, history, tools, t < 10)
        history += add
        if t > 1:
            fractions.append(cached / prompt)
        print(f"turn {t:2d}: prompt {prompt:5d} cached {cached:5d} ({cached / prompt:6.1%})")
    print(f"{args.api}: turns 2-10 cached fraction: min {min(fractions):.1%}, mean {sum(fractions) / len(fractions):.1%}")


def first_content(base, api, model, key, system, history, tools):
    """Streams one answer; returns (seconds to the first content event, prompt, cached)."""
    path = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}[api]
    body = {"model": model, "tools": tools, "temperature": 0, "stream": True}
    if api == "chat":
        body.update(messages=[{"role": "system", "content": system}] + history, max_tokens=8,
                    stream_options={"include_usage": True})
    elif api == "messages":
        body.update(system=system, messages=history, max_tokens=8)
    else:
        body.update(instructions=system, input=history, max_output_tokens=8)
    t0 = time.monotonic()
    first, prompt, cached = None, 0, 0
    for line in post(base, path, body, key, stream=True):
        line = line.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        ev = json.loads(line[5:])
        kind = ev.get("type", "")
        if first is None and (kind in ("content_block_delta", "response.output_text.delta", "response.function_call_arguments.delta")
                              or (ev.get("choices") and ev["choices"][0]["delta"].get("content"))):
            first = time.monotonic() - t0
        u = ev.get("usage") or (ev.get("response") or {}).get("usage")
        if u:
            if api == "messages":
                cached = u.get("cache_read_input_tokens") or 0
                prompt = u.get("input_tokens", 0) + cached
            elif api == "chat":
                prompt, cached = u["prompt_tokens"], (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            else:
                prompt, cached = u["input_tokens"], (u.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return first if first is not None else time.monotonic() - t0, prompt, cached


def long_system(api):
    """An agent-sized system prompt (about 1.7k tokens)."""
    return (SYSTEM.format(api=api) + " " + "Follow the project's conventions, keep changes small, and explain each step. " * 10) * 12


def long_prompt(args):
    filler = "It reads and writes files of the project and reports what it did in detail. " * 6
    system = long_system(args.api)
    tools = tools_for(args.api, 30, filler)
    history = [{"role": "user", "content": "hello"}]
    cold = first_content(args.base, args.api, args.model, args.key, system, history, tools)
    history += [{"role": "assistant", "content": "Hello! What should I work on?"},
                {"role": "user", "content": "List the files."}]
    warm = first_content(args.base, args.api, args.model, args.key, system, history, tools)
    for name, (t, p, c) in (("cold", cold), ("second turn", warm)):
        print(f"{args.api} {name}: prompt {p} tokens, cached {c}, time to first content {t:.2f} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("model")
    ap.add_argument("api", choices=["chat", "messages", "responses"])
    ap.add_argument("--key", default="none")
    ap.add_argument("--long", action="store_true")
    ap.add_argument("--agent-system", action="store_true", help="the session with a 1.7k-token system prompt")
    args = ap.parse_args()
    long_prompt(args) if args.long else session(args)


if __name__ == "__main__":
    main()
