"""In-process backend: a :class:`radixrt.runtime.engine.Engine` in this Python process."""

from __future__ import annotations

from typing import Any, Iterator

from radixrt.lang.backend.base import BaseBackend, RequestError

_KW = (
    "sampling_params",
    "input_ids",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "stream",
    "rid",
    "cache_salt",
    "return_text_in_logprobs",
    "session_id",
)


class EngineBackend(BaseBackend):
    """Wraps an Engine (``rt.set_default_backend(rt.Engine(...))`` wraps it for you).

    Args:
        engine: a running Engine, or None to start one from ``**engine_kwargs`` (ServerArgs fields).
    """

    def __init__(self, engine: Any = None, **engine_kwargs: Any) -> None:
        super().__init__()
        if engine is None:
            from radixrt.runtime.engine import Engine

            engine = Engine(**engine_kwargs)
        self.engine = engine

    def _kwargs(self, body: dict) -> dict:
        unknown = set(body) - set(_KW) - {"text"}
        if unknown:
            raise RequestError(f"unknown /generate field(s) {sorted(unknown)}")
        kw = {k: body[k] for k in _KW if k in body}
        if "text" in body:
            kw["prompt"] = body["text"]
        return kw

    def _request(self, body: dict) -> Any:
        try:
            return self.engine.generate(**self._kwargs(body))
        except ValueError as e:
            raise RequestError(str(e)) from None

    def _request_stream(self, body: dict) -> Iterator[dict]:
        kw = self._kwargs(body)
        kw["stream"] = True
        try:
            it = self.engine.generate(**kw)
        except ValueError as e:
            raise RequestError(str(e)) from None
        yield from it

    def flush_cache(self) -> bool:
        return self.engine.flush_cache()

    def open_session(self) -> str:
        return self.engine.open_session()

    def close_session(self, session_id: str) -> None:
        self.engine.close_session(session_id)

    def get_server_info(self) -> dict:
        return self.engine.get_server_info()

    def get_model_info(self) -> dict:
        m = self.engine.args.model
        return {"model_path": m, "tokenizer_path": m, "is_generation": True}

    def _load_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def shutdown(self) -> None:
        self.engine.shutdown()
