"""An occurrence index over token sequences: where each ``key_len``-gram occurred, and how far back each
occurrence matches the current context (the suffix match of SuffixDecoding, Oliaro et al., NeurIPS 2025).

SuffixDecoding keeps suffix trees; here the same queries are answered from a hash of short n-grams to their
latest occurrences, extended backwards to the true match length (at most ``max_depth``), which costs one
dict append per token indexed and keeps memory linear in the tokens held.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Sequence

Occurrence = tuple[list[int], int, int]  # (sequence, position after the match, match length)


class TokenIndex:
    """Sequences by id and where each ``key_len``-gram occurs in them (the latest ``max_occ`` per key).

    Removing a sequence leaves its index entries behind, skipped when read and dropped by a rebuild once
    they outnumber the live ones.
    """

    def __init__(self, key_len: int = 2, max_occ: int = 32):
        self.key_len, self.max_occ = key_len, max_occ
        self.seqs: dict[int, list[int]] = {}
        self.index: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        self.num_tokens = 0
        self._stale = 0

    def extend(self, sid: int, tokens: Iterable[int]) -> None:
        """Append ``tokens`` to sequence ``sid`` (created when new) and index the n-grams they complete."""
        seq = self.seqs.setdefault(sid, [])
        K, start = self.key_len, len(seq)
        seq.extend(tokens)
        self.num_tokens += len(seq) - start
        for end in range(max(start, K), len(seq) + 1):  # the K-gram seq[end-K:end], continued at seq[end]
            occ = self.index.setdefault(tuple(seq[end - K : end]), [])
            occ.append((sid, end))
            if len(occ) > 2 * self.max_occ:
                del occ[: len(occ) - self.max_occ]

    def remove(self, sid: int) -> None:
        seq = self.seqs.pop(sid, None)
        if seq is None:
            return
        self.num_tokens -= len(seq)
        self._stale += len(seq)
        if self._stale > self.num_tokens:
            self._rebuild()

    def _rebuild(self) -> None:
        seqs, self.seqs, self.index, self.num_tokens, self._stale = self.seqs, {}, {}, 0, 0
        for sid, seq in seqs.items():
            self.extend(sid, seq)

    def matches(self, history: Sequence[int], max_depth: int, exclude_end_of: int | None = None) -> list[Occurrence]:
        """Earlier occurrences of ``history``'s last ``key_len`` tokens that have a continuation, each with
        how many of ``history``'s last tokens it matches (``key_len`` to ``max_depth``)."""
        K, L = self.key_len, len(history)
        if L < K:
            return []
        out = []
        for sid, pos in self.index.get(tuple(history[L - K :]), ()):
            seq = self.seqs.get(sid)
            if seq is None or pos >= len(seq):  # removed, or the context's own end (nothing follows yet)
                continue
            m = K
            while m < max_depth and pos - m - 1 >= 0 and m < L and seq[pos - m - 1] == history[L - m - 1]:
                m += 1
            out.append((seq, pos, m))
        return out


def vote_draft(occ: list[Occurrence], limit: int, min_prob: float) -> list[int]:
    """Walk the continuations of the longest-matching occurrences, most frequent token first.

    At each step the token that follows most of the surviving occurrences is drafted and the others drop
    out; the running product of those frequencies estimates the chance the whole draft is accepted, and the
    walk stops below ``min_prob`` (SuffixDecoding's ``min_token_prob``) or at ``limit`` tokens.
    """
    if not occ or limit <= 0:
        return []
    best = max(m for _, _, m in occ)
    alive = [(seq, pos) for seq, pos, m in occ if m == best]
    out: list[int] = []
    prob = 1.0
    while len(out) < limit and alive:
        i = len(out)
        counts = Counter(seq[pos + i] for seq, pos in alive if pos + i < len(seq))
        if not counts:
            break
        tok, c = counts.most_common(1)[0]
        prob *= c / len(alive)
        if prob < min_prob:
            break
        out.append(tok)
        alive = [(seq, pos) for seq, pos in alive if pos + i < len(seq) and seq[pos + i] == tok]
    return out


def draft_limit(match_len: int, factor: float, cap: int) -> int:
    """SuffixDecoding's rule: at most ``factor x match_len`` draft tokens, and never more than ``cap``."""
    return min(cap, math.ceil(factor * match_len))
