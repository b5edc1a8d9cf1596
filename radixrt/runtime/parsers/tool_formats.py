"""Tool-call output formats, one per model family, as SGLang's ``--tool-call-parser`` names them.

- ``hermes``: text, then ``<tool_call>{"name": .., "arguments": ..}</tool_call>`` blocks (the injected
  fallback prompt); ``qwen25`` (alias ``qwen``, ``qwen3``): the same with the JSON on its own line, as
  Qwen2.5 and Qwen3 write it;
- ``llama3``: text, then ``{"name": .., "parameters": ..}`` objects joined by ``;``, optionally after
  ``<|python_tag|>`` (Llama 3.1 / 3.2 / 3.3);
- ``mistral``: text, then ``[TOOL_CALLS] [{"name": .., "arguments": ..}, ..]`` (Mistral v0.3 and later).

Each format scans output text into (content, calls) — tolerant of the whitespace variants the grammar or
the model may produce — and builds the xgrammar structural tag that constrains ``tool_choice: auto``
output to its own syntax: free text until a trigger, then one of the tools' calls with arguments that
match the tool's ``parameters`` schema.
"""

from __future__ import annotations

import copy
import re
from abc import ABC, abstractmethod
from typing import Optional

from radixrt.runtime.parsers.json_scan import Call, Incomplete, NotACall, call_list, call_object, held_back, skip_ws

MAX_WS_IN_TAG = 1  # JSON whitespace characters allowed between tokens inside a constrained call


class ToolFormat(ABC):
    """One format: ``scan`` parses output, ``structural_tag`` constrains it."""

    name: str
    markers: tuple[str, ...]  # literal text that opens a call block
    trigger: str  # the structural tag's trigger: free text until the model writes it
    end: str  # constrained text after a call's arguments
    skip_special_tokens = True  # False when a marker is a special token the detokenizer would drop
    end_texts: tuple[str, ...] = ()  # end-of-turn tokens' text, kept by skip_special_tokens=False: not content

    def _find(self, text: str, pos: int) -> tuple[int, str]:
        """First marker at or after ``pos``: ``(index, marker)`` or ``(-1, "")``."""
        best = (-1, "")
        for m in self.markers:
            j = text.find(m, pos)
            if j >= 0 and (best[0] < 0 or j < best[0]):
                best = (j, m)
        return best

    def hold(self, tail: str) -> int:
        """How many trailing characters of ``tail`` may still grow into a marker (held back from a stream)."""
        return max(held_back(tail, mk) for mk in self.markers)

    @abstractmethod
    def _block(self, text: str, j: int, marker: str, final: bool, calls: list[Call]) -> int:
        """Parse the call block whose marker starts at ``text[j]``; returns the index after the block.
        Raises Incomplete or NotACall."""

    def scan(self, text: str, final: bool) -> tuple[str, list[Call]]:
        """Split output into (text outside calls, calls). Unless ``final``, a trailing piece that may
        still become a marker is held back from the text, and the last call may be partial."""
        out: list[str] = []
        calls: list[Call] = []
        pos = 0
        for e in self.end_texts:  # an end-of-turn token is the last one: drop its text
            if text.endswith(e):
                text = text[: -len(e)]
                break
        while True:
            j, m = self._find(text, pos)
            if j < 0:
                tail = text[pos:]
                if not final:
                    k = max([self.hold(tail)] + [held_back(tail, e) for e in self.end_texts])
                    tail = tail[: len(tail) - k]
                out.append(tail)
                return "".join(out), calls
            out.append(text[pos:j])
            n = len(calls)
            try:
                pos = self._block(text, j, m, final, calls)
            except Incomplete:
                if final and all(c.name is None for c in calls[n:]):  # cut (max_tokens) before its name: text,
                    del calls[n:]  # as vLLM answers an unparsable call, rather than nothing at all
                    out.append(text[j:])
                return "".join(out), calls
            except NotACall:  # not a call after all: the marker is plain text
                del calls[n:]
                out.append(m)
                pos = j + len(m)

    def structural_tag(self, tools: list, parallel: bool = True) -> dict:
        """xgrammar ``structural_tag`` for ``tool_choice: auto`` over ``tools`` (objects with ``.name`` and
        ``.parameters``); ``parallel=False`` stops after the first call."""
        from radixrt.runtime.constrained.schema_prep import prepare_schema

        tags = [
            {
                "type": "tag",
                "begin": self.begin(t.name),
                "content": {
                    "type": "json_schema",
                    "json_schema": prepare_schema(copy.deepcopy(t.parameters)),
                    "max_whitespace_cnt": MAX_WS_IN_TAG,
                },
                "end": self.end,
            }
            for t in tools
        ]
        return {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "triggers": [self.trigger],
                "tags": tags,
                "stop_after_first": not parallel,
            },
        }

    @abstractmethod
    def begin(self, name: str) -> str:
        """The constrained text before a call's arguments."""


class HermesFormat(ToolFormat):
    """``<tool_call>{json}</tool_call>``; ``newlines`` puts the JSON on its own line (Qwen2.5/Qwen3)."""

    BEGIN, END = "<tool_call>", "</tool_call>"
    markers = (BEGIN,)
    trigger = BEGIN

    def __init__(self, name: str = "hermes", newlines: bool = False):
        self.name, self.nl = name, "\n" if newlines else ""
        self.end = "}" + self.nl + self.END

    def begin(self, name: str) -> str:
        return f'{self.BEGIN}{self.nl}{{"name": "{name}", "arguments": '

    def _block(self, text, j, marker, final, calls):
        i = skip_ws(text, call_object(text, j + len(marker), final, calls))
        if text.startswith(self.END, i):
            return i + len(self.END)
        if self.END.startswith(text[i:]):
            raise Incomplete
        raise NotACall


class Llama3Format(ToolFormat):
    """Llama 3.x JSON calls: ``{"name": .., "parameters": ..}`` (``;``-separated), optionally after
    ``<|python_tag|>`` (a special token, so the detokenizer must keep special tokens)."""

    name = "llama3"
    PYTHON_TAG = "<|python_tag|>"
    _OBJ = re.compile(r'\{\s*"name"\s*:')
    _PARTIAL_OBJ = re.compile(r'\{\s*("(n(a(m(e("\s*)?)?)?)?)?)?$')
    markers = (PYTHON_TAG, '{"name"')
    trigger = '{"name": "'
    end = "}"
    skip_special_tokens = False
    end_texts = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")

    def _find(self, text: str, pos: int) -> tuple[int, str]:
        t = text.find(self.PYTHON_TAG, pos)
        m = self._OBJ.search(text, pos)
        if m is not None and (t < 0 or m.start() < t):
            return m.start(), m.group(0)
        return (t, self.PYTHON_TAG) if t >= 0 else (-1, "")

    def hold(self, tail: str) -> int:
        m = self._PARTIAL_OBJ.search(tail)
        return max(held_back(tail, self.PYTHON_TAG), len(tail) - m.start() if m else 0)

    def begin(self, name: str) -> str:
        return f'{{"name": "{name}", "parameters": '

    def _block(self, text, j, marker, final, calls):
        start = j + len(marker) if marker == self.PYTHON_TAG else j
        return call_list(text, start, final, calls, sep=";", close="")


class MistralFormat(ToolFormat):
    """``[TOOL_CALLS] [{"name": .., "arguments": ..}, ..]`` (a single object after the marker is
    accepted too). ``[TOOL_CALLS]`` is a special token in Mistral's v3 tokenizer."""

    name = "mistral"
    MARK = "[TOOL_CALLS]"
    markers = (MARK,)
    trigger = MARK
    end = "}]"
    skip_special_tokens = False
    end_texts = ("</s>",)

    def begin(self, name: str) -> str:
        return f'{self.MARK} [{{"name": "{name}", "arguments": '

    def _block(self, text, j, marker, final, calls):
        i = skip_ws(text, j + len(marker))
        if i >= len(text):
            raise Incomplete
        if text[i] == "[":
            return call_list(text, i + 1, final, calls)
        return call_object(text, i, final, calls)


TOOL_PARSERS: dict[str, ToolFormat] = {
    "hermes": HermesFormat("hermes"),
    "qwen25": HermesFormat("qwen25", newlines=True),
    "llama3": Llama3Format(),
    "mistral": MistralFormat(),
}
TOOL_PARSERS["qwen"] = TOOL_PARSERS["qwen3"] = TOOL_PARSERS["qwen25"]


def get_tool_format(name: str) -> ToolFormat:
    """Raises ValueError naming ``tool_call_parser`` and the known names."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"tool_call_parser must be one of {sorted(TOOL_PARSERS)}, got {name!r}") from None


def detect_tool_format(model_type: Optional[str], chat_template: Optional[str]) -> Optional[str]:
    """The parser name a model's template (or, failing that, its architecture) implies; None when the
    template has no tool support (then the injected Hermes prompt and format are used)."""
    t = chat_template or ""
    if "tools" not in t:
        return None
    if "<tool_call>" in t:
        return "qwen25"
    if "[TOOL_CALLS]" in t or "[AVAILABLE_TOOLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or "ipython" in t or '"parameters' in t:
        return "llama3"
    return {"qwen2": "qwen25", "qwen3": "qwen25", "llama": "llama3", "mistral": "mistral"}.get(model_type or "")
