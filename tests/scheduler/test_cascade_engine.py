"""Cascade attention in the engine (on the CPU kernels: ``--cpu-cascade-attention``): greedy tokens are the
same with it on and off, and with the radix cache off (no sharing at all), on prompts that share a long
prefix; and they match HF transformers."""

from __future__ import annotations

from conftest import close_engine, hf_greedy, make_engine, wait_idle

NEW = 16
GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}
SHARED = 300  # tokens of a common prefix: 18 whole pages of 16 are shared through the tree


def _prompts(passage_ids):
    # Ragged tails, each from its own offset; the first two prompts are identical (a full-prompt hit).
    tails = [passage_ids[400:420]] + [passage_ids[400 + 23 * i : 400 + 23 * i + 3 + 7 * i] for i in range(7)]
    return [passage_ids[:SHARED] + t for t in tails]


def _run(prompts, **kw):
    e = make_engine(**kw)
    try:
        outs = e.generate(input_ids=prompts, sampling_params=GREEDY)
        stats = (e.runner.cascade_steps, e.runner.cascade_rows)
        wait_idle(e)
    finally:
        close_engine(e)
    return [o["output_ids"] for o in outs], stats


def test_greedy_tokens_identical_cascade_on_off_and_cache_off(passage_ids, hf_model):
    prompts = _prompts(passage_ids)
    # the C++ CPU kernels plan groups only when asked (not batch-invariant); by default none are planned.
    # Speculation off where rows are counted: drafts, chosen from the measured step times, change the steps
    on, (steps, rows) = _run(prompts, cpu_cascade_attention=True, speculative_algorithm="none")
    off, (steps_off, _) = _run(prompts)
    nocache, (steps_nc, _) = _run(prompts, disable_radix_cache=True)
    # Request 0 prefills first and decodes alone for one step while the other 7 prefill on its cached
    # prefix; then all 8 decode as one group for NEW - 2 steps and request 0 finishes; the last step has 7.
    assert (steps, rows) == (NEW - 1, 8 * (NEW - 2) + 7)
    assert steps_off == 0 and steps_nc == 0
    assert on == off
    assert on == nocache
    assert on[7] == hf_greedy(hf_model, prompts[7], NEW)


def test_nested_prefixes_page_size_1(passage_ids):
    """Two levels: all prompts share 200 tokens, and each half shares 80 more."""
    base = passage_ids[:200]
    mids = [passage_ids[500:580], passage_ids[600:680]]
    prompts = [base + mids[i % 2] + passage_ids[700 + 11 * i : 700 + 11 * i + 2 + i] for i in range(6)]
    on, (steps, _) = _run(prompts, page_size=1, cpu_cascade_attention=True)
    off, _ = _run(prompts, page_size=1, disable_cascade_attention=True)
    assert steps > 0
    assert on == off
