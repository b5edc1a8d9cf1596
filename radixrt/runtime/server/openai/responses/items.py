"""The items of a Responses response (``/v1/responses``): ``input`` as the stored items that
``input_items.list`` returns, a parsed assistant message as output items (reasoning, message, function calls),
and :class:`ItemIds`, the ids they carry.

Its own file because building items is one idea apart from ``protocol``'s request checks and its translation to
the chat path; ``events`` builds the streamed items from the same pieces.
"""

from __future__ import annotations

from typing import Optional, Union

_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def input_items(inp: Union[str, list, None], ids: "ItemIds") -> list[dict]:
    """``input`` (already checked by ``protocol.input_messages``) as the items ``input_items.list`` returns: a
    string as one user message, message contents as ``input_text`` parts, an id on every item."""
    out = []
    for it in [{"role": "user", "content": inp}] if isinstance(inp, str) else inp or []:
        item = dict(it)
        typ = item.setdefault("type", "message")
        if typ == "message" and isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        item.setdefault("id", ids.new(_ITEM_PREFIX.get(typ, "item")))
        out.append(item)
    return out


def output_items(message: dict, ids: "ItemIds", logprobs: Optional[list] = None) -> list[dict]:
    """A parsed assistant message as Responses output items: reasoning, message, function calls.
    ``logprobs`` (chat's per-token entries) go on the message's ``output_text`` part."""
    items = []
    if message.get("reasoning_content"):
        items.append(
            {
                "type": "reasoning",
                "id": ids.new("rs"),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}],
            }
        )
    if message.get("content") or not message.get("tool_calls"):
        items.append(message_item(ids.new("msg"), message.get("content") or "", logprobs=logprobs))
    for c in message.get("tool_calls") or []:
        items.append(call_item(ids.new("fc"), c["id"], c["function"]["name"], c["function"]["arguments"]))
    return items


def message_item(item_id: str, text: str, status: str = "completed", logprobs: Optional[list] = None) -> dict:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}],
    }


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class ItemIds:
    """Output item ids of one response."""

    def __init__(self, response_id: str):
        self.base, self.n = response_id.split("_", 1)[-1][:24], 0

    def new(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.base}{self.n:04d}"
