"""HTTP backend: SGLang's native API of ``radixrt serve`` (``POST /generate``, SSE streaming)."""

from __future__ import annotations

import json
from typing import Any, Iterator, Optional

import httpx

from radixrt.lang.backend.base import BackendConnectionError, BackendError, error_from_payload
from radixrt.lang.backend.remote import RemoteEndpoint


class HttpEndpoint(RemoteEndpoint):
    """``RuntimeEndpoint("http://127.0.0.1:30000")``; see :class:`RemoteEndpoint` for the arguments."""

    def _connect(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._client = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    def _send(self, method: str, path: str, json_body: Any = None, timeout: Optional[float] = None) -> Any:
        kw: dict = {} if timeout is None else {"timeout": httpx.Timeout(timeout)}
        try:
            r = self._client.request(method, path, json=json_body, **kw)
        except httpx.TransportError as e:  # connect refused, timeouts, broken connections
            raise BackendConnectionError(
                f"cannot reach the radixrt server at {self.base_url} ({type(e).__name__}: {e}); "
                "is `radixrt serve` running there?"
            ) from e
        return self._decode(r)

    @staticmethod
    def _decode(r: httpx.Response) -> Any:
        try:
            data = r.json()
        except ValueError:
            data = r.text
        if r.status_code >= 400:
            raise error_from_payload(data, r.status_code)
        return data

    def _request(self, body: dict) -> Any:
        return self._send("POST", "/generate", {**body, "stream": False})

    def _request_stream(self, body: dict) -> Iterator[dict]:
        try:
            with self._client.stream("POST", "/generate", json={**body, "stream": True}) as r:
                if r.status_code >= 400:
                    r.read()
                    self._decode(r)
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    obj = json.loads(data)
                    if isinstance(obj, dict) and "error" in obj:
                        raise error_from_payload(obj)
                    yield obj
        except httpx.TransportError as e:
            raise BackendConnectionError(f"lost the radixrt server at {self.base_url}: {e}") from e
        raise BackendError("the stream ended without data: [DONE]")

    def _info(self, op: str, timeout: Optional[float] = None) -> Any:
        return self._send("GET", f"/{op}", timeout=timeout)

    def open_session(self) -> str:
        return self._send("POST", "/open_session", {"capacity_of_str_len": 0})

    def close_session(self, session_id: str) -> None:
        self._send("POST", "/close_session", {"session_id": session_id})

    def flush_cache(self) -> bool:
        try:
            r = self._client.post("/flush_cache")
        except httpx.TransportError as e:
            raise BackendConnectionError(f"cannot reach the radixrt server at {self.base_url}: {e}") from e
        return r.status_code == 200

    def close(self) -> None:
        self._client.close()
