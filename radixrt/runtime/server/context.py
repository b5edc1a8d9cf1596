"""What every route needs: the server's arguments, the TokenizerManager, the metrics; kept on
``app.state.ctx`` so that routers are plain module-level :class:`fastapi.APIRouter` s."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from fastapi import Request

from radixrt.runtime.tokenizer.token_texts import TokenTexts
from radixrt.runtime.tokenizer.turn_store import TurnStore

if TYPE_CHECKING:  # annotations only: the routes' modules import this one
    from radixrt.runtime.config import ServerArgs
    from radixrt.runtime.server.manager.tokenizer_manager import TokenizerManager
    from radixrt.runtime.server.observe.metrics import Metrics
    from radixrt.runtime.server.openai.chat_format import ChatFormat
    from radixrt.runtime.server.openai.responses.store import ResponseStore

START_TIME = int(time.time())  # the ``created`` of /v1/models (seconds since the epoch)


@dataclass
class ServerContext:
    args: ServerArgs
    tm: TokenizerManager
    metrics: Optional[Metrics] = None  # with --enable-metrics
    _chat_format: Optional[ChatFormat] = field(default=None, repr=False)
    _responses: Optional[ResponseStore] = field(default=None, repr=False)
    _turns: Optional[TurnStore] = field(default=None, repr=False)
    _token_texts: Optional[TokenTexts] = field(default=None, repr=False)

    def turns(self) -> TurnStore:
        """The generated ids of recent assistant turns, shared by every chat-shaped API (turn continuity)."""
        if self._turns is None:
            self._turns = TurnStore(self.args.turn_store_size)
        return self._turns

    def token_texts(self) -> TokenTexts:
        """Token bytes/text for OpenAI logprobs (built on first use: the tokenizer loads after start-up)."""
        if self._token_texts is None:
            self._token_texts = TokenTexts(self.tm.tokenizer)
        return self._token_texts

    def chat_format(self, build: Callable[[], ChatFormat]) -> ChatFormat:
        """The chat template and tool-call/reasoning parsers (``build()`` on the first chat request)."""
        if self._chat_format is None:
            self._chat_format = build()
        return self._chat_format

    def responses(self, build: Callable[[], ResponseStore]) -> ResponseStore:
        """The stored responses of /v1/responses (``build()`` on first use)."""
        if self._responses is None:
            self._responses = build()
        return self._responses


def model_info(args) -> dict:
    """``GET /get_model_info``: the model file or folder (``.gguf`` path when the model is one)."""
    from radixrt.runtime.models.loader import resolve_model

    src = resolve_model(args.model)
    path = os.path.join(src.directory, src.gguf_file) if src.gguf_file else src.directory
    return {"model_path": path, "tokenizer_path": path, "is_generation": True}


def ctx(request: Request) -> ServerContext:
    return request.app.state.ctx
