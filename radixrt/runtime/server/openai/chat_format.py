"""How this server talks to its model in chat: the model's own template (with tools when it handles
them), the tool-call format, and the reasoning parser; and, per request, the prompt, the grammar and
the output parser that follow from them.

Tool-call format: ``--tool-call-parser`` when given, else the one the template implies (see
:func:`~radixrt.runtime.parsers.tool_formats.detect_tool_format`); a template without tool support (such
as SmolLM2's) gets the injected Hermes prompt of :mod:`.tool_parser` and its format. ``tool_choice:
auto`` is constrained by the chosen format's structural tag; ``required`` and named choices by the JSON
schemas of :mod:`.tool_parser` whatever the format.

Reasoning (``--reasoning-parser``): the output is split into ``reasoning_content`` and the answer unless
the request sets ``separate_reasoning: false``. A request grammar (tools, ``response_format``, regex ...)
is gated to start after the reasoning's end marker, unless the prompt already closed the reasoning (Qwen3
with ``chat_template_kwargs: {"enable_thinking": false}``) or thinking is turned off.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

from radixrt.runtime.parsers.chat_template import chat_template, handles_tools, render
from radixrt.runtime.parsers.choice import ChoiceParser
from radixrt.runtime.parsers.reasoning import ReasoningFormat, ReasoningStream, get_reasoning_format
from radixrt.runtime.parsers.tool_formats import ToolFormat, detect_tool_format, get_tool_format
from radixrt.runtime.parsers.tool_stream import ToolCallStream
from radixrt.runtime.server.openai.protocol import ApiError
from radixrt.runtime.server.openai.tool_parser import ToolPlan, render_tool_history

GRAMMAR_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")


@dataclass(frozen=True)
class ChatFormat:
    template_tools: bool  # the model's template renders ``tools`` itself
    tool_format: Optional[ToolFormat]  # None: the injected Hermes prompt and its parser
    reasoning: Optional[ReasoningFormat]

    @classmethod
    def for_model(
        cls,
        tokenizer,
        model_type: Optional[str],
        tool_call_parser: Optional[str] = None,
        reasoning_parser: Optional[str] = None,
    ) -> "ChatFormat":
        """Raises ValueError for an unknown parser name."""
        template = chat_template(tokenizer)
        name = tool_call_parser or detect_tool_format(model_type, template)
        return cls(
            handles_tools(template),
            get_tool_format(name) if name else None,
            get_reasoning_format(reasoning_parser) if reasoning_parser else None,
        )


@dataclass
class ChatTurn:
    """One request's prompt, extra sampling params and output parsing."""

    prompt: str
    sampling: dict = field(default_factory=dict)  # grammar and flags to merge into the sampling params
    tool_format: Optional[ToolFormat] = None
    plan: Optional[ToolPlan] = None
    reasoning: Optional[ReasoningFormat] = None
    starts_in_reasoning: bool = False
    # what rendered ``prompt`` (turn continuity re-renders its prefixes): the template-ready messages after
    # tool injection, the tools given to the template, the template variables
    msgs: list = field(default_factory=list)
    tools: Optional[list] = None
    template_kwargs: Optional[dict] = None
    template_tools: bool = False

    def parser(self) -> Optional[ChoiceParser]:
        """A fresh per-choice output parser, or None when the text is passed through as content."""
        if self.plan is None and self.reasoning is None:
            return None
        tools = None
        if self.plan is not None:
            tools = ToolCallStream(self.tool_format) if self.tool_format is not None else self.plan.stream()
        rs = ReasoningStream(self.reasoning, self.starts_in_reasoning) if self.reasoning is not None else None
        return ChoiceParser(rs, tools)


def prepare_turn(
    cf: ChatFormat,
    tokenizer,
    msgs: list[dict],
    plan: Optional[ToolPlan],
    sp: dict,
    template_kwargs: Optional[dict],
    separate_reasoning: bool = True,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
) -> ChatTurn:
    """Render ``msgs`` and decide grammar and parsing for one chat request whose sampling params are ``sp``.

    Raises:
        ApiError: 400 ``chat_template_kwargs`` that are not an object of template variables, or a template
            that fails on these messages (``messages``).
    """
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise ApiError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    tools = None
    if plan is not None and cf.template_tools:
        tools = [t.raw for t in plan.tools]
    elif plan is not None:
        msgs = plan.inject(render_tool_history(msgs))
    elif not cf.template_tools:
        msgs = render_tool_history(msgs)
    try:
        prompt = render(tokenizer, msgs, tools, template_kwargs, add_generation_prompt, continue_final_message)
    except ValueError as e:
        if "chat_template_kwargs" in str(e):
            raise ApiError(str(e), param="chat_template_kwargs") from None
        raise ApiError(f"messages: the chat template failed: ValueError: {e}", param="messages") from None
    except Exception as e:
        raise ApiError(f"messages: the chat template failed: {type(e).__name__}: {e}", param="messages") from None
    turn = ChatTurn(
        prompt, plan=plan, msgs=msgs, tools=tools, template_kwargs=template_kwargs, template_tools=cf.template_tools
    )
    if plan is not None:
        # the chosen format drives auto mode when the template shows tools or a parser was forced
        fmt = cf.tool_format if (cf.template_tools or cf.tool_format is not None) and plan.mode == "auto" else None
        turn.tool_format = fmt
        if fmt is not None:
            turn.sampling["structural_tag"] = json.dumps(
                fmt.structural_tag(plan.tools, plan.parallel), ensure_ascii=False
            )
            if not fmt.skip_special_tokens:  # its marker is a special token: keep it in the text
                turn.sampling["skip_special_tokens"] = False
        else:
            kind, spec = plan.grammar()
            turn.sampling[kind] = spec
    if cf.reasoning is not None and separate_reasoning:
        r = cf.reasoning
        turn.reasoning, turn.starts_in_reasoning = r, r.starts_in_reasoning(prompt)
        thinking_off = (template_kwargs or {}).get("enable_thinking") is False
        closed = prompt.rstrip().endswith(r.end)
        has_grammar = any(k in sp or k in turn.sampling for k in GRAMMAR_KEYS)
        if has_grammar and (turn.starts_in_reasoning or not (thinking_off or closed)):
            turn.sampling["reasoning_end_ids"] = tokenizer.encode(r.end, add_special_tokens=False)
    return turn
