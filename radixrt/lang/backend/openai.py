"""OpenAI backend: any OpenAI-compatible server (``radixrt serve``'s /v1, vLLM, OpenAI itself).

Chat models (the default) are called with ``s.messages()`` and may only ``gen`` at the start of an
assistant message (``s += assistant(gen("x"))``); completion models get ``s.text()``. The OpenAI API has
no regex-constrained decoding and returns no prompt-token logprobs, so ``gen(regex=...)``/``dtype`` and
``select`` raise :class:`RequestError` saying so. ``json_schema`` maps to ``response_format``.
Roles render as ChatML locally (only the text shown by ``s.text()``; the server applies its template).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Iterator, Optional

from radixrt.lang.backend.base import BackendConnectionError, BackendError, BaseBackend, RequestError
from radixrt.lang.chat_template import CHATML, ChatTemplate
from radixrt.lang.ir import SglSamplingParams


class OpenAI(BaseBackend):
    """Args: ``model`` (None: the first of ``/v1/models``), ``base_url`` (None: api.openai.com),
    ``api_key`` (None: ``$OPENAI_API_KEY`` or "EMPTY"), ``is_chat_model``, ``timeout`` (seconds).

    Raises:
        BackendConnectionError: ``model`` is None and the server cannot be reached.
    """

    def __init__(
        self,
        model: Optional[str] = None,
        base_url: Optional[str] = None,
        api_key: Optional[str] = None,
        is_chat_model: bool = True,
        timeout: float = 600.0,
    ) -> None:
        super().__init__()
        import openai

        self._openai = openai
        self.client = openai.OpenAI(
            base_url=base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY", "EMPTY"),
            timeout=timeout,
            max_retries=0,
        )
        self.is_chat_model = is_chat_model
        self.model = model or self._call(lambda: self.client.models.list().data[0].id)

    def _call(self, fn: Any) -> Any:
        o = self._openai
        try:
            return fn()
        except (o.APIConnectionError, o.APITimeoutError) as e:
            raise BackendConnectionError(
                f"cannot reach the OpenAI-compatible server at {self.client.base_url}: {e}"
            ) from e
        except (o.BadRequestError, o.UnprocessableEntityError) as e:
            raise RequestError(str(e)) from e
        except o.APIError as e:
            raise BackendError(str(e)) from e

    def get_chat_template(self) -> ChatTemplate:
        return CHATML

    def _params(self, sp: SglSamplingParams) -> dict:
        if sp.regex is not None:
            raise RequestError(
                "regex (and dtype) constrained generation is not supported by the OpenAI backend: "
                "the OpenAI API has no regex grammar; use RuntimeEndpoint or Engine"
            )
        kw: dict = {
            "model": self.model,
            "max_tokens": sp.max_new_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "frequency_penalty": sp.frequency_penalty,
            "presence_penalty": sp.presence_penalty,
            "seed": sp.seed,
            "stop": sp.stop if sp.stop else None,
        }
        extra = {
            k: v
            for k, v in (
                ("top_k", sp.top_k),
                ("min_p", sp.min_p),
                ("ignore_eos", sp.ignore_eos),
                ("min_tokens", sp.min_new_tokens),
            )
            if v not in (None, -1, 0.0, False, 0)
        }
        if sp.speculative is not None:  # radixrt's own field (an OpenAI-compatible radixrt server)
            extra["speculative"] = sp.speculative
        if extra:
            kw["extra_body"] = extra
        if sp.json_schema is not None:
            if not self.is_chat_model:
                raise RequestError("json_schema needs a chat model on the OpenAI backend (response_format)")
            kw["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": json.loads(sp.json_schema)},
            }
        return {k: v for k, v in kw.items() if v is not None}

    def _messages(self, exe: Any) -> list[dict]:
        if exe.cur_role != "assistant" or exe.text_[exe.cur_role_begin_pos :]:
            raise ValueError(
                "the OpenAI backend (chat model) can only gen at the start of an assistant message: "
                "write s += assistant(gen(...))"
            )
        return list(exe.messages_)

    @staticmethod
    def _meta(r: Any, t0: float, finish: Any) -> dict:
        u = r.usage  # the openai SDK's response and chunk types declare these (None when not sent)
        details = u.prompt_tokens_details if u else None
        return {
            "id": r.id,
            "prompt_tokens": u.prompt_tokens if u else None,
            "completion_tokens": u.completion_tokens if u else None,
            "cached_tokens": details.cached_tokens if details else 0,
            "finish_reason": {"type": finish} if finish else None,
            "e2e_latency": time.perf_counter() - t0,
        }

    def generate(self, exe: Any, sp: SglSamplingParams) -> tuple[str, dict]:
        kw, t0 = self._params(sp), time.perf_counter()
        if self.is_chat_model:
            r = self._call(lambda: self.client.chat.completions.create(messages=self._messages(exe), **kw))
            c = r.choices[0]
            return c.message.content or "", self._meta(r, t0, c.finish_reason)
        r = self._call(lambda: self.client.completions.create(prompt=exe.text_, **kw))
        return r.choices[0].text, self._meta(r, t0, r.choices[0].finish_reason)

    def generate_stream(self, exe: Any, sp: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        kw, t0 = self._params(sp), time.perf_counter()
        kw.update(stream=True, stream_options={"include_usage": True})
        if self.is_chat_model:
            it = self._call(lambda: self.client.chat.completions.create(messages=self._messages(exe), **kw))
        else:
            it = self._call(lambda: self.client.completions.create(prompt=exe.text_, **kw))
        finish = None
        for ch in it:
            delta = ""
            if ch.choices:
                c = ch.choices[0]
                delta = (c.delta.content or "") if self.is_chat_model else (c.text or "")
                finish = c.finish_reason or finish
            yield delta, self._meta(ch, t0, finish)

    def select(self, exe: Any, choices: list[str], temperature: float, method: Any) -> Any:
        raise RequestError(
            "select is not supported by the OpenAI backend: scoring choices needs prompt-token "
            "logprobs, which the OpenAI API does not return; use RuntimeEndpoint or Engine"
        )

    def cache_prefix(self, text: str) -> dict:
        return {}  # no prefill-only requests in the OpenAI API

    def flush_cache(self) -> bool:
        return False

    def get_server_info(self) -> dict:
        return {"model": self.model, "base_url": str(self.client.base_url)}

    def get_model_info(self) -> dict:
        return {"model_path": self.model, "tokenizer_path": None, "is_generation": True}

    def close(self) -> None:
        self.client.close()
