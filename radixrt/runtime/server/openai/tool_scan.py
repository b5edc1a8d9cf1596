"""Parsing tool calls out of model output (see tool_parser.py for the prompt and grammar side).

``scan`` finds complete and partial ``<tool_call>`` blocks (auto) or the JSON call array/object
(required / named); ``ToolCallStream`` turns streamed text into OpenAI tool-call deltas whose arguments
concatenate to the non-streamed value. The tool plan (tool_parser.py) builds on this module, never the
other way round. The JSON scanning itself is :mod:`radixrt.runtime.parsers.json_scan`, shared with the
per-family formats of :mod:`radixrt.runtime.parsers.tool_formats`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from radixrt.runtime.parsers.json_scan import Call as _Call
from radixrt.runtime.parsers.json_scan import Incomplete as _Incomplete
from radixrt.runtime.parsers.json_scan import NotACall as _Bad
from radixrt.runtime.parsers.json_scan import call_object as _call_object
from radixrt.runtime.parsers.json_scan import skip_ws as _ws
from radixrt.runtime.parsers.tool_stream import call_deltas, sent_message

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
        if text[_ws(text, i):].strip():
            raise _Bad
    except _Incomplete:
        pass
    except _Bad:
        return "", calls, False
    return "", calls, True


@dataclass
class ToolCallStream:
    """Turns a model's text, fed in deltas, into OpenAI chat deltas (content and tool-call pieces).

    ``feed(delta)`` and ``finish()`` return lists of ``delta`` dicts (``{"content": ...}`` or ``{"tool_calls":
    [one piece]}``, OpenAI's shapes: first ``{index, id, type, function: {name, arguments: ""}}``, then
    ``{index, function: {arguments: <chunk>}}``). Every delta is a diff against what was already sent,
    computed by rescanning the whole text, so the streamed pieces always add up to :meth:`message`'s.
    """

    style: str
    text: str = ""
    sent_content: str = ""
    ids: list = field(default_factory=list)          # per emitted call: its id
    sent_args: list = field(default_factory=list)    # per emitted call: characters of arguments sent
    done: bool = False
    _calls: list = field(default_factory=list)
    _ok: bool = True

    def feed(self, delta: str) -> list[dict]:
        self.text += delta
        return self._diff(final=False)

    def finish(self) -> list[dict]:
        self.done = True
        return self._diff(final=True)

    def _diff(self, final: bool) -> list[dict]:
        content, calls, ok = scan(self.text, self.style, final)
        self._calls, self._ok = calls, ok
        out: list[dict] = []
        target = self._content_target(content, calls, ok, final)
        if len(target) > len(self.sent_content) and target.startswith(self.sent_content):
            out.append({"content": target[len(self.sent_content):]})
            self.sent_content = target
        return out + call_deltas(calls, self.ids, self.sent_args)

    def _content_target(self, content: str, calls: list, ok: bool, final: bool) -> str:
        if self.style != "tagged":
            # JSON styles carry no text; output that is not a call at all comes back as content at the end
            return self.text if final and (not ok or not any(c.name for c in calls)) and not self.ids else ""
        if final and not any(c.name for c in calls):
            return content
        return content.rstrip()

    def has_complete_call(self) -> bool:
        return any(c.complete for c in self._calls[:len(self.ids)])

    def message(self) -> tuple[Optional[str], list[dict]]:
        """After :meth:`finish`: ``(content, tool_calls)`` as sent (``content`` None when empty and there
        are calls)."""
        return sent_message(self.sent_content, self.ids, self._calls)

    def finish_reason(self, base: Optional[str]) -> Optional[str]:
        """``tool_calls`` when generation stopped normally after a complete call; else ``base``."""
        if base == "stop" and self.has_complete_call():
            return "tool_calls"
        return base

