"""The official Python clients against `snug serve`, unchanged: PyPI `openai` and `ollama`.

Usage: serve_clients.py BASE_URL API_KEY MODEL. Exits non-zero on the first failed check.
Short prompts and few tokens: the whole script runs in seconds on qwen2.5-coder-0.5b.
"""

import http.client
import json
import math
import sys
import time
import urllib.error
import urllib.request

from typing import Literal, Optional, Union

import ollama
import openai
import pydantic
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from checks import check, passed

base, key, model = sys.argv[1:4]


def raises(exc, fn, what):
    try:
        fn()
    except exc as e:
        check(True, what)
        return e
    raise AssertionError(f"{what}: no {exc.__name__} raised")


def scrape():
    """/metrics parsed by the official Prometheus client's (strict) OpenMetrics parser:
    {(sample name, labels as a sorted tuple): value}."""
    req = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req) as h:
        text = h.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


metrics_before = scrape()

# --- OpenAI -------------------------------------------------------------------------------
oa = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
check([m.id for m in oa.models.list().data] == [model], "/v1/models lists the served model")

hello = [{"role": "user", "content": "Say hello in five words."}]
greedy = dict(model=model, temperature=0, max_tokens=8)
r = oa.chat.completions.create(messages=hello, **greedy)
answer = r.choices[0].message.content
check(answer, "chat answers")
u = r.usage
check(u.prompt_tokens > 5 and 0 < u.completion_tokens <= 8, f"chat usage {u}")
check(u.total_tokens == u.prompt_tokens + u.completion_tokens, "total = prompt + completion")

chunks = list(
    oa.chat.completions.create(
        messages=hello, stream=True, stream_options={"include_usage": True}, **greedy
    )
)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(streamed == answer, f"streamed chat {streamed!r} == whole {answer!r}")
finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
check(finishes == [r.choices[0].finish_reason], f"one finish_reason {finishes}")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == u.completion_tokens,
      "include_usage: the last chunk has the same usage")

c = oa.completions.create(model=model, prompt="def add(a, b):", max_tokens=6, temperature=0)
check(c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 6,
      f"max_tokens is exact: {c.usage}")
text = c.choices[0].text
parts = list(oa.completions.create(model=model, prompt="def add(a, b):", max_tokens=6,
                                   temperature=0, stream=True))
check("".join(p.choices[0].text for p in parts if p.choices) == text, "streamed completion")

# Stop at a word of the greedy answer: the text ends right before it.
words = [w for w in text.split() if len(w) > 1]
if words:
    s = oa.completions.create(model=model, prompt="def add(a, b):", max_tokens=6,
                              temperature=0, stop=[words[-1]])
    check(s.choices[0].finish_reason == "stop", "stop ends with finish_reason stop")
    check(s.choices[0].text == text[: text.find(words[-1])], f"stop text {s.choices[0].text!r}")

# JSON mode: the answer is one JSON object, closed before the token budget, sampled or not.
ask_json = [{"role": "user", "content": "Give a person's name and age as JSON."}]
for t in (0, 1.0):
    j = oa.chat.completions.create(model=model, messages=ask_json, max_tokens=60, temperature=t,
                                   seed=7, response_format={"type": "json_object"})
    content = j.choices[0].message.content
    check(j.choices[0].finish_reason == "stop" and isinstance(json.loads(content), dict),
          f"json_object at temperature {t}: {content!r}")
# (The legacy completions call has no response_format parameter: it goes in the body.)
jc = oa.completions.create(model=model, prompt="Once upon a time", max_tokens=60, temperature=0,
                           extra_body={"response_format": {"type": "json_object"}})
check(jc.choices[0].text.startswith("{") and isinstance(json.loads(jc.choices[0].text), dict),
      f"json_object on a prompt that is no question: {jc.choices[0].text!r}")

# Structured output: the client's own pydantic route (the schema it writes from a model class,
# strict), and a schema the server cannot enforce, refused with a 400 that names the keyword.
class Person(pydantic.BaseModel):
    name: str
    age: int
    hobbies: list[str]
    pet: Optional[Literal["cat", "dog"]]


parse = getattr(oa.chat.completions, "parse", None) or oa.beta.chat.completions.parse
ask_person = [{"role": "user", "content": "Describe a person as JSON: name, age, hobbies, pet."}]
for t in (0, 1.0):
    ps = parse(model=model, messages=ask_person, max_tokens=80, temperature=t, seed=3,
               response_format=Person)
    check(ps.choices[0].finish_reason == "stop" and isinstance(ps.choices[0].message.parsed, Person),
          f"json_schema at temperature {t}: {ps.choices[0].message.content!r}")
# A union of two model classes (`anyOf` of two object types, which the first character does not
# tell apart), as pydantic writes `list[Union[Cat, Dog]]`, and a string with length bounds.
class Cat(pydantic.BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(pydantic.BaseModel):
    kind: Literal["dog"]
    good: bool
    name: str = pydantic.Field(min_length=1, max_length=12)


class Pets(pydantic.BaseModel):
    pets: list[Union[Cat, Dog]] = pydantic.Field(max_length=3)


ask_pets = [{"role": "user", "content": "List two pets as JSON: a cat and a dog."}]
pp = parse(model=model, messages=ask_pets, max_tokens=120, temperature=0, response_format=Pets)
check(pp.choices[0].finish_reason == "stop" and isinstance(pp.choices[0].message.parsed, Pets),
      f"json_schema with a union of models: {pp.choices[0].message.content!r}")
e = raises(openai.BadRequestError,
           lambda: oa.chat.completions.create(
               model=model, messages=ask_json, max_tokens=4,
               response_format={"type": "json_schema", "json_schema": {
                   "name": "p", "schema": {"type": "string", "pattern": "^a"}}}),
           "json_schema with a pattern")
check("pattern" in str(e), f"an unsupported schema's 400 names the keyword: {e}")

# Tools: serve_tools.py checks calls; here an empty list and tool_choice none answer in text.
none = oa.chat.completions.create(model=model, messages=hello, max_tokens=4, tools=[], tool_choice="none")
check(none.choices[0].message.content is not None, "an empty tools list and tool_choice none are fine")

sampled = dict(model=model, messages=hello, max_tokens=8, temperature=1.0, top_p=1.0)
a = oa.chat.completions.create(seed=42, **sampled).choices[0].message.content
b = oa.chat.completions.create(seed=42, **sampled).choices[0].message.content
check(a == b, f"same seed, same text: {a!r} vs {b!r}")

# logprobs: the greedy token is the most likely one, every logprob <= 0, a top list's
# probabilities sum to at most 1, and streamed values equal the whole response's.
def check_top(tok, lp, tops, what):
    check(lp <= 0 and all(t <= 0 for t in tops), f"{what}: logprobs <= 0")
    check(sum(math.exp(t) for t in tops) <= 1 + 1e-6, f"{what}: top probabilities sum <= 1")
    check(tops and abs(max(tops) - lp) < 1e-6, f"{what}: greedy {tok!r} is the top-1")


lp = dict(logprobs=True, top_logprobs=3, **greedy)
r = oa.chat.completions.create(messages=hello, **lp)
content = r.choices[0].logprobs.content
check(len(content) == r.usage.completion_tokens, "one chat logprob per generated token")
check("".join(t.token for t in content).startswith(r.choices[0].message.content[:4]),
      "the tokens spell the answer")
for t in content:
    check(len(t.top_logprobs) == 3 and t.bytes is not None, f"chat entry {t}")
    check_top(t.token, t.logprob, [x.logprob for x in t.top_logprobs], "chat")
chunks = list(oa.chat.completions.create(messages=hello, stream=True, **lp))
streamed = [t for c in chunks if c.choices and c.choices[0].logprobs
            for t in c.choices[0].logprobs.content]
check([(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content],
      "streamed chat logprobs == whole")
raises(openai.BadRequestError, lambda: oa.chat.completions.create(
    messages=hello, top_logprobs=21, logprobs=True, **greedy), "top_logprobs > 20 is 400")

c = oa.completions.create(model=model, prompt="def add(a, b):", max_tokens=6, temperature=0,
                          logprobs=2)
l = c.choices[0].logprobs
check(len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) == len(l.text_offset) == 6,
      f"legacy logprobs lists {l}")
check("".join(l.tokens) == c.choices[0].text, "legacy tokens spell the text")
check(l.text_offset[0] == 0 and l.text_offset == sorted(l.text_offset), "text offsets")
for tok, t, tops in zip(l.tokens, l.token_logprobs, l.top_logprobs):
    check(len(tops) == 2, f"legacy top list {tops}")
    check_top(tok, t, list(tops.values()), "completion")
parts = list(oa.completions.create(model=model, prompt="def add(a, b):", max_tokens=6,
                                   temperature=0, logprobs=2, stream=True))
streamed = [x for p in parts if p.choices and p.choices[0].logprobs
            for x in zip(p.choices[0].logprobs.tokens, p.choices[0].logprobs.token_logprobs,
                         p.choices[0].logprobs.text_offset)]
check(streamed == list(zip(l.tokens, l.token_logprobs, l.text_offset)),
      "streamed legacy logprobs == whole")

e = raises(openai.NotFoundError, lambda: oa.chat.completions.create(
    model="no-such-model", messages=hello, max_tokens=2), "unknown model is 404")
check(e.body.get("code") == "model_not_found", f"OpenAI error shape: {e.body}")
raises(openai.BadRequestError, lambda: oa.chat.completions.create(
    model=model, messages=[], max_tokens=2), "no messages is 400")
e = raises(openai.BadRequestError, lambda: oa.completions.create(
    model=model, prompt="word " * 5000, max_tokens=2), "a prompt past the context is 400")
check("tokens" in e.body.get("message", ""), f"the 400 says the numbers: {e.body}")
bad = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
raises(openai.AuthenticationError, lambda: bad.models.list(), "a wrong key is 401")

# --- Ollama -------------------------------------------------------------------------------
ol = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"})
check(any(m.model == model for m in ol.list().models), "/api/tags lists the model")
show = ol.show(model)
check(show.details.format == "gguf" and show.modelinfo, f"/api/show {show.details}")
check([m.model for m in ol.ps().models] == [model], "/api/ps shows the loaded model")

opts = {"num_predict": 8, "temperature": 0, "seed": 1}
r = ol.chat(model=model, messages=hello, options=opts)
check(r.done and r.message.content, "ollama chat answers")
check(r.message.content == answer, f"same greedy answer on both APIs: {r.message.content!r}")
check(r.prompt_eval_count == u.prompt_tokens and r.eval_count == u.completion_tokens,
      f"ollama counts {r.prompt_eval_count}/{r.eval_count}")
check(r.total_duration >= r.prompt_eval_duration + r.eval_duration > 0, "durations in ns")
parts = list(ol.chat(model=model, messages=hello, options=opts, stream=True))
check("".join(p.message.content for p in parts) == r.message.content, "streamed ollama chat")
check(parts[-1].done and not any(p.done for p in parts[:-1]), "only the last record is done")

g = ol.generate(model=model, prompt="def add(a, b):", raw=True,
                options={"num_predict": 6, "temperature": 0})
check(g.response == text and g.eval_count == 6 and g.done_reason == "length",
      f"raw generate == completion: {g.response!r}")
gs = list(ol.generate(model=model, prompt="Name a color.", options={"num_predict": 4}, stream=True))
check(gs[-1].done and gs[-1].eval_count <= 4, "streamed generate")

jo = ol.chat(model=model, messages=ask_json, format="json", options={"num_predict": 60})
check(isinstance(json.loads(jo.message.content), dict), f"ollama format json: {jo.message.content!r}")
js = ol.chat(model=model, messages=ask_person, format=Person.model_json_schema(),
             options={"num_predict": 80, "temperature": 0})
check(js.done_reason == "stop" and isinstance(Person.model_validate_json(js.message.content), Person),
      f"ollama format schema: {js.message.content!r}")
jp = ol.chat(model=model, messages=ask_pets, format=Pets.model_json_schema(),
             options={"num_predict": 120, "temperature": 0})
check(jp.done_reason == "stop" and isinstance(Pets.model_validate_json(jp.message.content), Pets),
      f"ollama format schema with a union of models: {jp.message.content!r}")
e = raises(ollama.ResponseError,
           lambda: ol.generate(model=model, prompt="x", format={"type": "integer", "minimum": 0}),
           "ollama format with a range")
check(e.status_code == 400 and "minimum" in str(e), f"an unsupported schema is 400: {e}")

e = raises(ollama.ResponseError, lambda: ol.chat(model="no-such-model", messages=hello),
           "ollama: unknown model")
check(e.status_code == 404, f"ollama 404: {e}")

# Pull: the served model is cached, so it answers at once (the hub's known aliases only).
pulled = list(ol.pull(model, stream=True))
check(pulled[-1].status == "success", f"pull ends in success: {pulled}")
check(any(p.total and p.completed == p.total and p.digest for p in pulled),
      f"a progress record with the whole file done: {pulled}")
check(ol.pull(model, stream=False).status == "success", "pull without streaming")
e = raises(ollama.ResponseError, lambda: ol.pull("no-such-model"), "pull of an unknown name")
check(e.status_code == 404 and "known" in str(e), f"pull 404 names the known models: {e}")

# --- Admission: a full queue is 429 with Retry-After; a client that leaves frees its slot ----
# The server runs 2 sequences with 1 waiting request at most (--parallel 2 --queue 1).
host, port = base.removeprefix("http://").split(":")
auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


def long_stream():
    body = json.dumps({"prompt": "Count to one thousand: 1, 2, 3,", "max_tokens": 900,
                       "temperature": 0, "stream": True})
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    c.request("POST", "/v1/completions", body=body, headers=auth)
    return c, c.getresponse()


running = [long_stream() for _ in range(2)]
for _, resp in running:
    line = resp.readline()
    check(resp.status == 200 and line.startswith(b"data: "), f"two streams run: {resp.status} {line[:300]!r}")
waiting = long_stream()
check(waiting[1].status == 200, "a third request waits")
c, resp = long_stream()
check(resp.status == 429 and resp.getheader("Retry-After"), "a fourth is 429 with Retry-After")
check(json.loads(resp.read())["error"]["code"] == "server_busy", "429 in OpenAI's shape")
c.close()
for c, _ in running + [waiting]:
    c.close()


def gauge(name):
    req = urllib.request.Request(base + "/metrics", headers=auth)
    with urllib.request.urlopen(req) as h:
        for line in h.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])


deadline = time.monotonic() + 30
while gauge("snug_running_sequences") != 0 and time.monotonic() < deadline:
    time.sleep(0.1)
check(gauge("snug_running_sequences") == 0 and gauge("snug_queue_depth") == 0,
      "clients that left free their sequences at once")

# --- Plain HTTP ---------------------------------------------------------------------------
with urllib.request.urlopen(base + "/health") as h:
    check(json.load(h)["status"] == "ok", "/health needs no key")
req = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {key}"})
with urllib.request.urlopen(req) as h:
    m = h.read().decode()
check('snug_http_requests_total{route="/v1/chat/completions",status="200"}' in m, "metrics by route")
check("snug_generated_tokens_total" in m and "snug_queue_depth" in m, "token and queue metrics")
try:
    urllib.request.urlopen(base + "/v1/models")
    raise AssertionError("no key: expected 401")
except urllib.error.HTTPError as err:
    check(err.code == 401 and "error" in json.load(err), "no key is 401 in OpenAI's shape")

big = urllib.request.Request(base + "/v1/completions", data=b"x" * (5 << 20),
                             headers={"Authorization": f"Bearer {key}"})
try:
    urllib.request.urlopen(big)
    raise AssertionError("a 5 MiB body: expected 413")
except urllib.error.HTTPError as err:
    check(err.code == 413 and "error" in json.load(err), "a body past --max-body is 413")

# --- Metrics moved as they should ---------------------------------------------------------
after = scrape()


def moved(name, labels=()):
    key_ = (name, tuple(sorted(labels)))
    return after.get(key_, 0) - metrics_before.get(key_, 0)


for series in ("snug_generated_tokens_total", "snug_prompt_tokens_total",
               "snug_time_to_first_token_seconds_count", "snug_inter_token_seconds_count"):
    check(moved(series) > 0, f"{series} grew")
check(moved("snug_http_requests_total", [("route", "/v1/chat/completions"), ("status", "200")])
      >= 2, "requests counted by route and status")
check(moved("snug_http_requests_total", [("route", "/api/pull"), ("status", "404")]) == 1,
      "the unknown pull counted as a 404")
rss, budget = after[("snug_resident_memory_bytes", ())], after[("snug_memory_budget_bytes", ())]
check(0 < rss < budget, f"RSS {rss} within the budget {budget}")
pool = lambda m: sum(m[(f"snug_kv_blocks_{k}", ())] for k in ("used", "free", "cached"))
check(pool(after) == pool(metrics_before) > 0, "KV blocks used + free + cached = the pool")
check(after[("snug_kv_blocks_used", ())] == 0, "no KV block held once every client is done")
check(("snug_memory_pressure_events_total", ()) in after, "memory-pressure events are exposed")
check(("snug_prefix_hit_tokens_total", ()) in after, "prefix-cache hits are exposed")

print(f"{passed()} passed, 0 failed")
