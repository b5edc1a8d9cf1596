"""Turn continuity: the exact token ids the model generated for each assistant turn, spliced back into a
later prompt that renders the same turn, so the radix tree matches the previous request's prompt **and
output** instead of diverging at the turn's first token.

Why: a chat template renders an earlier assistant turn from the client's copy of it (its text, its tool
calls with the arguments often re-serialized, its reasoning often stripped), and tokenizing that text
rarely gives the ids the model sampled (a tool call generated as a JSON array comes back as a
``<tool_call>`` block; BPE merges differ at every boundary). The cache then misses every token the model
generated, each turn (SGLang, vLLM, llama.cpp and Ollama users report it; llama.cpp's
``--reasoning-preserve`` and SGLang's ``--strip-thinking-cache`` are the same choice as
``--reasoning-history`` here).

A turn is keyed by a hash of (``cache_salt``, the prompt text it was generated from, its canonical form:
stripped content and the tool calls with their arguments parsed and dumped with sorted keys), so keys are
per conversation, tenants never share entries, and verbatim and re-serialized arguments meet the same
entry. The store is an LRU bounded by entry count (``--turn-store-size``); what the APIs render and where
the turn sits in the prompt is theirs to say (see ``server/openai/continuity.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class TurnIds:
    ids: tuple[int, ...]  # the generated ids, as sampled (the final EOS / stop token included)
    reasoning: str  # the reasoning text the parser split off ("" without reasoning)


def canonical_args(args: Any) -> Any:
    """A tool call's arguments as an object when they are JSON text (re-serialized or verbatim: one form)."""
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def turn_key(salt: Optional[str], prefix_text: str, content: Optional[str], tool_calls: Optional[list]) -> bytes:
    """The store key of an assistant turn generated after ``prefix_text`` (the rendered prompt before it).

    ``tool_calls``: OpenAI-shaped calls (``{"function": {"name", "arguments"}}``) or bare
    ``{"name", "arguments"}``; ids and types are not part of the key (templates do not render them).
    """
    calls = []
    for c in tool_calls or []:
        fn = c.get("function", c) if isinstance(c, dict) else {}
        calls.append([fn.get("name"), canonical_args(fn.get("arguments", {}))])
    canon = json.dumps([salt, (content or "").strip(), calls], sort_keys=True, ensure_ascii=False)
    h = hashlib.blake2b(digest_size=20)
    h.update(prefix_text.encode("utf-8", "surrogatepass"))
    h.update(b"\x00")
    h.update(canon.encode("utf-8", "surrogatepass"))
    return h.digest()


class TurnStore:
    """An LRU of ``key -> TurnIds``, at most ``capacity`` entries (0: continuity off)."""

    def __init__(self, capacity: int):
        if not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"turn_store_size must be an integer >= 0, got {capacity!r}")
        self.capacity = capacity
        self._d: OrderedDict[bytes, TurnIds] = OrderedDict()

    def __len__(self) -> int:
        return len(self._d)

    def put(self, key: bytes, ids: list[int], reasoning: str = "") -> None:
        if self.capacity == 0 or not ids:
            return
        self._d[key] = TurnIds(tuple(ids), reasoning or "")
        self._d.move_to_end(key)
        while len(self._d) > self.capacity:
            self._d.popitem(last=False)

    def get(self, key: bytes) -> Optional[TurnIds]:
        t = self._d.get(key)
        if t is not None:
            self._d.move_to_end(key)
        return t


def splice_encode(tokenizer, prompt: str, spans: list[tuple[int, int, tuple[int, ...]]]) -> list[int]:
    """``prompt`` tokenized with each ``(start, end, ids)`` span's text replaced by ``ids``; the text
    between spans is tokenized piece by piece (each piece starts where the tree's previous key ended, so
    the ids before a span are those the earlier request was given). Spans must be sorted and disjoint."""
    out: list[int] = []
    pos = 0
    for start, end, ids in spans:
        if start < pos or end < start:
            raise ValueError(f"spans must be sorted and disjoint: {start}..{end} after {pos}")
        if start > pos:
            out += tokenizer.encode(prompt[pos:start], add_special_tokens=False)
        out += ids
        pos = end
    if pos < len(prompt):
        out += tokenizer.encode(prompt[pos:], add_special_tokens=False)
    return out
