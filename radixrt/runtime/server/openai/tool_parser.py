"""OpenAI function calling: ``tools`` + ``tool_choice`` on ``/v1/chat/completions``.

SmolLM2's chat template has no tool support, so the tools are injected into the **system prompt** (appended
to the first system message, or as a new first system message) in this format (Hermes/Qwen style)::

    # Tools

    You may call one or more functions to assist with the user query.

    You are provided with function signatures within <tools></tools> XML tags:
    <tools>
    {"type": "function", "function": {"name": "get_weather", "description": "...", "parameters": {...}}}
    </tools>

    For each function call, return a json object with function name and arguments within
    <tool_call></tool_call> XML tags:
    <tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>

(one ``<tools>`` line per tool, ``json.dumps`` of the tool as given). The last paragraph depends on
``tool_choice``, and so does the grammar that constrains the output:

============================  ===============================================================  ==========
tool_choice                   output (constrained)                                             grammar
============================  ===============================================================  ==========
``"auto"`` (default w/ tools) free text; once the model writes ``<tool_call>``, what follows    structural
                              must be ``{"name": "<one of the tools>", "arguments": <args>}``  tag
                              then ``</tool_call>``; text and more calls may follow (one
                              call only with ``parallel_tool_calls: false``)
``"required"``                a JSON array of one or more ``{"name", "arguments"}`` objects,   json_schema
                              compact (like vLLM's, which names the field ``parameters``);
                              ``maxItems: 1`` with ``parallel_tool_calls: false``
named                         one JSON object ``{"name": "<that tool>", "arguments": <args>}`` json_schema
``"none"``                    plain text: the tools are left out of the prompt, nothing is     none
                              parsed
============================  ===============================================================  ==========

``<args>`` always matches the tool's ``parameters`` JSON schema (a missing ``parameters`` means no
arguments: ``{}``). Inside a structural tag, JSON whitespace is bounded (at most one whitespace character
between tokens), so a call never loops on spaces. ``required``/named go through the ``json_schema`` kind, so
they work with both grammar backends; ``auto`` needs a backend that takes ``structural_tag`` (llguidance, xgrammar).

Earlier turns: an assistant message's ``tool_calls`` are rendered after its content in the
``<tool_call>...</tool_call>`` form, and ``tool`` messages keep their role (the template prints it).

Parsing (:class:`ToolCallStream`, also used for non-streamed responses so both agree exactly): a call's
``function.arguments`` is the raw JSON text the model wrote for ``arguments`` (valid JSON under the grammar);
streamed ``arguments`` deltas concatenate to exactly that text. ``content`` is the text outside calls
(``null`` when it is only whitespace and there are calls); trailing whitespace is held back while streaming.
``finish_reason`` is ``"tool_calls"`` when at least one complete call was parsed and generation stopped
normally.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any, Optional

from radixrt.runtime.parsers.tool_stream import ToolCallStream, parse_with
from radixrt.runtime.server.openai.protocol import ApiError
from radixrt.runtime.parsers.tool_styles import TOOL_CALL_BEGIN, TOOL_CALL_END  # noqa: F401 - re-exported

_NAME_RE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # fullmatch: "$" would let a final newline through
_MAX_WS_IN_TAG = 1  # JSON whitespace characters allowed between tokens inside an auto-mode call

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
AUTO_INSTRUCTION = (
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>'
)
REQUIRED_INSTRUCTION = (
    "You must call at least one function. Answer only with a JSON array of calls:\n"
    '[{"name": <function-name>, "arguments": <args-json-object>}]'
)
NAMED_INSTRUCTION = (
    "You must call the function {name}. Answer only with a JSON object:\n"
    '{{"name": "{name}", "arguments": <args-json-object>}}'
)


@dataclass
class Tool:
    name: str
    description: Optional[str]
    parameters: dict
    raw: dict  # the tool as given (shown to the model)


@dataclass
class ToolPlan:
    """What a chat request's ``tools``/``tool_choice`` mean for the prompt, the grammar and the parsing."""

    tools: list[Tool]
    mode: str  # "auto" | "required" | "named"
    name: Optional[str] = None  # the forced function (named)
    parallel: bool = True

    # ---- prompt ----
    def system_text(self) -> str:
        lines = "\n".join(json.dumps(t.raw, ensure_ascii=False) for t in self.tools)
        if self.mode == "auto":
            tail = AUTO_INSTRUCTION
        elif self.mode == "required":
            tail = REQUIRED_INSTRUCTION
        else:
            tail = NAMED_INSTRUCTION.format(name=self.name)
        return TOOLS_HEADER + lines + "\n</tools>\n\n" + tail

    def inject(self, msgs: list[dict]) -> list[dict]:
        """``msgs`` (template-ready dicts) with the tools in the system prompt."""
        msgs = list(msgs)
        text = self.system_text()
        if msgs and msgs[0]["role"] == "system":
            first = dict(msgs[0])
            first["content"] = (first["content"].rstrip() + "\n\n" + text) if first["content"].strip() else text
            msgs[0] = first
        else:
            msgs.insert(0, {"role": "system", "content": text})
        return msgs

    # ---- grammar ----
    def grammar(self) -> tuple[str, str]:
        """``(kind, spec text)`` for the sampling params."""
        if self.mode == "auto":
            return "structural_tag", json.dumps(auto_structural_tag(self.tools, self.parallel), ensure_ascii=False)
        if self.mode == "named":
            tool = next(t for t in self.tools if t.name == self.name)
            return "json_schema", json.dumps(_call_schema(tool, "#"), ensure_ascii=False)
        return "json_schema", json.dumps(required_schema(self.tools, self.parallel), ensure_ascii=False)

    # ---- parsing ----
    def stream(self) -> ToolCallStream:
        return ToolCallStream({"auto": "tagged", "required": "array", "named": "object"}[self.mode])


# ---- validation ------------------------------------------------------------------------------------------
def plan_tools(tools: Optional[list], tool_choice: Any, parallel_tool_calls: Optional[bool]) -> Optional[ToolPlan]:
    """Check ``tools`` / ``tool_choice``; None when no tool may be called.

    Raises:
        ApiError: 400 ``invalid_request_error`` whose ``param`` names the field (``tools[0].function.name``,
            ``tools[1].function.parameters``, ``tool_choice`` ...).
    """
    from radixrt.runtime.constrained import validate_spec

    if tools is not None and not isinstance(tools, list):
        raise ApiError(f"tools must be a list of tools, got {type(tools).__name__}", param="tools")
    parsed: list[Tool] = []
    for i, t in enumerate(tools or []):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise ApiError(f"{where} must be an object", param=where)
        typ = t.get("type", "function")
        if typ != "function":
            raise ApiError(f"{where}.type must be 'function', got {typ!r}", param=f"{where}.type")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise ApiError(
                f"{where}.function is required: {{'name': ..., 'parameters': {{...}}}}", param=f"{where}.function"
            )
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(f"{where}.function.name is required (a non-empty string)", param=f"{where}.function.name")
        if not _NAME_RE.fullmatch(name):
            raise ApiError(
                f"{where}.function.name {name!r} must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' or '.'",
                param=f"{where}.function.name",
            )
        if any(p.name == name for p in parsed):
            raise ApiError(f"{where}.function.name {name!r} is used by two tools", param=f"{where}.function.name")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ApiError(f"{where}.function.description must be a string", param=f"{where}.function.description")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}, "additionalProperties": False}
        elif not isinstance(params, dict):
            raise ApiError(
                f"{where}.function.parameters must be a JSON Schema object, got {type(params).__name__}",
                param=f"{where}.function.parameters",
            )
        else:
            try:
                validate_spec("json_schema", params)
            except ValueError as e:
                msg = str(e).removeprefix("json_schema: ")
                raise ApiError(
                    f"{where}.function.parameters is not a valid JSON schema: {msg}",
                    param=f"{where}.function.parameters",
                ) from None
            if params.get("type", "object") != "object":  # arguments are a JSON object (OpenAI refuses others)
                raise ApiError(
                    f"{where}.function.parameters must describe an object (type 'object'), got type "
                    f"{params.get('type')!r}",
                    param=f"{where}.function.parameters",
                )
        parsed.append(Tool(name, desc, params, {"type": "function", "function": fn}))

    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ApiError("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    parallel = parallel_tool_calls is not False
    choice = tool_choice
    if choice is None:
        choice = "auto" if parsed else "none"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ApiError(
                f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
                f"{{'name': ...}}}}, got {choice!r}",
                param="tool_choice",
            )
        if choice == "none" or (choice == "auto" and not parsed):
            return None
        if choice == "required" and not parsed:
            raise ApiError("tool_choice 'required' needs a non-empty 'tools' list", param="tool_choice")
        return ToolPlan(parsed, choice, parallel=parallel)
    if isinstance(choice, dict):
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type", "function") != "function" or not isinstance(name, str):
            raise ApiError("tool_choice must be {'type': 'function', 'function': {'name': ...}}", param="tool_choice")
        if not parsed:
            raise ApiError(f"tool_choice names the function {name!r} but no 'tools' are given", param="tool_choice")
        if name not in {t.name for t in parsed}:
            raise ApiError(
                f"tool_choice names the function {name!r}, which is not in tools {[t.name for t in parsed]}",
                param="tool_choice",
            )
        return ToolPlan(parsed, "named", name=name, parallel=parallel)
    raise ApiError(f"tool_choice must be a string or an object, got {type(choice).__name__}", param="tool_choice")


# ---- grammars ---------------------------------------------------------------------------------------------
def _rebase_refs(node: Any, base: str) -> Any:
    """Local ``$ref`` s (``#...``) of a schema embedded at JSON pointer ``base`` of a bigger one."""
    if isinstance(node, dict):
        return {
            k: (base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rebase_refs(v, base))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rebase_refs(x, base) for x in node]
    return node


def _call_schema(tool: Tool, base: str) -> dict:
    """``{"name": <const>, "arguments": <parameters>}``, the schema placed at JSON pointer ``base``."""
    params = {k: v for k, v in copy.deepcopy(tool.parameters).items() if k not in ("$id", "id", "$schema")}
    return {
        "type": "object",
        "properties": {
            "name": {"type": "string", "const": tool.name},
            "arguments": _rebase_refs(params, base + "/properties/arguments"),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def required_schema(tools: list[Tool], parallel: bool = True) -> dict:
    """tool_choice ``required``: a JSON array of one (or more, when parallel) calls."""
    if len(tools) == 1:
        items = _call_schema(tools[0], "#/items")
    else:
        items = {"anyOf": [_call_schema(t, f"#/items/anyOf/{i}") for i, t in enumerate(tools)]}
    schema = {"type": "array", "items": items, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def auto_structural_tag(tools: list[Tool], parallel: bool = True) -> dict:
    """tool_choice ``auto``: free text until ``<tool_call>``, then a call of one of the tools (xgrammar format)."""
    from radixrt.runtime.constrained.schema_prep import prepare_schema

    tags = []
    for t in tools:
        tags.append(
            {
                "type": "tag",
                "begin": f'{TOOL_CALL_BEGIN}{{"name": "{t.name}", "arguments": ',
                "content": {
                    "type": "json_schema",
                    "json_schema": prepare_schema(copy.deepcopy(t.parameters)),
                    "max_whitespace_cnt": _MAX_WS_IN_TAG,
                },
                "end": "}" + TOOL_CALL_END,
            }
        )
    return {
        "type": "structural_tag",
        "format": {
            "type": "triggered_tags",
            "triggers": [TOOL_CALL_BEGIN],
            "tags": tags,
            "stop_after_first": not parallel,
        },
    }


# ---- earlier turns --------------------------------------------------------------------------------------------
def render_tool_history(msgs: list[dict]) -> list[dict]:
    """Assistant ``tool_calls`` of earlier turns as ``<tool_call>`` text (the template ignores the field)."""
    out = []
    for m in msgs:
        calls = m.get("tool_calls")
        if not calls:
            out.append(m)
            continue
        parts = [m["content"]] if m.get("content") else []
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict):
                continue
            args = fn.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except ValueError:
                    pass
            parts.append(
                TOOL_CALL_BEGIN
                + json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
                + TOOL_CALL_END
            )
        m = {k: v for k, v in m.items() if k != "tool_calls"}
        m["content"] = "\n".join(parts)
        out.append(m)
    return out


# ---- parsing (the scanning itself is in parsers/tool_styles.py) -------------------------------------------------
def parse_output(plan: ToolPlan, text: str, base_finish: Optional[str]) -> tuple[dict, Optional[str]]:
    """A finished non-streamed choice: ``(message, finish_reason)``, parsed exactly as a stream would be."""
    return parse_with(plan.stream(), text, base_finish)
