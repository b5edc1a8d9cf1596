"""Suffix drafting (SuffixDecoding, Oliaro et al., NeurIPS 2025; vLLM / ArcticInference ``method: suffix``).

Two indices answer "what followed the longest suffix of this context before?": one per request over its
own prompt and output (agents copy their prompt: tool names, file paths, observations), and one global
over recent finished outputs, bounded by ``global_tokens`` (agents repeat their own answers: tool-call
JSON skeletons, field names). Occurrences from both are pooled; only the longest matches vote, so the most
frequent continuation is drafted first, for at most ``spec_factor x match length`` tokens.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

from radixrt.runtime.spec.base import DraftConfig, Drafter
from radixrt.runtime.spec.token_index import TokenIndex, draft_limit, vote_draft
from radixrt.runtime.spec.word_copy import WordCopy

CONTEXT_TAIL = 8  # prompt tokens kept before a global output, so its first tokens can be matched too


class SuffixDrafter(Drafter):
    """Per-request and global suffix indices (module doc). ``num_global_tokens`` tokens are held now.
    With a ``tokenizer``, where no suffix matches, the rest of a prompt word the output has begun in other
    tokens (word_copy.py)."""

    def __init__(self, cfg: DraftConfig, tokenizer: Any = None):
        super().__init__(cfg)
        self.words = WordCopy(tokenizer, cfg.min_token_prob) if tokenizer is not None else None
        self.local: dict[str, TokenIndex] = {}
        self.glob = TokenIndex()
        self._order: deque[int] = deque()
        self._next_sid = 0

    @property
    def num_global_tokens(self) -> int:
        return self.glob.num_tokens

    def _draft(self, req: Any, after: Sequence[int] = ()) -> list[int]:
        idx = self.local.get(req.rid)
        if idx is None:
            idx = self.local[req.rid] = TokenIndex()
        seq, n_in = idx.seqs.get(0), len(req.input_ids)
        have = 0 if seq is None else len(seq)
        if have and (have > n_in + len(req.output_ids) or seq[-1] != _token_at(req, have - 1)):
            idx = self.local[req.rid] = TokenIndex()  # the output was rewritten (jump-forward): index anew
            have = 0
        new = (req.input_ids[have:] + req.output_ids) if have < n_in else req.output_ids[have - n_in :]
        idx.extend(0, new)
        history = idx.seqs[0]
        if after:  # a match reads at most max_depth tokens back: copy only those
            history = history[-self.cfg.max_depth :] + list(after)
        occ = idx.matches(history, self.cfg.max_depth) + self.glob.matches(history, self.cfg.max_depth)
        if not occ:
            return self.words.draft(req, after) if self.words is not None else []
        best = max(m for _, _, m in occ)
        limit = draft_limit(best, self.cfg.spec_factor, self.cfg.num_draft_tokens)
        return vote_draft(occ, limit, self.cfg.min_token_prob)

    def flush(self) -> None:
        """Empty the global store of finished outputs."""
        self.glob, self._order = TokenIndex(), deque()

    def finish(self, req: Any) -> None:
        """Drop the request's own index; its output (after a few prompt tokens) joins the global store."""
        super().finish(req)
        self.local.pop(req.rid, None)
        if self.words is not None:
            self.words.finish(req.rid)
        if not req.output_ids or self.cfg.global_tokens <= 0:
            return
        sid, self._next_sid = self._next_sid, self._next_sid + 1
        self.glob.extend(sid, req.input_ids[-CONTEXT_TAIL:] + req.output_ids)
        self._order.append(sid)
        while self.glob.num_tokens > self.cfg.global_tokens and len(self._order) > 1:
            self.glob.remove(self._order.popleft())


def _token_at(req: Any, i: int) -> int:
    n_in = len(req.input_ids)
    return req.input_ids[i] if i < n_in else req.output_ids[i - n_in]
