"""Incremental detokenization with tokenizers' ``DecodeStream``.

- A multi-byte character split across tokens is held until complete, so no delta shows U+FFFD.
- A streamed delta never shows a prefix of a stop string that may still match: the longest suffix of
  the text that begins some stop string is held back until the match fails or the request ends.
- On a stop-string finish the text is cut before the stop string (unless ``no_stop_trim``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tokenizers.decoders import DecodeStream

from radixrt.runtime.io_struct import BatchStrOut, BatchTokenOut, StrOut, TokenOut


@dataclass
class _State:
    stream: DecodeStream
    text: str = ""
    sent: int = 0
    stops: list[str] = field(default_factory=list)


def _held_back(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class Detokenizer:
    """Turns :class:`BatchTokenOut` into :class:`BatchStrOut`; one state per live request."""

    def __init__(self, tokenizer):
        self.tok = tokenizer._tokenizer if hasattr(tokenizer, "_tokenizer") else tokenizer
        self.states: dict[str, _State] = {}

    def handle(self, batch: BatchTokenOut) -> BatchStrOut:
        return BatchStrOut([self.handle_one(o) for o in batch.outs])

    def handle_one(self, o: TokenOut) -> StrOut:
        st = self.states.get(o.rid)
        if st is None:
            st = self.states[o.rid] = _State(DecodeStream(skip_special_tokens=o.skip_special_tokens),
                                             stops=list(o.stop_strings))
        for t in o.new_token_ids:
            chunk = st.stream.step(self.tok, t)
            if chunk:
                st.text += chunk
        end = len(st.text)
        if o.finished_reason is not None:
            self.states.pop(o.rid, None)
            if st.stops and not o.no_stop_trim:
                hits = [i for i in (st.text.find(s, max(st.sent - len(s), 0)) for s in st.stops) if i >= 0]
                if hits:
                    end = min(hits)
        else:
            end -= _held_back(st.text, st.stops)
        end = max(end, st.sent)
        delta = st.text[st.sent:end]
        st.sent = end
        return StrOut(rid=o.rid, text_delta=delta, token=o)
