"""``/v1/messages`` and ``/v1/messages/count_tokens`` (issue 28) through the ``anthropic`` package:
``messages.create`` and ``messages.stream`` with a tool round trip, ``stop_sequences``, token counting,
the ``x-api-key`` header, and bad input answered as a 400 in Anthropic's error shape naming the field.
Greedy SmolLM2 (``temperature`` as an extra field: the current SDK no longer types it): exact values."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from server_fixtures import server_fixtures

MODEL = "SmolLM2-135M-Instruct"
KEY = "sk-anthropic-test"
GREEDY = {"temperature": 0}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": CITY}]
ONE_CALL = {"type": "any", "disable_parallel_tool_use": True}
HI, HI_TOKENS = "I'm here to help with any kind", 21  # "Say hi" after "You are terse.", 8 tokens


srv, _idle, cl = server_fixtures("--context-length", "1024", api_key=KEY, client="anthropic")


def test_text_and_stop_sequences(srv, cl):
    # another test may have cached this prompt; usage is exact only from an empty tree
    httpx.post(srv.url + "/flush_cache", headers={"x-api-key": KEY}, timeout=60).raise_for_status()
    r = cl.messages.create(
        model=MODEL,
        max_tokens=8,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say hi"}],
        extra_body=GREEDY,
    )
    assert (r.type, r.role, r.stop_reason) == ("message", "assistant", "max_tokens")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == HI
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.cache_read_input_tokens) == (HI_TOKENS, 8, 0)
    stop = HI.split()[1]
    r = cl.messages.create(
        model=MODEL,
        max_tokens=8,
        system="You are terse.",
        stop_sequences=[stop],
        messages=[{"role": "user", "content": "Say hi"}],
        extra_body=GREEDY,
    )
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)
    assert r.content[0].text == HI[: HI.index(stop)]


def test_tool_round_trip_create_and_stream(cl):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = cl.messages.create(
        model=MODEL, max_tokens=40, messages=msgs, tools=TOOLS, tool_choice=ONE_CALL, extra_body=GREEDY
    )
    assert r.stop_reason == "tool_use" and [b.type for b in r.content] == ["tool_use"]
    tu = r.content[0]
    assert (tu.name, tu.input) == ("get_weather", {"city": "Paris"}) and tu.id.startswith("toolu_")
    msgs += [
        {"role": "assistant", "content": [{"type": "tool_use", "id": tu.id, "name": tu.name, "input": tu.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tu.id, "content": "Sunny, 21 C"}]},
    ]
    counted = cl.messages.count_tokens(model=MODEL, messages=msgs, tools=TOOLS, tool_choice=ONE_CALL).input_tokens
    kinds, partial = [], ""
    with cl.messages.stream(
        model=MODEL, max_tokens=40, messages=msgs, tools=TOOLS, tool_choice=ONE_CALL, extra_body=GREEDY
    ) as st:
        for ev in st:
            kinds.append(ev.type)
            if ev.type == "content_block_delta" and ev.delta.type == "input_json_delta":
                partial += ev.delta.partial_json
        final = st.get_final_message()
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    u = final.usage
    assert u.input_tokens + u.cache_read_input_tokens == counted
    # the previous turn (prompt and the generated ids) is matched but for its last id, cut to pages
    prev = r.usage.input_tokens + r.usage.cache_read_input_tokens + r.usage.output_tokens
    assert u.cache_read_input_tokens == (prev - 1) // 16 * 16
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].input == {"city": "Paris"} and partial == '{"city":"Paris"}'


BAD = [
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": None}, "max_tokens"),
    (
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "bash_20250124", "name": "bash"}]},
        "tools[0]",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, "max_tokens"),
    # chat-path errors named as the Messages request names the field
    (
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f", "input_schema": {"type": "bad"}}]},
        "tools[0].input_schema",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "", "input_schema": {}}]}, "tools[0].name"),
    (
        {
            "messages": [{"role": "user", "content": "x"}],
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "zz"}}},
        },
        "output_config.format.schema",
    ),
    # Anthropic's own rules
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "bogus"}}, "thinking.type"),
    (
        {"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled", "budget_tokens": -5}},
        "thinking.budget_tokens",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 1.5}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "top_k": -1}, "top_k"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool", "name": "f"}}, "tool_choice"),
    (
        {
            "messages": [{"role": "user", "content": "x"}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": "x"},
        },
        "tool_choice.disable_parallel_tool_use",
    ),
    (
        {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 1024,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        "max_tokens",
    ),
    (
        {
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2048,
            "temperature": 0.5,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        },
        "temperature",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "1"}]},
            ]
        },
        "messages[2].content[0].tool_use_id",
    ),
    # a chat or /generate constraint would be ignored here, the output silently unconstrained
    ({"messages": [{"role": "user", "content": "x"}], "json_schema": {"type": "object"}}, "json_schema"),
    ({"messages": [{"role": "user", "content": "x"}], "regex": "a+"}, "regex"),
]


def test_bad_input_is_400_in_anthropic_shape(srv, cl):
    with httpx.Client(base_url=srv.url, timeout=60, headers={"x-api-key": KEY}) as h:
        for body, field in BAD:
            r = h.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, **body})
            assert r.status_code == 400, (body, r.text)
            j = r.json()
            assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error", j
            assert j["error"]["message"].startswith(field), (field, j)
        r = h.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
            headers={"x-api-key": "wrong"},
        )
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        big = b'{"messages": "' + b"x" * (9 << 20) + b'"}'  # over the 8 MiB bound, with a Content-Length
        r = h.post("/v1/messages", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "request_too_large", r.text
    with pytest.raises(anthropic.BadRequestError):
        cl.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "robot", "content": "x"}])
    r = cl.messages.create(
        model=MODEL,
        max_tokens=8,
        system="You are terse.",
        messages=[{"role": "user", "content": "Say hi"}],
        extra_body=GREEDY,
    )
    assert r.content[0].text == HI  # still serving


PREFILL = [
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is"},
]


def test_a_final_assistant_message_is_continued(srv, cl, tokenizer):
    """Anthropic's prefill: the answer continues the last assistant message's text (no new turn)."""
    r = cl.messages.create(model=MODEL, max_tokens=6, messages=PREFILL, extra_body=GREEDY)
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == " Paris."
    text = tokenizer.apply_chat_template(PREFILL, continue_final_message=True, tokenize=False)
    n = cl.messages.count_tokens(model=MODEL, messages=PREFILL).input_tokens
    assert n == len(tokenizer.encode(text, add_special_tokens=False)) and text.endswith("France is")
    with httpx.Client(base_url=srv.url, timeout=60, headers={"x-api-key": KEY}) as h:
        body = {"model": MODEL, "max_tokens": 4, "messages": [PREFILL[0], {"role": "assistant", "content": "It is "}]}
        r = h.post("/v1/messages", json=body)
        fmt = {"format": {"type": "json_schema", "schema": {"type": "object"}}}
        bad = h.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": PREFILL, "output_config": fmt})
        assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("messages[1]: a final assistant")
        huge = {"format": {"type": "json_schema", "schema": {"type": "string", "pattern": "^a{99999999}$"}}}
        for stream in (False, True):  # refused by the scheduler: named as Messages names it
            body = {"model": MODEL, "max_tokens": 4, "messages": [PREFILL[0]], "output_config": huge, "stream": stream}
            bad = h.post("/v1/messages", json=body)
            assert bad.status_code == 400, bad.text
            assert bad.json()["error"]["message"].startswith("output_config.format.schema: the grammar cannot be used")
        use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
        unanswered = [PREFILL[0], {"role": "assistant", "content": [use]}]
        bad = h.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": unanswered, "tools": TOOLS})
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["message"] == (
            "messages[1].content: the final assistant message has tool_use blocks and no tool_result follows them"
        )
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "messages[1].content: final assistant content cannot end with trailing whitespace"
    ), r.text
