"""Engine: the offline, in-process API, with SGLang's ``Engine`` call shapes.

The scheduler runs in a background thread; ``generate`` may be called from many threads at once
(the DSL's ``run_batch`` does), and every request joins the same continuous batch.

    engine = Engine()                                   # SmolLM2-135M-Instruct, CPU, fp32
    engine.generate("The capital of France is", {"max_new_tokens": 16, "temperature": 0})
    engine.generate(["a", "b"], {...})                  # a list in, a list out
    for chunk in engine.generate("...", {...}, stream=True): ...   # chunk["text"] is cumulative
    engine.shutdown()
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Iterator

from radixrt.runtime.tokenizer.generate_input import GenerateInput
from radixrt.runtime.scheduler.build import build_scheduler
from radixrt.runtime.config import ServerArgs
from radixrt.runtime.tokenizer.detokenizer import Detokenizer
from radixrt.runtime.errors import refused
from radixrt.runtime.io_struct import AbortReq, CloseSessionReq, FlushCacheReq, GenerateReq, StrOut, TokenOut
from radixrt.runtime.tokenizer.validation import Limits, ReqOutput, build_requests, max_token_chars

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, **kwargs: Any):
        """Keyword arguments are :class:`ServerArgs` fields (``model``, ``page_size``, ...).

        Raises:
            ValueError: an unknown or bad argument, or an unsupported model.
        """
        unknown = set(kwargs) - set(ServerArgs.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown Engine argument(s) {sorted(unknown)}")
        self.args = ServerArgs(**kwargs)
        if self.args.tp > 1 or self.args.dp > 1:
            raise ValueError(
                "tp and dp > 1 need processes: use `radixrt serve --tp N` / `--dp N` (the Engine "
                "runs one rank in this process)"
            )
        self.scheduler = build_scheduler(self.args)
        s = self.scheduler
        self.tokenizer, self.runner, self.grammar_cache = s.tokenizer, s.runner, s.grammar_cache
        self.detokenizer = Detokenizer(self.tokenizer)
        self.limits = Limits(
            self.runner.context_length,
            self.runner.vocab_size,
            self.runner.num_pages * self.runner.page_size,
            max_token_chars(self.tokenizer),
        )
        self._inbox: queue.Queue = queue.Queue()
        self._outs: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="radixrt-scheduler", daemon=True)
        self._thread.start()

    # ---- the scheduler thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                block = not self.scheduler.has_work
                try:
                    while True:
                        self._handle(self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait())
                        block = False
                except queue.Empty:
                    pass
                for o in self.scheduler.run_once():
                    self._deliver(self.detokenizer.handle_one(o))
        except BaseException as e:  # surface the failure to every waiting caller instead of hanging
            logger.exception("scheduler thread died")
            self._error = e
            with self._lock:
                for q in self._outs.values():
                    q.put(e)

    def _handle(self, msg) -> None:
        if isinstance(msg, tuple):  # (callable, reply queue): an API call run in the scheduler thread
            fn, reply = msg
            try:
                reply.put(fn())
            except Exception as e:
                reply.put(e)
            return
        out = self.scheduler.handle(msg)  # a request or an abort: a reply only for a refused request
        if isinstance(out, TokenOut):
            self._deliver(self.detokenizer.handle_one(out))

    def _deliver(self, s: StrOut) -> None:
        with self._lock:
            q = self._outs.get(s.rid)
        if q is not None:
            q.put((time.perf_counter(), s))

    def _check_alive(self) -> None:
        """Raises RuntimeError once the scheduler has stopped (an error, or :meth:`shutdown`): nothing
        would answer a request sent to it."""
        if self._error is not None:
            raise RuntimeError(f"the scheduler has stopped: {self._error!r}")
        if self._stop.is_set():
            raise RuntimeError("the engine is shut down")

    def _call(self, fn):
        self._check_alive()
        reply: queue.Queue = queue.Queue()
        self._inbox.put((fn, reply))
        r = reply.get()
        if isinstance(r, Exception):
            raise r
        return r

    # ---- public API ---------------------------------------------------------------------------------
    def grammar_check(self, kind: str, spec: str, any_whitespace: bool = False) -> str:
        """Validate and compile a grammar (cached); returns the normalized spec text (the cache key).

        Raises:
            ValidationError: a bad spec (a ValueError; ``param`` is ``kind``).
        """
        from radixrt.runtime.tokenizer.validation import GrammarCheck

        check = GrammarCheck(self.grammar_cache)
        spec = check(kind, spec, any_whitespace)
        check.wait()
        return spec

    def generate(
        self,
        prompt=None,
        sampling_params=None,
        input_ids=None,
        return_logprob: bool = False,
        logprob_start_len=None,
        top_logprobs_num: int = 0,
        stream: bool = False,
        rid=None,
        cache_salt: str | None = None,
        return_text_in_logprobs: bool = False,
        session_params: dict | None = None,
        session_id: str | None = None,
    ):
        """Generate for one prompt (a dict back) or a list (a list back).

        ``sampling_params`` keys: max_new_tokens (default 128; None = the room left in the context or the KV pool;
        0 = prefill only), min_new_tokens, temperature (0 = greedy), top_p, top_k, min_p,
        frequency_penalty, presence_penalty, repetition_penalty, stop, stop_token_ids, ignore_eos,
        seed, json_schema, regex, ebnf, choices, structural_tag.

        ``session_params`` ({id, rid, offset, replace, drop_previous_output}, SGLang's) appends the prompt to
        an open session's history; ``session_id`` marks a prompt that already holds the history. Either
        way the session pins the KV when the request finishes (see :meth:`open_session`).

        Raises:
            ValueError: bad input, before anything is queued; or a ``ValidationError`` once the scheduler
                refused a request (a bad session field: unknown session or ``rid``, capacity exceeded).
        """
        inp = GenerateInput(
            prompt=prompt,
            input_ids=input_ids,
            sampling_params=sampling_params,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            stream=stream,
            rid=rid,
            cache_salt=cache_salt,
            session_params=session_params,
            session_id=session_id,
        )
        reqs, single = build_requests(self.tokenizer, self.limits, inp, self.grammar_check)
        if stream:
            if not single:
                raise ValueError("stream=True takes one prompt")
            return self._stream(reqs[0], return_logprob, return_text_in_logprobs)
        accs = [ReqOutput(r.rid, self.tokenizer, return_text_in_logprobs) for r in reqs]
        qs = [self._submit(r) for r in reqs]
        outs = [self._collect(a, q, return_logprob) for a, q in zip(accs, qs)]
        for a in accs:
            error = refused(a.finished_reason)
            if error is not None:
                raise error
        return outs[0] if single else outs

    def _submit(self, r: GenerateReq) -> queue.Queue:
        self._check_alive()
        q: queue.Queue = queue.Queue()
        with self._lock:
            if r.rid in self._outs:
                raise ValueError(f"rid {r.rid!r} is already in use")
            self._outs[r.rid] = q
        self._inbox.put(r)
        return q

    def _next(self, rid: str, q: queue.Queue) -> tuple[StrOut, float]:
        item = q.get()
        if isinstance(item, BaseException):
            raise RuntimeError(f"the scheduler has stopped: {item!r}")
        t, s = item
        if s.token.finished_reason is not None:
            with self._lock:
                self._outs.pop(rid, None)
        return s, t

    def _collect(self, acc: ReqOutput, q: queue.Queue, lp: bool) -> dict:
        while not acc.finished:
            acc.add(*self._next(acc.rid, q))
        return acc.to_dict(lp)

    def _stream(self, r: GenerateReq, lp: bool, lp_text: bool) -> Iterator[dict]:
        acc = ReqOutput(r.rid, self.tokenizer, lp_text)
        q = self._submit(r)
        try:
            while not acc.finished:
                acc.add(*self._next(r.rid, q))
                yield acc.to_dict(lp)
        finally:
            if not acc.finished:  # the caller stopped iterating: abort, free its pages
                self.abort(r.rid)

    def open_session(
        self, capacity_of_str_len: int = 0, session_id: str | None = None, timeout: float | None = None
    ) -> str:
        """Open an agent session (SGLang's ``open_session``); returns its id.

        Args:
            capacity_of_str_len: the most tokens of context a session request may reach (0: no cap).
            session_id: the id to use (default: a fresh uuid).
            timeout: seconds of idleness after which the session closes and unpins (None: never).

        Raises:
            ValidationError: ``session_id`` is already open, or a bad argument (a ValueError).
        """
        from radixrt.runtime.errors import ValidationError
        from radixrt.runtime.tokenizer.session_args import check_open_session

        r = check_open_session(capacity_of_str_len, session_id, timeout)
        sid = self._call(lambda: self.scheduler.handle(r)).session_id
        if sid is None:
            raise ValidationError(f"session {session_id!r} is already open", "session_id")
        return sid

    def close_session(self, session_id: str) -> bool:
        """Close a session; its pinned pages become evictable. False when it was not open."""
        return self._call(lambda: self.scheduler.handle(CloseSessionReq(session_id=session_id))).flushed

    def abort(self, rid: str) -> None:
        self._inbox.put(AbortReq(rid))

    def flush_cache(self) -> bool:
        """Free every cached page that no request uses. False while requests are running."""
        return self._call(lambda: self.scheduler.handle(FlushCacheReq())).flushed

    def get_server_info(self) -> dict:
        """ServerArgs plus ``cache`` (pages and hit tokens) and queue lengths."""
        from radixrt.runtime.scheduler.server_info import queue_stats, server_info

        return self._call(
            lambda: server_info(
                self.args,
                queue_stats(self.scheduler),
                self.runner.context_length,
                self.limits.max_total_tokens,
                self.runner.source.name,
            )
        )

    def check_invariants(self) -> dict:
        """Run in the scheduler thread: free + evictable + protected + private == total, locks consistent.

        Returns the cache stats. Raises AssertionError on a violation.
        """

        def check():
            s = self.scheduler
            st = s.cache_stats()
            total = st["free_pages"] + st["evictable_pages"] + st["protected_pages"] + st["private_pages"]
            assert total == st["total_pages"], f"page accounting broken: {st}"
            if s.tree is not None:
                s.tree.check_invariants()
                if s.req_pages.hicache is not None:
                    s.req_pages.hicache.check_invariants()
                if not s.running and not st["pinned_sessions"]:
                    assert s.tree.all_locks_released(), "a lock_ref is above 0 while idle"
            return st

        return self._call(check)

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.scheduler.req_pages.hicache is not None:
            self.scheduler.req_pages.hicache.close()
        if self.grammar_cache is not None:
            self.grammar_cache.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
