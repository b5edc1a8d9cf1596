"""The step-time curve the speculation cost model starts from (spec/cost.py): one forward per step size,
measured once when the scheduler starts, on scratch pages that are given back at once."""

from __future__ import annotations

import time

from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.runtime.executor.forward_batch import ForwardBatch
from radixrt.runtime.spec.cost import StepTimes

SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64)
BUDGET_S = 1.0  # start-up seconds the curve may take: a small model measures every size, a large one the first few


def measure_step_times(
    runner, allocator, sizes=SIZES, reps: int = 2, context: int = 0, budget_s: float | None = BUDGET_S
) -> StepTimes:
    """``t(T)`` for each ``T`` of ``sizes``: the fastest of ``reps`` forwards of one row of ``T`` tokens
    (the weight products dominate a step here, and they cost the same whichever rows the tokens belong
    to); the online measurements of every real step refine it (``StepTimes.observe``). ``context``: tokens
    of the row's request already in the pool (benchmarks/step_curve.py: a verification row at a long
    context; their K/V are whatever the scratch pages hold, which does not change the time). Sizes are
    measured in increasing order until ``budget_s`` seconds have gone (None: all), keeping at least two;
    above the last one measured the curve grows along its last slope (``StepTimes.base``): a large model
    spends about the budget, not a minute, at start-up. Empty when the pool has no free pages for
    ``context`` plus the largest size."""
    times, P, n = StepTimes(), runner.page_size, context + max(sizes)
    pages = allocator.allocate(-(-n // P))
    if pages is None:
        return times
    try:
        batches = {T: _one_row(T, pages, P, context) for T in sizes}
        start = time.perf_counter()
        for _ in range(2):  # warm-up: kernels built, first allocations (each size's first rep warms it too)
            runner.forward(batches[sizes[0]])
        for i, T in enumerate(sizes):
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                runner.forward(batches[T])
                best = min(best, time.perf_counter() - t0)
            times.set(T, best)
            if budget_s is not None and i >= 1 and time.perf_counter() - start > budget_s:
                break
    finally:
        allocator.free(pages)
    return times


def _one_row(T: int, pages: list[int], P: int, context: int = 0) -> ForwardBatch:
    n = context + T
    meta = AttentionMetadata.build([pages[: -(-n // P)]], [T], [n], P)
    return ForwardBatch.make([0] * T, list(range(context, n)), meta, list(range(T)))
