"""The PyPI `openai` client against `snug serve --lora-dir`, unchanged, with model="BASE:ADAPTER".

Usage: serve_lora_client.py BASE_URL API_KEY BASE ADAPTER PROMPT MAX_TOKENS EXPECTED
EXPECTED is `snug run --lora ADAPTER.gguf PROMPT`'s greedy answer. Exits non-zero on a failed check.
"""
import sys

import openai

base_url, key, base, adapter, prompt, n, expected = sys.argv[1:8]
name = f"{base}:{adapter}"
client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)

ids = [m.id for m in client.models.list().data]
assert ids[0] == base and name in ids, f"/v1/models lists the base and {name}: {ids}"

msgs = [{"role": "user", "content": prompt}]
r = client.chat.completions.create(model=name, messages=msgs, temperature=0, max_tokens=int(n))
got = r.choices[0].message.content.strip()
assert got == expected, f"{name} answered {got!r}, snug run --lora answered {expected!r}"

chunks = client.chat.completions.create(model=name, messages=msgs, temperature=0,
                                        max_tokens=int(n), stream=True)
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
assert streamed == expected, f"streamed {streamed!r} != {expected!r}"

try:
    client.chat.completions.create(model=f"{base}:no-such-adapter", messages=msgs, max_tokens=1)
    raise AssertionError("an unknown adapter was accepted")
except openai.NotFoundError as e:
    assert "no-such-adapter" in str(e), f"the 404 names the adapter: {e}"
print(f"openai client on {name}: ok")
