"""Reasoning parsers (``--reasoning-parser``, as in SGLang and vLLM): split ``<think>...</think>`` out of
the output into ``reasoning_content``.

=============  ============================================================================
parser         behaviour
=============  ============================================================================
qwen3          reasoning when the output opens with ``<think>`` (Qwen3 hybrid models), or
               when the rendered prompt ends inside an open ``<think>`` (thinking-only
               templates put the tag in the prompt)
deepseek-r1    the output always starts in reasoning (the template opens ``<think>``)
=============  ============================================================================

The reasoning text is stripped of surrounding whitespace, and so is the start of the content after
``</think>``. Streaming and non-streaming agree: both rescan the whole text and the stream sends the
difference (trailing whitespace is held back until more text shows whether it is trailing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from radixrt.runtime.parsers.json_scan import held_back


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str = "<think>"
    end: str = "</think>"
    forced: bool = False  # the output starts inside reasoning

    def starts_in_reasoning(self, prompt: str) -> bool:
        """True when the output begins inside reasoning: forced, or ``prompt`` leaves a start tag open."""
        return self.forced or prompt.rfind(self.start) > prompt.rfind(self.end)

    def split(self, text: str, in_reasoning: bool, final: bool) -> tuple[str, str]:
        """``(reasoning, content)`` of the output so far. Unless ``final``, text that may still become a
        tag is held back."""
        i = 0
        if not in_reasoning:
            lead = text.lstrip()
            if lead.startswith(self.start):
                i = len(text) - len(lead) + len(self.start)
            elif not final and lead and self.start.startswith(lead):
                return "", ""  # may still open reasoning
            elif not final and not lead:
                return "", ""
            else:
                return "", text
        j = text.find(self.end, i)
        if j < 0:
            body = text[i:]
            if not final:
                body = body[: len(body) - held_back(body, self.end)]
            return body.strip(), ""
        return text[i:j].strip(), text[j + len(self.end) :].lstrip()


REASONING_PARSERS = {
    "qwen3": ReasoningFormat("qwen3"),
    "deepseek-r1": ReasoningFormat("deepseek-r1", forced=True),
}


def get_reasoning_format(name: str) -> ReasoningFormat:
    """Raises ValueError naming ``reasoning_parser`` and the known names."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, got {name!r}") from None


@dataclass
class ReasoningStream:
    """Feeds model text; returns ``(reasoning_delta, content_delta)`` pairs that add up to :meth:`result`."""

    fmt: ReasoningFormat
    in_reasoning: bool
    text: str = ""
    sent_reasoning: str = ""
    sent_content: str = ""

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        self.text += delta
        reasoning, content = self.fmt.split(self.text, self.in_reasoning, final)
        r = reasoning[len(self.sent_reasoning) :] if reasoning.startswith(self.sent_reasoning) else ""
        c = content[len(self.sent_content) :] if content.startswith(self.sent_content) else ""
        self.sent_reasoning += r
        self.sent_content += c
        return r, c

    def finish(self) -> tuple[str, str]:
        return self.feed("", final=True)

    def result(self) -> tuple[Optional[str], str]:
        """After :meth:`finish`: ``(reasoning_content or None, content)``."""
        return (self.sent_reasoning or None), self.sent_content
