"""The drafter interface and the settings every drafter shares."""

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


class Drafter:
    """``draft(req) -> draft token ids`` for a running request (``req.rid``, ``req.input_ids``,
    ``req.output_ids``); ``finish`` is called once when the request ends (finished or aborted), ``flush``
    when the server's cache is flushed. How much of a proposal a step verifies is not the drafter's
    choice: the speculator decides from the request's acceptance (spec/acceptance.py, spec/cost.py)."""

    def __init__(self, cfg: DraftConfig):
        self.cfg = cfg

    def draft(self, req: Any, after: Sequence[int] = (), share: float = 1.0) -> list[int]:
        """The drafter's proposal for ``req``'s next tokens, or for those after ``after`` (tokens a grammar
        forces next, verified before the proposal): the first ``share`` (in (0, 1]) of it, at least one
        token, at most ``num_draft_tokens``."""
        d = self._draft(req, after)
        if share < 1.0 and d:
            d = d[: max(1, math.floor(len(d) * share))]
        return d[: self.cfg.num_draft_tokens]

    def _draft(self, req: Any, after: Sequence[int] = ()) -> list[int]:
        """The drafter's own proposal, uncut, for the context of ``req``'s tokens followed by
        ``after`` (subclasses)."""
        raise NotImplementedError

    def finish(self, req: Any) -> None:
        """The request ended: drop what the drafter keeps for it (subclasses)."""

    def flush(self) -> None:
        """Forget what finished requests taught (the server's cache was flushed); running requests keep
        their own state."""
