"""Plain OpenAI chat requests as traffic for ``radixrt profile --from-openai-jsonl``.

A chat file has one JSON object a line: ``{"messages": [...], "tools": [...]}`` (the OpenAI batch form
``{"body": {...}}`` too), optionally the answer as ``"response"`` (a string, or a chat completion object with
``choices[0].message``) and an arrival time ``"timestamp"`` (seconds). Prompts are rendered as this server
renders a chat request (tools in the system prompt, earlier tool calls as text, ``tool_parser.py``) with the
model's chat template, then tokenized, so the profile sees the token ids the server would.
"""

from __future__ import annotations

from typing import Any, Optional

from radixrt.runtime.profile.logs import json_lines
from radixrt.runtime.profile.replay import ReplayReq
from radixrt.runtime.server.openai.tool_parser import plan_tools, render_tool_history


def _response_text(resp: Any) -> Optional[str]:
    if isinstance(resp, str):
        return resp
    if isinstance(resp, dict):
        try:
            return resp["choices"][0]["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            return None
    return None


def render(tokenizer: Any, messages: list[dict], tools: Optional[list], tool_choice: Any = None) -> str:
    """The prompt text the server would build: text parts joined, ``developer`` as ``system``, earlier tool
    calls as text and the tools in the system prompt (``tool_parser``), then the model's chat template."""
    msgs = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        d = {**m, "role": "system" if m.get("role") == "developer" else m.get("role"), "content": content or ""}
        msgs.append(d)
    msgs = render_tool_history(msgs)
    plan = plan_tools(tools, tool_choice, None) if tools else None
    if plan is not None:
        msgs = plan.inject(msgs)
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


def read_openai_jsonl(path: str, tokenizer: Any) -> list[ReplayReq]:
    """Chat requests tokenized with ``tokenizer``'s chat template (``add_generation_prompt``). A request's
    output is its ``response`` tokenized, or empty. Sorted by ``timestamp`` when every line has one.
    Raises ValueError naming the line of a request without ``messages``."""
    rows: list[tuple[Optional[float], ReplayReq]] = []
    for n, obj in json_lines(path):
        body = obj.get("body") if isinstance(obj.get("body"), dict) else obj
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{path}:{n}: 'messages' must be a non-empty list")
        try:
            text = render(tokenizer, msgs, body.get("tools"), body.get("tool_choice"))
        except Exception as e:
            raise ValueError(f"{path}:{n}: {type(e).__name__}: {e}") from None
        ids = tokenizer.encode(text, add_special_tokens=False)
        answer = _response_text(obj.get("response", body.get("response")))
        out_ids = tokenizer.encode(answer, add_special_tokens=False) if answer else []
        ts = obj.get("timestamp")
        rows.append((float(ts) if ts is not None else None, ReplayReq(len(ids), len(out_ids), list(ids) + out_ids)))
    if rows and all(t is not None for t, _ in rows):
        rows.sort(key=lambda x: x[0])
    return [r for _, r in rows]
