"""tiergate's `POST /v1/messages` through the official `anthropic` Python package.

Usage: python3 tests/python/anthropic_messages.py BASE_URL [KEY BAD_KEY]
With KEY, the server has tenants: KEY is a tenant's key (sent as `x-api-key`), BAD_KEY is not.
Exits non-zero (with the failing assertion) on any mismatch. Prints one line per case.
"""
import json
import sys
import urllib.error
import urllib.request

import anthropic

base = sys.argv[1]
key = sys.argv[2] if len(sys.argv) > 2 else "unused"
client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=60)
cases = []


def case(name):
    def run(f):
        f()
        cases.append(name)
        print(f"ok {name}")
        return f

    return run


def user(text):
    return [{"role": "user", "content": text}]


if len(sys.argv) > 3:

    @case("a bad key is an authentication_error")
    def _():
        bad = anthropic.Anthropic(base_url=base, api_key=sys.argv[3], max_retries=0)
        try:
            bad.messages.create(model="classify", max_tokens=8, messages=user("hello"))
            raise AssertionError("a bad key was accepted")
        except anthropic.AuthenticationError as e:
            assert e.status_code == 401
            assert e.body["type"] == "error" and e.body["error"]["type"] == "authentication_error", e.body


@case("classify, plain")
def _():
    m = client.messages.create(model="classify", max_tokens=16, messages=user("somebody stole my debit card"))
    assert m.type == "message" and m.role == "assistant", m
    assert m.id.startswith("msg_"), m.id
    assert m.model == "classify"
    assert m.content[0].type == "text" and m.content[0].text == "lost_or_stolen_card", m.content
    assert m.stop_reason == "end_turn", m.stop_reason
    assert m.usage.input_tokens > 0 and m.usage.output_tokens >= 1, m.usage


@case("classify, tiergate's headers")
def _():
    raw = client.messages.with_raw_response.create(
        model="classify", max_tokens=16, messages=user("how much money do I have")
    )
    assert raw.headers.get("x-tiergate-tier") in ("tier0", "llm", "cache"), raw.headers
    assert raw.headers.get("x-request-id")
    assert raw.parse().content[0].text == "check_balance"


@case("answer, streamed: the raw event order")
def _():
    kinds, text = [], ""
    with client.messages.create(
        model="answer", max_tokens=64, messages=user("I need to talk to a person"), stream=True
    ) as events:
        for e in events:
            kinds.append(e.type)
            if e.type == "content_block_delta":
                text += e.delta.text
    assert kinds[:2] == ["message_start", "content_block_start"], kinds
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
    assert set(kinds[2:-3]) <= {"ping", "content_block_delta"} and "content_block_delta" in kinds, kinds
    assert text, "empty streamed answer"


@case("answer, streamed: the SDK's helper")
def _():
    with client.messages.stream(
        model="answer", max_tokens=64, messages=user("I need to talk to a person")
    ) as s:
        m = s.get_final_message()
    assert m.content[0].text and m.stop_reason == "end_turn", m


@case("generate, plain, with a system prompt as blocks")
def _():
    m = client.messages.create(
        model="generate",
        max_tokens=8,
        system=[{"type": "text", "text": "Answer briefly."}],
        messages=user("hello there"),
    )
    assert m.content[0].text, m
    assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason
    assert m.usage.output_tokens >= 1


@case("generate, streamed: deltas and the final message agree")
def _():
    with client.messages.stream(
        model="generate",
        max_tokens=8,
        system="Answer briefly.",
        messages=[
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
            {"role": "user", "content": "and again"},
        ],
    ) as s:
        text = "".join(s.text_stream)
        m = s.get_final_message()
    assert text and m.content[0].text == text, (text, m)
    assert m.usage.output_tokens >= 1


@case("an unknown model is a not_found_error")
def _():
    try:
        client.messages.create(model="nope", max_tokens=8, messages=user("hi"))
        raise AssertionError("accepted")
    except anthropic.NotFoundError as e:
        assert e.body["error"]["type"] == "not_found_error", e.body


@case("tools are refused by name, not dropped")
def _():
    try:
        client.messages.create(
            model="generate",
            max_tokens=8,
            messages=user("weather?"),
            tools=[{"name": "w", "description": "d", "input_schema": {"type": "object"}}],
        )
        raise AssertionError("accepted")
    except anthropic.BadRequestError as e:
        assert e.body["error"]["type"] == "invalid_request_error", e.body
        assert "tool" in e.body["error"]["message"], e.body


def raw_post(body):
    req = urllib.request.Request(
        f"{base}/v1/messages",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"},
    )
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@case("a missing max_tokens and a bad role are invalid_request_errors; an unknown field is set aside")
def _():
    for body in (
        {"model": "classify", "messages": user("hi")},
        {"model": "classify", "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]},
    ):
        code, v = raw_post(body)
        assert code == 400 and v["type"] == "error", (code, v)
        assert v["error"]["type"] == "invalid_request_error", v
    r = client.messages.with_raw_response.create(model="classify", max_tokens=8, messages=user("hi"),
                                                 extra_body={"nonsense": 1})
    assert "nonsense" in r.headers.get("x-tiergate-set-aside", ""), dict(r.headers)


@case("feedback names a message by its id")
def _():
    m = client.messages.create(model="classify", max_tokens=16, messages=user("my card was stolen"))
    req = urllib.request.Request(
        f"{base}/v1/feedback",
        data=json.dumps({"id": m.id, "correct": True}).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req) as r:
        v = json.loads(r.read())
    assert v["id"] == m.id and v["duplicate"] is False, v


print(f"{len(cases)} cases passed")
