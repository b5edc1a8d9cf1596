"""A bound on request bodies: a body over :data:`MAX_BODY_BYTES` is a 413 with the route's error body,
before it is read (``Content-Length``) or as soon as the bytes received pass the bound (chunked).

Why: a body is read whole, then parsed and tokenized on the event loop; 10 MB of prompt text is far beyond
any context window and would stall every stream for the seconds its tokenization takes. The bound is
generous: 8 MiB holds a 128k-token context as text or as ``input_ids`` many times over.
"""

from __future__ import annotations

from radixrt.runtime.server.http.errors import ApiError, error_body, error_response

MAX_BODY_BYTES = 8 << 20
# an over-long body is still read (and dropped) up to this many bytes before the 413: a client that is
# still sending when the server answers and closes gets a connection reset instead of the answer
DISCARD_BYTES = 64 << 20


class BodyTooLarge(ApiError):
    def __init__(self, limit: int):
        super().__init__(f"the request body is larger than {limit} bytes", status=413, code="request_too_large")


class BodyLimit:
    """Pure ASGI middleware (streaming responses pass untouched)."""

    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for k, v in scope.get("headers", []):
            if k == b"content-length" and v.isdigit() and int(v) > self.max_bytes:
                if int(v) <= DISCARD_BYTES:
                    await _discard(receive, 0)
                err = BodyTooLarge(self.max_bytes)
                resp = error_response(
                    scope["path"],
                    error_body(err.message, None, err.type, err.code),
                    413,
                    headers={"Connection": "close"},
                )
                return await resp(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    if msg.get("more_body", False):
                        await _discard(receive, seen)
                    raise BodyTooLarge(self.max_bytes)  # a route's ApiError: the handlers answer 413
            return msg

        await self.app(scope, limited, send)


async def _discard(receive, seen: int) -> None:
    """Read and drop the rest of a body, up to DISCARD_BYTES in all (``seen``: bytes already read)."""
    while seen <= DISCARD_BYTES:
        msg = await receive()
        if msg["type"] != "http.request":
            return
        seen += len(msg.get("body", b""))
        if not msg.get("more_body", False):
            return
