"""The typed server-sent events of a streamed response, built from the chat parser's deltas
(``reasoning_content``, ``content``, ``tool_calls``): ``response.created``, ``response.in_progress``, per
output item ``response.output_item.added`` ... ``response.output_item.done`` with, inside,
``response.reasoning_text.delta``, ``response.content_part.added`` / ``response.output_text.delta`` /
``.done`` or ``response.function_call_arguments.delta`` / ``.done``; then ``response.completed`` (or
``response.incomplete``). Each event carries ``sequence_number``; the SSE ``event:`` line is its type.
"""

from __future__ import annotations

import copy
from typing import Optional

import msgspec

from radixrt.runtime.server.openai.responses.items import ItemIds, call_item, message_item


def sse_event(obj: dict) -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + msgspec.json.encode(obj) + b"\n\n"


class EventStream:
    """Deltas in, events out; :attr:`items` holds the output items as streamed (final at the end)."""

    def __init__(self, ids: ItemIds):
        self.ids = ids
        self.items: list[dict] = []
        self.seq = 0
        self.open: Optional[str] = None  # the kind of the open item: reasoning | message | call

    def ev(self, typ: str, **kw) -> dict:
        d = {"type": typ, "sequence_number": self.seq, **kw}
        self.seq += 1
        return d

    def _where(self) -> dict:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        item, out = self.items[-1], []
        if self.open == "reasoning":
            text = item["content"][0]["text"]
            out.append(self.ev("response.reasoning_text.done", content_index=0, text=text, **self._where()))
        elif self.open == "message":
            part = item["content"][0]
            out.append(
                self.ev(
                    "response.output_text.done",
                    content_index=0,
                    text=part["text"],
                    logprobs=part["logprobs"],
                    **self._where(),
                )
            )
            out.append(self.ev("response.content_part.done", content_index=0, part=dict(part), **self._where()))
        else:
            out.append(
                self.ev(
                    "response.function_call_arguments.done",
                    arguments=item["arguments"],
                    name=item["name"],
                    **self._where(),
                )
            )
        item["status"] = "completed"
        out.append(self.ev("response.output_item.done", output_index=len(self.items) - 1, item=copy.deepcopy(item)))
        self.open = None
        return out

    def _add(self, kind: str, item: dict) -> list[dict]:
        out = self._close()
        self.items.append(item)
        self.open = kind
        shown = copy.deepcopy(item)  # events are encoded after the item has grown
        if kind != "reasoning":
            shown["status"] = "in_progress"
        out.append(self.ev("response.output_item.added", output_index=len(self.items) - 1, item=shown))
        return out

    def feed(self, delta: dict, logprobs: Optional[list] = None) -> list[dict]:
        """Events for one parser delta; ``logprobs`` (chat's entries of the tokens since the last text delta)
        ride on its ``output_text.delta`` and join the part's list."""
        out: list[dict] = []
        if delta.get("reasoning_content"):
            if self.open != "reasoning":
                out += self._add(
                    "reasoning",
                    {
                        "type": "reasoning",
                        "id": self.ids.new("rs"),
                        "summary": [],
                        "content": [{"type": "reasoning_text", "text": ""}],
                    },
                )
            self.items[-1]["content"][0]["text"] += delta["reasoning_content"]
            out.append(
                self.ev(
                    "response.reasoning_text.delta", content_index=0, delta=delta["reasoning_content"], **self._where()
                )
            )
        if delta.get("content"):
            if self.open != "message":
                item = message_item(self.ids.new("msg"), "", "in_progress")
                item["content"] = []
                out += self._add("message", item)
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                out.append(self.ev("response.content_part.added", content_index=0, part=part, **self._where()))
                self.items[-1]["content"] = [dict(part)]
            self.items[-1]["content"][0]["text"] += delta["content"]
            self.items[-1]["content"][0]["logprobs"] = self.items[-1]["content"][0]["logprobs"] + (logprobs or [])
            out.append(
                self.ev(
                    "response.output_text.delta",
                    content_index=0,
                    delta=delta["content"],
                    logprobs=logprobs or [],
                    **self._where(),
                )
            )
        for tc in delta.get("tool_calls") or []:
            fn = tc.get("function") or {}
            if tc.get("id") is not None:
                out += self._add("call", call_item(self.ids.new("fc"), tc["id"], fn.get("name", ""), "", "in_progress"))
            args = fn.get("arguments") or ""
            if args:
                self.items[-1]["arguments"] += args
                out.append(self.ev("response.function_call_arguments.delta", delta=args, **self._where()))
        return out

    def finish(self) -> list[dict]:
        """Close the open item; an answer with no item at all gets an empty message (as non-streamed)."""
        out = self._close()
        if not any(i["type"] in ("message", "function_call") for i in self.items):
            out += self._add("message", message_item(self.ids.new("msg"), "", "in_progress"))
            out += self._close()
        return out
