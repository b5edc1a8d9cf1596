"""The scheduler: it decides who runs each step; others do the work.

    step():  schedule()                  -> [(req, num_new_tokens)]   admissions, chunks, preemptions
             runner.prepare(batch)       -> ForwardBatch              model_runner.py
             runner.forward(fb)          -> logits                    model_runner.py
             outputs.process(fb, logits) -> finished requests         output_processor.py
             mem.cache / mem.release                                  mem/req_pages.py

One step holds every running decode plus as many prefill (extend) tokens as ``max_num_batched_tokens``
allows; prompts longer than ``chunked_prefill_size`` are prefilled over several steps (chunked
prefill, Sarathi / SGLang). When decode runs out of pages, the newest request is preempted by recompute:
its computed prefix goes into the radix tree, its own pages are freed and it goes back to the queue.

Page ownership is stated in mem/req_pages.py, the tree's invariants in mem/radix_cache.py.
"""
from __future__ import annotations

import logging
import time

from radixrt.runtime.io_struct import GenerateReq, TokenOut
from radixrt.runtime.mem.req_pages import ReqPages
from radixrt.runtime.request_log import RequestLog
from radixrt.runtime.output_processor import OutputProcessor, eos_ids, make_out
from radixrt.runtime.request import Req
from radixrt.runtime.sampling.params import grammar_of
from radixrt.runtime.schedule_policy import order_waiting

logger = logging.getLogger(__name__)
# Among waiting requests, one whose not-yet-cached part shares at least this many tokens with a request
# admitted in the same step waits one step and then hits that request's KV (in-batch prefix sharing).
IN_BATCH_SHARE_MIN = 32


class Scheduler:
    def __init__(self, args, runner, tokenizer, grammar_cache=None):
        self.args, self.runner, self.tokenizer = args, runner, tokenizer
        self.P = runner.page_size
        self.mem = ReqPages(self.P, runner.num_pages, not args.disable_radix_cache, args.eviction_policy)
        self.request_log = RequestLog(args.request_log, self.P, args.request_log_hash) if args.request_log else None
        self.allocator, self.tree = self.mem.allocator, self.mem.tree
        self.grammar_cache = grammar_cache
        self.outputs = OutputProcessor(tokenizer, eos_ids(tokenizer, runner.config), runner.context_length)
        self.waiting: list[Req] = []
        self.grammar_queue: list[Req] = []
        self.running: list[Req] = []
        self.finished_outs: list[TokenOut] = []
        self.by_rid: dict[str, Req] = {}
        self.arrivals = 0
        self.step_count = 0
        self.hit_tokens = 0
        self.query_tokens = 0
        self.sched_time = 0.0
        self.step_time = 0.0
        self.num_preemptions = 0

    # ---- requests in -------------------------------------------------------------------------------
    def add_request(self, r: GenerateReq) -> None:
        """Queue a validated request (see ``validate_request``)."""
        ctx = self.runner.context_length
        max_new = r.sampling_params.max_new_tokens
        if max_new is None:
            max_new = ctx - len(r.input_ids)
        self.arrivals += 1
        req = Req.from_generate(r, max_new, self.arrivals, self.args.random_seed + self.arrivals)
        req.t_arrival = time.time()
        if r.return_logprob and r.logprob_start_len >= 0:
            req.input_logprobs, req.input_top_logprobs = [], []
        self.by_rid[req.rid] = req
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
            self.mem.release(req)
        for q in (self.waiting, self.grammar_queue):
            if req in q:
                q.remove(req)
        self._finish(req, {"type": "abort", "message": "aborted"})

    def flush_cache(self) -> bool:
        """Drop every unlocked cached page. Returns False (nothing done) while requests are running."""
        if self.tree is None:
            return True
        if self.running or self.waiting:
            return False
        self.tree.flush()
        if self.request_log is not None:
            self.request_log.write_flush(time.time())
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.grammar_queue or self.finished_outs)

    # ---- memory ------------------------------------------------------------------------------------
    def _preempt(self, req: Req) -> None:
        self.running.remove(req)
        self.mem.release(req)
        if req.input_logprobs is not None and not req.input_logprobs_done:
            req.input_logprobs, req.input_top_logprobs = [], []  # recomputed from the start
        self.num_preemptions += 1
        self.waiting.append(req)  # keeps its arrival number, so it goes first under fcfs

    def cache_stats(self) -> dict:
        return {**self.mem.stats(self.running), "hit_tokens": self.hit_tokens, "query_tokens": self.query_tokens,
                "hit_rate": self.hit_tokens / self.query_tokens if self.query_tokens else 0.0,
                "num_preemptions": self.num_preemptions}

    # ---- scheduling --------------------------------------------------------------------------------
    def _promote_grammar_ready(self) -> None:
        for req in [r for r in self.grammar_queue if r.grammar_future.done()]:
            self.grammar_queue.remove(req)
            try:
                req.grammar = req.grammar_future.result().matcher()
            except Exception as e:  # validated before queueing; a backend failure still ends cleanly
                self._finish(req, {"type": "abort", "message": f"grammar: {e}"})
                continue
            req.grammar_future = None
            self.waiting.append(req)

    def schedule(self) -> list[tuple[Req, int]]:
        """Pick this step's work: ``(req, num_new_tokens)`` pairs, decodes first."""
        self._promote_grammar_ready()
        budget = self.args.max_num_batched_tokens
        batch: list[tuple[Req, int]] = []
        for req in sorted([r for r in self.running if r.extend_len == 1], key=lambda r: r.arrival):
            if req in self.running and self._grow_or_preempt(req, 1, batch):
                batch.append((req, 1))
                budget -= 1
        for req in [r for r in self.running if r.extend_len > 1]:
            n = min(req.extend_len, self.args.chunked_prefill_size, budget)
            if n > 0 and req in self.running and self._grow_or_preempt(req, n, batch):
                batch.append((req, n))
                budget -= n
        if budget <= 0 or not self.waiting:
            return batch
        admitted: list[Req] = [r for r, _ in batch if r.extend_len > 1]
        for req in order_waiting(self.waiting, self.args.schedule_policy, self.tree, self.args.max_wait_steps):
            if budget <= 0 or len(self.running) >= self.args.max_running_requests:
                break
            if self.tree is not None and self._shares_uncached(req, admitted):
                continue
            matched = self.mem.admit(req)
            n = min(req.extend_len, self.args.chunked_prefill_size, budget)
            if not self.mem.grow(req, n):
                self.mem.release(req)
                break
            if req.t_admit is None:
                req.t_admit, req.cacheable_len = time.time(), req.max_cacheable_prefix()
            if not req.output_ids and req.cached_tokens == 0:
                req.cached_tokens = matched
                self.hit_tokens += matched
                self.query_tokens += len(req.input_ids)
            self.waiting.remove(req)
            self.running.append(req)
            batch.append((req, n))
            admitted.append(req)
            budget -= n
        for req in self.waiting:
            req.wait_steps += 1
        return batch

    def _grow_or_preempt(self, req: Req, n: int, batch: list[tuple[Req, int]]) -> bool:
        """Make room for ``n`` more tokens of ``req``, preempting the newest running request not already
        in this step's ``batch`` until the pages fit. Returns False when ``req`` itself was preempted.

        Decodes are visited oldest first, so the newest request gives way: recompute preemption, as in
        vLLM and SGLang."""
        in_batch = {r for r, _ in batch}
        while not self.mem.grow(req, n):
            victim = max((r for r in self.running if r not in in_batch), key=lambda r: r.arrival)
            self._preempt(victim)
            if victim is req:
                return False
        return True

    def _shares_uncached(self, req: Req, admitted: list[Req]) -> bool:
        if not admitted:
            return False
        ids = req.fill_ids
        m = self.tree.match_prefix(ids[: req.max_cacheable_prefix()], req.cache_salt)
        cached = len(m.pages) * self.P
        for other in admitted:
            if other.cache_salt != req.cache_salt:
                continue
            o = other.fill_ids
            n, lim = cached, min(len(ids), len(o)) - 1
            while n < lim and ids[n] == o[n]:
                n += 1
            if n - cached >= max(IN_BATCH_SHARE_MIN, self.P):
                return True
        return False

    # ---- one step ------------------------------------------------------------------------------------
    def step(self) -> list[TokenOut]:
        """Run one iteration. Returns the outputs produced (deltas), finished requests included."""
        t0 = time.perf_counter()
        batch = self.schedule()
        if batch:
            fb = self.runner.prepare(batch)
            self.sched_time += time.perf_counter() - t0
            logits = self.runner.forward(fb)
            t1 = time.perf_counter()
            now = time.time()
            for req, n in batch:
                req.num_computed += n
                if n > 1 or not req.prefill_marks:
                    req.prefill_marks.append((now, min(req.num_computed, len(req.input_ids))))
            for req, reason in self.outputs.process(fb, logits):
                self._finish_running(req, reason)
            for req, n in batch:
                if req.finished_reason is None and n > 1:
                    self.mem.cache(req)  # a prefill chunk's KV goes to the tree at once, for others to hit
            self.sched_time += time.perf_counter() - t1
            self.step_time += time.perf_counter() - t0
        self.step_count += 1
        if self.step_count % self.args.log_interval == 0 and self.query_tokens:
            logger.info("step %d: running=%d waiting=%d hit_rate=%.3f free_pages=%d", self.step_count,
                        len(self.running), len(self.waiting), self.hit_tokens / self.query_tokens,
                        self.allocator.num_free)
        outs, self.finished_outs = self.finished_outs, []
        for req in self.running:
            o = make_out(req)
            if o is not None:
                outs.append(o)
        return outs

    # ---- results -------------------------------------------------------------------------------------
    def _finish_running(self, req: Req, reason: dict) -> None:
        self.running.remove(req)
        self.mem.release(req)
        self._finish(req, reason)

    def _finish(self, req: Req, reason: dict) -> None:
        req.finished_reason = reason
        self.by_rid.pop(req.rid, None)
        if self.request_log is not None:
            self.request_log.write_req(req, time.time())
        self.finished_outs.append(make_out(req, force=True))
