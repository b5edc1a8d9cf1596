"""A grammar applies only after the reasoning ends: ``reasoning_end_ids`` through the real scheduler and
xgrammar, on a random-weight Qwen3 model (the end marker is taken from the model's own greedy output, so
the test knows exactly when the reasoning ends)."""

from __future__ import annotations

import re

import pytest

from conftest import close_engine, make_engine
from model_dirs import make_model_dir


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, tokenizer):
    d = make_model_dir("qwen3", tmp_path_factory.mktemp("qwen3gate"), tokenizer)
    e = make_engine(model=str(d), max_total_tokens=2048)
    yield e
    close_engine(e)


def test_grammar_starts_after_reasoning_end(qwen3, passage_ids):
    prompt = passage_ids[:20]
    free = qwen3.generate(
        input_ids=prompt, sampling_params={"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    )["output_ids"]
    end = free[1:3]  # "reasoning" = the model's first three tokens, ended by the pair free[1:3]
    assert free.index(free[1]) == 1
    sp = {"max_new_tokens": 12, "temperature": 0, "regex": "[0-9]{3}"}
    gated = qwen3.generate(input_ids=prompt, sampling_params={**sp, "reasoning_end_ids": end})
    assert gated["output_ids"][:3] == free[:3]  # unconstrained until the end marker
    answer = qwen3.tokenizer.decode(gated["output_ids"][3:], skip_special_tokens=True)
    assert re.fullmatch("[0-9]{3}", answer), answer
    assert gated["meta_info"]["finish_reason"]["type"] == "stop"
    plain = qwen3.generate(input_ids=prompt, sampling_params=sp)  # no gate: constrained from the first token
    assert re.fullmatch("[0-9]{3}", plain["text"]) and plain["output_ids"][:3] != free[:3]


def test_reasoning_end_ids_validated(qwen3):
    with pytest.raises(ValueError, match="reasoning_end_ids"):
        qwen3.generate("hi", {"max_new_tokens": 2, "reasoning_end_ids": [-1]})
