"""tiergate's `POST /v1/responses` through the official `openai` Python package.

Usage: python3 tests/python/openai_responses.py BASE_URL
Exits non-zero (with the failing assertion) on any mismatch. Prints one line per case.
"""
import json
import sys
import urllib.request

import openai
from openai import OpenAI

base = sys.argv[1]
client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
cases = []


def case(name):
    def run(f):
        f()
        cases.append(name)
        print(f"ok {name}")
        return f

    return run


@case("classify, plain")
def _():
    r = client.responses.create(model="classify", input="somebody stole my debit card")
    assert r.object == "response" and r.status == "completed", r
    assert r.id.startswith("resp_"), r.id
    assert r.output_text == "lost_or_stolen_card", r.output_text
    assert r.usage.input_tokens > 0 and r.usage.output_tokens >= 1, r.usage


@case("classify, tiergate's headers")
def _():
    raw = client.responses.with_raw_response.create(model="classify", input="how much money do I have")
    assert raw.headers.get("x-tiergate-tier") in ("tier0", "llm", "cache"), raw.headers
    assert raw.parse().output_text == "check_balance"


@case("classify, text.format json_object")
def _():
    r = client.responses.create(
        model="classify", input="my card was stolen", text={"format": {"type": "json_object"}}
    )
    v = json.loads(r.output_text)
    assert v["label"] == "lost_or_stolen_card" and 0 < v["confidence"] <= 1, v


@case("answer, streamed: the semantic events in order")
def _():
    kinds, text = [], ""
    for e in client.responses.create(model="answer", input="I need to talk to a person", stream=True):
        kinds.append(e.type)
        if e.type == "response.output_text.delta":
            text += e.delta
    head = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    assert kinds[:4] == head, kinds
    assert kinds[-4:] == tail, kinds
    assert set(kinds[4:-4]) == {"response.output_text.delta"}, kinds
    assert text, "empty streamed answer"


@case("generate, streamed: the SDK's helper")
def _():
    with client.responses.stream(
        model="generate", input="hello there", instructions="Answer briefly.", max_output_tokens=8
    ) as s:
        deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        r = s.get_final_response()
    assert r.output_text and r.output_text == deltas, (r.output_text, deltas)
    assert r.status in ("completed", "incomplete"), r.status


@case("generate, input items")
def _():
    r = client.responses.create(
        model="generate",
        max_output_tokens=8,
        input=[
            {"role": "developer", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
            {"role": "user", "content": "again"},
        ],
    )
    assert r.output_text, r


def refused(name, **kw):
    try:
        client.responses.create(**kw)
        raise AssertionError(f"{name}: accepted")
    except openai.BadRequestError as e:
        assert e.body["type"] == "invalid_request_error", e.body
        return e.body


@case("what the door cannot do is a 400 naming it; a provider-run tool is set aside and named")
def _():
    r = client.responses.with_raw_response.create(model="generate", input="hi", tools=[{"type": "web_search_preview"}])
    assert "tools.web_search" in r.headers.get("x-tiergate-set-aside", ""), dict(r.headers)
    b = refused("previous_response_id", model="generate", input="hi", previous_response_id="resp_x")
    assert b["param"] == "previous_response_id" and b["code"] == "previous_response_not_found", b
    # A tool's result, to a route whose backend does not call tools (this server's is not `tools = true`).
    b = refused(
        "function_call_output",
        model="generate",
        input=[
            {"role": "user", "content": "what is six times seven?"},
            {"type": "function_call", "call_id": "c1", "name": "multiply", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
        ],
    )
    assert b["param"] == "tools" and "cannot call tools" in b["message"], b
    b = refused("item_reference", model="generate", input=[{"type": "item_reference", "id": "msg_1"}])
    assert b["param"] == "input.0.type", b
    # A reasoning item is set aside: the conversation around it is answered.
    r = client.responses.with_raw_response.create(model="generate", input=[
        {"type": "reasoning", "summary": []}, {"role": "user", "content": "hi"}])
    assert "reasoning" in r.headers.get("x-tiergate-set-aside", ""), dict(r.headers)


@case("an unknown model is a 404")
def _():
    try:
        client.responses.create(model="nope", input="hi")
        raise AssertionError("accepted")
    except openai.NotFoundError as e:
        assert e.body["code"] == "model_not_found", e.body


@case("feedback names a response by its id")
def _():
    r = client.responses.create(model="classify", input="my card was stolen")
    req = urllib.request.Request(
        f"{base}/v1/feedback",
        data=json.dumps({"id": r.id, "correct": True}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req) as resp:
        v = json.loads(resp.read())
    assert v["id"] == r.id and v["duplicate"] is False, v


print(f"{len(cases)} cases passed")
