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
they work with both grammar backends; ``auto`` needs a backend that takes ``structural_tag`` (xgrammar).

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
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from radixrt.runtime.server.openai_protocol import ApiError

TOOL_CALL_BEGIN = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_WS = " \t\n\r"
_MAX_WS_IN_TAG = 1  # JSON whitespace characters allowed between tokens inside an auto-mode call

TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
AUTO_INSTRUCTION = ("For each function call, return a json object with function name and arguments within "
                    "<tool_call></tool_call> XML tags:\n"
                    '<tool_call>{"name": <function-name>, "arguments": <args-json-object>}</tool_call>')
REQUIRED_INSTRUCTION = ("You must call at least one function. Answer only with a JSON array of calls:\n"
                        '[{"name": <function-name>, "arguments": <args-json-object>}]')
NAMED_INSTRUCTION = ("You must call the function {name}. Answer only with a JSON object:\n"
                     '{{"name": "{name}", "arguments": <args-json-object>}}')


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


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
    mode: str                    # "auto" | "required" | "named"
    name: Optional[str] = None   # the forced function (named)
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
    def stream(self) -> "ToolCallStream":
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
            raise ApiError(f"{where}.function is required: {{'name': ..., 'parameters': {{...}}}}",
                           param=f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError(f"{where}.function.name is required (a non-empty string)", param=f"{where}.function.name")
        if not _NAME_RE.match(name):
            raise ApiError(f"{where}.function.name {name!r} must be 1-64 characters of a-z, A-Z, 0-9, '_', '-' "
                           f"or '.'", param=f"{where}.function.name")
        if any(p.name == name for p in parsed):
            raise ApiError(f"{where}.function.name {name!r} is used by two tools", param=f"{where}.function.name")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ApiError(f"{where}.function.description must be a string", param=f"{where}.function.description")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}, "additionalProperties": False}
        elif not isinstance(params, dict):
            raise ApiError(f"{where}.function.parameters must be a JSON Schema object, got {type(params).__name__}",
                           param=f"{where}.function.parameters")
        else:
            try:
                validate_spec("json_schema", params)
            except ValueError as e:
                msg = str(e).removeprefix("json_schema: ")
                raise ApiError(f"{where}.function.parameters is not a valid JSON schema: {msg}",
                               param=f"{where}.function.parameters") from None
        parsed.append(Tool(name, desc, params, {"type": "function", "function": fn}))

    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise ApiError("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    parallel = parallel_tool_calls is not False
    choice = tool_choice
    if choice is None:
        choice = "auto" if parsed else "none"
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ApiError(f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'function': "
                           f"{{'name': ...}}}}, got {choice!r}", param="tool_choice")
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
            raise ApiError(f"tool_choice names the function {name!r}, which is not in tools "
                           f"{[t.name for t in parsed]}", param="tool_choice")
        return ToolPlan(parsed, "named", name=name, parallel=parallel)
    raise ApiError(f"tool_choice must be a string or an object, got {type(choice).__name__}", param="tool_choice")


# ---- grammars ---------------------------------------------------------------------------------------------
def _rebase_refs(node: Any, base: str) -> Any:
    """Local ``$ref`` s (``#...``) of a schema embedded at JSON pointer ``base`` of a bigger one."""
    if isinstance(node, dict):
        return {k: (base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rebase_refs(v, base))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rebase_refs(x, base) for x in node]
    return node


def _call_schema(tool: Tool, base: str) -> dict:
    """``{"name": <const>, "arguments": <parameters>}``, the schema placed at JSON pointer ``base``."""
    params = {k: v for k, v in copy.deepcopy(tool.parameters).items() if k not in ("$id", "id", "$schema")}
    return {"type": "object",
            "properties": {"name": {"type": "string", "const": tool.name},
                           "arguments": _rebase_refs(params, base + "/properties/arguments")},
            "required": ["name", "arguments"], "additionalProperties": False}


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
    try:
        from radixrt.runtime.constrained.schema_prep import prepare_schema
    except ImportError:  # pragma: no cover
        def prepare_schema(s):
            return s
    tags = []
    for t in tools:
        tags.append({"type": "tag", "begin": f'{TOOL_CALL_BEGIN}{{"name": "{t.name}", "arguments": ',
                     "content": {"type": "json_schema", "json_schema": prepare_schema(copy.deepcopy(t.parameters)),
                                 "max_whitespace_cnt": _MAX_WS_IN_TAG},
                     "end": "}" + TOOL_CALL_END})
    return {"type": "structural_tag",
            "format": {"type": "triggered_tags", "triggers": [TOOL_CALL_BEGIN], "tags": tags,
                       "stop_after_first": not parallel}}


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
            parts.append(TOOL_CALL_BEGIN + json.dumps({"name": fn.get("name"), "arguments": args},
                                                      ensure_ascii=False) + TOOL_CALL_END)
        m = {k: v for k, v in m.items() if k != "tool_calls"}
        m["content"] = "\n".join(parts)
        out.append(m)
    return out


# ---- parsing ----------------------------------------------------------------------------------------------
class _Incomplete(Exception):
    """The text ends inside the construct being scanned."""


class _Bad(Exception):
    """The text cannot be a call."""


def _ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _string_end(s: str, i: int) -> int:
    """Index after the JSON string starting at ``s[i] == '"'``."""
    i += 1
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == '"':
            return i + 1
        i += 1
    raise _Incomplete


_SCALAR = re.compile(r"-?[0-9.eE+\-]+|true|false|null")


def _value_end(s: str, i: int, final: bool) -> int:
    """Index after the JSON value starting at ``s[i]`` (structure only; the grammar did the validation)."""
    if i >= len(s):
        raise _Incomplete
    c = s[i]
    if c == '"':
        return _string_end(s, i)
    if c in "{[":
        depth = 0
        while i < len(s):
            c = s[i]
            if c == '"':
                i = _string_end(s, i)
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise _Incomplete
    m = _SCALAR.match(s, i)
    if not m:
        if "true".startswith(s[i:]) or "false".startswith(s[i:]) or "null".startswith(s[i:]):
            raise _Incomplete
        raise _Bad
    if m.end() == len(s) and not final:
        raise _Incomplete  # a number may go on
    return m.end()


@dataclass
class _Call:
    name: Optional[str] = None
    args: Optional[str] = None  # raw text so far (a prefix of the final text)
    complete: bool = False


def _call_object(s: str, i: int, final: bool, calls: list) -> int:
    """Scan ``{"name": "...", "arguments": ...}`` at ``s[i]``; appends a :class:`_Call`; returns the index
    after it. Raises _Incomplete (the partial call stays in ``calls``) or _Bad."""
    call = _Call()
    calls.append(call)
    i = _ws(s, i)
    if i >= len(s):
        raise _Incomplete
    if s[i] != "{":
        raise _Bad
    i += 1
    first = True
    while True:
        i = _ws(s, i)
        if i >= len(s):
            raise _Incomplete
        if s[i] == "}":
            if call.name is None or call.args is None:
                raise _Bad
            call.complete = True
            return i + 1
        if not first:
            if s[i] != ",":
                raise _Bad
            i = _ws(s, i + 1)
            if i >= len(s):
                raise _Incomplete
        first = False
        if s[i] != '"':
            raise _Bad
        k_end = _string_end(s, i)
        key = json.loads(s[i:k_end])
        i = _ws(s, k_end)
        if i >= len(s):
            raise _Incomplete
        if s[i] != ":":
            raise _Bad
        i = _ws(s, i + 1)
        if key == "name":
            if i >= len(s):
                raise _Incomplete
            if s[i] != '"':
                raise _Bad
            end = _string_end(s, i)
            call.name = json.loads(s[i:end])
            i = end
        elif key in ("arguments", "parameters"):
            try:
                end = _value_end(s, i, final)
            except _Incomplete:
                call.args = s[i:]
                raise
            call.args = s[i:end]
            i = end
        else:
            i = _value_end(s, i, final)


def scan(text: str, style: str, final: bool) -> tuple[str, list[_Call], bool]:
    """Split model output into (text outside calls, calls, ok).

    ``style``: ``tagged`` (text with ``<tool_call>...</tool_call>`` blocks), ``array`` (a JSON array of call
    objects) or ``object`` (one call object). When not ``final``, a trailing piece that may still become a
    trigger is left out of the text. ``ok`` is False when the JSON styles do not parse as calls.
    """
    calls: list[_Call] = []
    if style == "tagged":
        out = []
        pos = 0
        while True:
            j = text.find(TOOL_CALL_BEGIN, pos)
            if j < 0:
                tail = text[pos:]
                if not final:
                    for k in range(min(len(TOOL_CALL_BEGIN) - 1, len(tail)), 0, -1):
                        if TOOL_CALL_BEGIN.startswith(tail[-k:]):
                            tail = tail[:-k]
                            break
                out.append(tail)
                return "".join(out), calls, True
            out.append(text[pos:j])
            n = len(calls)
            try:
                i = _call_object(text, j + len(TOOL_CALL_BEGIN), final, calls)
                i = _ws(text, i)
                if not text.startswith(TOOL_CALL_END, i):
                    if TOOL_CALL_END.startswith(text[i:]):
                        raise _Incomplete
                    raise _Bad
                pos = i + len(TOOL_CALL_END)
            except _Incomplete:
                return "".join(out), calls, True
            except _Bad:  # not a call after all: keep it as text
                del calls[n:]
                out.append(TOOL_CALL_BEGIN)
                pos = j + len(TOOL_CALL_BEGIN)
    try:
        i = _ws(text, 0)
        if style == "object":
            i = _call_object(text, i, final, calls)
        else:
            if i >= len(text):
                raise _Incomplete
            if text[i] != "[":
                raise _Bad
            i = _ws(text, i + 1)
            if text.startswith("]", i):
                i += 1
            else:
                while True:
                    i = _ws(text, _call_object(text, i, final, calls))
                    if i >= len(text):
                        raise _Incomplete
                    if text[i] == "]":
                        i += 1
                        break
                    if text[i] != ",":
                        raise _Bad
                    i += 1
        if text[_ws(text, i):].strip():
            raise _Bad
    except _Incomplete:
        pass
    except _Bad:
        return "", calls, False
    return "", calls, True


@dataclass
class ToolCallStream:
    """Turns a model's text, fed in deltas, into OpenAI chat deltas (content and tool-call pieces).

    ``feed(delta)`` and ``finish()`` return lists of ``delta`` dicts (``{"content": ...}`` or
    ``{"tool_calls": [one piece]}``, OpenAI's shapes: first ``{index, id, type, function: {name,
    arguments: ""}}``, then ``{index, function: {arguments: <chunk>}}``). Every delta is a diff against what was already sent, computed by rescanning
    the whole text, so the streamed pieces always add up to :meth:`message`'s values.
    """

    style: str
    text: str = ""
    sent_content: str = ""
    ids: list = field(default_factory=list)          # per emitted call: its id
    sent_args: list = field(default_factory=list)    # per emitted call: characters of arguments sent
    done: bool = False
    _calls: list = field(default_factory=list)
    _ok: bool = True

    def feed(self, delta: str) -> list[dict]:
        self.text += delta
        return self._diff(final=False)

    def finish(self) -> list[dict]:
        self.done = True
        return self._diff(final=True)

    def _diff(self, final: bool) -> list[dict]:
        content, calls, ok = scan(self.text, self.style, final)
        self._calls, self._ok = calls, ok
        out: list[dict] = []
        target = self._content_target(content, calls, ok, final)
        if len(target) > len(self.sent_content) and target.startswith(self.sent_content):
            out.append({"content": target[len(self.sent_content):]})
            self.sent_content = target
        for idx, c in enumerate(calls):
            if c.name is None:
                break  # calls are streamed in order, each once its name is known
            if idx == len(self.ids):
                self.ids.append(new_call_id())
                self.sent_args.append(0)
                out.append({"tool_calls": [{"index": idx, "id": self.ids[idx], "type": "function",
                                            "function": {"name": c.name, "arguments": ""}}]})
            args = c.args or ""
            if len(args) > self.sent_args[idx]:
                out.append({"tool_calls": [{"index": idx, "function": {"arguments": args[self.sent_args[idx]:]}}]})
                self.sent_args[idx] = len(args)
        return out

    def _content_target(self, content: str, calls: list, ok: bool, final: bool) -> str:
        if self.style != "tagged":
            # JSON styles carry no text; output that is not a call at all comes back as content at the end
            return self.text if final and (not ok or not any(c.name for c in calls)) and not self.ids else ""
        if final and not any(c.name for c in calls):
            return content
        return content.rstrip()

    @property
    def num_calls(self) -> int:
        return len(self.ids)

    def has_complete_call(self) -> bool:
        return any(c.complete for c in self._calls[:len(self.ids)])

    def message(self) -> tuple[Optional[str], list[dict]]:
        """After :meth:`finish`: ``(content, tool_calls)`` as sent (``content`` None when empty and there
        are calls)."""
        calls = [{"id": self.ids[i], "type": "function",
                  "function": {"name": c.name, "arguments": c.args or ""}}
                 for i, c in enumerate(self._calls[:len(self.ids)])]
        content = self.sent_content
        if calls and not content:
            content = None
        return content, calls

    def finish_reason(self, base: Optional[str]) -> Optional[str]:
        """``tool_calls`` when generation stopped normally after a complete call; else ``base``."""
        if base == "stop" and self.has_complete_call():
            return "tool_calls"
        return base


def parse_output(plan: ToolPlan, text: str, base_finish: Optional[str]) -> tuple[dict, Optional[str]]:
    """A finished non-streamed choice: ``(message, finish_reason)``."""
    st = plan.stream()
    st.feed(text)
    st.finish()
    content, calls = st.message()
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = calls
    return msg, st.finish_reason(base_finish)
