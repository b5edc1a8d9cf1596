"""What a decode row drafts: the tokens its grammar forces, the drafter's proposal, or the forced tokens and
the drafter's proposal for the context after them; cut to the row's room and to what its grammar accepts.

    forced     llguidance's fast-forward tokens; where the grammar forces text but no certain token (the
               `"` opening a JSON string value, which the value's first characters could join in one token;
               xgrammar has no forced tokens), that text's own tokens: a draft need not be certain
    proposal   the drafter's (runtime/spec), for the request's context, or for it followed by the forced
               tokens: a JSON key is forced only up to where the free value begins (`,"city`), and the
               drafter's store knows how the model went on before (`":`, `"`, the value)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixrt.runtime.scheduler.request import Req


@dataclass
class Draft:
    """A row's draft: ``tokens``, of which the first ``certain`` are forced by its grammar (priced and
    tracked apart from the drafter's: spec/cost.py)."""

    tokens: list[int] = field(default_factory=list)
    certain: int = 0


class DraftMaker:
    """Assembles drafts for one scheduler (module doc).

    Args:
        drafter: a runtime/spec Drafter.
        outputs: the scheduler's OutputProcessor (``tokenizer``, ``eos_ids``, ``mask_prefetcher``).
        context_length: the longest prompt + output, in tokens.
        acceptance: the requests' acceptance record (spec/acceptance.py). With ``adaptive`` the cost model
            chooses the length later (the drafter's whole proposal here); else the proposal is cut to the
            share the record's fixed rule gives (``Acceptance.fixed_scale``).
    """

    def __init__(self, drafter, outputs, context_length: int, adaptive: bool, acceptance=None):
        self.drafter, self.outputs = drafter, outputs
        self.context_length, self.adaptive = context_length, adaptive
        self.acceptance = acceptance

    def room(self, req: Req, req_pages, budget: int, n: int = 1) -> int:
        """The most draft tokens ``req`` may carry this step after its ``n`` scheduled tokens (0: none: opted
        out, or constrained with its matcher on the mask-prefetch thread)."""
        if not req.params.speculative or (req.grammar is not None and self.outputs.mask_prefetcher is not None):
            return 0
        room = min(req.max_new_tokens - len(req.output_ids), self.context_length - req.seq_len) - 1
        fit = (len(req.page_table) + req_pages.allocator.num_free) * req_pages.P - req.num_computed - n
        return max(0, min(room, fit, budget, self.drafter.cfg.num_draft_tokens))

    def forced(self, req: Req, room: int) -> list[int]:
        """The tokens ``req``'s grammar forces next (module doc), cut to ``room`` and to what it accepts."""
        if room <= 0 or req.grammar is None:
            return []
        toks = req.grammar.forced_tokens()
        if not toks:
            text = req.grammar.find_jump_forward_string()
            toks = self.outputs.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        return self._legal(req, [], toks[:room])

    def continued(self, req: Req, req_pages, budget: int, n: int, forced: list[int]) -> Draft:
        """The drafter's proposal where it is longer than ``forced`` and starts with them; else ``forced``
        followed by the drafter's proposal after them; ``forced`` count as certain where they lead."""
        draft = self.proposal(req, req_pages, budget, n)
        if len(draft) > len(forced) and draft[: len(forced)] == forced:
            return Draft(draft, len(forced))
        if not forced:
            return Draft(draft)
        return Draft(forced + self.proposal(req, req_pages, budget, n, forced), len(forced))

    def proposal(self, req: Req, req_pages, budget: int, n: int = 1, after: list[int] = ()) -> list[int]:
        """The drafter's proposal for ``req``'s next tokens after ``after`` (which its grammar accepts),
        cut to the room left and to what the grammar accepts."""
        k = self.room(req, req_pages, budget, n) - len(after)
        if k <= 0:
            return []
        scale = 1.0 if self.adaptive else self.acceptance.fixed_scale(req.rid)
        if scale is None:  # a low-acceptance request's step without drafts
            return []
        return self._legal(req, list(after), self.drafter.draft(req, after, scale)[:k])

    def _legal(self, req: Req, after: list[int], draft: list[int]) -> list[int]:
        if not draft or req.grammar is None:
            return draft
        ends = self.outputs.eos_ids | set(req.params.stop_token_ids)
        return grammar_prefix(req.grammar, after + draft, ends)[len(after) :]


def forced_key(rid: str) -> str:
    """The acceptance track of a request's grammar-forced drafts (apart from its drafter's)."""
    return rid + "\x00forced"


def grammar_prefix(matcher, draft: list[int], end_ids: set[int] = frozenset()) -> list[int]:
    """The longest prefix of ``draft`` the grammar accepts from its current state (the matcher is rolled
    back to where it was). An end token (``end_ids``: EOS, stop ids) ends the prefix unchecked: it finishes
    the request, the verification's mask decides whether it is legal, and it is never fed to the matcher here,
    because llguidance does not count an EOS that follows a completed grammar in its rollback history.
    Matchers without rollback (``supports_rollback`` False: the reasoning gate) keep the whole draft: the
    verification samples under the grammar mask, so an illegal draft token is rejected there anyway."""
    if not matcher.supports_rollback:
        return draft
    if matcher.is_terminated():
        return []
    n = keep = 0
    for t in draft:
        if t in end_ids:
            keep = n + 1
            break
        if not matcher.accept_token(t):
            break
        n += 1
    if n:
        matcher.rollback(n)
    return draft[: max(n, keep)]
