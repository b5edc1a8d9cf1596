"""Verification of a step's draft rows (scheduler/spec_step.py's module doc has the acceptance rule).

Position ``j`` of a row is sampled as a plain decode step would sample that request's next token, after the
tokens accepted before it were appended. Rows of :func:`plain_greedy` requests take one argmax over all
their positions (the sampler would pick the same token: nothing changes their logits); any other row goes
position by position through the OutputProcessor's sampler (penalties, grammar masks, generators).
"""

from __future__ import annotations

import torch

from radixrt.runtime.io_struct import FinishLength, FinishReason
from radixrt.kernels import fused
from radixrt.runtime.scheduler.request import Req


def verify_rows(outputs, logits, spec_at: list[tuple[Req, int]]) -> tuple[list, dict[int, int], dict[int, int]]:
    """Sample the draft rows ``spec_at`` (``(req, first logits row)``; rows ``first .. first + k`` score
    its ``1 + k`` positions) and append the tokens kept.

    Returns ``(finished, sampled, accepted)``: ``(req, finished_reason)`` of the requests that finished,
    and per ``id(req)`` the positions sampled (tokens appended, or 1 when the request was already at its
    length limit) and the draft tokens kept.
    """
    plain = [(r, row) for r, row in spec_at if plain_greedy(r)]
    sampled: dict[int, int] = {}
    accepted: dict[int, int] = {}
    finished = verify_greedy(outputs, logits, plain, sampled, accepted) if plain else []
    if len(plain) < len(spec_at):
        fast = {id(r) for r, _ in plain}
        finished += verify_levels(outputs, logits, [(r, w) for r, w in spec_at if id(r) not in fast], sampled, accepted)
    return finished, sampled, accepted


def plain_greedy(req: Req) -> bool:
    """Greedy with nothing that changes its logits or needs more than the token: no penalties, logit bias,
    grammar, logprobs, nor tokens blocked below ``min_new_tokens`` (the sampler's argmax is the token)."""
    p = req.params
    return (
        p.temperature == 0.0
        and req.grammar is None
        and not req.return_logprob
        and not p.logit_bias
        and not p.frequency_penalty
        and not p.presence_penalty
        and p.repetition_penalty == 1.0
        and len(req.output_ids) >= p.min_new_tokens
    )


def verify_greedy(outputs, logits, rows: list[tuple[Req, int]], sampled: dict, accepted: dict) -> list:
    """Rows of :func:`plain_greedy` requests: every position's argmax in one call, then each row's
    tokens appended up to the first mismatch, with the finish checks of a plain step after each (the
    sampler would take the same argmax: nothing changes these rows' logits)."""
    at = [row + j for r, row in rows for j in range(len(r.draft_ids) + 1)]
    am = fused.argmax(logits[torch.tensor(at)]).tolist()
    finished, off = [], 0
    for req, _ in rows:
        draft, n, a = req.draft_ids, 0, 0
        if len(req.output_ids) >= req.max_new_tokens:
            finished.append((req, FinishLength(req.max_new_tokens)))
            n = 1
        else:
            for j in range(len(draft) + 1):
                tok = am[off + j]
                req.output_ids.append(tok)
                n += 1
                hit = j < len(draft) and tok == draft[j]
                a += hit
                reason = outputs.check_finished(req, tok)
                if reason is not None:
                    finished.append((req, reason))
                    break
                if not hit:
                    break
        sampled[id(req)], accepted[id(req)] = n, a
        off += len(draft) + 1
    return finished


def verify_levels(outputs, logits, spec_at: list[tuple[Req, int]], sampled: dict, accepted: dict) -> list:
    """Any request: one sampler call per draft position over the rows still accepting."""
    finished: list[tuple[Req, FinishReason]] = []
    level, j = list(spec_at), 0
    for r, _ in spec_at:
        sampled[id(r)] = accepted[id(r)] = 0
    while level:
        before = {id(r): len(r.output_ids) for r, _ in level}
        fin = outputs.sample(logits, [(r, row + j) for r, row in level])
        finished += fin
        done = {id(r) for r, _ in fin}
        nxt = []
        for req, row in level:
            sampled[id(req)] += 1
            hit = (
                j < len(req.draft_ids)
                and len(req.output_ids) == before[id(req)] + 1
                and req.output_ids[-1] == req.draft_ids[j]
            )
            accepted[id(req)] += hit
            if hit and id(req) not in done:
                nxt.append((req, row))
        level, j = nxt, j + 1
    return finished
