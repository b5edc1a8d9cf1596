"""Turn continuity (issue 28) on a random-weight Qwen3 directory (tests/model_dirs.py) with a thinking
model's template (tests/data/templates/qwen3_thinking.jinja: the generation prompt opens ``<think>``, history
keeps only the answer after ``</think>``, tools and tool calls rendered by the template as ``<tool_call>``
blocks), ``--reasoning-parser qwen3`` and ``--reasoning-history keep``. Two 4-step conversations through the
``openai`` client, which sends back each assistant turn as most clients do (reasoning dropped, tool-call
arguments re-serialized):

- ``tool_choice: required`` with ``</think>`` pushed by ``logit_bias`` (the random model would never close
  it): an empty thought, then the grammar's calls;
- thinking only: the random model never closes ``</think>``, so every turn is reasoning cut by ``max_tokens``;
  the template renders it as an empty turn, and ``keep`` splices the opened ``<think>`` and the reasoning back.

Either way, from the second step on ``cached_tokens`` is the previous prompt + completion less the last
generated id, cut to whole pages (>= previous prompt + completion - one page)."""

from __future__ import annotations

import json

import pytest

from model_dirs import QWEN_TOKENS, make_model_dir
from server_fixtures import server_fixtures

P = 16
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
# (prompt, completion, cached) per step; cached is (previous prompt + completion - 1) cut to 16-token pages
TOOL_STEPS = [(186, 20, 0), (239, 21, 192), (293, 23, 256), (349, 22, 304)]  # under the default backend (llguidance)
THINK_STEPS = [(18, 12, 0), (48, 12, 16), (78, 12, 48), (108, 12, 80)]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, tokenizer):
    return make_model_dir(
        "qwen3",
        tmp_path_factory.mktemp("qwen3cont"),
        tokenizer,
        chat_template="qwen3_thinking.jinja",
        added_tokens=QWEN_TOKENS,
    )


srv, _idle, oai = server_fixtures(
    "--model",
    lambda request: str(request.getfixturevalue("qwen3_dir")),
    "--reasoning-parser",
    "qwen3",
    "--reasoning-history",
    "keep",
    "--context-length",
    "1024",
)


def check_steps(steps):
    assert steps[0][2] == 0, steps
    for (p0, c0, _), (_, _, cached) in zip(steps, steps[1:]):
        assert cached == (p0 + c0 - 1) // P * P, steps
        assert cached >= p0 + c0 - P, steps


def tool_steps(oai, qwen3_dir) -> list[tuple[int, int, int]]:
    """Four ``tool_choice: required`` steps; (prompt, completion, cached) per step."""
    from transformers import AutoTokenizer

    end_think = AutoTokenizer.from_pretrained(qwen3_dir).convert_tokens_to_ids("</think>")
    msgs = [{"role": "user", "content": "Weather in Paris, Rome, Oslo and Bern?"}]
    steps = []
    for step in range(4):
        r = oai.chat.completions.create(
            model=qwen3_dir.name,
            messages=msgs,
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=60,
            temperature=0,
            logit_bias={str(end_think): 100},
            extra_body={"cache_salt": "q3-tools"},
        )
        u, m = r.usage, r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and not getattr(m, "reasoning_content", None), m
        steps.append((u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens))
        tc = m.tool_calls[0]
        args = json.dumps(json.loads(tc.function.arguments))  # re-serialized
        msgs += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": args}}
                ],
            },
            {"role": "tool", "tool_call_id": tc.id, "content": json.dumps({"temp_c": 20 + step})},
        ]
    return steps


def test_tool_calls_rendered_by_the_template(oai, qwen3_dir):
    steps = tool_steps(oai, qwen3_dir)
    assert steps == TOOL_STEPS, steps
    check_steps(steps)


def think_steps(oai, qwen3_dir) -> list[tuple[int, int, int]]:
    """Four thinking-only steps (reasoning cut by max_tokens); (prompt, completion, cached) per step."""
    msgs = [{"role": "user", "content": "Think about the weather in Paris."}]
    steps = []
    for step in range(4):
        r = oai.chat.completions.create(
            model=qwen3_dir.name, messages=msgs, max_tokens=12, temperature=0, extra_body={"cache_salt": "q3-think"}
        )
        u, m = r.usage, r.choices[0].message
        assert r.choices[0].finish_reason == "length" and not m.content
        assert getattr(m, "reasoning_content", None)  # all of it reasoning: the template drops it from history
        steps.append((u.prompt_tokens, u.completion_tokens, u.prompt_tokens_details.cached_tokens))
        msgs += [{"role": "assistant", "content": m.content}, {"role": "user", "content": f"Go on ({step})."}]
    return steps


def test_reasoning_kept(oai, qwen3_dir):
    steps = think_steps(oai, qwen3_dir)
    assert steps == THINK_STEPS, steps
    check_steps(steps)
