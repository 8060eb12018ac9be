"""Tool calls end to end through all three doors, with the official `openai` and `anthropic` packages: an agent's
loop (the model calls a tool, the client runs it and sends the result, the model answers) on Chat
Completions, Responses (with `previous_response_id`) and Anthropic Messages, plain and streamed.

Usage: python3 tests/python/tool_calls.py BASE_URL stub|model
The server runs with `reranker.tools = true` and `[responses] store = true`, its generate route on
- `model`: mistralrs with the Qwen2.5-Coder-0.5B file (a real model: the cases assert what any sane model does —
  the weather tool called with Oslo in its arguments, a non-empty answer after the tool's result);
- `stub`: the stub engine, a fake that is deterministic, so the cases a small model cannot be held to run
  there too: it calls the named function, or the first tool (the first two when parallel calls are allowed),
  with {"query": <the last user text>}, and after a tool's result writes "stub: ...".
Exits non-zero on any mismatch; prints one line per case.
"""
import json
import sys
import time

import anthropic
import openai
from openai import OpenAI

base = sys.argv[1]
STUB = sys.argv[2] == "stub"
# The server's generation deadline for these runs is 300 s (tests/tests/doors.rs): the client waits as long.
oai = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)
ant = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=300)
cases = []


def case(name, stub_only=False):
    def run(f):
        if stub_only and not STUB:
            return f
        t = time.monotonic()
        f()
        cases.append(name)
        print(f"ok {name} ({time.monotonic() - t:.1f} s)")
        return f

    return run


def fn(name, description="", properties=None):
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties or {"query": {"type": "string"}}},
        },
    }


CITY = {"city": {"type": "string", "description": "The city"}}
WEATHER = fn("weather", "Get the current weather in a city", CITY)
TIME = fn("time", "Get the current time in a city", CITY)


def oslo_args(arguments):
    """The arguments a call of the weather tool for Oslo has: the stub's exact ones, or a model's naming Oslo."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    if STUB:
        assert args == {"query": "what is the weather in Oslo"}, args
    else:
        assert isinstance(args, dict) and "oslo" in json.dumps(args).lower(), args


# The turn after a tool's result: the stub answers on its own (`auto`); a 0.5B model may call the tool again
# (it did: the same call with the result as a new argument), so an agent that wants the answer says `none`.
# Its answer is cut at 16 tokens: mistralrs 0.8.1 spends about 160 ms a token on this model here, prompt tokens
# included (a 35-token prompt's first token after 5.5 s; f32 activations instead of its automatic f16 changed
# nothing measurable), and the text only has to be there.
THEN = "auto" if STUB else "none"


def answered(text):
    assert (text.startswith("stub:") if STUB else text.strip()), text
ASK = [{"role": "user", "content": "what is the weather in Oslo"}]


# ---------------------------------------------------------------- Chat Completions


@case("chat: a tool call, then its result, then the answer")
def _():
    r = oai.chat.completions.create(model="generate", messages=ASK, tools=[WEATHER], max_tokens=48)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c
    # The stub says nothing besides its call; a model may (Qwen-0.5B opens a code fence before its call).
    assert c.message.content is None or not STUB, c.message
    (call,) = c.message.tool_calls
    assert call.type == "function" and call.function.name == "weather", call
    oslo_args(call.function.arguments)
    assert call.id, call
    history = ASK + [c.message.model_dump(exclude_none=True)]
    history.append({"role": "tool", "tool_call_id": call.id, "content": "rain, 4 degrees"})
    # Greedy, so a model's answer is the one it gives most: it must use the tool's result (the assistant's
    # call and the tool message reached the model through its chat template).
    r2 = oai.chat.completions.create(
        model="generate", messages=history, tools=[WEATHER], tool_choice=THEN, max_tokens=24, temperature=0
    )
    assert r2.choices[0].finish_reason in ("stop", "length"), r2
    text = r2.choices[0].message.content
    answered(text)
    assert STUB or "rain" in text.lower() or "4" in text, f"the answer does not use the tool's result: {text!r}"
    assert not r2.choices[0].message.tool_calls


@case("chat: streamed tool_calls deltas", stub_only=True)
def _():
    calls, finish = {}, None
    for chunk in oai.chat.completions.create(model="generate", messages=ASK, tools=[WEATHER, TIME], stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        for t in d.tool_calls or []:
            got = calls.setdefault(t.index, {"id": None, "name": None, "arguments": ""})
            got["id"] = got["id"] or t.id
            got["name"] = got["name"] or t.function.name
            got["arguments"] += t.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls", finish
    # Parallel calls are allowed by default: the stub calls both tools, indexed 0 and 1.
    assert sorted(calls) == [0, 1], calls
    assert [calls[i]["name"] for i in (0, 1)] == ["weather", "time"], calls
    assert all(json.loads(c["arguments"])["query"] for c in calls.values()), calls


@case("chat: streamed, one tool")
def _():
    calls, finish = {}, None
    for chunk in oai.chat.completions.create(model="generate", messages=ASK, tools=[WEATHER], stream=True, max_tokens=48):
        if not chunk.choices:
            continue
        for t in chunk.choices[0].delta.tool_calls or []:
            got = calls.setdefault(t.index, {"name": None, "arguments": ""})
            got["name"] = got["name"] or t.function.name
            got["arguments"] += t.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and list(calls) == [0], (finish, calls)
    assert calls[0]["name"] == "weather", calls
    oslo_args(calls[0]["arguments"])


@case("chat: parallel_tool_calls false, tool_choice named and none", stub_only=True)
def _():
    one = oai.chat.completions.create(model="generate", messages=ASK, tools=[WEATHER, TIME], parallel_tool_calls=False)
    assert len(one.choices[0].message.tool_calls) == 1, one
    named = oai.chat.completions.create(
        model="generate",
        messages=ASK,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "time"}},
    )
    assert [t.function.name for t in named.choices[0].message.tool_calls] == ["time"], named
    none = oai.chat.completions.create(model="generate", messages=ASK, tools=[WEATHER], tool_choice="none")
    assert none.choices[0].finish_reason == "stop" and not none.choices[0].message.tool_calls, none


@case("chat: a 20-turn tool conversation fits", stub_only=True)
def _():
    history = []
    for i in range(20):
        history.append({"role": "user", "content": f"turn {i}: what is the weather in city {i}? " + "context " * 40})
        cid = f"call_{i}"
        history.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": cid, "type": "function", "function": {"name": "weather", "arguments": json.dumps({"query": f"city {i}"})}}
                ],
            }
        )
        history.append({"role": "tool", "tool_call_id": cid, "content": "cloudy and mild; " * 90})
    chars = sum(len(m.get("content") or "") for m in history)
    assert chars > 32_768, chars  # more than the old text cap
    r = oai.chat.completions.create(model="generate", messages=history, tools=[WEATHER], max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length"), r


@case("chat: errors name the field")
def _():
    for kw, param in (
        (dict(model="classify", messages=ASK, tools=[WEATHER]), "tools"),
        (dict(model="generate", messages=ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(model="generate", messages=ASK + [{"role": "tool", "content": "x"}], tools=[WEATHER]), "messages[1].tool_call_id"),
    ):
        try:
            oai.chat.completions.create(**kw)
            raise AssertionError(f"accepted: {kw}")
        except openai.BadRequestError as e:
            assert e.body["param"] == param, (param, e.body)


# ---------------------------------------------------------------- Responses


RTOOL = {"type": "function", "name": "weather", "description": "The weather", "parameters": WEATHER["function"]["parameters"]}


@case("responses: a function_call item, then its output by previous_response_id")
def _():
    r = oai.responses.create(model="generate", input="what is the weather in Oslo", tools=[RTOOL], max_output_tokens=48)
    assert r.status == "completed", r
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "weather", r.output
    oslo_args(calls[0].arguments)
    assert r.tools[0].name == "weather", r.tools
    r2 = oai.responses.create(
        model="generate",
        previous_response_id=r.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "rain"}],
        tools=[RTOOL],
        tool_choice=THEN,
        max_output_tokens=16,
    )
    answered(r2.output_text)
    assert not [o for o in r2.output if o.type == "function_call"], r2.output


@case("responses: the whole loop as input items, no store", stub_only=True)
def _():
    r = oai.responses.create(model="generate", input="what is the weather in Oslo", tools=[RTOOL], store=False, max_output_tokens=48)
    call = next(o for o in r.output if o.type == "function_call")
    items = [{"role": "user", "content": "what is the weather in Oslo"}]
    items.append({"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments})
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "rain"})
    r2 = oai.responses.create(
        model="generate", input=items, tools=[RTOOL], tool_choice=THEN, store=False, max_output_tokens=48
    )
    answered(r2.output_text)


@case("responses: streamed function call events in order")
def _():
    kinds, args, final = [], "", None
    for e in oai.responses.create(model="generate", input="what is the weather in Oslo", tools=[RTOOL], stream=True, max_output_tokens=48):
        kinds.append(e.type)
        if e.type == "response.function_call_arguments.delta":
            args += e.delta
        if e.type == "response.completed":
            final = e.response
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    want = [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    if STUB:
        assert kinds[2:] == want, kinds
    else:
        # A model may write text before its call (Qwen-0.5B opens a code fence): the message item is done
        # before the call's item is added, and the call's events follow in order.
        at = kinds.index("response.function_call_arguments.delta") - 1
        assert kinds[at:] == want, kinds
        assert kinds[at - 1] == "response.output_item.done" or at == 2, kinds
    oslo_args(args)
    call = next(o for o in final.output if o.type == "function_call")
    assert call.arguments == args, final


# The helper reads the events the case above checks: on the model it only repeated that generation (28 s).
@case("responses: the SDK's stream helper", stub_only=True)
def _():
    with oai.responses.stream(model="generate", input="what is the weather in Oslo", tools=[RTOOL], max_output_tokens=48) as s:
        r = s.get_final_response()
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "weather", r.output
    oslo_args(call.arguments)


@case("responses: a provider-run tool is set aside and named, the client's tools kept")
def _():
    r = oai.responses.with_raw_response.create(model="generate", input="what is the weather in Oslo",
                                               tools=[{"type": "web_search_preview"}, RTOOL], max_output_tokens=48)
    assert "tools.web_search" in r.headers.get("x-tiergate-set-aside", ""), dict(r.headers)
    assert any(o.type == "function_call" and o.name == "weather" for o in r.parse().output), r.parse().output


# ---------------------------------------------------------------- Anthropic Messages


ATOOL = {"name": "weather", "description": "The weather", "input_schema": WEATHER["function"]["parameters"]}


@case("messages: tool_use, then tool_result, then the answer")
def _():
    m = ant.messages.create(model="generate", max_tokens=48, messages=ASK, tools=[ATOOL])
    assert m.stop_reason == "tool_use", m
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "weather", m.content
    oslo_args(uses[0].input)
    history = ASK + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "rain"}]},
    ]
    m2 = ant.messages.create(
        model="generate", max_tokens=16, messages=history, tools=[ATOOL], tool_choice={"type": THEN}
    )
    assert m2.stop_reason in ("end_turn", "max_tokens"), m2
    assert m2.content[0].type == "text", m2
    answered(m2.content[0].text)


@case("messages: streamed tool_use with the SDK's helper")
def _():
    choice = {"type": "any"} if STUB else {"type": "auto"}  # mistralrs cannot force a call ("any")
    with ant.messages.stream(model="generate", max_tokens=48, messages=ASK, tools=[ATOOL], tool_choice=choice) as s:
        kinds = [e.type for e in s]
        m = s.get_final_message()
    assert m.stop_reason == "tool_use", m
    (use,) = [b for b in m.content if b.type == "tool_use"]
    oslo_args(use.input)
    assert "input_json" in kinds or "content_block_delta" in kinds, kinds


@case("messages: tool_choice tool names the function", stub_only=True)
def _():
    time = {"name": "time", "description": "The time", "input_schema": {"type": "object"}}
    m = ant.messages.create(
        model="generate", max_tokens=48, messages=ASK, tools=[ATOOL, time], tool_choice={"type": "tool", "name": "time"}
    )
    assert [b.name for b in m.content if b.type == "tool_use"] == ["time"], m.content


print(f"{len(cases)} cases passed")
