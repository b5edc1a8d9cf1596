"""Prompt lookup decoding (vLLM ``ngram``, llama.cpp's draftless ``ngram`` modes; Saxena 2023).

The context's last ``n`` tokens (``n`` from ``ngram_max`` down to ``ngram_min``) are looked up earlier in the
request's own prompt and output; the tokens that followed the latest earlier occurrence are the draft.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from radixrt.runtime.spec.base import Drafter


def lookup(history: np.ndarray, n_max: int, n_min: int, k: int) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of ``history``'s last ``n`` tokens,
    for the largest ``n`` in ``[n_min, n_max]`` that occurs. ``history``: int64 ``[L]``. Returns [] if none."""
    L = len(history)
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        pat = history[L - n :]
        win = np.lib.stride_tricks.sliding_window_view(history[: L - 1], n)  # windows ending before the last token
        hits = np.flatnonzero((win == pat).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return history[start : start + k].tolist()
    return []


class NgramDrafter(Drafter):
    """Prompt lookup over the request's prompt + output (no state between steps but the adaptation)."""

    def _draft(self, req: Any, after: Sequence[int] = ()) -> list[int]:
        history = np.asarray(req.input_ids + req.output_ids + list(after), dtype=np.int64)
        return lookup(history, self.cfg.ngram_max, self.cfg.ngram_min, self.cfg.num_draft_tokens)
