"""tiergate's stored responses (`[responses] store = true`) through the official `openai` Python package.

Usage: python3 tests/python/openai_responses_store.py BASE_URL KEY OTHER_KEY
KEY and OTHER_KEY are two tenants' keys. Exits non-zero on any mismatch; prints one line per case.
"""
import sys

import openai
from openai import OpenAI

base, key, other_key = sys.argv[1:4]
client = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)
other = OpenAI(base_url=f"{base}/v1", api_key=other_key, max_retries=0, timeout=60)
cases = []


def case(name):
    def run(f):
        f()
        cases.append(name)
        print(f"ok {name}")
        return f

    return run


state = {}


@case("a response is stored and retrieved")
def _():
    r = client.responses.create(model="generate", input="hello there", max_output_tokens=8)
    assert r.store is True, r.store
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text, (got, r)
    state["first"] = r


@case("previous_response_id continues the conversation")
def _():
    first = state["first"]
    r = client.responses.create(
        model="generate", input="and again", previous_response_id=first.id, max_output_tokens=8
    )
    assert r.previous_response_id == first.id, r
    assert r.output_text and r.usage.input_tokens > first.usage.input_tokens, (r.usage, first.usage)
    with client.responses.stream(
        model="generate", input="once more", previous_response_id=r.id, max_output_tokens=8
    ) as s:
        final = s.get_final_response()
    assert final.previous_response_id == r.id and final.output_text, final
    assert client.responses.retrieve(final.id).output_text == final.output_text


@case("store=false keeps nothing")
def _():
    r = client.responses.create(model="classify", input="my card was stolen", store=False)
    assert r.store is False
    try:
        client.responses.retrieve(r.id)
        raise AssertionError("an unstored response was found")
    except openai.NotFoundError:
        pass


@case("another tenant's response is not found, neither retrieved nor continued")
def _():
    first = state["first"]
    try:
        other.responses.retrieve(first.id)
        raise AssertionError("another tenant's response was shown")
    except openai.NotFoundError:
        pass
    try:
        other.responses.create(model="generate", input="hi", previous_response_id=first.id)
        raise AssertionError("another tenant's conversation was continued")
    except openai.BadRequestError as e:
        assert e.body["code"] == "previous_response_not_found", e.body


@case("an unknown previous_response_id is a 400 previous_response_not_found, as OpenAI answers")
def _():
    try:
        client.responses.create(model="generate", input="hi", previous_response_id="resp_nope")
        raise AssertionError("accepted")
    except openai.BadRequestError as e:
        assert e.body["code"] == "previous_response_not_found" and e.body["param"] == "previous_response_id", e.body


print(f"{len(cases)} cases passed")
print(f"first-id {state['first'].id}")
