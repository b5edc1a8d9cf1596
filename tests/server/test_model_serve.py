"""``radixrt serve --model DIR`` on a random-weight Qwen3 directory whose tokenizer carries a Qwen3-style
chat template (tests/data/templates/qwen3.jinja), with ``--reasoning-parser qwen3``: the template renders
the tools itself, tool calls come back through the openai client (streamed and not), and
``enable_thinking: false`` closes the reasoning in the prompt so the grammar applies from the first token."""

from __future__ import annotations

import json

import openai
import pytest
from transformers import AutoTokenizer

from model_dirs import QWEN_TOKENS, make_model_dir
from server_util import start_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, tokenizer):
    return make_model_dir(
        "qwen3", tmp_path_factory.mktemp("qwen3srv"), tokenizer, chat_template="qwen3.jinja", added_tokens=QWEN_TOKENS
    )


@pytest.fixture(scope="module")
def srv(qwen3_dir):
    # one token per step (no speculation, whose deltas group tokens as the cost model's timing decides), so
    # the tool-call arguments stream in a known number of deltas
    s = start_server(
        "--model",
        str(qwen3_dir),
        "--reasoning-parser",
        "qwen3",
        "--context-length",
        "512",
        "--speculative-algorithm",
        "none",
    )
    yield s
    assert s.stop() == 0, s.logs()


@pytest.fixture(scope="module")
def oai(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def prompt_len(qwen3_dir, **kw) -> int:
    tok = AutoTokenizer.from_pretrained(qwen3_dir)
    text = tok.apply_chat_template(MSGS, add_generation_prompt=True, tokenize=False, **kw)
    return len(tok.encode(text, add_special_tokens=False))


def test_model_template_renders_tools(oai, qwen3_dir):
    r = oai.chat.completions.create(
        messages=MSGS,
        model=qwen3_dir.name,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
        temperature=0,
        extra_body=NO_THINK,
    )
    # the prompt is the model's own template with the tools and the closed think block, token for token
    assert r.usage.prompt_tokens == prompt_len(qwen3_dir, tools=[WEATHER], enable_thinking=False)
    assert r.usage.prompt_tokens != prompt_len(qwen3_dir, tools=[WEATHER])
    assert r.choices[0].finish_reason == "tool_calls", r.choices[0].message
    calls = r.choices[0].message.tool_calls
    assert len(calls) >= 1 and calls[0].function.name == "get_weather"
    args = json.loads(calls[0].function.arguments)
    assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")
    assert getattr(r.choices[0].message, "reasoning_content", None) is None


def test_tool_call_streamed_equals_non_streamed(oai, qwen3_dir):
    kw = dict(
        messages=MSGS,
        model=qwen3_dir.name,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
        temperature=0,
        extra_body=NO_THINK,
    )
    full = oai.chat.completions.create(**kw).choices[0].message.tool_calls[0].function
    name, args, pieces, finish = None, "", 0, None
    for ch in oai.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            for tc in c.delta.tool_calls or []:
                if tc.function.name:
                    name = tc.function.name
                if tc.function.arguments:
                    args += tc.function.arguments
                    pieces += 1
            finish = c.finish_reason or finish
    assert (name, args) == (full.name, full.arguments) and finish == "tool_calls"
    assert pieces >= 3  # the arguments arrived across many deltas


def test_thinking_on_gates_the_grammar(oai, qwen3_dir):
    """Thinking on: the model (random, so it never closes </think>) is not held to the schema; its text is
    returned unconstrained, split by the reasoning parser, and no call is parsed."""
    r = oai.chat.completions.create(
        messages=MSGS,
        model=qwen3_dir.name,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=12,
        temperature=0,
    )
    assert r.usage.prompt_tokens == prompt_len(qwen3_dir, tools=[WEATHER])
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and not m.tool_calls
    text = (getattr(m, "reasoning_content", None) or "") + (m.content or "")
    assert text and not text.lstrip().startswith("[")  # not the forced JSON array of calls


def test_reasoning_split_streamed(oai, qwen3_dir):
    kw = dict(messages=MSGS, model=qwen3_dir.name, max_tokens=16, temperature=0)
    full = oai.chat.completions.create(**kw).choices[0].message
    reasoning, content = "", ""
    for ch in oai.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            content += c.delta.content or ""
    assert (reasoning or None, content) == (getattr(full, "reasoning_content", None), full.content)
