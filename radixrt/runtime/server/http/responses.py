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
    waiter = asyncio.ensure_future(batch.wait())
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({waiter, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return waiter.result()
        raise ClientGone()
    finally:
        for t in (waiter, watcher):
            if not t.done():
                t.cancel()
        batch.abort_unfinished()
