"""Filling the grammar rows' masks: all rows in one parallel call, and ahead of time, off the critical path.

The mask of step t+1 depends only on the tokens accepted up to step t. So once a step's tokens are accepted
(and jump-forward is done), :class:`MaskPrefetcher` fills the next masks on a worker thread while the
scheduler builds and runs the next forward; the next sample step takes the rows that are still current
(the request's output length unchanged) and fills only the others. SGLang overlaps the fill with the
forward the same way.

:func:`fill_rows` hands every llguidance matcher of a batch to one ``LLExecutor`` call, which fills the rows
in parallel on Rust threads without the GIL (``llguidance.torch.fill_next_token_bitmask_par``); matchers of
the other backends fill one row each. Matchers are not thread-safe: while a prefetch runs, the scheduler
must not call them; :meth:`MaskPrefetcher.collect` (which ``build_grammar_mask`` calls first) waits for it.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Sequence

from .base import allocate_token_bitmask

if TYPE_CHECKING:  # imported where a mask is filled: the HTTP process compiles grammars without torch
    import torch

_EXECUTOR = None


def load_executor():
    """The process's one ``llguidance.LLExecutor`` (up to 8 Rust threads), made on first use."""
    global _EXECUTOR
    if _EXECUTOR is None:
        import llguidance

        _EXECUTOR = llguidance.LLExecutor(num_threads=max(1, min(8, os.cpu_count() or 1)))
    return _EXECUTOR


def fill_rows(todo: Sequence[tuple[Any, int]], bitmask: torch.Tensor) -> None:
    """Fill ``bitmask[row]`` from ``matcher`` for each ``(matcher, row)`` of ``todo``.

    Args:
        bitmask: int32 ``[batch, ceil(vocab/32)]``, CPU, contiguous.
    """
    batched = []
    for m, row in todo:
        ll = m.batch_fill_matcher()
        if ll is None:
            m.fill_next_token_bitmask(bitmask, row)
        else:
            batched.append((ll, row))
    if len(batched) == 1:
        row = bitmask[batched[0][1]]
        batched[0][0].unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * 4)
    elif batched:
        load_executor().unsafe_compute_mask_ptr(batched, bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0])


class MaskPrefetcher:
    """Fills the next step's masks on one worker thread (see the module doc). Used by the scheduler thread only.

    Attributes:
        bitmask: the rows of the last prefetch (valid after :meth:`collect`).
    """

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")
        self._pending: Future | None = None
        self._index: dict[int, tuple[int, int]] = {}
        self._keep: list = []
        import torch

        self.bitmask = torch.empty(0, 0, dtype=torch.int32)
        self.prefetched = 0  # rows filled ahead so far
        self.used = 0  # of those, rows a sample step took

    def start(self, reqs: Sequence[Any], vocab_size: int) -> None:
        """Begin filling the masks of the constrained, unfinished ``reqs`` (their matchers now belong to the
        worker until :meth:`collect`)."""
        self.collect()
        todo = [r for r in reqs if r.grammar is not None and not r.grammar.is_terminated()]
        if not todo:
            return
        self.bitmask = allocate_token_bitmask(len(todo), vocab_size)
        # keyed by the matcher object (kept alive in _keep, so its id is not reused) and the output length
        self._index = {id(r.grammar): (j, len(r.output_ids)) for j, r in enumerate(todo)}
        self._keep = [r.grammar for r in todo]
        self.prefetched += len(todo)
        self._pending = self._pool.submit(fill_rows, [(m, j) for j, m in enumerate(self._keep)], self.bitmask)

    def collect(self) -> dict[int, tuple[int, int]]:
        """Wait for the running prefetch; returns ``{id(matcher): (row, output length when filled)}`` once
        (later calls return {} until the next :meth:`start`)."""
        if self._pending is None:
            return {}
        fut, self._pending = self._pending, None
        fut.result()  # a matcher error surfaces here, on the scheduler thread
        index, self._index, self._keep = self._index, {}, []
        return index

    def shutdown(self) -> None:
        self.collect()
        self._pool.shutdown(wait=True)
