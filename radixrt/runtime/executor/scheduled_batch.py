"""ScheduledBatch: the one message from ``Scheduler.schedule`` (who runs) to ``ModelRunner.prepare`` (how).

It lives beside the runner, not the scheduler, because the executor layer may not import the scheduler's;
the scheduler fills it, the runner only reads it (vLLM's ``SchedulerOutput``, nano-vllm's ``seqs`` list).

Ownership: the requests stay the scheduler's; a ScheduledBatch only names them for one step and is dropped
after the step concludes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from radixrt.runtime.scheduler.request import Req


@dataclass
class ScheduledBatch:
    """One step's work, rows in the order their tokens are packed.

    Order: running decodes (oldest arrival first), then the next chunks of running extends, then the
    requests admitted this step. Iterating yields ``(req, num_new_tokens)`` pairs in that order.
    """

    # the step's requests; the step computes tokens [req.num_computed, req.num_computed + n) of req.fill_ids
    reqs: list["Req"] = field(default_factory=list)
    # per request, in step order: tokens computed this step (1 for a decode; a prefill chunk's length,
    # at most --chunked-prefill-size, for an extend; the forced tokens for a jump-forward extend)
    num_new_tokens: list[int] = field(default_factory=list)

    def add(self, req: "Req", n: int) -> None:
        """Append ``req`` computing ``n`` tokens (``n >= 1``)."""
        self.reqs.append(req)
        self.num_new_tokens.append(n)

    def __iter__(self) -> Iterator[tuple["Req", int]]:
        return iter(zip(self.reqs, self.num_new_tokens))

    def __len__(self) -> int:
        return len(self.reqs)

    @property
    def num_tokens(self) -> int:
        """Tokens computed this step (the budget ``--max-num-batched-tokens`` bounds)."""
        return sum(self.num_new_tokens)
