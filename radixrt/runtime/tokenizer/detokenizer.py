"""Incremental detokenization with tokenizers' ``DecodeStream``.

- A multi-byte character split across tokens is held until complete, so no delta shows U+FFFD.
- A streamed delta never shows a prefix of a stop string that may still match: the longest suffix of
  the text that begins some stop string is held back until the match fails or the request ends.
- On a stop-string finish the text is cut before the stop string (unless ``no_stop_trim``).
- With ``skip_special_tokens=False``, ``spaces_between_special_tokens`` (default, as SGLang and
  transformers' slow tokenizers) puts one space between a special token and its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from radixrt.runtime.io_struct import BatchStrOut, BatchTokenOut, StrOut, TokenOut


@dataclass
class _State:
    stream: DecodeStream
    text: str = ""
    sent: int = 0
    stops: list[str] = field(default_factory=list)
    spaced: bool = False  # special tokens shown and spaces_between_special_tokens: HF slow-decode spacing
    last_special: bool = False  # the last token that produced text was a special token


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
        # the Rust tokenizer itself (the detokenizer process loads only it), or a transformers fast tokenizer's
        self.tok = tokenizer if isinstance(tokenizer, Tokenizer) else tokenizer.backend_tokenizer
        self.states: dict[str, _State] = {}
        # the tokenizer's special added tokens (the ones skip_special_tokens drops)
        self.special = {i for i, t in self.tok.get_added_tokens_decoder().items() if t.special}

    def handle(self, batch: BatchTokenOut) -> BatchStrOut:
        return BatchStrOut([self.handle_one(o) for o in batch.outs])

    def handle_one(self, o: TokenOut) -> StrOut:
        st = self.states.get(o.rid)
        if st is None:
            st = self.states[o.rid] = _State(
                DecodeStream(skip_special_tokens=o.skip_special_tokens),
                stops=list(o.stop_strings),
                spaced=not o.skip_special_tokens and o.spaces_between_special_tokens,
            )
        for t in o.new_token_ids:
            chunk = st.stream.step(self.tok, t)
            if chunk:
                if st.spaced:
                    # as transformers' slow decode: special tokens and the text runs between them are
                    # joined with single spaces
                    special = t in self.special
                    if st.text and (special or st.last_special):
                        chunk = " " + chunk
                    st.last_special = special
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
        delta = st.text[st.sent : end]
        st.sent = end
        return StrOut(rid=o.rid, text_delta=delta, token=o)
