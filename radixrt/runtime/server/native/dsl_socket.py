"""The DSL's socket: a ZMQ ROUTER on ``tcp://{--host}:{--zmq-port}`` (default port + 1, loopback by default).

Wire protocol (msgspec msgpack, no pickle). The client is a DEALER; each message is one frame holding a
:class:`DslRequest` (a frame list ``[b"", payload]``, as a REQ-style envelope, works too; replies echo it):

- ``DslRequest(req_id, op, body, api_key)`` with ``op``:
  - ``generate``: ``body`` is exactly the JSON body of ``POST /generate``. Non-streamed: one
    ``DslReply(event="result", data=<the /generate object, or list for a batch>)``. With ``body["stream"]``:
    ``DslReply(event="chunk", data=<cumulative /generate object>)`` per update, then one ``result`` with
    the final object (so a chunk is never the last message);
  - ``abort``: ``body={"rid": ...}``, the ``rid`` of a generate body, or ``{"req_id": ...}`` naming the
    generate's DslRequest. Reply ``result`` ``{"success": true}``; the aborted generate then ends with its
    ``result`` (``meta_info.finish_reason.type == "abort"``);
  - ``flush_cache``: ``result`` ``{"success": true, "message": ...}``, or an error while requests run;
  - ``get_server_info``: ``result`` = ``GET /get_server_info``;
  - ``get_model_info``: ``result`` = ``GET /get_model_info``.
- Errors: ``DslReply(event="error", data={"message", "type", "param", "code"})`` (the HTTP error object):
  ``invalid_request_error`` for bad input (400 over HTTP), ``service_unavailable`` when the runtime is
  loading or dead (503), code ``invalid_api_key`` when ``--api-key`` is set and ``api_key`` differs.
  An undecodable frame gets an error with ``req_id=""``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any, Optional

import msgspec
import zmq
import zmq.asyncio

from radixrt.runtime.errors import ValidationError
from radixrt.runtime.io_struct import DslReply, DslRequest
from radixrt.runtime.server.http.errors import ApiError, error_body
from radixrt.runtime.server.native.body import native_generate

logger = logging.getLogger("radixrt.dsl")

MAX_MESSAGE_BYTES = 64 << 20  # one DslRequest frame (bytes)

OPS = ("generate", "abort", "flush_cache", "get_server_info", "get_model_info", "open_session", "close_session")


class DslServer:
    def __init__(self, args, tm, zmq_ctx: Optional[zmq.asyncio.Context] = None):
        self.args, self.tm = args, tm
        self.zmq_ctx = zmq_ctx or zmq.asyncio.Context.instance()
        self.sock = None
        self.task: Optional[asyncio.Task] = None
        self.jobs: set[asyncio.Task] = set()
        self.rid_of: dict[tuple[bytes, str], list[str]] = {}  # (client identity, req_id) -> its rids
        self._enc = msgspec.msgpack.Encoder()
        self._dec = msgspec.msgpack.Decoder(DslRequest)
        self.address = f"tcp://{_zmq_host(args.host)}:{args.dsl_port}"

    async def start(self) -> None:
        self.sock = self.zmq_ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a reply to a vanished client raises: abort its work
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)  # a bigger frame drops its connection
        self.sock.setsockopt(zmq.IPV6, 1)  # --host ::1 and other IPv6 addresses (IPv4 ones still bind)
        self.sock.bind(self.address)
        self.task = asyncio.create_task(self._serve(), name="radixrt-dsl")

    async def stop(self) -> None:
        for t in list(self.jobs) + ([self.task] if self.task else []):
            t.cancel()
        if self.sock is not None:
            self.sock.close(linger=0)
            self.sock = None

    async def _serve(self) -> None:
        while True:
            frames = await self.sock.recv_multipart()
            if len(frames) < 2:
                continue
            envelope, payload = frames[:-1], frames[-1]
            job = asyncio.create_task(self._handle(envelope, payload))
            self.jobs.add(job)
            job.add_done_callback(self.jobs.discard)

    async def _send(self, envelope: list[bytes], reply: DslReply) -> bool:
        """False when the client is gone."""
        if self.sock is None:
            return False
        try:
            await self.sock.send_multipart(envelope + [self._enc.encode(reply)])
            return True
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                return False
            raise

    async def _handle(self, envelope: list[bytes], payload: bytes) -> None:
        try:
            req = self._dec.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
            why = "nested too deeply" if isinstance(e, RecursionError) else str(e)
            await self._send(
                envelope, DslReply(req_id="", event="error", data=error_body(f"undecodable DslRequest: {why}")["error"])
            )
            return
        try:
            await self._dispatch(envelope, req)
        except ApiError as e:
            await self._send(envelope, DslReply(req_id=req.req_id, event="error", data=e.body()["error"]))
        except ValidationError as e:  # bad input, named where it was checked
            await self._send(
                envelope, DslReply(req_id=req.req_id, event="error", data=error_body(str(e), e.param)["error"])
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.exception("DSL request %s failed", req.req_id)
            await self._send(
                envelope,
                DslReply(
                    req_id=req.req_id,
                    event="error",
                    data=error_body(f"internal error: {type(e).__name__}: {e}", None, "internal_error")["error"],
                ),
            )

    def _check_key(self, req: DslRequest) -> None:
        key = self.args.api_key
        if key and not hmac.compare_digest((req.api_key or "").encode(), key.encode()):
            raise ApiError(
                "Incorrect API key provided." if req.api_key else "Missing API key (DslRequest.api_key).",
                status=401,
                code="invalid_api_key",
            )

    async def _dispatch(self, envelope: list[bytes], req: DslRequest) -> None:
        from radixrt.runtime.server.context import model_info
        from radixrt.runtime.server.native.routes import flush

        self._check_key(req)
        if req.op not in OPS:
            raise ApiError(f"unknown op {req.op!r}; one of {list(OPS)}", param="op")
        if not isinstance(req.body, dict):
            raise ApiError("body must be an object", param="body")
        result: Any
        if req.op == "generate":
            await self._generate(envelope, req)
            return
        if req.op == "abort":
            rid = req.body.get("rid")
            rids = [rid] if isinstance(rid, str) else []
            if isinstance(req.body.get("req_id"), str):
                rids += self.rid_of.get((envelope[0], req.body["req_id"]), [])
            if not rids:
                raise ApiError("abort needs body {'rid': ...} or {'req_id': ...} of a running generate", param="rid")
            for r in rids:
                self.tm.abort(r)
            result = {"success": True}
        elif req.op == "flush_cache":
            result = await flush(self.tm)
        elif req.op == "get_server_info":
            result = await self.tm.server_info()
        elif req.op == "open_session":  # body as POST /open_session; the result is the session id
            result = await self.tm.open_session(req.body)
        elif req.op == "close_session":
            result = {"success": await self.tm.close_session(req.body.get("session_id"))}
        else:
            result = model_info(self.args)
        await self._send(envelope, DslReply(req_id=req.req_id, event="result", data=result))

    async def _generate(self, envelope: list[bytes], req: DslRequest) -> None:
        call = await native_generate(self.tm, req.body)
        key = (envelope[0], req.req_id)
        self.rid_of[key] = [r.rid for r in call.batch.reqs]
        try:
            if call.stream:
                async for d in call.chunks():
                    event = "result" if call.batch.finished else "chunk"
                    if not await self._send(envelope, DslReply(req_id=req.req_id, event=event, data=d)):
                        return  # the client is gone: the finally aborts
            else:
                await self._send(envelope, DslReply(req_id=req.req_id, event="result", data=await call.result()))
        finally:
            call.batch.abort_unfinished()
            self.rid_of.pop(key, None)


def _zmq_host(host: str) -> str:
    if host in ("0.0.0.0", "", "*"):
        return "*"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host
