"""Scanning tool-call JSON objects in text that may still be growing (streamed model output).

A call object is ``{"name": "<fn>", "arguments": <json>}`` (``"parameters"`` is accepted for
``arguments``, as Llama 3.x writes it). The scan checks structure only: a grammar already validated the
arguments, and ``json.loads`` of a finished call's ``args`` text is what a caller relies on. While the
text is incomplete the scan reports what it has (the name once its string closed, the raw arguments text so
far), so that streamed argument deltas are always prefixes of the final text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

WS = " \t\n\r"
_SCALAR = re.compile(r"-?[0-9.eE+\-]+|true|false|null")


class Incomplete(Exception):
    """The text ends inside the construct being scanned."""


class NotACall(Exception):
    """The text cannot be a call."""


@dataclass
class Call:
    name: Optional[str] = None
    args: Optional[str] = None  # raw JSON text of the arguments so far (a prefix of the final text)
    complete: bool = False


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in WS:
        i += 1
    return i


def string_end(s: str, i: int) -> int:
    """Index after the JSON string starting at ``s[i] == '"'``. Raises Incomplete."""
    i += 1
    while i < len(s):
        if s[i] == "\\":
            i += 2
            continue
        if s[i] == '"':
            return i + 1
        i += 1
    raise Incomplete


def value_end(s: str, i: int, final: bool) -> int:
    """Index after the JSON value starting at ``s[i]``. Raises Incomplete or NotACall."""
    if i >= len(s):
        raise Incomplete
    c = s[i]
    if c == '"':
        return string_end(s, i)
    if c in "{[":
        depth = 0
        while i < len(s):
            c = s[i]
            if c == '"':
                i = string_end(s, i)
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise Incomplete
    m = _SCALAR.match(s, i)
    if not m:
        if any(w.startswith(s[i:]) for w in ("true", "false", "null")):
            raise Incomplete
        raise NotACall
    if m.end() == len(s) and not final:
        raise Incomplete  # a number may go on
    return m.end()


def call_object(s: str, i: int, final: bool, calls: list[Call]) -> int:
    """Scan a call object at ``s[i]`` (after optional whitespace), appending a :class:`Call` to ``calls``.

    Returns the index after the closing brace. Raises Incomplete (the partial call stays in ``calls``) or
    NotACall.
    """
    call = Call()
    calls.append(call)
    i = skip_ws(s, i)
    if i >= len(s):
        raise Incomplete
    if s[i] != "{":
        raise NotACall
    i += 1
    first = True
    while True:
        i = skip_ws(s, i)
        if i >= len(s):
            raise Incomplete
        if s[i] == "}":
            if call.name is None or call.args is None:
                raise NotACall
            call.complete = True
            return i + 1
        if not first:
            if s[i] != ",":
                raise NotACall
            i = skip_ws(s, i + 1)
            if i >= len(s):
                raise Incomplete
        first = False
        if s[i] != '"':
            raise NotACall
        k_end = string_end(s, i)
        key = json.loads(s[i:k_end])
        i = skip_ws(s, k_end)
        if i >= len(s):
            raise Incomplete
        if s[i] != ":":
            raise NotACall
        i = skip_ws(s, i + 1)
        if key == "name":
            if i >= len(s):
                raise Incomplete
            if s[i] != '"':
                raise NotACall
            end = string_end(s, i)
            call.name = json.loads(s[i:end])
            i = end
        elif key in ("arguments", "parameters"):
            try:
                end = value_end(s, i, final)
            except Incomplete:
                call.args = s[i:]
                raise
            call.args = s[i:end]
            i = end
        else:
            i = value_end(s, i, final)


def call_list(s: str, i: int, final: bool, calls: list[Call], sep: str = ",", close: str = "]") -> int:
    """Calls separated by ``sep`` up to ``close``: ``]`` for a JSON array (returns the index after it), or
    ``""`` for Llama's ``;``-separated calls (returns the index after the last call; what follows is text).
    Raises Incomplete (the text may still grow into another call) or NotACall."""
    while True:
        end = call_object(s, i, final, calls)
        i = skip_ws(s, end)
        if i >= len(s):
            if close or not final:
                raise Incomplete
            return end
        if close and s[i] == close:
            return i + 1
        if s[i] != sep:
            if close:
                raise NotACall
            return end
        i += 1


def held_back(tail: str, marker: str) -> int:
    """Length of the longest suffix of ``tail`` that is a proper prefix of ``marker`` (it may still grow
    into the marker, so a stream holds it back)."""
    for k in range(min(len(marker) - 1, len(tail)), 0, -1):
        if marker.startswith(tail[-k:]):
            return k
    return 0
