"""The main process's ZMQ sockets: PUSH requests to the scheduler, PULL results from the detokenizer.

Every frame is a msgspec msgpack Struct (nothing is pickled). Info and flush replies come back in the order
they were asked (the scheduler answers in order through the detokenizer's single pipe), so :meth:`Ipc.ask`
matches them first-in, first-out; a caller that timed out still consumes its own reply.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Callable

import msgspec
import zmq
import zmq.asyncio

from radixrt.runtime.errors import ValidationError
from radixrt.runtime.io_struct import BatchStrOut, DetokenizerOutput, InfoOut, ReadyOut

logger = logging.getLogger("radixrt.server")


class Ipc:
    """``to_scheduler`` and ``from_detokenizer`` are the ``ipc://`` addresses this side binds."""

    def __init__(self, to_scheduler: str, from_detokenizer: str):
        self.zmq_ctx = zmq.asyncio.Context()
        self.push = self.zmq_ctx.socket(zmq.PUSH)
        self.push.bind(to_scheduler)
        self.pull = self.zmq_ctx.socket(zmq.PULL)
        self.pull.bind(from_detokenizer)
        self.info_waiters: deque[asyncio.Future] = deque()
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(DetokenizerOutput)

    def encode(self, msg) -> bytes:
        """msgpack bytes of ``msg``. Raises ValidationError (a 400) for an integer outside 64 bits, which
        validation lets through where a field has no upper bound (seeds, top_k, token ids, capacities)."""
        try:
            return self._enc.encode(msg)
        except OverflowError:
            field = _big_int_field(msg) or "an integer in the request"
            raise ValidationError(f"{field} is outside the 64-bit integer range", field) from None

    async def send(self, msg) -> None:
        await self.push.send(self.encode(msg))

    async def send_frame(self, frame: bytes) -> None:
        """Send bytes made by :meth:`encode` (a caller that must know a message encodes before acting)."""
        await self.push.send(frame)

    def send_nowait(self, msg) -> None:
        """Queue ``msg`` without waiting (ZMQ buffers it); for callers that cannot await (aborts)."""
        self.push.send(self.encode(msg))

    async def ask(self, msg, timeout: float) -> InfoOut:
        """Send ``msg`` and wait for its InfoOut. Raises asyncio.TimeoutError after ``timeout`` seconds,
        or the error given to :meth:`fail_waiters`."""
        frame = self.encode(msg)  # before queueing a waiter: a bad message must not leave one behind
        fut = asyncio.get_running_loop().create_future()
        self.info_waiters.append(fut)
        await self.push.send(frame)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            fut.cancel()
            raise

    def fail_waiters(self, err: BaseException) -> None:
        while self.info_waiters:
            f = self.info_waiters.popleft()
            if not f.done():
                f.set_exception(err)

    async def recv_loop(self, on_outs: Callable, on_ready: Callable) -> None:
        """Forever: BatchStrOut -> ``on_outs(list[StrOut])``; ReadyOut -> ``on_ready(r)``; InfoOut -> the
        oldest waiter of :meth:`ask`."""
        while True:
            frame = await self.pull.recv()
            try:
                msg = self._dec.decode(frame)
            except msgspec.DecodeError:
                logger.exception("undecodable message from the detokenizer")
                continue
            if isinstance(msg, BatchStrOut):
                on_outs(msg.outs)
            elif isinstance(msg, InfoOut):
                while self.info_waiters:
                    f = self.info_waiters.popleft()
                    if not f.done():  # a waiter that timed out still consumes its own reply
                        f.set_result(msg)
                        break
            elif isinstance(msg, ReadyOut):
                on_ready(msg)

    def close(self) -> None:
        try:
            self.push.close(linger=0)
            self.pull.close(linger=0)
            self.zmq_ctx.term()
        except Exception:
            pass


def _big_int_field(obj, name: str | None = None) -> str | None:
    """The name of the field of a message (msgspec Structs, lists, dicts) holding an int outside 64 bits."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        return name if not -(2**63) <= obj < 2**64 else None
    if isinstance(obj, msgspec.Struct):
        items = zip(obj.__struct_fields__, msgspec.structs.astuple(obj))
    elif isinstance(obj, dict):
        items = ((str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((name, v) for v in obj)
    else:
        return None
    for key, value in items:
        found = _big_int_field(value, key)
        if found is not None:
            return found
    return None
