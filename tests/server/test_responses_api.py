"""``/v1/responses`` (issue 28) through real clients: the ``openai`` package's ``responses.create`` and
``responses.stream`` (tools, ``previous_response_id``, ``text.format``, GET / DELETE of a stored
response), the OpenAI Agents SDK with its default (Responses) model class running a two-tool agent to
completion, and LangChain's ``ChatOpenAI(use_responses_api=True)``; bad input is a 400 in OpenAI's shape
naming the field. Greedy SmolLM2: exact outputs and token counts."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from server_fixtures import server_fixtures

MODEL = "SmolLM2-135M-Instruct"
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": CITY}
GREEDY = {"temperature": 0, "max_output_tokens": 40}
OUT_HI, HI_TOKENS = "I'm here to help with any kind", 21  # "Say hi" after "You are terse.", 8 tokens


srv, _idle, oai = server_fixtures("--context-length", "1024")


def test_text_response(oai):
    r = oai.responses.create(
        model=MODEL, input="Say hi", instructions="You are terse.", store=False, temperature=0, max_output_tokens=8
    )
    assert r.object == "response" and r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == OUT_HI
    assert (r.usage.input_tokens, r.usage.output_tokens) == (HI_TOKENS, 8)
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text"


def test_tool_call_and_previous_response_id(oai):
    r = oai.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required", **GREEDY
    )
    try:
        assert r.status == "completed" and [o.type for o in r.output] == ["function_call"]
        call = r.output[0]
        assert (call.name, call.arguments) == ("get_weather", '{"city":"Paris"}')
        got = oai.responses.retrieve(r.id)
        assert got.id == r.id and got.output[0].call_id == call.call_id
        r2 = oai.responses.create(
            model=MODEL,
            previous_response_id=r.id,
            tools=[WEATHER],
            tool_choice="required",
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'}],
            **GREEDY,
        )
        assert r2.previous_response_id == r.id
        # the stored turn (prompt and generated ids) is matched but for the last id, cut to pages
        prev = r.usage.input_tokens + r.usage.output_tokens
        assert r2.usage.input_tokens_details.cached_tokens == (prev - 1) // 16 * 16
        assert [(o.type, o.arguments) for o in r2.output] == [("function_call", '{"city":"Paris"}')]
        items = oai.responses.input_items.list(r2.id, order="asc").data
        assert [(i.type, i.call_id, i.output) for i in items] == [
            ("function_call_output", call.call_id, '{"temp_c": 21}')
        ]
        first = oai.responses.input_items.list(r.id).data
        assert [(i.type, i.role, i.content[0].type, i.content[0].text) for i in first] == [
            ("message", "user", "input_text", "What is the weather in Paris?")
        ]
        with pytest.raises(openai.BadRequestError) as e:
            oai.responses.cancel(r.id)  # foreground responses are finished when stored
        assert e.value.body["param"] == "response_id"
    finally:
        oai.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    oai.responses.delete(r2.id)


def test_logprobs_on_output_text(oai):
    """``include: ["message.output_text.logprobs"]`` with ``top_logprobs`` 2: one entry per output token whose
    texts make the output text; greedy, so each token is its own first alternative; streamed the same."""
    kw = dict(
        model=MODEL,
        input="Say hi",
        instructions="You are terse.",
        store=False,
        temperature=0,
        max_output_tokens=8,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    part = oai.responses.create(**kw).output[0].content[0]
    lps = [e.model_dump() for e in part.logprobs]
    assert part.text == OUT_HI and len(lps) == 8 and "".join(e["token"] for e in lps) == OUT_HI
    for e in lps:
        assert len(e["top_logprobs"]) == 2 and e["logprob"] <= 0
        assert (e["top_logprobs"][0]["token"], e["top_logprobs"][0]["logprob"]) == (e["token"], e["logprob"])
        assert bytes(e["bytes"]).decode() == e["token"]
    streamed, last = [], None
    with oai.responses.stream(**kw) as st:
        for ev in st:
            if ev.type == "response.output_text.delta":
                streamed += [e.model_dump() for e in ev.logprobs]
            last = ev
    final = last.response.output[0].content[0]  # response.incomplete: cut by max_output_tokens
    assert [e["token"] for e in streamed] == [e["token"] for e in lps]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in lps], abs=1e-5)
    assert len(final.logprobs) == 8
    plain = oai.responses.create(**{k: v for k, v in kw.items() if k not in ("include", "top_logprobs")})
    assert plain.output[0].content[0].logprobs == []
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(**{**kw, "top_logprobs": 21})
    assert e.value.body["param"] == "top_logprobs"


def test_stream_events(oai):
    kw = dict(
        model=MODEL,
        input="What is the weather in Rome?",
        tools=[WEATHER],
        tool_choice="required",
        store=False,
        **GREEDY,
    )
    full = oai.responses.create(**kw)
    types, args = [], ""
    with oai.responses.stream(**kw) as st:
        for ev in st:
            types.append(ev.type)
            if ev.type == "response.function_call_arguments.delta":
                args += ev.delta
        final = st.get_final_response()
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert types[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert args == final.output[0].arguments == full.output[0].arguments == '{"city":"Rome"}'
    text, last = [], None
    # one token per step (speculation off for this request), so the text comes in several deltas
    with oai.responses.stream(
        model=MODEL,
        input="Say hi",
        instructions="You are terse.",
        store=False,
        temperature=0,
        max_output_tokens=8,
        extra_body={"speculative": False},
    ) as st:
        for ev in st:
            if ev.type == "response.output_text.delta":
                text.append(ev.delta)
            last = ev
    # cut by max_output_tokens: the stream ends with response.incomplete (not .completed), as OpenAI's
    assert last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens"
    assert "".join(text) == last.response.output_text == OUT_HI and len(text) > 1


def test_text_format_json_schema(oai):
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    r = oai.responses.create(
        model=MODEL,
        input="Is Paris in France?",
        store=False,
        temperature=0,
        max_output_tokens=20,
        text={"format": {"type": "json_schema", "name": "yn", "schema": schema, "strict": True}},
    )
    assert r.status == "completed" and json.loads(r.output_text) in ({"answer": "yes"}, {"answer": "no"})


BAD = [
    ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "json_schema": {"type": "object"}}, "json_schema"),  # would be ignored: unconstrained
    ({"input": "x", "guided_choice": ["a", "b"]}, "guided_choice"),
    ({"input": "x", "max_new_tokens": 4}, "max_new_tokens"),
    ({"input": "x", "temperature": "hot"}, "temperature"),
    ({"input": "x", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"input": "x", "metadata": {"k": "v" * 513}}, "metadata.k"),
    ({"input": "x", "metadata": {"k": 5}}, "metadata.k"),
    ({"input": "x", "include": ["reasoning.encrypted_content", "bogus"]}, "include[1]"),
    ({"input": "x", "reasoning": {"effort": "ultra"}}, "reasoning.effort"),
    ({}, "input"),
]


def test_bad_input_is_400_naming_the_field(srv, oai):
    with httpx.Client(base_url=srv.url, timeout=60) as h:
        for body, param in BAD:
            r = h.post("/v1/responses", json={"model": MODEL, **body})
            assert r.status_code == 400, (body, r.text)
            err = r.json()["error"]
            assert err["param"] == param and err["type"] == "invalid_request_error", (body, err)
        assert h.get("/v1/responses/resp_nope").status_code == 404
        assert h.get("/v1/responses/resp_nope/input_items").status_code == 404
        assert h.post("/v1/responses/resp_nope/cancel").status_code == 404
    assert (
        oai.responses.create(
            model=MODEL, input="Say hi", instructions="You are terse.", store=False, temperature=0, max_output_tokens=8
        ).output_text
        == OUT_HI
    )


def test_agents_sdk_two_tools(srv):
    """The Agents SDK's default model class (OpenAIResponsesModel) runs the agent loop against us."""
    import asyncio

    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        StopAtTools,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    called = []

    @function_tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        called.append(("get_weather", city))
        return f"Sunny, 21 C in {city}"

    @function_tool
    def get_time(city: str) -> str:
        """Local time in a city."""
        called.append(("get_time", city))
        return f"10:00 in {city}"

    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    agent = Agent(
        name="helper",
        instructions="Use the tools, then answer.",
        tools=[get_weather, get_time],
        model=OpenAIResponsesModel(MODEL, client),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=40, store=False),
        tool_use_behavior=StopAtTools(stop_at_tool_names=["get_time"]),
    )
    result = asyncio.run(Runner.run(agent, "What is the weather and the time in Paris?", max_turns=6))
    # turn 1 calls get_weather, turn 2 (the tool's output sent back as items) get_time, which ends the run
    assert called == [("get_weather", "Paris"), ("get_time", "Paris")]
    assert result.final_output == "10:00 in Paris"


def test_langchain_responses_api(srv):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Weather in a city."""
        return f"Sunny in {city}"

    llm = ChatOpenAI(
        model=MODEL,
        base_url=srv.url + "/v1",
        api_key="unused",
        use_responses_api=True,
        temperature=0,
        max_tokens=40,
        max_retries=0,
        store=False,
    )
    msgs = [HumanMessage("What is the weather in Paris?")]
    ai = llm.bind_tools([get_weather], tool_choice="required").invoke(msgs)
    assert [(c["name"], c["args"]) for c in ai.tool_calls] == [("get_weather", {"city": "Paris"})]
    msgs += [ai, ToolMessage(get_weather.invoke(ai.tool_calls[0]["args"]), tool_call_id=ai.tool_calls[0]["id"])]
    final = llm.invoke(msgs)
    assert final.text == "Sunny in Paris"
