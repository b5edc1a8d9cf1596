"""Speculative decoding (issue 27) on the real model: the same tokens with speculation on and off (greedy,
seeded sampling, stop strings, length, logprobs, n > 1, sessions, streaming, cache on and off), drafts
really accepted, the pages of rejected drafts given back, an abort while a row carries drafts."""

from __future__ import annotations

import pytest
import torch

from radixrt.runtime.io_struct import GenerateReq, SamplingParams, kind

from radixrt.runtime.spec.cost import StepTimes

from conftest import close_engine, make_engine, wait_idle

P = 16
PARITY = [
    "The capital of France is",
    "def fib(n):",
    "List three colors:",
    "Once upon a time",
    "Translate to French: good morning",
    "2 + 2 =",
    "The quick brown fox",
    "Write a haiku about the sea.",
]
TOOLS = (
    "Tools: search_files(path, pattern) finds files; read_file(path) returns a file; "
    "write_file(path, content) saves a file; run_tests(target) runs the tests."
)
CALL = '{"tool": "read_file", "args": {"path": "src/app/main.py"}}'
AGENT = [
    f"<|im_start|>system\n{TOOLS}<|im_end|>\n<|im_start|>user\nFix the bug in src/app/main.py.<|im_end|>\n"
    f"<|im_start|>assistant\n{CALL}<|im_end|>\n<|im_start|>user\nObservation {i}: def main(): return 1/0"
    f"<|im_end|>\n<|im_start|>assistant\n" + '{"tool": "'
    for i in range(4)
]
GREEDY = {"temperature": 0, "max_new_tokens": 32}
COUNT = "one two three four five six seven eight. one two three four five six seven eight. one two three"
# Speculation whose drafts do not depend on the wall clock: the cost model off (its draft lengths come from the
# step times measured on this machine) and the draft length pinned (SuffixDecoding's depth, the default), so
# every row verifies what the drafter proposes, scaled by the request's acceptance (tokens, not seconds).
# The cost model has its own tests on synthetic step times (test_cost_model_on_synthetic_step_times here,
# tests/spec/test_cost.py).
FIXED = {"speculative_adaptive": False, "speculative_num_draft_tokens": 24}


@pytest.fixture(scope="module")
def off():
    e = make_engine(speculative_algorithm="none")
    yield e
    close_engine(e)


@pytest.fixture(scope="module")
def suffix():
    """Every decode row drafts what the drafter proposes (not the cost model's choice, which depends on
    the step times measured here): the verification path runs on every step that has a draft."""
    e = make_engine(speculative_algorithm="suffix", **FIXED)
    yield e
    close_engine(e)


@pytest.fixture(scope="module")
def wide():
    """Speculation at every batch size (the statistical tests send hundreds of requests at once)."""
    e = make_engine(speculative_algorithm="suffix", speculative_max_batch_size=64, **FIXED)
    yield e
    close_engine(e)


def spec(e) -> dict:
    return e.get_server_info()["cache"]["speculative"]


def ids_of(outs):
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize("algo", ["suffix", "ngram"])
def test_greedy_tokens_identical_with_speculation(off, suffix, algo):
    e = suffix if algo == "suffix" else make_engine(speculative_algorithm=algo, **FIXED)
    try:
        want_p, want_a = ids_of(off.generate(PARITY, GREEDY)), ids_of(off.generate(AGENT, GREEDY))
        before = spec(e)["accepted_tokens"]
        assert ids_of(e.generate(PARITY, GREEDY)) == want_p  # batched (8 rows)
        assert ids_of(e.generate(AGENT, GREEDY)) == want_a
        assert [e.generate(p, GREEDY)["output_ids"] for p in AGENT[:2]] == want_a[:2]  # alone
        st = spec(e)
        assert st["algorithm"] == algo and st["accepted_tokens"] - before > 20  # drafts were really kept
        assert 0 < st["accept_rate"] <= 1 and st["accept_length"] > 1
    finally:
        if e is not suffix:
            close_engine(e)


def test_greedy_identical_without_radix_cache(off):
    nocache = make_engine(speculative_algorithm="suffix", disable_radix_cache=True, **FIXED)
    try:
        want = [off.generate(p, GREEDY)["output_ids"] for p in AGENT]
        assert [nocache.generate(p, GREEDY)["output_ids"] for p in AGENT] == want
        assert spec(nocache)["accepted_tokens"] > 0
    finally:
        close_engine(nocache)


def test_greedy_identical_on_gguf_blocks():
    # the default server's weights: the GGUF's own Q4_1 blocks, fp16 KV pool
    q_off = make_engine(quantization="auto", speculative_algorithm="none")
    try:
        q_on = make_engine(quantization="auto", speculative_algorithm="suffix", **FIXED)
        try:
            # an answer that copies its prompt verifies drafts
            assert q_on.generate(COUNT, GREEDY)["output_ids"] == q_off.generate(COUNT, GREEDY)["output_ids"]
            assert spec(q_on)["accepted_tokens"] > 0
            want = ids_of(q_off.generate(AGENT, GREEDY))
            assert ids_of(q_on.generate(AGENT, GREEDY)) == want
            assert [q_on.generate(p, GREEDY)["output_ids"] for p in AGENT[:2]] == want[:2]  # alone
        finally:
            close_engine(q_on)
    finally:
        close_engine(q_off)


def step_curve(**ms: float) -> StepTimes:
    """A synthetic step-time curve ``t(T)``: ``t1=10, t2=20`` is 10 ms at 1 token, 20 ms at 2 tokens (and along
    the last slope above the last point)."""
    t = StepTimes()
    for k, v in ms.items():
        t.set(int(k[1:]), v * 1e-3)
    return t


def test_cost_model_on_synthetic_step_times(off):
    """The cost model (``--speculative-adaptive``, the default) in the real scheduler, fed step times instead
    of measuring them: a step's time that does not grow with its tokens makes every draft token pay (the
    whole of each proposal is verified: the prompt-copying answer comes in few passes), one that grows by a
    whole step per token makes none pay (no draft at all, one pass per token). The choice depends on the
    curve's shape only: the online measurements scale the whole curve (``StepTimes.observe``), which
    changes no comparison of rates. The same tokens either way."""
    sp = {"temperature": 0, "max_new_tokens": 12}
    want = off.generate(COUNT, sp)
    e = make_engine(speculative_algorithm="suffix", speculative_num_draft_tokens=24)  # adaptive: the default
    try:
        got = {}
        for name, curve in (("flat", step_curve(t1=10, t64=10)), ("steep", step_curve(t1=10, t2=20))):
            e._call(lambda: setattr(e.scheduler.spec, "times", curve))
            e.flush_cache()  # the drafter's store of outputs too: the drafts depend on this prompt alone
            c0 = e.get_server_info()["cache"]
            out = e.generate(COUNT, sp)
            c1 = e.get_server_info()["cache"]
            assert (out["output_ids"], out["text"]) == (want["output_ids"], want["text"]), name
            d = {
                k: c1["speculative"][k] - c0["speculative"][k]
                for k in ("verify_steps", "draft_tokens", "accepted_tokens")
            }
            got[name] = (c1["req_forward_passes"] - c0["req_forward_passes"], d)
        # flat: the prefill row verifies the drafter's whole proposal, " four five six seven eight. one two three" (9
        # tokens; 6 kept), as test_drafts_after_the_prompt_are_verified_by_the_prefill finds without the cost model
        assert got["flat"] == (6, {"verify_steps": 1, "draft_tokens": 9, "accepted_tokens": 6})
        assert got["steep"] == (12, {"verify_steps": 0, "draft_tokens": 0, "accepted_tokens": 0})
    finally:
        close_engine(e)


def test_stop_length_logprobs_n_and_stream_unchanged(off, suffix):
    cases = [
        ({"temperature": 0, "max_new_tokens": 48, "stop": ['"path']}, {}),
        ({"temperature": 0, "max_new_tokens": 7, "ignore_eos": True}, {}),
        ({"temperature": 0, "max_new_tokens": 13, "stop_token_ids": [3]}, {}),
        ({"temperature": 0, "max_new_tokens": 20}, {"return_logprob": True, "top_logprobs_num": 2}),
        ({"temperature": 0.7, "max_new_tokens": 20, "n": 2, "seed": 5}, {}),
    ]
    for sp, kw in cases:
        for p in AGENT[:2]:
            a, b = off.generate(p, sp, **kw), suffix.generate(p, sp, **kw)
            if isinstance(a, dict):
                a, b = [a], [b]
            for x, y in zip(a, b):
                assert (y["output_ids"], y["text"]) == (x["output_ids"], x["text"]), sp
                assert y["meta_info"]["finish_reason"] == x["meta_info"]["finish_reason"]
                if kw:  # one entry per output token, same ids, same values
                    lx, ly = x["meta_info"]["output_token_logprobs"], y["meta_info"]["output_token_logprobs"]
                    assert len(ly) == len(y["output_ids"]) and [t[1] for t in ly] == [t[1] for t in lx]
                    assert [t[0] for t in ly] == pytest.approx([t[0] for t in lx], abs=1e-5)
    assert len(off.generate(AGENT[0], {"temperature": 0, "max_new_tokens": 7, "ignore_eos": True})["output_ids"]) == 7
    chunks = list(suffix.generate(AGENT[1], GREEDY, stream=True))
    assert chunks[-1]["output_ids"] == off.generate(AGENT[1], GREEDY)["output_ids"]
    assert chunks[-1]["text"] == off.generate(AGENT[1], GREEDY)["text"]


def test_sessions_unchanged(off, suffix):
    got = []
    for e in (off, suffix):
        sid = e.open_session(capacity_of_str_len=8192)
        a1 = e.generate(AGENT[0], GREEDY, session_params={"id": sid})
        a2 = e.generate(
            "\n<|im_start|>user\nObservation: fixed<|im_end|>\n<|im_start|>assistant\n",
            GREEDY,
            session_params={"id": sid},
        )
        got.append((a1["output_ids"], a2["output_ids"], a2["meta_info"]["cached_tokens"]))
        e.close_session(sid)
    assert got[1] == got[0]


def test_default_is_suffix_and_calibration_keeps_to_its_budget(engine):
    """--speculative-algorithm auto (the default) drafts with suffix on the CPU; the start-up step-time curve
    stops once its time budget is spent (two sizes at least), or measures every size without one."""
    from radixrt.runtime.scheduler.spec_calibrate import measure_step_times

    assert spec(engine)["algorithm"] == "suffix"
    free = engine.check_invariants()["free_pages"]
    few = measure_step_times(engine.runner, engine.scheduler.allocator, (1, 2, 3, 4), reps=1, budget_s=0.0)
    every = measure_step_times(engine.runner, engine.scheduler.allocator, (1, 2, 3, 4), reps=1, budget_s=None)
    assert (len(few), len(every)) == (2, 4)
    assert 0 < few(1) and few.base(4) > 0 and every(4) > 0
    assert engine.check_invariants()["free_pages"] == free  # the scratch pages went back


def test_seeded_sampling_identical(off, wide):
    """Each output token consumes the request's generator once, verified or not (spec_step.py)."""
    sps = [{"temperature": 0.8, "top_p": 0.95, "max_new_tokens": 24, "seed": s} for s in range(8)]
    prompts = [AGENT[s % 4] for s in range(8)]
    before = spec(wide)["accepted_tokens"]
    assert ids_of(wide.generate(prompts, sps)) == ids_of(off.generate(prompts, sps))
    assert spec(wide)["accepted_tokens"] > before


def chi_square_p(a: list[int], b: list[int]) -> float:
    """Two-sample chi-square test of homogeneity over the tokens of ``a`` and ``b`` (categories with an
    expected count under 5 pooled). Returns the p-value: the regularized upper incomplete gamma function
    Q(df/2, x/2)."""
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    cats, pool = [], [0, 0]
    for t in set(ca) | set(cb):
        tot = ca[t] + cb[t]
        if min(tot * na, tot * nb) / (na + nb) >= 5:
            cats.append((ca[t], cb[t]))
        else:
            pool[0] += ca[t]
            pool[1] += cb[t]
    if sum(pool):
        cats.append(tuple(pool))
    x = 0.0
    for oa, ob in cats:
        tot = oa + ob
        for o, n in ((oa, na), (ob, nb)):
            exp = tot * n / (na + nb)
            x += (o - exp) ** 2 / exp
    df = len(cats) - 1
    return float(
        torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(x / 2, dtype=torch.float64))
    )


def test_sampled_distribution_unchanged_chi_square(off, wide, tokenizer):
    """Temperature 1: the second output token of 300 seeded requests with a forced one-token draft (the greedy
    second token, accepted with probability p(draft)) against 300 other seeds without speculation. Chi-square
    test of homogeneity; the test fails when p < 0.001 (a false alarm once in a thousand runs at most, and
    the seeds are fixed, so it is deterministic)."""
    prompt = "Once upon a time"
    g = off.generate(prompt, {"temperature": 0, "max_new_tokens": 2})["output_ids"]
    drafter = wide.scheduler.spec.drafter
    orig = drafter.draft
    drafter.draft = lambda req, after=(), share=1.0: [g[1]] if len(req.output_ids) == 1 else []
    try:
        n = 300
        sp = lambda s: {"temperature": 1.0, "max_new_tokens": 3, "ignore_eos": True, "seed": s}
        before = spec(wide)
        on = [o["output_ids"][1] for o in wide.generate([prompt] * n, [sp(s) for s in range(n)])]
        after = spec(wide)
    finally:
        drafter.draft = orig
    ref = [o["output_ids"][1] for o in off.generate([prompt] * n, [sp(10_000 + s) for s in range(n)])]
    assert after["verify_steps"] - before["verify_steps"] == n  # every second token was a verification
    kept = after["accepted_tokens"] - before["accepted_tokens"]
    assert kept == sum(t == g[1] for t in on) and 0 < kept < n
    assert chi_square_p(on, ref) > 1e-3
    # the test has power: the draft token forced into every output is rejected at p < 0.001
    assert chi_square_p([g[1]] * n, ref) < 1e-3


def test_drafts_after_the_prompt_are_verified_by_the_prefill(off, suffix):
    """A chunk that ends its prompt carries drafts (the prompt's own earlier words): the first output tokens
    come with the prefill's forward, the same tokens as without speculation, in fewer passes."""
    prompt = COUNT
    sp = {"temperature": 0, "max_new_tokens": 12}
    got = []
    for e in (off, suffix):
        e.flush_cache()  # the drafter's store of outputs too: the drafts depend on this prompt alone
        c0 = e.get_server_info()["cache"]
        out = e.generate(prompt, sp)
        c1 = e.get_server_info()["cache"]
        d = {
            k: c1["speculative"][k] - c0["speculative"][k] for k in ("verify_steps", "draft_tokens", "accepted_tokens")
        }
        got.append((out["text"], c1["req_forward_passes"] - c0["req_forward_passes"], d))
    assert got[1][0] == got[0][0] == " four five six seven eight.\n\nThe answer is "
    assert got[0][1:] == (12, {"verify_steps": 0, "draft_tokens": 0, "accepted_tokens": 0})
    assert got[1][1] == 6 and got[1][2]["accepted_tokens"] >= 6

    def first_step(s):  # on the engine's thread: the prefill step alone, by hand
        s.add_request(GenerateReq(rid="spec-prefill", input_ids=ids, sampling_params=SamplingParams(**sp)))
        batch = s.schedule()
        req = s.by_rid["spec-prefill"]
        row = ([r.n for r in batch], next(list(r.drafts) for r in batch if r.req is req))
        fb = s.runner.prepare(batch)
        s.process_batch_result(batch, fb, s.runner.forward(fb))
        s.collect_outputs()
        out = list(req.output_ids)
        s.abort("spec-prefill")
        s.collect_outputs()
        return row, out

    ids = suffix.tokenizer.encode(prompt)
    suffix.flush_cache()
    (n, draft), out = suffix._call(lambda: first_step(suffix.scheduler))
    # the prefill row carried the prompt's own continuation: " four five six seven eight. one two three"
    assert suffix.tokenizer.decode(draft) == " four five six seven eight. one two three"
    assert n == [len(ids) + len(draft)]
    assert suffix.tokenizer.decode(out) == " four five six seven eight.\n"  # 6 drafts kept + 1 sampled


def test_opt_out_per_request(suffix):
    before = spec(suffix)["verify_steps"]
    suffix.generate(AGENT[0], {**GREEDY, "speculative": False})
    assert spec(suffix)["verify_steps"] == before
    with pytest.raises(ValueError, match="speculative"):
        suffix.generate(AGENT[0], {**GREEDY, "speculative": "no"})


def _drive(s, rid, ids, abort_after_forward: bool):
    """On the engine's thread: run steps by hand until the request's row carries drafts. Checks after each
    step that only the next token's pages stay allocated past the computed tokens; with
    ``abort_after_forward`` the drafted step's forward runs and the request is aborted before it concludes."""
    s.add_request(
        GenerateReq(
            rid=rid, input_ids=ids, sampling_params=SamplingParams(max_new_tokens=64, temperature=0, ignore_eos=True)
        )
    )
    rolled = 0
    while rid in s.by_rid:
        batch = s.schedule()
        req = s.by_rid[rid]
        drafted = any(r.drafts for r in batch if r.req is req)
        fb = s.runner.prepare(batch)
        logits = s.runner.forward(fb)
        if drafted and abort_after_forward:
            computed = req.num_computed
            s.abort(rid)
            s.collect_outputs()
            return computed, kind(req.finished_reason)
        s.process_batch_result(batch, fb, logits)
        s.collect_outputs()
        if drafted and req.finished_reason is None:
            # the computed tokens' pages stay, none past the next token's (that one's page comes with the
            # next step's grow when every draft was accepted and the next token starts a page)
            assert -(-req.num_computed // P) <= len(req.page_table) <= -(-(req.num_computed + 1) // P)
            st = s.req_pages.stats(s.running)
            assert (
                st["free_pages"] + st["evictable_pages"] + st["protected_pages"] + st["private_pages"]
                == st["total_pages"]
            )
            rolled += 1
    return rolled, None


def test_rollback_and_abort_mid_verification(suffix, tokenizer):
    ids = tokenizer.encode(CALL * 6, add_special_tokens=False)
    suffix.flush_cache()
    rolled, _ = suffix._call(lambda: _drive(suffix.scheduler, "spec-roll", ids, False))
    assert rolled > 0
    wait_idle(suffix)
    suffix.flush_cache()
    computed, reason = suffix._call(lambda: _drive(suffix.scheduler, "spec-abort", ids, True))
    assert reason == "abort"
    st = wait_idle(suffix)
    # every page is free or in the tree, and the tree holds whole pages of computed (accepted) tokens only
    assert st["private_pages"] == 0 and st["protected_pages"] == 0
    assert st["evictable_pages"] == computed // P
    assert st["free_pages"] + st["evictable_pages"] == st["total_pages"]
