"""Speculative decoding in the batched step: drafts attached to decode rows, verified in one forward.

    schedule():   propose(batch, mem, budget)  a decode row of req carries 1 + k tokens: its last sampled
                                               token and k drafts (runtime/spec/: suffix or ngram drafter)
    prepare():    the row is an extend row (causal inside the row) with logits at all of its 1 + k positions
    process_batch_result():  verify(logits, fb.spec_at): accepted tokens appended, then
                  rollback_rejected(batch, mem): the rejected drafts' pages freed

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
they are read; their pages beyond the next token's are freed at once (``rollback_rejected``), and the radix tree only
ever inserts ``fill_ids[:num_computed]``, which holds accepted tokens only.
"""

from __future__ import annotations

import logging
import time

from radixrt.runtime.executor.scheduled_batch import ScheduledBatch
from radixrt.runtime.io_struct import FinishReason
from radixrt.runtime.scheduler.request import Req
from radixrt.runtime.scheduler.spec_drafts import Draft, DraftMaker, forced_key
from radixrt.runtime.scheduler.spec_verify import verify_rows
from radixrt.runtime.spec import DraftConfig, make_drafter, resolve_algorithm
from radixrt.runtime.spec.cost import Acceptance, StepTimes, choose_drafts

REFRESH_EVERY = 32  # one drafting step in this many runs without drafts, to keep t(T0) measured


class Speculator:
    """Owns the drafter and the speculation counters (``stats``) of one scheduler.

    Args:
        args: ServerArgs (``speculative_algorithm``, ``speculative_num_draft_tokens``,
            ``speculative_max_batch_size``, ``grammar_overlap``, ``tp``).
        outputs: the scheduler's OutputProcessor, whose ``sample`` verifies each position.
        context_length: the longest prompt + output, in tokens.
        device: the model's device (``--speculative-algorithm auto`` is decided by it, spec.resolve_algorithm).
    """

    def __init__(self, args, outputs, context_length: int, device: str = "cpu"):
        cfg = DraftConfig(num_draft_tokens=args.speculative_num_draft_tokens)
        algorithm = resolve_algorithm(args.speculative_algorithm, args.tp, device)
        # under --tp every rank must draft alike; the ranks' lockstep carries no drafts yet
        self.drafter = make_drafter(algorithm, cfg, outputs.tokenizer) if args.tp == 1 else None
        self.algorithm = algorithm if self.drafter is not None else "none"
        if args.tp > 1 and algorithm != "none":
            logging.getLogger(__name__).warning(
                "--speculative-algorithm %s is not run under --tp %d: decoding without drafts", algorithm, args.tp
            )
        self.max_batch = args.speculative_max_batch_size or None
        self.adaptive = args.speculative_adaptive
        self.times = StepTimes()  # t(T), set by calibrate() and every step (observe_step)
        self.acceptance = Acceptance()
        self._drafting_steps = 0
        self._certain: dict[int, int] = {}  # this step's rows whose draft begins with forced tokens: how many
        self.outputs = outputs
        self.drafts = (
            DraftMaker(self.drafter, outputs, context_length, self.adaptive) if self.drafter is not None else None
        )
        self.verify_steps = 0  # request-steps that verified drafts
        self.draft_tokens = 0  # draft tokens proposed and verified
        self.accepted_tokens = 0  # of those, kept
        self.emitted_tokens = 0  # tokens those request-steps produced (accepted + one sampled each)
        self.forced_draft_tokens = 0  # of the draft tokens, those a grammar forced (jump-forward drafts)
        self.forced_accepted_tokens = 0  # of those, kept

    # ---- drafting ----------------------------------------------------------------------------------
    def calibrate(self, runner, allocator) -> None:
        """Measure the step-time curve the cost model starts from (scheduler/spec_calibrate.py)."""
        if self.drafter is not None and self.adaptive:
            from radixrt.runtime.scheduler.spec_calibrate import measure_step_times

            t0 = time.perf_counter()
            self.times = measure_step_times(runner, allocator)
            logging.getLogger(__name__).info(
                "speculation %s: step times of %d sizes measured in %.2f s (--speculative-algorithm none skips this)",
                self.algorithm,
                len(self.times),
                time.perf_counter() - t0,
            )

    def observe_step(self, tokens: int, seconds: float) -> None:
        """A step of ``tokens`` tokens took ``seconds`` (scheduling, forward and sampling together)."""
        if self.drafter is not None and tokens > 0:
            self.times.observe(tokens, seconds)

    def propose(self, batch: ScheduledBatch, mem, budget: int, pending: int = 0) -> int:
        """Give each decode row of ``batch`` its drafts (``req.draft_ids``) and the pages for them, from
        free pages only (drafts never evict cached prefixes nor preempt). ``pending``: prompt tokens the
        step will add after the decodes (the cost model's base). Returns the extra tokens."""
        self._certain = {}
        if self.drafter is None:  # speculation off: nothing on the per-step path
            return 0
        decodes = [i for i, (r, n) in enumerate(batch) if n == 1 and r.extend_len == 1]
        return self._propose(
            batch, decodes, mem, budget, sum(batch.num_new_tokens) + min(pending, budget), len(decodes)
        )

    def propose_after_prompts(self, batch: ScheduledBatch, mem, budget: int) -> int:
        """Drafts after a prompt: a chunk that ends its prompt samples the first output token at its last
        position, so drafts appended to it are verified by the same forward, and the first decode step's
        tokens come with the prefill. Called once the step's chunks are scheduled (the cost model's base is
        the whole step; every row that samples counts once in its output). Not for requests that want
        prompt logprobs. Returns the extra tokens."""
        if self.drafter is None or budget <= 0:
            return 0
        ends = [
            i
            for i, (r, n) in enumerate(batch)
            if 1 < n == r.extend_len and not r.draft_ids and not r.wants_input_logprobs
        ]
        if not ends:
            return 0
        return self._propose(
            batch, ends, mem, budget, sum(batch.num_new_tokens), sum(1 for r, n in batch if n >= r.extend_len)
        )

    def _propose(self, batch: ScheduledBatch, rows: list[int], mem, budget: int, base: int, n0: int) -> int:
        """Drafts for ``rows`` of a step of ``base`` tokens whose ``n0`` sampling rows emit one token each
        without drafts (none above ``--speculative-max-batch-size`` of them); each row's pages grow for its
        draft (free pages only: ``DraftMaker.room`` counted them). Returns the extra tokens."""
        if not rows or (self.max_batch is not None and n0 > self.max_batch):
            return 0
        drafts = (
            self._adaptive(batch, rows, mem, budget, base, n0)
            if self.adaptive
            else self._proposed(batch, rows, mem, budget)
        )
        used = 0
        for i, d in drafts:
            req, n = batch.reqs[i], batch.num_new_tokens[i]
            if d.tokens and mem.grow(req, n + len(d.tokens)):
                req.draft_ids = d.tokens
                batch.num_new_tokens[i] = n + len(d.tokens)
                used += len(d.tokens)
                if d.certain:
                    self._certain[id(req)] = d.certain
        return used

    def _proposed(self, batch: ScheduledBatch, rows: list[int], mem, budget: int) -> list[tuple[int, Draft]]:
        """Not adaptive: each row the tokens its grammar forces and the drafter's adapted proposal
        (spec_drafts.py), until the budget is spent."""
        out, used = [], 0
        for i in rows:
            if budget - used <= 0:
                break
            req, n = batch.reqs[i], batch.num_new_tokens[i]
            forced = self.drafts.forced(req, self.drafts.room(req, mem, budget - used, n))
            d = self.drafts.continued(req, mem, budget - used, n, forced)
            out.append((i, d))
            used += len(d.tokens)
        return out

    def _adaptive(
        self, batch: ScheduledBatch, rows: list[int], mem, budget: int, base: int, n0: int
    ) -> list[tuple[int, Draft]]:
        """The cost model's draft lengths (spec/cost.py) for ``rows`` of a step of ``base`` tokens that
        emits ``n0`` without drafts: first with every row's most (a constrained row: the tokens its grammar
        forces, if any), to skip drafting where even full drafts cannot pay, then with the drafts really
        proposed, their forced tokens priced on the request's forced track and the rest on its drafter's."""
        if not len(self.times) or budget <= 0:
            return []
        reqs, ns = [batch.reqs[i] for i in rows], [batch.num_new_tokens[i] for i in rows]
        rooms = [self.drafts.room(r, mem, budget, n) for r, n in zip(reqs, ns)]
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
            self.drafts.continued(r, mem, budget, n, f) if k else Draft(f, len(f))
            for r, n, f, k in zip(reqs, ns, forced, want)
        ]
        ks = choose_drafts(
            self.times, base, n0, [(pf[j], len(d.tokens), d.certain, pd[j]) for j, d in enumerate(drafts)], budget
        )
        for r, k in zip(reqs, ks):
            if not k:
                self.acceptance.pass_over(r.rid)
        return [(i, Draft(d.tokens[:k], min(k, d.certain))) for i, d, k in zip(rows, drafts, ks) if k]

    # ---- verification ------------------------------------------------------------------------------
    def verify(self, logits, spec_at: list[tuple[Req, int]]) -> list[tuple[Req, FinishReason]]:
        """Verify each spec row (module doc; scheduler/spec_verify.py) and count what was kept. ``spec_at``:
        ``(req, first logits row)``; rows ``first .. first + len(req.draft_ids)`` score its positions.
        Returns the finished requests."""
        finished, sampled, accepted = verify_rows(self.outputs, logits, spec_at)
        ended = {id(r) for r, _ in finished}
        for req, _ in spec_at:
            # process_batch_result advanced by the row's first token; each further sampled position's input was an
            # accepted draft whose KV this forward wrote
            req.num_computed += sampled[id(req)] - 1
            k, a = len(req.draft_ids), accepted[id(req)]
            self.verify_steps += 1
            self.draft_tokens += k
            self.accepted_tokens += a
            self.emitted_tokens += sampled[id(req)]
            self.drafter.observe(req, k, a)
            # the forced tokens' outcome on the forced track, the drafter's tokens after them on its own
            c, stopped = self._certain.get(id(req), 0), id(req) in ended
            if c:
                self.forced_draft_tokens += c
                self.forced_accepted_tokens += min(a, c)
                self.acceptance.observe(forced_key(req.rid), c, min(a, c), a < c and not stopped)
            if k > c and a >= c:
                self.acceptance.observe(req.rid, k - c, a - c, a < k and not stopped)
        return finished

    def rollback_rejected(self, batch: ScheduledBatch, mem) -> None:
        """After verification: free the pages past the next token's that only rejected drafts used, and
        clear the step's drafts."""
        if self.drafter is None:
            return
        for req in batch.reqs:
            if not req.draft_ids:
                continue
            req.draft_ids = []
            keep = max(-(-(req.num_computed + 1) // mem.P), req.prefix_len // mem.P)
            if len(req.page_table) > keep:
                mem.allocator.free(req.page_table[keep:])
                del req.page_table[keep:]

    def finish(self, req: Req) -> None:
        """The request ended (finished, aborted or refused): the drafter drops its state, learns its output."""
        req.draft_ids = []
        if self.drafter is not None:
            self.drafter.finish(req)
            self.acceptance.finish(req.rid)
            self.acceptance.finish(forced_key(req.rid))

    def flush(self) -> None:
        """``flush_cache``: the drafter forgets the outputs it learned (its store goes with the cache)."""
        if self.drafter is not None:
            self.drafter.flush()

    def stats(self) -> dict:
        """``accept_rate``: accepted over proposed draft tokens; ``accept_length``: tokens per verifying
        request-step (accepted + 1; SGLang's ``spec_accept_length``)."""
        return {
            "algorithm": self.algorithm,
            "verify_steps": self.verify_steps,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "emitted_tokens": self.emitted_tokens,
            "forced_draft_tokens": self.forced_draft_tokens,
            "forced_accepted_tokens": self.forced_accepted_tokens,
            "accept_rate": self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0,
            "accept_length": self.emitted_tokens / self.verify_steps if self.verify_steps else 0.0,
        }
