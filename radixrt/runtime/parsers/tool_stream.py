"""Streaming tool-call parsing: model text in, OpenAI chat deltas out, for any :class:`ToolFormat`.

Every ``feed`` rescans the whole text and sends the difference from what was already sent, so the streamed
pieces always add up to :meth:`ToolCallStream.message`'s values (the non-streamed answer is the same parse
run once). Delta shapes are OpenAI's: ``{"content": ...}``; a call's first piece ``{"tool_calls": [{index,
id, type: "function", function: {name, arguments: ""}}]}``, then ``{"tool_calls": [{index, function:
{arguments: <chunk>}}]}``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from radixrt.runtime.parsers.tool_formats import ToolFormat
from radixrt.runtime.parsers.tool_styles import StyleFormat, default_content_target


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def call_deltas(calls: list, ids: list[str], sent_args: list[int]) -> list[dict]:
    """The tool-call deltas not yet sent for ``calls`` (scanned objects with ``name``/``args``); updates
    ``ids`` (one per emitted call) and ``sent_args`` (argument characters sent per call) in place."""
    out: list[dict] = []
    for idx, c in enumerate(calls):
        if c.name is None:
            break  # calls are streamed in order, each once its name is known
        if idx == len(ids):
            ids.append(new_call_id())
            sent_args.append(0)
            out.append(
                {
                    "tool_calls": [
                        {
                            "index": idx,
                            "id": ids[idx],
                            "type": "function",
                            "function": {"name": c.name, "arguments": ""},
                        }
                    ]
                }
            )
        args = c.args or ""
        if len(args) > sent_args[idx]:
            out.append({"tool_calls": [{"index": idx, "function": {"arguments": args[sent_args[idx] :]}}]})
            sent_args[idx] = len(args)
    return out


def sent_message(content: str, ids: list[str], calls: list) -> tuple[Optional[str], list[dict]]:
    """``(content, tool_calls)`` as streamed: ``content`` is None when empty and there are calls."""
    out = [
        {"id": ids[i], "type": "function", "function": {"name": c.name, "arguments": c.args or ""}}
        for i, c in enumerate(calls[: len(ids)])
    ]
    return (None if out and not content else content), out


@dataclass
class ToolCallStream:
    """Model text fed in deltas -> OpenAI chat deltas, for a model family's :class:`ToolFormat` or a tool
    plan's scanning style (:class:`StyleFormat`, or its name: ``tagged``, ``array``, ``object``).

    Raises:
        ValueError: an unknown style name.
    """

    fmt: Union[ToolFormat, StyleFormat, str]
    text: str = ""
    sent_content: str = ""
    ids: list = field(default_factory=list)  # per emitted call: its id
    sent_args: list = field(default_factory=list)  # per emitted call: characters of arguments sent
    _calls: list = field(default_factory=list)

    def __post_init__(self):
        if isinstance(self.fmt, str):
            self.fmt = StyleFormat(self.fmt)

    def feed(self, delta: str) -> list[dict]:
        """Append model text; returns the deltas to send now."""
        self.text += delta
        return self._diff(final=False)

    def finish(self) -> list[dict]:
        """The output ended; returns the last deltas (held-back text, a final number, ...)."""
        return self._diff(final=True)

    def _diff(self, final: bool) -> list[dict]:
        content, calls = self.fmt.scan(self.text, final)
        self._calls = calls
        out: list[dict] = []
        if isinstance(self.fmt, StyleFormat):
            target = self.fmt.content_target(self.text, content, calls, final, len(self.ids))
        else:
            target = default_content_target(content, calls, final)
        if len(target) > len(self.sent_content) and target.startswith(self.sent_content):
            out.append({"content": target[len(self.sent_content) :]})
            self.sent_content = target
        return out + call_deltas(calls, self.ids, self.sent_args)

    @property
    def num_calls(self) -> int:
        return len(self.ids)

    def has_complete_call(self) -> bool:
        return any(c.complete for c in self._calls[: len(self.ids)])

    def message(self) -> tuple[Optional[str], list[dict]]:
        """After :meth:`finish`: ``(content, tool_calls)`` as sent (``content`` None when empty and there
        are calls)."""
        return sent_message(self.sent_content, self.ids, self._calls)

    def finish_reason(self, base: Optional[str]) -> Optional[str]:
        """``tool_calls`` when generation stopped normally after a complete call; else ``base``."""
        return "tool_calls" if base == "stop" and self.has_complete_call() else base


def parse_tool_output(fmt: ToolFormat, text: str, base_finish: Optional[str]) -> tuple[dict, Optional[str]]:
    """A finished non-streamed choice: ``(message, finish_reason)``."""
    return parse_with(ToolCallStream(fmt), text, base_finish)


def parse_with(st: Any, text: str, base_finish: Optional[str]) -> tuple[dict, Optional[str]]:
    """Run a fresh stream over a whole output, exactly as streaming
    would: ``(message, finish_reason)``."""
    st.feed(text)
    st.finish()
    content, calls = st.message()
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    return msg, st.finish_reason(base_finish)
