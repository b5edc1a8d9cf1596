"""Response helpers shared by every route: msgspec JSON, server-sent events, and waiting for a call while
watching for the client to go away (its requests are aborted, so their pages are freed at once)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from fastapi import Request
from starlette.responses import Response, StreamingResponse

SSE_DONE = b"data: [DONE]\n\n"


class JSONResp(Response):
    """JSON via msgspec (NaN/inf become null instead of failing the response)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return b"data: " + msgspec.json.encode(obj) + b"\n\n"


class SSEResponse(StreamingResponse):
    """An event stream that runs ``on_close`` however it ends (client gone, cancelled, finished); the
    routes pass the call's abort, so a client that goes away frees its requests' pages."""

    def __init__(self, content, on_close):
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class ClientGone(Exception):
    """The client disconnected before the answer was ready (answered 499)."""


async def _disconnected(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def wait_or_abort(request: Request, batch) -> list:
    """Wait for every request of ``batch`` (a ReqBatch); if the client disconnects first, abort them
    (pages freed) and raise :class:`ClientGone`."""
    return await _or_abort(request, batch, batch.wait())


async def first_or_abort(request: Request, batch) -> None:
    """Before a stream's status line, for a call the scheduler may still refuse (``ReqBatch.refusable``: a
    grammar or a session field): wait for its first output (``ReqBatch.peek``), so that a refusal before the
    first token is answered 400 (or 503, the runtime died) rather than 200 and an error event, as OpenAI
    answers a bad schema. Such a stream's headers then leave with its first token (a queued request's wait
    for a slot included); any other stream's leave at once.

    Raises:
        ApiError: the refusal (400) or the dead runtime (503); the call's other requests are aborted.
        ClientGone: the client left first (the requests are aborted, their pages freed).
    """
    if batch.refusable:
        await _or_abort(request, batch, batch.peek(), keep=True)


async def _or_abort(request: Request, batch, call, keep: bool = False):
    """Await ``call``, or raise ClientGone when the client leaves first. The unfinished requests are aborted
    at the end unless ``keep`` and ``call`` returned (a stream goes on with them)."""
    waiter = asyncio.ensure_future(call)
    watcher = asyncio.ensure_future(_disconnected(request))
    returned = False
    try:
        done, _ = await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            result, returned = waiter.result(), True
            return result
        raise ClientGone()
    finally:
        for t in (waiter, watcher):
            if not t.done():
                t.cancel()
        if not (keep and returned):
            batch.abort_unfinished()
