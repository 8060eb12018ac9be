"""Conformance of tiergate's HTTP API with the official `openai` Python package.

Usage: python3 tests/python/openai_conformance.py BASE_URL
Exits non-zero (with the failing assertion) on any mismatch.
"""
import sys

import openai
from openai import OpenAI

base = sys.argv[1]
client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)

# Models list.
ids = [m.id for m in client.models.list().data]
assert ids[:3] == ["classify", "answer", "generate"], ids

# Non-streaming classify, with label probabilities.
r = client.chat.completions.create(
    model="classify",
    messages=[{"role": "user", "content": "somebody stole my debit card"}],
    logprobs=True,
    top_logprobs=3,
)
assert r.model == "classify", r.model
assert r.choices[0].message.content == "lost_or_stolen_card", r.choices[0].message.content
assert r.choices[0].logprobs.content[0].token == "lost_or_stolen_card"
assert len(r.choices[0].logprobs.content[0].top_logprobs) == 3
assert r.usage.total_tokens >= 2

# Raw response: the tiergate headers are there.
raw = client.chat.completions.with_raw_response.create(
    model="classify", messages=[{"role": "user", "content": "how much money do I have"}]
)
assert raw.headers.get("x-tiergate-tier") in ("tier0", "llm"), raw.headers
assert raw.headers.get("x-request-id")
assert raw.parse().choices[0].message.content == "check_balance"

# Streaming, with usage.
stream = client.chat.completions.create(
    model="answer",
    messages=[{"role": "user", "content": "I need to talk to a person"}],
    stream=True,
    stream_options={"include_usage": True},
)
text, usage, models = "", None, set()
for chunk in stream:
    models.add(chunk.model)
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
    if chunk.usage:
        usage = chunk.usage
assert models == {"answer"}, models
assert text, "empty streamed answer"
assert usage is not None and usage.total_tokens > 0

# Streaming generation from the LLM route.
stream = client.chat.completions.create(
    model="generate", messages=[{"role": "user", "content": "hello there"}], stream=True, max_tokens=8
)
pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
assert len(pieces) >= 1, pieces

# Errors parse into the SDK's exception types.
try:
    client.chat.completions.create(model="no-such-route", messages=[{"role": "user", "content": "x"}])
    raise AssertionError("unknown model accepted")
except openai.NotFoundError as e:
    assert e.status_code == 404 and e.body["param"] == "model", e.body
try:
    client.chat.completions.create(model="classify", messages=[{"role": "user", "content": "x"}], n=2)
    raise AssertionError("n=2 accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400 and e.body["param"] == "n", e.body
try:
    client.chat.completions.create(model="classify", messages=[{"role": "user", "content": "x"}], temperature=5)
    raise AssertionError("temperature=5 accepted")
except openai.BadRequestError as e:
    assert e.body["param"] == "temperature", e.body

# Tools sent to a route whose backends do not call them are refused by name, never answered as if the tools
# were not there (this server's backend is not configured with `tools = true`).
try:
    client.chat.completions.create(
        model="generate",
        messages=[{"role": "user", "content": "what is the weather in Paris?"}],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
    )
    raise AssertionError("tools accepted and dropped")
except openai.BadRequestError as e:
    assert e.body["param"] == "tools", e.body

print("openai conformance: ok")
