"""``--reasoning-history strip`` (the default) on the random-weight Qwen3 directory of
test_turn_continuity_qwen3.py: the chat template decides what an earlier turn renders as. Its thinking-only
turns render as empty answers and its tool-call turns without their (empty) ``<think>`` block, so each next
prompt diverges from the previous one where the generation prompt opened ``<think>``: ``cached_tokens`` is
the previous prompt less that opener, cut to pages; never the previous output (under ``keep`` it is)."""

from __future__ import annotations

import pytest

from model_dirs import QWEN_TOKENS, make_model_dir
from server_fixtures import server_fixtures
from test_turn_continuity_qwen3 import P, think_steps, tool_steps

# (prompt, completion, cached) per step; cached is the previous prompt less its "<think>\n" opener, cut to pages
TOOL_STEPS_STRIP = [(186, 20, 0), (241, 22, 176), (297, 22, 224), (353, 21, 288)]
THINK_STEPS_STRIP = [(18, 12, 0), (34, 12, 16), (50, 12, 32), (66, 12, 48)]


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, tokenizer):
    return make_model_dir(
        "qwen3",
        tmp_path_factory.mktemp("qwen3strip"),
        tokenizer,
        chat_template="qwen3_thinking.jinja",
        added_tokens=QWEN_TOKENS,
    )


srv, _idle, oai = server_fixtures(
    "--model",
    lambda request: str(request.getfixturevalue("qwen3_dir")),
    "--reasoning-parser",
    "qwen3",
    "--context-length",
    "1024",
)


def check_strip_steps(steps, qwen3_dir) -> None:
    from transformers import AutoTokenizer

    opener = len(AutoTokenizer.from_pretrained(qwen3_dir).encode("<think>\n", add_special_tokens=False))
    assert steps[0][2] == 0, steps
    for (p0, _, _), (_, _, cached) in zip(steps, steps[1:]):
        assert cached == (p0 - opener) // P * P, (steps, opener)


def test_tool_calls(oai, qwen3_dir):
    steps = tool_steps(oai, qwen3_dir)
    assert steps == TOOL_STEPS_STRIP, steps
    check_strip_steps(steps, qwen3_dir)


def test_reasoning_stripped_from_history(oai, qwen3_dir):
    steps = think_steps(oai, qwen3_dir)
    assert steps == THINK_STEPS_STRIP, steps
    check_strip_steps(steps, qwen3_dir)
