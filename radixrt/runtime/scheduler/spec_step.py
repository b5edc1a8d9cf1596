"""Speculative decoding in the batched step (the Speculator hook of speculator.py, with a drafter).

    propose(batch, req_pages, budget)   after the rows are scheduled: each decode row, then each row whose chunk
                                  ends its prompt, carries k drafts after its tokens (runtime/spec/: suffix or
                                  ngram drafter; spec_drafts.py: the grammar's forced tokens)
    prepare()                     such a row is an extend row (causal inside the row) with logits at its last
                                  1 + k positions
    accept(batch, fb, logits, finished)  verification (spec_verify.py): the tokens kept are appended; returns
                                  the tokens of each row whose KV stays, and the scheduler trims the rest

Verification samples position ``j`` of a row exactly as a plain decode step would sample that request's
next token (penalties, grammar mask, temperature, top-k/p, its own generator), after the tokens accepted
before it were appended and fed to its grammar matcher; the draft token ``d_j`` is kept iff the sampled
token equals it, and the first mismatch (or the token after the last draft) is the step's last token.
At temperature 0 that is greedy acceptance. Above 0 it is the speculative-sampling rule of Leviathan et al.
(ICML 2023) and Chen et al. (2023) for a draft distribution q that is a point mass on ``d_j`` (draftless
drafters propose one token): accept with probability ``min(1, p(d)/q(d)) = p(d)``, else sample from the
residual ``max(0, p - q)`` normalized, which is ``p`` without ``d``. Sampling ``x ~ p`` and keeping ``d`` iff
``x == d`` realizes exactly that: ``P(x = d) = p(d)``, and given ``x != d``, ``x`` follows the residual. Each
output token consumes the request's generator as one plain decode step does, so a seeded request gives the
same tokens with speculation on and off, and every finish check (stop ids, stop strings, max_new_tokens,
grammar termination) runs after each token, so nothing overshoots.

Rollback: the rejected drafts' KV slots lie past ``num_computed`` and are overwritten by later steps before
they are read; their pages beyond the next token's go back at once (``ReqPages.trim``), and the radix tree
only ever inserts ``fill_ids[:num_computed]``, which holds accepted tokens only.

How long a row's draft is: the cost model (spec/cost.py, ``--speculative-adaptive``) or the fixed rule
(``--no-speculative-adaptive``), both reading one acceptance record (spec/acceptance.py).
"""

from __future__ import annotations

import logging
import time

from radixrt.runtime.executor.scheduled_batch import Row, ScheduledBatch
from radixrt.runtime.scheduler.spec_drafts import Draft, DraftMaker, forced_key
from radixrt.runtime.scheduler.spec_verify import verify_rows
from radixrt.runtime.scheduler.speculator import Speculator
from radixrt.runtime.spec import DraftConfig, make_drafter, resolve_algorithm
from radixrt.runtime.spec.acceptance import Acceptance
from radixrt.runtime.spec.cost import StepTimes, choose_drafts

REFRESH_EVERY = 32  # one drafting step in this many runs without drafts, to keep t(T0) measured


class DraftSpeculator(Speculator):
    """Speculation with a drafter (module doc); built by ``speculator.make_speculator``.

    Args:
        args: ServerArgs (``speculative_max_batch_size``, ``speculative_adaptive``).
        algorithm: the drafter's name (reported in ``stats``).
        drafter: a runtime/spec Drafter.
        outputs: the scheduler's OutputProcessor, whose ``sample`` verifies each position.
        context_length: the longest prompt + output, in tokens.
        steps: the scheduler's StepStats; each step's tokens and seconds refine the step-time curve.
    """

    def __init__(self, args, algorithm: str, drafter, outputs, context_length: int, steps):
        super().__init__()
        self.algorithm, self.drafter, self.outputs, self.steps = algorithm, drafter, outputs, steps
        self.max_batch = args.speculative_max_batch_size or None
        self.adaptive = args.speculative_adaptive
        self.times = StepTimes()  # t(T), set by calibrate() and refined by every step
        self.acceptance = Acceptance()
        self.drafts = DraftMaker(drafter, outputs, context_length, self.adaptive, self.acceptance)
        self._drafting_steps = 0
        self._certain: dict[int, int] = {}  # this step's rows whose draft begins with forced tokens: how many
        self._seen_steps = 0  # StepStats.steps when the curve last took a sample
        self._flushes = 0  # ReqPages.flushes when the drafter's store was last emptied
        self._live: dict[int, object] = {}  # requests the drafter may hold state for, by id

    def calibrate(self, runner, allocator) -> None:
        """Measure the step-time curve the cost model starts from (scheduler/spec_calibrate.py)."""
        if not self.adaptive:
            return
        from radixrt.runtime.scheduler.spec_calibrate import measure_step_times

        t0 = time.perf_counter()
        self.times = measure_step_times(runner, allocator)
        logging.getLogger(__name__).info(
            "speculation %s: step times of %d sizes measured in %.2f s (--speculative-algorithm none skips this)",
            self.algorithm,
            len(self.times),
            time.perf_counter() - t0,
        )

    # ---- propose -----------------------------------------------------------------------------------
    def propose(self, batch: ScheduledBatch, req_pages, budget: int) -> None:
        """Drafts on the decode rows, then after the prompts that end this step (module doc). A chunk that
        ends its prompt samples the first output token at its last position, so drafts appended to it are
        verified by the same forward; not for requests that want prompt logprobs. Each phase's cost model
        sees the whole step; every row that samples counts once in its output."""
        self._catch_up(req_pages)
        self._certain = {}
        for row in batch:
            self._live[id(row.req)] = row.req
        decodes = [row for row in batch if row.n == 1 and row.req.extend_len == 1]
        budget -= self._propose(decodes, req_pages, budget, batch.num_tokens, len(decodes))
        if budget <= 0:
            return
        ends = [r for r in batch if 1 < r.n == r.req.extend_len and not r.drafts and not r.req.wants_input_logprobs]
        if ends:
            n0 = sum(1 for r in batch if r.num_fill >= r.req.extend_len)
            self._propose(ends, req_pages, budget, batch.num_tokens, n0)

    def _catch_up(self, req_pages) -> None:
        """What happened since the last step: its time refines the curve; requests that ended leave the
        drafter (their outputs join its store); a flush of the cache empties that store."""
        st = self.steps
        if st.steps != self._seen_steps:
            self._seen_steps = st.steps
            if st.last_tokens > 0:
                self.times.observe(st.last_tokens, st.last_time)
        for key, req in list(self._live.items()):
            if req.finished_reason is not None:
                del self._live[key]
                self.drafter.finish(req)
                self.acceptance.finish(req.rid)
                self.acceptance.finish(forced_key(req.rid))
        if req_pages.flushes != self._flushes:
            self._flushes = req_pages.flushes
            self.drafter.flush()

    def _propose(self, rows: list[Row], req_pages, budget: int, base: int, n0: int) -> int:
        """Drafts for ``rows`` of a step of ``base`` tokens whose ``n0`` sampling rows emit one token each
        without drafts (none above ``--speculative-max-batch-size`` of them); each row's pages grow for its
        draft (free pages only: ``DraftMaker.room`` counted them). Returns the draft tokens added."""
        if not rows or budget <= 0 or (self.max_batch is not None and n0 > self.max_batch):
            return 0
        drafts = (
            self._adaptive(rows, req_pages, budget, base, n0) if self.adaptive else self._fixed(rows, req_pages, budget)
        )
        used = 0
        for row, d in drafts:
            if d.tokens and req_pages.grow(row.req, row.n + len(d.tokens)):
                row.add_drafts(d.tokens)
                used += len(d.tokens)
                if d.certain:
                    self._certain[id(row.req)] = d.certain
        return used

    def _fixed(self, rows: list[Row], req_pages, budget: int) -> list[tuple[Row, Draft]]:
        """Not adaptive: each row the tokens its grammar forces and the drafter's proposal cut by the fixed
        rule (spec_drafts.py), until the budget is spent."""
        out, used = [], 0
        for row in rows:
            if budget - used <= 0:
                break
            forced = self.drafts.forced(row.req, self.drafts.room(row.req, req_pages, budget - used, row.n))
            d = self.drafts.continued(row.req, req_pages, budget - used, row.n, forced)
            out.append((row, d))
            used += len(d.tokens)
        return out

    def _adaptive(self, rows: list[Row], req_pages, budget: int, base: int, n0: int) -> list[tuple[Row, Draft]]:
        """The cost model's draft lengths (spec/cost.py) for ``rows`` of a step of ``base`` tokens that
        emits ``n0`` without drafts: first with every row's most (a constrained row: the tokens its grammar
        forces, if any), to skip drafting where even full drafts cannot pay, then with the drafts really
        proposed, their forced tokens priced on the request's forced track and the rest on its drafter's."""
        if not len(self.times):
            return []
        reqs, ns = [r.req for r in rows], [r.n for r in rows]
        rooms = [self.drafts.room(r, req_pages, budget, n) for r, n in zip(reqs, ns)]
        forced = [self.drafts.forced(r, k) for r, k in zip(reqs, rooms)]
        pf = [self.acceptance.p(forced_key(r.rid)) for r in reqs]
        pd = [self.acceptance.p(r.rid) for r in reqs]
        want = choose_drafts(
            self.times,
            base,
            n0,
            [(pf[j], len(f), len(f), pd[j]) if f else (pd[j], k) for j, (f, k) in enumerate(zip(forced, rooms))],
            budget,
        )
        self._drafting_steps += any(want)
        if not any(want) or self._drafting_steps % REFRESH_EVERY == 0:
            for r in reqs:
                self.acceptance.pass_over(r.rid)
            return []
        drafts = [
            self.drafts.continued(r, req_pages, budget, n, f) if k else Draft(f, len(f))
            for r, n, f, k in zip(reqs, ns, forced, want)
        ]
        ks = choose_drafts(
            self.times, base, n0, [(pf[j], len(d.tokens), d.certain, pd[j]) for j, d in enumerate(drafts)], budget
        )
        for r, k in zip(reqs, ks):
            if not k:
                self.acceptance.pass_over(r.rid)
        return [(row, Draft(d.tokens[:k], min(k, d.certain))) for row, d, k in zip(rows, drafts, ks) if k]

    # ---- accept ------------------------------------------------------------------------------------
    def accept(self, batch: ScheduledBatch, fb, logits, finished: list) -> list[int]:
        """Verify each row with drafts (module doc; spec_verify.py), count what was kept, and return the
        tokens each row keeps (``Speculator.accept``)."""
        keep = [row.n for row in batch]
        if not fb.verify_at:
            return keep
        done, sampled, accepted = verify_rows(self.outputs, logits, fb.verify_at)
        ended = {id(r) for r, _ in done}
        at = {id(row): i for i, row in enumerate(batch)}
        c = self.counts
        for row, _ in fb.verify_at:
            req, k = row.req, len(row.drafts)
            s, a = sampled[id(req)], accepted[id(req)]
            # each sampled position's input was the row's last token or an accepted draft, whose KV this
            # forward wrote; the last sampled token has no KV yet
            keep[at[id(row)]] = row.num_fill + s - 1
            c.verify_steps += 1
            c.draft_tokens += k
            c.accepted_tokens += a
            c.emitted_tokens += s
            # the forced tokens' outcome on the forced track, the drafter's tokens after them on its own
            f, stopped = self._certain.get(id(req), 0), id(req) in ended
            if f:
                c.forced_draft_tokens += f
                c.forced_accepted_tokens += min(a, f)
                self.acceptance.observe(forced_key(req.rid), f, min(a, f), a < f and not stopped)
            if k > f and a >= f:
                self.acceptance.observe(req.rid, k - f, a - f, a < k and not stopped)
        finished += done
        return keep


def make_speculator(args, outputs, runner, req_pages, steps) -> Speculator:
    """The scheduler's speculator for ``args`` (ServerArgs' ``speculative_*`` flags, ``tp``).

    Args:
        outputs: the scheduler's OutputProcessor, whose ``sample`` verifies each position.
        runner: the ModelRunner (``device``, ``context_length``; the cost model's start-up step times are
            measured on it, on scratch pages of ``req_pages``).
        steps: the scheduler's StepStats: each step's tokens and seconds refine the cost model's curve.

    Raises:
        ValueError: an unknown ``--speculative-algorithm``.
    """
    algorithm = resolve_algorithm(args.speculative_algorithm, args.tp, str(runner.device))
    if args.tp > 1:  # every rank would have to draft alike; the ranks' lockstep carries no drafts yet
        if algorithm != "none":
            logging.getLogger(__name__).warning(
                "--speculative-algorithm %s is not run under --tp %d: decoding without drafts", algorithm, args.tp
            )
        return Speculator()
    drafter = make_drafter(
        algorithm, DraftConfig(num_draft_tokens=args.speculative_num_draft_tokens), outputs.tokenizer
    )
    if drafter is None:
        return Speculator()
    spec = DraftSpeculator(args, algorithm, drafter, outputs, runner.context_length, steps)
    spec.calibrate(runner, req_pages.allocator)
    return spec
