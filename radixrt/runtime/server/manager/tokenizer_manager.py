"""The main process's side of the runtime: validate and tokenize, send to the scheduler, fan results out.

- Requests are validated with :func:`build_requests` (the Engine's rules), including grammar specs, which
  are compiled by this process's own :class:`GrammarCache`: a bad spec is a 400 before anything is queued.
- One :class:`ReqBatch` per client call (one HTTP request, one DSL generate): its requests share one
  asyncio queue that the receive loop (:mod:`.ipc`) fills with the detokenizer's :class:`StrOut` s.
- The children are started, watched and restarted by :mod:`.supervisor`: if one dies, every pending
  request fails with :class:`ApiError` 503 naming it, and calls get 503 until the children are back.
- :mod:`.admission` bounds the requests in flight (503 + Retry-After) and drains on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Callable, Optional

from radixrt.runtime.tokenizer.generate_input import GenerateInput
from radixrt.runtime.config import ServerArgs
from radixrt.runtime.errors import ValidationError
from radixrt.runtime.io_struct import (
    AbortReq,
    CloseSessionReq,
    FlushCacheReq,
    GenerateReq,
    GetInfoReq,
    InfoOut,
    ReadyOut,
    StrOut,
)
from radixrt.runtime.server.manager.admission import Admission
from radixrt.runtime.server.manager.child_processes import ChildProcesses
from radixrt.runtime.server.manager.info import main_server_info
from radixrt.runtime.server.manager.ipc import Ipc
from radixrt.runtime.server.manager.supervisor import Supervisor
from radixrt.runtime.server.http.errors import ApiError
from radixrt.runtime.server.manager.req_batch import ReqBatch
from radixrt.runtime.server.observe.latency import LatencyWindow, record_output
from radixrt.runtime.tokenizer.validation import GrammarCheck, Limits, build_requests, max_token_chars

logger = logging.getLogger("radixrt.server")
EARLY_ABORT_S = 30.0  # how long an abort of a rid not yet submitted is kept
IDLE_START_S = 0.2  # the grammar backend starts at the first check this often that finds no request in flight


class TokenizerManager:
    def __init__(
        self,
        args: ServerArgs,
        model_name: str,
        metrics=None,
        children: Optional[ChildProcesses] = None,
        on_fatal: Optional[Callable[[], None]] = None,
    ):
        """``children``: already started (``radixrt serve`` starts them first); adopted by :meth:`start`.
        ``on_fatal``: called once a start-up failure means the server should exit (launch stops uvicorn)."""
        self.args = args
        self.model_name = args.served_model_name or model_name
        self.metrics = metrics
        self.latency = LatencyWindow()  # recent TTFT / ITL samples for /cache_tree and the dashboard
        self.tokenizer = None
        self.limits: Optional[Limits] = None
        self.grammar_cache = None
        self._grammar_vocab: Optional[int] = None  # the vocabulary size grammar_cache was made for
        self.ready_info: Optional[ReadyOut] = None
        self.ready: Optional[asyncio.Event] = None
        self.dead: Optional[str] = None  # why the runtime cannot serve (a child died, or the model failed)
        self.fatal: Optional[str] = None  # a start-up failure: the server should exit
        self.on_fatal = on_fatal
        self.states: dict[str, ReqBatch] = {}
        self.early_aborts: dict[str, float] = {}  # rid -> monotonic time of an abort that came before it
        self.session_ids: set[str] = set()  # opened here and not closed (the scheduler also expires TTLs)
        self.children: Optional[ChildProcesses] = children
        self.ipc: Optional[Ipc] = None
        self.closing = False
        self._tasks: list[asyncio.Task] = []
        self.supervisor = Supervisor(self)
        self.admission = Admission(args.max_running_requests, args.max_queued_requests)

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the IPC sockets, spawn the scheduler and detokenizer processes, start the receive loop."""
        self.ready = asyncio.Event()
        self._tokenizer_task = asyncio.create_task(asyncio.to_thread(self._load_tokenizer))
        self.supervisor.spawn()

    def spawn_task(self, coro, name: Optional[str] = None) -> asyncio.Task:
        """Run ``coro`` as a task of this manager's: :meth:`shutdown` cancels it."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        return task

    def _load_tokenizer(self) -> None:
        from radixrt.runtime.models.loader import load_tokenizer

        self.tokenizer = load_tokenizer(self.args.model)

    async def on_ready(self, r: ReadyOut) -> None:
        if r.error is not None:
            self.set_fatal(f"the model failed to load: {r.error}")
            return
        try:
            await self._tokenizer_task
        except Exception as e:
            logger.exception("tokenizer set-up failed")
            self.set_fatal(f"tokenizer set-up failed: {type(e).__name__}: {e}")
            return
        from radixrt.runtime.scheduler.build import make_grammar_cache

        # the grammar backend (seconds of CPU at a large vocabulary) on its own thread once no request is in
        # flight, or at the first compile: built beside the scheduler's load or the first requests it
        # delayed their tokens on few cores (CPU and this process's GIL); a compile waits for it, and a failed
        # build fails each constrained request with its cause (a 400)
        if self.grammar_cache is None or self._grammar_vocab != r.vocab_size:  # once, unless a restart differs
            if self.grammar_cache is not None:
                self.grammar_cache.shutdown(wait=False)
            self.grammar_cache = make_grammar_cache(
                self.args, self.tokenizer, r.vocab_size, masks=False, deferred=True, start=False
            )
            self._grammar_vocab = r.vocab_size
            if self.grammar_cache is not None:
                self.spawn_task(self._start_grammar_when_idle(self.grammar_cache))
        self.limits = Limits(r.context_length, r.vocab_size, r.max_total_tokens, max_token_chars(self.tokenizer))
        self.admission.set_pool(r.max_total_tokens // max(r.page_size, 1))
        self.ready_info = r
        if not self.args.served_model_name:
            self.model_name = r.model_name
        self.ready.set()

    async def _start_grammar_when_idle(self, cache) -> None:
        while True:
            await asyncio.sleep(IDLE_START_S)
            if not self.states:
                cache.start()
                return

    def set_fatal(self, msg: str) -> None:
        logger.error("%s", msg)
        self.fatal = msg
        self.fail(msg)
        if self.on_fatal is not None:
            self.on_fatal()

    def connect(self, children: ChildProcesses, ipc: Ipc) -> None:
        """Serve through ``children`` over ``ipc`` (the supervisor's start and each restart)."""
        self.children, self.ipc = children, ipc

    def revive(self) -> None:
        """The restarted children are ready: serve again."""
        self.dead = None

    def fail(self, msg: str, newer: bool = False) -> None:
        """Mark the runtime dead and wake every waiter with a 503. The first reason is kept, unless the
        reason is ``newer`` (a later death, the supervisor giving up)."""
        if self.dead is None or newer:
            self.dead = msg
        err = ApiError(msg, status=503, type="service_unavailable")
        for batch in {id(b): b for b in self.states.values()}.values():
            batch.queue.put_nowait(err)
        self.states.clear()
        if self.ipc is not None:
            self.ipc.fail_waiters(err)

    def begin_shutdown(self) -> None:
        """Signal received: fail pending requests so open streams end, then uvicorn stops."""
        self.closing = True
        self.fail("the server is shutting down")

    async def shutdown(self) -> None:
        self.closing = True
        for t in self._tasks:
            t.cancel()
        self.fail("the server is shutting down")
        self.stop_processes()
        if self.ipc is not None:
            self.ipc.close()

    def stop_processes(self, timeout: float = 5.0) -> None:
        """Terminate the children (SIGTERM, then SIGKILL) and remove the IPC folder. Idempotent, sync."""
        self.closing = True
        if self.children is not None:
            self.children.stop(timeout)
        if self.grammar_cache is not None:
            self.grammar_cache.shutdown(wait=False)
            self.grammar_cache = None

    # ---- receiving ---------------------------------------------------------------------------------
    def dispatch(self, outs: list[StrOut]) -> None:
        """Route each StrOut to its call's queue; record TTFT / ITL / finish metrics (seconds)."""
        now = time.perf_counter()
        for s in outs:
            batch = self.states.get(s.rid)
            if batch is None:
                continue  # an aborted call whose client is gone
            record_output(s, batch.t_submit, batch.t_last, now, self.latency, self.metrics)
            if s.token.finished_reason is not None:
                del self.states[s.rid]
            batch.queue.put_nowait(s)

    # ---- requests ----------------------------------------------------------------------------------
    def check_ready(self) -> None:
        """Raises ApiError 503 when the runtime cannot take requests."""
        if self.dead is not None:
            raise ApiError(self.dead, status=503, type="service_unavailable")
        if self.ready is None or not self.ready.is_set():
            raise ApiError(
                "the model is still loading; retry when GET /health returns 200", status=503, type="service_unavailable"
            )

    async def build(self, inp: GenerateInput) -> tuple[list[GenerateReq], bool]:
        """Validate and tokenize ``inp`` (the Engine's rules); grammar specs are compiled here first.

        Raises:
            ValidationError: bad input (``param`` names the field).
            ApiError: 503 when not ready.
        """
        self.check_ready()
        check = GrammarCheck(self.grammar_cache)
        reqs, single = build_requests(self.tokenizer, self.limits, inp, check)
        sp = reqs[0].session_params if reqs else None
        sid = sp.id if sp is not None else inp.session_id
        if sid is not None and sid not in self.session_ids:
            param = "session_params" if sp is not None else "session_id"
            raise ValidationError(f"{param}: no open session {sid!r} (POST /open_session first)", param)
        if not reqs:
            field = "text" if inp.prompt is not None else "input_ids"
            raise ValidationError(f"{field}: the batch is empty", field)
        await check.wait_async()
        return reqs, single

    async def submit(
        self, reqs: list[GenerateReq], lp_text: bool = False, rename: Optional[Callable[[str], str]] = None
    ) -> ReqBatch:
        """Queue validated requests; ``rename``: the caller's name of a field the scheduler refuses
        (``ReqBatch``). Raises ValidationError (rid in use) or ApiError 503."""
        self.check_ready()
        self.admission.check(len(self.states), len(reqs))
        rids = [r.rid for r in reqs]
        if len(set(rids)) != len(rids):
            raise ValidationError(f"rid: the ids of one call must differ: {rids}", "rid")
        if any(r in self.states for r in rids):
            raise ValidationError(f"rid: a request id is already in use: {rids}", "rid")
        # Encoded before any rid is counted in flight: a 400 here (an int beyond 64 bits) must not leave an
        # entry in ``states`` that nothing will ever finish (the SIGTERM drain would wait its full timeout).
        frames = [self.ipc.encode(r) for r in reqs]
        batch = ReqBatch(self, reqs, lp_text, rename)
        for r in reqs:
            self.states[r.rid] = batch
        sent = 0
        try:
            for r, frame in zip(reqs, frames):
                await self.ipc.send_frame(frame)
                sent += 1
                if self.early_aborts.pop(r.rid, None) is not None:  # aborted while still being validated
                    self.abort(r.rid)
        except BaseException:  # cancelled mid-send: unsent rids leave the count, sent ones are aborted
            for i, r in enumerate(reqs):
                if i >= sent:
                    self.states.pop(r.rid, None)
                else:
                    self.abort(r.rid)
            raise
        return batch

    def abort(self, rid: str) -> None:
        """Ask the scheduler to abort ``rid`` (its pages are freed); synchronous, never raises. A rid not
        yet submitted (its call still validating) is remembered for ``EARLY_ABORT_S`` seconds."""
        if self.dead is not None:
            return
        if rid not in self.states:
            now = time.monotonic()
            self.early_aborts = {k: t for k, t in self.early_aborts.items() if now - t < EARLY_ABORT_S}
            if len(self.early_aborts) < 10_000:
                self.early_aborts[rid] = now
            return
        try:
            self.ipc.send_nowait(AbortReq(rid))
        except Exception:
            logger.exception("could not send abort for %s", rid)

    async def _ask(self, msg, timeout: float = 60.0) -> InfoOut:
        if self.dead is not None:
            raise ApiError(self.dead, status=503, type="service_unavailable")
        try:
            return await self.ipc.ask(msg, timeout)
        except asyncio.TimeoutError:
            raise ApiError(
                f"the scheduler did not answer within {timeout:.0f} s", status=503, type="service_unavailable"
            ) from None

    async def get_info(self, top: int = 0) -> InfoOut:
        """The scheduler's state; ``top`` > 0 adds the tree summary (``InfoOut.tree``)."""
        self.check_ready()
        return await self._ask(GetInfoReq(top=top))

    async def flush_cache(self) -> bool:
        self.check_ready()
        return bool((await self._ask(FlushCacheReq())).flushed)

    async def server_info(self) -> dict:
        """ServerArgs plus ``cache`` (pages and hit tokens) and queue lengths (the Engine's shape), the
        version, the pid of each process, and ``num_in_flight``: requests this process has admitted and not
        yet seen finish (what admission control bounds and the SIGTERM drain waits for)."""
        return main_server_info(self, await self.get_info())

    async def open_session(self, body: Any) -> str:
        """SGLang's /open_session: ``{capacity_of_str_len, session_id?, timeout?}`` -> the session id.

        Raises:
            ValidationError: a bad field, or ``session_id`` already open.
        """
        from radixrt.runtime.tokenizer.session_args import open_session_body

        r = open_session_body(body)
        self.check_ready()
        sid = (await self._ask(r)).session_id
        if sid is None:
            raise ValidationError(f"session {r.session_id!r} is already open", "session_id")
        self.session_ids.add(sid)
        return sid

    async def close_session(self, session_id: Any) -> bool:
        """SGLang's /close_session; its pinned pages become evictable. False when it was not open."""
        from radixrt.runtime.tokenizer.session_args import check_session_id

        if check_session_id(session_id) is None:
            raise ValidationError("session_id is required", "session_id")
        self.check_ready()
        self.session_ids.discard(session_id)
        return bool((await self._ask(CloseSessionReq(session_id=session_id))).flushed)

    async def health_generate(self, timeout: float = 30.0) -> dict:
        """Run a 1-token greedy generation; returns its output. Raises ApiError 503 on failure."""
        health = GenerateInput(
            input_ids=[1], sampling_params={"max_new_tokens": 1, "temperature": 0}, rid=f"health-{uuid.uuid4().hex}"
        )
        reqs, _ = await self.build(health)
        batch = await self.submit(reqs)
        try:
            outs = await asyncio.wait_for(batch.wait(), timeout)
        except asyncio.TimeoutError:
            batch.abort_unfinished()
            raise ApiError(
                f"a 1-token generation did not finish within {timeout:.0f} s", status=503, type="service_unavailable"
            ) from None
        return outs[0].to_dict(False)
