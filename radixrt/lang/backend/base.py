"""What every DSL backend provides, and the shared request logic.

A backend speaks SGLang's native ``/generate`` body (``text`` or ``input_ids``, ``sampling_params``,
``return_logprob``, ``logprob_start_len``, ``top_logprobs_num``, ``stream`` ...); subclasses only move
that body: over ZMQ (:mod:`.zmq`), HTTP (:mod:`.http`), both built on :mod:`.remote` and picked by
:func:`.runtime_endpoint.RuntimeEndpoint`, or into an in-process Engine (:mod:`.engine`).
Generation, prefill-only prefix caching and ``select`` scoring are built on top here.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator, Optional

from radixrt.lang.chat_template import ChatTemplate, from_tokenizer
from radixrt.lang.ir import SglSamplingParams


class BackendError(RuntimeError):
    """The backend failed while serving a request (a server-side error)."""


class RequestError(ValueError):
    """The backend rejected a request as invalid (bad regex, schema, length, parameter...)."""


class BackendConnectionError(ConnectionError):
    """The backend cannot be reached, or did not answer within the timeout."""


def error_from_payload(data: Any, status: Optional[int] = None) -> Exception:
    """Turn an OpenAI-style error object (``{"message", "type", "code"}``, maybe under ``"error"``) or a
    FastAPI ``{"detail": ...}`` into :class:`RequestError` (4xx / invalid request) or :class:`BackendError`."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        data = data["error"]
    if isinstance(data, dict):
        msg = data.get("message") or data.get("detail") or str(data)
        code = data.get("code")
        kind = str(data.get("type", ""))
    else:
        msg, code, kind = str(data), None, ""
    code = status if status is not None else code
    invalid = (isinstance(code, int) and 400 <= code < 500) or "invalid" in kind.lower() or "BadRequest" in kind
    return RequestError(str(msg)) if invalid else BackendError(str(msg))


class BaseBackend:
    """Base class. Subclasses implement :meth:`_request`, :meth:`_request_stream` and the info calls.

    Thread-safe: programs of a batch call one backend from many threads.
    """

    def __init__(self) -> None:
        self._tok_lock = threading.Lock()
        self._tokenizer: Any = None
        self._tokenizer_loaded = False
        self._chat_template: Optional[ChatTemplate] = None

    # ---- transport: subclasses ---------------------------------------------------------------------
    def _request(self, body: dict) -> Any:
        """Send a ``/generate`` body; return the response dict (or list, for a batch)."""
        raise NotImplementedError

    def _request_stream(self, body: dict) -> Iterator[dict]:
        """Send a ``/generate`` body with ``stream: true``; yield response dicts (cumulative text)."""
        raise NotImplementedError

    def flush_cache(self) -> bool:
        raise NotImplementedError

    def get_server_info(self) -> dict:
        raise NotImplementedError

    def get_model_info(self) -> dict:
        raise NotImplementedError

    def _load_tokenizer(self) -> Any:
        """The model's tokenizer, or None where it cannot be had."""
        return None

    def close(self) -> None:
        """Release sockets/connections. The backend must not be used afterwards."""

    def open_session(self) -> Optional[str]:
        """Open an agent session that pins a program's KV between its calls; None where unsupported."""
        return None

    def close_session(self, session_id: str) -> None:
        """Close a session opened by :meth:`open_session` (its pages become evictable)."""

    # ---- shared ------------------------------------------------------------------------------------
    def get_tokenizer(self) -> Any:
        """The model's tokenizer (loaded once), or None."""
        with self._tok_lock:
            if not self._tokenizer_loaded:
                self._tokenizer = self._load_tokenizer()
                self._tokenizer_loaded = True
            return self._tokenizer

    def get_chat_template(self) -> ChatTemplate:
        if self._chat_template is None:
            self._chat_template = from_tokenizer(self.get_tokenizer())
        return self._chat_template

    def tokenize(self, text: str) -> Optional[list[int]]:
        """Token ids of ``text`` exactly as the server would make them (no special tokens added)."""
        tok = self.get_tokenizer()
        if tok is None:
            return None
        with self._tok_lock:  # a fast tokenizer's Rust state must not be borrowed from two threads at once
            return tok.encode(text, add_special_tokens=False)

    @staticmethod
    def _body(exe: Any, sp: SglSamplingParams, stream: bool = False) -> dict:
        body: dict = {"text": exe.text_, "sampling_params": sp.to_srt(), "stream": stream}
        if exe.session_id:
            body["session_id"] = exe.session_id
        if sp.return_logprob:
            body["return_logprob"] = True
            fields = vars(sp)
            for k in ("logprob_start_len", "top_logprobs_num", "return_text_in_logprobs"):
                if fields[k] is not None:
                    body[k] = fields[k]
        return body

    def generate(self, exe: Any, sp: SglSamplingParams) -> tuple[str, dict]:
        """Continue ``exe.text_``; returns ``(completion text, meta_info)``."""
        out = self._request(self._body(exe, sp))
        return out["text"], out["meta_info"]

    def generate_stream(self, exe: Any, sp: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        """Yield ``(text delta, meta_info so far)``."""
        prev = ""
        for chunk in self._request_stream(self._body(exe, sp, stream=True)):
            text = chunk.get("text", "")
            delta, prev = text[len(prev) :], text
            yield delta, chunk.get("meta_info", {})

    def prefill(self, body: dict) -> Any:
        """A prefill-only request (``max_new_tokens`` 0): fills the radix cache, returns logprobs if asked."""
        body = dict(body)
        body["sampling_params"] = {**body.get("sampling_params", {}), "max_new_tokens": 0}
        return self._request(body)

    def cache_prefix(self, text: str) -> dict:
        """Prefill ``text`` once so later requests sharing it hit the radix cache; returns its meta_info."""
        return self.prefill({"text": text})["meta_info"]

    def select(self, exe: Any, choices: list[str], temperature: float, method: Any) -> Any:
        """Score ``choices`` after ``exe.text_`` (see :mod:`radixrt.lang.choices`)."""
        from radixrt.lang.choices import select_by_logprobs

        return select_by_logprobs(self, exe.text_, choices, method)
