"""``POST /v1/responses``'s request (pydantic), and its translation to the chat path: ``input`` items to
template-ready chat messages, function tools to chat tools, ``text.format`` to ``response_format``.

Errors name the Responses field (``input[2].type``, ``tools[0].type``, ``text.format``) in OpenAI's error
shape, as on the chat routes.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict

from radixrt.runtime.server.http.errors import ApiError
from radixrt.runtime.server.http.fields import foreign_constraints, refuse_set_fields, text_of_parts
from radixrt.runtime.server.openai.protocol import REASONING_EFFORTS

# accepted, no effect here (docs/compatibility.md says why) ...
IGNORED_FIELDS = {
    "user": "no per-user accounting",
    "service_tier": "one tier",
    "safety_identifier": "no abuse monitoring",
    "moderation": "no moderation layer",
    "truncation": "a conversation longer than the context is a 400, never truncated",
    "prompt_cache_key": "the radix cache matches prefixes by content (use cache_salt to keep tenants apart)",
    "prompt_cache_options": "the radix cache matches prefixes by content",
    "prompt_cache_retention": "cached pages live until evicted; a stored response pins its conversation",
    "stream_options": "no obfuscation padding is sent",
    "max_tool_calls": "the model makes one turn per call",
    "reasoning": "the reasoning parser decides (--reasoning-parser); effort and summary have no effect",
}
# ... and refused with a 400 naming them when set (null, false, [] and {} count as unset)
REFUSED_FIELDS = {
    "background": "responses run in the foreground only",
    "conversation": "use previous_response_id",
    "prompt": "no stored prompt templates",
    "image": "the model is text-only",
    "context_management": "no server-side compaction",
    "access_programs": "no programmatic tool calling",
    "background_options": "responses run in the foreground only",
    **foreign_constraints("here use text.format (json_schema), tools, and max_output_tokens"),
}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: Optional[str] = None
    input: Optional[Union[str, list[dict[str, Any]]]] = None
    instructions: Optional[str] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    text: Optional[dict[str, Any]] = None
    reasoning: Optional[dict[str, Any]] = None
    max_output_tokens: Optional[int] = None
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    top_logprobs: Optional[int] = None
    include: Optional[list[str]] = None  # "message.output_text.logprobs" is acted on; the rest have nothing here
    stream: bool = False
    store: Optional[bool] = True
    previous_response_id: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None
    user: Optional[str] = None
    # extras, as on chat (SGLang / vLLM / radixrt)
    cache_salt: Optional[str] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    speculative: bool = True  # radixrt: False opts this request out of --speculative-algorithm


# OpenAI's values; set, they have no effect here (IGNORED_FIELDS), but a value OpenAI refuses is refused
REASONING_VALUES = {
    "effort": REASONING_EFFORTS,
    "summary": (None, "auto", "concise", "detailed"),
}


def check_refused(body: dict) -> None:
    """Raises ApiError 400 naming the first :data:`REFUSED_FIELDS` key that is set, or a ``reasoning``
    value OpenAI does not take (:data:`REASONING_VALUES`)."""
    refuse_set_fields(body, REFUSED_FIELDS)
    reasoning = body.get("reasoning")
    for key, allowed in REASONING_VALUES.items():
        if isinstance(reasoning, dict) and reasoning.get(key) not in allowed:
            raise ApiError(
                f"reasoning.{key} must be one of {[v for v in allowed if v]}, got {reasoning.get(key)!r}",
                param=f"reasoning.{key}",
            )


def _text(content: Any, where: str) -> str:
    """A message's content (a string, or a list of text parts) as one string."""
    return text_of_parts(content, where, TEXT_PARTS, "", "text parts (input_text, output_text)")


def input_messages(inp: Union[str, list, None]) -> list[dict]:
    """``input`` as template-ready chat messages: messages by role, ``function_call`` items as the
    assistant's ``tool_calls`` (joined to the assistant message before them, the turn they came from),
    ``function_call_output`` as ``tool`` messages; ``reasoning`` items ride on the next assistant turn.

    Raises:
        ApiError: 400 naming ``input`` or ``input[i].<field>``.
    """
    if inp is None:
        raise ApiError("input is required (a string or a list of items)", param="input")
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    msgs: list[dict] = []
    reasoning: Optional[str] = None
    for i, it in enumerate(inp):
        where = f"input[{i}]"
        typ = it.get("type", "message")
        if typ == "message":
            role = it.get("role")
            if role not in ROLES:
                raise ApiError(f"{where}.role must be one of {list(ROLES)}, got {role!r}", param=f"{where}.role")
            m = {"role": ROLES[role], "content": _text(it.get("content"), f"{where}.content")}
            if role == "assistant" and reasoning is not None:
                m["reasoning_content"], reasoning = reasoning, None
            msgs.append(m)
        elif typ == "function_call":
            for f in ("call_id", "name", "arguments"):
                if not isinstance(it.get(f), str):
                    raise ApiError(f"{where}.{f} is required (a string)", param=f"{where}.{f}")
            call = {
                "id": it["call_id"],
                "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]},
            }
            last = msgs[-1] if msgs else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                if reasoning is not None:
                    last["reasoning_content"], reasoning = reasoning, None
                msgs.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif typ == "function_call_output":
            if not isinstance(it.get("call_id"), str):
                raise ApiError(f"{where}.call_id is required (a string)", param=f"{where}.call_id")
            out = it.get("output")
            text = out if isinstance(out, str) else _text(out, f"{where}.output")
            msgs.append({"role": "tool", "tool_call_id": it["call_id"], "content": text})
        elif typ == "reasoning":
            parts = it.get("content") or it.get("summary") or []
            reasoning = _text(parts, f"{where}.content") if parts else ""
        else:
            raise ApiError(
                f"{where}.type {typ!r} is not supported: message, function_call, function_call_output or reasoning",
                param=f"{where}.type",
            )
    if not msgs:
        raise ApiError("input must hold at least one message", param="input")
    return msgs


def chat_tools(tools: Optional[list]) -> Optional[list]:
    """Responses function tools (flat: ``{"type": "function", "name", "parameters"}``) as chat tools."""
    if tools is None:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            got = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise ApiError(
                f"tools[{i}].type must be 'function' (no hosted tools here), got {got!r}", param=f"tools[{i}].type"
            )
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise ApiError(
                "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
                param="tool_choice",
            )
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def response_format(text: Optional[dict]) -> Optional[dict]:
    """``text.format`` as chat's ``response_format``."""
    if text is None or text.get("format") is None:
        return None
    f = text["format"]
    if not isinstance(f, dict):
        raise ApiError("text.format must be an object", param="text.format")
    if f.get("type") == "json_schema":
        if not isinstance(f.get("schema"), dict):
            raise ApiError("text.format.schema is required (a JSON Schema object)", param="text.format.schema")
        return {
            "type": "json_schema",
            "json_schema": {"name": f.get("name", "output"), "schema": f["schema"], "strict": f.get("strict")},
        }
    if f.get("type") in ("text", "json_object"):
        return {"type": f["type"]}
    raise ApiError(
        f"text.format.type must be text, json_object or json_schema, got {f.get('type')!r}", param="text.format.type"
    )


LOGPROBS_INCLUDE = "message.output_text.logprobs"


# OpenAI's include values: logprobs are acted on; the others name things this server does not produce
KNOWN_INCLUDES = (
    LOGPROBS_INCLUDE,
    "reasoning.encrypted_content",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
)


def check_include(include: Optional[list]) -> None:
    """Raises ApiError 400 naming ``include[i]`` for a value OpenAI does not define."""
    for i, v in enumerate(include or []):
        if v not in KNOWN_INCLUDES:
            raise ApiError(f"include[{i}]: unknown value {v!r}; one of {list(KNOWN_INCLUDES)}", param=f"include[{i}]")


def wants_logprobs(req: ResponsesRequest) -> bool:
    """Per-token logprobs go on ``output_text`` parts when ``include`` names :data:`LOGPROBS_INCLUDE` or
    ``top_logprobs`` > 0 asks for alternatives (each entry: ``token``, ``logprob``, ``bytes``, ``top_logprobs``,
    as on chat)."""
    return LOGPROBS_INCLUDE in (req.include or []) or bool(req.top_logprobs)


def check_metadata(metadata: Optional[dict]) -> None:
    """OpenAI's limits on ``metadata`` (it is stored with the response): at most 16 pairs, keys of at most 64
    characters, string values of at most 512. Raises ApiError 400 naming ``metadata`` or ``metadata.<key>``."""
    if metadata is None:
        return
    if len(metadata) > 16:
        raise ApiError(f"metadata holds {len(metadata)} pairs; at most 16", param="metadata")
    for k, v in metadata.items():
        if len(k) > 64:
            raise ApiError(f"metadata keys are at most 64 characters, got {len(k)}", param="metadata")
        if not isinstance(v, str) or len(v) > 512:
            raise ApiError("metadata values are strings of at most 512 characters", param=f"metadata.{k}")


def chat_body(req: ResponsesRequest) -> dict:
    """The chat-completions body that runs ``req`` (the messages are passed separately). Raises ApiError 400
    for ``metadata`` beyond OpenAI's limits."""
    check_metadata(req.metadata)
    check_include(req.include)
    body = {
        "model": req.model,
        "messages": [],
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tools": chat_tools(req.tools),
        "tool_choice": chat_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.parallel_tool_calls,
        "response_format": response_format(req.text),
        "cache_salt": req.cache_salt,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "seed": req.seed,
        "stop": req.stop,
        "chat_template_kwargs": req.chat_template_kwargs,
        "speculative": req.speculative,
    }
    if wants_logprobs(req):
        body.update(logprobs=True, top_logprobs=req.top_logprobs or 0)
    return {k: v for k, v in body.items() if v is not None}


# chat's field names in an error, as the Responses request names them
CHAT_TO_RESPONSES = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "max_completion_tokens": "max_output_tokens",
}


def responses_param(param: Optional[str]) -> Optional[str]:
    if param is None:
        return None
    if param.startswith("response_format.json_schema."):  # text.format holds the schema's fields itself
        return "text.format." + param[len("response_format.json_schema.") :]
    for chat, ours in CHAT_TO_RESPONSES.items():
        if param == chat or param.startswith(chat + ".") or param.startswith(chat + "["):
            return ours + param[len(chat) :] if chat != "response_format" else ours
    if param.startswith("tools[") and ".function" in param:
        return param.replace(".function", "", 1)
    return param
