"""The speculation cost model (spec/cost.py, issue 27 item 4): step-time table, acceptance estimate, and the
draft lengths chosen from them, checked on hand-computed examples."""

from __future__ import annotations

import pytest

from radixrt.runtime.spec.acceptance import DECAY, PRIOR, Acceptance
from radixrt.runtime.spec.cost import StepTimes, bucket, choose_drafts

MS = 1e-3


def table(points: dict[int, float]) -> StepTimes:
    t = StepTimes()
    for T, ms in points.items():
        t.set(T, ms * MS)
    return t


T = table({1: 10, 2: 16, 3: 18, 4: 20, 5: 22, 9: 40, 16: 100, 17: 104, 18: 108})


def test_buckets_and_interpolation():
    assert [bucket(n) for n in (1, 64, 65, 71, 72, 100, 128, 143, 144)] == [1, 64, 64, 64, 72, 96, 128, 128, 144]
    assert T(7) == pytest.approx(31 * MS)  # between 5 (22) and 9 (40): 22 + 18 * 2 / 4
    assert T(20) == pytest.approx(116 * MS)  # past 18: the slope of 17 -> 18 (4 ms a token)
    assert table({4: 20})(8) == pytest.approx(40 * MS)  # one point: proportional
    t = table({1: 10})
    t.observe(1, 20 * MS)
    assert t(1) == pytest.approx(12 * MS)  # EMA 0.2
    with pytest.raises(ValueError):
        StepTimes()(1)


def test_batch_one_high_acceptance_drafts_all_four():
    # rates: none 1/10; D=1 1.9/16; 2 2.71/18; 3 3.439/20; 4 4.0951/22 = 0.186 (best)
    assert choose_drafts(T, 1, 1, [(0.9, 4)], budget=64) == [4]
    assert choose_drafts(T, 1, 1, [(0.9, 4)], budget=2) == [2]


def test_prompt_tokens_in_the_step_do_not_make_drafts_look_free():
    # one decode row beside a 15-token prompt chunk: T0 = 16. Against the step's rate (1/100) one draft of
    # p = 0.4 would look like a gain (1.4/104); against the row's own rate 1/t(1) = 0.1 it costs 4 ms for
    # 0.4 tokens: 1.4/14 = 0.1, not 5 % better; two cost 8 ms: 1.56/18 = 0.087
    assert choose_drafts(T, 16, 1, [(0.4, 2)], budget=64) == [0]
    # p = 0.95: 1.95/14 = 0.139, 2.8525/18 = 0.158 (best)
    assert choose_drafts(T, 16, 1, [(0.95, 2)], budget=64) == [2]


def test_low_acceptance_drafts_nothing():
    # p = 0.3: 1.3/16, 1.39/18, 1.417/20, 1.4251/22 all below 1/10
    assert choose_drafts(T, 1, 1, [(0.3, 4)], budget=64) == [0]
    assert choose_drafts(T, 1, 1, [(0.9, 0)], budget=64) == [0]


def test_batch_sixteen_keeps_only_the_sure_tokens():
    # base 16/100 = 0.16 (margin 2 %: 0.1632); D=1 16.95/104 = 0.16298 (not enough); D=2 adds 0.95^2, not
    # 0.5: 17.8525/108 = 0.1653 (best); D=3 +0.5: 18.3525/112 = 0.16386; D=4 +0.25: 18.6025/116 = 0.1604
    rows = [(0.95, 2), (0.5, 2)] + [(0.0, 0)] * 14
    assert choose_drafts(T, 16, 16, rows, budget=64, margin=0.02) == [2, 0] + [0] * 14
    assert choose_drafts(T, 16, 16, rows, budget=64) == [0] * 16  # the default 5 %


def test_acceptance_estimate():
    a = Acceptance()
    g0 = PRIOR[0] / sum(PRIOR)
    assert a.p("r") == pytest.approx(g0)
    a.observe("r", 4, 4, False)
    g = 1 - (1 - DECAY) / 10
    hits, misses = PRIOR[0] * g + 4, PRIOR[1] * g
    assert a.global_rate == pytest.approx(hits / (hits + misses))
    assert a.p("r") == pytest.approx((4 + 2 * a.global_rate) / 6)
    a.observe("r", 4, 1, True)  # one kept, then a rejection
    assert a.p("r") == pytest.approx((4 * DECAY + 1 + 2 * a.global_rate) / (4 * DECAY + 1 + 1 + 2))
    a.pass_over("r")
    h, m = (4 * DECAY + 1) * DECAY, 1 * DECAY
    assert a.p("r") == pytest.approx((h + 2 * a.global_rate) / (h + m + 2))
    a.finish("r")
    assert a.p("r") == pytest.approx(a.global_rate)


def test_measured_steps_scale_the_whole_curve():
    # start-up curve (one short row); then 16 long-context rows measure 108 ms at T = 16, 4x the curve
    t = table({1: 5, 2: 7.5, 16: 27, 17: 28.5, 18: 30, 20: 33})
    for _ in range(40):
        t.observe(16, 108 * MS)
    assert t.scale == pytest.approx(4.0, rel=1e-3)
    assert t(16) == pytest.approx(108 * MS, rel=1e-3)
    assert t(17) - t(16) == pytest.approx(6 * MS, rel=1e-3)  # the curve's 1.5 ms a token, 4x: never free
    assert t(19) == pytest.approx(4 * 31.5 * MS, rel=1e-3)
    # a token of p = 0.9 costs 6 ms against the rows' 16 / 108 ms: no draft pays
    rows = [(0.9, 4)] * 4 + [(0.0, 0)] * 12
    assert choose_drafts(t, 16, 16, rows, budget=64) == [0] * 16
    # a row alone at the same scale: 1 token in t(1) = 20 ms; 16 drafts of p = 0.99 emit 1 + 14.7 tokens in
    # t(17) = 114 ms (0.138 a ms against 0.05): drafts still pay where they are sure
    assert choose_drafts(t, 1, 1, [(0.99, 16)], budget=64) == [16]


def test_forced_tokens_priced_apart_from_the_drafters_continuation():
    # 4 grammar-forced tokens (p 0.99) then 4 of the drafter's (q 0.3): chances 0.99, 0.980, 0.970, 0.961,
    # then 0.288, 0.086, ...; rates: none 0.1 (x 1.05); D=3 3.940/20; 4 4.901/22 = 0.223 (best); 5 5.189/26.5
    assert choose_drafts(T, 1, 1, [(0.99, 8, 4, 0.3)], budget=64) == [4]
    # the same draft priced on the drafter's track alone: 1.3/16 = 0.081 < 0.105, none pays
    assert choose_drafts(T, 1, 1, [(0.3, 8)], budget=64) == [0]
    # (p, n) is (p, n, n, p)
    assert choose_drafts(T, 1, 1, [(0.9, 4, 4, 0.0)], budget=64) == choose_drafts(T, 1, 1, [(0.9, 4)], budget=64)


def linear(per_token_ms: float) -> StepTimes:
    """A synthetic step-time curve: 10 ms at one token, ``per_token_ms`` more for each further token (the
    verification's cost per draft token)."""
    return table({1: 10, 2: 10 + per_token_ms})


def test_flat_verify_time_takes_the_longest_draft():
    flat = linear(0)
    # a draft token that costs no time raises the rate whatever its chance: the whole draft
    assert choose_drafts(flat, 1, 1, [(0.9, 8)], budget=64) == [8]
    assert choose_drafts(flat, 1, 1, [(0.3, 8)], budget=64) == [8]
    # every row at once; a row that cannot be accepted (p = 0) drafts nothing; the budget bounds the total
    assert choose_drafts(flat, 4, 4, [(0.9, 8), (0.5, 8), (0.3, 8), (0.0, 8)], budget=64) == [8, 8, 8, 0]
    assert choose_drafts(flat, 4, 4, [(0.9, 8)] * 4, budget=20) == [5, 5, 5, 5]


def test_verify_cost_per_token_shortens_then_stops_drafts():
    # p = 0.9, 5 ms a token: none 1/10 (x 1.05 = 0.105); D=1 1.9/15 = 0.127; 2 2.71/20 = 0.1355;
    # 3 3.439/25 = 0.1376 (best); 4 4.0951/30 = 0.1365
    assert choose_drafts(linear(5), 1, 1, [(0.9, 8)], budget=64) == [3]
    # a whole step's time per token: (1 + G(D)) / (10 (1 + D)) < 1/10 for every D, since G(D) < D
    assert choose_drafts(linear(10), 1, 1, [(0.9, 8)], budget=64) == [0]
    lengths = [choose_drafts(linear(c), 1, 1, [(0.9, 8)], budget=64)[0] for c in (0, 0.5, 1, 2, 3, 5, 8, 10)]
    assert lengths == [8, 8, 8, 7, 5, 3, 1, 0]  # never longer as the cost per token grows


def test_the_choice_depends_on_the_curves_shape_not_its_scale():
    """Measured steps move only the curve's scale (StepTimes.observe), which multiplies every rate alike: the
    draft lengths stay those of the base curve (tests/scheduler/test_spec_decode.py feeds the real scheduler
    synthetic curves on this ground)."""
    for c in (0, 1, 3, 5, 10):
        scaled = linear(c)
        for _ in range(30):
            scaled.observe(4, 3.7 * scaled.base(4))  # steps 3.7x slower than the curve says
        assert scaled.scale == pytest.approx(3.7, rel=1e-2)
        for rows, base in (([(0.9, 8)], 1), ([(0.95, 4), (0.6, 8), (0.3, 2)], 3)):
            assert choose_drafts(scaled, base, base, rows, budget=64) == choose_drafts(
                linear(c), base, base, rows, budget=64
            )
