"""Read traffic for the profiler: radixrt's request log (token or hash form) or a plain file of OpenAI chat
requests. Both become ``ReplayReq`` lists in arrival order.

The request log's fields are described in ``radixrt/runtime/request_log.py``. A chat file has one JSON object
a line: ``{"messages": [...], "tools": [...]}`` (the OpenAI batch form ``{"body": {...}}`` too), optionally the
answer as ``"response"`` (a string, or a chat completion object with ``choices[0].message``) and an arrival
time ``"timestamp"`` (seconds). Prompts are rendered as the server renders them (tools in the system
prompt) with the model's chat template, then tokenized.
"""
from __future__ import annotations

import json
from typing import Any, Iterator, Optional

from radixrt.tools.replay import ReplayReq


def _lines(path: str) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object")
            yield n, obj


def read_request_log(path: str, timed: bool = True) -> list[ReplayReq]:
    """Requests of a ``--request-log`` file, sorted by arrival. ``timed``: keep the admission, prefill and
    finish times (so requests in flight overlap as they did live); otherwise replay one after another.
    Raises ValueError naming the line and field of a malformed record."""
    out: list[tuple[float, ReplayReq]] = []
    for n, r in _lines(path):
        try:
            plen, olen = int(r["prompt_len"]), int(r["output_len"])
            if "page_hashes" in r:
                key, unit = [int(h) for h in r["page_hashes"]], int(r["page_size"])
            else:
                key, unit = [int(t) for t in r["prompt_ids"]] + [int(t) for t in r["output_ids"]], 1
            arrival = float(r["arrival"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{n}: bad or missing field {e}") from None
        req = ReplayReq(plen, olen, key, unit, r.get("cacheable_len"), r.get("cache_salt"))
        if timed:
            req.start = r.get("admit") if r.get("admit") is not None else arrival
            done = r.get("prefill_done")
            if done is None and r.get("ttft") is not None:
                done = arrival + float(r["ttft"])
            req.prefill_done, req.finish = done, r.get("finish")
        out.append((arrival, req))
    out.sort(key=lambda x: x[0])
    return [r for _, r in out]


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
    from radixrt.runtime.server.tool_parser import plan_tools, render_tool_history

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
    for n, obj in _lines(path):
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
