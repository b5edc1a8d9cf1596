"""Engine core (issue 2): HF parity, paging, chunked prefill, preemption, sampling, stops, logprobs."""

from __future__ import annotations

import math

import pytest

from conftest import close_engine, hf_greedy, make_engine, wait_idle

LENGTHS = [1, 7, 16, 33, 100, 257, 420, 600]
NEW = 32


@pytest.fixture(scope="module")
def prompts(passage_ids):
    # 8 prompts of 1..600 tokens, each starting at a different offset so they do not share prefixes.
    return [passage_ids[(13 * i) % 50 : (13 * i) % 50 + n] for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def reference(prompts, hf_model):
    return [hf_greedy(hf_model, p, NEW) for p in prompts]


GREEDY = {"max_new_tokens": NEW, "temperature": 0, "ignore_eos": True}


def test_parity_batch_1_and_8(engine, prompts, reference):
    assert [len(p) for p in prompts] == LENGTHS
    for p, ref in zip(prompts[:3], reference[:3]):
        assert engine.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] == ref
    outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == reference


@pytest.mark.parametrize(
    "kw",
    [
        {"page_size": 1},
        {"page_size": 16, "chunked_prefill_size": 64, "max_num_batched_tokens": 96},
        # 30 pages: the first six prompts fill the pool at admission, so decode growth must preempt.
        {"page_size": 16, "max_total_tokens": 480, "disable_radix_cache": True},
    ],
    ids=["page1", "chunked", "preempt"],
)
def test_parity_variants(kw, prompts, reference):
    e = make_engine(**kw)
    n = 7 if "max_total_tokens" in kw else 8
    try:
        outs = e.generate(input_ids=prompts[:n], sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == reference[:n]
        info = e.get_server_info()
        if "max_total_tokens" in kw:
            assert info["cache"]["num_preemptions"] > 0
        wait_idle(e)
    finally:
        close_engine(e)


_NO_KERNELS = """
import json, sys
sys.path.insert(0, "tests")
from conftest import close_engine, make_engine
from radixrt.kernels import cpp
assert cpp.ops("radixrt_attn") is None  # the torch paths only
prompts = json.load(sys.stdin)
e = make_engine()
try:
    outs = e.generate(input_ids=prompts, sampling_params={"max_new_tokens": %d, "temperature": 0, "ignore_eos": True})
    print(json.dumps([o["output_ids"] for o in outs]))
finally:
    close_engine(e)
"""


def test_parity_without_cpp_kernels(prompts, reference):
    """Where the C++ kernels cannot be built, the torch paths (cascade attention with gathers, unfused norms)
    still give HF's greedy tokens: run in a process with ``RADIXRT_DISABLE_CPP_KERNELS=1``."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "RADIXRT_DISABLE_CPP_KERNELS": "1"}
    r = subprocess.run(
        [sys.executable, "-c", _NO_KERNELS % NEW],
        input=json.dumps(prompts),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == reference


def test_output_format(engine):
    out = engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
    assert set(out) == {"text", "output_ids", "meta_info"}
    m = out["meta_info"]
    assert {"id", "prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "e2e_latency"} <= set(m)
    assert m["prompt_tokens"] == 5 and m["completion_tokens"] == len(out["output_ids"]) == 16
    assert m["finish_reason"] == {"type": "length", "length": 16}
    assert out["text"].startswith(" Paris.")
    outs = engine.generate(["a", "b"], {"max_new_tokens": 2, "temperature": 0})
    assert isinstance(outs, list) and len(outs) == 2


def test_stream_equals_non_stream(engine):
    sp = {"max_new_tokens": 12, "temperature": 0}
    full = engine.generate("Once upon a time", sp)
    chunks = list(engine.generate("Once upon a time", sp, stream=True))
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert all(chunks[i]["text"].startswith(chunks[i - 1]["text"]) for i in range(1, len(chunks)))


def test_seeded_sampling_independent_of_batch(engine):
    sp = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 1234}
    alone = engine.generate("Write a word:", sp)["output_ids"]
    mixed = engine.generate(
        ["Something else entirely", "Write a word:", "1 2 3"],
        [{"max_new_tokens": 12, "temperature": 1.0, "seed": 7}, sp, {"max_new_tokens": 5, "temperature": 0}],
    )
    assert mixed[1]["output_ids"] == alone
    other = engine.generate("Write a word:", {**sp, "seed": 99})["output_ids"]
    assert other != alone


def test_stop_token_ids_and_ignore_eos(engine):
    out = engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0, "stop_token_ids": [30]})
    assert out["output_ids"] == [7042, 30]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": 30}
    assert out["text"] == " Paris."


def test_stop_string_spanning_tokens_streamed(engine, tokenizer):
    """Edge case 6: the stop string spans 3+ tokens; deltas never show a prefix of it."""
    prompt = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    stop = " 15, 16"
    assert len(tokenizer.encode(stop, add_special_tokens=False)) >= 3
    sp = {"max_new_tokens": 30, "temperature": 0, "stop": [stop]}
    full = engine.generate(prompt, sp)
    assert full["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert full["text"] == " 13, 14,"
    prev, deltas = "", []
    for ch in engine.generate(prompt, sp, stream=True):
        deltas.append(ch["text"][len(prev) :])
        prev = ch["text"]
    assert "".join(deltas) == full["text"]
    assert all(stop not in d for d in deltas)


def test_stop_never_leaks_prefix(engine):
    prompt = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    stop = " 15, 16"
    seen = ""
    for ch in engine.generate(prompt, {"max_new_tokens": 30, "temperature": 0, "stop": [stop]}, stream=True):
        seen = ch["text"]
        if ch["meta_info"]["finish_reason"] is None:
            assert " 15" not in seen  # " 15" begins the stop string: held back until it fails or matches
    assert seen == " 13, 14,"


def test_utf8_multibyte_stream(engine):
    """Edge case 7: no U+FFFD in any delta; stream equals non-stream; a CJK stop never splits a char."""
    prompt = "Repeat exactly: 你好，世界！😀🎉 こんにちは\nRepeat exactly:"
    for n in range(1, 7):
        sp = {"max_new_tokens": n, "temperature": 0}
        full = engine.generate(prompt, sp)["text"]
        texts = [c["text"] for c in engine.generate(prompt, sp, stream=True)]
        assert texts[-1] == full
        assert all("\ufffd" not in t for t in texts)
    out = engine.generate(prompt, {"max_new_tokens": 12, "temperature": 0, "stop": ["界"]})
    assert "\ufffd" not in out["text"] and "界" not in out["text"]


def test_logprobs(engine, tokenizer):
    ids = tokenizer.encode("The capital of France is", add_special_tokens=False)
    out = engine.generate(
        input_ids=ids,
        sampling_params={"max_new_tokens": 4, "temperature": 0},
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=3,
    )
    m = out["meta_info"]
    assert len(m["input_token_logprobs"]) == len(ids) and m["input_token_logprobs"][0] is None
    assert [x[1] for x in m["input_token_logprobs"][1:]] == ids[1:]
    assert len(m["output_token_logprobs"]) == 4
    assert [x[1] for x in m["output_token_logprobs"]] == out["output_ids"]
    for lp, top in zip(m["output_token_logprobs"], m["output_top_logprobs"]):
        assert len(top) == 3 and top[0][1] == lp[1] and math.isclose(top[0][0], lp[0], abs_tol=1e-6)
        assert top[0][0] >= top[1][0] >= top[2][0] and lp[0] <= 0


def test_prefill_only(engine):
    out = engine.generate("Hello there", {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    assert out["output_ids"] == [] and out["text"] == ""
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert len(out["meta_info"]["input_token_logprobs"]) == 2


def test_min_new_tokens_blocks_eos(engine):
    sp = {"max_new_tokens": 10, "temperature": 0, "stop_token_ids": [30], "min_new_tokens": 5}
    out = engine.generate("The capital of France is", sp)
    assert len(out["output_ids"]) >= 5 and 30 not in out["output_ids"][:4]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"prompt": ""}, "text"),
        ({"input_ids": []}, "input_ids"),
        ({"input_ids": [[1, 2], []]}, "input_ids"),
        ({"input_ids": [1, 10**9]}, "input_ids"),
        ({"prompt": "hi", "sampling_params": {"temperature": -1}}, "temperature"),
        ({"prompt": "hi", "sampling_params": {"temperature": float("nan")}}, "temperature"),
        ({"prompt": "hi", "sampling_params": {"top_p": 0}}, "top_p"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": -3}}, "max_new_tokens"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": "8"}}, "max_new_tokens"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokns": 8}}, "max_new_tokns"),
        ({"prompt": "hi", "sampling_params": {"top_k": 0}}, "top_k"),
        ({"prompt": "hi", "sampling_params": {"stop": [""]}}, "stop"),
        ({"prompt": "hi", "top_logprobs_num": -1, "return_logprob": True}, "top_logprobs_num"),
        ({"prompt": "hi", "return_logprob": True, "logprob_start_len": 5}, "logprob_start_len"),
        ({"prompt": "hi", "input_ids": [1]}, "input_ids"),
        ({"prompt": "hi", "sampling_params": {"choices": ["a", "b"], "regex": "c"}}, "choices"),  # regex was dropped
    ],
)
def test_bad_input_raises_value_error(engine, kwargs, field):
    with pytest.raises(ValueError, match=field):
        engine.generate(**kwargs)
    assert engine.generate("ok", {"max_new_tokens": 1, "temperature": 0})["meta_info"]["completion_tokens"] == 1


def test_context_boundary(passage_ids):
    """Edge case 5 on a 64-token context: accepted exactly when prompt + max_new_tokens fits."""
    e = make_engine(context_length=64)
    try:
        C = 64
        for n in (C - 2, C - 1, C, C + 1):
            ids = passage_ids[:n]
            for mt in (1, 16, None):
                fits = n < C and (mt is None or n + mt <= C)
                sp = {"max_new_tokens": mt, "temperature": 0, "ignore_eos": True}
                if fits:
                    out = e.generate(input_ids=ids, sampling_params=sp)
                    assert out["meta_info"]["completion_tokens"] == (mt if mt is not None else C - n)
                else:
                    with pytest.raises(ValueError, match=str(C)):
                        e.generate(input_ids=ids, sampling_params=sp)
        wait_idle(e)
    finally:
        close_engine(e)


def test_requests_after_shutdown_raise():
    """A request to a shut-down engine raises at once (it waited forever: nothing reads the inbox)."""
    from radixrt import Engine

    e = Engine(speculative_algorithm="none")
    e.shutdown()
    with pytest.raises(RuntimeError, match="the engine is shut down"):
        e.generate("a", {"max_new_tokens": 2})
    with pytest.raises(RuntimeError, match="the engine is shut down"):
        e.flush_cache()


def test_unknown_model_and_engine_args():
    from radixrt import Engine

    with pytest.raises(ValueError, match="Supported"):
        Engine(model="/no/such/model")
    with pytest.raises(ValueError, match="page_sizee"):
        Engine(page_sizee=4)
    with pytest.raises(ValueError, match="schedule_policy"):
        Engine(schedule_policy="random")


def test_abort_stream_frees_pages(engine):
    gen = engine.generate(
        "Tell me a long story about a dragon.",
        {"max_new_tokens": 200, "temperature": 0, "ignore_eos": True},
        stream=True,
    )
    first = next(gen)
    assert first["meta_info"]["finish_reason"] is None
    gen.close()  # the client stops: the request is aborted and its pages freed (checked by the fixture)


def test_pool_size_error_names_the_field_at_fault():
    """A prompt that alone overflows the KV pool blames the prompt's field; one that fits but whose
    max_new_tokens overflows it blames max_new_tokens."""
    from radixrt.runtime.errors import ValidationError
    from radixrt.runtime.io_struct import SamplingParams
    from radixrt.runtime.tokenizer.validation import Limits, _check_length

    lim = Limits(context_length=8192, vocab_size=49152, max_total_tokens=3072)
    for n, new, field in [(3100, 5, "input_ids"), (3072, 1, "input_ids"), (3000, 100, "max_new_tokens")]:
        with pytest.raises(ValidationError, match="pool size of 3072") as e:
            _check_length(n, SamplingParams(max_new_tokens=new), lim, "input_ids")
        assert e.value.param == field


def test_omitted_max_new_tokens_fits_a_pool_smaller_than_the_context():
    """``max_new_tokens=None`` (an OpenAI request without max_tokens) runs up to the room left in the context
    or the KV pool, whichever is smaller (SGLang caps requests by the pool too): not a 400."""
    from radixrt.runtime.errors import ValidationError
    from radixrt.runtime.io_struct import SamplingParams
    from radixrt.runtime.tokenizer.validation import Limits, _check_length

    lim = Limits(context_length=8192, vocab_size=49152, max_total_tokens=1500)
    _check_length(1, SamplingParams(max_new_tokens=None), lim, "input_ids")
    _check_length(1499, SamplingParams(max_new_tokens=None), lim, "input_ids")
    with pytest.raises(ValidationError, match="pool size of 1500") as e:
        _check_length(1500, SamplingParams(max_new_tokens=None), lim, "input_ids")
    assert e.value.param == "input_ids"
    e = make_engine(max_total_tokens=64)
    try:
        out = e.generate(
            input_ids=list(range(100, 140)),
            sampling_params={"max_new_tokens": None, "temperature": 0, "ignore_eos": True},
        )
        assert out["meta_info"]["completion_tokens"] == 64 - 40
        assert out["meta_info"]["finish_reason"]["type"] == "length"
    finally:
        close_engine(e)
