"""ScheduledBatch: the one message from ``Scheduler.schedule`` (who runs) to ``ModelRunner.prepare`` (how).

It lives beside the runner, not the scheduler, because the executor layer may not import the scheduler's;
the scheduler fills it, the runner only reads it (vLLM's ``SchedulerOutput``, nano-vllm's ``seqs`` list).

Ownership: the requests stay the scheduler's; a ScheduledBatch only names them for one step and is dropped
after the step concludes. The row contract (which tokens a row packs, which logits come back) is drawn as
a table in docs/DESIGN.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from radixrt.runtime.scheduler.request import Req


@dataclass(eq=False)
class Row:
    """One request's part of a step: ``n`` tokens packed, the last ``len(drafts)`` of them draft tokens.

    With ``s = req.num_computed``, the row packs ``req.fill_ids[s : s + num_fill]`` then ``drafts``, at
    positions ``s .. s + n - 1``. ``n`` counts each draft once; the drafts live here only, for this step.
    """

    req: "Req"
    n: int  # tokens packed this step, drafts included (>= 1)
    drafts: list[int] = field(default_factory=list)  # filled by Speculator.propose, verified by its accept

    @property
    def num_fill(self) -> int:
        """Tokens of ``req.fill_ids`` the row computes (1 for a decode, a chunk's length for an extend)."""
        return self.n - len(self.drafts)

    def add_drafts(self, drafts: list[int]) -> None:
        """Append ``drafts`` after the row's tokens (their pages already grown)."""
        self.drafts = self.drafts + list(drafts)
        self.n += len(drafts)


@dataclass
class ScheduledBatch:
    """One step's work, rows in the order their tokens are packed.

    Order: running decodes (oldest arrival first), then the next chunks of running extends, then the
    requests admitted this step. Iterating yields the :class:`Row` s in that order.
    """

    rows: list[Row] = field(default_factory=list)

    def add(self, req: "Req", n: int) -> Row:
        """Append ``req`` computing ``n`` tokens of its ``fill_ids`` (``n >= 1``)."""
        row = Row(req, n)
        self.rows.append(row)
        return row

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def reqs(self) -> list["Req"]:
        return [r.req for r in self.rows]

    @property
    def num_tokens(self) -> int:
        """Tokens computed this step, drafts included (the budget ``--max-num-batched-tokens`` bounds)."""
        return sum(r.n for r in self.rows)
