"""How often a request's drafts are accepted: the one record both draft-length rules read.

Each verification is observed once per track (a request's drafter, or its grammar-forced tokens, kept apart
because a grammar is right far more often than a drafter). The record keeps decayed counts, so recent steps
weigh most:

    hits       draft tokens kept
    misses     drafts that ended in a rejection (a stop is not a rejection)
    share      the share of a draft kept, an exponential average (weight :data:`SHARE_EMA` for the newest)

Two reads of the same record:
- :meth:`Acceptance.p` (the cost model, spec/cost.py, ``--speculative-adaptive``): the chance a draft token is
  kept given the ones before it were, ``hits / (hits + misses)`` pulled towards the drafter's global rate by
  :data:`PRIOR_WEIGHT` pseudo-observations. The global rate starts at :data:`PRIOR` and forgets slowly.
- :meth:`Acceptance.fixed_scale` (``--no-speculative-adaptive``): the drafter's proposal scaled by
  ``min(1, 2 x share)``; where the share is below :data:`LOW_ACCEPT` after a few verifications,
  the request drafts only every :data:`PROBE_EVERY`-th step (a probe), so text with nothing to copy costs
  almost no extra rows.
"""

from __future__ import annotations

PRIOR = (4.0, 1.0)  # global acceptance starts at Beta(4, 1) = 0.8: optimistic, so drafting is tried at all
PRIOR_WEIGHT = 2.0  # pseudo-observations of the global rate in a request's own estimate
DECAY = 0.9  # a request's evidence shrinks by this per step it is observed or passed over
START_SHARE = 0.5  # the fixed rule's share before a request's first verification: its whole proposal
SHARE_EMA = 0.3  # weight of the newest verification in the share kept
LOW_ACCEPT = 0.1  # below this share (after MIN_STEPS verifications) the fixed rule only probes
PROBE_EVERY = 8
MIN_STEPS = 3


class _Track:
    __slots__ = ("hits", "misses", "share", "steps", "skipped")

    def __init__(self):
        self.hits = self.misses = 0.0
        self.share = START_SHARE
        self.steps = self.skipped = 0


class Acceptance:
    """Per track (a request id, or its forced-token key), the decayed record of its verifications (module
    doc), and the drafter's global rate."""

    def __init__(self):
        self.hits, self.misses = PRIOR
        self._req: dict[str, _Track] = {}

    @property
    def global_rate(self) -> float:
        return self.hits / (self.hits + self.misses)

    def p(self, rid: str) -> float:
        """The chance in [0, 1] that ``rid``'s next draft token is kept, given the ones before it were."""
        t = self._req.get(rid)
        h, m = (t.hits, t.misses) if t is not None else (0.0, 0.0)
        return (h + PRIOR_WEIGHT * self.global_rate) / (h + m + PRIOR_WEIGHT)

    def fixed_scale(self, rid: str) -> float | None:
        """The fixed rule (module doc): the share in (0, 1] of the drafter's proposal ``rid`` verifies this
        step (at least one token of it), or None on a step a low-acceptance request skips."""
        t = self._req.get(rid)
        share = t.share if t is not None else START_SHARE
        if t is not None and t.steps >= MIN_STEPS and share < LOW_ACCEPT:
            t.skipped += 1
            if t.skipped % PROBE_EVERY:
                return None
        return min(1.0, 2.0 * share)

    def observe(self, rid: str, proposed: int, accepted: int, rejected: bool) -> None:
        """``accepted`` of ``proposed`` draft tokens were kept; ``rejected``: one was refused (not a stop)."""
        t = self._req.get(rid)
        if t is None:
            t = self._req[rid] = _Track()
        t.hits, t.misses = t.hits * DECAY + accepted, t.misses * DECAY + rejected
        if proposed > 0:
            t.share = (1 - SHARE_EMA) * t.share + SHARE_EMA * accepted / proposed
            t.steps += 1
        g = 1 - (1 - DECAY) / 10  # the global rate forgets ten times slower
        self.hits, self.misses = self.hits * g + accepted, self.misses * g + rejected

    def pass_over(self, rid: str) -> None:
        """A step without drafts for ``rid``: its own evidence fades, so it is tried again once the
        global rate says drafts pay."""
        t = self._req.get(rid)
        if t is not None:
            t.hits, t.misses = t.hits * DECAY, t.misses * DECAY

    def finish(self, rid: str) -> None:
        self._req.pop(rid, None)
