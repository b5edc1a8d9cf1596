"""radixrt.runtime.server.openai.tool_parser without a model: validation, the grammars it builds (checked with the
xgrammar matcher over the real tokenizer), and the streaming parser split at every position."""

from __future__ import annotations

import json

import pytest

from radixrt.runtime.server.http.errors import ApiError
from radixrt.runtime.server.openai.tool_parser import (
    TOOL_CALL_BEGIN,
    ToolCallStream,
    parse_output,
    plan_tools,
    render_tool_history,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
# pydantic-style: $defs at the parameters' root, referenced as "#/$defs/..." (must survive embedding)
EVENT = {
    "type": "function",
    "function": {
        "name": "create_event",
        "parameters": {
            "type": "object",
            "$defs": {"Person": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
            "properties": {"who": {"type": "array", "items": {"$ref": "#/$defs/Person"}}},
            "required": ["who"],
        },
    },
}
NOARGS = {"type": "function", "function": {"name": "ping"}}
TOOLS = [WEATHER, EVENT, NOARGS]


@pytest.fixture(scope="module")
def xgr_backend(tokenizer):
    from radixrt.runtime.constrained import create_backend

    return create_backend("xgrammar", tokenizer, 49152, dynamic_compilation=True)


def accepts(backend, tokenizer, kind, spec, text) -> bool:
    m = backend.compile(kind, spec).matcher()
    return all(m.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False)) and m.can_terminate()


def stream_all(style: str, text: str, step: int):
    st = ToolCallStream(style)
    deltas = []
    for k in range(0, len(text), step):
        deltas += st.feed(text[k : k + step])
    deltas += st.finish()
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            assert len(d["tool_calls"]) == 1
            if "id" in tc:
                assert tc["index"] not in calls and tc["type"] == "function"
                calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
            else:
                calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
    return content, [calls[i] for i in sorted(calls)], st


TAGGED = (
    'Let me check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Pa\\"ris}</tool_call>", '
    '"unit": "c"}}</tool_call>\n<tool_call>{"name": "ping", "arguments": {}}</tool_call>\n'
)


@pytest.mark.parametrize("step", [1, 2, 3, 5, 11, 1000])
def test_stream_deltas_add_up_to_the_message(step):
    content, calls, st = stream_all("tagged", TAGGED, step)
    msg_content, msg_calls = st.message()
    assert content == msg_content == "Let me check."
    assert calls == [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in msg_calls]
    assert calls == [
        {"name": "get_weather", "arguments": '{"city": "Pa\\"ris}</tool_call>", "unit": "c"}'},
        {"name": "ping", "arguments": "{}"},
    ]
    assert st.finish_reason("stop") == "tool_calls" and st.finish_reason("length") == "length"
    for c in calls:
        json.loads(c["arguments"])
    array = '[{"name":"get_weather","arguments":{"city":"]}"}},{"name":"ping","arguments":{}}]'
    content, calls, st = stream_all("array", array, step)
    assert content == "" and st.message()[0] is None
    assert [c["arguments"] for c in calls] == ['{"city":"]}"}', "{}"]
    content, calls, st = stream_all("object", '{"name":"ping","arguments":{"a":[1,2]}}', step)
    assert calls == [{"name": "ping", "arguments": '{"a":[1,2]}'}]


def test_stream_text_only_and_partial_trigger():
    for text in ("Just text, no call.  \n", "a <tool_ b <tool_call", "<tool_call>not json</tool_call> ok"):
        content, calls, st = stream_all("tagged", text, 1)
        assert content == text and not calls and st.finish_reason("stop") == "stop"
    # a trigger prefix is held back while streaming, never sent and then taken back
    st = ToolCallStream("tagged")
    assert st.feed("Hi <tool") == [{"content": "Hi"}]
    assert st.feed("_call>") == []


def test_call_cut_before_its_name_is_text():
    """max_tokens inside a call's name: the text comes back as content (as vLLM answers a call it cannot
    parse), streamed or not, instead of an empty answer."""
    text = 'Hi <tool_call>{"name": "get_w'
    for step in (1, 4, 1000):
        content, calls, st = stream_all("tagged", text, step)
        assert content == text and not calls and st.finish_reason("length") == "length"


def test_cut_call_keeps_partial_arguments():
    msg, reason = parse_output(plan_tools(TOOLS, "required", None), '[{"name":"get_weather","arguments":{"ci', "length")
    assert reason == "length" and msg["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"ci'}
    msg, reason = parse_output(plan_tools(TOOLS, "required", None), "[", "length")
    assert msg == {"role": "assistant", "content": "["} and reason == "length"


def test_grammars_accept_calls_and_refuse_bad_ones(xgr_backend, tokenizer):
    from radixrt.runtime.constrained import validate_spec

    req = plan_tools(TOOLS, "required", None)
    kind, spec = req.grammar()
    assert kind == "json_schema"
    spec = validate_spec(kind, spec)
    ok = [
        '[{"name":"get_weather","arguments":{"city":"Paris"}}]',
        '[{"name":"create_event","arguments":{"who":[{"name":"Al"}]}},{"name":"ping","arguments":{}}]',
    ]
    bad = [
        "[]",
        '[{"name":"get_weather","arguments":{}}]',
        '[{"name":"nope","arguments":{}}]',
        '[{"name":"create_event","arguments":{"who":[{"nom":"Al"}]}}]',
        '[{"name":"ping","arguments":{"x":1}}]',
    ]
    for t in ok:
        assert accepts(xgr_backend, tokenizer, kind, spec, t), t
    for t in bad:
        assert not accepts(xgr_backend, tokenizer, kind, spec, t), t
    single = validate_spec("json_schema", plan_tools(TOOLS, "required", False).grammar()[1])
    assert not accepts(xgr_backend, tokenizer, "json_schema", single, ok[1])
    named = plan_tools(TOOLS, {"type": "function", "function": {"name": "create_event"}}, None)
    kind, spec = named.grammar()
    spec = validate_spec(kind, spec)
    assert accepts(xgr_backend, tokenizer, kind, spec, '{"name":"create_event","arguments":{"who":[{"name":"A"}]}}')
    assert not accepts(xgr_backend, tokenizer, kind, spec, '{"name":"create_event","arguments":{"who":[{"x":"A"}]}}')
    assert not accepts(xgr_backend, tokenizer, kind, spec, '{"name":"ping","arguments":{}}')
    auto = plan_tools(TOOLS, None, None)
    assert auto.mode == "auto"
    kind, spec = auto.grammar()
    spec = validate_spec(kind, spec)
    assert accepts(xgr_backend, tokenizer, kind, spec, "No call needed.")
    assert accepts(xgr_backend, tokenizer, kind, spec, TAGGED.replace('</tool_call>", ', '", '))
    assert accepts(
        xgr_backend,
        tokenizer,
        kind,
        spec,
        'x <tool_call>{"name": "create_event", "arguments": {"who": [{"name": "B"}]}}</tool_call>',
    )
    assert not accepts(xgr_backend, tokenizer, kind, spec, '<tool_call>{"name": "nope", "arguments": {}}</tool_call>')
    assert not accepts(
        xgr_backend, tokenizer, kind, spec, '<tool_call>{"name": "get_weather", "arguments": {"town": "P"}}</tool_call>'
    )
    assert not accepts(
        xgr_backend,
        tokenizer,
        kind,
        spec,  # bounded whitespace inside a call
        '<tool_call>{"name": "get_weather", "arguments": {"city":    "P"}}</tool_call>',
    )


def test_prompt_injection_and_history(tokenizer):
    plan = plan_tools(TOOLS, "auto", None)
    msgs = plan.inject([{"role": "user", "content": "hi"}])
    assert msgs[0]["role"] == "system" and '"name": "get_weather"' in msgs[0]["content"]
    assert "<tool_call>" in msgs[0]["content"] and msgs[1] == {"role": "user", "content": "hi"}
    msgs = plan.inject([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert msgs[0]["content"].startswith("Be brief.\n\n# Tools") and len(msgs) == 2
    named = plan_tools(TOOLS, {"type": "function", "function": {"name": "ping"}}, None)
    assert "You must call the function ping" in named.system_text()
    hist = render_tool_history(
        [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "ping", "arguments": "{}"}}],
            }
        ]
    )
    assert hist == [{"role": "assistant", "content": TOOL_CALL_BEGIN + '{"name": "ping", "arguments": {}}</tool_call>'}]
    text = tokenizer.apply_chat_template(hist, tokenize=False)
    assert "<tool_call>" in text


@pytest.mark.parametrize(
    "tools,choice,param",
    [
        ({"a": 1}, None, "tools"),
        ([{"type": "function", "function": {}}], None, "tools[0].function.name"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
            None,
            "tools[0].function.parameters",
        ),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, "tools[0].function.parameters"),
        (TOOLS, {"type": "function", "function": {"name": "g"}}, "tool_choice"),
        (None, "required", "tool_choice"),
        (TOOLS, 3, "tool_choice"),
    ],
)
def test_bad_tools(tools, choice, param):
    with pytest.raises(ApiError) as ei:
        plan_tools(tools, choice, None)
    assert ei.value.param == param and ei.value.status == 400


def test_no_plan_without_calls():
    assert plan_tools(None, None, None) is None
    assert plan_tools([], "auto", None) is None
    assert plan_tools(TOOLS, "none", None) is None
