"""Tool-call parsers per format (hermes, qwen25, llama3, mistral) and the qwen3 reasoning parser, on
synthetic outputs: non-streamed, streamed at every split size (so arguments arrive across many deltas),
and the structural tag of each format checked with the xgrammar matcher over the real tokenizer."""

from __future__ import annotations

import json

import pytest

from radixrt.runtime.parsers.reasoning import ReasoningStream, get_reasoning_format
from radixrt.runtime.parsers.tool_formats import detect_tool_format, get_tool_format
from radixrt.runtime.parsers.tool_stream import ToolCallStream, parse_tool_output

ARGS1 = '{"city": "Pa\\"ris}", "days": [1, 2, {"x": null}], "unit": "c"}'
ARGS2 = "{}"
CALLS = [{"name": "get_weather", "arguments": ARGS1}, {"name": "ping", "arguments": ARGS2}]

# per parser: (output text, expected content)
OUTPUTS = {
    "hermes": (
        'Let me check.\n<tool_call>{"name": "get_weather", "arguments": ' + ARGS1 + "}</tool_call>\n"
        '<tool_call>{"name": "ping", "arguments": {}}</tool_call>',
        "Let me check.",
    ),
    "qwen25": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": ' + ARGS1 + "}\n</tool_call>\n"
        '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>',
        "Let me check.",
    ),
    "llama3": ('{"name": "get_weather", "parameters": ' + ARGS1 + '}; {"name": "ping", "parameters": {}}', ""),
    "mistral": (
        'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": ' + ARGS1 + '}, {"name": "ping", "arguments": {}}]',
        "Sure.",
    ),
}
PYTHON_TAG = ('Calling.<|python_tag|>{"name": "get_weather", "parameters": ' + ARGS1 + "}", "Calling.")


def stream(parser: str, text: str, step: int):
    st = ToolCallStream(get_tool_format(parser))
    deltas = []
    for k in range(0, len(text), step):
        deltas += st.feed(text[k : k + step])
    deltas += st.finish()
    content = "".join(d.get("content", "") for d in deltas)
    calls: dict = {}
    n_arg_deltas = 0
    for d in deltas:
        for tc in d.get("tool_calls", []):
            if "id" in tc:
                assert tc["index"] not in calls and tc["type"] == "function" and tc["id"].startswith("call_")
                calls[tc["index"]] = {"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
            else:
                calls[tc["index"]]["arguments"] += tc["function"]["arguments"]
                n_arg_deltas += 1
    return content, [calls[i] for i in sorted(calls)], n_arg_deltas, st


@pytest.mark.parametrize("parser", list(OUTPUTS))
def test_non_streamed(parser):
    text, content = OUTPUTS[parser]
    msg, reason = parse_tool_output(get_tool_format(parser), text, "stop")
    assert reason == "tool_calls"
    assert msg["content"] == (content or None)
    assert [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in msg["tool_calls"]
    ] == CALLS
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"])["city"] == 'Pa"ris}'


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("parser", list(OUTPUTS))
def test_streamed_deltas_add_up(parser, step):
    text, content = OUTPUTS[parser]
    got_content, calls, n_arg_deltas, st = stream(parser, text, step)
    assert got_content == content and calls == CALLS
    assert st.finish_reason("stop") == "tool_calls" and st.finish_reason("length") == "length"
    if step == 1:  # one character per delta: the arguments of the first call arrive in one delta per char
        assert n_arg_deltas >= len(ARGS1)


def test_llama3_python_tag():
    text, content = PYTHON_TAG
    for step in (1, 4, 1000):
        got, calls, _, _ = stream("llama3", text, step)
        assert got == content and calls == CALLS[:1]
        # special tokens are kept for these formats: the end-of-turn token's text is not content
        got, calls, _, _ = stream("llama3", text + "<|eom_id|>", step)
        assert got == content and calls == CALLS[:1]
        got, calls, _, _ = stream("mistral", OUTPUTS["mistral"][0] + "</s>", step)
        assert got == OUTPUTS["mistral"][1] and calls == CALLS
    assert get_tool_format("llama3").skip_special_tokens is False


@pytest.mark.parametrize(
    "parser,text",
    [
        ("hermes", "No call here, just <tool_ text and a <tool_call>not json</tool_call> block."),
        ("llama3", 'A set {"a": 1} and {"name": 5} are not calls.'),
        ("mistral", "Plain [TOOL_CALLS] nonsense."),
    ],
)
def test_text_that_is_not_a_call(parser, text):
    for step in (1, 5, 1000):
        got, calls, _, st = stream(parser, text, step)
        assert got == text and calls == [] and st.finish_reason("stop") == "stop"


def test_call_cut_before_its_name_is_text():
    text = 'Sure. <tool_call>\n{"name": "get_'
    msg, reason = parse_tool_output(get_tool_format("qwen25"), text, "length")
    assert msg == {"role": "assistant", "content": text} and reason == "length"
    for step in (1, 5, 1000):
        got, calls, _, st = stream("qwen25", text, step)
        assert got == text and calls == []


def test_cut_call_keeps_partial_arguments():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    msg, reason = parse_tool_output(get_tool_format("qwen25"), text, "length")
    assert reason == "length" and msg["content"] is None
    assert msg["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Par'}


class _T:
    def __init__(self, name, parameters):
        self.name, self.parameters = name, parameters


TOOLS = [
    _T("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
    _T("ping", {"type": "object", "properties": {}, "additionalProperties": False}),
]


@pytest.mark.parametrize(
    "parser,good,bad",
    [
        (
            "qwen25",
            'Hi <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n</tool_call>',
        ),
        ("llama3", 'x {"name": "ping", "parameters": {}}', '{"name": "ping", "parameters": {"a": 1}}'),
        (
            "mistral",
            'ok [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
            '[TOOL_CALLS] [{"name": "nope", "arguments": {}}]',
        ),
    ],
)
def test_structural_tag_follows_format(tokenizer, parser, good, bad):
    from radixrt.runtime.constrained import create_backend

    backend = create_backend("xgrammar", tokenizer, 49152)
    spec = json.dumps(get_tool_format(parser).structural_tag(TOOLS))

    def accepts(text):
        m = backend.compile("structural_tag", spec).matcher()
        return all(m.accept_token(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert accepts(good) and not accepts(bad)
    msg, _ = parse_tool_output(get_tool_format(parser), good, "stop")
    assert len(msg["tool_calls"]) == 1


def test_detect_from_template_and_arch():
    assert detect_tool_format("qwen3", "{% if tools %}<tool_call>{% endif %}") == "qwen25"
    assert detect_tool_format("llama", "{% if tools %}<|python_tag|>{% endif %}") == "llama3"
    assert detect_tool_format("mistral", "{% if tools %}[AVAILABLE_TOOLS]{% endif %}") == "mistral"
    assert detect_tool_format("llama", "{% for m in messages %}{{ m.content }}{% endfor %}") is None
    with pytest.raises(ValueError, match="tool_call_parser must be one of"):
        get_tool_format("nope")


# ---- reasoning ----------------------------------------------------------------------------------------
THINK = "<think>\nThe user wants 2+2. That is 4.\n</think>\n\nThe answer is 4."


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
@pytest.mark.parametrize(
    "text,opened,reasoning,content",
    [
        (THINK, False, "The user wants 2+2. That is 4.", "The answer is 4."),
        ("No thinking here.", False, None, "No thinking here."),
        ("Forced reasoning</think>Answer", True, "Forced reasoning", "Answer"),
        ("<think>\ncut off in the midd", False, "cut off in the midd", ""),
        ("  <thi", False, None, "  <thi"),
    ],
)
def test_reasoning_split(step, text, opened, reasoning, content):
    st = ReasoningStream(get_reasoning_format("qwen3"), opened)
    rs, cs = [], []
    for k in range(0, len(text), step):
        r, c = st.feed(text[k : k + step])
        rs.append(r)
        cs.append(c)
        assert "<" not in r + c or text.startswith("  <thi")  # tags never leak into either channel
    r, c = st.finish()
    assert ("".join(rs) + r or None, "".join(cs) + c) == (reasoning, content) == st.result()


def test_reasoning_starts_from_prompt():
    fmt = get_reasoning_format("qwen3")
    assert fmt.starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not fmt.starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not fmt.starts_in_reasoning("<|im_start|>assistant\n")
    assert get_reasoning_format("deepseek-r1").starts_in_reasoning("")
    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        get_reasoning_format("nope")
