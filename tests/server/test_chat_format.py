"""The model's own chat template (issue 14): Qwen2.5, Qwen3 and Llama 3.1-style templates (test fixtures
written from their documented formats) render the tools and earlier tool calls themselves; the tool-call
parser follows the template (or ``--tool-call-parser``); SmolLM2's template falls back to the injected
Hermes prompt; Qwen3's ``enable_thinking: false`` closes the reasoning in the prompt, so no grammar gate."""

from __future__ import annotations

import copy
import json

import pytest

from model_dirs import FIXTURES
from radixrt.runtime.server.openai.chat_format import ChatFormat, prepare_turn
from radixrt.runtime.server.http.errors import ApiError
from radixrt.runtime.server.openai.tool_parser import plan_tools

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
]


def with_template(tokenizer, name: str):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (FIXTURES / name).read_text()
    return tok


@pytest.mark.parametrize(
    "template,model_type,parser,tools_text,call_text,result_text",
    [
        (
            "qwen25.jinja",
            "qwen2",
            "qwen25",
            '<tools>\n{"type": "function", "function": {"name": "get_weather"',
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
            "<|im_start|>user\n<tool_response>\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "qwen3.jinja",
            "qwen3",
            "qwen25",
            '<tools>\n{"type": "function", "function": {"name": "get_weather"',
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
            "<tool_response>\n18C\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            "llama31.jinja",
            "llama",
            "llama3",
            'Respond in the format {"name": function name, "parameters"',
            '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}'
            "<|eot_id|>",
            "<|start_header_id|>ipython<|end_header_id|>\n\n18C<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
    ],
)
def test_template_renders_tools_and_history(
    tokenizer, template, model_type, parser, tools_text, call_text, result_text
):
    tok = with_template(tokenizer, template)
    cf = ChatFormat.for_model(tok, model_type)
    assert cf.template_tools and cf.tool_format.name == parser
    plan = plan_tools([WEATHER], "auto", None)
    turn = prepare_turn(cf, tok, HISTORY, plan, {}, None)
    assert tools_text in turn.prompt and call_text in turn.prompt and turn.prompt.endswith(result_text)
    assert '<tool_call>{"name": <function-name>' not in turn.prompt  # not the injected Hermes prompt
    tag = json.loads(turn.sampling["structural_tag"])
    assert tag["format"]["triggers"] == [cf.tool_format.trigger]
    assert tag["format"]["tags"][0]["begin"] == cf.tool_format.begin("get_weather")
    assert (turn.sampling.get("skip_special_tokens") is False) == (parser == "llama3")
    parser_obj = turn.parser()
    msg, reason = parser_obj.parse(
        cf.tool_format.begin("get_weather") + '{"city": "Oslo"}' + cf.tool_format.end, "stop"
    )
    assert reason == "tool_calls" and msg["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'


def test_smollm2_falls_back_to_injected_prompt(tokenizer):
    cf = ChatFormat.for_model(tokenizer, "llama")
    assert not cf.template_tools and cf.tool_format is None
    plan = plan_tools([WEATHER], "auto", None)
    turn = prepare_turn(cf, tokenizer, HISTORY, plan, {}, None)
    assert turn.prompt.startswith("<|im_start|>system\n# Tools\n")
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in turn.prompt
    assert json.loads(turn.sampling["structural_tag"])["format"]["triggers"] == ["<tool_call>"]
    forced = ChatFormat.for_model(tokenizer, "llama", tool_call_parser="mistral")
    turn = prepare_turn(forced, tokenizer, HISTORY, plan, {}, None)
    assert json.loads(turn.sampling["structural_tag"])["format"]["triggers"] == ["[TOOL_CALLS]"]


def test_enable_thinking_and_grammar_gate(tokenizer):
    tok = with_template(tokenizer, "qwen3.jinja")
    cf = ChatFormat.for_model(tok, "qwen3", reasoning_parser="qwen3")
    msgs = [{"role": "user", "content": "hi"}]
    sp = {"json_schema": "{}"}
    on = prepare_turn(cf, tok, msgs, None, sp, None)
    assert on.prompt.endswith("<|im_start|>assistant\n") and not on.starts_in_reasoning
    assert on.sampling["reasoning_end_ids"] == tok.encode("</think>", add_special_tokens=False)
    off = prepare_turn(cf, tok, msgs, None, sp, {"enable_thinking": False})
    assert off.prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "reasoning_end_ids" not in off.sampling
    assert "reasoning_end_ids" not in prepare_turn(cf, tok, msgs, None, {}, None).sampling  # no grammar
    msg, _ = on.parser().parse("<think>\nhmm\n</think>\n\n{}", "stop")
    assert msg == {"role": "assistant", "content": "{}", "reasoning_content": "hmm"}
    assert prepare_turn(cf, tok, msgs, None, sp, None, separate_reasoning=False).parser() is None


def test_bad_template_kwargs(tokenizer):
    cf = ChatFormat.for_model(tokenizer, "llama")
    for bad in ({"tools": []}, {"add_generation_prompt": False}):
        with pytest.raises(ApiError) as e:
            prepare_turn(cf, tokenizer, [{"role": "user", "content": "hi"}], None, {}, bad)
        assert e.value.param == "chat_template_kwargs"
    with pytest.raises(ApiError) as e:
        prepare_turn(cf, tokenizer, [{"role": "user", "content": "hi"}], None, {}, ["x"])
    assert e.value.param == "chat_template_kwargs"
