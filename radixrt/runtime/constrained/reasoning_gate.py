"""A grammar that applies only after the model's reasoning ends (``</think>``).

A reasoning model first thinks in free text, then answers. Constraining the thinking would break it, so
the request's matcher is wrapped: until the output's last tokens equal the reasoning parser's end-marker
ids, every token is allowed and nothing reaches the inner matcher; from the token after the marker on,
the inner matcher masks and accepts as usual. (SGLang wraps grammars the same way for its reasoning
parsers.)
"""

from __future__ import annotations

import torch

from radixrt.runtime.constrained.base import GrammarMatcher


class ReasoningGate(GrammarMatcher):
    """Wraps ``inner``; opens once the accepted tokens end with ``end_ids`` (e.g. Qwen3's ``</think>`` id).

    Raises:
        ValueError: ``end_ids`` is empty.
    """

    def __init__(self, inner: GrammarMatcher, end_ids: list[int]):
        if not end_ids:
            raise ValueError("reasoning_end_ids must not be empty")
        self.inner, self.end_ids = inner, list(end_ids)
        self.tail: list[int] = []
        self.open = False

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        if self.open:
            self.inner.fill_next_token_bitmask(bitmask, row)
        else:
            bitmask[row].fill_(-1)  # all bits set: every token allowed while reasoning

    def accept_token(self, token_id: int) -> bool:
        if self.open:
            return self.inner.accept_token(token_id)
        self.tail = (self.tail + [token_id])[-len(self.end_ids) :]
        self.open = self.tail == self.end_ids
        return True

    def is_terminated(self) -> bool:
        return self.open and self.inner.is_terminated()

    def can_terminate(self) -> bool:
        return self.open and self.inner.can_terminate()

    def dead_end(self) -> str | None:
        return self.inner.dead_end() if self.open else None

    def batch_fill_matcher(self):
        return self.inner.batch_fill_matcher() if self.open else None
