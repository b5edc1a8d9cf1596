"""Speculation as one step hook: the scheduler calls it at two points of a step and knows nothing else of it.

    schedule()  rows: decodes, extend chunks, admissions
                Speculator.propose(batch, req_pages, budget)     drafts into rows (row.drafts; row.n counts them once)
    prepare(), forward()
                Speculator.accept(batch, fb, logits, finished) -> keep    tokens each row keeps
    process_batch_result: advance each request by keep; ReqPages.trim where keep < n (rejected drafts)

The default :class:`Speculator` proposes nothing and keeps every row whole, so the step has one shape with
speculation on or off. ``spec_step.make_speculator`` returns it for ``--speculative-algorithm none`` and
under ``--tp`` (the ranks' lockstep carries no drafts), else a ``DraftSpeculator`` (spec_step.py), whose
step times come from the scheduler's ``StepStats`` and whose per-request state ends with the requests it
saw.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from radixrt.runtime.executor.scheduled_batch import ScheduledBatch

if TYPE_CHECKING:
    import torch

    from radixrt.runtime.executor.forward_batch import ForwardBatch
    from radixrt.runtime.io_struct import FinishReason
    from radixrt.runtime.mem.req_pages import ReqPages
    from radixrt.runtime.scheduler.request import Req


@dataclass
class SpecCounts:
    """What speculation did so far (``get_server_info``'s ``cache.speculative``, ``/metrics``)."""

    verify_steps: int = 0  # request-steps that verified drafts
    draft_tokens: int = 0  # draft tokens proposed and verified
    accepted_tokens: int = 0  # of those, kept
    emitted_tokens: int = 0  # tokens those request-steps produced (accepted + one sampled each)
    forced_draft_tokens: int = 0  # of the draft tokens, those a grammar forced (jump-forward drafts)
    forced_accepted_tokens: int = 0  # of those, kept


class Speculator:
    """The hook's contract, and the default: no drafts.

    Attributes:
        algorithm: the drafter's name (``none`` here), reported in :meth:`stats`.
        counts: the :class:`SpecCounts` (all 0 here).
    """

    algorithm = "none"

    def __init__(self):
        self.counts = SpecCounts()

    def propose(self, batch: ScheduledBatch, req_pages: ReqPages, budget: int) -> None:
        """Add draft tokens to rows of ``batch`` (``Row.add_drafts``), growing their pages through ``req_pages``
        from free pages only (drafts never evict nor preempt), at most ``budget`` tokens in all. Called once
        per step, after the rows are scheduled and before the batch is prepared."""

    def accept(
        self, batch: ScheduledBatch, fb: ForwardBatch, logits: torch.Tensor, finished: list[tuple[Req, FinishReason]]
    ) -> list[int]:
        """After the forward (``logits``: fp32 ``[len(fb.logit_rows), vocab]``): verify the rows with drafts
        (``fb.verify_at``), append their kept tokens to their requests, and add the requests that finished
        to ``finished``. Returns, per row of ``batch``, the tokens of its ``n`` whose KV stays: ``n`` for a
        row without drafts; for one with ``k`` drafts of which ``a`` were kept, ``n - k + a`` (one fewer
        when a kept draft finished the request)."""
        return [row.n for row in batch]

    def stats(self) -> dict:
        """``accept_rate``: accepted over proposed draft tokens; ``accept_length``: tokens per verifying
        request-step (accepted + 1; SGLang's ``spec_accept_length``); the :class:`SpecCounts`."""
        c = asdict(self.counts)
        return {
            "algorithm": self.algorithm,
            **c,
            "accept_rate": c["accepted_tokens"] / c["draft_tokens"] if c["draft_tokens"] else 0.0,
            "accept_length": c["emitted_tokens"] / c["verify_steps"] if c["verify_steps"] else 0.0,
        }
