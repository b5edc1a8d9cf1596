"""The grammar's two moments in a decode step: mask the logits before sampling, advance after it.

    mask = build_grammar_mask(reqs, vocab_size)     # None when no request is constrained
    sample(logits, rows, mask)                      # the sampler calls mask.apply_(logits)
    advance_matchers(reqs, tokens)                  # each matcher accepts its request's token

``reqs`` are the sampled requests in logits-row order; a request is constrained when ``req.grammar`` is a
:class:`~radixrt.runtime.constrained.base.GrammarMatcher`. Unconstrained rows pay nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from .base import allocate_token_bitmask, apply_token_bitmask_, load_cpu_kernel
from .mask_fill import MaskPrefetcher, fill_rows, load_executor

if TYPE_CHECKING:  # torch loads where masks are made (the scheduler), not in the HTTP process's warm-up
    import torch


@dataclass
class GrammarMask:
    """The allowed-token bits of this step's constrained rows.

    Attributes:
        rows: indices of the constrained rows in the sampled logits ``[B, vocab]``.
        bitmask: int32 ``[len(rows), ceil(vocab/32)]`` on CPU; bit ``t`` of row ``j`` allows token ``t``
            for logits row ``rows[j]``.
        all_rows: True when every one of the B rows is constrained (masked in place, no row copy).
    """

    rows: list[int]
    bitmask: torch.Tensor
    all_rows: bool

    def apply_(self, logits: torch.Tensor) -> None:
        """Set grammar-illegal tokens of the constrained rows of fp32 ``logits [B, vocab]`` to -inf."""
        if self.all_rows:
            apply_token_bitmask_(logits, self.bitmask)
            return
        sub = logits[self.rows]
        apply_token_bitmask_(sub, self.bitmask)
        logits[self.rows] = sub


def build_grammar_mask(
    reqs: Sequence[Any], vocab_size: int, prefetch: "MaskPrefetcher | None" = None
) -> GrammarMask | None:
    """Every constrained request's next-token bits (matcher states are unchanged).

    Args:
        reqs: the B requests being sampled, in logits-row order.
        vocab_size: the logits width in tokens.
        prefetch: rows filled ahead (while the forward ran) are taken from it when still current.

    Returns:
        The mask, or None when no request has a grammar.
    """
    ready = prefetch.collect() if prefetch is not None else {}
    rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
    if not rows:
        return None
    bitmask = allocate_token_bitmask(len(rows), vocab_size)
    todo, src, dst = [], [], []
    for j, i in enumerate(rows):
        hit = ready.get(id(reqs[i].grammar))
        if hit is not None and hit[1] == len(reqs[i].output_ids):
            src.append(hit[0])
            dst.append(j)
        else:
            todo.append((reqs[i].grammar, j))
    if src:
        bitmask[dst] = prefetch.bitmask[src]  # one copy for all prefetched rows
        prefetch.used += len(src)
    fill_rows(todo, bitmask)
    return GrammarMask(rows, bitmask, len(rows) == len(reqs))


def advance_matchers(reqs: Sequence[Any], tokens: Sequence[int]) -> None:
    """Feed each constrained request the token just sampled for it (``tokens[i]`` for ``reqs[i]``).

    The mask allowed only legal tokens, so ``accept_token`` succeeds; once EOS is accepted the matcher
    reports ``is_terminated()``, which the finish check reads.
    """
    for req, tok in zip(reqs, tokens):
        if req.grammar is not None:
            req.grammar.accept_token(tok)


_WARM_SCHEMA = '{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}'


def warm_up(backend: Any, masks: bool = True) -> None:
    """Do once, at start-up, what the first constrained request would otherwise pay while it (and, in the
    scheduler, every request of its batch) waits: one compile of a small schema (``jsonschema``'s lazy
    imports, the backend's first-grammar set-up) and, with ``masks``, one mask fill and apply: xgrammar's CPU
    bitmask kernel (a slow import) and llguidance's fill thread pool (docs/measurements.md: what the first
    request paid without it)."""
    matcher = backend.compile("json_schema", _WARM_SCHEMA).matcher()
    if not masks:
        return
    load_cpu_kernel()
    if backend.name == "llguidance":
        load_executor()
    bitmask = allocate_token_bitmask(1, backend.vocab_size)
    fill_rows([(matcher, 0)], bitmask)
    import torch

    apply_token_bitmask_(torch.zeros(1, backend.vocab_size), bitmask)


def make_matcher(compiled: Any, reasoning_end_ids: Sequence[int] = ()) -> Any:
    """A fresh matcher of a compiled grammar. With ``reasoning_end_ids`` (a reasoning parser's end marker) the
    grammar constrains only the answer: it applies once the output holds those ids."""
    matcher = compiled.matcher()
    if reasoning_end_ids:
        from radixrt.runtime.constrained.reasoning_gate import ReasoningGate

        matcher = ReasoningGate(matcher, list(reasoning_end_ids))
    return matcher
