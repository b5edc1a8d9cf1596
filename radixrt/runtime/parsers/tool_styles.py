"""The scanning styles of ``tool_choice`` (tool_parser.py's tool plan): model text with ``<tool_call>``
blocks (``tagged``, for auto), one JSON array of call objects (``array``, for required) or one call object
(``object``, for a named function), as a format of :class:`~radixrt.runtime.parsers.tool_stream.ToolCallStream`.

The JSON scanning itself is :mod:`radixrt.runtime.parsers.json_scan`, shared with the per-family formats of
:mod:`radixrt.runtime.parsers.tool_formats`.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixrt.runtime.parsers.json_scan import Call as _Call
from radixrt.runtime.parsers.json_scan import Incomplete as _Incomplete
from radixrt.runtime.parsers.json_scan import NotACall as _Bad
from radixrt.runtime.parsers.json_scan import call_object as _call_object
from radixrt.runtime.parsers.json_scan import skip_ws as _ws

STYLES = ("tagged", "array", "object")
TOOL_CALL_BEGIN = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


def scan(text: str, style: str, final: bool) -> tuple[str, list[_Call], bool]:
    """Split model output into (text outside calls, calls, ok).

    ``style``: ``tagged`` (text with ``<tool_call>...</tool_call>`` blocks), ``array`` (a JSON array of call
    objects) or ``object`` (one call object). When not ``final``, a trailing piece that may still become a
    trigger is left out of the text. ``ok`` is False when the JSON styles do not parse as calls.
    """
    calls: list[_Call] = []
    if style == "tagged":
        out = []
        pos = 0
        while True:
            j = text.find(TOOL_CALL_BEGIN, pos)
            if j < 0:
                tail = text[pos:]
                if not final:
                    for k in range(min(len(TOOL_CALL_BEGIN) - 1, len(tail)), 0, -1):
                        if TOOL_CALL_BEGIN.startswith(tail[-k:]):
                            tail = tail[:-k]
                            break
                out.append(tail)
                return "".join(out), calls, True
            out.append(text[pos:j])
            n = len(calls)
            try:
                i = _call_object(text, j + len(TOOL_CALL_BEGIN), final, calls)
                i = _ws(text, i)
                if not text.startswith(TOOL_CALL_END, i):
                    if TOOL_CALL_END.startswith(text[i:]):
                        raise _Incomplete
                    raise _Bad
                pos = i + len(TOOL_CALL_END)
            except _Incomplete:
                if final and all(c.name is None for c in calls[n:]):  # cut (max_tokens) before its name: text,
                    del calls[n:]  # as vLLM answers an unparsable call, rather than nothing at all
                    out.append(text[j:])
                return "".join(out), calls, True
            except _Bad:  # not a call after all: keep it as text
                del calls[n:]
                out.append(TOOL_CALL_BEGIN)
                pos = j + len(TOOL_CALL_BEGIN)
    try:
        i = _ws(text, 0)
        if style == "object":
            i = _call_object(text, i, final, calls)
        else:
            if i >= len(text):
                raise _Incomplete
            if text[i] != "[":
                raise _Bad
            i = _ws(text, i + 1)
            if text.startswith("]", i):
                i += 1
            else:
                while True:
                    i = _ws(text, _call_object(text, i, final, calls))
                    if i >= len(text):
                        raise _Incomplete
                    if text[i] == "]":
                        i += 1
                        break
                    if text[i] != ",":
                        raise _Bad
                    i += 1
        if text[_ws(text, i) :].strip():
            raise _Bad
    except _Incomplete:
        pass
    except _Bad:
        return "", calls, False
    return "", calls, True


@dataclass
class StyleFormat:
    """One of :data:`STYLES` as a ToolCallStream format (``scan`` + ``content_target``)."""

    style: str
    ok: bool = True  # False once the JSON styles' text does not parse as calls

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {self.style!r}")

    def scan(self, text: str, final: bool) -> tuple[str, list[_Call]]:
        content, calls, self.ok = scan(text, self.style, final)
        return content, calls

    def content_target(self, text: str, content: str, calls: list, final: bool, num_sent: int) -> str:
        """The content that should have been sent by now: JSON styles carry no text, and output that is
        not a call at all comes back whole as content at the end."""
        if self.style == "tagged":
            return default_content_target(content, calls, final)
        if final and (not self.ok or not any(c.name for c in calls)) and not num_sent:
            return text
        return ""


def default_content_target(content: str, calls: list, final: bool) -> str:
    """Text outside calls, less trailing whitespace while streaming (held back: it is dropped if a call
    follows), all of it at the end when no call came."""
    return content if final and not any(c.name for c in calls) else content.rstrip()
