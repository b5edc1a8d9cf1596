"""A token's exact bytes and its text, for logprobs (OpenAI's ``logprobs.content[].bytes``/``token``)."""

from __future__ import annotations

import json
from functools import lru_cache

from radixrt.runtime.constrained.vocab import piece_bytes, special_token_ids


class TokenTexts:
    """A token's exact bytes (byte-level BPE, see :mod:`radixrt.runtime.constrained.vocab`) and its text,
    for OpenAI logprobs."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.byte_level = False
        try:
            spec = json.loads(tokenizer.backend_tokenizer.to_str())
            self.byte_level = (spec.get("decoder") or {}).get("type") == "ByteLevel"
        except Exception:
            pass
        self.special = special_token_ids(tokenizer)  # their text as written; every other id is byte-level
        self.token_bytes = lru_cache(maxsize=65536)(self._token_bytes)

    def _token_bytes(self, tid: int) -> bytes:
        if self.byte_level and tid not in self.special:
            piece = self.tok.convert_ids_to_tokens(tid)
            raw = piece_bytes(piece) if isinstance(piece, str) else None
            if raw is not None:
                return raw
        return self.tok.decode([tid]).encode("utf-8")

    def text(self, tid: int) -> str:
        return self.token_bytes(tid).decode("utf-8", errors="replace")
