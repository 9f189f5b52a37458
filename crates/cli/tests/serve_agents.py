"""The coding agents' APIs through the official Python clients (PyPI `anthropic`, `openai`
Responses, `openai-agents`) against `snug serve` (issue 48). Usage: serve_agents.py BASE_URL
MODEL MODE [KEY], MODE one of `messages`, `responses`, `agents`, `turns`. Exits non-zero on a
failed check. The same script runs against llama-server (scripts/agents_vs_llamacpp.sh).
"""

import json
import sys
import urllib.request
from checks import check, passed

base, model, mode = sys.argv[1:4]
key = sys.argv[4] if len(sys.argv) > 4 else "none"


weather_schema = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}


def valid(args):
    return (isinstance(args, dict) and set(args) == {"city", "unit"}
            and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit"))


def messages():
    import anthropic
    c = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    greedy = dict(model=model, max_tokens=24, extra_body={"temperature": 0})
    hi = [{"role": "user", "content": "Say hello in five words."}]

    m = c.messages.create(messages=hi, **greedy)
    check(m.type == "message" and m.role == "assistant", f"a message: {m}")
    check(m.content and m.content[0].type == "text" and m.content[0].text, f"text: {m.content}")
    check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
    u = m.usage
    check(u.input_tokens > 0 and u.output_tokens > 0, f"usage {u}")
    n = c.messages.count_tokens(model=model, messages=hi)
    check(n.input_tokens == u.input_tokens + u.cache_read_input_tokens,
          f"count_tokens {n.input_tokens} = input {u.input_tokens} + cache read {u.cache_read_input_tokens}")

    # The same prompt again: served from the prefix cache, and Anthropic's usage says so.
    again = c.messages.create(messages=hi, **greedy)
    check(again.usage.cache_read_input_tokens > 0, f"a repeated prompt reads the cache: {again.usage}")
    check(again.usage.input_tokens + again.usage.cache_read_input_tokens == n.input_tokens,
          "input + cache read is the prompt")

    # Streamed: the SDK assembles the same kind of message from the events.
    with c.messages.stream(messages=hi, **greedy) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    check(kinds[0] == "message_start" and kinds[-1] == "message_stop", f"event order {kinds}")
    check("content_block_start" in kinds and "content_block_stop" in kinds, f"blocks {kinds}")
    check(final.content[0].type == "text" and final.content[0].text, f"streamed text {final}")
    check(final.usage.output_tokens > 0 and final.stop_reason, f"streamed usage {final.usage}")

    # System blocks with cache_control, and a stop sequence that is reported.
    sys_blocks = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    count = [{"role": "user", "content": "Count from 1 to 9 separated by commas."}]
    m = c.messages.create(messages=count, system=sys_blocks, stop_sequences=["5"], **greedy)
    check(m.stop_reason in ("stop_sequence", "end_turn", "max_tokens"), f"stop {m.stop_reason}")
    if m.stop_reason == "stop_sequence":
        check(m.stop_sequence == "5" and "5" not in m.content[0].text, f"stop_sequence {m}")

    # A forced call, held to the tool's schema, then its result sent back.
    tool = {"name": "get_weather", "description": "Get the current weather in a city",
            "input_schema": weather_schema}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    call_kw = dict(model=model, max_tokens=60, tools=[tool], extra_body={"temperature": 0})
    m = c.messages.create(messages=ask, tool_choice={"type": "tool", "name": "get_weather"}, **call_kw)
    uses = [b for b in m.content if b.type == "tool_use"]
    check(m.stop_reason == "tool_use" and len(uses) == 1, f"a forced call: {m}")
    check(uses[0].name == "get_weather" and valid(uses[0].input), f"call input {uses[0].input}")
    check(uses[0].id, "the call has an id")

    with c.messages.stream(messages=ask, tool_choice={"type": "any"}, **call_kw) as s:
        deltas = [e.delta.type for e in s if e.type == "content_block_delta"]
        streamed = s.get_final_message()
    suses = [b for b in streamed.content if b.type == "tool_use"]
    check("input_json_delta" in deltas and suses and valid(suses[0].input), f"streamed call {streamed}")
    check(streamed.stop_reason == "tool_use", f"streamed stop {streamed.stop_reason}")

    history = ask + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                   "content": "18 degrees and sunny"}]}]
    after = c.messages.create(messages=history, **call_kw)
    text = "".join(b.text for b in after.content if b.type == "text")
    check(after.stop_reason in ("end_turn", "max_tokens", "tool_use") and after.content, f"after the result: {after}")
    # The round trip re-renders the call as generated: the prompt extends the last one.
    check(after.usage.cache_read_input_tokens >= m.usage.input_tokens + m.usage.cache_read_input_tokens - 32,
          f"the turn after a call reads the previous prompt from the cache: {after.usage} vs {m.usage}")
    print("after the tool result:", text[:80])

    # tool_choice none: no call even with tools.
    m = c.messages.create(messages=ask, tool_choice={"type": "none"}, **call_kw)
    check(all(b.type != "tool_use" for b in m.content), f"none makes no call: {m}")

    # Errors in Anthropic's shape.
    try:
        c.messages.create(messages=[], **greedy)
        check(False, "an empty conversation is refused")
    except anthropic.BadRequestError as e:
        body = e.response.json()
        check(body["type"] == "error" and body["error"]["type"] == "invalid_request_error", f"shape {body}")
    # A coding agent's own model name is answered by the served model; an adapter not
    # registered is still a 404, in Anthropic's shape.
    m = c.messages.create(messages=hi, model="claude-sonnet-4-5", max_tokens=4)
    check(m.model == model and m.content, f"another vendor's name is served: {m}")
    try:
        c.messages.create(messages=hi, model=model + ":no-such-adapter", max_tokens=4)
        check(False, "an unknown adapter is refused")
    except anthropic.NotFoundError as e:
        check(e.response.json()["error"]["type"] == "not_found_error", "404 in Anthropic's shape")


def responses():
    import openai
    oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    greedy = dict(model=model, temperature=0, max_output_tokens=24)

    brief = "You are a helpful assistant. Answer briefly and plainly, in one short sentence, without lists."
    r = oa.responses.create(input="Say hello in five words.", instructions=brief, **greedy)
    check(r.object == "response" and r.status in ("completed", "incomplete"), f"a response {r}")
    check(r.output_text, f"output_text {r.output}")
    check(r.usage.input_tokens > 0 and r.usage.output_tokens > 0, f"usage {r.usage}")
    again = oa.responses.create(input="Say hello in five words.", instructions=brief, **greedy)
    check(again.usage.input_tokens_details.cached_tokens > 0, f"cached tokens {again.usage}")

    with oa.responses.stream(input="Say hello in five words.", **greedy) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    check(kinds[:2] == ["response.created", "response.in_progress"], f"opening {kinds[:3]}")
    check("response.output_text.delta" in kinds and kinds[-1] in ("response.completed", "response.incomplete"), f"events {kinds}")
    check(final.output_text, f"streamed text {final}")

    tools = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
              "parameters": weather_schema},
             {"type": "web_search"}, {"type": "image_generation"}]
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    call_kw = dict(model=model, temperature=0, max_output_tokens=60, tools=tools)
    r = oa.responses.create(input=ask, tool_choice="required", **call_kw)
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) >= 1 and calls[0].name == "get_weather", f"a required call, built-in tools ignored: {r.output}")
    check(valid(json.loads(calls[0].arguments)), f"arguments {calls[0].arguments}")

    with oa.responses.stream(input=ask, tool_choice={"type": "function", "name": "get_weather"}, **call_kw) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    fc = [o for o in final.output if o.type == "function_call"]
    check("response.function_call_arguments.delta" in kinds and fc and valid(json.loads(fc[0].arguments)),
          f"streamed call {kinds} {final.output}")

    history = ask + [o.model_dump(exclude_none=True) for o in r.output] + [
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees and sunny"}]
    after = oa.responses.create(input=history, **call_kw)
    check(after.output, f"after the output: {after}")
    check(after.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens - 32,
          f"the turn after a call reads the previous prompt from the cache: {after.usage} vs {r.usage}")
    print("after the function output:", after.output_text[:80])

    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
              "additionalProperties": False}
    r = oa.responses.create(input="Name a city in France as JSON.", model=model, temperature=0,
                            max_output_tokens=40,
                            text={"format": {"type": "json_schema", "name": "c", "schema": schema}})
    check(isinstance(json.loads(r.output_text).get("city"), str), f"json_schema {r.output_text}")

    r = oa.responses.create(input="hi", model="gpt-5-codex", temperature=0, max_output_tokens=4)
    check(r.model == model and r.output, f"another vendor's name is served: {r}")

    try:
        oa.responses.create(input="hi", previous_response_id="resp_1", **greedy)
        check(False, "previous_response_id is refused")
    except openai.BadRequestError as e:
        check("stateless" in str(e), f"a clear 400: {e}")


def agents_sdk():
    import asyncio
    import openai
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from agents import ModelSettings

    set_tracing_disabled(True)
    called = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        called.append(city)
        return f"It is 18 degrees and sunny in {city}."

    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer weather questions by calling get_weather, then answer in one sentence.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=model, openai_client=client),
        model_settings=ModelSettings(temperature=0, max_tokens=60, tool_choice="required"),
        reset_tool_choice=True,
    )
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=4))
    check(called, "the agent's tool was called")
    check(isinstance(result.final_output, str) and result.final_output.strip(), f"a final answer: {result.final_output!r}")
    print("agent:", called, result.final_output[:80])


def turns():
    """A 3-turn tool session through each API (scripts/bench_agents.py's requests): each later
    turn's prompt reads the previous prompt and answer from the prefix cache, though the answer's
    tokens are not those its text tokenizes to (prompt reuse by text, engine::reuse)."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts", "bench_agents.py")
    spec = importlib.util.spec_from_file_location("bench_agents", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # A call of at least 40 tokens (the enum's one value is written whole), so that every answer
    # holds a block boundary of the prefix cache: the cache reaching past the previous prompt
    # then says the answer was reused, whatever the prompt's length.
    report = "temperature, wind, humidity, cloud cover and rain for each of the next hours"
    bench.SCHEMA = {"type": "object", "properties": {
        "city": {"type": "string"}, "report": {"type": "string", "enum": [report]}},
        "required": ["city", "report"]}
    for api in ("chat", "messages", "responses"):
        system = bench.SYSTEM.format(api=api)
        history = [{"role": "user", "content": "Check the weather in Paris, then Berlin, then Rome, one at a time."}]
        tools = bench.tools_for(api)
        last = None
        for t in range(1, 4):
            add, prompt, cached, out = bench.turn(base, api, model, key, system, history, tools, True)
            history += add
            print(f"{api} turn {t}: prompt {prompt} cached {cached} output {out}")
            check(out >= 40, f"{api} turn {t}: a call of at least 40 tokens ({out})")
            if last is not None:
                # Into the previous answer (without reuse by text the cache stops at the last
                # block of the previous prompt), and through it less the last partial block,
                # the answer's final token (never fed, so never cached) and a few tokens where
                # the answer's split differs from its text's tokenization.
                reach = last[0] + last[1] - 32 - 4
                check(cached > last[0] and cached >= reach,
                      f"{api} turn {t} reads the previous answer from the cache: "
                      f"cached {cached}, previous prompt {last[0]} + answer {last[1]}")
            last = (prompt, out)


{"messages": messages, "responses": responses, "agents": agents_sdk, "turns": turns}[mode]()
print(f"{mode}: {passed()} checks passed")
