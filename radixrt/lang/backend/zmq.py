"""ZMQ backend: a DEALER socket to the server's DSL ROUTER socket (``radixrt serve``, HTTP port + 1).

Messages are :class:`radixrt.runtime.io_struct.DslRequest` / ``DslReply`` (msgspec msgpack). One request
at a time uses one socket; sockets are pooled, so the programs of a batch (many threads) each get their
own. A reply's ``req_id`` is checked, so a late reply for an abandoned request is dropped.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from typing import Any, Iterator, Optional

import msgspec
import zmq

from radixrt.lang.backend.base import BackendConnectionError, BackendError, RequestError, error_from_payload
from radixrt.lang.backend.remote import RemoteEndpoint
from radixrt.runtime.io_struct import DslReply, DslRequest

_ENC = msgspec.msgpack.Encoder()
_DEC = msgspec.msgpack.Decoder(DslReply)


class ZmqEndpoint(RemoteEndpoint):
    """``RuntimeEndpoint("tcp://127.0.0.1:30001")``; see :class:`RemoteEndpoint` for the arguments."""

    def _connect(self) -> None:
        self._ctx = zmq.Context()
        self._pool: "queue.LifoQueue[zmq.Socket]" = queue.LifoQueue()
        self._lock = threading.Lock()
        self._closed = False

    def _checkout(self) -> zmq.Socket:
        if self._closed:
            raise BackendConnectionError(f"{self.base_url}: the backend is closed")
        try:
            return self._pool.get_nowait()
        except queue.Empty:
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(self.base_url)
            return s

    def _exchange(self, op: str, body: dict, timeout: Optional[float]) -> Iterator[DslReply]:
        """Send one request; yield its replies until a ``result`` or ``error``.

        Raises:
            BackendConnectionError: no reply within ``timeout`` seconds (between two replies).
        """
        timeout = self.timeout if timeout is None else timeout
        req_id = uuid.uuid4().hex
        sock = self._checkout()
        healthy = False
        try:
            sock.send(_ENC.encode(DslRequest(req_id=req_id, op=op, body=body, api_key=self.api_key)))
            while True:
                deadline = time.monotonic() + timeout
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise BackendConnectionError(
                            f"no reply from the radixrt server at {self.base_url} within {timeout:g} s "
                            f"(op {op}); is `radixrt serve` running there?"
                        )
                    if sock.poll(int(left * 1000) + 1):
                        rep = _DEC.decode(sock.recv_multipart()[-1])
                        if rep.req_id == req_id:
                            break
                if rep.event in ("result", "error"):
                    healthy = True
                yield rep
                if healthy:
                    return
        finally:
            if healthy:
                self._pool.put(sock)
            else:  # a stream left early or a timeout: replies may still come; never reuse this socket
                if op == "generate" and body.get("rid"):
                    self._abort(body["rid"])
                sock.close(linger=0)

    def _abort(self, rid: str) -> None:
        try:
            s = self._checkout()
            s.send(
                _ENC.encode(DslRequest(req_id=uuid.uuid4().hex, op="abort", body={"rid": rid}, api_key=self.api_key))
            )
            s.close(linger=100)
        except Exception:  # noqa: BLE001 - best effort
            pass

    @staticmethod
    def _result(rep: DslReply) -> Any:
        if rep.event == "error":
            raise error_from_payload(rep.data)
        if rep.event != "result":
            raise BackendError(f"unexpected reply event {rep.event!r}")
        return rep.data

    def _request(self, body: dict) -> Any:
        body = {**body, "stream": False}
        for rep in self._exchange("generate", body, None):
            if rep.event in ("result", "error"):
                return self._result(rep)
        raise BackendError("the server closed the request without a result")

    def _request_stream(self, body: dict) -> Iterator[dict]:
        body = {**body, "stream": True, "rid": body.get("rid") or uuid.uuid4().hex}
        for rep in self._exchange("generate", body, None):
            if rep.event == "chunk":
                yield rep.data
            else:
                data = self._result(rep)
                if isinstance(data, dict) and data.get("text") is not None:
                    yield data
                return

    def _info(self, op: str, timeout: Optional[float] = None) -> Any:
        for rep in self._exchange(op, {}, timeout):
            if rep.event in ("result", "error"):
                return self._result(rep)
        raise BackendError(f"no result for {op}")

    def open_session(self) -> str:
        return self._op("open_session", {"capacity_of_str_len": 0})

    def close_session(self, session_id: str) -> None:
        self._op("close_session", {"session_id": session_id})

    def _op(self, op: str, body: dict) -> Any:
        for rep in self._exchange(op, body, None):
            if rep.event in ("result", "error"):
                return self._result(rep)
        raise BackendError(f"no result for {op}")

    def flush_cache(self) -> bool:
        """True when flushed; False while requests run (the server refuses then)."""
        try:
            r = self._info("flush_cache")
        except RequestError:
            return False
        return bool(r.get("success", True)) if isinstance(r, dict) else bool(r)

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                self._pool.get_nowait().close(linger=0)
            except queue.Empty:
                break
        self._ctx.destroy(linger=0)
