"""Tool calls and reasoning through the official Python clients (PyPI `openai`, `ollama`) against
`snug serve` (issue 31). Usage: serve_tools.py BASE_URL MODEL MODE, MODE one of `tools` (the
model's own Hermes template), `open` (a template that opens <think> in the prompt), `tagged`
(a template with a thinking section the output would open), `format` (a template of another
call format: Llama 3.x or Mistral). Exits non-zero on a failed check.
"""

import json
import sys
import urllib.request

import jsonschema
import ollama
import openai
from checks import check, passed

base, model, mode = sys.argv[1:4]
oa = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
ol = ollama.Client(host=base)


def valid(args, schema):
    """The arguments object against the small schemas used here: required keys, types, enums."""
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
    if not isinstance(args, dict):
        return False
    props = schema["properties"]
    if any(k not in args for k in schema.get("required", [])) or any(k not in props for k in args):
        return False
    for k, v in args.items():
        p = props[k]
        if "enum" in p and v not in p["enum"]:
            return False
        if "type" in p and not isinstance(v, types[p["type"]]):
            return False
    return True


weather = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
clock = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                   "required": ["zone"]}}}
schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (weather, clock)}
greedy = dict(model=model, temperature=0, max_tokens=80)


def accumulate(stream):
    """What the SDK's users do with a streamed answer: calls by index, fragments joined."""
    calls, content, reasoning, finish = {}, "", "", None
    for c in stream:
        if not c.choices:
            continue
        d = c.choices[0].delta
        content += d.content or ""
        reasoning += getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            e = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                check(e["id"] is None, "a call's id comes once")
                e["id"] = tc.id
            if tc.function and tc.function.name:
                check(e["name"] is None, "a call's name comes once")
                e["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                e["arguments"] += tc.function.arguments
        finish = c.choices[0].finish_reason or finish
    return [calls[i] for i in sorted(calls)], content, reasoning, finish


def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def json_schema(v):
    """An OpenAPI 3.0 schema as JSON Schema: `nullable: true` becomes a null alternative."""
    if isinstance(v, list):
        return [json_schema(x) for x in v]
    if not isinstance(v, dict):
        return v
    out = {k: json_schema(x) for k, x in v.items() if k != "nullable"}
    if v.get("nullable"):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


with urllib.request.urlopen(base + "/openapi.json", timeout=30) as r:
    spec = json_schema(json.loads(r.read()))


def conforms(name, answer):
    """The answer against the component `name` of the server's own /openapi.json."""
    schema = dict(spec["components"]["schemas"][name], components=spec["components"])
    try:
        jsonschema.validate(answer, schema)
    except jsonschema.ValidationError as e:
        check(False, f"{name} as /openapi.json states it: {e.message} in {answer}")
    check(True, name)


def round_trip(ask):
    """A forced call, then its result sent back (the call as the SDK gives it, the result as a
    `tool` message): the first reply and the answer to the result."""
    first = oa.chat.completions.create(messages=ask, tools=[weather], tool_choice="required", **greedy)
    call = first.choices[0].message.tool_calls[0]
    follow = ask + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 18, "sky": "clear"})},
    ]
    return first, oa.chat.completions.create(messages=follow, tools=[weather], tool_choice="none", **greedy)


def reasoning_of(msg):
    return getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content")


if mode == "tools":
    ask = [{"role": "user", "content": "What's the weather like in Paris right now? Use celsius."}]
    r = oa.chat.completions.create(messages=ask, tools=[weather, clock], **greedy)
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and m.tool_calls, f"auto: a call {m}")
    check(m.content is None, f"only calls: content is null ({m.content!r})")
    whole = [(c.function.name, c.function.arguments) for c in m.tool_calls]
    for c in m.tool_calls:
        check(c.type == "function" and c.id.startswith("call_"), f"call shape {c}")
        check(valid(json.loads(c.function.arguments), schemas[c.function.name]),
              f"arguments validate: {c.function.arguments}")
    calls, content, _, finish = accumulate(oa.chat.completions.create(
        messages=ask, tools=[weather, clock], stream=True, **greedy))
    check(finish == "tool_calls", f"streamed finish_reason {finish}")
    check([(c["name"], c["arguments"]) for c in calls] == whole,
          f"streamed calls {calls} == whole {whole}")
    check(all(c["id"] for c in calls), "each streamed call has an id")
    conforms("ChatCompletion", post("/v1/chat/completions", dict(
        messages=ask, tools=[weather, clock], **greedy)))

    # required: a valid call whatever the prompt, sampled or not.
    prompts = ["Hello!", "Write a haiku about the sea.", "What is 2 + 2?", "Tell me the time in Tokyo."]
    for i, p in enumerate(prompts):
        for t in (0, 1.0):
            r = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                           tools=[weather, clock], tool_choice="required",
                                           temperature=t, seed=i, max_tokens=120)
            tc = r.choices[0].message.tool_calls
            check(tc and r.choices[0].finish_reason == "tool_calls", f"required on {p!r}: {r.choices[0]}")
            for c in tc:
                check(valid(json.loads(c.function.arguments), schemas[c.function.name]),
                      f"required {p!r}: {c.function.arguments}")
    # A named tool: that tool.
    r = oa.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], tools=[weather, clock],
                                   tool_choice={"type": "function", "function": {"name": "get_time"}},
                                   **greedy)
    check([c.function.name for c in r.choices[0].message.tool_calls] == ["get_time"], "named tool")
    # parallel_tool_calls false: one call at most.
    r = oa.chat.completions.create(messages=ask, tools=[weather, clock], tool_choice="required",
                                   parallel_tool_calls=False, **greedy)
    check(len(r.choices[0].message.tool_calls) == 1, "parallel_tool_calls false: one call")
    # none: no call.
    r = oa.chat.completions.create(messages=ask, tools=[weather, clock], tool_choice="none", **greedy)
    check(not r.choices[0].message.tool_calls and r.choices[0].message.content, "none: text")

    # The tool's result sent back: a final answer in text.
    first, final = round_trip(ask)
    fm = final.choices[0].message
    check(final.choices[0].finish_reason in ("stop", "length") and fm.content and not fm.tool_calls,
          f"a final answer after the tool result: {fm}")
    check("18" in fm.content, f"the answer uses the result: {fm.content!r}")

    # Bad input: a 400 naming the tool.
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "string", "pattern": "x"}}}
    try:
        oa.chat.completions.create(messages=ask, tools=[bad], **greedy)
        check(False, "an unenforceable parameters schema is refused")
    except openai.BadRequestError as e:
        check("tools[0] (f)" in str(e), f"the 400 names the tool: {e}")

    # Ollama: a Python function as the tool; the call comes back whole, arguments an object.
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
          city: The city's name
        """
        return "sunny"

    r = ol.chat(model=model, messages=ask, tools=[get_weather], options={"temperature": 0})
    tc = r.message.tool_calls
    check(tc and tc[0].function.name == "get_weather" and isinstance(tc[0].function.arguments, dict)
          and isinstance(tc[0].function.arguments.get("city"), str), f"ollama call {r.message}")
    parts = list(ol.chat(model=model, messages=ask, tools=[get_weather], options={"temperature": 0},
                         stream=True))
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    check([(c.function.name, dict(c.function.arguments)) for c in streamed]
          == [(c.function.name, dict(c.function.arguments)) for c in tc], "ollama streamed calls")
    conforms("OllamaChatRecord", post("/api/chat", dict(
        model=model, messages=ask, tools=[weather], stream=False, options={"temperature": 0})))
    show = ol.show(model)
    check("tools" in show.capabilities, f"/api/show lists tools: {show.capabilities}")

elif mode == "open":
    # The template ends the prompt with <think>: the answer is reasoning up to </think>. A JSON
    # schema forces a `</think>` into the text, so both sides are certain to be there.
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": {"const": "plan</think>answer"}}}
    ask = [{"role": "user", "content": "Think, then answer."}]
    raw = oa.chat.completions.create(messages=ask, response_format=fmt,
                                     extra_body={"reasoning_format": "none"}, **greedy)
    check(raw.choices[0].message.content == '"plan</think>answer"', f"raw text kept: {raw.choices[0].message}")
    r = oa.chat.completions.create(messages=ask, response_format=fmt, **greedy)
    m = r.choices[0].message
    check(reasoning_of(m) == '"plan' and m.content == 'answer"', f"split: {m}")
    _, content, reasoning, _ = accumulate(oa.chat.completions.create(
        messages=ask, response_format=fmt, stream=True, **greedy))
    check((reasoning, content) == ('"plan', 'answer"'), f"streamed split: {reasoning!r} {content!r}")
    schema = {"const": "plan</think>answer"}
    o = ol.chat(model=model, messages=ask, format=schema, options={"temperature": 0})
    check(o.message.thinking == '"plan' and o.message.content == 'answer"', f"ollama split {o.message}")
    parts = list(ol.chat(model=model, messages=ask, format=schema, options={"temperature": 0}, stream=True))
    check("".join(p.message.thinking or "" for p in parts) == '"plan'
          and "".join(p.message.content or "" for p in parts) == 'answer"', "ollama streamed split")
    o = ol.chat(model=model, messages=ask, format=schema, think=False, options={"temperature": 0})
    check(not o.message.thinking, f"think false: no thinking ({o.message})")
    # /api/generate renders the prompt through the same template: thinking apart there too.
    g = ol.generate(model=model, prompt="Think, then answer.", format=schema, options={"temperature": 0})
    check(g.thinking == '"plan' and g.response == 'answer"', f"generate split {g}")
    parts = list(ol.generate(model=model, prompt="Think, then answer.", format=schema,
                             options={"temperature": 0}, stream=True))
    check("".join(p.thinking or "" for p in parts) == '"plan'
          and "".join(p.response or "" for p in parts) == 'answer"', "generate streamed split")
    try:
        ol.generate(model=model, prompt="x", raw=True, think=True)
        check(False, "think with raw is refused")
    except ollama.ResponseError as e:
        check(e.status_code == 400 and "think" in str(e), f"think with raw: {e}")
    conforms("ChatCompletion", post("/v1/chat/completions", dict(
        messages=ask, response_format=fmt, **greedy)))
    conforms("OllamaChatRecord", post("/api/chat", dict(
        model=model, messages=ask, format=schema, stream=False, options={"temperature": 0})))
    conforms("OllamaGenerateRecord", post("/api/generate", dict(
        model=model, prompt="Think, then answer.", format=schema, stream=False,
        options={"temperature": 0})))
    check("thinking" in ol.show(model).capabilities, "/api/show lists thinking")
    # Unforced: all of it is reasoning (no </think> was written) and equals the raw text.
    ask2 = [{"role": "user", "content": "Say hi."}]
    rawt = oa.chat.completions.create(messages=ask2, extra_body={"reasoning_format": "none"},
                                      **dict(greedy, max_tokens=12)).choices[0].message.content
    m = oa.chat.completions.create(messages=ask2, **dict(greedy, max_tokens=12)).choices[0].message
    if "</think>" not in rawt:
        check(reasoning_of(m) == rawt.strip() and not m.content, f"unclosed: all reasoning {m} vs {rawt!r}")

elif mode == "tagged":
    # A thinking template whose prompt does not open <think>: an answer that does not start
    # with <think> is content, with no reasoning; a <think> inside it stays content.
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": {"const": "<think>x</think>y"}}}
    ask = [{"role": "user", "content": "Answer."}]
    r = oa.chat.completions.create(messages=ask, response_format=fmt, **greedy)
    m = r.choices[0].message
    check(m.content == '"<think>x</think>y"' and not reasoning_of(m), f"not at the start: content {m}")
    _, content, reasoning, _ = accumulate(oa.chat.completions.create(
        messages=ask, response_format=fmt, stream=True, **greedy))
    check(content == '"<think>x</think>y"' and not reasoning, "streamed: content")
    o = ol.chat(model=model, messages=ask, format={"const": "<think>x</think>y"}, options={"temperature": 0})
    check(o.message.content == '"<think>x</think>y"' and not o.message.thinking, f"ollama: {o.message}")
    plain = oa.chat.completions.create(messages=[{"role": "user", "content": "Say hi."}],
                                       **dict(greedy, max_tokens=12)).choices[0].message
    check(plain.content and not reasoning_of(plain), f"plain answer is content: {plain}")
    # History with reasoning sent back is accepted.
    h = [{"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello", "reasoning_content": "greet"},
         {"role": "user", "content": "Again"}]
    check(oa.chat.completions.create(messages=h, **dict(greedy, max_tokens=4)).choices[0].message
          is not None, "reasoning_content in history")
    check(ol.chat(model=model, messages=[{"role": "user", "content": "Hi"},
                                         {"role": "assistant", "content": "Hello", "thinking": "greet"},
                                         {"role": "user", "content": "Again"}],
                  options={"temperature": 0, "num_predict": 4}).message is not None, "thinking in history")

elif mode == "format":
    # Another family's template over the same weights: the call is forced (`required`), so its
    # format is the template's, and the result goes back through the template's tool turn.
    ask = [{"role": "user", "content": "What's the weather like in Paris right now? Use celsius."}]
    r = oa.chat.completions.create(messages=ask, tools=[weather, clock], tool_choice="required", **greedy)
    m = r.choices[0].message
    check(r.choices[0].finish_reason == "tool_calls" and m.tool_calls, f"required: a call {m}")
    for c in m.tool_calls:
        check(valid(json.loads(c.function.arguments), schemas[c.function.name]),
              f"arguments validate: {c.function.arguments}")
    whole = [(c.function.name, c.function.arguments) for c in m.tool_calls]
    calls, _, _, finish = accumulate(oa.chat.completions.create(
        messages=ask, tools=[weather, clock], tool_choice="required", stream=True, **greedy))
    check(finish == "tool_calls" and [(c["name"], c["arguments"]) for c in calls] == whole,
          f"streamed calls {calls} == whole {whole}")
    r = oa.chat.completions.create(messages=ask, tools=[weather, clock],
                                   tool_choice={"type": "function", "function": {"name": "get_time"}},
                                   **greedy)
    check([c.function.name for c in r.choices[0].message.tool_calls] == ["get_time"], "named tool")
    conforms("ChatCompletion", post("/v1/chat/completions", dict(
        messages=ask, tools=[weather], tool_choice="required", **greedy)))
    first, final = round_trip(ask)
    fm = final.choices[0].message
    # These weights were not trained on this template, so what they answer is theirs; the
    # template took the call and the result (more prompt than the question alone).
    check(final.choices[0].finish_reason in ("stop", "length") and not fm.tool_calls,
          f"an answer after the tool result: {final.choices[0]}")
    check(final.usage.prompt_tokens > first.usage.prompt_tokens + 10,
          f"the call and its result are in the prompt: {final.usage} vs {first.usage}")

print(f"{mode}: {passed()} checks passed")
