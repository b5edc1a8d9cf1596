"""What every route needs: the server's arguments, the TokenizerManager, the metrics; kept on
``app.state.ctx`` so that routers are plain module-level :class:`fastapi.APIRouter` s."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import Request

from radixrt.runtime.server.openai_protocol import TokenTexts, now

START_TIME = now()  # the ``created`` of /v1/models (seconds since the epoch)


@dataclass
class ServerContext:
    args: Any                       # ServerArgs
    tm: Any                         # TokenizerManager
    metrics: Optional[Any] = None   # Metrics, with --enable-metrics
    chat_format: Optional[Any] = None  # ChatFormat, built on the first chat request
    _token_texts: Optional[TokenTexts] = field(default=None, repr=False)

    def token_texts(self) -> TokenTexts:
        """Token bytes/text for OpenAI logprobs (built on first use: the tokenizer loads after start-up)."""
        if self._token_texts is None:
            self._token_texts = TokenTexts(self.tm.tokenizer)
        return self._token_texts


def ctx(request: Request) -> ServerContext:
    return request.app.state.ctx
