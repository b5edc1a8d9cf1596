"""How many draft tokens a step should verify: a cost model from the measured step time (issue 27, item 4).

On a CPU a step's time grows with the tokens it computes almost from the first extra one (docs/DESIGN.md,
speculative decoding, has the measured curves), so a draft pays only when enough of it is accepted, and the
answer changes with the batch size and the load. Per step the scheduler knows, for each decode row that
could carry drafts, the probability ``p`` that a draft token is accepted given that the ones before it were
(the request's recent acceptance, spec/acceptance.py), and the measured step time ``t(T)`` at ``T`` tokens
(:class:`StepTimes`). Draft token ``j`` of a row is kept with probability ``p^j`` (every earlier one kept),
so ``D`` extra tokens spread over the rows emit ``N0 + G(D)`` tokens in ``t(T0 + D)`` seconds, ``G(D)`` the
sum of the ``D`` largest ``p_i^j`` (a row whose draft begins with grammar-forced tokens multiplies their
track's ``p`` for those, its drafter's after them). :func:`choose_drafts` takes the ``D`` (possibly 0) of the best rate:
speculation shrinks as the batch grows and stops where no draft pays, with no batch-size cutoff to guess.
(The expected-accepted-length model is Leviathan et al., ICML 2023, section 3.5; choosing the length per step
from a measured cost is the idea of vLLM's adaptive / dynamic speculation, Liu et al. 2024.)
"""

from __future__ import annotations

import bisect
import heapq
from typing import Callable, Sequence

EXACT_UP_TO = 64  # step sizes up to this many tokens are timed exactly; above, in buckets of 1/8 octave
TIME_EMA = 0.2  # weight of a new step's measured / base time in the scale of t(T)
MARGIN = 0.05  # drafts must promise this much more output rate than none (step times are noisy)


def bucket(T: int) -> int:
    """The table key of a step of ``T`` tokens: ``T`` itself up to :data:`EXACT_UP_TO`, above it ``T``
    rounded down to 8 steps per doubling (e.g. 64..71 -> 64, 72..79 -> 72, 128..143 -> 128)."""
    if T <= EXACT_UP_TO:
        return T
    step = 1 << (T.bit_length() - 4)
    return T // step * step


class StepTimes:
    """``t(T)``: seconds of a step that computes ``T`` tokens (prefill chunks, decode rows and drafts
    together), as ``scale x base(T)``. The base curve comes from a start-up measurement (:meth:`set`: one
    row, short contexts); between its points it is interpolated linearly, below the first it is the first,
    above the last it grows along the last two points' slope. Every step run (:meth:`observe`) moves
    ``scale``, an exponential average of measured over base time, so one factor carries what the base
    curve does not see (the rows' context lengths, the load) to every ``T`` alike: a step's marginal cost
    ``t(T0 + D) - t(T0)`` keeps the base curve's shape. (Keeping a measured time per ``T`` instead mixes
    contexts: 16 long rows measured at ``T = 16`` beside start-up points at 17..20 made drafts look free.)
    With no base curve, the first step measured becomes its point."""

    def __init__(self):
        self._keys: list[int] = []
        self._t: dict[int, float] = {}
        self.scale = 1.0

    def __len__(self) -> int:
        return len(self._keys)

    def set(self, T: int, seconds: float) -> None:
        """A point of the base curve."""
        k = bucket(T)
        if k not in self._t:
            bisect.insort(self._keys, k)
        self._t[k] = seconds

    def observe(self, T: int, seconds: float) -> None:
        """One step of ``T`` tokens took ``seconds``."""
        if not self._keys:
            self.set(T, seconds)
            return
        self.scale = (1 - TIME_EMA) * self.scale + TIME_EMA * seconds / self.base(T)

    def __call__(self, T: int) -> float:
        """Estimated seconds at ``T`` tokens. Raises ValueError while nothing is measured."""
        return self.scale * self.base(T)

    def base(self, T: int) -> float:
        """The base curve at ``T`` tokens. Raises ValueError while it has no point."""
        keys, t = self._keys, self._t
        if not keys:
            raise ValueError("StepTimes: no step time measured yet")
        k = bucket(T)
        if k in t:
            return t[k]
        i = bisect.bisect_left(keys, T)
        if i == 0:
            return t[keys[0]]
        if i == len(keys):
            if len(keys) == 1:
                return t[keys[0]] * T / keys[0]
            a, b = keys[-2], keys[-1]
            return t[b] + (t[b] - t[a]) / (b - a) * (T - b)
        a, b = keys[i - 1], keys[i]
        return t[a] + (t[b] - t[a]) * (T - a) / (b - a)


def choose_drafts(
    t: Callable[[int], float],
    base_tokens: int,
    base_out: int,
    rows: Sequence[tuple[float, int]],
    budget: int,
    margin: float = MARGIN,
) -> list[int]:
    """Draft tokens per row maximizing the decode rows' expected output rate (module doc).

    The rate with ``D`` drafts is ``(N0 + G(D)) / (t(N0) + t(T0 + D) - t(T0))``: the drafts' extra time is
    what they add to this step, and it is weighed against the decode rows' own rate ``N0 / t(N0)``, not
    the step's: prompt tokens in the step make it long, but drafts that delay them cost output later.

    Args:
        t: seconds of a step at ``T`` tokens (:class:`StepTimes`).
        base_tokens: ``T0``, the tokens the step computes without drafts (>= ``base_out``).
        base_out: ``N0`` (>= 1), the tokens it emits without drafts (its decode rows).
        rows: per candidate row ``(p, n)``: acceptance probability in [0, 1] and drafts available; or
            ``(p, n, c, q)``: its first ``c`` drafts accepted with probability ``p`` each (tokens a grammar
            forces), the rest with ``q`` (the drafter's continuation after them).
        budget: most draft tokens in all.
        margin: a rate must beat the rate without drafts by this fraction (the times are estimates).

    Returns one count per row (0 where nothing pays).
    """
    rows = [r if len(r) == 4 else (r[0], r[1], r[1], r[0]) for r in rows]
    heap = [(-(p if c else q), i, 1) for i, (p, n, c, q) in enumerate(rows) if n > 0 and (p if c else q) > 0]
    heapq.heapify(heap)
    t_out, t0 = t(base_out), t(base_tokens)
    best, best_d, picks, gain = base_out / t_out * (1 + margin), 0, [], 0.0
    while heap and len(picks) < budget:
        v, i, j = heapq.heappop(heap)  # the largest chance left: row i's j-th draft token (all before it kept)
        picks.append(i)
        gain -= v
        p, n, c, q = rows[i]
        if j < n:
            heapq.heappush(heap, (v * (p if j < c else q), i, j + 1))
        rate = (base_out + gain) / (t_out + t(base_tokens + len(picks)) - t0)
        if rate > best:
            best, best_d = rate, len(picks)
    out = [0] * len(rows)
    for i in picks[:best_d]:
        out[i] += 1
    return out
