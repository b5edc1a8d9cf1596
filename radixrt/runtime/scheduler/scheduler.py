"""The scheduler: it decides who runs each step; others do the work.

    step():  schedule()                               -> ScheduledBatch     admissions, chunks, preemptions,
                                                                            then the step hook's propose
             runner.prepare(batch)                    -> ForwardBatch       executor/model_runner.py
             runner.forward(fb)                       -> logits             executor/model_runner.py
             process_batch_result(batch, fb, logits)  -> finished requests  sample (output_processor.py), the
                                                                            hook's accept, advance, mem/req_pages.py
             collect_outputs()                        -> TokenOut deltas

``run_once`` is what every driver loop calls once per turn (the Engine's thread, the scheduler process,
each --tp rank): session expiry, then a step when there is work, timed into :class:`StepStats`.

One step holds every running decode plus as many prefill (extend) tokens as ``max_num_batched_tokens``
allows; prompts longer than ``chunked_prefill_size`` are prefilled over several steps (chunked
prefill, Sarathi / SGLang). When decode runs out of pages, the newest request is preempted by recompute:
its computed prefix goes into the radix tree, its own pages are freed and it goes back to the queue.

Page ownership is stated in mem/req_pages.py, the tree's invariants in mem/radix_cache.py.
"""

from __future__ import annotations

import logging
import time

from radixrt.runtime.errors import ValidationError, grammar_refusal, refusal
from radixrt.runtime.io_struct import FinishAbort, FinishReason, GenerateReq, TokenOut, room
from radixrt.runtime.constrained.grammar_step import make_matcher
from radixrt.runtime.executor.scheduled_batch import ScheduledBatch
from radixrt.runtime.mem.req_pages import ReqPages
from radixrt.runtime.scheduler import control
from radixrt.runtime.scheduler.hicache_build import make_hicache
from radixrt.runtime.scheduler.request_log import RequestLog
from radixrt.runtime.scheduler.output_processor import OutputProcessor, eos_ids, make_out
from radixrt.runtime.scheduler.request import Req
from radixrt.runtime.sampling.params import grammar_of
from radixrt.runtime.scheduler.schedule_policy import order_waiting, shares_uncached
from radixrt.runtime.scheduler.session import SessionManager, TurnClock
from radixrt.runtime.scheduler.spec_step import make_speculator
from radixrt.runtime.scheduler.step_stats import StepStats

logger = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, args, runner, tokenizer, grammar_cache=None, tp=None):
        self.args, self.runner, self.tokenizer, self.tp = args, runner, tokenizer, tp  # tp: this rank's TPGroup
        self.P = runner.page_size
        self.req_pages = ReqPages(
            self.P,
            runner.num_pages,
            not args.disable_radix_cache,
            args.eviction_policy,
            tiers=make_hicache(args, runner),  # tiers 2-3 under the tree, or None
            unpin=self._unpin_oldest,
        )
        self.request_log = RequestLog(args.request_log, self.P, args.request_log_hash) if args.request_log else None
        self.allocator, self.tree = self.req_pages.allocator, self.req_pages.tree
        self.grammar_cache = grammar_cache
        self.grammar_gate: set[str] | None = None  # see _promote_grammar_ready; under --tp: gate_grammar
        self.outputs = OutputProcessor(
            tokenizer,
            eos_ids(tokenizer, runner.config),
            runner.context_length,
            jump_forward=not args.disable_jump_forward,
            grammar_overlap=args.grammar_overlap,
            share_tokens=tp.share_tokens if tp is not None and tp.size > 1 else None,
        )
        self.stats = StepStats()
        self.spec = make_speculator(args, self.outputs, runner, self.req_pages, self.stats)  # the step hook
        self.waiting: list[Req] = []
        self.grammar_queue: list[Req] = []
        self.running: list[Req] = []
        self.finished_outs: list[TokenOut] = []
        self.by_rid: dict[str, Req] = {}
        self.arrivals = 0
        self.hit_tokens = 0
        self.query_tokens = 0
        self.num_preemptions = 0
        self._last_batch_size = self._last_tokens = 0
        # under --tp every rank's sessions run on rank 0's time, one value per turn (the loops set it)
        self.sessions = SessionManager(
            self.tree, args.max_pinned_tokens, TurnClock() if tp is not None else time.monotonic
        )

    # ---- messages in -------------------------------------------------------------------------------
    def handle(self, msg):
        """Apply one wire message; returns the reply to send, or None (see :mod:`.control`, which also fixes
        each message's collectives under ``--tp``)."""
        return control.handle(self, msg, self.tp)

    def add_request(self, r: GenerateReq) -> None:
        """Queue a validated request (see ``build_requests``); a session request gets its history first."""
        context_len, error = self.runner.context_length, None
        try:
            session, ids = self.sessions.resolve(r.session_id, r.session_params, r.input_ids)
        except ValueError as e:
            session, ids, error = None, r.input_ids, e
        max_new = r.sampling_params.max_new_tokens
        if max_new is None:
            max_new = room(len(ids), context_len, self.runner.num_pages * self.runner.page_size)
        self.arrivals += 1
        req = Req.from_generate(r, max_new, self.arrivals, self.args.random_seed + self.arrivals)
        req.input_ids, req.session = list(ids), session
        req.t_arrival = time.time()
        if r.return_logprob and r.logprob_start_len >= 0:
            req.input_logprobs, req.input_top_logprobs = [], []
        self.by_rid[req.rid] = req
        if error is None and len(ids) >= context_len:
            error = ValidationError(
                f"the session's context ({len(ids)} tokens) reaches the context length {context_len}", "session_params"
            )
        if error is not None:  # a bad session field: the caller gets a 400 naming it
            self._finish(req, refusal(error))
            return
        g = grammar_of(r.sampling_params)
        if g is not None and self.grammar_cache is not None:
            req.grammar_future = self.grammar_cache.submit(g[0], g[1], r.sampling_params.any_whitespace)
            self.grammar_queue.append(req)
        else:
            self.waiting.append(req)

    def abort(self, rid: str) -> None:
        req = self.by_rid.get(rid)
        if req is None or req.finished_reason is not None:
            return
        if req in self.running:
            self.running.remove(req)
            self.req_pages.release(req)
        for q in (self.waiting, self.grammar_queue):
            if req in q:
                q.remove(req)
        self._finish(req, FinishAbort("aborted"))

    def flush_cache(self) -> bool:
        """Drop every unlocked cached page, and what caches outputs beside the tree (``ReqPages.flush``).
        Returns False (nothing done) while requests are running (True without a tree)."""
        if self.running or self.waiting or self.req_pages.restoring_pages:
            return self.tree is None
        self.req_pages.flush()
        if self.tree is not None and self.request_log is not None:
            self.request_log.write_flush(time.time())
        return True

    @property
    def has_work(self) -> bool:
        return bool(
            self.running
            or self.waiting
            or self.grammar_queue
            or self.finished_outs
            or self.req_pages.restoring_pages
            or self.req_pages.storing_pages
        )

    # ---- memory ------------------------------------------------------------------------------------
    def _unpin_oldest(self) -> bool:
        """ReqPages' ``unpin``: memory pressure drops the oldest session pin first."""
        return self.sessions.unpin_oldest()

    def _preempt(self, req: Req) -> None:
        self.running.remove(req)
        self.req_pages.release(req)
        if req.input_logprobs is not None and not req.input_logprobs_done:
            req.input_logprobs, req.input_top_logprobs = [], []  # recomputed from the start
        self.num_preemptions += 1
        self.waiting.append(req)  # keeps its arrival number, so it goes first under fcfs

    def cache_stats(self) -> dict:
        return {
            **self.req_pages.stats(self.running),
            "hit_tokens": self.hit_tokens,
            "query_tokens": self.query_tokens,
            "hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
            "num_preemptions": self.num_preemptions,
            "req_forward_passes": self.stats.req_forward_passes,
            "jump_forward_tokens": self.outputs.jump_forward_tokens,
            **self.sessions.stats(),
            **({"hicache": self.req_pages.hicache.stats(self.query_tokens)} if self.req_pages.hicache else {}),
        }

    # ---- scheduling --------------------------------------------------------------------------------
    def gate_grammar(self, rids: list[str]) -> None:
        """Under --tp: promote exactly these grammar requests next step, rank 0's choice on every rank."""
        self.grammar_gate = set(rids)

    def _promote_grammar_ready(self) -> None:
        gate = self.grammar_gate  # under --tp: the rids rank 0 promotes this step (waited for here)
        for req in [r for r in self.grammar_queue if (r.rid in gate if gate is not None else r.grammar_future.done())]:
            self.grammar_queue.remove(req)
            try:
                req.grammar = make_matcher(req.grammar_future.result(), req.params.reasoning_end_ids)
            except Exception as e:  # validated before queueing; a backend limit still gets a 400
                self._finish(req, grammar_refusal(grammar_of(req.params), str(e)))
                continue
            req.grammar_future = None
            self.waiting.append(req)

    def schedule(self) -> ScheduledBatch:
        """Pick this step's work (:class:`ScheduledBatch`): decodes first, then extend chunks, then
        admissions, within ``--max-num-batched-tokens``; then the step hook's propose, within what is left."""
        self._promote_grammar_ready()
        budget = self.args.max_num_batched_tokens
        batch = ScheduledBatch()
        for req in sorted([r for r in self.running if r.extend_len == 1], key=lambda r: r.arrival):
            if req in self.running and self._grow_or_preempt(req, 1, batch):
                batch.add(req, 1)
                budget -= 1
        for req in [r for r in self.running if r.extend_len > 1]:
            n = min(req.extend_len, self.args.chunked_prefill_size, budget)
            if n > 0 and req in self.running and self._grow_or_preempt(req, n, batch, wait=False):
                batch.add(req, n)
                budget -= n
        self.req_pages.poll_restores()  # restores that landed: their requests are admitted below
        if budget > 0 and self.waiting:
            budget = self._admit(batch, budget)
        self.spec.propose(batch, self.req_pages, budget)
        self.req_pages.prefetch(self.waiting)  # tier-3 reads for those still queued, while this step runs
        return batch

    def _admit(self, batch: ScheduledBatch, budget: int) -> int:
        """Admit waiting requests into ``batch`` (their first chunk) while ``budget`` tokens and
        ``--max-running-requests`` allow. Returns the budget left."""
        admitted: list[Req] = [row.req for row in batch if row.req.extend_len > 1]
        for req in order_waiting(self.waiting, self.args.schedule_policy, self.tree, self.args.max_wait_steps):
            if budget <= 0 or len(self.running) >= self.args.max_running_requests:
                break
            if self.tree is not None and shares_uncached(self.tree, req, admitted, self.P):
                continue
            if self.tree is not None and self.req_pages.restoring(req):  # its pages load while others step
                continue
            matched = self.req_pages.admit(req)
            n = min(req.extend_len, self.args.chunked_prefill_size, budget)
            if not self.req_pages.grow(req, n, wait=False):  # no room yet (or it is being stored): next step
                self.req_pages.release(req)
                break
            if req.t_admit is None:
                req.t_admit, req.cacheable_len = time.time(), req.max_cacheable_prefix()
            if not req.output_ids and req.cached_tokens == 0:
                req.cached_tokens = matched
                self.hit_tokens += matched
                self.query_tokens += len(req.input_ids)
            req.restore_job = None  # a preempted request may restore again
            self.waiting.remove(req)
            self.running.append(req)
            batch.add(req, n)
            admitted.append(req)
            budget -= n
        for req in self.waiting:
            req.wait_steps += 1
        return budget

    def _grow_or_preempt(self, req: Req, n: int, batch: ScheduledBatch, wait: bool = True) -> bool:
        """Make room for ``n`` more tokens of ``req``, preempting the newest running request not already
        in this step's ``batch`` until the pages fit. Returns False when ``req`` itself was preempted, or
        (``wait=False``, an extend chunk) when pages are being stored to tier 2: the chunk waits a step.

        Decodes are visited oldest first, so the newest request gives way: recompute preemption, as in
        vLLM and SGLang."""
        in_batch = set(batch.reqs)
        while not self.req_pages.grow(req, n, wait):
            if not wait and self.req_pages.storing_pages:
                return False
            victim = max((r for r in self.running if r not in in_batch), key=lambda r: r.arrival)
            self._preempt(victim)
            if victim is req:
                return False
        return True

    # ---- one step ------------------------------------------------------------------------------------
    def run_once(self) -> list[TokenOut]:
        """One turn of a driver loop: sessions whose TTL ran out end (idle turns too), then one timed
        :meth:`step` when there is work. Returns the step's outputs (none when idle)."""
        self.sessions.expire()
        if not self.has_work:
            return []
        t0, f0 = time.perf_counter(), self.runner.forward_time
        outs = self.step()
        dt = time.perf_counter() - t0
        self.stats.record(dt, self.runner.forward_time - f0, self._last_batch_size, self._last_tokens)
        self.stats.log_every(self.args.log_interval, self)
        return outs

    def step(self) -> list[TokenOut]:
        """Run one iteration. Returns the outputs produced (deltas), finished requests included."""
        batch = self.schedule()
        if batch:
            fb = self.runner.prepare(batch)
            logits = self.runner.forward(fb)
            self.process_batch_result(batch, fb, logits)
        elif self.req_pages.restoring_pages or self.req_pages.storing_pages:  # only copies in flight: sleep, not spin
            self.req_pages.wait_copies(0.005)
        self._last_batch_size, self._last_tokens = len(batch), batch.num_tokens
        return self.collect_outputs()

    def process_batch_result(self, batch: ScheduledBatch, fb, logits) -> None:
        """After the forward: sample (output processor) and let the step hook accept, advance each request
        by the tokens its row keeps, give back the pages of tokens computed but not kept, finish, and put
        every unfinished prefill chunk's KV in the tree at once, for others to hit."""
        now = time.time()
        finished = self.outputs.process(fb, logits)
        keep = self.spec.accept(batch, fb, logits, finished)
        for row, k in zip(batch, keep):
            row.req.advance(k, now, chunk=row.num_fill > 1)
            if k < row.n:
                self.req_pages.trim(row.req, row.req.num_computed + 1)
        for req, reason in finished:
            self._finish_running(req, reason)
        for row in batch:
            if row.num_fill > 1 and row.req.finished_reason is None:
                self.req_pages.cache(row.req)

    def collect_outputs(self) -> list[TokenOut]:
        """This step's TokenOut deltas: finished requests' last ones, then each running request's new tokens."""
        outs, self.finished_outs = self.finished_outs, []
        return outs + [o for o in map(make_out, self.running) if o is not None]

    # ---- results -------------------------------------------------------------------------------------
    def _finish_running(self, req: Req, reason: FinishReason) -> None:
        self.running.remove(req)
        if req.session is None:
            self.req_pages.release(req)
        else:  # the request's lock on its deepest cached node passes to its session
            self.sessions.take_over(req, self.req_pages)
        self._finish(req, reason)

    def _finish(self, req: Req, reason: FinishReason) -> None:
        req.finished_reason = reason
        if req.session is not None:
            self.sessions.done(req.session)
        self.by_rid.pop(req.rid, None)
        if self.request_log is not None:
            self.request_log.write_req(req, time.time())
        self.finished_outs.append(make_out(req, force=True))
