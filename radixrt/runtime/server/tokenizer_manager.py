"""The main process's side of the runtime: validate and tokenize, send to the scheduler, fan results out.

- Requests are validated with :func:`build_requests` (the Engine's rules), including grammar specs, which
  are compiled by this process's own :class:`GrammarCache`: a bad spec is a 400 before anything is queued.
- One :class:`ReqBatch` per client call (one HTTP request, one DSL generate): its requests share one
  asyncio queue that the receive loop fills with the detokenizer's :class:`StrOut` s.
- Info and flush replies come back in the order they were asked (the scheduler answers in order through
  the detokenizer's single pipe), so they are matched first-in, first-out.
- If the scheduler or the detokenizer process dies, every pending request and every later one fails with
  :class:`ApiError` 503 and a message; nothing hangs.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import uuid
from collections import deque
from typing import Any, AsyncIterator, Optional

import msgspec
import zmq
import zmq.asyncio

from radixrt.runtime.config import ServerArgs
from radixrt.runtime.validation import Limits, ReqOutput, build_requests
from radixrt.runtime.io_struct import (AbortReq, BatchStrOut, DetokenizerOutput, FlushCacheReq, GenerateReq,
                                      GetInfoReq, InfoOut, ReadyOut, StrOut)
from radixrt.runtime.server.openai_protocol import ApiError

logger = logging.getLogger("radixrt.server")

# Keys of the native /generate body (also the DSL's generate body).
GENERATE_KEYS = ("text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
                 "top_logprobs_num", "return_text_in_logprobs", "stream", "rid", "cache_salt")
NATIVE_PARAMS = {"text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
                 "stream", "rid", "cache_salt", "max_new_tokens", "min_new_tokens", "temperature", "top_p",
                 "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "stop",
                 "stop_token_ids", "ignore_eos", "skip_special_tokens", "no_stop_trim", "seed", "json_schema",
                 "regex", "ebnf", "structural_tag", "any_whitespace", "choices", "sampling_params"}


def native_param(msg: str) -> Optional[str]:
    """The field a validation message of :func:`build_requests` is about (its first word), if any."""
    head = msg.split(":", 1)[0].split(" ", 1)[0]
    if head in NATIVE_PARAMS:
        return head
    if msg.startswith("the prompt has") or msg.startswith("exactly one of"):
        return "text"
    if msg.startswith("the request needs"):
        return "max_new_tokens"
    for kind in ("json_schema", "regex", "ebnf", "structural_tag"):
        if f"compile {kind}" in msg:
            return kind
    if msg.startswith("unknown sampling parameter"):
        return "sampling_params"
    if msg.startswith("only one of"):
        return "sampling_params"
    return None


class ReqBatch:
    """The requests of one client call. ``outs[i]`` accumulates request i's output."""

    def __init__(self, tm: "TokenizerManager", reqs: list[GenerateReq], lp_text: bool):
        self.tm = tm
        self.reqs = reqs
        self.index = {r.rid: i for i, r in enumerate(reqs)}
        self.outs = [ReqOutput(r.rid, tm.tokenizer, lp_text) for r in reqs]
        self.queue: asyncio.Queue = asyncio.Queue()
        self.unfinished = len(reqs)
        now = time.perf_counter()
        self.t_submit = now
        self.t_last = {r.rid: None for r in reqs}

    @property
    def finished(self) -> bool:
        return self.unfinished == 0

    async def next(self) -> tuple[int, StrOut]:
        """The next output of any of the requests: ``(index, StrOut)``; it is already added to ``outs``.

        Raises:
            ApiError: 503, the scheduler or detokenizer process died.
        """
        item = await self.queue.get()
        if isinstance(item, BaseException):
            raise item
        i = self.index[item.rid]
        self.outs[i].add(item)
        if item.token.finished_reason is not None:
            self.unfinished -= 1
        return i, item

    async def wait(self) -> list[ReqOutput]:
        while not self.finished:
            await self.next()
        return self.outs

    def abort_unfinished(self) -> None:
        """Abort every request of the call that has not finished (client gone). Synchronous, idempotent."""
        for o in self.outs:
            if not o.finished:
                self.tm.abort(o.rid)


class NativeCall:
    """A /generate call (HTTP or DSL) after validation: ``result()`` or ``chunks()``."""

    def __init__(self, batch: ReqBatch, single: bool, stream: bool, return_logprob: bool):
        self.batch, self.single, self.stream, self.return_logprob = batch, single, stream, return_logprob

    async def result(self) -> Any:
        outs = await self.batch.wait()
        ds = [o.to_dict(self.return_logprob) for o in outs]
        return ds[0] if self.single else ds

    async def chunks(self) -> AsyncIterator[dict]:
        """Streaming (one prompt): one cumulative dict per update, the last one finished."""
        o = self.batch.outs[0]
        while not self.batch.finished:
            await self.batch.next()
            yield o.to_dict(self.return_logprob)


class TokenizerManager:
    def __init__(self, args: ServerArgs, model_name: str, metrics=None):
        self.args = args
        self.model_name = args.served_model_name or model_name
        self.metrics = metrics
        self.tokenizer = None
        self.limits: Optional[Limits] = None
        self.grammar_cache = None
        self.ready_info: Optional[ReadyOut] = None
        self.ready: Optional[asyncio.Event] = None
        self.dead: Optional[str] = None   # why the runtime cannot serve (a child died, or the model failed)
        self.fatal: Optional[str] = None  # a start-up failure: the server should exit
        self.on_fatal = None              # callback set by launch (stops uvicorn)
        self.states: dict[str, ReqBatch] = {}
        self.info_waiters: deque[asyncio.Future] = deque()
        self.procs: dict[str, Any] = {}
        self.closing = False
        self.ipc_dir: Optional[str] = None
        self._tasks: list[asyncio.Task] = []
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(DetokenizerOutput)

    # ---- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the IPC sockets, spawn the scheduler and detokenizer processes, start the receive loop."""
        from radixrt.runtime.detokenizer_process import run_detokenizer_process
        from radixrt.runtime.scheduler_process import run_scheduler_process

        loop = asyncio.get_running_loop()
        self.ready = asyncio.Event()
        self.ipc_dir = tempfile.mkdtemp(prefix="radixrt-")
        addr = {n: f"ipc://{os.path.join(self.ipc_dir, n)}" for n in ("scheduler", "detokenizer", "main")}
        self.ctx = zmq.asyncio.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.bind(addr["scheduler"])
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(addr["main"])
        spawn = mp.get_context("spawn")
        child_args = msgspec.json.encode(dataclasses.replace(self.args, api_key=None))
        pid = os.getpid()
        self.procs["scheduler"] = spawn.Process(
            target=run_scheduler_process, name="radixrt-scheduler", daemon=True,
            args=(child_args, addr["scheduler"], addr["detokenizer"], pid))
        self.procs["detokenizer"] = spawn.Process(
            target=run_detokenizer_process, name="radixrt-detokenizer", daemon=True,
            args=(self.args.model, self.args.log_level, addr["detokenizer"], addr["main"], pid))
        for name, p in self.procs.items():
            p.start()
            loop.add_reader(p.sentinel, self._on_child_exit, name)
        self._tasks.append(asyncio.create_task(self._recv_loop(), name="radixrt-recv"))
        self._tokenizer_task = asyncio.create_task(asyncio.to_thread(self._load_tokenizer))

    def _load_tokenizer(self) -> None:
        from radixrt.runtime.model_loader import load_tokenizer
        self.tokenizer = load_tokenizer(self.args.model)

    def _make_grammar_cache(self, vocab_size: int) -> None:
        from radixrt.runtime.engine import make_grammar_cache
        self.grammar_cache = make_grammar_cache(self.args, self.tokenizer, vocab_size)

    async def _on_ready(self, r: ReadyOut) -> None:
        if r.error is not None:
            self._set_fatal(f"the model failed to load: {r.error}")
            return
        try:
            await self._tokenizer_task
            await asyncio.to_thread(self._make_grammar_cache, r.vocab_size)
        except Exception as e:
            logger.exception("tokenizer / grammar set-up failed")
            self._set_fatal(f"tokenizer or grammar backend set-up failed: {type(e).__name__}: {e}")
            return
        self.limits = Limits(r.context_length, r.vocab_size, r.max_total_tokens)
        self.ready_info = r
        if not self.args.served_model_name:
            self.model_name = r.model_name
        self.ready.set()

    def _set_fatal(self, msg: str) -> None:
        logger.error("%s", msg)
        self.fatal = msg
        self._fail(msg)
        if self.on_fatal is not None:
            self.on_fatal()

    def _on_child_exit(self, name: str) -> None:
        p = self.procs[name]
        asyncio.get_running_loop().remove_reader(p.sentinel)
        p.join(timeout=0)
        if self.closing:
            return
        msg = f"the {name} process exited unexpectedly (exit code {p.exitcode}); restart the server"
        logger.error("%s", msg)
        if self.ready is not None and not self.ready.is_set():
            self._set_fatal(msg)
        else:
            self._fail(msg)

    def _fail(self, msg: str) -> None:
        """Mark the runtime dead and wake every waiter with a 503."""
        if self.dead is None:
            self.dead = msg
        err = ApiError(msg, status=503, type="service_unavailable")
        for batch in {id(b): b for b in self.states.values()}.values():
            batch.queue.put_nowait(err)
        self.states.clear()
        while self.info_waiters:
            f = self.info_waiters.popleft()
            if not f.done():
                f.set_exception(err)

    def begin_shutdown(self) -> None:
        """Signal received: fail pending requests so open streams end, then uvicorn stops."""
        self.closing = True
        self._fail("the server is shutting down")

    async def shutdown(self) -> None:
        self.closing = True
        for t in self._tasks:
            t.cancel()
        self._fail("the server is shutting down")
        self.stop_processes()
        try:
            self.push.close(linger=0)
            self.pull.close(linger=0)
            self.ctx.term()
        except Exception:
            pass

    def stop_processes(self, timeout: float = 5.0) -> None:
        """Terminate the children (SIGTERM, then SIGKILL) and remove the IPC folder. Idempotent, sync."""
        self.closing = True
        for p in self.procs.values():
            if p.is_alive():
                p.terminate()
        deadline = time.time() + timeout
        for p in self.procs.values():
            p.join(timeout=max(deadline - time.time(), 0.1))
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        if self.ipc_dir:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            self.ipc_dir = None
        if self.grammar_cache is not None:
            self.grammar_cache.shutdown(wait=False)
            self.grammar_cache = None

    # ---- receiving ---------------------------------------------------------------------------------
    async def _recv_loop(self) -> None:
        while True:
            frame = await self.pull.recv()
            try:
                msg = self._dec.decode(frame)
            except msgspec.DecodeError:
                logger.exception("undecodable message from the detokenizer")
                continue
            if isinstance(msg, BatchStrOut):
                self._dispatch(msg.outs)
            elif isinstance(msg, InfoOut):
                while self.info_waiters:
                    f = self.info_waiters.popleft()
                    if not f.done():  # a waiter that timed out still consumes its own reply
                        f.set_result(msg)
                        break
                    else:
                        continue
            elif isinstance(msg, ReadyOut):
                self._tasks.append(asyncio.create_task(self._on_ready(msg)))

    def _dispatch(self, outs: list[StrOut]) -> None:
        now = time.perf_counter()
        m = self.metrics
        for s in outs:
            batch = self.states.get(s.rid)
            if batch is None:
                continue  # an aborted call whose client is gone
            t = s.token
            if m is not None and t.new_token_ids:
                last = batch.t_last[s.rid]
                if last is None:
                    m.observe_ttft(now - batch.t_submit)
                    if len(t.new_token_ids) > 1:
                        m.observe_itl(0.0, len(t.new_token_ids) - 1)
                else:
                    m.observe_itl((now - last) / len(t.new_token_ids), len(t.new_token_ids))
                batch.t_last[s.rid] = now
            if t.finished_reason is not None:
                del self.states[s.rid]
                if m is not None:
                    m.observe_finish(now - batch.t_submit, t.prompt_tokens, t.completion_tokens,
                                     t.cached_tokens, t.finished_reason.get("type", "stop"))
            batch.queue.put_nowait(s)

    # ---- requests ----------------------------------------------------------------------------------
    def check_ready(self) -> None:
        """Raises ApiError 503 when the runtime cannot take requests."""
        if self.dead is not None:
            raise ApiError(self.dead, status=503, type="service_unavailable")
        if self.ready is None or not self.ready.is_set():
            raise ApiError("the model is still loading; retry when GET /health returns 200", status=503,
                           type="service_unavailable")

    async def build(self, prompt=None, input_ids=None, sampling_params=None, return_logprob=False,
                    logprob_start_len=None, top_logprobs_num=0, stream=False, rid=None,
                    cache_salt=None) -> tuple[list[GenerateReq], bool]:
        """Validate and tokenize (the Engine's rules); grammar specs are compiled here first.

        Raises:
            ValueError: bad input (the message names the field).
            ApiError: 503 when not ready.
        """
        self.check_ready()
        from radixrt.runtime.constrained import validate_spec
        futures = []

        def grammar_check(kind, spec, any_whitespace=False):
            if self.grammar_cache is None:
                raise ValueError(f"{kind}: grammar-constrained decoding is off (grammar_backend='none')")
            spec = validate_spec(kind, spec)
            futures.append(self.grammar_cache.submit(kind, spec, any_whitespace))
            return spec

        reqs, single = build_requests(self.tokenizer, self.limits, prompt, input_ids, sampling_params,
                                      return_logprob, logprob_start_len, top_logprobs_num, stream, rid,
                                      cache_salt, grammar_check)
        if not reqs:
            raise ValueError("text: the batch is empty" if prompt is not None else "input_ids: the batch is empty")
        for f in futures:
            await asyncio.wrap_future(f)  # ValueError on a spec that does not compile
        return reqs, single

    async def submit(self, reqs: list[GenerateReq], lp_text: bool = False) -> ReqBatch:
        """Queue validated requests. Raises ValueError (rid in use) or ApiError 503."""
        self.check_ready()
        rids = [r.rid for r in reqs]
        if len(set(rids)) != len(rids) or any(r in self.states for r in rids):
            raise ValueError(f"rid: a request id is already in use: {rids}")
        batch = ReqBatch(self, reqs, lp_text)
        for r in reqs:
            self.states[r.rid] = batch
        for r in reqs:
            await self.push.send(self._enc.encode(r))
        return batch

    def abort(self, rid: str) -> None:
        """Ask the scheduler to abort ``rid`` (its pages are freed); synchronous, never raises."""
        if self.dead is not None or rid not in self.states:
            return
        try:
            self.push.send(self._enc.encode(AbortReq(rid)))
        except Exception:
            logger.exception("could not send abort for %s", rid)

    async def _ask(self, msg, timeout: float = 60.0) -> InfoOut:
        if self.dead is not None:
            raise ApiError(self.dead, status=503, type="service_unavailable")
        fut = asyncio.get_running_loop().create_future()
        self.info_waiters.append(fut)
        await self.push.send(self._enc.encode(msg))
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            fut.cancel()
            raise ApiError(f"the scheduler did not answer within {timeout:.0f} s", status=503,
                           type="service_unavailable") from None

    async def get_info(self) -> InfoOut:
        self.check_ready()
        return await self._ask(GetInfoReq())

    async def flush_cache(self) -> bool:
        self.check_ready()
        return bool((await self._ask(FlushCacheReq())).flushed)

    async def server_info(self) -> dict:
        """ServerArgs plus ``cache`` (pages and hit tokens) and queue lengths (the Engine's shape)."""
        info = await self.get_info()
        r = self.ready_info
        return {**self.args.to_dict(), "cache": info.cache, "num_running": info.num_running,
                "num_waiting": info.num_waiting, "context_length": r.context_length,
                "max_total_tokens": r.max_total_tokens, "model_name": self.model_name,
                "version": _version(), "process_ids": {"main": os.getpid(),
                                                       **{n: p.pid for n, p in self.procs.items()}}}

    # ---- the native API (/generate and the DSL socket) ------------------------------------------------
    async def native_generate(self, body: Any) -> NativeCall:
        """Validate a /generate body and queue it.

        Raises:
            ApiError: 400 with ``param`` on bad input, 503 when not ready.
        """
        if not isinstance(body, dict):
            raise ApiError("the request body must be a JSON object", param=None)
        unknown = [k for k, v in body.items() if k not in GENERATE_KEYS and v not in (None, False, [], {}, "")]
        if unknown:
            raise ApiError(f"unknown field(s) {sorted(unknown)}; known: {list(GENERATE_KEYS)}", param=unknown[0])
        stream = body.get("stream", False)
        lp = body.get("return_logprob", False)
        lp_text = body.get("return_text_in_logprobs", False)
        for name, v in (("stream", stream), ("return_logprob", lp), ("return_text_in_logprobs", lp_text)):
            if not isinstance(v, bool):
                raise ApiError(f"{name} must be a boolean, got {v!r}", param=name)
        rid = body.get("rid")
        if rid is not None and not (isinstance(rid, str) or (isinstance(rid, list)
                                                              and all(isinstance(x, str) for x in rid))):
            raise ApiError("rid must be a string or a list of strings", param="rid")
        try:
            reqs, single = await self.build(
                prompt=body.get("text"), input_ids=body.get("input_ids"),
                sampling_params=body.get("sampling_params"), return_logprob=lp,
                logprob_start_len=body.get("logprob_start_len"), top_logprobs_num=body.get("top_logprobs_num", 0),
                stream=stream, rid=rid, cache_salt=body.get("cache_salt"))
            if isinstance(rid, list) and len(rid) != len(reqs):
                raise ValueError(f"rid: {len(rid)} ids for {len(reqs)} prompts")
            if stream and not single:
                raise ValueError("stream: stream=true takes one prompt")
            batch = await self.submit(reqs, lp_text)
        except ValueError as e:
            raise ApiError(str(e), param=native_param(str(e))) from None
        return NativeCall(batch, single, stream, lp)

    async def health_generate(self, timeout: float = 30.0) -> dict:
        """Run a 1-token greedy generation; returns its output. Raises ApiError 503 on failure."""
        reqs, _ = await self.build(input_ids=[1], sampling_params={"max_new_tokens": 1, "temperature": 0},
                                   rid=f"health-{uuid.uuid4().hex}")
        batch = await self.submit(reqs)
        try:
            outs = await asyncio.wait_for(batch.wait(), timeout)
        except asyncio.TimeoutError:
            batch.abort_unfinished()
            raise ApiError(f"a 1-token generation did not finish within {timeout:.0f} s", status=503,
                           type="service_unavailable") from None
        return outs[0].to_dict(False)


def _version() -> str:
    import radixrt
    return radixrt.__version__
