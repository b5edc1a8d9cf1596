"""One client call's requests (one HTTP request, one DSL generate) and their accumulating outputs."""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional

from radixrt.runtime.errors import refused
from radixrt.runtime.io_struct import GenerateReq, StrOut
from radixrt.runtime.sampling.params import grammar_of
from radixrt.runtime.server.http.errors import ApiError
from radixrt.runtime.tokenizer.validation import ReqOutput


class ReqBatch:
    """The requests of one client call; they share one asyncio queue that the receive loop fills with the
    detokenizer's :class:`StrOut` s (or an exception when the runtime dies). ``outs[i]`` accumulates
    request i's output. ``owner`` is the TokenizerManager (its ``tokenizer`` and ``abort``). ``rename``
    maps the native field a refusal names (``regex``, ``json_schema`` ...) to the caller's API field."""

    def __init__(self, owner, reqs: list[GenerateReq], lp_text: bool, rename: Optional[Callable[[str], str]] = None):
        self.owner = owner
        self.rename = rename
        self.reqs = reqs
        self.index = {r.rid: i for i, r in enumerate(reqs)}
        self.outs = [ReqOutput(r.rid, owner.tokenizer, lp_text) for r in reqs]
        self.queue: asyncio.Queue = asyncio.Queue()
        self.unfinished = len(reqs)
        self.t_submit = time.perf_counter()
        self.t_last = {r.rid: None for r in reqs}  # perf_counter seconds of each request's last token
        self._head = None  # an output peek() took from the queue and next() has not yet returned

    @property
    def refusable(self) -> bool:
        """True if the scheduler may still refuse a request of the call before its first token (400): one
        with a grammar (the backend may give up on it once compiling) or a session field."""
        return any(
            grammar_of(r.sampling_params) is not None or r.session_params is not None or r.session_id is not None
            for r in self.reqs
        )

    @property
    def finished(self) -> bool:
        return self.unfinished == 0

    async def next(self) -> tuple[int, StrOut]:
        """The next output of any of the requests: ``(index, StrOut)``; it is already added to ``outs``.

        Raises:
            ApiError: 503, the scheduler or detokenizer process died; 400, the scheduler refused a request
                (a bad session field: its finish reason carries ``status_code`` 400 and ``param``).
        """
        item = self._head if self._head is not None else await self.queue.get()
        self._head = None
        if isinstance(item, BaseException):
            raise item
        i = self.index[item.rid]
        self.outs[i].add(item)
        if item.token.finished_reason is not None:
            self.unfinished -= 1
            error = refused(item.token.finished_reason)
            if error is not None:
                param = error.param if self.rename is None or error.param is None else self.rename(error.param)
                msg = str(error)
                if param != error.param and msg.startswith(f"{error.param}:"):  # in the caller's field names
                    msg = param + msg[len(error.param) :]
                raise ApiError(msg, param=param)
        return i, item

    async def peek(self) -> None:
        """Wait for the call's first output without taking it (the next :meth:`next` returns it), so that a
        stream can still answer with a status: a request the scheduler refuses before its first token (a
        grammar it gives up on) or a runtime that died raises here, as :meth:`next` would.

        Raises:
            ApiError: as :meth:`next`.
        """
        if self._head is None:
            self._head = await self.queue.get()
        if isinstance(self._head, BaseException) or refused(self._head.token.finished_reason) is not None:
            await self.next()

    async def wait(self) -> list[ReqOutput]:
        while not self.finished:
            await self.next()
        return self.outs

    def abort_unfinished(self) -> None:
        """Abort every request of the call that has not finished (client gone). Synchronous, idempotent."""
        for o in self.outs:
            if not o.finished:
                self.owner.abort(o.rid)
