"""One chat choice's output, parsed as it streams: reasoning first (``reasoning_content``), then the
answer, which is either plain ``content`` or, with tools, content and ``tool_calls`` deltas.

Streamed and non-streamed answers come from the same object: the non-streamed one feeds the whole text at
once, so both agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from radixrt.runtime.parsers.reasoning import ReasoningStream


@dataclass
class ChoiceParser:
    reasoning: Optional[ReasoningStream] = None
    tools: Any = None  # a tool-call stream: feed / finish / message / finish_reason
    content: str = ""  # plain content sent (no tools)

    def feed(self, delta: str, final: bool = False) -> list[dict]:
        """Model text in; OpenAI chat deltas out (``reasoning_content``, ``content``, ``tool_calls``)."""
        if self.reasoning is not None:
            r, c = self.reasoning.feed(delta, final)
        else:
            r, c = "", delta
        out: list[dict] = [{"reasoning_content": r}] if r else []
        if self.tools is not None:
            out += self.tools.feed(c)
            if final:
                out += self.tools.finish()
        elif c:
            self.content += c
            out.append({"content": c})
        return out

    def finish(self) -> list[dict]:
        return self.feed("", final=True)

    def message(self) -> dict:
        """After :meth:`finish`: the assistant message as sent."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tools is not None:
            msg["content"], calls = self.tools.message()
            if calls:
                msg["tool_calls"] = calls
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning.result()[0]
        return msg

    def finish_reason(self, base: Optional[str]) -> Optional[str]:
        return self.tools.finish_reason(base) if self.tools is not None else base

    def parse(self, text: str, base: Optional[str]) -> tuple[dict, Optional[str]]:
        """A finished non-streamed choice: ``(message, finish_reason)``."""
        self.feed(text)
        self.finish()
        return self.message(), self.finish_reason(base)
