"""Verification of a step's draft rows (scheduler/spec_step.py's module doc has the acceptance rule).

Position ``j`` of a row is sampled as a plain decode step would sample that request's next token, after the
tokens accepted before it were appended. Rows of :func:`plain_greedy` requests take one argmax over all
their positions (the sampler would pick the same token: nothing changes their logits); any other row goes
position by position through the OutputProcessor's sampler (penalties, grammar masks, generators).
"""

from __future__ import annotations

import torch

from radixrt.kernels import fused
from radixrt.runtime.executor.scheduled_batch import Row
from radixrt.runtime.io_struct import FinishLength, FinishReason
from radixrt.runtime.scheduler.request import Req


def verify_rows(outputs, logits, verify_at: list[tuple[Row, int]]) -> tuple[list, dict[int, int], dict[int, int]]:
    """Sample the draft rows ``verify_at`` (``(row, first logits row)``; rows ``first .. first + k`` score
    its last ``1 + k`` positions, ``k = len(row.drafts)``) and append the tokens kept to each request.

    Returns ``(finished, sampled, accepted)``: ``(req, finished_reason)`` of the requests that finished,
    and per ``id(req)`` the positions sampled (tokens appended, or 1 when the request was already at its
    length limit) and the draft tokens kept.
    """
    plain = [(r, at) for r, at in verify_at if plain_greedy(r.req)]
    sampled: dict[int, int] = {}
    accepted: dict[int, int] = {}
    finished = verify_greedy(outputs, logits, plain, sampled, accepted) if plain else []
    if len(plain) < len(verify_at):
        fast = {id(r) for r, _ in plain}
        rest = [(r, at) for r, at in verify_at if id(r) not in fast]
        finished += verify_levels(outputs, logits, rest, sampled, accepted)
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


def verify_greedy(outputs, logits, rows: list[tuple[Row, int]], sampled: dict, accepted: dict) -> list:
    """Rows of :func:`plain_greedy` requests: every position's argmax in one call, then each row's
    tokens appended up to the first mismatch, with the finish checks of a plain step after each (the
    sampler would take the same argmax: nothing changes these rows' logits)."""
    at = [first + j for r, first in rows for j in range(len(r.drafts) + 1)]
    am = fused.argmax(logits[torch.tensor(at)]).tolist()
    finished, off = [], 0
    for row, _ in rows:
        req, draft, n, a = row.req, row.drafts, 0, 0
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


def verify_levels(outputs, logits, verify_at: list[tuple[Row, int]], sampled: dict, accepted: dict) -> list:
    """Any request: one sampler call per draft position over the rows still accepting."""
    finished: list[tuple[Req, FinishReason]] = []
    level, j = list(verify_at), 0
    for r, _ in verify_at:
        sampled[id(r.req)] = accepted[id(r.req)] = 0
    while level:
        before = {id(r.req): len(r.req.output_ids) for r, _ in level}
        fin = outputs.sample(logits, [(r.req, first + j) for r, first in level])
        finished += fin
        done = {id(r) for r, _ in fin}
        nxt = []
        for row, first in level:
            req, draft = row.req, row.drafts
            sampled[id(req)] += 1
            hit = j < len(draft) and len(req.output_ids) == before[id(req)] + 1 and req.output_ids[-1] == draft[j]
            accepted[id(req)] += hit
            if hit and id(req) not in done:
                nxt.append((row, first))
        level, j = nxt, j + 1
    return finished
