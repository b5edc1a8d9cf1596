"""``POST /v1/messages``'s request (pydantic) and its translation to the chat path: ``system``, text /
``tool_use`` / ``tool_result`` / ``thinking`` blocks to template-ready chat messages, ``tools``
(``input_schema``) and ``tool_choice`` (auto / any / tool / none) to chat's, ``output_config.format`` to
``response_format``; and the parsed assistant message back as content blocks.

Errors are ApiError 400 naming the field (``messages[1].content[0].type``); the route's error handler
answers them in Anthropic's shape.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict

from radixrt.runtime.io_struct import FinishReason, FinishStop
from radixrt.runtime.server.http.errors import ApiError
from radixrt.runtime.server.http.fields import foreign_constraints, refuse_set_fields, text_of_parts

# accepted, no effect here (docs/compatibility.md says why) ...
IGNORED_FIELDS = {
    "metadata": "no per-user accounting",
    "service_tier": "one tier",
    "cache_control": "the radix cache caches every prefix, no breakpoints needed",
    "inference_geo": "one place",
    "speed": "one speed",
    "diagnostics": "nothing extra to report",
    "user_profile_id": "no per-user accounting",
    "workspace_id": "no workspaces",
}
# ... and refused with a 400 naming them when set
REFUSED_FIELDS = {
    "container": "no code-execution containers",
    **foreign_constraints("here use output_config.format (json_schema), tools, and max_tokens"),
}


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: Optional[str] = None
    max_tokens: Optional[int] = None
    messages: list[dict[str, Any]]
    system: Optional[Union[str, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    stop_sequences: Optional[list[str]] = None
    thinking: Optional[dict[str, Any]] = None
    output_config: Optional[dict[str, Any]] = None
    stream: bool = False
    metadata: Optional[dict[str, Any]] = None
    # sampling (older API versions; still sent by many clients)
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    cache_salt: Optional[str] = None  # radixrt / vLLM extra
    speculative: bool = True  # radixrt: False opts this request out of --speculative-algorithm


def check_refused(body: dict) -> None:
    """Raises ApiError 400 naming the first :data:`REFUSED_FIELDS` key that is set."""
    refuse_set_fields(body, REFUSED_FIELDS)


def _blocks_text(content: Any, where: str) -> str:
    return text_of_parts(content, where, ("text",), "\n", "text blocks")


def chat_messages(req: MessagesRequest) -> list[dict]:
    """``system`` and ``messages`` as template-ready chat messages: a user turn's ``tool_result`` blocks
    become ``tool`` messages (then its text a user message), an assistant turn's ``tool_use`` blocks its
    ``tool_calls`` (arguments as compact JSON text) and its ``thinking`` its ``reasoning_content``."""
    msgs: list[dict] = []
    if req.system is not None:
        msgs.append({"role": "system", "content": _blocks_text(req.system, "system")})
    if not req.messages:
        raise ApiError("messages must be a non-empty list", param="messages")
    open_calls: set[str] = set()  # tool_use ids of the last assistant turn, which tool_result blocks answer
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        role, content = m.get("role"), m.get("content")
        if role not in ("user", "assistant"):
            raise ApiError(f"{where}.role must be 'user' or 'assistant', got {role!r}", param=f"{where}.role")
        if isinstance(content, str):
            msgs.append({"role": role, "content": content})
            open_calls = set()
            continue
        if not isinstance(content, list) or not content:
            raise ApiError(f"{where}.content must be a string or a non-empty list of blocks", param=f"{where}.content")
        texts, calls, reasoning = [], [], ""
        for j, b in enumerate(content):
            bw = f"{where}.content[{j}]"
            typ = b.get("type") if isinstance(b, dict) else None
            if typ == "text":
                if not isinstance(b.get("text"), str):
                    raise ApiError(f"{bw}.text is required (a string)", param=f"{bw}.text")
                texts.append(b["text"])
            elif typ == "tool_result" and role == "user":
                if not isinstance(b.get("tool_use_id"), str):
                    raise ApiError(f"{bw}.tool_use_id is required (a string)", param=f"{bw}.tool_use_id")
                if b["tool_use_id"] not in open_calls:
                    raise ApiError(
                        f"{bw}.tool_use_id {b['tool_use_id']!r} matches no tool_use block of the previous "
                        "assistant turn",
                        param=f"{bw}.tool_use_id",
                    )
                c = b.get("content", "")
                msgs.append(
                    {
                        "role": "tool",
                        "tool_call_id": b["tool_use_id"],
                        "content": _blocks_text(c, f"{bw}.content") if c is not None else "",
                    }
                )
            elif typ == "tool_use" and role == "assistant":
                if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                    raise ApiError(f"{bw}: tool_use needs an id and a name", param=bw)
                if not isinstance(b.get("input", {}), dict):
                    raise ApiError(f"{bw}.input must be an object", param=f"{bw}.input")
                calls.append(
                    {
                        "id": b["id"],
                        "type": "function",
                        "function": {
                            "name": b["name"],
                            "arguments": json.dumps(b.get("input", {}), ensure_ascii=False),
                        },
                    }
                )
            elif typ in ("thinking", "redacted_thinking") and role == "assistant":
                reasoning += b.get("thinking") or ""
            else:
                raise ApiError(f"{bw}.type {typ!r} is not supported in a {role} turn", param=f"{bw}.type")
        open_calls = {c["id"] for c in calls}
        if role == "assistant":
            msg: dict = {"role": role, "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            if reasoning:
                msg["reasoning_content"] = reasoning
            msgs.append(msg)
        elif texts:  # a user turn of tool results only adds no user message
            msgs.append({"role": role, "content": "\n".join(texts)})
    return msgs


def chat_tools(tools: Optional[list]) -> Optional[list]:
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom" or "input_schema" not in t:
            got = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise ApiError(
                f"tools[{i}]: only client tools ({{name, description, input_schema}}) are supported, got type {got!r}",
                param=f"tools[{i}]",
            )
        fn = {"name": t.get("name"), "parameters": t["input_schema"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(tc: Optional[dict], has_tools: bool) -> tuple[Any, Optional[bool]]:
    """``(tool_choice, parallel_tool_calls)`` for chat."""
    if tc is None:
        return ("auto" if has_tools else None), None
    dp = tc.get("disable_parallel_tool_use", False)
    if not isinstance(dp, bool):
        raise ApiError(
            "tool_choice.disable_parallel_tool_use must be a boolean", param="tool_choice.disable_parallel_tool_use"
        )
    parallel = False if dp else None
    typ = tc.get("type")
    if typ in ("any", "tool") and not has_tools:
        raise ApiError(f"tool_choice.type {typ!r} needs tools", param="tool_choice")
    if typ in ("auto", "none"):
        return typ, parallel
    if typ == "any":
        return "required", parallel
    if typ == "tool" and isinstance(tc.get("name"), str):
        return {"type": "function", "function": {"name": tc["name"]}}, parallel
    raise ApiError("tool_choice.type must be auto, any, tool (with a name) or none", param="tool_choice")


def check_thinking(thinking: Optional[dict], req: "MessagesRequest") -> None:
    """``thinking``: ``{"type": "enabled", "budget_tokens": >= 1024}``, ``{"type": "disabled"}`` or
    ``{"type": "adaptive"}`` (Anthropic's shapes; the budget is not enforced here: the template decides).
    Raises ApiError 400 naming ``thinking.type`` or ``thinking.budget_tokens``."""
    if thinking is None:
        return
    typ = thinking.get("type")
    if typ not in ("enabled", "disabled", "adaptive"):
        raise ApiError(f"thinking.type must be 'enabled', 'disabled' or 'adaptive', got {typ!r}", param="thinking.type")
    budget = thinking.get("budget_tokens")
    if typ == "enabled" and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1024):
        raise ApiError(
            f"thinking.budget_tokens must be an integer >= 1024, got {budget!r}", param="thinking.budget_tokens"
        )
    if typ == "enabled" and req.max_tokens is not None and budget >= req.max_tokens:
        raise ApiError(
            f"max_tokens ({req.max_tokens}) must be greater than thinking.budget_tokens ({budget})", param="max_tokens"
        )
    if typ != "disabled":  # Anthropic's rules while thinking
        if req.temperature is not None and req.temperature != 1:
            raise ApiError("temperature may only be 1 (or unset) while thinking is on", param="temperature")
        if req.top_k is not None:
            raise ApiError("top_k is not allowed while thinking is on", param="top_k")
        if isinstance(req.tool_choice, dict) and req.tool_choice.get("type") in ("any", "tool"):
            raise ApiError("tool_choice 'any' or 'tool' is not allowed while thinking is on", param="tool_choice")


def chat_body(req: MessagesRequest) -> dict:
    if req.max_tokens is None:
        raise ApiError("max_tokens is required", param="max_tokens")
    choice, parallel = chat_tool_choice(req.tool_choice, bool(req.tools))
    fmt = (req.output_config or {}).get("format")
    rf = None
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise ApiError(
                "output_config.format must be {'type': 'json_schema', 'schema': {...}}", param="output_config.format"
            )
        rf = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    check_thinking(req.thinking, req)
    if req.temperature is not None and not 0 <= req.temperature <= 1:
        raise ApiError(f"temperature must be between 0 and 1, got {req.temperature}", param="temperature")
    if req.top_k is not None and req.top_k < 1:  # chat's -1 ("all") is not Anthropic's: top_k counts tokens
        raise ApiError(f"top_k must be a positive integer, got {req.top_k}", param="top_k")
    kwargs = None
    if req.thinking is not None and req.thinking.get("type") == "disabled":
        kwargs = {"enable_thinking": False}  # Qwen3's switch; other templates ignore it
    body = {
        "model": req.model,
        "messages": [],
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "stop": req.stop_sequences,
        "tools": chat_tools(req.tools),
        "tool_choice": choice if req.tools else None,
        "parallel_tool_calls": parallel,
        "response_format": rf,
        "cache_salt": req.cache_salt,
        "chat_template_kwargs": kwargs,
        "speculative": req.speculative,
    }
    return {k: v for k, v in body.items() if v is not None}


def content_blocks(message: dict) -> list[dict]:
    """A parsed assistant message as Anthropic content blocks: thinking, text, tool_use."""
    out: list[dict] = []
    if message.get("reasoning_content"):
        out.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        out.append({"type": "text", "text": message["content"]})
    for c in message.get("tool_calls") or []:
        try:
            args = json.loads(c["function"]["arguments"] or "{}")
        except ValueError:
            args = {}
        out.append({"type": "tool_use", "id": tool_id(c["id"]), "name": c["function"]["name"], "input": args})
    return out


def tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(reason: Optional[str], finished: Optional[FinishReason]) -> tuple[str, Optional[str]]:
    """``(stop_reason, stop_sequence)`` from the chat finish reason and the scheduler's finish reason. An
    aborted request says ``abort`` (SGLang's finish_reason value): Anthropic has no reason for it, and
    ``end_turn`` would claim a natural finish."""
    matched = finished.matched if isinstance(finished, FinishStop) else None
    if reason == "abort":
        return "abort", None
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def usage(o) -> dict:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens not read from the cache."""
    return {
        "input_tokens": o.prompt_tokens - o.cached_tokens,
        "output_tokens": o.completion_tokens,
        "cache_read_input_tokens": o.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def new_msg_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


# chat's field names in an error, as the Messages request names them
CHAT_TO_MESSAGES = {
    "response_format.json_schema.schema": "output_config.format.schema",
    "response_format": "output_config.format",
    "stop": "stop_sequences",
    "max_completion_tokens": "max_tokens",
}


def messages_param(param: str) -> str:
    """The Messages field of a chat field path (``tools[0].function.parameters`` -> ``tools[0].input_schema``)."""
    for chat, ours in CHAT_TO_MESSAGES.items():
        if param == chat or param.startswith(chat + ".") or param.startswith(chat + "["):
            return ours + param[len(chat) :]
    if param.startswith("tools[") and ".function" in param:
        return param.replace(".function.parameters", ".input_schema", 1).replace(".function", "", 1)
    return param
