"""The drafter interface and what every drafter shares: its settings and the acceptance-rate adaptation."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass
class DraftConfig:
    """Drafter settings (ServerArgs' ``speculative_*`` flags).

    Attributes:
        num_draft_tokens: most draft tokens per request per step (``--speculative-num-draft-tokens``).
        spec_factor: suffix: draft length = ``spec_factor x`` matched suffix length (SuffixDecoding's
            ``max_spec_factor``, default 1.0).
        min_token_prob: suffix: stop drafting once the estimated probability that the whole draft so far is
            accepted (product of continuation frequencies) falls below this (SuffixDecoding: 0.1).
        max_depth: longest suffix matched, in tokens (SuffixDecoding: 24).
        global_tokens: suffix: tokens kept in the global store of recent outputs (oldest dropped first).
        ngram_max / ngram_min: ngram: the longest and shortest suffix looked up (vLLM's prompt lookup).
    """

    num_draft_tokens: int = 8
    spec_factor: float = 1.0
    min_token_prob: float = 0.1
    max_depth: int = 24
    global_tokens: int = 1 << 16
    ngram_max: int = 5
    ngram_min: int = 2


EMA = 0.3  # weight of the newest verification in a request's acceptance rate
LOW_ACCEPT = 0.1  # below this rate a request drafts only every PROBE_EVERY-th step (a probe)
PROBE_EVERY = 8


class _Track:
    __slots__ = ("rate", "steps", "skipped")

    def __init__(self):
        self.rate, self.steps, self.skipped = 0.5, 0, 0


class Drafter:
    """``propose(req) -> draft token ids`` for a running request (``req.rid``, ``req.input_ids``,
    ``req.output_ids``); ``observe`` reports how many of a proposal the target model accepted;
    ``finish`` is called once when the request ends (finished or aborted).

    Adaptation (shared): each request keeps an exponential average of the fraction of its drafted tokens
    accepted. The draft length a drafter wants is scaled by ``min(1, 2 x rate)``, and below
    ``LOW_ACCEPT`` the request drafts only every ``PROBE_EVERY``-th step, so text with nothing to copy
    costs almost no extra rows.
    """

    def __init__(self, cfg: DraftConfig):
        self.cfg = cfg
        self._track: dict[str, _Track] = {}

    def propose(self, req: Any, after: Sequence[int] = ()) -> list[int]:
        """The adapted proposal for ``req``'s next tokens, or for those after ``after`` (tokens a grammar
        forces next, verified before the proposal)."""
        t = self._track.setdefault(req.rid, _Track())
        if t.steps >= 3 and t.rate < LOW_ACCEPT:
            t.skipped += 1
            if t.skipped % PROBE_EVERY:
                return []
        draft = self._draft(req, after)
        if not draft:
            return []
        k = max(1, math.floor(len(draft) * min(1.0, 2.0 * t.rate)))
        return draft[: min(k, self.cfg.num_draft_tokens)]

    def draft(self, req: Any, after: Sequence[int] = ()) -> list[int]:
        """The drafter's own proposal, without the adaptation of :meth:`propose` (the cost model of
        spec/cost.py chooses how much of it a step verifies); ``after`` as in :meth:`propose`."""
        return self._draft(req, after)[: self.cfg.num_draft_tokens]

    def _draft(self, req: Any, after: Sequence[int] = ()) -> list[int]:
        """The drafter's own proposal before adaptation, for the context of ``req``'s tokens followed by
        ``after`` (subclasses)."""
        raise NotImplementedError

    def observe(self, req: Any, proposed: int, accepted: int) -> None:
        """``accepted`` of ``proposed`` (> 0) draft tokens were kept this step."""
        if proposed <= 0:
            return
        t = self._track.setdefault(req.rid, _Track())
        t.rate = (1 - EMA) * t.rate + EMA * accepted / proposed
        t.steps += 1

    def finish(self, req: Any) -> None:
        self._track.pop(req.rid, None)

    def flush(self) -> None:
        """Forget what finished requests taught (the server's cache was flushed); running requests keep
        their own state."""
