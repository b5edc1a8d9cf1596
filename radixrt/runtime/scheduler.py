"""The scheduler loop: admit, schedule one step, run it, process the results.

One step holds every running decode plus as many prefill (extend) tokens as ``max_num_batched_tokens``
allows; prompts longer than ``chunked_prefill_size`` are prefilled over several steps (chunked
prefill, Sarathi / SGLang). When decode runs out of pages, the newest request is preempted by recompute:
its computed prefix goes into the radix tree, its own pages are freed and it goes back to the queue.

Page ownership is stated in mem/req_pages.py, the tree's invariants in mem/radix_cache.py.
"""
from __future__ import annotations

import logging
import time

import torch

from radixrt.kernels.attention.metadata import AttentionMetadata
from radixrt.runtime.mem.req_pages import ReqPages
from radixrt.runtime.io_struct import GenerateReq, TokenOut
from radixrt.runtime.request import Req
from radixrt.runtime.sampling.params import grammar_of
from radixrt.runtime.sampling.sampler import SampleRow, sample
from radixrt.runtime.schedule_policy import order_waiting

logger = logging.getLogger(__name__)
# Among waiting requests, one whose not-yet-cached part shares at least this many tokens with a request
# admitted in the same step waits one step and then hits that request's KV (in-batch prefix sharing).
IN_BATCH_SHARE_MIN = 32


class Scheduler:
    def __init__(self, args, runner, tokenizer, grammar_cache=None):
        self.args, self.runner, self.tokenizer = args, runner, tokenizer
        self.P = runner.page_size
        self.mem = ReqPages(self.P, runner.num_pages, not args.disable_radix_cache)
        self.allocator, self.tree = self.mem.allocator, self.mem.tree
        self.grammar_cache = grammar_cache
        self.eos_ids = _eos_ids(tokenizer, runner.config)
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
            if req not in self.running:
                continue  # preempted below while making room for an older request
            while not self.mem.grow(req, 1):
                victim = max(self.running, key=lambda r: r.arrival)
                self._preempt(victim)
                if victim is req:
                    break
            if req in self.running:
                batch.append((req, 1))
                budget -= 1
        for req in [r for r in self.running if r.extend_len > 1]:
            n = min(req.extend_len, self.args.chunked_prefill_size, budget)
            if n <= 0 or req not in self.running:
                continue
            while not self.mem.grow(req, n):
                # Out of pages mid-prefill: preempt the newest request not already in this step.
                in_batch = {r for r, _ in batch}
                victim = max((r for r in self.running if r not in in_batch), key=lambda r: r.arrival)
                self._preempt(victim)
                if victim is req:
                    break
            if req in self.running:
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
            self._run_batch(batch, t0)
        self.step_count += 1
        if self.step_count % self.args.log_interval == 0 and self.query_tokens:
            logger.info("step %d: running=%d waiting=%d hit_rate=%.3f free_pages=%d", self.step_count,
                        len(self.running), len(self.waiting), self.hit_tokens / self.query_tokens,
                        self.allocator.num_free)
        outs, self.finished_outs = self.finished_outs, []
        for req in self.running:
            o = self._make_out(req)
            if o is not None:
                outs.append(o)
        return outs

    def _run_batch(self, batch: list[tuple[Req, int]], t0: float) -> None:
        ids, pos, tables, q_lens, kv_lens, rows = [], [], [], [], [], []
        sample_at: list[tuple[Req, int]] = []
        lp_at: list[tuple[Req, int, int]] = []  # (req, row, target token position)
        for req, n in batch:
            s, e = req.num_computed, req.num_computed + n
            fill = req.fill_ids
            base = len(ids)
            ids.extend(fill[s:e])
            pos.extend(range(s, e))
            tables.append(req.page_table)
            q_lens.append(n)
            kv_lens.append(e)
            if req.wants_input_logprobs:
                first = max(req.logprob_start_len - 1, 0)
                for p in range(max(s, first), min(e, len(req.input_ids) - 1)):
                    lp_at.append((req, len(rows), p + 1))
                    rows.append(base + p - s)
            if e == req.seq_len:
                sample_at.append((req, len(rows)))
                rows.append(base + n - 1)
        meta = AttentionMetadata.build(tables, q_lens, kv_lens, self.P)
        self.sched_time += time.perf_counter() - t0
        logits = self.runner.forward(ids, pos, meta, rows)
        t1 = time.perf_counter()
        for req, n in batch:
            req.num_computed += n
        self._record_input_logprobs(logits, lp_at)
        self._sample(logits, sample_at)
        for req, n in batch:
            if req.finished_reason is None and n > 1:
                self.mem.cache(req)  # a prefill chunk's KV goes to the tree at once, for others to hit
        self.sched_time += time.perf_counter() - t1
        self.step_time += time.perf_counter() - t0

    def _record_input_logprobs(self, logits: torch.Tensor, lp_at) -> None:
        if not lp_at:
            return
        rows = torch.tensor([r for _, r, _ in lp_at])
        lps = torch.log_softmax(logits[rows], dim=-1)
        for i, (req, _, p) in enumerate(lp_at):
            tok = req.input_ids[p]
            req.input_logprobs.append((float(lps[i, tok]), tok))
            k = req.top_logprobs_num
            if k:
                v, ix = lps[i].topk(k)
                req.input_top_logprobs.append(list(zip(v.tolist(), ix.tolist())))
            else:
                req.input_top_logprobs.append(None)

    def _sample(self, logits: torch.Tensor, sample_at: list[tuple[Req, int]]) -> None:
        todo = []
        for req, row in sample_at:
            if req.wants_input_logprobs:
                req.input_logprobs_done = True
                if req.logprob_start_len == 0:
                    req.input_logprobs.insert(0, None)
                    req.input_top_logprobs.insert(0, None)
            if len(req.output_ids) >= req.max_new_tokens:  # max_new_tokens == 0: prefill only
                self._finish_running(req, {"type": "length", "length": req.max_new_tokens})
            else:
                todo.append((req, row))
        if not todo:
            return
        rows = torch.tensor([r for _, r in todo])
        sub = logits[rows]
        srows = []
        for req, _ in todo:
            block = []
            if len(req.output_ids) < req.params.min_new_tokens:
                block = sorted(set(req.params.stop_token_ids) | (set() if req.params.ignore_eos else self.eos_ids))
            srows.append(SampleRow(req.params, req.generator, req.input_ids, req.output_ids, block,
                                   req.top_logprobs_num if req.return_logprob else 0, req.return_logprob))
        gm = self._grammar_mask([req for req, _ in todo])
        out = sample(sub, srows, gm)
        for i, (req, _) in enumerate(todo):
            tok = out.token_ids[i]
            req.output_ids.append(tok)
            if req.return_logprob:
                req.out_logprobs.append((out.logprobs[i], tok))
                req.out_top_logprobs.append(out.top_logprobs[i] or [])
            reason = self._check_finished(req, tok)
            if reason is not None:
                self._finish_running(req, reason)

    def _grammar_mask(self, reqs: list[Req]):
        idx = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not idx:
            return None
        from radixrt.runtime.constrained import allocate_token_bitmask, apply_token_bitmask_

        def apply(logits: torch.Tensor) -> None:
            mask = allocate_token_bitmask(len(idx), logits.shape[-1])
            for j, i in enumerate(idx):
                reqs[i].grammar.fill_next_token_bitmask(mask, j)
            if len(idx) == len(reqs):  # every row constrained: mask in place, no row copy
                apply_token_bitmask_(logits, mask)
                return
            sub = logits[idx]
            apply_token_bitmask_(sub, mask)
            logits[idx] = sub
        return apply

    def _check_finished(self, req: Req, tok: int) -> dict | None:
        p = req.params
        if req.grammar is not None:
            req.grammar.accept_token(tok)
        if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_ids):
            return {"type": "stop", "matched": tok}
        if req.grammar is not None and req.grammar.is_terminated():
            return {"type": "stop", "matched": None}
        if p.stop:
            tail_len = max(len(s) for s in p.stop) + 8
            tail = self.tokenizer.decode(req.output_ids[-tail_len:], skip_special_tokens=p.skip_special_tokens)
            for s in p.stop:
                if s in tail:
                    return {"type": "stop", "matched": s}
        if len(req.output_ids) >= req.max_new_tokens or req.seq_len >= self.runner.context_length:
            return {"type": "length", "length": len(req.output_ids)}
        return None

    # ---- results -------------------------------------------------------------------------------------
    def _finish_running(self, req: Req, reason: dict) -> None:
        self.running.remove(req)
        self.mem.release(req)
        self._finish(req, reason)

    def _finish(self, req: Req, reason: dict) -> None:
        req.finished_reason = reason
        self.by_rid.pop(req.rid, None)
        self.finished_outs.append(self._make_out(req, force=True))

    def _make_out(self, req: Req, force: bool = False) -> TokenOut | None:
        new = req.output_ids[req.sent_ids:]
        send_in = req.input_logprobs_done and not req.input_logprobs_sent and req.input_logprobs is not None
        if not new and not force and not send_in:
            return None
        req.sent_ids = len(req.output_ids)
        out = TokenOut(rid=req.rid, new_token_ids=new, finished_reason=req.finished_reason,
                       prompt_tokens=len(req.input_ids), completion_tokens=len(req.output_ids),
                       cached_tokens=req.cached_tokens, output_token_logprobs=req.out_logprobs,
                       output_top_logprobs=req.out_top_logprobs, stop_strings=list(req.params.stop),
                       no_stop_trim=req.params.no_stop_trim, skip_special_tokens=req.params.skip_special_tokens)
        req.out_logprobs, req.out_top_logprobs = [], []
        if req.input_logprobs is not None and (send_in or force) and not req.input_logprobs_sent:
            out.input_token_logprobs, out.input_top_logprobs = req.input_logprobs, req.input_top_logprobs
            req.input_logprobs_sent = True
        return out


def _eos_ids(tokenizer, config) -> set[int]:
    ids = set()
    for v in (getattr(tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None)):
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(v)
    return ids
