"""The official Python clients' embedding calls against `snug serve`: PyPI `ollama`'s `embed()`
and `openai`'s `embeddings.create()` (floats, and the SDK's default base64 transport).

Usage: serve_embed_clients.py BASE_URL MODEL EXPECTED_JSON, where EXPECTED_JSON holds the inputs
and the vectors `/v1/embeddings` gave for them. Exits non-zero on the first failed check.
"""

import json
import math
import sys

import ollama
import openai

base, model, expected_path = sys.argv[1:4]
expected = json.load(open(expected_path))
inputs, vectors = expected["inputs"], expected["vectors"]


def close(a, b, what):
    assert len(a) == len(b), f"{what}: {len(a)} values, expected {len(b)}"
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst < 1e-5, f"{what}: differs by {worst}"


o = ollama.Client(host=base)
r = o.embed(model=model, input=inputs)
assert len(r.embeddings) == len(inputs), r
for i, v in enumerate(r.embeddings):
    close(v, vectors[i], f"ollama embed() input {i}")
    assert abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4, "unit length"
one = o.embed(model=model, input=inputs[0])
close(one.embeddings[0], vectors[0], "ollama embed() of one string")
assert one.prompt_eval_count > 0, one

c = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
# The SDK asks for base64 unless told otherwise, and decodes it.
r = c.embeddings.create(model=model, input=inputs)
assert [d.index for d in r.data] == list(range(len(inputs))), r
for d in r.data:
    close(d.embedding, vectors[d.index], f"openai embeddings.create() input {d.index}")
assert r.usage.prompt_tokens > 0, r.usage
# Repeated inputs (computed once) each get their vector, in order, and count in the usage.
twice = [inputs[1], inputs[0], inputs[1]]
r2 = c.embeddings.create(model=model, input=twice, encoding_format="float")
for d, want in zip(r2.data, [1, 0, 1]):
    close(d.embedding, vectors[want], f"repeated input {d.index}")
single = c.embeddings.create(model=model, input=[inputs[1]], encoding_format="float")
first = c.embeddings.create(model=model, input=[inputs[0]], encoding_format="float")
want_tokens = 2 * single.usage.prompt_tokens + first.usage.prompt_tokens
assert r2.usage.prompt_tokens == want_tokens, (r2.usage, want_tokens)
r = c.embeddings.create(model=model, input=inputs[:2], encoding_format="float", dimensions=32)
assert all(len(d.embedding) == 32 for d in r.data), r
try:
    c.embeddings.create(model=model, input="x", dimensions=10**6)
    raise AssertionError("dimensions past the width was accepted")
except openai.BadRequestError as e:
    assert "dimensions" in str(e), e
print(f"python clients: ollama embed() and openai embeddings.create() agree on {len(inputs)} inputs")
