"""Turn continuity (issue 28): a 4-step tool-calling conversation through chat completions, Responses and
Messages, the client sending back each tool call (arguments verbatim, or re-serialized as most frameworks
do) and a tool result. From the second step on, the prompt starts with the previous prompt **and the ids
the model generated**, so the tree holds both: ``cached_tokens`` is the previous prompt + completion less
the last generated token (never computed, so never cached), cut to whole pages, exactly; at least
``previous prompt + previous completion - one page``. Without continuity it was the previous prompt only
(272/313, 336/375, 400/438 in the issue). Greedy SmolLM2 with ``tool_choice: required``: exact calls."""

from __future__ import annotations

import json

import anthropic
import pytest

from server_fixtures import server_fixtures

MODEL = "SmolLM2-135M-Instruct"
P = 16
ASK = "Check the weather in Paris, Rome, Berlin and Madrid, one city at a time."
PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": PARAMS}}
]
RESP_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": PARAMS}]
MSG_TOOLS = [{"name": "get_weather", "description": "Weather in a city", "input_schema": PARAMS}]
# (prompt, completion, cached) per step. With --turn-store-size 0 (no continuity) the same conversation gave
# cached 176/207, 224/254, 272/302 against the previous prompt + completion: the previous prompt only
STEPS = [(185, 22, 0), (226, 22, 192), (267, 22, 240), (308, 23, 288)]
CITIES = ['{"city":"Paris"}', '{"city":"Paris"}', '{"city":"Rome"}', '{"city":"Berlin"}']


def reserialize(args: str) -> str:
    return json.dumps(json.loads(args))  # what most agent frameworks send back: '{"city": "Paris"}'


srv, _idle, oai = server_fixtures(
    "--context-length", "1024", "--grammar-backend", "xgrammar"
)  # outputs pinned under xgrammar


def check_steps(steps: list[tuple[int, int, int]]) -> None:
    """``steps``: (prompt, completion, cached) per step."""
    assert steps[0][2] == 0
    for (p0, c0, _), (p1, _, cached) in zip(steps, steps[1:]):
        assert cached == (p0 + c0 - 1) // P * P, steps
        assert cached >= p0 + c0 - P


@pytest.mark.parametrize("mode", ["verbatim", "reserialized"])
def test_chat_completions(oai, mode):
    msgs, steps, args_seen = [{"role": "user", "content": ASK}], [], []
    for step in range(4):
        r = oai.chat.completions.create(
            model=MODEL,
            messages=msgs,
            tools=CHAT_TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=40,
            extra_body={"cache_salt": f"chat-{mode}"},
        )
        u, m = r.usage, r.choices[0].message
        steps.append((u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens))
        tc = m.tool_calls[0]
        args_seen.append(tc.function.arguments)
        args = tc.function.arguments if mode == "verbatim" else reserialize(tc.function.arguments)
        msgs += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": tc.id, "type": "function", "function": {"name": "get_weather", "arguments": args}}
                ],
            },
            {"role": "tool", "tool_call_id": tc.id, "content": json.dumps({"temp_c": 20 + step})},
        ]
    assert args_seen == CITIES
    assert steps == STEPS
    check_steps(steps)


@pytest.mark.parametrize("mode", ["verbatim", "reserialized"])
def test_responses_items_sent_back(oai, mode):
    items, steps, args_seen = [{"role": "user", "content": ASK}], [], []
    for step in range(4):
        r = oai.responses.create(
            model=MODEL,
            input=items,
            tools=RESP_TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_output_tokens=40,
            store=False,
            extra_body={"cache_salt": f"resp-{mode}"},
        )
        u, call = r.usage, r.output[0]
        steps.append((u.input_tokens, u.output_tokens, u.input_tokens_details.cached_tokens))
        args_seen.append(call.arguments)
        args = call.arguments if mode == "verbatim" else reserialize(call.arguments)
        items += [
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": args},
            {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temp_c": 20 + step})},
        ]
    assert args_seen == CITIES
    assert steps == STEPS
    check_steps(steps)


def test_responses_previous_response_id(oai):
    """The stored conversation continues server-side; its session pins the previous turn's pages."""
    r = oai.responses.create(
        model=MODEL,
        input=ASK,
        tools=RESP_TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_output_tokens=40,
        extra_body={"cache_salt": "prev-id"},
    )
    ids, steps = [r.id], [(r.usage.input_tokens, r.usage.output_tokens, r.usage.input_tokens_details.cached_tokens)]
    try:
        _continue(oai, r, ids, steps)
    finally:
        for rid in ids:  # the session closes with its last response: nothing stays protected
            oai.responses.delete(rid)
    assert steps == STEPS
    check_steps(steps)


def _continue(oai, r, ids, steps):
    for step in range(3):
        call = r.output[0]
        r = oai.responses.create(
            model=MODEL,
            previous_response_id=r.id,
            tools=RESP_TOOLS,
            tool_choice="required",
            input=[
                {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temp_c": 20 + step})}
            ],
            parallel_tool_calls=False,
            temperature=0,
            max_output_tokens=40,
            extra_body={"cache_salt": "prev-id"},
        )
        ids.append(r.id)
        steps.append((r.usage.input_tokens, r.usage.output_tokens, r.usage.input_tokens_details.cached_tokens))


def test_messages(srv):
    cl = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)
    msgs, steps, inputs = [{"role": "user", "content": ASK}], [], []
    for step in range(4):
        r = cl.messages.create(
            model=MODEL,
            max_tokens=40,
            messages=msgs,
            tools=MSG_TOOLS,
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            extra_body={"temperature": 0, "cache_salt": "messages"},
        )
        u, tu = r.usage, r.content[0]
        steps.append((u.input_tokens + u.cache_read_input_tokens, u.output_tokens, u.cache_read_input_tokens))
        inputs.append(tu.input)
        msgs += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": tu.id, "name": tu.name, "input": tu.input}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tu.id, "content": json.dumps({"temp_c": 20 + step})}
                ],
            },
        ]
    assert [json.dumps(i, separators=(",", ":")) for i in inputs] == CITIES
    assert steps == STEPS
    check_steps(steps)
