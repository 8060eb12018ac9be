"""The conformance matrix: every door × plain and streamed × every route × {text, tool loop, JSON output}, and
the errors each door must answer in its own shape — run with the official `openai` and `anthropic` packages.

Usage: python3 tests/python/conformance_matrix.py BASE_URL KEY OTHER_KEY BAD_KEY
The server has two tenants (KEY, OTHER_KEY), a stub LLM engine with `reranker.tools = true` (the stub is a fake:
it calls the first tool, then answers "stub: ..." after the tool's result) and `[responses] store = true`.
Streams are read twice: the raw events in order, then through the SDKs' helpers
(`responses.stream(...).get_final_response()`, `messages.stream(...).get_final_message()`). Prints one line
per named case and the count; exits non-zero at the first failure.
"""
import json
import sys
import urllib.error
import urllib.request

import anthropic
import openai
from openai import OpenAI

base, key, other_key, bad_key = sys.argv[1:5]
oai = OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)
ant = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=60)
cases = []

ASK = {
    "classify": "somebody stole my debit card",
    "answer": "I need to talk to a person",
    "generate": "hello there",
}
LABEL = "lost_or_stolen_card"
WEATHER = {"name": "weather", "description": "The weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def case(name, f):
    f()
    cases.append(name)
    print(f"ok {name}")


def check_text(route, text):
    if route == "classify":
        assert text == LABEL, text
    elif route == "generate":
        assert text.startswith("stub:"), text
    else:
        assert text.strip(), "empty answer"


# ------------------------------------------------------------------ text, every door × plain/stream × route


def chat_text(route, stream):
    msgs = [{"role": "user", "content": ASK[route]}]
    if not stream:
        r = oai.chat.completions.create(model=route, messages=msgs, max_tokens=16)
        assert r.object == "chat.completion" and r.choices[0].finish_reason in ("stop", "length"), r
        return check_text(route, r.choices[0].message.content)
    text, first, finish = "", None, None
    for chunk in oai.chat.completions.create(model=route, messages=msgs, max_tokens=16, stream=True):
        assert chunk.object == "chat.completion.chunk", chunk
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        first = first or d.role
        text += d.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert first == "assistant" and finish in ("stop", "length"), (first, finish)
    check_text(route, text)


def responses_text(route, stream):
    if not stream:
        r = oai.responses.create(model=route, input=ASK[route], max_output_tokens=16)
        assert r.object == "response" and r.status in ("completed", "incomplete"), r
        return check_text(route, r.output_text)
    kinds, text = [], ""
    for e in oai.responses.create(model=route, input=ASK[route], max_output_tokens=16, stream=True):
        kinds.append(e.type)
        if e.type == "response.output_text.delta":
            text += e.delta
    head = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[:4] == head and kinds[-4:-1] == tail, kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    check_text(route, text)
    with oai.responses.stream(model=route, input=ASK[route], max_output_tokens=16) as s:
        r = s.get_final_response()
    check_text(route, r.output_text)


def messages_text(route, stream):
    msgs = [{"role": "user", "content": ASK[route]}]
    if not stream:
        m = ant.messages.create(model=route, max_tokens=16, messages=msgs)
        assert m.type == "message" and m.stop_reason in ("end_turn", "max_tokens"), m
        return check_text(route, m.content[0].text)
    kinds, text = [], ""
    with ant.messages.create(model=route, max_tokens=16, messages=msgs, stream=True) as events:
        for e in events:
            kinds.append(e.type)
            if e.type == "content_block_delta":
                text += e.delta.text
    assert kinds[0] == "message_start" and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"], kinds
    check_text(route, text)
    with ant.messages.stream(model=route, max_tokens=16, messages=msgs) as s:
        m = s.get_final_message()
    check_text(route, m.content[0].text)


# ------------------------------------------------------------------ tool call → tool result → final answer


def chat_tools(stream):
    tools = [{"type": "function", "function": WEATHER}]
    msgs = [{"role": "user", "content": "weather in Oslo?"}]
    if stream:
        calls, finish = {}, None
        for chunk in oai.chat.completions.create(model="generate", messages=msgs, tools=tools, stream=True):
            for t in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                calls.setdefault(t.index, {"id": t.id, "name": t.function.name, "arguments": ""})
                calls[t.index]["arguments"] += t.function.arguments or ""
            finish = (chunk.choices[0].finish_reason if chunk.choices else None) or finish
        assert finish == "tool_calls" and len(calls) == 1, (finish, calls)
        c = calls[0]
    else:
        r = oai.chat.completions.create(model="generate", messages=msgs, tools=tools)
        assert r.choices[0].finish_reason == "tool_calls", r
        t = r.choices[0].message.tool_calls[0]
        c = {"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
    msgs.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}]})
    msgs.append({"role": "tool", "tool_call_id": c["id"], "content": "rain"})
    r = oai.chat.completions.create(model="generate", messages=msgs, tools=tools)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content.startswith("stub:"), r


def responses_tools(stream):
    tools = [{"type": "function", **WEATHER}]
    if stream:
        kinds = []
        for e in oai.responses.create(model="generate", input="weather in Oslo?", tools=tools, stream=True):
            kinds.append(e.type)
            if e.type == "response.completed":
                r = e.response
        assert "response.function_call_arguments.done" in kinds, kinds
        with oai.responses.stream(model="generate", input="weather in Oslo?", tools=tools) as s:
            assert [o.type for o in s.get_final_response().output] == ["function_call"]
    else:
        r = oai.responses.create(model="generate", input="weather in Oslo?", tools=tools)
    call = next(o for o in r.output if o.type == "function_call")
    r2 = oai.responses.create(
        model="generate", previous_response_id=r.id, tools=tools,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rain"}],
    )
    assert r2.output_text.startswith("stub:"), r2.output


def messages_tools(stream):
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    msgs = [{"role": "user", "content": "weather in Oslo?"}]
    if stream:
        kinds = []
        with ant.messages.create(model="generate", max_tokens=32, messages=msgs, tools=tools, stream=True) as events:
            kinds = [e.type for e in events]
        assert kinds.count("content_block_start") == 1, kinds
        with ant.messages.stream(model="generate", max_tokens=32, messages=msgs, tools=tools) as s:
            m = s.get_final_message()
    else:
        m = ant.messages.create(model="generate", max_tokens=32, messages=msgs, tools=tools)
    assert m.stop_reason == "tool_use", m
    use = next(b for b in m.content if b.type == "tool_use")
    msgs.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]})
    msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "rain"}]})
    m2 = ant.messages.create(model="generate", max_tokens=32, messages=msgs, tools=tools)
    assert m2.stop_reason == "end_turn" and m2.content[0].text.startswith("stub:"), m2


# ------------------------------------------------------------------ JSON output (classify routes)


def chat_json(stream):
    kw = dict(model="classify", messages=[{"role": "user", "content": ASK["classify"]}],
              response_format={"type": "json_object"})
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in oai.chat.completions.create(stream=True, **kw) if c.choices)
    else:
        text = oai.chat.completions.create(**kw).choices[0].message.content
    assert json.loads(text)["label"] == LABEL, text


def responses_json(stream):
    kw = dict(model="classify", input=ASK["classify"], text={"format": {"type": "json_object"}})
    if stream:
        with oai.responses.stream(**kw) as s:
            text = s.get_final_response().output_text
    else:
        text = oai.responses.create(**kw).output_text
    assert json.loads(text)["label"] == LABEL, text


for stream in (False, True):
    mode = "stream" if stream else "plain"
    for route in ("classify", "answer", "generate"):
        case(f"chat/{mode}/{route}/text", lambda: chat_text(route, stream))
        case(f"responses/{mode}/{route}/text", lambda: responses_text(route, stream))
        case(f"messages/{mode}/{route}/text", lambda: messages_text(route, stream))
    case(f"chat/{mode}/generate/tool-loop", lambda: chat_tools(stream))
    case(f"responses/{mode}/generate/tool-loop", lambda: responses_tools(stream))
    case(f"messages/{mode}/generate/tool-loop", lambda: messages_tools(stream))
    case(f"chat/{mode}/classify/json", lambda: chat_json(stream))
    case(f"responses/{mode}/classify/json", lambda: responses_json(stream))


# ------------------------------------------------------------------ errors, each in its door's shape


def raw(path, body, headers=None, data=None):
    h = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    for k, v in (headers or {}).items():
        if v is None:
            h.pop(k, None)
        else:
            h[k] = v
    req = urllib.request.Request(f"{base}{path}", data=data or json.dumps(body).encode(), headers=h)
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def openai_error(code, v, status, param=None):
    assert code == status and set(v["error"]) >= {"message", "type", "param", "code"}, (code, v)
    if param is not None:
        assert v["error"]["param"] == param, v


def anthropic_error(code, v, status, kind):
    assert code == status and v["type"] == "error" and v["error"]["type"] == kind, (code, v)


def not_found_previous(code, v):
    """OpenAI's answer to a previous_response_id it does not have: 400 previous_response_not_found."""
    openai_error(code, v, 400, "previous_response_id")
    assert v["error"]["code"] == "previous_response_not_found", v


USER = [{"role": "user", "content": "hi"}]
ORPHAN = USER + [{"role": "tool", "tool_call_id": "call_nowhere", "content": "42"}]
LIMIT = 4 * 1024 * 1024  # server.max_body_bytes


def over_limit(path, headers=None):
    """A body declared one KiB over the body cap: the server answers from its Content-Length at once (a
    client writing 4 MiB into a closed connection would see a broken pipe, not the answer); only a prefix
    is sent."""
    import http.client
    from urllib.parse import urlparse
    u = urlparse(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    h = {"content-type": "application/json", "authorization": f"Bearer {key}", **(headers or {})}
    conn.putrequest("POST", path)
    for k, v in h.items():
        conn.putheader(k, v)
    conn.putheader("content-length", str(LIMIT + 1024))
    conn.endheaders()
    try:
        conn.send(b'{"model": "generate", "messages": [{"role": "user", "content": "' + b"x" * 4096)
    except OSError:
        pass
    r = conn.getresponse()
    v = json.loads(r.read() or b"{}")
    text = json.dumps(v)
    assert str(LIMIT) in text and "server.max_body_bytes" in text, v
    return r.status, v


case("errors/chat/bad-field", lambda: openai_error(*raw("/v1/chat/completions", {"model": "classify", "messages": USER, "temperature": 9}), 400, "temperature"))
case("errors/messages/missing-max_tokens", lambda: anthropic_error(*raw("/v1/messages", {"model": "classify", "messages": USER}), 400, "invalid_request_error"))
case("errors/chat/unknown-model", lambda: openai_error(*raw("/v1/chat/completions", {"model": "nope", "messages": USER}), 404))
case("errors/responses/unknown-model", lambda: openai_error(*raw("/v1/responses", {"model": "nope", "input": "hi"}), 404))
case("errors/messages/unknown-model", lambda: anthropic_error(*raw("/v1/messages", {"model": "nope", "max_tokens": 8, "messages": USER}), 404, "not_found_error"))
case("errors/chat/over-limit", lambda: openai_error(*over_limit("/v1/chat/completions"), 413))
case("errors/responses/over-limit", lambda: openai_error(*over_limit("/v1/responses"), 413))
case("errors/messages/over-limit", lambda: anthropic_error(*over_limit("/v1/messages"), 413, "request_too_large"))
case("errors/chat/bad-key", lambda: openai_error(*raw("/v1/chat/completions", {"model": "classify", "messages": USER}, {"authorization": f"Bearer {bad_key}"}), 401))
case("errors/responses/bad-key", lambda: openai_error(*raw("/v1/responses", {"model": "classify", "input": "hi"}, {"authorization": f"Bearer {bad_key}"}), 401))
case("errors/messages/bad-key", lambda: anthropic_error(*raw("/v1/messages", {"model": "classify", "max_tokens": 8, "messages": USER}, {"authorization": None, "x-api-key": bad_key}), 401, "authentication_error"))
case("errors/chat/tool-result-without-call", lambda: openai_error(*raw("/v1/chat/completions", {"model": "generate", "messages": ORPHAN}), 400, "messages[1].tool_call_id"))
case("errors/responses/tool-result-without-call", lambda: openai_error(*raw("/v1/responses", {"model": "generate", "input": [{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "call_nowhere", "output": "42"}]}), 400, "messages[1].tool_call_id"))
case("errors/messages/tool-result-without-call", lambda: anthropic_error(*raw("/v1/messages", {"model": "generate", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "42"}]}]}), 400, "invalid_request_error"))
case("errors/responses/unknown-previous_response_id", lambda: not_found_previous(*raw("/v1/responses", {"model": "generate", "input": "hi", "previous_response_id": "resp_000000000000000000000000000f"})))


def foreign_previous():
    mine = oai.responses.create(model="generate", input="remember this", max_output_tokens=8)
    code, v = raw("/v1/responses", {"model": "generate", "input": "and?", "previous_response_id": mine.id}, {"authorization": f"Bearer {other_key}"})
    not_found_previous(code, v)
    assert "remember" not in json.dumps(v), v


case("errors/responses/another-tenants-previous_response_id", foreign_previous)


def not_stored():
    r = oai.responses.create(model="generate", input="forget this", max_output_tokens=8, store=False)
    not_found_previous(*raw("/v1/responses", {"model": "generate", "input": "and?", "previous_response_id": r.id}))
    req = urllib.request.Request(f"{base}/v1/responses/{r.id}", headers={"authorization": f"Bearer {key}"})
    try:
        urllib.request.urlopen(req)
        raise AssertionError("a response with store: false was kept")
    except urllib.error.HTTPError as e:
        assert e.code == 404, e.code


case("errors/responses/store-false-keeps-nothing", not_stored)
case("errors/chat/n-above-one", lambda: openai_error(*raw("/v1/chat/completions", {"model": "classify", "n": 2, "messages": USER}), 400, "n"))
case("errors/chat/tools-on-a-classify-route", lambda: openai_error(*raw("/v1/chat/completions", {"model": "classify", "messages": USER, "tools": [{"type": "function", "function": WEATHER}]}), 400, "tools"))


# ------------------------------------------------------------------ what agents send: accepted, passed on or set aside


def raw_h(path, body, headers=None):
    """POST `body` (with the first key); the status, the JSON body (or the SSE text) and the headers."""
    h = {"content-type": "application/json", "authorization": f"Bearer {key}", **(headers or {})}
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), headers=h)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            text = r.read().decode()
            kind = r.headers.get("content-type", "")
            return r.status, (json.loads(text) if "json" in kind else text), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), e.headers


def set_aside(path, body, names, headers=None):
    """The request is answered (2xx) and each of `names` is in x-tiergate-set-aside."""
    code, v, h = raw_h(path, body, headers)
    assert code == 200, (code, v)
    got = [n.strip() for n in (h.get("x-tiergate-set-aside") or "").split(",")]
    assert all(n in got for n in names), (names, got)
    return v, h


def sse_events(text):
    """(event, data) pairs of an SSE body; comments are skipped."""
    out, kind = [], None
    for line in text.splitlines():
        if line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
            out.append((kind, json.loads(data) if data.startswith("{") else data))
    return out


CLAUDE_FIRST = {
    "model": "generate", "max_tokens": 32000, "stream": False,
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "metadata": {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-1"})},
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
               {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "Read", "description": "Reads a file", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}},
              {"name": "Later", "description": "deferred", "input_schema": {"type": "object"}, "defer_loading": True},
              {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>r</system-reminder>"},
                                              {"type": "text", "text": "read notes.txt", "cache_control": {"type": "ephemeral"}}]},
                 {"role": "system", "content": [{"type": "text", "text": "# Environment"}]}],
}
BETA = {"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27"}


def claude_first_request():
    v, h = set_aside("/v1/messages?beta=true", CLAUDE_FIRST,
                     ["thinking", "context_management", "output_config", "cache_control", "tools.server"], BETA)
    assert v["stop_reason"] == "tool_use" and any(b.get("name") == "Read" for b in v["content"]), v
    assert h["x-tiergate-max-tokens"] == "4096", dict(h)
    for f in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        assert f in v["usage"], v["usage"]


def messages_usage_streamed():
    body = {"model": "generate", "max_tokens": 16, "messages": USER}
    whole = ant.messages.create(**body)
    code, text, _ = raw_h("/v1/messages", {**body, "stream": True})
    delta = [d for k, d in sse_events(text) if k == "message_delta"][0]
    assert delta["usage"]["input_tokens"] == whole.usage.input_tokens > 0, (delta, whole.usage)
    assert delta["usage"]["output_tokens"] == whole.usage.output_tokens, (delta, whole.usage)


def count_tokens(route):
    body = {"model": route, "max_tokens": 16, "messages": [{"role": "user", "content": ASK[route]}]}
    code, v, h = raw_h("/v1/messages/count_tokens", body)
    assert code == 200, v
    used = ant.messages.create(**body).usage.input_tokens
    assert v["input_tokens"] == used > 0, (v, used)
    if route == "generate":
        assert h.get("x-tiergate-backend"), dict(h)


CODEX_FIRST = {
    "model": "gpt-5-codex", "stream": True, "store": False, "tool_choice": "auto", "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "codex-1",
    "client_metadata": {"session_id": "codex-1"}, "truncation": "auto", "service_tier": "auto",
    "instructions": None,
    "tools": [{"type": "function", "name": "exec_command", "strict": False,
               "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
              {"type": "namespace", "name": "multi_agent_v1", "description": "agents",
               "tools": [{"type": "function", "name": "close_agent", "parameters": {"type": "object"}}]},
              {"type": "web_search", "external_web_access": False}],
    "input": [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]},
              {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "what is in notes.txt?"}]}],
}


def codex_first_request():
    text, h = set_aside("/v1/responses", CODEX_FIRST,
                        ["reasoning", "include", "truncation", "service_tier", "client_metadata", "tools.web_search"])
    events = sse_events(text)
    done = [d["item"] for k, d in events if k == "response.output_item.done"]
    assert done and done[0]["type"] == "function_call" and done[0]["name"] == "exec_command", done
    assert events[-1][0] == "response.completed", events[-1]


def codex_freeform_and_shell_tools():
    for tool, kind in (({"type": "custom", "name": "apply_patch", "description": "patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}}, "custom_tool_call"),
                       ({"type": "local_shell"}, "local_shell_call")):
        code, v, _ = raw_h("/v1/responses", {"model": "generate", "input": "go", "tools": [tool], "parallel_tool_calls": False})
        assert code == 200 and v["output"][0]["type"] == kind, (code, v)
        call = v["output"][0]
        back = {"custom_tool_call": {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "applied"},
                "local_shell_call": {"type": "function_call_output", "call_id": call["call_id"], "output": "notes.txt"}}[kind]
        r2 = oai.responses.create(model="generate", tools=[tool], input=[{"role": "user", "content": "go"}, call, back])
        assert r2.output_text.startswith("stub:"), r2.output


def chat_fields():
    body = {"model": "generate", "messages": USER, "frequency_penalty": 0.5, "presence_penalty": 0.1,
            "logit_bias": {"50256": -100}, "reasoning_effort": "low", "prompt_cache_key": "chat-1",
            "service_tier": "auto", "store": True, "max_completion_tokens": 64000}
    v, h = set_aside("/v1/chat/completions", body,
                     ["frequency_penalty", "presence_penalty", "logit_bias", "reasoning_effort", "service_tier", "store"])
    assert h["x-tiergate-max-tokens"] == "4096" and h.get("x-tiergate-session") == "new", dict(h)
    assert "prompt_cache_key" not in h["x-tiergate-set-aside"], "a session key is honoured, not set aside"


def json_schema_on_generate():
    fmt = {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}
    set_aside("/v1/responses", {"model": "generate", "input": "hi", "text": {"format": fmt, "verbosity": "low"}},
              ["response_format.json_schema", "text.verbosity"])
    set_aside("/v1/chat/completions", {"model": "generate", "messages": USER,
              "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}},
              ["response_format.json_schema"])


def max_tokens_64k():
    m = ant.messages.create(model="generate", max_tokens=64000, messages=USER)
    assert m.content[0].text.startswith("stub:"), m
    r = oai.responses.create(model="generate", input="hi", max_output_tokens=64000)
    assert r.max_output_tokens == 4096, r.max_output_tokens
    c = oai.chat.completions.create(model="generate", messages=USER, max_tokens=64000)
    assert c.choices[0].message.content.startswith("stub:"), c


MEGA = "a file line of an agent's read\n" * (1024 * 1024 // 31)


def one_megabyte_conversation():
    assert len(MEGA) > 1_000_000
    convo = [{"role": "user", "content": "read it"}, {"role": "assistant", "content": MEGA}, {"role": "user", "content": "now?"}]
    c = oai.chat.completions.create(model="generate", messages=convo, max_tokens=8)
    assert c.choices[0].message.content.startswith("stub:"), c
    r = oai.responses.create(model="generate", input=convo, max_output_tokens=8)
    assert r.output_text.startswith("stub:"), r
    m = ant.messages.create(model="generate", max_tokens=8, messages=convo)
    assert m.content[0].text.startswith("stub:"), m


def aliases():
    m = ant.messages.create(model="claude-haiku-4-5-20251001", max_tokens=8, messages=USER)
    assert m.model == "generate" and m.content[0].text.startswith("stub:"), m
    r = oai.responses.create(model="gpt-5", input="hi", max_output_tokens=8)
    assert r.model == "generate", r.model
    ids = [x.id for x in oai.models.list().data]
    assert "generate" in ids, ids


def unknown_fields_set_aside():
    set_aside("/v1/responses", {"model": "classify", "input": "hi", "nonsense": 1}, ["nonsense"])
    set_aside("/v1/messages", {"model": "classify", "max_tokens": 8, "messages": USER, "nonsense": 1, "top_k": 3}, ["nonsense", "top_k"])


def image_placeholder():
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    v, _ = set_aside("/v1/messages", {"model": "generate", "max_tokens": 64, "messages": [
        {"role": "user", "content": [img, {"type": "text", "text": "what is this"}]}]}, ["image"])
    assert v["content"][0]["text"].startswith("stub:"), v


case("agents/messages/claude-code-first-request", claude_first_request)
case("agents/messages/usage-on-streams", messages_usage_streamed)
case("agents/messages/count_tokens/generate", lambda: count_tokens("generate"))
case("agents/messages/count_tokens/classify", lambda: count_tokens("classify"))
case("agents/messages/image-placeholder", image_placeholder)
case("agents/responses/codex-first-request", codex_first_request)
case("agents/responses/custom-and-local-shell-tools", codex_freeform_and_shell_tools)
case("agents/chat/fields-set-aside", chat_fields)
case("agents/all/json_schema-on-generate", json_schema_on_generate)
case("agents/all/max_tokens-64000", max_tokens_64k)
case("agents/all/one-megabyte-conversation", one_megabyte_conversation)
case("agents/all/model-aliases", aliases)
case("agents/all/unknown-fields-set-aside", unknown_fields_set_aside)

print(f"{len(cases)} cases passed")
